// Admission: every check a cell's bytes must pass before anything of it is loaded (cell layer).
//
// docs/design.md §2 law 3 (restate the key from the cell's own metadata, with the function that
// minted it) and law 4 (digest, size, declared axes — all before dlopen). The hub runs this at
// publish, the worker at adopt (after the receipt or local-store provenance check, before the
// loader). Nothing here loads or executes any part of the cell; the loader runs only on an
// AdmittedCell.
//
// Checks, in order; the first failure is returned with its token (Status::token(), also the
// first word of its message):
//   size_mismatch       Corruption       the byte count differs from the expected size
//   digest_mismatch     Corruption       CellDigest(bytes) differs from the expected digest
//   cell_corrupt        Corruption       the tar does not unpack (pack.h refusals)
//   metadata_invalid    InvalidArgument  metadata.json does not parse (metadata.h)
//   key_mismatch        InvalidArgument  the metadata does not restate to its key, or the key is
//                                        not the one expected
//   sm_mismatch         InvalidArgument  the cell's sm level is above what this machine runs
//   toolchain_mismatch  InvalidArgument  the cell's toolchain block differs from this machine's
//   fence_unproven      InvalidArgument  the metadata does not record a passed fence proof (law 2):
//                                        checkpoint_free, perturbed_checkpoint_matched and
//                                        constant_table_complete must all be true
// e.g. "toolchain_mismatch: field 'compiler' is 'g++ 12.2' in the cell, 'g++ 13.1' here".
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "src/kiln/base/status.h"
#include "src/kiln/cell/metadata.h"
#include "src/kiln/cell/pack.h"

namespace kiln {

// Refusal tokens: the stable first word of an admission refusal, used on the wire and as the
// `phase` of a boot_adopt event.
inline constexpr const char* kRefusalSizeMismatch = "size_mismatch";
inline constexpr const char* kRefusalDigestMismatch = "digest_mismatch";
inline constexpr const char* kRefusalCellCorrupt = "cell_corrupt";
inline constexpr const char* kRefusalMetadataInvalid = "metadata_invalid";
inline constexpr const char* kRefusalKeyMismatch = "key_mismatch";
inline constexpr const char* kRefusalSmMismatch = "sm_mismatch";
inline constexpr const char* kRefusalToolchainMismatch = "toolchain_mismatch";
inline constexpr const char* kRefusalFenceUnproven = "fence_unproven";

// What this machine will accept.
struct AdmissionPolicy {
  std::string expected_key;  // the key derived here (or named in a publish); required
  // The highest level this machine executes, e.g. "x86-64-v4"; one of KnownSmLevels().
  std::string local_sm;
  nlohmann::json local_toolchain;  // this machine's toolchain block (compile/toolchain.h)
};

// A cell that passed every check. The files are copies of the admitted bytes: load these, never
// re-read the archive from disk (a second read could see other bytes).
struct AdmittedCell {
  CellMetadata metadata;
  CellFiles files;
  std::string digest;  // CellDigest of the admitted bytes, always computed
};

// Runs the checks above on `tar_bytes`. `expected_digest` ("sha256:<hex>") is skipped when
// empty; `expected_size` is skipped when 0. Pure function of its arguments; any thread.
Result<AdmittedCell> AdmitCell(std::string_view tar_bytes, const std::string& expected_digest,
                               uint64_t expected_size, const AdmissionPolicy& policy);

}  // namespace kiln
