"""Building tuples, lists, sets, dicts, strings and slices; unpacking."""

from __future__ import annotations

from kiln_capture.exc import GraphBreak, UserError
from kiln_capture.variables.constant import ConstantVariable
from kiln_capture.variables.containers import (
    DictVariable,
    ListVariable,
    SetVariable,
    SliceVariable,
    TupleVariable,
)
from kiln_capture.variables.ops import is_graph_value
from kiln_capture.versions import handles


@handles("BUILD_TUPLE")
def build_tuple(tx, inst):
    tx.push(TupleVariable(tx.popn(inst.arg)))


@handles("BUILD_LIST")
def build_list(tx, inst):
    tx.push(ListVariable(tx.popn(inst.arg)))


@handles("BUILD_SET")
def build_set(tx, inst):
    tx.push(SetVariable(tx.popn(inst.arg)))


@handles("BUILD_MAP")
def build_map(tx, inst):
    items = tx.popn(2 * inst.arg)
    tx.push(DictVariable.from_pairs(tx, zip(items[::2], items[1::2], strict=True)))


@handles("BUILD_CONST_KEY_MAP")
def build_const_key_map(tx, inst):
    keys = tx.pop().as_constant()
    values = tx.popn(inst.arg)
    tx.push(
        DictVariable.from_pairs(
            tx, [(ConstantVariable(k), v) for k, v in zip(keys, values, strict=True)]
        )
    )


@handles("LIST_APPEND")
def list_append(tx, inst):
    value = tx.pop()
    # as list.append: a list from outside the frame (a resume function's) is written back
    tx.peek(inst.arg).call_method(tx, "append", [value], {})


@handles("SET_ADD")
def set_add(tx, inst):
    value = tx.pop()
    tx.peek(inst.arg).call_method(tx, "add", [value], {})


@handles("MAP_ADD")
def map_add(tx, inst):
    value = tx.pop()
    key = tx.pop()
    tx.peek(inst.arg).setitem(tx, key, value)


@handles("LIST_EXTEND")
def list_extend(tx, inst):
    iterable = tx.pop()
    tx.peek(inst.arg).call_method(tx, "extend", [iterable], {})


@handles("SET_UPDATE")
def set_update(tx, inst):
    iterable = tx.pop()
    tx.peek(inst.arg).call_method(tx, "update", [iterable], {})


@handles("DICT_UPDATE", "DICT_MERGE")
def dict_update(tx, inst):
    other = tx.pop()
    target = tx.peek(inst.arg)
    if inst.name == "DICT_MERGE" and isinstance(other, DictVariable):
        dup = set(target.entries) & set(other.entries)
        if dup:
            raise UserError(
                TypeError(f"got multiple values for keyword argument {sorted(dup)[0]!r}")
            )
    if not isinstance(other, DictVariable):
        other = other.as_dict(tx) if hasattr(other, "as_dict") else other
    target.call_method(tx, "update", [other], {})


@handles("LIST_TO_TUPLE", max_version=(3, 11))
def list_to_tuple(tx, inst):
    tx.push(TupleVariable(tx.pop().items))


def make_slice(parts):
    if all(p.is_constant() for p in parts):
        return ConstantVariable(slice(*(p.as_constant() for p in parts)))
    return SliceVariable(parts)


@handles("BUILD_SLICE")
def build_slice(tx, inst):
    tx.push(make_slice(tx.popn(inst.arg)))


@handles("BUILD_STRING")
def build_string(tx, inst):
    parts = tx.popn(inst.arg)
    tx.push(ConstantVariable("".join(p.as_constant() for p in parts)))


CONVERSIONS = {0: None, 1: str, 2: repr, 3: ascii}


def _format(tx, value, spec: str, conversion):
    from kiln_capture.variables.tensor import SymNodeVariable

    if isinstance(value, SymNodeVariable):  # a size in a message: its value, guarded
        value = value.specialized()
    if is_graph_value(value):
        raise GraphBreak("formatting a tensor or symbolic value into a string")
    python = value.as_constant()
    if conversion is not None:
        python = conversion(python)
    return ConstantVariable(format(python, spec))


@handles("FORMAT_VALUE", max_version=(3, 12))
def format_value(tx, inst):
    flags = inst.arg
    spec = tx.pop().as_constant() if flags & 0x04 else ""
    value = tx.pop()
    tx.push(_format(tx, value, spec, CONVERSIONS[flags & 0x03]))


@handles("FORMAT_SIMPLE", min_version=(3, 13))
def format_simple(tx, inst):
    tx.push(_format(tx, tx.pop(), "", None))


@handles("FORMAT_WITH_SPEC", min_version=(3, 13))
def format_with_spec(tx, inst):
    spec = tx.pop().as_constant()
    tx.push(_format(tx, tx.pop(), spec, None))


@handles("CONVERT_VALUE", min_version=(3, 13))
def convert_value(tx, inst):
    value = tx.pop()
    tx.push(ConstantVariable(CONVERSIONS[int(inst.arg)](value.as_constant())))


@handles("UNPACK_SEQUENCE")
def unpack_sequence(tx, inst):
    items = tx.pop().unpack(tx)
    if len(items) != inst.arg:
        if len(items) > inst.arg:
            raise UserError(ValueError(f"too many values to unpack (expected {inst.arg})"))
        raise UserError(
            ValueError(f"not enough values to unpack (expected {inst.arg}, got {len(items)})")
        )
    for item in reversed(items):
        tx.push(item)


@handles("UNPACK_EX")
def unpack_ex(tx, inst):
    before, after = inst.arg & 0xFF, inst.arg >> 8
    items = tx.pop().unpack(tx)
    if len(items) < before + after:
        raise UserError(
            ValueError(
                f"not enough values to unpack (expected at least "
                f"{before + after}, got {len(items)})"
            )
        )
    middle = ListVariable(items[before : len(items) - after])
    for item in reversed(items[len(items) - after :]):
        tx.push(item)
    tx.push(middle)
    for item in reversed(items[:before]):
        tx.push(item)
