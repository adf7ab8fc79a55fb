// End-to-end mint tests: compile every example class into a cell, prove it, and check the laws
// the mint owns (1, 2, 5, 6, 15) with tests that fail when a law breaks.
#include "src/kiln/mint/mint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "src/kiln/base/file.h"
#include "src/kiln/cell/admission.h"
#include "src/kiln/cell/pack.h"
#include "src/kiln/cell/store.h"
#include "src/kiln/compile/driver.h"
#include "src/kiln/compile/pipeline.h"
#include "src/kiln/graph/onnx_import.h"
#include "src/kiln/mint/regenerate.h"
#include "src/kiln/tensor/npy.h"
#include "tests/graph/onnx_builder.h"

namespace kiln {
namespace {

const std::string kExamples = std::string(KILN_SOURCE_DIR) + "/examples/";

struct Target {
  std::shared_ptr<const Graph> graph;
  WeightMap weights;
};

Target Load(const std::string& name) {
  auto g = ImportOnnxFile(kExamples + name + "/model.onnx");
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  Target t;
  t.graph = std::make_shared<const Graph>(std::move(g).value());
  auto w = LoadCheckpoint(*t.graph, kExamples + name + "/checkpoint.safetensors", true);
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  t.weights = *w;
  return t;
}

MintRequest Request(const Target& t, Envelope env, const std::string& family) {
  MintRequest r;
  r.graph = t.graph;
  r.envelope = std::move(env);
  r.family = family;
  r.weights = t.weights;
  return r;
}

TEST(Mint, MlpEveryClassIsHealthy) {
  Target t = Load("mlp");
  Envelope env{{{{"x", {1, 64}}}, {{"x", {4, 64}}}, {{"x", {16, 64}}}}};
  auto m = MintCell(Request(t, env, "root/mlp"));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->gate.verdict, Verdict::kHealthy) << m->gate.Summary();
  for (const auto& e : m->gate.entries) EXPECT_GE(e.cos, 0.99999) << e.entry;
  EXPECT_TRUE(IsWellFormedKey(m->key));
  EXPECT_EQ(m->digest, CellDigest(m->tar));
}

// A class the compiler refuses is a gap, not the end of the cell: the others are entries, the key
// is the whole envelope's, the metadata names the gap with the compiler's words, and the source
// regenerates from the metadata (with the gap re-derived) only where the compiler refuses it too.
TEST(Mint, AClassThatDoesNotCompileIsAGapAndTheOthersAreEntries) {
  Target t = Load("mlp");
  Envelope env{{{{"x", {1, 64}}}, {{"x", {4, 64}}}, {{"x", {16, 64}}}}};
  ::setenv(kTestUncompilableClassEnv, "{x=[4,64]}", 1);
  auto m = MintCell(Request(t, env, "root/mlp"));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_EQ(m->metadata.entries.size(), 2u);
  EXPECT_EQ(m->metadata.entries[0].shape_class, env.classes[0]);
  EXPECT_EQ(m->metadata.entries[1].shape_class, env.classes[2]);
  EXPECT_EQ(m->metadata.entries[1].index, 1u);
  ASSERT_EQ(m->metadata.gaps.size(), 1u);
  EXPECT_EQ(m->metadata.gaps[0].shape_class, env.classes[1]);
  EXPECT_NE(m->metadata.gaps[0].reason.find("refused by the test switch"), std::string::npos)
      << m->metadata.gaps[0].reason;
  EXPECT_EQ(m->gate.entries.size(), 2u);
  EXPECT_EQ(m->key, KeyFromAxes(DeriveKeyAxes(*t.graph, env, "").value()).value());
  auto cell = UnpackCell(m->tar, "minted");
  ASSERT_TRUE(cell.ok()) << cell.status().ToString();
  EXPECT_TRUE(CheckSourceProvenance(*t.graph, m->metadata, cell->source).ok());
  ::unsetenv(kTestUncompilableClassEnv);
  Status honest = CheckSourceProvenance(*t.graph, m->metadata, cell->source);
  EXPECT_FALSE(honest.ok());
  EXPECT_NE(honest.message().find("compiles here"), std::string::npos) << honest.ToString();
  // Every class refused: the first refusal, as before gaps existed.
  ::setenv(kTestUncompilableClassEnv, "{x=[1,64]}", 1);
  auto none = MintCell(Request(t, Envelope{{{{"x", {1, 64}}}}}, "root/mlp"));
  ::unsetenv(kTestUncompilableClassEnv);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kUnimplemented) << none.status().ToString();
}

TEST(Mint, MicroDiffusionAndTransformerAreHealthy) {
  struct Case {
    const char* name;
    Envelope env;
  };
  const std::vector<Case> cases = {
      {"micro-diffusion", {{{{"latent", {1, 4, 64, 64}}, {"timestep", {1}}, {"cond", {1, 64}}}}}},
      {"transformer", {{{{"input_ids", {1, 32}}}}}},
  };
  for (const Case& c : cases) {
    Target t = Load(c.name);
    auto m = MintCell(Request(t, c.env, std::string("root/") + c.name));
    ASSERT_TRUE(m.ok()) << c.name << ": " << m.status().ToString();
    EXPECT_EQ(m->gate.verdict, Verdict::kHealthy) << m->gate.Summary();
    for (const auto& e : m->gate.entries) EXPECT_GE(e.cos, 0.99999) << c.name;
    std::printf("%s: %s\n", c.name, m->gate.Summary().c_str());
    for (const auto& s : m->stages) std::printf("  %-8s %8.1f ms\n", s.stage.c_str(), s.ms);
  }
}

// The AVX-512 variant: a cell minted for x86-64-v4 (what KILN_SM_CEILING or a target's `sm`
// asks for; built with -march=x86-64-v4, so its generated loops use 512-bit vectors) is keyed
// apart from the fleet default and passes the same strict gate. Only on a machine that runs
// x86-64-v4.
TEST(Mint, X86V4VariantIsKeyedApartAndHealthy) {
  if (DetectSmLevel() != "x86-64-v4") GTEST_SKIP() << "this CPU runs " << DetectSmLevel();
  Target t = Load("micro-diffusion");
  const Envelope env{{{{"latent", {1, 4, 64, 64}}, {"timestep", {1}}, {"cond", {1, 64}}}}};
  MintRequest v4 = Request(t, env, "root/micro-diffusion");
  v4.sm = "x86-64-v4";
  auto m = MintCell(v4);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->gate.verdict, Verdict::kHealthy) << m->gate.Summary();
  EXPECT_EQ(m->axes.sm, "x86-64-v4");
  auto v3 = DeriveKeyAxes(*t.graph, env, "x86-64-v3");
  ASSERT_TRUE(v3.ok());
  EXPECT_NE(*KeyFromAxes(*v3), m->key);
  EXPECT_NE(m->metadata.sm, DefaultSmTarget()) << "the fleet default stays x86-64-v3";
}

Envelope MlpEnvelope() { return Envelope{{{{"x", {1, 64}}}, {{"x", {4, 64}}}}}; }

// A cell built and armed outside MintCell, for calling the fence directly.
struct ArmedFixture {
  std::unique_ptr<ArmedCell> cell;
  std::unique_ptr<Interpreter> eager;
  std::string source, so;
};

ArmedFixture Build(std::shared_ptr<const Graph> graph, const WeightMap& weights,
                   const Envelope& env, const EmitOptions& emit) {
  ArmedFixture f;
  CompileOptions options;
  options.emit = emit;
  std::vector<Program> programs;
  auto cell = GenerateCell(*graph, env, "fixture", options, nullptr, &programs);
  EXPECT_TRUE(cell.ok()) << cell.status().ToString();
  if (!cell.ok()) return f;
  auto driver = MakeSystemCompilerDriver(*LocalToolchain());
  const std::string dir = "/tmp/kiln-test-fixture-" + std::to_string(::getpid());
  EXPECT_TRUE(MakeDirs(dir).ok());
  auto so = BuildSharedObject(cell->source, programs.size() + cell->ranged_pieces.size(),
                              DefaultSmTarget(), "fixture", *driver, dir, 2, nullptr);
  EXPECT_TRUE(so.ok()) << so.status().ToString();
  if (!so.ok()) return f;
  auto lib = OpenCellBytes(*so, dir + "/load");
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  EXPECT_TRUE(lib.ok()) << lib.status().ToString();
  Envelope compiled;  // the classes, then the ranged pieces, as the entries were compiled
  for (size_t c : cell->entry_classes) compiled.classes.push_back(env.classes[c]);
  for (const auto& [r, piece] : cell->ranged_pieces) compiled.ranged.push_back(piece);
  auto entries = EntriesFromDescribe(cell->describe, compiled);
  EXPECT_TRUE(entries.ok()) << entries.status().ToString();
  if (!entries.ok()) return f;
  auto armed = ArmedCell::Arm(*lib, *entries, weights, Lane::kExported, "", 1);
  EXPECT_TRUE(armed.ok()) << armed.status().ToString();
  auto eager = Interpreter::Create(graph);
  EXPECT_TRUE(eager.ok());
  if (!armed.ok() || !eager.ok()) return f;
  f.cell = std::move(armed).value();
  f.eager = std::make_unique<Interpreter>(std::move(eager).value());
  f.source = cell->source;
  f.so = *so;
  return f;
}

// A ranged entry runs each point from an instance made for it at its first request and kept for
// the next (at most kMaxRangedInstances, the least recently used going first); every point matches
// eager; a point outside the range is refused as out_of_envelope, the cell staying armed; a
// rebind drops the instances, which hold the old weights' pointers.
TEST(MintLaws, ARangedEntryRunsEveryPointFromAnInstanceKeptPerPoint) {
  Target t = Load("mlp");
  RangedEntry ranged;
  ranged.inputs["x"] = {DimSpec{0, "batch"}, DimSpec{64, ""}};
  ranged.ranges["batch"] = {1, 48};
  Envelope env;
  env.ranged = {ranged};
  ArmedFixture f = Build(t.graph, t.weights, env, EmitOptions{});
  ASSERT_TRUE(f.cell);
  ASSERT_EQ(f.cell->entries().size(), 2u);  // batch 1, then [2, 48]
  auto inputs = [](int64_t batch) {
    std::vector<float> v(static_cast<size_t>(batch * 64));
    for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.37f * static_cast<float>(i));
    return TensorMap{{"x", Tensor::FromVector<float>({batch, 64}, v)}};
  };
  auto check = [&](int64_t batch, const WeightMap& weights) {
    const TensorMap in = inputs(batch);
    std::string why;
    const int entry = f.cell->Admit(in, &why);
    ASSERT_EQ(entry, batch == 1 ? 0 : 1) << why;
    auto got = f.cell->Run(entry, in);
    ASSERT_TRUE(got.ok()) << "batch " << batch << ": " << got.status().ToString();
    auto want = f.eager->Run(in, &weights);
    ASSERT_TRUE(want.ok());
    const EntryNumerics n = CompareOutputs(*want, *got, NumericsThresholds{});
    EXPECT_EQ(n.verdict, Verdict::kHealthy) << "batch " << batch << ": " << n.note;
  };
  const size_t points = ArmedCell::kMaxRangedInstances + 7;
  for (int64_t b = 1; b <= static_cast<int64_t>(points); ++b) check(b, t.weights);
  EXPECT_EQ(f.cell->ranged_instances_made(), points);
  EXPECT_EQ(f.cell->ranged_instances_kept(), ArmedCell::kMaxRangedInstances);
  check(static_cast<int64_t>(points), t.weights);  // the newest is kept: no new instance
  EXPECT_EQ(f.cell->ranged_instances_made(), points);
  check(2, t.weights);  // evicted long ago: made again
  EXPECT_EQ(f.cell->ranged_instances_made(), points + 1);

  std::string why;
  EXPECT_EQ(f.cell->Admit(inputs(49), &why), -1);
  EXPECT_NE(why.find("49"), std::string::npos) << why;
  auto past = f.cell->Run(1, inputs(49));
  ASSERT_FALSE(past.ok());
  EXPECT_TRUE(past.status().Is(kOutOfEnvelope)) << past.status().ToString();
  EXPECT_FALSE(f.cell->revoked());

  auto derived = DeriveCheckpoint(*t.graph, 7);
  ASSERT_TRUE(derived.ok());
  ASSERT_TRUE(f.cell->Rebind(*derived).ok());
  EXPECT_EQ(f.cell->ranged_instances_kept(), 0u);
  for (int64_t b : {1, 2, 17, 48}) check(b, *derived);
}

// An image side ranged on a step its strides divide: two stride-2 convolutions, a max pool and a
// global average pool over side 16, 32, ..., 80 (every stage exact in side / 16) compile as one
// ranged entry; every side and batch of the grid runs from its instance and matches eager, and a
// side between two of the grid's is refused naming the step (served eager by the worker).
TEST(MintLaws, ASteppedImageSideRunsEveryPointOfItsGrid) {
  testing::OnnxBuilder b(13);
  b.Input("img", testing::kFloat, {-1, 3, -1, -1}).Output("y", testing::kFloat, {-1, 8});
  std::vector<float> w1(8 * 3 * 3 * 3), w2(8 * 8 * 3 * 3);
  for (size_t i = 0; i < w1.size(); ++i) w1[i] = 0.2f * std::cos(0.7f * static_cast<float>(i));
  for (size_t i = 0; i < w2.size(); ++i) w2[i] = 0.1f * std::sin(0.3f * static_cast<float>(i));
  b.FloatInit("w1", {8, 3, 3, 3}, w1).FloatInit("w2", {8, 8, 3, 3}, w2);
  auto& c1 = b.Node("Conv", {"img", "w1"}, {"c1"});
  testing::OnnxBuilder::IntsAttr(c1, "strides", {2, 2});
  testing::OnnxBuilder::IntsAttr(c1, "pads", {1, 1, 1, 1});
  b.Node("Relu", {"c1"}, {"r1"});
  auto& pool = b.Node("MaxPool", {"r1"}, {"p1"});
  testing::OnnxBuilder::IntsAttr(pool, "kernel_shape", {3, 3});
  testing::OnnxBuilder::IntsAttr(pool, "strides", {2, 2});
  testing::OnnxBuilder::IntsAttr(pool, "pads", {1, 1, 1, 1});
  auto& c2 = b.Node("Conv", {"p1", "w2"}, {"c2"});
  testing::OnnxBuilder::IntsAttr(c2, "strides", {2, 2});
  testing::OnnxBuilder::IntsAttr(c2, "pads", {1, 1, 1, 1});
  b.Node("GlobalAveragePool", {"c2"}, {"g"});
  b.Node("Flatten", {"g"}, {"y"});
  auto imported = ImportOnnxBytes(b.Bytes(), "stepped");
  ASSERT_TRUE(imported.ok()) << imported.status().ToString();
  auto graph = std::make_shared<const Graph>(std::move(imported).value());
  const WeightMap weights = GraphWeights(*graph);
  RangedEntry ranged;
  ranged.inputs["img"] = {DimSpec{0, "batch"}, DimSpec{3, ""}, DimSpec{0, "side"},
                          DimSpec{0, "side"}};
  ranged.ranges["batch"] = {2, 3};
  ASSERT_TRUE(SetRangeSpec(&ranged, "side", {16, 80, 16}));
  Envelope env;
  env.ranged = {ranged};
  ArmedFixture f = Build(graph, weights, env, EmitOptions{});
  ASSERT_TRUE(f.cell);
  ASSERT_EQ(f.cell->entries().size(), 1u);
  auto inputs = [](int64_t batch, int64_t side) {
    std::vector<float> v(static_cast<size_t>(batch * 3 * side * side));
    for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.011f * static_cast<float>(i));
    return TensorMap{{"img", Tensor::FromVector<float>({batch, 3, side, side}, v)}};
  };
  for (int64_t batch : {2, 3}) {
    for (int64_t side = 16; side <= 80; side += 16) {
      const TensorMap in = inputs(batch, side);
      std::string why;
      ASSERT_EQ(f.cell->Admit(in, &why), 0) << why;
      auto got = f.cell->Run(0, in);
      ASSERT_TRUE(got.ok()) << side << ": " << got.status().ToString();
      auto want = f.eager->Run(in, &weights);
      ASSERT_TRUE(want.ok());
      const EntryNumerics n = CompareOutputs(*want, *got, NumericsThresholds{});
      EXPECT_EQ(n.verdict, Verdict::kHealthy)
          << "batch " << batch << " side " << side << ": " << n.note;
    }
  }
  std::string why;
  EXPECT_EQ(f.cell->Admit(inputs(2, 24), &why), -1);
  EXPECT_NE(why.find("not one of its declared values 16, 32, ..., 80 (step 16)"), std::string::npos)
      << why;
  auto off = f.cell->Run(0, inputs(2, 24));
  ASSERT_FALSE(off.ok());
  EXPECT_TRUE(off.status().Is(kOutOfEnvelope)) << off.status().ToString();
  EXPECT_FALSE(f.cell->revoked());
}

// Law 1: both checkpoints of an example give one key, and one cell serves both.
TEST(MintLaws, OneKeyAndOneCellServeBothCheckpoints) {
  Target t = Load("mlp");
  auto derived = DeriveCheckpoint(*t.graph, 7);
  ASSERT_TRUE(derived.ok());
  auto a = DeriveKeyAxes(*t.graph, MlpEnvelope(), "");
  Graph rebound = *t.graph;
  for (const auto& [n, w] : *derived) rebound.initializers[n] = w;
  auto b = DeriveKeyAxes(rebound, MlpEnvelope(), "");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*KeyFromAxes(*a), *KeyFromAxes(*b));

  auto m = MintCell(Request(t, MlpEnvelope(), "root/mlp"));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  AdmissionPolicy policy{m->key, DetectSmLevel(), LocalToolchain()->Block()};
  auto admitted = AdmitCell(m->tar, m->digest, m->tar.size(), policy);
  ASSERT_TRUE(admitted.ok()) << admitted.status().ToString();
  const std::string load_dir = "/tmp/kiln-test-law1-" + std::to_string(::getpid());
  auto cell = LoadAdmittedCell(*admitted, t.weights, Lane::kExported, load_dir, 1);
  std::error_code ec;
  std::filesystem::remove_all(load_dir, ec);  // the mapping outlives the file
  ASSERT_TRUE(cell.ok()) << cell.status().ToString();
  auto eager = Interpreter::Create(t.graph);
  ASSERT_TRUE(eager.ok());
  for (const WeightMap* w : {&t.weights, &*derived}) {
    ASSERT_TRUE((*cell)->Rebind(*w).ok());
    auto report = RunGate(**cell, *eager, *w, NumericsThresholds{});
    ASSERT_TRUE(report.ok());
    EXPECT_EQ(report->verdict, Verdict::kHealthy) << report->Summary();
  }
}

// Law 2: a cell with a weight baked into its code is refused by the fence proof, by name.
// Both halves of the fence catch it on their own: the structural scan finds the weight's values
// in the shared object, and with the scan off the perturbed checkpoints name it.
TEST(MintLaws, FenceRefusesABakedWeightByName) {
  Target t = Load("mlp");
  MintRequest r = Request(t, MlpEnvelope(), "root/mlp");
  const std::string victim = t.graph->WeightNames().back();
  r.compile.emit.bake_weight_for_test = victim;
  r.compile.emit.baked_value = t.weights.at(victim);
  auto m = MintCell(r);
  ASSERT_FALSE(m.ok()) << "a baked weight passed the fence";
  EXPECT_NE(m.status().message().find("fence_refused"), std::string::npos) << m.status().ToString();
  EXPECT_NE(m.status().message().find("'" + victim + "'"), std::string::npos)
      << m.status().ToString();

  ArmedFixture f = Build(t.graph, t.weights, MlpEnvelope(), r.compile.emit);
  ASSERT_TRUE(f.cell != nullptr);
  FenceOptions no_scan;
  no_scan.structural_scan = false;
  auto measured = RunFenceProof(*f.cell, *f.eager, t.weights, NumericsThresholds{}, CellArtifacts{},
                                {}, no_scan);
  ASSERT_FALSE(measured.ok()) << "the perturbed checkpoints did not catch a baked weight";
  EXPECT_EQ(measured.status().message().rfind(
                "fence_refused: the cell does not follow weight '" + victim + "'", 0),
            0u)
      << measured.status().ToString();
  auto scanned = RunFenceProof(*f.cell, *f.eager, t.weights, NumericsThresholds{},
                               CellArtifacts{f.source, f.so}, {});
  ASSERT_FALSE(scanned.ok());
  EXPECT_NE(scanned.status().message().find("'" + victim + "'"), std::string::npos);
  EXPECT_NE(scanned.status().message().find("appears in the cell's shared object"),
            std::string::npos)
      << scanned.status().ToString();
}

// A model whose weights have domains: BatchNormalization with small running variances (noise of
// half their RMS turned some negative), and a LayerNorm decomposed with Pow(d, 2) (an exponent of
// 2.3 on negative bases is NaN). Eager went non-finite under the old perturbation and the fence
// called it a baked weight; each weight now moves inside its domain and the mint is proven by
// measurement.
TEST(MintLaws, FenceMeasuresWeightsInsideTheirDomains) {
  testing::OnnxBuilder b(11);
  constexpr int64_t kC = 16;
  b.Input("x", testing::kFloat, {1, kC, 6, 6}).Output("y", testing::kFloat, {1, kC, 6, 6});
  std::vector<float> gamma(kC), beta(kC), mean_v(kC), var_v(kC);
  for (int64_t c = 0; c < kC; ++c) {
    gamma[c] = 0.8f + 0.03f * static_cast<float>(c);
    beta[c] = 0.02f * static_cast<float>(c % 5) - 0.04f;
    mean_v[c] = 0.01f * static_cast<float>(c % 7) - 0.03f;
    // Running variances spread over four decades, as trained BatchNorms have them (nearly dead
    // channels beside live ones): noise scaled to their RMS turns the small ones negative.
    var_v[c] = c == kC - 1 ? 1.0f : 0.0001f * (1.0f + 0.2f * static_cast<float>(c));
  }
  b.FloatInit("bn.weight", {kC}, gamma);
  b.FloatInit("bn.bias", {kC}, beta);
  b.FloatInit("bn.running_mean", {kC}, mean_v);
  b.FloatInit("bn.running_var", {kC}, var_v);
  b.Node("BatchNormalization", {"x", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var"},
         {"h"}, "bn");
  auto& mean = b.Node("ReduceMean", {"h"}, {"m"}, "mean");
  testing::OnnxBuilder::IntsAttr(mean, "axes", {-1});
  b.Node("Sub", {"h", "m"}, {"d"}, "sub");
  b.FloatConstant("ln.two", {}, {2.0f});
  b.Node("Pow", {"d", "ln.two"}, {"p"}, "pow");
  auto& var = b.Node("ReduceMean", {"p"}, {"v"}, "var");
  testing::OnnxBuilder::IntsAttr(var, "axes", {-1});
  b.FloatConstant("ln.eps", {}, {1e-5f});
  b.Node("Add", {"v", "ln.eps"}, {"ve"}, "add_eps");
  b.Node("Sqrt", {"ve"}, {"sd"}, "sqrt");
  b.Node("Div", {"d", "sd"}, {"n"}, "div");
  b.FloatInit("ln.gamma", {6}, {1.0f, 0.5f, 1.5f, 1.2f, 0.8f, 1.1f});
  b.Node("Mul", {"n", "ln.gamma"}, {"y"}, "gamma");
  auto g = ImportOnnxBytes(b.Bytes(), "domains");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  Target t;
  t.graph = std::make_shared<const Graph>(std::move(g).value());
  t.weights = GraphWeights(*t.graph);
  // The old perturbation (additive, half the RMS) leaves the domain: eager itself is NaN.
  auto old = DeriveCheckpoint(*t.graph, 0x6b696c6e, 0.5);
  ASSERT_TRUE(old.ok());
  auto eager = Interpreter::Create(t.graph);
  ASSERT_TRUE(eager.ok());
  std::vector<float> xv(kC * 36);
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = std::sin(0.37f * static_cast<float>(i));
  TensorMap x{{"x", Tensor::FromVector<float>({1, kC, 6, 6}, xv)}};
  auto under_old = eager->Run(x, &*old);
  ASSERT_TRUE(under_old.ok());
  bool nan = false;
  for (int64_t i = 0; i < under_old->at("y").numel(); ++i) {
    nan = nan || std::isnan(under_old->at("y").GetAsDouble(i));
  }
  EXPECT_TRUE(nan) << "the old perturbation no longer leaves the domain: the test shows nothing";
  auto m = MintCell(Request(t, Envelope{{{{"x", {1, kC, 6, 6}}}}}, "root/domains"));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->fence.measured, m->fence.weights) << m->fence.Summary();
  EXPECT_TRUE(m->fence.structural.empty()) << m->fence.Summary();
  // The first perturbed checkpoint (the largest scale) already stayed inside every domain.
  EXPECT_EQ(m->fence.perturbed_runs, 1) << m->fence.Summary();
}

// A weight every perturbation takes out of its domain (sqrt(w - 1) with each w just above 1)
// measures nothing; it is proven by the structural scan instead (its values are distinctive).
// A scalar in that role (sqrt(s - 1) + sqrt(1 - s), s = 1) cannot be scanned either: the mint is
// refused as unmeasurable, never as a baked weight.
TEST(MintLaws, FenceProvesStructurallyOrRefusesAsUnmeasurableNeverAsBaked) {
  auto model = [](bool scalar) {
    testing::OnnxBuilder b(13);
    b.Input("x", testing::kFloat, {2, 8}).Output("y", testing::kFloat, {2, 8});
    b.Int64Init("one_i", {}, {1});
    auto& cast = b.Node("Cast", {"one_i"}, {"one"}, "one");
    testing::OnnxBuilder::IntAttr(cast, "to", onnx::TensorProto::FLOAT);
    if (scalar) {
      b.FloatInit("s", {}, {1.0f});
      b.Node("Sub", {"s", "one"}, {"a"}, "a");
      b.Node("Sub", {"one", "s"}, {"c"}, "c");
      b.Node("Sqrt", {"a"}, {"ra"}, "ra");
      b.Node("Sqrt", {"c"}, {"rc"}, "rc");
      b.Node("Add", {"ra", "rc"}, {"r"}, "r");
    } else {
      b.FloatInit("w", {8},
                  {1.0013f, 1.0021f, 1.0034f, 1.0042f, 1.0057f, 1.0065f, 1.0078f, 1.0089f});
      b.Node("Sub", {"w", "one"}, {"a"}, "a");
      b.Node("Sqrt", {"a"}, {"r"}, "r");
    }
    b.FloatInit("scale", {8}, {0.3f, -0.2f, 0.7f, 0.1f, -0.9f, 0.4f, 0.25f, -0.6f});
    b.Node("Mul", {"x", "scale"}, {"xs"}, "xs");
    b.Node("Add", {"xs", "r"}, {"y"}, "y");
    auto g = ImportOnnxBytes(b.Bytes(), scalar ? "scalar" : "vector");
    EXPECT_TRUE(g.ok()) << g.status().ToString();
    Target t;
    t.graph = std::make_shared<const Graph>(std::move(g).value());
    t.weights = GraphWeights(*t.graph);
    return t;
  };
  Target vec = model(false);
  auto m = MintCell(Request(vec, Envelope{{{{"x", {2, 8}}}}}, "root/structural"));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->fence.structural, std::vector<std::string>{"w"}) << m->fence.Summary();
  EXPECT_EQ(m->fence.measured, m->fence.weights - 1) << m->fence.Summary();

  Target sc = model(true);
  auto r = MintCell(Request(sc, Envelope{{{{"x", {2, 8}}}}}, "root/unmeasurable"));
  ASSERT_FALSE(r.ok()) << "a weight nothing can measure was sealed";
  EXPECT_EQ(r.status().message().rfind("unmeasurable: fence: weight 's'", 0), 0u)
      << r.status().ToString();
  EXPECT_EQ(r.status().message().find("baked"), std::string::npos) << r.status().ToString();
}

// Integer probes stay inside the table an input indexes: a model whose token ids look up a
// 5-row embedding (through a Cast) is probed with ids in [0, 5), so its mint is measured and
// HEALTHY instead of failing on an out-of-range id the model would never see.
TEST(MintLaws, IntegerProbesStayInsideTheTableTheyIndex) {
  testing::OnnxBuilder b;
  b.Input("ids", onnx::TensorProto::INT32, {2, 3}).Output("y", testing::kFloat, {2, 3, 4});
  std::vector<float> table(20);
  for (size_t i = 0; i < table.size(); ++i) table[i] = 0.1f * static_cast<float>(i);
  b.FloatInit("embedding", {5, 4}, table);
  auto& cast = b.Node("Cast", {"ids"}, {"ids64"});
  testing::OnnxBuilder::IntAttr(cast, "to", onnx::TensorProto::INT64);
  b.Node("Gather", {"embedding", "ids64"}, {"y"});
  auto g = ImportOnnxBytes(b.Bytes(), "embedding");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  Target t;
  t.graph = std::make_shared<const Graph>(std::move(g).value());
  t.weights = GraphWeights(*t.graph);
  EXPECT_EQ(ProbeIntBounds(*t.graph), (ProbeBounds{{"ids", {5}}}));
  EntryMetadata e;
  e.inputs.push_back({"ids", DType::kInt32, {64}});
  auto probe = ProbeInputs(e, Lane::kExported, 0, ProbeIntBounds(*t.graph));
  ASSERT_TRUE(probe.ok());
  for (int64_t i = 0; i < 64; ++i) {
    EXPECT_GE(probe->at("ids").data<int32_t>()[i], 0);
    EXPECT_LT(probe->at("ids").data<int32_t>()[i], 5);
  }
  auto m = MintCell(Request(t, Envelope{{{{"ids", {2, 3}}}}}, "root/embedding"));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->gate.verdict, Verdict::kHealthy) << m->gate.Summary();
}

// Index inputs of every index-consuming op stay inside what they index, with extents from the
// shape class (the data is a runtime input here, not a table the graph binds): GatherElements
// and ScatterElements along their axis, GatherND and ScatterND per index column, OneHot below a
// constant depth; bools stay bools; an unbounded integer scalar is a count, drawn from [1, 8).
TEST(MintLaws, ProbesStayInsideWhatEveryIndexOpIndexes) {
  testing::OnnxBuilder b(17);
  b.Input("data", testing::kFloat, {-1, 6})
      .Input("ge_idx", onnx::TensorProto::INT64, {2, 6})
      .Input("nd_idx", onnx::TensorProto::INT64, {5, 2})
      .Input("sc_idx", onnx::TensorProto::INT32, {2, 6})
      .Input("sc_upd", testing::kFloat, {2, 6})
      .Input("hot", onnx::TensorProto::INT64, {7})
      .Input("mask", onnx::TensorProto::BOOL, {3, 6})
      .Input("steps", onnx::TensorProto::INT64, {});
  testing::OnnxBuilder::IntAttr(b.Node("GatherElements", {"data", "ge_idx"}, {"ge"}), "axis", 0);
  b.Node("GatherND", {"data", "nd_idx"}, {"nd"});
  auto& cast = b.Node("Cast", {"sc_idx"}, {"sc_idx64"});
  testing::OnnxBuilder::IntAttr(cast, "to", onnx::TensorProto::INT64);
  testing::OnnxBuilder::IntAttr(b.Node("ScatterElements", {"data", "sc_idx64", "sc_upd"}, {"sc"}),
                                "axis", 1);
  b.Int64Init("depth", {}, {4});
  b.FloatInit("onoff", {2}, {0.0f, 1.0f});
  b.Node("OneHot", {"hot", "depth", "onoff"}, {"oh"});
  for (const char* o : {"ge", "nd", "sc", "oh"}) b.Output(o, testing::kFloat, {});
  auto g = ImportOnnxBytes(b.Bytes(), "index_ops");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const ShapeClass cls{{"data", {3, 6}},   {"ge_idx", {2, 6}}, {"nd_idx", {5, 2}},
                       {"sc_idx", {2, 6}}, {"sc_upd", {2, 6}}, {"hot", {7}},
                       {"mask", {3, 6}},   {"steps", {}}};
  const ProbeBounds bounds = ProbeIntBounds(*g, cls);
  EXPECT_EQ(bounds.at("ge_idx"), std::vector<int64_t>{3});       // data's rows (axis 0)
  EXPECT_EQ(bounds.at("nd_idx"), (std::vector<int64_t>{3, 6}));  // one bound per column
  EXPECT_EQ(bounds.at("sc_idx"), std::vector<int64_t>{6});       // through the Cast, axis 1
  EXPECT_EQ(bounds.at("hot"), std::vector<int64_t>{4});
  EXPECT_FALSE(bounds.count("steps"));
  EntryMetadata e;
  for (const auto& [name, shape] : cls) {
    const ValueInfo* v = g->FindInput(name);
    ASSERT_NE(v, nullptr);
    e.inputs.push_back({name, v->dtype, shape});
  }
  for (uint64_t salt = 0; salt < 4; ++salt) {
    auto probe = ProbeInputs(e, Lane::kExported, salt, bounds);
    ASSERT_TRUE(probe.ok()) << probe.status().ToString();
    auto all_in = [&](const std::string& name, std::vector<int64_t> hi) {
      const Tensor& t = probe->at(name);
      for (int64_t i = 0; i < t.numel(); ++i) {
        const int64_t v = t.GetAsInt64(i);
        EXPECT_GE(v, 0) << name;
        EXPECT_LT(v, hi[static_cast<size_t>(i) % hi.size()]) << name << " [" << i << "]";
      }
    };
    all_in("ge_idx", {3});
    all_in("nd_idx", {3, 6});
    all_in("sc_idx", {6});
    all_in("hot", {4});
    all_in("mask", {2});
    const int64_t steps = probe->at("steps").GetAsInt64(0);
    EXPECT_GE(steps, 1);
    EXPECT_LT(steps, 8);
  }
}

// Law 5: the strict gate refuses the gray band and below the floor; nothing reaches the store.
TEST(MintLaws, GateRefusesGrayBandAndDestroyedAndNothingIsStored) {
  Target t = Load("mlp");
  const std::string root = "/tmp/kiln-test-store-" + std::to_string(::getpid());
  LocalStore store(root);
  struct Case {
    double scale;
    const char* verdict;
  };
  for (const Case& c : {Case{1.01, "DEGRADED"}, Case{-1.0, "DESTROYED"}}) {
    MintRequest r = Request(t, MlpEnvelope(), "root/mlp");
    r.compile.emit.test_output_scale = c.scale;
    auto m = MintCell(r);
    ASSERT_FALSE(m.ok()) << "scale " << c.scale << " was sealed";
    EXPECT_NE(m.status().message().find("numerics_refused"), std::string::npos);
    EXPECT_NE(m.status().message().find(c.verdict), std::string::npos) << m.status().ToString();
  }
  EXPECT_TRUE(store.Keys().empty());
  std::error_code ec;
  std::filesystem::remove_all(root, ec);
}

// Law 15 and 6: two mints of one key in different directories give byte-identical cells, and the
// sealed shared object is the one that was proven (its bytes are in the tar).
TEST(MintLaws, TwoMintsAreByteIdentical) {
  Target t = Load("mlp");
  MintRequest r1 = Request(t, MlpEnvelope(), "root/mlp");
  MintRequest r2 = r1;
  r1.work_dir = "/tmp/kiln-test-repro-a-" + std::to_string(::getpid());
  r2.work_dir = "/tmp/kiln-test-repro-b-" + std::to_string(::getpid()) + "/deeper/path";
  auto a = MintCell(r1), b = MintCell(r2);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->key, b->key);
  EXPECT_EQ(a->digest, b->digest);
  EXPECT_TRUE(a->tar == b->tar);
  auto files = UnpackCell(a->tar, "minted");
  ASSERT_TRUE(files.ok());
  auto proven = ReadFile(r1.work_dir + "/proof/cell.so");
  ASSERT_TRUE(proven.ok());
  EXPECT_TRUE(files->shared_object == *proven) << "sealed bytes differ from the proven bytes";
  std::error_code ec;
  std::filesystem::remove_all(r1.work_dir, ec);
  std::filesystem::remove_all("/tmp/kiln-test-repro-b-" + std::to_string(::getpid()), ec);
}

}  // namespace
}  // namespace kiln
