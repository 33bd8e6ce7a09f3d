"""Kiln's attention kernels against autograd of the math form: the forward's output and
log-sum-exp, the backward's three gradients (on the CPU in Triton's interpreter, tiny; on
a GPU also in bfloat16)."""

import pytest
import sympy
import torch

from kiln_loopir.ir import TensorRef
from kiln_triton.attention import AttentionCall
from kiln_triton.attention_backward import BackwardCall
from kiln_triton.attention_backward_jit import attention_bwd
from kiln_triton.attention_jit import attention_fwd


def _ref(name: str, t: torch.Tensor) -> TensorRef:
    ints = lambda values: tuple(sympy.Integer(v) for v in values)  # noqa: E731
    return TensorRef(name, t.dtype, t.device, ints(t.shape), ints(t.stride()), sympy.Integer(0))


def _launch(kernel, call, tensors: dict[str, torch.Tensor]) -> None:
    args = call.arguments()
    grid = args.pop("grid")
    pointers = {p: tensors[ref.buffer] for p, ref in call.pointers().items()}
    kernel[grid](**pointers, **args)


def _math_attention(q, k, v, bias, causal, scale):
    scores = (q.float() @ k.float().transpose(-1, -2)) * scale
    if bias is not None:
        scores = scores + bias.float()
    if causal:
        keep = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    return torch.softmax(scores, -1) @ v.float(), torch.logsumexp(scores, -1)


CASES = [  # (batch, heads, queries, keys, head size, causal, bias)
    (1, 2, 40, 40, 16, False, False),
    (2, 2, 40, 24, 16, False, True),  # keys fewer than queries, the last keys masked out
    (1, 1, 20, 52, 16, True, True),  # more keys than queries, causal from the top left
]


@pytest.mark.parametrize("case", CASES)
def test_forward_and_backward_kernels_give_autograds_gradients(case, device):
    batch, heads, m, n, d, causal, with_bias = case
    dtypes = [torch.float32] + ([torch.bfloat16] if device == "cuda" else [])
    for dtype in dtypes:
        q = torch.randn(batch, heads, m, d, device=device, dtype=dtype)
        # keys and values as a training graph has them: heads of one [batch, keys, 2 * ...]
        kv = torch.randn(batch, n, 2 * heads * d, device=device, dtype=dtype)
        k, v = (t.view(batch, n, heads, d).transpose(1, 2) for t in kv.chunk(2, -1))
        bias = None
        if with_bias:
            bias = torch.randn(batch, 1, m, n, device=device, dtype=dtype)
            bias[0, :, :, n - 3 :] = float("-inf")
        want, want_lse = _math_attention(q, k, v, bias, causal, 0.3)
        leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
        grad_out = torch.randn(batch, heads, m, d, device=device, dtype=dtype)
        _math_attention(*leaves, bias, causal, 0.3)[0].backward(grad_out.float())

        t = {"q": q, "k": k, "v": v, "kv": kv, "bias": bias, "grad_out": grad_out}
        t["out"] = torch.empty_like(q)
        t["lse"] = torch.empty(batch, heads, m, 1, device=device)  # cuDNN's layout
        for name, like in (("dq", q), ("dk", k), ("dv", v)):
            t[name] = torch.empty(like.shape, device=device, dtype=dtype)  # contiguous
        refs = {name: _ref(name, x) for name, x in t.items() if x is not None}
        forward = AttentionCall(refs["q"], refs["k"], refs["v"], refs.get("bias"), refs["out"],
                                refs["lse"], 0.3, causal)  # fmt: skip
        _launch(attention_fwd, forward, t)
        backward = BackwardCall(refs["grad_out"], refs["q"], refs["k"], refs["v"], refs["out"],
                                refs["lse"], refs.get("bias"), refs["dq"], refs["dk"],
                                refs["dv"], 0.3, causal)  # fmt: skip
        _launch(attention_bwd, backward, t)

        tol = 1e-4 if dtype == torch.float32 else 3e-2
        torch.testing.assert_close(t["lse"][..., 0], want_lse, rtol=1e-4, atol=1e-4 * m)
        for got, expected in [(t["out"], want)] + list(
            zip((t["dq"], t["dk"], t["dv"]), (x.grad for x in leaves), strict=True)
        ):
            scale = expected.abs().max().item()
            torch.testing.assert_close(got.float(), expected, rtol=tol, atol=tol * scale)
