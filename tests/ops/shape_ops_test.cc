// Tests for the shape and data-movement op family (src/kiln/ops/shape_ops.cc).
//
// Each op has a table of named cases (node + attributes, inputs, opset, expected outputs) run by
// RunCases through the registry exactly as the eager interpreter runs a node. Legacy opset forms
// (attributes that later became inputs) sit next to their modern form. Error tests check the
// status code and a message fragment.
#include <climits>
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
using testing::StringAttr;
using testing::TensorAttr;

Tensor I32(Shape shape, std::vector<int32_t> v) {
  return Tensor::FromVector<int32_t>(std::move(shape), v);
}
Tensor Bool(Shape shape, std::vector<uint8_t> v) {
  auto t = Tensor::FromBytes(DType::kBool, std::move(shape), v.data(), v.size());
  KILN_CHECK(t.ok());
  return std::move(t).value();
}
// 0, 1, 2, ... as float32 in `shape`.
Tensor Iota(Shape shape) {
  std::vector<float> v(static_cast<size_t>(NumElements(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
  return F32(std::move(shape), v);
}

struct OpCase {
  std::string name;
  Node node;
  std::vector<Tensor> inputs;
  std::vector<Tensor> expected;
  int64_t opset = 17;
};

void RunCase(const OpCase& c) {
  SCOPED_TRACE(c.name + " (" + c.node.op_type + ", opset " + std::to_string(c.opset) + ")");
  auto outs = RunOp(c.node, c.inputs, c.opset);
  ASSERT_TRUE(outs.ok()) << outs.status().ToString();
  ASSERT_EQ(outs->size(), c.expected.size());
  for (size_t i = 0; i < c.expected.size(); ++i) {
    SCOPED_TRACE("output " + std::to_string(i));
    testing::ExpectTensorNear((*outs)[i], c.expected[i], 1e-6, 1e-6);
  }
}

void RunCases(const std::vector<OpCase>& cases) {
  for (const OpCase& c : cases) RunCase(c);
}

// Runs a node expected to fail and checks code and message fragments.
void ExpectError(Node node, const std::vector<Tensor>& inputs, int64_t opset, StatusCode code,
                 const std::vector<std::string>& fragments) {
  auto outs = RunOp(std::move(node), inputs, opset);
  ASSERT_FALSE(outs.ok());
  EXPECT_EQ(outs.status().code(), code) << outs.status().ToString();
  for (const std::string& f : fragments) {
    EXPECT_NE(outs.status().message().find(f), std::string::npos)
        << "missing '" << f << "' in: " << outs.status().message();
  }
}

TEST(ShapeReshape, Cases) {
  RunCases({
      {"opset4_shape_attribute",
       MakeNode("Reshape", 1, 1, {{"shape", IntsAttr({3, -1})}}),
       {Iota({2, 3})},
       {Iota({3, 2})},
       4},
      {"opset14_shape_input",
       MakeNode("Reshape", 2),
       {Iota({2, 3}), I64({2}, {3, -1})},
       {Iota({3, 2})},
       14},
      {"zero_copies_input_dim",
       MakeNode("Reshape", 2),
       {Iota({2, 3, 4}), I64({2}, {0, -1})},
       {Iota({2, 12})},
       13},
      {"allowzero_keeps_zero",
       MakeNode("Reshape", 2, 1, {{"allowzero", IntAttr(1)}}),
       {Iota({0, 3}), I64({2}, {3, 0})},
       {Iota({3, 0})},
       14},
      {"int64_data",
       MakeNode("Reshape", 2),
       {I64({4}, {1, 2, 3, 4}), I64({2}, {2, 2})},
       {I64({2, 2}, {1, 2, 3, 4})},
       13},
  });
}

TEST(ShapeReshape, IncompatibleShapeNamesBothShapes) {
  ExpectError(MakeNode("Reshape", 2), {Iota({2, 3}), I64({2}, {4, 2})}, 13,
              StatusCode::kInvalidArgument, {"Reshape 'n0'", "[2,3]", "[4,2]"});
  ExpectError(MakeNode("Reshape", 2), {Iota({2, 3}), I64({2}, {4, -1})}, 13,
              StatusCode::kInvalidArgument, {"[2,3]", "[4,-1]"});
  ExpectError(MakeNode("Reshape", 2), {Iota({6}), I64({2}, {-1, -1})}, 13,
              StatusCode::kInvalidArgument, {"more than one -1"});
}

TEST(ShapeReshape, UnknownShapeValueMustBeConstant) {
  const Node node = MakeNode("Reshape", 2);
  auto def = OpRegistry::Global().Find("", "Reshape", 17);
  ASSERT_TRUE(def.ok());
  const Tensor x = Iota({2, 3});
  OpContext ctx(node, 17, {{DType::kFloat32, {2, 3}}, {DType::kInt64, {2}}}, {&x, nullptr},
                {true, true});
  auto types = (*def)->infer(ctx);
  ASSERT_FALSE(types.ok());
  EXPECT_EQ(types.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(types.status().message().find("Reshape 'n0'"), std::string::npos);
  EXPECT_NE(types.status().message().find("'shape'"), std::string::npos);
  EXPECT_NE(types.status().message().find("must be a constant"), std::string::npos)
      << types.status().message();
}

TEST(ShapeTranspose, Cases) {
  RunCases({
      {"default_reverses",
       MakeNode("Transpose", 1),
       {Iota({2, 3})},
       {F32({3, 2}, {0, 3, 1, 4, 2, 5})}},
      {"perm_3d",
       MakeNode("Transpose", 1, 1, {{"perm", IntsAttr({2, 0, 1})}}),
       {Iota({2, 3, 2})},
       {F32({2, 2, 3}, {0, 2, 4, 6, 8, 10, 1, 3, 5, 7, 9, 11})}},
      {"identity_perm_int64",
       MakeNode("Transpose", 1, 1, {{"perm", IntsAttr({0, 1})}}),
       {I64({1, 2}, {5, 6})},
       {I64({1, 2}, {5, 6})}},
  });
  ExpectError(MakeNode("Transpose", 1, 1, {{"perm", IntsAttr({0, 0})}}), {Iota({2, 3})}, 17,
              StatusCode::kInvalidArgument, {"'perm'", "[0,0]"});
}

TEST(ShapeConcat, Cases) {
  RunCases({
      {"float_axis1",
       MakeNode("Concat", 2, 1, {{"axis", IntAttr(1)}}),
       {F32({2, 1}, {0, 1}), F32({2, 2}, {2, 3, 4, 5})},
       {F32({2, 3}, {0, 2, 3, 1, 4, 5})}},
      {"int64_negative_axis",
       MakeNode("Concat", 3, 1, {{"axis", IntAttr(-1)}}),
       {I64({1, 1}, {7}), I64({1, 2}, {8, 9}), I64({1, 0}, {})},
       {I64({1, 3}, {7, 8, 9})}},
      {"bool_axis0",
       MakeNode("Concat", 2, 1, {{"axis", IntAttr(0)}}),
       {Bool({1, 2}, {1, 0}), Bool({2, 2}, {0, 1, 1, 1})},
       {Bool({3, 2}, {1, 0, 0, 1, 1, 1})}},
  });
  ExpectError(MakeNode("Concat", 2, 1, {{"axis", IntAttr(0)}}),
              {F32({1, 2}, {0, 1}), F32({1, 3}, {0, 1, 2})}, 13, StatusCode::kInvalidArgument,
              {"input 1", "float32[1,3]"});
}

TEST(ShapeSplit, Cases) {
  RunCases({
      {"opset11_split_attribute",
       MakeNode("Split", 1, 2, {{"split", IntsAttr({1, 2})}}),
       {Iota({3})},
       {F32({1}, {0}), F32({2}, {1, 2})},
       11},
      {"opset13_split_input",
       MakeNode("Split", 2, 2),
       {Iota({3}), I64({2}, {2, 1})},
       {F32({2}, {0, 1}), F32({1}, {2})},
       13},
      {"equal_axis1",
       MakeNode("Split", 1, 2, {{"axis", IntAttr(1)}}),
       {Iota({2, 4})},
       {F32({2, 2}, {0, 1, 4, 5}), F32({2, 2}, {2, 3, 6, 7})},
       13},
      {"opset18_uneven_num_outputs",
       MakeNode("Split", 1, 3, {{"num_outputs", IntAttr(3)}}),
       {Iota({5})},
       {F32({2}, {0, 1}), F32({2}, {2, 3}), F32({1}, {4})},
       18},
      {"int64_negative_axis",
       MakeNode("Split", 1, 2, {{"axis", IntAttr(-1)}}),
       {I64({1, 2}, {3, 4})},
       {I64({1, 1}, {3}), I64({1, 1}, {4})},
       13},
  });
  ExpectError(MakeNode("Split", 2, 2), {Iota({3}), I64({2}, {1, 1})}, 13,
              StatusCode::kInvalidArgument, {"split [1,1]", "summing to 3"});
}

TEST(ShapeSlice, Cases) {
  const int64_t kMax = INT64_MAX, kMin = INT64_MIN;
  RunCases({
      {"opset9_attributes",
       MakeNode("Slice", 1, 1, {{"starts", IntsAttr({0, 1})}, {"ends", IntsAttr({2, 3})}}),
       {Iota({2, 4})},
       {F32({2, 2}, {1, 2, 5, 6})},
       9},
      {"opset9_axes_attribute_clamps",
       MakeNode("Slice", 1, 1,
                {{"starts", IntsAttr({1})}, {"ends", IntsAttr({1000})}, {"axes", IntsAttr({-1})}}),
       {Iota({2, 4})},
       {F32({2, 3}, {1, 2, 3, 5, 6, 7})},
       9},
      {"opset13_inputs",
       MakeNode("Slice", 4),
       {Iota({2, 4}), I64({1}, {1}), I64({1}, {kMax}), I64({1}, {1})},
       {F32({2, 3}, {1, 2, 3, 5, 6, 7})},
       13},
      {"opset13_negative_step_reverses",
       MakeNode("Slice", 5),
       {Iota({2, 4}), I64({1}, {-1}), I64({1}, {kMin}), I64({1}, {1}), I64({1}, {-1})},
       {F32({2, 4}, {3, 2, 1, 0, 7, 6, 5, 4})},
       13},
      {"opset13_step_minus_two",
       MakeNode("Slice", 5),
       {Iota({2, 4}), I64({1}, {3}), I64({1}, {0}), I64({1}, {-1}), I64({1}, {-2})},
       {F32({2, 2}, {3, 1, 7, 5})},
       13},
      {"opset13_step_two_both_axes",
       MakeNode("Slice", 5),
       {Iota({3, 4}), I64({2}, {0, 1}), I64({2}, {3, 4}), I64({2}, {0, 1}), I64({2}, {2, 2})},
       {F32({2, 2}, {1, 3, 9, 11})},
       13},
      {"negative_start_clamps",
       MakeNode("Slice", 3),
       {Iota({2, 4}), I64({2}, {-100, -100}), I64({2}, {1, 2})},
       {F32({1, 2}, {0, 1})},
       13},
      {"empty_result",
       MakeNode("Slice", 3),
       {Iota({4}), I64({1}, {3}), I64({1}, {1})},
       {F32({0}, {})},
       13},
      {"int32_indices_bool_data",
       MakeNode("Slice", 3),
       {Bool({3}, {1, 0, 1}), I32({1}, {1}), I32({1}, {3})},
       {Bool({2}, {0, 1})},
       13},
  });
}

TEST(ShapeGather, Cases) {
  RunCases({
      {"axis0_negative_index_wraps",
       MakeNode("Gather", 2),
       {Iota({3, 2}), I64({2}, {-1, 0})},
       {F32({2, 2}, {4, 5, 0, 1})}},
      {"axis1_scalar_index",
       MakeNode("Gather", 2, 1, {{"axis", IntAttr(1)}}),
       {Iota({2, 3}), I64({}, {2})},
       {F32({2}, {2, 5})}},
      {"axis_negative_2d_indices",
       MakeNode("Gather", 2, 1, {{"axis", IntAttr(-1)}}),
       {Iota({1, 3}), I32({2, 2}, {0, 2, 1, -3})},
       {F32({1, 2, 2}, {0, 2, 1, 0})}},
      {"int64_data",
       MakeNode("Gather", 2),
       {I64({3}, {10, 20, 30}), I64({2}, {2, 1})},
       {I64({2}, {30, 20})}},
      {"bool_data",
       MakeNode("Gather", 2),
       {Bool({3}, {0, 1, 0}), I64({2}, {1, -1})},
       {Bool({2}, {1, 0})}},
  });
}

TEST(ShapeGather, IndexOutOfRangeNamesIndexAndDim) {
  ExpectError(MakeNode("Gather", 2), {Iota({3, 2}), I64({2}, {0, 3})}, 13,
              StatusCode::kInvalidArgument, {"Gather 'n0'", "index 3", "dim 3"});
  ExpectError(MakeNode("Gather", 2), {Iota({3, 2}), I64({1}, {-4})}, 13,
              StatusCode::kInvalidArgument, {"index -4", "dim 3"});
}

TEST(ShapeSqueezeUnsqueeze, Cases) {
  RunCases({
      {"squeeze_opset11_attribute",
       MakeNode("Squeeze", 1, 1, {{"axes", IntsAttr({0})}}),
       {Iota({1, 3, 1})},
       {Iota({3, 1})},
       11},
      {"squeeze_opset13_input",
       MakeNode("Squeeze", 2),
       {Iota({1, 3, 1}), I64({1}, {-1})},
       {Iota({1, 3})},
       13},
      {"squeeze_all_ones", MakeNode("Squeeze", 1), {Iota({1, 3, 1})}, {Iota({3})}, 13},
      {"unsqueeze_opset11_attribute",
       MakeNode("Unsqueeze", 1, 1, {{"axes", IntsAttr({0, 3})}}),
       {Iota({2, 3})},
       {Iota({1, 2, 3, 1})},
       11},
      {"unsqueeze_opset13_input",
       MakeNode("Unsqueeze", 2),
       {Iota({2, 3}), I64({1}, {-1})},
       {Iota({2, 3, 1})},
       13},
      {"unsqueeze_scalar_int64",
       MakeNode("Unsqueeze", 2),
       {I64({}, {4}), I64({1}, {0})},
       {I64({1}, {4})},
       13},
  });
  ExpectError(MakeNode("Squeeze", 2), {Iota({2, 3}), I64({1}, {1})}, 13,
              StatusCode::kInvalidArgument, {"axis 1", "dim 3", "expected 1"});
}

TEST(ShapeFlatten, Cases) {
  RunCases({
      {"axis2",
       MakeNode("Flatten", 1, 1, {{"axis", IntAttr(2)}}),
       {Iota({2, 3, 4})},
       {Iota({6, 4})}},
      {"axis0", MakeNode("Flatten", 1, 1, {{"axis", IntAttr(0)}}), {Iota({2, 3})}, {Iota({1, 6})}},
      {"default_axis1", MakeNode("Flatten", 1), {Iota({2, 3, 2})}, {Iota({2, 6})}},
      {"negative_axis",
       MakeNode("Flatten", 1, 1, {{"axis", IntAttr(-1)}}),
       {Iota({2, 3, 2})},
       {Iota({6, 2})}},
  });
}

TEST(ShapeExpandTile, Cases) {
  RunCases({
      {"expand_column",
       MakeNode("Expand", 2),
       {F32({2, 1}, {1, 2}), I64({2}, {2, 3})},
       {F32({2, 3}, {1, 1, 1, 2, 2, 2})}},
      {"expand_bidirectional",
       MakeNode("Expand", 2),
       {F32({1, 3}, {1, 2, 3}), I64({2}, {2, 1})},
       {F32({2, 3}, {1, 2, 3, 1, 2, 3})}},
      {"expand_adds_rank_bool",
       MakeNode("Expand", 2),
       {Bool({2}, {1, 0}), I64({2}, {2, 2})},
       {Bool({2, 2}, {1, 0, 1, 0})}},
      {"tile",
       MakeNode("Tile", 2),
       {F32({2, 2}, {1, 2, 3, 4}), I64({2}, {2, 2})},
       {F32({4, 4}, {1, 2, 1, 2, 3, 4, 3, 4, 1, 2, 1, 2, 3, 4, 3, 4})}},
      {"tile_int64_1d",
       MakeNode("Tile", 2),
       {I64({2}, {5, 6}), I64({1}, {3})},
       {I64({6}, {5, 6, 5, 6, 5, 6})}},
      {"tile_int32_repeats_3d",
       MakeNode("Tile", 2),
       {I32({1, 2, 1}, {7, 8}), I64({3}, {2, 1, 2})},
       {I32({2, 2, 2}, {7, 7, 8, 8, 7, 7, 8, 8})}},
      {"tile_zero_repeats",
       MakeNode("Tile", 2),
       {Iota({2, 3}), I64({2}, {0, 2})},
       {F32({0, 6}, {})}},
  });
  ExpectError(MakeNode("Tile", 2), {Iota({2, 3}), I64({1}, {2})}, 13, StatusCode::kInvalidArgument,
              {"Tile 'n0'", "repeats [2]", "[2,3]"});
  ExpectError(MakeNode("Tile", 2), {Iota({2, 3}), I64({2}, {1, -1})}, 13,
              StatusCode::kInvalidArgument, {"repeats [1,-1]", "non-negative"});
  ExpectError(MakeNode("Expand", 2), {Iota({3}), I64({1}, {2})}, 13, StatusCode::kInvalidArgument,
              {"Expand 'n0'", "[3]", "[2]"});
}

TEST(ShapePad, Cases) {
  const Tensor x = F32({2, 2}, {1, 2, 3, 4});
  RunCases({
      {"opset1_paddings_attribute",
       MakeNode("Pad", 1, 1, {{"paddings", IntsAttr({1, 0, 0, 0})}, {"value", FloatAttr(7)}}),
       {x},
       {F32({3, 2}, {7, 7, 1, 2, 3, 4})},
       1},
      {"opset2_pads_attribute_constant",
       MakeNode("Pad", 1, 1, {{"pads", IntsAttr({0, 1, 0, 1})}, {"value", FloatAttr(9)}}),
       {x},
       {F32({2, 4}, {9, 1, 2, 9, 9, 3, 4, 9})},
       2},
      {"opset2_pads_attribute_reflect",
       MakeNode("Pad", 1, 1, {{"pads", IntsAttr({0, 2, 0, 1})}, {"mode", StringAttr("reflect")}}),
       {Iota({2, 3})},
       {F32({2, 6}, {2, 1, 0, 1, 2, 1, 5, 4, 3, 4, 5, 4})},
       2},
      {"opset13_inputs_reflect",
       MakeNode("Pad", 2, 1, {{"mode", StringAttr("reflect")}}),
       {Iota({2, 3}), I64({4}, {0, 2, 0, 1})},
       {F32({2, 6}, {2, 1, 0, 1, 2, 1, 5, 4, 3, 4, 5, 4})},
       13},
      {"opset13_constant_value_input",
       MakeNode("Pad", 3),
       {x, I64({4}, {1, 0, 0, 1}), F32({}, {-1})},
       {F32({3, 3}, {-1, -1, -1, 1, 2, -1, 3, 4, -1})},
       13},
      {"opset13_edge",
       MakeNode("Pad", 2, 1, {{"mode", StringAttr("edge")}}),
       {F32({3}, {1, 2, 3}), I64({2}, {2, 1})},
       {F32({6}, {1, 1, 1, 2, 3, 3})},
       13},
      {"negative_pads_crop",
       MakeNode("Pad", 2),
       {Iota({4}), I64({2}, {-1, 1})},
       {F32({4}, {1, 2, 3, 0})},
       13},
      {"opset18_axes_int64",
       MakeNode("Pad", 4),
       {I64({2, 2}, {1, 2, 3, 4}), I64({2}, {1, 0}), I64({}, {5}), I64({1}, {-1})},
       {I64({2, 3}, {5, 1, 2, 5, 3, 4})},
       18},
  });
  ExpectError(MakeNode("Pad", 2), {x, I64({2}, {1, 1})}, 13, StatusCode::kInvalidArgument,
              {"pads [1,1]", "expected 4"});
}

TEST(ShapeShapeSize, Cases) {
  RunCases({
      {"shape", MakeNode("Shape", 1), {Iota({2, 3, 4})}, {I64({3}, {2, 3, 4})}, 13},
      {"shape_opset15_start",
       MakeNode("Shape", 1, 1, {{"start", IntAttr(1)}}),
       {Iota({2, 3, 4})},
       {I64({2}, {3, 4})},
       15},
      {"shape_opset15_negative_end",
       MakeNode("Shape", 1, 1, {{"end", IntAttr(-1)}}),
       {Iota({2, 3, 4})},
       {I64({2}, {2, 3})},
       15},
      {"shape_scalar", MakeNode("Shape", 1), {I64({}, {1})}, {I64({0}, {})}, 13},
      {"size", MakeNode("Size", 1), {Bool({2, 3}, {0, 0, 0, 0, 0, 0})}, {I64({}, {6})}},
  });
}

TEST(ShapeConstant, Cases) {
  RunCases({
      {"value_tensor",
       MakeNode("Constant", 0, 1, {{"value", TensorAttr(I64({2}, {3, 4}))}}),
       {},
       {I64({2}, {3, 4})}},
      {"value_float",
       MakeNode("Constant", 0, 1, {{"value_float", FloatAttr(2.5f)}}),
       {},
       {F32({}, {2.5f})}},
      {"value_floats",
       MakeNode("Constant", 0, 1, {{"value_floats", FloatsAttr({1, 2})}}),
       {},
       {F32({2}, {1, 2})}},
      {"value_int", MakeNode("Constant", 0, 1, {{"value_int", IntAttr(-3)}}), {}, {I64({}, {-3})}},
      {"value_ints",
       MakeNode("Constant", 0, 1, {{"value_ints", IntsAttr({1, 2, 3})}}),
       {},
       {I64({3}, {1, 2, 3})}},
      {"of_shape_default_float_zero",
       MakeNode("ConstantOfShape", 1),
       {I64({2}, {2, 1})},
       {F32({2, 1}, {0, 0})}},
      {"of_shape_int64_value",
       MakeNode("ConstantOfShape", 1, 1, {{"value", TensorAttr(I64({1}, {7}))}}),
       {I64({1}, {3})},
       {I64({3}, {7, 7, 7})}},
      {"of_shape_bool_scalar",
       MakeNode("ConstantOfShape", 1, 1, {{"value", TensorAttr(Bool({1}, {1}))}}),
       {I64({0}, {})},
       {Bool({}, {1})}},
  });
  ExpectError(MakeNode("Constant", 0, 1), {}, 13, StatusCode::kInvalidArgument,
              {"Constant 'n0'", "no value attribute"});
}

TEST(ShapeIdentityDropout, Cases) {
  RunCases({
      {"identity_bool", MakeNode("Identity", 1), {Bool({2}, {1, 0})}, {Bool({2}, {1, 0})}},
      {"dropout_opset13_with_mask",
       MakeNode("Dropout", 1, 2),
       {Iota({2, 2})},
       {Iota({2, 2}), Bool({2, 2}, {1, 1, 1, 1})},
       13},
      {"dropout_ratio_ignored",
       MakeNode("Dropout", 3),
       {Iota({3}), F32({}, {0.5f}), Bool({}, {0})},
       {Iota({3})},
       13},
      {"dropout_training_with_ratio_zero_drops_nothing",
       MakeNode("Dropout", 3, 2),
       {Iota({3}), F32({}, {0.0f}), Bool({}, {1})},
       {Iota({3}), Bool({3}, {1, 1, 1})},
       13},
      {"dropout_opset7_mask_in_input_dtype",
       MakeNode("Dropout", 1, 2, {{"ratio", FloatAttr(0.1f)}}),
       {Iota({2})},
       {Iota({2}), F32({2}, {1, 1})},
       7},
  });
  ExpectError(MakeNode("Dropout", 3), {Iota({3}), F32({}, {1.0f}), Bool({}, {1})}, 13,
              StatusCode::kInvalidArgument, {"Dropout 'n0'", "outside [0, 1)"});
}

// Training mode drops each element with probability `ratio` and scales the rest by
// 1 / (1 - ratio), the mask saying which were kept; a seeded node draws the same every run.
TEST(ShapeDropout, TrainingModeDropsAndScales) {
  const Tensor x = F32({400}, std::vector<float>(400, 2.0f));
  Node n = MakeNode("Dropout", 3, 2, {{"seed", IntAttr(3)}});
  auto a = RunOp(n, {x, F32({}, {0.75f}), Bool({}, {1})}, 13);
  auto b = RunOp(n, {x, F32({}, {0.75f}), Bool({}, {1})}, 13);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status().ToString();
  int64_t kept = 0;
  for (int64_t i = 0; i < 400; ++i) {
    const float y = (*a)[0].data<float>()[i];
    const bool m = (*a)[1].data<uint8_t>()[i] != 0;
    ASSERT_TRUE(m ? y == 8.0f : y == 0.0f) << i << ": " << y;
    kept += m;
  }
  EXPECT_GT(kept, 60);  // about 100 of 400 kept
  EXPECT_LT(kept, 140);
  EXPECT_EQ((*a)[1].ToInt64Vector(), (*b)[1].ToInt64Vector());
}

TEST(ShapeRange, Cases) {
  RunCases({
      {"float",
       MakeNode("Range", 3),
       {F32({}, {0}), F32({}, {1}), F32({}, {0.25f})},
       {F32({4}, {0, 0.25f, 0.5f, 0.75f})}},
      {"int64_negative_delta",
       MakeNode("Range", 3),
       {I64({}, {10}), I64({}, {4}), I64({}, {-3})},
       {I64({2}, {10, 7})}},
      {"int32",
       MakeNode("Range", 3),
       {I32({}, {1}), I32({}, {6}), I32({}, {2})},
       {I32({3}, {1, 3, 5})}},
      {"empty", MakeNode("Range", 3), {I64({}, {5}), I64({}, {1}), I64({}, {1})}, {I64({0}, {})}},
      {"float_negative_delta",
       MakeNode("Range", 3),
       {F32({}, {1}), F32({}, {-0.5f}), F32({}, {-0.5f})},
       {F32({3}, {1, 0.5f, 0})}},
      {"int32_uneven_step",
       MakeNode("Range", 3),
       {I32({}, {-3}), I32({}, {4}), I32({}, {3})},
       {I32({3}, {-3, 0, 3})}},
  });
  ExpectError(MakeNode("Range", 3), {I64({}, {0}), I32({}, {4}), I64({}, {1})}, 13,
              StatusCode::kInvalidArgument, {"input 1 ('limit') is int32[]", "int64 like 'start'"});
  ExpectError(MakeNode("Range", 3), {I64({}, {0}), I64({2}, {4, 5}), I64({}, {1})}, 13,
              StatusCode::kInvalidArgument, {"'limit'", "expected a scalar"});
  ExpectError(MakeNode("Range", 3), {I64({}, {0}), I64({}, {4}), I64({}, {0})}, 13,
              StatusCode::kInvalidArgument, {"delta is 0"});
}

}  // namespace
}  // namespace kiln
