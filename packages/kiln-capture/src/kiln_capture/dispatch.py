"""The per-call fast path: a generated ``__call__`` with the captured function's own
parameters, so that CPython binds the arguments once and no ``*args`` tuple is built.

    def __call__(___captured, x, y, *, scale=___d2):
        for ___check, ___run in ___captured.dispatch:
            if ___check(x, y, scale=scale):
                return ___run(x, y, scale=scale)
        return ___captured.cache_miss((x, y), {'scale': scale})
"""

from __future__ import annotations

import inspect


def make_call(fn, bound: bool):
    """``__call__`` for a captured ``fn``; with ``bound``, its first parameter is the
    object the capture is bound to (a module's ``self``)."""
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
            continue
        if p.kind is p.VAR_KEYWORD:
            declared.append("**" + p.name)
            keywords.append("**" + p.name)
            continue
        if p.kind is p.KEYWORD_ONLY:
            if not star_seen:
                declared.append("*")
                star_seen = True
            declared.append(text)
            keywords.append(f"{p.name!r}: {p.name}")
            continue
        declared.append(text)
        positional.append(p.name)
    if bound:
        if not positional or positional[0].startswith("*"):
            return None
        first = positional[0]
        declared = [d for d in declared if d.split("=")[0] != first]
        positional[0] = "___captured.bound_self"
    call_args = ", ".join([*positional, *(k if k.startswith("**") else
                                          f"{k.split(': ')[1]}={k.split(': ')[1]}"
                                          for k in keywords)])
    args_tuple = f"({', '.join(positional)},)" if positional else "()"
    kwargs_dict = "{" + ", ".join(keywords) + "}"
    source = (
        f"def __call__(___captured, {', '.join(declared)}):\n"
        f"    for ___check, ___run in ___captured.dispatch:\n"
        f"        if ___check({call_args}):\n"
        f"            return ___run({call_args})\n"
        f"    return ___captured.cache_miss({args_tuple}, {kwargs_dict})\n"
    )
    exec(compile(source, f"<kiln dispatch {fn.__qualname__}>", "exec"), scope)  # noqa: S102
    call = scope["__call__"]
    call.__kiln_source__ = source
    return call
