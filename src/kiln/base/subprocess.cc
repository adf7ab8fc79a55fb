// Subprocesses through posix_spawn (see subprocess.h).
#include "src/kiln/base/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

extern char** environ;

namespace kiln {

namespace {

// A child starts with no signal blocked: a serving process blocks its stop signals for its
// sigwait (base/signals.h), and a mask survives exec, so without this a child would ignore the
// SIGTERM that stops it.
class UnblockedSignals {
 public:
  UnblockedSignals() {
    posix_spawnattr_init(&attr_);
    sigset_t none;
    sigemptyset(&none);
    posix_spawnattr_setsigmask(&attr_, &none);
    posix_spawnattr_setflags(&attr_, POSIX_SPAWN_SETSIGMASK);
  }
  ~UnblockedSignals() { posix_spawnattr_destroy(&attr_); }
  UnblockedSignals(const UnblockedSignals&) = delete;
  UnblockedSignals& operator=(const UnblockedSignals&) = delete;
  const posix_spawnattr_t* get() const { return &attr_; }

 private:
  posix_spawnattr_t attr_;
};

}  // namespace

Result<int> RunProcess(const std::vector<std::string>& argv, std::string* output,
                       const std::string& cwd) {
  if (argv.empty()) return Status::InvalidArgument("RunProcess: empty argv");
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) != 0) {
    return Status::IOError(std::string("pipe for '") + argv[0] + "': " + std::strerror(errno));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  // dup2 clears O_CLOEXEC on the copies, so the child keeps exactly fds 1 and 2 of the pipe.
  posix_spawn_file_actions_adddup2(&actions, pipefd[1], 1);
  posix_spawn_file_actions_adddup2(&actions, pipefd[1], 2);
  if (!cwd.empty()) posix_spawn_file_actions_addchdir_np(&actions, cwd.c_str());
  pid_t pid = -1;
  const UnblockedSignals attr;
  const int rc = ::posix_spawn(&pid, args[0], &actions, attr.get(), args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(pipefd[1]);
  if (rc != 0) {
    ::close(pipefd[0]);
    return Status::ResourceExhausted("cannot start '" + argv[0] + "': " + std::strerror(rc));
  }
  char buf[4096];
  ssize_t n;
  while ((n = ::read(pipefd[0], buf, sizeof(buf))) != 0) {
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (output) output->append(buf, static_cast<size_t>(n));
  }
  ::close(pipefd[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

Result<pid_t> SpawnWithLog(const std::vector<std::string>& argv,
                           const std::vector<std::string>& env_overrides,
                           const std::string& log_path) {
  if (argv.empty()) return Status::InvalidArgument("SpawnWithLog: empty argv");
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  // The environment: every inherited entry whose name is not overridden, then the overrides.
  std::vector<std::string> names;
  for (const auto& e : env_overrides) names.push_back(e.substr(0, e.find('=') + 1));
  std::vector<char*> env;
  for (char** e = environ; *e != nullptr; ++e) {
    bool overridden = false;
    for (const auto& n : names) overridden |= std::strncmp(*e, n.c_str(), n.size()) == 0;
    if (!overridden) env.push_back(*e);
  }
  for (const auto& e : env_overrides) env.push_back(const_cast<char*>(e.c_str()));
  env.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = -1;
  const UnblockedSignals attr;
  const int rc = ::posix_spawn(&pid, args[0], &actions, attr.get(), args.data(), env.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    return Status::ResourceExhausted("cannot start '" + argv[0] + "': " + std::strerror(rc));
  }
  return pid;
}

std::string SelfExe() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

}  // namespace kiln
