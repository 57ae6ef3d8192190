"""The transport-free replay server core: Reverb's data model and table semantics in plain Python.

Nothing here knows about gRPC or serialization; the in-process client and the gRPC service
(`replay_tf/grpc/`) are thin adapters over these objects.

Data model (`chunk_store`):
  `Chunk(key, tensors, SequenceRange(episode_id, start, end, sparse=False), delta_encoded=False,
  encoded=None, decoder=None)`: column tensors (numpy, steps on dim 0) keyed by a uint64. `encoded` is a slot
  where a transport caches the encoded `ChunkData`; a chunk may also be built from `encoded` + `decoder`
  and is then decoded on first access of `.tensors`.
  `Item(key, priority, trajectory, chunks, times_sampled=0)`: `trajectory` is a flat trajectory, a tuple of
  `Column(slices=(ChunkSlice(chunk_key, offset, length, index), ...), squeeze)`; `chunks` are the `Chunk`s
  it refers to (exactly the keys used by the trajectory); `item.trajectory` / `item.chunks` give them back.
  `Item.from_resolved(key, priority, columns, episode_ids)` builds an item from already valid resolved
  columns `(squeeze, chunk, index, start, stop, ...)` without validation (writers, the gRPC service).
  `item.column_arrays()` unpacks the data.
  Items hold their chunks; chunks are freed (Python refcounting) when no item or writer refers to them.
  `ChunkStore` dedups chunks by key with weak references (e.g. across insert streams).

Table (`table.Table`, the base of the public `replay_tf.Table`):
  `insert_or_assign(item, timeout_ms=None) -> bool` blocks on the rate limiter; an existing key updates
  the priority instead (not rate-limited); overflow deletes the remover's choice after inserting.
  `sample(num_samples, timeout_ms=None) -> [SampledItem(item, priority, times_sampled, probability,
  table_size, rate_limited)]` is a flexible batch: waits for the first admitted sample, returns up to
  `num_samples` admitted without waiting again.
  `mutate_items(updates=[(key, priority)], deletes=[key])`: deletes first, then updates; unknown keys ignored.
  `insert_queue` (`insert_queue.InsertQueue`): the items the rate limiter holds back, inserted in order by a
  worker thread; `put(item, owner)` inserts now or queues. Both transports' insert streams use it.
  `reset()`, `close()` (blocked and later calls raise `errors.CancelledError`), `status -> TableStatus`,
  `check_priority(key, priority)`, `check_signature(item)`, `can_sample(n)`, `can_insert(n)`,
  `items_snapshot()`, `state_snapshot()`, `restore(items, state)` for checkpoints.
  Timeouts: `timeout_ms=None` waits forever, `0` fails at once when blocked; on expiry
  `errors.DeadlineExceededError(errors.RATE_LIMITER_TIMEOUT_MESSAGE)`.

Selectors and rate limiters (`selectors`, `rate_limiters`): Reverb's configs (`Uniform`, `Prioritized`,
`Fifo`, `Lifo`, `MaxHeap`, `MinHeap`; `MinSize`, `SampleToInsertRatio`, `Queue`, `Stack`) with
`options()` / `info()` mirroring Reverb's `KeyDistributionOptions` / `RateLimiterInfo` protos, and
`selectors.from_options` to rebuild a selector from options.
"""
from replay_tf.core.chunk_store import Chunk
from replay_tf.core.chunk_store import ChunkSlice
from replay_tf.core.chunk_store import ChunkStore
from replay_tf.core.chunk_store import Column
from replay_tf.core.chunk_store import Item
from replay_tf.core.chunk_store import SequenceRange
from replay_tf.core.table import SampledItem
from replay_tf.core.table import Table
from replay_tf.core.table import TableStatus
from replay_tf.core.table import TableWorkerTime

__all__ = [
    "Chunk",
    "ChunkSlice",
    "ChunkStore",
    "Column",
    "Item",
    "SampledItem",
    "SequenceRange",
    "Table",
    "TableStatus",
    "TableWorkerTime",
]
