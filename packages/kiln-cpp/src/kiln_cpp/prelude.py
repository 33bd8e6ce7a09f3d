"""The C++ prelude every generated source starts with: integer division and modulo that
floor, torch's float semantics for the ops C++ spells differently, bfloat16 conversions,
Welford accumulators, the special functions of :mod:`kiln_cpp.special` and the vectorisable
float functions of :mod:`kiln_cpp.vecmath`."""

from kiln_cpp.special import SOURCE as SPECIAL_SOURCE
from kiln_cpp.vecmath import SOURCE as VECMATH_SOURCE

# integer division, modulo and powers that floor as sizes do: what size expressions call
# (kiln_cpp.printer), in kernels and in host programs alike
SIZE_FUNCTIONS = r"""template <typename T> inline T floordiv(T a, T b) {
  if (b == 0) return 0;  // only reached under a mask (torch raises before a kernel runs)
  T q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) q -= 1;
  return q;
}
template <typename T> inline T mod(T a, T b) {
  if (b == 0) return 0;
  T r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}
// torch's PowByNatural: an integer power whose exponent is a size (never negative)
// (unsigned arithmetic: a power past int64_t wraps as Python's would not, but is defined)
inline int64_t pow_by_natural(int64_t base, int64_t exp) {
  uint64_t out = 1, b = static_cast<uint64_t>(base);
  for (; exp > 0; exp >>= 1) {
    if (exp & 1) out *= b;
    b *= b;
  }
  return static_cast<int64_t>(out);
}
"""

PRELUDE = (
    r"""
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>
#include <omp.h>

namespace kiln {

"""
    + SIZE_FUNCTIONS
    + r"""// how many contiguous chunks of its reduction a kernel runs on threads of their own (see
// kiln_cpp/split.py): where its `outer` parallel units would leave threads idle or share
// them unevenly (fewer than 4 per thread, not a multiple of the threads), enough chunks per
// unit that all the pieces divide evenly among the threads (their number the least common
// multiple of the units and the threads), each at least `min_points` of the kernel's
// `points`, at most `steps` (the split loop's length) and `most`
inline int64_t split_chunks(int64_t points, int64_t outer, int64_t steps, int64_t min_points,
                            int64_t most) {
  const int64_t threads = omp_get_max_threads();
  if (outer <= 0 || outer % threads == 0 || outer >= 4 * threads) return 1;
  int64_t chunks = threads / std::gcd(outer, threads);
  chunks = std::min({chunks, points / (outer * min_points), steps, most});
  return std::max<int64_t>(chunks, 1);
}
template <typename T> inline T truncdiv(T a, T b) { return b == 0 ? 0 : a / b; }
template <typename T> inline T fmod_int(T a, T b) { return b == 0 ? 0 : a % b; }

template <typename T> inline T floordiv_float(T a, T b) {
  if (b == 0) return a / b;
  T m = std::fmod(a, b);
  T div = (a - m) / b;
  if (m != 0 && ((b < 0) != (m < 0))) div -= 1;
  T fl;
  if (div != 0) {
    fl = std::floor(div);
    if (div - fl > T(0.5)) fl += 1;
  } else {
    fl = std::copysign(T(0), a / b);
  }
  return fl;
}
template <typename T> inline T remainder_float(T a, T b) {
  T m = std::fmod(a, b);
  if (m != 0 && ((b < 0) != (m < 0))) m += b;
  return m;
}
template <typename T> inline T max_float(T a, T b) {
  return (std::isnan(a) || a > b) ? a : (std::isnan(b) ? b : b);
}
template <typename T> inline T min_float(T a, T b) {
  return (std::isnan(a) || a < b) ? a : b;
}
// log(exp(x) + exp(y)) as ATen's logcumsumexp takes each step (NaN and infinities kept)
template <typename T> inline T log_add_exp(T x, T y) {
  T lo = std::isnan(y) ? y : std::min(x, y);
  T hi = std::isnan(y) ? y : std::max(x, y);
  if (lo != hi || std::isfinite(lo)) return std::log1p(std::exp(lo - hi)) + hi;
  return x;
}
template <typename T> inline T pow_int(T base, T exp) {
  if (exp < 0) return base == 1 ? 1 : (base == -1 ? ((exp & 1) ? -1 : 1) : 0);
  T out = 1;
  while (exp) {
    if (exp & 1) out *= base;
    base *= base;
    exp >>= 1;
  }
  return out;
}
template <typename T> inline T shl(T a, T b) {
  return (b < 0 || b >= T(sizeof(T) * 8)) ? T(0) : static_cast<T>(a << b);
}
template <typename T> inline T shr(T a, T b) {
  if (b < 0 || b >= T(sizeof(T) * 8)) return a < 0 ? T(-1) : T(0);
  return static_cast<T>(a >> b);
}
template <typename T> inline T sign(T x) { return x > 0 ? T(1) : (x < 0 ? T(-1) : x); }
template <typename T> inline T sigmoid(T x) { return T(1) / (T(1) + std::exp(-x)); }

inline float bf16_to_float(uint16_t bits) {
  uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t float_to_bf16(float f) {
  if (std::isnan(f)) return 0x7FC0;
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7FFF + ((u >> 16) & 1);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}
inline float round_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

// erfinv and digamma as ATen's CPU kernels compute them (ATen/native/Math.h)
template <typename T> inline T erfinv(T y) {
  const T a[4] = {T(0.886226899), T(-1.645349621), T(0.914624893), T(-0.140543331)};
  const T b[4] = {T(-2.118377725), T(1.442710462), T(-0.329097515), T(0.012229801)};
  const T c[4] = {T(-1.970840454), T(-1.624906493), T(3.429567803), T(1.641345311)};
  const T d[2] = {T(3.543889200), T(1.637067800)};
  T y_abs = std::abs(y);
  if (y_abs > T(1)) return std::numeric_limits<T>::quiet_NaN();
  if (y_abs == T(1)) return std::copysign(std::numeric_limits<T>::infinity(), y);
  T x;
  if (y_abs <= T(0.7)) {
    T z = y * y;
    T num = (((a[3] * z + a[2]) * z + a[1]) * z + a[0]);
    T dem = ((((b[3] * z + b[2]) * z + b[1]) * z + b[0]) * z + T(1));
    x = y * num / dem;
  } else {
    T z = std::sqrt(-std::log((T(1) - y_abs) / T(2)));
    T num = ((c[3] * z + c[2]) * z + c[1]) * z + c[0];
    T dem = (d[1] * z + d[0]) * z + T(1);
    x = std::copysign(num, y) / dem;
  }
  const T k = T(2) / static_cast<T>(std::sqrt(M_PI));
  x = x - (std::erf(x) - y) / (k * std::exp(-x * x));
  x = x - (std::erf(x) - y) / (k * std::exp(-x * x));
  return x;
}
template <typename T> inline T digamma(T x) {
  const T PSI_10 = T(2.25175258906672110764);
  if (x == 0) return std::copysign(std::numeric_limits<T>::infinity(), -x);
  if (x < 0) {
    if (x == std::trunc(x)) return std::numeric_limits<T>::quiet_NaN();
    double q;
    double r = std::modf(static_cast<double>(x), &q);
    return digamma(1 - x) - static_cast<T>(M_PI / std::tan(M_PI * r));
  }
  T result = 0;
  while (x < 10) {
    result -= 1 / x;
    x += 1;
  }
  if (x == 10) return result + PSI_10;
  const T A[] = {T(8.33333333333333333333E-2), T(-2.10927960927960927961E-2),
                 T(7.57575757575757575758E-3), T(-4.16666666666666666667E-3),
                 T(3.96825396825396825397E-3), T(-8.33333333333333333333E-3),
                 T(8.33333333333333333333E-2)};
  T y = 0;
  if (x < T(1.0e17)) {
    T z = 1 / (x * x);
    T p = 0;
    for (int i = 0; i <= 6; ++i) p = p * z + A[i];
    y = z * p;
  }
  return result + std::log(x) - (T(0.5) / x) - y;
}

// Random numbers: the counter-based hash of kiln-loopir's reference codegen, so both
// give the same values for a seed.
inline uint32_t fmix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  h *= 0xC2B2AE35u;
  return h ^ (h >> 16);
}
inline float uniform(int64_t seed, int64_t offset) {
  uint64_t s = static_cast<uint64_t>(seed), o = static_cast<uint64_t>(offset);
  uint32_t h = fmix32(static_cast<uint32_t>(s) ^ fmix32(static_cast<uint32_t>(o)));
  h = fmix32(h ^ static_cast<uint32_t>(o >> 32) ^ static_cast<uint32_t>(s >> 32));
  return static_cast<float>(h >> 8) * (1.0f / 16777216.0f);
}
inline float randn(int64_t seed, int64_t offset) {
  float u1 = std::max(uniform(seed, offset * 2), 1e-7f);
  float u2 = uniform(seed, offset * 2 + 1);
  return std::sqrt(-2.0f * std::log(u1)) * std::cos(2.0f * static_cast<float>(M_PI) * u2);
}

// Welford accumulators per lane of a strip-mined simd loop, in the value type (as ATen's
// CPU layer_norm and torch.compile's vectorised Welford): every lane sees one value per
// block, so all lanes share one count. They are merged into a double Welford after.
template <int L, typename T> struct WelfordLanes {
  T mean[L] = {}, m2[L] = {};
  T n = 0, inv_n = 0;
  inline void next_block() {
    n += 1;
    inv_n = T(1) / n;
  }
  inline void update(int64_t lane, T x) {
    T delta = x - mean[lane];
    mean[lane] += delta * inv_n;
    m2[lane] += delta * (x - mean[lane]);
  }
};

// A float sum in L lanes that adds as ATen's CPU sum does (the cascade of SumKernel.cpp's
// multi_row_sum): each block adds one value into every lane of level 0; every `step` blocks
// level 0 is added into level 1 and cleared, every step^2 blocks level 1 into level 2, and
// so on up to level 3. A partial sum takes about `step` additions per level, so the error
// grows as eager's does, while every addition stays in the value type and in vectors.
// `expected`: about how many blocks it takes; the step is 2^max(4, log2(expected) / 4).
template <int L, typename T> struct CascadeLanes {
  static constexpr int LEVELS = 4;
  alignas(64) T level[LEVELS][L] = {};
  int64_t blocks = 0;
  int shift = 4;
  explicit CascadeLanes(int64_t expected) {
    int log2_blocks = 0;
    while ((int64_t(1) << log2_blocks) < expected) ++log2_blocks;
    shift = std::max(4, log2_blocks / LEVELS);
  }
  inline void next_block() {
    const int64_t mask = (int64_t(1) << shift) - 1;
    if (++blocks & mask) return;
    for (int j = 1; j < LEVELS; ++j) {
#pragma omp simd
      for (int l = 0; l < L; ++l) {
        level[j][l] += level[j - 1][l];
        level[j - 1][l] = T(0);
      }
      if (blocks & (mask << (j * shift))) return;
    }
  }
  // one lane's sum: its levels added from the lowest, as ATen adds them
  inline T lane(int l) const {
    T sum = level[0][l];
    for (int j = 1; j < LEVELS; ++j) sum += level[j][l];
    return sum;
  }
  // the sum of all lanes, added pairwise into lane 0 of level 0 (once: it overwrites them)
  inline T total() {
    for (int j = 1; j < LEVELS; ++j) {
#pragma omp simd
      for (int l = 0; l < L; ++l) level[0][l] += level[j][l];
    }
    for (int width = L / 2; width; width /= 2) {
#pragma omp simd
      for (int l = 0; l < width; ++l) level[0][l] += level[0][l + width];
    }
    return level[0][0];
  }
};

template <typename T> struct Welford {
  double mean = 0, m2 = 0;
  int64_t n = 0;
  inline void update(T x) {
    n += 1;
    double delta = static_cast<double>(x) - mean;
    mean += delta / static_cast<double>(n);
    m2 += delta * (static_cast<double>(x) - mean);
  }
  // Chan et al.'s combination of two partial results
  inline void combine(double other_mean, double other_m2, int64_t other_n) {
    if (other_n == 0) return;
    if (n == 0) {
      mean = other_mean, m2 = other_m2, n = other_n;
      return;
    }
    double total = static_cast<double>(n + other_n);
    double delta = other_mean - mean;
    mean += delta * (static_cast<double>(other_n) / total);
    m2 += other_m2 + delta * delta * (static_cast<double>(n) * other_n / total);
    n += other_n;
  }
  // the lanes, which all took the same count n, combined first: their mean is the mean of
  // their means and their m2 the sum of their m2s and of n times each mean's squared
  // distance from it (Chan's formula for equal counts: no division per lane, which took
  // longer than a 256-point layer norm's row)
  template <int L, typename U> inline void merge(const WelfordLanes<L, U>& lanes) {
    if (lanes.n == 0) return;
    double lanes_mean = 0, lanes_m2 = 0;
#pragma omp simd reduction(+ : lanes_mean)
    for (int l = 0; l < L; ++l) lanes_mean += lanes.mean[l];
    lanes_mean /= L;
#pragma omp simd reduction(+ : lanes_m2)
    for (int l = 0; l < L; ++l) {
      const double delta = lanes.mean[l] - lanes_mean;
      lanes_m2 += lanes.m2[l] + static_cast<double>(lanes.n) * delta * delta;
    }
    combine(lanes_mean, lanes_m2, static_cast<int64_t>(lanes.n) * L);
  }
};

// Welford accumulators of a column reduction, one output per lane, all lanes counting the
// same rows: each row updates float lanes (a WelfordLanes), and every ROWS rows those are
// folded into double lanes (Chan's formula for equal counts), so that no float lane counts
// more than ROWS values (a float Welford of 35000 rows was 3e-5 off eager's mean).
template <int L, typename T> struct WelfordColumns {
  static constexpr int ROWS = 256;
  WelfordLanes<L, T> rows;
  double mean[L] = {}, m2[L] = {};
  int64_t n = 0;
  inline void next_block() {
    if (rows.n == T(ROWS)) fold();
    rows.next_block();
  }
  inline void update(int64_t lane, T x) { rows.update(lane, x); }
  inline void fold() {
    if (rows.n == 0) return;
    const double added = static_cast<double>(rows.n), total = static_cast<double>(n) + added;
    const double weight = added / total, cross = static_cast<double>(n) * added / total;
#pragma omp simd
    for (int l = 0; l < L; ++l) {
      const double delta = static_cast<double>(rows.mean[l]) - mean[l];
      mean[l] += delta * weight;
      m2[l] += static_cast<double>(rows.m2[l]) + delta * delta * cross;
      rows.mean[l] = T(0), rows.m2[l] = T(0);
    }
    n += static_cast<int64_t>(rows.n);
    rows.n = T(0), rows.inv_n = T(0);
  }
  // one lane's result, after fold()
  inline Welford<T> lane(int64_t l) const {
    Welford<T> out;
    out.mean = mean[l], out.m2 = m2[l], out.n = n;
    return out;
  }
};

}  // namespace kiln
"""
    + SPECIAL_SOURCE
    + VECMATH_SOURCE
)
