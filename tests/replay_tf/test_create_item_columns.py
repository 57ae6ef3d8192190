"""`create_item` with too few or too many columns for the table's signature says which ones."""
import numpy as np
import pytest
import tensorflow as tf

import replay_tf as reverb

_PREFIX = ("Unable to create item in table 'q' since the provided trajectory is inconsistent with the table "
           "signature: ")


@pytest.fixture(name="writer", scope="module")
def writer_fixture():
    signature = {"act": tf.TensorSpec([2], tf.int64), "obs": tf.TensorSpec([2, 3], tf.float32),
                 "rew": tf.TensorSpec([2], tf.float32)}
    server = reverb.Server([reverb.Table.queue("q", 10, signature=signature)])
    writer = reverb.Client(server.address).trajectory_writer(2)
    for _ in range(2):
        writer.append({"act": np.int64(1), "obs": np.zeros(3, np.float32), "rew": np.float32(0)})
    yield writer
    writer.close()
    server.stop()


@pytest.mark.parametrize("columns, message", [
    (["obs", "rew"], "the trajectory has no column 'act'; the table expects 3 columns ['act', 'obs', 'rew'] but "
                     "the trajectory has 2: ['obs', 'rew']"),
    (["obs"], "the trajectory has no columns 'act', 'rew'; the table expects 3 columns ['act', 'obs', 'rew'] "
              "but the trajectory has 1: ['obs']"),
    (["act", "obs", "rew", "extra"], "the table's signature has no column 'extra'; the table expects 3 columns "
                                     "['act', 'obs', 'rew'] but the trajectory has 4: ['act', 'extra', 'obs', "
                                     "'rew']"),
])
def test_missing_or_unknown_columns_are_named(writer, columns, message):
    history = writer.history
    trajectory = {name: history["obs" if name == "extra" else name][-2:] for name in columns}
    with pytest.raises(ValueError) as raised:
        writer.create_item("q", 1.0, trajectory)
    assert str(raised.value) == _PREFIX + message


def test_unnamed_columns_get_the_counts(writer):
    with pytest.raises(ValueError) as raised:
        writer.create_item("q", 1.0, [writer.history["obs"][-2:]])
    assert str(raised.value) == (_PREFIX + "the table expects 3 columns ['act', 'obs', 'rew'] but the trajectory "
                                 "has 1: ['0']")


def test_all_columns_still_checked_in_order(writer):
    history = writer.history
    writer.create_item("q", 1.0, {name: history[name][-2:] for name in ("act", "obs", "rew")})
    with pytest.raises(ValueError) as raised:  # same count, wrong dtype: the column is named
        writer.create_item("q", 1.0, {"act": history["rew"][-2:], "obs": history["obs"][-2:],
                                      "rew": history["rew"][-2:]})
    assert str(raised.value).startswith(_PREFIX + "column 0 ('act') expected TensorSpec(shape=(2,), "
                                        "dtype=tf.int64, name=None) but got dtype=float32 shape=[2]")
