// The example models, run eagerly, must match PyTorch's reference outputs committed beside them:
// max |kiln - torch| <= 1e-4 * max |torch|. A second (derived) checkpoint must change outputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "src/kiln/eager/interpreter.h"
#include "src/kiln/graph/onnx_import.h"
#include "src/kiln/tensor/npy.h"

namespace kiln {
namespace {

struct Example {
  std::string name;
  std::vector<std::string> inputs;
  std::vector<std::string> outputs;
};

const std::vector<Example> kExamples = {
    {"mlp", {"x"}, {"logits"}},
    {"micro-diffusion", {"latent", "timestep", "cond"}, {"noise_pred"}},
    {"transformer", {"input_ids"}, {"hidden"}},
};

class ExamplesTest : public ::testing::TestWithParam<Example> {};

TEST_P(ExamplesTest, EagerMatchesTorchReference) {
  const Example& ex = GetParam();
  const std::string dir = std::string(KILN_SOURCE_DIR) + "/examples/" + ex.name;
  auto g = ImportOnnxFile(dir + "/model.onnx");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  auto graph = std::make_shared<const Graph>(std::move(g).value());
  auto interp = Interpreter::Create(graph);
  ASSERT_TRUE(interp.ok()) << interp.status().ToString();
  auto ckpt = LoadCheckpoint(*graph, dir + "/checkpoint.safetensors", true);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  TensorMap inputs;
  for (const std::string& in : ex.inputs) {
    auto t = ReadNpy(dir + "/inputs/" + in + ".npy");
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    inputs[in] = *t;
  }
  auto out = interp->Run(inputs, &*ckpt);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  for (const std::string& name : ex.outputs) {
    auto ref = ReadNpy(dir + "/outputs/" + name + ".npy");
    ASSERT_TRUE(ref.ok()) << ref.status().ToString();
    const Tensor& got = out->at(name);
    ASSERT_EQ(got.shape(), ref->shape());
    double max_err = 0, max_ref = 0;
    for (int64_t i = 0; i < ref->numel(); ++i) {
      max_err = std::max(max_err, std::fabs(got.GetAsDouble(i) - ref->GetAsDouble(i)));
      max_ref = std::max(max_ref, std::fabs(ref->GetAsDouble(i)));
    }
    EXPECT_LE(max_err, 1e-4 * max_ref) << ex.name << "/" << name << ": max|err| " << max_err
                                       << ", max|ref| " << max_ref;
    RecordProperty(name + "_max_abs_err", std::to_string(max_err));
  }
  // A second checkpoint of the same architecture runs through the same interpreter and moves
  // the outputs (it is a different fine-tune, not a copy).
  auto derived = DeriveCheckpoint(*graph, 7);
  ASSERT_TRUE(derived.ok());
  auto out_b = interp->Run(inputs, &*derived);
  ASSERT_TRUE(out_b.ok()) << out_b.status().ToString();
  double moved = 0;
  const Tensor& a = out->at(ex.outputs[0]);
  const Tensor& b = out_b->at(ex.outputs[0]);
  for (int64_t i = 0; i < a.numel(); ++i) {
    moved = std::max(moved, std::fabs(a.GetAsDouble(i) - b.GetAsDouble(i)));
  }
  EXPECT_GT(moved, 1e-4);
}

INSTANTIATE_TEST_SUITE_P(All, ExamplesTest, ::testing::ValuesIn(kExamples),
                         [](const auto& info) {
                           std::string n = info.param.name;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

}  // namespace
}  // namespace kiln
