"""Badly aligned 16-bit matrix products on CUDA padded where faster (kiln/padding.py).

Whether padding is faster depends on the device, so these tests make the timing say yes
(``_faster``) to check the rewrite itself, and check the timing on its own."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

import kiln
from kiln import padding

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
VOCAB = 1001  # not a multiple of 8


class TiedHead(torch.nn.Module):
    """An embedding, a layer, and the embedding's weight as the output projection."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, 64)
        self.hidden = torch.nn.Linear(64, 64)

    def forward(self, ids):
        h = torch.nn.functional.gelu(self.hidden(self.embed(ids)))
        return h @ self.embed.weight.t()


def compiled_pair(tmp_path, monkeypatch):
    monkeypatch.setattr(padding, "_faster", lambda *args: True)
    torch.manual_seed(0)
    model = TiedHead().cuda().to(torch.bfloat16)
    twin = copy.deepcopy(model)
    options = {"debug_dir": str(tmp_path), "cache": False}
    return model, twin, kiln.compile(twin, options=options)


def dumps(folder, pattern: str) -> str:
    return "\n".join(p.read_text() for p in sorted(folder.glob(f"frame*/{pattern}")))


def test_a_padded_head_gives_eager_results_and_layout(tmp_path, monkeypatch):
    model, _, compiled = compiled_pair(tmp_path, monkeypatch)
    ids = torch.randint(0, VOCAB, (8, 64), device="cuda")
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")  # a graph that runs eagerly warns
        expected = model(ids)
        actual = compiled(ids)
    assert actual.shape == expected.shape and actual.stride() == expected.stride()
    torch.testing.assert_close(actual.float(), expected.float(), rtol=2e-2, atol=2e-2)
    # the padded weight is computed from the parameters alone: once, by freezing
    state_part = dumps(tmp_path, "forward_frozen.py").split("# run at every call")[0]
    assert "constant_pad_nd" in state_part


def test_a_padded_training_step_gives_eager_gradients(tmp_path, monkeypatch):
    model, twin, compiled = compiled_pair(tmp_path, monkeypatch)
    ids = torch.randint(0, VOCAB, (8, 64), device="cuda")
    expected = model(ids)
    actual = compiled(ids)
    torch.testing.assert_close(actual.float(), expected.float(), rtol=2e-2, atol=2e-2)
    expected.float().square().mean().backward()
    actual.float().square().mean().backward()
    for (name, p), q in zip(model.named_parameters(), twin.parameters(), strict=True):
        scale = p.grad.float().abs().max()
        assert (q.grad.float() - p.grad.float()).abs().max() / scale < 3e-2, name
    assert "constant_pad_nd" in dumps(tmp_path, "forward_aten_rewritten.py")
    assert "constant_pad_nd" in dumps(tmp_path, "backward_aten_rewritten.py")  # K = VOCAB there


def test_the_timing_compares_both_forms_on_the_device():
    shape = (512, VOCAB, 64, (64, 1), (1, 64), torch.bfloat16, torch.device("cuda"))
    assert padding._faster(*shape, 7, 0, True) in (True, False)
