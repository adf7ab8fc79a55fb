// `kiln key`, `kiln mint` and `kiln inspect`: the cell-facing subcommands (cli layer).
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <sstream>
#include <thread>

#include "src/kiln/base/file.h"
#include "src/kiln/cell/pack.h"
#include "src/kiln/cli/commands.h"
#include "src/kiln/cli/target_util.h"
#include "src/kiln/graph/onnx_import.h"
#include "src/kiln/worker/mint_child.h"

namespace kiln::cli {

Result<MintRequest> RequestForTarget(const Manifest& manifest, const std::string& name) {
  const TargetSpec* t = nullptr;
  if (name.empty()) {
    if (manifest.targets.size() != 1) {
      std::string names;
      for (const auto& x : manifest.targets) names += (names.empty() ? "" : ", ") + x.name;
      return Status::InvalidArgument("manifest '" + manifest.source + "' has " +
                                     std::to_string(manifest.targets.size()) +
                                     " targets; pick one with --target (" + names + ")");
    }
    t = &manifest.targets[0];
  } else {
    KILN_ASSIGN_OR_RETURN(t, manifest.FindTarget(name));
  }
  MintRequest r;
  KILN_ASSIGN_OR_RETURN(Graph g, ImportOnnxFile(t->graph));
  r.graph = std::make_shared<const Graph>(std::move(g));
  if (!t->checkpoint.empty()) {
    KILN_ASSIGN_OR_RETURN(r.weights, LoadCheckpoint(*r.graph, t->checkpoint));
  } else {
    r.weights = GraphWeights(*r.graph);
  }
  r.envelope = t->envelope;
  KILN_ASSIGN_OR_RETURN(r.samples, ReadSamples(t->samples));
  r.family = t->export_spec ? t->export_spec->family : "intake/" + t->name;
  r.thresholds = {t->numerics.floor, t->numerics.warn, t->numerics.retention};
  r.sm = t->sm;
  r.compile.parallel_compiles = manifest.mint.parallel_compiles;
  return r;
}

Result<ShapeClass> ParseClassSpec(const std::string& spec) {
  ShapeClass c;
  size_t pos = 0;
  while (pos < spec.size()) {
    size_t end = spec.find(';', pos);
    if (end == std::string::npos) end = spec.size();
    const std::string item = spec.substr(pos, end - pos);
    const size_t eq = item.find('=');
    if (eq == std::string::npos || item.size() < eq + 3 || item[eq + 1] != '[' ||
        item.back() != ']') {
      return Status::InvalidArgument("class spec item '" + item + "' must be NAME=[d0,d1,...]");
    }
    Shape s;
    const std::string dims = item.substr(eq + 2, item.size() - eq - 3);
    size_t p = 0;
    while (p < dims.size()) {
      size_t q = dims.find(',', p);
      if (q == std::string::npos) q = dims.size();
      char* e = nullptr;
      const std::string d = dims.substr(p, q - p);
      const long long v = std::strtoll(d.c_str(), &e, 10);
      if (d.empty() || *e != '\0' || v < 0) {
        return Status::InvalidArgument("class spec '" + item + "': dim '" + d +
                                       "' is not a non-negative integer");
      }
      s.push_back(v);
      p = q + 1;
    }
    c[item.substr(0, eq)] = s;
    pos = end + 1;
  }
  if (c.empty()) return Status::InvalidArgument("empty class spec");
  return c;
}

std::string ClassSpec(const ShapeClass& c) {
  std::string s;
  for (const auto& [name, shape] : c)
    s += (s.empty() ? "" : ";") + name + "=" + ShapeToString(shape);
  return s;
}

Result<LocalCell> LocalCellForClass(std::shared_ptr<const Graph> graph, const WeightMap& weights,
                                    const ShapeClass& shape_class, const std::string& family,
                                    int num_threads, const Samples& samples) {
  MintRequest r;
  r.graph = std::move(graph);
  r.weights = weights;
  r.samples = samples;
  r.envelope.classes = {shape_class};
  r.family = family;
  r.num_threads = num_threads;
  KILN_ASSIGN_OR_RETURN(std::string root, DefaultStoreRoot());
  LocalStore store(root);
  KILN_ASSIGN_OR_RETURN(std::string private_dir, ProcessPrivateDir());
  return CompileThroughStore(r, store, private_dir);
}

namespace {

struct Args {
  std::string manifest;
  std::string target;
  std::string cell;
  bool source = false;
  std::string dump_ir;
  std::vector<std::string> disabled_passes;
  std::string child;         // `kiln mint --child REQUEST.json`
  int parent_alive_fd = -1;  // `--parent-alive-fd N` (worker/mint_child.h)
};

// ---- `kiln mint --child REQUEST.json` (worker/mint_child.h is the protocol) ----
//
// Test-only switches, honoured only by a child and only when set in its environment (the worker
// passes its own environment on; nothing in kiln sets them). Each name starts with KILN_TEST_ so
// none can be set by accident, and tests/worker/mint_e2e_test.cc documents them:
//   KILN_TEST_MINT_STALL_S=N        sleep N s when the compile stage starts: no CPU, no writes
//   KILN_TEST_MINT_BUSY_S=N         spin the CPU for N s there, writing nothing: slow but alive
//   KILN_TEST_MINT_PERTURB=gray     scale every output by 1.002 and prove with retention 0.99:
//                                   a child whose own gate is too lax, for the parent's to refuse
//   KILN_TEST_MINT_RESOURCE_ONCE=1  exit 3 (resource) on attempt 1
int TestSeconds(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::atoi(v) : 0;
}

void TestStallOrSpin() {
  if (int s = TestSeconds("KILN_TEST_MINT_STALL_S"); s > 0) ::sleep(static_cast<unsigned>(s));
  if (int s = TestSeconds("KILN_TEST_MINT_BUSY_S"); s > 0) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(s);
    volatile uint64_t x = 0;
    while (std::chrono::steady_clock::now() < until) {
      for (int i = 0; i < 100000; ++i) x = x * 6364136223846793005ull + 1;
    }
  }
}

int64_t PeakRssKb() {
  rusage self{}, kids{};
  ::getrusage(RUSAGE_SELF, &self);
  ::getrusage(RUSAGE_CHILDREN, &kids);
  return std::max<int64_t>(self.ru_maxrss, kids.ru_maxrss);
}

// The exit code for a refused mint: deterministic refusals 2, exhaustion 3.
int ExitFor(const Status& s, std::string* token) {
  if (s.code() == StatusCode::kResourceExhausted || s.code() == StatusCode::kIOError) {
    *token = "resource_exhausted";
    return kMintExitResource;
  }
  for (const char* t : {kRefusalNumerics, kRefusalFence, kRefusalUnmeasurable}) {
    if (s.Is(t)) {
      *token = t;
      return kMintExitRefused;
    }
  }
  *token = "compile_refused";
  return kMintExitRefused;
}

// Blocks on the parent's lifeline; end of file (or an error) means the parent is gone, and the
// whole process group goes with it: this child and the compilers it started.
void WatchParent(int fd) {
  std::thread([fd] {
    char c;
    while (true) {
      const ssize_t n = ::read(fd, &c, 1);
      if (n > 0 || (n < 0 && errno == EINTR)) continue;
      ::kill(0, SIGKILL);
      ::_exit(kMintExitBadRequest);
    }
  }).detach();
}

int RunMintChild(const std::string& request_path, int parent_alive_fd) {
  // Frames count the mint's stages, then one last frame for the report.
  const int kStageCount = static_cast<int>(MintStages().size());
  const int kReportStep = kStageCount + 1;
  if (parent_alive_fd >= 0) WatchParent(parent_alive_fd);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  auto text = ReadFile(request_path);
  if (!text.ok()) {
    ReportError("mint --child", text.status());
    return kMintExitBadRequest;
  }
  auto req = ParseMintChildRequest(*text, request_path);
  if (!req.ok()) {
    ReportError("mint --child", req.status());
    return kMintExitBadRequest;
  }
  MintChildReport report;
  report.lane = req->intake ? "intake" : "exported";
  const auto started = std::chrono::steady_clock::now();
  auto finish = [&](int code, const std::string& status, const std::string& token,
                    const std::string& message) {
    report.status = status;
    report.token = token;
    report.message = message;
    report.peak_rss_kb = PeakRssKb();
    Status w = WriteFileAtomic(req->report, ToJson(report).dump(2));
    if (!w.ok()) {
      ReportError("mint --child", w);
      return kMintExitBadRequest;
    }
    std::printf("%s\n", MintFrameLine("report", kReportStep, kReportStep,
                                      status + (token.empty() ? "" : " " + token))
                            .c_str());
    return code;
  };
  if (req->attempt == 1 && TestSeconds("KILN_TEST_MINT_RESOURCE_ONCE") == 1) {
    return finish(kMintExitResource, "resource", "resource_exhausted",
                  "KILN_TEST_MINT_RESOURCE_ONCE: resource exit on attempt 1");
  }
  auto manifest = LoadManifest(req->manifest);
  if (!manifest.ok())
    return finish(kMintExitBadRequest, "bad_request", "bad_request", manifest.status().ToString());
  auto spec = manifest->FindTarget(req->target);
  if (!spec.ok()) {
    return finish(kMintExitBadRequest, "bad_request", "bad_request", spec.status().ToString());
  }
  if ((*spec)->exported() == req->intake) {
    return finish(kMintExitBadRequest, "bad_request", "bad_request",
                  "target '" + req->target + "' is " +
                      ((*spec)->exported() ? "exported" : "intake") + " but the request says " +
                      (req->intake ? "intake" : "exported"));
  }
  auto r = RequestForTarget(*manifest, req->target);
  if (!r.ok())
    return finish(kMintExitBadRequest, "bad_request", "bad_request", r.status().ToString());
  r->intake = req->intake;
  r->num_threads = req->threads;
  r->compile.parallel_compiles = req->parallel_compiles;
  r->work_dir = req->out_dir + "/work";
  const char* perturb = std::getenv("KILN_TEST_MINT_PERTURB");
  if (perturb != nullptr && std::string(perturb) == "gray") {
    r->compile.emit.test_output_scale = 1.002;
    r->thresholds.retention = 0.99;
  }
  report.family = r->family;
  // Progress: one frame per stage, and the live phases file rewritten as each stage ends.
  int step = 0;
  std::string current;
  auto stage_start = std::chrono::steady_clock::now();
  r->on_stage = [&](const std::string& stage) {
    const auto now = std::chrono::steady_clock::now();
    if (!current.empty()) {
      report.phases.push_back(
          {current, std::chrono::duration<double, std::milli>(now - stage_start).count()});
      nlohmann::json live = ToJson(report);
      live["status"] = "running";
      (void)WriteFileAtomic(req->phases, live.dump(2));
    }
    current = stage;
    stage_start = now;
    ++step;
    std::printf("%s\n", MintFrameLine(stage, step, kStageCount, req->target).c_str());
    if (stage == "compile") TestStallOrSpin();
  };
  auto minted = MintCell(*r);
  if (!current.empty()) {
    report.phases.push_back({current, std::chrono::duration<double, std::milli>(
                                          std::chrono::steady_clock::now() - stage_start)
                                          .count()});
  }
  if (!minted.ok()) {
    std::string token;
    const int code = ExitFor(minted.status(), &token);
    return finish(code, code == kMintExitResource ? "resource" : "refused", token,
                  minted.status().ToString());
  }
  report.key = minted->key;
  report.axes = minted->axes;
  report.gate = minted->gate.Summary();
  const std::string& bytes = req->intake ? minted->shared_object : minted->tar;
  report.artifact = req->out_dir + (req->intake ? "/cell.so" : "/cell.tar");
  report.digest = CellDigest(bytes);
  if (Status w = WriteFileAtomic(report.artifact, bytes); !w.ok()) {
    report.artifact.clear();
    return finish(kMintExitResource, "resource", "resource_exhausted", w.ToString());
  }
  report.phases.push_back({"total", std::chrono::duration<double, std::milli>(
                                        std::chrono::steady_clock::now() - started)
                                        .count()});
  return finish(kMintExitMinted, "minted", "", "");
}

Status DoKey(const Args& a) {
  const auto start = std::chrono::steady_clock::now();
  KILN_ASSIGN_OR_RETURN(Manifest m, LoadManifest(a.manifest));
  KILN_ASSIGN_OR_RETURN(MintRequest r, RequestForTarget(m, a.target));
  KILN_ASSIGN_OR_RETURN(KeyAxes axes, DeriveKeyAxes(*r.graph, r.envelope, r.sm));
  KILN_ASSIGN_OR_RETURN(std::string key, KeyFromAxes(axes));
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  std::printf(
      "%s\n  graph      %s\n  envelope   %s  (%zu class%s)\n  sm         %s\n"
      "  toolchain  %s\n  derived in %.1f ms, nothing compiled\n",
      key.c_str(), axes.graph.c_str(), axes.envelope.c_str(), r.envelope.classes.size(),
      r.envelope.classes.size() == 1 ? "" : "es", axes.sm.c_str(), axes.toolchain.c_str(), ms);
  return Status::OK();
}

Status DoMint(const Args& a) {
  if (a.manifest.empty()) return Status::InvalidArgument("kiln mint needs --manifest (or --child)");
  KILN_ASSIGN_OR_RETURN(Manifest m, LoadManifest(a.manifest));
  KILN_ASSIGN_OR_RETURN(MintRequest r, RequestForTarget(m, a.target));
  std::ostringstream dump;
  if (!a.dump_ir.empty()) r.compile.dump = &dump;
  r.compile.disabled_passes = a.disabled_passes;
  const bool tty = ::isatty(1);
  int step = 0;
  r.on_stage = [&](const std::string& stage) {
    ++step;
    if (tty) {
      std::printf("\r  minting [%d/%d] %-8s", step, static_cast<int>(MintStages().size()),
                  stage.c_str());
      std::fflush(stdout);
    }
  };
  KILN_ASSIGN_OR_RETURN(std::string root, DefaultStoreRoot());
  LocalStore store(root);
  auto result = MintAndStore(r, store);
  if (tty) std::printf("\r%40s\r", "");
  if (!a.dump_ir.empty()) KILN_RETURN_IF_ERROR(WriteFileAtomic(a.dump_ir, dump.str()));
  if (!result.ok()) return result.status();
  std::printf("%s\n", result->ref.c_str());
  std::printf("  gate   %s\n  fence  %s\n", result->gate.Summary().c_str(),
              result->fence.Summary().c_str());
  std::printf("  stored %s/%s\n  stage      ms\n", root.c_str(), result->key.c_str());
  double total = 0;
  for (const StageTime& s : result->stages) {
    std::printf("  %-8s %8.1f\n", s.stage.c_str(), s.ms);
    total += s.ms;
  }
  std::printf("  %-8s %8.1f  (%zu class%s, %.1f ms per class)\n", "total", total,
              r.envelope.classes.size(), r.envelope.classes.size() == 1 ? "" : "es",
              total / static_cast<double>(r.envelope.classes.size()));
  return Status::OK();
}

Status DoInspect(const Args& a) {
  std::string bytes;
  auto file = ReadFile(a.cell);
  if (file.ok()) {
    bytes = std::move(file).value();
  } else if (IsWellFormedKey(a.cell)) {
    KILN_ASSIGN_OR_RETURN(std::string root, DefaultStoreRoot());
    LocalStore store(root);
    KILN_ASSIGN_OR_RETURN(auto hit, store.Get(a.cell));
    if (!hit) return Status::NotFound("no cell for key " + a.cell + " in " + root);
    bytes = std::move(hit->bytes);
  } else {
    return file.status();
  }
  KILN_ASSIGN_OR_RETURN(CellFiles files, UnpackCell(bytes, a.cell));
  KILN_ASSIGN_OR_RETURN(CellMetadata md, ParseMetadata(files.metadata_json, a.cell));
  std::printf("cell     %s\nfamily   %s\ncodegen  %s\n", CellRef(md.key, CellDigest(bytes)).c_str(),
              md.family.c_str(), md.codegen_version.c_str());
  std::printf("axes     graph=%s envelope=%s sm=%s toolchain=%s\n", md.axes.graph.c_str(),
              md.axes.envelope.c_str(), md.axes.sm.c_str(), md.axes.toolchain.c_str());
  std::printf("compiler %s\n", md.toolchain.value("compiler", "?").c_str());
  std::printf(
      "fence    checkpoint_free=%d perturbed_checkpoint_matched=%d "
      "constant_table_complete=%d\n",
      md.fence.checkpoint_free, md.fence.perturbed_checkpoint_matched,
      md.fence.constant_table_complete);
  std::printf("sizes    cell.so %zu bytes, source %zu bytes, metadata %zu bytes\n",
              files.shared_object.size(), files.source.size(), files.metadata_json.size());
  for (const EntryMetadata& e : md.entries) {
    std::printf("entry %u  class %s  workspace %llu bytes\n", e.index,
                ClassSpec(e.shape_class).c_str(), (unsigned long long)e.workspace_bytes);
    for (const TensorSpec& s : e.outputs) {
      std::printf("  output   %-24s %s%s\n", s.name.c_str(), DTypeName(s.dtype),
                  s.dynamic ? "[shape known at run time]" : ShapeToString(s.shape).c_str());
    }
    std::printf("  constants (%zu, bound at init in this order):\n", e.constants.size());
    for (const TensorSpec& s : e.constants) {
      std::printf("    %-32s %s%s\n", s.name.c_str(), DTypeName(s.dtype),
                  ShapeToString(s.shape).c_str());
    }
  }
  if (a.source) std::printf("\n%s", files.source.c_str());
  return Status::OK();
}

}  // namespace

void AddCellCommands(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<Args>();
  auto* key = app.add_subcommand("key", "Derive a target's cell key and its axes, no compile");
  key->add_option("--manifest", args->manifest, "kiln.toml")->required();
  key->add_option("--target", args->target, "target name (default: the only one)");
  key->callback([=] {
    Status s = DoKey(*args);
    *exit_code = s.ok() ? 0 : ReportError("key", s);
  });
  auto* mint = app.add_subcommand(
      "mint", "Compile every class of a target, prove it, seal it and store it locally");
  mint->add_option("--manifest", args->manifest, "kiln.toml");
  mint->add_option("--target", args->target, "target name (default: the only one)");
  mint->add_option("--child", args->child,
                   "run as a worker's mint child: REQUEST.json in, MINT_FRAME lines out, a report "
                   "file; exit 0 minted, 2 refused, 3 resource, 4 bad request");
  mint->add_option(kMintParentAliveFlag, args->parent_alive_fd,
                   "with --child: a descriptor whose end of file means the parent died (the child "
                   "then kills its process group)");
  mint->add_option("--dump-ir", args->dump_ir, "write the IR after every pass to this file");
  mint->add_option("--disable-pass", args->disabled_passes,
                   "skip a compiler pass by name, for bisecting (repeatable)");
  mint->callback([=] {
    if (!args->child.empty()) {
      *exit_code = RunMintChild(args->child, args->parent_alive_fd);
      return;
    }
    Status s = DoMint(*args);
    *exit_code = s.ok() ? 0 : ReportError("mint", s);
  });
  auto* inspect = app.add_subcommand("inspect", "Describe a cell: axes, entries, constants");
  inspect->add_option("cell", args->cell, "cell.tar path, or a key in the local store")->required();
  inspect->add_flag("--source", args->source, "also print the generated C++ source");
  inspect->callback([=] {
    Status s = DoInspect(*args);
    *exit_code = s.ok() ? 0 : ReportError("inspect", s);
  });
}

}  // namespace kiln::cli
