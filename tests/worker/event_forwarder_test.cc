// Tests for the event forwarder (src/kiln/worker/event_forwarder.h) against a real `kiln hub`
// process on loopback: rows arrive in seq order with their fields; a hub that is down at first
// receives every row once it starts; the queue bound drops the oldest rows and counts them.
#include "src/kiln/worker/event_forwarder.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "src/kiln/base/file.h"
#include "src/kiln/base/sha256.h"
#include "tests/hub/hub_process.h"

namespace kiln {
namespace {

using hub_testing::HubProcess;
using hub_testing::kWorker;
using hub_testing::ReservedPort;

class Forwarder : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kiln-forwarder-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    ASSERT_TRUE(MakeDirs(root_ + "/hub/data").ok());
    nlohmann::json tokens = {
        {"tokens", {{{"name", "worker-1"}, {"role", "worker"}, {"sha256", Sha256Hex(kWorker)}}}}};
    ASSERT_TRUE(WriteSecretFileAtomic(root_ + "/hub/tokens.json", tokens.dump(2)).ok());
    hub_ = std::make_unique<HubProcess>(root_ + "/hub/data", "");
  }
  void TearDown() override {
    hub_.reset();
    std::error_code ec;
    if (!HasFailure()) std::filesystem::remove_all(root_, ec);
  }
  std::unique_ptr<HubClient> ClientFor(int port) {
    HubClientOptions o;
    o.url = "http://127.0.0.1:" + std::to_string(port);
    o.token = kWorker;
    o.connect_timeout_s = 1;
    o.io_timeout_s = 5;
    return HubClient::Create(o).value();
  }
  // The hub's rows for `worker`, oldest first.
  nlohmann::json HubRows(const std::string& worker) {
    HubAnswer a = hub_->Client(kWorker)->Call("GET", "/v1/events?worker=" + worker + "&limit=1000");
    EXPECT_TRUE(a.ok()) << a.token << ": " << a.message;
    if (!a.ok() || !a.body.is_object()) return nlohmann::json::array();
    nlohmann::json rows = a.body.value("events", nlohmann::json::array());
    std::reverse(rows.begin(), rows.end());  // the hub answers newest first
    return rows;
  }
  EventRow Row(const std::string& kind, const std::string& phase) {
    EventRow r;
    r.kind = kind;
    r.phase = phase;
    r.target = "mlp";
    r.key = "ck1-test";
    r.duration_ms = 1.5;
    r.detail = "why=test";
    r.ref = "ck1-test@sha256:d";
    r.stages = {{"key", 0.5}, {"resolve", 1.0}};
    return r;
  }

  std::string root_;
  std::unique_ptr<HubProcess> hub_;
};

TEST_F(Forwarder, RowsReachTheHubInSeqOrderWithTheirFields) {
  ASSERT_TRUE(hub_->Start());
  EventLog log;
  EventForwarderOptions o;
  o.worker = "w-order";
  EventForwarder fwd(ClientFor(hub_->port()), o);
  fwd.Attach(log);
  const uint64_t s1 = log.Append(Row("boot_adopt", "hit"));
  const uint64_t s2 = log.Append(Row("serve_posture", "aot_cell"));
  const uint64_t s3 = log.Append(Row("cell_oom", "stay_armed"));
  EXPECT_EQ(fwd.Stop(std::chrono::milliseconds(5000)), 0u);
  EXPECT_EQ(fwd.stats().posted, 3u);
  nlohmann::json rows = HubRows("worker-1/w-order");
  ASSERT_EQ(rows.size(), 3u) << rows.dump();
  const uint64_t seqs[] = {s1, s2, s3};
  const char* kinds[] = {"boot_adopt", "serve_posture", "cell_oom"};
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(rows[i]["seq"].get<uint64_t>(), seqs[i]);
    EXPECT_EQ(rows[i]["kind"], kinds[i]);
    EXPECT_EQ(rows[i]["key"], "ck1-test");
    EXPECT_EQ(rows[i]["duration_ms"].get<double>(), 1.5);
    EXPECT_NE(rows[i]["detail"].get<std::string>().find("target=mlp"), std::string::npos)
        << rows[i].dump();
    // The structured fields reach the hub as fields, not only as words in the detail.
    EXPECT_EQ(rows[i]["target"], "mlp") << rows[i].dump();
    EXPECT_EQ(rows[i]["ref"], "ck1-test@sha256:d");
    ASSERT_EQ(rows[i]["stages"].size(), 2u) << rows[i].dump();
    EXPECT_EQ(rows[i]["stages"][1]["stage"], "resolve");
    EXPECT_EQ(rows[i]["stages"][1]["ms"].get<double>(), 1.0);
  }
  // Stopped: later rows are not forwarded (the sink is detached).
  log.Append(Row("boot_adopt", "miss"));
  EXPECT_EQ(HubRows("worker-1/w-order").size(), 3u);
}

TEST_F(Forwarder, AHubThatIsDownLosesNoRowAndGetsThemWhenItStarts) {
  ReservedPort reserved;
  const int port = reserved.port();
  EventLog log;
  EventForwarderOptions o;
  o.worker = "w-late";
  o.initial_backoff_s = 0.05;
  o.max_backoff_s = 0.2;
  o.flush_interval_s = 0.05;
  EventForwarder fwd(ClientFor(port), o);
  fwd.Attach(log);
  for (int i = 0; i < 40; ++i) log.Append(Row("ingress_refused", "out_of_envelope"));
  // The hub is not there: the rows wait, the failures count.
  for (int i = 0; i < 100 && fwd.stats().failures == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EventForwarderStats down = fwd.stats();
  EXPECT_GT(down.failures, 0u);
  EXPECT_EQ(down.posted, 0u);
  EXPECT_EQ(down.queued, 40u);
  EXPECT_FALSE(down.last_error.empty());

  reserved.Release();
  ASSERT_TRUE(hub_->Start(port));
  log.Append(Row("boot_adopt", "hit"));
  for (int i = 0; i < 500 && fwd.stats().posted < 41; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EventForwarderStats up = fwd.stats();
  EXPECT_EQ(up.posted, 41u);
  EXPECT_EQ(up.queued, 0u);
  EXPECT_EQ(up.dropped, 0u);
  EXPECT_TRUE(up.last_error.empty()) << up.last_error;
  nlohmann::json rows = HubRows("worker-1/w-late");
  ASSERT_EQ(rows.size(), 41u);
  for (size_t i = 1; i < rows.size(); ++i) {
    EXPECT_GT(rows[i]["seq"].get<uint64_t>(), rows[i - 1]["seq"].get<uint64_t>());
  }
  EXPECT_EQ(rows.back()["kind"], "boot_adopt");
  EXPECT_EQ(fwd.Stop(std::chrono::milliseconds(1000)), 0u);
}

TEST_F(Forwarder, TheQueueBoundDropsTheOldestRowsAndCountsThem) {
  EventLog log;
  EventForwarderOptions o;
  o.max_queued = 2;
  o.initial_backoff_s = 10;  // one failed post, then wait: nothing else drains the queue
  ReservedPort nobody;
  EventForwarder fwd(ClientFor(nobody.port()), o);
  fwd.Attach(log);
  for (int i = 0; i < 5; ++i) log.Append(Row("serve_degrade", "cell_fault"));
  EventForwarderStats s = fwd.stats();
  EXPECT_EQ(s.dropped, 3u);
  EXPECT_EQ(s.queued, 2u);
  EXPECT_EQ(fwd.Stop(std::chrono::milliseconds(200)), 2u);
}

}  // namespace
}  // namespace kiln
