"""Every `rlds_tf.transformations` function and `replay_tf.PatternDataset` inside traced code.

The cases and contexts (`flat_map`, `interleave`, `map`, `tf.function`, a `flat_map` AutoGraph leaves
alone, and for functions of an episodes dataset the whole dataset eagerly and in a `tf.function`) live in
`traced_cases.py`, which runs unchanged here and, with rlds 0.1.8 and dm-reverb 0.14, in the peer venv: one
peer process computes every expectation, while this process computes ours. Elements are compared one by
one, leaf by leaf, dtypes and shapes included.

Where the anchors cannot do the same thing (`_PEER_FAILS`: they raise; `_PEER_WRONG`: they give wrong
items), the peer tests assert that they still do, and `test_matches_hand_computed` checks ours against
values computed here with numpy and against ours run eagerly. That test needs no peer, so the traced
behaviour is checked without one too.
"""
import functools
import importlib.util
import inspect
import pathlib
import re
import threading

import numpy as np
import pytest
import tensorflow as tf

import replay_tf
import rlds_tf
import episodes_testlib
from dataset_testlib import flatten_with_paths


def _load_cases():
    spec = importlib.util.spec_from_file_location("traced_cases", pathlib.Path(__file__).with_name("traced_cases.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


cases = _load_cases()
_KINDS = cases.case_kinds(rlds_tf, replay_tf)
_PAIRS = [(name, context) for name, kind in _KINDS.items() for context in cases.contexts_of(kind)]

_NO_PYTHON_BOOL = r"OperatorNotAllowedInGraphError: .*(symbolic `tf.Tensor` as a Python `bool`|in user code)"
_NUMPY_OF_SYMBOLIC = r"NotImplementedError: .*(Cannot convert a symbolic tf.Tensor|in user code)"
# (case, context) -> the error rlds 0.1.8 / dm-reverb 0.14 raise there (matched against "Type: message").
_PEER_FAILS = {
    # `if cardinality != UNKNOWN_CARDINALITY:` on a symbolic tensor (it raises under AutoGraph too).
    **{(name, context): _NO_PYTHON_BOOL for name in ("episode_length", "episode_length_unknown")
       for context in cases.TRACED_CONTEXTS},
    # `not step['is_last']` and `not stop_condition` need AutoGraph.
    ("sar_fields_mask", "no_autograph"): _NO_PYTHON_BOOL,
    ("truncate_after_condition", "no_autograph"): _NO_PYTHON_BOOL,
    # The standard deviation goes through np.sqrt, which cannot take a symbolic tensor.
    **{("mean_and_std", context): _NUMPY_OF_SYMBOLIC for context in cases.TRACED_CONTEXTS + ("tf_function_all",)},
    # rlds 0.1.8 has no uniform_from_spec (an addition here).
    **{("uniform_from_spec", context): r"AttributeError: .*uniform_from_spec" for context in cases.TRACED_CONTEXTS},
}
_PATTERN_CASES = ("PatternDataset", "pattern_map", "pattern_map_across", "pattern_map_from_transform")
# (case, context) where dm-reverb's PatternDataset (which rlds' pattern_map runs), re-created by `flat_map` for
# every episode, yields the items of the first episode only (`interleave` and `map` give every episode's);
# ours gives every episode's.
_PEER_WRONG = {(name, context) for name in _PATTERN_CASES for context in ("flat_map", "no_autograph")}

# Cases with values computed here: those the peer cannot check in some context, and the idiom users write most (overlapping pairs inside flat_map).
_HAND_COMPUTED = ("batch_2_1_drop", "episode_length", "episode_length_unknown", "sar_fields_mask",
                  "truncate_after_condition", "mean_and_std", "uniform_from_spec") + _PATTERN_CASES
_RTOL = 1e-6  # float sums and moments may add in another order


@functools.lru_cache(maxsize=None)
def _ours(name):
    """Our elements for every context of the case (and eagerly, for the hand-computed ones)."""
    contexts = cases.contexts_of(_KINDS[name]) + (("eager",) if name in _HAND_COMPUTED else ())
    return cases.run_all(rlds_tf, replay_tf, names=[name], contexts=contexts)


def _signatures(transformations):
    """name -> [[parameter, kind, repr(default)], ...] for every public function of a transformations module."""
    out = {}
    for name, fn in vars(transformations).items():
        if not name.startswith("_") and callable(fn) and not inspect.isclass(fn) and not inspect.ismodule(fn):
            out[name] = [[p.name, str(p.kind), repr(p.default)] for p in inspect.signature(fn).parameters.values()]
    return out


_PEER_CODE = episodes_testlib.PEER_PATH + r'''
import importlib.util
import inspect
import rlds
import reverb
''' + inspect.getsource(_signatures) + r'''
emit("__signatures__", _signatures(rlds.transformations))
spec = importlib.util.spec_from_file_location("traced_cases", INPUTS["cases_path"])
cases = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cases)
for key, (status, value) in cases.run_all(rlds, reverb).items():
    emit(key + "/__status__", status if status == "ok" else value)
    if status == "ok":
        emit(key + "/__count__", len(value))
        emit_tree(key, value)
'''


@pytest.fixture(scope="module")
def peer_results(peer):
    """Everything the peer computes, by "case/context"; ours is computed meanwhile (the peer is another process)."""
    box = {}

    def run_peer():
        try:
            box["out"] = peer.run(_PEER_CODE, {"cases_path": str(pathlib.Path(cases.__file__).resolve())})
        except Exception as error:  # pylint: disable=broad-except  (re-raised below, in the test's thread)
            box["error"] = error

    thread = threading.Thread(target=run_peer)
    thread.start()
    for name in _KINDS:
        _ours(name)
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["out"]


def _peer_elements(out, key):
    assert out[f"{key}/__status__"] == "ok", f"peer failed in {key}: {out[f'{key}/__status__']}"
    return out[f"{key}/__count__"], {k[len(key) + 1:]: v for k, v in out.items()
                                     if k.startswith(key + "/") and not k.endswith(("__status__", "__count__"))}


def _our_elements(name, context):
    status, value = _ours(name)[f"{name}/{context}"]
    assert status == "ok", f"{name} failed in {context}: {value}"
    return value


def _assert_leaves_equal(got, want, where):
    assert sorted(got) == sorted(want), f"{where}: leaves differ: {sorted(got)} != {sorted(want)}"
    for key in got:
        a, e = np.asarray(got[key]), np.asarray(want[key])
        assert a.dtype == e.dtype, f"{where}/{key}: dtype {a.dtype} != {e.dtype}"
        assert a.shape == e.shape, f"{where}/{key}: shape {a.shape} != {e.shape}"
        if a.dtype.kind == "f":
            np.testing.assert_allclose(a, e, rtol=_RTOL, err_msg=f"{where}/{key}")
        else:
            np.testing.assert_array_equal(a, e, err_msg=f"{where}/{key}")


@pytest.mark.peer
@pytest.mark.parametrize("name,context", [p for p in _PAIRS if p not in _PEER_FAILS and p not in _PEER_WRONG])
def test_matches_peer(peer_results, name, context):
    key = f"{name}/{context}"
    count, want = _peer_elements(peer_results, key)
    ours = _our_elements(name, context)
    assert len(ours) == count, f"{key}: {len(ours)} elements, the peer gives {count}"
    _assert_leaves_equal(flatten_with_paths(ours), want, key)


@pytest.mark.peer
@pytest.mark.parametrize("name,context", sorted(_PEER_FAILS))
def test_peer_fails_where_noted(peer_results, name, context):
    # Keeps the notes true; ours is checked by test_matches_hand_computed.
    status = peer_results[f"{name}/{context}/__status__"]
    assert re.match(_PEER_FAILS[name, context], status, re.S), f"{name}/{context}: the peer gave {status[:300]}"


@pytest.mark.peer
@pytest.mark.parametrize("name,context", sorted(_PEER_WRONG))
def test_peer_gives_first_episode_only_where_noted(peer_results, name, context):
    count, got = _peer_elements(peer_results, f"{name}/{context}")
    first_episode = _pattern_items(name, episodes=[0])
    assert count == len(first_episode) < len(_hand_computed(name))
    _assert_leaves_equal(got, flatten_with_paths(first_episode), f"peer {name}/{context}")


@pytest.mark.parametrize("name,context", [(name, context) for name in _HAND_COMPUTED
                                          for context in ("eager",) + cases.contexts_of(_KINDS[name])
                                          if not context.endswith("_all")])
def test_matches_hand_computed(name, context):
    ours = _our_elements(name, context)
    _assert_leaves_equal(flatten_with_paths(ours), flatten_with_paths(_hand_computed(name)), f"{name}/{context}")


def test_whole_dataset_contexts_match_hand_computed_items():
    # Over all episodes at once (eagerly and in a tf.function): the same items as episode by episode, except
    # that histories run across episodes without respect_episode_boundaries (one more pair per later episode).
    for context in cases.WHOLE_CONTEXTS:
        for name in ("pattern_map", "pattern_map_from_transform", "pattern_map_across"):
            want = _pattern_items(name, across=name == "pattern_map_across")
            _assert_leaves_equal(flatten_with_paths(_our_elements(name, context)), flatten_with_paths(want),
                                 f"{name}/{context}")


def test_batch_episode_length_and_patterns_in_tf1_graph_mode():
    # Graph code without AutoGraph or tf.function: cardinalities are symbolic while the dataset is built.
    with tf.Graph().as_default():
        steps = tf.data.Dataset.range(5).map(lambda x: {"x": x, "is_last": x == 4})
        pairs = rlds_tf.transformations.batch(steps, size=2, shift=1, drop_remainder=True)
        lengths = [rlds_tf.transformations.episode_length(steps),
                   rlds_tf.transformations.episode_length(steps.filter(lambda s: s["x"] > 1))]
        ref = replay_tf.structured_writer.create_reference_step(steps.element_spec)
        config = replay_tf.structured_writer.create_config({"x": ref["x"][-2:]}, table="t")
        items = replay_tf.PatternDataset(steps, [config], True, lambda s: s["is_last"])
        next_pair = tf.compat.v1.data.make_one_shot_iterator(pairs).get_next()["x"]
        next_item = tf.compat.v1.data.make_one_shot_iterator(items).get_next()["x"]
        next_batch = tf.compat.v1.data.make_one_shot_iterator(items.batch(3)).get_next()["x"]
        with tf.compat.v1.Session() as session:
            for next_element in (next_pair, next_item):
                assert [session.run(next_element).tolist() for _ in range(4)] == [[0, 1], [1, 2], [2, 3], [3, 4]]
                with pytest.raises(tf.errors.OutOfRangeError):
                    session.run(next_element)
            assert [session.run(next_batch).tolist() for _ in range(2)] == [[[0, 1], [1, 2], [2, 3]], [[3, 4]]]
            with pytest.raises(tf.errors.OutOfRangeError):
                session.run(next_batch)
            assert session.run(lengths) == [5, 3]


def test_batch_keeps_a_known_cardinality_eagerly_only():
    steps = tf.data.Dataset.range(5)
    assert int(rlds_tf.transformations.batch(steps, size=2, shift=1, drop_remainder=True).cardinality()) == 4
    traced = tf.function(lambda ds: rlds_tf.transformations.batch(ds, size=2, shift=1).cardinality())
    assert int(traced(steps)) == tf.data.UNKNOWN_CARDINALITY


@pytest.mark.peer
def test_signatures_match_rlds(peer_results):
    # Parameter names, kinds and defaults of every function rlds 0.1.8 has (uniform_from_spec is an addition).
    ours = _signatures(rlds_tf.transformations)
    assert sorted(set(ours) - set(peer_results["__signatures__"])) == ["uniform_from_spec"]
    for name, parameters in peer_results["__signatures__"].items():
        assert ours[name] == parameters, f"{name}: {ours[name]} != rlds' {parameters}"


# Values computed with numpy from the data of traced_cases.py.

def _episode_bounds(episodes=None):
    bounds = [(int(s), int(s) + n) for s, n in zip(cases.STARTS, cases.LENGTHS)]
    return bounds if episodes is None else [bounds[e] for e in episodes]


def _step(t, keys=None):
    return {k: v[t] for k, v in cases.DATA.items() if keys is None or k in keys}


def _pattern_items(name, episodes=None, across=False):
    """The items of a pattern case of traced_cases.py, episode by episode (or, `across`, over the stream of all
    steps). PatternDataset and pattern_map run three configs: `pairs` at every step from the second on, then
    `every_other` at even step indices, then `at_end` once at the end of the episode; pattern_map_across
    runs `pairs` alone; pattern_map_from_transform makes transitions."""
    obs, action, reward = (cases.DATA[k] for k in ("observation", "action", "reward"))
    bounds = _episode_bounds(episodes)
    if across:
        bounds = [(bounds[0][0], bounds[-1][1])]
    items = []
    for start, end in bounds:
        for t in range(start + 1, end):
            if name == "pattern_map_from_transform":
                items.append({"o": obs[t - 1], "a": action[t - 1], "next_o": obs[t]})
                continue
            items.append({"a": action[t - 1:t + 1], "r": reward[t]})
            if name != "pattern_map_across" and (t - start) % 2 == 0:
                items.append({"a": action[t - 1:t + 1], "r": reward[t - 1]})
        if name in ("PatternDataset", "pattern_map"):
            items.append({"a": action[end - 2:end], "r": reward[end - 2]})
    return items


def _moments(values, valid):
    values = values[valid].astype(np.float64)
    mean = values.mean(0)
    return mean, np.sqrt(((values - mean) ** 2).sum(0) / (len(values) - 1))


def _hand_computed(name):
    data, bounds = cases.DATA, _episode_bounds()
    if name == "batch_2_1_drop":
        return [{k: v[t:t + 2] for k, v in data.items()} for start, end in bounds for t in range(start, end - 1)]
    if name == "episode_length":
        return [np.int32(end - start) for start, end in bounds]
    if name == "episode_length_unknown":
        return [np.int32(np.sum(data["action"][start:end] % 3 == 0)) for start, end in bounds]
    if name == "sar_fields_mask":
        sar = ("observation", "action", "reward")
        return [(_step(t, sar), {"observation": np.bool_(True), "action": ~data["is_last"][t],
                                 "reward": ~data["is_last"][t]}) for t in range(len(data["action"]))]
    if name == "truncate_after_condition":
        out = []
        for start, end in bounds:
            hits = np.flatnonzero(data["reward"][start:end] > 0.5)
            out += [_step(t) for t in range(start, start + hits[0] + 1 if len(hits) else end)]
        return out
    if name == "mean_and_std":
        out = []
        for start, end in bounds:
            valid = {"observation": np.ones(end - start, bool), "action": ~data["is_last"][start:end],
                     "reward": ~data["is_last"][start:end]}
            moments = {k: _moments(data[k][start:end], valid[k]) for k in valid}
            out.append({"mean": {k: m[0] for k, m in moments.items()}, "std": {k: m[1] for k, m in moments.items()}})
        return out
    if name == "uniform_from_spec":
        return [{"zeros": {"o": np.zeros(2, np.float32), "r": np.float32(0)}, "in_range": np.bool_(True)}] * 3
    if name in _PATTERN_CASES:
        return _pattern_items(name)
    raise KeyError(f"no hand-computed values for {name!r}")
