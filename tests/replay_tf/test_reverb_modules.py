"""Reverb's module paths that user code imports (`reverb.reverb_types`, `reverb.replay_sample`,
`reverb.item_selectors`, `reverb.server.TableExtensionBase`, `reverb.checkpointers.CheckpointerBase`),
checked against dm-reverb: the names are there and are the same objects as the top-level ones."""
import dataclasses
import importlib

import pytest
import tensorflow as tf

import reverb_testlib
import replay_tf as reverb

SCENARIOS = {
    "module_paths": """
import dataclasses, importlib
module = lambda name: importlib.import_module(f'{reverb.__name__}.{name}')
for name, names in [('reverb_types', ['Fifo', 'Heap', 'Lifo', 'Prioritized', 'SelectorType', 'SpecNest', 'TableInfo',
                                      'Uniform']),
                    ('replay_sample', ['ReplaySample', 'SampleInfo']),
                    ('item_selectors', ['Fifo', 'Lifo', 'MaxHeap', 'MinHeap', 'Prioritized', 'Uniform']),
                    ('server', ['Server', 'Table', 'TableExtensionBase']),
                    ('rate_limiters', ['MinSize', 'Queue', 'RateLimiter', 'SampleToInsertRatio', 'Stack'])]:
    emit(name, [n for n in names if hasattr(module(name), n)])
    emit(name + '_attribute', getattr(reverb, name) is module(name))  # an attribute once `reverb` is imported
emit('checkpointers', [n for n in ['CheckpointerBase', 'DefaultCheckpointer', 'TempDirCheckpointer',
                                   'default_checkpointer'] if hasattr(reverb.checkpointers, n)])
types, samples, selectors = module('reverb_types'), module('replay_sample'), module('item_selectors')
emit('same_objects', [samples.ReplaySample is reverb.ReplaySample, samples.SampleInfo is reverb.SampleInfo,
                      selectors.Fifo is reverb.selectors.Fifo, selectors.MaxHeap is reverb.selectors.MaxHeap,
                      types.Uniform is reverb.selectors.Uniform, types.Prioritized is reverb.selectors.Prioritized,
                      module('server').Table is reverb.Table])
emit('heap', [repr(types.Heap(True)) == repr(reverb.selectors.MinHeap()),
              repr(types.Heap(False)) == repr(reverb.selectors.MaxHeap())])
emit('sample_info', [list(samples.SampleInfo._fields), list(samples.SampleInfo.zeros()),
                     [d.name for d in samples.SampleInfo.tf_dtypes()], list(samples.ReplaySample._fields)])
emit('table_info_fields', [f.name for f in dataclasses.fields(types.TableInfo)])
emit('checkpointer_base', [issubclass(reverb.checkpointers.DefaultCheckpointer, reverb.checkpointers.CheckpointerBase),
                           isinstance(reverb.checkpointers.TempDirCheckpointer(),
                                      reverb.checkpointers.CheckpointerBase)])
server = reverb.Server([reverb.Table('t', types.Heap(False), types.Heap(True), 3, reverb.rate_limiters.MinSize(1),
                                     max_times_sampled=1)])
client = reverb.Client(f'localhost:{server.port}')
for i, priority in enumerate([3.0, 1.0, 2.0, 5.0]):  # the min-heap remover drops priority 1.0 (item 1)
    client.insert(np.int32(i), priorities={'t': priority})
emit('heaps', [np.asarray(s.data[0]).tolist() for s in client.sample('t', 3, emit_timesteps=False)])  # by priority
""",
    "table_info_from_serialized_proto": """
import base64
# A TableInfo proto: Prioritized(0.8) sampler, Fifo remover, max_size 10, max_times_sampled 5,
# SampleToInsertRatio(2.0, 3, 4.0), signature {'a': f32[2] named 'a', 'b': (i64[None, 3],)}, current_size 7,
# num_episodes 2, running_ms 9, 11 inserts completed.
info = reverb.reverb_types.TableInfo.from_serialized_proto(base64.b64decode(
    'CgsaCQmamZmZmZnpPxIECAE4ARgKIAUqIwkAAAAAAAAAQBEAAAAAAAAAQBkAAAAAAAAkQCADKgIQCzIAMjyqAzkKEwoBYRIOigILCgFhEgQSAggC'
    'GAEKIgoBYhIdogMaChiKAhUSERILCP///////////wESAggDGAk4B0IBeEgCYgIICQ=='))
emit('table_info', [info.name, info.max_size, info.max_times_sampled, info.current_size, info.num_episodes,
                    info.num_deleted_episodes, info.num_unique_samples, info.sampler_options.WhichOneof('distribution'),
                    round(info.sampler_options.prioritized.priority_exponent, 6),
                    info.remover_options.WhichOneof('distribution'), info.remover_options.is_deterministic])
limiter = info.rate_limiter_info
emit('table_info_limiter', [limiter.samples_per_insert, limiter.min_diff, limiter.max_diff, limiter.min_size_to_sample,
                            limiter.insert_stats.completed, limiter.sample_stats.completed,
                            info.table_worker_time.running_ms])
emit('table_info_signature', tf.nest.map_structure(lambda spec: [spec.name, spec.shape.as_list(), spec.dtype.name],
                                                   info.signature))
""",
}


peer_results, local_results, test_matches_reverb = reverb_testlib.differential_tests(SCENARIOS)


def test_local_scenarios_run_without_errors(local_results):
    assert not {k: v for k, v in local_results.items() if k.endswith(".error")}


def test_modules_re_export_the_package_objects():
    from replay_tf import item_selectors
    import replay_tf.replay_sample
    import replay_tf.reverb_types
    import replay_tf.server

    assert replay_tf.replay_sample.ReplaySample is reverb.ReplaySample
    assert replay_tf.replay_sample.SampleInfo is reverb.SampleInfo
    assert all(getattr(item_selectors, name) is getattr(reverb.selectors, name) for name in item_selectors.__all__)
    assert replay_tf.reverb_types.TableInfo is importlib.import_module("replay_tf.wire.table_info").TableInfo
    assert replay_tf.reverb_types.Heap(True) == reverb.selectors.MinHeap()
    assert replay_tf.reverb_types.Heap(False) == reverb.selectors.MaxHeap()
    assert replay_tf.server.TableExtensionBase is importlib.import_module("replay_tf.core.table").TableExtensionBase
    assert [f.name for f in dataclasses.fields(replay_tf.reverb_types.TableInfo)][:3] == [
        "name", "sampler_options", "remover_options"]
    assert replay_tf.reverb_types.SpecNest.__args__[0] is tf.TensorSpec


def test_checkpointer_base_is_what_the_server_calls(tmp_path):
    class Recording(reverb.checkpointers.CheckpointerBase):
        def __init__(self):
            self.calls = []

        def save(self, server):
            self.calls.append("save")
            return str(tmp_path)

        def load_latest(self, server):
            self.calls.append("load_latest")
            return False

    checkpointer = Recording()
    server = reverb.Server([reverb.Table.queue("q", 10)], checkpointer=checkpointer)
    assert reverb.Client(f"localhost:{server.port}").checkpoint() == str(tmp_path)
    assert checkpointer.calls == ["load_latest", "save"]
    server.stop()
    with pytest.raises(TypeError, match="abstract"):
        type("ReverbStyle", (reverb.checkpointers.CheckpointerBase,), {"internal_checkpointer": lambda self: None})()


@pytest.mark.peer
def test_every_public_name_of_dm_reverb_is_here(peer):
    names = peer.run("import reverb\nemit('names', sorted(n for n in dir(reverb) if not n.startswith('_')))")["names"]
    compiled_core = {"cc", "libpybind", "platform", "pybind"}  # dm-reverb's C++ core, which this package replaces
    assert "TimestepDataset" in names and "Writer" in names  # (the peer answered with its real list)
    assert [name for name in names if name not in compiled_core and not hasattr(reverb, name)] == []
