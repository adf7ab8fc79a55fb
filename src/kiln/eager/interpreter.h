// The eager interpreter: runs any verified graph at any input shape through the op registry's
// reference kernels. It is both the numerical oracle every compiled cell is proven against and
// the fallback that serves a request whenever no cell can.
//
// Per run: check each input (present, dtype exact, rank and declared dims), then walk the nodes
// in order: infer output types from the actual inputs, allocate, run the kernel, and free every
// intermediate right after its last consumer. Weights come from the graph or from a bound
// checkpoint (WeightMap), so one Interpreter serves every checkpoint of its graph.
// Subgraphs (If branches, Loop bodies) run in a child scope of the node that owns them: outer
// names resolve through the enclosing scopes, and a value a subgraph reads stays alive until
// that node has run. Thread-safety: Run is const and may be called concurrently.
//
// Memory: every output is allocated from the type infer gave, with its size checked before the
// allocation (an element count or byte size past int64 is `request_too_large`, never a wrapped
// size), and charged to the run's MemoryBudget when one is given (tensor/memory_budget.h): a
// request whose values ask for more than its budget (ConstantOfShape of [2^40], Range to 2^61)
// is refused by node, shape and bound before a byte of it exists.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "src/kiln/base/status.h"
#include "src/kiln/graph/checkpoint.h"
#include "src/kiln/graph/ir.h"
#include "src/kiln/ops/registry.h"

namespace kiln {

using TensorMap = std::map<std::string, Tensor>;

struct RunStats {
  int64_t nodes_run = 0;
  int64_t peak_live_bytes = 0;  // intermediates alive at once (inputs and weights excluded)
};

class Interpreter {
 public:
  // Verifies the graph and prepares the run plan (op definitions, prepared attributes, last
  // uses).
  static Result<Interpreter> Create(std::shared_ptr<const Graph> graph);

  // Runs with `weights` (nullptr: the graph's own). Returns every graph output by name. Errors
  // name the input or node and what was expected; a kernel error is prefixed with the node.
  // `budget` (optional) is charged every tensor the run allocates, subgraphs included, and
  // refunded as they are freed; the outputs returned stay charged until they are dropped.
  Result<TensorMap> Run(const TensorMap& inputs, const WeightMap* weights = nullptr,
                        RunStats* stats = nullptr,
                        const std::shared_ptr<MemoryBudget>& budget = nullptr) const;

  const Graph& graph() const { return *graph_; }

  // Checks one set of inputs against the graph's signature without running.
  Status CheckInputs(const TensorMap& inputs) const;

 private:
  struct Step {
    const OpDef* def;
    int64_t opset;
    bool owns_subgraphs = false;
    // def->prepare's parse of the node's attributes (null when the op has none), built with the
    // plan and only read afterwards, so concurrent runs share it.
    std::shared_ptr<const PreparedNode> prepared;
    std::vector<std::string> release_after;  // values whose last consumer is this step
  };
  struct Plan {
    std::vector<Step> steps;
  };
  using Plans = std::map<const Graph*, Plan>;  // the top-level graph and every subgraph
  struct Scope;
  class BodyRunner;
  friend class SubgraphNode;

  static Status AddPlans(const Graph& g, Plans& plans);
  static Status Execute(const Plans& plans, const Graph& g, Scope& scope, const WeightMap* weights,
                        RunStats* stats, const std::shared_ptr<MemoryBudget>& budget);

  std::shared_ptr<const Graph> graph_;
  Plans plans_;
};

// One node that owns subgraphs (If, Loop), run outside any graph walk: the runtime host serves
// such a node of a compiled cell with it. Prepared once (op definition, subgraph plans), then
// run with the node's inputs in `ctx` and the values of every name its subgraphs read from the
// enclosing graph in `outer`. `outputs` follow OpDef::run (views to fill, or invalid to assign).
// The subgraphs' tensors are charged to ctx.budget() when it is set.
class SubgraphNode {
 public:
  static Result<std::unique_ptr<SubgraphNode>> Create(const Node& node, int64_t opset);
  Status Run(OpContext& ctx, const TensorMap& outer, std::vector<Tensor>& outputs) const;
  const Node& node() const { return node_; }

 private:
  Node node_;
  const OpDef* def_ = nullptr;
  std::shared_ptr<const PreparedNode> prepared_;
  Interpreter::Plans plans_;
};

}  // namespace kiln
