"""Constant folding on the loop IR: a one-element buffer that a node fills with a number
computed from nothing it loads (``scalar_tensor``, ``full([], v)``) is read by the nodes
that load it as that number, written into their bodies; dead-node elimination then drops
the node where nothing else (an extern op, an output) reads the buffer. No kernel is
launched to write one number, and no kernel waits for one.
"""

from __future__ import annotations

import dataclasses

from kiln_loopir.ir import ComputedNode, LoopGraph, Pointwise, TensorRef


def fold_constants(graph: LoopGraph) -> LoopGraph:
    """Rewrite, in place, the nodes of ``graph`` that load a constant buffer to compute
    its number instead."""
    outputs = {o.buffer for o in graph.outputs if isinstance(o, TensorRef)}
    constants = {
        node.name: node
        for node in graph.nodes
        if isinstance(node, ComputedNode) and node.name not in outputs and _is_constant(node)
    }
    if not constants:
        return graph
    for node in graph.nodes:
        if isinstance(node, ComputedNode) and node.name not in constants:
            handler, _, _ = node.traced()
            read = {load.buffer for load in handler.loads} & constants.keys()
            if read:
                folded = {name: constants[name] for name in read}
                inner_fn = _reading_constants(node.body.inner_fn, folded)
                node.body = dataclasses.replace(node.body, inner_fn=inner_fn)
    return graph


def _is_constant(node: ComputedNode) -> bool:
    """One element, computed by a pointwise body that loads nothing."""
    if not isinstance(node.body, Pointwise) or any(r != 1 for r in node.body.ranges):
        return False
    if any(s != 1 for s in node.buffer.size):
        return False
    handler, _, _ = node.traced()
    return not handler.loads and not handler.indirect


def _reading_constants(inner_fn, constants: dict[str, ComputedNode]):
    def inner(ops, *index):
        return inner_fn(_ConstantLoads(ops, constants), *index)

    return inner


class _ConstantLoads:
    """An ops handler that computes the constant buffers' numbers where they are loaded
    and passes everything else to ``ops``."""

    def __init__(self, ops, constants: dict[str, ComputedNode]) -> None:
        self._ops = ops
        self._constants = constants

    def __getattr__(self, name: str):
        return getattr(self._ops, name)

    def load(self, name: str, index, *args, **kwargs):
        node = self._constants.get(name)
        if node is None:
            return self._ops.load(name, index, *args, **kwargs)
        value = node.body.call(self._ops, [])
        return self._ops.to_dtype(value, node.buffer.dtype)
