// The compiler's differential fuzzer: batches, comparison, shrinking, reproducers (see
// differ.h).
#include "fuzz/graphs/differ.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "src/kiln/arm/loader.h"
#include "src/kiln/base/file.h"
#include "src/kiln/compile/pipeline.h"
#include "src/kiln/graph/onnx_import.h"
#include "src/kiln/identity/toolchain.h"
#include "src/kiln/mint/mint.h"
#include "src/kiln/ops/shape_inference.h"
#include "src/kiln/tensor/npy.h"

namespace kiln::graph_fuzz {

namespace {

double Ms(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

int OnnxElem(DType t) {
  using onnx::TensorProto;
  switch (t) {
    case DType::kFloat32:
      return TensorProto::FLOAT;
    case DType::kFloat16:
      return TensorProto::FLOAT16;
    case DType::kFloat64:
      return TensorProto::DOUBLE;
    case DType::kInt64:
      return TensorProto::INT64;
    case DType::kInt32:
      return TensorProto::INT32;
    case DType::kInt16:
      return TensorProto::INT16;
    case DType::kInt8:
      return TensorProto::INT8;
    case DType::kUInt64:
      return TensorProto::UINT64;
    case DType::kUInt32:
      return TensorProto::UINT32;
    case DType::kUInt16:
      return TensorProto::UINT16;
    case DType::kUInt8:
      return TensorProto::UINT8;
    case DType::kBool:
      return TensorProto::BOOL;
    case DType::kBFloat16:
      return TensorProto::BFLOAT16;
    case DType::kString:
      return TensorProto::STRING;
  }
  return TensorProto::UNDEFINED;
}

// ---- renaming ---------------------------------------------------------------------------------

// Applies `f` to every value name in `g` (inputs, outputs, initializers, node inputs and outputs,
// value infos) and in its subgraphs; node names get `f` too.
void RenameAll(onnx::GraphProto& g, const std::function<std::string(const std::string&)>& f) {
  auto apply = [&](std::string* s) {
    if (!s->empty()) *s = f(*s);
  };
  for (auto& v : *g.mutable_input()) apply(v.mutable_name());
  for (auto& v : *g.mutable_output()) apply(v.mutable_name());
  for (auto& v : *g.mutable_value_info()) apply(v.mutable_name());
  for (auto& t : *g.mutable_initializer()) apply(t.mutable_name());
  for (auto& n : *g.mutable_node()) {
    apply(n.mutable_name());
    for (auto& i : *n.mutable_input()) apply(&i);
    for (auto& o : *n.mutable_output()) apply(&o);
    for (auto& a : *n.mutable_attribute()) {
      if (a.has_g()) RenameAll(*a.mutable_g(), f);
      for (auto& sub : *a.mutable_graphs()) RenameAll(sub, f);
    }
  }
}

// Every name a node's subgraphs reference (an over-approximation of what they read from
// outside: names they define themselves are included, which only keeps more alive).
void SubgraphNames(const onnx::NodeProto& n, std::set<std::string>& out) {
  std::function<void(const onnx::GraphProto&)> walk = [&](const onnx::GraphProto& g) {
    for (const auto& m : g.node()) {
      for (const auto& i : m.input()) out.insert(i);
      for (const auto& a : m.attribute()) {
        if (a.has_g()) walk(a.g());
        for (const auto& sub : a.graphs()) walk(sub);
      }
    }
    for (const auto& o : g.output()) out.insert(o.name());
  };
  for (const auto& a : n.attribute()) {
    if (a.has_g()) walk(a.g());
    for (const auto& sub : a.graphs()) walk(sub);
  }
}

// Removes nodes that reach no graph output, then graph inputs and initializers nothing reads.
void Prune(FuzzGraph& fg) {
  onnx::GraphProto& g = *fg.model.mutable_graph();
  std::set<std::string> live;
  for (const auto& o : g.output()) live.insert(o.name());
  std::vector<bool> keep(static_cast<size_t>(g.node_size()), false);
  for (int i = g.node_size() - 1; i >= 0; --i) {
    const auto& n = g.node(i);
    bool used = false;
    for (const auto& o : n.output()) used = used || (!o.empty() && live.count(o));
    if (!used) continue;
    keep[static_cast<size_t>(i)] = true;
    for (const auto& in : n.input()) live.insert(in);
    SubgraphNames(n, live);
  }
  google::protobuf::RepeatedPtrField<onnx::NodeProto> nodes;
  for (int i = 0; i < g.node_size(); ++i) {
    if (keep[static_cast<size_t>(i)]) *nodes.Add() = g.node(i);
  }
  g.mutable_node()->Swap(&nodes);
  google::protobuf::RepeatedPtrField<onnx::ValueInfoProto> inputs;
  for (const auto& v : g.input()) {
    if (live.count(v.name())) {
      *inputs.Add() = v;
    } else {
      fg.inputs.erase(v.name());
    }
  }
  g.mutable_input()->Swap(&inputs);
  google::protobuf::RepeatedPtrField<onnx::TensorProto> inits;
  for (const auto& t : g.initializer()) {
    if (live.count(t.name())) *inits.Add() = t;
  }
  g.mutable_initializer()->Swap(&inits);
}

Result<std::shared_ptr<const Graph>> Import(const onnx::ModelProto& m, const std::string& what) {
  KILN_ASSIGN_OR_RETURN(Graph g, ImportOnnxBytes(m.SerializeAsString(), what));
  return std::make_shared<const Graph>(std::move(g));
}

ShapeClass ClassOf(const TensorMap& inputs) {
  ShapeClass c;
  for (const auto& [n, t] : inputs) c[n] = t.shape();
  return c;
}

// ---- one cell over many graphs -------------------------------------------------------------

struct Prepared {
  std::shared_ptr<const Graph> graph;
  TensorMap eager;  // eager's outputs
};

// Compiles `graphs[which]` as one cell and runs it; fills `results` for each of them. A build
// that fails as a whole is split in halves until the graph to blame is alone.
void CompileAndRun(const std::vector<FuzzGraph>& graphs, const std::vector<Prepared>& prepared,
                   const std::vector<size_t>& which, const DiffOptions& options,
                   std::vector<CaseResult>& results, BatchStats* stats) {
  if (which.empty()) return;
  auto fail_all = [&](Outcome o, const std::string& note) -> bool {
    if (which.size() == 1) {
      results[which[0]] = {o, note};
      return true;
    }
    const size_t half = which.size() / 2;
    CompileAndRun(graphs, prepared, {which.begin(), which.begin() + static_cast<long>(half)},
                  options, results, stats);
    CompileAndRun(graphs, prepared, {which.begin() + static_cast<long>(half), which.end()}, options,
                  results, stats);
    return true;
  };
  // S1: the union: graph i's names all start with "g<i>_".
  onnx::ModelProto u;
  u.set_ir_version(graphs[which[0]].model.ir_version());
  *u.mutable_opset_import() = graphs[which[0]].model.opset_import();
  u.mutable_graph()->set_name("batch");
  TensorMap inputs;
  for (size_t i : which) {
    const std::string prefix = "g" + std::to_string(i) + "_";
    onnx::GraphProto g = graphs[i].model.graph();
    RenameAll(g, [&](const std::string& s) { return prefix + s; });
    onnx::GraphProto& ug = *u.mutable_graph();
    for (auto& v : *g.mutable_input()) *ug.add_input() = std::move(v);
    for (auto& v : *g.mutable_output()) *ug.add_output() = std::move(v);
    for (auto& t : *g.mutable_initializer()) *ug.add_initializer() = std::move(t);
    for (auto& n : *g.mutable_node()) *ug.add_node() = std::move(n);
    for (const auto& [name, t] : graphs[i].inputs) inputs[prefix + name] = t;
    if (stats) stats->nodes += CountNodes(graphs[i].model.graph());
  }
  auto graph = Import(u, "fuzz batch");
  if (!graph.ok()) {
    fail_all(Outcome::kCompileRefused, "import of the batch: " + graph.status().ToString());
    return;
  }
  // S2: passes, emission, the C++ build, load.
  const ShapeClass cls = ClassOf(inputs);
  Envelope env{{cls}};
  CompileOptions copt;
  copt.disabled_passes = options.disabled_passes;
  auto start = std::chrono::steady_clock::now();
  auto cell = GenerateCell(**graph, env, "graph-fuzz", copt, nullptr);
  if (stats) stats->passes_ms += Ms(start);
  if (!cell.ok()) {
    fail_all(Outcome::kCompileRefused, cell.status().ToString());
    return;
  }
  auto toolchain = LocalToolchain();
  if (!toolchain.ok()) {
    fail_all(Outcome::kRunFailed, toolchain.status().ToString());
    return;
  }
  auto driver = MakeSystemCompilerDriver(*toolchain);
  static int counter = 0;
  const std::string dir = options.work_dir + "/kiln-graph-fuzz-" + std::to_string(::getpid()) +
                          "-" + std::to_string(counter++);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (Status s = MakeDirs(dir); !s.ok()) {
    fail_all(Outcome::kRunFailed, s.ToString());
    return;
  }
  start = std::chrono::steady_clock::now();
  auto so =
      BuildSharedObject(cell->source, 1, DefaultSmTarget(), "graph-fuzz", *driver, dir, 2, nullptr);
  if (stats) {
    stats->build_ms += Ms(start);
    ++stats->cells;
  }
  Result<std::shared_ptr<CellLibrary>> lib =
      so.ok() ? OpenCellBytes(*so, dir + "/load")
              : Result<std::shared_ptr<CellLibrary>>(so.status());
  std::filesystem::remove_all(dir, ec);  // the mapping outlives the file
  if (!lib.ok()) {
    fail_all(Outcome::kRunFailed, "build: " + lib.status().ToString());
    return;
  }
  auto entries = EntriesFromDescribe(cell->describe, env);
  if (!entries.ok()) {
    fail_all(Outcome::kRunFailed, entries.status().ToString());
    return;
  }
  // S3: run once per thread count and score each graph's outputs.
  const WeightMap weights = GraphWeights(**graph);
  start = std::chrono::steady_clock::now();
  for (int threads : options.threads) {
    auto armed = ArmedCell::Arm(*lib, *entries, weights, Lane::kIntake, "", threads);
    if (!armed.ok()) {
      fail_all(Outcome::kRunFailed, "arm: " + armed.status().ToString());
      return;
    }
    auto got = (*armed)->Run(0, inputs);
    if (!got.ok()) {
      fail_all(Outcome::kRunFailed,
               "run on " + std::to_string(threads) + " threads: " + got.status().ToString());
      return;
    }
    for (size_t i : which) {
      if (results[i].outcome != Outcome::kMatch) continue;  // the first thread count's note stays
      const std::string prefix = "g" + std::to_string(i) + "_";
      TensorMap mine;
      for (const auto& [name, t] : prepared[i].eager) {
        auto it = got->find(prefix + name);
        if (it == got->end()) {
          results[i] = {Outcome::kRunFailed, "the cell gave no output '" + name + "'"};
          break;
        }
        mine[name] = it->second;
      }
      if (results[i].outcome != Outcome::kMatch) continue;
      EntryNumerics n = CompareOutputs(prepared[i].eager, mine, options.thresholds);
      if (n.verdict != Verdict::kHealthy) {
        std::ostringstream note;
        note << VerdictName(n.verdict) << " on " << threads << " thread"
             << (threads == 1 ? "" : "s") << ": cos=" << n.cos << " ret=" << n.ret
             << " rel_l2=" << n.rel_l2 << (n.note.empty() ? "" : "; " + n.note);
        results[i] = {Outcome::kDiffers, note.str()};
      }
    }
  }
  if (stats) stats->run_ms += Ms(start);
}

}  // namespace

const char* OutcomeName(Outcome o) {
  switch (o) {
    case Outcome::kMatch:
      return "match";
    case Outcome::kInvalid:
      return "invalid";
    case Outcome::kCompileRefused:
      return "compile_refused";
    case Outcome::kRunFailed:
      return "run_failed";
    case Outcome::kDiffers:
      return "differs";
  }
  return "?";
}

int CountNodes(const onnx::GraphProto& g) {
  int n = 0;
  for (const auto& node : g.node()) {
    ++n;
    for (const auto& a : node.attribute()) {
      if (a.has_g()) n += CountNodes(a.g());
      for (const auto& sub : a.graphs()) n += CountNodes(sub);
    }
  }
  return n;
}

std::vector<CaseResult> RunBatch(const std::vector<FuzzGraph>& graphs, const DiffOptions& options,
                                 BatchStats* stats) {
  std::vector<CaseResult> results(graphs.size());
  std::vector<Prepared> prepared(graphs.size());
  std::vector<size_t> valid;
  for (size_t i = 0; i < graphs.size(); ++i) {
    // S1: eager is the oracle; a graph it refuses was generated wrong.
    auto start = std::chrono::steady_clock::now();
    auto graph = Import(graphs[i].model, graphs[i].name);
    if (!graph.ok()) {
      results[i] = {Outcome::kInvalid, "import: " + graph.status().ToString()};
      continue;
    }
    auto eager = Interpreter::Create(*graph);
    if (!eager.ok()) {
      results[i] = {Outcome::kInvalid, "eager: " + eager.status().ToString()};
      continue;
    }
    auto ref = eager->Run(graphs[i].inputs);
    if (stats) stats->eager_ms += Ms(start);
    if (!ref.ok()) {
      results[i] = {Outcome::kInvalid, "eager: " + ref.status().ToString()};
      continue;
    }
    prepared[i] = {*graph, std::move(ref).value()};
    // S2: the passes alone, per graph, so a refusal is pinned on its graph without a build.
    start = std::chrono::steady_clock::now();
    CompileOptions copt;
    copt.disabled_passes = options.disabled_passes;
    auto p = CompileEntry(**graph, ClassOf(graphs[i].inputs), 0, copt, nullptr);
    if (stats) stats->passes_ms += Ms(start);
    if (!p.ok()) {
      results[i] = {Outcome::kCompileRefused, p.status().ToString()};
      continue;
    }
    valid.push_back(i);
  }
  CompileAndRun(graphs, prepared, valid, options, results, stats);
  return results;
}

namespace {

// `t` with `rows` slices along `axis`, slice r a copy of slice r % t.dim(axis).
Result<Tensor> WithRows(const Tensor& t, int64_t axis, int64_t rows) {
  Shape shape = t.shape();
  const int64_t have = shape[static_cast<size_t>(axis)];
  int64_t outer = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= shape[static_cast<size_t>(d)];
  const size_t block = have && outer ? t.nbytes() / static_cast<size_t>(outer * have) : 0;
  shape[static_cast<size_t>(axis)] = rows;
  std::vector<uint8_t> bytes(block * static_cast<size_t>(outer * rows));
  const auto* src = static_cast<const uint8_t*>(t.raw_data());
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(bytes.data() + block * static_cast<size_t>(o * rows + r),
                  src + block * static_cast<size_t>(o * have + r % have), block);
    }
  }
  return Tensor::FromBytes(t.dtype(), shape, bytes.data(), bytes.size());
}

}  // namespace

CaseResult RunRanged(const FuzzGraph& fg, const DiffOptions& options, int64_t span,
                     const std::vector<int64_t>& axes, RangedStats* stats) {
  if (stats) ++stats->graphs;
  // The entry: the first of `axes` of the first input that has it gives v; every dim among
  // `axes` of every input whose size is v is `n` (eager says whether the graph takes them
  // together); the rest is fixed.
  int64_t v = -1;
  RangedEntry entry;
  std::map<std::string, std::vector<int64_t>> ranged;  // input -> its dims that are `n`
  const int64_t first = axes.at(0);
  for (const auto& [name, t] : fg.inputs) {
    if (!t.is_tensor() || t.dtype() == DType::kString) {
      return {Outcome::kInvalid, "input '" + name + "' is " + t.TypeString()};
    }
    if (v < 0 && t.rank() > first && t.dim(first) >= 1) v = t.dim(first);
    std::vector<DimSpec>& dims = entry.inputs[name];
    for (int64_t d = 0; d < t.rank(); ++d) {
      const bool symbolic =
          v >= 1 && t.dim(d) == v && std::find(axes.begin(), axes.end(), d) != axes.end();
      if (symbolic) ranged[name].push_back(d);
      dims.push_back(symbolic ? DimSpec{0, "n"} : DimSpec{t.dim(d), ""});
    }
  }
  if (v < 0) return {Outcome::kInvalid, "no input with a dim " + std::to_string(first)};
  entry.ranges["n"] = {v, v + span - 1};
  // The model declares the ranged inputs' dims as `n`, as an exporter with dynamic axes
  // writes it (a fixed size there makes eager refuse the other points).
  onnx::ModelProto model = fg.model;
  for (auto& in : *model.mutable_graph()->mutable_input()) {
    auto* shape = in.mutable_type()->mutable_tensor_type()->mutable_shape();
    auto it = ranged.find(in.name());
    for (int64_t d : it == ranged.end() ? std::vector<int64_t>{} : it->second) {
      if (shape->dim_size() > d) shape->mutable_dim(static_cast<int>(d))->set_dim_param("n");
    }
  }
  model.mutable_graph()->clear_value_info();
  for (auto& out : *model.mutable_graph()->mutable_output()) {
    out.mutable_type()->mutable_tensor_type()->clear_shape();
  }
  auto graph = Import(model, fg.name);
  if (!graph.ok()) return {Outcome::kInvalid, "import: " + graph.status().ToString()};
  auto eager = Interpreter::Create(*graph);
  if (!eager.ok()) return {Outcome::kInvalid, "eager: " + eager.status().ToString()};
  // Eager at every point of the range.
  std::vector<TensorMap> inputs, want;
  for (int64_t m = v; m < v + span; ++m) {
    TensorMap in;
    for (const auto& [name, t] : fg.inputs) {
      Tensor x = t;
      auto it = ranged.find(name);
      for (int64_t d : it == ranged.end() ? std::vector<int64_t>{} : it->second) {
        auto rows = WithRows(x, d, m);
        if (!rows.ok()) return {Outcome::kInvalid, rows.status().ToString()};
        x = std::move(rows).value();
      }
      in[name] = std::move(x);
    }
    auto ref = eager->Run(in);
    if (!ref.ok()) {
      return {Outcome::kInvalid,
              "eager at n=" + std::to_string(m) + ": " + ref.status().ToString()};
    }
    inputs.push_back(std::move(in));
    want.push_back(std::move(ref).value());
  }
  // The cell: the ranged entry's pieces, or a gap.
  Envelope env;
  env.ranged = {entry};
  CompileOptions copt;
  copt.disabled_passes = options.disabled_passes;
  auto cell = GenerateCell(**graph, env, "graph-fuzz-ranged", copt, nullptr);
  if (!cell.ok()) return {Outcome::kCompileRefused, cell.status().ToString()};
  if (!cell->gaps.empty()) {
    if (stats) ++stats->gaps;
    return {Outcome::kCompileRefused, "gap: " + cell->gaps[0].second};
  }
  auto toolchain = LocalToolchain();
  if (!toolchain.ok()) return {Outcome::kRunFailed, toolchain.status().ToString()};
  auto driver = MakeSystemCompilerDriver(*toolchain);
  static int counter = 0;
  const std::string dir = options.work_dir + "/kiln-graph-fuzz-ranged-" +
                          std::to_string(::getpid()) + "-" + std::to_string(counter++);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (Status s = MakeDirs(dir); !s.ok()) return {Outcome::kRunFailed, s.ToString()};
  auto start = std::chrono::steady_clock::now();
  auto so = BuildSharedObject(cell->source, cell->ranged_pieces.size(), DefaultSmTarget(),
                              "graph-fuzz-ranged", *driver, dir, 2, nullptr);
  if (stats) stats->build_ms += Ms(start);
  Result<std::shared_ptr<CellLibrary>> lib =
      so.ok() ? OpenCellBytes(*so, dir + "/load")
              : Result<std::shared_ptr<CellLibrary>>(so.status());
  std::filesystem::remove_all(dir, ec);
  if (!lib.ok()) return {Outcome::kRunFailed, "build: " + lib.status().ToString()};
  Envelope compiled;
  for (const auto& [r, piece] : cell->ranged_pieces) compiled.ranged.push_back(piece);
  auto entries = EntriesFromDescribe(cell->describe, compiled);
  if (!entries.ok()) return {Outcome::kRunFailed, entries.status().ToString()};
  if (stats) ++stats->compiled;
  const WeightMap weights = GraphWeights(**graph);
  start = std::chrono::steady_clock::now();
  CaseResult result;
  for (int threads : options.threads) {
    auto armed = ArmedCell::Arm(*lib, *entries, weights, Lane::kIntake, "", threads);
    if (!armed.ok()) return {Outcome::kRunFailed, "arm: " + armed.status().ToString()};
    for (size_t p = 0; p < inputs.size() && result.outcome == Outcome::kMatch; ++p) {
      const std::string at = "n=" + std::to_string(v + static_cast<int64_t>(p)) + " of " +
                             DescribeRanged(entry) + " on " + std::to_string(threads) + " thread" +
                             (threads == 1 ? "" : "s");
      std::string why;
      const int e = (*armed)->Admit(inputs[p], &why);
      if (e < 0) return {Outcome::kRunFailed, "at " + at + " no entry admits: " + why};
      auto got = (*armed)->Run(e, inputs[p]);
      if (stats) ++stats->points;
      if (!got.ok()) return {Outcome::kRunFailed, "at " + at + ": " + got.status().ToString()};
      EntryNumerics n = CompareOutputs(want[p], *got, options.thresholds);
      if (n.verdict != Verdict::kHealthy) {
        std::ostringstream note;
        note << VerdictName(n.verdict) << " at " << at << ": cos=" << n.cos << " ret=" << n.ret
             << (n.note.empty() ? "" : "; " + n.note);
        result = {Outcome::kDiffers, note.str()};
      }
    }
  }
  if (stats) stats->run_ms += Ms(start);
  return result;
}

namespace {

// Every top-level value's eager value, by running a copy whose outputs are all of them.
Result<TensorMap> EagerValues(const FuzzGraph& fg) {
  KILN_ASSIGN_OR_RETURN(auto graph, Import(fg.model, fg.name));
  KILN_ASSIGN_OR_RETURN(InferredGraph inf, InferShapes(*graph, ClassOf(fg.inputs)));
  onnx::ModelProto m = fg.model;
  std::set<std::string> outs;
  for (const auto& o : m.graph().output()) outs.insert(o.name());
  for (const auto& n : fg.model.graph().node()) {
    for (const auto& o : n.output()) {
      if (o.empty() || outs.count(o) || !inf.types.count(o)) continue;
      auto* vi = m.mutable_graph()->add_output();
      vi->set_name(o);
      vi->mutable_type()->mutable_tensor_type()->set_elem_type(OnnxElem(inf.types.at(o).dtype));
      outs.insert(o);
    }
  }
  KILN_ASSIGN_OR_RETURN(auto all, Import(m, fg.name));
  KILN_ASSIGN_OR_RETURN(Interpreter eager, Interpreter::Create(all));
  return eager.Run(fg.inputs);
}

std::set<std::string> GraphOutputs(const onnx::GraphProto& g) {
  std::set<std::string> s;
  for (const auto& o : g.output()) s.insert(o.name());
  return s;
}

// Renames every read of `from` (node inputs at any depth, graph outputs) to `to`.
void RenameReads(onnx::GraphProto& g, const std::string& from, const std::string& to) {
  for (auto& o : *g.mutable_output()) {
    if (o.name() == from) o.set_name(to);
  }
  for (auto& n : *g.mutable_node()) {
    for (auto& i : *n.mutable_input()) {
      if (i == from) i = to;
    }
    for (auto& a : *n.mutable_attribute()) {
      if (a.has_g()) RenameReads(*a.mutable_g(), from, to);
      for (auto& sub : *a.mutable_graphs()) RenameReads(sub, from, to);
    }
  }
}

std::vector<FuzzGraph> Candidates(const FuzzGraph& fg, const TensorMap& values,
                                  const InferredGraph& inf) {
  std::vector<FuzzGraph> out;
  const onnx::GraphProto& g = fg.model.graph();
  const std::set<std::string> graph_outs = GraphOutputs(g);
  // Drop one graph output.
  if (g.output_size() > 1) {
    for (int k = 0; k < g.output_size(); ++k) {
      FuzzGraph c = fg;
      c.model.mutable_graph()->mutable_output()->DeleteSubrange(k, 1);
      out.push_back(std::move(c));
    }
  }
  std::set<std::string> defined_outside;  // graph inputs and initializers
  for (const auto& v : g.input()) defined_outside.insert(v.name());
  for (const auto& t : g.initializer()) defined_outside.insert(t.name());
  for (int j = 0; j < g.node_size(); ++j) {
    const auto& n = g.node(j);
    bool feeds_output = false;
    for (const auto& o : n.output()) feeds_output = feeds_output || graph_outs.count(o);
    // Cut: the node's outputs become graph inputs holding eager's values.
    bool cuttable = !feeds_output;
    for (const auto& o : n.output()) cuttable = cuttable && (o.empty() || values.count(o));
    if (cuttable) {
      FuzzGraph c = fg;
      onnx::GraphProto& cg = *c.model.mutable_graph();
      for (const auto& o : n.output()) {
        if (o.empty()) continue;
        const Tensor& t = values.at(o);
        auto* vi = cg.add_input();
        vi->set_name(o);
        auto* tt = vi->mutable_type()->mutable_tensor_type();
        tt->set_elem_type(OnnxElem(t.dtype()));
        for (int64_t d : t.shape()) tt->mutable_shape()->add_dim()->set_dim_value(d);
        c.inputs[o] = t;
      }
      cg.mutable_node()->DeleteSubrange(j, 1);
      out.push_back(std::move(c));
    }
    // Bypass: the node's only output is read as one of its inputs of the same type.
    int outputs = 0;
    for (const auto& o : n.output()) outputs += !o.empty();
    if (outputs != 1 || n.output(0).empty() || !inf.types.count(n.output(0))) continue;
    const TensorType& ot = inf.types.at(n.output(0));
    for (const auto& in : n.input()) {
      if (in.empty() || !inf.types.count(in) || !(inf.types.at(in) == ot)) continue;
      if (graph_outs.count(n.output(0)) && defined_outside.count(in)) continue;
      FuzzGraph c = fg;
      onnx::GraphProto& cg = *c.model.mutable_graph();
      const std::string from = n.output(0);
      cg.mutable_node()->DeleteSubrange(j, 1);
      RenameReads(cg, from, in);
      out.push_back(std::move(c));
      break;
    }
  }
  // Non-finite inputs made finite.
  bool non_finite = false;
  FuzzGraph finite = fg;
  for (auto& [name, t] : finite.inputs) {
    if (t.dtype() != DType::kFloat32) continue;
    Tensor c = *t.Clone();
    for (int64_t i = 0; i < c.numel(); ++i) {
      if (!std::isfinite(c.data<float>()[i])) {
        c.data<float>()[i] = 0.25f;
        non_finite = true;
      }
    }
    t = c;
  }
  if (non_finite) out.push_back(std::move(finite));
  for (FuzzGraph& c : out) Prune(c);
  return out;
}

}  // namespace

FuzzGraph Shrink(const FuzzGraph& failing, const DiffOptions& options, double budget_s,
                 int* rounds) {
  const auto start = std::chrono::steady_clock::now();
  FuzzGraph current = failing;
  Prune(current);
  int done = 0;
  auto size = [](const FuzzGraph& g) {
    return std::make_pair(CountNodes(g.model.graph()), static_cast<int>(g.inputs.size()));
  };
  while (Ms(start) < budget_s * 1000) {
    auto values = EagerValues(current);
    auto graph = Import(current.model, current.name);
    if (!values.ok() || !graph.ok()) break;
    auto inf = InferShapes(**graph, ClassOf(current.inputs));
    if (!inf.ok()) break;
    std::vector<FuzzGraph> cands = Candidates(current, *values, *inf);
    std::sort(cands.begin(), cands.end(),
              [&](const FuzzGraph& a, const FuzzGraph& b) { return size(a) < size(b); });
    // Chunks, smallest graphs first: the first chunk holding a failing candidate decides the
    // round. A round where no candidate fails leaves a graph no single deletion keeps failing.
    bool progressed = false;
    constexpr size_t kChunk = 24;
    for (size_t at = 0; at < cands.size() && !progressed; at += kChunk) {
      if (Ms(start) >= budget_s * 1000) break;
      std::vector<FuzzGraph> chunk(
          cands.begin() + static_cast<long>(at),
          cands.begin() + static_cast<long>(std::min(at + kChunk, cands.size())));
      std::vector<CaseResult> r = RunBatch(chunk, options, nullptr);
      for (size_t i = 0; i < chunk.size(); ++i) {
        if (!IsDifference(r[i].outcome) || size(chunk[i]) >= size(current)) continue;
        current = std::move(chunk[i]);
        progressed = true;
        break;
      }
    }
    ++done;
    if (!progressed) break;
  }
  if (rounds) *rounds = done;
  return current;
}

Status SaveCase(const FuzzGraph& g, const std::string& dir, const std::string& note) {
  std::error_code ec;
  std::filesystem::remove_all(dir + "/inputs", ec);  // a reproducer saved here before
  KILN_RETURN_IF_ERROR(MakeDirs(dir + "/inputs"));
  KILN_RETURN_IF_ERROR(WriteFileAtomic(dir + "/model.onnx", g.model.SerializeAsString()));
  std::ostringstream env, samples;
  for (const auto& [name, t] : g.inputs) {
    KILN_RETURN_IF_ERROR(WriteNpy(dir + "/inputs/" + name + ".npy", t));
    env << (env.tellp() > 0 ? ", " : "") << name << " = " << ShapeToString(t.shape());
    samples << (samples.tellp() > 0 ? ", " : "") << name << " = \"inputs/" << name << ".npy\"";
  }
  const std::string envs = env.str();
  std::ostringstream toml;
  toml << "[endpoint]\nname = \"graph-fuzz\"\n\n[targets.repro]\ngraph = \"model.onnx\"\n"
       << "export = { family = \"graph-fuzz/repro\" }\nenvelope = [{ " << envs << " }]\n"
       << "samples = [{ " << samples.str() << " }]\n";
  KILN_RETURN_IF_ERROR(WriteFileAtomic(dir + "/kiln.toml", toml.str()));
  std::ostringstream readme;
  readme << "graph " << g.name << " (" << CountNodes(g.model.graph()) << " nodes, opset "
         << (g.model.opset_import_size() ? g.model.opset_import(0).version() : 0) << ")\n"
         << note << "\n\nReplay: build/fuzz/graph_fuzz --replay " << dir << "\n";
  // A manifest's envelope names at least one input, so a graph of weights alone only replays.
  if (!g.inputs.empty()) {
    readme << "Mint it (the sample is these inputs): build/kiln mint --manifest " << dir
           << "/kiln.toml [--disable-pass NAME]\n";
  }
  return WriteFileAtomic(dir + "/README.txt", readme.str());
}

Result<FuzzGraph> LoadCase(const std::string& dir) {
  FuzzGraph g;
  g.name = std::filesystem::path(dir).filename().string();
  KILN_ASSIGN_OR_RETURN(std::string bytes, ReadFile(dir + "/model.onnx"));
  if (!g.model.ParseFromString(bytes)) {
    return Status::InvalidArgument(dir + "/model.onnx: not an ONNX model");
  }
  std::error_code ec;
  // git keeps no empty directory: a reproducer shrunk to a graph without inputs has none.
  if (!std::filesystem::exists(dir + "/inputs", ec)) return g;
  for (const auto& e : std::filesystem::directory_iterator(dir + "/inputs", ec)) {
    if (e.path().extension() != ".npy") continue;
    KILN_ASSIGN_OR_RETURN(Tensor t, ReadNpy(e.path().string()));
    g.inputs[e.path().stem().string()] = std::move(t);
  }
  if (ec) return Status::IOError(dir + "/inputs: " + ec.message());
  return g;
}

}  // namespace kiln::graph_fuzz
