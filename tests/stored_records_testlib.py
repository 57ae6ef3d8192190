"""The episode records a dataset directory stores, read straight from its shard files (no TF, no TFDS)."""
import glob
import json
import os
import struct


def _tfrecord_records(path):
    """Records of a TFRecord file: `uint64 length | uint32 crc | data | uint32 crc`, little endian."""
    with open(path, "rb") as f:
        data = f.read()
    records, offset = [], 0
    while offset < len(data):
        (length,) = struct.unpack_from("<Q", data, offset)
        records.append(data[offset + 12:offset + 12 + length])
        offset += 12 + length + 4
    return records


def _array_record_records(path):
    from array_record.python import array_record_module

    reader = array_record_module.ArrayRecordReader(path)
    try:
        return list(reader.read(list(range(reader.num_records()))))
    finally:
        reader.close()


def stored_records(directory):
    """`{split: [record bytes, ...]}` in shard-file order, and `{split: shard lengths}` from dataset_info.json."""
    with open(os.path.join(directory, "dataset_info.json")) as f:
        info = json.load(f)
    records, lengths = {}, {}
    for split in info["splits"]:
        name = split["name"]
        lengths[name] = [int(n) for n in split.get("shardLengths", [])]
        shards = sorted(glob.glob(os.path.join(directory, f"*-{name}.*-[0-9][0-9][0-9][0-9][0-9]")))
        read = _array_record_records if ".array_record-" in os.path.basename(shards[0]) else _tfrecord_records
        records[name] = [record for shard in shards for record in read(shard)]
    return records, lengths
