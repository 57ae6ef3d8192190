"""The buffer benchmark's derived rows: the adds alone inside a compiled loop, without the call's cost."""
import pytest

from benchmarks import bench_buffers


def test_the_loops_adds_alone_leave_out_the_calls_cost():
    batch = bench_buffers.BATCH
    one_call = 10e-6 + 1e-6  # call 10 us, one add 1 us
    thousand_calls = 10e-6 + 1000 * 1e-6
    results = {"jit_collect_1_small": batch / one_call, "jit_collect_1000_small": 1000 * batch / thousand_calls}
    assert bench_buffers._marginal_rate(results) == pytest.approx(batch / 1e-6)


@pytest.mark.parametrize("results", [{}, {"jit_collect_1_small": 1.0}, {"jit_collect_1000_small": 1.0},
                                     {"jit_collect_1_small": 100.0, "jit_collect_1000_small": 1e9}])
def test_no_adds_alone_without_both_calls_or_when_the_long_call_is_not_longer(results):
    assert bench_buffers._marginal_rate(results) is None
