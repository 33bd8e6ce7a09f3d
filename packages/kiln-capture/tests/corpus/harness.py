"""Table-driven harness for the capture corpus.

Each program in the corpus is a `Case`: a function, a way to make fresh inputs, and what
capturing it should produce. `check_case` runs a case eagerly and through a capture function
(``kiln_capture.capture`` or ``torch.compile``) with a `CountingBackend`, and checks that
results, mutated inputs, printed output, external state and the number of graphs agree.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import importlib.util
import io
import math
import pathlib
import sys
import types
from collections.abc import Callable, Mapping
from typing import Any

import torch

HERE = pathlib.Path(__file__).parent
# Values compared with ==; their types were checked to be identical first.
_PLAIN = (
    int,
    str,
    bytes,
    bool,
    set,
    frozenset,
    type(None),
    torch.dtype,
    torch.device,
    range,
    slice,
)
_ROUTINES = (
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    types.ModuleType,
    type,
)


@dataclasses.dataclass
class Case:
    """One program of the corpus and what capturing it must produce."""

    name: str
    fn: Callable
    # Fresh inputs on each call (torch.randn etc.); Python scalars in it stay the same
    # across calls so that the second call hits the cache.
    make_args: Callable[[], tuple]
    kwargs: Callable[[], dict] | None = None
    # Number of graphs handed to the backend during the first call.
    graphs: int = 1
    # Tolerances for torch.testing.assert_close and float comparison (rtol, atol).
    tol: dict = dataclasses.field(default_factory=dict)
    # Resets global state before each run (eager and captured).
    reset: Callable[[], None] | None = None
    # Snapshot of global or external state after a run, compared between eager and captured.
    state: Callable[[], object] | None = None
    # The exception type the program raises; captured must raise the same type and message.
    raises: type[BaseException] | None = None
    # Whether the second call may compile more graphs (e.g. it takes another branch).
    recompiles_ok: bool = False
    # torch.compile's count where it differs from `graphs`; a comment at the case says why.
    oracle_graphs: int | None = None
    # Why torch.compile gets this case wrong (not only its graph count); test_oracle then
    # expects the case to fail there.
    oracle_xfail: str | None = None
    # Why torch.compile captures again on the second call where Kiln does not; test_oracle
    # then lets it recompile.
    oracle_recompiles: str | None = None


class CountingBackend:
    """A backend that runs graphs eagerly and remembers every graph it was handed."""

    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        self.graphs.append(gm)
        return gm.forward


def check_case(case: Case, capture_fn: Callable, *, expected_graphs: int | None = None) -> None:
    """Run `case` eagerly and through `capture_fn(fn, backend)` twice; assert they agree.

    The first call must hand `expected_graphs` graphs (default `case.graphs`) to the backend;
    the second call, with fresh inputs of the same shapes, must not compile any more unless
    `case.recompiles_ok`.
    """
    expected_graphs = case.graphs if expected_graphs is None else expected_graphs
    backend = CountingBackend()
    compiled = None
    for call in range(2):
        torch.manual_seed(call)
        args = case.make_args()
        kw = case.kwargs() if case.kwargs is not None else {}
        eager_args, eager_kw = copy.deepcopy((args, kw))
        cap_args, cap_kw = copy.deepcopy((args, kw))

        expected, expected_state, expected_out = _run(case, case.fn, eager_args, eager_kw)
        if compiled is None:
            if case.reset is not None:
                case.reset()
            compiled = capture_fn(case.fn, backend)
        actual, actual_state, actual_out = _run(case, compiled, cap_args, cap_kw)

        where = f"call {call + 1}"
        if case.raises is not None:
            _check_raised(case.raises, expected, actual, where)
        else:
            same(expected, actual, case.tol, f"{where}: result")
        same(eager_args, cap_args, case.tol, f"{where}: args after the call")
        same(eager_kw, cap_kw, case.tol, f"{where}: kwargs after the call")
        same(expected_state, actual_state, case.tol, f"{where}: state")
        assert expected_out == actual_out, (
            f"{where}: printed output differs\neager:\n{expected_out}\ncaptured:\n{actual_out}"
        )
        if call == 0:
            assert len(backend.graphs) == expected_graphs, (
                f"expected {expected_graphs} graph(s) on the first call, got "
                f"{len(backend.graphs)}:\n{_describe(backend.graphs)}"
            )
        elif not case.recompiles_ok:
            assert len(backend.graphs) == expected_graphs, (
                f"the second call compiled {len(backend.graphs) - expected_graphs} more "
                f"graph(s); set recompiles_ok=True if that is intended:\n"
                f"{_describe(backend.graphs)}"
            )


def _run(case: Case, fn: Callable, args: tuple, kw: dict) -> tuple[Any, Any, str]:
    """Call fn once after resetting global state; return (result or exception, state, stdout)."""
    if case.reset is not None:
        case.reset()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        if case.raises is None:
            result = fn(*args, **kw)
        else:
            try:
                fn(*args, **kw)
            except BaseException as exc:  # noqa: BLE001 - compared by the caller
                result = exc
            else:
                result = None
    state = case.state() if case.state is not None else None
    return result, state, out.getvalue()


def _check_raised(
    expected_type: type[BaseException], expected: object, actual: object, where: str
) -> None:
    assert isinstance(expected, expected_type), (
        f"{where}: eager run should raise {expected_type.__name__}, got {expected!r}"
    )
    if type(actual) is not type(expected) or str(actual) != str(expected):
        raise AssertionError(
            f"{where}: eager raised {type(expected).__name__}({str(expected)!r}), "
            f"captured gave {type(actual).__name__}({str(actual)!r})"
        ) from (actual if isinstance(actual, BaseException) else None)


def _describe(graphs: list[torch.fx.GraphModule]) -> str:
    return "\n".join(f"--- graph {i}\n{gm.code.strip()}" for i, gm in enumerate(graphs))


def same(a: object, b: object, tol: dict | None = None, path: str = "value") -> None:
    """Assert that `a` (eager) and `b` (captured) are equal, recursively and by type."""
    tol = tol or {}
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), f"{path}: expected a tensor, got {type(b).__name__}"
        assert a.shape == b.shape, f"{path}: shape {tuple(a.shape)} != {tuple(b.shape)}"
        assert a.dtype == b.dtype, f"{path}: dtype {a.dtype} != {b.dtype}"
        assert a.device == b.device, f"{path}: device {a.device} != {b.device}"
        assert a.requires_grad == b.requires_grad, (
            f"{path}: requires_grad {a.requires_grad} != {b.requires_grad}"
        )
        torch.testing.assert_close(
            b.detach(), a.detach(), equal_nan=True, msg=lambda m: f"{path}: {m}", **tol
        )
        if a.is_leaf and b.is_leaf and (a.grad is not None or b.grad is not None):
            same(a.grad, b.grad, tol, f"{path}.grad")
        return
    assert type(a) is type(b), f"{path}: type {type(a).__name__} != {type(b).__name__}"
    if type(a).__module__ == "numpy":  # an ndarray or a NumPy scalar
        assert a.dtype == b.dtype, f"{path}: dtype {a.dtype} != {b.dtype}"
        same(torch.as_tensor(a), torch.as_tensor(b), tol, path)
        return
    if isinstance(a, torch.nn.Module):
        same(a.state_dict(), b.state_dict(), tol, f"{path}.state_dict()")
        same(_public_attrs(a), _public_attrs(b), tol, f"{path}.__dict__")
    elif isinstance(a, Mapping):
        assert list(a.keys()) == list(b.keys()), f"{path}: keys {list(a)} != {list(b)}"
        for key in a:
            same(a[key], b[key], tol, f"{path}[{key!r}]")
        if dataclasses.is_dataclass(a):
            _same_fields(a, b, tol, path)
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), f"{path}: length {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            same(x, y, tol, f"{path}[{i}]")
    elif dataclasses.is_dataclass(a):
        _same_fields(a, b, tol, path)
    elif isinstance(a, float):
        rtol, atol = tol.get("rtol", 1.3e-6), tol.get("atol", 1e-5)
        ok = (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=rtol, abs_tol=atol)
        assert ok, f"{path}: {a!r} != {b!r}"
    elif isinstance(a, _PLAIN):
        assert a == b, f"{path}: {a!r} != {b!r}"
    elif isinstance(a, functools.partial):
        assert a.func is b.func, f"{path}: partial of {a.func!r} != {b.func!r}"
        same((a.args, a.keywords), (b.args, b.keywords), tol, f"{path}(partial)")
    elif hasattr(a, "__dict__") and not isinstance(a, _ROUTINES):
        same(_public_attrs(a), _public_attrs(b), tol, f"{path}.__dict__")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def _same_fields(a: object, b: object, tol: dict, path: str) -> None:
    for f in dataclasses.fields(a):
        same(getattr(a, f.name), getattr(b, f.name), tol, f"{path}.{f.name}")


def _public_attrs(obj: object) -> dict:
    """Plain attributes of an object: names without a leading underscore, callables left out."""
    return {
        k: v for k, v in vars(obj).items() if not k.startswith("_") and not _is_callable_attr(v)
    }


def _is_callable_attr(v: object) -> bool:
    return callable(v) and not isinstance(v, torch.nn.Module | type)


@functools.cache
def load_cases() -> tuple[tuple[str, Case], ...]:
    """Collect `CASES` from every programs_<topic>.py beside this file, as (id, case) pairs.

    Loaded once per process, so that every test file sees the same program objects.
    """
    out = []
    for path in sorted(HERE.glob("programs_*.py")):
        topic = path.stem.removeprefix("programs_")
        spec = importlib.util.spec_from_file_location(f"kiln_corpus_programs_{topic}", path)
        module = importlib.util.module_from_spec(spec)
        # Registered so that functions can be found by their module name (pickling, tracing).
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        out.extend((f"{topic}-{case.name}", case) for case in module.CASES)
    return tuple(out)


def randn(*shapes: tuple[int, ...], requires_grad: bool = False) -> Callable[[], tuple]:
    """make_args for float32 inputs of the given shapes (standard normal, never all zeros)."""
    return lambda: tuple(torch.randn(s, requires_grad=requires_grad) for s in shapes)


def randint(*shapes: tuple[int, ...], low: int = 1, high: int = 10) -> Callable[[], tuple]:
    """make_args for int64 inputs of the given shapes, drawn from [low, high)."""
    return lambda: tuple(torch.randint(low, high, s) for s in shapes)
