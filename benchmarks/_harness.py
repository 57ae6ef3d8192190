"""Side-by-side benchmark helpers: run a workload in the peer venv and here, print both and the ratio.

Every benchmark module exposes `main()`; `python -m benchmarks.run` runs them all. Results are printed
as a table and written to `benchmarks/results/<name>.json` so the README table can be regenerated.
"""
from __future__ import annotations

import json
import os
import pathlib
import sys
import time
from typing import Callable

_ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(_ROOT / "tests"))

import peer_testlib  # noqa: E402

RESULTS_DIR = _ROOT / "benchmarks" / "results"


def peer() -> peer_testlib.Peer | None:
    """The peer venv interpreter (RL_DATA_PEER_PYTHON), or None with a note on stderr."""
    python = peer_testlib.peer_python()
    if python is None:
        print(f"[bench] no peer venv: set {peer_testlib.ENV_VAR} (bash .ci/make_peer_venv.sh)", file=sys.stderr)
        return None
    return peer_testlib.Peer(python)


# The timing loop, as source: the peer's snippets prepend it (`PEER_BEST_RATE + code`), and this process
# executes the same text, so both sides of every ratio are timed by one definition.
PEER_BEST_RATE = """
import time
def best_rate(fn, repeats=3, min_seconds=0.5):
    \"\"\"Best items/s over `repeats` runs of `fn`, which returns how many items it processed.\"\"\"
    best = 0.0
    for _ in range(repeats):
        count, start = 0, time.perf_counter()
        while True:
            count += fn()
            elapsed = time.perf_counter() - start
            if elapsed >= min_seconds:
                break
        best = max(best, count / elapsed)
    return best
"""
_timing: dict = {}
exec(PEER_BEST_RATE, _timing)  # noqa: S102  (our own constant source, see above)
best_rate: Callable[..., float] = _timing["best_rate"]


def report(suite: str, rows: list[dict]) -> None:
    """Prints rows of {workload, ours, peer, peer_name, unit} with ratio and stores them as JSON."""
    print(f"\n== {suite} ==")
    print(f"{'workload':58s} {'ours':>12s} {'peer':>12s} {'ratio':>7s}  peer")
    for row in rows:
        ours, theirs = row.get("ours"), row.get("peer")
        # A suite that measured in rounds gives the median of its rounds' ratios (`round_ratios`).
        ratio = row["ratio"] if "ratio" in row else (ours / theirs) if ours and theirs else None
        row["ratio"] = ratio
        fmt = lambda v: f"{v:12.4g}" if isinstance(v, (int, float)) else f"{'n/a':>12s}"  # noqa: E731
        spread = row.get("round_ratios")
        spread = f" [{min(spread):.2f}-{max(spread):.2f}]" if spread and len(spread) > 1 else ""
        print(f"{row['workload'][:58]:58s} {fmt(ours)} {fmt(theirs)} "
              f"{(f'{ratio:6.2f}x' if ratio else '    n/a')}{spread}  {row.get('peer_name', '')} "
              f"({row.get('unit', '')})")
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    meta = {"suite": suite, "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "cpus": os.cpu_count(), "rows": rows}
    (RESULTS_DIR / f"{suite}.json").write_text(json.dumps(meta, indent=1))
