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
    assert "python -m kiln cache info" in out  # how to see (and clear) the cache
    assert "runs eagerly" not in done.stderr, "no graph fell back to eager"


def test_the_dump_summary_lists_every_frames_files(tmp_path):
    sys.path.insert(0, str(DEMO.parent))
    import demo

    for frame, files in (("frame000", ["forward_aten.py", "guards.py"]), ("frame001", ["x.py"])):
        (tmp_path / frame).mkdir()
        for name in files:
            (tmp_path / frame / name).write_text("")
    text = demo.dump_summary(tmp_path)
    assert text.splitlines()[0] == f"debug dump: {tmp_path}  (2 frames)"
    assert "  frame000: forward_aten.py, guards.py" in text
    assert "  frame001: x.py" in text
