"""Unary, binary, comparison, identity and membership operators."""

from __future__ import annotations

import operator

from kiln_capture.exc import UserError
from kiln_capture.variables.constant import ConstantVariable
from kiln_capture.variables.ndarray import NumpyArrayVariable
from kiln_capture.variables.ops import apply_operator, contains, is_graph_value, is_same
from kiln_capture.versions import handles

BINARY = {
    "ADD": operator.add,
    "AND": operator.and_,
    "FLOOR_DIVIDE": operator.floordiv,
    "LSHIFT": operator.lshift,
    "MATRIX_MULTIPLY": operator.matmul,
    "MULTIPLY": operator.mul,
    "REMAINDER": operator.mod,
    "OR": operator.or_,
    "POWER": operator.pow,
    "RSHIFT": operator.rshift,
    "SUBTRACT": operator.sub,
    "TRUE_DIVIDE": operator.truediv,
    "XOR": operator.xor,
    "INPLACE_ADD": operator.iadd,
    "INPLACE_AND": operator.iand,
    "INPLACE_FLOOR_DIVIDE": operator.ifloordiv,
    "INPLACE_LSHIFT": operator.ilshift,
    "INPLACE_MATRIX_MULTIPLY": operator.imatmul,
    "INPLACE_MULTIPLY": operator.imul,
    "INPLACE_REMAINDER": operator.imod,
    "INPLACE_OR": operator.ior,
    "INPLACE_POWER": operator.ipow,
    "INPLACE_RSHIFT": operator.irshift,
    "INPLACE_SUBTRACT": operator.isub,
    "INPLACE_TRUE_DIVIDE": operator.itruediv,
    "INPLACE_XOR": operator.ixor,
}
# In-place operators on immutable values behave like the plain ones.
INPLACE_TO_PLAIN = {
    operator.iadd: operator.add,
    operator.iand: operator.and_,
    operator.ifloordiv: operator.floordiv,
    operator.ilshift: operator.lshift,
    operator.imatmul: operator.matmul,
    operator.imul: operator.mul,
    operator.imod: operator.mod,
    operator.ior: operator.or_,
    operator.ipow: operator.pow,
    operator.irshift: operator.rshift,
    operator.isub: operator.sub,
    operator.itruediv: operator.truediv,
    operator.ixor: operator.xor,
}
COMPARE = {
    "LT": operator.lt,
    "LE": operator.le,
    "EQ": operator.eq,
    "NE": operator.ne,
    "GT": operator.gt,
    "GE": operator.ge,
}


def binary(tx, op, a, b):
    if isinstance(a, NumpyArrayVariable):  # `a += 1` writes the array: it has its own rule
        return apply_operator(tx, op, [a, b])
    if op in INPLACE_TO_PLAIN and not is_graph_value(a) and not getattr(a, "mutable", False):
        op = INPLACE_TO_PLAIN[op]
    if op in INPLACE_TO_PLAIN and not is_graph_value(a) and not is_graph_value(b):
        from kiln_capture.variables.containers import ListVariable

        if not isinstance(a, ListVariable):
            op = INPLACE_TO_PLAIN[op]
    return apply_operator(tx, op, [a, b])


@handles("BINARY_OP")
def binary_op(tx, inst):
    b = tx.pop()
    a = tx.pop()
    tx.push(binary(tx, BINARY[inst.arg.name], a, b))


@handles("COMPARE_OP")
def compare_op(tx, inst):
    b = tx.pop()
    a = tx.pop()
    name = getattr(inst.arg, "name", str(inst.arg)).replace("_CAST", "")
    result = apply_operator(tx, COMPARE[name], [a, b])
    if name.endswith("_CAST") or getattr(inst.arg, "name", "").endswith("_CAST"):
        result = ConstantVariable(result.truthy(tx))
    tx.push(result)


@handles("IS_OP")
def is_op(tx, inst):
    b = tx.pop()
    a = tx.pop()
    tx.push(ConstantVariable(is_same(tx, a, b) != bool(inst.arg)))


@handles("CONTAINS_OP")
def contains_op(tx, inst):
    container = tx.pop()
    item = tx.pop()
    if is_graph_value(container):
        result = container.call_method(tx, "__contains__", [item], {})
        tx.push(result)
        return
    tx.push(ConstantVariable(contains(tx, container, item) != bool(inst.arg)))


def unary(op):
    def handler(tx, inst):
        tx.push(apply_operator(tx, op, [tx.pop()]))

    return handler


handles("UNARY_NEGATIVE")(unary(operator.neg))
handles("UNARY_INVERT")(unary(operator.invert))
handles("UNARY_POSITIVE", max_version=(3, 11))(unary(operator.pos))


@handles("UNARY_NOT")
def unary_not(tx, inst):
    tx.push(ConstantVariable(not tx.pop().truthy(tx)))


@handles("TO_BOOL", min_version=(3, 13))
def to_bool(tx, inst):
    value = tx.pop()
    tx.push(ConstantVariable(value.truthy(tx)))


def raise_type_error(message):
    raise UserError(TypeError(message))
