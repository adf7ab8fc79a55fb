// The compiler's passes, one entry point each (compile layer). compile/pipeline.cc orders them;
// each comment says what a pass changes, what it keeps, and what must run first.
#pragma once

#include <map>
#include <set>
#include <string>

#include "src/kiln/base/status.h"
#include "src/kiln/compile/program.h"
#include "src/kiln/graph/ir.h"
#include "src/kiln/graph/shape_class.h"
#include "src/kiln/ops/shape_inference.h"

namespace kiln {

// --- graph passes --------------------------------------------------------------------------

// Pins every graph input to the class's shape (declared dims become concrete) and checks the
// class names exactly the graph's inputs. First pass; errors name the input.
Status SpecializeToClass(Graph& graph, const ShapeClass& shape_class);

// Replaces every node whose outputs are structural values known for this class by constants
// (Shape/Gather/Concat/Unsqueeze chains ...). Reads no weight value. Requires SpecializeToClass.
// Nodes whose output shapes depend on input values (and their readers) are kept as they are:
// lowering runs them as the entry's dynamic region. Nodes with an output in `keep` are kept too
// (a ranged entry keeps every value whose shape depends on its symbols: CompileOptions).
Status FoldStructuralConstants(Graph& graph, const std::set<std::string>& keep = {});

// Rewrites each inference-form BatchNormalization over float32 X [N, C, ...] into the
// elementwise ops it means: s = scale / sqrt(var + epsilon) per channel, then
// y = (X - mean) * s + B broadcast over the channel axis. Lowered as a BatchNormalization it is a
// reference kernel that reads and writes row-major; as elementwise ops it fuses with the
// activation after it, folds into the convolution before it as an epilogue and runs on the
// convolution's NHWC layout. Statistics stay weights (computed from on every run, never read at
// compile time); epsilon becomes a structural constant. Requires FoldStructuralConstants.
Status DecomposeBatchNorm(Graph& graph);

// Removes nodes none of whose outputs reach a graph output, and structural constants nothing
// reads. Weights stay: the cell's constant table must list every weight the graph binds.
Status EliminateDeadNodes(Graph& graph);

// --- lowering and program passes ----------------------------------------------------------

// One kernel per node: Reshape-likes become aliases, MatMul/Gemm/Conv/Softmax/norms/Transpose
// their own kernels, elementwise ops single-op fused kernels, everything else a reference call.
// Nodes whose types are known only at run time (tolerant shape inference lists their outputs as
// dynamic) become one last reference kernel, the dynamic region (runtime/host.h), whose graph
// outputs the caller receives through kiln_dynamic_output. Requires a specialized graph.
Result<Program> LowerToProgram(const Graph& graph);

// Merges chains of elementwise kernels of one output shape into one loop nest; a value consumed
// outside its chain stays materialized. Requires LowerToProgram.
Status FuseElementwise(Program& program);

// Folds a ReLU/Sigmoid/SiLU/Tanh epilogue and a same-shape residual Add into the convolution
// that produces their input, when the convolution's output has no other reader.
Status FuseConvEpilogues(Program& program);

// Recognizes GroupNorm as exporters write it (Reshape to [N, G, -1], InstanceNormalization,
// Reshape back) and makes it one norm kernel over the rank-4 tensor (Kernel::groups), so its
// input keeps whatever layout it has and the affine and activation after it can fold into it.
// Requires FuseElementwise.
Status FuseGroupNorm(Program& program);

// Folds the elementwise loop that is the only reader of a GEMM, convolution or normalization
// output into that kernel as an epilogue run right after the library call, or in the norm's own
// output loop (bias adds, activations, scaling, per-channel adds). Requires FuseElementwise, so a
// whole chain folds at once.
Status FuseLibraryEpilogues(Program& program);

// Moves a per-column bias add (the epilogue's first operation, reading the GEMM result and a
// vector of N values) into the library call of a MatMul or Gemm, which adds it while the output
// tile is in registers. Requires FuseLibraryEpilogues.
Status FoldGemmBias(Program& program);

// Marks a MatMul or Gemm whose epilogue is exactly the erf GELU (as exporters write it: divide by
// a scalar, Erf, add a scalar, times the input, times a scalar) so the cell can let the library
// apply GELU while the tile is in registers, when the scalars bound at bind are sqrt(2), 1 and
// 0.5 (else the epilogue runs as written). Requires FoldGemmBias.
Status FoldGemmGelu(Program& program);

// Fuses MatMul(Q, K') -> elementwise score epilogue (scale, mask) -> Softmax(last axis) ->
// MatMul(., V) into one attention kernel that runs query blocks against key blocks with an
// online softmax: the scores and probabilities are never stored. Requires FuseLibraryEpilogues
// (the scale and mask are the first MatMul's epilogue).
Status FuseAttention(Program& program);

// Chooses each convolution's layout inside the kernel library: plain NCHW for a dense 1x1
// convolution (it is a GEMM on NCHW, ~1.6x faster measured), the library's blocked layout for
// everything else (depthwise ~6x, dense 3x3 1.1-1.3x faster despite the reorders). Disabled, the
// library applies the same rule itself.
Status ChooseConvLayout(Program& program);

// Plans memory layouts (Buffer::perm): rank-4 float tensors linked to a convolution through
// layout-agnostic kernels (elementwise loops, GroupNorm, pools, concat, resize) live NHWC and the
// convolutions run on them as they lie; every Transpose becomes a view; reshapes view permuted
// bytes where they can; a kernel that cannot read an operand as it lies gets a converted copy.
// Inputs, weights and outputs stay row-major. Requires the fusion passes (it runs on the kernels
// they leave) and choose-conv-layout (it overrides the choice for NHWC convolutions).
Status PlanLayout(Program& program);

// Gives every workspace temp an offset by liveness (greedy, largest first, 64-byte aligned) and
// records the entry's workspace size. Graph outputs are written into the caller's buffers.
// Last program pass.
Status PlanMemory(Program& program);

}  // namespace kiln
