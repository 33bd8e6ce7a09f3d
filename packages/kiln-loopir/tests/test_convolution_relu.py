"""``kiln_loopir::convolution_relu`` on the CPU (ATen's convolution, addition and ReLU;
cuDNN's fused convolution on CUDA runs in kiln's GPU tests): eager's values, the layout it
is given, and a compiled graph that calls it as an extern op."""

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln_loopir import CONVOLUTION_RELU, ReferenceCodegen, compile_fx

F = torch.nn.functional


def _inputs():
    x = torch.randn(2, 4, 9, 9)
    return x, torch.randn(6, 4, 3, 3) / 6, torch.randn(6), torch.randn(2, 6, 5, 5)


def _fused(x, w, b, z):
    return (CONVOLUTION_RELU(x, w, b, z, [2, 2], [1, 1], [1, 1], 1, [150, 1, 30, 6]) * 2,)


def test_the_op_is_relu_of_convolution_plus_residual_in_the_layout_given():
    x, w, b, z = _inputs()
    got = CONVOLUTION_RELU(x, w, b, z, [2, 2], [1, 1], [1, 1], 1, [150, 1, 30, 6])
    want = F.relu(F.conv2d(x, w, b, stride=2, padding=1) + z)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert got.stride() == (150, 1, 30, 6)  # channels-last, as asked
    plain = CONVOLUTION_RELU(x, w, None, None, [2, 2], [1, 1], [1, 1], 1, [150, 25, 5, 1])
    torch.testing.assert_close(plain, F.relu(F.conv2d(x, w, stride=2, padding=1)))


def test_a_float32_bias_of_a_bfloat16_convolution_is_added_in_float32_rounded_once():
    x, w, b, z = _inputs()
    x, w, z = x.bfloat16(), w.bfloat16(), z.bfloat16()
    got = CONVOLUTION_RELU(x, w, b, z, [2, 2], [1, 1], [1, 1], 1, [150, 25, 5, 1])
    conv = F.conv2d(x, w, stride=2, padding=1)
    want = F.relu((conv + b.view(-1, 1, 1)).to(torch.bfloat16) + z)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_a_compiled_graph_calls_it_as_an_extern_op():
    gm = make_fx(_fused, tracing_mode="fake")(*_inputs())
    compiled = compile_fx(gm, list(_inputs()), codegen=ReferenceCodegen())
    assert "convolution_relu" in compiled.host_source
    fresh = _inputs()
    (got,), (want,) = compiled.program.call(*fresh), _fused(*fresh)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert got.stride() == want.stride()


def _traced_on_cuda(x_channels_last: bool, residual: bool, out_channels_last: bool):
    """The op traced on fake CUDA tensors (no device needed) and lowered."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from kiln_loopir import lower

    layout = [512, 1, 64, 8] if out_channels_last else [512, 64, 8, 1]

    def fn(x, w, b, z):
        z = z if residual else None
        return (CONVOLUTION_RELU(x, w, b, z, [1, 1], [1, 1], [1, 1], 1, layout),)

    with FakeTensorMode(allow_non_fake_inputs=True):
        x = torch.empty(2, 8, 8, 8, device="cuda")
        if x_channels_last:
            x = x.to(memory_format=torch.channels_last)
        args = [x, torch.empty(8, 8, 3, 3, device="cuda"), torch.empty(8, device="cuda"),
                torch.empty(2, 8, 8, 8, device="cuda")]  # fmt: skip
        gm = make_fx(fn, tracing_mode="fake")(*args)
    return lower(gm, args)


def test_on_cuda_it_lowers_to_cudnns_fused_op_where_cudnn_lays_its_output_out_so():
    aten = torch.ops.aten
    for channels_last, residual, out_channels_last, want in [
        (True, True, True, aten.cudnn_convolution_add_relu.default),
        (False, False, False, aten.cudnn_convolution_relu.default),
        (True, False, False, CONVOLUTION_RELU),  # another layout asked for: the op copies
    ]:
        graph = _traced_on_cuda(channels_last, residual, out_channels_last)
        (node,) = [n for n in graph.nodes
                   if hasattr(n, "target") and "convolution" in str(n.target)]  # fmt: skip
        assert node.target is want, node.target
