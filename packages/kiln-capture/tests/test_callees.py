"""callees.with_redirected_globals: a function whose global reads go through a callback
behaves as the function does, and the callback sees each global it reads."""

import math

import torch

from kiln_capture.callees import global_names, with_redirected_globals

SCALE = 3.0


def double(t):
    return t * 2


def uses_globals(x, items=(1, 2)):
    total = 0.0
    for item in items:
        try:
            total += math.sqrt(item) * SCALE
            if item > 1:
                raise ValueError(item)
        except ValueError:
            total -= 1
    return double(x) + total + len(items)


def test_reads_go_through_the_callback_and_nothing_else_changes():
    seen = []

    def redirect(value):
        seen.append(value)
        return value

    rewritten = with_redirected_globals(uses_globals, redirect)
    x = torch.randn(3)
    torch.testing.assert_close(rewritten(x), uses_globals(x))
    assert rewritten.__name__ == "uses_globals" and rewritten.__defaults__ == ((1, 2),)
    assert math in seen and double in seen and SCALE in seen and len in seen
    assert global_names(uses_globals) == ["math", "SCALE", "ValueError", "double", "len"]


def test_the_callback_decides_what_the_code_calls_and_rebinding_takes_effect():
    def redirect(value):
        return (lambda t: t * 10) if value is double else value

    rewritten = with_redirected_globals(uses_globals, redirect)
    x = torch.randn(3)
    torch.testing.assert_close(rewritten(x) - uses_globals(x), x * 8)
    global SCALE
    SCALE = 5.0
    try:
        before = uses_globals(x)
        torch.testing.assert_close(rewritten(x) - before, x * 8)
    finally:
        SCALE = 3.0
