"""The Triton functions of Kiln's fused attention kernel (:mod:`kiln_triton.attention`
says what it computes and when the native host program launches it), in a module that
imports nothing but Triton: a compile worker imports it without torch."""

import triton
import triton.language as tl


@triton.jit
def scores(q, kt, Bias, b, h, offs_m, offs_n, rows, cols, qk_scale,
           sbb, sbh, sbm, sbn,
           HAS_BIAS: tl.constexpr, IS_CAUSAL: tl.constexpr, PRECISION: tl.constexpr):  # fmt: skip
    """Scores of a block of queries by a block of keys (``kt``: transposed), scaled, plus
    the bias, in base 2 (times log2(e)); -inf where masked out or past the last key."""
    qk = tl.dot(q, kt, input_precision=PRECISION) * qk_scale
    if HAS_BIAS:
        bias = tl.load(
            Bias + b * sbb + h * sbh + offs_m[:, None] * sbm + offs_n[None, :] * sbn,
            mask=rows[:, None] & cols[None, :],
            other=0.0,
        )
        qk += bias.to(tl.float32) * 1.4426950408889634
    keep = cols[None, :]  # a row past the last query reads zeros: its results are not stored
    if IS_CAUSAL:
        keep = keep & (offs_n[None, :] <= offs_m[:, None])
    return tl.where(keep, qk, float("-inf"))


@triton.jit
def transposed(X, b, h, offs_n, offs_d, cols, sxb, sxh, sxn, sxd):
    """A block of keys (or values) of head ``h``, transposed: [head size, block]."""
    return tl.load(
        X + b * sxb + h * sxh + offs_n[None, :] * sxn + offs_d[:, None] * sxd,
        mask=cols[None, :],
        other=0.0,
    )


@triton.jit
def attention_fwd(
    Q, K, V, Bias, Out, LSE, sm_scale,
    sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd,
    sbb, sbh, sbm, sbn, sob, soh, som, sod, slb, slh, slm,
    H, M, N,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_BIAS: tl.constexpr, IS_CAUSAL: tl.constexpr, HAS_LSE: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    kv = h // GROUP
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = offs_m < M
    q = tl.load(
        Q + b * sqb + h * sqh + offs_m[:, None] * sqm + offs_d[None, :] * sqd,
        mask=rows[:, None],
        other=0.0,
    )
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    qk_scale = sm_scale * 1.4426950408889634
    end = N
    if IS_CAUSAL:
        end = tl.minimum(N, (pid_m + 1) * BLOCK_M)
    for start in range(0, end, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        cols = offs_n < N
        k = transposed(K, b, kv, offs_n, offs_d, cols, skb, skh, skn, skd)
        qk = scores(q, k, Bias, b, h, offs_m, offs_n, rows, cols, qk_scale,
                    sbb, sbh, sbm, sbn, HAS_BIAS, IS_CAUSAL, PRECISION)  # fmt: skip
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(qk - m_safe[:, None])
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(
            V + b * svb + kv * svh + offs_n[:, None] * svn + offs_d[None, :] * svd,
            mask=cols[:, None],
            other=0.0,
        )
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    out = tl.where(l_i[:, None] > 0, acc / l_i[:, None], 0.0)
    tl.store(
        Out + b * sob + h * soh + offs_m[:, None] * som + offs_d[None, :] * sod,
        out.to(Out.dtype.element_ty),
        mask=rows[:, None],
    )
    if HAS_LSE:  # natural logarithm; m_i and log2(l_i) are base 2
        lse = (m_i + tl.math.log2(l_i)) * 0.6931471805599453
        tl.store(LSE + b * slb + h * slh + offs_m * slm, lse, mask=rows)
