// Admission: every check a cell's bytes must pass before anything of it is loaded (cell layer).
//
// docs/design.md §2 law 3 (restate the key from the cell's own metadata, with the function that
// minted it) and law 4 (digest, size, declared axes — all before dlopen). Two steps:
//   AdmitBytes    what holds on any machine: the bytes, the archive, the metadata, the key
//                 restatement, the recorded fence proof, a plausible shared object and a source.
//                 The hub runs exactly this at publish, so a cell it signs is one no worker
//                 refuses for its bytes, and both sides report the same tokens.
//   CheckMachine  what holds only here: the cell's sm runs on this machine and its toolchain
//                 equals this machine's.
// AdmitCell runs both; the worker calls it at adopt (after the receipt or local-store provenance
// check, before the loader). Nothing here loads or executes any part of the cell; the loader runs
// only on an AdmittedCell.
//
// Checks, in order; the first failure is returned with its token (Status::token(), also the
// first word of its message):
//   AdmitBytes
//   size_mismatch          Corruption       the byte count differs from the expected size
//   digest_mismatch        Corruption       CellDigest(bytes) differs from the expected digest
//   cell_corrupt           Corruption       the tar does not unpack (pack.h refusals)
//   metadata_invalid       InvalidArgument  metadata.json does not parse (metadata.h)
//   key_mismatch           InvalidArgument  the metadata does not restate to its key, or the key
//                                           is not the one expected
//   fence_unproven         InvalidArgument  the metadata does not record a passed fence proof
//                                           (law 2): checkpoint_free,
//                                           perturbed_checkpoint_matched and
//                                           constant_table_complete must all be true
//   shared_object_invalid  InvalidArgument  cell.so is empty, over the size bound, or not an ELF
//                                           file
//   source_missing         InvalidArgument  source/cell.cc is empty: nothing to check the
//                                           shared object against
//   CheckMachine
//   sm_mismatch            InvalidArgument  the cell's sm level is above what this machine runs
//   toolchain_mismatch     InvalidArgument  the cell's toolchain block differs from this machine's
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
inline constexpr const char* kRefusalSharedObjectInvalid = "shared_object_invalid";
inline constexpr const char* kRefusalSourceMissing = "source_missing";

// The largest cell.so AdmitBytes accepts unless told otherwise. kiln's own cells are a few MiB
// (the weights are never inside); the bound keeps a hostile publisher from having the hub store
// and sign, and every worker fetch, a huge object.
inline constexpr uint64_t kDefaultMaxSharedObjectBytes = 256ull << 20;

// What any machine requires of a cell's bytes.
struct BytesPolicy {
  std::string expected_key;  // the key derived here (or named in a publish); required
  uint64_t max_shared_object_bytes = kDefaultMaxSharedObjectBytes;
};

// What this machine will accept.
struct AdmissionPolicy {
  std::string expected_key;  // the key derived here (or named in a publish); required
  // The highest level this machine executes, e.g. "x86-64-v4"; one of KnownSmLevels().
  std::string local_sm;
  nlohmann::json local_toolchain;  // this machine's toolchain block (identity/toolchain.h)
  uint64_t max_shared_object_bytes = kDefaultMaxSharedObjectBytes;
};

// A cell that passed every check. The files are copies of the admitted bytes: load these, never
// re-read the archive from disk (a second read could see other bytes).
struct AdmittedCell {
  CellMetadata metadata;
  CellFiles files;
  std::string digest;  // CellDigest of the admitted bytes, always computed
};

// A cell admitted where its bytes lie (the hub's blob store at publish): the checks of AdmitBytes
// with the same tokens, over an archive read in pieces, so that no more than its metadata and a
// buffer is ever in memory whatever the cell's size. Where each member lies, and the digests of
// the two large ones (as receipts state them), are returned for a reader that needs their bytes.
struct AdmittedLayout {
  CellMetadata metadata;
  std::string digest;         // CellDigest of the admitted bytes
  CellLayout layout;          // where each member lies in the archive
  std::string so_digest;      // "sha256:<hex>" of cell.so
  std::string source_digest;  // "sha256:<hex>" of source/cell.cc
};

// AdmitBytes on an archive of `total` bytes read through `read_at`. A failure to read is passed
// on as it is (not a refusal of the cell).
Result<AdmittedLayout> AdmitArchive(const ArchiveReader& read_at, uint64_t total,
                                    const std::string& expected_digest, uint64_t expected_size,
                                    const BytesPolicy& policy);

// The policy of this machine for `expected_key`: the sm level it executes (DetectSmLevel) and
// its toolchain block (LocalToolchain). Fails only when no toolchain can be named here (no
// compiler found); a worker then cannot judge a cell's toolchain and adopts nothing.
Result<AdmissionPolicy> LocalAdmissionPolicy(const std::string& expected_key);

// The machine-independent checks above on `tar_bytes`. `expected_digest` ("sha256:<hex>") is
// skipped when empty; `expected_size` is skipped when 0. Pure function of its arguments; any
// thread.
Result<AdmittedCell> AdmitBytes(std::string_view tar_bytes, const std::string& expected_digest,
                                uint64_t expected_size, const BytesPolicy& policy);

// The checks that depend on this machine (sm, toolchain) on metadata AdmitBytes accepted.
Status CheckMachine(const CellMetadata& metadata, const std::string& local_sm,
                    const nlohmann::json& local_toolchain);

// AdmitBytes, then CheckMachine: everything before a load.
Result<AdmittedCell> AdmitCell(std::string_view tar_bytes, const std::string& expected_digest,
                               uint64_t expected_size, const AdmissionPolicy& policy);

}  // namespace kiln
