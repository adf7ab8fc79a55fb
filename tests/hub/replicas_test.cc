// End-to-end test of hub replicas behind a load balancer (docs/fleet.md "Replicas behind a load
// balancer"): three real `kiln hub` processes, each started from its own --data directory, on one
// PostgreSQL database (a fresh one per test, tools/pg.sh's cluster) and one radosgw bucket
// (fixture s3_store), behind a real HAProxy (/usr/sbin/haproxy) whose configuration the test
// writes: round robin, health checks on GET /v1/ready, `retries` and `option redispatch`,
// loopback only, on a free port. Nothing is copied between the replicas' directories: the keys
// and the tokens they agree on come from the database.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "src/kiln/base/file.h"
#include "src/kiln/base/sha256.h"
#include "src/kiln/client/hub_client.h"
#include "src/kiln/hub/authz.h"
#include "tests/hub/hub_fixtures.h"
#include "tests/hub/hub_process.h"
#include "tests/hub/one_publish_race.h"
#include "tests/hub/pg_test_db.h"
#include "tests/hub/s3_test_env.h"

namespace kiln {
namespace {

using hub_testing::FreePort;
using hub_testing::Graph;
using hub_testing::HubProcess;
using hub_testing::kAdmin;
using hub_testing::kPlatform;
using hub_testing::kWorker;
using hub_testing::MakeCell;
using hub_testing::MakeMetadata;
using hub_testing::Nonce;

constexpr const char* kHaproxy = "/usr/sbin/haproxy";
constexpr int kReplicas = 3;
// How long a change through one replica may take to reach the others: the keyring's poll
// (SharedKeyRingOptions::poll_ms, 1 s) and the token lookup cache (10 s), with room for a loaded
// 2-core machine.
constexpr auto kKeyBound = std::chrono::seconds(3);
constexpr auto kTokenBound = std::chrono::seconds(12);

// HAProxy in the foreground as a child of the test, over a configuration written here.
class Balancer {
 public:
  ~Balancer() { Stop(); }
  ::testing::AssertionResult Start(const std::string& dir, const std::vector<int>& backends) {
    port_ = FreePort();
    stats_port_ = FreePort();
    std::ostringstream cfg;
    cfg << "global\n  maxconn 4096\n"
        << "defaults\n  mode http\n  timeout connect 1s\n  timeout client 30s\n"
        << "  timeout server 30s\n  timeout queue 10s\n"
        // /v1/ready writes to the blob store: on a loaded 2-core machine it may take over inter.
        << "  timeout check 2s\n"
        // A connection a dead replica refused is tried again, on another replica.
        << "  retries 3\n  option redispatch 1\n"
        << "frontend hubs\n  bind 127.0.0.1:" << port_ << "\n  default_backend replicas\n"
        << "backend replicas\n  balance roundrobin\n  option httpchk GET /v1/ready\n"
        << "  http-check expect status 200\n  default-server inter 500ms fall 2 rise 2\n";
    for (size_t i = 0; i < backends.size(); ++i) {
      cfg << "  server r" << i << " 127.0.0.1:" << backends[i] << " check\n";
    }
    cfg << "listen stats\n  bind 127.0.0.1:" << stats_port_ << "\n  stats enable\n"
        << "  stats uri /stats\n";
    const std::string path = dir + "/haproxy.cfg";
    if (!WriteFileAtomic(path, cfg.str()).ok()) {
      return ::testing::AssertionFailure() << "cannot write " << path;
    }
    log_ = dir + "/haproxy.log";
    pid_ = ::fork();
    if (pid_ == 0) {
      const int fd = ::open(log_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::execl(kHaproxy, kHaproxy, "-db", "-f", path.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    // Up when every replica is: the health checks have passed `rise` times on each.
    for (int i = 0; i < 200; ++i) {
      if (UpServers() == static_cast<int>(backends.size())) return ::testing::AssertionSuccess();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return ::testing::AssertionFailure()
           << "haproxy did not see " << backends.size()
           << " healthy replicas; log: " << hub_testing::ValueOr(ReadFile(log_), std::string());
  }
  // Replicas HAProxy holds UP, from its stats page (CSV).
  int UpServers() {
    httplib::Client c("127.0.0.1", stats_port_);
    c.set_connection_timeout(1, 0);
    c.set_url_encode(false);  // ";csv" is HAProxy's, not a path character to escape
    auto res = c.Get("/stats;csv");
    if (!res || res->status != 200) return -1;
    int up = 0;
    std::istringstream in(res->body);
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("replicas,r", 0) == 0 && line.find(",UP") != std::string::npos) ++up;
    }
    return up;
  }
  // Sessions HAProxy has sent to each replica so far (stats column stot; health checks are not
  // sessions), in server order.
  std::vector<long> SessionsPerReplica() {
    httplib::Client c("127.0.0.1", stats_port_);
    c.set_connection_timeout(1, 0);
    c.set_url_encode(false);
    auto res = c.Get("/stats;csv");
    std::vector<long> sessions;
    if (!res || res->status != 200) return sessions;
    std::istringstream in(res->body);
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("replicas,r", 0) != 0) continue;
      constexpr size_t kStot = 7;  // the CSV's column "stot"
      std::vector<std::string> fields;
      std::istringstream row(line);
      for (std::string f; std::getline(row, f, ',');) fields.push_back(f);
      sessions.push_back(fields.size() > kStot ? std::atol(fields[kStot].c_str()) : -1);
    }
    return sessions;
  }
  void Stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  int stats_port_ = 0;
  std::string log_;
};

class ReplicasTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* url = std::getenv("KILN_TEST_PG_URL");
    if (url == nullptr || *url == '\0') {
      GTEST_SKIP() << "KILN_TEST_PG_URL is not set; start PostgreSQL with tools/pg.sh";
    }
    if (::access(kHaproxy, X_OK) != 0) {
      GTEST_SKIP() << kHaproxy << " is not installed (bash tools/deps.sh --tests)";
    }
    KILN_REQUIRE_S3(env);
    for (const char* name :
         {"KILN_S3_ENDPOINT", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"}) {
      ::setenv(name, env->at(name).c_str(), 1);
    }
    const std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    base_db_ = url;
    auto fresh = hub_testing::CreateFreshDatabase(url, Nonce() + test, &db_name_);
    ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
    db_ = *fresh;
    root_ = ::testing::TempDir() + "/kiln_replicas_" + test + "_" + Nonce();
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_);
    ASSERT_TRUE(WriteSecretFileAtomic(root_ + "/tokens.json", TokensFileText(Tokens())).ok());
    blobs_ = "s3://" + env->at("KILN_S3_BUCKET") + "/replicas-" + test + "-" + Nonce();
    for (int i = 0; i < kReplicas; ++i) {
      // Each replica its own data dir (HubProcess reads the tokens file one level up).
      const std::string data = root_ + "/replica" + std::to_string(i);
      std::filesystem::create_directories(data);
      hubs_.push_back(std::make_unique<HubProcess>(
          data, db_, std::vector<std::string>{"--rebuild", "off", "--blobs", blobs_}));
    }
    // Started together: the first start of the shared keyring is a race they must settle on one
    // key.
    std::vector<std::thread> starting;
    std::vector<::testing::AssertionResult> started(kReplicas, ::testing::AssertionSuccess());
    for (int i = 0; i < kReplicas; ++i) {
      starting.emplace_back([&, i] { started[i] = hubs_[i]->Start(); });
    }
    for (auto& t : starting) t.join();
    for (int i = 0; i < kReplicas; ++i) ASSERT_TRUE(started[i]) << "replica " << i;
    std::vector<int> ports;
    for (const auto& h : hubs_) ports.push_back(h->port());
    ASSERT_TRUE(balancer_.Start(root_, ports));
  }
  void TearDown() override {
    balancer_.Stop();
    hubs_.clear();
    hub_testing::DropDatabase(base_db_, db_name_);
    if (!HasFailure() && !root_.empty()) std::filesystem::remove_all(root_);
  }
  static std::vector<TokenRow> Tokens() {
    std::vector<TokenRow> rows = hub_testing::RacerTokens();
    rows.insert(rows.end(), {
                                {Sha256Hex(kPlatform), "ci", "publisher", "platform", "", {"*"}},
                                {Sha256Hex(kWorker), "worker-1", "worker", "", "", {"*"}},
                                {Sha256Hex(kAdmin), "admin", "admin", "", "", {}},
                            });
    return rows;
  }
  std::unique_ptr<HubClient> ThroughBalancer(const std::string& token) {
    HubClientOptions o;
    o.url = balancer_.url();
    o.token = token;
    o.connect_timeout_s = 2;
    o.io_timeout_s = 20;
    return HubClient::Create(o).value();
  }
  nlohmann::json Jwks(int replica) {
    HubAnswer a = hubs_[replica]->Client("")->GetJwks();
    EXPECT_TRUE(a.ok()) << "replica " << replica << ": " << a.message;
    return a.body;
  }
  std::string Kid(int replica) {
    HubAnswer a = hubs_[replica]->Client("")->Call("GET", "/v1/health");
    return a.ok() ? a.body.value("kid", "") : "";
  }
  // Publishes a fresh cell through the balancer; its key and family.
  std::pair<std::string, std::string> Publish(const std::string& name) {
    const CellMetadata m = MakeMetadata(Graph(name));
    PublishAnswer p = ThroughBalancer(kPlatform)->Publish(MakeCell(m), {});
    EXPECT_TRUE(p.ok()) << name << ": " << p.token << ": " << p.message;
    return {m.key, m.family};
  }

  std::string root_, db_, base_db_, db_name_, blobs_;
  std::vector<std::unique_ptr<HubProcess>> hubs_;
  Balancer balancer_;
};

TEST_F(ReplicasTest, ReplicasAgreeOnKeysTokensAndRotationWithoutSharedFiles) {
  // One key, created by whichever replica came first; every replica publishes the same set.
  const nlohmann::json jwks = Jwks(0);
  ASSERT_EQ(jwks["keys"].size(), 1u) << jwks.dump();
  for (int i = 1; i < kReplicas; ++i) EXPECT_EQ(Jwks(i), jwks) << "replica " << i;
  for (int i = 0; i < kReplicas; ++i) {
    EXPECT_FALSE(std::filesystem::exists(root_ + "/replica" + std::to_string(i) + "/signing"))
        << "replica " << i << " keeps its keys in the database, not under its data dir";
  }
  const PublicKeySet trusted = PublicKeySet::FromJwks(jwks).value();

  // A publish through the balancer; its receipt, resolved through every replica, verifies
  // against the one key set.
  const auto [key, family] = Publish("agree");
  for (int i = 0; i < kReplicas; ++i) {
    ResolveAnswer hit = hubs_[i]->Client(kWorker)->Resolve(key, family);
    ASSERT_EQ(hit.kind, ResolveAnswer::Kind::kFound) << "replica " << i << ": " << hit.message;
    ReceiptVerdict v = VerifyResolvedReceipt(hit, trusted);
    EXPECT_TRUE(v.ok()) << "replica " << i << ": " << v.token << ": " << v.message;
  }

  // A token no tokens file lists, created in the database by `kiln hub-token` (printed once on
  // stdout): every replica takes it.
  std::string db_token;
  {
    const std::string cmd = hub_testing::Binary() + " hub-token --db '" + db_ +
                            "' --name db-only --role worker --releases '*' 2>/dev/null";
    FILE* out = ::popen(cmd.c_str(), "r");
    ASSERT_NE(out, nullptr);
    char line[256] = {0};
    if (std::fgets(line, sizeof(line), out) != nullptr) db_token = line;
    ASSERT_EQ(::pclose(out), 0) << cmd;
    while (!db_token.empty() && db_token.back() == '\n') db_token.pop_back();
    ASSERT_EQ(db_token.rfind("kiln_", 0), 0u) << "printed: " << db_token;
    // A row the tokens file would refuse is refused here too, and a database that is not
    // PostgreSQL is named.
    for (const std::string& bad :
         {"--db '" + db_ + "' --name x --role superuser", std::string("--db sqlite:///x --name x "
                                                                      "--role worker")}) {
      const std::string refused = hub_testing::Binary() + " hub-token " + bad + " >/dev/null 2>&1";
      EXPECT_NE(std::system(refused.c_str()), 0) << refused;
    }
  }
  for (int i = 0; i < kReplicas; ++i) {
    ResolveAnswer hit = hubs_[i]->Client(db_token)->Resolve(key, family);
    EXPECT_EQ(hit.kind, ResolveAnswer::Kind::kFound)
        << "replica " << i << ": " << hit.token << ": " << hit.message;
  }
  // Revoked through replica 1: dead there at once, and on the others within the cache bound.
  HubAnswer revoked = hubs_[1]->Client(kAdmin)->Call("POST", "/v1/admin/tokens/revoke",
                                                     nlohmann::json{{"name", "db-only"}}.dump());
  ASSERT_TRUE(revoked.ok()) << revoked.token << ": " << revoked.message;
  EXPECT_EQ(hubs_[1]->Client(db_token)->Resolve(key, family).token, "unauthenticated");
  const auto revoked_at = std::chrono::steady_clock::now();
  for (int i : {0, 2}) {
    std::string token;
    while (std::chrono::steady_clock::now() - revoked_at < kTokenBound) {
      token = hubs_[i]->Client(db_token)->Resolve(key, family).token;
      if (token == "unauthenticated") break;
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
    EXPECT_EQ(token, "unauthenticated") << "replica " << i << " still takes a revoked token";
  }

  // A rotation through replica 2 reaches the others within the poll bound.
  const std::string old_kid = Kid(0);
  HubAnswer rotated = hubs_[2]->Client(kAdmin)->Call("POST", "/v1/admin/rotate-key");
  ASSERT_TRUE(rotated.ok()) << rotated.token << ": " << rotated.message;
  const std::string new_kid = rotated.body.value("kid", "");
  ASSERT_NE(new_kid, old_kid);
  const auto rotated_at = std::chrono::steady_clock::now();
  for (int i = 0; i < kReplicas; ++i) {
    while (Kid(i) != new_kid && std::chrono::steady_clock::now() - rotated_at < kKeyBound) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_EQ(Kid(i), new_kid) << "replica " << i << " did not take the rotation within "
                               << kKeyBound.count() << " s";
  }
  const nlohmann::json after = Jwks(0);
  EXPECT_EQ(after["keys"].size(), 2u) << after.dump();
  for (int i = 1; i < kReplicas; ++i) EXPECT_EQ(Jwks(i), after) << "replica " << i;

  // Receipts from before and after the rotation, through every replica, verify against one set.
  const PublicKeySet rotated_set = PublicKeySet::FromJwks(after).value();
  const auto [key2, family2] = Publish("after-rotation");
  for (int i = 0; i < kReplicas; ++i) {
    for (const auto& [k, f] : {std::pair{key, family}, std::pair{key2, family2}}) {
      ResolveAnswer hit = hubs_[i]->Client(kWorker)->Resolve(k, f);
      ASSERT_EQ(hit.kind, ResolveAnswer::Kind::kFound) << "replica " << i;
      ReceiptVerdict v = VerifyResolvedReceipt(hit, rotated_set);
      EXPECT_TRUE(v.ok()) << "replica " << i << " " << k << ": " << v.token << ": " << v.message;
    }
  }
}

TEST_F(ReplicasTest, BurstOfResolvesLosesNoneWhenAReplicaIsKilled) {
  constexpr int kCells = 8;
  constexpr int kClients = 200;
  constexpr int kPerClient = 10;
  std::vector<std::pair<std::string, std::string>> cells;
  for (int i = 0; i < kCells; ++i) cells.push_back(Publish("burst-" + std::to_string(i)));
  const PublicKeySet trusted = PublicKeySet::FromJwks(Jwks(0)).value();

  std::atomic<int> done{0}, found{0};
  std::mutex failures_mu;
  std::vector<std::string> failures;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(240);
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      auto client = ThroughBalancer(kWorker);
      for (int i = 0; i < kPerClient && std::chrono::steady_clock::now() < deadline; ++i) {
        const auto& [key, family] = cells[(c + i) % kCells];
        ResolveAnswer hit = client->Resolve(key, family);
        const bool ok =
            hit.kind == ResolveAnswer::Kind::kFound && VerifyResolvedReceipt(hit, trusted).ok();
        if (ok) {
          ++found;
        } else {
          std::lock_guard<std::mutex> lock(failures_mu);
          failures.push_back(std::to_string(hit.http_status) + " " + hit.token + ": " +
                             hit.message);
        }
        ++done;
      }
    });
  }
  // Replica 1 dies without a word once a fifth of the burst is through.
  while (done.load() < kClients * kPerClient / 5 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  hubs_[1]->Kill(SIGKILL);
  const int done_at_kill = done.load();
  for (auto& t : clients) t.join();

  EXPECT_LT(done_at_kill, kClients * kPerClient) << "the kill came after the burst";
  EXPECT_EQ(found.load(), kClients * kPerClient);
  EXPECT_TRUE(failures.empty()) << failures.size() << " failed, first: " << failures.front();
  // HAProxy took the dead replica out of rotation.
  for (int i = 0; i < 40 && balancer_.UpServers() != kReplicas - 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(balancer_.UpServers(), kReplicas - 1);
}

// One publish per key across replicas (docs/fleet.md "One publish per key"): 32 publishers race
// one (key, family) through the balancer, so round robin spreads their intents, retries, uploads
// and completes over three replicas; the claim in the shared database still lets exactly one of
// them upload: one cell row, one blob in the bucket (one_publish_race.h).
TEST_F(ReplicasTest, ThirtyTwoPublishersThroughTheBalancerLeaveOneRowAndOneBlob) {
  const std::vector<long> before = balancer_.SessionsPerReplica();
  hub_testing::ExpectOnePublishPerKey(
      [&](int i) { return ThroughBalancer(hub_testing::RacerToken(i)); }, *ThroughBalancer(kWorker),
      db_, blobs_, root_);
  // The race was contested across replicas: every one of them served some of it.
  const std::vector<long> after = balancer_.SessionsPerReplica();
  ASSERT_EQ(before.size(), static_cast<size_t>(kReplicas));
  ASSERT_EQ(after.size(), static_cast<size_t>(kReplicas));
  for (int i = 0; i < kReplicas; ++i) EXPECT_GT(after[i], before[i]) << "replica " << i;
}

}  // namespace
}  // namespace kiln
