"""``_adaptive_avg_pool2d`` over symbolic sizes: one graph for every input size.

torch's decomposition (used for static sizes) picks its form by the sizes: an
``avg_pool2d`` where the output size divides the input size, else windows gathered to their
longest length and summed by a loop unrolled over that length. Each choice is a guard on
a symbolic size (``h % 3 == 0``, ``h // 3 == 2``), so every new size would trace again.
Here each dimension gets an (out, in) matrix whose row i holds ``1 / length`` over window i
and zeros elsewhere, built from ``arange`` comparisons, and the pooling is two matrix
products, ``rows @ x @ cols.T``: no choice depends on a size's value. Their cost grows
with the output size (``in * out`` per dimension); on the CPU, for a CNN's 7 x 7 head of a
56 x 56 input they took 1.8 times the static form's time, for uneven windows less than it;
gathered windows masked to a bound on their length, the other guard-free form, took 17
times.
"""

from __future__ import annotations

import torch
from torch._decomp import decomposition_table as torch_decompositions
from torch._prims_common import get_computation_dtype
from torch.fx.experimental.symbolic_shapes import is_concrete_int

from kiln_autograd.decompositions import register_decomposition

aten = torch.ops.aten
TORCH_ADAPTIVE_AVG_POOL2D = torch_decompositions[aten._adaptive_avg_pool2d.default]


def _weights(in_size, out_size, device, dtype):
    """The (out, in) matrix whose row i averages window i of one dimension."""
    positions = torch.arange(out_size, device=device, dtype=torch.int64).unsqueeze(-1)
    start = torch.div(positions * in_size, out_size, rounding_mode="floor")
    end = torch.div((positions + 1) * in_size + out_size - 1, out_size, rounding_mode="floor")
    taps = torch.arange(in_size, device=device, dtype=torch.int64)
    inside = (taps >= start) & (taps < end)
    return inside.to(dtype) / (end - start).to(dtype)


@register_decomposition(aten._adaptive_avg_pool2d.default)
def adaptive_avg_pool2d(input: torch.Tensor, output_size) -> torch.Tensor:
    """torch's decomposition where the input's spatial sizes are numbers, else two
    matrix products (module doc), computed in float32 for reduced-precision inputs."""
    if all(is_concrete_int(s) for s in (*input.shape[-2:], *output_size)):
        return TORCH_ADAPTIVE_AVG_POOL2D(input, output_size)
    torch._check(
        input.dim() in (3, 4),
        lambda: f"adaptive_avg_pool2d(): Expected 3D or 4D tensor, but got {input.dim()}",
    )
    dtype = get_computation_dtype(input.dtype)
    rows = _weights(input.shape[-2], output_size[0], input.device, dtype)
    cols = _weights(input.shape[-1], output_size[1], input.device, dtype)
    return (rows @ (input.to(dtype) @ cols.transpose(0, 1))).to(input.dtype)
