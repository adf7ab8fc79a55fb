// Code provenance: a cell is the code its graph implies (cell layer, in `kiln_mint` because it
// drives the code generator and the compiler; docs/trust.md).
//
// kiln's code generator is deterministic and its builds are byte-reproducible (law 15), so a
// cell's two members can each be checked without trusting whoever published them:
//   - source/cell.cc is what this machine's code generator makes from the adopter's own graph and
//     the cell's envelope. CheckSourceProvenance regenerates it (milliseconds, no compiler) and
//     compares bytes: `source_mismatch` otherwise.
//   - cell.so is what the pinned toolchain builds from that source. RebuildSharedObject compiles
//     the source exactly as a mint does (same flags, -march=<sm>, -frandom-seed=<key>, one
//     compiler process per entry, one link) and CompareRebuild checks byte equality:
//     `rebuild_mismatch` otherwise. The hub (docs/hub-api.md "Builder") runs the build in a
//     sandbox before it signs, and states source_digest, so_digest and itself as the builder in
//     the receipt.
// Together: an adopter that checked the source, and trusts the builder that rebuilt the .so from
// it, runs only code its own code generator would have produced.
//
// Refusal tokens (Status::token()):
//   source_mismatch      the source is not what this machine generates for the graph and envelope
//   rebuild_unavailable  this machine's toolchain is not the one the cell names (the field is
//                        named), so it cannot rebuild it
//   rebuild_failed       the compiler refused the source or did not run
//   rebuild_mismatch     the rebuilt shared object differs from the published one
#pragma once

#include <string>

#include "src/kiln/base/status.h"
#include "src/kiln/cell/metadata.h"
#include "src/kiln/cell/pack.h"
#include "src/kiln/graph/ir.h"

namespace kiln {

inline constexpr const char* kRefusalSourceMismatch = "source_mismatch";
inline constexpr const char* kRefusalRebuildUnavailable = "rebuild_unavailable";
inline constexpr const char* kRefusalRebuildFailed = "rebuild_failed";
inline constexpr const char* kRefusalRebuildMismatch = "rebuild_mismatch";

// The source this machine's code generator makes for `graph` with the cell's shape classes in its
// entry order (the order the minting machine compiled them in). No compiler runs. Fails when the
// graph does not compile for those classes, or when its digest is not the cell's graph axis.
Result<std::string> RegenerateCellSource(const Graph& graph, const CellMetadata& metadata);

// OK when `source` is byte-equal to RegenerateCellSource(graph, metadata); else
// source_mismatch naming the first line that differs (its number and both texts, shortened).
Status CheckSourceProvenance(const Graph& graph, const CellMetadata& metadata,
                             const std::string& source);

// Builds `source` as a mint built the cell described by `metadata`: this machine's toolchain,
// which must equal the metadata's toolchain block (rebuild_unavailable otherwise), -march of its
// sm, its key as the random seed, one compiler process per entry. `work_dir` must exist; it keeps
// the intermediate files. Returns the shared object's bytes, or rebuild_failed.
Result<std::string> RebuildSharedObject(const std::string& source, const CellMetadata& metadata,
                                        const std::string& work_dir, int parallel_compiles = 2);

// OK when `rebuilt` equals `published` byte for byte; else rebuild_mismatch naming both sizes,
// both digests and the first differing offset.
Status CompareRebuild(const std::string& published, const std::string& rebuilt);

}  // namespace kiln
