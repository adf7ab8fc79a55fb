// The generated program over a range (compile/ranged_emit.h): the literal splitter, the Newton
// fit, and whether the compiler's source for small graphs is one template over a range, or
// where and why not.
#include "src/kiln/compile/ranged_emit.h"

#include <gtest/gtest.h>

#include "src/kiln/graph/onnx_import.h"
#include "tests/graph/onnx_builder.h"

namespace kiln {
namespace {

using testing::kFloat;
using testing::OnnxBuilder;

Graph Import(OnnxBuilder& b) {
  auto g = ImportOnnxBytes(b.Bytes(), "ranged_emit");
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return *g;
}

TEST(LiteralSplit, SplitsDecimalIntegersAndLeavesEverythingElseInTheSkeleton) {
  const std::string text =
      "float* b53 = (float*)(ws + 16384);\n"
      "x[i0 * 128LL + i1] = 0x1.6a09e6p+0f * 2.5f + 1e-5 + 07;\n"
      "\"shape\":[512,128] 0";
  const LiteralSplit s = SplitIntegerLiterals(text);
  EXPECT_EQ(s.literals, (std::vector<int64_t>{16384, 128, 512, 128, 0}));
  ASSERT_EQ(s.pieces.size(), s.literals.size() + 1);
  // Put back together, it is the text; the suffix stays in the skeleton.
  std::string joined = s.pieces[0];
  for (size_t i = 0; i < s.literals.size(); ++i) {
    EXPECT_EQ(text.substr(s.offsets[i], std::to_string(s.literals[i]).size()),
              std::to_string(s.literals[i]));
    joined += std::to_string(s.literals[i]) + s.pieces[i + 1];
  }
  EXPECT_EQ(joined, text);
  EXPECT_EQ(s.pieces[2].substr(0, 2), "LL");
}

TEST(LiteralSplit, AnIntegerTooLongForSixtyFourBitsStaysInTheSkeleton) {
  const LiteralSplit s = SplitIntegerLiterals("a = 1234567890123456789012345;");
  EXPECT_TRUE(s.literals.empty());
  ASSERT_EQ(s.pieces.size(), 1u);
}

TEST(NewtonPoly, EvaluatesBinomialBasisExactlyIncludingBelowTheBase) {
  // 3 + 2*(b-2) + 5*C(s-2, 2) + 1*(b-2)*(s-2)
  NewtonPoly p;
  p.base = {2, 2};
  p.coeffs[{0, 0}] = 3;
  p.coeffs[{1, 0}] = 2;
  p.coeffs[{0, 2}] = 5;
  p.coeffs[{1, 1}] = 1;
  auto f = [](int64_t b, int64_t s) {
    return 3 + 2 * (b - 2) + 5 * ((s - 2) * (s - 3) / 2) + (b - 2) * (s - 2);
  };
  for (int64_t b : {1, 2, 7}) {
    for (int64_t s : {1, 2, 3, 256}) {
      int64_t v = 0;
      ASSERT_TRUE(p.Eval({b, s}, &v));
      EXPECT_EQ(v, f(b, s)) << b << "," << s;
    }
  }
  EXPECT_EQ(p.Degree(), 2);
  int64_t v = 0;
  EXPECT_FALSE(p.Eval({int64_t{1} << 40, int64_t{1} << 40}, &v));  // overflow is said
}

// x[batch, 8] -> MatMul w[8, 4] -> Relu: small enough at every point of the range that the
// emitter makes the same choices everywhere, so only sizes change.
Graph SmallMlp() {
  OnnxBuilder b;
  b.Input("x", kFloat, {-1, 8});
  b.Output("y", kFloat, {-1, 4});
  std::vector<float> w(32);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.01f * static_cast<float>(i);
  b.FloatInit("w", {8, 4}, w);
  b.Node("MatMul", {"x", "w"}, {"m"});
  b.Node("Relu", {"m"}, {"y"});
  return Import(b);
}

RangedEntry Batch(int64_t lo, int64_t hi, int64_t features) {
  RangedEntry e;
  e.inputs["x"] = {DimSpec{0, "batch"}, DimSpec{features, ""}};
  e.ranges["batch"] = {lo, hi};
  return e;
}

TEST(EmittedTemplate, ASmallMlpIsOneTemplateWhoseSizesArePolynomialsInBatch) {
  Graph g = SmallMlp();
  auto t = FitEmittedTemplate(g, Batch(1, 32, 8), CompileOptions{});
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_TRUE(t->holds) << t->Summary();
  EXPECT_TRUE(t->holds_above_base);
  EXPECT_EQ(t->symbols, (std::vector<std::string>{"batch"}));
  EXPECT_EQ(t->base.at("batch"), 2);
  EXPECT_GT(t->literals, 0u);
  // The matmul is prepared at init for one M, and its buffers and loops are sized in run: both
  // carry the batch, and the dispatch part describes the entry's shapes.
  EXPECT_GT(t->varying.count("init"), 0u) << t->Summary();
  EXPECT_GT(t->varying.count("run"), 0u) << t->Summary();
  EXPECT_EQ(t->varying.count("prologue"), 0u) << t->Summary();
  EXPECT_EQ(t->max_degree, 1);
  EXPECT_EQ(t->probes, 4u);                  // the corners 1 and 32, then 7 and the middle 16
  EXPECT_EQ(t->emits, 1u + 3u + t->probes);  // the maximum, the grid, the probes
  EXPECT_NE(t->Summary().find("gives the source at all 4 points checked"), std::string::npos)
      << t->Summary();
}

TEST(EmittedTemplate, ExtraPointsAreCheckedTooAndAPointOutsideTheRangeIsRefused) {
  Graph g = SmallMlp();
  auto t = FitEmittedTemplate(g, Batch(1, 32, 8), CompileOptions{},
                              {SymbolPoint{{"batch", 23}}, SymbolPoint{{"batch", 29}},
                               SymbolPoint{{"batch", 32}}});  // 32 is a probe point already
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_TRUE(t->holds) << t->Summary();
  EXPECT_EQ(t->probes, 6u);
  auto outside =
      FitEmittedTemplate(g, Batch(1, 32, 8), CompileOptions{}, {SymbolPoint{{"batch", 33}}});
  ASSERT_FALSE(outside.ok());
  EXPECT_NE(outside.status().message().find("{batch=33} is not a point of the range"),
            std::string::npos)
      << outside.status().message();
  auto unnamed = FitEmittedTemplate(g, Batch(1, 32, 8), CompileOptions{},
                                    {SymbolPoint{{"batch", 3}, {"seq", 4}}});
  EXPECT_FALSE(unnamed.ok());
}

TEST(EmittedTemplate, ScoresOfAPairOfSequencesAreOfDegreeTwoInTheirLength) {
  // x[seq, 4] times its own transpose: a [seq, seq] product, whose sizes grow as seq^2.
  OnnxBuilder b;
  b.Input("x", kFloat, {-1, 4});
  b.Output("y", kFloat, {-1, -1});
  auto& t = b.Node("Transpose", {"x"}, {"xt"});
  OnnxBuilder::IntsAttr(t, "perm", {1, 0});
  b.Node("MatMul", {"x", "xt"}, {"s"});
  b.Node("Relu", {"s"}, {"y"});
  Graph g = Import(b);
  RangedEntry e;
  e.inputs["x"] = {DimSpec{0, "seq"}, DimSpec{4, ""}};
  e.ranges["seq"] = {2, 40};
  auto fit = FitEmittedTemplate(g, e, CompileOptions{});
  ASSERT_TRUE(fit.ok()) << fit.status().ToString();
  EXPECT_TRUE(fit->holds) << fit->Summary();
  EXPECT_EQ(fit->max_degree, 2) << fit->Summary();

  // From 1: the transpose of one row is a view of it, a different program at that point only.
  e.ranges["seq"] = {1, 40};
  fit = FitEmittedTemplate(g, e, CompileOptions{});
  ASSERT_TRUE(fit.ok()) << fit.status().ToString();
  EXPECT_FALSE(fit->holds) << fit->Summary();
  EXPECT_TRUE(fit->holds_above_base) << fit->Summary();
  EXPECT_NE(fit->disagreement.find("at {seq=1}"), std::string::npos) << fit->disagreement;
  EXPECT_NE(fit->Summary().find("not at the range's low end"), std::string::npos) << fit->Summary();
}

TEST(EmittedTemplate, WhetherALoopRunsOnTheTeamIsDecidedWithoutChangingTheText) {
  // Rows of 4096: from 8 rows on the work is large enough for the thread team. The emitter
  // writes that choice as kiln_team(E->threads, work, small), so the text stays one template.
  OnnxBuilder b;
  b.Input("x", kFloat, {-1, 4096});
  b.Output("y", kFloat, {-1, 4096});
  b.Node("Relu", {"x"}, {"y"});
  Graph g = Import(b);
  auto t = FitEmittedTemplate(g, Batch(1, 64, 4096), CompileOptions{});
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_TRUE(t->holds) << t->Summary();
}

TEST(EmittedTemplate, PositionIdsAreComputedWhenTheEntryRunsNotFoldedIntoATable) {
  // Range(0, seq): folded for a point, it is a constant table with one entry per position and
  // the text would grow with seq. Compiled as a ranged entry, a value whose shape depends on
  // the symbols is never folded (CompileOptions::symbolic_values), so the text does not grow.
  OnnxBuilder b;
  b.Input("x", kFloat, {-1, -1});
  b.Output("y", kFloat, {-1, -1});
  b.Int64Init("zero", {}, {0});
  b.Int64Init("one", {}, {1});
  b.Node("Shape", {"x"}, {"shape"});
  b.Node("Gather", {"shape", "one"}, {"seq"});
  b.Node("Range", {"zero", "seq", "one"}, {"positions"});
  auto& cast = b.Node("Cast", {"positions"}, {"p"});
  OnnxBuilder::IntAttr(cast, "to", 1);
  b.Node("Add", {"x", "p"}, {"y"});
  Graph g = Import(b);
  RangedEntry e;
  e.inputs["x"] = {DimSpec{0, "batch"}, DimSpec{0, "seq"}};
  e.ranges["batch"] = {2, 4};
  e.ranges["seq"] = {2, 64};
  auto t = FitEmittedTemplate(g, e, CompileOptions{});
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_TRUE(t->holds) << t->Summary();
  // The positions live in the workspace, planned once at the maximum (seq 64): offsets packed
  // per point by size (rounded to 64 bytes) would be no polynomial in seq.
  EXPECT_GE(t->workspace_at_maximum, 64 * 8) << t->Summary();

  // The same graph compiled for one point folds the positions into a table as long as seq.
  auto cell =
      GenerateCell(g, Envelope{{ShapeClass{{"x", {2, 5}}}}}, "d", CompileOptions{}, nullptr);
  ASSERT_TRUE(cell.ok()) << cell.status().ToString();
  EXPECT_NE(cell->source.find("0LL, 1LL, 2LL, 3LL, 4LL,}"), std::string::npos);
}

// x[1, 4, side, side] -> a 3x3 stride-2 convolution; and its entry over `side` (a range to set).
Graph StridedConv() {
  OnnxBuilder b;
  b.Input("x", kFloat, {1, 4, -1, -1});
  b.Output("y", kFloat, {1, 4, -1, -1});
  b.FloatInit("w", {4, 4, 3, 3}, std::vector<float>(144, 0.1f));
  auto& conv = b.Node("Conv", {"x", "w"}, {"y"});
  OnnxBuilder::IntsAttr(conv, "strides", {2, 2});
  OnnxBuilder::IntsAttr(conv, "pads", {1, 1, 1, 1});
  return Import(b);
}

RangedEntry Side() {
  RangedEntry e;
  e.inputs["x"] = {DimSpec{1, ""}, DimSpec{4, ""}, DimSpec{0, "side"}, DimSpec{0, "side"}};
  return e;
}

TEST(EmittedTemplate, AStridedConvolutionOverARangedSideIsNoPolynomialAndIsNamed) {
  // A stride-2 convolution's output side is floor((side - 1) / 2) + 1: the fit through side
  // 8, 9, 10 misses it further up, and the literal, the point and the line are named.
  Graph g = StridedConv();
  RangedEntry e = Side();
  e.ranges["side"] = {8, 40};
  auto t = FitEmittedTemplate(g, e, CompileOptions{});
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_FALSE(t->holds);
  EXPECT_FALSE(t->holds_above_base);
  EXPECT_NE(t->disagreement.find("at {side="), std::string::npos) << t->disagreement;
  EXPECT_NE(t->disagreement.find("a literal is"), std::string::npos) << t->disagreement;
  EXPECT_NE(t->Summary().find("does not give the source"), std::string::npos) << t->Summary();
}

TEST(EmittedTemplate, TheSameConvolutionOnAStepItsStrideDividesIsOneTemplate) {
  Graph g = StridedConv();
  RangedEntry e = Side();
  ASSERT_TRUE(SetRangeSpec(&e, "side", {8, 40, 8}));
  auto t = FitEmittedTemplate(g, e, CompileOptions{}, {SymbolPoint{{"side", 24}}});
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_TRUE(t->holds) << t->Summary();
  EXPECT_EQ(t->base.at("side"), 8);  // the grid's base: its first value, coordinate 1
  // A point off the grid is not a point of the range.
  auto off = FitEmittedTemplate(g, e, CompileOptions{}, {SymbolPoint{{"side", 20}}});
  EXPECT_FALSE(off.ok());
}

TEST(EmittedTemplate, AConstantRangeIsRefusedAsTheShapeAnalysisRefusesIt) {
  Graph g = SmallMlp();
  RangedEntry e = Batch(1, 32, 8);
  e.ranges["batch"] = {5, 4};
  auto t = FitEmittedTemplate(g, e, CompileOptions{});
  EXPECT_FALSE(t.ok());
}

}  // namespace
}  // namespace kiln
