"""rlds 0.1.8 itself on current TF, importing replay_tf as its `reverb`, against rlds_tf on the same episodes.

Used by reverb_adapters.py (`--rlds`): each check calls one of rlds's transformations and rlds_tf's of the
same name with the same arguments (by keyword, so the argument names are checked too) on the recording of
recorded_episodes.py, read by TFDS, and compares the results element by element; where the value is easy
to state, it is also compared with the value computed by hand from recorded_episodes.expected_steps().
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

import recorded_episodes


def _episodes(data_dir: str) -> tf.data.Dataset:
    import tensorflow_datasets as tfds
    return tfds.builder_from_directory(data_dir).as_dataset(split="train")


def _numpy(value):
    """Datasets (also nested ones) as lists, tensors as numpy: a plain nest to compare."""
    if isinstance(value, tf.data.Dataset):
        return [_numpy(v) for v in value]
    if isinstance(value, dict):
        return {k: _numpy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_numpy(v) for v in value)
    if isinstance(value, (tf.Tensor, tf.Variable)):
        return value.numpy()
    return value


def _assert_same(got, want, path="<root>"):
    if isinstance(want, dict):
        assert isinstance(got, dict) and sorted(got) == sorted(want), f"{path}: keys {got} != {want}"
        for k in want:
            _assert_same(got[k], want[k], f"{path}/{k}")
    elif isinstance(want, (list, tuple)):
        assert isinstance(got, (list, tuple)) and len(got) == len(want), f"{path}: {got} != {want}"
        for i, (g, w) in enumerate(zip(got, want)):
            _assert_same(g, w, f"{path}/{i}")
    else:
        g, w = np.asarray(got), np.asarray(want)
        assert g.dtype == w.dtype and g.shape == w.shape, f"{path}: {g.dtype}{g.shape} != {w.dtype}{w.shape}"
        np.testing.assert_allclose(g, w, rtol=1e-6, err_msg=path) if w.dtype.kind == "f" else \
            np.testing.assert_array_equal(g, w, err_msg=path)


def _both(data_dir: str, call):
    """`call(module, episodes)` with rlds 0.1.8 and with rlds_tf, results compared; rlds's result returned."""
    import rlds
    import rlds_tf
    theirs = _numpy(call(rlds, _episodes(data_dir)))
    ours = _numpy(call(rlds_tf, _episodes(data_dir)))
    _assert_same(ours, theirs)
    return theirs


def _steps(episodes):
    return episodes.flat_map(lambda e: e["steps"])


def check_rlds_imports_on_replay_tf(data_dir: str):
    import replay_tf
    import rlds
    assert rlds.transformations.pattern.reverb is replay_tf
    assert rlds.rlds_types.is_valid_rlds_dataset(_episodes(data_dir))


def check_rlds_episode_length_and_final_step(data_dir: str):
    lengths = _both(data_dir, lambda m, eps: eps.map(
        lambda e: m.transformations.episode_length(steps_dataset=e["steps"])))
    assert [int(n) for n in lengths] == [len(e) for e in recorded_episodes.expected_steps()] == [4, 3], lengths
    finals = _both(data_dir, lambda m, eps: eps.map(lambda e: m.transformations.final_step(steps_dataset=e["steps"])))
    assert [f["observation"].tolist() for f in finals] == [[0, 3], [1, 2]], finals


def check_rlds_sum_and_map(data_dir: str):
    total = _both(data_dir, lambda m, eps: m.transformations.sum_dataset(
        steps_dataset=_steps(eps), data_to_sum=lambda s: s["reward"]))
    want = sum(float(s["reward"]) for e in recorded_episodes.expected_steps() for s in e)
    assert float(total) == want == 1 + 2 + 3 + 11 + 12, total
    _both(data_dir, lambda m, eps: m.transformations.sum_nested_steps(
        episodes_dataset=eps, data_to_sum=lambda s: {"r": s["reward"], "a": s["action"]}))
    _both(data_dir, lambda m, eps: m.transformations.map_nested_steps(
        episodes_dataset=eps, transform_step=lambda s: {"r2": s["reward"] * 2, "first": s["is_first"]}))
    _both(data_dir, lambda m, eps: m.transformations.map_steps(
        steps_dataset=_steps(eps), transform_step=lambda s: s["observation"] + 1.0, optimization_batch_size=2))
    _both(data_dir, lambda m, eps: m.transformations.apply_nested_steps(
        episodes_dataset=eps, transform_step_dataset=lambda steps: steps.skip(1)))


def check_rlds_batch_and_alignment(data_dir: str):
    for size, shift, stride, drop in ((2, 1, 1, True), (3, 2, 1, False), (2, 1, 2, True)):
        _both(data_dir, lambda m, eps: m.transformations.batch(
            dataset=_steps(eps), size=size, shift=shift, stride=stride, drop_remainder=drop))
    shifted = _both(data_dir, lambda m, eps: eps.map(lambda e: {"steps": m.transformations.shift_keys(
        steps=e["steps"], keys=["reward"], shift=1, batch_size=2)}))
    assert [len(e["steps"]) for e in shifted] == [3, 2], shifted


def check_rlds_concat_and_truncate(data_dir: str):
    def extra(step):
        return tf.data.Dataset.from_tensors({**step, "reward": tf.constant(-1.0)})
    _both(data_dir, lambda m, eps: eps.map(lambda e: {"steps": m.transformations.concat_if_terminal(
        steps=e["steps"], make_extra_steps=extra)}))
    _both(data_dir, lambda m, eps: m.transformations.concatenate(
        steps1=_steps(eps), steps2=tf.data.Dataset.from_tensors({"is_first": True, "extra": 1})))
    truncated = _both(data_dir, lambda m, eps: eps.map(lambda e: {"steps": m.transformations.truncate_after_condition(
        steps_dataset=e["steps"], truncate_condition=lambda s: s["reward"] >= 2.0)}))
    assert [len(e["steps"]) for e in truncated] == [2, 1], truncated


def check_rlds_mean_and_std(data_dir: str):
    _both(data_dir, lambda m, eps: m.transformations.mean_and_std(
        episodes_dataset=eps, get_step_fields=m.transformations.sar_fields_mask))


def check_rlds_pattern_map_from_transform(data_dir: str):
    def transform(ref):
        return {"observation": ref["observation"][-2], "next_observation": ref["observation"][-1],
                "reward": ref["reward"][-2]}
    items = _both(data_dir, lambda m, eps: m.transformations.pattern_map_from_transform(
        episodes_dataset=eps, transform_fn=transform, respect_episode_boundaries=True))
    # Transitions within each episode: observations (t, t + 1) with the reward of t.
    want = [(s[t]["observation"].tolist(), s[t + 1]["observation"].tolist(), float(s[t]["reward"]))
            for s in recorded_episodes.expected_steps() for t in range(len(s) - 1)]
    got = [(i["observation"].tolist(), i["next_observation"].tolist(), float(i["reward"])) for i in items]
    assert got == want, got


CHECKS = {name: fn for name, fn in globals().items() if name.startswith("check_")}
CHECKS = {name[len("check_"):]: fn for name, fn in CHECKS.items()}
