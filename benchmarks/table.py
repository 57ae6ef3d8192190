"""Prints the benchmark table of docs/benchmarks.md (markdown) from `benchmarks/results/*.json`.

`python -m benchmarks.run` writes the results; `python -m benchmarks.table` renders them, so the README
table always comes from one recorded run per suite.
"""
import json

from benchmarks._harness import RESULTS_DIR

_ORDER = ("recording", "loading", "patterns", "buffers", "server", "wire")


def _fmt(value) -> str:
    if not isinstance(value, (int, float)):
        return "n/a"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def render() -> str:
    suites = {p.stem: json.loads(p.read_text()) for p in sorted(RESULTS_DIR.glob("*.json"))}
    # load.json (tests/replay_tf/test_load.py) has no peer side: README's reliability section quotes it.
    suites = {name: suite for name, suite in suites.items() if "rows" in suite}
    lines = ["| suite | workload | ours | peer | ratio | peer is | unit |", "|---|---|---|---|---|---|---|"]
    for name in sorted(suites, key=lambda n: (_ORDER.index(n) if n in _ORDER else len(_ORDER), n)):
        suite = suites[name]
        for row in suite["rows"]:
            ratio = row.get("ratio")
            spread = row.get("round_ratios")  # (medians over rounds: the rounds' range beside)
            spread = f" ({min(spread):.2f}-{max(spread):.2f})" if spread and len(spread) > 1 else ""
            lines.append(f"| {name} | {row['workload']} | {_fmt(row.get('ours'))} | "
                         f"{_fmt(row.get('peer'))} | {f'{ratio:.2f}x{spread}' if ratio else ''} | "
                         f"{row.get('peer_name', '')} | {row.get('unit', '')} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(render())
