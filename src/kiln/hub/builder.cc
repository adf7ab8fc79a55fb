// The hub's sandboxed rebuild (see builder.h).
#include "src/kiln/hub/builder.h"

#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include "src/kiln/base/canonical_json.h"
#include "src/kiln/base/file.h"
#include "src/kiln/base/log.h"
#include "src/kiln/base/sha256.h"
#include "src/kiln/base/subprocess.h"
#include "src/kiln/cell/provenance.h"
#include "src/kiln/receipt/receipt.h"

namespace kiln {

PublishedMembers MembersOf(const CellFiles& files) {
  auto member = [](const std::string* bytes) {
    PublishedMember m;
    m.size = bytes->size();
    m.digest = MemberDigest(*bytes);
    m.read = [bytes](const std::function<Status(std::string_view)>& sink) {
      constexpr size_t kPiece = 1 << 20;
      for (size_t at = 0; at < bytes->size(); at += kPiece) {
        KILN_RETURN_IF_ERROR(sink(std::string_view(*bytes).substr(at, kPiece)));
      }
      return Status::OK();
    };
    return m;
  };
  return PublishedMembers{member(&files.source), member(&files.shared_object)};
}

namespace {

using Clock = std::chrono::steady_clock;

// AddressSanitizer reserves terabytes of address space for its shadow: a build with it cannot run
// under an address-space limit, so sanitizer builds of kiln leave that one rlimit off.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kAddressSanitizer = true;
#else
constexpr bool kAddressSanitizer = false;
#endif
#else
constexpr bool kAddressSanitizer = false;
#endif

std::string HostName() {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  return host;
}

Status Refused(const char* token, const std::string& detail) {
  return Status::Refused(StatusCode::kInvalidArgument, token, detail);
}

Status Unavailable(const std::string& detail) {
  return Status::Refused(StatusCode::kIOError, kRefusalBuilderUnavailable, detail);
}

// Writes all of `text` to `fd`; async-signal-safe.
bool WriteAll(int fd, const char* text, size_t len) {
  while (len > 0) {
    const ssize_t n = ::write(fd, text, len);
    if (n <= 0) return false;
    text += n;
    len -= static_cast<size_t>(n);
  }
  return true;
}

// Opens `path` write-only and writes `text`; async-signal-safe.
bool WriteProcFile(const char* path, const std::string& text) {
  const int fd = ::open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = WriteAll(fd, text.data(), text.size());
  ::close(fd);
  return ok;
}

// One step of building the sandbox's root, run in order inside the new mount namespace. Targets
// are absolute paths under the new root (prepared before fork, so nothing is formatted after).
struct MountStep {
  enum Kind { kDir, kSymlink, kBindDir, kBindFile, kProc } kind;
  std::string source;  // kSymlink: the link's text; kBind*: the path bound
  std::string target;
  bool read_only = true;
  unsigned long keep = 0;  // flags of the bound mount that must survive a read-only remount
};

// Everything the forked child needs, prepared before fork: after fork only async-signal-safe
// calls run (the hub is multithreaded).
struct ChildPlan {
  std::vector<std::string> args;
  std::vector<std::string> env;
  std::string top;   // removed afterwards: holds dir and root
  std::string dir;   // the work directory, at the same path inside the sandbox
  std::string root;  // the mount point of the sandbox's root tmpfs
  std::string log;
  std::vector<MountStep> mounts;
  bool as_root = false;
  uid_t uid = 0;
  gid_t gid = 0;
  std::string uid_map, gid_map;  // unprivileged: map our own ids in the new user namespace
  rlim_t as_bytes = 0, cpu_s = 0, fsize_bytes = 0;
};

// The sandbox's exit codes for a step that failed before exec (the parent names the step; the log
// says nothing, since nothing may be formatted after fork).
constexpr int kFailNamespaces = 120, kFailIdMap = 121, kFailRlimits = 122, kFailFiles = 123,
              kFailUser = 124, kFailChdir = 125, kFailExec = 126, kFailMounts = 119,
              kFailFork = 118;

// The sandbox's root: a tmpfs with the plan's mounts, then pivot_root into it. Runs as pid 1 of
// the new pid namespace, in the new mount namespace; async-signal-safe.
bool BuildRoot(const ChildPlan& plan) {
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return false;
  if (::mount("tmpfs", plan.root.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, "size=16m,mode=0755") !=
      0) {
    return false;
  }
  for (const MountStep& m : plan.mounts) {
    const char* t = m.target.c_str();
    switch (m.kind) {
      case MountStep::kDir:
        if (::mkdir(t, 0755) != 0 && errno != EEXIST) return false;
        break;
      case MountStep::kSymlink:
        if (::symlink(m.source.c_str(), t) != 0) return false;
        break;
      case MountStep::kProc:
        if (::mkdir(t, 0555) != 0 && errno != EEXIST) return false;
        if (::mount("proc", t, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) != 0) {
          return false;
        }
        break;
      case MountStep::kBindDir:
      case MountStep::kBindFile: {
        if (m.kind == MountStep::kBindDir) {
          if (::mkdir(t, 0755) != 0 && errno != EEXIST) return false;
        } else {
          const int fd = ::open(t, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
          if (fd < 0) return false;
          ::close(fd);
        }
        if (::mount(m.source.c_str(), t, nullptr, MS_BIND | MS_REC, nullptr) != 0) return false;
        if (m.read_only &&
            ::mount(nullptr, t, nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY | m.keep, nullptr) != 0) {
          return false;
        }
        break;
      }
    }
  }
  if (::chdir(plan.root.c_str()) != 0) return false;
  // The old root is stacked under the new one, then detached: nothing outside stays reachable.
  if (::syscall(SYS_pivot_root, ".", ".") != 0) return false;
  if (::umount2(".", MNT_DETACH) != 0) return false;
  return ::chdir("/") == 0;
}

// The forked child: namespaces, then a second fork whose child (pid 1 of the new pid namespace)
// builds the root, confines itself and execs. The first child waits and exits as it did, so the
// parent's wait sees the build's own status.
[[noreturn]] void ConfineAndExec(const ChildPlan& plan, char* const* argv, char* const* envp) {
  ::setpgid(0, 0);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  const int spaces = CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWPID;
  if (plan.as_root) {
    if (::unshare(spaces) != 0) ::_exit(kFailNamespaces);
  } else {
    if (::unshare(CLONE_NEWUSER | spaces) != 0) ::_exit(kFailNamespaces);
    WriteProcFile("/proc/self/setgroups", "deny");
    if (!WriteProcFile("/proc/self/uid_map", plan.uid_map) ||
        !WriteProcFile("/proc/self/gid_map", plan.gid_map)) {
      ::_exit(kFailIdMap);
    }
  }
  const pid_t init = ::fork();
  if (init < 0) ::_exit(kFailFork);
  if (init > 0) {
    int status = 0;
    while (::waitpid(init, &status, 0) < 0) {
      if (errno != EINTR) ::_exit(kFailFork);
    }
    if (WIFEXITED(status)) ::_exit(WEXITSTATUS(status));
    const int sig = WIFSIGNALED(status) ? WTERMSIG(status) : SIGKILL;
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    ::sigaction(sig, &dfl, nullptr);
    ::kill(::getpid(), sig);
    ::_exit(128 + sig);
  }
  if (!BuildRoot(plan)) ::_exit(kFailMounts);
  const rlimit as{plan.as_bytes, plan.as_bytes};
  const rlimit cpu{plan.cpu_s, plan.cpu_s};
  const rlimit fsize{plan.fsize_bytes, plan.fsize_bytes};
  const rlimit nofile{256, 256};
  const rlimit core{0, 0};
  if (::setrlimit(RLIMIT_AS, &as) != 0 || ::setrlimit(RLIMIT_CPU, &cpu) != 0 ||
      ::setrlimit(RLIMIT_FSIZE, &fsize) != 0 || ::setrlimit(RLIMIT_NOFILE, &nofile) != 0 ||
      ::setrlimit(RLIMIT_CORE, &core) != 0) {
    ::_exit(kFailRlimits);
  }
  // Files: stdin nothing, stdout/stderr the log, nothing else of the hub.
  const int null_fd = ::open("/dev/null", O_RDONLY);
  const int log_fd = ::open(plan.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (null_fd < 0 || log_fd < 0) ::_exit(kFailFiles);
  ::dup2(null_fd, 0);
  ::dup2(log_fd, 1);
  ::dup2(log_fd, 2);
  if (::syscall(SYS_close_range, 3U, ~0U, 0U) != 0) {
    for (int fd = 3; fd < 65536; ++fd) ::close(fd);
  }
  // User: the builder's, with no supplementary groups.
  if (plan.as_root) {
    if (::setgroups(0, nullptr) != 0 || ::setgid(plan.gid) != 0 || ::setuid(plan.uid) != 0 ||
        ::getuid() != plan.uid || ::geteuid() != plan.uid) {
      ::_exit(kFailUser);
    }
  }
  if (::chdir(plan.dir.c_str()) != 0) ::_exit(kFailChdir);
  ::execve(argv[0], argv, envp);
  ::_exit(kFailExec);
}

const char* ChildFailure(int code) {
  switch (code) {
    case kFailNamespaces:
      return "could not make the network, mount and pid namespaces";
    case kFailIdMap:
      return "could not map ids in the user namespace";
    case kFailRlimits:
      return "could not set rlimits";
    case kFailFiles:
      return "could not open the log or /dev/null";
    case kFailUser:
      return "could not switch to the builder user";
    case kFailChdir:
      return "could not enter the work directory";
    case kFailExec:
      return "could not exec the kiln binary";
    case kFailMounts:
      return "could not build the sandbox's root (mounts, pivot_root)";
    case kFailFork:
      return "could not start the sandbox's first process";
    default:
      return nullptr;
  }
}

// The flags of the mount holding `path` that a read-only bind remount must keep (a user namespace
// may not drop them).
unsigned long KeptFlags(const std::string& path) {
  struct statvfs st {};
  if (::statvfs(path.c_str(), &st) != 0) return 0;
  unsigned long keep = 0;
  if (st.f_flag & ST_NOSUID) keep |= MS_NOSUID;
  if (st.f_flag & ST_NODEV) keep |= MS_NODEV;
  if (st.f_flag & ST_NOEXEC) keep |= MS_NOEXEC;
  if (st.f_flag & ST_NOATIME) keep |= MS_NOATIME;
  if (st.f_flag & ST_NODIRATIME) keep |= MS_NODIRATIME;
  if (st.f_flag & ST_RELATIME) keep |= MS_RELATIME;
  return keep;
}

// The mount steps of the sandbox's root: what a compiler and the kiln binary need, nothing else.
class RootPlanner {
 public:
  explicit RootPlanner(std::string root) : root_(std::move(root)) {}

  // Makes every directory above `path` (absolute) inside the root.
  void Parents(const std::string& path) {
    std::string at;
    size_t i = 1;
    while (true) {
      const size_t slash = path.find('/', i);
      if (slash == std::string::npos) break;
      at = path.substr(0, slash);
      Dir(at);
      i = slash + 1;
    }
  }
  void Dir(const std::string& path) {
    if (made_.insert(path).second) steps_.push_back({MountStep::kDir, "", root_ + path});
  }
  // `path` as it is here: a symbolic link is copied, a directory or file bound (read-only unless
  // `writable`); a path that does not exist is skipped.
  void Mirror(const std::string& path, bool writable = false) {
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) return;
    Parents(path);
    if (S_ISLNK(st.st_mode)) {
      std::error_code ec;
      const auto target = std::filesystem::read_symlink(path, ec);
      if (!ec) steps_.push_back({MountStep::kSymlink, target.string(), root_ + path});
      return;
    }
    const bool dir = S_ISDIR(st.st_mode);
    if (dir) made_.insert(path);
    steps_.push_back({dir ? MountStep::kBindDir : MountStep::kBindFile, path, root_ + path,
                      !writable, KeptFlags(path)});
  }
  void Proc() { steps_.push_back({MountStep::kProc, "", root_ + "/proc"}); }
  std::vector<MountStep> Take() { return std::move(steps_); }

 private:
  std::string root_;
  std::set<std::string> made_;
  std::vector<MountStep> steps_;
};

// Whether `path` lies under a directory the sandbox already binds.
bool UnderUsr(const std::string& path) { return path.rfind("/usr/", 0) == 0; }

// A fair queue over the builder's slots (see builder.h). Waiters are granted in this order: a
// platform waiter first (oldest first); else a tenant waiter of the share with the fewest
// rebuilds running (ties: the share served longest ago, then the oldest waiter), as long as
// tenants hold fewer than their slots and the share fewer than `per_share`.
class BuildQueue {
 public:
  BuildQueue(int slots, int platform_reserved, int per_share, int max_waiting)
      : slots_(std::max(1, slots)),
        tenant_slots_(std::max(1, slots_ - std::max(0, platform_reserved))),
        per_share_(std::max(1, per_share)),
        max_waiting_(std::max(1, max_waiting)) {}

  struct Ticket {
    std::string share;
    bool platform = false;
    bool granted = false;
  };

  // Waits for a slot; builder_busy when `who`'s share already has max_waiting waiters, or when
  // no slot came within `max_wait`.
  Status Acquire(Ticket* t, std::chrono::seconds max_wait) {
    std::unique_lock<std::mutex> lock(mu_);
    int waiting = 0;
    for (const Ticket* w : waiting_) waiting += w->share == t->share ? 1 : 0;
    if (waiting >= max_waiting_) {
      return Status::Refused(StatusCode::kResourceExhausted, kRefusalBuilderBusy,
                             "the builder already has " + std::to_string(waiting) +
                                 " rebuilds of this publisher waiting; retry later");
    }
    waiting_.push_back(t);
    Grant();
    if (!cv_.wait_for(lock, max_wait, [t] { return t->granted; })) {
      waiting_.remove(t);
      return Status::Refused(StatusCode::kResourceExhausted, kRefusalBuilderBusy,
                             "no builder slot came free within " +
                                 std::to_string(max_wait.count()) + " s; retry later");
    }
    return Status::OK();
  }

  void Release(const Ticket& t) {
    std::lock_guard<std::mutex> lock(mu_);
    --running_;
    if (!t.platform) {
      --running_tenant_;
      if (--running_by_share_[t.share] <= 0) running_by_share_.erase(t.share);
    }
    Grant();
  }

  BuilderLoad Load() const {
    std::lock_guard<std::mutex> lock(mu_);
    return BuilderLoad{static_cast<int>(waiting_.size()), running_, slots_};
  }

 private:
  // REQUIRES: mu_ held.
  void Grant() {
    bool granted_any = false;
    while (running_ < slots_) {
      Ticket* pick = nullptr;
      for (Ticket* w : waiting_) {
        if (w->platform) {
          pick = w;
          break;
        }
      }
      if (pick == nullptr && running_tenant_ < tenant_slots_) {
        for (Ticket* w : waiting_) {
          const auto it = running_by_share_.find(w->share);
          const int running = it == running_by_share_.end() ? 0 : it->second;
          if (running >= per_share_) continue;
          if (pick == nullptr) {
            pick = w;
            continue;
          }
          const auto pit = running_by_share_.find(pick->share);
          const int pick_running = pit == running_by_share_.end() ? 0 : pit->second;
          if (running < pick_running ||
              (running == pick_running && served_[w->share] < served_[pick->share])) {
            pick = w;
          }
        }
      }
      if (pick == nullptr) break;
      waiting_.remove(pick);
      pick->granted = true;
      granted_any = true;
      ++running_;
      served_[pick->share] = ++serial_;
      if (!pick->platform) {
        ++running_tenant_;
        ++running_by_share_[pick->share];
      }
    }
    if (granted_any) cv_.notify_all();
  }

  const int slots_, tenant_slots_, per_share_, max_waiting_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::list<Ticket*> waiting_;  // oldest first
  int running_ = 0, running_tenant_ = 0;
  std::map<std::string, int> running_by_share_;
  std::map<std::string, uint64_t> served_;  // when each share was last granted a slot
  uint64_t serial_ = 0;
};

class SandboxedBuilder final : public CellBuilder {
 public:
  explicit SandboxedBuilder(SandboxOptions o)
      : o_(std::move(o)),
        queue_(o_.concurrent, o_.platform_reserved, o_.per_share, o_.max_waiting) {
    if (o_.name.empty()) o_.name = DefaultBuilderName();
    if (o_.kiln_binary.empty()) o_.kiln_binary = SelfExe();
    if (o_.work_root.empty()) {
      const char* tmp = std::getenv("TMPDIR");
      o_.work_root = tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
    }
  }

  const std::string& name() const override { return o_.name; }
  BuilderLoad Load() const override { return queue_.Load(); }

  Result<RebuildAttestation> Rebuild(const CellMetadata& metadata, const PublishedMembers& members,
                                     const RebuildRequester& who) override {
    const int timeout_s = TimeoutFor(metadata);
    BuildQueue::Ticket ticket{who.share.empty() ? who.publisher : who.share, who.platform};
    KILN_RETURN_IF_ERROR(queue_.Acquire(&ticket, std::chrono::seconds(o_.timeout_s)));
    struct Slot {
      BuildQueue* q;
      const BuildQueue::Ticket* t;
      ~Slot() { q->Release(*t); }
    } slot{&queue_, &ticket};

    const auto start = Clock::now();
    ChildPlan plan;
    Status prepared = Prepare(metadata, members, &plan);
    struct Cleanup {
      std::string top;
      ~Cleanup() {
        std::error_code ec;
        if (!top.empty()) std::filesystem::remove_all(top, ec);
      }
    } cleanup{plan.top};
    if (!prepared.ok()) return prepared;

    std::vector<char*> argv, envp;
    for (auto& a : plan.args) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (auto& e : plan.env) envp.push_back(e.data());
    envp.push_back(nullptr);
    const pid_t pid = ::fork();
    if (pid < 0) return Unavailable(std::string("fork: ") + std::strerror(errno));
    if (pid == 0) ConfineAndExec(plan, argv.data(), envp.data());
    ::setpgid(pid, pid);

    int status = 0;
    bool timed_out = false;
    for (;;) {
      const pid_t w = ::waitpid(pid, &status, WNOHANG);
      if (w == pid) break;
      if (w < 0 && errno != EINTR) return Unavailable(std::string("waitpid: ") + strerror(errno));
      if (Clock::now() - start > std::chrono::seconds(timeout_s)) {
        timed_out = true;
        ::kill(-pid, SIGKILL);
        ::waitpid(pid, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ::kill(-pid, SIGKILL);  // nothing of the group outlives the rebuild (a compiler grandchild)
    // What reaches the publisher (and this log) is a token and numbers: the child's log can quote
    // any file a compiler read, so it never leaves the work directory, which is deleted.
    if (timed_out) {
      return Refused(kRefusalRebuildFailed, "the rebuild of " + metadata.key + " ran past " +
                                                std::to_string(timeout_s) + " s and was killed");
    }
    if (WIFSIGNALED(status)) {
      return Refused(kRefusalRebuildFailed, "the rebuild of " + metadata.key + " died of signal " +
                                                std::to_string(WTERMSIG(status)) +
                                                " (a resource limit?)");
    }
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    if (const char* why = ChildFailure(code)) {
      return Unavailable(std::string("the builder sandbox failed before exec: ") + why);
    }
    auto report_text = ReadFile(plan.dir + "/report.json");
    nlohmann::json report;
    if (report_text.ok()) {
      auto parsed = ParseJson(*report_text, "rebuild report");
      if (parsed.ok() && parsed->is_object()) report = *parsed;
    }
    if (code == kRebuildChildRefused) {
      // The child is kiln's own code, but it compiled a tenant's source: take only known tokens,
      // and its message only as it words them (a line number, never compiler output).
      const std::string token = report.value("token", std::string(kRefusalRebuildFailed));
      const bool known = token == kRefusalRebuildUnavailable || token == kRefusalRebuildFailed ||
                         token == kRefusalIncludeRefused;
      std::string message = report.value("message", std::string("the rebuild refused the source"));
      // The child reports its Status's message, which already leads with the token.
      if (message.rfind(token + ": ", 0) == 0) message.erase(0, token.size() + 2);
      return Refused(known ? token.c_str() : kRefusalRebuildFailed, message);
    }
    if (code != kRebuildChildBuilt) {
      return Refused(kRefusalRebuildFailed, "the rebuild child exited " + std::to_string(code));
    }
    // The bytes, compared here: the child never saw the published shared object.
    KILN_RETURN_IF_ERROR(Compare(plan.dir + "/out/cell.so", members.shared_object));
    RebuildAttestation a;
    a.builder = o_.name;
    a.source_digest = members.source.digest;
    a.so_digest = members.shared_object.digest;
    a.sandbox = plan.as_root ? "netns+mntns+pidns uid=" + std::to_string(plan.uid) + " rlimits"
                             : "userns+netns+mntns+pidns rlimits";
    a.ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    return a;
  }

 private:
  int TimeoutFor(const CellMetadata& metadata) const {
    const int64_t scaled = static_cast<int64_t>(std::max(1, o_.base_timeout_s)) +
                           static_cast<int64_t>(std::max(0, o_.per_entry_timeout_s)) *
                               static_cast<int64_t>(metadata.entries.size());
    return static_cast<int>(std::min<int64_t>(scaled, std::max(1, o_.timeout_s)));
  }

  // The rebuilt file against the published member, streamed: equal bytes, or rebuild_mismatch
  // with both sizes, both digests and the first differing offset (CompareRebuild's wording).
  static Status Compare(const std::string& so_path, const PublishedMember& published) {
    struct stat st {};
    if (::lstat(so_path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
      return Refused(kRefusalRebuildFailed, "the rebuild left no regular out/cell.so");
    }
    const int fd = ::open(so_path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Unavailable("opening the rebuilt cell.so: " + std::string(strerror(errno)));
    struct Closer {
      int fd;
      ~Closer() { ::close(fd); }
    } closer{fd};
    const uint64_t rebuilt_size = static_cast<uint64_t>(st.st_size);
    uint64_t offset = 0;
    std::optional<uint64_t> first_difference;
    std::vector<char> mine(1 << 20);
    Status read = published.read([&](std::string_view piece) -> Status {
      while (!piece.empty() && !first_difference) {
        const size_t want = std::min(piece.size(), mine.size());
        const ssize_t n = ::pread(fd, mine.data(), want, static_cast<off_t>(offset));
        if (n < 0) return Status::IOError("reading the rebuilt cell.so");
        const size_t have = static_cast<size_t>(n);
        const auto diff = std::mismatch(piece.begin(), piece.begin() + have, mine.begin());
        if (diff.first != piece.begin() + have || have < want) {
          first_difference = offset + static_cast<uint64_t>(diff.first - piece.begin());
          break;
        }
        offset += have;
        piece.remove_prefix(have);
      }
      return Status::OK();
    });
    if (!read.ok()) return Unavailable("comparing the rebuild: " + read.message());
    if (!first_difference && rebuilt_size != published.size) first_difference = offset;
    if (!first_difference) return Status::OK();
    auto rebuilt_digest = Sha256File(so_path);
    return Refused(
        kRefusalRebuildMismatch,
        "the published cell.so (" + std::to_string(published.size) + " bytes, " + published.digest +
            ") is not what its source builds to (" + std::to_string(rebuilt_size) +
            " bytes, sha256:" + (rebuilt_digest.ok() ? *rebuilt_digest : std::string("?")) +
            "); first difference at byte " + std::to_string(*first_difference));
  }

  // The work directory with the inputs, owned by the builder user; the sandbox's root; the plan
  // for the child. On failure plan->top names whatever was made, for the caller to remove.
  Status Prepare(const CellMetadata& metadata, const PublishedMembers& members, ChildPlan* out) {
    ChildPlan& plan = *out;
    plan.as_root = ::geteuid() == 0;
    if (plan.as_root) {
      // getpwnam is not thread-safe; getpwnam_r is.
      passwd pw{};
      passwd* found = nullptr;
      std::vector<char> buf(16384);
      if (::getpwnam_r(o_.user.c_str(), &pw, buf.data(), buf.size(), &found) != 0 ||
          found == nullptr) {
        return Unavailable("builder user '" + o_.user + "' does not exist");
      }
      if (pw.pw_uid == 0) return Unavailable("builder user '" + o_.user + "' is root");
      plan.uid = pw.pw_uid;
      plan.gid = pw.pw_gid;
    } else {
      plan.uid = ::getuid();
      plan.gid = ::getgid();
      plan.uid_map = std::to_string(plan.uid) + " " + std::to_string(plan.uid) + " 1";
      plan.gid_map = std::to_string(plan.gid) + " " + std::to_string(plan.gid) + " 1";
    }
    if (o_.kiln_binary.empty()) return Unavailable("the kiln binary's path is unknown");
    KILN_RETURN_IF_ERROR(MakeDirs(o_.work_root));
    std::string tmpl = o_.work_root + "/kiln-rebuild-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) {
      return Unavailable("mkdtemp under '" + o_.work_root + "': " + std::strerror(errno));
    }
    plan.top = tmpl;
    // The parent of the work directory is only traversable: the builder user reaches its own
    // directory and nothing beside it.
    if (::chmod(plan.top.c_str(), 0711) != 0) {
      return Unavailable("chmod " + plan.top + ": " + std::strerror(errno));
    }
    plan.dir = plan.top + "/work";
    plan.root = plan.top + "/root";
    KILN_ASSIGN_OR_RETURN(std::string metadata_json, SerializeMetadata(metadata));
    Status wrote = MakeDirs(plan.dir);
    if (wrote.ok()) wrote = MakeDirs(plan.root);
    if (wrote.ok()) {
      wrote = WriteFileAtomic(plan.dir + "/metadata.json", metadata_json, Durability::kScratch);
    }
    if (wrote.ok()) wrote = WriteMember(plan.dir + "/cell.cc", members.source);
    for (const char* sub : {"/out", "/build", "/home", "/tmp", "/cache"}) {
      if (wrote.ok()) wrote = MakeDirs(plan.dir + sub);
    }
    if (!wrote.ok()) return Unavailable("preparing " + plan.dir + ": " + wrote.message());
    plan.log = plan.dir + "/child.log";
    if (plan.as_root) {
      std::error_code ec;
      for (const auto& e : std::filesystem::recursive_directory_iterator(plan.dir, ec)) {
        if (::lchown(e.path().c_str(), plan.uid, plan.gid) != 0) {
          return Unavailable("chown " + e.path().string() + ": " + std::strerror(errno));
        }
      }
      if (ec || ::chown(plan.dir.c_str(), plan.uid, plan.gid) != 0) {
        return Unavailable("chown " + plan.dir + ": " + std::strerror(errno));
      }
    }
    // The sandbox's root: the toolchain, the loader's files, two devices, a /proc of its own, the
    // kiln binary and the work directory. Nothing of the hub's data.
    RootPlanner root(plan.root);
    for (const char* top : {"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"}) {
      root.Mirror(top);
    }
    root.Dir("/etc");
    for (const char* etc :
         {"/etc/alternatives", "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d"}) {
      root.Mirror(etc);
    }
    root.Dir("/dev");
    root.Mirror("/dev/null", /*writable=*/true);
    root.Mirror("/dev/urandom", /*writable=*/true);
    root.Proc();
    root.Dir("/tmp");
    if (!UnderUsr(o_.kiln_binary)) root.Mirror(o_.kiln_binary);
    const char* env_cxx = std::getenv("KILN_CXX");
    const std::string cxx = !o_.cxx.empty() ? o_.cxx : (env_cxx != nullptr ? env_cxx : "");
    if (!cxx.empty() && cxx[0] == '/' && !UnderUsr(cxx)) {
      root.Mirror(std::filesystem::path(cxx).parent_path().string());
    }
    root.Mirror(plan.dir, /*writable=*/true);
    plan.mounts = root.Take();

    plan.args = {o_.kiln_binary, "rebuild", "--child", plan.dir};
    plan.env = {"PATH=" + std::string(std::getenv("PATH") ? std::getenv("PATH") : "/usr/bin:/bin"),
                "HOME=" + plan.dir + "/home",
                "TMPDIR=" + plan.dir + "/tmp",
                "KILN_CACHE_DIR=" + plan.dir + "/cache",
                "LANG=C",
                "KILN_REBUILD_PARALLEL=" + std::to_string(std::max(1, o_.parallel_compiles))};
    // The compiler to use, and a sanitizer build's own settings, pass through; nothing else does.
    if (!cxx.empty()) plan.env.push_back("KILN_CXX=" + cxx);
    for (const char* name : {"ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS"}) {
      if (const char* v = std::getenv(name)) plan.env.push_back(std::string(name) + "=" + v);
    }
    plan.as_bytes = kAddressSanitizer ? RLIM_INFINITY : static_cast<rlim_t>(o_.memory_mb) << 20;
    plan.cpu_s = static_cast<rlim_t>(o_.cpu_s);
    plan.fsize_bytes = static_cast<rlim_t>(o_.max_file_mb) << 20;
    return Status::OK();
  }

  // Streams a published member into a new file at `path`.
  static Status WriteMember(const std::string& path, const PublishedMember& member) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return Status::IOError("creating '" + path + "': " + std::strerror(errno));
    struct Closer {
      int fd;
      ~Closer() { ::close(fd); }
    } closer{fd};
    return member.read([&](std::string_view piece) -> Status {
      if (!WriteAll(fd, piece.data(), piece.size())) {
        return Status::IOError("writing '" + path + "': " + std::strerror(errno));
      }
      return Status::OK();
    });
  }

  SandboxOptions o_;
  BuildQueue queue_;
};

// Routes each rebuild to the builder of the cell's own toolchain (builder.h).
class ToolchainRouter : public CellBuilder {
 public:
  explicit ToolchainRouter(std::vector<ToolchainBuilder> builders)
      : builders_(std::move(builders)) {}
  BuilderLoad Load() const override {
    BuilderLoad total;
    for (const ToolchainBuilder& b : builders_) {
      const BuilderLoad l = b.builder->Load();
      total.waiting += l.waiting;
      total.running += l.running;
      total.slots += l.slots;
    }
    return total;
  }
  const std::string& name() const override { return builders_.front().builder->name(); }
  Result<RebuildAttestation> Rebuild(const CellMetadata& metadata, const PublishedMembers& members,
                                     const RebuildRequester& who) override {
    std::string built;
    for (const ToolchainBuilder& b : builders_) {
      if (b.toolchain == metadata.toolchain) return b.builder->Rebuild(metadata, members, who);
      built += (built.empty() ? "'" : ", '") + b.toolchain.value("compiler", std::string()) + "'";
    }
    const std::string sha = metadata.toolchain.is_object()
                                ? metadata.toolchain.value("compiler_sha256", std::string())
                                : std::string();
    return Status::Refused(
        StatusCode::kInvalidArgument, kRefusalRebuildUnavailable,
        "no builder on this hub for the toolchain of " + metadata.key + ": compiler '" +
            (metadata.toolchain.is_object() ? metadata.toolchain.value("compiler", std::string("?"))
                                            : std::string("?")) +
            "' (sha256 " + sha.substr(0, 16) + "); this hub builds " + built);
  }

 private:
  std::vector<ToolchainBuilder> builders_;
};

}  // namespace

std::string DefaultBuilderName() { return "hub@" + HostName(); }

std::unique_ptr<CellBuilder> NewSandboxedBuilder(SandboxOptions options) {
  return std::make_unique<SandboxedBuilder>(std::move(options));
}

std::unique_ptr<CellBuilder> NewToolchainRouter(std::vector<ToolchainBuilder> builders) {
  return std::make_unique<ToolchainRouter>(std::move(builders));
}

}  // namespace kiln
