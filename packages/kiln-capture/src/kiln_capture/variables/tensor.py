"""Tensors and symbolic sizes: each is a node of the graph being built, with a fake value."""

from __future__ import annotations

import operator

import torch

from kiln_capture.exc import GraphBreak
from kiln_capture.variables.base import Variable
from kiln_capture.variables.constant import ConstantVariable

# Attributes read straight off the fake tensor: they are fixed by the tensor guards.
STATIC_ATTRS = {
    "dtype",
    "device",
    "layout",
    "ndim",
    "requires_grad",
    "is_cuda",
    "is_cpu",
    "is_sparse",
    "is_quantized",
    "is_meta",
    "is_leaf",
    "is_mkldnn",
    "is_nested",
}
# Attributes that compute a new tensor: recorded as ``getattr`` nodes.
GRAPH_ATTRS = {"T", "mT", "H", "mH", "real", "imag", "data"}
# Methods answered from metadata without touching data.
STATIC_METHODS = {
    "dim",
    "ndimension",
    "is_floating_point",
    "is_complex",
    "element_size",
    "is_contiguous",
    "get_device",
    "is_signed",
    "type",
}
# Methods whose result depends on the tensor's data: the graph must break.
DATA_DEPENDENT = {
    "item",
    "tolist",
    "__bool__",
    "__index__",
    "__int__",
    "__float__",
    "data_ptr",
    "untyped_storage",
    "storage",
}
# Methods that run autograd or change what autograd records: they run outside the graph.
AUTOGRAD_METHODS = {"backward", "register_hook", "retain_grad", "requires_grad_"}


class TensorVariable(Variable):
    def __init__(self, node, example, cls: type = torch.Tensor, source=None):
        self.node = node
        self.example = example
        self.cls = cls
        self.source = source
        node.meta["example_value"] = example

    def python_type(self):
        return self.cls

    def describe(self) -> str:
        return f"a tensor ({self.node.name})"

    def identity_key(self):
        return ("tensor", id(self))

    def size_variables(self) -> list[Variable]:
        return [wrap_size(self, d, s) for d, s in enumerate(self.example.shape)]

    def getattr(self, tx, name):
        if name == "shape":
            from kiln_capture.variables.containers import SizeVariable

            return SizeVariable(self.size_variables())
        if name in STATIC_ATTRS:
            return ConstantVariable(getattr(self.example, name))
        if name in GRAPH_ATTRS:
            return tx.output.call_graph(
                "call_function", getattr, [self, ConstantVariable(name)], {}
            )
        if name == "grad":
            raise GraphBreak("reading a tensor's .grad")
        from kiln_capture.variables.functions import TensorMethodVariable

        if callable(getattr(torch.Tensor, name, None)):
            return TensorMethodVariable(self, name)
        real = getattr(self, "real", None)
        if not hasattr(torch.Tensor, name) and (real is None or not hasattr(real, name)):
            from kiln_capture.exc import UserError

            raise UserError(AttributeError(f"'Tensor' object has no attribute {name!r}"))
        raise GraphBreak(f"tensor attribute {name!r}")

    def call_method(self, tx, name, args, kwargs):
        if name == "storage_offset":  # a number the graph keeps: the guards must hold it
            tx.output.reads_storage_offsets = True
        if name == "numpy":
            from kiln_capture.variables.ndarray import tensor_numpy

            return tensor_numpy(tx, self, args, kwargs)
        if name in DATA_DEPENDENT:
            raise GraphBreak(f"Tensor.{name}() needs the tensor's data", data_dependent=True)
        turns_grad_on = name != "requires_grad_" or not args or args[0].truthy(tx)
        if (
            name in AUTOGRAD_METHODS
            and turns_grad_on
            and not (name == "requires_grad_" and self.source is not None)
        ):
            raise GraphBreak(f"Tensor.{name}() runs autograd outside the graph")
        if name == "size":
            from kiln_capture.variables.containers import SizeVariable

            sizes = self.size_variables()
            if not args and not kwargs:
                return SizeVariable(sizes)
            dim = (args[0] if args else kwargs["dim"]).as_constant()
            return sizes[dim]
        if name == "numel":
            from kiln_capture.variables.ops import product

            return product(tx, self.size_variables())
        if name == "stride" and not any(isinstance(s, torch.SymInt) for s in self.example.stride()):
            if args:
                return ConstantVariable(self.example.stride(args[0].as_constant()))
            from kiln_capture.variables.containers import TupleVariable

            return TupleVariable([ConstantVariable(s) for s in self.example.stride()])
        if name in STATIC_METHODS and all(a.is_constant() for a in args):
            value = getattr(self.example, name)(*(a.as_constant() for a in args))
            if name != "type" or args:
                if not isinstance(value, torch.Tensor):
                    return ConstantVariable(value)
            else:
                return ConstantVariable(value)
        if name == "__len__":
            if self.example.dim() == 0:
                from kiln_capture.exc import UserError

                raise UserError(TypeError("len() of a 0-d tensor"))
            return self.size_variables()[0]  # symbolic where the size is
        if name in ("__contains__", "__iter__"):
            raise GraphBreak(f"Tensor.{name} needs the tensor's data")
        return tx.output.call_graph("call_method", name, [self, *args], kwargs)

    def getitem(self, tx, key):
        return tx.output.call_graph("call_function", operator.getitem, [self, key], {})

    def unpack(self, tx):
        length = self.example.shape[0] if self.example.dim() else None
        if length is None:
            raise GraphBreak("iterating over a 0-d tensor")
        if isinstance(length, torch.SymInt):
            raise GraphBreak("iterating over a tensor of symbolic length")
        return [self.getitem(tx, ConstantVariable(i)) for i in range(length)]

    def truthy(self, tx) -> bool:
        raise GraphBreak("branching on a tensor's value (its truth value needs its data)")

    def reconstruct(self, cg) -> None:
        cg.load_graph_value(self)


class SymNodeVariable(Variable):
    """An int (or float, bool) whose value is symbolic: a size under dynamic shapes."""

    def __init__(self, node, example):
        self.node = node
        self.example = example
        node.meta["example_value"] = example

    def python_type(self):
        return {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}[type(self.example)]

    def describe(self) -> str:
        return f"a symbolic {self.python_type().__name__} ({self.node.name})"

    def truthy(self, tx) -> bool:
        return bool(tx.output.evaluate_symbolic(self.example))

    def as_constant(self):
        raise GraphBreak(f"{self.describe()} used where a constant is needed")

    def call_method(self, tx, name, args, kwargs):
        from kiln_capture.variables.sym_math import call_number_method

        return call_number_method(tx, self, name, args, kwargs)

    def specialized(self) -> ConstantVariable:
        """Its value as a constant, for code that needs one (``range(n)``, ``f"{n}"``):
        torch's ShapeEnv guards on it, so another value captures again."""
        return ConstantVariable(self.python_type()(self.example))

    def reconstruct(self, cg) -> None:
        cg.load_graph_value(self)


def wrap_size(tensor: TensorVariable, dim: int, size) -> Variable:
    if isinstance(size, torch.SymInt):
        expr = size.node.expr
        if expr.is_number:
            return ConstantVariable(int(expr))
        graph = tensor.node.graph
        with graph.inserting_after(tensor.node):
            node = graph.call_function(torch.ops.aten.sym_size.int, (tensor.node, dim))
        return SymNodeVariable(node, size)
    return ConstantVariable(size)
