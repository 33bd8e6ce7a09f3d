"""Per-call overhead of capture (guards plus dispatch) against torch.compile, in one run.

Both use an eager backend on a function of two small tensors, so what is measured is the
cost of deciding that the cached capture applies and calling it: time per call of the
captured function minus time per call of the plain function, best of 40 rounds in which the
variants take turns, with the garbage collector paused while timing (as ``timeit`` does).
"""

from __future__ import annotations

import gc
import time

import torch

import kiln_capture

CALLS = 5_000
ROUNDS = 40


def add_mul(a, b):
    return (a + b) * 2


def time_calls(fn, a, b) -> float:
    """µs per call, with the garbage collector paused as ``timeit`` does."""
    gc.disable()
    try:
        start = time.perf_counter()
        for _ in range(CALLS):
            fn(a, b)
        return (time.perf_counter() - start) / CALLS * 1e6
    finally:
        gc.enable()


def measure() -> dict[str, float]:
    """Best time per call of each variant; the variants take turns within every round, so a
    busy machine slows them alike."""
    a, b = torch.randn(8), torch.randn(8)
    kiln = kiln_capture.capture(add_mul, lambda gm, example_inputs: gm.forward)
    torch._dynamo.reset()
    dynamo = torch.compile(add_mul, backend="eager")
    for fn in (kiln, dynamo):
        for _ in range(100):
            fn(a, b)
    if kiln.stats.compiles != 1 or kiln.stats.eager_reason is not None:
        raise RuntimeError(f"the capture did not compile: {kiln.stats}")
    variants = {"eager": add_mul, "kiln-capture": kiln, "torch.compile": dynamo}
    best = dict.fromkeys(variants, float("inf"))
    for _ in range(ROUNDS):
        for name, fn in variants.items():
            best[name] = min(best[name], time_calls(fn, a, b))
    return {
        "eager": best["eager"],
        "kiln-capture": best["kiln-capture"] - best["eager"],
        "torch.compile": best["torch.compile"] - best["eager"],
    }


def main() -> str:
    m = measure()
    ratio = m["kiln-capture"] / m["torch.compile"]
    return "\n".join(
        [
            "| | µs per call |",
            "|---|---:|",
            f"| eager function | {m['eager']:.2f} |",
            f"| kiln-capture overhead (eager backend) | {m['kiln-capture']:.2f} |",
            f'| torch.compile overhead (backend="eager") | {m["torch.compile"]:.2f} |',
            f"| kiln / torch.compile | {ratio:.2f} |",
        ]
    )


if __name__ == "__main__":
    print(main())
