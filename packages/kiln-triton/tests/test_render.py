"""What the generated source looks like: tiling, merged dimensions, reduction variants."""

import pytest
import torch
import torch.nn.functional as F

from kiln_loopir.testing import compile_fn
from kiln_triton import TritonCodegen, TritonCodegenError
from kiln_triton.configs import PERSISTENT_MAX, WIDE_PERSISTENT_MAX, candidates
from kiln_triton.render import source_hash


def sources(fn, *inputs):
    compiled = compile_fn(fn, list(inputs), codegen="reference")
    codegen = TritonCodegen()
    return [codegen.render(k) for k in compiled.schedule.kernels()]


def meta_of(source: str) -> dict:
    scope: dict = {}
    exec(source.split("\nMETA = ", 1)[1].join(["META = ", ""]), scope)
    return scope["META"]


def test_contiguous_dimensions_merge_into_one_index():
    (src,) = sources(lambda x: x * 2 + 1, torch.randn(2, 3, 4, 5))
    assert meta_of(src)["kind"] == "pointwise"
    assert meta_of(src)["numels"] == {"xnumel": "120"}
    assert "//" not in src and "%" not in src  # no div/mod: the index is xindex


def test_transpose_runs_on_2d_tiles():
    (src,) = sources(lambda x, y: x.t() + y, torch.randn(32, 48), torch.randn(48, 32))
    meta = meta_of(src)
    assert meta["kind"] == "tiled"
    assert meta["numels"] == {"ynumel": "32", "xnumel": "48"} or meta["numels"] == {
        "ynumel": "48",
        "xnumel": "32",
    }
    assert "YBLOCK" in src


def test_reduction_has_persistent_and_looped_variants_chosen_by_size():
    (src,) = sources(lambda x: torch.softmax(x, -1), torch.randn(4, 8))
    meta = meta_of(src)
    assert "_persistent(" in src and "_looped(" in src
    small = candidates(meta, {"xnumel": 64, "rnumel": 512})
    wide = candidates(meta, {"xnumel": 64, "rnumel": PERSISTENT_MAX * 4})
    huge = candidates(meta, {"xnumel": 64, "rnumel": WIDE_PERSISTENT_MAX * 2})
    assert all(c.variant.endswith("_persistent") for c in small)
    # wide rows: looped first, one row per program in registers as a candidate to time
    assert wide[0].variant.endswith("_looped")
    assert any(c.variant.endswith("_persistent") and dict(c.blocks)["XBLOCK"] == 1 for c in wide)
    assert all(c.variant.endswith("_looped") for c in huge)


def test_looped_softmax_reloads_its_input_in_each_loop():
    (src,) = sources(lambda x: torch.softmax(x, -1), torch.randn(4, 8))
    looped = src.split("_looped(", 1)[1].split("\nMETA", 1)[0]
    assert looped.count("for roffset in range(0, rnumel, RBLOCK):") == 3  # max, sum, store
    assert looped.count("tl.load(") == 3


def test_layernorm_computes_one_welford_for_mean_and_variance():
    import torch.nn.functional as F

    (src,) = sources(lambda x: F.layer_norm(x, (16,)), torch.randn(4, 16))
    looped = src.split("_looped(", 1)[1].split("@kt.jit_later", 1)[0]  # not its split variant
    assert looped.count("kt.welford_update(") == 1
    assert looped.count("for roffset") == 2


def test_column_reduction_is_marked_for_wide_x_blocks():
    (src,) = sources(lambda x: x.sum(0), torch.randn(64, 128))
    meta = meta_of(src)
    assert meta["column_major"]
    found = candidates(meta, {"xnumel": 128, "rnumel": 64})
    assert all(dict(c.blocks)["XBLOCK"] >= 8 for c in found)  # contiguous columns per load


def test_bf16_is_loaded_and_computed_in_fp32():
    (src,) = sources(lambda x: x.exp() * 2, torch.randn(8, dtype=torch.bfloat16))
    assert ".to(tl.float32)" in src


def test_unsupported_dtype_is_named():
    from kiln_triton.dtypes import tl_type

    with pytest.raises(TritonCodegenError, match="complex64"):
        tl_type(torch.complex64)


def test_max_and_argmax_of_one_row_are_one_reduction(device):
    """``x.max(-1)`` reduces each row once, as (value, index) pairs, and keeps eager's NaN
    and tie rules."""
    from kiln_loopir.testing import check_against_eager

    x = torch.randn(6, 37)
    x[1, 3] = float("nan")
    x[2, 5] = x[2, 9] = x[2].max() + 1  # a tie: the first index wins
    (src,) = sources(lambda a: a.max(-1), x)
    persistent = src.split("_looped(", 1)[0]
    assert persistent.count("tl.reduce(") == 1
    for dtype in (torch.float32, torch.bfloat16):
        check_against_eager(lambda a: a.max(-1), [x.to(device, dtype)], codegen=TritonCodegen())
        check_against_eager(lambda a: a.min(-1), [x.to(device, dtype)], codegen=TritonCodegen())


def test_a_norm_weight_stays_in_l2():
    (src,) = sources(lambda a, w: F.layer_norm(a, (16,), w), torch.randn(4, 16), torch.randn(16))
    weight_loads = [line for line in src.splitlines() if "tl.load(in_ptr1" in line]
    assert weight_loads and all("evict_last" in line for line in weight_loads)


def test_functions_are_named_for_the_ops_without_the_index():
    ln_gelu = lambda x, w, b: F.gelu(F.layer_norm(x, (8,), w, b))  # noqa: E731
    compiled = compile_fn(ln_gelu, [torch.randn(4, 8), torch.randn(8), torch.randn(8)])
    (kernel,) = compiled.schedule.kernels()
    src = TritonCodegen().render(kernel)
    assert kernel.name == "kiln_fused_layer_norm_gelu_0"
    assert src.startswith("# kiln_fused_layer_norm_gelu_0: ")
    assert meta_of(src)["name"] == "kiln_fused_layer_norm_gelu"
    assert "def kiln_fused_layer_norm_gelu_persistent(" in src
    assert "def kiln_fused_layer_norm_gelu_looped(" in src
    (column_sum,) = sources(lambda x: x.sum(0), torch.randn(300, 40))
    assert "def kiln_sum_split(" in column_sum and "def kiln_sum_split_finish(" in column_sum


def test_the_same_kernel_of_two_layers_is_one_source():
    # two layers' worth of one kernel: named apart in the graph (the first line), otherwise
    # the same source, META included (its arguments are the pointers, not the buffers), so
    # one module is built and tuned for both
    srcs = sources(lambda x, y: (x.exp().sum(-1), y.exp().sum(-1)), torch.randn(4, 8),
                   torch.randn(4, 8))  # fmt: skip
    heads = [s.split(":", 1)[0] for s in srcs]
    assert heads == ["# kiln_fused_exp_sum_0", "# kiln_fused_exp_sum_1"]
    assert srcs[0].split("\n", 1)[1] == srcs[1].split("\n", 1)[1]
    assert source_hash(srcs[0]) == source_hash(srcs[1])
    assert meta_of(srcs[0])["args"] == ["in_ptr0", "out_ptr0"]
    assert meta_of(srcs[0])["stored"] == ["out_ptr0"]


def test_the_repeated_layers_kernels_are_merged_and_tiled_once_and_render_the_same():
    from kiln_triton import render

    def layers(x, w1, w2, w3):
        for w in (w1, w2, w3):  # the same kernels in every layer: a norm, a transposed sum
            x = F.layer_norm(x, x.shape[-1:]) * 2
            x = (x.t() @ w).t() + x.sin()
        return x

    inputs = [torch.randn(16, 24), *(torch.randn(16, 16) for _ in range(3))]
    kernels = compile_fn(layers, inputs, codegen="reference").schedule.kernels()
    codegen = TritonCodegen(parallel_compile=False)
    fresh = []
    for kernel in kernels:  # each kernel merged and tiled from scratch
        render.merged_space.cache_clear()
        fresh.append(codegen.render(kernel))
    render.merged_space.cache_clear()
    kept = [codegen.render(kernel) for kernel in kernels]
    assert kept == fresh
    assert render.merged_space.cache_info().hits >= len(kernels) // 2  # the layers after the first
