"""A module's walks of its tree inside captured code: ``modules()``, ``named_modules()``,
``children()``, ``parameters()``, ``buffers()`` and their named forms, each a list of the
module, parameter and buffer variables it yields (with their sources); and the other
``nn.Module`` methods that read or change the tree, which break the graph."""

from __future__ import annotations

from kiln_capture.exc import GraphBreak
from kiln_capture.variables.constant import ConstantVariable
from kiln_capture.variables.containers import TupleVariable


def _named(registry):
    def walk(module_var, tx, prefix="", recurse=True, remove_duplicate=True):
        seen, out = set(), []
        for name, value in module_var.members(
            tx, registry, prefix + "." if prefix else "", recurse
        ):
            if remove_duplicate and id(value) in seen:
                continue
            seen.add(id(value))
            out.append(TupleVariable([ConstantVariable(name), value]))
        return out

    return walk


def _values(registry):
    named = _named(registry)
    return lambda module_var, tx, recurse=True: [
        t.items[1] for t in named(module_var, tx, "", recurse)
    ]


def _named_modules(module_var, tx, memo=None, prefix="", remove_duplicate=True):
    """``named_modules()``: the module itself, then its descendants depth first."""
    if memo is not None:
        raise GraphBreak("Module.named_modules(memo=...) inside captured code")
    seen, out = set(), []

    def walk(var, name):
        if remove_duplicate and id(var.value) in seen:
            return
        seen.add(id(var.value))
        out.append(TupleVariable([ConstantVariable(name), var]))
        for key, child in var.value._modules.items():
            if child is not None:
                walk(var.read_attr(tx, key), f"{name}.{key}" if name else key)

    walk(module_var, prefix)
    return out


MODULE_WALKS = {
    "named_modules": _named_modules,
    "modules": lambda m, tx: [t.items[1] for t in _named_modules(m, tx)],
    "named_parameters": _named("_parameters"),
    "parameters": _values("_parameters"),
    "named_buffers": _named("_buffers"),
    "buffers": _values("_buffers"),
    "named_children": lambda m, tx: _named("_modules")(m, tx, "", False),
    "children": lambda m, tx: [t.items[1] for t in _named("_modules")(m, tx, "", False)],
}
# nn.Module methods that walk the module tree or its state: they run outside the graph.
MODULE_INTROSPECTION = {
    "parameters",
    "named_parameters",
    "buffers",
    "named_buffers",
    "children",
    "named_children",
    "modules",
    "named_modules",
    "state_dict",
    "load_state_dict",
    "apply",
    "register_buffer",
    "register_parameter",
    "add_module",
    "to",
    "cuda",
    "cpu",
    "zero_grad",
}
