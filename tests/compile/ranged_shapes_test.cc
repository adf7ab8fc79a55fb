// Shapes over a range (compile/ranged_shapes.h) on small graphs: the polynomial each dim is
// found to be, the values that are not one, the probe points, and the compiler's reason for a
// ranged entry that carries the analysis.
#include "src/kiln/compile/ranged_shapes.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "src/kiln/compile/pipeline.h"
#include "src/kiln/graph/onnx_import.h"
#include "src/kiln/ops/shape_inference.h"
#include "tests/graph/onnx_builder.h"

namespace kiln {
namespace {

using testing::kFloat;
using testing::OnnxBuilder;

Graph Import(OnnxBuilder& b) {
  auto g = ImportOnnxBytes(b.Bytes(), "ranged");
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return *g;
}

RangedEntry BatchSeq(int64_t batch_hi, int64_t seq_lo, int64_t seq_hi) {
  RangedEntry e;
  e.inputs["x"] = {DimSpec{0, "batch"}, DimSpec{0, "seq"}, DimSpec{8, ""}};
  e.ranges["batch"] = {1, batch_hi};
  e.ranges["seq"] = {seq_lo, seq_hi};
  return e;
}

// x[batch, seq, 8] -> Reshape [-1, 8] -> MatMul [8, 4]; Concat on seq; Flatten; Pad and Slice
// on seq.
Graph Encoderish() {
  OnnxBuilder b;
  b.Input("x", kFloat, {-1, -1, 8});
  b.Output("m", kFloat, {-1, 4}).Output("cat", kFloat, {-1, -1, 8});
  b.Output("flat", kFloat, {-1, -1}).Output("padded", kFloat, {-1, -1, 8});
  b.Output("sliced", kFloat, {-1, -1, 8});
  b.FloatInit("w", {8, 4}, std::vector<float>(32, 0.5f));
  b.Int64Init("rows", {2}, {-1, 8});
  b.Int64Init("pads", {6}, {0, 1, 0, 0, 1, 0});
  b.Int64Init("starts", {1}, {1});
  b.Int64Init("ends", {1}, {-1});
  b.Int64Init("axes", {1}, {1});
  b.Node("Reshape", {"x", "rows"}, {"r"});
  b.Node("MatMul", {"r", "w"}, {"m"});
  auto& cat = b.Node("Concat", {"x", "x"}, {"cat"});
  OnnxBuilder::IntAttr(cat, "axis", 1);
  b.Node("Flatten", {"x"}, {"flat"});
  b.Node("Pad", {"x", "pads"}, {"padded"});
  b.Node("Slice", {"x", "starts", "ends", "axes"}, {"sliced"});
  return Import(b);
}

std::vector<std::string> Dims(const RangedShapes& s, const std::string& value) {
  std::vector<std::string> out;
  auto it = s.shapes.find(value);
  if (it == s.shapes.end()) return {"<" + value + " not fitted>"};
  for (const SymDim& d : it->second) out.push_back(d.ToString());
  return out;
}

TEST(RangedShapes, EachDimIsAPolynomialInTheSymbols) {
  Graph g = Encoderish();
  auto s = InferRangedShapes(g, BatchSeq(8, 3, 256));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->symbols, (std::vector<std::string>{"batch", "seq"}));
  EXPECT_TRUE(s->irregular.empty()) << s->Summary();
  using V = std::vector<std::string>;
  EXPECT_EQ(Dims(*s, "x"), (V{"batch", "seq", "8"}));
  EXPECT_EQ(Dims(*s, "r"), (V{"batch*seq", "8"}));
  EXPECT_EQ(Dims(*s, "m"), (V{"batch*seq", "4"}));
  EXPECT_EQ(Dims(*s, "cat"), (V{"batch", "2*seq", "8"}));
  EXPECT_EQ(Dims(*s, "flat"), (V{"batch", "8*seq"}));
  EXPECT_EQ(Dims(*s, "padded"), (V{"batch", "seq+2", "8"}));
  EXPECT_EQ(Dims(*s, "sliced"), (V{"batch", "seq-2", "8"}));
  EXPECT_EQ(Dims(*s, "w"), (V{"8", "4"}));
  EXPECT_EQ(s->SymbolicValues(), 7u);
  EXPECT_GT(s->inferences, RangeProbePoints(BatchSeq(8, 3, 256)).size());
}

// The fitted polynomials against the graph's own concrete inference at points the fit never
// used: every value, every dim.
TEST(RangedShapes, PolynomialsAgreeWithConcreteInferenceAtOtherPoints) {
  Graph g = Encoderish();
  const RangedEntry entry = BatchSeq(8, 3, 256);
  auto s = InferRangedShapes(g, entry);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  for (int64_t batch : {1, 3, 5, 8}) {
    for (int64_t seq : {3, 17, 100, 201, 256}) {
      const SymbolPoint p{{"batch", batch}, {"seq", seq}};
      auto concrete = InferShapes(g, ShapesAt(entry, p), true);
      ASSERT_TRUE(concrete.ok()) << concrete.status().ToString();
      for (const auto& [name, dims] : s->shapes) {
        const Shape& actual = concrete->types.at(name).shape;
        ASSERT_EQ(actual.size(), dims.size()) << name;
        for (size_t d = 0; d < dims.size(); ++d) {
          int64_t v = 0;
          ASSERT_TRUE(dims[d].Eval(p, &v));
          EXPECT_EQ(v, actual[d]) << name << " dim " << d << " at " << batch << "," << seq;
        }
      }
    }
  }
}

// The workspace bound: each value computed from the inputs at its largest corner, initializers
// not counted; no point inside the range has a value larger than its corner bound.
TEST(RangedShapes, TheFootprintAtTheMaximumBoundsEveryPointOfTheRange) {
  Graph g = Encoderish();
  const RangedEntry entry = BatchSeq(8, 3, 256);
  auto s = InferRangedShapes(g, entry);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  auto f = FootprintAtMaximum(g, entry, *s);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  // x, r, flat 8*256*8 floats; m 8*256*4; cat 8*512*8; padded 8*258*8; sliced 8*254*8.
  EXPECT_EQ(f->total_bytes, 4 * (3 * 16384 + 8192 + 32768 + 16512 + 16256));
  EXPECT_EQ(f->largest, "cat");
  EXPECT_EQ(f->largest_bytes, 4 * 32768);
  EXPECT_EQ(f->largest_at, (SymbolPoint{{"batch", 8}, {"seq", 256}}));
  EXPECT_EQ(f->unbounded, 0u);
  for (int64_t batch : {1, 2, 5, 8}) {
    for (int64_t seq : {3, 4, 77, 255, 256}) {
      auto concrete = InferShapes(g, ShapesAt(entry, {{"batch", batch}, {"seq", seq}}), true);
      ASSERT_TRUE(concrete.ok());
      int64_t sum = 0;
      for (const auto& [name, type] : concrete->types) {
        if (g.initializers.count(name)) continue;
        int64_t n = 4;
        for (int64_t d : type.shape) n *= d;
        EXPECT_LE(n, f->largest_bytes) << name;
        sum += n;
      }
      EXPECT_LE(sum, f->total_bytes) << batch << "," << seq;
    }
  }
}

// img[1, 1, side, side] -> a 3x3 stride-2 convolution; and its entry over `side` (a range to set).
Graph StridedConv() {
  OnnxBuilder b;
  b.Input("img", kFloat, {1, 1, -1, -1}).Output("y", kFloat, {1, 1, -1, -1});
  b.FloatInit("k", {1, 1, 3, 3}, std::vector<float>(9, 1.0f));
  auto& conv = b.Node("Conv", {"img", "k"}, {"y"});
  OnnxBuilder::IntsAttr(conv, "strides", {2, 2});
  OnnxBuilder::IntsAttr(conv, "pads", {1, 1, 1, 1});
  return Import(b);
}

RangedEntry Side() {
  RangedEntry e;
  e.inputs["img"] = {DimSpec{1, ""}, DimSpec{1, ""}, DimSpec{0, "side"}, DimSpec{0, "side"}};
  return e;
}

// A stride-2 convolution over a ranged spatial size halves it with a floor: no polynomial, and
// the analysis names the value and the point where a fit breaks.
TEST(RangedShapes, AFloorDivisionIsIrregularAndNamed) {
  Graph g = StridedConv();
  RangedEntry e = Side();
  e.ranges["side"] = {8, 64};
  auto s = InferRangedShapes(g, e);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_EQ(s->irregular.count("y"), 1u) << s->Summary();
  EXPECT_NE(s->irregular.at("y").find("dim 2"), std::string::npos) << s->irregular.at("y");
  EXPECT_NE(s->irregular.at("y").find("side="), std::string::npos) << s->irregular.at("y");
  EXPECT_EQ(Dims(*s, "img"), (std::vector<std::string>{"1", "1", "side", "side"}));
  EXPECT_NE(s->Summary().find("1 irregular (first: 'y'"), std::string::npos) << s->Summary();
}

// On a grid that every stride divides, the same convolution halves the side exactly: over the
// side's coordinate (side / 8) the input is 8 of it and the output 4.
TEST(RangedShapes, AStepTheStridesDivideMakesTheFloorExact) {
  Graph g = StridedConv();
  RangedEntry e = Side();
  ASSERT_TRUE(SetRangeSpec(&e, "side", {8, 64, 8}));
  auto s = InferRangedShapes(g, e);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_TRUE(s->irregular.empty()) << s->Summary();
  EXPECT_EQ(Dims(*s, "img"), (std::vector<std::string>{"1", "1", "8*side", "8*side"}));
  EXPECT_EQ(Dims(*s, "y"), (std::vector<std::string>{"1", "1", "4*side", "4*side"}));
  // The same grid shifted by 3 (11, 19, ..., 59) keeps the floor: (side - 1) / 2 + 1 is 4 per
  // step plus 6 at side 11 ... and the fit says so.
  ASSERT_TRUE(SetRangeSpec(&e, "side", {11, 59, 8}));
  s = InferRangedShapes(g, e);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_TRUE(s->irregular.empty()) << s->Summary();
  EXPECT_EQ(Dims(*s, "y"), (std::vector<std::string>{"1", "1", "4*side+2", "4*side+2"}));
}

TEST(RangedShapes, ProbePointsAreCornersAndInteriorValuesInsideTheRange) {
  RangedEntry e = BatchSeq(8, 1, 256);
  const std::vector<SymbolPoint> points = RangeProbePoints(e);
  auto has = [&](int64_t batch, int64_t seq) {
    return std::count(points.begin(), points.end(), SymbolPoint{{"batch", batch}, {"seq", seq}});
  };
  for (auto [b, q] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 1}, {1, 256}, {8, 1}, {8, 256}, {4, 7}, {4, 128}, {7, 128}}) {
    EXPECT_EQ(has(b, q), 1) << b << "," << q;
  }
  EXPECT_EQ(points.size(), 7u);  // 4 corners, (4, 7), (7, 128) and the middle (4, 128) once
  for (const SymbolPoint& p : points) {
    for (const auto& [name, v] : p) {
      EXPECT_GE(v, e.ranges.at(name).first);
      EXPECT_LE(v, e.ranges.at(name).second);
    }
  }
  // A symbol with one value is fixed at it; seven free symbols are refused.
  e.ranges["batch"] = {2, 2};
  for (const SymbolPoint& p : RangeProbePoints(e)) EXPECT_EQ(p.at("batch"), 2);
  RangedEntry wide;
  for (int i = 0; i < 7; ++i) {
    const std::string s = "s" + std::to_string(i);
    wide.inputs["x"].push_back(DimSpec{0, s});
    wide.ranges[s] = {1, 4};
  }
  EXPECT_FALSE(CheckRangedProbes(wide).ok());
}

TEST(RangedShapes, APointTheGraphCannotTakeIsAnErrorNamingIt) {
  OnnxBuilder b;
  b.Input("x", kFloat, {-1}).Output("y", kFloat, {2, -1});
  b.Int64Init("halves", {2}, {2, -1});
  b.Node("Reshape", {"x", "halves"}, {"y"});
  Graph g = Import(b);
  RangedEntry e;
  e.inputs["x"] = {DimSpec{0, "n"}};
  e.ranges["n"] = {2, 64};
  auto s = InferRangedShapes(g, e);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("at n="), std::string::npos) << s.status().ToString();
  Status refusal = CompileRangedEntry(g, e, CompileOptions{});
  EXPECT_NE(refusal.message().find("at n="), std::string::npos) << refusal.ToString();
}

TEST(RangedShapes, AnOutputDimThatIsNoSymbolIsWrittenAsItsPolynomial) {
  // The caller allocates a ranged entry's outputs from the request's symbols: an output dim that
  // is no single symbol (the encoder's `cat` is 2*seq long, `flat` seq*8) is described as its
  // polynomial, which the metadata carries and the loader evaluates at each request.
  Graph g = Encoderish();
  Status s = CompileRangedEntry(g, BatchSeq(8, 3, 256), CompileOptions{});
  EXPECT_TRUE(s.ok()) << s.ToString();
  Envelope env;
  env.ranged = {BatchSeq(8, 3, 256)};
  auto cell = GenerateCell(g, env, "d", CompileOptions{}, nullptr);
  ASSERT_TRUE(cell.ok()) << cell.status().ToString();
  ASSERT_TRUE(cell->gaps.empty());
  const std::string describe = cell->describe.dump();
  EXPECT_NE(
      describe.find(R"({"dtype":"float32","name":"cat","shape":["batch",{"poly":"2*seq"},8]})"),
      std::string::npos)
      << describe;
  EXPECT_NE(describe.find(R"("name":"flat","shape":["batch",{"poly":"8*seq"}])"), std::string::npos)
      << describe;
}

TEST(RangedShapes, AMeanOverTheRangedDimCompiles) {
  // The mean's divisor is the symbol's value at run time, not a float folded per point.
  OnnxBuilder b;
  b.Input("x", kFloat, {-1, 8}).Output("y", kFloat, {1, 8});
  OnnxBuilder::IntsAttr(b.Node("ReduceMean", {"x"}, {"y"}), "axes", {0});
  Graph mean = Import(b);
  RangedEntry e;
  e.inputs["x"] = {DimSpec{0, "n"}, DimSpec{8, ""}};
  e.ranges["n"] = {1, 64};
  Status s = CompileRangedEntry(mean, e, CompileOptions{});
  EXPECT_TRUE(s.ok()) << s.ToString();
}

TEST(SymDim, PrintsEvaluatesAndComparesCanonically) {
  SymDim d;
  d.terms[{"batch", "seq"}] = 2;
  d.terms[{"seq"}] = -1;
  d.terms[{}] = 5;
  EXPECT_EQ(d.ToString(), "2*batch*seq-seq+5");
  int64_t v = 0;
  ASSERT_TRUE(d.Eval({{"batch", 3}, {"seq", 4}}, &v));
  EXPECT_EQ(v, 24 - 4 + 5);
  EXPECT_FALSE(d.Eval({{"batch", 3}}, &v));  // seq missing
  SymDim big;
  big.terms[{"n"}] = INT64_MAX;
  EXPECT_FALSE(big.Eval({{"n", 2}}, &v));
  EXPECT_TRUE(SymDim::Constant(7).IsConstant());
  EXPECT_EQ(SymDim::Constant(7).ConstantValue(), 7);
  EXPECT_EQ(SymDim::Constant(0).ToString(), "0");
  EXPECT_EQ(SymDim::Constant(0), SymDim{});
}

}  // namespace
}  // namespace kiln
