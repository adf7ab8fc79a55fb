// BlobStore: cell bytes by content digest (hub layer). The hub's rows (store.h) name a digest;
// the bytes live here. A blob becomes visible only whole and verified: an upload streams into a
// temp file, its SHA-256 and size are checked against what the publisher declared, it is fsynced
// and renamed into place. A crash mid-upload leaves only a temp file, which Open removes.
//
// Disk layout under the root directory:
//   sha256/<64 hex>            a verified blob, never modified after the rename
//   tmp/<64 hex>.<n>.part      an upload in progress (deleted at startup: never resumed)
//   quarantine/<64 hex>.<t>    a blob whose bytes stopped hashing to its name (disk damage, a
//                              hand edit): moved out of sha256/ so it is never served again, kept
//                              for a post-mortem. The next upload of that digest repairs it.
//
// Implementations: disk (OpenDiskBlobStore), S3 (OpenS3BlobStore, s3_blob_store.h: the same
// contracts on an object store shared by hub replicas) and memory (NewMemoryBlobStore, for unit
// tests).
// Every method may be called from any thread; concurrent uploads of one digest each write their
// own temp file and the first rename wins (the bytes are equal by construction).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "src/kiln/base/sha256.h"
#include "src/kiln/base/status.h"

namespace kiln {

// A random-access view of one stored blob. Owned by the caller; valid after the blob is deleted
// (disk: the file descriptor keeps the bytes).
class BlobReader {
 public:
  virtual ~BlobReader() = default;
  virtual uint64_t size() const = 0;
  // Reads up to `len` bytes at `offset` into `out`; returns the count (0 at end). IOError on a
  // failed read.
  virtual Result<size_t> ReadAt(uint64_t offset, char* out, size_t len) = 0;
};

// One upload. Append streams bytes; Commit verifies and publishes; destroying an uncommitted
// writer deletes its temp bytes. Not thread-safe: one thread drives one writer.
// "sha256:<hex>" of every byte `reader` holds, read in 1 MiB pieces: what Verify compares with a
// blob's name on every backend.
Result<std::string> DigestOfReader(BlobReader& reader);

class BlobWriter {
 public:
  virtual ~BlobWriter() = default;
  // InvalidArgument (refusal() == "size_mismatch") once more bytes arrive than declared.
  virtual Status Append(std::string_view bytes) = 0;
  // Checks size then SHA-256, fsyncs and renames into place. On failure nothing becomes visible;
  // refusal() says "size_mismatch" or "digest_mismatch" (or is empty for an I/O error).
  virtual Status Commit() = 0;
  // The refusal token of the last failure, or "".
  virtual const std::string& refusal() const = 0;
};

// What every writer checks while bytes stream in and at Commit: never more than the declared
// size, then exactly that size and the declared SHA-256. refusal_ holds the failure's token.
class VerifyingSink {
 public:
  VerifyingSink(std::string digest, uint64_t expected)
      : digest_(std::move(digest)), expected_(expected) {}
  Status Count(std::string_view bytes) {
    received_ += bytes.size();
    if (received_ > expected_) {
      refusal_ = "size_mismatch";
      return Status::InvalidArgument("blob " + digest_ + ": more than the declared " +
                                     std::to_string(expected_) + " bytes arrived");
    }
    sha_.Update(bytes);
    return Status::OK();
  }
  Status Verify() {
    if (received_ != expected_) {
      refusal_ = "size_mismatch";
      return Status::InvalidArgument("blob " + digest_ + ": " + std::to_string(received_) +
                                     " bytes arrived, declared " + std::to_string(expected_));
    }
    const std::string got = "sha256:" + sha_.FinalHex();
    if (got != digest_) {
      refusal_ = "digest_mismatch";
      return Status::InvalidArgument("blob " + digest_ + ": the bytes hash to " + got);
    }
    return Status::OK();
  }
  std::string refusal_;

 protected:
  std::string digest_;
  uint64_t expected_;
  uint64_t received_ = 0;
  Sha256 sha_;
};

class BlobStore {
 public:
  BlobStore() = default;
  virtual ~BlobStore() = default;
  BlobStore(const BlobStore&) = delete;
  BlobStore& operator=(const BlobStore&) = delete;

  // REQUIRES: digest is "sha256:<64 lowercase hex>" (IsWellFormedDigest).
  virtual Result<std::unique_ptr<BlobWriter>> BeginWrite(const std::string& digest,
                                                         uint64_t expected_size) = 0;
  virtual bool Has(const std::string& digest) = 0;
  // NotFound naming the digest when absent.
  virtual Result<std::unique_ptr<BlobReader>> Open(const std::string& digest) = 0;
  // The whole blob in memory (unpacking a cell at publish time).
  Result<std::string> ReadAll(const std::string& digest);
  // How many upload temp files exist now (tests: no partial blob after a crash); -1 when they
  // cannot be counted (S3: the bucket listing failed).
  virtual int TempFileCount() = 0;

  // Re-reads a stored blob and checks that it still hashes to its digest. OK when intact;
  // NotFound when absent; a damaged blob is quarantined (no longer Has/Open-able) and the answer
  // is Corruption with token `blob_corrupt`. Costs one full read.
  virtual Status Verify(const std::string& digest) = 0;
  // Every stored digest (for scheduled re-verification). Order unspecified.
  virtual Result<std::vector<std::string>> List() = 0;
  // Whether a new blob could be written now: OK, or IOError naming what failed.
  virtual Status CheckWritable() = 0;
  // Free bytes where blobs are written (disk), or UINT64_MAX where the notion does not apply.
  virtual Result<uint64_t> FreeBytes() = 0;
  // Every stored blob with the time it became visible (unix seconds), for garbage collection.
  struct Stored {
    std::string digest;
    int64_t stored_at = 0;
    uint64_t size = 0;  // bytes (the hub's /metrics sums them)
  };
  virtual Result<std::vector<Stored>> ListStored() = 0;
  // Deletes a stored blob; OK if it is not there. A reader already open keeps its bytes.
  virtual Status Remove(const std::string& digest) = 0;
  // A URL from which anyone holding it may GET the blob's bytes, without credentials, for the
  // next `ttl_s` seconds (S3: a presigned GET of sha256/<hex>); it authorizes, it does not vouch
  // for the bytes, which the reader checks against the digest. Asks the store nothing: a blob
  // that is absent is a 404 from the URL. Unimplemented where the backend serves bytes only
  // through the hub (disk, memory). REQUIRES: IsWellFormedDigest(digest).
  virtual Result<std::string> DirectUrl(const std::string& digest, int64_t ttl_s);
};

// The refusal token of a stored blob whose bytes no longer match its digest.
inline constexpr const char* kRefusalBlobCorrupt = "blob_corrupt";

// "sha256:" + 64 lowercase hex.
bool IsWellFormedDigest(const std::string& digest);

// Creates `root` if needed and deletes every leftover temp file under root/tmp.
Result<std::unique_ptr<BlobStore>> OpenDiskBlobStore(const std::string& root);
std::unique_ptr<BlobStore> NewMemoryBlobStore();
// A reader over an open file descriptor of `size` bytes; takes ownership of `fd`.
std::unique_ptr<BlobReader> NewFdBlobReader(int fd, uint64_t size);

}  // namespace kiln
