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

Result<std::string> PackCell(const CellFiles& files);
Result<CellFiles> UnpackCell(std::string_view tar_bytes, const std::string& what);
// "sha256:<64 hex>" of the packed bytes.
std::string CellDigest(std::string_view tar_bytes);
// "<key>@<digest>"
std::string CellRef(const std::string& key, const std::string& digest);

}  // namespace kiln
