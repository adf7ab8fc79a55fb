// Tests for the indexing, scatter/gather and layout op family (src/kiln/ops/index_ops.cc).
//
// Each op has a table of named cases (node + attributes, inputs, opset, expected outputs) run
// through the registry exactly as the eager interpreter runs a node; expected values are literal
// (worked by hand or with numpy, checked against the ONNX node cases). Error tests check the
// status code and that the message names the attribute or index and its value.
#include <string>
#include <vector>

#include "tests/ops/op_test_util.h"

namespace kiln {
namespace {

using testing::F32;
using testing::I64;
using testing::IntAttr;
using testing::MakeNode;
using testing::RunOp;
using testing::StringAttr;

Tensor I32(Shape shape, std::vector<int32_t> v) {
  return Tensor::FromVector<int32_t>(std::move(shape), v);
}
Tensor Bool(Shape shape, std::vector<uint8_t> v) {
  auto t = Tensor::FromBytes(DType::kBool, std::move(shape), v.data(), v.size());
  KILN_CHECK(t.ok());
  return std::move(t).value();
}
// 0, 1, 2, ... as float32 in `shape`.
Tensor Iota(Shape shape, float scale = 1.0f, float offset = 0.0f) {
  std::vector<float> v(static_cast<size_t>(NumElements(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i) * scale + offset;
  return F32(std::move(shape), v);
}

struct OpCase {
  std::string name;
  Node node;
  std::vector<Tensor> inputs;
  std::vector<Tensor> expected;
  int64_t opset = 17;
};

void RunCases(const std::vector<OpCase>& cases) {
  for (const OpCase& c : cases) {
    SCOPED_TRACE(c.name + " (" + c.node.op_type + ", opset " + std::to_string(c.opset) + ")");
    auto outs = RunOp(c.node, c.inputs, c.opset);
    ASSERT_TRUE(outs.ok()) << outs.status().ToString();
    ASSERT_EQ(outs->size(), c.expected.size());
    for (size_t i = 0; i < c.expected.size(); ++i) {
      testing::ExpectTensorNear((*outs)[i], c.expected[i], 1e-5, 1e-6);
    }
  }
}

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

Node WithAttrs(std::string op, size_t inputs, std::map<std::string, Attribute> attrs) {
  return MakeNode(std::move(op), inputs, 1, std::move(attrs));
}

// ---------------------------------------------------------------------------------------------

TEST(IndexGatherElements, Cases) {
  RunCases({
      {"axis1",
       WithAttrs("GatherElements", 2, {{"axis", IntAttr(1)}}),
       {F32({2, 2}, {1, 2, 3, 4}), I64({2, 2}, {0, 0, 1, 0})},
       {F32({2, 2}, {1, 1, 4, 3})}},
      {"axis0_negative_indices",
       WithAttrs("GatherElements", 2, {}),
       {Iota({3, 3}, 1, 1), I64({2, 3}, {-1, -2, 0, -2, 0, 0})},
       {F32({2, 3}, {7, 5, 3, 4, 2, 3})}},
      {"int32_indices_int64_data_smaller_off_axis",
       WithAttrs("GatherElements", 2, {{"axis", IntAttr(-1)}}),
       {I64({2, 3}, {10, 11, 12, 20, 21, 22}), I32({1, 2}, {2, -3})},
       {I64({1, 2}, {12, 10})}},
  });
}

TEST(IndexGatherElements, Errors) {
  ExpectError(WithAttrs("GatherElements", 2, {}), {Iota({3, 2}), I64({1, 2}, {0, 3})}, 17,
              StatusCode::kInvalidArgument, {"n0", "index 3", "indices element 1", "dim 3"});
  ExpectError(WithAttrs("GatherElements", 2, {{"axis", IntAttr(2)}}),
              {Iota({3, 2}), I64({1, 2}, {0, 0})}, 17, StatusCode::kInvalidArgument,
              {"axis=2", "expected -2 to 1"});
  ExpectError(WithAttrs("GatherElements", 2, {}), {Iota({3, 2}), F32({1, 2}, {0, 0})}, 17,
              StatusCode::kInvalidArgument, {"indices", "float32", "int64 or int32"});
}

TEST(IndexGatherND, Cases) {
  RunCases({
      {"int32_data_full_tuples",
       WithAttrs("GatherND", 2, {}),
       {I32({2, 2}, {0, 1, 2, 3}), I64({2, 2}, {0, 0, 1, 1})},
       {I32({2}, {0, 3})}},
      {"slices",
       WithAttrs("GatherND", 2, {}),
       {Iota({2, 2, 2}), I64({2, 1, 2}, {0, 1, 1, 0})},
       {F32({2, 1, 2}, {2, 3, 4, 5})}},
      {"batch_dims1",
       WithAttrs("GatherND", 2, {{"batch_dims", IntAttr(1)}}),
       {Iota({2, 2, 2}), I64({2, 1}, {1, 0})},
       {F32({2, 2}, {2, 3, 4, 5})}},
      {"negative_int32_indices",
       WithAttrs("GatherND", 2, {}),
       {Iota({2, 3}), I32({1, 2}, {-1, -3})},
       {F32({1}, {3})}},
      {"opset11",
       WithAttrs("GatherND", 2, {}),
       {Iota({3, 2}), I64({2, 1}, {2, 0})},
       {F32({2, 2}, {4, 5, 0, 1})},
       11},
  });
}

TEST(IndexGatherND, Errors) {
  ExpectError(WithAttrs("GatherND", 2, {{"batch_dims", IntAttr(-1)}}),
              {Iota({2, 2}), I64({1, 1}, {0})}, 17, StatusCode::kInvalidArgument,
              {"batch_dims=-1"});
  ExpectError(WithAttrs("GatherND", 2, {{"batch_dims", IntAttr(1)}}),
              {Iota({2, 2}), I64({2, 1}, {0, 0})}, 11, StatusCode::kInvalidArgument,
              {"batch_dims", "opset 11"});
  ExpectError(WithAttrs("GatherND", 2, {}), {Iota({2, 3}), I64({1, 2}, {1, 3})}, 17,
              StatusCode::kInvalidArgument, {"index 3", "indices element 1", "dim 3"});
  ExpectError(WithAttrs("GatherND", 2, {}), {Iota({2, 3}), I64({1, 3}, {0, 0, 0})}, 17,
              StatusCode::kInvalidArgument, {"3 coordinates", "expected 1 to 2"});
}

TEST(IndexScatterElements, Cases) {
  RunCases({
      {"axis0",
       WithAttrs("ScatterElements", 3, {}),
       {F32({3, 3}, std::vector<float>(9, 0)), I64({2, 3}, {1, 0, 2, 0, 2, 1}),
        F32({2, 3}, {1.0f, 1.1f, 1.2f, 2.0f, 2.1f, 2.2f})},
       {F32({3, 3}, {2.0f, 1.1f, 0, 1.0f, 0, 2.2f, 0, 2.1f, 1.2f})}},
      {"axis1_negative",
       WithAttrs("ScatterElements", 3, {{"axis", IntAttr(1)}}),
       {Iota({1, 5}, 1, 1), I32({1, 2}, {1, -3}), F32({1, 2}, {1.1f, 2.1f})},
       {F32({1, 5}, {1, 1.1f, 2.1f, 4, 5})}},
      {"add_duplicates",
       WithAttrs("ScatterElements", 3, {{"axis", IntAttr(1)}, {"reduction", StringAttr("add")}}),
       {Iota({1, 5}, 1, 1), I64({1, 2}, {1, 1}), F32({1, 2}, {1.1f, 2.1f})},
       {F32({1, 5}, {1, 5.2f, 3, 4, 5})},
       16},
      {"mul_int64",
       WithAttrs("ScatterElements", 3, {{"axis", IntAttr(1)}, {"reduction", StringAttr("mul")}}),
       {I64({1, 3}, {1, 2, 3}), I64({1, 2}, {2, 2}), I64({1, 2}, {4, 5})},
       {I64({1, 3}, {1, 2, 60})},
       16},
      {"max",
       WithAttrs("ScatterElements", 3, {{"axis", IntAttr(1)}, {"reduction", StringAttr("max")}}),
       {Iota({1, 5}, 1, 1), I64({1, 2}, {1, 1}), F32({1, 2}, {1.1f, 2.1f})},
       {F32({1, 5}, {1, 2.1f, 3, 4, 5})},
       18},
      {"min",
       WithAttrs("ScatterElements", 3, {{"axis", IntAttr(1)}, {"reduction", StringAttr("min")}}),
       {Iota({1, 5}, 1, 1), I64({1, 2}, {1, 1}), F32({1, 2}, {1.1f, 2.1f})},
       {F32({1, 5}, {1, 1.1f, 3, 4, 5})},
       18},
  });
}

TEST(IndexScatterElements, BadReductionNamedWithValue) {
  const std::vector<Tensor> in = {Iota({1, 5}), I64({1, 1}, {0}), F32({1, 1}, {1})};
  ExpectError(WithAttrs("ScatterElements", 3, {{"reduction", StringAttr("sub")}}), in, 18,
              StatusCode::kInvalidArgument, {"n0", "reduction='sub'", "none, add, mul, max, min"});
  ExpectError(WithAttrs("ScatterElements", 3, {{"reduction", StringAttr("max")}}), in, 17,
              StatusCode::kInvalidArgument, {"reduction='max'", "opset 18"});
  ExpectError(WithAttrs("ScatterElements", 3, {{"reduction", StringAttr("add")}}), in, 13,
              StatusCode::kInvalidArgument, {"reduction='add'", "opset 13"});
  ExpectError(WithAttrs("ScatterElements", 3, {{"axis", IntAttr(1)}}),
              {Iota({1, 5}), I64({1, 1}, {5}), F32({1, 1}, {1})}, 17, StatusCode::kInvalidArgument,
              {"index 5", "axis 1 with dim 5"});
  ExpectError(WithAttrs("ScatterElements", 3, {}),
              {Iota({1, 5}), I64({1, 2}, {0, 1}), F32({1, 1}, {1})}, 17,
              StatusCode::kInvalidArgument, {"updates are float32[1,1]", "float32[1,2]"});
}

TEST(IndexScatterND, Cases) {
  RunCases({
      {"elements",
       WithAttrs("ScatterND", 3, {}),
       {Iota({8}, 1, 1), I64({4, 1}, {4, 3, 1, 7}), F32({4}, {9, 10, 11, 12})},
       {F32({8}, {1, 11, 3, 10, 9, 6, 7, 12})}},
      {"slice_negative_int32",
       WithAttrs("ScatterND", 3, {}),
       {F32({2, 2}, {1, 2, 3, 4}), I32({1, 1}, {-1}), F32({1, 2}, {9, 8})},
       {F32({2, 2}, {1, 2, 9, 8})}},
      {"add_duplicates",
       WithAttrs("ScatterND", 3, {{"reduction", StringAttr("add")}}),
       {Iota({4}, 1, 1), I64({2, 1}, {0, 0}), F32({2}, {5, 6})},
       {F32({4}, {12, 2, 3, 4})},
       16},
      {"mul",
       WithAttrs("ScatterND", 3, {{"reduction", StringAttr("mul")}}),
       {I32({2, 2}, {1, 2, 3, 4}), I64({2, 2}, {0, 1, 0, 1}), I32({2}, {3, 5})},
       {I32({2, 2}, {1, 30, 3, 4})},
       16},
      {"min",
       WithAttrs("ScatterND", 3, {{"reduction", StringAttr("min")}}),
       {Iota({4}, 1, 1), I64({2, 1}, {3, 1}), F32({2}, {0.5f, 7})},
       {F32({4}, {1, 2, 3, 0.5f})},
       18},
  });
}

TEST(IndexScatterND, Errors) {
  ExpectError(WithAttrs("ScatterND", 3, {{"reduction", StringAttr("avg")}}),
              {Iota({4}), I64({1, 1}, {0}), F32({1}, {1})}, 16, StatusCode::kInvalidArgument,
              {"reduction='avg'", "none, add, mul"});
  ExpectError(WithAttrs("ScatterND", 3, {}), {Iota({4}), I64({1, 1}, {-5}), F32({1}, {1})}, 16,
              StatusCode::kInvalidArgument, {"index -5", "dim 4", "expected -4 to 3"});
  ExpectError(WithAttrs("ScatterND", 3, {}), {Iota({4}), I64({1, 1}, {0}), F32({2}, {1, 2})}, 16,
              StatusCode::kInvalidArgument, {"updates are float32[2]", "float32[1]"});
}

TEST(IndexNonZero, Cases) {
  RunCases({
      {"float",
       MakeNode("NonZero", 1),
       {F32({2, 2}, {1, 0, 1, 1})},
       {I64({2, 3}, {0, 1, 1, 0, 0, 1})}},
      {"bool_1d", MakeNode("NonZero", 1), {Bool({4}, {0, 1, 0, 1})}, {I64({1, 2}, {1, 3})}},
      {"int32_none", MakeNode("NonZero", 1), {I32({2}, {0, 0})}, {I64({1, 0}, {})}},
  });
}

// Static shape inference (what a mint runs) does not know a runtime input's values: NonZero's
// output shape is then data-dependent and the op says so, by name.
TEST(IndexNonZero, UnknownInputIsADataDependentShape) {
  const Node node = MakeNode("NonZero", 1);
  auto def = OpRegistry::Global().Find("", "NonZero", 17);
  ASSERT_TRUE(def.ok());
  OpContext ctx(node, 17, {TensorType{DType::kFloat32, {2, 3}}}, {nullptr}, {true});
  auto types = (*def)->infer(ctx);
  ASSERT_FALSE(types.ok());
  EXPECT_EQ(types.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(types.status().message().find("NonZero 'n0'"), std::string::npos)
      << types.status().message();
  EXPECT_NE(types.status().message().find("data-dependent output shape"), std::string::npos)
      << types.status().message();
}

TEST(IndexOneHot, Cases) {
  RunCases({
      {"last_axis_negative_and_out_of_range",
       MakeNode("OneHot", 3),
       {I64({3}, {1, -1, 5}), I64({}, {3}), F32({2}, {0, 5})},
       {F32({3, 3}, {0, 5, 0, 0, 0, 5, 0, 0, 0})}},
      {"axis0",
       WithAttrs("OneHot", 3, {{"axis", IntAttr(0)}}),
       {I64({2}, {0, 2}), I64({1}, {3}), F32({2}, {1, 2})},
       {F32({3, 2}, {2, 1, 1, 1, 1, 2})}},
      {"float_indices_float_depth_int32_values",
       WithAttrs("OneHot", 3, {{"axis", IntAttr(-2)}}),
       {F32({1, 2}, {1.7f, 0.0f}), F32({}, {2.0f}), I32({2}, {-1, 7})},
       {I32({1, 2, 2}, {-1, 7, 7, -1})}},
      {"opset9_negative_is_off",
       MakeNode("OneHot", 3),
       {I32({3}, {0, 1, -1}), I64({}, {2}), I64({2}, {0, 1})},
       {I64({3, 2}, {1, 0, 0, 1, 0, 0})},
       9},
  });
}

TEST(IndexOneHot, Errors) {
  ExpectError(WithAttrs("OneHot", 3, {{"axis", IntAttr(3)}}),
              {I64({2}, {0, 1}), I64({}, {2}), F32({2}, {0, 1})}, 17, StatusCode::kInvalidArgument,
              {"axis=3", "expected -2 to 1"});
  ExpectError(MakeNode("OneHot", 3), {I64({2}, {0, 1}), I64({}, {0}), F32({2}, {0, 1})}, 17,
              StatusCode::kInvalidArgument, {"depth 0", ">= 1"});
  ExpectError(MakeNode("OneHot", 3), {I64({2}, {0, 1}), I64({}, {2}), F32({3}, {0, 1, 2})}, 17,
              StatusCode::kInvalidArgument, {"values", "float32[3]"});
}

TEST(IndexTrilu, Cases) {
  const Tensor x = Iota({3, 3}, 1, 1);
  RunCases({
      {"upper_default", MakeNode("Trilu", 1), {x}, {F32({3, 3}, {1, 2, 3, 0, 5, 6, 0, 0, 9})}},
      {"lower_k_minus1",
       WithAttrs("Trilu", 2, {{"upper", IntAttr(0)}}),
       {x, I64({}, {-1})},
       {F32({3, 3}, {0, 0, 0, 4, 0, 0, 7, 8, 0})}},
      {"upper_k1_batched_int64",
       MakeNode("Trilu", 2),
       {I64({2, 2, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}), I64({1}, {1})},
       {I64({2, 2, 3}, {0, 2, 3, 0, 0, 6, 0, 8, 9, 0, 0, 12})}},
      {"lower_k_beyond",
       WithAttrs("Trilu", 2, {{"upper", IntAttr(0)}}),
       {Iota({2, 3}, 1, 1), I64({}, {5})},
       {F32({2, 3}, {1, 2, 3, 4, 5, 6})}},
      {"upper_empty", MakeNode("Trilu", 1), {F32({0, 3}, {})}, {F32({0, 3}, {})}},
  });
}

TEST(IndexTrilu, Errors) {
  ExpectError(WithAttrs("Trilu", 1, {{"upper", IntAttr(2)}}), {Iota({2, 2})}, 17,
              StatusCode::kInvalidArgument, {"n0", "upper=2", "0 or 1"});
  ExpectError(MakeNode("Trilu", 1), {Iota({3})}, 17, StatusCode::kInvalidArgument, {"rank >= 2"});
  ExpectError(MakeNode("Trilu", 2), {Iota({2, 2}), F32({}, {1})}, 17, StatusCode::kInvalidArgument,
              {"'k'", "scalar int64"});
}

TEST(IndexEyeLike, Cases) {
  RunCases({
      {"k1_float",
       WithAttrs("EyeLike", 1, {{"k", IntAttr(1)}}),
       {Iota({3, 4})},
       {F32({3, 4}, {0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1})}},
      {"dtype_int64_from_int32",
       WithAttrs("EyeLike", 1, {{"dtype", IntAttr(7)}}),
       {I32({2, 2}, {5, 5, 5, 5})},
       {I64({2, 2}, {1, 0, 0, 1})}},
      {"k_minus1_int32",
       WithAttrs("EyeLike", 1, {{"k", IntAttr(-1)}}),
       {I32({3, 2}, {0, 0, 0, 0, 0, 0})},
       {I32({3, 2}, {0, 0, 1, 0, 0, 1})}},
      {"bool",
       WithAttrs("EyeLike", 1, {{"dtype", IntAttr(9)}}),
       {Iota({2, 2})},
       {Bool({2, 2}, {1, 0, 0, 1})}},
  });
}

TEST(IndexEyeLike, Errors) {
  // dtype 8 is STRING: EyeLike writes numbers, so the engines refuse its string output by name.
  ExpectError(WithAttrs("EyeLike", 1, {{"dtype", IntAttr(8)}}), {Iota({2, 2})}, 17,
              StatusCode::kUnimplemented, {"string tensor", "EyeLike does not take strings"});
  ExpectError(WithAttrs("EyeLike", 1, {{"dtype", IntAttr(14)}}), {Iota({2, 2})}, 17,
              StatusCode::kUnimplemented, {"dtype=14", "supported"});
  ExpectError(MakeNode("EyeLike", 1), {Iota({2, 2, 2})}, 17, StatusCode::kInvalidArgument,
              {"expected rank 2"});
}

TEST(IndexDepthToSpace, Cases) {
  RunCases({
      {"dcr_default",
       WithAttrs("DepthToSpace", 1, {{"blocksize", IntAttr(2)}}),
       {Iota({1, 8, 1, 1})},
       {F32({1, 2, 2, 2}, {0, 2, 4, 6, 1, 3, 5, 7})}},
      {"crd",
       WithAttrs("DepthToSpace", 1, {{"blocksize", IntAttr(2)}, {"mode", StringAttr("CRD")}}),
       {Iota({1, 8, 1, 1})},
       {F32({1, 2, 2, 2}, {0, 1, 2, 3, 4, 5, 6, 7})}},
      {"dcr_spatial_int64",
       WithAttrs("DepthToSpace", 1, {{"blocksize", IntAttr(2)}}),
       {I64({1, 4, 2, 2}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15})},
       {I64({1, 1, 4, 4}, {0, 4, 1, 5, 8, 12, 9, 13, 2, 6, 3, 7, 10, 14, 11, 15})}},
      {"opset1",
       WithAttrs("DepthToSpace", 1, {{"blocksize", IntAttr(2)}}),
       {Iota({1, 8, 1, 1})},
       {F32({1, 2, 2, 2}, {0, 2, 4, 6, 1, 3, 5, 7})},
       1},
      {"space_to_depth_inverts_dcr",
       WithAttrs("SpaceToDepth", 1, {{"blocksize", IntAttr(2)}}),
       {F32({1, 1, 4, 4}, {0, 4, 1, 5, 8, 12, 9, 13, 2, 6, 3, 7, 10, 14, 11, 15})},
       {Iota({1, 4, 2, 2})}},
      {"space_to_depth_channels",
       WithAttrs("SpaceToDepth", 1, {{"blocksize", IntAttr(2)}}),
       {F32({1, 2, 2, 2}, {0, 2, 4, 6, 1, 3, 5, 7})},
       {Iota({1, 8, 1, 1})}},
  });
}

TEST(IndexDepthToSpace, Errors) {
  ExpectError(WithAttrs("DepthToSpace", 1, {{"blocksize", IntAttr(0)}}), {Iota({1, 4, 1, 1})}, 17,
              StatusCode::kInvalidArgument, {"n0", "blocksize=0", ">= 1"});
  ExpectError(
      WithAttrs("DepthToSpace", 1, {{"blocksize", IntAttr(2)}, {"mode", StringAttr("RDC")}}),
      {Iota({1, 4, 1, 1})}, 17, StatusCode::kInvalidArgument, {"mode='RDC'", "DCR, CRD"});
  ExpectError(WithAttrs("DepthToSpace", 1, {{"blocksize", IntAttr(2)}}), {Iota({1, 6, 1, 1})}, 17,
              StatusCode::kInvalidArgument, {"[1,6,1,1]", "blocksize^2=4"});
  ExpectError(MakeNode("SpaceToDepth", 1), {Iota({1, 1, 2, 2})}, 17, StatusCode::kInvalidArgument,
              {"blocksize"});
  ExpectError(WithAttrs("SpaceToDepth", 1, {{"blocksize", IntAttr(3)}}), {Iota({1, 1, 4, 4})}, 17,
              StatusCode::kInvalidArgument, {"[1,1,4,4]", "blocksize=3"});
}

Node Einsum(const std::string& eq, size_t inputs) {
  return WithAttrs("Einsum", inputs, {{"equation", StringAttr(eq)}});
}

TEST(IndexEinsum, Cases) {
  const Tensor a = Iota({2, 3});
  const Tensor b = Iota({3, 2}, 1, -2);
  const Tensor v = F32({3}, {1, 2, 3});
  RunCases({
      {"matmul", Einsum("ij,jk->ik", 2), {a, b}, {F32({2, 2}, {4, 7, 4, 16})}},
      {"matmul_implicit_spaces", Einsum("ij, jk", 2), {a, b}, {F32({2, 2}, {4, 7, 4, 16})}},
      {"transpose_implicit_order", Einsum("ba", 1), {a}, {F32({3, 2}, {0, 3, 1, 4, 2, 5})}},
      {"transpose_explicit", Einsum("ij->ji", 1), {a}, {F32({3, 2}, {0, 3, 1, 4, 2, 5})}},
      {"diagonal", Einsum("ii->i", 1), {Iota({3, 3})}, {F32({3}, {0, 4, 8})}},
      {"trace", Einsum("ii", 1), {Iota({3, 3})}, {F32({}, {12})}},
      {"inner", Einsum("i,i", 2), {v, F32({3}, {4, 5, 6})}, {F32({}, {32})}},
      {"outer", Einsum("i,j->ij", 2), {v, F32({2}, {4, 5})}, {F32({3, 2}, {4, 5, 8, 10, 12, 15})}},
      {"sum_all", Einsum("ij->", 1), {a}, {F32({}, {15})}},
      {"batch_matmul_ellipsis",
       Einsum("...ij,...jk->...ik", 2),
       {Iota({2, 2, 3}, 0.5f), b},
       {F32({2, 2, 2}, {2, 3.5f, 2, 8, 2, 12.5f, 2, 17})}},
      {"ellipsis_broadcast_size1",
       Einsum("...ij,...jk->...ik", 2),
       {Iota({1, 2, 3}), Iota({2, 3, 2})},
       {F32({2, 2, 2}, {10, 13, 28, 40, 28, 31, 100, 112})}},
      {"batch_diagonal",
       Einsum("...ii->...i", 1),
       {Iota({2, 3, 3})},
       {F32({2, 3}, {0, 4, 8, 9, 13, 17})}},
      {"batch_matmul_letters",
       Einsum("bij,bjk->bik", 2),
       {Iota({2, 1, 2}), F32({2, 2, 1}, {1, 1, 2, 3})},
       {F32({2, 1, 1}, {1, 13})}},
      {"int64_reduce",
       Einsum("bij->bj", 1),
       {I64({2, 3, 4}, {0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11,
                        12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23})},
       {I64({2, 4}, {12, 15, 18, 21, 48, 51, 54, 57})}},
      {"int32_matmul",
       Einsum("ij,jk->ik", 2),
       {I32({1, 2}, {2, 3}), I32({2, 2}, {1, 2, 3, 4})},
       {I32({1, 2}, {11, 16})}},
  });
}

// Matmul-like equations run as GEMMs over permuted operands; the rest through the generic loop.
TEST(IndexEinsum, GemmFormsWithPermutedOperandsAndOutputs) {
  const Tensor a = Iota({2, 3});
  const Tensor b = Iota({3, 2}, 1, -2);
  const Tensor x = Iota({2, 3, 2}, 0.5f);
  const Tensor y = Iota({2, 2, 2}, 1, -3);
  RunCases({
      {"output_transposed", Einsum("ij,jk->ki", 2), {a, b}, {F32({2, 2}, {4, 4, 7, 16})}},
      {"label_summed_in_one_operand", Einsum("ij,jk->k", 2), {a, b}, {F32({2}, {8, 23})}},
      {"attention_scores",
       Einsum("bqd,bkd->bqk", 2),
       {x, y},
       {F32({2, 3, 2}, {-1, 0, -6, -1, -11, -2, 10, 23, 13, 30, 16, 37})}},
      {"batch_moved",
       Einsum("bqd,bkd->kbq", 2),
       {x, y},
       {F32({2, 2, 3}, {-1, -6, -11, 10, 13, 16, 0, -1, -2, 23, 30, 37})}},
  });
}

// A larger attention-shaped contraction against a plain loop written here.
TEST(IndexEinsum, GemmPathMatchesDirectLoop) {
  const int64_t B = 2, H = 3, Q = 5, K = 7, D = 4;
  const Tensor q = Iota({B, H, Q, D}, 0.01f, -0.3f);
  const Tensor k = Iota({B, K, H, D}, -0.02f, 0.7f);
  auto out = RunOp(Einsum("bhqd,bkhd->bhqk", 2), {q, k});
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  std::vector<float> expected;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t i = 0; i < Q; ++i) {
        for (int64_t j = 0; j < K; ++j) {
          double acc = 0;
          for (int64_t d = 0; d < D; ++d) {
            acc += q.data<float>()[((b * H + h) * Q + i) * D + d] *
                   k.data<float>()[((b * K + j) * H + h) * D + d];
          }
          expected.push_back(static_cast<float>(acc));
        }
      }
    }
  }
  testing::ExpectTensorNear((*out)[0], F32({B, H, Q, K}, expected), 1e-5, 1e-5);
}

TEST(IndexEinsum, Errors) {
  ExpectError(Einsum("ij,jk->ik", 1), {Iota({2, 2})}, 17, StatusCode::kInvalidArgument,
              {"equation='ij,jk->ik'", "2 input terms", "1 inputs"});
  ExpectError(Einsum("i$j", 1), {Iota({2, 2})}, 17, StatusCode::kInvalidArgument,
              {"equation='i$j'", "'$'"});
  ExpectError(Einsum("ij->ik", 1), {Iota({2, 2})}, 17, StatusCode::kInvalidArgument,
              {"equation='ij->ik'", "'k' appears in no input"});
  ExpectError(Einsum("ij->ii", 1), {Iota({2, 2})}, 17, StatusCode::kInvalidArgument,
              {"'i' appears twice"});
  ExpectError(Einsum("ij,jk->ik", 2), {Iota({2, 3}), Iota({2, 2})}, 17,
              StatusCode::kInvalidArgument, {"dim 0 is 2", "extent 3"});
  ExpectError(Einsum("ijk", 1), {Iota({2, 2})}, 17, StatusCode::kInvalidArgument,
              {"rank 2", "names 3 dims"});
  ExpectError(Einsum("ij,jk->ik", 2), {Iota({2, 2}), I64({2, 2}, {1, 2, 3, 4})}, 17,
              StatusCode::kInvalidArgument, {"input 1 is int64", "float32 like input 0"});
}

// float64: EyeLike's dtype=11 and the generic Einsum loop.
TEST(IndexFloat64, EyeLikeAndEinsum) {
  auto eye = RunOp(WithAttrs("EyeLike", 1, {{"dtype", IntAttr(11)}}), {Iota({2, 3})});
  ASSERT_TRUE(eye.ok()) << eye.status().ToString();
  ASSERT_EQ((*eye)[0].dtype(), DType::kFloat64);
  EXPECT_EQ((*eye)[0].data<double>()[0], 1.0);
  EXPECT_EQ((*eye)[0].data<double>()[1], 0.0);
  EXPECT_EQ((*eye)[0].data<double>()[4], 1.0);

  const double third = 1.0 / 3.0;
  const Tensor a = Tensor::FromVector<double>({2, 2}, {third, 2.0, 3.0, 1e200});
  const Tensor b = Tensor::FromVector<double>({2, 2}, {3.0, 0.0, 1.0, 1e100});
  auto mm = RunOp(WithAttrs("Einsum", 2, {{"equation", StringAttr("ij,jk->ik")}}), {a, b});
  ASSERT_TRUE(mm.ok()) << mm.status().ToString();
  ASSERT_EQ((*mm)[0].dtype(), DType::kFloat64);
  EXPECT_EQ((*mm)[0].data<double>()[0], third * 3.0 + 2.0);
  EXPECT_EQ((*mm)[0].data<double>()[1], 2e100);
  EXPECT_EQ((*mm)[0].data<double>()[3], 1e300);
  auto trace = RunOp(WithAttrs("Einsum", 1, {{"equation", StringAttr("ii->")}}), {a});
  ASSERT_TRUE(trace.ok()) << trace.status().ToString();
  EXPECT_EQ((*trace)[0].data<double>()[0], third + 1e200);
}

}  // namespace
}  // namespace kiln
