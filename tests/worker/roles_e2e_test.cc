// Least-privilege fleet tokens end to end, with real processes on loopback: a `kiln hub` and a
// `kiln worker` that holds only a worker token of org "acme" (which may write "acme/mlp" alone).
// The worker misses, mints in a child, publishes its own cell with that token, and its event rows
// reach the hub under its org; the same token is refused, each by its token, when it publishes
// into another org's family or the platform's, revokes, rotates the signing key, or reads another
// org's events or obligations (docs/hub-api.md "Roles").
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "src/kiln/tensor/npy.h"
#include "tests/hub/hub_fixtures.h"
#include "tests/worker/worker_process.h"

namespace kiln {
namespace {

using namespace kiln::worker_testing;  // NOLINT: the process fixtures

constexpr int kMintWaitMs = 120000;

// The mlp example exporting `family`, with its envelope cut to one class (one quick mint), and
// the hub reached with `token`.
std::string FleetManifest(const Hub& hub, const std::string& token, const std::string& family) {
  ManifestOptions o;
  o.hub_url = hub.url();
  o.hub_token = token;
  o.family = family;
  std::string text = Manifest(o);
  const std::string more = "  { x = [1, 64] },\n  { x = [4, 64] },\n  { x = [16, 64] },\n";
  const size_t at = text.find(more);
  if (at != std::string::npos) text.replace(at, more.size(), "  { x = [4, 64] },\n");
  return text;
}

// The hub's event rows `token` reads for `query` ("kind=…"), once at least one is there.
nlohmann::json HubEvents(const Hub& hub, const std::string& token, const std::string& query,
                         int timeout_ms) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  nlohmann::json rows = nlohmann::json::array();
  do {
    HubAnswer a = hub.Client(token)->Call("GET", "/v1/events?" + query);
    if (a.ok() && a.body.contains("events")) rows = a.body["events"];
    if (!rows.empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  } while (std::chrono::steady_clock::now() < until);
  return rows;
}

using RolesEndToEnd = MachinesTest;

TEST_F(RolesEndToEnd, AWorkerTokenPublishesItsOwnCellReportsAndIsRefusedEverythingElse) {
  Hub hub(root_ + "/hub");
  ASSERT_TRUE(hub.Start());
  Worker w(root_ + "/w", FleetManifest(hub, hub_testing::kAcmeFleet, "acme/mlp"));
  ASSERT_TRUE(w.Start());

  // 1. Its self-minted cell publishes with the worker token, signed as the org's.
  Row published;
  ASSERT_TRUE(w.WaitForRow("self_mint_publish", "", kMintWaitMs, &published));
  ASSERT_EQ(published.phase, "published") << published.detail << "\n" << w.Log();
  auto acme = hub.Client(hub_testing::kAcmeFleet);
  auto x = ReadNpy(ExampleDir("mlp") + "inputs/x.npy");
  ASSERT_TRUE(x.ok()) << x.status().ToString();
  const auto served = w.Infer("mlp", {{"x", *x}});
  ASSERT_EQ(served.mode(), "aot_cell");
  const ResolveAnswer cell = acme->Resolve(KeyOf(served.ref()), "acme/mlp");
  ASSERT_EQ(cell.kind, ResolveAnswer::Kind::kFound);
  EXPECT_EQ(cell.family, "acme/mlp");
  EXPECT_EQ(cell.tier, "org");
  EXPECT_EQ(cell.publisher, "acme-fleet");

  // 2. Its events reach the hub, recorded under its org, and it reads them back.
  const nlohmann::json rows =
      HubEvents(hub, hub_testing::kAcmeFleet, "kind=self_mint_publish", 30000);
  ASSERT_FALSE(rows.empty()) << w.Log();
  EXPECT_EQ(rows[0]["org"], "acme");
  EXPECT_EQ(rows[0]["phase"], "published");
  EXPECT_EQ(rows[0]["worker"].get<std::string>().rfind("acme-fleet", 0), 0u) << rows[0].dump();

  // 3. A publish into another org's family or the platform's is refused by name.
  for (const char* family : {"beta/mlp", "root/mlp", "acme/not-granted"}) {
    const std::string foreign =
        hub_testing::MakeCell(hub_testing::MakeMetadata(hub_testing::Graph(7), family));
    PublishAnswer p = acme->Publish(foreign, {});
    EXPECT_EQ(p.http_status, 403) << family << ": " << p.token << " " << p.message;
    EXPECT_EQ(p.token, "family_forbidden") << family;
  }

  // 4. It never revokes (not even its own cell) and never rotates the signing key.
  HubAnswer revoke = acme->Call(
      "POST", "/v1/admin/revoke",
      nlohmann::json{{"key", cell.key}, {"digest", cell.digest}, {"reason", "mine"}}.dump());
  EXPECT_EQ(revoke.http_status, 403);
  EXPECT_EQ(revoke.token, "forbidden");
  HubAnswer rotate = acme->Call("POST", "/v1/admin/rotate-key", "{}");
  EXPECT_EQ(rotate.http_status, 403);
  EXPECT_EQ(rotate.token, "forbidden");
  EXPECT_EQ(acme->Resolve(cell.key, "acme/mlp").kind, ResolveAnswer::Kind::kFound);

  // 5. Another org's rows: beta's events and obligations are refused to acme's token by name,
  // and acme's own reads never return them.
  auto beta = hub.Client(hub_testing::kBetaFleet);
  ASSERT_TRUE(beta->PostEvents(nlohmann::json::array(
                                   {{{"seq", 1}, {"kind", "boot_adopt"}, {"detail", "beta-row"}}}))
                  .ok());
  HubAnswer forbidden_events = acme->Call("GET", "/v1/events?org=beta");
  EXPECT_EQ(forbidden_events.http_status, 403);
  EXPECT_EQ(forbidden_events.token, "scope_forbidden");
  HubAnswer all_mine = acme->Call("GET", "/v1/events?limit=10000");
  ASSERT_TRUE(all_mine.ok()) << all_mine.message;
  for (const auto& e : all_mine.body["events"]) EXPECT_EQ(e["org"], "acme") << e.dump();
  EXPECT_EQ(HubEvents(hub, hub_testing::kAdmin, "org=beta", 5000).size(), 1u);

  const std::string rel = "beta-rel-" + hub_testing::Nonce();
  ASSERT_TRUE(hub.Client(hub_testing::kAdmin)
                  ->Call("POST", "/v1/releases",
                         nlohmann::json{{"name", rel},
                                        {"org", "beta"},
                                        {"targets", {{{"target", "mlp"}, {"sm", "x86-64-v3"}}}}}
                             .dump())
                  .ok());
  HubAnswer obligations = acme->Call("GET", "/v1/releases/" + rel + "/obligations");
  EXPECT_EQ(obligations.http_status, 403);
  EXPECT_EQ(obligations.token, "scope_forbidden");
  HubAnswer settle = acme->SettleObligation(rel, "mlp", "x86-64-v3", "no_export_declaration");
  EXPECT_EQ(settle.http_status, 403);
  EXPECT_EQ(settle.token, "scope_forbidden");
  // Beta's own worker token settles its obligation (the route a worker token uses).
  EXPECT_TRUE(beta->SettleObligation(rel, "mlp", "x86-64-v3", "no_export_declaration").ok());
  EXPECT_EQ(w.Stop(), 0);
}

}  // namespace
}  // namespace kiln
