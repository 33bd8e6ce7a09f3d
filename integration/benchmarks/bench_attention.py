"""Hand-written attention on the GPU: Kiln (rewritten to the fused op, and without the
rewrite) against eager and torch.compile, in one run.

``softmax(q @ k.transpose(-2, -1) / sqrt(d) + mask, dim=-1) @ v`` in bf16 with a random
additive mask, at a serving size (8×12 heads×128×64) and a throughput size
(32×12×512×64). Per case: GPU-busy µs and kernels per call (``torch.profiler`` over 5 calls
after 4 warm-up calls, see ``gpu_timing``) and the largest difference from a float32
eager result.

``python3 bench_attention.py`` (no environment variables).
"""

from __future__ import annotations

import math

import torch
from gpu_timing import profile_calls
from timing import markdown_table

SHAPES = ((8, 12, 128, 64), (32, 12, 512, 64))
HEADER = ["batch×heads×tokens×dim", "variant", "GPU-busy µs", "kernels", "max diff vs float32"]


def attention(q, k, v, mask):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.softmax(scores + mask, dim=-1) @ v


def rows_for(shape: tuple[int, int, int, int]) -> list[list[object]]:
    import kiln

    b, h, n, d = shape
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    mask = torch.randn(b, 1, n, n, device="cuda", dtype=torch.bfloat16)
    reference = attention(q.float(), k.float(), v.float(), mask.float())
    variants = {
        "eager": attention,
        "torch.compile": torch.compile(attention),
        "kiln (fused attention)": kiln.compile(attention),
        "kiln, fused_attention=False": kiln.compile(attention, options={"fused_attention": False}),
    }
    rows = []
    for label, fn in variants.items():
        for _ in range(4):
            out = fn(q, k, v, mask)
        busy = profile_calls(lambda fn=fn: fn(q, k, v, mask), 5)
        diff = (out.float() - reference).abs().max().item()
        rows.append(["×".join(map(str, shape)), label, f"{busy.busy_us:.1f}",
                     f"{busy.kernels:.0f}", f"{diff:.1e}"])  # fmt: skip
    return rows


def main() -> str:
    if not torch.cuda.is_available():
        return "bench_attention: needs a CUDA GPU"
    rows = [row for shape in SHAPES for row in rows_for(shape)]
    device = f"{torch.cuda.get_device_name()}, torch {torch.__version__}"
    return f"{device}\n\n" + markdown_table(HEADER, rows, 2)


if __name__ == "__main__":
    print(main())
