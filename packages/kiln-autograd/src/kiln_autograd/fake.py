"""Fake inputs to trace with: static shapes, dynamic shapes, or the caller's own fakes.

Three cases, picked by :func:`fake_inputs`:

- the example inputs hold fake tensors or SymInts (kiln-capture with dynamic shapes): their
  fake mode and ShapeEnv are reused, so SymInts pass through to the graphs;
- ``dynamic=True`` with real example inputs: every dimension and every int input becomes a
  symbol (``make_fx``'s symbolic mode makes them);
- otherwise: static fake tensors with the inputs' exact shapes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch._guards import detect_fake_mode
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import ShapeEnv


def fake_inputs(
    args: Sequence[object], requires_grad: Sequence[bool], *, dynamic: bool
) -> tuple[list[object], FakeTensorMode]:
    """Fake versions of ``args`` with ``requires_grad`` set as given, and their fake mode."""
    mode = detect_fake_mode([a for a in args if isinstance(a, torch.Tensor)])
    if mode is None and any(isinstance(a, torch.SymInt) for a in args):
        raise TypeError(
            "kiln_autograd.aot got SymInt example inputs but no fake tensor example input "
            "sharing their ShapeEnv: pass the fake tensors the SymInts come from"
        )
    if mode is not None:
        fakes = [mode.from_tensor(a) if _is_real(a) else a for a in args]
    elif dynamic:
        fakes, mode = _symbolic_fakes(args)
    else:
        # No ShapeEnv: item() and data-dependent shapes then fail at once, by name.
        mode = FakeTensorMode()
        fakes = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
    return [_with_requires_grad(f, rg) for f, rg in zip(fakes, requires_grad, strict=True)], mode


def captured_examples(gm: torch.nn.Module, example_inputs: Sequence[object]) -> list[object]:
    """The example inputs to trace ``gm`` from: the fake values capture recorded on its
    placeholders (``example_value``, sharing capture's ShapeEnv) where they carry symbolic
    sizes and the caller passed real tensors with no fake mode to find them by (as
    kiln-capture does), so that the traced graphs keep capture's symbols; else
    ``example_inputs``."""
    if detect_fake_mode([a for a in example_inputs if isinstance(a, torch.Tensor)]):
        return list(example_inputs)  # the caller's fake mode (Dynamo's tracing context)
    graph = getattr(gm, "graph", None)
    nodes = list(graph.find_nodes(op="placeholder")) if graph is not None else []
    recorded = [n.meta.get("example_value", n.meta.get("val")) for n in nodes]
    if len(recorded) != len(example_inputs) or not is_dynamic(recorded):
        return list(example_inputs)
    examples = []
    for fake, real in zip(recorded, example_inputs, strict=True):
        if isinstance(real, torch.Tensor) and isinstance(fake, FakeTensor):
            if (fake.dtype, fake.device, fake.dim()) != (real.dtype, real.device, real.dim()):
                return list(example_inputs)  # not the value the placeholder recorded
            examples.append(_with_requires_grad(fake, real.requires_grad))
        elif isinstance(fake, torch.SymInt) and isinstance(real, int):
            examples.append(fake)
        else:
            examples.append(real)
    return examples


def is_dynamic(args: Sequence[object]) -> bool:
    """Whether any input carries symbolic sizes (so traced graphs take any size)."""
    for a in args:
        if isinstance(a, torch.SymInt):
            return True
        if isinstance(a, FakeTensor) and any(isinstance(s, torch.SymInt) for s in a.shape):
            return True
    return False


def _is_real(value: object) -> bool:
    return isinstance(value, torch.Tensor) and not isinstance(value, FakeTensor)


def _with_requires_grad(value: object, requires_grad: bool) -> object:
    if not isinstance(value, torch.Tensor):
        return value
    if value.requires_grad == requires_grad and value.is_leaf:
        return value
    mode = detect_fake_mode([value])
    with mode:
        out = value.detach()
    return out.requires_grad_(requires_grad)


def _symbolic_fakes(args: Sequence[object]) -> tuple[list[object], FakeTensorMode]:
    """Let ``make_fx``'s symbolic mode make a symbol of every size and int, and keep them."""
    captured: list[object] = []

    def grab(*fakes: object) -> None:
        captured.extend(fakes)

    make_fx(grab, tracing_mode="symbolic")(*[_detached(a) for a in args])
    mode = detect_fake_mode([a for a in captured if isinstance(a, torch.Tensor)])
    if mode is None:
        mode = FakeTensorMode(shape_env=ShapeEnv())
    return captured, mode


def _detached(value: object) -> object:
    return value.detach() if isinstance(value, torch.Tensor) else value
