// Input/Expected IR tests, one per pass of compile/pipeline.cc: a small graph goes through the
// pipeline with its IR dumped after every pass (what `kiln mint --dump-ir` prints), and each test
// pins the text a pass takes in and the text it leaves, so a folding or fusion rule is written
// down where a reader can check it (the way TVM's pass tests give an input module and the
// expected one). A failure prints both texts. To add a pass: add its test here with a graph that
// makes it change something; PassIr.EveryPassHasATest fails until one exists.
//
// Graph text (before `lower`): one line per graph input with its type, then one per node,
// "outputs = Op(inputs)". Program text (from `lower` on): Program::Dump().
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "src/kiln/compile/pipeline.h"
#include "src/kiln/graph/onnx_import.h"
#include "tests/graph/onnx_builder.h"

namespace kiln {
namespace {

using testing::kFloat;
using testing::OnnxBuilder;

// The passes the tests below pin, one test each. PassIr.EveryPassHasATest holds it to the
// pipeline's own list, and ExpectPass to the tests.
const std::set<std::string> kTested = {
    "specialize",         "fold-structural", "decompose-batch-norm",
    "dead-code",          "lower",           "fuse-conv-epilogue",
    "fuse-elementwise",   "fuse-group-norm", "fuse-library-epilogue",
    "fold-gemm-bias",     "fold-gemm-gelu",  "fuse-attention",
    "choose-conv-layout", "plan-layout",     "plan-memory"};

// The IR after each pass of entry 0 for `shape_class`, as the pipeline dumps it, with
// "(unchanged)" resolved to the text before it, and under "input" the graph as imported.
std::map<std::string, std::string> IrAfterEachPass(const std::string& onnx_bytes,
                                                   const ShapeClass& shape_class) {
  std::map<std::string, std::string> ir;
  auto g = ImportOnnxBytes(onnx_bytes, "pass_ir");
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  if (!g.ok()) return ir;
  std::ostringstream dump;
  CompileOptions options;
  options.dump = &dump;
  auto p = CompileEntry(*g, shape_class, 0, options, nullptr);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  std::istringstream in(dump.str());
  std::string line, pass, previous;
  const std::string marker = "== entry0 after ";
  const std::string input_marker = "== entry0 input";
  auto close = [&] {
    if (pass.empty()) return;
    if (ir[pass] == "(unchanged)\n") ir[pass] = previous;
    previous = ir[pass];
  };
  while (std::getline(in, line)) {
    if (line.rfind(marker, 0) == 0 || line == input_marker) {
      close();
      pass = line == input_marker ? "input" : line.substr(marker.size());
      ir[pass] = "";
    } else if (!pass.empty()) {
      ir[pass] += line + "\n";
    }
  }
  close();
  return ir;
}

// The pass before `pass` in the pipeline ("input" for the first).
std::string PassBefore(const std::string& pass) {
  const std::vector<std::string>& names = PassNames();
  for (size_t i = 1; i < names.size(); ++i) {
    if (names[i] == pass) return names[i - 1];
  }
  return "input";
}

// `pass` took `input` (the text the pass before it left) and left `expected`.
void ExpectPass(const std::map<std::string, std::string>& ir, const std::string& pass,
                const std::string& input, const std::string& expected) {
  ASSERT_TRUE(kTested.count(pass)) << pass << " is missing from kTested";
  const std::string before_pass = PassBefore(pass);
  ASSERT_TRUE(ir.count(pass)) << "no IR after " << pass;
  ASSERT_TRUE(ir.count(before_pass)) << "no IR after " << before_pass;
  EXPECT_EQ(ir.at(before_pass), input) << "the input of " << pass << " is\n"
                                       << ir.at(before_pass) << "expected\n"
                                       << input;
  EXPECT_EQ(ir.at(pass), expected) << pass << " left\n" << ir.at(pass) << "expected\n" << expected;
}

// Specialize pins every graph input to the class's shape; the nodes stay as they are.
TEST(PassIr, Specialize) {
  OnnxBuilder b;
  b.Input("x", kFloat, {-1, 8}).Output("y", kFloat, {-1, 8});
  b.Node("Relu", {"x"}, {"y"});
  auto ir = IrAfterEachPass(b.Bytes(), {{"x", {3, 8}}});
  ExpectPass(ir, "specialize",
             R"(  input x: float32[N,8]
  y = Relu(x)
)",
             R"(  input x: float32[3,8]
  y = Relu(x)
)");
}

// fold-structural replaces a Shape -> Gather -> Unsqueeze -> Concat chain, known for the class,
// by one structural constant under the chain's last name (`shape`; the graph text lists nodes,
// not constants); the Reshape it fed stays and reads it.
TEST(PassIr, FoldStructural) {
  OnnxBuilder b;
  b.Input("x", kFloat, {2, 3, 4}).Output("y", kFloat, {2, 12});
  b.Int64Init("zero", {}, {0});
  b.Int64Init("minus_one", {1}, {-1});
  b.Int64Init("axes", {1}, {0});
  b.Node("Shape", {"x"}, {"s"});
  b.Node("Gather", {"s", "zero"}, {"n"});
  b.Node("Unsqueeze", {"n", "axes"}, {"n1"});
  OnnxBuilder::IntAttr(b.Node("Concat", {"n1", "minus_one"}, {"shape"}), "axis", 0);
  b.Node("Reshape", {"x", "shape"}, {"y"});
  auto ir = IrAfterEachPass(b.Bytes(), {{"x", {2, 3, 4}}});
  ExpectPass(ir, "fold-structural",
             R"(  input x: float32[2,3,4]
  s = Shape(x)
  n = Gather(s, zero)
  n1 = Unsqueeze(n, axes)
  shape = Concat(n1, minus_one)
  y = Reshape(x, shape)
)",
             R"(  input x: float32[2,3,4]
  y = Reshape(x, shape)
)");
}

// decompose-batch-norm writes an inference BatchNormalization as the elementwise ops it means:
// (x - mean) * (scale / sqrt(var + eps)) + B, the factor computed from the bound statistics.
TEST(PassIr, DecomposeBatchNorm) {
  OnnxBuilder b;
  b.Input("x", kFloat, {1, 2, 3, 3}).Output("y", kFloat, {1, 2, 3, 3});
  b.FloatInit("scale", {2}, {1.0f, 2.0f});
  b.FloatInit("bias", {2}, {0.5f, -0.5f});
  b.FloatInit("mean", {2}, {0.1f, 0.2f});
  b.FloatInit("var", {2}, {1.0f, 4.0f});
  b.Node("BatchNormalization", {"x", "scale", "bias", "mean", "var"}, {"y"});
  auto ir = IrAfterEachPass(b.Bytes(), {{"x", {1, 2, 3, 3}}});
  ExpectPass(ir, "decompose-batch-norm",
             R"(  input x: float32[1,2,3,3]
  y = BatchNormalization(x, scale, bias, mean, var)
)",
             R"(  input x: float32[1,2,3,3]
  y/bn_var_eps = Add(var, y/bn_epsilon)
  y/bn_std = Sqrt(y/bn_var_eps)
  y/bn_factor = Div(scale, y/bn_std)
  y/bn_factor_c = Reshape(y/bn_factor, y/bn_shape)
  y/bn_mean_c = Reshape(mean, y/bn_shape)
  y/bn_bias_c = Reshape(bias, y/bn_shape)
  y/bn_centered = Sub(x, y/bn_mean_c)
  y/bn_scaled = Mul(y/bn_centered, y/bn_factor_c)
  y = Add(y/bn_scaled, y/bn_bias_c)
)");
}

// dead-code removes a node no output reads (Neg); the weight it read stays bound.
TEST(PassIr, DeadCode) {
  OnnxBuilder b;
  b.Input("x", kFloat, {4}).Output("y", kFloat, {4});
  b.FloatInit("w", {4}, {1, 2, 3, 4});
  b.Node("Mul", {"x", "w"}, {"y"});
  b.Node("Neg", {"w"}, {"dead"});
  auto ir = IrAfterEachPass(b.Bytes(), {{"x", {4}}});
  ExpectPass(ir, "dead-code",
             R"(  input x: float32[4]
  y = Mul(x, w)
  dead = Neg(w)
)",
             R"(  input x: float32[4]
  y = Mul(x, w)
)");
}

// lower turns nodes into kernels over typed buffers (in0 the graph input, %n a temp, @out0 the
// caller's output buffer): the Reshape becomes a view of the Relu's buffer, each other node a
// kernel.
TEST(PassIr, Lower) {
  OnnxBuilder b;
  b.Input("x", kFloat, {2, 6}).Output("y", kFloat, {3, 4});
  b.Int64Init("shape", {2}, {3, 4});
  b.Node("Relu", {"x"}, {"r"});
  b.Node("Reshape", {"r", "shape"}, {"v"});
  b.Node("Neg", {"v"}, {"y"});
  auto ir = IrAfterEachPass(b.Bytes(), {{"x", {2, 6}}});
  ExpectPass(ir, "lower",
             R"(  input x: float32[2,6]
  r = Relu(x)
  v = Reshape(r, shape)
  y = Neg(v)
)",
             R"(program entry0 (workspace 0 bytes)
  %3 = view %2 as float32[3,4]
  %2:float32[2,6] = Relu(in0)
  %4:float32[3,4]@out0 = Neg(%3)
  return %4
)");
}

// fuse-conv-epilogue folds a ReLU and a residual Add into the convolution that feeds them.
TEST(PassIr, FuseConvEpilogue) {
  OnnxBuilder b;
  b.Input("x", kFloat, {1, 4, 5, 5}).Output("y", kFloat, {1, 4, 5, 5});
  b.FloatInit("w", {4, 4, 3, 3}, std::vector<float>(144, 0.01f));
  OnnxBuilder::IntsAttr(b.Node("Conv", {"x", "w"}, {"c"}), "pads", {1, 1, 1, 1});
  b.Node("Add", {"c", "x"}, {"r"});
  b.Node("Relu", {"r"}, {"y"});
  auto ir = IrAfterEachPass(b.Bytes(), {{"x", {1, 4, 5, 5}}});
  ExpectPass(ir, "fuse-conv-epilogue",
             R"(program entry0 (workspace 0 bytes)
  %2:float32[1,4,5,5] = Conv(in0, w0)
  %3:float32[1,4,5,5] = Add(%2, in0)
  %4:float32[1,4,5,5]@out0 = Relu(%3)
  return %4
)",
             R"(program entry0 (workspace 0 bytes)
  %4:float32[1,4,5,5]@out0 = Conv+Add+Relu(in0, w0, in0)
  return %4
)");
}

// fuse-elementwise merges a broadcast chain of one output shape into one loop; the value read
// twice inside the chain stays in registers.
TEST(PassIr, FuseElementwise) {
  OnnxBuilder b;
  b.Input("x", kFloat, {2, 8}).Input("bias", kFloat, {8}).Output("y", kFloat, {2, 8});
  b.Node("Add", {"x", "bias"}, {"a"});
  b.Node("Sigmoid", {"a"}, {"s"});
  b.Node("Mul", {"a", "s"}, {"y"});
  auto ir = IrAfterEachPass(b.Bytes(), {{"x", {2, 8}}, {"bias", {8}}});
  ExpectPass(ir, "fuse-elementwise",
             R"(program entry0 (workspace 0 bytes)
  %2:float32[2,8] = Add(in0, in1)
  %3:float32[2,8] = Sigmoid(%2)
  %4:float32[2,8]@out0 = Mul(%2, %3)
  return %4
)",
             R"(program entry0 (workspace 0 bytes)
  %4:float32[2,8]@out0 = Add+Sigmoid+Mul(in0, in1)
  return %4
)");
}

// fuse-group-norm recognizes the exporters' Reshape -> InstanceNormalization -> Reshape as one
// group norm over the rank-4 tensor, which reads the input as it lies (the view it no longer
// reads stays until memory planning).
TEST(PassIr, FuseGroupNorm) {
  OnnxBuilder b;
  b.Input("x", kFloat, {1, 4, 2, 2}).Output("y", kFloat, {1, 4, 2, 2});
  b.Int64Init("grouped", {3}, {1, 2, -1});
  b.Int64Init("back", {4}, {1, 4, 2, 2});
  b.FloatInit("ones", {2}, {1, 1});
  b.FloatInit("zeros", {2}, {0, 0});
  b.Node("Reshape", {"x", "grouped"}, {"g"});
  b.Node("InstanceNormalization", {"g", "ones", "zeros"}, {"n"});
  b.Node("Reshape", {"n", "back"}, {"y"});
  auto ir = IrAfterEachPass(b.Bytes(), {{"x", {1, 4, 2, 2}}});
  ExpectPass(ir, "fuse-group-norm",
             R"(program entry0 (workspace 0 bytes)
  %5 = view in0 as float32[1,2,8]
  %7 = view %6 as float32[1,4,2,2]
  %6:float32[1,2,8] = InstanceNormalization(%5, w0, w1)
  %8:float32[1,4,2,2]@out0 = Identity(%7)
  return %8
)",
             R"(program entry0 (workspace 0 bytes)
  %5 = view in0 as float32[1,2,8]
  %7:float32[1,4,2,2] = GroupNorm(in0, w0, w1)
  %8:float32[1,4,2,2]@out0 = Identity(%7)
  return %8
)");
}

// fuse-library-epilogue runs the elementwise loop that alone reads a GEMM's output inside the
// GEMM kernel, right after the library call.
TEST(PassIr, FuseLibraryEpilogue) {
  OnnxBuilder b;
  b.Input("x", kFloat, {2, 4}).Output("y", kFloat, {2, 3});
  b.FloatInit("w", {4, 3}, std::vector<float>(12, 0.5f));
  b.FloatConstant("half", {}, {0.5f});
  b.Node("MatMul", {"x", "w"}, {"m"});
  b.Node("Mul", {"m", "half"}, {"s"});
  b.Node("Tanh", {"s"}, {"y"});
  auto ir = IrAfterEachPass(b.Bytes(), {{"x", {2, 4}}});
  ExpectPass(ir, "fuse-library-epilogue",
             R"(program entry0 (workspace 0 bytes)
  %3:float32[2,3] = MatMul(in0, w1)
  %5:float32[2,3]@out0 = Mul+Tanh(%3, w0)
  return %5
)",
             R"(program entry0 (workspace 0 bytes)
  %5:float32[2,3]@out0 = MatMul+[Mul+Tanh](in0, w1, w0)
  return %5
)");
}

// fold-gemm-bias moves a per-column bias add, the epilogue's first operation, into the matrix
// product's library call.
TEST(PassIr, FoldGemmBias) {
  OnnxBuilder b;
  b.Input("x", kFloat, {2, 4}).Output("y", kFloat, {2, 3});
  b.FloatInit("w", {4, 3}, std::vector<float>(12, 0.5f));
  b.FloatInit("bias", {3}, {1, 2, 3});
  b.Node("MatMul", {"x", "w"}, {"m"});
  b.Node("Add", {"m", "bias"}, {"a"});
  b.Node("Relu", {"a"}, {"y"});
  auto ir = IrAfterEachPass(b.Bytes(), {{"x", {2, 4}}});
  ExpectPass(ir, "fold-gemm-bias",
             R"(program entry0 (workspace 0 bytes)
  %5:float32[2,3]@out0 = MatMul+[Add+Relu](in0, w1, w0)
  return %5
)",
             R"(program entry0 (workspace 0 bytes)
  %5:float32[2,3]@out0 = MatMul+[Add+Relu]+bias(in0, w1, w0)
  return %5
)");
}

// fold-gemm-gelu marks a matrix product whose epilogue is exactly the exporters' erf GELU
// (`gelu?`: the library applies it when the scalars bound at bind are sqrt(2), 1 and 0.5).
TEST(PassIr, FoldGemmGelu) {
  OnnxBuilder b;
  b.Input("x", kFloat, {2, 4}).Output("y", kFloat, {2, 3});
  b.FloatInit("w", {4, 3}, std::vector<float>(12, 0.5f));
  b.FloatConstant("sqrt2", {}, {1.4142135f});
  b.FloatConstant("one", {}, {1.0f});
  b.FloatConstant("half", {}, {0.5f});
  b.Node("MatMul", {"x", "w"}, {"m"});
  b.Node("Div", {"m", "sqrt2"}, {"d"});
  b.Node("Erf", {"d"}, {"e"});
  b.Node("Add", {"e", "one"}, {"p"});
  b.Node("Mul", {"m", "p"}, {"q"});
  b.Node("Mul", {"q", "half"}, {"y"});
  auto ir = IrAfterEachPass(b.Bytes(), {{"x", {2, 4}}});
  ExpectPass(ir, "fold-gemm-gelu",
             R"(program entry0 (workspace 0 bytes)
  %10:float32[2,3]@out0 = MatMul+[Div+Erf+Add+Mul+Mul](in0, w3, w2, w1, w0)
  return %10
)",
             R"(program entry0 (workspace 0 bytes)
  %10:float32[2,3]@out0 = MatMul+[Div+Erf+Add+Mul+Mul]+gelu?(in0, w3, w2, w1, w0)
  return %10
)");
}

// fuse-attention makes MatMul(Q, K') -> scale -> Softmax -> MatMul(., V) one kernel.
TEST(PassIr, FuseAttention) {
  OnnxBuilder b;
  b.Input("q", kFloat, {1, 2, 8, 4})
      .Input("k", kFloat, {1, 2, 4, 8})
      .Input("v", kFloat, {1, 2, 8, 4})
      .Output("y", kFloat, {1, 2, 8, 4});
  b.FloatConstant("scale", {}, {0.5f});
  b.Node("MatMul", {"q", "k"}, {"s"});
  b.Node("Mul", {"s", "scale"}, {"t"});
  OnnxBuilder::IntAttr(b.Node("Softmax", {"t"}, {"p"}), "axis", -1);
  b.Node("MatMul", {"p", "v"}, {"y"});
  auto ir =
      IrAfterEachPass(b.Bytes(), {{"q", {1, 2, 8, 4}}, {"k", {1, 2, 4, 8}}, {"v", {1, 2, 8, 4}}});
  ExpectPass(ir, "fuse-attention",
             R"(program entry0 (workspace 0 bytes)
  %5:float32[1,2,8,8] = MatMul+[Mul](in0, in1, w0)
  %6:float32[1,2,8,8] = Softmax(%5)
  %7:float32[1,2,8,4]@out0 = MatMul(%6, in2)
  return %7
)",
             R"(program entry0 (workspace 0 bytes)
  %7:float32[1,2,8,4]@out0 = Attention[MatMul+[Mul]+Softmax+MatMul](in0, in1, in2, w0)
  return %7
)");
}

// choose-conv-layout: the library's blocked layout for a 3x3 convolution, plain NCHW for 1x1.
TEST(PassIr, ChooseConvLayout) {
  OnnxBuilder b;
  b.Input("x", kFloat, {1, 8, 6, 6}).Output("z", kFloat, {1, 4, 6, 6});
  b.FloatInit("w3", {8, 8, 3, 3}, std::vector<float>(576, 0.01f));
  b.FloatInit("w1", {4, 8, 1, 1}, std::vector<float>(32, 0.1f));
  OnnxBuilder::IntsAttr(b.Node("Conv", {"x", "w3"}, {"y"}), "pads", {1, 1, 1, 1});
  b.Node("Conv", {"y", "w1"}, {"z"});
  auto ir = IrAfterEachPass(b.Bytes(), {{"x", {1, 8, 6, 6}}});
  ExpectPass(ir, "choose-conv-layout",
             R"(program entry0 (workspace 0 bytes)
  %3:float32[1,8,6,6] = Conv(in0, w1)
  %4:float32[1,4,6,6]@out0 = Conv(%3, w0)
  return %4
)",
             R"(program entry0 (workspace 0 bytes)
  %3:float32[1,8,6,6] = Conv[blocked](in0, w1)
  %4:float32[1,4,6,6]@out0 = Conv[plain](%3, w0)
  return %4
)");
}

// plan-layout: a tensor between two convolutions, through a layout-agnostic loop, lives NHWC
// ({0,2,3,1}); the convolutions run on it as it lies, and the input and output are converted once.
TEST(PassIr, PlanLayout) {
  OnnxBuilder b;
  b.Input("x", kFloat, {1, 8, 6, 6}).Output("z", kFloat, {1, 8, 6, 6});
  b.FloatInit("w1", {8, 8, 3, 3}, std::vector<float>(576, 0.01f));
  b.FloatInit("w2", {8, 8, 3, 3}, std::vector<float>(576, 0.02f));
  b.FloatConstant("two", {}, {2.0f});
  OnnxBuilder::IntsAttr(b.Node("Conv", {"x", "w1"}, {"c"}), "pads", {1, 1, 1, 1});
  b.Node("Mul", {"c", "two"}, {"m"});
  b.Node("Sigmoid", {"m"}, {"s"});
  b.Node("Add", {"s", "c"}, {"a"});
  OnnxBuilder::IntsAttr(b.Node("Conv", {"a", "w2"}, {"z"}), "pads", {1, 1, 1, 1});
  auto ir = IrAfterEachPass(b.Bytes(), {{"x", {1, 8, 6, 6}}});
  ExpectPass(ir, "plan-layout",
             R"(program entry0 (workspace 0 bytes)
  %7:float32[1,8,6,6] = Conv[blocked]+[Mul+Sigmoid+Add](in0, w1, w0)
  %8:float32[1,8,6,6]@out0 = Conv[blocked](%7, w2)
  return %8
)",
             R"(program entry0 (workspace 0 bytes)
  %10:float32[1,8,6,6]{0,2,3,1} = ToNhwc(in0)
  %7:float32[1,8,6,6]{0,2,3,1} = Conv[nhwc]+[Mul+Sigmoid+Add](%10, w1, w0)
  %9:float32[1,8,6,6]{0,2,3,1} = Conv[nhwc](%7, w2)
  %8:float32[1,8,6,6]@out0 = ToRowMajor(%9)
  return %8
)");
}

// plan-memory gives each workspace temp an offset by liveness: `c` takes the bytes of `a`, which
// died when `b` was made; the graph output is written into the caller's buffer.
TEST(PassIr, PlanMemory) {
  OnnxBuilder b;
  b.Input("x", kFloat, {4, 8}).Output("y", kFloat, {4, 8});
  b.FloatInit("w", {8, 8}, std::vector<float>(64, 0.1f));
  b.Node("MatMul", {"x", "w"}, {"a"});
  b.Node("MatMul", {"a", "w"}, {"b"});
  b.Node("MatMul", {"b", "w"}, {"c"});
  b.Node("MatMul", {"c", "w"}, {"y"});
  auto ir = IrAfterEachPass(b.Bytes(), {{"x", {4, 8}}});
  ExpectPass(ir, "plan-memory",
             R"(program entry0 (workspace 0 bytes)
  %2:float32[4,8] = MatMul(in0, w0)
  %3:float32[4,8] = MatMul(%2, w0)
  %4:float32[4,8] = MatMul(%3, w0)
  %5:float32[4,8]@out0 = MatMul(%4, w0)
  return %5
)",
             R"(program entry0 (workspace 256 bytes)
  %2:float32[4,8]@0 = MatMul(in0, w0)
  %3:float32[4,8]@128 = MatMul(%2, w0)
  %4:float32[4,8]@0 = MatMul(%3, w0)
  %5:float32[4,8]@out0 = MatMul(%4, w0)
  return %5
)");
}

// Every pass of the pipeline has a test above; emission's product is a cell, not IR
// (tests/compile/mint_test.cc, differential_test.cc).
TEST(PassIr, EveryPassHasATest) {
  for (const std::string& pass : PassNames()) {
    if (pass == "emit-cpp") continue;
    EXPECT_TRUE(kTested.count(pass)) << "pass '" << pass << "' has no Input/Expected IR test";
  }
}

}  // namespace
}  // namespace kiln
