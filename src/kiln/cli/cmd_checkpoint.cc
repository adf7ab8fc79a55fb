// `kiln checkpoint derive MODEL.onnx --seed N --out W.safetensors`: the deterministic fine-tune
// stand-in that tests and the demo use as a second checkpoint of the same architecture.
#include <cstdio>
#include <memory>

#include "src/kiln/cli/commands.h"
#include "src/kiln/graph/checkpoint.h"
#include "src/kiln/graph/onnx_import.h"
#include "src/kiln/tensor/safetensors.h"

namespace kiln::cli {

namespace {

struct DeriveArgs {
  std::string model;
  uint64_t seed = 1;
  double scale = 0.05;
  std::string out;
};

Status DoDerive(const DeriveArgs& a) {
  KILN_ASSIGN_OR_RETURN(Graph graph, ImportOnnxFile(a.model));
  KILN_ASSIGN_OR_RETURN(WeightMap weights, DeriveCheckpoint(graph, a.seed, a.scale));
  KILN_RETURN_IF_ERROR(WriteSafetensors(a.out, weights, {{"kiln.seed", std::to_string(a.seed)}}));
  std::printf("derived %zu weights (seed %llu, scale %g) -> %s\n", weights.size(),
              (unsigned long long)a.seed, a.scale, a.out.c_str());
  return Status::OK();
}

}  // namespace

void AddCheckpointCommand(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand("checkpoint", "Checkpoint tools");
  cmd->require_subcommand(1);
  auto* derive = cmd->add_subcommand(
      "derive", "Write a deterministic second checkpoint (fine-tune stand-in) of a model");
  auto args = std::make_shared<DeriveArgs>();
  derive->add_option("model", args->model, "ONNX model file")->required();
  derive->add_option("--seed", args->seed, "seed of the perturbation")->required();
  derive->add_option("--scale", args->scale, "noise scale relative to each weight's RMS");
  derive->add_option("--out", args->out, "output safetensors file")->required();
  derive->callback([=] {
    Status s = DoDerive(*args);
    *exit_code = s.ok() ? 0 : ReportError("checkpoint derive", s);
  });
}

}  // namespace kiln::cli
