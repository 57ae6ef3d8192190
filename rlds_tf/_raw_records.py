"""The serialized episode records of a split, read as they are on disk and checked against the features.

`rlds-tf convert` (one process and on Beam) copies these records into the new directory unchanged: the
features do not change, so decoding and re-encoding an episode would only cost time and, for JPEG images,
change the pixels. Each record is still parsed with the dataset's features (without decoding images), so a
record that is corrupt or does not match the features is refused as a normal read would refuse it.
"""
from __future__ import annotations

import os
from typing import Iterable, Iterator

import tensorflow as tf
import tensorflow_datasets as tfds
from tensorflow_datasets.core import example_parser
from tensorflow_datasets.core import file_adapters

# Array_record records read per call: bounded reads keep memory flat on big shards.
_ARRAY_RECORD_BATCH = 256


def _instructions(dataset_builder, split: str) -> list[tuple[str, int, int]]:
    """(shard path, first record, records to read) for `split` (a split name or a slice such as 'train[3:5]')."""
    out = []
    for instruction in dataset_builder.info.splits[split].file_instructions:
        skip, take = int(instruction.skip), int(instruction.take)
        if take < 0:  # TFDS: "to the end of the file"
            take = int(instruction.examples_in_shard) - skip
        if take > 0:
            out.append((os.fspath(instruction.filename), skip, take))
    return out


def _array_record_dataset(instructions: list[tuple[str, int, int]]) -> tf.data.Dataset:
    from array_record.python import array_record_module  # optional dependency, only for this format

    def records() -> Iterable[bytes]:
        for path, skip, take in instructions:
            reader = array_record_module.ArrayRecordReader(path)
            try:
                for start in range(skip, skip + take, _ARRAY_RECORD_BATCH):
                    yield from reader.read(list(range(start, min(start + _ARRAY_RECORD_BATCH, skip + take))))
            finally:
                reader.close()

    return tf.data.Dataset.from_generator(records, output_signature=tf.TensorSpec((), tf.string))


def _tfrecord_dataset(instructions: list[tuple[str, int, int]]) -> tf.data.Dataset:
    # One dataset per shard, concatenated: skip/take count records of that shard only (the CRCs are checked).
    shards = [tf.data.TFRecordDataset(path).skip(skip).take(take) for path, skip, take in instructions]
    dataset = shards[0]
    for shard in shards[1:]:
        dataset = dataset.concatenate(shard)
    return dataset


def split_records(dataset_builder: tfds.core.DatasetBuilder, split: str) -> Iterator[bytes]:
    """The serialized episodes of `split` in order, each checked by parsing it with the dataset's features.

    Args:
      dataset_builder: the dataset's builder (`rlds_tf.builder`).
      split: a split name, or a slice of one (`'train[3:5]'`).

    Yields:
      The records, byte for byte as stored.

    Raises:
      tf.errors.OpError: at a corrupt record (bad CRC, truncated shard) or one the features cannot parse.
    """
    instructions = _instructions(dataset_builder, split)
    if not instructions:
        return
    if dataset_builder.info.file_format == file_adapters.FileFormat.ARRAY_RECORD:
        records = _array_record_dataset(instructions)
    else:
        records = _tfrecord_dataset(instructions)
    parser = example_parser.ExampleParser(dataset_builder.info.features.get_serialized_info())
    # The parsed fields (images still encoded) ride along with each record: an output nobody consumed could be
    # pruned from the graph, and with it the check.
    checked = records.map(lambda record: (record, parser.parse_example(record)),
                          num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    for record, _ in checked.as_numpy_iterator():
        yield record
