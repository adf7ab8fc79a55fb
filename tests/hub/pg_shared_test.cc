// Tests of what hub replicas share through PostgreSQL (src/kiln/hub/pg_shared.h), several keyring
// and token objects in one process standing in for replicas: one current key however many open
// an empty keyring at once, a rotation or retirement through one seen by the others within the
// poll, a file keyring carried in, and one token set. Needs KILN_TEST_PG_URL (tools/pg.sh); each
// test gets a database of its own.
#include "src/kiln/hub/pg_shared.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <random>
#include <set>
#include <thread>

#include "src/kiln/base/sha256.h"
#include "tests/hub/pg_test_db.h"

namespace kiln {
namespace {

class PgSharedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* url = std::getenv("KILN_TEST_PG_URL");
    if (url == nullptr || *url == '\0') {
      GTEST_SKIP() << "KILN_TEST_PG_URL is not set; start PostgreSQL with tools/pg.sh";
    }
    base_ = url;
    const std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    auto fresh = hub_testing::CreateFreshDatabase(
        url, test + std::to_string(::getpid()) + std::to_string(std::random_device{}()), &name_);
    ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
    db_ = *fresh;
  }
  void TearDown() override { hub_testing::DropDatabase(base_, name_); }
  std::unique_ptr<KeyRing> Ring(SharedKeyRingOptions o = {}) {
    o.poll_ms = 100;
    o.retire_grace_s = 5;
    auto ring = OpenPostgresKeyRing(db_, o);
    EXPECT_TRUE(ring.ok()) << ring.status().ToString();
    return ring.ok() ? std::move(*ring) : nullptr;
  }
  std::string base_, name_, db_;
};

TEST_F(PgSharedTest, ReplicasOpeningAnEmptyKeyringTogetherEndWithOneKey) {
  constexpr int kReplicas = 8;
  std::vector<std::unique_ptr<KeyRing>> rings(kReplicas);
  std::vector<std::thread> opening;
  for (int i = 0; i < kReplicas; ++i) opening.emplace_back([&, i] { rings[i] = Ring(); });
  for (auto& t : opening) t.join();
  std::set<std::string> kids;
  for (const auto& r : rings) {
    ASSERT_NE(r, nullptr);
    kids.insert(r->Current()->kid());
    EXPECT_EQ(r->PublicKeys().size(), 1u);
  }
  EXPECT_EQ(kids.size(), 1u);
}

TEST_F(PgSharedTest, RotationAndRetirementThroughOneReachTheOthersWithinThePoll) {
  auto a = Ring();
  auto b = Ring();
  ASSERT_TRUE(a && b);
  const std::string old_kid = a->Current()->kid();
  ASSERT_EQ(b->Current()->kid(), old_kid);

  const int64_t now = 1700000000;
  auto fresh = a->Rotate(now);
  ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
  EXPECT_EQ(a->Current()->kid(), *fresh);
  // The old key is retired a grace after the rotation: b signs with it until its next poll.
  EXPECT_EQ(a->PublicKeys().NotAfter(old_kid), now + 5);
  const auto rotated = std::chrono::steady_clock::now();
  while (b->Current()->kid() != *fresh &&
         std::chrono::steady_clock::now() - rotated < std::chrono::seconds(3)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(b->Current()->kid(), *fresh);
  EXPECT_EQ(b->PublicKeys().ToJwks(), a->PublicKeys().ToJwks());

  // A retirement pulled back through b reaches a; the current key cannot be retired.
  ASSERT_TRUE(b->Retire(old_kid, 0).ok());
  EXPECT_EQ(b->Retire(*fresh, 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(b->Retire("0123456789abcdef", 0).code(), StatusCode::kNotFound);
  const auto retired = std::chrono::steady_clock::now();
  while (a->PublicKeys().NotAfter(old_kid) != 0 &&
         std::chrono::steady_clock::now() - retired < std::chrono::seconds(3)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(a->PublicKeys().NotAfter(old_kid), 0);

  // A replica started later reads the same ring.
  auto c = Ring();
  ASSERT_TRUE(c);
  EXPECT_EQ(c->Current()->kid(), *fresh);
  EXPECT_EQ(c->PublicKeys().ToJwks(), a->PublicKeys().ToJwks());
}

TEST_F(PgSharedTest, AFileKeyringIsCarriedInOnceAndOtherFileKeysStopSigning) {
  const std::string dir = ::testing::TempDir() + "/kiln_pg_shared_" + name_;
  std::filesystem::remove_all(dir);
  auto file = SigningKeyRing::OpenOrCreate(dir + "/first");
  ASSERT_TRUE(file.ok());
  const std::string file_kid = (*file)->Current()->kid();
  auto other = SigningKeyRing::OpenOrCreate(dir + "/second");
  ASSERT_TRUE(other.ok());
  const std::string other_kid = (*other)->Current()->kid();

  SharedKeyRingOptions o;
  o.import_dir = dir + "/first";
  auto a = Ring(o);
  ASSERT_TRUE(a);
  // The first replica's file key is the shared current key: what it signed keeps verifying.
  EXPECT_EQ(a->Current()->kid(), file_kid);
  // Another replica's file key joins retired: still verifiable, signing no more.
  o.import_dir = dir + "/second";
  auto b = Ring(o);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->Current()->kid(), file_kid);
  EXPECT_TRUE(b->PublicKeys().Has(other_kid));
  EXPECT_TRUE(b->PublicKeys().NotAfter(other_kid).has_value());
  EXPECT_FALSE(b->PublicKeys().NotAfter(file_kid).has_value());
  std::filesystem::remove_all(dir);
}

TEST_F(PgSharedTest, TokensAreUpsertedByHashAndFoundByHashOrName) {
  auto tokens = OpenPostgresTokens(db_);
  ASSERT_TRUE(tokens.ok()) << tokens.status().ToString();
  const std::string h = Sha256Hex("tok-a");
  ASSERT_TRUE((*tokens)->Upsert({{h, "a", "worker", "", "", {"*"}}}, 1).ok());
  auto found = (*tokens)->Find(h);
  ASSERT_TRUE(found.ok() && found->has_value());
  EXPECT_EQ((*found)->role, "worker");
  // Another replica's file lists the same token with another role: the row is replaced.
  ASSERT_TRUE((*tokens)->Upsert({{h, "a", "publisher", "platform", "", {"*"}}}, 2).ok());
  found = (*tokens)->Find(h);
  ASSERT_TRUE(found.ok() && found->has_value());
  EXPECT_EQ((*found)->role, "publisher");
  EXPECT_EQ((*found)->tier, "platform");
  auto by_name = (*tokens)->FindByName("a");
  ASSERT_TRUE(by_name.ok());
  EXPECT_EQ(by_name->size(), 1u);
  auto missing = (*tokens)->Find(Sha256Hex("nobody"));
  ASSERT_TRUE(missing.ok());
  EXPECT_FALSE(missing->has_value());
}

}  // namespace
}  // namespace kiln
