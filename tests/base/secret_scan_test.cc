// The test-only secret scan (base/secret_scan.h): it finds a secret this process holds in its
// heap or its environment, and reports none when the process holds none — so a scan that says
// "not found" in the e2e tests is a scan that could have said "found".
#include "src/kiln/base/secret_scan.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "src/kiln/base/file.h"

namespace kiln {
namespace {

// A fresh random secret, held only complemented.
std::string RandomComplementedSecret() {
  std::random_device rd;
  std::string c;
  for (int i = 0; i < 40; ++i) c.push_back(static_cast<char>(~("abcdefghijklmnop"[rd() % 16])));
  return c;
}

TEST(SecretScan, FindsNothingThatIsNotThere) {
  const std::string c = RandomComplementedSecret();
  auto scan = ScanOwnProcess(c);
  ASSERT_TRUE(scan.ok()) << scan.status().ToString();
  EXPECT_FALSE(scan->in_memory);
  EXPECT_FALSE(scan->in_environ);
  EXPECT_GT(scan->regions, 5u);
  EXPECT_GT(scan->bytes, 1u << 20);
}

TEST(SecretScan, FindsTheSecretOnTheHeap) {
  const std::string c = RandomComplementedSecret();
  ASSERT_FALSE(ScanOwnProcess(c)->in_memory);
  // The secret itself, written into a heap block only now.
  auto held = std::make_unique<char[]>(4096);
  for (size_t i = 0; i < c.size(); ++i) held[1000 + i] = static_cast<char>(~c[i]);
  auto scan = ScanOwnProcess(c);
  ASSERT_TRUE(scan.ok()) << scan.status().ToString();
  EXPECT_TRUE(scan->in_memory);
  EXPECT_FALSE(scan->in_environ);
}

// Run by the next test in a fresh process of this binary: writes the report the switch asks for.
TEST(SecretScan, ChildWritesItsReport) {
  if (std::getenv(kTestSecretScanEnv) == nullptr) GTEST_SKIP() << "run by the test below";
  ASSERT_TRUE(WriteSecretScanReportFromEnv("child").ok());
}

TEST(SecretScan, FindsTheSecretInTheEnvironmentTheProcessStartedWith) {
  // /proc/self/environ is the environment a process was started with: a fresh process of this
  // binary started with the secret in a variable finds it there, one started without does not.
  char dir[] = "/tmp/kiln-secret-scan-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string c = RandomComplementedSecret();
  const std::string file = std::string(dir) + "/secret";
  ASSERT_TRUE(WriteFileAtomic(file, c).ok());
  for (bool with : {true, false}) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::setenv(kTestSecretScanEnv, file.c_str(), 1);
      if (with) ::setenv("KILN_SCAN_TEST_SECRET", Complement(c).c_str(), 1);
      ::execl("/proc/self/exe", "secret_scan_child",
              "--gtest_filter=SecretScan.ChildWritesItsReport", static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ASSERT_GT(pid, 0);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
    auto text = ReadFile(file + ".child." + std::to_string(pid) + ".json");
    ASSERT_TRUE(text.ok()) << text.status().ToString();
    const auto report = nlohmann::json::parse(*text);
    EXPECT_EQ(report.value("in_environ", !with), with) << *text;
    // The environment is in the process's memory too (the initial stack holds it).
    EXPECT_EQ(report.value("in_memory", !with), with) << *text;
    EXPECT_EQ(report.value("role", ""), "child");
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kiln
