// Admission checks before load (cell layer; see admission.h).
#include "src/kiln/cell/admission.h"

#include <algorithm>
#include <functional>
#include <optional>
#include <vector>

#include "src/kiln/base/canonical_json.h"
#include "src/kiln/base/sha256.h"
#include "src/kiln/cell/key.h"
#include "src/kiln/identity/toolchain.h"

namespace kiln {

namespace {

using Json = nlohmann::json;

Status Refuse(StatusCode code, const char* token, const std::string& msg) {
  return Status::Refused(code, token, msg);
}

// A value as a message shows it: strings bare, anything else as compact JSON.
std::string Show(const Json& v) {
  if (v.is_string()) return v.get<std::string>();
  Result<std::string> text = CanonicalJson(v);
  return text.ok() ? *text : v.dump();
}

// The dotted path of the first field (in sorted key order, depth first) where `cell` and `here`
// differ, with both values; nullopt if they are equal.
std::optional<std::string> FirstDifference(const Json& cell, const Json& here,
                                           const std::string& path) {
  if (cell.is_object() && here.is_object()) {
    // Both maps iterate in sorted order; walk the union of their keys.
    auto a = cell.begin();
    auto b = here.begin();
    while (a != cell.end() || b != here.end()) {
      if (b == here.end() || (a != cell.end() && a.key() < b.key())) {
        return "field '" + path + a.key() + "' is '" + Show(a.value()) +
               "' in the cell, absent here";
      }
      if (a == cell.end() || b.key() < a.key()) {
        return "field '" + path + b.key() + "' is absent in the cell, '" + Show(b.value()) +
               "' here";
      }
      if (auto d = FirstDifference(a.value(), b.value(), path + a.key() + ".")) return d;
      ++a;
      ++b;
    }
    return std::nullopt;
  }
  if (cell == here) return std::nullopt;
  const std::string name = path.empty() ? "toolchain block" : path.substr(0, path.size() - 1);
  return "field '" + name + "' is '" + Show(cell) + "' in the cell, '" + Show(here) + "' here";
}

}  // namespace

namespace {

// What the checks after unpacking need to know of the two large members.
struct MemberFacts {
  uint64_t shared_object_size = 0;
  std::string shared_object_head;  // its first (up to) 4 bytes
  uint64_t source_size = 0;
};

// Steps 2-4 of AdmitBytes on an unpacked (or indexed) cell whose bytes hash to `digest`.
Result<CellMetadata> CheckMembers(const std::string& metadata_json, const MemberFacts& facts,
                                  const std::string& digest, const BytesPolicy& policy) {
  // 2. Metadata: shape, then the key restated from it (law 3).
  Result<CellMetadata> metadata = ParseMetadata(metadata_json, "metadata.json");
  if (!metadata.ok()) {
    return Refuse(StatusCode::kInvalidArgument, kRefusalMetadataInvalid,
                  metadata.status().message());
  }
  Result<std::string> restated = RestateKey(*metadata);
  if (!restated.ok()) {
    return Refuse(StatusCode::kInvalidArgument, kRefusalKeyMismatch, restated.status().message());
  }
  if (*restated != policy.expected_key) {
    return Refuse(
        StatusCode::kInvalidArgument, kRefusalKeyMismatch,
        "cell restates to key '" + *restated + "', expected '" + policy.expected_key + "'");
  }

  // 3. The evidence a mint records: a mint seals only cells whose fence proof passed, so metadata
  // that says otherwise was not minted by kiln's strict path, whatever its key says.
  const FenceFlags& f = metadata->fence;
  if (!f.checkpoint_free || !f.perturbed_checkpoint_matched || !f.constant_table_complete) {
    return Refuse(StatusCode::kInvalidArgument, kRefusalFenceUnproven,
                  std::string("metadata records fence checkpoint_free=") +
                      (f.checkpoint_free ? "true" : "false") + " perturbed_checkpoint_matched=" +
                      (f.perturbed_checkpoint_matched ? "true" : "false") +
                      " constant_table_complete=" + (f.constant_table_complete ? "true" : "false") +
                      "; every flag must be true");
  }

  // 4. The members a loader and a provenance check need: a plausible shared object, a source.
  if (facts.shared_object_size == 0) {
    return Refuse(StatusCode::kInvalidArgument, kRefusalSharedObjectInvalid,
                  "cell.so of " + digest + " is 0 bytes, expected a shared object");
  }
  if (facts.shared_object_size > policy.max_shared_object_bytes) {
    return Refuse(StatusCode::kInvalidArgument, kRefusalSharedObjectInvalid,
                  "cell.so of " + digest + " is " + std::to_string(facts.shared_object_size) +
                      " bytes, over the bound of " +
                      std::to_string(policy.max_shared_object_bytes));
  }
  if (facts.shared_object_head.size() < 4 || facts.shared_object_head.compare(0, 4,
                                                                              "\x7f"
                                                                              "ELF") != 0) {
    return Refuse(StatusCode::kInvalidArgument, kRefusalSharedObjectInvalid,
                  "cell.so of " + digest + " does not start with the ELF magic \\x7fELF");
  }
  if (facts.source_size == 0) {
    return Refuse(StatusCode::kInvalidArgument, kRefusalSourceMissing,
                  "source/cell.cc of " + digest +
                      " is empty; the shared object cannot be checked against its source");
  }
  return std::move(metadata).value();
}

// Streams `span` of the archive to `sink` in pieces of at most `chunk` bytes.
Status ReadSpan(const ArchiveReader& read_at, const MemberSpan& span, std::vector<char>& buf,
                const std::function<void(std::string_view)>& sink) {
  for (uint64_t done = 0; done < span.size;) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(buf.size(), span.size - done));
    KILN_ASSIGN_OR_RETURN(size_t n, read_at(span.offset + done, buf.data(), want));
    if (n == 0) {
      return Status::IOError("the archive ended at offset " + std::to_string(span.offset + done) +
                             " inside a member");
    }
    sink(std::string_view(buf.data(), n));
    done += n;
  }
  return Status::OK();
}

}  // namespace

Result<AdmittedCell> AdmitBytes(std::string_view tar_bytes, const std::string& expected_digest,
                                uint64_t expected_size, const BytesPolicy& policy) {
  // 1. Bytes: size, then digest, then the archive itself.
  if (expected_size != 0 && tar_bytes.size() != expected_size) {
    return Refuse(StatusCode::kCorruption, kRefusalSizeMismatch,
                  "cell is " + std::to_string(tar_bytes.size()) + " bytes, expected " +
                      std::to_string(expected_size));
  }
  AdmittedCell out;
  out.digest = CellDigest(tar_bytes);
  if (!expected_digest.empty() && out.digest != expected_digest) {
    return Refuse(StatusCode::kCorruption, kRefusalDigestMismatch,
                  "cell bytes hash to " + out.digest + ", expected " + expected_digest);
  }
  Result<CellFiles> files = UnpackCell(tar_bytes, "cell " + out.digest);
  if (!files.ok()) {
    return Refuse(StatusCode::kCorruption, kRefusalCellCorrupt, files.status().message());
  }
  out.files = std::move(*files);
  const MemberFacts facts{out.files.shared_object.size(), out.files.shared_object.substr(0, 4),
                          out.files.source.size()};
  KILN_ASSIGN_OR_RETURN(out.metadata,
                        CheckMembers(out.files.metadata_json, facts, out.digest, policy));
  return out;
}

Result<AdmittedLayout> AdmitArchive(const ArchiveReader& read_at, uint64_t total,
                                    const std::string& expected_digest, uint64_t expected_size,
                                    const BytesPolicy& policy) {
  // 1. Bytes: size, then the digest over one streamed pass, then the archive's headers.
  if (expected_size != 0 && total != expected_size) {
    return Refuse(
        StatusCode::kCorruption, kRefusalSizeMismatch,
        "cell is " + std::to_string(total) + " bytes, expected " + std::to_string(expected_size));
  }
  std::vector<char> buf(1 << 20);
  AdmittedLayout out;
  {
    Sha256 whole;
    KILN_RETURN_IF_ERROR(ReadSpan(read_at, MemberSpan{0, total}, buf,
                                  [&](std::string_view piece) { whole.Update(piece); }));
    out.digest = "sha256:" + whole.FinalHex();
  }
  if (!expected_digest.empty() && out.digest != expected_digest) {
    return Refuse(StatusCode::kCorruption, kRefusalDigestMismatch,
                  "cell bytes hash to " + out.digest + ", expected " + expected_digest);
  }
  Result<CellLayout> layout = IndexCell(read_at, total, "cell " + out.digest);
  if (!layout.ok()) {
    if (layout.status().code() != StatusCode::kCorruption) return layout.status();
    return Refuse(StatusCode::kCorruption, kRefusalCellCorrupt, layout.status().message());
  }
  out.layout = *layout;
  // The members: the metadata kept, the two large ones hashed as they stream past.
  std::string metadata_json;
  KILN_RETURN_IF_ERROR(ReadSpan(read_at, out.layout.metadata, buf,
                                [&](std::string_view piece) { metadata_json.append(piece); }));
  MemberFacts facts{out.layout.shared_object.size, "", out.layout.source.size};
  Sha256 so_hash, source_hash;
  KILN_RETURN_IF_ERROR(
      ReadSpan(read_at, out.layout.shared_object, buf, [&](std::string_view piece) {
        if (facts.shared_object_head.size() < 4) {
          facts.shared_object_head.append(piece.substr(0, 4 - facts.shared_object_head.size()));
        }
        so_hash.Update(piece);
      }));
  KILN_RETURN_IF_ERROR(ReadSpan(read_at, out.layout.source, buf,
                                [&](std::string_view piece) { source_hash.Update(piece); }));
  out.so_digest = "sha256:" + so_hash.FinalHex();
  out.source_digest = "sha256:" + source_hash.FinalHex();
  KILN_ASSIGN_OR_RETURN(out.metadata, CheckMembers(metadata_json, facts, out.digest, policy));
  return out;
}

Status CheckMachine(const CellMetadata& metadata, const std::string& local_sm,
                    const nlohmann::json& local_toolchain) {
  // sm executable here, toolchain equal.
  const int local_rank = SmRank(local_sm);
  if (local_rank < 0) {
    return Refuse(StatusCode::kInvalidArgument, kRefusalSmMismatch,
                  "this machine's level '" + local_sm + "' is not a known level");
  }
  const int cell_rank = SmRank(metadata.sm);
  if (cell_rank < 0 || cell_rank > local_rank) {
    return Refuse(
        StatusCode::kInvalidArgument, kRefusalSmMismatch,
        "cell is built for '" + metadata.sm + "', this machine runs up to '" + local_sm + "'");
  }
  Result<std::string> here = CanonicalJson(local_toolchain);
  if (!here.ok()) {
    return Refuse(StatusCode::kInvalidArgument, kRefusalToolchainMismatch,
                  "this machine's toolchain block is not canonical: " + here.status().message());
  }
  Result<std::string> cell = CanonicalJson(metadata.toolchain);
  if (!cell.ok()) {  // RestateKey digested it, so this cannot fail; refuse rather than assume
    return Refuse(StatusCode::kInvalidArgument, kRefusalToolchainMismatch,
                  "the cell's toolchain block is not canonical: " + cell.status().message());
  }
  if (*here != *cell) {
    std::optional<std::string> diff = FirstDifference(metadata.toolchain, local_toolchain, "");
    return Refuse(
        StatusCode::kInvalidArgument, kRefusalToolchainMismatch,
        diff ? *diff : "toolchain blocks differ: " + *cell + " in the cell, " + *here + " here");
  }
  return Status::OK();
}

Result<AdmittedCell> AdmitCell(std::string_view tar_bytes, const std::string& expected_digest,
                               uint64_t expected_size, const AdmissionPolicy& policy) {
  BytesPolicy bytes{policy.expected_key, policy.max_shared_object_bytes};
  KILN_ASSIGN_OR_RETURN(AdmittedCell out,
                        AdmitBytes(tar_bytes, expected_digest, expected_size, bytes));
  KILN_RETURN_IF_ERROR(CheckMachine(out.metadata, policy.local_sm, policy.local_toolchain));
  return out;
}

Result<AdmissionPolicy> LocalAdmissionPolicy(const std::string& expected_key) {
  KILN_ASSIGN_OR_RETURN(Toolchain toolchain, LocalToolchain());
  AdmissionPolicy policy;
  policy.expected_key = expected_key;
  policy.local_sm = DetectSmLevel();
  policy.local_toolchain = toolchain.Block();
  return policy;
}

}  // namespace kiln
