"""What one ``kiln.compile`` call asked for: the backend, the mode and the options.

Options are checked here, once, so a misspelt option or a bad value fails at the
``kiln.compile`` call with a message naming it, not at the first compile.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from kiln.cache_folders import default_root

NAMED_BACKENDS = ("auto", "kiln", "aot_eager", "eager")
MODES = (None, "default", "reduce-overhead", "max-autotune")
PARTITIONERS = ("min_cut", "default")
HOST_PROGRAMS = ("auto", "python", "native")


@dataclasses.dataclass(frozen=True)
class Options:
    """The ``options=`` of ``kiln.compile``; every field can be given by name in the dict."""

    # where every stage of every compiled frame is written (default: $KILN_DEBUG)
    debug_dir: str | None = None
    # the on-disk cache of compiled graphs (default: on, unless $KILN_CACHE=0)
    cache: bool = True
    # the root of every cache (graphs; the code generators' libraries and kernels under
    # it unless their own variable is set): default $KILN_CACHE_DIR, else
    # $XDG_CACHE_HOME/kiln, else ~/.cache/kiln. A root others can write to is refused
    cache_dir: str | None = None
    # a code generator by name ("cpp", "triton", "reference"), or None for the device's
    codegen: str | None = None
    # kiln-autograd's partitioner: "min_cut" or "default"
    partitioner: str = "min_cut"
    # kiln-loopir: fuse kernels, reuse buffers
    fusion: bool = True
    reuse_memory: bool = True
    # a graph whose code generation fails runs its aten graph eagerly, with a warning;
    # False raises the error instead (kiln-capture runs a frame whose backend raised
    # eagerly, with its own warning, unless fullgraph=True)
    fallback: bool = True
    # captures of one function before it runs eagerly for new inputs
    recompile_limit: int = 8
    # search wider when a code generator autotunes (set by mode="max-autotune")
    max_autotune: bool = False
    # CUDA graphs through the kiln.runtime plug-in: None (the default mode: on CUDA, a
    # graph of runtime.MIN_GRAPH_STEPS steps or more replays one, with its outputs copied
    # fresh at every call), True (set by mode="reduce-overhead": outputs over graph memory),
    # False (kernels launched one by one, always)
    cudagraphs: bool | None = None
    # the host program: "auto" (native where the code generator builds one, logged),
    # "python" (always the Python one), "native" (fail where none can be built);
    # default: $KILN_HOST_PROGRAM, else "auto"
    host_program: str = "auto"
    # channels-last activations around 2-D convolutions (kiln/layouts.py): None (inference
    # graphs on CUDA), True (every graph, on the CPU too), False (never)
    channels_last: bool | None = None
    # inference graphs read their parameters and buffers as constants (kiln/freezing.py):
    # what depends on them alone (batch norms folded into convolutions, laid-out weights,
    # casts) is computed once, and again after they are written in place; False reads
    # them at every call (a write through tensor.data is not seen by the first)
    freezing: bool = True
    # hand-written attention (softmax(q @ k.T * scale + mask) @ v) rewritten to the fused
    # attention op (kiln/attention.py): None (graphs on CUDA), True (on the CPU too), False
    fused_attention: bool | None = None
    # a training graph's backward writes its parameters' gradients into their .grad itself
    # (kiln_autograd.direct_gradients), not through autograd's one accumulator node per
    # parameter; parameters are then out of reach of torch.autograd.grad(loss, params) and
    # backward(inputs=params), and hooks on accumulator nodes do not run (tensor hooks do)
    direct_gradients: bool = False
    # a training graph's backward compiles in a thread while its forward compiles (sizes
    # that are numbers), the capture waiting for both (kiln/backward_ahead.py): None (when
    # a module in training mode is called), True (always), False (at the first backward)
    backward_ahead: bool | None = None

    def code_settings(self) -> dict[str, object]:
        """The options that change a graph's generated code: part of its cache key (an
        entry made for the Python host program holds no native one)."""
        return {
            "fusion": self.fusion,
            "reuse_memory": self.reuse_memory,
            "max_autotune": self.max_autotune,
            "host_program": self.host_program,
        }


@dataclasses.dataclass(frozen=True)
class Config:
    backend: str | Callable
    mode: str
    dynamic: bool | None
    fullgraph: bool
    options: Options


DEBUG_SWITCHES_ON = ("1", "true", "on", "yes")
DEBUG_SWITCHES_OFF = ("0", "false", "off", "no")
_default_debug_dir: str | None = None


def debug_dir_from_environment() -> str | None:
    """The folder ``$KILN_DEBUG`` names: a path, or for ``1`` (``true``, ``on``, ``yes``) a
    new folder ``./kiln_debug/run_<date>_<time>-pid<pid>`` for this process, said once on
    stderr, as ``TORCH_COMPILE_DEBUG=1`` does; ``0`` (``false``, ``off``, ``no``) or unset:
    none."""
    global _default_debug_dir
    value = os.environ.get("KILN_DEBUG", "").strip()
    if value.lower() in DEBUG_SWITCHES_OFF or not value:
        return None
    if value.lower() not in DEBUG_SWITCHES_ON:
        return value
    if _default_debug_dir is None:
        stamp = time.strftime("%Y%m%d_%H%M%S")
        _default_debug_dir = os.path.abspath(
            os.path.join("kiln_debug", f"run_{stamp}-pid{os.getpid()}")
        )
        print(f"kiln: KILN_DEBUG={value}: debug dumps in {_default_debug_dir}", file=sys.stderr)
    return _default_debug_dir


def _default_options() -> dict:
    env = {}
    debug_dir = debug_dir_from_environment()
    if debug_dir is not None:
        env["debug_dir"] = debug_dir
    if os.environ.get("KILN_CACHE", "1").strip().lower() in ("0", "false", "off", "no"):
        env["cache"] = False
    if os.environ.get("KILN_HOST_PROGRAM"):
        env["host_program"] = os.environ["KILN_HOST_PROGRAM"]
    return env


def _check_option(name: str, value: object, default: object) -> None:
    if name in ("debug_dir", "cache_dir", "codegen"):
        if value is not None and not isinstance(value, (str, os.PathLike)):
            raise TypeError(f"kiln.compile(options={{{name!r}: ...}}) takes a string or None")
        return
    if name == "partitioner":
        if value not in PARTITIONERS:
            raise ValueError(
                f"kiln.compile(options={{'partitioner': {value!r}}}): use one of {PARTITIONERS}"
            )
        return
    if name in ("cudagraphs", "channels_last", "fused_attention", "backward_ahead"):
        if value not in (None, True, False):
            raise TypeError(f"kiln.compile(options={{{name!r}: ...}}) takes True, False or None")
        return
    if name == "host_program":
        if value not in HOST_PROGRAMS:
            raise ValueError(
                f"kiln.compile(options={{'host_program': {value!r}}}): use one of {HOST_PROGRAMS}"
            )
        return
    if type(value) is not type(default):
        raise TypeError(
            f"kiln.compile(options={{{name!r}: {value!r}}}) takes a {type(default).__name__}"
        )


def make_config(
    backend: str | Callable,
    mode: str | None,
    dynamic: bool | None,
    fullgraph: bool,
    options: Mapping[str, object] | None,
) -> Config:
    """Check the arguments of ``kiln.compile`` and fill in the defaults."""
    if isinstance(backend, str):
        if backend not in NAMED_BACKENDS:
            raise ValueError(
                f"kiln.compile(backend={backend!r}) is not a Kiln backend: use one of "
                f"{list(NAMED_BACKENDS)} or a callable backend(gm, example_inputs) -> callable"
            )
    elif not callable(backend):
        raise TypeError(
            f"kiln.compile(backend=...) takes a name or a callable "
            f"backend(gm, example_inputs) -> callable, got {backend!r}"
        )
    if mode not in MODES:
        raise ValueError(f"kiln.compile(mode={mode!r}) is not a mode: use one of {list(MODES)}")
    if dynamic not in (None, True, False):
        raise TypeError(f"kiln.compile(dynamic={dynamic!r}) takes True, False or None")
    fields = {f.name: f.default for f in dataclasses.fields(Options)}
    given = dict(options or {})
    unknown = sorted(set(given) - set(fields))
    if unknown:
        raise ValueError(
            f"kiln.compile(options=...) got unknown option(s) {unknown}; known: {sorted(fields)}"
        )
    for name, value in given.items():
        _check_option(name, value, fields[name])
    values = {**_default_options(), **given}
    if mode == "max-autotune":
        values["max_autotune"] = True
    if mode == "reduce-overhead":
        if values.get("cudagraphs") is False:
            raise ValueError(
                "kiln.compile(mode='reduce-overhead') replays CUDA graphs, and "
                "options={'cudagraphs': False} turns them off: drop one of the two"
            )
        values["cudagraphs"] = True
    for key in ("debug_dir", "cache_dir"):
        if values.get(key) is not None:
            values[key] = str(Path(values[key]).expanduser())
    return Config(
        backend=backend,
        mode=mode or "default",
        dynamic=dynamic,
        fullgraph=bool(fullgraph),
        options=Options(**values),
    )


def cache_root(options: Options) -> Path:
    """The cache root: the ``cache_dir`` option, else ``$KILN_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/kiln``, else ``~/.cache/kiln`` (see :mod:`kiln.cache_folders`)."""
    if options.cache_dir:
        return Path(options.cache_dir)
    return default_root()
