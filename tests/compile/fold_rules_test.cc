// Which operands the library-call folds may take (fold-gemm-bias, fuse-library-epilogue), on the
// Programs they leave: a bias moves into a GEMM's library call only when it is bound data (a
// weight or a structural constant) and the call has no bias of its own; a tensor computed at run
// time stays in the epilogue whatever its shape says ([1, N] at batch 1 looks like a bias).
#include <gtest/gtest.h>

#include "src/kiln/compile/passes.h"
#include "src/kiln/graph/onnx_import.h"
#include "tests/graph/onnx_builder.h"

namespace kiln {
namespace {

using testing::kFloat;
using testing::OnnxBuilder;

// The labels after lowering and the fusion passes up to fold-gemm-bias.
std::vector<std::string> FoldedLabels(OnnxBuilder& b, const ShapeClass& cls) {
  auto g = ImportOnnxBytes(b.Bytes(), "fold");
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_TRUE(SpecializeToClass(*g, cls).ok());
  EXPECT_TRUE(FoldStructuralConstants(*g).ok());
  auto p = LowerToProgram(*g);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_TRUE(FuseElementwise(*p).ok());
  EXPECT_TRUE(FuseLibraryEpilogues(*p).ok());
  EXPECT_TRUE(FoldGemmBias(*p).ok());
  EXPECT_TRUE(p->Verify().ok());
  std::vector<std::string> out;
  for (const Kernel& k : p->kernels) out.push_back(k.label);
  return out;
}

std::vector<float> Ones(size_t n) { return std::vector<float>(n, 0.5f); }

// y = MatMul(x, W) + b with b a weight [N]: the library adds it.
TEST(FoldRules, AWeightBiasMovesIntoTheMatmul) {
  OnnxBuilder b;
  b.Input("x", kFloat, {1, 8}).Output("y", kFloat, {1, 4});
  b.FloatInit("w", {8, 4}, Ones(32)).FloatInit("b", {4}, Ones(4));
  b.Node("MatMul", {"x", "w"}, {"m"});
  b.Node("Add", {"m", "b"}, {"y"});
  EXPECT_EQ(FoldedLabels(b, {{"x", {1, 8}}}), (std::vector<std::string>{"MatMul+[Add]+bias"}));
}

// The same add of a graph input [1, N] at batch 1 (a vector by its shape, data by its origin):
// it stays in the epilogue.
TEST(FoldRules, ARuntimeRowVectorIsNeverFoldedAsABias) {
  OnnxBuilder b;
  b.Input("x", kFloat, {1, 8}).Input("e", kFloat, {1, 4}).Output("y", kFloat, {1, 4});
  b.FloatInit("w", {8, 4}, Ones(32));
  b.Node("MatMul", {"x", "w"}, {"m"});
  b.Node("Add", {"m", "e"}, {"y"});
  EXPECT_EQ(FoldedLabels(b, {{"x", {1, 8}}, {"e", {1, 4}}}),
            (std::vector<std::string>{"MatMul+[Add]"}));
}

// A diffusion model's time and condition embeddings: Gemm(t, W, b) + Gemm(cond) -> SiLU. The
// second Gemm's output is [1, N] at batch 1; the first Gemm's C is already its library bias.
// Neither rule may fold it: once the runtime tensor was folded and then replaced by C.
TEST(FoldRules, AGemmWithCKeepsAnAddedRuntimeEmbeddingInItsEpilogue) {
  for (int64_t batch : {1, 2}) {
    SCOPED_TRACE(batch);
    OnnxBuilder b;
    b.Input("t", kFloat, {batch, 8}).Input("c", kFloat, {batch, 6});
    b.Output("y", kFloat, {batch, 4});
    b.FloatInit("wt", {8, 4}, Ones(32)).FloatInit("bt", {4}, Ones(4));
    b.FloatInit("wc", {6, 4}, Ones(24)).FloatInit("bc", {4}, Ones(4));
    b.Node("Gemm", {"c", "wc", "bc"}, {"ec"});
    b.Node("Gemm", {"t", "wt", "bt"}, {"et"});
    b.Node("Add", {"et", "ec"}, {"s"});
    b.Node("Sigmoid", {"s"}, {"g"});
    b.Node("Mul", {"s", "g"}, {"y"});
    EXPECT_EQ(FoldedLabels(b, {{"t", {batch, 8}}, {"c", {batch, 6}}}),
              (std::vector<std::string>{"Gemm", "Gemm+[Add+Sigmoid+Mul]"}));
  }
}

// A Gemm with C and an added weight vector: one call takes one bias, C keeps it.
TEST(FoldRules, AGemmWithCTakesNoSecondBias) {
  OnnxBuilder b;
  b.Input("x", kFloat, {2, 8}).Output("y", kFloat, {2, 4});
  b.FloatInit("w", {8, 4}, Ones(32)).FloatInit("c", {4}, Ones(4)).FloatInit("d", {4}, Ones(4));
  b.Node("Gemm", {"x", "w", "c"}, {"g"});
  b.Node("Add", {"g", "d"}, {"y"});
  EXPECT_EQ(FoldedLabels(b, {{"x", {2, 8}}}), (std::vector<std::string>{"Gemm+[Add]"}));
}

// A Gemm without C takes a weight vector added after it.
TEST(FoldRules, AGemmWithoutCTakesAWeightBias) {
  OnnxBuilder b;
  b.Input("x", kFloat, {2, 8}).Output("y", kFloat, {2, 4});
  b.FloatInit("w", {8, 4}, Ones(32)).FloatInit("d", {1, 4}, Ones(4));
  b.Node("Gemm", {"x", "w"}, {"g"});
  b.Node("Add", {"d", "g"}, {"y"});
  EXPECT_EQ(FoldedLabels(b, {{"x", {2, 8}}}), (std::vector<std::string>{"Gemm+[Add]+bias"}));
}

}  // namespace
}  // namespace kiln
