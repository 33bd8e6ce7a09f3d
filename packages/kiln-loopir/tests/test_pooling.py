"""Average pooling and its gradient lower to kernels (no ATen call) that agree with eager:
windows over padding, ceil mode, strides past the kernel, divisor overrides, large windows
(summed by a reduction), 1-, 2- and 3-d, with and without a batch dimension."""

import pytest
import torch
import torch.nn.functional as F

from kiln_loopir.ir import ComputedNode, ExternNode
from kiln_loopir.reference.codegen import ReferenceCodegen
from kiln_loopir.testing import check_against_eager

aten = torch.ops.aten

WINDOWS = {
    "plain": dict(kernel_size=2),
    "padding_ceil_exclude_pad": dict(
        kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False
    ),
    "padding_ceil_include_pad": dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
    "stride_past_kernel": dict(kernel_size=(2, 3), stride=(3, 4), padding=(1, 0)),
    "divisor_override": dict(kernel_size=3, padding=1, ceil_mode=True, divisor_override=5),
    "large_window": dict(kernel_size=6, stride=1, padding=2, count_include_pad=False),
}


def _externs(compiled) -> list[str]:
    return [str(n.target) for n in compiled.graph.nodes if isinstance(n, ExternNode)]


@pytest.mark.parametrize("name", sorted(WINDOWS))
def test_avg_pool2d_and_its_gradient_match_eager(name):
    kw = WINDOWS[name]
    x = torch.randn(2, 3, 9, 8)
    out = F.avg_pool2d(x, **kw)
    grad = torch.randn_like(out)
    args = [kw["kernel_size"], kw.get("stride", ()), kw.get("padding", 0)]
    args += [kw.get("ceil_mode", False), kw.get("count_include_pad", True)]
    args += [kw.get("divisor_override")]
    forward = check_against_eager(lambda t: F.avg_pool2d(t.exp(), **kw) * 2, [x])
    backward = check_against_eager(
        lambda g, t: aten.avg_pool2d_backward(g * 2, t, *args), [grad, x]
    )
    assert _externs(forward) == _externs(backward) == []


@pytest.mark.parametrize(
    "fn, shape",
    [
        (lambda t: F.avg_pool1d(t, 4, 3, 2, ceil_mode=True, count_include_pad=False), (2, 3, 11)),
        (lambda t: F.avg_pool2d(t, 3, 2, 1), (3, 7, 6)),  # no batch dimension
        (
            lambda t: F.avg_pool3d(t, 3, 2, 1, ceil_mode=True, count_include_pad=False),
            (1, 2, 5, 6, 5),
        ),
        (lambda t: F.avg_pool3d(t, (2, 3, 2), 1), (1, 2, 4, 5, 4)),
    ],
    ids=["1d", "2d_unbatched", "3d_padding_ceil", "3d_large_window"],
)
def test_other_ranks_match_eager(fn, shape):
    compiled = check_against_eager(fn, [torch.randn(shape, dtype=torch.float64)])
    assert _externs(compiled) == []


def test_avg_pool3d_gradient_matches_eager():
    x = torch.randn(1, 2, 5, 6, 5)
    grad = torch.randn_like(F.avg_pool3d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False))
    compiled = check_against_eager(
        lambda g, t: aten.avg_pool3d_backward(
            g, t, [3, 3, 3], [2, 2, 2], [1, 1, 1], True, False, None
        ),
        [grad, x],
    )
    assert _externs(compiled) == []


def test_channels_last_input_keeps_its_layout():
    x = torch.randn(2, 3, 6, 7).to(memory_format=torch.channels_last)
    check_against_eager(lambda t: F.avg_pool2d(t, 3, 2, 1), [x])


def _taps_of_padded(t):
    """A 3x3, stride-2 max over ``relu(t)`` padded with -inf: the form max pooling takes
    once decomposed (each tap a strided slice of the padded input)."""
    padded = F.pad(t.relu(), (1, 1, 1, 1), value=float("-inf"))
    h, w = (t.shape[-2] + 1) // 2, (t.shape[-1] + 1) // 2
    taps = [
        padded[..., i : i + 2 * h - 1 : 2, j : j + 2 * w - 1 : 2]
        for i in range(3)
        for j in range(3)
    ]
    out = taps[0]
    for tap in taps[1:]:
        out = torch.maximum(out, tap)
    return out


class _NoMaskedStridedReads(ReferenceCodegen):
    """A code generator that, like kiln-cpp, vectorises no read under a mask at a step."""

    vectorises_masked_strided_reads = False


def _padded_nodes(compiled) -> tuple[list, list]:
    nodes = [n for n in compiled.graph.nodes if isinstance(n, ComputedNode)]
    return [n for n in nodes if tuple(n.buffer.size) == (2, 3, 11, 10)], nodes


def test_a_padded_input_read_at_a_step_is_written_once_where_masked_steps_are_slow():
    """Inlined, the padding would be a masked read at a step of two at every tap, which
    kiln-cpp's compiler does not vectorise: for such a code generator the padded input is
    computed once and read plainly; for the others it stays inlined."""
    x = torch.randn(2, 3, 9, 8)
    compiled = check_against_eager(_taps_of_padded, [x], codegen=_NoMaskedStridedReads())
    padded, nodes = _padded_nodes(compiled)
    assert len(padded) == 1, [n.buffer.size for n in nodes]
    for node in nodes:
        if node is not padded[0]:
            assert not any(load.masked for load in node.traced()[0].loads), node.name
    inlined, _ = _padded_nodes(check_against_eager(_taps_of_padded, [x]))
    assert not inlined, "the reference code generator reads masks at a step in place"
