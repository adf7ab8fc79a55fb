// The host side of the cell ABI (runtime layer): the kiln_host_api table a process hands to every
// cell entry it initializes. GEMM and convolution go to the kernel library (ops/dnnl_kernels.h);
// ops the code generator does not specialize run the op registry's reference kernel, described
// by a JSON node spec embedded in the cell (NodeSpecJson builds it at codegen time).
// No compiler code lives here: hub/ and worker/ may link this layer.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "src/kiln/abi/cell_abi.h"
#include "src/kiln/base/status.h"
#include "src/kiln/graph/ir.h"
#include "src/kiln/ops/registry.h"

namespace kiln {

// A dynamic region: the node of a reference kernel that runs a cell's data-dependent nodes (those
// whose output shapes depend on input values). Its `body` graph attribute takes every value the
// region reads as an input (weights among them arrive at run time, never in the spec) and gives
// the graph outputs it computes; the host runs the body with the eager interpreter, and an output
// the spec marks "dynamic": true arrives as a kiln_dynamic_output. The domain is one no ONNX model
// can use.
inline constexpr const char* kDynamicRegionOp = "DynamicRegion";
inline constexpr const char* kDynamicRegionDomain = "ai.kiln.internal";

// The process-wide host table (immutable, thread-safe).
const kiln_host_api* HostApi();

// A node spec for op_prepare: op type, domain, opset, attributes, input/output types, and the
// values of structural (non-weight) constant inputs. A node that owns subgraphs (If, Loop)
// carries them whole, and `input_types` continue past the node's own inputs with one entry per
// name in ImplicitInputs(node) (listed as "outer"): the host binds those values by name and runs
// the subgraphs through the eager interpreter. Never contains a weight value (law 1).
Result<nlohmann::json> NodeSpecJson(const Node& node, int64_t opset,
                                    const std::vector<TensorType>& input_types,
                                    const std::vector<bool>& input_present,
                                    const std::vector<TensorType>& output_types);

// Translates a Status into the ABI code: ResourceExhausted -> RESOURCE_EXHAUSTED, anything else
// -> FAULT. The one place this mapping lives.
int StatusToCellCode(const Status& s);

// The request a cell's run serves, as the host's reference ops see it. The caller of
// kiln_cell_entry_run installs one on its thread for the length of the run (ScopedHostRunContext):
// a cell calls op_run on the thread that called it, and the ABI carries no request. A dynamic
// region (and every reference op) charges the tensors it allocates to `budget`, so a request's
// values are bounded in a cell as they are in eager; a region that refuses the request's values
// leaves the refusal in `refusal`, whose token (request_too_large) the ABI's bare
// KILN_CELL_BAD_ARGUMENT cannot carry.
struct HostRunContext {
  std::shared_ptr<MemoryBudget> budget;  // null: unbounded (sizes are still checked)
  Status refusal;                        // OK unless a region refused the request's values
};

// Makes `context` this thread's HostRunContext until the scope ends (then the previous one, if
// any, again). `context` must outlive the scope.
class ScopedHostRunContext {
 public:
  explicit ScopedHostRunContext(HostRunContext* context);
  ~ScopedHostRunContext();
  ScopedHostRunContext(const ScopedHostRunContext&) = delete;
  ScopedHostRunContext& operator=(const ScopedHostRunContext&) = delete;

 private:
  HostRunContext* previous_;
};

}  // namespace kiln
