// Static shape inference and structural folding for concrete input shapes (ops layer).
//
// Sits above the op registry (it runs each op's infer(), and its run() to fold) and below the
// compiler, which specializes a graph per shape class with these. Given the shape of every graph
// input, InferShapes assigns a concrete TensorType to every value and computes the value of every
// structural value it can: int/bool results of nodes whose inputs are all known (Shape of a typed
// value, Gather/Concat/Unsqueeze chains over shapes, ...). Weights are never "known": no fold ever
// reads a weight value (law 1: a cell must not depend on a checkpoint).
#pragma once

#include <map>
#include <set>
#include <string>

#include "src/kiln/base/status.h"
#include "src/kiln/graph/ir.h"
#include "src/kiln/ops/registry.h"

namespace kiln {

struct InferredGraph {
  std::map<std::string, TensorType> types;  // every value of the graph (but `dynamic` ones)
  std::map<std::string, Tensor> known;      // statically known structural values
  // Tolerant inference only: values whose type is known only at run time (the outputs of a node
  // whose shape depends on an input's value, and of every node that reads one), in no order.
  std::set<std::string> dynamic;
};

// Folding never materializes a structural value larger than this (elements).
inline constexpr int64_t kMaxFoldElements = 1 << 16;

// `input_shapes` gives each graph input's concrete shape; an input left out uses its declared
// shape, which must then be fully known. Errors name the input or node. Subgraphs (If, Loop)
// are inferred with outer names visible; a node whose output shape is data-dependent (an If
// whose branches disagree on an unknown condition, a Loop whose trip count is unknown) is
// refused with Unimplemented naming it. Nodes that own subgraphs are never folded.
//
// With `tolerate_dynamic`, such a node is not refused: its outputs, and those of every node that
// reads them (directly or from a subgraph), are listed in InferredGraph::dynamic instead, with no
// type. A compiled cell runs those nodes as one dynamic region (compile/lower.cc).
Result<InferredGraph> InferShapes(const Graph& graph,
                                  const std::map<std::string, Shape>& input_shapes,
                                  bool tolerate_dynamic = false);

// The names a subgraph reads from the graphs around it, as static inference sees them.
class OuterScope {
 public:
  virtual ~OuterScope() = default;
  // True when an enclosing scope defines `name`: sets its type and, when statically known (a
  // structural value), *known; else *known = nullptr.
  virtual bool Lookup(const std::string& name, TensorType* type, const Tensor** known) const = 0;
};

// Static inference of a subgraph body (If branch, Loop body): explicit inputs typed by `types`
// (values[i] non-null when known), outer names resolved through `outer`. Returns the body's
// output types; `known_outputs` (optional) receives each output's value when known. A node in
// the body whose output shape is data-dependent is refused by name, as in InferShapes.
Result<std::vector<TensorType>> InferBodyTypes(const Graph& body,
                                               const std::vector<TensorType>& types,
                                               const std::vector<const Tensor*>& values,
                                               const OuterScope* outer,
                                               std::vector<Tensor>* known_outputs = nullptr);

// Returns a copy of `graph` where every node whose outputs are all known structural values is
// replaced by those values as structural-constant initializers, and initializers no node or
// output uses any more are dropped (weights are kept: the graph still binds them). A node with an
// output named in `keep` (optional) is left to run.
Result<Graph> FoldStructural(const Graph& graph, const InferredGraph& inferred,
                             const std::set<std::string>* keep = nullptr);

}  // namespace kiln
