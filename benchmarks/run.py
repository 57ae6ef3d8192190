"""Runs every side-by-side benchmark (or the ones named): `python -m benchmarks.run [name ...]`."""
import importlib
import pkgutil
import sys

import benchmarks


def main(argv: list[str]) -> None:
    names = argv or sorted(m.name for m in pkgutil.iter_modules(benchmarks.__path__)
                           if m.name.startswith("bench_"))
    for name in names:
        module = importlib.import_module(f"benchmarks.{name if name.startswith('bench_') else 'bench_' + name}")
        module.main()


if __name__ == "__main__":
    main(sys.argv[1:])
