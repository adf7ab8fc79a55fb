// Tests for the elementwise op family (src/kiln/ops/elementwise.cc): named cases per op run
// through the registry by RunOp (check -> infer -> allocate -> run), broadcasting, legacy opset
// forms (Clip-6 attributes vs Clip-11 inputs, the pre-7 broadcast axis), and error cases
// asserting code and message fragment.
//
// To add a case: append an ElementwiseCase to the list of its group below; expected values are
// written by hand or computed with <cmath>, never with kiln itself.
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "tests/ops/op_test_util.h"

namespace kiln {
namespace {

using testing::F32;
using testing::FloatAttr;
using testing::I64;
using testing::IntAttr;
using testing::IntsAttr;
using testing::MakeNode;
using testing::RunOp;

Tensor I32(Shape shape, std::vector<int32_t> v) {
  return Tensor::FromVector<int32_t>(std::move(shape), v);
}
Tensor Bool(Shape shape, std::vector<uint8_t> v) {
  return std::move(Tensor::FromBytes(DType::kBool, std::move(shape), v.data(), v.size())).value();
}
Tensor Half(Shape shape, const std::vector<float>& v) {
  std::vector<uint16_t> h;
  for (float f : v) h.push_back(FloatToHalf(f));
  return std::move(Tensor::FromBytes(DType::kFloat16, std::move(shape), h.data(), h.size() * 2))
      .value();
}

// Applies fn to every element of a float32 tensor, in double, for expected values.
Tensor Map(const Tensor& x, const std::function<double(double)>& fn) {
  std::vector<float> out;
  for (int64_t i = 0; i < x.numel(); ++i) out.push_back(static_cast<float>(fn(x.GetAsDouble(i))));
  return F32(x.shape(), out);
}

struct ElementwiseCase {
  std::string name;  // gtest parameter name: letters, digits, underscores
  std::string op;
  std::vector<Tensor> inputs;  // an invalid Tensor() marks an omitted optional input
  Tensor expected;
  std::map<std::string, Attribute> attrs = {};
  int64_t opset = 17;
};

void PrintTo(const ElementwiseCase& c, std::ostream* os) { *os << c.name; }

class ElementwiseCases : public ::testing::TestWithParam<ElementwiseCase> {};

TEST_P(ElementwiseCases, MatchesExpected) {
  const ElementwiseCase& c = GetParam();
  auto out = RunOp(MakeNode(c.op, c.inputs.size(), 1, c.attrs), c.inputs, c.opset);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  ASSERT_EQ(out->size(), 1u);
  testing::ExpectTensorNear((*out)[0], c.expected, 1e-6, 1e-5);
}

std::string CaseName(const ::testing::TestParamInfo<ElementwiseCase>& info) {
  return info.param.name;
}

// ---------------------------------------------------------------------------------------------
// Unary

const Tensor kX = F32({7}, {-2.5f, -1.0f, -0.5f, 0.0f, 0.5f, 1.0f, 2.5f});
const Tensor kPos = F32({2, 2}, {0.25f, 1.0f, 2.0f, 9.0f});

double Clamp01(double v) { return std::max(0.0, std::min(1.0, v)); }

std::vector<ElementwiseCase> UnaryCases() {
  return {
      {"Sqrt", "Sqrt", {kPos}, F32({2, 2}, {0.5f, 1.0f, std::sqrt(2.0f), 3.0f})},
      {"Exp", "Exp", {kX}, Map(kX, [](double v) { return std::exp(v); })},
      {"Log", "Log", {kPos}, Map(kPos, [](double v) { return std::log(v); })},
      {"Reciprocal", "Reciprocal", {kPos}, F32({2, 2}, {4.0f, 1.0f, 0.5f, 1.0f / 9.0f})},
      {"Sigmoid", "Sigmoid", {kX}, Map(kX, [](double v) { return 1 / (1 + std::exp(-v)); })},
      {"SigmoidSaturates",
       "Sigmoid",
       {F32({3}, {-100.0f, 100.0f, -1000.0f})},
       F32({3}, {static_cast<float>(std::exp(-100.0)), 1.0f, 0.0f})},
      {"Tanh", "Tanh", {kX}, Map(kX, [](double v) { return std::tanh(v); })},
      {"Erf", "Erf", {kX}, Map(kX, [](double v) { return std::erf(v); })},
      {"Sin", "Sin", {kX}, Map(kX, [](double v) { return std::sin(v); })},
      {"Cos", "Cos", {kX}, Map(kX, [](double v) { return std::cos(v); })},
      {"Floor", "Floor", {kX}, F32({7}, {-3, -1, -1, 0, 0, 1, 2})},
      {"Ceil", "Ceil", {kX}, F32({7}, {-2, -1, -0.0f, 0, 1, 1, 3})},
      {"Softplus", "Softplus", {kX}, Map(kX, [](double v) { return std::log(1 + std::exp(v)); })},
      {"SoftplusLarge", "Softplus", {F32({2}, {100.0f, -100.0f})}, F32({2}, {100.0f, 0.0f})},
      {"HardSwish",
       "HardSwish",
       {F32({5}, {-4, -1, 0, 1, 4})},
       Map(F32({5}, {-4, -1, 0, 1, 4}), [](double v) { return v * Clamp01(v / 6 + 0.5); })},
      {"LeakyReluDefaultAlpha",
       "LeakyRelu",
       {kX},
       Map(kX, [](double v) { return v >= 0 ? v : 0.01 * v; })},
      {"LeakyReluAlpha",
       "LeakyRelu",
       {kX},
       Map(kX, [](double v) { return v >= 0 ? v : 0.2 * v; }),
       {{"alpha", FloatAttr(0.2f)}}},
      {"HardSigmoidDefaults",
       "HardSigmoid",
       {kX},
       Map(kX, [](double v) { return Clamp01(0.2 * v + 0.5); })},
      {"HardSigmoidAttrs",
       "HardSigmoid",
       {kX},
       Map(kX, [](double v) { return Clamp01(0.5 * v + 0.1); }),
       {{"alpha", FloatAttr(0.5f)}, {"beta", FloatAttr(0.1f)}}},
      {"EluDefaultAlpha",
       "Elu",
       {kX},
       Map(kX, [](double v) { return v >= 0 ? v : std::exp(v) - 1; })},
      {"EluAlpha",
       "Elu",
       {kX},
       Map(kX, [](double v) { return v >= 0 ? v : 2 * (std::exp(v) - 1); }),
       {{"alpha", FloatAttr(2.0f)}}},
      {"ReluFloat", "Relu", {kX}, F32({7}, {0, 0, 0, 0, 0.5f, 1, 2.5f})},
      {"ReluInt64", "Relu", {I64({3}, {-5, 0, 7})}, I64({3}, {0, 0, 7})},
      {"NegFloat", "Neg", {kX}, F32({7}, {2.5f, 1, 0.5f, 0, -0.5f, -1, -2.5f})},
      {"NegInt64", "Neg", {I64({2}, {3, -4})}, I64({2}, {-3, 4})},
      {"NegInt32", "Neg", {I32({2}, {3, -4})}, I32({2}, {-3, 4})},
      {"AbsFloat", "Abs", {kX}, F32({7}, {2.5f, 1, 0.5f, 0, 0.5f, 1, 2.5f})},
      {"AbsInt64", "Abs", {I64({3}, {-3, 0, 4})}, I64({3}, {3, 0, 4})},
      {"AbsInt32", "Abs", {I32({2}, {-3, 4})}, I32({2}, {3, 4})},
      {"SignFloat", "Sign", {kX}, F32({7}, {-1, -1, -1, 0, 1, 1, 1})},
      {"SignInt64", "Sign", {I64({3}, {-9, 0, 9})}, I64({3}, {-1, 0, 1})},
      {"Not", "Not", {Bool({3}, {1, 0, 1})}, Bool({3}, {0, 1, 0})},
      {"RoundHalfToEven",
       "Round",
       {F32({9}, {-2.5f, -1.5f, -0.5f, 0.5f, 1.5f, 2.5f, 2.4f, -2.6f, 0.49f})},
       F32({9}, {-2, -2, -0.0f, 0, 2, 2, 2, -3, 0})},
      {"Softsign", "Softsign", {kX}, Map(kX, [](double v) { return v / (1 + std::fabs(v)); })},
      {"Mish",
       "Mish",
       {kX},
       Map(kX, [](double v) { return v * std::tanh(std::log(1 + std::exp(v))); })},
      {"SeluDefaults",
       "Selu",
       {kX},
       Map(kX,
           [](double v) {
             const double alpha = 1.6732632423543772, gamma = 1.0507009873554805;
             return v > 0 ? gamma * v : gamma * alpha * (std::exp(v) - 1);
           })},
      {"SeluAttrs",
       "Selu",
       {kX},
       Map(kX, [](double v) { return v > 0 ? 3 * v : 3 * 2 * (std::exp(v) - 1); }),
       {{"alpha", FloatAttr(2.0f)}, {"gamma", FloatAttr(3.0f)}}},
      {"CeluDefaultAlpha",
       "Celu",
       {kX},
       Map(kX, [](double v) { return std::max(0.0, v) + std::min(0.0, std::exp(v) - 1); })},
      {"CeluAlpha",
       "Celu",
       {kX},
       Map(kX,
           [](double v) { return std::max(0.0, v) + std::min(0.0, 2 * (std::exp(v / 2) - 1)); }),
       {{"alpha", FloatAttr(2.0f)}}},
      {"ThresholdedReluDefault", "ThresholdedRelu", {kX}, F32({7}, {0, 0, 0, 0, 0, 0, 2.5f})},
      {"ThresholdedReluAlpha",
       "ThresholdedRelu",
       {kX},
       F32({7}, {0, 0, 0, 0, 0.5f, 1, 2.5f}),
       {{"alpha", FloatAttr(0.4f)}}},
      {"ShrinkDefaults", "Shrink", {kX}, F32({7}, {-2.5f, -1, 0, 0, 0, 1, 2.5f})},
      {"ShrinkLambdBias",
       "Shrink",
       {kX},
       F32({7}, {-1, 0, 0, 0, 0, 0, 1}),
       {{"lambd", FloatAttr(1.5f)}, {"bias", FloatAttr(1.5f)}}},
  };
}
INSTANTIATE_TEST_SUITE_P(ElementwiseUnary, ElementwiseCases, ::testing::ValuesIn(UnaryCases()),
                         CaseName);

// ---------------------------------------------------------------------------------------------
// Binary arithmetic and broadcasting

// a [2,3,4] = 0..23 and b [3,1] = {10,20,30}; expected a + b computed elementwise.
Tensor Iota(Shape shape, float start = 0) {
  std::vector<float> v(static_cast<size_t>(NumElements(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = start + static_cast<float>(i);
  return F32(std::move(shape), v);
}
Tensor Expected234Plus31() {
  std::vector<float> v;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k)
        v.push_back(static_cast<float>(i * 12 + j * 4 + k + 10 * (j + 1)));
  return F32({2, 3, 4}, v);
}

std::vector<ElementwiseCase> BinaryCases() {
  const Tensor a = F32({2, 2}, {1, 2, 3, 4});
  const Tensor b = F32({2, 2}, {0.5f, -2, 4, 8});
  return {
      {"AddSameShape", "Add", {a, b}, F32({2, 2}, {1.5f, 0, 7, 12})},
      {"AddBroadcast234With31",
       "Add",
       {Iota({2, 3, 4}), F32({3, 1}, {10, 20, 30})},
       Expected234Plus31()},
      {"AddBroadcastBothSides",
       "Add",
       {F32({2, 1}, {1, 2}), F32({1, 3}, {10, 20, 30})},
       F32({2, 3}, {11, 21, 31, 12, 22, 32})},
      {"AddScalar", "Add", {a, F32({}, {10})}, F32({2, 2}, {11, 12, 13, 14})},
      {"AddInt64", "Add", {I64({3}, {1, 2, 3}), I64({}, {-5})}, I64({3}, {-4, -3, -2})},
      {"AddInt32", "Add", {I32({2}, {1, 2}), I32({2}, {3, 4})}, I32({2}, {4, 6})},
      {"AddEmpty", "Add", {F32({0, 3}, {}), F32({3}, {1, 2, 3})}, F32({0, 3}, {})},
      {"SubScalarFirst", "Sub", {F32({}, {1}), a}, F32({2, 2}, {0, -1, -2, -3})},
      {"SubInt64", "Sub", {I64({2}, {5, 5}), I64({2}, {7, -7})}, I64({2}, {-2, 12})},
      {"MulBroadcastRow", "Mul", {a, F32({2}, {10, -1})}, F32({2, 2}, {10, -2, 30, -4})},
      {"AddUInt8Wraps",
       "Add",
       {Tensor::FromVector<uint8_t>({2}, {250, 3}), Tensor::FromVector<uint8_t>({2}, {10, 4})},
       Tensor::FromVector<uint8_t>({2}, {4, 7})},
      {"MulInt8Wraps",
       "Mul",
       {Tensor::FromVector<int8_t>({2}, {100, -3}), Tensor::FromVector<int8_t>({2}, {2, 5})},
       Tensor::FromVector<int8_t>({2}, {-56, -15})},
      {"MaxFloat16ThroughFloat32",
       "Max",
       {*F32({3}, {1.5f, -2, 65504}).CastTo(DType::kFloat16),
        *F32({}, {0.25f}).CastTo(DType::kFloat16)},
       *F32({3}, {1.5f, 0.25f, 65504}).CastTo(DType::kFloat16)},
      {"AddFloat16RoundsOnce",
       "Add",
       {*F32({2}, {1, 2048}).CastTo(DType::kFloat16), *F32({2}, {0.5f, 1}).CastTo(DType::kFloat16)},
       *F32({2}, {1.5f, 2048}).CastTo(DType::kFloat16)},
      {"MulInt32", "Mul", {I32({2}, {-3, 4}), I32({2}, {5, 6})}, I32({2}, {-15, 24})},
      {"DivFloat", "Div", {a, b}, F32({2, 2}, {2, -1, 0.75f, 0.5f})},
      {"DivInt64TruncatesTowardZero",
       "Div",
       {I64({4}, {7, -7, 7, -7}), I64({4}, {2, 2, -2, -2})},
       I64({4}, {3, -3, -3, 3})},
      {"DivInt32TruncatesTowardZero",
       "Div",
       {I32({3}, {9, -9, 1}), I32({}, {4})},
       I32({3}, {2, -2, 0})},
      {"DivInt64MinByMinusOneWraps",
       "Div",
       {I64({1}, {std::numeric_limits<int64_t>::min()}), I64({1}, {-1})},
       I64({1}, {std::numeric_limits<int64_t>::min()})},
      {"PowGeneral",
       "Pow",
       {F32({3}, {2, 9, 1.5f}), F32({3}, {3, 0.5f, -1})},
       F32({3}, {8, 3, 1 / 1.5f})},
      {"PowScalarTwo", "Pow", {kX, F32({}, {2})}, Map(kX, [](double v) { return v * v; })},
      {"PowScalarHalf",
       "Pow",
       {kPos, F32({1}, {0.5f})},
       Map(kPos, [](double v) { return std::sqrt(v); })},
      {"PowScalarThree", "Pow", {kX, F32({}, {3})}, Map(kX, [](double v) { return v * v * v; })},
      {"PowIntBaseFloatExponentTruncates",
       "Pow",
       {I64({4}, {2, 2, 3, -8}), F32({4}, {0.5f, 3, 1e30f, 1.0f / 3})},
       I64({4}, {1, 8, std::numeric_limits<int64_t>::max(), 0})},
      {"PowFloatBaseInt64Exponent", "Pow", {F32({2}, {2, 3}), I64({}, {2})}, F32({2}, {4, 9})},
      {"PowInt64",
       "Pow",
       {I64({4}, {2, -3, 5, 2}), I64({4}, {10, 3, 0, -1})},
       I64({4}, {1024, -27, 1, 0})},
      {"MinSingleInput", "Min", {a}, a},
      {"MinTwo", "Min", {a, F32({}, {2.5f})}, F32({2, 2}, {1, 2, 2.5f, 2.5f})},
      {"MaxThreeBroadcast",
       "Max",
       {F32({2, 1}, {1, 5}), F32({3}, {0, 3, 6}), F32({}, {2})},
       F32({2, 3}, {2, 3, 6, 5, 5, 6})},
      {"MaxPropagatesNaN", "Max", {F32({2}, {NAN, 1}), F32({2}, {0, NAN})}, F32({2}, {NAN, NAN})},
      {"MaxInt64", "Max", {I64({2}, {-1, 4}), I64({2}, {3, 2})}, I64({2}, {3, 4})},
      {"MinFourInt32",
       "Min",
       {I32({2}, {5, 1}), I32({2}, {3, 4}), I32({}, {2}), I32({1}, {9})},
       I32({2}, {2, 1})},
      {"MaxUInt8",
       "Max",
       {Tensor::FromVector<uint8_t>({3}, {200, 3, 7}), Tensor::FromVector<uint8_t>({}, {5})},
       Tensor::FromVector<uint8_t>({3}, {200, 5, 7})},
      {"ModInt8MixedSign",
       "Mod",
       {Tensor::FromVector<int8_t>({4}, {-128, 7, -7, 100}),
        Tensor::FromVector<int8_t>({4}, {-1, -3, 3, 7})},
       Tensor::FromVector<int8_t>({4}, {0, -2, 2, 2})},
      {"SumSingleInput", "Sum", {a}, a},
      {"SumThreeBroadcast",
       "Sum",
       {F32({2, 1}, {1, 5}), F32({3}, {0, 3, 6}), F32({}, {2})},
       F32({2, 3}, {3, 6, 9, 7, 10, 13})},
      {"SumInt64", "Sum", {I64({2}, {1, 2}), I64({2}, {10, 20})}, I64({2}, {11, 22})},
      {"MeanThreeBroadcast",
       "Mean",
       {F32({2, 1}, {1, 5}), F32({3}, {0, 3, 6}), F32({}, {2})},
       F32({2, 3}, {1, 2, 3, 7.0f / 3, 10.0f / 3, 13.0f / 3})},
      {"MeanSingleInput", "Mean", {a}, a},
      // fmod=0: the remainder takes the divisor's sign (Python %); fmod=1: the dividend's (C).
      {"ModInt64SignOfDivisor",
       "Mod",
       {I64({6}, {-4, 7, 5, 4, -7, 8}), I64({6}, {2, -3, 8, -2, 3, 5})},
       I64({6}, {0, -2, 5, 0, 2, 3})},
      {"ModInt32Fmod",
       "Mod",
       {I32({6}, {-4, 7, 5, 4, -7, 8}), I32({6}, {2, -3, 8, -2, 3, 5})},
       I32({6}, {0, 1, 5, 0, -1, 3}),
       {{"fmod", IntAttr(1)}}},
      {"ModInt64BroadcastScalar",
       "Mod",
       {I64({2, 2}, {-5, -1, 0, 9}), I64({}, {4})},
       I64({2, 2}, {3, 3, 0, 1})},
      {"ModInt64MinByMinusOne",
       "Mod",
       {I64({1}, {std::numeric_limits<int64_t>::min()}), I64({1}, {-1})},
       I64({1}, {0})},
      {"ModFloatFmod",
       "Mod",
       {F32({4}, {-4.5f, 7.25f, 5, -7}), F32({4}, {2, -3, 8, 2.5f})},
       F32({4}, {std::fmod(-4.5f, 2.0f), std::fmod(7.25f, -3.0f), 5, std::fmod(-7.0f, 2.5f)}),
       {{"fmod", IntAttr(1)}}},
      // float16 fmod is exact (the remainder fits the dividend's precision): 7.25 fmod -3 =
      // 1.25, -4.5 fmod 2 = -0.5, 65504 fmod 3 = 65504 - 21834*3 = 2, -7 fmod 2.5 = -2.
      {"ModHalfFmodMixedSign",
       "Mod",
       {Half({4}, {-4.5f, 7.25f, 65504, -7}), Half({4}, {2, -3, 3, 2.5f})},
       Half({4}, {-0.5f, 1.25f, 2, -2}),
       {{"fmod", IntAttr(1)}}},
      {"ModHalfBroadcastScalar",
       "Mod",
       {Half({3}, {5.5f, -5.5f, 0.75f}), Half({}, {2})},
       Half({3}, {1.5f, -1.5f, 0.75f}),
       {{"fmod", IntAttr(1)}}},
      {"PReluSlopeBroadcast",
       "PRelu",
       {F32({2, 3}, {-1, 2, -3, 4, -5, 6}), F32({3}, {0.1f, 0.2f, 0.3f})},
       F32({2, 3}, {-0.1f, 2, -0.9f, 4, -1, 6})},
      {"PReluScalarSlope",
       "PRelu",
       {F32({3}, {-2, 0, 2}), F32({1}, {0.25f})},
       F32({3}, {-0.5f, 0, 2})},
      // Opset 6: a 1-D slope of the channel count applies along dim 1 (numpy would use the last).
      {"PReluLegacyPerChannel",
       "PRelu",
       {F32({1, 2, 2}, {-1, -2, -3, 4}), F32({2}, {0.5f, 2})},
       F32({1, 2, 2}, {-0.5f, -1, -6, 4}),
       {},
       6},
      {"PReluNumpyBroadcastAt7",
       "PRelu",
       {F32({1, 2, 2}, {-1, -2, -3, 4}), F32({2}, {0.5f, 2})},
       F32({1, 2, 2}, {-0.5f, -4, -1.5f, 4}),
       {},
       7},
      // Opset 6: broadcast=1 with axis=1 lines B [3] up with A's dim 1 (numpy would use dim 2).
      {"AddLegacyBroadcastAxis",
       "Add",
       {Iota({2, 3, 2}), F32({3}, {100, 200, 300})},
       F32({2, 3, 2}, {100, 101, 202, 203, 304, 305, 106, 107, 208, 209, 310, 311}),
       {{"broadcast", IntAttr(1)}, {"axis", IntAttr(1)}},
       6},
      {"AddLegacyBroadcastNoAxis",
       "Add",
       {Iota({2, 3}), F32({3}, {100, 200, 300})},
       F32({2, 3}, {100, 201, 302, 103, 204, 305}),
       {{"broadcast", IntAttr(1)}},
       6},
  };
}
INSTANTIATE_TEST_SUITE_P(ElementwiseBinary, ElementwiseCases, ::testing::ValuesIn(BinaryCases()),
                         CaseName);

// ---------------------------------------------------------------------------------------------
// Comparisons, logic, Where, Clip, Cast

std::vector<ElementwiseCase> SelectCases() {
  const Tensor x = F32({4}, {1, 2, 3, NAN});
  const Tensor two = F32({}, {2});
  return {
      {"EqualFloatScalar", "Equal", {x, two}, Bool({4}, {0, 1, 0, 0})},
      {"EqualNaNIsFalse", "Equal", {x, x}, Bool({4}, {1, 1, 1, 0})},
      {"EqualInt64Broadcast",
       "Equal",
       {I64({2, 1}, {1, 2}), I64({3}, {1, 2, 3})},
       Bool({2, 3}, {1, 0, 0, 0, 1, 0})},
      {"EqualInt32", "Equal", {I32({2}, {5, 6}), I32({2}, {5, 7})}, Bool({2}, {1, 0})},
      {"EqualBool", "Equal", {Bool({3}, {1, 0, 1}), Bool({3}, {1, 1, 0})}, Bool({3}, {1, 0, 0})},
      {"EqualFloat16", "Equal", {Half({2}, {0.5f, 1}), Half({2}, {0.5f, 2})}, Bool({2}, {1, 0})},
      {"Less", "Less", {x, two}, Bool({4}, {1, 0, 0, 0})},
      {"LessOrEqual", "LessOrEqual", {x, two}, Bool({4}, {1, 1, 0, 0})},
      {"Greater", "Greater", {x, two}, Bool({4}, {0, 0, 1, 0})},
      {"GreaterOrEqualInt64",
       "GreaterOrEqual",
       {I64({3}, {1, 2, 3}), I64({}, {2})},
       Bool({3}, {0, 1, 1})},
      {"And", "And", {Bool({4}, {0, 0, 1, 1}), Bool({4}, {0, 1, 0, 1})}, Bool({4}, {0, 0, 0, 1})},
      {"OrBroadcast", "Or", {Bool({2, 1}, {0, 1}), Bool({2}, {0, 1})}, Bool({2, 2}, {0, 1, 1, 1})},
      {"Xor", "Xor", {Bool({4}, {0, 0, 1, 1}), Bool({4}, {0, 1, 0, 1})}, Bool({4}, {0, 1, 1, 0})},
      {"XorBroadcast",
       "Xor",
       {Bool({2, 1}, {0, 1}), Bool({2}, {0, 1})},
       Bool({2, 2}, {0, 1, 1, 0})},
      {"WhereSameShape",
       "Where",
       {Bool({3}, {1, 0, 1}), F32({3}, {1, 2, 3}), F32({3}, {4, 5, 6})},
       F32({3}, {1, 5, 3})},
      {"WhereThreeWayBroadcast",
       "Where",
       {Bool({2, 1}, {1, 0}), F32({1, 3}, {1, 2, 3}), F32({}, {-1})},
       F32({2, 3}, {1, 2, 3, -1, -1, -1})},
      {"WhereInt64",
       "Where",
       {Bool({3}, {0, 1, 0}), I64({3}, {1, 2, 3}), I64({1}, {9})},
       I64({3}, {9, 2, 9})},
      {"WhereInt32CondBroadcast",
       "Where",
       {Bool({}, {1}), I32({2}, {1, 2}), I32({2}, {3, 4})},
       I32({2}, {1, 2})},
      // Clip: the same bounds through the opset 6 attributes and the opset 11 inputs.
      {"Clip6Attributes",
       "Clip",
       {kX},
       F32({7}, {-1, -1, -0.5f, 0, 0.5f, 0.75f, 0.75f}),
       {{"min", FloatAttr(-1)}, {"max", FloatAttr(0.75f)}},
       6},
      {"Clip11Inputs",
       "Clip",
       {kX, F32({}, {-1}), F32({}, {0.75f})},
       F32({7}, {-1, -1, -0.5f, 0, 0.5f, 0.75f, 0.75f}),
       {},
       11},
      {"Clip6OnlyMin",
       "Clip",
       {kX},
       F32({7}, {0, 0, 0, 0, 0.5f, 1, 2.5f}),
       {{"min", FloatAttr(0)}},
       6},
      {"Clip11OnlyMax",
       "Clip",
       {kX, Tensor(), F32({}, {0})},
       F32({7}, {-2.5f, -1, -0.5f, 0, 0, 0, 0}),
       {},
       13},
      {"Clip11NoBounds", "Clip", {kX}, kX, {}, 13},
      {"Clip11MinAboveMaxGivesMax",
       "Clip",
       {kX, F32({}, {2}), F32({}, {1})},
       F32({7}, {1, 1, 1, 1, 1, 1, 1}),
       {},
       13},
      {"Clip13Int64",
       "Clip",
       {I64({4}, {-9, 0, 5, 9}), I64({}, {-1}), I64({}, {6})},
       I64({4}, {-1, 0, 5, 6}),
       {},
       13},
      {"ClipKeepsNaN",
       "Clip",
       {F32({1}, {NAN}), F32({}, {0}), F32({}, {1})},
       F32({1}, {NAN}),
       {},
       13},
      {"CastFloatToInt64Truncates",
       "Cast",
       {F32({4}, {1.9f, -1.9f, 0.5f, 3})},
       I64({4}, {1, -1, 0, 3}),
       {{"to", IntAttr(7)}}},
      {"CastFloatToInt32",
       "Cast",
       {F32({2}, {-7.5f, 7.5f})},
       I32({2}, {-7, 7}),
       {{"to", IntAttr(6)}}},
      {"CastInt64ToFloat",
       "Cast",
       {I64({2}, {-3, 1 << 20})},
       F32({2}, {-3, 1 << 20}),
       {{"to", IntAttr(1)}}},
      {"CastFloatToBool",
       "Cast",
       {F32({3}, {0, -0.5f, 2})},
       Bool({3}, {0, 1, 1}),
       {{"to", IntAttr(9)}}},
      {"CastBoolToFloat", "Cast", {Bool({2}, {1, 0})}, F32({2}, {1, 0}), {{"to", IntAttr(1)}}},
      {"CastFloatToFloat16",
       "Cast",
       {F32({2}, {0.5f, -2})},
       Half({2}, {0.5f, -2}),
       {{"to", IntAttr(10)}}},
      {"CastInt64ToInt8",
       "Cast",
       {I64({2}, {-3, 100})},
       Tensor::FromVector<int8_t>({2}, {-3, 100}),
       {{"to", IntAttr(3)}}},
      {"CastInt64ToUInt8",
       "Cast",
       {I64({2}, {3, 200})},
       Tensor::FromVector<uint8_t>({2}, {3, 200}),
       {{"to", IntAttr(2)}}},
      {"CastSameType", "Cast", {kX}, kX, {{"to", IntAttr(1)}}},
  };
}
INSTANTIATE_TEST_SUITE_P(ElementwiseSelect, ElementwiseCases, ::testing::ValuesIn(SelectCases()),
                         CaseName);

// ---------------------------------------------------------------------------------------------
// Registration and errors

TEST(ElementwiseRegistry, ClipHasTwoForms) {
  auto legacy = OpRegistry::Global().Find("", "Clip", 6);
  ASSERT_TRUE(legacy.ok()) << legacy.status().ToString();
  EXPECT_EQ((*legacy)->until_version, 10);
  auto modern = OpRegistry::Global().Find("", "Clip", 11);
  ASSERT_TRUE(modern.ok()) << modern.status().ToString();
  EXPECT_EQ((*modern)->since_version, 11);
}

TEST(ElementwiseRegistry, AllOpsRegistered) {
  for (const char* op : {"Add",
                         "Sub",
                         "Mul",
                         "Div",
                         "Pow",
                         "Sqrt",
                         "Exp",
                         "Log",
                         "Neg",
                         "Abs",
                         "Reciprocal",
                         "Relu",
                         "LeakyRelu",
                         "Sigmoid",
                         "Tanh",
                         "Erf",
                         "HardSigmoid",
                         "HardSwish",
                         "Clip",
                         "Sin",
                         "Cos",
                         "Where",
                         "Equal",
                         "Cast",
                         "Not",
                         "Less",
                         "Greater",
                         "LessOrEqual",
                         "GreaterOrEqual",
                         "And",
                         "Or",
                         "Min",
                         "Max",
                         "Floor",
                         "Ceil",
                         "Sign",
                         "Softplus",
                         "Elu",
                         "Xor",
                         "Mod",
                         "Sum",
                         "Mean",
                         "Round",
                         "Softsign",
                         "Selu",
                         "Celu",
                         "Mish",
                         "PRelu",
                         "ThresholdedRelu",
                         "Shrink"}) {
    EXPECT_TRUE(OpRegistry::Global().Find("", op, 17).ok()) << op;
  }
}

struct ErrorCase {
  std::string name;
  std::string op;
  std::vector<Tensor> inputs;
  StatusCode code;
  std::vector<std::string> fragments;  // each must appear in the message
  std::map<std::string, Attribute> attrs = {};
  int64_t opset = 17;
};

void PrintTo(const ErrorCase& c, std::ostream* os) { *os << c.name; }

class ElementwiseErrors : public ::testing::TestWithParam<ErrorCase> {};

TEST_P(ElementwiseErrors, FailsWithMessage) {
  const ErrorCase& c = GetParam();
  auto out = RunOp(MakeNode(c.op, c.inputs.size(), 1, c.attrs), c.inputs, c.opset);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), c.code) << out.status().ToString();
  for (const std::string& f : c.fragments) {
    EXPECT_NE(out.status().message().find(f), std::string::npos)
        << "missing '" << f << "' in: " << out.status().message();
  }
}

std::vector<ErrorCase> ErrorCases() {
  const Tensor x = F32({2, 3}, {1, 2, 3, 4, 5, 6});
  return {
      {"BadBroadcastNamesBothShapes",
       "Add",
       {x, F32({4}, {1, 2, 3, 4})},
       StatusCode::kInvalidArgument,
       {"Add 'n0'", "[2,3]", "[4]"}},
      {"MixedDTypes",
       "Mul",
       {x, I64({}, {2})},
       StatusCode::kInvalidArgument,
       {"Mul 'n0'", "int64", "float32"}},
      {"SqrtInt64Unsupported",
       "Sqrt",
       {I64({1}, {4})},
       StatusCode::kUnimplemented,
       {"Sqrt 'n0'", "int64", "float32"}},
      {"AddBoolUnsupported",
       "Add",
       {Bool({1}, {1}), Bool({1}, {0})},
       StatusCode::kUnimplemented,
       {"Add 'n0'", "bool"}},
      {"NotOnFloat", "Not", {x}, StatusCode::kUnimplemented, {"Not 'n0'", "float32", "bool"}},
      {"CastToComplexUnimplemented",
       "Cast",
       {x},
       StatusCode::kUnimplemented,
       {"'to'=14", "COMPLEX64"},
       {{"to", IntAttr(14)}}},
      {"CastMissingTo", "Cast", {x}, StatusCode::kInvalidArgument, {"Cast 'n0'", "'to'"}},
      {"DivInt64ByZero",
       "Div",
       {I64({3}, {1, 2, 3}), I64({3}, {1, 0, 1})},
       StatusCode::kInvalidArgument,
       {"Div 'n0'", "division by zero", "element 1"}},
      {"DivInt32ByScalarZero",
       "Div",
       {I32({2}, {1, 2}), I32({}, {0})},
       StatusCode::kInvalidArgument,
       {"division by zero"}},
      {"WhereConditionNotBool",
       "Where",
       {x, x, x},
       StatusCode::kInvalidArgument,
       {"Where 'n0'", "condition", "float32", "bool"}},
      {"WhereBranchDTypesDiffer",
       "Where",
       {Bool({1}, {1}), x, I64({1}, {1})},
       StatusCode::kInvalidArgument,
       {"Where 'n0'", "float32", "int64"}},
      {"WhereBadBroadcast",
       "Where",
       {Bool({2}, {1, 0}), x, x},
       StatusCode::kInvalidArgument,
       {"Where 'n0'", "[2]", "[2,3]"}},
      {"LeakyReluAlphaNotFloat",
       "LeakyRelu",
       {x},
       StatusCode::kInvalidArgument,
       {"LeakyRelu 'n0'", "'alpha'", "float"},
       {{"alpha", IntAttr(1)}}},
      {"Clip11BoundNotScalar",
       "Clip",
       {x, F32({2}, {0, 1})},
       StatusCode::kInvalidArgument,
       {"Clip 'n0'", "input 1 ('min')", "float32[2]"},
       {},
       11},
      {"Clip11BoundDTypeDiffers",
       "Clip",
       {x, I64({}, {0})},
       StatusCode::kInvalidArgument,
       {"Clip 'n0'", "int64[]"},
       {},
       13},
      {"Clip11RejectsAttributes",
       "Clip",
       {x},
       StatusCode::kInvalidArgument,
       {"Clip 'n0'", "'min'", "opset 11"},
       {{"min", FloatAttr(0)}},
       11},
      {"Clip6RejectsInputs",
       "Clip",
       {x, F32({}, {0})},
       StatusCode::kInvalidArgument,
       {"Clip 'n0'", "2 inputs"},
       {},
       6},
      {"BinaryArity", "Add", {x}, StatusCode::kInvalidArgument, {"Add 'n0'", "1 inputs"}},
      {"ModFmodNotAFlag",
       "Mod",
       {I64({1}, {3}), I64({1}, {2})},
       StatusCode::kInvalidArgument,
       {"Mod 'n0'", "'fmod'=2", "0 or 1"},
       {{"fmod", IntAttr(2)}}},
      {"ModFloatNeedsFmod",
       "Mod",
       {x, x},
       StatusCode::kInvalidArgument,
       {"Mod 'n0'", "'fmod'=0", "float32"}},
      {"ModHalfNeedsFmod",
       "Mod",
       {Half({1}, {1}), Half({1}, {2})},
       StatusCode::kInvalidArgument,
       {"Mod 'n0'", "'fmod'=0", "float16 inputs need fmod=1"}},
      {"ModBoolUnsupported",
       "Mod",
       {Bool({1}, {1}), Bool({1}, {1})},
       StatusCode::kUnimplemented,
       {"Mod 'n0'", "dtype bool is not supported", "uint64, float16"},
       {{"fmod", IntAttr(1)}}},
      {"ModInt32ByZero",
       "Mod",
       {I32({2}, {1, 2}), I32({2}, {3, 0})},
       StatusCode::kInvalidArgument,
       {"Mod 'n0'", "division by zero", "element 1"}},
      {"CeluAlphaZero",
       "Celu",
       {x},
       StatusCode::kInvalidArgument,
       {"Celu 'n0'", "'alpha'=0"},
       {{"alpha", FloatAttr(0)}}},
      {"SeluGammaNotFloat",
       "Selu",
       {x},
       StatusCode::kInvalidArgument,
       {"Selu 'n0'", "'gamma'", "float"},
       {{"gamma", IntAttr(1)}}},
      {"ShrinkLambdNotFloat",
       "Shrink",
       {x},
       StatusCode::kInvalidArgument,
       {"Shrink 'n0'", "'lambd'"},
       {{"lambd", IntsAttr({1})}}},
      {"PReluSlopeDoesNotBroadcastToX",
       "PRelu",
       {x, F32({2, 2, 3}, std::vector<float>(12, 0.1f))},
       StatusCode::kInvalidArgument,
       {"PRelu 'n0'", "'slope'", "[2,2,3]", "[2,3]"}},
      {"XorOnFloat", "Xor", {x, x}, StatusCode::kUnimplemented, {"Xor 'n0'", "float32", "bool"}},
      {"MeanInt64Unsupported",
       "Mean",
       {I64({1}, {1}), I64({1}, {2})},
       StatusCode::kUnimplemented,
       {"Mean 'n0'", "int64"}},
      {"LegacyBroadcastAxisDoesNotFit",
       "Add",
       {x, x},
       StatusCode::kInvalidArgument,
       {"Add 'n0'", "axis=1", "does not fit"},
       {{"broadcast", IntAttr(1)}, {"axis", IntAttr(1)}},
       6},
  };
}
INSTANTIATE_TEST_SUITE_P(ElementwiseErrorCases, ElementwiseErrors,
                         ::testing::ValuesIn(ErrorCases()),
                         [](const ::testing::TestParamInfo<ErrorCase>& info) {
                           return info.param.name;
                         });

// A larger broadcast checked element by element against index arithmetic, exercising the
// strided path with more than one broadcast dim.
TEST(ElementwiseBroadcast, StridedPathMatchesIndexing) {
  const Tensor a = Iota({3, 1, 5, 1});
  const Tensor b = Iota({4, 1, 6}, 100);
  auto out = RunOp(MakeNode("Sub", 2), {a, b});
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  const Tensor& y = (*out)[0];
  ASSERT_EQ(y.shape(), (Shape{3, 4, 5, 6}));
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j)
      for (int k = 0; k < 5; ++k)
        for (int l = 0; l < 6; ++l) {
          const float expected = static_cast<float>(i * 5 + k) - (100.0f + j * 6 + l);
          ASSERT_EQ(y.data<float>()[((i * 4 + j) * 5 + k) * 6 + l], expected)
              << i << "," << j << "," << k << "," << l;
        }
}

// ---------------------------------------------------------------------------------------------
// float64: arithmetic, min/max/mod, unary signed ops, comparisons, Clip, Pow and Cast keep double
// precision (1/3 and 1e300 are not float32 values).

Tensor F64(Shape shape, std::vector<double> v) {
  return Tensor::FromVector<double>(std::move(shape), v);
}

TEST(ElementwiseFloat64, ArithmeticKeepsDoublePrecision) {
  const double third = 1.0 / 3.0;
  const Tensor a = F64({2, 2}, {third, 1e300, -2.5, 0.0});
  const Tensor b = F64({2}, {2.0, -4.0});
  struct Case {
    const char* op;
    std::vector<double> want;
  } cases[] = {
      {"Add", {third + 2.0, 1e300 - 4.0, -0.5, -4.0}},
      {"Sub", {third - 2.0, 1e300 + 4.0, -4.5, 4.0}},
      {"Mul", {third * 2.0, -4e300, -5.0, -0.0}},
      {"Div", {third / 2.0, -2.5e299, -1.25, -0.0}},
      {"Max", {2.0, 1e300, 2.0, 0.0}},
      {"Min", {third, -4.0, -2.5, -4.0}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.op);
    auto out = RunOp(MakeNode(c.op, 2), {a, b});
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    ASSERT_EQ((*out)[0].dtype(), DType::kFloat64);
    for (int64_t i = 0; i < 4; ++i) EXPECT_EQ((*out)[0].data<double>()[i], c.want[i]) << i;
  }
  auto sum = RunOp(MakeNode("Sum", 3), {a, b, b});
  ASSERT_TRUE(sum.ok()) << sum.status().ToString();
  EXPECT_EQ((*sum)[0].data<double>()[0], (third + 2.0) + 2.0);
}

TEST(ElementwiseFloat64, ModNegAbsComparePowClip) {
  const Tensor x = F64({4}, {5.5, -5.5, 1e300, -0.25});
  const Tensor y = F64({4}, {2.0, 2.0, 3.0, 0.125});
  auto mod = RunOp(MakeNode("Mod", 2, 1, {{"fmod", IntAttr(1)}}), {x, y});
  ASSERT_TRUE(mod.ok()) << mod.status().ToString();
  testing::ExpectTensorNear((*mod)[0], F64({4}, {1.5, -1.5, std::fmod(1e300, 3.0), -0.0}), 0, 0);
  auto mod0 = RunOp(MakeNode("Mod", 2), {x, y});
  ASSERT_FALSE(mod0.ok());
  EXPECT_EQ(mod0.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(mod0.status().message().find("float64 inputs need fmod=1"), std::string::npos)
      << mod0.status().ToString();

  auto neg = RunOp(MakeNode("Neg", 1), {x});
  ASSERT_TRUE(neg.ok()) << neg.status().ToString();
  testing::ExpectTensorNear((*neg)[0], F64({4}, {-5.5, 5.5, -1e300, 0.25}), 0, 0);
  auto abs = RunOp(MakeNode("Abs", 1), {x});
  ASSERT_TRUE(abs.ok()) << abs.status().ToString();
  testing::ExpectTensorNear((*abs)[0], F64({4}, {5.5, 5.5, 1e300, 0.25}), 0, 0);

  auto less = RunOp(MakeNode("Less", 2), {x, y});
  ASSERT_TRUE(less.ok()) << less.status().ToString();
  testing::ExpectTensorNear((*less)[0], Bool({4}, {0, 1, 0, 1}), 0, 0);

  auto pow = RunOp(MakeNode("Pow", 2), {F64({2}, {3.0, 1e100}), F64({}, {2.0})});
  ASSERT_TRUE(pow.ok()) << pow.status().ToString();
  testing::ExpectTensorNear((*pow)[0], F64({2}, {9.0, 1e200}), 0, 1e-15);
  auto ipow = RunOp(MakeNode("Pow", 2), {I64({2}, {2, 3}), F64({}, {0.5})});
  ASSERT_TRUE(ipow.ok()) << ipow.status().ToString();
  testing::ExpectTensorNear((*ipow)[0], I64({2}, {1, 1}), 0, 0);

  auto clip = RunOp(MakeNode("Clip", 3), {x, F64({}, {-1.0}), F64({}, {1.0 / 3.0})});
  ASSERT_TRUE(clip.ok()) << clip.status().ToString();
  testing::ExpectTensorNear((*clip)[0], F64({4}, {1.0 / 3.0, -1.0, 1.0 / 3.0, -0.25}), 0, 0);
}

// int16, uint16, uint32 and uint64: Min/Max/Mod over the full range (uint64 past INT64_MAX),
// unsigned Mod without signs, Pow with an unsigned exponent, Cast both ways, comparisons.
TEST(ElementwiseWideIntegers, MinMaxModPowCastCompare) {
  const uint64_t top = std::numeric_limits<uint64_t>::max();
  auto u64 = [](Shape s, std::vector<uint64_t> v) { return Tensor::FromVector<uint64_t>(s, v); };
  auto max = RunOp(MakeNode("Max", 2), {u64({3}, {top, 1, uint64_t{1} << 63}), u64({}, {2})});
  ASSERT_TRUE(max.ok()) << max.status().ToString();
  EXPECT_EQ((*max)[0].data<uint64_t>()[0], top);  // not -1 < 2
  EXPECT_EQ((*max)[0].data<uint64_t>()[1], 2u);
  EXPECT_EQ((*max)[0].data<uint64_t>()[2], uint64_t{1} << 63);
  auto min = RunOp(MakeNode("Min", 3), {Tensor::FromVector<int16_t>({2}, {-32768, 7}),
                                        Tensor::FromVector<int16_t>({2}, {3, 4}),
                                        Tensor::FromVector<int16_t>({}, {5})});
  ASSERT_TRUE(min.ok()) << min.status().ToString();
  testing::ExpectTensorNear((*min)[0], Tensor::FromVector<int16_t>({2}, {-32768, 4}), 0, 0);

  // fmod=0 takes the divisor's sign, fmod=1 the dividend's; unsigned has neither.
  const Tensor a16 = Tensor::FromVector<int16_t>({4}, {-4, 7, 5, -7});
  const Tensor b16 = Tensor::FromVector<int16_t>({4}, {3, -3, 8, -2});
  auto mod = RunOp(MakeNode("Mod", 2), {a16, b16});
  ASSERT_TRUE(mod.ok()) << mod.status().ToString();
  testing::ExpectTensorNear((*mod)[0], Tensor::FromVector<int16_t>({4}, {2, -2, 5, -1}), 0, 0);
  auto fmod = RunOp(MakeNode("Mod", 2, 1, {{"fmod", IntAttr(1)}}), {a16, b16});
  ASSERT_TRUE(fmod.ok()) << fmod.status().ToString();
  testing::ExpectTensorNear((*fmod)[0], Tensor::FromVector<int16_t>({4}, {-1, 1, 5, -1}), 0, 0);
  auto umod = RunOp(MakeNode("Mod", 2),
                    {Tensor::FromVector<uint32_t>({3}, {4294967295u, 7, 3}),
                     Tensor::FromVector<uint32_t>({3}, {4294967295u - 1, 4294967295u, 2})});
  ASSERT_TRUE(umod.ok()) << umod.status().ToString();
  testing::ExpectTensorNear((*umod)[0], Tensor::FromVector<uint32_t>({3}, {1, 7, 1}), 0, 0);
  auto zero = RunOp(MakeNode("Mod", 2), {Tensor::FromVector<uint16_t>({2}, {1, 2}),
                                         Tensor::FromVector<uint16_t>({2}, {3, 0})});
  ASSERT_FALSE(zero.ok());
  EXPECT_NE(zero.status().message().find("Mod 'n0': integer division by zero"), std::string::npos)
      << zero.status().ToString();

  auto pow = RunOp(MakeNode("Pow", 2),
                   {F32({3}, {2, -3, 0.5f}), Tensor::FromVector<uint32_t>({3}, {10, 3, 2})});
  ASSERT_TRUE(pow.ok()) << pow.status().ToString();
  testing::ExpectTensorNear((*pow)[0], F32({3}, {1024, -27, 0.25f}), 0, 0);
  auto pow64 = RunOp(MakeNode("Pow", 2), {F32({1}, {3}), u64({1}, {4})});
  ASSERT_TRUE(pow64.ok()) << pow64.status().ToString();
  testing::ExpectTensorNear((*pow64)[0], F32({1}, {81}), 0, 0);
  auto pow_base = RunOp(MakeNode("Pow", 2), {u64({1}, {3}), u64({1}, {4})});
  ASSERT_FALSE(pow_base.ok());
  EXPECT_NE(pow_base.status().message().find("Pow 'n0': dtype uint64 is not supported"),
            std::string::npos)
      << pow_base.status().ToString();

  auto cast = RunOp(MakeNode("Cast", 1, 1, {{"to", IntAttr(13)}}), {I64({2}, {-1, 5})});
  ASSERT_TRUE(cast.ok()) << cast.status().ToString();
  EXPECT_EQ((*cast)[0].dtype(), DType::kUInt64);
  EXPECT_EQ((*cast)[0].data<uint64_t>()[0], top);  // wraps, like numpy astype
  for (const auto& [to, dtype] :
       {std::pair<int64_t, DType>{5, DType::kInt16}, {4, DType::kUInt16}, {12, DType::kUInt32}}) {
    auto c = RunOp(MakeNode("Cast", 1, 1, {{"to", IntAttr(to)}}), {F32({1}, {7.9f})});
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_EQ((*c)[0].dtype(), dtype);
    EXPECT_EQ((*c)[0].GetAsInt64(0), 7);
  }

  auto less = RunOp(MakeNode("Less", 2), {u64({2}, {top, 1}), u64({2}, {1, top})});
  ASSERT_TRUE(less.ok()) << less.status().ToString();
  testing::ExpectTensorNear((*less)[0], Bool({2}, {0, 1}), 0, 0);
}

TEST(ElementwiseFloat64, CastToAndFromDouble) {
  auto to = RunOp(MakeNode("Cast", 1, 1, {{"to", IntAttr(11)}}), {F32({2}, {0.1f, -3.0f})});
  ASSERT_TRUE(to.ok()) << to.status().ToString();
  testing::ExpectTensorNear((*to)[0], F64({2}, {static_cast<double>(0.1f), -3.0}), 0, 0);
  auto from = RunOp(MakeNode("Cast", 1, 1, {{"to", IntAttr(7)}}), {F64({2}, {1e15 + 0.5, -2.9})});
  ASSERT_TRUE(from.ok()) << from.status().ToString();
  testing::ExpectTensorNear((*from)[0], I64({2}, {1000000000000000, -2}), 0, 0);
  auto bad = RunOp(MakeNode("Cast", 1, 1, {{"to", IntAttr(14)}}), {F64({1}, {1.0})});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(bad.status().message().find("11 DOUBLE"), std::string::npos);
  // Unary float math stays float32-only and says so.
  auto exp = RunOp(MakeNode("Exp", 1), {F64({1}, {1.0})});
  ASSERT_FALSE(exp.ok());
  EXPECT_NE(exp.status().message().find("float64"), std::string::npos) << exp.status().ToString();
}

}  // namespace
}  // namespace kiln
