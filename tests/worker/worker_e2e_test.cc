// The fleet story end to end, with real processes on loopback: a hub; `kiln mint` + `kiln
// publish` on machine A; `kiln worker` on machine B (an empty local store) adopts the cell at
// boot and serves its first request from it (serving_mode aot_cell), matching PyTorch; SIGTERM
// drains and exits 0. Machines A and B are two cache directories.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "src/kiln/base/file.h"
#include "src/kiln/tensor/npy.h"
#include "tests/worker/worker_process.h"

namespace kiln {
namespace {

using namespace kiln::worker_testing;  // NOLINT: the process fixtures

const std::string kExamples = std::string(KILN_SOURCE_DIR) + "/examples/";

using WorkerEndToEnd = MachinesTest;

TEST_F(WorkerEndToEnd, BootAdoptsFromTheHubAndServesTheFirstRequestFromTheCell) {
  Hub hub(root_ + "/hub");
  ASSERT_TRUE(hub.Start());

  // Machine A mints and publishes.
  std::string cell_ref;
  ASSERT_TRUE(hub.MintAndPublish(root_ + "/a", "mlp", &cell_ref));
  const std::string key = KeyOf(cell_ref);
  ASSERT_TRUE(hub.WriteJwks(root_ + "/jwks.json"));

  // Machine B: the example's manifest plus a hub section, in B's own directory.
  ManifestOptions o;
  o.hub_url = hub.url();
  o.trust_path = root_ + "/jwks.json";
  Worker w(root_ + "/b", Manifest(o));
  ASSERT_TRUE(w.Start());
  ASSERT_TRUE(w.WaitReady(15000)) << w.Log();
  const std::string boot_log = w.Log();
  EXPECT_NE(boot_log.find("boot_adopt hit"), std::string::npos) << boot_log;

  // The first request is served by the cell and matches PyTorch's reference.
  auto x = ReadNpy(kExamples + "mlp/inputs/x.npy");
  auto ref = ReadNpy(kExamples + "mlp/outputs/logits.npy");
  ASSERT_TRUE(x.ok() && ref.ok());
  const auto res = w.Infer("mlp", {{"x", *x}});
  ASSERT_EQ(res.status, 200) << (res.status == 0 ? "no answer" : res.body.dump());
  auto body = res.body;
  EXPECT_EQ(body["parameters"]["serving_mode"], "aot_cell") << res.body.dump();
  EXPECT_EQ(body["parameters"]["served_cell_ref"].get<std::string>().rfind(key + "@sha256:", 0), 0u)
      << res.body.dump();
  const auto& out = body["outputs"][0]["data"];
  ASSERT_EQ(static_cast<int64_t>(out.size()), ref->numel());
  for (int64_t i = 0; i < ref->numel(); ++i) {
    EXPECT_NEAR(out[static_cast<size_t>(i)].get<double>(), ref->GetAsDouble(i), 1e-4);
  }
  // Exactly one boot_adopt row, phase hit, on disk.
  auto events = ReadFile(w.EventsPath());
  ASSERT_TRUE(events.ok());
  size_t rows = 0;
  for (size_t at = events->find("\"boot_adopt\""); at != std::string::npos;
       at = events->find("\"boot_adopt\"", at + 1)) {
    ++rows;
  }
  EXPECT_EQ(rows, 1u) << *events;
  EXPECT_NE(events->find("\"hit\""), std::string::npos) << *events;

  // Out of envelope: served eager, named; the cell stays armed.
  auto infer = [&](const Tensor& t) {
    auto a = w.Infer("mlp", {{"x", t}});
    return a.status == 200 ? a.body : nlohmann::json();
  };
  auto three = Tensor::FromVector<float>({3, 64}, std::vector<float>(192, 0.25f));
  auto odd = infer(three);
  EXPECT_EQ(odd["parameters"]["serving_mode"], "eager") << odd.dump();
  EXPECT_EQ(odd["parameters"]["fallback_reason"], "out_of_envelope") << odd.dump();
  EXPECT_EQ(infer(*x)["parameters"]["serving_mode"], "aot_cell");

  // The operator's eager-only order, then its release: the cell serves again.
  auto order = [&](bool on) {
    nlohmann::json b = {{"target", "mlp"}, {"on", on}, {"reason", "e2e"}};
    return w.Admin("/v1/admin/eager-only", b).status == 200;
  };
  ASSERT_TRUE(order(true));
  auto ordered = infer(*x);
  EXPECT_EQ(ordered["parameters"]["serving_mode"], "eager") << ordered.dump();
  EXPECT_EQ(ordered["parameters"]["fallback_reason"], "operator_eager_only") << ordered.dump();
  ASSERT_TRUE(order(false));
  EXPECT_EQ(infer(*x)["parameters"]["serving_mode"], "aot_cell");

  // A checkpoint swap keeps the cell serving; its outputs follow the new weights (which moved
  // them away from the reference).
  // The checkpoint comes from the worker's checkpoint directory, named by its relative path.
  auto derive =
      Kiln(root_ + "/b", "checkpoint derive " + kExamples + "mlp/model.onnx --seed 7 --out " +
                             w.CheckpointDir() + "/ft.safetensors");
  ASSERT_EQ(derive.first, 0) << derive.second;
  nlohmann::json swap = {{"target", "mlp"}, {"path", "ft.safetensors"}};
  auto swapped = w.Admin("/v1/admin/checkpoint", swap);
  ASSERT_EQ(swapped.status, 200) << (swapped.status == 0 ? "no answer" : swapped.body.dump());
  auto after = infer(*x);
  EXPECT_EQ(after["parameters"]["serving_mode"], "aot_cell") << after.dump();
  auto eager_new = Kiln(root_ + "/b", "run " + kExamples + "mlp/model.onnx --checkpoint " + root_ +
                                          "/b/checkpoints/ft.safetensors --input x=" + kExamples +
                                          "mlp/inputs/x.npy --out " + root_ + "/b/eager_new");
  ASSERT_EQ(eager_new.first, 0) << eager_new.second;
  auto expect = ReadNpy(root_ + "/b/eager_new/logits.npy");
  ASSERT_TRUE(expect.ok());
  double moved = 0;
  for (int64_t i = 0; i < expect->numel(); ++i) {
    const double got = after["outputs"][0]["data"][static_cast<size_t>(i)].get<double>();
    EXPECT_NEAR(got, expect->GetAsDouble(i), 1e-4);
    moved = std::max(moved, std::fabs(got - ref->GetAsDouble(i)));
  }
  EXPECT_GT(moved, 1e-4) << "the swap did not change the outputs";

  // The decisions are on disk as event rows, in seq order.
  auto rows_after = ReadFile(w.EventsPath());
  ASSERT_TRUE(rows_after.ok());
  for (const char* kind : {"\"boot_adopt\"", "\"ingress_refused\"", "\"serve_posture\""}) {
    EXPECT_NE(rows_after->find(kind), std::string::npos) << kind << "\n" << *rows_after;
  }
  // Exactly these decisions, in this order: the install and the adoption, the odd batch refused
  // at ingress, the operator's order and its release, the checkpoint swap.
  EXPECT_EQ(w.RowsInSeqOrder(), Expect({{"serve_posture", "aot_cell"},
                                        {"boot_adopt", "hit"},
                                        {"ingress_refused", "out_of_envelope"},
                                        {"serve_posture", "operator_eager_only"},
                                        {"serve_posture", "operator_release"},
                                        {"serve_posture", "checkpoint_swapped"}}));

  EXPECT_EQ(w.Stop(), 0) << "worker did not drain and exit 0";
}

}  // namespace
}  // namespace kiln
