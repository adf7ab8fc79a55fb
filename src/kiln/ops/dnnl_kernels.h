// oneDNN-backed float32 kernels: row-major SGEMM and 1-D to 3-D convolution (ops layer).
//
// The eager interpreter's MatMul/Gemm/Conv kernels (ops/matmul.cc, ops/conv.cc) call these, and so
// do compiled cells, through the runtime's host services (runtime/host.cc), which is why they sit
// behind this small header with no oneDNN types in it. Every function returns a Status and never
// throws: oneDNN's dnnl::error is caught inside and becomes ResourceExhausted (allocation failure)
// or Internal (anything else).
//
// Threading: oneDNN here runs on OpenMP. `num_threads` > 0 caps the OpenMP team for that call
// (set on the calling thread and restored afterwards); 0 keeps the runtime's default. All
// functions may be called concurrently from several threads.
#pragma once

#include <compare>
#include <cstdint>
#include <memory>
#include <string>

#include "src/kiln/base/status.h"

namespace kiln {

// C = alpha * op(A) * op(B) + beta * C, all row-major; op(X) is X or X^T as trans_* says.
// op(A) is [M,K], op(B) is [K,N], C is [M,N]. lda/ldb/ldc are row strides in elements of the
// matrices as stored (A is [K,M] in memory when trans_a). When beta == 0, C is not read.
// Errors: InvalidArgument for negative sizes or leading dims too small for the stored shape.
Status Sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
             const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
             int64_t ldc, int num_threads = 0);

// One 2-D convolution: geometry plus grouping. A 1-D convolution is H = R = 1 with unit
// stride/dilation and zero pads along H. A 3-D one (NCDHW) sets the depth fields too; left at
// their defaults they make no depth, and the 2-D primitive runs.
struct Conv2dParams {
  int64_t N = 1, C = 1, H = 1, W = 1;  // input, NCHW
  int64_t K = 1;                       // output channels
  int64_t R = 1, S = 1;                // kernel height, width
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_t = 0, pad_l = 0, pad_b = 0, pad_r = 0;
  int64_t dil_h = 1, dil_w = 1;  // ONNX convention: 1 = dense kernel
  int64_t group = 1;             // divides C and K
  // Depth (3-D convolutions): input depth, kernel depth, stride, front/back pads, dilation.
  int64_t D = 1, T = 1, stride_d = 1, pad_f = 0, pad_k = 0, dil_d = 1;
  bool three_d = false;  // the depth fields apply: X is NCDHW, W is [K, C/group, T, R, S]
  // kiln_conv_layout: 0 auto (PreferBlockedLayout), 1 blocked, 2 plain NCHW, 3 NHWC: x, y
  // (and a summed residual) are channels-last in the caller's memory, 4 as 3 with the library's
  // Winograd kernel where it has one for the geometry.
  int layout = 0;

  // Output extents: (H + pad_t + pad_b - ((R - 1) * dil_h + 1)) / stride_h + 1, likewise W.
  int64_t OutH() const;
  int64_t OutW() const;
  int64_t OutD() const;  // 1 unless three_d
  auto operator<=>(const Conv2dParams&) const = default;
};

// y[N,K,OutH,OutW] = conv(x[N,C,H,W], w[K,C/group,R,S]) + bias[K] (bias may be null).
// All buffers dense row-major float32; y is fully overwritten. Primitives are cached per
// (params, effective thread count), so repeated calls with the same geometry only execute.
// Errors: InvalidArgument naming the field for inconsistent params (group not dividing C or K,
// non-positive sizes or strides, negative pads, empty output).
Status Conv2d(const Conv2dParams& p, const float* x, const float* w, const float* bias, float* y,
              int num_threads = 0);

// An elementwise epilogue fused into a convolution: y = post_op(conv + bias [+ y_in]).
// post_op uses the kiln_post_op codes of abi/cell_abi.h (0 none, 1 relu, 2 sigmoid, 3 silu,
// 4 tanh, 5 gelu_erf, 6 hardswish).
struct ConvEpilogue {
  int post_op = 0;
  bool sum = false;  // add the output buffer's prior contents (a residual) before post_op
};

// Conv2d with a fused epilogue. When epi.sum, y holds the residual on entry.
Status Conv2dFused(const Conv2dParams& p, const float* x, const float* w, const float* bias,
                   float* y, const ConvEpilogue& epi, int num_threads = 0);

// A convolution prepared once for fixed weights (bind time, law 1): the oneDNN primitive with
// the epilogue as post-ops, and the weights already reordered into the primitive's layout. Runs
// may happen concurrently from several threads (per-run buffers are thread-local).
class PreparedConv2d;
struct PreparedConv2dDeleter {
  void operator()(PreparedConv2d* c) const;
};
using PreparedConv2dPtr = std::unique_ptr<PreparedConv2d, PreparedConv2dDeleter>;

// `w` is read now (and, when no reorder is needed, again on every run: it must outlive the
// result). `has_bias` fixes whether runs pass a bias. Errors as Conv2d.
Result<PreparedConv2dPtr> PrepareConv2d(const Conv2dParams& p, const float* w, bool has_bias,
                                        const ConvEpilogue& epi, int num_threads = 0);
// y = post_op(conv(x, w) + bias [+ y_in]); the thread count is the one given at prepare.
Status RunConv2d(const PreparedConv2d& c, const float* x, const float* bias, float* y);

// A matrix product prepared once (bind time, law 1): the oneDNN matmul primitive with bias and
// post-op fused, and, when the right-hand operand W is bound at prepare, W already reordered
// into the layout the primitive chose (the library's blocked panels, so no run packs it again).
//   C[b] = alpha * op(A[b]) * op(W[b or 0]) (+ bias[n]), then post_op (kiln_post_op codes).
// A is [batch, M, K] (or [batch, K, M] when trans_a), W is [w_batch, K, N] (or [w_batch, N, K]
// when trans_w) with w_batch 1 (shared) or batch, C is [batch, M, N]; all dense row-major.
struct MatmulParams {
  int64_t M = 1, N = 1, K = 1;
  int64_t batch = 1, w_batch = 1;
  bool trans_a = false, trans_w = false;
  bool has_bias = false;
  int post_op = 0;
  float alpha = 1.0f;
  auto operator<=>(const MatmulParams&) const = default;
};

class PreparedMatmul;
struct PreparedMatmulDeleter {
  void operator()(PreparedMatmul* m) const;
};
using PreparedMatmulPtr = std::unique_ptr<PreparedMatmul, PreparedMatmulDeleter>;

// `w` non-null: W is bound now and reordered into the primitive's layout (a copy; `w` is not read
// again). `w` null: W is passed at every run, in plain layout. InvalidArgument names the field
// for bad params. Runs never allocate: scratch comes from a process-wide pool of blocks (one per
// concurrent run), reserved and touched here.
Result<PreparedMatmulPtr> PrepareMatmul(const MatmulParams& p, const float* w, int num_threads = 0);
// `w` is ignored when W was bound at prepare; `bias` is read when has_bias. May run concurrently.
Status RunMatmul(const PreparedMatmul& m, const float* a, const float* w, const float* bias,
                 float* c);
// The oneDNN implementation the primitive runs ("brg:avx512_core", ...), for dumps and tests.
std::string MatmulImplementation(const PreparedMatmul& m);

// The loaded oneDNN's version as "major.minor.patch+hash" (identity/toolchain.h records the
// header's; the two must agree).
std::string LoadedKernelLibraryVersion();

// Applies a kiln_post_op code in place to n floats, on `num_threads` threads of the kernel
// library's OpenMP team (0 = the calling thread's team size); InvalidArgument for an unknown
// code. IEEE semantics: NaN and infinities come out as the interpreter's activations give them.
Status ApplyPostOp(int post_op, float* y, int64_t n, int num_threads = 0);

}  // namespace kiln
