// Pass tests: each pass on a small graph, checked on the Program it leaves (kernels, fusion
// labels, memory plan invariants) and on the pipeline runner's naming, skipping and dumping.
#include "src/kiln/compile/passes.h"

#include <gtest/gtest.h>

#include <set>
#include <sstream>

#include "src/kiln/compile/pipeline.h"
#include "src/kiln/graph/onnx_import.h"
#include "src/kiln/runtime/cell_abi.h"
#include "tests/graph/onnx_builder.h"

namespace kiln {
namespace {

using testing::kFloat;
using testing::kInt64;
using testing::OnnxBuilder;

// y = Relu(Conv(x) + x) * 2, z = Sigmoid(Reshape(y)); plus a dead Neg branch.
Graph SmallNet() {
  OnnxBuilder b;
  b.Input("x", kFloat, {1, 4, 8, 8}).Output("z", kFloat, {1, 256});
  b.FloatInit("w", {4, 4, 3, 3}, std::vector<float>(144, 0.01f));
  b.FloatConstant("two", {}, {2.0f});
  b.Int64Init("shape", {2}, {1, 256});
  auto& conv = b.Node("Conv", {"x", "w"}, {"c"}, "conv");
  OnnxBuilder::IntsAttr(conv, "pads", {1, 1, 1, 1});
  b.Node("Add", {"c", "x"}, {"r"});
  b.Node("Relu", {"r"}, {"a"});
  b.Node("Mul", {"a", "two"}, {"y"});
  b.Node("Reshape", {"y", "shape"}, {"f"});
  b.Node("Sigmoid", {"f"}, {"z"});
  b.Node("Neg", {"x"}, {"dead"});
  auto g = ImportOnnxBytes(b.Bytes(), "small");
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return *g;
}

std::vector<std::string> Labels(const Program& p) {
  std::vector<std::string> out;
  for (const Kernel& k : p.kernels) out.push_back(k.label);
  return out;
}

TEST(Passes, DeadCodeRemovesUnreachableNodesButKeepsWeights) {
  Graph g = SmallNet();
  ASSERT_TRUE(SpecializeToClass(g, {{"x", {1, 4, 8, 8}}}).ok());
  ASSERT_TRUE(EliminateDeadNodes(g).ok());
  for (const Node& n : g.nodes) EXPECT_NE(n.op_type, "Neg");
  EXPECT_TRUE(g.IsWeight("w"));
  EXPECT_TRUE(g.IsWeight("two"));
}

TEST(Passes, SpecializeRefusesAClassThatDoesNotFit) {
  Graph g = SmallNet();
  Status s = SpecializeToClass(g, {{"x", {1, 4, 8}}});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("'x'"), std::string::npos) << s.ToString();
  Graph h = SmallNet();
  Status t = SpecializeToClass(h, {{"y", {1}}});
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.message().find("'y'"), std::string::npos);
}

TEST(Passes, LowerFuseAndPlan) {
  Graph g = SmallNet();
  ASSERT_TRUE(SpecializeToClass(g, {{"x", {1, 4, 8, 8}}}).ok());
  ASSERT_TRUE(FoldStructuralConstants(g).ok());
  ASSERT_TRUE(EliminateDeadNodes(g).ok());
  auto p = LowerToProgram(g);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(Labels(*p), (std::vector<std::string>{"Conv", "Add", "Relu", "Mul", "Sigmoid"}));
  ASSERT_TRUE(FuseConvEpilogues(*p).ok());
  EXPECT_EQ(Labels(*p), (std::vector<std::string>{"Conv+Add+Relu", "Mul", "Sigmoid"}));
  ASSERT_TRUE(FuseElementwise(*p).ok());
  // The Reshape between Mul and Sigmoid is a view, but shapes differ, so two loops remain.
  EXPECT_EQ(Labels(*p), (std::vector<std::string>{"Conv+Add+Relu", "Mul", "Sigmoid"}));
  ASSERT_TRUE(PlanMemory(*p).ok());
  EXPECT_TRUE(p->Verify().ok());
  // The conv output dies at Mul, so Mul writes over it: one 1 KiB buffer in the workspace.
  EXPECT_EQ(p->workspace_bytes, 1024);
}

TEST(Passes, ConvLayoutIsChosenPerGeometry) {
  OnnxBuilder b;
  b.Input("x", kFloat, {1, 8, 6, 6}).Output("z", kFloat, {1, 4, 6, 6});
  b.FloatInit("w3", {8, 8, 3, 3}, std::vector<float>(576, 0.01f));
  b.FloatInit("w1", {4, 8, 1, 1}, std::vector<float>(32, 0.1f));
  auto& c3 = b.Node("Conv", {"x", "w3"}, {"y"}, "c3");
  OnnxBuilder::IntsAttr(c3, "pads", {1, 1, 1, 1});
  b.Node("Conv", {"y", "w1"}, {"z"}, "c1");
  auto g = ImportOnnxBytes(b.Bytes(), "layouts");
  ASSERT_TRUE(g.ok());
  auto p = LowerToProgram(*g);
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE(ChooseConvLayout(*p).ok());
  EXPECT_EQ(p->kernels[0].conv_layout, KILN_CONV_LAYOUT_BLOCKED);
  EXPECT_EQ(p->kernels[1].conv_layout, KILN_CONV_LAYOUT_PLAIN);
  EXPECT_EQ(Labels(*p), (std::vector<std::string>{"Conv[blocked]", "Conv[plain]"}));
}

TEST(Passes, ElementwiseChainsBecomeOneLoop) {
  OnnxBuilder b;
  b.Input("x", kFloat, {2, 8}).Input("bias", kFloat, {8}).Output("y", kFloat, {2, 8});
  b.Node("Add", {"x", "bias"}, {"a"});
  b.Node("Sigmoid", {"a"}, {"s"});
  b.Node("Mul", {"a", "s"}, {"y"});  // SiLU: `a` is read twice inside the chain
  auto g = ImportOnnxBytes(b.Bytes(), "silu");
  ASSERT_TRUE(g.ok());
  auto p = LowerToProgram(*g);
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE(FuseElementwise(*p).ok());
  EXPECT_EQ(Labels(*p), (std::vector<std::string>{"Add+Sigmoid+Mul"}));
  EXPECT_EQ(p->kernels[0].outputs.size(), 1u) << "intermediates stay in registers";
}

TEST(Passes, MemoryPlanNeverOverlapsLiveBuffers) {
  // A diamond: two branches alive at once must not share memory.
  OnnxBuilder b;
  b.Input("x", kFloat, {64, 64}).Output("y", kFloat, {64, 64});
  b.FloatInit("w", {64, 64}, std::vector<float>(4096, 0.1f));
  b.Node("MatMul", {"x", "w"}, {"m"});
  b.Node("Transpose", {"m"}, {"t"});
  b.Node("MatMul", {"m", "w"}, {"n"});
  b.Node("Add", {"t", "n"}, {"y"});
  auto g = ImportOnnxBytes(b.Bytes(), "diamond");
  ASSERT_TRUE(g.ok());
  auto p = LowerToProgram(*g);
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE(PlanMemory(*p).ok());
  // m, t, n are live together at the last MatMul: three distinct 16 KiB regions.
  std::set<int64_t> offsets;
  for (const Buffer& buf : p->buffers) {
    if (buf.offset >= 0) offsets.insert(buf.offset);
  }
  EXPECT_EQ(offsets.size(), 3u) << p->Dump();
  EXPECT_EQ(p->workspace_bytes, 3 * 16384);
}

TEST(Pipeline, NamesTimesSkipsAndDumps) {
  Graph g = SmallNet();
  std::ostringstream dump;
  CompileOptions options;
  options.dump = &dump;
  options.disabled_passes = {"fuse-elementwise"};
  std::vector<PassTiming> timings;
  auto p = CompileEntry(g, {{"x", {1, 4, 8, 8}}}, 0, options, &timings);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  std::vector<std::string> ran;
  for (const PassTiming& t : timings) ran.push_back(t.pass);
  EXPECT_EQ(ran, (std::vector<std::string>{"specialize", "fold-structural", "decompose-batch-norm",
                                           "dead-code", "lower", "fuse-conv-epilogue",
                                           "fuse-group-norm", "fuse-library-epilogue",
                                           "fold-gemm-bias", "fold-gemm-gelu", "fuse-attention",
                                           "choose-conv-layout", "plan-layout", "plan-memory"}));
  EXPECT_NE(dump.str().find("== entry0 after fold-structural"), std::string::npos);
  EXPECT_NE(dump.str().find("(unchanged)"), std::string::npos) << dump.str();
  options.disabled_passes = {"no-such-pass"};
  auto bad = CompileEntry(g, {{"x", {1, 4, 8, 8}}}, 0, options, nullptr);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("no-such-pass"), std::string::npos);
}

}  // namespace
}  // namespace kiln
