// Tests of the crash guard's markers and quarantine (src/kiln/worker/crash_guard.h): a marker
// left by a process that is gone quarantines its ref, one of a live process does not, and a
// damaged marker is dropped. The serving side (the marker around a first call, the install
// refusal) is in serving_test.cc; the whole story with real processes in crash_e2e_test.cc.
#include "src/kiln/worker/crash_guard.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "src/kiln/base/file.h"

namespace kiln {
namespace {

const std::string kRef = "ck1-" + std::string(56, 'c') + "@sha256:" + std::string(64, 'd');
const std::string kOtherRef = "ck1-" + std::string(56, 'e') + "@sha256:" + std::string(64, 'f');

class CrashGuardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = "/tmp/kiln-crash-guard-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(root_, ec);
  }
  size_t Markers() const {
    size_t n = 0;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(root_ + "/.crash/markers", ec)) {
      (void)e;
      ++n;
    }
    return n;
  }
  std::string root_;
};

TEST_F(CrashGuardTest, AMarkerOfADeadProcessQuarantinesItsRefOnce) {
  // A child arms and dies inside "the call": it never disarms.
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    CrashGuard g(root_);
    ::_exit(g.Arm(kRef, "mlp").ok() ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  ASSERT_EQ(Markers(), 1u);

  CrashGuard guard(root_);
  EXPECT_FALSE(guard.IsQuarantined(kRef));
  const std::vector<CrashMarker> dead = guard.Recover();
  ASSERT_EQ(dead.size(), 1u);
  EXPECT_EQ(dead[0].ref, kRef);
  EXPECT_EQ(dead[0].target, "mlp");
  EXPECT_EQ(dead[0].pid, child);
  EXPECT_TRUE(guard.IsQuarantined(kRef));
  EXPECT_FALSE(guard.IsQuarantined(kOtherRef));
  EXPECT_EQ(Markers(), 0u);
  // Persisted: a later process sees it, and nothing is reported twice.
  CrashGuard later(root_);
  EXPECT_TRUE(later.IsQuarantined(kRef));
  EXPECT_TRUE(later.Recover().empty());
}

TEST_F(CrashGuardTest, AQuarantineThatCannotBeWrittenHoldsForTheProcessAndTheMarkerStays) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    CrashGuard g(root_);
    ::_exit(g.Arm(kRef, "mlp").ok() ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  // A file where the quarantine directory goes: the write fails (whoever runs the test).
  ASSERT_TRUE(WriteFileAtomic(root_ + "/.crash/quarantine", "in the way").ok());
  CrashGuard guard(root_);
  EXPECT_EQ(guard.Recover().size(), 1u);
  EXPECT_TRUE(guard.IsQuarantined(kRef));  // this process still refuses it
  EXPECT_EQ(Markers(), 1u);                // and the next boot tries again
  std::filesystem::remove(root_ + "/.crash/quarantine");
  CrashGuard next(root_);
  EXPECT_FALSE(next.IsQuarantined(kRef));
  EXPECT_EQ(next.Recover().size(), 1u);
  EXPECT_TRUE(next.IsQuarantined(kRef));
  EXPECT_EQ(Markers(), 0u);
}

TEST_F(CrashGuardTest, AMarkerOfALiveProcessIsLeftAloneAndDisarmRemovesIt) {
  CrashGuard mine(root_);
  ASSERT_TRUE(mine.Arm(kRef, "mlp").ok());
  CrashGuard other(root_);  // another worker sharing the store root, booting now
  EXPECT_TRUE(other.Recover().empty());
  EXPECT_FALSE(other.IsQuarantined(kRef));
  EXPECT_EQ(Markers(), 1u);
  mine.Disarm(kRef, "mlp");
  EXPECT_EQ(Markers(), 0u);
  ASSERT_TRUE(mine.Arm(kOtherRef, "mlp").ok());
  mine.DisarmAll();  // a clean exit
  EXPECT_EQ(Markers(), 0u);
}

TEST_F(CrashGuardTest, AReusedPidIsAnotherProcess) {
  // This process's own pid, but another start time: the process that wrote it is gone.
  ASSERT_TRUE(MakeDirs(root_ + "/.crash/markers").ok());
  CrashGuard probe(root_);
  ASSERT_TRUE(probe.Arm(kOtherRef, "probe").ok());
  std::string boot_id;
  for (const auto& e : std::filesystem::directory_iterator(root_ + "/.crash/markers")) {
    auto j = nlohmann::json::parse(*ReadFile(e.path().string()));
    boot_id = j.value("boot_id", "");
  }
  probe.Disarm(kOtherRef, "probe");
  nlohmann::json marker = {{"ref", kRef},  {"target", "mlp"},    {"pid", ::getpid()},
                           {"start", "1"}, {"boot_id", boot_id}, {"at_ms", 1}};
  ASSERT_TRUE(WriteFileAtomic(root_ + "/.crash/markers/reused.json", marker.dump()).ok());
  CrashGuard guard(root_);
  EXPECT_EQ(guard.Recover().size(), 1u);
  EXPECT_TRUE(guard.IsQuarantined(kRef));
}

TEST_F(CrashGuardTest, ADamagedMarkerIsDroppedAndQuarantinesNothing) {
  ASSERT_TRUE(MakeDirs(root_ + "/.crash/markers").ok());
  ASSERT_TRUE(WriteFileAtomic(root_ + "/.crash/markers/1-0.json", "{\"ref\": \"no").ok());
  ASSERT_TRUE(
      WriteFileAtomic(root_ + "/.crash/markers/2-0.json", R"({"ref":"../../etc","pid":2})").ok());
  CrashGuard guard(root_);
  EXPECT_TRUE(guard.Recover().empty());
  EXPECT_EQ(Markers(), 0u);
  EXPECT_FALSE(guard.IsQuarantined("../../etc"));
  CrashMarker bad;
  bad.ref = "../../etc";
  EXPECT_FALSE(guard.Quarantine(bad).ok());
}

}  // namespace
}  // namespace kiln
