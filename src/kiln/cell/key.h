// The cell key: `ck1-` + 56 hex of SHA-256 over canonical JSON {graph, envelope, sm, toolchain}
// (docs/design.md §5). Cell layer. Derived without compiling: graph digest × envelope × sm ×
// toolchain. One function (KeyFromAxes) makes every key, at mint and at every restatement
// (hub publish, worker adopt), so a key can only ever be restated the way it was minted.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "src/kiln/base/status.h"
#include "src/kiln/base/sm_levels.h"
#include "src/kiln/graph/shape_class.h"
#include "src/kiln/tensor/tensor.h"

namespace kiln {


// Canonical facts of an envelope: classes sorted, each as {input: [dims]}. Refuses an empty
// envelope, an empty class, negative dims and duplicate classes by name.
Result<nlohmann::json> EnvelopeFacts(const Envelope& envelope);
Result<Envelope> EnvelopeFromFacts(const nlohmann::json& facts);

// The four axes, each a 16-hex facts digest except `sm` (a published level string).
struct KeyAxes {
  std::string graph;      // GraphDigest
  std::string envelope;   // FactsDigest(EnvelopeFacts)
  std::string sm;         // e.g. "x86-64-v3"
  std::string toolchain;  // FactsDigest(toolchain block)
};

// "ck1-<56 hex>". Refuses axes that are not 16 lowercase hex (graph, envelope, toolchain) or an
// sm that is not a known level, naming the axis and its value.
Result<std::string> KeyFromAxes(const KeyAxes& axes);
// True for "ck1-" + 56 lowercase hex.
bool IsWellFormedKey(const std::string& key);


}  // namespace kiln
