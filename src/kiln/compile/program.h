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

struct Buffer {
  enum class Kind { kInput, kWeight, kConst, kTemp };
  int id = 0;
  std::string name;  // the graph value's name (for dumps and errors)
  TensorType type;
  Kind kind = Kind::kTemp;
  int index = -1;      // kInput: input slot; kWeight: constant-table slot; kConst: embed slot
  int alias_of = -1;   // >= 0: views that buffer's bytes (Reshape-likes); no kernel writes it
  int output_slot = -1;  // >= 0: a temp written straight into the caller's output buffer
  // A graph output whose shape is known only at run time: `type` holds its dtype and no shape,
  // and its slot carries a kiln_dynamic_output (runtime/cell_abi.h). Only a dynamic region's
  // kernel writes one.
  bool dynamic = false;
  int64_t offset = -1;   // kTemp without output_slot/alias: byte offset in the workspace
  Tensor value;          // kConst only: the structural value (embedded in the cell source)

  int64_t bytes() const {
    return NumElements(type.shape) * static_cast<int64_t>(DTypeSize(type.dtype));
  }
};

// One operation of a fused elementwise loop nest.
struct Expr {
  std::string op;             // ONNX op type (Add, Sigmoid, Where, Cast, ...)
  std::vector<int> operands;  // >= 0: expr index; < 0: kernel input -(k+1)
  std::vector<float> params;  // op constants from attributes (alpha, min/max, ...)
  DType dtype = DType::kFloat32;  // result type
};

struct Kernel {
  enum class Kind {
    kFused,      // elementwise/broadcast chain as one loop nest (exprs)
    kMatMul,     // batched MatMul through the kernel library's GEMM
    kGemm,       // ONNX Gemm through GEMM (+ C)
    kConv,       // 2-D convolution through the kernel library, fused epilogue
    kSoftmax,    // fused max/exp/sum/divide along one axis
    kNorm,       // InstanceNormalization / LayerNormalization as fused reductions
    kTranspose,  // generated permutation loops
    kConcat,     // generated block copies
    kGather,     // Gather with a structural (compile-time) index: generated block copies
    kResize,     // nearest Resize by integer factors (floor(out / factor) per axis)
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
  // kConv epilogue (runtime/cell_abi.h kiln_post_op), and whether inputs.back() is a residual
  // summed into the output before the post-op.
  int post_op = 0;
  bool conv_sum = false;
  // kConv: kiln_conv_layout chosen by the choose-conv-layout pass (0 = left to the library).
  int conv_layout = 0;
  // kMatMul / kGemm / kConv: an elementwise epilogue applied in place to outputs[0] right after
  // the kernel-library call, while the tile is hot. Operands: >= 0 an earlier epilogue expr,
  // -1 the element the call produced, -(j+2) inputs[j] broadcast to the output.
  std::vector<Expr> epilogue;
  int epilogue_out = -1;
};

struct Program {
  std::string entry_name;  // "entry<i>"
  std::vector<Buffer> buffers;
  std::vector<Kernel> kernels;
  std::vector<int> inputs;     // buffer id per graph input, in graph order
  std::vector<int> outputs;    // buffer id per graph output, in graph order
  std::vector<std::string> input_names, output_names;
  std::vector<int> weights;    // buffer id per constant-table slot
  int64_t workspace_bytes = 0;

  int AddBuffer(Buffer b);
  // Follows alias_of to the buffer that owns the bytes.
  int Root(int id) const;
  Status Verify() const;
  std::string Dump() const;  // text, one kernel per line; deterministic
};

}  // namespace kiln
