"""Kept captures in Kiln's cache: a second process restores each frame's guards and compiled
graphs instead of tracing its bytecode (kiln.capture_store), and traces where its settings
differ."""

import os

from helpers import run_in_new_process

STEPS = """
import json, sys, torch, kiln
sys.path.insert(0, {helpers!r})
from helpers import Block, copy_of
torch.manual_seed(0)
model = Block()
reference = copy_of(model)
compiled = kiln.compile(model, options={options!r})
x = torch.randn(4, 16)  # drawn after the same seed in every process
with torch.no_grad():
    torch.testing.assert_close(compiled(x), reference(x))
compiled(x).pow(2).sum().backward()
reference(x).pow(2).sum().backward()
torch.testing.assert_close(model.up.weight.grad, reference.up.weight.grad)
stats = object.__getattribute__(compiled, "_captured")._captured.stats
print(json.dumps({{"stages": sorted(kiln.compile_times()), "compiles": stats.compiles,
                   "restored": stats.restored}}))
"""


def run_steps(tmp_path, **options) -> dict:
    options = {"cache_dir": str(tmp_path / "kiln-cache"), **options}
    script = STEPS.format(helpers=os.path.dirname(__file__), options=options)
    return run_in_new_process(script, tmp_path)


def test_a_second_process_restores_its_captures_and_traces_nothing(tmp_path):
    first = run_steps(tmp_path)
    assert (first["compiles"], first["restored"]) == (2, 0)  # inference, then training
    assert list((tmp_path / "kiln-cache" / "graphs").rglob("*.capture"))
    second = run_steps(tmp_path)
    assert (second["compiles"], second["restored"]) == (0, 2)
    assert "lowering" not in second["stages"] and "cache_load" in second["stages"]


def test_other_settings_and_a_debug_folder_trace_again(tmp_path):
    run_steps(tmp_path)
    other = run_steps(tmp_path, fusion=False)
    assert (other["compiles"], other["restored"]) == (2, 0)
    debugging = run_steps(tmp_path, debug_dir=str(tmp_path / "debug"))  # every dump written
    assert (debugging["compiles"], debugging["restored"]) == (2, 0)
    assert list((tmp_path / "debug").rglob("captured_graph.py"))
