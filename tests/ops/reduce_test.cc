// Tests for the reduce op family (src/kiln/ops/reduce.cc): Softmax/LogSoftmax in their opset < 13
// (flatten at axis) and opset 13 (along axis) forms, and the Reduce* ops with axes as attribute
// or input, keepdims, negative axes, empty axes and noop_with_empty_axes; errors assert code and
// message fragment.
//
// To add a case: append a ReduceCase to the list of its group; expected values are written by
// hand or computed with <cmath> loops here, never with kiln itself.
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "tests/ops/op_test_util.h"

namespace kiln {
namespace {

using testing::F32;
using testing::I64;
using testing::IntAttr;
using testing::IntsAttr;
using testing::MakeNode;
using testing::RunOp;

Tensor I32(Shape shape, std::vector<int32_t> v) {
  return Tensor::FromVector<int32_t>(std::move(shape), v);
}

// x[i][j][k] = 6i + 2j + k, shape [2,3,2].
Tensor Iota232() {
  std::vector<float> v;
  for (int i = 0; i < 12; ++i) v.push_back(static_cast<float>(i));
  return F32({2, 3, 2}, v);
}

// Softmax (or log-softmax) of consecutive chunks of `row` elements, in double.
std::vector<float> SoftmaxRows(const std::vector<float>& v, size_t row, bool log = false) {
  std::vector<float> out;
  for (size_t r = 0; r < v.size(); r += row) {
    double sum = 0;
    for (size_t j = 0; j < row; ++j) sum += std::exp(double{v[r + j]});
    for (size_t j = 0; j < row; ++j) {
      out.push_back(
          static_cast<float>(log ? v[r + j] - std::log(sum) : std::exp(double{v[r + j]}) / sum));
    }
  }
  return out;
}

const std::vector<float> kLogits = {0.5f, -1, 2, 0, 1, 3, -2, 0.25f, 1.5f, 4, -0.5f, 1};

// Softmax of kLogits as [2,3,2] along axis 1 (stride 2), written with explicit indices.
std::vector<float> SoftmaxAxis1Of232() {
  std::vector<float> out(12);
  for (int i = 0; i < 2; ++i) {
    for (int k = 0; k < 2; ++k) {
      double sum = 0;
      for (int j = 0; j < 3; ++j) sum += std::exp(double{kLogits[i * 6 + j * 2 + k]});
      for (int j = 0; j < 3; ++j) {
        out[i * 6 + j * 2 + k] =
            static_cast<float>(std::exp(double{kLogits[i * 6 + j * 2 + k]}) / sum);
      }
    }
  }
  return out;
}

struct ReduceCase {
  std::string name;
  std::string op;
  std::vector<Tensor> inputs;  // an invalid Tensor() marks an omitted optional input
  Tensor expected;
  std::map<std::string, Attribute> attrs = {};
  int64_t opset = 17;
};

void PrintTo(const ReduceCase& c, std::ostream* os) { *os << c.name; }

class ReduceCases : public ::testing::TestWithParam<ReduceCase> {};

TEST_P(ReduceCases, MatchesExpected) {
  const ReduceCase& c = GetParam();
  auto out = RunOp(MakeNode(c.op, c.inputs.size(), 1, c.attrs), c.inputs, c.opset);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  ASSERT_EQ(out->size(), 1u);
  testing::ExpectTensorNear((*out)[0], c.expected, 1e-6, 1e-5);
}

std::string CaseName(const ::testing::TestParamInfo<ReduceCase>& info) { return info.param.name; }

// ---------------------------------------------------------------------------------------------
// Softmax family

std::vector<ReduceCase> SoftmaxCases() {
  const Tensor x = F32({2, 2, 3}, kLogits);
  return {
      // The same rank-3 input: opset 11 flattens to [2,6] at axis 1; opset 13 uses axis -1.
      {"Softmax11DefaultAxisFlattens",
       "Softmax",
       {x},
       F32({2, 2, 3}, SoftmaxRows(kLogits, 6)),
       {},
       11},
      {"Softmax13DefaultAxisIsLast",
       "Softmax",
       {x},
       F32({2, 2, 3}, SoftmaxRows(kLogits, 3)),
       {},
       13},
      {"Softmax11Axis2",
       "Softmax",
       {x},
       F32({2, 2, 3}, SoftmaxRows(kLogits, 3)),
       {{"axis", IntAttr(2)}},
       11},
      {"Softmax11Axis0IsWholeTensor",
       "Softmax",
       {x},
       F32({2, 2, 3}, SoftmaxRows(kLogits, 12)),
       {{"axis", IntAttr(0)}},
       11},
      {"Softmax13Axis1Strided",
       "Softmax",
       {F32({2, 3, 2}, kLogits)},
       F32({2, 3, 2}, SoftmaxAxis1Of232()),
       {{"axis", IntAttr(1)}},
       13},
      {"Softmax13NegativeAxis",
       "Softmax",
       {F32({2, 3, 2}, kLogits)},
       F32({2, 3, 2}, SoftmaxAxis1Of232()),
       {{"axis", IntAttr(-2)}},
       13},
      {"SoftmaxLargeLogitsStable",
       "Softmax",
       {F32({1, 3}, {1000, 1001, 1002})},
       F32({1, 3}, SoftmaxRows({0, 1, 2}, 3)),
       {},
       13},
      {"LogSoftmax13", "LogSoftmax", {x}, F32({2, 2, 3}, SoftmaxRows(kLogits, 3, true)), {}, 13},
      {"LogSoftmax11Flattens",
       "LogSoftmax",
       {x},
       F32({2, 2, 3}, SoftmaxRows(kLogits, 6, true)),
       {},
       11},
      {"LogSoftmaxLargeLogitsStable",
       "LogSoftmax",
       {F32({2}, {1000, 0})},
       F32({2}, {static_cast<float>(-std::log1p(std::exp(-1000.0))), -1000})},
  };
}
INSTANTIATE_TEST_SUITE_P(ReduceSoftmax, ReduceCases, ::testing::ValuesIn(SoftmaxCases()), CaseName);

// ---------------------------------------------------------------------------------------------
// Reductions over Iota232 (x[i][j][k] = 6i + 2j + k)

std::vector<ReduceCase> ReductionCases() {
  const Tensor x = Iota232();
  const Tensor axis1 = I64({1}, {1});
  return {
      // ReduceSum: axes attribute (opset 11) and axes input (opset 13) agree.
      {"Sum11AxesAttr",
       "ReduceSum",
       {x},
       F32({2, 1, 2}, {6, 9, 24, 27}),
       {{"axes", IntsAttr({1})}},
       11},
      {"Sum13AxesInput", "ReduceSum", {x, axis1}, F32({2, 1, 2}, {6, 9, 24, 27}), {}, 13},
      {"Sum13NoKeepdims",
       "ReduceSum",
       {x, axis1},
       F32({2, 2}, {6, 9, 24, 27}),
       {{"keepdims", IntAttr(0)}},
       13},
      {"Sum13NegativeAxis",
       "ReduceSum",
       {x, I64({1}, {-1})},
       F32({2, 3}, {1, 5, 9, 13, 17, 21}),
       {{"keepdims", IntAttr(0)}},
       13},
      {"Sum13TwoAxes",
       "ReduceSum",
       {x, I64({2}, {0, 2})},
       F32({3}, {14, 22, 30}),
       {{"keepdims", IntAttr(0)}},
       13},
      {"Sum13AxesInt32", "ReduceSum", {x, I32({2}, {2, 0})}, F32({1, 3, 1}, {14, 22, 30}), {}, 13},
      {"Sum13OmittedAxesReducesAll", "ReduceSum", {x}, F32({1, 1, 1}, {66}), {}, 13},
      {"Sum13EmptyAxesReducesAll",
       "ReduceSum",
       {x, I64({0}, {})},
       F32({}, {66}),
       {{"keepdims", IntAttr(0)}},
       13},
      {"Sum13NoopWithEmptyAxes",
       "ReduceSum",
       {x, Tensor()},
       x,
       {{"noop_with_empty_axes", IntAttr(1)}},
       13},
      {"Sum11NoAxesReducesAll", "ReduceSum", {x}, F32({}, {66}), {{"keepdims", IntAttr(0)}}, 11},
      {"SumInt64",
       "ReduceSum",
       {I64({2, 2}, {1, 2, 3, 4}), I64({1}, {0})},
       I64({1, 2}, {4, 6}),
       {},
       13},
      {"SumEmptyInputIsZero",
       "ReduceSum",
       {F32({2, 0}, {}), I64({1}, {1})},
       F32({2, 1}, {0, 0}),
       {},
       13},
      // ReduceMean: attribute until 17, input from 18.
      {"Mean17AxesAttr",
       "ReduceMean",
       {x},
       F32({2, 1, 2}, {2, 3, 8, 9}),
       {{"axes", IntsAttr({1})}},
       17},
      {"Mean18AxesInput", "ReduceMean", {x, axis1}, F32({2, 1, 2}, {2, 3, 8, 9}), {}, 18},
      {"Mean13NegativeAxesAttr",
       "ReduceMean",
       {x},
       F32({2, 3}, {0.5f, 2.5f, 4.5f, 6.5f, 8.5f, 10.5f}),
       {{"axes", IntsAttr({-1})}, {"keepdims", IntAttr(0)}},
       13},
      {"Mean18NoopWithEmptyAxes", "ReduceMean", {x}, x, {{"noop_with_empty_axes", IntAttr(1)}}, 18},
      {"MeanInt32Truncates", "ReduceMean", {I32({3}, {1, 2, 4})}, I32({1}, {2}), {}, 13},
      {"Max17",
       "ReduceMax",
       {x},
       F32({2, 3}, {1, 3, 5, 7, 9, 11}),
       {{"axes", IntsAttr({2})}, {"keepdims", IntAttr(0)}},
       17},
      {"Max18",
       "ReduceMax",
       {x, I64({1}, {2})},
       F32({2, 3}, {1, 3, 5, 7, 9, 11}),
       {{"keepdims", IntAttr(0)}},
       18},
      {"MaxPropagatesNaN", "ReduceMax", {F32({3}, {1, NAN, 2})}, F32({1}, {NAN})},
      {"MinAxis0",
       "ReduceMin",
       {x},
       F32({3, 2}, {0, 1, 2, 3, 4, 5}),
       {{"axes", IntsAttr({0})}, {"keepdims", IntAttr(0)}}},
      {"MinInt64",
       "ReduceMin",
       {I64({2, 2}, {5, -2, 3, 9})},
       I64({2, 1}, {-2, 3}),
       {{"axes", IntsAttr({1})}}},
      {"ProdAxis2",
       "ReduceProd",
       {x},
       F32({2, 3, 1}, {0, 6, 20, 42, 72, 110}),
       {{"axes", IntsAttr({2})}}},
      {"ProdInt64OfShape",
       "ReduceProd",
       {I64({4}, {1, 3, 224, 224})},
       I64({}, {150528}),
       {{"keepdims", IntAttr(0)}}},
      {"L2All",
       "ReduceL2",
       {x},
       F32({}, {static_cast<float>(std::sqrt(506.0))}),
       {{"keepdims", IntAttr(0)}}},
      {"L2Axis1",
       "ReduceL2",
       {F32({2, 2}, {3, 4, 6, 8})},
       F32({2, 1}, {5, 10}),
       {{"axes", IntsAttr({1})}}},
      {"L1Axis2",
       "ReduceL1",
       {F32({2, 2}, {-3, 4, 6, -8})},
       F32({2}, {7, 14}),
       {{"axes", IntsAttr({1})}, {"keepdims", IntAttr(0)}}},
      {"L1Int64At18", "ReduceL1", {I64({3}, {-1, 2, -3}), Tensor()}, I64({1}, {6}), {}, 18},
      {"SumSquare17",
       "ReduceSumSquare",
       {F32({2, 2}, {1, 2, 3, 4})},
       F32({1, 2}, {10, 20}),
       {{"axes", IntsAttr({0})}}},
      {"SumSquare18AxesInput",
       "ReduceSumSquare",
       {F32({2, 2}, {1, 2, 3, 4}), I64({1}, {0})},
       F32({1, 2}, {10, 20}),
       {},
       18},
      {"SumSquareInt32", "ReduceSumSquare", {I32({2}, {-3, 4})}, I32({1}, {25})},
      {"SumSquare18NoopWithEmptyAxes",
       "ReduceSumSquare",
       {x, I64({0}, {})},
       x,
       {{"noop_with_empty_axes", IntAttr(1)}},
       18},
      {"LogSum",
       "ReduceLogSum",
       {F32({2, 2}, {1, 2, 3, 4})},
       F32({2, 1}, {static_cast<float>(std::log(3.0)), static_cast<float>(std::log(7.0))}),
       {{"axes", IntsAttr({1})}}},
      {"LogSum18AllAxes",
       "ReduceLogSum",
       {F32({2, 2}, {1, 2, 3, 4})},
       F32({}, {static_cast<float>(std::log(10.0))}),
       {{"keepdims", IntAttr(0)}},
       18},
      {"LogSumExp",
       "ReduceLogSumExp",
       {F32({2, 2}, {0, 1, 2, -1})},
       F32({2}, {static_cast<float>(std::log(1 + std::exp(1.0))),
                 static_cast<float>(std::log(std::exp(2.0) + std::exp(-1.0)))}),
       {{"axes", IntsAttr({-1})}, {"keepdims", IntAttr(0)}}},
      // exp(1000) overflows even in double: the maximum is subtracted first.
      {"LogSumExpLargeStable",
       "ReduceLogSumExp",
       {F32({2}, {1000, 1000}), I64({1}, {0})},
       F32({1}, {static_cast<float>(1000 + std::log(2.0))}),
       {},
       18},
  };
}
INSTANTIATE_TEST_SUITE_P(ReduceOps, ReduceCases, ::testing::ValuesIn(ReductionCases()), CaseName);

// Summing 4M copies of 0.1f in float32 would drift by hundreds; the double accumulator stays
// within one float ulp of the exact sum.
TEST(ReduceAccuracy, SumAccumulatesInDouble) {
  const int64_t n = int64_t{1} << 22;
  const Tensor x = F32({n}, std::vector<float>(static_cast<size_t>(n), 0.1f));
  auto out = RunOp(MakeNode("ReduceSum", 1), {x}, 13);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  const double exact = static_cast<double>(n) * double{0.1f};
  EXPECT_NEAR((*out)[0].GetAsDouble(0), exact, 0.04);
}

// Reductions over an empty set give the identity (ExpectTensorNear cannot compare infinities).
TEST(ReduceEmpty, MaxIsMinusInfinityAndProdIsOne) {
  auto max = RunOp(MakeNode("ReduceMax", 1, 1, {{"axes", IntsAttr({1})}}), {F32({2, 0}, {})});
  ASSERT_TRUE(max.ok()) << max.status().ToString();
  ASSERT_EQ((*max)[0].shape(), (Shape{2, 1}));
  for (int64_t i = 0; i < 2; ++i) {
    EXPECT_EQ((*max)[0].data<float>()[i], -std::numeric_limits<float>::infinity());
  }
  auto prod = RunOp(MakeNode("ReduceProd", 1, 1, {{"axes", IntsAttr({0})}}), {I64({0, 2}, {})});
  ASSERT_TRUE(prod.ok()) << prod.status().ToString();
  testing::ExpectTensorNear((*prod)[0], I64({1, 2}, {1, 1}));
}

// ---------------------------------------------------------------------------------------------
// Ops along one axis: ArgMax, ArgMin, CumSum, Hardmax, LpNormalization, MVN

std::vector<ReduceCase> AxisCases() {
  // Row 0 ties at 5 (indices 1 and 2), row 1 at 7 (indices 0 and 2).
  const Tensor t = F32({2, 3}, {1, 5, 5, 7, 2, 7});
  const Tensor c = F32({2, 3}, {1, 2, 3, 4, 5, 6});
  const Tensor axis1 = I64({}, {1});
  return {
      {"ArgMaxFirstOfTies", "ArgMax", {t}, I64({2, 1}, {1, 0}), {{"axis", IntAttr(1)}}},
      {"ArgMaxSelectLastIndex",
       "ArgMax",
       {t},
       I64({2, 1}, {2, 2}),
       {{"axis", IntAttr(1)}, {"select_last_index", IntAttr(1)}}},
      {"ArgMinAxis0NoKeepdims", "ArgMin", {t}, I64({3}, {0, 1, 0}), {{"keepdims", IntAttr(0)}}},
      {"ArgMinInt64NegativeAxis",
       "ArgMin",
       {I64({2, 2}, {4, -3, 2, 2})},
       I64({2}, {1, 0}),
       {{"axis", IntAttr(-1)}, {"keepdims", IntAttr(0)}},
       11},
      // NaN is the extreme (numpy.argmax/argmin): the first NaN, the last with
      // select_last_index.
      {"ArgMaxTakesTheFirstNaN", "ArgMax", {F32({4}, {1, NAN, 3, NAN})}, I64({1}, {1})},
      {"ArgMinTakesTheFirstNaN", "ArgMin", {F32({3}, {1, -3, NAN})}, I64({1}, {2})},
      {"ArgMaxLastNaN",
       "ArgMax",
       {F32({4}, {1, NAN, 3, NAN})},
       I64({1}, {3}),
       {{"select_last_index", IntAttr(1)}}},
      {"CumSum", "CumSum", {c, axis1}, F32({2, 3}, {1, 3, 6, 4, 9, 15})},
      {"CumSumExclusive",
       "CumSum",
       {c, axis1},
       F32({2, 3}, {0, 1, 3, 0, 4, 9}),
       {{"exclusive", IntAttr(1)}}},
      {"CumSumReverse",
       "CumSum",
       {c, axis1},
       F32({2, 3}, {6, 5, 3, 15, 11, 6}),
       {{"reverse", IntAttr(1)}}},
      {"CumSumExclusiveReverse",
       "CumSum",
       {c, axis1},
       F32({2, 3}, {5, 3, 0, 11, 6, 0}),
       {{"exclusive", IntAttr(1)}, {"reverse", IntAttr(1)}}},
      {"CumSumAxis0Int32AxisInput", "CumSum", {c, I32({1}, {-2})}, F32({2, 3}, {1, 2, 3, 5, 7, 9})},
      {"CumSumInt64", "CumSum", {I64({3}, {5, -2, 7}), I64({}, {0})}, I64({3}, {5, 3, 10})},
      {"Hardmax13FirstOfTies",
       "Hardmax",
       {F32({2, 3}, {1, 3, 3, 0, -1, -2})},
       F32({2, 3}, {0, 1, 0, 1, 0, 0}),
       {},
       13},
      {"Hardmax13FirstNaN",
       "Hardmax",
       {F32({1, 3}, {5, NAN, NAN})},
       F32({1, 3}, {0, 1, 0}),
       {},
       13},
      // Opset 11 flattens [2,2,2] at axis 1 into rows of 4.
      {"Hardmax11Flattens",
       "Hardmax",
       {F32({2, 2, 2}, {1, 2, 3, 0, 5, 9, 9, 1})},
       F32({2, 2, 2}, {0, 0, 1, 0, 0, 1, 0, 0}),
       {},
       11},
      {"Hardmax13Axis1",
       "Hardmax",
       {F32({2, 2, 2}, {1, 2, 3, 0, 5, 9, 9, 1})},
       F32({2, 2, 2}, {0, 1, 1, 0, 0, 1, 1, 0}),
       {{"axis", IntAttr(1)}},
       13},
      {"LpNormalizationL2",
       "LpNormalization",
       {F32({2, 2}, {3, 4, 0, 0})},
       F32({2, 2}, {0.6f, 0.8f, 0, 0})},
      {"LpNormalizationL1Axis0",
       "LpNormalization",
       {F32({2, 2}, {1, 3, 3, -1})},
       F32({2, 2}, {0.25f, 0.75f, 0.75f, -0.25f}),
       {{"axis", IntAttr(0)}, {"p", IntAttr(1)}}},
      // Default axes [0,2,3]: channel 0 has mean 2 and std 1, channel 1 mean 4 and std 2.
      {"MeanVarianceNormalizationDefaultAxes",
       "MeanVarianceNormalization",
       {F32({1, 2, 1, 2}, {1, 3, 2, 6})},
       F32({1, 2, 1, 2}, {-1, 1, -1, 1})},
      {"MeanVarianceNormalizationLastAxis",
       "MeanVarianceNormalization",
       {F32({2, 2}, {0, 2, 1, 1})},
       F32({2, 2}, {-1, 1, 0, 0}),
       {{"axes", IntsAttr({-1})}}},
  };
}
INSTANTIATE_TEST_SUITE_P(ReduceAxisOps, ReduceCases, ::testing::ValuesIn(AxisCases()), CaseName);

// TopK has two outputs, checked here.
struct TopKCase {
  std::string name;
  std::vector<Tensor> inputs;
  Tensor values;
  Tensor indices;
  std::map<std::string, Attribute> attrs = {};
  int64_t opset = 11;
};

void PrintTo(const TopKCase& c, std::ostream* os) { *os << c.name; }

class TopKCases : public ::testing::TestWithParam<TopKCase> {};

TEST_P(TopKCases, MatchesExpected) {
  const TopKCase& c = GetParam();
  auto out = RunOp(MakeNode("TopK", c.inputs.size(), 2, c.attrs), c.inputs, c.opset);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  ASSERT_EQ(out->size(), 2u);
  testing::ExpectTensorNear((*out)[0], c.values);
  testing::ExpectTensorNear((*out)[1], c.indices);
}

std::vector<TopKCase> TopKCaseList() {
  // Row 0 ties at 4 (indices 1, 2), row 1 at 9 (indices 0, 3).
  const Tensor x = F32({2, 4}, {1, 4, 4, 2, 9, 0, -1, 9});
  return {
      {"LargestTiesLowerIndexFirst",
       {x, I64({1}, {2})},
       F32({2, 2}, {4, 4, 9, 9}),
       I64({2, 2}, {1, 2, 0, 3})},
      {"Smallest",
       {x, I64({1}, {3})},
       F32({2, 3}, {1, 2, 4, -1, 0, 9}),
       I64({2, 3}, {0, 3, 1, 2, 1, 0}),
       {{"largest", IntAttr(0)}}},
      {"Axis0",
       {x, I64({1}, {1})},
       F32({1, 4}, {9, 4, 4, 9}),
       I64({1, 4}, {1, 0, 0, 1}),
       {{"axis", IntAttr(0)}}},
      {"Opset1KAttribute", {x}, F32({2, 1}, {4, 9}), I64({2, 1}, {1, 0}), {{"k", IntAttr(1)}}, 1},
      {"Opset10KInput", {x, I64({1}, {1})}, F32({2, 1}, {4, 9}), I64({2, 1}, {1, 0}), {}, 10},
      {"Int64", {I64({4}, {3, 8, -1, 8}), I64({1}, {3})}, I64({3}, {8, 8, 3}), I64({3}, {1, 3, 0})},
      {"KZero", {x, I64({1}, {0})}, F32({2, 0}, {}), I64({2, 0}, {})},
  };
}
INSTANTIATE_TEST_SUITE_P(TopK, TopKCases, ::testing::ValuesIn(TopKCaseList()),
                         [](const ::testing::TestParamInfo<TopKCase>& info) {
                           return info.param.name;
                         });

TEST(TopKErrors, KOutOfRangeNamesKAndShape) {
  auto out = RunOp(MakeNode("TopK", 2, 2), {F32({2, 3}, {1, 2, 3, 4, 5, 6}), I64({1}, {4})}, 11);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(out.status().message().find("TopK 'n0': k=4"), std::string::npos)
      << out.status().message();
  EXPECT_NE(out.status().message().find("[2,3]"), std::string::npos) << out.status().message();
}

TEST(TopKErrors, LargestNotAFlag) {
  auto out = RunOp(MakeNode("TopK", 2, 2, {{"largest", IntAttr(2)}}),
                   {F32({3}, {1, 2, 3}), I64({1}, {1})}, 11);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("'largest'=2"), std::string::npos)
      << out.status().message();
}

TEST(TopKErrors, KAttributeAtOpset11) {
  auto out =
      RunOp(MakeNode("TopK", 2, 2, {{"k", IntAttr(1)}}), {F32({3}, {1, 2, 3}), I64({1}, {1})}, 11);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("'k'"), std::string::npos) << out.status().message();
}

TEST(TopKErrors, OneOutput) {
  auto out = RunOp(MakeNode("TopK", 2, 1), {F32({3}, {1, 2, 3}), I64({1}, {1})}, 11);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("expected 2"), std::string::npos) << out.status().message();
}

TEST(ReduceRegistry, FormsSplitByOpset) {
  const OpRegistry& r = OpRegistry::Global();
  struct Split {
    const char* op;
    int64_t first_new;
  };
  for (const Split s : {Split{"Softmax", 13}, Split{"LogSoftmax", 13}, Split{"ReduceSum", 13},
                        Split{"ReduceMean", 18}, Split{"ReduceMax", 18}, Split{"ReduceMin", 18},
                        Split{"ReduceProd", 18}, Split{"ReduceL2", 18}, Split{"ReduceL1", 18},
                        Split{"ReduceSumSquare", 18}, Split{"ReduceLogSum", 18},
                        Split{"ReduceLogSumExp", 18}, Split{"Hardmax", 13}}) {
    auto old_form = r.Find("", s.op, s.first_new - 1);
    auto new_form = r.Find("", s.op, s.first_new);
    ASSERT_TRUE(old_form.ok() && new_form.ok()) << s.op;
    EXPECT_EQ((*old_form)->since_version, 1) << s.op;
    EXPECT_EQ((*old_form)->until_version, s.first_new - 1) << s.op;
    EXPECT_EQ((*new_form)->since_version, s.first_new) << s.op;
    EXPECT_EQ((*new_form)->until_version, INT64_MAX) << s.op;
  }
}

// ---------------------------------------------------------------------------------------------
// Errors

struct ReduceErrorCase {
  std::string name;
  std::string op;
  std::vector<Tensor> inputs;
  StatusCode code;
  std::vector<std::string> fragments;  // each must appear in the message
  std::map<std::string, Attribute> attrs = {};
  int64_t opset = 17;
};

void PrintTo(const ReduceErrorCase& c, std::ostream* os) { *os << c.name; }

class ReduceErrors : public ::testing::TestWithParam<ReduceErrorCase> {};

TEST_P(ReduceErrors, FailsWithMessage) {
  const ReduceErrorCase& c = GetParam();
  auto out = RunOp(MakeNode(c.op, c.inputs.size(), 1, c.attrs), c.inputs, c.opset);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), c.code) << out.status().ToString();
  for (const std::string& f : c.fragments) {
    EXPECT_NE(out.status().message().find(f), std::string::npos)
        << "missing '" << f << "' in: " << out.status().message();
  }
}

std::vector<ReduceErrorCase> ErrorCases() {
  const Tensor x = Iota232();
  return {
      {"DuplicateAxesInput",
       "ReduceSum",
       {x, I64({2}, {1, -2})},
       StatusCode::kInvalidArgument,
       {"ReduceSum 'n0'", "[1,-2]", "more than once"},
       {},
       13},
      {"DuplicateAxesAttr",
       "ReduceMean",
       {x},
       StatusCode::kInvalidArgument,
       {"ReduceMean 'n0'", "[0,0]", "more than once"},
       {{"axes", IntsAttr({0, 0})}}},
      {"AxisOutOfRange",
       "ReduceMax",
       {x},
       StatusCode::kInvalidArgument,
       {"ReduceMax 'n0'", "axis 3", "rank 3"},
       {{"axes", IntsAttr({3})}}},
      {"AxesAttrAtOpset13",
       "ReduceSum",
       {x},
       StatusCode::kInvalidArgument,
       {"ReduceSum 'n0'", "'axes'", "input 1"},
       {{"axes", IntsAttr({1})}},
       13},
      {"AxesInputAtOpset11",
       "ReduceSum",
       {x, I64({1}, {1})},
       StatusCode::kInvalidArgument,
       {"ReduceSum 'n0'", "2 inputs"},
       {},
       11},
      {"AxesInputFloat",
       "ReduceSum",
       {x, F32({1}, {1})},
       StatusCode::kInvalidArgument,
       {"ReduceSum 'n0'", "axes", "float32[1]"},
       {},
       13},
      {"L2Int64Unsupported",
       "ReduceL2",
       {I64({2}, {3, 4})},
       StatusCode::kUnimplemented,
       {"ReduceL2 'n0'", "int64"}},
      {"SumInt8Unsupported",
       "ReduceSum",
       {Tensor::FromVector<int8_t>({1}, {1})},
       StatusCode::kUnimplemented,
       {"ReduceSum 'n0'", "int8"},
       {},
       13},
      {"SoftmaxInt64Unsupported",
       "Softmax",
       {I64({2}, {1, 2})},
       StatusCode::kUnimplemented,
       {"Softmax 'n0'", "int64"}},
      {"SoftmaxAxisOutOfRange",
       "Softmax",
       {x},
       StatusCode::kInvalidArgument,
       {"Softmax 'n0'", "'axis'", "axis 3"},
       {{"axis", IntAttr(3)}}},
      {"ArgMaxSelectLastIndexNotAFlag",
       "ArgMax",
       {x},
       StatusCode::kInvalidArgument,
       {"ArgMax 'n0'", "'select_last_index'=2", "0 or 1"},
       {{"select_last_index", IntAttr(2)}}},
      {"ArgMinKeepdimsNotAFlag",
       "ArgMin",
       {x},
       StatusCode::kInvalidArgument,
       {"ArgMin 'n0'", "'keepdims'=5"},
       {{"keepdims", IntAttr(5)}}},
      {"ArgMaxAxisOutOfRange",
       "ArgMax",
       {x},
       StatusCode::kInvalidArgument,
       {"ArgMax 'n0'", "'axis'", "axis 3"},
       {{"axis", IntAttr(3)}}},
      {"CumSumExclusiveNotAFlag",
       "CumSum",
       {x, I64({}, {0})},
       StatusCode::kInvalidArgument,
       {"CumSum 'n0'", "'exclusive'=3"},
       {{"exclusive", IntAttr(3)}}},
      {"CumSumAxisFloat",
       "CumSum",
       {x, F32({}, {0})},
       StatusCode::kInvalidArgument,
       {"CumSum 'n0'", "'axis'", "float32[]"}},
      {"LpNormalizationP3",
       "LpNormalization",
       {x},
       StatusCode::kInvalidArgument,
       {"LpNormalization 'n0'", "'p'=3", "1 or 2"},
       {{"p", IntAttr(3)}}},
      {"MvnDuplicateAxes",
       "MeanVarianceNormalization",
       {x},
       StatusCode::kInvalidArgument,
       {"MeanVarianceNormalization 'n0'", "'axes'", "more than once"},
       {{"axes", IntsAttr({1, -2})}}},
      {"HardmaxInt64Unsupported",
       "Hardmax",
       {I64({2}, {1, 2})},
       StatusCode::kUnimplemented,
       {"Hardmax 'n0'", "int64"}},
      {"LogSumInt64Unsupported",
       "ReduceLogSum",
       {I64({2}, {1, 2})},
       StatusCode::kUnimplemented,
       {"ReduceLogSum 'n0'", "int64", "float32"}},
      {"KeepdimsNotInt",
       "ReduceSum",
       {x},
       StatusCode::kInvalidArgument,
       {"ReduceSum 'n0'", "'keepdims'"},
       {{"keepdims", IntsAttr({1})}},
       13},
  };
}
INSTANTIATE_TEST_SUITE_P(ReduceErrorCases, ReduceErrors, ::testing::ValuesIn(ErrorCases()),
                         [](const ::testing::TestParamInfo<ReduceErrorCase>& info) {
                           return info.param.name;
                         });

// float64: reductions, CumSum and ArgMax run in double end to end.
TEST(ReduceFloat64, ReductionsCumSumAndArgMax) {
  const double third = 1.0 / 3.0;
  const Tensor x = Tensor::FromVector<double>({2, 3}, {third, 1e300, -1.0, 0.5, 0.25, 1000.0});
  auto sum = RunOp(MakeNode("ReduceSum", 2, 1, {{"keepdims", IntAttr(0)}}), {x, I64({1}, {1})}, 13);
  ASSERT_TRUE(sum.ok()) << sum.status().ToString();
  ASSERT_EQ((*sum)[0].dtype(), DType::kFloat64);
  EXPECT_EQ((*sum)[0].data<double>()[0], third + 1e300 - 1.0);
  EXPECT_EQ((*sum)[0].data<double>()[1], 1000.75);

  auto lse = RunOp(MakeNode("ReduceLogSumExp", 1, 1, {{"axes", IntsAttr({1})}}), {x}, 13);
  ASSERT_TRUE(lse.ok()) << lse.status().ToString();
  EXPECT_EQ((*lse)[0].shape(), (Shape{2, 1}));
  EXPECT_EQ((*lse)[0].data<double>()[0], 1e300);  // no overflow: the maximum is taken out first
  EXPECT_NEAR((*lse)[0].data<double>()[1], 1000.0, 1e-12);

  auto mx = RunOp(MakeNode("ReduceMax", 1, 1, {{"keepdims", IntAttr(0)}}), {x}, 13);
  ASSERT_TRUE(mx.ok()) << mx.status().ToString();
  EXPECT_EQ((*mx)[0].data<double>()[0], 1e300);

  auto cum = RunOp(MakeNode("CumSum", 2), {x, I64({}, {1})});
  ASSERT_TRUE(cum.ok()) << cum.status().ToString();
  ASSERT_EQ((*cum)[0].dtype(), DType::kFloat64);
  EXPECT_EQ((*cum)[0].data<double>()[0], third);
  EXPECT_EQ((*cum)[0].data<double>()[4], 0.75);
  EXPECT_EQ((*cum)[0].data<double>()[5], 1000.75);

  auto arg = RunOp(MakeNode("ArgMax", 1, 1, {{"axis", IntAttr(1)}}), {x});
  ASSERT_TRUE(arg.ok()) << arg.status().ToString();
  EXPECT_EQ((*arg)[0].ToInt64Vector(), (std::vector<int64_t>{1, 2}));
}

}  // namespace
}  // namespace kiln
