"""`python -m benchmarks.compare`: rows whose ratio fell by more than the suite's spread, on synthetic results."""
import json

import pytest

from benchmarks import compare


def _write(folder, suite, rows, **meta):
    folder.mkdir(exist_ok=True)
    (folder / f"{suite}.json").write_text(json.dumps({"suite": suite, "rows": rows, **meta}))


def _row(workload, ours, peer, peer_name="peer", unit="items/s", **extra):
    ratio = extra.pop("ratio", ours / peer)
    return {"workload": workload, "ours": ours, "peer": peer, "ratio": ratio, "peer_name": peer_name, "unit": unit,
            **extra}


STORED = [
    _row("steady row", 100.0, 10.0),                             # 10x
    _row("regressed row", 200.0, 10.0),                          # 20x, falls to 1.2x below
    _row("same workload, other peer", 100.0, 50.0, "other"),     # 2x, unchanged
    _row("within spread", 100.0, 50.0),                          # 2x -> 1.7x: -15%
    _row("latency (lower is better)", 2.0, 4.0, unit="ms", ratio=2.0),        # peer / ours
    _row("memory per byte (lower is better)", 1.0, 4.0, unit="bytes"),         # ours / peer: 0.25x
    _row("no peer here", 100.0, 10.0),
]
FRESH = [
    _row("steady row", 101.0, 10.0),
    _row("regressed row", 12.0, 10.0),
    _row("same workload, other peer", 100.0, 50.0, "other"),
    _row("within spread", 85.0, 50.0),
    _row("latency (lower is better)", 4.0, 4.0, unit="ms", ratio=1.0),        # 2x -> 1x: worse
    _row("memory per byte (lower is better)", 2.0, 4.0, unit="bytes"),         # 0.25x -> 0.5x: worse
    {"workload": "no peer here", "ours": 100.0, "peer": None, "ratio": None, "peer_name": "peer", "unit": "items/s"},
]


def test_lists_only_rows_that_fell_beyond_the_spread_with_their_rerun_command(tmp_path, capsys):
    _write(tmp_path / "stored", "buffers", STORED)
    _write(tmp_path / "fresh", "buffers", FRESH)
    status = compare.main(["buffers", "--fresh", str(tmp_path / "fresh")], stored_dir=tmp_path / "stored")
    out = capsys.readouterr().out
    assert status == 1
    listed = [line for line in out.splitlines() if line.startswith("  [buffers]")]
    assert [line.split("] ")[1].split(" (vs")[0] for line in listed] == [
        "regressed row", "latency (lower is better)", "memory per byte (lower is better)"]
    assert "20.00x -> 1.20x (-94%, spread 30%); rerun: python -m benchmarks.run buffers" in listed[0]


def test_a_fresh_run_within_the_spread_passes(tmp_path, capsys):
    _write(tmp_path / "stored", "patterns", [_row("a", 100.0, 50.0)])
    _write(tmp_path / "fresh", "patterns", [_row("a", 80.0, 50.0)])   # -20% < 25% (patterns)
    assert compare.main(["--fresh", str(tmp_path / "fresh")], stored_dir=tmp_path / "stored") == 0
    assert "no row fell" in capsys.readouterr().out


@pytest.mark.parametrize("rounds, listed", [(None, True), ([1.0, 2.0, 1.5], False)])
def test_rows_measured_in_rounds_widen_the_spread_to_their_range(rounds, listed):
    stored = {"rows": [_row("w", 150.0, 100.0, **({"round_ratios": rounds} if rounds else {}))]}
    fresh = {"rows": [_row("w", 90.0, 100.0)]}                        # 1.5x -> 0.9x: -40%
    assert bool(compare.regressions("wire", stored, fresh)) is listed


def test_a_suite_may_record_its_own_measured_spread():
    stored = {"spread": 0.5, "rows": [_row("w", 150.0, 100.0)]}
    assert compare.regressions("buffers", stored, {"rows": [_row("w", 90.0, 100.0)]}) == []


def test_rerun_writes_fresh_results_beside_the_stored_ones(tmp_path, monkeypatch):
    # The rerun path with a stand-in suite: the stored results are never overwritten.
    import sys
    import types
    stored = tmp_path / "stored"
    _write(stored, "fake", [_row("w", 100.0, 10.0)])
    module = types.ModuleType("benchmarks.bench_fake")

    def fake_main():
        from benchmarks import _harness
        _harness.report("fake", [_row("w", 10.0, 10.0)])
    module.main = fake_main
    monkeypatch.setitem(sys.modules, "benchmarks.bench_fake", module)
    assert compare.main(["fake"], stored_dir=stored) == 1
    assert json.loads((stored / "fake.json").read_text())["rows"][0]["ours"] == 100.0


def test_an_unknown_suite_is_refused_with_the_stored_ones(tmp_path):
    _write(tmp_path / "stored", "buffers", STORED)
    with pytest.raises(SystemExit):
        compare.main(["nosuch", "--fresh", str(tmp_path)], stored_dir=tmp_path / "stored")


def test_rows_that_fell_with_their_whole_suite_say_so():
    stored = {"rows": [_row(f"w{i}", 200.0, 100.0) for i in range(4)] + [_row("x", 200.0, 100.0)]}
    fresh = {"rows": [_row(f"w{i}", 100.0, 100.0) for i in range(4)] + [_row("x", 40.0, 100.0)]}
    found = {r["workload"]: r for r in compare.regressions("patterns", stored, fresh)}
    assert set(found) == {"w0", "w1", "w2", "w3", "x"}
    assert found["w0"]["with_suite"] and found["w0"]["suite_median"] == pytest.approx(-0.5)
    assert not found["x"]["with_suite"]      # -80% against the suite's -50%: beyond the spread
