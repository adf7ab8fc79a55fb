// The hub builder's child process (hub layer, library `kiln_rebuild_child`, linked by the `kiln`
// binary only; see rebuild_child.cc for why it is not in the hub's library).
#pragma once

#include <string>

namespace kiln {

// The child's side: reads DIR/metadata.json and DIR/cell.cc, writes DIR/out/cell.so and
// DIR/report.json. Exit codes (builder.h): kRebuildChildBuilt, kRebuildChildRefused (the token
// is in the report), kRebuildChildBadRequest.
int RunRebuildChild(const std::string& dir);

}  // namespace kiln
