// The compiler's differential fuzzer: random graphs run eager and compiled, differences shrunk
// to minimal reproducers (fuzz/graphs, above the mint layer: it drives the compiler, the
// system compiler and the loader like a mint, without sealing; docs/reliability.md).
//
// A batch of graphs is compiled into ONE cell: every graph's names get a prefix of their own and
// the graphs become one (disconnected) graph, so the C++ compile is paid once per batch, not per
// graph. Each graph is run eagerly on its own, the cell once per thread count, and each graph's
// outputs are scored by the strict gate's own comparison (cell/gate.h CompareOutputs: cos,
// retention, NaN/Inf positions exactly). Anything but HEALTHY is a difference; so is a graph eager
// runs that the compiler refuses or the cell fails to run.
#pragma once

#include <string>
#include <vector>

#include "fuzz/graphs/graph_gen.h"
#include "src/kiln/arm/gate.h"

namespace kiln::graph_fuzz {

enum class Outcome {
  kMatch,           // HEALTHY on every thread count
  kInvalid,         // eager refused the graph: the generator made something invalid
  kCompileRefused,  // eager ran it, the compiler refused it
  kRunFailed,       // the cell was built but failed to run it (or to build, load or bind)
  kDiffers,         // the cell ran it and the gate did not call it HEALTHY
};
const char* OutcomeName(Outcome o);
inline bool IsDifference(Outcome o) { return o != Outcome::kMatch && o != Outcome::kInvalid; }

struct CaseResult {
  Outcome outcome = Outcome::kMatch;
  std::string note;  // what differed, or the refusal
};

struct DiffOptions {
  std::vector<std::string> disabled_passes;  // bisecting: passes to skip (compile/pipeline.h)
  NumericsThresholds thresholds;             // the strict gate's defaults
  std::vector<int> threads = {1, 2};         // the cell is armed and run with each
  std::string work_dir = "/tmp";             // scratch for the C++ builds (removed after)
};

struct BatchStats {
  int cells = 0;  // cells built (one per batch unless a batch had to be split)
  int nodes = 0;  // nodes compiled, subgraphs included
  double eager_ms = 0, passes_ms = 0, build_ms = 0, run_ms = 0;
};

// One result per graph, in order.
std::vector<CaseResult> RunBatch(const std::vector<FuzzGraph>& graphs, const DiffOptions& options,
                                 BatchStats* stats);

// The smallest graph reachable from `failing` by deleting nodes (a node replaced by graph inputs
// holding what eager computed for its outputs, or bypassed by one of its inputs of the same
// type), dropping graph outputs and making non-finite inputs finite, while it still differs.
// Each round compiles its candidates into one cell. Stops after `budget_s` seconds.
FuzzGraph Shrink(const FuzzGraph& failing, const DiffOptions& options, double budget_s,
                 int* rounds);

// Ranged mode: the same graph compiled once for a range of some of its dims and run at every
// value of the range. The first input with dim axes[0] (0: the batch; 1: a sequence or channels;
// 2,3: an image's sides) gives its size v; every dim among `axes` of every input whose size is v
// is symbol `n` over [v, v + span - 1] (v = 1 makes two pieces, 1 and the rest), so "2,3" ranges
// a square image's side and its plane is n*n. Inputs at n = m repeat the generated slices along
// each such dim cyclically (slice r is slice r % v), so indices and non-finite values keep their
// domain. Eager at
// every point is the oracle: a graph eager cannot run at some point (a Reshape to a fixed size) is
// kInvalid, and a piece the compiler refuses over the range is a gap, kCompileRefused with the
// refusal (a gap is served eager: not a bug). A compiled point whose answer is not HEALTHY under
// the strict gate is kDiffers.
struct RangedStats {
  int graphs = 0, points = 0, gaps = 0, compiled = 0;
  double build_ms = 0, run_ms = 0;
};
CaseResult RunRanged(const FuzzGraph& graph, const DiffOptions& options, int64_t span,
                     const std::vector<int64_t>& axes, RangedStats* stats);

// Nodes of a model, subgraphs included.
int CountNodes(const onnx::GraphProto& g);

// A reproducer directory: model.onnx, inputs/<name>.npy, kiln.toml (a target whose envelope is
// the inputs' shapes and whose sample is the inputs, so `kiln mint --manifest` probes them) and
// README.txt (`note`).
Status SaveCase(const FuzzGraph& g, const std::string& dir, const std::string& note);
Result<FuzzGraph> LoadCase(const std::string& dir);

}  // namespace kiln::graph_fuzz
