// Tests for the quantized op family (ops/quant_ops.cc).
//
// Expected values are the literal outputs of ONNX's own node cases (onnx 1.12,
// backend/test/case/node/{quantizelinear,dequantizelinear,matmulinteger,qlinearmatmul,
// convinteger,qlinearconv}.py) plus small cases worked out by hand in the comments (rounding,
// saturation, per-axis, per-channel and int8 forms). The last test checks that a quantized
// model's scales and zero points stay bound weights that folding never turns into code.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "src/kiln/ops/shape_inference.h"
#include "tests/ops/op_test_util.h"

namespace kiln {
namespace {

using testing::F32;
using testing::IntAttr;
using testing::IntsAttr;
using testing::MakeNode;
using testing::RunOp;
using testing::StringAttr;

Tensor U8(Shape shape, std::vector<uint8_t> v) {
  return Tensor::FromVector<uint8_t>(std::move(shape), v);
}
Tensor I8(Shape shape, std::vector<int8_t> v) {
  return Tensor::FromVector<int8_t>(std::move(shape), v);
}
Tensor I32(Shape shape, std::vector<int32_t> v) {
  return Tensor::FromVector<int32_t>(std::move(shape), v);
}

// Runs `op` and expects exactly `expected` (integer outputs compare exactly).
void ExpectRun(const std::string& op, std::map<std::string, Attribute> attrs,
               const std::vector<Tensor>& inputs, const Tensor& expected, int64_t opset = 13) {
  auto out = RunOp(MakeNode(op, inputs.size(), 1, std::move(attrs)), inputs, opset);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  testing::ExpectTensorNear((*out)[0], expected, 0.0, 0.0);
}

void ExpectError(const Node& node, const std::vector<Tensor>& inputs, StatusCode code,
                 const std::string& fragment, int64_t opset = 13) {
  auto out = RunOp(node, inputs, opset);
  ASSERT_FALSE(out.ok()) << "expected an error containing '" << fragment << "'";
  EXPECT_EQ(out.status().code(), code) << out.status().ToString();
  EXPECT_NE(out.status().message().find(fragment), std::string::npos)
      << out.status().ToString() << "\n  expected fragment: " << fragment;
}

// --- QuantizeLinear ---------------------------------------------------------------------------

TEST(QuantizeLinear, OnnxCasePerTensorSaturates) {
  ExpectRun("QuantizeLinear", {},
            {F32({6}, {0, 2, 3, 1000, -254, -1000}), F32({}, {2}), U8({}, {128})},
            U8({6}, {128, 129, 130, 255, 1, 0}), 10);
}

TEST(QuantizeLinear, RoundsHalfToEven) {
  // x / 1 = 0.5, 1.5, 2.5, -0.5, -1.5, 2.4999 -> 0, 2, 2, -0, -2, 2; plus zero point 10.
  ExpectRun("QuantizeLinear", {},
            {F32({6}, {0.5f, 1.5f, 2.5f, -0.5f, -1.5f, 2.4999f}), F32({}, {1}), I8({}, {10})},
            I8({6}, {10, 12, 12, 10, 8, 12}));
}

TEST(QuantizeLinear, AbsentZeroPointGivesUint8) {
  ExpectRun("QuantizeLinear", {}, {F32({3}, {-3, 7, 600}), F32({}, {2})}, U8({3}, {0, 4, 255}));
}

TEST(QuantizeLinear, Int8SaturatesAtBothEnds) {
  ExpectRun("QuantizeLinear", {}, {F32({3}, {-1000, 1000, -3}), F32({}, {1}), I8({}, {0})},
            I8({3}, {-128, 127, -3}));
}

TEST(QuantizeLinear, OnnxCasePerAxis) {
  const Tensor x = F32({1, 3, 3, 2}, {-162, 10, -100, 232, -20, -50, -76, 0, 0, 252, 32, -44, 245,
                                      -485, -960, -270, -375, -470});
  // y = x / scale[c] + zp[c], saturated: channel 0 scale 2 zp 84, 1: 4/24, 2: 5/196.
  ExpectRun(
      "QuantizeLinear", {}, {x, F32({3}, {2, 4, 5}), U8({3}, {84, 24, 196})},
      U8({1, 3, 3, 2}, {3, 89, 34, 200, 74, 59, 5, 24, 24, 87, 32, 13, 245, 99, 4, 142, 121, 102}));
}

TEST(QuantizeLinear, PerAxisAlongANegativeAxis) {
  // axis=-1 of [2, 2]: column scales 1 and 10.
  ExpectRun("QuantizeLinear", {{"axis", IntAttr(-1)}},
            {F32({2, 2}, {5, 50, -5, -50}), F32({2}, {1, 10}), I8({2}, {0, 1})},
            I8({2, 2}, {5, 6, -5, -4}));
}

TEST(QuantizeLinear, PerAxisNeedsOpset13) {
  ExpectError(MakeNode("QuantizeLinear", 2), {F32({2, 2}, {1, 2, 3, 4}), F32({2}, {1, 2})},
              StatusCode::kInvalidArgument, "per-axis needs opset 13", 10);
}

TEST(QuantizeLinear, BadAttributesNamed) {
  ExpectError(MakeNode("QuantizeLinear", 2, 1, {{"axis", IntAttr(2)}}),
              {F32({2, 2}, {1, 2, 3, 4}), F32({2}, {1, 2})}, StatusCode::kInvalidArgument,
              "axis=2 is out of range");
  ExpectError(MakeNode("QuantizeLinear", 2, 1, {{"axis", IntAttr(1)}}),
              {F32({2, 2}, {1, 2, 3, 4}), F32({2}, {1, 2})}, StatusCode::kInvalidArgument,
              "attribute 'axis' exists from opset 13", 10);
  ExpectError(MakeNode("QuantizeLinear", 2, 1, {{"block_size", IntAttr(4)}}),
              {F32({2}, {1, 2}), F32({}, {1})}, StatusCode::kUnimplemented, "block_size=4");
  ExpectError(MakeNode("QuantizeLinear", 2, 1, {{"output_dtype", IntAttr(1)}}),
              {F32({2}, {1, 2}), F32({}, {1})}, StatusCode::kUnimplemented, "output_dtype=1");
  ExpectError(MakeNode("QuantizeLinear", 2, 1, {{"axis", StringAttr("0")}}),
              {F32({2}, {1, 2}), F32({}, {1})}, StatusCode::kInvalidArgument, "axis");
}

TEST(QuantizeLinear, BadInputsNamed) {
  ExpectError(MakeNode("QuantizeLinear", 2), {F32({2, 3}, {1, 2, 3, 4, 5, 6}), F32({2}, {1, 2})},
              StatusCode::kInvalidArgument,
              "input 1 ('scale') has shape [2], expected a scalar or [3]");
  ExpectError(MakeNode("QuantizeLinear", 3), {F32({2}, {1, 2}), F32({}, {1}), I32({}, {0})},
              StatusCode::kInvalidArgument, "input 2 ('y_zero_point') has dtype int32");
  ExpectError(MakeNode("QuantizeLinear", 3),
              {F32({2, 2}, {1, 2, 3, 4}), F32({2}, {1, 1}), U8({}, {0})},
              StatusCode::kInvalidArgument, "('zero_point') has shape []");
}

// --- DequantizeLinear -------------------------------------------------------------------------

TEST(DequantizeLinear, OnnxCasePerTensor) {
  ExpectRun("DequantizeLinear", {}, {U8({4}, {0, 3, 128, 255}), F32({}, {2}), U8({}, {128})},
            F32({4}, {-256, -250, 0, 254}), 10);
}

TEST(DequantizeLinear, OnnxCasePerAxis) {
  const Tensor x =
      U8({1, 3, 3, 2}, {3, 89, 34, 200, 74, 59, 5, 24, 24, 87, 32, 13, 245, 99, 4, 142, 121, 102});
  // (x - zp[c]) * scale[c].
  ExpectRun("DequantizeLinear", {}, {x, F32({3}, {2, 4, 5}), U8({3}, {84, 24, 196})},
            F32({1, 3, 3, 2}, {-162, 10, -100, 232, -20, -50, -76, 0, 0, 252, 32, -44, 245, -485,
                               -960, -270, -375, -470}));
}

TEST(DequantizeLinear, Int8AndInt32Inputs) {
  ExpectRun("DequantizeLinear", {}, {I8({3}, {-128, 0, 127}), F32({}, {0.5f}), I8({}, {-1})},
            F32({3}, {-63.5f, 0.5f, 64}));
  // int32 (a bias) without a zero point.
  ExpectRun("DequantizeLinear", {}, {I32({2}, {-1000, 3}), F32({}, {0.25f})},
            F32({2}, {-250, 0.75f}));
}

TEST(DequantizeLinear, BadInputsNamed) {
  ExpectError(MakeNode("DequantizeLinear", 3), {U8({2}, {1, 2}), F32({}, {1}), I8({}, {0})},
              StatusCode::kInvalidArgument,
              "input 2 ('x_zero_point') has dtype int8, expected uint8");
  ExpectError(MakeNode("DequantizeLinear", 2), {F32({2}, {1, 2}), F32({}, {1})},
              StatusCode::kInvalidArgument, "input 0 ('x') has dtype float32");
}

// --- MatMulInteger / QLinearMatMul ------------------------------------------------------------

TEST(MatMulInteger, OnnxCase) {
  ExpectRun("MatMulInteger", {},
            {U8({4, 3}, {11, 7, 3, 10, 6, 2, 9, 5, 1, 8, 4, 0}), U8({3, 2}, {1, 4, 2, 5, 3, 6}),
             U8({1}, {12}), U8({1}, {0})},
            I32({4, 2}, {-38, -83, -44, -98, -50, -113, -56, -128}), 10);
}

TEST(MatMulInteger, PerRowAndPerColumnZeroPointsInt8Batched) {
  // a [2,1,2] int8 with row zero point [1]; b [2,2] uint8 with column zero points [1, 2].
  // batch 0: (a - 1) = [1, 2]; b - zp = [[0, 1], [2, 3]] -> [4, 7]
  // batch 1: (a - 1) = [-2, 0]                             -> [0, -2]
  ExpectRun("MatMulInteger", {},
            {I8({2, 1, 2}, {2, 3, -1, 1}), U8({2, 2}, {1, 3, 3, 5}), I8({1}, {1}), U8({2}, {1, 2})},
            I32({2, 1, 2}, {4, 7, 0, -2}));
}

TEST(MatMulInteger, AbsentZeroPointsAndVectorOperand) {
  // [3] x [3, 1]: 1*4 + 2*5 + 3*6 = 32.
  ExpectRun("MatMulInteger", {}, {U8({3}, {1, 2, 3}), U8({3, 1}, {4, 5, 6})}, I32({1}, {32}));
}

TEST(MatMulInteger, BadInputsNamed) {
  ExpectError(MakeNode("MatMulInteger", 3),
              {U8({2, 3}, {1, 2, 3, 4, 5, 6}), U8({3, 1}, {1, 2, 3}), U8({3}, {1, 2, 3})},
              StatusCode::kInvalidArgument,
              "input 2 ('a_zero_point') has shape [3], expected a scalar or [2] (one per row)");
  ExpectError(MakeNode("MatMulInteger", 2), {U8({2, 3}, {1, 2, 3, 4, 5, 6}), U8({2, 1}, {1, 2})},
              StatusCode::kInvalidArgument, "inner dims differ");
}

TEST(QLinearMatMul, OnnxCase2D) {
  ExpectRun("QLinearMatMul", {},
            {U8({2, 4}, {208, 236, 0, 238, 3, 214, 255, 29}), F32({1}, {0.0066f}), U8({1}, {113}),
             U8({4, 3}, {152, 51, 244, 60, 26, 255, 0, 127, 246, 127, 254, 247}),
             F32({1}, {0.00705f}), U8({1}, {114}), F32({1}, {0.0107f}), U8({1}, {118})},
            U8({2, 3}, {168, 115, 255, 1, 66, 151}), 10);
}

TEST(QLinearMatMul, PerColumnScaleInt8) {
  // a = [[2, 4]] (zp 0, scale 1); b = [[1, 1], [1, -1]] (zp 0, scales [1, 0.5]);
  // acc = [6, -2] -> real [6, -1] -> / y_scale 2 = [3, -0.5] -> round [3, -0] + zp 1 = [4, 1].
  ExpectRun("QLinearMatMul", {},
            {I8({1, 2}, {2, 4}), F32({}, {1}), I8({}, {0}), I8({2, 2}, {1, 1, 1, -1}),
             F32({2}, {1, 0.5f}), I8({2}, {0, 0}), F32({}, {2}), I8({}, {1})},
            I8({1, 2}, {4, 1}));
}

TEST(QLinearMatMul, AllEightInputsRequired) {
  ExpectError(MakeNode("QLinearMatMul", 7),
              {U8({1, 1}, {1}), F32({}, {1}), U8({}, {0}), U8({1, 1}, {1}), F32({}, {1}),
               U8({}, {0}), F32({}, {1})},
              StatusCode::kInvalidArgument, "has 7 inputs, expected 8");
}

// --- ConvInteger / QLinearConv ----------------------------------------------------------------

TEST(ConvInteger, OnnxCasesWithAndWithoutPadding) {
  const Tensor x = U8({1, 1, 3, 3}, {2, 3, 4, 5, 6, 7, 8, 9, 10});
  const Tensor w = U8({1, 1, 2, 2}, {1, 1, 1, 1});
  ExpectRun("ConvInteger", {}, {x, w, U8({}, {1})}, I32({1, 1, 2, 2}, {12, 16, 24, 28}), 10);
  ExpectRun("ConvInteger", {{"pads", IntsAttr({1, 1, 1, 1})}}, {x, w, U8({}, {1})},
            I32({1, 1, 4, 4}, {1, 3, 5, 3, 5, 12, 16, 9, 11, 24, 28, 15, 7, 15, 17, 9}), 10);
}

TEST(ConvInteger, PerChannelWeightZeroPointGroupsAndStride1D) {
  // x [1, 2, 4] int8, zp 1 -> shifted [[0, 1, 2, 3], [-1, 0, 1, 2]]; group 2, w [2, 1, 2]
  // int8 with per-channel zp [1, -1] -> shifted [[1, 0], [1, 1]]; stride 2.
  // channel 0: x0[0]*1 + x0[1]*0 = 0, x0[2] = 2; channel 1: -1 + 0 = -1, 1 + 2 = 3.
  ExpectRun("ConvInteger", {{"group", IntAttr(2)}, {"strides", IntsAttr({2})}},
            {I8({1, 2, 4}, {1, 2, 3, 4, 0, 1, 2, 3}), I8({2, 1, 2}, {2, 1, 0, 0}), I8({}, {1}),
             I8({2}, {1, -1})},
            I32({1, 2, 2}, {0, 2, -1, 3}));
}

TEST(ConvInteger, BadAttributesNamed) {
  const Tensor x = U8({1, 1, 3, 3}, {2, 3, 4, 5, 6, 7, 8, 9, 10});
  const Tensor w = U8({1, 1, 2, 2}, {1, 1, 1, 1});
  ExpectError(MakeNode("ConvInteger", 2, 1, {{"auto_pad", StringAttr("SAME")}}), {x, w},
              StatusCode::kInvalidArgument, "auto_pad='SAME' is not one of");
  ExpectError(MakeNode("ConvInteger", 2, 1, {{"strides", IntsAttr({0, 1})}}), {x, w},
              StatusCode::kInvalidArgument, "strides=[0,1] has a value below 1");
  ExpectError(MakeNode("ConvInteger", 2, 1, {{"group", IntAttr(2)}}), {x, w},
              StatusCode::kInvalidArgument, "group=2");
  ExpectError(MakeNode("ConvInteger", 2, 1, {{"kernel_shape", IntsAttr({3, 3})}}), {x, w},
              StatusCode::kInvalidArgument, "kernel_shape=[3,3] does not match");
  ExpectError(MakeNode("ConvInteger", 2, 1, {{"pads", IntsAttr({-1, 0, 0, 0})}}), {x, w},
              StatusCode::kInvalidArgument, "pads=[-1,0,0,0] has a negative value");
}

TEST(QLinearConv, OnnxCase) {
  const Tensor x =
      U8({1, 1, 7, 7},
         {255, 174, 162, 25,  203, 168, 58,  15,  59,  237, 95,  129, 0,  64,  56, 242, 153,
          221, 168, 12,  166, 232, 178, 186, 195, 237, 162, 237, 188, 39, 124, 77, 80,  102,
          43,  127, 230, 21,  83,  41,  40,  134, 255, 154, 92,  141, 42, 148, 247});
  ExpectRun("QLinearConv", {},
            {x, F32({}, {0.00369204697f}), U8({}, {132}), U8({1, 1, 1, 1}, {0}),
             F32({1}, {0.00172794575f}), U8({1}, {255}), F32({}, {0.00162681262f}), U8({}, {123})},
            U8({1, 1, 7, 7},
               {0,   81,  93,  230, 52,  87,  197, 240, 196, 18,  160, 126, 255, 191, 199, 13,  102,
                34,  87,  243, 89,  23,  77,  69,  60,  18,  93,  18,  67,  216, 131, 178, 175, 153,
                212, 128, 25,  234, 172, 214, 215, 121, 0,   101, 163, 114, 213, 107, 8}),
            10);
}

TEST(QLinearConv, PerChannelScalesBiasAndSamePadding) {
  // x [1, 1, 2, 2] int8 = [[1, 2], [3, 4]] (zp 0, scale 1); w [2, 1, 1, 1] = [1, 2] with
  // per-channel scales [1, 0.5] and zp [0, 0]; bias [10, -4]; y_scale 2, y_zp -1, int8.
  // channel 0: (x + 10) * 1 / 2 = [5.5, 6, 6.5, 7] -> round even [6, 6, 6, 7] - 1.
  // channel 1: (2x - 4) * 0.5 / 2 = [-0.5, 0, 0.5, 1] -> [-0, 0, 0, 1] - 1.
  ExpectRun("QLinearConv", {{"auto_pad", StringAttr("SAME_UPPER")}},
            {I8({1, 1, 2, 2}, {1, 2, 3, 4}), F32({}, {1}), I8({}, {0}), I8({2, 1, 1, 1}, {1, 2}),
             F32({2}, {1, 0.5f}), I8({2}, {0, 0}), F32({}, {2}), I8({}, {-1}), I32({2}, {10, -4})},
            I8({1, 2, 2, 2}, {5, 5, 5, 6, -1, -1, -1, 0}));
}

TEST(QLinearConv, BadInputsNamed) {
  const std::vector<Tensor> base = {U8({1, 1, 2, 2}, {1, 2, 3, 4}),
                                    F32({}, {1}),
                                    U8({}, {0}),
                                    U8({2, 1, 1, 1}, {1, 2}),
                                    F32({3}, {1, 1, 1}),
                                    U8({}, {0}),
                                    F32({}, {1}),
                                    U8({}, {0})};
  ExpectError(MakeNode("QLinearConv", 8), base, StatusCode::kInvalidArgument,
              "input 4 ('w_scale') has shape [3], expected a scalar or [2] (per output channel)");
  std::vector<Tensor> with_bias = base;
  with_bias[4] = F32({}, {1});
  with_bias.push_back(F32({2}, {1, 2}));
  ExpectError(MakeNode("QLinearConv", 9), with_bias, StatusCode::kInvalidArgument,
              "input 8 ('B') has dtype float32, expected int32");
}

// --- Weights stay data --------------------------------------------------------------------------

// A QDQ model: an int8 weight with its scale and zero point as initializers, dequantized and
// multiplied by a runtime input. All three are checkpoint data: bound weights, never folded.
TEST(QuantWeights, ScalesAndZeroPointsAreBoundWeightsThatFoldingKeeps) {
  Graph g;
  g.opsets[""] = 13;
  g.inputs.push_back({"x", DType::kFloat32, true, {{2, ""}, {3, ""}}});
  g.initializers["w_q"] = I8({3, 2}, {1, -2, 3, -4, 5, -6});
  g.initializers["w_scale"] = F32({2}, {0.5f, 0.25f});
  g.initializers["w_zp"] = I8({2}, {0, 1});
  Node dq;
  dq.name = "dq";
  dq.op_type = "DequantizeLinear";
  dq.inputs = {"w_q", "w_scale", "w_zp"};
  dq.outputs = {"w"};
  dq.attrs["axis"] = IntAttr(1);
  Node mm;
  mm.name = "mm";
  mm.op_type = "MatMul";
  mm.inputs = {"x", "w"};
  mm.outputs = {"y"};
  g.nodes = {dq, mm};
  g.outputs.push_back({"y", DType::kFloat32, false, {}});

  EXPECT_EQ(g.WeightNames(), (std::vector<std::string>{"w_q", "w_scale", "w_zp"}));
  auto inf = InferShapes(g, {{"x", {2, 3}}});
  ASSERT_TRUE(inf.ok()) << inf.status().ToString();
  EXPECT_FALSE(inf->known.count("w")) << "a dequantized weight must not become a constant";
  EXPECT_EQ(inf->types.at("w"), (TensorType{DType::kFloat32, {3, 2}}));
  auto folded = FoldStructural(g, *inf);
  ASSERT_TRUE(folded.ok()) << folded.status().ToString();
  ASSERT_EQ(folded->nodes.size(), 2u);
  EXPECT_EQ(folded->nodes[0].op_type, "DequantizeLinear");
  EXPECT_EQ(folded->WeightNames(), g.WeightNames());
}

}  // namespace
}  // namespace kiln
