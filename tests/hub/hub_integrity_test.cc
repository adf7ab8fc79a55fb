// Damage is a refusal, never a miss, with real `kiln hub` processes on loopback: a garbled or
// truncated database refuses to start, a corrupted blob is quarantined (on a worker's report, on
// the schedule, at start) and repaired by a republish, /v1/ready tells a failing dependency from
// a live process, and a range past a blob's end is 416.
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <filesystem>
#include <random>
#include <thread>

#include "src/kiln/base/file.h"
#include "src/kiln/base/sha256.h"
#include "src/kiln/cell/pack.h"
#include "src/kiln/client/hub_client.h"
#include "src/kiln/hub/authz.h"
#include "tests/hub/hub_fixtures.h"
#include "tests/hub/hub_process.h"

namespace kiln {
namespace {

using hub_testing::Graph;
using hub_testing::HubProcess;
using hub_testing::kAdmin;
using hub_testing::kPlatform;
using hub_testing::kWorker;
using hub_testing::MakeCell;
using hub_testing::MakeMetadata;
using hub_testing::Nonce;

class HubIntegrityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = ::testing::TempDir() + "/kiln_hub_integrity_" + Nonce() + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_ + "/data");
    std::vector<TokenRow> tokens = {
        {Sha256Hex(kPlatform), "ci", "publisher", "platform", "", {}},
        {Sha256Hex(kWorker), "worker-1", "worker", "", "", {}},
        {Sha256Hex(kAdmin), "admin", "admin", "", "", {}},
    };
    ASSERT_TRUE(WriteSecretFileAtomic(root_ + "/tokens.json", TokensFileText(tokens)).ok());
  }
  void TearDown() override {
    if (!HasFailure()) std::filesystem::remove_all(root_);
  }
  // The fixtures' cells carry a fake shared object, not the build of their source: no rebuild.
  std::unique_ptr<HubProcess> Hub(std::vector<std::string> extra = {}) {
    extra.insert(extra.begin(), {"--rebuild", "off"});
    return std::make_unique<HubProcess>(root_ + "/data", "", std::move(extra));
  }
  std::string BlobPath(const std::string& digest) {
    return root_ + "/data/blobs/sha256/" + digest.substr(7);
  }
  // Flips bytes in the middle of a stored blob, as a bad disk would.
  void Damage(const std::string& path) {
    std::string bytes = ReadFile(path).value();
    for (size_t i = bytes.size() / 2; i < bytes.size() / 2 + 16 && i < bytes.size(); ++i) {
      bytes[i] = static_cast<char>(bytes[i] ^ 0x5a);
    }
    ASSERT_TRUE(WriteFileAtomic(path, bytes).ok());
  }
  std::string root_;
};

TEST_F(HubIntegrityTest, GarbledDatabaseRefusesToStartInsteadOfAnsweringMisses) {
  auto hub = Hub();
  ASSERT_TRUE(hub->Start());
  for (int i = 0; i < 60; ++i) {
    const CellMetadata m = MakeMetadata(Graph("garble" + std::to_string(i)));
    ASSERT_TRUE(hub->Client(kPlatform)->Publish(MakeCell(m), {}).ok());
  }
  hub->Kill(SIGTERM);
  const std::string db = root_ + "/data/hub.sqlite";
  const auto size = std::filesystem::file_size(db);
  {
    std::FILE* f = std::fopen(db.c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    std::mt19937 rng(11);
    std::fseek(f, 2 * 4096, SEEK_SET);
    for (uint64_t i = 2 * 4096; i < size; ++i) std::fputc(static_cast<int>(rng() & 0xff), f);
    std::fclose(f);
  }
  auto again = Hub();
  ::testing::AssertionResult started = again->Start();
  ASSERT_FALSE(started) << "a hub started on a garbled database";
  EXPECT_NE(std::string(started.message()).find("store_corrupt"), std::string::npos)
      << started.message();
}

TEST_F(HubIntegrityTest, TruncatedDatabaseRefusesToStartEmpty) {
  auto hub = Hub();
  ASSERT_TRUE(hub->Start());
  ASSERT_TRUE(hub->Client(kPlatform)->Publish(MakeCell(MakeMetadata(Graph("trunc"))), {}).ok());
  hub->Kill(SIGTERM);
  std::filesystem::resize_file(root_ + "/data/hub.sqlite", 0);
  std::filesystem::remove(root_ + "/data/hub.sqlite-wal");
  std::filesystem::remove(root_ + "/data/hub.sqlite-shm");
  auto again = Hub();
  ::testing::AssertionResult started = again->Start();
  ASSERT_FALSE(started) << "a hub started empty on a truncated database";
  EXPECT_NE(std::string(started.message()).find("truncated or replaced"), std::string::npos)
      << started.message();
}

// A worker's download does not hash to its digest; it reports it, the hub re-reads, quarantines,
// stops serving the damaged bytes, and the publisher's republish of the same cell repairs them:
// the same receipt, the right bytes.
TEST_F(HubIntegrityTest, CorruptedBlobIsQuarantinedOnReportAndRepairedByRepublish) {
  auto hub = Hub({"--blob-verify-interval", "0"});
  ASSERT_TRUE(hub->Start());
  const CellMetadata m = MakeMetadata(Graph("repair"));
  const std::string cell = MakeCell(m, std::string(200000, 'p'));
  PublishAnswer first = hub->Client(kPlatform)->Publish(cell, {});
  ASSERT_TRUE(first.ok()) << first.token << ": " << first.message;
  const std::string digest = CellDigest(cell);
  Damage(BlobPath(digest));

  auto worker = hub->Client(kWorker);
  const std::string dest = root_ + "/fetched.tar";
  // The worker's own digest check refuses the bytes and reports them; the hub quarantines.
  HubAnswer f = worker->FetchBlob(digest, dest, cell.size());
  ASSERT_EQ(f.token, "digest_mismatch") << f.message;
  EXPECT_NE(f.message.find("the hub quarantined its damaged copy"), std::string::npos) << f.message;
  EXPECT_FALSE(std::filesystem::exists(dest));
  EXPECT_FALSE(std::filesystem::exists(BlobPath(digest)));
  EXPECT_FALSE(std::filesystem::is_empty(root_ + "/data/blobs/quarantine"));
  std::filesystem::remove(dest);
  HubAnswer gone = worker->FetchBlob(digest, dest, cell.size());
  EXPECT_EQ(gone.http_status, 404) << gone.token << ": " << gone.message;

  PublishAnswer republish = hub->Client(kPlatform)->Publish(cell, {});
  ASSERT_TRUE(republish.ok()) << republish.token << ": " << republish.message;
  EXPECT_TRUE(republish.already);
  EXPECT_EQ(republish.receipt, first.receipt);
  std::filesystem::remove(dest);
  HubAnswer repaired = worker->FetchBlob(digest, dest, cell.size());
  ASSERT_TRUE(repaired.ok()) << repaired.token << ": " << repaired.message;
  EXPECT_EQ(ReadFile(dest).value(), cell);

  // An intact blob reported by a confused worker stays where it is.
  HubAnswer intact = worker->Call("POST", "/v1/blobs/" + digest + "/verify", "{}");
  ASSERT_TRUE(intact.ok());
  EXPECT_EQ(intact.body["intact"], true);
}

// Damage done while the hub was down is found by the pass that runs at start; damage done while
// it runs, by the next scheduled pass.
TEST_F(HubIntegrityTest, ScheduledVerificationQuarantinesAtStartAndWhileRunning) {
  const CellMetadata a = MakeMetadata(Graph("sched-a")), b = MakeMetadata(Graph("sched-b"));
  const std::string cell_a = MakeCell(a, std::string(50000, 'a'));
  const std::string cell_b = MakeCell(b, std::string(50000, 'b'));
  {
    auto hub = Hub({"--blob-verify-interval", "0"});
    ASSERT_TRUE(hub->Start());
    ASSERT_TRUE(hub->Client(kPlatform)->Publish(cell_a, {}).ok());
    ASSERT_TRUE(hub->Client(kPlatform)->Publish(cell_b, {}).ok());
  }
  Damage(BlobPath(CellDigest(cell_a)));
  auto hub = Hub({"--blob-verify-interval", "1"});
  ASSERT_TRUE(hub->Start());
  auto wait_gone = [&](const std::string& digest) {
    for (int i = 0; i < 200; ++i) {
      if (!std::filesystem::exists(BlobPath(digest))) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  };
  EXPECT_TRUE(wait_gone(CellDigest(cell_a))) << hub->Log();
  EXPECT_TRUE(std::filesystem::exists(BlobPath(CellDigest(cell_b))));
  Damage(BlobPath(CellDigest(cell_b)));
  EXPECT_TRUE(wait_gone(CellDigest(cell_b))) << hub->Log();
  EXPECT_NE(hub->Log().find("quarantined"), std::string::npos);
}

// Liveness says the process answers; readiness says it can do its job. A disk below the floor
// and a blob store that cannot be written each make /v1/ready 503 naming the check, while
// /v1/health stays 200.
TEST_F(HubIntegrityTest, ReadyNamesTheFailingDependencyWhileHealthStaysLive) {
  {
    auto hub = Hub();
    ASSERT_TRUE(hub->Start());
    HubAnswer ready = hub->Client("")->Call("GET", "/v1/ready");
    ASSERT_TRUE(ready.ok()) << ready.token << ": " << ready.message;
    EXPECT_EQ(ready.body["ready"], true);
    EXPECT_EQ(ready.body["checks"]["store"]["ok"], true);
  }
  {
    auto hub = Hub({"--min-free-bytes", "1000000000000000000"});
    ASSERT_TRUE(hub->Start());
    HubAnswer ready = hub->Client("")->Call("GET", "/v1/ready");
    EXPECT_EQ(ready.http_status, 503);
    EXPECT_EQ(ready.token, "not_ready");
    EXPECT_EQ(ready.body["checks"]["disk"]["error"], "disk_low") << ready.body.dump();
    EXPECT_EQ(ready.body["checks"]["store"]["ok"], true);
    EXPECT_TRUE(hub->Client("")->Call("GET", "/v1/health").ok());
  }
  {
    auto hub = Hub();
    ASSERT_TRUE(hub->Start());
    // Where uploads are staged is no longer a directory: nothing can be written.
    const std::string tmp = root_ + "/data/blobs/tmp";
    std::filesystem::remove_all(tmp);
    ASSERT_TRUE(WriteFileAtomic(tmp, "not a directory").ok());
    HubAnswer ready = hub->Client("")->Call("GET", "/v1/ready");
    EXPECT_EQ(ready.http_status, 503);
    EXPECT_EQ(ready.body["checks"]["blobs_writable"]["ok"], false) << ready.body.dump();
    EXPECT_TRUE(hub->Client("")->Call("GET", "/v1/health").ok());
  }
}

// RFC 9110: a range that starts past the end is 416 with the representation's length, never a
// 206 with a wrapped-around Content-Length; a satisfiable range still gets its 206.
TEST_F(HubIntegrityTest, RangePastTheEndIs416) {
  auto hub = Hub();
  ASSERT_TRUE(hub->Start());
  const CellMetadata m = MakeMetadata(Graph("range"));
  const std::string cell = MakeCell(m);
  ASSERT_TRUE(hub->Client(kPlatform)->Publish(cell, {}).ok());
  const std::string path = "/v1/blobs/" + CellDigest(cell);
  httplib::Client http("127.0.0.1", hub->port());
  const httplib::Headers auth = {{"Authorization", std::string("Bearer ") + kWorker}};
  for (const std::string& range :
       std::vector<std::string>{"bytes=999999999-", "bytes=" + std::to_string(cell.size()) + "-",
                                std::string("bytes=-0")}) {
    httplib::Headers h = auth;
    h.emplace("Range", range);
    auto r = http.Get(path, h);
    ASSERT_TRUE(r) << range;
    EXPECT_EQ(r->status, 416) << range << ": " << r->body;
    EXPECT_EQ(r->get_header_value("Content-Range"), "bytes */" + std::to_string(cell.size()))
        << range;
  }
  httplib::Headers h = auth;
  h.emplace("Range", "bytes=10-19");
  auto r = http.Get(path, h);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 206);
  EXPECT_EQ(r->body, cell.substr(10, 10));
}

}  // namespace
}  // namespace kiln
