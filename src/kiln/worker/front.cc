// Frontend (worker layer): binds WorkerService to the serving and admin listeners. See front.h.
// This file is the one place a WorkerService answer or refusal becomes HTTP (Refusal below, with
// WorkerHttpStatus choosing the status).
#include "src/kiln/worker/front.h"

#include <openssl/crypto.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>
#include <utility>

#include "src/kiln/base/log.h"
#include "src/kiln/base/sha256.h"
#include "src/kiln/net/http_server.h"

namespace kiln {

using nlohmann::json;

namespace {

std::string JsonText(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

net::Response JsonAnswer(int status, const json& body) {
  return net::Response::Text(status, JsonText(body), "application/json");
}

// The KServe error shape for an HTTP status and a refusal: retryable ones name their token (the
// contract clients branch on) and carry Retry-After; others carry the message, and the token
// when there is one.
net::Response ErrorAnswer(int status, bool retry, const std::string& token,
                          const std::string& message, int retry_after_s) {
  json body;
  if (retry) {
    body = json{{"error", token}, {"detail", message}};
  } else {
    body = json{{"error", message}};
    if (!token.empty()) body["token"] = token;
  }
  net::Response r = JsonAnswer(status, body);
  if (retry) r.headers.emplace_back("Retry-After", std::to_string(retry_after_s));
  return r;
}

net::Response Refusal(const Status& s, int retry_after_s) {
  const HttpRefusal h = WorkerHttpStatus(s);
  return ErrorAnswer(h.status, h.retry, s.token(), s.message(), retry_after_s);
}

// Answers up to this size are written in one piece; larger ones stream.
constexpr uint64_t kWholeAnswerBytes = 64 * 1024;

net::Route MakeRoute(std::string method, std::string pattern, uint64_t max_body, bool on_loop,
                     net::Handler h) {
  net::Route r;
  r.method = std::move(method);
  r.pattern = std::move(pattern);
  r.max_body_bytes = max_body;
  r.on_event_loop = on_loop;
  r.handler = std::move(h);
  return r;
}

// The options the two listeners share.
net::ServerOptions ListenerOptions(const FrontendOptions& o, const std::string& name) {
  net::ServerOptions so;
  so.name = name;
  o.listener.ApplyTo(&so);
  so.retry_after_s = o.retry_after_s;
  const int retry_after_s = o.retry_after_s;
  so.error_response = [retry_after_s](int status, const std::string& token,
                                      const std::string& message) {
    // The server adds its own Retry-After to the 503s it gives; only the body's shape is ours.
    net::Response r = ErrorAnswer(status, status == 503, token, message, retry_after_s);
    r.headers.clear();
    return r;
  };
  return so;
}

std::vector<net::Route> ServingRoutes(WorkerService* svc, const FrontendOptions& o,
                                      std::function<std::string()> metrics,
                                      std::function<uint64_t()> stuck) {
  using net::Body;
  using net::Request;
  using net::Response;
  const int retry = o.retry_after_s;
  std::vector<net::Route> routes;
  routes.push_back(MakeRoute("GET", "/v2", 0, true, [svc](const Request&, Body&) {
    return JsonAnswer(200, svc->ServerMetadata());
  }));
  // A handler past its deadline cannot be taken back: the worker is neither live nor ready
  // until it returns (docs/transport.md, "Handler deadlines").
  routes.push_back(MakeRoute("GET", "/v2/health/live", 0, true, [stuck](const Request&, Body&) {
    if (const uint64_t n = stuck(); n > 0) {
      return JsonAnswer(503, json{{"live", false}, {"reason", "handlers_stuck"}, {"stuck", n}});
    }
    return JsonAnswer(200, json{{"live", true}});
  }));
  routes.push_back(
      MakeRoute("GET", "/v2/health/ready", 0, true, [svc, stuck](const Request&, Body&) {
        if (const uint64_t n = stuck(); n > 0) {
          return JsonAnswer(503,
                            json{{"ready", false}, {"reason", "handlers_stuck"}, {"stuck", n}});
        }
        auto r = svc->Ready();
        return JsonAnswer(r.ready ? 200 : 503, r.body);
      }));
  for (const std::string model : {"/v2/models/{}", "/v2/models/{}/versions/{}"}) {
    routes.push_back(MakeRoute("GET", model, 0, false, [svc, retry](const Request& req, Body&) {
      auto m = svc->ModelMetadata(req.captures[0], req.captures.size() > 1 ? req.captures[1] : "");
      return m.ok() ? JsonAnswer(200, *m) : Refusal(m.status(), retry);
    }));
    routes.push_back(
        MakeRoute("GET", model + "/ready", 0, false, [svc, retry](const Request& req, Body&) {
          auto r = svc->ModelReady(req.captures[0], req.captures.size() > 1 ? req.captures[1] : "");
          if (!r.ok()) return Refusal(r.status(), retry);
          return JsonAnswer(r->ready ? 200 : 503, r->body);
        }));
    routes.push_back(MakeRoute(
        "POST", model + "/infer", o.max_body_bytes, false,
        [svc, retry](const Request& req, Body& body) -> Response {
          WorkerService::InferCall call;
          call.model = req.captures[0];
          call.version = req.captures.size() > 1 ? req.captures[1] : "";
          if (req.content_length) {
            call.body_size = *req.content_length;
          } else if (!req.chunked) {
            call.body_size = 0;
          }
          if (req.HasHeader(kInferenceHeaderContentLength)) {
            call.json_part = req.Header(kInferenceHeaderContentLength);
          }
          call.body = [&body](char* buf, size_t cap) { return body.Read(buf, cap); };
          auto answer = svc->Infer(call);
          if (!answer.ok()) return Refusal(answer.status(), retry);
          std::shared_ptr<InferResponseStream> stream = std::move(answer->body);
          Response r;
          r.status = 200;
          if (auto json_length = stream->json_length()) {
            r.headers.emplace_back(kInferenceHeaderContentLength, std::to_string(*json_length));
            r.content_type = "application/octet-stream";
          }
          if (stream->size() <= kWholeAnswerBytes) {
            r.body.resize(static_cast<size_t>(stream->size()));
            auto n = stream->Read(0, r.body.data(), r.body.size());
            if (!n.ok()) return Refusal(n.status(), retry);
            if (*n != r.body.size()) {
              return Refusal(Status::Internal("infer response: short"), retry);
            }
            return r;
          }
          // Written as the connection takes it: the outputs' text never exists whole.
          r.stream_length = stream->size();
          r.stream = [stream](uint64_t offset, char* buf, size_t cap) {
            return stream->Read(offset, buf, cap);
          };
          return r;
        }));
    // The wait for a slot, then the run (body reads are not counted).
    routes.back().deadline_ms = o.queue_timeout_ms + o.infer_deadline_ms;
  }
  routes.push_back(MakeRoute("GET", "/metrics", 0, true, [metrics](const Request&, Body&) {
    return Response::Text(200, metrics(), "text/plain; version=0.0.4");
  }));
  routes.push_back(
      MakeRoute("GET", "/v1/events", 0, false, [svc, retry](const Request& req, Body&) {
        auto rows = svc->Events(req.query);
        if (!rows.ok()) return Refusal(rows.status(), retry);
        return Response::Text(200, std::move(rows).value(), "application/json");
      }));
  return routes;
}

// Admin routes: the operator token first, the body only after it.
std::vector<net::Route> AdminRoutes(WorkerService* svc, const std::string& token, int retry) {
  using net::Body;
  using net::Request;
  using net::Response;
  constexpr uint64_t kAdminBodyLimit = 64 * 1024;
  const std::string want = Sha256Hex(token);
  auto guarded = [svc, want, retry](auto fn) {
    return [svc, want, retry, fn](const Request& req, Body& body) -> Response {
      const std::string header = req.Header("Authorization");
      const std::string prefix = "Bearer ";
      const std::string got =
          Sha256Hex(header.rfind(prefix, 0) == 0 ? header.substr(prefix.size()) : "\x01");
      if (header.rfind(prefix, 0) != 0 ||
          CRYPTO_memcmp(got.data(), want.data(), want.size()) != 0) {
        Response r = ErrorAnswer(401, false, net::kUnauthenticated,
                                 req.method + " " + req.path +
                                     " needs the operator's admin token (Authorization: Bearer)",
                                 retry);
        r.headers.emplace_back("WWW-Authenticate", "Bearer");
        return r;
      }
      auto text = body.ReadAll(kAdminBodyLimit);
      if (!text.ok()) return Refusal(text.status(), retry);
      auto answer = fn(*text);
      if (!answer.ok()) return Refusal(answer.status(), retry);
      return JsonAnswer(200, *answer);
    };
  };
  std::vector<net::Route> routes;
  routes.push_back(
      MakeRoute("POST", "/v1/admin/eager-only", kAdminBodyLimit, false,
                guarded([svc](const std::string& b) { return svc->SetEagerOnly(b); })));
  routes.push_back(
      MakeRoute("POST", "/v1/admin/checkpoint", kAdminBodyLimit, false,
                guarded([svc](const std::string& b) { return svc->SwapCheckpoint(b); })));
  // Loading a large checkpoint and waiting for the runs inside the cell may take minutes.
  routes.back().deadline_ms = 10 * 60 * 1000;
  return routes;
}

}  // namespace

Frontend::~Frontend() { Stop(); }

Result<std::unique_ptr<Frontend>> Frontend::Create(
    FrontendOptions options, std::map<std::string, FrontendTarget> targets,
    std::map<std::string, std::string> model_to_target) {
  WorkerServiceOptions so;
  so.max_concurrency = options.max_concurrency;
  so.queue_timeout_ms = options.queue_timeout_ms;
  so.max_body_bytes = options.max_body_bytes;
  so.model_version = options.model_version;
  so.events = options.events;
  so.ready = options.ready;
  so.checkpoint_dir = options.checkpoint_dir;
  std::unique_ptr<Frontend> f(new Frontend());
  KILN_ASSIGN_OR_RETURN(f->service_,
                        WorkerService::Create(so, std::move(targets), std::move(model_to_target)));
  f->options_ = std::move(options);
  const FrontendOptions& o = f->options_;
  if (o.admin.port >= 0 && o.admin.token.empty()) {
    return Status::InvalidArgument(
        "worker admin: the admin listener needs an operator token (--admin-token-file or "
        "$KILN_ADMIN_TOKEN); without one it stays off");
  }
  Frontend* self = f.get();
  net::ServerOptions serving = ListenerOptions(o, "worker");
  serving.bind = o.bind;
  serving.port = o.port;
  serving.handler_threads =
      o.http_threads > 0 ? o.http_threads : std::max(8, 4 * o.max_concurrency);
  KILN_ASSIGN_OR_RETURN(
      f->serving_, net::HttpServer::Create(
                       serving, ServingRoutes(
                                    f->service_.get(), o, [self] { return self->MetricsText(); },
                                    [self] { return self->stuck(); })));
  if (o.admin.port >= 0) {
    net::ServerOptions admin = ListenerOptions(o, "worker admin");
    admin.bind = o.admin.bind;
    admin.port = o.admin.port;
    admin.handler_threads = 2;
    admin.max_queued = 16;
    KILN_ASSIGN_OR_RETURN(
        f->admin_, net::HttpServer::Create(
                       admin, AdminRoutes(f->service_.get(), o.admin.token, o.retry_after_s)));
  }
  return f;
}

Status Frontend::Start() {
  KILN_RETURN_IF_ERROR(serving_->Start());
  if (admin_) KILN_RETURN_IF_ERROR(admin_->Start());
  return Status::OK();
}

int Frontend::port() const { return serving_->port(); }
int Frontend::admin_port() const { return admin_ ? admin_->port() : -1; }
bool Frontend::tls() const { return serving_->tls(); }

void Frontend::Stop() {
  std::call_once(stop_once_, [this] {
    if (!service_) return;
    // Requests waiting for a slot are answered 503 draining; the listeners then stop accepting,
    // close idle connections, answer requests no handler has taken 503 draining, and wait for
    // the handlers running and the answers streaming to finish.
    service_->BeginDrain();
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.drain_timeout_ms);
    auto left = [&deadline] {
      return static_cast<int>(std::max<int64_t>(
          0, std::chrono::duration_cast<std::chrono::milliseconds>(deadline -
                                                                   std::chrono::steady_clock::now())
                 .count()));
    };
    bool drained = !serving_ || serving_->Drain(left());
    if (admin_) drained = admin_->Drain(left()) && drained;
    if (!drained) {
      KILN_LOG(WARNING) << "worker front: " << service_->in_flight()
                        << " request(s) still running after the drain timeout of "
                        << options_.drain_timeout_ms << " ms; closing their connections";
    }
    if (admin_) admin_->Stop();
    if (serving_) serving_->Stop();
  });
}

uint64_t Frontend::stuck() const {
  return (serving_ ? serving_->stuck() : 0) + (admin_ ? admin_->stuck() : 0);
}

uint64_t Frontend::abandoned_handlers() const {
  return (serving_ ? serving_->stats().handlers_abandoned : 0) +
         (admin_ ? admin_->stats().handlers_abandoned : 0);
}

Status Frontend::ReloadTls() {
  KILN_RETURN_IF_ERROR(serving_->ReloadTls());
  if (admin_) KILN_RETURN_IF_ERROR(admin_->ReloadTls());
  return Status::OK();
}

std::string Frontend::MetricsText() const {
  std::string text = service_->MetricsText();
  if (options_.extra_metrics) text += options_.extra_metrics();
  std::vector<std::pair<std::string, net::ServerStats>> listeners;
  if (serving_) listeners.emplace_back("serving", serving_->stats());
  if (admin_) listeners.emplace_back("admin", admin_->stats());
  return text + net::StatsMetricsText(listeners);
}

}  // namespace kiln
