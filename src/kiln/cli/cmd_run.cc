// `kiln run MODEL.onnx --input name=x.npy ... --out DIR`: one eager run, outputs as .npy files
// (sequences as directories of them, optionals holding none as NAME.none: tensor/npy.h
// ReadValue/WriteValue).
#include <chrono>
#include <cstdio>
#include <memory>

#include "src/kiln/base/clock.h"
#include "src/kiln/base/file.h"
#include "src/kiln/cli/commands.h"
#include "src/kiln/cli/target_util.h"
#include "src/kiln/compile/packed_boundary.h"
#include "src/kiln/eager/interpreter.h"
#include "src/kiln/graph/onnx_import.h"
#include "src/kiln/tensor/npy.h"

namespace kiln::cli {

namespace {

struct RunArgs {
  std::string model;
  std::string checkpoint;
  std::vector<std::string> inputs;
  std::string out_dir;
  bool compile = false;
  int threads = 1;
  std::vector<std::string> disabled_passes;
};

Status DoRun(const RunArgs& a) {
  KILN_ASSIGN_OR_RETURN(Graph graph, ImportOnnxFile(a.model));
  auto shared = std::make_shared<const Graph>(std::move(graph));
  KILN_ASSIGN_OR_RETURN(Interpreter interp, Interpreter::Create(shared));
  WeightMap weights;
  const WeightMap* bound = nullptr;
  if (!a.checkpoint.empty()) {
    KILN_ASSIGN_OR_RETURN(weights, LoadCheckpoint(*shared, a.checkpoint));
    bound = &weights;
  }
  TensorMap inputs;
  for (const std::string& spec : a.inputs) {
    const size_t eq = spec.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size()) {
      return Status::InvalidArgument("--input '" + spec + "' must be NAME=FILE.npy");
    }
    const std::string name = spec.substr(0, eq);
    if (inputs.count(name)) return Status::InvalidArgument("--input '" + name + "' given twice");
    // The graph says how to read the path: a tensor's .npy, a sequence's directory, an
    // optional's value or "none". A name the graph lacks is read as a tensor and refused by
    // the input check with the graph's input names.
    const ValueInfo* declared = shared->FindInput(name);
    auto t = declared ? ReadValue(spec.substr(eq + 1), declared->kind, declared->dtype)
                      : ReadNpy(spec.substr(eq + 1));
    if (!t.ok()) return t.status().WithContext("input '" + name + "'");
    inputs[name] = std::move(t).value();
  }
  TensorMap outputs;
  RunStats stats;
  std::string mode = "eager";
  const auto start = std::chrono::steady_clock::now();
  if (a.compile) {
    // Sequences, optionals and string tensors at the graph's edge cross the cell packed into
    // bytes; the nodes that read them run in the cell's dynamic region, on the host.
    KILN_ASSIGN_OR_RETURN(PackedBoundary boundary, PackBoundary(*shared));
    const bool packed = !boundary.inputs.empty() || !boundary.outputs.empty();
    auto cell_graph = packed ? std::make_shared<const Graph>(boundary.graph) : shared;
    KILN_ASSIGN_OR_RETURN(TensorMap cell_inputs, PackInputs(boundary, inputs));
    ShapeClass c;
    for (const auto& [name, t] : cell_inputs) c[name] = t.shape();
    KILN_ASSIGN_OR_RETURN(
        LocalCell cell,
        LocalCellForClass(cell_graph, bound ? *bound : GraphWeights(*shared), c, "local/run",
                          a.threads, Samples{cell_inputs}, a.disabled_passes));
    std::printf("cell: %s (%s, %.0f ms)%s\n", cell.ref.c_str(),
                cell.store_hit              ? "local store hit"
                : a.disabled_passes.empty() ? "minted and stored"
                                            : "minted without the disabled passes, not stored",
                cell.ms,
                packed ? "; sequence, optional and string values cross it packed into bytes" : "");
    KILN_ASSIGN_OR_RETURN(TensorMap cell_outputs, cell.cell->Run(0, cell_inputs));
    KILN_ASSIGN_OR_RETURN(outputs, UnpackOutputs(boundary, cell_outputs));
    mode = "aot_cell";
  } else {
    KILN_ASSIGN_OR_RETURN(outputs, interp.Run(inputs, bound, &stats));
  }
  const double ms = MsSince(start);
  KILN_RETURN_IF_ERROR(MakeDirs(a.out_dir));
  for (const auto& [name, t] : outputs) {
    KILN_ASSIGN_OR_RETURN(std::string path, WriteValue(a.out_dir, SafeFileName(name), t));
    std::printf("%-24s %-22s -> %s\n", name.c_str(), t.TypeString().c_str(), path.c_str());
  }
  if (a.compile) {
    std::printf("serving_mode: %s (%.2f ms including lookup/compile)\n", mode.c_str(), ms);
  } else {
    std::printf("serving_mode: eager (%lld nodes in %.2f ms, peak intermediates %.1f MiB)\n",
                (long long)stats.nodes_run, ms, stats.peak_live_bytes / 1048576.0);
  }
  return Status::OK();
}

}  // namespace

void AddRunCommand(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand("run", "Run a model eagerly on .npy inputs");
  auto args = std::make_shared<RunArgs>();
  cmd->add_option("model", args->model, "ONNX model file")->required();
  cmd->add_option("--checkpoint", args->checkpoint,
                  "safetensors file whose tensors replace the model's weights by name");
  cmd->add_option("--input", args->inputs,
                  "NAME=FILE.npy, once per graph input (a sequence: NAME=DIR of 0.npy, 1.npy, ...; "
                  "an optional holding none: NAME=none)");
  cmd->add_option("--out", args->out_dir,
                  "directory for <output name>.npy files (a sequence: <name>/0.npy ...; an "
                  "optional holding none: <name>.none)")
      ->required();
  cmd->add_flag(
      "--compile", args->compile,
      "compile the graph for these input shapes (through the local store) and run the cell");
  cmd->add_option("--threads", args->threads, "threads for the kernel library");
  cmd->add_option("--disable-pass", args->disabled_passes,
                  "with --compile: skip a compiler pass by name, for bisecting (repeatable); the "
                  "cell is minted past the local store and not kept");
  cmd->callback([=] {
    if (!args->disabled_passes.empty() && !args->compile) {
      *exit_code = ReportError("run", Status::InvalidArgument("--disable-pass needs --compile"));
      return;
    }
    Status s = DoRun(*args);
    *exit_code = s.ok() ? 0 : ReportError("run", s);
  });
}

}  // namespace kiln::cli
