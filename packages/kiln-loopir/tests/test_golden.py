# ruff: noqa: E501 - the golden IR has long lines
"""Golden tests of the printed IR before and after fusion for known patterns.

Each pattern is lowered, verified after every pass, and compiled against eager; the
printed IR is compared with the text below (regenerate with ``EXPECTTEST_ACCEPT=1``).
"""

import re
from unittest import mock

import torch
import torch.nn.functional as F
from expecttest import TestCase

from kiln_loopir import Kernel, decompose, eliminate_dead_nodes, fuse, lower, order
from kiln_loopir import unfused_schedule as unfused
from kiln_loopir.lowering import matmul
from kiln_loopir.testing import check_against_eager, trace_aten


def stages(fn, inputs):
    """(IR before fusion, schedule after fusion), with verify() after every pass."""
    gm = decompose(trace_aten(fn, inputs))
    graph = lower(gm, inputs)
    graph.verify()
    eliminate_dead_nodes(graph)
    graph.verify()
    before = unfused(graph)
    before.verify()
    fused = fuse(before)
    fused.verify()
    ordered = order(fused)
    ordered.verify()
    check_against_eager(fn, inputs)
    return graph, ordered


def canonical_sizes(text):
    """Size symbols renamed s0, s1 ... in order of appearance (torch versions name them
    differently)."""
    names = {}
    return re.sub(r"\bs\d+\b", lambda m: names.setdefault(m.group(0), f"s{len(names)}"), text)


def kinds(schedule):
    return ["kernel" if isinstance(s, Kernel) else "extern" for s in schedule.steps]


class TestGolden(TestCase):
    def test_pointwise_chain(self):
        graph, after = stages(lambda x: (x.sin() + 1).relu() * 2, [torch.randn(4, 8)])
        self.assertEqual(kinds(after), ["kernel"])
        self.assertExpectedInline(
            str(graph),
            """\
input arg0_1: float32[4, 8] stride=[8, 1]
buf0: float32[4, 8] stride=[8, 1] = Pointwise(ranges=[4, 8])
    tmp0 = load(arg0_1, 8*x0 + x1)
    tmp1 = sin(tmp0)
    store(buf0, 8*x0 + x1, tmp1)
buf1: float32[4, 8] stride=[8, 1] = Pointwise(ranges=[4, 8])
    tmp0 = load(buf0, 8*x0 + x1)
    tmp1 = constant(1.0, torch.float32)
    tmp2 = add(tmp0, tmp1)
    store(buf1, 8*x0 + x1, tmp2)
buf2: float32[4, 8] stride=[8, 1] = Pointwise(ranges=[4, 8])
    tmp0 = load(buf1, 8*x0 + x1)
    tmp1 = constant(0, torch.float32)
    tmp2 = maximum(tmp0, tmp1)
    store(buf2, 8*x0 + x1, tmp2)
buf3: float32[4, 8] stride=[8, 1] = Pointwise(ranges=[4, 8])
    tmp0 = load(buf2, 8*x0 + x1)
    tmp1 = constant(2.0, torch.float32)
    tmp2 = mul(tmp0, tmp1)
    store(buf3, 8*x0 + x1, tmp2)
return (buf3[4, 8] stride=[8, 1] offset=0)""",
        )
        self.assertExpectedInline(
            str(after),
            """\
input arg0_1: float32[4, 8] stride=[8, 1]
kiln_fused_sin_add_relu_mul_0: ranges=[4, 8] reduction_ranges=[] nodes=[buf0:outer, buf1:outer, buf2:outer, buf3:outer]
    # local: buf0, buf1, buf2
    tmp0 = load(arg0_1, 8*x0 + x1)
    tmp1 = sin(tmp0)
    tmp2 = constant(1.0, torch.float32)
    tmp3 = add(tmp1, tmp2)
    tmp4 = constant(0, torch.float32)
    tmp5 = maximum(tmp3, tmp4)
    tmp6 = constant(2.0, torch.float32)
    tmp7 = mul(tmp5, tmp6)
    store(buf3, 8*x0 + x1, tmp7)
return (buf3[4, 8] stride=[8, 1] offset=0)""",
        )

    def test_softmax(self):
        graph, after = stages(lambda x: torch.softmax(x, -1), [torch.randn(4, 8)])
        self.assertEqual(kinds(after), ["kernel"])
        self.assertExpectedInline(
            str(graph),
            """\
input arg0_1: float32[4, 8] stride=[8, 1]
buf0: float32[4, 1] stride=[1, 1] = Reduction(max, ranges=[4, 1], reduction_ranges=[8])
    tmp0 = load(arg0_1, r0 + 8*x0)
    tmp1 = to_dtype(tmp0, torch.float32)
    tmp2 = reduction('max', tmp1, torch.float32)
    store(buf0, x0, tmp2)
buf1: float32[4, 1] stride=[1, 1] = Reduction(sum, ranges=[4, 1], reduction_ranges=[8])
    tmp0 = load(arg0_1, r0 + 8*x0)
    tmp1 = to_dtype(tmp0, torch.float32)
    tmp2 = load(buf0, x0)
    tmp3 = sub(tmp1, tmp2)
    tmp4 = exp(tmp3)
    tmp5 = to_dtype(tmp4, torch.float32)
    tmp6 = reduction('sum', tmp5, torch.float32)
    store(buf1, x0, tmp6)
buf2: float32[4, 8] stride=[8, 1] = Pointwise(ranges=[4, 8])
    tmp0 = load(buf1, x0)
    tmp1 = load(arg0_1, 8*x0 + x1)
    tmp2 = to_dtype(tmp1, torch.float32)
    tmp3 = load(buf0, x0)
    tmp4 = sub(tmp2, tmp3)
    tmp5 = exp(tmp4)
    tmp6 = truediv(tmp5, tmp0)
    tmp7 = to_dtype(tmp6, torch.float32)
    store(buf2, 8*x0 + x1, tmp7)
return (buf2[4, 8] stride=[8, 1] offset=0)""",
        )
        self.assertExpectedInline(
            str(after),
            """\
input arg0_1: float32[4, 8] stride=[8, 1]
kiln_softmax_0: ranges=[4] reduction_ranges=[8] nodes=[buf0:reduction, buf1:reduction, buf2:inner]
    # local: buf0, buf1
    tmp0 = load(arg0_1, r0 + 8*x0)
    tmp1 = to_dtype(tmp0, torch.float32)
    tmp2 = reduction('max', tmp1, torch.float32)
    tmp3 = sub(tmp1, tmp2)
    tmp4 = exp(tmp3)
    tmp5 = to_dtype(tmp4, torch.float32)
    tmp6 = reduction('sum', tmp5, torch.float32)
    tmp7 = truediv(tmp4, tmp6)
    tmp8 = to_dtype(tmp7, torch.float32)
    store(buf2, r0 + 8*x0, tmp8)
return (buf2[4, 8] stride=[8, 1] offset=0)""",
        )

    def test_layernorm_gelu(self):
        graph, after = stages(
            lambda x, w, b: F.gelu(F.layer_norm(x, (8,), w, b)),
            [torch.randn(4, 8), torch.randn(8), torch.randn(8)],
        )
        self.assertEqual(kinds(after), ["kernel"])
        self.assertExpectedInline(
            str(graph),
            """\
input arg0_1: float32[4, 8] stride=[8, 1]
input arg1_1: float32[8] stride=[1]
input arg2_1: float32[8] stride=[1]
buf0: float32[4, 1] stride=[1, 1] = Reduction(welford.m2, ranges=[4, 1], reduction_ranges=[8])
    tmp0 = load(arg0_1, r0 + 8*x0)
    tmp1 = to_dtype(tmp0, torch.float32)
    tmp2 = reduction('welford.m2', tmp1, torch.float32)
    store(buf0, x0, tmp2)
buf1: float32[4, 1] stride=[1, 1] = Reduction(welford.mean, ranges=[4, 1], reduction_ranges=[8])
    tmp0 = load(arg0_1, r0 + 8*x0)
    tmp1 = to_dtype(tmp0, torch.float32)
    tmp2 = reduction('welford.mean', tmp1, torch.float32)
    store(buf1, x0, tmp2)
buf2: float32[4, 1] stride=[1, 1] = Pointwise(ranges=[4, 1])
    tmp0 = load(buf0, x0)
    tmp1 = index_expr(8, torch.float32)
    tmp2 = truediv(tmp0, tmp1)
    tmp3 = to_dtype(tmp2, torch.float32)
    store(buf2, x0, tmp3)
buf3: float32[4, 1] stride=[1, 1] = Pointwise(ranges=[4, 1])
    tmp0 = load(buf2, x0)
    tmp1 = constant(1e-05, torch.float32)
    tmp2 = add(tmp0, tmp1)
    store(buf3, x0, tmp2)
buf4: float32[4, 1] stride=[1, 1] = Pointwise(ranges=[4, 1])
    tmp0 = load(buf3, x0)
    tmp1 = rsqrt(tmp0)
    store(buf4, x0, tmp1)
buf5: float32[4, 8] stride=[8, 1] = Pointwise(ranges=[4, 8])
    tmp0 = load(arg0_1, 8*x0 + x1)
    tmp1 = load(buf1, x0)
    tmp2 = sub(tmp0, tmp1)
    store(buf5, 8*x0 + x1, tmp2)
buf6: float32[4, 8] stride=[8, 1] = Pointwise(ranges=[4, 8])
    tmp0 = load(buf5, 8*x0 + x1)
    tmp1 = load(buf4, x0)
    tmp2 = mul(tmp0, tmp1)
    store(buf6, 8*x0 + x1, tmp2)
buf7: float32[4, 8] stride=[8, 1] = Pointwise(ranges=[4, 8])
    tmp0 = load(buf6, 8*x0 + x1)
    tmp1 = load(arg1_1, x1)
    tmp2 = mul(tmp0, tmp1)
    store(buf7, 8*x0 + x1, tmp2)
buf8: float32[4, 8] stride=[8, 1] = Pointwise(ranges=[4, 8])
    tmp0 = load(buf7, 8*x0 + x1)
    tmp1 = load(arg2_1, x1)
    tmp2 = add(tmp0, tmp1)
    store(buf8, 8*x0 + x1, tmp2)
buf9: float32[4, 8] stride=[8, 1] = Pointwise(ranges=[4, 8])
    tmp0 = load(buf8, 8*x0 + x1)
    tmp1 = constant(0.7071067811865476, torch.float32)
    tmp2 = mul(tmp0, tmp1)
    tmp3 = erf(tmp2)
    tmp4 = constant(0.5, torch.float32)
    tmp5 = mul(tmp0, tmp4)
    tmp6 = constant(1.0, torch.float32)
    tmp7 = add(tmp3, tmp6)
    tmp8 = mul(tmp5, tmp7)
    store(buf9, 8*x0 + x1, tmp8)
return (buf9[4, 8] stride=[8, 1] offset=0)""",
        )
        self.assertExpectedInline(
            str(after),
            """\
input arg0_1: float32[4, 8] stride=[8, 1]
input arg1_1: float32[8] stride=[1]
input arg2_1: float32[8] stride=[1]
kiln_fused_layer_norm_gelu_0: ranges=[4] reduction_ranges=[8] nodes=[buf0:reduction, buf2:outer, buf3:outer, buf4:outer, buf1:reduction, buf5:inner, buf6:inner, buf7:inner, buf8:inner, buf9:inner]
    # local: buf0, buf1, buf2, buf3, buf4, buf5, buf6, buf7, buf8
    tmp0 = load(arg0_1, r0 + 8*x0)
    tmp1 = to_dtype(tmp0, torch.float32)
    tmp2 = reduction('welford.m2', tmp1, torch.float32)
    tmp3 = index_expr(8, torch.float32)
    tmp4 = truediv(tmp2, tmp3)
    tmp5 = to_dtype(tmp4, torch.float32)
    tmp6 = constant(1e-05, torch.float32)
    tmp7 = add(tmp5, tmp6)
    tmp8 = rsqrt(tmp7)
    tmp9 = reduction('welford.mean', tmp1, torch.float32)
    tmp10 = sub(tmp0, tmp9)
    tmp11 = mul(tmp10, tmp8)
    tmp12 = load(arg1_1, r0)
    tmp13 = mul(tmp11, tmp12)
    tmp14 = load(arg2_1, r0)
    tmp15 = add(tmp13, tmp14)
    tmp16 = constant(0.7071067811865476, torch.float32)
    tmp17 = mul(tmp15, tmp16)
    tmp18 = erf(tmp17)
    tmp19 = constant(0.5, torch.float32)
    tmp20 = mul(tmp15, tmp19)
    tmp21 = constant(1.0, torch.float32)
    tmp22 = add(tmp18, tmp21)
    tmp23 = mul(tmp20, tmp22)
    store(buf9, r0 + 8*x0, tmp23)
return (buf9[4, 8] stride=[8, 1] offset=0)""",
        )

    def test_transpose_add(self):
        graph, after = stages(lambda x, y: x.t() + y, [torch.randn(4, 8), torch.randn(8, 4)])
        self.assertEqual(kinds(after), ["kernel"])
        self.assertExpectedInline(
            str(graph),
            """\
input arg0_1: float32[4, 8] stride=[8, 1]
input arg1_1: float32[8, 4] stride=[4, 1]
buf0: float32[8, 4] stride=[1, 8] = Pointwise(ranges=[8, 4])
    tmp0 = load(arg0_1, x0 + 8*x1)
    tmp1 = load(arg1_1, 4*x0 + x1)
    tmp2 = add(tmp0, tmp1)
    store(buf0, x0 + 8*x1, tmp2)
return (buf0[8, 4] stride=[1, 8] offset=0)""",
        )
        self.assertExpectedInline(
            str(after),
            """\
input arg0_1: float32[4, 8] stride=[8, 1]
input arg1_1: float32[8, 4] stride=[4, 1]
kiln_add_0: ranges=[8, 4] reduction_ranges=[] nodes=[buf0:outer]
    tmp0 = load(arg0_1, x0 + 8*x1)
    tmp1 = load(arg1_1, 4*x0 + x1)
    tmp2 = add(tmp0, tmp1)
    store(buf0, x0 + 8*x1, tmp2)
return (buf0[8, 4] stride=[1, 8] offset=0)""",
        )

    def test_cat(self):
        graph, after = stages(
            lambda x, y: torch.cat([x + 1, y * 2], 1), [torch.randn(2, 3), torch.randn(2, 2)]
        )
        self.assertEqual(kinds(after), ["kernel"])
        self.assertExpectedInline(
            str(graph),
            """\
input arg0_1: float32[2, 3] stride=[3, 1]
input arg1_1: float32[2, 2] stride=[2, 1]
buf2: float32[2, 5] stride=[5, 1] = Pointwise(ranges=[2, 5])
    tmp0 = index_expr(x1, torch.int64)
    tmp1 = index_expr(3, torch.int64)
    tmp2 = ge(tmp0, tmp1)
    tmp3 = index_expr(5, torch.int64)
    tmp4 = lt(tmp0, tmp3)
    tmp5 = logical_and(tmp2, tmp4)
    tmp6 = load(arg1_1, 2*x0 + x1 - 3, mask=tmp5)
    tmp7 = constant(2.0, torch.float32)
    tmp8 = mul(tmp6, tmp7)
    tmp9 = to_dtype(tmp8, torch.float32)
    tmp10 = masked(tmp5, tmp9, 0)
    tmp11 = index_expr(0, torch.int64)
    tmp12 = ge(tmp0, tmp11)
    tmp13 = lt(tmp0, tmp1)
    tmp14 = logical_and(tmp12, tmp13)
    tmp15 = load(arg0_1, 3*x0 + x1, mask=tmp14)
    tmp16 = constant(1.0, torch.float32)
    tmp17 = add(tmp15, tmp16)
    tmp18 = to_dtype(tmp17, torch.float32)
    tmp19 = masked(tmp14, tmp18, 0)
    tmp20 = where(tmp14, tmp19, tmp10)
    store(buf2, 5*x0 + x1, tmp20)
return (buf2[2, 5] stride=[5, 1] offset=0)""",
        )
        self.assertExpectedInline(
            str(after),
            """\
input arg0_1: float32[2, 3] stride=[3, 1]
input arg1_1: float32[2, 2] stride=[2, 1]
kiln_fused_add_mul_cat_0: ranges=[2, 5] reduction_ranges=[] nodes=[buf2:outer]
    tmp0 = index_expr(x1, torch.int64)
    tmp1 = index_expr(3, torch.int64)
    tmp2 = ge(tmp0, tmp1)
    tmp3 = index_expr(5, torch.int64)
    tmp4 = lt(tmp0, tmp3)
    tmp5 = logical_and(tmp2, tmp4)
    tmp6 = load(arg1_1, 2*x0 + x1 - 3, mask=tmp5)
    tmp7 = constant(2.0, torch.float32)
    tmp8 = mul(tmp6, tmp7)
    tmp9 = to_dtype(tmp8, torch.float32)
    tmp10 = masked(tmp5, tmp9, 0)
    tmp11 = index_expr(0, torch.int64)
    tmp12 = ge(tmp0, tmp11)
    tmp13 = lt(tmp0, tmp1)
    tmp14 = logical_and(tmp12, tmp13)
    tmp15 = load(arg0_1, 3*x0 + x1, mask=tmp14)
    tmp16 = constant(1.0, torch.float32)
    tmp17 = add(tmp15, tmp16)
    tmp18 = to_dtype(tmp17, torch.float32)
    tmp19 = masked(tmp14, tmp18, 0)
    tmp20 = where(tmp14, tmp19, tmp10)
    store(buf2, 5*x0 + x1, tmp20)
return (buf2[2, 5] stride=[5, 1] offset=0)""",
        )

    def test_gather(self):
        graph, after = stages(
            lambda x, i: torch.gather(x.exp(), 1, i) * 2,
            [torch.randn(4, 8), torch.randint(0, 8, (4, 3))],
        )
        self.assertEqual(kinds(after), ["kernel"])
        self.assertExpectedInline(
            str(graph),
            """\
input arg0_1: float32[4, 8] stride=[8, 1]
input arg1_1: int64[4, 3] stride=[3, 1]
buf1: float32[4, 3] stride=[3, 1] = Pointwise(ranges=[4, 3])
    tmp0 = load(arg1_1, 3*x0 + x1)
    tmp1 = indirect_indexing(tmp0, 8)
    tmp2 = load(arg0_1, tmp1 + 8*x0)
    tmp3 = exp(tmp2)
    store(buf1, 3*x0 + x1, tmp3)
buf2: float32[4, 3] stride=[3, 1] = Pointwise(ranges=[4, 3])
    tmp0 = load(buf1, 3*x0 + x1)
    tmp1 = constant(2.0, torch.float32)
    tmp2 = mul(tmp0, tmp1)
    store(buf2, 3*x0 + x1, tmp2)
return (buf2[4, 3] stride=[3, 1] offset=0)""",
        )
        self.assertExpectedInline(
            str(after),
            """\
input arg0_1: float32[4, 8] stride=[8, 1]
input arg1_1: int64[4, 3] stride=[3, 1]
kiln_fused_exp_gather_mul_0: ranges=[4, 3] reduction_ranges=[] nodes=[buf1:outer, buf2:outer]
    # local: buf1
    tmp0 = load(arg1_1, 3*x0 + x1)
    tmp1 = indirect_indexing(tmp0, 8)
    tmp2 = load(arg0_1, tmp1 + 8*x0)
    tmp3 = exp(tmp2)
    tmp4 = constant(2.0, torch.float32)
    tmp5 = mul(tmp3, tmp4)
    store(buf2, 3*x0 + x1, tmp5)
return (buf2[4, 3] stride=[3, 1] offset=0)""",
        )

    def test_var_mean(self):
        graph, after = stages(lambda x: torch.var_mean(x, 1), [torch.randn(4, 8)])
        self.assertEqual(kinds(after), ["kernel"])
        self.assertExpectedInline(
            str(graph),
            """\
input arg0_1: float32[4, 8] stride=[8, 1]
buf0: float32[4] stride=[1] = Reduction(welford.m2, ranges=[4], reduction_ranges=[8])
    tmp0 = load(arg0_1, r0 + 8*x0)
    tmp1 = to_dtype(tmp0, torch.float32)
    tmp2 = reduction('welford.m2', tmp1, torch.float32)
    store(buf0, x0, tmp2)
buf1: float32[4] stride=[1] = Reduction(welford.mean, ranges=[4], reduction_ranges=[8])
    tmp0 = load(arg0_1, r0 + 8*x0)
    tmp1 = to_dtype(tmp0, torch.float32)
    tmp2 = reduction('welford.mean', tmp1, torch.float32)
    store(buf1, x0, tmp2)
buf2: float32[4] stride=[1] = Pointwise(ranges=[4])
    tmp0 = load(buf0, x0)
    tmp1 = index_expr(7, torch.float32)
    tmp2 = truediv(tmp0, tmp1)
    tmp3 = to_dtype(tmp2, torch.float32)
    store(buf2, x0, tmp3)
return (buf2[4] stride=[1] offset=0, buf1[4] stride=[1] offset=0)""",
        )
        self.assertExpectedInline(
            str(after),
            """\
input arg0_1: float32[4, 8] stride=[8, 1]
kiln_var_mean_0: ranges=[4] reduction_ranges=[8] nodes=[buf0:reduction, buf1:reduction, buf2:outer]
    # local: buf0
    tmp0 = load(arg0_1, r0 + 8*x0)
    tmp1 = to_dtype(tmp0, torch.float32)
    tmp2 = reduction('welford.m2', tmp1, torch.float32)
    tmp3 = reduction('welford.mean', tmp1, torch.float32)
    store(buf1, x0, tmp3)
    tmp4 = index_expr(7, torch.float32)
    tmp5 = truediv(tmp2, tmp4)
    tmp6 = to_dtype(tmp5, torch.float32)
    store(buf2, x0, tmp6)
return (buf2[4] stride=[1] offset=0, buf1[4] stride=[1] offset=0)""",
        )

    def test_matmul_bias_gelu(self):
        with mock.patch.object(matmul, "INLINE_MATMUL_MAX_MNK", 0):  # BLAS-sized, as it were
            graph, after = stages(
                lambda x, w, b: F.gelu(x @ w + b),
                [torch.randn(4, 8), torch.randn(8, 8), torch.randn(8)],
            )
        self.assertEqual(kinds(after), ["extern", "kernel"])
        self.assertExpectedInline(
            str(graph),
            """\
input arg0_1: float32[4, 8] stride=[8, 1]
input arg1_1: float32[8, 8] stride=[8, 1]
input arg2_1: float32[8] stride=[1]
buf0 = extern aten.mm.default(arg0_1[4, 8] stride=[8, 1] offset=0, arg1_1[8, 8] stride=[8, 1] offset=0)
    buf0: float32[4, 8] stride=[8, 1]
buf1: float32[4, 8] stride=[8, 1] = Pointwise(ranges=[4, 8])
    tmp0 = load(buf0, 8*x0 + x1)
    tmp1 = load(arg2_1, x1)
    tmp2 = add(tmp0, tmp1)
    store(buf1, 8*x0 + x1, tmp2)
buf2: float32[4, 8] stride=[8, 1] = Pointwise(ranges=[4, 8])
    tmp0 = load(buf1, 8*x0 + x1)
    tmp1 = constant(0.7071067811865476, torch.float32)
    tmp2 = mul(tmp0, tmp1)
    tmp3 = erf(tmp2)
    tmp4 = constant(0.5, torch.float32)
    tmp5 = mul(tmp0, tmp4)
    tmp6 = constant(1.0, torch.float32)
    tmp7 = add(tmp3, tmp6)
    tmp8 = mul(tmp5, tmp7)
    store(buf2, 8*x0 + x1, tmp8)
return (buf2[4, 8] stride=[8, 1] offset=0)""",
        )
        self.assertExpectedInline(
            str(after),
            """\
input arg0_1: float32[4, 8] stride=[8, 1]
input arg1_1: float32[8, 8] stride=[8, 1]
input arg2_1: float32[8] stride=[1]
buf0 = extern aten.mm.default(arg0_1[4, 8] stride=[8, 1] offset=0, arg1_1[8, 8] stride=[8, 1] offset=0)
    buf0: float32[4, 8] stride=[8, 1]
kiln_fused_add_gelu_0: ranges=[4, 8] reduction_ranges=[] nodes=[buf1:outer, buf2:outer]
    # local: buf1
    tmp0 = load(buf0, 8*x0 + x1)
    tmp1 = load(arg2_1, x1)
    tmp2 = add(tmp0, tmp1)
    tmp3 = constant(0.7071067811865476, torch.float32)
    tmp4 = mul(tmp2, tmp3)
    tmp5 = erf(tmp4)
    tmp6 = constant(0.5, torch.float32)
    tmp7 = mul(tmp2, tmp6)
    tmp8 = constant(1.0, torch.float32)
    tmp9 = add(tmp5, tmp8)
    tmp10 = mul(tmp7, tmp9)
    store(buf2, 8*x0 + x1, tmp10)
return (buf2[4, 8] stride=[8, 1] offset=0)""",
        )

    def test_small_matmul_bias_gelu(self):
        # a small product on the CPU: a dot reduction over k, bias and gelu in its kernel
        graph, after = stages(
            lambda x, w, b: F.gelu(x @ w.t() + b),
            [torch.randn(4, 8), torch.randn(6, 8), torch.randn(6)],
        )
        self.assertEqual(kinds(after), ["kernel"])
        self.assertExpectedInline(
            str(after),
            """\
input arg0_1: float32[4, 8] stride=[8, 1]
input arg1_1: float32[6, 8] stride=[8, 1]
input arg2_1: float32[6] stride=[1]
kiln_fused_mm_add_gelu_0: ranges=[4, 6] reduction_ranges=[8] nodes=[buf0:reduction, buf1:outer, buf2:outer]
    # local: buf0, buf1
    tmp0 = load(arg0_1, r0 + 8*x0)
    tmp1 = to_dtype(tmp0, torch.float32)
    tmp2 = load(arg1_1, r0 + 8*x1)
    tmp3 = to_dtype(tmp2, torch.float32)
    tmp4 = mul(tmp1, tmp3)
    tmp5 = reduction('dot', tmp4, torch.float32)
    tmp6 = load(arg2_1, x1)
    tmp7 = add(tmp5, tmp6)
    tmp8 = constant(0.7071067811865476, torch.float32)
    tmp9 = mul(tmp7, tmp8)
    tmp10 = erf(tmp9)
    tmp11 = constant(0.5, torch.float32)
    tmp12 = mul(tmp7, tmp11)
    tmp13 = constant(1.0, torch.float32)
    tmp14 = add(tmp10, tmp13)
    tmp15 = mul(tmp12, tmp14)
    store(buf2, 6*x0 + x1, tmp15)
return (buf2[4, 6] stride=[6, 1] offset=0)""",
        )

    def test_host_program_of_matmul_bias_gelu(self):
        with mock.patch.object(matmul, "INLINE_MATMUL_MAX_MNK", 0):
            compiled = check_against_eager(
                lambda x, w, b: F.gelu(x @ w + b),
                [torch.randn(4, 8), torch.randn(8, 8), torch.randn(8)],
            )
        self.assertExpectedInline(
            compiled.host_source,
            """\
aten_mm_default = bind_op(aten.mm.default)


def call(arg0_1, arg1_1, arg2_1):
    buf0 = aten_mm_default(arg0_1, arg1_1)
    buf0 = match_layout(buf0, (4, 8), (8, 1), 'aten.mm.default output buf0')
    buf2 = buf0  # in place
    kiln_fused_add_gelu_0(arg2_1, buf0, buf2)
    del buf0
    return (buf2,)


def check(arg0_1, arg1_1, arg2_1):
    assert_size_stride(arg0_1, (4, 8), (8, 1), 'input 0 (arg0_1)')
    assert_size_stride(arg1_1, (8, 8), (8, 1), 'input 1 (arg1_1)')
    assert_size_stride(arg2_1, (8,), (1,), 'input 2 (arg2_1)')
""",
        )

    def test_host_program_with_symbolic_sizes_and_views(self):
        compiled = check_against_eager(
            lambda x: (x.softmax(-1), x.t()[1:]), [torch.randn(5, 6)], dynamic=True
        )
        self.assertExpectedInline(
            canonical_sizes(compiled.host_source),
            """\
def call(arg0_1):
    s0 = arg0_1.size(0)
    s1 = arg0_1.size(1)
    assert_size_stride(arg0_1, (s0, s1), (s1, 1), 'input 0 (arg0_1)')
    buf2 = empty_strided((s0, s1), (s1, 1), torch.float32, 'cpu')
    kiln_softmax_0(arg0_1, buf2, s0, s1)
    return (buf2, reinterpret(arg0_1, (s1 - 1, s0), (1, s1), 1))


def check(arg0_1):
    pass
""",
        )
