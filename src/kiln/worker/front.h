// Frontend: the worker's HTTP front end (worker layer, above serving.h and kserve.h; docs/design.md
// §10, §4 Request). KServe v2 / Open Inference Protocol over cpp-httplib, plus metrics, events
// and the operator's admin routes:
//
//   GET  /v2                                   server metadata (extensions: binary_tensor_data)
//   GET  /v2/health/live                       200 while the process serves HTTP
//   GET  /v2/health/ready                      200 when ready (the readiness callback), else 503
//   GET  /v2/models/{name}[/versions/{v}]      model metadata: inputs/outputs from the graph
//   GET  /v2/models/{name}[/versions/{v}]/ready
//   POST /v2/models/{name}[/versions/{v}]/infer  JSON tensors or the binary tensor extension
//   GET  /metrics                              Prometheus text
//   GET  /v1/events?kind=&phase=&target=&since=&limit=   JSON array of event rows
//   POST /v1/admin/eager-only {target, on, reason}
//   POST /v1/admin/checkpoint {target, path}   LoadCheckpoint + SwapCheckpoint
//
// Errors use the KServe shape {"error": "<message>"}: a malformed request or one the model's
// inputs refuse -> 400 with the codec's typed message; an unknown model -> 404; a retryable serve
// refusal (a mandatory target without an armed cell, cell_oom) -> 503 with Retry-After and
// {"error": "<token>", "detail": "<message>"}; over the concurrency limit or draining -> 503
// with Retry-After and {"error": "overloaded" | "draining"}. No exception leaves a handler.
//
// Concurrency: at most `max_concurrency` infer requests run at once; more wait in line (in no
// particular order) for up to `queue_timeout_ms`, then get 503 `overloaded`. Stop() drains:
// new infer requests get 503 `draining`, requests already admitted finish (up to
// `drain_timeout_ms`), then the listener closes.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "src/kiln/base/status.h"
#include "src/kiln/graph/ir.h"
#include "src/kiln/worker/events.h"
#include "src/kiln/worker/serving.h"

namespace kiln {

// One served target, as the front end sees it.
struct FrontendTarget {
  ServedTarget* target = nullptr;      // not owned; must outlive the Frontend
  std::shared_ptr<const Graph> graph;  // the target's graph (metadata, checkpoint loading)
};

struct FrontendOptions {
  std::string bind = "127.0.0.1";
  int port = 0;                  // 0 = pick a free port (see Frontend::port())
  int max_concurrency = 4;       // infer requests run at once (>= 1); EndpointSpec::max_concurrency
  int queue_timeout_ms = 30000;  // how long a request over the limit waits before 503
  int http_threads = 0;          // cpp-httplib worker threads; 0 = max(8, 4 * max_concurrency)
  int retry_after_s = 1;         // the Retry-After value on every 503
  int drain_timeout_ms = 30000;
  size_t max_body_bytes = size_t{1} << 30;
  std::string model_version = "1";
  EventLog* events = nullptr;  // /v1/events answers from this log; null = an empty array
  // Ready when this returns true; `why` says what is missing otherwise. Null: ready when every
  // mandatory target has an armed cell (optional targets always serve, eager at worst).
  std::function<bool(std::string* why)> ready;
  // More Prometheus text appended to /metrics (e.g. the event forwarder's counters); may be null.
  std::function<std::string()> extra_metrics;
};

class Frontend {
 public:
  // `targets`: by target name. `model_to_target`: every KServe model name (function names and
  // aliases, Manifest::function_to_target) -> a key of `targets`. InvalidArgument names a model
  // that routes to no target or a target without a ServedTarget or graph.
  static Result<std::unique_ptr<Frontend>> Create(
      FrontendOptions options, std::map<std::string, FrontendTarget> targets,
      std::map<std::string, std::string> model_to_target);
  ~Frontend();  // Stop()
  Frontend(const Frontend&) = delete;
  Frontend& operator=(const Frontend&) = delete;

  // Binds and starts serving on a background thread. IOError names the address when the bind
  // fails. Call once.
  Status Start();
  // The bound port (after Start).
  int port() const { return port_; }
  // Graceful drain (see above); idempotent.
  void Stop();

  // The /metrics body.
  std::string MetricsText() const;
  // Infer requests running now.
  int in_flight() const { return in_flight_.load(); }

 private:
  struct Http;
  struct Metrics;
  Frontend(FrontendOptions options, std::map<std::string, FrontendTarget> targets,
           std::map<std::string, std::string> model_to_target);
  void InstallRoutes();
  // Default readiness (see FrontendOptions::ready).
  bool DefaultReady(std::string* why) const;
  // Waits for a slot; false when the wait timed out or the front end is draining.
  bool Acquire(std::string* refusal);
  void Release();

  const FrontendOptions options_;
  const std::map<std::string, FrontendTarget> targets_;
  const std::map<std::string, std::string> model_to_target_;
  std::unique_ptr<Http> http_;
  std::unique_ptr<Metrics> metrics_;
  std::thread listener_;
  int port_ = 0;

  std::mutex slots_mu_;
  std::condition_variable slots_cv_;
  int running_ = 0;  // guarded by slots_mu_
  std::atomic<int> in_flight_{0};
  std::atomic<bool> draining_{false};
  std::once_flag stop_once_;
};

}  // namespace kiln
