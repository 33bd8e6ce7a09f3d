"""The README's first command runs the demo: it must run to the end and say what it checked."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("transformers")

DEMO = pathlib.Path(__file__).parent / "demo.py"


@pytest.mark.slow
def test_demo_runs_and_checks_against_eager():
    done = subprocess.run(
        [sys.executable, str(DEMO)], capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-4000:]
    out = done.stdout
    assert "inference and a training step equal eager (logits, loss, every gradient): yes" in out
    for row in ("compile, empty caches", "compile, 2nd process", "speedup over eager"):
        assert row in out
    dump = pathlib.Path(out.split("debug dump: ")[1].split()[0])
    assert (dump / "frame000" / "forward_kernels.cpp").exists()
    assert "runs eagerly" not in done.stderr, "no graph fell back to eager"
