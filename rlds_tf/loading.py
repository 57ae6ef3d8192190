"""Loads RLDS datasets: a `tf.data.Dataset` of episodes, exactly as TFDS builds it, from a TFDS name or directories.

Three views of the same data:
  * `load`: episodes whose `steps` is a nested `tf.data.Dataset` (what TFDS and rlds give);
  * `load_stacked`: episodes whose `steps` is a dict of `[T, ...]` tensors (no nested datasets);
  * `load_steps`: all steps of all episodes as one flat dataset, optionally batched.
Both on-disk formats are read: tfrecord through `builder.as_dataset`, and array_record (which TFDS 4.9.10
serves only through `as_data_source`) by reading its records into tf.data and decoding them with the
dataset's own TFDS features, so all three views work the same on either format.

>>> import tempfile, numpy as np
>>> from rlds_tf.recording import EnvLogger, Catch
>>> directory = tempfile.mkdtemp()
>>> with EnvLogger(Catch(), data_directory=directory) as env:
...     timestep = env.reset()
...     while not timestep.last():
...         timestep = env.step(1)
>>> episode = next(iter(load_stacked(directory, split='train')))
>>> episode['steps']['observation'].shape
TensorShape([10, 10, 5])
"""
from __future__ import annotations

import contextlib
import os
from typing import Any, Iterable, Optional, Sequence, Union

import tensorflow as tf
from absl import logging
import tensorflow_datasets as tfds
from tensorflow_datasets.core import file_adapters

from rlds_tf import _record_checks
from rlds_tf import rlds_types
from rlds_tf._stacked_decoding import StackedSteps
from rlds_tf._stacked_decoding import decode_step_fields
from rlds_tf._stacked_decoding import variable_size_images
from rlds_tf.recording import tfrecord_files
from rlds_tf.recording import crash_recovery

PathOrName = Union[str, os.PathLike, Sequence[Union[str, os.PathLike]]]


def _looks_like_path(name: str) -> bool:
    # TFDS names contain '/' too ('d4rl_mujoco_hopper/v2-medium'), so only unambiguous paths count.
    return name.startswith((os.sep, ".", "~")) or "://" in name


def builder(name_or_dir: PathOrName, *, data_dir: Optional[str] = None, validate: bool = True,
            recover: bool = False) -> tfds.core.DatasetBuilder:
    """The TFDS builder behind `load`: by TFDS name, by directory, or several directories merged.

    Args:
      name_or_dir: a registered TFDS name (`'d4rl_mujoco_hopper/v2-medium'`), a dataset directory (one holding
        `dataset_info.json`), or a list of such directories with the same features (merged).
      data_dir: TFDS data dir for names.
      validate: check that the features are RLDS (`steps` with every core step field) and that the records
        hold every field features.json declares (the first record of the first non-empty shard is read).
      recover: True repairs a directory left by a killed rlds_tf recorder before reading it (never while it
        writes into it; see `rlds_tf.recording.recover`). By default reading never writes: a directory whose
        recorder was killed loads the episodes its metadata lists when TFDS can read them as they are, and
        otherwise raises a ValueError saying to run `rlds_tf.recording.recover(dir)` or `rlds-tf recover DIR`.

    Raises:
      FileNotFoundError: a directory does not exist.
      ValueError: not a TFDS dataset directory, not an RLDS dataset (names the missing field), records
        that lack a declared field (names it), or a
        crashed recording that needs `recover` first.
    """
    if isinstance(name_or_dir, (list, tuple)):
        if not name_or_dir:
            raise ValueError("name_or_dir is an empty list; give at least one dataset directory")
        dirs = [_check_dir(os.fspath(d), recover) for d in name_or_dir]
        result = tfds.builder_from_directories(dirs) if len(dirs) > 1 else tfds.builder_from_directory(dirs[0])
    else:
        name = os.fspath(name_or_dir)
        if os.path.isdir(os.path.expanduser(name)) or _looks_like_path(name):
            result = tfds.builder_from_directory(_check_dir(name, recover))
        else:
            try:
                result = tfds.builder(name, data_dir=data_dir)
            except (tfds.core.registered.DatasetNotFoundError, ValueError) as e:
                if not isinstance(e, tfds.core.registered.DatasetNotFoundError) and "Parsing builder name" not in str(e):
                    raise
                reason = str(e).strip().splitlines()[0]  # TFDS goes on to list every dataset it knows
                raise FileNotFoundError(f"{name!r} is neither an existing dataset directory nor a registered TFDS "
                                        f"dataset name ({reason})") from e
    if validate:
        _check_rlds_features(result)
        _record_checks.check_records_have_features(result)
    return result


def _check_dir(directory: str, recover: bool) -> str:
    directory = os.path.expanduser(directory)
    if "://" in directory:
        return directory  # remote (e.g. gs://): TFDS reports problems itself
    if not os.path.exists(directory):
        raise FileNotFoundError(f"dataset directory {directory!r} does not exist")
    if not os.path.isdir(directory):
        raise ValueError(f"{directory!r} is a file, not a dataset directory")
    missing = [f for f in ("dataset_info.json", "features.json") if not os.path.exists(os.path.join(directory, f))]
    if missing:
        children = sorted(os.listdir(directory))[:10]
        raise ValueError(f"{directory!r} is not a TFDS dataset directory: missing {missing} (it holds {children}); "
                         f"point at the directory that contains dataset_info.json, e.g. <name>/<version>")
    tfrecord_files.check_only_regular_files(directory)
    # Only directories an rlds_tf recorder was interrupted in (it removes its lock file on a clean close) are checked:
    # for them the metadata lists every complete episode, and the lock tells a live writer from a dead one.
    written_by_us = os.path.exists(os.path.join(directory, tfrecord_files.LOCK_FILE))
    if not written_by_us or tfrecord_files.writer_is_active(directory):
        return directory
    if recover:
        crash_recovery.recover(directory)
        return directory
    plan = crash_recovery.plan(directory)
    if plan is None or not (plan.changed or plan.unreadable):
        return directory
    if plan.unreadable:
        left_alone = f" ({'; '.join(message for _, message in plan.left_alone)})" if plan.left_alone else ""
        raise ValueError(f"{directory!r} was left by a recorder that was killed mid-write: shard(s) "
                         f"{[os.path.basename(p) for p in plan.unreadable]} hold a record cut short or records its "
                         f"dataset_info.json does not list, which TFDS cannot read. Repair it first (keeps every "
                         f"complete episode): rlds_tf.recording.recover({directory!r}), `rlds-tf recover "
                         f"{directory}`, or load(..., recover=True){left_alone}")
    logging.warning("rlds_tf: %s was left by a recorder that was killed; loading the episodes its metadata "
                    "lists. rlds_tf.recording.recover(%r) (or `rlds-tf recover DIR`) repairs it and lists any "
                    "other complete episode", directory, directory)
    return directory


def _check_rlds_features(dataset_builder: tfds.core.DatasetBuilder) -> None:
    features = dataset_builder.info.features
    where = f"dataset {dataset_builder.info.name!r}"
    if rlds_types.STEPS not in features.keys():
        raise ValueError(f"{where} is not an RLDS dataset: its features have no {rlds_types.STEPS!r} field "
                         f"(top-level fields: {sorted(features.keys())})")
    steps = features[rlds_types.STEPS]
    if not isinstance(steps, tfds.features.Dataset):
        raise ValueError(f"{where} is not an RLDS dataset: {rlds_types.STEPS!r} is a {type(steps).__name__}, "
                         f"not a tfds.features.Dataset")
    missing = sorted(rlds_types.CORE_STEP_FIELDS - set(steps.feature.keys()))
    if missing:
        raise ValueError(f"{where} is not an RLDS dataset: its steps lack the field(s) "
                         f"{[f'{rlds_types.STEPS}/{m}' for m in missing]} (steps have {sorted(steps.feature.keys())})")


def _check_split(dataset_builder: tfds.core.DatasetBuilder, split: Any) -> None:
    if split is None:
        return
    known = sorted(dataset_builder.info.splits.keys())
    if not known:
        return  # not prepared (or mocked): TFDS itself reports what is missing
    for expression in (split if isinstance(split, (list, tuple)) else [split]):
        if not isinstance(expression, str):
            continue  # tfds.core.ReadInstruction etc.: TFDS validates them
        for part in expression.split("+"):
            base = part.strip().split("[")[0].strip()
            if base != "all" and base not in known:
                raise ValueError(f"unknown split {base!r} in split={split!r}; dataset "
                                 f"{dataset_builder.info.name!r} has splits {known} (or 'all')")


def _is_array_record(dataset_builder: tfds.core.DatasetBuilder) -> bool:
    return dataset_builder.info.file_format == file_adapters.FileFormat.ARRAY_RECORD


# TFDS's own decoders read the deprecated `FeatureConnector.dtype` / `TensorInfo.dtype` (TFDS >= 4.9.5's
# `Tensor.decode_example`, `FeatureConnector.decode_batch_example`) and log a deprecation notice while a
# dataset is built: a notice about TFDS's internals that the caller can do nothing about.
_TFDS_DTYPE_NOTICES = ("`FeatureConnector.dtype` is deprecated", "`TensorInfo.dtype` is deprecated")


def _is_tfds_dtype_notice(record) -> bool:
    """False for TFDS's `.dtype` deprecation notice (a `logging.Filter` callable: False drops the record)."""
    return not str(record.msg).startswith(_TFDS_DTYPE_NOTICES)


@contextlib.contextmanager
def _without_tfds_dtype_notices():
    """Drops TFDS's `.dtype` deprecation notices logged (through absl) while the body builds datasets."""
    absl_logger = logging.get_absl_logger()
    absl_logger.addFilter(_is_tfds_dtype_notice)
    try:
        yield
    finally:
        absl_logger.removeFilter(_is_tfds_dtype_notice)


def _as_dataset(dataset_builder, split, *, shuffle_files, read_config, decoders):
    with _without_tfds_dtype_notices():
        return _as_dataset_unfiltered(dataset_builder, split, shuffle_files=shuffle_files,
                                      read_config=read_config, decoders=decoders)


def _as_dataset_unfiltered(dataset_builder, split, *, shuffle_files, read_config, decoders):
    if not _is_array_record(dataset_builder):
        return dataset_builder.as_dataset(split=split, shuffle_files=shuffle_files, read_config=read_config,
                                          decoders=decoders)
    if split is None:
        return {name: _array_record_dataset(dataset_builder, name, shuffle_files=shuffle_files,
                                            read_config=read_config, decoders=decoders)
                for name in dataset_builder.info.splits.keys()}
    if isinstance(split, (list, tuple)):
        return [_array_record_dataset(dataset_builder, s, shuffle_files=shuffle_files, read_config=read_config,
                                      decoders=decoders) for s in split]
    return _array_record_dataset(dataset_builder, split, shuffle_files=shuffle_files, read_config=read_config,
                                 decoders=decoders)


def _array_record_dataset(dataset_builder, split, *, shuffle_files, read_config, decoders) -> tf.data.Dataset:
    """tf.data over array_record shards: raw records in file order, decoded by the dataset's features."""
    from array_record.python import array_record_module  # optional dependency, only for this format

    read_config = read_config or tfds.ReadConfig()
    instructions = [(os.fspath(fi.filename), int(fi.skip), int(fi.take))
                    for fi in dataset_builder.info.splits[split].file_instructions]
    seed = read_config.shuffle_seed

    def records() -> Iterable[bytes]:
        order = list(instructions)
        if shuffle_files:
            import random
            random.Random(seed).shuffle(order)
        for filename, skip, take in order:
            reader = array_record_module.ArrayRecordReader(filename)
            try:
                end = reader.num_records() if take < 0 else skip + take
                for start in range(skip, end, 256):  # bounded reads keep memory flat on big shards
                    yield from reader.read(list(range(start, min(start + 256, end))))
            finally:
                reader.close()

    serialized = tf.data.Dataset.from_generator(records, output_signature=tf.TensorSpec((), tf.string))
    cardinality = sum(take for _, _, take in instructions)
    serialized = serialized.apply(tf.data.experimental.assert_cardinality(cardinality))
    features = dataset_builder.info.features
    num_parallel = read_config.num_parallel_calls_for_decode or tf.data.AUTOTUNE
    dataset = serialized.map(lambda s: features.deserialize_example(s, decoders=decoders),
                             num_parallel_calls=num_parallel, deterministic=True)
    if not read_config.skip_prefetch:
        dataset = dataset.prefetch(tf.data.AUTOTUNE)
    return dataset


def load(name_or_dir: PathOrName, split: Any = None, *, data_dir: Optional[str] = None,
         shuffle_files: bool = False, read_config: Optional[tfds.ReadConfig] = None,
         decoders: Optional[dict] = None, validate: bool = True, recover: bool = False) -> Any:
    """Loads RLDS episodes; each episode's `steps` is a nested `tf.data.Dataset`, exactly as TFDS gives it.

    Args:
      name_or_dir: a TFDS name, a dataset directory, or a list of directories to merge.
      split: any TFDS split expression (`'train'`, `'train[:10%]+test'`, `'all'`, a list of them, a
        `tfds.core.ReadInstruction`); None returns `{split_name: dataset}`.
      data_dir: TFDS data dir for names.
      shuffle_files, read_config, decoders: passed to TFDS `as_dataset` (the array_record adapter honours
        `shuffle_files`, `read_config.shuffle_seed`, `num_parallel_calls_for_decode`, `skip_prefetch`).
      validate: check the features are RLDS and held by the records (see `builder`).
      recover: repair a crashed recording before reading (see `rlds_tf.recording.recover`).

    Returns:
      A `tf.data.Dataset` of episodes (or a dict/list of them, like TFDS).

    Raises:
      FileNotFoundError: missing directory.
      ValueError: not an RLDS dataset (names the missing field), or an unknown split (lists the known ones).
    """
    dataset_builder = builder(name_or_dir, data_dir=data_dir, validate=validate, recover=recover)
    _check_split(dataset_builder, split)
    return _as_dataset(dataset_builder, split, shuffle_files=shuffle_files, read_config=read_config,
                       decoders=decoders)


def load_stacked(name_or_dir: PathOrName, split: Any, *, data_dir: Optional[str] = None,
                 shuffle_files: bool = False, read_config: Optional[tfds.ReadConfig] = None,
                 validate: bool = True, recover: bool = False) -> tf.data.Dataset:
    """Episodes whose `steps` is a dict of `[T, ...]` tensors: same values as `load`, no nested datasets."""
    dataset_builder = builder(name_or_dir, data_dir=data_dir, validate=validate, recover=recover)
    return _stacked(dataset_builder, split, shuffle_files=shuffle_files, read_config=read_config,
                    decoder=StackedSteps(), caller="load_stacked")


def _stacked(dataset_builder, split, *, shuffle_files, read_config, decoder, caller) -> tf.data.Dataset:
    _check_split(dataset_builder, split)
    if isinstance(split, (list, tuple)) or split is None:
        raise ValueError(f"{caller} needs one split expression, got split={split!r}; join splits with '+'")
    return _as_dataset(dataset_builder, split, shuffle_files=shuffle_files, read_config=read_config,
                       decoders={rlds_types.STEPS: decoder})


def load_steps(name_or_dir: PathOrName, split: Any, *, batch_size: Optional[int] = None,
               drop_remainder: bool = False, data_dir: Optional[str] = None, shuffle_files: bool = False,
               read_config: Optional[tfds.ReadConfig] = None, validate: bool = True,
               recover: bool = False) -> tf.data.Dataset:
    """All steps of all episodes in order, as one flat dataset (`batch_size` set: batches of steps).

    Same elements as `load(...).flat_map(lambda e: e['steps'])` (then `.batch(batch_size)`), without building
    a nested dataset per episode. Images whose frames may differ in size (a `tfds.features.Image` of unknown
    height or width) are decoded step by step after unbatching, in a parallel map, since they cannot be
    stacked per episode.
    """
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size ({batch_size}) must be >= 1")
    dataset_builder = builder(name_or_dir, data_dir=data_dir, validate=validate, recover=recover)
    step_features = dataset_builder.info.features[rlds_types.STEPS].feature
    per_step = variable_size_images(step_features)
    episodes = _stacked(dataset_builder, split, shuffle_files=shuffle_files, read_config=read_config,
                        decoder=StackedSteps(keep_encoded=per_step), caller="load_steps")
    if not per_step:
        return stacked_to_steps(episodes, batch_size=batch_size, drop_remainder=drop_remainder)
    steps = episodes.map(lambda episode: episode[rlds_types.STEPS]).unbatch().map(
        lambda step: decode_step_fields(step_features, step, per_step), num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True)
    return steps if batch_size is None else steps.batch(batch_size, drop_remainder=drop_remainder)


def stacked_to_steps(episodes: tf.data.Dataset, *, batch_size: Optional[int] = None,
                     drop_remainder: bool = False) -> tf.data.Dataset:
    """Flattens episodes with stacked steps into a steps dataset (optionally re-batched to `batch_size`)."""
    stacked = episodes.map(lambda episode: episode[rlds_types.STEPS])
    if batch_size is None:
        return stacked.unbatch()
    if batch_size < 1:
        raise ValueError(f"batch_size ({batch_size}) must be >= 1")
    return stacked.rebatch(batch_size, drop_remainder=drop_remainder)

