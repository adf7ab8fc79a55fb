// The graph digest: the `graph` axis of a cell key (docs/design.md §5). Graph layer.
//
// A node-level canonical digest that identifies the computation and never reads a weight value.
// Each value gets a Merkle-style identity:
//   graph input      -> its name, dtype and shape (I/O names are part of the signature)
//   weight           -> its name, dtype and shape (weights bind by name; values never read)
//   structural const -> its dtype, shape and a hash of its bytes (its value is the graph's)
//   node output k    -> hash(op type, domain, opset, attributes (floats by exact bits), the
//                       identities of its inputs, k)
// so renaming nodes or intermediate values and reordering independent nodes change nothing,
// while changing an op, an attribute, an edge, a weight's name/dtype/shape, a graph input or
// output, or a structural constant changes the digest. Subgraphs are hashed recursively with
// outer-scope references resolved to the outer identities.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "src/kiln/base/status.h"
#include "src/kiln/graph/ir.h"

namespace kiln {

// The canonical facts the digest is computed over (for debugging and `kiln info --facts`).
Result<nlohmann::json> GraphFacts(const Graph& graph);
// First 16 hex of SHA-256 over the canonical JSON of GraphFacts.
Result<std::string> GraphDigest(const Graph& graph);

}  // namespace kiln
