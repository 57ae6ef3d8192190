"""RLDS field names, step/episode types and builders, and the dataset validity check.

Values match `rlds` 0.1.8 exactly, so `import rlds_tf as rlds` works for code written against rlds.

>>> build_step(observation=1, action=0, reward=0.5, discount=1.0, is_terminal=False,
...            is_first=True, is_last=False)['reward']
0.5
>>> sorted(build_episode(steps=[], metadata={'episode_id': 3}))
['episode_id', 'steps']
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional

import tensorflow as tf

OBSERVATION = "observation"
ACTION = "action"
REWARD = "reward"
DISCOUNT = "discount"
IS_FIRST = "is_first"
IS_LAST = "is_last"
IS_TERMINAL = "is_terminal"
STEPS = "steps"
ALIGNMENT = "alignment"

CORE_STEP_FIELDS = frozenset([OBSERVATION, ACTION, REWARD, IS_TERMINAL, IS_FIRST, IS_LAST, DISCOUNT])

Step = Dict[str, Any]
Episode = Dict[str, Any]
BatchedStep = Step
BatchedEpisode = Episode

StepFilterFn = Callable[[Step], bool]
EpisodeFilterFn = Callable[[Episode], bool]
StepsToStepsFn = Callable[[tf.data.Dataset], tf.data.Dataset]
StepMapFn = Callable[[Step], Step]


def build_step(observation: Optional[Any] = None,
               action: Optional[Any] = None,
               reward: Optional[Any] = None,
               discount: Optional[Any] = None,
               is_terminal: Optional[Any] = None,
               is_first: Optional[Any] = None,
               is_last: Optional[Any] = None,
               metadata: Optional[Dict[str, Any]] = None) -> Step:
    """Builds an RLDS step dict.

    Fields given as `None` are left out, except `is_first` and `is_last`, which are always present. With
    `is_terminal=True` the action, reward and discount have no meaning; with `is_last=True` they are invalid;
    an episode whose last step has `is_terminal=False` was truncated.

    Args:
      observation, action, reward, discount, is_terminal, is_first, is_last: the step's core fields.
      metadata: extra step fields merged into the step.

    Returns:
      The step dict.

    Raises:
      ValueError: a metadata key is also a field of the step.

    >>> step = build_step(observation=[1.0], is_first=True, is_last=False, metadata={'t': 3})
    >>> sorted(step)
    ['is_first', 'is_last', 'observation', 't']
    """
    step: Step = {IS_FIRST: is_first, IS_LAST: is_last}
    for key, value in ((OBSERVATION, observation), (ACTION, action), (REWARD, reward),
                       (DISCOUNT, discount), (IS_TERMINAL, is_terminal)):
        if value is not None:
            step[key] = value
    for key, value in (metadata or {}).items():
        # Like rlds: only keys already in the step clash (is_first/is_last always; the others when given).
        if key in step:
            raise ValueError(f"Invalid Step Metadata: it contains step key {key} "
                             f"(metadata keys must differ from the step fields {sorted(step)})")
        step[key] = value
    return step


def build_episode(steps: Any, metadata: Optional[Dict[str, Any]] = None) -> Episode:
    """Builds an RLDS episode dict: `{'steps': steps, **metadata}`.

    Args:
      steps: the steps (a `tf.data.Dataset`, a list of steps, or a dict of stacked step fields).
      metadata: episode-level fields.

    Raises:
      ValueError: `metadata` contains the key `'steps'`.

    >>> build_episode([1, 2], {'episode_id': 7})
    {'steps': [1, 2], 'episode_id': 7}
    """
    metadata = dict(metadata or {})
    if STEPS in metadata:
        raise ValueError(f"Invalid Episode Metadata: it contains an episode key ({STEPS}); "
                         f"rename that metadata field")
    return {STEPS: steps, **metadata}


def missing_rlds_fields(episode_spec_or_element: Any) -> list[str]:
    """Names the RLDS fields an episode (or its element_spec) lacks; `[]` when it is valid.

    Paths are `'steps'` or `'steps/<field>'`.
    """
    if not isinstance(episode_spec_or_element, dict):
        return [STEPS]
    if STEPS not in episode_spec_or_element:
        return [STEPS]
    steps = episode_spec_or_element[STEPS]
    if isinstance(steps, tf.data.DatasetSpec):
        steps = steps.element_spec
    elif isinstance(steps, tf.data.Dataset):
        steps = steps.element_spec
    if not isinstance(steps, dict):
        return [f"{STEPS}/{field}" for field in sorted(CORE_STEP_FIELDS)]
    return [f"{STEPS}/{field}" for field in sorted(CORE_STEP_FIELDS - set(steps))]


def is_valid_rlds_dataset(dataset: tf.data.Dataset) -> bool:
    """True when the episodes carry `steps` and every step holds all of `CORE_STEP_FIELDS`.

    Like rlds, it looks at the structure of the episodes (here their `element_spec`, so nothing is read).

    >>> steps = tf.data.Dataset.from_tensor_slices(build_step(
    ...     observation=[0, 1], action=[0, 1], reward=[0., 1.], discount=[1., 1.],
    ...     is_terminal=[False, True], is_first=[True, False], is_last=[False, True]))
    >>> is_valid_rlds_dataset(tf.data.Dataset.from_tensors(0).map(lambda _: {STEPS: steps}))
    True
    """
    return not missing_rlds_fields(dataset.element_spec)
