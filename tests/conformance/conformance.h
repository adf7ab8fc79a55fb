// The ONNX node conformance runner (tests/conformance/, used by the conformance test and the
// kiln_conformance tool that writes docs/conformance.md and the baseline).
//
// Each case that tests/conformance/generate_cases.py wrote (model.onnx + test_data_set_0 of .pb
// TensorProtos) runs twice: through the eager interpreter, and through a compiled cell; both are
// compared with the case's expected outputs at the case's tolerance (onnx's backend test rule:
// |got - want| <= atol + rtol * |want|, NaN equals NaN, integers and bools exact, dtype and shape
// exact). Compiling is the expensive part (one system compiler run per cell), so cases of the same
// opset are merged into one graph per cell, every value renamed with a per-case prefix; a batch
// that fails to build or run is split in halves until the guilty cases stand alone, so one bad
// case never hides the others.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "src/kiln/base/status.h"

namespace kiln::conformance {

// One line of index.tsv.
struct CaseInfo {
  std::string name;  // "test_abs"
  std::string op;    // the op under test ("Abs"; an "_expanded" case names its twin's op)
  int64_t opset = 0;
  double rtol = 1e-3;
  double atol = 1e-7;
  std::string dir;  // absolute case directory
};

enum class Outcome { kPass, kFail, kExcluded };
const char* OutcomeName(Outcome outcome);

struct ModeResult {
  Outcome outcome = Outcome::kExcluded;
  // kFail: the first mismatch ("output 'y' [3]: got 1.5, want 2") or the error; kExcluded: the
  // reason ("dtype DOUBLE not supported", "op not listed as supported", ...). Empty for kPass.
  std::string detail;
};

struct CaseResult {
  CaseInfo info;
  bool op_listed = false;   // the op is in kiln's registry (kiln lists it as supported)
  bool kiln_dtypes = true;  // every tensor of the case has a kiln DType (not double, string, ...)
  ModeResult eager;
  ModeResult compiled;
  // Through the command line, as a user runs a case: its inputs as .npy files, `kiln run` and
  // `kiln run --compile` (which mints with the numerics gate and the fence, probing those inputs
  // as the sample). Excluded with "command line not run" unless RunOptions::cli_kiln is set.
  ModeResult cli_eager;
  ModeResult cli_compiled;
};

struct RunOptions {
  bool compiled = true;  // false: the compiled half is excluded with `compiled_skip_reason`
  std::string compiled_skip_reason = "compiled mode not run";
  size_t batch_size = 48;                       // cases per compiled cell
  std::string work_dir;                         // scratch for cell builds; must exist
  std::function<void(const std::string&)> log;  // progress lines (may be empty)
  bool verbose = false;  // also log each case before it runs (finds a case that crashes)
  // Cases not run at all, excluded in both modes with reason "skipped (--skip)": the way out
  // when a case crashes the process, until the crash is fixed.
  std::set<std::string> skip;
  // The `kiln` binary: when set, every case (whatever its op) also runs through the command line
  // (CaseResult::cli_eager, cli_compiled), `cli_jobs` processes at a time.
  std::string cli_kiln;
  int cli_jobs = 2;
};

// Reads `cases_dir`/index.tsv. An error names the file and the line.
Result<std::vector<CaseInfo>> ReadIndex(const std::string& cases_dir);

// Runs every case in eager and (unless disabled) compiled mode. Never fails as a whole: each
// case's problem is recorded in its own result.
std::vector<CaseResult> RunCases(const std::vector<CaseInfo>& cases, const RunOptions& options);

// tests/conformance/skip.txt: one case name a line ('#' comments), cases that crash the process
// and so cannot run until fixed. A missing file is an empty list.
Result<std::set<std::string>> ReadSkipFile(const std::string& path);

// The baseline: one "eager <case>" or "compiled <case>" line per passing (mode, case), sorted.
std::string RenderBaseline(const std::vector<CaseResult>& results);
Result<std::set<std::string>> ReadBaseline(const std::string& path);
// The baseline lines this run would write.
std::set<std::string> PassingLines(const std::vector<CaseResult>& results);

// Baseline lines that no longer pass ("compiled test_abs: fail: output 'y' [3]: ...") and passing
// lines the baseline lacks. With `compiled_ran` false, compiled lines are not checked.
struct BaselineDiff {
  std::vector<std::string> regressions;
  std::vector<std::string> new_passes;
};
BaselineDiff DiffBaseline(const std::vector<CaseResult>& results,
                          const std::set<std::string>& baseline, bool compiled_ran);

// docs/conformance.md: the share of all cases passing each mode, a per-op table, then every
// case that does not pass in some mode with its reason, and the explanation `explanations`
// holds for it (case name -> why). `generator` names the case source.
std::string RenderReport(const std::vector<CaseResult>& results, const std::string& generator,
                         const std::map<std::string, std::string>& explanations = {});
// tests/conformance/explanations.txt: "CASE<TAB>explanation" lines ('#' comments), the words a
// remaining failure's reason needs. A missing file is an empty map.
Result<std::map<std::string, std::string>> ReadExplanations(const std::string& path);

// Summary numbers (also printed by the tool and the test).
struct Summary {
  int64_t total = 0;
  int64_t listed = 0;  // cases whose op kiln lists as supported
  int64_t eager_pass = 0;
  int64_t compiled_pass = 0;
  int64_t listed_eager_pass = 0;
  int64_t listed_compiled_pass = 0;
  int64_t listed_both_pass = 0;
  // The listed cases whose tensors all have a kiln DType, and how many of them pass.
  int64_t listed_typed = 0;
  int64_t listed_typed_eager_pass = 0;
  int64_t listed_typed_compiled_pass = 0;
  std::vector<std::string> listed_ops_without_pass;  // listed ops no case of which passes eager
  // The command line (all cases, whatever their op), when it ran.
  bool cli_ran = false;
  int64_t cli_eager_pass = 0;
  int64_t cli_compiled_pass = 0;
  int64_t cli_both_pass = 0;
  std::vector<std::string> cli_eager_only;  // cases that pass eager but not compiled
};
Summary Summarize(const std::vector<CaseResult>& results);
std::string SummaryLine(const Summary& s);

}  // namespace kiln::conformance
