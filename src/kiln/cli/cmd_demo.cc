// `kiln demo`: the README's main job. For now it walks the example models through the
// foundation: import, digest, eager run against PyTorch's reference outputs, and a second
// checkpoint that changes the outputs but not the digest (one cell per architecture). It grows
// into the fleet demo (hub + workers) as those layers land.
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "src/kiln/cli/commands.h"
#include "src/kiln/cli/target_util.h"
#include "src/kiln/eager/interpreter.h"
#include "src/kiln/graph/checkpoint.h"
#include "src/kiln/graph/digest.h"
#include "src/kiln/graph/onnx_import.h"
#include "src/kiln/tensor/npy.h"

#ifndef KILN_SOURCE_DIR
#define KILN_SOURCE_DIR "."
#endif

namespace kiln::cli {

namespace {

bool IsDir(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n != "." && n != "..") names.push_back(n);
    }
    ::closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

// Largest |a-b| over all outputs, and largest |b|.
void Compare(const TensorMap& got, const TensorMap& ref, double* max_err, double* max_ref) {
  *max_err = 0;
  *max_ref = 0;
  for (const auto& [name, r] : ref) {
    auto it = got.find(name);
    if (it == got.end() || it->second.shape() != r.shape()) {
      *max_err = INFINITY;
      continue;
    }
    for (int64_t i = 0; i < r.numel(); ++i) {
      *max_err = std::max(*max_err, std::fabs(it->second.GetAsDouble(i) - r.GetAsDouble(i)));
      *max_ref = std::max(*max_ref, std::fabs(r.GetAsDouble(i)));
    }
  }
}

Result<TensorMap> ReadNpyDir(const std::string& dir) {
  TensorMap out;
  for (const std::string& f : ListDir(dir)) {
    if (f.size() < 5 || f.substr(f.size() - 4) != ".npy") continue;
    KILN_ASSIGN_OR_RETURN(Tensor t, ReadNpy(dir + "/" + f));
    out[f.substr(0, f.size() - 4)] = std::move(t);
  }
  return out;
}

Status DemoOne(const std::string& dir, const std::string& name, bool* all_ok) {
  std::printf("\n== %s ==\n", name.c_str());
  auto t0 = std::chrono::steady_clock::now();
  KILN_ASSIGN_OR_RETURN(Graph g, ImportOnnxFile(dir + "/model.onnx"));
  const double import_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  auto graph = std::make_shared<const Graph>(std::move(g));
  KILN_ASSIGN_OR_RETURN(std::string digest, GraphDigest(*graph));
  int64_t weight_bytes = 0;
  const WeightMap own = GraphWeights(*graph);
  for (const auto& [n, t] : own) weight_bytes += static_cast<int64_t>(t.nbytes());
  std::printf("imported   %zu nodes, %zu weights (%.2f MiB) in %.1f ms\n", graph->nodes.size(),
              own.size(), weight_bytes / 1048576.0, import_ms);
  std::printf("digest     %s\n", digest.c_str());

  KILN_ASSIGN_OR_RETURN(Interpreter interp, Interpreter::Create(graph));
  KILN_ASSIGN_OR_RETURN(WeightMap ckpt_a, LoadCheckpoint(*graph, dir + "/checkpoint.safetensors",
                                                          /*require_complete=*/true));
  KILN_ASSIGN_OR_RETURN(TensorMap inputs, ReadNpyDir(dir + "/inputs"));
  KILN_ASSIGN_OR_RETURN(TensorMap reference, ReadNpyDir(dir + "/outputs"));

  RunStats stats;
  KILN_ASSIGN_OR_RETURN(TensorMap out_a, interp.Run(inputs, &ckpt_a, &stats));
  constexpr int kRuns = 5;
  auto t1 = std::chrono::steady_clock::now();
  for (int i = 0; i < kRuns; ++i) {
    KILN_ASSIGN_OR_RETURN(TensorMap again, interp.Run(inputs, &ckpt_a));
  }
  const double run_ms = std::chrono::duration<double, std::milli>(
                            std::chrono::steady_clock::now() - t1).count() / kRuns;
  double err, ref_max;
  Compare(out_a, reference, &err, &ref_max);
  const bool match = err <= 1e-4 * ref_max;
  *all_ok = *all_ok && match;
  std::printf("eager      %.2f ms/run (mean of %d), peak intermediates %.2f MiB\n", run_ms, kRuns,
              stats.peak_live_bytes / 1048576.0);
  std::printf("vs torch   max|err| %.3g  (bound 1e-4 x max|ref| = %.3g)  %s\n", err,
              1e-4 * ref_max, match ? "MATCH" : "MISMATCH");

  KILN_ASSIGN_OR_RETURN(WeightMap ckpt_b, DeriveCheckpoint(*graph, /*seed=*/7));
  KILN_ASSIGN_OR_RETURN(TensorMap out_b, interp.Run(inputs, &ckpt_b));
  double diff, unused;
  Compare(out_b, out_a, &diff, &unused);
  std::printf("checkpoint B (derived, seed 7): outputs move by up to %.3g; digest %s (%s)\n", diff,
              digest.c_str(), "unchanged: weights are data, not graph");

  // The compiled path: one cell for this class, minted (or found) in the local store, proven
  // against eager at mint, then serving both checkpoints.
  ShapeClass cls;
  for (const auto& [name, t] : inputs) cls[name] = t.shape();
  KILN_ASSIGN_OR_RETURN(LocalCell cell, LocalCellForClass(graph, ckpt_a, cls, "root/" + name, 1));
  std::printf("cell       %s\n           %s in %.0f ms\n", cell.ref.c_str(),
              cell.store_hit ? "found in the local store, admitted and armed"
                             : "minted (compiled, gate HEALTHY, fence proven), stored, armed",
              cell.ms);
  CellRunError run_error;
  KILN_ASSIGN_OR_RETURN(TensorMap cell_a, cell.cell->Run(0, inputs, &run_error));
  auto t2 = std::chrono::steady_clock::now();
  for (int i = 0; i < kRuns; ++i) {
    KILN_ASSIGN_OR_RETURN(TensorMap again, cell.cell->Run(0, inputs, &run_error));
  }
  const double cell_ms = std::chrono::duration<double, std::milli>(
                             std::chrono::steady_clock::now() - t2).count() / kRuns;
  double cerr, cref;
  Compare(cell_a, reference, &cerr, &cref);
  const bool cell_match = cerr <= 1e-4 * cref;
  *all_ok = *all_ok && cell_match;
  std::printf("compiled   %.2f ms/run (%.1fx eager), workspace %.2f MiB; vs torch max|err| %.3g %s\n",
              cell_ms, run_ms / cell_ms, cell.cell->entries()[0].workspace_bytes / 1048576.0, cerr,
              cell_match ? "MATCH" : "MISMATCH");
  KILN_RETURN_IF_ERROR(cell.cell->Rebind(ckpt_b));
  KILN_ASSIGN_OR_RETURN(TensorMap cell_b, cell.cell->Run(0, inputs, &run_error));
  double berr, bref;
  Compare(cell_b, out_b, &berr, &bref);
  std::printf("same cell, checkpoint B: max|cell - eager| %.3g (one cell serves every checkpoint)\n",
              berr);
  *all_ok = *all_ok && berr <= 1e-4 * std::max(bref, 1.0);
  return Status::OK();
}

int RunDemo(std::string examples) {
  if (examples.empty()) {
    const char* env = std::getenv("KILN_EXAMPLES");
    examples = env ? env : (IsDir("examples") ? "examples" : KILN_SOURCE_DIR "/examples");
  }
  std::printf("kiln demo: import, digest, eager vs PyTorch, a second checkpoint, and a cell\n");
  std::printf("examples:  %s\n", examples.c_str());
  bool all_ok = true;
  int count = 0;
  for (const std::string& name : ListDir(examples)) {
    const std::string dir = examples + "/" + name;
    if (!IsDir(dir)) continue;
    ++count;
    Status s = DemoOne(dir, name, &all_ok);
    if (!s.ok()) {
      all_ok = false;
      ReportError("demo", s.WithContext(name));
    }
  }
  if (count == 0) return ReportError("demo", Status::NotFound("no examples in '" + examples + "'"));
  std::printf("\n%s: %d example(s); every eager and compiled output %s PyTorch's reference\n",
              all_ok ? "OK" : "FAILED", count, all_ok ? "matches" : "does NOT match");
  return all_ok ? 0 : 1;
}

}  // namespace

void AddDemoCommand(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand("demo", "Walk the example models through kiln and report");
  auto examples = std::make_shared<std::string>();
  cmd->add_option("--examples", *examples, "examples directory (default: ./examples)");
  cmd->callback([=] { *exit_code = RunDemo(*examples); });
}

}  // namespace kiln::cli
