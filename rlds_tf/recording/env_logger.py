"""`EnvLogger`: records what an agent does in an environment into an RLDS dataset (envlogger's API).

Wraps a `dm_env.Environment` (and then is one) or a `gymnasium.Env` (and then keeps gymnasium's
`reset`/`step` API). Every completed episode is on disk and listed when the step that ended it returns.

>>> import tempfile, numpy as np, rlds_tf as rlds
>>> from rlds_tf.recording.catch_env import Catch
>>> directory = tempfile.mkdtemp()
>>> with EnvLogger(Catch(), data_directory=directory) as env:
...     for _ in range(2):
...         timestep = env.reset()
...         while not timestep.last():
...             timestep = env.step(np.random.randint(3))
>>> [int(e['steps'].cardinality()) for e in rlds.load(directory, split='train')]
[10, 10]
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Optional

import dm_env
import numpy as np

from rlds_tf.recording.backend import StepData
from rlds_tf.recording.backend import TFDSBackendWriter

StepFn = Callable[[dm_env.TimeStep, Any, Any], Any]


def _is_gymnasium(env: Any) -> bool:
    try:
        import gymnasium
    except ImportError:
        return False
    return isinstance(env, gymnasium.Env) or (
        hasattr(env, "observation_space") and hasattr(env, "action_space") and not hasattr(env, "observation_spec"))


class EnvLogger:
    """Environment wrapper that records every step into a TFDS/RLDS dataset.

    Args:
      env: a `dm_env.Environment` or a `gymnasium.Env`.
      step_fn: `step_fn(timestep, action, env) -> dict | None`; a dict is merged into the RLDS step as step
        metadata (aligned with the step's observation, like envlogger).
      episode_fn: `episode_fn(timestep, action, env) -> dict | None`; called after reset and every step; the
        last non-None value before the episode ends becomes the episode metadata.
      metadata: dataset-level metadata (stored by the backend with `store_ds_metadata=True`).
      backend: a `TFDSBackendWriter` (or any object with `record_step`, `set_episode_metadata`, `close`), or a
        factory called with `backend_kwargs`; None builds a `TFDSBackendWriter` from `backend_kwargs`.
      show_progress: show a progress bar (episodes and steps recorded) on stderr.
      **backend_kwargs: `TFDSBackendWriter` arguments when `backend` is None or a factory (`data_directory`,
        `ds_config`, `split_name`, `max_episodes_per_file`, ...).
    """

    def __init__(self, env: Any, step_fn: Optional[StepFn] = None, episode_fn: Optional[StepFn] = None,
                 metadata: Optional[Mapping[str, Any]] = None, backend: Any = None, *,
                 show_progress: bool = False, **backend_kwargs):
        self._env = env
        self._gym = _is_gymnasium(env)
        self._step_fn = step_fn
        self._episode_fn = episode_fn
        if backend is None:
            if "data_directory" not in backend_kwargs:
                raise ValueError("EnvLogger needs a backend or a data_directory: pass "
                                 "backend=TFDSBackendWriter(data_directory, ...) or data_directory=...")
            backend = TFDSBackendWriter(**backend_kwargs, metadata=metadata)
        elif not hasattr(backend, "record_step"):
            backend = backend(**backend_kwargs, metadata=metadata)
        elif backend_kwargs:
            raise ValueError(f"backend_kwargs {sorted(backend_kwargs)} are only used when backend is None or a "
                             f"factory; pass them to the backend instead")
        self._backend = backend
        if hasattr(backend, "bind_environment"):
            backend.bind_environment(env, metadata)
        self._end_if_last = getattr(backend, "end_episode_if_last", None)
        self._reset_next_step = True
        self._progress = None
        if show_progress:
            import tqdm
            self._progress = tqdm.tqdm(unit=" steps", desc="recording", mininterval=0.5)
        self._episodes = 0
        self._closed = False

    # -- recording core ----------------------------------------------------------------------------------

    def _record(self, timestep: dm_env.TimeStep, action: Any, is_new_episode: bool) -> None:
        custom = self._step_fn(timestep, action, self._env) if self._step_fn is not None else None
        self._backend.record_step(StepData(timestep, action, custom), is_new_episode)
        if self._episode_fn is not None:
            episode_metadata = self._episode_fn(timestep, action, self._env)
            if episode_metadata is not None:
                self._backend.set_episode_metadata(episode_metadata)
        if timestep.step_type == dm_env.StepType.LAST:
            if self._end_if_last is not None:
                self._end_if_last()
            self._episodes += 1
            if self._progress is not None:
                self._progress.set_postfix(episodes=self._episodes, refresh=False)
        if self._progress is not None:
            self._progress.update()

    # -- dm_env API --------------------------------------------------------------------------------------

    def reset(self, *args, **kwargs):
        """dm_env: returns the first TimeStep. gymnasium: returns `(observation, info)`."""
        self._reset_next_step = False
        if self._gym:
            observation, info = self._env.reset(*args, **kwargs)
            self._record(dm_env.restart(observation), None, True)
            return observation, info
        timestep = self._env.reset()
        self._record(timestep, None, True)
        return timestep

    def step(self, action):
        """dm_env: returns a TimeStep. gymnasium: returns `(obs, reward, terminated, truncated, info)`."""
        if self._gym:
            if self._reset_next_step:
                raise RuntimeError("the episode is over: call reset() before step() (gymnasium API)")
            observation, reward, terminated, truncated, info = self._env.step(action)
            reward64 = np.float64(reward)
            if terminated:
                timestep = dm_env.termination(reward64, observation)
            elif truncated:
                timestep = dm_env.truncation(reward64, observation, np.float64(1.0))
            else:
                timestep = dm_env.transition(reward64, observation, np.float64(1.0))
            self._reset_next_step = bool(terminated or truncated)
            self._record(timestep, action, False)
            return observation, reward, terminated, truncated, info
        if self._reset_next_step:
            return self.reset()
        timestep = self._env.step(action)
        self._reset_next_step = timestep.step_type == dm_env.StepType.LAST
        self._record(timestep, action, False)
        return timestep

    def observation_spec(self):
        return self._env.observation_spec()

    def action_spec(self):
        return self._env.action_spec()

    def reward_spec(self):
        return self._env.reward_spec()

    def discount_spec(self):
        return self._env.discount_spec()

    @property
    def environment(self) -> Any:
        return self._env

    @property
    def backend(self) -> Any:
        return self._backend

    def __getattr__(self, name: str) -> Any:
        # Everything else (gymnasium spaces, render, custom methods) comes from the wrapped env.
        if name.startswith("__") or name in ("_env",):
            raise AttributeError(name)
        return getattr(self._env, name)

    def close(self) -> None:
        """Writes the open episode, finalizes the dataset, and closes the environment."""
        if self._closed:
            return
        self._closed = True
        try:
            self._backend.close()
        finally:
            if self._progress is not None:
                self._progress.close()
            close = getattr(self._env, "close", None)
            if close is not None:
                close()

    def __enter__(self) -> "EnvLogger":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
