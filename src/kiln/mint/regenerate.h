// Regenerating a cell's source and rebuilding its shared object (mint layer, library `kiln_mint`:
// it drives the code generator and the system compiler; used by the worker's boot and the hub
// builder's child). What the checks mean and the refusal tokens they return are in
// cell/provenance.h.
#pragma once

#include <string>

#include "src/kiln/base/status.h"
#include "src/kiln/cell/metadata.h"
#include "src/kiln/cell/provenance.h"
#include "src/kiln/compile/driver.h"
#include "src/kiln/graph/ir.h"

namespace kiln {

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
// the intermediate files. The source must first pass CheckRebuildSource. Returns the shared
// object's bytes, or rebuild_failed whose message names at most a line of the source (never the
// compiler's words, which can quote any file it read), or include_refused.
// What a published source may bring into its build, checked before anything compiles: the
// directives as written (CheckSourceDirectives), then each entry's preprocessed view
// (CheckPreprocessed against the toolchain's own header directories). include_refused naming a
// line or a path, never a file's bytes. Writes `work_dir`/cell.cc.
Status CheckRebuildSource(const std::string& source, const CellMetadata& metadata,
                          CompilerDriver& driver, const std::string& work_dir);

Result<std::string> RebuildSharedObject(const std::string& source, const CellMetadata& metadata,
                                        const std::string& work_dir, int parallel_compiles = 2);

}  // namespace kiln
