/* The cell ABI: the versioned C interface every cell's shared object exports, and the host
 * services a cell calls back into. ABI layer, the ground floor: the code generator (which emits
 * cells against this header), the runtime and the loader (which call them) include it; it
 * includes nothing of kiln. The codegen version hashes it: an edit here re-keys every cell.
 *
 * Why a host-services table instead of linking kernels into the .so: a cell then depends on no
 * library at link time (only libc/libm), so the bytes are reproducible and the kernel library a
 * cell uses is exactly the one the adopting process verified (the toolchain axis records its
 * version). The table is passed at entry init and must outlive the entry.
 *
 * Lifecycle, per entry (one entry = one shape class):
 *   kiln_cell_describe()            -> JSON: entries, I/O types, workspace bytes, constant table
 *   kiln_cell_entry_init(...)       -> binds weight pointers (in constant-table order) + threads
 *   kiln_cell_entry_init_at(...)    -> the same for a ranged entry, at one value of each of its
 *                                      symbols: an instance of the entry for that point, whose
 *                                      library calls are prepared for the shapes there
 *   kiln_cell_entry_run(...)        -> any number of times, caller-provided I/O and workspace;
 *                                      concurrent runs of one entry need distinct workspaces
 *   kiln_cell_entry_release(...)
 * Status codes separate a cell fault (a bug in the cell: the caller revokes it) from resource
 * exhaustion (the machine's state: the caller serves eager and keeps the cell). No C++ exception
 * ever crosses this boundary.
 */
#ifndef KILN_ABI_CELL_ABI_H_
#define KILN_ABI_CELL_ABI_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_CELL_ABI_VERSION 3

enum kiln_cell_status {
  KILN_CELL_OK = 0,
  KILN_CELL_BAD_ARGUMENT = 1,      /* the caller passed something the cell did not declare, or
                                      input values its dynamic region refuses (as eager does) */
  KILN_CELL_FAULT = 2,             /* the cell (or a kernel it called) failed: revoke it */
  KILN_CELL_RESOURCE_EXHAUSTED = 3 /* allocation failed: serve eager, keep the cell */
};

/* Elementwise post-op fused into a convolution or GEMM epilogue. */
enum kiln_post_op {
  KILN_POST_NONE = 0,
  KILN_POST_RELU = 1,
  KILN_POST_SIGMOID = 2,
  KILN_POST_SILU = 3, /* x * sigmoid(x) */
  KILN_POST_TANH = 4,
  KILN_POST_GELU_ERF = 5,
  KILN_POST_HARDSWISH = 6 /* x * min(max(x + 3, 0), 6) / 6 (ONNX HardSwish) */
};

/* How a convolution lays its tensors out inside the kernel library (the compiler's
 * choose-conv-layout pass decides; AUTO leaves it to the library). */
enum kiln_conv_layout {
  KILN_CONV_LAYOUT_AUTO = 0,
  KILN_CONV_LAYOUT_BLOCKED = 1, /* the library's blocked layout, reordered in and out */
  KILN_CONV_LAYOUT_PLAIN = 2,   /* directly on NCHW (a 1x1 convolution is a GEMM) */
  KILN_CONV_LAYOUT_NHWC = 3,    /* x, y and a summed residual are NHWC in the caller's memory */
  KILN_CONV_LAYOUT_NHWC_WINOGRAD = 4 /* as NHWC; the library's Winograd kernel where it has one */
};

typedef struct kiln_conv2d_desc {
  int64_t n, c, h, w; /* input dims in NCHW order (memory order per `layout`) */
  int64_t k, r, s;    /* output channels, kernel height/width */
  int64_t stride_h, stride_w;
  int64_t pad_t, pad_l, pad_b, pad_r;
  int64_t dil_h, dil_w; /* ONNX convention: 1 = dense */
  int64_t group;
  int32_t post_op;  /* enum kiln_post_op, applied after bias (and after sum) */
  int32_t sum;      /* 1: y = conv(x) + bias + y_in (residual add into the output buffer) */
  int32_t layout;   /* enum kiln_conv_layout: the compiler's layout choice for this conv */
  int32_t reserved; /* 0 */
} kiln_conv2d_desc;

/* A matrix product prepared at entry init (see matmul_prepare):
 *   C[b] = alpha * op(A[b]) * op(W[b or 0]) (+ bias[n]), then post_op,
 * A [batch, m, k] ([batch, k, m] when trans_a), W [w_batch, k, n] ([w_batch, n, k] when trans_w),
 * w_batch 1 (shared) or batch, C [batch, m, n]; all dense row-major float32. */
typedef struct kiln_matmul_desc {
  int64_t m, n, k;
  int64_t batch, w_batch;
  float alpha;
  int32_t trans_a, trans_w;
  int32_t has_bias; /* bias[n] passed to every run */
  int32_t post_op;  /* enum kiln_post_op, applied after bias */
  int32_t reserved; /* 0 */
} kiln_matmul_desc;

typedef struct kiln_host_api {
  uint32_t abi_version; /* KILN_CELL_ABI_VERSION of the host */
  /* Row-major C = alpha * op(A) * op(B) + beta * C. Returns a kiln_cell_status. */
  int (*sgemm)(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
               const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
               int64_t ldc, int num_threads);
  /* NCHW convolution with optional bias (may be NULL) and fused epilogue. */
  int (*conv2d)(const kiln_conv2d_desc* desc, const float* x, const float* w, const float* bias,
                float* y, int num_threads);
  /* The reference kernel of one op, for ops the emitter does not specialize. `node_json`
   * describes the op (type, domain, opset, attributes, input/output types and structural input
   * values); prepared once at entry init, run with every input and output pointer. */
  int (*op_prepare)(const char* node_json, void** op);
  int (*op_run)(void* op, const void* const* inputs, void* const* outputs, int num_threads);
  void (*op_release)(void* op);
  /* A convolution prepared at entry init for bound weights `w` (bind time: the weights may be
   * reordered into the kernel library's preferred layout now, never at compile time, law 1).
   * `w` must stay valid until conv2d_release. has_bias fixes whether runs pass a bias. */
  int (*conv2d_prepare)(const kiln_conv2d_desc* desc, const float* w, int has_bias, int num_threads,
                        void** conv);
  /* Runs a prepared convolution: as conv2d with the prepared weights. May run concurrently. */
  int (*conv2d_run)(void* conv, const float* x, const float* bias, float* y);
  void (*conv2d_release)(void* conv);
  /* Calls fn(ctx, begin, end) on disjoint chunks covering [0, n), on up to num_threads threads
   * (the kernel library's thread team); returns when all are done. fn must not fail. */
  int (*parallel_for)(int64_t n, void (*fn)(void* ctx, int64_t begin, int64_t end), void* ctx,
                      int num_threads);
  /* A matrix product prepared at entry init. `w` non-NULL: W is bound now (bind time, law 1)
   * and copied into the kernel library's preferred layout, so no run repacks it; NULL: W is
   * passed to every run. Runs allocate nothing and may run concurrently. */
  int (*matmul_prepare)(const kiln_matmul_desc* desc, const float* w, int num_threads, void** mm);
  int (*matmul_run)(void* mm, const float* a, const float* w, const float* bias, float* c);
  void (*matmul_release)(void* mm);
} kiln_host_api;

/* A graph output whose shape is known only at run time (describe() marks it "dynamic": true,
 * with shape []): it depends on input values, as NonZero's or a Reshape's by a shape given as an
 * input do. The caller passes, in that output's slot, a pointer to this struct instead of a
 * buffer; during the run the cell calls alloc once with the shape it computed and writes the
 * returned buffer (of that shape and the declared dtype). alloc returns NULL when it cannot
 * allocate (the run then fails with KILN_CELL_RESOURCE_EXHAUSTED); a NULL for an empty shape is
 * no failure. */
typedef struct kiln_dynamic_output {
  void* (*alloc)(struct kiln_dynamic_output* self, const int64_t* dims, int32_t rank);
  void* ctx; /* the caller's */
} kiln_dynamic_output;

typedef struct kiln_cell_entry kiln_cell_entry;

/* Exported by every cell. */
int kiln_cell_abi_version(void);
const char* kiln_cell_describe(void);
int kiln_cell_entry_init(uint32_t entry, const kiln_host_api* host, const void* const* constants,
                         uint32_t num_constants, int num_threads, kiln_cell_entry** out);
/* A ranged entry (describe() gives it "ranged": {"symbols": [...], "ranges": {...}}) is
 * instantiated at a point: `symbols` holds one value per symbol, in describe()'s order, each
 * inside its range (else KILN_CELL_BAD_ARGUMENT). A concrete entry takes num_symbols 0;
 * kiln_cell_entry_init(...) is kiln_cell_entry_init_at(entry, NULL, 0, ...). An instance runs
 * only the shapes of its point; the workspace is the entry's (planned at the range's maximum). */
int kiln_cell_entry_init_at(uint32_t entry, const int64_t* symbols, uint32_t num_symbols,
                            const kiln_host_api* host, const void* const* constants,
                            uint32_t num_constants, int num_threads, kiln_cell_entry** out);
int kiln_cell_entry_run(kiln_cell_entry* entry, const void* const* inputs, void* const* outputs,
                        void* workspace, uint64_t workspace_bytes);
void kiln_cell_entry_release(kiln_cell_entry* entry);

#ifdef __cplusplus
}
#endif

#endif /* KILN_ABI_CELL_ABI_H_ */
