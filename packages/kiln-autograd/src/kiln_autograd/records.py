"""A compiled signature's traced graphs as data, and the graphs rebuilt from that data.

A *record* holds what the runners of one input signature need (see
:mod:`kiln_autograd.runtime`): the :class:`GraphMeta`, the partition's counts and the
forward/backward (or inference) aten graphs; a compiler keeps graphs it made of its own
(:func:`encode_graphs`: named graphs and plain data about them). It is JSON, followed by
the graphs' constant tensors (``get_attr``) written with ``torch.save`` and read with
``torch.load(weights_only=True)``: nothing but data is ever read from a cache folder.

A graph is its nodes in order, each ``[op, name, target, args, kwargs, value]``: the
target as a qualified name (``torch.ops.aten.addmm.default``, ``operator.getitem``), the
arguments with node references by name and dtypes, devices, memory formats, layouts and
slices tagged, the value (``meta["val"]``) as a tensor spec (shape, stride, storage offset,
dtype, device, requires_grad). Rebuilt, each value is a FakeTensor of one fresh
FakeTensorMode, and the graph's code is the traced graph's, character for character (a
compiler's own cache, keyed by ``gm.code``, finds what it stored for the traced graph).
The record keeps that code too: :func:`graph_code` reads it without generating it.

:func:`encode` raises :class:`Unserializable` for anything it does not know (a target
that is not an operator overload or in :mod:`operator`, an argument of another type):
such a signature is traced every time.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import json
import operator
from collections.abc import Sequence

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx._lazy_graph_module import _LazyGraphModule

from kiln_autograd.analyze import GraphMeta, OutputInfo, OutputKind
from kiln_autograd.partition import PartitionedGraphs
from kiln_autograd.trace import JointGraph

FORMAT = 3  # 2: inference graphs note the state they only read (unwritten_state); 3: code
# gm.meta[RESTORED] is True on a graph rebuilt from a record (see is_restored)
RESTORED = "kiln_autograd_restored"
# gm.meta[KEPT_CODE] on a graph rebuilt from a record: (its graph's id and node count when
# rebuilt, the code the record kept) (see graph_code)
KEPT_CODE = "kiln_autograd_kept_code"


class Unserializable(ValueError):
    """A graph holds something a record cannot describe as data."""


def is_restored(gm: torch.fx.GraphModule) -> bool:
    """Whether ``gm`` was rebuilt from a cached record rather than traced: its nodes carry
    ``meta["val"]`` and nothing else (no stack traces, no source). A compiler that needs
    more, and cannot serve the graph from its own cache, raises
    :class:`~kiln_autograd.NeedsTrace`."""
    meta = getattr(gm, "meta", None)
    return isinstance(meta, dict) and bool(meta.get(RESTORED))


def graph_code(gm: torch.fx.GraphModule) -> str:
    """``gm.code``. A graph rebuilt from a record generates its code only where something
    asks for it: while its graph is the one rebuilt, with as many nodes, this is the
    traced graph's code that the record kept (the same text, as a cache key reads it)."""
    kept = gm.meta.get(KEPT_CODE)
    if kept is not None and kept[0] == id(gm.graph) and kept[1] == len(gm.graph.nodes):
        return kept[2]
    return gm.code


@dataclasses.dataclass
class Record:
    """One signature's graphs, rebuilt: ``graphs`` is ``{"inference": gm}`` or
    ``{"fw": gm, "bw": gm}`` with ``parts`` and ``joint`` for the training runner."""

    kind: str  # "inference" or "training"
    meta: GraphMeta
    graphs: dict[str, torch.fx.GraphModule]
    parts: PartitionedGraphs | None = None
    joint: JointGraph | None = None


# --- encoding ------------------------------------------------------------------------


def encode_inference(gm: torch.fx.GraphModule, meta: GraphMeta) -> bytes:
    """The record of an inference signature (raises :class:`Unserializable`)."""
    return _save(
        {
            "kind": "inference",
            "meta": _encode_meta(meta),
            "graphs": {"inference": _encode_graph(gm)},
        }
    )


def encode_training(parts: PartitionedGraphs, joint: JointGraph) -> bytes:
    """The record of a training signature (raises :class:`Unserializable`)."""
    return _save(
        {
            "kind": "training",
            "meta": _encode_meta(joint.meta),
            "graphs": {"fw": _encode_graph(parts.fw), "bw": _encode_graph(parts.bw)},
            "parts": {
                "num_fw_outputs": parts.num_fw_outputs,
                "num_saved_tensors": parts.num_saved_tensors,
                "num_saved_symints": parts.num_saved_symints,
                "grad_tangent_deps": [sorted(d) for d in parts.grad_tangent_deps],
            },
            "joint": {
                "num_inputs": joint.num_inputs,
                "num_tangents": joint.num_tangents,
                "grad_inputs": list(joint.grad_inputs),
            },
        }
    )


def encode_graphs(graphs: dict[str, torch.fx.GraphModule], info: dict) -> bytes:
    """Aten graphs by name and plain data about them (JSON: numbers, strings, lists,
    dicts), as a record of their own: what a compiler keeps of the graphs it made from a
    signature's graph (raises :class:`Unserializable`)."""
    encoded = {name: _encode_graph(gm) for name, gm in graphs.items()}
    return _save({"kind": "graphs", "info": info, "graphs": encoded})


def _save(record: dict) -> bytes:
    constants = {}
    for name, graph in record["graphs"].items():
        constants[name] = graph.pop("constants")
    text = json.dumps({"format": FORMAT, **record}, separators=(",", ":")).encode()
    buffer = io.BytesIO()
    if any(constants.values()):
        torch.save(constants, buffer)
    return len(text).to_bytes(8, "little") + text + buffer.getvalue()


def _encode_meta(meta: GraphMeta) -> dict:
    return {
        "outputs": [[o.kind.value, o.base, o.requires_grad, o.is_tensor] for o in meta.outputs],
        "returns_sequence": meta.returns_sequence,
        "mutated_inputs": list(meta.mutated_inputs),
        "mutated_requires_grad": list(meta.mutated_requires_grad),
        "base_sources": list(meta.base_sources),
        "base_requires_grad": list(meta.base_requires_grad),
    }


def _encode_graph(gm: torch.fx.GraphModule) -> dict:
    if type(gm.graph._codegen) is not torch.fx.graph.CodeGen:  # no pytree signature
        raise Unserializable(f"a graph with {type(gm.graph._codegen).__name__}")
    nodes, constants = [], {}
    for node in gm.graph.nodes:
        if node.type is not None:
            raise Unserializable(f"node {node.name} has a type annotation")
        if node.op == "get_attr":
            value = getattr(gm, node.target)
            if not isinstance(value, torch.Tensor) or type(value) not in (
                torch.Tensor,
                torch.nn.Parameter,
            ):
                raise Unserializable(f"attribute {node.target} is a {type(value).__name__}")
            constants[node.target] = value.detach().clone()
            target = node.target
        elif node.op == "call_function":
            target = _target_name(node.target)
        elif node.op in ("placeholder", "output"):
            target = node.target
        else:
            raise Unserializable(f"a {node.op} node")
        nodes.append(
            [
                node.op,
                node.name,
                target,
                _encode_value(node.args),
                _encode_value(node.kwargs),
                _encode_val(node.meta.get("val")),
            ]
        )
    meta = {k: _encode_value(v) for k, v in gm.meta.items() if k not in (RESTORED, KEPT_CODE)}
    return {"nodes": nodes, "constants": constants, "meta": meta, "code": graph_code(gm)}


def _target_name(target: object) -> str:
    if isinstance(target, torch._ops.OpOverload):
        schema = target._schema
        overload = schema.overload_name or "default"
        namespace, name = schema.name.split("::")
        return f"torch.ops.{namespace}.{name}.{overload}"
    if getattr(operator, getattr(target, "__name__", ""), None) is target:
        return f"operator.{target.__name__}"
    raise Unserializable(f"the target {target!r}")


def _encode_value(value: object) -> object:
    if value is None or type(value) in (bool, int, float, str):
        return value
    if isinstance(value, torch.fx.Node):
        return {"node": value.name}
    if type(value) is list:
        return [_encode_value(v) for v in value]
    if type(value) is tuple:
        return {"tuple": [_encode_value(v) for v in value]}
    if type(value) is dict and all(type(k) is str for k in value):
        return {"dict": {k: _encode_value(v) for k, v in value.items()}}
    if isinstance(value, torch.fx.immutable_collections.immutable_list):
        return [_encode_value(v) for v in value]
    if isinstance(value, torch.fx.immutable_collections.immutable_dict):
        return {"dict": {k: _encode_value(v) for k, v in value.items()}}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, torch.memory_format):
        return {"memory_format": str(value).removeprefix("torch.")}
    if isinstance(value, torch.layout):
        return {"layout": str(value).removeprefix("torch.")}
    if type(value) is slice:
        return {"slice": [_encode_value(v) for v in (value.start, value.stop, value.step)]}
    raise Unserializable(f"an argument {value!r} of type {type(value).__name__}")


def _encode_val(value: object) -> object:
    """A node's ``meta["val"]`` as data; None where it is none of the kinds kept."""
    if isinstance(value, torch.Tensor):
        return {"tensor": _tensor_spec(value)}
    if isinstance(value, (tuple, list)) and all(
        v is None or isinstance(v, torch.Tensor) for v in value
    ):
        specs = [None if v is None else _tensor_spec(v) for v in value]
        return {"tensors": specs, "list": isinstance(value, list)}
    if type(value) in (bool, int, float):
        return {"number": value}
    return None


def _tensor_spec(t: torch.Tensor) -> list:
    if t.layout is not torch.strided or any(
        isinstance(s, torch.SymInt) for s in (*t.shape, *t.stride(), t.storage_offset())
    ):
        raise Unserializable("a tensor with symbolic sizes or a layout other than strided")
    return [
        list(t.shape),
        list(t.stride()),
        int(t.storage_offset()),
        str(t.dtype).removeprefix("torch."),
        str(t.device),
        bool(t.requires_grad),
    ]


# --- decoding ------------------------------------------------------------------------


def decode(data: bytes) -> Record:
    """The record written by :func:`encode_inference` or :func:`encode_training`, its
    graphs rebuilt with FakeTensor values of one new FakeTensorMode."""
    record, constants = _load(data)
    if record.get("kind") not in ("inference", "training"):
        raise ValueError(f"it is a record of {record.get('kind')!r}, not of a signature")
    for name, graph in record["graphs"].items():
        graph["constants"] = constants.get(name, {})
    mode = FakeTensorMode()
    meta = _decode_meta(record["meta"])
    graphs = {name: _decode_graph(g, mode) for name, g in record["graphs"].items()}
    if record["kind"] == "inference":
        return Record("inference", meta, graphs)
    p, j = record["parts"], record["joint"]
    parts = PartitionedGraphs(
        fw=graphs["fw"],
        bw=graphs["bw"],
        num_fw_outputs=p["num_fw_outputs"],
        num_saved_tensors=p["num_saved_tensors"],
        num_saved_symints=p["num_saved_symints"],
        grad_tangent_deps=tuple(frozenset(d) for d in p["grad_tangent_deps"]),
    )
    joint = JointGraph(
        gm=None,  # not kept: the runner reads the joint graph's counts and meta only
        meta=meta,
        num_inputs=j["num_inputs"],
        num_tangents=j["num_tangents"],
        grad_inputs=tuple(j["grad_inputs"]),
    )
    return Record("training", meta, graphs, parts, joint)


def decode_graphs(data: bytes) -> tuple[dict[str, torch.fx.GraphModule], dict]:
    """The graphs and data written by :func:`encode_graphs`, the graphs' values FakeTensors
    of one new FakeTensorMode (raises ValueError for a record of another kind or format)."""
    record, constants = _load(data)
    if record.get("kind") != "graphs":
        raise ValueError(f"it is a record of {record.get('kind')!r}, not of graphs")
    mode = FakeTensorMode()
    graphs = {}
    for name, graph in record["graphs"].items():
        graph["constants"] = constants.get(name, {})
        graphs[name] = _decode_graph(graph, mode)
    return graphs, record["info"]


def _load(data: bytes) -> tuple[dict, dict]:
    """A record's JSON and its graphs' constant tensors (by graph name)."""
    size = int.from_bytes(data[:8], "little")
    record = json.loads(data[8 : 8 + size])
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise ValueError("it was written in another format")
    rest = data[8 + size :]
    constants = torch.load(io.BytesIO(rest), weights_only=True) if rest else {}
    return record, constants


def _decode_meta(m: dict) -> GraphMeta:
    return GraphMeta(
        outputs=tuple(
            OutputInfo(OutputKind(kind), base, rg, is_tensor)
            for kind, base, rg, is_tensor in m["outputs"]
        ),
        returns_sequence=m["returns_sequence"],
        mutated_inputs=tuple(m["mutated_inputs"]),
        mutated_requires_grad=tuple(m["mutated_requires_grad"]),
        base_sources=tuple(m["base_sources"]),
        base_requires_grad=tuple(m["base_requires_grad"]),
    )


def _decode_graph(data: dict, mode: FakeTensorMode) -> torch.fx.GraphModule:
    graph = torch.fx.Graph()
    env: dict[str, torch.fx.Node] = {}
    for op, name, target, args, kwargs, val in data["nodes"]:
        if op == "call_function":
            target = _resolve_target(target)
        node = graph.create_node(
            op, target, _decode_value(args, env), _decode_value(kwargs, env), name=name
        )
        if node.name != name:
            raise ValueError(f"node {name} was rebuilt as {node.name}")
        if val is not None:
            node.meta["val"] = _decode_val(val, mode)
        env[name] = node
    # its Python code is generated where something asks for it (graph_code does not)
    gm = _LazyGraphModule(dict(data["constants"]), graph)
    gm.meta.update({k: _decode_value(v, env) for k, v in data["meta"].items()})
    gm.meta[RESTORED] = True
    gm.meta[KEPT_CODE] = (id(graph), len(graph.nodes), data["code"])
    return gm


def _resolve_target(name: str) -> object:
    if name.startswith("operator."):
        return getattr(operator, name.removeprefix("operator."))
    prefix, namespace, op, overload = name.rsplit(".", 3)
    if prefix != "torch.ops":
        raise ValueError(f"unknown target {name}")
    return getattr(getattr(getattr(torch.ops, namespace), op), overload)


def _decode_value(value: object, env: dict[str, torch.fx.Node]) -> object:
    if isinstance(value, list):
        return [_decode_value(v, env) for v in value]
    if not isinstance(value, dict):
        return value
    ((tag, inner),) = value.items()
    if tag == "node":
        return env[inner]
    if tag == "tuple":
        return tuple(_decode_value(v, env) for v in inner)
    if tag == "dict":
        return {k: _decode_value(v, env) for k, v in inner.items()}
    if tag == "slice":
        return slice(*(_decode_value(v, env) for v in inner))
    if tag in ("dtype", "memory_format", "layout"):
        found = getattr(torch, inner)
        if not isinstance(found, (torch.dtype, torch.memory_format, torch.layout)):
            raise ValueError(f"unknown {tag} {inner}")
        return found
    if tag == "device":
        return torch.device(inner)
    raise ValueError(f"unknown tag {tag}")


def _decode_val(val: dict, mode: FakeTensorMode) -> object:
    if "tensor" in val:
        return _fake(val["tensor"], mode)
    if "tensors" in val:
        fakes = [None if s is None else _fake(s, mode) for s in val["tensors"]]
        return fakes if val["list"] else tuple(fakes)
    return val["number"]


def _fake(spec: Sequence, mode: FakeTensorMode) -> torch.Tensor:
    shape, stride, offset, dtype, device, requires_grad = spec
    dtype = getattr(torch, dtype)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {dtype}")
    # a meta tensor wrapped as a FakeTensor: no fake dispatch (a tenth of the time)
    if offset == 0:
        meta = torch.empty_strided(shape, stride, dtype=dtype, device="meta")
    else:
        extent = 1 + sum((n - 1) * s for n, s in zip(shape, stride, strict=True) if n)
        base = torch.empty(offset + extent, dtype=dtype, device="meta")
        meta = base.as_strided(shape, stride, offset)
    # made directly, not through the mode's converter: its memo of meta tensors (weak
    # references) serves a meta tensor converted twice, and each of these is new
    t = FakeTensor(mode, meta, _device(device))
    return t.requires_grad_(requires_grad) if requires_grad else t


@functools.lru_cache(maxsize=64)
def _device(name: str) -> torch.device:
    return torch.device(name)
