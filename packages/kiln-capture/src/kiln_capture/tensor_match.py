"""The tensor checks of a guard in one call: ``___tensors_match(t0, t1, ...)``.

A guard checks the parameters and buffers a frame reads (every tensor of the program's
state, as opposed to its arguments) in one call at its end, after every structural check
(module types, hooks, attributes) has passed. Each tensor is described by a ``TensorSpec``:
exactly what a per-tensor guard line checks (type, dtype, device, size, stride,
``requires_grad``, dispatch keys). A *matcher* turns the specs into the callable:

- ``python`` (the reference, and the fallback): a generated Python function, one readable
  line per tensor, the same checks as the per-tensor guard line;
- ``native``: registered by kiln where kiln-cpp's host runtime builds: the same checks in
  one C++ call for all the tensors (``kiln.tensor_guards``). Tried first by default.

A matcher may reject more than the reference (a call then misses and recompiles) but must
never accept a tensor the reference rejects. Another implementation (a C++ accelerator)
plugs in with ``register_matcher(name, build)``: ``build(specs, examples)`` returns a
``TensorMatcher`` or None when it cannot serve those specs, and is tried in the order of
``KILN_GUARD_TENSORS`` (comma-separated names; ``python`` always ends the list).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TensorSpec:
    """What a guard requires of one tensor, as read at capture time."""

    expr: str  # the guard expression that reads the tensor
    type: type
    dtype: torch.dtype
    device_index: int | None  # None on the CPU (the dispatch keys tell CPU from others)
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    requires_grad: bool
    keys: int  # the raw dispatch key set

    @classmethod
    def of(cls, expr: str, value: torch.Tensor) -> TensorSpec:
        index = None if value.device.type == "cpu" else (value.device.index or 0)
        return cls(
            expr,
            type(value),
            value.dtype,
            index,
            tuple(value.shape),
            tuple(value.stride()),
            value.requires_grad,
            torch._C._dispatch_keys(value).raw_repr(),
        )

    def checks(self, name: str, constant: Callable[[str, object], str]) -> list[str]:
        """The checks on the tensor ``name`` as Python; ``constant(prefix, value)`` names a
        value in the guard's scope. Shape and stride first: they are what changes."""
        found = [
            f"type({name}) is {constant('T', self.type)}",
            f"{name}.shape == {self.shape}",
            f"{name}.stride() == {self.stride}",
            f"{name}.dtype is {constant('dtype', self.dtype)}",
        ]
        if self.device_index is not None:
            found.append(f"{name}.get_device() == {self.device_index}")
        return [
            *found,
            f"{name}.requires_grad is {self.requires_grad}",
            f"___dispatch_keys({name}).raw_repr() == {self.keys}",
        ]


@dataclass
class TensorMatcher:
    """``check(*tensors)`` for tensors in the order of the specs it was built from."""

    check: Callable[..., bool]
    name: str
    source: str  # the Python reference as source, or a comment naming the accelerator


MATCHERS: dict[str, Callable[[list[TensorSpec], list[torch.Tensor]], TensorMatcher | None]] = {}


def register_matcher(name: str, build) -> None:
    """Make ``build(specs, examples) -> TensorMatcher | None`` selectable as ``name``."""
    MATCHERS[name] = build


DEFAULT_ORDER = "native,python"  # "native": registered by kiln (kiln-cpp's host runtime)


def chosen() -> list[str]:
    given = os.environ.get("KILN_GUARD_TENSORS")
    names = [n.strip() for n in (given or DEFAULT_ORDER).split(",")]
    if not given:  # the default names matchers that may not be installed
        names = [n for n in names if n in MATCHERS]
    unknown = [n for n in names if n and n not in MATCHERS]
    if unknown:
        raise ValueError(
            f"KILN_GUARD_TENSORS names unknown tensor matchers {unknown}; known: {sorted(MATCHERS)}"
        )
    return [n for n in names if n and n != "python"] + ["python"]


def build_matcher(specs: list[TensorSpec], examples: list[torch.Tensor]) -> TensorMatcher:
    """The first chosen matcher that serves ``specs`` (the Python reference at the end).
    ``examples`` are the tensors the specs were read from, still unchanged."""
    for name in chosen():
        matcher = MATCHERS[name](specs, examples)
        if matcher is not None:
            return matcher
    raise AssertionError("the python matcher serves every spec")


# --- the reference: generated Python ----------------------------------------------


def python_matcher(specs: list[TensorSpec], examples=None) -> TensorMatcher:
    scope: dict = {"___dispatch_keys": torch._C._dispatch_keys}
    names: dict[int, str] = {}  # one name per type and dtype

    def constant(prefix: str, value) -> str:
        if id(value) not in names:
            names[id(value)] = f"___{prefix}{len(names)}"
            scope[names[id(value)]] = value
        return names[id(value)]

    params = [f"t{i}" for i in range(len(specs))]
    lines = [f"def tensors_match({', '.join(params)}):"]
    for name, spec in zip(params, specs, strict=True):
        lines.append(f"    if not ({' and '.join(spec.checks(name, constant))}):  # {spec.expr}")
        lines.append("        return False")
    lines.append("    return True")
    source = "\n".join(lines) + "\n"
    exec(compile(source, "<kiln tensor guards>", "exec"), scope)  # noqa: S102
    return TensorMatcher(scope["tensors_match"], "python", source)


register_matcher("python", python_matcher)
