// A real `kiln hub` child process on loopback for the end-to-end hub tests (hub_api_test,
// hub_dashboard_test), and the helpers they share: the binary under test ($KILN_HUB_BINARY, else
// the built `kiln`), a per-run nonce, free ports and the test tokens.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "src/kiln/base/file.h"
#include "src/kiln/base/sha256.h"
#include "src/kiln/client/hub_client.h"

namespace kiln::hub_testing {

inline std::string Binary() {
  const char* env = std::getenv("KILN_HUB_BINARY");
  return env && *env ? env : KILN_BINARY;
}

inline std::string Nonce() {
  static const std::string n =
      std::to_string(std::random_device{}()) + "-" + std::to_string(::getpid());
  return n;
}
// A graph axis unique to this run (PostgreSQL databases outlive a run).
inline std::string Graph(const std::string& name) {
  return Sha256Hex(Nonce() + name).substr(0, 16);
}

// A loopback port nothing holds now, for a server the test starts next. Picked below the kernel's
// ephemeral range (/proc/sys/net/ipv4/ip_local_port_range): a port inside it may be handed to any
// process's outgoing connection between this probe and the server's bind (CI saw `Address
// already in use` that way), while a port below it is only ever taken by an explicit bind. Falls
// back to a kernel-chosen port when nothing below the range is free.
inline int FreePort() {
  auto bound = [](int port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    int got = -1;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
      socklen_t len = sizeof(a);
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
      got = ntohs(a.sin_port);
    }
    ::close(fd);
    return got;
  };
  int ephemeral_low = 32768;
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> ephemeral_low;
  constexpr int kLow = 10000;
  if (ephemeral_low > kLow + 1000) {
    // Never the same port twice in one test process (two servers of one test, not yet bound).
    static std::mutex mu;
    static std::set<int> given;
    static std::mt19937 rng(std::random_device{}() ^ static_cast<unsigned>(::getpid()));
    std::lock_guard<std::mutex> lock(mu);
    for (int i = 0; i < 256; ++i) {
      const int port = kLow + static_cast<int>(rng() % static_cast<unsigned>(ephemeral_low - kLow));
      if (given.count(port) == 0 && bound(port) == port) {
        given.insert(port);
        return port;
      }
    }
  }
  return bound(0);
}

// Holds a loopback port bound but not listening: connections to it are refused, and no other
// process (a parallel test's hub or worker) can take it before this test's hub starts there. The
// socket is close-on-exec, so a process the test starts meanwhile does not keep it bound.
class ReservedPort {
 public:
  ReservedPort() : fd_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    socklen_t len = sizeof(a);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
  }
  ~ReservedPort() { Release(); }
  void Release() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  int port() const { return port_; }

 private:
  int fd_;
  int port_ = 0;
};

inline constexpr const char* kPlatform = "tok-platform-publisher";
inline constexpr const char* kAcme = "tok-acme-publisher";
inline constexpr const char* kBeta = "tok-beta-publisher";
inline constexpr const char* kWorker = "tok-worker";
inline constexpr const char* kAdmin = "tok-admin";
// Least-privilege worker tokens of two tenants (tests/worker/worker_process.h's hub lists them).
inline constexpr const char* kAcmeFleet = "tok-acme-fleet-worker";
inline constexpr const char* kBetaFleet = "tok-beta-fleet-worker";

// Result<T> has no value_or; logs only.
template <typename T>
T ValueOr(const Result<T>& r, T fallback) {
  return r.ok() ? r.value() : fallback;
}

// One `kiln hub` child process.
class HubProcess {
 public:
  // `extra_args` is appended to the command line (e.g. {"--rebuild", "off"} for tests that publish
  // the fixtures' cells, whose shared objects are not built from their sources).
  HubProcess(std::string data_dir, std::string db_url, std::vector<std::string> extra_args = {})
      : data_(std::move(data_dir)), db_(std::move(db_url)), extra_(std::move(extra_args)) {}
  ~HubProcess() { Kill(SIGKILL); }
  // Serve HTTPS with this certificate and key; clients verify against `ca` and dial localhost.
  void UseTls(const std::string& cert, const std::string& key, const std::string& ca) {
    extra_.insert(extra_.end(), {"--tls-cert", cert, "--tls-key", key});
    ca_ = ca;
  }
  // More `kiln hub` arguments.
  void AddArgs(const std::vector<std::string>& args) {
    extra_.insert(extra_.end(), args.begin(), args.end());
  }
  pid_t pid() const { return pid_; }
  const std::string& ca() const { return ca_; }

  // Starts the process on `port` (0: a free one) and waits until /v1/health answers.
  ::testing::AssertionResult Start(int port = 0) {
    port_ = port != 0 ? port : FreePort();
    const std::string log = data_ + "/hub-" + std::to_string(port_) + ".log";
    pid_ = ::fork();
    if (pid_ == 0) {
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      std::vector<std::string> args = {Binary(),    "hub",
                                       "--data",    data_,
                                       "--port",    std::to_string(port_),
                                       "--bind",    "127.0.0.1",
                                       "--tokens",  data_ + "/../tokens.json",
                                       "--threads", "40"};
      if (!db_.empty()) args.insert(args.end(), {"--db", db_});
      args.insert(args.end(), extra_.begin(), extra_.end());
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    auto client = Client("");
    for (int i = 0; i < 200; ++i) {
      if (client->Call("GET", "/v1/health").ok()) return ::testing::AssertionSuccess();
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return ::testing::AssertionFailure()
               << "kiln hub exited early: " << ValueOr(ReadFile(log), std::string());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return ::testing::AssertionFailure()
           << "kiln hub did not become healthy; log: " << ValueOr(ReadFile(log), std::string());
  }
  void Kill(int sig) {
    if (pid_ <= 0) return;
    ::kill(pid_, sig);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  // The process was reaped elsewhere: nothing is left to kill.
  void Forget() { pid_ = -1; }
  // This process's output so far (the file Start writes it to).
  std::string Log() const {
    return ValueOr(ReadFile(data_ + "/hub-" + std::to_string(port_) + ".log"), std::string());
  }
  std::string url() const {
    return (ca_.empty() ? "http://127.0.0.1:" : "https://localhost:") + std::to_string(port_);
  }
  int port() const { return port_; }
  std::unique_ptr<HubClient> Client(const std::string& token) const {
    HubClientOptions o;
    o.url = url();
    o.token = token;
    o.ca_file = ca_;
    o.connect_timeout_s = 2;
    o.io_timeout_s = 20;
    return HubClient::Create(o).value();
  }

 private:
  std::string data_, db_;
  std::vector<std::string> extra_;
  std::string ca_;
  pid_t pid_ = -1;
  int port_ = 0;
};

}  // namespace kiln::hub_testing
