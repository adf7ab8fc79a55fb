// kiln_conformance: runs the ONNX node conformance cases (tests/conformance/conformance.h) and
// either checks them against the committed baseline or, with --update, rewrites
// docs/conformance.md and tests/conformance/baseline.txt. tools/conformance.sh drives it.
//
// Usage: kiln_conformance --cases DIR [--update] [--report PATH] [--baseline PATH]
//                         [--explanations PATH] [--eager-only] [--batch N] [--filter SUBSTRING]
//                         [--verbose]
//                         [--skip CASE]... [--skip-file PATH] [--cli KILN [--jobs N]]
// --cli also runs every case through the command line (`KILN run` and `KILN run --compile`, the
// case's inputs as .npy files), N processes at a time, as a user would; the report then leads
// with those counts.
// --verbose logs each case before it runs, so a case that crashes the process shows last; --skip
// excludes it (reason "skipped (--skip)", visible in the report) until the crash is fixed.
// Exit status: 0 ok, 1 a baseline (mode, case) no longer passes, 2 bad usage or unreadable input.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>

#include "src/kiln/base/file.h"
#include "tests/conformance/conformance.h"

namespace {

int Usage(const std::string& why) {
  std::cerr << "kiln_conformance: " << why
            << "\nusage: kiln_conformance --cases DIR [--update] [--report PATH] "
               "[--baseline PATH] [--explanations PATH] [--eager-only] [--batch N] "
               "[--filter SUBSTRING] [--verbose] "
               "[--skip CASE]... [--skip-file PATH] [--cli KILN [--jobs N]]\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace kiln::conformance;
  std::string cases_dir, report_path, baseline_path, filter, explanations_path;
  bool update = false;
  RunOptions options;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](std::string* out) {
      if (i + 1 >= argc) return false;
      *out = argv[++i];
      return true;
    };
    std::string v;
    if (a == "--cases") {
      if (!value(&cases_dir)) return Usage("--cases needs a directory");
    } else if (a == "--report") {
      if (!value(&report_path)) return Usage("--report needs a path");
    } else if (a == "--baseline") {
      if (!value(&baseline_path)) return Usage("--baseline needs a path");
    } else if (a == "--explanations") {
      if (!value(&explanations_path)) return Usage("--explanations needs a path");
    } else if (a == "--filter") {
      if (!value(&filter)) return Usage("--filter needs a substring");
    } else if (a == "--batch") {
      if (!value(&v) || std::atoi(v.c_str()) < 1) return Usage("--batch needs a count >= 1");
      options.batch_size = static_cast<size_t>(std::atoi(v.c_str()));
    } else if (a == "--skip") {
      if (!value(&v)) return Usage("--skip needs a case name");
      options.skip.insert(v);
    } else if (a == "--skip-file") {
      if (!value(&v)) return Usage("--skip-file needs a path");
      auto names = ReadSkipFile(v);
      if (!names.ok()) return Usage(names.status().ToString());
      options.skip.insert(names->begin(), names->end());
    } else if (a == "--cli") {
      if (!value(&options.cli_kiln)) return Usage("--cli needs the kiln binary");
      options.cli_kiln = std::filesystem::absolute(options.cli_kiln).string();
    } else if (a == "--jobs") {
      if (!value(&v) || std::atoi(v.c_str()) < 1) return Usage("--jobs needs a count >= 1");
      options.cli_jobs = std::atoi(v.c_str());
    } else if (a == "--verbose") {
      options.verbose = true;
    } else if (a == "--update") {
      update = true;
    } else if (a == "--eager-only") {
      options.compiled = false;
      options.compiled_skip_reason = "compiled mode not run (--eager-only)";
    } else {
      return Usage("unknown argument '" + a + "'");
    }
  }
  if (cases_dir.empty()) return Usage("--cases is required");
  if (update && (report_path.empty() || baseline_path.empty())) {
    return Usage("--update needs --report and --baseline");
  }
  if (update && (!filter.empty() || !options.compiled)) {
    return Usage("--update records the full run: drop --filter and --eager-only");
  }
  auto cases = ReadIndex(std::filesystem::absolute(cases_dir).string());
  if (!cases.ok()) return Usage(cases.status().ToString());
  if (!filter.empty()) {
    std::erase_if(*cases,
                  [&](const CaseInfo& c) { return c.name.find(filter) == std::string::npos; });
  }
  char tmpl[] = "/tmp/kiln-conformance-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return Usage("cannot create a scratch directory under /tmp");
  options.work_dir = tmpl;
  options.log = [](const std::string& line) { std::cerr << line << "\n"; };
  const auto start = std::chrono::steady_clock::now();
  const std::vector<CaseResult> results = RunCases(*cases, options);
  std::filesystem::remove_all(options.work_dir);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // Every command-line failure with kiln's last line (the report keeps those of one mode only).
  for (const CaseResult& r : results) {
    if (r.cli_eager.outcome == Outcome::kFail) {
      std::cerr << "conformance: cli eager FAIL " << r.info.name << ": " << r.cli_eager.detail
                << "\n";
    }
    if (r.cli_compiled.outcome == Outcome::kFail) {
      std::cerr << "conformance: cli compiled FAIL " << r.info.name << ": " << r.cli_compiled.detail
                << "\n";
    }
  }
  std::cout << "conformance: " << SummaryLine(Summarize(results)) << " in "
            << static_cast<int>(seconds) << " s\n";

  if (update) {
    const std::string generator = "the " + std::to_string(results.size()) +
                                  " node cases of python3-onnx's case generators "
                                  "(tests/conformance/generate_cases.py)";
    auto explanations = ReadExplanations(explanations_path);
    if (!explanations.ok()) return Usage(explanations.status().ToString());
    auto s = kiln::WriteFileAtomic(report_path, RenderReport(results, generator, *explanations));
    if (s.ok()) s = kiln::WriteFileAtomic(baseline_path, RenderBaseline(results));
    if (!s.ok()) return Usage(s.ToString());
    std::cout << "conformance: wrote " << report_path << " and " << baseline_path << "\n";
    return 0;
  }
  if (!report_path.empty()) {  // a report of this run alone (the baseline is left as it is)
    const std::string generator = std::to_string(results.size()) + " node cases";
    auto explanations = ReadExplanations(explanations_path);
    if (!explanations.ok()) return Usage(explanations.status().ToString());
    auto s = kiln::WriteFileAtomic(report_path, RenderReport(results, generator, *explanations));
    if (!s.ok()) return Usage(s.ToString());
  }
  if (baseline_path.empty()) return 0;
  auto baseline = ReadBaseline(baseline_path);
  if (!baseline.ok()) return Usage(baseline.status().ToString());
  if (!filter.empty()) {
    std::erase_if(*baseline,
                  [&](const std::string& l) { return l.find(filter) == std::string::npos; });
  }
  const BaselineDiff diff = DiffBaseline(results, *baseline, options.compiled);
  for (const auto& l : diff.new_passes) {
    std::cout << "conformance: newly passing: " << l << "\n";
  }
  if (!diff.new_passes.empty()) {
    std::cout << "conformance: " << diff.new_passes.size()
              << " newly passing; record them with `bash tools/conformance.sh --update`\n";
  }
  for (const auto& l : diff.regressions) std::cout << "conformance: REGRESSION " << l << "\n";
  return diff.regressions.empty() ? 0 : 1;
}
