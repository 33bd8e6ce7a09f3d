"""Lift a module's parameters, buffers and tensor constants into graph inputs.

A captured ``torch.fx.GraphModule`` reads its weights through ``get_attr`` and
``call_module`` nodes. Tracing needs every tensor as an input, so that parameters get
gradients and buffer updates (BatchNorm running statistics) come out as values to write
back. :class:`LiftedModule` is a flat function ``(*state, *user_inputs) -> outputs`` that
runs the module with ``torch.func.functional_call`` over the lifted state, with the torch
functions of :mod:`kiln_autograd.pre_autograd` replaced (it runs only to be analysed and
traced, and every run must see the same ops).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.fx
import torch.fx.traceback as fx_traceback
from torch.nn.utils.stateless import _reparametrize_module

from kiln_autograd.pre_autograd import PreAutogradDecompositions


@dataclasses.dataclass(frozen=True)
class LiftedModule:
    """A module seen as a flat function of its state followed by the user's inputs.

    ``names`` lists the lifted attributes in input order: parameters, then buffers, then
    plain tensor attributes that ``get_attr`` nodes read (constants).
    """

    module: torch.nn.Module
    names: tuple[str, ...]
    num_params: int
    num_buffers: int

    @property
    def num_state(self) -> int:
        return len(self.names)

    def state(self) -> list[torch.Tensor]:
        """The current values of the lifted attributes, read from the module now."""
        return [_get_attr(self.module, name) for name in self.names]

    def call_raw(self, *args: object) -> object:
        """Run the module on ``(*state, *user_inputs)`` and return what it returns. While a
        trace keeps node metadata (``torch.fx.traceback.preserve_node_meta``), a graph
        module runs node by node, so that each op traced from a node carries that node's
        user source lines."""
        state = dict(zip(self.names, args[: self.num_state], strict=True))
        user = tuple(args[self.num_state :])
        with PreAutogradDecompositions():
            if isinstance(self.module, torch.fx.GraphModule) and (
                fx_traceback.has_preserved_node_meta()
            ):
                with _reparametrize_module(self.module, state, tie_weights=False):
                    return torch.fx.Interpreter(self.module).run(*user)
            return torch.func.functional_call(self.module, state, user, tie_weights=False)


def lift(gm: torch.nn.Module) -> LiftedModule:
    """Collect the state of ``gm`` (parameters, buffers, tensor constants) as inputs."""
    if not isinstance(gm, torch.nn.Module):
        raise TypeError(
            f"kiln_autograd takes a torch.nn.Module (a torch.fx.GraphModule as capture or "
            f"torch.fx.symbolic_trace make them), not {type(gm).__name__}: trace a function "
            "first with torch.fx.symbolic_trace(fn)"
        )
    params = [name for name, _ in gm.named_parameters(remove_duplicate=False)]
    buffers = [name for name, _ in gm.named_buffers(remove_duplicate=False)]
    constants = _tensor_constants(gm, set(params) | set(buffers))
    return LiftedModule(
        module=gm,
        names=tuple(params + buffers + constants),
        num_params=len(params),
        num_buffers=len(buffers),
    )


def _tensor_constants(gm: torch.nn.Module, known: set[str]) -> list[str]:
    """Plain tensor attributes read by ``get_attr`` nodes (not parameters or buffers)."""
    graph = getattr(gm, "graph", None)
    if graph is None:
        return []
    found = []
    for node in graph.nodes:
        if node.op != "get_attr" or node.target in known or node.target in found:
            continue
        if isinstance(_get_attr(gm, node.target), torch.Tensor):
            found.append(node.target)
    return found


def _get_attr(module: torch.nn.Module, dotted: str) -> object:
    value: object = module
    for part in dotted.split("."):
        value = getattr(value, part)
    return value
