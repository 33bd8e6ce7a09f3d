"""Which inputs of a compiled graph are the module's state (parameters, buffers, tensor
constants): the same tensors at every call, which a runtime may read in place.

:func:`~kiln_autograd.aot` notes them on each graph it hands to a compiler, in
``gm.meta[STATIC_INPUTS]``; :func:`static_inputs` reads them back.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

import torch.fx

STATIC_INPUTS = "kiln_static_inputs"
SAVED_OUTPUTS = "kiln_saved_outputs"
UNWRITTEN_STATE = "kiln_unwritten_state"


def static_inputs(gm: torch.fx.GraphModule) -> tuple[int, ...] | None:
    """Indices of ``gm``'s inputs that are lifted state, or None where ``gm`` did not come
    from :func:`~kiln_autograd.aot`."""
    meta = getattr(gm, "meta", None)
    return meta.get(STATIC_INPUTS) if isinstance(meta, dict) else None


# How capture names an input read from a module's parameters or buffers (its placeholder's
# meta["source"], e.g. "self._modules['fc']._parameters['weight']").
_STATE_SOURCES = ("._parameters[", "._buffers[")


def captured_state_inputs(gm: torch.nn.Module, example_inputs: list[object]) -> set[int]:
    """The inputs of a captured graph that are module state passed as inputs: parameters
    (an ``nn.Parameter`` example) and inputs whose capture source is a module's
    ``_parameters`` or ``_buffers`` entry."""
    graph = getattr(gm, "graph", None)
    nodes = list(graph.find_nodes(op="placeholder")) if graph is not None else []
    found = {i for i, x in enumerate(example_inputs) if isinstance(x, torch.nn.Parameter)}
    for i, node in enumerate(nodes):
        source = node.meta.get("source")
        if isinstance(source, str) and any(s in source for s in _STATE_SOURCES):
            found.add(i)
    return found


def note_static_inputs(gm: torch.fx.GraphModule, state: set[int] | set[str]) -> None:
    """Note which inputs of ``gm`` are state: those at the indices ``state`` (ints: the
    forward and inference graphs), or those whose placeholder has one of the names (the
    backward graph, whose saved inputs keep the names of the forward's)."""
    placeholders = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    gm.meta[STATIC_INPUTS] = tuple(
        i for i, name in enumerate(placeholders) if i in state or name in state
    )


def note_unwritten_state(gm: torch.fx.GraphModule, state: set[int], written: Sequence[int]) -> None:
    """Note, on an inference graph, which of its state inputs (indices ``state``) it does
    not write (``written``: the inputs whose new values it returns to be written back)."""
    gm.meta[UNWRITTEN_STATE] = tuple(sorted(set(state) - set(written)))


def unwritten_state(gm: torch.fx.GraphModule) -> tuple[int, ...]:
    """Indices of an inference graph's inputs that are module state it only reads: the same
    values at every call until someone writes them, so a compiler may compute what depends
    on them alone once (it must notice the writes). Empty for other graphs (a training
    forward's parameters change at every optimizer step, which autograd must see)."""
    meta = getattr(gm, "meta", None)
    return meta.get(UNWRITTEN_STATE, ()) if isinstance(meta, dict) else ()


def note_saved_outputs(gm: torch.fx.GraphModule, saved: range) -> None:
    """Note which outputs of a forward graph are the tensors it saves for its backward."""
    gm.meta[SAVED_OUTPUTS] = tuple(saved)


def saved_outputs(gm: torch.fx.GraphModule) -> tuple[int, ...]:
    """Indices of a forward graph's outputs that are the tensors it saves for its backward
    graph (none for other graphs). They die once the backward ran (unless they share memory
    with an output the caller gets), so a runtime may hand them out over memory that it
    reuses at a later call, once they are gone."""
    meta = getattr(gm, "meta", None)
    return meta.get(SAVED_OUTPUTS, ()) if isinstance(meta, dict) else ()


# Outputs of ATen ops whose values no result depends on and that differ from run to run:
# the random-number seed and offset of fused attention (unset without dropout).
_RNG_STATE_OUTPUTS = {
    "aten._scaled_dot_product_flash_attention.default": (6, 7),
    "aten._scaled_dot_product_efficient_attention.default": (2, 3),
    "aten._scaled_dot_product_cudnn_attention.default": (6, 7),
}


def rng_state_outputs(gm: torch.fx.GraphModule) -> tuple[int, ...]:
    """Indices of ``gm``'s outputs that are fused attention's random-number seed or offset:
    values that two runs of the same graph need not share (a runtime that checks a replay
    against an eager run skips them)."""
    (output,) = gm.graph.find_nodes(op="output")
    values = output.args[0] if isinstance(output.args[0], (tuple, list)) else (output.args[0],)
    found = []
    for i, node in enumerate(values):
        if not isinstance(node, torch.fx.Node) or node.target is not operator.getitem:
            continue
        source, index = node.args
        if not isinstance(source, torch.fx.Node):
            continue
        if index in _RNG_STATE_OUTPUTS.get(str(source.target), ()):
            found.append(i)
    return tuple(found)


def unused_seed_inputs(gm: torch.fx.GraphModule) -> tuple[int, ...]:
    """Indices of ``gm``'s inputs that nothing computes with: fused attention's random-number
    seed and offset passed to its backward without dropout (``dropout_p == 0``). ATen
    makes them as uninitialised CPU tensors, new at every step; a runtime may ignore them
    (keep the ones it saw first) rather than treat them as data."""
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    found = []
    for i, node in enumerate(placeholders):
        if node.users and all(_seed_without_dropout(user, node) for user in node.users):
            found.append(i)
    return tuple(found)


def _seed_without_dropout(user: torch.fx.Node, value: torch.fx.Node) -> bool:
    """Whether ``user`` is an op that takes ``value`` only as its ``philox_seed`` or
    ``philox_offset`` and runs without dropout."""
    schema = getattr(user.target, "_schema", None)
    if schema is None:
        return False
    args = {a.name: a for a in schema.arguments}
    if "philox_seed" not in args or "dropout_p" not in args:
        return False
    bound = {
        a.name: user.args[i] if i < len(user.args) else user.kwargs.get(a.name, a.default_value)
        for i, a in enumerate(schema.arguments)
    }
    if bound["dropout_p"] != 0:
        return False
    where = [name for name, v in bound.items() if v is value]
    return bool(where) and all(name in ("philox_seed", "philox_offset") for name in where)
