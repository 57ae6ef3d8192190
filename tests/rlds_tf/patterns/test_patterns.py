"""pattern_map against dm-reverb 0.14's PatternDataset (through rlds 0.1.8 in the peer venv), item by item.

Every case is a snippet that builds configs with `sw` (Reverb's `structured_writer` in the peer,
`rlds_tf.patterns` here) from a reference step `ref`, the step spec `spec` and `Condition`.
"""
import textwrap

import numpy as np
import pytest
import tensorflow as tf
import tree

from dataset_testlib import assert_iterator_checkpoint_roundtrip
from dataset_testlib import assert_nested_equal
from dataset_testlib import dataset_graph
from dataset_testlib import graph_nodes
from rlds_tf import patterns
from rlds_tf import transformations
from rlds_tf.patterns import compile as compile_lib
from rlds_tf.patterns import items_dataset

EPISODE_LENGTHS = [5, 1, 7, 3, 6]
_N = sum(EPISODE_LENGTHS)
_rng = np.random.default_rng(0)
DATA = {
    "x": np.arange(_N, dtype=np.int32),
    "y": np.arange(2 * _N, dtype=np.float32).reshape(_N, 2) / 2,
    "flag": _rng.random(_N) < 0.5,
    "is_last": np.concatenate([[i == n - 1 for i in range(n)] for n in EPISODE_LENGTHS]),
    "nested": {"z": (np.arange(_N, dtype=np.int64) * 7) % 5},
}
STARTS = np.cumsum([0] + EPISODE_LENGTHS[:-1]).astype(np.int64)
LENGTHS = np.array(EPISODE_LENGTHS, np.int64)

# (name, respect_episode_boundaries, snippet defining `configs`)
CASES = [
    ("transition", True, "configs = [sw.create_config({'obs': ref['x'][-2], 'next': ref['x'][-1]}, 't')]"),
    ("slices", True, "configs = [sw.create_config({'xs': ref['x'][-3:], 'ys': ref['y'][-2:]}, 't')]"),
    ("strided", True, "configs = [sw.create_config((ref['x'][-6::2], ref['x'][-5:-1:2]), 't')]"),
    ("inner_slice", True, "configs = [sw.create_config((ref['x'][-4:-1], ref['nested']['z'][-3]), 't')]"),
    ("two_configs_long_first", True,
     "configs = [sw.create_config({'a': ref['x'][-3:]}, 't'), sw.create_config({'a': ref['x'][-1:]}, 't')]"),
    ("two_configs_short_first", True,
     "configs = [sw.create_config({'a': ref['x'][-1:]}, 't'), sw.create_config({'a': ref['x'][-3:]}, 't')]"),
    ("three_configs_squeezed", True,
     "configs = [sw.create_config({'a': ref['x'][-1]}, 't'), sw.create_config({'a': ref['x'][-2]}, 't'),"
     " sw.create_config({'a': ref['x'][-1]}, 't', conditions=[C.step_index() % 2 == 0])]"),
    ("step_index_mod", True,
     "configs = [sw.create_config(ref['x'][-1], 't', conditions=[C.step_index() % 2 == 0])]"),
    ("step_index_cmp", True,
     "configs = [sw.create_config(ref['x'][-1], 't', conditions=[C.step_index() >= 1, C.step_index() < 4,"
     " C.step_index() != 2])]"),
    ("step_index_le_gt", True,
     "configs = [sw.create_config(ref['x'][-1], 't', conditions=[C.step_index() <= 3, C.step_index() > 0])]"),
    ("steps_since_applied", True,
     "configs = [sw.create_config(ref['x'][-2:], 't', conditions=[C.steps_since_applied() >= 3])]"),
    ("steps_since_applied_mod", False,
     "configs = [sw.create_config(ref['x'][-1], 't', conditions=[C.steps_since_applied() % 4 == 0])]"),
    ("end_episode", True,
     "configs = [sw.create_config(ref['x'][-2:], 't', conditions=[C.is_end_episode()])]"),
    ("end_episode_and_every_step", True,
     "configs = [sw.create_config({'a': ref['x'][-1]}, 't', conditions=[C.is_end_episode()]),"
     " sw.create_config({'a': ref['x'][-1]}, 't', conditions=[C.step_index() % 3 == 1])]"),
    ("data_bool", True,
     "configs = [sw.create_config(ref['x'][-1], 't', conditions=[C.data(spec)['flag'] == 1])]"),
    # RLDS's dataset-patterns notebook compares with bools (`== False`); Reverb stores them as 0 and 1.
    ("data_bool_eq_false", True,
     "configs = [sw.create_config(ref['x'][-2:], 't', conditions=[C.data(spec)['flag'] == False])]"),
    ("data_bool_ne_false_eq_true", False,
     "configs = [sw.create_config(ref['x'][-1], 't', conditions=[C.data(spec)['flag'] != False,"
     " C.data(spec)['flag'] == True])]"),
    ("data_nested_mod", True,
     "configs = [sw.create_config(ref['y'][-2:], 't', conditions=[C.data(spec)['nested']['z'] % 3 == 1])]"),
    ("history_longer_than_episode", True, "configs = [sw.create_config(ref['x'][-6:], 't')]"),
    ("across_episodes", False, "configs = [sw.create_config({'a': ref['x'][-4:], 'l': ref['is_last'][-4:]}, 't')]"),
    ("across_episodes_conditions", False,
     "configs = [sw.create_config(ref['x'][-3:], 't', conditions=[C.step_index() % 2 == 1]),"
     " sw.create_config(ref['x'][-2:], 't', conditions=[C.is_end_episode()])]"),
    ("step_index_with_history", True,
     "configs = [sw.create_config(ref['x'][-2], 't', conditions=[C.step_index() >= 4])]"),
    # Reverb's Python API has no buffer_length builder; `BL(n)` is `buffer_length >= n` on both sides.
    ("buffer_length_user", True, "configs = [sw.create_config(ref['x'][-1], 't', conditions=[BL(3)])]"),
    ("buffer_length_capped", False, "configs = [sw.create_config(ref['x'][-2:], 't', conditions=[BL(3)])]"),
    ("buffer_length_across", False,
     "configs = [sw.create_config(ref['x'][-3:], 't', conditions=[BL(3), C.step_index() % 2 == 0])]"),
]

_PEER_CODE = """
import numpy as np, tensorflow as tf, rlds, reverb, tree
from reverb import structured_writer as sw
C = sw.Condition
data = {k: INPUTS[k] for k in ('x', 'y', 'flag', 'is_last')}
data['nested'] = {'z': INPUTS['z']}
def episodes():
    return tf.data.Dataset.from_tensor_slices((INPUTS['starts'], INPUTS['lengths'])).map(
        lambda s, n: {'steps': tf.data.Dataset.from_tensor_slices(data).skip(s).take(n)})
spec = rlds.transformations.step_spec(episodes())
ref = sw.create_reference_step(spec)
for name, respect, snippet in INPUTS['cases']:
    scope = dict(sw=sw, ref=ref, spec=spec, C=C, BL=lambda n: sw.ConditionProto(buffer_length=True, ge=n))
    exec(snippet, scope)
    try:
        items = list(rlds.transformations.pattern_map(episodes(), scope['configs'], respect))
    except Exception as e:  # e.g. Reverb's wrong shape for open-ended strided slices
        emit(name + '/error', type(e).__name__)
        continue
    emit(name + '/count', len(items))
    for i, item in enumerate(items):
        emit_tree(f'{name}/{i}', item)
"""


def _episodes(stacked: bool = False) -> tf.data.Dataset:
    data = DATA
    if stacked:
        return tf.data.Dataset.from_tensor_slices((STARTS, LENGTHS)).map(
            lambda s, n: {"steps": tree.map_structure(lambda a: tf.constant(a)[s:s + n], data)})
    return tf.data.Dataset.from_tensor_slices((STARTS, LENGTHS)).map(
        lambda s, n: {"steps": tf.data.Dataset.from_tensor_slices(data).skip(s).take(n)})


def _configs(snippet: str):
    spec = transformations.step_spec(_episodes())
    scope = dict(sw=patterns, ref=patterns.create_reference_step(spec), spec=spec, C=patterns.Condition,
                 BL=lambda n: patterns.Condition.buffer_length() >= n)
    exec(snippet, scope)
    return scope["configs"]


@pytest.fixture(scope="module")
def expected(peer):
    inputs = {"x": DATA["x"], "y": DATA["y"], "flag": DATA["flag"], "is_last": DATA["is_last"],
              "z": DATA["nested"]["z"], "starts": STARTS, "lengths": LENGTHS,
              "cases": [list(c) for c in CASES]}
    return peer.run(textwrap.dedent(_PEER_CODE), inputs)


def _unflatten(out: dict, name: str, structure):
    count = out[f"{name}/count"]
    paths = [p for p, _ in tree.flatten_with_path(structure)]
    items = []
    for i in range(count):
        leaves = [out[f"{name}/{i}" + ("/" + "/".join(str(x) for x in p) if p else "")] for p in paths]
        items.append(tree.unflatten_as(structure, leaves))
    return items


@pytest.mark.peer
@pytest.mark.parametrize("layout", ["nested_steps", "nested_steps_small_blocks", "nested_steps_small_blocks_in_scan",
                                    "stacked_steps"])
@pytest.mark.parametrize("name,respect,snippet", CASES, ids=[c[0] for c in CASES])
def test_pattern_map_matches_reverb(expected, name, respect, snippet, layout, monkeypatch):
    if layout.startswith("nested_steps_small_blocks"):
        # Nested steps are read in groups of episodes (normally 16), each flattened and cut into blocks
        # (normally ~2k steps), so all five episodes are one block here. Groups of 2 episodes and blocks
        # of 3 steps put episode boundaries at every position within a block, between blocks and groups.
        monkeypatch.setattr(compile_lib, "_MAX_BLOCK_STEPS", 3)
        monkeypatch.setattr(compile_lib, "_EPISODES_PER_GROUP", 2)
    if layout == "nested_steps_small_blocks_in_scan":  # (blocks evaluated in the scan, as large ones are)
        monkeypatch.setattr(compile_lib, "_LARGE_BLOCK_STEPS", 1)
    stacked = layout == "stacked_steps"
    configs = _configs(snippet)
    ours = transformations.pattern_map(_episodes(stacked), configs, respect)
    actual = list(ours)
    if f"{name}/error" in expected:
        pytest.fail(f"the peer failed on {name}: {expected[name + '/error']}")
    want = _unflatten(expected, name, ours.element_spec)
    assert_nested_equal(actual, want)


@pytest.mark.peer
@pytest.mark.parametrize("block_steps", [None, 3])
@pytest.mark.parametrize("name,respect,snippet", CASES, ids=[c[0] for c in CASES])
def test_replay_tf_pattern_dataset_matches_reverb(expected, name, respect, snippet, block_steps, monkeypatch):
    # rlds' pattern_map (the peer's side of `expected`) is dm-reverb's PatternDataset over the flattened
    # steps, ending episodes where `is_last` is True: replay_tf.PatternDataset on the same steps must match.
    import replay_tf  # noqa: PLC0415

    if block_steps is not None:  # episode ends at every position within and between blocks
        monkeypatch.setattr(compile_lib, "_MAX_BLOCK_STEPS", block_steps)
    if f"{name}/error" in expected:
        pytest.fail(f"the peer failed on {name}: {expected[name + '/error']}")
    steps = _episodes().flat_map(lambda e: e["steps"])
    ours = replay_tf.PatternDataset(steps, _configs(snippet), respect, lambda step: step["is_last"])
    assert_nested_equal(list(ours), _unflatten(expected, name, ours.element_spec))


def _dataset_ops(dataset: tf.data.Dataset) -> list:
    """The dataset ops of a pipeline, functions included, and the number of its functions."""
    graph = dataset_graph(dataset)
    return [n.op for n in graph_nodes(graph) if "Dataset" in n.op], len(graph.library.function)


def test_large_blocks_are_evaluated_in_the_scan_and_small_ones_in_parallel():
    # A pipeline's setup (tracing, then optimizing its functions when it starts) costs about as much as
    # a pass over a few hundred episodes, so the first pass of nested small steps (few large blocks)
    # builds one block function; per-episode blocks keep a parallel map after a scan of the state alone.
    ref = patterns.create_reference_step(transformations.step_spec(_episodes()))
    config = patterns.create_config({"x": ref["x"][-2:]}, table="t")
    nested_ops, nested_functions = _dataset_ops(transformations.pattern_map(_episodes(), [config]))
    stacked_ops, stacked_functions = _dataset_ops(transformations.pattern_map(_episodes(stacked=True), [config]))
    assert nested_ops.count("ScanDataset") == 1 and "ParallelMapDatasetV2" not in nested_ops
    assert stacked_ops.count("ScanDataset") == 1 and "ParallelMapDatasetV2" in stacked_ops
    # The episodes' own map, the group's interleave and flat_map, the scan: the items are unbatched (and
    # batched) by tf.data's kernels alone, without `Dataset.unbatch`'s normalizing map.
    assert nested_functions == 4
    batched_ops, batched_functions = _dataset_ops(transformations.pattern_map(_episodes(), [config]).batch(3))
    assert batched_functions == 4 and "RebatchDatasetV2" in batched_ops and "UnbatchDataset" not in batched_ops


def _scan_state_inputs(dataset: tf.data.Dataset) -> int:
    """The number of state inputs of a pipeline's scan function (its inputs less the block's columns)."""
    graph = dataset_graph(dataset)
    functions = {f.signature.name: f for f in graph.library.function}
    (scan,) = [n for n in graph_nodes(graph) if n.op == "ScanDataset"]
    block_columns = len(tree.flatten(transformations.step_spec(_episodes())))
    return len(functions[scan.attr["f"].func.name].signature.input_arg) - block_columns


@pytest.mark.parametrize("name, respect, state", [
    ("transition", True, 2),  # x's history and the step index
    ("transition", False, 3),  # and the buffer's fill, which only runs across episodes
    ("steps_since_applied", True, 3),  # x's history, the step index and steps_since_applied
])
def test_the_scan_carries_only_the_state_its_configs_read(name, respect, state):
    # Every input of the traced block function adds to the pipeline's setup time.
    (snippet,) = [c[2] for c in CASES if c[0] == name]
    dataset = transformations.pattern_map(_episodes(), _configs(snippet), respect_episode_boundaries=respect)
    assert _scan_state_inputs(dataset) == state


def test_the_scan_state_keeps_its_shapes_so_the_block_function_is_traced_once(monkeypatch):
    traced = []
    real = compile_lib._last_rows

    def counting(buffer, rows, *args):
        traced.append(rows)
        return real(buffer, rows, *args)

    monkeypatch.setattr(compile_lib, "_last_rows", counting)
    ref = patterns.create_reference_step(transformations.step_spec(_episodes()))
    config = patterns.create_config({"x": ref["x"][-3:]}, table="t")
    transformations.pattern_map(_episodes(), [config])
    assert traced == [3]  # one column (x), one trace; a state whose shape changed would trace it again


def test_open_ended_strided_slice_is_right_where_reverb_is_wrong():
    # Reverb declares x[-5::2] as shape [2] and fails at iteration; it selects 3 values.
    configs = _configs("configs = [sw.create_config(ref['x'][-5::2], 't')]")
    ds = transformations.pattern_map(_episodes(), configs)
    assert ds.element_spec.shape == (3,)
    # Episodes of 5, 1, 7, 3, 6 steps starting at 0, 5, 6, 13, 16: windows of 5 that fit in an episode.
    want = [[0, 2, 4], [6, 8, 10], [7, 9, 11], [8, 10, 12], [16, 18, 20], [17, 19, 21]]
    assert [x.numpy().tolist() for x in ds] == want


@pytest.mark.parametrize("name,respect,snippet", [c for c in CASES if len(_configs(c[2])) == 1],
                         ids=[c[0] for c in CASES if len(_configs(c[2])) == 1])
def test_online_evaluator_agrees_with_compiled_graph(name, respect, snippet):
    # One config: the per-config (online) and cumulative (PatternDataset) history rules coincide.
    configs = _configs(snippet)
    evaluator = patterns.PatternEvaluator(configs, transformations.step_spec(_episodes()))
    online = []
    flat = [tree.flatten(tree.map_structure(lambda a: a[i], DATA)) for i in range(_N)]
    for i in range(_N):
        online += [item.data for item in evaluator.append(flat[i])]
        if DATA["is_last"][i]:
            online += [item.data for item in evaluator.end_episode(clear_buffers=respect)]
    compiled = list(transformations.pattern_map(_episodes(), configs, respect))
    assert_nested_equal(compiled, [tree.map_structure(np.asarray, tree.flatten(x)) for x in online] and
                        [tree.unflatten_as(compiled[0], tree.flatten(x)) for x in online] if compiled else online,
                        check_dtype=False)


@pytest.mark.parametrize("with_data", [True, False])
def test_evaluator_reports_absolute_steps_and_priorities(with_data):
    spec = {"x": tf.TensorSpec([], tf.int32), "td": tf.TensorSpec([], tf.float32)}
    ref = patterns.create_reference_step(spec)
    td_config = patterns.create_config({"x": ref["x"][-3:], "td": ref["td"][-3:]}, "t",
                                       priority=patterns.td_error(0.5, spec, lambda s: s["td"]))
    constant_config = patterns.create_config(ref["x"][-1], "c", priority=patterns.constant_priority_fn(2.5))
    # Without data (as a structured writer asks: it reads the values from its own chunks), items select the
    # same steps and a TD-error priority is still computed from the values.
    evaluator = patterns.PatternEvaluator([td_config, constant_config], spec, with_data=with_data)
    items = []
    for i, td in enumerate([1.0, -3.0, 2.0, 0.0]):
        items += evaluator.append([np.float32(td), np.int32(i)])
    td_items = [item for item in items if item.table == "t"]
    assert [item.nodes[1].steps for item in td_items] == [(0, 1, 2), (1, 2, 3)]
    # w * max|td| + (1 - w) * mean|td| over [1, -3, 2] and [-3, 2, 0]
    assert [item.priority for item in td_items] == [pytest.approx(0.5 * 3 + 0.5 * 2),
                                                    pytest.approx(0.5 * 3 + 0.5 * 5 / 3)]
    assert [(item.nodes[0].steps, item.priority) for item in items if item.table == "c"] == [((i,), 2.5)
                                                                                           for i in range(4)]
    if with_data:
        assert [item.data["x"].tolist() for item in td_items] == [[0, 1, 2], [1, 2, 3]]
        assert [item.data["td"].tolist() for item in td_items] == [[1.0, -3.0, 2.0], [-3.0, 2.0, 0.0]]
        assert [int(item.data) for item in items if item.table == "c"] == [0, 1, 2, 3]
    else:
        assert all(item.data is None for item in items)
    assert evaluator.end_episode() == []
    assert evaluator.append([np.float32(0), np.int32(9)])[0].table == "c"  # a new episode: history cleared


def test_many_episodes_keep_their_order():
    # Episodes are stacked several at a time; empty and one-step episodes included.
    lengths = np.random.default_rng(3).integers(0, 6, 40)
    lengths[[0, 7, 8]] = 0
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    total = int(lengths.sum())
    data = {"x": np.arange(total, dtype=np.int32),
            "is_last": np.concatenate([[i == n - 1 for i in range(n)] for n in lengths]).astype(bool)}
    episodes = tf.data.Dataset.from_tensor_slices((starts, lengths.astype(np.int64))).map(
        lambda s, n: {"steps": tf.data.Dataset.from_tensor_slices(data).skip(s).take(n)})
    ref = patterns.create_reference_step(transformations.step_spec(episodes))
    out = transformations.pattern_map(episodes, [patterns.create_config(ref["x"][-1], "t")])
    assert [int(x) for x in out] == list(range(total))


def test_episodes_with_endless_steps_stream():
    # An episode whose steps never end still gives items (blocks of a bounded number of steps).
    steps = tf.data.Dataset.range(10 ** 12).map(lambda i: {"x": i, "is_last": tf.equal(i % 4, 3)})
    episodes = tf.data.Dataset.from_tensors({"steps": steps})
    out = transformations.pattern_map_from_transform(episodes, lambda s: {"x": s["x"][-2], "next_x": s["x"][-1]})
    pairs = [(int(t["x"]), int(t["next_x"])) for t in out.take(7)]
    # Steps 0-3, 4-7, ... are episodes (is_last every 4th step): no pair crosses 3 -> 4 or 7 -> 8.
    assert pairs == [(0, 1), (1, 2), (2, 3), (4, 5), (5, 6), (6, 7), (8, 9)]


def test_steps_with_unknown_shapes_and_strings():
    # Per-episode observation lengths differ (shape [None]); a string field rides along.
    def episode(n, width):
        return {"steps": tf.data.Dataset.from_tensor_slices({
            "obs": tf.reshape(tf.range(n * width, dtype=tf.float32), [n, width]),
            "name": tf.fill([n], f"w{width}"),
            "is_last": tf.range(n) == n - 1})}
    episodes = tf.data.Dataset.from_tensors(episode(3, 2)).concatenate(
        tf.data.Dataset.from_tensors(episode(2, 4))).concatenate(tf.data.Dataset.from_tensors(episode(3, 1)))
    spec = transformations.step_spec(episodes)
    assert spec["obs"].shape.as_list() == [None]
    ref = patterns.create_reference_step(spec)
    config = patterns.create_config({"obs": ref["obs"][-2:], "name": ref["name"][-1]}, "t")
    out = [(x["obs"].numpy().tolist(), x["name"].numpy().decode()) for x in transformations.pattern_map(
        episodes, [config])]
    assert out == [([[0, 1], [2, 3]], "w2"), ([[2, 3], [4, 5]], "w2"), ([[0, 1, 2, 3], [4, 5, 6, 7]], "w4"),
                   ([[0], [1]], "w1"), ([[1], [2]], "w1")]


def test_iterator_is_checkpointable(tmp_path):
    configs = _configs("configs = [sw.create_config(ref['x'][-3:], 't', conditions=[C.steps_since_applied() >= 2])]")
    ds = transformations.pattern_map(_episodes(), configs)
    assert_iterator_checkpoint_roundtrip(ds, tmp_path, num_before=2)


def test_cardinality_of_infinite_input_is_infinite():
    configs = _configs("configs = [sw.create_config(ref['x'][-1], 't')]")
    ds = transformations.pattern_map(_episodes().repeat(), configs)
    assert ds.cardinality() == tf.data.INFINITE_CARDINALITY


@pytest.mark.parametrize("respect,snippet,known", [
    (False, "configs = [sw.create_config(ref['x'][-2:], 't'), sw.create_config(ref['x'][-1:], 't')]", True),
    (False, "configs = [sw.create_config(ref['x'][-5], 't')]", True),
    (True, "configs = [sw.create_config(ref['x'][-2:], 't')]", False),
    (False, "configs = [sw.create_config(ref['x'][-1], 't', conditions=[C.step_index() >= 1])]", False),
])
def test_cardinality_is_known_where_static(respect, snippet, known):
    # 3 episodes of exactly 4 stacked steps: with histories across episodes the count is static.
    data = {"x": np.arange(12, dtype=np.int32).reshape(3, 4), "is_last": np.tile([False] * 3 + [True], (3, 1))}
    episodes = tf.data.Dataset.from_tensor_slices(data).map(lambda ep: {"steps": ep})
    spec = transformations.step_spec(episodes)
    scope = dict(sw=patterns, ref=patterns.create_reference_step(spec), spec=spec, C=patterns.Condition)
    exec(snippet, scope)  # pylint: disable=exec-used
    ds = transformations.pattern_map(episodes, scope["configs"], respect)
    count = len(list(ds))
    assert int(ds.cardinality()) == (count if known else tf.data.UNKNOWN_CARDINALITY)
    if not all(s.shape.is_fully_defined() for s in tf.nest.flatten(ds.element_spec)):
        return  # (items of several lengths: not batched as they are)
    for drop_remainder, batches in ((False, -(-count // 2)), (True, count // 2)):
        batched = ds.batch(2, drop_remainder=drop_remainder)
        assert len(list(batched)) == batches
        assert int(batched.cardinality()) == (batches if known else tf.data.UNKNOWN_CARDINALITY)


def _batched_one_by_one(dataset, batch_size, drop_remainder):
    """`Dataset.batch` itself: the items one element at a time, then stacked (the reference)."""
    return tf.data.Dataset.batch(dataset, batch_size, drop_remainder=drop_remainder)


@pytest.mark.parametrize("layout", ["nested_steps", "nested_steps_small_blocks", "stacked_steps"])
@pytest.mark.parametrize("name,respect,snippet", CASES, ids=[c[0] for c in CASES])
def test_batches_cut_from_blocks_equal_batches_of_the_items(name, respect, snippet, layout, monkeypatch):
    if layout == "nested_steps_small_blocks":  # (blocks of 3 steps, some with no item)
        monkeypatch.setattr(compile_lib, "_MAX_BLOCK_STEPS", 3)
        monkeypatch.setattr(compile_lib, "_EPISODES_PER_GROUP", 2)
    items = transformations.pattern_map(_episodes(layout == "stacked_steps"), _configs(snippet), respect)
    if not all(s.shape.is_fully_defined() for s in tf.nest.flatten(items.element_spec)):
        # Items of several lengths (configs slicing a leaf differently) are cut one by one: tf.data batches them.
        assert not isinstance(items, items_dataset.ItemsDataset)
        return
    for batch_size, drop_remainder in ((1, False), (3, False), (3, True), (64, False)):
        batched = items.batch(batch_size, drop_remainder=drop_remainder)
        expected = _batched_one_by_one(items, batch_size, drop_remainder)
        assert batched.element_spec == expected.element_spec
        assert_nested_equal(list(batched), list(expected))


def test_pattern_dataset_batches_are_cut_from_blocks_too():
    import replay_tf  # noqa: PLC0415

    configs = _configs("configs = [sw.create_config({'x': ref['x'][-2:], 'y': ref['y'][-1]}, 't')]")
    items = replay_tf.PatternDataset(_episodes().flat_map(lambda e: e["steps"]), configs, True,
                                     lambda step: step["is_last"])
    batched = items.batch(4)
    ops, _ = _dataset_ops(batched)
    assert "RebatchDatasetV2" in ops and "UnbatchDataset" not in ops[ops.index("RebatchDatasetV2"):]
    assert_nested_equal(list(batched), list(_batched_one_by_one(items, 4, False)))


def test_batch_arguments_beyond_size_and_drop_remainder_batch_the_items_as_tf_data_does():
    items = transformations.pattern_map(_episodes(), _configs("configs = [sw.create_config(ref['x'][-2:], 't')]"))
    for batched in (items.batch(tf.constant(3, tf.int64)), items.batch(3, num_parallel_calls=2),
                    items.batch(3, num_parallel_calls=2, deterministic=True), items.batch(3, name="batch")):
        ops, _ = _dataset_ops(batched)
        assert "RebatchDatasetV2" not in ops
        assert_nested_equal(list(batched), list(_batched_one_by_one(items, 3, False)))


_SPEC = {"observation": {"pos": tf.TensorSpec([3], tf.float32)}, "reward": tf.TensorSpec([], tf.float32),
         "step": tf.TensorSpec([], tf.int64), "is_last": tf.TensorSpec([], tf.bool)}

ERROR_CASES = [
    ("missing_field", lambda ref, C: ref["observation"]["vel"][-1], KeyError,
     r"observation/vel.*fields at observation: 'pos'"),
    ("missing_top_field", lambda ref, C: ref["obs"][-1], KeyError, r"'obs'.*'is_last', 'observation'"),
    ("zero_index", lambda ref, C: ref["reward"][0], ValueError, r"index at reward must be < 0"),
    ("positive_index", lambda ref, C: ref["reward"][2], ValueError, r"stop at reward must be <= 0.*got 2"),
    ("positive_start", lambda ref, C: ref["reward"][1:], ValueError, r"start at reward must be < 0"),
    ("no_start", lambda ref, C: ref["reward"][:-1], ValueError, r"needs a negative start"),
    ("bad_step", lambda ref, C: ref["reward"][-3::0], ValueError, r"step at reward must be > 0"),
    ("empty_slice", lambda ref, C: ref["reward"][-2:-2], ValueError, r"stop at reward \(-2\) must be > start"),
    ("mod_zero", lambda ref, C: C.step_index() % 0 == 1, ValueError, r"modulus must be > 0"),
    ("whole_column", lambda ref, C: patterns.create_config({"r": ref["reward"]}, "t"), TypeError,
     r"leaf at r is a whole column"),
]


@pytest.mark.parametrize("name,build,error,match", ERROR_CASES, ids=[c[0] for c in ERROR_CASES])
def test_bad_input_fails_at_config_time(name, build, error, match):
    with pytest.raises(error, match=match):
        build(patterns.create_reference_step(_SPEC), patterns.Condition)


INCOMPATIBLE = [
    ("structure", [{"a": -1}, {"b": -1}], "t", r"same pattern_structure"),
    ("dtype", [{"a": ("reward", -1)}, {"a": ("step", -1)}], "t", r"multiple dtypes at \('a',\)"),
    ("rank", [{"a": ("reward", -1)}, {"a": ("reward", slice(-2, None))}], "t", r"incompatible shapes at \('a',\)"),
    ("table", [{"a": -1}, {"a": -2}], ["t1", "t2"], r"same table.*t1, t2"),
]


@pytest.mark.parametrize("name,patterns_spec,tables,match", INCOMPATIBLE, ids=[c[0] for c in INCOMPATIBLE])
def test_incompatible_configs_fail_at_config_time(name, patterns_spec, tables, match):
    ref = patterns.create_reference_step(_SPEC)
    configs = []
    for k, p in enumerate(patterns_spec):
        pattern = {key: (ref[v[0]][v[1]] if isinstance(v, tuple) else ref["reward"][v]) for key, v in p.items()}
        configs.append(patterns.create_config(pattern, tables[k] if isinstance(tables, list) else tables))
    with pytest.raises(ValueError, match=match):
        patterns.infer_signature(configs, _SPEC)
    episodes = tf.data.Dataset.from_tensors({"steps": tf.data.Dataset.from_tensors(
        tf.nest.map_structure(lambda s: tf.zeros(s.shape, s.dtype), _SPEC))})
    with pytest.raises(ValueError, match=match):
        transformations.pattern_map(episodes, configs)


def test_condition_on_non_scalar_column_is_never_met_in_pattern_map(caplog):
    ref = patterns.create_reference_step(_SPEC)
    # As in dm-reverb, the condition is accepted and never met (tests/replay_tf/test_reverb_api_dropin.py).
    structure = tf.nest.map_structure(lambda _: None, _SPEC)
    config = patterns.create_config(ref["reward"][-1], "t",
                                    conditions=[patterns.Condition.data(structure)["observation"]["pos"] != 1])
    episodes = tf.data.Dataset.from_tensors({"steps": tf.data.Dataset.from_tensors(
        tf.nest.map_structure(lambda s: tf.zeros(s.shape, s.dtype), _SPEC))})
    assert list(transformations.pattern_map(episodes, [config])) == []
    assert "data condition on column 1 has invalid data type float32" in caplog.text


def test_steps_without_is_last_are_rejected():
    spec = {"x": tf.TensorSpec([], tf.int32)}
    ref = patterns.create_reference_step(spec)
    episodes = tf.data.Dataset.from_tensors({"steps": tf.data.Dataset.from_tensors({"x": 1})})
    with pytest.raises(KeyError, match=r"is_last.*fields: \['x'\]"):
        transformations.pattern_map(episodes, [patterns.create_config(ref["x"][-1], "t")])


def test_create_config_does_not_modify_caller_structures():
    ref = patterns.create_reference_step(_SPEC)
    pattern = {"r": ref["reward"][-2:]}
    conditions = [patterns.Condition.step_index() >= 0]
    config = patterns.create_config(pattern, "t", conditions)
    transformations.pattern_map(tf.data.Dataset.from_tensors({"steps": tf.data.Dataset.from_tensors(
        tf.nest.map_structure(lambda s: tf.zeros(s.shape, s.dtype), _SPEC))}), [config])
    assert len(config.conditions) == 1 and len(conditions) == 1
    assert patterns.unpack_pattern(config) == pattern
