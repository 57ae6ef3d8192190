"""replay_tf.PatternDataset and pattern_dataset_with_info: calling conventions, errors and additions.

Its items are compared with dm-reverb's PatternDataset in tests/rlds_tf/patterns/test_patterns.py."""
import numpy as np
import pytest
import tensorflow as tf

import replay_tf as reverb
from dataset_testlib import assert_iterator_checkpoint_roundtrip
from replay_tf import structured_writer as sw

# Two episodes: steps 0-2 and 3-7.
STEPS = {"x": np.arange(8, dtype=np.int32), "is_last": np.array([0, 0, 1, 0, 0, 0, 0, 1], bool)}


def _steps() -> tf.data.Dataset:
    return tf.data.Dataset.from_tensor_slices(STEPS)


def _pairs(dataset) -> list:
    return [item["p"].numpy().tolist() for item in dataset]


def test_pairs_within_and_across_episodes():
    ref = sw.create_reference_step(_steps().element_spec)
    config = sw.create_config({"p": ref["x"][-2:]}, "t")
    within = reverb.PatternDataset(_steps(), [config], True, lambda step: step["is_last"])
    assert within.element_spec == {"p": tf.TensorSpec([2], tf.int32)}
    assert _pairs(within) == [[0, 1], [1, 2], [3, 4], [4, 5], [5, 6], [6, 7]]
    across = reverb.PatternDataset(_steps(), [config], False, lambda step: step["is_last"])
    assert _pairs(across) == [[0, 1], [1, 2], [2, 3], [3, 4], [4, 5], [5, 6], [6, 7]]


def test_tuple_steps_are_passed_to_is_end_of_episode_as_arguments():
    # Dataset.map's convention, which dm-reverb's wrapper of is_end_of_episode follows too.
    steps = tf.data.Dataset.from_tensor_slices((STEPS["x"], STEPS["is_last"]))
    ref = sw.create_reference_step(steps.element_spec)
    config = sw.create_config(ref[0][-3:], "t")
    dataset = reverb.PatternDataset(steps, [config], True, lambda x, is_last: is_last)
    assert [t.numpy().tolist() for t in dataset] == [[0, 1, 2], [3, 4, 5], [4, 5, 6], [5, 6, 7]]


def test_is_end_of_episode_must_return_a_scalar_bool():
    config = sw.create_config(sw.create_reference_step(_steps().element_spec)["x"][-1], "t")
    with pytest.raises(ValueError, match=r"`is_end_of_episode`.*scalar `bool`.*dtype=tf.int32"):
        reverb.PatternDataset(_steps(), [config], True, lambda step: step["x"])
    with pytest.raises(ValueError, match=r"`is_end_of_episode`.*shape=\(2,\)"):
        reverb.PatternDataset(_steps(), [config], True, lambda step: tf.stack([step["is_last"]] * 2))
    with pytest.raises(TypeError, match="input_dataset must be a tf.data.Dataset of steps, got dict"):
        reverb.PatternDataset(STEPS, [config], True, lambda step: step["is_last"])


def test_configs_are_left_unchanged():
    # dm-reverb appends its implicit buffer_length condition to the callers' protos.
    config = sw.create_config({"p": sw.create_reference_step(_steps().element_spec)["x"][-2:]}, "t")
    proto = config.to_proto()
    before = proto.SerializeToString()
    assert not proto.conditions
    for given in (config, proto):
        assert _pairs(reverb.PatternDataset(_steps(), [given], True, lambda step: step["is_last"])) == [
            [0, 1], [1, 2], [3, 4], [4, 5], [5, 6], [6, 7]]
    assert proto.SerializeToString() == before
    assert config.to_proto().SerializeToString() == before


def test_with_info_has_sample_info_dtypes_and_takes_tuple_trajectories():
    ref = sw.create_reference_step(_steps().element_spec)
    config = sw.create_config((ref["x"][-1], ref["x"][-2]), "t")
    dataset = reverb.pattern_dataset.pattern_dataset_with_info(_steps(), [config], True, lambda s: s["is_last"])
    assert dataset.element_spec.info == reverb.SampleInfo(
        *(tf.TensorSpec([], dtype) for dtype in reverb.SampleInfo.tf_dtypes()))
    samples = list(dataset)
    assert [tuple(t.numpy() for t in s.data) for s in samples] == [(1, 0), (2, 1), (4, 3), (5, 4), (6, 5), (7, 6)]
    assert all(int(s.info.key) == 0 and float(s.info.probability) == 0.0 for s in samples)


def test_steps_of_unknown_shape_and_a_checkpointed_iterator(tmp_path):
    # Steps whose shape varies are taken one block each; iterators save and restore their position.
    steps = tf.data.Dataset.range(6).map(lambda i: {"v": tf.fill([i % 2 + 1], i), "end": i % 3 == 2})
    ref = sw.create_reference_step(steps.element_spec)
    dataset = reverb.PatternDataset(steps, [sw.create_config(ref["end"][-2:], "t")], True, lambda s: s["end"])
    assert [x.numpy().tolist() for x in dataset] == [[False, False], [False, True]] * 2
    assert_iterator_checkpoint_roundtrip(dataset, tmp_path, num_before=1)


def test_runs_inside_tf_function():
    # dm-reverb's is eager only.
    config = sw.create_config({"p": sw.create_reference_step(_steps().element_spec)["x"][-2:]}, "t")

    @tf.function
    def total():
        dataset = reverb.PatternDataset(_steps(), [config], True, lambda step: step["is_last"])
        return dataset.reduce(tf.constant(0), lambda acc, item: acc + tf.reduce_sum(item["p"]))

    assert int(total()) == sum(sum(p) for p in [[0, 1], [1, 2], [3, 4], [4, 5], [5, 6], [6, 7]])
