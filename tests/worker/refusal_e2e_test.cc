// The serving half's refusals and fallbacks with real processes on loopback (issue 5): a `kiln
// hub` holding the mlp example's cell (minted and published by `kiln mint` + `kiln publish`) and
// one `kiln worker` per test, each with its own machine directory and manifest. Every test asserts
// the exact event rows the worker wrote (kind/phase, in seq order) and what the wire said.
//
// Cell faults and allocation failures are injected with the worker's test-only switch
// KILN_TEST_CELL_FAULT (src/kiln/worker/test_switches.h); every other condition is made for real:
// a proxy that alters the receipt's signature on its way (a forged receipt), a blob altered in
// the hub's store (wrong digest), a worker playing a machine of a lower sm than the fleet's
// manifest pins (KILN_TEST_SM_LEVEL lowers what the CPU detection reports),
// a hub URL nothing listens on.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "src/kiln/base/file.h"
#include "src/kiln/base/sha256.h"
#include "tests/hub/hub_process.h"

namespace kiln {
namespace {

using namespace kiln::hub_testing;  // NOLINT: the hub fixtures

const std::string kMlp = std::string(KILN_SOURCE_DIR) + "/examples/mlp/";

// Runs `kiln args...` with KILN_CACHE_DIR=cache; returns (exit code, output).
std::pair<int, std::string> Kiln(const std::string& cache, const std::string& args) {
  const std::string cmd = "KILN_CACHE_DIR=" + cache + " " + Binary() + " " + args + " 2>&1";
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  char buf[4096];
  size_t n;
  while (p && (n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = p ? ::pclose(p) : -1;
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// One hub for the whole binary, holding the mlp cell published by a platform publisher.
struct Fleet {
  std::string root;
  std::unique_ptr<HubProcess> hub;
  std::string key, ref, jwks_path;
};

Fleet* g_fleet = nullptr;

class FleetEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    auto f = std::make_unique<Fleet>();
    char tmpl[] = "/tmp/kiln-refusal-e2e-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    f->root = tmpl;
    ASSERT_TRUE(MakeDirs(f->root + "/hub/data").ok());
    nlohmann::json tokens = {
        {"tokens",
         {{{"name", "ci"},
           {"role", "publisher"},
           {"tier", "platform"},
           {"sha256", Sha256Hex(kPlatform)}},
          {{"name", "workers"}, {"role", "worker"}, {"sha256", Sha256Hex(kWorker)}},
          {{"name", "ops"}, {"role", "admin"}, {"sha256", Sha256Hex(kAdmin)}}}}};
    ASSERT_TRUE(WriteFileAtomic(f->root + "/hub/tokens.json", tokens.dump(2)).ok());
    f->hub = std::make_unique<HubProcess>(f->root + "/hub/data", "");
    ASSERT_TRUE(f->hub->Start());
    auto mint = Kiln(f->root + "/a", "mint --manifest " + kMlp + "kiln.toml");
    ASSERT_EQ(mint.first, 0) << mint.second;
    f->ref = mint.second.substr(0, mint.second.find_first_of(" \n\t"));
    f->key = f->ref.substr(0, f->ref.find('@'));
    auto pub =
        Kiln(f->root + "/a", "publish " + f->root + "/a/cells/" + f->key + "/cell.tar --hub " +
                                 f->hub->url() + " --token " + kPlatform);
    ASSERT_EQ(pub.first, 0) << pub.second;
    auto jwks = f->hub->Client(kWorker)->GetJwks();
    ASSERT_TRUE(jwks.ok()) << jwks.message;
    f->jwks_path = f->root + "/jwks.json";
    ASSERT_TRUE(WriteFileAtomic(f->jwks_path, jwks.body.dump()).ok());
    g_fleet = f.release();
  }
  void TearDown() override {
    if (g_fleet == nullptr) return;
    g_fleet->hub.reset();
    std::error_code ec;
    std::filesystem::remove_all(g_fleet->root, ec);
    delete g_fleet;
    g_fleet = nullptr;
  }
};

const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new FleetEnvironment);

struct ManifestOptions {
  std::string lane = "optional";
  std::string hub_url;     // "" = no [hub] section
  std::string trust_path;  // "" = trust the hub's own key set
  std::string sm;          // "" = detect
};

// The example's manifest with absolute paths and the options' changes.
std::string Manifest(const ManifestOptions& o) {
  std::string m = ValueOr(ReadFile(kMlp + "kiln.toml"), std::string());
  for (const char* rel : {"model.onnx", "checkpoint.safetensors"}) {
    const std::string from = std::string("\"") + rel + "\"";
    m.replace(m.find(from), from.size(), "\"" + kMlp + rel + "\"");
  }
  m.replace(m.find("lane = \"optional\""), 17, "lane = \"" + o.lane + "\"");
  if (!o.sm.empty()) {
    const std::string at = "lane = \"" + o.lane + "\"";
    m.replace(m.find(at), at.size(), at + "\nsm = \"" + o.sm + "\"");
  }
  if (!o.hub_url.empty()) {
    m += "\n[hub]\nurl = \"" + o.hub_url + "\"\ntoken = \"" + kWorker + "\"\ntimeout_ms = 3000\n";
    if (!o.trust_path.empty()) m += "trust = [\"" + o.trust_path + "\"]\n";
  }
  return m;
}

// A `kiln worker` process with its own machine directory (cache, events, log).
class Worker {
 public:
  Worker(std::string dir, const std::string& manifest,
         const std::map<std::string, std::string>& env = {})
      : dir_(std::move(dir)), port_(FreePort()) {
    EXPECT_TRUE(MakeDirs(dir_).ok());
    EXPECT_TRUE(WriteFileAtomic(dir_ + "/kiln.toml", manifest).ok());
    pid_ = ::fork();
    if (pid_ == 0) {
      ::setenv("KILN_CACHE_DIR", dir_.c_str(), 1);
      for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
      const int fd = ::open((dir_ + "/worker.log").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      std::vector<std::string> args = {Binary(),     "worker",
                                       "--manifest", dir_ + "/kiln.toml",
                                       "--port",     std::to_string(port_),
                                       "--events",   dir_ + "/events.jsonl"};
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    http_ = std::make_unique<httplib::Client>("127.0.0.1", port_);
    http_->set_read_timeout(30, 0);
  }
  ~Worker() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }

  // Waits until the worker answers /v2/health/live (boot done: the front end starts after it).
  ::testing::AssertionResult Live() {
    for (int i = 0; i < 600; ++i) {
      auto r = http_->Get("/v2/health/live");
      if (r && r->status == 200) return ::testing::AssertionSuccess();
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return ::testing::AssertionFailure() << "worker exited early: " << Log();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return ::testing::AssertionFailure() << "worker never became live: " << Log();
  }

  struct Answer {
    int status = 0;
    nlohmann::json body;
    std::string retry_after;
  };
  // One infer request on the mlp function with a [rows, 64] input.
  Answer Infer(int rows = 1) {
    nlohmann::json data = nlohmann::json::array();
    for (int i = 0; i < rows * 64; ++i) data.push_back(static_cast<float>(i % 13) / 13.0f - 0.5f);
    nlohmann::json req = {
        {"inputs", {{{"name", "x"}, {"shape", {rows, 64}}, {"datatype", "FP32"}, {"data", data}}}}};
    auto r = http_->Post("/v2/models/mlp/infer", req.dump(), "application/json");
    Answer a;
    if (!r) return a;
    a.status = r->status;
    a.body = nlohmann::json::parse(r->body, nullptr, false);
    a.retry_after = r->get_header_value("Retry-After");
    return a;
  }
  std::string Mode(const Answer& a) { return a.body["parameters"].value("serving_mode", ""); }
  std::string Reason(const Answer& a) { return a.body["parameters"].value("fallback_reason", ""); }
  int ReadyStatus() {
    auto r = http_->Get("/v2/health/ready");
    return r ? r->status : 0;
  }

  // The event rows on disk as "kind/phase", in seq order (checked increasing).
  std::vector<std::string> Rows() {
    std::vector<std::string> out;
    std::string text = ValueOr(ReadFile(dir_ + "/events.jsonl"), std::string());
    uint64_t last = 0;
    size_t at = 0;
    while (at < text.size()) {
      size_t end = text.find('\n', at);
      if (end == std::string::npos) end = text.size();
      const std::string line = text.substr(at, end - at);
      at = end + 1;
      if (line.empty()) continue;
      auto row = nlohmann::json::parse(line);
      const uint64_t seq = row["seq"].get<uint64_t>();
      EXPECT_GT(seq, last) << line;
      last = seq;
      out.push_back(row["kind"].get<std::string>() + "/" + row["phase"].get<std::string>());
    }
    return out;
  }
  // The first row of `kind` as JSON (null when none).
  nlohmann::json FirstRow(const std::string& kind) {
    std::string text = ValueOr(ReadFile(dir_ + "/events.jsonl"), std::string());
    size_t at = 0;
    while (at < text.size()) {
      size_t end = text.find('\n', at);
      if (end == std::string::npos) end = text.size();
      auto row = nlohmann::json::parse(text.substr(at, end - at), nullptr, false);
      at = end + 1;
      if (row.is_object() && row["kind"] == kind) return row;
    }
    return nullptr;
  }
  // Waits up to `ms` for a row of `kind` on disk.
  bool WaitForRow(const std::string& kind, int ms) {
    for (int waited = 0; waited < ms; waited += 100) {
      if (!FirstRow(kind).is_null()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }
  std::string Log() { return ValueOr(ReadFile(dir_ + "/worker.log"), std::string()); }
  // Files of cells loaded by this worker: none may exist when an adoption was refused.
  size_t LoadedCellFiles() {
    size_t n = 0;
    std::error_code ec;
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir_, ec)) {
      if (e.path().extension() == ".so") ++n;
    }
    return n;
  }
  // True when the process maps any file of its machine directory ending in .so (a dlopened cell).
  bool MapsACell() {
    const std::string maps =
        ValueOr(ReadFile("/proc/" + std::to_string(pid_) + "/maps"), std::string());
    return maps.find(dir_) != std::string::npos && maps.find(".so") != std::string::npos;
  }
  // SIGTERM: drains and exits 0.
  int Stop() {
    ::kill(pid_, SIGTERM);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  int port_;
  pid_t pid_ = -1;
  std::unique_ptr<httplib::Client> http_;
};

class Refusals : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(g_fleet, nullptr) << "the fleet fixture failed to start";
    dir_ = g_fleet->root + "/" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }
  // Mints the mlp cell into this test's machine directory (its local store).
  void MintLocally() {
    auto mint = Kiln(dir_, "mint --manifest " + kMlp + "kiln.toml");
    ASSERT_EQ(mint.first, 0) << mint.second;
  }
  std::string dir_;
};

using Rows = std::vector<std::string>;

TEST_F(Refusals, LocalStoreHitWithNoHubServesTheFirstRequestFromTheCell) {
  MintLocally();
  Worker w(dir_, Manifest({}));
  ASSERT_TRUE(w.Live());
  auto a = w.Infer();
  ASSERT_EQ(a.status, 200) << a.body.dump();
  EXPECT_EQ(w.Mode(a), "aot_cell");
  EXPECT_EQ(a.body["parameters"]["served_cell_ref"], g_fleet->ref);
  EXPECT_EQ(w.Rows(), (Rows{"serve_posture/aot_cell", "boot_adopt/local_hit"}));
  EXPECT_EQ(w.Stop(), 0);
}

TEST_F(Refusals, InjectedCellFaultServesThatRequestEagerAndRevokesTheCellForGood) {
  MintLocally();
  Worker w(dir_, Manifest({}), {{"KILN_TEST_CELL_FAULT", "mlp:fault@2"}});
  ASSERT_TRUE(w.Live());
  EXPECT_EQ(w.Mode(w.Infer()), "aot_cell");
  auto faulted = w.Infer();
  ASSERT_EQ(faulted.status, 200) << faulted.body.dump();
  EXPECT_EQ(w.Mode(faulted), "eager");
  EXPECT_EQ(w.Reason(faulted), "cell_fault");
  for (int i = 0; i < 3; ++i) {
    auto later = w.Infer();
    EXPECT_EQ(w.Mode(later), "eager");
    EXPECT_EQ(w.Reason(later), "compiled_degraded");
    EXPECT_EQ(later.body["parameters"].value("served_cell_ref", ""), "");
  }
  EXPECT_EQ(w.Rows(), (Rows{"serve_posture/aot_cell", "boot_adopt/local_hit",
                            "serve_degrade/cell_fault", "serve_eager_posture/compiled_degraded"}));
  EXPECT_EQ(w.Stop(), 0);
}

TEST_F(Refusals, InjectedAllocationFailureServesEagerAndTheCellStaysArmed) {
  MintLocally();
  Worker w(dir_, Manifest({}), {{"KILN_TEST_CELL_FAULT", "mlp:oom@1"}});
  ASSERT_TRUE(w.Live());
  auto oom = w.Infer();
  ASSERT_EQ(oom.status, 200) << oom.body.dump();
  EXPECT_EQ(w.Mode(oom), "eager");
  EXPECT_EQ(w.Reason(oom), "cell_oom");
  EXPECT_EQ(w.Mode(w.Infer()), "aot_cell");
  EXPECT_EQ(w.Rows(),
            (Rows{"serve_posture/aot_cell", "boot_adopt/local_hit", "cell_oom/stay_armed"}));
  EXPECT_EQ(w.Stop(), 0);
}

// A mandatory target that misses refuses retryably while its cell is minted (never eager), then
// serves from the cell. The mint child is held busy for a few seconds (KILN_TEST_MINT_BUSY_S) so
// the first request lands during the mint on any machine.
TEST_F(Refusals, MandatoryTargetRefusesRetryablyUntilItsCellArmsAndNeverAnswersEager) {
  ManifestOptions o;
  o.lane = "mandatory";
  Worker w(dir_, Manifest(o), {{"KILN_TEST_MINT_BUSY_S", "3"}});
  ASSERT_TRUE(w.Live());
  EXPECT_EQ(w.ReadyStatus(), 503);
  auto a = w.Infer();
  EXPECT_EQ(a.status, 503) << a.body.dump();
  EXPECT_EQ(a.retry_after, "1");
  EXPECT_NE(a.body.value("error", "").find("required_compile_missing"), std::string::npos)
      << a.body.dump();
  ASSERT_TRUE(w.WaitForRow("mint_phases", 120000)) << w.Log();
  EXPECT_EQ(w.ReadyStatus(), 200);
  auto b = w.Infer();
  ASSERT_EQ(b.status, 200) << b.body.dump();
  EXPECT_EQ(w.Mode(b), "aot_cell");
  EXPECT_EQ(w.Rows(),
            (Rows{"boot_adopt/local_miss_no_hub", "self_mint_started/child",
                  "cell_numerics/HEALTHY", "local_cell_stored/stored", "serve_posture/aot_cell",
                  "local_cell_armed/armed", "mint_phases/minted"}));
  EXPECT_EQ(w.Stop(), 0);
}

// A man in the middle between worker and hub: forwards every call, but alters one byte of the
// signature of every receipt a resolve answers with.
class ForgingProxy {
 public:
  explicit ForgingProxy(int hub_port) : hub_("127.0.0.1", hub_port) {
    hub_.set_read_timeout(20, 0);
    auto forward = [this](const httplib::Request& req, httplib::Response& res) {
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
      std::string body = up->body;
      if (req.method == "GET" && req.path.rfind("/v1/cells/", 0) == 0) {
        auto j = nlohmann::json::parse(body, nullptr, false);
        if (j.is_object() && j.contains("receipt")) {
          std::string r = j["receipt"];
          const size_t sig = r.rfind('.') + 1;
          char& c = r[sig + (r.size() - sig) / 2];
          c = c == 'A' ? 'B' : 'A';
          j["receipt"] = r;
          body = j.dump();
          ++forged_;
        }
      }
      res.status = up->status;
      res.set_content(body, up->get_header_value("Content-Type"));
    };
    server_.Get(".*", forward);
    server_.Post(".*", forward);
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ~ForgingProxy() {
    server_.stop();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int forged() const { return forged_.load(); }

 private:
  httplib::Client hub_;
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  std::atomic<int> forged_{0};
};

TEST_F(Refusals, ForgedReceiptIsRefusedBeforeAnythingIsFetchedOrLoaded) {
  ForgingProxy proxy(g_fleet->hub->port());
  ManifestOptions o;
  o.hub_url = proxy.url();  // the worker trusts the hub's own key set, fetched through the proxy
  Worker w(dir_, Manifest(o));
  ASSERT_TRUE(w.Live());
  EXPECT_EQ(proxy.forged(), 1);
  auto a = w.Infer();
  ASSERT_EQ(a.status, 200) << a.body.dump();
  EXPECT_EQ(w.Mode(a), "eager");
  EXPECT_EQ(w.Rows(), (Rows{"boot_adopt/receipt_refused", "serve_eager_posture/uncompiled"}));
  EXPECT_NE(w.FirstRow("boot_adopt")["detail"].get<std::string>().find("receipt_bad_signature"),
            std::string::npos)
      << w.FirstRow("boot_adopt").dump();
  EXPECT_EQ(w.LoadedCellFiles(), 0u);
  EXPECT_FALSE(w.MapsACell());
  EXPECT_EQ(w.Stop(), 0);
}

TEST_F(Refusals, BlobWithTheWrongDigestIsRefusedAndNothingLoads) {
  // Alter the published bytes in the hub's blob store (same size), restoring them afterwards.
  std::string blob;
  std::error_code ec;
  for (const auto& e :
       std::filesystem::recursive_directory_iterator(g_fleet->root + "/hub/data", ec)) {
    if (e.is_regular_file() && e.path().string().find(g_fleet->ref.substr(
                                   g_fleet->ref.find(':') + 1, 16)) != std::string::npos) {
      blob = e.path().string();
    }
  }
  ASSERT_FALSE(blob.empty()) << "no blob for " << g_fleet->ref << " under the hub's data dir";
  const std::string original = ValueOr(ReadFile(blob), std::string());
  std::string altered = original;
  altered[altered.size() / 2] ^= 0x5a;
  ASSERT_TRUE(WriteFileAtomic(blob, altered).ok());
  struct Restore {
    std::string path, bytes;
    ~Restore() { WriteFileAtomic(path, bytes).IgnoreError(); }
  } restore{blob, original};

  ManifestOptions o;
  o.hub_url = g_fleet->hub->url();
  Worker w(dir_, Manifest(o));
  ASSERT_TRUE(w.Live());
  auto a = w.Infer();
  ASSERT_EQ(a.status, 200) << a.body.dump();
  EXPECT_EQ(w.Mode(a), "eager");
  EXPECT_EQ(w.Rows(), (Rows{"boot_adopt/digest_mismatch", "serve_eager_posture/uncompiled"}));
  EXPECT_NE(w.FirstRow("boot_adopt")["detail"].get<std::string>().find("digest_mismatch"),
            std::string::npos)
      << w.FirstRow("boot_adopt").dump();
  EXPECT_EQ(w.LoadedCellFiles(), 0u);
  EXPECT_FALSE(w.MapsACell());
  EXPECT_EQ(w.Stop(), 0);
}

TEST_F(Refusals, CellBuiltForAHigherSmThanThisMachineRunsIsRefused) {
  // The fleet's manifest pins x86-64-v3; this worker's machine runs only up to x86-64-v2.
  ManifestOptions o;
  o.hub_url = g_fleet->hub->url();
  o.sm = "x86-64-v3";
  Worker w(dir_, Manifest(o), {{"KILN_TEST_SM_LEVEL", "x86-64-v2"}});
  ASSERT_TRUE(w.Live());
  auto a = w.Infer();
  ASSERT_EQ(a.status, 200) << a.body.dump();
  EXPECT_EQ(w.Mode(a), "eager");
  EXPECT_EQ(w.Rows(), (Rows{"boot_adopt/sm_mismatch", "serve_eager_posture/uncompiled"}));
  EXPECT_EQ(w.LoadedCellFiles(), 0u);
  EXPECT_FALSE(w.MapsACell());
  EXPECT_EQ(w.Stop(), 0);
}

TEST_F(Refusals, HubDownAtBootIsATypedRefusalNotAMiss) {
  ReservedPort nobody;  // refuses connections; no parallel test can take it meanwhile
  ManifestOptions o;
  o.hub_url = "http://127.0.0.1:" + std::to_string(nobody.port());
  Worker w(dir_, Manifest(o));
  ASSERT_TRUE(w.Live());
  auto a = w.Infer();
  ASSERT_EQ(a.status, 200) << a.body.dump();
  EXPECT_EQ(w.Mode(a), "eager");
  EXPECT_EQ(w.Rows(), (Rows{"boot_adopt/resolve_refused", "serve_eager_posture/uncompiled"}));
  EXPECT_NE(w.FirstRow("boot_adopt")["detail"].get<std::string>().find("hub_unreachable"),
            std::string::npos)
      << w.FirstRow("boot_adopt").dump();
  EXPECT_EQ(w.Stop(), 0);
}

TEST_F(Refusals, HubHitIsAotCellAndTheRowsReachTheHub) {
  ManifestOptions o;
  o.hub_url = g_fleet->hub->url();
  Worker w(dir_, Manifest(o));
  ASSERT_TRUE(w.Live());
  auto a = w.Infer();
  ASSERT_EQ(a.status, 200) << a.body.dump();
  EXPECT_EQ(w.Mode(a), "aot_cell");
  EXPECT_EQ(w.Rows(), (Rows{"serve_posture/aot_cell", "boot_adopt/hit"}));
  EXPECT_EQ(w.Stop(), 0);  // the drain flushes the forwarder
  auto rows = g_fleet->hub->Client(kAdmin)->Call("GET", "/v1/events?kind=boot_adopt&limit=100");
  ASSERT_TRUE(rows.ok()) << rows.token << ": " << rows.message;
  bool found = false;
  for (const auto& r : rows.body["events"]) {
    const std::string worker = r.value("worker", "");
    if (r["phase"] == "hit" && r["key"] == g_fleet->key && worker.rfind("mlp@", 0) == 0) {
      found = true;
    }
  }
  EXPECT_TRUE(found) << rows.body.dump();
}

}  // namespace
}  // namespace kiln
