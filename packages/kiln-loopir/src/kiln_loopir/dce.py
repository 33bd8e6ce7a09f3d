"""Dead-node elimination on the loop IR: drop nodes whose buffers nothing reads."""

from __future__ import annotations

from kiln_loopir.ir import ComputedNode, LoopGraph, TensorRef


def node_reads(node) -> set[str]:
    if isinstance(node, ComputedNode):
        handler, _, _ = node.trace()
        return {load.buffer for load in handler.loads}
    return {ref.buffer for ref in node.input_refs()}


def eliminate_dead_nodes(graph: LoopGraph) -> LoopGraph:
    """Remove, in place, every node none of whose buffers is read or returned."""
    needed = {o.buffer for o in graph.outputs if isinstance(o, TensorRef)}
    kept = []
    for node in reversed(graph.nodes):
        names = (
            {node.name}
            if isinstance(node, ComputedNode)
            else {b.name for b in node.outputs if b is not None}
        )
        # every op of a functional graph is pure, and so are the host helpers we add
        if names & needed:
            kept.append(node)
            needed |= node_reads(node)
    graph.nodes = list(reversed(kept))
    return graph
