"""The Triton functions of the backward of Kiln's fused attention kernel
(:mod:`kiln_triton.attention_backward` says what it computes), in a module that imports
nothing but Triton and the forward's functions: a compile worker imports it without torch."""

import triton
import triton.language as tl

from kiln_triton.attention_jit import scores, transposed


@triton.jit
def _query_block(
    Q, DOut, Out, LSE, b, h, offs_m, offs_d, rows,
    sqb, sqh, sqm, sqd, sob, soh, som, sod, sgb, sgh, sgm, sgd, slb, slh, slm,
):  # fmt: skip
    """A block of queries: their values, their outputs' gradients, their log-sum-exps in
    base 2 (+inf for a row whose keys are all masked, so that its probabilities are 0) and
    ``rowsum(dO * O)``."""
    q = tl.load(
        Q + b * sqb + h * sqh + offs_m[:, None] * sqm + offs_d[None, :] * sqd,
        mask=rows[:, None],
        other=0.0,
    )
    do = tl.load(
        DOut + b * sgb + h * sgh + offs_m[:, None] * sgm + offs_d[None, :] * sgd,
        mask=rows[:, None],
        other=0.0,
    )
    o = tl.load(
        Out + b * sob + h * soh + offs_m[:, None] * som + offs_d[None, :] * sod,
        mask=rows[:, None],
        other=0.0,
    )
    lse = tl.load(LSE + b * slb + h * slh + offs_m * slm, mask=rows, other=0.0)
    lse = tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)
    delta = tl.sum(do.to(tl.float32) * o.to(tl.float32), 1)
    return q, do, lse, delta


@triton.jit
def _score_gradients(q, kt, vt, do, lse, delta, Bias, b, h, offs_m, offs_n, rows, cols,
                     qk_scale, sbb, sbh, sbm, sbn,
                     HAS_BIAS: tl.constexpr, IS_CAUSAL: tl.constexpr,
                     PRECISION: tl.constexpr):  # fmt: skip
    """The probabilities ``P`` of a block of queries by a block of keys and the gradient of
    their scores, ``dS = P (dO Vᵀ - rowsum(dO * O))``."""
    qk = scores(q, kt, Bias, b, h, offs_m, offs_n, rows, cols, qk_scale,
                sbb, sbh, sbm, sbn, HAS_BIAS, IS_CAUSAL, PRECISION)  # fmt: skip
    p = tl.math.exp2(qk - lse[:, None])
    dp = tl.dot(do, vt, input_precision=PRECISION)
    return p, p * (dp - delta[:, None])


@triton.jit
def attention_bwd(
    Q, K, V, Bias, Out, DOut, LSE, DQ, DK, DV, sm_scale,
    sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd,
    sbb, sbh, sbm, sbn, sob, soh, som, sod, sgb, sgh, sgm, sgd, slb, slh, slm,
    sdqb, sdqh, sdqm, sdqd, sdkb, sdkh, sdkn, sdkd, sdvb, sdvh, sdvn, sdvd,
    H, M, N,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_BIAS: tl.constexpr, IS_CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    offs_d = tl.arange(0, HEAD_DIM)
    qk_scale = sm_scale * 1.4426950408889634

    # the key and value gradients of key block pid
    start_n = pid * BLOCK_N
    if start_n < N:
        offs_n = start_n + tl.arange(0, BLOCK_N)
        cols = offs_n < N
        kt = transposed(K, b, h, offs_n, offs_d, cols, skb, skh, skn, skd)
        vt = transposed(V, b, h, offs_n, offs_d, cols, svb, svh, svn, svd)
        dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
        dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
        first = 0
        if IS_CAUSAL:
            first = (start_n // BLOCK_M) * BLOCK_M  # earlier queries see none of these keys
        for start_m in range(first, M, BLOCK_M):
            offs_m = start_m + tl.arange(0, BLOCK_M)
            rows = offs_m < M
            q, do, lse, delta = _query_block(
                Q, DOut, Out, LSE, b, h, offs_m, offs_d, rows,
                sqb, sqh, sqm, sqd, sob, soh, som, sod, sgb, sgh, sgm, sgd, slb, slh, slm,
            )  # fmt: skip
            p, ds = _score_gradients(q, kt, vt, do, lse, delta, Bias, b, h, offs_m, offs_n,
                                     rows, cols, qk_scale, sbb, sbh, sbm, sbn,
                                     HAS_BIAS, IS_CAUSAL, PRECISION)  # fmt: skip
            dv += tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=PRECISION)
            dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PRECISION)
        dk = dk * sm_scale
        tl.store(
            DK + b * sdkb + h * sdkh + offs_n[:, None] * sdkn + offs_d[None, :] * sdkd,
            dk.to(DK.dtype.element_ty),
            mask=cols[:, None],
        )
        tl.store(
            DV + b * sdvb + h * sdvh + offs_n[:, None] * sdvn + offs_d[None, :] * sdvd,
            dv.to(DV.dtype.element_ty),
            mask=cols[:, None],
        )

    # the query gradient of query block pid
    start_m = pid * BLOCK_M
    if start_m < M:
        offs_m = start_m + tl.arange(0, BLOCK_M)
        rows = offs_m < M
        q, do, lse, delta = _query_block(
            Q, DOut, Out, LSE, b, h, offs_m, offs_d, rows,
            sqb, sqh, sqm, sqd, sob, soh, som, sod, sgb, sgh, sgm, sgd, slb, slh, slm,
        )  # fmt: skip
        dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        end = N
        if IS_CAUSAL:
            end = tl.minimum(N, start_m + BLOCK_M)  # later keys are masked for all these rows
        for start_n in range(0, end, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            cols = offs_n < N
            kt = transposed(K, b, h, offs_n, offs_d, cols, skb, skh, skn, skd)
            vt = transposed(V, b, h, offs_n, offs_d, cols, svb, svh, svn, svd)
            _, ds = _score_gradients(q, kt, vt, do, lse, delta, Bias, b, h, offs_m, offs_n,
                                     rows, cols, qk_scale, sbb, sbh, sbm, sbn,
                                     HAS_BIAS, IS_CAUSAL, PRECISION)  # fmt: skip
            dq += tl.dot(ds.to(kt.dtype), tl.trans(kt), input_precision=PRECISION)
        dq = dq * sm_scale
        tl.store(
            DQ + b * sdqb + h * sdqh + offs_m[:, None] * sdqm + offs_d[None, :] * sdqd,
            dq.to(DQ.dtype.element_ty),
            mask=rows[:, None],
        )
