// Sequences, optionals and strings through import, the interpreter and the digest: ONNX's
// non-tensor values are first-class values (a ValueKind of Tensor) that only the ops taking them
// ever see.
#include <gtest/gtest.h>

#include "src/kiln/eager/interpreter.h"
#include "src/kiln/graph/digest.h"
#include "src/kiln/graph/onnx_import.h"
#include "tests/graph/onnx_builder.h"

namespace kiln {
namespace {

using testing::kFloat;
using testing::kInt64;
using testing::OnnxBuilder;

void SequenceType(onnx::ValueInfoProto* vi, const std::string& name, int elem, bool optional) {
  vi->set_name(name);
  onnx::TypeProto* t = vi->mutable_type();
  if (optional) t = t->mutable_optional_type()->mutable_elem_type();
  t->mutable_sequence_type()->mutable_elem_type()->mutable_tensor_type()->set_elem_type(elem);
}

std::shared_ptr<const Graph> Import(const OnnxBuilder& b) {
  auto g = ImportOnnxBytes(b.Bytes(), "test-model");
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return std::make_shared<const Graph>(g.ok() ? std::move(g).value() : Graph{});
}

Tensor F32(Shape shape, std::vector<float> v) { return Tensor::FromVector<float>(shape, v); }

// seq_in (sequence<float32>) -> insert x at the front -> out_seq; its length and element 1.
OnnxBuilder SequenceModel() {
  OnnxBuilder b(17);
  SequenceType(b.graph().add_input(), "seq_in", kFloat, false);
  b.Input("x", kFloat, {2});
  SequenceType(b.graph().add_output(), "out_seq", kFloat, false);
  b.Output("len", kInt64, {});
  b.Output("second", kFloat, {-1});
  b.Int64Init("front", {}, {0}).Int64Init("one", {}, {1});
  b.Node("SequenceInsert", {"seq_in", "x", "front"}, {"out_seq"});
  b.Node("SequenceLength", {"out_seq"}, {"len"});
  b.Node("SequenceAt", {"out_seq", "one"}, {"second"});
  return b;
}

TEST(Values, SequencesRunThroughTheInterpreter) {
  auto graph = Import(SequenceModel());
  ASSERT_EQ(graph->inputs[0].kind, ValueKind::kSequence);
  auto interp = Interpreter::Create(graph);
  ASSERT_TRUE(interp.ok()) << interp.status().ToString();
  const Tensor seq = Tensor::Sequence(DType::kFloat32, {F32({3}, {1, 2, 3})});
  auto out = interp->Run({{"seq_in", seq}, {"x", F32({2}, {9, 8})}});
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  const Tensor& s = out->at("out_seq");
  ASSERT_EQ(s.kind(), ValueKind::kSequence);
  ASSERT_EQ(s.items().size(), 2u);
  EXPECT_EQ(s.items()[0].shape(), (Shape{2}));
  EXPECT_EQ(out->at("len").GetAsInt64(0), 2);
  EXPECT_EQ(out->at("second").shape(), (Shape{3}));
  EXPECT_EQ(seq.items().size(), 1u);  // the input handle is unchanged: values are immutable

  // A tensor where the graph declares a sequence is refused by name.
  auto wrong = interp->Run({{"seq_in", F32({3}, {1, 2, 3})}, {"x", F32({2}, {9, 8})}});
  EXPECT_EQ(wrong.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.status().message().find("expected a sequence"), std::string::npos)
      << wrong.status().message();
}

TEST(Values, ATensorOnlyOpRefusesASequenceByName) {
  OnnxBuilder b(17);
  SequenceType(b.graph().add_input(), "seq_in", kFloat, false);
  b.Output("y", kFloat, {-1});
  b.Node("Relu", {"seq_in"}, {"y"});
  auto graph = Import(b);
  auto interp = Interpreter::Create(graph);
  Status s = interp.ok() ? interp->Run({{"seq_in", Tensor::Sequence(DType::kFloat32, {})}}).status()
                         : interp.status();
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_NE(s.message().find("Relu takes tensors only"), std::string::npos) << s.message();
}

TEST(Values, OptionalsHoldAValueOrNone) {
  OnnxBuilder b(18);
  SequenceType(b.graph().add_input(), "maybe", kFloat, true);
  b.Output("has", onnx::TensorProto::BOOL, {});
  b.Node("OptionalHasElement", {"maybe"}, {"has"});
  auto interp = Interpreter::Create(Import(b));
  ASSERT_TRUE(interp.ok()) << interp.status().ToString();
  const Tensor none = Tensor::Optional(ValueKind::kSequence, DType::kFloat32, Tensor());
  const Tensor some = Tensor::Optional(ValueKind::kSequence, DType::kFloat32,
                                       Tensor::Sequence(DType::kFloat32, {}));
  auto a = interp->Run({{"maybe", none}});
  auto c = interp->Run({{"maybe", some}});
  ASSERT_TRUE(a.ok() && c.ok()) << a.status().ToString() << c.status().ToString();
  EXPECT_EQ(a->at("has").GetAsInt64(0), 0);
  EXPECT_EQ(c->at("has").GetAsInt64(0), 1);
  EXPECT_EQ(none.TypeString(), "optional<sequence<float32>>(none)");
}

// The digest tells a sequence input from a tensor input of the same element type.
TEST(Values, DigestCountsTheValueKind) {
  OnnxBuilder as_tensor(17);
  as_tensor.Input("v", kFloat, {3}).Output("y", kFloat, {3});
  as_tensor.Node("Identity", {"v"}, {"y"});
  OnnxBuilder as_sequence(17);
  SequenceType(as_sequence.graph().add_input(), "v", kFloat, false);
  SequenceType(as_sequence.graph().add_output(), "y", kFloat, false);
  as_sequence.Node("Identity", {"v"}, {"y"});
  auto a = GraphDigest(*Import(as_tensor));
  auto b = GraphDigest(*Import(as_sequence));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(*a, *b);
}

}  // namespace
}  // namespace kiln
