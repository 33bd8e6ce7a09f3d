"""Guards: the conditions under which a capture can be reused, as generated Python source.

Each guard is one line of Python over the captured function's arguments. The guard
function takes the same parameters as the captured function (so CPython binds the
arguments), checks the lines in order, and returns False at the first that fails. The same
lines, evaluated one by one, say which guard failed when a cache entry misses.
"""

from __future__ import annotations

import inspect
import math
import re
import types
from dataclasses import dataclass, field

import torch
from torch._guards import Source as TorchSource

from kiln_capture.sources import iterator_position, iterator_sequence, ndarray_tensor
from kiln_capture.tensor_match import TensorMatcher, TensorSpec, build_matcher


@dataclass(frozen=True)
class ShapeSource(TorchSource):
    """Names a tensor for torch's ShapeEnv, which prints size guards in terms of it."""

    expression: str

    @property
    def name(self) -> str:
        # torch reads ``source.name`` as a property in newer releases and calls it in older
        return _CallableStr(self.expression)

    def guard_source(self):
        from torch._guards import GuardSource

        return GuardSource.LOCAL


class _CallableStr(str):
    def __call__(self) -> str:
        return str(self)


def dispatch_keys(t: torch.Tensor) -> int:
    return torch._C._dispatch_keys(t).raw_repr()


def device_index(device: torch.device) -> int:
    """What ``Tensor.get_device()`` returns for a tensor on ``device`` (-1 on the CPU)."""
    return -1 if device.type == "cpu" else (device.index or 0)


# A module's own hook dicts: a guard reads them inline (a call per module costs more).
HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


def autocast_state():
    return tuple(torch.is_autocast_enabled(d) for d in ("cpu", "cuda"))


def fixed_scope(f_globals: dict, closure: tuple | None) -> dict:
    """The names every guard's scope has: the function's globals and closure, and the
    helpers guard lines call (the same objects in every capture)."""
    return dict(
        ___G=f_globals,
        ___closure=closure,
        ___dispatch_keys=torch._C._dispatch_keys,
        ___grad_enabled=torch.is_grad_enabled,
        ___default_dtype=torch.get_default_dtype,
        ___any_autocast=torch._C._is_any_autocast_enabled,
        ___autocast=autocast_state,
        ___object_getattribute=object.__getattribute__,
        ___ndarray_tensor=ndarray_tensor,
        ___iterator_sequence=iterator_sequence,
        ___iterator_position=iterator_position,
        ___math=math,  # torch's size guards call math.ceil, math.floor, ...
        ___torch=torch,
    )


@dataclass
class Guard:
    code: str
    description: str
    # a tensor of the program's state: checked with the others in one ___tensors_match call
    tensor: TensorSpec | None = None
    # the expression whose value the line checks: a miss reports its value then
    subject: str | None = None
    # a tensor's sizes at capture (None for a dimension that is symbolic)
    shape: tuple | None = None


@dataclass
class GuardFailure:
    """One guard line that a call fails: what it required, and what the call has."""

    guard: Guard
    now: str | None = None  # the call's value, described
    value: object = None  # the call's value of the guard's subject (a tensor, an int, ...)

    def __str__(self) -> str:
        if self.now is None:
            return self.guard.description
        return f"{self.guard.description}, now {self.now}"


@dataclass
class GuardSet:
    f_globals: dict
    closure: tuple | None
    lines: list[Guard] = field(default_factory=list)
    scope: dict = field(default_factory=dict)
    seen: set = field(default_factory=set)
    sources: dict = field(default_factory=dict)  # expression -> source, prefixes included
    examples: dict = field(default_factory=dict)  # expression -> state tensor, until built

    def __post_init__(self):
        self.scope.update(fixed_scope(self.f_globals, self.closure))
        grad = torch.is_grad_enabled()
        self.add(f"___grad_enabled() is {grad}", f"grad mode is {'on' if grad else 'off'}")
        dtype = self.constant_name("dtype", torch.get_default_dtype())
        self.add(f"___default_dtype() is {dtype}", f"default dtype is {torch.get_default_dtype()}")
        if torch._C._is_any_autocast_enabled():
            state = self.constant_name("autocast", autocast_state())
            self.add(f"___autocast() == {state}", f"autocast (cpu, cuda) is {autocast_state()}")
        else:
            self.add("___any_autocast() is False", "autocast is off")

    def constant_name(self, prefix: str, value) -> str:
        name = f"___{prefix}{len(self.scope)}"
        self.scope[name] = value
        return name

    def bind(self, source) -> str:
        """The guard expression of ``source``, with the objects it names in scope."""
        from kiln_capture.sources import item_keys, object_sources

        for found in object_sources(source):
            self.scope[found.expr()] = found.obj
        self.scope.update(item_keys(source))
        walk = source
        while walk is not None:  # every prefix, for the dispatcher's shared reads
            self.sources.setdefault(walk.expr(), walk)
            walk = getattr(walk, "base", None)
        return source.expr()

    def add(
        self,
        code: str,
        description: str,
        tensor: TensorSpec | None = None,
        subject: str | None = None,
        shape: tuple | None = None,
        **names,
    ) -> None:
        if code in self.seen:
            return
        self.seen.add(code)
        self.scope.update(names)
        self.lines.append(Guard(code, description, tensor, subject, shape))

    # --- kinds of guard ---------------------------------------------------------

    def constant(self, source, value) -> None:
        expr = self.bind(source)
        if value is None or isinstance(value, bool):
            self.add(f"{expr} is {value!r}", f"{expr} is {value!r}", subject=expr)
        elif type(value) in (int, str, bytes) or (type(value) is float and math.isfinite(value)):
            self.add(
                f"type({expr}) is {type(value).__name__} and {expr} == {value!r}",
                f"{expr} == {value!r}",
                subject=expr,
            )
        elif type(value) is float and math.isnan(value):
            self.add(f"type({expr}) is float and {expr} != {expr}", f"{expr} is nan", subject=expr)
        else:
            name = self.constant_name("c", value)
            self.add(
                f"type({expr}) is type({name}) and {expr} == {name}",
                f"{expr} == {value!r}",
                subject=expr,
            )

    def identity(self, source, value) -> None:
        name = self.constant_name("id", value)
        label = _qualname(value) or type(value).__name__
        expr = self.bind(source)
        self.add(f"{expr} is {name}", f"{expr} is the same {label}", subject=expr)

    def function_code(self, source, value) -> None:
        """A function made by a ``def`` or ``lambda`` in a frame is a new object at every
        run of the frame: guard its code (what a call of it runs) instead of its identity;
        what its closure holds is guarded where the trace reads it."""
        name = self.constant_name("code", value.__code__)
        expr = self.bind(source)
        self.add(
            f"type({expr}) is ___FunctionType and {expr}.__code__ is {name} and "
            f"{expr}.__defaults__ is None and {expr}.__kwdefaults__ is None",
            f"{expr} is a function {value.__qualname__} made from the same code",
            subject=expr,
            ___FunctionType=types.FunctionType,
        )

    def method(self, source, value) -> None:
        """A bound method is a new object at every read: guard its function instead."""
        name = self.constant_name("id", value.__func__)
        expr = self.bind(source)
        self.add(f"{expr}.__func__ is {name}", f"{expr} is a method {value.__func__.__qualname__}")

    def no_hooks(self, source, module) -> None:
        """The module's hook dicts are empty, read from its instance dict (one attribute
        read instead of four through ``nn.Module.__getattr__``'s slower path)."""
        expr = self.bind(source)
        own = [name for name in HOOK_DICTS if name in vars(module)]
        others = [
            f"{expr}.{name}" for name in HOOK_DICTS if name not in own and hasattr(module, name)
        ]
        hooks = [f"(___hooks := {expr}.__dict__)[{own[0]!r}]"] if own else []
        hooks += [f"___hooks[{name!r}]" for name in own[1:]] + others
        self.add(f"not ({' or '.join(hooks)})", f"{expr} has no hooks")

    def type(self, source, value) -> None:
        name = self.constant_name("T", type(value))
        expr = self.bind(source)
        self.add(f"type({expr}) is {name}", f"{expr} is a {type(value).__qualname__}", subject=expr)

    def type_and_length(self, source, value) -> None:
        name = self.constant_name("T", type(value))
        expr = self.bind(source)
        self.add(
            f"type({expr}) is {name} and len({expr}) == {len(value)}",
            f"{expr} is a {type(value).__name__} of length {len(value)}",
            subject=expr,
        )

    def type_and_keys(self, source, value) -> None:
        name = self.constant_name("T", type(value))
        keys = self.constant_name("keys", list(value.keys()))
        expr = self.bind(source)
        self.add(
            f"type({expr}) is {name} and list({expr}.keys()) == {keys}",
            f"{expr} is a {type(value).__name__} with keys {list(value.keys())}",
            subject=expr,
        )

    def constant_set(self, source, value) -> None:
        name = self.constant_name("c", value)
        expr = self.bind(source)
        self.add(f"{expr} == {name}", f"{expr} == {value!r}", subject=expr)

    def same_object(self, source, other) -> None:
        expr, other_expr = self.bind(source), self.bind(other)
        self.add(f"{expr} is {other_expr}", f"{expr} is {other_expr}")

    def tensor(self, source, value: torch.Tensor, dynamic_dims=()) -> None:
        """Everything a graph specialises on, checked field by field (cheap in CPython).
        A parameter or buffer with static sizes is checked with the others in one call
        (``tensor_match.py``); its line stays, to name it when a call misses."""
        from kiln_capture.sources import reads_program_state

        expr = self.bind(source)
        if not dynamic_dims:
            spec = TensorSpec.of(expr, value)
            grouped = reads_program_state(source) and value.layout is torch.strided
            if grouped and expr not in self.examples:
                self.examples[expr] = value
            code = " and ".join(spec.checks(expr, self.constant_name))
            self.add(
                code,
                f"{expr}: {describe_tensor(value)}",
                spec if grouped else None,
                subject=expr,
                shape=tuple(value.shape),
            )
            return
        kind = self.constant_name("T", type(value))
        dtype = self.constant_name("dtype", value.dtype)
        checks = [f"type({expr}) is {kind}", f"{expr}.dtype is {dtype}"]
        if value.device.type != "cpu":  # the dispatch keys tell CPU from other devices
            checks.append(f"{expr}.get_device() == {device_index(value.device)}")
        checks.append(f"{expr}.dim() == {value.dim()}")
        static = [d for d in range(value.dim()) if d not in dynamic_dims]
        checks += [f"{expr}.size({d}) == {value.size(d)}" for d in static]
        if value.is_contiguous():
            checks.append(f"{expr}.is_contiguous()")
        checks += [
            f"{expr}.requires_grad is {value.requires_grad}",
            f"___dispatch_keys({expr}).raw_repr() == {dispatch_keys(value)}",
        ]
        about = f"{describe_tensor(value)} with dims {sorted(dynamic_dims)} dynamic"
        shape = tuple(None if d in dynamic_dims else n for d, n in enumerate(value.shape))
        self.add(" and ".join(checks), f"{expr}: {about}", subject=expr, shape=shape)


def describe_tensor(t: torch.Tensor) -> str:
    dtype = str(t.dtype).replace("torch.", "")
    grad = ", requires_grad" if t.requires_grad else ""
    return (
        f"{type(t).__name__}({dtype}, {t.device}, size={tuple(t.shape)}, stride={t.stride()}{grad})"
    )


@dataclass
class GuardFunction:
    """A guard with its source; ``why(*args)`` names the first failing guard."""

    source: str
    lines: list[Guard]
    scope: dict
    parameters: str
    sources: dict
    # the state tensors' expressions, checked in this order by scope["___tensors_match"]
    tensor_exprs: list[str] = field(default_factory=list)
    tensors: TensorMatcher | None = None
    # the guard function's own source (``source`` less the tensor matcher's) and the names
    # it reads: compiled on first use of ``check``, since the generated dispatcher inlines
    # the lines instead (compiling a 12-layer model's guard costs 50 ms)
    function_source: str = field(default="", repr=False)
    namespace: dict = field(default_factory=dict, repr=False)
    _check: object = field(default=None, repr=False)

    @property
    def check(self):
        """The guard as a function of the captured function's parameters."""
        if self._check is None:
            code = compile(self.function_source, "<kiln guard>", "exec")
            exec(code, self.namespace)  # noqa: S102
            self._check = self.namespace["guard"]
        return self._check

    @property
    def inline_lines(self) -> list[Guard]:
        """The lines checked one by one (the state tensors are checked in one call)."""
        return [g for g in self.lines if g.tensor is None]

    def __call__(self, *args, **kwargs) -> bool:
        return self.check(*args, **kwargs)

    def why(self, *args, **kwargs) -> str | None:
        """The first guard that the call fails (its description), or None."""
        failed = self.failed_lines(args, kwargs, first_only=True)
        return failed[0].guard.description if failed else None

    def failures(self, *args, **kwargs) -> list[GuardFailure]:
        """Every guard line the call fails, each with the call's value of what it checks
        (one miss can change several sizes: they are all made symbolic at once)."""
        return self.failed_lines(args, kwargs)

    def failed_lines(self, args, kwargs, first_only: bool = False) -> list[GuardFailure]:
        frame_locals = bound_arguments(self.parameters, self.scope, args, kwargs)
        found = []
        for guard in self.lines:
            try:
                ok = eval(guard.code, dict(self.scope), dict(frame_locals))  # noqa: S307
            except Exception:
                ok = False
            if not ok:
                found.append(self.failure(guard, frame_locals))
                if first_only:
                    break
        return found

    def failure(self, guard: Guard, frame_locals: dict) -> GuardFailure:
        if guard.subject is None:
            sizes = SIZE_READ.findall(guard.code)  # a symbolic-shape guard: the sizes it reads
            values = [f"{e} = {self.read(e, frame_locals)[1]}" for e in dict.fromkeys(sizes)]
            return GuardFailure(guard, ", ".join(values) or None)
        value, now = self.read(guard.subject, frame_locals)
        return GuardFailure(guard, now, value)

    def read(self, expression: str, frame_locals: dict) -> tuple[object, str]:
        """The value of ``expression`` for a call, and its description."""
        try:
            value = eval(expression, dict(self.scope), dict(frame_locals))  # noqa: S307
        except Exception as exc:
            return None, f"not readable ({type(exc).__name__}: {exc})"
        if isinstance(value, torch.Tensor):
            return value, describe_tensor(value)
        text = repr(value) if type(value) in (int, float, bool, str, type(None)) else None
        if text is None or len(text) > 80:
            text = f"a {type(value).__qualname__}"
        return value, text


# a size, stride or storage offset read in a guard of torch's ShapeEnv
SIZE_READ = re.compile(r"[\w.\[\]'\"]+?\.(?:size\(\)\[\d+\]|stride\(\)\[\d+\]|storage_offset\(\))")


def bound_arguments(parameters: str, scope: dict, args, kwargs) -> dict:
    """The call's arguments bound to ``parameters`` (a :func:`parameter_list`, its defaults
    in ``scope``), by name, as the guard's lines read them."""
    binder = eval(f"lambda {parameters}: locals()", dict(scope))  # noqa: S307
    return binder(*args, **kwargs)


def parameter_list(fn, scope: dict) -> str:
    """``fn``'s parameters as source, defaults bound to names in ``scope``."""
    parts = []
    for i, p in enumerate(inspect.signature(fn, follow_wrapped=False).parameters.values()):
        text = p.name
        if p.kind is p.VAR_POSITIONAL:
            text = "*" + p.name
        elif p.kind is p.VAR_KEYWORD:
            text = "**" + p.name
        if p.default is not p.empty:
            scope[f"___d{i}"] = p.default
            text += f"=___d{i}"
        parts.append((p.kind, text))
    out, saw_star = [], False
    for kind, text in parts:
        if kind is inspect.Parameter.KEYWORD_ONLY and not saw_star:
            out.append("*")
            saw_star = True
        if kind is inspect.Parameter.VAR_POSITIONAL:
            saw_star = True
        out.append(text)
        if kind is inspect.Parameter.POSITIONAL_ONLY and (
            len(out) == len(parts) or parts[len(out)][0] is not inspect.Parameter.POSITIONAL_ONLY
        ):
            out.append("/")
    return ", ".join(out)


def build_guard_function(fn, guards: GuardSet, extra: list[str] = ()) -> GuardFunction:
    scope = dict(guards.scope)
    params = parameter_list(fn, scope)
    lines = [f"def guard({params}):"]
    for guard in guards.lines:
        if guard.tensor is None:
            lines.append(f"    if not ({guard.code}):  # {guard.description}")
            lines.append("        return False")
    for code in extra:
        lines.append(f"    if not ({code}):  # symbolic shapes")
        lines.append("        return False")
    grouped = [g.tensor for g in guards.lines if g.tensor is not None]
    matcher = None
    if grouped:
        # last: every check on the modules and objects they are read through has passed
        matcher = build_matcher(grouped, [guards.examples[s.expr] for s in grouped])
        scope["___tensors_match"] = matcher.check
        lines.append(f"    if not ___tensors_match(  # {len(grouped)} parameters and buffers")
        lines += [f"        {spec.expr},  # {describe_spec(spec)}" for spec in grouped]
        lines.append("    ):")
        lines.append("        return False")
    guards.examples.clear()  # the matcher keeps no tensor alive
    lines.append("    return True")
    function_source = source = "\n".join(lines) + "\n"
    if matcher is not None:
        source += f"\n\n# ___tensors_match, checked by the {matcher.name} tensor matcher:\n"
        source += matcher.source
    all_lines = list(guards.lines) + [Guard(code, f"symbolic shapes: {code}") for code in extra]
    return GuardFunction(
        source,
        all_lines,
        scope,
        params,
        guards.sources,
        [spec.expr for spec in grouped],
        matcher,
        function_source=function_source,
        namespace=dict(scope),
    )


def describe_spec(spec: TensorSpec) -> str:
    dtype = str(spec.dtype).replace("torch.", "")
    device = "cpu" if spec.device_index is None else f"device {spec.device_index}"
    grad = ", requires_grad" if spec.requires_grad else ""
    return f"{spec.type.__name__}({dtype}, {device}, size={spec.shape}, stride={spec.stride}{grad})"


def _qualname(value) -> str | None:
    """``value.__qualname__`` where it is a string: an object whose ``__getattr__`` answers
    every name (``torch.classes`` gives a namespace, whose repr raises) has none."""
    try:
        qualname = getattr(value, "__qualname__", None)
    except Exception:  # noqa: BLE001 - a __getattr__ that raises something else
        return None
    return qualname if isinstance(qualname, str) else None
