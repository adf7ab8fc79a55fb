// Files: read, atomic write, mkdir -p, mmap (base layer).
#include "src/kiln/base/file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>

#include "src/kiln/base/log.h"

namespace kiln {

namespace {
Status Errno(const std::string& what, const std::string& path) {
  return Status::IOError(what + " '" + path + "': " + std::strerror(errno));
}

std::string DirName(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}
}  // namespace

Result<std::string> ReadFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return Status::NotFound("file '" + path + "' does not exist");
    return Errno("cannot open", path);
  }
  std::string out;
  char buf[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      Status s = Errno("cannot read", path);
      ::close(fd);
      return s;
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

Status MakeDirs(const std::string& path) {
  if (path.empty()) return Status::OK();
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return Status::OK();
    return Status::IOError("'" + path + "' exists and is not a directory");
  }
  const std::string parent = DirName(path);
  if (parent != path) KILN_RETURN_IF_ERROR(MakeDirs(parent));
  if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) return Errno("cannot mkdir", path);
  return Status::OK();
}

Status CheckPrivateDir(const std::string& dir) {
  auto unsafe = [&](const std::string& why) {
    return Status::Refused(StatusCode::kInvalidArgument, "private_dir_unsafe",
                           "'" + dir + "' " + why + "; kiln keeps code it is about to load there");
  };
  struct stat link;
  if (::lstat(dir.c_str(), &link) == 0 && S_ISLNK(link.st_mode))
    return unsafe("is a symbolic link");
  // The checks below are made on what this descriptor opened, never on the name again.
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ELOOP) return unsafe("is a symbolic link");
    if (errno == ENOTDIR) return unsafe("is not a directory");
    return unsafe(std::string("cannot be opened: ") + std::strerror(errno));
  }
  struct stat st;
  const int rc = ::fstat(fd, &st);
  ::close(fd);
  if (rc != 0) return unsafe(std::string("cannot be examined: ") + std::strerror(errno));
  if (st.st_uid != ::geteuid()) {
    return unsafe("belongs to uid " + std::to_string(st.st_uid) + ", not to this user (uid " +
                  std::to_string(::geteuid()) + ")");
  }
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return unsafe(std::string("has mode ") + mode + ", open to other users (expected 0700)");
  }
  return Status::OK();
}

namespace {

// Removes `<root>/<prefix><pid>-*` directories whose process no longer exists: what a crash or a
// SIGKILL left behind. A live process's directory (kill(pid, 0) does not say ESRCH) is never
// touched; a reused pid only delays a sweep.
void SweepDeadPrivateDirs(const std::string& root, const std::string& prefix) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
    const size_t dash = name.find('-', prefix.size());
    const std::string digits = name.substr(prefix.size(), dash - prefix.size());
    if (digits.empty() || digits.size() > 9 ||
        digits.find_first_not_of("0123456789") != std::string::npos) {
      continue;
    }
    const pid_t pid = static_cast<pid_t>(std::stol(digits));
    if (pid <= 0 || ::kill(pid, 0) == 0 || errno != ESRCH) continue;
    std::error_code rm;
    std::filesystem::remove_all(entry.path(), rm);
  }
}

// The parent of private directories: the configured or conventional path when it is (or can be
// made) safe, else a fresh mkdtemp'd one.
Result<std::string> PrivateParent() {
  const char* env = std::getenv("KILN_PRIVATE_ROOT");
  const std::string wanted = env != nullptr && *env != '\0'
                                 ? std::string(env)
                                 : "/tmp/kiln-" + std::to_string(::geteuid());
  if (::mkdir(wanted.c_str(), 0700) != 0 && errno != EEXIST) {
    KILN_LOG(WARNING) << "private directories: cannot create '" << wanted
                      << "': " << std::strerror(errno) << "; using a fresh directory instead";
  } else {
    Status safe = CheckPrivateDir(wanted);
    if (safe.ok()) return wanted;
    KILN_LOG(ERROR) << "private directories: refused " << safe.message()
                    << "; using a fresh directory instead";
  }
  std::string tmpl = "/tmp/kiln-" + std::to_string(::geteuid()) + "-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) return Errno("cannot mkdtemp", tmpl);
  return tmpl;
}

}  // namespace

Result<std::string> ProcessPrivateDir() {
  static const pid_t owner = ::getpid();
  static const Result<std::string>* dir = [] {
    auto* out = new Result<std::string>(Status::Internal("unset"));
    Result<std::string> parent = PrivateParent();
    if (!parent.ok()) {
      *out = parent.status();
      return out;
    }
    const std::string prefix = "cells-";
    SweepDeadPrivateDirs(*parent, prefix);
    std::string tmpl = *parent + "/" + prefix + std::to_string(owner) + "-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) {
      *out = Errno("cannot mkdtemp", tmpl);
      return out;
    }
    *out = tmpl;
    std::atexit([] {
      if (::getpid() != owner) return;  // a forked child exiting must not remove its parent's
      std::error_code ec;
      if (dir->ok()) std::filesystem::remove_all(**dir, ec);
    });
    return out;
  }();
  return *dir;
}

Result<std::string> KilnCacheRoot() {
  const char* cache = std::getenv("KILN_CACHE_DIR");
  if (cache != nullptr && *cache != '\0') return std::string(cache);
  const char* home = std::getenv("HOME");
  if (home != nullptr && *home != '\0') return std::string(home) + "/.cache/kiln";
  return Status::InvalidArgument(
      "kiln cache: neither KILN_CACHE_DIR nor HOME is set; set one to place the cache");
}

namespace {

Status WriteFileAtomicWithMode(const std::string& path, std::string_view bytes,
                               Durability durability, mode_t mode) {
  std::random_device rd;
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(rd());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) return Errno("cannot create", tmp);
  size_t off = 0;
  while (off < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + off, bytes.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      Status s = Errno("cannot write", tmp);
      ::close(fd);
      ::unlink(tmp.c_str());
      return s;
    }
    off += static_cast<size_t>(n);
  }
  if (durability == Durability::kDurable && ::fsync(fd) != 0) {
    Status s = Errno("cannot fsync", tmp);
    ::close(fd);
    ::unlink(tmp.c_str());
    return s;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    Status s = Errno("cannot rename into", path);
    ::unlink(tmp.c_str());
    return s;
  }
  if (durability == Durability::kScratch) return Status::OK();
  const int dfd = ::open(DirName(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);  // best effort: the rename is already visible
    ::close(dfd);
  }
  return Status::OK();
}

}  // namespace

Status WriteFileAtomic(const std::string& path, std::string_view bytes, Durability durability) {
  return WriteFileAtomicWithMode(path, bytes, durability, 0644);
}

Status WriteSecretFileAtomic(const std::string& path, std::string_view bytes) {
  return WriteFileAtomicWithMode(path, bytes, Durability::kDurable, 0600);
}

Status CheckSecretFile(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return Status::NotFound("file '" + path + "' does not exist");
    return Errno("cannot stat", path);
  }
  char mode[8];
  std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
  if (!S_ISREG(st.st_mode)) {
    return Status::Refused(StatusCode::kInvalidArgument, kRefusalInsecurePermissions,
                           "'" + path +
                               "' holds a secret and must be a regular file, not a link "
                               "or another kind of file");
  }
  if ((st.st_mode & 0066) != 0) {
    return Status::Refused(StatusCode::kInvalidArgument, kRefusalInsecurePermissions,
                           "'" + path + "' holds a secret but has mode " + mode +
                               ": its group or other users may read or write it; run "
                               "'chmod 600 " +
                               path + "'");
  }
  if (st.st_uid != ::geteuid()) {
    return Status::Refused(StatusCode::kInvalidArgument, kRefusalInsecurePermissions,
                           "'" + path + "' holds a secret but belongs to uid " +
                               std::to_string(st.st_uid) + ", not to this user (uid " +
                               std::to_string(::geteuid()) + ")");
  }
  return Status::OK();
}

Result<std::shared_ptr<MappedFile>> MappedFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return Status::NotFound("file '" + path + "' does not exist");
    return Errno("cannot open", path);
  }
  auto f = FromDescriptor(fd, path);
  ::close(fd);
  return f;
}

Result<std::shared_ptr<MappedFile>> MappedFile::FromDescriptor(int fd, const std::string& path) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return Errno("cannot stat", path);
  if (!S_ISREG(st.st_mode)) return Status::IOError("'" + path + "' is not a regular file");
  std::shared_ptr<MappedFile> f(new MappedFile());
  f->path_ = path;
  f->size_ = static_cast<size_t>(st.st_size);
  if (f->size_ > 0) {
    void* p = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) return Errno("cannot mmap", path);
    f->data_ = static_cast<const uint8_t*>(p);
  }
  return f;
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

}  // namespace kiln
