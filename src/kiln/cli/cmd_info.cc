// `kiln info MODEL.onnx`: what a model is — opsets, I/O, ops, weights, and its graph digest; and,
// on request, the static shape of every value for concrete input shapes (--shapes-at) or over a
// ranged entry (--ranged, compile/ranged_shapes.h) and, with --template, whether the generated
// program over that range is one template (compile/ranged_emit.h), as JSON.
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>

#include "src/kiln/cell/key.h"
#include "src/kiln/cli/commands.h"
#include "src/kiln/cli/target_util.h"
#include "src/kiln/compile/ranged_emit.h"
#include "src/kiln/compile/ranged_shapes.h"
#include "src/kiln/graph/digest.h"
#include "src/kiln/graph/onnx_import.h"
#include "src/kiln/ops/shape_inference.h"
#include "src/kiln/ops/verifier.h"
#include "src/kiln/tensor/dtype.h"

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

// {"value": [dims]} for every value with a static type at `shapes` ({"input": [dims]}), and the
// dynamic ones under "dynamic".
Result<nlohmann::json> ShapesAtJson(const Graph& g, const std::string& text) {
  KILN_ASSIGN_OR_RETURN(nlohmann::json j, ParseJsonOption(text, "--shapes-at"));
  std::map<std::string, Shape> shapes;
  for (const auto& [name, dims] : j.items()) {
    if (!dims.is_array()) {
      return Status::InvalidArgument("--shapes-at: input '" + name + "' needs a list of dims");
    }
    for (const auto& d : dims) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) {
        return Status::InvalidArgument("--shapes-at: input '" + name + "' has dim " + d.dump() +
                                       "; dims are integers >= 0");
      }
      shapes[name].push_back(d.get<int64_t>());
    }
  }
  KILN_ASSIGN_OR_RETURN(InferredGraph inferred, InferShapes(g, shapes, true));
  nlohmann::json out = {{"shapes", nlohmann::json::object()}, {"dynamic", inferred.dynamic}};
  for (const auto& [name, type] : inferred.types) {
    if (type.kind == ValueKind::kTensor) out["shapes"][name] = type.shape;
  }
  return out;
}

// The ranged entry's analysis: each value's dims as polynomials ([[coefficient, [symbols]], ...]),
// the irregular values with why, the dynamic ones, and the footprint at the range's maximum.
// --template-points: a JSON array of points ({"symbol": value, ...}).
Result<std::vector<SymbolPoint>> ParsePoints(const std::string& text) {
  std::vector<SymbolPoint> out;
  if (text.empty()) return out;
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_array()) {
    return Status::InvalidArgument("--template-points takes a JSON array of points, got '" + text +
                                   "'");
  }
  for (const auto& p : j) {
    if (!p.is_object()) {
      return Status::InvalidArgument("--template-points: " + p.dump() +
                                     " is no point; a point is {\"symbol\": value, ...}");
    }
    SymbolPoint point;
    for (const auto& [name, v] : p.items()) {
      if (!v.is_number_integer()) {
        return Status::InvalidArgument("--template-points: " + name + " is " + v.dump() +
                                       ", expected an integer");
      }
      point[name] = v.get<int64_t>();
    }
    out.push_back(std::move(point));
  }
  return out;
}

Result<nlohmann::json> RangedJson(const Graph& g, const std::string& text, bool fit_template,
                                  const std::string& points_text) {
  KILN_ASSIGN_OR_RETURN(nlohmann::json j, ParseJsonOption(text, "--ranged"));
  KILN_ASSIGN_OR_RETURN(RangedEntry entry, RangedFromJson(j));
  KILN_ASSIGN_OR_RETURN(RangedShapes shapes, InferRangedShapes(g, entry));
  nlohmann::json out = {
      {"symbols", shapes.symbols},       {"shapes", nlohmann::json::object()},
      {"irregular", shapes.irregular},   {"dynamic", shapes.dynamic},
      {"inferences", shapes.inferences}, {"probe_points", RangeProbePoints(entry)},
      {"summary", shapes.Summary()}};
  KILN_ASSIGN_OR_RETURN(RangeFootprint footprint, FootprintAtMaximum(g, entry, shapes));
  out["footprint"] = {{"total_bytes", footprint.total_bytes},
                      {"largest_bytes", footprint.largest_bytes},
                      {"largest", footprint.largest},
                      {"largest_at", footprint.largest_at},
                      {"unbounded", footprint.unbounded}};
  for (const auto& [name, dims] : shapes.shapes) {
    nlohmann::json value = nlohmann::json::array();
    for (const SymDim& d : dims) {
      nlohmann::json terms = nlohmann::json::array();
      for (const auto& [symbols, coeff] : d.terms) terms.push_back({coeff, symbols});
      value.push_back(std::move(terms));
    }
    out["shapes"][name] = std::move(value);
    out["element_bytes"][name] = DTypeSize(shapes.dtypes.at(name));
  }
  if (fit_template) {
    KILN_ASSIGN_OR_RETURN(std::vector<SymbolPoint> points, ParsePoints(points_text));
    KILN_ASSIGN_OR_RETURN(EmittedTemplate t,
                          FitEmittedTemplate(g, entry, CompileOptions{}, points));
    out["template"] = {{"symbols", t.symbols},
                       {"workspace_at_maximum", t.workspace_at_maximum},
                       {"base", t.base},
                       {"emits", t.emits},
                       {"literals", t.literals},
                       {"varying", t.varying},
                       {"max_degree", t.max_degree},
                       {"probes", t.probes},
                       {"holds", t.holds},
                       {"holds_above_base", t.holds_above_base},
                       {"disagreement", t.disagreement},
                       {"summary", t.Summary()}};
  }
  return out;
}

int RunShapes(const std::string& path, const std::string& at, const std::string& ranged,
              bool fit_template, const std::string& points) {
  auto graph = ImportOnnxFile(path);
  if (!graph.ok()) return ReportError("info", graph.status());
  auto out =
      at.empty() ? RangedJson(*graph, ranged, fit_template, points) : ShapesAtJson(*graph, at);
  if (!out.ok()) return ReportError("info", out.status());
  std::printf("%s\n", out->dump().c_str());
  return 0;
}

}  // namespace

void AddInfoCommand(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand("info", "Describe a model: I/O, ops, weights, graph digest");
  auto* path = new std::string();
  auto* facts = new bool(false);
  cmd->add_option("model", *path, "ONNX model file")->required();
  cmd->add_flag("--facts", *facts, "Also print the canonical facts the digest is computed over");
  auto* at = new std::string();
  auto* ranged = new std::string();
  auto* at_opt = cmd->add_option("--shapes-at", *at,
                                 "JSON {input: [dims]}: print every value's static shape as JSON");
  cmd->add_option("--ranged", *ranged,
                  "JSON ranged entry {\"inputs\": {input: [dim or symbol]}, \"ranges\": "
                  "{symbol: [lo, hi]}}: print every value's shape over the ranges as JSON")
      ->excludes(at_opt);
  auto* fit_template = new bool(false);
  cmd->add_flag("--template", *fit_template,
                "with --ranged: also compile and emit the entry at a grid of points and say "
                "whether its source is one template whose integer constants are polynomials in "
                "the symbols, held to every probe point");
  auto* template_points = new std::string();
  cmd->add_option("--template-points", *template_points,
                  "with --template: a JSON array of points of the range ({\"symbol\": value}) "
                  "to hold the template to, besides the probe points");
  cmd->callback([=] {
    if (!template_points->empty() && !*fit_template) {
      *exit_code =
          ReportError("info", Status::InvalidArgument("--template-points needs --template"));
      return;
    }
    if (*fit_template && ranged->empty()) {
      *exit_code = ReportError(
          "info", Status::InvalidArgument("--template needs --ranged (the range to fit over)"));
      return;
    }
    *exit_code = (at->empty() && ranged->empty())
                     ? RunInfo(*path, *facts)
                     : RunShapes(*path, *at, *ranged, *fit_template, *template_points);
  });
}

}  // namespace kiln::cli
