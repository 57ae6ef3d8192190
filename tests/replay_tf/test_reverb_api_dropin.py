"""Reverb API details that code written for dm-reverb 0.14 relies on, checked against dm-reverb itself.

- `TableInfo`'s option and statistics fields are protobuf messages (HasField, CopyFrom, serialization);
- `structured_writer.Condition.data` accepts any column; on a float or non-scalar one the condition is
  never met (writer and PatternDataset), instead of failing when the config is built;
- `server_executable.server_from_proto` builds tables from `ReverbServerConfig` protos;
- `structured_writer` has every public name of Reverb's module (type aliases used in annotations too);
- error messages people match on contain Reverb's text (ours appends detail after it).
"""
import importlib
import logging

import numpy as np
import pytest
import tensorflow as tf
from google.protobuf import message as pb_message
from google.protobuf import text_format

import reverb_testlib
import replay_tf as reverb
from replay_tf.core import rate_limiters as core_rate_limiters
from replay_tf.core import selectors as core_selectors
from replay_tf.core import table as core_table
from replay_tf.server_executable import reverb_config_pb2
from replay_tf.server_executable import server_from_proto
from replay_tf.server_executable import server_main
from replay_tf.wire import checkpoint_pb2
from replay_tf.wire import schema_pb2
from replay_tf.wire import table_info
from rlds_tf import transformations

# --- scenarios run by dm-reverb (peer venv) and by replay_tf: the emitted values must be equal ---

SCENARIOS = {
    "table_info_messages": """
import base64, dataclasses
from google.protobuf import message as pb_message, text_format
tables = [reverb.Table('prio', reverb.selectors.Prioritized(0.8), reverb.selectors.Fifo(), 10,
                       reverb.rate_limiters.SampleToInsertRatio(2.0, 3, 4.0), max_times_sampled=5),
          reverb.Table('heap', reverb.selectors.MaxHeap(), reverb.selectors.MinHeap(), 5,
                       reverb.rate_limiters.MinSize(1)),
          reverb.Table.queue('queue', 7),
          reverb.Table('uni', reverb.selectors.Uniform(), reverb.selectors.Lifo(), 3, reverb.rate_limiters.MinSize(2))]
server = reverb.Server(tables)
client = reverb.Client(f'localhost:{server.port}')
client.insert(np.float32(1), priorities={'queue': 1.0, 'uni': 2.0})
client.insert(np.float32(2), priorities={'uni': 3.0})
remote = client.server_info()
for table in tables:
    for source, info in (('table', table.info), ('client', remote[table.name])):
        key = f'{table.name}.{source}'
        for field in ('sampler_options', 'remover_options', 'rate_limiter_info'):
            value = getattr(info, field)
            copy = type(value)()
            copy.CopyFrom(value)
            emit(f'{key}.{field}', [isinstance(value, pb_message.Message), type(value).DESCRIPTOR.full_name,
                                    sorted(f.name for f, _ in value.ListFields()),
                                    base64.b64encode(value.SerializeToString(deterministic=True)).decode(),
                                    text_format.MessageToString(value), copy == value, value.ByteSize(),
                                    type(value).FromString(value.SerializeToString()) == value])
        options = info.sampler_options
        emit(f'{key}.sampler_fields', [options.WhichOneof('distribution'), options.HasField('prioritized'),
                                       options.HasField('heap'), options.is_deterministic])
        limiter = info.rate_limiter_info
        emit(f'{key}.limiter_fields', [limiter.HasField('insert_stats'), limiter.HasField('sample_stats'),
                                       limiter.insert_stats.completed, limiter.sample_stats.completed])
        worker_time = info.table_worker_time
        emit(f'{key}.worker_time', [isinstance(worker_time, pb_message.Message),
                                    type(worker_time).DESCRIPTOR.full_name,
                                    [f.name for f in type(worker_time).DESCRIPTOR.fields]])
        emit(f'{key}.replace', dataclasses.replace(info, name='renamed').name)
    emit(f'{table.name}.same_in_both', [table.info.sampler_options == remote[table.name].sampler_options,
                                        table.info.remover_options == remote[table.name].remover_options,
                                        table.info.rate_limiter_info == remote[table.name].rate_limiter_info])
server.stop()
""",
    "condition_data_any_column": """
sw = reverb.structured_writer
spec = {'a': tf.TensorSpec([], tf.float32), 'v': tf.TensorSpec([2], tf.int32), 'one': tf.TensorSpec([1], tf.int32),
        'x': tf.TensorSpec([], tf.int32)}
ref = sw.create_reference_step(spec)
steps = {'a': np.array([1., 3., 3.5, 4., 3.], np.float32), 'v': np.array([[3, 3], [3, 1], [1, 3], [3, 3], [0, 0]], np.int32),
         'one': np.array([[3], [1], [3], [2], [3]], np.int32), 'x': np.arange(5, dtype=np.int32)}
conditions = {'float_eq': sw.Condition.data(spec)['a'] == 3, 'float_ne': sw.Condition.data(spec)['a'] != 3,
              'float_lt': sw.Condition.data(spec)['a'] < 3, 'vector_eq': sw.Condition.data(spec)['v'] == 3,
              'one_element_eq': sw.Condition.data(spec)['one'] == 3}
server = reverb.Server([reverb.Table.queue(name, 100) for name in conditions])
client = reverb.Client(f'localhost:{server.port}')
for name, condition in conditions.items():
    config = sw.create_config({'x': ref['x'][-1]}, table=name, conditions=[condition])
    emit(name + '.signature', {k: [s.shape.as_list(), s.dtype.name] for k, s in sw.infer_signature([config], spec).items()})
    dataset = reverb.PatternDataset(tf.data.Dataset.from_tensor_slices(steps), [config], True, lambda step: False)
    emit(name + '.pattern_dataset', [int(item['x']) for item in dataset])
    writer = client.structured_writer([config])
    for i in range(5):
        writer.append({k: v[i] for k, v in steps.items()})
    writer.end_episode()
    emit(name + '.writer', client.server_info()[name].current_size)
server.stop()
""",
    "server_executable": """
import base64, importlib
from google.protobuf import text_format
from_proto = importlib.import_module(reverb.__name__ + '.server_executable.server_from_proto')
config_pb2 = importlib.import_module(reverb.__name__ + '.server_executable.reverb_config_pb2')
config = text_format.Parse('''
    port: 1234
    tables { table_name: "a" max_size: 100 max_times_sampled: 3
             sampler { prioritized { priority_exponent: 0.7 } } remover { fifo: true is_deterministic: true }
             rate_limiter { samples_per_insert: 2.0 min_size_to_sample: 5 min_diff: -10 max_diff: 10
                            sample_count: 9 insert_count: 4 delete_count: 1 } }
    tables { table_name: "b" max_size: 10 sampler { heap { min_heap: true } } remover { heap { } }
             rate_limiter { samples_per_insert: 1 min_size_to_sample: 1 min_diff: -1e300 max_diff: 1e300 } }
    tables { table_name: "c" max_size: 10 sampler { uniform: true } remover { lifo: true }
             rate_limiter { samples_per_insert: 1 min_size_to_sample: 1 min_diff: -1 max_diff: 1 } }
''', config_pb2.ReverbServerConfig())
emit('config_fields', [[f.name, f.number, f.type, f.message_type and f.message_type.full_name]
                       for f in config_pb2.ReverbServerConfig.DESCRIPTOR.fields])
emit('table_config_fields', sorted([f.name, f.number, f.type, f.message_type and f.message_type.full_name]
                                   for f in config_pb2.ReverbServerConfig.DESCRIPTOR.fields[0].message_type.fields))
emit('round_trip', base64.b64encode(config.SerializeToString(deterministic=True)).decode())
tables = from_proto.tables_from_proto(config.tables)
for table in tables:
    info = table.info
    limiter = info.rate_limiter_info
    emit(table.name, [info.name, info.max_size, info.max_times_sampled, info.current_size,
                      text_format.MessageToString(info.sampler_options), text_format.MessageToString(info.remover_options),
                      [limiter.samples_per_insert, limiter.min_diff, limiter.max_diff, limiter.min_size_to_sample,
                       limiter.insert_stats.completed, limiter.sample_stats.completed]])
limiter = from_proto.rate_limiter_from_proto(config.tables[0].rate_limiter)
emit('rate_limiter_is_base', type(limiter).__name__)
options = type(config.tables[0].sampler)
for name, text in [('fifo', 'fifo: true'), ('uniform', 'uniform: true'), ('lifo', 'lifo: true'),
                   ('max_heap', 'heap { min_heap: false }'), ('min_heap', 'heap { min_heap: true }'),
                   ('prioritized', 'prioritized { priority_exponent: 0.25 }')]:
    selector = from_proto.selector_from_proto(text_format.Parse(text, options()))
    table = reverb.Table('t', selector, reverb.selectors.Fifo(), 1, reverb.rate_limiters.MinSize(1))
    emit('selector.' + name, text_format.MessageToString(table.info.sampler_options))
server = reverb.Server(tables)
client = reverb.Client(f'localhost:{server.port}')
client.insert(np.int32(7), priorities={'c': 1.0})
emit('sampled', [np.asarray(s.data[0]).tolist() for s in client.sample('c', 1, emit_timesteps=False)])
server.stop()
""",
}


def _failing_append(make_writer: str, first: str, failing: str, *, header: str = "") -> str:
    """A scenario: after `header`, a writer `client.<make_writer>` on a queue 'q' appends `first`, then
    `failing` (which raises); the writer is flushed and the server stopped either way."""
    return f"""{header}
server = reverb.Server([reverb.Table.queue('q', 100)])
writer = reverb.Client(f'localhost:{{server.port}}').{make_writer}
writer.append({first})
try:
    writer.append({failing})
finally:  # (an unflushed writer of a stopped dm-reverb server blocks at exit)
    writer.flush()
    del writer
    server.stop()
"""


_NESTED = "{'a': np.int32(1), 'b': {'c': np.zeros(2, np.float32)}}"
_SW = """
sw = reverb.structured_writer
spec = {'a': tf.TensorSpec([], tf.int32), 'b': {'c': tf.TensorSpec([2], tf.float32)}}
ref = sw.create_reference_step(spec)"""

# Scenarios that raise: the exception types must be equal and our message must contain Reverb's.
ERROR_SCENARIOS = {
    "structured_writer_length": _failing_append(
        "structured_writer([sw.create_config(ref['a'][-1], 'q')])", _NESTED, "[1, 2, 3, 4]", header=_SW),
    "structured_writer_dtype": _failing_append(
        "structured_writer([sw.create_config(ref['b']['c'][-1], 'q')])", _NESTED,
        "{'a': np.int32(1), 'b': {'c': np.zeros(2, np.float64)}}", header=_SW),
    "structured_writer_shape": _failing_append(
        "structured_writer([sw.create_config(ref['b']['c'][-1], 'q')])", _NESTED,
        "{'a': np.int32(1), 'b': {'c': np.zeros(3, np.float32)}}", header=_SW),
    "structured_writer_dtype_unread_column": _failing_append(
        "structured_writer([sw.create_config(ref['a'][-1], 'q')])", _NESTED,
        "{'a': np.int64(1), 'b': {'c': np.zeros(2, np.float32)}}", header=_SW),
    "structured_writer_partial_step_twice": """
sw = reverb.structured_writer
ref = sw.create_reference_step({'a': tf.TensorSpec([], tf.int32)})
server = reverb.Server([reverb.Table.queue('q', 100)])
writer = reverb.Client(f'localhost:{server.port}').structured_writer([sw.create_config(ref['a'][-1], 'q')])
writer.append({'a': np.int32(1)}, partial_step=True)
try:
    writer.append({'a': np.int32(2)}, partial_step=True)
finally:  # (an unflushed writer of a stopped dm-reverb server blocks at exit)
    writer.append({'a': None})
    writer.flush()
    del writer
    server.stop()
""",
    "structured_writer_no_config": """
server = reverb.Server([reverb.Table.queue('q', 100)])
try:
    reverb.Client(f'localhost:{server.port}').structured_writer([])
finally:
    server.stop()
""",
    "trajectory_writer_dtype": _failing_append(
        "trajectory_writer(2)", _NESTED, "{'a': np.int32(1), 'b': {'c': np.zeros(2, np.float64)}}"),
    "trajectory_writer_shape": _failing_append(
        "trajectory_writer(2)", _NESTED, "{'a': np.int32(1), 'b': {'c': np.zeros(3, np.float32)}}"),
    "trajectory_writer_dtype_int": _failing_append(
        "trajectory_writer(2)", "{'a': np.int32(1)}", "{'a': np.float64(1)}"),
}
_INFER = """
sw = reverb.structured_writer
spec = {'x': tf.TensorSpec([], tf.int32), 'y': tf.TensorSpec([], tf.float32)}
ref = sw.create_reference_step(spec)
"""
ERROR_SCENARIOS.update({
    "infer_signature_dtypes": _INFER + "sw.infer_signature([sw.create_config({'x': ref['x'][-1]}, 't'), "
                                       "sw.create_config({'x': ref['y'][-1]}, 't')], spec)",
    "infer_signature_nested_dtypes": _INFER + "sw.infer_signature([sw.create_config({'x': (ref['x'][-1],)}, 't'), "
                                              "sw.create_config({'x': (ref['y'][-1],)}, 't')], spec)",
    "infer_signature_shapes": _INFER + "sw.infer_signature([sw.create_config({'x': ref['x'][-1]}, 't'), "
                                       "sw.create_config({'x': ref['x'][-2:]}, 't')], spec)",
    "infer_signature_structure": _INFER + "sw.infer_signature([sw.create_config({'x': ref['x'][-1]}, 't'), "
                                          "sw.create_config({'y': ref['x'][-1]}, 't')], spec)",
    "infer_signature_tables": _INFER + "sw.infer_signature([sw.create_config({'x': ref['x'][-1]}, 't'), "
                                       "sw.create_config({'x': ref['x'][-1]}, 'u')], spec)",
    "infer_signature_no_config": _INFER + "sw.infer_signature([], spec)",
})
_SELECTOR = """
import importlib
from_proto = importlib.import_module(reverb.__name__ + '.server_executable.server_from_proto')
config_pb2 = importlib.import_module(reverb.__name__ + '.server_executable.reverb_config_pb2')
options = type(config_pb2.ReverbServerConfig().tables.add().sampler)
"""
ERROR_SCENARIOS.update({
    "selector_false_fifo": _SELECTOR + "from_proto.selector_from_proto(options(fifo=False))",
    "selector_false_uniform": _SELECTOR + "from_proto.selector_from_proto(options(uniform=False))",
    "selector_none": _SELECTOR + "from_proto.selector_from_proto(options())",
})

# The texts dm-reverb 0.14 raises (from the peer run of ERROR_SCENARIOS), for the runs without the peer;
# where dm-reverb's message goes on past this text, the rest does not apply here.
REVERB_ERRORS = {
    "structured_writer_partial_step_twice": "RuntimeError: A value for column 0 was provided by multiple "
                                            "Append/AppendPartial calls in the same step.",
    "structured_writer_length": "ValueError: Flattened data has an unexpected length, got 4 but wanted 2.",
    "structured_writer_dtype": "ValueError: Tensor of wrong dtype provided for column 1 (path=('b', 'c')). "
                               "Got double but expected float.",
    "structured_writer_shape": "ValueError: Tensor of incompatible shape provided for column 1 (path=('b', 'c')). "
                               "Got [3] which is incompatible with [2].",
    "structured_writer_dtype_unread_column": "ValueError: Tensor of wrong dtype provided for column 0 "
                                             "(path=('a',)). Got int64 but expected int32.",
    "structured_writer_no_config": "ValueError: At least one config must be provided.",
    "trajectory_writer_dtype": "ValueError: Tensor of wrong dtype provided for column ('b', 'c'). Got double but "
                               "expected float.",
    "trajectory_writer_shape": "ValueError: Tensor of incompatible shape provided for column ('b', 'c'). Got [3] "
                               "which is incompatible with [2].",
    "trajectory_writer_dtype_int": "ValueError: Tensor of wrong dtype provided for column ('a',). Got double but "
                                   "expected int32.",
    "infer_signature_dtypes": "ValueError: Configs produce trajectories with multiple dtypes at ('x',). Got "
                              "[tf.int32, tf.float32].",
    "infer_signature_nested_dtypes": "ValueError: Configs produce trajectories with multiple dtypes at ('x', 0). "
                                     "Got [tf.int32, tf.float32].",
    "infer_signature_shapes": "ValueError: Configs produce trajectories with incompatible shapes at ('x',). Got "
                              "[TensorShape([]), TensorShape([2])].",
    "infer_signature_structure": "ValueError: All configs must have exactly the same pattern_structure.",
    "infer_signature_tables": "ValueError: All configs must target the same table but provided configs included "
                              "t, u.",
    "infer_signature_no_config": "ValueError: At least one config must be provided.",
    "selector_false_fifo": "ValueError: distribution=fifo but the associated boolean value is false.",
    "selector_false_uniform": "ValueError: distribution=uniform but the associated boolean value is false.",
    "selector_none": "NotImplementedError: distribution=None",
}

_STRUCTURED_WRITER_NAMES = """
import types, typing
module = reverb.structured_writer
names = {}
for name in dir(module):
    if name.startswith('_'):
        continue
    value = getattr(module, name)
    if isinstance(value, types.ModuleType):
        kind = 'module:' + value.__name__
    elif value is getattr(typing, name, None):  # (Any, Callable, ...: imported for annotations)
        kind = 'typing'
    else:
        kind = 'api'
    names[name] = kind
emit('names', names)
"""


@pytest.fixture(scope="module")
def peer_results(peer):
    scenarios = dict(SCENARIOS, **ERROR_SCENARIOS, structured_writer_names=_STRUCTURED_WRITER_NAMES)
    return reverb_testlib.run_peer(peer, scenarios)


@pytest.fixture(scope="module")
def local_results():
    return reverb_testlib.run_local(dict(SCENARIOS, **ERROR_SCENARIOS))


def test_local_scenarios_run_without_errors(local_results):
    assert not {k: v for k, v in local_results.items()
                if k.endswith(".error") and k[:-len(".error")] not in ERROR_SCENARIOS}


@pytest.mark.peer
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_matches_reverb(scenario, peer_results, local_results):
    ours = reverb_testlib.scenario_results(local_results, scenario)
    theirs = reverb_testlib.scenario_results(peer_results, scenario)
    assert "error" not in theirs, theirs["error"]
    assert ours == theirs


@pytest.mark.peer
@pytest.mark.parametrize("scenario", sorted(ERROR_SCENARIOS))
def test_error_contains_reverbs_text(scenario, peer_results, local_results):
    theirs = reverb_testlib.scenario_results(peer_results, scenario)["error"]
    ours = reverb_testlib.scenario_results(local_results, scenario)["error"]
    assert theirs.startswith(REVERB_ERRORS[scenario])  # the recorded texts are dm-reverb's
    error_type, text = REVERB_ERRORS[scenario].split(": ", 1)
    assert ours.startswith(f"{error_type}: ") and text in ours, (ours, theirs)


@pytest.mark.parametrize("scenario", sorted(ERROR_SCENARIOS))
def test_error_contains_reverbs_recorded_text(scenario, local_results):
    error_type, text = REVERB_ERRORS[scenario].split(": ", 1)
    ours = reverb_testlib.scenario_results(local_results, scenario)["error"]
    # (Where Reverb's tests compare a text exactly it is all of ours, what we add being a note on the
    # exception: tests/replay_tf/test_reverb_message_texts.py.)
    assert ours.startswith(f"{error_type}: ") and text in ours, ours


@pytest.mark.peer
def test_structured_writer_has_every_public_name_of_reverbs(peer_results):
    names = peer_results["structured_writer_names.names"]
    assert {"ReferenceStep", "Pattern", "PatternTransform", "StructuredWriter", "Condition"} <= {
        name for name, kind in names.items() if kind == "api"}
    missing = []
    for name, kind in names.items():
        if kind == "api" or (kind.startswith("module:reverb.") and kind != "module:reverb.pybind"):
            if not hasattr(reverb.structured_writer, name):
                missing.append(name)
    assert not missing


def test_structured_writer_names():
    sw = reverb.structured_writer
    for name in ("Condition", "ConditionProto", "Config", "Pattern", "PatternTransform", "ReferenceStep",
                 "StructuredWriter", "constant_priority_fn", "create_config", "create_reference_step",
                 "infer_signature", "pattern_from_transform", "td_error", "unpack_pattern", "errors",
                 "patterns_pb2", "reverb_types"):
        assert hasattr(sw, name), name
    assert sw.patterns_pb2.PatternNode.DESCRIPTOR.full_name == "deepmind.reverb.PatternNode"

    def transform(ref: sw.ReferenceStep) -> sw.Pattern:
        return {"x": ref["x"][-1]}

    f: sw.PatternTransform = transform
    pattern = sw.pattern_from_transform({"x": tf.TensorSpec([], tf.int32)}, f)
    assert sw.infer_signature([sw.create_config(pattern, "t")], {"x": tf.TensorSpec([], tf.int32)}) == {
        "x": tf.TensorSpec([], tf.int32, name="x")}


# --- TableInfo: hand-computed messages ---

def test_table_info_fields_are_messages():
    table = reverb.Table("t", reverb.selectors.Prioritized(0.5), reverb.selectors.Fifo(), 10,
                         reverb.rate_limiters.MinSize(3), max_times_sampled=2)
    info = table.info
    assert isinstance(info.sampler_options, schema_pb2.KeyDistributionOptions)
    assert isinstance(info.remover_options, schema_pb2.KeyDistributionOptions)
    assert isinstance(info.rate_limiter_info, schema_pb2.RateLimiterInfo)
    assert isinstance(info.table_worker_time, schema_pb2.TableWorkerTime)
    assert info.sampler_options.HasField("prioritized") and not info.sampler_options.HasField("heap")
    assert info.sampler_options == schema_pb2.KeyDistributionOptions(
        prioritized=schema_pb2.KeyDistributionOptions.Prioritized(priority_exponent=0.5))
    # Fifo: field 1 (fifo) = 1 -> 08 01; field 7 (is_deterministic) = 1 -> 38 01.
    assert info.remover_options.SerializeToString() == b"\x08\x01\x38\x01"
    assert info.rate_limiter_info.HasField("insert_stats") and info.rate_limiter_info.min_size_to_sample == 3
    copied = schema_pb2.RateLimiterInfo()
    copied.CopyFrom(info.rate_limiter_info)
    assert copied == info.rate_limiter_info
    with pytest.raises(TypeError):  # messages are not hashable, nor is Reverb's (unfrozen) TableInfo
        hash(info)


def test_table_info_converts_core_records_and_refuses_others():
    info = table_info.TableInfo(
        name="t", sampler_options=core_selectors.KeyDistributionOptions(uniform=True),
        remover_options=core_selectors.KeyDistributionOptions(heap=core_selectors.HeapOptions(min_heap=True),
                                                              is_deterministic=True),
        max_size=1, max_times_sampled=0,
        rate_limiter_info=core_rate_limiters.RateLimiterInfo(1.0, -2.0, 2.0, 1,
                                                             core_rate_limiters.RateLimiterCallStats(4)),
        signature=None, current_size=0, num_episodes=0, num_deleted_episodes=0, num_unique_samples=0,
        table_worker_time=core_table.TableWorkerTime(running_ms=5))
    assert info.sampler_options == schema_pb2.KeyDistributionOptions(uniform=True)
    assert info.remover_options.heap.min_heap and info.remover_options.is_deterministic
    assert (info.rate_limiter_info.min_diff, info.rate_limiter_info.insert_stats.completed) == (-2.0, 4)
    assert info.table_worker_time == schema_pb2.TableWorkerTime(running_ms=5)
    with pytest.raises(TypeError, match=r"TableInfo needs a deepmind.reverb.KeyDistributionOptions message, got 'x'"):
        table_info.TableInfo("t", "x", info.remover_options, 1, 0, info.rate_limiter_info, None, 0, 0, 0, 0)


def test_table_info_round_trips_through_the_proto():
    table = reverb.Table("t", reverb.selectors.MaxHeap(), reverb.selectors.Lifo(), 4,
                         reverb.rate_limiters.SampleToInsertRatio(1.5, 2, 3.0),
                         signature={"a": tf.TensorSpec([2], tf.float32, name="a")})
    info = table.info
    back = reverb.reverb_types.TableInfo.from_serialized_proto(table_info.table_info_to_proto(info).SerializeToString())
    assert back == info


# --- Condition.data on columns no data condition can read ---

_SPEC = {"a": tf.TensorSpec([], tf.float32), "is_last": tf.TensorSpec([], tf.bool), "v": tf.TensorSpec([2], tf.int32),
         "x": tf.TensorSpec([], tf.int32)}


@pytest.mark.parametrize("column,build", [
    ("a", lambda c: c == 3), ("a", lambda c: c != 3), ("a", lambda c: c < 3), ("a", lambda c: c % 2 == 1),
    ("v", lambda c: c == 3), ("v", lambda c: c >= 0),
])
def test_data_condition_on_unreadable_column_is_never_met(column, build, caplog):
    sw = reverb.structured_writer
    ref = sw.create_reference_step(_SPEC)
    config = sw.create_config({"x": ref["x"][-1]}, "q", conditions=[build(sw.Condition.data(_SPEC)[column])])
    assert sw.infer_signature([config], _SPEC) == {"x": tf.TensorSpec([], tf.int32, name="x")}
    steps = {"a": np.array([3, 1, 3, 2.5], np.float32), "is_last": np.array([False, False, False, True]),
             "v": np.full([4, 2], 3, np.int32), "x": np.arange(4, dtype=np.int32)}
    episodes = tf.data.Dataset.from_tensors({"steps": tf.data.Dataset.from_tensor_slices(steps)})
    with caplog.at_level(logging.ERROR):
        assert list(transformations.pattern_map(episodes, [config], True)) == []
    assert "Config specified data condition on column" in caplog.text
    caplog.clear()
    server = reverb.Server([reverb.Table.queue("q", 10)])
    try:
        writer = reverb.Client(f"localhost:{server.port}").structured_writer([config])
        with caplog.at_level(logging.ERROR):
            for i in range(4):
                writer.append({k: v[i] for k, v in steps.items()})
            writer.end_episode()
        assert server.table("q").info.current_size == 0
    finally:
        server.stop()
    problem = {"a": "invalid data type float", "v": "does not contain scalar tensors"}[column]
    assert caplog.text.count(problem) == 1  # logged once per writer, not at every step


def test_data_condition_on_integer_and_bool_columns_still_applies():
    sw = reverb.structured_writer
    spec = {"n": tf.TensorSpec([1], tf.int64), "b": tf.TensorSpec([], tf.bool), "x": tf.TensorSpec([], tf.int32)}
    ref = sw.create_reference_step(spec)
    configs = [sw.create_config({"x": ref["x"][-1]}, "q", conditions=[sw.Condition.data(spec)["n"] == 3]),
               sw.create_config({"x": ref["x"][-1]}, "q", conditions=[sw.Condition.data(spec)["b"] == 1])]
    steps = {"n": np.array([[3], [1], [3], [2]], np.int64), "b": np.array([False, True, False, True]),
             "x": np.arange(4, dtype=np.int32)}
    for config, expected in zip(configs, [[0, 2], [1, 3]]):
        dataset = reverb.PatternDataset(tf.data.Dataset.from_tensor_slices(steps), [config], True, lambda s: False)
        assert [int(item["x"]) for item in dataset] == expected


# --- server_executable ---

_CONFIG_TEXT = """
    port: 0
    tables { table_name: "a" max_size: 100 max_times_sampled: 3
             sampler { prioritized { priority_exponent: 0.7 } } remover { fifo: true }
             rate_limiter { samples_per_insert: 2.0 min_size_to_sample: 5 min_diff: -10 max_diff: 10 } }
    tables { table_name: "b" max_size: 10 sampler { uniform: true } remover { lifo: true }
             rate_limiter { samples_per_insert: 1 min_size_to_sample: 1 min_diff: -1 max_diff: 1 } }
"""


def test_tables_from_proto():
    config = text_format.Parse(_CONFIG_TEXT, reverb_config_pb2.ReverbServerConfig())
    a, b = server_from_proto.tables_from_proto(config.tables)
    assert (a.name, a.info.max_size, a.info.max_times_sampled) == ("a", 100, 3)
    assert a.info.sampler_options.prioritized.priority_exponent == pytest.approx(0.7)
    assert a.info.remover_options.fifo and b.info.remover_options.lifo and b.info.sampler_options.uniform
    limiter = a.info.rate_limiter_info
    assert (limiter.samples_per_insert, limiter.min_size_to_sample, limiter.min_diff, limiter.max_diff) == (
        2.0, 5, -10.0, 10.0)
    assert type(server_from_proto.rate_limiter_from_proto(config.tables[0].rate_limiter)) is (
        reverb.rate_limiters.RateLimiter)


def test_tables_from_proto_applies_a_signature():
    from replay_tf.wire import protos

    proto = checkpoint_pb2.PriorityTableCheckpoint(table_name="s", max_size=3)
    proto.sampler.uniform = True
    proto.remover.fifo = True
    proto.rate_limiter.samples_per_insert = 1.0
    proto.rate_limiter.min_size_to_sample = 1
    proto.rate_limiter.min_diff, proto.rate_limiter.max_diff = -1.0, 1.0
    signature = {"obs": tf.TensorSpec([3], tf.float32, name="obs")}
    proto.signature.CopyFrom(protos.encode_signature(signature))
    [table] = server_from_proto.tables_from_proto([proto])
    assert table.info.signature == signature


@pytest.mark.parametrize("options,error,match", [
    (schema_pb2.KeyDistributionOptions(fifo=False), ValueError,
     r"^distribution=fifo but the associated boolean value is false\. Set fifo: true"),
    (schema_pb2.KeyDistributionOptions(lifo=False), ValueError, r"^distribution=lifo but the associated boolean"),
    (schema_pb2.KeyDistributionOptions(), NotImplementedError, r"^distribution=None\. Set one of"),
])
def test_selector_from_proto_errors(options, error, match):
    with pytest.raises(error, match=match):
        server_from_proto.selector_from_proto(options)


def test_server_main_serves_the_configured_tables():
    config = text_format.Parse(_CONFIG_TEXT, reverb_config_pb2.ReverbServerConfig())
    server = server_main.server_from_config(config)
    try:
        assert server.port > 0
        info = reverb.Client(f"localhost:{server.port}").server_info()
        assert sorted(info) == ["a", "b"] and info["a"].rate_limiter_info.min_size_to_sample == 5
    finally:
        server.stop()


def test_server_executable_module_paths():
    package = importlib.import_module("replay_tf.server_executable")
    assert importlib.import_module("replay_tf.server_executable.server_from_proto") is server_from_proto
    assert package.server_from_proto is server_from_proto
    assert reverb_config_pb2.ReverbServerConfig.DESCRIPTOR.full_name == "deepmind.reverb.ReverbServerConfig"
    assert isinstance(reverb_config_pb2.ReverbServerConfig().tables.add(), pb_message.Message)
