"""kiln.compile through every package — capture, autograd, loop IR, C++ kernels — on the
CPU, against eager: outputs, input gradients, which parameters get a gradient at all and
each gradient, and buffers (BatchNorm running statistics)."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F

import kiln


@pytest.fixture(autouse=True)
def fresh_kiln(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "kiln-cache"))
    monkeypatch.setenv("KILN_CPP_CACHE_DIR", str(tmp_path / "cpp-cache"))
    kiln.reset()


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(16)
        self.up = torch.nn.Linear(16, 32)
        self.down = torch.nn.Linear(32, 16)
        self.unused = torch.nn.Linear(16, 16)  # no gradient, eagerly or compiled

    def forward(self, x):
        return (x + self.down(F.gelu(self.up(self.norm(x))))).softmax(-1)


class ConvNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x):
        h = F.relu(self.bn(self.conv(x)))
        return self.head(F.adaptive_avg_pool2d(h, 1).flatten(1))


class Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(50, 32)
        self.qkv = torch.nn.Linear(32, 96)
        self.out = torch.nn.Linear(32, 32)

    def forward(self, ids):
        h = self.embed(ids)
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        split = [t.unflatten(-1, (4, 8)).transpose(1, 2) for t in (q, k, v)]
        a = F.scaled_dot_product_attention(*split, is_causal=True)
        return self.out(a.transpose(1, 2).flatten(2)) + h


class FrozenAndDetached(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.frozen = torch.nn.Linear(8, 8).requires_grad_(False)
        self.trained = torch.nn.Linear(8, 8)
        self.side = torch.nn.Linear(8, 8)  # read only through detach: no gradient

    def forward(self, x):
        return self.trained(torch.tanh(self.frozen(x))) * self.side(x).detach().sigmoid()


class TwoHeads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Linear(8, 8)
        self.left = torch.nn.Linear(8, 2)
        self.right = torch.nn.Linear(8, 2)

    def forward(self, x):
        h = F.silu(self.body(x))
        return self.left(h), self.right(h)


class WithGraphBreak(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, 8)

    def forward(self, x):
        h = torch.relu(self.a(x))
        scale = float(h.mean().item())  # reads a value: the graph breaks here
        return self.b(h * scale).sum(-1)


CASES = {
    "mlp": (MLP, lambda: [torch.randn(4, 16)]),
    "convnet": (ConvNet, lambda: [torch.randn(2, 3, 8, 8)]),
    "attention": (Attention, lambda: [torch.randint(0, 50, (2, 6))]),
    "frozen_and_detached": (FrozenAndDetached, lambda: [torch.randn(4, 8)]),
    "two_heads": (TwoHeads, lambda: [torch.randn(4, 8)]),
    "graph_break": (WithGraphBreak, lambda: [torch.randn(4, 8)]),
}


def loss_of(out, weights):
    if isinstance(out, tuple):  # the second head is left out of the loss
        out = out[0]
    return (out * weights).sum()


def assert_same_state(model, reference):
    params = dict(model.named_parameters())
    params_ref = dict(reference.named_parameters())
    with_grad = {n for n, p in params.items() if p.grad is not None}
    assert with_grad == {n for n, p in params_ref.items() if p.grad is not None}
    for n in with_grad:
        torch.testing.assert_close(params[n].grad, params_ref[n].grad, msg=n)
    for (n, b), b_ref in zip(model.named_buffers(), reference.buffers(), strict=True):
        torch.testing.assert_close(b, b_ref, msg=n)


@pytest.mark.parametrize("name", sorted(CASES))
def test_inference_matches_eager(name, tmp_path):
    make_model, make_inputs = CASES[name]
    torch.manual_seed(0)
    model = make_model().eval()
    reference = copy.deepcopy(model)
    compiled = kiln.compile(model, backend="kiln", options={"debug_dir": str(tmp_path)})
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # nothing falls back to eager
        for _ in range(2):
            inputs = make_inputs()
            with torch.no_grad():
                torch.testing.assert_close(compiled(*inputs), reference(*inputs))
    assert list(tmp_path.glob("frame*/forward_host.py")), "generated code ran"


@pytest.mark.parametrize("name", sorted(CASES))
def test_training_matches_eager(name):
    make_model, make_inputs = CASES[name]
    torch.manual_seed(0)
    model = make_model().train()
    reference = copy.deepcopy(model)
    compiled = kiln.compile(model, backend="kiln")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        for _ in range(2):
            inputs = make_inputs()
            floats = [x.requires_grad_() for x in inputs if x.is_floating_point()]
            inputs_ref = [x.detach().clone().requires_grad_(x.requires_grad) for x in inputs]
            out, expected = compiled(*inputs), reference(*inputs_ref)
            torch.testing.assert_close(out, expected)
            weights = torch.randn_like(out[0] if isinstance(out, tuple) else out)
            loss_of(out, weights).backward()
            loss_of(expected, weights).backward()
            for x, x_ref in zip(floats, [x for x in inputs_ref if x.requires_grad], strict=True):
                torch.testing.assert_close(x.grad, x_ref.grad)
            assert_same_state(model, reference)
            model.zero_grad(set_to_none=True)
            reference.zero_grad(set_to_none=True)


def test_optimizer_steps_match_eager():
    torch.manual_seed(0)
    model = MLP()
    reference = copy.deepcopy(model)
    compiled = kiln.compile(model)
    opt = torch.optim.AdamW(compiled.parameters(), lr=1e-2)
    opt_ref = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    for _ in range(3):
        x, target = torch.randn(4, 16), torch.randn(4, 16)
        for m, o in ((compiled, opt), (reference, opt_ref)):
            o.zero_grad()
            F.mse_loss(m(x), target).backward()
            o.step()
    for key, value in reference.state_dict().items():
        torch.testing.assert_close(compiled.state_dict()[key], value, msg=key)
