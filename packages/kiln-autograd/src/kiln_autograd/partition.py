"""Split a joint graph into a forward graph and a backward graph.

Two partitioners share :func:`split`, which builds both graphs once the set of values to
save is chosen:

- :func:`min_cut_partition` chooses them with a minimum s-t cut over the graph's values,
  each weighted by its size in bytes (see :mod:`kiln_autograd.mincut`): the backward graph
  recomputes cheap ops (:mod:`kiln_autograd.recompute`) where that saves fewer bytes;
- :func:`default_partition` saves every forward value the backward uses, recomputing none.

The forward graph is ``primals -> (forward outputs..., saved tensors..., saved SymInts...)``;
the backward graph is ``(saved tensors..., saved SymInts..., tangents...) -> gradients``.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
import threading
from collections.abc import Callable, Sequence

import torch
import torch.fx

from kiln_autograd.recompute import VIEW_OPS, is_random, op_name
from kiln_autograd.trace import JointGraph


@dataclasses.dataclass
class JointParts:
    """The joint graph's nodes sorted by role, as both partitioners see them."""

    primals: list[torch.fx.Node]
    tangents: list[torch.fx.Node]
    fw_outputs: list[object]  # output args (nodes or constants)
    grads: list[object]
    tangent_dependent: set[torch.fx.Node]  # computed from a tangent: backward only
    fw_required: set[torch.fx.Node]  # needed for a forward output

    def backward_uses(self) -> set[torch.fx.Node]:
        """Tangent-free nodes that a backward node or a gradient output reads directly."""
        used = set()
        for node in self.tangent_dependent:
            used.update(n for n in node.all_input_nodes if n not in self.tangent_dependent)
        used.update(
            g
            for g in self.grads
            if isinstance(g, torch.fx.Node) and g not in self.tangent_dependent
        )
        return used


@dataclasses.dataclass
class PartitionedGraphs:
    """The forward and backward graphs of one joint graph, and how they connect."""

    fw: torch.fx.GraphModule
    bw: torch.fx.GraphModule
    num_fw_outputs: int
    num_saved_tensors: int
    num_saved_symints: int
    grad_tangent_deps: tuple[frozenset[int], ...]  # per gradient: the tangents it reads

    def saved_names(self) -> list[str]:
        """Names of the saved values (the backward graph's first placeholders)."""
        placeholders = [n for n in self.bw.graph.nodes if n.op == "placeholder"]
        return [n.name for n in placeholders[: self.num_saved_tensors + self.num_saved_symints]]

    def saved_bytes(self) -> int:
        """Bytes of the tensors the forward saves for the backward (sizes at their hints)."""
        from kiln_autograd.mincut import value_bytes

        placeholders = [n for n in self.bw.graph.nodes if n.op == "placeholder"]
        return int(sum(value_bytes(n) for n in placeholders[: self.num_saved_tensors]))

    def __str__(self) -> str:
        fw = self.fw.print_readable(print_output=False)
        bw = self.bw.print_readable(print_output=False)
        return f"# forward\n{fw}\n# backward\n{bw}"


def parts_of(joint: JointGraph) -> JointParts:
    """Sort the joint graph's nodes into primals, tangents, forward and backward values."""
    graph = joint.gm.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    primals = placeholders[: joint.num_inputs]
    tangents = placeholders[joint.num_inputs :]
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    values = list(output.args[0])
    fw_outputs = values[: joint.num_fw_outputs]
    grads = values[joint.num_fw_outputs :]

    tangent_dependent: set[torch.fx.Node] = set(tangents)
    for node in graph.nodes:
        if any(n in tangent_dependent for n in node.all_input_nodes) and node.op != "output":
            tangent_dependent.add(node)

    fw_required: set[torch.fx.Node] = set()
    stack = [v for v in fw_outputs if isinstance(v, torch.fx.Node)]
    while stack:
        node = stack.pop()
        if node in fw_required:
            continue
        if node in tangent_dependent:
            raise AssertionError(f"forward output {node} depends on a tangent")
        fw_required.add(node)
        stack.extend(node.all_input_nodes)
    return JointParts(primals, tangents, fw_outputs, grads, tangent_dependent, fw_required)


def default_partition(joint: JointGraph) -> PartitionedGraphs:
    """Save every forward value that the backward reads; recompute nothing."""
    parts = parts_of(joint)
    return split(joint, parts, parts.backward_uses())


def min_cut_partition(joint: JointGraph) -> PartitionedGraphs:
    """Save the set of values with the fewest bytes from which the backward can be computed."""
    from kiln_autograd.mincut import choose_saved_values

    parts = parts_of(joint)
    return split(joint, parts, choose_saved_values(parts))


def import_min_cut_in_background() -> None:
    """Start importing the minimum cut's module (and networkx, mostly reading files) in a
    thread, so that the import overlaps tracing the joint graph rather than following it."""
    global _min_cut_import
    if _min_cut_import is None and "kiln_autograd.mincut" not in sys.modules:
        _min_cut_import = threading.Thread(
            target=_import_min_cut, name="kiln-autograd-import", daemon=True
        )
        _min_cut_import.start()


_min_cut_import: threading.Thread | None = None


def _import_min_cut() -> None:
    try:
        importlib.import_module("kiln_autograd.mincut")
    except Exception:  # noqa: BLE001 - the partition's own import reports it
        return


PARTITIONERS: dict[str, Callable[[JointGraph], PartitionedGraphs]] = {
    "min_cut": min_cut_partition,
    "default": default_partition,
}


def split(joint: JointGraph, parts: JointParts, saved: set[torch.fx.Node]) -> PartitionedGraphs:
    """Build the forward and backward graphs that pass ``saved`` between them, except that
    a saved view of a forward input is passed as the input itself (:func:`input_view_base`)."""
    saved = {input_view_base(n, joint, parts) or n for n in saved}
    order = {n: i for i, n in enumerate(joint.gm.graph.nodes)}
    saved_list = sorted(saved, key=order.__getitem__)
    saved_tensors = [n for n in saved_list if not _is_sym(n)]
    saved_symints = [n for n in saved_list if _is_sym(n)]
    saved_list = saved_tensors + saved_symints

    # Random ops stay in the forward even when nothing reads them, so that the forward
    # draws from the generator exactly as eager does.
    draws = [n for n in joint.gm.graph.nodes if is_random(n) and n not in parts.tangent_dependent]
    fw_roots = [v for v in parts.fw_outputs + saved_list if isinstance(v, torch.fx.Node)]
    fw_nodes = _ancestors(fw_roots + draws, stop=set())
    fw = _extract(
        joint.gm,
        inputs=parts.primals,
        outputs=list(parts.fw_outputs) + saved_list,
        keep=fw_nodes,
    )
    bw_inputs = saved_list + parts.tangents
    bw_nodes = _ancestors(
        [g for g in parts.grads if isinstance(g, torch.fx.Node)], stop=set(bw_inputs)
    )
    leaked = [n for n in bw_nodes if n.op == "placeholder" and n not in bw_inputs]
    if leaked:
        raise AssertionError(f"backward graph reads forward inputs {leaked} that are not saved")
    bw = _extract(joint.gm, inputs=bw_inputs, outputs=list(parts.grads), keep=bw_nodes)

    tangents_read = _tangents_read(joint.gm.graph, parts.tangents)
    deps = [tangents_read[g] if isinstance(g, torch.fx.Node) else frozenset() for g in parts.grads]
    return PartitionedGraphs(
        fw=fw,
        bw=bw,
        num_fw_outputs=len(parts.fw_outputs),
        num_saved_tensors=len(saved_tensors),
        num_saved_symints=len(saved_symints),
        grad_tangent_deps=tuple(deps),
    )


def input_view_base(
    node: torch.fx.Node, joint: JointGraph, parts: JointParts
) -> torch.fx.Node | None:
    """The forward input that ``node`` is a chain of views of (a transposed weight, say), or
    None. Saving the input instead costs no more memory, and the backward makes the views
    again for free; a runtime then sees a parameter it reads in place at every step rather
    than a new tensor (a CUDA graph would copy it). Inputs the graph writes are not taken:
    their memory holds the new value by the time the backward runs."""
    chain = node
    while chain.op == "call_function":
        target = chain.target
        if not isinstance(target, torch._ops.OpOverload) or op_name(target) not in VIEW_OPS:
            return None
        if len(chain.all_input_nodes) != 1:  # sizes that are SymInts of the forward
            return None
        chain = chain.all_input_nodes[0]
    if chain is node or chain not in parts.primals:
        return None
    if parts.primals.index(chain) in joint.meta.mutated_inputs:
        return None
    return chain


def _is_sym(node: torch.fx.Node) -> bool:
    return isinstance(node.meta.get("val"), (torch.SymInt, torch.SymFloat, torch.SymBool, int))


def _tangents_read(graph: torch.fx.Graph, tangents: Sequence[torch.fx.Node]) -> dict:
    """For every node, the indices of the tangents it reads, directly or not (one pass in
    program order, rather than a walk of each gradient's ancestors)."""
    found: dict[torch.fx.Node, frozenset[int]] = {t: frozenset([j]) for j, t in enumerate(tangents)}
    for node in graph.nodes:
        if node not in found:
            found[node] = frozenset().union(*(found[n] for n in node.all_input_nodes))
    return found


def view_root(node: torch.fx.Node) -> torch.fx.Node:
    """The value whose memory ``node`` views (``node`` itself where it is no view)."""
    while node.op == "call_function" and getattr(node.target, "is_view", False):
        node = node.args[0]
    return node


def _ancestors(roots: Sequence[torch.fx.Node], stop: set[torch.fx.Node]) -> set[torch.fx.Node]:
    """``roots`` and every node they read, not reading past the nodes in ``stop``."""
    found: set[torch.fx.Node] = set()
    stack = list(roots)
    while stack:
        node = stack.pop()
        if node in found:
            continue
        found.add(node)
        if node not in stop:
            stack.extend(node.all_input_nodes)
    return found


def _extract(
    gm: torch.fx.GraphModule,
    inputs: Sequence[torch.fx.Node],
    outputs: Sequence[object],
    keep: set[torch.fx.Node],
) -> torch.fx.GraphModule:
    """A new graph with ``inputs`` as placeholders, the kept nodes in order, ``outputs``."""
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in inputs:
        new = graph.placeholder(node.name)
        new.meta = dict(node.meta)
        env[node] = new
    for node in gm.graph.nodes:
        if node in env or node not in keep or node.op in ("placeholder", "output"):
            continue
        env[node] = graph.node_copy(node, env.__getitem__)
    graph.output(tuple(env[v] if isinstance(v, torch.fx.Node) else v for v in outputs))
    graph.eliminate_dead_code()
    graph.lint()
    return torch.fx.GraphModule(gm, graph)
