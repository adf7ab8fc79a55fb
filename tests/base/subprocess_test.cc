// RunProcess (base/subprocess.h): exit codes, captured output, the working directory, a program
// that cannot start, and a child killed by a signal. Runs /bin/sh, so these cases are
// base_test_e2e.
#include "src/kiln/base/subprocess.h"

#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "src/kiln/base/signals.h"

namespace kiln {
namespace {

// A serving process blocks its stop signals for its sigwait; a mask survives exec, so a child
// that inherited it would ignore the SIGTERM meant to stop it. Run in a thread of its own, so the
// blocked mask stays there.
TEST(Subprocess, AChildStartsWithNoSignalBlockedWhateverItsParentBlocks) {
  std::string out;
  std::thread([&] {
    BlockStopSignals();
    // grep reads its own status: a shell reading its own would race with the shell's wait, which
    // blocks every signal around its sigsuspend.
    auto rc = RunProcess({"/bin/grep", "SigBlk", "/proc/self/status"}, &out);
    ASSERT_TRUE(rc.ok()) << rc.status().ToString();
  }).join();
  EXPECT_NE(out.find("SigBlk:\t0000000000000000"), std::string::npos) << out;
}

TEST(Signals, AStopSignalIsSeenPendingWhileBlocked) {
  std::thread([] {
    const sigset_t set = BlockStopSignals();
    EXPECT_FALSE(StopSignalPending(set));
    ASSERT_EQ(::pthread_kill(::pthread_self(), SIGTERM), 0);
    EXPECT_TRUE(StopSignalPending(set));
    EXPECT_EQ(WaitForStopSignal(set, nullptr), SIGTERM);  // consumed, never delivered
    EXPECT_FALSE(StopSignalPending(set));
  }).join();
}

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

TEST(Subprocess, SpawnWithLogWritesTheLogAndOverridesTheEnvironment) {
  const std::string log = ::testing::TempDir() + "/kiln_spawn_log_test.txt";
  ::setenv("KILN_SPAWN_TEST_KEEP", "kept", 1);
  ::setenv("KILN_SPAWN_TEST_OVER", "old", 1);
  auto pid = SpawnWithLog(
      {"/bin/sh", "-c", "echo out=$KILN_SPAWN_TEST_KEEP,$KILN_SPAWN_TEST_OVER; echo err >&2"},
      {"KILN_SPAWN_TEST_OVER=new"}, log);
  ASSERT_TRUE(pid.ok()) << pid.status().ToString();
  int status = 0;
  ASSERT_EQ(::waitpid(*pid, &status, 0), *pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  std::ifstream in(log);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_NE(text.str().find("out=kept,new"), std::string::npos) << text.str();
  EXPECT_NE(text.str().find("err"), std::string::npos) << text.str();
  EXPECT_FALSE(SpawnWithLog({"/nonexistent/kiln-no-such-program"}, {}, log).ok());
}

}  // namespace
}  // namespace kiln
