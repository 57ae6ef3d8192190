"""`ReadEpisodes`: an RLDS dataset directory as a PCollection of episodes, read in parallel over its shards.

Each shard (tfrecord or array_record) becomes one unit of work: a worker reads the episodes it holds with
`rlds_tf.load_stacked` over the split slice the shard covers, so the values are exactly what `load_stacked`
gives in one process (numpy arrays; strings as bytes; images decoded by their TFDS feature). With
`raw_records=True` a worker yields the shard's serialized records as stored instead, each parsed with the
features to check it: what `rlds-tf convert` copies.
"""
from __future__ import annotations

import os
from typing import Any, Iterator, List, Optional, Tuple

import apache_beam as beam
import tensorflow_datasets as tfds

from rlds_tf import _raw_records
from rlds_tf import loading
from rlds_tf.beam import progress

# (split, index of the shard's first episode in the split, number of episodes, shard file name)
ShardTask = Tuple[str, int, int, str]


def shard_tasks(dataset_builder: tfds.core.DatasetBuilder, split: str) -> List[ShardTask]:
    """One task per shard of `split`: the episodes `[start, start + length)` of the split that it holds."""
    tasks, start = [], 0
    for instruction in dataset_builder.info.splits[split].file_instructions:
        length = int(instruction.take)
        if length < 0:  # TFDS: "to the end of the file"
            length = int(instruction.examples_in_shard) - int(instruction.skip)
        if length > 0:
            tasks.append((split, start, length, os.path.basename(os.fspath(instruction.filename))))
        start += length
    return tasks


class _ReadShard(beam.DoFn):
    """Reads the episodes of one shard with `load_stacked` (or its serialized records, checked against the
    features); yields them (with their index in the split)."""

    def __init__(self, directory: str, with_index: bool, report_progress: bool, shard_names: List[str],
                 raw_records: bool = False):
        self._directory = directory
        self._with_index = with_index
        self._report_progress = report_progress
        # The progress line gives each shard's ordinal in its split: k of N.
        self._ordinals = {name: k for k, name in enumerate(shard_names, start=1)}
        self._raw_records = raw_records

    def process(self, task: ShardTask) -> Iterator[Any]:
        split, start, length, filename = task
        shard_split = f"{split}[{start}:{start + length}]"
        if self._raw_records:
            builder = loading.builder(self._directory, validate=False)
            episodes = _raw_records.split_records(builder, shard_split)
        else:
            episodes = tfds.as_numpy(loading.load_stacked(self._directory, shard_split, validate=False))
        count = 0
        for episode in episodes:
            yield (start + count, episode) if self._with_index else episode
            count += 1
        if count != length:
            raise ValueError(f"{os.path.join(self._directory, filename)}: expected {length} episodes "
                             f"(dataset_info.json), read {count}")
        if self._report_progress:
            progress.report(f"read {filename}: {count} episode{'' if count == 1 else 's'} (shard "
                            f"{self._ordinals[filename]} of {len(self._ordinals)} of split {split!r})")


class ReadEpisodes(beam.PTransform):
    """Reads an RLDS dataset directory: one element per episode, shards read in parallel.

    Each element is `{'steps': {field: [T, ...] numpy array}, **episode metadata}`, the values
    `rlds_tf.load_stacked` gives. With `with_index=True` elements are `(index, episode)` pairs, the index
    being the episode's position in its split: `WriteEpisodes` writes such pairs in index order, so reading
    and writing keeps the order of the episodes.

    Args:
      path_or_builder_dir: a dataset directory (holding dataset_info.json); the directory must be readable
        by every worker (a shared file system or a path TensorFlow's file system reaches, e.g. gs://).
      split: one split name (the transform gives a PCollection), or None: every split, as a dict
        `{split: PCollection}` (what `WriteEpisodes` takes).
      with_index: yield `(index, episode)` pairs.
      raw_records: yield each episode's serialized record (bytes, as stored; parsed with the features to
        check it, never decoded) instead of its decoded values: what `WriteEpisodes` copies unchanged into a
        dataset with the same features (`rlds-tf convert` on Beam).
      report_progress: print a line to stderr as each shard is read.

    Raises:
      FileNotFoundError / ValueError: at construction, as `rlds_tf.builder` (not a dataset directory, not
        RLDS, unknown split).

    >>> import tempfile, apache_beam as beam
    >>> from rlds_tf.recording import EnvLogger, Catch
    >>> directory = tempfile.mkdtemp()
    >>> with EnvLogger(Catch(), data_directory=directory) as env:
    ...     timestep = env.reset()
    ...     while not timestep.last():
    ...         timestep = env.step(1)
    >>> with beam.Pipeline() as p:
    ...     _ = (p | ReadEpisodes(directory, split='train')
    ...          | beam.Map(lambda e: e['steps']['observation'].shape) | beam.Map(print))
    (10, 10, 5)
    """

    def __init__(self, path_or_builder_dir: Any, split: Optional[str] = None, *, with_index: bool = False,
                 report_progress: bool = False, raw_records: bool = False):
        super().__init__()
        self._directory = os.fspath(path_or_builder_dir)
        builder = loading.builder(self._directory)
        known = sorted(builder.info.splits.keys())
        if split is not None and split not in known:
            raise ValueError(f"unknown split {split!r}; dataset {builder.info.name!r} in {self._directory!r} has "
                             f"splits {known}")
        self._splits = [split] if split is not None else known
        self._single = split is not None
        self._tasks = {name: shard_tasks(builder, name) for name in self._splits}
        self._with_index = with_index
        self._report_progress = report_progress
        self._raw_records = raw_records
        self.features = builder.info.features
        self.info = builder.info

    @property
    def splits(self) -> List[str]:
        return list(self._splits)

    def expand(self, pbegin):
        out = {}
        for split in self._splits:
            tasks = self._tasks[split]
            out[split] = (pbegin
                          | f"Shards[{split}]" >> beam.Create(tasks)
                          # Spreads the shards over the workers (Create alone may keep them on one).
                          | f"Spread[{split}]" >> beam.Reshuffle()
                          | f"Read[{split}]" >> beam.ParDo(_ReadShard(self._directory, self._with_index,
                                                                       self._report_progress, [t[3] for t in tasks],
                                                                       self._raw_records)))
        return out[self._splits[0]] if self._single else out
