"""Inference graphs that read their parameters and buffers as constants.

An inference graph (no autograd) reads module state, parameters and buffers, that stays
the same from call to call until someone writes it (an optimizer step, ``load_state_dict``,
an in-place update). :func:`freeze` splits such a graph in two:

- the *state* graph: every op whose inputs are that state alone, after the rewrites of
  :mod:`kiln.folding` that make more of them so (batch norm folded into the convolution
  before it, convolution weights laid out as their inputs are);
- the graph that runs at each call: the same inputs, then what the state graph computes.

:class:`WithFrozenState` runs the state graph (ATen ops, eagerly) at the first call, and
again whenever a state tensor it reads is another tensor than before or was written in
place since (its version counter moved). It writes the new values over the old ones, so
their addresses, which CUDA graphs may have recorded, stay valid. Pure views of the
state (``weight.t()``) stay in the graph that runs: they cost nothing.

A graph whose frozen values would take more than ``MAX_DERIVED_BYTES`` is compiled as it
is: they live beside the parameters. Torch does not count a write through ``tensor.data``
in the version counter, so such a write goes unseen here: ``options={"freezing": False}``
reads the state at every call.
"""

from __future__ import annotations

import dataclasses
import logging
import operator
from collections.abc import Callable, Sequence

import torch
import torch.fx

import kiln_autograd
from kiln import folding
from kiln.graph_edits import copy_graph, module_of

# the most memory a graph's frozen values may take: they live beside the parameters, and
# a model cast under autocast would otherwise keep a second copy of all its weights
MAX_DERIVED_BYTES = 2 * 2**30
log = logging.getLogger("kiln.freezing")


@dataclasses.dataclass
class FrozenGraph:
    """``graph`` takes the original inputs, then ``state_graph``'s outputs; the state graph
    takes the original inputs at ``state`` (in that order)."""

    graph: torch.fx.GraphModule
    example_inputs: list[object]
    state_graph: torch.fx.GraphModule
    state: tuple[int, ...]
    folded_batch_norms: int
    laid_out_weights: int

    def source(self) -> str:
        """Both graphs as Python source (what ``KILN_DEBUG`` dumps)."""
        return (
            f"# computed once from inputs {list(self.state)}, again when they change\n"
            + self.state_graph.print_readable(print_output=False)
            + "\n\n# run at every call, with the values above as its last inputs\n"
            + self.graph.print_readable(print_output=False)
        )


def freeze(gm: torch.fx.GraphModule, example_inputs: Sequence[object]) -> FrozenGraph | None:
    """``gm`` split into what depends on its unwritten state alone and the rest, or None
    where nothing does (or ``gm`` is not an inference graph)."""
    state_indices = kiln_autograd.unwritten_state(gm)
    if not state_indices:
        return None
    graph, _ = copy_graph(gm)
    placeholders = list(graph.find_nodes(op="placeholder"))
    state = {placeholders[i] for i in state_indices}
    folded = folding.fold_batch_norms(graph, state)
    laid_out = folding.lay_out_weights(graph, state)
    constant = _constant_nodes(graph, state)
    members = set(constant)
    derived = [n for n in constant if _computes(n, members) and _used_outside(n, members)]
    if not derived:
        return None
    if (size := _bytes(derived)) > MAX_DERIVED_BYTES:
        log.info("not frozen: it would keep %.1f GiB of values", size / 2**30)
        return None
    needed = _ancestors(derived, members)
    state_graph, read = _state_graph(graph, needed, derived, state)
    _read_as_inputs(graph, derived, needed, constant)
    graph.lint()
    frozen = module_of(gm, graph)
    n_inputs = len(placeholders)
    static = kiln_autograd.static_inputs(gm) or ()
    frozen.meta[kiln_autograd.STATIC_INPUTS] = (
        *static,
        *range(n_inputs, n_inputs + len(derived)),
    )
    return FrozenGraph(
        graph=frozen,
        example_inputs=[*example_inputs, *(n.meta["val"] for n in derived)],
        state_graph=state_graph,
        state=tuple(placeholders.index(p) for p in read),
        folded_batch_norms=folded,
        laid_out_weights=laid_out,
    )


class WithFrozenState:
    """Calls ``compiled(*args, *values)``, where ``values`` are ``state_graph``'s results for
    the state inputs of ``args``, computed again only when those inputs changed."""

    def __init__(self, compiled: Callable, frozen: FrozenGraph) -> None:
        self.compiled = compiled
        self.state_graph = frozen.state_graph
        self.state = frozen.state
        self.seen: tuple[torch.Tensor, ...] = ()
        self.versions: list[int] = []
        self.values: tuple[torch.Tensor, ...] = ()

    def __call__(self, *args: object) -> object:
        state = tuple(args[i] for i in self.state)
        if not self._unchanged(state):
            self._refresh(state)
        return self.compiled(*args, *self.values)

    def _unchanged(self, state: tuple[torch.Tensor, ...]) -> bool:
        if not all(map(operator.is_, state, self.seen)) or len(state) != len(self.seen):
            return False
        try:
            return [t._version for t in state] == self.versions
        except RuntimeError:  # an inference tensor keeps no version: computed every call
            return False

    def _refresh(self, state: tuple[torch.Tensor, ...]) -> None:
        with torch.no_grad():
            fresh = tuple(self.state_graph(*state))
        if self.values:  # in place: CUDA graphs may have recorded their addresses
            for old, new in zip(self.values, fresh, strict=True):
                old.copy_(new)
        else:
            self.values = fresh
        self.seen = state
        try:
            self.versions = [t._version for t in state]
        except RuntimeError:
            self.versions = []


# --- the split -----------------------------------------------------------------------------


def _constant_nodes(graph: torch.fx.Graph, state: set[torch.fx.Node]) -> list[torch.fx.Node]:
    """The ops (in graph order) whose inputs are ``state`` or other such ops, that read no
    symbolic size, draw no random numbers, and whose result is not itself an output (an
    output must be a tensor of its own at every call)."""
    constant: list[torch.fx.Node] = []
    found: set[torch.fx.Node] = set()
    for node in graph.nodes:
        inputs = node.all_input_nodes
        if node.op != "call_function" or not inputs:
            continue
        if not all(x in state or x in found for x in inputs) or not _foldable(node):
            continue
        if any(user.op == "output" for user in node.users):
            continue
        constant.append(node)
        found.add(node)
    return constant


def _foldable(node: torch.fx.Node) -> bool:
    if node.target is operator.getitem:
        return True
    schema = getattr(node.target, "_schema", None)
    if schema is None or schema.is_mutable:
        return False
    if torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ()):
        return False
    symbolic: list[object] = []
    torch.fx.node.map_aggregate(
        (node.args, node.kwargs),
        lambda a: symbolic.append(a) if isinstance(a, (torch.SymInt, torch.SymFloat)) else None,
    )
    val = node.meta.get("val")
    values = val if isinstance(val, (tuple, list)) else (val,)
    return not symbolic and all(
        isinstance(v, torch.Tensor) and all(isinstance(s, int) for s in v.shape) for v in values
    )


def _is_view(node: torch.fx.Node) -> bool:
    return node.target is operator.getitem or bool(getattr(node.target, "is_view", False))


def _computes(node: torch.fx.Node, members: set[torch.fx.Node]) -> bool:
    """Whether ``node`` or a constant op it reads does more than view the state."""
    if not _is_view(node):
        return True
    return any(_computes(x, members) for x in node.all_input_nodes if x in members)


def _used_outside(node: torch.fx.Node, members: set[torch.fx.Node]) -> bool:
    return isinstance(node.meta.get("val"), torch.Tensor) and any(
        user not in members for user in node.users
    )


def _bytes(nodes: list[torch.fx.Node]) -> int:
    vals = [n.meta["val"] for n in nodes]
    return sum(v.numel() * v.element_size() for v in vals)


def _ancestors(nodes: list[torch.fx.Node], members: set[torch.fx.Node]) -> set[torch.fx.Node]:
    found, todo = set(), list(nodes)
    while todo:
        node = todo.pop()
        if node in found:
            continue
        found.add(node)
        todo += [x for x in node.all_input_nodes if x in members]
    return found


def _state_graph(
    graph: torch.fx.Graph,
    needed: set[torch.fx.Node],
    derived: list[torch.fx.Node],
    state: set[torch.fx.Node],
) -> tuple[torch.fx.GraphModule, list[torch.fx.Node]]:
    """The graph computing ``derived`` from the state inputs it reads (returned too, in
    the order of its placeholders)."""
    read = [p for p in graph.find_nodes(op="placeholder") if p in state and p.users.keys() & needed]
    new = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for p in read:
        env[p] = new.placeholder(p.name)
        env[p].meta = dict(p.meta)
    for node in graph.nodes:
        if node in needed:
            env[node] = new.node_copy(node, env.__getitem__)
    new.output(tuple(env[n] for n in derived))
    return torch.fx.GraphModule(torch.nn.Module(), new), read


def _read_as_inputs(
    graph: torch.fx.Graph,
    derived: list[torch.fx.Node],
    needed: set[torch.fx.Node],
    constant: list[torch.fx.Node],
) -> None:
    """Replace each derived value by a new last input; drop the ops only they needed."""
    last = list(graph.find_nodes(op="placeholder"))[-1]
    for i, node in enumerate(derived):
        with graph.inserting_after(last):
            last = graph.placeholder(f"frozen_{i}")
        last.meta["val"] = node.meta["val"]
        node.replace_all_uses_with(last)
    for node in reversed(constant):
        if node in needed and not node.users:
            graph.erase_node(node)
