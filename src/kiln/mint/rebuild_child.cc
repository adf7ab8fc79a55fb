// The hub builder's child (mint layer): the process the sandboxed builder (hub/builder.h) starts
// as `kiln rebuild --child DIR`. It runs the code generator's compiler path (regenerate.h), so it
// lives with the mint, linked into the `kiln` binary and never into the hub's server library: the
// hub signs what this child built without linking a compiler, an interpreter or a kernel library
// itself. The exit codes it shares with the builder are in cell/provenance.h.
#include "src/kiln/mint/rebuild_child.h"

#include <algorithm>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "src/kiln/base/file.h"
#include "src/kiln/cell/metadata.h"
#include "src/kiln/cell/provenance.h"
#include "src/kiln/mint/regenerate.h"

namespace kiln {
namespace {

void WriteReport(const std::string& dir, const std::string& status, const std::string& token,
                 const std::string& message) {
  nlohmann::json r{{"status", status}, {"token", token}, {"message", message}};
  WriteFileAtomic(dir + "/report.json", r.dump(), Durability::kScratch).IgnoreError();
}

}  // namespace

int RunRebuildChild(const std::string& dir) {
  auto metadata_text = ReadFile(dir + "/metadata.json");
  auto source = ReadFile(dir + "/cell.cc");
  if (!metadata_text.ok() || !source.ok()) {
    WriteReport(dir, "bad_request", "", "metadata.json or cell.cc missing in " + dir);
    return kRebuildChildBadRequest;
  }
  auto metadata = ParseMetadata(*metadata_text, dir + "/metadata.json");
  if (!metadata.ok()) {
    WriteReport(dir, "bad_request", "", metadata.status().ToString());
    return kRebuildChildBadRequest;
  }
  int parallel = 2;
  if (const char* p = std::getenv("KILN_REBUILD_PARALLEL")) parallel = std::max(1, std::atoi(p));
  auto so = RebuildSharedObject(*source, *metadata, dir + "/build", parallel);
  if (!so.ok()) {
    WriteReport(dir, "refused", so.status().token(), so.status().message());
    return kRebuildChildRefused;
  }
  Status wrote = WriteFileAtomic(dir + "/out/cell.so", *so, Durability::kScratch);
  if (!wrote.ok()) {
    WriteReport(dir, "refused", kRefusalRebuildFailed, wrote.ToString());
    return kRebuildChildRefused;
  }
  WriteReport(dir, "built", "", "");
  return kRebuildChildBuilt;
}

}  // namespace kiln
