// Minting: compile, build, load, prove and seal one cell (mint layer; see mint.h).
#include "src/kiln/mint/mint.h"

#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <optional>

#include "src/kiln/base/canonical_json.h"
#include "src/kiln/base/clock.h"
#include "src/kiln/base/file.h"
#include "src/kiln/cell/admission.h"
#include "src/kiln/cell/pack.h"
#include "src/kiln/graph/digest.h"
#include "src/kiln/tensor/npy.h"

namespace kiln {

namespace {

Result<TensorSpec> SpecFromJson(const nlohmann::json& j) {
  TensorSpec s;
  s.name = j.at("name").get<std::string>();
  KILN_ASSIGN_OR_RETURN(s.dtype, DTypeFromName(j.at("dtype").get<std::string>()));
  // A ranged entry's dims may be a symbol's name, or (an output's) a polynomial {"poly": "2*n"}.
  bool symbolic = false, poly = false;
  for (const auto& d : j.at("shape")) {
    s.dim_symbols.emplace_back();
    s.dim_polys.emplace_back();
    if (d.is_string()) {
      symbolic = true;
      s.dim_symbols.back() = d.get<std::string>();
      s.shape.push_back(0);
    } else if (d.is_object()) {
      poly = true;
      s.dim_polys.back() = d.at("poly").get<std::string>();
      s.shape.push_back(0);
    } else {
      s.shape.push_back(d.get<int64_t>());
    }
  }
  if (!symbolic) s.dim_symbols.clear();
  if (!poly) s.dim_polys.clear();
  s.dynamic = j.value("dynamic", false);
  return s;
}

struct TempDir {
  std::string path;
  bool owned = false;
  ~TempDir() {
    if (owned && !path.empty() && std::getenv("KILN_KEEP_MINT_DIR") == nullptr) {
      std::error_code ec;  // a scratch directory left behind costs disk, never correctness
      std::filesystem::remove_all(path, ec);
    }
  }
};

}  // namespace

Result<std::vector<EntryMetadata>> EntriesFromDescribe(const nlohmann::json& describe,
                                                       const Envelope& envelope) {
  const auto it = describe.find("entries");
  const bool pieces_given = !envelope.ranged.empty();
  if (it == describe.end() || !it->is_array() || it->size() < envelope.classes.size() ||
      (pieces_given && it->size() != envelope.size())) {
    return Status::InvalidArgument(
        "cell describe: expected an `entries` array with one entry per shape class (" +
        std::to_string(envelope.classes.size()) + "), then " +
        (pieces_given ? "one per ranged piece (" + std::to_string(envelope.ranged.size()) + ")"
                      : std::string("its ranged entries")));
  }
  std::vector<EntryMetadata> entries;
  try {
    for (size_t i = 0; i < it->size(); ++i) {
      const nlohmann::json& d = (*it)[i];
      EntryMetadata e;
      e.index = static_cast<uint32_t>(i);
      if (i < envelope.classes.size()) {
        e.shape_class = envelope.classes[i];
      } else if (!d.contains("ranged")) {
        return Status::InvalidArgument("cell describe: entry " + std::to_string(i) +
                                       " is past the shape classes and is not ranged");
      }
      for (const auto& j : d.at("inputs")) {
        KILN_ASSIGN_OR_RETURN(TensorSpec s, SpecFromJson(j));
        e.inputs.push_back(s);
      }
      for (const auto& j : d.at("outputs")) {
        KILN_ASSIGN_OR_RETURN(TensorSpec s, SpecFromJson(j));
        e.outputs.push_back(s);
      }
      for (const auto& j : d.at("constants")) {
        KILN_ASSIGN_OR_RETURN(TensorSpec s, SpecFromJson(j));
        e.constants.push_back(s);
      }
      e.workspace_bytes = d.at("workspace_bytes").get<uint64_t>();
      if (i >= envelope.classes.size()) {
        // The piece a ranged entry serves, as the cell describes it: its inputs' dims and ranges.
        RangedEntry piece;
        for (const TensorSpec& t : e.inputs) {
          std::vector<DimSpec>& dims = piece.inputs[t.name];
          for (size_t k = 0; k < t.shape.size(); ++k) {
            dims.push_back(DimSpec{t.shape[k], t.dim_symbols.empty() ? "" : t.dim_symbols[k]});
            if (!dims.back().symbol.empty()) dims.back().size = 0;
          }
        }
        for (const auto& [name, range] : d.at("ranged").at("ranges").items()) {
          if (!SetRangeSpec(&piece, name, range.get<std::vector<int64_t>>())) {
            return Status::InvalidArgument("cell describe: entry " + std::to_string(i) +
                                           " range of '" + name + "' is " + range.dump() +
                                           ", expected [lo, hi] or [lo, hi, step]");
          }
        }
        KILN_RETURN_IF_ERROR(CheckRangedEntry(piece, "cell describe: entry " + std::to_string(i)));
        if (pieces_given && piece != envelope.ranged[i - envelope.classes.size()]) {
          return Status::InvalidArgument(
              "cell describe: entry " + std::to_string(i) + " serves " + DescribeRanged(piece) +
              ", compiled as " + DescribeRanged(envelope.ranged[i - envelope.classes.size()]));
        }
        e.ranged = std::move(piece);
      }
      entries.push_back(std::move(e));
    }
  } catch (const nlohmann::json::exception& e) {
    return Status::InvalidArgument(std::string("cell describe: malformed entry: ") + e.what());
  }
  return entries;
}

Result<Samples> ReadSamples(const std::vector<std::map<std::string, std::string>>& paths) {
  Samples out;
  for (size_t i = 0; i < paths.size(); ++i) {
    TensorMap sample;
    for (const auto& [name, path] : paths[i]) {
      auto t = ReadNpy(path);
      if (!t.ok()) {
        return t.status().WithContext("sample " + std::to_string(i) + " input '" + name + "'");
      }
      sample[name] = std::move(t).value();
    }
    out.push_back(std::move(sample));
  }
  return out;
}

const std::vector<std::string>& MintStages() {
  static const std::vector<std::string> kStages = {"key",  "compile", "build", "load",
                                                   "gate", "fence",   "seal"};
  return kStages;
}

Result<MintResult> MintCell(const MintRequest& req) {
  MintResult out;
  auto stage = std::chrono::steady_clock::now();
  const std::vector<std::string>& stages = MintStages();
  size_t next_stage = 0;
  auto announce = [&] {
    if (req.on_stage && next_stage < stages.size()) req.on_stage(stages[next_stage]);
  };
  auto mark = [&](const char* name) {
    out.stages.push_back({name, MsSince(stage)});
    stage = std::chrono::steady_clock::now();
    ++next_stage;
    announce();
  };
  announce();
  const Graph& graph = *req.graph;
  // key (an intake mint is never keyed: only the graph digest, which the source's banner names)
  if (req.intake) {
    KILN_ASSIGN_OR_RETURN(out.axes.graph, GraphDigest(graph));
    out.axes.sm = SmOrDefault(req.sm);
  } else {
    KILN_ASSIGN_OR_RETURN(out.axes, DeriveKeyAxes(graph, req.envelope, req.sm));
    KILN_ASSIGN_OR_RETURN(out.key, KeyFromAxes(out.axes));
  }
  KILN_ASSIGN_OR_RETURN(Toolchain toolchain, LocalToolchain());
  mark("key");
  // compile
  std::vector<Program> programs;
  KILN_ASSIGN_OR_RETURN(EmittedCell emitted, GenerateCell(graph, req.envelope, out.axes.graph,
                                                          req.compile, &out.passes, &programs));
  mark("compile");
  // build
  TempDir dir;
  dir.path = req.work_dir;
  if (dir.path.empty()) {
    char tmpl[] = "/tmp/kiln-mint-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) return Status::IOError("cannot create a mint directory");
    dir.path = tmpl;
    dir.owned = true;
  } else {
    KILN_RETURN_IF_ERROR(MakeDirs(dir.path));
  }
  auto driver = MakeSystemCompilerDriver(toolchain);
  KILN_ASSIGN_OR_RETURN(
      std::string so_bytes,
      BuildSharedObject(emitted.source, programs.size() + emitted.ranged_pieces.size(), out.axes.sm,
                        out.key, *driver, dir.path, req.compile.parallel_compiles, &out.passes));
  mark("build");
  // metadata (entries from the describe JSON the cell itself will report)
  CellMetadata& md = out.metadata;
  md.key = out.key;
  md.family = req.family;
  md.codegen_version = kCodegenVersion;
  md.axes = out.axes;
  KILN_ASSIGN_OR_RETURN(md.envelope, EnvelopeFacts(req.envelope));
  md.toolchain = toolchain.Block();
  md.sm = out.axes.sm;
  // Entry i was compiled from class emitted.entry_classes[i]; the classes that did not compile
  // are the cell's gaps, each with the compiler's words.
  Envelope compiled;
  for (size_t c : emitted.entry_classes) compiled.classes.push_back(req.envelope.classes.at(c));
  for (const auto& [r, piece] : emitted.ranged_pieces) compiled.ranged.push_back(piece);
  for (const auto& [c, reason] : emitted.gaps) {
    EntryGap gap;
    if (c < req.envelope.classes.size()) {
      gap.shape_class = req.envelope.classes[c];
    } else {
      gap.ranged = req.envelope.ranged.at(c - req.envelope.classes.size());
    }
    gap.reason = reason;
    md.gaps.push_back(std::move(gap));
  }
  out.entry_classes = emitted.entry_classes;
  KILN_ASSIGN_OR_RETURN(md.entries, EntriesFromDescribe(emitted.describe, compiled));
  // load: the exact bytes that will be sealed (law 6)
  KILN_ASSIGN_OR_RETURN(auto library, OpenCellBytes(so_bytes, dir.path + "/proof"));
  KILN_ASSIGN_OR_RETURN(
      auto cell, ArmedCell::Arm(library, md.entries, req.weights,
                                req.intake ? Lane::kIntake : Lane::kExported, "", req.num_threads));
  KILN_ASSIGN_OR_RETURN(Interpreter eager, Interpreter::Create(req.graph));
  mark("load");
  // gate, then fence: the strict proof
  StrictProofOptions proof_options;
  proof_options.on_gate = [&](const Result<GateReport>&, double) { mark("gate"); };
  KILN_ASSIGN_OR_RETURN(StrictProof proof, ProveStrict(*cell, eager, req.weights, req.thresholds,
                                                       CellArtifacts{emitted.source, so_bytes},
                                                       req.samples, proof_options));
  out.gate = std::move(proof.gate);
  out.fence = std::move(proof.fence);
  md.fence.checkpoint_free = true;
  md.fence.perturbed_checkpoint_matched = true;
  md.fence.constant_table_complete = true;
  mark("fence");
  if (req.intake) {  // law 12: nothing sealed
    out.shared_object = std::move(so_bytes);
    mark("seal");
    return out;
  }
  // seal
  CellFiles files;
  KILN_ASSIGN_OR_RETURN(files.metadata_json, SerializeMetadata(md));
  files.shared_object = std::move(so_bytes);
  files.source = emitted.source;
  KILN_ASSIGN_OR_RETURN(out.tar, PackCell(files));
  out.digest = CellDigest(out.tar);
  out.ref = CellRef(out.key, out.digest);
  mark("seal");
  return out;
}

Result<MintResult> MintAndStore(const MintRequest& request, LocalStore& store) {
  KILN_ASSIGN_OR_RETURN(MintResult result, MintCell(request));
  if (!DisabledPasses(request.compile).empty()) return result;
  KILN_RETURN_IF_ERROR(
      store.Put(result.key, result.tar, CellOrigin{CellOrigin::Kind::kMinted, ""}));
  result.stored = true;
  return result;
}

Result<LocalCell> CompileThroughStore(const MintRequest& request, LocalStore& store,
                                      const std::string& private_dir) {
  const auto start = std::chrono::steady_clock::now();
  LocalCell out;
  KILN_ASSIGN_OR_RETURN(KeyAxes axes, DeriveKeyAxes(*request.graph, request.envelope, request.sm));
  KILN_ASSIGN_OR_RETURN(std::string key, KeyFromAxes(axes));
  const bool bisecting = !DisabledPasses(request.compile).empty();
  std::optional<StoredCell> hit;
  if (!bisecting) {
    KILN_ASSIGN_OR_RETURN(hit, store.Get(key));
  }
  std::string bytes;
  if (hit) {
    out.store_hit = true;
    bytes = std::move(hit->bytes);
  } else {
    KILN_ASSIGN_OR_RETURN(MintResult minted, MintAndStore(request, store));
    bytes = std::move(minted.tar);
  }
  KILN_ASSIGN_OR_RETURN(AdmissionPolicy policy, LocalAdmissionPolicy(key));
  KILN_ASSIGN_OR_RETURN(AdmittedCell admitted, AdmitCell(bytes, "", 0, policy));
  KILN_ASSIGN_OR_RETURN(out.cell, LoadAdmittedCell(admitted, request.weights, Lane::kExported,
                                                   private_dir, request.num_threads));
  out.ref = out.cell->ref();
  out.ms = MsSince(start);
  return out;
}

}  // namespace kiln
