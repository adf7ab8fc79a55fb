// Tests for the Resize op family (src/kiln/ops/resize.cc): linear (including trilinear), cubic
// (cubic_coeff_a, exclude_outside) and nearest with every nearest_mode, under each
// coordinate_transformation_mode, from scales or sizes; tf_crop_and_resize with roi and
// extrapolation_value; the legacy Upsample / Resize-10 forms and Resize-18 axes; and attribute
// errors asserting code and message fragment.
//
// Expected values of the ResizeCases table were produced once by the reference implementation in
// python3-onnx 1.12 (onnx/backend/test/case/node/resize.py, interpolate_nd) for these inputs and
// written here as literals. To add a case: append a ResizeCase with literal expected values.
#include <map>
#include <string>
#include <vector>

#include "tests/ops/op_test_util.h"

namespace kiln {
namespace {

using testing::F32;
using testing::FloatAttr;
using testing::FloatsAttr;
using testing::I64;
using testing::IntAttr;
using testing::IntsAttr;
using testing::MakeNode;
using testing::RunOp;

Attribute Str(const char* s) { return testing::StringAttr(s); }

// [1,1,2,2] = 1..4, [1,1,4,4] = 1..16, [1,1,2,4] = 1..8, [2,3,4] = 0, 0.5, ..., 11.5.
const Tensor k22 = F32({1, 1, 2, 2}, {1, 2, 3, 4});
const Tensor k44 = F32({1, 1, 4, 4}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16});
const Tensor k24 = F32({1, 1, 2, 4}, {1, 2, 3, 4, 5, 6, 7, 8});
Tensor Iota234Halves() {
  std::vector<float> v;
  for (int i = 0; i < 24; ++i) v.push_back(0.5f * static_cast<float>(i));
  return F32({2, 3, 4}, v);
}
const Tensor k234 = Iota234Halves();

struct ResizeCase {
  std::string name;
  std::vector<Tensor> inputs;  // X, roi, scales, sizes; an invalid Tensor() is omitted
  Tensor expected;
  std::map<std::string, Attribute> attrs = {};
  int64_t opset = 13;
  std::string op = "Resize";
};

void PrintTo(const ResizeCase& c, std::ostream* os) { *os << c.name; }

class ResizeCases : public ::testing::TestWithParam<ResizeCase> {};

TEST_P(ResizeCases, MatchesOnnxReference) {
  const ResizeCase& c = GetParam();
  auto out = RunOp(MakeNode(c.op, c.inputs.size(), 1, c.attrs), c.inputs, c.opset);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  testing::ExpectTensorNear((*out)[0], c.expected, 1e-5, 1e-5);
}

std::vector<ResizeCase> OnnxReferenceCases() {
  return {
      {"LinearUpHalfPixel",
       {k22, Tensor(), F32({4}, {1, 1, 2, 2}), Tensor()},
       F32({1, 1, 4, 4}, {1, 1.25f, 1.75f, 2, 1.5f, 1.75f, 2.25f, 2.5f, 2.5f, 2.75f, 3.25f, 3.5f, 3,
                          3.25f, 3.75f, 4}),
       {{"mode", Str("linear")}}},
      {"LinearUpAlignCorners",
       {k22, Tensor(), F32({4}, {1, 1, 2, 2}), Tensor()},
       F32({1, 1, 4, 4}, {1, 1.3333334f, 1.6666666f, 2, 1.6666666f, 2, 2.3333333f, 2.6666667f,
                          2.3333333f, 2.6666667f, 3, 3.3333333f, 3, 3.3333333f, 3.6666667f, 4}),
       {{"mode", Str("linear")}, {"coordinate_transformation_mode", Str("align_corners")}}},
      {"LinearDownAlignCorners",
       {k24, Tensor(), F32({4}, {1, 1, 0.6f, 0.6f}), Tensor()},
       F32({1, 1, 1, 2}, {1, 3.142857f}),
       {{"mode", Str("linear")}, {"coordinate_transformation_mode", Str("align_corners")}}},
      {"LinearDownHalfPixel",
       {k24, Tensor(), F32({4}, {1, 1, 0.6f, 0.6f}), Tensor()},
       F32({1, 1, 1, 2}, {2.6666665f, 4.333333f}),
       {{"mode", Str("linear")}}},
      {"LinearPytorchHalfPixelSizes",
       {k44, Tensor(), Tensor(), I64({4}, {1, 1, 3, 1})},
       F32({1, 1, 3, 1}, {1.6666666f, 7, 12.333333f}),
       {{"mode", Str("linear")}, {"coordinate_transformation_mode", Str("pytorch_half_pixel")}}},
      {"TrilinearSizes",
       {k234, Tensor(), Tensor(), I64({3}, {3, 5, 3})},
       F32({3, 5, 3},
           {0.083333336f, 0.75f,      1.4166666f, 0.8833333f, 1.55f,      2.2166667f, 2.0833333f,
            2.75f,        3.4166667f, 3.2833333f, 3.95f,      4.616667f,  4.0833335f, 4.75f,
            5.4166665f,   3.0833333f, 3.75f,      4.4166665f, 3.8833334f, 4.55f,      5.2166667f,
            5.0833335f,   5.75f,      6.4166665f, 6.2833333f, 6.95f,      7.616667f,  7.0833335f,
            7.75f,        8.416667f,  6.0833335f, 6.75f,      7.4166665f, 6.883333f,  7.55f,
            8.216666f,    8.083333f,  8.75f,      9.416667f,  9.283334f,  9.95f,      10.616667f,
            10.083333f,   10.75f,     11.416667f}),
       {{"mode", Str("linear")}}},
      {"CubicUpHalfPixel",
       {k44, Tensor(), F32({4}, {1, 1, 2, 2}), Tensor()},
       F32({1, 1, 8, 8},
           {0.47265625f, 0.76953125f, 1.2460938f, 1.875f,     2.28125f,   2.9101562f, 3.3867188f,
            3.6835938f,  1.6601562f,  1.9570312f, 2.4335938f, 3.0625f,    3.46875f,   4.0976562f,
            4.5742188f,  4.8710938f,  3.5664062f, 3.8632812f, 4.3398438f, 4.96875f,   5.375f,
            6.0039062f,  6.4804688f,  6.7773438f, 6.0820312f, 6.3789062f, 6.8554688f, 7.484375f,
            7.890625f,   8.519531f,   8.996094f,  9.292969f,  7.7070312f, 8.003906f,  8.480469f,
            9.109375f,   9.515625f,   10.144531f, 10.621094f, 10.917969f, 10.222656f, 10.519531f,
            10.996094f,  11.625f,     12.03125f,  12.660156f, 13.136719f, 13.433594f, 12.128906f,
            12.425781f,  12.902344f,  13.53125f,  13.9375f,   14.566406f, 15.042969f, 15.339844f,
            13.316406f,  13.613281f,  14.089844f, 14.71875f,  15.125f,    15.753906f, 16.230469f,
            16.527344f}),
       {{"mode", Str("cubic")}}},
      {"CubicUpAMinusHalfExcludeOutside",
       {k44, Tensor(), F32({4}, {1, 1, 2, 2}), Tensor()},
       F32({1, 1, 8, 8},
           {0.5588235f, 0.81494206f, 1.3569825f, 1.8970588f,  2.3970587f,  2.9371352f,  3.4791756f,
            3.735294f,  1.5832976f,  1.839416f,  2.3814566f,  2.9215329f,  3.4215329f,  3.9616091f,
            4.5036497f, 4.759768f,   3.7514594f, 4.007578f,   4.5496182f,  5.0896945f,  5.5896945f,
            6.1297708f, 6.6718116f,  6.92793f,   5.9117646f,  6.1678834f,  6.7099237f,  7.25f,
            7.75f,      8.290076f,   8.832117f,  9.088235f,   7.9117646f,  8.167883f,   8.709924f,
            9.25f,      9.75f,       10.290076f, 10.832117f,  11.088235f,  10.07207f,   10.328189f,
            10.870229f, 11.410305f,  11.910305f, 12.450381f,  12.992422f,  13.248541f,  12.2402315f,
            12.49635f,  13.038391f,  13.578467f, 14.078467f,  14.618544f,  15.1605835f, 15.416702f,
            13.264706f, 13.520824f,  14.062865f, 14.6029415f, 15.1029415f, 15.643018f,  16.185059f,
            16.441177f}),
       {{"mode", Str("cubic")},
        {"cubic_coeff_a", FloatAttr(-0.5f)},
        {"exclude_outside", IntAttr(1)}}},
      {"CubicDownAMinusHalfExcludeOutside",
       {k44, Tensor(), F32({4}, {1, 1, 0.8f, 0.8f}), Tensor()},
       F32({1, 1, 3, 3}, {1.3681267f, 2.6695013f, 4.0133367f, 6.573625f, 7.875f, 9.218835f,
                          11.948966f, 13.250341f, 14.594176f}),
       {{"mode", Str("cubic")},
        {"cubic_coeff_a", FloatAttr(-0.5f)},
        {"exclude_outside", IntAttr(1)}}},
      {"CubicUpAsymmetric",
       {k44, Tensor(), F32({4}, {1, 1, 2, 2}), Tensor()},
       F32({1, 1, 8, 8},
           {1,       1.40625f,  2,       2.5f,    3,       3.59375f,  4,       4.09375f,
            2.625f,  3.03125f,  3.625f,  4.125f,  4.625f,  5.21875f,  5.625f,  5.71875f,
            5,       5.40625f,  6,       6.5f,    7,       7.59375f,  8,       8.09375f,
            7,       7.40625f,  8,       8.5f,    9,       9.59375f,  10,      10.09375f,
            9,       9.40625f,  10,      10.5f,   11,      11.59375f, 12,      12.09375f,
            11.375f, 11.78125f, 12.375f, 12.875f, 13.375f, 13.96875f, 14.375f, 14.46875f,
            13,      13.40625f, 14,      14.5f,   15,      15.59375f, 16,      16.09375f,
            13.375f, 13.78125f, 14.375f, 14.875f, 15.375f, 15.96875f, 16.375f, 16.46875f}),
       {{"mode", Str("cubic")}, {"coordinate_transformation_mode", Str("asymmetric")}}},
      {"CubicDownSizes",
       {k44, Tensor(), Tensor(), I64({4}, {1, 1, 3, 3})},
       F32({1, 1, 3, 3}, {1.630787f, 3.0046296f, 4.3784723f, 7.1261573f, 8.5f, 9.873842f,
                          12.621528f, 13.99537f, 15.369213f}),
       {{"mode", Str("cubic")}}},
      {"TfCropAndResize",
       {k44, F32({8}, {0, 0, 0.4f, 0.6f, 1, 1, 0.6f, 0.8f}), Tensor(), I64({4}, {1, 1, 3, 3})},
       F32({1, 1, 3, 3}, {7.6000004f, 7.9f, 8.2f, 8.8f, 9.1f, 9.400001f, 10, 10.3f, 10.6f}),
       {{"mode", Str("linear")}, {"coordinate_transformation_mode", Str("tf_crop_and_resize")}}},
      {"TfCropAndResizeExtrapolation",
       {k44, F32({8}, {0, 0, 0.4f, 0.6f, 1, 1, 1.2f, 1.7f}), Tensor(), I64({4}, {1, 1, 3, 3})},
       F32({1, 1, 3, 3}, {7.6000004f, 10, 10, 12.400001f, 10, 10, 10, 10, 10}),
       {{"mode", Str("linear")},
        {"coordinate_transformation_mode", Str("tf_crop_and_resize")},
        {"extrapolation_value", FloatAttr(10)}}},
      {"NearestFloorAlignCorners",
       {k44, Tensor(), Tensor(), I64({4}, {1, 1, 8, 8})},
       F32({1, 1, 8, 8},
           {1,  1,  1,  2,  2, 3, 3, 4,  1,  1,  1,  2,  2,  3,  3,  4,  1,  1,  1,  2, 2, 3,
            3,  4,  5,  5,  5, 6, 6, 7,  7,  8,  5,  5,  5,  6,  6,  7,  7,  8,  9,  9, 9, 10,
            10, 11, 11, 12, 9, 9, 9, 10, 10, 11, 11, 12, 13, 13, 13, 14, 14, 15, 15, 16}),
       {{"coordinate_transformation_mode", Str("align_corners")}, {"nearest_mode", Str("floor")}}},
      {"NearestRoundPreferCeilAsymmetric",
       {k44, Tensor(), Tensor(), I64({4}, {1, 1, 8, 8})},
       F32({1, 1, 8, 8},
           {1,  2,  2,  3,  3,  4,  4,  4,  5,  6,  6,  7,  7,  8,  8,  8,  5,  6,  6,  7,  7,  8,
            8,  8,  9,  10, 10, 11, 11, 12, 12, 12, 9,  10, 10, 11, 11, 12, 12, 12, 13, 14, 14, 15,
            15, 16, 16, 16, 13, 14, 14, 15, 15, 16, 16, 16, 13, 14, 14, 15, 15, 16, 16, 16}),
       {{"coordinate_transformation_mode", Str("asymmetric")},
        {"nearest_mode", Str("round_prefer_ceil")}}},
      {"NearestCeilHalfPixel",
       {k44, Tensor(), Tensor(), I64({4}, {1, 1, 8, 8})},
       F32({1, 1, 8, 8},
           {1,  2,  2,  3,  3,  4,  4,  4,  5,  6,  6,  7,  7,  8,  8,  8,  5,  6,  6,  7,  7,  8,
            8,  8,  9,  10, 10, 11, 11, 12, 12, 12, 9,  10, 10, 11, 11, 12, 12, 12, 13, 14, 14, 15,
            15, 16, 16, 16, 13, 14, 14, 15, 15, 16, 16, 16, 13, 14, 14, 15, 15, 16, 16, 16}),
       {{"nearest_mode", Str("ceil")}}},
      {"NearestDownScales",
       {k24, Tensor(), F32({4}, {1, 1, 0.6f, 0.6f}), Tensor()},
       F32({1, 1, 1, 2}, {1, 3}),
       {}},
      {"NearestUpSizesDefaults",
       {k22, Tensor(), Tensor(), I64({4}, {1, 1, 7, 8})},
       F32({1, 1, 7, 8},
           {1, 1, 1, 1, 2, 2, 2, 2, 1, 1, 1, 1, 2, 2, 2, 2, 1, 1, 1, 1, 2, 2, 2, 2, 1, 1, 1, 1,
            2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 3, 3, 3, 3, 4, 4, 4, 4, 3, 3, 3, 3, 4, 4, 4, 4}),
       {}},
      {"NearestTfCropAndResizeExtrapolation",
       {k44, F32({8}, {0, 0, 0.4f, 0.6f, 1, 1, 1.2f, 1.7f}), Tensor(), I64({4}, {1, 1, 3, 3})},
       F32({1, 1, 3, 3}, {7, -1, -1, 11, -1, -1, -1, -1, -1}),
       {{"coordinate_transformation_mode", Str("tf_crop_and_resize")},
        {"extrapolation_value", FloatAttr(-1)}}},
  };
}
INSTANTIATE_TEST_SUITE_P(Resize, ResizeCases, ::testing::ValuesIn(OnnxReferenceCases()),
                         [](const ::testing::TestParamInfo<ResizeCase>& info) {
                           return info.param.name;
                         });

// Legacy and opset-18 forms and nearest corner cases, expected values written by hand.
std::vector<ResizeCase> FormCases() {
  const Tensor x = F32({1, 1, 1, 2}, {1, 3});
  const Tensor kUp22 = F32({1, 1, 4, 4}, {1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4});
  const Tensor kRow4 = F32({1, 4}, {10, 11, 12, 13});
  const std::map<std::string, Attribute> kTorchNearest = {
      {"mode", Str("nearest")},
      {"coordinate_transformation_mode", Str("asymmetric")},
      {"nearest_mode", Str("floor")}};
  return {
      // Upsample-7 scales attribute and Upsample-9 / Resize-10 scales input map asymmetrically:
      // linear gives 1, 2, 3, 3 (the last one clamps at the edge).
      {"Upsample7LinearAttr",
       {x},
       F32({1, 1, 1, 4}, {1, 2, 3, 3}),
       {{"mode", Str("linear")}, {"scales", FloatsAttr({1, 1, 1, 2})}},
       7,
       "Upsample"},
      {"Upsample9Nearest",
       {x, F32({4}, {1, 1, 2, 2})},
       F32({1, 1, 2, 4}, {1, 1, 3, 3, 1, 1, 3, 3}),
       {},
       9,
       "Upsample"},
      {"Resize10Linear",
       {x, F32({4}, {1, 1, 1, 2})},
       F32({1, 1, 1, 4}, {1, 2, 3, 3}),
       {{"mode", Str("linear")}},
       10},
      // Resize-11 takes an empty roi and scales next to sizes.
      {"Resize11EmptyScalesWithSizes",
       {x, F32({0}, {}), F32({0}, {}), I64({4}, {1, 1, 1, 4})},
       F32({1, 1, 1, 4}, {1, 1.5f, 2.5f, 3}),
       {{"mode", Str("linear")}},
       11},
      // Resize-18 axes: only the last axis is resized.
      {"Resize18Axes",
       {x, Tensor(), F32({1}, {2})},
       F32({1, 1, 1, 4}, {1, 1.5f, 2.5f, 3}),
       {{"mode", Str("linear")}, {"axes", IntsAttr({-1})}},
       18},
      // keep_aspect_ratio_policy=not_larger: the smaller scale (2) applies to both axes.
      {"Resize18NotLarger",
       {F32({1, 1, 2, 2}, {1, 2, 3, 4}), Tensor(), Tensor(), I64({2}, {4, 8})},
       F32({1, 1, 4, 4}, {1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4}),
       {{"axes", IntsAttr({2, 3})}, {"keep_aspect_ratio_policy", Str("not_larger")}},
       18},
      // What torch exports for F.interpolate(scale_factor=2, mode='nearest'), at several opsets
      // and through scales or sizes.
      {"TorchNearestScales13", {k22, Tensor(), F32({4}, {1, 1, 2, 2})}, kUp22, kTorchNearest},
      {"TorchNearestScales17", {k22, Tensor(), F32({4}, {1, 1, 2, 2})}, kUp22, kTorchNearest, 17},
      {"TorchNearestSizes13",
       {k22, Tensor(), Tensor(), I64({4}, {1, 1, 4, 4})},
       kUp22,
       kTorchNearest},
      {"TorchNearestEmptyScalesWithSizes11",
       {k22, F32({0}, {}), F32({0}, {}), I64({4}, {1, 1, 4, 4})},
       kUp22,
       kTorchNearest,
       11},
      {"Resize10Nearest", {k22, F32({4}, {1, 1, 2, 2})}, kUp22, {{"mode", Str("nearest")}}, 10},
      {"Upsample7NearestAttr", {k22}, kUp22, {{"scales", FloatsAttr({1, 1, 2, 2})}}, 7, "Upsample"},
      // Downsampling [1,4] to [1,2]: half_pixel maps outputs to 0.5 and 2.5, exact ties.
      {"HalfPixelRoundPreferFloorDown",
       {kRow4, Tensor(), Tensor(), I64({2}, {1, 2})},
       F32({1, 2}, {10, 12}),
       {{"nearest_mode", Str("round_prefer_floor")}}},
      {"HalfPixelRoundPreferCeilDown",
       {kRow4, Tensor(), Tensor(), I64({2}, {1, 2})},
       F32({1, 2}, {11, 13}),
       {{"nearest_mode", Str("round_prefer_ceil")}}},
      {"AlignCornersDown",
       {kRow4, Tensor(), Tensor(), I64({2}, {1, 2})},
       F32({1, 2}, {10, 13}),
       {{"coordinate_transformation_mode", Str("align_corners")}}},
      {"PytorchHalfPixelCeilDown",
       {kRow4, Tensor(), Tensor(), I64({2}, {1, 2})},
       F32({1, 2}, {11, 13}),
       {{"coordinate_transformation_mode", Str("pytorch_half_pixel")},
        {"nearest_mode", Str("ceil")}}},
      {"TfHalfPixelForNearestFloorUp",
       {F32({1, 2}, {1, 2}), Tensor(), F32({2}, {1, 3})},
       F32({1, 6}, {1, 1, 1, 2, 2, 2}),
       {{"coordinate_transformation_mode", Str("tf_half_pixel_for_nearest")},
        {"nearest_mode", Str("floor")}}},
      // Nearest copies bytes, so it takes integer tensors too.
      {"NearestInt64Default1D",
       {I64({2}, {5, 6}), Tensor(), F32({1}, {2})},
       I64({4}, {5, 5, 6, 6})},
      {"NearestInt64",
       {I64({1, 2}, {7, -9}), Tensor(), F32({2}, {1, 2})},
       I64({1, 4}, {7, 7, -9, -9})},
  };
}
INSTANTIATE_TEST_SUITE_P(ResizeForms, ResizeCases, ::testing::ValuesIn(FormCases()),
                         [](const ::testing::TestParamInfo<ResizeCase>& info) {
                           return info.param.name;
                         });

TEST(ResizeRegistry, ResizeAndUpsampleForms) {
  auto resize = OpRegistry::Global().Find("", "Resize", 10);
  ASSERT_TRUE(resize.ok()) << resize.status().ToString();
  EXPECT_EQ((*resize)->since_version, 10);
  auto upsample = OpRegistry::Global().Find("", "Upsample", 9);
  ASSERT_TRUE(upsample.ok()) << upsample.status().ToString();
  EXPECT_EQ((*upsample)->until_version, 9);
  EXPECT_FALSE(OpRegistry::Global().Find("", "Upsample", 10).ok());
}

// ---------------------------------------------------------------------------------------------
// Errors

struct ResizeErrorCase {
  std::string name;
  std::vector<Tensor> inputs;
  StatusCode code;
  std::vector<std::string> fragments;  // each must appear in the message
  std::map<std::string, Attribute> attrs = {};
  int64_t opset = 13;
};

void PrintTo(const ResizeErrorCase& c, std::ostream* os) { *os << c.name; }

class ResizeErrors : public ::testing::TestWithParam<ResizeErrorCase> {};

TEST_P(ResizeErrors, FailsWithMessage) {
  const ResizeErrorCase& c = GetParam();
  auto out = RunOp(MakeNode("Resize", c.inputs.size(), 1, c.attrs), c.inputs, c.opset);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), c.code) << out.status().ToString();
  for (const std::string& f : c.fragments) {
    EXPECT_NE(out.status().message().find(f), std::string::npos)
        << "missing '" << f << "' in: " << out.status().message();
  }
}

std::vector<ResizeErrorCase> ErrorCases() {
  const Tensor scales = F32({4}, {1, 1, 2, 2});
  return {
      {"BadMode",
       {k22, Tensor(), scales},
       StatusCode::kInvalidArgument,
       {"Resize 'n0'", "mode='bicubic'", "nearest, linear, cubic"},
       {{"mode", Str("bicubic")}}},
      {"BadCoordinateMode",
       {k22, Tensor(), scales},
       StatusCode::kInvalidArgument,
       {"Resize 'n0'", "coordinate_transformation_mode='corners'"},
       {{"coordinate_transformation_mode", Str("corners")}}},
      {"BadNearestMode",
       {k22, Tensor(), scales},
       StatusCode::kInvalidArgument,
       {"Resize 'n0'", "nearest_mode='up'"},
       {{"nearest_mode", Str("up")}}},
      {"ExcludeOutsideNotFlag",
       {k22, Tensor(), scales},
       StatusCode::kInvalidArgument,
       {"Resize 'n0'", "'exclude_outside'=2"},
       {{"mode", Str("cubic")}, {"exclude_outside", IntAttr(2)}}},
      {"CubicCoeffNotFloat",
       {k22, Tensor(), scales},
       StatusCode::kInvalidArgument,
       {"Resize 'n0'", "'cubic_coeff_a'"},
       {{"mode", Str("cubic")}, {"cubic_coeff_a", IntAttr(-1)}}},
      {"AntialiasUnsupported",
       {k22, Tensor(), scales},
       StatusCode::kUnimplemented,
       {"Resize 'n0'", "'antialias'=1"},
       {{"mode", Str("linear")}, {"antialias", IntAttr(1)}},
       18},
      {"CubicAtOpset10",
       {k22, scales},
       StatusCode::kInvalidArgument,
       {"Resize 'n0'", "mode='cubic'", "opset 11"},
       {{"mode", Str("cubic")}},
       10},
      {"ScalesAndSizes",
       {k22, Tensor(), scales, I64({4}, {1, 1, 4, 4})},
       StatusCode::kInvalidArgument,
       {"Resize 'n0'", "exactly one of scales and sizes", "both"}},
      {"TfCropWithoutRoi",
       {k22, Tensor(), scales},
       StatusCode::kInvalidArgument,
       {"Resize 'n0'", "tf_crop_and_resize", "roi"},
       {{"coordinate_transformation_mode", Str("tf_crop_and_resize")}}},
      {"RoiWrongLength",
       {k22, F32({2}, {0, 1}), scales},
       StatusCode::kInvalidArgument,
       {"Resize 'n0'", "roi", "expected 8"},
       {{"coordinate_transformation_mode", Str("tf_crop_and_resize")}}},
      {"ScalesWrongLength",
       {k22, Tensor(), F32({2}, {2, 2})},
       StatusCode::kInvalidArgument,
       {"Resize 'n0'", "scales has 2 values, expected 4"}},
      {"NonPositiveScale",
       {k22, Tensor(), F32({4}, {1, 1, 0, 2})},
       StatusCode::kInvalidArgument,
       {"Resize 'n0'", "must be positive"}},
      {"LinearOnInt64",
       {I64({1, 2}, {1, 2}), Tensor(), F32({2}, {1, 2})},
       StatusCode::kUnimplemented,
       {"Resize 'n0'", "int64", "linear"},
       {{"mode", Str("linear")}}},
  };
}
INSTANTIATE_TEST_SUITE_P(ResizeErrorCases, ResizeErrors, ::testing::ValuesIn(ErrorCases()),
                         [](const ::testing::TestParamInfo<ResizeErrorCase>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace kiln
