"""NumPy on tensors: an ndarray made from a tensor inside the captured code (``t.numpy()``,
``np.ones(3)``) is a tensor of the graph that follows NumPy's semantics.

Each NumPy function, ndarray method, attribute or operator becomes one graph node whose
target runs it through ``torch._numpy`` (NumPy implemented on torch ops): dtype promotion,
float64 defaults, ``axis`` for ``dim`` are NumPy's, and the backend sees the torch ops.
An ndarray that leaves the graph (returned, or live at a graph break) is rebuilt as a real
``numpy.ndarray`` over the graph's output tensor. What is not in the tables below breaks
the graph, as do ndarrays mixed with tensors, in-place updates and values that need data.
"""

from __future__ import annotations

import functools
import operator
import sys

import torch

from kiln_capture.exc import GraphBreak, UserError
from kiln_capture.variables.base import MethodVariable, Variable
from kiln_capture.variables.constant import ConstantVariable
from kiln_capture.variables.containers import (
    DictVariable,
    ListVariable,
    SequenceVariable,
    SliceVariable,
    TupleVariable,
)
from kiln_capture.variables.tensor import TensorVariable

# --- what is traced ---------------------------------------------------------------------


def _names(text: str) -> list[str]:
    return text.split()


UNARY_UFUNCS = _names("""sin cos tan arcsin arccos arctan sinh cosh tanh arcsinh arccosh arctanh
exp exp2 expm1 log log2 log10 log1p sqrt cbrt square abs absolute fabs negative positive sign
floor ceil trunc rint reciprocal isnan isinf isfinite logical_not deg2rad rad2deg""")
BINARY_UFUNCS = _names("""add subtract multiply divide true_divide floor_divide power float_power
mod remainder fmod maximum minimum fmax fmin arctan2 hypot logaddexp logical_and logical_or
logical_xor equal not_equal less less_equal greater greater_equal""")
REDUCTIONS = _names("""sum mean max min amax amin argmax argmin prod std var any all cumsum
cumprod ptp""")
SHAPES_AND_LINALG = _names("""matmul dot vdot inner outer einsum where clip round around concatenate
stack vstack hstack transpose reshape squeeze expand_dims swapaxes moveaxis ravel flip
broadcast_to tril triu zeros_like ones_like full_like copy asarray array
ascontiguousarray take take_along_axis sort argsort diff tile repeat roll pad searchsorted
median quantile percentile isclose count_nonzero cross trace diagonal diag kron tensordot
split array_split atleast_1d atleast_2d""")
# Functions that make an array from Python values: traced even without an ndarray argument.
CREATION = _names("""zeros ones full arange eye identity linspace""")
NUMPY_FUNCTIONS = frozenset(
    UNARY_UFUNCS + BINARY_UFUNCS + REDUCTIONS + SHAPES_AND_LINALG + CREATION
)
# Functions of ``numpy.linalg``, traced by the qualified name ``linalg.<name>``.
NUMPY_LINALG = frozenset(
    _names("""norm det inv solve pinv matrix_rank slogdet eigvalsh
cholesky qr svd""")
)

NDARRAY_METHODS = frozenset(
    _names("""sum mean max min argmax argmin prod std var any all cumsum cumprod reshape
    transpose squeeze ravel flatten astype copy clip round dot swapaxes conj
    __abs__ __neg__ __pos__ __invert__""")
)
# Attributes that are new arrays (the others come from metadata).
NDARRAY_ARRAY_ATTRS = frozenset({"T", "real", "imag"})

# NumPy gives a 0-d ndarray (not a NumPy scalar) from these even for a 0-d result; every
# other operation with a 0-d result gives a scalar (``a.sum()`` is a ``numpy.float32``).
KEEPS_ZERO_DIM_ARRAY = frozenset(
    CREATION
    + _names("""reshape transpose squeeze copy asarray array ascontiguousarray where expand_dims
    zeros_like ones_like full_like broadcast_to""")
)
# And these keep what their input was: a scalar stays a scalar, a 0-d array an array.
KEEPS_KIND = frozenset({"astype", "T", "real", "imag", "conj"})

IN_PLACE_OPERATORS = {
    operator.iadd,
    operator.isub,
    operator.imul,
    operator.itruediv,
    operator.ifloordiv,
    operator.imod,
    operator.ipow,
    operator.imatmul,
    operator.iand,
    operator.ior,
    operator.ixor,
    operator.ilshift,
    operator.irshift,
}


def numpy_module():
    """NumPy, where the user's program has imported it (capture never imports it itself)."""
    return sys.modules.get("numpy")


def is_ndarray(value) -> bool:
    """Whether ``value`` is a ``numpy.ndarray`` itself (not a subclass such as a matrix)."""
    np = numpy_module()
    return np is not None and type(value) is np.ndarray


def is_numpy_function(value) -> bool:
    """Whether ``value`` is a function of ``numpy`` or ``numpy.linalg`` that is traced."""
    return numpy_name(value) is not None


def numpy_name(value) -> str | None:
    """``name`` for a traced ``numpy.<name>``, ``linalg.<name>`` for ``numpy.linalg.<name>``,
    else None."""
    np = numpy_module()
    name = getattr(value, "__name__", None)
    if np is None or not isinstance(name, str):
        return None
    if name in NUMPY_FUNCTIONS and getattr(np, name, None) is value:
        return name
    if name in NUMPY_LINALG and getattr(np.linalg, name, None) is value:
        return f"linalg.{name}"
    return None


# --- graph targets: tensors in, NumPy semantics through torch._numpy, tensors out --------


def _to_ndarrays(value):
    import torch._numpy as tnp

    if isinstance(value, torch.Tensor):
        return tnp.ndarray(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_to_ndarrays(v) for v in value)
    if isinstance(value, dict):
        return {k: _to_ndarrays(v) for k, v in value.items()}
    return value


def _to_tensors(value):
    import torch._numpy as tnp

    if isinstance(value, tnp.ndarray):
        return value.tensor
    if isinstance(value, (list, tuple)):
        return type(value)(_to_tensors(v) for v in value)
    return value


def _graph_target(name: str, run, returns_input: bool = False):
    def call(*args, **kwargs):
        result = _to_tensors(run(*_to_ndarrays(args), **_to_ndarrays(kwargs)))
        if not returns_input and any(result is a for a in args):
            # torch._numpy skips a copy NumPy makes (astype to the same dtype): copy, so
            # the array does not share memory with its input
            return result.clone()
        return result

    call.__name__ = call.__qualname__ = name
    return call


# NumPy returns its argument itself from these where no conversion is needed.
RETURNS_INPUT = frozenset({"asarray", "ascontiguousarray"})


@functools.cache
def numpy_function(name: str):
    """The graph target for ``numpy.<name>``."""
    import torch._numpy as tnp

    target = tnp
    for part in name.split("."):  # linalg.norm: torch._numpy.linalg.norm
        target = getattr(target, part)
    return _graph_target(f"numpy_{name.replace('.', '_')}", target, name in RETURNS_INPUT)


@functools.cache
def ndarray_method(name: str):
    """The graph target for ``ndarray.<name>(...)``."""

    def run(array, *args, **kwargs):
        return getattr(array, name)(*args, **kwargs)

    return _graph_target(f"ndarray_{name.strip('_')}", run)


@functools.cache
def ndarray_attribute(name: str):
    """The graph target for reading ``ndarray.<name>`` (an array: ``T``, ``real``)."""
    return _graph_target(f"ndarray_attr_{name}", lambda a: getattr(a, name))


@functools.cache
def ndarray_operator(op):
    """The graph target for a Python operator on ndarrays."""
    return _graph_target(f"ndarray_{op.__name__.strip('_')}", op)


# --- after the graph: real ndarrays -----------------------------------------------------


def tensor_to_ndarray(tensor: torch.Tensor):
    """An ndarray the graph computed, as the user's code gets it: over the output tensor."""
    return tensor.numpy(force=True)


def tensor_to_numpy_scalar(tensor: torch.Tensor):
    """A 0-d result that NumPy gives as a scalar (``numpy.float32``, ...)."""
    return tensor.numpy(force=True)[()]


# --- the variable ------------------------------------------------------------------------


class NumpyArrayVariable(Variable):
    """A ``numpy.ndarray`` (or NumPy scalar, for ``scalar``) backed by a graph tensor."""

    mutable = True  # an ndarray is one object: rebuilt once where it is used twice

    def __init__(self, tensor: TensorVariable, scalar: bool = False, source=None):
        self.tensor = tensor
        self.scalar = scalar
        self.source = source  # an ndarray read from outside the frame: reloaded from there

    def numpy_dtype(self):
        return numpy_module().dtype(str(self.tensor.example.dtype).removeprefix("torch."))

    def python_type(self):
        if self.scalar:
            return self.numpy_dtype().type
        return numpy_module().ndarray

    def describe(self) -> str:
        kind = "a NumPy scalar" if self.scalar else "an ndarray"
        return f"{kind} ({self.tensor.node.name})"

    def identity_key(self):
        return ("ndarray", id(self))

    def getattr(self, tx, name):
        example = self.tensor.example
        if name == "shape":
            return TupleVariable(self.tensor.size_variables())
        if name == "ndim":
            return ConstantVariable(example.dim())
        if name == "size":
            from kiln_capture.variables.ops import product

            return product(tx, self.tensor.size_variables())
        if name == "dtype":
            return ConstantVariable(self.numpy_dtype())
        if name == "itemsize":
            return ConstantVariable(example.element_size())
        if name in NDARRAY_ARRAY_ATTRS:
            return call_numpy(tx, ndarray_attribute(name), [self], {}, name, self.scalar)
        if name in NDARRAY_METHODS:
            return MethodVariable(self, name)
        raise GraphBreak(f"ndarray attribute {name!r}")

    def call_method(self, tx, name, args, kwargs):
        if name == "__len__" and self.tensor.example.dim():
            return self.tensor.call_method(tx, "size", [ConstantVariable(0)], {})
        if name not in NDARRAY_METHODS:
            raise GraphBreak(f"ndarray.{name}() is not traced")
        return call_numpy(tx, ndarray_method(name), [self, *args], kwargs, name, self.scalar)

    def getitem(self, tx, key):
        return call_numpy(tx, ndarray_operator(operator.getitem), [self, key], {}, "getitem")

    def unpack(self, tx):
        length = self.tensor.example.shape[0] if self.tensor.example.dim() else None
        if not isinstance(length, int):
            raise GraphBreak("iterating over a 0-d or symbolic-length ndarray")
        return [self.getitem(tx, ConstantVariable(i)) for i in range(length)]

    def truthy(self, tx) -> bool:
        raise GraphBreak("branching on an ndarray's value (its truth value needs its data)")

    def reconstruct(self, cg) -> None:
        if self.source is not None:
            self.source.emit(cg)
            return
        convert = tensor_to_numpy_scalar if self.scalar else tensor_to_ndarray
        cg.call_object(convert, [self.tensor])


def wrap_ndarray(tx, value, source) -> Variable:
    """An ndarray the frame reads (an argument, a global): a graph input over its memory
    (``torch.from_numpy``), guarded on its type, dtype, shape and strides like a tensor."""
    from kiln_capture.sources import NdarrayTensorSource, ndarray_tensor
    from kiln_capture.variables.objects import ObjectVariable

    guards = tx.output.guards
    guards.type(source, value)
    tensor = ndarray_tensor(value)
    expr = guards.bind(NdarrayTensorSource(source))
    if tensor is None:  # stays a Python object; the code on it runs natively
        guards.add(f"{expr} is None", f"{source.expr()}: an ndarray torch cannot view")
        return ObjectVariable(value, source)
    return NumpyArrayVariable(
        tx.output.add_input(tensor, NdarrayTensorSource(source)), False, source
    )


# --- calls -------------------------------------------------------------------------------


def call_numpy(tx, target, args, kwargs, name: str, scalar_input: bool = False) -> Variable:
    """Record ``target(*args, **kwargs)`` on the ndarrays' tensors; its tensors are ndarrays."""
    node_args = [as_graph_argument(a) for a in args]
    node_kwargs = {k: as_graph_argument(v) for k, v in kwargs.items()}
    try:
        result = tx.output.call_graph("call_function", target, node_args, node_kwargs)
    except UserError as exc:
        # NumPy may accept what torch._numpy refuses; eagerly, either runs or raises itself
        raise GraphBreak(f"numpy {name}: {exc.exception!r}") from None
    except (NotImplementedError, KeyError, AttributeError) as exc:
        raise GraphBreak(f"numpy {name} is not supported here: {exc!r}") from None
    return as_numpy_result(result, name, scalar_input)


def as_numpy_result(result: Variable, name: str, scalar_input: bool) -> Variable:
    if isinstance(result, TensorVariable):
        zero_dim = result.example.dim() == 0
        if name in KEEPS_KIND:
            scalar = scalar_input
        else:
            scalar = zero_dim and name not in KEEPS_ZERO_DIM_ARRAY
        return NumpyArrayVariable(result, scalar)
    if isinstance(result, SequenceVariable):
        items = [as_numpy_result(item, name, scalar_input) for item in result.items]
        return TupleVariable(items) if isinstance(result, TupleVariable) else ListVariable(items)
    return result


def as_graph_argument(v: Variable) -> Variable:
    """An argument of a NumPy call as the graph target takes it: ndarrays as their tensors,
    dtypes as their names."""
    if isinstance(v, NumpyArrayVariable):
        return v.tensor
    if isinstance(v, TensorVariable):
        raise GraphBreak("a tensor passed to NumPy (only ndarrays made from tensors are traced)")
    if isinstance(v, SliceVariable):
        return SliceVariable([as_graph_argument(p) for p in v.parts])
    if isinstance(v, SequenceVariable):
        items = [as_graph_argument(i) for i in v.items]
        return ListVariable(items) if isinstance(v, ListVariable) else TupleVariable(items)
    if isinstance(v, DictVariable):
        raise GraphBreak("a dict passed to NumPy")
    dtype_name = numpy_dtype_name(getattr(v, "value", None))
    if dtype_name is not None:
        return ConstantVariable(dtype_name)
    if v.is_constant() and not _plain_constant(v.as_constant()):
        raise GraphBreak(f"a {type(v.as_constant()).__name__} passed to NumPy")
    return v


def _plain_constant(value) -> bool:
    """A Python value NumPy and torch._numpy read the same way."""
    if isinstance(value, (tuple, list)):
        return all(_plain_constant(v) for v in value)
    return type(value) in (int, float, bool, complex, str, type(None), slice, type(Ellipsis))


def numpy_dtype_name(value) -> str | None:
    """``'float32'`` for ``np.float32``, ``np.dtype('float32')`` or the string itself."""
    np = numpy_module()
    if np is None or value is None or isinstance(value, (str, bool, int, float)):
        return None
    if isinstance(value, np.dtype) or (isinstance(value, type) and issubclass(value, np.generic)):
        return np.dtype(value).name
    return None


def call_numpy_function(tx, fn, args, kwargs) -> Variable | None:
    """``numpy.<name>(...)``, traced where an argument is a traced ndarray or the function
    makes a new array; None where NumPy should run as before (Python values only)."""
    arrays = [a for a in [*args, *kwargs.values()] if _holds_ndarray(a)]
    name = numpy_name(fn)
    if not arrays and name not in CREATION:
        return None
    return call_numpy(tx, numpy_function(name), args, kwargs, name)


def _holds_ndarray(v: Variable) -> bool:
    if isinstance(v, NumpyArrayVariable):
        return True
    if isinstance(v, SequenceVariable):
        return any(_holds_ndarray(i) for i in v.items)
    return False


def call_operator(tx, op, args: list[Variable]) -> Variable:
    """A Python operator with an ndarray operand."""
    if op in IN_PLACE_OPERATORS:
        raise GraphBreak("an in-place operator on an ndarray (it writes the array's memory)")
    if op is operator.contains:
        raise GraphBreak("`in` on an ndarray needs its data")
    if op is operator.getitem:
        return args[0].getitem(tx, args[1])
    scalar = all(not isinstance(a, NumpyArrayVariable) or a.scalar for a in args)
    return call_numpy(tx, ndarray_operator(op), args, {}, op.__name__, scalar)


def tensor_numpy(tx, tensor: TensorVariable, args, kwargs) -> Variable:
    """``t.numpy()``: an ndarray over ``t``, where NumPy can hold ``t`` as it is."""
    example = tensor.example
    if numpy_module() is None:
        raise GraphBreak("Tensor.numpy() without NumPy imported")
    if args or kwargs:
        raise GraphBreak("Tensor.numpy() with arguments")
    if tensor.cls is not torch.Tensor or example.device.type != "cpu":
        raise GraphBreak("Tensor.numpy() of a tensor that is not a plain CPU tensor")
    if example.requires_grad:
        raise GraphBreak("Tensor.numpy() of a tensor that requires grad (eagerly an error)")
    try:
        numpy_module().dtype(str(example.dtype).removeprefix("torch."))
    except TypeError:
        raise GraphBreak(f"Tensor.numpy() of a {example.dtype} tensor") from None
    return NumpyArrayVariable(tensor)


TENSOR_FROM_NDARRAY = {torch.from_numpy, torch.as_tensor, torch.asarray}


def tensor_from_ndarray(tx, fn, args, kwargs) -> Variable:
    """``torch.from_numpy(a)`` / ``torch.as_tensor(a, dtype=...)`` of a traced ndarray: a
    tensor over the ndarray's tensor."""
    array = args[0]
    if len(args) != 1 or (fn is torch.from_numpy and (kwargs or array.scalar)):
        raise GraphBreak(f"torch.{fn.__name__}() of an ndarray with these arguments")
    if any(isinstance(v, NumpyArrayVariable) for v in kwargs.values()):
        raise GraphBreak(f"torch.{fn.__name__}() with an ndarray keyword")
    tensor = tx.output.call_graph("call_method", "detach", [array.tensor], {})
    if kwargs:
        tensor = tx.output.call_graph("call_function", torch.as_tensor, [tensor], kwargs)
    return tensor


class NumpyFunctionVariable(Variable):
    """A function of the ``numpy`` namespace that is traced (``np.sin``, ``np.sum``)."""

    def __init__(self, fn, fallback: Variable, source=None):
        self.fn = fn
        self.fallback = fallback  # what the function is without tracing: called otherwise
        self.source = source

    def python_type(self):
        return type(self.fn)

    def describe(self) -> str:
        return f"numpy.{numpy_name(self.fn)}"  # numpy.linalg.norm: its submodule too

    def identity_key(self):
        return ("object", id(self.fn))

    def call(self, tx, args, kwargs):
        result = call_numpy_function(tx, self.fn, args, kwargs)
        if result is None:
            return self.fallback.call(tx, args, kwargs)
        return result

    def getattr(self, tx, name):
        return self.fallback.getattr(tx, name)

    def reconstruct(self, cg) -> None:
        if self.source is not None:
            self.source.emit(cg)
            return
        self.fallback.reconstruct(cg)
