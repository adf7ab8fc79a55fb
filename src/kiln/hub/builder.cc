// The hub's sandboxed rebuild (see builder.h).
#include "src/kiln/hub/builder.h"

#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>
#include <vector>

#include "src/kiln/base/canonical_json.h"
#include "src/kiln/base/file.h"
#include "src/kiln/base/log.h"
#include "src/kiln/base/subprocess.h"
#include "src/kiln/cell/provenance.h"
#include "src/kiln/receipt/receipt.h"

namespace kiln {

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

// Everything the forked child needs, prepared before fork: after fork only async-signal-safe
// calls run (the hub is multithreaded).
struct ChildPlan {
  std::vector<std::string> args;
  std::vector<std::string> env;
  std::string dir;
  std::string log;
  bool as_root = false;
  uid_t uid = 0;
  gid_t gid = 0;
  std::string uid_map, gid_map;  // unprivileged: map our own ids in the new user namespace
  rlim_t as_bytes = 0, cpu_s = 0, fsize_bytes = 0;
};

// The forked child: confine, then exec. Exit codes 120-127 say which step failed (read by the
// parent for its message; the log says nothing, since nothing may be formatted here).
[[noreturn]] void ConfineAndExec(const ChildPlan& plan, char* const* argv, char* const* envp) {
  ::setpgid(0, 0);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  // Network: a namespace with nothing in it.
  if (plan.as_root) {
    if (::unshare(CLONE_NEWNET) != 0) ::_exit(120);
  } else {
    if (::unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0) ::_exit(120);
    WriteProcFile("/proc/self/setgroups", "deny");
    if (!WriteProcFile("/proc/self/uid_map", plan.uid_map) ||
        !WriteProcFile("/proc/self/gid_map", plan.gid_map)) {
      ::_exit(121);
    }
  }
  const rlimit as{plan.as_bytes, plan.as_bytes};
  const rlimit cpu{plan.cpu_s, plan.cpu_s};
  const rlimit fsize{plan.fsize_bytes, plan.fsize_bytes};
  const rlimit nofile{256, 256};
  const rlimit core{0, 0};
  if (::setrlimit(RLIMIT_AS, &as) != 0 || ::setrlimit(RLIMIT_CPU, &cpu) != 0 ||
      ::setrlimit(RLIMIT_FSIZE, &fsize) != 0 || ::setrlimit(RLIMIT_NOFILE, &nofile) != 0 ||
      ::setrlimit(RLIMIT_CORE, &core) != 0) {
    ::_exit(122);
  }
  // Files: stdin nothing, stdout/stderr the log, nothing else of the hub.
  const int null_fd = ::open("/dev/null", O_RDONLY);
  const int log_fd = ::open(plan.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (null_fd < 0 || log_fd < 0) ::_exit(123);
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
      ::_exit(124);
    }
  }
  if (::chdir(plan.dir.c_str()) != 0) ::_exit(125);
  ::execve(argv[0], argv, envp);
  ::_exit(126);
}

const char* ChildFailure(int code) {
  switch (code) {
    case 120:
      return "could not make a network namespace";
    case 121:
      return "could not map ids in the user namespace";
    case 122:
      return "could not set rlimits";
    case 123:
      return "could not open the log or /dev/null";
    case 124:
      return "could not switch to the builder user";
    case 125:
      return "could not enter the work directory";
    case 126:
      return "could not exec the kiln binary";
    default:
      return nullptr;
  }
}

class SandboxedBuilder final : public CellBuilder {
 public:
  explicit SandboxedBuilder(SandboxOptions o) : o_(std::move(o)) {
    if (o_.name.empty()) o_.name = "hub@" + HostName();
    if (o_.kiln_binary.empty()) o_.kiln_binary = SelfExe();
    if (o_.work_root.empty()) {
      const char* tmp = std::getenv("TMPDIR");
      o_.work_root = tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
    }
  }

  const std::string& name() const override { return o_.name; }

  Result<RebuildAttestation> Rebuild(const CellMetadata& metadata,
                                     const CellFiles& files) override {
    Slot slot(this);
    const auto start = Clock::now();
    KILN_ASSIGN_OR_RETURN(ChildPlan plan, Prepare(metadata, files));
    struct Cleanup {
      std::string dir;
      ~Cleanup() {
        std::error_code ec;
        std::filesystem::remove_all(dir, ec);
      }
    } cleanup{plan.dir};

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
      if (Clock::now() - start > std::chrono::seconds(o_.timeout_s)) {
        timed_out = true;
        ::kill(-pid, SIGKILL);
        ::waitpid(pid, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ::kill(-pid, SIGKILL);  // nothing of the group outlives the rebuild (a compiler grandchild)
    const std::string log = Tail(plan.log);
    if (timed_out) {
      return Refused(kRefusalRebuildFailed, "the rebuild of " + metadata.key + " ran past " +
                                                std::to_string(o_.timeout_s) + " s and was killed");
    }
    if (WIFSIGNALED(status)) {
      return Refused(kRefusalRebuildFailed, "the rebuild of " + metadata.key + " died of signal " +
                                                std::to_string(WTERMSIG(status)) +
                                                " (an rlimit?); log: " + log);
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
      const std::string token = report.value("token", std::string(kRefusalRebuildFailed));
      const bool known = token == kRefusalRebuildUnavailable || token == kRefusalRebuildFailed;
      return Refused(known ? token.c_str() : kRefusalRebuildFailed,
                     report.value("message", std::string("refused; log: ") + log));
    }
    if (code != kRebuildChildBuilt) {
      return Refused(kRefusalRebuildFailed,
                     "the rebuild child exited " + std::to_string(code) + "; log: " + log);
    }
    // The bytes, compared here: the child never saw the published shared object.
    const std::string so_path = plan.dir + "/out/cell.so";
    struct stat st {};
    if (::lstat(so_path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
      return Refused(kRefusalRebuildFailed, "the rebuild left no regular out/cell.so");
    }
    if (static_cast<uint64_t>(st.st_size) > files.shared_object.size() + (1u << 20)) {
      return Refused(kRefusalRebuildMismatch,
                     "the rebuilt cell.so is " + std::to_string(st.st_size) +
                         " bytes, the published one " + std::to_string(files.shared_object.size()));
    }
    KILN_ASSIGN_OR_RETURN(std::string rebuilt, ReadFile(so_path));
    KILN_RETURN_IF_ERROR(CompareRebuild(files.shared_object, rebuilt));
    RebuildAttestation a;
    a.builder = o_.name;
    a.source_digest = MemberDigest(files.source);
    a.so_digest = MemberDigest(files.shared_object);
    a.sandbox = plan.as_root ? "netns uid=" + std::to_string(plan.uid) + " rlimits"
                             : "userns+netns rlimits";
    a.ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    return a;
  }

 private:
  // Bounds how many rebuilds run at once.
  class Slot {
   public:
    explicit Slot(SandboxedBuilder* b) : b_(b) {
      std::unique_lock<std::mutex> lock(b_->mu_);
      b_->cv_.wait(lock, [&] { return b_->running_ < std::max(1, b_->o_.concurrent); });
      ++b_->running_;
    }
    ~Slot() {
      std::lock_guard<std::mutex> lock(b_->mu_);
      --b_->running_;
      b_->cv_.notify_one();
    }

   private:
    SandboxedBuilder* b_;
  };

  // The work directory with the inputs, owned by the builder user; the plan for the child.
  Result<ChildPlan> Prepare(const CellMetadata& metadata, const CellFiles& files) {
    ChildPlan plan;
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
    plan.dir = tmpl;
    KILN_ASSIGN_OR_RETURN(std::string metadata_json, SerializeMetadata(metadata));
    Status wrote =
        WriteFileAtomic(plan.dir + "/metadata.json", metadata_json, Durability::kScratch);
    if (wrote.ok())
      wrote = WriteFileAtomic(plan.dir + "/cell.cc", files.source, Durability::kScratch);
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
    plan.args = {o_.kiln_binary, "rebuild", "--child", plan.dir};
    plan.env = {"PATH=" + std::string(std::getenv("PATH") ? std::getenv("PATH") : "/usr/bin:/bin"),
                "HOME=" + plan.dir + "/home",
                "TMPDIR=" + plan.dir + "/tmp",
                "KILN_CACHE_DIR=" + plan.dir + "/cache",
                "LANG=C",
                "KILN_REBUILD_PARALLEL=" + std::to_string(std::max(1, o_.parallel_compiles))};
    // The compiler to use, and a sanitizer build's own settings, pass through; nothing else does.
    for (const char* name : {"KILN_CXX", "ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS"}) {
      if (const char* v = std::getenv(name)) plan.env.push_back(std::string(name) + "=" + v);
    }
    plan.as_bytes = kAddressSanitizer ? RLIM_INFINITY : static_cast<rlim_t>(o_.memory_mb) << 20;
    plan.cpu_s = static_cast<rlim_t>(o_.cpu_s);
    plan.fsize_bytes = static_cast<rlim_t>(o_.max_file_mb) << 20;
    return plan;
  }

  // The last 2 KiB of the child's log, one line.
  static std::string Tail(const std::string& path) {
    auto text = ReadFile(path);
    if (!text.ok()) return "(no log)";
    std::string t = text->size() > 2048 ? text->substr(text->size() - 2048) : *text;
    for (char& c : t) {
      if (c == '\n') c = ' ';
    }
    return t;
  }

  SandboxOptions o_;
  std::mutex mu_;
  std::condition_variable cv_;
  int running_ = 0;
};

}  // namespace

std::unique_ptr<CellBuilder> NewSandboxedBuilder(SandboxOptions options) {
  return std::make_unique<SandboxedBuilder>(std::move(options));
}

}  // namespace kiln
