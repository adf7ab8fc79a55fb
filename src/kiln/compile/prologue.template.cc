// kiln cell prologue: the fixed part of every generated cell source. It compiles on its own
// (`c++ -c prologue.template.cc` from the repo root) and is embedded into the code generator at
// build time, with the cell ABI header pasted in place of its #include, so a cell's source is
// self-contained. Helpers are static inline and written so GCC can vectorize loops using them.
#include "src/kiln/runtime/cell_abi.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct kiln_cell_entry {
  uint32_t index;
  const kiln_host_api* host;
  const void** w;  // bound weights, constant-table order
  uint32_t num_w;
  int threads;
  void** ops;  // prepared reference ops
  uint32_t num_ops;
};

#define KILN_HIDDEN __attribute__((visibility("hidden")))
#define KILN_EXPORT extern "C" __attribute__((visibility("default")))
#define KILN_TRY(call)        \
  do {                        \
    int kiln_rc_ = (call);    \
    if (kiln_rc_) return kiln_rc_; \
  } while (0)

// exp(x) to ~1 ulp: Cody-Waite range reduction and a degree-6 polynomial (Cephes), no libm call.
static inline float kiln_exp(float x) {
  x = x > 88.3762626647949f ? 88.3762626647949f : x;
  x = x < -87.3365447504f ? -87.3365447504f : x;
  float n = floorf(x * 1.44269504088896341f + 0.5f);
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
  return p * scale;
}
static inline float kiln_sigmoid(float x) { return 1.0f / (1.0f + kiln_exp(-x)); }
static inline float kiln_tanh(float x) { return tanhf(x); }
static inline float kiln_erf(float x) { return erff(x); }
static inline float kiln_relu(float x) { return x > 0.0f ? x : 0.0f; }
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
static inline float kiln_sign(float x) { return (float)((x > 0.0f) - (x < 0.0f)); }
static inline float kiln_min(float a, float b) { return a < b ? a : b; }
static inline float kiln_max(float a, float b) { return a > b ? a : b; }
// Pow: the exponent may be a weight, so the square/sqrt fast paths are chosen per value at run
// time, never at compile time (law 1).
static inline float kiln_pow(float a, float b) {
  if (b == 2.0f) return a * a;
  if (b == 1.0f) return a;
  if (b == 0.5f) return sqrtf(a);
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

// Row reductions written with 16 independent lanes so GCC vectorizes them without -ffast-math
// (a single scalar accumulator is a serial dependency chain it must not reorder).
#define KILN_LANES 16
static inline float kiln_row_max(const float* x, int64_t n) {
  float lane[KILN_LANES];
  for (int j = 0; j < KILN_LANES; ++j) lane[j] = -INFINITY;
  int64_t i = 0;
  for (; i + KILN_LANES <= n; i += KILN_LANES) {
    for (int j = 0; j < KILN_LANES; ++j) lane[j] = x[i + j] > lane[j] ? x[i + j] : lane[j];
  }
  float m = -INFINITY;
  for (int j = 0; j < KILN_LANES; ++j) m = lane[j] > m ? lane[j] : m;
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}
// y[i] = exp(x[i] - m); returns the sum of y.
static inline float kiln_row_exp_sum(const float* x, float* y, int64_t n, float m) {
  float lane[KILN_LANES];
  for (int j = 0; j < KILN_LANES; ++j) lane[j] = 0.0f;
  int64_t i = 0;
  for (; i + KILN_LANES <= n; i += KILN_LANES) {
    for (int j = 0; j < KILN_LANES; ++j) {
      const float e = kiln_exp(x[i + j] - m);
      y[i + j] = e;
      lane[j] += e;
    }
  }
  float s = 0.0f;
  for (int j = 0; j < KILN_LANES; ++j) s += lane[j];
  for (; i < n; ++i) {
    const float e = kiln_exp(x[i] - m);
    y[i] = e;
    s += e;
  }
  return s;
}
// Mean and variance of a row, accumulated in double lanes.
static inline void kiln_row_moments(const float* x, int64_t n, double* mean, double* var) {
  double lane[8];
  for (int j = 0; j < 8; ++j) lane[j] = 0.0;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) lane[j] += x[i + j];
  }
  double s = 0.0;
  for (int j = 0; j < 8; ++j) s += lane[j];
  for (; i < n; ++i) s += x[i];
  const double mu = s / (double)n;
  for (int j = 0; j < 8; ++j) lane[j] = 0.0;
  i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) {
      const double d = x[i + j] - mu;
      lane[j] += d * d;
    }
  }
  double q = 0.0;
  for (int j = 0; j < 8; ++j) q += lane[j];
  for (; i < n; ++i) {
    const double d = x[i] - mu;
    q += d * d;
  }
  *mean = mu;
  *var = q / (double)n;
}
