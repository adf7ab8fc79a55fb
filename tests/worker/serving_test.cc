// Tests for the serving wrapper (src/kiln/worker/serving.h) with real cells: the mlp example is
// minted once, admitted and loaded through the same seam every adopt route uses, and each law of
// docs/design.md §2 (7-11) gets a test that fails when the law breaks.
#include "src/kiln/worker/serving.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "src/kiln/base/file.h"
#include "src/kiln/cell/admission.h"
#include "src/kiln/graph/onnx_import.h"
#include "src/kiln/identity/toolchain.h"
#include "src/kiln/mint/mint.h"

namespace kiln {
namespace {

const std::string kExamples = std::string(KILN_SOURCE_DIR) + "/examples/";

// The mlp example minted once for the whole binary (envelope {x=[1,64]}, {x=[4,64]}).
struct Minted {
  std::shared_ptr<const Graph> graph;
  WeightMap weights;
  MintResult mint;
  AdmittedCell admitted;
  std::string private_root;
};

// What MintMlpOnce made, for the clean-up; null until a test mints (a run filtered to other
// cases mints nothing, and runs no compiler).
const Minted* g_minted = nullptr;

const Minted* MintMlpOnce() {
  static const Minted* minted = []() -> const Minted* {
    auto m = std::make_unique<Minted>();
    auto g = ImportOnnxFile(kExamples + "mlp/model.onnx");
    if (!g.ok()) return nullptr;
    m->graph = std::make_shared<const Graph>(std::move(g).value());
    auto w = LoadCheckpoint(*m->graph, kExamples + "mlp/checkpoint.safetensors", true);
    if (!w.ok()) return nullptr;
    m->weights = *w;
    MintRequest r;
    r.graph = m->graph;
    r.envelope = Envelope{{{{"x", {1, 64}}}, {{"x", {4, 64}}}}};
    r.family = "root/mlp";
    r.weights = m->weights;
    auto mint = MintCell(r);
    if (!mint.ok()) {
      std::fprintf(stderr, "mint failed: %s\n", mint.status().ToString().c_str());
      return nullptr;
    }
    m->mint = std::move(mint).value();
    auto tc = LocalToolchain();
    if (!tc.ok()) return nullptr;
    AdmissionPolicy policy{m->mint.key, DetectSmLevel(), tc->Block()};
    auto admitted = AdmitCell(m->mint.tar, m->mint.digest, m->mint.tar.size(), policy);
    if (!admitted.ok()) {
      std::fprintf(stderr, "admission failed: %s\n", admitted.status().ToString().c_str());
      return nullptr;
    }
    m->admitted = std::move(admitted).value();
    char tmpl[] = "/tmp/kiln-serving-test-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) return nullptr;
    m->private_root = tmpl;
    return m.release();
  }();
  g_minted = minted;
  return minted;
}

class CleanupPrivateDirs : public ::testing::Environment {
 public:
  void TearDown() override {
    if (const Minted* m = g_minted; m && !m->private_root.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(m->private_root, ec);
    }
  }
};
const auto* const kCleanup = ::testing::AddGlobalTestEnvironment(new CleanupPrivateDirs);

// Loads the minted bytes through the adopt seam (LoadAdmittedCell) into a private dir of its own.
std::shared_ptr<ArmedCell> LoadCell(const Minted& m, Lane lane, const WeightMap& weights) {
  static std::atomic<int> counter{0};
  const std::string dir = m.private_root + "/cell-" + std::to_string(counter++);
  auto cell = LoadAdmittedCell(m.admitted, weights, lane, dir, 1);
  EXPECT_TRUE(cell.ok()) << cell.status().ToString();
  if (!cell.ok()) return nullptr;
  return std::shared_ptr<ArmedCell>(std::move(cell).value());
}

TensorMap Input(int64_t rows, uint32_t seed = 1) {
  std::vector<float> v(static_cast<size_t>(rows * 64));
  uint32_t s = seed * 2654435761u + 12345u;
  for (float& f : v) {
    s = s * 1664525u + 1013904223u;
    f = static_cast<float>((s >> 8) & 0xffff) / 32768.0f - 1.0f;
  }
  return TensorMap{{"x", Tensor::FromVector<float>({rows, 64}, v)}};
}

// Largest |a-b| relative to max(1, max|b|); +inf when names, dtypes or shapes differ.
double MaxRelDiff(const TensorMap& a, const TensorMap& b) {
  if (a.size() != b.size()) return INFINITY;
  double worst = 0;
  for (const auto& [name, tb] : b) {
    auto it = a.find(name);
    if (it == a.end() || it->second.dtype() != tb.dtype() || it->second.shape() != tb.shape()) {
      return INFINITY;
    }
    double scale = 1, diff = 0;
    for (int64_t i = 0; i < tb.numel(); ++i) {
      scale = std::max(scale, std::fabs(tb.GetAsDouble(i)));
      diff = std::max(diff, std::fabs(it->second.GetAsDouble(i) - tb.GetAsDouble(i)));
    }
    worst = std::max(worst, diff / scale);
  }
  return worst;
}

TensorMap Eager(const Minted& m, const TensorMap& inputs, const WeightMap& weights) {
  auto interp = Interpreter::Create(m.graph);
  EXPECT_TRUE(interp.ok());
  auto out = interp->Run(inputs, &weights);
  EXPECT_TRUE(out.ok()) << out.status().ToString();
  return out.ok() ? *out : TensorMap{};
}

std::vector<EventRow> Rows(const EventLog& log, const std::string& kind) {
  EventQuery q;
  q.kind = kind;
  return log.Query(q);
}

class Serving : public ::testing::Test {
 protected:
  void SetUp() override {
    m_ = MintMlpOnce();
    ASSERT_NE(m_, nullptr) << "minting the mlp example failed";
  }
  std::unique_ptr<ServedTarget> Target(LanePolicy lane = LanePolicy::kOptional) {
    ServedTargetOptions o;
    o.name = "mlp";
    o.lane_policy = lane;
    o.events = &events_;
    auto t = ServedTarget::Create(o, m_->graph, m_->weights);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    return t.ok() ? std::move(t).value() : nullptr;
  }
  std::unique_ptr<ServedTarget> ArmedTarget(Lane lane = Lane::kExported,
                                            LanePolicy policy = LanePolicy::kOptional) {
    auto t = Target(policy);
    auto cell = LoadCell(*m_, lane, m_->weights);
    if (!t || !cell) return nullptr;
    Status s = t->InstallCell(cell);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return t;
  }

  const Minted* m_ = nullptr;
  EventLog events_;
};

// Law 7 (serve first) and law 10: an installed cell answers the first request with no warmup,
// says aot_cell with its ref, and its outputs are eager's.
TEST_F(Serving, ArmedCellServesAotCellWithItsRefAndEagerOutputs) {
  auto t = ArmedTarget();
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->Posture(), kServingAotCell);
  for (int64_t rows : {1, 4}) {
    TensorMap in = Input(rows);
    auto r = t->Serve(in, "mlp");
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->serving_mode, kServingAotCell);
    EXPECT_EQ(r->served_cell_ref, m_->mint.ref);
    EXPECT_EQ(r->fallback_reason, "");
    EXPECT_GT(r->duration_ms, 0);
    EXPECT_LE(MaxRelDiff(r->outputs, Eager(*m_, in, m_->weights)), 1e-5);
  }
  EXPECT_TRUE(Rows(events_, event_kind::kServeDegrade).empty());
}

// Law 8: out of envelope is not an error: eager, named by the closest entry's first mismatch, a
// row, and the cell stays armed for the next in-envelope request.
TEST_F(Serving, OutOfEnvelopeIsServedEagerNamedAndTheCellStaysArmed) {
  auto t = ArmedTarget();
  ASSERT_NE(t, nullptr);
  TensorMap in = Input(3);
  auto r = t->Serve(in, "mlp");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->serving_mode, kServingEager);
  EXPECT_EQ(r->served_cell_ref, "");
  EXPECT_EQ(r->fallback_reason, kFallbackOutOfEnvelope);
  EXPECT_NE(r->fallback_detail.find("input 'x' is [3,64]"), std::string::npos)
      << r->fallback_detail;
  EXPECT_NE(r->fallback_detail.find("entry 0 takes [1,64]"), std::string::npos)
      << r->fallback_detail;
  EXPECT_LE(MaxRelDiff(r->outputs, Eager(*m_, in, m_->weights)), 1e-6);
  auto rows = Rows(events_, event_kind::kIngressRefused);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].phase, kFallbackOutOfEnvelope);
  EXPECT_EQ(rows[0].ref, m_->mint.ref);
  EXPECT_EQ(rows[0].fn, "mlp");
  EXPECT_NE(rows[0].detail.find("target=mlp"), std::string::npos);

  ASSERT_NE(t->cell(), nullptr);
  EXPECT_FALSE(t->cell()->revoked());
  auto next = t->Serve(Input(4), "mlp");
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next->serving_mode, kServingAotCell);
  EXPECT_EQ(next->served_cell_ref, m_->mint.ref);
}

// The operator's order is read on every call and is reversible.
TEST_F(Serving, EagerOnlyOrderServesEagerAndReleaseReturnsToTheCell) {
  auto t = ArmedTarget();
  ASSERT_NE(t, nullptr);
  t->SetEagerOnly(true, "incident 42");
  EXPECT_EQ(t->Posture(), kPostureOperatorEagerOnly);
  TensorMap in = Input(1);
  auto r = t->Serve(in, "mlp");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->serving_mode, kServingEager);
  EXPECT_EQ(r->served_cell_ref, "");
  EXPECT_EQ(r->fallback_reason, kPostureOperatorEagerOnly);
  EXPECT_EQ(r->fallback_detail, "incident 42");
  EXPECT_LE(MaxRelDiff(r->outputs, Eager(*m_, in, m_->weights)), 1e-6);
  EXPECT_FALSE(t->cell()->revoked()) << "the order must not revoke the cell";

  t->SetEagerOnly(false, "resolved");
  auto back = t->Serve(in, "mlp");
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->serving_mode, kServingAotCell);
  EXPECT_EQ(back->served_cell_ref, m_->mint.ref);
  auto rows = Rows(events_, event_kind::kServePosture);
  ASSERT_GE(rows.size(), 3u);  // installed, order on, order off
  EXPECT_EQ(rows[rows.size() - 2].phase, kPostureOperatorEagerOnly);
  EXPECT_EQ(rows.back().phase, "operator_release");
}

// Law 7 and law 10: a cell fault answers that request eager (correct outputs), revokes the cell
// stickily with a serve_degrade row; later requests say compiled_degraded; the operator's release
// does not resurrect it; the revoked cell (or its ref) never installs again.
TEST_F(Serving, CellFaultAnswersEagerRevokesForLifeAndNothingResurrectsIt) {
  auto t = ArmedTarget();
  ASSERT_NE(t, nullptr);
  std::shared_ptr<ArmedCell> cell = t->cell();
  std::atomic<int> calls{0};
  t->SetRunFaultForTest(
      [&calls] { return calls++ == 0 ? std::string(kCellFault) : std::string(); });
  TensorMap in = Input(4);
  auto r = t->Serve(in, "mlp");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->serving_mode, kServingEager);
  EXPECT_EQ(r->served_cell_ref, "");
  EXPECT_EQ(r->fallback_reason, kFallbackCellFault);
  EXPECT_LE(MaxRelDiff(r->outputs, Eager(*m_, in, m_->weights)), 1e-6);
  EXPECT_TRUE(cell->revoked());
  EXPECT_EQ(t->cell(), nullptr);
  EXPECT_EQ(t->revoked_cell(), cell) << "the target must still say it held this cell (law 9)";
  auto degrade = Rows(events_, event_kind::kServeDegrade);
  ASSERT_EQ(degrade.size(), 1u);
  EXPECT_EQ(degrade[0].phase, kFallbackCellFault);
  EXPECT_EQ(degrade[0].ref, m_->mint.ref);
  EXPECT_EQ(degrade[0].key, m_->mint.key);

  for (int i = 0; i < 3; ++i) {
    auto later = t->Serve(in, "mlp");
    ASSERT_TRUE(later.ok());
    EXPECT_EQ(later->serving_mode, kServingEager);
    EXPECT_EQ(later->fallback_reason, kPostureCompiledDegraded);
    EXPECT_LE(MaxRelDiff(later->outputs, Eager(*m_, in, m_->weights)), 1e-6);
  }
  EXPECT_EQ(calls.load(), 1) << "a revoked cell must not be entered again";
  auto posture_rows = Rows(events_, event_kind::kServeEagerPosture);
  ASSERT_EQ(posture_rows.size(), 1u) << "one row per posture change, not per request";
  EXPECT_EQ(posture_rows[0].phase, kPostureCompiledDegraded);

  t->SetEagerOnly(true, "drill");
  t->SetEagerOnly(false, "drill over");
  EXPECT_EQ(t->Posture(), kPostureCompiledDegraded);
  auto after = t->Serve(in, "mlp");
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->serving_mode, kServingEager);
  EXPECT_EQ(after->fallback_reason, kPostureCompiledDegraded);

  // Law 10: the revoked object installs no target; nor does a fresh load of the same identity.
  Status again = t->InstallCell(cell);
  EXPECT_FALSE(again.ok());
  EXPECT_EQ(again.message().rfind(kPostureCompiledDegraded, 0), 0u) << again.ToString();
  auto fresh = LoadCell(*m_, Lane::kExported, m_->weights);
  ASSERT_NE(fresh, nullptr);
  EXPECT_FALSE(t->InstallCell(fresh).ok()) << "a quarantined ref was re-armed";
  EXPECT_EQ(t->Posture(), kPostureCompiledDegraded);
  auto final_r = t->Serve(Input(1), "mlp");
  ASSERT_TRUE(final_r.ok());
  EXPECT_EQ(final_r->serving_mode, kServingEager);
}

// Law 10: a cell that is already revoked installs no target and the target reports
// compiled_degraded; the wire never says aot_cell.
TEST_F(Serving, RevokedCellInstallsNoTarget) {
  auto t = Target();
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->Posture(), kPostureUncompiled);
  auto cell = LoadCell(*m_, Lane::kExported, m_->weights);
  ASSERT_NE(cell, nullptr);
  cell->Revoke("revoked before install");
  Status s = t->InstallCell(cell);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.token(), kPostureCompiledDegraded);
  EXPECT_EQ(s.message().rfind("compiled_degraded:", 0), 0u) << s.ToString();
  EXPECT_EQ(t->cell(), nullptr);
  EXPECT_EQ(t->Posture(), kPostureCompiledDegraded);
  auto r = t->Serve(Input(1), "mlp");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->serving_mode, kServingEager);
  EXPECT_EQ(r->served_cell_ref, "");
  EXPECT_EQ(r->fallback_reason, kPostureCompiledDegraded);
  auto rows = Rows(events_, event_kind::kServePosture);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].phase, kPostureCompiledDegraded);
}

// Crash containment (crash_guard.h): an exported cell's first call runs between a crash marker
// written before it and removed after it; once a call returned outputs, later calls write none.
TEST_F(Serving, FirstCallRunsBetweenACrashMarkerAndItsRemoval) {
  const std::string root = m_->private_root + "/crash-store-" + std::to_string(::getpid());
  CrashGuard guard(root);
  ServedTargetOptions o;
  o.name = "mlp";
  o.events = &events_;
  o.crash_guard = &guard;
  auto t = ServedTarget::Create(o, m_->graph, m_->weights);
  ASSERT_TRUE(t.ok());
  auto cell = LoadCell(*m_, Lane::kExported, m_->weights);
  ASSERT_NE(cell, nullptr);
  ASSERT_TRUE((*t)->InstallCell(cell).ok());
  auto markers = [&] {
    int n = 0;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(guard.dir() + "/markers", ec)) {
      (void)e;
      ++n;
    }
    return n;
  };
  // The test hook runs right where the cell would: it sees what is on disk during the call.
  std::vector<int> seen;
  (*t)->SetRunFaultForTest([&] {
    seen.push_back(markers());
    return std::string();
  });
  for (int i = 0; i < 3; ++i) {
    auto r = (*t)->Serve(Input(1), "mlp");
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->serving_mode, kServingAotCell);
    EXPECT_EQ(markers(), 0);
  }
  EXPECT_EQ(seen, (std::vector<int>{1, 0, 0}));
  std::error_code ec;
  std::filesystem::remove_all(root, ec);
}

// A ref a process of this machine died in installs no target, even one minted and proven again
// here (a proof is no evidence against the crash); the target serves eager saying cell_crashed.
TEST_F(Serving, CrashQuarantinedRefInstallsNoTargetEvenReproven) {
  const std::string root = m_->private_root + "/crash-store-q-" + std::to_string(::getpid());
  CrashGuard guard(root);
  CrashMarker crashed;
  crashed.ref = m_->mint.ref;
  crashed.target = "mlp";
  crashed.pid = 1;
  ASSERT_TRUE(guard.Quarantine(crashed).ok());
  ServedTargetOptions o;
  o.name = "mlp";
  o.events = &events_;
  o.crash_guard = &guard;
  auto t = ServedTarget::Create(o, m_->graph, m_->weights);
  ASSERT_TRUE(t.ok());
  auto cell = LoadCell(*m_, Lane::kExported, m_->weights);
  ASSERT_NE(cell, nullptr);
  Status s = (*t)->InstallCell(cell, /*reproven=*/true);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.token(), kCellCrashed);
  EXPECT_EQ((*t)->cell(), nullptr);
  EXPECT_EQ((*t)->Posture(), kCellCrashed);
  auto r = (*t)->Serve(Input(1), "mlp");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->serving_mode, kServingEager);
  EXPECT_EQ(r->fallback_reason, kCellCrashed);
  std::error_code ec;
  std::filesystem::remove_all(root, ec);
}

// Law 7: allocation failure is not the cell's fault: eager, a cell_oom row, still armed.
TEST_F(Serving, ResourceExhaustionAnswersEagerAndStaysArmed) {
  auto t = ArmedTarget();
  ASSERT_NE(t, nullptr);
  std::shared_ptr<ArmedCell> cell = t->cell();
  t->SetRunFaultForTest([] { return std::string(kCellOom); });
  TensorMap in = Input(1);
  auto r = t->Serve(in, "mlp");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->serving_mode, kServingEager);
  EXPECT_EQ(r->fallback_reason, kFallbackCellOom);
  EXPECT_LE(MaxRelDiff(r->outputs, Eager(*m_, in, m_->weights)), 1e-6);
  EXPECT_FALSE(cell->revoked());
  EXPECT_EQ(t->cell(), cell);
  EXPECT_EQ(t->Posture(), kServingAotCell);
  auto oom = Rows(events_, event_kind::kCellOom);
  ASSERT_EQ(oom.size(), 1u);
  EXPECT_EQ(oom[0].ref, m_->mint.ref);
  EXPECT_TRUE(Rows(events_, event_kind::kServeDegrade).empty());

  t->SetRunFaultForTest(nullptr);
  auto next = t->Serve(in, "mlp");
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next->serving_mode, kServingAotCell);
}

// An armed target whose declared envelope is the cell's classes [1,64] and [4,64] plus `ranged`.
std::unique_ptr<ServedTarget> RangedTarget(const Minted& m, EventLog* events, LanePolicy lane,
                                           std::vector<RangedEntry> ranged) {
  ServedTargetOptions o;
  o.name = "mlp";
  o.lane_policy = lane;
  o.events = events;
  o.envelope.classes = {{{"x", {1, 64}}}, {{"x", {4, 64}}}};
  o.envelope.ranged = std::move(ranged);
  o.allow_partial = true;
  auto t = ServedTarget::Create(o, m.graph, m.weights);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  if (!t.ok()) return nullptr;
  auto cell = LoadCell(m, Lane::kExported, m.weights);
  if (!cell) return nullptr;
  Status s = (*t)->InstallCell(cell);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return std::move(t).value();
}

RangedEntry BatchRange(int64_t lo, int64_t hi) {
  RangedEntry r;
  r.inputs["x"] = {DimSpec{0, "batch"}, DimSpec{64, ""}};
  r.ranges["batch"] = {lo, hi};
  return r;
}

// Ingress against a declared ranged entry: inside it (not compiled) eager, named
// entry_not_compiled; past its range eager, named declared_range_exceeded with the symbol, the
// value and the range (refused by that name on a mandatory lane); the cell stays armed throughout.
TEST_F(Serving, ARangedEntryIsCheckedAtIngressAndItsGapServedEagerByName) {
  auto t = RangedTarget(*m_, &events_, LanePolicy::kOptional, {BatchRange(5, 16)});
  ASSERT_NE(t, nullptr);
  auto in = t->Serve(Input(8), "mlp");
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  EXPECT_EQ(in->serving_mode, kServingEager);
  EXPECT_EQ(in->fallback_reason, kFallbackEntryNotCompiled);
  EXPECT_NE(in->fallback_detail.find("ranged entry {x=[batch,64] batch=[5,16]}"), std::string::npos)
      << in->fallback_detail;
  EXPECT_LE(MaxRelDiff(in->outputs, Eager(*m_, Input(8), m_->weights)), 1e-6);
  auto past = t->Serve(Input(17), "mlp");
  ASSERT_TRUE(past.ok()) << past.status().ToString();
  EXPECT_EQ(past->serving_mode, kServingEager);
  EXPECT_EQ(past->fallback_reason, kFallbackDeclaredRangeExceeded);
  EXPECT_NE(past->fallback_detail.find("symbol 'batch' is 17"), std::string::npos)
      << past->fallback_detail;
  EXPECT_NE(past->fallback_detail.find("[5, 16]"), std::string::npos) << past->fallback_detail;
  // A batch below the range is past it too; a shape no entry takes is undeclared.
  EXPECT_EQ(t->Serve(Input(2), "mlp")->fallback_reason, kFallbackDeclaredRangeExceeded);
  auto undeclared =
      t->Serve({{"x", Tensor::FromVector<float>({2, 32}, std::vector<float>(64, 0.5f))}}, "mlp");
  ASSERT_FALSE(undeclared.ok() && undeclared->fallback_reason != kFallbackOutOfEnvelope)
      << undeclared->fallback_reason;
  auto compiled = t->Serve(Input(4), "mlp");
  ASSERT_TRUE(compiled.ok());
  EXPECT_EQ(compiled->serving_mode, kServingAotCell);
  bool named = false;
  for (const EventRow& r : Rows(events_, event_kind::kIngressRefused)) {
    named = named || r.phase == kFallbackDeclaredRangeExceeded;
  }
  EXPECT_TRUE(named);

  EventLog mandatory_events;
  auto m = RangedTarget(*m_, &mandatory_events, LanePolicy::kMandatory, {BatchRange(5, 16)});
  ASSERT_NE(m, nullptr);
  auto refused = m->Serve(Input(17), "mlp");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.status().token(), kFallbackDeclaredRangeExceeded);
  EXPECT_EQ(m->Serve(Input(1), "mlp")->serving_mode, kServingAotCell);
}

// A symbol that takes two values across the inputs breaks the entry's own contract: refused by
// name on every lane, before any eager run. Two declared entries admitting one request are named
// entry_ambiguous (an envelope the manifest parser refuses, given here directly).
TEST_F(Serving, AnInconsistentSymbolIsRefusedAndAnAmbiguousEnvelopeIsNamed) {
  RangedEntry square;
  square.inputs["x"] = {DimSpec{0, "n"}, DimSpec{0, "n"}};
  square.ranges["n"] = {1, 100};
  auto t = RangedTarget(*m_, &events_, LanePolicy::kOptional, {square});
  ASSERT_NE(t, nullptr);
  auto r = t->Serve(Input(5), "mlp");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().token(), kRefusalSymbolInconsistent);
  EXPECT_NE(
      r.status().message().find("symbol 'n' is 5 at input 'x' dim 0 but 64 at input 'x' dim 1"),
      std::string::npos)
      << r.status().ToString();
  EXPECT_EQ(t->Serve(Input(1), "mlp")->serving_mode, kServingAotCell);

  EventLog events;
  auto a = RangedTarget(*m_, &events, LanePolicy::kOptional, {BatchRange(1, 16)});
  ASSERT_NE(a, nullptr);
  auto amb = a->Serve(Input(4), "mlp");
  ASSERT_TRUE(amb.ok()) << amb.status().ToString();
  EXPECT_EQ(amb->serving_mode, kServingEager);
  EXPECT_EQ(amb->fallback_reason, kFallbackEntryAmbiguous);
  EXPECT_NE(amb->fallback_detail.find("both admit the request"), std::string::npos);
}

// Law 11: a mandatory target without an armed cell refuses retryably and never answers eager;
// with a cell it serves; where an optional target would fall back, it refuses instead.
TEST_F(Serving, MandatoryLaneFailsClosed) {
  auto bare = Target(LanePolicy::kMandatory);
  ASSERT_NE(bare, nullptr);
  auto r = bare->Serve(Input(1), "mlp");
  ASSERT_FALSE(r.ok()) << "a mandatory target answered " << r->serving_mode;
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(IsRetryableServeRefusal(r.status())) << r.status().ToString();
  EXPECT_EQ(r.status().token(), kRefusalRequiredCompileMissing);

  auto t = ArmedTarget(Lane::kExported, LanePolicy::kMandatory);
  ASSERT_NE(t, nullptr);
  auto ok = t->Serve(Input(4), "mlp");
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->serving_mode, kServingAotCell);

  auto outside = t->Serve(Input(3), "mlp");
  ASSERT_FALSE(outside.ok()) << "out of envelope answered eager on a mandatory lane";
  EXPECT_EQ(outside.status().token(), kFallbackOutOfEnvelope);
  EXPECT_FALSE(IsRetryableServeRefusal(outside.status()));
  EXPECT_FALSE(t->cell()->revoked());

  t->SetRunFaultForTest([] { return std::string(kCellFault); });
  auto fault = t->Serve(Input(1), "mlp");
  ASSERT_FALSE(fault.ok()) << "a cell fault answered eager on a mandatory lane";
  EXPECT_TRUE(IsRetryableServeRefusal(fault.status()));
  auto after = t->Serve(Input(1), "mlp");
  ASSERT_FALSE(after.ok());
  EXPECT_EQ(after.status().token(), kRefusalRequiredCompileMissing);
}

// A mandatory target whose cell faulted asks for a re-mint instead of refusing forever; the
// re-minted cell (proven again on this target) lifts the fault's quarantine of its ref, a plain
// re-load does not. Past its re-mints the target says so without asking for a retry.
TEST_F(Serving, MandatoryTargetWhoseCellFaultedAsksForARemintBoundedTimes) {
  ServedTargetOptions o;
  o.name = "mlp";
  o.lane_policy = LanePolicy::kMandatory;
  o.events = &events_;
  o.max_remints = 1;
  auto created = ServedTarget::Create(o, m_->graph, m_->weights);
  ASSERT_TRUE(created.ok());
  auto t = std::move(created).value();
  ASSERT_TRUE(t->InstallCell(LoadCell(*m_, Lane::kExported, m_->weights)).ok());
  std::vector<std::string> asked;
  t->SetOnCellLost([&asked](const std::string& ref) { asked.push_back(ref); });
  t->SetRunFaultForTest([] { return std::string(kCellFault); });
  auto fault = t->Serve(Input(1), "mlp");
  ASSERT_FALSE(fault.ok());
  EXPECT_TRUE(IsRetryableServeRefusal(fault.status())) << fault.status().ToString();
  ASSERT_EQ(asked, std::vector<std::string>{m_->mint.ref});
  // A plain re-load of the same ref stays quarantined (law 10); the re-minted one arms.
  EXPECT_FALSE(t->InstallCell(LoadCell(*m_, Lane::kExported, m_->weights)).ok());
  ASSERT_TRUE(t->InstallCell(LoadCell(*m_, Lane::kExported, m_->weights), true).ok());
  // It faults again: no re-mint is left, and the refusal is not "retry later".
  auto again = t->Serve(Input(1), "mlp");
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().token(), kRefusalCellLost);
  EXPECT_FALSE(IsRetryableServeRefusal(again.status()));
  EXPECT_EQ(asked.size(), 1u);
  auto later = t->Serve(Input(1), "mlp");
  EXPECT_EQ(later.status().token(), kRefusalCellLost);
}

// The hub revoked a digest: the installed cell with it is de-armed at once, said on its own row,
// and never installs again; the stale-list hold serves eager without revoking anything.
TEST_F(Serving, HubRevocationDeArmsByDigestAndTheStaleHoldIsReversible) {
  auto t = ArmedTarget();
  ASSERT_NE(t, nullptr);
  t->SetRevocationHold(true);
  auto held = t->Serve(Input(1), "mlp");
  ASSERT_TRUE(held.ok());
  EXPECT_EQ(held->fallback_reason, kPostureRevocationsStale);
  t->SetRevocationHold(false);
  EXPECT_EQ(t->Serve(Input(1), "mlp")->serving_mode, kServingAotCell);
  EXPECT_EQ(t->RevokeByDigest("sha256:" + std::string(64, '0'), "other"), "");
  const std::string digest = m_->mint.ref.substr(m_->mint.ref.find('@') + 1);
  EXPECT_EQ(t->RevokeByDigest(digest, "revoked by the hub: test"), m_->mint.ref);
  auto r = t->Serve(Input(1), "mlp");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->serving_mode, kServingEager);
  EXPECT_EQ(r->fallback_reason, kPostureCompiledDegraded);
  auto rows = Rows(events_, event_kind::kCellRevoked);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].phase, "hub_revoked");
  EXPECT_EQ(rows[0].ref, m_->mint.ref);
  EXPECT_FALSE(t->InstallCell(LoadCell(*m_, Lane::kExported, m_->weights), true).ok())
      << "a hub revocation is never lifted, not even by a re-mint";
}

// Law 9: the lane is read off the armed object: the same admitted bytes armed on the intake lane
// serve as jit_cell with no ref (intake produces nothing to name), on the exported lane as
// aot_cell.
TEST_F(Serving, IntakeLaneCellServesJitCellWithNoRef) {
  auto t = ArmedTarget(Lane::kIntake);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->Posture(), kServingJitCell);
  TensorMap in = Input(4);
  auto r = t->Serve(in, "mlp");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->serving_mode, kServingJitCell);
  EXPECT_EQ(r->served_cell_ref, "");
  EXPECT_LE(MaxRelDiff(r->outputs, Eager(*m_, in, m_->weights)), 1e-5);

  // An intake cell armed with no ref at all, as a local JIT compile would produce it.
  auto lib = OpenCellBytes(m_->admitted.files.shared_object, m_->private_root + "/jit");
  ASSERT_TRUE(lib.ok()) << lib.status().ToString();
  auto jit = ArmedCell::Arm(*lib, m_->admitted.metadata.entries, m_->weights, Lane::kIntake, "", 1);
  ASSERT_TRUE(jit.ok()) << jit.status().ToString();
  auto t2 = Target();
  ASSERT_TRUE(t2->InstallCell(std::shared_ptr<ArmedCell>(std::move(jit).value())).ok());
  auto r2 = t2->Serve(in, "mlp");
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(r2->serving_mode, kServingJitCell);
  EXPECT_EQ(r2->served_cell_ref, "");
}

// A checkpoint swap rebinds the cell: outputs change, still aot_cell, equal to eager with the new
// weights. A checkpoint of another architecture is refused and changes nothing.
TEST_F(Serving, CheckpointSwapKeepsTheCellServingWithNewWeights) {
  auto t = ArmedTarget();
  ASSERT_NE(t, nullptr);
  TensorMap in = Input(4, 7);
  auto before = t->Serve(in, "mlp");
  ASSERT_TRUE(before.ok());
  auto derived = DeriveCheckpoint(*m_->graph, 7);
  ASSERT_TRUE(derived.ok()) << derived.status().ToString();

  WeightMap wrong = *derived;
  const std::string victim = wrong.begin()->first;
  auto small = Tensor::Empty(DType::kFloat32, {1});
  ASSERT_TRUE(small.ok());
  wrong[victim] = *small;
  Status refused = t->SwapCheckpoint(wrong);
  EXPECT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("'" + victim + "'"), std::string::npos) << refused.ToString();
  WeightMap extra = *derived;
  extra["not_a_weight"] = *small;
  EXPECT_FALSE(t->SwapCheckpoint(extra).ok());
  auto unchanged = t->Serve(in, "mlp");
  ASSERT_TRUE(unchanged.ok());
  EXPECT_LE(MaxRelDiff(unchanged->outputs, before->outputs), 0.0);

  Status swapped = t->SwapCheckpoint(*derived);
  ASSERT_TRUE(swapped.ok()) << swapped.ToString();
  auto after = t->Serve(in, "mlp");
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->serving_mode, kServingAotCell);
  EXPECT_EQ(after->served_cell_ref, m_->mint.ref);
  EXPECT_GT(MaxRelDiff(after->outputs, before->outputs), 1e-3) << "the swap changed nothing";
  EXPECT_LE(MaxRelDiff(after->outputs, Eager(*m_, in, *derived)), 1e-5);
  // The eager fallback uses the new weights too.
  t->SetEagerOnly(true, "compare");
  auto eager = t->Serve(in, "mlp");
  ASSERT_TRUE(eager.ok());
  EXPECT_LE(MaxRelDiff(eager->outputs, Eager(*m_, in, *derived)), 1e-6);
}

// Every row the wrapper writes carries a strictly increasing seq, in the ring and in the file.
TEST_F(Serving, EventRowsHaveStrictlyIncreasingSeq) {
  char tmpl[] = "/tmp/kiln-serving-events-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string path = std::string(tmpl) + "/events.jsonl";
  ASSERT_TRUE(events_.SetPath(path).ok());
  auto t = ArmedTarget();
  ASSERT_NE(t, nullptr);
  ASSERT_TRUE(t->Serve(Input(3), "mlp").ok());
  t->SetRunFaultForTest([] { return std::string(kCellOom); });
  ASSERT_TRUE(t->Serve(Input(1), "mlp").ok());
  t->SetRunFaultForTest([] { return std::string(kCellFault); });
  ASSERT_TRUE(t->Serve(Input(1), "mlp").ok());
  ASSERT_TRUE(t->Serve(Input(1), "mlp").ok());
  t->SetEagerOnly(true, "x");
  auto rows = events_.Query({});
  ASSERT_GE(rows.size(), 6u);  // installed, ingress, oom, degrade, posture, order
  for (size_t i = 1; i < rows.size(); ++i) EXPECT_LT(rows[i - 1].seq, rows[i].seq);
  auto text = ReadFile(path);
  ASSERT_TRUE(text.ok());
  size_t lines = 0;
  for (char c : *text) lines += c == '\n';
  EXPECT_EQ(lines, rows.size());
  std::filesystem::remove_all(tmpl);
}

// Concurrent requests run concurrently and all succeed, each with the right mode and outputs.
TEST_F(Serving, EightThreadsServeConcurrently) {
  auto t = ArmedTarget();
  ASSERT_NE(t, nullptr);
  const std::vector<int64_t> shapes = {1, 4, 3};
  std::vector<TensorMap> inputs, expected;
  for (int64_t rows : shapes) {
    inputs.push_back(Input(rows, static_cast<uint32_t>(rows)));
    expected.push_back(Eager(*m_, inputs.back(), m_->weights));
  }
  std::atomic<int> failures{0}, aot{0}, eager{0};
  std::vector<std::thread> threads;
  for (int th = 0; th < 8; ++th) {
    threads.emplace_back([&, th] {
      for (int i = 0; i < 30; ++i) {
        const size_t k = static_cast<size_t>(th + i) % shapes.size();
        auto r = t->Serve(inputs[k], "mlp");
        if (!r.ok() || MaxRelDiff(r->outputs, expected[k]) > 1e-5) {
          ++failures;
          continue;
        }
        const bool want_cell = shapes[k] != 3;
        if (want_cell && r->serving_mode == kServingAotCell && r->served_cell_ref == m_->mint.ref) {
          ++aot;
        } else if (!want_cell && r->serving_mode == kServingEager &&
                   r->fallback_reason == kFallbackOutOfEnvelope) {
          ++eager;
        } else {
          ++failures;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(aot.load() + eager.load(), 240);
  EXPECT_EQ(aot.load(), 160);
  EXPECT_FALSE(t->cell()->revoked());
}

}  // namespace
}  // namespace kiln
