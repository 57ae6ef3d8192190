"""Selectors: probabilities, orders, tie-breaking and eviction, against hand-computed values and dm-reverb."""
import types

import numpy as np
import pytest

import reverb_testlib
from replay_tf.core import selectors

# --- hand-computed (no peer) ---


def _items(priorities):
    return [types.SimpleNamespace(key=i, priority=p) for i, p in enumerate(priorities)]


@pytest.mark.parametrize("exponent, priorities, expected", [
    (1.0, [1.0, 3.0], [0.25, 0.75]),
    (0.5, [1.0, 4.0], [1 / 3, 2 / 3]),
    (0.0, [0.0, 2.0, 5.0], [0.0, 0.5, 0.5]),   # priority 0 has weight 0 even with exponent 0
    (0.8, [0.0, 0.0], [0.5, 0.5]),              # all weights 0: uniform
])
def test_prioritized_probabilities(exponent, priorities, expected):
    dist = selectors.Prioritized(exponent)._build()
    for item in _items(priorities):
        dist.insert(item)
    items, probabilities = dist.sample_many(4000)
    reported = {it.key: p for it, p in zip(items, probabilities)}
    for key, value in reported.items():
        assert value == pytest.approx(expected[key])
    counts = np.bincount([it.key for it in items], minlength=len(priorities)) / 4000
    np.testing.assert_allclose(counts, expected, atol=0.05)


def test_uniform_draws_every_live_item_equally_often():
    dist = selectors.Uniform()._build()
    items = _items([1.0] * 6)
    for item in items:
        dist.insert(item)
    dist.delete(items[1])
    dist.delete(items[4])  # (holes filled by the last items)
    for count, calls in ((8000, 1), (4, 2000)):  # (drawn by numpy, then by Python's generator: see _FEW_DRAWS)
        sampled = []
        for _ in range(calls):
            items_drawn, probabilities = dist.sample_many(count)
            assert probabilities == [0.25] * count
            sampled += items_drawn
        counts = np.bincount([it.key for it in sampled], minlength=6) / 8000
        np.testing.assert_allclose(counts, [0.25, 0.0, 0.25, 0.25, 0.0, 0.25], atol=0.03)
    drawn = [dist.sample() for _ in range(200)]
    assert {item.key for item, _ in drawn} == {0, 2, 3, 5} and {p for _, p in drawn} == {0.25}


def test_prioritized_update_delete_and_growth():
    dist = selectors.Prioritized(1.0)._build()
    items = _items([1.0] * 3000)  # grows past the initial capacity
    for item in items:
        dist.insert(item)
    for item in items[:2990]:
        dist.delete(item)
    items[2995].priority = 0.0
    dist.update(items[2995])
    sampled, probabilities = dist.sample_many(2000)
    assert {it.key for it in sampled} <= {2990, 2991, 2992, 2993, 2994, 2996, 2997, 2998, 2999}
    np.testing.assert_allclose(probabilities, 1 / 9)


@pytest.mark.parametrize("selector, priorities, expected_order", [
    (selectors.Fifo(), [3, 1, 3, 2], [0, 1, 2, 3]),
    (selectors.Lifo(), [3, 1, 3, 2], [3, 2, 1, 0]),
    (selectors.MaxHeap(), [3, 1, 3, 2], [0, 2, 3, 1]),  # tie 3/3: the earlier inserted first
    (selectors.MinHeap(), [3, 1, 3, 2], [1, 3, 0, 2]),
])
def test_deterministic_orders(selector, priorities, expected_order):
    dist = selector._build()
    for item in _items(priorities):
        dist.insert(item)
    order = []
    for _ in priorities:
        item, probability = dist.sample()
        assert probability == 1.0
        order.append(item.key)
        dist.delete(item)
    assert order == expected_order


def test_heap_update_moves_item_behind_its_ties():
    dist = selectors.MaxHeap()._build()
    items = _items([1.0, 1.0, 1.0])
    for item in items:
        dist.insert(item)
    dist.update(items[0])  # same priority, but now the most recently updated
    assert dist.sample()[0].key == 1


def test_options_mirror_reverb():
    assert selectors.Prioritized(0.8).options().WhichOneof("distribution") == "prioritized"
    assert selectors.Prioritized(0.8).options().prioritized.priority_exponent == 0.8
    assert selectors.MinHeap().options().heap.min_heap
    assert selectors.Lifo().options().is_deterministic
    assert not selectors.Uniform().options().is_deterministic
    for selector in [selectors.Uniform(), selectors.Prioritized(0.3), selectors.Fifo(), selectors.Lifo(),
                     selectors.MaxHeap(), selectors.MinHeap()]:
        assert selectors.from_options(selector.options()) == selector


# --- differential against dm-reverb ---

_PRELUDE = """
def make(sampler, remover=None, max_size=100, max_times_sampled=0, rate_limiter=None):
    table = reverb.Table('t', sampler, remover or reverb.selectors.Fifo(), max_size,
                         rate_limiter or reverb.rate_limiters.MinSize(1), max_times_sampled=max_times_sampled)
    server = reverb.Server([table])
    return server, reverb.Client(f'localhost:{server.port}')

def drain(client, n):
    return [int(step.data[0]) for [step] in client.sample('t', n)]
"""

SCENARIOS = {
    "prioritized_probabilities": _PRELUDE + """
server, client = make(reverb.selectors.Prioritized(0.8))
for i, p in enumerate([0.0, 1.0, 2.0, 3.5]):
    client.insert(np.int32(i), {'t': p})
seen = {}
for [step] in client.sample('t', 60):
    seen[int(step.data[0])] = [round(step.info.probability, 9), int(step.info.table_size), step.info.priority]
emit('seen', sorted(seen.items()))
""",
    "uniform_probabilities": _PRELUDE + """
server, client = make(reverb.selectors.Uniform())
for i in range(5):
    client.insert(np.int32(i), {'t': 1.0})
emit('probabilities', sorted({round(s[0].info.probability, 9) for s in client.sample('t', 20)}))
""",
    "orders": _PRELUDE + """
for name in ['Fifo', 'Lifo', 'MaxHeap', 'MinHeap']:
    server, client = make(getattr(reverb.selectors, name)(), max_times_sampled=1)
    for i, p in enumerate([3.0, 1.0, 3.0, 2.0, 1.0]):
        client.insert(np.int32(i), {'t': p})
    emit(name, drain(client, 5))
    server.stop()
""",
    "eviction": _PRELUDE + """
for name in ['Fifo', 'Lifo', 'MaxHeap', 'MinHeap']:
    server, client = make(reverb.selectors.Fifo(), getattr(reverb.selectors, name)(), max_size=3, max_times_sampled=1)
    for i, p in enumerate([3.0, 1.0, 5.0, 2.0, 4.0]):
        client.insert(np.int32(i), {'t': p})
    emit(name, drain(client, 3))
    emit(name + '_deleted', client.server_info()['t'].rate_limiter_info.insert_stats.completed)
    server.stop()
""",
    "heap_tie_after_update": _PRELUDE + """
server, client = make(reverb.selectors.MaxHeap())
for i in range(3):
    client.insert(np.int32(i), {'t': 1.0})
[first] = next(client.sample('t'))
client.mutate_priorities('t', updates={int(first.info.key): 1.0})
emit('order', [int(first.data[0])] + [int(s[0].data[0]) for s in client.sample('t', 2)])
""",
    "options": _PRELUDE + """
out = []
for s in [reverb.selectors.Uniform(), reverb.selectors.Prioritized(0.25), reverb.selectors.Fifo(),
          reverb.selectors.Lifo(), reverb.selectors.MaxHeap(), reverb.selectors.MinHeap()]:
    server, client = make(s)
    o = client.server_info()['t'].sampler_options
    kind = o.WhichOneof('distribution')
    extra = o.prioritized.priority_exponent if kind == 'prioritized' else (o.heap.min_heap if kind == 'heap' else None)
    out.append([kind, bool(o.is_deterministic), extra])
    server.stop()
emit('options', out)
""",
}


@pytest.fixture(scope="module")
def peer_results(peer):
    return reverb_testlib.run_peer(peer, SCENARIOS)


@pytest.fixture(scope="module")
def local_results():
    return reverb_testlib.run_local(SCENARIOS)


@pytest.mark.peer
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_matches_reverb(scenario, peer_results, local_results):
    ours = reverb_testlib.scenario_results(local_results, scenario)
    theirs = reverb_testlib.scenario_results(peer_results, scenario)
    assert ours == theirs


def test_local_scenarios_run_without_errors(local_results):
    errors = {k: v for k, v in local_results.items() if k.endswith(".error")}
    assert not errors
    # Hand-checked: priorities [3, 1, 3, 2, 1]; ties go to the earlier inserted item.
    assert local_results["orders.MaxHeap"] == [0, 2, 3, 1, 4]
    assert local_results["orders.MinHeap"] == [1, 4, 3, 0, 2]
