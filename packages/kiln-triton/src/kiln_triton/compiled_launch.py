"""What a native host program needs to know of a compiled Triton kernel to launch it with
``cuLaunchKernel``: whether it can (:func:`unlaunchable`), how many parameters its entry
point takes (:func:`ptx_params`, the null scratch pointers newer Triton appends
included), and its function handle (:func:`load_function`)."""

from __future__ import annotations

import re
from pathlib import Path

_ENTRY = re.compile(r"\.entry\s+(\w+)\s*\(([^)]*)\)", re.S)
_PTX_PARAMS: dict[tuple, int] = {}  # by the compiled kernel's id and hash


def unlaunchable(meta) -> str | None:
    """Why a plain launch cannot run the compiled kernel of metadata ``meta``, or None."""
    for attr, plain in (("num_ctas", 1), ("launch_cooperative_grid", False)):
        if getattr(meta, attr, plain) != plain:
            return f"{attr}={getattr(meta, attr)}"
    if getattr(meta, "launch_pdl", False):
        return "it launches with programmatic dependencies"
    for attr in ("global_scratch_size", "profile_scratch_size"):
        if getattr(meta, attr, 0):
            return f"it needs {attr}={getattr(meta, attr)}"
    return None


def ptx_params(compiled) -> int | None:
    """The parameters of the compiled kernel's entry point, counted in its PTX once; None
    where it keeps no PTX with an entry point."""
    key = (id(compiled), getattr(compiled, "hash", None))
    n = _PTX_PARAMS.get(key)
    if n is None:
        ptx = compiled.asm.get("ptx") if hasattr(compiled, "asm") else None
        ptx = ptx or _ptx_file(compiled)
        m = _ENTRY.search(ptx if isinstance(ptx, str) else ptx.decode()) if ptx else None
        if m is None:
            return None
        n = _PTX_PARAMS[key] = m.group(2).count(".param")
    return n


def _ptx_file(compiled) -> str | None:
    """The PTX of a kernel loaded without its intermediate forms
    (:func:`kiln_triton.known_binaries.recall`), from its file: the copy kept in Kiln's
    cache, or Triton's own."""
    group = getattr(compiled, "metadata_group", None) or {}
    path = next((p for name, p in group.items() if name.endswith(".ptx")), None)
    try:
        return Path(path).read_text() if path else None
    except OSError:
        return None


def load_function(compiled) -> None:
    """Load ``compiled``'s binary on the current device: its ``module`` and ``function``
    handles exist from here on. Triton's own loading (``compiled[grid]``) also makes its
    launcher, C code compiled per kernel signature (0.3-0.4 s of gcc on the H200 machine
    for a signature no worker built); a kernel only a native host program launches needs
    none. Such a kernel is not launched through Triton afterwards."""
    if compiled.module is not None:
        return
    from triton.runtime import driver

    device = driver.active.get_current_device()
    loaded = driver.active.utils.load_binary(
        compiled.name, compiled.kernel, compiled.metadata.shared, device
    )  # (module, function, registers, spills[, most threads]), by Triton's version
    compiled.module, compiled.function = loaded[0], loaded[1]
