"""A small recorded RLDS dataset, shaped like what a killed recorder leaves, for the dataset safety tests."""
import os

import rlds_tf as rlds
from rlds_tf.recording import Catch
from rlds_tf.recording import tfrecord_files

# The shard file names of the recorded dataset's train split.
SHARD = "rlds_dataset-train.tfrecord-{:05d}"


def record_catch(directory: str, *, leave_lock: bool = True) -> str:
    """Records 3 Catch episodes (observation float32[4, 5], ZLIB) in shards of [2, 1] episodes into `directory`.

    With `leave_lock`, adds the lock file a killed recorder leaves, so loaders treat the directory as an
    interrupted rlds_tf recording (the one kind they check for crash leftovers).
    """
    with rlds.EnvLogger(Catch(rows=4, seed=5), data_directory=directory, max_episodes_per_file=2) as env:
        for e in range(3):
            timestep = env.reset()
            while not timestep.last():
                timestep = env.step(e % 3)
    lock = os.path.join(directory, tfrecord_files.LOCK_FILE)
    assert not os.path.exists(lock)  # a clean close removes it
    if leave_lock:
        open(lock, "w").close()
    return directory


def appending_writer(directory: str):
    """A recorder that appends to the dataset `record_catch` wrote (its features, overwrite=False)."""
    import tensorflow as tf
    import tensorflow_datasets as tfds
    from rlds_tf.recording import TFDSBackendWriter

    config = tfds.rlds.rlds_base.DatasetConfig(name="rlds_dataset", observation_info=tf.float32,
                                               action_info=tf.int64, reward_info=tf.float64,
                                               discount_info=tf.float64)
    return TFDSBackendWriter(directory, config, overwrite=False)


def write_one_step_dataset(directory: str) -> str:
    """A dataset of one episode of one step: every field's sample std is undefined (NaN)."""
    import numpy as np  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415
    import tensorflow_datasets as tfds  # noqa: PLC0415

    from rlds_tf.recording import tfds_writer  # noqa: PLC0415

    config = tfds.rlds.rlds_base.DatasetConfig(name="one_step", observation_info=tf.float32,
                                               action_info=tf.int64, reward_info=tf.float64,
                                               discount_info=tf.float64)
    writer = tfds_writer.DatasetWriter(directory, config, split_names=["train"])
    writer.add_episode({"steps": {"observation": np.array([0.5], np.float32), "action": np.array([2]),
                                  "reward": np.array([1.5]), "discount": np.array([1.0]),
                                  "is_first": np.array([True]), "is_last": np.array([True]),
                                  "is_terminal": np.array([True])}}, split="train")
    writer.close()
    return directory
