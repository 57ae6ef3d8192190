"""Item selectors (Reverb's `reverb.selectors`): the configs users pass to `Table`, and their state.

A selector config (`Uniform()`, `Prioritized(0.8)`, `Fifo()`, `Lifo()`, `MaxHeap()`, `MinHeap()`) is used as
a table's sampler or remover; the table builds a fresh distribution from it with `_build()`. Distributions
hold the table's items (objects with `.key` and `.priority`) and answer `sample() -> (item, probability)`;
the non-deterministic ones also answer `sample_many(n) -> (items, probabilities)`, two lists for a batch
drawn at once. Reported probabilities are Reverb's:
`1/n` (Uniform), `w_i / sum(w)` with `w = priority ** exponent` and `w = 0` for priority 0 (Prioritized,
uniform when every weight is 0), and `1.0` for the deterministic selectors. Heaps break priority ties in
favour of the least recently inserted or updated item.
"""
from __future__ import annotations

import collections
import dataclasses
import heapq
import itertools
import math
import random
import sys
from typing import Optional

import numpy as np


@dataclasses.dataclass(frozen=True)
class PrioritizedOptions:
    priority_exponent: float


@dataclasses.dataclass(frozen=True)
class HeapOptions:
    min_heap: bool


@dataclasses.dataclass(frozen=True)
class KeyDistributionOptions:
    """Mirror of Reverb's `KeyDistributionOptions` proto: one distribution field set, plus determinism."""
    fifo: bool = False
    uniform: bool = False
    prioritized: Optional[PrioritizedOptions] = None
    heap: Optional[HeapOptions] = None
    lifo: bool = False
    is_deterministic: bool = False

    def WhichOneof(self, name: str) -> Optional[str]:  # noqa: N802  (proto-compatible name)
        """The name of the distribution field that is set, as `proto.WhichOneof('distribution')`."""
        if name != "distribution":
            raise ValueError(f"KeyDistributionOptions has no oneof {name!r}; the only one is 'distribution'")
        for field in ("fifo", "uniform", "prioritized", "heap", "lifo"):
            if getattr(self, field):
                return field
        return None


class ItemSelector:
    """Base class of the selector configs."""

    def options(self) -> KeyDistributionOptions:
        raise NotImplementedError

    def _build(self):
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def __eq__(self, other) -> bool:
        return type(self) is type(other) and self.options() == other.options()

    def __hash__(self) -> int:
        return hash(self.options())


class Uniform(ItemSelector):
    """Samples every item with the same probability."""

    def options(self) -> KeyDistributionOptions:
        return KeyDistributionOptions(uniform=True)

    def _build(self):
        return UniformDistribution()


class Prioritized(ItemSelector):
    """Samples items with probability proportional to `priority ** priority_exponent`."""

    def __init__(self, priority_exponent: float):
        self.priority_exponent = float(priority_exponent)

    def options(self) -> KeyDistributionOptions:
        return KeyDistributionOptions(prioritized=PrioritizedOptions(self.priority_exponent))

    def check_priority(self, key: int, priority: float, max_items: int, table_name: str) -> None:
        """ValueError when `priority ** priority_exponent` exceeds `max_weight(max_items)`.

        Reverb accepts any finite priority, and a few huge ones make its float64 total overflow to inf:
        every probability is then reported as 0 and the sampler descends the tree on inf - inf. Bounding
        each weight keeps the total of up to `max_items` weights finite by construction.
        """
        bound = max_weight(max_items)
        if not _weight_within(priority, self.priority_exponent, bound):
            raise ValueError(f"priority ({priority}) of item {key} is too large for table '{table_name}': its "
                             f"weight priority ** {self.priority_exponent} must be <= {bound:.6g} (float64 max / "
                             f"(2 * {max_items} items)) so that the Prioritized selector's total weight stays "
                             f"finite; rescale the priorities")

    def _build(self):
        return PrioritizedDistribution(self.priority_exponent)

    def __repr__(self) -> str:
        return f"Prioritized(priority_exponent={self.priority_exponent})"


class Fifo(ItemSelector):
    """Selects the oldest inserted item."""

    def options(self) -> KeyDistributionOptions:
        return KeyDistributionOptions(fifo=True, is_deterministic=True)

    def _build(self):
        return FifoDistribution(lifo=False)


class Lifo(ItemSelector):
    """Selects the newest inserted item."""

    def options(self) -> KeyDistributionOptions:
        return KeyDistributionOptions(lifo=True, is_deterministic=True)

    def _build(self):
        return FifoDistribution(lifo=True)


class MaxHeap(ItemSelector):
    """Selects the item with the highest priority (ties: least recently inserted or updated)."""

    def options(self) -> KeyDistributionOptions:
        return KeyDistributionOptions(heap=HeapOptions(min_heap=False), is_deterministic=True)

    def _build(self):
        return HeapDistribution(min_heap=False)


class MinHeap(ItemSelector):
    """Selects the item with the lowest priority (ties: least recently inserted or updated)."""

    def options(self) -> KeyDistributionOptions:
        return KeyDistributionOptions(heap=HeapOptions(min_heap=True), is_deterministic=True)

    def _build(self):
        return HeapDistribution(min_heap=True)


def from_options(options: KeyDistributionOptions) -> ItemSelector:
    """The selector config described by `options` (for transports and checkpoints)."""
    kind = options.WhichOneof("distribution")
    if kind == "uniform":
        return Uniform()
    if kind == "prioritized":
        return Prioritized(options.prioritized.priority_exponent)
    if kind == "fifo":
        return Fifo()
    if kind == "lifo":
        return Lifo()
    if kind == "heap":
        return MinHeap() if options.heap.min_heap else MaxHeap()
    raise ValueError(f"KeyDistributionOptions sets no distribution: {options}")


def max_weight(max_items: int) -> float:
    """The largest weight `priority ** exponent` a prioritized distribution of `max_items` items accepts.

    A sum of `max_items` weights up to this bound stays below float64's max with a factor 2 to spare for
    rounding (each node is the rounded sum of its children), so the total, and every node below it, is finite.
    """
    return sys.float_info.max / (2 * max(int(max_items), 1))


def _weight_within(priority: float, exponent: float, bound: float) -> bool:
    if priority == 0:
        return True  # weight 0 whatever the exponent (see PrioritizedDistribution._weight)
    try:
        return math.pow(priority, exponent) <= bound
    except OverflowError:
        return False


# --- distributions (per-table state) ---

# Up to this many uniform draws at once, Python's `randrange` is faster than numpy's `integers`.
_FEW_DRAWS = 16


class UniformDistribution:
    """Items in a list; deletion swaps the last item into the hole so every operation is O(1)."""

    is_deterministic = False

    def __init__(self):
        self._items: list = []
        self._pos: dict = {}
        # Python's generator draws a few indices faster than numpy's `integers` (both exactly
        # uniform): TF-Agents' datasets ask for a few samples at a time, acme's for hundreds.
        self._random = random.Random()
        self._rng = np.random.default_rng()

    def insert(self, item) -> None:
        self._pos[item.key] = len(self._items)
        self._items.append(item)

    def update(self, item) -> None:
        pass

    def delete(self, item) -> None:
        pos = self._pos.pop(item.key)
        last = self._items.pop()
        if last is not item:
            self._items[pos] = last
            self._pos[last.key] = pos

    def clear(self) -> None:
        self._items.clear()
        self._pos.clear()

    def sample(self):
        n = len(self._items)
        return self._items[self._random.randrange(n)], 1.0 / n

    def sample_many(self, count: int):
        """`count` items drawn with replacement, and their probabilities."""
        n = len(self._items)
        items = self._items
        if count <= _FEW_DRAWS:
            randrange = self._random.randrange
            return [items[randrange(n)] for _ in range(count)], [1.0 / n] * count
        return [items[i] for i in self._rng.integers(n, size=count).tolist()], [1.0 / n] * count


class PrioritizedDistribution:
    """A sum tree over `priority ** exponent` in a numpy array; sampling descends it for a whole batch.

    Layout: `tree[1]` is the root, node `i` has children `2i` and `2i + 1`, and the leaves (one per slot)
    are `tree[capacity:2 * capacity]`. Items live in slots `0..n-1`; deleting moves the last slot's item into
    the hole, so the occupied slots stay contiguous.
    """

    is_deterministic = False
    _INITIAL_CAPACITY = 1 << 10

    def __init__(self, priority_exponent: float):
        self._exponent = priority_exponent
        self._capacity = self._INITIAL_CAPACITY
        self._tree = np.zeros(2 * self._capacity)
        self._items: list = []
        self._pos: dict = {}
        self._rng = np.random.default_rng()

    def _weight(self, priority: float) -> float:
        # Reverb: a priority of 0 has weight 0 even when the exponent is 0 (0 ** 0 would be 1).
        return 0.0 if priority == 0 else math.pow(priority, self._exponent)

    def _set(self, slot: int, weight: float) -> None:
        """Sets a leaf and recomputes each ancestor as the sum of its two children.

        Adding the change (`weight - old`) up the path instead would lose the other weights whenever the
        old weight dwarfs them: `(s + 1e25) - 1e25 == 0`, so one huge priority set back to a normal one
        would leave a total of about 0 and sampling would turn uniform. Recomputed sums hold the live
        weights, each rounded once per level, whatever was stored before.
        """
        tree = self._tree
        i = slot + self._capacity
        tree[i] = weight
        total = weight
        while i > 1:
            total = total + tree[i ^ 1]  # i ^ 1 is i's sibling; their sum is their parent i >> 1
            i >>= 1
            tree[i] = total

    def _rebuild(self) -> None:
        """Recomputes every inner node from the leaves."""
        tree, cap = self._tree, self._capacity
        level_start = cap
        while level_start > 1:  # each level's sums are the pairwise sums of the level below
            half = level_start // 2
            tree[half:level_start] = tree[level_start:2 * level_start:2] + tree[level_start + 1:2 * level_start:2]
            level_start = half

    def _grow(self) -> None:
        leaves = self._tree[self._capacity:self._capacity + len(self._items)].copy()
        self._capacity *= 2
        self._tree = np.zeros(2 * self._capacity)
        self._tree[self._capacity:self._capacity + len(leaves)] = leaves
        self._rebuild()

    def insert(self, item) -> None:
        if len(self._items) == self._capacity:
            self._grow()
        slot = len(self._items)
        self._pos[item.key] = slot
        self._items.append(item)
        self._set(slot, self._weight(item.priority))

    def update(self, item) -> None:
        self._set(self._pos[item.key], self._weight(item.priority))

    def delete(self, item) -> None:
        slot = self._pos.pop(item.key)
        last_slot = len(self._items) - 1
        last = self._items.pop()
        if last is not item:
            self._items[slot] = last
            self._pos[last.key] = slot
            self._set(slot, self._tree[self._capacity + last_slot])
        self._set(last_slot, 0.0)

    def clear(self) -> None:
        self._items.clear()
        self._pos.clear()
        self._tree[:] = 0.0

    def sample(self):
        items, probs = self.sample_many(1)
        return items[0], probs[0]

    def sample_many(self, count: int):
        n = len(self._items)
        tree, cap = self._tree, self._capacity
        total = tree[1]
        if not total > 0:  # every weight is 0: Reverb samples uniformly
            idx = self._rng.integers(n, size=count)
            return [self._items[i] for i in idx.tolist()], [1.0 / n] * count
        target = self._rng.random(count) * total
        node = np.ones(count, dtype=np.int64)
        while cap > 1:  # one level per iteration: go right when the target is beyond the left subtree
            left = tree[2 * node]
            go_right = target >= left
            target = np.where(go_right, target - left, target)
            node = 2 * node + go_right
            cap >>= 1
        slots = node - self._capacity
        weights = tree[node]
        bad = (slots >= n) | (weights <= 0)  # rounding can land on an empty or zero-weight leaf
        if bad.any():
            leaves = tree[self._capacity:self._capacity + n]
            valid = np.flatnonzero(leaves > 0)
            slots[bad] = valid[np.minimum(np.searchsorted(np.cumsum(leaves[valid]) / leaves[valid].sum(),
                                                          self._rng.random(int(bad.sum()))), len(valid) - 1)]
            weights = tree[slots + self._capacity]
        items = self._items
        return [items[i] for i in slots.tolist()], (weights / total).tolist()

    def probability(self, item) -> float:
        total = self._tree[1]
        if not total > 0:
            return 1.0 / len(self._items)
        return self._tree[self._capacity + self._pos[item.key]] / total


class FifoDistribution:
    """Items in insertion order; Fifo selects the first, Lifo the last. Updates keep the order."""

    is_deterministic = True

    def __init__(self, lifo: bool):
        self._items: collections.OrderedDict = collections.OrderedDict()
        self._lifo = lifo

    def insert(self, item) -> None:
        self._items[item.key] = item

    def update(self, item) -> None:
        pass

    def delete(self, item) -> None:
        del self._items[item.key]

    def clear(self) -> None:
        self._items.clear()

    def sample(self):
        return next(reversed(self._items.values())) if self._lifo else next(iter(self._items.values())), 1.0


class HeapDistribution:
    """A binary heap with lazy deletion, keyed by (priority, recency) so ties go to the least recent."""

    is_deterministic = True

    def __init__(self, min_heap: bool):
        self._sign = 1.0 if min_heap else -1.0
        self._heap: list = []
        self._live: dict = {}  # key -> sequence number of its current heap entry
        self._counter = itertools.count()

    def _push(self, item) -> None:
        seq = next(self._counter)
        self._live[item.key] = seq
        heapq.heappush(self._heap, (self._sign * item.priority, seq, item))
        if len(self._heap) > 2 * len(self._live) + 64:  # too many stale entries: compact
            self._heap = [e for e in self._heap if self._live.get(e[2].key) == e[1]]
            heapq.heapify(self._heap)

    def insert(self, item) -> None:
        self._push(item)

    def update(self, item) -> None:
        self._push(item)

    def delete(self, item) -> None:
        del self._live[item.key]

    def clear(self) -> None:
        self._heap.clear()
        self._live.clear()

    def sample(self):
        heap = self._heap
        while True:
            _, seq, item = heap[0]
            if self._live.get(item.key) == seq:
                return item, 1.0
            heapq.heappop(heap)
