"""Writes RLDS episodes into a TFDS directory through `tfds.core.SequentialWriter`, durably, one by one.

On top of TFDS's sequential writer this adds what a recorder needs:
  * durability per episode: after each episode the open shard is flushed and `dataset_info.json` is atomically
    replaced by one that lists that shard's episodes too, so after `kill -9` the directory loads (on current TFDS
    and on 4.9.4) with every completed episode (see `crash_recovery` for the one case that needs a repair);
  * a fast encoder for plain tensor features (`episode_encoder`), byte-compatible with TFDS's own;
  * a lock so that two processes never record into one directory.
"""
from __future__ import annotations

import glob
import os
import shutil
import stat
import tempfile
import uuid
from typing import Any, Mapping, Sequence

import tensorflow_datasets as tfds
from tensorflow_datasets.core import file_adapters

from rlds_tf import rlds_types
from rlds_tf.recording import tfrecord_files as files
from rlds_tf.recording import crash_recovery
from rlds_tf.recording.episode_encoder import EpisodeEncoder

DatasetConfig = tfds.rlds.rlds_base.DatasetConfig
# The shard names TFDS's SequentialWriter gives (its `_initialize_split`).
_SHARD_TEMPLATE = "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_INDEX}"


class _DurableSequentialWriter(tfds.core.SequentialWriter):
    """SequentialWriter whose metadata also lists the open shard, written atomically after each episode."""

    def __init__(self, *args, durable: bool, **kwargs):
        self._durable = durable
        self._info_base: dict | None = None
        super().__init__(*args, **kwargs)

    def add_serialized(self, split_name: str, serialized: bytes) -> None:
        split = self._splits.get(split_name)
        if split is None:
            raise KeyError(f"unknown split {split_name!r}; initialized splits: {sorted(self._splits)}")
        split.add_example(serialized)
        if split.current_shard.num_examples >= self._max_examples_per_shard:
            split.close_shard()
        self._write_splits_metadata()

    def _split_entries(self) -> list[tuple[Any, list[int], int]]:
        entries = []
        for split in self._splits.values():
            lengths, num_bytes = [int(n) for n in split.info.shard_lengths], int(split.info.num_bytes)
            shard = split.current_shard
            # A tfrecord shard can be read while open, once flushed; an array_record shard only once closed.
            if shard is not None and shard.num_examples and self._durable:
                shard.writer.flush()
                lengths.append(int(shard.num_examples))
                num_bytes += shard.num_bytes
            entries.append((split, lengths, num_bytes))
        return entries

    def _write_splits_metadata(self) -> None:
        entries = self._split_entries()
        if self._info_base is None:
            # First write: every metadata file (each move into place is atomic).
            self._info_base = write_info_files(self._data_dir, self._ds_info, [
                tfds.core.SplitInfo(name=s.info.name, shard_lengths=lengths, num_bytes=num_bytes,
                                    filename_template=s.info.filename_template)
                for s, lengths, num_bytes in entries])
            return
        write_split_entries(self._data_dir, self._info_base,
                            [(s.info.name, s.info.filename_template.template, lengths, num_bytes)
                             for s, lengths, num_bytes in entries])


def partial_sibling(destination: str) -> str:
    """A new hidden sibling of `destination` to write a dataset into, renamed to `destination` once complete:
    on the same file system, so that the rename is atomic, and never taken for a dataset while hidden."""
    destination = os.path.abspath(destination)
    return os.path.join(os.path.dirname(destination),
                        f".{os.path.basename(destination)}.partial-{uuid.uuid4().hex[:12]}")


def write_info_files(data_directory: str, ds_info: tfds.core.DatasetInfo,
                     split_infos: Sequence[tfds.core.SplitInfo]) -> dict:
    """Writes every metadata file of `ds_info` with these splits into `data_directory`; returns its info JSON.

    The files are built in a hidden staging directory and moved in one by one, each move atomic.
    """
    ds_info.set_splits(tfds.core.SplitDict(list(split_infos)))
    staging = tempfile.mkdtemp(prefix=".tmp-info-", dir=data_directory)
    try:
        ds_info.write_to_directory(staging)
        for name in sorted(os.listdir(staging)):
            os.replace(os.path.join(staging, name), os.path.join(data_directory, name))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return files.read_info_json(data_directory)


def write_split_entries(data_directory: str, info_base: dict,
                        splits: Sequence[tuple[str, str, Sequence[int], int]]) -> None:
    """Atomically replaces dataset_info.json by `info_base` listing `(name, template, lengths, num_bytes)` splits."""
    info = dict(info_base)
    info["splits"] = [files.split_json(name, template, list(lengths), num_bytes)
                      for name, template, lengths, num_bytes in splits]
    files.atomic_write_text(os.path.join(data_directory, files.DATASET_INFO), files.info_json_text(info))


class DatasetWriter:
    """Writes RLDS episodes to a TFDS dataset directory; each added episode is durable once the call returns.

    Args:
      data_directory: where the dataset goes (created if missing).
      ds_config: the `tfds.rlds.rlds_base.DatasetConfig` describing steps and episode metadata.
      split_names: the splits to create (episodes go to the first unless another is named).
      max_episodes_per_file: episodes per shard file.
      version: dataset version (`major.minor.patch`).
      file_format: `'tfrecord'` (crash safe per episode) or `'array_record'` (an open shard is lost on a crash).
      overwrite: True starts a new dataset; False appends new shards to an existing one (recovering it first).
      ds_metadata: dataset-level metadata stored as `metadata.json`.

    >>> import tempfile, tensorflow as tf
    >>> config = DatasetConfig(name='toy', observation_info=tf.float32, action_info=tf.int64,
    ...                        reward_info=tf.float64, discount_info=tf.float64)
    >>> writer = DatasetWriter(tempfile.mkdtemp(), config)
    >>> step = dict(observation=1.0, action=0, reward=0.0, discount=0.0, is_first=True, is_last=True,
    ...             is_terminal=True)
    >>> writer.add_episode({'steps': [step]})
    >>> writer.close()
    """

    def __init__(self, data_directory: str, ds_config: DatasetConfig, *,
                 split_names: Sequence[str] = ("train",), max_episodes_per_file: int = 1000,
                 version: str = "0.0.1", file_format: str = "tfrecord", overwrite: bool = True,
                 ds_metadata: Mapping[str, Any] | None = None):
        if max_episodes_per_file < 1:
            raise ValueError(f"max_episodes_per_file ({max_episodes_per_file}) must be >= 1")
        if isinstance(split_names, str):
            split_names = [split_names]
        if not split_names:
            raise ValueError("split_names must name at least one split, e.g. ['train']")
        formats = [f.value for f in (file_adapters.FileFormat.TFRECORD, file_adapters.FileFormat.ARRAY_RECORD)]
        if file_format not in formats:
            raise ValueError(f"file_format ({file_format!r}) must be one of {formats}")
        data_directory = os.fspath(data_directory)
        os.makedirs(data_directory, exist_ok=True)
        self._data_directory = data_directory
        self._lock = files.WriterLock(data_directory)
        self._lock.acquire()
        try:
            appending = not overwrite and os.path.exists(os.path.join(data_directory, files.DATASET_INFO))
            if appending:
                crash_recovery.recover_locked(data_directory)
                _check_next_shards_are_free(data_directory, ds_config.name, split_names, file_format)
            else:
                _remove_old_shards(data_directory, ds_config.name, split_names, file_format)
            identity = tfds.core.dataset_info.DatasetIdentity(
                name=ds_config.name, version=tfds.core.Version(version), data_dir=data_directory, module_name="")
            self._ds_info = tfds.rlds.rlds_base.build_info(
                ds_config, identity, dict(ds_metadata) if ds_metadata is not None else None)
            self._writer = _DurableSequentialWriter(
                self._ds_info, max_episodes_per_file, overwrite=not appending, file_format=file_format,
                durable=file_format == "tfrecord")
            self._writer.initialize_splits(list(split_names), fail_if_exists=not appending)
        except BaseException:
            self._lock.release()
            raise
        self._split_names = list(split_names)
        self._encoder = EpisodeEncoder(self._ds_info.features)
        self._closed = False
        self.num_episodes = 0

    @property
    def ds_info(self) -> tfds.core.DatasetInfo:
        return self._ds_info

    @property
    def data_directory(self) -> str:
        return self._data_directory

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"the writer of {self._data_directory!r} is closed")

    def add_step(self, step: Mapping[str, Any]) -> None:
        """Adds one RLDS step to the open episode (validated now, written by `end_episode`)."""
        self._check_open()
        self._encoder.add_step(step)

    def end_episode(self, metadata: Mapping[str, Any] | None = None, *, split: str | None = None) -> None:
        """Writes the open episode with its metadata; it is on disk and listed when this returns."""
        self._check_open()
        split = split or self._split_names[0]
        if split not in self._split_names:
            self._encoder.discard()
            raise KeyError(f"unknown split {split!r}; this writer has {self._split_names}")
        serialized = self._encoder.serialize(metadata)
        self._writer.add_serialized(split, serialized)
        self.num_episodes += 1

    def discard_episode(self) -> None:
        """Drops the open episode's steps."""
        self._encoder.discard()

    @property
    def open_episode_length(self) -> int:
        return self._encoder.num_steps

    def add_episode(self, episode: Mapping[str, Any], *, split: str | None = None) -> None:
        """Writes a whole episode: `{'steps': <list of steps | dict of stacked [T, ...] arrays>, **metadata}`."""
        self._check_open()
        split = split or self._split_names[0]
        if split not in self._split_names:
            raise KeyError(f"unknown split {split!r}; this writer has {self._split_names}")
        serialized = serialize_episode(self._encoder, episode)
        self._writer.add_serialized(split, serialized)
        self.num_episodes += 1

    def add_serialized(self, serialized: bytes, *, split: str | None = None) -> None:
        """Writes an episode record as it is: one serialized with this dataset's features (e.g. copied from a
        dataset with the same features; `rlds-tf convert` copies records so)."""
        self._check_open()
        split = split or self._split_names[0]
        if split not in self._split_names:
            raise KeyError(f"unknown split {split!r}; this writer has {self._split_names}")
        self._writer.add_serialized(split, serialized)
        self.num_episodes += 1

    def close(self) -> None:
        """Drops an unfinished episode, closes the shards and writes the final metadata."""
        if self._closed:
            return
        self._closed = True
        closed_cleanly = False
        try:
            self._encoder.discard()
            self._writer.close_all()
            closed_cleanly = True
        finally:
            self._lock.release(remove=closed_cleanly)  # a lock file left behind marks an interrupted recording

    def __enter__(self) -> "DatasetWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def serialize_episode(encoder: EpisodeEncoder, episode: Mapping[str, Any]) -> bytes:
    """The record TFDS writes for `{'steps': <steps>, **metadata}` (steps as `add_episode` takes them)."""
    if rlds_types.STEPS not in episode:
        raise ValueError(f"an episode needs a {rlds_types.STEPS!r} field; got keys {sorted(episode)}")
    try:
        for step in _iter_steps(episode[rlds_types.STEPS]):
            encoder.add_step(step)
    except Exception:
        encoder.discard()
        raise
    return encoder.serialize({k: _to_numpy(v) for k, v in episode.items() if k != rlds_types.STEPS})


def dataset_config(features: tfds.features.FeaturesDict, *, name: str, description: str | None = None,
                   homepage: str | None = None, citation: str | None = None) -> DatasetConfig:
    """The `DatasetConfig` of an RLDS dataset's episode features (step fields beyond the core ones and episode
    fields other than `steps` become step and episode metadata)."""
    steps = features[rlds_types.STEPS].feature
    core = {rlds_types.OBSERVATION, rlds_types.ACTION, rlds_types.REWARD, rlds_types.DISCOUNT,
            rlds_types.IS_FIRST, rlds_types.IS_LAST, rlds_types.IS_TERMINAL}
    step_metadata = {k: steps[k] for k in steps.keys() if k not in core}
    episode_metadata = {k: features[k] for k in features.keys() if k != rlds_types.STEPS}
    return DatasetConfig(
        name=name, observation_info=steps[rlds_types.OBSERVATION], action_info=steps[rlds_types.ACTION],
        reward_info=steps[rlds_types.REWARD], discount_info=steps[rlds_types.DISCOUNT],
        step_metadata_info=step_metadata or None, episode_metadata_info=episode_metadata or None,
        description=description, homepage=homepage, citation=citation)


def _check_next_shards_are_free(data_directory: str, name: str, split_names: Sequence[str],
                                file_format: str) -> None:
    """ValueError when appending would write a split's shard through a symlink or a hard link.

    TFDS opens each new shard with truncation, from the first unlisted index on. A file found under one of
    those names is normally a shard a killed recorder left (array_record lists a shard only once closed), which
    is its to overwrite; a symlink or a file with more than one link (crash recovery leaves them alone) may be
    another file's data. Every index from the next one on is checked, not only the next: the recorder reaches
    the later ones as it fills shards.
    """
    suffix = file_adapters.FileFormat(file_format).file_suffix
    splits = {str(s.get("name")): s for s in files.read_info_json(data_directory).get("splits", [])
              if isinstance(s, dict)}
    for split in split_names:
        next_index = len(splits.get(split, {}).get("shardLengths", []))
        # The template ends with the shard index, written with 5 digits (or more past 99999).
        prefix = files.shard_path(data_directory, name, split, suffix, _SHARD_TEMPLATE, 0)[:-len("00000")]
        for path in sorted(glob.glob(f"{glob.escape(prefix)}*")):
            index = path[len(prefix):]
            if not index.isdigit() or int(index) < next_index:
                continue
            try:
                found = os.lstat(path)
            except FileNotFoundError:
                continue
            if not stat.S_ISREG(found.st_mode) or found.st_nlink != 1:
                raise ValueError(f"cannot append to {data_directory!r}: {path!r}, shard {int(index)} of split "
                                 f"{split!r} (this recorder writes shards from {next_index} on), is a "
                                 f"{files.file_kind(found.st_mode)} with {found.st_nlink} link(s), and TFDS would "
                                 f"truncate it to write that shard, whatever else it is; move it out of the "
                                 f"directory first")


def _remove_old_shards(data_directory: str, name: str, split_names: Sequence[str], file_format: str) -> None:
    """overwrite=True: drops the shards a previous recording left under the names this one will use.

    Otherwise a crash early in the new recording would leave old shards after the new ones, and crash
    recovery (which lists complete records found past the metadata) could not tell them apart.
    """
    suffix = file_adapters.FileFormat(file_format).file_suffix
    for split in split_names:
        for path in glob.glob(os.path.join(glob.escape(data_directory), f"{glob.escape(name)}-{glob.escape(split)}"
                                                                        f".{suffix}-*")):
            os.unlink(path)


def _to_numpy(value: Any) -> Any:
    """tf.Tensors (eager) -> numpy, recursively; TFDS's encoders only take numpy-compatible values."""
    import tensorflow as tf
    import tree

    return tree.map_structure(lambda x: x.numpy() if isinstance(x, tf.Tensor) else x, value)


def _iter_steps(steps: Any):
    """Steps as dicts, from a list of step dicts, a dict of stacked arrays, or a `tf.data.Dataset`."""
    import numpy as np  # local: only this helper needs it
    import tensorflow as tf
    import tree

    if isinstance(steps, tf.data.Dataset):
        yield from steps.as_numpy_iterator()
        return
    if isinstance(steps, Mapping):
        def as_arrays(x):  # lists are per-step values here, not nests to recurse into
            return {k: as_arrays(v) for k, v in x.items()} if isinstance(x, Mapping) else np.asarray(_to_numpy(x))
        steps = as_arrays(steps)
        leaves = tree.flatten(steps)
        lengths = {len(leaf) for leaf in leaves}
        if len(lengths) > 1:
            raise ValueError(f"stacked steps disagree on the episode length: leading dims {sorted(lengths)}")
        for i in range(lengths.pop() if lengths else 0):
            yield tree.map_structure(lambda x, i=i: x[i], steps)
        return
    yield from steps
