// The real clock and the manual one (base layer; see clock.h).
#include "src/kiln/base/clock.h"

namespace kiln {
namespace {

class RealClock final : public Clock {
 public:
  TimePoint Now() const override { return std::chrono::steady_clock::now(); }
  int64_t UnixSeconds() const override {
    return std::chrono::duration_cast<std::chrono::seconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
};

}  // namespace

double Clock::MsSince(TimePoint start) const {
  return std::chrono::duration<double, std::milli>(Now() - start).count();
}

Clock* Clock::Real() {
  static RealClock* const clock = new RealClock();
  return clock;
}

ManualClock::ManualClock()
    : now_(std::chrono::steady_clock::now()),
      unix_ms_(std::chrono::duration_cast<std::chrono::milliseconds>(
          std::chrono::system_clock::now().time_since_epoch())) {}

Clock::TimePoint ManualClock::Now() const {
  std::lock_guard<std::mutex> lock(mu_);
  return now_;
}

int64_t ManualClock::UnixSeconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return std::chrono::duration_cast<std::chrono::seconds>(unix_ms_).count();
}

void ManualClock::Advance(std::chrono::milliseconds d) {
  std::lock_guard<std::mutex> lock(mu_);
  now_ += d;
  unix_ms_ += d;
}

void ManualClock::SetUnixSeconds(int64_t s) {
  std::lock_guard<std::mutex> lock(mu_);
  unix_ms_ = std::chrono::seconds(s);
}

double MsSince(Clock::TimePoint start) { return Clock::Real()->MsSince(start); }

}  // namespace kiln
