"""Kiln's demo: a Hugging Face model built from a small config, through Kiln.

Run it with ``python3 -m nox -s demo``. Today Kiln's bytecode capture is complete enough to
take whole models; code generation comes next, so this demo captures the model and
compares what capture costs against torch.compile's own capture, measured in this run.
"""

from __future__ import annotations

import time

import torch
import torch._dynamo
from models import tiny_bert

import kiln
import kiln_capture


def eager_backend(gm, example_inputs):
    return gm.forward


def time_first_call(fn, inputs) -> float:
    start = time.perf_counter()
    with torch.no_grad():
        fn(**inputs)
    return time.perf_counter() - start


def per_call_us(fn, inputs, calls=200) -> float:
    best = float("inf")
    with torch.no_grad():
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(calls):
                fn(**inputs)
            best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def main() -> None:
    print(f"kiln {kiln.__version__}, torch {torch.__version__}")
    for plugin in kiln.list_backends():
        print(f"  plug-in {plugin.describe()}")

    torch.manual_seed(0)
    model, inputs = tiny_bert()
    report = kiln_capture.explain(model)(**inputs)
    print(
        f"\nBERT (2 layers, hidden 64) captured by kiln-capture: {report.graph_count} graph, "
        f"{report.op_count} ops, {len(report.graph_breaks)} graph breaks, "
        f"{len(report.guards[0].splitlines()) // 2 - 1} guards"
    )

    captured = kiln_capture.capture(model, eager_backend)
    kiln_capture_s = time_first_call(captured, inputs)
    torch._dynamo.reset()
    dynamo = torch.compile(model, backend="eager")
    dynamo_s = time_first_call(dynamo, inputs)

    with torch.no_grad():
        expected = model(**inputs).last_hidden_state
        torch.testing.assert_close(captured(**inputs).last_hidden_state, expected)
    eager_us = per_call_us(model, inputs)
    kiln_us = per_call_us(captured, inputs)
    dynamo_us = per_call_us(dynamo, inputs)
    print("equal to eager: yes")
    print(
        f"capture time:     kiln-capture {kiln_capture_s * 1e3:7.1f} ms   "
        f"torch.compile {dynamo_s * 1e3:7.1f} ms   ({dynamo_s / kiln_capture_s:.1f}x faster)"
    )
    print(
        f"time per call:    eager {eager_us:7.1f} µs   kiln-capture {kiln_us:7.1f} µs   "
        f"torch.compile {dynamo_us:7.1f} µs   (both with an eager backend)"
    )
    print("Speedups over eager need Kiln's code generation, which is not in this release.")


if __name__ == "__main__":
    main()
