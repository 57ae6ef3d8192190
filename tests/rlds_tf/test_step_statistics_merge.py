"""`StepStatistics.merge` leaves the merged-in summary unchanged (Beam may reuse or re-merge accumulators)."""
import numpy as np

from rlds_tf import step_statistics


def _summary(*episodes):
    out = step_statistics.StepStatistics()
    for x in episodes:
        out.add_episode({"steps": {"x": np.asarray(x, dtype=np.float64)}})
    return out


def test_merge_leaves_the_other_summary_unchanged():
    a, b = _summary([1., 3.]), _summary([5.], [7., 9.])
    before = a.result()["x"]
    merged = step_statistics.StepStatistics().merge(a).merge(b)
    after = a.result()["x"]
    assert (after["count"], float(after["mean"]), float(after["max"])) == (2, 2.0, 3.0)
    assert {k: np.asarray(v).tolist() for k, v in after.items()} == {k: np.asarray(v).tolist()
                                                                      for k, v in before.items()}
    # 1, 3, 5, 7, 9: mean 5, sample variance (16 + 4 + 0 + 4 + 16) / 4 = 10.
    x = merged.result()["x"]
    assert (x["count"], float(x["mean"]), round(float(x["std"]) ** 2, 9), float(x["min"]), float(x["max"])) == (
        5, 5.0, 10.0, 1.0, 9.0)


def test_merging_the_same_parts_twice_gives_the_same_figures():
    a, b = _summary([1., 3.]), _summary([5.])
    first = step_statistics.StepStatistics().merge(a).merge(b).result()["x"]
    second = step_statistics.StepStatistics().merge(a).merge(b).result()["x"]
    assert (first["count"], second["count"]) == (3, 3)
    assert (float(second["mean"]), float(second["std"])) == (3.0, 2.0)
