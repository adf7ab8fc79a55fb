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

#include "src/kiln/base/clock.h"
#include "src/kiln/base/file.h"
#include "src/kiln/base/subprocess.h"

namespace kiln {

namespace {

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

// A started child: its process (group) id, the read end of its stdout (the frames) and the write
// end of its lifeline; or why none started.
struct Spawned {
  pid_t pid = -1;
  int frames_fd = -1;
  int alive_fd = -1;
  std::string error;
};

// fork + exec of `<binary> mint --child <request_path> --parent-alive-fd 3` in its own process
// group, below the serving process's priority, stdout a pipe, stderr `log`, dying with this
// process (PR_SET_PDEATHSIG and the lifeline). Everything the child needs is prepared before the
// fork: only async-signal-safe calls after it.
Spawned SpawnChild(const std::string& binary, const std::string& request_path,
                   const std::string& log, int child_nice) {
  Spawned out;
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) {
    out.error = std::string("pipe: ") + std::strerror(errno);
    return out;
  }
  // The child's lifeline (protocol.h): the parent holds the write end until it has reaped the
  // child; the child sees end of file only when the parent is gone.
  int alive_fds[2];
  if (::pipe2(alive_fds, O_CLOEXEC) != 0) {
    ::close(pipe_fds[0]);
    ::close(pipe_fds[1]);
    out.error = std::string("pipe: ") + std::strerror(errno);
    return out;
  }
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
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(pipe_fds[0]);
    ::close(pipe_fds[1]);
    ::close(alive_fds[0]);
    ::close(alive_fds[1]);
    if (log_fd >= 0) ::close(log_fd);
    out.error = std::string("fork: ") + std::strerror(errno);
    return out;
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
  out.pid = pid;
  out.frames_fd = pipe_fds[0];
  out.alive_fd = alive_fds[1];
  return out;
}

// How a watched child ended.
struct Watched {
  int status = 0;        // waitpid's
  bool stalled = false;  // killed by the watchdog
  int frames = 0;
  std::string last_frame;
};

// The watchdog: frames read off `frames_fd`, the group's progress sampled every `sample_ms`, the
// group killed and reaped once it shows none for `stall_window_ms`. No total time limit.
Watched WatchChild(pid_t pid, int frames_fd, int sample_ms, int64_t stall_window_ms) {
  Watched out;
  std::string pending;
  uint64_t last_progress = GroupProgress(pid);
  Clock::TimePoint last_change = Clock::Real()->Now();
  bool pipe_open = true;
  while (true) {
    if (pipe_open) {
      pollfd p{frames_fd, POLLIN, 0};
      if (::poll(&p, 1, sample_ms) > 0) {
        char buf[4096];
        const ssize_t n = ::read(frames_fd, buf, sizeof(buf));
        if (n <= 0) {
          pipe_open = false;
        } else {
          pending.append(buf, static_cast<size_t>(n));
          for (size_t nl; (nl = pending.find('\n')) != std::string::npos;) {
            const std::string line = pending.substr(0, nl);
            pending.erase(0, nl + 1);
            if (line.rfind(kMintFramePrefix, 0) == 0) {
              ++out.frames;
              out.last_frame = line.substr(std::strlen(kMintFramePrefix));
            }
          }
        }
      }
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(sample_ms));
    }
    if (::waitpid(pid, &out.status, WNOHANG) == pid) return out;
    const uint64_t progress = GroupProgress(pid);
    if (progress != last_progress) {
      last_progress = progress;
      last_change = Clock::Real()->Now();
    } else if (MsSince(last_change) > stall_window_ms) {
      out.stalled = true;
      ::kill(-pid, SIGKILL);
      ::waitpid(pid, &out.status, 0);
      return out;
    }
  }
}

// The ending judged into an outcome: the watchdog's kill, a signal, or the exit code with the
// child's report (and, for a crash or a stall, the evidence it left: its last frame and the
// phases it finished).
MintChildOutcome JudgeEnding(const Watched& watched, const MintChildRequest& req,
                             const std::string& log, int64_t stall_window_ms, MintChildOutcome out,
                             Clock::TimePoint start) {
  auto fail = [&](const char* phase, std::string detail) {
    out.phase = phase;
    out.detail = std::move(detail);
    out.ms = MsSince(start);
    return out;
  };
  auto evidence = [&] {
    auto phases = ReadFile(req.phases);
    std::string s =
        "last_frame=" + (watched.last_frame.empty() ? std::string("none") : watched.last_frame);
    if (phases.ok()) {
      auto live = ParseMintChildReport(*phases, req.phases);
      if (live.ok()) s += " phases_done=\"" + MintPhasesDetail(*live) + "\"";
    }
    return s;
  };
  const int status = watched.status;
  if (watched.stalled) {
    return fail(kMintChildStalled, "no CPU or disk progress for " +
                                       std::to_string(stall_window_ms) +
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
  const Clock::TimePoint start = Clock::Real()->Now();
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
  const std::string log = dir + "/child.log";
  const Spawned child = SpawnChild(options_.binary.empty() ? SelfExe() : options_.binary,
                                   request_path, log, options_.child_nice);
  if (child.pid < 0) return fail(kMintSpawnFailed, child.error);
  {
    std::lock_guard<std::mutex> lock(mu_);
    children_.insert(child.pid);
    if (stopping_) ::kill(-child.pid, SIGKILL);
  }
  const Watched watched =
      WatchChild(child.pid, child.frames_fd, options_.sample_ms, options_.stall_window_ms);
  ::kill(-child.pid, SIGKILL);  // nothing of the group outlives the mint (a compiler grandchild)
  ::close(child.frames_fd);
  ::close(child.alive_fd);
  {
    std::lock_guard<std::mutex> lock(mu_);
    children_.erase(child.pid);
  }
  out.frames = watched.frames;
  out.ms = MsSince(start);
  return JudgeEnding(watched, req, log, options_.stall_window_ms, std::move(out), start);
}

}  // namespace kiln
