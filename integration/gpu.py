"""The GPU entry point: every GPU check and benchmark in one run, a short table last.

Runs with the GPU machine's own python3 (torch, triton, transformers and timm are there);
Kiln's packages and the third-party wheels it lacks arrive as wheels built by
``nox -s gpu-wheels`` (see docs/development.md for the device command). Writes the logs
of failing suites and the benchmark tables to ``$OUT`` when that is set.

A run that must fit in a time limit picks a part: ``KILN_GPU_TESTS`` and ``KILN_GPU_BENCH``
name test suites and benchmarks (comma-separated parts of their names, e.g.
``KILN_GPU_TESTS=kiln-triton,end-to-end``, ``KILN_GPU_BENCH=gpu_calls``; ``none`` runs
none; unset runs all). The benchmarks read their own variables (``KILN_BENCH_MODELS`` ...).
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass

ROOT = pathlib.Path(__file__).resolve().parents[1]
OUT = pathlib.Path(os.environ.get("OUT", ROOT / ".gpu-out"))


@dataclass
class SuiteResult:
    name: str
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    seconds: float = 0.0
    note: str = ""


def chosen(names: list[str], variable: str) -> list[str]:
    """The ``names`` that ``$variable`` picks (see the module docstring)."""
    given = os.environ.get(variable, "").strip()
    if not given:
        return names
    parts = [p.strip() for p in given.split(",") if p.strip() and p.strip() != "none"]
    return [n for n in names if any(p in n for p in parts)]


def test_suites() -> list[tuple[str, list[str]]]:
    """(name, pytest paths) for every package's tests, the end-to-end tests and integration."""
    suites = [
        (p.name, [str(p / "tests")])
        for p in sorted((ROOT / "packages").iterdir())
        if (p / "tests").is_dir()
    ]
    suites.append(("end-to-end", [str(ROOT / "tests")]))
    suites.append(("integration", [str(ROOT / "integration")]))
    picked = chosen([name for name, _ in suites], "KILN_GPU_TESTS")
    return [(name, paths) for name, paths in suites if name in picked]


def run_suite(name: str, paths: list[str]) -> SuiteResult:
    report = OUT / f"junit-{name}.xml"
    start = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            *paths,
            "-q",
            "-p",
            "no:cacheprovider",
            "-m",
            "not slow or gpu",
            f"--junitxml={report}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    result = SuiteResult(name, seconds=time.perf_counter() - start)
    log = proc.stdout + proc.stderr
    if not report.exists():
        result.note = f"pytest exited {proc.returncode} without a report"
        print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n")
        return result
    for suite in ET.parse(report).getroot().iter("testsuite"):
        total = int(suite.get("tests", 0))
        failed = int(suite.get("failures", 0)) + int(suite.get("errors", 0))
        skipped = int(suite.get("skipped", 0))
        result.failed += failed
        result.skipped += skipped
        result.passed += total - failed - skipped
    report.unlink()  # only the logs of failing suites come back (the device returns 8 files)
    if result.failed:
        (OUT / f"log-{name}.txt").write_text(log)
        print(f"--- {name}: failures ---\n{proc.stdout[-6000:]}")
    return result


def run_benchmarks() -> list[SuiteResult]:
    """Every integration/benchmarks/bench_*.py: its table printed, a row in the summary."""
    bench_dir = ROOT / "integration" / "benchmarks"
    results = []
    paths = sorted(bench_dir.glob("bench_*.py"))
    picked = chosen([p.stem for p in paths], "KILN_GPU_BENCH")
    for path in (p for p in paths if p.stem in picked):
        # each in a process of its own: one benchmark's state must not slow another's
        start = time.perf_counter()
        result = SuiteResult(f"bench {path.stem[6:]}")
        proc = subprocess.run(
            [sys.executable, "-c", f"import {path.stem} as b; print(b.main())"],
            cwd=bench_dir,
            capture_output=True,
            text=True,
        )
        result.seconds = time.perf_counter() - start
        if proc.returncode == 0:
            table = proc.stdout.strip().split("\n\n")[-1]
            print(f"\n## {path.stem}\n\n{table}", flush=True)
            (OUT / f"{path.stem}.md").write_text(table + "\n")
            result.passed = 1
        else:  # a broken benchmark is reported, the others still run
            result.failed = 1
            result.note = (proc.stderr.strip().splitlines() or ["no output"])[-1][:120]
        results.append(result)
    return results


def environment() -> list[str]:
    import torch

    lines = [f"python {sys.version.split()[0]}", f"torch {torch.__version__}"]
    if torch.cuda.is_available():
        lines.append(f"device {torch.cuda.get_device_name()}")
    else:
        lines.append("device: no CUDA device")
    try:
        import triton

        lines.append(f"triton {triton.__version__}")
    except ImportError as exc:
        lines.append(f"triton missing: {exc}")
    try:
        import kiln

        lines += [f"plug-in {p.describe()}" for p in kiln.list_backends()]
    except ImportError as exc:
        lines.append(f"kiln is not installed ({exc}): build the wheels with nox -s gpu-wheels")
    return lines


def print_table(results: list[SuiteResult]) -> None:
    print("\n| suite | passed | failed | skipped | seconds | note |")
    print("|---|---:|---:|---:|---:|---|")
    for r in results:
        print(f"| {r.name} | {r.passed} | {r.failed} | {r.skipped} | {r.seconds:.1f} | {r.note} |")


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    print("\n".join(environment()), flush=True)
    results = [run_suite(name, paths) for name, paths in test_suites()]
    results += run_benchmarks()
    print_table(results)
    return 1 if any(r.failed or r.note for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
