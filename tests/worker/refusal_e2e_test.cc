// The serving half's refusals and fallbacks with real processes on loopback: a `kiln hub`
// holding the mlp example's cell (minted and published by `kiln mint` + `kiln publish`) and
// one `kiln worker` per test, each with its own machine directory and manifest. Every test asserts
// the exact event rows the worker wrote (kind/phase, in seq order) and what the wire said.
//
// Cell faults and allocation failures are injected with the worker's test-only switch
// KILN_TEST_CELL_FAULT (src/kiln/worker/test_switches.h); every other condition is made for real:
// a proxy that alters the receipt's signature on its way (a forged receipt), a blob altered in
// the hub's store (wrong digest), a worker playing a machine of a lower sm than the fleet's
// manifest pins (KILN_TEST_SM_LEVEL lowers what the CPU detection reports),
// a hub URL nothing listens on.
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
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
using hub_testing::ReservedPort;
using hub_testing::ValueOr;

// One hub for the whole binary, holding the mlp cell published by a platform publisher.
struct Fleet {
  std::string root;
  std::unique_ptr<Hub> hub;
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
    f->hub = std::make_unique<Hub>(f->root + "/hub");
    ASSERT_TRUE(f->hub->Start());
    ASSERT_TRUE(f->hub->MintAndPublish(f->root + "/a", "mlp", &f->ref));
    f->key = KeyOf(f->ref);
    f->jwks_path = f->root + "/jwks.json";
    ASSERT_TRUE(f->hub->WriteJwks(f->jwks_path));
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

// Manifest lines that keep a worker from minting (its memory budget is too small for any mint),
// so a test of a refused adoption sees that nothing at all was loaded: a refused adoption falls to
// the ordinary miss policy, and this policy's mint is skipped.
constexpr const char* kNoMint = "[mint]\nmemory_budget_mb = 1\n";

// The mlp manifest with the options' changes; a [hub] section uses the worker token and a 3 s
// timeout.
std::string MlpManifest(ManifestOptions o = {}) {
  o.hub_timeout_ms = 3000;
  return Manifest(o);
}

ManifestOptions WithHub(const std::string& url, const std::string& extra = kNoMint) {
  ManifestOptions o;
  o.hub_url = url;
  o.extra = extra;
  return o;
}

// One infer request on the mlp function with a [rows, 64] input.
Worker::Answer Infer(const Worker& w, int rows = 1) {
  std::vector<float> data;
  for (int i = 0; i < rows * 64; ++i) data.push_back(static_cast<float>(i % 13) / 13.0f - 0.5f);
  return w.Infer("mlp", {{"x", Tensor::FromVector<float>({rows, 64}, data)}});
}

class Refusals : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(g_fleet, nullptr) << "the fleet fixture failed to start";
    dir_ = g_fleet->root + "/" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }
  // Mints the mlp cell into this test's machine directory (its local store).
  ::testing::AssertionResult MintLocally() {
    std::string ref;
    return Mint(dir_, "mlp", &ref);
  }
  std::string dir_;
  std::string ref_;
};

// The boot's adoption was refused with boot_adopt `phase`: the miss policy ran and skipped its
// mint (kNoMint), the first request is served eager, the rows are exactly these three, the
// refusal's detail names `why` (when given), no cell is on disk or mapped (with
// `nothing_loaded`), and SIGTERM drains to exit 0.
void ExpectServedEagerAfterRefusal(Worker& w, const char* phase, const std::string& why,
                                   bool nothing_loaded) {
  auto a = Infer(w);
  ASSERT_EQ(a.status, 200) << a.body.dump();
  EXPECT_EQ(a.mode(), "eager");
  EXPECT_EQ(w.RowsInSeqOrder(), Expect({{"boot_adopt", phase},
                                        {"self_mint_skipped", "insufficient_memory"},
                                        {"serve_eager_posture", "insufficient_memory"}}));
  if (!why.empty()) {
    EXPECT_TRUE(DetailNames(w.FirstRow("boot_adopt").value_or(Row{}), why));
  }
  if (nothing_loaded) {
    EXPECT_EQ(w.LoadedCellFiles(), 0u);
    EXPECT_FALSE(w.MapsACell());
  }
  EXPECT_EQ(w.Stop(), 0);
}

TEST_F(Refusals, LocalStoreHitWithNoHubServesTheFirstRequestFromTheCell) {
  ASSERT_TRUE(MintLocally());
  Worker w(dir_, MlpManifest());
  ASSERT_TRUE(w.Start());
  auto a = Infer(w);
  ASSERT_EQ(a.status, 200) << a.body.dump();
  EXPECT_EQ(a.mode(), "aot_cell");
  EXPECT_EQ(a.ref(), g_fleet->ref);
  EXPECT_EQ(w.RowsInSeqOrder(),
            Expect({{"serve_posture", "aot_cell"}, {"boot_adopt", "local_hit"}}));
  EXPECT_EQ(w.Stop(), 0);
}

TEST_F(Refusals, InjectedCellFaultServesThatRequestEagerAndRevokesTheCellForGood) {
  ASSERT_TRUE(MintLocally());
  Worker w(dir_, MlpManifest(), {{"KILN_TEST_CELL_FAULT", "mlp:fault@2"}});
  ASSERT_TRUE(w.Start());
  EXPECT_EQ(Infer(w).mode(), "aot_cell");
  auto faulted = Infer(w);
  ASSERT_EQ(faulted.status, 200) << faulted.body.dump();
  EXPECT_EQ(faulted.mode(), "eager");
  EXPECT_EQ(faulted.reason(), "cell_fault");
  for (int i = 0; i < 3; ++i) {
    auto later = Infer(w);
    EXPECT_EQ(later.mode(), "eager");
    EXPECT_EQ(later.reason(), "compiled_degraded");
    EXPECT_EQ(later.ref(), "");
  }
  EXPECT_EQ(w.RowsInSeqOrder(), Expect({{"serve_posture", "aot_cell"},
                                        {"boot_adopt", "local_hit"},
                                        {"serve_degrade", "cell_fault"},
                                        {"serve_eager_posture", "compiled_degraded"}}));
  EXPECT_EQ(w.Stop(), 0);
}

TEST_F(Refusals, InjectedAllocationFailureServesEagerAndTheCellStaysArmed) {
  ASSERT_TRUE(MintLocally());
  Worker w(dir_, MlpManifest(), {{"KILN_TEST_CELL_FAULT", "mlp:oom@1"}});
  ASSERT_TRUE(w.Start());
  auto oom = Infer(w);
  ASSERT_EQ(oom.status, 200) << oom.body.dump();
  EXPECT_EQ(oom.mode(), "eager");
  EXPECT_EQ(oom.reason(), "cell_oom");
  EXPECT_EQ(Infer(w).mode(), "aot_cell");
  EXPECT_EQ(w.RowsInSeqOrder(), Expect({{"serve_posture", "aot_cell"},
                                        {"boot_adopt", "local_hit"},
                                        {"cell_oom", "stay_armed"}}));
  EXPECT_EQ(w.Stop(), 0);
}

// A mandatory target that misses refuses retryably while its cell is minted (never eager), then
// serves from the cell. The mint child is held busy for a few seconds (KILN_TEST_MINT_BUSY_S) so
// the first request lands during the mint on any machine.
TEST_F(Refusals, MandatoryTargetRefusesRetryablyUntilItsCellArmsAndNeverAnswersEager) {
  ManifestOptions mandatory;
  mandatory.lane = "mandatory";
  Worker w(dir_, MlpManifest(mandatory), {{"KILN_TEST_MINT_BUSY_S", "3"}});
  ASSERT_TRUE(w.Start());
  EXPECT_EQ(w.ReadyStatus(), 503);
  auto a = Infer(w);
  EXPECT_EQ(a.status, 503) << a.body.dump();
  EXPECT_EQ(a.retry_after, "1");
  EXPECT_NE(a.body.value("error", "").find("required_compile_missing"), std::string::npos)
      << a.body.dump();
  ASSERT_TRUE(w.WaitForRow("mint_phases", "", 120000));
  EXPECT_EQ(w.ReadyStatus(), 200);
  auto b = Infer(w);
  ASSERT_EQ(b.status, 200) << b.body.dump();
  EXPECT_EQ(b.mode(), "aot_cell");
  EXPECT_EQ(w.RowsInSeqOrder(), MissThenMinted("local_miss_no_hub"));
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
      if (req.path.rfind("/v1/blobs/", 0) == 0) ++blobs_;
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
  int blob_requests() const { return blobs_.load(); }

 private:
  httplib::Client hub_;
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  std::atomic<int> forged_{0};
  std::atomic<int> blobs_{0};
};

TEST_F(Refusals, ForgedReceiptIsRefusedBeforeAnythingIsFetchedOrLoaded) {
  ForgingProxy proxy(g_fleet->hub->port());
  // The worker trusts the hub's own key set, fetched through the proxy.
  Worker w(dir_, MlpManifest(WithHub(proxy.url())));
  ASSERT_TRUE(w.Start());
  EXPECT_EQ(proxy.forged(), 1);
  EXPECT_EQ(proxy.blob_requests(), 0);
  ExpectServedEagerAfterRefusal(w, "receipt_refused", "receipt_bad_signature", true);
}

// A refused adoption is not the end: the lane's ordinary miss policy mints the key here, with
// the refusal as the posture token meanwhile, and the worker then serves its own cell. Nothing
// of the refused answer was fetched.
TEST_F(Refusals, ARefusedAdoptionFallsToTheMissPolicyAndMints) {
  ForgingProxy proxy(g_fleet->hub->port());
  Worker w(dir_, MlpManifest(WithHub(proxy.url(), "")));
  ASSERT_TRUE(w.Start());
  auto first = Infer(w);
  ASSERT_EQ(first.status, 200) << first.body.dump();
  EXPECT_EQ(first.mode(), "eager");
  EXPECT_EQ(first.reason(), "mint_in_progress");
  Row boot;
  ASSERT_TRUE(w.WaitForRow("boot_adopt", "receipt_refused", 10000, &boot));
  ASSERT_TRUE(w.WaitForRow("local_cell_armed", "armed", 120000));
  EXPECT_EQ(proxy.blob_requests(), 0) << "nothing of the refused answer was fetched";
  auto a = Infer(w);
  ASSERT_EQ(a.status, 200) << a.body.dump();
  EXPECT_EQ(a.mode(), "aot_cell");
  EXPECT_EQ(a.ref(), g_fleet->ref) << "minting is deterministic: the same cell, built here";
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

  Worker w(dir_, MlpManifest(WithHub(g_fleet->hub->url())));
  ASSERT_TRUE(w.Start());
  ExpectServedEagerAfterRefusal(w, "digest_mismatch", "digest_mismatch", true);
}

TEST_F(Refusals, CellBuiltForAHigherSmThanThisMachineRunsIsRefused) {
  // The fleet's manifest pins x86-64-v3; this worker's machine runs only up to x86-64-v2.
  ManifestOptions o = WithHub(g_fleet->hub->url());
  o.sm = "x86-64-v3";
  Worker w(dir_, MlpManifest(o), {{"KILN_TEST_SM_LEVEL", "x86-64-v2"}});
  ASSERT_TRUE(w.Start());
  ExpectServedEagerAfterRefusal(w, "sm_mismatch", "", true);
}

// A hub that is down at boot is a typed refusal, never a miss: the target serves eager with the
// refusal as its posture while the adoption is retried in the background; when the hub comes
// back the cell is adopted within the retry bound (hub.adopt_retry_max_s), with no restart.
TEST_F(Refusals, HubDownAtBootThenBackAdoptsWithinTheRetryBound) {
  ReservedPort port;  // refuses connections; no parallel test can take it meanwhile
  ManifestOptions o = WithHub("http://127.0.0.1:" + std::to_string(port.port()));
  o.hub_extra = "adopt_retry_max_s = 2\n";
  Worker w(dir_, MlpManifest(o));
  ASSERT_TRUE(w.Start());
  auto a = Infer(w);
  ASSERT_EQ(a.status, 200) << a.body.dump();
  EXPECT_EQ(a.mode(), "eager");
  EXPECT_EQ(a.reason(), "resolve_refused");
  EXPECT_EQ(w.RowsInSeqOrder()[0], Expect({{"boot_adopt", "resolve_refused"}})[0]);
  EXPECT_TRUE(DetailNames(w.FirstRow("boot_adopt").value_or(Row{}), "hub_unreachable"));
  EXPECT_FALSE(w.FirstRow("self_mint_started")) << "a hub that could not be asked is no miss";

  // The hub comes back on that port, already holding the cell (published while it listened
  // elsewhere, so no retry in between sees a miss).
  Hub back(dir_ + "-hub");
  ASSERT_TRUE(back.Start());
  ASSERT_TRUE(back.MintAndPublish(dir_ + "-publisher", "mlp", &ref_));
  back.Stop();
  port.Release();
  ASSERT_TRUE(back.Start(port.port()));
  const auto published = std::chrono::steady_clock::now();
  ASSERT_TRUE(w.WaitForRow("boot_adopt", "hit", 30000));
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - published).count();
  std::fprintf(stderr, "adopted %.2f s after the hub came back (retry bound 2 s)\n", waited);
  EXPECT_LE(waited, 2.0 + 8.0) << "the retry bound is 2 s; the rest is slack for a loaded machine";
  auto b = Infer(w);
  ASSERT_EQ(b.status, 200) << b.body.dump();
  EXPECT_EQ(b.mode(), "aot_cell");
  EXPECT_EQ(b.ref(), ref_);
  EXPECT_FALSE(w.FirstRow("self_mint_started"));
  EXPECT_EQ(w.Stop(), 0);
}

TEST_F(Refusals, HubHitIsAotCellAndTheRowsReachTheHub) {
  Worker w(dir_, MlpManifest(WithHub(g_fleet->hub->url())));
  ASSERT_TRUE(w.Start());
  auto a = Infer(w);
  ASSERT_EQ(a.status, 200) << a.body.dump();
  EXPECT_EQ(a.mode(), "aot_cell");
  EXPECT_EQ(w.RowsInSeqOrder(), Expect({{"serve_posture", "aot_cell"}, {"boot_adopt", "hit"}}));
  EXPECT_EQ(w.Stop(), 0);  // the drain flushes the forwarder
  auto rows = g_fleet->hub->Client(kAdmin)->Call("GET", "/v1/events?kind=boot_adopt&limit=100");
  ASSERT_TRUE(rows.ok()) << rows.token << ": " << rows.message;
  bool found = false;
  for (const auto& r : rows.body["events"]) {
    const std::string worker = r.value("worker", "");
    if (r["phase"] == "hit" && r["key"] == g_fleet->key &&
        worker.find("/mlp@") != std::string::npos) {
      found = true;
    }
  }
  EXPECT_TRUE(found) << rows.body.dump();
}

}  // namespace
}  // namespace kiln
