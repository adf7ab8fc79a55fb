// Tests of the HubStore contract (src/kiln/hub/store.h) on every implementation: memory, SQLite,
// and PostgreSQL when KILN_TEST_PG_URL is set (tools/pg.sh starts a throwaway cluster). Names are
// made unique per run so the tests hold on a shared, non-empty PostgreSQL database.
#include "src/kiln/hub/store.h"

#include <gtest/gtest.h>
#include <sqlite3.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <thread>

#include "src/kiln/base/sha256.h"

namespace kiln {
namespace {

std::string Nonce() {
  static const std::string n =
      std::to_string(std::random_device{}()) + "-" + std::to_string(::getpid());
  return n;
}
std::string Key(const std::string& s) { return "ck1-" + Sha256Hex(Nonce() + s).substr(0, 56); }
std::string Digest(const std::string& s) { return "sha256:" + Sha256Hex(Nonce() + s); }

class StoreTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "memory") {
      store_ = NewMemoryStore();
    } else if (GetParam() == "sqlite") {
      dir_ = ::testing::TempDir() + "/kiln_store_test";
      std::filesystem::remove_all(dir_);
      std::filesystem::create_directories(dir_);
      auto s = OpenSqliteStore(dir_ + "/hub.sqlite");
      ASSERT_TRUE(s.ok()) << s.status().ToString();
      store_ = std::move(s).value();
    } else {
      const char* url = std::getenv("KILN_TEST_PG_URL");
      if (url == nullptr || *url == '\0') {
        GTEST_SKIP() << "KILN_TEST_PG_URL is not set; start one with tools/pg.sh";
      }
      auto s = OpenPostgresStore(url, 4);
      ASSERT_TRUE(s.ok()) << s.status().ToString();
      store_ = std::move(s).value();
    }
  }
  void TearDown() override {
    store_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  CellRow Cell(const std::string& key, const std::string& digest, const std::string& receipt) {
    return CellRow{key, digest, 100, "root/m", "ci", "platform", "r1", receipt, 1000};
  }
  std::string dir_;
  std::unique_ptr<HubStore> store_;
};

TEST_P(StoreTest, FirstWriterWinsPerKeyAndFamily) {
  const std::string k = Key("fww");
  auto first = store_->InsertCellIfAbsent(Cell(k, Digest("a"), "receipt-a"));
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_TRUE(first->inserted);
  EXPECT_EQ(first->owner.digest, Digest("a"));
  auto second = store_->InsertCellIfAbsent(Cell(k, Digest("b"), "receipt-b"));
  ASSERT_TRUE(second.ok());
  EXPECT_FALSE(second->inserted);
  EXPECT_EQ(second->owner.digest, Digest("a"));
  EXPECT_EQ(second->owner.receipt, "receipt-a");
  auto got = store_->GetCell(k, "root/m").value();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->receipt, "receipt-a");
  EXPECT_FALSE(store_->GetCell(Key("absent"), "root/m").value().has_value());
  // Another scope's owner of the same key is its own row: neither shadows nor blocks the other.
  CellRow tenant = Cell(k, Digest("t"), "receipt-t");
  tenant.family = "acme/m";
  tenant.tier = "org";
  EXPECT_EQ(store_->InsertCellIfAbsent(tenant).value().owner.digest, Digest("t"));
  EXPECT_EQ(store_->GetCell(k, "root/m").value()->digest, Digest("a"));
  EXPECT_EQ(store_->GetCell(k, "acme/m").value()->digest, Digest("t"));
  auto all = store_->ListCellsForKey(k).value();
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].family, "root/m");
  EXPECT_EQ(all[1].family, "acme/m");
  auto by_digest = store_->CellsWithDigest(Digest("t")).value();
  ASSERT_EQ(by_digest.size(), 1u);
  EXPECT_EQ(by_digest[0].family, "acme/m");
  EXPECT_TRUE(store_->CellsWithDigest(Digest("none")).value().empty());
}

// Revoking frees the key in its scope: a revoked owner is replaced by the next digest, a live
// one never is, and the replacing row is then the owner.
TEST_P(StoreTest, RevokedOwnerIsReplacedLiveOwnerIsNot) {
  const std::string k = Key("freed");
  ASSERT_TRUE(store_->InsertCellIfAbsent(Cell(k, Digest("old"), "r-old")).ok());
  EXPECT_EQ(store_->InsertCellIfAbsent(Cell(k, Digest("new"), "r-new")).value().owner.digest,
            Digest("old"));
  ASSERT_TRUE(store_->Revoke({k, Digest("old"), "bad", "admin", 5}).ok());
  auto owner = store_->InsertCellIfAbsent(Cell(k, Digest("new"), "r-new"));
  ASSERT_TRUE(owner.ok()) << owner.status().ToString();
  EXPECT_TRUE(owner->inserted);
  EXPECT_EQ(owner->owner.digest, Digest("new"));
  EXPECT_EQ(owner->owner.receipt, "r-new");
  EXPECT_EQ(store_->GetCell(k, "root/m").value()->digest, Digest("new"));
  EXPECT_EQ(store_->InsertCellIfAbsent(Cell(k, Digest("third"), "r-3")).value().owner.digest,
            Digest("new"));
}

TEST_P(StoreTest, ConcurrentInsertsLeaveExactlyOneOwner) {
  const std::string k = Key("race");
  std::vector<std::thread> threads;
  std::vector<std::string> owners(16);
  for (int i = 0; i < 16; ++i) {
    threads.emplace_back([&, i] {
      auto r = store_->InsertCellIfAbsent(Cell(k, Digest("d" + std::to_string(i)), "r"));
      owners[i] = r.ok() ? r->owner.digest : "error: " + r.status().ToString();
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& o : owners) EXPECT_EQ(o, owners[0]);
  EXPECT_EQ(store_->GetCell(k, "root/m").value()->digest, owners[0]);
}

// Publishers of the same bytes in the same second sign identical receipts: the rows they insert
// are identical, and still exactly one of them is told it inserted.
TEST_P(StoreTest, IdenticalConcurrentInsertsHaveExactlyOneWinner) {
  const std::string k = Key("same");
  std::vector<std::thread> threads;
  std::atomic<int> winners{0}, errors{0};
  for (int i = 0; i < 16; ++i) {
    threads.emplace_back([&] {
      auto r = store_->InsertCellIfAbsent(Cell(k, Digest("same"), "receipt-same"));
      if (!r.ok()) {
        ++errors;
      } else if (r->inserted) {
        ++winners;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(winners.load(), 1);
}

TEST_P(StoreTest, IntentsArePerPublisher) {
  IntentRow i{Key("i"), Digest("i"), 42, "root/m", "r1", "denoiser", "ci", 5};
  ASSERT_TRUE(store_->PutIntent(i).ok());
  auto got = store_->GetIntent(i.key, i.digest, "ci").value();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->size, 42u);
  EXPECT_EQ(got->target, "denoiser");
  EXPECT_EQ(store_->FindIntentByDigest(i.digest, "ci").value()->key, i.key);
  EXPECT_EQ(store_->FindIntentByDigest(i.digest, "").value()->key, i.key);
  EXPECT_FALSE(store_->FindIntentByDigest(Digest("none"), "").value().has_value());
  // Another publisher's intent for the same (key, digest), with a lie in it, is its own row.
  IntentRow other = i;
  other.publisher = "acme-ci";
  other.size = 7;
  other.family = "acme/m";
  other.created_at = 9;
  ASSERT_TRUE(store_->PutIntent(other).ok());
  EXPECT_EQ(store_->GetIntent(i.key, i.digest, "ci").value()->size, 42u);
  EXPECT_EQ(store_->GetIntent(i.key, i.digest, "ci").value()->family, "root/m");
  EXPECT_EQ(store_->GetIntent(i.key, i.digest, "acme-ci").value()->size, 7u);
  EXPECT_EQ(store_->FindIntentByDigest(i.digest, "ci").value()->size, 42u);
  EXPECT_FALSE(store_->GetIntent(i.key, i.digest, "nobody").value().has_value());
  // Abandoned intents go by age.
  EXPECT_GE(store_->DeleteIntentsBefore(8).value(), 1);
  EXPECT_FALSE(store_->GetIntent(i.key, i.digest, "ci").value().has_value());
  EXPECT_TRUE(store_->GetIntent(i.key, i.digest, "acme-ci").value().has_value());
}

// A claim on (key, family): the first publisher holds it, another is told who holds it, the
// holder refreshes it, an expired one is taken over, and a release frees it for the next. Claims
// are per (key, family): another family of the same key is free.
TEST_P(StoreTest, PublishClaimsHoldRefreshExpireAndRelease) {
  const std::string k = Key("claim");
  const PublishClaim a{k, "root/m", "pub-a", Digest("ca"), 100};
  auto first = store_->ClaimPublish(a, 50).value();
  EXPECT_TRUE(first.ours);
  EXPECT_EQ(first.holder.publisher, "pub-a");
  // Another publisher, while a's claim is live: refused, told a holds it until 100.
  auto other = store_->ClaimPublish({k, "root/m", "pub-b", Digest("cb"), 120}, 60).value();
  EXPECT_FALSE(other.ours);
  EXPECT_EQ(other.holder.publisher, "pub-a");
  EXPECT_EQ(other.holder.digest, Digest("ca"));
  EXPECT_EQ(other.holder.expires_at, 100);
  // Another family of the same key is another scope.
  EXPECT_TRUE(store_->ClaimPublish({k, "root/n", "pub-b", Digest("cb"), 120}, 60).value().ours);
  // The holder refreshes its own claim (its retries keep working).
  auto again = store_->ClaimPublish({k, "root/m", "pub-a", Digest("ca2"), 200}, 90).value();
  EXPECT_TRUE(again.ours);
  EXPECT_EQ(again.holder.expires_at, 200);
  EXPECT_FALSE(store_->ClaimPublish({k, "root/m", "pub-b", Digest("cb"), 300}, 150).value().ours);
  // Expired (expires_at <= now): taken over.
  auto taken = store_->ClaimPublish({k, "root/m", "pub-b", Digest("cb"), 400}, 200).value();
  EXPECT_TRUE(taken.ours);
  EXPECT_EQ(taken.holder.publisher, "pub-b");
  // Only the holder's release drops it.
  EXPECT_FALSE(store_->ReleasePublishClaim(k, "root/m", "pub-a").value());
  EXPECT_FALSE(store_->ClaimPublish({k, "root/m", "pub-a", Digest("ca"), 500}, 210).value().ours);
  EXPECT_TRUE(store_->ReleasePublishClaim(k, "root/m", "pub-b").value());
  EXPECT_TRUE(store_->ClaimPublish({k, "root/m", "pub-a", Digest("ca"), 500}, 210).value().ours);
  // Garbage collection removes expired claims only.
  EXPECT_GE(store_->DeleteExpiredPublishClaims(400).value(), 1);  // root/n's (120)
  EXPECT_TRUE(store_->ClaimPublish({k, "root/n", "pub-c", Digest("cc"), 900}, 400).value().ours);
  EXPECT_FALSE(store_->ClaimPublish({k, "root/m", "pub-c", Digest("cc"), 900}, 400).value().ours);
}

// 32 publishers racing one (key, family), half through a second handle on the same database
// (another hub process's view): exactly one holds the claim, and every other is told it is that
// one.
TEST_P(StoreTest, ConcurrentClaimsHaveExactlyOneHolder) {
  std::unique_ptr<HubStore> second;
  if (GetParam() == "sqlite") {
    second = OpenSqliteStore(dir_ + "/hub.sqlite").value();
  } else if (GetParam() == "postgresql") {
    second = OpenPostgresStore(std::getenv("KILN_TEST_PG_URL"), 4).value();
  }
  const std::string k = Key("claim-race");
  constexpr int kPublishers = 32;
  std::vector<std::thread> threads;
  std::vector<std::string> holders(kPublishers);
  std::atomic<int> ours{0};
  for (int i = 0; i < kPublishers; ++i) {
    threads.emplace_back([&, i] {
      HubStore& store = (second && i % 2 == 1) ? *second : *store_;
      const std::string me = "racer-" + std::to_string(i);
      auto r = store.ClaimPublish({k, "root/m", me, Digest("r" + std::to_string(i)), 1000}, 10);
      if (!r.ok()) {
        holders[i] = "error: " + r.status().ToString();
        return;
      }
      if (r->ours) ++ours;
      holders[i] = r->holder.publisher;
      if (r->ours && r->holder.publisher != me) holders[i] = "ours but held by " + holders[i];
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ours.load(), 1);
  for (const auto& h : holders) EXPECT_EQ(h, holders[0]);
}

// A publisher's storage: the bytes of every cell row it wrote, and its intents no cell completes
// (the quota's inputs); another publisher's rows count for that one alone.
TEST_P(StoreTest, PublisherUsageCountsCellsAndOpenIntents) {
  const std::string me = "usage-" + Nonce();
  EXPECT_EQ(store_->GetPublisherUsage(me).value().cell_bytes, 0u);
  CellRow stored = Cell(Key("u1"), Digest("u1"), "r");
  stored.publisher = me;
  stored.size = 1000;
  ASSERT_TRUE(store_->InsertCellIfAbsent(stored).ok());
  // Its intent, completed by that row, is not open; another intent is.
  ASSERT_TRUE(store_->PutIntent({stored.key, stored.digest, 1000, "root/m", "", "", me, 5}).ok());
  ASSERT_TRUE(store_->PutIntent({Key("u2"), Digest("u2"), 300, "root/m", "", "", me, 5}).ok());
  ASSERT_TRUE(
      store_->PutIntent({Key("u3"), Digest("u3"), 700, "root/m", "", "", "other-" + me, 5}).ok());
  auto usage = store_->GetPublisherUsage(me).value();
  EXPECT_EQ(usage.cell_bytes, 1000u);
  ASSERT_EQ(usage.open_intents.size(), 1u);
  EXPECT_EQ(usage.open_intents[0].digest, Digest("u2"));
  EXPECT_EQ(usage.open_intents[0].size, 300u);
}

// Re-signing replaces a row's receipt only while the row still holds those bytes.
TEST_P(StoreTest, UpdateReceiptTouchesOnlyTheRowOfThoseBytes) {
  const std::string k = Key("resign");
  ASSERT_TRUE(store_->InsertCellIfAbsent(Cell(k, Digest("r1"), "old")).ok());
  EXPECT_FALSE(store_->UpdateReceipt(k, "root/m", Digest("other"), "new").value());
  EXPECT_FALSE(store_->UpdateReceipt(k, "acme/m", Digest("r1"), "new").value());
  EXPECT_EQ(store_->GetCell(k, "root/m").value()->receipt, "old");
  EXPECT_TRUE(store_->UpdateReceipt(k, "root/m", Digest("r1"), "new").value());
  EXPECT_EQ(store_->GetCell(k, "root/m").value()->receipt, "new");
}

TEST_P(StoreTest, RevocationsAreStickyAndListed) {
  RevocationRow r{Key("rv"), Digest("rv"), "cell_fault on fleet", "admin", 7};
  ASSERT_TRUE(store_->Revoke(r).ok());
  RevocationRow again = r;
  again.reason = "second";
  ASSERT_TRUE(store_->Revoke(again).ok());
  auto got = store_->GetRevocation(r.key, r.digest).value();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->reason, "cell_fault on fleet");
  bool listed = false;
  const auto revocations = store_->ListRevocations().value();
  for (const auto& row : revocations) listed |= row.key == r.key;
  EXPECT_TRUE(listed);
}

// A lift keeps the row (the signed list must carry it) one revision higher; the revocation is no
// longer in force, the owner it left in place is not replaced by another digest, and a second
// revocation revokes again one revision higher.
TEST_P(StoreTest, ARevocationIsLiftedAsARowOfItsOwnAndRevokedAgainAboveIt) {
  const std::string k = Key("lift");
  RevocationRow r{Key("lift"), Digest("lift1"), "precaution", "admin", 7};
  EXPECT_FALSE(store_->Reinstate(k, r.digest, "admin", "why", 8).value().has_value());
  ASSERT_TRUE(store_->InsertCellIfAbsent(Cell(k, r.digest, "rcpt")).ok());
  ASSERT_TRUE(store_->Revoke(r).ok());
  EXPECT_EQ(store_->GetRevocation(k, r.digest).value()->revision, 1);

  auto lifted = store_->Reinstate(k, r.digest, "ops", "false alarm", 9).value();
  ASSERT_TRUE(lifted.has_value());
  EXPECT_EQ(lifted->revision, 2);
  EXPECT_EQ(lifted->lifted_at, 9);
  EXPECT_EQ(lifted->lifted_by, "ops");
  EXPECT_EQ(lifted->lift_reason, "false alarm");
  EXPECT_EQ(lifted->reason, "precaution");
  EXPECT_FALSE(store_->GetRevocation(k, r.digest).value().has_value());
  auto resolved = store_->GetCellForResolve(k, "root/m").value();
  ASSERT_TRUE(resolved.has_value());
  EXPECT_FALSE(resolved->revocation.has_value());
  // Lifted twice: the same row, no new revision.
  EXPECT_EQ(store_->Reinstate(k, r.digest, "ops", "again", 10).value()->revision, 2);
  // The reinstated owner holds its key again: another digest does not replace it.
  auto other = store_->InsertCellIfAbsent(Cell(k, Digest("lift2"), "rcpt2")).value();
  EXPECT_FALSE(other.inserted);
  EXPECT_EQ(other.owner.digest, r.digest);
  bool listed = false;
  const auto rows = store_->ListRevocations().value();
  for (const auto& row : rows) {
    if (row.key != k) continue;
    listed = true;
    EXPECT_FALSE(row.in_force());
    EXPECT_EQ(row.revision, 2);
  }
  EXPECT_TRUE(listed);

  RevocationRow again = r;
  again.reason = "it was real";
  again.revoked_at = 11;
  ASSERT_TRUE(store_->Revoke(again).ok());
  auto now = store_->GetRevocation(k, r.digest).value();
  ASSERT_TRUE(now.has_value());
  EXPECT_EQ(now->revision, 3);
  EXPECT_EQ(now->reason, "it was real");
  EXPECT_EQ(now->lifted_at, 0);
  EXPECT_TRUE(now->lift_reason.empty());
  resolved = store_->GetCellForResolve(k, "root/m").value();
  ASSERT_TRUE(resolved.has_value());
  ASSERT_TRUE(resolved->revocation.has_value());
  EXPECT_EQ(resolved->revocation->revision, 3);
}

// Every order of a (release, target) is one incarnation above the last; pairs count apart.
TEST_P(StoreTest, OrdersCountTheirIncarnationsPerReleaseAndTarget) {
  const std::string release = "r-" + Nonce();
  OrderRow pin{release, "mlp", "pin", "ck1-a@sha256:b", 0, 0, "drill", "ops", 5};
  auto first = store_->SetOrder(pin).value();
  EXPECT_EQ(first.incarnation, 1);
  EXPECT_EQ(first.ref, pin.ref);
  OrderRow canary{release, "mlp", "canary", "ck1-a@sha256:c", 250000, 99, "half", "ops", 6};
  auto second = store_->SetOrder(canary).value();
  EXPECT_EQ(second.incarnation, 2) << "the caller's incarnation is ignored";
  EXPECT_EQ(second.kind, "canary");
  EXPECT_EQ(second.share_ppm, 250000);
  OrderRow other{release, "vae", "eager", "", 0, 0, "x", "ops", 7};
  EXPECT_EQ(store_->SetOrder(other).value().incarnation, 1);
  int seen = 0;
  const auto orders = store_->ListOrders().value();
  for (const auto& o : orders) {
    if (o.release != release) continue;
    ++seen;
    if (o.target == "mlp") {
      EXPECT_EQ(o.incarnation, 2);
      EXPECT_EQ(o.reason, "half");
      EXPECT_EQ(o.set_at, 6);
    }
  }
  EXPECT_EQ(seen, 2);
}

// Revoked tokens are remembered (the tokens themselves are each hub's tokens file): sticky, the
// first revocation kept, visible to every hub on the store.
TEST_P(StoreTest, TokenRevocationsAreRememberedAndSticky) {
  const std::string hash = Sha256Hex(Nonce() + "tok");
  EXPECT_FALSE(store_->IsTokenRevoked(hash).value());
  ASSERT_TRUE(store_->RevokeToken({hash, "acme-ci", "admin", 77}).ok());
  ASSERT_TRUE(store_->RevokeToken({hash, "acme-ci", "other-admin", 78}).ok());
  EXPECT_TRUE(store_->IsTokenRevoked(hash).value());
  bool found = false;
  const auto listed = store_->ListRevokedTokens().value();
  for (const auto& r : listed) {
    if (r.token_sha256 != hash) continue;
    found = true;
    EXPECT_EQ(r.revoked_by, "admin");
    EXPECT_EQ(r.revoked_at, 77);
  }
  EXPECT_TRUE(found);
  EXPECT_FALSE(store_->IsTokenRevoked(Sha256Hex("unknown" + Nonce())).value());
}

TEST_P(StoreTest, ObligationsDischargeBySlotOrKeyAndSettleTerminally) {
  const std::string rel = "rel-" + Nonce();
  const std::string k = Key("ob");
  std::vector<ObligationRow> rows(3);
  rows[0].release = rel, rows[0].target = "denoiser", rows[0].sm = "x86-64-v3";
  rows[1].release = rel, rows[1].target = "decoder", rows[1].sm = "x86-64-v3";
  rows[2].release = rel, rows[2].target = "vae", rows[2].sm = "x86-64-v3", rows[2].key = k;
  rows[1].deadline = 1234567890;  // kept as given; the others have none
  EXPECT_EQ(store_->AddObligations(rows).value(), 3);
  {
    std::map<std::string, int64_t> deadlines;
    const auto first = store_->ListObligations(rel).value();
    for (const auto& o : first) deadlines[o.target] = o.deadline;
    EXPECT_EQ(deadlines["decoder"], 1234567890);
    EXPECT_EQ(deadlines["denoiser"], 0);
    // A second declaration of a slot keeps the first one's row, deadline included.
    rows[1].deadline = 42;
    EXPECT_EQ(store_->AddObligations(rows).value(), 0);
    const auto all = store_->ListAllObligations().value();
    for (const auto& o : all) {
      if (o.release == rel && o.target == "decoder") {
        EXPECT_EQ(o.deadline, 1234567890);
      }
    }
  }
  EXPECT_EQ(store_->AddObligations(rows).value(), 0);  // idempotent

  // By slot (release, target, sm): the key is learned at discharge.
  const std::string k2 = Key("ob2");
  EXPECT_EQ(
      store_->DischargeObligations(k2, Digest("ob2"), rel, "denoiser", "x86-64-v3", 9).value(), 1);
  // By declared key; never outside the scope (release) the caller holds.
  EXPECT_EQ(store_->DischargeObligations(k, Digest("ob"), "", "", "", 9, "another").value(), 0);
  EXPECT_EQ(store_->DischargeObligations(k, Digest("ob"), "", "", "", 9, rel).value(), 1);
  // A deterministic refusal settles; a settled obligation is never discharged afterwards.
  auto settled = store_->SettleObligation(rel, "decoder", "x86-64-v3", "no_export_declaration", 9);
  ASSERT_TRUE(settled.ok());
  EXPECT_EQ((*settled)->state, "settled:no_export_declaration");
  EXPECT_EQ(
      store_->DischargeObligations(Key("late"), Digest("late"), rel, "decoder", "x86-64-v3", 10)
          .value(),
      0);
  auto again = store_->SettleObligation(rel, "denoiser", "x86-64-v3", "declaration_refused", 11);
  EXPECT_EQ((*again)->state, "discharged");
  EXPECT_FALSE(store_->SettleObligation(rel, "nope", "x86-64-v3", "t", 1).value().has_value());

  auto list = store_->ListObligations(rel).value();
  ASSERT_EQ(list.size(), 3u);
  std::map<std::string, ObligationRow> by_target;
  for (const auto& o : list) by_target[o.target] = o;
  EXPECT_EQ(by_target["denoiser"].state, "discharged");
  EXPECT_EQ(by_target["denoiser"].key, k2);
  EXPECT_EQ(by_target["vae"].cell_digest, Digest("ob"));
  EXPECT_EQ(by_target["decoder"].state, "settled:no_export_declaration");
}

// The workers that reported a ref crashing (kind cell_crashed): distinct, sorted, only that ref
// of that key, and of every org.
TEST_P(StoreTest, CrashReportersAreTheDistinctWorkersThatReportedTheRef) {
  const std::string w1 = "crash-w1-" + Nonce(), w2 = "crash-w2-" + Nonce();
  const std::string w3 = "crash-w3-" + Nonce();
  const std::string org = "crash-org-" + Nonce();  // no other test's org (databases outlive a run)
  const std::string k = Key("crash");
  const std::string ref = k + "@" + Digest("crash");
  const std::string other = k + "@" + Digest("crash-other");
  auto row = [&](const std::string& worker, int64_t seq, const std::string& kind,
                 const std::string& r, const std::string& org) {
    StoredEvent e;
    e.worker = worker;
    e.seq = seq;
    e.kind = kind;
    e.phase = "quarantined";
    e.key = k;
    e.ref = r;
    e.ts = 1000 + seq;
    e.org = org;
    return e;
  };
  ASSERT_TRUE(store_
                  ->InsertEvents(
                      {row(w2, 1, "cell_crashed", ref, ""), row(w1, 1, "cell_crashed", ref, org),
                       row(w1, 2, "cell_crashed", ref, org), row(w3, 1, "serve_degrade", ref, ""),
                       row(w2, 2, "cell_crashed", other, "")})
                  .ok());
  EXPECT_EQ(store_->CrashReporters(k, ref).value(), (std::vector<std::string>{w1, w2}));
  EXPECT_EQ(store_->CrashReporters(k, other).value(), (std::vector<std::string>{w2}));
  EXPECT_TRUE(store_->CrashReporters(Key("crash-none"), ref).value().empty());
}

TEST_P(StoreTest, EventsFilterAndAdoptionCounts) {
  const std::string w1 = "w1-" + Nonce(), w2 = "w2-" + Nonce();
  const std::string k = Key("ev");
  std::vector<StoredEvent> rows;
  rows.push_back({0, w1, 1, "boot_adopt", "hit", k, 3.5, "key=" + k, 1000, {}, {}, {}, {}});
  rows.push_back({0, w1, 2, "serve_degrade", "cell_fault", k, 0, "fn=f", 2000, {}, {}, {}, {}});
  rows.push_back(
      {0, w2, 1, "boot_adopt", "local_hit", k + "@" + Digest("ev"), 1, "", 3000, {}, {}, {}, {}});
  rows.push_back({0, w2, 2, "boot_adopt", "miss", Key("other"), 1, "", 4000, {}, {}, {}, {}});
  ASSERT_TRUE(store_->InsertEvents(rows).ok());
  EventFilter f;
  f.worker = w1;
  auto got = store_->QueryEvents(f).value();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].kind, "serve_degrade");  // newest first
  f = EventFilter{};
  f.worker = w2;
  f.phase = "miss";
  EXPECT_EQ(store_->QueryEvents(f).value().size(), 1u);
  f = EventFilter{};
  f.worker = w1;
  f.since_ts = 1500;
  EXPECT_EQ(store_->QueryEvents(f).value().size(), 1u);
  EXPECT_EQ(store_->AdoptedCount(k, std::nullopt).value(), 2);
  bool saw = false;
  const auto workers = store_->ListWorkers(std::nullopt).value();
  for (const auto& w : workers) saw |= (w.worker == w1 && w.events == 2);
  EXPECT_TRUE(saw);
}

// An event row's structured fields (target, ref, fn, stages) are stored and read back as fields.
TEST_P(StoreTest, EventFieldsRoundTrip) {
  const std::string w = "wf-" + Nonce();
  const std::string k = Key("fields");
  const StoredEvent e{0,
                      w,
                      7,
                      "boot_adopt",
                      "hit",
                      k,
                      12.5,
                      "key=" + k + " target=mlp",
                      5000,
                      "mlp",
                      k + "@" + Digest("fields"),
                      "mlp-fn",
                      R"([{"stage":"key","ms":0.5},{"stage":"resolve","ms":3.25}])"};
  ASSERT_TRUE(store_->InsertEvents({e}).ok());
  EventFilter f;
  f.worker = w;
  const auto got = store_->QueryEvents(f).value();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].target, "mlp");
  EXPECT_EQ(got[0].ref, e.ref);
  EXPECT_EQ(got[0].fn, "mlp-fn");
  EXPECT_EQ(got[0].stages, e.stages);
  EXPECT_EQ(got[0].detail, e.detail);
}

// Events and obligations keep the org they were written for, and every read of fleet rows can be
// held to one org: the hub's tenants see their own rows only.
TEST_P(StoreTest, EventsAndObligationsCarryTheirOrg) {
  const std::string acme = "acme" + Nonce(), beta = "beta" + Nonce();
  const std::string w = "wo-" + Nonce();
  const std::string k = Key("org");
  StoredEvent a{0, w, 1, "boot_adopt", "hit", k, 1, "", 1000, {}, {}, {}, {}};
  a.org = acme;
  StoredEvent b = a;
  b.seq = 2;
  b.org = beta;
  ASSERT_TRUE(store_->InsertEvents({a, b}).ok());
  EventFilter f;
  f.worker = w;
  EXPECT_EQ(store_->QueryEvents(f).value().size(), 2u);
  f.org = acme;
  const auto mine = store_->QueryEvents(f).value();
  ASSERT_EQ(mine.size(), 1u);
  EXPECT_EQ(mine[0].org, acme);
  EXPECT_EQ(mine[0].seq, 1);
  f.org = "";
  EXPECT_TRUE(store_->QueryEvents(f).value().empty());
  EXPECT_EQ(store_->AdoptedCount(k, acme).value(), 1);
  EXPECT_EQ(store_->AdoptedCount(k, "nobody" + Nonce()).value(), 0);
  const auto workers = store_->ListWorkers(beta).value();
  ASSERT_EQ(workers.size(), 1u);
  EXPECT_EQ(workers[0].events, 1);

  const std::string rel = "rel-org-" + Nonce();
  ObligationRow o;
  o.release = rel, o.target = "denoiser", o.sm = "x86-64-v3", o.org = acme;
  ASSERT_EQ(store_->AddObligations({o}).value(), 1);
  const auto listed = store_->ListObligations(rel).value();
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].org, acme);
  auto settled = store_->SettleObligation(rel, "denoiser", "x86-64-v3", "t", 5).value();
  ASSERT_TRUE(settled.has_value());
  EXPECT_EQ(settled->org, acme);
}

INSTANTIATE_TEST_SUITE_P(Backends, StoreTest, ::testing::Values("memory", "sqlite", "postgresql"));

// Makes the SQLite file `path` by running `sql` in it, as an older hub left it.
::testing::AssertionResult WriteSqlite(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  if (sqlite3_open(path.c_str(), &db) != SQLITE_OK) {
    sqlite3_close(db);
    return ::testing::AssertionFailure() << "cannot open " << path;
  }
  char* err = nullptr;
  const int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err);
  const std::string message = err != nullptr ? err : "";
  sqlite3_free(err);
  sqlite3_close(db);
  if (rc != SQLITE_OK) return ::testing::AssertionFailure() << message;
  return ::testing::AssertionSuccess();
}

// A version-2 database (events without structured fields) gains the columns on open; its rows
// are kept, with the new fields empty, and new rows keep theirs.
TEST(SqliteMigration, VersionTwoEventsGainTheirFields) {
  const std::string dir = ::testing::TempDir() + "/kiln_sqlite_migration2_" + Nonce();
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/hub.sqlite";
  const std::string v2 = R"sql(
CREATE TABLE events (
  id INTEGER PRIMARY KEY AUTOINCREMENT, worker TEXT NOT NULL, seq INTEGER NOT NULL,
  kind TEXT NOT NULL, phase TEXT NOT NULL, key TEXT NOT NULL, duration_ms REAL NOT NULL,
  detail TEXT NOT NULL, ts INTEGER NOT NULL);
INSERT INTO events (worker, seq, kind, phase, key, duration_ms, detail, ts)
  VALUES ('w', 1, 'boot_adopt', 'hit', 'K', 1.5, 'key=K target=t', 10);
PRAGMA user_version = 2;
)sql";
  ASSERT_TRUE(WriteSqlite(path, v2));
  auto s = OpenSqliteStore(path);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  const StoredEvent fresh{
      0, "w", 2, "boot_adopt", "miss", "K", 2, "", 20, "t", "", "", R"([{"stage":"key","ms":1}])"};
  ASSERT_TRUE((*s)->InsertEvents({fresh}).ok());
  const auto rows = (*s)->QueryEvents(EventFilter{}).value();
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[1].detail, "key=K target=t");
  EXPECT_EQ(rows[1].target, "");
  EXPECT_EQ(rows[0].target, "t");
  EXPECT_EQ(rows[0].stages, fresh.stages);
  s->reset();
  auto again = OpenSqliteStore(path);  // a second open finds version 3 and changes nothing
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ((*again)->QueryEvents(EventFilter{}).value().size(), 2u);
  std::filesystem::remove_all(dir);
}

// A version-3 database (events and obligations without an org) gains the org columns on open; its
// rows are kept as untenanted (org ""), which no tenant's read returns.
TEST(SqliteMigration, VersionThreeRowsGainAnEmptyOrg) {
  const std::string dir = ::testing::TempDir() + "/kiln_sqlite_migration3_" + Nonce();
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/hub.sqlite";
  const std::string v3 = R"sql(
CREATE TABLE obligations (
  release TEXT NOT NULL, target TEXT NOT NULL, sm TEXT NOT NULL, key TEXT NOT NULL,
  state TEXT NOT NULL, cell_digest TEXT NOT NULL, updated_at INTEGER NOT NULL,
  PRIMARY KEY (release, target, sm));
INSERT INTO obligations VALUES ('r', 'denoiser', 'x86-64-v3', '', 'owed', '', 1);
CREATE TABLE events (
  id INTEGER PRIMARY KEY AUTOINCREMENT, worker TEXT NOT NULL, seq INTEGER NOT NULL,
  kind TEXT NOT NULL, phase TEXT NOT NULL, key TEXT NOT NULL, duration_ms REAL NOT NULL,
  detail TEXT NOT NULL, ts INTEGER NOT NULL, target TEXT NOT NULL DEFAULT '',
  ref TEXT NOT NULL DEFAULT '', fn TEXT NOT NULL DEFAULT '', stages TEXT NOT NULL DEFAULT '');
INSERT INTO events (worker, seq, kind, phase, key, duration_ms, detail, ts)
  VALUES ('w', 1, 'boot_adopt', 'hit', 'K', 1.5, 'old', 10);
PRAGMA user_version = 3;
)sql";
  ASSERT_TRUE(WriteSqlite(path, v3));
  auto s = OpenSqliteStore(path);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  StoredEvent fresh{0, "w", 2, "boot_adopt", "miss", "K", 2, "new", 20, "", "", "", ""};
  fresh.org = "acme";
  ASSERT_TRUE((*s)->InsertEvents({fresh}).ok());
  const auto rows = (*s)->QueryEvents(EventFilter{}).value();
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[1].detail, "old");
  EXPECT_EQ(rows[1].org, "");
  EXPECT_EQ(rows[0].org, "acme");
  EventFilter acme;
  acme.org = "acme";
  EXPECT_EQ((*s)->QueryEvents(acme).value().size(), 1u);
  const auto obligations = (*s)->ListObligations("r").value();
  ASSERT_EQ(obligations.size(), 1u);
  EXPECT_EQ(obligations[0].org, "");
  EXPECT_EQ(obligations[0].state, "owed");
  EXPECT_EQ(obligations[0].deadline, 0);  // and no deadline (schema 5)
  s->reset();
  auto again = OpenSqliteStore(path);  // a second open finds version 5 and changes nothing
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ((*again)->QueryEvents(EventFilter{}).value().size(), 2u);
  std::filesystem::remove_all(dir);
}

// A version-4 database (orgs, no deadlines) opens: its obligations gain deadline 0, and nothing
// of version 4 is applied twice.
TEST(SqliteMigration, VersionFourObligationsGainNoDeadline) {
  const std::string dir = ::testing::TempDir() + "/kiln_sqlite_migration4_" + Nonce();
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/hub.sqlite";
  const std::string v4 = R"sql(
CREATE TABLE obligations (
  release TEXT NOT NULL, target TEXT NOT NULL, sm TEXT NOT NULL, key TEXT NOT NULL,
  state TEXT NOT NULL, cell_digest TEXT NOT NULL, updated_at INTEGER NOT NULL,
  org TEXT NOT NULL DEFAULT '', PRIMARY KEY (release, target, sm));
INSERT INTO obligations VALUES ('r', 'denoiser', 'x86-64-v3', '', 'owed', '', 1, 'acme');
CREATE TABLE events (
  id INTEGER PRIMARY KEY AUTOINCREMENT, worker TEXT NOT NULL, seq INTEGER NOT NULL,
  kind TEXT NOT NULL, phase TEXT NOT NULL, key TEXT NOT NULL, duration_ms REAL NOT NULL,
  detail TEXT NOT NULL, ts INTEGER NOT NULL, target TEXT NOT NULL DEFAULT '',
  ref TEXT NOT NULL DEFAULT '', fn TEXT NOT NULL DEFAULT '', stages TEXT NOT NULL DEFAULT '',
  org TEXT NOT NULL DEFAULT '');
PRAGMA user_version = 4;
)sql";
  ASSERT_TRUE(WriteSqlite(path, v4));
  auto s = OpenSqliteStore(path);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  const auto obligations = (*s)->ListObligations("r").value();
  ASSERT_EQ(obligations.size(), 1u);
  EXPECT_EQ(obligations[0].org, "acme");
  EXPECT_EQ(obligations[0].deadline, 0);
  ObligationRow later;
  later.release = "r", later.target = "vae", later.sm = "x86-64-v3", later.deadline = 99;
  ASSERT_EQ((*s)->AddObligations({later}).value(), 1);
  s->reset();
  auto again = OpenSqliteStore(path);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  std::map<std::string, int64_t> deadlines;
  const auto reopened = (*again)->ListObligations("r").value();
  for (const auto& o : reopened) deadlines[o.target] = o.deadline;
  EXPECT_EQ(deadlines["vae"], 99);
  std::filesystem::remove_all(dir);
}

// A version-5 revocation is a first revocation in force after the migration, and can be lifted.
TEST(SqliteMigration, VersionFiveRevocationsStayInForceAndCanBeLifted) {
  const std::string dir = ::testing::TempDir() + "/kiln_sqlite_migration5_" + Nonce();
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/hub.sqlite";
  const std::string key = "ck1-" + std::string(56, 'a');
  const std::string digest = "sha256:" + std::string(64, 'b');
  const std::string v5 =
      "CREATE TABLE revocations (key TEXT NOT NULL, digest TEXT NOT NULL, reason TEXT NOT NULL, "
      "revoked_by TEXT NOT NULL, revoked_at INTEGER NOT NULL, PRIMARY KEY (key, digest));\n"
      "INSERT INTO revocations VALUES ('" +
      key + "', '" + digest +
      "', 'bad', 'admin', 5);\n"
      "PRAGMA user_version = 5;\n";
  ASSERT_TRUE(WriteSqlite(path, v5));
  auto s = OpenSqliteStore(path);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  auto r = (*s)->GetRevocation(key, digest).value();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->revision, 1);
  EXPECT_TRUE(r->in_force());
  auto lifted = (*s)->Reinstate(key, digest, "ops", "fixed", 6).value();
  ASSERT_TRUE(lifted.has_value());
  EXPECT_EQ(lifted->revision, 2);
  EXPECT_FALSE((*s)->GetRevocation(key, digest).value().has_value());
  std::filesystem::remove_all(dir);
}

// A database made by the first schema (one owner per key, one intent per (key, digest), a token
// table) is brought forward on open, its cells and intents kept (tokens now live in the file).
TEST(SqliteMigration, VersionOneDatabaseKeepsItsRowsAndGainsTheScopedKeys) {
  const std::string dir = ::testing::TempDir() + "/kiln_sqlite_migration_" + Nonce();
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/hub.sqlite";
  const std::string v1 = R"sql(
CREATE TABLE cells (key TEXT PRIMARY KEY, digest TEXT NOT NULL, size INTEGER NOT NULL,
  family TEXT NOT NULL, publisher TEXT NOT NULL, tier TEXT NOT NULL, release TEXT NOT NULL,
  receipt TEXT NOT NULL, created_at INTEGER NOT NULL);
CREATE TABLE intents (key TEXT NOT NULL, digest TEXT NOT NULL, size INTEGER NOT NULL,
  family TEXT NOT NULL, release TEXT NOT NULL, target TEXT NOT NULL, publisher TEXT NOT NULL,
  created_at INTEGER NOT NULL, PRIMARY KEY (key, digest));
CREATE INDEX intents_digest ON intents(digest);
CREATE TABLE tokens (token_sha256 TEXT PRIMARY KEY, name TEXT NOT NULL, role TEXT NOT NULL,
  tier TEXT NOT NULL, org TEXT NOT NULL);
INSERT INTO cells VALUES ('K', 'sha256:a', 1, 'root/m', 'ci', 'platform', '', 'R', 1);
INSERT INTO intents VALUES ('K', 'sha256:a', 1, 'root/m', '', '', 'ci', 1);
INSERT INTO tokens VALUES ('h', 'ci', 'publisher', 'platform', '');
)sql";
  ASSERT_TRUE(WriteSqlite(path, v1));
  auto s = OpenSqliteStore(path);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  auto store = std::move(s).value();
  ASSERT_TRUE(store->GetCell("K", "root/m").value().has_value());
  EXPECT_EQ(store->GetCell("K", "root/m").value()->receipt, "R");
  EXPECT_TRUE(store->GetIntent("K", "sha256:a", "ci").value().has_value());
  CellRow other{"K", "sha256:b", 1, "acme/m", "acme-ci", "org", "", "R2", 2};
  EXPECT_EQ(store->InsertCellIfAbsent(other).value().owner.digest, "sha256:b");
  store.reset();
  auto again = OpenSqliteStore(path);  // a second open finds version 2 and changes nothing
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ((*again)->ListCellsForKey("K").value().size(), 2u);
  std::filesystem::remove_all(dir);
}

// Damage is a refusal, never a miss: a SQLite file with garbled pages, truncated, or swapped for
// another hub's refuses to open with store_corrupt instead of starting (empty) or answering
// "found: false" for rows it holds.
class SqliteDamageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/kiln_sqlite_damage_" + Nonce();
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    path_ = dir_ + "/hub.sqlite";
    auto s = OpenSqliteStore(path_);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    // Enough rows for the cells table and its index to span many pages.
    for (int i = 0; i < 400; ++i) {
      const std::string n = std::to_string(i);
      CellRow row{Key(n), Digest(n), 100, "root/m", "ci", "platform", "r1", std::string(300, 'r'),
                  1000};
      ASSERT_TRUE((*s)->InsertCellIfAbsent(row).ok());
    }
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void ExpectCorrupt(const char* what) {
    auto reopened = OpenSqliteStore(path_);
    ASSERT_FALSE(reopened.ok()) << what << ": a damaged store opened";
    EXPECT_EQ(reopened.status().token(), kRefusalStoreCorrupt) << reopened.status().ToString();
    EXPECT_EQ(reopened.status().code(), StatusCode::kCorruption);
    EXPECT_NE(reopened.status().message().find(path_), std::string::npos)
        << "the refusal names the file: " << reopened.status().ToString();
  }
  std::string dir_, path_;
};

TEST_F(SqliteDamageTest, AnUndamagedStoreReopensWithItsRows) {
  auto s = OpenSqliteStore(path_);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_TRUE((*s)->CheckIntegrity().ok());
  auto got = (*s)->GetCell(Key("7"), "root/m");
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(got->has_value());
}

TEST_F(SqliteDamageTest, GarbledPagesRefuse) {
  const auto size = std::filesystem::file_size(path_);
  ASSERT_GT(size, 8u * 4096u);
  {
    std::FILE* f = std::fopen(path_.c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    std::mt19937 rng(7);
    // Pages 3.. half the file: b-tree pages of the tables and the index, not the header.
    std::fseek(f, 2 * 4096, SEEK_SET);
    for (uint64_t i = 2 * 4096; i < size / 2; ++i) std::fputc(static_cast<int>(rng() & 0xff), f);
    std::fclose(f);
  }
  ExpectCorrupt("garbled pages");
}

TEST_F(SqliteDamageTest, TruncatedToNothingRefusesInsteadOfStartingEmpty) {
  std::filesystem::resize_file(path_, 0);
  ExpectCorrupt("truncated to 0 bytes");
}

TEST_F(SqliteDamageTest, TruncatedMidFileRefuses) {
  std::filesystem::resize_file(path_, std::filesystem::file_size(path_) / 2);
  ExpectCorrupt("truncated to half");
}

TEST_F(SqliteDamageTest, AnotherHubsDatabaseInItsPlaceRefuses) {
  const std::string other_dir = dir_ + "/other";
  std::filesystem::create_directories(other_dir);
  ASSERT_TRUE(OpenSqliteStore(other_dir + "/hub.sqlite").ok());
  std::filesystem::copy_file(other_dir + "/hub.sqlite", path_,
                             std::filesystem::copy_options::overwrite_existing);
  ExpectCorrupt("replaced by another store");
}

}  // namespace
}  // namespace kiln
