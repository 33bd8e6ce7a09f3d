"""Captures kept across processes: a warm start checks a frame's kept guards and restores its
compiled graph, instead of tracing its bytecode again.

``capture(..., kept=store)`` takes an object with ``load(key) -> bytes | None``,
``store(key, data)`` and ``restore(token, fn) -> callable | None`` (:class:`CaptureStore`). A
capture is kept where its frame calls one graph and returns (no graph break), its sizes are
static, and the backend said how to restore its compiled graph: ``gm.meta["restore_token"]``,
a string the backend's ``restore`` turns back into the compiled callable in another process
(None where it cannot: the frame is then traced as before).

What is kept of an entry, by the frame's key (the code object's bytes, its file and name,
the versions and the caller's settings):

- the guard: its lines, the constants they name (written by name, :mod:`kiln_capture.by_name`)
  and the sources they read; the parameters' checks are rebuilt from their specs;
- what runs when it passes: the graph's inputs as expressions and either the output the
  frame returns or the epilogue (the transformed code after the graph call, as code);
- the files of every function the trace ran, with a digest of each: a kept capture whose
  files changed since (an edited model, another library version) is not used.

On a miss with no entry of its own, a captured function tries the kept entries of its key
that it has not restored yet, newest first: the first whose files are unchanged and whose
guard passes for the call becomes its entry, as a capture would. Anything that does not
load (a name that is gone, a damaged record) is skipped, with a DEBUG log line.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import re
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from kiln_capture import by_name
from kiln_capture.__about__ import __version__
from kiln_capture.codegen import function_over
from kiln_capture.guards import (
    GuardFunction,
    GuardSet,
    bound_arguments,
    build_guard_function,
    fixed_scope,
    parameter_list,
)

log = logging.getLogger("kiln.capture")

FORMAT = 1
MAX_ENTRIES = 8  # kept per frame key, newest first (a frame's recompile limit, by default)
# names a built guard adds to its capture's scope: the defaults, the tensor matcher
BUILT_NAMES = re.compile(r"___d\d+|___tensors_match")


class CaptureStore(Protocol):
    """Where kept captures lie (bytes by key), and the backend's restore."""

    def load(self, key: str) -> bytes | None: ...

    def store(self, key: str, data: bytes) -> None: ...

    def restore(self, token: str, fn: Callable) -> Callable | None:
        """The compiled graph of a kept capture of ``fn`` (None: trace instead)."""


def frame_key(fn: types.FunctionType, settings: str) -> str | None:
    """The key of ``fn``'s kept captures: its code object (instructions, names, constants,
    nested code, place), the versions and the caller's ``settings``; None for code whose
    constants cannot be written (made at run time)."""
    code = fn.__code__
    h = hashlib.sha256()
    for part in (
        f"kept capture {FORMAT} kiln-capture {__version__} torch {torch.__version__}",
        f"python {sys.version}",
        settings,
        f"{code.co_filename}:{code.co_firstlineno} {code.co_qualname}",
    ):
        h.update(part.encode() + b"\0")
    try:
        _code_digest(code, h)
    except ValueError:
        return None
    return h.hexdigest()


def _code_digest(code: types.CodeType, h) -> None:
    """Feed ``code`` to ``h``: what it does and where, its nested code the same way.
    (``marshal``'s bytes would not do: they mark an object shared where its reference
    count says so, which changes while the program runs.)"""
    for attr in ("co_code", "co_linetable", "co_exceptiontable"):
        h.update(getattr(code, attr, b"") + b"\0")
    for attr in ("co_names", "co_varnames", "co_freevars", "co_cellvars"):
        h.update(repr(getattr(code, attr)).encode() + b"\0")
    numbers = (code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount, code.co_flags)
    h.update(f"{numbers} {code.co_name} {code.co_firstlineno}".encode())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            h.update(b"code\0")
            _code_digest(const, h)
        else:
            h.update(_constant_text(const).encode() + b"\0")


_PLAIN = (type(None), bool, int, float, complex, str, bytes, type(Ellipsis))


def _constant_text(value: object) -> str:
    """A code constant as text that is the same in every process (a frozenset's items
    sorted: their order follows the string hash seed)."""
    if isinstance(value, tuple):
        return f"({','.join(map(_constant_text, value))})"
    if isinstance(value, frozenset):
        return f"frozenset({','.join(sorted(map(_constant_text, value)))})"
    if type(value) in _PLAIN:
        return f"{type(value).__name__}:{value!r}"
    raise ValueError(f"a constant of type {type(value).__name__}")


def files_read(output) -> dict[str, str] | None:
    """The files of the functions the trace ran, each with its digest; None where one is
    not a file (code made by ``exec``, a notebook cell): such a capture is not kept."""
    found = {}
    for name in sorted(output.traced_files):
        digest = file_digest(name)
        if digest is None:
            return None
        found[name] = digest
    return found


_digests: dict[tuple, str] = {}


def file_digest(path: str) -> str | None:
    """The sha256 of a file's contents (None where it cannot be read), computed once per
    file version (path, size, modification time) in a process. The standard library's
    frozen modules are part of the interpreter (its version is in the key)."""
    if path.startswith("<frozen ") and path.endswith(">"):
        return "frozen"
    try:
        info = os.stat(path)
    except OSError:
        return None
    version = (path, info.st_size, info.st_mtime_ns)
    if version not in _digests:
        try:
            with open(path, "rb") as f:
                _digests[version] = hashlib.sha256(f.read()).hexdigest()
        except OSError:
            return None
    return _digests[version]


def keepable_parts(output, gm) -> dict | None:
    """What a kept capture needs beyond the result (the files, the backend's token), or
    None where the capture cannot be kept: no graph, a graph with symbolic sizes, no token."""
    token = gm.meta.get("restore_token") if gm is not None else None
    if not isinstance(token, str) or output.symbolic_inputs:
        return None
    files = files_read(output)
    return None if files is None else {"files": files, "token": token}


# --- keeping ---------------------------------------------------------------------------


def encode_entry(fn, result) -> bytes | None:
    """The kept form of a capture ``result`` of ``fn``; None where it cannot be kept
    (logged at DEBUG)."""
    parts = result.keep
    found = result.direct or result.after_graph
    if parts is None or found is None or result.graph_break is not None or result.resumes:
        return None
    guard = result.guard
    fixed = fixed_scope(None, None)
    scope = {
        name: value
        for name, value in guard.scope.items()
        if name not in fixed and not BUILT_NAMES.fullmatch(name)
    }
    _, expressions, then = found
    action = ("direct", then) if result.direct is not None else ("epilogue", None)
    try:
        if action[0] == "epilogue":
            action = ("epilogue", by_name.dump_code(then.__code__))
        return by_name.dumps(
            {
                "lines": guard.lines,
                "scope": scope,
                "sources": guard.sources,
                "inputs": list(expressions),
                "action": action,
                "files": parts["files"],
                "token": parts["token"],
            }
        )
    except by_name.Unkeepable as why:
        log.debug("capture of %s not kept: %s", fn.__qualname__, why)
        return None


def add_entry(store: CaptureStore, key: str, entry: bytes) -> None:
    """Keep ``entry`` under ``key``, newest first (an equal entry kept once, the oldest
    dropped past :data:`MAX_ENTRIES`)."""
    entries = [e for e in read_entries(store, key) if e != entry]
    store.store(key, by_name.dumps([entry, *entries][:MAX_ENTRIES]))


def read_entries(store: CaptureStore, key: str) -> list[bytes]:
    data = store.load(key)
    if data is None:
        return []
    try:
        entries = by_name.loads(data)
    except Exception as exc:  # noqa: BLE001 - a damaged record is never used
        log.debug("kept captures %s do not load (%s: %s)", key, type(exc).__name__, exc)
        return []
    return [e for e in entries if isinstance(e, bytes)] if isinstance(entries, list) else []


# --- restoring -------------------------------------------------------------------------


@dataclass
class Restored:
    """A kept entry that passed its guard: the parts of a capture result."""

    guard: GuardFunction
    compiled: Callable
    inputs: list[str]
    direct: int | None  # the output the frame returns, or None: ``epilogue`` runs
    epilogue: types.FunctionType | None
    first_inputs: list


def restore(fn, entry: bytes, args, kwargs, store: CaptureStore) -> Restored | None:
    """The kept ``entry`` of ``fn`` where its files are unchanged, its guard passes for the
    call and the backend restores its graph; else None."""
    try:
        kept = by_name.loads(entry)
    except Exception as exc:  # noqa: BLE001 - a name that is gone: trace
        log.debug("a kept capture of %s does not load (%r)", fn.__qualname__, exc)
        return None
    if any(file_digest(path) != digest for path, digest in kept["files"].items()):
        return None
    guard, first_inputs = checked_guard(fn, kept, args, kwargs)
    if guard is None:
        return None
    compiled = store.restore(kept["token"], fn)
    if compiled is None:
        return None
    kind, then = kept["action"]
    epilogue = None
    if kind == "epilogue":
        epilogue = function_over(fn, by_name.load_code(then))
    direct = then if kind == "direct" else None
    return Restored(guard, compiled, kept["inputs"], direct, epilogue, first_inputs)


def checked_guard(fn, kept: dict, args, kwargs) -> tuple[GuardFunction | None, list]:
    """The kept guard, built for ``fn`` (its state tensors' matcher from the call's
    tensors), and the graph's inputs of the call; (None, []) where the call fails it."""
    guards = GuardSet(fn.__globals__, fn.__closure__)
    guards.lines = list(kept["lines"])
    guards.scope.update(kept["scope"])
    guards.sources = dict(kept["sources"])
    scope = dict(guards.scope)
    try:
        frame_locals = bound_arguments(parameter_list(fn, scope), scope, args, kwargs)
        tensors = [line.tensor.expr for line in guards.lines if line.tensor is not None]
        guards.examples = {e: eval(e, scope, frame_locals) for e in tensors}  # noqa: S307
        if not all(isinstance(t, torch.Tensor) for t in guards.examples.values()):
            return None, []
        guard = build_guard_function(fn, guards)
        if not guard.check(*args, **kwargs):
            return None, []
        inputs = [eval(e, scope, frame_locals) for e in kept["inputs"]]  # noqa: S307
    except Exception as exc:  # noqa: BLE001 - a read that fails: the call does not match
        log.debug("a kept guard of %s does not apply (%r)", fn.__qualname__, exc)
        return None, []
    return guard, inputs


def as_result(fn, restored: Restored):
    """A restored entry as the capture result a trace would have made."""
    from kiln_capture.convert_frame import CaptureResult

    if restored.direct is not None:
        direct, after_graph = (restored.compiled, restored.inputs, restored.direct), None
    else:
        direct, after_graph = None, (restored.compiled, restored.inputs, restored.epilogue)
    return CaptureResult(
        functools.partial(restored_function, fn, restored),
        restored.guard,
        None,
        direct=direct,
        after_graph=after_graph,
        first_inputs=restored.first_inputs,
        restored=True,
    )


def restored_function(fn, restored: Restored) -> types.FunctionType:
    """The transformed function of a restored entry: the graph on the inputs the guard
    reads, then the returned output or the epilogue (where the dispatcher does not call
    the graph itself)."""
    from kiln_capture.dispatch import read_signature

    scope = dict(restored.guard.scope)
    params = parameter_list(fn, scope)
    call = f"___graph({', '.join(restored.inputs)})"
    if restored.direct is not None:
        body = f"{call}[{restored.direct}]"
    else:
        body = f"___epilogue({call}, {read_signature(fn, bound=False).call_args()})"
    scope.update(___graph=restored.compiled, ___epilogue=restored.epilogue)
    source = f"def restored({params}):\n    return {body}\n"
    exec(compile(source, f"<kiln restored {fn.__qualname__}>", "exec"), scope)  # noqa: S102
    return scope["restored"]
