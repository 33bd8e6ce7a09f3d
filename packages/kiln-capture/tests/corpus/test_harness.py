"""Checks on the harness itself: every program is deterministic, and mismatches are caught."""

import dataclasses

import pytest
import torch
from harness import Case, CountingBackend, check_case, load_cases, randn, same

CASES = load_cases()


def no_capture(fn, backend):
    """A capture that compiles nothing: the program runs eagerly a second time."""
    return fn


@pytest.mark.parametrize("case", [case for _, case in CASES], ids=[cid for cid, _ in CASES])
def test_program_is_deterministic(case):
    check_case(case, no_capture, expected_graphs=0)


def traced_capture(fn, backend):
    """A capture of straight-line programs through torch.fx.symbolic_trace, for the tests below."""
    gm = torch.fx.symbolic_trace(fn)
    return backend(gm, [])


def test_graphs_are_counted():
    case = Case("double", lambda x: x * 2, randn((3,)))
    check_case(case, traced_capture)
    with pytest.raises(AssertionError, match="expected 2 graph"):
        check_case(dataclasses.replace(case, graphs=2), traced_capture)


def test_wrong_result_is_caught():
    case = Case("double", lambda x: x * 2, randn((3,)))
    with pytest.raises(AssertionError, match="result"):
        check_case(case, lambda fn, backend: lambda x: x * 3)


def test_wrong_input_mutation_is_caught():
    def mutate(x):
        x.add_(1)
        return x.sum()

    case = Case("mutate", mutate, randn((3,)), graphs=0)
    with pytest.raises(AssertionError, match="args after the call"):
        check_case(case, lambda fn, backend: lambda x: (x + 1).sum())


def test_wrong_exception_message_is_caught():
    def fail(x):
        raise ValueError("eager message")

    def other(x):
        raise ValueError("other message")

    case = Case("fail", fail, randn((3,)), raises=ValueError, graphs=0)
    check_case(case, no_capture)
    with pytest.raises(AssertionError, match="other message"):
        check_case(case, lambda fn, backend: other)


def test_printed_output_is_compared():
    def say(x):
        print("eager")
        return x

    case = Case("say", say, randn((3,)), graphs=0)
    with pytest.raises(AssertionError, match="printed output"):
        check_case(case, lambda fn, backend: lambda x: x)


def test_recompile_is_caught():
    backend_calls = []

    def recompiling(fn, backend):
        def run(x):
            backend_calls.append(1)
            return backend(torch.fx.symbolic_trace(fn), [])(x)

        return run

    case = Case("double", lambda x: x * 2, randn((3,)))
    with pytest.raises(AssertionError, match="second call compiled 1 more"):
        check_case(case, recompiling)
    check_case(dataclasses.replace(case, recompiles_ok=True), recompiling)


def test_same_checks_types_and_structure():
    same({"a": (1, 2.0, "s")}, {"a": (1, 2.0, "s")})
    for a, b in [
        ((1,), [1]),
        (1, 1.0),
        ({"a": 1, "b": 2}, {"b": 2, "a": 1}),
        (torch.ones(2), torch.ones(2, dtype=torch.float64)),
        (torch.ones(2), torch.ones(2).requires_grad_()),
    ]:
        with pytest.raises(AssertionError):
            same(a, b)


def test_counting_backend_returns_forward():
    backend = CountingBackend()
    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    assert backend(gm, [torch.ones(1)])(torch.ones(1)).item() == 2.0
    assert backend.graphs == [gm]
