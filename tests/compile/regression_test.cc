// Models the compiled path once got wrong, each a hand-made ONNX graph of the pattern that
// failed, minted (strict gate, fence) and run against eager. One test per bug; the fuzzer's own
// reproducers replay in graph_fuzz_regressions (fuzz/graphs/regressions/).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "src/kiln/arm/loader.h"
#include "src/kiln/base/file.h"
#include "src/kiln/compile/pipeline.h"
#include "src/kiln/eager/interpreter.h"
#include "src/kiln/graph/onnx_import.h"
#include "src/kiln/mint/mint.h"
#include "tests/graph/onnx_builder.h"

namespace kiln {
namespace {

using testing::kFloat;
using testing::OnnxBuilder;

std::vector<float> Random(size_t n, uint32_t seed, float scale = 0.5f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

Tensor RandomTensor(const Shape& s, uint32_t seed) {
  return Tensor::FromVector<float>(s, Random(static_cast<size_t>(NumElements(s)), seed, 2.0f));
}

std::shared_ptr<const Graph> Import(const OnnxBuilder& b) {
  auto g = ImportOnnxBytes(b.Bytes(), "regression");
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return std::make_shared<const Graph>(std::move(g).value());
}

// Mints `graph` for `env` with `samples` probed, then runs the proven cell on every sample and
// compares with eager (NaN and infinities by position, the rest within 1e-4 of the largest
// finite value).
void MintAndCompare(std::shared_ptr<const Graph> graph, const Envelope& env,
                    const Samples& samples) {
  MintRequest r;
  r.graph = graph;
  r.envelope = env;
  r.family = "test/regression";
  r.weights = GraphWeights(*graph);
  r.samples = samples;
  r.intake = true;
  auto m = MintCell(r);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->gate.verdict, Verdict::kHealthy) << m->gate.Summary();
  auto dir = ProcessPrivateDir();
  ASSERT_TRUE(dir.ok()) << dir.status().ToString();
  auto lib = OpenCellBytes(m->shared_object, *dir + "/regression");
  ASSERT_TRUE(lib.ok()) << lib.status().ToString();
  auto entries = EntriesFromDescribe((*lib)->describe(), env);
  ASSERT_TRUE(entries.ok()) << entries.status().ToString();
  auto cell = ArmedCell::Arm(*lib, *entries, r.weights, Lane::kIntake, "", 1);
  ASSERT_TRUE(cell.ok()) << cell.status().ToString();
  auto eager = Interpreter::Create(graph);
  ASSERT_TRUE(eager.ok());
  for (const TensorMap& in : samples) {
    std::string mismatch;
    const int entry = (*cell)->Admit(in, &mismatch);
    ASSERT_GE(entry, 0) << mismatch;
    auto got = (*cell)->Run(entry, in);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    auto want = eager->Run(in);
    ASSERT_TRUE(want.ok()) << want.status().ToString();
    for (const auto& [name, w] : *want) {
      const Tensor& g = got->at(name);
      ASSERT_EQ(g.shape(), w.shape()) << name;
      double big = 1;
      for (int64_t i = 0; i < w.numel(); ++i) {
        if (std::isfinite(w.GetAsDouble(i))) big = std::max(big, std::fabs(w.GetAsDouble(i)));
      }
      for (int64_t i = 0; i < w.numel(); ++i) {
        const double a = g.GetAsDouble(i), b = w.GetAsDouble(i);
        if (!std::isfinite(b)) {
          EXPECT_TRUE(std::isnan(b) ? std::isnan(a) : a == b)
              << name << "[" << i << "]: eager " << b << ", cell " << a;
        } else {
          EXPECT_NEAR(a, b, 1e-4 * big) << name << "[" << i << "]";
        }
      }
    }
  }
}

// A UNet-style denoiser's time and condition embeddings, as torch exports them:
// silu(Gemm(t, Wt, bt) + Gemm(cond, Wc, bc)), then a projection. At batch 1 the condition
// embedding is [1, 256], the shape of a bias: fold-gemm-bias took it as the first Gemm's library
// bias and the emitter then gave that slot to the Gemm's own C, dropping the embedding (the cell
// was refused DESTROYED, cos 0.54). At batch 2 nothing folded. Both batches, one cell.
TEST(Regression, DenoiserEmbeddingsAtBatchOneAndTwo) {
  OnnxBuilder b(17);
  b.Input("t", kFloat, {-1, 64}).Input("cond", kFloat, {-1, 32}).Output("h", kFloat, {-1, 16});
  b.FloatInit("wt", {256, 64}, Random(256 * 64, 1)).FloatInit("bt", {256}, Random(256, 2));
  b.FloatInit("wc", {256, 32}, Random(256 * 32, 3)).FloatInit("bc", {256}, Random(256, 4));
  b.FloatInit("wo", {16, 256}, Random(16 * 256, 5)).FloatInit("bo", {16}, Random(16, 6));
  OnnxBuilder::IntAttr(b.Node("Gemm", {"cond", "wc", "bc"}, {"ec"}), "transB", 1);
  OnnxBuilder::IntAttr(b.Node("Gemm", {"t", "wt", "bt"}, {"et"}), "transB", 1);
  b.Node("Add", {"et", "ec"}, {"e"});
  b.Node("Sigmoid", {"e"}, {"s"});
  b.Node("Mul", {"e", "s"}, {"silu"});
  OnnxBuilder::IntAttr(b.Node("Gemm", {"silu", "wo", "bo"}, {"h"}), "transB", 1);
  Envelope env;
  Samples samples;
  for (int64_t batch : {1, 2}) {
    env.classes.push_back({{"t", {batch, 64}}, {"cond", {batch, 32}}});
    samples.push_back({{"t", RandomTensor({batch, 64}, 10 + static_cast<uint32_t>(batch))},
                       {"cond", RandomTensor({batch, 32}, 20 + static_cast<uint32_t>(batch))}});
  }
  MintAndCompare(Import(b), env, samples);
}

// A voice detector's If on a runtime flag (its sample rate): the then-branch runs an LSTM over
// the frame; the else-branch, another rate's front end, feeds its LSTM a rank-4 value for these
// shapes, which no shape function can type. Eager refuses that branch only when it is taken;
// fold-structural refused the whole graph. The If takes the types of the branch that can run.
TEST(Regression, IfWhoseOtherBranchCannotRunAtTheseShapes) {
  OnnxBuilder b(17);
  const int64_t T = 5, F = 8, H = 8;
  b.Input("x", kFloat, {1, T, F}).Input("is_16k", onnx::TensorProto::BOOL, {});
  b.Output("y", kFloat, {-1, -1, -1});
  b.FloatInit("w", {1, 4 * H, F}, Random(4 * H * F, 7))
      .FloatInit("r", {1, 4 * H, H}, Random(4 * H * H, 8));
  b.FloatInit("bias", {1, 8 * H}, Random(8 * H, 9));
  b.Int64Init("front", {1}, {0}).Int64Init("dirs", {1}, {1});
  auto& node = b.Node("If", {"is_16k"}, {"y"}, "rate");
  auto branch = [&](const char* attr, bool good) {
    auto* a = node.add_attribute();
    a->set_name(attr);
    a->set_type(onnx::AttributeProto::GRAPH);
    onnx::GraphProto* g = a->mutable_g();
    g->set_name(attr);
    auto add = [&](const std::string& op, std::vector<std::string> ins,
                   std::vector<std::string> outs) -> onnx::NodeProto& {
      auto* n = g->add_node();
      n->set_op_type(op);
      for (auto& i : ins) n->add_input(i);
      for (auto& o : outs) n->add_output(o);
      return *n;
    };
    const std::string p = std::string(attr) + "_";
    std::string seq = p + "seq";
    auto& tr = add("Transpose", {"x"}, {seq});  // [T, 1, F]
    OnnxBuilder::IntsAttr(tr, "perm", {1, 0, 2});
    if (!good) {  // the other rate's framing adds a dim: [1, T, 1, F]
      add("Unsqueeze", {seq, "front"}, {p + "framed"});
      seq = p + "framed";
    }
    auto& lstm = add("LSTM", {seq, "w", "r", "bias"}, {p + "Y", p + "Y_h"});
    OnnxBuilder::IntAttr(lstm, "hidden_size", H);
    add("Squeeze", {p + "Y", "dirs"}, {p + "out"});  // [T, 1, H]
    auto* o = g->add_output();
    o->set_name(p + "out");
    o->mutable_type()->mutable_tensor_type()->set_elem_type(kFloat);
  };
  branch("then_branch", true);
  branch("else_branch", false);
  Tensor yes = *Tensor::Empty(DType::kBool, {});
  yes.data<uint8_t>()[0] = 1;
  Envelope env{{{{"x", {1, T, F}}, {"is_16k", {}}}}};
  MintAndCompare(Import(b), env, {{{"x", RandomTensor({1, T, F}, 30)}, {"is_16k", yes}}});
}

// The graph fuzzer's first find: a LayerNormalization without a bias whose output an epilogue
// reads with an operand of its own (Clip's upper bound). The norm kernel took its third input
// for the bias, and that was the epilogue's operand.
TEST(Regression, LayerNormWithoutBiasKeepsItsEpilogueOperands) {
  OnnxBuilder b(17);
  b.Input("x", kFloat, {2, 16}).Output("y", kFloat, {2, 16});
  b.FloatInit("gamma", {16}, Random(16, 11)).FloatInit("hi", {}, {0.25f});
  b.Node("LayerNormalization", {"x", "gamma"}, {"n"});
  b.Node("Clip", {"n", "", "hi"}, {"y"});
  Envelope env{{{{"x", {2, 16}}}}};
  MintAndCompare(Import(b), env, {{{"x", RandomTensor({2, 16}, 40)}}});
}

}  // namespace
}  // namespace kiln
