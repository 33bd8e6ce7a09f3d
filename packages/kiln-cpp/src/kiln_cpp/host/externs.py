"""An extern op call of the C++ host program: the op's arguments in schema order, as the
runtime prepares them once (``runtime.Extern``), with numbered slots where the program
passes tensors.

A template item is ``(tag, value)``: ``("t", k)`` the k-th tensor the call passes,
``("tl", [k, ...])`` a list of them (``"otl"``: of optional tensors, ``None`` for one left
out), ``("default",)`` the schema's default, ``("none",)``, ``("undefined",)`` (an
undefined tensor: what ``None`` passes for a ``Tensor`` argument), and numbers, strings, lists of
numbers, dtypes, devices, layouts and memory formats as themselves (``"i"``, ``"f"``,
``"b"``, ``"s"``, ``"il"``, ``"fl"``, ``"bl"``, ``"dtype"``, ``"device"``, ``"layout"``,
``"memory_format"``); ``("si", k)`` is the k-th size the call passes and ``("sil", [...])``
a list of ints some of which are ``("s", k)``; ``("wn", number)`` is a number passed for a
``Tensor`` argument (``aten.mul.Tensor(z, 2)``), which the runtime wraps as Python does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import sympy
import torch

from kiln_loopir.host import HostNotRendered
from kiln_loopir.ir import ExternNode, TensorRef

_MISSING = object()
# ops whose results have another layout than strided (a planned buffer cannot hold them)
NOT_STRIDED = ("sparse", "mkldnn", "nested")


@dataclass
class ExternCall:
    op_name: str  # "aten.addmm.default"
    qualified_name: str  # "aten::addmm"
    overload: str  # "" for default
    template: list[tuple]
    n_returns: int
    tensors: list[str] = field(default_factory=list)  # names the program passes, in order
    sizes: list[str] = field(default_factory=list)  # C++ size expressions it passes, in order
    prepared: object = None

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "prepared"}

    def prepare(self, runtime) -> None:
        try:
            self.prepared = runtime.Extern(
                self.qualified_name,
                self.overload,
                [_decode(t) for t in self.template],
                self.n_returns,
            )
        except (TypeError, ValueError, RuntimeError) as exc:
            raise HostNotRendered(f"{self.op_name}: {exc}") from exc


def out_variant(
    op: torch._ops.OpOverload, device_type: str | None = None
) -> torch._ops.OpOverload | None:
    """``op``'s ``out=`` overload where it takes the same arguments plus one ``out`` tensor
    and returns it (``aten.addmm.out`` for ``aten.addmm.default``), else None. With
    ``device_type``, only where that device has a kernel of its own for it: ATen's generated
    ``out=`` overloads (``convolution.out``, say) compute a new tensor and copy it into
    ``out``, a copy the plain call does not make."""
    if len(op._schema.returns) != 1 or op._overloadname != "default":
        return None
    if any(layout in op._schema.name for layout in NOT_STRIDED):
        return None  # its result is not a strided tensor a planned buffer could hold
    out = getattr(op.overloadpacket, "out", None)
    if out is None:
        return None
    args, out_args = op._schema.arguments, out._schema.arguments
    same = [(a.name, str(a.type)) for a in args] == [(a.name, str(a.type)) for a in out_args[:-1]]
    last = out_args[-1] if len(out_args) == len(args) + 1 else None
    if not same or last is None or last.name != "out" or not last.kwarg_only:
        return None
    if device_type is not None and not _has_own_kernel(out, device_type):
        return None
    return out


def _has_own_kernel(op: torch._ops.OpOverload, device_type: str) -> bool:
    key = {"cpu": "CPU", "cuda": "CUDA"}.get(device_type)
    if key is None:
        return True
    return torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), key)


def extern_call(
    node: ExternNode,
    tensor_name: Callable[[TensorRef], str],
    out: str | None = None,
    size_expr: Callable[[sympy.Expr], str] | None = None,
) -> ExternCall:
    """The call of ``node``'s op; ``tensor_name`` gives the program's name for a tensor
    argument (making a view first where the argument is one). With ``out`` (the name of
    the buffer it fills), the op's ``out=`` overload (see :func:`out_variant`). With
    ``size_expr`` (a size expression as C++), ints that are size expressions pass as slots
    the program fills at each call."""
    op = node.target
    if not isinstance(op, torch._ops.OpOverload):
        raise HostNotRendered(f"extern {getattr(op, '__name__', op)!r} is not an ATen op")
    if node.binds:
        raise HostNotRendered(f"{op} defines sizes from its result")
    schema = op._schema
    call = ExternCall(str(op), schema.name, schema.overload_name, [], len(schema.returns))
    for i, r in enumerate(schema.returns):  # numbers it returns must be unused
        used = i < len(node.outputs) and node.outputs[i] is not None
        if str(r.type) != "Tensor" and used:
            raise HostNotRendered(f"{op} returns {r.type} as result {i}, which is read")
    positional = list(node.args)
    encode = _Encoder(call, tensor_name, size_expr, str(op))
    for i, arg in enumerate(schema.arguments):
        if i < len(positional) and not arg.kwarg_only:
            value = positional[i]
        else:
            value = node.kwargs.get(arg.name, _MISSING)
        if value is _MISSING:
            call.template.append(("default",))
            continue
        call.template.append(encode(value, str(arg.type)))
    if out is not None:
        variant = out_variant(op)
        call.overload, call.op_name, call.n_returns = "out", str(variant), 0
        call.tensors.append(out)
        call.template.append(("t", len(call.tensors) - 1))
    return call


_NAMED = {torch.dtype: "dtype", torch.layout: "layout", torch.memory_format: "memory_format"}


def _decode(item: tuple) -> tuple:
    """A template item as the runtime takes it: dtypes, devices, layouts and memory
    formats as torch's objects (the template keeps their names, so it stores as data)."""
    tag = item[0]
    if tag == "device":
        return (tag, torch.device(item[1]))
    if tag in _NAMED.values():
        return (tag, getattr(torch, item[1]))
    return item


class _Encoder:
    """Template items of one call's arguments (see the module docstring)."""

    def __init__(self, call: ExternCall, tensor_name, size_expr, op: str) -> None:
        self.call = call
        self.tensor_name = tensor_name
        self.size_expr = size_expr
        self.op = op

    def slot(self, ref: TensorRef) -> int:
        self.call.tensors.append(self.tensor_name(ref))
        return len(self.call.tensors) - 1

    def size_slot(self, expr: sympy.Expr) -> int:
        if self.size_expr is None:
            raise HostNotRendered(f"{self.op}: the size {expr} is a symbol")
        self.call.sizes.append(self.size_expr(expr))
        return len(self.call.sizes) - 1

    def __call__(self, value, arg_type: str) -> tuple:
        if isinstance(value, TensorRef):
            return ("t", self.slot(value))
        if value is None:  # Python's None for a Tensor argument is an undefined tensor
            return ("undefined",) if arg_type == "Tensor" else ("none",)
        if arg_type == "Tensor" and isinstance(value, (bool, int, float, complex, sympy.Number)):
            number = value if isinstance(value, (bool, int, float, complex)) else _number(value)
            return ("wn", number)
        if isinstance(value, bool):
            return ("b", value)
        if isinstance(value, (int, sympy.Integer)):
            return ("f", float(value)) if "float" in arg_type else ("i", int(value))
        if _is_size(value) and "int" in arg_type.lower() and "[" not in arg_type:
            return ("si", self.size_slot(value))
        numeric = "float" in arg_type or "number" in arg_type or "Scalar" in arg_type
        if isinstance(value, (float, sympy.Float)) and numeric:
            return ("f", float(value))
        if isinstance(value, str):
            return ("s", value)
        if isinstance(value, torch.device):
            return ("device", str(value))
        for kind, tag in _NAMED.items():
            if isinstance(value, kind):
                return (tag, str(value).removeprefix("torch."))
        if isinstance(value, (list, tuple)):
            return self.sequence(list(value), arg_type)
        raise HostNotRendered(f"{self.op}: cannot pass {value!r} as {arg_type}")

    def sequence(self, value: list, arg_type: str) -> tuple:
        if not value:  # an empty list: its items' type is the argument's
            return _EMPTY_LISTS.get(_item_type(arg_type), ("il", []))
        if all(v is None or isinstance(v, TensorRef) for v in value) and "Tensor" in arg_type:
            slots = [None if v is None else self.slot(v) for v in value]
            return ("otl" if "Optional[Tensor]" in arg_type else "tl", slots)
        if all(isinstance(v, bool) for v in value):
            return ("bl", value)
        integers = all(isinstance(v, (int, sympy.Integer)) for v in value)
        if integers and "float" not in arg_type:
            return ("il", [int(v) for v in value])
        sizes = all(isinstance(v, (int, sympy.Integer)) or _is_size(v) for v in value)
        if sizes and "float" not in arg_type:
            items = [int(v) if not _is_size(v) else ("s", self.size_slot(v)) for v in value]
            return ("sil", items)
        if all(isinstance(v, (int, float, sympy.Number)) for v in value):
            return ("fl", [float(v) for v in value])
        raise HostNotRendered(f"{self.op}: cannot pass {value!r} as {arg_type}")


_EMPTY_LISTS = {
    "int": ("il", []),
    "float": ("fl", []),
    "bool": ("bl", []),
    "tensor": ("tl", []),
    "optional_tensor": ("otl", []),
}


def _item_type(arg_type: str) -> str:
    """The kind of item a list argument of schema type ``arg_type`` holds."""
    lowered = arg_type.lower()
    if "tensor" in lowered:
        return (
            "optional_tensor" if "optional[tensor]" in lowered or "tensor?" in lowered else "tensor"
        )
    for kind in ("bool", "float", "int"):
        if kind in lowered:
            return kind
    return "int"


def _number(value: sympy.Number) -> int | float:
    return int(value) if value.is_Integer else float(value)


def _is_size(value) -> bool:
    """A size expression: a sympy expression over integer symbols, not a number."""
    return isinstance(value, sympy.Expr) and not value.is_number and bool(value.free_symbols)
