// The mint parent: spawn, frames, watchdog, the ending judged (mint layer; see parent.h).
#include "src/kiln/mint/parent.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "src/kiln/base/file.h"
#include "src/kiln/base/subprocess.h"

namespace kiln {

namespace {

using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// CPU time (clock ticks) of every process in process group `pgid`, including the children they
// reaped (the compiler processes), plus the bytes the group leader wrote (wchar). A change in
// either is progress.
uint64_t GroupProgress(pid_t pgid) {
  uint64_t total = 0;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return 0;
  while (dirent* e = ::readdir(proc)) {
    const char* name = e->d_name;
    if (name[0] < '0' || name[0] > '9') continue;
    std::ifstream stat(std::string("/proc/") + name + "/stat");
    std::string text;
    if (!std::getline(stat, text)) continue;
    const size_t paren = text.rfind(')');
    if (paren == std::string::npos) continue;
    std::istringstream in(text.substr(paren + 2));
    std::string state;
    long long ppid, pgrp, session, tty, tpgid;
    unsigned long long flags, minflt, cminflt, majflt, cmajflt, utime, stime;
    long long cutime, cstime;
    in >> state >> ppid >> pgrp >> session >> tty >> tpgid >> flags >> minflt >> cminflt >>
        majflt >> cmajflt >> utime >> stime >> cutime >> cstime;
    if (!in || pgrp != pgid) continue;
    total += utime + stime + static_cast<uint64_t>(cutime + cstime);
  }
  ::closedir(proc);
  std::ifstream io("/proc/" + std::to_string(pgid) + "/io");
  std::string field;
  uint64_t value = 0;
  while (io >> field >> value) {
    if (field == "wchar:") total += value;
  }
  return total;
}

}  // namespace

MintParent::MintParent(MintParentOptions options) : options_(std::move(options)) {}

MintParent::~MintParent() { KillAll(); }

void MintParent::KillAll() {
  std::lock_guard<std::mutex> lock(mu_);
  stopping_ = true;
  for (pid_t pg : children_) ::kill(-pg, SIGKILL);
}

MintChildOutcome MintParent::Run(const std::string& dir, MintChildRequest req) {
  MintChildOutcome out;
  const Clock::time_point start = Clock::now();
  auto fail = [&](const char* phase, std::string detail) {
    out.phase = phase;
    out.detail = std::move(detail);
    out.ms = MsSince(start);
    return out;
  };
  if (Status s = MakeDirs(dir); !s.ok()) return fail(kMintSpawnFailed, s.ToString());
  ::chmod(dir.c_str(), 0700);
  req.out_dir = dir;
  req.report = dir + "/report.json";
  req.phases = dir + "/phases.json";
  const std::string request_path = dir + "/request.json";
  if (Status s = WriteFileAtomic(request_path, ToJson(req).dump(2)); !s.ok()) {
    return fail(kMintSpawnFailed, s.ToString());
  }
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) {
    return fail(kMintSpawnFailed, std::string("pipe: ") + std::strerror(errno));
  }
  // The child's lifeline (protocol.h): the parent holds the write end until it has reaped the
  // child; the child sees end of file only when the parent is gone.
  int alive_fds[2];
  if (::pipe2(alive_fds, O_CLOEXEC) != 0) {
    ::close(pipe_fds[0]);
    ::close(pipe_fds[1]);
    return fail(kMintSpawnFailed, std::string("pipe: ") + std::strerror(errno));
  }
  const std::string binary = options_.binary.empty() ? SelfExe() : options_.binary;
  const std::string log = dir + "/child.log";
  std::vector<std::string> args = {binary,
                                   "mint",
                                   "--child",
                                   request_path,
                                   kMintParentAliveFlag,
                                   std::to_string(kMintParentAliveFd)};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const int log_fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  const pid_t parent = ::getpid();
  const int child_nice = options_.child_nice;
  // Everything the child needs is prepared before fork: only async-signal-safe calls after it.
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(pipe_fds[0]);
    ::close(pipe_fds[1]);
    ::close(alive_fds[0]);
    ::close(alive_fds[1]);
    if (log_fd >= 0) ::close(log_fd);
    return fail(kMintSpawnFailed, std::string("fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(kMintExitBadRequest);  // the parent died before the prctl
    ::setpgid(0, 0);
    ::setpriority(PRIO_PROCESS, 0, child_nice);
    ::dup2(pipe_fds[1], 1);
    if (log_fd >= 0) ::dup2(log_fd, 2);
    if (alive_fds[0] == kMintParentAliveFd) {
      ::fcntl(kMintParentAliveFd, F_SETFD, 0);  // dup2 onto itself would keep O_CLOEXEC
    } else {
      ::dup2(alive_fds[0], kMintParentAliveFd);
    }
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);  // the server blocks SIGTERM for its sigwait
    ::execv(argv[0], argv.data());
    ::_exit(kMintExitBadRequest);
  }
  ::setpgid(pid, pid);  // also here, so the group exists before we ever signal it
  ::close(pipe_fds[1]);
  ::close(alive_fds[0]);
  if (log_fd >= 0) ::close(log_fd);
  {
    std::lock_guard<std::mutex> lock(mu_);
    children_.insert(pid);
    if (stopping_) ::kill(-pid, SIGKILL);
  }

  // The watchdog: frames in, progress sampled, a stalled group killed. No total time limit.
  std::string pending;
  uint64_t last_progress = GroupProgress(pid);
  Clock::time_point last_change = Clock::now();
  bool stalled = false;
  int status = 0;
  bool exited = false;
  bool pipe_open = true;
  std::string last_frame;
  while (!exited) {
    if (pipe_open) {
      pollfd p{pipe_fds[0], POLLIN, 0};
      if (::poll(&p, 1, options_.sample_ms) > 0) {
        char buf[4096];
        const ssize_t n = ::read(pipe_fds[0], buf, sizeof(buf));
        if (n <= 0) {
          pipe_open = false;
        } else {
          pending.append(buf, static_cast<size_t>(n));
          for (size_t nl; (nl = pending.find('\n')) != std::string::npos;) {
            const std::string line = pending.substr(0, nl);
            pending.erase(0, nl + 1);
            if (line.rfind(kMintFramePrefix, 0) == 0) {
              ++out.frames;
              last_frame = line.substr(std::strlen(kMintFramePrefix));
            }
          }
        }
      }
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(options_.sample_ms));
    }
    const pid_t w = ::waitpid(pid, &status, WNOHANG);
    if (w == pid) {
      exited = true;
      break;
    }
    const uint64_t progress = GroupProgress(pid);
    if (progress != last_progress) {
      last_progress = progress;
      last_change = Clock::now();
    } else if (MsSince(last_change) > options_.stall_window_ms) {
      stalled = true;
      ::kill(-pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      exited = true;
    }
  }
  ::kill(-pid, SIGKILL);  // nothing of the group outlives the mint (a compiler grandchild)
  ::close(pipe_fds[0]);
  ::close(alive_fds[1]);
  {
    std::lock_guard<std::mutex> lock(mu_);
    children_.erase(pid);
  }
  out.ms = MsSince(start);
  auto evidence = [&] {
    auto phases = ReadFile(req.phases);
    std::string s = "last_frame=" + (last_frame.empty() ? std::string("none") : last_frame);
    if (phases.ok()) {
      auto live = ParseMintChildReport(*phases, req.phases);
      if (live.ok()) s += " phases_done=\"" + MintPhasesDetail(*live) + "\"";
    }
    return s;
  };
  if (stalled) {
    return fail(kMintChildStalled, "no CPU or disk progress for " +
                                       std::to_string(options_.stall_window_ms) +
                                       " ms; process group killed and reaped; " + evidence());
  }
  if (WIFSIGNALED(status)) {
    return fail(kMintChildCrashed,
                "signal=" + std::to_string(WTERMSIG(status)) + "; " + evidence());
  }
  out.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  auto text = ReadFile(req.report);
  auto report =
      text.ok() ? ParseMintChildReport(*text, req.report) : Result<MintChildReport>(text.status());
  if (report.ok()) out.report = *report;
  switch (out.exit_code) {
    case kMintExitMinted:
      if (!report.ok() || out.report.artifact.empty() ||
          !std::filesystem::exists(out.report.artifact)) {
        return fail(kMintChildCrashed, "exit 0 without an artifact; " + evidence());
      }
      out.ms = MsSince(start);
      return out;
    case kMintExitRefused:
      return fail(
          report.ok() && !out.report.token.empty() ? out.report.token.c_str() : "mint_refused",
          report.ok() ? out.report.message : "exit 2, no report");
    case kMintExitResource:
      return fail(kMintResourceExhausted, report.ok() ? out.report.message : "exit 3, no report");
    case kMintExitBadRequest:
      return fail(kMintBadRequest, report.ok() ? out.report.message : "exit 4; see " + log);
    default:
      return fail(kMintChildCrashed, "exit " + std::to_string(out.exit_code) + "; " + evidence());
  }
}

}  // namespace kiln
