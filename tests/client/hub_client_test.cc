// Tests of the hub client (src/kiln/client/hub_client.h) that need no hub: a hub that is down or
// silent is a typed refusal, never a miss; trusted keys load from files and literals; offline
// receipt verification of resolve answers; reads retried through a gateway's 502/503/504, writes
// not. The client against a real hub: tests/hub/hub_api_test.
#include "src/kiln/client/hub_client.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "src/kiln/base/file.h"

namespace kiln {
namespace {

// A loopback socket; listening (accepts, never answers) or bound only (refuses connections).
struct Socket {
  explicit Socket(bool listen) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    socklen_t len = sizeof(a);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
    if (listen) ::listen(fd, 16);
  }
  ~Socket() { ::close(fd); }
  int fd;
  int port;
};

std::unique_ptr<HubClient> ClientFor(int port, double io_timeout) {
  HubClientOptions o;
  o.url = "http://127.0.0.1:" + std::to_string(port);
  o.token = "t";
  o.connect_timeout_s = 1;
  o.io_timeout_s = io_timeout;
  return HubClient::Create(o).value();
}

TEST(HubClient, HubDownIsARefusalNotAMiss) {
  Socket closed(/*listen=*/false);
  ResolveAnswer r = ClientFor(closed.port, 1)->Resolve("ck1-" + std::string(56, 'a'), "root/x");
  EXPECT_EQ(r.kind, ResolveAnswer::Kind::kRefused);
  EXPECT_EQ(r.token, "hub_unreachable") << r.message;
}

TEST(HubClient, SilentHubTimesOutAsARefusal) {
  Socket silent(/*listen=*/true);
  const auto start = std::chrono::steady_clock::now();
  ResolveAnswer r = ClientFor(silent.port, 0.5)->Resolve("ck1-" + std::string(56, 'a'), "root/x");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(r.kind, ResolveAnswer::Kind::kRefused);
  EXPECT_EQ(r.token, "hub_timeout") << r.message;
  EXPECT_LT(s, 5.0);
}

// A gateway in front of hub replicas: answers `bad_status` to the first `failures` requests,
// then 200 {"found":false}; counts every request by method.
class FlakyGateway {
 public:
  FlakyGateway(int failures, int bad_status) : failures_(failures), bad_status_(bad_status) {
    auto answer = [this](const httplib::Request& req, httplib::Response& res) {
      const int n = ++(req.method == "GET" ? gets_ : posts_);
      if (n <= failures_) {
        res.status = bad_status_;
        res.set_content("<html>no server is available</html>", "text/html");
      } else {
        res.set_content(R"({"found":false})", "application/json");
      }
    };
    server_.Get(".*", answer);
    server_.Post(".*", answer);
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    for (int i = 0; i < 200 && !server_.is_running(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  ~FlakyGateway() {
    server_.stop();
    thread_.join();
  }
  int port() const { return port_; }
  int gets() const { return gets_; }
  int posts() const { return posts_; }

 private:
  int failures_, bad_status_;
  httplib::Server server_;
  std::thread thread_;
  int port_ = 0;
  std::atomic<int> gets_{0}, posts_{0};
};

TEST(HubClient, ReadsRetryThroughAGatewaysBadAnswersWithinABound) {
  for (int status : {502, 503, 504}) {
    FlakyGateway gw(/*failures=*/2, status);
    ResolveAnswer r = ClientFor(gw.port(), 5)->Resolve("ck1-" + std::string(56, 'a'), "root/x");
    EXPECT_EQ(r.kind, ResolveAnswer::Kind::kMiss) << status << ": " << r.token << " " << r.message;
    EXPECT_EQ(gw.gets(), 3) << status;
  }
  // A gateway that never recovers: the first try and get_retries more, then its refusal, within
  // the backoff's bound (4 waits of at most 100, 200, 400, 800 ms).
  FlakyGateway down(/*failures=*/1000, 503);
  auto client = ClientFor(down.port(), 5);
  const auto start = std::chrono::steady_clock::now();
  ResolveAnswer r = client->Resolve("ck1-" + std::string(56, 'a'), "root/x");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(r.kind, ResolveAnswer::Kind::kRefused);
  EXPECT_EQ(r.http_status, 503);
  EXPECT_EQ(down.gets(), 1 + HubClientOptions{}.get_retries);
  EXPECT_LT(s, 3.0);
  EXPECT_GT(s, 0.7);  // at least half of each step: jitter never draws near zero
}

TEST(HubClient, WritesAreNotRepeatedOnAGatewaysBadAnswer) {
  FlakyGateway gw(/*failures=*/1, 502);
  HubAnswer a = ClientFor(gw.port(), 5)->Call("POST", "/v1/publish/complete", "{}");
  EXPECT_FALSE(a.ok());
  EXPECT_EQ(a.http_status, 502);
  EXPECT_EQ(gw.posts(), 1);
}

TEST(HubClient, RefusesNonHttpUrls) {
  HubClientOptions o;
  o.url = "ftp://hub";
  EXPECT_FALSE(HubClient::Create(o).ok());
}

TEST(TrustedKeys, LoadFromJwksFileAndLiteralAndVerifyOffline) {
  auto key = SigningKey::Generate().value();
  PublicKeySet set;
  ASSERT_TRUE(set.AddRaw(key.raw_public()).ok());
  const std::string path = ::testing::TempDir() + "/kiln_trust_test.json";
  ASSERT_TRUE(WriteFileAtomic(path, set.ToJwks().dump()).ok());
  auto from_file = LoadTrustedKeys(path);
  ASSERT_TRUE(from_file.ok()) << from_file.status().ToString();
  EXPECT_TRUE(from_file->Has(key.kid()));
  EXPECT_TRUE(LoadTrustedKeys(Base64UrlEncode(key.raw_public()))->Has(key.kid()));
  EXPECT_FALSE(LoadTrustedKeys("not a key").ok());

  ResolveAnswer a;
  a.kind = ResolveAnswer::Kind::kFound;
  a.key = "ck1-" + std::string(56, 'a');
  a.digest = "sha256:" + std::string(64, 'b');
  a.size = 10;
  a.family = "root/m";
  ReceiptClaims c{a.key, a.digest, a.size, a.family, "ci", "platform", "", 1, "", "", "", ""};
  a.receipt = SignReceipt(c, key).value();
  EXPECT_TRUE(VerifyResolvedReceipt(a, *from_file).ok());
  a.family = "acme/m";  // the answer and the receipt disagree
  EXPECT_EQ(VerifyResolvedReceipt(a, *from_file).token, "receipt_claim_mismatch");
  ResolveAnswer miss;
  miss.kind = ResolveAnswer::Kind::kMiss;
  EXPECT_FALSE(VerifyResolvedReceipt(miss, *from_file).ok());
}

}  // namespace
}  // namespace kiln
