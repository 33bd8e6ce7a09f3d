"""The codegen protocol that kernel generators (kiln-cpp, kiln-triton) implement, and
their discovery through the ``kiln.codegen`` entry-point group."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator, Sequence
from importlib import metadata
from typing import Protocol, runtime_checkable

from kiln_loopir.kernel import Kernel

log = logging.getLogger("kiln.loopir")
CODEGEN_GROUP = "kiln.codegen"


@runtime_checkable
class Codegen(Protocol):
    """A kernel generator for some device types.

    - ``name``: a short name (``"cpp"``, ``"triton"``).
    - ``device_types``: the ``torch.device.type`` values it serves (``("cpu",)``).
    - ``render(kernel)``: the kernel's source, as text. The generator walks the kernel by
      calling ``kernel.body(handler)`` with its own ops handler (see ``kiln_loopir.ops``);
      ``kernel.args`` (buffer names, dtypes in ``kernel.arg_dtypes``) then
      ``kernel.size_args`` (size symbols) are the launch arguments, in that order.
    - ``compile(sources)``: one callable per source, same order. The host program calls
      ``kernel(*buffers, *sizes)`` with tensors for the buffers and ints for the sizes.
    - optionally ``renders_scans = True``: it renders kernels with a Scan node (cumulative
      ops); without it the lowering makes none.
    - optionally ``vectorises_masked_strided_reads = False``: a read under a mask at a step
      of more than one element is slow in its kernels (kiln-cpp: g++ vectorises none), so
      the lowering writes such a producer once instead of inlining it (a max pooling's
      padding, read at each tap); by default it is inlined.

    The object registered in the entry-point group (a module is fine) is used as it is.
    """

    name: str
    device_types: Sequence[str]

    def render(self, kernel: Kernel) -> str: ...

    def compile(self, sources: Sequence[str]) -> list[Callable]: ...


def builtin_codegens() -> dict[str, Codegen]:
    from kiln_loopir.reference.codegen import ReferenceCodegen

    return {"reference": ReferenceCodegen()}


@functools.cache
def _entry_points() -> tuple[metadata.EntryPoint, ...]:
    return tuple(sorted(metadata.entry_points(group=CODEGEN_GROUP), key=lambda e: e.name))


_LOADED: dict[str, object | None] = {}  # entry-point name -> its codegen, or None (skipped)


def codegens() -> Iterator[tuple[str, object]]:
    """(name, codegen) for each loadable entry point of ``kiln.codegen``, sorted by name,
    each loaded when the iteration first reaches it: finding the CPU's code generator does
    not import the GPU's (and Triton with it)."""
    for ep in _entry_points():
        if ep.name not in _LOADED:
            _LOADED[ep.name] = _load(ep)
        if _LOADED[ep.name] is not None:
            yield ep.name, _LOADED[ep.name]


def installed_codegens() -> tuple[tuple[str, object], ...]:
    """Every loadable code generator (see :func:`codegens`)."""
    return tuple(codegens())


def _load(ep: metadata.EntryPoint) -> object | None:
    try:
        obj = ep.load()
    except Exception as exc:  # a broken plug-in must not stop the others
        log.warning("skipping code generator %s (%s): %s", ep.name, ep.value, exc)
        return None
    if not _implements(obj):
        log.info("skipping %s: it does not implement the codegen protocol yet", ep.name)
        return None
    return obj


def _implements(obj: object) -> bool:
    return all(hasattr(obj, a) for a in ("device_types", "render", "compile"))


def resolve_codegen(codegen: object, device_type: str) -> Codegen:
    """The codegen to use: an object as given, a name, or (None) the one for the device."""
    if codegen is not None and not isinstance(codegen, str):
        if not _implements(codegen):
            raise TypeError(
                f"codegen={codegen!r} lacks device_types, render or compile: pass an object "
                "implementing kiln_loopir.Codegen, or a name"
            )
        return codegen  # type: ignore[return-value]
    if isinstance(codegen, str):
        builtins = builtin_codegens()
        if codegen in builtins:
            return builtins[codegen]
        for name, obj in codegens():
            if name == codegen:
                return obj  # type: ignore[return-value]
        known = sorted(set(builtins) | {name for name, _ in codegens()})
        raise ValueError(f"no code generator named {codegen!r}; known: {known}")
    for _, obj in codegens():
        if device_type in tuple(obj.device_types):
            return obj  # type: ignore[return-value]
    suggestion = {"cpu": "kiln-cpp", "cuda": "kiln-triton"}.get(device_type, "a code generator")
    raise RuntimeError(
        f"no code generator for device {device_type!r} is installed: install {suggestion} "
        "(pip install " + (suggestion if suggestion.startswith("kiln") else "kiln-cpp") + "), "
        "or pass codegen='reference' to run kernels with the slow reference evaluator"
    )
