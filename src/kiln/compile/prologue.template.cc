// kiln cell prologue: the fixed part of every generated cell source. It compiles on its own
// (`c++ -c prologue.template.cc` from the repo root) and is embedded into the code generator at
// build time, with the cell ABI header pasted in place of its #include, so a cell's source is
// self-contained. Helpers are static inline and written so GCC can vectorize loops using them.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "src/kiln/abi/cell_abi.h"

struct kiln_cell_entry {
  uint32_t index;
  const kiln_host_api* host;
  const void** w;  // bound weights, constant-table order
  uint32_t num_w;
  int threads;
  void** ops;  // prepared reference ops
  uint32_t num_ops;
  void** convs;  // prepared convolutions (bind time: weights in the kernel's layout)
  uint32_t num_convs;
  void** mms;  // prepared matrix products (bind time: bound operands in the kernel's layout)
  uint32_t num_mms;
  uint8_t* mm_fused;  // per product: the library applies its epilogue (decided at bind)
  // A ranged entry's instance: the integer constants of its code at the symbol values it was
  // made for (each a polynomial in the symbols, computed at init). NULL for a concrete entry.
  int64_t* v;
};

#define KILN_HIDDEN __attribute__((visibility("hidden")))
#define KILN_EXPORT extern "C" __attribute__((visibility("default")))
#define KILN_TRY(call)             \
  do {                             \
    int kiln_rc_ = (call);         \
    if (kiln_rc_) return kiln_rc_; \
  } while (0)

// Runs body(begin, end) over [0, n) on the host's thread team (chunks of the outermost loop).
// The body is compiled once, out of line (inlined into the large run function GCC may leave
// its loops unvectorized), and called directly when one thread is asked for.
template <class F>
__attribute__((noinline)) static void kiln_par_tramp(void* ctx, int64_t begin, int64_t end) {
  (*(F*)ctx)(begin, end);
}
template <class F>
static inline int kiln_par(const kiln_host_api* H, int threads, int64_t n, F& body) {
  if (threads == 1 || n < 2) {
    kiln_par_tramp<F>((void*)&body, (int64_t)0, n);
    return KILN_CELL_OK;
  }
  return H->parallel_for(n, kiln_par_tramp<F>, (void*)&body, threads);
}

// The threads a piece of work runs on: the host's team, or 1 when `work` is at most `small`, too
// little to pay for waking the team. Emitted as a call on the work's size rather than as the
// literal choice, so that the source of an entry is the same text at every size, up to its
// integer constants (compile/ranged_emit.h); with constant arguments the compiler folds it.
static inline int kiln_team(int threads, int64_t work, int64_t small) {
  return work <= small ? 1 : threads;
}

// exp(x) to ~1 ulp: Cody-Waite range reduction and a degree-6 polynomial (Cephes), no libm call.
// Below the smallest normal result it is 0, not a denormal: the compiler folds the clamped lanes
// into constants, and one denormal constant multiplied into every lane of a loop (sigmoid's
// 1 / (1 + exp(88)) was one) costs a microcode assist per element, ~20x the loop's time. Past
// ln(FLT_MAX) the result is +inf, as expf gives; NaN stays NaN.
static inline float kiln_exp(float x) {
  const float xin = x;
  const float flush = x < -87.3365447504f ? 0.0f : 1.0f;
  x = x > 88.3762626647949f ? 88.3762626647949f : x;
  x = x < -87.3365447504f ? -87.3365447504f : x;
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round to nearest
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  int32_t e = (int32_t)n + 127;
  uint32_t bits = (uint32_t)e << 23;
  float scale;
  memcpy(&scale, &bits, 4);
  return xin > 88.72283935546875f ? INFINITY : p * scale * flush;
}
// 0 below -87 (where 1 / (1 + exp(-x)) would be a denormal; see kiln_exp); NaN stays NaN.
static inline float kiln_sigmoid(float x) {
  return x < -87.0f ? 0.0f : 1.0f / (1.0f + kiln_exp(-x));
}
static inline float kiln_tanh(float x) { return tanhf(x); }
// erf without a libm call, so loops over it vectorize: the Taylor series below 0.5 (relative
// error ~3e-8) and Abramowitz-Stegun 7.1.26 above (absolute error < 1.5e-7).
static inline float kiln_erf(float x) {
  const float ax = fabsf(x), x2 = x * x;
  float s = 0.00012055332981789664f;
  s = s * x2 - 0.0008548327023450853f;
  s = s * x2 + 0.005223977626923670f;
  s = s * x2 - 0.026866170645131252f;
  s = s * x2 + 0.11283791670955126f;
  s = s * x2 - 0.37612638903183754f;
  s = s * x2 + 1.1283791670955126f;
  const float t = 1.0f / (1.0f + 0.3275911f * ax);
  float p = 1.061405429f;
  p = p * t - 1.453152027f;
  p = p * t + 1.421413741f;
  p = p * t - 0.284496736f;
  p = p * t + 0.254829592f;
  const float big = 1.0f - p * t * kiln_exp(-x2);
  return ax < 0.5f ? x * s : copysignf(big, x);
}
// Every helper below keeps NaN, as the eager interpreter (and numpy) does: a comparison with NaN
// is false, so each is written to fall through to the NaN operand.
static inline float kiln_relu(float x) { return x < 0.0f ? 0.0f : x; }
static inline float kiln_leaky(float x, float a) { return x >= 0.0f ? x : a * x; }
// max then min, as ONNX/numpy clip: when lo > hi every value becomes hi.
static inline float kiln_clip(float x, float lo, float hi) {
  x = x < lo ? lo : x;
  return x > hi ? hi : x;
}
static inline float kiln_hardsigmoid(float x, float a, float b) {
  return kiln_clip(a * x + b, 0.0f, 1.0f);
}
static inline float kiln_softplus(float x) { return x > 20.0f ? x : log1pf(kiln_exp(x)); }
static inline float kiln_elu(float x, float a) { return x >= 0.0f ? x : a * (kiln_exp(x) - 1.0f); }
static inline float kiln_sign(float x) { return x != x ? x : (float)((x > 0.0f) - (x < 0.0f)); }
static inline float kiln_min(float a, float b) { return a != a ? a : (a < b ? a : b); }
static inline float kiln_max(float a, float b) { return a != a ? a : (a > b ? a : b); }
// Pow: the exponent may be a weight, so the square/sqrt fast paths are chosen per value at run
// time, never at compile time (law 1).
static inline float kiln_pow(float a, float b) {
  if (b == 2.0f) return a * a;
  if (b == 1.0f) return a;
  if (b == 0.5f) return a == -INFINITY ? INFINITY : sqrtf(a);  // powf(-inf, 0.5) is +inf
  return powf(a, b);
}
static inline int64_t kiln_cast_int64_t(double v) {
  if (v != v) return 0;
  if (v >= 9.2233720368547758e18) return INT64_MAX;
  if (v <= -9.2233720368547758e18) return INT64_MIN;
  return (int64_t)v;
}
static inline int32_t kiln_cast_int32_t(double v) {
  if (v != v) return 0;
  if (v >= 2147483647.0) return INT32_MAX;
  if (v <= -2147483648.0) return INT32_MIN;
  return (int32_t)v;
}
static inline uint8_t kiln_cast_uint8_t(double v) { return (uint8_t)(v != 0.0); }
// Cast to float. An integer converts to +0.0 for zero, never -0.0, but at -O3 with
// -fno-trapping-math and SSE4.1 GCC rewrites float(int(x)) into trunc(x), which keeps x's sign:
// trunc(-0.07) is -0.0, and Pow(that, -1) turned +inf into -inf. GCC also drops a `+ 0.0f` there,
// believing an int-to-float result is never -0.0; choosing the zero on the integer side is what
// survives the rewrite. The float overload passes -0.0 through, as ONNX's float->float Cast does.
static inline float kiln_to_float(float v) { return v; }
static inline float kiln_to_float(double v) { return (float)v; }
static inline float kiln_to_float(int64_t v) { return v == 0 ? 0.0f : (float)v; }
static inline float kiln_to_float(int32_t v) { return v == 0 ? 0.0f : (float)v; }
static inline float kiln_to_float(uint8_t v) { return (float)v; }

// Row reductions on GCC vector types, so they are SIMD at every -march level without
// -ffast-math (a scalar accumulator is a serial chain the compiler may not reorder). The vector
// is as wide as the cell's sm: 16 floats (one zmm) when built for x86-64-v4, else 8.
#if defined(__AVX512F__)
#define KILN_VW 16
#else
#define KILN_VW 8
#endif
typedef float kiln_fv __attribute__((vector_size(KILN_VW * 4)));
typedef int32_t kiln_iv __attribute__((vector_size(KILN_VW * 4)));
typedef double kiln_dv __attribute__((vector_size(KILN_VW * 8)));
static inline kiln_fv kiln_loadv(const float* p) {
  kiln_fv v;
  memcpy(&v, p, sizeof(v));
  return v;
}
static inline void kiln_storev(float* p, kiln_fv v) { memcpy(p, &v, sizeof(v)); }
static inline kiln_fv kiln_splatv(float x) { return (kiln_fv){} + x; }
// The vector twin of kiln_exp (same reduction and polynomial; round-to-nearest via 1.5*2^23).
static inline kiln_fv kiln_expv(kiln_fv x) {
  const kiln_fv xin = x;
  const kiln_fv flush = x < kiln_splatv(-87.3365447504f) ? kiln_splatv(0.0f) : kiln_splatv(1.0f);
  x = x > kiln_splatv(88.3762626647949f) ? kiln_splatv(88.3762626647949f) : x;
  x = x < kiln_splatv(-87.3365447504f) ? kiln_splatv(-87.3365447504f) : x;
  const kiln_fv magic = kiln_splatv(12582912.0f);
  const kiln_fv n = (x * 1.44269504088896341f + magic) - magic;
  kiln_fv r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  kiln_fv p = kiln_splatv(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const kiln_iv e = (__builtin_convertvector(n, kiln_iv) + 127) << 23;
  kiln_fv scale;
  memcpy(&scale, &e, sizeof(scale));
  return xin > kiln_splatv(88.72283935546875f) ? kiln_splatv(INFINITY) : p * scale * flush;
}
// The row's maximum; NaN when the row holds one (a lane that saw NaN keeps it: `v > m` is
// false for a NaN v, so NaN is taken through `v != v`).
static inline float kiln_row_max(const float* x, int64_t n) {
  kiln_fv m = kiln_splatv(-INFINITY);
  int64_t i = 0;
  for (; i + KILN_VW <= n; i += KILN_VW) {
    const kiln_fv v = kiln_loadv(x + i);
    m = (v > m) | (v != v) ? v : m;
  }
  float r = -INFINITY;
  for (int j = 0; j < KILN_VW; ++j) r = m[j] > r || m[j] != m[j] ? m[j] : r;
  for (; i < n; ++i) r = x[i] > r || x[i] != x[i] ? x[i] : r;
  return r;
}
// y[i] = exp(x[i] - m); returns the sum of y. x and y may be the same row.
static inline float kiln_row_exp_sum(const float* x, float* y, int64_t n, float m) {
  kiln_fv acc = kiln_splatv(0.0f);
  int64_t i = 0;
  for (; i + KILN_VW <= n; i += KILN_VW) {
    const kiln_fv e = kiln_expv(kiln_loadv(x + i) - m);
    kiln_storev(y + i, e);
    acc += e;
  }
  float s = 0.0f;
  for (int j = 0; j < KILN_VW; ++j) s += acc[j];
  for (; i < n; ++i) {
    const float e = kiln_exp(x[i] - m);
    y[i] = e;
    s += e;
  }
  return s;
}
// The row's minimum; NaN when the row holds one (kiln_row_max's rule).
static inline float kiln_row_min(const float* x, int64_t n) {
  kiln_fv m = kiln_splatv(INFINITY);
  int64_t i = 0;
  for (; i + KILN_VW <= n; i += KILN_VW) {
    const kiln_fv v = kiln_loadv(x + i);
    m = (v < m) | (v != v) ? v : m;
  }
  float r = INFINITY;
  for (int j = 0; j < KILN_VW; ++j) r = m[j] < r || m[j] != m[j] ? m[j] : r;
  for (; i < n; ++i) r = x[i] < r || x[i] != x[i] ? x[i] : r;
  return r;
}
// The row's sum, accumulated in double (as the interpreter's reductions).
static inline double kiln_row_sum(const float* x, int64_t n) {
  kiln_dv a = {};
  int64_t i = 0;
  for (; i + KILN_VW <= n; i += KILN_VW) a += __builtin_convertvector(kiln_loadv(x + i), kiln_dv);
  double s = 0;
  for (int j = 0; j < KILN_VW; ++j) s += a[j];
  for (; i < n; ++i) s += x[i];
  return s;
}
// Mean and variance of a row, accumulated in double.
static inline void kiln_row_moments(const float* x, int64_t n, double* mean, double* var) {
  const double mu = kiln_row_sum(x, n) / (double)n;
  kiln_dv a = {};
  int64_t i = 0;
  for (; i + KILN_VW <= n; i += KILN_VW) {
    const kiln_dv d = __builtin_convertvector(kiln_loadv(x + i), kiln_dv) - mu;
    a += d * d;
  }
  double q = 0;
  for (int j = 0; j < KILN_VW; ++j) q += a[j];
  for (; i < n; ++i) {
    const double d = x[i] - mu;
    q += d * d;
  }
  *mean = mu;
  *var = q / (double)n;
}
