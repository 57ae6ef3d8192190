"""`WriteEpisodes`: a PCollection of episodes written as an RLDS dataset directory, shards in parallel.

The directory is what `rlds_tf`'s recorder and `rlds-tf convert` write, byte for byte for the same episodes in
the same order and the same shard sizes: the records come from the recorder's encoder (or are copied as given,
for records already serialized), shards are named and
framed as TFDS's `SequentialWriter` names and frames them, and the metadata files (dataset_info.json with the
shard lengths, features.json) are written by the recorder's code. Everything goes into a hidden sibling of the
destination, renamed to it by the last step once every shard is written: a pipeline that fails or is killed
leaves no directory that looks like a complete dataset.
"""
from __future__ import annotations

import bisect
import contextlib
import hashlib
import json
import os
import uuid
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple, Union

import apache_beam as beam
import tensorflow as tf
import tensorflow_datasets as tfds
from tensorflow_datasets.core import file_adapters

from rlds_tf import rlds_types
from rlds_tf.beam import progress
from rlds_tf.recording import tfds_writer
from rlds_tf.recording.episode_encoder import EpisodeEncoder

# The shard names TFDS's SequentialWriter gives (what the recorder and `rlds-tf convert` write).
_SHARD_TEMPLATE = "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_INDEX}"
_FORMATS = ("tfrecord", "array_record")
# Shard files being written (see _WriteShard); _Finalize removes those of attempts that died.
_TEMPORARY_PREFIX = ".attempt-"


def _config_from(features_or_spec: Any, name: Optional[str]) -> tfds.rlds.rlds_base.DatasetConfig:
    if isinstance(features_or_spec, tfds.rlds.rlds_base.DatasetConfig):
        return features_or_spec
    if isinstance(features_or_spec, tfds.core.DatasetInfo):
        info = features_or_spec
        return tfds_writer.dataset_config(info.features, name=name or info.name, description=info.description,
                                          homepage=info.homepage, citation=info.citation)
    if isinstance(features_or_spec, tfds.features.FeaturesDict):
        return tfds_writer.dataset_config(features_or_spec, name=name or "rlds_dataset")
    raise TypeError(f"features (a {type(features_or_spec).__name__}) must be a tfds.features.FeaturesDict of "
                    f"the episodes (e.g. ReadEpisodes(...).features or a builder's info.features), a "
                    f"tfds.core.DatasetInfo, or a tfds.rlds.rlds_base.DatasetConfig")


def _build_info(config, version: str, directory: str) -> tfds.core.DatasetInfo:
    identity = tfds.core.dataset_info.DatasetIdentity(
        name=config.name, version=tfds.core.Version(version), data_dir=directory, module_name="")
    return tfds.rlds.rlds_base.build_info(config, identity, None)


def _in_feature_order(value: Any, feature: Any) -> Any:
    """`value` with its dicts' keys in the features' order (unknown keys last).

    The encoder writes fields in the order it meets them, and a Beam coder may hand a dict over with its keys
    reordered; ordering them as the features declare keeps the records what the one-process writers write.
    """
    if isinstance(feature, tfds.features.Dataset):
        feature = feature.feature
    if not (isinstance(value, Mapping) and isinstance(feature, tfds.features.FeaturesDict)):
        return value
    known = [k for k in feature.keys() if k in value]
    ordered = {k: _in_feature_order(value[k], feature[k]) for k in known}
    ordered.update((k, v) for k, v in value.items() if k not in ordered)
    return ordered


class _Serialize(beam.DoFn):
    """Episode (or `(index, episode)`) -> `(sort key, record)`: indexed episodes keep their index as the key.

    An episode given as bytes is a record already serialized with these features (`ReadEpisodes(...,
    raw_records=True)`), written as it is.
    """

    def __init__(self, config, version: str):
        self._config = config
        self._version = version
        self._features = None
        self._encoder = None

    def setup(self):
        self._features = _build_info(self._config, self._version, "").features
        self._encoder = EpisodeEncoder(self._features)

    def _serialized(self, episode: Any) -> bytes:
        if isinstance(episode, bytes):
            return episode
        return tfds_writer.serialize_episode(self._encoder, _in_feature_order(episode, self._features))

    def process(self, element: Any) -> Iterable[Tuple[Any, bytes]]:
        if isinstance(element, tuple) and len(element) == 2 and not isinstance(element[0], Mapping):
            index, episode = element
            serialized = self._serialized(episode)
            yield (0, int(index)), serialized
        else:
            serialized = self._serialized(element)
            # Episodes without an index are ordered by the digest of their record (deterministic). Identical
            # episodes (repeated demonstrations) share a digest; a random tie-break gives each its own rank,
            # and which copy takes which rank does not change the bytes written.
            yield (1, hashlib.sha256(serialized).hexdigest(), uuid.uuid4().hex), serialized


def _shard_of(keyed: Tuple[Any, bytes], sorted_keys: List[Any], num_shards: Optional[int],
              max_episodes_per_file: int) -> Tuple[int, Tuple[Any, bytes]]:
    rank = bisect.bisect_left(sorted_keys, keyed[0])
    if num_shards is None:
        return rank // max_episodes_per_file, keyed
    # Contiguous runs of ranks, sizes differing by at most one.
    return rank * min(num_shards, len(sorted_keys)) // len(sorted_keys), keyed


def _check_unique_keys(sorted_keys: List[Any], split: str) -> List[Any]:
    kinds = {k[0] for k in sorted_keys}
    if len(kinds) > 1:
        raise ValueError(f"split {split!r}: some elements are (index, episode) pairs and some bare episodes; "
                         f"give one kind")
    for a, b in zip(sorted_keys, sorted_keys[1:]):
        if a == b:  # only indices can repeat: bare episodes' keys carry a tie-break
            raise ValueError(f"split {split!r}: two (index, episode) pairs have index {a[1]}; each episode "
                             f"needs its own index (ReadEpisodes(..., with_index=True) gives one per episode)")
    return sorted_keys


class _WriteShard(beam.DoFn):
    """Writes one shard file (records in key order) as TFDS's SequentialWriter would; yields its size."""

    def __init__(self, partial: str, dataset_name: str, split: str, file_format: str, report_progress: bool):
        self._partial = partial
        self._dataset_name = dataset_name
        self._split = split
        self._file_format = file_format
        self._report_progress = report_progress

    def process(self, element) -> Iterable[Tuple[str, int, int, int]]:
        shard, keyed = element
        records = [record for _, record in sorted(keyed, key=lambda kv: kv[0])]
        suffix = file_adapters.FileFormat(self._file_format).file_suffix
        os.makedirs(self._partial, exist_ok=True)
        path = os.path.join(self._partial, f"{self._dataset_name}-{self._split}.{suffix}-{shard:05d}")
        # Each attempt writes its own temporary file beside the shard and renames it over the shard's name
        # (an atomic replace): a retried or duplicate attempt never leaves a torn shard, and the last one to
        # finish leaves the same bytes as any other.
        temporary = os.path.join(self._partial, f"{_TEMPORARY_PREFIX}{os.path.basename(path)}-{uuid.uuid4().hex}")
        try:
            if self._file_format == "tfrecord":
                writer = tf.io.TFRecordWriter(temporary)
            else:
                from array_record.python import array_record_module  # optional dependency, only for this format
                writer = array_record_module.ArrayRecordWriter(temporary, "group_size:1")
            try:
                for record in records:
                    writer.write(record)
                if hasattr(writer, "flush"):
                    writer.flush()
            finally:
                writer.close()
            os.replace(temporary, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.remove(temporary)
            raise
        if self._report_progress:
            progress.report(f"wrote {os.path.basename(path)}: {len(records)} "
                            f"episode{'' if len(records) == 1 else 's'}")
        yield self._split, shard, len(records), sum(len(r) for r in records)


class _Finalize(beam.DoFn):
    """Writes the metadata files into the hidden directory and renames it to the destination.

    Safe to run again (a runner retries a step whose result it did not record): once the destination holds
    this dataset's dataset_info.json, a rerun only reports the counts.
    """

    def __init__(self, config, version: str, file_format: str, partial: str, destination: str,
                 split_names: List[str]):
        self._config = config
        self._version = version
        self._file_format = file_format
        self._partial = partial
        self._destination = destination
        self._split_names = split_names

    def _already_renamed(self, lengths: Dict[str, List[int]]) -> bool:
        """True if an earlier attempt put this dataset (the same shard lengths) at the destination."""
        if os.path.isdir(self._partial):
            return False
        try:
            with open(os.path.join(self._destination, "dataset_info.json"), encoding="utf-8") as f:
                splits = json.load(f).get("splits", [])
        except (FileNotFoundError, NotADirectoryError, ValueError):
            return False
        return {s.get("name"): [int(n) for n in s.get("shardLengths", [])] for s in splits} == lengths

    def process(self, shards: List[Tuple[str, int, int, int]],
                expected: List[Tuple[str, int]]) -> Iterable[Dict[str, int]]:
        by_split: Dict[str, Dict[int, Tuple[int, int]]] = {s: {} for s in self._split_names}
        for split, shard, length, num_bytes in shards:
            by_split[split][shard] = (length, num_bytes)
        expected_counts = dict(expected)
        for split, found in by_split.items():
            if sorted(found) != list(range(len(found))):
                raise ValueError(f"split {split!r}: shards {sorted(found)} were written; expected 0..{len(found) - 1}")
            written = sum(length for length, _ in found.values())
            # A lost last shard leaves the others numbered 0..k-1: only the episode count shows it.
            if written != expected_counts.get(split, 0):
                raise ValueError(f"split {split!r}: the shards written hold {written} episodes; expected "
                                 f"{expected_counts.get(split, 0)} (the episodes given)")
        lengths = {split: [by_split[split][i][0] for i in range(len(by_split[split]))] for split in self._split_names}
        counts = {split: sum(lengths[split]) for split in self._split_names}
        if self._already_renamed(lengths):
            yield counts
            return
        # The rename's precondition, checked before any metadata makes the hidden directory look complete.
        if os.path.isdir(self._destination) and os.listdir(self._destination):
            raise ValueError(f"the destination {self._destination!r} is no longer empty; the dataset stays in "
                             f"{self._partial!r} without metadata")
        if os.path.exists(self._destination) and not os.path.isdir(self._destination):
            raise ValueError(f"the destination {self._destination!r} is a file; the dataset stays in "
                             f"{self._partial!r} without metadata")
        os.makedirs(self._partial, exist_ok=True)
        for name in os.listdir(self._partial):
            if name.startswith(_TEMPORARY_PREFIX):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(os.path.join(self._partial, name))
        info = _build_info(self._config, self._version, self._partial)
        info.set_file_format(self._file_format)
        template = lambda split: tfds.core.ShardedFileTemplate(  # noqa: E731
            data_dir=self._partial, template=_SHARD_TEMPLATE, dataset_name=self._config.name, split=split,
            filetype_suffix=file_adapters.FileFormat(self._file_format).file_suffix)
        # What the recorder does: the metadata with empty splits first, then the splits' shard lengths.
        base = tfds_writer.write_info_files(self._partial, info, [
            tfds.core.SplitInfo(name=split, shard_lengths=[], num_bytes=0, filename_template=template(split))
            for split in self._split_names])
        tfds_writer.write_split_entries(self._partial, base, [
            (split, _SHARD_TEMPLATE, lengths[split], sum(n for _, n in by_split[split].values()))
            for split in self._split_names])
        if os.path.isdir(self._destination):
            os.rmdir(self._destination)  # empty when checked above; raises if something was added since
        os.rename(self._partial, self._destination)
        yield counts


class WriteEpisodes(beam.PTransform):
    """Writes episodes as an RLDS dataset directory (what the recorder and `rlds-tf convert` write).

    The input is a PCollection (written as split `split`) or a dict `{split: PCollection}` (what
    `ReadEpisodes(dir)` gives). Elements are episodes, `{'steps': <dict of [T, ...] arrays or list of step
    dicts>, **metadata}`, or `(index, episode)` pairs: pairs are written in index order (as
    `ReadEpisodes(..., with_index=True)` yields them, so a read-write pipeline keeps the order); bare
    episodes in the order of the digests of their records (deterministic, not the arrival order; identical
    episodes may repeat). An episode may also be its record already serialized with these features (bytes,
    as `ReadEpisodes(..., raw_records=True)` yields them): it is written unchanged.

    The output is a PCollection with one element, `{split: episodes written}`, once the directory is in place.

    Args:
      path: the new dataset directory (absent or empty; must be on a file system every worker and the last
        step can write, and that renames directories atomically: a local or shared POSIX file system).
      features: the episode features (`ReadEpisodes(...).features`, a builder's `info.features`, a
        `tfds.core.DatasetInfo` (its name and texts are kept), or a `tfds.rlds.rlds_base.DatasetConfig`).
      num_shards: shards per split (sizes differing by at most one); None: `max_episodes_per_file` per shard,
        as the recorder and `rlds-tf convert` cut them.
      split: the split name of a single input PCollection.
      file_format: 'tfrecord' or 'array_record'.
      name: the dataset name (default: the features' DatasetInfo/DatasetConfig name, else 'rlds_dataset').
      version: the dataset version.
      max_episodes_per_file: see `num_shards`.
      report_progress: print a line to stderr as each shard is written.

    Raises:
      ValueError: at construction, bad arguments or a destination that exists and is not empty; in the
        pipeline, two (index, episode) pairs with the same index.
    """

    def __init__(self, path: Any, features: Any, num_shards: Optional[int] = None, *, split: str = "train",
                 file_format: str = "tfrecord", name: Optional[str] = None, version: str = "0.0.1",
                 max_episodes_per_file: int = 1000, report_progress: bool = False):
        super().__init__()
        if file_format not in _FORMATS:
            raise ValueError(f"file_format ({file_format!r}) must be one of {list(_FORMATS)}")
        if num_shards is not None and num_shards < 1:
            raise ValueError(f"num_shards ({num_shards}) must be >= 1 or None")
        if max_episodes_per_file < 1:
            raise ValueError(f"max_episodes_per_file ({max_episodes_per_file}) must be >= 1")
        destination = os.path.abspath(os.path.expanduser(os.fspath(path)))
        if os.path.exists(destination) and not os.path.isdir(destination):
            raise ValueError(f"path ({destination!r}) is a file; give a new directory")
        if os.path.isdir(destination) and os.listdir(destination):
            raise ValueError(f"path ({destination!r}) exists and is not empty; give a new directory")
        self._config = _config_from(features, name)
        if name is not None and self._config.name != name:
            self._config = tfds_writer.dataset_config(_build_info(self._config, version, "").features, name=name,
                                                      description=self._config.description,
                                                      homepage=self._config.homepage,
                                                      citation=self._config.citation)
        self._destination = destination
        self.partial_directory = tfds_writer.partial_sibling(destination)  # (made by the first shard written)
        self._num_shards = num_shards
        self._split = split
        self._file_format = file_format
        self._version = version
        self._max_episodes_per_file = max_episodes_per_file
        self._report_progress = report_progress

    def expand(self, episodes: Union[beam.PCollection, Dict[str, beam.PCollection]]):
        by_split = dict(episodes) if isinstance(episodes, dict) else {self._split: episodes}
        if not by_split:
            raise ValueError("WriteEpisodes got an empty dict of PCollections; give at least one split")
        written, expected = [], []
        for split, pcoll in by_split.items():
            keyed = pcoll | f"Serialize[{split}]" >> beam.ParDo(_Serialize(self._config, self._version))
            sorted_keys = (keyed
                           | f"Keys[{split}]" >> beam.Keys()
                           | f"AllKeys[{split}]" >> beam.combiners.ToList()
                           | f"Sort[{split}]" >> beam.Map(lambda keys, s=split: _check_unique_keys(sorted(keys), s)))
            shards = (keyed
                      | f"AssignShard[{split}]" >> beam.Map(_shard_of, beam.pvalue.AsSingleton(sorted_keys),
                                                            self._num_shards, self._max_episodes_per_file)
                      | f"GroupShard[{split}]" >> beam.GroupByKey()
                      | f"WriteShard[{split}]" >> beam.ParDo(_WriteShard(
                          self.partial_directory, self._config.name, split, self._file_format,
                          self._report_progress)))
            written.append(shards)
            expected.append(sorted_keys | f"Count[{split}]" >> beam.Map(lambda keys, s=split: (s, len(keys))))
        expected_counts = beam.pvalue.AsList(expected | "AllCounts" >> beam.Flatten())
        return (written
                | "AllShards" >> beam.Flatten()
                | "ShardList" >> beam.combiners.ToList()
                | "Finalize" >> beam.ParDo(_Finalize(self._config, self._version, self._file_format,
                                                     self.partial_directory, self._destination, list(by_split)),
                                       expected_counts))
