"""TrajectoryWriter: history indexing, items, episodes, flush/timeouts and validation, against dm-reverb."""
import numpy as np
import pytest

import reverb_testlib
import replay_tf as reverb

_PRELUDE = """
def setup(signature=None, rate_limiter=None, max_size=100):
    table = reverb.Table('t', reverb.selectors.Fifo(), reverb.selectors.Fifo(), max_size,
                         rate_limiter or reverb.rate_limiters.MinSize(1), signature=signature)
    server = reverb.Server([table])
    return server, reverb.Client(f'localhost:{server.port}')

def drain(client, n):
    return [[np.asarray(c).tolist() for c in s.data] for s in client.sample('t', n, emit_timesteps=False)]

def attempt(name, fn, message=False):
    try:
        fn()
        emit(name, 'ok')
    except Exception as e:
        emit(name, type(e).__name__ + (': ' + str(e) if message else ''))
"""

SCENARIOS = {
    "history_indexing": _PRELUDE + """
server, client = setup()
writer = client.trajectory_writer(num_keep_alive_refs=4)
for i in range(5):
    writer.append({'a': np.float32(i), 'b': np.array([i, -i], np.int32)})
h = writer.history
emit('lens', [len(h['a']), len(h['b'])])
writer.create_item('t', 1.0, [h['a'][-1], h['a'][1:4], h['b'][[-1, -3]], h['a'][-2:], h['b'][3]])
writer.create_item('t', 2.0, {'x': h['a'][-4::2], 'y': h['b'][-4:-1]})
writer.flush()
emit('items', drain(client, 2))
emit('shapes', [list(h['a'][-3:].shape), list(h['b'][-1].shape), str(h['b'][-1].dtype)])
emit('numpy', h['b'][-2:].numpy().tolist())
""",
    "expired_and_missing": _PRELUDE + """
server, client = setup()
writer = client.trajectory_writer(num_keep_alive_refs=2)
for i in range(4):
    writer.append({'a': np.float32(i)})
writer.append({'b': np.float32(9)})
attempt('expired', lambda: writer.history['a'][-3:])
attempt('expired_int', lambda: writer.history['a'][0])
attempt('missing', lambda: writer.history['b'][-2:])
attempt('gap_last_a', lambda: writer.history['a'][-1])
emit('lens', [len(writer.history['a']), len(writer.history['b'])])
""",
    "partial_steps": _PRELUDE + """
server, client = setup()
writer = client.trajectory_writer(num_keep_alive_refs=3)
writer.append({'obs': np.float32(1)}, partial_step=True)
emit('steps_open', writer.episode_steps)
attempt('twice', lambda: writer.append({'obs': np.float32(2)}, partial_step=True), message=True)
writer.append({'act': np.int32(5)})
emit('steps_closed', writer.episode_steps)
writer.append({'obs': np.float32(3), 'act': np.int32(6)})
writer.create_item('t', 1.0, {'o': writer.history['obs'][-2:], 'a': writer.history['act'][-2:]})
writer.end_episode()
emit('after_end', [writer.episode_steps, len(writer.history['obs'])])
emit('items', drain(client, 1))
""",
    "column_validation": _PRELUDE + """
server, client = setup()
writer = client.trajectory_writer(num_keep_alive_refs=3)
writer.append({'a': np.zeros([2], np.float32)})
attempt('dtype', lambda: writer.append({'a': np.zeros([2], np.float64)}))
attempt('shape', lambda: writer.append({'a': np.zeros([3], np.float32)}))
writer.append({'a': np.ones([2], np.float32)})
attempt('not_column', lambda: writer.create_item('t', 1.0, {'a': 3}))
attempt('nan_priority', lambda: writer.create_item('t', float('nan'), writer.history['a'][-1:]))
attempt('squeeze_many', lambda: reverb.TrajectoryColumn(list(writer.history['a'][-2:]), squeeze=True), True)
attempt('flush_negative', lambda: writer.flush(-1), message=True)
attempt('configure_zero', lambda: writer.configure(('a',), num_keep_alive_refs=0, max_chunk_length=None), True)
attempt('configure_chunk', lambda: writer.configure(('a',), num_keep_alive_refs=2, max_chunk_length=3), True)
attempt('unknown_table', lambda: writer.create_item('nope', 1.0, writer.history['a'][-1:]))
attempt('keep_alive_zero', lambda: client.trajectory_writer(0), message=True)
fresh = client.trajectory_writer(2)
attempt('history_before_append', lambda: fresh.history, message=True)
writer.create_item('t', 1.0, writer.history['a'][-2:])
writer.flush()
emit('items', drain(client, 1))
""",
    "signature_validation": _PRELUDE + """
server, client = setup(signature={'obs': tf.TensorSpec([2, 3], tf.float32), 'act': tf.TensorSpec([2], tf.int64)})
writer = client.trajectory_writer(num_keep_alive_refs=3)
for i in range(3):
    writer.append({'obs': np.full([3], i, np.float32), 'act': np.int64(i)})
h = writer.history
attempt('ok', lambda: writer.create_item('t', 1.0, {'obs': h['obs'][-2:], 'act': h['act'][-2:]}))
attempt('wrong_length', lambda: writer.create_item('t', 1.0, {'obs': h['obs'][-3:], 'act': h['act'][-2:]}))
attempt('wrong_dtype', lambda: writer.create_item('t', 1.0, {'obs': h['obs'][-2:], 'act': h['obs'][-2:]}))
attempt('too_few', lambda: writer.create_item('t', 1.0, {'obs': h['obs'][-2:]}))
unchecked = client.trajectory_writer(num_keep_alive_refs=3, validate_items=False)
unchecked.append({'z': np.int8(1)})
attempt('unvalidated', lambda: unchecked.create_item('t', 1.0, unchecked.history['z'][-1:]))
writer.flush()
attempt('unvalidated_flush', lambda: unchecked.flush(timeout_ms=2000))
emit('size', client.server_info()['t'].current_size)
""",
    "flush_timeout": _PRELUDE + """
server, client = setup(rate_limiter=reverb.rate_limiters.Queue(1), max_size=1)
writer = client.trajectory_writer(num_keep_alive_refs=1)
for i in range(3):
    writer.append({'a': np.int32(i)})
    writer.create_item('t', 1.0, writer.history['a'][-1:])
attempt('flush', lambda: writer.flush(timeout_ms=50), message=True)
attempt('flush_keep_2', lambda: writer.flush(2, timeout_ms=50), message=True)
attempt('end_episode', lambda: writer.end_episode(timeout_ms=50), message=True)
emit('episode_steps', writer.episode_steps)
got = drain(client, 1)
writer.flush(1, timeout_ms=5000)
got += drain(client, 1)
writer.flush(timeout_ms=5000)
emit('items', got + drain(client, 1))
""",
    "structure_growth_and_episodes": _PRELUDE + """
server, client = setup()
with client.trajectory_writer(num_keep_alive_refs=5) as writer:
    for episode in range(2):
        for i in range(3):
            writer.append({'action': np.float32(10 * episode + i), 'observation': np.int32(10 * episode + i)})
        writer.append({'observation': np.int32(99)})
        attempt(f'sliced{episode}', lambda: writer.create_item('t', 1.0, {
            'actions': writer.history['action'][:-1], 'observations': writer.history['observation'][:]}))
        writer.create_item('t', 1.0, {'actions': writer.history['action'][-4:-1],
                                      'observations': writer.history['observation'][-4:]})
        writer.end_episode(clear_buffers=(episode == 1))
        emit(f'lens{episode}', [len(writer.history['action']), len(writer.history['observation'])])
info = client.server_info()['t']
emit('episodes', [info.num_episodes, info.current_size])
emit('items', drain(client, 2))
""",
}


peer_results, local_results, test_matches_reverb = reverb_testlib.differential_tests(SCENARIOS)


def test_local_scenarios_run_without_errors(local_results):
    assert not {k: v for k, v in local_results.items() if k.endswith(".error")}


@pytest.fixture
def client():
    server = reverb.Server([reverb.Table("t", reverb.selectors.Fifo(), reverb.selectors.Fifo(), 100,
                                         reverb.rate_limiters.MinSize(1))])
    yield reverb.Client(f"localhost:{server.port}")
    server.stop()


@pytest.mark.parametrize("action, error", [
    (lambda w: w.append({"a": np.zeros([2], np.float64)}),
     r"wrong dtype provided for column \['a'\]. Got float64 but expected float32"),
    (lambda w: w.append({"a": np.zeros([3], np.float32)}),
     r"incompatible shape provided for column \['a'\]. Got \[3\] which is incompatible with \[2\]"),
    (lambda w: w.create_item("nope", 1.0, w.history["a"][-1:]),
     r"table 'nope' since the table could not be found. Available tables: \['t'\]"),
    (lambda w: w.history["a"][-3:], r"TrajectoryColumns cannot contain any None data references"),
])
def test_error_messages(client, action, error):
    writer = client.trajectory_writer(num_keep_alive_refs=2)
    writer.append({"a": np.zeros([2], np.float32)})
    writer.append({"a": np.ones([2], np.float32)})
    with pytest.raises(ValueError, match=error):
        action(writer)
    writer.create_item("t", 1.0, writer.history["a"][-2:])  # the writer keeps working
    writer.flush(timeout_ms=5000)


def test_long_items_span_chunks_and_chunks_are_freed(client):
    import gc
    import weakref
    writer = client.trajectory_writer(num_keep_alive_refs=8)
    writer.configure(("a",), num_keep_alive_refs=8, max_chunk_length=3)
    for i in range(10):
        writer.append({"a": np.int64(i)})
    writer.create_item("t", 1.0, writer.history["a"][-8:])
    writer.flush()
    chunk = writer.history["a"][-1]._data_references[0].chunk
    ref = weakref.ref(chunk)
    del chunk
    [sample] = next(client.sample("t", emit_timesteps=False)).data
    assert sample.tolist() == list(range(2, 10))
    writer.end_episode()
    client.reset("t")
    gc.collect()
    assert ref() is None
