// End-to-end mint tests: compile every example class into a cell, prove it, and check the laws
// the mint owns (1, 2, 5, 6, 15) with tests that fail when a law breaks.
#include <gtest/gtest.h>

#include <cmath>

#include "src/kiln/cell/admission.h"
#include "src/kiln/cell/mint.h"
#include "src/kiln/cell/pack.h"
#include "src/kiln/graph/onnx_import.h"
#include "src/kiln/tensor/npy.h"

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

}  // namespace
}  // namespace kiln
