// Retry delays with jitter (base layer; see backoff.h).
#include "src/kiln/base/backoff.h"

#include <algorithm>

namespace kiln {

std::chrono::milliseconds BackoffStep(std::chrono::milliseconds initial,
                                      std::chrono::milliseconds max, int attempt) {
  const int64_t cap = std::max<int64_t>(1, max.count());
  int64_t step = std::clamp<int64_t>(initial.count(), 1, cap);
  for (int i = 0; i < attempt && step < cap; ++i) step = std::min(cap, step * 2);
  return std::chrono::milliseconds(step);
}

std::chrono::milliseconds JitteredBackoff(std::chrono::milliseconds initial,
                                          std::chrono::milliseconds max, int attempt,
                                          std::mt19937_64& rng) {
  const int64_t step = BackoffStep(initial, max, attempt).count();
  std::uniform_int_distribution<int64_t> draw(step - step / 2, step);
  return std::chrono::milliseconds(draw(rng));
}

std::chrono::milliseconds JitteredBackoff(std::chrono::milliseconds initial,
                                          std::chrono::milliseconds max, int attempt) {
  thread_local std::mt19937_64 rng{[] {
    std::random_device entropy;
    return (static_cast<uint64_t>(entropy()) << 32) ^ entropy();
  }()};
  return JitteredBackoff(initial, max, attempt, rng);
}

}  // namespace kiln
