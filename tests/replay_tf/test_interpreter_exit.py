"""`sampling.interpreter_exit.register`: callbacks run at exit in their stage's order, whatever order they
were registered in (a subprocess per case: exit happens once per process)."""
import os
import subprocess
import sys

import pytest

from proc_testlib import ROOT

_CODE = """
from replay_tf.sampling import interpreter_exit

def said(word):
    return lambda: print(word, interpreter_exit._GENERATORS.exiting.is_set(), flush=True)

for first in {order!r}:
    if first == "after":
        interpreter_exit.register(said("after"), after_generators_end=True)
    else:
        interpreter_exit.register(said("before"))
"""


@pytest.mark.parametrize("order", [("before", "after"), ("after", "before")])
def test_callbacks_run_by_stage_not_by_registration(order):
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([sys.executable, "-c", _CODE.format(order=order)], capture_output=True, text=True,
                          env=env, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # (both once the generators were told to end: "True")
    assert proc.stdout.split("\n") == ["before True", "after True", ""]


_FAILING = """
from replay_tf.sampling import interpreter_exit

def fail():
    raise RuntimeError("a callback failed")

waited = []
original = interpreter_exit._GENERATORS._wait_ended
interpreter_exit._GENERATORS._wait_ended = lambda: (waited.append(True), original())[1]
interpreter_exit.register(fail)
interpreter_exit.register(lambda: print("before", flush=True))
interpreter_exit.register(lambda: print("after", waited, flush=True), after_generators_end=True)
interpreter_exit.register(fail, after_generators_end=True)
interpreter_exit.register(lambda: print("last", flush=True), after_generators_end=True)
"""


def test_a_failing_callback_keeps_neither_the_wait_nor_the_others_from_running():
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([sys.executable, "-c", _FAILING], capture_output=True, text=True, env=env, timeout=120,
                          cwd=ROOT)
    assert proc.stdout.split("\n") == ["before", "after [True]", "last", ""]
    assert proc.stderr.count("RuntimeError: a callback failed") == 2
