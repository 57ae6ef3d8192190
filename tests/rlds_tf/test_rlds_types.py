"""Tests for the RLDS field constants, step/episode builders and the validity check."""
import doctest

import pytest
import tensorflow as tf

import rlds_tf as rlds
from rlds_tf import rlds_types


@pytest.mark.parametrize("name, value", [
    ("OBSERVATION", "observation"),
    ("ACTION", "action"),
    ("REWARD", "reward"),
    ("DISCOUNT", "discount"),
    ("IS_FIRST", "is_first"),
    ("IS_LAST", "is_last"),
    ("IS_TERMINAL", "is_terminal"),
    ("STEPS", "steps"),
    ("ALIGNMENT", "alignment"),
])
def test_constants_have_rlds_values(name, value):
    assert getattr(rlds, name) == value


def test_core_step_fields():
    assert rlds.CORE_STEP_FIELDS == frozenset(
        ["observation", "action", "reward", "discount", "is_first", "is_last", "is_terminal"])


@pytest.mark.parametrize("name, value", [
    ("EPISODE_ID", "episode_id"),
    ("AGENT_ID", "agent_id"),
    ("ENVIRONMENT_CONFIG", "environment_config"),
    ("EXPERIMENT_ID", "experiment_id"),
    ("INVALID", "invalid"),
])
def test_metadata_constants(name, value):
    assert getattr(rlds.metadata, name) == value


def test_transformations_is_reexported():
    from rlds_tf import transformations
    assert rlds.transformations is transformations


@pytest.mark.parametrize("kwargs, expected", [
    (dict(observation=1, action=2, reward=3.0, discount=1.0, is_terminal=False, is_first=True, is_last=False),
     {"observation": 1, "action": 2, "reward": 3.0, "discount": 1.0, "is_terminal": False, "is_first": True,
      "is_last": False}),
    # None fields are left out, except is_first / is_last.
    (dict(observation=None, action=None, reward=None, discount=None, is_terminal=None, is_first=None,
          is_last=None),
     {"is_first": None, "is_last": None}),
    (dict(observation=5, is_first=True, is_last=True, metadata={"t": 7}),
     {"observation": 5, "is_first": True, "is_last": True, "t": 7}),
    # rlds only rejects metadata that clashes with a key already in the step.
    (dict(is_first=True, is_last=False, metadata={"reward": 1.0}),
     {"is_first": True, "is_last": False, "reward": 1.0}),
])
def test_build_step(kwargs, expected):
    assert rlds.build_step(**kwargs) == expected


@pytest.mark.parametrize("kwargs, error", [
    (dict(is_first=True, is_last=False, metadata={"is_first": False}), "contains step key is_first"),
    (dict(observation=1, is_first=True, is_last=False, metadata={"observation": 2}),
     "contains step key observation"),
])
def test_build_step_errors(kwargs, error):
    with pytest.raises(ValueError, match=error):
        rlds.build_step(**kwargs)


def test_build_episode():
    assert rlds.build_episode([1, 2], {"episode_id": 3}) == {"steps": [1, 2], "episode_id": 3}
    assert rlds.build_episode([1], {}) == {"steps": [1]}
    with pytest.raises(ValueError, match=r"contains an episode key \(steps\)"):
        rlds.build_episode([1], {"steps": 2})


def _episodes(step_fields):
    steps = tf.data.Dataset.from_tensor_slices({k: [0, 1] for k in step_fields})
    return tf.data.Dataset.range(2).map(lambda _: {"steps": steps, "episode_id": 1})


@pytest.mark.parametrize("fields, valid, missing", [
    (sorted(rlds.CORE_STEP_FIELDS), True, []),
    (sorted(rlds.CORE_STEP_FIELDS) + ["extra"], True, []),
    (sorted(rlds.CORE_STEP_FIELDS - {"discount"}), False, ["steps/discount"]),
    (["observation"], False, ["steps/action", "steps/discount", "steps/is_first", "steps/is_last",
                              "steps/is_terminal", "steps/reward"]),
])
def test_is_valid_rlds_dataset(fields, valid, missing):
    ds = _episodes(fields)
    assert rlds.is_valid_rlds_dataset(ds) is valid
    assert rlds_types.missing_rlds_fields(ds.element_spec) == missing


def test_is_valid_rlds_dataset_without_steps():
    ds = tf.data.Dataset.from_tensor_slices({"observation": [1, 2]})
    assert rlds.is_valid_rlds_dataset(ds) is False
    assert rlds_types.missing_rlds_fields(ds.element_spec) == ["steps"]


def test_doctests():
    result = doctest.testmod(rlds_types)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.peer
def test_every_public_name_of_rlds_is_here(peer):
    import importlib  # noqa: PLC0415

    modules = ["rlds", "rlds.transformations", "rlds.tfds", "rlds.metadata"]
    out = peer.run("import importlib\nfor name in INPUTS['modules']:\n"
                   "    emit(name, sorted(n for n in dir(importlib.import_module(name)) if not n.startswith('_')))",
                   {"modules": modules})
    assert sorted(out) == sorted(modules) and "pattern_map" in out["rlds.transformations"]
    for name, names in out.items():
        ours = importlib.import_module("rlds_tf" + name[len("rlds"):])
        assert [n for n in names if not hasattr(ours, n)] == [], name
