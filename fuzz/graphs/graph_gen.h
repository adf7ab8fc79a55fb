// Random valid ONNX graphs for the compiler's differential fuzzer (fuzz/graphs, above the
// compiler and the interpreter; docs/reliability.md "Fuzzing the compiler").
//
// A graph is a pure function of (seed, options): the same seed gives the same model bytes and
// the same inputs on every machine. It is built from moves, each one the shape of something
// exporters write and the compiler has a pass for: elementwise and broadcasting chains (runtime
// operands of shape [N], [1, N], [B, 1, ...] against library outputs), GEMM/MatMul/Conv with
// epilogues whose operands are weights or tensors computed at run time, normalizations,
// attention, layout changes (Transpose, Reshape, Slice, Split, Concat, Gather, pools, Resize),
// Shape/Gather/Unsqueeze/Concat chains that fold, If (on a structural or a runtime condition)
// and Loop bodies that hold recurrent ops, and recurrent ops alone. Inputs are drawn at batch 1
// and above, and some carry NaN, +Inf and -Inf.
//
// Ops whose result jumps (Floor, Sign, comparisons, casts to integers, ArgMax) only read values
// both engines compute bit for bit (inputs, weights, moves and selections of them): two correct
// engines that sum in another order may land on either side of a jump, which is no bug.
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <string>
#include <vector>

#include "src/kiln/eager/interpreter.h"

namespace kiln::graph_fuzz {

struct FuzzGraph {
  std::string name;  // "s<seed>" (a shrunk or replayed graph keeps its origin's)
  onnx::ModelProto model;
  TensorMap inputs;                // one value per graph input
  std::vector<std::string> moves;  // the moves that built it, in order
};

struct GenOptions {
  int64_t opset = 17;
  int min_moves = 2;
  int max_moves = 7;
};

// The opsets graphs are generated at (each batch is one opset: one cell holds one graph).
const std::vector<int64_t>& FuzzOpsets();

// Every move's name, for coverage counts.
const std::vector<std::string>& MoveNames();

FuzzGraph GenerateGraph(uint64_t seed, const GenOptions& options);

}  // namespace kiln::graph_fuzz
