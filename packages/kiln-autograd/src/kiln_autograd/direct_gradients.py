"""Gradients written into parameters' ``.grad`` by the compiled backward itself.

A compiled training graph that takes a model's parameters as inputs of its
``autograd.Function`` gives autograd's engine an edge to each parameter's gradient
accumulator: at every backward the engine schedules and runs one ``AccumulateGrad`` node per
parameter (BERT: 199), which costs more host time than the compiled backward's launches.

With direct gradients (``aot(..., direct_gradients=True)``) the parameters are not inputs of
the ``Function``: it reads them from the call, and its backward does what ``AccumulateGrad``
would have done, for all of them at once:

- a parameter without a gradient takes the new one (a copy in the parameter's layout where
  the graph's is another, or where the new gradient is memory something else holds: an
  input of the backward, or another gradient);
- one with a gradient adds the new one to it in place (one multi-tensor add);
- tensor hooks (``register_hook``) run on the gradient before, and post-accumulate hooks
  (``register_post_accumulate_grad_hook``) after, as autograd runs them.

It does so only in a backward that accumulates into every leaf (``loss.backward()``): one
input of the ``Function`` is a *sentinel*, a leaf of its own, and the engine says whether it
runs that leaf's accumulator. ``torch.autograd.grad(loss, x)`` or ``backward(inputs=[x])``
leave ``.grad`` alone, as they must.

What this cannot see, and why it is not the default: a gradient asked of a parameter by
name (``torch.autograd.grad(loss, params)``, ``backward(inputs=params)``) does not reach the
parameters, which are not in autograd's graph (the first raises autograd's "not used in the
graph" error; with ``allow_unused=True``, or through ``backward(inputs=...)``, no gradient
comes); hooks registered on an accumulator node itself (``grad_fn.next_functions``, C++
hooks such as ``DistributedDataParallel``'s) do not run. A process with
``torch.distributed`` initialized therefore keeps parameters in autograd's graph.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from operator import itemgetter

import torch
import torch.fx

from kiln_autograd.partition import view_root

log = logging.getLogger("kiln_autograd")


def eligible_parameters(
    args: Sequence[object], static_inputs: frozenset[int], mutated: Sequence[int]
) -> tuple[int, ...]:
    """The inputs whose gradients may be written directly: module state that is a leaf
    requiring grad and that the graph does not write."""
    return tuple(
        i
        for i, a in enumerate(args)
        if i in static_inputs
        and i not in mutated
        and isinstance(a, torch.Tensor)
        and a.requires_grad
        and a.is_leaf
    )


def distributed_initialized() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


class DirectGradients:
    """The parameters (``positions`` among the inputs) of one compiled graph whose
    gradients its backward writes; ``gradient_of[i]`` is the backward output of input ``i``."""

    def __init__(
        self,
        positions: Sequence[int],
        num_inputs: int,
        bw: torch.fx.GraphModule,
        gradient_of: dict[int, int],
        device: torch.device,
    ) -> None:
        self.positions = tuple(positions)
        chosen = set(positions)
        self.tape_positions = tuple(i for i in range(num_inputs) if i not in chosen)
        self.parameters_of = _getter(self.positions)
        self.tape_inputs_of = _getter(self.tape_positions)
        self.sentinel = torch.zeros((), device=device, requires_grad=True)
        # the engine runs a leaf's accumulator in a backward that accumulates into every
        # leaf reached, and not in autograd.grad or backward(inputs=...) that leave it out
        self._sentinel_node = self.sentinel.view_as(self.sentinel).grad_fn.next_functions[0][0]
        self._held = _held_gradients(bw, [gradient_of.get(i) for i in self.positions])
        self._copied: list[bool] | None = None
        self._noted_distributed = False

    def note_distributed(self) -> None:
        """Say once that this graph's parameters stay in autograd's graph because
        ``torch.distributed`` is initialized (its hooks on accumulators must run)."""
        if not self._noted_distributed:
            self._noted_distributed = True
            log.info(
                "direct gradients off for %d parameters: torch.distributed is initialized, "
                "and DistributedDataParallel's reducer hooks their accumulators; autograd "
                "accumulates their gradients",
                len(self.positions),
            )

    def full_backward(self) -> bool:
        """Whether the running backward accumulates into every leaf it reaches."""
        return torch._C._will_engine_execute_node(self._sentinel_node)

    def accumulate(self, params: Sequence[torch.Tensor], grads: Sequence[object]) -> None:
        """What autograd's ``AccumulateGrad`` does for each parameter and its gradient."""
        if self._copied is None:  # layouts are the compiled graph's: worked out once
            self._copied = [
                held or (isinstance(g, torch.Tensor) and not _obeys_layout(g, p))
                for p, g, held in zip(params, grads, self._held, strict=True)
            ]
        into: list[torch.Tensor] = []
        added: list[torch.Tensor] = []
        grad_mode = torch.is_grad_enabled()
        for p, g, copied in zip(params, grads, self._copied, strict=True):
            if g is None:
                continue
            hooks = p._backward_hooks
            if hooks:
                g, copied = _run_tensor_hooks(hooks, g, copied)
            old = p.grad
            if old is None:
                p.grad = _in_layout_of(p, g) if copied else g
            elif grad_mode:  # create_graph=True: the sum keeps its history, as autograd's
                p.grad = old + g
            else:
                into.append(old)
                added.append(g)
            post = p._post_accumulate_grad_hooks
            if post:
                if into:  # the hook reads .grad: earlier additions first
                    torch._foreach_add_(into, added)
                    into, added = [], []
                for hook in tuple(post.values()):
                    hook(p)
        if into:
            torch._foreach_add_(into, added)


def leaves_reached(out: torch.Tensor) -> list[torch.Tensor]:
    """The leaves whose accumulator autograd's graph reaches from ``out``: those a
    ``backward()`` from it runs an ``AccumulateGrad`` node for (parameters written
    directly are not among them)."""
    seen, found, todo = set(), [], [out.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if type(node).__name__ == "AccumulateGrad":
            found.append(node.variable)
        todo.extend(n for n, _ in node.next_functions)
    return found


def _getter(positions: tuple[int, ...]):
    """``args -> tuple`` of the items at ``positions`` (an empty tuple for none)."""
    if not positions:
        return lambda args: ()
    if len(positions) == 1:
        (i,) = positions
        return lambda args: (args[i],)
    return itemgetter(*positions)


def _held_gradients(bw: torch.fx.GraphModule, outputs: Sequence[int | None]) -> list[bool]:
    """Per parameter, whether its gradient is memory something else holds: an input of the
    backward (an incoming gradient passed on), or a value another output shares. Autograd
    copies such a gradient rather than keep it as ``.grad``; so does :class:`DirectGradients`."""
    output = next(iter(reversed(bw.graph.nodes)))
    values = list(output.args[0])
    roots = [view_root(v) if isinstance(v, torch.fx.Node) else None for v in values]
    counts = Counter(r for r in roots if r is not None)
    held = []
    for j in outputs:
        root = roots[j] if j is not None else None
        held.append(root is not None and (root.op != "call_function" or counts[root] > 1))
    return held


def _obeys_layout(g: torch.Tensor, p: torch.Tensor) -> bool:
    """autograd's layout contract: a dense parameter's gradient has its strides; any other
    parameter's is contiguous."""
    if _dense(p):
        return g.stride() == p.stride() or p.numel() <= 1
    return g.is_contiguous()


def _dense(t: torch.Tensor) -> bool:
    """Whether ``t``'s elements fill its memory, each once: its strides, in increasing
    order, are those of a contiguous tensor of its sizes in some order of dimensions."""
    expected = 1
    dims = sorted((s, n) for n, s in zip(t.shape, t.stride(), strict=True) if n != 1)
    for stride, size in dims:
        if stride != expected:
            return False
        expected *= size
    return True


def _in_layout_of(p: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """A copy of ``g`` laid out as autograd lays out ``p``'s gradient."""
    if _dense(p):
        out = torch.empty_strided(p.shape, p.stride(), dtype=g.dtype, device=g.device)
        return out.copy_(g)
    return g.clone(memory_format=torch.contiguous_format)


def _run_tensor_hooks(hooks: dict, g: torch.Tensor, copied: bool) -> tuple[torch.Tensor, bool]:
    """The gradient after a leaf's tensor hooks, in the order they were registered; a hook's
    result is the hook's own tensor, which may be anything: copied unless it obeys."""
    for hook in tuple(hooks.values()):
        result = hook(g)
        if result is not None:
            g, copied = result, True
    return g, copied
