// Cell packing: the deterministic tar that is a cell's bytes, and its digest (docs/design.md §6).
// Cell layer.
//
// Layout: a POSIX ustar archive holding exactly three regular files, in this order:
//   metadata.json, cell.so, source/cell.cc
// every header with mtime 0, uid/gid 0, uname/gname empty, mode 0644, no directories; two
// zero blocks at the end. Unpack refuses anything else by name: a missing, extra or duplicate
// member, a link or device or directory, an absolute path or `..`, a member over its size limit,
// a bad header checksum, trailing garbage, a truncated archive.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "src/kiln/base/status.h"

namespace kiln {

struct CellFiles {
  std::string metadata_json;
  std::string shared_object;
  std::string source;
};

// Size limits a member may not exceed on unpack.
inline constexpr uint64_t kMaxMetadataBytes = 16ull << 20;
inline constexpr uint64_t kMaxSharedObjectBytes = 1ull << 30;
inline constexpr uint64_t kMaxSourceBytes = 256ull << 20;

// Where a member's bytes lie in an archive.
struct MemberSpan {
  uint64_t offset = 0;
  uint64_t size = 0;
};
struct CellLayout {
  MemberSpan metadata;
  MemberSpan shared_object;
  MemberSpan source;
};

// Random access to an archive that need not be in memory: fills `out` with up to `len` bytes at
// `offset` and returns how many (0 only past the end). A failure is passed on as it is.
using ArchiveReader = std::function<Result<size_t>(uint64_t offset, char* out, size_t len)>;
// An ArchiveReader over bytes the caller keeps alive.
ArchiveReader ReadFromBytes(std::string_view bytes);

Result<std::string> PackCell(const CellFiles& files);
// Checks an archive of `total` bytes as UnpackCell does, reading its headers and its end blocks
// but no member's bytes, and says where each member lies. Corruption naming `what` for an archive
// a cell may not be; a read failure is passed on.
Result<CellLayout> IndexCell(const ArchiveReader& read_at, uint64_t total, const std::string& what);
// IndexCell over bytes in memory, and a copy of each member.
Result<CellFiles> UnpackCell(std::string_view tar_bytes, const std::string& what);
// "sha256:<64 hex>" of the packed bytes.
std::string CellDigest(std::string_view tar_bytes);
// "<key>@<digest>"
std::string CellRef(const std::string& key, const std::string& digest);

}  // namespace kiln
