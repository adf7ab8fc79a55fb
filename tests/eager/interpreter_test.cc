// Interpreter tests: legacy opset forms, input checks with named errors, freeing intermediates,
// shape inference and structural folding (which must never read a weight value).
#include "src/kiln/eager/interpreter.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <thread>

#include "src/kiln/graph/onnx_import.h"
#include "src/kiln/ops/shape_inference.h"
#include "tests/graph/onnx_builder.h"

namespace kiln {
namespace {

using testing::kFloat;
using testing::kInt64;
using testing::OnnxBuilder;

std::shared_ptr<const Graph> Import(const OnnxBuilder& b) {
  auto g = ImportOnnxBytes(b.Bytes(), "test-model");
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return std::make_shared<const Graph>(std::move(g).value());
}

Tensor Iota(Shape shape) {
  std::vector<float> v(static_cast<size_t>(NumElements(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
  return Tensor::FromVector<float>(shape, v);
}

// Slice-1 (attributes) and Slice-13 (inputs) must compute the same thing.
TEST(Interpreter, LegacySliceAttributesMatchModernInputs) {
  OnnxBuilder old_b(9);
  old_b.Input("x", kFloat, {4, 6}).Output("y", kFloat, {2, 6});
  auto& s = old_b.Node("Slice", {"x"}, {"y"});
  OnnxBuilder::IntsAttr(s, "starts", {1, 0});
  OnnxBuilder::IntsAttr(s, "ends", {3, 6});
  OnnxBuilder::IntsAttr(s, "axes", {0, 1});
  // opset 9 has no steps: take cols [0, 6) then this test compares the first 3 via a 2nd slice.
  OnnxBuilder new_b(13);
  new_b.Input("x", kFloat, {4, 6}).Output("y", kFloat, {2, 3});
  new_b.Int64Init("starts", {2}, {1, 0}).Int64Init("ends", {2}, {3, 6});
  new_b.Int64Init("axes", {2}, {0, 1}).Int64Init("steps", {2}, {1, 2});
  new_b.Node("Slice", {"x", "starts", "ends", "axes", "steps"}, {"y"});
  auto old_i = Interpreter::Create(Import(old_b));
  auto new_i = Interpreter::Create(Import(new_b));
  ASSERT_TRUE(old_i.ok()) << old_i.status().ToString();
  ASSERT_TRUE(new_i.ok()) << new_i.status().ToString();
  auto a = old_i->Run({{"x", Iota({4, 6})}});
  auto b = new_i->Run({{"x", Iota({4, 6})}});
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(a->at("y").shape(), (Shape{2, 6}));
  EXPECT_EQ(b->at("y").shape(), (Shape{2, 3}));
  for (int r = 0; r < 2; ++r) {
    for (int c = 0; c < 3; ++c) {
      EXPECT_EQ(b->at("y").data<float>()[r * 3 + c], a->at("y").data<float>()[r * 6 + 2 * c]);
    }
  }
}

TEST(Interpreter, LegacyClipUnsqueezeAndReshapeForms) {
  OnnxBuilder b(6);
  b.Input("x", kFloat, {2, 3}).Output("y", kFloat, {1, 6});
  auto& clip = b.Node("Clip", {"x"}, {"c"});
  OnnxBuilder::FloatAttr(clip, "min", 1.0f);
  OnnxBuilder::FloatAttr(clip, "max", 4.0f);
  auto& unsq = b.Node("Unsqueeze", {"c"}, {"u"});
  OnnxBuilder::IntsAttr(unsq, "axes", {0});
  auto& reshape = b.Node("Reshape", {"u"}, {"y"});
  OnnxBuilder::IntsAttr(reshape, "shape", {1, -1});
  b.model().mutable_opset_import(0)->set_version(4);  // Reshape-1 form (shape attribute)
  auto interp = Interpreter::Create(Import(b));
  ASSERT_TRUE(interp.ok()) << interp.status().ToString();
  auto out = interp->Run({{"x", Iota({2, 3})}});
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  const Tensor& y = out->at("y");
  EXPECT_EQ(y.shape(), (Shape{1, 6}));
  const float expected[] = {1, 1, 2, 3, 4, 4};
  for (int i = 0; i < 6; ++i) EXPECT_FLOAT_EQ(y.data<float>()[i], expected[i]);
}

std::shared_ptr<const Graph> TwoLayer() {
  OnnxBuilder b;
  b.Input("x", kFloat, {-1, 4}).Output("y", kFloat, {-1, 2});
  b.FloatInit("w1", {4, 8}, std::vector<float>(32, 0.25f));
  b.FloatInit("w2", {8, 2}, std::vector<float>(16, 0.5f));
  b.Node("MatMul", {"x", "w1"}, {"h"});
  b.Node("Relu", {"h"}, {"r"});
  b.Node("MatMul", {"r", "w2"}, {"y"});
  return Import(b);
}

TEST(Interpreter, RunsAtAnyBatchAndBindsACheckpoint) {
  auto interp = Interpreter::Create(TwoLayer());
  ASSERT_TRUE(interp.ok());
  for (int64_t batch : {1, 3, 17}) {
    auto out = interp->Run({{"x", Iota({batch, 4})}});
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    EXPECT_EQ(out->at("y").shape(), (Shape{batch, 2}));
    // row 0 = [0,1,2,3]: h = 6*0.25 = 1.5 per unit, y = 8 * 1.5 * 0.5 = 6
    EXPECT_FLOAT_EQ(out->at("y").data<float>()[0], 6.0f);
  }
  WeightMap w = GraphWeights(interp->graph());
  w["w2"] = Tensor::FromVector<float>({8, 2}, std::vector<float>(16, 1.0f));
  auto out = interp->Run({{"x", Iota({1, 4})}}, &w);
  ASSERT_TRUE(out.ok());
  EXPECT_FLOAT_EQ(out->at("y").data<float>()[0], 12.0f);
}

// Conv, pools, a norm and Gemm have prepared state, built once with the plan and shared by every
// run: runs on several threads at once at different batch sizes must give what one thread alone
// gives, bit for bit.
TEST(Interpreter, PreparedNodesServeConcurrentRuns) {
  OnnxBuilder b;
  b.Input("x", kFloat, {-1, 2, 6, 6}).Output("y", kFloat, {-1, 3});
  std::vector<float> w(4 * 2 * 3 * 3), gw(4 * 3);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i % 7) * 0.125f - 0.25f;
  for (size_t i = 0; i < gw.size(); ++i) gw[i] = static_cast<float>(i % 5) * 0.25f - 0.5f;
  b.FloatInit("w", {4, 2, 3, 3}, w);
  b.FloatInit("scale", {4}, {1.0f, 0.5f, 2.0f, 1.5f});
  b.FloatInit("bias", {4}, {0.0f, 0.1f, -0.1f, 0.2f});
  b.FloatInit("mean", {4}, {0.1f, 0.0f, -0.2f, 0.3f});
  b.FloatInit("var", {4}, {1.0f, 2.0f, 0.5f, 1.0f});
  b.FloatInit("gw", {4, 3}, gw);
  b.IntsAttr(b.Node("Conv", {"x", "w"}, {"c"}), "pads", {1, 1, 1, 1});
  b.FloatAttr(b.Node("BatchNormalization", {"c", "scale", "bias", "mean", "var"}, {"n"}), "epsilon",
              1e-3f);
  auto& pool = b.Node("MaxPool", {"n"}, {"p"});
  b.IntsAttr(pool, "kernel_shape", {2, 2});
  b.IntsAttr(pool, "strides", {2, 2});
  b.Node("GlobalAveragePool", {"p"}, {"g"});
  b.Node("Flatten", {"g"}, {"f"});
  b.IntAttr(b.Node("Gemm", {"f", "gw"}, {"y"}), "transB", 0);
  auto interp = Interpreter::Create(Import(b));
  ASSERT_TRUE(interp.ok()) << interp.status().ToString();
  auto input = [](int64_t batch) {
    std::vector<float> v(static_cast<size_t>(batch * 2 * 6 * 6));
    for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(static_cast<float>(i));
    return Tensor::FromVector<float>({batch, 2, 6, 6}, v);
  };
  std::map<int64_t, Tensor> expected;
  for (int64_t batch : {1, 2, 3, 4}) {
    auto out = interp->Run({{"x", input(batch)}});
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    expected[batch] = out->at("y");
  }
  std::vector<int> mismatches(8, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 20; ++round) {
        const int64_t batch = 1 + (t + round) % 4;
        auto out = interp->Run({{"x", input(batch)}});
        const Tensor& want = expected.at(batch);
        if (!out.ok() || out->at("y").shape() != want.shape() ||
            std::memcmp(out->at("y").raw_data(), want.raw_data(), want.nbytes()) != 0) {
          ++mismatches[static_cast<size_t>(t)];
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < 8; ++t) EXPECT_EQ(mismatches[static_cast<size_t>(t)], 0) << "thread " << t;
}

TEST(Interpreter, BadInputsAreNamedErrors) {
  auto interp = Interpreter::Create(TwoLayer());
  ASSERT_TRUE(interp.ok());
  struct Case {
    const char* what;
    TensorMap inputs;
    const char* fragment;
  };
  const std::vector<Case> cases = {
      {"missing", {}, "input 'x' (float32[N,4]) is missing"},
      {"wrong rank", {{"x", Iota({4})}}, "input 'x' has rank 1"},
      {"wrong dim", {{"x", Iota({2, 5})}}, "expected [N,4] (dim 1)"},
      {"wrong dtype",
       {{"x", Tensor::FromVector<int64_t>({1, 4}, {1, 2, 3, 4})}},
       "input 'x' has dtype int64, expected float32"},
      {"unknown name", {{"x", Iota({1, 4})}, {"q", Iota({1})}}, "'q' is not an input"},
  };
  for (const Case& c : cases) {
    auto out = interp->Run(c.inputs);
    ASSERT_FALSE(out.ok()) << c.what;
    EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument) << c.what;
    EXPECT_NE(out.status().message().find(c.fragment), std::string::npos)
        << c.what << ": " << out.status().ToString();
  }
}

TEST(Interpreter, FreesIntermediatesAfterTheirLastUse) {
  // A chain of 8 Neg nodes over a 1 MiB tensor: at most two intermediates are alive at once.
  OnnxBuilder b;
  b.Input("x", kFloat, {256, 1024}).Output("v8", kFloat, {256, 1024});
  for (int i = 1; i <= 8; ++i) {
    b.Node("Neg", {i == 1 ? "x" : "v" + std::to_string(i - 1)}, {"v" + std::to_string(i)});
  }
  auto interp = Interpreter::Create(Import(b));
  ASSERT_TRUE(interp.ok());
  RunStats stats;
  auto out = interp->Run({{"x", Iota({256, 1024})}}, nullptr, &stats);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(stats.nodes_run, 8);
  EXPECT_LE(stats.peak_live_bytes, 2 * 1024 * 1024) << "intermediates are not being freed";
  EXPECT_FLOAT_EQ(out->at("v8").data<float>()[5], 5.0f);
}

TEST(Interpreter, KernelErrorsNameTheNode) {
  OnnxBuilder b;
  b.Input("x", kFloat, {2, 3}).Input("y", kFloat, {4, 5}).Output("z", kFloat, {2, 5});
  b.Node("MatMul", {"x", "y"}, {"z"}, "proj");
  auto interp = Interpreter::Create(Import(b));
  ASSERT_TRUE(interp.ok());
  auto out = interp->Run({{"x", Iota({2, 3})}, {"y", Iota({4, 5})}});
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("MatMul 'proj'"), std::string::npos)
      << out.status().ToString();
}

// A request's values decide these outputs' shapes. Sizes past int64 are refused by node before a
// byte is allocated (they used to wrap into a small buffer the kernel then overran), and with a
// budget, so are sizes past it; every byte charged is refunded when the outputs are dropped.
Status RunOne(const OnnxBuilder& b, const TensorMap& inputs,
              const std::shared_ptr<MemoryBudget>& budget = nullptr) {
  auto interp = Interpreter::Create(Import(b));
  EXPECT_TRUE(interp.ok()) << interp.status().ToString();
  return interp->Run(inputs, nullptr, nullptr, budget).status();
}

void ExpectTooLarge(const Status& s, std::vector<std::string> names) {
  EXPECT_TRUE(s.Is(kRefusalRequestTooLarge)) << s.ToString();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  for (const std::string& n : names) {
    EXPECT_NE(s.message().find(n), std::string::npos) << n << " not in " << s.ToString();
  }
}

Tensor Ints(std::vector<int64_t> v) {
  return Tensor::FromVector<int64_t>({static_cast<int64_t>(v.size())}, v);
}

TEST(Interpreter, ValueDependentShapesAreCheckedAndChargedBeforeTheyAreAllocated) {
  constexpr int64_t k2p62 = int64_t{1} << 62;
  OnnxBuilder fill;
  fill.Input("shape", kInt64, {-1}).Output("y", kFloat, {-1});
  fill.Node("ConstantOfShape", {"shape"}, {"y"}, "fill");
  ExpectTooLarge(RunOne(fill, {{"shape", Ints({k2p62})}}),
                 {"ConstantOfShape 'fill'", "float32[4611686018427387904]", "int64"});
  ExpectTooLarge(RunOne(fill, {{"shape", Ints({3037000500, 3037000500})}}),
                 {"ConstantOfShape 'fill'", "[3037000500,3037000500]"});

  auto budget = std::make_shared<MemoryBudget>(int64_t{1} << 20);
  ExpectTooLarge(RunOne(fill, {{"shape", Ints({int64_t{1} << 20})}}, budget),
                 {"ConstantOfShape 'fill'", "float32[1048576]", "budget of 1048576 bytes"});
  EXPECT_TRUE(RunOne(fill, {{"shape", Ints({1024})}}, budget).ok());
  EXPECT_EQ(budget->in_use(), 0) << "the outputs are gone, so is their charge";
  EXPECT_EQ(budget->peak(), 4096) << "the one output, [1024] float32";

  OnnxBuilder range;
  range.Input("s", kInt64, {}).Input("l", kInt64, {}).Input("d", kInt64, {});
  range.Output("y", kInt64, {-1});
  range.Node("Range", {"s", "l", "d"}, {"y"}, "r");
  auto scalars = [](int64_t s, int64_t l, int64_t d) {
    return TensorMap{{"s", Tensor::Scalar<int64_t>(s)},
                     {"l", Tensor::Scalar<int64_t>(l)},
                     {"d", Tensor::Scalar<int64_t>(d)}};
  };
  ExpectTooLarge(RunOne(range, scalars(0, int64_t{1} << 61, 1)), {"Range 'r'", "int64"});
  // The span itself does not fit int64 (it used to be computed as limit - start).
  ExpectTooLarge(RunOne(range, scalars(-k2p62, k2p62, 1)), {"Range 'r'"});
  ExpectTooLarge(RunOne(range, scalars(INT64_MIN, INT64_MAX, 1)), {"Range 'r'", "int64 bound"});
  EXPECT_TRUE(RunOne(range, scalars(INT64_MAX, INT64_MIN, INT64_MIN)).ok());  // 2 elements

  OnnxBuilder onehot;
  onehot.Input("i", kInt64, {3}).Input("depth", kInt64, {1}).FloatInit("v", {2}, {0, 1});
  onehot.Output("y", kFloat, {3, -1});
  onehot.Node("OneHot", {"i", "depth", "v"}, {"y"}, "oh");
  ExpectTooLarge(RunOne(onehot, {{"i", Ints({0, 1, 2})}, {"depth", Ints({k2p62})}}),
                 {"OneHot 'oh'", "[3,4611686018427387904]"});
}

// A loop's per-iteration outputs stay charged while the loop holds them: a trip count from the
// request cannot grow the stack past the budget.
TEST(Interpreter, LoopScanOutputsAreChargedToTheRequestsBudget) {
  OnnxBuilder b;
  b.Input("m", kInt64, {}).Input("x", kFloat, {1024}).Output("rows", kFloat, {-1, 1024});
  OnnxBuilder body;
  body.Input("i", kInt64, {}).Input("c_in", onnx::TensorProto::BOOL, {});
  body.Node("Identity", {"c_in"}, {"c_out"}, "keep");
  body.Node("Neg", {"x"}, {"row"}, "row");  // a fresh 4 KiB tensor per iteration
  body.Output("c_out", onnx::TensorProto::BOOL, {}).Output("row", kFloat, {1024});
  auto& loop = b.Node("Loop", {"m", ""}, {"rows"}, "loop");
  auto* a = loop.add_attribute();
  a->set_name("body");
  a->set_type(onnx::AttributeProto::GRAPH);
  a->mutable_g()->CopyFrom(body.graph());
  a->mutable_g()->set_name("body");

  auto budget = std::make_shared<MemoryBudget>(int64_t{1} << 20);  // 256 rows of 4 KiB
  const TensorMap few = {{"m", Tensor::Scalar<int64_t>(100)}, {"x", Iota({1024})}};
  EXPECT_TRUE(RunOne(b, few, budget).ok());
  EXPECT_EQ(budget->in_use(), 0);
  const TensorMap many = {{"m", Tensor::Scalar<int64_t>(int64_t{1} << 40)}, {"x", Iota({1024})}};
  Status s = RunOne(b, many, budget);
  ExpectTooLarge(s, {"Loop 'loop'", "budget of 1048576 bytes"});
  EXPECT_EQ(budget->in_use(), 0);
}

// Shape -> Gather -> Unsqueeze -> Concat -> Reshape: once input shapes are known the whole chain
// is structural and folds into one constant; the weight-consuming nodes stay.
TEST(ShapeInference, FoldsShapeChainsButNeverWeights) {
  OnnxBuilder b;
  b.Input("x", kFloat, {-1, 4, 6}).Output("y", kFloat, {-1, 24}).Output("wc", kInt64, {2});
  b.FloatInit("w", {2}, {1.5f, 2.5f});
  b.Int64Init("zero", {}, {0});
  b.Int64Init("minus1", {1}, {-1});
  b.Node("Shape", {"x"}, {"s"});
  auto& g = b.Node("Gather", {"s", "zero"}, {"n"});
  OnnxBuilder::IntAttr(g, "axis", 0);
  b.Int64Init("axes0", {1}, {0});
  b.Node("Unsqueeze", {"n", "axes0"}, {"n1"});
  auto& c = b.Node("Concat", {"n1", "minus1"}, {"shape"});
  OnnxBuilder::IntAttr(c, "axis", 0);
  b.Node("Reshape", {"x", "shape"}, {"y"});
  auto& cast = b.Node("Cast", {"w"}, {"wc"});  // int result computed from a weight
  OnnxBuilder::IntAttr(cast, "to", onnx::TensorProto::INT64);
  auto graph = Import(b);

  auto inf = InferShapes(*graph, {{"x", {3, 4, 6}}});
  ASSERT_TRUE(inf.ok()) << inf.status().ToString();
  EXPECT_EQ(inf->types.at("y").shape, (Shape{3, 24}));
  ASSERT_TRUE(inf->known.count("shape"));
  EXPECT_EQ(inf->known.at("shape").ToInt64Vector(), (std::vector<int64_t>{3, -1}));
  EXPECT_FALSE(inf->known.count("wc")) << "folding read a weight value (law 1)";

  auto folded = FoldStructural(*graph, *inf);
  ASSERT_TRUE(folded.ok());
  std::vector<std::string> ops;
  for (const Node& n : folded->nodes) ops.push_back(n.op_type);
  EXPECT_EQ(ops, (std::vector<std::string>{"Reshape", "Cast"}));
  EXPECT_TRUE(folded->initializers.count("shape"));
  EXPECT_TRUE(folded->initializers.count("w"));
  EXPECT_FALSE(folded->initializers.count("zero")) << "unused structural constants are dropped";

  // The folded graph computes the same thing.
  auto i1 = Interpreter::Create(graph);
  auto i2 = Interpreter::Create(std::make_shared<const Graph>(*folded));
  ASSERT_TRUE(i1.ok() && i2.ok());
  auto o1 = i1->Run({{"x", Iota({3, 4, 6})}});
  auto o2 = i2->Run({{"x", Iota({3, 4, 6})}});
  ASSERT_TRUE(o1.ok() && o2.ok());
  EXPECT_EQ(std::memcmp(o1->at("y").raw_data(), o2->at("y").raw_data(), o1->at("y").nbytes()), 0);
}

TEST(ShapeInference, NamesTheInputWhenShapesAreMissingOrWrong) {
  auto graph = TwoLayer();
  auto symbolic = InferShapes(*graph, {});
  ASSERT_FALSE(symbolic.ok());
  EXPECT_NE(symbolic.status().message().find("'x'"), std::string::npos);
  auto wrong = InferShapes(*graph, {{"x", {2, 5}}});
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("dim 1"), std::string::npos) << wrong.status().ToString();
}

}  // namespace
}  // namespace kiln
