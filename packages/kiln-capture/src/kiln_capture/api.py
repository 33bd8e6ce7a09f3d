"""``capture()``: the cached, guarded wrapper around a function or module.

Each captured function keeps its cache entries, newest first; a call runs the first entry
whose guard passes. A miss captures again (a recompile), up to ``recompile_limit`` times,
then the function runs eagerly with one warning naming the guard that failed. Anything
capture cannot handle runs eagerly and is logged, never a wrong result.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import types
import warnings
from dataclasses import dataclass, field

import torch

from kiln_capture import kept_captures, versions
from kiln_capture.convert_frame import CaptureResult, convert_frame
from kiln_capture.dispatch import make_call, read_signature
from kiln_capture.dynamic_shapes import DynamicSizes
from kiln_capture.exc import CaptureFailed, Unsupported, UserError
from kiln_capture.module_calls import (
    call_with_attribute,
    compile_hooked_submodules,
    runs_wrapped_module,
)
from kiln_capture.user_frames import user_stacklevel
from kiln_capture.variables.objects import has_hooks

log = logging.getLogger("kiln.capture")


@contextlib.contextmanager
def collecting_new_objects_only():
    """Capture allocates many short-lived objects while the heap holds torch, the model and
    everything imported: each full collection in between walked all of it (a quarter of a
    12-layer BERT's capture). Objects that exist before capture are frozen (left out of
    collections) until it ends; what capture allocates is collected as usual. Where the
    program froze objects itself (``gc.freeze`` before a fork), unfreezing would undo that:
    collection is paused instead."""
    if not gc.isenabled():
        yield
    elif gc.get_freeze_count() == 0:
        gc.freeze()
        try:
            yield
        finally:
            gc.unfreeze()
    else:
        gc.disable()
        try:
            yield
        finally:
            gc.enable()


@dataclass
class CacheEntry:
    result: CaptureResult

    @property
    def guard(self):
        return self.result.guard

    @property
    def guard_source(self) -> str:
        return self.result.guard.source


@dataclass
class CaptureStats:
    compiles: int = 0
    # per recompile: every guard the call failed, with the value it had, in one line
    recompile_reasons: list[str] = field(default_factory=list)
    # per recompile: the failed guards one by one, and what was made symbolic
    recompile_failures: list[list[str]] = field(default_factory=list)
    made_dynamic: list[list[str]] = field(default_factory=list)
    eager_reason: str | None = None
    restored: int = 0  # entries restored from kept captures (kept_captures), not traced


class CapturedFunction:
    """A function (or module's forward) with its capture cache."""

    def __init__(
        self,
        fn,
        backend,
        *,
        fullgraph=False,
        dynamic=None,
        recompile_limit=8,
        bound_self=None,
        observer=None,
        kept=None,
    ):
        if not isinstance(fn, types.FunctionType):
            raise TypeError(
                f"capture() needs a Python function or an nn.Module, got "
                f"{type(fn).__name__}: wrap it in a function first"
            )
        if not callable(backend):
            raise TypeError(
                f"backend must be callable as backend(gm, example_inputs), got {backend!r}"
            )
        self.fn = fn
        # what runs when the function runs eagerly: ``fn`` itself, unless the observer's
        # on_eager puts something that behaves the same in its place (kiln: ``fn`` with the
        # functions it calls compiled, ``callees.with_redirected_globals``)
        self.eager_fn = fn
        self.backend = backend
        self.fullgraph = fullgraph
        self.dynamic = dynamic
        self.recompile_limit = recompile_limit
        self.bound_self = bound_self
        self.observer = observer
        # where captures are kept for later processes (kept_captures.CaptureStore), or None
        self.kept = kept
        self.kept_in_use: set[bytes] = set()  # kept entries this function has as entries
        self.entries: list[CacheEntry] = []
        self.dispatch: list = []  # capture results, newest first
        self.stats = CaptureStats()
        self.dynamic_sizes = DynamicSizes(dynamic)
        # functions called at graph breaks and resume functions, shared by the whole tree of
        # captures that starts here (resume functions are keyed by their code)
        self.callees: dict = {}
        # modules called at graph breaks (with hooks, or DDP), captured beneath: id -> module
        self.module_callees: dict[int, CapturedModule] = {}
        self.warned_limit = False
        self.warned_eager = False
        self.noted_hooks = False
        self.is_root = True  # not a resume function or a function called at a graph break
        functools.update_wrapper(self, fn)
        self.fast_call = read_signature(fn, bound=bound_self is not None) is not None
        if self.fast_call:  # a class of its own, whose __call__ is regenerated per cache entry
            self.__class__ = type(type(self).__name__, (type(self),), {})
            self.rebuild_dispatch()

    def __call__(self, *args, **kwargs):
        if self.bound_self is not None:
            args = (self.bound_self, *args)
        for result in self.dispatch:
            if result.guard.check(*args, **kwargs):
                return result.function(*args, **kwargs)
        return self.cache_miss(args, kwargs)

    def __get__(self, obj, objtype=None):
        return self if obj is None else types.MethodType(self, obj)

    # --- misses -----------------------------------------------------------------

    def cache_miss(self, args, kwargs):
        if self.stats.eager_reason is not None:
            return self.eager_fn(*args, **kwargs)
        failures = self.entries[0].result.guard.failures(*args, **kwargs) if self.entries else []
        if failures:
            if len(self.entries) >= self.recompile_limit:
                return self.over_limit(str(failures[0]), args, kwargs)
            self.note_recompile(failures)
        result = self.restore_kept(args, kwargs)
        try:
            with collecting_new_objects_only():
                result = result or convert_frame(
                    self.fn,
                    args,
                    kwargs,
                    self.backend,
                    fullgraph=self.fullgraph,
                    dynamic=self.dynamic_sizes,
                    wrap_callee=self.wrap_callee,
                )
        except Unsupported:
            raise
        except UserError as err:
            return self.run_raising(err, args, kwargs)
        except CaptureFailed as exc:
            return self.run_eagerly(exc.reason, args, kwargs)
        except Exception as exc:  # an internal failure must not change what the user sees
            if self.fullgraph:
                raise
            log.warning("capture of %s failed", self.fn.__qualname__, exc_info=True)
            return self.run_eagerly(
                f"internal error: {type(exc).__name__}: {exc}", args, kwargs, warn=True
            )
        self.entries.insert(0, CacheEntry(result))
        self.dispatch.insert(0, result)
        try:  # the guard's lines are compiled here first (its own function only if called)
            with collecting_new_objects_only():
                self.rebuild_dispatch()
        except Exception as exc:
            if self.fullgraph:
                raise
            del self.entries[0], self.dispatch[0]
            self.rebuild_dispatch()
            log.warning("capture of %s failed", self.fn.__qualname__, exc_info=True)
            return self.run_eagerly(
                f"internal error: {type(exc).__name__}: {exc}", args, kwargs, warn=True
            )
        if result.restored:
            self.stats.restored += 1
        else:
            self.stats.compiles += 1
            self.keep(result)
        if self.observer is not None:
            self.observer.on_capture(self, result)
        out = result.run_first(args, kwargs)
        if self.is_root:
            self.warn_if_nothing_compiled()
        return out

    def rebuild_dispatch(self) -> None:
        if self.fast_call:
            bound = self.bound_self is not None
            type(self).__call__ = make_call(self.fn, self, bound, self.entries)

    def dispatch_source(self) -> str:
        """The generated ``__call__`` (guards of every cache entry inlined), as source."""
        return getattr(type(self).__call__, "__kiln_source__", "")

    def run_raising(self, err: UserError, args, kwargs):
        """The trace saw the user's code raise: run it eagerly so it raises for real. If it
        does not raise, capture misjudged the code: it stays eager, with a warning."""
        result = self.fn(*args, **kwargs)
        reason = f"capture saw {err} but the function returned normally"
        self.stats.eager_reason = reason
        warnings.warn(
            f"kiln-capture runs {self.fn.__qualname__} eagerly: {reason}",
            RuntimeWarning,
            stacklevel=user_stacklevel(),
        )
        return result

    def run_eagerly(self, reason, args, kwargs, warn=False):
        """From now on the function runs eagerly, and says so once: here, or through the
        observer, whose ``on_eager`` returns True where it told the user itself."""
        self.stats.eager_reason = reason
        message = f"kiln-capture runs {self.fn.__qualname__} eagerly: {reason}"
        log.info(message)
        told = self.observer is not None and self.observer.on_eager(self, reason) is True
        if warn or not told:
            part = (
                ""
                if self.is_root
                else " (a part of a compiled call: what follows a graph break, or a function "
                "called at one; the other parts stay compiled)"
            )
            warnings.warn(
                f"{message}{part}; KILN_LOGS=graph_breaks (kiln) or the kiln.capture logger "
                "says more",
                RuntimeWarning,
                stacklevel=user_stacklevel(),
            )
        return self.eager_fn(*args, **kwargs)

    def warn_if_nothing_compiled(self) -> None:
        """Never a silent eager run: a call that broke the graph on something that depends
        on tensor data, and compiled no graph anywhere (its frame, the resume functions,
        functions called at the breaks), says so once."""
        if self.warned_eager:
            return
        modules = [m._captured for m in self.module_callees.values()]
        results = [e.result for c in [self, *self.callees.values(), *modules] for e in c.entries]
        if any(r.graph is not None for r in results):
            return
        found = next(
            (r.graph_break for r in results if r.graph_break and r.graph_break.data_dependent),
            None,
        )
        if found is None:
            return
        self.warned_eager = True
        warnings.warn(
            f"kiln-capture runs {self.fn.__qualname__} eagerly: {found.reason} (at "
            f"{found.where}) and nothing else in it makes a graph. An op whose output size "
            "depends on the data (nonzero, masked_select, x[mask], unique) or a value read "
            "out of a tensor (.item(), .tolist()) runs outside graphs: keep sizes fixed "
            "(torch.where(mask, x, 0) instead of x[mask]), keep numbers as tensors, or "
            "compile the code that uses the result",
            RuntimeWarning,
            stacklevel=user_stacklevel(),
        )

    def over_limit(self, failed, args, kwargs):
        if not self.warned_limit:
            self.warned_limit = True
            warnings.warn(
                f"kiln-capture: {self.fn.__qualname__} reached its recompile limit "
                f"({self.recompile_limit}); the last guard to fail was: {failed}. It now runs "
                f"eagerly for inputs no cached capture accepts.",
                RuntimeWarning,
                stacklevel=user_stacklevel(),
            )
        return self.fn(*args, **kwargs)

    # --- captures kept across processes (kept_captures) -------------------------------

    @functools.cached_property
    def kept_key(self) -> str | None:
        """The key of this function's kept captures (its code and settings), read once."""
        settings = f"fullgraph {self.fullgraph} dynamic {self.dynamic}"
        return kept_captures.frame_key(self.fn, settings)

    def restore_kept(self, args, kwargs) -> CaptureResult | None:
        """A kept capture of this function that accepts the call, as a capture result."""
        key = self.kept_key if self.kept is not None else None
        if key is None:
            return None
        for entry in kept_captures.read_entries(self.kept, key):
            if entry in self.kept_in_use:
                continue
            try:
                restored = kept_captures.restore(self.fn, entry, args, kwargs, self.kept)
            except Exception:  # noqa: BLE001 - a kept capture costs nothing when it fails
                name = self.fn.__qualname__
                log.debug("restoring a kept capture of %s failed", name, exc_info=True)
                continue
            if restored is not None:
                self.kept_in_use.add(entry)
                return kept_captures.as_result(self.fn, restored)
        return None

    def keep(self, result: CaptureResult) -> None:
        """Keep a capture for later processes, where it can be kept (a failure to keep it
        costs the next process a trace, never this call)."""
        try:
            key = self.kept_key if self.kept is not None else None
            entry = kept_captures.encode_entry(self.fn, result) if key is not None else None
            if entry is not None:
                kept_captures.add_entry(self.kept, key, entry)
                self.kept_in_use.add(entry)
        except Exception:  # noqa: BLE001
            name = self.fn.__qualname__
            log.debug("keeping the capture of %s failed", name, exc_info=True)

    # --- dynamic shapes ---------------------------------------------------------

    def note_recompile(self, failures) -> None:
        """Record every guard the call failed (with its old and new value) and make what
        changed symbolic: all changed sizes at once, not one recompile for each."""
        lines = [str(f) for f in failures]
        made = self.dynamic_sizes.note_failures(failures)
        self.stats.recompile_reasons.append("; ".join(lines))
        self.stats.recompile_failures.append(lines)
        self.stats.made_dynamic.append(made)
        log.info(
            "recompiling %s: %d guard(s) failed:\n    %s%s",
            self.fn.__qualname__,
            len(lines),
            "\n    ".join(lines),
            f"\n  now symbolic: {', '.join(made)}" if made else "",
        )

    # --- helpers ----------------------------------------------------------------

    def wrap_callee(self, fn):
        """Functions called at a graph break (and resume functions) are captured too; a
        module called there (with hooks, or DDP) runs its call with the forward beneath it
        captured (:class:`CapturedModule`)."""
        from kiln_capture.resume import RESUME_ORIGINS

        if isinstance(fn, torch.nn.Module):
            return self.wrap_module(fn).forward

        # a function made in a frame with nothing of its own (a comprehension): one per code
        plain = not (fn.__closure__ or fn.__defaults__ or fn.__kwdefaults__)
        made_in_frame = plain and "<locals>" in fn.__qualname__
        key = fn.__code__ if fn.__code__ in RESUME_ORIGINS or made_in_frame else id(fn)
        if key not in self.callees:
            callee = CapturedFunction(
                fn,
                self.backend,
                fullgraph=False,
                dynamic=self.dynamic,
                recompile_limit=self.recompile_limit,
                observer=self.observer,
            )
            callee.callees = self.callees
            callee.module_callees = self.module_callees
            callee.is_root = False
            callee._keep = fn
            self.callees[key] = callee
        return self.callees[key]

    def wrap_module(self, module: torch.nn.Module) -> CapturedModule:
        found = self.module_callees.get(id(module))
        if found is None or found._module is not module:
            found = capture(
                module,
                self.backend,
                dynamic=self.dynamic,
                recompile_limit=self.recompile_limit,
                observer=self.observer,
            )
            found._captured.callees = self.callees
            found._captured.module_callees = self.module_callees
            found._captured.is_root = False
            self.module_callees[id(module)] = found
        return found

    def cache_entries(self) -> list[CacheEntry]:
        return list(self.entries)


class CapturedModule(torch.nn.Module):
    """An ``nn.Module`` whose forward is captured; everything else is the module's own.

    A module with hooks runs them as nn.Module does, around the captured forward; a
    ``DistributedDataParallel`` runs as it is, around the module it wraps, captured
    (``wrapped``: :mod:`kiln_capture.module_calls`)."""

    def __init__(
        self,
        module: torch.nn.Module,
        captured: CapturedFunction,
        wrapped: CapturedModule | None = None,
    ):
        super().__init__()
        self._orig_mod = module
        self._captured = captured
        self.__dict__["_module"] = module  # the same, read without nn.Module's __getattr__
        self.__dict__["_wrapped"] = wrapped

    def forward(self, *args, **kwargs):
        module = self._module
        if self._wrapped is not None:
            inner, call = module.module, self._wrapped.forward
            return call_with_attribute(
                inner, "_compiled_call_impl", call, module._call_impl, args, kwargs
            )
        if has_hooks(module):
            self.note_hooks_once()
            return call_with_attribute(
                module, "forward", self._captured, module._call_impl, args, kwargs
            )
        return self._captured(*args, **kwargs)

    def note_hooks_once(self) -> None:
        if self._captured.noted_hooks:
            return
        self._captured.noted_hooks = True
        log.info(
            "%s has hooks: they run as nn.Module runs them, around the captured forward",
            type(self._module).__qualname__,
        )

    def __getattr__(self, name):
        if name in ("_orig_mod", "_captured", "_module"):
            return super().__getattr__(name)
        return getattr(self._orig_mod, name)

    # container modules (Sequential, ModuleList) keep their protocol
    def __getitem__(self, index):
        return self._orig_mod[index]

    def __len__(self):
        return len(self._orig_mod)

    def __iter__(self):
        return iter(self._orig_mod)


def capture(
    fn_or_module,
    backend,
    *,
    fullgraph: bool = False,
    dynamic: bool | None = None,
    recompile_limit: int = 8,
    observer=None,
    kept=None,
):
    """Capture ``fn_or_module`` into FX graphs compiled by ``backend``.

    Returns a callable with the same signature. ``backend(gm, example_inputs)`` gets each
    captured ``torch.fx.GraphModule`` (outputs a flat tuple) and returns a callable, the
    same contract as ``torch.compile(backend=...)``. With ``fullgraph=True`` a construct
    that would break the graph raises ``Unsupported`` instead.

    ``observer``, if given, hears of each compile: ``observer.on_capture(captured, result)``
    after a frame was captured and ``observer.on_eager(captured, reason)`` when one runs
    eagerly instead (``kiln.compile`` names its frames and counts its stages this way).

    ``kept``, if given, keeps captures for later processes and restores them
    (:class:`~kiln_capture.kept_captures.CaptureStore`): a warm start checks a kept guard
    instead of tracing the bytecode again.
    """
    if not versions.is_supported_version():
        raise RuntimeError(
            f"kiln-capture supports CPython 3.11 to 3.13, not {versions.PY[0]}.{versions.PY[1]}"
        )
    if isinstance(fn_or_module, torch.nn.Module) and runs_wrapped_module(fn_or_module):
        inner = capture(
            fn_or_module.module,
            backend,
            fullgraph=fullgraph,
            dynamic=dynamic,
            recompile_limit=recompile_limit,
            observer=observer,
            kept=kept,
        )
        return CapturedModule(fn_or_module, inner._captured, wrapped=inner)
    if isinstance(fn_or_module, torch.nn.Module):
        forward = type(fn_or_module).forward
        captured = CapturedFunction(
            forward,
            backend,
            fullgraph=fullgraph,
            dynamic=dynamic,
            recompile_limit=recompile_limit,
            observer=observer,
            bound_self=fn_or_module,
            kept=kept,
        )
        compile_hooked_submodules(
            fn_or_module,
            functools.partial(
                capture,
                backend=backend,
                dynamic=dynamic,
                recompile_limit=recompile_limit,
                observer=observer,
            ),
        )
        return CapturedModule(fn_or_module, captured)
    if isinstance(fn_or_module, functools.partial):
        inner = capture(
            fn_or_module.func,
            backend,
            fullgraph=fullgraph,
            dynamic=dynamic,
            recompile_limit=recompile_limit,
            observer=observer,
            kept=kept,
        )
        return functools.partial(inner, *fn_or_module.args, **fn_or_module.keywords)
    if isinstance(fn_or_module, types.MethodType):
        return CapturedFunction(
            fn_or_module.__func__,
            backend,
            fullgraph=fullgraph,
            dynamic=dynamic,
            recompile_limit=recompile_limit,
            observer=observer,
            bound_self=fn_or_module.__self__,
            kept=kept,
        )
    return CapturedFunction(
        fn_or_module,
        backend,
        fullgraph=fullgraph,
        dynamic=dynamic,
        recompile_limit=recompile_limit,
        observer=observer,
        kept=kept,
    )
