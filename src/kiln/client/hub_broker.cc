// The hub relay of a worker's broker process over cpp-httplib (see hub_broker.h).
#include "src/kiln/client/hub_broker.h"

#include <httplib.h>

#include <algorithm>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string_view>
#include <thread>
#include <vector>

namespace kiln {
namespace {

// Compares without an early exit, so the capability cannot be guessed a byte at a time.
bool SameSecret(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

void Refuse(httplib::Response& res, int status, const char* token, const std::string& message) {
  res.status = status;
  res.set_content(nlohmann::json{{"error", token}, {"message", message}}.dump(),
                  "application/json");
}

}  // namespace

namespace {

// Whether `part` is one path segment of a key, a digest or a name: letters, digits and
// `._:@%-`, at least one.
bool IsSegment(std::string_view part) {
  if (part.empty()) return false;
  for (char c : part) {
    const bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == ':' || c == '@' || c == '%' || c == '-';
    if (!ok) return false;
  }
  return true;
}

// Whether `path` is `pattern`, where each `*` segment of the pattern matches one IsSegment.
// (Matched by hand, not with <regex>: the routes are fixed, and a segment test says exactly what
// a placeholder admits.)
bool MatchesRoute(std::string_view pattern, std::string_view path) {
  while (!pattern.empty() || !path.empty()) {
    if (pattern.empty() || path.empty() || pattern[0] != '/' || path[0] != '/') return false;
    pattern.remove_prefix(1);
    path.remove_prefix(1);
    const size_t pe = std::min(pattern.find('/'), pattern.size());
    const size_t xe = std::min(path.find('/'), path.size());
    const std::string_view want = pattern.substr(0, pe), got = path.substr(0, xe);
    if (want == "*" ? !IsSegment(got) : want != got) return false;
    pattern.remove_prefix(pe);
    path.remove_prefix(xe);
  }
  return true;
}

}  // namespace

bool BrokerAllows(const std::string& method, const std::string& path) {
  static const std::vector<std::pair<std::string_view, std::string_view>> kRoutes = {
      {"GET", "/v1/cells/*"},
      {"GET", "/v1/receipts/*/*"},
      {"GET", "/v1/blobs/*"},
      {"PUT", "/v1/blobs/*"},
      {"POST", "/v1/blobs/*/verify"},
      {"POST", "/v1/publish/intent"},
      {"POST", "/v1/publish/complete"},
      {"GET", "/.well-known/jwks.json"},
      {"GET", "/v1/revocations"},
      {"POST", "/v1/events"},
      {"POST", "/v1/obligations/settle"},
      {"POST", "/v1/mint-leases"},
      {"POST", "/v1/mint-leases/heartbeat"},
      {"POST", "/v1/mint-leases/release"},
  };
  // A segment of dots would name another route once the hub resolves it.
  if (path.find("/.") != std::string::npos && path != "/.well-known/jwks.json") return false;
  for (const auto& [m, route] : kRoutes) {
    if (m == method && MatchesRoute(route, path)) return true;
  }
  return false;
}

struct HubBroker::Impl {
  HubBrokerOptions options;
  httplib::Server server;
  std::thread thread;
  int port = 0;
  std::mutex mu;
  std::vector<std::unique_ptr<HubClient>> idle;  // upstream clients, one per request in flight

  Result<std::unique_ptr<HubClient>> Take() {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!idle.empty()) {
        auto c = std::move(idle.back());
        idle.pop_back();
        return c;
      }
    }
    return HubClient::Create(options.hub);
  }
  void Give(std::unique_ptr<HubClient> c) {
    std::lock_guard<std::mutex> lock(mu);
    if (idle.size() < 8) idle.push_back(std::move(c));
  }

  void Serve(const httplib::Request& req, httplib::Response& res) {
    if (!SameSecret(req.get_header_value("Authorization"), "Bearer " + options.capability)) {
      Refuse(res, 401, kBrokerUnauthenticated,
             "the worker's hub broker answers its own serving process only");
      return;
    }
    if (!BrokerAllows(req.method, req.path)) {
      Refuse(res, 403, kBrokerRouteForbidden,
             req.method + " " + req.path +
                 " is not a route a worker uses; the broker does not pass it to the hub");
      return;
    }
    const bool publish = req.method == "POST" && req.path == "/v1/publish/complete";
    HubClientOptions slow = options.hub;
    slow.io_timeout_s = std::max(slow.io_timeout_s, options.publish_io_timeout_s);
    Result<std::unique_ptr<HubClient>> client = publish ? HubClient::Create(slow) : Take();
    if (!client.ok()) {
      Refuse(res, 500, kHubTransportError, client.status().message());
      return;
    }
    RelayAnswer a =
        (*client)->Relay(req.method, req.target, req.body, req.get_header_value("Content-Type"),
                         req.get_header_value("Range"));
    // The hub already answered the Range (206 and the bytes of the range); cpp-httplib's server
    // would cut the body to the range once more. The request object is the server's own,
    // non-const one, handed to handlers as const.
    const_cast<httplib::Request&>(req).ranges.clear();
    if (!publish) Give(std::move(client).value());
    if (!a.token.empty()) {
      Refuse(res, a.retryable ? 502 : 500, a.token.c_str(), a.message);
      return;
    }
    res.status = a.http_status;
    if (!a.location.empty()) res.set_header("Location", a.location);
    if (!a.retry_after.empty()) res.set_header("Retry-After", a.retry_after);
    if (!a.content_range.empty()) res.set_header("Content-Range", a.content_range);
    res.set_content(std::move(a.body),
                    a.content_type.empty() ? "application/octet-stream" : a.content_type);
  }
};

Result<std::unique_ptr<HubBroker>> HubBroker::Start(HubBrokerOptions options) {
  if (options.capability.empty()) {
    return Status::InvalidArgument("hub broker: the capability is empty");
  }
  // The upstream settings are checked now (URL, transport rule, CA file), not at the first call.
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<HubClient> first, HubClient::Create(options.hub));
  std::unique_ptr<HubBroker> b(new HubBroker());
  b->impl_ = std::make_unique<Impl>();
  Impl* impl = b->impl_.get();
  impl->options = std::move(options);
  impl->idle.push_back(std::move(first));
  auto serve = [impl](const httplib::Request& req, httplib::Response& res) {
    impl->Serve(req, res);
  };
  impl->server.Get(".*", serve);
  impl->server.Post(".*", serve);
  impl->server.Put(".*", serve);
  impl->server.Delete(".*", serve);
  impl->server.Patch(".*", serve);
  // A publish's upload and a slow hub's answer take longer than httplib's 5 s defaults.
  impl->server.set_read_timeout(static_cast<time_t>(std::max(5.0, impl->options.hub.io_timeout_s)),
                                0);
  impl->server.set_write_timeout(static_cast<time_t>(std::max(5.0, impl->options.hub.io_timeout_s)),
                                 0);
  impl->port = impl->server.bind_to_any_port("127.0.0.1");
  if (impl->port <= 0) return Status::IOError("hub broker: cannot listen on 127.0.0.1");
  impl->thread = std::thread([impl] { impl->server.listen_after_bind(); });
  while (!impl->server.is_running() && impl->thread.joinable()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return b;
}

HubBroker::~HubBroker() { Stop(); }

int HubBroker::port() const { return impl_->port; }

void HubBroker::Stop() {
  if (impl_ && impl_->thread.joinable()) {
    impl_->server.stop();
    impl_->thread.join();
  }
}

}  // namespace kiln
