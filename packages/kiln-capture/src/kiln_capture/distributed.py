"""Graphs captured under ``DistributedDataParallel``, split at its gradient buckets.

DDP all-reduces a bucket of gradients as soon as every gradient in it is ready. A training
graph compiled whole hands out all its gradients at the end of its backward, so every
all-reduce waits for the whole backward. A graph captured while a DDP module runs its
forward is split instead into consecutive graphs, each holding about one bucket's worth of
parameters (DDP's ``bucket_cap_mb``; the last graph, whose gradients come first, DDP's
smaller first bucket): each graph's backward ends with its parameters' gradients, DDP's
hooks start their all-reduce, and the backward of the graphs before it runs meanwhile.

:func:`compile_graph` is what capture calls for every graph; outside a DDP forward (or
with nothing to split) it is the backend's call itself.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.fx

log = logging.getLogger("kiln.capture")


def active_ddp_module():
    """The DDP module whose forward is running (DDP notes itself while it calls the module
    it wraps), or None."""
    ddp = torch.nn.parallel.DistributedDataParallel
    getter = getattr(ddp, "_get_active_ddp_module", None)
    return getter() if getter is not None else None


def bucket_caps(ddp) -> tuple[int, int]:
    """(first bucket, every other bucket) in bytes, as DDP's reducer sizes them."""
    cap = int(ddp.bucket_bytes_cap)
    config = getattr(ddp, "_bucket_config", None)  # torch 2.13: the caps in one place
    if config is not None:
        return int(config.first_bucket_bytes_cap), cap
    default_first = getattr(torch.distributed, "_DEFAULT_FIRST_BUCKET_BYTES", cap)
    return (default_first if getattr(ddp, "bucket_bytes_cap_default", False) else cap), cap


def compile_graph(gm: torch.fx.GraphModule, example_inputs: list, backend: Callable):
    """``backend(gm, example_inputs)``, or under a DDP forward that trains, the graph split
    at bucket boundaries with each part compiled by ``backend``."""
    ddp = active_ddp_module()
    if ddp is None or not torch.is_grad_enabled():
        return backend(gm, example_inputs)
    pieces = plan_pieces(gm, example_inputs, ddp)
    if len(pieces) < 2:
        return backend(gm, example_inputs)
    return split_and_compile(gm, pieces, backend)


# --- which nodes go together ---------------------------------------------------------


def plan_pieces(gm: torch.fx.GraphModule, example_inputs: list, ddp) -> list[list]:
    """The graph's nodes (placeholders and output left out) in consecutive pieces, each
    reading about one bucket's worth of the parameters DDP reduces: the graph is walked
    from its end, as the backward runs, and a piece closes once its parameters reach the
    bucket size (the first, DDP's first bucket's)."""
    reduced = reduced_parameter_inputs(gm, example_inputs, ddp)
    first_cap, cap = bucket_caps(ddp)
    pieces: list[list] = [[]]
    size, seen = 0, set()
    for node in reversed(gm.graph.nodes):
        if node.op in ("placeholder", "output"):
            continue
        if size >= (first_cap if len(pieces) == 1 else cap):
            pieces.append([])
            size = 0
        pieces[-1].append(node)
        for arg in node.all_input_nodes:
            if arg in reduced and arg not in seen:
                seen.add(arg)
                size += reduced[arg]
    pieces = [list(reversed(p)) for p in reversed(pieces) if p]
    return merge_at_unsplittable_cuts(gm, pieces)


def reduced_parameter_inputs(gm, example_inputs, ddp) -> dict:
    """Placeholder -> bytes, for the inputs that are parameters DDP all-reduces."""
    ignored = {
        id(p)
        for name, p in ddp.module.named_parameters()
        if name in getattr(ddp, "parameters_to_ignore", ())
    }
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    return {
        node: value.numel() * value.element_size()
        for node, value in zip(placeholders, example_inputs, strict=False)
        if isinstance(value, torch.nn.Parameter)
        and value.requires_grad
        and id(value) not in ignored
    }


def merge_at_unsplittable_cuts(gm, pieces: list[list]) -> list[list]:
    """Pieces joined where a value other than a dense tensor of static size would cross the
    cut (a tuple, a size, a view, a tensor of symbolic size): only tensors that own their
    memory, laid out as their sizes say, pass between graphs."""
    merged = [pieces[0]]
    for piece in pieces[1:]:
        before = {n for p in merged for n in p}
        crossing = {a for n in piece for a in n.all_input_nodes if a in before}
        if all(passes_between_graphs(n) for n in crossing):
            merged.append(piece)
        else:
            merged[-1] = merged[-1] + piece
    return merged


def passes_between_graphs(node: torch.fx.Node) -> bool:
    value = node.meta.get("example_value")
    return (
        isinstance(value, torch.Tensor)
        and value._base is None
        and all(isinstance(s, int) for s in (*value.shape, *value.stride()))
        and value.is_contiguous()
    )


# --- the graphs ----------------------------------------------------------------------


@dataclass
class Piece:
    """One part of the split graph: its graph and where its inputs and outputs live."""

    gm: torch.fx.GraphModule
    inputs: list[torch.fx.Node]  # nodes of the whole graph it reads
    outputs: list[torch.fx.Node]  # nodes of the whole graph it makes, read after it


def split_and_compile(gm, pieces: list[list], backend) -> Callable:
    """The pieces chained; each is compiled at its first call, on the tensors that reach it
    there: a piece's inputs made by the pieces before it exist only then (a compiler may
    read an input's values: whether a mask is causal, say)."""
    placeholders = gm.graph.find_nodes(op="placeholder")
    sources = dict(zip(placeholders, gm.meta["kiln_input_sources"], strict=True))
    output = next(iter(reversed(gm.graph.nodes)))
    parts = []
    for i, nodes in enumerate(pieces):
        later = {n for p in pieces[i + 1 :] for n in p} | {output}
        parts.append(build_piece(gm, nodes, later, sources))
    runner = chain_graphs(gm, parts, backend)
    gm.meta["ddp_bucket_graphs"] = [p.gm for p in parts]
    log.info(
        "graph split into %d graphs at DistributedDataParallel's gradient buckets:\n%s",
        len(parts),
        runner.__kiln_source__,
    )
    return runner


def build_piece(gm, nodes: list, later: set, sources: dict) -> Piece:
    """A graph of ``nodes``: placeholders for what it reads from outside (the whole graph's
    inputs in their order, then values made by earlier pieces), outputs for what is read
    after it."""
    inside = set(nodes)
    reads = []
    for node in nodes:
        for arg in node.all_input_nodes:
            if arg not in inside and arg not in reads:
                reads.append(arg)
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    reads.sort(key=lambda n: (n.op != "placeholder", order[n]))
    graph = torch.fx.Graph()
    env = {}
    for node in reads:
        env[node] = graph.placeholder(node.name)
        env[node].meta = dict(node.meta)
    for node in nodes:
        env[node] = graph.node_copy(node, lambda n: env[n])
    outputs = [n for n in nodes if any(u in later for u in n.users)]
    graph.output(tuple(env[n] for n in outputs))
    piece_gm = torch.fx.GraphModule(gm, graph, class_name="BucketGraph")
    piece_gm.meta = {**gm.meta, "kiln_input_sources": [sources.get(n) for n in reads]}
    return Piece(piece_gm, reads, outputs)


def chain_graphs(gm, parts: list[Piece], backend) -> Callable:
    """The whole graph as calls of the pieces, one after another: a function generated as
    source (``__kiln_source__``), its pieces named ``bucket_graph_<i>``."""
    inputs = [n.name for n in gm.graph.find_nodes(op="placeholder")]
    lines = [f"def bucketed_graphs({', '.join(inputs)}):"]
    for i, part in enumerate(parts):
        args = "".join(f"{n.name}, " for n in part.inputs)
        outs = "".join(f"{n.name}, " for n in part.outputs)
        lines.append(f"    ({outs}) = bucket_graph_{i}({args})")
    output = next(iter(reversed(gm.graph.nodes)))
    returned = "".join(f"{n.name}, " for n in output.args[0])
    lines.append(f"    return ({returned})")
    source = "\n".join(lines) + "\n"
    scope: dict = {}
    for i, part in enumerate(parts):
        scope[f"bucket_graph_{i}"] = compile_at_first_call(
            scope, f"bucket_graph_{i}", part.gm, backend
        )
    exec(compile(source, "<kiln bucketed graphs>", "exec"), scope)
    function = scope["bucketed_graphs"]
    function.__kiln_source__ = source
    return function


def compile_at_first_call(scope: dict, name: str, gm: torch.fx.GraphModule, backend) -> Callable:
    """A stand-in for ``scope[name]`` that compiles ``gm`` on the arguments of its first
    call and puts the compiled function in its place."""

    def first_call(*args):
        compiled = backend(gm, list(args))
        if compiled is None:
            raise RuntimeError(f"the backend returned None for {name} instead of a callable")
        scope[name] = compiled
        return compiled(*args)

    return first_call
