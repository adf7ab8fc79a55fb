// Files: whole-file read, atomic write (temp + fsync + rename), and read-only mmap (base layer).
// Every error names the path and the failing system call's reason.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "src/kiln/base/status.h"

namespace kiln {

Result<std::string> ReadFile(const std::string& path);

// The machine's kiln cache directory: $KILN_CACHE_DIR, else $HOME/.cache/kiln. The cell store
// (cells/) and learned toolchain facts (toolchain/) live under it. InvalidArgument when neither
// variable is set.
Result<std::string> KilnCacheRoot();

// Whether a write must survive a machine crash. kScratch is for files that are useless after a
// crash anyway (a private copy of a shared object about to be dlopened): readers still see the
// whole file or none, but nothing is flushed to the device.
enum class Durability { kDurable, kScratch };

// Writes `bytes` to `path` so that readers see either the old file or the whole new one:
// write to a temp file in the same directory, rename over `path`; kDurable (the default) also
// fsyncs the file before the rename and the directory after it.
Status WriteFileAtomic(const std::string& path, std::string_view bytes,
                       Durability durability = Durability::kDurable);

// WriteFileAtomic for a file only this user may read or write (mode 0600 from its creation, so no
// other user can open it in between): tokens, signing keys, a database's identity.
Status WriteSecretFileAtomic(const std::string& path, std::string_view bytes);

// Whether the file at `path` is this user's secret: a regular file (not a link) that neither its
// group nor others may read or write. OK, or InvalidArgument with token `insecure_permissions`
// naming the path, its mode and the fix. NotFound when it does not exist.
Status CheckSecretFile(const std::string& path);
inline constexpr const char* kRefusalInsecurePermissions = "insecure_permissions";

// Creates `path` and its parents (like mkdir -p). OK if it already exists as a directory.
Status MakeDirs(const std::string& path);

// This process's private directory: copies of cells about to be dlopened, mint work, fetched
// blobs. Made on first call with mkdtemp (mode 0700, a name nobody can predict) inside a parent
// that this user owns and nobody else may enter: $KILN_PRIVATE_ROOT, else /tmp/kiln-<uid>. The
// parent is opened with O_NOFOLLOW and checked (a directory, owned by this user, mode 0700); one
// that fails the check — a planted symlink, another user's directory, a world-writable one — is
// never used: the refusal is logged and a fresh mkdtemp'd parent is made instead, so a planted
// path can neither redirect this process nor stop it. The directory is removed at normal exit;
// the directories of dead processes are swept by the next process of the same user. Any thread;
// the first call decides.
Result<std::string> ProcessPrivateDir();

// Whether `dir` may hold this process's private files: it exists as a directory (not a symlink),
// is owned by this user, and no one else may read, write or enter it. OK, or InvalidArgument with
// token `private_dir_unsafe` naming the path and what is wrong.
Status CheckPrivateDir(const std::string& dir);

// A read-only private mapping of a whole file. Immutable and thread-safe once opened; the mapping
// lives as long as the last shared_ptr (tensors viewing it hold one).
class MappedFile {
 public:
  static Result<std::shared_ptr<MappedFile>> Open(const std::string& path);
  // Maps the regular file open on `fd` (which the caller keeps and closes); `path` names it in
  // errors. For files opened under rules of the caller's own (beneath a directory, no links).
  static Result<std::shared_ptr<MappedFile>> FromDescriptor(int fd, const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

}  // namespace kiln
