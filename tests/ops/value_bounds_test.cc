// Shape functions and kernels fed values no tensor could have (ops layer): every size an op
// computes from a value (Tile repeats, Reshape dims, Range bounds, OneHot depth, Resize scales, Pad
// pads, Concat lengths) is computed checked and refused `request_too_large` by node instead of
// wrapping, and the data-movement kernels do no work proportional to the dims of an empty tensor
// (a [0, 2^32] tensor holds nothing, so building a 2^32-entry index table for it would be the
// attack). The same values at the request level: tests/worker/hostile_values_e2e_test.cc.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <limits>

#include "tests/ops/op_test_util.h"

namespace kiln {
namespace {

using testing::F32;
using testing::FloatAttr;
using testing::I64;
using testing::IntAttr;
using testing::MakeNode;
using testing::RunOp;
using testing::StringAttr;

constexpr int64_t k2p62 = int64_t{1} << 62;
constexpr int64_t k2p32 = int64_t{1} << 32;
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

void ExpectTooLarge(const Result<std::vector<Tensor>>& r, const std::string& names) {
  ASSERT_FALSE(r.ok()) << "expected a refusal";
  EXPECT_TRUE(r.status().Is(kRefusalRequestTooLarge)) << r.status().ToString();
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
  EXPECT_NE(r.status().message().find(names), std::string::npos)
      << names << " not in " << r.status().ToString();
}

TEST(ValueBounds, ShapeArithmeticIsCheckedByNode) {
  ExpectTooLarge(RunOp(MakeNode("Tile", 2), {F32({4}, {1, 2, 3, 4}), I64({1}, {k2p62})}),
                 "Tile 'n0'");
  ExpectTooLarge(
      RunOp(MakeNode("Reshape", 2), {F32({4}, {1, 2, 3, 4}), I64({2}, {3037000500, 3037000500})}),
      "Reshape 'n0'");
  ExpectTooLarge(RunOp(MakeNode("Reshape", 2), {F32({4}, {1, 2, 3, 4}), I64({3}, {-1, k2p62, 4})}),
                 "Reshape 'n0'");
  ExpectTooLarge(RunOp(MakeNode("Pad", 2), {F32({2}, {1, 2}), I64({2}, {kMax, kMax})}), "Pad 'n0'");
  // Two empty inputs whose concatenated axis does not fit.
  const Tensor longest = Tensor::Empty(DType::kFloat32, {0, kMax}).value();
  const Tensor one = Tensor::Empty(DType::kFloat32, {0, 1}).value();
  ExpectTooLarge(RunOp(MakeNode("Concat", 2, 1, {{"axis", IntAttr(1)}}), {longest, one}),
                 "Concat 'n0'");
  const Tensor wide = Tensor::Empty(DType::kFloat32, {0, k2p62, 4}).value();
  ExpectTooLarge(RunOp(MakeNode("Flatten", 1, 1, {{"axis", IntAttr(1)}}), {wide}), "Flatten 'n0'");
  auto flat = RunOp(MakeNode("Flatten", 1, 1, {{"axis", IntAttr(2)}}), {wide});
  ASSERT_TRUE(flat.ok()) << flat.status().ToString();
  EXPECT_EQ((*flat)[0].shape(), (Shape{0, 4}));
}

TEST(ValueBounds, FloatValuesPastInt64AreRefusedNotConverted) {
  // Converting 1e30 or inf to int64 is undefined; each is refused before it is converted.
  ExpectTooLarge(
      RunOp(MakeNode("Range", 3),
            {Tensor::Scalar<float>(0), Tensor::Scalar<float>(1e30f), Tensor::Scalar<float>(1)}),
      "Range 'n0'");
  auto none =
      RunOp(MakeNode("Range", 3),
            {Tensor::Scalar<float>(0), Tensor::Scalar<float>(-INFINITY), Tensor::Scalar<float>(1)});
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_EQ((*none)[0].numel(), 0);
  ExpectTooLarge(
      RunOp(MakeNode("OneHot", 3), {I64({2}, {0, 1}), F32({1}, {1e30f}), F32({2}, {0, 1})}),
      "OneHot 'n0'");
  ExpectTooLarge(RunOp(MakeNode("Resize", 3, 1, {{"mode", StringAttr("nearest")}}),
                       {F32({1, 1, 2, 2}, {1, 2, 3, 4}), Tensor(), F32({4}, {1, 1, 1e30f, 1})}),
                 "Resize 'n0'");
  ExpectTooLarge(RunOp(MakeNode("Upsample", 2, 1, {{"mode", StringAttr("nearest")}}),
                       {F32({1, 2}, {1, 2}), F32({2}, {1, INFINITY})}, 9),
                 "Upsample 'n0'");
  // Range over int64: the span start..limit is counted unsigned and the values computed without
  // signed overflow, so the extremes give exact elements, not a wrapped count.
  auto ends = RunOp(MakeNode("Range", 3),
                    {Tensor::Scalar<int64_t>(kMax), Tensor::Scalar<int64_t>(-kMax - 1),
                     Tensor::Scalar<int64_t>(-kMax - 1)});
  ASSERT_TRUE(ends.ok()) << ends.status().ToString();
  testing::ExpectTensorNear((*ends)[0], I64({2}, {kMax, -1}), 0, 0);
  auto quarters =
      RunOp(MakeNode("Range", 3), {Tensor::Scalar<int64_t>(-kMax - 1),
                                   Tensor::Scalar<int64_t>(kMax), Tensor::Scalar<int64_t>(k2p62)});
  ASSERT_TRUE(quarters.ok()) << quarters.status().ToString();
  EXPECT_EQ((*quarters)[0].numel(), 4);
  EXPECT_EQ((*quarters)[0].data<int64_t>()[3], k2p62);
}

// An empty tensor may carry dims of 2^32 (the KServe reader admits them, and ConstantOfShape makes
// them for free): no kernel may build per-axis tables as long as such a dim.
TEST(ValueBounds, EmptyTensorsWithHugeDimsCostNothing) {
  const auto start = std::chrono::steady_clock::now();
  const Tensor e = Tensor::Empty(DType::kFloat32, {0, k2p32}).value();
  struct Case {
    const char* name;
    Node node;
    std::vector<Tensor> inputs;
    int64_t opset = 17;
  };
  const std::vector<Case> cases = {
      {"Transpose", MakeNode("Transpose", 1), {e}},
      {"Expand", MakeNode("Expand", 2), {e, I64({2}, {1, 1})}},
      {"Tile", MakeNode("Tile", 2), {e, I64({2}, {3, 1})}},
      {"Pad", MakeNode("Pad", 2), {e, I64({4}, {0, 1, 0, 1})}},
      {"Slice", MakeNode("Slice", 3), {e, I64({1}, {1}), I64({1}, {k2p32})}},
      {"Resize",
       MakeNode("Resize", 3, 1, {{"mode", StringAttr("linear")}}),
       {e, Tensor(), F32({2}, {1, 2})}},
  };
  for (const Case& c : cases) {
    auto r = RunOp(c.node, c.inputs, c.opset);
    ASSERT_TRUE(r.ok()) << c.name << ": " << r.status().ToString();
    EXPECT_EQ((*r)[0].numel(), 0) << c.name;
  }
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(ms, 5000) << "empty tensors took work proportional to their dims";
}

// Separable Resize passes commute; the ones that shrink run first, so [1, n] -> [n, 1] never holds
// an n x n buffer. Here n = 2^13: the other order would hold 512 MiB of doubles at once.
TEST(ValueBounds, ResizeNeverHoldsMoreThanItsInputOrOutput) {
  constexpr int64_t n = 1 << 13;
  rusage before{};
  ::getrusage(RUSAGE_SELF, &before);
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<float>(i % 7);
  auto r = RunOp(MakeNode("Resize", 3, 1, {{"mode", StringAttr("linear")}}),
                 {F32({1, n}, v), Tensor(), F32({2}, {static_cast<float>(n), 1.0f / n})});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)[0].shape(), (Shape{n, 1}));
  for (int64_t i = 0; i < n; ++i) ASSERT_TRUE(std::isfinite((*r)[0].data<float>()[i]));
  rusage after{};
  ::getrusage(RUSAGE_SELF, &after);
  EXPECT_LT(after.ru_maxrss - before.ru_maxrss, 128 * 1024) << "peak RSS grew (kB)";
}

}  // namespace
}  // namespace kiln
