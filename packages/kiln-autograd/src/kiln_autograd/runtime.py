"""Run compiled graphs with eager semantics: autograd, input mutations and aliasing outputs.

:class:`InferenceRunner` runs one compiled graph. :class:`TrainingRunner` runs the compiled
forward inside a ``torch.autograd.Function`` that saves what the partitioner chose and
compiles the backward graph the first time a gradient is needed. Both then

- write the new value of every mutated input back into it (``copy_`` under ``no_grad``),
  so module buffers such as BatchNorm running statistics are updated as in eager;
- regenerate outputs that alias an input, or share an intermediate with other outputs, as
  views (``as_strided`` over the input or the intermediate, with the size, stride and
  offset the compiled graph gave them), so that writes through them are seen as in eager.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

import torch
import torch.fx
from torch._C import _functions

from kiln_autograd.analyze import GraphMeta, OutputKind
from kiln_autograd.direct_gradients import DirectGradients, distributed_initialized
from kiln_autograd.errors import UnsupportedError
from kiln_autograd.partition import PartitionedGraphs, view_root
from kiln_autograd.trace import JointGraph, differentiable_outputs

Compiler = Callable[[torch.fx.GraphModule, list], Callable]
# starts compiling a backward graph: (compiler, graph, example inputs) -> what gives the
# compiled graph at the first backward, or None (the first backward compiles it)
BackwardAhead = Callable[[Compiler, torch.fx.GraphModule, list], Callable[[], Callable] | None]


def example_values(gm: torch.fx.GraphModule) -> list[object]:
    """The fake values of a graph's placeholders: the example inputs given to a compiler."""
    return [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]


class InferenceRunner:
    """Runs a compiled inference graph (no autograd), then writes back and regenerates views."""

    def __init__(self, compiled: Callable, meta: GraphMeta) -> None:
        self.compiled = without_autocast(compiled)
        self.meta = meta

    def __call__(self, *args: object) -> object:
        _refuse_aliased_mutated_inputs(args, self.meta)
        raw = list(self.compiled(*args))
        n_out, n_mut = len(self.meta.outputs), len(self.meta.mutated_inputs)
        _write_back(args, self.meta, raw[n_out : n_out + n_mut])
        bases = raw[n_out + n_mut :]
        return _user_outputs(args, self.meta, raw, plain=raw, bases=bases)

    def entry_point(self) -> Callable:
        """The compiled graph itself where this runner would add nothing (no input written
        back, no output regenerated as a view, a tuple returned), else the runner."""
        meta = self.meta
        plain = all(o.kind is OutputKind.PLAIN for o in meta.outputs)
        if plain and meta.returns_sequence and not meta.mutated_inputs and not meta.num_bases:
            return self.compiled
        return self


class TrainingRunner:
    """Runs a compiled forward in an ``autograd.Function`` whose backward graph is
    ``compiled_bw``, or what ``compile_bw()`` returns at the first backward (it compiles the
    graph then, or waits for the compile that ``aot(backward_ahead=...)`` started)."""

    def __init__(
        self,
        compiled_fw: Callable,
        parts: PartitionedGraphs,
        joint: JointGraph,
        compile_bw: Callable[[], Callable] | None = None,
        compiled_bw: Callable | None = None,
    ) -> None:
        self.meta = joint.meta
        self.parts = parts
        self.joint = joint
        self.function = _make_function(compiled_fw, parts, joint, compile_bw, compiled_bw)
        # autograd.Function.apply less its Python prologue, which binds default arguments
        # (the function has none) and unwraps dead functorch wrappers one argument at a
        # time (there are none unless a functorch transform is active): torch's C++ apply
        self._apply_directly = super(torch.autograd.Function, self.function).apply
        self.direct: DirectGradients | None = None

    def write_gradients_directly(self, positions: Sequence[int], device: torch.device) -> None:
        """Have the backward write the gradients of the inputs at ``positions`` (parameters:
        leaves requiring grad) into their ``.grad`` itself
        (:mod:`kiln_autograd.direct_gradients`)."""
        if positions:
            gradient_of = {i: j for j, i in enumerate(self.joint.grad_inputs)}
            self.direct = DirectGradients(
                positions, self.joint.num_inputs, self.parts.bw, gradient_of, device
            )

    def __call__(self, *args: object) -> object:
        _refuse_aliased_mutated_inputs(args, self.meta)
        side = _SideChannel()
        side.args = args
        direct = self.direct
        if direct is not None and distributed_initialized():
            direct.note_distributed()  # DDP's reducer hooks the accumulators: keep them
            direct = None
        if direct is not None:
            side.direct = direct
            side.parameters = direct.parameters_of(args)
            tape = (direct.sentinel, *direct.tape_inputs_of(args))
        else:
            side.direct = None
            tape = args
        if torch._C._are_functorch_transforms_active():
            returned = self.function.apply(side, *tape)
        else:
            returned = self._apply_directly(side, *tape)
        meta = self.meta
        n_mut = len(meta.mutated_inputs)
        plain = dict(zip(meta.plain_outputs(), returned, strict=False))
        rest = returned[len(plain) :]
        _write_back(args, meta, rest[:n_mut])
        bases = rest[n_mut:]
        return _user_outputs(args, meta, side.raw, plain=plain, bases=bases)

    def entry_point(self) -> Callable:
        return self


class _SideChannel:
    """Carries the call's inputs into ``Function.forward`` (where the parameters whose
    gradients are written directly are no inputs of the ``Function``), and the forward's raw
    outputs (for view geometry) out of it."""

    args: Sequence[object]
    direct: DirectGradients | None
    parameters: tuple[torch.Tensor, ...]
    raw: list[object]


def _make_function(
    compiled_fw: Callable,
    parts: PartitionedGraphs,
    joint: JointGraph,
    compile_bw: Callable[[], Callable] | None,
    compiled_bw: Callable | None,
) -> type[torch.autograd.Function]:
    meta = joint.meta
    n_fw = parts.num_fw_outputs
    n_tensors = parts.num_saved_tensors
    n_out, n_mut = len(meta.outputs), len(meta.mutated_inputs)
    # What Function.forward returns: plain outputs, mutated inputs' values, bases.
    returned_index = meta.plain_outputs() + list(range(n_out, n_out + n_mut + meta.num_bases))
    position = {k: p for p, k in enumerate(returned_index)}
    tangent_positions = [position[k] for k in differentiable_outputs(meta)]
    differentiable = set(tangent_positions)
    num_inputs = joint.num_inputs
    grad_inputs = joint.grad_inputs
    deps = parts.grad_tangent_deps
    autocast = torch._C._is_any_autocast_enabled()
    compiled_fw = without_autocast(compiled_fw, autocast)
    compiled_bws: list[Callable] = [without_autocast(compiled_bw, autocast)] if compiled_bw else []
    fresh = fresh_outputs(parts, returned_index)
    places: dict[tuple[bool, ...], list[tuple[int, int]]] = {}

    def gradient_places(given: tuple[bool, ...]) -> list[tuple[int, int]]:
        """``(input, gradient)`` pairs for the tangents ``given``: None where eager's
        would be (no gradient reached what the input's depends on), worked out once per
        pattern of missing tangents."""
        if given not in places:
            places[given] = [
                (i, j)
                for j, i in enumerate(grad_inputs)
                if not deps[j] or any(given[t] for t in deps[j])
            ]
        return places[given]

    class CompiledFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, side: _SideChannel, *tape: object) -> tuple[object, ...]:
            outs = list(compiled_fw(*side.args))
            fw_outs, saved = outs[:n_fw], outs[n_fw:]
            ctx.save_for_backward(*saved[:n_tensors])
            ctx.symints = saved[n_tensors:]
            ctx.direct = side.direct
            if side.direct is not None:
                ctx.parameters = side.parameters
            side.raw = fw_outs
            returned = tuple(
                _not_a_view(fw_outs[k]) if p in fresh else fw_outs[k]
                for p, k in enumerate(returned_index)
            )
            ctx.tangent_meta = [
                (returned[p].shape, returned[p].dtype, returned[p].device)
                for p in tangent_positions
            ]
            ctx.mark_non_differentiable(
                *(
                    t
                    for p, t in enumerate(returned)
                    if isinstance(t, torch.Tensor) and p not in differentiable
                )
            )
            ctx.set_materialize_grads(False)
            return returned

        @staticmethod
        def backward(ctx, *grad_outputs: torch.Tensor | None) -> tuple[object, ...]:
            given = [grad_outputs[p] for p in tangent_positions]
            tangents = [
                g.contiguous() if g is not None else torch.zeros(s, dtype=d, device=dev)
                for g, (s, d, dev) in zip(given, ctx.tangent_meta, strict=True)
            ]
            saved = [*ctx.saved_tensors, *ctx.symints]
            if not compiled_bws:
                compiled_bws.append(without_autocast(compile_bw(), autocast))
            with torch.no_grad():
                grads = compiled_bws[0](*saved, *tangents)
            result: list[object] = [None] * num_inputs
            for i, j in gradient_places(tuple(g is not None for g in given)):
                result[i] = grads[j]
            if torch.is_grad_enabled():
                result = _error_on_double_backward(result)
            direct = ctx.direct
            if direct is None:
                return (None, *result)
            if direct.full_backward():
                direct.accumulate(ctx.parameters, direct.parameters_of(result))
            return (None, None, *direct.tape_inputs_of(result))

    return CompiledFunction


def without_autocast(compiled: Callable, autocast: bool | None = None) -> Callable:
    """``compiled``, run with autocast off where the graph was traced under autocast
    (``autocast``, default: whether it is on now; the guards hold that state at every call).

    A traced graph holds autocast's casts already. Its ATen calls run again under
    autocast would cast again: an op of a region the traced code ran with autocast off
    (a rotary embedding's float32 product) would run in the lower precision, on inputs
    the kernels beside it read as float32."""
    if not (torch._C._is_any_autocast_enabled() if autocast is None else autocast):
        return compiled

    def run_without_autocast(*args: object) -> object:
        with torch._C._DisableAutocast():
            return compiled(*args)

    return run_without_autocast


def fresh_outputs(parts: PartitionedGraphs, returned_index: Sequence[int]) -> frozenset[int]:
    """Positions of what ``Function.forward`` returns whose memory belongs to it alone: a
    value the graph computed (or a view of one) that no other output shares and the
    backward does not save. A compiled graph may hand such a value out as a view (of memory
    laid out for several values: one allocation, a reused buffer; or of the intermediate it
    views, which nothing else reads); eager's is no view where the op made a tensor of its
    own (a linear layer's ``_unsafe_view``), and a view made inside an
    ``autograd.Function`` may not be written in place (``out += 1`` raised)."""
    output = next(iter(reversed(parts.fw.graph.nodes)))
    values = list(output.args[0])
    fw_outs, saved = values[: parts.num_fw_outputs], values[parts.num_fw_outputs :]
    saved_roots = {view_root(n) for n in saved if isinstance(n, torch.fx.Node)}
    readers = Counter(view_root(n) for n in fw_outs if isinstance(n, torch.fx.Node))
    return frozenset(
        p
        for p, k in enumerate(returned_index)
        if isinstance(node := fw_outs[k], torch.fx.Node)
        and (root := view_root(node)).op == "call_function"
        and root not in saved_roots
        and readers[root] == 1
    )


def _not_a_view(t: object) -> object:
    """``t``, or where it is a view, a tensor over the same memory that is none."""
    if isinstance(t, torch.Tensor) and t._base is not None:
        return torch.ops.aten._unsafe_view(t, t.shape)
    return t


def _error_on_double_backward(grads: list[object]) -> list[object]:
    """The same gradients, whose own backward raises a RuntimeError that says why."""
    present = [i for i, g in enumerate(grads) if isinstance(g, torch.Tensor)]
    if not present:
        return grads
    err = _functions.DelayedError(
        b"kiln_autograd does not support double backward: a gradient of a compiled graph's "
        b"gradient was requested (create_graph=True); run the graph eagerly for higher-order "
        b"gradients",
        len(present),
    )
    wrapped = err(*[grads[i].detach().requires_grad_(True) for i in present])
    if isinstance(wrapped, torch.Tensor):
        wrapped = (wrapped,)
    out = list(grads)
    for i, w in zip(present, wrapped, strict=True):
        out[i] = w
    return out


def _refuse_aliased_mutated_inputs(args: Sequence[object], meta: GraphMeta) -> None:
    """The graph was traced with distinct inputs: a write through one alias would be lost.
    Inputs that share a storage but not its bytes (the outputs of one CUDA-graph replay,
    handed out in one block) are distinct. One pass over the inputs' storages (a model with
    a hundred BatchNorm buffers written back has a hundred mutated inputs among hundreds of
    inputs)."""
    if not meta.mutated_inputs:
        return
    holders: dict[int, list[int]] = {}
    for j, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            holders.setdefault(a.untyped_storage().data_ptr(), []).append(j)
    for i in meta.mutated_inputs:
        address = args[i].untyped_storage().data_ptr()
        sharing = [j for j in holders[address] if j != i] if address else []
        if not sharing:
            continue
        start, end = _byte_range(args[i])
        others = [j for j in sharing if _overlaps(_byte_range(args[j]), start, end)]
        if others:
            raise UnsupportedError(
                f"input {i}, which the graph writes in place, shares memory with input "
                f"{others[0]}; kiln-autograd traced them as distinct tensors: pass a clone"
            )


def _byte_range(t: torch.Tensor) -> tuple[int, int]:
    """The bytes of its storage that ``t`` can reach: ``[start, end)`` (empty: no elements)."""
    start = t.storage_offset() * t.element_size()
    if t.numel() == 0:
        return start, start
    last = sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride(), strict=True))
    return start, start + (last + 1) * t.element_size()


def _overlaps(other: tuple[int, int], start: int, end: int) -> bool:
    return other[0] < end and start < other[1] and other[0] < other[1] and start < end


def _write_back(args: Sequence[object], meta: GraphMeta, values: Sequence[object]) -> None:
    """``copy_`` each new value into its input; under autograd where the value requires grad
    (the input then carries the write's history, as in eager), else under ``no_grad``, in
    one multi-tensor copy per dtype and device (a model's BatchNorm statistics: a hundred
    buffers a step, which one copy each made a hundred launches on the GPU)."""
    groups: dict[tuple, tuple[list, list]] = {}
    for i, new in zip(meta.mutated_inputs, values, strict=True):
        if isinstance(new, torch.Tensor) and new.requires_grad:
            args[i].copy_(new)
            continue
        target = args[i]
        targets, sources = groups.setdefault((target.dtype, target.device, new.dtype), ([], []))
        targets.append(target)
        sources.append(new)
    if groups:
        with torch.no_grad():
            for targets, sources in groups.values():
                torch._foreach_copy_(targets, sources)


def _user_outputs(
    args: Sequence[object],
    meta: GraphMeta,
    raw: Sequence[object],
    plain: Sequence[object] | dict[int, object],
    bases: Sequence[object],
) -> object:
    outs: list[object] = []
    for k, info in enumerate(meta.outputs):
        if info.kind is OutputKind.PLAIN:
            outs.append(plain[k])
        elif info.kind is OutputKind.INPUT:
            outs.append(args[info.base])
        else:
            base = args[info.base] if info.kind is OutputKind.INPUT_VIEW else bases[info.base]
            outs.append(_view_like(base, raw[k], info.requires_grad))
    return tuple(outs) if meta.returns_sequence else outs[0]


def _view_like(base: torch.Tensor, like: torch.Tensor, requires_grad: bool) -> torch.Tensor:
    # With grad enabled, an alias that does not require grad was detached by the graph.
    # Under no_grad a view's requires_grad follows its base, as eager's views do.
    if not requires_grad and torch.is_grad_enabled():
        base = base.detach()
    if like.dtype != base.dtype:  # a view of another dtype (view_as_complex, view(dtype))
        try:
            base = base.view(like.dtype)
        except RuntimeError:
            return like  # the graph's own view: its dtype and values are right
    return base.as_strided(like.size(), like.stride(), like.storage_offset())
