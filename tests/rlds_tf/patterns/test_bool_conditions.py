"""Conditions compared with bools (`Condition.data(spec)[IS_TERMINAL] == False`), as Reverb's builder takes them.

RLDS's dataset-patterns notebook writes that comparison; dm-reverb 0.14 stores a bool as the int32 it is
(`eq: 0` for False, `eq: 1` for True). The expected nodes below are what dm-reverb's builder prints for the
same expressions; `test_condition_protos_match_reverb` compares the protos with the peer's.
"""
import json
import subprocess
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import anchor_suites_testlib
import rlds_tf
from rlds_tf import patterns
from rlds_tf import transformations

_STRUCTURE = {"a": None, "b": None}
_C = patterns.Condition

# (expression on the data column `b` (`d`) or the step index (`C`), cmp, value, mod, inverse)
BUILDS = [
    ("d == False", "eq", 0, None, False),
    ("d == True", "eq", 1, None, False),
    ("d != False", "eq", 0, None, True),
    ("d != True", "eq", 1, None, True),
    ("d >= True", "ge", 1, None, False),
    ("d > False", "ge", 1, None, False),
    ("d < True", "ge", 1, None, True),
    ("d <= False", "ge", 1, None, True),
    ("d % True == False", "mod_eq", 0, 1, False),
    ("d % 2 == True", "mod_eq", 1, 2, False),
    ("d == np.bool_(True)", "eq", 1, None, False),
    ("d == np.int64(3)", "eq", 3, None, False),
    ("d != np.uint8(4)", "eq", 4, None, True),
    ("C.step_index() == True", "eq", 1, None, False),
]


def _build(expression: str):
    return eval(expression, {"d": _C.data(_STRUCTURE)["b"], "C": _C, "np": np})  # noqa: S307  (test table)


@pytest.mark.parametrize("expression,cmp,value,mod,inverse", BUILDS, ids=[b[0] for b in BUILDS])
def test_bools_and_numpy_integers_build_reverbs_conditions(expression, cmp, value, mod, inverse):
    condition = _build(expression)
    assert (condition.cmp, condition.value, condition.mod, condition.inverse) == (cmp, value, mod, inverse)
    assert type(condition.value) is int and (mod is None or type(condition.mod) is int)


@pytest.mark.parametrize("expression,error,match", [
    ("d == 1.0", TypeError, r"the value a condition compares with must be an integer or a bool, got 1\.0 \(float\)"),
    ("d == None", TypeError, r"must be an integer or a bool, got None \(NoneType\)"),
    ("d >= '1'", TypeError, r"must be an integer or a bool, got '1' \(str\)"),
    ("d % 2.0 == 1", TypeError, r"a condition's modulus must be an integer or a bool, got 2\.0 \(float\)"),
    ("d == 2 ** 31", ValueError, r"must fit in int32 \(\[-2147483648, 2147483647\]\), got 2147483648"),
    ("d > 2 ** 31 - 1", ValueError, r"got 2147483648"),
], ids=["float", "none", "str", "float_modulus", "int32_overflow", "int32_overflow_by_gt"])
def test_other_operands_are_refused(expression, error, match):
    with pytest.raises(error, match=match):
        _build(expression)


# Episode 0 ends in a terminal step, episode 1 is truncated (no terminal step), episode 2 is one terminal step.
_X = np.arange(8, dtype=np.int32)
_IS_TERMINAL = np.array([False, False, True, False, False, False, False, True])
_IS_LAST = np.array([False, False, True, False, False, False, True, True])


def _episodes() -> tf.data.Dataset:
    steps = {"x": _X, rlds_tf.IS_TERMINAL: _IS_TERMINAL, rlds_tf.IS_LAST: _IS_LAST}
    bounds = [(0, 3), (3, 4), (7, 1)]
    return tf.data.Dataset.from_tensor_slices(np.array(bounds, np.int64)).map(
        lambda b: {"steps": tf.data.Dataset.from_tensor_slices(steps).skip(b[0]).take(b[1])})


@pytest.mark.parametrize("comparison,want", [
    ("== False", [0, 1, 3, 4, 5, 6]),
    ("!= False", [2, 7]),
    ("== True", [2, 7]),
    ("!= True", [0, 1, 3, 4, 5, 6]),
])
def test_pattern_map_applies_a_config_with_a_bool_condition(comparison, want):
    step_spec = transformations.step_spec(_episodes())
    ref = patterns.create_reference_step(step_spec)
    condition = eval(f"data[rlds_tf.IS_TERMINAL] {comparison}",  # noqa: S307  (test table)
                     {"data": _C.data(step_spec), "rlds_tf": rlds_tf})
    config = patterns.create_config(ref["x"][-1], "t", conditions=[condition])
    assert [int(x) for x in transformations.pattern_map(_episodes(), [config])] == want


_PEER_CODE = """
import numpy as np
from reverb import structured_writer as sw
d = sw.Condition.data({'a': None, 'b': None})['b']
for expression in INPUTS['expressions']:
    condition = eval(expression, {'d': d, 'C': sw.Condition, 'np': np})
    emit(expression, condition.SerializeToString().hex())
"""


@pytest.mark.peer
def test_condition_protos_match_reverb(peer):
    expressions = [b[0] for b in BUILDS]
    expected = peer.run(_PEER_CODE, {"expressions": expressions})
    ref = patterns.create_reference_step({"a": tf.TensorSpec([], tf.int32), "b": tf.TensorSpec([], tf.bool)})
    for expression in expressions:
        proto = patterns.create_config(ref["a"][-1], "t", conditions=[_build(expression)]).to_proto()
        assert proto.conditions[0].SerializeToString().hex() == expected[expression], expression


_RLDS_CODE = """
import json
import numpy as np
import tensorflow as tf
import replay_tf
replay_tf.register_as_reverb()
import rlds
from reverb import structured_writer as sw

steps = {"x": np.array(STEPS["x"], np.int32), rlds.IS_TERMINAL: np.array(STEPS["is_terminal"]),
         rlds.IS_LAST: np.array(STEPS["is_last"])}
episodes = tf.data.Dataset.from_tensor_slices(np.array([[0, 3], [3, 4], [7, 1]], np.int64)).map(
    lambda b: {"steps": tf.data.Dataset.from_tensor_slices(steps).skip(b[0]).take(b[1])})
step_spec = rlds.transformations.step_spec(episodes)
ref = sw.create_reference_step(step_spec)
out = {}
for name, condition in [("eq_false", sw.Condition.data(step_spec)[rlds.IS_TERMINAL] == False),
                        ("ne_false", sw.Condition.data(step_spec)[rlds.IS_TERMINAL] != False)]:
    config = sw.create_config(ref["x"][-1], "t", conditions=[condition])
    out[name] = [int(x) for x in rlds.transformations.pattern_map(episodes, [config])]
print("RESULT", json.dumps(out))
"""


@pytest.mark.slow
def test_rlds_with_register_as_reverb_takes_bool_conditions():
    # rlds 0.1.8 itself (in the TF 2.21 anchor venv), its `reverb` being replay_tf: the notebook's `== False`.
    python = anchor_suites_testlib.anchor_python_or_skip()
    steps = {"x": _X.tolist(), "is_terminal": _IS_TERMINAL.tolist(), "is_last": _IS_LAST.tolist()}
    code = f"STEPS = {steps!r}\n{textwrap.dedent(_RLDS_CODE)}"
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=600,
                          env=anchor_suites_testlib.venv_env())
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert json.loads(result[-1][len("RESULT "):]) == {"eq_false": [0, 1, 3, 4, 5, 6], "ne_false": [2, 7]}
