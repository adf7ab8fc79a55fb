// The numerics gate and the fence proof (cell layer; docs/design.md §2 laws 2 and 5, §8).
//
// Gate, per entry: compiled vs eager on seeded probe inputs, over all outputs concatenated, in
// double: cos = <r,s>/(|r||s|) (both zero -> 1, one zero -> 0), ret = |s|/|r|, rel_l2 = |s-r|/|r|
// (reported, not gated). cos < floor -> DESTROYED; floor <= cos < warn -> DEGRADED; ret outside
// [rf, 1/rf] -> at least DEGRADED; non-finite values -> UNMEASURABLE. The worst entry decides.
// Strict (mint): only HEALTHY ships.
// Fence: the cell re-bound to a perturbed checkpoint must still be HEALTHY against eager run with
// that checkpoint, and its constant table must list every weight the graph binds. A failing fence
// names the weight whose perturbation the cell ignores.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "src/kiln/base/status.h"
#include "src/kiln/cell/loader.h"
#include "src/kiln/eager/interpreter.h"

namespace kiln {

// Refusal tokens of a mint's proof (Status::token()).
inline constexpr const char* kRefusalNumerics = "numerics_refused";
inline constexpr const char* kRefusalFence = "fence_refused";
inline constexpr const char* kRefusalUnmeasurable = "unmeasurable";

struct NumericsThresholds {
  double floor = 0.999;
  double warn = 0.99999;
  double retention = 0.999;
};

enum class Verdict { kHealthy, kDegraded, kDestroyed, kUnmeasurable };
const char* VerdictName(Verdict v);

struct EntryNumerics {
  int entry = 0;
  double cos = 0, ret = 0, rel_l2 = 0;
  Verdict verdict = Verdict::kUnmeasurable;
};

struct GateReport {
  std::vector<EntryNumerics> entries;
  Verdict verdict = Verdict::kUnmeasurable;  // the worst entry's
  int worst_entry = -1;
  std::string Summary() const;  // "HEALTHY (worst entry 0: cos=... ret=... rel_l2=...)"
};

// Compares two output sets (names must match) under `t`.
EntryNumerics CompareOutputs(const TensorMap& reference, const TensorMap& candidate,
                             const NumericsThresholds& t);

// Exclusive upper bounds for integer probe values, by graph input: an input that reaches the
// indices of a Gather on a table the graph binds (an embedding), through value-preserving ops
// (Cast, Identity, Reshape, Squeeze, Unsqueeze, Flatten), stays below that table's extent along
// the gathered axis; one that reaches OneHot's indices stays below a constant depth. Inputs not
// listed use the default range [0, 8).
std::map<std::string, int64_t> ProbeIntBounds(const Graph& graph);

// Seeded probe inputs for an entry: a pure function of (entry index, lane, input specs, bounds).
// Floats are drawn from [-1, 1), integers from [0, min(8, bound)), bools from {0, 1}.
Result<TensorMap> ProbeInputs(const EntryMetadata& entry, Lane lane, uint64_t salt = 0,
                              const std::map<std::string, int64_t>& int_bounds = {});

// Runs every entry of `cell` (bound to `weights`) and `eager` (with `weights`) on probes.
Result<GateReport> RunGate(const ArmedCell& cell, const Interpreter& eager,
                           const WeightMap& weights, const NumericsThresholds& t);

// The fence proof. On success returns the perturbed-checkpoint gate report; refuses with
// InvalidArgument, token `fence_refused`, naming the weight. Leaves `cell` bound to `weights`.
Result<GateReport> RunFenceProof(ArmedCell& cell, const Interpreter& eager,
                                 const WeightMap& weights, const NumericsThresholds& t,
                                 uint64_t seed = 0x6b696c6e);

}  // namespace kiln
