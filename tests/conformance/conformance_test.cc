// The conformance regression gate: every (mode, case) in tests/conformance/baseline.txt must
// still pass. The cases are generated at test time into the build directory by the
// conformance_cases CTest fixture (tests/conformance/generate_cases.py); new passes are printed
// with the command that records them (`bash tools/conformance.sh --update`), never a failure.
#include "tests/conformance/conformance.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>

namespace kiln::conformance {
namespace {

#if defined(__SANITIZE_ADDRESS__)
// Under ASan the eager half (the code the sanitizer is for) still runs; the compiled half spends
// its time in the system compiler building cells, which the sanitizer does not instrument, and
// would push this test past CI's budget.
constexpr bool kSanitizerBuild = true;
#else
constexpr bool kSanitizerBuild = false;
#endif

TEST(Conformance, BaselineCasesStillPass) {
  const char* env = std::getenv("KILN_CONFORMANCE_CASES");
  const std::string cases_dir = env != nullptr ? env : KILN_CONFORMANCE_CASES;
  auto cases = ReadIndex(cases_dir);
  ASSERT_TRUE(cases.ok()) << cases.status().ToString()
                          << "\n(the conformance_cases CTest fixture generates them: "
                             "`ctest -R conformance`, or `bash tools/conformance.sh`)";
  auto baseline = ReadBaseline(std::string(KILN_SOURCE_DIR) + "/tests/conformance/baseline.txt");
  ASSERT_TRUE(baseline.ok()) << baseline.status().ToString();

  RunOptions options;
  if (kSanitizerBuild) {
    options.compiled = false;
    options.compiled_skip_reason = "compiled mode skipped in the sanitizer build";
    std::cout << "conformance: sanitizer build: the compiled half is skipped (cells are built by "
                 "the uninstrumented system compiler and would exceed CI's time budget); the "
                 "eager half runs\n";
  }
  char tmpl[] = "/tmp/kiln-conformance-test-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  options.work_dir = tmpl;
  const std::vector<CaseResult> results = RunCases(*cases, options);
  std::filesystem::remove_all(options.work_dir);
  std::cout << "conformance: " << SummaryLine(Summarize(results)) << "\n";

  const BaselineDiff diff = DiffBaseline(results, *baseline, options.compiled);
  for (const auto& l : diff.new_passes) std::cout << "conformance: newly passing: " << l << "\n";
  if (!diff.new_passes.empty()) {
    std::cout << "conformance: " << diff.new_passes.size()
              << " (mode, case) pairs pass that the baseline lacks; record them with "
                 "`bash tools/conformance.sh --update`\n";
  }
  for (const auto& l : diff.regressions) ADD_FAILURE() << "no longer passes: " << l;
}

}  // namespace
}  // namespace kiln::conformance
