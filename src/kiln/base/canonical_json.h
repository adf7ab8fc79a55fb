// Canonical JSON and facts digests (base layer): how kiln turns structured facts into key bytes.
//
// Cell keys, graph/envelope/toolchain digests and cell metadata are hashed over canonical JSON, so
// equal facts must give equal bytes on every machine and every build (docs/design.md §5):
//   - object keys sorted by their UTF-8 bytes (equivalently by code point), no duplicates;
//   - no insignificant whitespace;
//   - strings UTF-8, emitted as-is except the escapes JSON requires (", \, control characters);
//   - integers as plain decimal integers.
// Floating-point numbers are refused: their text form is not portable enough to hash. Facts that
// are floats (an attribute value) are recorded as exact bits in an integer or a string by the
// caller. So canonical JSON holds only null, bools, integers, strings, arrays and objects.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "src/kiln/base/status.h"

namespace kiln {

// The canonical text of `value`. InvalidArgument naming the JSON path ("$.entries[2].scale") if
// it holds a float, a binary value or invalid UTF-8, or nests deeper than 256 levels.
Result<std::string> CanonicalJson(const nlohmann::json& value);

// The first 16 lowercase hex characters of SHA-256(CanonicalJson(value)): the digest of one axis
// of a cell key. Fails exactly when CanonicalJson fails.
Result<std::string> FactsDigest(const nlohmann::json& value);

// Parses JSON text without throwing. `what` names the source in errors ("cell metadata.json",
// "safetensors header of 'w.safetensors'"). InvalidArgument on a syntax error (naming the byte
// offset and what the parser expected) and on a duplicate key in any object: a generic JSON parser
// silently keeps one of the duplicates, which would let two readers see different facts.
Result<nlohmann::json> ParseJson(std::string_view text, const std::string& what);

}  // namespace kiln
