"""Views as index remaps.

A view's result shares its input's storage; what changes is how an index maps to a storage
offset. The fake-tensor value of a view node already holds the size, stride and storage
offset eager gives it, so every view op (view, reshape, permute, expand, slice, select,
squeeze, unsqueeze, as_strided, t, transpose, diagonal, unfold, split, unbind ...) lowers
to a :class:`~kiln_loopir.ir.TensorRef` on the same buffer with that layout: reading
element ``i`` loads ``offset + sum(i_k * stride_k)``. No data moves.
"""

from __future__ import annotations

import torch

from kiln_loopir.ir import TensorRef
from kiln_loopir.lowering.context import LoweringContext, val_layout
from kiln_loopir.lowering.registry import is_view_op, register_lowering

aten = torch.ops.aten

VIEW_OPS = (
    aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.permute.default,
    aten.expand.default, aten.slice.Tensor, aten.select.int, aten.squeeze.default,
    aten.squeeze.dim, aten.squeeze.dims, aten.unsqueeze.default, aten.as_strided.default,
    aten.t.default, aten.transpose.int, aten.alias.default, aten.diagonal.default,
    aten.unfold.default, aten.split.Tensor, aten.split_with_sizes.default, aten.unbind.int,
    aten.chunk.default, aten.narrow.default, aten.view_as.default, aten.expand_as.default,
    aten.detach.default,
)  # fmt: skip


def view_of(ctx: LoweringContext, base: TensorRef, base_val: torch.Tensor, val) -> object:
    """The TensorRef(s) of ``val`` (a fake view of ``base_val``) on ``base``'s buffer."""
    if isinstance(val, (tuple, list)):
        return tuple(view_of(ctx, base, base_val, v) for v in val)
    size, stride, offset = val_layout(val)
    _, _, base_offset = val_layout(base_val)
    return TensorRef(
        base.buffer, base.dtype, base.device, size, stride, base.offset + offset - base_offset
    )


@register_lowering(*VIEW_OPS)
def lower_view(ctx: LoweringContext, base: TensorRef, *args, **kwargs) -> object:
    if ctx.op is aten.reshape.default and not _is_view(ctx.arg_vals[0], ctx.val):
        # A reshape eager answers with a copy: materialise the input, then view the copy.
        from kiln_loopir.lowering.pointwise import loader

        base_val = ctx.arg_vals[0]
        size, _, _ = val_layout(base_val)
        copy = ctx.pointwise(loader(base, size, None), dtype=base.dtype, size=size)
        return TensorRef(copy.buffer, copy.dtype, copy.device, *val_layout(ctx.val))
    return view_of(ctx, base, ctx.arg_vals[0], ctx.val)


def _is_view(base_val: torch.Tensor, val: torch.Tensor) -> bool:
    try:
        return val.untyped_storage()._cdata == base_val.untyped_storage()._cdata
    except Exception:  # fake storages without identity: trust the layout fits
        return True


def view_of_copy_op(op: object) -> object | None:
    """For ``aten.<view>_copy.<overload>`` (what functionalization with views removed
    emits), the view op it copies; else None."""
    if not isinstance(op, torch._ops.OpOverload) or op.namespace != "aten":
        return None
    name = op.__name__.split(".")[0]
    if not name.endswith("_copy"):
        return None
    packet = getattr(aten, name.removesuffix("_copy"), None)
    view = getattr(packet, op._overloadname, None) if packet is not None else None
    return view if view is not None and is_view_op(view) else None


def lower_view_copy(ctx: LoweringContext, base: TensorRef, *args, **kwargs) -> object:
    """A ``*_copy`` op: the view as an index remap, then a copy into the result's layout."""
    from kiln_loopir.lowering.pointwise import loader

    view_op = view_of_copy_op(ctx.op)
    base_val = ctx.arg_vals[0]
    with base_val.fake_mode:
        view_val = view_op(base_val, *ctx.arg_vals[1:], **ctx.kwarg_vals)
    ref = view_of(ctx, base, base_val, view_val)
    if isinstance(ref, tuple):
        vals = ctx.val
        return tuple(
            ctx.pointwise(loader(r, val_layout(v)[0], None), val=v)
            for r, v in zip(ref, vals, strict=True)
        )
    return ctx.pointwise(loader(ref, val_layout(ctx.val)[0], None))
