// Tests for boot-adopt (src/kiln/worker/boot.h) with real components: the mlp example is minted
// once, kept in a real LocalStore or published to a real `kiln hub` process on loopback
// (tests/hub/hub_process.h), and adopted through AdoptAtBoot into a real ServedTarget. Each
// test asserts the one boot_adopt row the call must emit.
#include "src/kiln/worker/boot.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "src/kiln/base/clock.h"
#include "src/kiln/base/file.h"
#include "src/kiln/base/sha256.h"
#include "src/kiln/cell/pack.h"
#include "src/kiln/cell/provenance.h"
#include "src/kiln/graph/onnx_import.h"
#include "src/kiln/mint/mint.h"
#include "src/kiln/worker/revocations.h"
#include "tests/hub/hub_process.h"

namespace kiln {
namespace {

using hub_testing::HubProcess;
using hub_testing::kPlatform;
using hub_testing::kWorker;

const std::string kExamples = std::string(KILN_SOURCE_DIR) + "/examples/";
const CellOrigin kMinted{CellOrigin::Kind::kMinted, ""};

Envelope MlpEnvelope() { return Envelope{{{{"x", {1, 64}}}, {{"x", {4, 64}}}}}; }

// The mlp example minted once for the whole binary (envelope {x=[1,64]}, {x=[4,64]}).
struct MintedMlp {
  std::shared_ptr<const Graph> graph;
  WeightMap weights;
  MintResult mint;
};

// Mints the mlp example for `family` (the family is in the metadata, not the key).
const MintedMlp* MintFor(const std::string& family) {
  auto m = std::make_unique<MintedMlp>();
  auto g = ImportOnnxFile(kExamples + "mlp/model.onnx");
  if (!g.ok()) return nullptr;
  m->graph = std::make_shared<const Graph>(std::move(g).value());
  auto w = LoadCheckpoint(*m->graph, kExamples + "mlp/checkpoint.safetensors", true);
  if (!w.ok()) return nullptr;
  m->weights = *w;
  MintRequest r;
  r.graph = m->graph;
  r.envelope = MlpEnvelope();
  r.family = family;
  r.weights = m->weights;
  auto mint = MintCell(r);
  if (!mint.ok()) {
    std::fprintf(stderr, "mint failed: %s\n", mint.status().ToString().c_str());
    return nullptr;
  }
  m->mint = std::move(mint).value();
  return m.release();
}

const MintedMlp* MintOnce() {
  static const MintedMlp* minted = []() -> const MintedMlp* {
    auto m = std::make_unique<MintedMlp>();
    auto g = ImportOnnxFile(kExamples + "mlp/model.onnx");
    if (!g.ok()) return nullptr;
    m->graph = std::make_shared<const Graph>(std::move(g).value());
    auto w = LoadCheckpoint(*m->graph, kExamples + "mlp/checkpoint.safetensors", true);
    if (!w.ok()) return nullptr;
    m->weights = *w;
    MintRequest r;
    r.graph = m->graph;
    r.envelope = MlpEnvelope();
    r.family = "root/mlp";
    r.weights = m->weights;
    auto mint = MintCell(r);
    if (!mint.ok()) {
      std::fprintf(stderr, "mint failed: %s\n", mint.status().ToString().c_str());
      return nullptr;
    }
    m->mint = std::move(mint).value();
    return m.release();
  }();
  return minted;
}

TensorMap Input(int64_t rows) {
  std::vector<float> v(static_cast<size_t>(rows * 64));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 17) / 17.0f - 0.5f;
  return TensorMap{{"x", Tensor::FromVector<float>({rows, 64}, v)}};
}

class Boot : public ::testing::Test {
 protected:
  void SetUp() override {
    m_ = MintOnce();
    ASSERT_NE(m_, nullptr) << "minting the mlp example failed";
    char tmpl[] = "/tmp/kiln-boot-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    store_ = std::make_unique<LocalStore>(root_ + "/store");
  }
  void TearDown() override {
    hub_.reset();
    std::error_code ec;
    if (!HasFailure()) std::filesystem::remove_all(root_, ec);
  }

  // A real `kiln hub` on loopback holding the minted cell (published by a platform publisher),
  // started with `extra` arguments (e.g. --rebuild off).
  void StartHubAndPublish(std::vector<std::string> extra = {}) {
    ASSERT_TRUE(MakeDirs(root_ + "/hub/data").ok());
    nlohmann::json tokens = {
        {"tokens",
         {{{"name", "ci"},
           {"role", "publisher"},
           {"tier", "platform"},
           {"sha256", Sha256Hex(kPlatform)}},
          {{"name", "worker-1"}, {"role", "worker"}, {"sha256", Sha256Hex(kWorker)}},
          {{"name", "ops"}, {"role", "admin"}, {"sha256", Sha256Hex(hub_testing::kAdmin)}}}}};
    ASSERT_TRUE(WriteSecretFileAtomic(root_ + "/hub/tokens.json", tokens.dump(2)).ok());
    hub_ = std::make_unique<HubProcess>(root_ + "/hub/data", "", extra);
    ASSERT_TRUE(hub_->Start());
    PublishAnswer p = hub_->Client(kPlatform)->Publish(m_->mint.tar, {});
    ASSERT_TRUE(p.ok()) << p.token << ": " << p.message;
    client_ = hub_->Client(kWorker);
    client_url_ = hub_->url();
  }

  // The context a worker boots with (worker_main.cc): with a hub, the signed revocation list is
  // checked through a RevocationWatch of its own, as in production, configured with the same
  // trust anchors. Each call is one worker process's first boot: a fresh watch, so a list is
  // fetched afresh.
  BootContext Ctx(const PublicKeySet* trust = nullptr) {
    BootContext ctx;
    ctx.store = store_.get();
    ctx.hub = client_.get();
    ctx.trust = const_cast<PublicKeySet*>(trust);
    if (client_ != nullptr) {
      RevocationWatchOptions o;
      o.hub.url = client_url_;
      o.hub.token = kWorker;
      o.hub.connect_timeout_s = 1;
      o.hub.io_timeout_s = 2;
      if (trust != nullptr) {
        o.anchors = *trust;
        o.use_anchors = true;
      }
      o.events = &events_;
      auto watch = RevocationWatch::Create(o);
      EXPECT_TRUE(watch.ok()) << watch.status().ToString();
      if (watch.ok()) watches_.push_back(std::move(watch).value());
      ctx.revocations = watches_.empty() ? nullptr : watches_.back().get();
    }
    ctx.events = &events_;
    ctx.private_dir = root_ + "/private";
    ctx.blob_cache_dir = root_ + "/blobs";
    ctx.threads = 1;
    ctx.worker = "w1";
    return ctx;
  }
  TargetSpec Spec(Envelope envelope = MlpEnvelope()) {
    TargetSpec spec;
    spec.name = "mlp";
    spec.graph = kExamples + "mlp/model.onnx";
    spec.export_spec = ExportSpec{"root/mlp"};
    spec.envelope = std::move(envelope);
    return spec;
  }
  std::unique_ptr<ServedTarget> Target() {
    ServedTargetOptions o;
    o.name = "mlp";
    o.events = &events_;
    auto t = ServedTarget::Create(o, m_->graph, m_->weights);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    return t.ok() ? std::move(t).value() : nullptr;
  }
  BootOutcome Adopt(ServedTarget& t, const TargetSpec& spec, const BootContext& ctx) {
    return AdoptAtBoot(t, spec, m_->graph, m_->weights, ctx);
  }
  std::vector<EventRow> BootRows() {
    EventQuery q;
    q.kind = event_kind::kBootAdopt;
    return events_.Query(q);
  }
  // Exactly one boot_adopt row since `since`, with the outcome's phase, key and a measured span.
  void ExpectOneRow(const BootOutcome& out, size_t before = 0) {
    auto rows = BootRows();
    ASSERT_EQ(rows.size(), before + 1);
    const EventRow& row = rows.back();
    EXPECT_EQ(row.phase, out.phase);
    EXPECT_EQ(row.target, "mlp");
    EXPECT_EQ(row.key, out.key);
    EXPECT_EQ(row.ref, out.ref);
    EXPECT_GE(row.duration_ms, 0);
    EXPECT_EQ(row.duration_ms, out.duration_ms);
    EXPECT_EQ(row.detail.rfind("key=" + out.key + " target=mlp", 0), 0u) << row.detail;
  }
  void ExpectServes(ServedTarget& t, const std::string& mode, const std::string& ref) {
    auto r = t.Serve(Input(1), "mlp");
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->serving_mode, mode);
    EXPECT_EQ(r->served_cell_ref, ref);
  }
  std::string BlobPath() const { return root_ + "/blobs/" + m_->mint.digest; }

  const MintedMlp* m_ = nullptr;
  std::string root_;
  std::unique_ptr<LocalStore> store_;
  std::unique_ptr<HubProcess> hub_;
  std::unique_ptr<HubClient> client_;
  std::string client_url_;  // the hub client_ asks
  std::vector<std::unique_ptr<RevocationWatch>> watches_;
  EventLog events_;
};

// The stage names of a stages_ms breakdown ("key:0.91,toolchain:0.00,...") in order, each with a
// non-negative time; their sum may not exceed the whole call.
std::vector<std::string> StageNames(const BootOutcome& out) {
  std::vector<std::string> names;
  double sum = 0;
  std::stringstream ss(out.stages_ms);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const size_t colon = item.find(':');
    EXPECT_NE(colon, std::string::npos) << item;
    if (colon == std::string::npos) continue;
    const double ms = std::stod(item.substr(colon + 1));
    EXPECT_GE(ms, 0.0) << item;
    sum += ms;
    names.push_back(item.substr(0, colon));
  }
  EXPECT_LE(sum, out.duration_ms + 0.1) << out.stages_ms;
  return names;
}

TEST_F(Boot, LocalStoreHitArmsWithoutAHub) {
  ASSERT_TRUE(store_->Put(m_->mint.key, m_->mint.tar, kMinted).ok());
  auto t = Target();
  ASSERT_NE(t, nullptr);
  BootOutcome out = Adopt(*t, Spec(), Ctx());  // no hub in the context
  EXPECT_EQ(out.phase, kBootLocalHit) << out.detail;
  EXPECT_EQ(out.key, m_->mint.key);
  EXPECT_EQ(out.ref, m_->mint.ref);
  ASSERT_NE(out.cell, nullptr);
  EXPECT_EQ(out.cell->lane(), Lane::kExported);
  EXPECT_FALSE(IsBootRefusal(out.phase));
  ExpectOneRow(out);
  ExpectServes(*t, kServingAotCell, m_->mint.ref);
  // Where the time went is on the row, stage by stage, with no hub stage on this route.
  EXPECT_EQ(StageNames(out), (std::vector<std::string>{"key", "toolchain", "local_store", "admit",
                                                       "revocations", "open", "bind", "install"}));
  EXPECT_NE(out.detail.find("origin=minted"), std::string::npos) << out.detail;
  EXPECT_NE(BootRows().back().detail.find("stages_ms=" + out.stages_ms), std::string::npos);
  // The same stages as data on the row, in the same order.
  const auto stages = BootRows().back().stages;
  ASSERT_EQ(stages.size(), StageNames(out).size());
  for (size_t i = 0; i < stages.size(); ++i) EXPECT_EQ(stages[i].first, StageNames(out)[i]);
  EXPECT_EQ(stages, out.stages);
}

TEST_F(Boot, HubHitArmsServesAotCellAndKeepsTheBytesLocally) {
  StartHubAndPublish();
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_FALSE(store_->Get(m_->mint.key)->has_value());
  auto t = Target();
  ASSERT_NE(t, nullptr);
  BootOutcome out = Adopt(*t, Spec(), Ctx());
  EXPECT_EQ(out.phase, kBootHit) << out.detail;
  EXPECT_EQ(out.ref, m_->mint.ref);
  ExpectOneRow(out);
  ExpectServes(*t, kServingAotCell, m_->mint.ref);
  // The local-store write runs beside the load and is waited for before the row is written.
  EXPECT_EQ(StageNames(out),
            (std::vector<std::string>{"key", "toolchain", "local_store", "resolve", "receipt",
                                      "revocations", "fetch", "admit", "provenance", "open", "bind",
                                      "install", "local_store_put_wait"}));
  EXPECT_NE(out.detail.find("local_store=stored"), std::string::npos) << out.detail;
  // The admitted bytes are in the local store and the blob cache, by digest.
  auto stored = store_->Get(m_->mint.key);
  ASSERT_TRUE(stored.ok());
  ASSERT_TRUE(stored->has_value());
  EXPECT_EQ((*stored)->digest, m_->mint.digest);
  EXPECT_EQ((*stored)->origin.kind, CellOrigin::Kind::kHub) << "kept with its receipt";
  EXPECT_EQ(ReadFile(BlobPath()).value(), m_->mint.tar);
  // The next boot finds it on this machine.
  auto t2 = Target();
  BootOutcome again = Adopt(*t2, Spec(), Ctx());
  EXPECT_EQ(again.phase, kBootLocalHit) << again.detail;
  EXPECT_NE(again.detail.find("origin=hub"), std::string::npos) << again.detail;
  ExpectOneRow(again, 1);
  ExpectServes(*t2, kServingAotCell, m_->mint.ref);
}

TEST_F(Boot, HubWithoutTheKeyIsAMiss) {
  StartHubAndPublish();
  ASSERT_FALSE(HasFatalFailure());
  auto t = Target();
  // Another envelope is another key: derived without compiling, unknown to the hub.
  BootOutcome out = Adopt(*t, Spec(Envelope{{{{"x", {2, 64}}}}}), Ctx());
  EXPECT_EQ(out.phase, kBootMiss) << out.detail;
  EXPECT_NE(out.key, m_->mint.key);
  EXPECT_TRUE(IsWellFormedKey(out.key));
  EXPECT_EQ(out.cell, nullptr);
  EXPECT_EQ(out.ref, "");
  ExpectOneRow(out);
  ExpectServes(*t, kServingEager, "");
}

TEST_F(Boot, LocalMissWithoutAHubIsNamed) {
  auto t = Target();
  BootOutcome out = Adopt(*t, Spec(), Ctx());
  EXPECT_EQ(out.phase, kBootLocalMissNoHub);
  EXPECT_EQ(out.key, m_->mint.key);
  EXPECT_EQ(out.cell, nullptr);
  ExpectOneRow(out);
  ExpectServes(*t, kServingEager, "");
}

TEST_F(Boot, HubDownIsAResolveRefusalNotAMiss) {
  HubClientOptions o;
  o.url = "http://127.0.0.1:" + std::to_string(hub_testing::FreePort());
  o.connect_timeout_s = 1;
  o.io_timeout_s = 2;
  client_ = HubClient::Create(o).value();
  client_url_ = o.url;
  auto t = Target();
  BootOutcome out = Adopt(*t, Spec(), Ctx());
  EXPECT_EQ(out.phase, kBootResolveRefused) << out.detail;
  EXPECT_NE(out.detail.find("token=hub_unreachable"), std::string::npos) << out.detail;
  EXPECT_TRUE(IsBootRefusal(out.phase));
  EXPECT_TRUE(out.retryable) << "the hub could not be asked: the adoption is retried";
  ExpectOneRow(out);
  ExpectServes(*t, kServingEager, "");
}

TEST_F(Boot, ReceiptFromAnUntrustedKeyIsRefusedBeforeAnythingIsFetched) {
  StartHubAndPublish();
  ASSERT_FALSE(HasFatalFailure());
  auto foreign = SigningKey::Generate();
  ASSERT_TRUE(foreign.ok());
  PublicKeySet trust;
  ASSERT_TRUE(trust.AddRaw(foreign->raw_public()).ok());
  BootContext ctx = Ctx(&trust);
  auto t = Target();
  BootOutcome out = Adopt(*t, Spec(), ctx);
  EXPECT_EQ(out.phase, kBootReceiptRefused) << out.detail;
  EXPECT_NE(out.detail.find("receipt_unknown_kid"), std::string::npos) << out.detail;
  EXPECT_EQ(out.cell, nullptr);
  ExpectOneRow(out);
  // Nothing fetched, stored or loaded (law 4).
  EXPECT_FALSE(std::filesystem::exists(BlobPath()));
  EXPECT_FALSE(store_->Get(m_->mint.key)->has_value());
  EXPECT_FALSE(std::filesystem::exists(root_ + "/private"));
  ExpectServes(*t, kServingEager, "");
}

TEST_F(Boot, HubKeySetTrustedWhenNoAnchorsAreConfigured) {
  StartHubAndPublish();
  ASSERT_FALSE(HasFatalFailure());
  PublicKeySet hub_keys;  // empty: fetched from the hub once, on the first unknown kid
  BootContext ctx = Ctx();
  ctx.hub_keys = &hub_keys;
  auto t = Target();
  BootOutcome out = Adopt(*t, Spec(), ctx);
  EXPECT_EQ(out.phase, kBootHit) << out.detail;
  EXPECT_GE(hub_keys.size(), 1u);
  ExpectOneRow(out);
}

TEST_F(Boot, CorruptCachedBlobIsDeletedAndFetchedAgain) {
  StartHubAndPublish();
  ASSERT_FALSE(HasFatalFailure());
  auto t = Target();
  ASSERT_EQ(Adopt(*t, Spec(), Ctx()).phase, kBootHit);
  // Another machine's view: an empty local store, a cached blob that no longer matches its name.
  LocalStore fresh(root_ + "/store2");
  std::string bad = m_->mint.tar;
  bad[bad.size() / 2] ^= 0x5a;
  ASSERT_TRUE(WriteFileAtomic(BlobPath(), bad).ok());
  BootContext ctx = Ctx();
  ctx.store = &fresh;
  auto t2 = Target();
  BootOutcome out = Adopt(*t2, Spec(), ctx);
  EXPECT_EQ(out.phase, kBootHit) << out.detail;  // re-verified, refetched: not refused
  EXPECT_NE(out.detail.find("cached_blob_refetched"), std::string::npos) << out.detail;
  EXPECT_EQ(ReadFile(BlobPath()).value(), m_->mint.tar);
  ExpectOneRow(out, 1);
  ExpectServes(*t2, kServingAotCell, m_->mint.ref);
  // A good cached blob is reused without a fetch.
  LocalStore third(root_ + "/store3");
  ctx.store = &third;
  auto t3 = Target();
  BootOutcome reused = Adopt(*t3, Spec(), ctx);
  EXPECT_EQ(reused.phase, kBootHit) << reused.detail;
  EXPECT_NE(reused.detail.find("cached_blob=reused"), std::string::npos) << reused.detail;
}

TEST_F(Boot, HubServingWrongBytesIsADigestMismatchAndNothingLoads) {
  StartHubAndPublish();
  ASSERT_FALSE(HasFatalFailure());
  // Corrupt the hub's own blob on disk (same size): the hub now serves bytes that are not the
  // digest it resolves to.
  const std::string hex = m_->mint.digest.substr(std::string("sha256:").size());
  const std::string hub_blob = root_ + "/hub/data/blobs/sha256/" + hex;
  ASSERT_TRUE(std::filesystem::exists(hub_blob)) << hub_blob;
  std::string bad = m_->mint.tar;
  bad[bad.size() / 2] ^= 0x5a;
  ASSERT_TRUE(WriteFileAtomic(hub_blob, bad).ok());
  auto t = Target();
  BootOutcome out = Adopt(*t, Spec(), Ctx());
  EXPECT_EQ(out.phase, kRefusalDigestMismatch) << out.detail;
  EXPECT_EQ(out.cell, nullptr);
  EXPECT_TRUE(IsBootRefusal(out.phase));
  ExpectOneRow(out);
  EXPECT_FALSE(std::filesystem::exists(BlobPath()));
  EXPECT_FALSE(store_->Get(m_->mint.key)->has_value());
  EXPECT_FALSE(std::filesystem::exists(root_ + "/private"));
  ExpectServes(*t, kServingEager, "");
}

// The operator's order suppresses arming, not the adoption: every check runs and the bytes stay
// in the local store, but nothing is loaded and no aot_cell posture is said; after the lift an
// adoption arms the kept cell.
TEST_F(Boot, OperatorEagerOnlyChecksAndKeepsTheCellButArmsNothingUntilLifted) {
  ASSERT_TRUE(store_->Put(m_->mint.key, m_->mint.tar, kMinted).ok());
  auto t = Target();
  t->SetEagerOnly(true, "maintenance");
  BootOutcome out = Adopt(*t, Spec(), Ctx());
  EXPECT_EQ(out.phase, kBootLocalHit);
  EXPECT_EQ(out.cell, nullptr);
  EXPECT_EQ(out.key, m_->mint.key);
  EXPECT_EQ(out.ref, m_->mint.ref);
  EXPECT_NE(out.detail.find("held=operator_eager_only"), std::string::npos) << out.detail;
  ExpectOneRow(out);
  EXPECT_EQ(t->cell(), nullptr);
  EXPECT_TRUE(store_->Get(m_->mint.key)->has_value());
  EXPECT_EQ(t->Posture(), kPostureOperatorEagerOnly);
  EventQuery postures;
  postures.kind = event_kind::kServePosture;
  for (const auto& row : events_.Query(postures)) {
    EXPECT_NE(row.phase, kServingAotCell) << "an aot_cell posture while the order holds";
  }
  ExpectServes(*t, kServingEager, "");
  t->SetEagerOnly(false, "");
  BootOutcome lifted = Adopt(*t, Spec(), Ctx());
  EXPECT_EQ(lifted.phase, kBootLocalHit);
  ASSERT_NE(lifted.cell, nullptr);
  ExpectServes(*t, kServingAotCell, m_->mint.ref);
}

TEST_F(Boot, NoExportDeclarationAdoptsNothing) {
  ASSERT_TRUE(store_->Put(m_->mint.key, m_->mint.tar, kMinted).ok());
  auto t = Target();
  TargetSpec spec = Spec();
  spec.export_spec.reset();
  BootOutcome out = Adopt(*t, spec, Ctx());
  EXPECT_EQ(out.phase, kBootNoExportDeclaration);
  EXPECT_EQ(out.cell, nullptr);
  ExpectOneRow(out);
  EXPECT_EQ(t->cell(), nullptr);
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// A cell revoked for cause is quarantined: adopting it again arms an object that owns no target,
// which is said on a serve_degrade row (phase armed_target_unresolved) besides boot_adopt.
TEST_F(Boot, ArmedCellThatInstallsNoTargetIsSaidOnItsOwnRow) {
  ASSERT_TRUE(store_->Put(m_->mint.key, m_->mint.tar, kMinted).ok());
  auto t = Target();
  ASSERT_NE(t, nullptr);
  ASSERT_EQ(Adopt(*t, Spec(), Ctx()).phase, kBootLocalHit);
  t->SetRunFaultForTest([] { return std::string(kCellFault); });
  auto faulted = t->Serve(Input(1), "mlp");
  ASSERT_TRUE(faulted.ok()) << faulted.status().ToString();
  ASSERT_EQ(faulted->fallback_reason, kFallbackCellFault);
  t->SetRunFaultForTest(nullptr);

  BootOutcome again = Adopt(*t, Spec(), Ctx());
  EXPECT_EQ(again.phase, kBootArmRefused) << again.detail;
  EXPECT_EQ(again.cell, nullptr);
  EventQuery q;
  q.kind = event_kind::kServeDegrade;
  q.phase = kArmedTargetUnresolved;
  auto rows = events_.Query(q);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].ref, m_->mint.ref);
  EXPECT_EQ(rows[0].target, "mlp");
  EXPECT_NE(rows[0].detail.find("compiled_degraded"), std::string::npos) << rows[0].detail;
  ExpectServes(*t, kServingEager, "");
}

// Scope at adoption (law 4, law 17): a cell of another family (a tenant's, for the platform
// model's key) is refused before anything of it is loaded, even from this machine's store.
TEST_F(Boot, ACellOfAnotherFamilyIsRefusedByScope) {
  const MintedMlp* tenant = MintFor("acme/mlp");
  ASSERT_NE(tenant, nullptr);
  ASSERT_EQ(tenant->mint.key, m_->mint.key) << "the family is not a key axis";
  ASSERT_TRUE(store_->Put(tenant->mint.key, tenant->mint.tar, kMinted).ok());
  auto t = Target();
  BootOutcome out = Adopt(*t, Spec(), Ctx());
  EXPECT_EQ(out.phase, kBootScopeRefused) << out.detail;
  EXPECT_NE(out.detail.find("'acme/mlp'"), std::string::npos) << out.detail;
  EXPECT_EQ(out.cell, nullptr);
  EXPECT_FALSE(std::filesystem::exists(root_ + "/private")) << "nothing written to load";
  EXPECT_FALSE(store_->Get(m_->mint.key)->has_value()) << "the refused entry is dropped";
  delete tenant;
}

// Code provenance (law 4): a source that is not what this worker's graph generates is refused,
// whatever the shared object holds; a local entry with no recorded origin is unattested.
TEST_F(Boot, ASourceOtherThanTheGraphImpliesIsSourceMismatch) {
  CellFiles f = UnpackCell(m_->mint.tar, "t").value();
  f.source += "\n__attribute__((constructor)) static void payload() {}\n";
  const std::string edited = PackCell(f).value();
  ASSERT_TRUE(store_->Put(m_->mint.key, edited, kMinted).ok());
  auto t = Target();
  BootOutcome out = Adopt(*t, Spec(), Ctx());
  EXPECT_EQ(out.phase, kRefusalSourceMismatch) << out.detail;
  EXPECT_NE(out.detail.find("payload"), std::string::npos) << "names the differing line";
  EXPECT_FALSE(std::filesystem::exists(root_ + "/private"));

  ASSERT_TRUE(store_->Put(m_->mint.key, m_->mint.tar, CellOrigin{}).ok());
  auto t2 = Target();
  BootOutcome unknown = Adopt(*t2, Spec(), Ctx());
  EXPECT_EQ(unknown.phase, kBootProvenanceUnattested) << unknown.detail;
}

// A hub that signs without rebuilding attests no provenance: its cells are not adopted.
TEST_F(Boot, AReceiptThatAttestsNoRebuildIsUnattested) {
  StartHubAndPublish({"--rebuild", "off"});
  ASSERT_FALSE(HasFatalFailure());
  auto t = Target();
  BootOutcome out = Adopt(*t, Spec(), Ctx());
  EXPECT_EQ(out.phase, kBootProvenanceUnattested) << out.detail;
  EXPECT_FALSE(std::filesystem::exists(BlobPath())) << "refused before the fetch";
  EXPECT_FALSE(out.retryable);
}

// Revocation reaches local-store hits: the signed list is checked before a stored cell loads.
TEST_F(Boot, ARevokedCellIsRefusedFromTheLocalStoreToo) {
  StartHubAndPublish();
  ASSERT_FALSE(HasFatalFailure());
  auto t = Target();
  ASSERT_EQ(Adopt(*t, Spec(), Ctx()).phase, kBootHit);
  HubAnswer rv = hub_->Client(hub_testing::kAdmin)->Revoke(m_->mint.key, m_->mint.digest, "test");
  ASSERT_TRUE(rv.ok()) << rv.token << ": " << rv.message;
  auto t2 = Target();
  BootOutcome out = Adopt(*t2, Spec(), Ctx());
  EXPECT_EQ(out.phase, kRefusalRevoked) << out.detail;
  EXPECT_NE(out.detail.find("origin=hub"), std::string::npos) << out.detail;
  EXPECT_EQ(out.cell, nullptr);
  EXPECT_FALSE(store_->Get(m_->mint.key)->has_value()) << "the revoked entry is deleted";
}

// The running side of revocation (worker/revocations.h): a poll de-arms a listed cell on a watched
// target at once; a list gone stale with the hub down follows the `eager` policy (every watched
// target serves eager, nothing revoked), and a fresh list lifts it.
TEST_F(Boot, RevocationWatchDeArmsOnPollAndFollowsTheStalePolicy) {
  StartHubAndPublish();
  ASSERT_FALSE(HasFatalFailure());
  auto t = Target();
  ASSERT_EQ(Adopt(*t, Spec(), Ctx()).phase, kBootHit);
  RevocationWatchOptions o;
  o.hub.url = hub_->url();
  o.hub.token = kWorker;
  o.hub.connect_timeout_s = 1;
  o.hub.io_timeout_s = 2;
  o.max_age_cap_s = 1;
  o.stale = StaleRevocationPolicy::kEager;
  o.events = &events_;
  ManualClock clock;
  o.clock = &clock;
  auto watch = RevocationWatch::Create(o);
  ASSERT_TRUE(watch.ok()) << watch.status().ToString();
  (*watch)->Watch(t.get());
  ASSERT_TRUE((*watch)->PollOnce().ok());
  ExpectServes(*t, kServingAotCell, m_->mint.ref);
  EXPECT_TRUE((*watch)->CheckAdoption(m_->mint.key, m_->mint.digest).ok());

  // Stale: the hub is down and the last list is older than the 1 s cap. Until the watch's clock
  // moves, the same list is still fresh. Ages are whole seconds (the list's iat), and the hub
  // signed the list less than a second after this clock started, so moving it 4 s makes the list
  // at least 2 s old: surely stale.
  const int port = hub_->port();
  hub_->Kill(SIGTERM);
  EXPECT_FALSE((*watch)->PollOnce().ok());
  ExpectServes(*t, kServingAotCell, m_->mint.ref);
  EXPECT_TRUE((*watch)->CheckAdoption(m_->mint.key, m_->mint.digest).ok());
  clock.Advance(std::chrono::seconds(4));
  EXPECT_FALSE((*watch)->PollOnce().ok());
  auto held = t->Serve(Input(1), "mlp");
  ASSERT_TRUE(held.ok());
  EXPECT_EQ(held->serving_mode, kServingEager);
  EXPECT_EQ(held->fallback_reason, kPostureRevocationsStale);
  Status stale = (*watch)->CheckAdoption(m_->mint.key, m_->mint.digest);
  EXPECT_TRUE(stale.Is(kRefusalRevocationsUnreachable)) << stale.ToString();
  EventQuery q;
  q.kind = event_kind::kRevocationList;
  ASSERT_FALSE(events_.Query(q).empty());
  EXPECT_EQ(events_.Query(q).back().phase, "stale_eager");

  // Back, and the cell revoked meanwhile: the fresh list lifts the hold and de-arms the cell.
  // The hub signs with the real time, so the watch's wall clock is set back to it.
  clock.SetUnixSeconds(Clock::Real()->UnixSeconds());
  ASSERT_TRUE(hub_->Start(port));
  HubAnswer rv = hub_->Client(hub_testing::kAdmin)->Revoke(m_->mint.key, m_->mint.digest, "poll");
  ASSERT_TRUE(rv.ok()) << rv.token << ": " << rv.message;
  ASSERT_TRUE((*watch)->PollOnce().ok());
  EXPECT_EQ(events_.Query(q).back().phase, "fresh");
  EXPECT_TRUE((*watch)->IsRevoked(m_->mint.digest));
  auto after = t->Serve(Input(1), "mlp");
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->serving_mode, kServingEager);
  EXPECT_EQ(after->fallback_reason, kPostureCompiledDegraded);
  EventQuery revoked;
  revoked.kind = event_kind::kCellRevoked;
  ASSERT_EQ(events_.Query(revoked).size(), 1u);
  EXPECT_EQ(events_.Query(revoked)[0].phase, "hub_revoked");
  EXPECT_TRUE((*watch)->CheckAdoption(m_->mint.key, m_->mint.digest).Is(kRefusalRevoked));
}

TEST(BootCoverage, NamesDeclaredClassesNoEntryCarries) {
  EntryMetadata one, four;
  one.shape_class = {{"x", {1, 64}}};
  four.shape_class = {{"x", {4, 64}}};
  Envelope declared{{{{"x", {1, 64}}}, {{"x", {3, 64}}}, {{"x", {4, 64}}}, {{"x", {5, 64}}}}};
  auto missing = UncoveredClasses(declared, {one, four});
  ASSERT_EQ(missing.size(), 2u);
  EXPECT_EQ(DescribeClasses(missing), "{x=[3,64]},{x=[5,64]}");
  EXPECT_TRUE(UncoveredClasses(Envelope{{{{"x", {4, 64}}}}}, {one, four}).empty());
}

}  // namespace
}  // namespace kiln
