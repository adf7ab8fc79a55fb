// The eager interpreter: runs any verified graph at any input shape through the op registry's
// reference kernels. It is both the numerical oracle every compiled cell is proven against and
// the fallback that serves a request whenever no cell can.
//
// Per run: check each input (present, dtype exact, rank and declared dims), then walk the nodes
// in order: infer output types from the actual inputs, allocate, run the kernel, and free every
// intermediate right after its last consumer. Weights come from the graph or from a bound
// checkpoint (WeightMap), so one Interpreter serves every checkpoint of its graph.
// Thread-safety: Run is const and may be called concurrently.
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
  // Verifies the graph and prepares the run plan (op definitions, last uses).
  static Result<Interpreter> Create(std::shared_ptr<const Graph> graph);

  // Runs with `weights` (nullptr: the graph's own). Returns every graph output by name. Errors
  // name the input or node and what was expected; a kernel error is prefixed with the node.
  Result<TensorMap> Run(const TensorMap& inputs, const WeightMap* weights = nullptr,
                        RunStats* stats = nullptr) const;

  const Graph& graph() const { return *graph_; }

  // Checks one set of inputs against the graph's signature without running.
  Status CheckInputs(const TensorMap& inputs) const;

 private:
  struct Step {
    const OpDef* def;
    int64_t opset;
    std::vector<std::string> release_after;  // values whose last consumer is this step
  };
  std::shared_ptr<const Graph> graph_;
  std::vector<Step> steps_;
};

}  // namespace kiln
