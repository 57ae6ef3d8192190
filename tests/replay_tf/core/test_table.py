"""Table: TableInfo fields, episodes, max_times_sampled, mutate/reset, chunk sharing and bad input."""
import gc
import threading
import weakref

import numpy as np
import pytest
import tensorflow as tf

import reverb_testlib
import replay_tf as reverb
from replay_tf.core import Chunk, ChunkSlice, ChunkStore, Column, Item, SequenceRange


def _item(key, priority=1.0, episode=1, chunk=None, rows=3):
    chunk = chunk or Chunk(key + 10_000, [np.arange(rows, dtype=np.float32)], SequenceRange(episode, 0, rows - 1))
    return Item(key, priority, (Column((ChunkSlice(chunk.key, 0, rows, 0),)),), [chunk])


def _table(**kwargs):
    args = dict(name="t", sampler=reverb.selectors.Uniform(), remover=reverb.selectors.Fifo(), max_size=10,
                rate_limiter=reverb.rate_limiters.MinSize(1))
    args.update(kwargs)
    return reverb.Table(**args)


@pytest.mark.parametrize("kwargs, error", [
    (dict(name=""), "name must be nonempty"),
    (dict(max_size=0), r"max_size \(0\) must be a positive integer"),
    (dict(signature={"a": tf.TensorSpec([], tf.int32), "b": 3}), "Unsupported signature spec: 3"),
    (dict(sampler="uniform"), "sampler must be a selector"),
])
def test_constructor_errors(kwargs, error):
    with pytest.raises((ValueError, TypeError), match=error):
        _table(**kwargs)


def test_server_errors():
    with pytest.raises(ValueError, match="At least one table must be provided"):
        reverb.Server([])
    with pytest.raises(ValueError, match="same name: t"):
        reverb.Server([_table(), _table()])


@pytest.mark.parametrize("priority, sampler, error", [
    (float("nan"), reverb.selectors.Uniform(), "is NaN"),
    (-1.0, reverb.selectors.Prioritized(1.0), r"priority \(-1.0\) of item 1 must be >= 0"),
    (float("inf"), reverb.selectors.Prioritized(1.0), r"priority \(inf\) of item 1 must be finite"),
])
def test_bad_priorities(priority, sampler, error):
    table = _table(sampler=sampler)
    with pytest.raises(ValueError, match=error):
        table.insert_or_assign(_item(1, priority))
    table.insert_or_assign(_item(2, 1.0))
    with pytest.raises(ValueError, match=error.replace("item 1", "item 2")):
        table.mutate_items(updates=[(2, priority)])
    assert table.size() == 1  # the table keeps working


def test_signature_check_names_the_column():
    table = _table(signature={"obs": tf.TensorSpec([3], tf.float32), "act": tf.TensorSpec([3], tf.int32)})
    chunk = Chunk(7, [np.zeros(3, np.float32), np.zeros(3, np.float32)], SequenceRange(1, 0, 2))
    item = Item(1, 1.0, (Column((ChunkSlice(7, 0, 3, 0),)), Column((ChunkSlice(7, 0, 3, 1),))), [chunk])
    with pytest.raises(ValueError, match=r"column 'act': expected TensorSpec\(shape=\(3,\), dtype=tf.int32.*"
                                         r"got dtype=float32 shape=\[3\]"):
        table.check_signature(item)


def test_reinsert_updates_priority_without_rate_limiting():
    table = _table(sampler=reverb.selectors.MaxHeap(), rate_limiter=reverb.rate_limiters.Queue(1))
    assert table.insert_or_assign(_item(1, 1.0))
    assert not table.insert_or_assign(_item(1, 5.0), timeout_ms=0)  # the queue is full but this is an update
    [sample] = table.sample(1)
    assert sample.priority == 5.0 and table.info.rate_limiter_info.insert_stats.completed == 1


def test_max_times_sampled_and_mutate_order():
    table = _table(sampler=reverb.selectors.Fifo(), max_times_sampled=2)
    for key in (1, 2, 3):
        table.insert_or_assign(_item(key))
    assert [s.key for s in table.sample(3)] == [1, 1, 2]
    assert table.size() == 2
    table.mutate_items(updates=[(3, 9.0), (99, 1.0)], deletes=[3, 98])  # deletes first: 3 is gone
    assert table.get_item(3) is None and table.size() == 1


def test_chunks_are_shared_and_freed():
    store = ChunkStore()
    chunk = store.insert(Chunk(5, [np.zeros((4, 2))], SequenceRange(1, 0, 3)))
    assert store.insert(Chunk(5, [np.zeros((4, 2))], SequenceRange(1, 0, 3))) is chunk  # the same chunk: stored once
    a, b = _table(name="a", max_size=1), _table(name="b", max_size=1)
    a.insert_or_assign(_item(1, chunk=chunk, rows=4))
    b.insert_or_assign(_item(2, chunk=chunk, rows=4))
    ref = weakref.ref(chunk)
    del chunk
    a.insert_or_assign(_item(3))  # evicts item 1; item 2 in table b still holds the chunk
    gc.collect()
    assert ref() is not None and len(store) == 1
    b.reset()
    gc.collect()
    assert ref() is None and len(store) == 0


def test_unknown_table_lists_tables():
    server = reverb.Server([_table(name="a"), _table(name="b")])
    client = reverb.Client(f"localhost:{server.port}")
    with pytest.raises(ValueError, match=r"Priority table c was not found.*\['a', 'b'\]"):
        client.insert(1, {"c": 1.0})
    client.insert(1, {"a": 1.0})  # other tables keep working
    assert client.server_info()["a"].current_size == 1
    server.stop()


def test_concurrent_inserts_and_samples_keep_counts_consistent():
    table = _table(max_size=50, rate_limiter=reverb.rate_limiters.SampleToInsertRatio(1.0, 5, 10.0))
    server = reverb.Server([table])
    keys = iter(range(1, 10**6))
    lock = threading.Lock()

    def insert():
        for _ in range(200):
            with lock:
                key = next(keys)
            table.insert_or_assign(_item(key), timeout_ms=10_000)

    def sample():
        for _ in range(195):
            table.sample(1, timeout_ms=10_000)

    threads = [threading.Thread(target=f, daemon=True) for f in (insert, insert, sample, sample)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    info = table.info
    assert info.rate_limiter_info.insert_stats.completed == 400
    assert info.rate_limiter_info.sample_stats.completed == 390
    server.stop()


_PRELUDE = """
def setup(**kwargs):
    args = dict(name='t', sampler=reverb.selectors.Fifo(), remover=reverb.selectors.Fifo(), max_size=4,
                rate_limiter=reverb.rate_limiters.MinSize(1))
    args.update(kwargs)
    server = reverb.Server([reverb.Table(**args)])
    return server, reverb.Client(f'localhost:{server.port}')

def info_fields(info):
    rl = info.rate_limiter_info
    return [info.name, info.max_size, info.max_times_sampled, info.current_size, info.num_episodes,
            info.num_deleted_episodes, info.num_unique_samples, rl.samples_per_insert, rl.min_diff, rl.max_diff,
            rl.min_size_to_sample, rl.insert_stats.completed, rl.sample_stats.completed,
            info.sampler_options.WhichOneof('distribution'), info.remover_options.WhichOneof('distribution'),
            sorted((k, repr(v)) for k, v in (info.signature or {}).items())]

def write_episodes(client, lengths, item_length=3):
    with client.trajectory_writer(num_keep_alive_refs=item_length) as writer:
        for length in lengths:
            for step in range(length):
                writer.append({'x': np.float32(step), 'y': np.int64(step)})
                if step + 1 >= item_length:
                    writer.create_item('t', 1.0, {'x': writer.history['x'][-item_length:],
                                                  'y': writer.history['y'][-item_length:]})
            writer.end_episode()
"""

SCENARIOS = {
    "info_after_episodes": _PRELUDE + """
server, client = setup(signature={'x': tf.TensorSpec([3], tf.float32), 'y': tf.TensorSpec([3], tf.int64)})
write_episodes(client, [5, 4, 6])
emit('after_write', info_fields(client.server_info()['t']))
for _ in client.sample('t', 3, emit_timesteps=False):
    pass
emit('after_sample', info_fields(client.server_info()['t']))
client.reset('t')
emit('after_reset', info_fields(client.server_info()['t']))
""",
    "max_times_sampled": _PRELUDE + """
server, client = setup(max_times_sampled=2, max_size=10)
write_episodes(client, [5])
seen = [[float(v) for v in s.data[0]] for s in client.sample('t', 5, emit_timesteps=False)]
emit('seen', seen)
emit('info', info_fields(client.server_info()['t']))
""",
    "queue_and_stack": """
for maker in [reverb.Table.queue, reverb.Table.stack]:
    server = reverb.Server([maker('q', 3)])
    client = reverb.Client(f'localhost:{server.port}')
    for i in range(3):
        client.insert(np.int32(i), {'q': 1.0})
    emit(maker.__name__, [int(s[0].data[0]) for s in client.sample('q', 3)])
    info = client.server_info()['q']
    emit(maker.__name__ + '_info', [info.max_times_sampled, info.current_size,
                                    info.sampler_options.WhichOneof('distribution'),
                                    info.rate_limiter_info.max_diff])
""",
    "mutate_priorities": _PRELUDE + """
server, client = setup(sampler=reverb.selectors.MaxHeap(), max_size=10)
for i, p in enumerate([1.0, 2.0, 3.0]):
    client.insert(np.int32(i), {'t': p})
keys = {int(s[0].data[0]): int(s[0].info.key) for s in client.sample('t', 1)}
[top] = next(client.sample('t'))
client.mutate_priorities('t', updates={int(top.info.key): 0.5, 12345: 9.0}, deletes=[12346])
emit('after_update', [int(s[0].data[0]) for s in client.sample('t', 2)])
client.mutate_priorities('t', updates={int(top.info.key): 7.0}, deletes=[int(top.info.key)])
emit('after_delete', [client.server_info()['t'].current_size, int(next(client.sample('t'))[0].data[0])])
""",
}


peer_results, local_results, test_matches_reverb = reverb_testlib.differential_tests(SCENARIOS)


def test_local_scenarios_run_without_errors(local_results):
    assert not {k: v for k, v in local_results.items() if k.endswith(".error")}


def test_worker_time_measures_rate_limiter_waits():
    # Queue(1): a second insert waits for a sample; an empty queue's sample waits for an insert.
    table = _table(rate_limiter=reverb.rate_limiters.Queue(1))
    before = table.info.table_worker_time
    assert (before.waiting_for_sampling_ms, before.waiting_for_inserts_ms) == (0, 0)
    with pytest.raises(reverb.errors.DeadlineExceededError):
        table.sample(1, timeout_ms=120)
    assert table.insert_or_assign(_item(1))
    with pytest.raises(reverb.errors.DeadlineExceededError):
        table.insert_or_assign(_item(2), timeout_ms=80)
    table.sample(1)
    worker_time = table.info.table_worker_time
    assert 120 <= worker_time.waiting_for_inserts_ms < 1000
    assert 80 <= worker_time.waiting_for_sampling_ms < 1000
    assert worker_time.inserting_ms < 80 and worker_time.sampling_ms < 80  # waits are not counted as work
    assert worker_time.running_ms >= 200
    assert worker_time.running_ms == pytest.approx(
        worker_time.sleeping_ms + worker_time.inserting_ms + worker_time.sampling_ms
        + worker_time.waiting_for_inserts_ms + worker_time.waiting_for_sampling_ms, abs=5)
