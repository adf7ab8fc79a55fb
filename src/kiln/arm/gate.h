// The numerics gate and the fence proof (arm layer; docs/design.md §2 laws 2 and 5, §8).
//
// Gate, per entry: compiled vs eager on probe inputs: the samples the target declares that fit
// the entry, a seeded synthetic probe, and the synthetic probe with NaN, +Inf and -Inf planted in
// every float input. Per probe, over all outputs concatenated, in double:
// cos = <r,s>/(|r||s|) (both zero -> 1, one zero -> 0), ret = |s|/|r|, rel_l2 = |s-r|/|r|
// (reported, not gated), over the positions where both are finite. Non-finite positions must
// match exactly (NaN where eager has NaN, +Inf where +Inf): any other difference is DESTROYED, as
// is an output of another shape. cos < floor -> DESTROYED; floor <= cos < warn -> DEGRADED; ret
// outside [rf, 1/rf] -> at least DEGRADED. A probe eager itself refuses is skipped when it is
// synthetic (random integers may be no valid shape or index for the model); a sample eager refuses
// is an error. An entry with no probe measured is UNMEASURABLE. The worst probe decides the entry,
// the worst entry the gate. Strict (mint): only HEALTHY ships.
//
// Fence: the cell must follow the weights exactly as eager does (law 2). Three parts:
// - the constant table of every entry lists every weight the graph binds;
// - structural: no weight with a distinctive run of values (4 consecutive values, at least 3
//   distinct and not all simple constants) appears in the generated source (as a run of the
//   emitter's hex float literals) or in the shared object (as bytes);
// - measured: the cell re-bound to a perturbed checkpoint (PerturbWeights: each weight moved
//   inside its domain) must stay HEALTHY against eager run with the same checkpoint. A
//   perturbation under which eager's own outputs gain or lose a non-finite position measures
//   nothing: it is retried with a smaller scale and another seed, and weights that still cannot be
//   perturbed are isolated by halving the set. A weight no perturbation can measure is proven by
//   the structural part when it is distinctive; otherwise it is UNMEASURABLE, a refusal of its own
//   (token `unmeasurable`), never reported as baked. A weight is named as baked only when the
//   structural scan finds it, or when the cell's output diverges from eager's on a perturbation
//   eager survived.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "src/kiln/arm/loader.h"
#include "src/kiln/base/status.h"
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
  std::string note;  // why, when not HEALTHY ("output 'y' [3]: eager nan, cell 0.04")
  int probes = 0;    // probes compared
  int skipped = 0;   // synthetic probes eager refused
};

struct GateReport {
  std::vector<EntryNumerics> entries;
  Verdict verdict = Verdict::kUnmeasurable;  // the worst entry's
  int worst_entry = -1;
  // "HEALTHY (worst entry 0: cos=... ret=... rel_l2=...; 3 probes)", with the note when not
  // HEALTHY.
  std::string Summary() const;
};

// Compares two output sets (names must match) under `t`, NaN/Inf-aware (see above).
EntryNumerics CompareOutputs(const TensorMap& reference, const TensorMap& candidate,
                             const NumericsThresholds& t);

// Exclusive upper bounds for integer probe values, by graph input: one bound applies to every
// element; several cycle along the innermost axis (the columns of GatherND/ScatterND index
// tuples). An integer input that reaches, through value-preserving ops (Cast, Identity, Reshape,
// Squeeze, Unsqueeze, Flatten, Expand, Tile, Transpose), the indices of Gather, GatherElements,
// ScatterElements/Scatter (the data's extent along the axis), GatherND/ScatterND (the data's
// extent per index column) or OneHot (a constant depth) stays inside what it indexes. Extents
// come from the shape class (or, when it is empty, from initializers and declared shapes).
// Inputs not listed use the default range [0, 8).
using ProbeBounds = std::map<std::string, std::vector<int64_t>>;
ProbeBounds ProbeIntBounds(const Graph& graph, const ShapeClass& shape_class = {});

// Seeded probe inputs for an entry: a pure function of (entry index, lane, input specs, bounds,
// salt). Floats are drawn from [-1, 1), integers from [0, min(8, bound)) (an unbounded integer
// scalar from [1, 8): a count or a step, where 0 divides by zero or never ends), bools from
// {0, 1}.
// With `non_finite`, the first three elements of every float input become NaN, +Inf and -Inf.
Result<TensorMap> ProbeInputs(const EntryMetadata& entry, Lane lane, uint64_t salt = 0,
                              const ProbeBounds& int_bounds = {}, bool non_finite = false);

// Sample inputs (kiln.toml `samples`, or the inputs `kiln run --compile` was given): each a full
// set of graph inputs. A sample is probed on the entry whose shape class it fits.
using Samples = std::vector<TensorMap>;

// Runs every entry of `cell` (bound to `weights`) and `eager` (with `weights`) on its probes.
Result<GateReport> RunGate(const ArmedCell& cell, const Interpreter& eager,
                           const WeightMap& weights, const NumericsThresholds& t,
                           const Samples& samples = {});

// What the structural part of the fence reads: the cell's generated source and shared object.
// Empty views skip the scan of that artifact.
struct CellArtifacts {
  std::string_view source;
  std::string_view shared_object;
};

struct FenceReport {
  GateReport gate;         // the worst measured perturbed-checkpoint run
  int weights = 0;         // weights the graph binds
  int measured = 0;        // followed under a perturbation eager survived
  int perturbed_runs = 0;  // perturbed checkpoints tried (each one gate's worth of runs)
  std::vector<std::string> structural;  // not measurable, proven by the structural scan
  std::string Summary() const;
};

// Names of weights with no distinctive run: the structural scan cannot speak for them.
std::vector<std::string> UnscannableWeights(const WeightMap& weights);

// The structural scan alone: InvalidArgument "fence_refused: weight 'w' ... baked" when a
// weight's distinctive run appears in `artifacts`.
Status ScanForBakedWeights(const WeightMap& weights, const CellArtifacts& artifacts);

struct FenceOptions {
  uint64_t seed = 0x6b696c6e;
  bool structural_scan = true;  // tests turn it off to show the measurement alone refuses
};

// The fence proof. Refuses with InvalidArgument "fence_refused: ..." naming a baked weight, or
// "unmeasurable: fence: ..." naming a weight nothing can measure. Leaves `cell` bound to
// `weights`.
Result<FenceReport> RunFenceProof(ArmedCell& cell, const Interpreter& eager,
                                  const WeightMap& weights, const NumericsThresholds& t,
                                  const CellArtifacts& artifacts, const Samples& samples = {},
                                  const FenceOptions& options = {});

// The strict proof: what a mint runs before it seals a cell, and what a worker runs again on its
// live target before it arms a child's cell (law 5: only HEALTHY ships). The gate (RunGate),
// HEALTHY or refused, then the fence proof (RunFenceProof) unless `fence` is off. Refusals carry
// their token: `unmeasurable` (an entry nothing measured, or a weight nothing measures),
// `numerics_refused` (an entry DEGRADED or DESTROYED; the message is the gate's summary), or the
// fence's `fence_refused`; an error of a run itself is returned as it is. Leaves `cell` bound to
// `weights`.
struct StrictProof {
  GateReport gate;
  FenceReport fence;  // empty when the fence was not asked for
};
struct StrictProofOptions {
  bool fence = true;
  // Called once the gate has run, before its verdict is judged, with its report (or its error)
  // and its time: where a caller marks a stage or writes a row.
  std::function<void(const Result<GateReport>& gate, double ms)> on_gate;
};
Result<StrictProof> ProveStrict(ArmedCell& cell, const Interpreter& eager, const WeightMap& weights,
                                const NumericsThresholds& t, const CellArtifacts& artifacts,
                                const Samples& samples = {},
                                const StrictProofOptions& options = {});

}  // namespace kiln
