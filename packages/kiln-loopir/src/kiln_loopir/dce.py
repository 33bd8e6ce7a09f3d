"""Dead-node elimination on the loop IR: drop nodes whose buffers nothing reads."""

from __future__ import annotations

import sympy

from kiln_loopir.ir import ComputedNode, LoopGraph, TensorRef
from kiln_loopir.kernel import kernel_of
from kiln_loopir.scheduler import step_symbols_used
from kiln_loopir.symbols import data_dependent_symbols


def node_reads(node) -> set[str]:
    """The buffers a node reads and (as ``$u0``) the data-dependent symbols it uses."""
    if isinstance(node, ComputedNode):
        step = kernel_of(node, node.name)  # traced once: its loads and its symbols
        return step.reads() | _symbols(step_symbols_used(step))
    return {ref.buffer for ref in node.input_refs()} | _symbols(step_symbols_used(node))


def _symbols(symbols: set[sympy.Symbol]) -> set[str]:
    return {f"${s}" for s in symbols}


def eliminate_dead_nodes(graph: LoopGraph) -> LoopGraph:
    """Remove, in place, every node none of whose buffers (or data-dependent symbols) is
    read or returned."""
    needed = {o.buffer for o in graph.outputs if isinstance(o, TensorRef)}
    exprs: list[object] = []
    for o in graph.outputs:
        if isinstance(o, TensorRef):
            exprs += [*o.size, *o.stride, o.offset]
        elif isinstance(o, sympy.Basic):
            exprs.append(o)
    needed |= _symbols(data_dependent_symbols(exprs))
    kept = []
    for node in reversed(graph.nodes):
        names = (
            {node.name}
            if isinstance(node, ComputedNode)
            else {b.name for b in node.outputs if b is not None} | _symbols(node.bound_symbols())
        )
        # every op of a functional graph is pure, and so are the host helpers we add
        if names & needed:
            kept.append(node)
            needed |= node_reads(node)
    graph.nodes = list(reversed(kept))
    return graph
