// Tests of the broker's hub relay (src/kiln/client/hub_broker.h) in front of a stand-in hub: the
// capability is required, the hub token replaces it, the worker's routes pass with their status,
// body and headers as they came, every other route is refused without reaching the hub, and a hub
// that is down is the transport token a direct call would have seen.
#include "src/kiln/client/hub_broker.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <string>
#include <thread>

namespace kiln {
namespace {

constexpr const char* kToken = "tok-hub-secret";
constexpr const char* kCapability = "cap-of-the-serving-process";

// A stand-in hub: answers every request with what it received (method, target, Authorization,
// Range and body) as JSON, ten bytes cut to the request's Range on /v1/blobs/sha256:ranged, a 307
// with a Location on /v1/blobs/sha256:redirect, and counts requests.
class StandIn {
 public:
  StandIn() {
    auto echo = [this](const httplib::Request& req, httplib::Response& res) {
      ++requests_;
      if (req.path == "/v1/blobs/sha256:ranged") {
        res.set_content("0123456789", "application/octet-stream");  // the server cuts the range
        return;
      }
      if (req.path == "/v1/blobs/sha256:redirect") {
        res.status = 307;
        res.set_header("Location", "http://127.0.0.1:1/store/object");
        return;
      }
      res.set_header("Retry-After", "7");
      res.set_content(nlohmann::json{{"method", req.method},
                                     {"target", req.target},
                                     {"authorization", req.get_header_value("Authorization")},
                                     {"range", req.get_header_value("Range")},
                                     {"body", req.body}}
                          .dump(),
                      "application/json");
    };
    server_.Get(".*", echo);
    server_.Post(".*", echo);
    server_.Put(".*", echo);
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ~StandIn() {
    server_.stop();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int requests() const { return requests_.load(); }

 private:
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  std::atomic<int> requests_{0};
};

std::unique_ptr<HubBroker> BrokerFor(const std::string& url) {
  HubBrokerOptions o;
  o.hub.url = url;
  o.hub.token = kToken;
  o.hub.connect_timeout_s = 1;
  o.hub.io_timeout_s = 5;
  o.capability = kCapability;
  auto b = HubBroker::Start(o);
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  return b.ok() ? std::move(b).value() : nullptr;
}

httplib::Client ClientOf(const HubBroker& b, bool with_capability = true) {
  httplib::Client c("127.0.0.1", b.port());
  c.set_read_timeout(10, 0);
  if (with_capability) c.set_bearer_token_auth(kCapability);
  return c;
}

TEST(HubBroker, AllowsTheWorkerRoutesOnly) {
  const std::string key = "ck1-" + std::string(56, 'a');
  const std::string digest = "sha256:" + std::string(64, 'b');
  for (const auto& [m, p] : std::vector<std::pair<std::string, std::string>>{
           {"GET", "/v1/cells/" + key},
           {"GET", "/v1/receipts/" + key + "/" + digest},
           {"GET", "/v1/blobs/" + digest},
           {"PUT", "/v1/blobs/" + digest},
           {"POST", "/v1/blobs/" + digest + "/verify"},
           {"POST", "/v1/publish/intent"},
           {"POST", "/v1/publish/complete"},
           {"GET", "/.well-known/jwks.json"},
           {"GET", "/v1/revocations"},
           {"POST", "/v1/events"},
           {"POST", "/v1/obligations/settle"},
           {"POST", "/v1/mint-leases"},
           {"POST", "/v1/mint-leases/heartbeat"},
           {"POST", "/v1/mint-leases/release"}}) {
    EXPECT_TRUE(BrokerAllows(m, p)) << m << " " << p;
  }
  for (const auto& [m, p] : std::vector<std::pair<std::string, std::string>>{
           {"POST", "/v1/admin/revoke"},
           {"POST", "/v1/admin/rotate-key"},
           {"POST", "/v1/admin/tokens/revoke"},
           {"POST", "/v1/admin/receipts/resign"},
           {"GET", "/v1/events"},
           {"GET", "/"},
           {"GET", "/metrics"},
           {"DELETE", "/v1/blobs/" + digest},
           {"GET", "/v1/cells/" + key + "/../admin/revoke"},
           {"GET", "/v1/cells/a/b"},
           {"GET", "/v1/cells/.."},
           {"GET", "/v1/blobs/."},
           {"POST", "/v1/cells/" + key},
           {"GET", "/v1/revocations/x"}}) {
    EXPECT_FALSE(BrokerAllows(m, p)) << m << " " << p;
  }
}

TEST(HubBroker, ReplacesTheCapabilityWithTheTokenAndPassesTheAnswerAsItCame) {
  StandIn hub;
  auto broker = BrokerFor(hub.url());
  ASSERT_NE(broker, nullptr);
  auto c = ClientOf(*broker);
  auto r = c.Get("/v1/cells/ck1-x?family=root/mlp");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Retry-After"), "7");
  const auto seen = nlohmann::json::parse(r->body);
  EXPECT_EQ(seen["authorization"], std::string("Bearer ") + kToken);
  EXPECT_EQ(seen["target"], "/v1/cells/ck1-x?family=root/mlp");
  // A resumed download: the hub's 206 and its range, passed on as they are.
  auto ranged = c.Get("/v1/blobs/sha256:ranged", {{"Range", "bytes=5-"}});
  ASSERT_TRUE(ranged);
  EXPECT_EQ(ranged->status, 206);
  EXPECT_EQ(ranged->body, "56789");
  EXPECT_EQ(ranged->get_header_value("Content-Range"), "bytes 5-9/10");
  auto put = c.Put("/v1/blobs/sha256:abc", std::string("\0\1bytes", 7), "application/octet-stream");
  ASSERT_TRUE(put);
  EXPECT_EQ(nlohmann::json::parse(put->body)["body"], std::string("\0\1bytes", 7));
  // A 307 to the object store comes back as it is, not followed by the broker.
  auto redirect = c.Get("/v1/blobs/sha256:redirect?direct=1");
  ASSERT_TRUE(redirect);
  EXPECT_EQ(redirect->status, 307);
  EXPECT_EQ(redirect->get_header_value("Location"), "http://127.0.0.1:1/store/object");
}

TEST(HubBroker, RefusesWithoutTheCapabilityAndOffTheWorkerRoutesBeforeTheHub) {
  StandIn hub;
  auto broker = BrokerFor(hub.url());
  ASSERT_NE(broker, nullptr);
  auto anonymous = ClientOf(*broker, /*with_capability=*/false);
  auto r = anonymous.Get("/v1/revocations");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  EXPECT_EQ(nlohmann::json::parse(r->body)["error"], kBrokerUnauthenticated);
  // The hub token presented to the broker is no capability either.
  anonymous.set_bearer_token_auth(kToken);
  r = anonymous.Get("/v1/revocations");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  auto c = ClientOf(*broker);
  r = c.Post("/v1/admin/revoke", "{}", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 403);
  EXPECT_EQ(nlohmann::json::parse(r->body)["error"], kBrokerRouteForbidden);
  EXPECT_EQ(hub.requests(), 0);
}

TEST(HubBroker, AHubThatIsDownIsTheTransportToken) {
  std::string url;
  {
    StandIn gone;
    url = gone.url();
  }
  auto broker = BrokerFor(url);
  ASSERT_NE(broker, nullptr);
  auto c = ClientOf(*broker);
  auto r = c.Get("/v1/revocations");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 502);  // a GET a direct client would try again
  EXPECT_EQ(nlohmann::json::parse(r->body)["error"], kHubUnreachable);
  // Through a HubClient, as the serving process sees it: the same typed refusal.
  HubClientOptions o;
  o.url = "http://127.0.0.1:" + std::to_string(broker->port());
  o.token = kCapability;
  o.get_retries = 0;
  auto via = HubClient::Create(o);
  ASSERT_TRUE(via.ok());
  EXPECT_EQ((*via)->GetRevocations().token, kHubUnreachable);
}

}  // namespace
}  // namespace kiln
