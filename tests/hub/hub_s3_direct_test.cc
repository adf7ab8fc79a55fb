// End-to-end tests of the hub's S3 blob store seen from outside (hub layer, e2e): real `kiln hub`
// processes with `--blobs s3://…` on the radosgw CTest starts (fixture s3_store), the bucket
// inspected with awscli, an independent client.
//   DirectBlobUrls: presigned GET URLs (docs/fleet.md "Direct blob downloads"): a URL downloads
//     the exact bytes with no credentials, a tampered or expired one is refused by radosgw, a
//     worker's fetch takes the direct path (the hub streams no byte) and still checks the digest.
//   HubKilledMidUpload: SIGKILL of a hub while a multipart upload is in flight leaves no visible
//     blob, and a new hub on the same database and bucket takes a fresh publish of the cell.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include "src/kiln/base/file.h"
#include "src/kiln/base/sha256.h"
#include "src/kiln/cell/pack.h"
#include "src/kiln/client/hub_client.h"
#include "src/kiln/hub/authz.h"
#include "src/kiln/hub/s3_blob_store.h"
#include "tests/hub/hub_fixtures.h"
#include "tests/hub/hub_process.h"
#include "tests/hub/s3_test_env.h"

namespace kiln {
namespace {

using hub_testing::Graph;
using hub_testing::HubProcess;
using hub_testing::kAcme;
using hub_testing::kBeta;
using hub_testing::kPlatform;
using hub_testing::kWorker;
using hub_testing::MakeCell;
using hub_testing::MakeMetadata;
using hub_testing::Nonce;

constexpr const char* kScraper = "tok-metrics-scraper";

std::vector<TokenRow> Tokens() {
  return {
      {Sha256Hex(kPlatform), "ci", "publisher", "platform", "", {"*"}},
      {Sha256Hex(kAcme), "acme-ci", "publisher", "org", "acme", {}},
      {Sha256Hex(kBeta), "beta-ci", "publisher", "org", "beta", {}},
      {Sha256Hex(kWorker), "worker-1", "worker", "", "", {"*"}},
      {Sha256Hex(kScraper), "scraper", "metrics", "", "", {}},
  };
}

// GET of an absolute URL with no credentials: status and body.
std::pair<int, std::string> PlainGet(const std::string& url) {
  const size_t slash = url.find('/', url.find("://") + 3);
  httplib::Client http(url.substr(0, slash));
  http.set_url_encode(false);
  http.set_connection_timeout(5, 0);
  http.set_read_timeout(30, 0);
  auto res = http.Get(url.substr(slash));
  if (!res) return {-1, httplib::to_string(res.error())};
  return {res->status, res->body};
}

// One sample of the hub's /metrics (a scraper token), or -1.
double Metric(const HubProcess& hub, const std::string& series) {
  httplib::Client http(hub.url());
  auto res = http.Get("/metrics", {{"Authorization", std::string("Bearer ") + kScraper}});
  if (!res || res->status != 200) return -1;
  std::istringstream lines(res->body);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
  }
  return 0;
}

// `aws …` (awscli, the store's credentials from the environment) with its output, and rc.
std::pair<int, std::string> Aws(const std::string& root, const std::string& args) {
  const std::string out = root + "/aws-out.txt";
  const std::string cmd = "HOME='" + root + "' /usr/bin/aws --endpoint-url \"$KILN_S3_ENDPOINT\" " +
                          args + " > '" + out + "' 2>&1";
  const int rc = std::system(cmd.c_str());
  return {rc, hub_testing::ValueOr(ReadFile(out), std::string())};
}

class S3HubTest : public ::testing::Test {
 protected:
  void SetUp() override {
    KILN_REQUIRE_S3(env);
    for (const char* name :
         {"KILN_S3_ENDPOINT", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"}) {
      ::setenv(name, env->at(name).c_str(), 1);
    }
    bucket_ = env->at("KILN_S3_BUCKET");
    prefix_ = std::string("s3-direct-") +
              ::testing::UnitTest::GetInstance()->current_test_info()->name() + "-" + Nonce();
    s3_url_ = "s3://" + bucket_ + "/" + prefix_;
    S3Location loc = S3LocationFromUrl(s3_url_).value();
    s3_ = OpenS3BlobStore(loc).value();
    const char* pg = std::getenv("KILN_TEST_PG_URL");
    db_ = pg != nullptr ? pg : "";
    root_ = ::testing::TempDir() + "/kiln_s3_hub_" + Nonce() + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_ + "/data");
    ASSERT_TRUE(WriteSecretFileAtomic(root_ + "/tokens.json", TokensFileText(Tokens())).ok());
  }
  void TearDown() override {
    if (!HasFailure()) std::filesystem::remove_all(root_);
  }
  std::unique_ptr<HubProcess> StartHub(std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"--rebuild", "off", "--blobs", s3_url_};
    args.insert(args.end(), extra.begin(), extra.end());
    auto hub = std::make_unique<HubProcess>(root_ + "/data", db_, args);
    EXPECT_TRUE(hub->Start());
    return hub;
  }
  std::string FinalKey(const std::string& digest) const {
    return prefix_ + "/sha256/" + digest.substr(7);
  }

  std::string bucket_, prefix_, s3_url_, db_, root_;
  std::unique_ptr<BlobStore> s3_;  // the hub's bucket and prefix, seen from the test
};

using DirectBlobUrls = S3HubTest;

// The resolve answer's blob_url downloads the exact bytes with no credentials; radosgw refuses
// the URL with a changed signature and an expired one; a URL from awscli's own presigner works
// the same. A worker's FetchBlob takes the direct path: the hub streams no blob byte.
TEST_F(DirectBlobUrls, ResolveOffersAPresignedUrlThatRadosgwHonoursAndRefusesWhenTampered) {
  auto hub = StartHub({"--blob-url-ttl", "120"});
  const CellMetadata m = MakeMetadata(Graph("direct-url"));
  const std::string cell = MakeCell(m);
  PublishAnswer p = hub->Client(kPlatform)->Publish(cell, {});
  ASSERT_TRUE(p.ok()) << p.token << ": " << p.message;

  ResolveAnswer r = hub->Client(kWorker)->Resolve(m.key, m.family);
  ASSERT_EQ(r.kind, ResolveAnswer::Kind::kFound) << r.message;
  ASSERT_FALSE(r.blob_url.empty());
  EXPECT_EQ(r.blob_url_expires_in_s, 120);
  EXPECT_EQ(r.blob_url.rfind(std::string(std::getenv("KILN_S3_ENDPOINT")) + "/" + bucket_ + "/" +
                                 FinalKey(p.digest) + "?",
                             0),
            0u)
      << r.blob_url;
  EXPECT_NE(r.blob_url.find("X-Amz-Expires=120&"), std::string::npos) << r.blob_url;
  EXPECT_NE(r.blob_url.find("X-Amz-SignedHeaders=host&"), std::string::npos) << r.blob_url;

  auto [status, body] = PlainGet(r.blob_url);
  ASSERT_EQ(status, 200) << body;
  EXPECT_EQ(body, cell);

  // One hex digit of the signature changed: the store refuses it.
  std::string tampered = r.blob_url;
  tampered.back() = tampered.back() == '0' ? '1' : '0';
  auto [tampered_status, tampered_body] = PlainGet(tampered);
  EXPECT_EQ(tampered_status, 403) << tampered_body;
  EXPECT_NE(tampered_body.find("SignatureDoesNotMatch"), std::string::npos) << tampered_body;

  // A one-second URL (the same DirectUrl the hub calls), used after it expired.
  const std::string short_lived = s3_->DirectUrl(p.digest, 1).value();
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  auto [expired_status, expired_body] = PlainGet(short_lived);
  EXPECT_EQ(expired_status, 403) << expired_body;

  // awscli's presigner, an implementation kiln did not write, signs a URL that works the same.
  auto [rc, aws_url] =
      Aws(root_, "s3 presign 's3://" + bucket_ + "/" + FinalKey(p.digest) + "' --expires-in 60");
  ASSERT_EQ(rc, 0) << aws_url;
  while (!aws_url.empty() && (aws_url.back() == '\n' || aws_url.back() == '\r')) aws_url.pop_back();
  auto [aws_status, aws_body] = PlainGet(aws_url);
  EXPECT_EQ(aws_status, 200) << aws_url << "\n" << aws_body;
  EXPECT_EQ(aws_body, cell);

  // A worker's fetch: straight from the store, the hub streams nothing.
  const double streamed = Metric(*hub, "kiln_hub_blob_bytes_downloaded_total");
  ASSERT_GE(streamed, 0);
  const std::string dest = root_ + "/fetched.tar";
  HubAnswer f = hub->Client(kWorker)->FetchBlob(p.digest, dest, cell.size(), r.blob_url);
  ASSERT_TRUE(f.ok()) << f.token << ": " << f.message;
  EXPECT_EQ(f.body.value("via", ""), "direct") << f.body.dump();
  EXPECT_EQ(ReadFile(dest).value(), cell);
  // Without a URL in hand the client asks the hub for one (?direct=1, a 307).
  std::filesystem::remove(dest);
  HubAnswer asked = hub->Client(kWorker)->FetchBlob(p.digest, dest, cell.size());
  ASSERT_TRUE(asked.ok()) << asked.token << ": " << asked.message;
  EXPECT_EQ(asked.body.value("via", ""), "direct") << asked.body.dump();
  EXPECT_EQ(ReadFile(dest).value(), cell);
  EXPECT_EQ(Metric(*hub, "kiln_hub_blob_bytes_downloaded_total"), streamed);
  EXPECT_EQ(
      Metric(*hub, R"(kiln_hub_requests_total{method="GET",route="/v1/blobs/{}",code="307"})"), 1);

  // A URL that no longer works (tampered here; expired or unreachable alike): the client falls
  // back to the hub, which streams the bytes.
  std::filesystem::remove(dest);
  HubAnswer fallback = hub->Client(kWorker)->FetchBlob(p.digest, dest, cell.size(), tampered);
  ASSERT_TRUE(fallback.ok()) << fallback.token << ": " << fallback.message;
  EXPECT_EQ(fallback.body.value("via", ""), "hub") << fallback.body.dump();
  EXPECT_NE(fallback.body.value("direct_error", "").find("403"), std::string::npos)
      << fallback.body.dump();
  EXPECT_EQ(ReadFile(dest).value(), cell);
  EXPECT_EQ(Metric(*hub, "kiln_hub_blob_bytes_downloaded_total"), streamed + cell.size());

  // The right to a URL is the right to the bytes: another org's token gets the same 404 for an
  // acme cell with or without ?direct=1, and no URL; acme's own token gets its URL.
  const CellMetadata am = MakeMetadata(Graph("direct-acme"), "acme/direct");
  PublishAnswer ap = hub->Client(kAcme)->Publish(MakeCell(am), {});
  ASSERT_TRUE(ap.ok()) << ap.token << ": " << ap.message;
  for (const char* path : {"", "?direct=1"}) {
    HubAnswer refused = hub->Client(kBeta)->Call("GET", "/v1/blobs/" + ap.digest + path);
    EXPECT_EQ(refused.http_status, 404) << path;
    EXPECT_EQ(refused.token, "not_found") << path;
    EXPECT_FALSE(refused.body.contains("blob_url")) << path;
  }
  HubAnswer own = hub->Client(kAcme)->Call("GET", "/v1/blobs/" + ap.digest + "?direct=1");
  EXPECT_EQ(own.http_status, 307);
  EXPECT_NE(own.body.value("blob_url", "").find(ap.digest.substr(7)), std::string::npos)
      << own.body.dump();
}

// The store's copy replaced by other bytes (a damaged or tampered object): the direct download
// does not hash to the digest, the client falls back to the hub, whose bytes are the same bad
// ones; the client refuses them (digest_mismatch) and reports, and the hub quarantines its copy.
TEST_F(DirectBlobUrls, ReplacedObjectIsRefusedByTheDigestNotTrustedForTheUrl) {
  auto hub = StartHub();
  const CellMetadata m = MakeMetadata(Graph("direct-tamper"));
  const std::string cell = MakeCell(m);
  PublishAnswer p = hub->Client(kPlatform)->Publish(cell, {});
  ASSERT_TRUE(p.ok()) << p.token << ": " << p.message;
  std::string other = cell;
  other[other.size() / 2] ^= 0x01;
  ASSERT_TRUE(WriteFileAtomic(root_ + "/other.tar", other).ok());
  auto [rc, out] = Aws(
      root_, "s3 cp '" + root_ + "/other.tar' 's3://" + bucket_ + "/" + FinalKey(p.digest) + "'");
  ASSERT_EQ(rc, 0) << out;

  ResolveAnswer r = hub->Client(kWorker)->Resolve(m.key, m.family);
  ASSERT_EQ(r.kind, ResolveAnswer::Kind::kFound) << r.message;
  ASSERT_FALSE(r.blob_url.empty());
  // The URL itself serves the replaced bytes: nothing in it vouches for them.
  EXPECT_EQ(PlainGet(r.blob_url).second, other);

  const std::string dest = root_ + "/fetched.tar";
  HubAnswer f = hub->Client(kWorker)->FetchBlob(p.digest, dest, cell.size(), r.blob_url);
  EXPECT_EQ(f.token, "digest_mismatch") << f.message;
  EXPECT_NE(f.message.find("quarantined"), std::string::npos) << f.message;
  EXPECT_FALSE(std::filesystem::exists(dest));
  EXPECT_FALSE(std::filesystem::exists(dest + ".part"));
  EXPECT_FALSE(s3_->Has(p.digest)) << "the hub quarantined the replaced object";
}

// A hub started with --blob-url-ttl 0 mints no URL: no blob_url in the resolve answer, and
// ?direct=1 streams the bytes as before.
TEST_F(DirectBlobUrls, TtlZeroMintsNoUrlAndStreams) {
  auto hub = StartHub({"--blob-url-ttl", "0"});
  const CellMetadata m = MakeMetadata(Graph("direct-off"));
  const std::string cell = MakeCell(m);
  PublishAnswer p = hub->Client(kPlatform)->Publish(cell, {});
  ASSERT_TRUE(p.ok()) << p.token << ": " << p.message;
  ResolveAnswer r = hub->Client(kWorker)->Resolve(m.key, m.family);
  ASSERT_EQ(r.kind, ResolveAnswer::Kind::kFound) << r.message;
  EXPECT_EQ(r.blob_url, "");
  const std::string dest = root_ + "/fetched.tar";
  HubAnswer f = hub->Client(kWorker)->FetchBlob(p.digest, dest, cell.size());
  ASSERT_TRUE(f.ok()) << f.token << ": " << f.message;
  EXPECT_EQ(f.body.value("via", ""), "hub");
  EXPECT_EQ(f.body.count("direct_error"), 0u) << f.body.dump();
  EXPECT_EQ(ReadFile(dest).value(), cell);
}

// Forwards TCP connections from a loopback port to `to_port` (another address of the store, as a
// TCP load balancer would give readers), until destroyed. Each connection is pumped both ways on a
// thread of its own; every wait is bounded by poll timeouts.
class TcpForwarder {
 public:
  explicit TcpForwarder(int to_port) : to_port_(to_port) {
    listen_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(listen_, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    socklen_t len = sizeof(a);
    ::getsockname(listen_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    ::listen(listen_, 16);
    acceptor_ = std::thread([this] {
      while (!stop_) {
        pollfd p{listen_, POLLIN, 0};
        if (::poll(&p, 1, 100) <= 0) continue;
        const int in = ::accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC);
        if (in < 0) continue;
        const int out = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in b{};
        b.sin_family = AF_INET;
        b.sin_port = htons(to_port_);
        b.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (::connect(out, reinterpret_cast<sockaddr*>(&b), sizeof(b)) != 0) {
          ::close(in);
          ::close(out);
          continue;
        }
        pumps_.emplace_back([this, in, out] {
          char buf[65536];
          while (!stop_) {
            pollfd ps[2] = {{in, POLLIN, 0}, {out, POLLIN, 0}};
            if (::poll(ps, 2, 100) <= 0) continue;
            bool closed = false;
            for (int i = 0; i < 2 && !closed; ++i) {
              if (!(ps[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
              const ssize_t n = ::recv(ps[i].fd, buf, sizeof(buf), 0);
              closed = n <= 0 || ::send(ps[1 - i].fd, buf, n, MSG_NOSIGNAL) != n;
            }
            if (closed) break;
          }
          ::close(in);
          ::close(out);
        });
      }
    });
  }
  ~TcpForwarder() {
    stop_ = true;
    acceptor_.join();
    for (auto& t : pumps_) t.join();
    ::close(listen_);
  }
  int port() const { return port_; }

 private:
  int to_port_;
  int listen_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread acceptor_;
  std::vector<std::thread> pumps_;
};

// --blob-url-endpoint names the address readers reach the store by: the URL carries it (its host
// is signed) and works there, through a TCP forwarder standing in for a load balancer. A lifetime
// S3 would refuse, or an endpoint that is not http(s)://host[:port], refuses the hub's start
// with a message naming the value.
TEST_F(DirectBlobUrls, PublicEndpointNamesTheUrlHostAndBadSettingsRefuseTheStart) {
  const std::string endpoint = std::getenv("KILN_S3_ENDPOINT");
  TcpForwarder forwarder(std::stoi(endpoint.substr(endpoint.rfind(':') + 1)));
  const std::string public_endpoint = "http://127.0.0.1:" + std::to_string(forwarder.port());
  auto hub = StartHub({"--blob-url-endpoint", public_endpoint});
  const CellMetadata m = MakeMetadata(Graph("direct-public"));
  const std::string cell = MakeCell(m);
  PublishAnswer p = hub->Client(kPlatform)->Publish(cell, {});
  ASSERT_TRUE(p.ok()) << p.token << ": " << p.message;
  ResolveAnswer r = hub->Client(kWorker)->Resolve(m.key, m.family);
  ASSERT_EQ(r.kind, ResolveAnswer::Kind::kFound) << r.message;
  EXPECT_EQ(r.blob_url.rfind(public_endpoint + "/" + bucket_ + "/", 0), 0u) << r.blob_url;
  auto [status, body] = PlainGet(r.blob_url);
  EXPECT_EQ(status, 200) << body.substr(0, 400);
  EXPECT_TRUE(body == cell) << body.size() << " bytes";
  // The same signature at the store's own address names another host: refused.
  std::string elsewhere = r.blob_url;
  elsewhere.replace(0, public_endpoint.size(), endpoint);
  EXPECT_EQ(PlainGet(elsewhere).first, 403);
  hub.reset();

  const std::vector<std::pair<std::vector<std::string>, std::string>> refused = {
      {{"--blob-url-ttl", "604801"}, "--blob-url-ttl 604801"},
      {{"--blob-url-ttl", "-1"}, "--blob-url-ttl -1"},
      {{"--blob-url-endpoint", "ftp://store"}, "ftp://store"},
      {{"--blob-url-endpoint", "https://store/path"}, "https://store/path"},
  };
  for (const auto& [args, named] : refused) {
    std::vector<std::string> all = {"--rebuild", "off", "--blobs", s3_url_};
    all.insert(all.end(), args.begin(), args.end());
    HubProcess bad(root_ + "/data", db_, all);
    ::testing::AssertionResult started = bad.Start();
    EXPECT_FALSE(started) << named;
    EXPECT_NE(std::string(started.message()).find(named), std::string::npos) << started.message();
  }
  // Without an S3 store there are no direct URLs to name a host for.
  HubProcess disk(root_ + "/data", db_,
                  {"--rebuild", "off", "--blob-url-endpoint", public_endpoint});
  ::testing::AssertionResult started = disk.Start();
  EXPECT_FALSE(started);
  EXPECT_NE(std::string(started.message()).find("needs --blobs s3://"), std::string::npos)
      << started.message();
}

using HubKilledMidUpload = S3HubTest;

// SIGKILL of a hub while a multipart upload is in flight: the bucket holds no sha256/ object for
// the digest (awscli lists it), only the unfinished multipart upload under staging/; resolve is a
// miss; a new hub on the same database and bucket takes a fresh publish and serves it whole.
TEST_F(HubKilledMidUpload, LeavesNoVisibleBlobAndANewHubTakesTheRepublish) {
  auto hub = StartHub();
  const CellMetadata m = MakeMetadata(Graph("kill-mid-upload"));
  // 20 MiB of incompressible payload: three parts of the 8 MiB multipart size.
  std::string payload(20u << 20, '\0');
  std::mt19937_64 rng(42);
  for (size_t i = 0; i + 8 <= payload.size(); i += 8) {
    const uint64_t v = rng();
    std::memcpy(&payload[i], &v, 8);
  }
  const std::string cell = MakeCell(m, payload);
  const std::string digest = CellDigest(cell);
  ASSERT_GT(cell.size(), 16u << 20);

  HubAnswer intent = hub->Client(kPlatform)->Call(
      "POST", "/v1/publish/intent",
      nlohmann::json{
          {"key", m.key}, {"digest", digest}, {"size", cell.size()}, {"family", m.family}}
          .dump());
  ASSERT_TRUE(intent.ok()) << intent.token << ": " << intent.message;

  // The upload by hand: headers and the first 12 MiB, then the connection stalls (a slow
  // publisher) while the hub has sent a part to the store.
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(hub->port());
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  const std::string head = "PUT /v1/blobs/" + digest +
                           " HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + kPlatform +
                           "\r\nContent-Type: application/octet-stream\r\nContent-Length: " +
                           std::to_string(cell.size()) + "\r\n\r\n";
  const std::string sent = head + cell.substr(0, 12u << 20);
  for (size_t off = 0; off < sent.size();) {
    const ssize_t n = ::send(fd, sent.data() + off, sent.size() - off, MSG_NOSIGNAL);
    ASSERT_GT(n, 0) << "send: " << std::strerror(errno);
    off += static_cast<size_t>(n);
  }
  // Wait (at most 60 s) until the store shows the unfinished multipart upload.
  const std::string uploads_cmd =
      "s3api list-multipart-uploads --bucket '" + bucket_ + "' --prefix '" + prefix_ + "/staging/'";
  bool in_flight = false;
  for (int i = 0; i < 120 && !in_flight; ++i) {
    auto [rc, out] = Aws(root_, uploads_cmd);
    in_flight = rc == 0 && out.find(digest.substr(7)) != std::string::npos;
    if (!in_flight) std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  ASSERT_TRUE(in_flight) << "no multipart upload appeared; hub log:\n" << hub->Log();
  hub->Kill(SIGKILL);
  ::close(fd);

  // Nothing visible: awscli lists no sha256/ object; what is left is the unfinished upload.
  auto [ls_rc, listing] = Aws(root_, "s3 ls --recursive 's3://" + bucket_ + "/" + prefix_ + "/'");
  EXPECT_TRUE(ls_rc == 0 || listing.empty()) << listing;
  EXPECT_EQ(listing.find("sha256/"), std::string::npos) << listing;
  auto [head_rc, head_out] =
      Aws(root_, "s3api head-object --bucket '" + bucket_ + "' --key '" + FinalKey(digest) + "'");
  EXPECT_NE(head_rc, 0) << head_out;
  auto [up_rc, uploads] = Aws(root_, uploads_cmd);
  ASSERT_EQ(up_rc, 0) << uploads;
  EXPECT_NE(uploads.find(prefix_ + "/staging/" + digest.substr(7) + "."), std::string::npos)
      << "the leftover is the unfinished multipart upload:\n"
      << uploads;
  std::cout << "leftovers after SIGKILL: objects [" << listing << "], multipart uploads " << uploads
            << "\n";
  EXPECT_GE(s3_->TempFileCount(), 1);

  // The lifecycle rule docs/hub-api.md recommends for those leftovers is one radosgw accepts.
  const std::string rule_file = root_ + "/lifecycle.json";
  ASSERT_TRUE(
      WriteFileAtomic(
          rule_file,
          nlohmann::json{{"Rules",
                          {{{"ID", "kiln-staging-" + Nonce()},
                            {"Status", "Enabled"},
                            {"Filter", {{"Prefix", prefix_ + "/staging/"}}},
                            {"Expiration", {{"Days", 1}}},
                            {"AbortIncompleteMultipartUpload", {{"DaysAfterInitiation", 1}}}}}}}
              .dump())
          .ok());
  auto [put_rc, put_out] =
      Aws(root_, "s3api put-bucket-lifecycle-configuration --bucket '" + bucket_ +
                     "' --lifecycle-configuration 'file://" + rule_file + "'");
  EXPECT_EQ(put_rc, 0) << put_out;
  auto [get_rc, rules] =
      Aws(root_, "s3api get-bucket-lifecycle-configuration --bucket '" + bucket_ + "'");
  EXPECT_EQ(get_rc, 0) << rules;
  EXPECT_NE(rules.find("AbortIncompleteMultipartUpload"), std::string::npos) << rules;

  // A new hub process on the same database and bucket: a miss, then a whole fresh publish.
  auto next = StartHub();
  ResolveAnswer miss = next->Client(kWorker)->Resolve(m.key, m.family);
  EXPECT_EQ(miss.kind, ResolveAnswer::Kind::kMiss) << miss.token << " " << miss.message;
  PublishAnswer p = next->Client(kPlatform)->Publish(cell, {});
  ASSERT_TRUE(p.ok()) << p.token << ": " << p.message;
  EXPECT_EQ(p.digest, digest);
  ResolveAnswer found = next->Client(kWorker)->Resolve(m.key, m.family);
  ASSERT_EQ(found.kind, ResolveAnswer::Kind::kFound) << found.message;
  const std::string dest = root_ + "/fetched.tar";
  HubAnswer f = next->Client(kWorker)->FetchBlob(digest, dest, cell.size());
  ASSERT_TRUE(f.ok()) << f.token << ": " << f.message;
  EXPECT_EQ(Sha256File(dest).value(), digest.substr(7));
  EXPECT_EQ(s3_->ReadAll(digest).value(), cell);
  auto [ls2_rc, listing2] =
      Aws(root_, "s3 ls --recursive 's3://" + bucket_ + "/" + prefix_ + "/sha256/'");
  EXPECT_EQ(ls2_rc, 0) << listing2;
  EXPECT_NE(listing2.find(digest.substr(7)), std::string::npos) << listing2;
}

}  // namespace
}  // namespace kiln
