"""PyTorch's OpInfo samples (``op_db``) compiled through the whole stack with ``kiln.compile``.

Each sample becomes a function of no arguments that calls the op on the sample's tensors
(closed over, so capture turns them into graph inputs with guards), compiled on the CPU
(kiln-cpp) with the graph cache off, and compared with eager (``assert_close``, its
per-dtype tolerances, NaN equal to NaN). A sample ends as one of:

- ``passed``: kiln's compiled graphs produced eager's result (in bfloat16, or the op's
  result computed in float32 and rounded to bfloat16: kernels round once, at the end);
- ``eager``: the result matched, but part of it ran eagerly: a graph break, a frame that
  kiln-capture ran eagerly, or an aten graph with no generated code (Kiln's
  ``RuntimeWarning``);
- ``failed``: a different result, or an error eager does not raise;

and each counts the extern ATen calls in the loop IR of its compiled graphs (the
``kiln.fallbacks`` ops and the externs by design, such as matmul and convolution).

Run as a script for the table (``--help``); ``test_opinfo_sweep.py`` runs it under pytest.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import pathlib
import shutil
import sys
import tempfile
import time
import warnings

import torch
from torch.utils._pytree import tree_map

import kiln
from kiln_loopir.testing.opinfo import SKIP

# The second dtype of each op: the first of these the op supports on the CPU.
SECOND_DTYPES = (torch.bfloat16, torch.float64, torch.int64)
MAX_SAMPLES = 2  # per op and dtype (the full sample lists take hours on two cores)
OPTIONS = {"cache": False, "codegen": "cpp"}


@dataclasses.dataclass
class Outcome:
    op: str
    dtype: str
    sample: int
    status: str  # "passed", "eager" or "failed"
    externs: int = 0
    detail: str = ""


RESULTS: list[Outcome] = []  # every outcome of a pytest run, for the table at its end


def dtypes_of(op) -> list[torch.dtype]:
    """float32 and one more dtype the op supports (where it supports one)."""
    supported = op.supported_dtypes("cpu")
    out = [torch.float32] if torch.float32 in supported else []
    out += [d for d in SECOND_DTYPES if d in supported][:1]
    return out


# Factories of random numbers: a compiled graph draws its own (with the right
# distribution), not eager's, as torch.compile's graphs do; their values are not compared.
RANDOM_FACTORIES = {"randn", "rand", "randint"}


def selected_ops(op_db) -> list:
    return [op for op in op_db if op.name not in SKIP and op.name not in RANDOM_FACTORIES]


def _clone(tree):
    return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, tree)


def _call(opfn, args, kwargs):
    def sample_fn():  # plain closure cells: capture guards them as graph inputs
        return opfn(*args, **kwargs)

    return sample_fn


def _extern_calls(debug_dir: pathlib.Path) -> int:
    return sum(
        line.count(" = extern ")
        for path in debug_dir.glob("*/*_loopir.txt")
        for line in path.read_text().splitlines()
    )


def _ran_eagerly(debug_dir: pathlib.Path, caught: list) -> str:
    kiln_warnings = [str(w.message) for w in caught if str(w.message).startswith("kiln")]
    if kiln_warnings:
        return kiln_warnings[0].splitlines()[0][:300]
    frames = [p for p in debug_dir.iterdir() if p.is_dir()]
    if not frames:
        return "no graph was captured"
    if any((f / "graph_break.txt").exists() for f in frames):
        return "graph break: " + next(
            (f / "graph_break.txt").read_text().splitlines()[0]
            for f in frames
            if (f / "graph_break.txt").exists()
        )
    if not any(f.glob("forward_aten.py") for f in frames):
        return "no aten graph (the captured graph ran as it is)"
    return ""


def _assert_matches(got, expected, op, args, kwargs, dtype: torch.dtype) -> None:
    """``got`` equals eager's result within ``assert_close``'s tolerances for its dtype. In
    bfloat16 and float16 it may instead match the op computed in float32 (and rounded):
    generated kernels compute in float32 and round once, where eager may round each step."""
    try:
        torch.testing.assert_close(got, expected, equal_nan=True)
    except AssertionError:
        if dtype not in (torch.bfloat16, torch.float16):
            raise
        wide = tree_map(_widened(dtype, torch.float32), (_clone(args), _clone(kwargs)))
        reference = tree_map(_widened(torch.float32, dtype), op.op(*wide[0], **wide[1]))
        torch.testing.assert_close(got, reference, equal_nan=True)


def _widened(src: torch.dtype, dst: torch.dtype):
    return lambda t: t.to(dst) if isinstance(t, torch.Tensor) and t.dtype == src else t


def check_sample(op, dtype: torch.dtype, k: int, sample) -> Outcome | None:
    """One sample through ``kiln.compile``; None where eager itself refuses it."""
    outcome = Outcome(op.full_name, str(dtype).removeprefix("torch."), k, "failed")
    args, kwargs = (sample.input, *sample.args), dict(sample.kwargs)
    try:
        expected = op.op(*_clone(args), **_clone(kwargs))
    except Exception:
        return None
    debug_dir = pathlib.Path(tempfile.mkdtemp(prefix="kiln-opinfo-"))
    kiln.reset()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            compiled = kiln.compile(
                _call(op.op, _clone(args), _clone(kwargs)),
                options={**OPTIONS, "debug_dir": str(debug_dir)},
            )
            got = compiled()
        _assert_matches(got, expected, op, args, kwargs, dtype)
        outcome.externs = _extern_calls(debug_dir)
        eager = _ran_eagerly(debug_dir, caught)
        outcome.status, outcome.detail = ("eager", eager) if eager else ("passed", "")
    except Exception as exc:
        outcome.externs = _extern_calls(debug_dir)
        first = (str(exc).strip().splitlines() or [""])[0]
        outcome.detail = f"{type(exc).__name__}: {first}"[:300]
    finally:
        shutil.rmtree(debug_dir, ignore_errors=True)
        kiln.reset()
    return outcome


def sweep_op(op, dtype: torch.dtype, max_samples: int = MAX_SAMPLES) -> list[Outcome]:
    """The first ``max_samples`` samples of ``op`` in ``dtype`` that eager accepts, each
    compiled alone (random samples, such as dropout in training, left out)."""
    out: list[Outcome] = []
    for k, sample in enumerate(op.sample_inputs("cpu", dtype, requires_grad=False)):
        if len(out) >= max_samples:
            break
        if sample.kwargs.get("dropout_p") or sample.kwargs.get("training"):
            continue
        outcome = check_sample(op, dtype, k, sample)
        if outcome is not None:
            out.append(outcome)
    return out


def table(outcomes: list[Outcome]) -> str:
    """Per dtype: ops, samples, passed, eager, failed, extern calls and the samples with
    any; the last row sums them (its ops: the distinct ops)."""
    rows = collections.defaultdict(collections.Counter)
    ops = collections.defaultdict(set)
    for o in outcomes:
        row = rows[o.dtype]
        row["samples"] += 1
        row[o.status] += 1
        row["externs"] += o.externs
        row["with_extern"] += o.externs > 0
        ops[o.dtype].add(o.op)
    head = (
        "dtype",
        "ops",
        "samples",
        "passed",
        "eager",
        "failed",
        "extern calls",
        "samples w/ extern",
    )
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    total = collections.Counter()
    for dtype in sorted(rows, key=lambda d: (d != "float32", d)):
        row = rows[dtype]
        total.update(row)
        lines.append(_row(dtype, len(ops[dtype]), row))
    lines.append(_row("all", len(set().union(*ops.values())), total))
    return "\n".join(lines)


def _row(name: str, n_ops: int, row: collections.Counter) -> str:
    cells = [name, n_ops, row["samples"], row["passed"], row["eager"], row["failed"]]
    cells += [row["externs"], row["with_extern"]]
    return "| " + " | ".join(str(c) for c in cells) + " |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-samples", type=int, default=MAX_SAMPLES)
    parser.add_argument("--ops", help="comma-separated op names (default: all of op_db)")
    parser.add_argument("--chunk", default="1/1", help="i/n: the i-th of n slices of the ops")
    parser.add_argument("--json", help="write every outcome here (JSON lines)")
    parser.add_argument("--table", nargs="+", metavar="JSONL", help="only print the table of these")
    args = parser.parse_args(argv)
    if args.table:
        outcomes = [
            Outcome(**json.loads(line))
            for path in args.table
            for line in pathlib.Path(path).read_text().splitlines()
        ]
        print(table(outcomes))
        return 0
    from torch.testing._internal.common_methods_invocations import op_db

    ops = selected_ops(op_db)
    if args.ops:
        wanted = set(args.ops.split(","))
        ops = [op for op in ops if op.name in wanted or op.full_name in wanted]
    i, n = (int(v) for v in args.chunk.split("/"))
    ops = ops[i - 1 :: n]
    out = open(args.json, "w") if args.json else None  # noqa: SIM115 - written as it goes
    outcomes: list[Outcome] = []
    start = time.perf_counter()
    for op in ops:
        for dtype in dtypes_of(op):
            for o in sweep_op(op, dtype, args.max_samples):
                outcomes.append(o)
                if out is not None:
                    out.write(json.dumps(dataclasses.asdict(o)) + "\n")
                    out.flush()
                if o.status == "failed":
                    print(f"FAILED {o.op} {o.dtype} [{o.sample}]: {o.detail}", file=sys.stderr)
    print(table(outcomes))
    print(f"{len(ops)} ops in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
