"""replay_tf.grpc.malloc: message-sized buffers stop costing page faults once the thresholds are set.

Runs in fresh interpreters that load the module from its file (no TensorFlow import), so the process's
malloc state is known: TensorFlow's generator datasets set M_TRIM_THRESHOLD to 128 KiB, as done here.
"""
import os
import subprocess
import sys

import pytest

import replay_tf.grpc.malloc as malloc_lib

_CODE = r'''
import ctypes, importlib.util, os, resource, sys
spec = importlib.util.spec_from_file_location("replay_tf_malloc", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
ctypes.CDLL("libc.so.6").mallopt(-1, 128 * 1024)  # what TensorFlow's generator datasets do

def faults_per_message():
    """Minor page faults per 2 MiB bytes object made and freed (as gRPC hands messages to Python)."""
    start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for i in range(40):
        message = bytes([i % 256]) * (2 << 20)
        del message
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start) / 40

faults_per_message()
before = faults_per_message()
tuned = module.keep_large_buffers_in_heap()
faults_per_message()
print(before, tuned, faults_per_message())
'''


def _run(env_extra=None):
    env = dict(os.environ, **(env_extra or {}))
    out = subprocess.run([sys.executable, "-c", _CODE, malloc_lib.__file__], capture_output=True, text=True,
                         env=env, timeout=60, check=True).stdout.split()
    return float(out[0]), out[1] == "True", float(out[2])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc tuning is Linux-only")
def test_thresholds_stop_page_faults_per_message():
    before, tuned, after = _run()
    assert tuned
    assert before > 256, before  # a fresh, zero-filled 2 MiB map per message: 512 pages
    assert after < 16, after     # reused from the heap


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc tuning is Linux-only")
def test_opt_out_leaves_malloc_alone():
    before, tuned, after = _run({"REPLAY_TF_MALLOC_TUNING": "0"})
    assert not tuned
    assert after > 256, after
