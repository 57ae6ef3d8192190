"""envlogger's `envlogger.backends.rlds_utils` for TFDS-backend users: `maybe_recover_last_shard`, `to_rlds_step`.

Code written for envlogger 1.2 changes one import:
`from envlogger.backends import rlds_utils` becomes `from rlds_tf.recording import rlds_utils`.

`maybe_recover_last_shard(builder)` takes what envlogger's takes, a TFDS builder of a recorded dataset
(`tfds.builder_from_directory(path)`), and repairs the directory with `rlds_tf.recording.recover`: besides
the shard envlogger adds to the metadata (one written after the last metadata update), it lists records
appended to the last listed shard and truncates a record cut short by the crash, which envlogger's leaves
for TFDS to fail on. It refuses while a recorder still writes into the directory (RuntimeError).

>>> import tempfile
>>> import tensorflow_datasets as tfds
>>> from rlds_tf.recording import Catch, EnvLogger
>>> directory = tempfile.mkdtemp()
>>> with EnvLogger(Catch(seed=0), data_directory=directory) as env:
...     timestep = env.reset()
...     while not timestep.last():
...         timestep = env.step(1)
>>> builder = maybe_recover_last_shard(tfds.builder_from_directory(directory))
>>> builder.info.splits['train'].num_examples
1
"""
from __future__ import annotations

from typing import Any

import tensorflow_datasets as tfds

from rlds_tf.recording import crash_recovery
from rlds_tf.recording.backend import to_rlds_step

__all__ = ["maybe_recover_last_shard", "to_rlds_step"]


def maybe_recover_last_shard(builder: Any) -> Any:
    """Repairs the dataset directory `builder` reads after a crashed recording; returns `builder`.

    Args:
      builder: a TFDS builder of a dataset in a local directory, e.g. `tfds.builder_from_directory(path)`
        (its `data_dir` is the directory holding `dataset_info.json`).

    Returns:
      `builder`, its `info.splits` listing every complete episode on disk. The builder passed in is updated
      too, as envlogger's is, so code that ignores the return value reads the recovered episodes as well.

    Raises:
      ValueError: `builder.data_dir` is not a local directory (crash recovery rewrites files in place), or
        its `dataset_info.json` names shards outside it.
      RuntimeError: a recorder still writes into the directory.
    """
    data_dir = str(builder.data_dir)
    if "://" in data_dir:
        raise ValueError(f"maybe_recover_last_shard: builder.data_dir must be a local directory, got {data_dir!r}; "
                         f"copy the dataset to a local directory and recover it there")
    if not crash_recovery.recover(data_dir):
        return builder
    recovered = tfds.builder_from_directory(data_dir)
    builder.info.set_splits(recovered.info.splits)
    return builder
