"""Rate limiters: Reverb's admission rule, validation errors, blocking with timeouts, no cross-thread deadlock."""
import threading

import numpy as np
import pytest

import reverb_testlib
import replay_tf as reverb
from replay_tf.core import rate_limiters


@pytest.mark.parametrize("make, error", [
    (lambda: reverb.rate_limiters.MinSize(0), r"min_size_to_sample \(0\) must be a positive integer"),
    (lambda: reverb.rate_limiters.SampleToInsertRatio(0.0, 1, 10.0), r"samples_per_insert \(0.0\) must be > 0"),
    (lambda: reverb.rate_limiters.SampleToInsertRatio(2.0, 1, 1.0), r"error_buffer must be >= max\(1.0"),
    (lambda: reverb.rate_limiters.SampleToInsertRatio(1.0, 2, (5.0, 10.0)), r"above samples_per_insert"),
    (lambda: reverb.rate_limiters.SampleToInsertRatio(1.0, 0, 5.0), r"min_size_to_sample \(0\)"),
])
def test_validation_errors(make, error):
    with pytest.raises(ValueError, match=error):
        make()


@pytest.mark.parametrize("limiter, expected", [
    (reverb.rate_limiters.MinSize(3), (1.0, 3, -np.finfo(float).max, np.finfo(float).max)),
    (reverb.rate_limiters.SampleToInsertRatio(2.0, 3, 4.0), (2.0, 3, 2.0, 10.0)),
    (reverb.rate_limiters.SampleToInsertRatio(2.0, 3, (-1.0, 7.0)), (2.0, 3, -1.0, 7.0)),
    (reverb.rate_limiters.Queue(5), (1.0, 1, 0.0, 5.0)),
    (reverb.rate_limiters.Stack(5), (1.0, 1, 0.0, 5.0)),
])
def test_parameters(limiter, expected):
    assert (limiter.samples_per_insert, limiter.min_size_to_sample, limiter.min_diff, limiter.max_diff) == expected


def test_admission_rule_hand_computed():
    state = rate_limiters.SampleToInsertRatio(2.0, 2, 3.0)._build()  # range [1, 7]
    assert state.can_insert(1) and not state.can_sample(1)
    state.inserts = 2  # min size reached: error = 4 - samples must stay within [1, 7]
    assert state.can_sample(1) and state.num_can_sample(10) == 3  # 4 - n >= 1
    assert state.can_insert(1)  # 3 * 2 - 0 = 6 <= 7
    state.inserts = 3
    assert not state.can_insert(1)  # 8 > 7
    state.deletes = 2  # size 1 < min size: inserts are free again, samples blocked
    assert state.can_insert(1) and not state.can_sample(1)


def test_blocked_sampler_and_inserter_in_threads_do_not_deadlock():
    table = reverb.Table.queue("q", 2)
    server = reverb.Server([table])
    client = reverb.Client(f"localhost:{server.port}")
    got = []

    def consume():
        for [step] in client.sample("q", 20):
            got.append(int(step.data[0]))

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    for i in range(20):  # the queue holds 2: inserts block until the consumer samples
        client.insert(np.int32(i), {"q": 1.0})
    consumer.join(30)
    assert not consumer.is_alive()
    assert got == list(range(20))
    server.stop()


def test_timeout_and_close_release_blocked_calls():
    table = reverb.Table.queue("q", 1)
    server = reverb.Server([table])
    with pytest.raises(reverb.DeadlineExceededError,
                       match="Rate Limiter: Timeout exceeded before the right to insert was acquired."):
        table.sample(1, timeout_ms=20)
    assert "closed" in str(reverb_testlib.error_of_call_released_by_stop(server, lambda: table.sample(1)))


_PRELUDE = """
def run(limiter, ops, max_size=100, remover=None):
    table = reverb.Table('t', reverb.selectors.Fifo(), remover or reverb.selectors.Fifo(), max_size, limiter)
    server = reverb.Server([table])
    client = reverb.Client(f'localhost:{server.port}')
    seq = []
    for op in ops:
        can = [table.can_insert(1), table.can_sample(1), table.can_sample(2)]
        seq.append(can)
        if op == 'i' and can[0]:
            client.insert(np.int32(0), {'t': 1.0})
        elif op == 's' and can[1]:
            next(client.sample('t'))
        elif op == 'd':
            client.reset('t')
    info = client.server_info()['t'].rate_limiter_info
    emit('seq', seq)
    emit('info', [info.samples_per_insert, info.min_diff, info.max_diff, info.min_size_to_sample,
                  info.insert_stats.completed, info.sample_stats.completed])
    server.stop()
"""

SCENARIOS = {
    "min_size": _PRELUDE + "run(reverb.rate_limiters.MinSize(3), 'iisiissssis')",
    "ratio": _PRELUDE + "run(reverb.rate_limiters.SampleToInsertRatio(2.0, 2, 3.0), 'iiiisssssiisssssiiiiisss')",
    "ratio_range": _PRELUDE + "run(reverb.rate_limiters.SampleToInsertRatio(0.5, 1, (-2.0, 2.0)), 'iiiiiisssiiiiss')",
    "queue": _PRELUDE + "run(reverb.rate_limiters.Queue(3), 'iiiissiiss', max_size=3)",
    "eviction_counts_as_delete": _PRELUDE + "run(reverb.rate_limiters.SampleToInsertRatio(1.0, 2, 2.0), "
                                            "'iiiiisssiiisss', max_size=2)",
    "reset": _PRELUDE + "run(reverb.rate_limiters.SampleToInsertRatio(1.0, 2, 2.0), 'iiissdiiss')",
    "validation": """
for args in [(0.0, 1, 10.0), (2.0, 1, 1.0), (1.0, 2, (5.0, 10.0)), (1.0, 0, 5.0)]:
    try:
        reverb.rate_limiters.SampleToInsertRatio(*args)
        emit(str(args), 'ok')
    except ValueError as e:
        emit(str(args), str(e))
try:
    reverb.rate_limiters.MinSize(0)
except ValueError as e:
    emit('min_size', str(e))
""",
    # dm-reverb passes these to C++ ints through pybind: Python floats (3.0 too, and np.float64) are a
    # TypeError; numpy integers, bools and whole numpy floats are taken; `Queue`'s size is a float there (its
    # max_diff), and `Table.queue` checks max_size. (Left out: `Queue(0.5)`, which Reverb takes and we refuse
    # with ValueError as a size < 1, and `np.float32(2.5)`, which pybind truncates to 2 and we refuse.)
    "integer_arguments": """
table = lambda **kw: reverb.Table('t', reverb.selectors.Uniform(), reverb.selectors.Fifo(),
                                  **{'max_size': 10, 'rate_limiter': reverb.rate_limiters.MinSize(1), **kw})
makers = {
    'min_size': lambda v: reverb.rate_limiters.MinSize(v),
    'ratio_min_size': lambda v: reverb.rate_limiters.SampleToInsertRatio(1.0, v, 10.0),
    'queue': lambda v: reverb.rate_limiters.Queue(v),
    'table_max_size': lambda v: table(max_size=v),
    'table_max_times_sampled': lambda v: table(max_times_sampled=v),
    'table_queue': lambda v: reverb.Table.queue('q', v),
    'table_stack': lambda v: reverb.Table.stack('s', v),
}
values = {'2.5': 2.5, '3.0': 3.0, '0.5': 0.5, 'np.float64(3)': np.float64(3), 'np.float32(3)': np.float32(3),
          'np.int64(3)': np.int64(3), 'np.int32(3)': np.int32(3), 'np.uint8(3)': np.uint8(3), 'True': True, '3': 3}
for maker, make in makers.items():
    for name, value in values.items():
        if (maker, name) == ('queue', '0.5'):
            continue
        try:
            make(value)
            emit(f'{maker}({name})', 'ok')
        except Exception as e:
            emit(f'{maker}({name})', type(e).__name__)
""",
}


peer_results, local_results, test_matches_reverb = reverb_testlib.differential_tests(SCENARIOS)


@pytest.mark.parametrize("make, message", [
    (lambda: reverb.rate_limiters.MinSize(2.5), r"min_size_to_sample must be an integer, got 2.5 \(float\); "
                                                r"convert it with int\(\) first"),
    (lambda: reverb.rate_limiters.SampleToInsertRatio(1.0, 3.0, 10.0), r"min_size_to_sample must be an integer, "
                                                                       r"got 3.0 \(float\)"),
    (lambda: reverb.Table("t", reverb.selectors.Uniform(), reverb.selectors.Fifo(), 10.5,
                          reverb.rate_limiters.MinSize(1)), r"max_size must be an integer, got 10.5 \(float\)"),
    (lambda: reverb.Table("t", reverb.selectors.Uniform(), reverb.selectors.Fifo(), 10,
                          reverb.rate_limiters.MinSize(1), max_times_sampled=np.float32(2.5)),
     r"max_times_sampled must be an integer, got (np.float32\()?2.5\)? \(float32\)"),  # Reverb: 2
    (lambda: reverb.Table.queue("q", 1e3), r"max_size must be an integer, got 1000.0 \(float\)"),
])
def test_float_counts_raise_type_error(make, message):
    with pytest.raises(TypeError, match=message):
        make()


def test_numpy_integer_counts_are_taken_as_ints():
    limiter = reverb.rate_limiters.SampleToInsertRatio(2.0, np.int64(3), 4.0)
    table = reverb.Table("t", reverb.selectors.Uniform(), reverb.selectors.Fifo(), np.uint16(7),
                         reverb.rate_limiters.MinSize(np.int32(2)), max_times_sampled=np.float32(4))
    assert type(limiter.min_size_to_sample) is int and limiter.min_size_to_sample == 3
    info = table.info
    assert (info.max_size, info.max_times_sampled, info.rate_limiter_info.min_size_to_sample) == (7, 4, 2)
    assert all(type(v) is int for v in (table.max_size, table.max_times_sampled))


def test_local_scenarios_run_without_errors(local_results):
    assert not {k: v for k, v in local_results.items() if k.endswith(".error")}
