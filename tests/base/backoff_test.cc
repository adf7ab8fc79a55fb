// Retry delays with jitter (base/backoff.h): the step bounds every wait, half of it is a floor,
// and a fleet's first retries spread over the step instead of falling in one instant.
#include "src/kiln/base/backoff.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <thread>
#include <vector>

namespace kiln {
namespace {

using std::chrono::milliseconds;

TEST(Backoff, StepDoublesToTheCapAndNeverOverflows) {
  EXPECT_EQ(BackoffStep(milliseconds(250), milliseconds(5000), 0), milliseconds(250));
  EXPECT_EQ(BackoffStep(milliseconds(250), milliseconds(5000), 1), milliseconds(500));
  EXPECT_EQ(BackoffStep(milliseconds(250), milliseconds(5000), 4), milliseconds(4000));
  EXPECT_EQ(BackoffStep(milliseconds(250), milliseconds(5000), 5), milliseconds(5000));
  EXPECT_EQ(BackoffStep(milliseconds(250), milliseconds(5000), 1 << 30), milliseconds(5000));
  EXPECT_EQ(BackoffStep(milliseconds(0), milliseconds(0), 3), milliseconds(1));
}

TEST(Backoff, EveryDelayLiesInTheUpperHalfOfItsStep) {
  std::mt19937_64 rng(7);
  for (int attempt = 0; attempt < 12; ++attempt) {
    const int64_t step = BackoffStep(milliseconds(1000), milliseconds(60000), attempt).count();
    for (int i = 0; i < 200; ++i) {
      const int64_t d =
          JitteredBackoff(milliseconds(1000), milliseconds(60000), attempt, rng).count();
      EXPECT_GE(d, step - step / 2) << "attempt " << attempt;
      EXPECT_LE(d, step) << "attempt " << attempt;
    }
  }
}

// 1,000 workers that lost the hub at the same moment, each with its own generator (as each
// process seeds its own): their first retries spread over [500, 1000] ms. With no jitter all
// 1,000 would fall on one millisecond; here no 50 ms slice holds more than a fifth of them.
TEST(Backoff, AFleetsFirstRetriesSpreadOverTheStep) {
  std::vector<int> per_slice(11, 0);
  std::set<int64_t> distinct;
  for (uint64_t worker = 0; worker < 1000; ++worker) {
    std::mt19937_64 rng(0x9e3779b97f4a7c15ULL * (worker + 1));
    const int64_t d = JitteredBackoff(milliseconds(1000), milliseconds(60000), 0, rng).count();
    ASSERT_GE(d, 500);
    ASSERT_LE(d, 1000);
    ++per_slice[static_cast<size_t>((d - 500) / 50)];
    distinct.insert(d);
  }
  EXPECT_LE(*std::max_element(per_slice.begin(), per_slice.end()), 200);
  EXPECT_GE(distinct.size(), 300u);
}

TEST(Backoff, TwoThreadsDrawDifferentSequences) {
  std::vector<int64_t> a, b;
  auto draw = [](std::vector<int64_t>* out) {
    for (int i = 0; i < 8; ++i) {
      out->push_back(JitteredBackoff(milliseconds(1000), milliseconds(60000), 3).count());
    }
  };
  std::thread ta(draw, &a), tb(draw, &b);
  ta.join();
  tb.join();
  EXPECT_NE(a, b);
}

}  // namespace
}  // namespace kiln
