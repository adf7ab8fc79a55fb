// One mint per cold key across a fleet (docs/fleet.md "One mint per cold key"), end to end with
// real processes on loopback: one `kiln hub` with a short mint lease TTL and several `kiln worker`
// processes, each with its own cache directory (one "machine" each), booting on the same key the
// hub has no cell for. Mints are counted from the workers' event rows (`self_mint_started child`
// is written once per mint child started).
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <future>
#include <thread>

#include "src/kiln/tensor/npy.h"
#include "tests/worker/worker_process.h"

namespace kiln {
namespace {

using namespace kiln::worker_testing;  // NOLINT: the process fixtures

// Under ASan a mint and the hub's rebuild run several times slower: generous, not tuned.
constexpr int kMintWaitMs = 120000;
// The hub's lease TTL in these tests: heartbeats every 2/3 s, a dead holder's key free 2 s after
// its last heartbeat.
constexpr int kLeaseTtlS = 2;

std::map<std::string, Tensor> MlpInput() {
  auto x = ReadNpy(ExampleDir("mlp") + "inputs/x.npy");
  return {{"x", x.ok() ? *x : Tensor()}};
}

// The mlp example cut to the one class the tests send ([4, 64]), publishing to `hub` as the
// platform publisher.
std::string FleetManifest(const Hub& hub, const std::string& token = hub_testing::kPlatform) {
  ManifestOptions o;
  o.hub_url = hub.url();
  o.hub_token = token;
  o.hub_timeout_ms = 30000;
  std::string text = Manifest(o);
  const std::string more = "  { x = [1, 64] },\n  { x = [4, 64] },\n  { x = [16, 64] },\n";
  const size_t at = text.find(more);
  if (at != std::string::npos) text.replace(at, more.size(), "  { x = [4, 64] },\n");
  return text;
}

int Count(const Worker& w, const std::string& kind, const std::string& phase) {
  int n = 0;
  for (const Row& r : w.Rows()) n += r.kind == kind && r.phase == phase;
  return n;
}

class MintLeaseEndToEnd : public MachinesTest {
 protected:
  void StartHub(int ttl_s = kLeaseTtlS) {
    hub_ = std::make_unique<Hub>(root_ + "/hub");
    hub_->process().AddArgs({"--mint-lease-ttl", std::to_string(ttl_s)});
    ASSERT_TRUE(hub_->Start());
  }
  // Waits until `w` serves its cell (a hit it adopted, or its own mint) and returns the ref.
  std::string WaitServing(const Worker& w) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(kMintWaitMs);
    while (std::chrono::steady_clock::now() < until) {
      const auto r = w.Infer("mlp", MlpInput());
      if (r.mode() == "aot_cell") return r.ref();
      EXPECT_EQ(r.status, 200) << r.body.dump();
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    ADD_FAILURE() << "no cell served after " << kMintWaitMs << " ms; log:\n" << w.Log();
    return "";
  }
  std::unique_ptr<Hub> hub_;
};

// Four workers boot together on the same cold key: one holds the lease and mints, the other three
// wait (`self_mint_skipped lease_held`) serving eager, and adopt its published cell with a hit.
// Exactly one mint child runs in the fleet, and the hub holds one row.
TEST_F(MintLeaseEndToEnd, FourWorkersOnAColdKeyMintOnceAndAllServeTheCell) {
  // A TTL that a loaded machine (the hub's rebuild, ASan) cannot miss by a late heartbeat: this
  // case counts mints, so a spurious takeover would be a second one.
  StartHub(5);
  std::vector<std::unique_ptr<Worker>> workers;
  for (int i = 0; i < 4; ++i) {
    workers.push_back(
        std::make_unique<Worker>(root_ + "/w" + std::to_string(i), FleetManifest(*hub_)));
  }
  // All four boot at once: started one after another, a worker booting after the mint published
  // would adopt at boot and never meet the lease (seen under ASan, where each boot is slow).
  std::vector<std::future<::testing::AssertionResult>> booting;
  for (auto& w : workers) {
    booting.push_back(std::async(std::launch::async, [&w] { return w->Start(); }));
  }
  for (auto& b : booting) ASSERT_TRUE(b.get());
  std::string ref;
  int mints = 0, waiters = 0;
  for (auto& w : workers) {
    const std::string served = WaitServing(*w);
    if (ref.empty()) ref = served;
    EXPECT_EQ(served, ref);
  }
  for (auto& w : workers) {
    mints += Count(*w, "self_mint_started", "child");
    waiters += Count(*w, "self_mint_skipped", "lease_held");
  }
  EXPECT_EQ(mints, 1);
  EXPECT_EQ(waiters, 3);
  // The minter's rows are a plain mint's; each waiter missed, waited, and adopted with a hit.
  // They boot together, so whichever asked first holds the lease.
  size_t holder = workers.size();
  for (size_t i = 0; i < workers.size(); ++i) {
    if (Count(*workers[i], "self_mint_started", "child") == 1) holder = i;
  }
  ASSERT_LT(holder, workers.size()) << "no worker minted";
  const auto started = workers[holder]->FirstRow("self_mint_started", "child");
  ASSERT_TRUE(started.has_value());
  EXPECT_TRUE(DetailNames(*started, "lease=held"));
  ASSERT_TRUE(workers[holder]->WaitForRow("self_mint_publish", "published", kMintWaitMs));
  // (Every poll is an adoption attempt with its own boot_adopt row: misses until the cell is
  // published, then the hit.)
  for (size_t i = 0; i < workers.size(); ++i) {
    if (i == holder) continue;
    std::vector<Row> rows = workers[i]->RowsWithout({"serve_eager_posture", "serve_posture"});
    ASSERT_GE(rows.size(), 3u) << workers[i]->Log();
    EXPECT_EQ(rows.front(), Expect({{"boot_adopt", "miss"}})[0]);
    EXPECT_EQ(rows[1], Expect({{"self_mint_skipped", "lease_held"}})[0]);
    EXPECT_TRUE(DetailNames(rows[1], "holder=mlp@"));
    EXPECT_EQ(rows.back(), Expect({{"boot_adopt", "hit"}})[0]);
    for (size_t r = 2; r + 1 < rows.size(); ++r) {
      EXPECT_EQ(rows[r], Expect({{"boot_adopt", "miss"}})[0]) << "row " << r;
    }
  }
  EXPECT_EQ(hub_->CellRows(KeyOf(ref)), 1);
  for (auto& w : workers) EXPECT_EQ(w->Stop(), 0);
}

// The lease holder is SIGKILLed mid-mint: its heartbeats stop, and one of the waiting workers
// takes the lease over within the TTL (plus a poll) and mints; the fleet then serves its cell.
TEST_F(MintLeaseEndToEnd, AHolderKilledMidMintIsTakenOverWithinTheLease) {
  StartHub();
  // The holder's child spins long enough to be killed mid-mint (mint/child.h test switch).
  Worker holder(root_ + "/holder", FleetManifest(*hub_), {{"KILN_TEST_MINT_BUSY_S", "30"}});
  ASSERT_TRUE(holder.Start());
  ASSERT_TRUE(holder.WaitForRow("self_mint_started", "child", kMintWaitMs));
  Worker b(root_ + "/b", FleetManifest(*hub_));
  Worker c(root_ + "/c", FleetManifest(*hub_));
  ASSERT_TRUE(b.Start());
  ASSERT_TRUE(c.Start());
  ASSERT_TRUE(b.WaitForRow("self_mint_skipped", "lease_held", kMintWaitMs));
  ASSERT_TRUE(c.WaitForRow("self_mint_skipped", "lease_held", kMintWaitMs));
  // Waiting across a few heartbeats: the holder keeps the lease while it lives.
  std::this_thread::sleep_for(std::chrono::seconds(kLeaseTtlS + 1));
  EXPECT_EQ(Count(b, "self_mint_started", "child") + Count(c, "self_mint_started", "child"), 0);

  const auto killed = std::chrono::steady_clock::now();
  ::kill(holder.pid(), SIGKILL);  // its mint child dies with it (PR_SET_PDEATHSIG)
  ::waitpid(holder.pid(), nullptr, 0);
  holder.Forget();
  double takeover_ms = -1;
  const auto until = killed + std::chrono::milliseconds(kMintWaitMs);
  while (std::chrono::steady_clock::now() < until) {
    if (Count(b, "self_mint_started", "child") + Count(c, "self_mint_started", "child") > 0) {
      takeover_ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - killed)
              .count();
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_GE(takeover_ms, 0) << "nobody took over; b:\n" << b.Log() << "\nc:\n" << c.Log();
  std::printf("mint lease takeover: %.0f ms after SIGKILL (TTL %d s)\n", takeover_ms, kLeaseTtlS);
  // The bound: the TTL from the last heartbeat, the waiter's poll (a tenth of the TTL past the
  // expiry it saw) and its resolve and ask; a second of slack for two loaded cores.
  EXPECT_LE(takeover_ms, kLeaseTtlS * 1000 * 1.1 + 1000);

  const std::string ref_b = WaitServing(b);
  const std::string ref_c = WaitServing(c);
  EXPECT_FALSE(ref_b.empty());
  EXPECT_EQ(ref_b, ref_c);
  EXPECT_EQ(Count(b, "self_mint_started", "child") + Count(c, "self_mint_started", "child"), 1);
  EXPECT_EQ(hub_->CellRows(KeyOf(ref_b)), 1);
  EXPECT_EQ(b.Stop(), 0);
  EXPECT_EQ(c.Stop(), 0);
}

// A holder whose mint fails (the parent's strict gate refuses a gray-band cell) releases the
// lease at once: with a 30 s TTL, a waiter mints well before the lease could have expired.
TEST_F(MintLeaseEndToEnd, AFailedMintReleasesTheLeaseForTheNextWorker) {
  constexpr int kLongTtlS = 30;
  StartHub(kLongTtlS);
  Worker a(root_ + "/a", FleetManifest(*hub_), {{"KILN_TEST_MINT_PERTURB", "gray"}});
  ASSERT_TRUE(a.Start());
  ASSERT_TRUE(a.WaitForRow("self_mint_started", "child", kMintWaitMs));
  Worker b(root_ + "/b", FleetManifest(*hub_));
  ASSERT_TRUE(b.Start());
  Row held;
  ASSERT_TRUE(b.WaitForRow("self_mint_skipped", "lease_held", kMintWaitMs, &held));
  ASSERT_TRUE(a.WaitForRow("self_mint_abort", "", kMintWaitMs));
  const auto aborted = std::chrono::steady_clock::now();
  ASSERT_TRUE(b.WaitForRow("self_mint_started", "child", kMintWaitMs));
  const double waited_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - aborted).count();
  std::printf("mint lease after a failed mint: the next worker started %.0f ms after the abort\n",
              waited_ms);
  // The waiter's polls back off to 10 s at most; an unreleased lease would hold 30 s.
  EXPECT_LT(waited_ms, kLongTtlS * 1000 / 2) << b.Log();
  EXPECT_FALSE(WaitServing(b).empty());
  EXPECT_EQ(a.Stop(), 0);
  EXPECT_EQ(b.Stop(), 0);
}

// A worker whose token may not publish is refused the lease (403 forbidden): the lease only
// spares work, so it mints here as without a hub, and says so on its row (lease=none).
TEST_F(MintLeaseEndToEnd, ALeaseTheHubRefusesMintsLocally) {
  StartHub();
  Worker w(root_ + "/w", FleetManifest(*hub_, hub_testing::kWorker));
  ASSERT_TRUE(w.Start());
  Row started;
  ASSERT_TRUE(w.WaitForRow("self_mint_started", "child", kMintWaitMs, &started));
  EXPECT_TRUE(DetailNames(started, "lease=none"));
  EXPECT_FALSE(WaitServing(w).empty());
  EXPECT_FALSE(w.FirstRow("self_mint_skipped", "lease_held").has_value());
  EXPECT_NE(w.Log().find("mint lease of"), std::string::npos) << w.Log();
  EXPECT_EQ(w.Stop(), 0);
}

}  // namespace
}  // namespace kiln
