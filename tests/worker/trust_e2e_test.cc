// Trust at adoption, attacked with real processes on loopback (docs/trust.md): a `kiln hub` that
// rebuilds every published cell in its sandbox, tenants and platform publishers using `kiln mint`
// and `kiln publish` as they would, fake hubs in this process, and `kiln worker` processes each
// with its own machine directory. Each test is one attack from docs/trust.md, refused or handled
// with its token; the publish-path attacks that need no worker are in tests/hub/hub_api_test.cc.
#include <gtest/gtest.h>
#include <httplib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "src/kiln/base/file.h"
#include "src/kiln/cell/metadata.h"
#include "src/kiln/cell/pack.h"
#include "tests/worker/worker_process.h"

namespace kiln {
namespace {

using namespace kiln::worker_testing;  // NOLINT: the process fixtures
using hub_testing::kAcme;
using hub_testing::kAdmin;
using hub_testing::kPlatform;
using hub_testing::ValueOr;

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// One infer request on the mlp function.
Worker::Answer Infer(const Worker& w, int rows = 1) {
  std::vector<float> data;
  for (int i = 0; i < rows * 64; ++i) data.push_back(static_cast<float>(i % 11) / 11.0f - 0.5f);
  return w.Infer("mlp", {{"x", Tensor::FromVector<float>({rows, 64}, data)}});
}

// Manifest lines that keep a worker from minting (its memory budget fits no mint), so a test of
// a refusal sees that nothing at all was loaded.
constexpr const char* kNoMint = "[mint]\nmemory_budget_mb = 1\n";

// Runs a shell command line; its exit code and output.
std::pair<int, std::string> Shell(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  char buf[4096];
  size_t n;
  while (p && (n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = p ? ::pclose(p) : -1;
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

class Trust : public MachinesTest {
 protected:
  // A hub holding the mlp cell, minted and published by the platform; its ref in *ref.
  ::testing::AssertionResult StartFleet(Hub* hub, std::string* ref) {
    if (auto s = hub->Start(); !s) return s;
    return hub->MintAndPublish(root_ + "/platform", "mlp", ref);
  }
  // `kiln publish` of a cell tar with `token`; (exit code, output).
  std::pair<int, std::string> Publish(const Hub& hub, const std::string& tar,
                                      const std::string& token) {
    return Kiln(root_ + "/publisher",
                "publish " + tar + " --hub " + hub.url() + " --token " + token);
  }
  // The jwks of `hub` written for a worker's [hub] trust.
  std::string Jwks(const Hub& hub) {
    const std::string path = root_ + "/jwks.json";
    EXPECT_TRUE(hub.WriteJwks(path));
    return path;
  }
};

// The attack of the issue that opened this work: a tenant computes the platform model's key,
// replaces cell.so with a build carrying a constructor payload, and publishes it first under its
// own family. (a) With the source left genuine, the hub's rebuild does not reproduce the .so:
// refused rebuild_mismatch. (b) With the payload in the source too (and the .so built from it),
// the hub's builder vouches for the build, but a worker of the tenant's own scope regenerates the
// source from its graph: source_mismatch, nothing loaded; it mints its own cell. A platform worker
// never sees the tenant's cell (another scope), and the platform's publish is not blocked. The
// payload never runs: its marker file does not exist afterwards.
TEST_F(Trust, TenantConstructorPayloadCellNeverRunsAnywhere) {
  Hub hub(root_ + "/hub");
  ASSERT_TRUE(hub.Start());
  const std::string marker = root_ + "/payload-ran";
  const std::string payload =
      "\n#include <cstdio>\n#include <cstdlib>\n"
      "__attribute__((constructor)) static void kiln_tenant_payload() {\n"
      "  FILE* f = std::fopen(\"" +
      marker +
      "\", \"w\");\n"
      "  if (f) { const char* t = std::getenv(\"KILN_HUB_TOKEN\"); std::fputs(t ? t : \"-\", f);"
      " std::fclose(f); }\n}\n";

  // The tenant mints the public model under its own family: the same key as the platform's.
  ManifestOptions tenant_manifest;
  tenant_manifest.family = "acme/mlp";
  ASSERT_TRUE(MakeDirs(root_ + "/tenant").ok());
  ASSERT_TRUE(WriteFileAtomic(root_ + "/tenant/kiln.toml", Manifest(tenant_manifest)).ok());
  auto mint = Kiln(root_ + "/tenant", "mint --manifest " + root_ + "/tenant/kiln.toml");
  ASSERT_EQ(mint.first, 0) << mint.second;
  const std::string tenant_ref = mint.second.substr(0, mint.second.find_first_of(" \n\t"));
  const std::string key = KeyOf(tenant_ref);
  const CellFiles genuine =
      UnpackCell(ValueOr(ReadFile(root_ + "/tenant/cells/" + key + "/cell.tar"), std::string()),
                 "tenant cell")
          .value();

  // (a) cell.so replaced by a build of the source plus the payload; the source left genuine.
  ASSERT_TRUE(WriteFileAtomic(root_ + "/tenant/payload.cc", genuine.source + payload).ok());
  auto cc = Shell("c++ -O1 -fPIC -shared -o " + root_ + "/tenant/payload.so " + root_ +
                  "/tenant/payload.cc");
  ASSERT_EQ(cc.first, 0) << cc.second;
  CellFiles a = genuine;
  a.shared_object = ValueOr(ReadFile(root_ + "/tenant/payload.so"), std::string());
  ASSERT_TRUE(WriteFileAtomic(root_ + "/tenant/a.tar", PackCell(a).value()).ok());
  auto pub_a = Publish(hub, root_ + "/tenant/a.tar", kAcme);
  EXPECT_EQ(pub_a.first, 1) << pub_a.second;
  EXPECT_NE(pub_a.second.find("rebuild_mismatch"), std::string::npos) << pub_a.second;

  // (b) the payload in the source as well, and cell.so the exact build of that source.
  CellFiles b = genuine;
  b.source = genuine.source + payload;
  ASSERT_TRUE(WriteFileAtomic(root_ + "/tenant/b-unbuilt.tar", PackCell(b).value()).ok());
  auto rebuilt = Kiln(root_ + "/tenant",
                      "rebuild " + root_ + "/tenant/b-unbuilt.tar --out " + root_ + "/tenant/b.so");
  ASSERT_EQ(rebuilt.first, 1) << "the genuine .so is not the payload source's build: "
                              << rebuilt.second;
  b.shared_object = ValueOr(ReadFile(root_ + "/tenant/b.so"), std::string());
  ASSERT_FALSE(b.shared_object.empty());
  ASSERT_TRUE(WriteFileAtomic(root_ + "/tenant/b.tar", PackCell(b).value()).ok());
  auto pub_b = Publish(hub, root_ + "/tenant/b.tar", kAcme);
  ASSERT_EQ(pub_b.first, 0) << "the hub's builder reproduces this .so from its source: "
                            << pub_b.second;

  // A worker of the tenant's own scope: the hub's cell is refused for its source, before load;
  // it then mints the model itself and serves its own cell.
  ManifestOptions own = tenant_manifest;
  own.hub_url = hub.url();
  Worker tenant_worker(root_ + "/tenant-worker", Manifest(own),
                       {{"KILN_HUB_TOKEN", "secret-of-the-tenant-worker"}});
  ASSERT_TRUE(tenant_worker.Start());
  Row refused;
  ASSERT_TRUE(tenant_worker.WaitForRow("boot_adopt", "source_mismatch", 10000, &refused));
  EXPECT_TRUE(DetailNames(refused, "kiln_tenant_payload"));
  ASSERT_TRUE(tenant_worker.WaitForRow("local_cell_armed", "armed", 120000));
  auto served = Infer(tenant_worker);
  ASSERT_EQ(served.status, 200) << served.body.dump();
  EXPECT_EQ(served.mode(), "aot_cell");
  EXPECT_EQ(served.ref(), tenant_ref) << "its own mint: the genuine bytes";

  // A platform worker: the tenant's cell is of another scope; it misses and mints.
  ManifestOptions platform;
  platform.hub_url = hub.url();
  Worker platform_worker(root_ + "/platform-worker", Manifest(platform),
                         {{"KILN_HUB_TOKEN", "secret-of-the-platform-worker"}});
  ASSERT_TRUE(platform_worker.Start());
  ASSERT_TRUE(platform_worker.WaitForRow("boot_adopt", "miss", 10000));
  ASSERT_TRUE(platform_worker.WaitForRow("local_cell_armed", "armed", 120000));
  EXPECT_EQ(Infer(platform_worker).mode(), "aot_cell");

  // The platform's own publish is not blocked by the tenant's cell of the same key.
  std::string platform_ref;
  ASSERT_TRUE(hub.MintAndPublish(root_ + "/platform", "mlp", &platform_ref));
  EXPECT_EQ(KeyOf(platform_ref), key);

  EXPECT_EQ(tenant_worker.Stop(), 0);
  EXPECT_EQ(platform_worker.Stop(), 0);
  EXPECT_FALSE(std::filesystem::exists(marker)) << "the tenant's payload ran somewhere";
}

// Revocation reaches a machine's local store: a worker that adopted a cell, restarted after the
// hub revoked it, refuses its own stored copy (`revoked`), and its mint of the same key gives the
// same bytes, which are refused too. Nothing of the revoked cell is loaded.
TEST_F(Trust, RevokeThenRestartOnTheSameLocalStoreIsRefused) {
  Hub hub(root_ + "/hub");
  std::string ref;
  ASSERT_TRUE(StartFleet(&hub, &ref));
  ManifestOptions o;
  o.hub_url = hub.url();
  Worker first(root_ + "/w", Manifest(o));
  ASSERT_TRUE(first.Start());
  EXPECT_EQ(Infer(first).mode(), "aot_cell");
  EXPECT_EQ(first.Stop(), 0);

  HubAnswer rv = hub.Client(kAdmin)->Revoke(KeyOf(ref), ref.substr(ref.find('@') + 1),
                                            "payload found in the wild");
  ASSERT_TRUE(rv.ok()) << rv.token << ": " << rv.message;
  std::filesystem::remove(root_ + "/w/events.jsonl");

  Worker again(root_ + "/w", Manifest(o));
  ASSERT_TRUE(again.Start());
  Row boot;
  ASSERT_TRUE(again.WaitForRow("boot_adopt", "revoked", 10000, &boot));
  EXPECT_TRUE(DetailNames(boot, "origin=hub"));
  EXPECT_TRUE(DetailNames(boot, "payload found in the wild"));
  Row abort;
  ASSERT_TRUE(again.WaitForRow("self_mint_abort", "revoked", 120000, &abort));
  auto a = Infer(again);
  ASSERT_EQ(a.status, 200) << a.body.dump();
  EXPECT_EQ(a.mode(), "eager");
  EXPECT_FALSE(again.MapsACell());
  EXPECT_EQ(again.Stop(), 0);
}

// Revocation reaches a running worker: polled every second here (30 s by default), the list
// de-arms the revoked cell within the bound, says so on a cell_revoked row, and the target serves
// eager from then on.
TEST_F(Trust, RevokeWhileRunningDeArmsWithinTheBound) {
  Hub hub(root_ + "/hub");
  std::string ref;
  ASSERT_TRUE(StartFleet(&hub, &ref));
  ManifestOptions o;
  o.hub_url = hub.url();
  o.hub_extra = "revocation_poll_s = 1\n";
  o.extra = kNoMint;
  Worker w(root_ + "/w", Manifest(o));
  ASSERT_TRUE(w.Start());
  EXPECT_EQ(Infer(w).mode(), "aot_cell");

  const auto revoked_at = Clock::now();
  HubAnswer rv = hub.Client(kAdmin)->Revoke(KeyOf(ref), ref.substr(ref.find('@') + 1), "drill");
  ASSERT_TRUE(rv.ok()) << rv.token << ": " << rv.message;
  Row row;
  ASSERT_TRUE(w.WaitForRow("cell_revoked", "hub_revoked", 30000, &row));
  const double took = SecondsSince(revoked_at);
  std::fprintf(stderr, "de-armed %.2f s after the revocation (poll interval 1 s)\n", took);
  EXPECT_LE(took, 1.0 + 9.0) << "the bound is the poll interval; the rest is slack";
  EXPECT_TRUE(DetailNames(row, "drill"));
  auto a = Infer(w);
  ASSERT_EQ(a.status, 200) << a.body.dump();
  EXPECT_EQ(a.mode(), "eager");
  EXPECT_EQ(a.reason(), "compiled_degraded");
  EXPECT_EQ(a.ref(), "");
  EXPECT_EQ(w.Stop(), 0);
}

// A lifted revocation reaches every worker: three workers serve the cell, an admin revokes it
// (every one de-arms) and reinstates it (every one adopts it again within the poll bound and an
// adoption). Then one worker's hub replays the list it signed while the revocation held, still
// within its maximum age: the replayed entry's revision is older than the lift the worker applied,
// so the cell stays armed, and a restart of that worker behind the same replay adopts too (the
// revisions it applied are kept on disk).
TEST_F(Trust, RevokeThenReinstateReadoptsEveryWorkerAndAReplayedOlderListLoses) {
  Hub hub(root_ + "/hub");
  std::string ref;
  ASSERT_TRUE(StartFleet(&hub, &ref));
  const std::string key = KeyOf(ref);
  const std::string digest = ref.substr(ref.find('@') + 1);
  FakeHub::Replay replay;
  FakeHub fake(hub.port(), replay.answer());
  ManifestOptions o;
  o.hub_url = hub.url();
  o.hub_extra = "revocation_poll_s = 1\n";
  o.extra = kNoMint;
  ManifestOptions through_fake = o;
  through_fake.hub_url = fake.url();
  std::vector<std::unique_ptr<Worker>> workers;
  workers.push_back(std::make_unique<Worker>(root_ + "/w0", Manifest(o)));
  workers.push_back(std::make_unique<Worker>(root_ + "/w1", Manifest(o)));
  workers.push_back(std::make_unique<Worker>(root_ + "/w2", Manifest(through_fake)));
  for (auto& w : workers) ASSERT_TRUE(w->Start());
  for (auto& w : workers) ASSERT_EQ(Infer(*w).mode(), "aot_cell");

  ASSERT_TRUE(hub.Client(kAdmin)->Revoke(key, digest, "precaution").ok());
  for (auto& w : workers) {
    ASSERT_TRUE(w->WaitForRow("cell_revoked", "hub_revoked", 30000)) << w->Log();
    EXPECT_EQ(Infer(*w).mode(), "eager");
  }
  // The list as the hub signs it while the revocation holds: what the replay serves later.
  HubAnswer while_revoked = hub.Client("")->GetRevocations();
  ASSERT_TRUE(while_revoked.ok()) << while_revoked.message;

  // A worker's token cannot lift a revocation; an admin's can, with a reason.
  HubAnswer as_worker = hub.Client(hub_testing::kWorker)->Reinstate(key, digest, "mine");
  EXPECT_EQ(as_worker.http_status, 403) << as_worker.message;
  EXPECT_EQ(hub.Client(kAdmin)->Reinstate(key, digest, "").http_status, 400);
  const auto lifted_at = Clock::now();
  HubAnswer lifted = hub.Client(kAdmin)->Reinstate(key, digest, "false alarm");
  ASSERT_TRUE(lifted.ok()) << lifted.token << ": " << lifted.message;
  EXPECT_EQ(lifted.body.value("revision", 0), 2);
  EXPECT_TRUE(lifted.body.value("owns_key", false));
  for (auto& w : workers) {
    Row row;
    ASSERT_TRUE(w->WaitForRow("cell_reinstated", "hub_reinstated", 30000, &row)) << w->Log();
    EXPECT_TRUE(DetailNames(row, "false alarm"));
    std::string mode;
    for (int i = 0; i < 200 && mode != "aot_cell"; ++i) {
      mode = Infer(*w).mode();
      if (mode != "aot_cell") std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_EQ(mode, "aot_cell") << w->Log();
  }
  const double took = SecondsSince(lifted_at);
  std::fprintf(stderr, "every worker re-adopted %.2f s after the lift (poll interval 1 s)\n", took);
  EXPECT_LE(took, 1.0 + 14.0) << "the bound is the poll interval plus an adoption; the rest is "
                                 "slack for three workers on two cores";

  // The replay: a list signed while the revocation held, still fresh. Several polls later the
  // worker behind it still serves the cell and de-armed nothing again.
  replay.Set(while_revoked.body.dump());
  std::this_thread::sleep_for(std::chrono::milliseconds(3500));
  Worker& behind = *workers[2];
  auto a = Infer(behind);
  EXPECT_EQ(a.mode(), "aot_cell") << a.body.dump();
  EXPECT_EQ(a.ref(), ref);
  int revoked_rows = 0;
  for (const Row& r : behind.Rows()) revoked_rows += r.kind == "cell_revoked";
  EXPECT_EQ(revoked_rows, 1) << "the replayed list re-killed the reinstated cell";
  EXPECT_EQ(behind.Stop(), 0);
  // Restarted behind the same replay: the applied revisions were kept, the cell adopts.
  Worker again(root_ + "/w2", Manifest(through_fake));
  ASSERT_TRUE(again.Start());
  EXPECT_EQ(Infer(again).mode(), "aot_cell") << again.Log();
  EXPECT_EQ(again.Stop(), 0);
  for (int i = 0; i < 2; ++i) EXPECT_EQ(workers[i]->Stop(), 0);
}

// A fake hub between the worker and the real one: it passes everything through but answers the
// revocation list itself, stripped to an unsigned empty list, or replaying a signed list older
// than the worker allows. The worker pins the real hub's keys; the adoption is refused before a
// byte of the cell is fetched.
TEST_F(Trust, StrippedOrReplayedRevocationListFromAFakeHubIsRefused) {
  Hub hub(root_ + "/hub");
  std::string ref;
  ASSERT_TRUE(StartFleet(&hub, &ref));
  const std::string jwks = Jwks(hub);
  // A list the real hub signed now, to replay later.
  HubAnswer signed_now = hub.Client("")->GetRevocations();
  ASSERT_TRUE(signed_now.ok()) << signed_now.message;

  {
    FakeHub stripped(hub.port(), FakeHub::Revocations(R"({"revocations":[]})"));
    ManifestOptions o;
    o.hub_url = stripped.url();
    o.trust_path = jwks;
    o.extra = kNoMint;
    Worker w(root_ + "/stripped", Manifest(o));
    ASSERT_TRUE(w.Start());
    Row boot;
    ASSERT_TRUE(w.WaitForRow("boot_adopt", "revocations_unsigned", 10000, &boot));
    EXPECT_EQ(stripped.blob_requests(), 0);
    EXPECT_EQ(Infer(w).mode(), "eager");
    EXPECT_EQ(w.LoadedCellFiles(), 0u);
    EXPECT_EQ(w.Stop(), 0);
  }
  {
    FakeHub replay(hub.port(), FakeHub::Revocations(signed_now.body.dump()));
    std::this_thread::sleep_for(std::chrono::milliseconds(2100));  // older than 1 s
    ManifestOptions o;
    o.hub_url = replay.url();
    o.trust_path = jwks;
    o.hub_extra = "revocation_max_age_s = 1\n";
    o.extra = kNoMint;
    Worker w(root_ + "/replayed", Manifest(o));
    ASSERT_TRUE(w.Start());
    Row boot;
    ASSERT_TRUE(w.WaitForRow("boot_adopt", "revocations_stale", 10000, &boot));
    EXPECT_TRUE(DetailNames(boot, "maximum age"));
    EXPECT_EQ(replay.blob_requests(), 0);
    EXPECT_EQ(w.LoadedCellFiles(), 0u);
    EXPECT_EQ(w.Stop(), 0);
  }
  // The same worker configuration against the real hub adopts: the refusals were the fake's.
  ManifestOptions o;
  o.hub_url = hub.url();
  o.trust_path = jwks;
  o.extra = kNoMint;
  Worker w(root_ + "/real", Manifest(o));
  ASSERT_TRUE(w.Start());
  EXPECT_EQ(Infer(w).mode(), "aot_cell");
  EXPECT_EQ(w.Stop(), 0);
}

// A mandatory target whose cell faulted does not refuse "retry later" forever: it mints its key
// again, proves the bytes again on its live checkpoint, and serves from the cell once more.
TEST_F(Trust, MandatoryTargetWhoseCellFaultedRemintsAndServesAgain) {
  std::string ref;
  ASSERT_TRUE(Mint(root_ + "/w", "mlp", &ref));
  ManifestOptions o;
  o.lane = "mandatory";
  Worker w(root_ + "/w", Manifest(o), {{"KILN_TEST_CELL_FAULT", "mlp:fault@2"}});
  ASSERT_TRUE(w.Start());
  EXPECT_EQ(Infer(w).mode(), "aot_cell");
  auto faulted = Infer(w);
  EXPECT_EQ(faulted.status, 503) << faulted.body.dump();
  EXPECT_EQ(faulted.retry_after, "1");
  ASSERT_TRUE(w.WaitForRow("local_cell_armed", "armed", 120000));
  auto again = Infer(w);
  ASSERT_EQ(again.status, 200) << again.body.dump();
  EXPECT_EQ(again.mode(), "aot_cell");
  EXPECT_EQ(again.ref(), ref);
  EXPECT_TRUE(w.FirstRow("serve_degrade", "cell_fault"));
  EXPECT_TRUE(w.FirstRow("self_mint_started", "child"));
  EXPECT_EQ(w.Stop(), 0);
}

}  // namespace
}  // namespace kiln
