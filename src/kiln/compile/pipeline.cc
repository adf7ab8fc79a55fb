// The compiler's table of contents (compile layer).
//
//   graph passes, per shape class:   specialize -> fold-structural -> decompose-batch-norm ->
//                                    dead-code
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

#include "src/kiln/base/clock.h"
#include "src/kiln/base/file.h"
#include "src/kiln/base/log.h"
#include "src/kiln/base/secret_scan.h"
#include "src/kiln/compile/passes.h"
#include "src/kiln/compile/ranged_emit.h"
#include "src/kiln/compile/ranged_shapes.h"
#include "src/kiln/ops/verifier.h"

namespace kiln {

namespace {

// The pipeline of one entry, written once: every pass in order, what it works on, and whether an
// operator may disable it by name. PassNames(), the name check of --disable-pass and the runner
// all read this table.
struct PassDef {
  enum class On { kGraph, kLower, kProgram };
  const char* name;
  On on;
  Status (*graph)(Graph&, const ShapeClass&, const CompileOptions&) = nullptr;  // On::kGraph
  Status (*program)(Program&) = nullptr;                                        // On::kProgram
  bool optional = true;  // false: runs even when named in --disable-pass
};

Status Specialize(Graph& g, const ShapeClass& c, const CompileOptions&) {
  return SpecializeToClass(g, c);
}
Status FoldStructural(Graph& g, const ShapeClass&, const CompileOptions& o) {
  return FoldStructuralConstants(g, o.symbolic_values);
}
Status BatchNorm(Graph& g, const ShapeClass&, const CompileOptions&) {
  return DecomposeBatchNorm(g);
}
Status DeadCode(Graph& g, const ShapeClass&, const CompileOptions&) {
  return EliminateDeadNodes(g);
}

using On = PassDef::On;
const std::vector<PassDef>& EntryPasses() {
  static const std::vector<PassDef> kPasses = {
      {"specialize", On::kGraph, Specialize, nullptr, false},
      {"fold-structural", On::kGraph, FoldStructural},
      {"decompose-batch-norm", On::kGraph, BatchNorm},
      {"dead-code", On::kGraph, DeadCode},
      {"lower", On::kLower, nullptr, nullptr, false},
      {"fuse-conv-epilogue", On::kProgram, nullptr, FuseConvEpilogues},
      {"fuse-elementwise", On::kProgram, nullptr, FuseElementwise},
      {"fuse-group-norm", On::kProgram, nullptr, FuseGroupNorm},
      {"fuse-library-epilogue", On::kProgram, nullptr, FuseLibraryEpilogues},
      {"fold-gemm-bias", On::kProgram, nullptr, FoldGemmBias},
      {"fold-gemm-gelu", On::kProgram, nullptr, FoldGemmGelu},
      {"fuse-attention", On::kProgram, nullptr, FuseAttention},
      {"choose-conv-layout", On::kProgram, nullptr, ChooseConvLayout},
      {"plan-layout", On::kProgram, nullptr, PlanLayout},
      {"plan-memory", On::kProgram, nullptr, PlanMemory, false},
  };
  return kPasses;
}

// The cell-level pass after every entry's pipeline.
constexpr const char* kEmitPass = "emit-cpp";

std::string GraphText(const Graph& g) {
  std::ostringstream os;
  for (const ValueInfo& in : g.inputs) {
    os << "  input " << in.name << ": " << DTypeName(in.dtype) << in.ShapeString() << "\n";
  }
  for (const Node& n : g.nodes) {
    os << "  ";
    for (size_t i = 0; i < n.outputs.size(); ++i) os << (i ? ", " : "") << n.outputs[i];
    os << " = " << n.op_type << "(";
    for (size_t i = 0; i < n.inputs.size(); ++i) os << (i ? ", " : "") << n.inputs[i];
    os << ")\n";
  }
  return os.str();
}

// KILN_TEST_CELL_SEGV (pipeline.h): a float; any other value is ignored and the log says so.
void ApplyTestSegvSwitch(EmitOptions* emit) {
  const char* env = std::getenv(kTestCellSegvEnv);
  if (env == nullptr || *env == '\0') return;
  char* end = nullptr;
  const float v = std::strtof(env, &end);
  static std::once_flag said;
  if (end == env || *end != '\0') {
    std::call_once(said, [env] {
      LogWarn(std::string("TEST SWITCH ") + kTestCellSegvEnv + "='" + env +
              "' is not a float; ignored");
    });
    return;
  }
  emit->test_segv = true;
  emit->test_segv_value = v;
  std::call_once(said, [env] {
    LogWarn(std::string("TEST SWITCH ") + kTestCellSegvEnv + "=" + env +
            " is set: generated cells segfault when their first input starts with it");
  });
}

// KILN_TEST_SECRET_SCAN (base/secret_scan.h): set (to anything) while a cell is generated, the
// cell searches its own process at its first call (EmitOptions::test_scan).
void ApplyTestScanSwitch(EmitOptions* emit) {
  const char* env = std::getenv(kTestSecretScanEnv);
  if (env == nullptr || *env == '\0') return;
  emit->test_scan = true;
  static std::once_flag said;
  std::call_once(said, [] {
    LogWarn(std::string("TEST SWITCH ") + kTestSecretScanEnv +
            " is set: generated cells search their own process at their first call");
  });
}

// KILN_TEST_UNCOMPILABLE_CLASS (pipeline.h): the refusal of the class it names, or OK.
Status TestUncompilableClass(const ShapeClass& shape_class) {
  const char* env = std::getenv(kTestUncompilableClassEnv);
  if (env == nullptr || *env == '\0') return Status::OK();
  static std::once_flag said;
  std::call_once(said, [env] {
    LogWarn(std::string("TEST SWITCH ") + kTestUncompilableClassEnv + "=" + env +
            " is set: the compiler refuses that shape class");
  });
  if (DescribeClasses({shape_class}) != env) return Status::OK();
  return Status::Unimplemented("shape class " + std::string(env) +
                               " is refused by the test switch " + kTestUncompilableClassEnv);
}

// A ranged entry under the same switch (DescribeRanged's words), then its pieces.
Result<std::vector<RangedEntryCode>> CompileRanged(const Graph& graph, const RangedEntry& entry,
                                                   const CompileOptions& options, int first_index) {
  const char* env = std::getenv(kTestUncompilableClassEnv);
  if (env != nullptr && DescribeRanged(entry) == env) {
    return Status::Unimplemented("ranged entry " + std::string(env) +
                                 " is refused by the test switch " + kTestUncompilableClassEnv);
  }
  return CompileRangedPieces(graph, entry, options, first_index);
}

}  // namespace

const std::vector<std::string>& PassNames() {
  static const std::vector<std::string> kNames = [] {
    std::vector<std::string> names;
    for (const PassDef& p : EntryPasses()) names.push_back(p.name);
    names.push_back(kEmitPass);
    return names;
  }();
  return kNames;
}

std::vector<std::string> DisabledPasses(const CompileOptions& options) {
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

Status CheckPassNames(const std::vector<std::string>& names) {
  for (const std::string& d : names) {
    if (std::find(PassNames().begin(), PassNames().end(), d) == PassNames().end()) {
      std::string known;
      for (const std::string& p : PassNames()) known += (known.empty() ? "" : ", ") + p;
      return Status::InvalidArgument("cannot disable unknown pass '" + d + "' (passes: " + known +
                                     ")");
    }
  }
  return Status::OK();
}

Result<Program> CompileEntry(const Graph& input, const ShapeClass& shape_class, int index,
                             const CompileOptions& options, std::vector<PassTiming>* timings) {
  const std::vector<std::string> disabled = DisabledPasses(options);
  KILN_RETURN_IF_ERROR(CheckPassNames(disabled));
  KILN_RETURN_IF_ERROR(TestUncompilableClass(shape_class));
  auto is_disabled = [&](const std::string& name) {
    return std::find(disabled.begin(), disabled.end(), name) != disabled.end();
  };
  const std::string entry = "entry" + std::to_string(index);
  Graph graph = input;
  Program program;
  bool lowered = false;
  // The IR the passes work on at this point, as text for --dump-ir.
  auto text = [&] { return lowered ? program.Dump() : GraphText(graph); };
  std::string before = options.dump ? text() : "";
  if (options.dump) *options.dump << "== " << entry << " input\n" << before;
  for (const PassDef& pass : EntryPasses()) {
    if (pass.optional && is_disabled(pass.name)) continue;
    const auto start = std::chrono::steady_clock::now();
    Status s;
    switch (pass.on) {
      case On::kGraph:
        s = pass.graph(graph, shape_class, options);
        break;
      case On::kLower: {
        auto p = LowerToProgram(graph);
        if (p.ok()) {
          program = std::move(p).value();
          program.entry_name = entry;
          lowered = true;
        }
        s = p.status();
        break;
      }
      case On::kProgram:
        s = pass.program(program);
        break;
    }
    if (!s.ok()) return s.WithContext(entry + " pass " + pass.name);
    // Every pass leaves IR that verifies: a pass that breaks an invariant is named here, not by
    // whatever later pass trips over it.
    Status v = lowered ? program.Verify() : VerifyGraph(graph);
    if (!v.ok()) return v.WithContext(entry + " after pass " + pass.name);
    if (timings) timings->push_back({entry, pass.name, MsSince(start)});
    if (options.dump) {
      const std::string after = text();
      *options.dump << "== " << entry << " after " << pass.name << "\n"
                    << (after == before ? "(unchanged)\n" : after);
      before = after;
    }
  }
  return program;
}

Status CompileRangedEntry(const Graph& graph, const RangedEntry& entry,
                          const CompileOptions& options) {
  return CompileRanged(graph, entry, options, 0).status();
}

std::string GapReason(const Status& failure, int index) {
  std::string message = failure.message();
  const std::string prefix = "entry" + std::to_string(index) + " ";
  if (message.rfind(prefix, 0) == 0) message.erase(0, prefix.size());
  return std::string(StatusCodeName(failure.code())) + ": " + message;
}

Result<EmittedCell> GenerateCell(const Graph& graph, const Envelope& envelope,
                                 const std::string& graph_digest, const CompileOptions& options,
                                 std::vector<PassTiming>* timings, std::vector<Program>* programs) {
  // A cell's signature is buffers of fixed-size elements; a sequence, an optional or a string
  // tensor at the graph's edge is served eager (inside the graph they run in the dynamic
  // region, on the host).
  for (const auto* list : {&graph.inputs, &graph.outputs}) {
    for (const ValueInfo& v : *list) {
      if (v.kind != ValueKind::kTensor || v.dtype == DType::kString) {
        return Status::Unimplemented(
            "graph " + std::string(list == &graph.inputs ? "input" : "output") + " '" + v.name +
            "' is a " + (v.kind != ValueKind::kTensor ? ValueKindName(v.kind) : "string tensor") +
            "; a cell takes and returns tensors of fixed-size elements");
      }
    }
  }
  // A class the compiler refuses is a gap, not the end of the cell: the classes that compile are
  // served compiled and the gap eager (partial coverage). Entries are numbered in compiled order,
  // so a cell's source depends only on the classes it carries.
  std::vector<Program> entries;
  std::vector<size_t> entry_classes;
  std::vector<std::pair<size_t, std::string>> gaps;
  Status first_failure;
  for (size_t i = 0; i < envelope.classes.size(); ++i) {
    const int index = static_cast<int>(entries.size());
    Result<Program> p = CompileEntry(graph, envelope.classes[i], index, options, timings);
    if (!p.ok()) {
      if (first_failure.ok()) first_failure = p.status();
      gaps.emplace_back(i, GapReason(p.status(), index));
      continue;
    }
    entries.push_back(std::move(p).value());
    entry_classes.push_back(i);
  }
  // A ranged entry is compiled as its pieces or not at all: one gap for the declared entry.
  std::vector<EmittedRangedEntry> ranged;
  std::vector<std::pair<size_t, RangedEntry>> ranged_pieces;
  for (size_t r = 0; r < envelope.ranged.size(); ++r) {
    const auto start = std::chrono::steady_clock::now();
    Result<std::vector<RangedEntryCode>> pieces = CompileRanged(
        graph, envelope.ranged[r], options, static_cast<int>(entries.size() + ranged.size()));
    if (timings) timings->push_back({"ranged" + std::to_string(r), "template", MsSince(start)});
    if (!pieces.ok()) {
      if (first_failure.ok()) first_failure = pieces.status();
      gaps.emplace_back(envelope.classes.size() + r, GapReason(pieces.status(), 0));
      continue;
    }
    for (RangedEntryCode& code : *pieces) {
      ranged_pieces.emplace_back(r, code.entry);
      ranged.push_back(std::move(code.cell));
    }
  }
  if (entries.empty() && ranged.empty()) {
    if (!first_failure.ok()) return first_failure;
    return Status::InvalidArgument("the envelope declares no shape class");
  }
  const auto start = std::chrono::steady_clock::now();
  EmitOptions emit = options.emit;
  emit.graph_digest = graph_digest;
  ApplyTestSegvSwitch(&emit);
  ApplyTestScanSwitch(&emit);
  KILN_ASSIGN_OR_RETURN(EmittedCell cell, EmitCell(entries, emit, ranged));
  cell.entry_classes = std::move(entry_classes);
  cell.gaps = std::move(gaps);
  cell.ranged_pieces = std::move(ranged_pieces);
  if (timings) timings->push_back({"cell", kEmitPass, MsSince(start)});
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
      jobs[j].ms = MsSince(start);
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
  if (timings) timings->push_back({"cell", "link", MsSince(start)});
  return ReadFile(so);
}

}  // namespace kiln
