// HubServer: binds HubService to HTTP through the net layer's HttpServer, and opens a hub's data
// dir (hub layer). This file is the one place a Reply becomes an HTTP response. Every route that
// takes a body authenticates first and reads the body only then, bounded by the route's limit;
// the HttpServer has already refused a Content-Length over that limit with 413, body unread.
#include "src/kiln/hub/server.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <thread>

#include "src/kiln/base/clock.h"
#include "src/kiln/base/file.h"
#include "src/kiln/base/log.h"
#include "src/kiln/base/sha256.h"
#include "src/kiln/hub/pg_shared.h"
#include "src/kiln/hub/s3_blob_store.h"
#include "src/kiln/identity/toolchain.h"
#include "src/kiln/net/http_server.h"

namespace kiln {

namespace {

// The builders of a hub that rebuilds for several toolchains: its own compiler's first (the
// sandbox's cxx, else $KILN_CXX, else c++), then each of `more`, one sandboxed builder each,
// named after the base builder name and the compiler. A compiler listed twice, or one whose
// toolchain is another's, is refused: two builders would claim the same cells.
Result<std::unique_ptr<CellBuilder>> ToolchainBuilders(const SandboxOptions& sandbox,
                                                       const std::vector<std::string>& more) {
  std::vector<ToolchainBuilder> builders;
  std::vector<std::string> compilers = {sandbox.cxx};
  compilers.insert(compilers.end(), more.begin(), more.end());
  for (size_t i = 0; i < compilers.size(); ++i) {
    Result<Toolchain> t =
        i == 0 && compilers[i].empty() ? LocalToolchain() : ToolchainOf(compilers[i]);
    if (!t.ok()) {
      return Status::InvalidArgument("hub: --builder-toolchain '" + compilers[i] +
                                     "': " + t.status().message());
    }
    const nlohmann::json block = t->Block();
    for (const ToolchainBuilder& b : builders) {
      if (b.toolchain == block) {
        return Status::InvalidArgument("hub: --builder-toolchain '" + compilers[i] +
                                       "' is the toolchain of another builder ('" +
                                       t->compiler_version + "')");
      }
    }
    SandboxOptions o = sandbox;
    o.cxx = t->compiler_path;
    if (i > 0) {
      const std::string base = sandbox.name.empty() ? DefaultBuilderName() : sandbox.name;
      o.name = base + "/" + std::filesystem::path(compilers[i]).filename().string();
    }
    builders.push_back({block, NewSandboxedBuilder(std::move(o))});
  }
  return NewToolchainRouter(std::move(builders));
}

// Body limits per route. JSON routes carry a few hundred bytes; an event batch at most 10000
// rows of a few hundred bytes each; a blob up to HubOptions::max_blob_bytes.
constexpr uint64_t kJsonBodyLimit = 1 << 20;
constexpr uint64_t kEventsBodyLimit = 16 << 20;

net::Response Send(const Reply& r) {
  if (!r.html.empty()) return net::Response::Text(r.status, r.html, "text/html; charset=utf-8");
  net::Response res = net::Response::Text(
      r.status, r.body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
      "application/json");
  if (r.retry_after_s > 0) res.headers.emplace_back("Retry-After", std::to_string(r.retry_after_s));
  return res;
}

// The Reply for a body that could not be read whole.
Reply BodyFailure(const Status& s) {
  if (s.Is(net::kBodyTooLarge)) return Reply::Error(413, net::kTooLarge, s.message());
  if (s.Is(net::kBodyTimeout)) return Reply::Error(408, net::kBodyTimeout, s.message());
  if (s.Is(net::kHeadersTooLarge)) return Reply::Error(431, net::kHeadersTooLarge, s.message());
  return Reply::Error(400, net::kBodyIncomplete, s.message());
}

// A single byte range of a blob of `size` bytes (RFC 9110 §14.1.2): the first and last byte, or
// nullopt to answer the whole blob (no Range, another unit, several ranges, or a header that does
// not parse, which a server may ignore). *unsatisfiable for a range that starts at or past the
// end, or an empty suffix.
struct ByteRange {
  uint64_t first = 0, last = 0;
};
std::optional<ByteRange> ParseRange(const std::string& header, uint64_t size, bool* unsatisfiable) {
  *unsatisfiable = false;
  const std::string prefix = "bytes=";
  if (header.rfind(prefix, 0) != 0) return std::nullopt;
  const std::string spec = header.substr(prefix.size());
  if (spec.find(',') != std::string::npos) return std::nullopt;
  const size_t dash = spec.find('-');
  if (dash == std::string::npos) return std::nullopt;
  auto number = [](const std::string& t, uint64_t* out) {
    if (t.empty() || t.size() > 19 || t.find_first_not_of("0123456789") != std::string::npos) {
      return false;
    }
    *out = std::stoull(t);
    return true;
  };
  const std::string a = spec.substr(0, dash), b = spec.substr(dash + 1);
  ByteRange r;
  if (a.empty()) {  // suffix: the last b bytes
    uint64_t n = 0;
    if (!number(b, &n)) return std::nullopt;
    if (n == 0 || size == 0) {
      *unsatisfiable = true;
      return std::nullopt;
    }
    r.first = size - std::min(n, size);
    r.last = size - 1;
    return r;
  }
  if (!number(a, &r.first)) return std::nullopt;
  if (b.empty()) {
    r.last = size == 0 ? 0 : size - 1;
  } else {
    if (!number(b, &r.last) || r.last < r.first) return std::nullopt;
    r.last = std::min(r.last, size == 0 ? 0 : size - 1);
  }
  if (r.first >= size) {
    *unsatisfiable = true;
    return std::nullopt;
  }
  return r;
}

// The caller of a route other than /metrics: a metrics token is refused there, so a scraper's
// credential reads counters and nothing of the fleet.
std::variant<Principal, Reply> AuthenticateRoute(HubService* s, const net::Request& req) {
  auto who = s->Authenticate(req.Header("Authorization"));
  if (const auto* p = std::get_if<Principal>(&who); p != nullptr && p->role == kRoleMetrics) {
    return Reply::Error(403, kRefusalForbidden,
                        "token '" + p->name + "' has role metrics: it may read GET /metrics only");
  }
  return who;
}

// Each route's handler timed and counted under its pattern, and the bytes of streamed answers
// counted as they go out.
void Instrument(std::vector<net::Route>* routes, HubMetrics* m) {
  for (net::Route& r : *routes) {
    r.handler = [m, inner = std::move(r.handler), method = r.method, pattern = r.pattern](
                    const net::Request& req, net::Body& body) {
      const auto start = std::chrono::steady_clock::now();
      net::Response res = inner(req, body);
      m->ObserveRequest(
          method, pattern, res.status,
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      if (res.stream && pattern == "/v1/blobs/{}") {
        res.stream = [m, stream = std::move(res.stream)](uint64_t offset, char* buf,
                                                         size_t cap) -> Result<size_t> {
          Result<size_t> n = stream(offset, buf, cap);
          if (n.ok()) m->AddBytesDownloaded(*n);
          return n;
        };
      }
      return res;
    };
  }
}

}  // namespace

struct HubServer::Http {
  std::unique_ptr<net::HttpServer> server;
  std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;  // guarded by mu: Stop() has begun
  bool stopped = false;   // guarded by mu: the listener is closed and its threads joined
  // Handlers past their deadline now (0 before the server exists).
  uint64_t Stuck() const { return server ? server->stuck() : 0; }
};

// Deadlines of the routes that may legitimately run long (docs/transport.md): a publish's
// complete rebuilds the cell (up to the builder's timeout, after the rebuilds queued before it),
// a blob upload writes and hashes up to 2 GiB. Every other route has the server's default (60 s).
struct RouteDeadlines {
  int complete_ms = 0;
  int upload_ms = 10 * 60 * 1000;
};

// The routes: each authenticates (where it is not public) before it reads its body.
static std::vector<net::Route> HubRoutes(HubService* s, HubServer::Http* http, HubMetrics* metrics,
                                         uint64_t max_blob_bytes, const RouteDeadlines& deadlines) {
  using net::Body;
  using net::Request;
  using net::Response;
  // `fn(principal, request)` after authentication; 401 before the body is read otherwise.
  auto authed = [s](auto fn) {
    return [s, fn](const Request& req, Body&) -> Response {
      auto who = AuthenticateRoute(s, req);
      if (auto* r = std::get_if<Reply>(&who)) return Send(*r);
      return Send(fn(std::get<Principal>(who), req));
    };
  };
  // The same for a route with a JSON body of at most `limit` bytes.
  auto authed_body = [s](uint64_t limit, auto fn) {
    return [s, fn, limit](const Request& req, Body& body) -> Response {
      auto who = AuthenticateRoute(s, req);
      if (auto* r = std::get_if<Reply>(&who)) return Send(*r);
      auto text = body.ReadAll(limit);
      if (!text.ok()) return Send(BodyFailure(text.status()));
      return Send(fn(std::get<Principal>(who), *text));
    };
  };
  auto route = [](std::string method, std::string pattern, uint64_t max_body, net::Handler h) {
    net::Route r;
    r.method = std::move(method);
    r.pattern = std::move(pattern);
    r.max_body_bytes = max_body;
    r.handler = std::move(h);
    return r;
  };

  std::vector<net::Route> routes;
  // Liveness answers from the event loop, so it answers while every handler is busy, and says
  // 503 handlers_stuck while a handler runs past its deadline (the process needs a restart).
  net::Route health = route("GET", "/v1/health", 0, [s, http](const Request&, Body&) {
    if (const uint64_t stuck = http->Stuck(); stuck > 0) {
      return Send(
          Reply::Error(503, "handlers_stuck",
                       std::to_string(stuck) + " request handler(s) ran past their deadline",
                       {{"ok", false}, {"stuck", stuck}}));
    }
    return Send(s->Health());
  });
  health.on_event_loop = true;
  routes.push_back(std::move(health));
  routes.push_back(route("GET", "/v1/ready", 0, [s, http](const Request&, Body&) {
    Reply r = s->Ready();
    if (const uint64_t stuck = http->Stuck(); stuck > 0) {
      nlohmann::json checks = r.body.value("checks", nlohmann::json::object());
      checks["handlers"] = {
          {"ok", false},
          {"error", "handlers_stuck"},
          {"message", std::to_string(stuck) + " request handler(s) ran past their deadline"}};
      r = Reply::Error(503, "not_ready", "a dependency of the hub is failing",
                       {{"ready", false}, {"checks", checks}});
    }
    return Send(r);
  }));
  // Prometheus text for an admin or a metrics token (docs/hub-api.md "Metrics"). A handler
  // thread, not the event loop: some gauges ask the store or the object store.
  routes.push_back(route("GET", "/metrics", 0, [s, http, metrics](const Request& req, Body&) {
    auto who = s->Authenticate(req.Header("Authorization"));
    if (auto* r = std::get_if<Reply>(&who)) return Send(*r);
    const Principal& p = std::get<Principal>(who);
    if (p.role != "admin" && p.role != kRoleMetrics) {
      return Send(Reply::Error(403, kRefusalForbidden,
                               "token '" + p.name + "' has role " + p.role +
                                   "; GET /metrics needs role metrics or admin"));
    }
    MetricsWriter w;
    metrics->Write(&w);
    std::string text = w.Text();
    if (http->server) text += net::StatsMetricsText({{"hub", http->server->stats()}});
    return Response::Text(200, std::move(text), "text/plain; version=0.0.4; charset=utf-8");
  }));
  routes.push_back(route("GET", "/.well-known/jwks.json", 0,
                         [s](const Request&, Body&) { return Send(s->Jwks()); }));
  routes.push_back(route("GET", "/v1/revocations", 0,
                         [s](const Request&, Body&) { return Send(s->Revocations()); }));
  // Public like the list that carries them.
  routes.push_back(
      route("GET", "/v1/orders", 0, [s](const Request&, Body&) { return Send(s->Orders()); }));
  // The dashboard shows fleet rows, so it needs a token and shows only what that token reads.
  routes.push_back(route(
      "GET", "/", 0, authed([s](const Principal& p, const Request&) { return s->Dashboard(p); })));
  routes.push_back(
      route("GET", "/v1/cells/{}", 0, authed([s](const Principal& p, const Request& req) {
              auto family = req.query.find("family");
              return s->ResolveCell(p, req.captures[0],
                                    family == req.query.end() ? std::string() : family->second);
            })));
  routes.push_back(route("POST", "/v1/mint-leases", kJsonBodyLimit,
                         authed_body(kJsonBodyLimit, [s](const Principal& p, const std::string& b) {
                           return s->AcquireMintLease(p, b);
                         })));
  routes.push_back(route("POST", "/v1/mint-leases/heartbeat", kJsonBodyLimit,
                         authed_body(kJsonBodyLimit, [s](const Principal& p, const std::string& b) {
                           return s->HeartbeatMintLease(p, b);
                         })));
  routes.push_back(route("POST", "/v1/mint-leases/release", kJsonBodyLimit,
                         authed_body(kJsonBodyLimit, [s](const Principal& p, const std::string& b) {
                           return s->ReleaseMintLease(p, b);
                         })));
  routes.push_back(route("POST", "/v1/publish/intent", kJsonBodyLimit,
                         authed_body(kJsonBodyLimit, [s](const Principal& p, const std::string& b) {
                           return s->PublishIntent(p, b);
                         })));
  routes.push_back(route("POST", "/v1/publish/complete", kJsonBodyLimit,
                         authed_body(kJsonBodyLimit, [s](const Principal& p, const std::string& b) {
                           return s->PublishComplete(p, b);
                         })));
  routes.back().deadline_ms = deadlines.complete_ms;
  routes.push_back(
      route("PUT", "/v1/blobs/{}", max_blob_bytes,
            [s, metrics](const Request& req, Body& body) -> Response {
              auto who = AuthenticateRoute(s, req);
              if (auto* r = std::get_if<Reply>(&who)) return Send(*r);
              Status failure;
              BodyReader reader = [&](const std::function<bool(std::string_view)>& sink) {
                char buf[64 * 1024];
                while (true) {
                  auto n = body.Read(buf, sizeof(buf));
                  if (!n.ok()) {
                    failure = n.status();
                    return false;
                  }
                  if (*n == 0) return true;
                  metrics->AddBytesUploaded(*n);
                  if (!sink({buf, *n})) return true;
                }
              };
              Reply reply = s->UploadBlob(std::get<Principal>(who), req.captures[0], reader);
              // The transport's reason beats the service's generic "incomplete".
              if (!failure.ok() && reply.status == 400) reply = BodyFailure(failure);
              return Send(reply);
            }));
  routes.back().deadline_ms = deadlines.upload_ms;
  routes.push_back(route("GET", "/v1/blobs/{}", 0, [s](const Request& req, Body&) -> Response {
    auto who = AuthenticateRoute(s, req);
    if (auto* r = std::get_if<Reply>(&who)) return Send(*r);
    // ?direct=1: a client that can fetch from the object store itself gets a 307 to a presigned
    // URL instead of the bytes; a hub with no direct URLs streams as for any other client.
    if (auto direct = req.query.find("direct");
        direct != req.query.end() && direct->second == "1") {
      auto minted = s->BlobDirectUrl(std::get<Principal>(who), req.captures[0]);
      if (auto* r = std::get_if<Reply>(&minted)) return Send(*r);
      if (const std::string& url = std::get<std::string>(minted); !url.empty()) {
        Response res = Send(
            Reply::Json(307, {{"blob_url", url}, {"blob_url_expires_in_s", s->blob_url_ttl_s()}}));
        res.headers.emplace_back("Location", url);
        res.headers.emplace_back("Cache-Control", "no-store");
        return res;
      }
    }
    auto opened = s->OpenBlob(std::get<Principal>(who), req.captures[0]);
    if (auto* r = std::get_if<Reply>(&opened)) return Send(*r);
    std::shared_ptr<BlobReader> reader = std::move(std::get<std::unique_ptr<BlobReader>>(opened));
    const uint64_t size = reader->size();
    Response res;
    res.status = 200;
    res.content_type = "application/octet-stream";
    res.headers.emplace_back("Accept-Ranges", "bytes");
    uint64_t first = 0, count = size;
    if (req.HasHeader("Range")) {
      bool unsatisfiable = false;
      auto range = ParseRange(req.Header("Range"), size, &unsatisfiable);
      if (unsatisfiable) {
        Response r =
            Send(Reply::Error(416, "range_not_satisfiable",
                              "range '" + req.Header("Range") + "' starts past the end of " +
                                  req.captures[0] + " (" + std::to_string(size) + " bytes)"));
        r.headers.emplace_back("Content-Range", "bytes */" + std::to_string(size));
        return r;
      }
      if (range) {
        first = range->first;
        count = range->last - range->first + 1;
        res.status = 206;
        res.headers.emplace_back("Content-Range", "bytes " + std::to_string(range->first) + "-" +
                                                      std::to_string(range->last) + "/" +
                                                      std::to_string(size));
      }
    }
    res.stream_length = count;
    res.stream = [reader, first](uint64_t offset, char* buf, size_t cap) -> Result<size_t> {
      return reader->ReadAt(first + offset, buf, cap);
    };
    return res;
  }));
  routes.push_back(route("POST", "/v1/blobs/{}/verify", kJsonBodyLimit,
                         authed([s](const Principal& p, const Request& req) {
                           return s->ReportBlobMismatch(p, req.captures[0]);
                         })));
  routes.push_back(
      route("GET", "/v1/receipts/{}/{}", 0, authed([s](const Principal& p, const Request& req) {
              return s->GetReceipt(p, req.captures[0], req.captures[1]);
            })));
  routes.push_back(route("POST", "/v1/admin/revoke", kJsonBodyLimit,
                         authed_body(kJsonBodyLimit, [s](const Principal& p, const std::string& b) {
                           return s->Revoke(p, b);
                         })));
  routes.push_back(route("POST", "/v1/admin/reinstate", kJsonBodyLimit,
                         authed_body(kJsonBodyLimit, [s](const Principal& p, const std::string& b) {
                           return s->Reinstate(p, b);
                         })));
  routes.push_back(route("POST", "/v1/admin/orders", kJsonBodyLimit,
                         authed_body(kJsonBodyLimit, [s](const Principal& p, const std::string& b) {
                           return s->SetOrder(p, b);
                         })));
  routes.push_back(route("POST", "/v1/admin/tokens/revoke", kJsonBodyLimit,
                         authed_body(kJsonBodyLimit, [s](const Principal& p, const std::string& b) {
                           return s->RevokeToken(p, b);
                         })));
  routes.push_back(
      route("POST", "/v1/admin/rotate-key", kJsonBodyLimit,
            authed([s](const Principal& p, const Request&) { return s->RotateKey(p); })));
  routes.push_back(route("POST", "/v1/admin/keys/retire", kJsonBodyLimit,
                         authed_body(kJsonBodyLimit, [s](const Principal& p, const std::string& b) {
                           return s->RetireKey(p, b);
                         })));
  routes.push_back(
      route("POST", "/v1/admin/receipts/resign", kJsonBodyLimit,
            authed([s](const Principal& p, const Request&) { return s->ResignReceipts(p); })));
  routes.push_back(route("POST", "/v1/releases", kJsonBodyLimit,
                         authed_body(kJsonBodyLimit, [s](const Principal& p, const std::string& b) {
                           return s->CreateRelease(p, b);
                         })));
  routes.push_back(route("GET", "/v1/releases/{}/obligations", 0,
                         authed([s](const Principal& p, const Request& req) {
                           return s->ReleaseObligations(p, req.captures[0]);
                         })));
  routes.push_back(route("POST", "/v1/obligations/settle", kJsonBodyLimit,
                         authed_body(kJsonBodyLimit, [s](const Principal& p, const std::string& b) {
                           return s->SettleObligation(p, b);
                         })));
  routes.push_back(route(
      "POST", "/v1/events", kEventsBodyLimit,
      authed_body(kEventsBodyLimit,
                  [s](const Principal& p, const std::string& b) { return s->PostEvents(p, b); })));
  routes.push_back(
      route("GET", "/v1/events", 0, authed([s](const Principal& p, const Request& req) {
              return s->QueryEvents(p, req.query);
            })));
  Instrument(&routes, metrics);
  return routes;
}

// Creates `path` empty with mode 0600 unless it exists: SQLite then keeps that mode for the
// database and gives it to its -wal and -shm files.
static Status CreatePrivately(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd >= 0) {
    ::close(fd);
    return Status::OK();
  }
  if (errno == EEXIST) return Status::OK();
  return Status::IOError("hub: cannot create '" + path + "': " + std::strerror(errno));
}

int DbPoolSize(const HubOptions& options) {
  const int threads = options.threads > 0 ? options.threads : 32;
  int pool = options.db_pool;
  if (pool <= 0) pool = std::max(2, static_cast<int>(std::thread::hardware_concurrency()));
  return std::clamp(pool, 1, threads);
}

HubServer::~HubServer() {
  Stop();
  if (verifier_.joinable()) verifier_.join();
}

void HubServer::VerifyBlobsOnSchedule() {
  const auto every = std::chrono::seconds(options_.blob_verify_interval_s);
  std::unique_lock<std::mutex> lock(verify_mu_);
  // The first pass runs at start, so damage done while the hub was down is found at once.
  for (bool first = true; first || !verify_cv_.wait_for(lock, every, [&] { return stopping_; });
       first = false) {
    if (stopping_) break;
    lock.unlock();
    const Reply r = service_->VerifyBlobs();
    if (!r.ok()) {
      KILN_LOG(ERROR) << "hub: scheduled blob verification failed: " << r.body.dump();
    } else if (const auto q = r.body.value("quarantined", nlohmann::json::array()); !q.empty()) {
      KILN_LOG(ERROR) << "hub: scheduled blob verification quarantined " << q.dump();
    }
    lock.lock();
  }
}

Result<std::unique_ptr<HubServer>> HubServer::Open(const HubOptions& options,
                                                   HubFirstStart* first_start) {
  if (options.data_dir.empty()) return Status::InvalidArgument("hub: --data DIR is required");
  KILN_RETURN_IF_ERROR(MakeDirs(options.data_dir));
  std::unique_ptr<HubStore> store;
  const bool shared = !options.db_url.empty();
  if (options.db_url.empty()) {
    const std::string db = options.data_dir + "/hub.sqlite";
    KILN_RETURN_IF_ERROR(CreatePrivately(db));
    KILN_ASSIGN_OR_RETURN(store, OpenSqliteStore(db));
    // SQLite gives its -wal, -shm and our .id side file the database's own mode; check them all.
    for (const char* suffix : {"", "-wal", "-shm", ".id"}) {
      Status secret = CheckSecretFile(db + suffix);
      if (!secret.ok() && secret.code() != StatusCode::kNotFound) return secret;
    }
  } else if (options.db_url.rfind("postgresql://", 0) == 0 ||
             options.db_url.rfind("postgres://", 0) == 0) {
    KILN_ASSIGN_OR_RETURN(store, OpenPostgresStore(options.db_url, DbPoolSize(options)));
  } else {
    return Status::InvalidArgument("hub: --db '" + options.db_url + "' is not a postgresql:// URL");
  }
  std::unique_ptr<BlobStore> blobs;
  if (options.blobs.empty() && !options.blob_url_endpoint.empty()) {
    return Status::InvalidArgument("hub: --blob-url-endpoint '" + options.blob_url_endpoint +
                                   "' needs --blobs s3://…: only an S3 store has direct URLs");
  }
  if (options.blobs.empty()) {
    KILN_ASSIGN_OR_RETURN(blobs, OpenDiskBlobStore(options.data_dir + "/blobs"));
  } else {
    KILN_ASSIGN_OR_RETURN(S3Location s3, S3LocationFromUrl(options.blobs));
    s3.public_endpoint = options.blob_url_endpoint;
    KILN_ASSIGN_OR_RETURN(blobs, OpenS3BlobStore(s3));
  }
  if (options.blob_url_ttl_s < 0 || options.blob_url_ttl_s > kS3MaxPresignSeconds) {
    return Status::InvalidArgument("hub: --blob-url-ttl " + std::to_string(options.blob_url_ttl_s) +
                                   " is outside [0, " + std::to_string(kS3MaxPresignSeconds) +
                                   "] seconds (0: no direct URLs)");
  }
  // Replicas sharing a database share its keyring (pg_shared.h); a data dir's file keys from
  // before are carried into it. One hub alone keeps its keys under data_dir/signing/.
  std::unique_ptr<KeyRing> keys;
  if (shared) {
    SharedKeyRingOptions ko;
    ko.import_dir = options.data_dir;
    KILN_ASSIGN_OR_RETURN(keys, OpenPostgresKeyRing(options.db_url, ko));
  } else {
    KILN_ASSIGN_OR_RETURN(keys, SigningKeyRing::OpenOrCreate(options.data_dir));
  }

  // Tokens: the file is the source of truth at start; a missing default file is created with a
  // fresh admin token that is shown once and never stored in clear.
  const std::string tokens_path =
      options.tokens_file.empty() ? options.data_dir + "/tokens.json" : options.tokens_file;
  if (!std::filesystem::exists(tokens_path)) {
    if (!options.tokens_file.empty()) {
      return Status::NotFound("hub: tokens file '" + tokens_path + "' does not exist");
    }
    KILN_ASSIGN_OR_RETURN(std::string admin, GenerateToken());
    TokenRow row{Sha256Hex(admin), "admin", "admin", "", "", {}};
    KILN_RETURN_IF_ERROR(WriteSecretFileAtomic(tokens_path, TokensFileText({row})));
    if (first_start) {
      first_start->created_tokens_file = true;
      first_start->admin_token = admin;
    }
  }
  // The tokens file names who may sign what: a copy others can read or write is refused.
  KILN_RETURN_IF_ERROR(CheckSecretFile(tokens_path));
  KILN_ASSIGN_OR_RETURN(std::string tokens_text, ReadFile(tokens_path));
  KILN_ASSIGN_OR_RETURN(auto tokens, ParseTokensFile(tokens_text, tokens_path));

  HubServiceOptions service_options;
  if (options.rebuild == "verify" && options.builder_toolchains.empty()) {
    service_options.builder = NewSandboxedBuilder(options.sandbox);
  } else if (options.rebuild == "verify") {
    KILN_ASSIGN_OR_RETURN(service_options.builder,
                          ToolchainBuilders(options.sandbox, options.builder_toolchains));
  } else if (options.rebuild != "off") {
    return Status::InvalidArgument("hub: --rebuild '" + options.rebuild +
                                   "' is not 'verify' or 'off'");
  }
  service_options.revocation_max_age_s = options.revocation_max_age_s;
  service_options.blob_grace_s = options.blob_grace_s;
  service_options.max_shared_object_bytes = options.max_shared_object_bytes;
  service_options.max_cell_entries = options.max_cell_entries;
  service_options.org_quota_bytes = options.org_quota_bytes;
  service_options.platform_quota_bytes = options.platform_quota_bytes;
  service_options.publish_claim_ttl_s = options.publish_claim_ttl_s;
  if (!(options.mint_lease_ttl_s >= 0.3 && options.mint_lease_ttl_s <= 3600)) {
    return Status::InvalidArgument("hub: --mint-lease-ttl " +
                                   std::to_string(options.mint_lease_ttl_s) +
                                   " is not between 0.3 and 3600 seconds");
  }
  service_options.mint_lease_ttl_ms = std::llround(options.mint_lease_ttl_s * 1000);
  service_options.blob_url_ttl_s = options.blob_url_ttl_s;
  service_options.crash_revoke_threshold = options.crash_revoke_threshold;
  std::unique_ptr<HubServer> hub(new HubServer());
  hub->options_ = options;
  hub->service_ = std::make_unique<HubService>(std::move(store), std::move(blobs), std::move(keys),
                                               nullptr, std::move(service_options));
  // One hub: the file is the truth at every start, so a token removed from it is dead. Replicas
  // sharing a database: the file's tokens are added to (or replace by hash) the shared set every
  // replica reads, and a token leaves that set only by revocation. Either way a token an admin
  // revoked stays dead even while the file still lists it.
  KILN_ASSIGN_OR_RETURN(auto skipped, hub->service_->InstallTokens(tokens));
  if (shared) {
    KILN_ASSIGN_OR_RETURN(auto shared_tokens, OpenPostgresTokens(options.db_url));
    KILN_RETURN_IF_ERROR(shared_tokens->Upsert(tokens, Clock::Real()->UnixSeconds()));
    hub->service_->ShareTokens(std::move(shared_tokens));
  }
  for (const auto& name : skipped) {
    KILN_LOG(WARNING) << "hub: token '" << name << "' in " << tokens_path
                      << " was revoked by an admin and stays dead; remove it from the file";
  }
  hub->service_->set_ready_options(options.ready);
  hub->service_->StartMaintenance(options.gc_interval_s);
  hub->http_ = std::make_unique<Http>();
  net::ServerOptions so;
  so.name = "hub";
  so.bind = options.bind;
  so.port = options.port;
  so.handler_threads = options.threads > 0 ? options.threads : 32;
  options.listener.ApplyTo(&so);
  RouteDeadlines deadlines;
  // Room to wait behind the publisher's own queued rebuilds (each at most the builder's timeout),
  // then rebuild.
  deadlines.complete_ms = static_cast<int>(std::min<int64_t>(
      std::numeric_limits<int>::max(), (int64_t{std::max(0, options.sandbox.max_waiting) + 1} *
                                            std::max(1, options.sandbox.timeout_s) +
                                        120) *
                                           1000));
  KILN_ASSIGN_OR_RETURN(
      hub->http_->server,
      net::HttpServer::Create(so,
                              HubRoutes(hub->service_.get(), hub->http_.get(), hub->metrics_.get(),
                                        options.max_blob_bytes + 1, deadlines)));
  hub->RegisterGauges();
  hub->port_ = hub->http_->server->port();
  if (options.blob_verify_interval_s > 0) {
    hub->verifier_ = std::thread([h = hub.get()] { h->VerifyBlobsOnSchedule(); });
  }
  const std::string blobs_at = options.blobs.empty() ? options.data_dir + "/blobs" : options.blobs;
  KILN_LOG(INFO) << "hub: " << hub->service_->store().Describe() << ", blobs " << blobs_at
                 << ", signing key " << hub->service_->keys().Current()->kid() << ", "
                 << tokens.size() << " token(s), listening on " << hub->scheme() << "://"
                 << options.bind << ":" << hub->port_;
  return hub;
}

void HubServer::RegisterGauges() {
  HubMetrics& m = *metrics_;
  HubService* s = service_.get();
  using Samples = std::vector<std::pair<MetricLabels, double>>;
  m.RegisterGauge("kiln_hub_builder_waiting", "Rebuilds queued for a builder slot.", [s] {
    const BuilderLoad l = s->builder_load();
    return Samples{{{}, static_cast<double>(l.waiting)}};
  });
  m.RegisterGauge("kiln_hub_builder_running", "Rebuilds running now.", [s] {
    const BuilderLoad l = s->builder_load();
    return Samples{{{}, static_cast<double>(l.running)}};
  });
  m.RegisterGauge("kiln_hub_builder_slots", "Rebuilds that may run at once (0: no builder).", [s] {
    const BuilderLoad l = s->builder_load();
    return Samples{{{}, static_cast<double>(l.slots)}};
  });
  const HubService::LeaseAnswers* leases = &s->lease_answers();
  m.RegisterCounter(
      "kiln_hub_mint_lease_answers_total",
      "Mint-lease requests this process answered, by answer: granted, held (another worker holds "
      "the lease), published (a live cell answers the key), lost (a heartbeat refused "
      "lease_lost), released (a release that freed a lease).",
      [leases] {
        auto n = [](const std::atomic<uint64_t>& c) {
          return static_cast<double>(c.load(std::memory_order_relaxed));
        };
        return Samples{{{{"answer", "granted"}}, n(leases->granted)},
                       {{{"answer", "held"}}, n(leases->held)},
                       {{{"answer", "published"}}, n(leases->published)},
                       {{{"answer", "lost"}}, n(leases->lost)},
                       {{{"answer", "released"}}, n(leases->released)}};
      });
  const HubService::CrashCounters* crashes = &s->crash_counters();
  m.RegisterCounter("kiln_hub_cell_crash_reports_total",
                    "Event rows of kind cell_crashed this process accepted: a worker process died "
                    "inside a cell's first call and its machine quarantined the cell.",
                    [crashes] {
                      return Samples{{{}, static_cast<double>(crashes->reports.load())}};
                    });
  m.RegisterCounter("kiln_hub_crash_revocations_total",
                    "Cells this process revoked because enough distinct worker machines reported "
                    "them crashing (--crash-revoke-threshold).",
                    [crashes] {
                      return Samples{{{}, static_cast<double>(crashes->revocations.load())}};
                    });
  const std::string backend =
      s->store().Describe().rfind("sqlite", 0) == 0 ? "sqlite" : s->store().Describe();
  m.RegisterGauge("kiln_hub_db_pool_size",
                  "Database connections the store may hold (SQLite and memory: 1).", [s, backend] {
                    return Samples{{{{"backend", backend}}, double(s->store().Pool().size)}};
                  });
  m.RegisterGauge("kiln_hub_db_pool_open", "Database connections open now.", [s, backend] {
    return Samples{{{{"backend", backend}}, double(s->store().Pool().open)}};
  });
  m.RegisterGauge("kiln_hub_db_pool_in_use",
                  "Database connections a call is using now (PostgreSQL; 0 where not measured).",
                  [s, backend] {
                    return Samples{{{{"backend", backend}}, double(s->store().Pool().in_use)}};
                  });
  // Listing every blob costs a directory scan or a paged bucket listing: once a minute at most.
  struct StoredCache {
    std::mutex mu;
    std::chrono::steady_clock::time_point at;
    bool valid = false;
    double blobs = 0, bytes = 0;
  };
  auto cache = std::make_shared<StoredCache>();
  auto stored = [s, cache](bool bytes) {
    std::lock_guard<std::mutex> lock(cache->mu);
    const auto now = std::chrono::steady_clock::now();
    if (!cache->valid || now - cache->at > std::chrono::seconds(60)) {
      auto listed = s->blobs().ListStored();
      if (listed.ok()) {
        cache->blobs = static_cast<double>(listed->size());
        cache->bytes = 0;
        for (const auto& b : *listed) cache->bytes += static_cast<double>(b.size);
        cache->valid = true;
        cache->at = now;
      } else {
        KILN_LOG(WARNING) << "hub: /metrics could not list stored blobs: "
                          << listed.status().ToString();
      }
    }
    if (!cache->valid) return Samples{};
    return Samples{{{}, bytes ? cache->bytes : cache->blobs}};
  };
  m.RegisterGauge("kiln_hub_blobs_stored", "Blobs in the blob store (refreshed once a minute).",
                  [stored] { return stored(false); });
  m.RegisterGauge("kiln_hub_blob_bytes_stored",
                  "Bytes of the blobs in the blob store (refreshed once a minute).",
                  [stored] { return stored(true); });
}

std::string HubServer::scheme() const {
  return http_ && http_->server && http_->server->tls() ? "https" : "http";
}

Status HubServer::Serve() {
  KILN_RETURN_IF_ERROR(http_->server->Start());
  std::unique_lock<std::mutex> lock(http_->mu);
  http_->cv.wait(lock, [this] { return http_->stopped; });
  return Status::OK();
}

void HubServer::Stop() {
  {
    std::lock_guard<std::mutex> lock(verify_mu_);
    stopping_ = true;
  }
  verify_cv_.notify_all();
  if (!http_) return;
  {
    std::unique_lock<std::mutex> lock(http_->mu);
    if (http_->stopping) {
      // Another thread is stopping it: wait for that to finish.
      http_->cv.wait(lock, [this] { return http_->stopped; });
      return;
    }
    http_->stopping = true;
  }
  if (http_->server) {
    // Requests already being handled finish and their answers go out whole; queued ones are
    // answered 503 draining; then whatever is left is cut.
    if (!http_->server->Drain(options_.drain_timeout_ms)) {
      KILN_LOG(WARNING) << "hub: connections still open after the drain timeout of "
                        << options_.drain_timeout_ms << " ms; closing them";
    }
    http_->server->Stop();
  }
  {
    std::lock_guard<std::mutex> lock(http_->mu);
    http_->stopped = true;
  }
  http_->cv.notify_all();
}

uint64_t HubServer::abandoned_handlers() const {
  return http_ && http_->server ? http_->server->stats().handlers_abandoned : 0;
}

Status HubServer::ReloadTls() { return http_->server->ReloadTls(); }

}  // namespace kiln
