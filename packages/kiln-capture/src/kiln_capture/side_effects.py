"""Python side effects seen during capture, replayed by the generated code after the graph.

Containers from outside the frame that were mutated are written back whole
(``lst[:] = [...]``, ``d.clear(); d.update({...})``), iterators advanced by what was taken
from them; attribute, global and closure-cell
writes are replayed as stores. Reads after a write see the pending value.
"""

from __future__ import annotations


class SideEffects:
    def __init__(self):
        self.mutated: dict[int, object] = {}
        self.attr_stores: dict[int, tuple[object, dict]] = {}
        self.cell_stores: dict[int, tuple[object, object]] = {}
        self.global_stores: dict[tuple[int, str], tuple[dict, str, object]] = {}

    def mutate(self, container) -> None:
        if container.source is not None:
            self.mutated[id(container)] = container

    def store_attr(self, obj, name: str, value) -> None:
        self.attr_stores.setdefault(id(obj), (obj, {}))[1][name] = value

    def pending_attr(self, obj, name: str):
        entry = self.attr_stores.get(id(obj))
        return entry[1].get(name) if entry else None

    def store_cell(self, cell, value) -> None:
        self.cell_stores[id(cell)] = (cell, value)

    def store_global(self, f_globals: dict, name: str, value) -> None:
        self.global_stores[(id(f_globals), name)] = (f_globals, name, value)

    def pending_global(self, f_globals: dict, name: str):
        entry = self.global_stores.get((id(f_globals), name))
        return entry[2] if entry else None

    def is_empty(self) -> bool:
        return not (self.mutated or self.attr_stores or self.cell_stores or self.global_stores)

    def stored_values(self) -> list:
        """Every variable that the replay writes somewhere (graph outputs may be among them)."""
        values = []
        for container in self.mutated.values():
            values.append(container)
        for _, attrs in self.attr_stores.values():
            values.extend(attrs.values())
        values.extend(value for _, value in self.cell_stores.values())
        values.extend(value for _, _, value in self.global_stores.values())
        return values

    def replay(self, cg, root_globals: dict) -> None:
        from kiln_capture.variables.containers import DictVariable, ListVariable, SetVariable

        for container in self.mutated.values():
            if isinstance(container, ListVariable):
                cg.build_sequence(list, container.items)
                container.source.emit(cg)
                cg.load_const(slice(None))
                cg.store_subscr()
            elif isinstance(container, (DictVariable, SetVariable)):
                # the new contents are built first: they may be read from the container
                fresh = (
                    DictVariable(container.entries)
                    if isinstance(container, DictVariable)
                    else SetVariable(list(container.members.values()))
                )
                cg.reconstruct(fresh)
                cg.store_temp("___contents")
                container.source.emit(cg)
                cg.call_method_on_tos("clear", [])
                cg.pop_top()
                container.source.emit(cg)
                cg.call_method_on_tos("update", [TempVariable("___contents")])
                cg.pop_top()
            else:  # it knows how to write itself back (an iterator advances)
                container.replay(cg)
        for obj, attrs in self.attr_stores.values():
            for name, value in attrs.items():
                cg.reconstruct(value)
                obj.source.emit(cg)
                cg.store_attr(name)
        for cell, value in self.cell_stores.values():
            cg.reconstruct(value)
            # a resume function's cell is its argument: a constant would be the first call's
            cg.load_cell(cell)
            cg.store_attr("cell_contents")
        for f_globals, name, value in self.global_stores.values():
            cg.reconstruct(value)
            if f_globals is root_globals:
                cg.store_global(name)
            else:
                cg.load_const(f_globals)
                cg.load_const(name)
                cg.store_subscr()


class TempVariable:
    """A value the generated code keeps in a temporary local."""

    mutable = False
    source = None

    def __init__(self, name: str):
        self.name = name

    def reconstruct(self, cg) -> None:
        cg.load_temp(self.name)
