// LocalStore: on-disk cells by key (cell layer; see store.h).
#include "src/kiln/cell/store.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <system_error>

#include "src/kiln/base/file.h"
#include "src/kiln/base/log.h"
#include "src/kiln/cell/key.h"
#include "src/kiln/cell/pack.h"

namespace kiln {

namespace {

constexpr const char* kTarName = "cell.tar";
constexpr const char* kRefName = "ref";
constexpr const char* kOriginName = "origin";

// The origin recorded for `digest`; kUnknown when absent, malformed or about other bytes.
CellOrigin ReadOrigin(const std::string& path, const std::string& digest) {
  CellOrigin out;
  Result<std::string> text = ReadFile(path);
  if (!text.ok()) return out;
  auto j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || j.value("digest", std::string()) != digest) return out;
  const std::string origin = j.value("origin", std::string());
  if (origin == "minted") {
    out.kind = CellOrigin::Kind::kMinted;
  } else if (origin == "hub" && j.contains("receipt") && j["receipt"].is_string()) {
    out.kind = CellOrigin::Kind::kHub;
    out.receipt = j["receipt"].get<std::string>();
  }
  return out;
}

Status CheckKey(const std::string& key) {
  if (!IsWellFormedKey(key)) {
    return Status::InvalidArgument("local store: key '" + key +
                                   "' is not a cell key (expected ck1- and 56 lowercase hex)");
  }
  return Status::OK();
}

Status CheckNoteName(const std::string& name) {
  const bool ok =
      !name.empty() && name.size() <= 32 && std::all_of(name.begin(), name.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
      });
  if (!ok) {
    return Status::InvalidArgument("local store: note name '" + name +
                                   "' is not lower_snake (a-z, 0-9, _; 1..32 characters)");
  }
  return Status::OK();
}

bool IsWellFormedDigest(const std::string& digest) {
  if (digest.size() != 7 + 64 || digest.rfind("sha256:", 0) != 0) return false;
  return std::all_of(digest.begin() + 7, digest.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// What one read of an entry found.
struct Lookup {
  enum class Kind { kAbsent, kHit, kCorrupt } kind = Kind::kAbsent;
  std::string reason;  // for kCorrupt
  std::string digest;
  std::string bytes;
};

Lookup ReadEntry(const std::string& tar_path, const std::string& ref_path) {
  Lookup out;
  Result<std::string> ref = ReadFile(ref_path);
  Result<std::string> tar = ReadFile(tar_path);
  const bool ref_absent = !ref.ok() && ref.status().code() == StatusCode::kNotFound;
  const bool tar_absent = !tar.ok() && tar.status().code() == StatusCode::kNotFound;
  if (ref_absent && tar_absent) return out;  // a plain miss
  // Bytes without a ref are how every Put looks until its last rename (another process may be
  // minting this key right now): a miss, left for that Put (or the next) to complete. Deleting
  // it would pull the directory from under the Put (two `kiln run --compile` of one graph at once
  // failed that way).
  if (ref_absent && tar.ok()) return out;
  out.kind = Lookup::Kind::kCorrupt;
  if (ref_absent || tar_absent) {
    out.reason =
        std::string("half an entry: '") + (ref_absent ? kRefName : kTarName) + "' is missing";
    return out;
  }
  if (!ref.ok()) {
    out.reason = "unreadable ref: " + ref.status().message();
    return out;
  }
  if (!tar.ok()) {
    out.reason = "unreadable cell: " + tar.status().message();
    return out;
  }
  if (!IsWellFormedDigest(*ref)) {
    out.reason =
        "ref holds " + std::to_string(ref->size()) + " bytes that are not 'sha256:<64 hex>'";
    return out;
  }
  const std::string actual = CellDigest(*tar);
  if (actual != *ref) {
    out.reason = "cell bytes hash to " + actual + " but the ref records " + *ref;
    return out;
  }
  out.kind = Lookup::Kind::kHit;
  out.digest = std::move(*ref);
  out.bytes = std::move(*tar);
  return out;
}

}  // namespace

const char* CellOriginName(CellOrigin::Kind kind) {
  switch (kind) {
    case CellOrigin::Kind::kMinted:
      return "minted";
    case CellOrigin::Kind::kHub:
      return "hub";
    default:
      return "unknown";
  }
}

Result<std::string> DefaultStoreRoot() {
  auto root = KilnCacheRoot();
  if (!root.ok()) return Status::InvalidArgument("local store: " + root.status().message());
  return *root + "/cells";
}

LocalStore::LocalStore(std::string root) : root_(std::move(root)) {}

Status LocalStore::Put(const std::string& key, std::string_view tar_bytes,
                       const CellOrigin& origin) {
  KILN_RETURN_IF_ERROR(CheckKey(key));
  const std::string dir = EntryDir(key);
  KILN_RETURN_IF_ERROR(MakeDirs(dir));
  const std::string digest = CellDigest(tar_bytes);
  nlohmann::json o{{"digest", digest}, {"origin", CellOriginName(origin.kind)}};
  if (origin.kind == CellOrigin::Kind::kHub) o["receipt"] = origin.receipt;
  // Bytes and origin first, ref last: until the ref names these bytes a reader finds a mismatch
  // (a miss), never a hit on bytes it has not verified; an origin names its digest, so one left
  // by another Put reads as unknown.
  auto write = [&]() -> Status {
    KILN_RETURN_IF_ERROR(WriteFileAtomic(dir + "/" + kTarName, tar_bytes));
    KILN_RETURN_IF_ERROR(WriteFileAtomic(dir + "/" + kOriginName, o.dump()));
    return WriteFileAtomic(dir + "/" + kRefName, digest);
  };
  Status written = write();
  std::error_code ec;
  if (!written.ok() && !std::filesystem::exists(dir, ec)) {
    // Another process removed the entry meanwhile (a Get that found it corrupt): write it again.
    KILN_RETURN_IF_ERROR(MakeDirs(dir));
    written = write();
  }
  return written;
}

Result<std::optional<StoredCell>> LocalStore::Get(const std::string& key) {
  KILN_RETURN_IF_ERROR(CheckKey(key));
  const std::string dir = EntryDir(key);
  const std::string tar_path = dir + "/" + kTarName;
  const std::string ref_path = dir + "/" + kRefName;
  Lookup found = ReadEntry(tar_path, ref_path);
  if (found.kind == Lookup::Kind::kCorrupt) {
    // A Put of this key may have been between its two renames: look once more before deleting.
    found = ReadEntry(tar_path, ref_path);
  }
  switch (found.kind) {
    case Lookup::Kind::kAbsent:
      return std::optional<StoredCell>();
    case Lookup::Kind::kHit: {
      CellOrigin origin = ReadOrigin(dir + "/" + kOriginName, found.digest);
      return std::optional<StoredCell>(StoredCell{key, std::move(found.digest), tar_path,
                                                  std::move(found.bytes), std::move(origin)});
    }
    case Lookup::Kind::kCorrupt:
      break;
  }
  KILN_LOG(WARN) << "local store: entry '" << dir << "' is corrupt (" << found.reason
                 << "); deleting it and treating it as a miss";
  Status removed = Remove(key);
  if (!removed.ok()) {
    KILN_LOG(WARN) << "local store: could not delete corrupt entry '" << dir
                   << "': " << removed.message();
  }
  return std::optional<StoredCell>();
}

Status LocalStore::Remove(const std::string& key) {
  KILN_RETURN_IF_ERROR(CheckKey(key));
  const std::string dir = EntryDir(key);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (ec) {
    return Status::IOError("local store: cannot remove entry '" + dir + "': " + ec.message());
  }
  return Status::OK();
}

Status LocalStore::PutNote(const std::string& key, const std::string& name, std::string_view text) {
  KILN_RETURN_IF_ERROR(CheckKey(key));
  KILN_RETURN_IF_ERROR(CheckNoteName(name));
  const std::string dir = EntryDir(key);
  KILN_RETURN_IF_ERROR(MakeDirs(dir));
  return WriteFileAtomic(dir + "/note." + name, text);
}

Result<std::optional<std::string>> LocalStore::GetNote(const std::string& key,
                                                       const std::string& name) const {
  KILN_RETURN_IF_ERROR(CheckKey(key));
  KILN_RETURN_IF_ERROR(CheckNoteName(name));
  const std::string path = EntryDir(key) + "/note." + name;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return std::optional<std::string>();
  KILN_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  return std::optional<std::string>(std::move(text));
}

Status LocalStore::Touch(const std::string& key) {
  const int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
  return PutNote(key, "adopted", std::to_string(now_ms));
}

namespace {

// Bytes of every regular file under `dir` (an entry holds a handful of files, no subdirectory).
uint64_t EntryBytes(const std::string& dir) {
  uint64_t total = 0;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code size_ec;
    const uint64_t n = it->is_regular_file(size_ec) ? it->file_size(size_ec) : 0;
    if (!size_ec) total += n;
  }
  return total;
}

// When the entry was last adopted (its "adopted" note), else when its ref was written; 0 when
// neither can be read (such an entry goes first).
int64_t LastAdoptedMs(const std::string& dir) {
  if (Result<std::string> text = ReadFile(dir + "/note.adopted"); text.ok()) {
    char* end = nullptr;
    const long long v = std::strtoll(text->c_str(), &end, 10);
    if (end != text->c_str() && v > 0) return v;
  }
  struct stat st {};
  if (::stat((dir + "/" + kRefName).c_str(), &st) != 0) return 0;
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000 + st.st_mtim.tv_nsec / 1000000;
}

}  // namespace

uint64_t LocalStore::TotalBytes() const {
  uint64_t total = 0;
  for (const std::string& key : Keys()) total += EntryBytes(EntryDir(key));
  return total;
}

std::vector<LocalStore::Evicted> LocalStore::Evict(uint64_t max_bytes,
                                                   const std::set<std::string>& keep) {
  std::vector<Evicted> entries;
  uint64_t total = 0;
  for (const std::string& key : Keys()) {
    const std::string dir = EntryDir(key);
    Evicted e{key, EntryBytes(dir), LastAdoptedMs(dir)};
    total += e.bytes;
    entries.push_back(std::move(e));
  }
  std::vector<Evicted> removed;
  if (total <= max_bytes) return removed;
  // Oldest adoption first; the key breaks ties so the order never depends on the directory's.
  std::sort(entries.begin(), entries.end(), [](const Evicted& a, const Evicted& b) {
    return a.last_adopted_ms != b.last_adopted_ms ? a.last_adopted_ms < b.last_adopted_ms
                                                  : a.key < b.key;
  });
  for (const Evicted& e : entries) {
    if (total <= max_bytes) break;
    if (keep.count(e.key) > 0) continue;
    if (Status s = Remove(e.key); !s.ok()) {
      KILN_LOG(WARN) << "local store: cannot evict " << e.key << ": " << s.message();
      continue;
    }
    total -= std::min(total, e.bytes);
    removed.push_back(e);
  }
  return removed;
}

std::vector<std::string> LocalStore::Keys() const {
  std::vector<std::string> keys;
  std::error_code ec;
  std::filesystem::directory_iterator it(root_, ec);
  if (ec) return keys;
  for (const std::filesystem::directory_iterator end; it != end; it.increment(ec)) {
    if (ec) break;
    std::string name = it->path().filename().string();
    std::error_code type_ec;
    if (IsWellFormedKey(name) && it->is_directory(type_ec) && !type_ec) {
      keys.push_back(std::move(name));
    }
  }
  std::sort(keys.begin(), keys.end());
  return keys;
}

}  // namespace kiln
