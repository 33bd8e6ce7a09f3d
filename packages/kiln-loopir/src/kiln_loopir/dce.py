"""Dead-node elimination on the loop IR: drop nodes whose buffers nothing reads."""

from __future__ import annotations

from kiln_loopir.ir import ComputedNode, ExternNode, LoopGraph, TensorRef
from kiln_loopir.runtime import make_seed


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
        if isinstance(node, ExternNode) and node.target is make_seed and not (names & needed):
            continue
        if names & needed or (isinstance(node, ExternNode) and not _pure(node)):
            kept.append(node)
            needed |= node_reads(node)
    graph.nodes = list(reversed(kept))
    return graph


def _pure(node: ExternNode) -> bool:
    # Every op in a functional graph is pure; the host helpers we add are too.
    return True
