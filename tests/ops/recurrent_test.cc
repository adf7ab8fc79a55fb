// Tests for the recurrent op family (ops/recurrent.cc): RNN, GRU, LSTM.
//
// Inputs are the pattern Pat(shape, seed)[i] = (((i * 7 + seed) % 11) - 5) * 0.1. Expected
// values come from two independent oracles, run once and pasted here as literals:
//   - onnx 1.12's reference helpers (backend/test/case/node/{lstm,gru,rnn}.py, LSTM_Helper
//     etc.), forward direction with bias, initial state and (LSTM) peepholes;
//   - PyTorch's nn.LSTM / nn.GRU (gates reordered to ONNX's i,o,f,c / z,r,h; torch's GRU is
//     linear_before_reset=1), bidirectional with packed sequences for sequence_lens.
// The forward GRU rows of both agree, which cross-checks the two. Layout 1, reverse and the
// activation/clip attributes are checked as properties and small hand-worked cases.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tests/ops/op_test_util.h"

namespace kiln {
namespace {

using testing::F32;
using testing::FloatAttr;
using testing::FloatsAttr;
using testing::IntAttr;
using testing::MakeNode;
using testing::RunOp;
using testing::StringAttr;

Tensor Pat(Shape shape, int seed) {
  std::vector<float> v(static_cast<size_t>(NumElements(shape)));
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] =
        static_cast<float>((static_cast<int>((i * 7 + static_cast<size_t>(seed)) % 11) - 5) * 0.1);
  }
  return F32(std::move(shape), v);
}

Attribute Strings(std::vector<std::string> v) {
  Attribute a;
  a.kind = Attribute::Kind::kStrings;
  a.strings = std::move(v);
  return a;
}

Tensor I32(Shape shape, std::vector<int32_t> v) {
  return Tensor::FromVector<int32_t>(std::move(shape), v);
}

// A node with the given output names ("" = omitted) and attributes.
Node RecurrentNode(const std::string& op, size_t inputs, std::vector<std::string> outputs,
                   std::map<std::string, Attribute> attrs = {}) {
  Node n = MakeNode(op, inputs, 0, std::move(attrs));
  n.outputs = std::move(outputs);
  return n;
}

std::vector<Tensor> RunNode(const Node& node, const std::vector<Tensor>& inputs,
                            int64_t opset = 14) {
  auto out = RunOp(node, inputs, opset);
  EXPECT_TRUE(out.ok()) << out.status().ToString();
  return out.ok() ? *out : std::vector<Tensor>{};
}

constexpr int64_t kS = 3, kB = 2, kI = 3, kH = 2;

// X, W, R, B, (no sequence_lens), initial_h for one direction of a cell with `gates` gates.
std::vector<Tensor> ForwardInputs(int64_t gates, int64_t dirs = 1) {
  return {Pat({kS, kB, kI}, 1),
          Pat({dirs, gates * kH, kI}, 2),
          Pat({dirs, gates * kH, kH}, 3),
          Pat({dirs, 2 * gates * kH}, 4),
          Tensor(),
          Pat({dirs, kB, kH}, 5)};
}

void ExpectNear(const Tensor& got, Shape shape, std::vector<float> want) {
  testing::ExpectTensorNear(got, F32(std::move(shape), want), 2e-6, 1e-5);
}

// --- Against onnx's reference helpers ----------------------------------------------------------

TEST(LSTM, MatchesOnnxReferenceWithBiasInitialStateAndPeepholes) {
  std::vector<Tensor> in = ForwardInputs(4);
  in.push_back(Pat({1, kB, kH}, 6));  // initial_c
  in.push_back(Pat({1, 3 * kH}, 7));  // P
  auto out = RunNode(RecurrentNode("LSTM", 8, {"Y", "Y_h"}), in);
  ASSERT_EQ(out.size(), 2u);
  ExpectNear(out[0], {3, 1, 2, 2},
             {-0.1635814f, 0.01364541f, -0.07352794f, 0.06648847f, -0.1988187f, 0.1062362f,
              -0.1688595f, 0.1515447f, -0.2529946f, 0.1593322f, -0.1305569f, 0.1533978f});
  ExpectNear(out[1], {1, 2, 2}, {-0.2529946f, 0.1593322f, -0.1305569f, 0.1533978f});
}

TEST(GRU, MatchesOnnxReferenceBothResetForms) {
  auto out = RunNode(RecurrentNode("GRU", 6, {"Y", "Y_h"}), ForwardInputs(3));
  ASSERT_EQ(out.size(), 2u);
  ExpectNear(out[0], {3, 1, 2, 2},
             {0.3704025f, -0.2605612f, 0.4640047f, -0.06692353f, 0.6706821f, 0.05664577f,
              0.6863214f, 0.1632379f, 0.7482387f, 0.2422893f, 0.5982744f, 0.0125391f});
  ExpectNear(out[1], {1, 2, 2}, {0.7482387f, 0.2422893f, 0.5982744f, 0.0125391f});

  out = RunNode(RecurrentNode("GRU", 6, {"Y", "Y_h"}, {{"linear_before_reset", IntAttr(1)}}),
                ForwardInputs(3));
  ASSERT_EQ(out.size(), 2u);
  ExpectNear(out[0], {3, 1, 2, 2},
             {0.3518091f, -0.2303783f, 0.4310358f, -0.04527415f, 0.6324099f, 0.09379558f,
              0.6403125f, 0.1930099f, 0.6968888f, 0.27261f, 0.5045105f, 0.04126068f});
  ExpectNear(out[1], {1, 2, 2}, {0.6968888f, 0.27261f, 0.5045105f, 0.04126068f});
}

TEST(RNN, MatchesOnnxReference) {
  auto out = RunNode(RecurrentNode("RNN", 6, {"Y", "Y_h"}), ForwardInputs(1));
  ASSERT_EQ(out.size(), 2u);
  ExpectNear(out[0], {3, 1, 2, 2},
             {0.1390925f, -0.3095069f, 0.2165181f, -0.345214f, -0.1902263f, -0.6250427f,
              -0.2316295f, -0.6010465f, -0.2954035f, -0.559091f, -0.2859935f, -0.6248053f});
  ExpectNear(out[1], {1, 2, 2}, {-0.2954035f, -0.559091f, -0.2859935f, -0.6248053f});
}

// --- Against PyTorch: bidirectional, sequence_lens, Y_c ---------------------------------------

TEST(LSTM, BidirectionalWithSequenceLensMatchesTorch) {
  std::vector<Tensor> in = ForwardInputs(4, 2);
  in[4] = I32({kB}, {3, 2});
  in.push_back(Pat({2, kB, kH}, 6));  // initial_c; no P (torch has no peepholes)
  auto out = RunNode(
      RecurrentNode("LSTM", 7, {"Y", "Y_h", "Y_c"}, {{"direction", StringAttr("bidirectional")}}),
      in);
  ASSERT_EQ(out.size(), 3u);
  ExpectNear(out[0], {3, 2, 2, 2},
             {-0.1680587f,
              0.007738387f,
              -0.05842736f,
              0.06567476f,
              -0.07597452f,
              -0.2172525f,
              -0.1016291f,
              -0.3134958f,
              -0.2186352f,
              0.1004633f,
              -0.1740764f,
              0.1495793f,
              0.1017413f,
              -0.08854548f,
              0.130715f,
              -0.2748124f,
              -0.2860041f,
              0.155555f,
              0,
              0,
              0.07908962f,
              0.001479156f,
              0,
              0});
  ExpectNear(out[1], {2, 2, 2},
             {-0.2860041f, 0.155555f, -0.1740764f, 0.1495793f, -0.07597452f, -0.2172525f,
              -0.1016291f, -0.3134958f});
  ExpectNear(out[2], {2, 2, 2},
             {-0.5348184f, 0.3042994f, -0.305059f, 0.2985833f, -0.1028846f, -0.4026439f,
              -0.1414914f, -0.660839f});
}

TEST(GRU, BidirectionalWithSequenceLensMatchesTorch) {
  std::vector<Tensor> in = ForwardInputs(3, 2);
  in[4] = I32({kB}, {3, 2});
  auto out = RunNode(RecurrentNode("GRU", 6, {"Y", "Y_h"},
                                   {{"direction", StringAttr("bidirectional")},
                                    {"linear_before_reset", IntAttr(1)}}),
                     in);
  ASSERT_EQ(out.size(), 2u);
  ExpectNear(out[0], {3, 2, 2, 2},
             {0.3518092f,  -0.2303783f, 0.4310359f,   -0.04527414f, 0.1257564f, -0.4164075f,
              0.1208363f,  -0.1254363f, 0.6324098f,   0.09379555f,  0.6403125f, 0.1930099f,
              -0.0758942f, -0.3636589f, -0.08176364f, 0.08268661f,  0.6968888f, 0.27261f,
              0,           0,           -0.1891986f,  -0.1215574f,  0,          0});
  ExpectNear(out[1], {2, 2, 2},
             {0.6968888f, 0.27261f, 0.6403125f, 0.1930099f, 0.1257564f, -0.4164075f, 0.1208363f,
              -0.1254363f});
}

// --- Properties ---------------------------------------------------------------------------------

// Layout 1 is layout 0 with batch and sequence (and the state's batch and direction) swapped.
TEST(LSTM, Layout1IsBatchMajorLayout0) {
  std::vector<Tensor> in = ForwardInputs(4, 2);
  in.push_back(Pat({2, kB, kH}, 6));
  in.push_back(Pat({2, 3 * kH}, 7));
  const auto l0 = RunNode(
      RecurrentNode("LSTM", 8, {"Y", "Y_h", "Y_c"}, {{"direction", StringAttr("bidirectional")}}),
      in);
  ASSERT_EQ(l0.size(), 3u);
  // Batch-major copies of X [S,B,I] -> [B,S,I] and of the states [D,B,H] -> [B,D,H].
  auto swap01 = [](const Tensor& t) {
    const int64_t a = t.dim(0), b = t.dim(1), rest = t.numel() / (a * b);
    std::vector<float> v(static_cast<size_t>(t.numel()));
    for (int64_t i = 0; i < a; ++i) {
      for (int64_t j = 0; j < b; ++j) {
        for (int64_t k = 0; k < rest; ++k) {
          v[static_cast<size_t>((j * a + i) * rest + k)] = t.data<float>()[(i * b + j) * rest + k];
        }
      }
    }
    Shape s = t.shape();
    std::swap(s[0], s[1]);
    return F32(s, v);
  };
  std::vector<Tensor> in1 = in;
  in1[0] = swap01(in[0]);
  in1[5] = swap01(in[5]);
  in1[6] = swap01(in[6]);
  const auto l1 =
      RunNode(RecurrentNode("LSTM", 8, {"Y", "Y_h", "Y_c"},
                            {{"direction", StringAttr("bidirectional")}, {"layout", IntAttr(1)}}),
              in1);
  ASSERT_EQ(l1.size(), 3u);
  // Y [S,D,B,H] -> [B,S,D,H]: move B to the front.
  const Tensor& y0 = l0[0];
  std::vector<float> y(static_cast<size_t>(y0.numel()));
  for (int64_t s = 0; s < kS; ++s) {
    for (int64_t d = 0; d < 2; ++d) {
      for (int64_t b = 0; b < kB; ++b) {
        for (int64_t h = 0; h < kH; ++h) {
          y[static_cast<size_t>(((b * kS + s) * 2 + d) * kH + h)] =
              y0.data<float>()[((s * 2 + d) * kB + b) * kH + h];
        }
      }
    }
  }
  testing::ExpectTensorNear(l1[0], F32({kB, kS, 2, kH}, y), 1e-6, 0);
  testing::ExpectTensorNear(l1[1], swap01(l0[1]), 1e-6, 0);
  testing::ExpectTensorNear(l1[2], swap01(l0[2]), 1e-6, 0);
}

// direction=reverse on X equals forward on X reversed in time, with Y reversed back.
TEST(RNN, ReverseIsForwardOnTimeReversedInput) {
  const std::vector<Tensor> in = ForwardInputs(1);
  std::vector<Tensor> flipped = in;
  std::vector<float> xr(static_cast<size_t>(kS * kB * kI));
  for (int64_t s = 0; s < kS; ++s) {
    for (int64_t j = 0; j < kB * kI; ++j) {
      xr[static_cast<size_t>((kS - 1 - s) * kB * kI + j)] = in[0].data<float>()[s * kB * kI + j];
    }
  }
  flipped[0] = F32({kS, kB, kI}, xr);
  const auto rev =
      RunNode(RecurrentNode("RNN", 6, {"Y", "Y_h"}, {{"direction", StringAttr("reverse")}}), in);
  const auto fwd = RunNode(RecurrentNode("RNN", 6, {"Y", "Y_h"}), flipped);
  ASSERT_EQ(rev.size(), 2u);
  ASSERT_EQ(fwd.size(), 2u);
  for (int64_t s = 0; s < kS; ++s) {
    for (int64_t j = 0; j < kB * kH; ++j) {
      EXPECT_FLOAT_EQ(rev[0].data<float>()[s * kB * kH + j],
                      fwd[0].data<float>()[(kS - 1 - s) * kB * kH + j]);
    }
  }
  testing::ExpectTensorNear(rev[1], fwd[1], 0, 0);
}

// Omitted outputs (empty names) still run; the present ones are the same values.
TEST(GRU, OmittedOutputs) {
  const auto full = RunNode(RecurrentNode("GRU", 6, {"Y", "Y_h"}), ForwardInputs(3));
  const auto only_h = RunNode(RecurrentNode("GRU", 6, {"", "Y_h"}), ForwardInputs(3));
  ASSERT_EQ(only_h.size(), 2u);
  testing::ExpectTensorNear(only_h[1], full[1], 0, 0);
  const auto only_y = RunNode(RecurrentNode("GRU", 6, {"Y"}), ForwardInputs(3));
  ASSERT_EQ(only_y.size(), 1u);
  testing::ExpectTensorNear(only_y[0], full[0], 0, 0);
}

// Optional inputs absent: no B, no initial_h (zeros), W/R only.
TEST(LSTM, OnlyRequiredInputsEqualsZeroBiasAndState) {
  const std::vector<Tensor> req = {Pat({kS, kB, kI}, 1), Pat({1, 4 * kH, kI}, 2),
                                   Pat({1, 4 * kH, kH}, 3)};
  std::vector<Tensor> zeros = req;
  zeros.push_back(F32({1, 8 * kH}, std::vector<float>(8 * kH, 0.0f)));
  zeros.push_back(Tensor());
  zeros.push_back(F32({1, kB, kH}, std::vector<float>(kB * kH, 0.0f)));
  zeros.push_back(F32({1, kB, kH}, std::vector<float>(kB * kH, 0.0f)));
  const auto a = RunNode(RecurrentNode("LSTM", 3, {"Y", "Y_h", "Y_c"}), req);
  const auto b = RunNode(RecurrentNode("LSTM", 7, {"Y", "Y_h", "Y_c"}), zeros);
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  for (size_t i = 0; i < 3; ++i) testing::ExpectTensorNear(a[i], b[i], 0, 0);
}

// One unit, one input: h_t = act(clip(2 * x_t + 0.5 * h_{t-1} + 1)).
TEST(RNN, ActivationsAlphaAndClipByHand) {
  const Tensor x = F32({3, 1, 1}, {-2, 3, 1});
  const Tensor w = F32({1, 1, 1}, {2});
  const Tensor r = F32({1, 1, 1}, {0.5f});
  const Tensor b = F32({1, 2}, {1, 0});
  // Relu, clip 4: t0 relu(-3) = 0; t1 relu(clip(7)) = 4; t2 relu(clip(2 + 2 + 1 = 5)) = 4.
  auto out = RunNode(
      RecurrentNode("RNN", 4, {"Y"}, {{"activations", Strings({"Relu"})}, {"clip", FloatAttr(4)}}),
      {x, w, r, b});
  ExpectNear(out[0], {3, 1, 1, 1}, {0, 4, 4});
  // LeakyRelu alpha 0.1 (from activation_alpha): t0 -0.3; t1 7 - 0.15 = 6.85;
  // t2 2 + 3.425 + 1 = 6.425.
  out = RunNode(RecurrentNode("RNN", 4, {"Y"},
                              {{"activations", Strings({"LeakyRelu"})},
                               {"activation_alpha", FloatsAttr({0.1f})}}),
                {x, w, r, b});
  ExpectNear(out[0], {3, 1, 1, 1}, {-0.3f, 6.85f, 6.425f});
}

// input_forget couples the forget gate to the input gate: f = 1 - i.
TEST(LSTM, InputForgetByHand) {
  // One unit, W = 0, R = 0, biases: i 0 (i = 0.5), o large (o ~ 1), f ignored, c 0.5.
  // c~ = tanh(0.5); C_1 = 0.5 * C_0 + 0.5 * c~ with C_0 = 1; Y = tanh(C_1) * sigmoid(20).
  const Tensor x = F32({1, 1, 1}, {0});
  const Tensor w = F32({1, 4, 1}, {0, 0, 0, 0});
  const Tensor r = F32({1, 4, 1}, {0, 0, 0, 0});
  const Tensor b = F32({1, 8}, {0, 20, -20, 0.5f, 0, 0, 0, 0});
  const Tensor h0 = F32({1, 1, 1}, {0});
  const Tensor c0 = F32({1, 1, 1}, {1});
  auto out = RunNode(RecurrentNode("LSTM", 7, {"", "", "Y_c"}, {{"input_forget", IntAttr(1)}}),
                     {x, w, r, b, Tensor(), h0, c0});
  ASSERT_EQ(out.size(), 3u);
  ExpectNear(out[2], {1, 1, 1}, {0.5f + 0.5f * std::tanh(0.5f)});
}

// --- Errors name the attribute, its value and the expectation ----------------------------------

void ExpectError(const Node& node, const std::vector<Tensor>& inputs, const std::string& fragment,
                 int64_t opset = 14) {
  auto out = RunOp(node, inputs, opset);
  ASSERT_FALSE(out.ok()) << "expected an error containing '" << fragment << "'";
  EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument) << out.status().ToString();
  EXPECT_NE(out.status().message().find(fragment), std::string::npos)
      << out.status().ToString() << "\n  expected fragment: " << fragment;
}

TEST(Recurrent, BadAttributesRejectedByName) {
  const auto in = ForwardInputs(3);
  auto gru = [](std::map<std::string, Attribute> attrs) {
    return RecurrentNode("GRU", 6, {"Y"}, std::move(attrs));
  };
  ExpectError(gru({{"direction", StringAttr("sideways")}}), in,
              "direction='sideways' is not one of forward, reverse, bidirectional");
  ExpectError(gru({{"activations", Strings({"Sigmoid", "Swish"})}}), in,
              "activations contains 'Swish', which is not one of");
  ExpectError(gru({{"activations", Strings({"Sigmoid"})}}), in,
              "activations has 1 entries, expected 2 (2 per direction, forward)");
  ExpectError(gru({{"clip", FloatAttr(-1)}}), in, "clip=-1.000000 is not positive");
  ExpectError(gru({{"layout", IntAttr(2)}}), in, "layout=2 is not 0 or 1");
  ExpectError(gru({{"layout", IntAttr(1)}}), in, "attribute 'layout' exists from opset 14", 13);
  ExpectError(gru({{"linear_before_reset", IntAttr(3)}}), in,
              "linear_before_reset=3 is not 0 or 1");
  ExpectError(gru({{"hidden_size", IntAttr(5)}}), in, "hidden_size=5 but R [1,6,2]");
  ExpectError(gru({{"hidden_size", IntAttr(0)}}), in, "hidden_size=0 is below 1");
  ExpectError(gru({{"input_forget", IntAttr(1)}}), in, "attribute 'input_forget' is LSTM's only");
  ExpectError(RecurrentNode("LSTM", 3, {"Y"}, {{"linear_before_reset", IntAttr(1)}}),
              {Pat({kS, kB, kI}, 1), Pat({1, 4 * kH, kI}, 2), Pat({1, 4 * kH, kH}, 3)},
              "attribute 'linear_before_reset' is GRU's only");
  ExpectError(RecurrentNode("RNN", 6, {"Y", "Y_h", "Y_c"}), ForwardInputs(1),
              "has 3 outputs, expected 1 to 2");
}

TEST(Recurrent, BadInputsRejectedByName) {
  auto in = ForwardInputs(3);
  in[1] = Pat({1, 6, 4}, 2);
  ExpectError(RecurrentNode("GRU", 6, {"Y"}), in,
              "input 1 ('W') has shape [1,6,4], expected [1,6,3]");
  in = ForwardInputs(3);
  in[4] = I32({kB}, {3, 4});
  ExpectError(RecurrentNode("GRU", 6, {"Y"}), in, "sequence_lens[1]=4 is outside [0, 3]");
  in = ForwardInputs(3);
  in[5] = Pat({2, kB, kH}, 5);
  ExpectError(RecurrentNode("GRU", 6, {"Y"}), in,
              "input 5 ('initial_h') has shape [2,2,2], expected [1,2,2]");
}

}  // namespace
}  // namespace kiln
