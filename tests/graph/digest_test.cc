// The digest law (docs/design.md §2 law 1, §5): what must leave the graph digest unchanged and what
// must change it. Each case varies exactly one thing of a small base model.
#include "src/kiln/graph/digest.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <optional>
#include <set>

#include "src/kiln/graph/checkpoint.h"
#include "src/kiln/graph/onnx_import.h"
#include "tests/graph/onnx_builder.h"

namespace kiln {
namespace {

using testing::kFloat;
using testing::kInt64;
using testing::OnnxBuilder;

// Base model: y = Reshape(Relu(x @ W + b) * s, shape) and an independent branch z = Neg(x).
// W, b are initializers; s is a float Constant node (a weight too); shape is a structural const.
struct Spec {
  std::string w_name = "W";
  std::vector<int64_t> w_dims = {4, 3};
  std::vector<float> w = std::vector<float>(12, 0.5f);
  std::vector<float> bias = {0.1f, 0.2f, 0.3f};
  float scale = 2.0f;
  std::vector<int64_t> shape = {3, 2};
  std::string act = "Relu";
  std::string mid = "h";  // intermediate value name
  std::string node_name = "mm";
  bool swap_order = false;  // emit the independent branch first
  int64_t x_rows = 2;
  std::string out_name = "y";
  bool matmul_swapped_edge = false;
  std::optional<float> leaky_alpha;
};

std::string Build(const Spec& s) {
  OnnxBuilder b;
  b.Input("x", kFloat, {s.x_rows, 4})
      .Output(s.out_name, kFloat, {3, 2})
      .Output("z", kFloat, {2, 4});
  b.FloatInit(s.w_name, s.w_dims, s.w);
  b.FloatInit("b", {3}, s.bias);
  auto neg = [&] { b.Node("Neg", {"x"}, {"z"}, "neg"); };
  if (s.swap_order) neg();
  b.FloatConstant("s", {}, {s.scale}, "const_s");
  b.Int64Constant("shape", s.shape);
  if (s.matmul_swapped_edge) {
    b.Node("MatMul", {s.w_name, "x"}, {s.mid + "0"}, s.node_name);
  } else {
    b.Node("MatMul", {"x", s.w_name}, {s.mid + "0"}, s.node_name);
  }
  b.Node("Add", {s.mid + "0", "b"}, {s.mid + "1"});
  auto& act = b.Node(s.act, {s.mid + "1"}, {s.mid + "2"});
  if (s.leaky_alpha) OnnxBuilder::FloatAttr(act, "alpha", *s.leaky_alpha);
  b.Node("Mul", {s.mid + "2", "s"}, {s.mid + "3"});
  b.Node("Reshape", {s.mid + "3", "shape"}, {s.out_name});
  if (!s.swap_order) neg();
  return b.Bytes();
}

std::string DigestOf(const Spec& s) {
  auto g = ImportOnnxBytes(Build(s), "digest-test");
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  auto d = GraphDigest(*g);
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  return *d;
}

TEST(GraphDigest, IsSixteenHex) {
  const std::string d = DigestOf(Spec{});
  ASSERT_EQ(d.size(), 16u);
  EXPECT_EQ(d.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(d, DigestOf(Spec{}));  // stable
}

TEST(GraphDigest, UnchangedByNamesOrderAndWeightValues) {
  const std::string base = DigestOf(Spec{});
  Spec renamed;
  renamed.mid = "totally_different";
  renamed.node_name = "renamed_node";
  EXPECT_EQ(DigestOf(renamed), base) << "renaming nodes/intermediates";
  Spec reordered;
  reordered.swap_order = true;
  EXPECT_EQ(DigestOf(reordered), base) << "reordering independent nodes";
  Spec new_values;
  new_values.w = std::vector<float>(12, -7.25f);
  new_values.bias = {9, 8, 7};
  new_values.scale = 0.001f;  // a float Constant node is a weight too
  EXPECT_EQ(DigestOf(new_values), base) << "replacing every weight value";
}

TEST(GraphDigest, ChangedByStructure) {
  const std::string base = DigestOf(Spec{});
  const std::vector<std::pair<std::string, std::function<void(Spec&)>>> changes = {
      {"op", [](Spec& s) { s.act = "Sigmoid"; }},
      {"attribute",
       [](Spec& s) {
         s.act = "LeakyRelu";
         s.leaky_alpha = 0.1f;
       }},
      {"edge",
       [](Spec& s) {
         s.matmul_swapped_edge = true;
         s.w_dims = {4, 3};
       }},
      {"weight name", [](Spec& s) { s.w_name = "W2"; }},
      {"weight shape",
       [](Spec& s) {
         s.w_dims = {4, 3, 1};
       }},
      {"graph input shape", [](Spec& s) { s.x_rows = 5; }},
      {"graph output name", [](Spec& s) { s.out_name = "y2"; }},
      {"structural constant",
       [](Spec& s) {
         s.shape = {2, 3};
       }},
  };
  for (const auto& [what, change] : changes) {
    Spec s;
    change(s);
    EXPECT_NE(DigestOf(s), base) << "changing the " << what << " must change the digest";
  }
  // An attribute value changed by one ulp changes the digest (floats hashed by exact bits).
  Spec a, b;
  a.act = b.act = "LeakyRelu";
  a.leaky_alpha = 0.1f;
  b.leaky_alpha = std::nextafter(0.1f, 1.0f);
  EXPECT_NE(DigestOf(a), DigestOf(b));
}

TEST(GraphDigest, WeightDTypeChangesIt) {
  OnnxBuilder a, b;
  for (OnnxBuilder* m : {&a, &b}) m->Input("x", kFloat, {2}).Output("y", kFloat, {2});
  a.FloatInit("w", {2}, {1, 2});
  auto* t = b.graph().add_initializer();
  t->set_name("w");
  t->set_data_type(onnx::TensorProto::FLOAT16);
  t->add_dims(2);
  t->add_int32_data(0x3c00);
  t->add_int32_data(0x4000);
  a.Node("Add", {"x", "w"}, {"y"});
  b.Node("Add", {"x", "w"}, {"y"});
  auto ga = ImportOnnxBytes(a.Bytes(), "a"), gb = ImportOnnxBytes(b.Bytes(), "b");
  ASSERT_TRUE(ga.ok() && gb.ok());
  EXPECT_NE(*GraphDigest(*ga), *GraphDigest(*gb));
}

// Both checkpoints of every example give one digest: the committed one and a derived one bound
// into the graph's initializers (as a worker swapping checkpoints would hold them).
TEST(GraphDigest, BothCheckpointsOfEachExampleGiveOneDigest) {
  const std::string examples = std::string(KILN_SOURCE_DIR) + "/examples/";
  for (const char* name : {"mlp", "micro-diffusion", "transformer"}) {
    auto g = ImportOnnxFile(examples + name + "/model.onnx");
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    const std::string base = *GraphDigest(*g);
    auto a = LoadCheckpoint(*g, examples + name + "/checkpoint.safetensors", true);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    auto b = DeriveCheckpoint(*g, 7);
    ASSERT_TRUE(b.ok());
    for (const WeightMap* w : {&*a, &*b}) {
      Graph rebound = *g;
      for (const auto& [n, t] : *w) rebound.initializers[n] = t;
      EXPECT_EQ(*GraphDigest(rebound), base) << name;
    }
    // And the derived checkpoint really differs from the committed one.
    const std::string first = b->begin()->first;
    EXPECT_NE(std::memcmp(b->at(first).raw_data(), a->at(first).raw_data(), a->at(first).nbytes()),
              0);
  }
}

TEST(GraphDigest, ExamplesHaveDistinctDigests) {
  const std::string examples = std::string(KILN_SOURCE_DIR) + "/examples/";
  std::set<std::string> seen;
  for (const char* name : {"mlp", "micro-diffusion", "transformer"}) {
    auto g = ImportOnnxFile(examples + name + "/model.onnx");
    ASSERT_TRUE(g.ok());
    EXPECT_TRUE(seen.insert(*GraphDigest(*g)).second) << name;
  }
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// A float constant that determines a shape (Resize scales) is structural: hashed by value, not a
// weight, untouched by checkpoints — else a derived checkpoint would change the output shape.
TEST(GraphDigest, ShapeDeterminingFloatsAreStructural) {
  auto build = [](float scale) {
    testing::OnnxBuilder b;
    b.Input("x", testing::kFloat, {1, 1, 2, 2}).Output("y", testing::kFloat, {1, 1, 4, 4});
    b.FloatConstant("scales", {4}, {1, 1, scale, scale});
    b.Node("Resize", {"x", "", "scales"}, {"y"});
    auto g = ImportOnnxBytes(b.Bytes(), "resize");
    EXPECT_TRUE(g.ok()) << g.status().ToString();
    return *g;
  };
  const Graph g2 = build(2.0f), g3 = build(3.0f);
  EXPECT_TRUE(g2.structural_floats.count("scales"));
  EXPECT_FALSE(g2.IsWeight("scales"));
  EXPECT_TRUE(g2.WeightNames().empty());
  EXPECT_NE(*GraphDigest(g2), *GraphDigest(g3));
  auto derived = DeriveCheckpoint(g2, 3);
  ASSERT_TRUE(derived.ok());
  EXPECT_TRUE(derived->empty());
}

// Scales written as a computation (torch's opset-11 export of interpolate: Concat of two
// Constants) decide the shape as surely as a Constant feeding Resize directly: every float that
// reaches a shape input is structural, so a different scale is another graph, and the fence never
// perturbs a value the output's shape depends on.
TEST(GraphDigest, FloatsReachingAShapeInputThroughComputationAreStructural) {
  auto build = [](float scale) {
    testing::OnnxBuilder b;
    b.Input("x", testing::kFloat, {1, 1, 2, 2}).Output("y", testing::kFloat, {1, 1, 4, 4});
    b.FloatConstant("batch_chan", {2}, {1, 1});
    b.FloatConstant("spatial", {2}, {scale, scale});
    b.Node("Concat", {"batch_chan", "spatial"}, {"scales"}).add_attribute()->CopyFrom([] {
      onnx::AttributeProto a;
      a.set_name("axis");
      a.set_type(onnx::AttributeProto::INT);
      a.set_i(0);
      return a;
    }());
    b.FloatConstant("w", {1}, {0.5f});  // a real weight beside them
    b.Node("Resize", {"x", "", "scales"}, {"r"});
    b.Node("Mul", {"r", "w"}, {"y"});
    auto g = ImportOnnxBytes(b.Bytes(), "resize");
    EXPECT_TRUE(g.ok()) << g.status().ToString();
    return *g;
  };
  const Graph g2 = build(2.0f), g3 = build(3.0f);
  EXPECT_FALSE(g2.IsWeight("batch_chan"));
  EXPECT_FALSE(g2.IsWeight("spatial"));
  EXPECT_EQ(g2.WeightNames(), std::vector<std::string>{"w"});
  EXPECT_NE(*GraphDigest(g2), *GraphDigest(g3));
}

// A quantized model's int32 bias is checkpoint data like its 8-bit weights: a weight, not a
// structural constant, so its values do not enter the digest and a derived checkpoint moves it.
// Other int32 initializers (a Reshape's shape, indices) stay structural.
TEST(GraphDigest, QuantizedInt32BiasesAreWeights) {
  auto build = [](int32_t bias0, int32_t axes0) {
    OnnxBuilder b;
    b.Input("x", onnx::TensorProto::UINT8, {1, 1, 3, 3})
        .Output("y", onnx::TensorProto::UINT8, {1, 2, 1, 1})
        .Output("bf", kFloat, {2})
        .Output("idx", kFloat, {1});
    auto init = [&](const std::string& name, int elem, std::vector<int64_t> dims,
                    std::vector<int32_t> ints, std::vector<float> floats = {}) {
      auto* t = b.graph().add_initializer();
      t->set_name(name);
      t->set_data_type(elem);
      for (auto d : dims) t->add_dims(d);
      for (auto v : ints) t->add_int32_data(v);
      for (auto v : floats) t->add_float_data(v);
    };
    init("xs", kFloat, {}, {}, {0.1f});
    init("xz", onnx::TensorProto::UINT8, {}, {7});
    init("w", onnx::TensorProto::INT8, {2, 1, 3, 3}, std::vector<int32_t>(18, 3));
    init("ws", kFloat, {}, {}, {0.2f});
    init("wz", onnx::TensorProto::INT8, {}, {0});
    init("ys", kFloat, {}, {}, {0.5f});
    init("yz", onnx::TensorProto::UINT8, {}, {1});
    init("bias", onnx::TensorProto::INT32, {2}, {bias0, 40});
    init("qdq_bias", onnx::TensorProto::INT32, {2}, {bias0, 40});
    init("gather_at", onnx::TensorProto::INT32, {1}, {axes0});
    b.Node("QLinearConv", {"x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "bias"}, {"y"});
    b.Node("DequantizeLinear", {"qdq_bias", "ws"}, {"bf"});
    b.Node("Gather", {"bf", "gather_at"}, {"idx"});
    auto g = ImportOnnxBytes(b.Bytes(), "quantized");
    EXPECT_TRUE(g.ok()) << g.status().ToString();
    return *g;
  };
  const Graph g = build(-5, 0);
  EXPECT_TRUE(g.IsWeight("bias"));
  EXPECT_TRUE(g.IsWeight("qdq_bias"));
  EXPECT_FALSE(g.IsWeight("gather_at"));                    // int32 indices: structural
  EXPECT_EQ(*GraphDigest(g), *GraphDigest(build(123, 0)));  // bias values: not the graph
  EXPECT_NE(*GraphDigest(g), *GraphDigest(build(-5, 1)));   // index values: the graph
  auto derived = DeriveCheckpoint(g, 3);
  ASSERT_TRUE(derived.ok());
  ASSERT_TRUE(derived->count("bias"));
  EXPECT_NE(derived->at("bias").data<int32_t>()[0], -5);
  EXPECT_NE(derived->at("w").data<int8_t>()[0], 3);  // 8-bit weights move too
  EXPECT_FALSE(derived->count("gather_at"));
}

}  // namespace
}  // namespace kiln
