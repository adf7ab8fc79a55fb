// Tests of the hub client (src/kiln/client/hub_client.h) that need no hub: a hub that is down or
// silent is a typed refusal, never a miss; trusted keys load from files and literals; offline
// receipt verification of resolve answers. The client against a real hub: tests/hub/hub_api_test.
#include "src/kiln/client/hub_client.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>

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
