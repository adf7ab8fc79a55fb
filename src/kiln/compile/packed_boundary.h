// Compiling graphs whose inputs or outputs are not tensors of fixed-size elements (compile
// layer): sequences, optionals and string tensors.
//
// A cell's signature is buffers of fixed-size elements, so such a value crosses it packed into a
// uint8 vector (tensor/packed_value.h): PackBoundary rewrites the graph so that each such input
// NAME becomes a uint8 input NAME + kPackedSuffix that an UnpackValue node turns back into NAME,
// and each such output NAME is packed by a PackValue node into the output NAME + kPackedSuffix.
// Inside the cell those nodes, and every node that reads what they give, run in the dynamic
// region on the host (the interpreter), while the tensor-only rest compiles as usual; the caller
// packs the inputs and unpacks the outputs around the cell (PackInputs, UnpackOutputs). A graph
// whose edges are all tensors is unchanged.
#pragma once

#include <string>
#include <vector>

#include "src/kiln/base/status.h"
#include "src/kiln/eager/interpreter.h"
#include "src/kiln/graph/ir.h"

namespace kiln {

inline constexpr const char* kPackedSuffix = ".packed";

// True when a graph input or output is a sequence, an optional or a string tensor.
bool NeedsPackedBoundary(const Graph& graph);

struct PackedBoundary {
  Graph graph;                     // the rewritten graph (the original when nothing is packed)
  std::vector<ValueInfo> inputs;   // the original inputs that are packed
  std::vector<ValueInfo> outputs;  // the original outputs that are packed
};

Result<PackedBoundary> PackBoundary(const Graph& graph);

// The rewritten graph's inputs: every packed one (by its original name in `inputs`) as bytes
// under its new name, the others as they are.
Result<TensorMap> PackInputs(const PackedBoundary& b, const TensorMap& inputs);
// The original graph's outputs from the rewritten graph's: the packed ones unpacked under their
// original names.
Result<TensorMap> UnpackOutputs(const PackedBoundary& b, const TensorMap& outputs);

}  // namespace kiln
