// `kiln bench MODEL --class SPEC --threads T [--json]`: kiln's side of bench/run.sh — eager and
// compiled latency and activation memory for one shape class, as JSON lines in the schema the
// peers' scripts print. Not a test: numbers only mean something side by side with the peers.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>

#include "src/kiln/cli/commands.h"
#include "src/kiln/cli/target_util.h"
#include "src/kiln/eager/interpreter.h"
#include "src/kiln/graph/onnx_import.h"

namespace kiln::cli {

namespace {

struct BenchArgs {
  std::string model;
  std::string checkpoint;
  std::string spec;
  int threads = 1;
  int warmup = 5;
  int runs = 30;
  double max_seconds = 5;
  bool json = false;
  bool compiled_only = false;
};

struct Timing {
  double median = 0, p90 = 0;
  int runs = 0;
};

template <typename F>
Result<Timing> Time(const BenchArgs& a, F&& once) {
  for (int i = 0; i < a.warmup; ++i) KILN_RETURN_IF_ERROR(once());
  std::vector<double> ms;
  const auto begin = std::chrono::steady_clock::now();
  while (static_cast<int>(ms.size()) < a.runs) {
    const auto start = std::chrono::steady_clock::now();
    KILN_RETURN_IF_ERROR(once());
    const auto end = std::chrono::steady_clock::now();
    ms.push_back(std::chrono::duration<double, std::milli>(end - start).count());
    if (std::chrono::duration<double>(end - begin).count() > a.max_seconds && ms.size() >= 5) break;
  }
  std::sort(ms.begin(), ms.end());
  Timing t;
  t.runs = static_cast<int>(ms.size());
  t.median = ms[ms.size() / 2];
  t.p90 = ms[std::min(ms.size() - 1, ms.size() * 9 / 10)];
  return t;
}

std::string ModelName(const std::string& path) {
  std::string dir = path.substr(0, path.find_last_of('/'));
  return dir.substr(dir.find_last_of('/') + 1);
}

Status DoBench(const BenchArgs& a) {
  KILN_ASSIGN_OR_RETURN(Graph g, ImportOnnxFile(a.model));
  auto graph = std::make_shared<const Graph>(std::move(g));
  KILN_ASSIGN_OR_RETURN(ShapeClass cls, ParseClassSpec(a.spec));
  WeightMap weights = GraphWeights(*graph);
  if (!a.checkpoint.empty()) {
    KILN_ASSIGN_OR_RETURN(weights, LoadCheckpoint(*graph, a.checkpoint));
  }
  EntryMetadata probe_spec;
  for (const ValueInfo& v : graph->inputs) {
    auto it = cls.find(v.name);
    if (it == cls.end()) return Status::InvalidArgument("--class lacks input '" + v.name + "'");
    probe_spec.inputs.push_back({v.name, v.dtype, it->second});
  }
  KILN_ASSIGN_OR_RETURN(TensorMap inputs,
                        ProbeInputs(probe_spec, Lane::kExported, 99, ProbeIntBounds(*graph, cls)));

  KILN_ASSIGN_OR_RETURN(Interpreter eager, Interpreter::Create(graph));
  RunStats stats;
  KILN_RETURN_IF_ERROR(eager.Run(inputs, &weights, &stats).status());
  Timing te;
  if (!a.compiled_only) {
    KILN_ASSIGN_OR_RETURN(te, Time(a, [&] { return eager.Run(inputs, &weights).status(); }));
  }

  KILN_ASSIGN_OR_RETURN(LocalCell cell,
                        LocalCellForClass(graph, weights, cls, "local/bench", a.threads));
  KILN_ASSIGN_OR_RETURN(Timing tc, Time(a, [&] {
                          CellRunError err;
                          return cell.cell->Run(0, inputs, &err).status();
                        }));
  const double eager_act = stats.peak_live_bytes / 1048576.0;
  const double cell_act = cell.cell->entries()[0].workspace_bytes / 1048576.0;
  const std::string model = ModelName(a.model), spec = ClassSpec(cls);
  if (a.json) {
    for (int i = 0; i < 2; ++i) {
      const Timing& t = i == 0 ? te : tc;
      std::printf(
          "{\"engine\":\"%s\",\"model\":\"%s\",\"class\":\"%s\",\"threads\":%d,"
          "\"median_ms\":%.4f,\"p90_ms\":%.4f,\"runs\":%d,\"activation_mb\":%.3f%s}\n",
          i == 0 ? "kiln_eager" : "kiln_compiled", model.c_str(), spec.c_str(), a.threads, t.median,
          t.p90, t.runs, i == 0 ? eager_act : cell_act,
          i == 0 ? "" : (",\"cell\":\"" + cell.ref + "\"").c_str());
    }
  } else {
    std::printf(
        "%s %s threads=%d\n  eager     median %8.3f ms  p90 %8.3f ms  activations %.2f MiB\n"
        "  compiled  median %8.3f ms  p90 %8.3f ms  workspace   %.2f MiB  (%.2fx)\n",
        model.c_str(), spec.c_str(), a.threads, te.median, te.p90, eager_act, tc.median, tc.p90,
        cell_act, te.median / tc.median);
  }
  return Status::OK();
}

}  // namespace

void AddBenchCommand(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand("bench", "Eager vs compiled latency for one shape class");
  auto a = std::make_shared<BenchArgs>();
  cmd->add_option("model", a->model, "ONNX model file")->required();
  cmd->add_option("--class", a->spec, "shape class, e.g. x=[4,64] or a=[1,4];b=[1]")->required();
  cmd->add_option("--checkpoint", a->checkpoint, "safetensors checkpoint");
  cmd->add_option("--threads", a->threads, "kernel-library threads");
  cmd->add_option("--warmup", a->warmup, "untimed runs first");
  cmd->add_option("--runs", a->runs, "timed runs (stops early after --max-seconds)");
  cmd->add_option("--max-seconds", a->max_seconds, "time budget per engine");
  cmd->add_flag("--json", a->json, "JSON lines (bench/run.sh schema)");
  cmd->add_flag("--compiled-only", a->compiled_only, "skip timing eager (for profiling the cell)");
  cmd->callback([=] {
    Status s = DoBench(*a);
    *exit_code = s.ok() ? 0 : ReportError("bench", s);
  });
}

}  // namespace kiln::cli
