"""``kiln.compile`` and the calls around it: ``explain``, ``reset``, ``disable``."""

from __future__ import annotations

import functools
import types
import weakref
from collections.abc import Callable, Mapping

import torch

import kiln_capture
import kiln_loopir
from kiln import frames, runtime
from kiln.backends import Session
from kiln.capture_store import capture_store
from kiln.config import Config, make_config
from kiln.module import CompiledFunction, CompiledModule, DisabledRegion

# every compiled function and module alive, so that reset() can empty their caches
_compiled: weakref.WeakSet = weakref.WeakSet()


def compile(
    model: Callable | torch.nn.Module | None = None,
    *,
    backend: str | Callable = "auto",
    mode: str | None = None,
    dynamic: bool | None = None,
    fullgraph: bool = False,
    options: Mapping[str, object] | None = None,
    disable: bool = False,
):
    """Compile a function or ``nn.Module`` with Kiln; usable as a call or a decorator.

    - ``backend``: ``"auto"`` (the full stack with the installed code generator for the
      inputs' device), ``"kiln"`` (the full stack; no code generator for the device is an
      error), ``"aot_eager"`` (capture and kiln-autograd's aten graphs, run eagerly),
      ``"eager"`` (capture only), or a callable ``backend(gm, example_inputs) -> callable``
      (``torch.compile``'s backend contract).
    - ``mode``: ``None``/``"default"``, ``"reduce-overhead"`` (CUDA graphs through the
      ``kiln.runtime`` plug-in), ``"max-autotune"`` (wider autotuning where the code
      generator autotunes).
    - ``dynamic``: ``True`` makes every size symbolic, ``False`` never, ``None`` after a
      recompile caused by a size. ``fullgraph=True`` raises at a graph break.
    - ``options``: see ``kiln.config.Options`` (``debug_dir``, ``cache``, ``cache_dir``,
      ``codegen``, ``partitioner``, ``fusion``, ``reuse_memory``, ``fallback``,
      ``recompile_limit``).
    - ``disable=True`` returns ``model`` unchanged.

    A module gives back a :class:`~kiln.module.CompiledModule` that behaves like the model
    (attributes, ``parameters()``, ``train()``/``eval()``, ``state_dict()`` with the model's
    own keys); a function gives back a :class:`~kiln.module.CompiledFunction`.
    """
    config = make_config(backend, mode, dynamic, fullgraph, options)
    if model is None:
        return lambda fn: _compile(fn, config, disable)
    return _compile(model, config, disable)


def _compile(model, config: Config, disable: bool):
    if disable:
        return model
    _start_host_runtime()
    _prepare_gpu_codegen(config)
    if isinstance(model, (CompiledModule, CompiledFunction)):
        model = _original(model)
    if isinstance(model, torch.nn.Module):
        compiled = CompiledModule(model, *_capture(model, config))
    elif callable(model):
        compiled = CompiledFunction(model, *_capture(model, config))
    else:
        raise TypeError(
            f"kiln.compile() takes a function or an nn.Module, got {type(model).__name__}"
        )
    _compiled.add(compiled)
    return compiled


def _start_host_runtime() -> None:
    """kiln-cpp's host runtime (the tensor guards' matcher, native host programs) begins
    building now where the installation has none yet (about 15 s, once), so that the build
    overlaps the first call's capture and compile instead of adding to them."""
    from kiln_cpp.host import start_loading

    start_loading()


def _prepare_gpu_codegen(config: Config) -> None:
    """On a machine with CUDA, the code generator for it begins what its first compile
    will need (its ``prepare()``, where it has one: kiln-triton computes Triton's cache
    key in a thread), overlapping the first call's capture."""
    if config.backend not in ("auto", "kiln") or not torch.cuda.is_available():
        return  # no code generator runs (eager, aot_eager, a backend of the caller's)
    try:
        codegen = kiln_loopir.resolve_codegen(config.options.codegen, "cuda")
    except (RuntimeError, ValueError, TypeError):
        return  # none for CUDA: the first compile says so
    prepare = getattr(codegen, "prepare", None)
    if callable(prepare):
        prepare()


def _capturable(model):
    """What kiln-capture takes: a Python function, method, partial or module. Anything
    else callable (a builtin such as ``torch.tanh``, an object with ``__call__``) is called
    from a Python function, which is captured."""
    if isinstance(
        model, (types.FunctionType, types.MethodType, functools.partial, torch.nn.Module)
    ):
        return model

    def call(*args, **kwargs):
        return model(*args, **kwargs)

    functools.update_wrapper(call, model, updated=())
    return call


def _capture(model, config: Config):
    session = Session(config)
    captured = kiln_capture.capture(
        _capturable(model),
        session.backend,
        fullgraph=config.fullgraph,
        dynamic=config.dynamic,
        recompile_limit=config.options.recompile_limit,
        observer=session,
        kept=capture_store(config),
    )
    return session, captured


def _original(compiled):
    return compiled._orig_mod if isinstance(compiled, CompiledModule) else compiled._orig_fn


def explain(fn: Callable | torch.nn.Module, **options) -> Callable:
    """``kiln.explain(fn)(*args, **kwargs)``: what capture makes of one call — graphs, op
    counts, graph breaks with the user's source line, guards — as a printable report."""
    if isinstance(fn, (CompiledModule, CompiledFunction)):
        fn = _original(fn)
    return kiln_capture.explain(fn, **options)


def reset() -> None:
    """Forget every compiled graph: each compiled function and module captures again on
    its next call. Frame numbering, ``compile_times()`` and once-only warnings restart too.
    The on-disk cache is kept."""
    for compiled in list(_compiled):
        session, captured = _capture(_original(compiled), compiled._session.config)
        object.__setattr__(compiled, "_session", session)
        object.__setattr__(compiled, "_captured", captured)
    frames.reset_frames()
    runtime.reset_warnings()


def disable(fn: Callable | None = None):
    """Run without Kiln.

    - ``kiln.disable(compiled)`` gives back the original function or module;
    - ``@kiln.disable`` on a function: while it runs, every Kiln-compiled function and
      module it calls runs eagerly;
    - ``with kiln.disable():``: the same for a block.
    """
    if fn is None:
        return DisabledRegion()
    if isinstance(fn, (CompiledModule, CompiledFunction)):
        return _original(fn)
    if not callable(fn):
        raise TypeError(f"kiln.disable() takes a function, got {type(fn).__name__}")
    return DisabledRegion()(fn)
