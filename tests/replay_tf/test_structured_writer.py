"""StructuredWriter: the same items as rlds_tf.transformations.pattern_map, and as dm-reverb's writer."""
import numpy as np
import pytest
import tensorflow as tf
import tree

import reverb_testlib
import replay_tf as reverb
from rlds_tf import transformations

_EPISODE_LENGTHS = [5, 1, 7, 4]


def _episodes():
    episodes = []
    start = 0
    for length in _EPISODE_LENGTHS:
        idx = np.arange(start, start + length)
        start += length
        steps = {"observation": np.stack([idx, -idx], axis=1).astype(np.float32), "action": idx.astype(np.int64),
                 "reward": (idx * 0.5).astype(np.float64), "is_first": idx == idx[0], "is_last": idx == idx[-1]}
        episodes.append(steps)
    return episodes


def _configs(step_spec):
    sw = reverb.structured_writer
    ref = sw.create_reference_step(step_spec)
    transition = sw.create_config({"observation": ref["observation"][-2], "action": ref["action"][-2],
                                   "next_observation": ref["observation"][-1]}, table="transition")
    every_other = sw.create_config(ref["reward"][-3:], table="every_other",
                                   conditions=[sw.Condition.step_index() % 2 == 0])
    last_pair = sw.create_config({"obs": ref["observation"][-2:], "last": ref["is_last"][-1]}, table="last_pair",
                                 conditions=[sw.Condition.is_end_episode()])
    return [transition, every_other, last_pair]


def test_matches_pattern_map():
    episodes = _episodes()
    episodes_dataset = tf.data.Dataset.from_generator(
        lambda: ({"steps": tf.data.Dataset.from_tensor_slices(e)} for e in episodes),
        output_signature={"steps": tf.data.DatasetSpec({
            "observation": tf.TensorSpec([2], tf.float32), "action": tf.TensorSpec([], tf.int64),
            "reward": tf.TensorSpec([], tf.float64), "is_first": tf.TensorSpec([], tf.bool),
            "is_last": tf.TensorSpec([], tf.bool)})})
    step_spec = transformations.step_spec(episodes_dataset)
    configs = _configs(step_spec)
    tables = [reverb.Table.queue(c.table, 1000) for c in configs]
    server = reverb.Server(tables)
    client = reverb.Client(f"localhost:{server.port}")
    with client.structured_writer(configs) as writer:
        for steps in episodes:
            for i in range(len(steps["action"])):
                writer.append({k: v[i] for k, v in steps.items()})
            writer.end_episode(clear_buffers=True, timeout_ms=5000)
    for config in configs:
        expected = [tree.flatten(item) for item in transformations.pattern_map(episodes_dataset, [config])]
        size = client.server_info()[config.table].current_size
        assert size == len(expected) > 0, config.table
        got = [s.data for s in client.sample(config.table, size, emit_timesteps=False)]
        for g, e in zip(got, expected):
            assert len(g) == len(e)
            for a, b in zip(g, e):
                np.testing.assert_array_equal(a, b.numpy(), err_msg=config.table)
                assert a.dtype == b.numpy().dtype
    server.stop()


def test_bad_input():
    server = reverb.Server([reverb.Table.queue("t", 10)])
    client = reverb.Client(f"localhost:{server.port}")
    with pytest.raises(ValueError, match="At least one config must be provided"):
        client.structured_writer([])
    ref = reverb.structured_writer.create_reference_step({"x": None, "y": None})
    writer = client.structured_writer([reverb.structured_writer.create_config(ref["x"][-2:], table="t")])
    writer.append({"x": np.float32(1), "y": np.int32(0)})
    with pytest.raises(ValueError, match=r"column 0 \(path=\('x',\)\)\. Got double but expected float\."):
        writer.append({"x": np.float64(1), "y": np.int32(0)})
    with pytest.raises(ValueError, match=r"Flattened data has an unexpected length, got 1 but wanted 2\."):
        writer.append({"x": np.float32(1)})
    server.stop()


SCENARIOS = {
    "structured": """
sw = reverb.structured_writer
spec = {'obs': tf.TensorSpec([2], tf.float32), 'act': tf.TensorSpec([], tf.int32)}
ref = sw.create_reference_step(spec)
configs = [
    sw.create_config({'o': ref['obs'][-2], 'a': ref['act'][-2], 'next_o': ref['obs'][-1]}, table='a'),
    sw.create_config(ref['act'][-3:], table='b', conditions=[sw.Condition.step_index() % 2 == 0]),
    sw.create_config(ref['obs'][-1], table='c', conditions=[sw.Condition.is_end_episode()]),
    sw.create_config(ref['act'][-2:], table='d', conditions=[sw.Condition.steps_since_applied() >= 3]),
]
emit('signature', sorted((k, repr(v)) for k, v in sw.infer_signature(configs[:1], spec).items()))
server = reverb.Server([reverb.Table.queue(t, 100) for t in 'abcd'])
client = reverb.Client(f'localhost:{server.port}')
writer = client.structured_writer(configs)
for episode, length in enumerate([4, 1, 6]):
    for i in range(length):
        writer.append({'obs': np.array([episode, i], np.float32), 'act': np.int32(10 * episode + i)})
    writer.end_episode()
writer.flush()
for t in 'abcd':
    size = client.server_info()[t].current_size
    emit(t, [[np.asarray(x).tolist() for x in s.data] for s in client.sample(t, size, emit_timesteps=False)])
""",
    # dm-reverb converts every leaf, read by a config or not: TypeError for one that is not a tensor; None is
    # a field not set in this step.
    "non_tensor_leaves": """
sw = reverb.structured_writer
server = reverb.Server([reverb.Table.queue('q', 100), reverb.Table.queue('r', 100)])
client = reverb.Client(f'localhost:{server.port}')
ref = sw.create_reference_step({'x': tf.TensorSpec([], tf.float32), 'y': tf.TensorSpec([], tf.float32)})
config = sw.create_config({'x': ref['x'][-1]}, table='q')
values = {'none': None, 'object': object(), 'object_ints': np.array([1], dtype=object), 'set': {1, 2},
          'datetime': np.datetime64('2020-01-01')}
for name, value in values.items():
    for column, step in [('read', {'x': value, 'y': np.float32(1)}), ('unread', {'x': np.float32(1), 'y': value})]:
        writer = client.structured_writer([config])
        try:
            writer.append(step)
            emit(f'{name}_{column}', 'ok')
        except Exception as e:
            emit(f'{name}_{column}', type(e).__name__)
writer = client.structured_writer([sw.create_config({'x': ref['x'][-1]}, table='r')])
for step in [{'x': np.float32(1), 'y': np.float32(0)}, {'x': object(), 'y': np.float32(0)},
             {'x': np.float32(2), 'y': None}]:
    try:
        writer.append(step)
    except TypeError:
        pass
writer.flush()
size = client.server_info()['r'].current_size
emit('items', [np.asarray(s.data[0]).tolist() for s in client.sample('r', size, emit_timesteps=False)])
""",
}


peer_results, local_results, test_matches_reverb = reverb_testlib.differential_tests(SCENARIOS)


def test_non_tensor_leaf_error_names_field_and_type():
    server = reverb.Server([reverb.Table.queue("t", 10)])
    client = reverb.Client(f"localhost:{server.port}")
    ref = reverb.structured_writer.create_reference_step({"x": None, "y": None})
    writer = client.structured_writer([reverb.structured_writer.create_config(ref["x"][-1], table="t")])
    with pytest.raises(TypeError, match=r"Field \['y'\]\[0\] of the appended step must be a tensor, numpy array, "
                                        r"Python number, bool, str or bytes, or None to leave the column unset, got "
                                        r"ndarray of dtype object holding int \(3\)"):
        writer.append({"x": np.float32(1), "y": [np.array([3], dtype=object)]})
    # A flat dict with the first step's keys takes the fast path past tree.flatten: same check, same path.
    writer = client.structured_writer([reverb.structured_writer.create_config(ref["x"][-1], table="t")])
    writer.append({"x": np.float32(1), "y": np.float32(0)})
    with pytest.raises(TypeError, match=r"Field \['y'\] of the appended step must be a tensor.*got set"):
        writer.append({"x": np.float32(1), "y": {1, 2}})
    writer.append({"x": np.float32(2), "y": np.float32(0)})
    writer.flush()
    assert [s.data[0].tolist() for s in client.sample("t", 2, emit_timesteps=False)] == [1.0, 2.0]
    server.stop()
