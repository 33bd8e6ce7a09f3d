"""The aten op set kiln-autograd's graphs are decomposed to, and the table that does it.

The op set is the core ATen IR (every op that torch tags ``torch.Tag.core``) plus the
few ops of :data:`EXTRA_OPS`, which kiln-loopir lowers directly. The decomposition table is
torch's ``core_aten_decompositions()`` plus Kiln's own registry
(:func:`register_decomposition`), plus any the caller passes; it is keyed by op overload.
:data:`REPLACEMENTS` swaps the ops that tracing emits past the table.
:func:`verify_op_set` checks that a graph holds nothing else but fallback ops (functional
aten ops with no decomposition, kept whole as extern calls: :mod:`kiln_autograd.fallbacks`),
and that it is functional.
"""

from __future__ import annotations

import builtins
import functools
import operator
from collections.abc import Callable, Mapping

import torch
import torch.fx
from torch._decomp import core_aten_decompositions, get_decompositions
from torch._prims_common import suggest_memory_format

from kiln_autograd.errors import UnsupportedError
from kiln_autograd.fallbacks import is_fallback_op, note_fallback

aten = torch.ops.aten

# Kiln's own decompositions, keyed by op overload (filled by register_decomposition).
KILN_DECOMPOSITIONS: dict[torch._ops.OpOverload, Callable] = {}

# Ops outside the core ATen IR that the graphs keep: functional batch norm (training with
# running statistics as outputs), the RNG ops kept whole so that masks match eager's
# random stream, fused attention, the reductions and pointwise ops kiln-loopir lowers
# whole (one fused kernel where a decomposition would make several), and the scalar glue
# of symbolic shapes.
EXTRA_OPS: dict[object, str] = {
    aten._native_batch_norm_legit_functional.default: "batch norm in training mode, "
    "new running statistics as outputs",
    aten.native_batch_norm_backward.default: "batch norm's gradients, decomposed by "
    "kiln-loopir (once per layout: a model's repeated layers share the trace)",
    aten.native_layer_norm_backward.default: "layer norm's gradients, decomposed by "
    "kiln-loopir (once per layout)",
    aten.bernoulli.p: "dropout masks (functional form of bernoulli_)",
    aten.max.default: "the largest element (x.max()), one reduction",
    aten.min.default: "the smallest element (x.min()), one reduction",
    aten.var_mean.correction: "variance and mean in one pass (Welford)",
    aten.erfinv.default: "a pointwise op that kiln-loopir lowers",
    aten.erfc.default: "a pointwise op that kiln-loopir lowers",
    aten.exp2.default: "a pointwise op that kiln-loopir lowers",
    aten.lgamma.default: "a pointwise op that kiln-loopir lowers",
    aten.digamma.default: "a pointwise op that kiln-loopir lowers",
    aten.polygamma.default: "a pointwise op that kiln-loopir lowers",
    aten.special_zeta.default: "a pointwise op that kiln-loopir lowers",
    aten.special_zeta.self_scalar: "a pointwise op that kiln-loopir lowers",
    aten.special_zeta.other_scalar: "a pointwise op that kiln-loopir lowers",
    aten.i0.default: "a pointwise op that kiln-loopir lowers",
    aten.special_i0e.default: "a pointwise op that kiln-loopir lowers",
    aten.special_i1.default: "a pointwise op that kiln-loopir lowers",
    aten.special_i1e.default: "a pointwise op that kiln-loopir lowers",
    aten.special_erfcx.default: "a pointwise op that kiln-loopir lowers",
    aten.special_ndtri.default: "a pointwise op that kiln-loopir lowers",
    aten.hypot.default: "a pointwise op that kiln-loopir lowers",
    aten.copysign.Tensor: "a pointwise op that kiln-loopir lowers",
    aten.copysign.Scalar: "a pointwise op that kiln-loopir lowers",
    aten.nextafter.default: "a pointwise op that kiln-loopir lowers",
    aten.signbit.default: "a pointwise op that kiln-loopir lowers",
    aten.bitwise_left_shift.Tensor: "a pointwise op that kiln-loopir lowers",
    aten.bitwise_right_shift.Tensor: "a pointwise op that kiln-loopir lowers",
    aten.unfold.default: "sliding windows (Tensor.unfold), a view kiln-loopir lowers",
    aten.avg_pool3d_backward.default: "the gradient of 3-d average pooling (a gather over "
    "the windows that kiln-loopir lowers)",
    aten.cumprod.default: "a cumulative product (a scan)",
    aten.logcumsumexp.default: "a cumulative logsumexp (a scan)",
    aten.cummax.default: "running maximum and its position (two scans)",
    aten.cummin.default: "running minimum and its position (two scans)",
    aten.searchsorted.Tensor: "a binary search per element, unrolled in a pointwise kernel",
    aten.searchsorted.Scalar: "a binary search for one value",
    aten.bucketize.Tensor: "searchsorted with the arguments swapped",
    aten.bucketize.Scalar: "searchsorted of one value",
    aten.histc.default: "a histogram: each element's bin, then a scatter-add",
    aten.sym_size.int: "one symbolic size of a tensor",
    aten.sym_stride.int: "one symbolic stride of a tensor",
    aten.sym_numel.default: "symbolic element count",
    aten.sym_storage_offset.default: "symbolic storage offset",
    operator.getitem: "one output of a multi-output op",
}
# Fused attention kernels and their backwards stay whole: kiln-loopir runs them as extern
# kernels through ATen.
for _name in (
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention_for_cpu_backward",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_efficient_attention_backward",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_cudnn_attention_backward",
):
    if hasattr(aten, _name):
        EXTRA_OPS[getattr(aten, _name).default] = "fused attention (an extern kernel)"


def register_decomposition(
    *ops: torch._ops.OpOverload,
) -> Callable[[Callable], Callable]:
    """Register a Kiln decomposition for ``ops`` (used ahead of torch's own)."""

    def register(fn: Callable) -> Callable:
        for op in ops:
            KILN_DECOMPOSITIONS[op] = fn
        return fn

    return register


# Ops that make_fx emits itself, past the decomposition table, each replaced after tracing
# by an op with the same signature: torch.tensor(...) inside forward lifts a constant with
# lift_fresh_copy, which is a clone.
REPLACEMENTS: dict[torch._ops.OpOverload, torch._ops.OpOverload] = {
    aten.lift_fresh_copy.default: aten.clone.default,
}


def apply_replacements(gm: torch.fx.GraphModule) -> None:
    """Swap the targets of :data:`REPLACEMENTS` in ``gm`` (in place)."""
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in REPLACEMENTS:
            node.target = REPLACEMENTS[node.target]


# torch's decompositions that are not among the core ones, used as Kiln's: vector norms
# become pointwise ops and sums that fuse, grid sampling gathers and weights. (Max pooling
# is Kiln's own, kiln_autograd.max_pooling: torch has its decompositions from 2.13 on.)
KILN_DECOMPOSITIONS.update(
    get_decompositions(
        [
            aten.linalg_vector_norm.default,
            aten.grid_sampler_2d.default,
            aten.ldexp.Tensor,
            aten.new_empty_strided.default,
        ]
    )
)


def decomposition_table(
    extra: Mapping[torch._ops.OpOverload, Callable] | None = None,
) -> dict[torch._ops.OpOverload, Callable]:
    """torch's core ATen decompositions, then Kiln's, then ``extra`` (later ones win).

    Ops of :data:`EXTRA_OPS` stay whole: torch's table decomposes the CPU flash attention
    into a math form whose second output is not the logsumexp its backward reads.
    """
    table = dict(_core_table())
    table.update(KILN_DECOMPOSITIONS)
    if extra:
        table.update(extra)
    return table


@functools.cache
def _core_table() -> dict[torch._ops.OpOverload, Callable]:
    """torch's core ATen decompositions but those of :data:`EXTRA_OPS`, read once (torch
    builds its table anew at every call, in tens of milliseconds)."""
    table = dict(core_aten_decompositions())
    for op in EXTRA_OPS:
        table.pop(op, None)
    return table


def is_in_op_set(target: object) -> bool:
    """Whether ``target`` (an FX ``call_function`` target) belongs to the op set."""
    if target in EXTRA_OPS:
        return True
    if isinstance(target, torch._ops.OpOverload):
        return torch.Tag.core in target.tags
    # Python arithmetic on SymInts (operator.mul, sym_max, round ...) belongs to shape glue.
    if target is builtins.round:  # what a traced SymFloat.__round__ records
        return True
    return getattr(target, "__module__", None) in {"_operator", "torch", "math"} or (
        "sym_" in getattr(target, "__name__", "")
    )


def verify_op_set(gm: torch.fx.GraphModule, what: str = "graph") -> None:
    """Raise :class:`UnsupportedError` naming any node that is not functional, or outside
    the op set and not a fallback op; log each fallback op (once per process)."""
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output", "get_attr"):
            continue  # get_attr: a tensor constant the trace met (torch.tensor(...) in forward)
        if node.op != "call_function":
            raise UnsupportedError(
                f"the {what} holds a {node.op} node ({node.format_node()}); kiln-autograd "
                "graphs hold only call_function nodes and tensor constants"
            )
        target = node.target
        if isinstance(target, torch._ops.OpOverload) and target._schema.is_mutable:
            raise UnsupportedError(
                f"the {what} still mutates through {target} after functionalization"
            )
        if is_in_op_set(target):
            continue
        if is_fallback_op(target):
            note_fallback(target, what)
            continue
        raise UnsupportedError(
            f"the {what} holds {target}, which is outside kiln-autograd's op set and is not "
            "an aten op that can run as an extern call; pass a decomposition with "
            "aot(..., decompositions={op: fn})"
        )


def op_set_table() -> list[tuple[str, str]]:
    """``(op, where it comes from)`` rows for the documentation: the extras, then the core."""
    rows = [(_name(op), why) for op, why in EXTRA_OPS.items()]
    core = sorted({str(overload_packet) for overload_packet in _all_core_ops()})
    rows += [(name, "core ATen IR") for name in core]
    return rows


def _all_core_ops() -> list[torch._ops.OpOverloadPacket]:
    found = []
    for name in dir(aten):
        packet = getattr(aten, name, None)
        if not isinstance(packet, torch._ops.OpOverloadPacket):
            continue
        for overload in packet.overloads():
            if torch.Tag.core in getattr(packet, overload).tags:
                found.append(packet)
                break
    return found


def _name(op: object) -> str:
    if isinstance(op, torch._ops.OpOverload):
        return str(op)
    return f"{getattr(op, '__module__', '')}.{getattr(op, '__name__', op)}".lstrip(".")


@register_decomposition(aten.native_dropout_backward.default)
def native_dropout_backward(
    grad_output: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """Dropout's gradient, rounded as eager rounds it on the gradient's device.

    On CPU eager scales by the mask cast to the gradient's dtype times ``scale``, which rounds
    the scale to that dtype first (torch's own decomposition does the same). CUDA's kernel
    multiplies in float32 and rounds once: rounding the scale first there would put every
    half-precision gradient through dropout off by as much as the scale's rounding (1/0.75
    is 1.3359 in bfloat16, 0.26% high). Both forms agree in float32 and wider.
    """
    if grad_output.device.type == "cpu":
        out = grad_output * (mask.type_as(grad_output) * scale)
    else:
        out = (grad_output * mask.type_as(grad_output)) * scale
    return out.clone(memory_format=suggest_memory_format(grad_output))


# modules that register decompositions of their own (imported for the registrations)
from kiln_autograd import (  # noqa: E402, F401
    adaptive_pooling,
    embedding_bag,
    indexing,
    max_pooling,
    pooling,
)
