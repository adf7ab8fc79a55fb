// Frontend: the worker's HTTP binding (worker layer, above worker_service.h; docs/design.md §10,
// §4 Request; docs/transport.md). It binds WorkerService to two listeners of the net layer's
// HttpServer (net/http_server.h): the serving listener and, when configured, the admin listener.
//
// Serving listener — KServe v2 / Open Inference Protocol, metrics and events:
//   GET  /v2                                   server metadata (extensions: binary_tensor_data)
//   GET  /v2/health/live                       200 while the process serves HTTP
//   GET  /v2/health/ready                      200 when ready (the readiness callback), else 503
//   GET  /v2/models/{name}[/versions/{v}]      model metadata: inputs/outputs from the graph
//   GET  /v2/models/{name}[/versions/{v}]/ready
//   POST /v2/models/{name}[/versions/{v}]/infer  JSON tensors or the binary tensor extension; the
//                                              body is JSON whatever the Content-Type says
//   GET  /metrics                              Prometheus text (with the listeners' counters)
//   GET  /v1/events?kind=&phase=&target=&since=&limit=   JSON array of event rows
// Admin listener — off unless `admin.port` is set; needs `admin.token`; binds loopback by default:
//   POST /v1/admin/eager-only {target, on, reason}
//   POST /v1/admin/checkpoint {target, path}   path relative to the checkpoint directory
// Every admin request must carry "Authorization: Bearer <admin token>"; without it the answer is
// 401 before its body is read. The serving listener has no admin route (404).
//
// Errors use the KServe shape {"error": "<message>"} (plus "token" when the refusal has one): a
// malformed request or one the model's inputs refuse -> 400; an unknown model -> 404; a body over
// the model's limit -> 413 at once, unread; a retryable refusal (a mandatory target without an
// armed cell, cell_oom, over the concurrency limit, draining, the listener saturated) -> 503 with
// Retry-After and {"error": "<token>", "detail": "<message>"}. No exception leaves a handler.
//
// Concurrency: at most `max_concurrency` infer requests run at once; more wait (their bodies
// unread) for up to `queue_timeout_ms`, then get 503 `overloaded`. Every handler has a deadline
// (infer: queue_timeout_ms + infer_deadline_ms); while one runs past it, /v2/health/live and
// /v2/health/ready answer 503 `handlers_stuck`. Stop() drains: requests waiting for a slot or a
// handler get 503 `draining` with Retry-After, requests already running finish and their answers
// go out whole (up to `drain_timeout_ms`), idle connections close, then the listeners stop.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "src/kiln/base/status.h"
#include "src/kiln/net/http_server.h"
#include "src/kiln/worker/worker_service.h"

namespace kiln {

namespace net {
class HttpServer;
}

// The operator's admin listener.
struct AdminListenerOptions {
  int port = -1;  // -1: no admin listener; 0: any free port (see Frontend::admin_port())
  std::string bind = "127.0.0.1";
  std::string token;  // required when the listener is on; compared in constant time
};

struct FrontendOptions {
  std::string bind = "127.0.0.1";
  int port = 0;                  // 0 = pick a free port (see Frontend::port())
  int max_concurrency = 4;       // infer requests run at once (>= 1); EndpointSpec::max_concurrency
  int queue_timeout_ms = 30000;  // how long a request over the limit waits before 503
  // An infer handler's deadline beyond its wait for a slot (body reads not counted): past it the
  // request is answered 503 handler_deadline and the worker reports itself stuck.
  int infer_deadline_ms = 120000;
  int http_threads = 0;   // handler threads; 0 = max(8, 4 * max_concurrency)
  int retry_after_s = 1;  // the Retry-After value on every 503
  int drain_timeout_ms = 30000;
  size_t max_body_bytes = size_t{1} << 30;
  std::string model_version = "1";
  EventLog* events = nullptr;  // /v1/events answers from this log; null = an empty array
  // Ready when this returns true; `why` says what is missing otherwise. Null: ready when every
  // mandatory target has an armed cell. Called on the event loop: it must be cheap.
  std::function<bool(std::string* why)> ready;
  // More Prometheus text appended to /metrics (e.g. the event forwarder's counters); may be null.
  std::function<std::string()> extra_metrics;
  // TLS and connection limits for both listeners. Idle keep-alive connections close after 5 s
  // (the hub keeps them 30 s): a worker sits behind a load balancer that holds many.
  net::ListenerSettings listener = [] {
    net::ListenerSettings s;
    s.keepalive_idle_ms = 5000;
    return s;
  }();
  AdminListenerOptions admin;
  std::string checkpoint_dir;  // admin checkpoint swaps read only beneath it; "" = refused
};

class Frontend {
 public:
  // `targets`: by target name. `model_to_target`: every KServe model name (function names and
  // aliases, Manifest::function_to_target) -> a key of `targets`. InvalidArgument names a model
  // that routes to no target or a target without a ServedTarget or graph, or an admin listener
  // without a token. Binds the listeners (IOError naming the address when that fails).
  static Result<std::unique_ptr<Frontend>> Create(
      FrontendOptions options, std::map<std::string, FrontendTarget> targets,
      std::map<std::string, std::string> model_to_target);
  ~Frontend();  // Stop()
  Frontend(const Frontend&) = delete;
  Frontend& operator=(const Frontend&) = delete;

  // Starts serving in the background. Call once.
  Status Start();
  int port() const;
  int admin_port() const;  // -1 without an admin listener
  bool tls() const;
  // Graceful drain (see above); idempotent.
  void Stop();
  // Handlers running past their deadline now (the health routes report them).
  uint64_t stuck() const;
  // Handlers still running when Stop() gave up on them: the process should exit at once.
  uint64_t abandoned_handlers() const;
  // Re-reads the TLS certificate and key of both listeners now.
  Status ReloadTls();

  WorkerService& service() { return *service_; }
  // The /metrics body.
  std::string MetricsText() const;
  // Infer requests running now.
  int in_flight() const { return service_->in_flight(); }

 private:
  Frontend() = default;
  FrontendOptions options_;
  std::unique_ptr<WorkerService> service_;
  std::unique_ptr<net::HttpServer> serving_;
  std::unique_ptr<net::HttpServer> admin_;
  std::once_flag stop_once_;
};

}  // namespace kiln
