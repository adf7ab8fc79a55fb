// UTF-8 validation and a printable rendering of arbitrary bytes for error messages (base layer).
// Names that reach JSON (events, metadata, KServe answers, digests) must be valid UTF-8:
// nlohmann::json refuses to dump anything else, and no exception may leave a library.
#pragma once

#include <string>
#include <string_view>

namespace kiln {

// True for well-formed UTF-8 (RFC 3629): no overlong forms, no surrogates, nothing above
// U+10FFFF, no truncated sequence.
bool IsValidUtf8(std::string_view s);

// `s` with every byte that is not printable ASCII written as \xNN, so a message can quote a
// value exactly without carrying invalid UTF-8 itself.
std::string EscapeBytes(std::string_view s);

}  // namespace kiln
