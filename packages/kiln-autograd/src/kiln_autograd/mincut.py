"""Choose the values a forward graph saves for its backward: a minimum cut in bytes.

The flow graph has two vertices per tangent-free value of the joint graph, ``v_in`` and
``v_out``, joined by an edge whose capacity is the value's size in bytes: cutting it means
saving the value. Infinite edges encode the rules:

- ``source -> v_in`` for the primals (only the forward has them) and for the values the
  backward may not recompute (matmuls, convolutions, random ops, see
  :mod:`kiln_autograd.recompute`): their ``v_in`` stays on the forward's side;
- ``v_out -> sink`` for the values the backward reads directly;
- ``u_out -> v_in`` for every use of ``u`` by ``v``: recomputing ``v`` needs ``u``.

Every source-to-sink path must be cut, so the cut is a set of saved values from which the
backward can compute everything it needs, and a minimum cut saves the fewest bytes. A value
whose ``v_in`` lands on the sink's side is recomputed by the backward (the forward still
computes it if a forward output needs it).
"""

from __future__ import annotations

import math

import networkx as nx
import torch
import torch.fx

from kiln_autograd.partition import JointParts
from kiln_autograd.recompute import is_recomputable

# A SymInt passed to the backward costs no tensor memory; a small weight keeps cuts tidy.
SYMINT_BYTES = 1
# Assumed size of a dimension that has no hint (unbacked SymInt).
UNHINTED_DIM = 4096


def value_bytes(node: torch.fx.Node) -> float:
    """The size of the value ``node`` computes, in bytes (infinite if it cannot be saved)."""
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        numel = 1
        for size in val.shape:
            numel *= _hint(size)
        return numel * val.element_size()
    if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool)):
        return SYMINT_BYTES
    return math.inf  # tuples of multi-output ops: save their items instead


def choose_saved_values(parts: JointParts) -> set[torch.fx.Node]:
    """The tangent-free values to save, chosen by a minimum source-sink cut in bytes."""
    needed_by_bw = parts.backward_uses()
    if not needed_by_bw:
        return set()
    relevant = _relevant_nodes(parts, needed_by_bw)
    flow = nx.DiGraph()
    for node in relevant:
        weight = value_bytes(node)
        if weight == math.inf:
            flow.add_edge(_in(node), _out(node))
        else:
            flow.add_edge(_in(node), _out(node), capacity=weight)
        if node.op == "placeholder" or not is_recomputable(node):
            flow.add_edge("source", _in(node))
        if node in needed_by_bw:
            flow.add_edge(_out(node), "sink")
        for user in node.users:
            if user in relevant:
                flow.add_edge(_out(node), _in(user))
    if "source" not in flow:
        return set()  # the backward reads only values made of constants: it makes them
    _, (reachable, _) = nx.minimum_cut(flow, "source", "sink")
    return {n for n in relevant if _in(n) in reachable and _out(n) not in reachable}


def _relevant_nodes(parts: JointParts, needed_by_bw: set[torch.fx.Node]) -> set[torch.fx.Node]:
    """Tangent-free nodes that a value the backward reads is computed from."""
    found: set[torch.fx.Node] = set()
    stack = list(needed_by_bw)
    while stack:
        node = stack.pop()
        if node in found or node in parts.tangent_dependent:
            continue
        found.add(node)
        stack.extend(node.all_input_nodes)
    return found


def _hint(size: object) -> int:
    if isinstance(size, int):
        return size
    node = getattr(size, "node", None)
    hint = getattr(node, "hint", None)
    if hint is None:
        try:
            hint = node.shape_env.size_hint(node.expr)
        except Exception:
            return UNHINTED_DIM
    return int(hint) if hint is not None else UNHINTED_DIM


def _in(node: torch.fx.Node) -> tuple[str, str]:
    return (node.name, "in")


def _out(node: torch.fx.Node) -> tuple[str, str]:
    return (node.name, "out")
