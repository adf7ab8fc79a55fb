// Tests for the nn op family (ops/matmul.cc, conv.cc, pool.cc, norm.cc) and its oneDNN wrappers
// (ops/dnnl_kernels.h).
//
// Each op has a table of named cases run by RunCases, which pushes the node through the registry
// exactly as the interpreter does. Conv and MatMul are compared against naive loops written
// here; pools and norms against values worked out by hand in the comments. Error tests check the
// status code and a fragment of the message.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "src/kiln/ops/dnnl_kernels.h"
#include "tests/ops/op_test_util.h"

namespace kiln {
namespace {

using testing::F32;
using testing::FloatAttr;
using testing::IntAttr;
using testing::IntsAttr;
using testing::MakeNode;
using testing::RunOp;
using testing::StringAttr;

struct OpCase {
  std::string name;
  std::string op;
  std::map<std::string, Attribute> attrs;
  std::vector<Tensor> inputs;  // an invalid Tensor() marks an omitted optional input
  std::vector<Tensor> expected;
  int64_t opset = 17;
  double atol = 1e-4;
};

void RunCases(const std::vector<OpCase>& cases) {
  for (const OpCase& c : cases) {
    SCOPED_TRACE(c.name);
    auto out =
        RunOp(MakeNode(c.op, c.inputs.size(), c.expected.size(), c.attrs), c.inputs, c.opset);
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    ASSERT_EQ(out->size(), c.expected.size());
    for (size_t i = 0; i < c.expected.size(); ++i) {
      SCOPED_TRACE("output " + std::to_string(i));
      testing::ExpectTensorNear((*out)[i], c.expected[i], c.atol, 1e-4);
    }
  }
}

void ExpectError(const Node& node, const std::vector<Tensor>& inputs, StatusCode code,
                 const std::string& fragment, int64_t opset = 17) {
  auto out = RunOp(node, inputs, opset);
  ASSERT_FALSE(out.ok()) << "expected an error containing '" << fragment << "'";
  EXPECT_EQ(out.status().code(), code) << out.status().ToString();
  EXPECT_NE(out.status().message().find(fragment), std::string::npos)
      << out.status().ToString() << "\n  expected fragment: " << fragment;
}

// Deterministic values in [-1, 1).
Tensor Rand(Shape shape, uint32_t seed) {
  std::vector<float> v(static_cast<size_t>(NumElements(shape)));
  uint32_t s = seed * 2654435761u + 12345u;
  for (float& x : v) {
    s = s * 1664525u + 1013904223u;
    x = static_cast<float>(s >> 8) / static_cast<float>(1 << 23) - 1.0f;
  }
  return F32(std::move(shape), v);
}

Tensor Seq(Shape shape, float start = 1) {
  std::vector<float> v(static_cast<size_t>(NumElements(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = start + static_cast<float>(i);
  return F32(std::move(shape), v);
}

// ---------------------------------------------------------------------------------------------
// References.

// Batched matmul over rank >= 2 operands with numpy batch broadcasting, by the definition.
Tensor RefMatMul(const Tensor& a, const Tensor& b) {
  const int64_t ra = a.rank(), rb = b.rank();
  const int64_t M = a.dim(ra - 2), K = a.dim(ra - 1), N = b.dim(rb - 1);
  const Shape ab(a.shape().begin(), a.shape().end() - 2),
      bb(b.shape().begin(), b.shape().end() - 2);
  const Shape batch = *BroadcastShapes(ab, bb);
  const auto as = BroadcastStrides(ab, batch), bs = BroadcastStrides(bb, batch);
  Shape out_shape = batch;
  out_shape.push_back(M);
  out_shape.push_back(N);
  std::vector<float> out(static_cast<size_t>(NumElements(out_shape)));
  const int64_t batches = NumElements(batch);
  const auto os = ContiguousStrides(batch);
  for (int64_t i = 0; i < batches; ++i) {
    int64_t ai = 0, bi = 0;
    for (size_t d = 0; d < batch.size(); ++d) {
      const int64_t idx = (i / os[d]) % batch[d];
      ai += idx * as[d];
      bi += idx * bs[d];
    }
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t n = 0; n < N; ++n) {
        double acc = 0;
        for (int64_t k = 0; k < K; ++k) {
          acc += a.data<float>()[(ai * M + m) * K + k] * b.data<float>()[(bi * K + k) * N + n];
        }
        out[static_cast<size_t>((i * M + m) * N + n)] = static_cast<float>(acc);
      }
    }
  }
  return F32(out_shape, out);
}

struct RefConvArgs {
  std::vector<int64_t> strides{1, 1};
  std::vector<int64_t> pads{0, 0, 0, 0};  // t, l, b, r
  std::vector<int64_t> dilations{1, 1};
  int64_t group = 1;
};

// Direct 2-D convolution by the definition, x [N,C,H,W], w [K,C/g,R,S], bias [K] or invalid.
Tensor RefConv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const RefConvArgs& a) {
  const int64_t N = x.dim(0), C = x.dim(1), H = x.dim(2), W = x.dim(3);
  const int64_t K = w.dim(0), Cg = w.dim(1), R = w.dim(2), S = w.dim(3);
  const int64_t OH =
      (H + a.pads[0] + a.pads[2] - ((R - 1) * a.dilations[0] + 1)) / a.strides[0] + 1;
  const int64_t OW =
      (W + a.pads[1] + a.pads[3] - ((S - 1) * a.dilations[1] + 1)) / a.strides[1] + 1;
  const int64_t Kg = K / a.group;
  std::vector<float> y(static_cast<size_t>(N * K * OH * OW));
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t k = 0; k < K; ++k) {
      const int64_t g = k / Kg;
      for (int64_t oh = 0; oh < OH; ++oh) {
        for (int64_t ow = 0; ow < OW; ++ow) {
          double acc = bias.valid() ? bias.data<float>()[k] : 0.0;
          for (int64_t c = 0; c < Cg; ++c) {
            for (int64_t r = 0; r < R; ++r) {
              for (int64_t s = 0; s < S; ++s) {
                const int64_t ih = oh * a.strides[0] - a.pads[0] + r * a.dilations[0];
                const int64_t iw = ow * a.strides[1] - a.pads[1] + s * a.dilations[1];
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                acc += x.data<float>()[((n * C + g * Cg + c) * H + ih) * W + iw] *
                       w.data<float>()[((k * Cg + c) * R + r) * S + s];
              }
            }
          }
          y[static_cast<size_t>(((n * K + k) * OH + oh) * OW + ow)] = static_cast<float>(acc);
        }
      }
    }
  }
  return F32({N, K, OH, OW}, y);
}

// A 1-D convolution as a 2-D one over a height-1 image; pads are {begin, end}.
Tensor RefConv1d(const Tensor& x, const Tensor& w, const Tensor& bias, int64_t stride,
                 std::vector<int64_t> pads, int64_t dilation, int64_t group = 1) {
  Tensor x4 = *x.Reshaped({x.dim(0), x.dim(1), 1, x.dim(2)});
  Tensor w4 = *w.Reshaped({w.dim(0), w.dim(1), 1, w.dim(2)});
  RefConvArgs a;
  a.strides = {1, stride};
  a.pads = {0, pads[0], 0, pads[1]};
  a.dilations = {1, dilation};
  a.group = group;
  Tensor y = RefConv2d(x4, w4, bias, a);
  return *y.Reshaped({y.dim(0), y.dim(1), y.dim(3)});
}

// ---------------------------------------------------------------------------------------------
// MatMul

TEST(NnMatMul, Cases) {
  const Tensor a23 = F32({2, 3}, {1, 2, 3, 4, 5, 6});
  const Tensor b32 = F32({3, 2}, {7, 8, 9, 10, 11, 12});
  const Tensor batched_a = Rand({2, 1, 3, 4}, 1), batched_b = Rand({5, 4, 2}, 2);
  const Tensor big_a = Rand({3, 7, 16}, 3), big_b = Rand({16, 9}, 4);
  RunCases({
      // [[1*7+2*9+3*11, 1*8+2*10+3*12], [4*7+5*9+6*11, 4*8+5*10+6*12]]
      {"2d", "MatMul", {}, {a23, b32}, {F32({2, 2}, {58, 64, 139, 154})}},
      {"batched_broadcast_2x1x3x4_by_5x4x2",
       "MatMul",
       {},
       {batched_a, batched_b},
       {RefMatMul(batched_a, batched_b)}},
      {"batched_a_shared_b", "MatMul", {}, {big_a, big_b}, {RefMatMul(big_a, big_b)}},
      // 1-D A is a row vector [1,3] and the 1 is dropped: [1,1,1] x b32 = column sums.
      {"1d_a", "MatMul", {}, {F32({3}, {1, 1, 1}), b32}, {F32({2}, {27, 30})}},
      // 1-D B is a column vector [3,1] and the 1 is dropped: row sums of a23.
      {"1d_b", "MatMul", {}, {a23, F32({3}, {1, 1, 1})}, {F32({2}, {6, 15})}},
      {"1d_both_is_dot", "MatMul", {}, {F32({3}, {1, 2, 3}), F32({3}, {4, 5, 6})}, {F32({}, {32})}},
      // 1-D A against batched B: [2,3,2] -> [2,2].
      {"1d_a_batched_b",
       "MatMul",
       {},
       {F32({3}, {1, 0, -1}), Seq({2, 3, 2})},
       {F32({2, 2}, {-4, -4, -4, -4})}},
      {"empty_k",
       "MatMul",
       {},
       {F32({2, 0}, {}), F32({0, 3}, {})},
       {F32({2, 3}, {0, 0, 0, 0, 0, 0})}},
  });
}

TEST(NnMatMul, InnerDimsMismatchNamesBothShapes) {
  ExpectError(MakeNode("MatMul", 2), {Rand({2, 3}, 1), Rand({4, 5}, 2)},
              StatusCode::kInvalidArgument, "MatMul 'n0': inner dims differ: A [2,3] has K=3");
  ExpectError(MakeNode("MatMul", 2), {Rand({2, 3}, 1), Rand({4, 5}, 2)},
              StatusCode::kInvalidArgument, "B [4,5] has K=4");
}

TEST(NnMatMul, BatchDimsMustBroadcast) {
  ExpectError(MakeNode("MatMul", 2), {Rand({2, 3, 4}, 1), Rand({3, 4, 5}, 2)},
              StatusCode::kInvalidArgument, "batch dims of A [2,3,4] and B [3,4,5]");
}

TEST(NnMatMul, IntegerDTypeIsUnimplemented) {
  ExpectError(MakeNode("MatMul", 2), {testing::I64({1, 1}, {1}), testing::I64({1, 1}, {2})},
              StatusCode::kUnimplemented, "dtype int64 is not supported");
}

// ---------------------------------------------------------------------------------------------
// Gemm

TEST(NnGemm, Cases) {
  const Tensor a = F32({2, 3}, {1, 2, 3, 4, 5, 6});
  const Tensor at = F32({3, 2}, {1, 4, 2, 5, 3, 6});  // a transposed
  const Tensor b = F32({3, 2}, {7, 8, 9, 10, 11, 12});
  const Tensor bt = F32({2, 3}, {7, 9, 11, 8, 10, 12});  // b transposed
  const Tensor ab = F32({2, 2}, {58, 64, 139, 154});
  RunCases({
      {"plain_no_c", "Gemm", {}, {a, b}, {ab}},
      {"transA", "Gemm", {{"transA", IntAttr(1)}}, {at, b}, {ab}},
      {"transB", "Gemm", {{"transB", IntAttr(1)}}, {a, bt}, {ab}},
      {"transA_transB", "Gemm", {{"transA", IntAttr(1)}, {"transB", IntAttr(1)}}, {at, bt}, {ab}},
      // 0.5 * ab + 2 * [[1,2],[3,4]]
      {"alpha_beta_full_c",
       "Gemm",
       {{"alpha", FloatAttr(0.5f)}, {"beta", FloatAttr(2.0f)}},
       {a, b, F32({2, 2}, {1, 2, 3, 4})},
       {F32({2, 2}, {31, 36, 75.5f, 85})}},
      // C [2] broadcasts along rows: ab + [10, 20]
      {"c_row_broadcast",
       "Gemm",
       {},
       {a, b, F32({2}, {10, 20})},
       {F32({2, 2}, {68, 84, 149, 174})}},
      // C [2,1] broadcasts along columns: ab + [[1],[2]]
      {"c_column_broadcast",
       "Gemm",
       {},
       {a, b, F32({2, 1}, {1, 2})},
       {F32({2, 2}, {59, 65, 141, 156})}},
      {"c_scalar",
       "Gemm",
       {{"beta", FloatAttr(-1.0f)}},
       {a, b, F32({}, {8})},
       {F32({2, 2}, {50, 56, 131, 146})}},
      // beta = 0 ignores C entirely, even a NaN in it.
      {"beta_zero_ignores_c", "Gemm", {{"beta", FloatAttr(0.0f)}}, {a, b, F32({1}, {NAN})}, {ab}},
  });
  // Opset 6: C required, legacy `broadcast` attribute accepted.
  RunCases({{"legacy_broadcast_attr",
             "Gemm",
             {{"broadcast", IntAttr(1)}},
             {a, b, F32({2}, {10, 20})},
             {F32({2, 2}, {68, 84, 149, 174})},
             6}});
}

TEST(NnGemm, Errors) {
  ExpectError(MakeNode("Gemm", 2), {Rand({2, 3}, 1), Rand({2, 3}, 2)}, StatusCode::kInvalidArgument,
              "inner dims differ: A [2,3] (transA=0) has K=3");
  ExpectError(MakeNode("Gemm", 3), {Rand({2, 3}, 1), Rand({3, 4}, 2), Rand({3}, 3)},
              StatusCode::kInvalidArgument, "C [3] does not broadcast to [M,N]=[2,4]");
  ExpectError(MakeNode("Gemm", 2), {Rand({2, 3}, 1), Rand({3, 4}, 2)}, StatusCode::kInvalidArgument,
              "has 2 inputs, expected 3", /*opset=*/9);
}

// ---------------------------------------------------------------------------------------------
// Conv

TEST(NnConv, AgainstDirectConvolution) {
  std::vector<OpCase> cases;
  {
    const Tensor x = Rand({1, 3, 7, 7}, 10), w = Rand({4, 3, 3, 3}, 11), b = Rand({4}, 12);
    RefConvArgs a;
    a.strides = {2, 2};
    a.pads = {1, 1, 1, 1};
    cases.push_back({"stride2_pad1_bias",
                     "Conv",
                     {{"strides", IntsAttr({2, 2})}, {"pads", IntsAttr({1, 1, 1, 1})}},
                     {x, w, b},
                     {RefConv2d(x, w, b, a)}});
  }
  {
    const Tensor x = Rand({2, 2, 5, 6}, 20), w = Rand({3, 2, 3, 2}, 21);
    RefConvArgs a;
    a.pads = {0, 1, 2, 0};  // ONNX order is [top, left, bottom, right]
    cases.push_back({"asymmetric_pads_no_bias",
                     "Conv",
                     {{"pads", IntsAttr({0, 1, 2, 0})}},
                     {x, w},
                     {RefConv2d(x, w, Tensor(), a)}});
  }
  {
    const Tensor x = Rand({1, 2, 9, 9}, 30), w = Rand({2, 2, 3, 3}, 31), b = Rand({2}, 32);
    RefConvArgs a;
    a.dilations = {2, 2};
    a.pads = {2, 2, 2, 2};
    cases.push_back({"dilation2",
                     "Conv",
                     {{"dilations", IntsAttr({2, 2})}, {"pads", IntsAttr({2, 2, 2, 2})}},
                     {x, w, b},
                     {RefConv2d(x, w, b, a)}});
  }
  {
    const Tensor x = Rand({2, 4, 6, 6}, 40), w = Rand({6, 2, 3, 3}, 41), b = Rand({6}, 42);
    RefConvArgs a;
    a.group = 2;
    a.pads = {1, 1, 1, 1};
    cases.push_back({"group2",
                     "Conv",
                     {{"group", IntAttr(2)}, {"pads", IntsAttr({1, 1, 1, 1})}},
                     {x, w, b},
                     {RefConv2d(x, w, b, a)}});
  }
  {
    const Tensor x = Rand({1, 8, 6, 5}, 50), w = Rand({8, 1, 3, 3}, 51), b = Rand({8}, 52);
    RefConvArgs a;
    a.group = 8;
    a.strides = {2, 1};
    a.pads = {1, 1, 1, 1};
    cases.push_back({"depthwise",
                     "Conv",
                     {{"group", IntAttr(8)},
                      {"strides", IntsAttr({2, 1})},
                      {"pads", IntsAttr({1, 1, 1, 1})},
                      {"kernel_shape", IntsAttr({3, 3})}},
                     {x, w, b},
                     {RefConv2d(x, w, b, a)}});
  }
  {
    // H: out = ceil(6/2) = 3, total pad = 2*2 + 3 - 6 = 1 -> top 0, bottom 1.
    // W: out = ceil(7/2) = 4, total pad = 3*2 + 3 - 7 = 2 -> left 1, right 1.
    const Tensor x = Rand({1, 2, 6, 7}, 60), w = Rand({3, 2, 3, 3}, 61);
    RefConvArgs a;
    a.strides = {2, 2};
    a.pads = {0, 1, 1, 1};
    cases.push_back({"auto_pad_same_upper",
                     "Conv",
                     {{"auto_pad", StringAttr("SAME_UPPER")}, {"strides", IntsAttr({2, 2})}},
                     {x, w},
                     {RefConv2d(x, w, Tensor(), a)}});
    // SAME_LOWER puts the odd pad at the beginning: top 1, bottom 0.
    a.pads = {1, 1, 0, 1};
    cases.push_back({"auto_pad_same_lower",
                     "Conv",
                     {{"auto_pad", StringAttr("SAME_LOWER")}, {"strides", IntsAttr({2, 2})}},
                     {x, w},
                     {RefConv2d(x, w, Tensor(), a)}});
    a.pads = {0, 0, 0, 0};
    cases.push_back({"auto_pad_valid",
                     "Conv",
                     {{"auto_pad", StringAttr("VALID")}, {"strides", IntsAttr({2, 2})}},
                     {x, w},
                     {RefConv2d(x, w, Tensor(), a)}});
  }
  {
    const Tensor x = Rand({2, 8, 5, 5}, 70), w = Rand({16, 8, 1, 1}, 71), b = Rand({16}, 72);
    cases.push_back({"pointwise_1x1", "Conv", {}, {x, w, b}, {RefConv2d(x, w, b, {})}});
  }
  {
    const Tensor x = Rand({2, 3, 10}, 80), w = Rand({4, 3, 3}, 81), b = Rand({4}, 82);
    cases.push_back(
        {"conv1d_stride2_pads_dilation2",
         "Conv",
         {{"strides", IntsAttr({2})}, {"pads", IntsAttr({1, 2})}, {"dilations", IntsAttr({2})}},
         {x, w, b},
         {RefConv1d(x, w, b, 2, {1, 2}, 2)}});
  }
  {
    const Tensor x = Rand({1, 4, 9}, 90), w = Rand({4, 1, 5}, 91);
    // 1-D SAME_UPPER, stride 1: total pad 4 -> 2, 2.
    cases.push_back({"conv1d_depthwise_same_upper",
                     "Conv",
                     {{"group", IntAttr(4)}, {"auto_pad", StringAttr("SAME_UPPER")}},
                     {x, w},
                     {RefConv1d(x, w, Tensor(), 1, {2, 2}, 1, 4)}});
  }
  RunCases(cases);
  // Second run of the same geometries: served from the primitive cache, same answers.
  RunCases(cases);
}

TEST(NnConv, Errors) {
  ExpectError(MakeNode("Conv", 2, 1, {{"group", IntAttr(3)}}),
              {Rand({1, 64, 4, 4}, 1), Rand({6, 21, 1, 1}, 2)}, StatusCode::kInvalidArgument,
              "Conv 'n0': group=3 does not divide 64 input channels");
  ExpectError(MakeNode("Conv", 2, 1, {{"group", IntAttr(2)}}),
              {Rand({1, 4, 4, 4}, 1), Rand({3, 2, 1, 1}, 2)}, StatusCode::kInvalidArgument,
              "group=2 does not divide 3 output channels");
  ExpectError(MakeNode("Conv", 2, 1, {{"group", IntAttr(2)}}),
              {Rand({1, 4, 4, 4}, 1), Rand({4, 4, 1, 1}, 2)}, StatusCode::kInvalidArgument,
              "W [4,4,1,1] has 4 input channels per group, expected 2");
  ExpectError(MakeNode("Conv", 3), {Rand({1, 2, 4, 4}, 1), Rand({3, 2, 1, 1}, 2), Rand({2}, 3)},
              StatusCode::kInvalidArgument, "input 2 ('B') has shape [2], expected [3]");
  ExpectError(MakeNode("Conv", 2, 1, {{"kernel_shape", IntsAttr({3, 3})}}),
              {Rand({1, 2, 4, 4}, 1), Rand({3, 2, 1, 1}, 2)}, StatusCode::kInvalidArgument,
              "kernel_shape=[3,3] does not match the weights' spatial dims [1,1]");
  ExpectError(MakeNode("Conv", 2, 1, {{"auto_pad", StringAttr("SAME")}}),
              {Rand({1, 2, 4, 4}, 1), Rand({3, 2, 1, 1}, 2)}, StatusCode::kInvalidArgument,
              "auto_pad='SAME' is not one of");
  ExpectError(MakeNode("Conv", 2, 1, {{"strides", IntsAttr({1, 0})}}),
              {Rand({1, 2, 4, 4}, 1), Rand({3, 2, 1, 1}, 2)}, StatusCode::kInvalidArgument,
              "strides=[1,0] has value 0, expected >= 1");
  ExpectError(MakeNode("Conv", 2), {Rand({1, 2, 2, 2}, 1), Rand({3, 2, 3, 3}, 2)},
              StatusCode::kInvalidArgument, "dilated kernel extent 3 exceeds padded input 2");
  ExpectError(MakeNode("Conv", 2), {Rand({1, 2, 2, 2, 2, 2}, 1), Rand({3, 2, 1, 1, 1, 1}, 2)},
              StatusCode::kUnimplemented, "4-D convolution (X rank 6) is not supported");
}

// 3-D convolution (oneDNN's 3-D primitive) against a direct loop: groups, strides, pads,
// dilation and bias over NCDHW.
TEST(NnConv, ThreeDimensionalMatchesADirectLoop) {
  const Shape xs = {2, 4, 5, 6, 7}, ws = {6, 2, 3, 2, 3};
  const Tensor x = Rand(xs, 11), w = Rand(ws, 12), b = Rand({6}, 13);
  Node n = MakeNode("Conv", 3, 1,
                    {{"group", IntAttr(2)},
                     {"strides", IntsAttr({2, 1, 2})},
                     {"pads", IntsAttr({1, 0, 1, 0, 1, 1})},
                     {"dilations", IntsAttr({1, 2, 1})}});
  auto out = RunOp(n, {x, w, b});
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  const Tensor& y = (*out)[0];
  const int64_t od = (5 + 1 + 0 - 3) / 2 + 1, oh = (6 + 0 + 1 - 3) / 1 + 1,
                ow = (7 + 1 + 1 - 3) / 2 + 1;
  ASSERT_EQ(y.shape(), (Shape{2, 6, od, oh, ow}));
  const float* px = x.data<float>();
  const float* pw = w.data<float>();
  for (int64_t ni = 0; ni < 2; ++ni) {
    for (int64_t k = 0; k < 6; ++k) {
      const int64_t g = k / 3;
      for (int64_t d = 0; d < od; ++d) {
        for (int64_t h = 0; h < oh; ++h) {
          for (int64_t q = 0; q < ow; ++q) {
            double acc = b.data<float>()[k];
            for (int64_t c = 0; c < 2; ++c) {
              for (int64_t t = 0; t < 3; ++t) {
                for (int64_t r = 0; r < 2; ++r) {
                  for (int64_t s = 0; s < 3; ++s) {
                    const int64_t id = d * 2 - 1 + t, ih = h + r * 2, iw = q * 2 - 1 + s;
                    if (id < 0 || id >= 5 || ih < 0 || ih >= 6 || iw < 0 || iw >= 7) continue;
                    acc += px[(((ni * 4 + g * 2 + c) * 5 + id) * 6 + ih) * 7 + iw] *
                           pw[(((k * 2 + c) * 3 + t) * 2 + r) * 3 + s];
                  }
                }
              }
            }
            ASSERT_NEAR(y.data<float>()[(((ni * 6 + k) * od + d) * oh + h) * ow + q], acc, 1e-4);
          }
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// ConvTranspose. Expected values are the ONNX node cases' (test_convtranspose_*) and, for
// groups, bias, 3-D and cropping pads, PyTorch's conv_transpose worked on the same inputs.

TEST(NnConvTranspose, Cases) {
  const Tensor x = F32({1, 1, 3, 3}, {0, 1, 2, 3, 4, 5, 6, 7, 8});
  const Tensor w = F32({1, 2, 3, 3}, std::vector<float>(18, 1.0f));
  const std::vector<float> plane = {0,  1,  3, 3,  2,  3,  8,  15, 12, 7,  9,  21, 36,
                                    27, 15, 9, 20, 33, 24, 13, 6,  13, 21, 15, 8};
  std::vector<float> two_planes = plane;
  two_planes.insert(two_planes.end(), plane.begin(), plane.end());
  // test_convtranspose_output_shape / _pad / _kernel_shape share one [1, 2, 10, 8] result.
  const std::vector<float> rows[] = {{0, 0, 1, 1, 3, 2, 2, 0},
                                     {3, 3, 7, 4, 9, 5, 5, 0},
                                     {6, 6, 13, 7, 15, 8, 8, 0},
                                     {0, 0, 0, 0, 0, 0, 0, 0}};
  std::vector<float> strided;
  for (int c = 0; c < 2; ++c) {
    for (int r = 0; r < 10; ++r) {
      const auto& row = rows[r == 9 ? 3 : r / 3];
      strided.insert(strided.end(), row.begin(), row.end());
    }
  }
  const Tensor strided_out = F32({1, 2, 10, 8}, strided);
  const std::vector<float> same_plane = {0, 0, 1,  1,  3,  2,  0, 0, 1,  1, 3,  2,
                                         3, 3, 8,  5,  12, 7,  3, 3, 7,  4, 9,  5,
                                         9, 9, 20, 11, 24, 13, 6, 6, 13, 7, 15, 8};
  std::vector<float> same = same_plane;
  same.insert(same.end(), same_plane.begin(), same_plane.end());
  const std::vector<float> pads_plane = {1, 1, 3, 1, 1,  3, 7,  4,  9, 7, 4,
                                         9, 7, 4, 9, 13, 7, 15, 13, 7, 15};
  std::vector<float> pads = pads_plane;
  pads.insert(pads.end(), pads_plane.begin(), pads_plane.end());
  // Groups of one channel each, stride 2, a bias per output channel (PyTorch).
  const Tensor gx = F32({1, 2, 2, 2}, {-3, -2, -1, 0, 1, 2, 3, 4});
  const Tensor gw = F32({2, 1, 2, 2}, {0, 0.5f, 1, 1.5f, 2, 2.5f, 3, 3.5f});
  const Tensor gb = F32({2}, {1, -1});
  RunCases({
      {"default", "ConvTranspose", {}, {x, w}, {F32({1, 2, 5, 5}, two_planes)}},
      {"1d",
       "ConvTranspose",
       {},
       {F32({1, 1, 3}, {0, 1, 2}), F32({1, 2, 3}, {1, 1, 1, 1, 1, 1})},
       {F32({1, 2, 5}, {0, 1, 3, 3, 2, 0, 1, 3, 3, 2})}},
      {"output_shape",
       "ConvTranspose",
       {{"strides", IntsAttr({3, 2})}, {"output_shape", IntsAttr({10, 8})}},
       {x, w},
       {strided_out}},
      {"output_padding",
       "ConvTranspose",
       {{"strides", IntsAttr({3, 2})}, {"output_padding", IntsAttr({1, 1})}},
       {x, w},
       {strided_out}},
      {"kernel_shape_output_shape_and_padding",
       "ConvTranspose",
       {{"strides", IntsAttr({3, 2})},
        {"output_shape", IntsAttr({10, 8})},
        {"kernel_shape", IntsAttr({3, 3})},
        {"output_padding", IntsAttr({1, 1})}},
       {x, w},
       {strided_out}},
      {"pads",
       "ConvTranspose",
       {{"strides", IntsAttr({3, 2})}, {"pads", IntsAttr({1, 2, 1, 2})}},
       {x, w},
       {F32({1, 2, 7, 3}, pads)}},
      {"dilations",
       "ConvTranspose",
       {{"dilations", IntsAttr({2, 2})}},
       {F32({1, 1, 3, 3}, {3, 8, 1, 9, 5, 7, 3, 2, 6}), F32({1, 1, 2, 2}, {7, 2, 1, 9})},
       {F32({1, 1, 5, 5}, {21, 56, 13, 16, 2,  63, 35, 67, 10, 14, 24, 22, 76,
                           76, 21, 9,  5,  88, 45, 63, 3,  2,  33, 18, 54})}},
      {"autopad_same_upper",
       "ConvTranspose",
       {{"auto_pad", StringAttr("SAME_UPPER")}, {"strides", IntsAttr({2, 2})}},
       {x, w},
       {F32({1, 2, 6, 6}, same)}},
      {"group2_bias_stride2",
       "ConvTranspose",
       {{"group", IntAttr(2)}, {"strides", IntsAttr({2, 2})}},
       {gx, gw, gb},
       {F32({1, 2, 4, 4}, {1, -0.5f, 1, 0, -2, -3.5f, -1, -2, 1, 0.5f, 1, 1, 0, -0.5f, 1,  1,
                           1, 1.5f,  3, 4, 2,  2.5f,  5,  6,  5, 6.5f, 7, 9, 8, 9.5f,  11, 13})}},
      {"group2_bias_stride2_pads1",
       "ConvTranspose",
       {{"group", IntAttr(2)}, {"strides", IntsAttr({2, 2})}, {"pads", IntsAttr({1, 1, 1, 1})}},
       {gx, gw, gb},
       {F32({1, 2, 2, 2}, {-3.5f, -1, 0.5f, 1, 2.5f, 5, 6.5f, 7})}},
      {"3d",
       "ConvTranspose",
       {},
       {F32({1, 1, 2, 2, 2}, {0, 1, 2, 3, 4, 5, 6, 7}),
        F32({1, 1, 2, 2, 2}, std::vector<float>(8, 1))},
       {F32({1, 1, 3, 3, 3}, {0,  1, 1,  2,  6, 4, 2, 5,  3,  4,  10, 6,  12, 28,
                              16, 8, 18, 10, 4, 9, 5, 10, 22, 12, 6,  13, 7})}},
  });
}

// The transposed convolution as its definition: every input element scattered through every
// kernel tap, written here as a plain loop over 3-D (1-D and 2-D lifted with unit axes).
struct ConvTransposeCase {
  Shape x, w;
  std::vector<int64_t> strides, dilations, pads, output_padding;
  int64_t group = 1;
};

Tensor DirectConvTranspose(const ConvTransposeCase& c, const Tensor& x, const Tensor& w,
                           const Tensor& b) {
  const size_t r = c.x.size() - 2, lift = 3 - r;
  std::array<int64_t, 3> in{1, 1, 1}, k{1, 1, 1}, s{1, 1, 1}, d{1, 1, 1}, pb{0, 0, 0}, out{1, 1, 1};
  Shape out_shape = {c.x[0], c.w[1] * c.group};
  for (size_t i = 0; i < r; ++i) {
    in[lift + i] = c.x[2 + i];
    k[lift + i] = c.w[2 + i];
    s[lift + i] = c.strides[i];
    d[lift + i] = c.dilations[i];
    pb[lift + i] = c.pads[i];
    out[lift + i] = c.strides[i] * (c.x[2 + i] - 1) + c.output_padding[i] +
                    (c.w[2 + i] - 1) * c.dilations[i] + 1 - c.pads[i] - c.pads[i + r];
    out_shape.push_back(out[lift + i]);
  }
  const int64_t C = c.x[1], Mg = c.w[1], Cg = C / c.group, M = Mg * c.group;
  std::vector<double> y(static_cast<size_t>(NumElements(out_shape)));
  const int64_t out_plane = out[0] * out[1] * out[2], in_plane = in[0] * in[1] * in[2];
  for (int64_t n = 0; n < c.x[0]; ++n) {
    for (int64_t m = 0; m < M; ++m) {
      const int64_t grp = m / Mg;
      for (int64_t p = 0; p < out_plane; ++p) y[(n * M + m) * out_plane + p] = b.data<float>()[m];
      for (int64_t cg = 0; cg < Cg; ++cg) {
        const int64_t ch = grp * Cg + cg;
        for (int64_t i = 0; i < in_plane; ++i) {
          const int64_t i0 = i / (in[1] * in[2]), i1 = i / in[2] % in[1], i2 = i % in[2];
          for (int64_t t = 0; t < k[0] * k[1] * k[2]; ++t) {
            const int64_t k0 = t / (k[1] * k[2]), k1 = t / k[2] % k[1], k2 = t % k[2];
            const int64_t o0 = i0 * s[0] + k0 * d[0] - pb[0], o1 = i1 * s[1] + k1 * d[1] - pb[1],
                          o2 = i2 * s[2] + k2 * d[2] - pb[2];
            if (o0 < 0 || o0 >= out[0] || o1 < 0 || o1 >= out[1] || o2 < 0 || o2 >= out[2]) {
              continue;
            }
            y[(n * M + m) * out_plane + (o0 * out[1] + o1) * out[2] + o2] +=
                static_cast<double>(x.data<float>()[(n * C + ch) * in_plane + i]) *
                w.data<float>()[((ch * Mg) + m % Mg) * k[0] * k[1] * k[2] + t];
          }
        }
      }
    }
  }
  return F32(out_shape, std::vector<float>(y.begin(), y.end()));
}

TEST(NnConvTranspose, AgainstDirectLoop) {
  const ConvTransposeCase cases[] = {
      {{2, 4, 5, 6}, {4, 3, 3, 2}, {2, 3}, {2, 1}, {1, 0, 2, 1}, {1, 0}, 2},
      {{1, 2, 3, 4, 5}, {2, 2, 2, 3, 2}, {1, 2, 2}, {1, 1, 2}, {0, 1, 0, 0, 0, 1}, {0, 1, 1}, 1},
      {{1, 6, 7}, {6, 1, 4}, {3}, {1}, {2, 0}, {2}, 3},
      {{1, 16, 9, 9}, {16, 8, 4, 4}, {2, 2}, {1, 1}, {1, 1, 1, 1}, {0, 0}, 1},
      // 512 * 8 * 8 column rows: the GEMM runs over chunks that start mid-row.
      {{1, 1, 20, 20}, {1, 512, 8, 8}, {1, 1}, {1, 1}, {0, 0, 0, 0}, {0, 0}, 1},
  };
  uint32_t seed = 10;
  for (const ConvTransposeCase& c : cases) {
    SCOPED_TRACE("x " + ShapeToString(c.x) + " w " + ShapeToString(c.w));
    const Tensor x = Rand(c.x, seed++), w = Rand(c.w, seed++);
    const Tensor b = Rand({c.w[1] * c.group}, seed++);
    std::map<std::string, Attribute> attrs = {{"strides", IntsAttr(c.strides)},
                                              {"dilations", IntsAttr(c.dilations)},
                                              {"pads", IntsAttr(c.pads)},
                                              {"output_padding", IntsAttr(c.output_padding)},
                                              {"group", IntAttr(c.group)}};
    auto out = RunOp(MakeNode("ConvTranspose", 3, 1, attrs), {x, w, b});
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    testing::ExpectTensorNear((*out)[0], DirectConvTranspose(c, x, w, b), 1e-4, 1e-4);
  }
}

TEST(NnConvTranspose, Errors) {
  const Tensor x = Rand({1, 2, 3, 3}, 1);
  const Tensor w = Rand({2, 3, 2, 2}, 2);
  ExpectError(MakeNode("ConvTranspose", 2, 1, {{"output_padding", IntsAttr({2, 0})}}), {x, w},
              StatusCode::kInvalidArgument,
              "ConvTranspose 'n0': output_padding=[2,0] has value 2 on spatial axis 0, expected "
              "less than the stride 1 or the dilation 1");
  ExpectError(MakeNode("ConvTranspose", 2, 1, {{"output_padding", IntsAttr({-1, 0})}}), {x, w},
              StatusCode::kInvalidArgument, "output_padding=[-1,0] has value -1, expected >= 0");
  ExpectError(MakeNode("ConvTranspose", 2, 1, {{"auto_pad", StringAttr("SAME")}}), {x, w},
              StatusCode::kInvalidArgument, "auto_pad='SAME' is not one of");
  ExpectError(MakeNode("ConvTranspose", 2, 1, {{"group", IntAttr(0)}}), {x, w},
              StatusCode::kInvalidArgument, "group=0 must be >= 1");
  ExpectError(MakeNode("ConvTranspose", 2, 1, {{"group", IntAttr(3)}}), {x, w},
              StatusCode::kInvalidArgument, "group=3 does not divide 2 input channels");
  ExpectError(MakeNode("ConvTranspose", 2), {x, Rand({3, 3, 2, 2}, 2)},
              StatusCode::kInvalidArgument, "W [3,3,2,2] has 3 input channels, X [1,2,3,3] has 2");
  ExpectError(MakeNode("ConvTranspose", 3), {x, w, Rand({2}, 3)}, StatusCode::kInvalidArgument,
              "input 2 ('B') has shape [2], expected [3]");
  ExpectError(MakeNode("ConvTranspose", 2, 1, {{"pads", IntsAttr({3, 3, 3, 3})}}), {x, w},
              StatusCode::kInvalidArgument, "pads=[3,3,3,3] remove more than the full output");
  ExpectError(MakeNode("ConvTranspose", 2, 1, {{"output_shape", IntsAttr({4})}}), {x, w},
              StatusCode::kInvalidArgument, "output_shape=[4] has 1 values, expected 2");
}

// ---------------------------------------------------------------------------------------------
// Pools

TEST(NnPool, Cases) {
  const Tensor x3x3 = Seq({1, 1, 3, 3});  // [[1,2,3],[4,5,6],[7,8,9]]
  RunCases({
      {"maxpool_2x2_stride2",
       "MaxPool",
       {{"kernel_shape", IntsAttr({2, 2})}, {"strides", IntsAttr({2, 2})}},
       {Seq({1, 1, 4, 4})},
       {F32({1, 1, 2, 2}, {6, 8, 14, 16})}},
      // 5x5 = 1..25, rows/cols windows [0,1], [2,3], [4]: the max is at the last row/col of each.
      {"maxpool_ceil_mode",
       "MaxPool",
       {{"kernel_shape", IntsAttr({2, 2})},
        {"strides", IntsAttr({2, 2})},
        {"ceil_mode", IntAttr(1)}},
       {Seq({1, 1, 5, 5})},
       {F32({1, 1, 3, 3}, {7, 9, 10, 17, 19, 20, 22, 24, 25})}},
      {"maxpool_floor_mode",
       "MaxPool",
       {{"kernel_shape", IntsAttr({2, 2})}, {"strides", IntsAttr({2, 2})}},
       {Seq({1, 1, 5, 5})},
       {F32({1, 1, 2, 2}, {7, 9, 17, 19})}},
      // ceil would give 4 windows, but the 4th would start in the end padding and is dropped.
      {"maxpool_1d_ceil_drops_window_in_padding",
       "MaxPool",
       {{"kernel_shape", IntsAttr({2})},
        {"strides", IntsAttr({2})},
        {"pads", IntsAttr({1, 1})},
        {"ceil_mode", IntAttr(1)}},
       {Seq({1, 1, 5})},
       {F32({1, 1, 3}, {1, 3, 5})}},
      {"maxpool_pads_ignore_padding",
       "MaxPool",
       {{"kernel_shape", IntsAttr({3, 3})}, {"pads", IntsAttr({1, 1, 1, 1})}},
       {F32({1, 1, 2, 2}, {-1, -2, -3, -4})},
       {F32({1, 1, 2, 2}, {-1, -1, -1, -1})}},
      // Dilation 2 over 1..5: windows {1,3}, {2,4}, {3,5}.
      {"maxpool_dilation",
       "MaxPool",
       {{"kernel_shape", IntsAttr({2})}, {"dilations", IntsAttr({2})}},
       {F32({1, 1, 5}, {5, 1, 2, 4, 3})},
       {F32({1, 1, 3}, {5, 4, 3})}},
      {"maxpool_same_upper",
       "MaxPool",
       {{"kernel_shape", IntsAttr({2, 2})}, {"auto_pad", StringAttr("SAME_UPPER")}},
       {x3x3},
       {F32({1, 1, 3, 3}, {5, 6, 6, 8, 9, 9, 8, 9, 9})}},
      // 3x3 window, pads 1: sums are 12 21 16 / 27 45 33 / 24 39 28; taps inside the input are
      // 4 at corners, 6 on edges, 9 in the centre.
      {"avgpool_exclude_pad",
       "AveragePool",
       {{"kernel_shape", IntsAttr({3, 3})}, {"pads", IntsAttr({1, 1, 1, 1})}},
       {x3x3},
       {F32({1, 1, 3, 3}, {3, 3.5f, 4, 4.5f, 5, 5.5f, 6, 6.5f, 7})}},
      {"avgpool_count_include_pad",
       "AveragePool",
       {{"kernel_shape", IntsAttr({3, 3})},
        {"pads", IntsAttr({1, 1, 1, 1})},
        {"count_include_pad", IntAttr(1)}},
       {x3x3},
       {F32({1, 1, 3, 3},
            {12 / 9.f, 21 / 9.f, 16 / 9.f, 27 / 9.f, 5, 33 / 9.f, 24 / 9.f, 39 / 9.f, 28 / 9.f})}},
      // Windows [1,2], [3,4], [5]; the last overhangs the input, and the overhang never counts.
      {"avgpool_ceil_mode",
       "AveragePool",
       {{"kernel_shape", IntsAttr({2})}, {"strides", IntsAttr({2})}, {"ceil_mode", IntAttr(1)}},
       {Seq({1, 1, 5})},
       {F32({1, 1, 3}, {1.5f, 3.5f, 5})}},
      {"avgpool_ceil_mode_count_include_pad",
       "AveragePool",
       {{"kernel_shape", IntsAttr({2})},
        {"strides", IntsAttr({2})},
        {"ceil_mode", IntAttr(1)},
        {"count_include_pad", IntAttr(1)}},
       {Seq({1, 1, 5})},
       {F32({1, 1, 3}, {1.5f, 3.5f, 5})}},
      // Pad 1 at the start counts: windows [pad,1], [2,3], [4,5] -> 0.5, 2.5, 4.5.
      {"avgpool_1d_pad_count_include_pad",
       "AveragePool",
       {{"kernel_shape", IntsAttr({2})},
        {"strides", IntsAttr({2})},
        {"pads", IntsAttr({1, 0})},
        {"count_include_pad", IntAttr(1)}},
       {Seq({1, 1, 5})},
       {F32({1, 1, 3}, {0.5f, 2.5f, 4.5f})}},
      {"avgpool_3d",
       "AveragePool",
       {{"kernel_shape", IntsAttr({2, 2, 2})}},
       {Seq({1, 1, 2, 2, 2})},
       {F32({1, 1, 1, 1, 1}, {4.5f})}},
      {"global_average",
       "GlobalAveragePool",
       {},
       {Seq({1, 2, 2, 2})},
       {F32({1, 2, 1, 1}, {2.5f, 6.5f})}},
      {"global_max",
       "GlobalMaxPool",
       {},
       {F32({2, 1, 3}, {1, 7, 3, -4, -2, -9})},
       {F32({2, 1, 1}, {7, -2})}},
  });
}

// MaxPool's Indices output: where each maximum sits in X flattened (N*C planes, then the
// position inside the plane, row major or with storage_order=1 column major), and the dtypes
// MaxPool takes besides float32.
TEST(NnPool, MaxPoolIndicesAndDtypes) {
  using testing::I64;
  // Plane 0 is [[3,1,2],[9,0,4],[5,8,7]], plane 1 its negation; 2x2 windows, stride 1.
  // Plane 0: maxima 9 at (1,0), 4 at (1,2), 9 at (1,0), 8 at (2,1): row-major 3 5 3 7, column
  // major (h + 3w) 1 7 1 5. Plane 1: 0 at (1,1) everywhere, 9 + 4 = 13 either way.
  const Tensor x =
      F32({1, 2, 3, 3}, {3, 1, 2, 9, 0, 4, 5, 8, 7, -3, -1, -2, -9, 0, -4, -5, -8, -7});
  const Tensor y = F32({1, 2, 2, 2}, {9, 4, 9, 8, 0, 0, 0, 0});
  const Attribute k22 = IntsAttr({2, 2});
  // 2x2x2 window over [1,1,2,2,2]: the max 20 sits at (d,h,w) = (0,1,1), row major 0*4+1*2+1 = 3,
  // column major 0 + 1*2 + 1*4 = 6.
  const Tensor x3 = F32({1, 1, 2, 2, 2}, {1, 2, 3, 20, 5, 6, 7, 8});
  auto f16 = [](Shape s, std::vector<float> v) { return *F32(s, v).CastTo(DType::kFloat16); };
  const float nan = std::nanf("");
  RunCases({
      {"row_major",
       "MaxPool",
       {{"kernel_shape", k22}},
       {x},
       {y, I64({1, 2, 2, 2}, {3, 5, 3, 7, 13, 13, 13, 13})}},
      {"column_major",
       "MaxPool",
       {{"kernel_shape", k22}, {"storage_order", IntAttr(1)}},
       {x},
       {y, I64({1, 2, 2, 2}, {1, 7, 1, 5, 13, 13, 13, 13})}},
      {"3d_row_major",
       "MaxPool",
       {{"kernel_shape", IntsAttr({2, 2, 2})}},
       {x3},
       {F32({1, 1, 1, 1, 1}, {20}), I64({1, 1, 1, 1, 1}, {3})}},
      {"3d_column_major",
       "MaxPool",
       {{"kernel_shape", IntsAttr({2, 2, 2})}, {"storage_order", IntAttr(1)}},
       {x3},
       {F32({1, 1, 1, 1, 1}, {20}), I64({1, 1, 1, 1, 1}, {6})}},
      // Ties go to the first tap in window order.
      {"ties_first_tap",
       "MaxPool",
       {{"kernel_shape", IntsAttr({2})}},
       {F32({1, 1, 4}, {2, 2, 5, 5})},
       {F32({1, 1, 3}, {2, 5, 5}), I64({1, 1, 3}, {0, 2, 2})}},
      // Padding is never pointed at, even where every tap in the input is negative.
      {"padding_never_pointed_at",
       "MaxPool",
       {{"kernel_shape", IntsAttr({3})}, {"pads", IntsAttr({1, 1})}},
       {F32({1, 1, 3}, {-1, -2, -3})},
       {F32({1, 1, 3}, {-1, -1, -2}), I64({1, 1, 3}, {0, 0, 1})}},
      // NaN propagates; Indices points at the window's first NaN.
      {"nan_first",
       "MaxPool",
       {{"kernel_shape", IntsAttr({2})}},
       {F32({1, 1, 4}, {1, nan, 3, nan})},
       {F32({1, 1, 3}, {nan, nan, nan}), I64({1, 1, 3}, {1, 1, 3})}},
      {"int8",
       "MaxPool",
       {{"kernel_shape", IntsAttr({2})}, {"strides", IntsAttr({2})}},
       {Tensor::FromVector<int8_t>({1, 1, 4}, {-128, -5, 127, 3})},
       {Tensor::FromVector<int8_t>({1, 1, 2}, {-5, 127}), I64({1, 1, 2}, {1, 2})}},
      {"uint8",
       "MaxPool",
       {{"kernel_shape", IntsAttr({2})}, {"strides", IntsAttr({2})}},
       {Tensor::FromVector<uint8_t>({1, 1, 4}, {0, 255, 200, 201})},
       {Tensor::FromVector<uint8_t>({1, 1, 2}, {255, 201}), I64({1, 1, 2}, {1, 3})}},
      {"uint8_pads_without_indices",
       "MaxPool",
       {{"kernel_shape", IntsAttr({3})}, {"pads", IntsAttr({1, 1})}},
       {Tensor::FromVector<uint8_t>({1, 1, 3}, {7, 0, 9})},
       {Tensor::FromVector<uint8_t>({1, 1, 3}, {7, 9, 9})}},
      {"float16",
       "MaxPool",
       {{"kernel_shape", IntsAttr({2})}, {"strides", IntsAttr({2})}},
       {f16({1, 1, 4}, {0.5f, 1.5f, -2, -1})},
       {f16({1, 1, 2}, {1.5f, -1}), I64({1, 1, 2}, {1, 3})}},
      {"float64",
       "MaxPool",
       {{"kernel_shape", IntsAttr({2})}, {"strides", IntsAttr({2})}},
       {Tensor::FromVector<double>({1, 1, 4}, {0.1, 0.3, 0.2, 0.25})},
       {Tensor::FromVector<double>({1, 1, 2}, {0.3, 0.25}), I64({1, 1, 2}, {1, 3})}},
  });
}

TEST(NnPool, Errors) {
  ExpectError(MakeNode("MaxPool", 1, 2,
                       {{"kernel_shape", IntsAttr({2, 2})}, {"storage_order", IntAttr(2)}}),
              {Seq({1, 1, 4, 4})}, StatusCode::kInvalidArgument,
              "MaxPool 'n0': storage_order=2 is invalid (expected 0, row major, or 1, column "
              "major)");
  ExpectError(MakeNode("MaxPool", 1, 1, {{"kernel_shape", IntsAttr({2})}}),
              {Tensor::FromVector<int32_t>({1, 1, 4}, {1, 2, 3, 4})}, StatusCode::kUnimplemented,
              "MaxPool 'n0': dtype int32 is not supported (supported: float32, float16, float64, "
              "int8, uint8)");
  ExpectError(MakeNode("AveragePool", 1, 1, {{"kernel_shape", IntsAttr({2})}}),
              {Tensor::FromVector<uint8_t>({1, 1, 4}, {1, 2, 3, 4})}, StatusCode::kUnimplemented,
              "AveragePool 'n0': dtype uint8 is not supported (supported: float32)");
  ExpectError(MakeNode("AveragePool", 1, 2, {{"kernel_shape", IntsAttr({2})}}), {Seq({1, 1, 4})},
              StatusCode::kInvalidArgument, "AveragePool 'n0': has 2 outputs, expected 1 to 1");
  ExpectError(MakeNode("AveragePool", 1), {Seq({1, 1, 4, 4})}, StatusCode::kInvalidArgument,
              "AveragePool 'n0': attribute 'kernel_shape' is required");
  ExpectError(MakeNode("MaxPool", 1, 1, {{"kernel_shape", IntsAttr({2, 2})}}), {Seq({1, 1, 4})},
              StatusCode::kInvalidArgument, "kernel_shape=[2,2] has 2 values, expected 1");
}

// ---------------------------------------------------------------------------------------------
// Normalizations

TEST(NnNorm, Cases) {
  const Tensor gn_x = F32({1, 4, 2}, {1, 3, 1, 3, 0, 4, 0, 4});
  // Group 0 = channels 0,1: [1,3,1,3], mean 2, var 1 -> [-1,1,-1,1].
  // Group 1 = channels 2,3: [0,4,0,4], mean 2, var 4 -> [-1,1,-1,1], then * 2 + 1.
  const Tensor gn_y = F32({1, 4, 2}, {-1, 1, -1, 1, -1, 3, -1, 3});
  RunCases({
      // c0: (x - 1) / 2 * 1 + 0; c1: (x - 3) / 1 * 2 + 1.
      {"batchnorm",
       "BatchNormalization",
       {{"epsilon", FloatAttr(0)}},
       {F32({1, 2, 1, 2}, {1, 2, 3, 4}), F32({2}, {1, 2}), F32({2}, {0, 1}), F32({2}, {1, 3}),
        F32({2}, {4, 1})},
       {F32({1, 2, 1, 2}, {0, 0.5f, 1, 3})}},
      // Default epsilon 1e-5: var 0.99999 + 1e-5 = 1.
      {"batchnorm_default_epsilon_rank2",
       "BatchNormalization",
       {},
       {F32({2, 1}, {5, -1}), F32({1}, {1}), F32({1}, {0}), F32({1}, {2}), F32({1}, {1 - 1e-5f})},
       {F32({2, 1}, {3, -3})},
       9},
      // c0: [1,3] mean 2 var 1 -> [-1,1] * 2 + 0.5; c1: [0,4] mean 2 var 4 -> [-1,1] * 1 + 7.
      {"instancenorm",
       "InstanceNormalization",
       {{"epsilon", FloatAttr(0)}},
       {F32({1, 2, 2}, {1, 3, 0, 4}), F32({2}, {2, 1}), F32({2}, {0.5f, 7})},
       {F32({1, 2, 2}, {-1.5f, 2.5f, 6, 8})}},
      // Rows [1,3] and [2,6] both normalize to [-1,1]; * [2,3] + [1,0] -> [-1,3].
      {"layernorm_with_stats",
       "LayerNormalization",
       {{"epsilon", FloatAttr(0)}},
       {F32({2, 2}, {1, 3, 2, 6}), F32({2}, {2, 3}), F32({2}, {1, 0})},
       {F32({2, 2}, {-1, 3, -1, 3}), F32({2, 1}, {2, 4}), F32({2, 1}, {1, 0.5f})}},
      // axis=1 over [1,2,2]: all four values [1,3,1,3] -> [-1,1,-1,1]; scale [2] broadcasts.
      {"layernorm_axis1_broadcast_scale_no_bias",
       "LayerNormalization",
       {{"axis", IntAttr(1)}, {"epsilon", FloatAttr(0)}},
       {F32({1, 2, 2}, {1, 3, 1, 3}), F32({2}, {2, 5}), Tensor()},
       {F32({1, 2, 2}, {-2, 5, -2, 5})}},
      {"groupnorm_opset18_per_group",
       "GroupNormalization",
       {{"num_groups", IntAttr(2)}, {"epsilon", FloatAttr(0)}},
       {gn_x, F32({2}, {1, 2}), F32({2}, {0, 1})},
       {gn_y},
       18},
      {"groupnorm_opset21_per_channel",
       "GroupNormalization",
       {{"num_groups", IntAttr(2)}, {"epsilon", FloatAttr(0)}},
       {gn_x, F32({4}, {1, 1, 2, 2}), F32({4}, {0, 0, 1, 1})},
       {gn_y},
       21},
  });
}

// Statistics in double: a large offset must not swamp a small spread.
TEST(NnNorm, LayerNormLargeOffsetIsStable) {
  std::vector<float> x;
  for (int i = 0; i < 1000; ++i) x.push_back(10000.0f + (i % 2 == 0 ? -1.0f : 1.0f));
  std::vector<float> y;
  for (int i = 0; i < 1000; ++i) y.push_back(i % 2 == 0 ? -1.0f : 1.0f);
  RunCases({{"layernorm_offset",
             "LayerNormalization",
             {{"epsilon", FloatAttr(0)}},
             {F32({1, 1000}, x), F32({1000}, std::vector<float>(1000, 1.0f))},
             {F32({1, 1000}, y)}}});
}

TEST(NnNorm, Errors) {
  ExpectError(MakeNode("BatchNormalization", 5, 1, {{"training_mode", IntAttr(1)}}),
              {Seq({1, 2, 2}), Seq({2}), Seq({2}), Seq({2}), Seq({2})},
              StatusCode::kInvalidArgument, "training_mode exists from opset 14", 9);
  ExpectError(MakeNode("BatchNormalization", 5, 3),
              {Seq({1, 2, 2}), Seq({2}), Seq({2}), Seq({2}), Seq({2})}, StatusCode::kUnimplemented,
              "output 1 ('out1') exists only in training mode", 9);
  ExpectError(MakeNode("BatchNormalization", 5),
              {Seq({1, 2, 2}), Seq({3}), Seq({2}), Seq({2}), Seq({2})},
              StatusCode::kInvalidArgument, "input 1 ('scale') has shape [3], expected [2]");
  ExpectError(MakeNode("GroupNormalization", 3, 1, {{"num_groups", IntAttr(3)}}),
              {Seq({1, 4, 2}), Seq({3}), Seq({3})}, StatusCode::kInvalidArgument,
              "num_groups=3 does not divide 4 channels", 18);
  ExpectError(MakeNode("GroupNormalization", 3, 1, {{"num_groups", IntAttr(2)}}),
              {Seq({1, 4, 2}), Seq({4}), Seq({4})}, StatusCode::kInvalidArgument,
              "input 1 ('scale') has shape [4], expected [2] (one per group", 18);
  ExpectError(MakeNode("LayerNormalization", 2), {Seq({2, 3}), Seq({2})},
              StatusCode::kInvalidArgument, "('Scale') has shape [2], expected to broadcast to");
  ExpectError(MakeNode("LayerNormalization", 2, 1, {{"axis", IntAttr(2)}}), {Seq({2, 3}), Seq({3})},
              StatusCode::kInvalidArgument, "axis");
}

// ---------------------------------------------------------------------------------------------
// The oneDNN wrappers directly.

// prepare reads only what check validates without shapes: whenever prepare refuses a node, check
// refuses it too, in the same words (so an engine that prepares after verifying never sees a new
// error), and it accepts the nodes check accepts.
TEST(NnPrepare, RefusesOnlyWithCheckWords) {
  const std::vector<Node> refused = {
      MakeNode("Conv", 2, 1, {{"auto_pad", StringAttr("SAME")}}),
      MakeNode("Conv", 2, 1, {{"strides", StringAttr("2")}}),
      MakeNode("ConvTranspose", 2, 1, {{"kernel_shape", IntsAttr({})}}),
      MakeNode("ConvTranspose", 2, 1, {{"output_padding", FloatAttr(1.0f)}}),
      MakeNode("MaxPool", 1),
      MakeNode("MaxPool", 1, 1,
               {{"kernel_shape", IntsAttr({2, 2})}, {"storage_order", IntAttr(2)}}),
      MakeNode("AveragePool", 1, 1, {{"kernel_shape", IntsAttr({2})}, {"pads", FloatAttr(1.0f)}}),
  };
  for (const Node& n : refused) {
    auto def = OpRegistry::Global().Find("", n.op_type, 17);
    ASSERT_TRUE(def.ok()) << def.status().ToString();
    ASSERT_NE((*def)->prepare, nullptr) << n.op_type;
    auto prepared = (*def)->prepare(n, 17);
    ASSERT_FALSE(prepared.ok()) << n.Describe();
    const Status checked = (*def)->check(n, 17);
    EXPECT_EQ(prepared.status().ToString(), checked.ToString());
  }
  const std::vector<Node> accepted = {
      MakeNode("Conv", 2, 1, {{"pads", IntsAttr({1, 1, 1, 1})}, {"group", IntAttr(2)}}),
      MakeNode("ConvTranspose", 2, 1, {{"output_padding", IntsAttr({1, 1})}}),
      MakeNode("MaxPool", 1, 2, {{"kernel_shape", IntsAttr({3})}, {"storage_order", IntAttr(1)}}),
      MakeNode("AveragePool", 1, 1, {{"kernel_shape", IntsAttr({2, 2})}}),
      MakeNode("Gemm", 3, 1, {{"transA", IntAttr(1)}, {"alpha", FloatAttr(0.5f)}}),
      MakeNode("LayerNormalization", 2, 1, {{"axis", IntAttr(1)}}),
      MakeNode("GroupNormalization", 3, 1, {{"num_groups", IntAttr(2)}}),
      MakeNode("BatchNormalization", 5, 1, {{"epsilon", FloatAttr(1e-3f)}}),
  };
  for (const Node& n : accepted) {
    const int64_t opset = n.op_type == "GroupNormalization" ? 21 : 17;
    auto def = OpRegistry::Global().Find("", n.op_type, opset);
    ASSERT_TRUE(def.ok()) << def.status().ToString();
    ASSERT_NE((*def)->prepare, nullptr) << n.op_type;
    ASSERT_TRUE((*def)->check(n, opset).ok()) << n.Describe();
    auto prepared = (*def)->prepare(n, opset);
    EXPECT_TRUE(prepared.ok()) << n.Describe() << ": " << prepared.status().ToString();
  }
}

TEST(NnDnnlKernels, SgemmLeadingDimsAndErrors) {
  // A is the left 2x2 block of a 2x3 buffer (lda 3); C keeps a spare column (ldc 3).
  const float a[] = {1, 2, 99, 3, 4, 99};
  const float b[] = {5, 6, 7, 8};
  float c[] = {1, 1, -7, 1, 1, -7};
  ASSERT_TRUE(Sgemm(false, false, 2, 2, 2, 1.0f, a, 3, b, 2, 1.0f, c, 3).ok());
  const float want[] = {20, 23, -7, 44, 51, -7};
  for (int i = 0; i < 6; ++i) EXPECT_FLOAT_EQ(c[i], want[i]) << i;

  // beta == 0: C is not read, so NaN there does not leak into the result.
  float d[] = {NAN, NAN, NAN, NAN};
  ASSERT_TRUE(Sgemm(false, true, 2, 2, 2, 2.0f, a, 3, b, 2, 0.0f, d, 2, /*num_threads=*/2).ok());
  const float want_d[] = {34, 46, 78, 106};  // 2 * [[1,2],[3,4]] * [[5,7],[6,8]]
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(d[i], want_d[i]) << i;

  Status s = Sgemm(false, false, 2, 2, 3, 1.0f, a, 2, b, 2, 0.0f, c, 2);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("lda=2"), std::string::npos) << s.ToString();
}

// A prepared convolution or matmul keeps memory objects between runs and points them at each
// run's buffers; runs on several threads at once must each get their own, or one run reads or
// writes another's buffers. Every thread runs its own inputs and must get, bit for bit, what a
// lone run of the same inputs gives.
TEST(NnDnnlKernels, PreparedKernelsServeConcurrentRunsOnTheirOwnBuffers) {
  constexpr int kThreads = 4;
  Conv2dParams p;
  p.N = 1, p.C = 16, p.H = 12, p.W = 12, p.K = 32, p.R = 3, p.S = 3;
  p.pad_t = p.pad_l = p.pad_b = p.pad_r = 1;
  p.layout = 3;  // NHWC: the primitive runs on the caller's buffers
  const Tensor w = Rand({32, 16, 3, 3}, 11), b = Rand({32}, 12);
  auto conv = PrepareConv2d(p, w.data<float>(), true, ConvEpilogue{}, 1);
  ASSERT_TRUE(conv.ok()) << conv.status().ToString();
  MatmulParams mp;
  mp.M = 24, mp.K = 40, mp.N = 56;
  mp.has_bias = true;
  const Tensor mw = Rand({40, 56}, 13), mb = Rand({56}, 14);
  auto mm = PrepareMatmul(mp, mw.data<float>(), 1);
  ASSERT_TRUE(mm.ok()) << mm.status().ToString();

  std::vector<Tensor> xs, as;
  std::vector<std::vector<float>> want_conv, want_mm;
  for (int t = 0; t < kThreads; ++t) {
    xs.push_back(Rand({1, 12, 12, 16}, 20 + t));
    as.push_back(Rand({24, 40}, 40 + t));
    want_conv.emplace_back(32 * 12 * 12);
    want_mm.emplace_back(24 * 56);
    ASSERT_TRUE(RunConv2d(**conv, xs[t].data<float>(), b.data<float>(), want_conv[t].data()).ok());
    ASSERT_TRUE(
        RunMatmul(**mm, as[t].data<float>(), nullptr, mb.data<float>(), want_mm[t].data()).ok());
  }
  std::vector<int> mismatches(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<float> y(want_conv[t].size()), c(want_mm[t].size());
      for (int rep = 0; rep < 200; ++rep) {
        std::fill(y.begin(), y.end(), -1.0f);
        std::fill(c.begin(), c.end(), -1.0f);
        const bool ok =
            RunConv2d(**conv, xs[t].data<float>(), b.data<float>(), y.data()).ok() &&
            RunMatmul(**mm, as[t].data<float>(), nullptr, mb.data<float>(), c.data()).ok();
        if (!ok || y != want_conv[t] || c != want_mm[t]) ++mismatches[t];
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(mismatches[t], 0) << "thread " << t;
}

TEST(NnDnnlKernels, Conv2dRejectsBadParamsAndIsThreadSafe) {
  Conv2dParams bad;
  bad.C = 4;
  bad.K = 4;
  bad.group = 3;
  Status s = Conv2d(bad, nullptr, nullptr, nullptr, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("group=3 does not divide 4 input channels"), std::string::npos)
      << s.ToString();

  Conv2dParams p;
  p.N = 1, p.C = 4, p.H = 8, p.W = 8, p.K = 4, p.R = 3, p.S = 3;
  p.pad_t = p.pad_l = p.pad_b = p.pad_r = 1;
  const Tensor x = Rand({1, 4, 8, 8}, 5), w = Rand({4, 4, 3, 3}, 6);
  RefConvArgs a;
  a.pads = {1, 1, 1, 1};
  const Tensor want = RefConv2d(x, w, Tensor(), a);
  std::vector<std::vector<float>> results(4, std::vector<float>(want.numel()));
  std::vector<Status> statuses(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 5 && statuses[t].ok(); ++rep) {
        statuses[t] = Conv2d(p, x.data<float>(), w.data<float>(), nullptr, results[t].data(), 1);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int t = 0; t < 4; ++t) {
    ASSERT_TRUE(statuses[t].ok()) << statuses[t].ToString();
    for (int64_t i = 0; i < want.numel(); ++i) {
      ASSERT_NEAR(results[t][i], want.data<float>()[i], 1e-4) << "thread " << t << " elem " << i;
    }
  }
}

}  // namespace
}  // namespace kiln
