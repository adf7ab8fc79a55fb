// The worker's broker process (see broker.h).
#include "src/kiln/worker/broker.h"

#include <linux/capability.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "src/kiln/base/file.h"
#include "src/kiln/base/log.h"
#include "src/kiln/base/secret_scan.h"
#include "src/kiln/base/subprocess.h"
#include "src/kiln/cell/store.h"
#include "src/kiln/client/hub_broker.h"
#include "src/kiln/worker/publisher.h"

extern char** environ;

namespace kiln {
namespace {

// 32 random bytes, hex: the relay's capability.
Result<std::string> NewCapability() {
  unsigned char bytes[32];
  if (::getrandom(bytes, sizeof(bytes), 0) != static_cast<ssize_t>(sizeof(bytes))) {
    return Status::IOError("hub broker: getrandom failed");
  }
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char b : bytes) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 15]);
  }
  return out;
}

// This process's argv as it was started (/proc/self/cmdline).
Result<std::vector<std::string>> OwnArgs() {
  KILN_ASSIGN_OR_RETURN(std::string text, ReadFile("/proc/self/cmdline"));
  std::vector<std::string> args;
  for (size_t at = 0; at < text.size();) {
    const size_t end = text.find('\0', at);
    args.push_back(text.substr(at, end == std::string::npos ? std::string::npos : end - at));
    if (end == std::string::npos) break;
    at = end + 1;
  }
  return args;
}

// The serving process's argv: this process's, its manifest replaced by `manifest`, and the
// flags that make it the serving half.
std::vector<std::string> ServingArgs(std::vector<std::string> args, const std::string& manifest,
                                     const std::string& base_dir,
                                     const std::string& mint_manifest) {
  std::vector<std::string> out;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--manifest" && i + 1 < args.size()) {
      out.push_back(args[i]);
      out.push_back(manifest);
      ++i;
    } else if (args[i].rfind("--manifest=", 0) == 0) {
      out.push_back("--manifest=" + manifest);
    } else {
      out.push_back(args[i]);
    }
  }
  if (!out.empty()) out[0] = SelfExe();
  out.insert(out.end(), {"--serving-child", "--manifest-base-dir", base_dir, "--mint-manifest",
                         mint_manifest});
  return out;
}

// This process's environment without the variable `token_env` and without any variable whose
// value is the token (one a wrapper script exported under another name). Only equal values: a
// value that merely contains a short token (an admin token "<token>-admin") is another secret.
std::vector<std::string> EnvironmentWithout(const std::string& token,
                                            const std::string& token_env) {
  std::vector<std::string> out;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string entry = *e;
    const size_t eq = entry.find('=');
    if (eq == std::string::npos) continue;
    if (!token_env.empty() && eq == token_env.size() && entry.compare(0, eq, token_env) == 0) {
      continue;
    }
    if (entry.compare(eq + 1, std::string::npos, token) == 0) continue;
    out.push_back(entry);
  }
  return out;
}

// Ends this process as the serving process ended (wait status `status`).
[[noreturn]] void EndLike(int status) {
  std::fflush(stdout);
  std::fflush(stderr);
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    ::signal(sig, SIG_DFL);
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, sig);
    ::pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
    ::raise(sig);
    std::_Exit(128 + sig);
  }
  std::_Exit(WIFEXITED(status) ? WEXITSTATUS(status) : 1);
}

}  // namespace

bool WantsBroker(const Manifest& manifest) {
  return manifest.hub.has_value() && !manifest.hub->token.empty();
}

Status RunBroker(const WorkerConfig& config, const Manifest& m) {
  // Another process of this user (a cell in the serving process among them) may not read this
  // one's memory through /proc/<pid>/mem or attach to it.
  ::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  // Before the relay's threads start, so only the sigwait below receives these.
  sigset_t watched;
  sigemptyset(&watched);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD}) sigaddset(&watched, sig);
  ::pthread_sigmask(SIG_BLOCK, &watched, nullptr);

  KILN_ASSIGN_OR_RETURN(std::string capability, NewCapability());
  HubBrokerOptions bo;
  bo.hub.url = m.hub->url;
  bo.hub.token = m.hub->token;
  bo.hub.ca_file = m.hub->ca;
  bo.hub.insecure_http = m.hub->insecure_http;
  bo.hub.io_timeout_s = m.hub->timeout_ms / 1000.0;
  bo.hub.connect_timeout_s = std::min(bo.hub.io_timeout_s, 3.0);
  bo.capability = capability;
  bo.publish_io_timeout_s = kPublishTimeoutS;
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<HubBroker> relay, HubBroker::Start(bo));

  // The copies of the manifest, in a directory only this user may enter.
  KILN_ASSIGN_OR_RETURN(std::string store_root, DefaultStoreRoot());
  KILN_RETURN_IF_ERROR(MakeDirs(store_root));
  std::string dir = store_root + "/.broker-XXXXXX";
  if (::mkdtemp(dir.data()) == nullptr) {
    return Status::IOError("hub broker: cannot create a private directory under '" + store_root +
                           "': " + std::strerror(errno));
  }
  struct RemoveDir {
    std::string dir;
    void Now() {
      std::error_code ec;
      if (!dir.empty()) std::filesystem::remove_all(dir, ec);
      dir.clear();
    }
    ~RemoveDir() { Now(); }
  } remove_dir{dir};
  KILN_ASSIGN_OR_RETURN(std::string text, ReadFile(config.manifest));
  KILN_ASSIGN_OR_RETURN(
      std::string serving_text,
      ManifestWithHub(text, config.manifest, "http://127.0.0.1:" + std::to_string(relay->port()),
                      capability));
  KILN_ASSIGN_OR_RETURN(std::string mint_text, ManifestWithHub(text, config.manifest, "", ""));
  const std::string serving_manifest = dir + "/serving.toml";
  const std::string mint_manifest = dir + "/mint.toml";
  KILN_RETURN_IF_ERROR(WriteSecretFileAtomic(serving_manifest, serving_text));
  KILN_RETURN_IF_ERROR(WriteSecretFileAtomic(mint_manifest, mint_text));
  // Test switch (base/secret_scan.h): the broker holds the token, so its scan must find it.
  if (Status scan = WriteSecretScanReportFromEnv("broker"); !scan.ok()) {
    LogWarn("secret scan: " + scan.ToString());
  }

  KILN_ASSIGN_OR_RETURN(std::vector<std::string> own, OwnArgs());
  std::vector<std::string> args = ServingArgs(own, serving_manifest, m.base_dir, mint_manifest);
  std::vector<std::string> env = EnvironmentWithout(m.hub->token, m.hub->token_env);
  // Everything exec needs is made before the fork: the relay's threads are running.
  std::vector<char*> argv, envp;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  sigset_t child_only;
  sigemptyset(&child_only);
  sigaddset(&child_only, SIGCHLD);
  const pid_t self = ::getpid();
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t child = ::fork();
  if (child < 0) return Status::IOError("hub broker: fork failed: " + std::string(strerror(errno)));
  if (child == 0) {
    // The stop signals stay blocked across exec (the serving process waits for them itself).
    ::prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    // A broker running as root: the serving process (and its mint children) may not hold
    // CAP_SYS_PTRACE, which would let it read this non-dumpable process's memory after all.
    // Without the capability in the bounding set, exec cannot give it back. (Where the drop is
    // not allowed — no CAP_SETPCAP — a broker that holds CAP_SYS_PTRACE anyway passes it on:
    // docs/trust.md says to run workers as an unprivileged user.)
    ::prctl(PR_CAPBSET_DROP, CAP_SYS_PTRACE, 0, 0, 0);
    if (::getppid() != self) ::_exit(127);
    ::pthread_sigmask(SIG_UNBLOCK, &child_only, nullptr);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  std::printf("kiln worker: hub token held by this broker (pid %d); serving process pid %d\n",
              static_cast<int>(self), static_cast<int>(child));
  std::fflush(stdout);
  int status = 0;
  while (true) {
    int sig = 0;
    if (::sigwait(&watched, &sig) != 0) continue;
    if (sig == SIGCHLD) {
      if (::waitpid(child, &status, WNOHANG) == child) break;
      continue;
    }
    ::kill(child, sig);
  }
  relay->Stop();
  relay.reset();
  remove_dir.Now();
  EndLike(status);
}

}  // namespace kiln
