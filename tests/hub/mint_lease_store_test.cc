// Tests of the mint lease rows of the HubStore contract (store.h AcquireMintLease and friends) on
// every implementation: memory, SQLite, and PostgreSQL when KILN_TEST_PG_URL is set. The races
// run on two store objects over one database where the backend is shared (SQLite file,
// PostgreSQL), standing in for two hub processes.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <thread>

#include "src/kiln/base/sha256.h"
#include "src/kiln/hub/store.h"

namespace kiln {
namespace {

std::string Key(const std::string& s) {
  static const std::string nonce =
      std::to_string(std::random_device{}()) + "-" + std::to_string(::getpid());
  return "ck1-" + Sha256Hex(nonce + s).substr(0, 56);
}

class MintLeaseStoreTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "memory") {
      a_ = NewMemoryStore();
      return;
    }
    if (GetParam() == "sqlite") {
      dir_ = ::testing::TempDir() + "/kiln_mint_lease_store_test";
      std::filesystem::remove_all(dir_);
      std::filesystem::create_directories(dir_);
      auto s = OpenSqliteStore(dir_ + "/hub.sqlite");
      ASSERT_TRUE(s.ok()) << s.status().ToString();
      a_ = std::move(s).value();
      auto t = OpenSqliteStore(dir_ + "/hub.sqlite");
      ASSERT_TRUE(t.ok()) << t.status().ToString();
      b_ = std::move(t).value();
      return;
    }
    const char* url = std::getenv("KILN_TEST_PG_URL");
    if (url == nullptr || *url == '\0') {
      GTEST_SKIP() << "KILN_TEST_PG_URL is not set; start one with tools/pg.sh";
    }
    auto s = OpenPostgresStore(url, 4);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    a_ = std::move(s).value();
    auto t = OpenPostgresStore(url, 4);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    b_ = std::move(t).value();
  }
  void TearDown() override {
    a_.reset();
    b_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  // The second "hub process": another store object over the same database, or the same object
  // where the backend cannot be shared.
  HubStore& other() { return b_ ? *b_ : *a_; }
  static MintLeaseRow Want(const std::string& key, const std::string& holder,
                           const std::string& lease, int64_t now_ms, int64_t ttl_ms) {
    return MintLeaseRow{key, "root/m", holder, lease, now_ms, now_ms + ttl_ms};
  }
  std::string dir_;
  std::unique_ptr<HubStore> a_, b_;
};

TEST_P(MintLeaseStoreTest, ALiveLeaseRefusesOthersAndAnExpiredOneIsTakenOver) {
  const std::string k = Key("takeover");
  auto first = a_->AcquireMintLease(Want(k, "w1", "L1", 1000, 500), 1000);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_TRUE(first->granted);
  EXPECT_EQ(first->owner.lease, "L1");

  // Live (expires at 1500): another holder is told who holds it and until when.
  auto second = other().AcquireMintLease(Want(k, "w2", "L2", 1499, 500), 1499);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_FALSE(second->granted);
  EXPECT_EQ(second->owner.holder, "w1");
  EXPECT_EQ(second->owner.lease, "L1");
  EXPECT_EQ(second->owner.expires_at_ms, 1500);

  // Another family is another lease.
  MintLeaseRow elsewhere = Want(k, "w2", "L3", 1499, 500);
  elsewhere.family = "root/other";
  EXPECT_TRUE(other().AcquireMintLease(elsewhere, 1499).value().granted);

  // Expired: taken over, and the old holder's heartbeat and release no longer touch it.
  auto takeover = other().AcquireMintLease(Want(k, "w2", "L4", 1500, 500), 1500);
  ASSERT_TRUE(takeover.ok()) << takeover.status().ToString();
  EXPECT_TRUE(takeover->granted);
  EXPECT_EQ(takeover->owner.holder, "w2");
  EXPECT_FALSE(a_->ExtendMintLease(k, "root/m", "L1", 9000).value());
  EXPECT_FALSE(a_->ReleaseMintLease(k, "root/m", "L1").value());
  auto now = a_->GetMintLease(k, "root/m").value();
  ASSERT_TRUE(now.has_value());
  EXPECT_EQ(now->lease, "L4");
  EXPECT_EQ(now->expires_at_ms, 2000);
}

TEST_P(MintLeaseStoreTest, HeartbeatExtendsAndReleaseFreesForTheNext) {
  const std::string k = Key("heartbeat");
  ASSERT_TRUE(a_->AcquireMintLease(Want(k, "w1", "L1", 1000, 500), 1000).value().granted);
  // Extended past the original expiry: still refused to others at 1600.
  EXPECT_TRUE(a_->ExtendMintLease(k, "root/m", "L1", 2100).value());
  EXPECT_FALSE(other().AcquireMintLease(Want(k, "w2", "L2", 1600, 500), 1600).value().granted);
  // A lapsed lease nobody took is still its holder's to extend.
  EXPECT_TRUE(a_->ExtendMintLease(k, "root/m", "L1", 3000).value());
  // Release by a stranger's lease id does nothing; by the holder's frees the pair at once.
  EXPECT_FALSE(other().ReleaseMintLease(k, "root/m", "L2").value());
  EXPECT_TRUE(a_->GetMintLease(k, "root/m").value().has_value());
  EXPECT_TRUE(a_->ReleaseMintLease(k, "root/m", "L1").value());
  EXPECT_FALSE(a_->GetMintLease(k, "root/m").value().has_value());
  EXPECT_TRUE(other().AcquireMintLease(Want(k, "w2", "L2", 1700, 500), 1700).value().granted);
}

TEST_P(MintLeaseStoreTest, TheSameHolderTakesItsOwnLiveLeaseBack) {
  const std::string k = Key("same-holder");
  ASSERT_TRUE(a_->AcquireMintLease(Want(k, "w1", "L1", 1000, 500), 1000).value().granted);
  auto again = other().AcquireMintLease(Want(k, "w1", "L9", 1100, 500), 1100);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_TRUE(again->granted);
  EXPECT_EQ(again->owner.lease, "L9");
}

// Sixteen holders race for one free pair, half through each store object: exactly one is
// granted, and everyone is told the same owner.
TEST_P(MintLeaseStoreTest, ConcurrentAcquiresGrantExactlyOne) {
  const std::string k = Key("race");
  std::atomic<int> granted{0};
  std::vector<std::string> owners(16);
  std::vector<std::thread> threads;
  for (int i = 0; i < 16; ++i) {
    threads.emplace_back([&, i] {
      HubStore& s = i % 2 == 0 ? *a_ : other();
      const std::string id = std::to_string(i);
      auto r = s.AcquireMintLease(Want(k, "w" + id, "L" + id, 1000, 60000), 1000);
      if (!r.ok()) {
        owners[i] = "error: " + r.status().ToString();
        return;
      }
      owners[i] = r->owner.lease;
      if (r->granted) ++granted;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(granted.load(), 1);
  for (const auto& o : owners) EXPECT_EQ(o, owners[0]);
}

INSTANTIATE_TEST_SUITE_P(Backends, MintLeaseStoreTest,
                         ::testing::Values("memory", "sqlite", "postgresql"));

}  // namespace
}  // namespace kiln
