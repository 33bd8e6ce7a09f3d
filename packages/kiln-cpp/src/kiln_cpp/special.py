"""Special functions for the C++ kernels, as ATen's CPU kernels compute them: the modified
Bessel functions of the first kind (``i0``, ``i1`` and their exponentially scaled forms
``i0e``, ``i1e``, Chebyshev expansions on [0, 8] and past 8 with the Cephes coefficients
ATen uses, in the value's own type; float ``i1``/``i1e`` take the shorter series ATen's
float kernels take, the last terms of the double ones), the inverse of the normal CDF
(``ndtri``, Cephes' rational approximations) and the scaled complementary error function
(``erfcx``: ``exp(x²)·erfc(x)`` in double with ``x²`` split exactly, its asymptotic series
where ``erfc`` underflows, and ``2·exp(x²) − erfcx(−x)`` for negative ``x``, ``2·exp(x²)``
in the value's type as ATen rounds it); trigamma (``polygamma(1, x)``: shifted up by six,
then the asymptotic series, reflected below 1/2) and the Hurwitz zeta function (Cephes'
``zeta``: the terms summed past ``q + 9``, then the Euler–Maclaurin tail, accumulated in
double as ATen's CPU kernels do), which ``polygamma(n, x)`` for ``n >= 2`` is built from."""

SOURCE = r"""
namespace kiln {

// Cephes' chbevl: a Chebyshev series, Clenshaw's recurrence
template <typename T> inline T chbevl(T x, const double* c, int n) {
  T b0 = static_cast<T>(c[0]), b1 = 0, b2 = 0;
  for (int i = 1; i < n; ++i) {
    b2 = b1;
    b1 = b0;
    b0 = x * b1 - b2 + static_cast<T>(c[i]);
  }
  return T(0.5) * (b0 - b2);
}
// Cephes' polevl: a polynomial, highest coefficient first
template <typename T> inline T polevl(T x, const double* c, int n) {
  T out = static_cast<T>(c[0]);
  for (int i = 1; i < n; ++i) out = out * x + static_cast<T>(c[i]);
  return out;
}

// exp(-x) I0(x) on [0, 8], then exp(-x) sqrt(x) I0(x) past 8
static const double I0E_A[30] = {
    -4.41534164647933937950E-18, 3.33079451882223809783E-17, -2.43127984654795469359E-16,
    1.71539128555513303061E-15, -1.16853328779934516808E-14, 7.67618549860493561688E-14,
    -4.85644678311192946090E-13, 2.95505266312963983461E-12, -1.72682629144155570723E-11,
    9.67580903537323691224E-11, -5.18979560163526290666E-10, 2.65982372468238665035E-9,
    -1.30002500998624804212E-8, 6.04699502254191894932E-8, -2.67079385394061173391E-7,
    1.11738753912010371815E-6, -4.41673835845875056359E-6, 1.64484480707288970893E-5,
    -5.75419501008210370398E-5, 1.88502885095841655729E-4, -5.76375574538582365885E-4,
    1.63947561694133579842E-3, -4.32430999505057594430E-3, 1.05464603945949983183E-2,
    -2.37374148058994688156E-2, 4.93052842396707084878E-2, -9.49010970480476444210E-2,
    1.71620901522208775349E-1, -3.04682672343198398683E-1, 6.76795274409476084995E-1};
static const double I0E_B[25] = {
    -7.23318048787475395456E-18, -4.83050448594418207126E-18, 4.46562142029675999901E-17,
    3.46122286769746109310E-17, -2.82762398051658348494E-16, -3.42548561967721913462E-16,
    1.77256013305652638360E-15, 3.81168066935262242075E-15, -9.55484669882830764870E-15,
    -4.15056934728722208663E-14, 1.54008621752140982691E-14, 3.85277838274214270114E-13,
    7.18012445138366623367E-13, -1.79417853150680611778E-12, -1.32158118404477131188E-11,
    -3.14991652796324136454E-11, 1.18891471078464383424E-11, 4.94060238822496958910E-10,
    3.39623202570838634515E-9, 2.26666899049817806459E-8, 2.04891858946906374183E-7,
    2.89137052083475648297E-6, 6.88975834691682398426E-5, 3.36911647825569408990E-3,
    8.04490411014108831608E-1};
// exp(-x) I1(x) / x on [0, 8], then exp(-x) sqrt(x) I1(x) past 8
static const double I1E_A[29] = {
    2.77791411276104639959E-18, -2.11142121435816608115E-17, 1.55363195773620046921E-16,
    -1.10559694773538630805E-15, 7.60068429473540693410E-15, -5.04218550472791168711E-14,
    3.22379336594557470981E-13, -1.98397439776494371520E-12, 1.17361862988909016308E-11,
    -6.66348972350202774223E-11, 3.62559028155211703701E-10, -1.88724975172282928790E-9,
    9.38153738649577178388E-9, -4.44505912879632808065E-8, 2.00329475355213526229E-7,
    -8.56872026469545474066E-7, 3.47025130813767847674E-6, -1.32731636560394358279E-5,
    4.78156510755005422638E-5, -1.61760815825896745588E-4, 5.12285956168575772895E-4,
    -1.51357245063125314899E-3, 4.15642294431288815669E-3, -1.05640848946261981558E-2,
    2.47264490306265168283E-2, -5.29459812080949914269E-2, 1.02643658689847095384E-1,
    -1.76416518357834055153E-1, 2.52587186443633654823E-1};
static const double I1E_B[25] = {
    7.51729631084210481353E-18, 4.41434832307170791151E-18, -4.65030536848935832153E-17,
    -3.20952592199342395980E-17, 2.96262899764595013876E-16, 3.30820231092092828324E-16,
    -1.88035477551078244854E-15, -3.81440307243700780478E-15, 1.04202769841288027642E-14,
    4.27244001671195135429E-14, -2.10154184277266431302E-14, -4.08355111109219731823E-13,
    -7.19855177624590851209E-13, 2.03562854414708950722E-12, 1.41258074366137813316E-11,
    3.25260358301548823856E-11, -1.89749581235054123450E-11, -5.58974346219658380687E-10,
    -3.83538038596423702205E-9, -2.63146884688951950684E-8, -2.51223623787020892529E-7,
    -3.88256480887769039346E-6, -1.10588938762623716291E-4, -9.76109749136146840777E-3,
    7.78576235018280120474E-1};

// the scaled series: exp(-|x|) I0(x)
template <typename T> inline T i0e_scaled(T x) {
  if (x <= T(8)) return chbevl(x / T(2) - T(2), I0E_A, 30);
  return chbevl(T(32) / x - T(2), I0E_B, 25) / std::sqrt(x);
}
template <typename T> inline T i0(T x) {
  T a = std::abs(x);
  return std::exp(a) * i0e_scaled(a);
}
template <typename T> inline T i0e(T x) { return i0e_scaled(std::abs(x)); }

// exp(-|x|) I1(|x|); float takes ATen's float series (the last 17 and 7 terms)
template <typename T> inline T i1e_scaled(T a) {
  const bool f = sizeof(T) < sizeof(double);
  if (a <= T(8)) return chbevl(a / T(2) - T(2), I1E_A + (f ? 12 : 0), f ? 17 : 29) * a;
  return chbevl(T(32) / a - T(2), I1E_B + (f ? 18 : 0), f ? 7 : 25) / std::sqrt(a);
}
template <typename T> inline T i1(T x) {
  T a = std::abs(x);
  T out = std::exp(a) * i1e_scaled(a);
  return x < 0 ? -out : out;
}
template <typename T> inline T i1e(T x) {
  T out = i1e_scaled(std::abs(x));
  return x < 0 ? -out : out;
}

static const double NDTRI_P0[5] = {
    -5.99633501014107895267E1, 9.80010754185999661536E1, -5.66762857469070293439E1,
    1.39312609387279679503E1, -1.23916583867381258016E0};
static const double NDTRI_Q0[9] = {
    1.00000000000000000000E0, 1.95448858338141759834E0, 4.67627912898881538453E0,
    8.63602421390890590575E1, -2.25462687854119370527E2, 2.00260212380060660359E2,
    -8.20372256168333339912E1, 1.59056225126211695515E1, -1.18331621121330003142E0};
static const double NDTRI_P1[9] = {
    4.05544892305962419923E0, 3.15251094599893866154E1, 5.71628192246421288162E1,
    4.40805073893200834700E1, 1.46849561928858024014E1, 2.18663306850790267539E0,
    -1.40256079171354495875E-1, -3.50424626827848203418E-2, -8.57456785154685413611E-4};
static const double NDTRI_Q1[9] = {
    1.00000000000000000000E0, 1.57799883256466749731E1, 4.53907635128879210584E1,
    4.13172038254672030440E1, 1.50425385692907503408E1, 2.50464946208309415979E0,
    -1.42182922854787788574E-1, -3.80806407691578277194E-2, -9.33259480895457427372E-4};
static const double NDTRI_P2[9] = {
    3.23774891776946035970E0, 6.91522889068984211695E0, 3.93881025292474443415E0,
    1.33303460815807542389E0, 2.01485389549179081538E-1, 1.23716634817820021358E-2,
    3.01581553508235416007E-4, 2.65806974686737550832E-6, 6.23974539184983293730E-9};
static const double NDTRI_Q2[9] = {
    1.00000000000000000000E0, 6.02427039364742014255E0, 3.67983563856160859403E0,
    1.37702099489081330271E0, 2.16236993594496635890E-1, 1.34204006088543189037E-2,
    3.28014464682127739104E-4, 2.89247864745380683936E-6, 6.79019408009981274425E-9};

// the x with Phi(x) = y: a rational function of y near 1/2, else of 1/sqrt(-2 log y)
template <typename T> inline T ndtri(T y0) {
  if (y0 == 0) return -std::numeric_limits<T>::infinity();
  if (y0 == 1) return std::numeric_limits<T>::infinity();
  if (!(y0 > 0 && y0 < 1)) return std::numeric_limits<T>::quiet_NaN();
  const T exp_m2 = T(0.13533528323661269189);  // exp(-2)
  bool lower = true;
  T y = y0;
  if (y > T(1) - exp_m2) {
    y = T(1) - y;
    lower = false;
  }
  if (y > exp_m2) {
    y = y - T(0.5);
    const T y2 = y * y;
    const T x = y + y * (y2 * polevl(y2, NDTRI_P0, 5) / polevl(y2, NDTRI_Q0, 9));
    return x * T(2.50662827463100050242);  // sqrt(2 pi)
  }
  T x = std::sqrt(T(-2) * std::log(y));
  const T x0 = x - std::log(x) / x;
  const T z = T(1) / x;
  const T x1 = x < T(8) ? z * polevl(z, NDTRI_P1, 9) / polevl(z, NDTRI_Q1, 9)
                        : z * polevl(z, NDTRI_P2, 9) / polevl(z, NDTRI_Q2, 9);
  x = x0 - x1;
  return lower ? -x : x;
}

// exp(x^2) erfc(x) for x >= 0, in double
inline double erfcx_nonnegative(double x) {
  if (x > 26) {  // erfc underflows: the asymptotic series, to a relative 1e-13
    const double r = 1 / (x * x);
    const double series = 1 - r * (0.5 - r * (0.75 - r * (1.875 - r * 6.5625)));
    return series / (x * 1.7724538509055160273);  // x sqrt(pi)
  }
  const double hi = x * x, lo = std::fma(x, x, -hi);  // x^2 exactly, as hi + lo
  return std::exp(hi) * (1 + lo) * std::erfc(x);
}
template <typename T> inline T erfcx(T x) {
  const double d = static_cast<double>(x);
  if (std::isnan(d)) return x;
  if (d >= 0) return static_cast<T>(erfcx_nonnegative(d));
  if (d < -26.7) return std::numeric_limits<T>::infinity();
  // 2 exp(x^2) in the value's type, as ATen rounds it; erfcx(-x) is below 1e-16 of it
  // past -6.1
  const T twice = T(2) * std::exp(x * x);
  return d < -6.1 ? twice : twice - static_cast<T>(erfcx_nonnegative(-d));
}

// polygamma(1, x): six steps up, then the asymptotic series; below 1/2 the reflection
// psi1(x) = pi^2 / sin^2(pi x) - psi1(1 - x), with sin(pi x) in the value's type
template <typename T> inline T trigamma(T x) {
  const T pi = static_cast<T>(M_PI);
  T sign = 1, result = 0;
  if (x < T(0.5)) {
    sign = -1;
    const T sin_pi_x = std::sin(pi * x);
    result -= (pi * pi) / (sin_pi_x * sin_pi_x);
    x = 1 - x;
  }
  for (int i = 0; i < 6; ++i) {
    result += 1 / (x * x);
    x += 1;
  }
  const T ixx = 1 / (x * x);
  result += (1 + 1 / (2 * x) + ixx * (T(1) / 6 - ixx * (T(1) / 30 - ixx * (T(1) / 42)))) / x;
  return sign * result;
}

// Euler-Maclaurin's coefficients: (2k)! / B_2k
static const double ZETA_A[12] = {
    12.0, -720.0, 30240.0, -1209600.0, 47900160.0, -1.8924375803183791606e9, 7.47242496e10,
    -2.950130727918164224e12, 1.1646782814350067249e14, -4.5979787224074726105e15,
    1.8152105401943546773e17, -7.1661652561756670113e18};

// the Hurwitz zeta function, sum over k >= 0 of (q + k)^-x; inf at x = 1 and at the
// poles q = 0, -1, ...; NaN for x < 1 and for negative q with x not an integer
template <typename T> inline T zeta(T x, T q) {
  const double machep = 1.11022302462515654042E-16;
  if (x == 1) return std::numeric_limits<T>::infinity();
  if (x < 1) return std::numeric_limits<T>::quiet_NaN();
  if (q <= 0) {
    if (q == std::floor(q)) return std::numeric_limits<T>::infinity();
    if (x != std::floor(x)) return std::numeric_limits<T>::quiet_NaN();
  }
  double s = std::pow(q, -x);  // the first term in the value's type, as ATen's
  double a = q, b = 0;
  int i = 0;
  while (i < 9 || a <= 9) {
    i += 1;
    a += 1;
    b = std::pow(a, static_cast<double>(-x));
    s += b;
    if (-machep * s < b && b < machep * s) return static_cast<T>(s);
  }
  const double w = a;
  s += b * w / (x - 1.0);
  s -= 0.5 * b;
  double p = 1, k = 0;
  for (int j = 0; j < 12; ++j) {
    p *= x + k;
    b /= w;
    const double t = p * b / ZETA_A[j];
    s = s + t;
    if (std::fabs(t / s) < machep) return static_cast<T>(s);
    k += 1;
    p *= x + k;
    b /= w;
    k += 1;
  }
  return static_cast<T>(s);
}

}  // namespace kiln
"""
