"""The per-call fast path: a generated ``__call__`` with the captured function's own
parameters and every cache entry's guards inlined, newest first.

    def ___bind(___captured):
        def __call__(x, y, *, scale=___d2):
            if (___e0_grad_enabled() is True) and (type(x) is ___e0_T5 and ...):
                return ___run0(x, y, scale=scale)
            return ___captured.cache_miss((x, y), {'scale': scale})
        return __call__

(a module's ``forward`` is dispatched by ``def __call__(___captured, x)``, ``___captured``
standing where ``self`` stands).

The graph of an entry is called from here, on the inputs the guards have read (bound to
names as they are read: ``(___r0_1 := self._parameters['weight'])``), and the rest of
the transformed code runs as its epilogue, ``___epilogue0(___graph0(x, ___r0_1), x, y,
scale=scale)``; an entry whose code only returns one output of its graph is called as
``___graph0(x, ___r0_1)[0]``: no transformed frame at all.
"""

from __future__ import annotations

import inspect
import re
import weakref
from collections import Counter
from dataclasses import dataclass


@dataclass
class Signature:
    declared: list[str]  # the parameter list of __call__
    positional: list[str]  # expressions passed positionally
    keywords: list[str]  # "'name': name" or "**kwargs"
    first: str | None  # the bound parameter (a module's self), if any
    scope: dict

    def call_args(self) -> str:
        keyword_args = [
            k if k.startswith("**") else f"{k.split(': ')[1]}={k.split(': ')[1]}"
            for k in self.keywords
        ]
        return ", ".join([*self.positional, *keyword_args])


def read_signature(fn, bound: bool) -> Signature | None:
    parameters = list(inspect.signature(fn, follow_wrapped=False).parameters.values())
    scope: dict = {}
    declared, positional, keywords = [], [], []
    star_seen = False
    for i, p in enumerate(parameters):
        text = p.name
        if p.default is not p.empty:
            scope[f"___d{i}"] = p.default
            text += f"=___d{i}"
        if p.kind is p.VAR_POSITIONAL:
            declared.append("*" + p.name)
            positional.append("*" + p.name)
            star_seen = True
        elif p.kind is p.VAR_KEYWORD:
            declared.append("**" + p.name)
            keywords.append("**" + p.name)
        elif p.kind is p.KEYWORD_ONLY:
            if not star_seen:
                declared.append("*")
                star_seen = True
            declared.append(text)
            keywords.append(f"{p.name!r}: {p.name}")
        else:
            declared.append(text)
            positional.append(p.name)
    first = None
    if bound:
        if not positional or positional[0].startswith("*"):
            return None
        first = positional[0]
        declared = [d for d in declared if d.split("=")[0] != first]
    return Signature(declared, positional, keywords, first, scope)


class SharedReads:
    """Reads of guarded values, shared across one entry's guards: the first occurrence of an
    expression that has a base (``self._modules['a']``) binds it with ``:=``, later ones use
    the name. Occurrences are rewritten left to right, the order in which the ``and`` chain
    evaluates them, so a name is always bound before it is used. After :meth:`plan`, only
    the reads used more than once are bound (a name costs two instructions)."""

    def __init__(self, sources: dict, prefix: str):
        self.sources = sources
        self.prefix = prefix
        self.names: dict[str, str] = {}
        self.shared: set[str] | None = None  # the reads bound to names; None: every read
        self.ordered = sorted(sources, key=len, reverse=True)  # a read after its bases
        self.tree = _ChunkTree(sources)
        self.found: dict[str, list] = {}  # code -> its reads: planned, then rewritten

    def occurrences(self, code: str) -> list:
        found = self.found.get(code)
        if found is None:
            if code in self.sources and self.tree.fallback is None:
                # a read itself (a state tensor, a graph input): the longest read that
                # starts at its first name is all of it
                found = self.found[code] = [(0, len(code), code)]
            else:
                found = self.found[code] = list(self.tree.occurrences(code))
        return found

    def plan(self, codes: list[str]) -> None:
        """Count the reads of ``codes`` (what will be rewritten, in order): a read is used
        once per occurrence and once by each read built on it that is used at all."""
        uses = Counter()
        for code in codes:
            for found in self.matches(code):
                uses[found] += 1
        for expr in self.ordered:  # a read is longer than its base: counted before it
            base = getattr(self.sources[expr], "base", None)
            if uses[expr] and base is not None:
                uses[base.expr()] += 1
        self.shared = {expr for expr, count in uses.items() if count > 1}

    def reference(self, expr: str) -> str:
        if expr in self.names:
            return self.names[expr]
        source = self.sources[expr]
        base = getattr(source, "base", None)
        if base is None:
            return expr  # an argument, a global dict: already a name
        read = source.over(self.reference(base.expr()))  # may bind names of its own first
        if self.shared is not None and expr not in self.shared:
            return read  # read once: no name
        name = f"{self.prefix}{len(self.names)}"
        self.names[expr] = name
        return f"({name} := {read})"

    def matches(self, code: str):
        """The guarded expressions ``code`` reads, left to right (the longest at each place)."""
        for _, _, expr in self.occurrences(code):
            yield expr

    def rewrite(self, code: str) -> str:
        parts, done = [], 0
        for start, end, expr in self.occurrences(code):
            parts += [code[done:start], self.reference(expr)]
            done = end
        return "".join(parts) + code[done:] if parts else code


_CHUNK = re.compile(r"\W\w*")  # one step of a read: ``.attr``, ``['key``, ``]``, ``(``, ...


class _ChunkTree:
    """The guarded expressions as a tree of their steps, to find them in guard code: an
    expression counts where no name or attribute goes on before it or after it (``x`` is
    not read in ``x_1`` or ``a.x``), and at each place the longest one is meant. (One regex
    alternation of every expression did the same, but compiling it cost a tenth of a second
    for a 12-layer model.) A step ends where a name ends, so a match found by whole steps is
    never followed by a name character."""

    def __init__(self, sources):
        self.root: dict = {}
        self.fallback = None  # the alternation, where an expression does not start with a name
        for expr in sources:
            head = re.match(r"\w+", expr)
            if head is None:
                alternatives = "|".join(map(re.escape, sorted(sources, key=len, reverse=True)))
                self.fallback = re.compile(rf"(?<![\w.])(?:{alternatives})(?!\w)")
                return
            node = self.root.setdefault(head.group(), {})
            for step in _CHUNK.findall(expr, head.end()):
                node = node.setdefault(step, {})
            node[None] = expr
        # where a read can start: a name of the tree's first level that is not an attribute
        # (the rest of a guard's names, ``type``, ``and``, constants, are never looked at)
        heads = "|".join(map(re.escape, sorted(self.root, key=len, reverse=True)))
        self.heads = re.compile(rf"(?<![\w.])(?:{heads})(?!\w)") if heads else None

    def occurrences(self, code: str):
        """``(start, end, expression)`` of each read in ``code``, left to right."""
        if self.fallback is not None:
            for found in self.fallback.finditer(code):
                yield found.start(), found.end(), found.group(0)
            return
        if self.heads is None:
            return
        done = 0
        for head in self.heads.finditer(code):
            if head.start() < done:
                continue
            node = self.root[head.group()]
            found, end, at = node.get(None), head.end(), head.end()
            while (step := _CHUNK.match(code, at)) is not None:
                node = node.get(step.group())
                if node is None:
                    break
                at = step.end()
                if None in node:
                    found, end = node[None], at
            if found is not None:
                yield head.start(), end, found
                done = end


def _renamer(n: int, names):
    """Give entry ``n``'s guard constants names of their own (parameters keep theirs)."""
    pattern = re.compile(r"\b___([A-Za-z][A-Za-z0-9_]*)")

    def rename(code: str) -> str:
        return pattern.sub(
            lambda m: f"___e{n}_{m.group(1)}" if m.group(0) in names else m.group(0), code
        )

    return rename


def graph_inputs(result) -> list[str] | None:
    """The expressions of the graph inputs where the dispatcher calls the graph itself
    (every input is read by a guard), else None."""
    found = result.direct or result.after_graph
    if found is None or not all(expr in result.guard.sources for expr in found[1]):
        return None
    return list(found[1])


def graph_call(
    n: int, result, sig: Signature, shared: SharedReads, rename, scope: dict
) -> str | None:
    """Entry ``n``'s action as a call of its graph on the inputs its guards read (each
    was bound to a name by the guard's shared reads, as ``shared`` names it): the graph's
    output when that is what the frame returns, else the epilogue of the transformed code
    on the graph's outputs. None when the entry has no graph, or an input no guard reads."""
    found = result.direct or result.after_graph
    if graph_inputs(result) is None:
        return None
    compiled, expressions, then = found
    scope[f"___graph{n}"] = compiled
    inputs = ", ".join(rename(shared.rewrite(expr)) for expr in expressions)
    graph = f"___graph{n}({inputs})"
    if result.direct is not None:
        return f"{graph}[{then}]"
    scope[f"___epilogue{n}"] = then
    return f"___epilogue{n}({graph}, {sig.call_args()})"


def make_call(fn, captured, bound: bool, entries=()):
    """The ``__call__`` of ``captured`` (the capture of ``fn``) over its cache ``entries``
    (newest first), as its class holds it; with ``bound``, the first parameter is the object
    the capture is bound to. None when the signature cannot be written out (the generic path
    is used).

    A bound capture's dispatcher takes ``___captured`` where the method takes ``self``; an
    unbound one is a static method that reads it from its closure, so that a call with too
    many arguments counts them as calling ``fn`` would ("f() takes 2 positional arguments
    but 3 were given")."""
    sig = read_signature(fn, bound)
    if sig is None:
        return None
    scope = dict(sig.scope)
    call_args = sig.call_args()
    params = ", ".join(["___captured", *sig.declared] if bound else sig.declared)
    lines = [f"def __call__({params}):"]
    if sig.first is not None:
        lines.append(f"    {sig.first} = ___captured.bound_self")
    for n, entry in enumerate(entries):
        guard = entry.result.guard
        rename = _renamer(n, guard.scope)
        scope.update({rename(k): v for k, v in guard.scope.items() if k.startswith("___")})
        shared = SharedReads(guard.sources, prefix=f"___r{n}_")
        shared.plan(
            [g.code for g in guard.inline_lines]
            + list(guard.tensor_exprs)
            + (graph_inputs(entry.result) or [])
        )
        checks = [f"({rename(shared.rewrite(g.code))})" for g in guard.inline_lines]
        if guard.tensor_exprs:  # the parameters and buffers, in one call after the rest
            tensors = ", ".join(shared.rewrite(expr) for expr in guard.tensor_exprs)
            checks.append(rename(f"___tensors_match({tensors})"))
        condition = " and ".join(checks) or "True"
        action = graph_call(n, entry.result, sig, shared, rename, scope)
        if action is None:
            scope[f"___run{n}"] = entry.result.function
            action = f"___run{n}({call_args})"
        lines += [f"    if {condition}:", f"        return {action}"]
    args_tuple = f"({', '.join(sig.positional)},)" if sig.positional else "()"
    kwargs_dict = "{" + ", ".join(sig.keywords) + "}"
    lines.append(f"    return ___captured.cache_miss({args_tuple}, {kwargs_dict})")
    if not bound:  # ___captured from a closure: the dispatcher takes fn's parameters only
        lines = ["def ___bind(___captured):", *("    " + line for line in lines)]
        lines.append("    return __call__")
    source = "\n".join(lines) + "\n"
    exec(compile(source, f"<kiln dispatch {fn.__qualname__}>", "exec"), scope)  # noqa: S102
    # a weak reference: the class holding the dispatcher must not keep its capture alive
    call = scope["__call__"] if bound else scope["___bind"](weakref.proxy(captured))
    # a call with wrong arguments is reported under the user's function's name ("f()
    # missing 1 required positional argument: 'y'"), as calling it would be
    call.__qualname__ = fn.__qualname__
    call.__kiln_source__ = source
    return call if bound else staticmethod(call)
