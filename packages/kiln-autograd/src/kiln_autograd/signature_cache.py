"""Warm starts: a compiled signature's record, stored by a key, and its runner rebuilt from it.

``aot(..., cache=...)`` takes an object with ``load(key) -> bytes | None`` and
``store(key, data)`` (:class:`SignatureCache`). :func:`signature_key` names everything
that decides what :func:`~kiln_autograd.api.compile_signature` makes for a signature: the
captured graph's code and its non-state attributes, the inputs' metadata, the grad mode,
the partitioner, the static inputs, the decompositions registered, torch's autocast and
default dtype, and the versions of torch and kiln-autograd. A traced signature stores its
record (:mod:`kiln_autograd.records`); a later compile with the same key rebuilds the runner
from the record without faking, analysing or tracing anything, and hands both graphs of a
training signature to the compilers at once.

Not cached (traced as before): dynamic shapes, a custom ``decompositions`` table, a module
that is not a ``torch.fx.GraphModule`` or has ``call_module`` nodes or hooks, inputs of a
kind the key cannot describe, and graphs the record cannot describe.
"""

from __future__ import annotations

import hashlib
import logging
import platform
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensor

from kiln_autograd import records
from kiln_autograd.__about__ import __version__
from kiln_autograd.decompositions import KILN_DECOMPOSITIONS
from kiln_autograd.errors import NeedsTrace
from kiln_autograd.lift import LiftedModule
from kiln_autograd.runtime import InferenceRunner, TrainingRunner, example_values

if TYPE_CHECKING:
    from kiln_autograd.api import Options

log = logging.getLogger("kiln_autograd")


class SignatureCache(Protocol):
    """Where records are kept: bytes by key (the key is a hex string)."""

    def load(self, key: str) -> bytes | None: ...

    def store(self, key: str, data: bytes) -> None: ...


class _NotCached(Exception):
    """What makes a signature's result depend on more than the key can name."""


def signature_key(
    lifted: LiftedModule,
    args: Sequence[object],
    requires_grad: Sequence[bool],
    grad_enabled: bool,
    options: Options,
    static_inputs: frozenset[int],
) -> str | None:
    """The record key of one signature, or None where it is not cached."""
    if options.cache is None:
        return None
    try:
        if options.dynamic:
            raise _NotCached("dynamic shapes")
        if options.decompositions is not None:
            raise _NotCached("a custom decomposition table")
        parts = [
            f"record {records.FORMAT} kiln-autograd {__version__} torch {torch.__version__}",
            f"python {platform.python_version()}",
            *_module_parts(lifted),
            *(_describe_arg(a, rg) for a, rg in zip(args, requires_grad, strict=True)),
            f"grad {grad_enabled} partitioner {options.partitioner}",
            f"static {sorted(static_inputs)}",
            _decompositions_digest(),
            _global_state(),
        ]
    except _NotCached as why:
        log.debug("signature not cached: %s", why)
        return None
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def _module_parts(lifted: LiftedModule) -> list[str]:
    gm = lifted.module
    if not isinstance(gm, torch.fx.GraphModule):
        raise _NotCached(f"a {type(gm).__name__}, not a GraphModule")
    if gm._forward_hooks or gm._forward_pre_hooks or _global_hooks():
        raise _NotCached("module hooks")
    parts = [gm.code, f"state {lifted.names} {lifted.num_params} {lifted.num_buffers}"]
    state = set(lifted.names)
    for node in gm.graph.nodes:
        if node.op == "call_module":
            raise _NotCached(f"a call_module node ({node.target})")
        if node.op == "get_attr" and node.target not in state:
            value = getattr(gm, node.target)
            if value is not None and type(value) not in (bool, int, float, str):
                raise _NotCached(f"attribute {node.target} of type {type(value).__name__}")
            parts.append(f"attr {node.target}={value!r}")
    return parts


def _global_hooks() -> bool:
    from torch.nn.modules import module

    return bool(module._global_forward_hooks or module._global_forward_pre_hooks)


def _describe_arg(value: object, requires_grad: bool) -> str:
    if isinstance(value, torch.Tensor):
        if type(value) not in (torch.Tensor, torch.nn.Parameter, FakeTensor):
            raise _NotCached(f"an input of type {type(value).__name__}")
        sizes = (*value.shape, *value.stride(), value.storage_offset())
        if any(isinstance(s, torch.SymInt) for s in sizes) or value.layout is not torch.strided:
            raise _NotCached("an input with symbolic sizes or a non-strided layout")
        return (
            f"T({value.dtype},{value.device},{tuple(value.shape)},{value.stride()},"
            f"{value.storage_offset()},{requires_grad},{value.is_conj()},{value.is_neg()})"
        )
    if value is None or type(value) in (bool, int, float, str):
        return f"{type(value).__name__}({value!r})"
    raise _NotCached(f"an input of type {type(value).__name__}")


_digests: dict[int, str] = {}


def _decompositions_digest() -> str:
    """Kiln's registered decompositions (torch's own follow torch's version)."""
    size = len(KILN_DECOMPOSITIONS)
    if size not in _digests:
        names = sorted(
            f"{op} {fn.__module__}.{fn.__qualname__}" for op, fn in KILN_DECOMPOSITIONS.items()
        )
        _digests.clear()
        _digests[size] = hashlib.sha256("\n".join(names).encode()).hexdigest()
    return _digests[size]


def _global_state() -> str:
    """torch's global settings that change what a trace records."""
    if torch._C._are_functorch_transforms_active():
        raise _NotCached("a functorch transform")
    autocast = [
        (d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in ("cpu", "cuda")
    ]
    return f"default dtype {torch.get_default_dtype()} autocast {autocast}"


def encode_record(key: str | None, encode, *what: object) -> bytes | None:
    """``encode(*what)``, the record to store under ``key`` once its graphs compiled; None
    without a cache, or for a graph the record cannot describe (logged at DEBUG). Encoded
    before the compilers run, which may rewrite a graph in place."""
    if key is None:
        return None
    try:
        return encode(*what)
    except records.Unserializable as why:
        log.debug("signature record not stored: %s", why)
        return None


def store_after(compiler: Callable, options: Options, key: str | None, data: bytes | None):
    """``compiler``, storing ``data`` under ``key`` once it compiled its graph: a record
    stands for graphs the compilers have (a training signature's once its backward,
    compiled at the first backward, is), so a later process restores all of them."""
    if key is None or data is None:
        return compiler

    def compile_then_store(gm: torch.fx.GraphModule, example_inputs: list[object]):
        compiled = compiler(gm, example_inputs)
        options.cache.store(key, data)
        return compiled

    return compile_then_store


def restore_runner(options: Options, key: str | None) -> InferenceRunner | TrainingRunner | None:
    """The runner of the record stored under ``key``, its graphs compiled now (both of a
    training signature); None where there is none, it does not load (logged), or a
    compiler raised :class:`NeedsTrace`."""
    if key is None:
        return None
    data = options.cache.load(key)
    if data is None:
        return None
    try:
        record = records.decode(data)
    except Exception as exc:  # a damaged record is never used: trace and store again
        log.warning("ignoring signature record %s (%s: %s); tracing", key, type(exc).__name__, exc)
        return None
    try:
        if record.kind == "inference":
            gm = record.graphs["inference"]
            return InferenceRunner(options.fw_compiler(gm, example_values(gm)), record.meta)
        fw, bw = record.parts.fw, record.parts.bw
        compiled_fw = options.fw_compiler(fw, example_values(fw))
        compiled_bw = options.bw_compiler(bw, example_values(bw))
    except NeedsTrace as exc:
        log.debug("signature record %s: a compiler needs the traced graphs (%s)", key, exc)
        return None
    return TrainingRunner(compiled_fw, record.parts, record.joint, compiled_bw=compiled_bw)
