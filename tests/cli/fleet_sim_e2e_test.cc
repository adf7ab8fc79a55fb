// `kiln fleet-sim` end to end (docs/fleet.md "Fleet simulator"): a real `kiln hub` on loopback
// holding the mlp cell (minted by `kiln mint`, published by `kiln publish`, rebuilt by the hub's
// builder), simulated workers running the worker's own boot-adopt against it, and the JSON
// report checked against what the hub recorded. Hostile cases: a revoked cell, a receipt tampered
// with on the way (a fake hub in this process), a key set that is not the hub's: every worker
// refuses with the token of the attack and none adopts.
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>

#include "src/kiln/base/file.h"
#include "tests/worker/worker_process.h"

namespace kiln {
namespace {

using namespace kiln::worker_testing;  // NOLINT: the process fixtures
using hub_testing::kAdmin;
using hub_testing::kWorker;

class FleetSim : public MachinesTest {
 protected:
  // A hub holding the mlp cell; its ref in *ref, the workers' manifest (no [hub]) written.
  ::testing::AssertionResult StartHub(Hub* hub, std::string* ref) {
    if (auto s = hub->Start(); !s) return s;
    if (auto p = hub->MintAndPublish(root_ + "/platform", "mlp", ref); !p) return p;
    if (!WriteFileAtomic(ManifestPath(), Manifest(ManifestOptions{})).ok()) {
      return ::testing::AssertionFailure() << "cannot write the manifest";
    }
    return ::testing::AssertionSuccess();
  }
  std::string ManifestPath() const { return root_ + "/kiln.toml"; }
  // Runs `kiln fleet-sim` against `url` with `args` added; the exit code, and the JSON report in
  // *report (null when none was written).
  int Run(const std::string& url, const std::string& args, nlohmann::json* report) {
    const std::string json = root_ + "/report.json";
    std::filesystem::remove(json);
    // Every run is bounded: 120 s unless the case gives its own --timeout.
    const std::string timeout =
        args.find("--timeout ") == std::string::npos ? " --timeout 120 " : " ";
    auto [rc, out] =
        Kiln(root_ + "/sim", "fleet-sim --manifest " + ManifestPath() + " --hub " + url +
                                 " --token " + token_ + " --json " + json + timeout + args);
    output_ = out;
    auto text = ReadFile(json);
    *report = text.ok() ? nlohmann::json::parse(*text, nullptr, false) : nlohmann::json();
    return rc;
  }
  // The hub's boot_adopt rows filed under this test's simulated workers (worker/sim-*).
  std::vector<nlohmann::json> SimRows(const Hub& hub) {
    HubAnswer a = hub.Client(kAdmin)->Call("GET", "/v1/events?kind=boot_adopt&limit=10000");
    EXPECT_TRUE(a.ok()) << a.token << ": " << a.message;
    std::vector<nlohmann::json> rows;
    if (!a.ok()) return rows;
    for (const auto& e : a.body["events"]) {
      if (e["worker"].get<std::string>().rfind("worker/sim-", 0) == 0) rows.push_back(e);
    }
    return rows;
  }
  std::string output_;
  std::string token_ = kWorker;  // the simulated workers' token
};

// Fifty workers arriving at once adopt the published cell, each through the whole protocol, and
// each one's boot_adopt row reaches the hub under its own name.
TEST_F(FleetSim, FiftyWorkersAdoptAndEachReportsToTheHub) {
  Hub hub(root_ + "/hub");
  std::string ref;
  ASSERT_TRUE(StartHub(&hub, &ref));
  nlohmann::json r;
  ASSERT_EQ(
      Run(hub.url(), "--workers 50 --concurrency 8 --hub-pid " + std::to_string(hub.pid()), &r), 0)
      << output_;
  ASSERT_TRUE(r.is_object()) << output_;
  EXPECT_EQ(r["workers"], 50);
  EXPECT_EQ(r["adopted"], 50) << r["refusals"].dump();
  EXPECT_EQ(r["failed"], 0);
  EXPECT_EQ(r["not_started"], 0);
  EXPECT_TRUE(r["refusals"].empty()) << r["refusals"].dump();
  EXPECT_EQ(r["phases"]["hit"], 50);
  EXPECT_EQ(r["ref"], ref);
  EXPECT_EQ(r["concurrency"]["pool_threads"], 8);
  const auto& boot = r["boot_ms"];
  EXPECT_EQ(boot["n"], 50);
  EXPECT_GT(boot["p50"].get<double>(), 0);
  EXPECT_LE(boot["p50"].get<double>(), boot["p90"].get<double>());
  EXPECT_LE(boot["p90"].get<double>(), boot["p99"].get<double>());
  EXPECT_LE(boot["p99"].get<double>(), boot["max"].get<double>());
  // Arrival to outcome is each worker's queue wait plus its outcome: never less than either, never
  // more than both worst cases together (50 workers on 8 threads: the later ones waited).
  const auto& arrival = r["arrival_ms"];
  EXPECT_EQ(arrival["n"], 50);
  EXPECT_GE(arrival["max"].get<double>(), r["queue_ms"]["max"].get<double>());
  EXPECT_GE(arrival["max"].get<double>(), r["outcome_ms"]["max"].get<double>());
  EXPECT_LE(arrival["max"].get<double>(),
            r["queue_ms"]["max"].get<double>() + r["outcome_ms"]["max"].get<double>() + 0.02);
  // Every step of the hub route ran: the workers did not stop short of the bytes.
  for (const char* stage : {"resolve", "receipt", "revocations", "fetch", "admit", "provenance"}) {
    EXPECT_EQ(r["stages_ms"][stage]["n"], 50) << stage;
  }
  EXPECT_EQ(r["events"]["posted"], 50);
  EXPECT_GT(r["sim_cpu_s"].get<double>(), 0.0);
  EXPECT_GE(r["hub_cpu_s"]["total"].get<double>(), 0.0);
  EXPECT_TRUE(r["hub_cpu_s"]["per_pid"].contains(std::to_string(hub.pid())));

  const std::vector<nlohmann::json> rows = SimRows(hub);
  std::set<std::string> workers;
  for (const auto& row : rows) {
    EXPECT_EQ(row["phase"], "hit") << row.dump();
    EXPECT_EQ(row["ref"], ref);
    EXPECT_NE(row["detail"].get<std::string>().find("load=skipped"), std::string::npos);
    workers.insert(row["worker"].get<std::string>());
  }
  EXPECT_EQ(rows.size(), 50u);
  EXPECT_EQ(workers.size(), 50u);
  EXPECT_TRUE(workers.count("worker/sim-00001") && workers.count("worker/sim-00050"));
}

// Runs `psql URL -c SQL`; its exit code and output.
std::pair<int, std::string> Psql(const std::string& url, const std::string& sql) {
  std::string out;
  FILE* p = ::popen(("psql '" + url + "' -v ON_ERROR_STOP=1 -qc '" + sql + "' 2>&1").c_str(), "r");
  char buf[4096];
  size_t n;
  while (p && (n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = p ? ::pclose(p) : -1;
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// On PostgreSQL (KILN_TEST_PG_URL, tools/pg.sh) the report says how many connections the hub
// held to its database during the run, sampled from pg_stat_activity. The hub gets a database of
// its own: the mlp cell's key is the same in every run, and a receipt another hub signed (with
// another data directory's key) would be refused here.
TEST_F(FleetSim, OnPostgresTheReportCountsTheHubsDatabaseConnections) {
  const char* base = std::getenv("KILN_TEST_PG_URL");
  if (base == nullptr || *base == '\0') {
    GTEST_SKIP() << "KILN_TEST_PG_URL is not set; start PostgreSQL with tools/pg.sh";
  }
  const std::string db = "kiln_fleet_sim_" + std::to_string(::getpid());
  auto made = Psql(base, "CREATE DATABASE " + db);
  ASSERT_EQ(made.first, 0) << made.second;
  const std::string server = std::string(base).substr(0, std::string(base).rfind('/'));
  const std::string url = server + "/" + db;
  struct Drop {
    std::string base, db;
    ~Drop() { Psql(base, "DROP DATABASE IF EXISTS " + db + " WITH (FORCE)"); }
  } drop{base, db};
  const char* pg = url.c_str();
  ASSERT_TRUE(MakeDirs(root_ + "/pg/data").ok());
  ASSERT_TRUE(Hub::WriteTokens(root_ + "/pg/tokens.json"));
  hub_testing::HubProcess hub(root_ + "/pg/data", pg);
  ASSERT_TRUE(hub.Start());
  std::string ref;
  ASSERT_TRUE(Mint(root_ + "/platform", "mlp", &ref));
  auto pub = Kiln(root_ + "/platform", "publish " + root_ + "/platform/cells/" + KeyOf(ref) +
                                           "/cell.tar --hub " + hub.url() + " --token " +
                                           hub_testing::kPlatform);
  ASSERT_EQ(pub.first, 0) << pub.second;
  ASSERT_TRUE(WriteFileAtomic(ManifestPath(), Manifest(ManifestOptions{})).ok());
  nlohmann::json r;
  ASSERT_EQ(Run(hub.url(),
                "--workers 20 --concurrency 4 --db " + std::string(pg) +
                    " --db-poll-ms 10 --hub-pid " + std::to_string(hub.pid()),
                &r),
            0)
      << output_;
  EXPECT_EQ(r["adopted"], 20);
  ASSERT_TRUE(r.contains("db")) << r.dump();
  EXPECT_GE(r["db"]["peak_connections"].get<int>(), 1) << "the hub holds its pool open";
  EXPECT_GE(r["db"]["samples"].get<int>(), 1);
  EXPECT_EQ(r["db"]["sample_errors"], 0);
  // A database that cannot be reached is refused before anything runs.
  EXPECT_EQ(Run(hub.url(), "--workers 1 --db postgresql://postgres@127.0.0.1:1/none", &r), 1);
  EXPECT_NE(output_.find("--db: cannot connect"), std::string::npos) << output_;
}

// A ramp spreads the arrivals: the last worker cannot start before the ramp's end.
TEST_F(FleetSim, RampedArrivalsTakeTheRamp) {
  Hub hub(root_ + "/hub");
  std::string ref;
  ASSERT_TRUE(StartHub(&hub, &ref));
  nlohmann::json r;
  ASSERT_EQ(Run(hub.url(), "--workers 10 --concurrency 4 --arrival ramp --ramp 2", &r), 0)
      << output_;
  EXPECT_EQ(r["adopted"], 10);
  EXPECT_EQ(r["arrival"], "ramp");
  // Worker 10 arrives at 9/10 of the ramp.
  EXPECT_GE(r["wall_s"].get<double>(), 1.8);
}

// The run's deadline bounds it: arrivals ramped past it never start (counted `not_started`), and
// the run ends at the deadline, not at the end of the ramp.
TEST_F(FleetSim, NothingStartsAfterTheDeadline) {
  Hub hub(root_ + "/hub");
  std::string ref;
  ASSERT_TRUE(StartHub(&hub, &ref));
  nlohmann::json r;
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(Run(hub.url(), "--workers 10 --concurrency 2 --arrival ramp --ramp 40 --timeout 3", &r),
            1)
      << output_;
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(r.is_object()) << output_;
  // Arrivals at 0, 4, 8 ... s: only the first is due before the deadline.
  EXPECT_EQ(r["adopted"], 1);
  EXPECT_EQ(r["not_started"], 9);
  EXPECT_EQ(r["refusals"], nlohmann::json({{"not_started", 9}}));
  EXPECT_LT(took, 20.0) << "the run waited for the ramp instead of its deadline";
}

// A hub that is down when the fleet boots: every worker's attempt is refused retryably, and the
// worker attempts again after its backoff, as a worker's Adopter does; once the hub is back every
// worker adopts, each after more than one attempt, and every attempt's row was posted.
TEST_F(FleetSim, WorkersRetryAHubThatWasDownAndAdoptWhenItIsBack) {
  Hub hub(root_ + "/hub");
  std::string ref;
  ASSERT_TRUE(StartHub(&hub, &ref));
  const int port = hub.port();
  hub.Stop();
  nlohmann::json r;
  int rc = -1;
  std::thread fleet([&] {
    rc = Run("http://127.0.0.1:" + std::to_string(port),
             "--workers 10 --concurrency 10 --max-attempts 6 --hub-timeout 2", &r);
  });
  // Every worker is in flight at once, and the hub stays down longer than HubClient's own
  // retries of an idempotent GET (at most 1.5 s in all): every first attempt ends
  // hub_unreachable, and the simulator's backoff is what brings the workers back.
  std::this_thread::sleep_for(std::chrono::milliseconds(4000));
  ASSERT_TRUE(hub.Start(port));
  fleet.join();
  ASSERT_EQ(rc, 0) << output_;
  EXPECT_EQ(r["adopted"], 10);
  EXPECT_EQ(r["attempts"].count("1"), 0u) << r["attempts"].dump();
  EXPECT_EQ(r["retried"].value("resolve_refused:hub_unreachable", 0),
            r["events"]["posted"].get<int>() - 10)
      << r["retried"].dump();
  EXPECT_GE(r["outcome_ms"]["p50"].get<double>(), 500.0) << "the backoff was waited";
  const std::vector<nlohmann::json> rows = SimRows(hub);
  int hits = 0;
  for (const auto& row : rows) hits += row["phase"] == "hit";
  EXPECT_EQ(hits, 10);
}

// A revoked cell: the hub refuses the resolve with `revoked`; no worker adopts, and every
// refusal reaches the hub with its token.
TEST_F(FleetSim, RevokedCellIsRefusedByEveryWorker) {
  Hub hub(root_ + "/hub");
  std::string ref;
  ASSERT_TRUE(StartHub(&hub, &ref));
  HubAnswer rv = hub.Client(kAdmin)->Revoke(KeyOf(ref), ref.substr(ref.find('@') + 1), "drill");
  ASSERT_TRUE(rv.ok()) << rv.token << ": " << rv.message;
  nlohmann::json r;
  EXPECT_EQ(Run(hub.url(), "--workers 20 --concurrency 4", &r), 1) << output_;
  ASSERT_TRUE(r.is_object()) << output_;
  EXPECT_EQ(r["adopted"], 0);
  EXPECT_EQ(r["failed"], 20);
  EXPECT_EQ(r["refusals"], nlohmann::json({{"resolve_refused", 20}}));
  EXPECT_EQ(r["refusal_causes"], nlohmann::json({{"resolve_refused:revoked", 20}}));
  EXPECT_FALSE(r["stages_ms"].contains("fetch")) << "nothing of a revoked cell is fetched";
  const std::vector<nlohmann::json> rows = SimRows(hub);
  EXPECT_EQ(rows.size(), 20u);
  for (const auto& row : rows) EXPECT_EQ(row["phase"], "resolve_refused");
}

// A receipt tampered with between the hub and the workers (one byte of its signature changed by
// a fake hub that passes everything else through), and, against the real hub, a key set that is
// another hub's: every worker refuses the receipt before a byte of the cell is fetched.
TEST_F(FleetSim, TamperedReceiptOrForeignKeysAreRefusedByEveryWorker) {
  Hub hub(root_ + "/hub");
  std::string ref;
  ASSERT_TRUE(StartHub(&hub, &ref));
  const int port = hub.port();
  FakeHub tampering(port, [port](const httplib::Request& req) -> std::optional<std::string> {
    if (req.path.rfind("/v1/cells/", 0) != 0) return std::nullopt;
    httplib::Client real("127.0.0.1", port);
    auto up = real.Get(req.target, {{"Authorization", req.get_header_value("Authorization")}});
    if (!up) return std::nullopt;
    auto body = nlohmann::json::parse(up->body, nullptr, false);
    if (!body.is_object() || !body.contains("receipt")) return up->body;
    std::string receipt = body["receipt"].get<std::string>();
    const size_t sig = receipt.rfind('.') + 1;
    char& c = receipt[sig + (receipt.size() - sig) / 2];
    c = c == 'A' ? 'B' : 'A';
    body["receipt"] = receipt;
    return body.dump();
  });
  nlohmann::json r;
  EXPECT_EQ(Run(tampering.url(), "--workers 20 --concurrency 4", &r), 1) << output_;
  ASSERT_TRUE(r.is_object()) << output_;
  EXPECT_EQ(r["adopted"], 0);
  EXPECT_EQ(r["refusals"], nlohmann::json({{"receipt_refused", 20}}));
  EXPECT_EQ(r["refusal_causes"], nlohmann::json({{"receipt_refused:receipt_bad_signature", 20}}));
  EXPECT_EQ(tampering.blob_requests(), 0);

  Hub other(root_ + "/other");
  ASSERT_TRUE(other.Start());
  const std::string foreign = root_ + "/foreign-jwks.json";
  ASSERT_TRUE(other.WriteJwks(foreign));
  EXPECT_EQ(Run(hub.url(), "--workers 20 --concurrency 4 --trust " + foreign, &r), 1) << output_;
  ASSERT_TRUE(r.is_object()) << output_;
  EXPECT_EQ(r["adopted"], 0);
  EXPECT_EQ(r["refusals"], nlohmann::json({{"receipt_refused", 20}}));
  EXPECT_EQ(r["refusal_causes"], nlohmann::json({{"receipt_refused:receipt_unknown_kid", 20}}));
  EXPECT_FALSE(r["stages_ms"].contains("fetch"));
}

// The simulator floods its hub: one that is not on loopback is refused unless said out loud, and
// bad options are refused naming the option.
TEST_F(FleetSim, RefusesANonLoopbackHubAndBadOptions) {
  ASSERT_TRUE(WriteFileAtomic(ManifestPath(), Manifest(ManifestOptions{})).ok());
  nlohmann::json r;
  EXPECT_EQ(Run("http://10.255.0.1:8470", "--workers 5", &r), 1);
  EXPECT_NE(output_.find("hub_not_loopback"), std::string::npos) << output_;
  EXPECT_TRUE(r.is_null()) << "no report: nothing ran";
  EXPECT_EQ(Run("http://127.0.0.1:1", "--workers 0", &r), 1);
  EXPECT_NE(output_.find("--workers is 0"), std::string::npos) << output_;
  EXPECT_EQ(Run("http://127.0.0.1:1", "--arrival ramp", &r), 1);
  EXPECT_NE(output_.find("--ramp"), std::string::npos) << output_;
  EXPECT_EQ(Run("http://127.0.0.1:1", "--kill-holder-after 1", &r), 1);
  EXPECT_NE(output_.find("only with --cold-key"), std::string::npos) << output_;
  EXPECT_EQ(Run("http://127.0.0.1:1", "--cold-key --max-mints 0", &r), 1);
  EXPECT_NE(output_.find("--max-mints is 0"), std::string::npos) << output_;
}

// The mlp example cut to one shape class, for the cold-key cases (each mints it at least once),
// exported into org acme's family: the acme fleet's worker token may publish there (so the hub
// grants it leases) and reports its rows, as a minting fleet's token does.
std::string OneClassManifest() {
  ManifestOptions o;
  o.family = "acme/mlp";
  std::string text = Manifest(o);
  const std::string more = "  { x = [1, 64] },\n  { x = [4, 64] },\n  { x = [16, 64] },\n";
  const size_t at = text.find(more);
  if (at != std::string::npos) text.replace(at, more.size(), "  { x = [4, 64] },\n");
  return text;
}

// The hub's rows of `kind` filed under this run's simulated workers.
int SimRowsOf(const Hub& hub, const std::string& kind, const std::string& phase) {
  HubAnswer a = hub.Client(kAdmin)->Call("GET", "/v1/events?kind=" + kind + "&limit=10000");
  EXPECT_TRUE(a.ok()) << a.token << ": " << a.message;
  int n = 0;
  if (!a.ok()) return n;
  for (const auto& e : a.body["events"]) {
    n += e["worker"].get<std::string>().find("/sim-") != std::string::npos && e["phase"] == phase;
  }
  return n;
}

// Cold key: fifty workers miss the same key at once. One is granted the mint lease and runs the
// one mint child of the fleet; it publishes, and every worker (the minter included) adopts the
// published cell from the hub. The others waited on its lease.
TEST_F(FleetSim, ColdKeyFiftyWorkersMintOnceAndAllAdopt) {
  Hub hub(root_ + "/hub");
  // Long enough that a late heartbeat on two loaded cores cannot look like a dead holder.
  hub.process().AddArgs({"--mint-lease-ttl", "10"});
  ASSERT_TRUE(hub.Start());
  ASSERT_TRUE(WriteFileAtomic(ManifestPath(), OneClassManifest()).ok());
  token_ = hub_testing::kAcmeFleet;  // leases are granted to tokens that may publish the family
  nlohmann::json r;
  ASSERT_EQ(Run(hub.url(), "--cold-key --workers 50 --concurrency 16 --timeout 240", &r), 0)
      << output_;
  ASSERT_TRUE(r.contains("cold_key")) << output_;
  const auto& c = r["cold_key"];
  EXPECT_EQ(r["adopted"], 50) << r["refusals"].dump();
  EXPECT_EQ(c["mints_started"], 1) << c.dump();
  EXPECT_EQ(c["leased_mints"], 1);
  EXPECT_EQ(c["takeovers"], 0);
  EXPECT_EQ(c["publishes"], 1);
  EXPECT_GT(c["first_publish_ms"].get<double>(), 0);
  // Every other worker missed while the mint ran and waited on the lease (the mint takes seconds,
  // fifty resolves take well under one).
  EXPECT_EQ(c["waiters"], 49) << c.dump();
  EXPECT_EQ(c["waiter_adopt_ms"]["n"], 49);
  EXPECT_GE(c["waiter_adopt_ms"]["p50"].get<double>(), 0);
  EXPECT_EQ(c["mints"][0]["publish"], "published");
  EXPECT_EQ(SimRowsOf(hub, "self_mint_started", "child"), 1) << r["events"].dump();
  EXPECT_EQ(SimRowsOf(hub, "self_mint_skipped", "lease_held"), 49);
  EXPECT_EQ(hub.CellRows(KeyOf(r["ref"].get<std::string>())), 1);
}

// Cold key, and the lease holder's mint child is SIGKILLed a second in (each mint child spins 3 s
// first: mint/child.h's test switch). The holder dies with it: its lease is neither heartbeaten
// nor released. One waiter takes the lease over once it expired, within the TTL and a poll, and
// runs the fleet's second and last mint; everyone adopts its cell.
TEST_F(FleetSim, ColdKeyAKilledHolderIsTakenOverWithinTheLease) {
  constexpr int kTtlS = 2;
  Hub hub(root_ + "/hub");
  hub.process().AddArgs({"--mint-lease-ttl", std::to_string(kTtlS)});
  ASSERT_TRUE(hub.Start());
  ASSERT_TRUE(WriteFileAtomic(ManifestPath(), OneClassManifest()).ok());
  token_ = hub_testing::kAcmeFleet;
  ::setenv("KILN_TEST_MINT_BUSY_S", "3", 1);  // the simulator's mint children inherit it
  nlohmann::json r;
  const int rc = Run(hub.url(),
                     "--cold-key --workers 50 --concurrency 16 --timeout 240 "
                     "--kill-holder-after 1",
                     &r);
  ::unsetenv("KILN_TEST_MINT_BUSY_S");
  ASSERT_EQ(rc, 0) << output_;
  ASSERT_TRUE(r.contains("cold_key")) << output_;
  const auto& c = r["cold_key"];
  EXPECT_EQ(r["adopted"], 50) << r["refusals"].dump();
  EXPECT_EQ(c["mints_started"], 2) << c.dump();
  EXPECT_EQ(c["killed"], 1);
  EXPECT_EQ(c["takeovers"], 1);
  EXPECT_EQ(c["publishes"], 1);
  EXPECT_TRUE(c["mints"][0]["killed"].get<bool>());
  EXPECT_TRUE(c["mints"][1]["takeover"].get<bool>());
  ASSERT_FALSE(c["kill"]["takeover_after_kill_ms"].is_null()) << c.dump();
  const double takeover_ms = c["kill"]["takeover_after_kill_ms"].get<double>();
  std::printf("fleet-sim takeover: %.0f ms after the holder's SIGKILL (TTL %d s)\n", takeover_ms,
              kTtlS);
  // The lease outlives the last heartbeat by the TTL; a waiter asks within a tenth of it past the
  // expiry it saw; a second of slack for the resolve and the ask on two loaded cores.
  EXPECT_LE(takeover_ms, kTtlS * 1000 * 1.1 + 1000);
  // And not before the lease lapsed: the dead holder released nothing, and its last heartbeat was
  // at most a third of the TTL before the kill.
  EXPECT_GE(takeover_ms, kTtlS * 1000 * 2 / 3 - 100);
  EXPECT_EQ(SimRowsOf(hub, "self_mint_started", "child"), 2);
  EXPECT_EQ(hub.CellRows(KeyOf(r["ref"].get<std::string>())), 1);
}

}  // namespace
}  // namespace kiln
