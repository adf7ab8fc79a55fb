// The cell key: `ck1-` + 56 hex of SHA-256 over canonical JSON {graph, envelope, sm, toolchain}
// (docs/design.md §5). Cell layer, on graph and identity only: no compiler, no interpreter.
// Derived without compiling (DeriveKeyAxes): graph digest × envelope × sm × toolchain. One
// function (KeyFromAxes) makes every key, at mint and at every restatement (hub publish, worker
// adopt; metadata.h RestateKey), so a key can only ever be restated the way it was minted.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "src/kiln/base/sm_levels.h"
#include "src/kiln/base/status.h"
#include "src/kiln/graph/ir.h"
#include "src/kiln/graph/shape_class.h"
#include "src/kiln/tensor/tensor.h"

namespace kiln {

// Canonical facts of an envelope: classes sorted, each as {input: [dims]}. Refuses an empty
// envelope, an empty class, negative dims and duplicate classes by name.
Result<nlohmann::json> EnvelopeFacts(const Envelope& envelope);
Result<Envelope> EnvelopeFromFacts(const nlohmann::json& facts);
// One ranged entry as the facts write it: {"inputs":{name:[dim or "symbol"]},"ranges":{s:[lo,hi]}},
// and back (shape only; CheckRangedEntry validates).
nlohmann::json RangedToJson(const RangedEntry& entry);
Result<RangedEntry> RangedFromJson(const nlohmann::json& j);

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
// The axes of `graph`'s key for `envelope` on this machine, without compiling: the graph digest,
// the envelope's facts digest, `sm` ("" = DefaultSmTarget()) and the local toolchain's digest.
// The mint, the worker's boot and its mint driver all call this one function (law 3).
Result<KeyAxes> DeriveKeyAxes(const Graph& graph, const Envelope& envelope, const std::string& sm);
// True for "ck1-" + 56 lowercase hex.
bool IsWellFormedKey(const std::string& key);

}  // namespace kiln
