"""Lists the benchmark rows whose ratio to their peer fell against the stored results.

`python -m benchmarks.compare [SUITES ...]` reruns the named suites (default: every suite stored in
`benchmarks/results/`) with their results written to a temporary folder, so the stored ones stay as they
are, and compares each row's ratio (ours against the peer, as `benchmarks/results/<suite>.json` records
it) with the stored one. `--fresh DIR` compares the results of a run already made (its `<suite>.json`
files) instead of rerunning. A row is listed when its ratio fell by more than the suite's run-to-run
spread (`SPREADS`: how far the ratios of unchanged code move between runs on the shared hosts; rows
measured in rounds widen it to their rounds' range), with the command that reruns its suite, and a
note when most of its suite fell with it (the suite's median change, `bound:` rows included: a loaded
host rather than the code). The exit status is 1 when a row is listed, so a check can fail on it.

A row may get slower on purpose only with its reason and measured cost in `docs/benchmarks.md`; the
stored results are then refreshed with `python -m benchmarks.run SUITE`.
"""
from __future__ import annotations

import argparse
import importlib
import json
import pathlib
import statistics
import sys
import tempfile
from typing import Iterable

from benchmarks import _harness

# How far a row's ratio moves between runs of the same code on these hosts (relative fall, 0.25 = a
# quarter), per suite, from repeated runs of each suite (docs/benchmarks.md, "What bounds each suite").
SPREADS = {
    "buffers": 0.30,
    "capacity": 0.50,
    "loading": 0.25,
    "patterns": 0.25,
    "recording": 0.25,
    "server": 0.30,
    "tf_agents": 0.35,
    "wire": 0.30,
}
DEFAULT_SPREAD = 0.30


def load_suite(folder: pathlib.Path, suite: str) -> dict | None:
    """`folder/<suite>.json` (a suite's recorded run), or None if there is none or it has no rows."""
    path = pathlib.Path(folder) / f"{suite}.json"
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    return data if "rows" in data else None


def stored_suites(folder: pathlib.Path = _harness.RESULTS_DIR) -> list[str]:
    """The suites with rows stored in `folder`."""
    return sorted(p.stem for p in pathlib.Path(folder).glob("*.json") if load_suite(folder, p.stem))


def _key(row: dict) -> tuple:
    # The same workload appears once per peer (e.g. against flashbax and against tf-agents).
    return row.get("workload"), row.get("peer_name"), row.get("unit")


def _higher_is_better(row: dict) -> bool:
    """Whether a larger ratio is better. Rows marked "lower is better" record either peer / ours (then
    still True) or ours / peer (memory per byte: then False); the figures tell which."""
    text = f"{row.get('workload', '')} {row.get('unit', '')}"
    ours, peer, ratio = row.get("ours"), row.get("peer"), row.get("ratio")
    if "lower is better" not in text or not (ours and peer and ratio):
        return True
    return abs(ratio - peer / ours) <= abs(ratio - ours / peer)


def _spread(suite: str, stored: dict, row: dict) -> float:
    spread = stored.get("spread", SPREADS.get(suite, DEFAULT_SPREAD))
    rounds = row.get("round_ratios")
    if rounds and len(rounds) > 1 and row.get("ratio"):
        spread = max(spread, (max(rounds) - min(rounds)) / row["ratio"])
    return spread


def regressions(suite: str, stored: dict, fresh: dict) -> list[dict]:
    """The rows of `fresh` whose ratio fell against `stored` by more than the suite's spread.

    Each: {suite, workload, peer_name, stored, fresh, change (relative, negative: worse), spread}.
    Rows without a ratio on either side (a peer not installed) are not compared.
    """
    fresh_rows = {_key(row): row for row in fresh.get("rows", [])}
    changes = []
    for row in stored.get("rows", []):
        new = fresh_rows.get(_key(row))
        before, after = row.get("ratio"), (new or {}).get("ratio")
        if not before or not after:
            continue
        # Relative change in the direction where positive is better.
        change = after / before - 1 if _higher_is_better(row) else before / after - 1
        changes.append((row, before, after, change))
    # The suite's median change: when most rows (its `bound:` rows too) fell together, the host was
    # slower for our side than when the results were stored, which each listed row then says.
    median = statistics.median(c for *_, c in changes) if changes else 0.0
    found = []
    for row, before, after, change in changes:
        spread = _spread(suite, stored, row)
        if change < -spread:
            found.append({"suite": suite, "workload": row["workload"], "peer_name": row.get("peer_name", ""),
                          "stored": before, "fresh": after, "change": change, "spread": spread,
                          "with_suite": change - median >= -spread, "suite_median": median})
    return found


def rerun(suites: Iterable[str], folder: pathlib.Path) -> None:
    """Runs the suites' benchmarks with their results written to `folder` (not the stored results)."""
    saved = _harness.RESULTS_DIR
    _harness.RESULTS_DIR = pathlib.Path(folder)
    try:
        for suite in suites:
            importlib.import_module(f"benchmarks.bench_{suite}").main()
    finally:
        _harness.RESULTS_DIR = saved


def render(found: list[dict], compared: list[str], missing: list[str], stored_dir: pathlib.Path) -> str:
    lines = [f"compared against {stored_dir}: {', '.join(compared) or 'no suite'}"]
    if missing:
        lines.append(f"no fresh results for: {', '.join(missing)}")
    if not found:
        lines.append("no row fell by more than its suite's run-to-run spread")
        return "\n".join(lines)
    lines.append(f"{len(found)} row(s) fell by more than their suite's run-to-run spread:")
    for r in found:
        lines.append(f"  [{r['suite']}] {r['workload']} (vs {r['peer_name']}): {r['stored']:.2f}x -> "
                     f"{r['fresh']:.2f}x ({100 * r['change']:+.0f}%, spread {100 * r['spread']:.0f}%); "
                     f"rerun: python -m benchmarks.run {r['suite']}"
                     + (f" (the suite's rows fell by {-100 * r['suite_median']:.0f}% at the median: a slower host "
                        f"for this side, or a change to all of them)" if r["with_suite"] else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None, stored_dir: pathlib.Path | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compare", description=__doc__.splitlines()[0])
    parser.add_argument("suites", nargs="*", help="suites to compare (default: every stored suite)")
    parser.add_argument("--fresh", type=pathlib.Path, default=None,
                        help="a folder of fresh <suite>.json results to compare instead of rerunning")
    parser.add_argument("--stored", type=pathlib.Path, default=None,
                        help=f"the results to compare against (default: {_harness.RESULTS_DIR})")
    args = parser.parse_args(argv)
    stored_dir = pathlib.Path(args.stored or stored_dir or _harness.RESULTS_DIR)
    suites = args.suites or stored_suites(stored_dir)
    unknown = [s for s in suites if load_suite(stored_dir, s) is None]
    if unknown:
        parser.error(f"no stored results with rows for {unknown} in {stored_dir}; stored: {stored_suites(stored_dir)}")
    with tempfile.TemporaryDirectory() as scratch:
        fresh_dir = args.fresh
        if fresh_dir is None:
            fresh_dir = pathlib.Path(scratch)
            rerun(suites, fresh_dir)
        found, compared, missing = [], [], []
        for suite in suites:
            fresh = load_suite(fresh_dir, suite)
            if fresh is None:
                missing.append(suite)
                continue
            compared.append(suite)
            found += regressions(suite, load_suite(stored_dir, suite), fresh)
    print(render(found, compared, missing, stored_dir))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
