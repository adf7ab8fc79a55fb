// The compiler's lowered IR: a Program is one shape class of one graph as a straight list of
// kernels over typed buffers (compile layer). Graph passes (specialize, fold, dead code) run on
// kiln::Graph; Lower() turns the result into a Program; fusion and memory planning rewrite the
// Program; the C++ emitter prints it. Every shape is a constant here.
//
// Invariants (Program::Verify checks them after every pass):
// - buffers are read only after a kernel (or the caller) defined them;
// - a kernel's output buffers are temps, each written by exactly one kernel;
// - an alias buffer views another buffer's bytes with the same element count and dtype;
// - weights are types only: a Program never holds a weight value (law 1).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "src/kiln/base/status.h"
#include "src/kiln/graph/ir.h"
#include "src/kiln/ops/registry.h"
#include "src/kiln/runtime/host.h"

namespace kiln {

// Below this many output pixels per call (N*H*W) Winograd loses to the direct kernel (measured
// on one AVX-512 core with its two reorders: a loss at 7x7 for one image, a gain from 14x14).
inline constexpr int64_t kWinogradMinPixels = 14 * 14;

struct Buffer {
  enum class Kind { kInput, kWeight, kConst, kTemp };
  int id = 0;
  std::string name;  // the graph value's name (for dumps and errors)
  TensorType type;
  Kind kind = Kind::kTemp;
  int index = -1;        // kInput: input slot; kWeight: constant-table slot; kConst: embed slot
  int alias_of = -1;     // >= 0: views that buffer's bytes (Reshape-likes); no kernel writes it
  int output_slot = -1;  // >= 0: a temp written straight into the caller's output buffer
  // A graph output whose shape is known only at run time: `type` holds its dtype and no shape,
  // and its slot carries a kiln_dynamic_output (abi/cell_abi.h). Only a dynamic region's
  // kernel writes one.
  bool dynamic = false;
  int64_t offset = -1;  // kTemp without output_slot/alias: byte offset in the workspace
  Tensor value;         // kConst only: the structural value (embedded in the cell source)
  // Memory order of the logical dims, outermost first (plan-layout sets it): {0, 2, 3, 1} is a
  // [N,C,H,W] tensor stored NHWC. Empty = row-major. Inputs, weights, constants and the
  // caller's outputs are always row-major; an alias's perm describes the same bytes in its own
  // logical shape.
  std::vector<int> perm;
  // A view (alias_of >= 0) planned by plan-layout: the element stride of each logical dim and
  // the element offset from the start of the buffer it views (a slice of it, a transposed or
  // reshaped view of permuted bytes). Empty strides: the view's own perm decides.
  std::vector<int64_t> strides;
  int64_t view_offset = 0;

  int64_t bytes() const {
    return NumElements(type.shape) * static_cast<int64_t>(DTypeSize(type.dtype));
  }
};

// One operation of a fused elementwise loop nest.
struct Expr {
  std::string op;                 // ONNX op type (Add, Sigmoid, Where, Cast, ...)
  std::vector<int> operands;      // >= 0: expr index; < 0: kernel input -(k+1)
  std::vector<float> params;      // op constants from attributes (alpha, min/max, ...)
  DType dtype = DType::kFloat32;  // result type
};

struct Kernel {
  enum class Kind {
    kFused,      // elementwise/broadcast chain as one loop nest (exprs)
    kMatMul,     // batched MatMul through the kernel library's GEMM
    kGemm,       // ONNX Gemm through GEMM (+ C)
    kConv,       // 2-D convolution through the kernel library, fused epilogue
    kSoftmax,    // fused max/exp/sum/divide along one axis
    kReduce,     // ReduceMean/Sum/Max/Min over one contiguous block of axes, generated loops
    kNorm,       // InstanceNormalization / LayerNormalization as fused reductions
    kTranspose,  // generated permutation loops
    kConcat,     // generated block copies
    kGather,     // Gather with a structural (compile-time) index: generated block copies
    kResize,     // nearest Resize by integer factors (floor(out / factor) per axis)
    kPool,       // 2-D max/average pooling and global pooling, generated loops (any layout)
    kAttention,  // softmax(epilogue(Q K')) V in tiles with an online softmax (inputs Q, K', V,
                 // then the epilogue's operands); the scores are never materialized
    kReference,  // the op registry's reference kernel through the runtime; also the dynamic
                 // region (runtime/host.h kDynamicRegionOp: the graph's data-dependent nodes,
                 // run by the host's eager interpreter)
  };
  Kind kind = Kind::kReference;
  std::string label;        // op types it covers, for dumps ("Conv+Add+Relu")
  std::vector<int> inputs;  // buffer ids
  std::vector<int> outputs;
  // The node this kernel came from (kReference, kConv, ...) with its opset; copied so a Program
  // outlives the graph it was lowered from.
  Node node;
  int64_t opset = 0;
  // kFused
  std::vector<Expr> exprs;
  std::vector<int> output_exprs;  // expr index producing outputs[i]
  // kConv epilogue (abi/cell_abi.h kiln_post_op), and whether inputs.back() is a residual
  // summed into the output before the post-op.
  int post_op = 0;
  bool conv_sum = false;
  // kConv: kiln_conv_layout chosen by the choose-conv-layout pass (0 = left to the library).
  // KILN_CONV_LAYOUT_NHWC_WINOGRAD says the convolution's kind and channels suit Winograd; the
  // cell asks for it only when the batch's pixels (N*H*W) reach kWinogradMinPixels, a test
  // written into the descriptor, so the source is the same text at every batch size.
  int conv_layout = 0;
  // kMatMul / kGemm / kConv: an elementwise epilogue applied in place to outputs[0] right after
  // the kernel-library call, while the tile is hot. Operands: >= 0 an earlier epilogue expr,
  // -1 the element the call produced, -(j+2) inputs[j] broadcast to the output.
  std::vector<Expr> epilogue;
  int epilogue_out = -1;
  // kNorm: > 0 for a GroupNorm over this many channel groups of a rank-4 input (node is the
  // InstanceNormalization it was written as, whose scale and bias are per group).
  int64_t groups = 0;
  // kMatMul / kGemm: inputs[bias] is a per-column vector [N] the library adds to every row
  // (fold-gemm-bias moves it there out of the epilogue); -1 for none.
  int bias = -1;
  // kMatMul / kGemm whose whole epilogue is the erf GELU x * c3 * (c2 + erf(x op c1)) with scalar
  // operands: inputs[gelu[0..2]] are c1, c2, c3 and gelu_div says op is / (else *). The
  // constants are weights, so whether the library's fused GELU stands in for the epilogue is
  // decided at bind, from their bound values (law 1); empty: no such epilogue.
  std::vector<int> gelu;
  bool gelu_div = true;
  // kMatMul with a 2-D W, kGemm: inputs[1] holds W transposed (plan-layout points the kernel at
  // the bytes of a transposed view, a Linear layer's weight read through a Transpose, instead of
  // copying them); the library call reads it with the transposition flag flipped.
  bool trans_w = false;
};

// The dims a reduction node without an axes input reduces, per dim of its input `x`, as the op's
// own plan reads them (ops/plans.h); an error for a node that is no reduction of `x` or a
// noop_with_empty_axes pass-through.
Result<std::vector<bool>> ReducedDims(const Node& node, int64_t opset, const TensorType& x);

// True for an empty or identity perm, or one that moves only dims of size 1 (same bytes).
bool IsRowMajor(const Shape& shape, const std::vector<int>& perm);
// Element stride of every logical dim of `b` (its view strides, else its perm applied).
std::vector<int64_t> LogicalStrides(const Buffer& b);
// Whether `b`'s elements lie row-major and dense (from its pointer), whatever its perm or
// strides say.
bool HasRowMajorStrides(const Buffer& b);
// Strides of `b` read as an operand broadcast to `out` (right-aligned, size-1 dims stride 0).
std::vector<int64_t> OperandStrides(const Buffer& b, const Shape& out);

struct Program {
  std::string entry_name;  // "entry<i>"
  std::vector<Buffer> buffers;
  std::vector<Kernel> kernels;
  std::vector<int> inputs;   // buffer id per graph input, in graph order
  std::vector<int> outputs;  // buffer id per graph output, in graph order
  std::vector<std::string> input_names, output_names;
  std::vector<int> weights;  // buffer id per constant-table slot
  int64_t workspace_bytes = 0;

  int AddBuffer(Buffer b);
  // Follows alias_of to the buffer that owns the bytes.
  int Root(int id) const;
  // Element offset of buffer `id`'s first element from its root's (sum of view offsets).
  int64_t RootOffset(int id) const;
  Status Verify() const;
  std::string Dump() const;  // text, one kernel per line; deterministic
};

}  // namespace kiln
