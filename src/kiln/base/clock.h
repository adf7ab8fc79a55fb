// Time as a seam (base layer), the way leveldb's Env abstracts it: code that measures a span,
// judges an age or waits out a bound reads a Clock, so a test can move time instead of sleeping
// through it. Clock::Real() is the process's clock; ManualClock moves only when told.
//
// Two readings, because they answer different questions:
//   Now()          monotonic (never goes back): spans, deadlines, backoffs, stage timings
//   UnixSeconds()  wall clock: compared with timestamps another machine signed (a revocation
//                  list's or a receipt's issued-at)
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>

namespace kiln {

class Clock {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;

  Clock() = default;
  virtual ~Clock() = default;
  Clock(const Clock&) = delete;
  Clock& operator=(const Clock&) = delete;

  // The monotonic reading. Any thread.
  virtual TimePoint Now() const = 0;
  // Seconds since the Unix epoch. Any thread.
  virtual int64_t UnixSeconds() const = 0;

  // Milliseconds from `start` (an earlier Now() of this clock) to Now().
  double MsSince(TimePoint start) const;

  // The process's clock: std::chrono::steady_clock and system_clock. Never destroyed.
  static Clock* Real();
};

// A clock for tests: it starts at the real clock's readings and moves only when told. Any thread.
class ManualClock final : public Clock {
 public:
  ManualClock();
  TimePoint Now() const override;
  int64_t UnixSeconds() const override;

  // Moves both readings forward by `d`.
  void Advance(std::chrono::milliseconds d);
  // Sets the wall reading alone, as a wall clock that is stepped may jump (the monotonic reading
  // never goes back).
  void SetUnixSeconds(int64_t s);

 private:
  mutable std::mutex mu_;
  TimePoint now_;
  std::chrono::milliseconds unix_ms_;
};

// Milliseconds since `start` on the real monotonic clock: what a stage or a call took.
double MsSince(Clock::TimePoint start);

}  // namespace kiln
