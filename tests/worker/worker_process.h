// Real `kiln worker` and `kiln hub` child processes on loopback for the worker end-to-end tests
// (worker_e2e_test.cc, refusal_e2e_test.cc, mint_e2e_test.cc): a worker started from a manifest
// with its own cache directory (one "machine" each) and environment, KServe and admin calls
// against it, its event rows read back from the JSON-lines file it writes, a hub that can be
// stopped and restarted on the same port, `kiln` runs that mint and publish cells, and a fixture
// giving each test its own temporary root.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
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

// examples/<example>/ with a trailing slash.
inline std::string ExampleDir(const std::string& example) {
  return std::string(KILN_SOURCE_DIR) + "/examples/" + example + "/";
}

// A cell ref's key (the part before '@').
inline std::string KeyOf(const std::string& ref) { return ref.substr(0, ref.find('@')); }

// `kiln mint` of examples/<example> on the machine whose cache directory is `cache`; sets *ref to
// the minted cell's ref (the first word `kiln mint` prints).
inline ::testing::AssertionResult Mint(const std::string& cache, const std::string& example,
                                       std::string* ref) {
  auto mint = Kiln(cache, "mint --manifest " + ExampleDir(example) + "kiln.toml");
  if (mint.first != 0) {
    return ::testing::AssertionFailure()
           << "kiln mint exited " << mint.first << ": " << mint.second;
  }
  *ref = mint.second.substr(0, mint.second.find_first_of(" \n\t"));
  return ::testing::AssertionSuccess();
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

// A `kiln hub` under `root` (data in root/data, tokens in root/tokens.json) whose port survives a
// restart (the hub-down-during-publish story).
class Hub {
 public:
  // `args` are more `kiln hub` flags (e.g. {"--builder-toolchain", "clang++-14"}).
  explicit Hub(std::string root, std::vector<std::string> args = {})
      : root_(std::move(root)), process_(root_ + "/data", "", std::move(args)) {}
  // Tokens: kPlatform (a platform publisher, which `kiln publish` and the minting workers use),
  // kAcme and kBeta (two tenants: publishers of tier org "acme" and "beta"), kWorker and kAdmin.
  // The platform publisher and the worker hold every release. kAcmeFleet and kBetaFleet are the
  // least-privilege fleet tokens: workers of org "acme" (which may write only "acme/mlp") and
  // "beta", each granted every release.
  // `extra` rows are added to the file as they are (AddToken).
  static ::testing::AssertionResult WriteTokens(const std::string& path,
                                                const std::vector<nlohmann::json>& extra = {}) {
    nlohmann::json tokens = {
        {"tokens",
         {{{"name", "ci"},
           {"role", "publisher"},
           {"tier", "platform"},
           {"releases", {"*"}},
           {"sha256", Sha256Hex(hub_testing::kPlatform)}},
          {{"name", "acme-ci"},
           {"role", "publisher"},
           {"tier", "org"},
           {"org", "acme"},
           {"sha256", Sha256Hex(hub_testing::kAcme)}},
          {{"name", "beta-ci"},
           {"role", "publisher"},
           {"tier", "org"},
           {"org", "beta"},
           {"sha256", Sha256Hex(hub_testing::kBeta)}},
          {{"name", "worker"},
           {"role", "worker"},
           {"releases", {"*"}},
           {"sha256", Sha256Hex(hub_testing::kWorker)}},
          {{"name", "acme-fleet"},
           {"role", "worker"},
           {"org", "acme"},
           {"families", {"acme/mlp"}},
           {"releases", {"*"}},
           {"sha256", Sha256Hex(hub_testing::kAcmeFleet)}},
          {{"name", "beta-fleet"},
           {"role", "worker"},
           {"org", "beta"},
           {"releases", {"*"}},
           {"sha256", Sha256Hex(hub_testing::kBetaFleet)}},
          {{"name", "ops"}, {"role", "admin"}, {"sha256", Sha256Hex(hub_testing::kAdmin)}}}}};
    for (const nlohmann::json& row : extra) tokens["tokens"].push_back(row);
    if (!WriteSecretFileAtomic(path, tokens.dump(2)).ok()) {
      return ::testing::AssertionFailure() << "cannot write " << path;
    }
    return ::testing::AssertionSuccess();
  }
  // Starts the hub: on `port` when given, else on a free port the first time and on the same
  // port after a Stop.
  ::testing::AssertionResult Start(int port = 0) {
    if (!MakeDirs(root_ + "/data").ok()) return ::testing::AssertionFailure() << "mkdir";
    if (auto w = WriteTokens(root_ + "/tokens.json", extra_tokens_); !w) return w;
    return process_.Start(port != 0 ? port : process_.port());
  }
  // One more token the hub accepts from its next Start: `row` as in the tokens file, its hash
  // set from `token` (a test's own random token).
  void AddToken(nlohmann::json row, const std::string& token) {
    row["sha256"] = Sha256Hex(token);
    extra_tokens_.push_back(std::move(row));
  }
  void Stop(int sig = SIGTERM) { process_.Kill(sig); }
  hub_testing::HubProcess& process() { return process_; }
  pid_t pid() const { return process_.pid(); }
  std::string url() const { return process_.url(); }
  int port() const { return process_.port(); }
  std::unique_ptr<HubClient> Client(const std::string& token) const {
    return process_.Client(token);
  }
  // Writes the hub's key set (GET /v1/jwks) to `path`, for a worker's [hub] trust list.
  ::testing::AssertionResult WriteJwks(const std::string& path) const {
    auto jwks = Client(hub_testing::kWorker)->GetJwks();
    if (!jwks.ok()) return ::testing::AssertionFailure() << "GET /v1/jwks: " << jwks.message;
    if (!WriteFileAtomic(path, jwks.body.dump()).ok()) {
      return ::testing::AssertionFailure() << "cannot write " << path;
    }
    return ::testing::AssertionSuccess();
  }
  // `kiln mint` of examples/<example> on the machine `cache`, then `kiln publish` of that cell to
  // this hub as the platform publisher; sets *ref to the cell's ref.
  ::testing::AssertionResult MintAndPublish(const std::string& cache, const std::string& example,
                                            std::string* ref) const {
    if (auto m = Mint(cache, example, ref); !m) return m;
    auto pub = Kiln(cache, "publish " + cache + "/cells/" + KeyOf(*ref) + "/cell.tar --hub " +
                               url() + " --token " + hub_testing::kPlatform +
                               (process_.ca().empty() ? "" : " --ca " + process_.ca()));
    if (pub.first != 0) {
      return ::testing::AssertionFailure()
             << "kiln publish exited " << pub.first << ": " << pub.second;
    }
    return ::testing::AssertionSuccess();
  }
  // How many rows the hub's dashboard lists for `key` in its cells table.
  int CellRows(const std::string& key) const {
    httplib::Client http(url());
    if (!process_.ca().empty()) http.set_ca_cert_path(process_.ca().c_str());
    http.set_read_timeout(30, 0);
    http.set_bearer_token_auth(hub_testing::kAdmin);  // the dashboard is not public
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
  std::vector<nlohmann::json> extra_tokens_;
  hub_testing::HubProcess process_;  // SIGKILLed when the Hub goes
};

// What a test changes in an example's manifest.
struct ManifestOptions {
  std::string example = "mlp";
  std::string lane;     // "" = the example's own ("optional")
  std::string sm;       // "" = the worker detects the machine's
  std::string hub_url;  // "" = no [hub] section
  std::string hub_token = hub_testing::kWorker;
  std::string hub_token_env;  // set: `token_env = "<it>"` in place of the token
  int hub_timeout_ms = 0;     // 0 = the worker's default
  std::string trust_path;     // "" = trust the hub's own key set
  std::string family;         // "" = the example's own export family
  std::string hub_extra;      // TOML lines inside [hub] (revocation_poll_s = 1, ...)
  std::string hub_ca;         // "" = no [hub] ca
  std::string extra;          // TOML appended last
  bool eager_only = false;    // the target's `eager_only = true` (the operator's order at boot)
};

// A field of /proc/<pid>/status in kB (VmRSS, VmHWM), or -1.
inline long StatusKb(pid_t pid, const std::string& field) {
  const std::string text =
      hub_testing::ValueOr(ReadFile("/proc/" + std::to_string(pid) + "/status"), std::string());
  const size_t at = text.find(field + ":");
  if (at == std::string::npos) return -1;
  return std::stol(text.substr(at + field.size() + 1));
}

// The `p` quantile (0..1) of `v` by rank; 0 for none.
inline double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

// The manifest of examples/<example> with absolute paths and the options' changes.
inline std::string Manifest(const ManifestOptions& o) {
  const std::string dir = ExampleDir(o.example);
  std::string text = hub_testing::ValueOr(ReadFile(dir + "kiln.toml"), std::string());
  for (const char* rel : {"model.onnx", "checkpoint.safetensors"}) {
    const std::string from = std::string("\"") + rel + "\"";
    for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + 1)) {
      text.replace(at, from.size(), "\"" + dir + rel + "\"");
    }
  }
  if (!o.lane.empty() || !o.sm.empty()) {
    const std::string lane = "lane = \"optional\"";
    const size_t at = text.find(lane);
    if (at != std::string::npos) {
      const std::string to = "lane = \"" + (o.lane.empty() ? "optional" : o.lane) + "\"";
      text.replace(at, lane.size(), o.sm.empty() ? to : to + "\nsm = \"" + o.sm + "\"");
    }
  }
  if (o.eager_only) {
    const size_t at = text.find("\nexport = { family = \"");
    if (at != std::string::npos) text.insert(at, "\neager_only = true");
  }
  if (!o.family.empty()) {
    const size_t at = text.find("export = { family = \"");
    if (at != std::string::npos) {
      const size_t start = at + std::string("export = { family = \"").size();
      text.replace(start, text.find('"', start) - start, o.family);
    }
  }
  if (!o.hub_url.empty()) {
    text += "\n[hub]\nurl = \"" + o.hub_url + "\"\n" +
            (o.hub_token_env.empty() ? "token = \"" + o.hub_token + "\"\n"
                                     : "token_env = \"" + o.hub_token_env + "\"\n");
    if (o.hub_timeout_ms != 0) text += "timeout_ms = " + std::to_string(o.hub_timeout_ms) + "\n";
    if (!o.trust_path.empty()) text += "trust = [\"" + o.trust_path + "\"]\n";
    text += o.hub_extra;
    if (!o.hub_ca.empty()) text += "ca = \"" + o.hub_ca + "\"\n";
  }
  return text + "\n" + o.extra;
}

// One event row, reduced to what the tests compare.
struct Row {
  std::string kind, phase, target, detail;
  double duration_ms = 0;
  uint64_t seq = 0;
  bool operator==(const Row& o) const { return kind == o.kind && phase == o.phase; }
};

inline std::ostream& operator<<(std::ostream& os, const Row& r) {
  return os << r.kind << "/" << r.phase;
}

using KindPhases = std::initializer_list<std::pair<const char*, const char*>>;

// Rows with these kinds and phases, for comparing with what a worker wrote.
inline std::vector<Row> Expect(KindPhases rows) {
  std::vector<Row> out;
  for (const auto& [k, p] : rows) out.push_back({k, p, "", "", 0});
  return out;
}

// The rows of a target whose boot missed (boot_adopt `miss`) and whose child mint then passed
// the strict gate and armed, in order: the miss, the child started, the gate's verdict, the local
// store, the install, the arming and the mint's phases; then `then`.
inline std::vector<Row> MissThenMinted(const char* miss, KindPhases then = {}) {
  std::vector<Row> out = Expect({{"boot_adopt", miss},
                                 {"self_mint_started", "child"},
                                 {"cell_numerics", "HEALTHY"},
                                 {"local_cell_stored", "stored"},
                                 {"serve_posture", "aot_cell"},
                                 {"local_cell_armed", "armed"},
                                 {"mint_phases", "minted"}});
  for (const Row& r : Expect(then)) out.push_back(r);
  return out;
}

// Whether `row`'s detail names `what` (a failure prints the row and its detail).
inline ::testing::AssertionResult DetailNames(const Row& row, const std::string& what) {
  if (row.detail.find(what) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << row << " detail does not name \"" << what << "\": " << row.detail;
}

// The operator token every test worker's admin listener takes.
inline constexpr const char* kAdminToken = "tok-worker-admin";

// One `kiln worker` process with its own cache directory ("machine"): its manifest, event rows
// (events.jsonl) and output (worker.log) live there. It runs with an admin listener on a port of
// its own (token kAdminToken) whose checkpoint directory is `dir`/checkpoints.
class Worker {
 public:
  Worker(std::string dir, std::string manifest_text, std::map<std::string, std::string> env = {},
         std::vector<std::string> args = {})
      : dir_(std::move(dir)),
        manifest_(std::move(manifest_text)),
        env_(std::move(env)),
        args_(std::move(args)) {}
  // Serve HTTPS with this certificate and key; clients verify against `ca`.
  void UseTls(const std::string& cert, const std::string& key, const std::string& ca) {
    args_.insert(args_.end(), {"--tls-cert", cert, "--tls-key", key});
    ca_ = ca;
  }
  // An HTTP(S) client of the serving listener (of the admin listener with `admin`).
  std::unique_ptr<httplib::Client> Http(bool admin = false) const {
    const int port = admin ? admin_port_ : port_;
    auto c = std::make_unique<httplib::Client>(ca_.empty()
                                                   ? "http://127.0.0.1:" + std::to_string(port)
                                                   : "https://localhost:" + std::to_string(port));
    if (!ca_.empty()) {
      c->set_ca_cert_path(ca_.c_str());
      c->enable_server_certificate_verification(true);
    }
    c->set_read_timeout(60, 0);
    return c;
  }
  int port() const { return port_; }
  int admin_port() const { return admin_port_; }
  std::string CheckpointDir() const { return dir_ + "/checkpoints"; }
  ~Worker() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  // Writes the manifest, starts the worker and waits until /v2/health/live answers (boot done:
  // the front end starts after it).
  ::testing::AssertionResult Start() {
    if (!MakeDirs(dir_).ok()) return ::testing::AssertionFailure() << "mkdir " << dir_;
    if (!WriteFileAtomic(dir_ + "/kiln.toml", manifest_).ok()) {
      return ::testing::AssertionFailure() << "cannot write the manifest";
    }
    if (!MakeDirs(CheckpointDir()).ok()) return ::testing::AssertionFailure() << "mkdir";
    port_ = FreePort();
    admin_port_ = FreePort();
    std::map<std::string, std::string> env = env_;
    env["KILN_CACHE_DIR"] = dir_;
    env["KILN_ADMIN_TOKEN"] = kAdminToken;
    std::vector<std::string> argv = {Binary(),           "worker",
                                     "--manifest",       dir_ + "/kiln.toml",
                                     "--port",           std::to_string(port_),
                                     "--events",         EventsPath(),
                                     "--admin-port",     std::to_string(admin_port_),
                                     "--checkpoint-dir", CheckpointDir()};
    argv.insert(argv.end(), args_.begin(), args_.end());
    pid_ = Spawn(argv, env, dir_ + "/worker.log");
    auto http = Http();
    http->set_connection_timeout(1, 0);
    for (int i = 0; i < 600; ++i) {
      auto r = http->Get("/v2/health/live");
      if (r && r->status == 200) {
        serving_pid_ = FindServingChild();
        return ::testing::AssertionSuccess();
      }
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
  // The process this Worker started: the one to signal and reap. With a hub token it is the
  // broker (src/kiln/worker/broker.h), and the cells live in ServingPid().
  pid_t pid() const { return pid_; }
  // The process that serves and loads cells: the broker's serving child, or pid() itself when the
  // worker runs as one process (no hub token).
  pid_t ServingPid() const { return serving_pid_ > 0 ? serving_pid_ : pid_; }
  // The process was reaped elsewhere: nothing is left to kill.
  void Forget() { pid_ = -1; }
  std::string Log() const {
    return hub_testing::ValueOr(ReadFile(dir_ + "/worker.log"), std::string());
  }

  // The HTTP status of GET /v2/health/ready (0: no answer).
  int ReadyStatus() const {
    auto r = Http()->Get("/v2/health/ready");
    return r ? r->status : 0;
  }
  // Waits until /v2/health/ready answers 200; false after `timeout_ms`.
  bool WaitReady(int timeout_ms) const {
    for (int waited = 0; waited < timeout_ms; waited += 50) {
      if (ReadyStatus() == 200) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }

  // An answer: HTTP status (0: none), the parsed body, Retry-After and the latency.
  struct Answer {
    int status = 0;
    nlohmann::json body;
    std::string retry_after;
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
  // POST infer on `model` with FP32 JSON tensors.
  Answer Infer(const std::string& model, const std::map<std::string, Tensor>& inputs) const {
    nlohmann::json req = {{"inputs", nlohmann::json::array()}};
    for (const auto& [name, t] : inputs) {
      nlohmann::json data = nlohmann::json::array();
      for (int64_t i = 0; i < t.numel(); ++i) data.push_back(t.GetAsDouble(i));
      req["inputs"].push_back(
          {{"name", name}, {"shape", t.shape()}, {"datatype", "FP32"}, {"data", data}});
    }
    return Post("/v2/models/" + model + "/infer", req);
  }
  // POST `body` as JSON to `path` on the serving listener (an infer call).
  Answer Post(const std::string& path, const nlohmann::json& body) const {
    return PostTo(*Http(), path, body, {});
  }
  // POST an order to the admin listener with the operator token (`token` overrides it; "" sends
  // none).
  Answer Admin(const std::string& path, const nlohmann::json& body,
               std::optional<std::string> token = std::nullopt) const {
    const std::string t = token.value_or(kAdminToken);
    httplib::Headers h;
    if (!t.empty()) h.emplace("Authorization", "Bearer " + t);
    return PostTo(*Http(/*admin=*/true), path, body, h);
  }
  Answer PostTo(httplib::Client& http, const std::string& path, const nlohmann::json& body,
                const httplib::Headers& headers) const {
    const auto start = std::chrono::steady_clock::now();
    auto r = http.Post(path, headers, body.dump(), "application/json");
    Answer a;
    a.ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (!r) return a;
    a.status = r->status;
    a.body = nlohmann::json::parse(r->body, nullptr, false);
    a.retry_after = r->get_header_value("Retry-After");
    return a;
  }

  std::string EventsPath() const { return dir_ + "/events.jsonl"; }
  // The rows on disk, in file order; a line that does not parse (one a poll reads half written)
  // is passed over.
  std::vector<Row> Rows() const { return ReadRows(false); }
  // The rows on disk once the worker is quiet, each line checked to be a row whose seq is above
  // the one before it (the tests that assert the rows in seq order).
  std::vector<Row> RowsInSeqOrder() const { return ReadRows(true); }
  // The rows whose kind is not in `skip`.
  std::vector<Row> RowsWithout(const std::vector<std::string>& skip) const {
    std::vector<Row> out;
    for (const Row& r : Rows()) {
      if (std::find(skip.begin(), skip.end(), r.kind) == skip.end()) out.push_back(r);
    }
    return out;
  }
  // The first row of `kind` (and `phase`, when given) on disk.
  std::optional<Row> FirstRow(const std::string& kind, const std::string& phase = "") const {
    for (const Row& r : Rows()) {
      if (r.kind == kind && (phase.empty() || r.phase == phase)) return r;
    }
    return std::nullopt;
  }
  // Waits for a row of `kind` (and `phase`, when given); a failure after `timeout_ms` carries
  // the worker's log.
  ::testing::AssertionResult WaitForRow(const std::string& kind, const std::string& phase,
                                        int timeout_ms, Row* found = nullptr) const {
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (true) {
      if (auto r = FirstRow(kind, phase)) {
        if (found != nullptr) *found = *r;
        return ::testing::AssertionSuccess();
      }
      if (std::chrono::steady_clock::now() >= until) {
        return ::testing::AssertionFailure()
               << "no " << kind << (phase.empty() ? "" : "/") << phase << " row after "
               << timeout_ms << " ms; the worker's log:\n"
               << Log();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }

  // Files of cells loaded by this worker (.so files under its machine directory): none may exist
  // when an adoption was refused.
  size_t LoadedCellFiles() const {
    size_t n = 0;
    std::error_code ec;
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir_, ec)) {
      if (e.path().extension() == ".so") ++n;
    }
    return n;
  }
  // True when the process maps any file of its machine directory ending in .so (a dlopened cell).
  bool MapsACell() const {
    const std::string maps = hub_testing::ValueOr(
        ReadFile("/proc/" + std::to_string(ServingPid()) + "/maps"), std::string());
    return maps.find(dir_) != std::string::npos && maps.find(".so") != std::string::npos;
  }
  // The pids of this worker's mint children (`kiln mint --child`).
  std::vector<pid_t> MintChildren() const { return ChildrenWith(ServingPid(), "--child"); }

 private:
  // The children of `parent` whose command line holds `flag`.
  static std::vector<pid_t> ChildrenWith(pid_t parent, const std::string& flag) {
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
      if (ppid != parent) continue;
      std::string cmd = hub_testing::ValueOr(ReadFile("/proc/" + name + "/cmdline"), std::string());
      std::replace(cmd.begin(), cmd.end(), '\0', ' ');
      if ((cmd + " ").find(" " + flag + " ") != std::string::npos) out.push_back(std::stoi(name));
    }
    return out;
  }
  // The broker's serving child, or -1 when the worker runs as one process.
  pid_t FindServingChild() const {
    const std::vector<pid_t> children = ChildrenWith(pid_, "--serving-child");
    return children.empty() ? -1 : children.front();
  }

  // With `checked`, a non-empty line that is not a row, or a seq not above the last, fails the
  // test; without, lines that do not parse are passed over.
  std::vector<Row> ReadRows(bool checked) const {
    std::vector<Row> rows;
    const std::string text = hub_testing::ValueOr(ReadFile(EventsPath()), std::string());
    uint64_t last = 0;
    for (size_t at = 0; at < text.size();) {
      size_t end = text.find('\n', at);
      if (end == std::string::npos) end = text.size();
      const std::string line = text.substr(at, end - at);
      at = end + 1;
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (!j.is_object()) {
        if (checked && !line.empty()) ADD_FAILURE() << "not an event row: " << line;
        continue;
      }
      rows.push_back({j.value("kind", ""), j.value("phase", ""), j.value("target", ""),
                      j.value("detail", ""), j.value("duration_ms", 0.0),
                      j.value("seq", uint64_t{0})});
      if (checked) {
        EXPECT_GT(rows.back().seq, last) << line;
        last = rows.back().seq;
      }
    }
    return rows;
  }

  std::string dir_, manifest_;
  std::map<std::string, std::string> env_;
  std::vector<std::string> args_;
  std::string ca_;
  pid_t pid_ = -1;
  pid_t serving_pid_ = -1;
  int port_ = 0;
  int admin_port_ = 0;
};

// A test with its own temporary root (/tmp/kiln-<test>-XXXXXX), removed after a test that
// passed (kept for a look after one that failed).
// A fake hub between a worker and a real one: it passes every request through except those
// `answer` answers itself (a JSON body; nullopt passes the request on), and counts blob
// downloads.
class FakeHub {
 public:
  using Answer = std::function<std::optional<std::string>(const httplib::Request&)>;
  // A list a test can start replaying at any moment: while `Set` holds a body, /v1/revocations is
  // answered with it (a list the hub signed earlier, say); after `Clear`, everything passes on.
  class Replay {
   public:
    void Set(std::string body) {
      std::lock_guard<std::mutex> lock(state_->mu);
      state_->body = std::move(body);
    }
    void Clear() { Set(""); }
    Answer answer() const {
      return [state = state_](const httplib::Request& req) -> std::optional<std::string> {
        std::lock_guard<std::mutex> lock(state->mu);
        if (req.path == "/v1/revocations" && !state->body.empty()) return state->body;
        return std::nullopt;
      };
    }

   private:
    struct State {
      std::mutex mu;
      std::string body;
    };
    std::shared_ptr<State> state_ = std::make_shared<State>();
  };
  // Answers /v1/revocations with `body`, passes everything else on.
  static Answer Revocations(std::string body) {
    return [body = std::move(body)](const httplib::Request& req) -> std::optional<std::string> {
      if (req.path == "/v1/revocations") return body;
      return std::nullopt;
    };
  }
  FakeHub(int hub_port, Answer answer) : hub_("127.0.0.1", hub_port), answer_(std::move(answer)) {
    hub_.set_read_timeout(20, 0);
    auto serve = [this](const httplib::Request& req, httplib::Response& res) {
      if (std::optional<std::string> own = answer_(req)) {
        res.set_content(*own, "application/json");
        return;
      }
      if (req.path.rfind("/v1/blobs/", 0) == 0) ++blobs_;
      httplib::Headers headers;
      for (const auto& [k, v] : req.headers) {
        if (k == "Authorization" || k == "Range") headers.emplace(k, v);
      }
      auto up = req.method == "GET" ? hub_.Get(req.target, headers)
                                    : hub_.Post(req.target, headers, req.body,
                                                req.get_header_value("Content-Type"));
      if (!up) {
        res.status = 502;
        return;
      }
      res.status = up->status;
      res.set_content(up->body, up->get_header_value("Content-Type"));
    };
    server_.Get(".*", serve);
    server_.Post(".*", serve);
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ~FakeHub() {
    server_.stop();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int blob_requests() const { return blobs_.load(); }
  // The real hub, for an answer that rewrites what it says.
  httplib::Client& real() { return hub_; }

 private:
  httplib::Client hub_;
  Answer answer_;
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  std::atomic<int> blobs_{0};
};

class MachinesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = std::string("/tmp/kiln-") +
                       ::testing::UnitTest::GetInstance()->current_test_info()->name() + "-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    if (!HasFailure()) std::filesystem::remove_all(root_, ec);
  }
  std::string root_;
};

}  // namespace kiln::worker_testing
