// HubClient over cpp-httplib (client layer). Translates transport failures and hub error bodies
// into typed answers; see hub_client.h for the contracts.
#include "src/kiln/client/hub_client.h"

#include <httplib.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <thread>

#include "src/kiln/base/backoff.h"
#include "src/kiln/base/canonical_json.h"
#include "src/kiln/base/file.h"
#include "src/kiln/base/sha256.h"
#include "src/kiln/cell/metadata.h"
#include "src/kiln/cell/pack.h"
#include "src/kiln/net/address.h"

namespace kiln {

struct HubClient::Impl {
  HubClientOptions options;
  std::unique_ptr<httplib::Client> http;
  std::mutex mu;  // httplib::Client is used by one request at a time
  std::mutex kids_mu;
  std::set<std::string> refetched_kids;  // unknown kids a key-set refetch did not find

  httplib::Headers Headers() const {
    httplib::Headers h;
    if (!options.token.empty()) h.emplace("Authorization", "Bearer " + options.token);
    return h;
  }
};

namespace {

void SetTimeout(double seconds, const std::function<void(time_t, time_t)>& set) {
  const double s = seconds > 0 ? seconds : 1;
  set(static_cast<time_t>(s), static_cast<time_t>(std::fmod(s, 1.0) * 1e6));
}

// Whether a read's outcome is worth another try: a connection refused, one reset before the
// answer (it failed in under half the I/O timeout: a replica that died, not a silent one, which
// a retry would only wait for again), or a gateway's 502/503/504 (a replica that died, or none
// healthy). A hub's own refusals are answers.
bool RetryableRead(const httplib::Result& res, std::chrono::steady_clock::duration took,
                   double io_timeout_s) {
  if (!res) {
    const auto e = res.error();
    if (e == httplib::Error::Connection) return true;
    const bool reset = std::chrono::duration<double>(took).count() < io_timeout_s / 2;
    return reset && (e == httplib::Error::Read || e == httplib::Error::Write);
  }
  return res->status == 502 || res->status == 503 || res->status == 504;
}

HubAnswer Transport(const httplib::Error err, const std::string& url, const std::string& path) {
  HubAnswer a;
  const bool timeout = err == httplib::Error::ConnectionTimeout || err == httplib::Error::Read ||
                       err == httplib::Error::Write;
  const bool unreachable = err == httplib::Error::Connection;
  const bool tls = err == httplib::Error::SSLConnection || err == httplib::Error::SSLLoadingCerts ||
                   err == httplib::Error::SSLServerVerification;
  a.token = timeout       ? kHubTimeout
            : unreachable ? kHubUnreachable
            : tls         ? kHubTlsError
                          : kHubTransportError;
  a.message = "hub " + url + path + ": " + httplib::to_string(err);
  return a;
}

HubAnswer FromResponse(const httplib::Response& res, const std::string& url,
                       const std::string& path) {
  HubAnswer a;
  a.http_status = res.status;
  auto body = ParseJson(res.body, "hub answer to " + path);
  if (body.ok()) a.body = std::move(body).value();
  const bool success = res.status >= 200 && res.status < 300;
  if (success && !body.ok()) {
    a.token = kHubBadResponse;
    a.message = "hub " + url + path + " answered " + std::to_string(res.status) +
                " with a body that is not JSON: " + body.status().message();
    return a;
  }
  if (!success) {
    if (a.body.is_object() && a.body.contains("error") && a.body["error"].is_string()) {
      a.token = a.body["error"].get<std::string>();
      a.message = a.body.value("message", std::string());
    } else {
      a.token = kHubBadResponse;
      a.message = "hub " + url + path + " answered " + std::to_string(res.status) +
                  " without an error token";
    }
  }
  return a;
}

}  // namespace

bool IsHubTransportToken(const std::string& token) {
  return token == kHubUnreachable || token == kHubTimeout || token == kHubTransportError;
}

const char* ResolveKindName(ResolveAnswer::Kind kind) {
  switch (kind) {
    case ResolveAnswer::Kind::kFound:
      return "found";
    case ResolveAnswer::Kind::kMiss:
      return "miss";
    case ResolveAnswer::Kind::kRefused:
      return "refused";
  }
  return "refused";
}

HubClient::~HubClient() = default;

Result<std::unique_ptr<HubClient>> HubClient::Create(const HubClientOptions& options) {
  KILN_ASSIGN_OR_RETURN(net::HttpUrl url, net::ParseHttpUrl(options.url));
  KILN_RETURN_IF_ERROR(net::CheckClientTransport(url, options.insecure_http, "hub"));
  if (!options.ca_file.empty()) {
    if (!url.https()) {
      return Status::InvalidArgument("hub " + url.base + ": a CA file ('" + options.ca_file +
                                     "') was given for a plain http:// URL");
    }
    std::error_code ec;
    if (!std::filesystem::is_regular_file(options.ca_file, ec)) {
      return Status::NotFound("hub CA file '" + options.ca_file + "' does not exist");
    }
  }
  std::unique_ptr<HubClient> c(new HubClient());
  c->impl_ = std::make_unique<Impl>();
  c->impl_->options = options;
  c->impl_->options.url = url.base;
  c->impl_->http = std::make_unique<httplib::Client>(url.base);
  if (!c->impl_->http->is_valid()) {
    return Status::InvalidArgument("hub URL '" + options.url + "' is not valid");
  }
  auto& http = *c->impl_->http;
  if (url.https()) {
    http.enable_server_certificate_verification(true);
    if (!options.ca_file.empty()) http.set_ca_cert_path(options.ca_file.c_str());
  }
  SetTimeout(options.connect_timeout_s,
             [&](time_t s, time_t us) { http.set_connection_timeout(s, us); });
  SetTimeout(options.io_timeout_s, [&](time_t s, time_t us) { http.set_read_timeout(s, us); });
  SetTimeout(options.io_timeout_s, [&](time_t s, time_t us) { http.set_write_timeout(s, us); });
  http.set_keep_alive(true);
  http.set_tcp_nodelay(true);
  return c;
}

HubAnswer HubClient::Call(const std::string& method, const std::string& path,
                          const std::string& body, const std::string& content_type) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto& http = *impl_->http;
  auto send = [&] {
    return method == "GET"   ? http.Get(path, impl_->Headers())
           : method == "PUT" ? http.Put(path, impl_->Headers(), body, content_type)
                             : http.Post(path, impl_->Headers(), body, content_type);
  };
  auto started = std::chrono::steady_clock::now();
  httplib::Result res = send();
  // A connection the server dropped before answering (a reused keep-alive connection it closed,
  // or a reset under a burst of connections) gets one fresh retry. Every hub route is idempotent
  // (resolve and fetch read; intent, upload by digest and complete answer the same for the same
  // bytes), so a retry can never publish twice.
  if (!res && (res.error() == httplib::Error::Read || res.error() == httplib::Error::Write)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    started = std::chrono::steady_clock::now();
    res = send();
  }
  if (method == "GET") {
    // Replicas behind a load balancer: the replica a read went to may die under it (the balancer
    // answers 502, or 503 while it has no healthy replica; a direct connection fails). A read
    // changes nothing, so it is tried again, after a jittered wait (base/backoff.h) so that a
    // fleet that lost one replica does not return in one wave.
    for (int attempt = 0; attempt < impl_->options.get_retries &&
                          RetryableRead(res, std::chrono::steady_clock::now() - started,
                                        impl_->options.io_timeout_s);
         ++attempt) {
      auto wait = JitteredBackoff(std::chrono::milliseconds(impl_->options.retry_initial_ms),
                                  std::chrono::milliseconds(impl_->options.retry_max_ms), attempt);
      if (res && res->status == 503) {
        // A Retry-After the hub asked for, within what this client waits at most.
        const long after_s = std::atol(res->get_header_value("Retry-After").c_str());
        if (after_s > 0) {
          wait = std::max(wait, std::min(std::chrono::milliseconds(after_s * 1000),
                                         std::chrono::milliseconds(impl_->options.retry_max_ms)));
        }
      }
      std::this_thread::sleep_for(wait);
      started = std::chrono::steady_clock::now();
      res = send();
    }
  }
  if (!res) return Transport(res.error(), impl_->options.url, path);
  return FromResponse(*res, impl_->options.url, path);
}

RelayAnswer HubClient::Relay(const std::string& method, const std::string& target,
                             const std::string& body, const std::string& content_type,
                             const std::string& range) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto& http = *impl_->http;
  httplib::Headers headers = impl_->Headers();
  if (!range.empty()) headers.emplace("Range", range);
  const std::string type = content_type.empty() ? "application/octet-stream" : content_type;
  auto send = [&] {
    return method == "GET"   ? http.Get(target, headers)
           : method == "PUT" ? http.Put(target, headers, body, type)
                             : http.Post(target, headers, body, type);
  };
  auto started = std::chrono::steady_clock::now();
  httplib::Result res = send();
  // The keep-alive connection the hub closed meanwhile gets one fresh try, as in Call.
  if (!res && (res.error() == httplib::Error::Read || res.error() == httplib::Error::Write)) {
    started = std::chrono::steady_clock::now();
    res = send();
  }
  RelayAnswer a;
  if (!res) {
    const HubAnswer t = Transport(res.error(), impl_->options.url, target);
    a.token = t.token;
    a.message = t.message;
    a.retryable =
        RetryableRead(res, std::chrono::steady_clock::now() - started, impl_->options.io_timeout_s);
    return a;
  }
  a.http_status = res->status;
  a.body = std::move(res->body);
  a.content_type = res->get_header_value("Content-Type");
  a.location = res->get_header_value("Location");
  a.retry_after = res->get_header_value("Retry-After");
  a.content_range = res->get_header_value("Content-Range");
  return a;
}

ResolveAnswer HubClient::Resolve(const std::string& key, const std::string& family) {
  ResolveAnswer r;
  HubAnswer a = Call("GET", "/v1/cells/" + key + "?family=" + family);
  r.http_status = a.http_status;
  if (!a.ok()) {
    r.token = a.token;
    r.message = a.message;
    return r;
  }
  const auto& b = a.body;
  if (!b.is_object() || !b.contains("found") || !b["found"].is_boolean()) {
    r.token = kHubBadResponse;
    r.message = "resolve " + key + ": the answer has no boolean 'found'";
    return r;
  }
  if (!b["found"].get<bool>()) {
    r.kind = ResolveAnswer::Kind::kMiss;
    return r;
  }
  try {
    r.key = b.at("key").get<std::string>();
    r.digest = b.at("digest").get<std::string>();
    r.size = b.at("size").get<uint64_t>();
    r.family = b.at("family").get<std::string>();
    r.receipt = b.at("receipt").get<std::string>();
    r.blob_url = b.value("blob_url", std::string());
    r.blob_url_expires_in_s = b.value("blob_url_expires_in_s", int64_t{0});
    r.publisher = b.value("publisher", std::string());
    r.tier = b.value("tier", std::string());
    r.release = b.value("release", std::string());
  } catch (const std::exception& e) {
    r.token = kHubBadResponse;
    r.message = "resolve " + key + ": found answer is missing a field: " + e.what();
    return r;
  }
  // The hub must answer exactly what was asked.
  if (r.key != key) {
    r.token = kRefusalResolveKeyMismatch;
    r.message = "resolve " + key + ": the hub answered for key " + r.key;
    return r;
  }
  if (r.family != family) {
    r.token = kRefusalResolveScopeMismatch;
    r.message =
        "resolve " + key + " in family " + family + ": the hub answered for family " + r.family;
    return r;
  }
  r.kind = ResolveAnswer::Kind::kFound;
  return r;
}

HubAnswer HubClient::PublishIntentWaiting(const std::string& intent, int wait_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms);
  constexpr int kMaxAttempts = 64;
  for (int attempt = 0;; ++attempt) {
    HubAnswer a = Call("POST", "/v1/publish/intent", intent);
    if (a.token != kHubPublishInProgress || attempt + 1 >= kMaxAttempts) return a;
    // Jittered: the publishers that lost one race do not all come back in the same instant.
    const auto delay =
        JitteredBackoff(std::chrono::milliseconds(250), std::chrono::milliseconds(4000), attempt);
    if (std::chrono::steady_clock::now() + delay > deadline) return a;
    std::this_thread::sleep_for(delay);
  }
}

PublishAnswer HubClient::Publish(std::string_view cell_tar, const PublishOptions& options) {
  PublishAnswer out;
  auto refuse = [&](const HubAnswer& a) {
    out.token = a.token;
    out.message = a.message;
    out.http_status = a.http_status;
    if (a.body.is_object() && a.body.contains("receipt") && a.body["receipt"].is_string()) {
      out.receipt = a.body["receipt"].get<std::string>();
    }
    return out;
  };
  auto files = UnpackCell(cell_tar, "cell to publish");
  if (!files.ok()) {
    out.token = "bad_cell";
    out.message = files.status().message();
    return out;
  }
  auto meta = ParseMetadata(files->metadata_json, "metadata.json of the cell to publish");
  if (!meta.ok()) {
    out.token = "bad_metadata";
    out.message = meta.status().message();
    return out;
  }
  out.key = meta->key;
  out.digest = CellDigest(cell_tar);
  nlohmann::json intent{{"key", out.key},
                        {"digest", out.digest},
                        {"size", cell_tar.size()},
                        {"family", options.family.empty() ? meta->family : options.family}};
  if (!options.release.empty()) intent["release"] = options.release;
  if (!options.target.empty()) intent["target"] = options.target;
  HubAnswer a = PublishIntentWaiting(intent.dump(), options.claim_wait_ms);
  if (!a.ok()) return refuse(a);
  if (a.body.value("already", false)) {
    out.already = true;
    out.receipt = a.body.value("receipt", std::string());
    return out;
  }
  if (!a.body.value("have_blob", false)) {
    HubAnswer up =
        Call("PUT", "/v1/blobs/" + out.digest, std::string(cell_tar), "application/octet-stream");
    if (!up.ok()) return refuse(up);
  }
  HubAnswer done = Call("POST", "/v1/publish/complete",
                        nlohmann::json{{"key", out.key}, {"digest", out.digest}}.dump());
  if (!done.ok()) return refuse(done);
  out.already = done.body.value("already", false);
  out.receipt = done.body.value("receipt", std::string());
  return out;
}

namespace {

// The bytes of one GET appended to a partial download: what came back and where it points next.
struct Download {
  httplib::Result res{nullptr, httplib::Error::Unknown};
  int status = 0;
  std::string error_body;
  std::string location;  // of a 307
};

// Sends GET `target` on `http` with `headers` (plus a Range from `*have` bytes), appending a
// 200/206 body to `part` (a 200 to a Range request restarts it: *have becomes 0).
Download GetInto(httplib::Client& http, const std::string& target, httplib::Headers headers,
                 const std::string& part, uint64_t* have) {
  Download d;
  std::ofstream out(part, std::ios::binary | std::ios::app);
  if (!out) {
    d.status = -1;
    return d;
  }
  if (*have > 0) headers.emplace("Range", "bytes=" + std::to_string(*have) + "-");
  d.res = http.Get(
      target, headers,
      [&](const httplib::Response& r) {
        d.status = r.status;
        if (r.status == 307) d.location = r.get_header_value("Location");
        // A 200 to a Range request is the whole blob: start over.
        if (d.status == 200 && *have > 0) {
          out.close();
          out.open(part, std::ios::binary | std::ios::trunc);
          *have = 0;
        }
        return true;
      },
      [&](const char* data, size_t len) {
        if (d.status == 200 || d.status == 206) {
          out.write(data, static_cast<std::streamsize>(len));
          return static_cast<bool>(out);
        }
        d.error_body.append(data, len);
        return d.error_body.size() < (1 << 20);
      });
  return d;
}

uint64_t PartSize(const std::string& part) {
  std::error_code ec;
  const uint64_t n = std::filesystem::exists(part, ec) ? std::filesystem::file_size(part, ec) : 0;
  return ec ? 0 : n;
}

// The SHA-256 of `part` is `digest` and its size `expected_size` (when given): "" or why not.
std::string CheckPart(const std::string& part, const std::string& digest,
                      std::optional<uint64_t> expected_size) {
  auto hex = Sha256File(part);
  if (!hex.ok()) return hex.status().message();
  const uint64_t size = PartSize(part);
  if ("sha256:" + *hex == digest && (!expected_size || size == *expected_size)) return "";
  return "hashes to sha256:" + *hex + " (" + std::to_string(size) + " bytes)";
}

}  // namespace

// One try of the direct path: "" when `part` now holds the digest's bytes, else why not; a failed
// try leaves in `part` no byte it received.
std::string HubClient::FetchDirect(const std::string& url, const std::string& digest,
                                   const std::string& part, std::optional<uint64_t> expected_size,
                                   int* status) {
  const size_t scheme = url.find("://");
  const size_t slash = scheme == std::string::npos ? std::string::npos : url.find('/', scheme + 3);
  if (slash == std::string::npos) return "direct URL is not http(s)://host/path";
  auto base = net::ParseHttpUrl(url.substr(0, slash));
  if (!base.ok()) return base.status().message();
  if (Status rule = net::CheckClientTransport(*base, impl_->options.insecure_http, "blob store");
      !rule.ok()) {
    return rule.message();
  }
  httplib::Client http(base->base);
  http.set_url_encode(false);
  if (base->https()) http.enable_server_certificate_verification(true);
  SetTimeout(impl_->options.connect_timeout_s,
             [&](time_t s, time_t us) { http.set_connection_timeout(s, us); });
  SetTimeout(impl_->options.io_timeout_s,
             [&](time_t s, time_t us) { http.set_read_timeout(s, us); });
  uint64_t have = PartSize(part);
  if (expected_size && have > *expected_size) {
    std::error_code ec;
    std::filesystem::remove(part, ec);
    have = 0;
  }
  // No Authorization: the URL carries its own, and the hub's token is not the store's business.
  const uint64_t before = have;
  Download d = GetInto(http, url.substr(slash), {}, part, &have);
  if (d.status == -1) return "cannot open '" + part + "' for writing";
  if (!d.res) {
    // Bytes of a cut-off direct download are unchecked: the hub's fetch resumes from what was
    // there before this try, never from them.
    std::error_code ec;
    if (have == before && before > 0) {
      std::filesystem::resize_file(part, before, ec);
    } else {
      std::filesystem::remove(part, ec);
    }
    return "blob store " + base->base + ": " + httplib::to_string(d.res.error());
  }
  *status = d.status;
  if (d.status != 200 && d.status != 206) {
    const size_t code = d.error_body.find("<Code>");
    const size_t code_end = d.error_body.find("</Code>");
    return "blob store answered HTTP " + std::to_string(d.status) +
           (code != std::string::npos && code_end != std::string::npos
                ? " " + d.error_body.substr(code + 6, code_end - code - 6)
                : "");
  }
  if (std::string bad = CheckPart(part, digest, expected_size); !bad.empty()) {
    std::error_code ec;
    std::filesystem::remove(part, ec);
    return "blob " + digest + " from the store " + bad;
  }
  return "";
}

HubAnswer HubClient::FetchBlob(const std::string& digest, const std::string& dest_path,
                               std::optional<uint64_t> expected_size,
                               const std::string& direct_url) {
  const std::string part = dest_path + ".part";
  std::error_code ec;
  uint64_t have = PartSize(part);
  if (expected_size && have > *expected_size) {
    std::filesystem::remove(part, ec);
    have = 0;
  }
  const std::string path = "/v1/blobs/" + digest;
  std::string direct_error;
  int direct_status = 0;
  auto finish = [&](const char* via, int status) {
    HubAnswer a;
    a.http_status = status;
    a.body = {{"via", via}};
    if (!direct_error.empty()) a.body["direct_error"] = direct_error;
    std::filesystem::rename(part, dest_path, ec);
    if (ec) {
      a.token = "io_error";
      a.message = "rename '" + part + "' -> '" + dest_path + "': " + ec.message();
    }
    return a;
  };
  if (!direct_url.empty()) {
    direct_error = FetchDirect(direct_url, digest, part, expected_size, &direct_status);
    if (direct_error.empty()) return finish("direct", direct_status);
    have = PartSize(part);
  }
  std::unique_lock<std::mutex> lock(impl_->mu);
  // Without a URL in hand, the hub is asked for one; a hub that mints none streams the bytes.
  Download d = GetInto(*impl_->http, direct_url.empty() ? path + "?direct=1" : path,
                       impl_->Headers(), part, &have);
  lock.unlock();
  if (d.status == -1) {
    HubAnswer a;
    a.token = "io_error";
    a.message = "cannot open '" + part + "' for writing";
    return a;
  }
  if (d.res && d.status == 307) {
    direct_error = d.location.empty()
                       ? "the hub's 307 has no Location"
                       : FetchDirect(d.location, digest, part, expected_size, &direct_status);
    if (direct_error.empty()) return finish("direct", direct_status);
    have = PartSize(part);
    lock.lock();
    d = GetInto(*impl_->http, path, impl_->Headers(), part, &have);
    lock.unlock();
  }
  if (!d.res) return Transport(d.res.error(), impl_->options.url, path);
  if (d.status != 200 && d.status != 206) {
    httplib::Response r;
    r.status = d.status;
    r.body = d.error_body;
    return FromResponse(r, impl_->options.url, path);
  }
  if (std::string bad = CheckPart(part, digest, expected_size); !bad.empty()) {
    HubAnswer a;
    a.http_status = d.status;
    std::filesystem::remove(part, ec);
    a.token = "digest_mismatch";
    a.message = "blob " + digest + " from the hub " + bad;
    // Tell the hub at once: it re-reads its copy and quarantines it if its disk damaged it, so
    // the next fetch (this worker's or any other's) is a clean miss instead of the same bad bytes.
    // A transfer that went wrong on the way finds the hub's copy intact and changes nothing.
    HubAnswer report = Call("POST", path + "/verify", "{}");
    if (report.ok()) {
      a.message += report.body.value("quarantined", false)
                       ? "; reported: the hub quarantined its damaged copy"
                       : "; reported: the hub's copy is intact";
    }
    return a;
  }
  return finish("hub", d.status);
}

HubAnswer HubClient::GetReceipt(const std::string& key, const std::string& digest) {
  return Call("GET", "/v1/receipts/" + key + "/" + digest);
}
HubAnswer HubClient::GetJwks() { return Call("GET", "/.well-known/jwks.json"); }
HubAnswer HubClient::GetRevocations() { return Call("GET", "/v1/revocations"); }
HubAnswer HubClient::Revoke(const std::string& key, const std::string& digest,
                            const std::string& reason) {
  return Call("POST", "/v1/admin/revoke",
              nlohmann::json{{"key", key}, {"digest", digest}, {"reason", reason}}.dump());
}
HubAnswer HubClient::Reinstate(const std::string& key, const std::string& digest,
                               const std::string& reason) {
  return Call("POST", "/v1/admin/reinstate",
              nlohmann::json{{"key", key}, {"digest", digest}, {"reason", reason}}.dump());
}
HubAnswer HubClient::PostEvents(const nlohmann::json& rows) {
  return Call("POST", "/v1/events", rows.dump());
}
HubAnswer HubClient::SettleObligation(const std::string& release, const std::string& target,
                                      const std::string& sm, const std::string& token) {
  return Call("POST", "/v1/obligations/settle",
              nlohmann::json{{"release", release}, {"target", target}, {"sm", sm}, {"token", token}}
                  .dump());
}

Result<PublicKeySet> LoadTrustedKeys(const std::string& path_or_text) {
  std::error_code ec;
  if (std::filesystem::is_regular_file(path_or_text, ec)) {
    KILN_ASSIGN_OR_RETURN(std::string text, ReadFile(path_or_text));
    return PublicKeySet::FromText(text, "trusted keys '" + path_or_text + "'");
  }
  return PublicKeySet::FromText(path_or_text, "trusted keys (literal)");
}

namespace {

// The "kid" of a JWS header, or "" when the header does not decode.
std::string ReceiptKid(const std::string& jws) {
  const size_t dot = jws.find('.');
  if (dot == std::string::npos) return "";
  auto header = Base64UrlDecode(std::string_view(jws).substr(0, dot), "receipt header");
  if (!header.ok()) return "";
  auto j = nlohmann::json::parse(*header, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("kid") || !j["kid"].is_string()) return "";
  return j["kid"].get<std::string>();
}

}  // namespace

Status HubClient::AddHubKeys(PublicKeySet* trusted) {
  HubAnswer jwks = GetJwks();
  if (!jwks.ok()) {
    return Status::Refused(StatusCode::kIOError, jwks.token,
                           "fetching the hub's key set: " + jwks.message);
  }
  KILN_ASSIGN_OR_RETURN(PublicKeySet fetched, PublicKeySet::FromJwks(jwks.body));
  return trusted->AddAll(fetched);
}

ReceiptVerdict HubClient::VerifyReceipt(const ResolveAnswer& answer, PublicKeySet* trusted) {
  ReceiptVerdict v = VerifyResolvedReceipt(answer, *trusted);
  if (v.token != "receipt_unknown_kid") return v;
  const std::string kid = ReceiptKid(answer.receipt);
  {
    std::lock_guard<std::mutex> lock(impl_->kids_mu);
    if (impl_->refetched_kids.count(kid) != 0) {
      v.message += "; the hub's key set did not have it either when refetched";
      return v;
    }
  }
  HubAnswer jwks = GetJwks();
  if (!jwks.ok()) {
    v.message += "; refetching the hub's key set failed: " + jwks.token + ": " + jwks.message;
    return v;
  }
  auto fetched = PublicKeySet::FromJwks(jwks.body);
  if (!fetched.ok()) {
    v.message += "; the hub's refetched key set is refused: " + fetched.status().message();
    return v;
  }
  if (Status s = trusted->AddAll(*fetched); !s.ok()) {
    v.message += "; a refetched key is refused: " + s.message();
    return v;
  }
  ReceiptVerdict again = VerifyResolvedReceipt(answer, *trusted);
  if (again.token == "receipt_unknown_kid") {
    std::lock_guard<std::mutex> lock(impl_->kids_mu);
    impl_->refetched_kids.insert(kid);
    again.message += " (after refetching the hub's key set)";
  }
  return again;
}

ReceiptVerdict VerifyResolvedReceipt(const ResolveAnswer& answer, const PublicKeySet& trusted) {
  if (answer.kind != ResolveAnswer::Kind::kFound) {
    ReceiptVerdict v;
    v.token = "receipt_malformed";
    v.message =
        "no receipt: the resolve answer is '" + std::string(ResolveKindName(answer.kind)) + "'";
    return v;
  }
  ExpectedClaims expected{answer.key, answer.digest, answer.size, answer.family};
  return VerifyReceipt(answer.receipt, trusted, expected);
}

}  // namespace kiln
