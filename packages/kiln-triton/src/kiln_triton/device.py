"""Device functions the generated kernels call (imported there as ``kt``).

Integer division and remainder floor as in Python and torch; reductions combine with NaN
propagation and first-index ties as eager does; ``uniform`` and ``randn`` hash a seed and
an offset exactly as kiln-loopir's reference backend does. ``libdevice`` is Triton's CUDA
math library, or, under ``TRITON_INTERPRET=1`` (which cannot call it), the same functions
evaluated with torch on the host.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"

if INTERPRET:
    from kiln_triton.interpreter import libdevice
else:
    from triton.language.extra import libdevice  # noqa: F401


def jit_later(fn):
    """Marks a kernel module's variant, made a ``triton.jit`` function at its first use
    (:func:`kiln_triton.variants.jit_function`) rather than at import."""
    fn.__kiln_jit_later__ = True
    return fn


# -- integer division that floors (the primitives truncate on GPU) ---------------------------
@triton.jit
def floordiv_int(a, b):
    q = a // b
    r = a - q * b
    fix = (r != 0) & ((r < 0) != (b < 0))
    return tl.where(fix, q - 1, q)


@triton.jit
def mod_int(a, b):
    q = a // b
    r = a - q * b
    fix = (r != 0) & ((r < 0) != (b < 0))
    return tl.where(fix, r + b, r)


@triton.jit
def truncdiv_int(a, b):
    q = floordiv_int(a, b)
    r = a - q * b
    return tl.where((r != 0) & ((a < 0) != (b < 0)), q + 1, q)


@triton.jit
def fmod_int(a, b):
    return a - truncdiv_int(a, b) * b


@triton.jit
def pow_int(base, exp):
    result = tl.full(base.shape, 1, base.dtype) * (exp * 0 + 1).to(base.dtype)
    b = base + result * 0
    e = exp + (base * 0).to(exp.dtype)
    for _ in range(63):
        result = tl.where((e & 1) != 0, result * b, result)
        b = b * b
        e = e >> 1
    return result


@triton.jit
def shl(a, b):
    return tl.where(b < a.dtype.primitive_bitwidth, a << b, 0)


@triton.jit
def shr(a, b):
    return a >> tl.minimum(b, a.dtype.primitive_bitwidth - 1)


# -- float ops with torch's semantics ---------------------------------------------------------
@triton.jit
def floordiv_float(a, b):
    mod = libdevice.fmod(a, b)
    div = (a - mod) / b
    div = tl.where((mod != 0) & ((b < 0) != (mod < 0)), div - 1, div)
    floored = tl.floor(div)
    floored = tl.where(div - floored > 0.5, floored + 1, floored)
    out = tl.where(div != 0, floored, libdevice.copysign(div * 0, a / b))
    return tl.where(b == 0, a / b, out)


@triton.jit
def remainder_float(a, b):
    mod = libdevice.fmod(a, b)
    return tl.where((mod != 0) & ((b < 0) != (mod < 0)), mod + b, mod)


@triton.jit
def maximum(a, b):
    return tl.where((a > b) | (a != a), a, b)


@triton.jit
def minimum(a, b):
    return tl.where((a < b) | (a != a), a, b)


@triton.jit
def sign(x):
    return (x > 0).to(x.dtype) - (x < 0).to(x.dtype)


@triton.jit
def isinf(x):
    return (x == float("inf")) | (x == float("-inf"))


@triton.jit
def isfinite(x):
    return (x == x) & ~isinf(x)


@triton.jit
def sigmoid(x):
    return 1 / (1 + tl.exp(-x))


@triton.jit
def literal(value: tl.constexpr, like):
    # ``value`` in ``like``'s type: Triton makes a Python float a float32 constant, which
    # would round float64 arithmetic to float32's precision
    return tl.full([], value, like.dtype)


@triton.jit
def digamma(x):
    # reflection for x < 0.5, the recurrence up to 6, then the asymptotic series
    reflect = x < 0.5
    pi = literal(3.141592653589793, x)
    y = tl.where(reflect, 1 - x, x)
    acc = y * 0
    for _ in range(6):
        small = y < 6
        acc = tl.where(small, acc - 1 / y, acc)
        y = tl.where(small, y + 1, y)
    inv = 1 / y
    inv2 = inv * inv
    series = tl.log(y) - 0.5 * inv
    c12, c120, c252, c240 = (literal(1 / 12, x), literal(1 / 120, x), literal(1 / 252, x),
                             literal(1 / 240, x))  # fmt: skip
    series -= inv2 * (c12 - inv2 * (c120 - inv2 * (c252 - inv2 * c240)))
    out = acc + series
    # tan(pi x) of the fractional part, as ATen: exact, and tan is periodic in pi
    out = tl.where(reflect, out - pi / libdevice.tan(pi * (x - libdevice.trunc(x))), out)
    return tl.where((x == tl.floor(x)) & (x <= 0), float("nan"), out)


@triton.jit
def trigamma(x):
    # as ATen: reflection below 1/2 (psi1(x) = pi^2 / sin^2(pi x) - psi1(1 - x)), six steps
    # up, then the asymptotic series
    reflect = x < 0.5
    pi = literal(3.141592653589793, x)
    sin_pi_x = tl.sin(pi * x)  # as ATen (not of the fractional part, as digamma)
    y = tl.where(reflect, 1 - x, x)
    acc = tl.zeros_like(y)
    for _ in range(6):
        acc += 1 / (y * y)
        y += 1
    ixx = 1 / (y * y)
    c6, c30, c42 = literal(1 / 6, x), literal(1 / 30, x), literal(1 / 42, x)
    acc += (1 + 1 / (2 * y) + ixx * (c6 - ixx * (c30 - ixx * c42))) / y
    return tl.where(reflect, pi * pi / (sin_pi_x * sin_pi_x) - acc, acc)


@triton.jit
def _zeta_tail_term(s, p, b, done, x, w, k, coefficient: tl.constexpr):
    # one Euler-Maclaurin term, (x)_(2k+1) w^(-x-2k-1) B_(2k+2) / (2k+2)!; a lane stops
    # adding once a term is below double's epsilon of its sum, as Cephes does
    p = p * (x + k)
    b = b / w
    t = tl.where(b == 0, 0.0, p * b / literal(coefficient, b))  # p may overflow in float32
    s = tl.where(done, s, s + t)
    done = done | (tl.abs(t / s) < 1.1102230246251565e-16)
    return s, p * (x + k + 1), b / w, done


@triton.jit
def zeta(x, q):
    # the Hurwitz zeta function as Cephes (and ATen) computes it: the terms (q + k)^-x summed
    # until q + k passes 9 (nine at least; one loop bound for the block), then the
    # Euler-Maclaurin tail; q below -1e7 is taken as far as nine terms reach
    x, q = tl.broadcast(x, q)  # one of them may be a scalar (polygamma's order)
    steps = tl.where(q > -1e7, tl.maximum(tl.floor(9 - q) + 1, 9.0), 9.0)
    steps = tl.where(steps == steps, steps, 9.0)
    s = libdevice.pow(q, -x)
    a = q
    b = s * 0
    for k in range(tl.max(steps).to(tl.int32)):
        go = k < steps
        a = tl.where(go, a + 1, a)
        b = tl.where(go, libdevice.pow(a, -x), b)
        s = tl.where(go, s + b, s)
    w = a
    s += b * w / (x - 1) - 0.5 * b
    p = s * 0 + 1
    done = s != s
    s, p, b, done = _zeta_tail_term(s, p, b, done, x, w, 0.0, 12.0)
    s, p, b, done = _zeta_tail_term(s, p, b, done, x, w, 2.0, -720.0)
    s, p, b, done = _zeta_tail_term(s, p, b, done, x, w, 4.0, 30240.0)
    s, p, b, done = _zeta_tail_term(s, p, b, done, x, w, 6.0, -1209600.0)
    s, p, b, done = _zeta_tail_term(s, p, b, done, x, w, 8.0, 47900160.0)
    s, p, b, done = _zeta_tail_term(s, p, b, done, x, w, 10.0, -1.8924375803183791606e9)
    s, p, b, done = _zeta_tail_term(s, p, b, done, x, w, 12.0, 7.47242496e10)
    s, p, b, done = _zeta_tail_term(s, p, b, done, x, w, 14.0, -2.950130727918164224e12)
    s, p, b, done = _zeta_tail_term(s, p, b, done, x, w, 16.0, 1.1646782814350067249e14)
    s, p, b, done = _zeta_tail_term(s, p, b, done, x, w, 18.0, -4.5979787224074726105e15)
    s, p, b, done = _zeta_tail_term(s, p, b, done, x, w, 20.0, 1.8152105401943546773e17)
    s, p, b, done = _zeta_tail_term(s, p, b, done, x, w, 22.0, -7.1661652561756670113e18)
    # inf at x = 1 and at the poles q = 0, -1, ...; NaN for x < 1 and, at negative q, for
    # an x that is not an integer
    s = tl.where((q <= 0) & (x != tl.floor(x)), float("nan"), s)
    s = tl.where((q <= 0) & (q == tl.floor(q)), float("inf"), s)
    s = tl.where(x < 1, float("nan"), s)
    return tl.where(x == 1, float("inf"), s)


# exp(-|x|) I0(x) and exp(-|x|) I1(x): libdevice's Bessel functions scaled, then, past 50
# (where I0 nears float32's range), the asymptotic series in r = 1 / (8|x|)
@triton.jit
def i0e(x):
    a = tl.abs(x)
    near = tl.minimum(a, 50.0)
    scaled = libdevice.cyl_bessel_i0(near) * tl.exp(-near)
    r = 1 / (8 * tl.maximum(a, 50.0))
    series = 1 + r * (1 + r * (4.5 + r * (37.5 + r * (459.375 + r * 7441.875))))
    far = series / libdevice.sqrt(6.283185307179586 * tl.maximum(a, 50.0))
    return tl.where(a <= 50.0, scaled, tl.where(a == float("inf"), 0.0, far))


@triton.jit
def i1e(x):
    a = tl.abs(x)
    near = tl.minimum(a, 50.0)
    scaled = libdevice.cyl_bessel_i1(near) * tl.exp(-near)
    r = 1 / (8 * tl.maximum(a, 50.0))
    series = 1 - r * (3 + r * (7.5 + r * (52.5 + r * (590.625 + r * 9095.625))))
    far = series / libdevice.sqrt(6.283185307179586 * tl.maximum(a, 50.0))
    out = tl.where(a <= 50.0, scaled, tl.where(a == float("inf"), 0.0, far))
    return tl.where(x < 0, -out, out)


# -- reductions -------------------------------------------------------------------------------
@triton.jit
def prod_combine(a, b):
    return a * b


@triton.jit
def max_combine(a, b):
    return maximum(a, b)


@triton.jit
def min_combine(a, b):
    return minimum(a, b)


@triton.jit
def argmax_combine(a, ia, b, ib):
    nan_a = a != a
    nan_b = b != b
    take_a = (a > b) | (nan_a & ~nan_b) | (((a == b) | (nan_a & nan_b)) & (ia < ib))
    return tl.where(take_a, a, b), tl.where(take_a, ia, ib)


@triton.jit
def argmin_combine(a, ia, b, ib):
    nan_a = a != a
    nan_b = b != b
    take_a = (a < b) | (nan_a & ~nan_b) | (((a == b) | (nan_a & nan_b)) & (ia < ib))
    return tl.where(take_a, a, b), tl.where(take_a, ia, ib)


# -- scans: ``a`` the running value (earlier), ``b`` the later one ----------------------------
@triton.jit
def log_add_exp_combine(a, b):
    # log(exp(a) + exp(b)) as ATen's logcumsumexp steps: a NaN on either side stays, equal
    # infinities are kept as they are
    lo = tl.minimum(a, b)
    hi = tl.maximum(a, b)
    keep = (lo == hi) & ~isfinite(lo)
    out = tl.where(keep, b, libdevice.log1p(tl.exp(lo - hi)) + hi)
    return tl.where((a != a) | (b != b), a + b, out)


@triton.jit
def cummax_combine(a, ia, b, ib):
    # the later of equal values; a NaN once seen stays, at its latest position
    take_b = (b != b) | ((a == a) & (b >= a))
    return tl.where(take_b, b, a), tl.where(take_b, ib, ia)


@triton.jit
def cummin_combine(a, ia, b, ib):
    take_b = (b != b) | ((a == a) & (b <= a))
    return tl.where(take_b, b, a), tl.where(take_b, ib, ia)


@triton.jit
def welford_combine(mean_a, m2_a, n_a, mean_b, m2_b, n_b):
    n = n_a + n_b
    delta = mean_b - mean_a
    frac = tl.where(n == 0, 0.0, n_b / tl.where(n == 0, 1.0, n))
    return mean_a + delta * frac, m2_a + m2_b + delta * delta * n_a * frac, n


@triton.jit
def welford_update(mean, m2, n, value, mask):
    n_new = tl.where(mask, n + 1, n)
    delta = value - mean
    mean_new = tl.where(mask, mean + delta / tl.where(mask, n_new, 1.0), mean)
    m2_new = tl.where(mask, m2 + delta * (value - mean_new), m2)
    return mean_new, m2_new, n_new


# -- random numbers: a counter-based hash of (seed, offset) -----------------------------------
@triton.jit
def _fmix32(h):
    h = h ^ (h >> 16)
    h = h * 0x85EBCA6B
    h = h ^ (h >> 13)
    h = h * 0xC2B2AE35
    return h ^ (h >> 16)


@triton.jit
def uniform(seed, offset):
    s = seed.to(tl.int64)
    o = offset.to(tl.int64)
    h = _fmix32(s.to(tl.uint32) ^ _fmix32(o.to(tl.uint32)))
    h = _fmix32(h ^ (o >> 32).to(tl.uint32) ^ (s >> 32).to(tl.uint32))
    return (h >> 8).to(tl.float32) * (1.0 / 16777216.0)


@triton.jit
def randn(seed, offset):
    o = offset.to(tl.int64)
    u1 = tl.maximum(uniform(seed, o * 2), 1e-7)
    u2 = uniform(seed, o * 2 + 1)
    return tl.sqrt(-2.0 * tl.log(u1)) * tl.cos(6.283185307179586 * u2)


# libdevice's normcdfinv in float32 is off by about 1e-5 (relative) near p = 1, where ATen's
# float32 ndtri is within an ulp or two: computed in float64 and rounded, it is too
@triton.jit
def ndtri(x):
    return libdevice.normcdfinv(x.to(tl.float64)).to(x.dtype)
