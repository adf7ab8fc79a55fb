// A cell that crashes the worker, with real processes on loopback (docs/fleet.md "A cell that
// crashes the worker"; src/kiln/worker/crash_guard.h): a `kiln hub` holding the mlp example's
// cell, minted and published by `kiln mint` + `kiln publish` with the test-only switch
// KILN_TEST_CELL_SEGV (compile/pipeline.h), so the cell's own generated code writes through a null
// pointer when its input starts with kSegvValue. The mint's proof and the hub's rebuild pass (they
// never send that value); a `kiln worker` with the same switch adopts the cell, and the first
// request carrying the value kills it with a real SIGSEGV inside the cell.
//
// Then: the restarted worker quarantines the ref, serves eager with posture `cell_crashed`,
// reports the crash to the hub, and never adopts the ref again, neither from its local store nor
// from the hub; the hub counts the crash per ref and machine, and revokes a ref once enough
// distinct machines reported it (--crash-revoke-threshold), never for one machine alone.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "src/kiln/base/file.h"
#include "tests/worker/worker_process.h"

namespace kiln {
namespace {

using namespace kiln::worker_testing;  // NOLINT: the process fixtures
using hub_testing::kAdmin;
using hub_testing::kWorker;
using hub_testing::ValueOr;

constexpr const char* kSegvValue = "-31337";
constexpr int kThreshold = 2;

// One infer request on the mlp function with a [1, 64] input whose first element is `first`.
Worker::Answer Infer(const Worker& w, float first) {
  std::vector<float> data;
  for (int i = 0; i < 64; ++i) data.push_back(static_cast<float>(i % 13) / 13.0f - 0.5f);
  data[0] = first;
  return w.Infer("mlp", {{"x", Tensor::FromVector<float>({1, 64}, data)}});
}

// Reaps `w`'s process, waiting at most 30 s; its wait status, or -1.
int Reap(Worker& w) {
  for (int i = 0; i < 600; ++i) {
    int status = 0;
    if (::waitpid(w.pid(), &status, WNOHANG) == w.pid()) {
      w.Forget();
      return status;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return -1;
}

// The files directly under `dir` (none when it does not exist).
std::vector<std::string> FilesIn(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    out.push_back(e.path().filename().string());
  }
  return out;
}

// GET `path` on the hub with the admin token: (status, body).
std::pair<int, std::string> HubGet(const Hub& hub, const std::string& path) {
  httplib::Client http(hub.url());
  http.set_read_timeout(30, 0);
  http.set_bearer_token_auth(kAdmin);
  auto r = http.Get(path);
  return r ? std::make_pair(r->status, r->body) : std::make_pair(0, std::string());
}

// The value of the unlabelled sample `name` in the hub's /metrics, or -1.
double Metric(const Hub& hub, const std::string& name) {
  const std::string text = HubGet(hub, "/metrics").second;
  const std::string line = "\n" + name + " ";
  const size_t at = text.find(line);
  return at == std::string::npos ? -1 : std::stod(text.substr(at + line.size()));
}

// `kiln mint` of examples/mlp on the machine `cache`, then `kiln publish` to `hub` as the platform
// publisher; sets *ref. (Hub::MintAndPublish reads the ref from the first word `kiln mint`
// prints, which here is the switch's warning.)
::testing::AssertionResult MintAndPublish(const Hub& hub, const std::string& cache,
                                          std::string* ref) {
  auto mint = Kiln(cache, "mint --manifest " + ExampleDir("mlp") + "kiln.toml");
  const size_t at = mint.second.find("ck1-");
  if (mint.first != 0 || at == std::string::npos) {
    return ::testing::AssertionFailure()
           << "kiln mint exited " << mint.first << ": " << mint.second;
  }
  if (mint.second.find("TEST SWITCH KILN_TEST_CELL_SEGV") == std::string::npos) {
    return ::testing::AssertionFailure() << "kiln mint did not honour the switch: " << mint.second;
  }
  *ref = mint.second.substr(at, mint.second.find_first_of(" \n\t", at) - at);
  auto pub = Kiln(cache, "publish " + cache + "/cells/" + KeyOf(*ref) + "/cell.tar --hub " +
                             hub.url() + " --token " + hub_testing::kPlatform);
  if (pub.first != 0) {
    return ::testing::AssertionFailure()
           << "kiln publish exited " << pub.first << ": " << pub.second;
  }
  return ::testing::AssertionSuccess();
}

class CellCrash : public MachinesTest {
 protected:
  void SetUp() override {
    MachinesTest::SetUp();
    // Every process this test starts generates the crashing code: `kiln mint` (through popen),
    // the workers (their source regeneration must agree with the cell's source).
    ::setenv("KILN_TEST_CELL_SEGV", kSegvValue, 1);
    hub_ = std::make_unique<Hub>(root_ + "/hub");
    hub_->process().AddArgs({"--crash-revoke-threshold", std::to_string(kThreshold)});
    ASSERT_TRUE(hub_->Start());
  }
  void TearDown() override {
    ::unsetenv("KILN_TEST_CELL_SEGV");
    hub_.reset();
    MachinesTest::TearDown();
  }
  // POSTs one cell_crashed row for `ref` as worker instance `instance` (worker token).
  ::testing::AssertionResult ReportCrash(const std::string& ref, const std::string& instance) {
    nlohmann::json row = {{"kind", "cell_crashed"}, {"phase", "quarantined"},
                          {"key", KeyOf(ref)},      {"ref", ref},
                          {"target", "mlp"},        {"instance", instance}};
    auto a = hub_->Client(kWorker)->Call("POST", "/v1/events", nlohmann::json::array({row}).dump());
    if (!a.ok()) return ::testing::AssertionFailure() << a.token << ": " << a.message;
    return ::testing::AssertionSuccess();
  }
  bool Revoked(const std::string& ref) {
    auto a = hub_->Client(kWorker)->Call("GET", "/v1/revocations");
    for (const auto& r : a.body.value("revocations", nlohmann::json::array())) {
      if (r.value("key", "") + "@" + r.value("digest", "") == ref) return true;
    }
    return false;
  }
  std::unique_ptr<Hub> hub_;
};

TEST_F(CellCrash, SegfaultOnFirstCallIsQuarantinedServedEagerReportedAndNeverAdoptedAgain) {
  std::string ref;
  ASSERT_TRUE(MintAndPublish(*hub_, root_ + "/publisher", &ref));
  const std::string key = KeyOf(ref);
  const std::string dir = root_ + "/machine";
  ManifestOptions o;
  o.hub_url = hub_->url();
  o.hub_timeout_ms = 5000;
  const std::string manifest = Manifest(o);
  // Under AddressSanitizer the sanitizer's own SIGSEGV handler would turn the fault into an
  // abort; the worker must die of the fault itself, as it does in a production build.
  const char* asan = std::getenv("ASAN_OPTIONS");
  const std::map<std::string, std::string> env = {
      {"KILN_TEST_CELL_SEGV", kSegvValue},
      {"ASAN_OPTIONS",
       asan != nullptr && *asan != '\0' ? std::string(asan) + ":handle_segv=0" : "handle_segv=0"}};
  const std::string quarantine = dir + "/cells/.crash/quarantine";
  const std::string markers = dir + "/cells/.crash/markers";

  // 1. The worker adopts the cell from the hub; the first request it sends into the cell kills
  // it with SIGSEGV, and the marker written before that call is left behind.
  {
    Worker w(dir, manifest, env);
    ASSERT_TRUE(w.Start());
    ASSERT_TRUE(w.WaitForRow("boot_adopt", "hit", 10000));
    auto a = Infer(w, std::stof(kSegvValue));
    EXPECT_EQ(a.status, 0) << a.body.dump();  // no answer: the process is gone
    const int status = Reap(w);
    ASSERT_TRUE(WIFSIGNALED(status)) << "status " << status << "\n" << w.Log();
    EXPECT_EQ(WTERMSIG(status), SIGSEGV);
    EXPECT_EQ(FilesIn(markers).size(), 1u);
    EXPECT_TRUE(FilesIn(quarantine).empty());
  }
  std::filesystem::rename(dir + "/events.jsonl", dir + "/events-1.jsonl");

  // 2. Restarted: the marker's process is dead, so the ref is quarantined and reported; the local
  // store's copy is refused and dropped, the hub's answer refused before a byte is fetched; the
  // target serves eager with posture cell_crashed, even for the request that crashed it.
  {
    Worker w(dir, manifest, env);
    ASSERT_TRUE(w.Start());
    Row crashed, boot;
    ASSERT_TRUE(w.WaitForRow("cell_crashed", "quarantined", 10000, &crashed));
    EXPECT_TRUE(DetailNames(crashed, ref));
    ASSERT_TRUE(w.WaitForRow("boot_adopt", "cell_crashed", 10000, &boot));
    EXPECT_TRUE(DetailNames(boot, "local_entry_refused"));
    EXPECT_TRUE(DetailNames(boot, "hub=found"));
    auto a = Infer(w, std::stof(kSegvValue));
    ASSERT_EQ(a.status, 200) << a.body.dump();
    EXPECT_EQ(a.mode(), "eager");
    EXPECT_EQ(a.reason(), "cell_crashed");
    EXPECT_EQ(a.ref(), "");
    EXPECT_FALSE(w.MapsACell());
    EXPECT_TRUE(w.FirstRow("serve_eager_posture", "cell_crashed").has_value());
    // Nothing is minted in its place: the key's mint would make the same bytes.
    EXPECT_FALSE(w.FirstRow("self_mint_started").has_value());
    EXPECT_FALSE(w.FirstRow("self_mint_skipped").has_value());
    EXPECT_TRUE(FilesIn(markers).empty());
    EXPECT_EQ(FilesIn(quarantine).size(), 1u);
    EXPECT_FALSE(std::filesystem::exists(dir + "/cells/" + key + "/ref"));
    EXPECT_EQ(w.Stop(), 0);  // the drain flushes the forwarder
  }
  std::filesystem::rename(dir + "/events.jsonl", dir + "/events-2.jsonl");

  // The hub holds the row and counts the crash: one machine, not enough to revoke.
  auto rows = hub_->Client(kAdmin)->Call("GET", "/v1/events?kind=cell_crashed&limit=100");
  ASSERT_TRUE(rows.ok()) << rows.token << ": " << rows.message;
  ASSERT_EQ(rows.body["events"].size(), 1u) << rows.body.dump();
  EXPECT_EQ(rows.body["events"][0].value("ref", ""), ref);
  auto resolved = hub_->Client(kWorker)->Call("GET", "/v1/cells/" + key + "?family=root/mlp");
  ASSERT_TRUE(resolved.ok()) << resolved.token << ": " << resolved.message;
  EXPECT_EQ(resolved.body.value("crashed_workers", -1), 1) << resolved.body.dump();
  EXPECT_EQ(Metric(*hub_, "kiln_hub_cell_crash_reports_total"), 1);
  EXPECT_FALSE(Revoked(ref));

  // 3. A further restart: no marker is left, and the quarantine still refuses the hub's cell
  // (the local store holds none any more); no second crash is reported.
  {
    Worker w(dir, manifest, env);
    ASSERT_TRUE(w.Start());
    Row boot;
    ASSERT_TRUE(w.WaitForRow("boot_adopt", "cell_crashed", 10000, &boot));
    EXPECT_TRUE(DetailNames(boot, "hub=found ref=" + ref));
    EXPECT_FALSE(w.FirstRow("cell_crashed").has_value());
    auto a = Infer(w, 0.25f);
    ASSERT_EQ(a.status, 200) << a.body.dump();
    EXPECT_EQ(a.mode(), "eager");
    EXPECT_EQ(a.reason(), "cell_crashed");
    EXPECT_FALSE(w.MapsACell());
    EXPECT_EQ(w.Stop(), 0);
  }
  EXPECT_EQ(Metric(*hub_, "kiln_hub_cell_crash_reports_total"), 1);
}

TEST_F(CellCrash, TheHubRevokesARefOnceEnoughDistinctMachinesReportedItsCrash) {
  const std::string ref = "ck1-" + std::string(56, 'a') + "@sha256:" + std::string(64, 'b');
  // One machine crash-looping (a new pid per restart) counts once, however often.
  for (int pid : {101, 102, 103}) {
    ASSERT_TRUE(ReportCrash(ref, "mlp@host-a/" + std::to_string(pid)));
  }
  EXPECT_FALSE(Revoked(ref));
  EXPECT_EQ(Metric(*hub_, "kiln_hub_crash_revocations_total"), 0);
  // A second machine meets the threshold: revoked as an admin would, by the hub itself.
  ASSERT_TRUE(ReportCrash(ref, "mlp@host-b/7"));
  EXPECT_TRUE(Revoked(ref));
  EXPECT_EQ(Metric(*hub_, "kiln_hub_cell_crash_reports_total"), 4);
  EXPECT_EQ(Metric(*hub_, "kiln_hub_crash_revocations_total"), 1);
  auto list = hub_->Client(kWorker)->Call("GET", "/v1/revocations");
  bool by_hub = false;
  for (const auto& r : list.body.value("revocations", nlohmann::json::array())) {
    by_hub = by_hub || (r.value("revoked_by", "") == "hub:crash-threshold" &&
                        r.value("reason", "").rfind("cell_crashed: 2 worker machines", 0) == 0);
  }
  EXPECT_TRUE(by_hub) << list.body.dump();
  // Another report of a revoked ref revokes nothing more.
  ASSERT_TRUE(ReportCrash(ref, "mlp@host-c/9"));
  EXPECT_EQ(Metric(*hub_, "kiln_hub_crash_revocations_total"), 1);
}

}  // namespace
}  // namespace kiln
