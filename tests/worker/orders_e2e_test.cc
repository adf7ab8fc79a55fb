// The operator's eager-only order with real processes (docs/manifest.md "The eager-only order"):
// given in the manifest, through the admin port, or while the hub is down, it holds every request
// eager while the adoption still checks and keeps the cell but loads nothing (its retries go on),
// no `aot_cell` posture is reported while it holds, it survives a restart, it stops a mint from
// starting, and its lift serves (or mints) the cell.
#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "tests/worker/worker_process.h"

namespace kiln {
namespace {

using namespace kiln::worker_testing;  // NOLINT: the process fixtures

Worker::Answer Infer(const Worker& w) {
  std::vector<float> data;
  for (int i = 0; i < 64; ++i) data.push_back(static_cast<float>(i % 7) / 7.0f - 0.5f);
  return w.Infer("mlp", {{"x", Tensor::FromVector<float>({1, 64}, data)}});
}

// The operator's order on the mlp target through the admin port.
bool Order(const Worker& w, bool on, const std::string& reason) {
  nlohmann::json b = {{"target", "mlp"}, {"on", on}, {"reason", reason}};
  return w.Admin("/v1/admin/eager-only", b).status == 200;
}

// Infers until the answer's serving mode is `mode` (at most `ms`); the last mode seen.
std::string WaitForMode(const Worker& w, const std::string& mode, int ms) {
  std::string seen;
  for (int waited = 0; waited <= ms; waited += 100) {
    seen = Infer(w).mode();
    if (seen == mode) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return seen;
}

// How many serve_posture rows say `aot_cell`.
int AotPostures(const Worker& w) {
  int n = 0;
  for (const Row& r : w.Rows()) n += r.kind == "serve_posture" && r.phase == "aot_cell";
  return n;
}

// True when the worker process maps a loaded cell (every armed cell is a private cell.so).
bool LoadsACell(const Worker& w) {
  const std::string maps = hub_testing::ValueOr(
      ReadFile("/proc/" + std::to_string(w.ServingPid()) + "/maps"), std::string());
  return maps.find("/cell.so") != std::string::npos;
}

class EagerOnly : public MachinesTest {};

// Given in the manifest: the cell is adopted at boot (boot_adopt hit) but every request is eager
// with operator_eager_only and no aot_cell posture is said. The admin's lift serves the cell, and
// that lift is the admin's word at the next boot, over the manifest's.
TEST_F(EagerOnly, FromTheManifestHoldsTheAdoptedCellAndTheAdminsLiftOutlivesARestart) {
  Hub hub(root_ + "/hub");
  ASSERT_TRUE(hub.Start());
  std::string ref;
  ASSERT_TRUE(hub.MintAndPublish(root_ + "/platform", "mlp", &ref));
  ManifestOptions o;
  o.hub_url = hub.url();
  o.eager_only = true;
  const std::string dir = root_ + "/machine";
  {
    Worker w(dir, Manifest(o));
    ASSERT_TRUE(w.Start());
    ASSERT_TRUE(w.WaitForRow("boot_adopt", "hit", 10000)) << w.Log();
    auto a = Infer(w);
    ASSERT_EQ(a.status, 200) << a.body.dump();
    EXPECT_EQ(a.mode(), "eager");
    EXPECT_EQ(a.reason(), "operator_eager_only");
    EXPECT_EQ(AotPostures(w), 0) << "an aot_cell posture while the order holds";
    EXPECT_FALSE(LoadsACell(w)) << "a cell was loaded while the order holds";
    ASSERT_TRUE(Order(w, false, "maintenance over"));
    EXPECT_EQ(WaitForMode(w, "aot_cell", 5000), "aot_cell");
    EXPECT_EQ(Infer(w).ref(), ref);
    EXPECT_TRUE(LoadsACell(w)) << "the check above could not see a loaded cell";
    EXPECT_EQ(w.Stop(), 0);
  }
  Worker again(dir, Manifest(o));
  ASSERT_TRUE(again.Start());
  EXPECT_EQ(Infer(again).mode(), "aot_cell") << again.Log();
  EXPECT_EQ(again.Stop(), 0);
}

// Set while the hub is down: the adoption's retry is not cancelled, so when the hub returns the
// cell is adopted and armed, and still nothing but eager serves and no aot_cell posture is said.
// The order outlives a restart; the lift serves the cell at once.
TEST_F(EagerOnly, SetWhileTheHubIsDownKeepsTheAdoptionRetryAndOutlivesARestart) {
  Hub hub(root_ + "/hub");
  ASSERT_TRUE(hub.Start());
  std::string ref;
  ASSERT_TRUE(hub.MintAndPublish(root_ + "/platform", "mlp", &ref));
  hub.Stop();
  ManifestOptions o;
  o.hub_url = hub.url();
  o.hub_timeout_ms = 2000;
  o.hub_extra = "adopt_retry_max_s = 1\n";
  o.extra = "[mint]\nmemory_budget_mb = 1\n";  // no mint: the cell can only be the hub's
  const std::string dir = root_ + "/machine";
  {
    Worker w(dir, Manifest(o));
    ASSERT_TRUE(w.Start());
    ASSERT_TRUE(w.WaitForRow("boot_adopt", "resolve_refused", 10000)) << w.Log();
    ASSERT_TRUE(Order(w, true, "hub outage"));
    EXPECT_EQ(Infer(w).reason(), "operator_eager_only");
    ASSERT_TRUE(hub.Start());
    ASSERT_TRUE(w.WaitForRow("boot_adopt", "hit", 30000)) << w.Log();
    auto a = Infer(w);
    EXPECT_EQ(a.mode(), "eager");
    EXPECT_EQ(a.reason(), "operator_eager_only");
    EXPECT_EQ(AotPostures(w), 0) << "an aot_cell posture while the order holds";
    EXPECT_FALSE(LoadsACell(w)) << "a cell was loaded while the order holds";
    EXPECT_EQ(w.Stop(), 0);
  }
  Worker again(dir, Manifest(o));
  ASSERT_TRUE(again.Start());
  ASSERT_TRUE(again.WaitForRow("boot_adopt", "local_hit", 10000)) << again.Log();
  auto held = Infer(again);
  EXPECT_EQ(held.mode(), "eager");
  EXPECT_EQ(held.reason(), "operator_eager_only") << "the order did not survive the restart";
  EXPECT_EQ(AotPostures(again), 0);
  EXPECT_FALSE(LoadsACell(again));
  ASSERT_TRUE(Order(again, false, "outage over"));
  EXPECT_EQ(WaitForMode(again, "aot_cell", 5000), "aot_cell");
  EXPECT_EQ(Infer(again).ref(), ref);
  EXPECT_EQ(again.Stop(), 0);
}

// A worker with no hub and no cell: under the manifest's order the miss mints nothing (one
// self_mint_skipped operator_eager_only row, no self_mint_started); the lift starts the mint, and
// the minted cell serves.
TEST_F(EagerOnly, StopsAPendingMintAndTheLiftStartsIt) {
  ManifestOptions o;
  o.eager_only = true;
  Worker w(root_ + "/machine", Manifest(o));
  ASSERT_TRUE(w.Start());
  ASSERT_TRUE(w.WaitForRow("self_mint_skipped", "operator_eager_only", 10000)) << w.Log();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  for (const Row& r : w.Rows()) EXPECT_NE(r.kind, "self_mint_started") << r.detail;
  EXPECT_EQ(Infer(w).reason(), "operator_eager_only");
  EXPECT_FALSE(LoadsACell(w));
  ASSERT_TRUE(Order(w, false, "go"));
  ASSERT_TRUE(w.WaitForRow("self_mint_started", "child", 10000)) << w.Log();
  EXPECT_EQ(WaitForMode(w, "aot_cell", 180000), "aot_cell") << w.Log();
  EXPECT_EQ(w.Stop(), 0);
}

}  // namespace
}  // namespace kiln
