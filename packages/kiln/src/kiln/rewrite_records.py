"""Warm starts skip the rewrites: an aten graph's rewritten form, kept by the graph's key.

:class:`kiln.pipeline.AtenCompiler` rewrites each aten graph before lowering it (padded
products, GELU epilogues, convolutions as products, merged products, the frozen state,
...). Some rewrites run ops on fake tensors at every match (folding a batch norm into its
convolution runs six), others read decisions timed on the device: on a warm start they
cost more than loading the compiled graph (ResNet-50's inference graph, 53 batch norms
folded, spent half its warm compile there). What they made is kept as a kiln-autograd
record (:func:`kiln_autograd.encode_graphs`: the rewritten graph, the frozen state's graph
and what says how the two fit), ``<root>/graphs/<key[:2]>/<key>.rewrites`` beside the graph
entries, written, checked and evicted as they are.

The key is the graph's own cache key before the rewrites (its code, constants, the inputs'
metadata, the code settings with ``freezing``, the code generator, the versions) with what
else decides the rewrites: the graph's kind and the device (a CUDA device's name and
capability, and cuDNN's version: the timed decisions were taken there). Graphs with
symbolic sizes keep no record. A later compile of the same
graph reads the record instead of rewriting, where the compiled graph it leads to is in
the graph cache (a record whose compiled graph was evicted is rewritten again). A graph
the record cannot describe (kiln-autograd's ``Unserializable``) is rewritten every time.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.fx

import kiln_autograd
from kiln.cache import REWRITES_SUFFIX, GraphCache, graph_key
from kiln.freezing import FrozenGraph

FORMAT = 1
log = logging.getLogger("kiln.cache")


@dataclasses.dataclass
class Rewritten:
    """What the rewrites made of a graph: the graph that is lowered, its example inputs
    (the original ones, then the frozen values'), and the frozen state (or None)."""

    graph: torch.fx.GraphModule
    example_inputs: list[object]
    frozen: FrozenGraph | None


class RewriteRecords:
    """Rewritten graphs under the cache root, by the key of the graph they were made from."""

    def __init__(self, root: Path) -> None:
        self.files = GraphCache(root)

    def path(self, key: str) -> Path:
        return self.files.root / key[:2] / f"{key}{REWRITES_SUFFIX}"

    def load(
        self, key: str, original: torch.fx.GraphModule, example_inputs: Sequence[object]
    ) -> Rewritten | None:
        """The kept rewrite of ``original``, the graph of ``key``, for ``example_inputs``
        (None: none kept, or one that does not load, logged)."""
        data = self.files.read(self.path(key))
        if data is None:
            return None
        try:
            graphs, info = kiln_autograd.decode_graphs(data)
            if info.get("format") != FORMAT:
                raise ValueError("it was written in another format")
            return _rewritten(graphs, info, original, example_inputs)
        except Exception as exc:  # a damaged record is never used: rewrite and store again
            log.warning("ignoring rewrite record %s (%s); rewriting", self.path(key), exc)
            return None

    def store(
        self, key: str, original: torch.fx.GraphModule, example_inputs, made: Rewritten
    ) -> None:
        """Keep ``made``, what the rewrites made of ``original`` (nothing where a graph
        holds what a record cannot describe)."""
        try:
            graphs, info = _describe(original, example_inputs, made)
            data = kiln_autograd.encode_graphs(graphs, info)
        except kiln_autograd.Unserializable as why:
            log.debug("rewrites not kept: %s", why)
            return
        self.files.write(self.path(key), data)


def rewrite_key(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[object],
    codegen: object,
    settings: dict[str, object],
    kind: str,
    device: torch.device,
) -> str | None:
    """The record key of rewriting ``gm`` for ``example_inputs`` (None for symbolic sizes,
    which a record cannot describe, or a graph the cache key cannot)."""
    if any(map(_symbolic, example_inputs)):
        return None
    try:
        key = graph_key(gm, example_inputs, codegen, settings)
    except Exception:  # noqa: BLE001 - the graph is rewritten, just not kept
        log.debug("no rewrite record: no cache key", exc_info=True)
        return None
    parts = [f"rewrites {FORMAT}", key, kind, _device(device)]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def _symbolic(value: object) -> bool:
    if isinstance(value, torch.SymInt):
        return True
    if not isinstance(value, torch.Tensor):
        return False
    sizes = (*value.shape, *value.stride(), value.storage_offset())
    return any(isinstance(size, torch.SymInt) for size in sizes)


def _device(device: torch.device) -> str:
    if device.type != "cuda":
        return device.type
    properties = torch.cuda.get_device_properties(device)
    capability = f"{properties.major}.{properties.minor}"
    return f"cuda {properties.name} {capability} cudnn {torch.backends.cudnn.version()}"


def _describe(original, example_inputs, made: Rewritten) -> tuple[dict, dict]:
    """The record's graphs and data: nothing but a mark where the rewrites changed nothing."""
    info: dict = {"format": FORMAT, "inputs": len(example_inputs)}
    if made.graph is original:
        return {}, {**info, "unchanged": True}
    kept = made.example_inputs[: len(example_inputs)]
    if len(kept) != len(example_inputs) or any(
        a is not b for a, b in zip(kept, example_inputs, strict=True)
    ):
        raise kiln_autograd.Unserializable("the rewrites changed the graph's first inputs")
    graphs = {"graph": made.graph}
    frozen = made.frozen
    if frozen is not None:
        graphs["state"] = frozen.state_graph
        info["frozen"] = {
            "state": list(frozen.state),
            "folded_batch_norms": frozen.folded_batch_norms,
            "laid_out_weights": frozen.laid_out_weights,
        }
    return graphs, info


def _rewritten(graphs: dict, info: dict, original, example_inputs) -> Rewritten:
    if info["inputs"] != len(example_inputs):
        raise ValueError(f"it was made for {info['inputs']} inputs, not {len(example_inputs)}")
    if info.get("unchanged"):
        return Rewritten(original, list(example_inputs), None)
    graph = graphs["graph"]
    placeholders = list(graph.graph.find_nodes(op="placeholder"))
    extra = [p.meta["val"] for p in placeholders[len(example_inputs) :]]
    inputs = [*example_inputs, *extra]
    frozen = None
    if "frozen" in info:
        about = info["frozen"]
        frozen = FrozenGraph(
            graph=graph,
            example_inputs=inputs,
            state_graph=graphs["state"],
            state=tuple(about["state"]),
            folded_batch_norms=about["folded_batch_norms"],
            laid_out_weights=about["laid_out_weights"],
        )
    return Rewritten(graph, inputs, frozen)
