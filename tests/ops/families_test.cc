// Tests for the op families beyond the core set: math_ops.cc, loss.cc, signal.cc, vision.cc,
// tensor_ops.cc, training.cc and random.cc. Expected values are worked by hand or with numpy
// (and agree with the ONNX node cases, which the conformance suite runs in full); error tests
// check the status code and that the message names what is wrong.
#include <cmath>
#include <string>
#include <vector>

#include "tests/ops/op_test_util.h"

namespace kiln {
namespace {

using testing::ExpectTensorNear;
using testing::F32;
using testing::FloatAttr;
using testing::I64;
using testing::IntAttr;
using testing::IntsAttr;
using testing::MakeNode;
using testing::RunOp;
using testing::StringAttr;

Tensor Bool(Shape shape, std::vector<uint8_t> v) {
  return Tensor::FromBytes(DType::kBool, std::move(shape), v.data(), v.size()).value();
}

Attribute StringsAttr(std::vector<std::string> v) {
  Attribute a;
  a.kind = Attribute::Kind::kStrings;
  a.strings = std::move(v);
  return a;
}

TEST(MathOps, TrigonometryAndHyperbolic) {
  const Tensor x = F32({3}, {-0.5f, 0.0f, 0.25f});
  struct Row {
    const char* op;
    double (*fn)(double);
  };
  const Row rows[] = {{"Acos", std::acos},   {"Asin", std::asin},   {"Atan", std::atan},
                      {"Asinh", std::asinh}, {"Atanh", std::atanh}, {"Cosh", std::cosh},
                      {"Sinh", std::sinh},   {"Tan", std::tan}};
  for (const Row& r : rows) {
    auto out = RunOp(MakeNode(r.op, 1), {x});
    ASSERT_TRUE(out.ok()) << r.op << ": " << out.status().ToString();
    std::vector<float> want;
    for (float v : {-0.5f, 0.0f, 0.25f}) want.push_back(static_cast<float>(r.fn(v)));
    ExpectTensorNear((*out)[0], F32({3}, want), 0, 1e-6);
  }
  auto acosh = RunOp(MakeNode("Acosh", 1), {F32({1}, {2.0f})});
  ASSERT_TRUE(acosh.ok());
  EXPECT_NEAR((*acosh)[0].data<float>()[0], std::acosh(2.0), 1e-6);
  // float64 keeps its type; an integer input is refused by name.
  auto dbl = RunOp(MakeNode("Sinh", 1), {Tensor::FromVector<double>({1}, {1.0})});
  ASSERT_TRUE(dbl.ok());
  EXPECT_EQ((*dbl)[0].dtype(), DType::kFloat64);
  EXPECT_DOUBLE_EQ((*dbl)[0].data<double>()[0], std::sinh(1.0));
  auto bad = RunOp(MakeNode("Tan", 1), {I64({1}, {1})});
  EXPECT_EQ(bad.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(bad.status().message().find("int64"), std::string::npos) << bad.status().message();
}

TEST(MathOps, IsInfIsNaNBitShiftDet) {
  const float inf = INFINITY;
  const Tensor x = F32({4}, {inf, -inf, NAN, 1.0f});
  auto inf_all = RunOp(MakeNode("IsInf", 1), {x});
  ASSERT_TRUE(inf_all.ok());
  EXPECT_EQ((*inf_all)[0].ToInt64Vector(), (std::vector<int64_t>{1, 1, 0, 0}));
  auto inf_neg = RunOp(MakeNode("IsInf", 1, 1, {{"detect_positive", IntAttr(0)}}), {x});
  ASSERT_TRUE(inf_neg.ok());
  EXPECT_EQ((*inf_neg)[0].ToInt64Vector(), (std::vector<int64_t>{0, 1, 0, 0}));
  auto nan = RunOp(MakeNode("IsNaN", 1), {x});
  ASSERT_TRUE(nan.ok());
  EXPECT_EQ((*nan)[0].ToInt64Vector(), (std::vector<int64_t>{0, 0, 1, 0}));

  const Tensor a = Tensor::FromVector<uint8_t>({3}, {16, 4, 1});
  const Tensor s = Tensor::FromVector<uint8_t>({3}, {1, 2, 9});
  auto right = RunOp(MakeNode("BitShift", 2, 1, {{"direction", StringAttr("RIGHT")}}), {a, s});
  ASSERT_TRUE(right.ok());
  EXPECT_EQ((*right)[0].ToInt64Vector(), (std::vector<int64_t>{8, 1, 0}));
  auto left = RunOp(MakeNode("BitShift", 2, 1, {{"direction", StringAttr("LEFT")}}), {a, s});
  ASSERT_TRUE(left.ok());
  EXPECT_EQ((*left)[0].ToInt64Vector(), (std::vector<int64_t>{32, 16, 0}));  // 1 << 9 is 0
  auto up = RunOp(MakeNode("BitShift", 2, 1, {{"direction", StringAttr("UP")}}), {a, s});
  EXPECT_EQ(up.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(up.status().message().find("'UP'"), std::string::npos);

  // det [[1,2],[3,4]] = -2; det of a 3x3 needing a pivot swap = 1.
  auto det = RunOp(MakeNode("Det", 1),
                   {F32({2, 3, 3}, {1, 2, 0, 3, 4, 0, 0, 0, 1, 0, 1, 0, 1, 0, 0, 0, 0, -1})});
  ASSERT_TRUE(det.ok());
  ExpectTensorNear((*det)[0], F32({2}, {-2.0f, 1.0f}));
}

TEST(LossOps, NegativeLogLikelihoodAndSoftmaxCrossEntropy) {
  // input [N=2, C=3], target [2]; weights [3]; ignore_index 1 drops the second row.
  const Tensor in = F32({2, 3}, {-1.0f, -2.0f, -3.0f, -0.5f, -1.5f, -2.5f});
  const Tensor target = I64({2}, {2, 1});
  auto none =
      RunOp(MakeNode("NegativeLogLikelihoodLoss", 2, 1, {{"reduction", StringAttr("none")}}),
            {in, target});
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  ExpectTensorNear((*none)[0], F32({2}, {3.0f, 1.5f}));
  auto mean = RunOp(MakeNode("NegativeLogLikelihoodLoss", 3), {in, target, F32({3}, {1, 2, 4})});
  ASSERT_TRUE(mean.ok());
  ExpectTensorNear((*mean)[0], F32({}, {(3.0f * 4 + 1.5f * 2) / 6.0f}));
  auto ignored = RunOp(MakeNode("NegativeLogLikelihoodLoss", 2, 1, {{"ignore_index", IntAttr(1)}}),
                       {in, target});
  ASSERT_TRUE(ignored.ok());
  ExpectTensorNear((*ignored)[0], F32({}, {3.0f}));
  auto out_of_range = RunOp(MakeNode("NegativeLogLikelihoodLoss", 2), {in, I64({2}, {3, 0})});
  EXPECT_EQ(out_of_range.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(out_of_range.status().message().find("target 3"), std::string::npos);

  // SoftmaxCrossEntropyLoss = NLL of log_softmax; its second output is the log-probabilities.
  const Tensor scores = F32({1, 2}, {0.0f, 0.0f});
  auto sce = RunOp(MakeNode("SoftmaxCrossEntropyLoss", 2, 2), {scores, I64({1}, {0})});
  ASSERT_TRUE(sce.ok()) << sce.status().ToString();
  ExpectTensorNear((*sce)[0], F32({}, {std::log(2.0f)}));
  ExpectTensorNear((*sce)[1], F32({1, 2}, {-std::log(2.0f), -std::log(2.0f)}));
}

TEST(SignalOps, WindowsDftStft) {
  auto hann = RunOp(MakeNode("HannWindow", 1), {I64({}, {4})}, 17);
  ASSERT_TRUE(hann.ok()) << hann.status().ToString();
  ExpectTensorNear((*hann)[0], F32({4}, {0.0f, 0.5f, 1.0f, 0.5f}), 1e-6);
  auto sym = RunOp(MakeNode("HannWindow", 1, 1, {{"periodic", IntAttr(0)}}), {I64({}, {3})}, 17);
  ASSERT_TRUE(sym.ok());
  ExpectTensorNear((*sym)[0], F32({3}, {0.0f, 1.0f, 0.0f}), 1e-6);
  auto blackman = RunOp(MakeNode("BlackmanWindow", 1), {I64({}, {2})}, 17);
  ASSERT_TRUE(blackman.ok());
  ExpectTensorNear((*blackman)[0], F32({2}, {0.0f, 1.0f}), 1e-6);

  // DFT of [1, 2, 3, 4] (real, one batch): [10, -2+2i, -2, -2-2i]; inverse gives it back.
  const Tensor x = F32({1, 4, 1}, {1, 2, 3, 4});
  auto dft = RunOp(MakeNode("DFT", 1), {x}, 17);
  ASSERT_TRUE(dft.ok()) << dft.status().ToString();
  ExpectTensorNear((*dft)[0], F32({1, 4, 2}, {10, 0, -2, 2, -2, 0, -2, -2}), 1e-5);
  auto onesided = RunOp(MakeNode("DFT", 1, 1, {{"onesided", IntAttr(1)}}), {x}, 17);
  ASSERT_TRUE(onesided.ok());
  EXPECT_EQ((*onesided)[0].shape(), (Shape{1, 3, 2}));
  auto inverse = RunOp(MakeNode("DFT", 1, 1, {{"inverse", IntAttr(1)}}), {(*dft)[0]}, 17);
  ASSERT_TRUE(inverse.ok());
  ExpectTensorNear((*inverse)[0], F32({1, 4, 2}, {1, 0, 2, 0, 3, 0, 4, 0}), 1e-5);

  // STFT frames of 4 every 2 over 8 samples: 3 frames of 3 one-sided bins.
  auto stft =
      RunOp(MakeNode("STFT", 4),
            {F32({1, 8, 1}, {1, 1, 1, 1, 1, 1, 1, 1}), I64({}, {2}), Tensor(), I64({}, {4})}, 17);
  ASSERT_TRUE(stft.ok()) << stft.status().ToString();
  EXPECT_EQ((*stft)[0].shape(), (Shape{1, 3, 3, 2}));
  EXPECT_NEAR((*stft)[0].data<float>()[0], 4.0f, 1e-6);  // DC of four ones
  EXPECT_NEAR((*stft)[0].data<float>()[2], 0.0f, 1e-6);
}

TEST(VisionOps, GridSampleRoiAlignNms) {
  // A 2x2 image sampled at its centre (bilinear, align_corners=1): the mean.
  const Tensor img = F32({1, 1, 2, 2}, {1, 2, 3, 4});
  auto centre = RunOp(MakeNode("GridSample", 2, 1, {{"align_corners", IntAttr(1)}}),
                      {img, F32({1, 1, 1, 2}, {0, 0})}, 16);
  ASSERT_TRUE(centre.ok()) << centre.status().ToString();
  ExpectTensorNear((*centre)[0], F32({1, 1, 1, 1}, {2.5f}));
  // Corners with align_corners=1 hit pixels exactly; outside with zeros padding reads 0.
  auto corners = RunOp(MakeNode("GridSample", 2, 1, {{"align_corners", IntAttr(1)}}),
                       {img, F32({1, 1, 3, 2}, {-1, -1, 1, 1, 3, 3})}, 16);
  ASSERT_TRUE(corners.ok());
  ExpectTensorNear((*corners)[0], F32({1, 1, 1, 3}, {1, 4, 0}));
  auto border =
      RunOp(MakeNode("GridSample", 2, 1,
                     {{"align_corners", IntAttr(1)}, {"padding_mode", StringAttr("border")}}),
            {img, F32({1, 1, 1, 2}, {3, 3})}, 16);
  ASSERT_TRUE(border.ok());
  ExpectTensorNear((*border)[0], F32({1, 1, 1, 1}, {4}));

  // RoiAlign over a constant image averages to the constant.
  auto roi = RunOp(
      MakeNode("RoiAlign", 3, 1,
               {{"output_height", IntAttr(2)},
                {"output_width", IntAttr(2)},
                {"sampling_ratio", IntAttr(2)}}),
      {F32({1, 1, 4, 4}, std::vector<float>(16, 3.0f)), F32({1, 4}, {0, 0, 3, 3}), I64({1}, {0})},
      16);
  ASSERT_TRUE(roi.ok()) << roi.status().ToString();
  ExpectTensorNear((*roi)[0], F32({1, 1, 2, 2}, {3, 3, 3, 3}));

  // NMS: two overlapping boxes (IoU 0.81) and a far one; the weaker overlap is suppressed.
  const Tensor boxes = F32({1, 3, 4}, {0, 0, 1, 1, 0, 0.1f, 1, 1.1f, 0, 5, 1, 6});
  const Tensor scores = F32({1, 1, 3}, {0.9f, 0.8f, 0.7f});
  auto nms = RunOp(MakeNode("NonMaxSuppression", 5),
                   {boxes, scores, I64({1}, {3}), F32({1}, {0.5f}), F32({1}, {0.0f})}, 11);
  ASSERT_TRUE(nms.ok()) << nms.status().ToString();
  EXPECT_EQ((*nms)[0].shape(), (Shape{2, 3}));
  EXPECT_EQ((*nms)[0].ToInt64Vector(), (std::vector<int64_t>{0, 0, 0, 0, 0, 2}));
}

TEST(VisionOps, MaxUnpoolLrnLpPool) {
  auto unpool = RunOp(MakeNode("MaxUnpool", 2, 1,
                               {{"kernel_shape", IntsAttr({2, 2})}, {"strides", IntsAttr({2, 2})}}),
                      {F32({1, 1, 1, 1}, {7}), I64({1, 1, 1, 1}, {3})}, 11);
  ASSERT_TRUE(unpool.ok()) << unpool.status().ToString();
  ExpectTensorNear((*unpool)[0], F32({1, 1, 2, 2}, {0, 0, 0, 7}));
  auto lrn = RunOp(MakeNode("LRN", 1, 1,
                            {{"size", IntAttr(1)},
                             {"alpha", FloatAttr(1.0f)},
                             {"beta", FloatAttr(1.0f)},
                             {"bias", FloatAttr(1.0f)}}),
                   {F32({1, 1, 1, 1}, {2})});
  ASSERT_TRUE(lrn.ok());
  ExpectTensorNear((*lrn)[0], F32({1, 1, 1, 1}, {2.0f / 5.0f}));
  auto lp = RunOp(MakeNode("LpPool", 1, 1, {{"kernel_shape", IntsAttr({2})}, {"p", IntAttr(2)}}),
                  {F32({1, 1, 3}, {3, 4, 0})});
  ASSERT_TRUE(lp.ok()) << lp.status().ToString();
  ExpectTensorNear((*lp)[0], F32({1, 1, 2}, {5, 4}));
  auto glp = RunOp(MakeNode("GlobalLpPool", 1, 1, {{"p", IntAttr(1)}}),
                   {F32({1, 1, 2, 2}, {1, -2, 3, -4})});
  ASSERT_TRUE(glp.ok());
  ExpectTensorNear((*glp)[0], F32({1, 1, 1, 1}, {10}));
}

TEST(TensorOps, CompressReverseSequenceUniqueCastLike) {
  const Tensor x = F32({3, 2}, {1, 2, 3, 4, 5, 6});
  auto comp = RunOp(MakeNode("Compress", 2, 1, {{"axis", IntAttr(0)}}), {x, Bool({2}, {0, 1})});
  ASSERT_TRUE(comp.ok()) << comp.status().ToString();
  ExpectTensorNear((*comp)[0], F32({1, 2}, {3, 4}));
  auto flat = RunOp(MakeNode("Compress", 2), {x, Bool({3}, {1, 0, 1})});
  ASSERT_TRUE(flat.ok());
  ExpectTensorNear((*flat)[0], F32({2}, {1, 3}));

  // [time=3, batch=2]; batch 0 reverses its first 2 steps, batch 1 all 3.
  auto rev = RunOp(MakeNode("ReverseSequence", 2), {x, I64({2}, {2, 3})}, 10);
  ASSERT_TRUE(rev.ok()) << rev.status().ToString();
  ExpectTensorNear((*rev)[0], F32({3, 2}, {3, 6, 1, 4, 5, 2}));

  auto uniq = RunOp(MakeNode("Unique", 1, 4), {F32({5}, {2, 1, 1, 3, 2})}, 11);
  ASSERT_TRUE(uniq.ok()) << uniq.status().ToString();
  ExpectTensorNear((*uniq)[0], F32({3}, {1, 2, 3}));
  EXPECT_EQ((*uniq)[1].ToInt64Vector(), (std::vector<int64_t>{1, 0, 3}));
  EXPECT_EQ((*uniq)[2].ToInt64Vector(), (std::vector<int64_t>{1, 0, 0, 2, 1}));
  EXPECT_EQ((*uniq)[3].ToInt64Vector(), (std::vector<int64_t>{2, 2, 1}));
  auto unsorted =
      RunOp(MakeNode("Unique", 1, 1, {{"sorted", IntAttr(0)}}), {F32({5}, {2, 1, 1, 3, 2})}, 11);
  ASSERT_TRUE(unsorted.ok());
  ExpectTensorNear((*unsorted)[0], F32({3}, {2, 1, 3}));

  auto cast = RunOp(MakeNode("CastLike", 2), {F32({2}, {1.7f, -2.5f}), I64({0}, {})}, 15);
  ASSERT_TRUE(cast.ok());
  EXPECT_EQ((*cast)[0].ToInt64Vector(), (std::vector<int64_t>{1, -2}));
}

TEST(TensorOps, DynamicQuantizeAndTfIdf) {
  // Range [-255, 255]: scale 2, zero point round(127.5) = 128 (halves to even), saturating.
  auto q = RunOp(MakeNode("DynamicQuantizeLinear", 1, 3), {F32({3}, {0, 255, -255})}, 11);
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  EXPECT_EQ((*q)[1].data<float>()[0], 2.0f);
  EXPECT_EQ((*q)[2].GetAsInt64(0), 128);
  EXPECT_EQ((*q)[0].ToInt64Vector(), (std::vector<int64_t>{128, 255, 0}));

  // Bigrams (2,3) and (3,4) with a unigram 5; counts in columns 0..2.
  Node tfidf = MakeNode("TfIdfVectorizer", 1, 1,
                        {{"mode", StringAttr("TF")},
                         {"min_gram_length", IntAttr(1)},
                         {"max_gram_length", IntAttr(2)},
                         {"max_skip_count", IntAttr(0)},
                         {"ngram_counts", IntsAttr({0, 1})},
                         {"ngram_indexes", IntsAttr({2, 0, 1})},
                         {"pool_int64s", IntsAttr({5, 2, 3, 3, 4})}});
  auto tf = RunOp(tfidf, {Tensor::FromVector<int32_t>({6}, {2, 3, 4, 5, 2, 3})}, 9);
  ASSERT_TRUE(tf.ok()) << tf.status().ToString();
  ExpectTensorNear((*tf)[0], F32({3}, {2, 1, 1}));
}

TEST(TensorOps, StringsThroughCastAndStringNormalizer) {
  const Tensor words = Tensor::Strings({3}, {"Monday", "tuesday", "Straße"}).value();
  auto norm = RunOp(MakeNode("StringNormalizer", 1, 1,
                             {{"case_change_action", StringAttr("UPPER")},
                              {"stopwords", StringsAttr({"monday"})}}),
                    {words}, 10);
  ASSERT_TRUE(norm.ok()) << norm.status().ToString();
  ASSERT_EQ((*norm)[0].shape(), (Shape{2}));
  EXPECT_EQ((*norm)[0].str(0), "TUESDAY");
  EXPECT_EQ((*norm)[0].str(1), "STRAßE");
  auto all_dropped = RunOp(MakeNode("StringNormalizer", 1, 1, {{"stopwords", StringsAttr({"a"})}}),
                           {Tensor::Strings({1}, {"A"}).value()}, 10);
  ASSERT_TRUE(all_dropped.ok());
  ASSERT_EQ((*all_dropped)[0].shape(), (Shape{1}));
  EXPECT_EQ((*all_dropped)[0].str(0), "");

  // float32 -> string prints the shortest decimal that reads back; string -> float32 parses.
  auto to_text = RunOp(MakeNode("Cast", 1, 1, {{"to", IntAttr(8)}}), {F32({2}, {0.1f, -2.5f})});
  ASSERT_TRUE(to_text.ok()) << to_text.status().ToString();
  EXPECT_EQ((*to_text)[0].str(0), "0.1");
  EXPECT_EQ((*to_text)[0].str(1), "-2.5");
  auto from_text = RunOp(MakeNode("Cast", 1, 1, {{"to", IntAttr(1)}}),
                         {Tensor::Strings({2}, {"1e3", "-INF"}).value()});
  ASSERT_TRUE(from_text.ok());
  EXPECT_EQ((*from_text)[0].data<float>()[0], 1000.0f);
  EXPECT_EQ((*from_text)[0].data<float>()[1], -INFINITY);
}

TEST(TensorOps, BFloat16Casts) {
  // 1 + 2^-8 + 2^-9 rounds up to 1 + 2^-7 (nearest) from opset 19, truncates to 1 before.
  const float x = 1.0f + 0.00390625f + 0.001953125f;
  auto rounded = RunOp(MakeNode("Cast", 1, 1, {{"to", IntAttr(16)}}), {F32({1}, {x})}, 19);
  ASSERT_TRUE(rounded.ok()) << rounded.status().ToString();
  EXPECT_EQ((*rounded)[0].dtype(), DType::kBFloat16);
  EXPECT_EQ((*rounded)[0].GetAsDouble(0), 1.0078125);
  auto truncated = RunOp(MakeNode("Cast", 1, 1, {{"to", IntAttr(16)}}), {F32({1}, {x})}, 13);
  ASSERT_TRUE(truncated.ok());
  EXPECT_EQ((*truncated)[0].GetAsDouble(0), 1.0);
  // Arithmetic runs in float32 and rounds once.
  auto sum = RunOp(MakeNode("Add", 2), {(*rounded)[0], (*rounded)[0]}, 19);
  ASSERT_TRUE(sum.ok()) << sum.status().ToString();
  EXPECT_EQ((*sum)[0].GetAsDouble(0), 2.015625);
}

TEST(TrainingOps, AdagradMomentumAdam) {
  Node adagrad = MakeNode("Adagrad", 5, 2, {{"epsilon", FloatAttr(0.0f)}});
  adagrad.domain = "ai.onnx.preview.training";
  // h = 0 + 4 = 4; x = 1 - 0.5 * 2 / 2 = 0.5.
  auto a = RunOp(adagrad,
                 {F32({}, {0.5f}), I64({}, {0}), F32({1}, {1}), F32({1}, {2}), F32({1}, {0})}, 1);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ExpectTensorNear((*a)[0], F32({1}, {0.5f}));
  ExpectTensorNear((*a)[1], F32({1}, {4}));

  Node momentum = MakeNode("Momentum", 5, 2,
                           {{"alpha", FloatAttr(0.5f)},
                            {"beta", FloatAttr(1.0f)},
                            {"mode", StringAttr("standard")},
                            {"norm_coefficient", FloatAttr(0.0f)}});
  momentum.domain = "ai.onnx.preview.training";
  // v = 0.5 * 2 + 1 * 1 = 2; x = 1 - 0.1 * 2 = 0.8.
  auto m = RunOp(momentum,
                 {F32({}, {0.1f}), I64({}, {1}), F32({1}, {1}), F32({1}, {1}), F32({1}, {2})}, 1);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ExpectTensorNear((*m)[0], F32({1}, {0.8f}));
  ExpectTensorNear((*m)[1], F32({1}, {2}));

  Node adam = MakeNode(
      "Adam", 6, 3,
      {{"alpha", FloatAttr(0.5f)}, {"beta", FloatAttr(0.5f)}, {"epsilon", FloatAttr(0.0f)}});
  adam.domain = "ai.onnx.preview.training";
  // T = 0: no bias correction. v = 0.5*0 + 0.5*2 = 1; h = 0.5*0 + 0.5*4 = 2; x = 1 - 1 * 1/sqrt2.
  auto d = RunOp(
      adam,
      {F32({}, {1}), I64({}, {0}), F32({1}, {1}), F32({1}, {2}), F32({1}, {0}), F32({1}, {0})}, 1);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  ExpectTensorNear((*d)[0], F32({1}, {1.0f - 1.0f / std::sqrt(2.0f)}));
  ExpectTensorNear((*d)[1], F32({1}, {1}));
  ExpectTensorNear((*d)[2], F32({1}, {2}));
  // Inputs must come in whole groups.
  Node broken = MakeNode("Adam", 5, 3);
  broken.domain = "ai.onnx.preview.training";
  EXPECT_EQ(RunOp(broken, {}, 1).status().code(), StatusCode::kInvalidArgument);
}

TEST(RandomOps, SeededDrawsRepeatAndStayInSupport) {
  const Tensor p = F32({64}, std::vector<float>(64, 0.5f));
  Node bern = MakeNode("Bernoulli", 1, 1, {{"seed", FloatAttr(7.0f)}});
  auto a = RunOp(bern, {p}, 15);
  auto b = RunOp(bern, {p}, 15);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status().ToString();
  EXPECT_EQ((*a)[0].ToInt64Vector(), (*b)[0].ToInt64Vector());  // same seed, same draws
  int64_t ones = 0;
  for (int64_t v : (*a)[0].ToInt64Vector()) {
    ASSERT_TRUE(v == 0 || v == 1);
    ones += v;
  }
  EXPECT_GT(ones, 10);
  EXPECT_LT(ones, 54);
  auto other = RunOp(MakeNode("Bernoulli", 1, 1, {{"seed", FloatAttr(8.0f)}}), {p}, 15);
  ASSERT_TRUE(other.ok());
  EXPECT_NE((*a)[0].ToInt64Vector(), (*other)[0].ToInt64Vector());
  auto uni = RunOp(
      MakeNode("RandomUniform", 0, 1,
               {{"shape", IntsAttr({100})}, {"low", FloatAttr(2.0f)}, {"high", FloatAttr(3.0f)}}),
      {}, 15);
  ASSERT_TRUE(uni.ok()) << uni.status().ToString();
  for (int64_t i = 0; i < 100; ++i) {
    const float v = (*uni)[0].data<float>()[i];
    ASSERT_TRUE(v >= 2.0f && v < 3.0f) << v;
  }
  EXPECT_TRUE(OpRegistry::Global().Find("", "Bernoulli", 15).value()->nondeterministic);
  EXPECT_FALSE(OpRegistry::Global().Find("", "Add", 15).value()->nondeterministic);
}

}  // namespace
}  // namespace kiln
