// The compiler's passes, one entry point each (compile layer). compile/pipeline.cc orders them;
// each comment says what a pass changes, what it keeps, and what must run first.
#pragma once

#include <map>
#include <string>

#include "src/kiln/base/status.h"
#include "src/kiln/graph/shape_class.h"
#include "src/kiln/compile/program.h"
#include "src/kiln/eager/shape_inference.h"
#include "src/kiln/graph/ir.h"

namespace kiln {

// --- graph passes --------------------------------------------------------------------------

// Pins every graph input to the class's shape (declared dims become concrete) and checks the
// class names exactly the graph's inputs. First pass; errors name the input.
Status SpecializeToClass(Graph& graph, const ShapeClass& shape_class);

// Replaces every node whose outputs are structural values known for this class by constants
// (Shape/Gather/Concat/Unsqueeze chains ...). Reads no weight value. Requires SpecializeToClass.
// Nodes whose output shapes depend on input values (and their readers) are kept as they are:
// lowering runs them as the entry's dynamic region.
Status FoldStructuralConstants(Graph& graph);

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

// Folds the elementwise loop that is the only reader of a GEMM or convolution output into that
// kernel as an epilogue run right after the library call (bias adds, activations, scaling,
// per-channel adds). Requires FuseElementwise, so a whole chain folds at once.
Status FuseLibraryEpilogues(Program& program);

// Chooses each convolution's layout inside the kernel library: plain NCHW for a dense 1x1
// convolution (it is a GEMM on NCHW, ~1.6x faster measured), the library's blocked layout for
// everything else (depthwise ~6x, dense 3x3 1.1-1.3x faster despite the reorders). Disabled, the
// library applies the same rule itself.
Status ChooseConvLayout(Program& program);

// Gives every workspace temp an offset by liveness (greedy, largest first, 64-byte aligned) and
// records the entry's workspace size. Graph outputs are written into the caller's buffers.
// Last program pass.
Status PlanMemory(Program& program);

}  // namespace kiln
