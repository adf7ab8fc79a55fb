// Tests of the mint lease routes (src/kiln/hub/mint_lease.cc) against the in-memory stores with a
// clock the test moves: grant, refusal to a second holder, heartbeat, lease_lost after a
// takeover, release, "published" once a live cell answers the key, and who may ask.
#include <gtest/gtest.h>

#include <filesystem>

#include "src/kiln/base/sha256.h"
#include "src/kiln/cell/pack.h"
#include "src/kiln/hub/server.h"
#include "tests/hub/hub_fixtures.h"

namespace kiln {
namespace {

using hub_testing::Graph;
using hub_testing::MakeCell;
using hub_testing::MakeMetadata;

class MintLeaseServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/kiln_mint_lease_service_test";
    std::filesystem::remove_all(dir_);
    HubServiceOptions o;
    o.mint_lease_ttl_ms = 3000;
    o.mint_lease_clock_ms = [this] {
      if (on_clock_) on_clock_();
      return now_ms_;
    };
    svc_ = std::make_unique<HubService>(
        NewMemoryStore(), NewMemoryBlobStore(), SigningKeyRing::OpenOrCreate(dir_).value(),
        [] { return int64_t{1700000000}; }, std::move(o));
    ASSERT_TRUE(svc_
                    ->InstallTokens({
                        {Sha256Hex("platform-token"), "ci", "publisher", "platform", "", {"*"}},
                        {Sha256Hex("acme-token"), "acme-ci", "publisher", "org", "acme", {}},
                        {Sha256Hex("reader-token"), "reader", "worker", "", "", {}},
                    })
                    .ok());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  Principal As(const std::string& token) {
    return std::get<Principal>(svc_->Authenticate("Bearer " + token));
  }
  Reply Acquire(const std::string& holder, const std::string& family = "root/micro-mlp",
                const std::string& token = "platform-token") {
    return svc_->AcquireMintLease(
        As(token), nlohmann::json{{"key", key_}, {"family", family}, {"holder", holder}}.dump());
  }
  Reply Heartbeat(const std::string& lease) {
    return svc_->HeartbeatMintLease(
        As("platform-token"),
        nlohmann::json{{"key", key_}, {"family", "root/micro-mlp"}, {"lease", lease}}.dump());
  }
  // Publishes the cell of key_ into root/micro-mlp as the platform publisher; the complete's reply.
  Reply PublishCell() {
    const std::string cell = MakeCell(meta_);
    const std::string digest = CellDigest(cell);
    const Principal ci = As("platform-token");
    Reply intent = svc_->PublishIntent(
        ci,
        nlohmann::json{
            {"key", key_}, {"digest", digest}, {"size", cell.size()}, {"family", "root/micro-mlp"}}
            .dump());
    if (!intent.ok()) return intent;
    Reply up = svc_->UploadBlob(ci, digest, [&](const std::function<bool(std::string_view)>& sink) {
      sink(cell);
      return true;
    });
    if (!up.ok()) return up;
    return svc_->PublishComplete(ci, nlohmann::json{{"key", key_}, {"digest", digest}}.dump());
  }
  Reply Release(const std::string& lease) {
    return svc_->ReleaseMintLease(
        As("platform-token"),
        nlohmann::json{{"key", key_}, {"family", "root/micro-mlp"}, {"lease", lease}}.dump());
  }

  std::string dir_;
  int64_t now_ms_ = 1700000000000;
  std::function<void()> on_clock_;  // runs at each read of the lease clock
  const CellMetadata meta_ = MakeMetadata(Graph(7));
  const std::string key_ = meta_.key;
  std::unique_ptr<HubService> svc_;
};

TEST_F(MintLeaseServiceTest, OneHolderAtATimeUntilItStopsHeartbeating) {
  Reply a = Acquire("worker-a");
  ASSERT_EQ(a.status, 200) << a.body.dump();
  ASSERT_TRUE(a.body["granted"].get<bool>());
  const std::string lease = a.body["lease"];
  EXPECT_EQ(a.body["ttl_ms"], 3000);
  EXPECT_EQ(a.body["heartbeat_ms"], 1000);

  now_ms_ += 1000;
  Reply b = Acquire("worker-b");
  ASSERT_EQ(b.status, 200) << b.body.dump();
  EXPECT_FALSE(b.body["granted"].get<bool>());
  EXPECT_FALSE(b.body["published"].get<bool>());
  EXPECT_EQ(b.body["holder"], "worker-a");
  EXPECT_EQ(b.body["expires_in_ms"], 2000);

  // Heartbeats keep it: 2.5 s later (past the first expiry) b is still refused.
  now_ms_ += 1000;
  ASSERT_EQ(Heartbeat(lease).status, 200);
  now_ms_ += 2500;
  EXPECT_FALSE(Acquire("worker-b").body["granted"].get<bool>());

  // a stops heartbeating: at its expiry b takes over, and a's heartbeat says lease_lost.
  now_ms_ += 500;
  Reply takeover = Acquire("worker-b");
  ASSERT_TRUE(takeover.body["granted"].get<bool>()) << takeover.body.dump();
  Reply lost = Heartbeat(lease);
  EXPECT_EQ(lost.status, 409);
  EXPECT_EQ(lost.body["error"], kRefusalLeaseLost);
  EXPECT_EQ(lost.body["holder"], "worker-b");
  // a's release leaves b's lease alone; b's own release frees the key at once.
  EXPECT_FALSE(Release(lease).body["released"].get<bool>());
  EXPECT_FALSE(Acquire("worker-c").body["granted"].get<bool>());
  EXPECT_TRUE(Release(takeover.body["lease"]).body["released"].get<bool>());
  EXPECT_TRUE(Acquire("worker-c").body["granted"].get<bool>());
}

TEST_F(MintLeaseServiceTest, APublishedCellAnswersPublishedInsteadOfALease) {
  const std::string cell = MakeCell(meta_);
  const std::string digest = CellDigest(cell);
  const Principal ci = As("platform-token");
  ASSERT_TRUE(svc_->PublishIntent(ci, nlohmann::json{{"key", key_},
                                                     {"digest", digest},
                                                     {"size", cell.size()},
                                                     {"family", "root/micro-mlp"}}
                                          .dump())
                  .ok());
  ASSERT_TRUE(svc_->UploadBlob(ci, digest,
                               [&](const std::function<bool(std::string_view)>& sink) {
                                 sink(cell);
                                 return true;
                               })
                  .ok());
  Reply done = svc_->PublishComplete(ci, nlohmann::json{{"key", key_}, {"digest", digest}}.dump());
  ASSERT_TRUE(done.ok()) << done.body.dump();
  Reply r = Acquire("worker-a");
  ASSERT_EQ(r.status, 200) << r.body.dump();
  EXPECT_FALSE(r.body["granted"].get<bool>());
  EXPECT_TRUE(r.body["published"].get<bool>());
  EXPECT_EQ(r.body["digest"], digest);
  // Another family of the same key has no cell: its lease is granted.
  EXPECT_TRUE(Acquire("worker-a", "root/other").body["granted"].get<bool>());
}

// The race a fleet on a cold key meets (docs/fleet.md, the 1,000-worker cold runs): a waiter's ask
// checks for a cell, and before it takes the lease the holder completes its publish and releases.
// The ask must not be granted a lease for a key a live cell now answers: it answers published.
TEST_F(MintLeaseServiceTest, AnAskRacingThePublishAndReleaseAnswersPublished) {
  Reply a = Acquire("worker-a");
  ASSERT_TRUE(a.body["granted"].get<bool>()) << a.body.dump();
  const std::string lease = a.body["lease"];
  // The lease clock is read once per ask, between the cell check and the grant: the holder's
  // publish and release happen there, as they can between two statements on another replica.
  bool race = true;
  on_clock_ = [&, lease] {
    if (!race) return;
    race = false;
    Reply done = PublishCell();
    EXPECT_TRUE(done.ok()) << done.body.dump();
    EXPECT_TRUE(Release(lease).body["released"].get<bool>());
  };
  Reply b = Acquire("worker-b");
  ASSERT_EQ(b.status, 200) << b.body.dump();
  EXPECT_FALSE(race) << "the publish ran inside the ask";
  EXPECT_FALSE(b.body["granted"].get<bool>()) << b.body.dump();
  EXPECT_TRUE(b.body["published"].get<bool>());
  // And the lease it nearly took is not left behind: a third ask also answers published.
  EXPECT_TRUE(Acquire("worker-c").body["published"].get<bool>());
}

TEST_F(MintLeaseServiceTest, RefusalsAreTyped) {
  // A reader holds no write tier: it may not mint for the fleet.
  Reply reader = Acquire("w", "root/micro-mlp", "reader-token");
  EXPECT_EQ(reader.status, 403);
  EXPECT_EQ(reader.body["error"], kRefusalForbidden);
  // A tenant may not take a lease in the platform's families.
  Reply tenant = Acquire("w", "root/micro-mlp", "acme-token");
  EXPECT_EQ(tenant.status, 403);
  EXPECT_EQ(tenant.body["error"], kRefusalFamilyForbidden);
  EXPECT_TRUE(Acquire("w", "acme/vision", "acme-token").body["granted"].get<bool>());
  Reply bad_family = Acquire("w", "no family");
  EXPECT_EQ(bad_family.status, 400);
  EXPECT_EQ(bad_family.body["error"], kRefusalBadFamily);
  Reply no_holder = Acquire("");
  EXPECT_EQ(no_holder.status, 400);
  EXPECT_EQ(no_holder.body["error"], "bad_request");
  Reply bad_key = svc_->AcquireMintLease(
      As("platform-token"),
      nlohmann::json{{"key", "ck1-zz"}, {"family", "root/m"}, {"holder", "w"}}.dump());
  EXPECT_EQ(bad_key.status, 400);
  EXPECT_EQ(bad_key.body["error"], "bad_key");
  Reply no_lease = svc_->HeartbeatMintLease(
      As("platform-token"), nlohmann::json{{"key", key_}, {"family", "root/micro-mlp"}}.dump());
  EXPECT_EQ(no_lease.status, 400);
  EXPECT_EQ(Heartbeat("never-granted").body["error"], kRefusalLeaseLost);
}

// The TTL is an operator's flag: a value no lease can work with refuses the start, naming it.
TEST(MintLeaseOptions, ATtlOutOfRangeRefusesTheHubStart) {
  const std::string dir = ::testing::TempDir() + "/kiln_mint_lease_ttl_test";
  for (double ttl : {0.0, 0.1, 7200.0}) {
    std::filesystem::remove_all(dir);
    HubOptions o;
    o.data_dir = dir;
    o.port = 0;
    o.rebuild = "off";
    o.blob_verify_interval_s = 0;
    o.mint_lease_ttl_s = ttl;
    auto hub = HubServer::Open(o);
    ASSERT_FALSE(hub.ok()) << ttl;
    EXPECT_EQ(hub.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(hub.status().message().find("--mint-lease-ttl"), std::string::npos)
        << hub.status().ToString();
  }
  std::filesystem::remove_all(dir);
  HubOptions o;
  o.data_dir = dir;
  o.port = 0;
  o.rebuild = "off";
  o.blob_verify_interval_s = 0;
  o.mint_lease_ttl_s = 1.5;
  auto hub = HubServer::Open(o);
  EXPECT_TRUE(hub.ok()) << hub.status().ToString();
  hub = Status::Internal("closed");  // the server goes before its directory
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kiln
