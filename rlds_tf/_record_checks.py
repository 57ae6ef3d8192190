"""Checks of a dataset's records against its metadata, and one-line reports of unreadable records.

TFDS trusts `features.json`: a step field the records lack decodes as zero rows beside the others (or
fails deep in a tf.data map for an episode field), and a corrupt or truncated shard surfaces as a
`DataLossError` that names neither the file nor the record. `check_records_have_features` compares the
first record of the first non-empty shard with the features before anything is read;
`locate_bad_record` re-reads the shards of a split after a read failed, to name the file and record.
"""
from __future__ import annotations

import os
from typing import Iterator, Optional

import tensorflow as tf
import tensorflow_datasets as tfds
from tensorflow_datasets.core import file_adapters

from rlds_tf.recording import tfrecord_files

_HEADER = 12  # TFRecord framing: uint64 length + uint32 length crc, then data and a uint32 data crc


def _is_array_record(dataset_builder) -> bool:
    return dataset_builder.info.file_format == file_adapters.FileFormat.ARRAY_RECORD


def _shards(dataset_builder) -> Iterator[tuple[str, str, int]]:
    """(split, shard path, records listed) for every shard of every split, in file order."""
    for split, split_info in sorted(dataset_builder.info.splits.items()):
        for instruction in split_info.file_instructions:
            yield split, os.fspath(instruction.filename), int(instruction.examples_in_shard)


def _first_record(path: str, array_record: bool) -> Optional[bytes]:
    """The first record of a shard, read without TF ops (None when the shard is missing or unreadable)."""
    try:
        if array_record:
            from array_record.python import array_record_module  # noqa: PLC0415  (optional dependency)
            reader = array_record_module.ArrayRecordReader(path)
            try:
                return reader.read([0])[0] if reader.num_records() else None
            finally:
                reader.close()
        with os.fdopen(tfrecord_files.open_regular(path), "rb") as f:  # never blocks on a FIFO
            header = f.read(_HEADER)
            if len(header) < _HEADER:
                return None
            length = int.from_bytes(header[:8], "little")
            data = f.read(length)
            return data if len(data) == length else None
    except (OSError, RuntimeError, ValueError, ImportError):
        return None  # reading the data reports it, with locate_bad_record's help


def _serialized_fields(features) -> dict:
    """Feature key in the serialized tf.train.Example -> its serialized info (nested keys joined by '/')."""
    return tfds.core.utils.flatten_nest_dict(features.get_serialized_info())


def check_records_have_features(dataset_builder) -> None:
    """ValueError naming the fields `features.json` declares that the dataset's records do not hold.

    Only the first record of the first non-empty shard is read (a few bytes to a few MB): a dataset's
    records all come from one serializer, so a field missing there is missing everywhere.
    """
    array_record = _is_array_record(dataset_builder)
    for split, path, listed in _shards(dataset_builder):
        if not listed or not os.path.exists(path):
            continue
        data = _first_record(path, array_record)
        if data is None:
            return
        try:
            example = tf.train.Example.FromString(data)
        except Exception:  # noqa: BLE001  (protobuf's DecodeError; the read reports a corrupt record)
            return
        present = set(example.features.feature.keys())
        expected = {key for key, info in _serialized_fields(dataset_builder.info.features).items()
                    if not getattr(info, "optional", False)}
        missing = sorted(expected - present)
        if missing:
            raise ValueError(f"dataset {dataset_builder.info.name!r}: features.json declares field(s) {missing} but "
                             f"the records lack them (record 0 of {path!r}, split {split!r}, holds "
                             f"{sorted(present)}); fix features.json to describe the records")
        return


def _first_line(error: Exception) -> str:
    """A TF error's message without its `{{function_node ...}}` prefix and `[Op:...]` suffix, on one line."""
    message = getattr(error, "message", None) or str(error)
    if message.startswith("{{function_node"):
        message = message.split("}}", 1)[-1]
    message = message.split(" [Op:")[0].split("\n")[0].strip()
    return message or type(error).__name__


def locate_bad_record(dataset_builder, split: str) -> Optional[str]:
    """`'shard PATH: record I: REASON'` for the first record of `split` that cannot be read, or None.

    Reads the shards one by one after a failed read, counting records, so a corrupt or truncated
    record is named by its file and index (TF names only a byte offset).
    """
    array_record = _is_array_record(dataset_builder)
    for shard_split, path, _ in _shards(dataset_builder):
        if shard_split != split:
            continue
        index = 0
        try:
            if array_record:
                from array_record.python import array_record_module  # noqa: PLC0415
                reader = array_record_module.ArrayRecordReader(path)
                try:
                    for index in range(reader.num_records()):
                        reader.read([index])
                finally:
                    reader.close()
                continue
            for _ in tf.data.TFRecordDataset(path):
                index += 1
        except (tf.errors.OpError, RuntimeError, OSError) as e:
            return f"shard {path!r}: record {index}: {_first_line(e)}"
    return None


def describe_read_error(dataset_builder, split: str, error: Exception) -> str:
    """One line for a failed read of `split`: the bad shard and record when found, else TF's reason."""
    located = locate_bad_record(dataset_builder, split)
    if located is not None:
        return f"split {split!r} of {dataset_builder.info.name!r} is unreadable: {located}"
    return (f"split {split!r} of {dataset_builder.info.name!r} could not be read: {_first_line(error)} "
            f"({type(error).__name__})")
