"""The on-disk cache of compiled graphs.

An entry holds what kiln-loopir and the code generator made of one aten graph: the
kernels' sources, the host program, the graph's constant tensors and the printed loop IR.
Its key hashes the graph's code and constants, the inputs' metadata (dtype, device, size,
stride; a symbolic size by its symbol, with the symbol's range and guards, never by the
size it was traced at), the options that change the code, the code generator, and the
versions of Python, torch and every Kiln package (each with a digest of its sources). A
second process that compiles the same graph loads the entry and hands the sources to the
code generator, whose own cache holds the built kernels: nothing is lowered, scheduled or
compiled again. Beside the entries, kiln-autograd's signature records
(:mod:`kiln.signature_records`, ``<key>.record``) spare the second process tracing the aten
graphs too, and the rewrites' records (:mod:`kiln.rewrite_records`, ``<key>.rewrites``)
rewriting them.

Entries lie under ``<root>/graphs/`` (see :mod:`kiln.cache_folders` for the root and the
code generators' folders beside it) in folders private to the user. Entries are written
under a temporary name and renamed into place; each starts with the
SHA-256 of the rest. An entry that does not load (corrupt, truncated, from another format)
is ignored with a log line, compiled again and rewritten.

The entries are bounded in size: ``$KILN_CACHE_MAX_MB`` (default 4096 MB; 0 for no bound).
A load sets an entry's access time; after each write, while the entries take more than the
bound, the least recently used ones are removed (never the one just written).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import io
import logging
import os
import platform
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import torch
import torch.fx

import kiln_autograd
from kiln.cache_folders import make_private
from kiln_loopir import HostProgram, load_host_program

log = logging.getLogger("kiln.cache")

FORMAT = 13  # 4: the native host program; 5: its runtime API 4 (arena, cuBLASLt products);
# 6: float32 attention in full float32; 7: no store in place before a reduction (memory
# plans of earlier formats could read a looped reduction's input after overwriting it);
# 8: no per-output store of a reduction kernel in place (split reductions with a loop
# after the reduction store it from one program while others read); 9: native host
# programs call ATen's generated out= overloads (a copy after the call) no more; 10:
# float powers without pow, producers inlined through strided views (kernels of format 9
# are slower, not wrong); 11: kiln-cpp's reduction loops merged where they are one run, its
# booleans read and written as bytes (kernels of format 10 are slower, not wrong); 12:
# native host programs on CUDA for graphs with symbolic sizes (format 11 ran them in Python);
# 13: no arena buffer is read by an op that takes a storage offset (as_strided_scatter read
# an arena temporary as if it started the arena: wrong results in format 12's programs)
_DISTRIBUTIONS = ("kiln", "kiln-capture", "kiln-autograd", "kiln-loopir")
DEFAULT_MAX_MB = 4096
# kiln-autograd's signature records (kiln.signature_records), the rewrites of aten graphs
# (kiln.rewrite_records) and kiln-capture's kept captures lie beside the entries
RECORD_SUFFIX = ".record"
REWRITES_SUFFIX = ".rewrites"
CAPTURE_SUFFIX = ".capture"  # kiln-capture's kept captures (kiln.capture_store)


def max_bytes() -> int | None:
    """The bound on the graph entries' size: ``$KILN_CACHE_MAX_MB`` megabytes (default
    4096), None for no bound (0)."""
    text = os.environ.get("KILN_CACHE_MAX_MB", "").strip()
    try:
        megabytes = float(text) if text else DEFAULT_MAX_MB
    except ValueError:
        log.warning("KILN_CACHE_MAX_MB=%r is not a number; using %d", text, DEFAULT_MAX_MB)
        megabytes = DEFAULT_MAX_MB
    return int(megabytes * 2**20) if megabytes > 0 else None


@dataclass
class Entry:
    """What one compiled aten graph needs to run again, and how it printed."""

    kernel_names: list[str]
    kernel_sources: list[str]
    host_source: str
    constants: dict[str, torch.Tensor]
    num_inputs: int
    loop_ir: str
    schedule: str
    native_host: dict | None = None  # the code generator's (its ``load_host`` reads it)

    def to_dict(self) -> dict:
        return {"format": FORMAT, **self.__dict__}


def _version(dist: str) -> str:
    """``dist``'s version and a digest of its Python sources: an entry made by edited code
    (a working tree installed editable, whose version does not change) is not loaded."""
    try:
        return f"{metadata.version(dist)} {_source_digest(dist.replace('-', '_'))}"
    except metadata.PackageNotFoundError:
        return "not installed"


@functools.cache
def _source_digest(package: str) -> str:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return "no sources"
    root = Path(next(iter(spec.submodule_search_locations)))
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


@functools.cache
def versions() -> str:
    """Python's, torch's and every Kiln package's version: what a cached artifact was made
    with."""
    kiln = " ".join(f"{d} {_version(d)}" for d in _DISTRIBUTIONS)
    return f"python {platform.python_version()} torch {torch.__version__} {kiln}"


def _codegen_version(codegen: object) -> str:
    module = type(codegen).__module__.split(".")[0]
    return f"{module} {_version(module.replace('_', '-'))}"


def _describe_value(value: object) -> str:
    """An input as the key sees it: a symbolic size by its symbol (``s0``), not by the size
    it had when the graph was traced, so that a graph compiled for a family of sizes is
    found again at any size of it (:func:`_symbol_facts` says which values it takes)."""
    if isinstance(value, torch.Tensor):

        def dims(xs) -> str:
            return ",".join(_describe_size(x) for x in xs)

        return (
            f"T({value.dtype},{value.device},[{dims(value.shape)}],[{dims(value.stride())}],"
            f"{_describe_size(value.storage_offset())})"
        )
    if isinstance(value, torch.SymInt):
        return f"SymInt({_describe_size(value)})"
    return f"{type(value).__name__}({value!r})"


def _describe_size(size: object) -> str:
    if isinstance(size, torch.SymInt):
        return f"sym:{size.node.expr}"  # never equal to a number's key: "sym:s0", "sym:4"
    return str(size)


def _symbol_facts(example_inputs: Sequence[object]) -> str:
    """What the inputs' ShapeEnv knows of their size symbols (the range of each, the guards
    on them): code generated for a family is only valid where those facts hold."""
    shape_env, symbols = None, set()
    for value in example_inputs:
        sizes: list[object] = []
        if isinstance(value, torch.Tensor):
            sizes = [*value.shape, *value.stride(), value.storage_offset()]
        elif isinstance(value, torch.SymInt):
            sizes = [value]
        for size in sizes:
            if isinstance(size, torch.SymInt):
                shape_env = size.node.shape_env
                symbols |= size.node.expr.free_symbols
    if not symbols:
        return "static sizes"
    ranges = [f"{s}:{shape_env.var_to_range.get(s)}" for s in sorted(symbols, key=str)]
    guards = sorted(
        str(g.expr) for g in shape_env.guards if g.expr.free_symbols & symbols
    )  # fmt: skip
    return f"symbolic sizes {' '.join(ranges)} guards {'; '.join(guards)}"


def _constant_digest(gm: torch.fx.GraphModule) -> str:
    h = hashlib.sha256()
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            value = getattr(gm, node.target)
            h.update(node.target.encode())
            if isinstance(value, torch.Tensor):
                h.update(_describe_value(value).encode())
                data = value.detach().cpu().contiguous().reshape(-1)  # 0-d too
                h.update(data.view(torch.uint8).numpy().tobytes())
            else:
                h.update(repr(value).encode())
    return h.hexdigest()


def graph_key(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[object],
    codegen: object,
    settings: dict[str, object],
) -> str:
    """The cache key of compiling ``gm`` for inputs like ``example_inputs``."""
    parts = [
        f"format {FORMAT}",
        kiln_autograd.graph_code(gm),  # gm.code, without generating a restored graph's
        _constant_digest(gm),
        *(_describe_value(x) for x in example_inputs),
        _symbol_facts(example_inputs),
        f"codegen {getattr(codegen, 'name', type(codegen).__name__)} {_codegen_version(codegen)}",
        *(f"{k}={v!r}" for k, v in sorted(settings.items())),
        versions(),
    ]
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


class GraphCache:
    """Entries under ``<root>/graphs/<key[:2]>/<key>.pt``."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root) / "graphs"

    def path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.pt"

    def load(self, key: str) -> Entry | None:
        payload = self.read(self.path(key))
        if payload is None:
            return None
        try:
            fields = torch.load(io.BytesIO(payload), weights_only=True)
            if fields.pop("format", None) != FORMAT:
                raise ValueError("it was written in another format")
            return Entry(**fields)
        except Exception as exc:  # a damaged entry is never used: compile and rewrite it
            log.warning(
                "ignoring corrupt cache entry %s (%s); compiling again", self.path(key), exc
            )
            return None

    def store(self, key: str, entry: Entry) -> None:
        buffer = io.BytesIO()
        torch.save(entry.to_dict(), buffer)
        self.write(self.path(key), buffer.getvalue())

    def read(self, path: Path) -> bytes | None:
        """The payload of the file at ``path`` (its access time set, for eviction); None
        where there is none or its checksum does not match (logged)."""
        try:
            data = path.read_bytes()
            os.utime(path)  # its last use, for eviction (mounts may not update atime)
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("cannot read cache entry %s (%s); compiling again", path, exc)
            return None
        digest, _, payload = data.partition(b"\n")
        if hashlib.sha256(payload).hexdigest().encode() != digest:
            log.warning(
                "ignoring corrupt cache entry %s (its checksum does not match its contents); "
                "compiling again",
                path,
            )
            return None
        return payload

    def write(self, path: Path, payload: bytes) -> None:
        """Write ``payload`` with its checksum under a temporary name, rename it to
        ``path``, then evict down to the size bound."""
        data = hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload
        try:
            make_private(path.parent)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except OSError as exc:  # a read-only or full disk costs speed, not correctness
            log.warning("cannot write cache entry %s (%s)", path, exc)
            return
        limit = max_bytes()
        if limit is not None:
            self.evict(limit, keep=path)

    def evict(self, limit: int, keep: Path | None = None) -> int:
        """Remove the least recently used entries (by access time) until the entries take
        ``limit`` bytes or less, never ``keep``; returns how many were removed."""
        found = []
        for path in [
            *self.root.glob("*/*.pt"),
            *self.root.glob(f"*/*{RECORD_SUFFIX}"),
            *self.root.glob(f"*/*{REWRITES_SUFFIX}"),
            *self.root.glob(f"*/*{CAPTURE_SUFFIX}"),
        ]:
            try:
                info = path.stat()
            except OSError:  # removed meanwhile
                continue
            found.append((info.st_atime, info.st_size, path))
        total = sum(size for _, size, _ in found)
        removed = 0
        for _, size, path in sorted(found, key=lambda f: f[0]):
            if total <= limit:
                break
            if path == keep:
                continue
            try:
                path.unlink()
            except OSError:
                continue
            total -= size
            removed += 1
        if removed:
            log.info(
                "evicted %d least recently used cache entries (bound %d MB)",
                removed,
                limit // 2**20,
            )
        return removed


def load_entry(entry: Entry, kernel_fns: Sequence[Callable], native=None) -> HostProgram:
    """A graph loaded from the cache: its host program bound to the kernels and constants
    (and the native one, built again from the entry, where there is one)."""
    program = load_host_program(
        entry.host_source,
        dict(zip(entry.kernel_names, kernel_fns, strict=True)),
        entry.constants,
        "<kiln host program (cached)>",
        native=getattr(native, "program", None),
    )
    return program
