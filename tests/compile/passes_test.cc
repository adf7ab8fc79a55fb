// Pass tests: each pass on a small graph, checked on the Program it leaves (kernels, fusion
// labels, memory plan invariants) and on the pipeline runner's naming, skipping and dumping.
#include "src/kiln/compile/passes.h"

#include <gtest/gtest.h>

#include <limits>
#include <set>
#include <sstream>

#include "src/kiln/abi/cell_abi.h"
#include "src/kiln/compile/elementwise_table.h"
#include "src/kiln/compile/pipeline.h"
#include "src/kiln/graph/onnx_import.h"
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

// The code generator's fusable ops are the op library's own rows: each is a registered op form,
// each prints a C expression, and its attribute defaults are the eager kernels' (LeakyRelu's
// alpha 0.01, HardSigmoid's 0.2 and 0.5, Clip-6's float range).
TEST(ElementwiseTable, ComesFromTheOpDefinitions) {
  ASSERT_FALSE(FusableElementwiseOps().empty());
  for (const FusableElementwise& row : FusableElementwiseOps()) {
    SCOPED_TRACE(row.op_type);
    EXPECT_TRUE(OpRegistry::Global().Find("", row.op_type, row.since_version).ok());
    Node n;
    n.op_type = row.op_type;
    std::vector<int> operands(static_cast<size_t>(row.fusion.max_inputs), 0);
    auto e = MakeExpr(n, row.since_version, operands, DType::kFloat32);
    ASSERT_TRUE(e.ok());
    EXPECT_EQ(e->params.size(), static_cast<size_t>(row.fusion.num_params));
    const std::vector<std::string> args(operands.size(), "x");
    EXPECT_EQ(FormatExpr(*e, args).find("unknown op"), std::string::npos);
  }
  auto params = [](const char* op, int64_t opset) {
    Node n;
    n.op_type = op;
    auto e = MakeExpr(n, opset, {0}, DType::kFloat32);
    return e.ok() ? e->params : std::vector<float>{};
  };
  EXPECT_EQ(params("LeakyRelu", 16), (std::vector<float>{0.01f}));
  EXPECT_EQ(params("HardSigmoid", 6), (std::vector<float>{0.2f, 0.5f}));
  EXPECT_EQ(params("Clip", 6), (std::vector<float>{std::numeric_limits<float>::lowest(),
                                                   std::numeric_limits<float>::max()}));
  EXPECT_TRUE(params("Clip", 13).empty());
  // Clip's attribute form takes one input; its input form up to three.
  Node clip;
  clip.op_type = "Clip";
  const TensorType f{DType::kFloat32, {4}}, s{DType::kFloat32, {}};
  EXPECT_EQ(LookupElementwise(clip, 6, {f, s, s}, {f}), nullptr);
  EXPECT_NE(LookupElementwise(clip, 6, {f}, {f}), nullptr);
  EXPECT_NE(LookupElementwise(clip, 13, {f, s, s}, {f}), nullptr);
  Node round;
  round.op_type = "Round";  // registered, not fusable
  EXPECT_EQ(LookupElementwise(round, 13, {f}, {f}), nullptr);
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
