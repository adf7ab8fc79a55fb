// The radosgw a test runs against (tests of the hub layer's S3 blob store). CTest starts one per
// run with tools/s3.sh (the s3_store fixture, tests/hub/CMakeLists.txt) and names its directory
// in KILN_TEST_S3_DIR; DIR/env holds the endpoint, the bucket and the credentials.
#pragma once

#include <unistd.h>

#include <fstream>
#include <map>
#include <optional>
#include <string>

namespace kiln {

// The variables of DIR/env, or nullopt with `why` saying what is missing. `installed` tells
// a caller whether a missing store is a skip (no radosgw on this machine) or a failure.
inline std::optional<std::map<std::string, std::string>> S3TestEnv(std::string* why,
                                                                   bool* installed) {
  *installed = ::access("/usr/bin/radosgw", X_OK) == 0;
  const char* dir = std::getenv("KILN_TEST_S3_DIR");
  if (!dir || !*dir) {
    *why = "KILN_TEST_S3_DIR is not set (ctest sets it after starting radosgw with tools/s3.sh)";
    return std::nullopt;
  }
  std::ifstream in(std::string(dir) + "/env");
  if (!in) {
    *why = std::string(dir) + "/env does not exist: tools/s3.sh start did not bring radosgw up" +
           (*installed ? "" : " (radosgw is not installed: tools/deps.sh --s3)");
    return std::nullopt;
  }
  std::map<std::string, std::string> env;
  for (std::string line; std::getline(in, line);) {
    const size_t eq = line.find('=');
    if (eq != std::string::npos) env[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return env;
}

// Skips the test when radosgw is not installed, fails it when it is but is not running.
#define KILN_REQUIRE_S3(env_var)                    \
  std::string s3_why;                               \
  bool s3_installed = false;                        \
  auto env_var = S3TestEnv(&s3_why, &s3_installed); \
  if (!env_var) {                                   \
    if (!s3_installed) GTEST_SKIP() << s3_why;      \
    FAIL() << s3_why;                               \
  }

}  // namespace kiln
