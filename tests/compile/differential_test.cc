// Differential tests: every op the interpreter supports, compiled into a cell and run against the
// interpreter on the same inputs.
//
// How to add an op: add a Case to the group whose opset it needs (kOpset17Cases, kLegacyCases or
// kOpset18Cases): its op type, inputs (shape, dtype, value domain, or a structural constant),
// attributes and output count. Each group becomes one graph (one node per case, every case's
// inputs its own graph inputs) compiled once, so adding a case costs no extra compile.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <set>

#include "src/kiln/cell/loader.h"
#include "src/kiln/compile/pipeline.h"
#include "src/kiln/eager/interpreter.h"
#include "src/kiln/eager/shape_inference.h"
#include "src/kiln/base/file.h"
#include "src/kiln/graph/onnx_import.h"
#include "tests/graph/onnx_builder.h"

namespace kiln {
namespace {

using testing::OnnxBuilder;

enum class Domain { kAny, kPositive, kBool, kIndex };

struct In {
  std::vector<int64_t> shape;
  int elem = onnx::TensorProto::FLOAT;
  Domain domain = Domain::kAny;
  std::vector<int64_t> const_ints;  // non-empty: a structural int64 initializer with these values
  bool as_weight = false;           // a float initializer (bound weight) instead of an input
};

struct Case {
  std::string op;
  std::vector<In> inputs;
  std::function<void(onnx::NodeProto&)> attrs = nullptr;
  int outputs = 1;
};

In F(std::vector<int64_t> s, Domain d = Domain::kAny) { return In{std::move(s), onnx::TensorProto::FLOAT, d, {}}; }
In W(std::vector<int64_t> s) { In i = F(std::move(s)); i.as_weight = true; return i; }
In B(std::vector<int64_t> s) { return In{std::move(s), onnx::TensorProto::BOOL, Domain::kBool, {}}; }
In C(std::vector<int64_t> values) {
  In i;
  i.shape = {static_cast<int64_t>(values.size())};
  i.elem = onnx::TensorProto::INT64;
  i.const_ints = std::move(values);
  return i;
}
In CScalar(int64_t v) { In i = C({v}); i.shape = {}; return i; }
In Idx(std::vector<int64_t> s) { return In{std::move(s), onnx::TensorProto::INT64, Domain::kIndex, {}}; }

auto Ints(const char* name, std::vector<int64_t> v) {
  return [=](onnx::NodeProto& n) { OnnxBuilder::IntsAttr(n, name, v); };
}
auto Int(const char* name, int64_t v) {
  return [=](onnx::NodeProto& n) { OnnxBuilder::IntAttr(n, name, v); };
}
auto Flt(const char* name, float v) {
  return [=](onnx::NodeProto& n) { OnnxBuilder::FloatAttr(n, name, v); };
}
auto Str(const char* name, const char* v) {
  return [=](onnx::NodeProto& n) {
    auto* a = n.add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::STRING);
    a->set_s(v);
  };
}
template <typename... Fs>
std::function<void(onnx::NodeProto&)> All(Fs... fs) {
  return [=](onnx::NodeProto& n) { (fs(n), ...); };
}

const std::vector<Case>& Opset17Cases() {
  static const std::vector<Case> cases = {
      // elementwise, unary
      {"Sqrt", {F({2, 3, 4}, Domain::kPositive)}}, {"Exp", {F({2, 3, 4})}},
      {"Log", {F({2, 3, 4}, Domain::kPositive)}}, {"Neg", {F({2, 3, 4})}},
      {"Abs", {F({2, 3, 4})}}, {"Reciprocal", {F({2, 3, 4}, Domain::kPositive)}},
      {"Relu", {F({2, 3, 4})}}, {"LeakyRelu", {F({2, 3, 4})}, Flt("alpha", 0.2f)},
      {"Sigmoid", {F({2, 3, 4})}}, {"Tanh", {F({2, 3, 4})}}, {"Erf", {F({2, 3, 4})}},
      {"HardSigmoid", {F({2, 3, 4})}}, {"HardSwish", {F({2, 3, 4})}}, {"Sin", {F({2, 3, 4})}},
      {"Cos", {F({2, 3, 4})}}, {"Floor", {F({2, 3, 4})}}, {"Ceil", {F({2, 3, 4})}},
      {"Softplus", {F({2, 3, 4})}}, {"Elu", {F({2, 3, 4})}}, {"Sign", {F({2, 3, 4})}},
      {"Not", {B({2, 3})}}, {"Identity", {F({2, 3})}},
      // elementwise, binary with broadcasting
      {"Add", {F({2, 3, 4}), F({3, 1})}}, {"Sub", {F({2, 3, 4}), F({4})}},
      {"Mul", {F({2, 3, 4}), W({1, 3, 1})}}, {"Div", {F({2, 3, 4}), F({2, 1, 4}, Domain::kPositive)}},
      {"Pow", {F({2, 3, 4}, Domain::kPositive), F({})}}, {"Min", {F({2, 3, 4}), F({3, 4})}},
      {"Max", {F({2, 3, 4}), F({3, 4})}}, {"Equal", {F({2, 3}), F({2, 3})}},
      {"Less", {F({2, 3}), F({3})}}, {"Greater", {F({2, 3}), F({3})}},
      {"LessOrEqual", {F({2, 3}), F({3})}}, {"GreaterOrEqual", {F({2, 3}), F({3})}},
      {"And", {B({2, 3}), B({3})}}, {"Or", {B({2, 3}), B({3})}},
      {"Where", {B({2, 3}), F({2, 3}), F({3})}}, {"Clip", {F({2, 3, 4}), W({}), W({})}},
      {"Cast", {F({2, 3})}, Int("to", onnx::TensorProto::INT64)},
      {"Cast", {Idx({2, 3})}, Int("to", onnx::TensorProto::FLOAT)},
      {"Cast", {F({2, 3})}, Int("to", onnx::TensorProto::BOOL)},
      // reductions
      {"Softmax", {F({2, 3, 5})}}, {"Softmax", {F({2, 3, 5})}, Int("axis", 1)},
      {"LogSoftmax", {F({2, 3, 5})}}, {"ReduceMean", {F({2, 3, 5})}, Ints("axes", {1})},
      {"ReduceSum", {F({2, 3, 5}), C({-1})}}, {"ReduceMax", {F({2, 3, 5})}, Ints("axes", {0, 2})},
      {"ReduceMin", {F({2, 3, 5})}, Int("keepdims", 0)},
      {"ReduceProd", {F({2, 3, 5})}, Ints("axes", {2})}, {"ReduceL2", {F({2, 3, 5})}},
      // nn
      {"MatMul", {F({2, 1, 3, 4}), F({5, 4, 2})}}, {"MatMul", {F({3, 8, 4}), W({4, 6})}},
      {"MatMul", {F({4}), F({4, 3})}},
      {"Gemm", {F({3, 4}), W({5, 4}), W({5})}, All(Int("transB", 1), Flt("alpha", 0.5f))},
      {"Gemm", {F({4, 3}), F({4, 5})}, Int("transA", 1)},
      {"Conv", {F({1, 4, 9, 9}), W({6, 2, 3, 3}), W({6})},
       All(Ints("pads", {1, 0, 2, 1}), Ints("strides", {2, 1}), Int("group", 2))},
      {"Conv", {F({1, 3, 8, 8}), W({4, 3, 3, 3})},
       All(Ints("dilations", {2, 2}), [](onnx::NodeProto& n) {
             auto* a = n.add_attribute();
             a->set_name("auto_pad");
             a->set_type(onnx::AttributeProto::STRING);
             a->set_s("SAME_UPPER");
           })},
      {"Conv", {F({1, 3, 10}), W({2, 3, 3})}},
      {"MaxPool", {F({1, 2, 7, 7})}, All(Ints("kernel_shape", {3, 3}), Ints("strides", {2, 2}), Int("ceil_mode", 1))},
      {"AveragePool", {F({1, 2, 6, 6})}, All(Ints("kernel_shape", {2, 2}), Ints("pads", {1, 1, 1, 1}))},
      {"GlobalAveragePool", {F({1, 3, 5, 5})}}, {"GlobalMaxPool", {F({1, 3, 5, 5})}},
      {"BatchNormalization", {F({2, 3, 4, 4}), W({3}), W({3}), W({3}), F({3}, Domain::kPositive)}},
      {"InstanceNormalization", {F({2, 3, 4, 4}), W({3}), W({3})}},
      {"LayerNormalization", {F({2, 5, 8}), W({8}), W({8})}},
      {"LayerNormalization", {F({2, 5, 8}), W({5, 8})}, Int("axis", 1)},
      // shape and data movement
      {"Reshape", {F({2, 3, 4}), C({4, -1})}}, {"Transpose", {F({2, 3, 4})}, Ints("perm", {1, 2, 0})},
      {"Transpose", {F({2, 3, 4, 5})}, Ints("perm", {0, 2, 1, 3})},
      {"Concat", {F({2, 3}), F({2, 5})}, Int("axis", 1)},
      {"Concat", {F({2, 3, 4}), F({2, 1, 4}), F({2, 2, 4})}, Int("axis", -2)},
      {"Concat", {Idx({1, 3}), Idx({2, 3})}, Int("axis", 0)},
      {"Split", {F({6, 4}), C({2, 4})}, Int("axis", 0), 2},
      {"Slice", {F({6, 8}), C({1, 7}), C({5, 0}), C({0, 1}), C({2, -2})}},
      {"Gather", {F({5, 4}), Idx({3})}, Int("axis", 0)},
      {"Gather", {F({2, 5, 4}), C({3, 0, -1})}, Int("axis", 2)},
      {"Gather", {F({3, 5, 4}), CScalar(-2)}, Int("axis", 1)},
      {"Gather", {F({5, 4}), CScalar(-1)}, Int("axis", 1)},
      {"Squeeze", {F({1, 3, 1, 4}), C({0, 2})}}, {"Unsqueeze", {F({3, 4}), C({0, 3})}},
      {"Flatten", {F({2, 3, 4})}, Int("axis", 2)}, {"Expand", {F({3, 1}), C({2, 3, 4})}},
      {"Pad", {F({2, 3}), C({1, 0, 0, 2})}}, {"Tile", {F({2, 3}), C({2, 2})}},
      {"Resize", {F({1, 2, 3, 3}), In{}, In{{4}, onnx::TensorProto::FLOAT, Domain::kAny, {}, false}},
       nullptr},
      {"Resize", {F({1, 2, 3, 5}), In{}, In{{4}, onnx::TensorProto::FLOAT, Domain::kAny, {}, false}},
       All(Str("coordinate_transformation_mode", "asymmetric"), Str("nearest_mode", "floor"))},
      {"Resize", {F({1, 2, 3, 5}), In{}, In{{4}, onnx::TensorProto::FLOAT, Domain::kAny, {}, false}},
       Str("coordinate_transformation_mode", "asymmetric")},  // rounds: stays a reference op
      {"Shape", {F({2, 3, 4})}}, {"Size", {F({2, 3, 4})}},
      {"ConstantOfShape", {C({2, 3})}}, {"Dropout", {F({2, 3})}},
      {"Range", {In{{}, onnx::TensorProto::INT64, Domain::kAny, {0}}, In{{}, onnx::TensorProto::INT64, Domain::kAny, {7}}, In{{}, onnx::TensorProto::INT64, Domain::kAny, {2}}}},
  };
  return cases;
}

const std::vector<Case>& LegacyCases() {  // opset 9: attribute forms
  static const std::vector<Case> cases = {
      {"Clip", {F({2, 3})}, All(Flt("min", -0.2f), Flt("max", 0.3f))},
      {"Slice", {F({4, 6})}, All(Ints("starts", {1, 0}), Ints("ends", {3, 4}), Ints("axes", {0, 1}))},
      {"Unsqueeze", {F({3})}, Ints("axes", {0})},
      {"Squeeze", {F({1, 3})}, Ints("axes", {0})},
      {"Pad", {F({2, 3})}, All(Ints("pads", {0, 1, 1, 0}), Flt("value", 2.0f))},
      {"Softmax", {F({2, 6})}},
      {"Upsample", {F({1, 1, 2, 2}), In{{4}, onnx::TensorProto::FLOAT, Domain::kAny, {}, false}}},
      {"Split", {F({4, 2})}, Ints("split", {1, 3}), 2},
      {"ReduceSum", {F({2, 3})}, Ints("axes", {1})},
  };
  return cases;
}

const std::vector<Case>& Opset18Cases() {
  static const std::vector<Case> cases = {
      {"GroupNormalization", {F({2, 4, 3, 3}), W({2}), W({2})}, Int("num_groups", 2)},
      {"ReduceMean", {F({2, 3, 5}), C({1})}},
  };
  return cases;
}

// Issue 7, family A (elementwise, activations, reductions, normalizations, TopK, CumSum): one
// group per opset the cases need. Opset 17 unless a case says otherwise.
const std::vector<Case>& FamilyACases() {
  static const std::vector<Case> cases = {
  };
  return cases;
}

// Resize / Upsample scales: nearest 2x over the spatial dims.
std::vector<float> NearestScales() { return {1.0f, 1.0f, 2.0f, 2.0f}; }

struct Built {
  std::shared_ptr<const Graph> graph;
  TensorMap inputs;
  WeightMap weights;
};

Built BuildGroup(const std::vector<Case>& cases, int64_t opset) {
  OnnxBuilder b(opset);
  std::mt19937 rng(1234);
  TensorMap inputs;
  for (size_t c = 0; c < cases.size(); ++c) {
    const Case& k = cases[c];
    std::vector<std::string> names;
    for (size_t i = 0; i < k.inputs.size(); ++i) {
      const In& in = k.inputs[i];
      const std::string name = "c" + std::to_string(c) + "_in" + std::to_string(i);
      if (k.op == "Resize" && i == 1) {  // roi: absent
        names.push_back("");
        continue;
      }
      if ((k.op == "Resize" && i == 2) || (k.op == "Upsample" && i == 1)) {
        b.FloatInit(name, {4}, NearestScales());  // structural float (shape-determining)
        names.push_back(name);
        continue;
      }
      if (!in.const_ints.empty()) {
        b.Int64Init(name, in.shape, in.const_ints);
        names.push_back(name);
        continue;
      }
      const int64_t n = NumElements(in.shape);
      if (in.as_weight) {
        std::vector<float> v(static_cast<size_t>(n));
        std::uniform_real_distribution<float> u(-1.0f, 1.0f);
        for (auto& x : v) x = u(rng);
        b.FloatInit(name, in.shape, v);
        names.push_back(name);
        continue;
      }
      b.Input(name, in.elem, in.shape);
      Tensor t;
      if (in.elem == onnx::TensorProto::FLOAT) {
        std::vector<float> v(static_cast<size_t>(n));
        std::uniform_real_distribution<float> u(in.domain == Domain::kPositive ? 0.1f : -2.0f, 2.0f);
        for (auto& x : v) x = u(rng);
        t = Tensor::FromVector<float>(in.shape, v);
      } else if (in.elem == onnx::TensorProto::BOOL) {
        t = *Tensor::Empty(DType::kBool, in.shape);
        for (int64_t j = 0; j < n; ++j) t.data<uint8_t>()[j] = rng() % 2;
      } else {
        std::vector<int64_t> v(static_cast<size_t>(n));
        for (auto& x : v) x = static_cast<int64_t>(rng() % 4);
        t = Tensor::FromVector<int64_t>(in.shape, v);
      }
      inputs[name] = t;
      names.push_back(name);
    }
    std::vector<std::string> outs;
    for (int o = 0; o < k.outputs; ++o) outs.push_back("c" + std::to_string(c) + "_" + k.op + "_out" + std::to_string(o));
    auto& node = b.Node(k.op, names, outs, "case" + std::to_string(c));
    if (k.attrs) k.attrs(node);
    for (const auto& o : outs) {
      auto* vi = b.graph().add_output();
      vi->set_name(o);
      // Element type fixed up after shape inference; no shape declared.
      vi->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
    }
  }
  // Output types are filled in from shape inference below (the builder declared none).
  auto g = ImportOnnxBytes(b.Bytes(), "differential");
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  Graph graph = std::move(g).value();
  std::map<std::string, Shape> shapes;
  for (const auto& [n, t] : inputs) shapes[n] = t.shape();
  auto inf = InferShapes(graph, shapes);
  EXPECT_TRUE(inf.ok()) << inf.status().ToString();
  for (ValueInfo& v : graph.outputs) {
    v.dtype = inf->types.at(v.name).dtype;
    v.has_shape = false;
  }
  Built built;
  built.graph = std::make_shared<const Graph>(std::move(graph));
  built.inputs = inputs;
  built.weights = GraphWeights(*built.graph);
  return built;
}

void RunBuilt(Built b, int64_t opset, int threads, const std::string& tag) {
  auto eager = Interpreter::Create(b.graph);
  ASSERT_TRUE(eager.ok()) << eager.status().ToString();
  auto ref = eager->Run(b.inputs, &b.weights);
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();

  ShapeClass cls;
  for (const auto& [n, t] : b.inputs) cls[n] = t.shape();
  Envelope env{{cls}};
  CompileOptions options;
  std::vector<Program> programs;
  auto cell = GenerateCell(*b.graph, env, "differential", options, nullptr, &programs);
  ASSERT_TRUE(cell.ok()) << cell.status().ToString();
  auto toolchain = LocalToolchain();
  ASSERT_TRUE(toolchain.ok());
  auto driver = MakeSystemCompilerDriver(*toolchain);
  const std::string dir = "/tmp/kiln-diff-" + tag + std::to_string(opset) + "-" + std::to_string(::getpid());
  ASSERT_TRUE(MakeDirs(dir).ok());
  auto so = BuildSharedObject(cell->source, 1, DefaultSmTarget(), "diff", *driver, dir, 2, nullptr);
  ASSERT_TRUE(so.ok()) << so.status().ToString();
  auto lib = OpenCellBytes(*so, dir + "/load");
  ASSERT_TRUE(lib.ok()) << lib.status().ToString();
  EntryMetadata e;
  e.index = 0;
  e.shape_class = cls;
  for (const auto& j : cell->describe["entries"][0]["inputs"]) {
    e.inputs.push_back({j["name"], *DTypeFromName(j["dtype"]), j["shape"].get<Shape>()});
  }
  for (const auto& j : cell->describe["entries"][0]["outputs"]) {
    e.outputs.push_back({j["name"], *DTypeFromName(j["dtype"]), j["shape"].get<Shape>()});
  }
  for (const auto& j : cell->describe["entries"][0]["constants"]) {
    e.constants.push_back({j["name"], *DTypeFromName(j["dtype"]), j["shape"].get<Shape>()});
  }
  e.workspace_bytes = cell->describe["entries"][0]["workspace_bytes"];
  auto armed = ArmedCell::Arm(*lib, {e}, b.weights, Lane::kIntake, "", threads);
  ASSERT_TRUE(armed.ok()) << armed.status().ToString();
  CellRunError err;
  auto got = (*armed)->Run(0, b.inputs, &err);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  int specialized = 0;
  for (const Kernel& k : programs[0].kernels) specialized += k.kind != Kernel::Kind::kReference;
  for (const auto& [name, r] : *ref) {
    const Tensor& c = got->at(name);
    ASSERT_EQ(c.dtype(), r.dtype()) << name;
    ASSERT_EQ(c.shape(), r.shape()) << name;
    double max_ref = 1.0;
    for (int64_t i = 0; i < r.numel(); ++i) max_ref = std::max(max_ref, std::fabs(r.GetAsDouble(i)));
    for (int64_t i = 0; i < r.numel(); ++i) {
      ASSERT_NEAR(c.GetAsDouble(i), r.GetAsDouble(i), 2e-5 * max_ref) << name << " element " << i;
    }
  }
  ::testing::Test::RecordProperty("specialized_kernels", specialized);
}

void RunGroup(const std::vector<Case>& cases, int64_t opset) {
  RunBuilt(BuildGroup(cases, opset), opset, 1, "");
}

// Issue 7, family B (indexing, scatter/gather, ConvTranspose, Einsum, quantized, recurrent).
const std::vector<Case>& FamilyBCases() {
  static const std::vector<Case> cases = {
  };
  return cases;
}

// Fused convolution epilogues (prepared at bind time) and kernels big enough to run on the
// host's thread team, on two threads.
Built BuildParallelChain() {
  OnnxBuilder b(17);
  std::mt19937 rng(99);
  auto weight = [&](const std::string& name, std::vector<int64_t> dims) {
    std::vector<float> v(static_cast<size_t>(NumElements(dims)));
    std::uniform_real_distribution<float> u(-0.5f, 0.5f);
    for (auto& x : v) x = u(rng);
    b.FloatInit(name, dims, v);
  };
  auto input = [&](TensorMap& inputs, const std::string& name, std::vector<int64_t> dims) {
    b.Input(name, onnx::TensorProto::FLOAT, dims);
    std::vector<float> v(static_cast<size_t>(NumElements(dims)));
    std::uniform_real_distribution<float> u(-2.0f, 2.0f);
    for (auto& x : v) x = u(rng);
    inputs[name] = Tensor::FromVector<float>(dims, v);
  };
  TensorMap inputs;
  input(inputs, "x", {1, 16, 48, 48});
  input(inputs, "rows", {64, 1024});
  input(inputs, "cube", {4, 64, 256});
  weight("w1", {16, 16, 3, 3});
  weight("b1", {16});
  weight("w2", {24, 16, 1, 1});
  weight("w3", {16, 1, 3, 3});
  weight("g", {1024});
  weight("beta", {1024});
  weight("gi", {16});
  weight("bi", {16});
  std::vector<std::string> outs;
  auto out = [&](const std::string& name) { outs.push_back(name); };
  // Conv + residual Add + Relu: a conv with sum and post-op epilogue.
  OnnxBuilder::IntsAttr(b.Node("Conv", {"x", "w1", "b1"}, {"c1"}, "conv1"), "pads", {1, 1, 1, 1});
  b.Node("Add", {"c1", "x"}, {"r1"}, "add1");
  b.Node("Relu", {"r1"}, {"y1"}, "relu1");
  out("y1");
  // Conv + residual Add alone: the sum rides the output reorder.
  OnnxBuilder::IntsAttr(b.Node("Conv", {"y1", "w1", "b1"}, {"c13"}, "conv13"), "pads", {1, 1, 1, 1});
  b.Node("Add", {"c13", "x"}, {"y13"}, "add13");
  out("y13");
  // 1x1 conv (plain layout) + Sigmoid.
  b.Node("Conv", {"y1", "w2"}, {"c2"}, "conv2");
  b.Node("Sigmoid", {"c2"}, {"y2"}, "sig2");
  out("y2");
  // Depthwise conv + SiLU (x * sigmoid(x)).
  auto& dw = b.Node("Conv", {"x", "w3"}, {"c3"}, "conv3");
  OnnxBuilder::IntsAttr(dw, "pads", {1, 1, 1, 1});
  OnnxBuilder::IntAttr(dw, "group", 16);
  b.Node("Sigmoid", {"c3"}, {"s3"}, "sig3");
  b.Node("Mul", {"c3", "s3"}, {"y3"}, "mul3");
  out("y3");
  // Large elementwise, softmax (contiguous and strided), norms and a transpose.
  b.Node("Mul", {"x", "x"}, {"x2"}, "sq");
  b.Node("Tanh", {"x2"}, {"y4"}, "tanh4");
  out("y4");
  b.Node("Softmax", {"rows"}, {"y5"}, "softmax5");
  out("y5");
  OnnxBuilder::IntAttr(b.Node("Softmax", {"cube"}, {"y6"}, "softmax6"), "axis", 1);
  out("y6");
  b.Node("LayerNormalization", {"rows", "g", "beta"}, {"y7"}, "ln7");
  out("y7");
  b.Node("InstanceNormalization", {"x", "gi", "bi"}, {"y8"}, "in8");
  out("y8");
  OnnxBuilder::IntsAttr(b.Node("Transpose", {"rows"}, {"y9"}, "tr9"), "perm", {1, 0});
  out("y9");
  // Concat along channels of two computed tensors.
  OnnxBuilder::IntAttr(b.Node("Concat", {"y1", "x2"}, {"y12"}, "cat12"), "axis", 1);
  out("y12");
  // Batched small GEMMs (one per thread) and a larger batched GEMM.
  input(inputs, "qa", {4, 32, 32});
  input(inputs, "qb", {4, 32, 32});
  b.Node("MatMul", {"qa", "qb"}, {"y10"}, "mm10");
  out("y10");
  input(inputs, "ma", {3, 64, 128});
  input(inputs, "mb", {3, 128, 64});
  b.Node("MatMul", {"ma", "mb"}, {"y11"}, "mm11");
  out("y11");
  for (const auto& o : outs) {
    auto* vi = b.graph().add_output();
    vi->set_name(o);
    vi->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
  }
  auto g = ImportOnnxBytes(b.Bytes(), "parallel");
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  Graph graph = std::move(g).value();
  for (ValueInfo& v : graph.outputs) {
    v.dtype = DType::kFloat32;
    v.has_shape = false;
  }
  Built built;
  built.graph = std::make_shared<const Graph>(std::move(graph));
  built.inputs = inputs;
  built.weights = GraphWeights(*built.graph);
  return built;
}

TEST(Differential, FusedConvEpiloguesAndParallelKernelsOnTwoThreads) {
  RunBuilt(BuildParallelChain(), 17, 2, "par");
}

TEST(Differential, EveryOpCompiledMatchesEagerOpset17) { RunGroup(Opset17Cases(), 17); }
TEST(Differential, LegacyFormsCompiledMatchEagerOpset9) { RunGroup(LegacyCases(), 9); }
TEST(Differential, Opset18OpsCompiledMatchEager) { RunGroup(Opset18Cases(), 18); }
TEST(Differential, FamilyAOpsCompiledMatchEager) {
  if (FamilyACases().empty()) GTEST_SKIP() << "no family A cases yet";
  RunGroup(FamilyACases(), 17);
}
TEST(Differential, FamilyBOpsCompiledMatchEager) {
  if (FamilyBCases().empty()) GTEST_SKIP() << "no family B cases yet";
  RunGroup(FamilyBCases(), 17);
}

// Every op in the registry appears in some case (a new op without a differential case fails).
TEST(Differential, EveryRegisteredOpHasACase) {
  std::set<std::string> covered = {"Constant", "If", "Loop", "Scan"};  // subgraphs: control_flow_test
  for (const auto* group :
       {&Opset17Cases(), &LegacyCases(), &Opset18Cases(), &FamilyACases(), &FamilyBCases()}) {
    for (const Case& c : *group) covered.insert(c.op);
  }
  for (const std::string& op : OpRegistry::Global().OpTypes()) {
    EXPECT_TRUE(covered.count(op)) << "op " << op << " has no differential case";
  }
}

}  // namespace
}  // namespace kiln
