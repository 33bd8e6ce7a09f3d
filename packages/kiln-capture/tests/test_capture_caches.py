"""What capture keeps per function or code object between captures (to capture a model's
repeated layers once each) follows the function when it changes."""

import torch
from recording import Recorder

from kiln_capture import capture
from kiln_capture.variables.functions import signature_of


def scaled(x, scale=2.0):
    return x * scale


def calls_scaled(x):
    return scaled(x)


def test_a_signature_is_read_again_when_the_defaults_change():
    first = signature_of(scaled)
    assert signature_of(scaled) is first
    original = scaled.__defaults__
    try:
        scaled.__defaults__ = (3.0,)
        assert signature_of(scaled).parameters["scale"].default == 3.0
        x = torch.ones(2)
        torch.testing.assert_close(capture(calls_scaled, Recorder())(x), x * 3)
    finally:
        scaled.__defaults__ = original
    assert signature_of(scaled).parameters["scale"].default == 2.0


def test_a_signature_is_read_again_when_the_code_changes():
    def other(x, scale=5.0, *, shift=1.0):
        return x * scale + shift

    original = scaled.__code__
    try:
        signature_of(scaled)
        scaled.__code__ = other.__code__
        scaled.__kwdefaults__ = {"shift": 1.0}
        assert list(signature_of(scaled).parameters) == ["x", "scale", "shift"]
        x = torch.ones(2)
        torch.testing.assert_close(capture(calls_scaled, Recorder())(x), x * 2 + 1)
    finally:
        scaled.__code__ = original
        scaled.__kwdefaults__ = None
    assert list(signature_of(scaled).parameters) == ["x", "scale"]
