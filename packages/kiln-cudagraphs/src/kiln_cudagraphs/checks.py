"""When not to record a graph, and whether a recorded graph computes what eager computes."""

from __future__ import annotations

from collections.abc import Collection, Sequence

import torch

# Attributes through which a compiled callable holds the one it wraps: a wrapper's
# (compiled), Kiln's cached HostProgram (entry.host_source), functools.wraps (__wrapped__),
# functools.partial (func).
_WRAPPED = ("compiled", "inner", "entry", "__wrapped__", "func")
# Kiln's host programs draw the seed of their random ops on the host (make_seed): a graph
# would replay the seed drawn at capture, so every call would get the same numbers.
HOST_RANDOM_CALLS = ("make_seed(",)


def host_sources(compiled: object, depth: int = 4) -> list[str]:
    """The ``host_source`` strings of ``compiled`` and of the callables it wraps."""
    found: list[str] = []
    seen: set[int] = set()

    def visit(obj: object, depth: int) -> None:
        if obj is None or depth < 0 or id(obj) in seen:
            return
        seen.add(id(obj))
        source = _attribute(obj, "host_source")
        if isinstance(source, str):
            found.append(source)
        for name in _WRAPPED:
            visit(_attribute(obj, name), depth - 1)

    visit(compiled, depth)
    return found


def _attribute(obj: object, name: str) -> object:
    try:
        return getattr(obj, name, None)
    except Exception:  # a property that fails is no host program
        return None


def host_random_reason(compiled: object) -> str | None:
    """Why ``compiled`` must not be recorded because it draws random numbers on the host."""
    for source in host_sources(compiled):
        for call in HOST_RANDOM_CALLS:
            if call in source:
                return (
                    f"the host program draws random seeds on the host ({call[:-1]}): "
                    "a graph would replay the same random numbers at every call"
                )
    return None


def call_refusal(
    inputs: Sequence[object], device_type: str, unused: Collection[int] = ()
) -> str | None:
    """Why this call runs without a graph (device, autograd), or None; ``unused`` inputs
    (nothing computes with them) may be anywhere."""
    tensors = [
        (i, x) for i, x in enumerate(inputs) if isinstance(x, torch.Tensor) and i not in unused
    ]
    if not tensors:
        return "no input is a tensor, so no device to record on"
    for i, x in tensors:
        if x.device.type != device_type:
            return f"input {i} is on {x.device}, and graphs are recorded on {device_type!r}"
    if torch.is_grad_enabled():
        for i, x in tensors:
            if x.requires_grad:
                return (
                    f"input {i} requires grad while grad mode is on: autograd needs the "
                    "eager run (Kiln's own training graphs run with grad mode off)"
                )
    return None


def tolerances(dtype: torch.dtype) -> dict[str, float]:
    """How far a replay may be from eager: kernels that accumulate with atomics are not
    bitwise reproducible, random numbers drawn anew are far off."""
    if dtype in (torch.float16, torch.bfloat16):
        return {"rtol": 2e-2, "atol": 2e-2}
    if dtype in (torch.float32, torch.complex64):
        return {"rtol": 1e-4, "atol": 1e-4}
    return {"rtol": 1e-7, "atol": 1e-7}


def describe_mismatch(
    expected: Sequence[object],
    got: Sequence[object],
    placements: Sequence[object] = (),
    unchecked: Collection[int] = (),
) -> str | None:
    """How the replay's outputs differ from the eager run's on the same inputs, or None;
    ``placements`` (the output plan's) say where each output of the replay lives; the
    ``unchecked`` outputs are not compared."""
    if len(expected) != len(got):
        return f"the replay returned {len(got)} outputs and the eager run {len(expected)}"
    for i, (e, g) in enumerate(zip(expected, got, strict=True)):
        if i in unchecked:
            continue
        if isinstance(e, torch.Tensor) != isinstance(g, torch.Tensor):
            return f"output {i} is {type(g).__name__} in the replay, {type(e).__name__} eagerly"
        if not isinstance(e, torch.Tensor):
            if e != g:
                return f"output {i} is {g!r} in the replay but {e!r} in the eager run"
            continue
        if e.shape != g.shape or e.dtype != g.dtype:
            return (
                f"output {i} is {g.dtype} {tuple(g.shape)} in the replay but "
                f"{e.dtype} {tuple(e.shape)} in the eager run"
            )
        if not _close(e, g):
            where = f", {_where(placements[i])}" if i < len(placements) else ""
            return (
                f"output {i} ({e.dtype} {tuple(e.shape)}{where}) differs from the eager run "
                f"on the same inputs{_worst(e, g)}"
            )
    return None


def _close(e: torch.Tensor, g: torch.Tensor) -> bool:
    if e.is_floating_point() or e.is_complex():
        return torch.allclose(g, e, equal_nan=True, **tolerances(e.dtype))
    return torch.equal(g, e)


def _where(placement: object) -> str:
    index = getattr(placement, "index", None)
    if index is not None:
        return f"a view of input {index}"
    return "in graph memory"


def _worst(e: torch.Tensor, g: torch.Tensor) -> str:
    if e.numel() == 0 or e.dtype == torch.bool:
        return ""
    diff = (g - e).abs() if e.is_complex() else (g.double() - e.double()).abs()
    diff = diff.double().nan_to_num(nan=float("inf"))
    wrong = int((~torch.isclose(g, e, equal_nan=True, **tolerances(e.dtype))).sum().item())
    return f" (by up to {diff.max().item():.3g}; {wrong} of {e.numel()} elements)"
