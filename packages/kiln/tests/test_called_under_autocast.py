"""A function compiled and called inside the caller's ``torch.autocast`` region: the graph
holds autocast's casts, and its host program runs with autocast off (run again under
autocast, an ATen call of the graph casts again: a float32 product of an
autocast-disabled region came out in bfloat16, and the kernel after it read it as float32)."""

from __future__ import annotations

import pytest
import torch

import kiln


def mixed(x, w):
    h = x @ w  # bfloat16 under the caller's autocast
    with torch.autocast("cpu", enabled=False):
        r = x.float() @ w.float()  # float32 here, as in a rotary embedding
    return h.float().sin() + r.cos()


@pytest.mark.parametrize("host_program", ["python", "auto"])
def test_an_autocast_disabled_product_stays_float32(host_program):
    x, w = torch.randn(64, 64), torch.randn(64, 64, requires_grad=True)
    compiled = kiln.compile(mixed, options={"host_program": host_program, "cache": False})
    lowered = kiln.compile_times().get("lowering", 0.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = mixed(x, w)
        got = compiled(x, w)
    assert kiln.compile_times().get("lowering", 0.0) > lowered, "no graph was lowered"
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    (want_grad,) = torch.autograd.grad(want.sum(), w)
    (got_grad,) = torch.autograd.grad(got.sum(), w)
    error = (got_grad - want_grad).norm() / want_grad.norm()
    assert error < 2e-2, f"gradient off by {error:.3f} of its norm"
