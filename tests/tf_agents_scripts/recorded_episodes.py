"""A small recording made with rlds_tf.EnvLogger, and what TF-Agents' rlds_to_reverb makes of it, by hand.

`Counter` is a dm_env environment whose observation is [episode, t]; episode 0 has 3 transitions and ends
in a termination, episode 1 has 2 and ends in a truncation. Actions are 100 * episode + t, rewards
10 * episode + t (for the transition into t), discounts 0.5, except 0 at a termination and 1 at a truncation.
"""
from __future__ import annotations

import dm_env
import numpy as np
import tensorflow as tf
from dm_env import specs

LENGTHS = (3, 2)
TERMINAL = (True, False)
FIRST, MID, LAST = 0, 1, 2


class Counter(dm_env.Environment):
    def __init__(self):
        self._episode = -1
        self._t = 0

    def reset(self):
        self._episode += 1
        self._t = 0
        return dm_env.restart(self._observation())

    def _observation(self):
        return np.array([self._episode, self._t], np.float32)

    def step(self, action):
        assert int(action) == 100 * self._episode + self._t, action
        self._t += 1
        reward = np.float32(10 * self._episode + self._t)
        if self._t == LENGTHS[self._episode]:
            if TERMINAL[self._episode]:
                return dm_env.termination(reward, self._observation())
            return dm_env.truncation(reward, self._observation(), np.float32(1.0))
        return dm_env.transition(reward, self._observation(), np.float32(0.5))

    def observation_spec(self):
        return specs.Array((2,), np.float32, "observation")

    def action_spec(self):
        return specs.Array((), np.int64, "action")

    def reward_spec(self):
        return specs.Array((), np.float32, "reward")

    def discount_spec(self):
        return specs.BoundedArray((), np.float32, 0.0, 1.0, "discount")


def record(data_dir: str) -> None:
    """Records both episodes of `Counter` into `data_dir` (a TFDS/RLDS directory) with rlds_tf.EnvLogger."""
    import rlds_tf
    with rlds_tf.EnvLogger(Counter(), data_directory=data_dir) as env:
        for e in range(len(LENGTHS)):
            timestep = env.reset()
            t = 0
            while not timestep.last():
                timestep = env.step(np.int64(100 * e + t))
                t += 1


def expected_steps() -> list:
    """The recording's RLDS steps, episode by episode (envlogger's alignment: step t holds the action taken
    at t and the reward and discount that followed; the last step's are zeros)."""
    episodes = []
    for e, (n, terminal) in enumerate(zip(LENGTHS, TERMINAL)):
        steps = []
        for t in range(n + 1):
            last = t == n
            discount = 0.0 if last else (0.0 if (t + 1 == n and terminal) else (1.0 if t + 1 == n else 0.5))
            steps.append({"observation": np.array([e, t], np.float32),
                          "action": np.int64(0 if last else 100 * e + t),
                          "reward": np.float32(0 if last else 10 * e + t + 1),
                          "discount": np.float32(discount), "is_first": t == 0, "is_last": last,
                          "is_terminal": last and terminal})
        episodes.append(steps)
    return episodes


def trajectory_spec():
    """TF-Agents' `Trajectory` spec of the recording, as `rlds_to_reverb.create_trajectory_data_spec` makes it."""
    from tf_agents.trajectories import policy_step, time_step, trajectory
    step = time_step.time_step_spec(tf.TensorSpec([2], tf.float32), tf.TensorSpec([], tf.float32))
    return trajectory.from_transition(step, policy_step.PolicyStep(tf.TensorSpec([], tf.int64)), step)


def expected_trajectories() -> list:
    """What `rlds_to_reverb.convert_rlds_to_trajectories` gives: one trajectory per step, paired with the next
    step (the last step of all with an added first step); step types from the flags; discount 0 on a
    terminal last step."""
    from tf_agents.trajectories import trajectory
    steps = [s for episode in expected_steps() for s in episode]
    def step_type(step):
        return FIRST if step["is_first"] else LAST if step["is_last"] else MID
    result = []
    for i, step in enumerate(steps):
        next_type = step_type(steps[i + 1]) if i + 1 < len(steps) else FIRST
        discount = 0.0 if (step["is_last"] and step["is_terminal"]) else step["discount"]
        result.append(trajectory.Trajectory(
            step_type=np.int32(step_type(step)), observation=step["observation"], action=step["action"],
            policy_info=(), next_step_type=np.int32(next_type), reward=step["reward"],
            discount=np.float32(discount)))
    return result
