// `kiln info MODEL.onnx`: what a model is — opsets, I/O, ops, weights, and its graph digest.
#include <cstdio>
#include <map>

#include "src/kiln/cli/commands.h"
#include "src/kiln/graph/digest.h"
#include "src/kiln/graph/onnx_import.h"
#include "src/kiln/ops/verifier.h"

namespace kiln::cli {

namespace {

int RunInfo(const std::string& path, bool facts) {
  auto graph = ImportOnnxFile(path);
  if (!graph.ok()) return ReportError("info", graph.status());
  const Graph& g = *graph;
  Status verified = VerifyGraph(g);
  auto digest = GraphDigest(g);
  if (!digest.ok()) return ReportError("info", digest.status());

  std::printf("model:   %s\n", path.c_str());
  std::printf("digest:  %s  (graph axis of the cell key; weight values are not part of it)\n",
              digest->c_str());
  std::printf("opsets: ");
  for (const auto& [domain, v] : g.opsets) {
    std::printf(" %s=%lld", domain.empty() ? "ai.onnx" : domain.c_str(), (long long)v);
  }
  std::printf("\ninputs:\n");
  for (const ValueInfo& v : g.inputs) {
    std::printf("  %-24s %s%s\n", v.name.c_str(), DTypeName(v.dtype), v.ShapeString().c_str());
  }
  std::printf("outputs:\n");
  for (const ValueInfo& v : g.outputs) {
    std::printf("  %-24s %s%s\n", v.name.c_str(), DTypeName(v.dtype), v.ShapeString().c_str());
  }
  int64_t weight_count = 0, weight_bytes = 0, const_count = 0;
  for (const auto& [name, t] : g.initializers) {
    if (g.IsWeight(name)) {
      ++weight_count;
      weight_bytes += static_cast<int64_t>(t.nbytes());
    } else {
      ++const_count;
    }
  }
  std::printf("weights: %lld tensors, %lld bytes (bound by name, replaceable by a checkpoint)\n",
              (long long)weight_count, (long long)weight_bytes);
  std::printf("structural constants: %lld\n", (long long)const_count);
  std::map<std::string, int> ops;
  for (const Node& n : g.nodes) ++ops[(n.domain.empty() ? "" : n.domain + ".") + n.op_type];
  std::printf("nodes:   %zu\nops:\n", g.nodes.size());
  for (const auto& [op, count] : ops) std::printf("  %-28s %d\n", op.c_str(), count);
  std::printf("verified: %s\n", verified.ok() ? "yes" : verified.ToString().c_str());
  if (facts) {
    auto f = GraphFacts(g);
    if (f.ok()) std::printf("facts:\n%s\n", f->dump(2).c_str());
  }
  return verified.ok() ? 0 : 1;
}

}  // namespace

void AddInfoCommand(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand("info", "Describe a model: I/O, ops, weights, graph digest");
  auto* path = new std::string();
  auto* facts = new bool(false);
  cmd->add_option("model", *path, "ONNX model file")->required();
  cmd->add_flag("--facts", *facts, "Also print the canonical facts the digest is computed over");
  cmd->callback([=] { *exit_code = RunInfo(*path, *facts); });
}

}  // namespace kiln::cli
