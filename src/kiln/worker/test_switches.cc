// Test-only fault injection for the serving wrapper (see test_switches.h).
#include "src/kiln/worker/test_switches.h"

#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <sstream>

#include "src/kiln/base/log.h"
#include "src/kiln/base/secret_scan.h"

namespace kiln {

Result<std::map<std::string, std::map<int, std::string>>> ParseCellFaultSpec(
    const std::string& spec) {
  std::map<std::string, std::map<int, std::string>> out;
  std::stringstream items(spec);
  std::string item;
  while (std::getline(items, item, ',')) {
    const size_t colon = item.find(':');
    const size_t at = item.find('@');
    auto bad = [&](const std::string& why) {
      return Status::InvalidArgument(std::string(kTestCellFaultEnv) + " item '" + item +
                                     "': " + why + " (expected <target>:<fault|oom>@<n>)");
    };
    if (colon == std::string::npos || at == std::string::npos || at < colon || colon == 0) {
      return bad("malformed");
    }
    const std::string target = item.substr(0, colon);
    const std::string kind = item.substr(colon + 1, at - colon - 1);
    std::string fault;
    if (kind == "fault") {
      fault = kCellFault;
    } else if (kind == "oom") {
      fault = kCellOom;
    } else {
      return bad("fault '" + kind + "' is not fault or oom");
    }
    const std::string n_text = item.substr(at + 1);
    char* end = nullptr;
    const long n = std::strtol(n_text.c_str(), &end, 10);
    if (n_text.empty() || *end != '\0' || n < 1 || n > 1000000) {
      return bad("request number '" + n_text + "' is not an integer in [1, 1000000]");
    }
    out[target][static_cast<int>(n)] = fault;
  }
  return out;
}

namespace {

// KILN_TEST_SECRET_SCAN: the first call into any target's cell first scans this process
// (base/secret_scan.h) and writes the report, role "serving"; then the cell runs.
Status ApplySecretScanSwitch(const std::map<std::string, ServedTarget*>& targets) {
  auto once = std::make_shared<std::once_flag>();
  for (const auto& [name, target] : targets) {
    if (target == nullptr) continue;
    target->SetRunFaultForTest([once] {
      std::call_once(*once, [] {
        if (Status s = WriteSecretScanReportFromEnv("serving"); !s.ok()) {
          LogWarn("secret scan: " + s.ToString());
        }
      });
      return std::string();
    });
  }
  LogWarn(std::string("TEST SWITCH ") + kTestSecretScanEnv +
          " is set: the first cell call scans this process for a secret");
  return Status::OK();
}

}  // namespace

Status ApplyTestSwitchesFromEnv(const std::map<std::string, ServedTarget*>& targets) {
  const char* env = std::getenv(kTestCellFaultEnv);
  const char* scan = std::getenv(kTestSecretScanEnv);
  const bool want_faults = env != nullptr && *env != '\0';
  if (scan != nullptr && *scan != '\0') {
    if (want_faults) {
      return Status::InvalidArgument(std::string(kTestCellFaultEnv) + " and " + kTestSecretScanEnv +
                                     " are both set; use one at a time");
    }
    return ApplySecretScanSwitch(targets);
  }
  if (!want_faults) return Status::OK();
  KILN_ASSIGN_OR_RETURN(auto faults, ParseCellFaultSpec(env));
  for (auto& [name, plan] : faults) {
    auto it = targets.find(name);
    if (it == targets.end() || it->second == nullptr) {
      return Status::InvalidArgument(std::string(kTestCellFaultEnv) + ": no target named '" + name +
                                     "'");
    }
    auto count = std::make_shared<std::atomic<int>>(0);
    auto by_request = std::make_shared<const std::map<int, std::string>>(std::move(plan));
    it->second->SetRunFaultForTest([count, by_request] {
      const int n = count->fetch_add(1) + 1;
      auto f = by_request->find(n);
      return f == by_request->end() ? std::string() : f->second;
    });
    LogWarn(std::string("TEST SWITCH ") + kTestCellFaultEnv + " is set: target '" + name +
            "' will fail chosen requests on purpose");
  }
  return Status::OK();
}

}  // namespace kiln
