// If, Loop and Scan (subgraphs reading outer-scope values) through every layer that walks a graph:
// import (Constants inside branches hoisted as weights), verifier, dead code, digest, the eager
// interpreter, and the compiler (a structural If inlined; an input-dependent If and a counted
// Loop served compiled through the runtime host; a data-dependent Loop refused by name).
//
// Models are built with libonnx's protobuf classes (tests/graph/onnx_builder.h); a subgraph is a
// second builder's graph attached as a graph attribute. Expected values are computed here by
// hand from the ops' definitions.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "src/kiln/arm/loader.h"
#include "src/kiln/base/file.h"
#include "src/kiln/compile/driver.h"
#include "src/kiln/compile/passes.h"
#include "src/kiln/compile/pipeline.h"
#include "src/kiln/eager/interpreter.h"
#include "src/kiln/graph/checkpoint.h"
#include "src/kiln/graph/digest.h"
#include "src/kiln/graph/onnx_import.h"
#include "src/kiln/mint/mint.h"
#include "src/kiln/ops/verifier.h"
#include "tests/graph/onnx_builder.h"

namespace kiln {
namespace {

using testing::kFloat;
using testing::kInt64;
using testing::OnnxBuilder;
constexpr int kBool = onnx::TensorProto::BOOL;

void AttachGraph(onnx::NodeProto& n, const std::string& name, OnnxBuilder& sub) {
  auto* a = n.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::GRAPH);
  a->mutable_g()->CopyFrom(sub.graph());
  a->mutable_g()->set_name(name);
}

std::shared_ptr<const Graph> Import(const OnnxBuilder& b) {
  auto g = ImportOnnxBytes(b.Bytes(), "control-flow test model");
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  if (!g.ok()) return nullptr;
  return std::make_shared<const Graph>(std::move(g).value());
}

Tensor Floats(Shape shape, std::vector<float> v) { return Tensor::FromVector<float>(shape, v); }

void ExpectNear(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.TypeString(), want.TypeString()) << what;
  for (int64_t i = 0; i < want.numel(); ++i) {
    EXPECT_NEAR(got.GetAsDouble(i), want.GetAsDouble(i), 1e-5) << what << " element " << i;
  }
}

// y = If(ReduceSum(x) > zero) then x * w (w: a float Constant inside the branch, so a weight)
//                             else -(x + x)  (x2 = x + x is computed outside, read only here).
struct IfSpec {
  std::string then_op = "Mul";
  std::string inner_name = "t";
  std::vector<float> w = {1, 2, 3};
  std::string undefined_in_then;  // non-empty: the branch reads a name nothing defines
};

OnnxBuilder IfModel(const IfSpec& spec = {}) {
  OnnxBuilder b(17);
  b.Input("x", kFloat, {2, 3}).Output("y", kFloat, {2, 3});
  b.FloatConstant("zero", {}, {0.0f});
  OnnxBuilder::IntAttr(b.Node("ReduceSum", {"x"}, {"s"}, "sum"), "keepdims", 0);
  b.Node("Greater", {"s", "zero"}, {"c"}, "gt");
  b.Node("Add", {"x", "x"}, {"x2"}, "double");
  OnnxBuilder then_b, else_b;
  then_b.FloatConstant("w", {3}, spec.w, "w_const");
  then_b.Node(spec.then_op, {"x", spec.undefined_in_then.empty() ? "w" : spec.undefined_in_then},
              {spec.inner_name}, "scale");
  then_b.Output(spec.inner_name, kFloat, {2, 3});
  else_b.Node("Neg", {"x2"}, {"e"}, "neg");
  else_b.Output("e", kFloat, {2, 3});
  auto& n = b.Node("If", {"c"}, {"y"}, "branch");
  AttachGraph(n, "then_branch", then_b);
  AttachGraph(n, "else_branch", else_b);
  return b;
}

// Loop(M, cond, acc0) with body (i, c_in, acc) -> (c_out, acc + a + i, acc + a + i):
// c_out = ReduceSum(acc') < limit. Outer values: a (input), limit (input).
OnnxBuilder LoopModel(bool nested_if = false, int64_t opset = 17) {
  OnnxBuilder b(opset);
  b.Input("a", kFloat, {3}).Input("limit", kFloat, {}).Input("acc0", kFloat, {3});
  b.Input("m", kInt64, {}).Input("cond", kBool, {});
  b.Output("acc", kFloat, {3}).Output("rows", kFloat, {-1, 3});
  b.Int64Init("two", {}, {2});
  OnnxBuilder body;
  body.Input("i", kInt64, {}).Input("c_in", kBool, {}).Input("acc_in", kFloat, {3});
  OnnxBuilder::IntAttr(body.Node("Cast", {"i"}, {"i_f"}, "cast"), "to", kFloat);
  if (nested_if) {
    // Even-numbered early iterations add a, later ones subtract it: an If inside the body.
    body.Node("Less", {"i", "two"}, {"early"}, "early");
    OnnxBuilder add_b, sub_b;
    add_b.Node("Add", {"acc_in", "a"}, {"p"}, "plus");
    add_b.Output("p", kFloat, {3});
    sub_b.Node("Sub", {"acc_in", "a"}, {"q"}, "minus");
    sub_b.Output("q", kFloat, {3});
    auto& n = body.Node("If", {"early"}, {"acc_a"}, "inner_if");
    AttachGraph(n, "then_branch", add_b);
    AttachGraph(n, "else_branch", sub_b);
  } else {
    body.Node("Add", {"acc_in", "a"}, {"acc_a"}, "plus_a");
  }
  body.Node("Add", {"acc_a", "i_f"}, {"acc_out"}, "plus_i");
  OnnxBuilder::IntAttr(body.Node("ReduceSum", {"acc_out"}, {"total"}, "total"), "keepdims", 0);
  body.Node("Less", {"total", "limit"}, {"c_out"}, "keep_going");
  body.Node("Identity", {"acc_out"}, {"row"}, "row");
  body.Output("c_out", kBool, {}).Output("acc_out", kFloat, {3}).Output("row", kFloat, {3});
  auto& loop = b.Node("Loop", {"m", "cond", "acc0"}, {"acc", "rows"}, "loop");
  AttachGraph(loop, "body", body);
  return b;
}

// The loop above, by hand.
void LoopReference(const std::vector<float>& a, float limit, std::vector<float> acc, int64_t m,
                   bool cond, bool nested_if, Tensor* final_acc, Tensor* rows) {
  std::vector<float> stacked;
  int64_t trips = 0;
  for (int64_t i = 0; i < m && cond; ++i, ++trips) {
    float total = 0;
    for (size_t k = 0; k < 3; ++k) {
      acc[k] += (nested_if && i >= 2 ? -a[k] : a[k]) + static_cast<float>(i);
      total += acc[k];
    }
    cond = total < limit;
    stacked.insert(stacked.end(), acc.begin(), acc.end());
  }
  *final_acc = Floats({3}, acc);
  *rows = trips == 0 ? *Tensor::Empty(DType::kFloat32, {0}) : Floats({trips, 3}, stacked);
}

// Scan over x along `axis` (reversed when `reverse`), state s: s' = s + x_t, y_t = s' * k (k an
// outer input); the scan output is stacked along the same axis.
OnnxBuilder ScanModel(int64_t axis, bool reverse) {
  OnnxBuilder b(16);
  b.Input("s0", kFloat, {2})
      .Input("x", kFloat, axis == 0 ? std::vector<int64_t>{3, 2} : std::vector<int64_t>{2, 3});
  b.Input("k", kFloat, {});
  b.Output("s", kFloat, {2})
      .Output("y", kFloat, axis == 0 ? std::vector<int64_t>{3, 2} : std::vector<int64_t>{2, 3});
  OnnxBuilder body;
  body.Input("s_in", kFloat, {2}).Input("x_t", kFloat, {2});
  body.Node("Add", {"s_in", "x_t"}, {"s_out"}, "acc");
  body.Node("Mul", {"s_out", "k"}, {"y_t"}, "scale");
  body.Output("s_out", kFloat, {2}).Output("y_t", kFloat, {2});
  auto& n = b.Node("Scan", {"s0", "x"}, {"s", "y"}, "scan");
  OnnxBuilder::IntAttr(n, "num_scan_inputs", 1);
  OnnxBuilder::IntsAttr(n, "scan_input_axes", {axis});
  OnnxBuilder::IntsAttr(n, "scan_output_axes", {axis});
  OnnxBuilder::IntsAttr(n, "scan_input_directions", {reverse ? 1 : 0});
  AttachGraph(n, "body", body);
  return b;
}

// The scan above by hand, for x given as rows [t][c] in iteration order before reversal.
void ScanReference(int64_t axis, bool reverse, const Tensor& x, std::vector<float> s, float k,
                   Tensor* final_s, Tensor* y) {
  std::vector<float> out(6);
  for (int64_t step = 0; step < 3; ++step) {
    const int64_t t = reverse ? 2 - step : step;
    for (int64_t c = 0; c < 2; ++c) {
      const int64_t at = axis == 0 ? t * 2 + c : c * 3 + t;
      s[static_cast<size_t>(c)] += x.data<float>()[at];
      out[static_cast<size_t>(axis == 0 ? step * 2 + c : c * 3 + step)] =
          s[static_cast<size_t>(c)] * k;
    }
  }
  *final_s = Floats({2}, s);
  *y = Floats(x.shape(), out);
}

// Scan-8 (opset 8): a batch axis 0 on every operand, the sequence on axis 1 of the scan inputs,
// and an optional sequence_lens. State s [B,2]: s' = s + x_t, y_t = s' * k (k an outer input).
OnnxBuilder Scan8Model(bool with_lens, bool reverse) {
  OnnxBuilder b(8);
  if (with_lens) b.Input("lens", kInt64, {2});
  b.Input("s0", kFloat, {2, 2}).Input("x", kFloat, {2, 3, 2}).Input("k", kFloat, {});
  b.Output("s", kFloat, {2, 2}).Output("y", kFloat, {2, 3, 2});
  OnnxBuilder body;
  body.Input("s_in", kFloat, {2}).Input("x_t", kFloat, {2});
  body.Node("Add", {"s_in", "x_t"}, {"s_out"}, "acc");
  body.Node("Mul", {"s_out", "k"}, {"y_t"}, "scale");
  body.Output("s_out", kFloat, {2}).Output("y_t", kFloat, {2});
  auto& n = b.Node("Scan", {with_lens ? "lens" : "", "s0", "x"}, {"s", "y"}, "scan8");
  OnnxBuilder::IntAttr(n, "num_scan_inputs", 1);
  if (reverse) OnnxBuilder::IntsAttr(n, "directions", {1});
  AttachGraph(n, "body", body);
  return b;
}

// Scan8Model by hand: batch element b runs lens[b] steps over x[b] (x is [2][3][2]); y past a
// sequence's length is zero.
void Scan8Reference(const std::vector<float>& x, std::vector<float> s, float k,
                    const std::vector<int64_t>& lens, bool reverse, Tensor* final_s, Tensor* y) {
  std::vector<float> out(12, 0.0f);
  for (int64_t b = 0; b < 2; ++b) {
    const int64_t len = lens[static_cast<size_t>(b)];
    for (int64_t step = 0; step < len; ++step) {
      const int64_t t = reverse ? len - 1 - step : step;
      for (int64_t c = 0; c < 2; ++c) {
        float& st = s[static_cast<size_t>(b * 2 + c)];
        st += x[static_cast<size_t>((b * 3 + t) * 2 + c)];
        out[static_cast<size_t>((b * 3 + step) * 2 + c)] = st * k;
      }
    }
  }
  *final_s = Floats({2, 2}, s);
  *y = Floats({2, 3, 2}, out);
}

// Loop carrying `acc` whose body declares no type for its carried input and outputs (what ONNX's
// function expansions write, e.g. Range's): the type comes from the loop-carried value.
OnnxBuilder UntypedLoopModel() {
  OnnxBuilder b(17);
  b.Input("a", kFloat, {3}).Input("acc0", kFloat, {3});
  b.Output("acc", kFloat, {3}).Output("rows", kFloat, {4, 3});
  b.Int64Init("m", {}, {4});
  OnnxBuilder body;
  body.Input("i", kInt64, {}).Input("c_in", kBool, {});
  body.graph().add_input()->set_name("acc_in");  // no type at all
  body.Node("Add", {"acc_in", "a"}, {"acc_out"}, "plus_a");
  body.Node("Identity", {"c_in"}, {"c_out"}, "same_cond");
  body.Node("Identity", {"acc_in"}, {"row"}, "row");
  for (const char* name : {"c_out", "acc_out", "row"}) body.graph().add_output()->set_name(name);
  auto& loop = b.Node("Loop", {"m", "", "acc0"}, {"acc", "rows"}, "loop");
  AttachGraph(loop, "body", body);
  return b;
}

Tensor BoolScalar(bool v) {
  const uint8_t b = v;
  return *Tensor::FromBytes(DType::kBool, {}, &b, 1);
}

// ---- import, verifier, dead code ------------------------------------------------------------

TEST(ControlFlowImport, ConstantInsideABranchBecomesATopLevelWeight) {
  auto g = Import(IfModel());
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->WeightNames(), (std::vector<std::string>{"w", "zero"}));
  const Node& n = g->nodes.back();
  ASSERT_EQ(n.op_type, "If");
  EXPECT_TRUE(n.attrs.at("then_branch").g->initializers.empty());
  EXPECT_EQ(n.attrs.at("then_branch").g->nodes.size(), 1u);  // the Constant was lifted
  EXPECT_EQ(ImplicitInputs(n), (std::vector<std::string>{"w", "x", "x2"}));
}

TEST(ControlFlowImport, ANodeOwningASubgraphIsOrderedAfterTheValuesItReads) {
  // The If comes first in the file; its branch reads x2, produced by a later node.
  OnnxBuilder b = IfModel();
  auto* nodes = b.graph().mutable_node();
  std::rotate(nodes->begin(), nodes->end() - 1, nodes->end());
  ASSERT_EQ(b.graph().node(0).op_type(), "If");
  auto g = Import(b);
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->nodes.back().op_type, "If");
}

TEST(ControlFlowImport, SiblingBranchesReusingAConstantNameKeepTheirOwnValues) {
  OnnxBuilder b(17);
  b.Input("c", kBool, {}).Output("y", kFloat, {2});
  OnnxBuilder then_b, else_b;
  then_b.FloatConstant("k", {2}, {1, 2});
  then_b.Output("k", kFloat, {2});
  else_b.FloatConstant("k", {2}, {5, 6});
  else_b.Output("k", kFloat, {2});
  auto& n = b.Node("If", {"c"}, {"y"}, "pick");
  AttachGraph(n, "then_branch", then_b);
  AttachGraph(n, "else_branch", else_b);
  auto g = Import(b);
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->WeightNames().size(), 2u);
  auto interp = Interpreter::Create(g);
  ASSERT_TRUE(interp.ok()) << interp.status().ToString();
  auto t = interp->Run({{"c", BoolScalar(true)}});
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ExpectNear(t->at("y"), Floats({2}, {1, 2}), "then");
  auto e = interp->Run({{"c", BoolScalar(false)}});
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  ExpectNear(e->at("y"), Floats({2}, {5, 6}), "else");
}

TEST(ControlFlowImport, AnUntypedSubgraphValueTakesItsTypeFromItsBinding) {
  auto g = Import(UntypedLoopModel());
  ASSERT_NE(g, nullptr);
  const Graph& body = *g->nodes.back().attrs.at("body").g;
  EXPECT_TRUE(body.inputs[0].has_type);
  EXPECT_FALSE(body.inputs[2].has_type);
  EXPECT_FALSE(body.outputs[1].has_type);
  EXPECT_TRUE(VerifyGraph(*g).ok());
}

TEST(ControlFlowImport, UntypedTopLevelValuesAndNonTensorBodyValuesAreRefusedByName) {
  OnnxBuilder top = UntypedLoopModel();
  top.graph().mutable_input(0)->clear_type();
  auto g = ImportOnnxBytes(top.Bytes(), "m");
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument) << g.status().ToString();
  EXPECT_NE(g.status().message().find("graph input 'a' declares no type"), std::string::npos)
      << g.status().ToString();
  OnnxBuilder no_elem = UntypedLoopModel();
  no_elem.graph().mutable_output(0)->mutable_type()->mutable_tensor_type()->set_elem_type(0);
  g = ImportOnnxBytes(no_elem.Bytes(), "m");
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("graph output 'acc' declares no element type"),
            std::string::npos)
      << g.status().ToString();
  OnnxBuilder seq = UntypedLoopModel();
  onnx::GraphProto* body = seq.graph().mutable_node(0)->mutable_attribute(0)->mutable_g();
  // Sequences and optionals are values kiln takes; a map is not.
  body->mutable_input(2)->mutable_type()->mutable_map_type()->set_key_type(
      onnx::TensorProto::INT64);
  g = ImportOnnxBytes(seq.Bytes(), "m");
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kUnimplemented) << g.status().ToString();
  EXPECT_NE(g.status().message().find("graph input 'acc_in' is not a tensor, a sequence"),
            std::string::npos)
      << g.status().ToString();
}

TEST(ControlFlowVerifier, AnUndefinedNameInsideABranchIsNamedWithItsPath) {
  IfSpec spec;
  spec.undefined_in_then = "nowhere";
  auto g = ImportOnnxBytes(IfModel(spec).Bytes(), "m");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  Status s = VerifyGraph(*g);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("If 'branch' attribute 'then_branch'"), std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("Mul 'scale'"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("'nowhere'"), std::string::npos) << s.message();
}

TEST(ControlFlowVerifier, BadSubgraphAttributesAreRejectedByName) {
  struct Case {
    OnnxBuilder model;
    std::string fragment;
  };
  std::vector<Case> cases;
  {
    OnnxBuilder b = ScanModel(0, false);
    auto* n = b.graph().mutable_node(0);
    for (auto& a : *n->mutable_attribute()) {
      if (a.name() == "scan_input_directions") a.set_ints(0, 2);
    }
    cases.push_back({b, "Scan 'scan': scan direction 2 must be 0 (forward) or 1 (reverse)"});
  }
  for (const auto& [dirs, fragment] :
       {std::pair<std::vector<int64_t>, std::string>{
            {2}, "Scan 'scan8': attribute 'directions' has value 2, expected 0 (forward) or 1"},
        {{0, 1}, "Scan 'scan8': attribute 'directions' has 2 values, expected 1"}}) {
    OnnxBuilder b = Scan8Model(true, false);
    OnnxBuilder::IntsAttr(*b.graph().mutable_node(0), "directions", dirs);
    cases.push_back({b, fragment});
  }
  {
    OnnxBuilder b = Scan8Model(false, false);
    for (auto& a : *b.graph().mutable_node(0)->mutable_attribute()) {
      if (a.name() == "num_scan_inputs") a.set_i(3);
    }
    cases.push_back({b, "Scan 'scan8': num_scan_inputs=3 must be in [1, 2]"});
  }
  {
    OnnxBuilder b = LoopModel();
    b.graph().mutable_node(0)->mutable_attribute(0)->mutable_g()->mutable_input()->RemoveLast();
    cases.push_back({b, "Loop 'loop': body declares 2 inputs, expected 3"});
  }
  {
    OnnxBuilder b = IfModel();
    auto* n = b.graph().mutable_node(b.graph().node_size() - 1);
    n->mutable_attribute()->RemoveLast();
    cases.push_back({b, "If 'branch': required subgraph attribute 'else_branch' is missing"});
  }
  for (const Case& c : cases) {
    auto g = ImportOnnxBytes(c.model.Bytes(), "m");
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    Status s = VerifyGraph(*g);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    EXPECT_NE(s.message().find(c.fragment), std::string::npos) << s.message();
  }
}

TEST(ControlFlowPasses, DeadCodeKeepsAnOuterValueUsedOnlyInsideABranch) {
  auto g = Import(IfModel());
  ASSERT_NE(g, nullptr);
  Graph graph = *g;
  ASSERT_TRUE(EliminateDeadNodes(graph).ok());
  bool has_double = false;
  for (const Node& n : graph.nodes) has_double = has_double || n.name == "double";
  EXPECT_TRUE(has_double) << "x2 is read only by the else branch and must stay";
  EXPECT_TRUE(graph.initializers.count("w"));
  EXPECT_TRUE(VerifyGraph(graph).ok());
}

// ---- digest ---------------------------------------------------------------------------------

std::string Digest(const OnnxBuilder& b) {
  auto g = ImportOnnxBytes(b.Bytes(), "m");
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  auto d = GraphDigest(*g);
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  return d.ok() ? *d : "";
}

TEST(ControlFlowDigest, BranchContentCountsRenamesAndWeightValuesDoNot) {
  const std::string base = Digest(IfModel());
  IfSpec other_op;
  other_op.then_op = "Add";
  EXPECT_NE(Digest(IfModel(other_op)), base) << "an op inside a branch is the graph's";
  IfSpec renamed;
  renamed.inner_name = "scaled_inside";
  EXPECT_EQ(Digest(IfModel(renamed)), base) << "a value name inside a branch is cosmetic";
  IfSpec new_weights;
  new_weights.w = {7, 8, 9};
  EXPECT_EQ(Digest(IfModel(new_weights)), base) << "a weight value inside a branch is checkpoint";
  EXPECT_NE(Digest(LoopModel(true)), Digest(LoopModel(false))) << "a nested If is content";
}

TEST(ControlFlowDigest, LoopBodyInputsBindByPositionSoTheirNamesAreCosmetic) {
  OnnxBuilder renamed = LoopModel();
  onnx::GraphProto* body = renamed.graph().mutable_node(0)->mutable_attribute(0)->mutable_g();
  body->mutable_input(2)->set_name("carried_state");
  for (auto& n : *body->mutable_node()) {
    for (auto& in : *n.mutable_input()) {
      if (in == "acc_in") in = "carried_state";
    }
  }
  EXPECT_EQ(Digest(renamed), Digest(LoopModel()));
  // Swapping which position the body reads (acc_in and the iteration number) is content.
  OnnxBuilder swapped = LoopModel();
  body = swapped.graph().mutable_node(0)->mutable_attribute(0)->mutable_g();
  body->mutable_input(0)->set_name("acc_in");
  body->mutable_input(2)->set_name("i");
  EXPECT_NE(Digest(swapped), Digest(LoopModel()));
}

TEST(ControlFlowDigest, AnUntypedBodyValueDigestsApartFromATypedOne) {
  OnnxBuilder typed = UntypedLoopModel();
  onnx::GraphProto* body = typed.graph().mutable_node(0)->mutable_attribute(0)->mutable_g();
  body->mutable_input(2)->mutable_type()->mutable_tensor_type()->set_elem_type(kFloat);
  EXPECT_NE(Digest(typed), Digest(UntypedLoopModel()));
}

// ---- eager ----------------------------------------------------------------------------------

TEST(ControlFlowEager, IfOnAnInputDependentConditionTakesBothBranches) {
  auto g = Import(IfModel());
  ASSERT_NE(g, nullptr);
  auto interp = Interpreter::Create(g);
  ASSERT_TRUE(interp.ok()) << interp.status().ToString();
  auto pos = interp->Run({{"x", Floats({2, 3}, {1, 2, 3, 4, 5, 6})}});
  ASSERT_TRUE(pos.ok()) << pos.status().ToString();
  ExpectNear(pos->at("y"), Floats({2, 3}, {1, 4, 9, 4, 10, 18}), "then: x * w");
  auto neg = interp->Run({{"x", Floats({2, 3}, {-1, -2, -3, 1, 0, 0})}});
  ASSERT_TRUE(neg.ok()) << neg.status().ToString();
  ExpectNear(neg->at("y"), Floats({2, 3}, {2, 4, 6, -2, 0, 0}), "else: -(x + x)");
  // A checkpoint binds the weight inside the branch by name.
  WeightMap weights = GraphWeights(*g);
  weights["w"] = Floats({3}, {10, 10, 10});
  auto bound = interp->Run({{"x", Floats({2, 3}, {1, 2, 3, 4, 5, 6})}}, &weights);
  ASSERT_TRUE(bound.ok()) << bound.status().ToString();
  ExpectNear(bound->at("y"), Floats({2, 3}, {10, 20, 30, 40, 50, 60}), "then with bound w");
}

TEST(ControlFlowEager, LoopWithTripCountCondAndScanOutputs) {
  // Loop-11, -13 and -16 differ only in the types they admit (sequences, optionals).
  for (int64_t opset : {11, 13, 16, 17}) {
    SCOPED_TRACE("opset " + std::to_string(opset));
    auto g = Import(LoopModel(false, opset));
    ASSERT_NE(g, nullptr);
    auto interp = Interpreter::Create(g);
    ASSERT_TRUE(interp.ok()) << interp.status().ToString();
    struct Case {
      float limit;
      int64_t m;
      bool cond;
    };
    // Runs all M trips; stops early on the body's condition; never starts (cond false); M = 0.
    for (const Case& c :
         {Case{1000, 4, true}, Case{10, 6, true}, Case{1000, 3, false}, Case{1000, 0, true}}) {
      const std::vector<float> a = {1, 2, 3}, acc0 = {0.5f, 0, -1};
      auto out = interp->Run({{"a", Floats({3}, a)},
                              {"limit", Tensor::Scalar<float>(c.limit)},
                              {"acc0", Floats({3}, acc0)},
                              {"m", Tensor::Scalar<int64_t>(c.m)},
                              {"cond", BoolScalar(c.cond)}});
      ASSERT_TRUE(out.ok()) << out.status().ToString();
      Tensor want_acc, want_rows;
      LoopReference(a, c.limit, acc0, c.m, c.cond, false, &want_acc, &want_rows);
      const std::string what = "limit " + std::to_string(c.limit) + " m " + std::to_string(c.m);
      ExpectNear(out->at("acc"), want_acc, what + " acc");
      if (want_rows.numel() > 0) {
        ExpectNear(out->at("rows"), want_rows, what + " rows");
      } else {
        EXPECT_EQ(out->at("rows").numel(), 0) << what;
      }
    }
  }
}

TEST(ControlFlowEager, NestedIfInsideALoopBody) {
  auto g = Import(LoopModel(/*nested_if=*/true));
  ASSERT_NE(g, nullptr);
  auto interp = Interpreter::Create(g);
  ASSERT_TRUE(interp.ok()) << interp.status().ToString();
  const std::vector<float> a = {1, 2, 3}, acc0 = {0, 0, 0};
  auto out = interp->Run({{"a", Floats({3}, a)},
                          {"limit", Tensor::Scalar<float>(1000)},
                          {"acc0", Floats({3}, acc0)},
                          {"m", Tensor::Scalar<int64_t>(5)},
                          {"cond", BoolScalar(true)}});
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  Tensor want_acc, want_rows;
  LoopReference(a, 1000, acc0, 5, true, true, &want_acc, &want_rows);
  ExpectNear(out->at("acc"), want_acc, "acc");
  ExpectNear(out->at("rows"), want_rows, "rows");
}

TEST(ControlFlowEager, ScanForwardAndReversedAlongEitherAxis) {
  for (int64_t axis : {0, 1}) {
    for (bool reverse : {false, true}) {
      SCOPED_TRACE("axis " + std::to_string(axis) + (reverse ? " reversed" : ""));
      auto g = Import(ScanModel(axis, reverse));
      ASSERT_NE(g, nullptr);
      auto interp = Interpreter::Create(g);
      ASSERT_TRUE(interp.ok()) << interp.status().ToString();
      const Tensor x = Floats(axis == 0 ? Shape{3, 2} : Shape{2, 3}, {1, 2, 3, 4, 5, 6});
      auto out =
          interp->Run({{"s0", Floats({2}, {0.5f, -1})}, {"x", x}, {"k", Tensor::Scalar(2.0f)}});
      ASSERT_TRUE(out.ok()) << out.status().ToString();
      Tensor want_s, want_y;
      ScanReference(axis, reverse, x, {0.5f, -1}, 2.0f, &want_s, &want_y);
      ExpectNear(out->at("s"), want_s, "final state");
      ExpectNear(out->at("y"), want_y, "scan output");
    }
  }
}

TEST(ControlFlowEager, Scan8BatchesWithAndWithoutSequenceLengths) {
  const std::vector<float> x = {1, 2, 3, 4, 5, 6, -1, -2, -3, -4, -5, -6};
  const std::vector<float> s0 = {0.5f, -1, 2, 0};
  struct Case {
    bool with_lens;
    std::vector<int64_t> lens;
  };
  for (bool reverse : {false, true}) {
    for (const Case& c : {Case{false, {3, 3}}, Case{true, {3, 1}}, Case{true, {0, 2}}}) {
      SCOPED_TRACE(std::string(reverse ? "reversed" : "forward") + " lens " +
                   std::to_string(c.lens[0]) + "," + std::to_string(c.lens[1]));
      auto g = Import(Scan8Model(c.with_lens, reverse));
      ASSERT_NE(g, nullptr);
      auto interp = Interpreter::Create(g);
      ASSERT_TRUE(interp.ok()) << interp.status().ToString();
      TensorMap in = {
          {"s0", Floats({2, 2}, s0)}, {"x", Floats({2, 3, 2}, x)}, {"k", Tensor::Scalar(2.0f)}};
      if (c.with_lens) in["lens"] = Tensor::FromVector<int64_t>({2}, c.lens);
      auto out = interp->Run(in);
      ASSERT_TRUE(out.ok()) << out.status().ToString();
      Tensor want_s, want_y;
      Scan8Reference(x, s0, 2.0f, c.lens, reverse, &want_s, &want_y);
      ExpectNear(out->at("s"), want_s, "final state");
      ExpectNear(out->at("y"), want_y, "scan output");
    }
  }
}

TEST(ControlFlowEager, Scan8RefusesASequenceLengthPastTheSequenceDim) {
  auto g = Import(Scan8Model(true, false));
  ASSERT_NE(g, nullptr);
  auto interp = Interpreter::Create(g);
  ASSERT_TRUE(interp.ok()) << interp.status().ToString();
  auto out = interp->Run({{"lens", Tensor::FromVector<int64_t>({2}, {1, 4})},
                          {"s0", Floats({2, 2}, {0, 0, 0, 0})},
                          {"x", Floats({2, 3, 2}, std::vector<float>(12, 1.0f))},
                          {"k", Tensor::Scalar(1.0f)}});
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument) << out.status().ToString();
  EXPECT_NE(out.status().message().find("Scan 'scan8': sequence_lens[1]=4 is outside [0, 3]"),
            std::string::npos)
      << out.status().ToString();
}

TEST(ControlFlowEager, LoopWithAnUntypedBodyCarriesTheInitialValuesType) {
  auto g = Import(UntypedLoopModel());
  ASSERT_NE(g, nullptr);
  auto interp = Interpreter::Create(g);
  ASSERT_TRUE(interp.ok()) << interp.status().ToString();
  auto out = interp->Run({{"a", Floats({3}, {1, 2, 3})}, {"acc0", Floats({3}, {0.5f, 0, -1})}});
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  ExpectNear(out->at("acc"), Floats({3}, {4.5f, 8, 11}), "acc0 + 4a");
  ExpectNear(out->at("rows"), Floats({4, 3}, {0.5f, 0, -1, 1.5f, 2, 2, 2.5f, 4, 5, 3.5f, 6, 8}),
             "acc before each trip");
}

// ---- compiled -------------------------------------------------------------------------------

struct Compiled {
  std::unique_ptr<ArmedCell> cell;
  std::vector<Program> programs;
};

// Generates, builds, loads and arms a one-entry-per-class cell (no gate: the tests compare).
Result<Compiled> Compile(std::shared_ptr<const Graph> g, const Envelope& env,
                         const WeightMap& weights, const std::string& tag) {
  Compiled out;
  KILN_ASSIGN_OR_RETURN(EmittedCell cell,
                        GenerateCell(*g, env, "control-flow", {}, nullptr, &out.programs));
  KILN_ASSIGN_OR_RETURN(Toolchain toolchain, LocalToolchain());
  auto driver = MakeSystemCompilerDriver(toolchain);
  const std::string dir = "/tmp/kiln-ctrl-" + tag + "-" + std::to_string(::getpid());
  KILN_RETURN_IF_ERROR(MakeDirs(dir));
  KILN_ASSIGN_OR_RETURN(
      std::string so, BuildSharedObject(cell.source, env.classes.size(), DefaultSmTarget(), "ctrl",
                                        *driver, dir, 2, nullptr));
  auto opened = OpenCellBytes(so, dir + "/load");
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);  // the mapping outlives the file; nothing is left in /tmp
  KILN_ASSIGN_OR_RETURN(auto lib, std::move(opened));
  KILN_ASSIGN_OR_RETURN(std::vector<EntryMetadata> entries,
                        EntriesFromDescribe(cell.describe, env));
  KILN_ASSIGN_OR_RETURN(out.cell, ArmedCell::Arm(lib, entries, weights, Lane::kIntake, "", 1));
  return out;
}

bool HasOp(const Program& p, const std::string& op) {
  for (const Kernel& k : p.kernels) {
    if (k.node.op_type == op) return true;
  }
  return false;
}

TEST(ControlFlowCompiled, StructuralIfIsInlinedAndTheCellHoldsNoIf) {
  // cond = Shape(x)[0] > 2: known per shape class, so each entry holds only its branch.
  OnnxBuilder b(17);
  b.Input("x", kFloat, {-1, 3}).Output("y", kFloat, {-1, 3});
  b.Int64Init("zero_idx", {}, {0});
  b.Int64Init("two", {}, {2});
  b.Node("Shape", {"x"}, {"shape"}, "shape");
  b.Node("Gather", {"shape", "zero_idx"}, {"rows"}, "rows");
  b.Node("Greater", {"rows", "two"}, {"big"}, "big");
  OnnxBuilder then_b, else_b;
  then_b.FloatConstant("w", {3}, {1, 2, 3});
  then_b.Node("Mul", {"x", "w"}, {"t"}, "scale");
  then_b.Output("t", kFloat, {-1, 3});
  else_b.Node("Neg", {"x"}, {"e"}, "neg");
  else_b.Output("e", kFloat, {-1, 3});
  auto& n = b.Node("If", {"big"}, {"y"}, "by_rows");
  AttachGraph(n, "then_branch", then_b);
  AttachGraph(n, "else_branch", else_b);
  auto g = Import(b);
  ASSERT_NE(g, nullptr);
  Envelope env{{{{"x", {1, 3}}}, {{"x", {4, 3}}}}};
  auto c = Compile(g, env, GraphWeights(*g), "structural");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  for (const Program& p : c->programs) {
    EXPECT_FALSE(HasOp(p, "If")) << p.Dump();
  }
  EXPECT_EQ(c->programs[0].Dump().find("Mul"), std::string::npos) << "1 row: the else branch";
  EXPECT_NE(c->programs[1].Dump().find("Mul"), std::string::npos) << "4 rows: the then branch";
  auto interp = Interpreter::Create(g);
  ASSERT_TRUE(interp.ok());
  for (uint32_t e = 0; e < 2; ++e) {
    const int64_t rows = e == 0 ? 1 : 4;
    std::vector<float> v(static_cast<size_t>(rows * 3));
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i) - 2.5f;
    TensorMap in = {{"x", Floats({rows, 3}, v)}};
    auto want = interp->Run(in);
    ASSERT_TRUE(want.ok()) << want.status().ToString();
    auto got = c->cell->Run(e, in);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ExpectNear(got->at("y"), want->at("y"), "entry " + std::to_string(e));
  }
}

TEST(ControlFlowCompiled, InputDependentIfRunsThroughTheHostAndServesBothBranches) {
  auto g = Import(IfModel());
  ASSERT_NE(g, nullptr);
  Envelope env{{{{"x", {2, 3}}}}};
  WeightMap weights = GraphWeights(*g);
  weights["w"] = Floats({3}, {-1, 0.5f, 4});  // a bound checkpoint reaches inside the branch
  auto c = Compile(g, env, weights, "dynamic-if");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(HasOp(c->programs[0], "If")) << "the condition is data: the If stays";
  auto interp = Interpreter::Create(g);
  ASSERT_TRUE(interp.ok());
  for (const auto& x :
       {Floats({2, 3}, {1, 2, 3, 4, 5, 6}), Floats({2, 3}, {-1, -2, -3, 1, 0, 0})}) {
    TensorMap in = {{"x", x}};
    auto want = interp->Run(in, &weights);
    ASSERT_TRUE(want.ok()) << want.status().ToString();
    auto got = c->cell->Run(0, in);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ExpectNear(got->at("y"), want->at("y"), "compiled If");
  }
}

TEST(ControlFlowCompiled, MintProvesTheFenceThroughAWeightInsideABranch) {
  auto g = Import(IfModel());
  ASSERT_NE(g, nullptr);
  MintRequest r;
  r.graph = g;
  r.envelope = Envelope{{{{"x", {2, 3}}}}};
  r.family = "test/control-flow";
  r.weights = GraphWeights(*g);
  auto m = MintCell(r);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->gate.verdict, Verdict::kHealthy) << m->gate.Summary();
  EXPECT_TRUE(m->metadata.fence.perturbed_checkpoint_matched);
  bool lists_w = false;
  for (const auto& t : m->metadata.entries[0].constants) lists_w = lists_w || t.name == "w";
  EXPECT_TRUE(lists_w) << "the constant table lists the weight that lives inside the branch";
}

// Loop with a structural M and a body that passes its condition through: the trip count is
// known per class, so the loop (with an If nested in its body) runs compiled through the host.
TEST(ControlFlowCompiled, CountedLoopWithNestedIfRunsCompiled) {
  OnnxBuilder b(17);
  b.Input("a", kFloat, {3}).Output("acc", kFloat, {3}).Output("rows", kFloat, {4, 3});
  b.Int64Init("m", {}, {4});
  b.Int64Init("two", {}, {2});
  b.FloatInit("acc0", {3}, {0.5f, 0, -1});  // a weight read as a loop-carried initial value
  OnnxBuilder body;
  body.Input("i", kInt64, {}).Input("c_in", kBool, {}).Input("acc_in", kFloat, {3});
  body.Node("Less", {"i", "two"}, {"early"}, "early");
  OnnxBuilder add_b, sub_b;
  add_b.Node("Add", {"acc_in", "a"}, {"p"}, "plus");
  add_b.Output("p", kFloat, {3});
  sub_b.Node("Sub", {"acc_in", "a"}, {"q"}, "minus");
  sub_b.Output("q", kFloat, {3});
  auto& inner = body.Node("If", {"early"}, {"acc_a"}, "inner_if");
  AttachGraph(inner, "then_branch", add_b);
  AttachGraph(inner, "else_branch", sub_b);
  OnnxBuilder::IntAttr(body.Node("Cast", {"i"}, {"i_f"}, "cast"), "to", kFloat);
  body.Node("Add", {"acc_a", "i_f"}, {"acc_out"}, "plus_i");
  body.Node("Identity", {"c_in"}, {"c_out"}, "same_cond");
  body.Node("Identity", {"acc_out"}, {"row"}, "row");
  body.Output("c_out", kBool, {}).Output("acc_out", kFloat, {3}).Output("row", kFloat, {3});
  auto& loop = b.Node("Loop", {"m", "", "acc0"}, {"acc", "rows"}, "loop");
  AttachGraph(loop, "body", body);
  auto g = Import(b);
  ASSERT_NE(g, nullptr);
  auto c = Compile(g, Envelope{{{{"a", {3}}}}}, GraphWeights(*g), "loop");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(HasOp(c->programs[0], "Loop"));
  const std::vector<float> a = {1, 2, 3};
  TensorMap in = {{"a", Floats({3}, a)}};
  auto got = c->cell->Run(0, in);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  Tensor want_acc, want_rows;
  LoopReference(a, 1e9f, {0.5f, 0, -1}, 4, true, true, &want_acc, &want_rows);
  ExpectNear(got->at("acc"), want_acc, "acc");
  ExpectNear(got->at("rows"), want_rows, "rows");
}

TEST(ControlFlowCompiled, ScanHasStaticShapesAndRunsCompiled) {
  auto g = Import(ScanModel(1, true));
  ASSERT_NE(g, nullptr);
  auto c = Compile(g, Envelope{{{{"s0", {2}}, {"x", {2, 3}}, {"k", {}}}}}, {}, "scan");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const Tensor x = Floats({2, 3}, {1, 2, 3, 4, 5, 6});
  auto got =
      c->cell->Run(0, {{"s0", Floats({2}, {0.5f, -1})}, {"x", x}, {"k", Tensor::Scalar(3.0f)}});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  Tensor want_s, want_y;
  ScanReference(1, true, x, {0.5f, -1}, 3.0f, &want_s, &want_y);
  ExpectNear(got->at("s"), want_s, "final state");
  ExpectNear(got->at("y"), want_y, "scan output");
}

TEST(ControlFlowCompiled, Scan8WithSequenceLengthsRunsCompiled) {
  auto g = Import(Scan8Model(true, true));
  ASSERT_NE(g, nullptr);
  auto c = Compile(g, Envelope{{{{"lens", {2}}, {"s0", {2, 2}}, {"x", {2, 3, 2}}, {"k", {}}}}}, {},
                   "scan8");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const std::vector<float> x = {1, 2, 3, 4, 5, 6, -1, -2, -3, -4, -5, -6};
  const std::vector<float> s0 = {0.5f, -1, 2, 0};
  auto got = c->cell->Run(0, {{"lens", Tensor::FromVector<int64_t>({2}, {2, 3})},
                              {"s0", Floats({2, 2}, s0)},
                              {"x", Floats({2, 3, 2}, x)},
                              {"k", Tensor::Scalar(3.0f)}});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  Tensor want_s, want_y;
  Scan8Reference(x, s0, 3.0f, {2, 3}, true, &want_s, &want_y);
  ExpectNear(got->at("s"), want_s, "final state");
  ExpectNear(got->at("y"), want_y, "scan output");
}

TEST(ControlFlowCompiled, LoopWithAnUntypedBodyRunsCompiled) {
  auto g = Import(UntypedLoopModel());
  ASSERT_NE(g, nullptr);
  auto c = Compile(g, Envelope{{{{"a", {3}}, {"acc0", {3}}}}}, {}, "untyped");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(HasOp(c->programs[0], "Loop"));
  auto got = c->cell->Run(0, {{"a", Floats({3}, {1, 2, 3})}, {"acc0", Floats({3}, {0.5f, 0, -1})}});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ExpectNear(got->at("acc"), Floats({3}, {4.5f, 8, 11}), "acc0 + 4a");
}

// The cell and eager give the same outputs, shapes included, for each set of inputs.
void ExpectCellFollowsEager(const Compiled& c, const Interpreter& eager,
                            const std::vector<TensorMap>& runs) {
  for (size_t r = 0; r < runs.size(); ++r) {
    auto want = eager.Run(runs[r]);
    ASSERT_TRUE(want.ok()) << "run " << r << ": " << want.status().ToString();
    auto got = c.cell->Run(0, runs[r]);
    ASSERT_TRUE(got.ok()) << "run " << r << ": " << got.status().ToString();
    for (const auto& [name, w] : *want)
      ExpectNear(got->at(name), w, name + " run " + std::to_string(r));
  }
}

// The body decides when to stop: the scan output's leading dim is data. The Loop runs in the
// entry's dynamic region, and its outputs come back with the shape each run gives them.
TEST(ControlFlowCompiled, ADataDependentLoopRunsInTheDynamicRegion) {
  auto g = Import(LoopModel());
  ASSERT_NE(g, nullptr);
  ShapeClass cls = {{"a", {3}}, {"limit", {}}, {"acc0", {3}}, {"m", {}}, {"cond", {}}};
  auto c = Compile(g, Envelope{{cls}}, {}, "dynloop");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(HasOp(c->programs[0], kDynamicRegionOp)) << c->programs[0].Dump();
  auto eager = Interpreter::Create(g);
  ASSERT_TRUE(eager.ok());
  std::vector<TensorMap> runs;
  for (float limit : {5.0f, 40.0f}) {
    runs.push_back({{"a", Floats({3}, {1, 2, 3})},
                    {"limit", Tensor::Scalar(limit)},
                    {"acc0", Floats({3}, {0, 0, 0})},
                    {"m", Tensor::FromVector<int64_t>({}, {10})},
                    {"cond", BoolScalar(true)}});
  }
  ExpectCellFollowsEager(*c, *eager, runs);
}

// A body that never stops the loop runs M times: an M given at run time makes the Loop dynamic.
TEST(ControlFlowCompiled, ALoopWithARuntimeTripCountRunsInTheDynamicRegion) {
  OnnxBuilder b = UntypedLoopModel();
  b.graph().mutable_initializer()->Clear();
  b.Input("m", kInt64, {});
  // The rows output has M rows: its declared shape says nothing more.
  b.graph().mutable_output(1)->mutable_type()->mutable_tensor_type()->clear_shape();
  auto g = Import(b);
  ASSERT_NE(g, nullptr);
  auto c = Compile(g, Envelope{{{{"a", {3}}, {"acc0", {3}}, {"m", {}}}}}, {}, "dynm");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(HasOp(c->programs[0], kDynamicRegionOp)) << c->programs[0].Dump();
  auto eager = Interpreter::Create(g);
  ASSERT_TRUE(eager.ok());
  std::vector<TensorMap> runs;
  for (int64_t m : {1, 2, 5}) {
    runs.push_back({{"a", Floats({3}, {1, 2, 3})},
                    {"acc0", Floats({3}, {0.5f, 0, -1})},
                    {"m", Tensor::FromVector<int64_t>({}, {m})}});
  }
  ExpectCellFollowsEager(*c, *eager, runs);
}

// Branches of different output shapes on a condition given at run time: the If is dynamic.
TEST(ControlFlowCompiled, AnIfWhoseBranchesDisagreeOnADataConditionRunsInTheDynamicRegion) {
  OnnxBuilder b(17);
  b.Input("c", kBool, {}).Input("x", kFloat, {4}).Output("y", kFloat, {-1});
  b.Int64Init("halves", {2}, {2, 2});
  OnnxBuilder then_b, else_b;
  then_b.Node("Identity", {"x"}, {"t"});
  then_b.Output("t", kFloat, {4});
  OnnxBuilder::IntAttr(else_b.Node("Split", {"x", "halves"}, {"e1", "e2"}), "axis", 0);
  else_b.Output("e1", kFloat, {2});
  auto& n = b.Node("If", {"c"}, {"y"}, "ragged");
  AttachGraph(n, "then_branch", then_b);
  AttachGraph(n, "else_branch", else_b);
  auto g = Import(b);
  ASSERT_NE(g, nullptr);
  auto eager = Interpreter::Create(g);
  ASSERT_TRUE(eager.ok());
  auto e = eager->Run({{"c", BoolScalar(false)}, {"x", Floats({4}, {1, 2, 3, 4})}});
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  ExpectNear(e->at("y"), Floats({2}, {1, 2}), "else half");
  auto c = Compile(g, Envelope{{{{"c", {}}, {"x", {4}}}}}, {}, "ragged");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(HasOp(c->programs[0], kDynamicRegionOp)) << c->programs[0].Dump();
  ExpectCellFollowsEager(*c, *eager,
                         {{{"c", BoolScalar(false)}, {"x", Floats({4}, {1, 2, 3, 4})}},
                          {{"c", BoolScalar(true)}, {"x", Floats({4}, {1, 2, 3, 4})}}});
}

}  // namespace
}  // namespace kiln
