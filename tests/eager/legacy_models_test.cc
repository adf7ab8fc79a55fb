// Real-world shapes: models exported by torch.onnx.export at legacy opsets (attributes that
// later became inputs: Slice, Pad, Split, Squeeze/Unsqueeze, ReduceSum at opset 9 and 11;
// Upsample at 9), an If on an input-dependent condition and a for-loop (torch.jit.script), and a
// graph whose weights all live in Constant nodes. Each runs eagerly against torch's outputs; the
// If, the loop and the Constant-weights graph are also minted (strict gate and fence).
// Fixtures: tests/data/legacy/, made by tools/make_legacy_models.py.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "src/kiln/eager/interpreter.h"
#include "src/kiln/graph/checkpoint.h"
#include "src/kiln/graph/onnx_import.h"
#include "src/kiln/mint/mint.h"
#include "src/kiln/tensor/npy.h"

namespace kiln {
namespace {

const std::string kDir = std::string(KILN_SOURCE_DIR) + "/tests/data/legacy/";

TensorMap ReadDir(const std::string& dir) {
  TensorMap out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    auto t = ReadNpy(e.path().string());
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    if (t.ok()) out[e.path().stem().string()] = *t;
  }
  return out;
}

std::shared_ptr<const Graph> Load(const std::string& name) {
  auto g = ImportOnnxFile(kDir + name + "/model.onnx");
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  if (!g.ok()) return nullptr;
  return std::make_shared<const Graph>(std::move(g).value());
}

// Runs every input set of a fixture and compares with torch's outputs.
void RunFixture(const std::string& name) {
  SCOPED_TRACE(name);
  auto g = Load(name);
  ASSERT_NE(g, nullptr);
  auto interp = Interpreter::Create(g);
  ASSERT_TRUE(interp.ok()) << interp.status().ToString();
  int sets = 0;
  for (const std::string suffix : {"", "_0", "_1"}) {
    if (!std::filesystem::exists(kDir + name + "/inputs" + suffix)) continue;
    ++sets;
    TensorMap inputs = ReadDir(kDir + name + "/inputs" + suffix);
    TensorMap want = ReadDir(kDir + name + "/outputs" + suffix);
    auto got = interp->Run(inputs);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    for (const auto& [out, w] : want) {
      const Tensor& t = got->at(out);
      ASSERT_EQ(t.shape(), w.shape()) << out;
      for (int64_t i = 0; i < w.numel(); ++i) {
        ASSERT_NEAR(t.GetAsDouble(i), w.GetAsDouble(i), 1e-4) << out << " element " << i;
      }
    }
  }
  EXPECT_GT(sets, 0);
}

TEST(LegacyModels, Opset9AttributeFormsRunLikeTorch) { RunFixture("legacy_opset9"); }
TEST(LegacyModels, Opset11InputFormsRunLikeTorch) { RunFixture("legacy_opset11"); }
TEST(LegacyModels, ScriptedIfOnAnInputDependentConditionTakesBothBranches) {
  RunFixture("if_opset11");
  auto g = Load("if_opset11");
  ASSERT_NE(g, nullptr);
  bool has_if = false;
  for (const Node& n : g->nodes) has_if = has_if || n.op_type == "If";
  EXPECT_TRUE(has_if);
  // The two input sets take different branches: their sums have opposite signs.
  const Tensor a = ReadDir(kDir + "if_opset11/inputs_0").at("x");
  const Tensor b = ReadDir(kDir + "if_opset11/inputs_1").at("x");
  double sa = 0, sb = 0;
  for (int64_t i = 0; i < a.numel(); ++i) sa += a.GetAsDouble(i);
  for (int64_t i = 0; i < b.numel(); ++i) sb += b.GetAsDouble(i);
  EXPECT_GT(sa * -sb, 0);
}

TEST(LegacyModels, ScriptedForLoopRunsEagerAndMintsThroughTheHost) {
  RunFixture("loop_opset11");
  auto g = Load("loop_opset11");
  ASSERT_NE(g, nullptr);
  MintRequest r;
  r.graph = g;
  r.envelope = Envelope{{{{"x", {5, 2, 3}}}}};
  r.family = "test/legacy";
  r.weights = GraphWeights(*g);
  auto m = MintCell(r);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->gate.verdict, Verdict::kHealthy) << m->gate.Summary();
  EXPECT_TRUE(m->metadata.fence.perturbed_checkpoint_matched);
}

TEST(LegacyModels, WeightsInConstantNodesAreBoundAndMintedPerDynamicClass) {
  RunFixture("constant_weights_opset11");
  auto g = Load("constant_weights_opset11");
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->WeightNames().size(), 4u) << "two Gemm weights and biases, all Constant nodes";
  MintRequest r;
  r.graph = g;
  // The exporter fixed the batch dim; classes are what the graph declares.
  r.envelope = Envelope{{{{"x", {2, 6}}}}};
  r.family = "test/legacy";
  r.weights = GraphWeights(*g);
  auto m = MintCell(r);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->gate.verdict, Verdict::kHealthy) << m->gate.Summary();
  EXPECT_TRUE(m->metadata.fence.perturbed_checkpoint_matched);
  EXPECT_EQ(m->metadata.entries[0].constants.size(), 4u);
}

TEST(LegacyModels, ScriptedIfMintsAndServesCompiled) {
  auto g = Load("if_opset11");
  ASSERT_NE(g, nullptr);
  MintRequest r;
  r.graph = g;
  r.envelope = Envelope{{{{"x", {2, 4}}}}};
  r.family = "test/legacy";
  r.weights = GraphWeights(*g);
  auto m = MintCell(r);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->gate.verdict, Verdict::kHealthy) << m->gate.Summary();
}

}  // namespace
}  // namespace kiln
