"""A small Catch environment (`dm_env`), the same game as envlogger's testing one, for demos and tests.

A ball falls one row per step in a random column of a `rows x columns` board; the agent moves a paddle on the
bottom row (actions 0: left, 1: stay, 2: right). When the ball reaches the bottom row the episode terminates
with reward +1 if the paddle is under it, else -1. Each episode has `rows` timesteps (reset + rows-1 steps).
With the same seed it produces the same boards as envlogger's `catch_env.Catch`.

>>> env = Catch(seed=1)
>>> timestep = env.reset()
>>> timestep.observation.shape, int(timestep.observation.sum())
((10, 5), 2)
"""
from __future__ import annotations

import dm_env
import numpy as np
from dm_env import specs

_PADDLE_MOVES = (-1, 0, 1)  # action index -> paddle column change


class Catch(dm_env.Environment):
    """Catch on a `rows x columns` float32 board (1 where the ball or the paddle is)."""

    def __init__(self, rows: int = 10, columns: int = 5, seed: int = 1):
        if rows < 2 or columns < 1:
            raise ValueError(f"Catch needs rows >= 2 and columns >= 1, got rows={rows}, columns={columns}")
        self._rows, self._columns = rows, columns
        self._rng = np.random.RandomState(seed)
        self._board = np.zeros((rows, columns), dtype=np.float32)
        self._ball_x = self._ball_y = self._paddle_x = 0
        self._paddle_y = rows - 1
        self._reset_next_step = True

    def reset(self) -> dm_env.TimeStep:
        self._reset_next_step = False
        self._ball_x = self._rng.randint(self._columns)
        self._ball_y = 0
        self._paddle_x = self._columns // 2
        return dm_env.restart(self._observation())

    def step(self, action) -> dm_env.TimeStep:
        if self._reset_next_step:
            return self.reset()
        self._paddle_x = int(np.clip(self._paddle_x + _PADDLE_MOVES[int(action)], 0, self._columns - 1))
        self._ball_y += 1
        if self._ball_y == self._paddle_y:
            self._reset_next_step = True
            reward = 1.0 if self._paddle_x == self._ball_x else -1.0
            return dm_env.termination(reward=reward, observation=self._observation())
        return dm_env.transition(reward=0.0, observation=self._observation())

    def observation_spec(self) -> specs.BoundedArray:
        return specs.BoundedArray(shape=self._board.shape, dtype=self._board.dtype, name="board",
                                  minimum=0, maximum=1)

    def action_spec(self) -> specs.DiscreteArray:
        return specs.DiscreteArray(dtype=int, num_values=len(_PADDLE_MOVES), name="action")

    def _observation(self) -> np.ndarray:
        self._board.fill(0.0)
        self._board[self._ball_y, self._ball_x] = 1.0
        self._board[self._paddle_y, self._paddle_x] = 1.0
        return self._board.copy()
