// The hub builder's child process (mint layer, linked by the `kiln` binary and never by the hub's
// library; see rebuild_child.cc).
#pragma once

#include <string>

namespace kiln {

// The child's side: reads DIR/metadata.json and DIR/cell.cc, writes DIR/out/cell.so and
// DIR/report.json. Exit codes (cell/provenance.h): kRebuildChildBuilt, kRebuildChildRefused (the
// token is in the report), kRebuildChildBadRequest.
int RunRebuildChild(const std::string& dir);

}  // namespace kiln
