// ONNX import: ModelProto bytes -> kiln Graph (graph layer, first stage of every pipeline).
//
// What the importer guarantees to the rest of kiln:
// - nodes come out in topological order (files that are not sorted are sorted; a cycle is an
//   error naming a node on it);
// - every Constant node is lifted into Graph::initializers under its output name, so float
//   constants become weights bound by name (some exporters keep all weights that way) and
//   int/bool constants become structural constants;
// - subgraphs (If branches, Loop bodies) bind no tensors themselves: their initializers and
//   Constants are hoisted into the top-level graph, which they read as outer-scope values (a
//   name reused by sibling subgraphs is renamed); a node that owns a subgraph is ordered after
//   every value the subgraph reads;
// - graph inputs that also have an initializer are treated as initializers (older exporters list
//   weights as inputs);
// - external data is read relative to the model's directory, never outside it;
// - legacy opset forms are kept as written: each op reads its form by opset.
// Every error names the file and the object (tensor, node, attribute) and what was expected.
#pragma once

#include <string>
#include <string_view>

#include "src/kiln/base/status.h"
#include "src/kiln/graph/ir.h"

namespace kiln {

struct ImportOptions {
  // Directory that external-data locations are relative to; ImportOnnxFile sets the model's.
  std::string base_dir;
};

Result<Graph> ImportOnnxFile(const std::string& path);
// `what` names the source in errors (a path, "<fuzz input>").
Result<Graph> ImportOnnxBytes(std::string_view bytes, const std::string& what,
                              const ImportOptions& options = {});

}  // namespace kiln
