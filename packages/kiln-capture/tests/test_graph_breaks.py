"""Graph breaks inside try/finally, except and with blocks keep Python's semantics."""

import contextlib
import warnings

import pytest
import torch
from recording import Recorder

from kiln_capture import capture

CONFIG = {"mode": "default"}


def body_with_item(x):
    y = x * 2
    scale = y.abs().sum().item()  # needs the data: the graph breaks here
    return y / scale


def decorated(x):
    """The shape of Hugging Face's forward wrappers: state set, body called, state restored."""
    CONFIG["mode"] = "inside"
    try:
        return body_with_item(x)
    finally:
        CONFIG["mode"] = "default"


def test_break_inside_try_finally_runs_the_finally():
    backend = Recorder()
    fn = capture(decorated, backend)
    for _ in range(2):
        x = torch.randn(5)
        torch.testing.assert_close(fn(x), decorated(x))
        assert CONFIG["mode"] == "default"
    assert len(backend.graphs) >= 2, "the parts around the break are still captured"


def failing_call(x):
    raise ValueError(f"rejected {x.shape[0]}")


def handled(x):
    y = x + 1
    try:
        print("calling")
        z = failing_call(y)
    except ValueError as err:
        z = y * len(str(err))
    return z


def test_exception_from_the_native_call_reaches_the_users_handler(capsys):
    fn = capture(handled, Recorder())
    x = torch.randn(3)
    torch.testing.assert_close(fn(x), handled(x))
    assert capsys.readouterr().out == "calling\ncalling\n"


def unhandled(x):
    y = x + 1
    try:
        print("calling")
        return failing_call(y)
    finally:
        CONFIG["mode"] = "cleaned"


def test_exception_through_a_finally_propagates_after_the_cleanup():
    CONFIG["mode"] = "default"
    with pytest.raises(ValueError, match="rejected 3"):
        capture(unhandled, Recorder())(torch.randn(3))
    assert CONFIG["mode"] == "cleaned"
    CONFIG["mode"] = "default"


def print_in_no_grad(x):
    with torch.no_grad():
        y = x * 2
        print("inside")
        z = y + 1
    return z, torch.is_grad_enabled()


def test_break_inside_no_grad_keeps_the_mode_and_restores_it(capsys):
    backend = Recorder()
    fn = capture(print_in_no_grad, backend)
    x = torch.randn(3, requires_grad=True)
    z, grad_after = fn(x)
    assert not z.requires_grad and grad_after is True and torch.is_grad_enabled()
    torch.testing.assert_close(z, x.detach() * 2 + 1)
    assert len(backend.graphs) == 2
    for gm in backend.graphs:  # each graph leaves grad mode as it found it
        calls = [n.args[0] for n in gm.graph.nodes if n.target is torch._C._set_grad_enabled]
        assert not calls or calls[-1] is True


def matmuls_with_a_print(x, w):
    y = (x @ w).relu()
    print("between")  # a graph break: the caller's autocast region is open around it
    return y @ w


def test_break_under_the_callers_autocast_resumes(capsys):
    # autocast entered before the frame is the state of both graphs and of the native
    # print between them; only a region the frame itself opens runs the frame eagerly
    backend = Recorder()
    fn = capture(matmuls_with_a_print, backend)
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = matmuls_with_a_print(x, w)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no "runs eagerly" warning
            got = fn(x, w)
    assert got.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(got, expected)
    assert capsys.readouterr().out == "between\nbetween\n"
    assert len(backend.graphs) == 2
    assert not torch.is_autocast_enabled("cpu")


def print_inside_own_autocast(x, w):
    y = x @ w
    with torch.autocast("cpu", dtype=torch.bfloat16):
        z = (y @ w).relu()
        print("inside", torch.is_autocast_enabled("cpu"))
        z = z @ w
    return z.float() + y, torch.is_autocast_enabled("cpu")


def raise_inside_own_autocast(x, w):
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = x @ w
            failing_call(y)
    except ValueError:
        return x @ w, torch.is_autocast_enabled("cpu")


def test_break_inside_the_frames_own_autocast_resumes_inside_it(capsys):
    # the first graph leaves the region at its end, the native print runs in a real region
    # entered again, the resume function traces the rest of the block in it, and the
    # block's end leaves it
    backend = Recorder()
    fn = capture(print_inside_own_autocast, backend)
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "runs eagerly" warning
        got, inside_after = fn(x, w)
    expected, _ = print_inside_own_autocast(x, w)
    torch.testing.assert_close(got, expected)
    assert inside_after is False and not torch.is_autocast_enabled("cpu")
    assert capsys.readouterr().out == "inside True\ninside True\n"
    assert len(backend.graphs) >= 2
    first = backend.graphs[0].graph
    enters = [n for n in first.nodes if "enter_autocast" in str(n.target)]
    exits = [n for n in first.nodes if "exit_autocast" in str(n.target)]
    assert len(enters) == len(exits) == 1  # the graph leaves the region it entered


@contextlib.contextmanager
def mixed_precision():
    with torch.autocast("cpu", dtype=torch.bfloat16):
        yield


def print_inside_a_generator_opening_autocast(x, w):
    y = x @ w
    with mixed_precision():
        z = y @ w
        print("inside", torch.is_autocast_enabled("cpu"))
        z = z @ w
    return z.float() + y


def test_break_inside_a_context_manager_that_opens_autocast_resumes(capsys):
    backend = Recorder()
    fn = capture(print_inside_a_generator_opening_autocast, backend)
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    for _ in range(2):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no "runs eagerly" warning
            got = fn(x, w)
        torch.testing.assert_close(got, print_inside_a_generator_opening_autocast(x, w))
        assert not torch.is_autocast_enabled("cpu")
    assert capsys.readouterr().out == "inside True\n" * 4
    graphs = len(backend.graphs)
    fn(x, w)
    assert len(backend.graphs) == graphs >= 2  # no capture again


def test_an_exception_at_a_break_inside_autocast_leaves_the_region():
    fn = capture(raise_inside_own_autocast, Recorder())
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    got, enabled = fn(x, w)
    torch.testing.assert_close(got, x @ w)
    assert enabled is False and not torch.is_autocast_enabled("cpu")


def scaled_quietly(x):
    with warnings.catch_warnings():  # reads sys.modules, torch.classes among them
        warnings.simplefilter("ignore")
        y = x * 2
    return y + 1


def test_a_catch_warnings_block_is_captured_around():
    # guarding a read of torch.classes (whose __getattr__ answers every name) named it
    # by a namespace object whose repr raises: an internal error ran the frame eagerly
    backend = Recorder()
    fn = capture(scaled_quietly, backend)
    x = torch.randn(3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "runs eagerly" warning
        filters = list(warnings.filters)
        torch.testing.assert_close(fn(x), x * 2 + 1)
        assert warnings.filters == filters  # the block's "ignore" is gone again
    assert backend.graphs


def doubled_or_refused(t):
    print("checking")
    if t.dim() > 1:
        raise ValueError("two dims")
    return t * 2


def each_or_fallback(xs):
    out = []
    for t in xs:
        try:
            out.append(t + doubled_or_refused(t))
        except ValueError:
            out.append(t - 1)
    return out


def test_exception_at_a_break_in_a_try_inside_a_loop_reaches_the_handler():
    """The handler's stack holds the loop's iterator, below the values pushed for the call:
    the native call's exception-table entry keeps the depth of the original's handler."""
    fn = capture(each_or_fallback, Recorder())
    for _ in range(2):
        xs = [torch.randn(1, 3), torch.randn(3), torch.randn(1, 3)]
        got, expected = fn(xs), each_or_fallback(xs)
        assert len(got) == len(expected)
        for a, b in zip(got, expected, strict=True):
            torch.testing.assert_close(a, b)
