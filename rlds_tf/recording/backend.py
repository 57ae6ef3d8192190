"""`TFDSBackendWriter`: envlogger's TFDS backend, as a durable RLDS recorder on `tfds.core.SequentialWriter`.

It receives dm_env steps (`StepData(timestep, action, custom_data)`) and stores RLDS steps, shifted the
way envlogger/RLDS do it: RLDS step i holds (o_i, a_i, r_i, d_i, m_i), where a_i is the action taken on o_i
and r_i, d_i what it produced; the last step holds the final observation with zeroed action, reward and
discount; `is_terminal` = last and discount == 0 (a truncated episode ends with `is_terminal` False).
"""
from __future__ import annotations

from typing import Any, Mapping, NamedTuple, Optional

import dm_env
import numpy as np
import tree

from rlds_tf import rlds_types
from rlds_tf.recording import config as config_lib
from rlds_tf.recording import tfds_writer

DatasetConfig = tfds_writer.DatasetConfig


class StepData(NamedTuple):
    """What the recorder sees per environment step (envlogger's `StepData`)."""
    timestep: dm_env.TimeStep
    action: Any
    custom_data: Any = None


def _zeros_like(value: Any, fallback: Any) -> Any:
    """Zeros for the invalid fields of the last step: typed like the dataset feature when it is known."""
    if fallback is not None or value is None:
        return fallback
    # Python scalars stay Python scalars so that the feature's dtype decides (np.zeros_like(0) is int64).
    return tree.map_structure(
        lambda x: np.zeros_like(x) if isinstance(x, (np.ndarray, np.generic)) else type(x)(0), value)


def to_rlds_step(prev_step: StepData, step: Optional[StepData], *,
                 zero_fields: Optional[Mapping[str, Any]] = None) -> dict:
    """The RLDS step of `prev_step`'s observation: the action taken on it and what that action produced.

    `step` is the environment step that followed (`None` for the final observation, whose action, reward
    and discount are invalid and stored as zeros: `zero_fields[field]` where given, else zeros like the
    previous values). The dict `prev_step.custom_data` is merged in (the step metadata).

    >>> first = StepData(dm_env.restart(np.float32(1.5)), None)
    >>> second = StepData(dm_env.termination(reward=1.0, observation=np.float32(2.5)), np.int64(2))
    >>> step = to_rlds_step(first, second)
    >>> step['observation'], step['action'], step['reward'], step['is_first'], step['is_terminal']
    (np.float32(1.5), np.int64(2), 1.0, True, False)
    >>> last = to_rlds_step(second, None)
    >>> last['observation'], int(last['action']), last['reward'], last['is_last'], last['is_terminal']
    (np.float32(2.5), 0, 0.0, True, True)
    """
    zero_fields = zero_fields or {}
    ts = prev_step.timestep
    rlds_step = {
        rlds_types.OBSERVATION: ts.observation,
        rlds_types.IS_FIRST: ts.step_type == dm_env.StepType.FIRST,
        rlds_types.IS_LAST: ts.step_type == dm_env.StepType.LAST,
        rlds_types.IS_TERMINAL: ts.step_type == dm_env.StepType.LAST and ts.discount == 0.0,
    }
    if step is not None:
        rlds_step[rlds_types.ACTION] = step.action
        rlds_step[rlds_types.REWARD] = step.timestep.reward
        rlds_step[rlds_types.DISCOUNT] = step.timestep.discount
    else:  # the final observation: action/reward/discount are invalid and stored as zeros
        rlds_step[rlds_types.ACTION] = _zeros_like(prev_step.action, zero_fields.get(rlds_types.ACTION))
        rlds_step[rlds_types.REWARD] = _zeros_like(ts.reward, zero_fields.get(rlds_types.REWARD))
        rlds_step[rlds_types.DISCOUNT] = _zeros_like(ts.discount, zero_fields.get(rlds_types.DISCOUNT))
    if isinstance(prev_step.custom_data, dict):
        rlds_step.update(prev_step.custom_data)
    return rlds_step


class TFDSBackendWriter:
    """Writes recorded episodes as an RLDS dataset in TFDS format (envlogger's `TFDSBackendWriter` API).

    Args:
      data_directory: the dataset directory (created if missing); load it with `rlds_tf.load(data_directory)`
        or `tfds.builder_from_directory(data_directory)`.
      ds_config: the `tfds.rlds.rlds_base.DatasetConfig`; None infers it from the environment's specs (when
        used by `EnvLogger`) and the first episode's step/episode metadata.
      max_episodes_per_file: episodes per shard file.
      split_name: the split to write (None: `'train'`).
      version: dataset version.
      store_ds_metadata: store the recorder's dataset metadata as `metadata.json`.
      metadata: dataset-level metadata (envlogger passes it through `**base_kwargs`).
      file_format: `'tfrecord'` (default; crash safe per episode) or `'array_record'`.
      overwrite: False appends to an existing dataset in `data_directory`.
      name: dataset name used when `ds_config` is inferred.
    """

    def __init__(self, data_directory: str, ds_config: Optional[DatasetConfig] = None,
                 max_episodes_per_file: int = 1000, split_name: Optional[str] = None, version: str = "0.0.1",
                 store_ds_metadata: bool = False, *, metadata: Optional[Mapping[str, Any]] = None,
                 file_format: str = "tfrecord", overwrite: bool = True, name: str = "rlds_dataset"):
        self._data_directory = data_directory
        self._ds_config = ds_config
        self._writer_kwargs = dict(split_names=[split_name or "train"], max_episodes_per_file=max_episodes_per_file,
                                   version=version, file_format=file_format, overwrite=overwrite)
        self._store_ds_metadata = store_ds_metadata
        self._metadata = dict(metadata or {})
        self._name = name
        self._env = None
        self._writer: Optional[tfds_writer.DatasetWriter] = None
        self._pending: list[dict] = []  # steps of the first episode while the config is still being inferred
        self._prev: Optional[StepData] = None
        self._episode_metadata: Optional[Mapping[str, Any]] = None
        self._zero_fields: dict[str, Any] = {}
        self._closed = False
        if ds_config is not None:
            self._open_writer(ds_config)

    # -- setup -------------------------------------------------------------------------------------------

    def bind_environment(self, env: Any, metadata: Optional[Mapping[str, Any]] = None) -> None:
        """Called by `EnvLogger`: the env whose specs infer the config, and the session metadata."""
        self._env = env
        if metadata:
            self._metadata.update(metadata)

    @property
    def metadata(self) -> dict:
        return self._metadata

    @property
    def data_directory(self) -> str:
        return self._data_directory

    @property
    def num_episodes(self) -> int:
        return self._writer.num_episodes if self._writer is not None else 0

    def _open_writer(self, ds_config: DatasetConfig) -> None:
        ds_metadata = self._metadata if self._store_ds_metadata else None
        self._writer = tfds_writer.DatasetWriter(self._data_directory, ds_config, ds_metadata=ds_metadata,
                                                 **self._writer_kwargs)
        steps = self._writer.ds_info.features[rlds_types.STEPS].feature
        for field in (rlds_types.ACTION, rlds_types.REWARD, rlds_types.DISCOUNT):
            if field in steps:
                self._zero_fields[field] = _zeros_for(steps[field])

    def _infer_config(self, first_step: Mapping[str, Any], episode_metadata: Mapping[str, Any]) -> DatasetConfig:
        step_metadata = {k: v for k, v in first_step.items() if k not in rlds_types.CORE_STEP_FIELDS}
        if self._env is not None:
            return config_lib.config_from_env(self._env, name=self._name, step_metadata_sample=step_metadata,
                                              episode_metadata_sample=episode_metadata)
        return config_lib.config_from_specs(
            name=self._name, observation_spec=config_lib.sample_spec(first_step[rlds_types.OBSERVATION]),
            action_spec=config_lib.sample_spec(first_step[rlds_types.ACTION]),
            reward_spec=config_lib.sample_spec(first_step[rlds_types.REWARD]),
            discount_spec=config_lib.sample_spec(first_step[rlds_types.DISCOUNT]),
            step_metadata_sample=step_metadata, episode_metadata_sample=episode_metadata)

    # -- recording ---------------------------------------------------------------------------------------

    def _add(self, step: dict) -> None:
        if self._writer is None:
            self._pending.append(step)
        else:
            self._writer.add_step(step)

    def _rlds_step(self, prev: StepData, cur: Optional[StepData]) -> dict:
        return to_rlds_step(prev, cur, zero_fields=self._zero_fields)

    def record_step(self, data: StepData, is_new_episode: bool) -> None:
        """Records one dm_env step; `is_new_episode` marks the reset step."""
        if self._closed:
            raise ValueError(f"the recorder of {self._data_directory!r} is closed")
        if is_new_episode:
            self._write_episode()
            self._prev = data
            return
        if self._prev is None:
            raise ValueError("record_step(is_new_episode=False) before any new episode: reset the env first")
        prev, self._prev = self._prev, data
        try:
            self._add(self._rlds_step(prev, data))
        except Exception:
            self._abandon_episode()
            raise

    def set_episode_metadata(self, data: Any) -> None:
        """Sets the open episode's metadata (the last value set before the episode is written wins)."""
        if self._prev is None:
            raise ValueError("set_episode_metadata() needs an open episode: reset the env first")
        self._episode_metadata = data

    def end_episode_if_last(self) -> None:
        """Writes the open episode now if its last step was recorded (EnvLogger calls it after each step)."""
        if self._prev is not None and self._prev.timestep.step_type == dm_env.StepType.LAST:
            self._write_episode()

    def _abandon_episode(self) -> None:
        self._prev = None
        self._episode_metadata = None
        self._pending = []
        if self._writer is not None:
            self._writer.discard_episode()

    def _write_episode(self) -> None:
        """Adds the final step (o_T, zeros) and writes the episode; a no-op when none is open."""
        if self._prev is None:
            return
        prev, self._prev = self._prev, None
        metadata, self._episode_metadata = self._episode_metadata, None
        metadata = metadata if isinstance(metadata, dict) else {}
        try:
            self._add(self._rlds_step(prev, None))
            if self._writer is None:
                self._open_writer(self._infer_config(self._pending[0], metadata))
                pending, self._pending = self._pending, []
                for step in pending:
                    self._writer.add_step(step)
            self._writer.end_episode(metadata)
        except Exception:
            self._abandon_episode()
            raise

    def close(self) -> None:
        """Writes the open episode (like envlogger) and finalizes the dataset."""
        if self._closed:
            return
        try:
            self._write_episode()
        finally:
            self._closed = True
            if self._writer is not None:
                self._writer.close()

    def __del__(self):
        try:
            if not self._closed and self._writer is not None:
                self._writer.close()
        except Exception:  # pylint: disable=broad-except  (interpreter shutdown)
            pass


def _zeros_for(feature: Any) -> Any:
    """Zeros matching a TFDS feature (used when a one-step episode has no action to copy the type from)."""
    import tensorflow_datasets as tfds

    if isinstance(feature, tfds.features.FeaturesDict):
        return {k: _zeros_for(v) for k, v in feature.items()}
    return np.zeros(feature.shape, dtype=feature.np_dtype)
