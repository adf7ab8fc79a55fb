// WorkerService: the worker's routes as plain methods (worker layer, under the HTTP binding in
// front.h; docs/design.md §10, docs/transport.md). Parsed inputs in, typed answers or a Status
// out; the binding (front.cc) is the one place a Status becomes an HTTP answer (WorkerHttpStatus).
// Tests call these methods without sockets.
//
// Infer, in order: the model (NotFound), draining (`draining`), the body's declared length against
// the model's limit (`too_large`, before a byte of the body is read), a concurrency slot (wait up
// to queue_timeout_ms, then `overloaded`), and only then the body, read as a stream inside the
// slot (kserve.h ReadInferRequest) with every input admitted against the model's declared inputs
// before its tensor is allocated. A request therefore costs at most the tensors the model takes.
//
// A model's body limit: when every input of its graph has a fully known shape, the larger of its
// JSON size (64 bytes per element) and its binary size, plus 1 MiB for names and parameters;
// otherwise `max_body_bytes`.
//
// Admin (the operator's orders; the binding serves them only on the admin listener, behind the
// operator token): the eager-only switch and the checkpoint swap. A checkpoint comes only from
// `checkpoint_dir`: the requested path is relative, has no `..`, and is opened beneath that
// directory without following a link out of it (openat2 RESOLVE_BENEATH); a refusal names the
// request, never anything read from a file (`checkpoint_path_refused`, `checkpoint_invalid`).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "src/kiln/base/status.h"
#include "src/kiln/graph/ir.h"
#include "src/kiln/worker/events.h"
#include "src/kiln/worker/kserve.h"
#include "src/kiln/worker/serving.h"

namespace kiln {

// The worker's own refusals (Status::token(); WorkerHttpStatus maps them to HTTP): stopping (503,
// retry elsewhere), and a checkpoint swap outside the configured directory or with none
// configured (403).
inline constexpr const char* kRefusalDraining = "draining";
inline constexpr const char* kRefusalCheckpointPathRefused = "checkpoint_path_refused";
inline constexpr const char* kRefusalCheckpointSwapDisabled = "checkpoint_swap_disabled";

// One served target, as the front end sees it.
struct FrontendTarget {
  ServedTarget* target = nullptr;      // not owned; must outlive the service
  std::shared_ptr<const Graph> graph;  // the target's graph (metadata, checkpoint loading)
};

struct WorkerServiceOptions {
  int max_concurrency = 4;       // infer requests run at once (>= 1)
  int queue_timeout_ms = 30000;  // how long a request over the limit waits for a slot
  uint64_t max_body_bytes = uint64_t{1} << 30;
  std::string model_version = "1";
  EventLog* events = nullptr;  // /v1/events answers from this log; null = an empty array
  // Ready when this returns true; `why` says what is missing otherwise. Null: ready when every
  // mandatory target has an armed cell (optional targets always serve, eager at worst).
  std::function<bool(std::string* why)> ready;
  // Checkpoint swaps read only beneath this directory; empty: swaps are refused.
  std::string checkpoint_dir;
};

// The HTTP status for a refusal from WorkerService, and whether it carries Retry-After.
struct HttpRefusal {
  int status = 500;
  bool retry = false;
};
HttpRefusal WorkerHttpStatus(const Status& status);

class WorkerService {
 public:
  // `targets`: by target name. `model_to_target`: every KServe model name -> a key of `targets`.
  // InvalidArgument names a model that routes to no target or a target without a ServedTarget
  // or graph.
  static Result<std::unique_ptr<WorkerService>> Create(
      WorkerServiceOptions options, std::map<std::string, FrontendTarget> targets,
      std::map<std::string, std::string> model_to_target);
  ~WorkerService();
  WorkerService(const WorkerService&) = delete;
  WorkerService& operator=(const WorkerService&) = delete;

  nlohmann::json ServerMetadata() const;
  // Readiness: `body` is {"ready": bool[, "reason"]}.
  struct Readiness {
    bool ready = false;
    nlohmann::json body;
  };
  Readiness Ready() const;
  Result<nlohmann::json> ModelMetadata(const std::string& model, const std::string& version) const;
  Result<Readiness> ModelReady(const std::string& model, const std::string& version) const;

  struct InferCall {
    std::string model;
    std::string version;                   // "" when the URL names none
    std::optional<uint64_t> body_size;     // Content-Length; nullopt when chunked
    std::optional<std::string> json_part;  // the Inference-Header-Content-Length value
    ByteSource body;
  };
  struct InferAnswer {
    // The response, written as the transport pulls it (it holds the output tensors, not their
    // text); its json_length() is set when some output is binary.
    std::unique_ptr<InferResponseStream> body;
  };
  // A refusal is also counted in the metrics under its HTTP status.
  Result<InferAnswer> Infer(const InferCall& call);
  // The largest body `model` accepts (see the header comment).
  uint64_t BodyLimit(const std::string& model) const;

  std::string MetricsText() const;
  // The /v1/events answer for the query parameters kind, phase, target, since, limit.
  Result<std::string> Events(const std::map<std::string, std::string>& query) const;

  Result<nlohmann::json> SetEagerOnly(std::string_view body);
  Result<nlohmann::json> SwapCheckpoint(std::string_view body);

  // Refuse new infer requests (`draining`) and wake those waiting for a slot.
  void BeginDrain();
  bool draining() const { return draining_.load(); }
  int in_flight() const { return in_flight_.load(); }

 private:
  struct Metrics;
  WorkerService(WorkerServiceOptions options, std::map<std::string, FrontendTarget> targets,
                std::map<std::string, std::string> model_to_target);
  Result<const FrontendTarget*> Resolve(const std::string& model, const std::string& version,
                                        std::string* target_name) const;
  const FrontendTarget* AdminTarget(const nlohmann::json& body, std::string* name) const;
  bool DefaultReady(std::string* why) const;
  // Waits for a slot; a refusal (`overloaded`, `draining`) otherwise.
  Status Acquire();
  void Release();
  Result<InferAnswer> InferInSlot(const InferCall& call, const FrontendTarget& t);

  const WorkerServiceOptions options_;
  const std::map<std::string, FrontendTarget> targets_;
  const std::map<std::string, std::string> model_to_target_;
  std::map<std::string, uint64_t> body_limits_;  // by target name
  std::unique_ptr<Metrics> metrics_;

  std::mutex slots_mu_;
  std::condition_variable slots_cv_;
  int running_ = 0;  // guarded by slots_mu_
  std::atomic<int> in_flight_{0};
  std::atomic<bool> draining_{false};
};

}  // namespace kiln
