// The C++ emitter: Programs (one per entry) -> one self-contained cell source (compile layer).
//
// Output is deterministic: stable order and names, shapes as constants, floats as exact hex
// literals, so one key gives byte-identical source. Layout of the generated file:
//   banner (generator, graph digest, "do not edit") · the prologue (ABI + helpers) · per entry,
//   inside `#if !defined(KILN_ENTRY) || KILN_ENTRY == i`: structural constants, reference-op
//   specs, init and run · inside `#if !defined(KILN_ENTRY) || KILN_ENTRY < 0`: the exported ABI
//   (describe, init/run/release dispatch). The driver compiles each entry as its own object, in
//   parallel processes, then links them.
// The emitter never reads a weight value. The one exception is the test-only switch
// `bake_weight_for_test`, which deliberately embeds a weight so the fence proof can be shown to
// catch it.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "src/kiln/base/status.h"
#include "src/kiln/compile/program.h"
#include "src/kiln/graph/shape_class.h"

namespace kiln {

struct EmitOptions {
  std::string graph_digest;
  // TEST ONLY: embed this weight's value (from `baked_value`) instead of binding it.
  std::string bake_weight_for_test;
  Tensor baked_value;
  // TEST ONLY: multiply every float output by this factor at the end of each entry, making a
  // deliberately wrong cell for the numerics gate to refuse. 1.0 = off.
  double test_output_scale = 1.0;
  // TEST ONLY: every entry writes through a null pointer (a real SIGSEGV in the cell's own code)
  // when its first input is float and that input's first element equals `test_segv_value`.
  // The mint's proof draws its inputs at random, so the cell passes every gate and crashes only
  // on the request a test sends. Set from KILN_TEST_CELL_SEGV (pipeline.h); off in production.
  bool test_segv = false;
  float test_segv_value = 0;
  // TEST ONLY: at its first call in a process every entry searches that process's memory and
  // environment, with the cell's own code, for the secrets of the file KILN_TEST_SECRET_SCAN names
  // at run time (base/secret_scan.h), and writes `<file>.cell.<pid>.json`: what a cell can reach
  // (docs/trust.md). Set when that variable is set at generation (pipeline.h); off in production.
  bool test_scan = false;
};

struct EmittedCell {
  std::string source;
  nlohmann::json describe;  // what kiln_cell_describe() returns
  // Filled by GenerateCell (pipeline.h): the envelope class each entry was compiled from, in
  // entry order, and the classes that did not compile (class index, the compiler's reason).
  std::vector<size_t> entry_classes;
  std::vector<std::pair<size_t, std::string>> gaps;
  // The ranged entries compiled, after the concrete ones (entry entry_classes.size() + r): the
  // declared ranged entry each is a piece of (its index among the envelope's ranged entries), and
  // the piece's own ranges.
  std::vector<std::pair<size_t, RangedEntry>> ranged_pieces;
};

// A ranged entry's code as compile/ranged_emit.h writes it, for EmitCell to number after the
// concrete entries and dispatch to through kiln_cell_entry_init_at.
struct EmittedRangedEntry {
  std::string source;  // `#if !defined(KILN_ENTRY) || KILN_ENTRY == <index>` ... `#endif`
  nlohmann::json describe;
  size_t num_symbols = 0;  // values init_at takes
  size_t num_values = 0;   // run-time constants an instance computes from them
  size_t num_constants = 0;
  uint64_t workspace_bytes = 0;
};

// Entries 0..n-1 are `entries`; ranged entry r is entry n + r and its source must say so.
Result<EmittedCell> EmitCell(const std::vector<Program>& entries, const EmitOptions& options,
                             const std::vector<EmittedRangedEntry>& ranged = {});

}  // namespace kiln
