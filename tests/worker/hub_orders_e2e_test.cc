// Hub orders with real processes (docs/fleet.md "Hub orders"): one `kiln hub` holding two cells of
// the mlp model — the build for this machine's sm level and the conservative x86-64-v2 build — and
// eight `kiln worker` processes polling the signed list every second. A canary moves exactly the
// workers its share selects by worker id, a pin moves all, a rollback (a pin of the earlier cell)
// brings all back, an eager order holds them all eager, and a replayed older order (a list the
// hub signed before the newest one, still fresh) is ignored by the dispatch fence, across a
// restart too.
#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "src/kiln/worker/hub_orders.h"
#include "tests/worker/worker_process.h"

namespace kiln {
namespace {

using namespace kiln::worker_testing;  // NOLINT: the process fixtures
using hub_testing::kAdmin;
using hub_testing::kPlatform;
using hub_testing::ValueOr;
using Clock = std::chrono::steady_clock;

constexpr int kWorkers = 8;

Worker::Answer Infer(const Worker& w) {
  std::vector<float> data;
  for (int i = 0; i < 64; ++i) data.push_back(static_cast<float>(i % 5) / 5.0f - 0.5f);
  return w.Infer("mlp", {{"x", Tensor::FromVector<float>({1, 64}, data)}});
}

class HubOrders : public MachinesTest {
 protected:
  // Mints the mlp example with `sm` ("" = this machine's) and publishes it as the platform.
  ::testing::AssertionResult MintAndPublish(Hub& hub, const std::string& sm, std::string* ref) {
    const std::string dir = root_ + "/publisher-" + (sm.empty() ? "native" : sm);
    ManifestOptions o;
    o.sm = sm;
    if (!MakeDirs(dir).ok() || !WriteFileAtomic(dir + "/kiln.toml", Manifest(o)).ok()) {
      return ::testing::AssertionFailure() << "cannot write " << dir;
    }
    auto mint = Kiln(dir, "mint --manifest " + dir + "/kiln.toml");
    if (mint.first != 0) return ::testing::AssertionFailure() << mint.second;
    *ref = mint.second.substr(0, mint.second.find_first_of(" \n\t"));
    auto pub = Kiln(dir, "publish " + dir + "/cells/" + KeyOf(*ref) + "/cell.tar --hub " +
                             hub.url() + " --token " + kPlatform);
    if (pub.first != 0) return ::testing::AssertionFailure() << pub.second;
    return ::testing::AssertionSuccess();
  }
  // Posts an order for target mlp (release "").
  HubAnswer Order(Hub& hub, const nlohmann::json& order) {
    nlohmann::json body = order;
    body["target"] = "mlp";
    if (!body.contains("reason")) body["reason"] = "drill";
    return hub.Client(kAdmin)->Call("POST", "/v1/admin/orders", body.dump());
  }
  // Waits until every worker serves what `want(i)` says (a ref, or "eager"); the seconds it took,
  // or -1 when the deadline passed (the first worker still off is named in *off).
  double WaitForAll(const std::vector<std::unique_ptr<Worker>>& workers,
                    const std::function<std::string(int)>& want, std::string* off) {
    const auto start = Clock::now();
    while (Clock::now() - start < std::chrono::seconds(30)) {
      int done = 0;
      for (int i = 0; i < static_cast<int>(workers.size()); ++i) {
        auto a = Infer(*workers[i]);
        const std::string got = a.mode() == "aot_cell" ? a.ref() : a.mode() + ":" + a.reason();
        if (got == want(i)) {
          ++done;
        } else {
          *off = "worker " + std::to_string(i) + " serves " + got + ", ordered " + want(i);
        }
      }
      if (done == static_cast<int>(workers.size())) {
        return std::chrono::duration<double>(Clock::now() - start).count();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return -1;
  }
};

TEST_F(HubOrders, CanaryPinRollbackAndEagerReachEveryWorkerAndAStaleOrderLoses) {
  Hub hub(root_ + "/hub");
  ASSERT_TRUE(hub.Start());
  std::string native, v2;
  ASSERT_TRUE(MintAndPublish(hub, "", &native));
  ASSERT_TRUE(MintAndPublish(hub, "x86-64-v2", &v2));
  ASSERT_NE(KeyOf(native), KeyOf(v2)) << "this machine runs only x86-64-v2: nothing to order";

  // The last worker reaches the hub through a fake that can replay an older signed list.
  FakeHub::Replay replay;
  FakeHub fake(hub.port(), replay.answer());
  ManifestOptions o;
  o.hub_url = hub.url();
  o.hub_extra = "revocation_poll_s = 1\n";
  o.extra = "[mint]\nmemory_budget_mb = 1\n";  // every cell is the hub's
  std::vector<std::unique_ptr<Worker>> workers;
  std::vector<std::string> ids;
  for (int i = 0; i < kWorkers; ++i) {
    ManifestOptions mo = o;
    if (i == kWorkers - 1) mo.hub_url = fake.url();
    workers.push_back(std::make_unique<Worker>(root_ + "/w" + std::to_string(i), Manifest(mo)));
    ASSERT_TRUE(workers.back()->Start());
    ids.push_back(
        ValueOr(ReadFile(root_ + "/w" + std::to_string(i) + "/cells/.worker_id"), std::string()));
    while (!ids.back().empty() && ids.back().back() == '\n') ids.back().pop_back();
    ASSERT_EQ(ids.back().size(), 32u);
  }
  std::string off;
  ASSERT_GE(WaitForAll(
                workers, [&](int) { return native; }, &off),
            0)
      << off;

  // Canary: a share between the 4th and 5th canary points moves exactly those four workers.
  std::vector<double> points;
  for (const auto& id : ids) points.push_back(CanaryPoint(id, "", "mlp"));
  std::vector<double> sorted = points;
  std::sort(sorted.begin(), sorted.end());
  const double share = (sorted[3] + sorted[4]) / 2;
  HubAnswer canary = Order(hub, {{"kind", "canary"}, {"ref", v2}, {"share", share}});
  ASSERT_TRUE(canary.ok()) << canary.token << ": " << canary.message;
  EXPECT_EQ(canary.body.value("incarnation", 0), 1);
  const double canary_s = WaitForAll(
      workers, [&](int i) { return points[i] < share ? v2 : native; }, &off);
  ASSERT_GE(canary_s, 0) << off;
  EXPECT_EQ(std::count_if(points.begin(), points.end(), [&](double p) { return p < share; }), 4);

  // Pin: every worker; the list signed now is what the replay serves later.
  ASSERT_TRUE(Order(hub, {{"kind", "pin"}, {"ref", v2}}).ok());
  const double pin_s = WaitForAll(
      workers, [&](int) { return v2; }, &off);
  ASSERT_GE(pin_s, 0) << off;
  HubAnswer pinned_list = hub.Client("")->GetRevocations();
  ASSERT_TRUE(pinned_list.ok());

  // Rollback: a pin of the earlier cell.
  HubAnswer back = Order(hub, {{"kind", "pin"}, {"ref", native}, {"reason", "rollback"}});
  ASSERT_TRUE(back.ok()) << back.message;
  EXPECT_EQ(back.body.value("incarnation", 0), 3);
  const double rollback_s = WaitForAll(
      workers, [&](int) { return native; }, &off);
  ASSERT_GE(rollback_s, 0) << off;
  std::fprintf(stderr, "canary %.2f s, pin %.2f s, rollback %.2f s (poll interval 1 s)\n", canary_s,
               pin_s, rollback_s);
  EXPECT_LE(std::max({canary_s, pin_s, rollback_s}), 1.0 + 14.0)
      << "the bound is the poll interval plus an adoption; the rest is slack for 8 workers";

  // The dashboard shows where the rollback reached: a Serving row per worker naming the earlier
  // cell, beside the order it applied (the rows arrive with the workers' event batches).
  int listed = 0;
  for (int i = 0; i < 100 && listed < kWorkers; ++i) {
    httplib::Client http(hub.url());
    http.set_bearer_token_auth(kAdmin);
    auto page = http.Get("/");
    listed = 0;
    const std::string marker = "</td><td>mlp</td><td>aot_cell</td><td><code>" + native;
    for (size_t at = page ? page->body.find(marker) : std::string::npos; at != std::string::npos;
         at = page->body.find(marker, at + 1)) {
      const std::string row = page->body.substr(at, page->body.find("</tr>", at) - at);
      if (row.find("</code></td><td>pin ") != std::string::npos &&
          row.find("incarnation=3 ") != std::string::npos) {
        ++listed;
      }
    }
    if (listed < kWorkers) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_EQ(listed, kWorkers) << "the dashboard's Serving table does not show the rollback";

  // The stale order: the fake replays the list that carried the pin of v2 (incarnation 2).
  replay.Set(pinned_list.body.dump());
  std::this_thread::sleep_for(std::chrono::milliseconds(3500));
  Worker& behind = *workers.back();
  EXPECT_EQ(Infer(behind).ref(), native) << "a replayed older order won";
  behind.Stop();
  Worker again(root_ + "/w" + std::to_string(kWorkers - 1), Manifest([&] {
                 ManifestOptions mo = o;
                 mo.hub_url = fake.url();
                 return mo;
               }()));
  ASSERT_TRUE(again.Start());
  std::string served;
  for (int i = 0; i < 100 && served != native; ++i) {
    served = Infer(again).ref();
    if (served != native) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(served, native) << "after a restart behind the replay: " << again.Log();
  EXPECT_EQ(again.Stop(), 0);
  replay.Clear();

  // Eager: every worker of the first seven serves eager under the hub's order, then auto again.
  workers.pop_back();
  ASSERT_TRUE(Order(hub, {{"kind", "eager"}}).ok());
  ASSERT_GE(WaitForAll(
                workers, [&](int) { return std::string("eager:hub_order_eager"); }, &off),
            0)
      << off;
  ASSERT_TRUE(Order(hub, {{"kind", "auto"}}).ok());
  ASSERT_GE(WaitForAll(
                workers, [&](int) { return native; }, &off),
            0)
      << off;

  // Bad orders are refused by name.
  EXPECT_EQ(Order(hub, {{"kind", "pin"}}).http_status, 400);
  EXPECT_EQ(Order(hub, {{"kind", "canary"}, {"ref", v2}, {"share", 1.5}}).http_status, 400);
  EXPECT_EQ(Order(hub, {{"kind", "pin"}, {"ref", KeyOf(v2) + "@sha256:" + std::string(64, '0')}})
                .http_status,
            404);
  HubAnswer as_worker =
      hub.Client(hub_testing::kWorker)
          ->Call("POST", "/v1/admin/orders",
                 nlohmann::json{{"target", "mlp"}, {"kind", "auto"}, {"reason", "mine"}}.dump());
  EXPECT_EQ(as_worker.http_status, 403);
  for (auto& w : workers) EXPECT_EQ(w->Stop(), 0);
}

}  // namespace
}  // namespace kiln
