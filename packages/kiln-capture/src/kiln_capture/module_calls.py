"""Module calls that run as nn.Module runs them, with the work beneath them captured.

Capture does not trace two kinds of module call, and runs them as they are instead:

- a module with hooks (its own or global ones): nn.Module runs the hooks, Python that may
  do anything (FSDP2's ``fully_shard`` gathers and frees parameters in them), and the
  forward they wrap is the captured one;
- ``DistributedDataParallel``: its forward (the reducer's bookkeeping, buffer broadcasts)
  runs as it is, and the module it wraps runs captured; graphs captured there are split at
  DDP's gradient buckets (:mod:`kiln_capture.distributed`).

Either way the module runs through nn.Module's ``_call_impl`` with one attribute set for
the length of the call (the ``forward`` nn.Module's call reads, or the wrapped module's
``_compiled_call_impl``, the hook ``nn.Module.compile()`` sets), so the model is unchanged
between calls. An attribute the user set (a ``forward`` of their own, a module compiled
already) is kept.

Code that capture does not take (a frame that runs eagerly) may call a module with hooks
too: :func:`compile_hooked_submodules` gives each such submodule of a captured module its
captured call through ``_compiled_call_impl``, so it runs compiled wherever it is called.
"""

from __future__ import annotations

import torch

_UNSET = object()


def runs_wrapped_module(module: torch.nn.Module) -> bool:
    """Whether ``module`` runs as it is and its wrapped ``module.module`` captured."""
    return isinstance(module, torch.nn.parallel.DistributedDataParallel)


def has_own_hooks(module: torch.nn.Module) -> bool:
    own = module.__dict__
    return bool(
        own.get("_forward_hooks")
        or own.get("_forward_pre_hooks")
        or own.get("_backward_hooks")
        or own.get("_backward_pre_hooks")
    )


def compile_hooked_submodules(module: torch.nn.Module, capture_module) -> None:
    """Each submodule of ``module`` with hooks of its own and no compiled call yet calls
    ``capture_module(submodule).forward`` instead of its ``_call_impl``."""
    for sub in module.modules():
        if sub is not module and has_own_hooks(sub) and sub._compiled_call_impl is None:
            sub._compiled_call_impl = capture_module(sub).forward


def call_with_attribute(owner, name: str, value, call, args, kwargs):
    """``call(*args, **kwargs)`` with ``owner.<name>`` set to ``value`` for its length
    (left as it is where the user set it)."""
    own = owner.__dict__
    old = own.get(name, _UNSET)
    if old is not _UNSET and old is not None:
        return call(*args, **kwargs)
    own[name] = value
    try:
        return call(*args, **kwargs)
    finally:
        if old is _UNSET:
            own.pop(name, None)
        else:
            own[name] = old
