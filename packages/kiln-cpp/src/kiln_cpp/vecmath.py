"""Float functions the compiler can vectorise: ``std::exp`` and friends are calls into libm
that a ``#pragma omp simd`` loop cannot vectorise (glibc's headers declare their vector
variants only under ``-ffast-math``), so

- ``exp``, ``sigmoid``, ``tanh`` and ``erf`` of float values are rendered as ``kiln::``
  functions written without branches or calls. ``pow`` by a constant 2, 3 or 0.5 (GPT-2's
  tanh GELU cubes its input) multiplies or takes the square root as eager does; the
  compiler folds the test away;
- the other transcendentals (:data:`LIBM_UNARY`, :data:`LIBM_BINARY`, and ``exp``,
  ``tanh``, ``erf`` of doubles) call ``kiln_vm_<name>`` functions: where the build found
  glibc's vector math library (``KILN_LIBMVEC``, see :func:`kiln_cpp.build.optional_flags`)
  these are libm's own ``sinf``, ``log``, ... declared with ``simd("notinbranch")`` under
  another name (so the compiler neither folds ``sin`` and ``cos`` of one value into a
  scalar ``sincosf`` nor needs ``-ffast-math``), and a vectorised loop calls libmvec's
  whole-vector variants (``_ZGVdN8v_sinf``: glibc's tested bound is 1-2 ulp for float,
  4 for double); elsewhere they are inline calls of ``std::``.

Accuracy, measured against ``torch`` (float64 reference) in ``tests/test_vector_math.py``:
``exp`` is a Cephes-style polynomial within 2 ulp, ``tanh`` a polynomial below 0.625 and
``1 - 2 / (exp(2x) + 1)`` above, ``erf`` a Maclaurin series below 0.75 and Abramowitz and
Stegun 7.1.26 (the formula ATen's vectorised CPU ``erf`` uses) above. NaN and infinities
give what ``std::`` gives.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from kiln_cpp.dtypes import value_type

_FUNCTIONS = {
    "exp": "kiln::exp_f",
    "sigmoid": "kiln::sigmoid_f",
    "tanh": "kiln::tanh_f",
    "erf": "kiln::erf_f",
    "pow": "kiln::pow_f",
}
# libm functions with a vector variant in glibc's libmvec (2.35 and later), float and double
LIBM_UNARY = (
    "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh",
    "log", "log2", "log10", "log1p", "exp2", "expm1", "erfc",
)  # fmt: skip
LIBM_BINARY = ("atan2", "hypot")
# for floats these are the kiln:: functions above (pow_f calls kiln_vm_powf for other exponents)
_DOUBLE_ONLY = ("exp", "tanh", "erf", "pow")


# the sign bit as a signed compare of the bits: g++ 12 fails with an internal compiler error
# on a vectorised std::signbit of a value converted from bfloat16 (a shift of the bits)
_SIGN_BITS = {"float": "int32_t", "double": "int64_t"}


def vector_function(name: str, operand: torch.dtype) -> Callable[..., str] | None:
    """The vectorisable rendering of the op ``name`` on ``operand``, or None."""
    vt = value_type(operand) if operand.is_floating_point else None
    if name == "signbit" and vt in _SIGN_BITS:
        return lambda x: f"(__builtin_bit_cast({_SIGN_BITS[vt]}, {x}) < 0)"
    if vt == "float" and name in _FUNCTIONS:
        fn = _FUNCTIONS[name]
    elif vt == "float" and name in LIBM_UNARY + LIBM_BINARY:
        fn = f"kiln_vm_{name}f"
    elif vt == "double" and name in LIBM_UNARY + LIBM_BINARY + _DOUBLE_ONLY:
        fn = f"kiln_vm_{name}"
    else:
        return None
    return lambda *args: f"{fn}({', '.join(args)})"


def _libm_declarations() -> str:
    """``kiln_vm_<name>[f]``: libm's function declared with a vector variant under
    ``KILN_LIBMVEC``, an inline call of ``std::`` otherwise."""
    vector, scalar = [], []
    simd = '__attribute__((simd("notinbranch"), const))'
    for name in (*LIBM_UNARY, *LIBM_BINARY, *_DOUBLE_ONLY):
        arity = 2 if name in (*LIBM_BINARY, "pow") else 1
        for vt, suffix in (("float", "f"), ("double", "")):
            if name in _DOUBLE_ONLY and name != "pow" and vt == "float":
                continue
            params = ", ".join([vt] * arity)
            args = ", ".join("xy"[:arity])
            named = ", ".join(f"{vt} {a}" for a in "xy"[:arity])
            symbol = f"{name}{suffix}"
            vector.append(f'{simd} {vt} kiln_vm_{symbol}({params}) noexcept __asm__("{symbol}");')
            scalar.append(
                f"inline {vt} kiln_vm_{symbol}({named}) {{ return std::{name}({args}); }}"
            )
    return "\n".join(
        ["#ifdef KILN_LIBMVEC", 'extern "C" {', *vector, "}", "#else", *scalar, "#endif", ""]
    )


SOURCE = (
    _libm_declarations()
    + r"""
namespace kiln {

// e^x / 2^n for x = n ln2 + r with |r| <= ln2 / 2 (n a whole number): Cephes' polynomial
inline float exp_poly(float x, float n) {
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  return p * r * r + r + 1.0f;
}

inline float exp_f(float x) {
  const float hi = 88.72283935546875f, lo = -103.97207708f;
  float xc = x > hi ? hi : x;
  xc = xc < lo ? lo : xc;
  // n rounded to nearest by the 1.5 * 2^23 trick
  const float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float p = exp_poly(xc, n);
  // times 2^n in two factors, so n down to -150 (subnormal results) stays exact
  const int32_t ni = static_cast<int32_t>(n);
  const int32_t n1 = ni >> 1;
  const float s1 = __builtin_bit_cast(float, (n1 + 127) << 23);
  const float s2 = __builtin_bit_cast(float, (ni - n1 + 127) << 23);
  float out = p * s1 * s2;
  out = x > hi ? std::numeric_limits<float>::infinity() : out;
  return x != x ? x : out;
}

inline float pow_f(float x, float y) {
  if (y == 2.0f) return x * x;
  if (y == 3.0f) return x * x * x;
  if (y == 0.5f) return std::sqrt(x);
  return kiln_vm_powf(x, y);
}

inline float sigmoid_f(float x) { return 1.0f / (1.0f + exp_f(-x)); }

inline float tanh_f(float x) {
  const float ax = std::abs(x);
  const float z = x * x;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  const float small = x + x * z * p;
  const float big = std::copysign(1.0f - 2.0f / (exp_f(2.0f * ax) + 1.0f), x);
  return ax < 0.625f ? small : big;
}

// exp(-z) for 0 <= z <= 16 (erf's): exp_f without its clamps, its infinity and NaN checks,
// and with one factor 2^n (no subnormal result to reach)
inline float exp_neg_f(float z) {
  const float n = (-z * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  return exp_poly(-z, n) * __builtin_bit_cast(float, (static_cast<int32_t>(n) + 127) << 23);
}

inline float erf_f(float x) {
  const float ax = std::min(std::abs(x), 4.0f);  // erf(4) rounds to 1 (a NaN stays NaN)
  const float z = ax * ax;
  float p = -1.6365844691234924e-07f;
  p = p * z + 1.6462114365889248e-06f;
  p = p * z - 1.4925650358406252e-05f;
  p = p * z + 0.00012055332981789665f;
  p = p * z - 0.0008548327023450853f;
  p = p * z + 0.005223977625442188f;
  p = p * z - 0.026866170645131252f;
  p = p * z + 0.11283791670955128f;
  p = p * z - 0.37612638903183754f;
  p = p * z + 1.1283791670955126f;
  const float small = x * p;
  const float t = 1.0f / (1.0f + 0.3275911f * ax);
  float q = 1.061405429f;
  q = q * t - 1.453152027f;
  q = q * t + 1.421413741f;
  q = q * t - 0.284496736f;
  q = q * t + 0.254829592f;
  const float big = std::copysign(1.0f - q * t * exp_neg_f(z), x);
  return ax < 0.75f ? small : big;
}

}  // namespace kiln
"""
)
