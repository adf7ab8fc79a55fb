// `kiln bench MODEL --class SPEC --threads T [--engine E] [--json]`: kiln's side of bench/run.sh —
// eager and compiled latency, first-run time and memory for one shape class, as JSON lines in the
// schema the peers' scripts print; and `kiln bench --sgemm-peak`, the kernel library's SGEMM
// throughput on this machine, the yardstick for achieved GFLOP/s. Not a test: numbers only mean
// something side by side with the peers.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "src/kiln/base/clock.h"
#include "src/kiln/cell/key.h"
#include "src/kiln/cli/commands.h"
#include "src/kiln/cli/target_util.h"
#include "src/kiln/eager/interpreter.h"
#include "src/kiln/graph/onnx_import.h"
#include "src/kiln/identity/toolchain.h"
#include "src/kiln/ops/dnnl_kernels.h"
#include "src/kiln/tensor/npy.h"

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
  std::string engine = "both";  // eager | compiled | both
  bool mint_only = false;       // put the class's cell into the local store and stop
  bool sgemm_peak = false;
  std::string label;  // engine name of the compiled row (default kiln_compiled)
  std::vector<std::string> disabled_passes;  // bisecting a slow or wrong cell
  std::vector<std::string> inputs;           // NAME=FILE.npy: these values, not probe values
  std::string ranged;  // a ranged entry (JSON): time its cell's entry at --class, not a class's
};

// VmHWM / VmRSS of this process in MiB (0 when /proc is unreadable).
double ProcStatusMb(const char* field) {
  std::ifstream f("/proc/self/status");
  std::string line;
  const size_t n = std::strlen(field);
  while (std::getline(f, line)) {
    if (line.compare(0, n, field) == 0 && line.size() > n && line[n] == ':') {
      return std::atof(line.c_str() + n + 1) / 1024.0;
    }
  }
  return 0;
}

struct Timing {
  double median = 0, p90 = 0, min = 0;
  int runs = 0;
};

template <typename F>
Result<Timing> Time(const BenchArgs& a, F&& once) {
  // Warm-up stops early on a slow model, after at least one run.
  const auto warm = std::chrono::steady_clock::now();
  for (int i = 0; i < a.warmup; ++i) {
    KILN_RETURN_IF_ERROR(once());
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - warm).count() >
        a.max_seconds) {
      break;
    }
  }
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
  t.min = ms[0];
  return t;
}

std::string ModelName(const std::string& path) {
  std::string dir = path.substr(0, path.find_last_of('/'));
  return dir.substr(dir.find_last_of('/') + 1);
}

// The kernel library's SGEMM on square 2048 matrices at the given thread count: best of several
// runs, in GFLOP/s. The peak a compute-bound model's achieved GFLOP/s is compared against.
Status DoSgemmPeak(const BenchArgs& a) {
  const int64_t n = 2048;
  std::vector<float> A(n * n, 0.5f), B(n * n, 0.25f), C(n * n, 0.0f);
  double best = 1e30;
  const auto begin = Clock::Real()->Now();
  for (int i = 0; i < 3 + a.warmup; ++i) {
    const auto t = Clock::Real()->Now();
    KILN_RETURN_IF_ERROR(
        Sgemm(false, false, n, n, n, 1.0f, A.data(), n, B.data(), n, 0.0f, C.data(), n, a.threads));
    if (i >= 1) best = std::min(best, MsSince(t));
    if (i >= 3 && MsSince(begin) > a.max_seconds * 1000) break;
  }
  const double gflops = 2.0 * n * n * n / (best * 1e6);
  if (a.json) {
    std::printf(
        "{\"engine\":\"onednn_sgemm_peak\",\"threads\":%d,\"m\":%lld,\"n\":%lld,"
        "\"k\":%lld,\"best_ms\":%.3f,\"gflops\":%.1f}\n",
        a.threads, static_cast<long long>(n), static_cast<long long>(n), static_cast<long long>(n),
        best, gflops);
  } else {
    std::printf("oneDNN sgemm %lldx%lldx%lld threads=%d: best %.3f ms, %.1f GFLOP/s\n",
                static_cast<long long>(n), static_cast<long long>(n), static_cast<long long>(n),
                a.threads, best, gflops);
  }
  return Status::OK();
}

void PrintRow(const BenchArgs& a, const char* engine, const std::string& model,
              const std::string& spec, const Timing& t, double first_ms, double setup_ms,
              double activation_mb, double rss_base_mb, const std::string& extra) {
  const double peak = ProcStatusMb("VmHWM");
  if (a.json) {
    std::printf(
        "{\"engine\":\"%s\",\"model\":\"%s\",\"class\":\"%s\",\"threads\":%d,"
        "\"median_ms\":%.4f,\"p90_ms\":%.4f,\"min_ms\":%.4f,\"runs\":%d,\"first_ms\":%.4f,"
        "\"setup_ms\":%.1f,\"activation_mb\":%.3f,\"peak_rss_mb\":%.1f,\"rss_delta_mb\":%.1f%s}\n",
        engine, model.c_str(), spec.c_str(), a.threads, t.median, t.p90, t.min, t.runs, first_ms,
        setup_ms, activation_mb, peak, peak - rss_base_mb, extra.c_str());
  } else {
    std::printf(
        "%-13s %s %s threads=%d: median %8.3f ms  p90 %8.3f ms  first %8.3f ms  setup %.1f ms  "
        "activations %.2f MiB  peak RSS %.1f MiB\n",
        engine, model.c_str(), spec.c_str(), a.threads, t.median, t.p90, first_ms, setup_ms,
        activation_mb, peak);
  }
  std::fflush(stdout);
}

Status DoBench(const BenchArgs& a) {
  if (a.sgemm_peak) return DoSgemmPeak(a);
  if (a.engine != "eager" && a.engine != "compiled" && a.engine != "both") {
    return Status::InvalidArgument("--engine '" + a.engine + "': expected eager, compiled or both");
  }
  const bool run_eager = !a.compiled_only && !a.mint_only && a.engine != "compiled";
  const bool run_compiled = a.engine != "eager";
  const double rss_base = ProcStatusMb("VmRSS");
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
  // Given values replace the probe's: a model may run only for some values (an If whose other
  // branch cannot run at this class's shapes, an index that must stay in range).
  for (const std::string& item : a.inputs) {
    const size_t eq = item.find('=');
    const std::string name = eq == std::string::npos ? item : item.substr(0, eq);
    auto it = inputs.find(name);
    if (eq == std::string::npos || it == inputs.end()) {
      return Status::InvalidArgument("--input '" + item +
                                     "' must be NAME=FILE.npy for a graph input");
    }
    auto t = ReadNpy(item.substr(eq + 1));
    if (!t.ok()) return t.status().WithContext("input '" + name + "'");
    if (t->dtype() != it->second.dtype() || t->shape() != it->second.shape()) {
      return Status::InvalidArgument("--input '" + name + "' is " + t->TypeString() +
                                     ", the class says " + it->second.TypeString());
    }
    it->second = std::move(t).value();
  }

  const std::string model = ModelName(a.model), spec = ClassSpec(cls);
  if (run_eager) {
    KILN_ASSIGN_OR_RETURN(Interpreter eager, Interpreter::Create(graph));
    RunStats stats;
    const auto first = Clock::Real()->Now();
    KILN_RETURN_IF_ERROR(eager.Run(inputs, &weights, &stats).status());
    const double first_ms = MsSince(first);
    KILN_ASSIGN_OR_RETURN(Timing te, Time(a, [&] { return eager.Run(inputs, &weights).status(); }));
    PrintRow(a, "kiln_eager", model, spec, te, first_ms, 0, stats.peak_live_bytes / 1048576.0,
             rss_base, "");
  }
  if (!run_compiled) return Status::OK();
  // Binding a cell found in the local store is what a worker's boot does; a miss mints it first
  // (compile, gate, fence), which is timed apart (`--mint-only` does just that, so a measuring
  // process's peak memory holds no proof runs).
  // With --ranged the cell is the ranged entry's, and --class a point of its range: the entry
  // admitting it runs (its first run makes the instance for that point).
  Envelope envelope{{cls}};
  if (!a.ranged.empty()) {
    KILN_ASSIGN_OR_RETURN(nlohmann::json j, ParseJsonOption(a.ranged, "--ranged"));
    KILN_ASSIGN_OR_RETURN(RangedEntry entry, RangedFromJson(j));
    KILN_RETURN_IF_ERROR(CheckRangedEntry(entry, "--ranged"));
    envelope = Envelope{};
    envelope.ranged = {entry};
  }
  const auto bind = Clock::Real()->Now();
  KILN_ASSIGN_OR_RETURN(LocalCell cell,
                        LocalCellForEnvelope(graph, weights, envelope, "local/bench", a.threads, {},
                                             a.disabled_passes));
  const double setup_ms = MsSince(bind);
  std::string mismatch;
  const int entry = cell.cell->Admit(inputs, &mismatch);
  if (entry < 0) {
    return Status::InvalidArgument("no entry of the cell admits --class " + a.spec + ": " +
                                   mismatch);
  }
  if (a.mint_only) {
    std::printf("%s %s: cell %s (%s, %.0f ms)\n", model.c_str(), spec.c_str(), cell.ref.c_str(),
                cell.store_hit ? "local store hit" : "minted", setup_ms);
    return Status::OK();
  }
  auto run = [&] { return cell.cell->Run(entry, inputs).status(); };
  const auto first = Clock::Real()->Now();
  KILN_RETURN_IF_ERROR(run());
  const double first_ms = MsSince(first);
  KILN_ASSIGN_OR_RETURN(Timing tc, Time(a, run));
  std::string extra = ",\"cell\":\"" + cell.ref + "\",\"sm\":\"" + DefaultSmTarget() +
                      "\",\"store_hit\":" + (cell.store_hit ? "true" : "false");
  PrintRow(a, a.label.empty() ? "kiln_compiled" : a.label.c_str(), model, spec, tc, first_ms,
           setup_ms, cell.cell->entries()[entry].workspace_bytes / 1048576.0, rss_base, extra);
  return Status::OK();
}

}  // namespace

void AddBenchCommand(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand("bench", "Eager vs compiled latency for one shape class");
  cmd->allow_extras(false);
  auto a = std::make_shared<BenchArgs>();
  cmd->add_option("model", a->model, "ONNX model file");
  cmd->add_option("--class", a->spec, "shape class, e.g. x=[4,64] or a=[1,4];b=[1]");
  cmd->add_option("--checkpoint", a->checkpoint, "safetensors checkpoint");
  cmd->add_option("--threads", a->threads, "kernel-library threads");
  cmd->add_option("--warmup", a->warmup, "untimed runs first");
  cmd->add_option("--runs", a->runs, "timed runs (stops early after --max-seconds)");
  cmd->add_option("--max-seconds", a->max_seconds, "time budget per engine");
  cmd->add_flag("--json", a->json, "JSON lines (bench/run.sh schema)");
  cmd->add_flag("--compiled-only", a->compiled_only, "skip timing eager (for profiling the cell)");
  cmd->add_option("--engine", a->engine, "eager, compiled or both (one engine per process)");
  cmd->add_flag("--mint-only", a->mint_only,
                "mint the class's cell into the local store, then stop");
  cmd->add_option("--label", a->label, "engine name of the compiled row (e.g. kiln_compiled_v4)");
  cmd->add_option("--input", a->inputs,
                  "NAME=FILE.npy: run with these values instead of probe values (repeatable)");
  cmd->add_option("--disable-pass", a->disabled_passes,
                  "compile without this pass (repeatable), past the local store: for bisecting");
  cmd->add_option("--ranged", a->ranged,
                  "JSON ranged entry {\"inputs\": {input: [dim or symbol]}, \"ranges\": {symbol: "
                  "[lo, hi]}}: the compiled engine is the cell of that entry, run at --class");
  cmd->add_flag("--sgemm-peak", a->sgemm_peak,
                "time the kernel library's SGEMM (2048^3) at --threads instead of a model");
  cmd->callback([=] {
    Status s = (a->sgemm_peak || (!a->model.empty() && !a->spec.empty()))
                   ? DoBench(*a)
                   : Status::InvalidArgument("bench needs MODEL and --class (or --sgemm-peak)");
    *exit_code = s.ok() ? 0 : ReportError("bench", s);
  });
}

}  // namespace kiln::cli
