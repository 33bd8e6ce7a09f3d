"""Regional compilation: when capture gives up on a compiled module's ``forward`` (it runs
eagerly from then on), each of its direct submodules is compiled on its own, so the model
still runs compiled code below the frame capture could not take (a ``forward`` that wraps
its body in something capture cannot step through, as ``DistributedDataParallel``'s does).

A submodule is compiled through nn.Module's own hook for it, ``_compiled_call_impl`` (what
``nn.Module.compile()`` sets): its ``_call_impl``, hooks included, is captured with the
same backend, mode and options as the module. One warning names the module, why its frame
runs eagerly and the submodules compiled instead.
"""

from __future__ import annotations

import warnings

import torch


def compile_submodules(module: torch.nn.Module, config, reason: str) -> list[str]:
    """Compile ``module``'s direct submodules on their own; their names."""
    from kiln.api import _compile

    compiled = []
    for name, child in module.named_children():
        if getattr(child, "_compiled_call_impl", None) is not None:
            continue  # compiled already (by the user, or by an earlier fallback)
        child._compiled_call_impl = _compile(child._call_impl, config, disable=False)
        compiled.append(name)
    if compiled:
        warnings.warn(
            f"kiln: {type(module).__qualname__}.forward runs eagerly ({reason}); its "
            f"submodules {', '.join(compiled)} are compiled on their own instead. To compile "
            "the whole model, move what capture cannot take out of forward "
            "(KILN_LOGS=graph_breaks says where)",
            RuntimeWarning,
            stacklevel=4,
        )
    return compiled
