// Process hygiene with real processes: a worker's mint child dies with the worker however the
// worker dies, and a planted path can never make a worker write or dlopen a cell outside its own
// private directory.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "src/kiln/tensor/npy.h"
#include "tests/worker/worker_process.h"

namespace kiln {
namespace {

using namespace kiln::worker_testing;  // NOLINT: the process fixtures
using HygieneEndToEnd = MachinesTest;

std::map<std::string, Tensor> MlpInput() {
  auto x = ReadNpy(ExampleDir("mlp") + "inputs/x.npy");
  return {{"x", x.ok() ? *x : Tensor()}};
}

// Gone, or a zombie no one has reaped yet (a zombie runs nothing).
bool Dead(pid_t pid) {
  if (::kill(pid, 0) != 0) return errno == ESRCH;
  const std::string stat =
      hub_testing::ValueOr(ReadFile("/proc/" + std::to_string(pid) + "/stat"), std::string());
  const size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'Z';
}

// SIGKILL runs none of the worker's cleanup; its mint child must still die, within a second,
// instead of being re-parented and compiling on for nobody.
TEST_F(HygieneEndToEnd, MintChildDiesWithinASecondOfItsWorkersSigkill) {
  Worker w(root_ + "/w", Manifest({}), {{"KILN_TEST_MINT_STALL_S", "120"}});
  ASSERT_TRUE(w.Start());
  std::vector<pid_t> children;
  for (int i = 0; i < 1200 && children.empty(); ++i) {
    children = w.MintChildren();
    if (children.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(children.size(), 1u) << w.Log();
  const pid_t child = children[0];
  ASSERT_FALSE(Dead(child));
  ASSERT_EQ(::kill(w.pid(), SIGKILL), 0);
  const auto killed = std::chrono::steady_clock::now();
  bool dead = false;
  while (!dead && std::chrono::steady_clock::now() - killed < std::chrono::seconds(1)) {
    dead = Dead(child);
    if (!dead) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - killed).count();
  EXPECT_TRUE(dead) << "the mint child " << child << " outlived its SIGKILLed worker by " << ms
                    << " ms";
  if (!dead) ::kill(child, SIGKILL);
}

// The private-directory root is a symlink an attacker planted towards a directory they read:
// the worker refuses that root (and says so), keeps its cells in a fresh private directory, and
// serves from the cell; nothing is ever written through the link.
TEST_F(HygieneEndToEnd, PlantedSymlinkAsPrivateRootIsRefused) {
  const std::string cache = root_ + "/w";
  std::string ref;
  ASSERT_TRUE(Mint(cache, "mlp", &ref));
  const std::string trap = root_ + "/attacker";
  const std::string planted = root_ + "/planted";
  std::filesystem::create_directories(trap);
  std::filesystem::create_directory_symlink(trap, planted);

  Worker w(cache, Manifest({}), {{"KILN_PRIVATE_ROOT", planted}});
  ASSERT_TRUE(w.Start());
  ASSERT_TRUE(w.WaitReady(60000)) << w.Log();
  const auto answer = w.Infer("mlp", MlpInput());
  EXPECT_EQ(answer.status, 200) << answer.body.dump();
  EXPECT_EQ(answer.mode(), "aot_cell") << answer.body.dump();
  EXPECT_NE(w.Log().find("private_dir_unsafe"), std::string::npos) << w.Log();
  EXPECT_NE(w.Log().find("is a symbolic link"), std::string::npos) << w.Log();
  EXPECT_TRUE(std::filesystem::is_empty(trap)) << "the worker wrote through the planted link";
  EXPECT_EQ(w.Stop(), 0);
  EXPECT_TRUE(std::filesystem::is_empty(trap));
}

// The same with a real directory that another user owns and anyone may write: refused too.
TEST_F(HygieneEndToEnd, PrivateRootOwnedByAnotherUserIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give a directory to another user";
  const std::string cache = root_ + "/w";
  std::string ref;
  ASSERT_TRUE(Mint(cache, "mlp", &ref));
  const std::string foreign = root_ + "/foreign";
  std::filesystem::create_directories(foreign);
  ASSERT_EQ(::chown(foreign.c_str(), 65534, 65534), 0);
  ASSERT_EQ(::chmod(foreign.c_str(), 0777), 0);

  Worker w(cache, Manifest({}), {{"KILN_PRIVATE_ROOT", foreign}});
  ASSERT_TRUE(w.Start());
  ASSERT_TRUE(w.WaitReady(60000)) << w.Log();
  EXPECT_EQ(w.Infer("mlp", MlpInput()).mode(), "aot_cell");
  EXPECT_NE(w.Log().find("belongs to uid 65534"), std::string::npos) << w.Log();
  EXPECT_TRUE(std::filesystem::is_empty(foreign));
  EXPECT_EQ(w.Stop(), 0);
}

}  // namespace
}  // namespace kiln
