// LocalStore: the cells this machine keeps on disk, by key (cell layer).
//
// Boot looks here before asking the hub (docs/design.md §4: derive key → local store → hub). The
// store holds bytes and their digest, nothing more: it does not admit a cell. A caller hands what
// Get returns to AdmitCell (admission.h) before anything is loaded (law 4); the recorded digest
// is the local-store provenance that admission checks the bytes against.
//
// Layout, one directory per key under the root:
//   <root>/<key>/cell.tar   the packed cell bytes (pack.h)
//   <root>/<key>/origin     where the bytes came from, for the provenance check at adoption:
//                           {"digest":…,"origin":"minted"} (this machine minted them) or
//                           {"digest":…,"origin":"hub","receipt":"<JWS>"} (adopted from a hub
//                           with that receipt); an entry without it has an unknown origin
//   <root>/<key>/ref        its digest, "sha256:<64 hex>", no newline (written last)
//   <root>/<key>/note.<name> a small record a caller keeps about the entry (PutNote): the worker's
//                           publish state of a cell it minted lives here, so it outlives the
//                           process
// Files are replaced by write-to-temp + rename, so a reader sees a whole old or a whole new file.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "src/kiln/base/status.h"

namespace kiln {

// The store root when none is given: $KILN_CACHE_DIR/cells if KILN_CACHE_DIR is set and
// non-empty, else $HOME/.cache/kiln/cells. InvalidArgument if neither variable is set.
Result<std::string> DefaultStoreRoot();

// Where an entry's bytes came from. Only the receipt is evidence; `kMinted` is this machine's
// own word (the local store is trusted like the kiln binary: docs/trust.md).
struct CellOrigin {
  enum class Kind { kUnknown, kMinted, kHub };
  Kind kind = Kind::kUnknown;
  std::string receipt;  // kHub: the receipt the cell was adopted with
};
const char* CellOriginName(CellOrigin::Kind kind);  // "unknown" | "minted" | "hub"

// One verified lookup result. `bytes` hash to `digest`, checked on this lookup.
struct StoredCell {
  std::string key;
  std::string digest;  // "sha256:<64 hex>"
  std::string path;    // <root>/<key>/cell.tar
  std::string bytes;   // the whole packed cell
  CellOrigin origin;   // kUnknown when the origin file is absent, unreadable or for other bytes
};

// A directory of cells keyed by cell key. The object holds only its root; all state is on disk,
// so any number of LocalStore objects (in any number of processes) may share one root.
//
// Threads: every method may be called from any thread concurrently, on one object or many.
// Concurrent Puts of one key are safe: each writes its own temp file and the last rename wins
// (by law 15 both hold the same bytes). A Get racing a Put of the same key sees the old entry,
// the new one, or a miss; never a mix reported as a hit, because Get re-hashes what it read, and
// it never deletes the bytes of a Put in progress (bytes whose ref is not written yet are a
// miss), so the racing Put completes.
class LocalStore {
 public:
  // REQUIRES: root is a directory path (need not exist yet; Put creates it).
  explicit LocalStore(std::string root);
  LocalStore(const LocalStore&) = delete;
  LocalStore& operator=(const LocalStore&) = delete;
  ~LocalStore() = default;

  const std::string& root() const { return root_; }

  // Stores `tar_bytes` under `key` and records CellDigest(tar_bytes) beside them, replacing any
  // previous entry. On success both files are durable (fsync'd). On failure: InvalidArgument if
  // `key` is not a well-formed cell key (so a key can never name a path outside the root);
  // IOError naming the path if the disk refuses. A failed Put may leave an entry that the next
  // Get treats as a miss; it never leaves one that Get reports as a hit with the wrong bytes.
  Status Put(const std::string& key, std::string_view tar_bytes, const CellOrigin& origin);

  // Looks `key` up and re-verifies the digest of the bytes on disk against the recorded ref.
  // Returns the cell on a verified hit and nullopt on a miss. A corrupt entry (bytes that do not
  // hash to the ref, a malformed ref, an unreadable file, a ref without bytes) is deleted,
  // logged as a warning and reported as a miss, so the caller fetches a fresh copy instead of
  // failing. Bytes without a ref (a Put in progress, or one that died) are a miss and left in
  // place: the next Put of the key replaces them.
  // InvalidArgument if `key` is malformed. The caller owns the returned bytes.
  Result<std::optional<StoredCell>> Get(const std::string& key);

  // Deletes the entry for `key`. OK if there was none. InvalidArgument for a malformed key;
  // IOError naming the path if a file cannot be removed.
  Status Remove(const std::string& key);

  // A note: a small record about an entry, kept beside its bytes and deleted with it (Remove, or
  // a Get that finds the entry corrupt). `name` is lower_snake (a-z, 0-9, _; 1..32 chars), so it
  // names no path. PutNote replaces the note atomically and durably; the entry's directory is
  // made if absent. InvalidArgument for a malformed key or name; IOError naming the path.
  Status PutNote(const std::string& key, const std::string& name, std::string_view text);
  // The note's text, nullopt when there is none. InvalidArgument for a malformed key or name.
  Result<std::optional<std::string>> GetNote(const std::string& key, const std::string& name) const;

  // Records that `key` was adopted now (note "adopted", unix milliseconds): the eviction order.
  // InvalidArgument for a malformed key; IOError naming the path.
  Status Touch(const std::string& key);

  // One entry Evict removed: its key, the bytes it freed, when it was last adopted (unix ms; the
  // time its ref was written when it never was).
  struct Evicted {
    std::string key;
    uint64_t bytes = 0;
    int64_t last_adopted_ms = 0;
  };
  // Removes entries, least recently adopted first, until the entries left hold at most
  // `max_bytes` in all (every file of an entry counts); never an entry in `keep`. Stops short
  // (the store stays over the bound) when only kept entries are left. Returns what it removed;
  // an entry that cannot be removed is logged and skipped.
  std::vector<Evicted> Evict(uint64_t max_bytes, const std::set<std::string>& keep);
  // Bytes the entries hold in all (every file of every entry).
  uint64_t TotalBytes() const;

  // The keys of all entries present (complete or not), sorted. Names under the root that are not
  // well-formed keys are ignored. Empty if the root does not exist or cannot be read.
  std::vector<std::string> Keys() const;

 private:
  std::string EntryDir(const std::string& key) const { return root_ + "/" + key; }

  const std::string root_;
};

}  // namespace kiln
