"""A table's pending-insert queue (`replay_tf.core.insert_queue`): one line per table, for the items of the
in-process transport's writers and of the gRPC server's insert streams alike."""
import threading
import time

import numpy as np
import replay_tf as reverb
from replay_tf import errors
from replay_tf.core import insert_queue
from replay_tf.core import table as table_lib
from replay_tf.core.chunk_store import Chunk, ChunkSlice, Column, Item, SequenceRange


class _Owner:
    """An `InsertOwner` that records what happens to its items."""

    def __init__(self, waits_for_room: bool):
        self.waits_for_room = waits_for_room
        self.finished_items: list = []  # (key, error)
        self.queued_count = 0
        self.waits = 0
        self.is_active = True
        self.workers = 0

    def active(self):
        return self.is_active

    def gone(self):
        return errors.CancelledError("owner gone")

    def will_wait(self):
        self.waits += 1

    def queued(self):
        self.queued_count += 1

    def finished(self, item, error):
        self.finished_items.append((item.key, error))

    def start_worker(self, target, table_name):
        self.workers += 1
        threading.Thread(target=target, name=f"test-inserts-{table_name}", daemon=True).start()


def _item(key: int) -> Item:
    chunk = Chunk(key, [np.array([key], np.int64)], SequenceRange(key, 0, 0))
    return Item(key, 1.0, (Column((ChunkSlice(key, 0, 1, 0),), squeeze=True),), [chunk])


def _queue_table(max_size: int) -> table_lib.Table:
    return reverb.Table.queue("q", max_size)


def _wait_until(predicate, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def _keys_sampled(table, n):
    return [table.sample(1, timeout_ms=10_000)[0].item.key for _ in range(n)]


def test_every_table_owns_one_queue_with_reverbs_limit():
    # max(1, min(0.1 * max_size, 1000)), hand-computed
    for max_size, limit in [(1, 1), (19, 1), (20, 2), (500, 50), (10_000, 1000), (50_000, 1000)]:
        table = _queue_table(max_size)
        assert table.insert_queue is table.insert_queue
        assert table.insert_queue.limit == limit, max_size
    assert _queue_table(5).insert_queue is not _queue_table(5).insert_queue


def test_admitted_items_go_in_at_once_and_refused_ones_wait_in_order():
    table = _queue_table(2)
    queue, owner = table.insert_queue, _Owner(waits_for_room=False)
    assert [queue.put(_item(k), owner) for k in (1, 2, 3, 4, 5)] == [True, True, False, False, False]
    assert (len(queue), owner.queued_count, owner.waits, owner.workers) == (3, 3, 3, 1)
    # (no room check: an owner that does not wait for room is never held, whatever the limit)
    assert _keys_sampled(table, 5) == [1, 2, 3, 4, 5]
    _wait_until(lambda: len(owner.finished_items) == 3)
    assert owner.finished_items == [(3, None), (4, None), (5, None)]


def test_an_item_waits_behind_queued_items_even_when_the_table_has_room():
    table = _queue_table(1)
    queue, owner = table.insert_queue, _Owner(waits_for_room=False)
    assert queue.put(_item(1), owner) and not queue.put(_item(2), owner)
    assert _keys_sampled(table, 1) == [1]
    # Item 2 may be going in now; item 3 must not jump ahead of it.
    assert not queue.put(_item(3), owner) or len(queue) == 0
    assert _keys_sampled(table, 2) == [2, 3]


def test_a_full_queue_holds_an_owner_that_waits_for_room_until_an_item_goes_in():
    table = _queue_table(10)  # limit 1
    queue, owner = table.insert_queue, _Owner(waits_for_room=True)
    for k in range(10):
        assert queue.put(_item(k), owner)
    assert not queue.put(_item(10), owner)
    returned = threading.Event()
    putter = threading.Thread(target=lambda: (queue.put(_item(11), owner), returned.set()))
    putter.start()
    assert not returned.wait(0.5)  # held: the queue is at its limit
    assert _keys_sampled(table, 1) == [0]  # item 10 goes in, room for item 11
    assert returned.wait(10)
    putter.join()
    assert _keys_sampled(table, 11) == list(range(1, 12))


def test_a_held_owner_that_goes_away_gets_its_gone_error():
    table = _queue_table(10)
    queue, owner = table.insert_queue, _Owner(waits_for_room=True)
    for k in range(11):
        queue.put(_item(k), owner)
    failure = []

    def put():
        try:
            queue.put(_item(11), owner)
        except errors.CancelledError as e:
            failure.append(str(e))

    putter = threading.Thread(target=put)
    putter.start()
    owner.is_active = False
    putter.join(10)
    assert failure == ["owner gone"]
    # The queued item of the inactive owner is dropped, not inserted, and reported with the same error.
    _wait_until(lambda: owner.finished_items)
    assert [(key, str(error)) for key, error in owner.finished_items] == [(10, "owner gone")]
    assert len(table) == 10


def test_drop_removes_only_that_owners_waiting_items():
    table = _queue_table(1)
    queue, first, second = table.insert_queue, _Owner(False), _Owner(False)
    assert queue.put(_item(1), first)
    for key, owner in [(2, first), (3, second), (4, first), (5, second)]:
        assert not queue.put(_item(key), owner)
    # Item 2 is the one the worker tries to insert; it stays (it may still land), 4 goes.
    _wait_until(lambda: queue._current is not None)
    assert queue.drop(first, wait_s=0.0) == 1
    assert _keys_sampled(table, 4) == [1, 2, 3, 5]


def test_in_process_and_grpc_streams_share_the_tables_queue(monkeypatch):
    server = reverb.Server([reverb.Table.queue("t", 10)])  # queue limit 1
    try:
        table = server.tables["t"]
        writer = server.localhost_client().trajectory_writer(num_keep_alive_refs=1)
        for i in range(12):  # 10 go in, 2 wait: an in-process writer is never held by the limit
            writer.append({"a": np.int64(i)})
            writer.create_item("t", 1.0, writer.history["a"][-1:])
        assert len(table) == 10
        # The gRPC service sees the in-process writer's waiting items in the table's queue.
        assert server._service.servicer.pending_inserts("t") == (2, 1)

        from replay_tf.grpc.client import client_transport
        from replay_tf.transport import base as transport_lib
        monkeypatch.setattr(transport_lib, "make_transport", client_transport.Transport)
        remote = reverb.Client(f"localhost:{server.port}").trajectory_writer(num_keep_alive_refs=1)
        remote.append({"a": np.int64(100)})
        remote.create_item("t", 1.0, remote.history["a"][-1:])
        flushed = threading.Thread(target=remote.flush)
        flushed.start()
        # One line: the remote item goes in after the in-process items that waited before it.
        values = [int(table.sample(1, timeout_ms=10_000)[0].item.column_arrays()[0][0]) for _ in range(13)]
        assert values == list(range(12)) + [100]
        flushed.join(10)
        assert not flushed.is_alive()
        writer.flush(timeout_ms=5000)
        writer.close()
        remote.close()
    finally:
        server.stop()


def test_items_left_for_a_table_that_is_gone_are_reported_to_their_owner():
    import gc  # noqa: PLC0415
    table = _queue_table(2)
    queue = insert_queue.InsertQueue(table)
    owner = _Owner(waits_for_room=False)
    queue._pending.extend([(_item(1), owner), (_item(2), owner)])  # (as if queued before the table went)
    del table
    gc.collect()
    queue._work()  # (the worker finds no table: it ends, and the owners hear why)
    assert [key for key, _ in owner.finished_items] == [1, 2]
    assert all(isinstance(error, errors.TableNotFoundError) for _, error in owner.finished_items)
    assert len(queue) == 0
