// Differential tests: every op the interpreter supports, compiled into a cell and run against the
// interpreter on the same inputs.
//
// How to add an op: add a Case to the group whose opset it needs (kOpset17Cases, kLegacyCases or
// kOpset18Cases): its op type, inputs (shape, dtype, value domain, or a structural constant),
// attributes and output count. Each group becomes one graph (one node per case, every case's
// inputs its own graph inputs) compiled once, so adding a case costs no extra compile.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>
#include <set>
#include <sstream>

#include "src/kiln/abi/cell_abi.h"
#include "src/kiln/arm/loader.h"
#include "src/kiln/base/file.h"
#include "src/kiln/compile/packed_boundary.h"
#include "src/kiln/compile/pipeline.h"
#include "src/kiln/eager/interpreter.h"
#include "src/kiln/graph/onnx_import.h"
#include "src/kiln/mint/mint.h"
#include "src/kiln/ops/shape_inference.h"
#include "tests/graph/onnx_builder.h"

namespace kiln {
namespace {

using testing::OnnxBuilder;

// kLargeScale: weights in [200, 2000), output scales that keep requantized int8 in range.
enum class Domain { kAny, kPositive, kBool, kIndex, kLargeScale };

struct In {
  std::vector<int64_t> shape;
  int elem = onnx::TensorProto::FLOAT;
  Domain domain = Domain::kAny;
  std::vector<int64_t> const_ints;  // non-empty: a structural int64 initializer with these values
  bool as_weight = false;           // a float initializer (bound weight) instead of an input
  bool absent = false;              // an omitted optional input ("")
  std::vector<float> const_floats = {};  // non-empty: a float initializer with these values
};

struct Case {
  std::string op;
  std::vector<In> inputs;
  std::function<void(onnx::NodeProto&)> attrs = nullptr;
  int outputs = 1;
  std::set<int> omitted_outputs = {};  // output slots left "" (optional outputs not requested)
};

In F(std::vector<int64_t> s, Domain d = Domain::kAny) {
  return In{std::move(s), onnx::TensorProto::FLOAT, d, {}};
}
In W(std::vector<int64_t> s) {
  In i = F(std::move(s));
  i.as_weight = true;
  return i;
}
In B(std::vector<int64_t> s) {
  return In{std::move(s), onnx::TensorProto::BOOL, Domain::kBool, {}};
}
In C(std::vector<int64_t> values) {
  In i;
  i.shape = {static_cast<int64_t>(values.size())};
  i.elem = onnx::TensorProto::INT64;
  i.const_ints = std::move(values);
  return i;
}
In CScalar(int64_t v) {
  In i = C({v});
  i.shape = {};
  return i;
}
In Idx(std::vector<int64_t> s) {
  return In{std::move(s), onnx::TensorProto::INT64, Domain::kIndex, {}};
}
// 8-bit tensors (full range) as inputs or bound weights, positive float weights (scales), int32
// inputs in [0, 4) (sequence lengths), and omitted optional inputs.
In I8In(std::vector<int64_t> s) {
  return In{std::move(s), onnx::TensorProto::INT8, Domain::kAny, {}};
}
In U8In(std::vector<int64_t> s) {
  return In{std::move(s), onnx::TensorProto::UINT8, Domain::kAny, {}};
}
In I8W(std::vector<int64_t> s) {
  In i = I8In(std::move(s));
  i.as_weight = true;
  return i;
}
In U8W(std::vector<int64_t> s) {
  In i = U8In(std::move(s));
  i.as_weight = true;
  return i;
}
In PosW(std::vector<int64_t> s) {
  In i = W(std::move(s));
  i.domain = Domain::kPositive;
  return i;
}
// The wider integers (INT16, UINT16, UINT32, UINT64) as inputs: full-range bits, or with
// kPositive values in [1, 1000] (divisors), or with kIndex in [0, 4) (small exponents).
In WideIn(std::vector<int64_t> s, int elem, Domain d = Domain::kAny) {
  return In{std::move(s), elem, d, {}};
}
// float16 inputs: drawn like float ones, then rounded to float16.
In H(std::vector<int64_t> s, Domain d = Domain::kAny) {
  return In{std::move(s), onnx::TensorProto::FLOAT16, d, {}};
}
In I32Idx(std::vector<int64_t> s) {
  return In{std::move(s), onnx::TensorProto::INT32, Domain::kIndex, {}};
}
// An int32 bound weight in [-1000, 1000]: a quantized bias, checkpoint data (law 1).
In I32W(std::vector<int64_t> s) {
  In i{std::move(s), onnx::TensorProto::INT32, Domain::kAny, {}};
  i.as_weight = true;
  return i;
}
In Absent() {
  In i;
  i.absent = true;
  return i;
}
In BigW(std::vector<int64_t> s) {
  In i = W(std::move(s));
  i.domain = Domain::kLargeScale;
  return i;
}

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
auto Strs(const char* name, std::vector<std::string> v) {
  return [=](onnx::NodeProto& n) {
    auto* a = n.add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::STRINGS);
    for (const auto& x : v) a->add_strings(x);
  };
}
auto Flts(const char* name, std::vector<float> v) {
  return [=](onnx::NodeProto& n) {
    auto* a = n.add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::FLOATS);
    for (float x : v) a->add_floats(x);
  };
}
template <typename... Fs>
std::function<void(onnx::NodeProto&)> All(Fs... fs) {
  return [=](onnx::NodeProto& n) { (fs(n), ...); };
}

const std::vector<Case>& Opset17Cases() {
  static const std::vector<Case> cases = {
      // elementwise, unary
      {"Sqrt", {F({2, 3, 4}, Domain::kPositive)}},
      {"Exp", {F({2, 3, 4})}},
      {"Log", {F({2, 3, 4}, Domain::kPositive)}},
      {"Neg", {F({2, 3, 4})}},
      {"Abs", {F({2, 3, 4})}},
      {"Reciprocal", {F({2, 3, 4}, Domain::kPositive)}},
      {"Relu", {F({2, 3, 4})}},
      {"LeakyRelu", {F({2, 3, 4})}, Flt("alpha", 0.2f)},
      {"Sigmoid", {F({2, 3, 4})}},
      {"Tanh", {F({2, 3, 4})}},
      {"Erf", {F({2, 3, 4})}},
      {"HardSigmoid", {F({2, 3, 4})}},
      {"HardSwish", {F({2, 3, 4})}},
      {"Sin", {F({2, 3, 4})}},
      {"Cos", {F({2, 3, 4})}},
      {"Floor", {F({2, 3, 4})}},
      {"Ceil", {F({2, 3, 4})}},
      {"Softplus", {F({2, 3, 4})}},
      {"Elu", {F({2, 3, 4})}},
      {"Sign", {F({2, 3, 4})}},
      {"Not", {B({2, 3})}},
      {"Identity", {F({2, 3})}},
      // elementwise, binary with broadcasting
      {"Add", {F({2, 3, 4}), F({3, 1})}},
      {"Sub", {F({2, 3, 4}), F({4})}},
      {"Mul", {F({2, 3, 4}), W({1, 3, 1})}},
      {"Div", {F({2, 3, 4}), F({2, 1, 4}, Domain::kPositive)}},
      {"Pow", {F({2, 3, 4}, Domain::kPositive), F({})}},
      {"Min", {F({2, 3, 4}), F({3, 4})}},
      {"Max", {F({2, 3, 4}), F({3, 4})}},
      {"Equal", {F({2, 3}), F({2, 3})}},
      {"Less", {F({2, 3}), F({3})}},
      {"Greater", {F({2, 3}), F({3})}},
      {"LessOrEqual", {F({2, 3}), F({3})}},
      {"GreaterOrEqual", {F({2, 3}), F({3})}},
      {"And", {B({2, 3}), B({3})}},
      {"Or", {B({2, 3}), B({3})}},
      {"Where", {B({2, 3}), F({2, 3}), F({3})}},
      {"Clip", {F({2, 3, 4}), W({}), W({})}},
      {"Cast", {F({2, 3})}, Int("to", onnx::TensorProto::INT64)},
      {"Cast", {Idx({2, 3})}, Int("to", onnx::TensorProto::FLOAT)},
      {"Cast", {F({2, 3})}, Int("to", onnx::TensorProto::BOOL)},
      // reductions
      {"Softmax", {F({2, 3, 5})}},
      {"Softmax", {F({2, 3, 5})}, Int("axis", 1)},
      {"LogSoftmax", {F({2, 3, 5})}},
      {"ReduceMean", {F({2, 3, 5})}, Ints("axes", {1})},
      {"ReduceSum", {F({2, 3, 5}), C({-1})}},
      {"ReduceMax", {F({2, 3, 5})}, Ints("axes", {0, 2})},
      {"ReduceMin", {F({2, 3, 5})}, Int("keepdims", 0)},
      {"ReduceProd", {F({2, 3, 5})}, Ints("axes", {2})},
      {"ReduceL2", {F({2, 3, 5})}},
      // nn
      {"MatMul", {F({2, 1, 3, 4}), F({5, 4, 2})}},
      {"MatMul", {F({3, 8, 4}), W({4, 6})}},
      {"MatMul", {F({4}), F({4, 3})}},
      {"Gemm", {F({3, 4}), W({5, 4}), W({5})}, All(Int("transB", 1), Flt("alpha", 0.5f))},
      {"Gemm", {F({4, 3}), F({4, 5})}, Int("transA", 1)},
      {"Conv",
       {F({1, 4, 9, 9}), W({6, 2, 3, 3}), W({6})},
       All(Ints("pads", {1, 0, 2, 1}), Ints("strides", {2, 1}), Int("group", 2))},
      {"Conv",
       {F({1, 3, 8, 8}), W({4, 3, 3, 3})},
       All(Ints("dilations", {2, 2}),
           [](onnx::NodeProto& n) {
             auto* a = n.add_attribute();
             a->set_name("auto_pad");
             a->set_type(onnx::AttributeProto::STRING);
             a->set_s("SAME_UPPER");
           })},
      {"Conv", {F({1, 3, 10}), W({2, 3, 3})}},
      {"MaxPool",
       {F({1, 2, 7, 7})},
       All(Ints("kernel_shape", {3, 3}), Ints("strides", {2, 2}), Int("ceil_mode", 1))},
      // ceil_mode that adds a last, clipped window (8 -> 4, not 3), with and without padding
      {"MaxPool",
       {F({1, 3, 8, 8})},
       All(Ints("kernel_shape", {3, 3}), Ints("strides", {2, 2}), Int("ceil_mode", 1))},
      {"MaxPool",
       {F({2, 2, 10, 9})},
       All(Ints("kernel_shape", {3, 2}), Ints("strides", {2, 3}), Ints("pads", {1, 0, 1, 1}),
           Int("ceil_mode", 1))},
      // With Indices (output 1), row and column major, and the 8-bit inputs.
      {"MaxPool",
       {F({2, 2, 6, 5})},
       All(Ints("kernel_shape", {3, 2}), Ints("pads", {1, 1, 1, 0})),
       2},
      {"MaxPool",
       {F({1, 2, 5, 5})},
       All(Ints("kernel_shape", {2, 2}), Ints("strides", {2, 2}), Int("storage_order", 1)),
       2},
      {"MaxPool", {U8In({1, 3, 6, 6})}, All(Ints("kernel_shape", {2, 2}), Ints("strides", {2, 2}))},
      {"MaxPool", {I8In({1, 2, 7})}, All(Ints("kernel_shape", {3}), Ints("pads", {1, 1})), 2},
      {"AveragePool",
       {F({1, 2, 6, 6})},
       All(Ints("kernel_shape", {2, 2}), Ints("pads", {1, 1, 1, 1}))},
      {"GlobalAveragePool", {F({1, 3, 5, 5})}},
      {"GlobalMaxPool", {F({1, 3, 5, 5})}},
      {"BatchNormalization", {F({2, 3, 4, 4}), W({3}), W({3}), W({3}), F({3}, Domain::kPositive)}},
      {"InstanceNormalization", {F({2, 3, 4, 4}), W({3}), W({3})}},
      {"LayerNormalization", {F({2, 5, 8}), W({8}), W({8})}},
      {"LayerNormalization", {F({2, 5, 8}), W({5, 8})}, Int("axis", 1)},
      // shape and data movement
      {"Reshape", {F({2, 3, 4}), C({4, -1})}},
      {"Transpose", {F({2, 3, 4})}, Ints("perm", {1, 2, 0})},
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
      {"Squeeze", {F({1, 3, 1, 4}), C({0, 2})}},
      {"Unsqueeze", {F({3, 4}), C({0, 3})}},
      {"Flatten", {F({2, 3, 4})}, Int("axis", 2)},
      {"Expand", {F({3, 1}), C({2, 3, 4})}},
      {"Pad", {F({2, 3}), C({1, 0, 0, 2})}},
      {"Tile", {F({2, 3}), C({2, 2})}},
      {"Resize",
       {F({1, 2, 3, 3}), In{}, In{{4}, onnx::TensorProto::FLOAT, Domain::kAny, {}, false}},
       nullptr},
      {"Resize",
       {F({1, 2, 3, 5}), In{}, In{{4}, onnx::TensorProto::FLOAT, Domain::kAny, {}, false}},
       All(Str("coordinate_transformation_mode", "asymmetric"), Str("nearest_mode", "floor"))},
      {"Resize",
       {F({1, 2, 3, 5}), In{}, In{{4}, onnx::TensorProto::FLOAT, Domain::kAny, {}, false}},
       Str("coordinate_transformation_mode", "asymmetric")},  // rounds: stays a reference op
      {"Shape", {F({2, 3, 4})}},
      {"Size", {F({2, 3, 4})}},
      {"ConstantOfShape", {C({2, 3})}},
      {"Dropout", {F({2, 3})}},
      {"Range",
       {In{{}, onnx::TensorProto::INT64, Domain::kAny, {0}},
        In{{}, onnx::TensorProto::INT64, Domain::kAny, {7}},
        In{{}, onnx::TensorProto::INT64, Domain::kAny, {2}}}},
  };
  return cases;
}

const std::vector<Case>& LegacyCases() {  // opset 9: attribute forms
  static const std::vector<Case> cases = {
      {"Clip", {F({2, 3})}, All(Flt("min", -0.2f), Flt("max", 0.3f))},
      {"Scatter", {F({4, 3}), Idx({2, 3}), F({2, 3})}, Int("axis", 0)},
      {"Slice",
       {F({4, 6})},
       All(Ints("starts", {1, 0}), Ints("ends", {3, 4}), Ints("axes", {0, 1}))},
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

// Family C (quantized and recurrent ops), opset 17. Scales and zero points are bound
// weights as in a real quantized model; recurrent W/R/B/P are bound weights too.
const std::vector<Case>& FamilyCCases() {
  static const std::vector<Case> cases = {
      // quantize / dequantize: per tensor, per axis, int8 and uint8, absent zero point
      {"QuantizeLinear", {F({2, 3, 4}), PosW({}), U8W({})}},
      {"QuantizeLinear", {F({2, 3, 4}), PosW({3}), I8W({3})}, Int("axis", 1)},
      {"QuantizeLinear", {F({2, 3}), PosW({})}},
      {"DequantizeLinear", {I8W({4, 3}), PosW({3}), I8W({3})}, Int("axis", 1)},
      {"DequantizeLinear", {U8In({2, 5}), PosW({}), U8W({})}},
      // integer matmuls: per-column zero points, batch broadcast, int8 x int8 without zps
      {"MatMulInteger", {U8In({2, 3, 4}), I8W({4, 5}), U8W({}), I8W({5})}},
      {"MatMulInteger", {I8In({3, 4}), I8In({4, 2})}},
      {"QLinearMatMul",
       {U8In({2, 3, 4}), PosW({}), U8W({}), I8W({4, 3}), PosW({3}), I8W({3}), BigW({}), U8W({})}},
      // integer convolutions: groups, padding, strides, per-channel weights, int32 bias
      {"ConvInteger",
       {U8In({1, 4, 6, 6}), I8W({6, 2, 3, 3}), U8W({}), I8W({6})},
       All(Ints("pads", {1, 1, 1, 1}), Int("group", 2))},
      {"QLinearConv",
       {U8In({1, 3, 7, 7}), PosW({}), U8W({}), I8W({4, 3, 3, 3}), PosW({4}), I8W({4}), BigW({}),
        I8W({}), I32Idx({4})},
       Ints("strides", {2, 2})},
      // the bias as a real quantized model stores it: an int32 initializer, bound as a weight
      {"QLinearConv",
       {U8In({1, 3, 6, 6}), PosW({}), U8W({}), I8W({2, 3, 3, 3}), PosW({}), I8W({}), BigW({}),
        I8W({}), I32W({2})}},
      // a QDQ model's bias: int32 data dequantized to float
      {"DequantizeLinear", {I32W({6}), PosW({})}},
      {"QLinearConv",
       {I8In({1, 2, 9}), PosW({}), I8W({}), U8W({2, 2, 3}), PosW({}), U8W({}), BigW({}), U8W({})},
       Str("auto_pad", "SAME_LOWER")},
      // recurrent: every direction, optional inputs and outputs, sequence_lens, layout 1,
      // activations with alpha/beta, clip, linear_before_reset, peepholes, input_forget
      {"RNN",
       {F({3, 2, 4}), W({1, 5, 4}), W({1, 5, 5}), W({1, 10}), Absent(), F({1, 2, 5})},
       nullptr,
       2},
      {"RNN",
       {F({3, 2, 4}), W({2, 5, 4}), W({2, 5, 5})},
       All(Str("direction", "bidirectional"), Strs("activations", {"Relu", "Tanh"}),
           Flt("clip", 1.5f)),
       2,
       {0}},
      {"GRU",
       {F({4, 3, 4}), W({1, 9, 4}), W({1, 9, 3}), W({1, 18}), I32Idx({3}), F({1, 3, 3})},
       Int("linear_before_reset", 1),
       2},
      {"GRU",
       {F({2, 4, 3}), W({2, 9, 3}), W({2, 9, 3}), W({2, 18})},
       All(Str("direction", "bidirectional"), Int("layout", 1),
           Strs("activations", {"HardSigmoid", "Softsign", "Sigmoid", "Tanh"}),
           Flts("activation_alpha", {0.3f}), Flts("activation_beta", {0.4f})),
       2},
      {"LSTM",
       {F({3, 2, 4}), W({1, 12, 4}), W({1, 12, 3}), W({1, 24}), Absent(), F({1, 2, 3}),
        F({1, 2, 3}), W({1, 9})},
       Str("direction", "reverse"),
       3},
      {"LSTM",
       {F({2, 3, 4}), W({2, 12, 4}), W({2, 12, 3}), W({2, 24}), I32Idx({2}), F({2, 2, 3}),
        F({2, 2, 3}), W({2, 9})},
       All(Str("direction", "bidirectional"), Int("layout", 1), Flt("clip", 3.0f),
           Int("input_forget", 1)),
       3,
       {0}},
  };
  return cases;
}

// Family A (elementwise, activations, reductions, normalizations, TopK, CumSum): one group per
// opset the cases need. Opset 17 unless a case says otherwise.
const std::vector<Case>& FamilyACases() {
  static const std::vector<Case> cases = {
      // elementwise and activations
      {"Xor", {B({2, 3}), B({3})}},
      {"Mod", {Idx({2, 3}), C({3, -2, 5})}},
      {"Mod", {F({2, 3}), F({3}, Domain::kPositive)}, Int("fmod", 1)},
      {"Mod", {H({2, 3}), H({3}, Domain::kPositive)}, Int("fmod", 1)},
      {"Mod",
       {WideIn({2, 3}, onnx::TensorProto::INT16),
        WideIn({3}, onnx::TensorProto::INT16, Domain::kPositive)}},
      {"Mod",
       {WideIn({2, 3}, onnx::TensorProto::UINT64),
        WideIn({3}, onnx::TensorProto::UINT64, Domain::kPositive)}},
      {"Min", {WideIn({2, 3}, onnx::TensorProto::UINT64), WideIn({3}, onnx::TensorProto::UINT64)}},
      {"Max",
       {WideIn({2, 3}, onnx::TensorProto::UINT32), WideIn({2, 1}, onnx::TensorProto::UINT32)}},
      {"Max", {WideIn({4}, onnx::TensorProto::UINT16), WideIn({4}, onnx::TensorProto::UINT16)}},
      {"Pow",
       {F({2, 3}, Domain::kPositive), WideIn({3}, onnx::TensorProto::UINT32, Domain::kIndex)}},
      {"Sum", {F({2, 3, 4}), F({3, 1}), F({4})}},
      {"Sum", {F({2, 3})}},
      {"Mean", {F({2, 3, 4}), F({4}), F({})}},
      {"Min", {F({2, 3}), F({3}), F({2, 1})}},
      {"Max", {F({2, 3}), F({3}), F({2, 1})}},
      {"Round", {F({2, 3, 4})}},
      {"Sign", {F({2, 3})}},
      {"Floor", {F({3, 4})}},
      {"Ceil", {F({3, 4})}},
      {"Softsign", {F({2, 3, 4})}},
      {"Selu", {F({2, 3, 4})}, All(Flt("alpha", 1.5f), Flt("gamma", 1.2f))},
      {"Celu", {F({2, 3, 4})}, Flt("alpha", 2.0f)},
      {"Mish", {F({2, 3, 4})}},
      {"PRelu", {F({2, 3, 4}), W({3, 1})}},
      {"ThresholdedRelu", {F({2, 3, 4})}, Flt("alpha", 0.5f)},
      {"Shrink", {F({2, 3, 4})}, All(Flt("lambd", 0.7f), Flt("bias", 0.2f))},
      {"Elu", {F({2, 3, 4})}, Flt("alpha", 0.5f)},
      {"Softplus", {F({2, 3, 4})}},
      // along axes
      {"ArgMax", {F({2, 3, 5})}, Int("axis", 1)},
      {"ArgMin",
       {F({2, 3, 5})},
       All(Int("axis", -1), Int("keepdims", 0), Int("select_last_index", 1))},
      {"ArgMax", {Idx({4, 6})}, All(Int("axis", 1), Int("select_last_index", 1))},
      {"ReduceMax", {F({2, 3, 5})}, Ints("axes", {1})},
      {"ReduceMin", {F({2, 3, 5})}},
      {"ReduceProd", {F({2, 3, 5})}, All(Ints("axes", {0, 2}), Int("keepdims", 0))},
      {"ReduceL1", {F({2, 3, 5})}, Ints("axes", {-1})},
      {"ReduceL2", {F({2, 3, 5})}, Ints("axes", {0})},
      {"ReduceLogSum", {F({2, 3, 5}, Domain::kPositive)}, Ints("axes", {1})},
      {"ReduceLogSumExp", {F({2, 3, 5})}, All(Ints("axes", {2}), Int("keepdims", 0))},
      {"ReduceSumSquare", {F({2, 3, 5})}, Ints("axes", {0, 1})},
      {"ReduceMean", {F({2, 3, 5})}},
      {"ReduceSum", {F({2, 3, 5})}, Int("noop_with_empty_axes", 1)},
      {"CumSum", {F({3, 4}), C({1})}},
      {"CumSum", {F({3, 4}), CScalar(-2)}, All(Int("exclusive", 1), Int("reverse", 1))},
      {"CumSum", {Idx({2, 5}), C({1})}, Int("reverse", 1)},
      {"Hardmax", {F({2, 3, 4})}},
      {"Hardmax", {F({2, 3, 4})}, Int("axis", 1)},
      {"LogSoftmax", {F({2, 3, 4})}, Int("axis", 0)},
      {"LpNormalization", {F({2, 3, 4})}},
      {"LpNormalization", {F({2, 3, 4})}, All(Int("axis", 1), Int("p", 1))},
      {"MeanVarianceNormalization", {F({2, 3, 4, 5})}},
      {"MeanVarianceNormalization", {F({2, 3, 4})}, Ints("axes", {1, 2})},
      {"TopK", {F({3, 7}), C({3})}, nullptr, 2},
      {"TopK", {F({4, 5, 2}), C({2})}, All(Int("axis", 1), Int("largest", 0)), 2},
      {"TopK", {Idx({2, 6}), C({4})}, nullptr, 2},
      // Resize by the group's fixed scales [1,1,2,2], every mode and coordinate mapping
      {"Resize", {F({1, 2, 3, 4}), In{}, In{}}, Str("mode", "linear")},
      {"Resize",
       {F({1, 2, 3, 4}), In{}, In{}},
       All(Str("mode", "linear"), Str("coordinate_transformation_mode", "align_corners"))},
      {"Resize",
       {F({1, 2, 3, 4}), In{}, In{}},
       All(Str("mode", "linear"), Str("coordinate_transformation_mode", "pytorch_half_pixel"))},
      {"Resize", {F({1, 2, 3, 4}), In{}, In{}}, Str("mode", "cubic")},
      {"Resize",
       {F({1, 2, 4, 4}), In{}, In{}},
       All(Str("mode", "cubic"), Flt("cubic_coeff_a", -0.5f), Int("exclude_outside", 1))},
      {"Resize",
       {F({1, 2, 3, 4}), In{}, In{}},
       All(Str("mode", "cubic"), Str("coordinate_transformation_mode", "asymmetric"))},
      {"Resize",
       {F({1, 2, 3, 4}), In{}, In{}},
       All(Str("coordinate_transformation_mode", "align_corners"), Str("nearest_mode", "ceil"))},
      {"Resize",
       {F({1, 2, 3, 4}), In{}, In{}},
       All(Str("coordinate_transformation_mode", "tf_half_pixel_for_nearest"),
           Str("nearest_mode", "round_prefer_ceil"))},
  };
  return cases;
}

// Family A at opset 11: the legacy forms (Hardmax and LogSoftmax flatten to 2-D at axis,
// Reduce* take axes as an attribute).
const std::vector<Case>& FamilyALegacyCases() {
  static const std::vector<Case> cases = {
      {"Hardmax", {F({2, 3, 4})}},
      {"Hardmax", {F({2, 3, 4})}, Int("axis", 2)},
      {"LogSoftmax", {F({2, 3, 4})}},
      {"Softmax", {F({2, 3, 4})}, Int("axis", 0)},
      {"ReduceLogSumExp", {F({2, 3, 4})}, Ints("axes", {1})},
      {"ReduceL1", {F({2, 3, 4})}, Ints("axes", {0, 2})},
      {"ArgMax", {F({3, 4})}},
      {"TopK", {F({3, 7}), C({3})}, nullptr, 2},
      {"Resize", {F({1, 2, 3, 4}), In{}, In{}}, Str("mode", "linear")},
  };
  return cases;
}

// Family A at opset 18: the reductions' axes move to input 1.
const std::vector<Case>& FamilyAOpset18Cases() {
  static const std::vector<Case> cases = {
      {"ReduceMax", {F({2, 3, 5}), C({1})}},
      {"ReduceMin", {F({2, 3, 5}), C({-1})}},
      {"ReduceProd", {F({2, 3, 5}), C({0})}},
      {"ReduceL1", {F({2, 3, 5}), C({0, 2})}},
      {"ReduceL2", {F({2, 3, 5}), C({2})}},
      {"ReduceLogSum", {F({2, 3, 5}, Domain::kPositive), C({1})}},
      {"ReduceLogSumExp", {F({2, 3, 5}), C({1})}, Int("keepdims", 0)},
      {"ReduceSumSquare", {F({2, 3, 5})}},
      {"ReduceMean", {F({2, 3, 5}), C({0, 1})}},
      {"Resize", {F({1, 2, 3, 4}), In{}, In{}}, All(Str("mode", "cubic"), Int("antialias", 0))},
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
      if (in.absent || (k.op == "Resize" && i == 1)) {  // Resize's roi: absent
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
      if (!in.const_floats.empty()) {
        b.FloatInit(name, in.shape, in.const_floats);
        names.push_back(name);
        continue;
      }
      const int64_t n = NumElements(in.shape);
      const bool eight_bit =
          in.elem == onnx::TensorProto::INT8 || in.elem == onnx::TensorProto::UINT8;
      if (eight_bit) {  // full-range bytes, as a bound weight (raw initializer) or an input
        std::vector<uint8_t> v(static_cast<size_t>(n));
        for (auto& x : v) x = static_cast<uint8_t>(rng());
        if (in.as_weight) {
          auto* init = b.graph().add_initializer();
          init->set_name(name);
          init->set_data_type(in.elem);
          for (auto d : in.shape) init->add_dims(d);
          init->set_raw_data(std::string(v.begin(), v.end()));
        } else {
          b.Input(name, in.elem, in.shape);
          const DType dt = in.elem == onnx::TensorProto::INT8 ? DType::kInt8 : DType::kUInt8;
          inputs[name] = *Tensor::FromBytes(dt, in.shape, v.data(), v.size());
        }
        names.push_back(name);
        continue;
      }
      if (in.as_weight && in.elem == onnx::TensorProto::INT32) {
        std::uniform_int_distribution<int32_t> u(-1000, 1000);
        std::vector<int32_t> v(static_cast<size_t>(n));
        for (auto& x : v) x = u(rng);
        auto* init = b.graph().add_initializer();
        init->set_name(name);
        init->set_data_type(in.elem);
        for (auto d : in.shape) init->add_dims(d);
        for (int32_t x : v) init->add_int32_data(x);
        names.push_back(name);
        continue;
      }
      if (in.as_weight) {
        std::vector<float> v(static_cast<size_t>(n));
        std::uniform_real_distribution<float> u(in.domain == Domain::kLargeScale ? 200.0f
                                                : in.domain == Domain::kPositive ? 0.05f
                                                                                 : -1.0f,
                                                in.domain == Domain::kLargeScale ? 2000.0f : 1.0f);
        for (auto& x : v) x = u(rng);
        b.FloatInit(name, in.shape, v);
        names.push_back(name);
        continue;
      }
      b.Input(name, in.elem, in.shape);
      Tensor t;
      if (in.elem == onnx::TensorProto::FLOAT || in.elem == onnx::TensorProto::FLOAT16) {
        std::vector<float> v(static_cast<size_t>(n));
        std::uniform_real_distribution<float> u(in.domain == Domain::kPositive ? 0.1f : -2.0f,
                                                2.0f);
        for (auto& x : v) x = u(rng);
        t = Tensor::FromVector<float>(in.shape, v);
        if (in.elem == onnx::TensorProto::FLOAT16) t = *t.CastTo(DType::kFloat16);
      } else if (in.elem == onnx::TensorProto::INT16 || in.elem == onnx::TensorProto::UINT16 ||
                 in.elem == onnx::TensorProto::UINT32 || in.elem == onnx::TensorProto::UINT64) {
        const DType dt = in.elem == onnx::TensorProto::INT16    ? DType::kInt16
                         : in.elem == onnx::TensorProto::UINT16 ? DType::kUInt16
                         : in.elem == onnx::TensorProto::UINT32 ? DType::kUInt32
                                                                : DType::kUInt64;
        t = *Tensor::Empty(dt, in.shape);
        for (int64_t j = 0; j < n; ++j) {
          const uint64_t bits = (static_cast<uint64_t>(rng()) << 32) | rng();
          const uint64_t v = in.domain == Domain::kPositive ? 1 + bits % 1000
                             : in.domain == Domain::kIndex  ? bits % 4
                                                            : bits;
          // The low bytes (little endian): the value truncated to the type's width.
          std::memcpy(static_cast<char*>(t.raw_data()) + j * DTypeSize(dt), &v, DTypeSize(dt));
        }
      } else if (in.elem == onnx::TensorProto::BOOL) {
        t = *Tensor::Empty(DType::kBool, in.shape);
        for (int64_t j = 0; j < n; ++j) t.data<uint8_t>()[j] = rng() % 2;
      } else if (in.elem == onnx::TensorProto::INT32) {
        std::vector<int32_t> v(static_cast<size_t>(n));
        for (auto& x : v) x = static_cast<int32_t>(rng() % 4);
        t = Tensor::FromVector<int32_t>(in.shape, v);
      } else {
        std::vector<int64_t> v(static_cast<size_t>(n));
        for (auto& x : v) x = static_cast<int64_t>(rng() % 4);
        t = Tensor::FromVector<int64_t>(in.shape, v);
      }
      inputs[name] = t;
      names.push_back(name);
    }
    std::vector<std::string> outs;
    for (int o = 0; o < k.outputs; ++o) {
      outs.push_back(k.omitted_outputs.count(o)
                         ? std::string()
                         : "c" + std::to_string(c) + "_" + k.op + "_out" + std::to_string(o));
    }
    auto& node = b.Node(k.op, names, outs, "case" + std::to_string(c));
    if (k.attrs) k.attrs(node);
    for (const auto& o : outs) {
      if (o.empty()) continue;
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

// With `rebind`, the armed cell is then re-bound to that checkpoint and must follow eager run
// with it too (law 1: weights are data, never baked into the cell).
void RunBuilt(Built b, int64_t opset, int threads, const std::string& tag,
              const WeightMap* rebind = nullptr) {
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
  const std::string dir =
      "/tmp/kiln-diff-" + tag + std::to_string(opset) + "-" + std::to_string(::getpid());
  ASSERT_TRUE(MakeDirs(dir).ok());
  auto so = BuildSharedObject(cell->source, 1, DefaultSmTarget(), "diff", *driver, dir, 2, nullptr);
  ASSERT_TRUE(so.ok()) << so.status().ToString();
  auto lib = OpenCellBytes(*so, dir + "/load");
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);  // the mapping outlives the file; nothing is left in /tmp
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
  auto got = (*armed)->Run(0, b.inputs);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  int specialized = 0;
  for (const Kernel& k : programs[0].kernels) specialized += k.kind != Kernel::Kind::kReference;
  for (const auto& [name, r] : *ref) {
    const Tensor& c = got->at(name);
    ASSERT_EQ(c.dtype(), r.dtype()) << name;
    ASSERT_EQ(c.shape(), r.shape()) << name;
    double max_ref = 1.0;
    for (int64_t i = 0; i < r.numel(); ++i)
      max_ref = std::max(max_ref, std::fabs(r.GetAsDouble(i)));
    for (int64_t i = 0; i < r.numel(); ++i) {
      ASSERT_NEAR(c.GetAsDouble(i), r.GetAsDouble(i), 2e-5 * max_ref) << name << " element " << i;
    }
  }
  ::testing::Test::RecordProperty("specialized_kernels", specialized);
  if (rebind != nullptr) {
    ASSERT_TRUE((*armed)->Rebind(*rebind).ok());
    auto ref2 = eager->Run(b.inputs, rebind);
    ASSERT_TRUE(ref2.ok()) << ref2.status().ToString();
    auto got2 = (*armed)->Run(0, b.inputs);
    ASSERT_TRUE(got2.ok()) << got2.status().ToString();
    int changed = 0;
    for (const auto& [name, r] : *ref2) {
      const Tensor& c = got2->at(name);
      const Tensor& before = ref->at(name);
      double max_ref = 1.0;
      for (int64_t i = 0; i < r.numel(); ++i)
        max_ref = std::max(max_ref, std::fabs(r.GetAsDouble(i)));
      for (int64_t i = 0; i < r.numel(); ++i) {
        ASSERT_NEAR(c.GetAsDouble(i), r.GetAsDouble(i), 2e-5 * max_ref)
            << name << " element " << i << " after rebinding";
        changed += r.GetAsDouble(i) != before.GetAsDouble(i);
      }
    }
    EXPECT_GT(changed, 0) << "the rebound checkpoint changed no output";
  }
}

void RunGroup(const std::vector<Case>& cases, int64_t opset) {
  RunBuilt(BuildGroup(cases, opset), opset, 1, "");
}

// Family B (indexing, scatter/gather, ConvTranspose, Einsum, quantized, recurrent).
// Index inputs drawn at run time hold 0..3, so every indexed axis here has at least 4 entries;
// negative indices come as structural constants. NonZero's input must be structural (its output
// shape depends on values), so it folds; the refusal for a runtime input is tested below.
In Idx32(std::vector<int64_t> s) {
  return In{std::move(s), onnx::TensorProto::INT32, Domain::kIndex, {}};
}
In CF(std::vector<int64_t> shape, std::vector<float> values) {
  In i;
  i.shape = std::move(shape);
  i.const_floats = std::move(values);
  return i;
}
auto Eq(const char* equation) { return Str("equation", equation); }

const std::vector<Case>& FamilyBCases() {
  static const std::vector<Case> cases = {
      // ConvTranspose: groups, strides, pads, output_padding, output_shape, auto_pad, 1-D to 3-D
      {"ConvTranspose",
       {F({1, 4, 5, 5}), W({4, 3, 3, 3}), W({6})},
       All(Int("group", 2), Ints("strides", {2, 2}), Ints("pads", {1, 0, 1, 0}),
           Ints("output_padding", {1, 1}))},
      {"ConvTranspose",
       {F({2, 3, 4, 4}), W({3, 2, 2, 3})},
       All(Ints("strides", {3, 2}), Ints("output_shape", {14, 10}), Ints("dilations", {1, 2}))},
      {"ConvTranspose",
       {F({1, 2, 6}), W({2, 3, 3})},
       All(Str("auto_pad", "SAME_UPPER"), Ints("strides", {2}))},
      {"ConvTranspose",
       {F({1, 2, 3, 3, 2}), W({2, 2, 2, 2, 2}), W({2})},
       Ints("strides", {1, 2, 1})},
      // layout
      {"DepthToSpace", {F({1, 8, 2, 3})}, Int("blocksize", 2)},
      {"DepthToSpace", {F({2, 8, 3, 2})}, All(Int("blocksize", 2), Str("mode", "CRD"))},
      {"SpaceToDepth", {F({1, 2, 4, 6})}, Int("blocksize", 2)},
      {"Tile", {Idx({2, 3}), C({2, 1})}},
      {"Tile", {F({2, 1, 3}), C({1, 3, 2})}},
      {"Expand", {Idx({2, 1, 3}), C({4, 1})}},
      {"Expand", {F({3}), C({2, 1, 3})}},
      {"Where", {B({2, 1, 3}), F({4, 1}), F({1, 3})}},
      {"Trilu", {F({2, 3, 4})}},
      {"Trilu", {F({5, 5}), CScalar(-1)}, Int("upper", 0)},
      {"Trilu", {Idx({4, 3}), CScalar(1)}},
      {"Trilu", {F({4, 5}), Idx({})}},
      {"EyeLike", {F({3, 4})}, Int("k", 1)},
      {"EyeLike", {Idx({3, 3})}, Int("dtype", onnx::TensorProto::FLOAT)},
      // Range (float from structural float constants, int with a negative step), Size
      {"Range", {CF({}, {0.5f}), CF({}, {3.1f}), CF({}, {0.7f})}},
      {"Range", {CScalar(10), CScalar(1), CScalar(-3)}},
      {"Size", {Idx({2, 3, 4})}},
      // gather / scatter
      {"GatherElements", {F({4, 3}), Idx({2, 3})}},
      {"GatherElements", {F({2, 5}), Idx32({2, 3})}, Int("axis", 1)},
      {"GatherElements", {F({5}), C({-1, 0, 3, -5})}},
      {"GatherND", {F({4, 4, 3}), Idx({2, 2})}},
      {"GatherND", {F({2, 4, 3}), Idx32({2, 3, 1})}, Int("batch_dims", 1)},
      {"GatherND", {F({4, 3}), C({-1, 2})}},
      {"ScatterElements", {F({4, 3}), Idx({2, 3}), F({2, 3})}},
      {"ScatterElements",
       {F({3, 4}), Idx32({3, 3}), F({3, 3})},
       All(Int("axis", 1), Str("reduction", "add"))},
      {"ScatterElements", {F({6}), C({-1, 2, -1}), F({3})}, Str("reduction", "mul")},
      {"ScatterND", {F({4, 4}), Idx({3, 1}), F({3, 4})}},
      {"ScatterND", {F({4, 4}), Idx({3, 2}), F({3})}, Str("reduction", "add")},
      {"ScatterND", {F({4, 2}), C({-1}), F({2})}, Str("reduction", "mul")},
      {"NonZero", {C({0, 3, 0, 1, 2})}},
      {"OneHot", {Idx({2, 3}), CScalar(5), F({2})}},
      {"OneHot", {C({-1, 2, 7}), C({4}), F({2})}, Int("axis", 0)},
      {"OneHot", {Idx({3}), CF({}, {4.0f}), F({2})}},
      // Einsum: matmul, batch matmul, ellipsis, diagonal, trace, outer, implicit output, int64
      {"Einsum", {F({3, 4}), F({4, 5})}, Eq("ij,jk->ik")},
      {"Einsum", {F({2, 3, 4}), F({2, 4, 5})}, Eq("bij,bjk->bik")},
      {"Einsum", {F({2, 1, 3, 4}), F({3, 4, 2})}, Eq("...ij,...jk->...ik")},
      {"Einsum", {F({2, 3, 3})}, Eq("...ii->...i")},
      {"Einsum", {F({4, 4})}, Eq("ii")},
      {"Einsum", {F({3}), F({4})}, Eq("i,j->ij")},
      {"Einsum", {F({3, 2, 4})}, Eq("kji")},
      {"Einsum", {Idx({2, 3}), Idx({3, 2})}, Eq("ij,jk")},
  };
  return cases;
}

const std::vector<Case>& FamilyBOpset18Cases() {  // scatter reductions max and min
  static const std::vector<Case> cases = {
      {"ScatterElements", {F({4, 3}), Idx({3, 3}), F({3, 3})}, Str("reduction", "max")},
      {"ScatterND", {F({4, 4}), Idx({3, 1}), F({3, 4})}, Str("reduction", "min")},
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
  OnnxBuilder::IntsAttr(b.Node("Conv", {"y1", "w1", "b1"}, {"c13"}, "conv13"), "pads",
                        {1, 1, 1, 1});
  b.Node("Add", {"c13", "x"}, {"y13"}, "add13");
  out("y13");
  // 1x1 conv (plain layout) + Sigmoid.
  b.Node("Conv", {"y1", "w2"}, {"c2"}, "conv2");
  b.Node("Sigmoid", {"c2"}, {"y2"}, "sig2");
  out("y2");
  // 1x1 conv + HardSwish: a library post-op.
  b.Node("Conv", {"y1", "w2"}, {"c14"}, "conv14");
  b.Node("HardSwish", {"c14"}, {"y14"}, "hswish14");
  out("y14");
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

// Small builders for whole-network tests: random weights and inputs, every named output a graph
// output.
struct NetBuilder {
  OnnxBuilder b{17};
  std::mt19937 rng{7};
  TensorMap inputs;
  std::vector<std::string> outs;
  void Weight(const std::string& name, std::vector<int64_t> dims, float lo = -0.5f,
              float hi = 0.5f) {
    std::vector<float> v(static_cast<size_t>(NumElements(dims)));
    std::uniform_real_distribution<float> u(lo, hi);
    for (auto& x : v) x = u(rng);
    b.FloatInit(name, dims, v);
  }
  void Input(const std::string& name, std::vector<int64_t> dims) {
    b.Input(name, onnx::TensorProto::FLOAT, dims);
    std::vector<float> v(static_cast<size_t>(NumElements(dims)));
    std::uniform_real_distribution<float> u(-2.0f, 2.0f);
    for (auto& x : v) x = u(rng);
    inputs[name] = Tensor::FromVector<float>(dims, v);
  }
  onnx::NodeProto& Conv(const std::string& x, const std::string& w, const std::string& bias,
                        const std::string& y, int64_t pad) {
    auto& n = b.Node("Conv", {x, w, bias}, {y}, y);
    OnnxBuilder::IntsAttr(n, "pads", {pad, pad, pad, pad});
    return n;
  }
  // The exporters' GroupNorm: Reshape [N, G, -1], InstanceNormalization, Reshape back, then the
  // per-channel affine.
  void GroupNorm(const std::string& x, const std::string& y, int64_t n, int64_t c, int64_t h,
                 int64_t w, int64_t groups) {
    b.Int64Init(y + "_s1", {3}, {n, groups, -1});
    b.Int64Init(y + "_s2", {4}, {n, c, h, w});
    Weight(y + "_is", {groups}, 1.0f, 1.0f);
    Weight(y + "_ib", {groups}, 0.0f, 0.0f);
    Weight(y + "_g", {c, 1, 1}, 0.5f, 1.5f);
    Weight(y + "_b", {c, 1, 1});
    b.Node("Reshape", {x, y + "_s1"}, {y + "_r1"}, y + "_r1");
    b.Node("InstanceNormalization", {y + "_r1", y + "_is", y + "_ib"}, {y + "_in"}, y + "_in");
    b.Node("Reshape", {y + "_in", y + "_s2"}, {y + "_r2"}, y + "_r2");
    b.Node("Mul", {y + "_r2", y + "_g"}, {y + "_m"}, y + "_m");
    b.Node("Add", {y + "_m", y + "_b"}, {y}, y);
  }
  void Silu(const std::string& x, const std::string& y) {
    b.Node("Sigmoid", {x}, {y + "_sig"}, y + "_sig");
    b.Node("Mul", {x, y + "_sig"}, {y}, y);
  }
  Built Finish(const char* name) {
    for (const auto& o : outs) {
      auto* vi = b.graph().add_output();
      vi->set_name(o);
      vi->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
    }
    auto g = ImportOnnxBytes(b.Bytes(), name);
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
};

// A convolutional network in the shape of a UNet/ResNet: a stem on the (row-major) input,
// convolutions with residuals, GroupNorm + SiLU, pools, a per-channel broadcast add, nearest
// upsampling, a channel concat, a Winograd-sized convolution, a head; one intermediate and the
// last convolution are graph outputs (row-major by contract).
Built BuildConvNetwork() {
  NetBuilder n;
  n.Input("x", {2, 3, 16, 16});
  n.Input("t", {2, 32, 1, 1});
  n.Weight("w0", {32, 3, 3, 3});
  n.Weight("b0", {32});
  n.Weight("w1", {32, 32, 3, 3});
  n.Weight("b1", {32});
  n.Weight("w2", {32, 32, 1, 1});
  n.Weight("b2", {32});
  n.Weight("w3", {64, 64, 3, 3});  // Winograd-sized: 64 channels in and out, 2x16x16 pixels
  n.Weight("b3", {64});
  n.Weight("wf", {10, 64});
  n.Weight("bf", {10});
  n.Conv("x", "w0", "b0", "c0", 1);
  n.b.Node("Relu", {"c0"}, {"r0"}, "r0");
  n.GroupNorm("r0", "g1", 2, 32, 16, 16, 8);
  n.Silu("g1", "s1");
  n.Conv("s1", "w1", "b1", "c1", 1);
  n.b.Node("Add", {"c1", "t"}, {"ct"}, "ct");  // a time embedding per (batch, channel)
  n.b.Node("Add", {"ct", "r0"}, {"res"}, "res");
  auto& mp = n.b.Node("MaxPool", {"res"}, {"mp"}, "mp");
  OnnxBuilder::IntsAttr(mp, "kernel_shape", {3, 3});
  OnnxBuilder::IntsAttr(mp, "strides", {2, 2});
  OnnxBuilder::IntsAttr(mp, "pads", {1, 1, 1, 1});
  n.Conv("mp", "w2", "b2", "c2", 0);
  n.outs.push_back("c2");  // an NHWC-planned tensor that is also a graph output
  n.b.FloatInit("scales", {4}, {1.0f, 1.0f, 2.0f, 2.0f});
  n.b.Node("Resize", {"c2", "", "scales"}, {"up"}, "up");
  OnnxBuilder::IntAttr(n.b.Node("Concat", {"up", "res"}, {"cat"}, "cat"), "axis", 1);
  n.Conv("cat", "w3", "b3", "c3", 1);
  n.outs.push_back("c3");  // the last convolution writes a graph output
  auto& ap = n.b.Node("AveragePool", {"c3"}, {"ap"}, "ap");
  OnnxBuilder::IntsAttr(ap, "kernel_shape", {3, 3});
  OnnxBuilder::IntsAttr(ap, "pads", {1, 1, 1, 1});
  n.b.Node("GlobalAveragePool", {"ap"}, {"gap"}, "gap");
  n.b.Node("Flatten", {"gap"}, {"flat"}, "flat");
  auto& fc = n.b.Node("Gemm", {"flat", "wf", "bf"}, {"logits"}, "fc");
  OnnxBuilder::IntAttr(fc, "transB", 1);
  n.outs.push_back("logits");
  return n.Finish("convnet");
}

// Attention as exporters write it: a QKV projection with bias, Split, per-head reshapes and
// transposes, scaled scores plus a mask, softmax, the value product, heads merged back and an
// output projection. 300 queries and keys: several query blocks and two key blocks, the last
// ones partial; the mask hides the whole first key block of batch 1 behind -inf.
Built BuildAttentionNetwork() {
  NetBuilder n;
  const int64_t B = 2, S = 300, D = 96, H = 4;
  n.Input("x", {B, S, D});
  n.b.Input("mask", onnx::TensorProto::FLOAT, {B, 1, 1, S});
  std::vector<float> mask(static_cast<size_t>(B * S), 0.0f);
  for (int64_t j = 0; j < S; ++j) {
    if (j % 7 == 3) mask[static_cast<size_t>(j)] = -1e9f;
    if (j < 256) mask[static_cast<size_t>(S + j)] = -INFINITY;
  }
  n.inputs["mask"] = Tensor::FromVector<float>({B, 1, 1, S}, mask);
  n.Weight("wqkv", {D, 3 * D});
  n.Weight("bqkv", {3 * D});
  n.Weight("scale", {}, 0.2f, 0.2f);
  n.Weight("wo", {D, D});
  n.b.Node("MatMul", {"x", "wqkv"}, {"qkv0"}, "qkv0");
  n.b.Node("Add", {"qkv0", "bqkv"}, {"qkv"}, "qkv");
  n.b.Int64Init("split", {3}, {D, D, D});
  OnnxBuilder::IntAttr(n.b.Node("Split", {"qkv", "split"}, {"q", "k", "v"}, "split"), "axis", -1);
  n.b.Int64Init("heads", {4}, {B, S, H, D / H});
  for (const char* t : {"q", "k", "v"}) {
    const std::string s(t);
    n.b.Node("Reshape", {s, "heads"}, {s + "h"}, s + "h");
    OnnxBuilder::IntsAttr(
        n.b.Node("Transpose", {s + "h"}, {s + "t"}, s + "t"), "perm",
        s == "k" ? std::vector<int64_t>{0, 2, 3, 1} : std::vector<int64_t>{0, 2, 1, 3});
  }
  n.b.Node("MatMul", {"qt", "kt"}, {"sc"}, "sc");
  n.b.Node("Mul", {"sc", "scale"}, {"scs"}, "scs");
  n.b.Node("Add", {"scs", "mask"}, {"scm"}, "scm");
  OnnxBuilder::IntAttr(n.b.Node("Softmax", {"scm"}, {"p"}, "p"), "axis", -1);
  n.b.Node("MatMul", {"p", "vt"}, {"a"}, "a");
  OnnxBuilder::IntsAttr(n.b.Node("Transpose", {"a"}, {"at"}, "at"), "perm", {0, 2, 1, 3});
  n.b.Int64Init("merged", {3}, {B, S, D});
  n.b.Node("Reshape", {"at", "merged"}, {"am"}, "am");
  n.b.Node("MatMul", {"am", "wo"}, {"y"}, "y");
  n.outs.push_back("y");
  return n.Finish("attention");
}

// Linear layers followed by the erf GELU as exporters write it, with its constants as weights:
// x / sqrt(2) in one, x * (1 / sqrt(2)) in the other.
Built BuildGeluMlp() {
  NetBuilder n;
  n.Input("x", {8, 64});
  n.Weight("w1", {64, 96});
  n.Weight("b1", {96});
  n.Weight("w2", {96, 32});
  n.Weight("b2", {32});
  n.b.FloatInit("sqrt2", {}, {1.41421356f});
  n.b.FloatInit("rsqrt2", {}, {0.707106781f});
  n.b.FloatInit("one", {}, {1.0f});
  n.b.FloatInit("half", {}, {0.5f});
  n.b.Node("MatMul", {"x", "w1"}, {"m1"}, "m1");
  n.b.Node("Add", {"m1", "b1"}, {"h1"}, "h1");
  n.b.Node("Div", {"h1", "sqrt2"}, {"d1"}, "d1");
  n.b.Node("Erf", {"d1"}, {"e1"}, "e1");
  n.b.Node("Add", {"e1", "one"}, {"a1"}, "a1");
  n.b.Node("Mul", {"h1", "a1"}, {"p1"}, "p1");
  n.b.Node("Mul", {"p1", "half"}, {"g1"}, "g1");
  n.b.Node("MatMul", {"g1", "w2"}, {"m2"}, "m2");
  n.b.Node("Add", {"m2", "b2"}, {"h2"}, "h2");
  n.b.Node("Mul", {"h2", "rsqrt2"}, {"d2"}, "d2");
  n.b.Node("Erf", {"d2"}, {"e2"}, "e2");
  n.b.Node("Add", {"one", "e2"}, {"a2"}, "a2");
  n.b.Node("Mul", {"half", "h2"}, {"p2"}, "p2");
  n.b.Node("Mul", {"a2", "p2"}, {"y"}, "y");
  n.outs.push_back("y");
  return n.Finish("gelu");
}

// The kernels the compiler made for entry 0 of `b`.
// Another checkpoint for re-binding: every float weight mapped through f.
WeightMap MapFloatWeights(const WeightMap& weights, float (*f)(float)) {
  WeightMap out;
  for (const auto& [name, w] : weights) {
    Tensor t = *w.Clone();
    if (t.dtype() == DType::kFloat32) {
      for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = f(t.data<float>()[i]);
    }
    out.emplace(name, std::move(t));
  }
  return out;
}

Program CompiledProgram(const Built& b) {
  ShapeClass cls;
  for (const auto& [n, t] : b.inputs) cls[n] = t.shape();
  auto p = CompileEntry(*b.graph, cls, 0, CompileOptions{}, nullptr);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return p.ok() ? std::move(p).value() : Program{};
}

TEST(Differential, GeluEpiloguesAreMarkedAndFollowTheBoundConstants) {
  const Built b = BuildGeluMlp();
  const Program p = CompiledProgram(b);
  int marked = 0;
  for (const Kernel& k : p.kernels) marked += !k.gelu.empty();
  EXPECT_EQ(marked, 2) << p.Dump();
  // With the exporters' constants the library applies GELU; rebound to other values (a
  // checkpoint may hold anything: law 1) the cell must follow eager with those.
  WeightMap other = b.weights;
  other["sqrt2"] = Tensor::FromVector<float>({}, {1.25f});
  other["half"] = Tensor::FromVector<float>({}, {0.75f});
  RunBuilt(b, 17, 1, "gelu", &other);
}

// Gathers of one structural index are views (a slice of the input, the axis dropped for a
// scalar index): no kernel copies them out.
TEST(Differential, SingleIndexGathersAreViews) {
  NetBuilder n;
  n.Input("x", {2, 3, 4, 5});
  n.b.Int64Init("i2", {}, {2});
  n.b.Int64Init("last", {1}, {-1});
  OnnxBuilder::IntAttr(n.b.Node("Gather", {"x", "i2"}, {"g1"}, "g1"), "axis", 1);
  n.b.FloatInit("two", {}, {2.0f});
  n.b.Node("Mul", {"g1", "two"}, {"y1"}, "y1");
  OnnxBuilder::IntAttr(n.b.Node("Gather", {"x", "last"}, {"g2"}, "g2"), "axis", -1);
  n.b.Node("Add", {"g2", "g2"}, {"y2"}, "y2");
  n.outs = {"y1", "y2"};
  const Built b = n.Finish("gathers");
  const Program p = CompiledProgram(b);
  for (const Kernel& k : p.kernels) EXPECT_NE(k.kind, Kernel::Kind::kGather) << p.Dump();
  RunBuilt(b, 17, 1, "gathers");
}

TEST(Differential, ConvNetworkRunsChannelsLastAndMatchesEager) {
  const Built b = BuildConvNetwork();
  const Program p = CompiledProgram(b);
  int convs = 0, nhwc = 0, winograd = 0, group_norms = 0, pools = 0, copies = 0;
  for (const Kernel& k : p.kernels) {
    EXPECT_NE(k.kind, Kernel::Kind::kReference) << k.label;
    if (k.kind == Kernel::Kind::kConv) {
      ++convs;
      nhwc +=
          k.conv_layout == KILN_CONV_LAYOUT_NHWC || k.conv_layout == KILN_CONV_LAYOUT_NHWC_WINOGRAD;
      winograd += k.conv_layout == KILN_CONV_LAYOUT_NHWC_WINOGRAD;
    }
    group_norms += k.kind == Kernel::Kind::kNorm && k.groups == 8;
    pools += k.kind == Kernel::Kind::kPool;
    copies += k.label == "ToNhwc" || k.label == "ToRowMajor";
  }
  EXPECT_EQ(convs, 4);
  EXPECT_EQ(nhwc, 4) << p.Dump();
  EXPECT_EQ(winograd, 1) << p.Dump();  // c3; the others have too few channels
  EXPECT_EQ(group_norms, 1) << p.Dump();
  EXPECT_EQ(pools, 3);
  // The input into NHWC, c2 and c3 out to the caller's row-major outputs: nothing else.
  EXPECT_EQ(copies, 3) << p.Dump();
  RunBuilt(b, 17, 2, "convnet");
}

// Which convolutions a cell splits across the thread team is decided when the cell is
// generated, from an estimate of the work that counts memory traffic as well as arithmetic: a
// depthwise convolution does few multiply-adds per byte it streams (MobileNetV3's ran on one core
// while the other waited), a squeeze-excite convolution on a 1x1 map is tiny. A global pool has
// one output pixel per image, so its channels are split among the team, the last block short
// (72 = 4 x 16 + 8).
TEST(Differential, MemoryBoundConvolutionsRunOnTheThreadTeam) {
  NetBuilder n;
  n.Input("x", {1, 72, 112, 112});
  n.Weight("wd", {72, 1, 3, 3});
  n.Weight("bd", {72});
  n.Weight("ws", {16, 72, 1, 1});
  n.Weight("bs", {16});
  auto& dw = n.Conv("x", "wd", "bd", "d", 1);
  OnnxBuilder::IntAttr(dw, "group", 72);
  OnnxBuilder::IntsAttr(dw, "strides", {2, 2});
  n.b.Node("GlobalAveragePool", {"d"}, {"g"}, "g");
  n.Conv("g", "ws", "bs", "s", 0);
  n.outs = {"d", "s"};
  const Built b = n.Finish("threads");
  ShapeClass cls;
  for (const auto& [name, t] : b.inputs) cls[name] = t.shape();
  auto cell = GenerateCell(*b.graph, Envelope{{cls}}, "threads", CompileOptions{}, nullptr);
  ASSERT_TRUE(cell.ok()) << cell.status().ToString();
  std::vector<std::string> prepares;
  std::istringstream lines(cell->source);
  for (std::string line; std::getline(lines, line);) {
    if (line.find("conv2d_prepare(&d[") != std::string::npos) prepares.push_back(line);
  }
  ASSERT_EQ(prepares.size(), 2u) << cell->source;
  // The choice is written as kiln_team(E->threads, work, small): the team when work > small.
  // It is a call rather than the literal choice so that the text is the same at every size.
  auto team = [](const std::string& text, bool* on_team) {
    const std::string call = "kiln_team(E->threads, ";
    const size_t at = text.find(call);
    if (at == std::string::npos) return false;
    long long work = 0, small = 0;
    if (std::sscanf(text.c_str() + at + call.size(), "%lldLL, %lldLL)", &work, &small) != 2) {
      return false;
    }
    *on_team = work > small;
    return true;
  };
  // 2M multiply-adds over 4.5 MB: the team. 1K multiply-adds over 5 KB: one thread.
  bool on_team = false;
  ASSERT_TRUE(team(prepares[0], &on_team)) << prepares[0];
  EXPECT_TRUE(on_team) << prepares[0];
  EXPECT_NE(prepares[0].find("), &E->convs[0]"), std::string::npos) << prepares[0];
  ASSERT_TRUE(team(prepares[1], &on_team)) << prepares[1];
  EXPECT_FALSE(on_team) << prepares[1];
  const size_t pool = cell->source.find(": GlobalAveragePool\n");
  ASSERT_NE(pool, std::string::npos) << cell->source;
  const std::string pool_kernel =
      cell->source.substr(pool, cell->source.find("// kernel", pool) - pool);
  ASSERT_TRUE(team(pool_kernel, &on_team)) << pool_kernel;
  EXPECT_TRUE(on_team) << pool_kernel;
  // One pixel, 72 channels: blocks of 16 channels (ceil(72 / 16) = 5 of them), chosen by the
  // cell from constants, so the text is the one any size gets.
  EXPECT_NE(pool_kernel.find("kiln_cb = 1LL < 8LL && 72LL > 16LL ? 16LL : 72LL;"),
            std::string::npos)
      << pool_kernel;
  EXPECT_NE(pool_kernel.find("), 1LL * kiln_nc, kiln_body)"), std::string::npos) << pool_kernel;
  RunBuilt(b, 17, 2, "threads");
}

// BatchNormalizations as an export that keeps every node writes them (after bias-free
// convolutions, before a ReLU or a residual sum, and over rank-3 and rank-2 activations), with
// running statistics like trained ones: means far from 0 and variances over four decades. Each
// runs as elementwise ops: folded into the convolution before it as an epilogue on its NHWC
// output, never as a reference kernel or a layout copy; and the cell follows re-bound
// statistics (they are weights, read at run time).
Built BuildUnfoldedBatchNorms() {
  NetBuilder n;
  n.Input("x", {2, 8, 12, 12});
  n.Input("seq", {2, 8, 20});
  n.Input("flat", {4, 8});
  int bn = 0;
  auto batch_norm = [&](const std::string& in, const std::string& out, float eps) {
    const std::string p = "bn" + std::to_string(bn++);
    n.Weight(p + ".weight", {8}, 0.5f, 1.5f);
    n.Weight(p + ".bias", {8});
    n.Weight(p + ".running_mean", {8}, 20.0f, 40.0f);
    std::vector<float> var(8);
    for (int c = 0; c < 8; ++c) var[c] = 1e-4f * std::pow(10.0f, 0.5f * static_cast<float>(c));
    n.b.FloatInit(p + ".running_var", {8}, var);
    auto& node = n.b.Node("BatchNormalization",
                          {in, p + ".weight", p + ".bias", p + ".running_mean", p + ".running_var"},
                          {out}, p);
    OnnxBuilder::FloatAttr(node, "epsilon", eps);
  };
  n.Weight("w0", {8, 8, 3, 3});
  n.Weight("w1", {8, 8, 1, 1});
  n.b.Node("Add", {"x", "x"}, {"x2"}, "x2");
  OnnxBuilder::IntsAttr(n.b.Node("Conv", {"x2", "w0"}, {"c0"}, "c0"), "pads", {1, 1, 1, 1});
  batch_norm("c0", "n0", 1e-5f);
  n.b.Node("Relu", {"n0"}, {"r0"}, "r0");
  n.b.Node("Conv", {"r0", "w1"}, {"c1"}, "c1");
  batch_norm("c1", "n1", 1e-3f);
  n.b.Node("Add", {"n1", "r0"}, {"s1"}, "s1");
  n.b.Node("Relu", {"s1"}, {"y0"}, "y0");
  n.outs.push_back("y0");
  batch_norm("seq", "y1", 1e-5f);
  n.outs.push_back("y1");
  batch_norm("flat", "y2", 1e-5f);
  n.outs.push_back("y2");
  return n.Finish("batchnorm");
}

TEST(Differential, UnfoldedBatchNormsRunAsConvolutionEpiloguesOnNhwc) {
  Built b = BuildUnfoldedBatchNorms();
  const Program p = CompiledProgram(b);
  int convs = 0, nhwc = 0, with_epilogue = 0, copies = 0;
  for (const Kernel& k : p.kernels) {
    EXPECT_NE(k.kind, Kernel::Kind::kReference) << k.label << "\n" << p.Dump();
    copies += k.label == "ToNhwc" || k.label == "ToRowMajor";
    if (k.kind != Kernel::Kind::kConv) continue;
    ++convs;
    nhwc +=
        k.conv_layout == KILN_CONV_LAYOUT_NHWC || k.conv_layout == KILN_CONV_LAYOUT_NHWC_WINOGRAD;
    with_epilogue += k.label.find("+[Sub+Mul+Add") != std::string::npos;
  }
  EXPECT_EQ(convs, 2) << p.Dump();
  EXPECT_EQ(nhwc, 2) << p.Dump();
  EXPECT_EQ(with_epilogue, 2) << p.Dump();
  // y0 out to the caller's row-major buffer; nothing around the normalizations.
  EXPECT_EQ(copies, 1) << p.Dump();
  const WeightMap other = MapFloatWeights(b.weights, [](float v) { return 1.25f * v; });
  RunBuilt(b, 17, 2, "batchnorm", &other);
}

// Linear layers as exports that keep every node write them: the weight [out, in] goes through a
// Transpose before MatMul (or Gemm). The GEMM reads the weight's bytes as they lie, with its
// transposition flag flipped: no copy transposes a weight on every run. Also a transposed
// run-time operand, a Gemm that transposes twice, and a re-bound checkpoint.
Built BuildTransposedLinears() {
  NetBuilder n;
  n.Input("x", {6, 24});
  n.Input("y", {10, 24});
  n.Weight("w0", {40, 24});
  n.Weight("b0", {40});
  n.Weight("w1", {16, 40});
  n.Weight("w2", {16, 8});
  OnnxBuilder::IntsAttr(n.b.Node("Transpose", {"w0"}, {"w0t"}, "t0"), "perm", {1, 0});
  n.b.Node("MatMul", {"x", "w0t"}, {"h0"}, "mm0");
  n.b.Node("Add", {"h0", "b0"}, {"h1"}, "bias0");
  n.b.Node("Relu", {"h1"}, {"h2"}, "relu0");
  OnnxBuilder::IntsAttr(n.b.Node("Transpose", {"w1"}, {"w1t"}, "t1"), "perm", {1, 0});
  n.b.Node("Gemm", {"h2", "w1t"}, {"y0"}, "gemm1");
  n.outs.push_back("y0");
  OnnxBuilder::IntsAttr(n.b.Node("Transpose", {"w2"}, {"w2t"}, "t2"), "perm", {1, 0});
  OnnxBuilder::IntAttr(n.b.Node("Gemm", {"y0", "w2t"}, {"y1"}, "gemm2"), "transB", 1);
  n.outs.push_back("y1");
  OnnxBuilder::IntsAttr(n.b.Node("Transpose", {"y"}, {"yt"}, "t3"), "perm", {1, 0});
  n.b.Node("MatMul", {"x", "yt"}, {"y2"}, "mm3");
  n.outs.push_back("y2");
  return n.Finish("transposed");
}

TEST(Differential, TransposedWeightsAreReadAsTheyLie) {
  Built b = BuildTransposedLinears();
  const Program p = CompiledProgram(b);
  int gemms = 0, flipped = 0;
  for (const Kernel& k : p.kernels) {
    EXPECT_NE(k.kind, Kernel::Kind::kReference) << k.label << "\n" << p.Dump();
    EXPECT_NE(k.kind, Kernel::Kind::kTranspose) << p.Dump();
    EXPECT_NE(k.label, "ToRowMajor") << p.Dump();
    if (k.kind != Kernel::Kind::kMatMul && k.kind != Kernel::Kind::kGemm) continue;
    ++gemms;
    flipped += k.trans_w;
  }
  EXPECT_EQ(gemms, 4) << p.Dump();
  EXPECT_EQ(flipped, 4) << p.Dump();
  const WeightMap other = MapFloatWeights(b.weights, [](float v) { return 0.5f - v; });
  RunBuilt(b, 17, 2, "transposed", &other);
}

// Slices with structural bounds and unit steps (what exporters write for x[:, a:b] and
// buffer[:T, :T]) are views of their input: one axis, two axes with a negative start, rows of a
// weight feeding a GEMM (a view into the middle of a bound weight). A strided Slice stays a
// reference kernel.
Built BuildSliceViews() {
  NetBuilder n;
  n.Input("x", {4, 6, 10});
  n.Weight("w", {12, 5});
  auto slice = [&](const std::string& in, const std::string& out, std::vector<int64_t> starts,
                   std::vector<int64_t> ends, std::vector<int64_t> axes,
                   std::vector<int64_t> steps = {}) {
    const int64_t r = static_cast<int64_t>(starts.size());
    n.b.Int64Init(out + "_s", {r}, starts);
    n.b.Int64Init(out + "_e", {r}, ends);
    n.b.Int64Init(out + "_a", {r}, axes);
    std::vector<std::string> ins = {in, out + "_s", out + "_e", out + "_a"};
    if (!steps.empty()) {
      n.b.Int64Init(out + "_t", {r}, steps);
      ins.push_back(out + "_t");
    }
    n.b.Node("Slice", ins, {out}, out);
  };
  slice("x", "s0", {2}, {8}, {2});
  n.b.Node("Relu", {"s0"}, {"y0"}, "relu0");
  n.outs.push_back("y0");
  slice("x", "s1", {1, -4}, {3, INT64_MAX}, {0, -1});
  n.b.Node("Add", {"s1", "s1"}, {"y1"}, "add1");
  n.outs.push_back("y1");
  slice("w", "ws", {2}, {12}, {0});
  n.b.Node("MatMul", {"x", "ws"}, {"y2"}, "mm2");
  n.outs.push_back("y2");
  slice("x", "s3", {0}, {10}, {2}, {2});
  n.b.Node("Neg", {"s3"}, {"y3"}, "neg3");
  n.outs.push_back("y3");
  return n.Finish("slices");
}

TEST(Differential, SlicesWithUnitStepsAreViews) {
  Built b = BuildSliceViews();
  const Program p = CompiledProgram(b);
  int reference_slices = 0;
  for (const Kernel& k : p.kernels) {
    if (k.kind == Kernel::Kind::kReference) {
      EXPECT_EQ(k.node.op_type, "Slice") << p.Dump();
      reference_slices += k.node.op_type == "Slice";
    }
  }
  EXPECT_EQ(reference_slices, 1) << p.Dump();  // the one with step 2
  const WeightMap other = MapFloatWeights(b.weights, [](float v) { return 1.0f - 2.0f * v; });
  RunBuilt(b, 17, 2, "slices", &other);
}

// LayerNorm as exports before opset 17 write it (ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt,
// Div, Mul, Add), and the other attribute-axes reductions over inner, middle and all axes: each
// reduction is a generated kernel, none a reference call.
Built BuildReductions() {
  NetBuilder n;
  n.Input("x", {3, 5, 40});
  n.Weight("g", {40}, 0.5f, 1.5f);
  n.Weight("beta", {40});
  auto reduce = [&](const std::string& op, const std::string& in, const std::string& out,
                    std::vector<int64_t> axes, int64_t keepdims) {
    auto& node = n.b.Node(op, {in}, {out}, out);
    if (!axes.empty()) OnnxBuilder::IntsAttr(node, "axes", axes);
    OnnxBuilder::IntAttr(node, "keepdims", keepdims);
  };
  reduce("ReduceMean", "x", "m", {-1}, 1);
  n.b.Node("Sub", {"x", "m"}, {"d"}, "d");
  n.b.FloatInit("two", {}, {2.0f});
  n.b.Node("Pow", {"d", "two"}, {"p"}, "p");
  reduce("ReduceMean", "p", "v", {-1}, 1);
  n.b.FloatInit("eps", {}, {1e-5f});
  n.b.Node("Add", {"v", "eps"}, {"ve"}, "ve");
  n.b.Node("Sqrt", {"ve"}, {"sd"}, "sd");
  n.b.Node("Div", {"d", "sd"}, {"nrm"}, "nrm");
  n.b.Node("Mul", {"nrm", "g"}, {"ng"}, "ng");
  n.b.Node("Add", {"ng", "beta"}, {"y0"}, "y0");
  n.outs.push_back("y0");
  reduce("ReduceSum", "x", "y1", {}, 0);  // opset 17: no axes input, every axis
  n.outs.push_back("y1");
  reduce("ReduceMax", "x", "y2", {1, 2}, 1);
  n.outs.push_back("y2");
  reduce("ReduceMin", "x", "y3", {}, 0);
  n.outs.push_back("y3");
  reduce("ReduceMax", "x", "y4", {0}, 0);
  n.outs.push_back("y4");
  return n.Finish("reductions");
}

TEST(Differential, AttributeAxesReductionsAreGeneratedKernels) {
  Built b = BuildReductions();
  const Program p = CompiledProgram(b);
  int reductions = 0;
  for (const Kernel& k : p.kernels) {
    EXPECT_NE(k.kind, Kernel::Kind::kReference) << k.label << "\n" << p.Dump();
    reductions += k.kind == Kernel::Kind::kReduce;
  }
  EXPECT_EQ(reductions, 6) << p.Dump();
  RunBuilt(b, 13, 2, "reductions");
}

TEST(Differential, AttentionIsFusedOnViewsAndMatchesEager) {
  const Built b = BuildAttentionNetwork();
  const Program p = CompiledProgram(b);
  int attention = 0;
  for (const Kernel& k : p.kernels) {
    attention += k.kind == Kernel::Kind::kAttention;
    // No softmax over materialized scores, no copies into heads, no split.
    EXPECT_NE(k.kind, Kernel::Kind::kSoftmax) << p.Dump();
    EXPECT_NE(k.kind, Kernel::Kind::kTranspose) << p.Dump();
    EXPECT_NE(k.kind, Kernel::Kind::kReference) << k.label;
    EXPECT_NE(k.label, "ToRowMajor") << p.Dump();
  }
  EXPECT_EQ(attention, 1) << p.Dump();
  // The scores ([2, 4, 300, 300], 1.4 MiB) are never in the workspace.
  EXPECT_LT(p.workspace_bytes, 2 * 300 * 4 * 300 * 4) << p.Dump();
  RunBuilt(b, 17, 2, "attention");
}

TEST(Differential, EveryOpCompiledMatchesEagerOpset17) { RunGroup(Opset17Cases(), 17); }
TEST(Differential, LegacyFormsCompiledMatchEagerOpset9) { RunGroup(LegacyCases(), 9); }
TEST(Differential, Opset18OpsCompiledMatchEager) { RunGroup(Opset18Cases(), 18); }
TEST(Differential, FamilyAOpsCompiledMatchEager) {
  if (FamilyACases().empty()) GTEST_SKIP() << "no family A cases yet";
  RunGroup(FamilyACases(), 17);
}
TEST(Differential, FamilyALegacyFormsCompiledMatchEagerOpset11) {
  RunGroup(FamilyALegacyCases(), 11);
}
TEST(Differential, FamilyAOpset18FormsCompiledMatchEager) { RunGroup(FamilyAOpset18Cases(), 18); }
TEST(Differential, FamilyBOpsCompiledMatchEager) {
  if (FamilyBCases().empty()) GTEST_SKIP() << "no family B cases yet";
  RunGroup(FamilyBCases(), 17);
}
TEST(Differential, FamilyBOpset18OpsCompiledMatchEager) { RunGroup(FamilyBOpset18Cases(), 18); }

// 0 finite, 1 NaN, 2 +Inf, 3 -Inf.
int FiniteClass(double v) {
  if (std::isnan(v)) return 1;
  if (std::isinf(v)) return v > 0 ? 2 : 3;
  return 0;
}

// Compiles `b` once and runs it, cell and eager, on its inputs with every float input rewritten
// by `plant`: the non-finite positions must be the same on both sides, value for value (NaN,
// +Inf, -Inf), and the finite ones close.
void RunNonFinite(const Built& b, const std::string& tag,
                  const std::vector<std::pair<std::string, std::function<void(Tensor&)>>>& plants) {
  auto eager = Interpreter::Create(b.graph);
  ASSERT_TRUE(eager.ok()) << eager.status().ToString();
  ShapeClass cls;
  for (const auto& [n, t] : b.inputs) cls[n] = t.shape();
  Envelope env{{cls}};
  auto cell = GenerateCell(*b.graph, env, "nonfinite", CompileOptions{}, nullptr);
  ASSERT_TRUE(cell.ok()) << cell.status().ToString();
  auto toolchain = LocalToolchain();
  ASSERT_TRUE(toolchain.ok());
  auto driver = MakeSystemCompilerDriver(*toolchain);
  const std::string dir = "/tmp/kiln-nonfinite-" + tag + "-" + std::to_string(::getpid());
  ASSERT_TRUE(MakeDirs(dir).ok());
  auto so = BuildSharedObject(cell->source, 1, DefaultSmTarget(), "nf", *driver, dir, 2, nullptr);
  ASSERT_TRUE(so.ok()) << so.status().ToString();
  auto lib = OpenCellBytes(*so, dir + "/load");
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  ASSERT_TRUE(lib.ok()) << lib.status().ToString();
  auto entries = EntriesFromDescribe(cell->describe, env);
  ASSERT_TRUE(entries.ok()) << entries.status().ToString();
  auto armed = ArmedCell::Arm(*lib, *entries, b.weights, Lane::kIntake, "", 2);
  ASSERT_TRUE(armed.ok()) << armed.status().ToString();
  for (const auto& [label, plant] : plants) {
    TensorMap inputs;
    int64_t planted = 0;
    for (const auto& [name, t] : b.inputs) {
      Tensor c = *t.Clone();
      if (c.dtype() == DType::kFloat32) {
        plant(c);
        for (int64_t i = 0; i < c.numel(); ++i) planted += FiniteClass(c.data<float>()[i]) != 0;
      }
      inputs[name] = std::move(c);
    }
    ASSERT_GT(planted, 0) << label;
    auto ref = eager->Run(inputs, &b.weights);
    ASSERT_TRUE(ref.ok()) << label << ": " << ref.status().ToString();
    auto got = (*armed)->Run(0, inputs);
    ASSERT_TRUE(got.ok()) << label << ": " << got.status().ToString();
    int64_t non_finite = 0;
    for (const auto& [name, r] : *ref) {
      const Tensor& c = got->at(name);
      ASSERT_EQ(c.shape(), r.shape()) << label << " " << name;
      double max_ref = 1.0;
      for (int64_t i = 0; i < r.numel(); ++i) {
        const double v = r.GetAsDouble(i);
        if (std::isfinite(v)) max_ref = std::max(max_ref, std::fabs(v));
      }
      for (int64_t i = 0; i < r.numel(); ++i) {
        const double want = r.GetAsDouble(i), have = c.GetAsDouble(i);
        ASSERT_EQ(FiniteClass(have), FiniteClass(want)) << label << ": output " << name << " [" << i
                                                        << "]: eager " << want << ", cell " << have;
        non_finite += FiniteClass(want) != 0;
        if (std::isfinite(want)) {
          ASSERT_NEAR(have, want, 2e-5 * max_ref) << label << ": " << name << " [" << i << "]";
        }
      }
    }
    EXPECT_GT(non_finite, 0) << label << ": no output was non-finite; the test measures nothing";
  }
}

const std::vector<std::pair<std::string, std::function<void(Tensor&)>>>& Plants() {
  static const std::vector<std::pair<std::string, std::function<void(Tensor&)>>> plants = {
      {"all NaN",
       [](Tensor& t) {
         for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = NAN;
       }},
      {"NaN, +Inf and -Inf among finite values",
       [](Tensor& t) {
         const float v[] = {NAN, INFINITY, -INFINITY};
         for (int64_t i = 0; i < t.numel(); i += 7) t.data<float>()[i] = v[(i / 7) % 3];
       }},
      {"all -Inf",
       [](Tensor& t) {
         for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = -INFINITY;
       }},
  };
  return plants;
}

// NaN and infinities give the same outputs compiled and eager: generated loops (ReLU, Max, Min,
// Sign, Clip, HardSigmoid, exp past its range, softmax, norms), the fused GEMM and convolution
// epilogues (ReLU, sigmoid, SiLU, HardSwish, GELU, residual sums; the last three run as the
// kernel library's post-ops) and the kernel library's calls must neither lose a NaN nor invent
// one. An all-NaN input once gave finite numbers compiled (a ReLU that mapped
// NaN to 0 before the second GEMM) where eager gave NaN.
TEST(Differential, NaNInputsGiveEqualOutputsCompiledAndEager) {
  const std::vector<Case> elementwise = {
      {"Relu", {F({4, 9})}},
      {"Max", {F({4, 9}), F({4, 9})}},
      {"Min", {F({4, 9}), F({1, 9})}},
      {"Sign", {F({4, 9})}},
      {"Clip", {F({4, 9}), CF({}, {-0.5f}), CF({}, {0.5f})}},
      {"HardSigmoid", {F({4, 9})}},
      {"HardSwish", {F({4, 9})}},
      {"Exp", {F({4, 9})}},
      {"Sigmoid", {F({4, 9})}},
      {"Softplus", {F({4, 9})}},
      {"Pow", {F({4, 9}), CF({}, {0.5f})}},
      {"LeakyRelu", {F({4, 9})}},
      {"Elu", {F({4, 9})}},
      {"Erf", {F({4, 9})}},
      {"Softmax", {F({4, 9})}},
      {"Softmax", {F({4, 9, 3})}, Int("axis", 1)},
      {"Gemm", {F({4, 9}), W({9, 5}), W({5})}},
      {"MatMul", {F({2, 4, 9}), W({9, 6})}},
      {"LayerNormalization", {F({4, 9}), W({9}), W({9})}},
      {"BatchNormalization", {F({2, 3, 4, 4}), W({3}), W({3}), W({3}), F({3}, Domain::kPositive)}},
      {"ReduceMean", {F({4, 9})}, Ints("axes", {1})},
      {"ReduceMax", {F({4, 9, 3})}, Ints("axes", {1})},
      {"ReduceMin", {F({4, 9})}, Ints("axes", {-1})},
  };
  RunNonFinite(BuildGroup(elementwise, 17), "elementwise", Plants());
  RunNonFinite(BuildParallelChain(), "chain", Plants());
  // GEMMs whose erf GELU epilogue the kernel library applies as a post-op.
  RunNonFinite(BuildGeluMlp(), "gelu", Plants());
}

// Shapes that depend on input values (NonZero, a Reshape or Expand by a shape given as an input,
// Range and TopK by runtime bounds) run inside the cell as one dynamic region, beside the
// compiled rest, and give what eager gives for every value of those inputs.
TEST(Differential, DataDependentShapesRunInADynamicRegion) {
  OnnxBuilder b(17);
  b.Input("x", onnx::TensorProto::FLOAT, {2, 6});
  b.Input("shape", onnx::TensorProto::INT64, {2});
  b.Input("k", onnx::TensorProto::INT64, {1});
  b.Input("limit", onnx::TensorProto::FLOAT, {});
  b.Node("Relu", {"x"}, {"r"}, "relu");              // compiled
  b.Node("Mul", {"r", "x"}, {"static_out"}, "mul");  // compiled, a graph output
  b.Node("NonZero", {"r"}, {"nz"}, "nz");
  b.Node("Reshape", {"r", "shape"}, {"reshaped"}, "reshape");
  b.Node("Sigmoid", {"reshaped"}, {"sig"}, "sig");  // reads a dynamic value: in the region
  auto& topk = b.Node("TopK", {"x", "k"}, {"top", "top_i"}, "topk");
  OnnxBuilder::IntAttr(topk, "axis", 1);
  b.FloatInit("start", {}, {0.25f});
  b.FloatInit("delta", {}, {0.5f});
  b.Node("Range", {"start", "limit", "delta"}, {"range"}, "range");
  b.Output("static_out", onnx::TensorProto::FLOAT, {2, 6});
  b.Output("nz", onnx::TensorProto::INT64, {});
  b.Output("sig", onnx::TensorProto::FLOAT, {});
  b.Output("top", onnx::TensorProto::FLOAT, {});
  b.Output("top_i", onnx::TensorProto::INT64, {});
  b.Output("range", onnx::TensorProto::FLOAT, {});
  auto g = ImportOnnxBytes(b.Bytes(), "dynamic");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  for (ValueInfo& v : g->outputs) {
    if (v.name != "static_out") v.has_shape = false;
  }
  auto graph = std::make_shared<const Graph>(std::move(g).value());
  ShapeClass cls{{"x", {2, 6}}, {"shape", {2}}, {"k", {1}}, {"limit", {}}};
  Envelope env{{cls}};
  std::vector<Program> programs;
  auto cell = GenerateCell(*graph, env, "dynamic", CompileOptions{}, nullptr, &programs);
  ASSERT_TRUE(cell.ok()) << cell.status().ToString();
  int regions = 0, compiled = 0;
  for (const Kernel& k : programs[0].kernels) {
    if (k.node.op_type == kDynamicRegionOp) {
      ++regions;
      EXPECT_EQ(k.outputs.size(), 5u) << k.label;
    } else if (k.kind != Kernel::Kind::kReference) {
      ++compiled;
    }
  }
  EXPECT_EQ(regions, 1) << programs[0].Dump();
  EXPECT_GE(compiled, 1) << "the static part must stay compiled\n" << programs[0].Dump();
  auto entries = EntriesFromDescribe(cell->describe, env);
  ASSERT_TRUE(entries.ok()) << entries.status().ToString();
  int dynamic = 0;
  for (const TensorSpec& o : (*entries)[0].outputs) dynamic += o.dynamic;
  EXPECT_EQ(dynamic, 5);

  auto toolchain = LocalToolchain();
  auto driver = MakeSystemCompilerDriver(*toolchain);
  const std::string dir = "/tmp/kiln-dynamic-" + std::to_string(::getpid());
  ASSERT_TRUE(MakeDirs(dir).ok());
  auto so = BuildSharedObject(cell->source, 1, DefaultSmTarget(), "dyn", *driver, dir, 2, nullptr);
  ASSERT_TRUE(so.ok()) << so.status().ToString();
  auto lib = OpenCellBytes(*so, dir + "/load");
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  ASSERT_TRUE(lib.ok()) << lib.status().ToString();
  auto weights = GraphWeights(*graph);
  auto armed = ArmedCell::Arm(*lib, *entries, weights, Lane::kIntake, "", 1);
  ASSERT_TRUE(armed.ok()) << armed.status().ToString();
  auto eager = Interpreter::Create(graph);
  ASSERT_TRUE(eager.ok());
  struct Values {
    std::vector<float> x;
    std::vector<int64_t> shape;
    int64_t k;
    float limit;
  };
  const std::vector<Values> runs = {
      {{1, -2, 3, 0, 5, -6, 7, 8, -9, 0, 1, 2}, {3, 4}, 2, 3.0f},
      {{-1, -2, -3, 0, 0, 0, 0, 0, 9, 0, 0, 2}, {12, 1}, 5, 0.1f},
      {{0.5f, 1, 0, 2, 0, 3, 0, 4, 0, 5, 0, 6}, {-1, 2}, 0, 6.0f},
  };
  for (const Values& v : runs) {
    TensorMap in{{"x", Tensor::FromVector<float>({2, 6}, v.x)},
                 {"shape", Tensor::FromVector<int64_t>({2}, v.shape)},
                 {"k", Tensor::FromVector<int64_t>({1}, {v.k})},
                 {"limit", Tensor::FromVector<float>({}, {v.limit})}};
    auto ref = eager->Run(in);
    ASSERT_TRUE(ref.ok()) << ref.status().ToString();
    auto got = (*armed)->Run(0, in);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    for (const auto& [name, r] : *ref) {
      const Tensor& c = got->at(name);
      ASSERT_EQ(c.dtype(), r.dtype()) << name;
      ASSERT_EQ(c.shape(), r.shape()) << name;
      for (int64_t i = 0; i < r.numel(); ++i) {
        ASSERT_NEAR(c.GetAsDouble(i), r.GetAsDouble(i), 1e-6) << name << " [" << i << "]";
      }
    }
  }
  // A shape eager refuses is refused by the cell too (the region runs eager's own kernels), and
  // the cell keeps serving afterwards.
  TensorMap bad{{"x", Tensor::FromVector<float>({2, 6}, runs[0].x)},
                {"shape", Tensor::FromVector<int64_t>({2}, {5, 5})},
                {"k", Tensor::FromVector<int64_t>({1}, {1})},
                {"limit", Tensor::FromVector<float>({}, {1.0f})}};
  EXPECT_FALSE(eager->Run(bad).ok());
  EXPECT_FALSE((*armed)->Run(0, bad).ok());
}

// Family C also re-binds the cell to another checkpoint: scales, zero points and recurrent
// weights are read as bound data (float weights scaled by 1.25, 8-bit and int32 ones shifted by
// 3).
TEST(Differential, FamilyCOpsCompiledMatchEager) {
  Built built = BuildGroup(FamilyCCases(), 17);
  WeightMap other;
  for (const auto& [name, w] : built.weights) {
    Tensor t = *w.Clone();
    for (int64_t i = 0; i < t.numel(); ++i) {
      if (t.dtype() == DType::kFloat32) t.data<float>()[i] *= 1.25f;
      if (t.dtype() == DType::kInt8 || t.dtype() == DType::kUInt8) {
        t.data<uint8_t>()[i] = static_cast<uint8_t>(t.data<uint8_t>()[i] + 3);
      }
      if (t.dtype() == DType::kInt32) t.data<int32_t>()[i] += 3;
    }
    other.emplace(name, std::move(t));
  }
  RunBuilt(built, 17, 1, "rebind", &other);
}

// A graph whose only operand is a weight has no runtime inputs (as a case whose inputs were all
// bound as constants): the cell still describes an empty input list and runs.
TEST(Differential, AGraphWithNoRuntimeInputsCompilesAndRuns) {
  RunGroup({{"Relu", {W({2, 3})}}, {"Neg", {W({4})}}}, 17);
}

// Family D: the math, loss, signal, vision, tensor and random families (reference kernels, run
// by the host inside the cell). Random ops draw from their node's seed, so the cell's host call
// draws what eager draws.
In U32(std::vector<int64_t> s, Domain d = Domain::kAny) {
  return In{std::move(s), onnx::TensorProto::UINT32, d, {}};
}
In Shaped(In i, std::vector<int64_t> shape) {
  i.shape = std::move(shape);
  return i;
}

const std::vector<Case>& FamilyDCases() {
  static const std::vector<Case> cases = {
      // math (domains kept finite: weights lie in [-1, 1), constants where the domain is [1, inf))
      {"Acos", {W({2, 3})}},
      {"Asin", {W({2, 3})}},
      {"Atan", {F({2, 3})}},
      {"Acosh", {CF({3}, {1.0f, 1.5f, 4.0f})}},
      {"Asinh", {F({2, 3})}},
      {"Atanh", {CF({3}, {-0.5f, 0.0f, 0.75f})}},
      {"Cosh", {F({2, 3})}},
      {"Sinh", {F({2, 3})}},
      {"Tan", {F({2, 3})}},
      {"IsInf", {F({2, 3})}, Int("detect_negative", 0)},
      {"IsNaN", {F({2, 3})}},
      {"BitShift", {U32({2, 3}), U32({3}, Domain::kIndex)}, Str("direction", "LEFT")},
      {"Det", {F({2, 3, 3})}},
      // losses (targets in [0, 4): four classes)
      {"NegativeLogLikelihoodLoss", {F({2, 4, 3}), Idx({2, 3}), W({4})}},
      {"SoftmaxCrossEntropyLoss",
       {F({2, 4, 3}), Idx({2, 3})},
       All(Str("reduction", "sum"), Int("ignore_index", 1)),
       2},
      // signal
      {"HannWindow", {CScalar(8)}},
      {"HammingWindow", {CScalar(7)}, Int("periodic", 0)},
      {"BlackmanWindow", {CScalar(6)}},
      {"DFT", {F({1, 8, 2})}, Int("inverse", 1)},
      {"STFT", {F({1, 16, 1}), CScalar(4), Absent(), CScalar(8)}},
      // vision
      {"GridSample", {F({1, 2, 4, 4}), F({1, 3, 3, 2})}, Str("padding_mode", "reflection")},
      {"RoiAlign",
       {F({1, 2, 6, 6}), CF({2, 4}, {0.5f, 0.5f, 4.0f, 3.0f, 1.0f, 0.0f, 5.5f, 5.0f}), C({0, 0})},
       All(Int("output_height", 2), Int("output_width", 3))},
      // Strides 2: a [4, 4] output, so every index is inside it (default strides 1 give [3, 3],
      // where 9 and 14 are refused as out of range).
      {"MaxUnpool",
       {F({1, 1, 2, 2}), Shaped(C({0, 3, 9, 14}), {1, 1, 2, 2})},
       All(Ints("kernel_shape", {2, 2}), Ints("strides", {2, 2}))},
      {"LRN", {F({1, 5, 3, 3})}, Int("size", 3)},
      {"LpPool", {F({1, 2, 5, 5})}, All(Ints("kernel_shape", {2, 2}), Int("p", 3))},
      {"GlobalLpPool", {F({1, 3, 4, 4})}},
      // tensor
      {"ReverseSequence", {F({4, 2, 3}), C({2, 4})}},
      {"CastLike", {F({2, 3}), Idx({1})}},
      {"DynamicQuantizeLinear", {F({2, 3})}, nullptr, 3},
      {"TfIdfVectorizer",
       {I32Idx({2, 6})},
       All(Str("mode", "TFIDF"), Int("min_gram_length", 1), Int("max_gram_length", 2),
           Int("max_skip_count", 1), Ints("ngram_counts", {0, 2}),
           Ints("ngram_indexes", {0, 1, 2, 3}), Ints("pool_int64s", {0, 1, 2, 3, 3, 1}),
           Flts("weights", {0.5f, 1.0f, 1.5f, 2.0f}))},
      // random: seeded by the node, so compiled draws what eager draws
      {"Bernoulli", {F({2, 3}, Domain::kPositive)}},
      {"RandomUniformLike", {F({2, 3})}, All(Flt("low", -3.0f), Flt("high", 3.0f))},
      {"RandomNormalLike", {F({4})}, Flt("seed", 5.0f)},
      {"RandomUniform", {}, Ints("shape", {3, 2})},
      {"RandomNormal", {}, All(Ints("shape", {5}), Flt("scale", 2.0f))},
      {"Multinomial", {F({2, 4})}, Int("sample_size", 3)},
  };
  return cases;
}

TEST(Differential, FamilyDOpsCompiledMatchEager) { RunGroup(FamilyDCases(), 17); }

// Sequences, optionals and strings (the host runs them inside the cell, in its dynamic region;
// at the graph's edge they cross packed into bytes, compile/packed_boundary.h), and the ops
// whose output shapes depend on values (NonMaxSuppression, Unique, Compress, MelWeightMatrix):
// compiled gives eager's bytes.
TEST(Differential, SequencesOptionalsStringsAndDataDependentOpsRunOnTheHost) {
  OnnxBuilder b(18);
  b.Input("x", onnx::TensorProto::FLOAT, {2, 3});
  b.Input("y", onnx::TensorProto::FLOAT, {2, 3});
  b.Input("w", onnx::TensorProto::FLOAT, {1, 3});
  b.Input("cond", onnx::TensorProto::BOOL, {3});
  b.Input("boxes", onnx::TensorProto::FLOAT, {1, 5, 4});
  b.Input("scores", onnx::TensorProto::FLOAT, {1, 2, 5});
  b.Int64Init("one", {}, {1});
  b.Int64Init("max_out", {1}, {3});
  b.FloatInit("iou", {1}, {0.3f});
  b.Int64Init("bins", {}, {4}).Int64Init("dft_length", {}, {16}).Int64Init("rate", {}, {8000});
  b.FloatInit("low_hz", {}, {0.0f}).FloatInit("high_hz", {}, {4000.0f});
  b.Node("SequenceConstruct", {"x", "y"}, {"s"}, "construct");
  b.Node("SequenceInsert", {"s", "x", "one"}, {"s2"}, "insert");
  b.Node("SequenceLength", {"s2"}, {"len"}, "length");
  b.Node("SequenceAt", {"s2", "one"}, {"at"}, "at");
  b.Node("SequenceErase", {"s2"}, {"erased"}, "erase");
  OnnxBuilder::IntAttr(b.Node("ConcatFromSequence", {"erased"}, {"cat"}, "concat"), "axis", 0);
  b.Node("SplitToSequence", {"cat", "one"}, {"parts"}, "split");
  OnnxBuilder::IntAttr(b.Node("SequenceEmpty", {}, {"empty"}, "empty"), "dtype",
                       onnx::TensorProto::INT64);
  b.Node("SequenceLength", {"empty"}, {"empty_len"}, "empty_length");
  b.Node("Optional", {"x"}, {"opt"}, "optional");
  b.Node("OptionalHasElement", {"opt"}, {"has"}, "has");
  b.Node("OptionalGetElement", {"opt"}, {"got"}, "get");
  // SequenceMap: Abs of each element.
  auto& map = b.Node("SequenceMap", {"s2"}, {"mapped"}, "map");
  auto* body_attr = map.add_attribute();
  body_attr->set_name("body");
  body_attr->set_type(onnx::AttributeProto::GRAPH);
  onnx::GraphProto* body = body_attr->mutable_g();
  body->set_name("abs_body");
  auto* bn = body->add_node();
  bn->set_op_type("Abs");
  bn->add_input("e");
  bn->add_output("a");
  for (const char* name : {"e", "a"}) {
    auto* vi = std::string(name) == "e" ? body->add_input() : body->add_output();
    vi->set_name(name);
    vi->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
  }
  // Strings: numbers to text, normalized.
  OnnxBuilder::IntAttr(b.Node("Cast", {"w"}, {"text"}, "to_text"), "to", onnx::TensorProto::STRING);
  OnnxBuilder::IntAttr(b.Node("StringNormalizer", {"text"}, {"normalized"}, "normalize"),
                       "is_case_sensitive", 1);
  // Data-dependent shapes.
  b.Node("NonMaxSuppression", {"boxes", "scores", "max_out", "iou"}, {"selected"}, "nms");
  b.Node("Unique", {"cond"}, {"uniq"}, "unique");
  OnnxBuilder::IntAttr(b.Node("Compress", {"x", "cond"}, {"compressed"}, "compress"), "axis", 1);
  b.Node("MelWeightMatrix", {"bins", "dft_length", "rate", "low_hz", "high_hz"}, {"mel"}, "mel");
  b.Output("len", onnx::TensorProto::INT64, {});
  b.Output("at", onnx::TensorProto::FLOAT, {2, 3});
  b.Output("cat", onnx::TensorProto::FLOAT, {4, 3});
  b.Output("empty_len", onnx::TensorProto::INT64, {});
  b.Output("has", onnx::TensorProto::BOOL, {});
  b.Output("got", onnx::TensorProto::FLOAT, {2, 3});
  b.Output("selected", onnx::TensorProto::INT64, {});
  b.Output("uniq", onnx::TensorProto::BOOL, {});
  b.Output("compressed", onnx::TensorProto::FLOAT, {});
  b.Output("mel", onnx::TensorProto::FLOAT, {});
  auto seq_out = [&](const char* name) {
    auto* vi = b.graph().add_output();
    vi->set_name(name);
    vi->mutable_type()
        ->mutable_sequence_type()
        ->mutable_elem_type()
        ->mutable_tensor_type()
        ->set_elem_type(onnx::TensorProto::FLOAT);
  };
  seq_out("parts");
  seq_out("mapped");
  b.Output("normalized", onnx::TensorProto::STRING, {});
  auto imported = ImportOnnxBytes(b.Bytes(), "values");
  ASSERT_TRUE(imported.ok()) << imported.status().ToString();
  for (ValueInfo& v : imported->outputs) {
    if (v.dims.empty()) v.has_shape = false;
  }
  auto boundary = PackBoundary(*imported);
  ASSERT_TRUE(boundary.ok()) << boundary.status().ToString();
  EXPECT_EQ(boundary->outputs.size(), 3u);  // parts, mapped, normalized
  auto graph = std::make_shared<const Graph>(boundary->graph);

  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  auto floats = [&](Shape s) {
    std::vector<float> v(static_cast<size_t>(NumElements(s)));
    for (float& f : v) f = u(rng);
    return Tensor::FromVector<float>(s, v);
  };
  std::vector<float> box_values;
  for (int i = 0; i < 5; ++i) {
    const float x0 = static_cast<float>(i) * 0.4f, y0 = static_cast<float>(i % 2) * 0.3f;
    box_values.insert(box_values.end(), {y0, x0, y0 + 1.0f, x0 + 1.0f});
  }
  const uint8_t cond_bits[] = {1, 0, 1};
  const TensorMap values = {{"x", floats({2, 3})},
                            {"y", floats({2, 3})},
                            {"w", floats({1, 3})},
                            {"cond", *Tensor::FromBytes(DType::kBool, {3}, cond_bits, 3)},
                            {"boxes", Tensor::FromVector<float>({1, 5, 4}, box_values)},
                            {"scores", floats({1, 2, 5})}};
  auto inputs = PackInputs(*boundary, values);
  ASSERT_TRUE(inputs.ok()) << inputs.status().ToString();

  ShapeClass cls;
  for (const auto& [n, t] : *inputs) cls[n] = t.shape();
  Envelope env{{cls}};
  auto cell = GenerateCell(*graph, env, "values", CompileOptions{}, nullptr);
  ASSERT_TRUE(cell.ok()) << cell.status().ToString();
  auto entries = EntriesFromDescribe(cell->describe, env);
  ASSERT_TRUE(entries.ok()) << entries.status().ToString();
  auto toolchain = LocalToolchain();
  auto driver = MakeSystemCompilerDriver(*toolchain);
  const std::string dir = "/tmp/kiln-values-" + std::to_string(::getpid());
  ASSERT_TRUE(MakeDirs(dir).ok());
  auto so =
      BuildSharedObject(cell->source, 1, DefaultSmTarget(), "values", *driver, dir, 2, nullptr);
  ASSERT_TRUE(so.ok()) << so.status().ToString();
  auto lib = OpenCellBytes(*so, dir + "/load");
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  ASSERT_TRUE(lib.ok()) << lib.status().ToString();
  auto armed = ArmedCell::Arm(*lib, *entries, GraphWeights(*graph), Lane::kIntake, "", 1);
  ASSERT_TRUE(armed.ok()) << armed.status().ToString();
  auto eager = Interpreter::Create(graph);
  ASSERT_TRUE(eager.ok()) << eager.status().ToString();
  auto ref = eager->Run(*inputs);
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  auto got = (*armed)->Run(0, *inputs);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  for (const auto& [name, r] : *ref) {  // packed outputs compare byte for byte
    const Tensor& c = got->at(name);
    ASSERT_EQ(c.dtype(), r.dtype()) << name;
    ASSERT_EQ(c.shape(), r.shape()) << name;
    ASSERT_EQ(std::memcmp(c.raw_data(), r.raw_data(), r.nbytes()), 0) << name;
  }
  // And unpacked, the outputs are what the original graph gives eagerly.
  auto original = Interpreter::Create(std::make_shared<const Graph>(*imported));
  ASSERT_TRUE(original.ok());
  auto direct = original->Run(values);
  ASSERT_TRUE(direct.ok()) << direct.status().ToString();
  auto unpacked = UnpackOutputs(*boundary, *got);
  ASSERT_TRUE(unpacked.ok()) << unpacked.status().ToString();
  EXPECT_EQ(unpacked->at("mapped").items().size(), 3u);
  EXPECT_EQ(unpacked->at("normalized").TypeString(), direct->at("normalized").TypeString());
  EXPECT_EQ(unpacked->at("normalized").str(0), direct->at("normalized").str(0));
}

// Every op in the registry appears in some case (a new op without a differential case fails).
TEST(Differential, EveryRegisteredOpHasACase) {
  std::set<std::string> covered = {"Constant", "If", "Loop",
                                   "Scan"};  // subgraphs: control_flow_test
  // Sequences, optionals, strings and data-dependent shapes:
  // SequencesOptionalsStringsAndDataDependentOpsRunOnTheHost.
  for (const char* op :
       {"SequenceConstruct", "SequenceInsert", "SequenceLength", "SequenceAt", "SequenceErase",
        "ConcatFromSequence", "SplitToSequence", "SequenceEmpty", "SequenceMap", "Optional",
        "OptionalHasElement", "OptionalGetElement", "NonMaxSuppression", "Unique", "Compress"}) {
    covered.insert(op);
  }
  // Covered by the conformance suite's compiled mode, which runs every case of them through
  // a cell: StringNormalizer (string inputs the groups here cannot draw) and MelWeightMatrix
  // (its sizes come from input values, so its output shape is data-dependent).
  covered.insert({"StringNormalizer", "MelWeightMatrix"});
  for (const auto* group : {&Opset17Cases(), &LegacyCases(), &Opset18Cases(), &FamilyACases(),
                            &FamilyALegacyCases(), &FamilyAOpset18Cases(), &FamilyBCases(),
                            &FamilyBOpset18Cases(), &FamilyCCases(), &FamilyDCases()}) {
    for (const Case& c : *group) covered.insert(c.op);
  }
  for (const std::string& op : OpRegistry::Global().OpTypes()) {
    EXPECT_TRUE(covered.count(op)) << "op " << op << " has no differential case";
  }
}

}  // namespace
}  // namespace kiln
