// Tests of the hub's routes (src/kiln/hub/server.h HubService) against the in-memory stores:
// the publish flow, each refusal with its own token, scopes (families), the builder's verdict,
// revocation and its signed list, tokens, releases and obligations, events, blob reads, garbage
// collection and the dashboard. The same routes over real HTTP are in hub_api_test.cc; the real
// sandboxed builder runs in tests/worker/trust_e2e_test.cc.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <thread>

#include "src/kiln/base/sha256.h"
#include "src/kiln/cell/pack.h"
#include "src/kiln/hub/server.h"
#include "tests/hub/hub_fixtures.h"

namespace kiln {
namespace {

using hub_testing::Graph;
using hub_testing::MakeCell;
using hub_testing::MakeMetadata;

// A stand-in for the sandboxed builder (hub/builder.h), whose real runs are end-to-end: it
// answers what the test tells it and counts its calls, so the hub's use of the verdict is tested
// here without a compiler.
class ScriptedBuilder final : public CellBuilder {
 public:
  const std::string& name() const override { return name_; }
  Result<RebuildAttestation> Rebuild(const CellMetadata& metadata, const PublishedMembers& members,
                                     const RebuildRequester& who) override {
    ++calls;
    last_requester = who;
    if (delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    if (!refusal.ok()) return refusal;
    return RebuildAttestation{name_, members.source.digest, members.shared_object.digest,
                              "scripted", 1};
  }
  RebuildRequester last_requester;
  int delay_ms = 0;
  Status refusal;
  std::atomic<int> calls{0};

 private:
  std::string name_ = "builder-test";
};

class ServiceTest : public ::testing::Test {
 protected:
  void SetUp() override { Make(nullptr); }
  void Make(std::shared_ptr<CellBuilder> builder, std::function<int64_t()> now = nullptr) {
    dir_ = ::testing::TempDir() + "/kiln_service_test";
    std::filesystem::remove_all(dir_);
    HubServiceOptions o;
    o.builder = std::move(builder);
    o.blob_grace_s = 60;
    if (!now) now = [] { return int64_t{1700000000}; };
    svc_ =
        std::make_unique<HubService>(NewMemoryStore(), NewMemoryBlobStore(),
                                     SigningKeyRing::OpenOrCreate(dir_).value(), now, std::move(o));
    ASSERT_TRUE(svc_->InstallTokens(Tokens()).ok());
  }
  static std::vector<TokenRow> Tokens() {
    return {
        {Sha256Hex("platform-token"), "ci", "publisher", "platform", "", {"*"}},
        {Sha256Hex("acme-token"), "acme-ci", "publisher", "org", "acme", {}},
        {Sha256Hex("worker-token"), "w1", "worker", "", "", {"r1"}},
        {Sha256Hex("other-worker-token"), "w2", "worker", "", "", {}},
        {Sha256Hex("acme-worker-token"), "acme-w", "worker", "", "acme", {}},
        {Sha256Hex("admin-token"), "admin", "admin", "", "", {}},
        // Least-privilege fleet tokens: two tenants' workers, one narrowed to one family.
        {Sha256Hex("acme-fleet-token"),
         "acme-fleet",
         "worker",
         "",
         "acme",
         {"*"},
         {"acme/micro-mlp"}},
        {Sha256Hex("beta-fleet-token"), "beta-fleet", "worker", "", "beta", {"*"}},
    };
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  Principal As(const std::string& token) {
    auto who = svc_->Authenticate("Bearer " + token);
    EXPECT_TRUE(std::holds_alternative<Principal>(who)) << token;
    return std::get<Principal>(who);
  }
  Reply Intent(const Principal& p, const std::string& key, const std::string& digest, uint64_t size,
               const std::string& family, const std::string& release = "") {
    nlohmann::json j{{"key", key}, {"digest", digest}, {"size", size}, {"family", family}};
    if (!release.empty()) j["release"] = release, j["target"] = "denoiser";
    return svc_->PublishIntent(p, j.dump());
  }
  Reply Upload(const Principal& p, const std::string& digest, const std::string& bytes) {
    return svc_->UploadBlob(p, digest, [&](const std::function<bool(std::string_view)>& sink) {
      for (size_t off = 0; off < bytes.size(); off += 1000) {
        if (!sink(std::string_view(bytes).substr(off, 1000))) return true;
      }
      return true;
    });
  }
  Reply Complete(const Principal& p, const std::string& key, const std::string& digest) {
    return svc_->PublishComplete(p, nlohmann::json{{"key", key}, {"digest", digest}}.dump());
  }
  // The whole flow; returns the last reply.
  Reply Publish(const Principal& p, const std::string& cell, const std::string& release = "") {
    auto files = UnpackCell(cell, "t").value();
    auto m = ParseMetadata(files.metadata_json, "t").value();
    const std::string digest = CellDigest(cell);
    Reply r = Intent(p, m.key, digest, cell.size(), m.family, release);
    if (!r.ok() || r.body.value("already", false)) return r;
    r = Upload(p, digest, cell);
    if (!r.ok()) return r;
    return Complete(p, m.key, digest);
  }

  Reply Resolve(const std::string& token, const std::string& key,
                const std::string& family = "root/micro-mlp") {
    return svc_->ResolveCell(As(token), key, family);
  }
  // A valid cell edited in one way, repacked.
  static std::string Edited(const CellMetadata& m, const std::function<void(CellFiles&)>& edit) {
    CellFiles f = UnpackCell(MakeCell(m), "t").value();
    edit(f);
    return PackCell(f).value();
  }

  std::string dir_;
  std::unique_ptr<HubService> svc_;
};

TEST_F(ServiceTest, PublishThenResolveGivesAVerifiableReceipt) {
  const CellMetadata m = MakeMetadata(Graph(1));
  const std::string cell = MakeCell(m);
  Reply miss = Resolve("worker-token", m.key);
  EXPECT_EQ(miss.status, 200);
  EXPECT_EQ(miss.body["found"], false);

  Reply done = Publish(As("platform-token"), cell);
  ASSERT_EQ(done.status, 200) << done.body.dump();
  Reply hit = Resolve("worker-token", m.key);
  ASSERT_EQ(hit.status, 200);
  EXPECT_EQ(hit.body["found"], true);
  EXPECT_EQ(hit.body["digest"], CellDigest(cell));
  EXPECT_EQ(hit.body["size"], cell.size());
  EXPECT_EQ(hit.body["family"], "root/micro-mlp");
  ReceiptVerdict v =
      VerifyReceipt(hit.body["receipt"].get<std::string>(), svc_->keys().PublicKeys(),
                    ExpectedClaims{m.key, CellDigest(cell), cell.size(), m.family});
  ASSERT_TRUE(v.ok()) << v.token << " " << v.message;
  EXPECT_EQ(v.claims.publisher, "ci");
  EXPECT_EQ(v.claims.tier, "platform");
  EXPECT_EQ(v.claims.iat, 1700000000);
  EXPECT_EQ(v.claims.source_digest, MemberDigest(UnpackCell(cell, "t")->source));
  EXPECT_EQ(v.claims.so_digest, MemberDigest(UnpackCell(cell, "t")->shared_object));
  EXPECT_EQ(v.claims.builder, "") << "no builder configured: no rebuild attested";

  // Receipt route, and a second publish of the same bytes answers the same receipt.
  Reply rec = svc_->GetReceipt(As("worker-token"), m.key, CellDigest(cell));
  EXPECT_EQ(rec.body["receipt"], hit.body["receipt"]);
  Reply again = Publish(As("platform-token"), cell);
  EXPECT_EQ(again.status, 200);
  EXPECT_EQ(again.body["already"], true);
  EXPECT_EQ(again.body["receipt"], hit.body["receipt"]);
}

// Crash reports (kind cell_crashed, docs/fleet.md): the resolve answer counts distinct machines
// (a worker's name without its /<pid>), and with the default threshold (0) nothing is revoked
// however many machines report.
TEST_F(ServiceTest, CrashReportsAreCountedPerMachineAndRevokeNothingByDefault) {
  EXPECT_EQ(CrashMachineOf("w1/mlp@host-a/4242"), "w1/mlp@host-a");
  EXPECT_EQ(CrashMachineOf("w1/mlp@host-a"), "w1/mlp@host-a");
  EXPECT_EQ(CrashMachineOf("w1"), "w1");
  EXPECT_EQ(CrashMachineOf("w1/"), "w1/");
  const CellMetadata m = MakeMetadata(Graph(40));
  const std::string cell = MakeCell(m);
  ASSERT_EQ(Publish(As("platform-token"), cell).status, 200);
  const std::string ref = m.key + "@" + CellDigest(cell);
  EXPECT_EQ(Resolve("worker-token", m.key).body.value("crashed_workers", -1), 0);
  auto report = [&](const std::string& instance) {
    nlohmann::json rows = {{{"kind", "cell_crashed"},
                            {"phase", "quarantined"},
                            {"key", m.key},
                            {"ref", ref},
                            {"instance", instance}}};
    return svc_->PostEvents(As("worker-token"), rows.dump()).status;
  };
  ASSERT_EQ(report("mlp@host-a/1"), 200);
  ASSERT_EQ(report("mlp@host-a/2"), 200);  // the same machine, restarted
  EXPECT_EQ(Resolve("worker-token", m.key).body.value("crashed_workers", -1), 1);
  for (const char* host : {"mlp@host-b/1", "mlp@host-c/1", "mlp@host-d/1"}) {
    ASSERT_EQ(report(host), 200);
  }
  Reply hit = Resolve("worker-token", m.key);
  ASSERT_EQ(hit.status, 200) << "revoked with no threshold set: " << hit.body.dump();
  EXPECT_EQ(hit.body.value("crashed_workers", -1), 4);
  EXPECT_EQ(svc_->crash_counters().reports.load(), 5u);
  EXPECT_EQ(svc_->crash_counters().revocations.load(), 0u);
}

TEST_F(ServiceTest, SecondDigestForAKeyIsATypedConflict) {
  const CellMetadata m = MakeMetadata(Graph(2));
  ASSERT_EQ(Publish(As("platform-token"), MakeCell(m, "first")).status, 200);
  Reply r = Publish(As("platform-token"), MakeCell(m, "second"));
  EXPECT_EQ(r.status, 409);
  EXPECT_EQ(r.body["error"], "key_taken");
  EXPECT_TRUE(r.body["receipt"].is_string());
  EXPECT_EQ(r.body["digest"], CellDigest(MakeCell(m, "first")));
}

TEST_F(ServiceTest, MalformedKeyIsBadKey) {
  Reply r = Resolve("worker-token", "ck1-XYZ");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.body["error"], "bad_key");
  EXPECT_TRUE(r.body["message"].is_string());
  Reply f = Resolve("worker-token", MakeMetadata(Graph(99)).key, "");
  EXPECT_EQ(f.status, 400);
  EXPECT_EQ(f.body["error"], "bad_family") << "a resolve names its scope";
}

TEST_F(ServiceTest, TamperedBlobBytesAreDigestMismatch) {
  const CellMetadata m = MakeMetadata(Graph(3));
  std::string cell = MakeCell(m);
  const std::string digest = CellDigest(cell);
  ASSERT_EQ(Intent(As("platform-token"), m.key, digest, cell.size(), m.family).status, 200);
  cell[cell.size() / 2] ^= 0x20;
  Reply r = Upload(As("platform-token"), digest, cell);
  EXPECT_EQ(r.status, 422);
  EXPECT_EQ(r.body["error"], "digest_mismatch");
  EXPECT_FALSE(svc_->blobs().Has(digest));
  Reply c = Complete(As("platform-token"), m.key, digest);
  EXPECT_EQ(c.body["error"], "blob_missing");
}

TEST_F(ServiceTest, SizeLieIsSizeMismatch) {
  const CellMetadata m = MakeMetadata(Graph(4));
  const std::string cell = MakeCell(m);
  const std::string digest = CellDigest(cell);
  ASSERT_EQ(Intent(As("platform-token"), m.key, digest, cell.size() - 512, m.family).status, 200);
  Reply r = Upload(As("platform-token"), digest, cell);
  EXPECT_EQ(r.status, 422);
  EXPECT_EQ(r.body["error"], "size_mismatch");
  EXPECT_FALSE(svc_->blobs().Has(digest));
}

TEST_F(ServiceTest, MetadataThatDoesNotRestateIsRefused) {
  CellMetadata m;
  const std::string cell = hub_testing::MakeNonRestatingCell(&m);
  Reply r = Publish(As("platform-token"), cell);
  EXPECT_EQ(r.status, 422);
  EXPECT_EQ(r.body["error"], "key_mismatch") << "the worker's own token: " << r.body.dump();
  EXPECT_FALSE(svc_->store().GetCell(m.key, m.family).value().has_value());
}

TEST_F(ServiceTest, UnknownOrMissingTokenIsUnauthenticated) {
  for (const char* header : {"", "Bearer nope", "Basic abc"}) {
    auto who = svc_->Authenticate(header);
    ASSERT_TRUE(std::holds_alternative<Reply>(who)) << header;
    EXPECT_EQ(std::get<Reply>(who).status, 401);
    EXPECT_EQ(std::get<Reply>(who).body["error"], "unauthenticated");
  }
}

TEST_F(ServiceTest, WorkerMayNotPublishNorAdminister) {
  const CellMetadata m = MakeMetadata(Graph(5));
  Reply r = Publish(As("worker-token"), MakeCell(m));
  EXPECT_EQ(r.status, 403);
  EXPECT_EQ(r.body["error"], "forbidden");
  EXPECT_EQ(svc_->Revoke(As("worker-token"), "{}").body["error"], "forbidden");
  EXPECT_EQ(svc_->RotateKey(As("platform-token")).body["error"], "forbidden");
}

// A tenant's worker token runs the fleet loop alone: it publishes the cells it minted into its
// own granted family (signed tier org), reports events and settles its org's obligations; it
// never writes another org's or the platform's families, never administers, and never reads
// another org's rows.
TEST_F(ServiceTest, AnOrgWorkerPublishesReportsAndSettlesWithinItsOrgOnly) {
  const Principal acme = As("acme-fleet-token");
  const CellMetadata own = MakeMetadata(Graph(40), "acme/micro-mlp");
  const std::string cell = MakeCell(own);
  Reply done = Publish(acme, cell);
  ASSERT_EQ(done.status, 200) << done.body.dump();
  auto verdict = VerifyReceipt(done.body["receipt"].get<std::string>(), svc_->keys().PublicKeys(),
                               {own.key, CellDigest(cell), cell.size(), own.family});
  ASSERT_TRUE(verdict.ok()) << verdict.token;
  EXPECT_EQ(verdict.claims.tier, "org");
  EXPECT_EQ(verdict.claims.org, "acme");
  for (const char* family : {"beta/micro-mlp", "root/micro-mlp", "acme/not-granted"}) {
    Reply r = Publish(acme, MakeCell(MakeMetadata(Graph(41), family)));
    EXPECT_EQ(r.status, 403) << family;
    EXPECT_EQ(r.body["error"], "family_forbidden") << family;
  }
  EXPECT_EQ(svc_->Revoke(acme, "{}").body["error"], "forbidden");
  EXPECT_EQ(svc_->RevokeToken(acme, "{}").body["error"], "forbidden");
  EXPECT_EQ(svc_->RotateKey(acme).body["error"], "forbidden");
  EXPECT_EQ(svc_->CreateRelease(acme, "{}").body["error"], "forbidden");

  // Events: each org's rows carry its org; each token reads its own org's.
  ASSERT_EQ(svc_->PostEvents(acme, R"([{"kind":"boot_adopt","phase":"hit"}])").status, 200);
  ASSERT_EQ(
      svc_->PostEvents(As("beta-fleet-token"), R"([{"kind":"boot_adopt","detail":"beta-only"}])")
          .status,
      200);
  Reply mine = svc_->QueryEvents(acme, {});
  ASSERT_EQ(mine.body["events"].size(), 1u) << mine.body.dump();
  EXPECT_EQ(mine.body["events"][0]["org"], "acme");
  EXPECT_EQ(svc_->QueryEvents(acme, {{"org", "beta"}}).body["error"], "scope_forbidden");
  EXPECT_EQ(svc_->QueryEvents(As("admin-token"), {}).body["events"].size(), 2u);
  EXPECT_EQ(svc_->QueryEvents(As("admin-token"), {{"org", "beta"}}).body["events"].size(), 1u);
  // An unscoped worker reads no tenant's rows.
  EXPECT_TRUE(svc_->QueryEvents(As("worker-token"), {}).body["events"].empty());

  // Obligations: a release declared for beta is beta's; acme holds "*" and still cannot touch it.
  const auto release = [&](const std::string& name, const std::string& org) {
    return svc_
        ->CreateRelease(
            As("admin-token"),
            nlohmann::json{
                {"name", name}, {"org", org}, {"targets", {{{"target", "denoiser"}, {"sm", "x"}}}}}
                .dump())
        .status;
  };
  ASSERT_EQ(release("r-beta", "beta"), 200);
  ASSERT_EQ(release("r-acme", "acme"), 200);
  const std::string settle_beta = R"({"release":"r-beta","target":"denoiser","sm":"x",)"
                                  R"("token":"no_export_declaration"})";
  EXPECT_EQ(svc_->ReleaseObligations(acme, "r-beta").body["error"], "scope_forbidden");
  EXPECT_EQ(svc_->SettleObligation(acme, settle_beta).body["error"], "scope_forbidden");
  Reply settled = svc_->SettleObligation(
      acme, R"({"release":"r-acme","target":"denoiser","sm":"x","token":"no_export_declaration"})");
  ASSERT_EQ(settled.status, 200) << settled.body.dump();
  EXPECT_EQ(settled.body["obligation"]["org"], "acme");
  EXPECT_EQ(svc_->SettleObligation(As("beta-fleet-token"), settle_beta).status, 200);

  // The dashboard shows a token its own org's rows only.
  const std::string page = svc_->Dashboard(acme).html;
  EXPECT_NE(page.find("r-acme"), std::string::npos);
  EXPECT_EQ(page.find("r-beta"), std::string::npos);
  EXPECT_EQ(page.find("beta-only"), std::string::npos);
  EXPECT_NE(svc_->Dashboard(As("admin-token")).html.find("beta-only"), std::string::npos);
}

// A tenant's publish discharges the obligations of its own org's releases only, even when two
// orgs' releases owe the same key and its token holds every release name; a release belongs to
// one org.
TEST_F(ServiceTest, AnOrgPublishDischargesOnlyItsOwnOrgsObligations) {
  const CellMetadata m = MakeMetadata(Graph(42), "acme/micro-mlp");
  const auto declare = [&](const std::string& name, const std::string& org) {
    return svc_->CreateRelease(
        As("admin-token"),
        nlohmann::json{{"name", name},
                       {"org", org},
                       {"targets", {{{"target", "denoiser"}, {"sm", "x"}, {"key", m.key}}}}}
            .dump());
  };
  ASSERT_EQ(declare("owed-acme", "acme").status, 200);
  ASSERT_EQ(declare("owed-beta", "beta").status, 200);
  Reply conflict = declare("owed-beta", "acme");
  EXPECT_EQ(conflict.status, 409);
  EXPECT_EQ(conflict.body["error"], "release_org_mismatch");
  Reply done = Publish(As("acme-fleet-token"), MakeCell(m));
  ASSERT_EQ(done.status, 200) << done.body.dump();
  EXPECT_EQ(done.body["discharged"], 1);
  const auto state = [&](const char* token, const char* release) {
    return svc_->ReleaseObligations(As(token), release).body["obligations"][0]["state"];
  };
  EXPECT_EQ(state("acme-fleet-token", "owed-acme"), "discharged");
  EXPECT_EQ(state("beta-fleet-token", "owed-beta"), "owed");
}

TEST_F(ServiceTest, TenantMayNotWritePlatformOrOtherOrgFamilies) {
  // At intent time.
  const CellMetadata root = MakeMetadata(Graph(6), "root/micro-mlp");
  Reply r = Publish(As("acme-token"), MakeCell(root));
  EXPECT_EQ(r.status, 403);
  EXPECT_EQ(r.body["error"], "family_forbidden");
  const CellMetadata other = MakeMetadata(Graph(7), "globex/model");
  EXPECT_EQ(Publish(As("acme-token"), MakeCell(other)).body["error"], "family_forbidden");
  // Its own org: allowed.
  const CellMetadata own = MakeMetadata(Graph(8), "acme/model");
  Reply ok = Publish(As("acme-token"), MakeCell(own));
  EXPECT_EQ(ok.status, 200) << ok.body.dump();
  // At complete time: an intent that names the tenant's family for a cell whose metadata says
  // root/ is refused by the metadata's own family.
  const CellMetadata sneaky = MakeMetadata(Graph(9), "root/micro-mlp");
  const std::string cell = MakeCell(sneaky);
  ASSERT_EQ(Intent(As("acme-token"), sneaky.key, CellDigest(cell), cell.size(), "acme/x").status,
            200);
  ASSERT_EQ(Upload(As("acme-token"), CellDigest(cell), cell).status, 200);
  Reply c = Complete(As("acme-token"), sneaky.key, CellDigest(cell));
  EXPECT_EQ(c.status, 422);
  EXPECT_EQ(c.body["error"], "family_mismatch");
}

TEST_F(ServiceTest, RevokedCellIsGoneWithItsOwnToken) {
  const CellMetadata m = MakeMetadata(Graph(10));
  const std::string cell = MakeCell(m);
  ASSERT_EQ(Publish(As("platform-token"), cell).status, 200);
  Reply rv = svc_->Revoke(
      As("admin-token"),
      nlohmann::json{{"key", m.key}, {"digest", CellDigest(cell)}, {"reason", "cell_fault"}}
          .dump());
  ASSERT_EQ(rv.status, 200) << rv.body.dump();
  Reply r = Resolve("worker-token", m.key);
  EXPECT_EQ(r.status, 410);
  EXPECT_EQ(r.body["error"], "revoked");
  EXPECT_EQ(svc_->GetReceipt(As("worker-token"), m.key, CellDigest(cell)).status, 410);
  Reply list = svc_->Revocations();
  ASSERT_EQ(list.body["revocations"].size(), 1u);
  EXPECT_EQ(list.body["revocations"][0]["reason"], "cell_fault");
  // The list adopters believe is the signed one, issued now with the hub's max age.
  auto signed_list = VerifyRevocationList(list.body["list"].get<std::string>(),
                                          svc_->keys().PublicKeys(), 1700000000);
  ASSERT_TRUE(signed_list.ok()) << signed_list.status().ToString();
  ASSERT_EQ(signed_list->entries.size(), 1u);
  EXPECT_EQ(signed_list->entries[0].digest, CellDigest(cell));
  EXPECT_EQ(signed_list->iat, 1700000000);
  EXPECT_EQ(signed_list->max_age_s, 300);
  // The revoked bytes never come back; revoking freed the key for other bytes in its scope.
  EXPECT_EQ(Publish(As("platform-token"), cell).body["error"], "revoked");
  Reply fresh = Publish(As("platform-token"), MakeCell(m, "other"));
  ASSERT_EQ(fresh.status, 200) << fresh.body.dump();
  Reply now = Resolve("worker-token", m.key);
  ASSERT_EQ(now.status, 200) << now.body.dump();
  EXPECT_EQ(now.body["digest"], CellDigest(MakeCell(m, "other")));
}

TEST_F(ServiceTest, ReleaseObligationsAreDischargedByStoredCellsAndSettledByRefusals) {
  // Obligations move only for tokens granted the release: w2 holds none.
  Reply denied = svc_->SettleObligation(
      As("other-worker-token"),
      nlohmann::json{{"release", "r1"}, {"target", "decoder"}, {"sm", "x86-64-v4"}, {"token", "x"}}
          .dump());
  EXPECT_EQ(denied.status, 403);
  EXPECT_EQ(denied.body["error"], "release_forbidden");
  const CellMetadata declared = MakeMetadata(Graph(11));
  Reply rel = svc_->CreateRelease(
      As("admin-token"),
      nlohmann::json{{"name", "r1"},
                     {"targets",
                      {{{"target", "denoiser"}, {"sm", "x86-64-v3"}},
                       {{"target", "decoder"}, {"sm", {"x86-64-v3", "x86-64-v4"}}},
                       {{"target", "vae"}, {"sm", "x86-64-v3"}, {"key", declared.key}}}}}
          .dump());
  ASSERT_EQ(rel.status, 200) << rel.body.dump();
  EXPECT_EQ(rel.body["created"], 4);
  // A cell published for (r1, denoiser) discharges that slot; the declared key discharges vae.
  ASSERT_EQ(Publish(As("platform-token"), MakeCell(MakeMetadata(Graph(12))), "r1").status, 200);
  ASSERT_EQ(Publish(As("platform-token"), MakeCell(declared)).status, 200);
  Reply settle =
      svc_->SettleObligation(As("worker-token"), nlohmann::json{{"release", "r1"},
                                                                {"target", "decoder"},
                                                                {"sm", "x86-64-v4"},
                                                                {"token", "no_export_declaration"}}
                                                     .dump());
  EXPECT_EQ(settle.status, 200) << settle.body.dump();
  Reply late = svc_->SettleObligation(
      As("worker-token"),
      nlohmann::json{{"release", "r1"}, {"target", "denoiser"}, {"sm", "x86-64-v3"}, {"token", "x"}}
          .dump());
  EXPECT_EQ(late.status, 409);
  EXPECT_EQ(late.body["error"], "already_terminal");
  Reply list = svc_->ReleaseObligations(As("worker-token"), "r1");
  std::map<std::string, std::string> state;
  for (const auto& o : list.body["obligations"]) {
    state[o["target"].get<std::string>() + "/" + o["sm"].get<std::string>()] = o["state"];
  }
  EXPECT_EQ(state["denoiser/x86-64-v3"], "discharged");
  EXPECT_EQ(state["vae/x86-64-v3"], "discharged");
  EXPECT_EQ(state["decoder/x86-64-v3"], "owed");
  EXPECT_EQ(state["decoder/x86-64-v4"], "settled:no_export_declaration");
}

// A release declared after its cell was stored, for a target slot (no key), is discharged when a
// publisher offers that cell for the slot and the hub answers `already`; only the slot of the
// stored cell's own sm is, whatever else the release owes.
TEST_F(ServiceTest, APublishAnsweredAlreadyDischargesTheReleasesSlot) {
  const CellMetadata m = MakeMetadata(Graph(21));  // sm x86-64-v3
  const std::string cell = MakeCell(m);
  ASSERT_EQ(Publish(As("platform-token"), cell).status, 200);
  Reply rel = svc_->CreateRelease(
      As("admin-token"),
      nlohmann::json{{"name", "r2"},
                     {"targets",
                      {{{"target", "denoiser"}, {"sm", {"x86-64-v3", "x86-64-v4"}}},
                       {{"target", "vae"}, {"sm", "x86-64-v3"}}}}}
          .dump());
  ASSERT_EQ(rel.status, 200) << rel.body.dump();
  auto states = [&] {
    std::map<std::string, std::string> state;
    const Reply list = svc_->ReleaseObligations(As("admin-token"), "r2");
    for (const auto& o : list.body["obligations"]) {
      state[o["target"].get<std::string>() + "/" + o["sm"].get<std::string>()] = o["state"];
    }
    return state;
  };
  EXPECT_EQ(states()["denoiser/x86-64-v3"], "owed");
  // The publish helper names target "denoiser" with a release.
  Reply again = Publish(As("platform-token"), cell, "r2");
  ASSERT_EQ(again.status, 200) << again.body.dump();
  EXPECT_TRUE(again.body.value("already", false)) << again.body.dump();
  auto state = states();
  EXPECT_EQ(state["denoiser/x86-64-v3"], "discharged");
  EXPECT_EQ(state["denoiser/x86-64-v4"], "owed");  // another sm: another cell
  EXPECT_EQ(state["vae/x86-64-v3"], "owed");       // another slot
}

// A release may give a deadline, for all its targets or per target; an owed obligation past it
// says overdue (in its JSON and on the dashboard), a discharged one never does; a malformed
// deadline is refused by name.
TEST_F(ServiceTest, ObligationsPastTheirDeadlineAreOverdueUntilDischarged) {
  const int64_t now = 1700000000;  // the fixture's clock
  Reply bad = svc_->CreateRelease(
      As("admin-token"),
      nlohmann::json{{"name", "r3"},
                     {"deadline", "tomorrow"},
                     {"targets", {{{"target", "denoiser"}, {"sm", "x86-64-v3"}}}}}
          .dump());
  EXPECT_EQ(bad.status, 400);
  EXPECT_NE(bad.body["message"].get<std::string>().find("'deadline'"), std::string::npos)
      << bad.body.dump();
  Reply negative = svc_->CreateRelease(
      As("admin-token"),
      nlohmann::json{{"name", "r3"},
                     {"targets", {{{"target", "denoiser"}, {"sm", "x86-64-v3"}, {"deadline", -5}}}}}
          .dump());
  EXPECT_EQ(negative.status, 400);
  Reply rel = svc_->CreateRelease(
      As("admin-token"),
      nlohmann::json{{"name", "r3"},
                     {"deadline", now + 3600},  // the release's: an hour from now
                     {"targets",
                      {{{"target", "denoiser"}, {"sm", "x86-64-v3"}, {"deadline", now - 60}},
                       {{"target", "decoder"}, {"sm", "x86-64-v3"}, {"deadline", now - 60}},
                       {{"target", "vae"}, {"sm", "x86-64-v3"}}}}}
          .dump());
  ASSERT_EQ(rel.status, 200) << rel.body.dump();
  // The denoiser slot is served: discharged, so never overdue.
  ASSERT_EQ(Publish(As("platform-token"), MakeCell(MakeMetadata(Graph(31))), "r3").status, 200);
  const Reply list = svc_->ReleaseObligations(As("admin-token"), "r3");
  std::map<std::string, nlohmann::json> by_target;
  for (const auto& o : list.body["obligations"]) by_target[o["target"].get<std::string>()] = o;
  EXPECT_EQ(by_target["denoiser"]["state"], "discharged");
  EXPECT_EQ(by_target["denoiser"]["overdue"], false);
  EXPECT_EQ(by_target["decoder"]["overdue"], true) << by_target["decoder"].dump();
  EXPECT_EQ(by_target["decoder"]["deadline"], now - 60);
  EXPECT_EQ(by_target["vae"]["overdue"], false);
  EXPECT_EQ(by_target["vae"]["deadline"], now + 3600);
  const std::string html = svc_->Dashboard(As("admin-token")).html;
  EXPECT_NE(html.find("<p id=\"obligations-overdue\">overdue: 1</p>"), std::string::npos) << html;
  EXPECT_NE(html.find("<tr class=\"obligation overdue\"><td>r3</td><td>decoder</td>"),
            std::string::npos)
      << html;
}

TEST_F(ServiceTest, EventsAreStoredFilteredAndShownEscapedOnTheDashboard) {
  const CellMetadata m = MakeMetadata(Graph(13));
  ASSERT_EQ(Publish(As("platform-token"), MakeCell(m)).status, 200);
  nlohmann::json rows = nlohmann::json::array();
  rows.push_back({{"seq", 1},
                  {"kind", "boot_adopt"},
                  {"phase", "hit"},
                  {"key", m.key},
                  {"duration_ms", 4.5},
                  {"detail", "<script>alert(1)</script>"},
                  {"ts", 1000}});
  rows.push_back({{"seq", 2},
                  {"kind", "serve_degrade"},
                  {"phase", "cell_fault"},
                  {"key", m.key},
                  {"duration_ms", 0},
                  {"detail", "fn=f"},
                  {"ts", 2000}});
  Reply post = svc_->PostEvents(As("worker-token"), rows.dump());
  ASSERT_EQ(post.status, 200) << post.body.dump();
  Reply q = svc_->QueryEvents(As("worker-token"), {{"kind", "boot_adopt"}});
  ASSERT_EQ(q.body["events"].size(), 1u);
  EXPECT_EQ(q.body["events"][0]["worker"], "w1");
  EXPECT_EQ(svc_->QueryEvents(As("worker-token"), {{"since", "1500"}}).body["events"].size(), 1u);
  EXPECT_EQ(svc_->QueryEvents(As("worker-token"), {{"limit", "x"}}).status, 400);
  EXPECT_EQ(svc_->PostEvents(As("worker-token"), "[{\"phase\":\"x\"}]").status, 400);
  // A worker token speaks for its own name (and its processes) only.
  nlohmann::json instance = {{{"kind", "boot_adopt"}, {"phase", "miss"}, {"instance", "p@h/1"}}};
  ASSERT_EQ(svc_->PostEvents(As("worker-token"), instance.dump()).status, 200);
  EXPECT_EQ(svc_->QueryEvents(As("worker-token"), {{"worker", "w1/p@h/1"}}).body["events"].size(),
            1u);
  nlohmann::json forged = {{{"kind", "boot_adopt"}, {"phase", "hit"}, {"worker", "w2"}}};
  Reply refused = svc_->PostEvents(As("worker-token"), forged.dump());
  EXPECT_EQ(refused.status, 403);
  EXPECT_EQ(refused.body["error"], "worker_mismatch");
  EXPECT_TRUE(svc_->QueryEvents(As("worker-token"), {{"worker", "w2"}}).body["events"].empty());

  Reply page = svc_->Dashboard(As("admin-token"));
  EXPECT_NE(page.html.find(m.key), std::string::npos);
  EXPECT_NE(page.html.find("&lt;script&gt;"), std::string::npos);
  EXPECT_EQ(page.html.find("<script>"), std::string::npos);
  EXPECT_NE(page.html.find("<td>1</td><td>live</td>"), std::string::npos) << "adopted count 1";
}

// A row's target, ref, fn and stages are posted, stored and served as fields; a malformed
// `stages` is refused by name and stores nothing.
TEST_F(ServiceTest, EventFieldsArePostedAndServedAsFields) {
  nlohmann::json rows = {
      {{"seq", 1},
       {"kind", "boot_adopt"},
       {"phase", "hit"},
       {"key", "K"},
       {"ref", "K@sha256:d"},
       {"target", "mlp"},
       {"fn", "mlp-fn"},
       {"duration_ms", 4},
       {"stages", {{{"stage", "key"}, {"ms", 1.5}}, {{"stage", "open"}, {"ms", 2.5}}}},
       {"detail", "prose"}}};
  ASSERT_EQ(svc_->PostEvents(As("worker-token"), rows.dump()).status, 200);
  Reply q = svc_->QueryEvents(As("worker-token"), {{"kind", "boot_adopt"}});
  ASSERT_EQ(q.body["events"].size(), 1u);
  const auto& e = q.body["events"][0];
  EXPECT_EQ(e["target"], "mlp");
  EXPECT_EQ(e["ref"], "K@sha256:d");
  EXPECT_EQ(e["fn"], "mlp-fn");
  ASSERT_EQ(e["stages"].size(), 2u);
  EXPECT_EQ(e["stages"][1]["stage"], "open");
  EXPECT_EQ(e["stages"][1]["ms"], 2.5);
  for (const nlohmann::json& bad :
       {nlohmann::json("key:1"), nlohmann::json::array({{{"stage", "key"}}}),
        nlohmann::json::array({{{"stage", ""}, {"ms", 1}}}),
        nlohmann::json::array({{{"stage", "key"}, {"ms", "1"}}})}) {
    nlohmann::json row = {{{"kind", "boot_adopt"}, {"phase", "miss"}, {"stages", bad}}};
    Reply r = svc_->PostEvents(As("worker-token"), row.dump());
    EXPECT_EQ(r.status, 400) << bad.dump();
    EXPECT_NE(r.body.dump().find("stages"), std::string::npos) << r.body.dump();
  }
  EXPECT_EQ(svc_->QueryEvents(As("worker-token"), {{"phase", "miss"}}).body["events"].size(), 0u);
}

TEST_F(ServiceTest, RotationKeepsOldReceiptsVerifiableThroughTheJwks) {
  const CellMetadata m = MakeMetadata(Graph(14));
  const std::string cell = MakeCell(m);
  Reply done = Publish(As("platform-token"), cell);
  ASSERT_EQ(done.status, 200);
  Reply rot = svc_->RotateKey(As("admin-token"));
  ASSERT_EQ(rot.status, 200);
  auto jwks = PublicKeySet::FromJwks(svc_->Jwks().body).value();
  EXPECT_EQ(jwks.size(), 2u);
  EXPECT_TRUE(VerifyReceipt(done.body["receipt"].get<std::string>(), jwks,
                            ExpectedClaims{m.key, CellDigest(cell), cell.size(), m.family})
                  .ok());
}

// Scopes never touch (law 17): a tenant that publishes a platform model's key first, in its own
// family, neither blocks the platform's publish nor answers the platform's resolve.
TEST_F(ServiceTest, ATenantCellForAPlatformKeyNeitherBlocksNorShadowsIt) {
  const CellMetadata platform = MakeMetadata(Graph(20), "root/micro-mlp");
  CellMetadata squat = platform;
  squat.family = "acme/micro-mlp";  // same key: the family is not a key axis
  ASSERT_EQ(squat.key, platform.key);
  const std::string tenant_cell = MakeCell(squat, "payload");
  ASSERT_EQ(Publish(As("acme-token"), tenant_cell).status, 200);
  EXPECT_EQ(Resolve("worker-token", platform.key).body["found"], false);
  Reply mine = Publish(As("platform-token"), MakeCell(platform));
  ASSERT_EQ(mine.status, 200) << mine.body.dump();
  Reply hit = Resolve("worker-token", platform.key);
  EXPECT_EQ(hit.body["digest"], CellDigest(MakeCell(platform)));
  EXPECT_EQ(hit.body["family"], "root/micro-mlp");
  EXPECT_EQ(Resolve("worker-token", platform.key, "acme/micro-mlp").body["digest"],
            CellDigest(tenant_cell));
  // An acme-scoped worker reads acme's and the platform's families, not another org's.
  EXPECT_EQ(Resolve("acme-worker-token", platform.key).status, 200);
  EXPECT_EQ(Resolve("acme-worker-token", platform.key, "globex/m").body["error"],
            "scope_forbidden");
}

// Intents are per publisher: a tenant's intent with a bogus size for the platform cell's
// (deterministic) digest, or re-declaring the platform's (key, digest) with its own family and
// release, changes nothing about the platform's publish.
TEST_F(ServiceTest, AnotherPublishersIntentNeverDisturbsAPublish) {
  const CellMetadata m = MakeMetadata(Graph(21));
  const std::string cell = MakeCell(m);
  const std::string digest = CellDigest(cell);
  ASSERT_EQ(Intent(As("acme-token"), m.key, digest, 17, "acme/micro-mlp").status, 200);
  ASSERT_EQ(Intent(As("platform-token"), m.key, digest, cell.size(), m.family, "r1").status, 200);
  ASSERT_EQ(Intent(As("acme-token"), m.key, digest, 5, "acme/other", "r9").status, 200);
  // The tenant cannot upload against the platform's intent, nor its own lie.
  EXPECT_EQ(Upload(As("acme-token"), digest, cell).body["error"], "size_mismatch");
  Reply up = Upload(As("platform-token"), digest, cell);
  ASSERT_EQ(up.status, 200) << up.body.dump();
  Reply done = Complete(As("platform-token"), m.key, digest);
  ASSERT_EQ(done.status, 200) << done.body.dump();
  auto v = VerifyReceipt(done.body["receipt"].get<std::string>(), svc_->keys().PublicKeys(),
                         ExpectedClaims{m.key, digest, cell.size(), m.family});
  ASSERT_TRUE(v.ok()) << v.message;
  EXPECT_EQ(v.claims.release, "r1") << "the platform's own intent, not the tenant's overwrite";
  // The tenant's intent completes as the tenant's: its size lie is its own size_mismatch.
  Reply t = Complete(As("acme-token"), m.key, digest);
  EXPECT_EQ(t.status, 422);
  EXPECT_EQ(t.body["error"], "size_mismatch");
}

// At complete the hub runs the admission a worker runs, with the worker's tokens: a cell that
// records a failed fence, an empty shared object, an oversized one, one with no source.
TEST_F(ServiceTest, PublishRefusesWhatEveryWorkerWouldRefuseWithTheWorkersTokens) {
  CellMetadata fence = MakeMetadata(Graph(22));
  fence.fence.perturbed_checkpoint_matched = false;
  Reply r = Publish(As("platform-token"), MakeCell(fence));
  EXPECT_EQ(r.status, 422);
  EXPECT_EQ(r.body["error"], "fence_unproven") << r.body.dump();
  const CellMetadata m = MakeMetadata(Graph(23));
  Reply empty =
      Publish(As("platform-token"), Edited(m, [](CellFiles& f) { f.shared_object = ""; }));
  EXPECT_EQ(empty.body["error"], "shared_object_invalid") << empty.body.dump();
  Reply script =
      Publish(As("platform-token"), Edited(m, [](CellFiles& f) { f.shared_object = "#!/bin/sh"; }));
  EXPECT_EQ(script.body["error"], "shared_object_invalid") << script.body.dump();
  Reply nosrc = Publish(As("platform-token"), Edited(m, [](CellFiles& f) { f.source = ""; }));
  EXPECT_EQ(nosrc.body["error"], "source_missing") << nosrc.body.dump();
  EXPECT_FALSE(svc_->store().GetCell(m.key, m.family).value().has_value());
  EXPECT_FALSE(svc_->store().GetCell(fence.key, fence.family).value().has_value());
}

// With a builder, nothing is signed that it did not rebuild byte for byte; what it rebuilt is
// attested in the receipt.
TEST_F(ServiceTest, TheBuildersVerdictDecidesAndIsAttested) {
  auto builder = std::make_shared<ScriptedBuilder>();
  Make(builder);
  const CellMetadata m = MakeMetadata(Graph(24));
  builder->refusal = Status::Refused(StatusCode::kInvalidArgument, "rebuild_mismatch",
                                     "the published cell.so is not what its source builds to");
  Reply r = Publish(As("platform-token"), MakeCell(m));
  EXPECT_EQ(r.status, 422);
  EXPECT_EQ(r.body["error"], "rebuild_mismatch");
  EXPECT_FALSE(svc_->store().GetCell(m.key, m.family).value().has_value());
  builder->refusal = Status::Refused(StatusCode::kIOError, "builder_unavailable", "no fork");
  EXPECT_EQ(Publish(As("platform-token"), MakeCell(m)).status, 503);
  builder->refusal = Status::OK();
  Reply ok = Publish(As("platform-token"), MakeCell(m));
  ASSERT_EQ(ok.status, 200) << ok.body.dump();
  EXPECT_EQ(ok.body["builder"], "builder-test");
  auto v = VerifyReceipt(ok.body["receipt"].get<std::string>(), svc_->keys().PublicKeys(), {});
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v.claims.builder, "builder-test");
  const CellFiles files = UnpackCell(MakeCell(m), "t").value();
  EXPECT_EQ(v.claims.source_digest, MemberDigest(files.source));
  EXPECT_EQ(v.claims.so_digest, MemberDigest(files.shared_object));
  EXPECT_EQ(builder->calls, 3);
}

// Completes of the same bytes that arrive while one rebuilds wait for that rebuild's verdict: the
// builder compiles them once (a worker retrying after its own timeout, or the same cell published
// into two families at once). The builder hears who asks, a tenant counted by its org.
TEST_F(ServiceTest, ConcurrentCompletesOfOneCellRebuildItOnce) {
  auto builder = std::make_shared<ScriptedBuilder>();
  builder->delay_ms = 300;
  Make(builder);
  const CellMetadata root = MakeMetadata(Graph(31), "root/twice");
  const std::string cell = MakeCell(root);
  const std::string digest = CellDigest(cell);
  ASSERT_TRUE(Intent(As("platform-token"), root.key, digest, cell.size(), root.family).ok());
  ASSERT_TRUE(Upload(As("platform-token"), digest, cell).ok());
  std::vector<Reply> replies(4);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < replies.size(); ++i) {
    threads.emplace_back([&, i] { replies[i] = Complete(As("platform-token"), root.key, digest); });
  }
  for (auto& t : threads) t.join();
  for (const Reply& r : replies) EXPECT_EQ(r.status, 200) << r.body.dump();
  EXPECT_EQ(builder->calls, 1);
  EXPECT_TRUE(builder->last_requester.platform);
  // A tenant is counted by its org.
  const CellMetadata acme = MakeMetadata(Graph(32), "acme/one");
  ASSERT_EQ(Publish(As("acme-token"), MakeCell(acme)).status, 200);
  EXPECT_FALSE(builder->last_requester.platform);
  EXPECT_EQ(builder->last_requester.share, "org:acme");
  EXPECT_EQ(builder->last_requester.publisher, "acme-ci");
}

// A blob is readable only by tokens whose scope may adopt a cell of it, or by the publisher
// that declared it.
TEST_F(ServiceTest, BlobsAreReadableOnlyInScope) {
  const CellMetadata m = MakeMetadata(Graph(25), "acme/secret");
  const std::string cell = MakeCell(m);
  const std::string digest = CellDigest(cell);
  ASSERT_EQ(Publish(As("acme-token"), cell).status, 200);
  auto readable = [&](const std::string& token) {
    return std::holds_alternative<std::unique_ptr<BlobReader>>(svc_->OpenBlob(As(token), digest));
  };
  EXPECT_TRUE(readable("acme-token"));
  EXPECT_TRUE(readable("acme-worker-token"));
  EXPECT_TRUE(readable("worker-token")) << "an unscoped (platform) worker serves every family";
  EXPECT_TRUE(readable("admin-token"));
  // Another org's publisher: as if the blob did not exist.
  std::vector<TokenRow> tokens = Tokens();
  tokens.push_back({Sha256Hex("globex-token"), "globex-ci", "publisher", "org", "globex", {}});
  ASSERT_TRUE(svc_->InstallTokens(tokens).ok());
  auto other = svc_->OpenBlob(As("globex-token"), digest);
  ASSERT_TRUE(std::holds_alternative<Reply>(other));
  EXPECT_EQ(std::get<Reply>(other).status, 404);
}

// The tokens file is the truth at every start; an admin revokes a token at once, and a revoked
// token stays dead at the next start even if the file still lists it.
TEST_F(ServiceTest, TokensAreTheFilesAndAdminRevocationIsImmediateAndSticky) {
  ASSERT_TRUE(std::holds_alternative<Principal>(svc_->Authenticate("Bearer acme-token")));
  Reply rv = svc_->RevokeToken(As("admin-token"), R"({"name":"acme-ci"})");
  ASSERT_EQ(rv.status, 200) << rv.body.dump();
  EXPECT_EQ(rv.body["revoked"], 1);
  auto gone = svc_->Authenticate("Bearer acme-token");
  ASSERT_TRUE(std::holds_alternative<Reply>(gone)) << "revoked at once, cache or not";
  EXPECT_EQ(std::get<Reply>(gone).status, 401);
  EXPECT_EQ(svc_->RevokeToken(As("worker-token"), R"({"name":"w2"})").status, 403);
  EXPECT_EQ(svc_->RevokeToken(As("admin-token"), R"({"name":"nobody"})").status, 404);
  EXPECT_EQ(svc_->RevokeToken(As("admin-token"), R"({})").status, 400);
  // A restart with the same file: the revoked token stays dead; one removed from it dies too.
  auto skipped = svc_->InstallTokens({
      {Sha256Hex("acme-token"), "acme-ci", "publisher", "org", "acme", {}},
      {Sha256Hex("admin-token"), "admin", "admin", "", "", {}},
  });
  ASSERT_TRUE(skipped.ok());
  EXPECT_EQ(*skipped, std::vector<std::string>{"acme-ci"});
  EXPECT_TRUE(std::holds_alternative<Reply>(svc_->Authenticate("Bearer acme-token")));
  EXPECT_TRUE(std::holds_alternative<Reply>(svc_->Authenticate("Bearer worker-token")))
      << "a token the file no longer lists is dead";
  EXPECT_TRUE(std::holds_alternative<Principal>(svc_->Authenticate("Bearer admin-token")));
}

// Unreferenced blobs and abandoned intents go after the grace period; a stored cell's blob stays.
TEST_F(ServiceTest, UnreferencedBlobsAreCollectedAfterTheGracePeriod) {
  int64_t clock = std::time(nullptr);
  Make(nullptr, [&clock] { return clock; });
  const CellMetadata kept = MakeMetadata(Graph(26));
  const std::string cell = MakeCell(kept);
  ASSERT_EQ(Publish(As("platform-token"), cell).status, 200);
  // An abandoned publish: intent and upload, never completed.
  const CellMetadata dropped = MakeMetadata(Graph(27));
  const std::string orphan = MakeCell(dropped);
  ASSERT_EQ(
      Intent(As("platform-token"), dropped.key, CellDigest(orphan), orphan.size(), dropped.family)
          .status,
      200);
  ASSERT_EQ(Upload(As("platform-token"), CellDigest(orphan), orphan).status, 200);
  auto early = svc_->CollectGarbage();
  ASSERT_TRUE(early.ok());
  EXPECT_EQ(early->blobs, 0) << "within the grace period nothing goes";
  clock += 120;
  auto late = svc_->CollectGarbage();
  ASSERT_TRUE(late.ok()) << late.status().ToString();
  EXPECT_EQ(late->intents, 2);
  EXPECT_EQ(late->blobs, 1);
  EXPECT_FALSE(svc_->blobs().Has(CellDigest(orphan)));
  EXPECT_TRUE(svc_->blobs().Has(CellDigest(cell)));
}

// An intent claims its (key, family) before any upload: while one publisher's claim is live,
// another's intent is refused publish_in_progress (with Retry-After, no intent, so no upload);
// the holder's own retries pass; once it completes, the others see its cell (already for the
// same bytes, key_taken for others). A claim that expires (a dead publisher) is taken over, and
// a publish refused for good frees the scope at once.
TEST_F(ServiceTest, APublishClaimsItsKeyBeforeAnyUpload) {
  int64_t clock = 1700000000;
  Make(nullptr, [&clock] { return clock; });
  std::vector<TokenRow> tokens = Tokens();
  tokens.push_back({Sha256Hex("platform-token-2"), "ci2", "publisher", "platform", "", {"*"}});
  ASSERT_TRUE(svc_->InstallTokens(tokens).ok());
  const Principal a = As("platform-token"), b = As("platform-token-2");
  const CellMetadata m = MakeMetadata(Graph(41));
  const std::string cell_a = MakeCell(m, "a"), cell_b = MakeCell(m, "b");
  const std::string da = CellDigest(cell_a), db = CellDigest(cell_b);

  ASSERT_EQ(Intent(a, m.key, da, cell_a.size(), m.family).status, 200);
  Reply busy = Intent(b, m.key, db, cell_b.size(), m.family);
  EXPECT_EQ(busy.status, 409);
  EXPECT_EQ(busy.body["error"], kRefusalPublishInProgress);
  EXPECT_GT(busy.retry_after_s, 0);
  EXPECT_FALSE(busy.body.contains("upload"));
  EXPECT_EQ(Upload(b, db, cell_b).body["error"], "no_intent") << "a refused intent records none";
  // The same bytes from b: still a's turn.
  EXPECT_EQ(Intent(b, m.key, da, cell_a.size(), m.family).body["error"], kRefusalPublishInProgress);
  // The holder's retry of its own intent passes.
  ASSERT_EQ(Intent(a, m.key, da, cell_a.size(), m.family).status, 200);
  ASSERT_EQ(Upload(a, da, cell_a).status, 200);
  ASSERT_EQ(Complete(a, m.key, da).status, 200);
  // Completed: the claim is gone and the cell answers.
  EXPECT_EQ(Intent(b, m.key, db, cell_b.size(), m.family).body["error"], "key_taken");
  Reply already = Intent(b, m.key, da, cell_a.size(), m.family);
  EXPECT_EQ(already.status, 200);
  EXPECT_EQ(already.body["already"], true);
  EXPECT_EQ(svc_->blobs().Has(db), false);

  // A publisher that went silent: its claim expires and another takes the scope over; the first
  // one's late upload is then refused, so the scope still gets one blob.
  const CellMetadata m2 = MakeMetadata(Graph(42));
  const std::string c2a = MakeCell(m2, "a"), c2b = MakeCell(m2, "b");
  ASSERT_EQ(Intent(a, m2.key, CellDigest(c2a), c2a.size(), m2.family).status, 200);
  clock += 299;
  EXPECT_EQ(Intent(b, m2.key, CellDigest(c2b), c2b.size(), m2.family).status, 409);
  clock += 1;
  ASSERT_EQ(Intent(b, m2.key, CellDigest(c2b), c2b.size(), m2.family).status, 200);
  Reply late = Upload(a, CellDigest(c2a), c2a);
  EXPECT_EQ(late.status, 409);
  EXPECT_EQ(late.body["error"], kRefusalPublishInProgress);
  EXPECT_FALSE(svc_->blobs().Has(CellDigest(c2a)));
  ASSERT_EQ(Upload(b, CellDigest(c2b), c2b).status, 200);
  ASSERT_EQ(Complete(b, m2.key, CellDigest(c2b)).status, 200);

  // A publish refused for good (its size was a lie) frees the scope at once.
  const CellMetadata m3 = MakeMetadata(Graph(43));
  const std::string c3 = MakeCell(m3);
  ASSERT_EQ(Intent(a, m3.key, CellDigest(c3), c3.size() + 1, m3.family).status, 200);
  EXPECT_EQ(Upload(a, CellDigest(c3), c3).status, 422);
  EXPECT_EQ(Complete(a, m3.key, CellDigest(c3)).status, 409) << "blob_missing keeps the claim";
  EXPECT_EQ(Intent(b, m3.key, CellDigest(c3), c3.size(), m3.family).status, 409);
  CellMetadata fence = MakeMetadata(Graph(44));
  fence.fence.perturbed_checkpoint_matched = false;
  const std::string c4 = MakeCell(fence);
  EXPECT_EQ(Publish(a, c4).status, 422);
  EXPECT_EQ(Intent(b, fence.key, CellDigest(c4), c4.size(), fence.family).status, 200)
      << "a terminal refusal at complete released the claim";
  // Expired claims are collected.
  clock += 1000;
  auto collected = svc_->CollectGarbage();
  ASSERT_TRUE(collected.ok());
  EXPECT_EQ(collected->claims, 2);
  ASSERT_EQ(Intent(b, m3.key, CellDigest(c3), c3.size(), m3.family).status, 200);
}

}  // namespace
}  // namespace kiln
