"""rlds_tf.transformations against rlds 0.1.8 (peer venv), element by element.

`_SHARED` runs unchanged in both interpreters, with `episodes_testlib` importable and `T` bound to
`rlds.transformations` (peer) or `rlds_tf.transformations` (here), and fills `RESULTS[case] = nest of
arrays`; one peer process computes every expectation.
"""
import ast
import re
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import episodes_testlib
from dataset_testlib import assert_iterator_checkpoint_roundtrip
from dataset_testlib import flatten_with_paths
from rlds_tf import transformations as T

_SHARED = r'''
import numpy as np
import tensorflow as tf

import episodes_testlib

LENGTHS = [4, 1, 6]
DATA = episodes_testlib.steps_data(LENGTHS, seed=1, observation_size=3)

def steps_ds():
    return episodes_testlib.steps_dataset(DATA)

def episodes_ds():
    return episodes_testlib.episodes_dataset(DATA, LENGTHS)

def listed(ds):
    out = []
    for element in ds:
        if isinstance(element, dict) and 'steps' in element:
            element = dict(element, steps=listed(element['steps']))
        out.append(tf.nest.map_structure(lambda x: np.asarray(x), element))
    return out

RESULTS = {}
ints = tf.data.Dataset.range(1, 8)
for size, shift, stride, drop in [(2, 1, 1, False), (2, 1, 1, True), (2, 1, 2, False), (3, 2, 1, False),
                                  (3, 1, 2, True), (3, 1, 2, False), (2, 3, 1, False), (2, 5, 1, True),
                                  (4, 4, 1, False), (3, None, 1, True), (5, 2, 2, False)]:
    RESULTS[f'batch_ints_{size}_{shift}_{stride}_{drop}'] = listed(T.batch(ints, size, shift, stride, drop))
RESULTS['batch_steps_2_1'] = listed(T.batch(steps_ds(), size=2, shift=1))
RESULTS['batch_steps_3_2_2'] = listed(T.batch(steps_ds(), size=3, shift=2, stride=2, drop_remainder=True))
RESULTS['batch_steps_auto'] = listed(T.batch(steps_ds()))
RESULTS['batch_steps_auto_shift1'] = listed(T.batch(steps_ds(), shift=1))

double_reward = lambda step: dict(step, reward=step['reward'] * 2)
RESULTS['map_steps'] = listed(T.map_steps(steps_ds(), double_reward))
RESULTS['map_steps_batch1'] = listed(T.map_steps(steps_ds(), double_reward, optimization_batch_size=1))
RESULTS['map_nested_steps'] = listed(T.map_nested_steps(episodes_ds(), double_reward))
RESULTS['map_nested_steps_3'] = listed(T.map_nested_steps(episodes_ds(), double_reward, 3))
RESULTS['apply_nested_steps'] = listed(T.apply_nested_steps(episodes_ds(), lambda s: s.skip(1)))
to_sum = lambda step: {'r': step['reward'], 'o': step['observation'], 'n': tf.constant(1)}
RESULTS['sum_dataset'] = T.sum_dataset(steps_ds(), to_sum)
RESULTS['sum_dataset_batch4'] = T.sum_dataset(steps_ds(), to_sum, optimization_batch_size=4)
RESULTS['sum_nested_steps'] = T.sum_nested_steps(episodes_ds(), to_sum)
RESULTS['final_step_known'] = T.final_step(steps_ds())
RESULTS['final_step_unknown'] = T.final_step(steps_ds().filter(lambda s: s['action'] < 9))
RESULTS['episode_length_known'] = T.episode_length(steps_ds())
RESULTS['episode_length_unknown'] = T.episode_length(steps_ds().filter(lambda s: s['action'] % 2 == 0))
RESULTS['episode_length_unknown_b1'] = T.episode_length(steps_ds().filter(lambda s: s['action'] > 2), 1)
RESULTS['episode_lengths'] = [T.episode_length(e['steps']) for e in episodes_ds()]
extra = tf.data.Dataset.from_tensors({'observation': tf.zeros([3]), 'absorbing': True})
RESULTS['concatenate'] = listed(T.concatenate(steps_ds().take(2), extra))
absorbing = lambda last: tf.data.Dataset.from_tensors(dict(last, is_first=False, reward=tf.constant(0.5))).repeat(2)
RESULTS['concat_if_terminal'] = listed(T.apply_nested_steps(
    episodes_ds(), lambda steps: T.concat_if_terminal(steps, absorbing)))
RESULTS['truncate'] = listed(T.truncate_after_condition(steps_ds(), lambda s: s['action'] == 3))
RESULTS['truncate_never'] = listed(T.truncate_after_condition(steps_ds(), lambda s: s['action'] > 100))
RESULTS['truncate_first'] = listed(T.truncate_after_condition(steps_ds(), lambda s: s['action'] >= 0))
mean, std = T.mean_and_std(episodes_ds(), T.sar_fields_mask)
RESULTS['mean_and_std'] = {'mean': mean, 'std': std}
mean, std = T.mean_and_std(episodes_ds(), T.sar_fields_mask, optimization_batch_size=4)
RESULTS['mean_and_std_b4'] = {'mean': mean, 'std': std}
RESULTS['shift_keys_1'] = listed(T.shift_keys(steps_ds(), ['action', 'reward'], 1))
RESULTS['shift_keys_m1'] = listed(T.shift_keys(steps_ds(), ['observation'], -1))
RESULTS['shift_keys_2_b5'] = listed(T.shift_keys(steps_ds(), ['action'], 2, batch_size=5))
RESULTS['alignment'] = listed(steps_ds().take(2).map(lambda s: T.add_alignment_to_step(s, T.AlignmentType.SAR)))
RESULTS['alignment_values'] = [a.value for a in T.AlignmentType]
spec = {'a': tf.TensorSpec([None, 2], tf.int32), 'b': {'c': tf.TensorSpec([], tf.float64)}}
RESULTS['zeros_from_spec'] = T.zeros_from_spec(spec)
RESULTS['zero_dataset_like'] = listed(T.zero_dataset_like(steps_ds()))
RESULTS['step_spec'] = {k: [str(v.dtype.name), str(v.shape)] for k, v in T.step_spec(episodes_ds()).items()}
RESULTS['batch_numpy_sizes'] = listed(T.batch(ints, np.int64(2), np.int64(1)))
RESULTS['batch_tensor_size'] = listed(T.batch(ints, tf.constant(3, tf.int64)))
RESULTS['batched_map'] = listed(T.batched_helpers.batched_map(
    steps_ds(), lambda b: dict(b, reward=b['reward'] + tf.cast(b['action'], tf.float32)), size=4))
RESULTS['shift_keys_one_str'] = listed(T.shift_keys(steps_ds(), 'action', 1))
RESULTS['episode_keys_in_order'] = [k for e in T.map_nested_steps(episodes_ds(), double_reward) for k in e]
RESULTS['sar_mask_types'] = [type(v).__name__ for v in T.sar_fields_mask(next(iter(steps_ds())))[1].values()]
mean, std = T.mean_and_std(episodes_ds(), T.sar_fields_mask)
RESULTS['std_types'] = [type(std[k]).__name__ for k in sorted(std)]
transition = lambda s: {'o': s['observation'][-2], 'a': s['action'][-2], 'next_o': s['observation'][-1]}
RESULTS['pattern_map_from_transform'] = listed(T.pattern_map_from_transform(episodes_ds(), transition))
RESULTS['pattern_map_from_transform_across'] = listed(T.pattern_map_from_transform(
    episodes_ds(), transition, respect_episode_boundaries=False))
'''

_PEER = _SHARED + r'''
def _jsonable(value):
    return isinstance(value, (str, int, float, bool)) or (
        isinstance(value, list) and all(_jsonable(v) for v in value))
for name, value in RESULTS.items():
    if _jsonable(value):
        emit(name, value)
    else:
        emit_tree(name, value)
        emit(name + '/__count__', len(value) if isinstance(value, list) else -1)
'''


def _ours():
    scope = {"T": T}
    exec(_SHARED, scope)  # pylint: disable=exec-used
    return scope["RESULTS"]


@pytest.fixture(scope="module")
def results(peer):
    expected = peer.run(
        episodes_testlib.PEER_PATH + "import rlds\nT = rlds.transformations\n" + textwrap.dedent(_PEER))
    return _ours(), expected


_BATCH_CASES = re.search(r"for size, shift, stride, drop in (\[.*?\]):", _SHARED, re.S).group(1)
_NAMES = re.findall(r"^RESULTS\['([^']+)'\]", _SHARED, re.M) + [
    f"batch_ints_{a}_{b}_{c}_{d}" for a, b, c, d in ast.literal_eval(_BATCH_CASES)]

_RTOL = {"mean_and_std": 1e-6, "mean_and_std_b4": 1e-6, "sum_dataset": 1e-6, "sum_dataset_batch4": 1e-6,
         "sum_nested_steps": 1e-6}


@pytest.mark.peer
@pytest.mark.parametrize("name", _NAMES)
def test_matches_rlds(results, name):
    ours, expected = results
    value = ours[name]
    if not isinstance(value, (list, dict)) or name in ("alignment_values",):
        if name in expected:
            want = expected[name]
            np.testing.assert_allclose(np.asarray(value), np.asarray(want), rtol=_RTOL.get(name, 0))
            return
    if isinstance(value, list) and all(isinstance(v, (int, str)) for v in value) and name in expected:
        assert value == expected[name]
        return
    if isinstance(value, list):
        assert len(value) == expected[f"{name}/__count__"], f"{name}: {len(value)} elements"
    flat = flatten_with_paths(value)
    want = {k[len(name) + 1:]: v for k, v in expected.items()
            if k.startswith(name + "/") and not k.endswith("__count__")}
    if not isinstance(value, (list, dict)):
        want = {"": expected[name]}
    assert sorted(flat) == sorted(want), f"{name}: keys differ"
    for key in flat:
        a, e = np.asarray(flat[key]), np.asarray(want[key])
        assert a.dtype == e.dtype, f"{name}/{key}: dtype {a.dtype} != {e.dtype}"
        assert a.shape == e.shape, f"{name}/{key}: shape {a.shape} != {e.shape}"
        if name in _RTOL:
            np.testing.assert_allclose(a, e, rtol=_RTOL[name], err_msg=f"{name}/{key}")
        else:
            np.testing.assert_array_equal(a, e, err_msg=f"{name}/{key}")


def test_rlds_submodules_and_eager_python_values():
    import rlds_tf
    from rlds_tf.metadata import metadata_types
    assert metadata_types.EPISODE_ID == rlds_tf.metadata.EPISODE_ID == "episode_id"
    # Eagerly, sar_fields_mask gives Python bools (rlds' `not is_last`); traced, tensors.
    mask = T.sar_fields_mask({"observation": 1.0, "action": 2.0, "reward": 3.0, "is_last": tf.constant(True)})[1]
    assert mask == {"observation": True, "action": False, "reward": False}
    assert all(type(v) is bool for v in mask.values())
    traced = tf.function(lambda step: T.sar_fields_mask(step)[1]["action"])({"observation": 1.0, "action": 2.0,
                                                                             "reward": 3.0, "is_last": False})
    assert traced.dtype == tf.bool and bool(traced)
    # batched_map: overlapping batches, map, unbatch (rlds' helper).
    steps = tf.data.Dataset.range(4).map(lambda i: {"x": i})
    out = T.batched_helpers.batched_map(steps, lambda b: {"x": b["x"] * 10}, size=2, shift=1)
    assert [int(s["x"]) for s in out] == [0, 10, 10, 20, 20, 30, 30]


def test_shift_keys_takes_one_key_as_a_string_and_refuses_unknown_keys():
    steps = tf.data.Dataset.from_tensor_slices({"o": [0, 1, 2], "a": [10, 11, 12]})
    assert [(int(s["o"]), int(s["a"])) for s in T.shift_keys(steps, "a", 1)] == [(0, 11), (1, 12)]
    with pytest.raises(KeyError, match=r"keys \['nope'\] are not step fields"):
        T.shift_keys(steps, ["nope"], 1)


def test_episode_length_with_nested_fields():
    # rlds 0.1.8 raises TypeError here (it reads the first top-level value as a tensor).
    steps = tf.data.Dataset.from_tensor_slices({"a": {"b": tf.range(5)}, "c": tf.range(5)}).filter(
        lambda s: s["c"] < 4)
    assert int(T.episode_length(steps)) == 4
    assert int(T.episode_length(steps, optimization_batch_size=3)) == 4


def test_add_alignment_to_step_does_not_mutate_input():
    step = {"observation": 1}
    out = T.add_alignment_to_step(step, T.AlignmentType.RSA)
    assert step == {"observation": 1} and out["alignment"] == T.AlignmentType.RSA.value


def test_truncate_after_condition_emits_no_warnings():
    # The module runs with warnings as errors; the deprecated experimental scan/take_while would warn.
    assert [int(x) for x in T.truncate_after_condition(tf.data.Dataset.range(5), lambda x: x == 1)] == [0, 1]


def test_uniform_from_spec():
    spec = {"a": tf.TensorSpec([None, 3], tf.float32), "b": tf.TensorSpec([], tf.int32)}
    values = T.uniform_from_spec(spec, minval=2, maxval=5, seed=1)
    assert values["a"].shape == (1, 3) and values["b"].dtype == tf.int32
    assert np.all((values["a"].numpy() >= 2) & (values["a"].numpy() < 5))


@pytest.mark.parametrize("kwargs,match", [({"size": 0}, "size must be a positive int"),
                                          ({"size": 2, "shift": -1}, "shift must be a positive int"),
                                          ({"size": 2, "stride": 0}, "stride must be a positive int")])
def test_batch_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        T.batch(tf.data.Dataset.range(3), **kwargs)


def test_batch_iterator_is_checkpointable(tmp_path):
    ds = T.batch(tf.data.Dataset.range(10), size=3, shift=1)
    assert_iterator_checkpoint_roundtrip(ds, tmp_path, num_before=4)


@pytest.mark.parametrize("size,shift,stride,drop", [(2, 1, 1, False), (3, 2, 2, False), (3, 1, 2, True),
                                                     (2, 3, 1, False), (4, 1, 1, False)])
def test_blocked_gather_path_matches_window_path(size, shift, stride, drop):
    # The fallback for inputs the sliding-window kernel is not used for; `Dataset.window` is the oracle.
    from rlds_tf.transformations import flexible_batch
    ds = tf.data.Dataset.range(23).map(lambda x: {"x": x, "y": tf.stack([x, -x])})
    ours = T.batch(ds, size, shift, stride, drop)
    want = flexible_batch._windows_by_dataset(ds, size, shift, stride, drop)
    flat = lambda d: [{k: v.numpy().tolist() for k, v in e.items()} for e in d]  # noqa: E731
    assert flat(ours) == flat(want)


def _stats_episodes():
    steps = {"x": tf.constant([[1., 5.], [3., 7.], [5., 0.], [9., 2.]]), "is_last": [False, False, False, True]}
    return tf.data.Dataset.from_tensors({"steps": tf.data.Dataset.from_tensor_slices(steps)})


def test_mean_and_std_with_a_mask_per_element_counts_each_element_apart():
    mean, std = T.mean_and_std(
        _stats_episodes(), lambda s: ({"x": s["x"]}, {"x": s["x"] < 6}), optimization_batch_size=3)
    # column 0 keeps [1, 3, 5], column 1 keeps [5, 0, 2] (hand-computed)
    np.testing.assert_allclose(mean["x"].numpy(), [3.0, 7 / 3])
    np.testing.assert_allclose(std["x"], [2.0, np.std([5., 0., 2.], ddof=1)])


@pytest.mark.parametrize("get_step_fields, error, message", [
    (lambda s: {"x": s["x"]}, TypeError, r"must return a \(data dict, mask dict\) pair, got dict"),
    (lambda s: ({"x": s["x"]}, {}), ValueError, r"no mask for field\(s\) \['x'\]"),
    (lambda s: ({"x": s["x"]}, {"x": tf.constant([True, False, True])}), ValueError,
     r"mask of field 'x' has shape \(3,\), which is neither a scalar nor broadcastable to the field's shape \(2,\)"),
])
def test_mean_and_std_names_what_get_step_fields_got_wrong(get_step_fields, error, message):
    with pytest.raises(error, match=message):
        T.mean_and_std(_stats_episodes(), get_step_fields)
