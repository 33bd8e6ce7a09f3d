"""Run Kiln's CPU benchmarks: each module in integration/benchmarks/ measures Kiln against eager
and torch.compile in one run and returns rows for the table printed last.

Run it with ``python3 -m nox -s bench``.
"""

from __future__ import annotations

import importlib
import pathlib
import sys

BENCH_DIR = pathlib.Path(__file__).parent / "benchmarks"


def main(names: list[str]) -> int:
    modules = sorted(p.stem for p in BENCH_DIR.glob("bench_*.py"))
    chosen = [m for m in modules if not names or any(n in m for n in names)]
    if not chosen:
        print(f"no benchmark matches {names}; there are: {modules}")
        return 1
    sys.path.insert(0, str(BENCH_DIR))
    for name in chosen:
        module = importlib.import_module(name)
        print(f"\n## {name}\n")
        print(module.main())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
