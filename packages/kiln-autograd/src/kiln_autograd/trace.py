"""Trace functional aten graphs: the inference graph and the joint forward/backward graph.

Both run the lifted module on fake inputs under ``make_fx`` (proxy tracing through
``__torch_dispatch__``) with ``FunctionalTensorMode`` (no in-place op or view survives as a
mutation: in-place ops become their functional variants, views are replayed from bases)
and the decomposition table of :mod:`kiln_autograd.decompositions`.

The outputs of a traced graph, in order:

- the graph's own outputs, all of them (aliasing ones too: the runtime reads their size,
  stride and offset to regenerate them as views);
- the new value of every mutated input (:attr:`GraphMeta.mutated_inputs`), written back by
  the runtime;
- the intermediate bases that several outputs are views of;
- in a joint graph only: the gradient of every primal that gets one.

A joint graph's inputs are ``primals_1 ... primals_n`` (state then user inputs) then
``tangents_1 ... tangents_m``, one per differentiable forward output (see
:meth:`JointGraph.differentiable_outputs`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

import torch
import torch.fx
import torch.fx.traceback as fx_traceback
from torch._dispatch.python import enable_python_dispatcher
from torch._subclasses.fake_tensor import FakeTensorMode
from torch._subclasses.functional_tensor import FunctionalTensor, FunctionalTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from kiln_autograd.analyze import GraphMeta, base_of, differentiable_outputs
from kiln_autograd.attention import FusedAttention
from kiln_autograd.decompositions import apply_replacements
from kiln_autograd.errors import explain_unsupported
from kiln_autograd.linalg_checks import LinalgChecks


@dataclasses.dataclass
class TracedGraph:
    """A functional aten graph and the metadata the runtime needs to run it."""

    gm: torch.fx.GraphModule
    meta: GraphMeta
    num_inputs: int

    @property
    def num_fw_outputs(self) -> int:
        return len(self.meta.outputs) + len(self.meta.mutated_inputs) + self.meta.num_bases

    def __str__(self) -> str:
        return self.gm.print_readable(print_output=False)


@dataclasses.dataclass
class JointGraph(TracedGraph):
    """The joint graph ``(primals, tangents) -> (forward outputs, gradients)``.

    ``grad_inputs`` lists the primals that get a gradient (in output order after the
    forward outputs); a primal that requires grad but is not reached by any differentiable
    output is absent, and gets ``None`` at runtime, as in eager.
    """

    num_tangents: int = 0
    grad_inputs: tuple[int, ...] = ()

    def differentiable_outputs(self) -> list[int]:
        """Indices into the forward outputs that have a tangent, in tangent order."""
        return differentiable_outputs(self.meta)


def trace_inference(
    fn: Callable[..., object],
    fake_args: Sequence[object],
    meta: GraphMeta,
    fake_mode: FakeTensorMode,
    decompositions: Mapping,
) -> TracedGraph:
    """Trace ``fn`` with grad disabled into one functional aten graph."""

    def inference(primals: list[object]) -> list[object]:
        f_primals = [_to_fun(p) for p in primals]
        with torch.no_grad():
            outs = _flat(fn(*f_primals))
        return _forward_values(outs, f_primals, meta)

    args = [_detach(a) for a in fake_args]
    gm = _make_fx(inference, (args,), fake_mode, decompositions)
    return TracedGraph(gm=gm, meta=meta, num_inputs=len(args))


def trace_joint(
    fn: Callable[..., object],
    fake_args: Sequence[object],
    meta: GraphMeta,
    fake_mode: FakeTensorMode,
    decompositions: Mapping,
) -> JointGraph:
    """Trace ``fn`` and its gradient (``torch.autograd.grad``) into one joint graph."""
    wants_grad = [isinstance(a, torch.Tensor) and a.requires_grad for a in fake_args]
    grad_inputs: list[int] = []

    def joint(primals: list[object], tangents: list[torch.Tensor]) -> list[object]:
        f_primals = [_to_fun(p) for p in primals]
        f_tangents = [_to_fun(t) for t in tangents]
        with torch.enable_grad():
            # An input that requires grad and is written in place: the graph writes into a
            # copy, so that its gradient is the one of the value before the write.
            f_inputs = [
                p.clone() if i in meta.mutated_inputs and wants_grad[i] else p
                for i, p in enumerate(f_primals)
            ]
            outs = _flat(fn(*f_inputs))
        values = _forward_values(outs, f_inputs, meta)
        fw = _fw_tensors(outs, f_inputs, meta)
        diff = [fw[k] for k in differentiable_outputs(meta)]
        wrt = [f_primals[i] for i, w in enumerate(wants_grad) if w]
        grads = torch.autograd.grad(diff, wrt, f_tangents, allow_unused=True)
        wrt_index = [i for i, w in enumerate(wants_grad) if w]
        for i, g in zip(wrt_index, grads, strict=True):
            if g is not None:
                grad_inputs.append(i)
                values.append(_from_fun(g))
        return values

    primals = [_detach_keep_grad(a) for a in fake_args]
    tangents = _tangents(fn, primals, meta, fake_mode)
    gm = _make_fx(joint, (primals, tangents), fake_mode, decompositions)
    return JointGraph(
        gm=gm,
        meta=meta,
        num_inputs=len(primals),
        num_tangents=len(tangents),
        grad_inputs=tuple(grad_inputs),
    )


def _tangents(
    fn: Callable[..., object],
    primals: Sequence[object],
    meta: GraphMeta,
    fake_mode: FakeTensorMode,
) -> list[torch.Tensor]:
    """Fake tangents shaped like the differentiable outputs (contiguous, like the runtime's),
    on their devices: a tangent left on the default device would mix devices in the backward.
    Their layouts are those :func:`analyze` found, where it could keep them; else ``fn``
    runs once more on fakes to find them."""
    if meta.tangent_layouts is not None:
        with fake_mode:
            return [torch.empty(s, dtype=d, device=v) for s, d, v in meta.tangent_layouts]
    with fake_mode, torch.enable_grad():
        inputs = [_clone_input(p) for p in primals]
        outs = _flat(fn(*inputs))
        fw = _fw_tensors(outs, inputs, meta)
        return [
            torch.empty(fw[k].shape, dtype=fw[k].dtype, device=fw[k].device)
            for k in differentiable_outputs(meta)
        ]


def _fw_tensors(
    outs: Sequence[object], f_inputs: Sequence[object], meta: GraphMeta
) -> list[object]:
    """The forward outputs as functional tensors, in the order of the module doc."""
    bases = [base_of(outs[k]) for k in meta.base_sources]
    return list(outs) + [f_inputs[i] for i in meta.mutated_inputs] + bases


def _forward_values(
    outs: Sequence[object], f_inputs: Sequence[object], meta: GraphMeta
) -> list[object]:
    """The traced graph's forward outputs, unwrapped from functionalization (module doc)."""
    values = [_from_fun(o) for o in outs]
    values += [_from_fun(f_inputs[i]) for i in meta.mutated_inputs]
    values += [_from_fun(base_of(outs[k])) for k in meta.base_sources]
    return values


def _make_fx(
    f: Callable[..., object],
    args: tuple,
    fake_mode: FakeTensorMode,
    decompositions: Mapping,
) -> torch.fx.GraphModule:
    static = fake_mode.shape_env is None or fake_mode.static_shapes
    tracing_mode = "fake" if static else "symbolic"
    with (
        fx_traceback.preserve_node_meta(),  # each aten node keeps its user source lines
        explain_unsupported(),
        enable_python_dispatcher(),
        FunctionalTensorMode(),
        FusedAttention(),
        LinalgChecks(),
    ):
        gm = make_fx(f, decomposition_table=decompositions, tracing_mode=tracing_mode)(*args)
    return _flatten_signature(gm)


def _flatten_signature(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Drop make_fx's pytree wrapping: flat placeholders in, a flat tuple out."""
    gm.graph._codegen = torch.fx.graph.CodeGen()
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    out.args = (tuple(out.args[0]),)
    apply_replacements(gm)
    gm.graph.eliminate_dead_code()
    gm.graph.lint()
    gm.recompile()
    return gm


def _to_fun(value: object) -> object:
    return FunctionalTensor.to_functional(value) if isinstance(value, torch.Tensor) else value


def _from_fun(value: object) -> object:
    if isinstance(value, FunctionalTensor):
        torch._sync(value)
        return torch._from_functional_tensor(value.elem)
    return value


def _flat(out: object) -> tuple[object, ...]:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _detach(value: object) -> object:
    return value.detach() if isinstance(value, torch.Tensor) else value


def _detach_keep_grad(value: object) -> object:
    if not isinstance(value, torch.Tensor):
        return value
    return value.detach().requires_grad_(value.requires_grad)


def _clone_input(value: object) -> object:
    """A copy to run on; one that requires grad is a non-leaf, so it may be written into."""
    if not isinstance(value, torch.Tensor):
        return value
    out = value.detach().clone()
    return out.requires_grad_(True).clone() if value.requires_grad else out
