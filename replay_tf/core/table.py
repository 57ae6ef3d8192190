"""A replay table: items, a sampler, a remover and a rate limiter, behind one lock.

All calls are thread-safe. `insert_or_assign` and `sample` block on the rate limiter (waiting on condition
variables that release the lock, so a blocked sampler and a blocked inserter in different threads never
deadlock) until admitted, `timeout_ms` runs out (`DeadlineExceededError` with Reverb's message) or the table
is closed (`CancelledError`). See `replay_tf.core` for the data model.
"""
from __future__ import annotations

import dataclasses
import math
import threading
import time
from typing import Any, Iterable, NamedTuple, Optional, Sequence

import numpy as np

from replay_tf import errors
from replay_tf.core import insert_queue as insert_queue_lib
from replay_tf.core import rate_limiters as rate_limiters_lib
from replay_tf.core import selectors as selectors_lib
from replay_tf.core._arguments import integer
from replay_tf.core.chunk_store import Item
from replay_tf.core.signatures import shape_compatible, signature_entries


@dataclasses.dataclass(frozen=True)
class TableWorkerTime:
    """Reverb's `TableWorkerTime`, measured on the threads that call the table (this core has no worker thread).

    `inserting_ms` and `sampling_ms`: time spent inserting and sampling with the table's lock held, rate-limiter
    waits excluded; `waiting_for_sampling_ms`: time inserts waited for the rate limiter (for more samples);
    `waiting_for_inserts_ms`: time samples waited for it (for more inserts); `running_ms`: time since the table
    was created; `sleeping_ms`: the part of it with none of the above (0 when concurrent calls overlap more).
    Each is summed over the calling threads, in whole milliseconds.
    """
    running_ms: int = 0
    sampling_ms: int = 0
    inserting_ms: int = 0
    sleeping_ms: int = 0
    waiting_for_sampling_ms: int = 0
    waiting_for_inserts_ms: int = 0


@dataclasses.dataclass
class TableStatus:
    """Configuration and state of a table, as the core's plain records (a snapshot).

    Reverb's `TableInfo` (`replay_tf.reverb_types`) carries the same fields as protobuf messages:
    `sampler_options` and `remover_options` are `selectors.KeyDistributionOptions`, `rate_limiter_info` a
    `rate_limiters.RateLimiterInfo`, `table_worker_time` a `TableWorkerTime`, and `signature` a nest of
    `tf.TensorSpec` (or None).
    """
    name: str
    sampler_options: selectors_lib.KeyDistributionOptions
    remover_options: selectors_lib.KeyDistributionOptions
    max_size: int
    max_times_sampled: int
    rate_limiter_info: rate_limiters_lib.RateLimiterInfo
    signature: Any
    current_size: int
    num_episodes: int
    num_deleted_episodes: int
    num_unique_samples: int
    table_worker_time: TableWorkerTime = TableWorkerTime()


class SampledItem(NamedTuple):
    """One sample: the item (its data is `item.column_arrays()`) and the values reported with it."""
    item: Item
    priority: float
    times_sampled: int      # including this sample
    probability: float
    table_size: int
    rate_limited: bool

    @property
    def key(self) -> int:
        return self.item.key


class TableExtensionBase:
    """Base class of table extensions (accepted for API compatibility; none is built in)."""


def _deadline(timeout_ms: Optional[float]) -> Optional[float]:
    """`None` waits forever; `0` fails at once when blocked; otherwise milliseconds from now."""
    if timeout_ms is None:
        return None
    return time.monotonic() + max(0.0, timeout_ms) / 1000.0


class Table:
    """A replay table with Reverb's semantics (`replay_tf.Table` adds Reverb's `info` of protobuf messages).

    Args:
      name: Non-empty table name.
      sampler: Selector choosing the items to sample (`replay_tf.selectors`).
      remover: Selector choosing the item to delete when an insert overflows `max_size`.
      max_size: Maximum number of items.
      rate_limiter: `replay_tf.rate_limiters` config.
      max_times_sampled: Items are deleted after this many samples; < 1 means no limit.
      extensions: Accepted for compatibility; must be `TableExtensionBase` instances.
      signature: Optional nest of `tf.TensorSpec` describing items.

    >>> from replay_tf.core import selectors, rate_limiters
    >>> table = Table('t', selectors.Uniform(), selectors.Fifo(), 10, rate_limiters.MinSize(1))
    >>> table.status.current_size
    0
    """

    def __init__(self, name: str, sampler, remover, max_size: int, rate_limiter, max_times_sampled: int = 0,
                 extensions: Sequence[TableExtensionBase] = (), signature: Any = None):
        if not name:
            raise ValueError("name must be nonempty")
        if max_size <= 0:
            raise ValueError(f"max_size ({max_size}) must be a positive integer")
        for argument, selector in (("sampler", sampler), ("remover", remover)):
            if not isinstance(selector, selectors_lib.ItemSelector):
                raise TypeError(f"{argument} must be a selector from replay_tf.selectors (Uniform, Prioritized, "
                                f"Fifo, Lifo, MaxHeap, MinHeap), got {selector!r}")
        if not isinstance(rate_limiter, rate_limiters_lib.RateLimiter):
            raise TypeError(f"rate_limiter must be a replay_tf.rate_limiters.RateLimiter, got {rate_limiter!r}")
        self._name = name
        self._sampler_config = sampler
        self._remover_config = remover
        self._max_size = integer("max_size", max_size)  # Python floats, 3.0 too: TypeError (as Reverb)
        self._max_times_sampled = integer("max_times_sampled", max_times_sampled)
        self._rate_limiter_config = rate_limiter
        self._extensions = tuple(extensions)
        self._signature = signature
        self._signature_entries = signature_entries(signature) if signature is not None else None
        self._prioritized = any(isinstance(s, selectors_lib.Prioritized) for s in (sampler, remover))

        self._lock = threading.Lock()
        self._insert_cv = threading.Condition(self._lock)
        self._sample_cv = threading.Condition(self._lock)
        self._items: dict = {}
        self._sampler = sampler._build()
        self._remover = remover._build()
        self._limiter = rate_limiter._build()
        self._episode_refs: dict = {}
        self._num_deleted_episodes = 0
        self._num_unique_samples = 0
        self._num_waiting = 0
        self._closed = False
        self._refusing_inserts = False
        self._created_s = time.monotonic()
        self._inserting_s = self._sampling_s = 0.0  # TableWorkerTime's sums, in seconds
        self._waiting_for_sampling_s = self._waiting_for_inserts_s = 0.0
        #: The items the rate limiter holds back, inserted in order by a worker (`insert_queue.InsertQueue`).
        self.insert_queue = insert_queue_lib.InsertQueue(self)

    # --- constructors (Reverb's) ---

    @classmethod
    def queue(cls, name: str, max_size: int, extensions: Sequence[TableExtensionBase] = (),
              signature: Any = None) -> "Table":
        """A FIFO queue: Fifo sampler and remover, `max_times_sampled=1`, `Queue(max_size)` limiter."""
        max_size = integer("max_size", max_size)  # before `Queue(max_size)`, which takes any size >= 1
        return cls(name=name, sampler=selectors_lib.Fifo(), remover=selectors_lib.Fifo(), max_size=max_size,
                   max_times_sampled=1, rate_limiter=rate_limiters_lib.Queue(max_size), extensions=extensions,
                   signature=signature)

    @classmethod
    def stack(cls, name: str, max_size: int, extensions: Sequence[TableExtensionBase] = (),
              signature: Any = None) -> "Table":
        """A LIFO stack: Lifo sampler and remover, `max_times_sampled=1`, `Stack(max_size)` limiter."""
        max_size = integer("max_size", max_size)  # before `Stack(max_size)`, which takes any size >= 1
        return cls(name=name, sampler=selectors_lib.Lifo(), remover=selectors_lib.Lifo(), max_size=max_size,
                   max_times_sampled=1, rate_limiter=rate_limiters_lib.Stack(max_size), extensions=extensions,
                   signature=signature)

    def replace(self, name=None, sampler=None, remover=None, max_size=None, rate_limiter=None,
                max_times_sampled=None, extensions=None, signature=None) -> "Table":
        """A new empty table with this one's settings except those given."""
        pick = lambda new, old: old if new is None else new  # noqa: E731
        return type(self)(name=pick(name, self._name), sampler=pick(sampler, self._sampler_config),
                           remover=pick(remover, self._remover_config), max_size=pick(max_size, self._max_size),
                           rate_limiter=pick(rate_limiter, self._rate_limiter_config),
                           max_times_sampled=pick(max_times_sampled, self._max_times_sampled),
                           extensions=pick(extensions, self._extensions), signature=pick(signature, self._signature))

    # --- properties ---

    @property
    def name(self) -> str:
        return self._name

    @property
    def signature(self) -> Any:
        return self._signature

    @property
    def max_size(self) -> int:
        return self._max_size

    @property
    def max_times_sampled(self) -> int:
        return self._max_times_sampled

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def status(self) -> TableStatus:
        """The table's configuration and state (a snapshot)."""
        with self._lock:
            return TableStatus(
                name=self._name,
                sampler_options=self._sampler_config.options(),
                remover_options=self._remover_config.options(),
                max_size=self._max_size,
                max_times_sampled=self._max_times_sampled,
                rate_limiter_info=self._limiter.info(),
                signature=self._signature,
                current_size=len(self._items),
                num_episodes=len(self._episode_refs),
                num_deleted_episodes=self._num_deleted_episodes,
                num_unique_samples=self._num_unique_samples,
                table_worker_time=self._worker_time_locked(),
            )

    def _worker_time_locked(self) -> TableWorkerTime:
        running = time.monotonic() - self._created_s
        busy = (self._inserting_s, self._sampling_s, self._waiting_for_sampling_s, self._waiting_for_inserts_s)
        inserting, sampling, waiting_for_sampling, waiting_for_inserts = (int(v * 1000) for v in busy)
        return TableWorkerTime(running_ms=int(running * 1000), sampling_ms=sampling, inserting_ms=inserting,
                               sleeping_ms=int(max(0.0, running - sum(busy)) * 1000),
                               waiting_for_sampling_ms=waiting_for_sampling,
                               waiting_for_inserts_ms=waiting_for_inserts)

    def size(self) -> int:
        return len(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def can_sample(self, num_samples: int) -> bool:
        """Whether the rate limiter would admit `num_samples` samples now (ignores the table's content)."""
        with self._lock:
            return self._limiter.can_sample(num_samples)

    def can_insert(self, num_inserts: int) -> bool:
        """Whether the rate limiter would admit `num_inserts` inserts now."""
        with self._lock:
            return self._limiter.can_insert(num_inserts)

    def __repr__(self) -> str:
        return (f"Table(name={self._name!r}, sampler={self._sampler_config!r}, remover={self._remover_config!r}, "
                f"max_size={self._max_size}, rate_limiter={self._rate_limiter_config!r}, "
                f"max_times_sampled={self._max_times_sampled}, signature={self._signature!r})")

    # --- validation ---

    def check_priority(self, key: int, priority: float) -> None:
        """ValueError for a NaN priority, or a negative or infinite one when a selector is `Prioritized`."""
        if math.isnan(priority):
            raise ValueError(f"priority of item {key} for table '{self._name}' is NaN; priorities must be numbers")
        if math.isinf(priority) and self._prioritized:
            # An infinite priority turns the sum tree's totals into inf - inf = NaN: sampling would fail.
            raise ValueError(f"priority ({priority}) of item {key} must be finite: table '{self._name}' uses a "
                             f"Prioritized selector")
        if priority < 0 and self._prioritized:
            raise ValueError(f"priority ({priority}) of item {key} must be >= 0: table '{self._name}' uses a "
                             f"Prioritized selector")
        for config in (self._sampler_config, self._remover_config):
            if isinstance(config, selectors_lib.Prioritized):
                # The table holds up to max_size + 1 items for a moment (insert, then the remover deletes).
                config.check_priority(key, priority, self._max_size + 1, self._name)

    def check_signature(self, item: Item) -> None:
        """ValueError naming the column path when `item`'s columns contradict the table's signature."""
        entries = self._signature_entries
        if entries is None:
            return
        columns = item.column_shapes()
        if len(columns) != len(entries):
            raise ValueError(f"item {item.key} for table '{self._name}' has {len(columns)} columns but the table "
                             f"signature has {len(entries)}: {[e[0] for e in entries]}")
        for (path, dtype, shape, spec), (got_dtype, got_shape) in zip(entries, columns):
            if got_dtype != dtype or not shape_compatible(shape, got_shape):
                raise ValueError(f"item {item.key} for table '{self._name}' does not match the table signature at "
                                 f"column '{path}': expected {spec}, got dtype={np.dtype(got_dtype).name} "
                                 f"shape={list(got_shape)}")

    def check_column_layout(self, key: int, columns: Sequence[tuple]) -> None:
        """`check_signature` for an item known by its columns' `(numpy dtype, shape)` (read from chunk headers,
        nothing decoded): the rule of the insert stream and of checkpoint restores. A length-1 unsqueezed column
        whose step matches the signature is accepted too: Reverb's `client.insert` sends steps so, and Reverb's
        server stores them whatever the signature."""
        entries = self._signature_entries
        if entries is None:
            return
        if len(columns) != len(entries):
            raise ValueError(f"item {key} for table '{self._name}' has {len(columns)} columns but the table "
                             f"signature has {len(entries)}: {[e[0] for e in entries]}")
        for (path, dtype, shape, spec), (got_dtype, got_shape) in zip(entries, columns):
            legacy_step = got_shape[:1] == (1,) and shape_compatible(shape, got_shape[1:])
            if got_dtype != dtype or not (legacy_step or shape_compatible(shape, got_shape)):
                raise ValueError(f"item {key} for table '{self._name}' does not match the table signature at "
                                 f"column '{path}': expected {spec}, got dtype={np.dtype(got_dtype).name} "
                                 f"shape={list(got_shape)}")

    # --- mutation ---

    def insert_or_assign(self, item: Item, timeout_ms: Optional[float] = None) -> bool:
        """Inserts `item` (True), or updates the priority of the item with its key (False, not rate-limited).

        Blocks while the rate limiter refuses the insert. When the table overflows `max_size`, the remover
        then deletes one item, possibly the new one.

        An item whose key is already in the table must be the same item (same trajectory over the same
        chunk data), sent again: e.g. by a writer re-sending its unconfirmed items after a reconnect, or to
        set its priority as Reverb's `InsertOrAssign` does. Reverb also lets a different item under that key
        take only the priority, silently dropping its data; here that is a ValueError naming the key.

        Raises:
          ValueError: for a bad priority, or a different item under a key the table holds.
        """
        self.check_priority(item.key, item.priority)
        with self._lock:
            self._check_inserts_accepted()
            start = time.perf_counter()
            waited = 0.0
            existing = self._items.get(item.key)
            if existing is None:
                if not self._limiter.can_insert(1):
                    waited = self._wait(self._insert_cv, lambda: self._refusing_inserts or self._limiter.can_insert(1),
                                        _deadline(timeout_ms))
                    self._check_inserts_accepted()
                    existing = self._items.get(item.key)
            if existing is not None:
                if existing is not item and not existing.same_data(item):
                    raise ValueError(f"item key {item.key} is already used in table '{self._name}' by an item with "
                                     f"other data: item keys must be unique (only the same item may be sent "
                                     f"again); draw them with replay_tf.core.chunk_store.new_key")
                self._update_locked(existing, item.priority)
                self._inserting_s += time.perf_counter() - start - waited
                return False
            self._check_open()
            item.inserted_at = time.time_ns()
            self._items[item.key] = item
            self._sampler.insert(item)
            self._remover.insert(item)
            self._limiter.inserts += 1
            refs = self._episode_refs
            for episode_id in item.episode_ids:
                refs[episode_id] = refs.get(episode_id, 0) + 1
            if len(self._items) > self._max_size:
                victim, _ = self._remover.sample()
                self._delete_locked(victim)
            if self._num_waiting:
                self._sample_cv.notify_all()
            self._inserting_s += time.perf_counter() - start - waited
            return True

    def mutate_items(self, updates: Iterable[tuple] = (), deletes: Iterable[int] = ()) -> None:
        """Deletes `deletes` keys, then sets `updates` `(key, priority)` pairs; unknown keys are ignored."""
        updates = [(int(k), float(p)) for k, p in updates]
        for key, priority in updates:
            self.check_priority(key, priority)
        with self._lock:
            self._check_inserts_accepted("priority updates or deletes")
            for key in deletes:
                item = self._items.get(int(key))
                if item is not None:
                    self._delete_locked(item)
            for key, priority in updates:
                item = self._items.get(key)
                if item is not None:
                    self._update_locked(item, priority)
            self._insert_cv.notify_all()
            self._sample_cv.notify_all()

    def reset(self) -> None:
        """Deletes every item and resets the rate limiter and the episode and sample counters."""
        with self._lock:
            self._check_inserts_accepted("resets")
            self._items.clear()
            self._sampler.clear()
            self._remover.clear()
            self._limiter.reset()
            self._episode_refs.clear()
            self._num_deleted_episodes = 0
            self._num_unique_samples = 0
            self._insert_cv.notify_all()
            self._sample_cv.notify_all()

    def refuse_inserts(self) -> None:
        """Makes every blocked and future insert, priority update, delete and reset fail with
        `UnavailableError` (sampling goes on): once this returns, no confirmed change reaches the table, so a
        checkpoint taken then holds every change a call confirmed."""
        with self._lock:
            self._refusing_inserts = True
            self._insert_cv.notify_all()

    def close(self) -> None:
        """Fails every blocked and future insert or sample with `CancelledError`."""
        with self._lock:
            self._closed = True
            self._insert_cv.notify_all()
            self._sample_cv.notify_all()

    # --- sampling ---

    def sample(self, num_samples: int = 1, timeout_ms: Optional[float] = None, *,
               cancelled: Optional[threading.Event] = None) -> list:
        """A flexible batch: waits until one sample is admitted, then takes up to `num_samples` at once.

        Returns as many samples as the rate limiter admits without waiting again (at least one). When
        `cancelled` is set (then `wake_waiters()` called), the wait ends with `CancelledError` and nothing
        is taken: a server stops a sampler whose client went away before it consumes an item.
        """
        if num_samples < 1:
            raise ValueError(f"num_samples ({num_samples}) must be >= 1")
        with self._lock:
            start = time.perf_counter()
            waited = 0.0
            limiter = self._limiter
            rate_limited = False
            if not (limiter.can_sample(1) and self._items):
                rate_limited = True
                waited = self._wait(self._sample_cv, lambda: limiter.can_sample(1) and bool(self._items),
                                    _deadline(timeout_ms), cancelled)
            self._check_open()
            if cancelled is not None and cancelled.is_set():
                raise errors.CancelledError(f"sampling from table '{self._name}' was cancelled")
            count = limiter.num_can_sample(num_samples)
            out = []
            if not self._sampler.is_deterministic and self._max_times_sampled < 1:
                # Nothing is deleted while sampling, so the whole batch is drawn in one vectorized call.
                table_size = len(self._items)
                items, probabilities = self._sampler.sample_many(count)
                limiter.samples += count
                for item, probability in zip(items, probabilities):
                    item.times_sampled += 1
                    if item.times_sampled == 1:
                        self._num_unique_samples += 1
                    out.append(SampledItem(item, item.priority, item.times_sampled, probability, table_size,
                                           rate_limited))
                    rate_limited = False
            else:
                for _ in range(count):
                    if not self._items:
                        break
                    table_size = len(self._items)
                    item, probability = self._sampler.sample()
                    limiter.samples += 1
                    item.times_sampled += 1
                    if item.times_sampled == 1:
                        self._num_unique_samples += 1
                    out.append(SampledItem(item, item.priority, item.times_sampled, probability, table_size,
                                           rate_limited))
                    rate_limited = False
                    if 0 < self._max_times_sampled <= item.times_sampled:
                        self._delete_locked(item)
            if self._num_waiting:
                self._insert_cv.notify_all()
            self._sampling_s += time.perf_counter() - start - waited
            return out

    # --- checkpointing support ---

    def items_snapshot(self) -> list:
        """The items in insertion order (for checkpoints); the items themselves are live objects."""
        with self._lock:
            return sorted(self._items.values(), key=lambda it: it.inserted_at)

    def state_snapshot(self) -> dict:
        """Rate-limiter counters and table counters, for checkpoints."""
        with self._lock:
            return {"inserts": self._limiter.inserts, "samples": self._limiter.samples,
                    "deletes": self._limiter.deletes, "num_deleted_episodes": self._num_deleted_episodes,
                    "num_unique_samples": self._num_unique_samples}

    def checkpoint_snapshot(self) -> tuple:
        """`(entries, state)` read under one lock acquisition, so that they agree even while other threads
        insert, sample and delete: `entries` are `(item, priority, times_sampled)` in insertion order (the
        values as of the snapshot; items are live objects) and `state` is `state_snapshot()`'s dict."""
        with self._lock:
            items = sorted(self._items.values(), key=lambda it: it.inserted_at)
            entries = [(item, item.priority, item.times_sampled) for item in items]
            state = {"inserts": self._limiter.inserts, "samples": self._limiter.samples,
                     "deletes": self._limiter.deletes, "num_deleted_episodes": self._num_deleted_episodes,
                     "num_unique_samples": self._num_unique_samples}
        return entries, state

    def restore(self, items: Iterable[Item], state: Optional[dict] = None) -> None:
        """Inserts `items` (in order, keeping their `inserted_at`) bypassing the rate limiter, then sets
        the counters from `state` (as `state_snapshot` returns them) if given."""
        with self._lock:
            for item in items:
                self._items[item.key] = item
                self._sampler.insert(item)
                self._remover.insert(item)
                for episode_id in item.episode_ids:
                    self._episode_refs[episode_id] = self._episode_refs.get(episode_id, 0) + 1
            if state is not None:
                self._limiter.inserts = state["inserts"]
                self._limiter.samples = state["samples"]
                self._limiter.deletes = state["deletes"]
                self._num_deleted_episodes = state["num_deleted_episodes"]
                self._num_unique_samples = state["num_unique_samples"]
            self._insert_cv.notify_all()
            self._sample_cv.notify_all()

    def get_item(self, key: int) -> Optional[Item]:
        with self._lock:
            return self._items.get(int(key))

    # --- internals (called with the lock held) ---

    def _check_inserts_accepted(self, what: str = "inserts") -> None:
        if self._refusing_inserts:
            self._check_open()
            raise errors.UnavailableError(f"Table '{self._name}' accepts no {what}: its server is shutting down. "
                                          f"Send the call again once the server is back.")

    def _check_open(self) -> None:
        if self._closed:
            raise errors.CancelledError(f"Table '{self._name}' has been closed (its server was stopped).")

    def wake_waiters(self) -> None:
        """Wakes every blocked insert and sample, so that they re-check their `cancelled` event."""
        with self._lock:
            self._insert_cv.notify_all()
            self._sample_cv.notify_all()

    def _wait(self, cv: threading.Condition, admitted, deadline: Optional[float],
              cancelled: Optional[threading.Event] = None) -> float:
        """Waits on `cv` until `admitted()`; returns the seconds waited (added to TableWorkerTime's sums)."""
        self._num_waiting += 1  # lets the hot paths skip notify_all when nobody waits
        start = time.perf_counter()
        try:
            while True:
                self._check_open()
                if cancelled is not None and cancelled.is_set():
                    raise errors.CancelledError(f"waiting on the rate limiter of table '{self._name}' was "
                                                f"cancelled")
                if admitted():
                    break
                if deadline is None:
                    cv.wait()
                else:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise errors.rate_limiter_timeout()
                    cv.wait(remaining)
        finally:
            self._num_waiting -= 1
            waited = time.perf_counter() - start
            if cv is self._insert_cv:
                self._waiting_for_sampling_s += waited
            else:
                self._waiting_for_inserts_s += waited
        return waited

    def _update_locked(self, item: Item, priority: float) -> None:
        item.priority = priority
        self._sampler.update(item)
        self._remover.update(item)

    def _delete_locked(self, item: Item) -> None:
        del self._items[item.key]
        self._sampler.delete(item)
        self._remover.delete(item)
        self._limiter.deletes += 1
        refs = self._episode_refs
        for episode_id in item.episode_ids:
            left = refs[episode_id] - 1
            if left:
                refs[episode_id] = left
            else:
                del refs[episode_id]
                self._num_deleted_episodes += 1
