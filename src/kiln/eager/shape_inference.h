// Static shape inference and structural folding for concrete input shapes.
//
// Sits above the op registry (it runs each op's infer(), and its run() to fold) and below the
// compiler, which specializes a graph per shape class with these. Given the shape of every graph
// input, InferShapes assigns a concrete TensorType to every value and computes the value of every
// structural value it can: int/bool results of nodes whose inputs are all known (Shape of a typed
// value, Gather/Concat/Unsqueeze chains over shapes, ...). Weights are never "known": no fold ever
// reads a weight value (law 1: a cell must not depend on a checkpoint).
#pragma once

#include <map>
#include <string>

#include "src/kiln/base/status.h"
#include "src/kiln/graph/ir.h"
#include "src/kiln/ops/registry.h"

namespace kiln {

struct InferredGraph {
  std::map<std::string, TensorType> types;  // every value of the graph
  std::map<std::string, Tensor> known;      // statically known structural values
};

// Folding never materializes a structural value larger than this (elements).
inline constexpr int64_t kMaxFoldElements = 1 << 16;

// `input_shapes` gives each graph input's concrete shape; an input left out uses its declared
// shape, which must then be fully known. Errors name the input or node.
Result<InferredGraph> InferShapes(const Graph& graph,
                                  const std::map<std::string, Shape>& input_shapes);

// Returns a copy of `graph` where every node whose outputs are all known structural values is
// replaced by those values as structural-constant initializers, and initializers no node or
// output uses any more are dropped (weights are kept: the graph still binds them).
Result<Graph> FoldStructural(const Graph& graph, const InferredGraph& inferred);

}  // namespace kiln
