// End-to-end tests of the hub as users run it: real `kiln hub` processes on loopback, driven
// through kiln's own HubClient (and raw sockets where a client would be too polite), on SQLite
// and — when KILN_TEST_PG_URL is set (tools/pg.sh) — on PostgreSQL with two hub processes
// sharing one database; and with `--blobs s3://…` on the radosgw CTest starts (tools/s3.sh), the
// same suite with cell bytes in an S3 bucket, checked from outside with awscli. The binary is
// $KILN_HUB_BINARY if set, else the built `kiln`.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "src/kiln/base/canonical_json.h"
#include "src/kiln/base/file.h"
#include "src/kiln/base/sha256.h"
#include "src/kiln/cell/pack.h"
#include "src/kiln/client/hub_client.h"
#include "src/kiln/hub/authz.h"
#include "src/kiln/hub/s3_blob_store.h"
#include "src/kiln/hub/store.h"
#include "tests/hub/hub_fixtures.h"
#include "tests/hub/hub_process.h"
#include "tests/hub/one_publish_race.h"
#include "tests/hub/pg_test_db.h"
#include "tests/hub/s3_test_env.h"

namespace kiln {
namespace {

using hub_testing::Binary;
using hub_testing::FreePort;
using hub_testing::Graph;
using hub_testing::HubProcess;
using hub_testing::kAcme;
using hub_testing::kAdmin;
using hub_testing::kPlatform;
using hub_testing::kWorker;
using hub_testing::MakeCell;
using hub_testing::MakeMetadata;
using hub_testing::Nonce;

// A scraper's token: role metrics, GET /metrics only.
constexpr const char* kScraper = "tok-metrics-scraper";

// One plain HTTP/1.1 GET on loopback (Connection: close): the status and the body as sent. For
// answers that are not JSON (HubClient parses every answer as JSON).
std::pair<int, std::string> RawGet(int port, const std::string& path, const std::string& token) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return {-1, "connect failed"};
  }
  std::string req = "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
  if (!token.empty()) req += "Authorization: Bearer " + token + "\r\n";
  req += "\r\n";
  if (::send(fd, req.data(), req.size(), 0) != static_cast<ssize_t>(req.size())) {
    ::close(fd);
    return {-1, "send failed"};
  }
  std::string got;
  char buf[16384];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof(buf), 0)) > 0;) got.append(buf, n);
  ::close(fd);
  const size_t head_end = got.find("\r\n\r\n");
  if (got.rfind("HTTP/1.1 ", 0) != 0 || head_end == std::string::npos) return {-1, got};
  return {std::stoi(got.substr(9, 3)), got.substr(head_end + 4)};
}

// Prometheus text: sample values by series ("name{labels}"), and a check that every sample's
// family has its HELP and TYPE lines before it.
std::map<std::string, double> ParseExposition(const std::string& text, std::string* error) {
  std::map<std::string, double> out;
  std::set<std::string> help, typed;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("# HELP ", 0) == 0) {
      help.insert(line.substr(7, line.find(' ', 7) - 7));
      continue;
    }
    if (line.rfind("# TYPE ", 0) == 0) {
      const std::string name = line.substr(7, line.find(' ', 7) - 7);
      if (help.count(name) == 0) *error += "TYPE before HELP: " + name + "\n";
      typed.insert(name);
      continue;
    }
    if (line.empty() || line[0] == '#') continue;
    const size_t sp = line.rfind(' ');
    const std::string series = line.substr(0, sp);
    std::string family = series.substr(0, series.find('{'));
    if (typed.count(family) == 0) {
      for (const std::string sfx : {"_bucket", "_sum", "_count"}) {
        if (family.size() > sfx.size() &&
            family.compare(family.size() - sfx.size(), sfx.size(), sfx) == 0 &&
            typed.count(family.substr(0, family.size() - sfx.size())) != 0) {
          family = family.substr(0, family.size() - sfx.size());
        }
      }
    }
    if (typed.count(family) == 0) *error += "sample without TYPE: " + line + "\n";
    const std::string value = line.substr(sp + 1);
    out[series] = value == "+Inf" ? 1e308 : std::stod(value);
  }
  return out;
}

class HubApiTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "postgresql") {
      const char* url = std::getenv("KILN_TEST_PG_URL");
      if (url == nullptr || *url == '\0') {
        GTEST_SKIP() << "KILN_TEST_PG_URL is not set; start PostgreSQL with tools/pg.sh";
      }
      // A database per test: replicas share their signing keyring and tokens through it, and a
      // test that rotates keys must not find the keys of the tests before it.
      base_db_ = url;
      auto fresh = hub_testing::CreateFreshDatabase(
          url, Nonce() + ::testing::UnitTest::GetInstance()->current_test_info()->name(),
          &db_name_);
      ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
      db_ = *fresh;
    }
    std::vector<std::string> args = {"--rebuild", "off"};
    if (GetParam() == "s3") {
      KILN_REQUIRE_S3(env);
      // The hub reads these from its environment, as an operator would set them.
      for (const char* name :
           {"KILN_S3_ENDPOINT", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"}) {
        ::setenv(name, env->at(name).c_str(), 1);
      }
      S3Location loc =
          S3LocationFromUrl("s3://" + env->at("KILN_S3_BUCKET") + "/hub-api-" +
                            ::testing::UnitTest::GetInstance()->current_test_info()->name() + "-" +
                            Nonce())
              .value();
      s3_url_ = "s3://" + loc.bucket + "/" + loc.prefix;
      s3_ = OpenS3BlobStore(loc).value();
      args.insert(args.end(), {"--blobs", s3_url_});
    }
    root_ = ::testing::TempDir() + "/kiln_hub_api_" + GetParam() + "_" + Nonce();
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_ + "/data");
    ASSERT_TRUE(WriteSecretFileAtomic(root_ + "/tokens.json", TokensFileText(Tokens())).ok());
    hub_ = std::make_unique<HubProcess>(root_ + "/data", db_, args);
    ASSERT_TRUE(hub_->Start());
  }
  void TearDown() override {
    hub_.reset();
    hub_testing::DropDatabase(base_db_, db_name_);
    if (!HasFailure()) std::filesystem::remove_all(root_);
  }
  static std::vector<TokenRow> Tokens() {
    return {
        {Sha256Hex(kPlatform), "ci", "publisher", "platform", "", {"*"}},
        {Sha256Hex(kAcme), "acme-ci", "publisher", "org", "acme", {}},
        {Sha256Hex(kWorker), "worker-1", "worker", "", "", {"*"}},
        {Sha256Hex(kAdmin), "admin", "admin", "", "", {}},
        {Sha256Hex(kScraper), "scraper", "metrics", "", "", {}},
    };
  }
  // Intent, upload and complete, each answer kept: the answer of the step that refused.
  HubAnswer PublishSteps(const std::string& token, const std::string& cell,
                         const std::string& family, uint64_t declared_size) {
    auto files = UnpackCell(cell, "t").value();
    auto m = ParseMetadata(files.metadata_json, "t").value();
    const std::string digest = CellDigest(cell);
    auto c = hub_->Client(token);
    HubAnswer a =
        c->Call("POST", "/v1/publish/intent",
                nlohmann::json{
                    {"key", m.key}, {"digest", digest}, {"size", declared_size}, {"family", family}}
                    .dump());
    if (!a.ok() || a.body.value("already", false)) return a;
    a = c->Call("PUT", "/v1/blobs/" + digest, cell, "application/octet-stream");
    if (!a.ok()) return a;
    return c->Call("POST", "/v1/publish/complete",
                   nlohmann::json{{"key", m.key}, {"digest", digest}}.dump());
  }
  // Uploads in progress: temp files on disk; staging objects and unfinished multipart uploads
  // in the bucket on S3.
  int TempFiles() {
    if (s3_) return s3_->TempFileCount();
    int n = 0;
    for (auto it = std::filesystem::directory_iterator(root_ + "/data/blobs/tmp");
         it != std::filesystem::directory_iterator(); ++it) {
      ++n;
    }
    return n;
  }
  PublicKeySet Trusted() {
    HubAnswer a = hub_->Client("")->GetJwks();
    EXPECT_TRUE(a.ok()) << a.message;
    return PublicKeySet::FromJwks(a.body).value();
  }

  // Every blob the hub stores, each checked to hash to its name.
  std::vector<std::string> StoredBlobs() {
    std::vector<std::string> out;
    if (s3_) {
      const std::vector<std::string> listed = s3_->List().value();
      for (const std::string& d : listed) {
        EXPECT_EQ("sha256:" + Sha256Hex(s3_->ReadAll(d).value()), d);
        out.push_back(d);
      }
      return out;
    }
    for (auto& e : std::filesystem::directory_iterator(root_ + "/data/blobs/sha256")) {
      EXPECT_EQ(Sha256File(e.path().string()).value(), e.path().filename().string());
      out.push_back("sha256:" + e.path().filename().string());
    }
    return out;
  }

  std::string root_, db_;
  std::string base_db_, db_name_;  // PostgreSQL: the cluster's URL and this test's database
  std::unique_ptr<HubProcess> hub_;
  std::unique_ptr<BlobStore> s3_;  // the hub's bucket and prefix, seen from the test
  std::string s3_url_;
};

TEST_P(HubApiTest, PublishResolveVerifyAndFetchWithResume) {
  const CellMetadata m = MakeMetadata(Graph("e2e"));
  const std::string cell = MakeCell(m);
  auto worker = hub_->Client(kWorker);
  ResolveAnswer miss = worker->Resolve(m.key, m.family);
  EXPECT_EQ(miss.kind, ResolveAnswer::Kind::kMiss) << miss.token << " " << miss.message;

  PublishAnswer p = hub_->Client(kPlatform)->Publish(cell, {});
  ASSERT_TRUE(p.ok()) << p.token << ": " << p.message;
  EXPECT_FALSE(p.already);

  ResolveAnswer hit = worker->Resolve(m.key, m.family);
  ASSERT_EQ(hit.kind, ResolveAnswer::Kind::kFound) << hit.token << " " << hit.message;
  EXPECT_EQ(hit.digest, CellDigest(cell));
  EXPECT_EQ(hit.size, cell.size());
  ReceiptVerdict v = VerifyResolvedReceipt(hit, Trusted());
  ASSERT_TRUE(v.ok()) << v.token << ": " << v.message;
  EXPECT_EQ(v.claims.publisher, "ci");

  // Fetch whole, then resume from a partial file with a Range request.
  const std::string dest = root_ + "/fetched.tar";
  HubAnswer f = worker->FetchBlob(hit.digest, dest, hit.size);
  ASSERT_TRUE(f.ok()) << f.token << ": " << f.message;
  EXPECT_EQ(ReadFile(dest).value(), cell);
  std::filesystem::remove(dest);
  {
    std::ofstream part(dest + ".part", std::ios::binary);
    part.write(cell.data(), 1000);
  }
  f = worker->FetchBlob(hit.digest, dest, hit.size);
  ASSERT_TRUE(f.ok()) << f.token << ": " << f.message;
  EXPECT_EQ(f.http_status, 206);
  EXPECT_EQ(ReadFile(dest).value(), cell);

  // The same bytes again: the same receipt.
  PublishAnswer again = hub_->Client(kPlatform)->Publish(cell, {});
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again.already);
  EXPECT_EQ(again.receipt, p.receipt);
  HubAnswer rec = worker->GetReceipt(m.key, hit.digest);
  EXPECT_EQ(rec.body["receipt"], p.receipt);
}

// Ranges follow RFC 9110: a satisfiable one is 206 with its Content-Range, a suffix is the tail,
// one that starts past the end is 416 with "bytes */size" (never a wrapped-around length).
TEST_P(HubApiTest, ByteRangesAndUnsatisfiableRangeIs416) {
  const CellMetadata m = MakeMetadata(Graph("range"));
  const std::string cell = MakeCell(m);
  ASSERT_TRUE(hub_->Client(kPlatform)->Publish(cell, {}).ok());
  const std::string digest = CellDigest(cell);
  const std::string size = std::to_string(cell.size());
  auto get = [&](const std::string& range) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(hub_->port()));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    const std::string req =
        "GET /v1/blobs/" + digest + " HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer " +
        std::string(kWorker) + "\r\nRange: " + range + "\r\nConnection: close\r\n\r\n";
    EXPECT_EQ(::send(fd, req.data(), req.size(), 0), static_cast<ssize_t>(req.size()));
    std::string out;
    char buf[65536];
    ssize_t n;
    while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) out.append(buf, static_cast<size_t>(n));
    ::close(fd);
    return out;
  };
  const std::string mid = get("bytes=10-19");
  EXPECT_EQ(mid.rfind("HTTP/1.1 206", 0), 0u) << mid.substr(0, 200);
  EXPECT_NE(mid.find("Content-Range: bytes 10-19/" + size), std::string::npos);
  EXPECT_NE(mid.find("Content-Length: 10\r\n"), std::string::npos);
  EXPECT_EQ(mid.substr(mid.find("\r\n\r\n") + 4), cell.substr(10, 10));
  const std::string tail = get("bytes=-5");
  EXPECT_EQ(tail.substr(tail.find("\r\n\r\n") + 4), cell.substr(cell.size() - 5));
  for (const std::string& r : std::vector<std::string>{"bytes=999999999-", "bytes=" + size + "-"}) {
    const std::string past = get(r);
    EXPECT_EQ(past.rfind("HTTP/1.1 416", 0), 0u) << r << ": " << past.substr(0, 200);
    EXPECT_NE(past.find("Content-Range: bytes */" + size), std::string::npos) << past;
    EXPECT_NE(past.find("range_not_satisfiable"), std::string::npos) << past;
  }
}

TEST_P(HubApiTest, TamperedBlobBytesRefusedAsDigestMismatch) {
  const CellMetadata m = MakeMetadata(Graph("tamper"));
  std::string cell = MakeCell(m);
  const std::string digest = CellDigest(cell);
  auto pub = hub_->Client(kPlatform);
  ASSERT_TRUE(
      pub->Call("POST", "/v1/publish/intent",
                nlohmann::json{
                    {"key", m.key}, {"digest", digest}, {"size", cell.size()}, {"family", m.family}}
                    .dump())
          .ok());
  cell[100] ^= 1;
  HubAnswer up = pub->Call("PUT", "/v1/blobs/" + digest, cell, "application/octet-stream");
  EXPECT_EQ(up.http_status, 422);
  EXPECT_EQ(up.token, "digest_mismatch");
  EXPECT_EQ(TempFiles(), 0);
  EXPECT_EQ(hub_->Client(kWorker)->Resolve(m.key, m.family).kind, ResolveAnswer::Kind::kMiss);
}

TEST_P(HubApiTest, SizeLieRefusedAsSizeMismatch) {
  const CellMetadata m = MakeMetadata(Graph("sizelie"));
  const std::string cell = MakeCell(m);
  const std::string digest = CellDigest(cell);
  auto pub = hub_->Client(kPlatform);
  ASSERT_TRUE(pub->Call("POST", "/v1/publish/intent",
                        nlohmann::json{{"key", m.key},
                                       {"digest", digest},
                                       {"size", cell.size() + 7},
                                       {"family", m.family}}
                            .dump())
                  .ok());
  HubAnswer up = pub->Call("PUT", "/v1/blobs/" + digest, cell, "application/octet-stream");
  EXPECT_EQ(up.http_status, 422);
  EXPECT_EQ(up.token, "size_mismatch");
  EXPECT_EQ(TempFiles(), 0);
}

TEST_P(HubApiTest, MetadataThatDoesNotRestateRefused) {
  CellMetadata m;
  const std::string cell = hub_testing::MakeNonRestatingCell(&m);
  PublishAnswer p = hub_->Client(kPlatform)->Publish(cell, {});
  EXPECT_EQ(p.token, "key_mismatch") << p.message;
  EXPECT_EQ(p.http_status, 422);
}

TEST_P(HubApiTest, UnauthorizedTokensRefused) {
  const CellMetadata m = MakeMetadata(Graph("unauth"));
  PublishAnswer nobody = hub_->Client("not-a-token")->Publish(MakeCell(m), {});
  EXPECT_EQ(nobody.token, "unauthenticated");
  EXPECT_EQ(nobody.http_status, 401);
  PublishAnswer worker = hub_->Client(kWorker)->Publish(MakeCell(m), {});
  EXPECT_EQ(worker.token, "forbidden");
  EXPECT_EQ(worker.http_status, 403);
  // A refused resolve is typed and is not a miss.
  ResolveAnswer r = hub_->Client("")->Resolve(m.key, m.family);
  EXPECT_EQ(r.kind, ResolveAnswer::Kind::kRefused);
  EXPECT_EQ(r.token, "unauthenticated");
}

TEST_P(HubApiTest, TenantWritingPlatformFamilyRefused) {
  const CellMetadata m = MakeMetadata(Graph("tenant"), "root/micro-mlp");
  PublishAnswer p = hub_->Client(kAcme)->Publish(MakeCell(m), {});
  EXPECT_EQ(p.token, "family_forbidden") << p.message;
  EXPECT_EQ(p.http_status, 403);
  const CellMetadata own = MakeMetadata(Graph("tenant-own"), "acme/micro-mlp");
  PublishAnswer ok = hub_->Client(kAcme)->Publish(MakeCell(own), {});
  EXPECT_TRUE(ok.ok()) << ok.token << ": " << ok.message;
}

TEST_P(HubApiTest, RevokedCellRefusedNotMissed) {
  const CellMetadata m = MakeMetadata(Graph("revoke"));
  const std::string cell = MakeCell(m);
  ASSERT_TRUE(hub_->Client(kPlatform)->Publish(cell, {}).ok());
  HubAnswer rv = hub_->Client(kAdmin)->Revoke(m.key, CellDigest(cell), "cell_fault on worker-3");
  ASSERT_TRUE(rv.ok()) << rv.message;
  ResolveAnswer r = hub_->Client(kWorker)->Resolve(m.key, m.family);
  EXPECT_EQ(r.kind, ResolveAnswer::Kind::kRefused);
  EXPECT_EQ(r.token, "revoked");
  EXPECT_EQ(r.http_status, 410);
  HubAnswer list = hub_->Client("")->GetRevocations();
  ASSERT_TRUE(list.ok());
  bool listed = false;
  for (const auto& row : list.body["revocations"]) listed |= row["key"] == m.key;
  EXPECT_TRUE(listed);
  // Only admins revoke.
  EXPECT_EQ(hub_->Client(kPlatform)->Revoke(m.key, CellDigest(cell), "x").token, "forbidden");
}

TEST_P(HubApiTest, AlteredClaimOrForeignSignatureRefusedByTheClient) {
  const CellMetadata m = MakeMetadata(Graph("forge"));
  const std::string cell = MakeCell(m);
  ASSERT_TRUE(hub_->Client(kPlatform)->Publish(cell, {}).ok());
  ResolveAnswer hit = hub_->Client(kWorker)->Resolve(m.key, m.family);
  ASSERT_EQ(hit.kind, ResolveAnswer::Kind::kFound);
  const PublicKeySet trusted = Trusted();
  ASSERT_TRUE(VerifyResolvedReceipt(hit, trusted).ok());

  // Altered claim: the size re-encoded into the signed claims.
  const size_t a = hit.receipt.find('.'), b = hit.receipt.find('.', a + 1);
  auto claims =
      ParseJson(Base64UrlDecode(hit.receipt.substr(a + 1, b - a - 1), "c").value(), "c").value();
  claims["size"] = 1;
  ResolveAnswer altered = hit;
  altered.size = 1;
  altered.receipt = hit.receipt.substr(0, a) + "." +
                    Base64UrlEncode(CanonicalJson(claims).value()) + hit.receipt.substr(b);
  EXPECT_EQ(VerifyResolvedReceipt(altered, trusted).token, "receipt_bad_signature");
  // The hub's receipt but an answer that claims other bytes.
  ResolveAnswer other_bytes = hit;
  other_bytes.digest = "sha256:" + std::string(64, '0');
  EXPECT_EQ(VerifyResolvedReceipt(other_bytes, trusted).token, "receipt_claim_mismatch");
  // A receipt signed by a foreign key.
  auto foreign = SigningKey::Generate().value();
  ReceiptClaims c =
      ClaimsFromJson(
          ParseJson(Base64UrlDecode(hit.receipt.substr(a + 1, b - a - 1), "c").value(), "c")
              .value())
          .value();
  ResolveAnswer forged = hit;
  forged.receipt = SignReceipt(c, foreign).value();
  EXPECT_EQ(VerifyResolvedReceipt(forged, trusted).token, "receipt_unknown_kid");
}

TEST_P(HubApiTest, RotatedKeyRefetchesTheKeySetOnceForeignKidStillRefused) {
  // A receipt signed before the rotation, and the key set as the worker fetched it then.
  const CellMetadata before = MakeMetadata(Graph("rotate-before"));
  ASSERT_TRUE(hub_->Client(kPlatform)->Publish(MakeCell(before), {}).ok());
  PublicKeySet held = Trusted();
  ASSERT_EQ(held.size(), 1u);

  HubAnswer rotated = hub_->Client(kAdmin)->Call("POST", "/v1/admin/rotate-key");
  ASSERT_TRUE(rotated.ok()) << rotated.token << ": " << rotated.message;
  const CellMetadata after = MakeMetadata(Graph("rotate-after"));
  ASSERT_TRUE(hub_->Client(kPlatform)->Publish(MakeCell(after), {}).ok());
  auto worker = hub_->Client(kWorker);
  ResolveAnswer hit = worker->Resolve(after.key, after.family);
  ASSERT_EQ(hit.kind, ResolveAnswer::Kind::kFound) << hit.token << " " << hit.message;

  // Offline against the old set: the new kid is unknown.
  EXPECT_EQ(VerifyResolvedReceipt(hit, held).token, "receipt_unknown_kid");
  // The client refetches the key set once, learns the new key, and the receipt verifies.
  ReceiptVerdict v = worker->VerifyReceipt(hit, &held);
  ASSERT_TRUE(v.ok()) << v.token << ": " << v.message;
  EXPECT_EQ(held.size(), 2u);
  EXPECT_TRUE(held.Has(v.kid));
  // The receipt from before the rotation still verifies (rotation never drops a key).
  ResolveAnswer old_hit = worker->Resolve(before.key, before.family);
  ASSERT_EQ(old_hit.kind, ResolveAnswer::Kind::kFound);
  EXPECT_TRUE(worker->VerifyReceipt(old_hit, &held).ok());

  // A foreign key's receipt: still refused after the refetch, and on a second check without one.
  const size_t a = hit.receipt.find('.'), b = hit.receipt.find('.', a + 1);
  ReceiptClaims c =
      ClaimsFromJson(
          ParseJson(Base64UrlDecode(hit.receipt.substr(a + 1, b - a - 1), "c").value(), "c")
              .value())
          .value();
  ResolveAnswer forged = hit;
  forged.receipt = SignReceipt(c, SigningKey::Generate().value()).value();
  ReceiptVerdict foreign = worker->VerifyReceipt(forged, &held);
  EXPECT_EQ(foreign.token, "receipt_unknown_kid") << foreign.message;
  EXPECT_NE(foreign.message.find("after refetching"), std::string::npos) << foreign.message;
  EXPECT_EQ(held.size(), 2u);
  ReceiptVerdict again = worker->VerifyReceipt(forged, &held);
  EXPECT_EQ(again.token, "receipt_unknown_kid");
  EXPECT_NE(again.message.find("did not have it either"), std::string::npos) << again.message;
}

TEST_P(HubApiTest, ThirtyTwoConcurrentPublishersOfOneKeyLeaveOneRow) {
  const CellMetadata m = MakeMetadata(Graph("race32"));
  // A second hub process on the same database (PostgreSQL) splits the publishers across
  // processes; on SQLite both go to the one hub.
  std::unique_ptr<HubProcess> second;
  if (!db_.empty()) {
    second = std::make_unique<HubProcess>(root_ + "/data", db_,
                                          std::vector<std::string>{"--rebuild", "off"});
    ASSERT_TRUE(second->Start());
  }
  constexpr int kPublishers = 32;
  std::vector<PublishAnswer> answers(kPublishers);
  std::vector<std::string> cells(kPublishers);
  for (int i = 0; i < kPublishers; ++i) {
    cells[i] = MakeCell(m, "publisher " + std::to_string(i % 24));  // some publish equal bytes
  }
  std::vector<std::thread> threads;
  std::atomic<int> ready{0};
  for (int i = 0; i < kPublishers; ++i) {
    threads.emplace_back([&, i] {
      auto client = (second && i % 2) ? second->Client(kPlatform) : hub_->Client(kPlatform);
      ready++;
      while (ready.load() < kPublishers) std::this_thread::yield();
      answers[i] = client->Publish(cells[i], {});
    });
  }
  for (auto& t : threads) t.join();

  ResolveAnswer owner = hub_->Client(kWorker)->Resolve(m.key, m.family);
  ASSERT_EQ(owner.kind, ResolveAnswer::Kind::kFound);
  int winners = 0;
  for (int i = 0; i < kPublishers; ++i) {
    const PublishAnswer& a = answers[i];
    if (a.ok()) {
      // Success means these are the owner's bytes, with the owner's receipt.
      EXPECT_EQ(a.digest, owner.digest) << i;
      EXPECT_EQ(a.receipt, owner.receipt) << i;
      winners += !a.already;
    } else {
      EXPECT_EQ(a.token, "key_taken") << i << ": " << a.message;
      EXPECT_EQ(a.receipt, owner.receipt) << i;
      EXPECT_NE(CellDigest(cells[i]), owner.digest) << i;
    }
  }
  EXPECT_LE(winners, kPublishers);
  EXPECT_GE(winners, 1);
  // Exactly one row: the receipt the store holds is the one everybody saw, and it verifies.
  EXPECT_TRUE(VerifyResolvedReceipt(owner, Trusted()).ok());
  EXPECT_EQ(TempFiles(), 0);
  // Every stored blob is whole (its name is its hash), and the owner's is among them.
  const std::vector<std::string> blobs = StoredBlobs();
  EXPECT_NE(std::find(blobs.begin(), blobs.end(), owner.digest), blobs.end());
}

// Mint leases over HTTP: sixteen workers ask at once, split across two hub processes on one
// PostgreSQL database (on SQLite, one hub); exactly one is granted and everyone is told that
// holder. The holder heartbeats through one hub and releases through the other.
TEST_P(HubApiTest, ConcurrentMintLeaseAsksAcrossHubsGrantExactlyOne) {
  const CellMetadata m = MakeMetadata(Graph("lease16"));
  std::unique_ptr<HubProcess> second;
  if (!db_.empty()) {
    second = std::make_unique<HubProcess>(root_ + "/data", db_,
                                          std::vector<std::string>{"--rebuild", "off"});
    ASSERT_TRUE(second->Start());
  }
  HubProcess& other = second ? *second : *hub_;
  constexpr int kWorkers = 16;
  std::vector<HubAnswer> answers(kWorkers);
  std::vector<std::thread> threads;
  std::atomic<int> ready{0};
  for (int i = 0; i < kWorkers; ++i) {
    threads.emplace_back([&, i] {
      auto client = (i % 2 ? other : *hub_).Client(kPlatform);
      ready++;
      while (ready.load() < kWorkers) std::this_thread::yield();
      answers[i] = client->Call(
          "POST", "/v1/mint-leases",
          nlohmann::json{{"key", m.key}, {"family", m.family}, {"holder", "w" + std::to_string(i)}}
              .dump());
    });
  }
  for (auto& t : threads) t.join();
  int granted = 0;
  std::string holder, lease;
  for (int i = 0; i < kWorkers; ++i) {
    ASSERT_TRUE(answers[i].ok()) << i << ": " << answers[i].message;
    if (answers[i].body["granted"].get<bool>()) {
      ++granted;
      holder = answers[i].body["holder"];
      lease = answers[i].body["lease"];
    }
  }
  ASSERT_EQ(granted, 1);
  for (const HubAnswer& a : answers) EXPECT_EQ(a.body["holder"], holder);

  const nlohmann::json id = {{"key", m.key}, {"family", m.family}, {"lease", lease}};
  HubAnswer beat = other.Client(kPlatform)->Call("POST", "/v1/mint-leases/heartbeat", id.dump());
  EXPECT_TRUE(beat.ok()) << beat.message;
  HubAnswer stranger = hub_->Client(kPlatform)->Call(
      "POST", "/v1/mint-leases/heartbeat",
      nlohmann::json{{"key", m.key}, {"family", m.family}, {"lease", "not-" + lease}}.dump());
  EXPECT_EQ(stranger.http_status, 409);
  EXPECT_EQ(stranger.token, "lease_lost");
  HubAnswer released = hub_->Client(kPlatform)->Call("POST", "/v1/mint-leases/release", id.dump());
  ASSERT_TRUE(released.ok()) << released.message;
  EXPECT_TRUE(released.body["released"].get<bool>());
  HubAnswer next = other.Client(kPlatform)->Call(
      "POST", "/v1/mint-leases",
      nlohmann::json{{"key", m.key}, {"family", m.family}, {"holder", "late"}}.dump());
  EXPECT_TRUE(next.body.value("granted", false)) << next.body.dump();
  // A token with no write tier may not ask.
  HubAnswer reader = hub_->Client(kWorker)->Call(
      "POST", "/v1/mint-leases",
      nlohmann::json{{"key", m.key}, {"family", m.family}, {"holder", "r"}}.dump());
  EXPECT_EQ(reader.http_status, 403);
  EXPECT_EQ(reader.token, "forbidden");

  // /metrics counts each process's answers; the fleet's are the sum over its hubs.
  std::map<std::string, double> answered;
  for (HubProcess* h : {hub_.get(), second.get()}) {
    if (h == nullptr) continue;
    auto [status, text] = RawGet(h->port(), "/metrics", kScraper);
    ASSERT_EQ(status, 200) << text;
    std::string format_errors;
    for (const auto& [series, v] : ParseExposition(text, &format_errors)) {
      if (series.rfind("kiln_hub_mint_lease_answers_total{", 0) == 0) answered[series] += v;
    }
    EXPECT_EQ(format_errors, "");
  }
  auto n = [&](const char* answer) {
    return answered[std::string(R"(kiln_hub_mint_lease_answers_total{answer=")") + answer + "\"}"];
  };
  EXPECT_EQ(n("granted"), 2) << "the race's winner and the late asker";
  EXPECT_EQ(n("held"), kWorkers - 1);
  EXPECT_EQ(n("lost"), 1) << "the stranger's heartbeat";
  EXPECT_EQ(n("released"), 1);
  EXPECT_EQ(n("published"), 0);
}

// Opens a raw connection and sends the headers and the first half of an upload, then stops.
int SendHalfAnUpload(int port, const std::string& digest, const std::string& bytes) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) return -1;
  const std::string head =
      "PUT /v1/blobs/" + digest + " HTTP/1.1\r\nHost: 127.0.0.1\r\n" + "Authorization: Bearer " +
      kPlatform + "\r\n" +
      "Content-Type: application/octet-stream\r\nContent-Length: " + std::to_string(bytes.size()) +
      "\r\n\r\n";
  const std::string half = head + bytes.substr(0, bytes.size() / 2);
  if (::send(fd, half.data(), half.size(), 0) != static_cast<ssize_t>(half.size())) return -1;
  return fd;
}

TEST_P(HubApiTest, KillDashNineMidUploadLeavesNoPartialRowOrBlob) {
  const CellMetadata m = MakeMetadata(Graph("kill9"));
  const std::string cell = MakeCell(m, std::string(300000, 'p'));
  const std::string digest = CellDigest(cell);
  auto pub = hub_->Client(kPlatform);
  ASSERT_TRUE(
      pub->Call("POST", "/v1/publish/intent",
                nlohmann::json{
                    {"key", m.key}, {"digest", digest}, {"size", cell.size()}, {"family", m.family}}
                    .dump())
          .ok());
  const int fd = SendHalfAnUpload(hub_->port(), digest, cell);
  ASSERT_GE(fd, 0);
  if (s3_) {
    // Below the part size the S3 writer holds the bytes until Commit: the bucket has nothing
    // of this upload, staged or visible, before or after the kill.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    hub_->Kill(SIGKILL);
    ::close(fd);
    EXPECT_EQ(TempFiles(), 0);
    ASSERT_TRUE(hub_->Start());
  } else {
    // Wait until the hub is streaming the upload into its temp file.
    for (int i = 0; i < 100 && TempFiles() == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_EQ(TempFiles(), 1);
    hub_->Kill(SIGKILL);
    ::close(fd);
    EXPECT_EQ(TempFiles(), 1) << "the killed hub leaves its temp file";
    ASSERT_TRUE(hub_->Start());
    EXPECT_EQ(TempFiles(), 0) << "restart removes partial uploads";
  }
  EXPECT_TRUE(StoredBlobs().empty());
  auto worker = hub_->Client(kWorker);
  EXPECT_EQ(worker->Resolve(m.key, m.family).kind, ResolveAnswer::Kind::kMiss);
  // The upload can be redone from the start.
  PublishAnswer p = hub_->Client(kPlatform)->Publish(cell, {});
  ASSERT_TRUE(p.ok()) << p.token << ": " << p.message;
  EXPECT_EQ(worker->Resolve(m.key, m.family).kind, ResolveAnswer::Kind::kFound);
}

TEST_P(HubApiTest, ReleasesEventsAndDashboardOverHttp) {
  const CellMetadata m = MakeMetadata(Graph("release"));
  const std::string rel = "rel-" + Nonce();
  auto admin = hub_->Client(kAdmin);
  HubAnswer created = admin->Call("POST", "/v1/releases",
                                  nlohmann::json{{"name", rel},
                                                 {"targets",
                                                  {{{"target", "denoiser"}, {"sm", "x86-64-v3"}},
                                                   {{"target", "decoder"}, {"sm", "x86-64-v3"}}}}}
                                      .dump());
  ASSERT_TRUE(created.ok()) << created.message;
  PublishOptions opts;
  opts.release = rel;
  opts.target = "denoiser";
  ASSERT_TRUE(hub_->Client(kPlatform)->Publish(MakeCell(m), opts).ok());
  auto worker = hub_->Client(kWorker);
  ASSERT_TRUE(worker->SettleObligation(rel, "decoder", "x86-64-v3", "no_export_declaration").ok());
  HubAnswer obligations = worker->Call("GET", "/v1/releases/" + rel + "/obligations");
  ASSERT_TRUE(obligations.ok());
  std::map<std::string, std::string> state;
  for (const auto& o : obligations.body["obligations"]) state[o["target"]] = o["state"];
  EXPECT_EQ(state["denoiser"], "discharged");
  EXPECT_EQ(state["decoder"], "settled:no_export_declaration");

  nlohmann::json rows = nlohmann::json::array(
      {{{"seq", 1}, {"kind", "boot_adopt"}, {"phase", "hit"}, {"key", m.key}, {"duration_ms", 3}}});
  ASSERT_TRUE(worker->PostEvents(rows).ok());
  HubAnswer q = worker->Call("GET", "/v1/events?worker=worker-1&kind=boot_adopt");
  ASSERT_TRUE(q.ok());
  EXPECT_GE(q.body["events"].size(), 1u);

  auto page = worker->Call("GET", "/");  // HTML: not JSON, so the answer says so; check raw
  EXPECT_EQ(page.http_status, 200);
}

// The publish path no tenant can disturb, over HTTP: a tenant that declares an intent for the
// platform cell's digest (deterministic, so computable) with a bogus size, and re-declares the
// same (key, digest) with its own family and release, changes nothing for the platform.
TEST_P(HubApiTest, TenantIntentsWithBogusSizeOrOverwritesLeaveThePlatformPublishAlone) {
  const CellMetadata m = MakeMetadata(Graph("intent-attack"));
  const std::string cell = MakeCell(m);
  const std::string digest = CellDigest(cell);
  auto tenant = hub_->Client(kAcme);
  for (uint64_t size : {uint64_t{13}, uint64_t{cell.size()}}) {
    HubAnswer a = tenant->Call("POST", "/v1/publish/intent",
                               nlohmann::json{{"key", m.key},
                                              {"digest", digest},
                                              {"size", size},
                                              {"family", "acme/squat"},
                                              {"release", "theirs"},
                                              {"target", "theirs"}}
                                   .dump());
    ASSERT_TRUE(a.ok()) << a.token << ": " << a.message;
  }
  PublishOptions opts;
  opts.release = "ours";
  PublishAnswer p = hub_->Client(kPlatform)->Publish(cell, opts);
  ASSERT_TRUE(p.ok()) << p.token << ": " << p.message;
  ReceiptVerdict v = VerifyReceipt(p.receipt, Trusted(), {m.key, digest, cell.size(), m.family});
  ASSERT_TRUE(v.ok()) << v.token << ": " << v.message;
  EXPECT_EQ(v.claims.family, m.family);
  EXPECT_EQ(v.claims.release, "ours");
  ResolveAnswer r = hub_->Client(kWorker)->Resolve(m.key, m.family);
  ASSERT_EQ(r.kind, ResolveAnswer::Kind::kFound);
  EXPECT_EQ(r.digest, digest);
}

// Cells every worker would refuse are refused at publish, with the worker's own tokens: a 0-byte
// shared object, and a cell whose metadata records a failed fence proof.
TEST_P(HubApiTest, ZeroByteSharedObjectAndFenceFalseCellRefusedAtPublish) {
  const CellMetadata m = MakeMetadata(Graph("zero-so"));
  CellFiles f = UnpackCell(MakeCell(m), "t").value();
  f.shared_object.clear();
  const std::string empty = PackCell(f).value();
  HubAnswer a = PublishSteps(kPlatform, empty, m.family, empty.size());
  EXPECT_EQ(a.http_status, 422);
  EXPECT_EQ(a.token, "shared_object_invalid") << a.message;
  CellMetadata fence = MakeMetadata(Graph("fence-false"));
  fence.fence.perturbed_checkpoint_matched = false;
  const std::string unproven = MakeCell(fence);
  HubAnswer b = PublishSteps(kPlatform, unproven, fence.family, unproven.size());
  EXPECT_EQ(b.http_status, 422);
  EXPECT_EQ(b.token, "fence_unproven") << b.message;
  auto worker = hub_->Client(kWorker);
  EXPECT_EQ(worker->Resolve(m.key, m.family).kind, ResolveAnswer::Kind::kMiss);
  EXPECT_EQ(worker->Resolve(fence.key, fence.family).kind, ResolveAnswer::Kind::kMiss);
}

// The tokens file is the truth at every start: a token removed from it no longer publishes after
// a restart; an admin revokes a token at once, and it stays dead after a restart with the old
// file.
TEST_P(HubApiTest, RemovedAndRevokedTokensAreDead) {
  // A token of this run only (a PostgreSQL database remembers revocations across runs).
  const std::string secret = "tok-temp-" + Nonce();
  std::vector<TokenRow> with_temp = Tokens();
  with_temp.push_back({Sha256Hex(secret), "temp-" + Nonce(), "publisher", "org", "acme", {}});
  auto restart_with = [&](const std::vector<TokenRow>& tokens) {
    if (!WriteSecretFileAtomic(root_ + "/tokens.json", TokensFileText(tokens)).ok()) {
      return ::testing::AssertionFailure() << "cannot write the tokens file";
    }
    hub_->Kill(SIGTERM);
    return hub_->Start(hub_->port());
  };
  ASSERT_TRUE(restart_with(with_temp));
  ASSERT_TRUE(
      hub_->Client(secret)->Publish(MakeCell(MakeMetadata(Graph("token-1"), "acme/m")), {}).ok());
  ASSERT_TRUE(restart_with(Tokens()));
  PublishAnswer removed =
      hub_->Client(secret)->Publish(MakeCell(MakeMetadata(Graph("token-2"), "acme/m")), {});
  if (db_.empty()) {
    // One hub: removed from the file, dead after the restart, although the store held it.
    EXPECT_EQ(removed.token, "unauthenticated") << removed.message;
    EXPECT_EQ(removed.http_status, 401);
  } else {
    // Replicas on PostgreSQL: a file only adds to the token set they share (another replica's
    // file may still list the token); a token leaves it by revocation, below.
    EXPECT_TRUE(removed.ok()) << removed.token << ": " << removed.message;
  }

  // Revoked by the admin route: refused on its next request, and after a restart with a file
  // that still lists it.
  ASSERT_TRUE(restart_with(with_temp));
  ASSERT_TRUE(hub_->Client(secret)->Call("GET", "/v1/events?limit=1").ok());
  HubAnswer rv = hub_->Client(kAdmin)->Call("POST", "/v1/admin/tokens/revoke",
                                            nlohmann::json{{"sha256", Sha256Hex(secret)}}.dump());
  ASSERT_TRUE(rv.ok()) << rv.token << ": " << rv.message;
  EXPECT_EQ(hub_->Client(secret)->Call("GET", "/v1/events?limit=1").token, "unauthenticated");
  ASSERT_TRUE(restart_with(with_temp));
  EXPECT_EQ(hub_->Client(secret)->Call("GET", "/v1/events?limit=1").token, "unauthenticated");
  EXPECT_TRUE(hub_->Client(kAcme)->Call("GET", "/v1/events?limit=1").ok());
}

// awscli, a client kiln did not write, lists the bucket after three publishes (one of them a
// republish): one content-addressed object per cell under sha256/, nothing left under staging/.
TEST_P(HubApiTest, BucketSeenByAwscliHoldsOneObjectPerCell) {
  if (!s3_) GTEST_SKIP() << "S3 only";
  std::set<std::string> digests;
  for (const char* name : {"aws-a", "aws-b"}) {
    const CellMetadata m = MakeMetadata(Graph(name));
    const std::string cell = MakeCell(m);
    PublishAnswer p = hub_->Client(kPlatform)->Publish(cell, {});
    ASSERT_TRUE(p.ok()) << p.token << ": " << p.message;
    digests.insert(p.digest);
    if (digests.size() == 1) {
      ASSERT_TRUE(hub_->Client(kPlatform)->Publish(cell, {}).ok());
    }
  }
  const std::string listing = root_ + "/aws-ls.txt";
  const std::string cmd = "HOME='" + root_ +
                          "' /usr/bin/aws --endpoint-url \"$KILN_S3_ENDPOINT\" " +
                          "s3 ls --recursive '" + s3_url_ + "' > '" + listing + "' 2>&1";
  const int rc = std::system(cmd.c_str());
  auto text_or = ReadFile(listing);
  ASSERT_TRUE(text_or.ok()) << text_or.status().ToString();
  ASSERT_EQ(rc, 0) << *text_or;
  const std::string text = *text_or;
  const std::string prefix = s3_url_.substr(s3_url_.find('/', 5) + 1);
  std::set<std::string> seen;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    const std::string key = line.substr(line.rfind(' ') + 1);
    ASSERT_EQ(key.rfind(prefix + "sha256/", 0), 0u) << "unexpected object: " << line;
    seen.insert("sha256:" + key.substr(prefix.size() + 7));
  }
  EXPECT_EQ(seen, digests) << text;
}

// GET /metrics on a real hub: a metrics token reads it (and nothing else), a worker token does
// not; requests are counted by route pattern (never the raw path), their durations land in a
// cumulative histogram, blob bytes moved and stored are counted, and the counters move by exactly
// the requests made between two scrapes.
TEST_P(HubApiTest, MetricsCountRequestsByRoutePatternForAScraperToken) {
  EXPECT_EQ(RawGet(hub_->port(), "/metrics", "").first, 401);
  EXPECT_EQ(RawGet(hub_->port(), "/metrics", kWorker).first, 403);
  HubAnswer cell_read = hub_->Client(kScraper)->Call(
      "GET", "/v1/cells/ck1-" + std::string(56, 'a') + "?family=root/m");
  EXPECT_EQ(cell_read.http_status, 403) << "a metrics token reads no cell";
  EXPECT_EQ(cell_read.token, kRefusalForbidden);

  const CellMetadata m = MakeMetadata(Graph("metrics"));
  const std::string cell = MakeCell(m);
  PublishAnswer p = hub_->Client(kPlatform)->Publish(cell, {});
  ASSERT_TRUE(p.ok()) << p.token << ": " << p.message;
  const std::string dest = root_ + "/fetched.tar";
  ASSERT_TRUE(hub_->Client(kWorker)->FetchBlob(p.digest, dest).ok());

  auto [status, text] = RawGet(hub_->port(), "/metrics", kScraper);
  ASSERT_EQ(status, 200) << text;
  std::string format_errors;
  std::map<std::string, double> first = ParseExposition(text, &format_errors);
  EXPECT_EQ(format_errors, "");
  EXPECT_EQ(
      first[R"(kiln_hub_requests_total{method="POST",route="/v1/publish/intent",code="200"})"], 1);
  EXPECT_EQ(first[R"(kiln_hub_requests_total{method="PUT",route="/v1/blobs/{}",code="200"})"], 1);
  EXPECT_EQ(first[R"(kiln_hub_requests_total{method="GET",route="/v1/cells/{}",code="403"})"], 1);
  EXPECT_GE(first["kiln_hub_blob_bytes_uploaded_total"], cell.size());
  if (s3_) {
    // The fetch took the direct path (docs/fleet.md "Direct blob downloads"): the hub answered
    // one 307 and streamed no byte.
    EXPECT_EQ(first["kiln_hub_blob_bytes_downloaded_total"], 0);
    EXPECT_EQ(first[R"(kiln_hub_requests_total{method="GET",route="/v1/blobs/{}",code="307"})"], 1);
  } else {
    EXPECT_GE(first["kiln_hub_blob_bytes_downloaded_total"], cell.size());
  }
  EXPECT_GE(first["kiln_hub_blob_bytes_stored"], cell.size());
  EXPECT_GE(first["kiln_hub_blobs_stored"], 1);
  EXPECT_EQ(first[R"(kiln_http_connections_open{listener="hub"})"] >= 1, true);
  EXPECT_EQ(first.count(R"(kiln_http_queue_depth{listener="hub"})"), 1u);
  EXPECT_EQ(first.count("kiln_hub_builder_running"), 1u);
  const std::string backend = db_.empty() ? "sqlite" : "postgresql";
  EXPECT_GE(first[R"(kiln_hub_db_pool_size{backend=")" + backend + "\"}"], 1);
  // Bounded labels: the key and the digest never appear, only route patterns.
  EXPECT_EQ(text.find(m.key), std::string::npos);
  EXPECT_EQ(text.find(p.digest.substr(7)), std::string::npos);

  for (int i = 0; i < 3; ++i) {
    ResolveAnswer r = hub_->Client(kWorker)->Resolve(m.key, m.family);
    ASSERT_EQ(r.kind, ResolveAnswer::Kind::kFound) << r.message;
  }
  auto [status2, text2] = RawGet(hub_->port(), "/metrics", kScraper);
  ASSERT_EQ(status2, 200);
  std::map<std::string, double> second = ParseExposition(text2, &format_errors);
  const std::string resolved =
      R"(kiln_hub_requests_total{method="GET",route="/v1/cells/{}",code="200"})";
  EXPECT_EQ(second[resolved] - first[resolved], 3);
  const std::string route = R"(method="GET",route="/v1/cells/{}")";
  const double count = second["kiln_hub_request_duration_seconds_count{" + route + "}"];
  EXPECT_EQ(count, 4) << "three resolves and the metrics token's refused read";
  EXPECT_EQ(second["kiln_hub_request_duration_seconds_bucket{" + route + ",le=\"+Inf\"}"], count);
  double previous = 0;
  int buckets = 0;
  std::istringstream lines(text2);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("kiln_hub_request_duration_seconds_bucket{" + route, 0) != 0) continue;
    const double v = std::stod(line.substr(line.rfind(' ') + 1));
    EXPECT_GE(v, previous) << line;
    previous = v;
    ++buckets;
  }
  EXPECT_GT(buckets, 2);
  // The scrape itself is counted under its pattern.
  EXPECT_GE(second[R"(kiln_hub_requests_total{method="GET",route="/metrics",code="200"})"], 1);
}

INSTANTIATE_TEST_SUITE_P(Backends, HubApiTest, ::testing::Values("sqlite", "postgresql", "s3"));

// One publish per key (docs/fleet.md "One publish per key"): 32 publishers, each with its own
// token, race one (key, family) on two hub processes sharing PostgreSQL and a radosgw bucket. The
// first intent claims the key; the others wait (publish_in_progress, retried with jittered backoff)
// and then see its cell. Four byte variants among them: the winner's seven twins end "already",
// the 24 others key_taken with the winner's receipt. Exactly one cell row, and exactly one
// object in the bucket as awscli lists it: no loser uploaded a byte (one_publish_race.h).
TEST(HubOnePublishPerKey, ThirtyTwoPublishersOnPostgresAndS3LeaveOneRowAndOneBlob) {
  const char* pg = std::getenv("KILN_TEST_PG_URL");
  if (pg == nullptr || *pg == '\0') GTEST_SKIP() << "KILN_TEST_PG_URL is not set (tools/pg.sh)";
  KILN_REQUIRE_S3(env);
  for (const char* name :
       {"KILN_S3_ENDPOINT", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"}) {
    ::setenv(name, env->at(name).c_str(), 1);
  }
  const std::string s3_url = "s3://" + env->at("KILN_S3_BUCKET") + "/one-publish-" + Nonce();
  const std::string root = ::testing::TempDir() + "/kiln_one_publish_" + Nonce();
  std::filesystem::remove_all(root);
  std::filesystem::create_directories(root + "/data");
  std::vector<TokenRow> tokens = hub_testing::RacerTokens();
  tokens.push_back({Sha256Hex(kWorker), "worker-1", "worker", "", "", {"*"}});
  ASSERT_TRUE(WriteSecretFileAtomic(root + "/tokens.json", TokensFileText(tokens)).ok());
  HubProcess hub(root + "/data", pg, {"--rebuild", "off", "--blobs", s3_url});
  ASSERT_TRUE(hub.Start());
  // A second hub process on the same database and bucket: half the publishers go through it, so
  // the claim is contested across processes.
  HubProcess second(root + "/data", pg, {"--rebuild", "off", "--blobs", s3_url});
  ASSERT_TRUE(second.Start());
  hub_testing::ExpectOnePublishPerKey(
      [&](int i) { return (i % 2 ? second : hub).Client(hub_testing::RacerToken(i)); },
      *hub.Client(kWorker), pg, s3_url, root);
  hub.Kill(SIGTERM);
  second.Kill(SIGTERM);
  if (!::testing::Test::HasFailure()) std::filesystem::remove_all(root);
}

// The CLI as a user types it: kiln publish, kiln resolve --trust.
TEST(HubCli, PublishAndResolveWithTrustedJwks) {
  const std::string root = ::testing::TempDir() + "/kiln_hub_cli_" + Nonce();
  std::filesystem::create_directories(root + "/data");
  ASSERT_TRUE(WriteSecretFileAtomic(
                  root + "/tokens.json",
                  TokensFileText({{Sha256Hex(kPlatform), "ci", "publisher", "platform", "", {}},
                                  {Sha256Hex(kWorker), "w", "worker", "", "", {}}}))
                  .ok());
  HubProcess hub(root + "/data", "", {"--rebuild", "off"});
  ASSERT_TRUE(hub.Start());
  const CellMetadata m = MakeMetadata(Graph("cli"));
  ASSERT_TRUE(WriteFileAtomic(root + "/cell.tar", MakeCell(m)).ok());
  ASSERT_TRUE(WriteFileAtomic(root + "/jwks.json", hub.Client("")->GetJwks().body.dump()).ok());
  auto run = [&](const std::string& args) {
    std::string out;
    FILE* p = ::popen((Binary() + " " + args + " 2>&1").c_str(), "r");
    std::array<char, 4096> buf;
    size_t n;
    while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
    const int st = ::pclose(p);
    return std::make_pair(WIFEXITED(st) ? WEXITSTATUS(st) : -1, out);
  };
  const std::string family = " --family " + m.family;
  auto miss = run("resolve " + m.key + family + " --hub " + hub.url() + " --token " + kWorker);
  EXPECT_EQ(miss.first, 3) << miss.second;
  auto pub = run("publish " + root + "/cell.tar --hub " + hub.url() + " --token " + kPlatform);
  EXPECT_EQ(pub.first, 0) << pub.second;
  auto res = run("resolve " + m.key + family + " --hub " + hub.url() + " --token " + kWorker +
                 " --trust " + root + "/jwks.json");
  EXPECT_EQ(res.first, 0) << res.second;
  EXPECT_NE(res.second.find("\"receipt_verified\": true"), std::string::npos) << res.second;
  // A foreign trust anchor refuses the same receipt.
  auto foreign = SigningKey::Generate().value();
  auto bad = run("resolve " + m.key + family + " --hub " + hub.url() + " --token " + kWorker +
                 " --trust " + Base64UrlEncode(foreign.raw_public()));
  EXPECT_EQ(bad.first, 1) << bad.second;
  EXPECT_NE(bad.second.find("receipt_unknown_kid"), std::string::npos) << bad.second;
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace kiln
