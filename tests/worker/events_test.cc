// Tests for worker event rows (src/kiln/worker/events.h): the process-monotonic seq shared by
// every log, the bounded ring and its queries, and the JSON-lines file flushed per row.
#include "src/kiln/worker/events.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace kiln {
namespace {

EventRow Row(const std::string& kind, const std::string& phase, const std::string& target = "t") {
  EventRow r;
  r.kind = kind;
  r.phase = phase;
  r.target = target;
  r.detail = "target=" + target;
  return r;
}

std::vector<std::string> ReadLines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

TEST(Events, KindsAreDesignVocabulary) {
  EXPECT_EQ(EventKinds().size(), 24u);
  EXPECT_TRUE(IsKnownEventKind("hub_order"));
  EXPECT_TRUE(IsKnownEventKind("cell_reinstated"));
  EXPECT_TRUE(IsKnownEventKind("local_cell_evicted"));
  EXPECT_TRUE(IsKnownEventKind("cell_crashed"));
  EXPECT_TRUE(IsKnownEventKind(event_kind::kServeDegrade));
  EXPECT_TRUE(IsKnownEventKind("boot_adopt"));
  EXPECT_FALSE(IsKnownEventKind("serve_degraded"));
}

TEST(Events, SeqIsSharedByEveryLogAndStrictlyIncreasing) {
  EventLog a, b;
  const uint64_t s1 = a.Append(Row(event_kind::kBootAdopt, "hit"));
  const uint64_t s2 = b.Append(Row(event_kind::kBootAdopt, "miss"));
  const uint64_t s3 = a.Append(Row(event_kind::kCellOom, "stay_armed"));
  EXPECT_LT(s1, s2);
  EXPECT_LT(s2, s3);
  EXPECT_EQ(a.last_seq(), s3);
  EXPECT_EQ(b.last_seq(), s2);
}

TEST(Events, ConcurrentAppendsKeepTheRingInSeqOrder) {
  EventLog log(100000);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&log] {
      for (int i = 0; i < 500; ++i) log.Append(Row(event_kind::kServePosture, "x"));
    });
  }
  for (auto& t : threads) t.join();
  auto rows = log.Query({});
  ASSERT_EQ(rows.size(), 4000u);
  for (size_t i = 1; i < rows.size(); ++i) ASSERT_LT(rows[i - 1].seq, rows[i].seq);
}

TEST(Events, QueryFiltersAndRingIsBounded) {
  EventLog log(3);
  const uint64_t first = log.Append(Row(event_kind::kBootAdopt, "hit", "a"));
  log.Append(Row(event_kind::kServeDegrade, "cell_fault", "a"));
  const uint64_t third = log.Append(Row(event_kind::kBootAdopt, "miss", "b"));
  log.Append(Row(event_kind::kBootAdopt, "hit", "b"));
  EXPECT_EQ(log.dropped(), 1u);
  auto all = log.Query({});
  ASSERT_EQ(all.size(), 3u);
  EXPECT_GT(all.front().seq, first) << "the oldest row should have left the ring";

  EventQuery by_kind;
  by_kind.kind = event_kind::kBootAdopt;
  EXPECT_EQ(log.Query(by_kind).size(), 2u);
  EventQuery by_phase;
  by_phase.phase = "cell_fault";
  ASSERT_EQ(log.Query(by_phase).size(), 1u);
  EXPECT_EQ(log.Query(by_phase)[0].kind, event_kind::kServeDegrade);
  EventQuery since;
  since.since_seq = third;
  ASSERT_EQ(log.Query(since).size(), 1u);
  EXPECT_EQ(log.Query(since)[0].phase, "hit");
  EventQuery limited;
  limited.limit = 2;
  auto two = log.Query(limited);
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[1].seq, third) << "limit keeps the oldest matching rows (paging with since_seq)";
  EventQuery by_target;
  by_target.target = "b";
  EXPECT_EQ(log.Query(by_target).size(), 2u);
}

TEST(Events, JsonLinesFileGetsEveryRowFlushed) {
  const std::string dir = ::testing::TempDir() + "kiln-events-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/events.jsonl";
  std::filesystem::remove(path);
  EventLog log(1);  // the file keeps rows the ring drops
  ASSERT_TRUE(log.SetPath(path).ok());
  EventRow r = Row(event_kind::kServeDegrade, "cell_fault");
  r.ref = "ck1-abc@sha256:00";
  r.key = "ck1-abc";
  r.fn = "mlp";
  r.duration_ms = 1.5;
  r.detail = "quote \" and newline \n and bad utf8 \xff";
  const uint64_t s1 = log.Append(r);
  const uint64_t s2 = log.Append(Row(event_kind::kCellOom, "stay_armed"));
  // Flushed per row: readable now, while the log is still open.
  auto lines = ReadLines(path);
  ASSERT_EQ(lines.size(), 2u);
  auto j = nlohmann::json::parse(lines[0]);
  EXPECT_EQ(j["seq"].get<uint64_t>(), s1);
  EXPECT_EQ(j["kind"], "serve_degrade");
  EXPECT_EQ(j["phase"], "cell_fault");
  EXPECT_EQ(j["ref"], "ck1-abc@sha256:00");
  EXPECT_EQ(j["key"], "ck1-abc");
  EXPECT_EQ(j["fn"], "mlp");
  EXPECT_EQ(j["target"], "t");
  EXPECT_DOUBLE_EQ(j["duration_ms"].get<double>(), 1.5);
  EXPECT_GT(j["ts_ms"].get<int64_t>(), 0);
  EXPECT_EQ(nlohmann::json::parse(lines[1])["seq"].get<uint64_t>(), s2);
  EXPECT_EQ(lines[0].find('\n'), std::string::npos);
  EXPECT_EQ(lines[0].rfind("{\"seq\":", 0), 0u) << lines[0];

  EXPECT_FALSE(log.SetPath(dir + "/no/such/dir/events.jsonl").ok());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kiln
