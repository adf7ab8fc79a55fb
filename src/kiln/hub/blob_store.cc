// BlobStore implementations: disk (temp file + verify + fsync + atomic rename) and memory
// (hub layer). See blob_store.h for the layout and the contracts.
#include "src/kiln/hub/blob_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>
#include <mutex>

#include "src/kiln/base/file.h"
#include "src/kiln/base/log.h"
#include "src/kiln/base/sha256.h"

namespace kiln {

Result<std::string> DigestOfReader(BlobReader& reader) {
  Sha256 sha;
  std::string buf(1 << 20, '\0');
  uint64_t at = 0;
  while (at < reader.size()) {
    KILN_ASSIGN_OR_RETURN(size_t n, reader.ReadAt(at, buf.data(), buf.size()));
    if (n == 0) break;
    sha.Update(std::string_view(buf.data(), n));
    at += n;
  }
  return "sha256:" + sha.FinalHex();
}

bool IsWellFormedDigest(const std::string& digest) {
  if (digest.size() != 7 + 64 || digest.compare(0, 7, "sha256:") != 0) return false;
  for (size_t i = 7; i < digest.size(); ++i) {
    const char c = digest[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

Result<std::string> BlobStore::DirectUrl(const std::string& digest, int64_t) {
  return Status::Unimplemented("blob " + digest +
                               ": this blob store has no direct URLs; fetch through the hub");
}

Result<std::string> BlobStore::ReadAll(const std::string& digest) {
  KILN_ASSIGN_OR_RETURN(auto reader, Open(digest));
  std::string out(reader->size(), '\0');
  uint64_t done = 0;
  while (done < out.size()) {
    KILN_ASSIGN_OR_RETURN(size_t n, reader->ReadAt(done, out.data() + done, out.size() - done));
    if (n == 0) return Status::Corruption("blob " + digest + ": shorter than its size");
    done += n;
  }
  return out;
}

namespace {

std::string Errno() { return std::strerror(errno); }

// --- disk -----------------------------------------------------------------------------------

class FdReader final : public BlobReader {
 public:
  FdReader(int fd, uint64_t size) : fd_(fd), size_(size) {}
  ~FdReader() override { ::close(fd_); }
  uint64_t size() const override { return size_; }
  Result<size_t> ReadAt(uint64_t offset, char* out, size_t len) override {
    if (offset >= size_) return size_t{0};
    ssize_t n;
    do {
      n = ::pread(fd_, out, len, static_cast<off_t>(offset));
    } while (n < 0 && errno == EINTR);
    if (n < 0) return Status::IOError("blob read: " + Errno());
    return static_cast<size_t>(n);
  }

 private:
  int fd_;
  uint64_t size_;
};

class DiskWriter final : public BlobWriter {
 public:
  DiskWriter(std::string digest, uint64_t expected, int fd, std::string temp,
             std::string final_path, std::string dir)
      : sink_(digest, expected),
        digest_(std::move(digest)),
        fd_(fd),
        temp_(std::move(temp)),
        final_(std::move(final_path)),
        dir_(std::move(dir)) {}
  ~DiskWriter() override {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(temp_.c_str());
  }
  Status Append(std::string_view bytes) override {
    KILN_RETURN_IF_ERROR(sink_.Count(bytes));
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::write(fd_, bytes.data() + done, bytes.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return Status::IOError("blob write '" + temp_ + "': " + Errno());
      done += static_cast<size_t>(n);
    }
    return Status::OK();
  }
  Status Commit() override {
    KILN_RETURN_IF_ERROR(sink_.Verify());
    if (::fsync(fd_) != 0) return Status::IOError("fsync '" + temp_ + "': " + Errno());
    ::close(fd_);
    fd_ = -1;
    if (::rename(temp_.c_str(), final_.c_str()) != 0) {
      return Status::IOError("rename '" + temp_ + "' -> '" + final_ + "': " + Errno());
    }
    committed_ = true;
    const int dfd = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) {
      ::fsync(dfd);
      ::close(dfd);
    }
    return Status::OK();
  }
  const std::string& refusal() const override { return sink_.refusal_; }

 private:
  VerifyingSink sink_;
  std::string digest_;
  int fd_;
  std::string temp_, final_, dir_;
  bool committed_ = false;
};

class DiskBlobStore final : public BlobStore {
 public:
  explicit DiskBlobStore(std::string root) : root_(std::move(root)) {}

  Status Init() {
    KILN_RETURN_IF_ERROR(MakeDirs(root_ + "/sha256"));
    KILN_RETURN_IF_ERROR(MakeDirs(root_ + "/tmp"));
    KILN_RETURN_IF_ERROR(MakeDirs(root_ + "/quarantine"));
    std::error_code ec;
    int removed = 0;
    for (const auto& e : std::filesystem::directory_iterator(root_ + "/tmp", ec)) {
      std::filesystem::remove(e.path(), ec);
      ++removed;
    }
    if (removed > 0) {
      KILN_LOG(INFO) << "blob store " << root_ << ": removed " << removed
                     << " partial upload(s) left by an earlier run";
    }
    return Status::OK();
  }

  Result<std::unique_ptr<BlobWriter>> BeginWrite(const std::string& digest,
                                                 uint64_t expected_size) override {
    if (!IsWellFormedDigest(digest)) {
      return Status::InvalidArgument("blob digest '" + digest + "' is not sha256:<64 hex>");
    }
    const std::string hex = digest.substr(7);
    const std::string temp = root_ + "/tmp/" + hex + "." + std::to_string(::getpid()) + "-" +
                             std::to_string(counter_.fetch_add(1)) + ".part";
    const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return Status::IOError("create '" + temp + "': " + Errno());
    return std::unique_ptr<BlobWriter>(std::make_unique<DiskWriter>(
        digest, expected_size, fd, temp, root_ + "/sha256/" + hex, root_ + "/sha256"));
  }
  bool Has(const std::string& digest) override {
    if (!IsWellFormedDigest(digest)) return false;
    return ::access((root_ + "/sha256/" + digest.substr(7)).c_str(), F_OK) == 0;
  }
  Result<std::unique_ptr<BlobReader>> Open(const std::string& digest) override {
    if (!IsWellFormedDigest(digest)) {
      return Status::InvalidArgument("blob digest '" + digest + "' is not sha256:<64 hex>");
    }
    const std::string path = root_ + "/sha256/" + digest.substr(7);
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT) return Status::NotFound("blob " + digest + " is not stored");
      return Status::IOError("open '" + path + "': " + Errno());
    }
    const off_t size = ::lseek(fd, 0, SEEK_END);
    if (size < 0) {
      ::close(fd);
      return Status::IOError("seek '" + path + "': " + Errno());
    }
    return std::unique_ptr<BlobReader>(std::make_unique<FdReader>(fd, size));
  }
  int TempFileCount() override {
    std::error_code ec;
    int n = 0;
    for (auto it = std::filesystem::directory_iterator(root_ + "/tmp", ec);
         !ec && it != std::filesystem::directory_iterator(); ++it) {
      ++n;
    }
    return n;
  }
  Result<std::vector<Stored>> ListStored() override {
    std::vector<Stored> out;
    std::error_code ec;
    for (auto it = std::filesystem::directory_iterator(root_ + "/sha256", ec);
         !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (!IsWellFormedDigest("sha256:" + name)) continue;
      struct stat st {};
      if (::stat(it->path().c_str(), &st) != 0) continue;  // removed meanwhile
      out.push_back(
          {"sha256:" + name, static_cast<int64_t>(st.st_mtime), static_cast<uint64_t>(st.st_size)});
    }
    if (ec) return Status::IOError("listing '" + root_ + "/sha256': " + ec.message());
    return out;
  }
  Status Remove(const std::string& digest) override {
    if (!IsWellFormedDigest(digest)) {
      return Status::InvalidArgument("blob digest '" + digest + "' is not sha256:<64 hex>");
    }
    const std::string path = root_ + "/sha256/" + digest.substr(7);
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      return Status::IOError("unlink '" + path + "': " + Errno());
    }
    return Status::OK();
  }

  Status Verify(const std::string& digest) override {
    KILN_ASSIGN_OR_RETURN(auto reader, Open(digest));
    KILN_ASSIGN_OR_RETURN(const std::string got, DigestOfReader(*reader));
    if (got == digest) return Status::OK();
    // Moved, not deleted: the bytes are evidence. A rename is atomic, so a concurrent download
    // either has the file open already (and its reader sees the damaged bytes, which the worker's
    // own digest check refuses) or finds no blob.
    const std::string hex = digest.substr(7);
    const std::string to =
        root_ + "/quarantine/" + hex + "." +
        std::to_string(std::chrono::system_clock::now().time_since_epoch().count());
    if (::rename((root_ + "/sha256/" + hex).c_str(), to.c_str()) != 0 && errno != ENOENT) {
      return Status::IOError("quarantine blob " + digest + ": " + Errno());
    }
    KILN_LOG(ERROR) << "blob store " << root_ << ": blob " << digest << " hashes to " << got << " ("
                    << reader->size() << " bytes); quarantined as " << to;
    return Status::Refused(StatusCode::kCorruption, kRefusalBlobCorrupt,
                           "blob " + digest + " hashes to " + got + "; quarantined as " + to +
                               "; a republish of the cell repairs it");
  }

  Result<std::vector<std::string>> List() override {
    std::vector<std::string> out;
    std::error_code ec;
    for (auto it = std::filesystem::directory_iterator(root_ + "/sha256", ec);
         !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
      const std::string d = "sha256:" + it->path().filename().string();
      if (IsWellFormedDigest(d)) out.push_back(d);
    }
    if (ec) return Status::IOError("list '" + root_ + "/sha256': " + ec.message());
    return out;
  }

  Status CheckWritable() override {
    const std::string probe = root_ + "/tmp/ready-probe." + std::to_string(::getpid()) + "-" +
                              std::to_string(counter_.fetch_add(1));
    const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) return Status::IOError("blob store '" + root_ + "' is not writable: " + Errno());
    const bool wrote = ::write(fd, "k", 1) == 1;
    ::close(fd);
    ::unlink(probe.c_str());
    if (!wrote) return Status::IOError("blob store '" + root_ + "' refuses writes: " + Errno());
    return Status::OK();
  }

  Result<uint64_t> FreeBytes() override {
    struct statvfs st;
    if (::statvfs(root_.c_str(), &st) != 0) {
      return Status::IOError("statvfs '" + root_ + "': " + Errno());
    }
    return static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
  }

 private:
  std::string root_;
  std::atomic<uint64_t> counter_{0};
};

// --- memory ---------------------------------------------------------------------------------

class StringReader final : public BlobReader {
 public:
  explicit StringReader(std::shared_ptr<const std::string> bytes) : bytes_(std::move(bytes)) {}
  uint64_t size() const override { return bytes_->size(); }
  Result<size_t> ReadAt(uint64_t offset, char* out, size_t len) override {
    if (offset >= bytes_->size()) return size_t{0};
    const size_t n = std::min<uint64_t>(len, bytes_->size() - offset);
    std::memcpy(out, bytes_->data() + offset, n);
    return n;
  }

 private:
  std::shared_ptr<const std::string> bytes_;
};

struct MemoryBlobs {
  std::mutex mu;
  std::map<std::string, std::shared_ptr<const std::string>> blobs;
  std::map<std::string, int64_t> stored_at;
  int temps = 0;
};

class MemoryWriter final : public BlobWriter {
 public:
  MemoryWriter(std::string digest, uint64_t expected, std::shared_ptr<MemoryBlobs> blobs)
      : sink_(digest, expected), digest_(std::move(digest)), blobs_(std::move(blobs)) {
    std::lock_guard<std::mutex> lock(blobs_->mu);
    ++blobs_->temps;
  }
  ~MemoryWriter() override {
    std::lock_guard<std::mutex> lock(blobs_->mu);
    --blobs_->temps;
  }
  Status Append(std::string_view bytes) override {
    KILN_RETURN_IF_ERROR(sink_.Count(bytes));
    bytes_.append(bytes);
    return Status::OK();
  }
  Status Commit() override {
    KILN_RETURN_IF_ERROR(sink_.Verify());
    std::lock_guard<std::mutex> lock(blobs_->mu);
    if (blobs_->blobs.emplace(digest_, std::make_shared<const std::string>(std::move(bytes_)))
            .second) {
      blobs_->stored_at[digest_] = static_cast<int64_t>(std::time(nullptr));
    }
    return Status::OK();
  }
  const std::string& refusal() const override { return sink_.refusal_; }

 private:
  VerifyingSink sink_;
  std::string digest_;
  std::string bytes_;
  std::shared_ptr<MemoryBlobs> blobs_;
};

class MemoryBlobStore final : public BlobStore {
 public:
  Result<std::unique_ptr<BlobWriter>> BeginWrite(const std::string& digest,
                                                 uint64_t expected_size) override {
    if (!IsWellFormedDigest(digest)) {
      return Status::InvalidArgument("blob digest '" + digest + "' is not sha256:<64 hex>");
    }
    return std::unique_ptr<BlobWriter>(
        std::make_unique<MemoryWriter>(digest, expected_size, blobs_));
  }
  bool Has(const std::string& digest) override {
    std::lock_guard<std::mutex> lock(blobs_->mu);
    return blobs_->blobs.count(digest) != 0;
  }
  Result<std::unique_ptr<BlobReader>> Open(const std::string& digest) override {
    std::lock_guard<std::mutex> lock(blobs_->mu);
    auto it = blobs_->blobs.find(digest);
    if (it == blobs_->blobs.end()) return Status::NotFound("blob " + digest + " is not stored");
    return std::unique_ptr<BlobReader>(std::make_unique<StringReader>(it->second));
  }
  int TempFileCount() override {
    std::lock_guard<std::mutex> lock(blobs_->mu);
    return blobs_->temps;
  }
  Result<std::vector<Stored>> ListStored() override {
    std::lock_guard<std::mutex> lock(blobs_->mu);
    std::vector<Stored> out;
    for (const auto& [digest, at] : blobs_->stored_at) {
      auto it = blobs_->blobs.find(digest);
      out.push_back({digest, at, it == blobs_->blobs.end() ? 0 : it->second->size()});
    }
    return out;
  }
  Status Remove(const std::string& digest) override {
    std::lock_guard<std::mutex> lock(blobs_->mu);
    blobs_->blobs.erase(digest);
    blobs_->stored_at.erase(digest);
    return Status::OK();
  }
  Status Verify(const std::string& digest) override {
    std::lock_guard<std::mutex> lock(blobs_->mu);
    auto it = blobs_->blobs.find(digest);
    if (it == blobs_->blobs.end()) return Status::NotFound("blob " + digest + " is not stored");
    if ("sha256:" + Sha256Hex(*it->second) == digest) return Status::OK();
    blobs_->blobs.erase(it);
    blobs_->stored_at.erase(digest);
    return Status::Refused(StatusCode::kCorruption, kRefusalBlobCorrupt,
                           "blob " + digest + " no longer hashes to its digest; dropped");
  }
  Result<std::vector<std::string>> List() override {
    std::lock_guard<std::mutex> lock(blobs_->mu);
    std::vector<std::string> out;
    for (const auto& [d, b] : blobs_->blobs) out.push_back(d);
    return out;
  }
  Status CheckWritable() override { return Status::OK(); }
  Result<uint64_t> FreeBytes() override { return uint64_t{UINT64_MAX}; }

 private:
  std::shared_ptr<MemoryBlobs> blobs_ = std::make_shared<MemoryBlobs>();
};

}  // namespace

Result<std::unique_ptr<BlobStore>> OpenDiskBlobStore(const std::string& root) {
  auto store = std::make_unique<DiskBlobStore>(root);
  KILN_RETURN_IF_ERROR(store->Init());
  return std::unique_ptr<BlobStore>(std::move(store));
}

std::unique_ptr<BlobStore> NewMemoryBlobStore() { return std::make_unique<MemoryBlobStore>(); }

std::unique_ptr<BlobReader> NewFdBlobReader(int fd, uint64_t size) {
  return std::make_unique<FdReader>(fd, size);
}

}  // namespace kiln
