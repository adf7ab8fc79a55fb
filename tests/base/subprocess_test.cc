// RunProcess (base/subprocess.h): exit codes, captured output, the working directory, a program
// that cannot start, and a child killed by a signal. Runs /bin/sh, so these cases are
// base_test_e2e.
#include "src/kiln/base/subprocess.h"

#include <gtest/gtest.h>

#include <filesystem>

namespace kiln {
namespace {

TEST(Subprocess, CapturesStdoutAndStderrAndReturnsTheExitCode) {
  std::string out;
  auto rc = RunProcess({"/bin/sh", "-c", "echo to-out; echo to-err >&2; exit 7"}, &out);
  ASSERT_TRUE(rc.ok()) << rc.status().ToString();
  EXPECT_EQ(*rc, 7);
  EXPECT_NE(out.find("to-out"), std::string::npos) << out;
  EXPECT_NE(out.find("to-err"), std::string::npos) << out;
}

TEST(Subprocess, RunsInTheGivenDirectory) {
  const std::string dir = std::filesystem::canonical(::testing::TempDir()).string();
  std::string out;
  auto rc = RunProcess({"/bin/sh", "-c", "pwd"}, &out, dir);
  ASSERT_TRUE(rc.ok()) << rc.status().ToString();
  EXPECT_EQ(*rc, 0);
  EXPECT_EQ(out, dir + "\n");
}

TEST(Subprocess, AProgramThatCannotStartIsAnErrorNamingIt) {
  std::string out;
  auto rc = RunProcess({"/nonexistent/kiln-no-such-program"}, &out);
  ASSERT_FALSE(rc.ok());
  EXPECT_NE(rc.status().message().find("/nonexistent/kiln-no-such-program"), std::string::npos)
      << rc.status().ToString();
  EXPECT_FALSE(RunProcess({}, &out).ok());
}

TEST(Subprocess, AChildKilledByASignalReports128PlusTheSignal) {
  auto rc = RunProcess({"/bin/sh", "-c", "kill -9 $$"}, nullptr);
  ASSERT_TRUE(rc.ok()) << rc.status().ToString();
  EXPECT_EQ(*rc, 128 + 9);
}

}  // namespace
}  // namespace kiln
