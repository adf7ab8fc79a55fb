// Code provenance with the compiler: regenerate a cell's source, rebuild its shared object (mint
// layer; see regenerate.h).
#include "src/kiln/mint/regenerate.h"

#include <algorithm>

#include "src/kiln/base/file.h"
#include "src/kiln/base/sm_levels.h"
#include "src/kiln/cell/admission.h"
#include "src/kiln/compile/driver.h"
#include "src/kiln/compile/pipeline.h"
#include "src/kiln/graph/digest.h"

namespace kiln {

namespace {

// Up to 120 characters of `text` from the start of the line that holds byte `offset`, newlines
// shown as "\n" and other control characters as '?', for a message.
std::string TextAt(std::string_view text, size_t offset) {
  const size_t begin = offset == 0 ? std::string_view::npos : text.rfind('\n', offset - 1);
  const size_t start = begin == std::string_view::npos ? 0 : begin + 1;
  const std::string_view shown = text.substr(std::min(start, text.size()), 120);
  std::string out;
  for (char c : shown) {
    if (c == '\n') {
      out += "\\n";
    } else {
      out += (static_cast<unsigned char>(c) < 0x20 && c != '\t') ? '?' : c;
    }
  }
  if (text.size() - std::min(start, text.size()) > 120) out += "…";
  return out;
}

}  // namespace

Result<std::string> RegenerateCellSource(const Graph& graph, const CellMetadata& metadata) {
  KILN_ASSIGN_OR_RETURN(std::string digest, GraphDigest(graph));
  if (digest != metadata.axes.graph) {
    return Status::InvalidArgument("regenerating the source of " + metadata.key +
                                   ": this graph's digest is " + digest +
                                   ", the cell's graph axis " + metadata.axes.graph);
  }
  // The classes in entry order: a mint compiles entry i from the i-th class it was given, and key
  // restatement already proved these are exactly the key's envelope.
  Envelope envelope;
  for (const EntryMetadata& e : metadata.entries) {
    if (!e.ranged) envelope.classes.push_back(e.shape_class);
  }
  // Then the declared ranged entries the cell carries (as pieces), in declared order, as the mint
  // compiled them after the classes.
  KILN_ASSIGN_OR_RETURN(Envelope declared, EnvelopeFromFacts(metadata.envelope));
  for (const RangedEntry& r : declared.ranged) {
    bool gap = false;
    for (const EntryGap& g : metadata.gaps) gap = gap || (g.ranged && *g.ranged == r);
    if (!gap) envelope.ranged.push_back(r);
  }
  CompileOptions options;
  KILN_ASSIGN_OR_RETURN(EmittedCell emitted,
                        GenerateCell(graph, envelope, digest, options, nullptr));
  // A gap is a claim that this graph's compiler refuses that class, in those words: believed only
  // when it refuses it here too. A cell cannot drop a class the compiler serves.
  for (size_t i = 0; i < metadata.gaps.size(); ++i) {
    const EntryGap& gap = metadata.gaps[i];
    Status refusal;
    std::string what = "gap " + std::to_string(i) + " (";
    if (gap.ranged) {
      refusal = CompileRangedEntry(graph, *gap.ranged, options);
      what += DescribeRanged(*gap.ranged) + ")";
    } else {
      refusal = CompileEntry(graph, gap.shape_class, 0, options, nullptr).status();
      what += DescribeClasses({gap.shape_class}) + ")";
    }
    if (refusal.ok()) {
      return Status::InvalidArgument(what + " of " + metadata.key +
                                     " compiles here; the cell does not carry it");
    }
    const std::string reason = GapReason(refusal, 0);
    if (reason != gap.reason) {
      return Status::InvalidArgument(what + " of " + metadata.key + " records \"" + gap.reason +
                                     "\" but this compiler says \"" + reason + "\"");
    }
  }
  return std::move(emitted.source);
}

Status CheckSourceProvenance(const Graph& graph, const CellMetadata& metadata,
                             const std::string& source) {
  Result<std::string> expected = RegenerateCellSource(graph, metadata);
  if (!expected.ok()) {
    return Status::Refused(
        StatusCode::kInvalidArgument, kRefusalSourceMismatch,
        "cannot regenerate the source this graph implies: " + expected.status().message());
  }
  if (*expected == source) return Status::OK();
  const size_t at = static_cast<size_t>(
      std::mismatch(expected->begin(), expected->end(), source.begin(), source.end()).first -
      expected->begin());
  const size_t line =
      1 + static_cast<size_t>(std::count(expected->begin(), expected->begin() + at, '\n'));
  return Status::Refused(
      StatusCode::kInvalidArgument, kRefusalSourceMismatch,
      "source/cell.cc of " + metadata.key + " differs from what this graph generates at line " +
          std::to_string(line) + ": the cell has \"" + TextAt(source, at) +
          "\", the graph implies \"" + TextAt(*expected, at) + "\" (" +
          std::to_string(source.size()) + " bytes vs " + std::to_string(expected->size()) + ")");
}

Result<std::string> RebuildSharedObject(const std::string& source, const CellMetadata& metadata,
                                        const std::string& work_dir, int parallel_compiles) {
  // The directives as written first: a source that asks for a file is refused whatever else is
  // true of its cell.
  KILN_RETURN_IF_ERROR(CheckSourceDirectives(source));
  Result<Toolchain> toolchain = LocalToolchain();
  if (!toolchain.ok()) {
    return Status::Refused(StatusCode::kInvalidArgument, kRefusalRebuildUnavailable,
                           "no toolchain here: " + toolchain.status().message());
  }
  // Compiling does not run the code, so any level this toolchain can target will do; only the
  // toolchain itself must be the one the cell names.
  Status same = CheckMachine(metadata, KnownSmLevels().back(), toolchain->Block());
  if (!same.ok()) {
    return Status::Refused(StatusCode::kInvalidArgument, kRefusalRebuildUnavailable,
                           "this machine cannot rebuild " + metadata.key + ": " + same.message());
  }
  auto driver = MakeSystemCompilerDriver(*toolchain);
  KILN_RETURN_IF_ERROR(CheckRebuildSource(source, metadata, *driver, work_dir));
  Result<std::string> so =
      BuildSharedObject(source, metadata.entries.size(), metadata.sm, metadata.key, *driver,
                        work_dir, std::max(1, parallel_compiles), nullptr);
  if (!so.ok()) {
    // The compiler's own words can quote any file it read: only a line number leaves.
    return Status::Refused(StatusCode::kInvalidArgument, kRefusalRebuildFailed,
                           "rebuilding " + metadata.key + ": " +
                               ReduceDiagnostics(so.status().message(), work_dir + "/cell.cc"));
  }
  return so;
}

Status CheckRebuildSource(const std::string& source, const CellMetadata& metadata,
                          CompilerDriver& driver, const std::string& work_dir) {
  KILN_RETURN_IF_ERROR(CheckSourceDirectives(source));
  const std::string path = work_dir + "/cell.cc";
  KILN_RETURN_IF_ERROR(WriteFileAtomic(path, source, Durability::kScratch));
  Result<std::vector<std::string>> dirs = driver.SystemIncludeDirs(work_dir);
  if (!dirs.ok()) {
    return Status::Refused(StatusCode::kInvalidArgument, kRefusalRebuildUnavailable,
                           "the toolchain's header directories: " + dirs.status().message());
  }
  // Every entry's view of the source (each is compiled with its own KILN_ENTRY), and the
  // dispatch object's.
  for (int64_t entry = -1; entry < static_cast<int64_t>(metadata.entries.size()); ++entry) {
    Result<std::string> pre =
        driver.Preprocess(path, metadata.sm, {"KILN_ENTRY=" + std::to_string(entry)}, work_dir);
    if (!pre.ok()) {
      return Status::Refused(
          StatusCode::kInvalidArgument, kRefusalRebuildFailed,
          "preprocessing " + metadata.key + ": " + ReduceDiagnostics(pre.status().message(), path));
    }
    KILN_RETURN_IF_ERROR(CheckPreprocessed(*pre, path, *dirs));
  }
  return Status::OK();
}

}  // namespace kiln
