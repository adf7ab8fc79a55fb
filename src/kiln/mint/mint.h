// Minting: build a cell on this machine, prove it, seal it (mint layer, above arm/ and compile/:
// it drives the compiler, then loads and proves through the arm layer; docs/design.md §4 Mint).
//
// Stages, each timed: key (derived without compiling) -> compile (passes per class) -> build
// (entries compiled as parallel compiler processes, linked) -> load -> gate (strict: only
// HEALTHY ships) -> fence (perturbed checkpoint + complete constant table) -> seal (metadata,
// deterministic tar, digest). Law 6: the .so bytes packed are the very bytes that were loaded
// and proven; nothing is rebuilt between proof and seal. Law 15: one key with one toolchain gives
// byte-identical cells.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "src/kiln/arm/gate.h"
#include "src/kiln/base/status.h"
#include "src/kiln/cell/metadata.h"
#include "src/kiln/cell/store.h"
#include "src/kiln/compile/pipeline.h"

namespace kiln {

// The stages of a mint, in order: key, compile, build, load, gate, fence, seal. The one list: the
// progress callback, the child's frames and `kiln mint`'s progress line count from it.
const std::vector<std::string>& MintStages();

struct MintRequest {
  std::shared_ptr<const Graph> graph;
  Envelope envelope;
  std::string family;  // e.g. "root/micro-diffusion"
  WeightMap weights;   // the checkpoint the proof runs with
  // Inputs the target declares as samples (or `kiln run --compile` was given): the gate and the
  // fence probe each on the entry it fits, beside the synthetic probes.
  Samples samples;
  NumericsThresholds thresholds;
  std::string sm;  // "" = DefaultSmTarget()
  CompileOptions compile;
  std::string work_dir;  // "" = a fresh temp dir, removed afterwards
  int num_threads = 1;
  // Called as each stage of MintStages() starts.
  std::function<void(const std::string& stage)> on_stage;
  // Intake lane (law 12): compiled, loaded, gated and fenced like any cell, but never keyed or
  // sealed: the result carries the proven .so bytes (`shared_object`) and no key, digest or tar.
  bool intake = false;
};

struct StageTime {
  std::string stage;
  double ms = 0;
};

struct MintResult {
  std::string key;
  KeyAxes axes;
  std::string digest;         // sha256:...
  std::string ref;            // key@digest
  std::string tar;            // the sealed bytes ("" for an intake mint)
  std::string shared_object;  // intake only: the proven .so bytes
  CellMetadata metadata;
  GateReport gate;
  FenceReport fence;
  std::vector<StageTime> stages;
  std::vector<PassTiming> passes;
  // The request's envelope class each entry was compiled from, in entry order (the others are
  // metadata.gaps, or for an intake mint simply absent).
  std::vector<size_t> entry_classes;
  // MintAndStore: whether the local store kept the cell. Never when passes were disabled
  // (compile/pipeline.h DisabledPasses): such a cell is for bisecting, not the cell its key
  // names.
  bool stored = false;
};

// A cell's entries as its own describe JSON reports them (kiln_cell_describe), with the shape
// classes of `envelope` in entry order (the classes the entries were compiled from, which for a
// partially covered cell are fewer than the target declares), then its ranged entries, each with
// the piece it describes (its inputs' dims and its ranges), which must be envelope.ranged's in
// order when that is given. InvalidArgument when the counts or the pieces differ.
Result<std::vector<EntryMetadata>> EntriesFromDescribe(const nlohmann::json& describe,
                                                       const Envelope& envelope);

// Reads sample inputs: one map per sample, input name -> .npy path. Errors name the file.
Result<Samples> ReadSamples(const std::vector<std::map<std::string, std::string>>& paths);

// Mints. A gate or fence refusal is InvalidArgument with its refusal token (`numerics_refused`,
// `fence_refused`, `unmeasurable`; gate.h) and names the worst entry.
Result<MintResult> MintCell(const MintRequest& request);

// Mints and, only if the mint succeeded and no pass was disabled, stores the sealed bytes in
// `store` (a refused cell leaves nothing behind).
Result<MintResult> MintAndStore(const MintRequest& request, LocalStore& store);

// `kiln run --compile` and benchmarks: the cell for (graph, envelope) from the local store, or
// minted and stored on a miss; admitted (law 4) and armed with `weights`. With passes disabled
// the store is neither read nor written: the cell is minted (gate and fence as always) and
// loaded from the bytes just proven.
struct LocalCell {
  std::unique_ptr<ArmedCell> cell;
  std::string ref;
  bool store_hit = false;
  double ms = 0;  // lookup (+ mint) + admission + load
};
Result<LocalCell> CompileThroughStore(const MintRequest& request, LocalStore& store,
                                      const std::string& private_dir);

}  // namespace kiln
