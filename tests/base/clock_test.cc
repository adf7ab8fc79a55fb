// Tests for the clock seam (base layer): the manual clock moves only when told, both readings
// together, and its wall reading may be stepped alone.
#include "src/kiln/base/clock.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <thread>

namespace kiln {
namespace {

TEST(ManualClock, MovesOnlyWhenTold) {
  ManualClock clock;
  const Clock::TimePoint start = clock.Now();
  const int64_t unix_start = clock.UnixSeconds();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(clock.Now(), start);
  EXPECT_EQ(clock.MsSince(start), 0.0);
  clock.Advance(std::chrono::seconds(2));
  EXPECT_DOUBLE_EQ(clock.MsSince(start), 2000.0);
  EXPECT_EQ(clock.UnixSeconds() - unix_start, 2);
}

TEST(ManualClock, StartsAtTheRealReadingsAndSteppingTheWallLeavesTheMonotonicOne) {
  ManualClock clock;
  EXPECT_LE(std::abs(clock.UnixSeconds() - Clock::Real()->UnixSeconds()), 1);
  const Clock::TimePoint before = clock.Now();
  clock.SetUnixSeconds(1000);
  EXPECT_EQ(clock.UnixSeconds(), 1000);
  EXPECT_EQ(clock.Now(), before);
}

TEST(RealClock, IsMonotonic) {
  const Clock::TimePoint a = Clock::Real()->Now();
  const Clock::TimePoint b = Clock::Real()->Now();
  EXPECT_LE(a, b);
  EXPECT_GE(MsSince(a), 0.0);
}

}  // namespace
}  // namespace kiln
