// End-to-end mint tests: compile every example class into a cell, prove it, and check the laws
// the mint owns (1, 2, 5, 6, 15) with tests that fail when a law breaks.
#include "src/kiln/cell/mint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "src/kiln/base/file.h"
#include "src/kiln/cell/admission.h"
#include "src/kiln/cell/pack.h"
#include "src/kiln/cell/store.h"
#include "src/kiln/compile/toolchain.h"
#include "src/kiln/graph/onnx_import.h"
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

Envelope MlpEnvelope() { return Envelope{{{{"x", {1, 64}}}, {{"x", {4, 64}}}}}; }

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
