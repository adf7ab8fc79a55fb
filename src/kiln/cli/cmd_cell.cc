// `kiln key`, `kiln mint` and `kiln inspect`: the cell-facing subcommands (cli layer). `kiln mint
// --child` only parses its flags and runs the mint layer's child body (mint/child.h).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>

#include "src/kiln/base/clock.h"
#include "src/kiln/base/file.h"
#include "src/kiln/cell/pack.h"
#include "src/kiln/cli/commands.h"
#include "src/kiln/cli/target_util.h"
#include "src/kiln/graph/onnx_import.h"
#include "src/kiln/mint/child.h"
#include "src/kiln/mint/protocol.h"

namespace kiln::cli {

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

Result<nlohmann::json> ParseJsonOption(const std::string& text, const char* option) {
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return Status::InvalidArgument(std::string(option) + " takes a JSON object, got '" + text +
                                   "'");
  }
  return j;
}

Result<LocalCell> LocalCellForClass(std::shared_ptr<const Graph> graph, const WeightMap& weights,
                                    const ShapeClass& shape_class, const std::string& family,
                                    int num_threads, const Samples& samples,
                                    const std::vector<std::string>& disabled_passes) {
  return LocalCellForEnvelope(std::move(graph), weights, Envelope{{shape_class}}, family,
                              num_threads, samples, disabled_passes);
}

Result<LocalCell> LocalCellForEnvelope(std::shared_ptr<const Graph> graph, const WeightMap& weights,
                                       const Envelope& envelope, const std::string& family,
                                       int num_threads, const Samples& samples,
                                       const std::vector<std::string>& disabled_passes) {
  MintRequest r;
  r.compile.disabled_passes = disabled_passes;
  r.graph = std::move(graph);
  r.weights = weights;
  r.samples = samples;
  r.envelope = envelope;
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
  int parent_alive_fd = -1;  // `--parent-alive-fd N` (mint/protocol.h)
};

Status DoKey(const Args& a) {
  const auto start = std::chrono::steady_clock::now();
  KILN_ASSIGN_OR_RETURN(Manifest m, LoadManifest(a.manifest));
  KILN_ASSIGN_OR_RETURN(MintRequest r, RequestForTarget(m, a.target));
  KILN_ASSIGN_OR_RETURN(KeyAxes axes, DeriveKeyAxes(*r.graph, r.envelope, r.sm));
  KILN_ASSIGN_OR_RETURN(std::string key, KeyFromAxes(axes));
  const double ms = MsSince(start);
  const std::string ranged =
      r.envelope.ranged.empty() ? "" : ", " + std::to_string(r.envelope.ranged.size()) + " ranged";
  std::printf(
      "%s\n  graph      %s\n  envelope   %s  (%zu class%s%s)\n  sm         %s\n"
      "  toolchain  %s\n  derived in %.1f ms, nothing compiled\n",
      key.c_str(), axes.graph.c_str(), axes.envelope.c_str(), r.envelope.classes.size(),
      r.envelope.classes.size() == 1 ? "" : "es", ranged.c_str(), axes.sm.c_str(),
      axes.toolchain.c_str(), ms);
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
  if (result->stored) {
    std::printf("  stored %s/%s\n", root.c_str(), result->key.c_str());
  } else {
    std::string skipped;
    for (const std::string& p : DisabledPasses(r.compile)) skipped += " " + p;
    std::printf(
        "  not stored: compiled without%s (bisecting; the local store keeps only cells "
        "of the whole pipeline)\n",
        skipped.c_str());
  }
  std::printf("  stage      ms\n");
  double total = 0;
  for (const StageTime& s : result->stages) {
    std::printf("  %-8s %8.1f\n", s.stage.c_str(), s.ms);
    total += s.ms;
  }
  const size_t entries = r.envelope.size();
  std::printf("  %-8s %8.1f  (%zu declared entr%s, %.1f ms per entry)\n", "total", total, entries,
              entries == 1 ? "y" : "ies",
              total / static_cast<double>(std::max<size_t>(entries, 1)));
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
    // A ranged entry's dims that are symbols print as the symbol's name.
    auto dims = [](const TensorSpec& s) {
      if (s.dynamic) return std::string("[shape known at run time]");
      std::string out;
      for (size_t i = 0; i < s.shape.size(); ++i) {
        const bool symbol = i < s.dim_symbols.size() && !s.dim_symbols[i].empty();
        const bool poly = i < s.dim_polys.size() && !s.dim_polys[i].empty();
        out += (i ? "," : "") + (symbol ? s.dim_symbols[i]
                                 : poly ? s.dim_polys[i]
                                        : std::to_string(s.shape[i]));
      }
      return "[" + out + "]";
    };
    if (e.ranged) {
      std::printf("entry %u  ranged %s  workspace %llu bytes (at the range's maximum)\n", e.index,
                  DescribeRanged(*e.ranged).c_str(), (unsigned long long)e.workspace_bytes);
    } else {
      std::printf("entry %u  class %s  workspace %llu bytes\n", e.index,
                  ClassSpec(e.shape_class).c_str(), (unsigned long long)e.workspace_bytes);
    }
    for (const TensorSpec& s : e.outputs) {
      std::printf("  output   %-24s %s%s\n", s.name.c_str(), DTypeName(s.dtype), dims(s).c_str());
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
                   "skip a compiler pass by name, for bisecting (repeatable); the cell is "
                   "proven but not stored");
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
