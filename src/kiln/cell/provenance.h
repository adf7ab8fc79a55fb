// Code provenance: a cell is the code its graph implies (cell layer; docs/trust.md). This header
// is the part that needs no compiler (the refusal tokens and the byte comparison, used by the hub
// and the worker); regenerating a source and rebuilding a shared object drive the code generator
// and the compiler, and live in mint/regenerate.h (library `kiln_mint`).
//
// kiln's code generator is deterministic and its builds are byte-reproducible (law 15), so a
// cell's two members can each be checked without trusting whoever published them:
//   - source/cell.cc is what this machine's code generator makes from the adopter's own graph and
//     the cell's envelope. CheckSourceProvenance regenerates it (milliseconds, no compiler) and
//     compares bytes: `source_mismatch` otherwise.
//   - cell.so is what the pinned toolchain builds from that source. RebuildSharedObject compiles
//     the source exactly as a mint does (same flags, -march=<sm>, -frandom-seed=<key>, one
//     compiler process per entry, one link) and CompareRebuild checks byte equality:
//     `rebuild_mismatch` otherwise. The hub (docs/hub-api.md "Builder") runs the build in a
//     sandbox before it signs, and states source_digest, so_digest and itself as the builder in
//     the receipt.
// Together: an adopter that checked the source, and trusts the builder that rebuilt the .so from
// it, runs only code its own code generator would have produced.
//
// Refusal tokens (Status::token()):
//   source_mismatch      the source is not what this machine generates for the graph and envelope
//   rebuild_unavailable  this machine's toolchain is not the one the cell names (the field is
//                        named), so it cannot rebuild it
//   rebuild_failed       the compiler refused the source or did not run
//   rebuild_mismatch     the rebuilt shared object differs from the published one
//   include_refused      the source asks for a file or an assembler the builder does not allow
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "src/kiln/base/status.h"

namespace kiln {

inline constexpr const char* kRefusalSourceMismatch = "source_mismatch";
inline constexpr const char* kRefusalRebuildUnavailable = "rebuild_unavailable";
inline constexpr const char* kRefusalRebuildFailed = "rebuild_failed";
inline constexpr const char* kRefusalRebuildMismatch = "rebuild_mismatch";

// OK when `rebuilt` equals `published` byte for byte; else rebuild_mismatch naming both sizes,
// both digests and the first differing offset.
Status CompareRebuild(const std::string& published, const std::string& rebuilt);

// What a published source may bring into its build: kiln's code generator includes nothing but
// the C library's headers in angle brackets, so the hub's builder refuses anything else before a
// compiler runs (`include_refused`, naming the line of the source, never the file it asked for):
//   - #include not in the form `#include <name>` with a relative name without `..` (a quoted
//     name, an absolute path, a name computed by a macro), and #include_next, #import, #embed;
//   - `#pragma GCC dependency` and `__has_include` (they read or probe files), `_Pragma` (a pragma
//     built by a macro), and inline assembly (`asm`, which can read a file at assembly time with
//     .incbin or .include).
// Comments, string and character literals (raw ones too) are skipped; `%:` counts as `#`; a
// backslash-newline continues a line.
inline constexpr const char* kRefusalIncludeRefused = "include_refused";
Status CheckSourceDirectives(std::string_view source);

// The same policy after macro expansion, on the preprocessor's output for `source_path`: every
// file the preprocessor entered (its line markers) is the source itself or lies under one of
// `system_dirs`, and no line of the source itself holds inline assembly. include_refused naming
// the path or the line; nothing of any file's bytes.
Status CheckPreprocessed(std::string_view preprocessed, const std::string& source_path,
                         const std::vector<std::string>& system_dirs);

// A compiler's diagnostics reduced to what a publisher may be shown: the line of `source_path`
// where the first error is, never the text (a diagnostic can quote any file the compiler read).
std::string ReduceDiagnostics(std::string_view compiler_output, const std::string& source_path);

}  // namespace kiln
