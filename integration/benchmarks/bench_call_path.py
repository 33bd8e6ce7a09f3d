"""The per-call path on the CPU: Kiln against eager and torch.compile, in one run.

Models so small that the call itself (guards, dispatch, the host program, kernel calls,
building the output) is most of the cost, each at a size where it is the whole cost and at
a throughput size:

- a pointwise function of two tensors, ``(a*b+1).relu().sigmoid()*a``, on [16,32] and
  [512,512];
- an MLP of 8 Linear(64, 64) + ReLU layers at batch 1 and batch 64;
- a Hugging Face ``BertModel`` (2 layers, hidden 64, 4 heads, intermediate 128, vocab 512,
  random weights) on 1x16 and 8x128 token ids, called as a user calls it (a ``ModelOutput``
  comes back).

Inference: ``torch.no_grad()``, models in ``eval()``. Then training steps, where the host
path is also autograd's and the runtime's around the two graphs: ``zero_grad``, forward, the
loss ``out.float().square().mean()``, ``backward()``, in ``train()`` (dropout off), for the
BERT above with 12 layers (about 200 parameters) and a stack of 30 Conv2d(8, 8, 3) +
BatchNorm2d + ReLU (90 BatchNorm buffers written back at every step), each at a small and
a throughput size; each variant trains a copy of the model, and its loss and each gradient
(normwise, within 5 %: float32 rounding grows along a deep stack, torch.compile's
differs from eager's by 2 % on the BatchNorm stack) are checked against eager's. Each
variant (eager, ``torch.compile`` with inductor, ``kiln.compile``) is checked against
eager, warmed up, and timed as the median of repeats in which the variants take turns.
Kiln compiles with its
RuntimeWarnings turned into errors and must leave a host program per graph (see
``kiln_checks``). One process per thread count (``torch.set_num_threads``; inductor and Kiln
build their OpenMP kernels for the count they see): one thread and every core, or the
comma-separated counts of ``KILN_BENCH_THREADS``.

Run: ``python integration/bench.py call_path`` (or ``nox -s bench -- call_path``);
``KILN_BENCH_CASES`` picks cases by parts of their names (comma-separated, e.g. ``step:``).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from collections.abc import Callable

import torch
from kiln_checks import compile_checked
from timing import markdown_table, take_turns, thread_counts

REPEATS = 15
ROW = "ROW "  # a child process's result lines start with this


class MLP(torch.nn.Sequential):
    def __init__(self, width: int = 64, layers: int = 8) -> None:
        super().__init__(
            *(m for _ in range(layers) for m in (torch.nn.Linear(width, width), torch.nn.ReLU()))
        )


def pointwise(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a * b + 1).relu().sigmoid() * a


def tiny_bert() -> torch.nn.Module:
    from transformers import BertConfig, BertModel

    config = BertConfig(
        vocab_size=512,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=128,
    )
    return BertModel(config).eval()


def cases() -> list[tuple[str, Callable, list[torch.Tensor]]]:
    """(name, function or module, inputs), built with a fixed seed."""
    torch.manual_seed(0)
    mlp = MLP().eval()
    found = [
        ("pointwise [16,32]", pointwise, [torch.randn(16, 32), torch.randn(16, 32)]),
        ("pointwise [512,512]", pointwise, [torch.randn(512, 512), torch.randn(512, 512)]),
        ("MLP 8x Linear(64) batch 1", mlp, [torch.randn(1, 64)]),
        ("MLP 8x Linear(64) batch 64", mlp, [torch.randn(64, 64)]),
    ]
    try:
        bert = tiny_bert()
    except ImportError:
        print("bench_call_path: transformers is not installed; BERT is left out", file=sys.stderr)
        return found
    found += [
        ("BERT 2 layers hidden 64, 1x16 tokens", bert, [torch.randint(0, 512, (1, 16))]),
        ("BERT 2 layers hidden 64, 8x128 tokens", bert, [torch.randint(0, 512, (8, 128))]),
    ]
    return found


def conv_bn_stack(blocks: int = 30, width: int = 8) -> torch.nn.Module:
    layers = []
    for _ in range(blocks):
        layers += [
            torch.nn.Conv2d(width, width, 3, padding=1, bias=False),
            torch.nn.BatchNorm2d(width),
            torch.nn.ReLU(),
        ]
    return torch.nn.Sequential(*layers)


def training_cases() -> list[tuple[str, torch.nn.Module, list[torch.Tensor]]]:
    """(name, module in train(), inputs) for training steps, built with a fixed seed."""
    torch.manual_seed(0)
    stack = conv_bn_stack().train()
    found = [
        ("step: Conv+BN x30, batch 2 8x8", stack, [torch.randn(2, 8, 8, 8)]),
        ("step: Conv+BN x30, batch 32 32x32", stack, [torch.randn(32, 8, 32, 32)]),
    ]
    try:
        from transformers import BertConfig, BertModel
    except ImportError:
        return found
    config = BertConfig(
        vocab_size=512, hidden_size=64, num_hidden_layers=12, num_attention_heads=4,
        intermediate_size=128, max_position_embeddings=128, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    bert = BertModel(config).train()
    found += [
        ("step: BERT 12 layers hidden 64, 1x16 tokens", bert, [torch.randint(0, 512, (1, 16))]),
        ("step: BERT 12 layers hidden 64, 8x128 tokens", bert, [torch.randint(0, 512, (8, 128))]),
    ]
    return found


def first_tensor(out: object) -> torch.Tensor:
    if hasattr(out, "to_tuple"):  # a Hugging Face ModelOutput: its first field
        out = out.to_tuple()
    while isinstance(out, (tuple, list)):
        out = out[0]
    return out  # type: ignore[return-value]


def measure(fn: Callable, inputs: list[torch.Tensor]) -> tuple[dict[str, float], str]:
    """µs per call of each variant, and what Kiln compiled."""
    expected = first_tensor(fn(*inputs))
    kiln_fn, compiled = compile_checked(fn, lambda k: k(*inputs))
    torch._dynamo.reset()
    inductor = torch.compile(fn)
    for name, variant in (("torch.compile", inductor), ("kiln", kiln_fn)):
        for _ in range(3):  # warm-up: compile, first-touch of the outputs
            got = first_tensor(variant(*inputs))
        torch.testing.assert_close(
            got, expected, rtol=1e-4, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}"
        )
    seconds = take_turns(
        {
            "eager": lambda: fn(*inputs),
            "torch.compile": lambda: inductor(*inputs),
            "kiln": lambda: kiln_fn(*inputs),
        },
        repeats=REPEATS,
    )
    return {k: v * 1e6 for k, v in seconds.items()}, compiled.describe()


def training_step(model: torch.nn.Module, fn: Callable, inputs: list[torch.Tensor]):
    """One step: ``zero_grad``, forward, loss, backward; returns the loss."""
    model.zero_grad(set_to_none=True)
    loss = first_tensor(fn(*inputs)).float().square().mean()
    loss.backward()
    return loss.detach()


def measure_training(
    model: torch.nn.Module, inputs: list[torch.Tensor]
) -> tuple[dict[str, float], str]:
    """µs per training step of each variant (each on a copy of ``model``), and what Kiln
    compiled. Each variant's loss and gradients are checked against eager's first."""
    copies = {name: copy.deepcopy(model) for name in ("eager", "torch.compile", "kiln")}
    expected = training_step(copies["eager"], copies["eager"], inputs)
    grads = [p.grad for p in copies["eager"].parameters()]
    kiln_model = copies["kiln"]
    kiln_fn, compiled = compile_checked(
        kiln_model, lambda k: training_step(kiln_model, k, inputs), calls=1
    )
    torch._dynamo.reset()
    steps = {
        "eager": (copies["eager"], copies["eager"]),
        "torch.compile": (copies["torch.compile"], torch.compile(copies["torch.compile"])),
        "kiln": (kiln_model, kiln_fn),
    }
    # a gradient that is zero but for rounding (a key projection's bias) is compared on
    # the scale of the whole gradient
    scale = torch.stack([g.norm() for g in grads if g is not None]).norm()
    for name, (m, fn) in steps.items():
        for _ in range(3):  # warm-up: compile, the backward's first run
            loss = training_step(m, fn, inputs)
        if name == "eager":
            continue
        torch.testing.assert_close(loss, expected, rtol=1e-3, atol=1e-5)
        for p, want in zip(m.parameters(), grads, strict=True):
            # (None and zeros alike: torch.compile leaves None where eager gives zeros)
            got = p.grad if p.grad is not None else torch.zeros_like(p)
            want = want if want is not None else torch.zeros_like(p)
            if (got - want).norm() > 5e-2 * want.norm() + 1e-4 * scale:
                raise AssertionError(f"{name}: a gradient differs from eager's by over 5 %")
    variants = {
        name: (lambda m=m, fn=fn: training_step(m, fn, inputs)) for name, (m, fn) in steps.items()
    }
    seconds = take_turns(variants, repeats=REPEATS)
    return {k: v * 1e6 for k, v in seconds.items()}, compiled.describe()


def run_threads(threads: int) -> None:
    """In a child process: every case at ``threads`` threads, one ``ROW`` line each."""
    torch.set_num_threads(threads)
    runs = [(name, lambda fn=fn, x=x: measure(fn, x), True) for name, fn, x in cases()]
    runs += [
        (name, lambda m=m, x=x: measure_training(m, x), False) for name, m, x in training_cases()
    ]
    picked = [p for p in os.environ.get("KILN_BENCH_CASES", "").split(",") if p.strip()]
    for name, run, inference in runs:
        if picked and not any(p.strip() in name for p in picked):
            continue
        try:
            with torch.set_grad_enabled(not inference):
                us, note = run()
            row = {"case": name, "threads": threads, "us": us, "note": note}
        except Exception as exc:  # a failing case is a row, the others still run
            row = {"case": name, "threads": threads, "us": None, "note": f"error: {exc!r}"}
        print(ROW + json.dumps(row), flush=True)


def format_row(row: dict) -> list[str]:
    us = row["us"]
    if us is None:
        return [row["case"], str(row["threads"]), "", "", "", "", "", row["note"][:200]]
    return [
        row["case"],
        str(row["threads"]),
        f"{us['eager']:.1f}",
        f"{us['torch.compile']:.1f}",
        f"{us['kiln']:.1f}",
        f"{us['kiln'] / us['torch.compile']:.2f}",
        f"{us['kiln'] / us['eager']:.2f}",
        row["note"],
    ]


def main() -> str:
    load_before = os.getloadavg()[0]
    rows = []
    for threads in thread_counts():
        proc = subprocess.run(
            [sys.executable, __file__, "--threads", str(threads)], capture_output=True, text=True
        )
        found = [
            json.loads(line[len(ROW) :])
            for line in proc.stdout.splitlines()
            if line.startswith(ROW)
        ]
        if not found:
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            found = [
                {"case": "all cases", "threads": threads, "us": None, "note": f"error: {last}"}
            ]
        for row in found:
            rows.append(format_row(row))
            print("| " + " | ".join(rows[-1]) + " |", file=sys.stderr, flush=True)
    header = ["case", "threads", "eager µs", "torch.compile µs", "kiln µs",
              "kiln / torch.compile", "kiln / eager", "kiln compiled"]  # fmt: skip
    intro = (
        f"torch {torch.__version__}, {os.cpu_count()} cores (load average {load_before:.1f} "
        f"before, {os.getloadavg()[0]:.1f} after); µs per call, median of {REPEATS} repeats; "
        "ratios are time over time (below 1: kiln is faster)"
    )
    return f"{intro}\n\n{markdown_table(header, rows, numeric=6)}"


if __name__ == "__main__":
    if sys.argv[1:2] == ["--threads"]:
        run_threads(int(sys.argv[2]))
    else:
        print(main())
