"""Convolution layouts on the GPU: Kiln with and without channels-last convolution inputs,
against eager and torch.compile, in one run.

For each timm convnet (random weights, batch norms given random statistics and weights,
bf16, 224x224 images, batch ``KILN_BENCH_BATCH``): inference under ``torch.no_grad()`` in
five variants — eager, ``torch.compile``, ``kiln.compile(options={"channels_last": False,
"freezing": False})`` (activations as captured, NCHW), ``{"freezing": False}``
(channels-last convolution inputs) and ``kiln.compile`` (its default: channels-last inputs,
batch norms folded into the convolutions, weights laid out once) — and for the models in
``KILN_BENCH_TRAIN`` a training step (``zero_grad(set_to_none=True)``, forward,
``out.float().square().mean().backward()``) with ``channels_last`` False and True.
Per call: wall µs (30 back-to-back calls between two synchronizes, after warm-up; Kiln's
default mode replays CUDA graphs), GPU-busy µs and kernels (``torch.profiler`` over 5
calls after ``WARMUP`` calls, so that no CUDA graph is recorded inside the profile; see
``gpu_timing``), and the largest difference from eager's output relative to its largest
magnitude.

Environment: ``KILN_BENCH_MODELS`` (default ``resnet50,convnext_tiny,mobilenetv3_large_100``),
``KILN_BENCH_BATCH`` (8), ``KILN_BENCH_TRAIN`` (``resnet50``; ``none`` for no training row).
"""

from __future__ import annotations

import copy
import os
import time

import torch
from gpu_timing import profile_calls
from timing import background_builds_finished, markdown_table

WARMUP = 3  # calls before the profiled ones: Kiln's default mode records at the second
HEADER = ["model", "phase", "variant", "wall µs", "GPU-busy µs", "kernels", "rel. diff vs eager"]


def wall_us(fn, calls: int = 30) -> float:
    for _ in range(3):
        fn()
    background_builds_finished()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def randomized_norms(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with random batch-norm statistics and affine weights: timm starts the last
    norm of each residual block at zero, which would hide a wrong result in its branch."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                m.running_mean.normal_(0, 0.1)
                m.running_var.uniform_(0.5, 1.5)
                if m.weight is not None:
                    m.weight.uniform_(0.5, 1.5)
                    m.bias.normal_(0, 0.1)
    return model


def inference_rows(name: str, batch: int) -> list[list[object]]:
    import timm

    import kiln

    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False)
    model = randomized_norms(model).cuda().to(torch.bfloat16).eval()
    x = torch.randn(batch, 3, 224, 224, device="cuda", dtype=torch.bfloat16)
    unfrozen = {"freezing": False}
    variants = {
        "eager": model,
        "torch.compile": torch.compile(copy.deepcopy(model)),
        "kiln, NCHW": kiln.compile(
            copy.deepcopy(model), options={"channels_last": False, **unfrozen}
        ),
        "kiln, channels-last": kiln.compile(copy.deepcopy(model), options=unfrozen),
        "kiln (default: channels-last, frozen)": kiln.compile(copy.deepcopy(model)),
    }
    diffs, walls = {}, {}
    with torch.no_grad():
        expected = model(x).float()
        for label, fn in variants.items():
            got = fn(x).float()
            for _ in range(WARMUP):  # CUDA graphs recorded before the timed calls
                fn(x)
            diffs[label] = ((got - expected).abs().max() / expected.abs().max()).item()
            walls[label] = wall_us(lambda fn=fn: fn(x))
        rows = []
        for label, fn in variants.items():  # profiled after every variant is timed
            busy = profile_calls(lambda fn=fn: fn(x), 5)
            wall, diff = walls[label], diffs[label]
            rows.append([name, f"inference b{batch}", label, f"{wall:.0f}",
                         f"{busy.busy_us:.0f}", f"{busy.kernels:.0f}", f"{diff:.1e}"])  # fmt: skip
    return rows


def training_rows(name: str, batch: int) -> list[list[object]]:
    import timm

    import kiln

    torch.manual_seed(0)
    base = timm.create_model(name, pretrained=False).cuda().to(torch.bfloat16).train()
    x = torch.randn(batch, 3, 224, 224, device="cuda", dtype=torch.bfloat16)
    variants = {
        "eager": lambda m: m,
        "torch.compile": torch.compile,
        "kiln, NCHW (default)": lambda m: kiln.compile(m, options={"channels_last": False}),
        "kiln, channels-last": lambda m: kiln.compile(m, options={"channels_last": True}),
    }
    steps, walls = {}, {}
    for label, make in variants.items():
        model = copy.deepcopy(base)
        fn = make(model)

        def step(model=model, fn=fn):
            model.zero_grad(set_to_none=True)
            fn(x).float().square().mean().backward()

        for _ in range(WARMUP):  # compiled, then CUDA graphs recorded, before timing
            step()
        steps[label], walls[label] = step, wall_us(step, 10)
    rows = []
    for label, step in steps.items():  # profiled after every variant is timed
        busy = profile_calls(step, 3)
        rows.append([name, f"training b{batch}", label, f"{walls[label]:.0f}",
                     f"{busy.busy_us:.0f}", f"{busy.kernels:.0f}", ""])  # fmt: skip
    return rows


def main() -> str:
    if not torch.cuda.is_available():
        return "bench_conv_layout: needs a CUDA GPU (the layouts are cuDNN's)"
    models = os.environ.get("KILN_BENCH_MODELS", "resnet50,convnext_tiny,mobilenetv3_large_100")
    batch = int(os.environ.get("KILN_BENCH_BATCH", "8"))
    train = os.environ.get("KILN_BENCH_TRAIN", "resnet50")
    rows = []
    for name in (m.strip() for m in models.split(",") if m.strip()):
        rows += inference_rows(name, batch)
        if name in train.split(","):
            rows += training_rows(name, batch)
    device = f"{torch.cuda.get_device_name()}, torch {torch.__version__}"
    return f"{device}\n\n" + markdown_table(HEADER, rows, 3)


if __name__ == "__main__":
    print(main())
