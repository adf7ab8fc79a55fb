// Tests of the hub's routes (src/kiln/hub/server.h HubService) against the in-memory stores:
// the publish flow, each refusal with its own token, revocation, releases and obligations,
// events and the dashboard. The same routes over real HTTP are in hub_api_test.cc.
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

class ServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/kiln_service_test";
    std::filesystem::remove_all(dir_);
    auto store = NewMemoryStore();
    ASSERT_TRUE(
        store->PutToken({Sha256Hex("platform-token"), "ci", "publisher", "platform", ""}).ok());
    ASSERT_TRUE(
        store->PutToken({Sha256Hex("acme-token"), "acme-ci", "publisher", "org", "acme"}).ok());
    ASSERT_TRUE(store->PutToken({Sha256Hex("worker-token"), "w1", "worker", "", ""}).ok());
    ASSERT_TRUE(store->PutToken({Sha256Hex("admin-token"), "admin", "admin", "", ""}).ok());
    svc_ = std::make_unique<HubService>(std::move(store), NewMemoryBlobStore(),
                                        SigningKeyRing::OpenOrCreate(dir_).value(),
                                        [] { return int64_t{1700000000}; });
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

  std::string dir_;
  std::unique_ptr<HubService> svc_;
};

TEST_F(ServiceTest, PublishThenResolveGivesAVerifiableReceipt) {
  const CellMetadata m = MakeMetadata(Graph(1));
  const std::string cell = MakeCell(m);
  Reply miss = svc_->ResolveCell(As("worker-token"), m.key);
  EXPECT_EQ(miss.status, 200);
  EXPECT_EQ(miss.body["found"], false);

  Reply done = Publish(As("platform-token"), cell);
  ASSERT_EQ(done.status, 200) << done.body.dump();
  Reply hit = svc_->ResolveCell(As("worker-token"), m.key);
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

  // Receipt route, and a second publish of the same bytes answers the same receipt.
  Reply rec = svc_->GetReceipt(As("worker-token"), m.key, CellDigest(cell));
  EXPECT_EQ(rec.body["receipt"], hit.body["receipt"]);
  Reply again = Publish(As("platform-token"), cell);
  EXPECT_EQ(again.status, 200);
  EXPECT_EQ(again.body["already"], true);
  EXPECT_EQ(again.body["receipt"], hit.body["receipt"]);
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
  Reply r = svc_->ResolveCell(As("worker-token"), "ck1-XYZ");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.body["error"], "bad_key");
  EXPECT_TRUE(r.body["message"].is_string());
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
  EXPECT_EQ(r.body["error"], "key_restatement_failed") << r.body.dump();
  EXPECT_FALSE(svc_->store().GetCell(m.key).value().has_value());
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
  Reply r = svc_->ResolveCell(As("worker-token"), m.key);
  EXPECT_EQ(r.status, 410);
  EXPECT_EQ(r.body["error"], "revoked");
  EXPECT_EQ(svc_->GetReceipt(As("worker-token"), m.key, CellDigest(cell)).status, 410);
  Reply list = svc_->Revocations();
  ASSERT_EQ(list.body["revocations"].size(), 1u);
  EXPECT_EQ(list.body["revocations"][0]["reason"], "cell_fault");
  // First-writer-wins survives revocation: the key is not reopened to other bytes.
  EXPECT_EQ(Publish(As("platform-token"), MakeCell(m, "other")).body["error"], "key_taken");
}

TEST_F(ServiceTest, ReleaseObligationsAreDischargedByStoredCellsAndSettledByRefusals) {
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

  Reply page = svc_->Dashboard();
  EXPECT_NE(page.html.find(m.key), std::string::npos);
  EXPECT_NE(page.html.find("&lt;script&gt;"), std::string::npos);
  EXPECT_EQ(page.html.find("<script>"), std::string::npos);
  EXPECT_NE(page.html.find("<td>1</td><td>live</td>"), std::string::npos) << "adopted count 1";
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

}  // namespace
}  // namespace kiln
