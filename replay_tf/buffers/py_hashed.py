"""`PyHashedReplayBuffer` and `FrameBuffer`: TF-Agents' Python buffer that stores each frame of stacked
observations once.

With frame stacking, consecutive observations `[84, 84, 4]` share three of their four frames. The buffer
splits every observation along its last axis into frames, keeps each distinct frame once in a reference
counted `FrameBuffer`, and stores the frames' keys (int64, one per frame) in place of the observation.
Reads put the frames back together, so items come back exactly as added. Everything else (ring, sampling
with numpy's global generator, thread safety, checkpoints) is `PyUniformReplayBuffer`'s.

Differences from TF-Agents 0.19 (deliberate):
- Keys are a 64-bit BLAKE2 digest of the frame's bytes, and a key already held by other bytes moves on to
  the next free key (after a colliding frame is dropped, an equal frame may be stored twice: a missed
  deduplication, never a wrong frame). TF-Agents keys frames by Python's `hash(frame.tobytes())` and
  trusts it: two different frames with the same hash decode as the first one.
- The frame buffer is saved in checkpoints as numpy arrays (`np.savez`, pickle refused). TF-Agents pickles
  its dictionary, so its hashed-buffer checkpoints are refused here (unpickling a file can run any code);
  the rest of its checkpoint layout is the same.
- `gather_all` returns the items held, oldest first (`PyUniformReplayBuffer`'s); TF-Agents decodes every
  storage slot and fails with KeyError on slots never written.
- `data_spec` may be any namedtuple with an `observation` field (TF-Agents' `Trajectory`, or a user's own:
  tf_agents does not import on current TensorFlow).
"""
from __future__ import annotations

import hashlib
import io
import logging
from typing import Any, Iterable, Optional

import numpy as np
import tensorflow as tf

from replay_tf import specs
from replay_tf.buffers.py_uniform import PyUniformReplayBuffer

_PICKLE_PREFIX = b"\x80"    # every pickle protocol >= 2 starts with the PROTO opcode


def _wrap_int64(value: int) -> int:
    return (value + 2**63) % 2**64 - 2**63


class FrameBuffer(tf.train.experimental.PythonState):
    """Frames held once each, by key, with a count of the stored items that use them.

    Not thread-safe: `PyHashedReplayBuffer` calls it under its lock.

    >>> fb = FrameBuffer()
    >>> obs = np.stack([np.full([2, 2], v, np.uint8) for v in (1, 2, 2)], axis=-1)   # [2, 2, 3], 2 distinct
    >>> keys = fb.compress(obs)
    >>> keys.dtype.name, len(fb), bool((fb.decompress(keys) == obs).all())
    ('int64', 2, True)
    >>> fb.on_delete(keys)
    >>> len(fb)
    0
    """

    def __init__(self):
        self._frames: dict[int, tuple[np.ndarray, int]] = {}

    def add_frame(self, frame: np.ndarray) -> int:
        """Holds `frame` (or counts one more use of an equal one) and returns its key."""
        data = np.ascontiguousarray(frame).tobytes()
        key = int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little", signed=True)
        while key in self._frames:
            held, refcount = self._frames[key]
            if held.tobytes() == data:
                self._frames[key] = (held, refcount + 1)
                return key
            key = _wrap_int64(key + 1)      # another frame has this digest: probe the next key
        self._frames[key] = (np.array(frame, copy=True), 1)
        return key

    def __len__(self) -> int:
        return len(self._frames)

    def compress(self, observation: np.ndarray, split_axis: int = -1) -> np.ndarray:
        """The int64 keys of `observation`'s frames along `split_axis` (each frame keeps that axis, size 1)."""
        frames = np.split(observation, observation.shape[split_axis], split_axis)
        return np.array([self.add_frame(frame) for frame in frames], dtype=np.int64)

    def decompress(self, observation: Iterable[int], split_axis: int = -1) -> np.ndarray:
        """The observation whose frame keys are `observation`."""
        return np.concatenate([self._frames[int(key)][0] for key in observation], axis=split_axis)

    def on_delete(self, observation: Iterable[int], split_axis: int = -1) -> None:
        """One use fewer of each frame in `observation` (keys); frames no longer used are dropped."""
        del split_axis  # (TF-Agents' signature)
        for key in observation:
            key = int(key)
            frame, refcount = self._frames[key]
            if refcount > 1:
                self._frames[key] = (frame, refcount - 1)
            else:
                del self._frames[key]

    def clear(self) -> None:
        self._frames = {}

    def serialize(self) -> bytes:
        """Keys, reference counts and the stacked frames as `np.savez` bytes."""
        keys = list(self._frames)
        frames = [self._frames[key][0] for key in keys]
        out = io.BytesIO()
        np.savez(out, keys=np.array(keys, np.int64), refcounts=np.array([self._frames[k][1] for k in keys], np.int64),
                 frames=np.stack(frames) if frames else np.zeros([0]))
        return out.getvalue()

    def deserialize(self, string_value: bytes) -> None:
        """Restores what `serialize` wrote.

        Raises:
          ValueError: the value is a pickle (TF-Agents' format), which is never loaded.
        """
        if string_value[:1] == _PICKLE_PREFIX:
            raise ValueError("the checkpoint's frame buffer is a pickle (TF-Agents' PyHashedReplayBuffer format); "
                             "it is not loaded, because unpickling runs code from the file. Re-save the buffer "
                             "with replay_tf.PyHashedReplayBuffer, or restore the other leaves only")
        with np.load(io.BytesIO(string_value), allow_pickle=False) as saved:
            keys, refcounts, frames = saved["keys"], saved["refcounts"], saved["frames"]
        self._frames = {int(k): (frame, int(n)) for k, n, frame in zip(keys, refcounts, frames)}


class PyHashedReplayBuffer(PyUniformReplayBuffer):
    """`PyUniformReplayBuffer` that stores each distinct frame of the observations once.

    Args:
      data_spec: the spec of a trajectory: a namedtuple with an `observation` field holding one spec of
        rank >= 1, whose last axis stacks the frames.
      capacity: the most items held.
      log_interval: if set, logs the number of distinct frames held every `log_interval` items added.

    Raises:
      ValueError: `data_spec` is not a trajectory spec, or its observation is not one spec of rank >= 1.

    >>> import collections
    >>> Traj = collections.namedtuple("Traj", ["observation", "reward"])
    >>> rb = PyHashedReplayBuffer(Traj(tf.TensorSpec([2, 3], tf.uint8), tf.TensorSpec([], tf.float32)), 8)
    >>> for t in range(4):   # observation t stacks frames t, t+1, t+2
    ...     obs = np.stack([np.full([2], t + k, np.uint8) for k in range(3)], axis=-1)
    ...     rb.add_batch(Traj(obs[None], np.array([t], np.float32)))
    >>> len(rb.frame_buffer), rb.gather_all().observation[0, 3, 0].tolist()   # 12 frames added, 6 distinct
    (6, [3, 4, 5])
    """

    def __init__(self, data_spec: Any, capacity: int, log_interval: Optional[int] = None):
        if not (specs.is_namedtuple(data_spec) and "observation" in type(data_spec)._fields):
            raise ValueError(f"data_spec must be the spec of a trajectory: {data_spec}")
        observation = data_spec.observation
        if not hasattr(observation, "shape") or len(tf.TensorShape(observation.shape)) < 1:
            raise ValueError(f"data_spec.observation must be one spec of rank >= 1 whose last axis stacks frames, "
                             f"got {observation!r}")
        super().__init__(data_spec, capacity)
        self._frame_buffer = FrameBuffer()
        self._log_interval = log_interval

    @property
    def frame_buffer(self) -> FrameBuffer:
        """The frames held (`len()` is how many distinct ones)."""
        return self._frame_buffer

    def _encoded_data_spec(self) -> Any:
        observation = self._layout.data_spec.observation
        frames = tf.TensorShape(observation.shape)[-1]
        return self._layout.data_spec._replace(observation=tf.TensorSpec([frames], tf.int64))

    def _encode(self, traj: Any) -> Any:
        observation = self._frame_buffer.compress(traj.observation)
        if self._log_interval and self._item_count % self._log_interval == 0:
            logging.info("Effective Replay buffer frame count: %d", len(self._frame_buffer))
        return traj._replace(observation=observation)

    def _decode(self, encoded_trajectory: Any) -> Any:
        return encoded_trajectory._replace(observation=self._frame_buffer.decompress(encoded_trajectory.observation))

    def _on_delete(self, encoded_trajectory: Any) -> None:
        self._frame_buffer.on_delete(encoded_trajectory.observation)

    def _clear(self) -> None:
        self._frame_buffer.clear()
