"""Tuples, lists, dicts, sets and iterators over them.

Lists, dicts and sets are mutable: one variable stands for one object, so a mutation is
seen through every reference. A mutated container that came from outside the frame (it has
a source) is written back after the graph runs (see ``side_effects``).
"""

from __future__ import annotations

from kiln_capture.exc import GraphBreak, UserError
from kiln_capture.variables.base import Variable
from kiln_capture.variables.constant import ConstantVariable


def constant_key(tx, key: Variable):
    """The Python value used to index a dict or set by ``key``."""
    if key.is_constant():
        return key.as_constant()
    identity = getattr(key, "identity_key", None)
    if identity is not None:
        return identity()
    raise GraphBreak(f"{key.describe()} as a dict key or set member")


def mapping_pairs(tx, source, kwargs: dict) -> list[tuple[Variable, Variable]]:
    """The (key, value) pairs of ``dict(source, **kwargs)`` / ``d.update(source, **kwargs)``."""
    pairs = []
    if isinstance(source, DictVariable):
        pairs = list(source.entries.values())
    elif source is not None:
        pairs = [tuple(p.unpack(tx)) for p in source.unpack(tx)]
    return pairs + [(ConstantVariable(k), v) for k, v in kwargs.items()]


def reload_from_source(container: Variable, cg) -> bool:
    """Push a list, dict or set from outside the frame as the object itself (the replay
    writes back what the frame changed in it): a copy would take the changes made through
    it after the graph (``out.append(f(x))`` where ``f`` breaks) away from the caller's
    object. False for one made in the frame."""
    if container.source is None:
        return False
    container.source.emit(cg)
    return True


def all_constant(items) -> bool:
    return all(v.is_constant() for v in items)


class SequenceVariable(Variable):
    python_cls: type = tuple

    def __init__(self, items: list[Variable], source=None):
        self.items = list(items)
        self.source = source

    def python_type(self) -> type:
        return self.python_cls

    def is_constant(self) -> bool:
        return not self.mutable and all_constant(self.items)

    def as_constant(self):
        return self.python_cls(v.as_constant() for v in self.items)

    def describe(self) -> str:
        return f"a {self.python_cls.__name__} of {len(self.items)}"

    def unpack(self, tx):
        return list(self.items)

    def truthy(self, tx) -> bool:
        return bool(self.items)

    def getitem(self, tx, key: Variable) -> Variable:
        index = key.as_constant()
        if isinstance(index, slice):
            return type(self)(self.items[index])
        try:
            return self.items[index]
        except (IndexError, TypeError) as exc:
            raise UserError(exc) from None

    def contains(self, tx, value: Variable) -> bool:
        from kiln_capture.variables.ops import compare_equal

        return any(compare_equal(tx, item, value) for item in self.items)

    def call_method(self, tx, name, args, kwargs):
        if name == "__getitem__":
            return self.getitem(tx, args[0])
        if name == "__len__":
            return ConstantVariable(len(self.items))
        if name == "__contains__":
            return ConstantVariable(self.contains(tx, args[0]))
        if name == "index" and all_constant(self.items + args):
            return ConstantVariable(
                tx.run_user_code(self.as_constant().index, args[0].as_constant())
            )
        if name == "count" and all_constant(self.items + args):
            return ConstantVariable(self.as_constant().count(args[0].as_constant()))
        return super().call_method(tx, name, args, kwargs)

    def reconstruct(self, cg) -> None:
        for item in self.items:
            item.reconstruct(cg)
        cg.build(self.python_cls, len(self.items))


class TupleVariable(SequenceVariable):
    python_cls = tuple


class NamedTupleVariable(TupleVariable):
    """An instance of a ``typing.NamedTuple``/``collections.namedtuple`` class."""

    def __init__(self, items, cls: type, source=None):
        super().__init__(items, source)
        self.python_cls = cls

    def as_constant(self):
        if not hasattr(self.python_cls, "_fields"):
            return self.python_cls(tuple(v.as_constant() for v in self.items))
        return self.python_cls(*(v.as_constant() for v in self.items))

    def fields(self) -> tuple[str, ...]:
        cls = self.python_cls
        return getattr(cls, "_fields", None) or cls.__match_args__  # struct sequences

    def getattr(self, tx, name):
        fields = self.fields()
        if name in fields:
            return self.items[fields.index(name)]
        return super().getattr(tx, name)

    def getitem(self, tx, key):
        index = key.as_constant()
        if isinstance(index, slice):
            return TupleVariable(self.items[index])
        return super().getitem(tx, key)

    def reconstruct(self, cg) -> None:
        if hasattr(self.python_cls, "_fields"):
            cg.call_object(self.python_cls, self.items)
        else:  # a struct sequence takes one tuple
            cg.call_object(self.python_cls, [TupleVariable(self.items)])


class SizeVariable(TupleVariable):
    """``tensor.shape``: a tuple of ints (or SymInts) of class ``torch.Size``."""

    def __init__(self, items, source=None):
        import torch

        super().__init__(items, source)
        self.python_cls = torch.Size

    def getitem(self, tx, key):
        index = key.as_constant()
        if isinstance(index, slice):
            return SizeVariable(self.items[index])
        return super().getitem(tx, key)

    def call_method(self, tx, name, args, kwargs):
        if name == "numel":
            from kiln_capture.variables.ops import product

            return product(tx, self.items)
        return super().call_method(tx, name, args, kwargs)

    def reconstruct(self, cg) -> None:
        cg.call_object(self.python_cls, [TupleVariable(self.items)])


class SliceVariable(TupleVariable):
    """A slice with a symbolic or tensor bound."""

    def __init__(self, parts):
        super().__init__(parts)
        self.parts = parts
        self.python_cls = slice

    def reconstruct(self, cg) -> None:
        cg.call_object(slice, self.parts)


class ListVariable(SequenceVariable):
    python_cls = list
    mutable = True

    def mutated(self, tx) -> None:
        tx.side_effects.mutate(self)

    def call_method(self, tx, name, args, kwargs):
        items = self.items
        if name == "append":
            self.mutated(tx)
            items.append(args[0])
        elif name == "extend":
            self.mutated(tx)
            items.extend(args[0].unpack(tx))
        elif name == "insert":
            self.mutated(tx)
            items.insert(args[0].as_constant(), args[1])
        elif name == "pop":
            index = args[0].as_constant() if args else -1
            if not items:
                raise UserError(IndexError("pop from empty list"))
            self.mutated(tx)
            return items.pop(index)
        elif name == "clear":
            self.mutated(tx)
            items.clear()
        elif name == "reverse":
            self.mutated(tx)
            items.reverse()
        elif name == "remove":
            from kiln_capture.variables.ops import compare_equal

            for i, item in enumerate(items):
                if compare_equal(tx, item, args[0]):
                    self.mutated(tx)
                    del items[i]
                    break
            else:
                raise UserError(ValueError("list.remove(x): x not in list"))
        elif name == "sort":
            key = kwargs.get("key")
            reverse = kwargs.get("reverse", ConstantVariable(False)).as_constant()
            from kiln_capture.variables.ops import sort_variables

            self.mutated(tx)
            items[:] = sort_variables(tx, items, key, reverse)
        elif name == "copy":
            return ListVariable(items)
        elif name == "__setitem__":
            self.setitem(tx, args[0], args[1])
        elif name == "__delitem__":
            self.mutated(tx)
            del items[args[0].as_constant()]
        elif name == "__iadd__":
            self.mutated(tx)
            items.extend(args[0].unpack(tx))
            return self
        else:
            return super().call_method(tx, name, args, kwargs)
        return ConstantVariable(None)

    def setitem(self, tx, key, value) -> None:
        self.mutated(tx)
        index = key.as_constant()
        if isinstance(index, slice):
            self.items[index] = value.unpack(tx)
        else:
            try:
                self.items[index] = value
            except IndexError as exc:
                raise UserError(exc) from None

    def reconstruct(self, cg) -> None:
        if not reload_from_source(self, cg):
            super().reconstruct(cg)


class DictVariable(Variable):
    """A dict (or ``OrderedDict``, ``defaultdict`` is not supported) keyed by constants."""

    mutable = True

    def __init__(self, entries: dict, source=None, cls: type = dict):
        # key -> (key variable, value variable), in insertion order
        self.entries: dict = dict(entries)
        self.source = source
        self.python_cls = cls

    @classmethod
    def from_pairs(cls, tx, pairs, **kw):
        entries = {}
        for key, value in pairs:
            entries[constant_key(tx, key)] = (key, value)
        return cls(entries, **kw)

    def python_type(self):
        return self.python_cls

    def describe(self) -> str:
        return f"a {self.python_cls.__name__} of {len(self.entries)}"

    def mutated(self, tx) -> None:
        tx.side_effects.mutate(self)

    def keys(self) -> list[Variable]:
        return [k for k, _ in self.entries.values()]

    def values(self) -> list[Variable]:
        return [v for _, v in self.entries.values()]

    def unpack(self, tx):
        return self.keys()

    def truthy(self, tx) -> bool:
        return bool(self.entries)

    def lookup(self, tx, key: Variable) -> Variable:
        k = constant_key(tx, key)
        if k not in self.entries:
            raise UserError(KeyError(k))
        return self.entries[k][1]

    def getitem(self, tx, key):
        return self.lookup(tx, key)

    def setitem(self, tx, key, value) -> None:
        self.mutated(tx)
        k = constant_key(tx, key)
        self.entries[k] = (self.entries[k][0] if k in self.entries else key, value)

    def call_method(self, tx, name, args, kwargs):
        entries = self.entries
        if name == "__getitem__":
            return self.lookup(tx, args[0])
        if name == "__setitem__":
            self.setitem(tx, args[0], args[1])
            return ConstantVariable(None)
        if name == "__delitem__":
            self.mutated(tx)
            k = constant_key(tx, args[0])
            if k not in entries:
                raise UserError(KeyError(k))
            del entries[k]
            return ConstantVariable(None)
        if name == "__contains__":
            return ConstantVariable(constant_key(tx, args[0]) in entries)
        if name == "__len__":
            return ConstantVariable(len(entries))
        if name == "get":
            k = constant_key(tx, args[0])
            default = args[1] if len(args) > 1 else ConstantVariable(None)
            return entries[k][1] if k in entries else default
        if name in DictViewVariable.KINDS:
            return DictViewVariable(self, name)
        if name == "pop":
            k = constant_key(tx, args[0])
            if k in entries:
                self.mutated(tx)
                return entries.pop(k)[1]
            if len(args) > 1:
                return args[1]
            raise UserError(KeyError(k))
        if name == "setdefault":
            k = constant_key(tx, args[0])
            if k not in entries:
                self.setitem(tx, args[0], args[1] if len(args) > 1 else ConstantVariable(None))
            return entries[k][1]
        if name == "update":
            pairs = mapping_pairs(tx, args[0] if args else None, kwargs)
            for key, value in pairs:
                self.setitem(tx, key, value)
            if not pairs:
                self.mutated(tx)
            return ConstantVariable(None)
        if name == "clear":
            self.mutated(tx)
            entries.clear()
            return ConstantVariable(None)
        if name == "copy":
            return DictVariable(entries, cls=self.python_cls)
        return super().call_method(tx, name, args, kwargs)

    def reconstruct(self, cg) -> None:
        if reload_from_source(self, cg):
            return
        if self.python_cls is not dict:
            cg.call_object(self.python_cls, [DictVariable(self.entries)])
            return
        for key, value in self.entries.values():
            key.reconstruct(cg)
            value.reconstruct(cg)
        cg.build(dict, len(self.entries))


SET_ALGEBRA = {
    "union",
    "intersection",
    "difference",
    "symmetric_difference",
    "__or__",
    "__and__",
    "__sub__",
    "__xor__",
    "issubset",
    "issuperset",
}


class SetVariable(Variable):
    mutable = True

    def __init__(self, items: list[Variable], source=None, cls: type = set):
        self.members: dict = {}
        self.source = source
        self.python_cls = cls
        for item in items:
            self.members.setdefault(constant_key(None, item), item)

    def python_type(self):
        return self.python_cls

    def is_constant(self) -> bool:
        return self.python_cls is frozenset and all_constant(self.members.values())

    def as_constant(self):
        return self.python_cls(self.members)

    def mutated(self, tx) -> None:
        tx.side_effects.mutate(self)

    def unpack(self, tx):
        return list(self.members.values())

    def truthy(self, tx) -> bool:
        return bool(self.members)

    def call_method(self, tx, name, args, kwargs):
        members = self.members
        if name == "__contains__":
            return ConstantVariable(constant_key(tx, args[0]) in members)
        if name == "__len__":
            return ConstantVariable(len(members))
        if name == "add":
            self.mutated(tx)
            members.setdefault(constant_key(tx, args[0]), args[0])
            return ConstantVariable(None)
        if name in ("discard", "remove"):
            k = constant_key(tx, args[0])
            if k not in members and name == "remove":
                raise UserError(KeyError(k))
            self.mutated(tx)
            members.pop(k, None)
            return ConstantVariable(None)
        if name == "update":
            self.mutated(tx)
            for other in args:
                for item in other.unpack(tx):
                    members.setdefault(constant_key(tx, item), item)
            return ConstantVariable(None)
        known = all(isinstance(a, SetVariable) or a.is_constant() for a in args)
        if name in SET_ALGEBRA and known:
            others = [
                set(a.members) if isinstance(a, SetVariable) else set(a.as_constant()) for a in args
            ]
            result = getattr(set(members), name)(*others)
            if isinstance(result, bool):
                return ConstantVariable(result)
            pool = {k: v for a in args if isinstance(a, SetVariable) for k, v in a.members.items()}
            pool.update(members)
            return SetVariable([pool.get(k, ConstantVariable(k)) for k in result])
        return super().call_method(tx, name, args, kwargs)

    def reconstruct(self, cg) -> None:
        if reload_from_source(self, cg):
            return
        for item in self.members.values():
            item.reconstruct(cg)
        cg.build(set, len(self.members))
        if self.python_cls is frozenset:
            cg.wrap_call(frozenset)


class DictViewVariable(Variable):
    """``d.keys()``, ``d.values()``, ``d.items()``: a live view of a dict variable, as in
    Python: what is added to the dict after the view was taken is in the view."""

    KINDS = {"keys": type({}.keys()), "values": type({}.values()), "items": type({}.items())}

    def __init__(self, mapping: DictVariable, kind: str):
        self.mapping = mapping
        self.kind = kind

    def python_type(self):
        return self.KINDS[self.kind]

    def describe(self) -> str:
        return f"the {self.kind}() of {self.mapping.describe()}"

    def unpack(self, tx):
        if self.kind == "keys":
            return self.mapping.keys()
        if self.kind == "values":
            return self.mapping.values()
        return [TupleVariable([k, v]) for k, v in self.mapping.entries.values()]

    def truthy(self, tx) -> bool:
        return bool(self.mapping.entries)

    def call_method(self, tx, name, args, kwargs):
        if name == "__iter__":
            return ListIteratorVariable(self.unpack(tx))
        if name == "__len__":
            return ConstantVariable(len(self.mapping.entries))
        if name == "__contains__" and self.kind == "keys":
            return self.mapping.call_method(tx, "__contains__", args, {})
        if name == "__contains__":
            return ConstantVariable(TupleVariable(self.unpack(tx)).contains(tx, args[0]))
        return super().call_method(tx, name, args, kwargs)

    def reconstruct(self, cg) -> None:
        self.mapping.reconstruct(cg)
        cg.wrap_call(getattr(dict, self.kind))


class ListIteratorVariable(Variable):
    """An iterator over items known at capture time (lists, ranges, zip, enumerate, ...)."""

    mutable = True

    def __init__(self, items: list[Variable]):
        self.items = list(items)
        self.index = 0

    def python_type(self):
        return type(iter([]))

    def next(self, tx) -> Variable | None:
        if self.index >= len(self.items):
            return None
        self.index += 1
        return self.items[self.index - 1]

    def unpack(self, tx):
        rest = self.items[self.index :]
        self.index = len(self.items)
        return rest

    def call_method(self, tx, name, args, kwargs):
        if name == "__next__":
            item = self.next(tx)
            if item is None:
                raise UserError(StopIteration())
            return item
        if name == "__iter__":
            return self
        return super().call_method(tx, name, args, kwargs)

    def reconstruct(self, cg) -> None:
        TupleVariable(self.items[self.index :]).reconstruct(cg)
        cg.wrap_call(iter)


class ArgumentIteratorVariable(ListIteratorVariable):
    """A list or tuple iterator from outside the frame, over the items it had left (each
    read from ``___iterator_items(it)[i]``). The items the captured code takes are taken
    from the real iterator after the graph, so it ends where it would have eagerly."""

    def __init__(self, items: list[Variable], source):
        super().__init__(items)
        self.source = source

    def next(self, tx) -> Variable | None:
        tx.side_effects.mutate(self)
        return super().next(tx)

    def unpack(self, tx):
        tx.side_effects.mutate(self)
        return super().unpack(tx)

    def reconstruct(self, cg) -> None:
        self.source.emit(cg)  # the real iterator: advanced by the replay

    def replay(self, cg) -> None:
        from kiln_capture.sources import advance_iterator

        cg.call_object(advance_iterator, [self, ConstantVariable(self.index)])
        cg.pop_top()
