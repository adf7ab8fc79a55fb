// The compiler's table of contents (compile layer).
//
//   graph passes, per shape class:   specialize -> fold-structural -> dead-code
//   lowering:                        lower                (Graph -> Program)
//   program passes:                  fuse-conv-epilogue -> fuse-elementwise -> fuse-group-norm ->
//                                    fuse-library-epilogue -> fold-gemm-bias -> fold-gemm-gelu ->
//                                    fuse-attention ->
//                                    choose-conv-layout -> plan-layout -> plan-memory
//   emission, all classes together:  emit-cpp             (Programs -> cell.cc)
//   build:                           compile-entry-<i> (parallel processes) -> link
//
// The runner names and times each pass, runs the IR verifier after it, skips passes disabled by
// name (CompileOptions or KILN_DISABLE_PASSES) for bisecting, and dumps the IR on request,
// printing "(unchanged)" when a pass did nothing. Lowering, memory planning and emission cannot
// be disabled: without them there is no cell.
#include "src/kiln/compile/pipeline.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <ostream>
#include <sstream>
#include <thread>

#include "src/kiln/base/file.h"
#include "src/kiln/compile/passes.h"
#include "src/kiln/eager/verifier.h"

namespace kiln {

namespace {

struct GraphPass {
  const char* name;
  std::function<Status(Graph&)> run;
};
struct ProgramPass {
  const char* name;
  Status (*run)(Program&);
};

const std::vector<ProgramPass>& ProgramPasses() {
  static const std::vector<ProgramPass> kPasses = {
      {"fuse-conv-epilogue", FuseConvEpilogues},
      {"fuse-elementwise", FuseElementwise},
      {"fuse-group-norm", FuseGroupNorm},
      {"fuse-library-epilogue", FuseLibraryEpilogues},
      {"fold-gemm-bias", FoldGemmBias},
      {"fold-gemm-gelu", FoldGemmGelu},
      {"fuse-attention", FuseAttention},
      {"choose-conv-layout", ChooseConvLayout},
      {"plan-layout", PlanLayout},
  };
  return kPasses;
}

std::vector<std::string> Disabled(const CompileOptions& options) {
  std::vector<std::string> out = options.disabled_passes;
  if (const char* env = std::getenv("KILN_DISABLE_PASSES")) {
    std::stringstream ss(env);
    std::string item;
    while (std::getline(ss, item, ',')) {
      if (!item.empty()) out.push_back(item);
    }
  }
  return out;
}

std::string GraphText(const Graph& g) {
  std::ostringstream os;
  for (const Node& n : g.nodes) {
    os << "  ";
    for (size_t i = 0; i < n.outputs.size(); ++i) os << (i ? ", " : "") << n.outputs[i];
    os << " = " << n.op_type << "(";
    for (size_t i = 0; i < n.inputs.size(); ++i) os << (i ? ", " : "") << n.inputs[i];
    os << ")\n";
  }
  return os.str();
}

double Ms(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

}  // namespace

const std::vector<std::string>& PassNames() {
  static const std::vector<std::string> kNames = {
      "specialize",         "fold-structural",  "dead-code",       "lower",
      "fuse-conv-epilogue", "fuse-elementwise", "fuse-group-norm", "fuse-library-epilogue",
      "fold-gemm-bias",     "fold-gemm-gelu",   "fuse-attention",  "choose-conv-layout",
      "plan-layout",        "plan-memory",      "emit-cpp"};
  return kNames;
}

Result<Program> CompileEntry(const Graph& input, const ShapeClass& shape_class, int index,
                             const CompileOptions& options, std::vector<PassTiming>* timings) {
  const std::vector<std::string> disabled = Disabled(options);
  for (const std::string& d : disabled) {
    if (std::find(PassNames().begin(), PassNames().end(), d) == PassNames().end()) {
      return Status::InvalidArgument("cannot disable unknown pass '" + d + "'");
    }
  }
  auto is_disabled = [&](const std::string& name) {
    return std::find(disabled.begin(), disabled.end(), name) != disabled.end();
  };
  const std::string entry = "entry" + std::to_string(index);
  Graph graph = input;
  const std::vector<GraphPass> graph_passes = {
      {"specialize", [&](Graph& g) { return SpecializeToClass(g, shape_class); }},
      {"fold-structural", FoldStructuralConstants},
      {"dead-code", EliminateDeadNodes},
  };
  std::string before = options.dump ? GraphText(graph) : "";
  for (const GraphPass& pass : graph_passes) {
    if (is_disabled(pass.name) && std::string(pass.name) != "specialize") continue;
    const auto start = std::chrono::steady_clock::now();
    Status s = pass.run(graph);
    if (!s.ok()) return s.WithContext(entry + " pass " + pass.name);
    Status v = VerifyGraph(graph);
    if (!v.ok()) return v.WithContext(entry + " after pass " + pass.name);
    if (timings) timings->push_back({entry, pass.name, Ms(start)});
    if (options.dump) {
      const std::string after = GraphText(graph);
      *options.dump << "== " << entry << " after " << pass.name << "\n"
                    << (after == before ? "(unchanged)\n" : after);
      before = after;
    }
  }
  auto start = std::chrono::steady_clock::now();
  auto lowered = LowerToProgram(graph);
  if (!lowered.ok()) return lowered.status().WithContext(entry + " pass lower");
  Program program = std::move(lowered).value();
  program.entry_name = entry;
  if (timings) timings->push_back({entry, "lower", Ms(start)});
  std::string pbefore = options.dump ? program.Dump() : "";
  if (options.dump) *options.dump << "== " << entry << " after lower\n" << pbefore;
  for (const ProgramPass& pass : ProgramPasses()) {
    if (is_disabled(pass.name)) continue;
    start = std::chrono::steady_clock::now();
    Status s = pass.run(program);
    if (!s.ok()) return s.WithContext(entry + " pass " + pass.name);
    Status v = program.Verify();
    if (!v.ok()) return v.WithContext(entry + " after pass " + pass.name);
    if (timings) timings->push_back({entry, pass.name, Ms(start)});
    if (options.dump) {
      const std::string after = program.Dump();
      *options.dump << "== " << entry << " after " << pass.name << "\n"
                    << (after == pbefore ? "(unchanged)\n" : after);
      pbefore = after;
    }
  }
  start = std::chrono::steady_clock::now();
  KILN_RETURN_IF_ERROR(PlanMemory(program).WithContext(entry + " pass plan-memory"));
  if (timings) timings->push_back({entry, "plan-memory", Ms(start)});
  if (options.dump) *options.dump << "== " << entry << " after plan-memory\n" << program.Dump();
  return program;
}

Result<EmittedCell> GenerateCell(const Graph& graph, const Envelope& envelope,
                                 const std::string& graph_digest, const CompileOptions& options,
                                 std::vector<PassTiming>* timings,
                                 std::vector<Program>* programs) {
  std::vector<Program> entries;
  for (size_t i = 0; i < envelope.classes.size(); ++i) {
    KILN_ASSIGN_OR_RETURN(Program p, CompileEntry(graph, envelope.classes[i], static_cast<int>(i),
                                                  options, timings));
    entries.push_back(std::move(p));
  }
  const auto start = std::chrono::steady_clock::now();
  EmitOptions emit = options.emit;
  emit.graph_digest = graph_digest;
  KILN_ASSIGN_OR_RETURN(EmittedCell cell, EmitCell(entries, emit));
  if (timings) timings->push_back({"cell", "emit-cpp", Ms(start)});
  if (programs) *programs = std::move(entries);
  return cell;
}

Result<std::string> BuildSharedObject(const std::string& source, size_t num_entries,
                                      const std::string& sm, const std::string& seed,
                                      CompilerDriver& driver, const std::string& work_dir,
                                      int parallel_compiles, std::vector<PassTiming>* timings) {
  const std::string src = work_dir + "/cell.cc";
  KILN_RETURN_IF_ERROR(WriteFileAtomic(src, source));
  // Jobs: entry objects, then the dispatch object (KILN_ENTRY=-1).
  struct Job {
    std::string name, object, define;
    Status status;
    double ms = 0;
  };
  std::vector<Job> jobs;
  for (size_t i = 0; i < num_entries; ++i) {
    jobs.push_back({"compile-entry-" + std::to_string(i),
                    work_dir + "/entry" + std::to_string(i) + ".o",
                    "KILN_ENTRY=" + std::to_string(i), Status::OK(), 0});
  }
  jobs.push_back({"compile-dispatch", work_dir + "/dispatch.o", "KILN_ENTRY=-1", Status::OK(), 0});
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t j = next++; j < jobs.size(); j = next++) {
      const auto start = std::chrono::steady_clock::now();
      jobs[j].status = driver.CompileObject(src, jobs[j].object, sm, {jobs[j].define},
                                            seed + "-" + jobs[j].name, work_dir);
      jobs[j].ms = Ms(start);
    }
  };
  const int n = std::max(1, std::min<int>(parallel_compiles, static_cast<int>(jobs.size())));
  std::vector<std::thread> threads;
  for (int t = 0; t < n; ++t) threads.emplace_back(worker);
  for (auto& t : threads) t.join();
  std::vector<std::string> objects;
  for (const Job& j : jobs) {
    if (!j.status.ok()) return j.status;
    if (timings) timings->push_back({"cell", j.name, j.ms});
    objects.push_back(j.object);
  }
  const auto start = std::chrono::steady_clock::now();
  const std::string so = work_dir + "/cell.so";
  KILN_RETURN_IF_ERROR(driver.LinkShared(objects, so, work_dir));
  if (timings) timings->push_back({"cell", "link", Ms(start)});
  return ReadFile(so);
}

}  // namespace kiln
