// Real `kiln worker` and `kiln hub` child processes on loopback for the worker end-to-end tests
// (mint_e2e_test.cc): a worker started from a manifest with its own cache directory (one
// "machine" each) and environment, KServe calls against it, its event rows read back from the
// JSON-lines file it writes, and a hub that can be stopped and restarted on the same port.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "src/kiln/base/file.h"
#include "src/kiln/base/sha256.h"
#include "src/kiln/tensor/tensor.h"
#include "tests/hub/hub_process.h"

namespace kiln::worker_testing {

using hub_testing::Binary;
using hub_testing::FreePort;

// Runs `kiln args...` with KILN_CACHE_DIR=cache; returns (exit code, output).
inline std::pair<int, std::string> Kiln(const std::string& cache, const std::string& args) {
  const std::string cmd = "KILN_CACHE_DIR=" + cache + " " + Binary() + " " + args + " 2>&1";
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  char buf[4096];
  size_t n;
  while (p && (n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = p ? ::pclose(p) : -1;
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// Starts `argv` as a child with `env` added to this process's environment and its output in
// `log`. Returns the pid.
inline pid_t Spawn(std::vector<std::string> args, const std::map<std::string, std::string>& env,
                   const std::string& log) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return pid;
}

// A hub whose port survives a restart (the hub-down-during-publish story).
class Hub {
 public:
  explicit Hub(std::string root) : root_(std::move(root)) {}
  ~Hub() { Stop(SIGKILL); }
  // Tokens: kPlatform (a platform publisher, which the minting workers use) and kWorker.
  static ::testing::AssertionResult WriteTokens(const std::string& path) {
    nlohmann::json tokens = {
        {"tokens",
         {{{"name", "ci"},
           {"role", "publisher"},
           {"tier", "platform"},
           {"sha256", Sha256Hex(hub_testing::kPlatform)}},
          {{"name", "worker"}, {"role", "worker"}, {"sha256", Sha256Hex(hub_testing::kWorker)}}}}};
    if (!WriteFileAtomic(path, tokens.dump(2)).ok()) {
      return ::testing::AssertionFailure() << "cannot write " << path;
    }
    return ::testing::AssertionSuccess();
  }
  ::testing::AssertionResult Start() {
    if (port_ == 0) port_ = FreePort();
    if (!MakeDirs(root_ + "/data").ok()) return ::testing::AssertionFailure() << "mkdir";
    if (auto w = WriteTokens(root_ + "/tokens.json"); !w) return w;
    pid_ = Spawn({Binary(), "hub", "--data", root_ + "/data", "--port", std::to_string(port_),
                  "--bind", "127.0.0.1", "--tokens", root_ + "/tokens.json", "--threads", "8"},
                 {}, root_ + "/hub.log");
    auto client = Client("");
    for (int i = 0; i < 200; ++i) {
      if (client->Call("GET", "/v1/health").ok()) return ::testing::AssertionSuccess();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return ::testing::AssertionFailure()
           << "hub did not start: "
           << hub_testing::ValueOr(ReadFile(root_ + "/hub.log"), std::string());
  }
  void Stop(int sig = SIGTERM) {
    if (pid_ <= 0) return;
    ::kill(pid_, sig);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::unique_ptr<HubClient> Client(const std::string& token) const {
    HubClientOptions o;
    o.url = url();
    o.token = token;
    o.connect_timeout_s = 2;
    o.io_timeout_s = 20;
    return HubClient::Create(o).value();
  }
  // How many rows the hub's dashboard lists for `key` in its cells table.
  int CellRows(const std::string& key) const {
    httplib::Client http("127.0.0.1", port_);
    http.set_read_timeout(30, 0);
    auto r = http.Get("/");
    for (int i = 0; i < 5 && (!r || r->status != 200); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      r = http.Get("/");
    }
    if (!r || r->status != 200) return -1;
    int rows = 0;
    const std::string marker = "<tr class=\"cell\"><td><code>" + key;
    for (size_t at = r->body.find(marker); at != std::string::npos;
         at = r->body.find(marker, at + 1)) {
      ++rows;
    }
    return rows;
  }

 private:
  std::string root_;
  pid_t pid_ = -1;
  int port_ = 0;
};

// The manifest of examples/<example> with absolute paths, plus `extra` TOML appended.
inline std::string ExampleManifest(const std::string& example, const std::string& extra) {
  const std::string dir = std::string(KILN_SOURCE_DIR) + "/examples/" + example + "/";
  std::string text = hub_testing::ValueOr(ReadFile(dir + "kiln.toml"), std::string());
  for (const char* rel : {"model.onnx", "checkpoint.safetensors"}) {
    const std::string from = std::string("\"") + rel + "\"";
    for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + 1)) {
      text.replace(at, from.size(), "\"" + dir + rel + "\"");
    }
  }
  return text + "\n" + extra;
}

// One event row, reduced to what the tests compare.
struct Row {
  std::string kind, phase, target, detail;
  double duration_ms = 0;
  bool operator==(const Row& o) const { return kind == o.kind && phase == o.phase; }
};

inline std::ostream& operator<<(std::ostream& os, const Row& r) {
  return os << r.kind << "/" << r.phase;
}

// One `kiln worker` process with its own cache directory ("machine").
class Worker {
 public:
  Worker(std::string dir, std::string manifest_text, std::map<std::string, std::string> env = {})
      : dir_(std::move(dir)), manifest_(std::move(manifest_text)), env_(std::move(env)) {}
  ~Worker() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  // Writes the manifest, starts the worker and waits until /v2/health/live answers.
  ::testing::AssertionResult Start() {
    if (!MakeDirs(dir_).ok()) return ::testing::AssertionFailure() << "mkdir " << dir_;
    if (!WriteFileAtomic(dir_ + "/kiln.toml", manifest_).ok()) {
      return ::testing::AssertionFailure() << "cannot write the manifest";
    }
    port_ = FreePort();
    std::map<std::string, std::string> env = env_;
    env["KILN_CACHE_DIR"] = dir_;
    pid_ = Spawn({Binary(), "worker", "--manifest", dir_ + "/kiln.toml", "--port",
                  std::to_string(port_), "--events", dir_ + "/events.jsonl"},
                 env, dir_ + "/worker.log");
    httplib::Client http("127.0.0.1", port_);
    for (int i = 0; i < 600; ++i) {
      auto r = http.Get("/v2/health/live");
      if (r && r->status == 200) return ::testing::AssertionSuccess();
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return ::testing::AssertionFailure() << "worker exited: " << Log();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return ::testing::AssertionFailure() << "worker did not come up: " << Log();
  }
  // SIGTERM, drain; the exit code (or -1).
  int Stop() {
    if (pid_ <= 0) return -1;
    ::kill(pid_, SIGTERM);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  pid_t pid() const { return pid_; }
  std::string Log() const {
    return hub_testing::ValueOr(ReadFile(dir_ + "/worker.log"), std::string());
  }

  // POST infer with one FP32 JSON tensor; the parsed answer plus its HTTP status and latency.
  struct Answer {
    int status = 0;
    nlohmann::json body;
    double ms = 0;
    std::string mode() const {
      return body.contains("parameters") ? body["parameters"].value("serving_mode", "") : "";
    }
    std::string reason() const {
      return body.contains("parameters") ? body["parameters"].value("fallback_reason", "") : "";
    }
    std::string ref() const {
      return body.contains("parameters") ? body["parameters"].value("served_cell_ref", "") : "";
    }
  };
  Answer Infer(const std::string& model, const std::map<std::string, Tensor>& inputs) const {
    nlohmann::json req = {{"inputs", nlohmann::json::array()}};
    for (const auto& [name, t] : inputs) {
      nlohmann::json data = nlohmann::json::array();
      for (int64_t i = 0; i < t.numel(); ++i) data.push_back(t.GetAsDouble(i));
      req["inputs"].push_back(
          {{"name", name}, {"shape", t.shape()}, {"datatype", "FP32"}, {"data", data}});
    }
    httplib::Client http("127.0.0.1", port_);
    http.set_read_timeout(60, 0);
    const auto start = std::chrono::steady_clock::now();
    auto r = http.Post("/v2/models/" + model + "/infer", req.dump(), "application/json");
    Answer a;
    a.ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (!r) return a;
    a.status = r->status;
    a.body = nlohmann::json::parse(r->body, nullptr, false);
    return a;
  }

  // The rows on disk, in seq order.
  std::vector<Row> Rows() const {
    std::vector<Row> rows;
    const std::string text = hub_testing::ValueOr(ReadFile(dir_ + "/events.jsonl"), std::string());
    for (size_t at = 0; at < text.size();) {
      size_t end = text.find('\n', at);
      if (end == std::string::npos) end = text.size();
      auto j = nlohmann::json::parse(text.substr(at, end - at), nullptr, false);
      at = end + 1;
      if (!j.is_object()) continue;
      rows.push_back({j.value("kind", ""), j.value("phase", ""), j.value("target", ""),
                      j.value("detail", ""), j.value("duration_ms", 0.0)});
    }
    return rows;
  }
  // The rows whose kind is not in `skip`.
  std::vector<Row> RowsWithout(const std::vector<std::string>& skip) const {
    std::vector<Row> out;
    for (const Row& r : Rows()) {
      if (std::find(skip.begin(), skip.end(), r.kind) == skip.end()) out.push_back(r);
    }
    return out;
  }
  // Waits for a row of `kind` (and `phase`, when given); false after `timeout_ms`.
  bool WaitForRow(const std::string& kind, const std::string& phase, int timeout_ms,
                  Row* found = nullptr) const {
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (true) {
      for (const Row& r : Rows()) {
        if (r.kind == kind && (phase.empty() || r.phase == phase)) {
          if (found != nullptr) *found = r;
          return true;
        }
      }
      if (std::chrono::steady_clock::now() >= until) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  // The pids of this worker's mint children (`kiln mint --child`).
  std::vector<pid_t> MintChildren() const {
    std::vector<pid_t> out;
    for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
      const std::string name = entry.path().filename();
      if (name.empty() || !std::isdigit(static_cast<unsigned char>(name[0]))) continue;
      const std::string stat =
          hub_testing::ValueOr(ReadFile("/proc/" + name + "/stat"), std::string());
      const size_t paren = stat.rfind(')');
      if (paren == std::string::npos) continue;
      std::istringstream in(stat.substr(paren + 2));
      std::string state;
      long long ppid = 0;
      in >> state >> ppid;
      if (ppid != pid_) continue;
      const std::string cmd =
          hub_testing::ValueOr(ReadFile("/proc/" + name + "/cmdline"), std::string());
      if (cmd.find("--child") != std::string::npos) out.push_back(std::stoi(name));
    }
    return out;
  }

 private:
  std::string dir_, manifest_;
  std::map<std::string, std::string> env_;
  pid_t pid_ = -1;
  int port_ = 0;
};

inline std::vector<Row> Expect(std::initializer_list<std::pair<const char*, const char*>> rows) {
  std::vector<Row> out;
  for (const auto& [k, p] : rows) out.push_back({k, p, "", "", 0});
  return out;
}

}  // namespace kiln::worker_testing
