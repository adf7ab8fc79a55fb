// WorkerService (worker layer): the worker's routes as plain methods. See worker_service.h.
#include "src/kiln/worker/worker_service.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <sstream>
#include <utility>

#include "src/kiln/base/clock.h"
#include "src/kiln/base/file.h"
#include "src/kiln/base/log.h"
#include "src/kiln/graph/checkpoint.h"
#include "src/kiln/net/http_server.h"
#include "src/kiln/tensor/safetensors.h"

namespace kiln {

using nlohmann::json;

namespace {

constexpr uint64_t kJsonBytesPerElement = 64;
constexpr uint64_t kRequestSlack = 1 << 20;

// Escapes a Prometheus label value.
std::string Label(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

json ValueInfosJson(const std::vector<ValueInfo>& infos) {
  json arr = json::array();
  for (const ValueInfo& vi : infos) {
    json shape = json::array();
    if (!vi.has_shape) {
      shape.push_back(-1);
    } else {
      for (const Dim& d : vi.dims) shape.push_back(d.known() ? d.value : -1);
    }
    arr.push_back(
        json{{"name", vi.name}, {"datatype", KServeDatatype(vi.dtype)}, {"shape", shape}});
  }
  return arr;
}

Result<uint64_t> ParseUint(const std::string& v, const std::string& what) {
  if (v.empty() || v.size() > 19 || v.find_first_not_of("0123456789") != std::string::npos) {
    return Status::InvalidArgument(what + " is \"" + v.substr(0, 40) +
                                   "\"; expected a non-negative integer");
  }
  return static_cast<uint64_t>(std::stoull(v));
}

Result<json> AdminBody(std::string_view body, const std::string& route) {
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return Status::InvalidArgument(route + ": the body must be a JSON object");
  }
  return j;
}

// The largest body a graph's inputs need (see worker_service.h), or `max`.
uint64_t BodyLimitFor(const Graph& g, uint64_t max) {
  uint64_t elements = 0, bytes = 0;
  for (const ValueInfo& vi : g.inputs) {
    if (!vi.has_shape) return max;
    uint64_t n = 1;
    for (const Dim& d : vi.dims) {
      if (!d.known() || d.value < 0) return max;
      if (d.value != 0 && n > max / static_cast<uint64_t>(d.value)) return max;
      n *= static_cast<uint64_t>(d.value);
    }
    elements += n;
    bytes += n * DTypeSize(vi.dtype);
    if (elements > max || bytes > max) return max;
  }
  const uint64_t json_bytes = elements * kJsonBytesPerElement + kRequestSlack;
  const uint64_t binary_bytes = bytes + kRequestSlack;
  return std::min(max, std::max(json_bytes, binary_bytes));
}

// A relative path beneath the checkpoint directory, judged on its text alone (nothing is opened):
// non-empty, not absolute, no "..", no NUL, no empty segment.
Status CheckCheckpointPath(const std::string& path) {
  auto refuse = [&](const std::string& why) {
    return Status::Refused(StatusCode::kInvalidArgument, kRefusalCheckpointPathRefused,
                           "checkpoint \"" + path.substr(0, 200) + "\" " + why +
                               "; name a .safetensors file inside the worker's checkpoint "
                               "directory by its relative path");
  };
  if (path.empty()) return refuse("is empty");
  if (path.size() > 1024) return refuse("is longer than 1024 bytes");
  if (path.find('\0') != std::string::npos) return refuse("holds a NUL byte");
  if (path.front() == '/') return refuse("is absolute");
  size_t at = 0;
  while (at <= path.size()) {
    size_t end = path.find('/', at);
    if (end == std::string::npos) end = path.size();
    const std::string seg = path.substr(at, end - at);
    if (seg == "..") return refuse("climbs out with '..'");
    if (seg.empty() && end != path.size()) return refuse("has an empty segment");
    at = end + 1;
  }
  return Status::OK();
}

// Opens `rel` beneath `dir` without leaving it: no absolute symlink, no ".." above it, no magic
// link. The descriptor, or a refusal that names the request only.
Result<int> OpenBeneath(const std::string& dir, const std::string& rel) {
  const int dirfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dirfd < 0) {
    return Status::IOError("the checkpoint directory '" + dir +
                           "' cannot be opened: " + std::strerror(errno));
  }
  open_how how{};
  how.flags = O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
  int fd = static_cast<int>(::syscall(SYS_openat2, dirfd, rel.c_str(), &how, sizeof(how)));
  const int err = errno;
  if (fd < 0 && err == ENOSYS) {
    // A kernel before 5.6: no link may be followed at all, and the real path must stay beneath.
    fd = ::openat(dirfd, rel.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK | O_NOFOLLOW);
    if (fd >= 0) {
      char real[4096];
      const std::string link = "/proc/self/fd/" + std::to_string(fd);
      const ssize_t n = ::readlink(link.c_str(), real, sizeof(real) - 1);
      char* base = ::realpath(dir.c_str(), nullptr);
      const bool inside =
          n > 0 && base != nullptr &&
          std::string(real, static_cast<size_t>(n)).rfind(std::string(base) + "/", 0) == 0;
      std::free(base);
      if (!inside) {
        ::close(fd);
        fd = -1;
        errno = EXDEV;
      }
    }
  }
  ::close(dirfd);
  if (fd >= 0) return fd;
  const int why = fd < 0 && err != ENOSYS ? err : errno;
  if (why == ENOENT) {
    return Status::NotFound("checkpoint \"" + rel + "\" is not in the checkpoint directory");
  }
  if (why == EXDEV || why == ELOOP) {
    return Status::Refused(
        StatusCode::kInvalidArgument, kRefusalCheckpointPathRefused,
        "checkpoint \"" + rel +
            "\" leads out of the checkpoint directory; links must stay inside it");
  }
  return Status::Refused(StatusCode::kInvalidArgument, kRefusalCheckpointPathRefused,
                         "checkpoint \"" + rel +
                             "\" cannot be opened in the checkpoint directory (" +
                             std::strerror(why) + ")");
}

}  // namespace

HttpRefusal WorkerHttpStatus(const Status& s) {
  if (IsRetryableServeRefusal(s) || s.Is(net::kOverloaded) || s.Is(kRefusalDraining)) {
    return {503, true};
  }
  // request_too_large: the request's values ask for tensors past its memory budget (or past
  // int64); its fault, as a body over the limit is, and answered the same way.
  if (s.Is(net::kTooLarge) || s.Is(net::kBodyTooLarge) || s.Is(kRefusalRequestTooLarge)) {
    return {413, false};
  }
  if (s.Is(net::kBodyTimeout)) return {408, false};
  if (s.Is(net::kHeadersTooLarge)) return {431, false};
  if (s.Is(net::kUnauthenticated)) return {401, false};
  if (s.Is(kRefusalCheckpointPathRefused) || s.Is(kRefusalCheckpointSwapDisabled)) {
    return {403, false};
  }
  switch (s.code()) {
    case StatusCode::kInvalidArgument:
      return {400, false};
    case StatusCode::kNotFound:
      return {404, false};
    case StatusCode::kIOError:
      return s.Is(net::kBodyIncomplete) ? HttpRefusal{400, false} : HttpRefusal{500, false};
    default:
      return {500, false};
  }
}

// Counters behind /metrics; one lock, taken once per request.
struct WorkerService::Metrics {
  static constexpr double kBucketsMs[] = {0.5, 1,   2.5, 5,    10,   25,   50,
                                          100, 250, 500, 1000, 2500, 5000, 10000};
  struct Latency {
    std::vector<uint64_t> buckets = std::vector<uint64_t>(std::size(kBucketsMs), 0);
    uint64_t count = 0;
    double sum_ms = 0;
  };
  mutable std::mutex mu;
  std::map<std::pair<std::string, std::string>, uint64_t> requests;   // (model, serving_mode)
  std::map<std::pair<std::string, std::string>, uint64_t> fallbacks;  // (model, reason)
  std::map<std::pair<std::string, int>, uint64_t> errors;             // (model, http status)
  std::map<std::string, Latency> latency;                             // model -> latency

  void Served(const std::string& model, const ServeResult& r, double ms) {
    std::lock_guard<std::mutex> lock(mu);
    ++requests[{model, r.serving_mode}];
    if (!r.fallback_reason.empty()) ++fallbacks[{model, r.fallback_reason}];
    Latency& l = latency[model];
    for (size_t i = 0; i < std::size(kBucketsMs); ++i) {
      if (ms <= kBucketsMs[i]) ++l.buckets[i];
    }
    ++l.count;
    l.sum_ms += ms;
  }
  void Error(const std::string& model, int status) {
    std::lock_guard<std::mutex> lock(mu);
    ++errors[{model, status}];
  }
};

WorkerService::WorkerService(WorkerServiceOptions options,
                             std::map<std::string, FrontendTarget> targets,
                             std::map<std::string, std::string> model_to_target)
    : options_(std::move(options)),
      targets_(std::move(targets)),
      model_to_target_(std::move(model_to_target)),
      metrics_(std::make_unique<Metrics>()) {
  for (const auto& [name, t] : targets_) {
    body_limits_[name] = BodyLimitFor(*t.graph, options_.max_body_bytes);
  }
}

WorkerService::~WorkerService() = default;

Result<std::unique_ptr<WorkerService>> WorkerService::Create(
    WorkerServiceOptions options, std::map<std::string, FrontendTarget> targets,
    std::map<std::string, std::string> model_to_target) {
  if (options.max_concurrency < 1) {
    return Status::InvalidArgument("worker front: max_concurrency must be >= 1, got " +
                                   std::to_string(options.max_concurrency));
  }
  for (const auto& [name, t] : targets) {
    if (t.target == nullptr || t.graph == nullptr) {
      return Status::InvalidArgument("worker front: target '" + name +
                                     "' has no ServedTarget or graph");
    }
  }
  for (const auto& [model, target] : model_to_target) {
    if (!targets.count(target)) {
      return Status::InvalidArgument("worker front: model '" + model + "' routes to target '" +
                                     target + "', which is not served");
    }
  }
  return std::unique_ptr<WorkerService>(
      new WorkerService(std::move(options), std::move(targets), std::move(model_to_target)));
}

json WorkerService::ServerMetadata() const {
  return json{
      {"name", "kiln"}, {"version", "1"}, {"extensions", json::array({"binary_tensor_data"})}};
}

bool WorkerService::DefaultReady(std::string* why) const {
  for (const auto& [name, t] : targets_) {
    if (t.target->lane_policy() == LanePolicy::kMandatory && t.target->cell() == nullptr) {
      if (why) *why = "mandatory target '" + name + "' has no armed cell";
      return false;
    }
  }
  return true;
}

WorkerService::Readiness WorkerService::Ready() const {
  std::string why;
  const bool ready = options_.ready ? options_.ready(&why) : DefaultReady(&why);
  if (draining_.load()) return {false, json{{"ready", false}, {"reason", kRefusalDraining}}};
  if (ready) return {true, json{{"ready", true}}};
  return {false, json{{"ready", false}, {"reason", why}}};
}

Result<const FrontendTarget*> WorkerService::Resolve(const std::string& model,
                                                     const std::string& version,
                                                     std::string* target_name) const {
  auto it = model_to_target_.find(model);
  if (it == model_to_target_.end()) {
    std::string known;
    for (const auto& [m, t] : model_to_target_) known += (known.empty() ? "" : ", ") + m;
    return Status::NotFound("model '" + model + "' is not served here (models: " + known + ")");
  }
  if (!version.empty() && version != options_.model_version) {
    return Status::NotFound("model '" + model + "' has no version '" + version +
                            "' (served: " + options_.model_version + ")");
  }
  *target_name = it->second;
  return &targets_.at(it->second);
}

Result<json> WorkerService::ModelMetadata(const std::string& model,
                                          const std::string& version) const {
  std::string target_name;
  KILN_ASSIGN_OR_RETURN(const FrontendTarget* t, Resolve(model, version, &target_name));
  return json{{"name", model},
              {"versions", json::array({options_.model_version})},
              {"platform", "kiln"},
              {"inputs", ValueInfosJson(t->graph->inputs)},
              {"outputs", ValueInfosJson(t->graph->outputs)},
              {"parameters",
               {{"target", target_name},
                {"lane", LanePolicyName(t->target->lane_policy())},
                {"posture", t->target->Posture()}}}};
}

Result<WorkerService::Readiness> WorkerService::ModelReady(const std::string& model,
                                                           const std::string& version) const {
  std::string target_name;
  KILN_ASSIGN_OR_RETURN(const FrontendTarget* t, Resolve(model, version, &target_name));
  const bool ready =
      t->target->lane_policy() != LanePolicy::kMandatory || t->target->cell() != nullptr;
  return Readiness{ready,
                   json{{"name", model}, {"ready", ready}, {"posture", t->target->Posture()}}};
}

uint64_t WorkerService::BodyLimit(const std::string& model) const {
  auto it = model_to_target_.find(model);
  if (it == model_to_target_.end()) return options_.max_body_bytes;
  return body_limits_.at(it->second);
}

Status WorkerService::Acquire() {
  std::unique_lock<std::mutex> lock(slots_mu_);
  const bool got = slots_cv_.wait_for(
      lock, std::chrono::milliseconds(options_.queue_timeout_ms),
      [this] { return draining_.load() || running_ < options_.max_concurrency; });
  if (draining_.load()) {
    return Status::Refused(StatusCode::kResourceExhausted, kRefusalDraining,
                           "the worker is shutting down");
  }
  if (!got) {
    return Status::Refused(StatusCode::kResourceExhausted, net::kOverloaded,
                           "too many requests in line");
  }
  ++running_;
  return Status::OK();
}

void WorkerService::Release() {
  {
    std::lock_guard<std::mutex> lock(slots_mu_);
    --running_;
  }
  slots_cv_.notify_one();
}

void WorkerService::BeginDrain() {
  draining_.store(true);
  slots_cv_.notify_all();
}

Result<WorkerService::InferAnswer> WorkerService::Infer(const InferCall& call) {
  std::string target_name;
  auto resolved = Resolve(call.model, call.version, &target_name);
  if (!resolved.ok()) {
    metrics_->Error("", WorkerHttpStatus(resolved.status()).status);
    return resolved.status();
  }
  struct InFlight {
    std::atomic<int>& n;
    explicit InFlight(std::atomic<int>& c) : n(c) { ++n; }
    ~InFlight() { --n; }
  } in_flight(in_flight_);
  auto answer = InferInSlot(call, **resolved);
  if (!answer.ok()) metrics_->Error(call.model, WorkerHttpStatus(answer.status()).status);
  return answer;
}

Result<WorkerService::InferAnswer> WorkerService::InferInSlot(const InferCall& call,
                                                              const FrontendTarget& t) {
  if (draining_.load()) {
    return Status::Refused(StatusCode::kResourceExhausted, kRefusalDraining,
                           "the worker is shutting down");
  }
  const uint64_t limit = BodyLimit(call.model);
  if (call.body_size && *call.body_size > limit) {
    return Status::Refused(StatusCode::kInvalidArgument, net::kTooLarge,
                           "model '" + call.model + "' takes at most " + std::to_string(limit) +
                               " body bytes (its inputs' size); Content-Length is " +
                               std::to_string(*call.body_size));
  }
  InferReadOptions read;
  read.body_size = call.body_size;
  read.max_body_bytes = limit;
  if (call.json_part) {
    KILN_ASSIGN_OR_RETURN(read.json_length, ParseInferenceHeaderLength(
                                                *call.json_part, call.body_size.value_or(limit)));
  }
  const Graph& graph = *t.graph;
  read.admit_input = [&graph](const std::string& name, DType dtype, const Shape& shape) {
    return CheckInputAgainstGraph(graph, name, dtype, shape);
  };
  KILN_RETURN_IF_ERROR(Acquire());
  struct Slot {
    WorkerService* s;
    ~Slot() { s->Release(); }
  } slot{this};
  KILN_ASSIGN_OR_RETURN(InferRequest parsed, ReadInferRequest(call.body, read));
  KILN_RETURN_IF_ERROR(CheckInputsAgainstGraph(graph, parsed.inputs));
  for (const std::string& out : parsed.requested_outputs) {
    bool known = false;
    for (const ValueInfo& vi : graph.outputs) known = known || vi.name == out;
    if (!known) {
      return Status::InvalidArgument("output '" + out + "' is not an output of model '" +
                                     call.model + "'");
    }
  }
  const auto start = std::chrono::steady_clock::now();
  KILN_ASSIGN_OR_RETURN(ServeResult served, t.target->Serve(parsed.inputs, call.model));
  const double ms = MsSince(start);
  // The inputs are done with: the answer that streams out holds only the outputs.
  parsed.inputs.clear();
  InferOutcome outcome{served.serving_mode, served.served_cell_ref, served.fallback_reason,
                       served.fallback_detail, served.duration_ms};
  KILN_ASSIGN_OR_RETURN(auto stream,
                        InferResponseStream::Create(call.model, options_.model_version, parsed,
                                                    std::move(served.outputs), outcome));
  metrics_->Served(call.model, served, ms);
  return InferAnswer{std::move(stream)};
}

std::string WorkerService::MetricsText() const {
  std::ostringstream o;
  {
    std::lock_guard<std::mutex> lock(metrics_->mu);
    o << "# HELP kiln_infer_requests_total Infer requests answered, by model and serving_mode.\n"
      << "# TYPE kiln_infer_requests_total counter\n";
    for (const auto& [k, n] : metrics_->requests) {
      o << "kiln_infer_requests_total{model=\"" << Label(k.first) << "\",serving_mode=\""
        << Label(k.second) << "\"} " << n << "\n";
    }
    o << "# HELP kiln_infer_fallbacks_total Eager answers, by model and fallback reason or "
         "posture token.\n"
      << "# TYPE kiln_infer_fallbacks_total counter\n";
    for (const auto& [k, n] : metrics_->fallbacks) {
      o << "kiln_infer_fallbacks_total{model=\"" << Label(k.first) << "\",reason=\""
        << Label(k.second) << "\"} " << n << "\n";
    }
    o << "# HELP kiln_infer_errors_total Infer requests refused, by model and HTTP status.\n"
      << "# TYPE kiln_infer_errors_total counter\n";
    for (const auto& [k, n] : metrics_->errors) {
      o << "kiln_infer_errors_total{model=\"" << Label(k.first) << "\",code=\"" << k.second
        << "\"} " << n << "\n";
    }
    o << "# HELP kiln_infer_duration_ms Serve time of answered infer requests (ms).\n"
      << "# TYPE kiln_infer_duration_ms histogram\n";
    for (const auto& [model, l] : metrics_->latency) {
      const std::string m = Label(model);
      for (size_t i = 0; i < std::size(Metrics::kBucketsMs); ++i) {
        o << "kiln_infer_duration_ms_bucket{model=\"" << m << "\",le=\"" << Metrics::kBucketsMs[i]
          << "\"} " << l.buckets[i] << "\n";
      }
      o << "kiln_infer_duration_ms_bucket{model=\"" << m << "\",le=\"+Inf\"} " << l.count << "\n";
      o << "kiln_infer_duration_ms_sum{model=\"" << m << "\"} " << l.sum_ms << "\n";
      o << "kiln_infer_duration_ms_count{model=\"" << m << "\"} " << l.count << "\n";
    }
  }
  o << "# HELP kiln_cell_revoked 1 when the target's cell was revoked for cause.\n"
    << "# TYPE kiln_cell_revoked gauge\n";
  for (const auto& [name, t] : targets_) {
    o << "kiln_cell_revoked{target=\"" << Label(name) << "\"} "
      << (t.target->revoked_cell() != nullptr ? 1 : 0) << "\n";
  }
  o << "# HELP kiln_target_posture The target's posture (what the next request is served as).\n"
    << "# TYPE kiln_target_posture gauge\n";
  for (const auto& [name, t] : targets_) {
    o << "kiln_target_posture{target=\"" << Label(name) << "\",posture=\""
      << Label(t.target->Posture()) << "\"} 1\n";
  }
  o << "# HELP kiln_target_eager_only 1 while the operator's eager-only order is on.\n"
    << "# TYPE kiln_target_eager_only gauge\n";
  for (const auto& [name, t] : targets_) {
    o << "kiln_target_eager_only{target=\"" << Label(name) << "\"} "
      << (t.target->eager_only() ? 1 : 0) << "\n";
  }
  o << "# HELP kiln_infer_in_flight Infer requests being handled now.\n"
    << "# TYPE kiln_infer_in_flight gauge\n"
    << "kiln_infer_in_flight " << in_flight_.load() << "\n";
  if (options_.events != nullptr) {
    o << "# HELP kiln_events_dropped_total Event rows that fell out of the ring.\n"
      << "# TYPE kiln_events_dropped_total counter\n"
      << "kiln_events_dropped_total " << options_.events->dropped() << "\n";
  }
  return o.str();
}

Result<std::string> WorkerService::Events(const std::map<std::string, std::string>& query) const {
  EventQuery q;
  if (auto it = query.find("kind"); it != query.end()) {
    q.kind = it->second;
    if (!IsKnownEventKind(q.kind)) {
      std::string kinds;
      for (const auto& k : EventKinds()) kinds += (kinds.empty() ? "" : ", ") + k;
      return Status::InvalidArgument("kind '" + q.kind + "' is not an event kind (" + kinds + ")");
    }
  }
  if (auto it = query.find("phase"); it != query.end()) q.phase = it->second;
  if (auto it = query.find("target"); it != query.end()) q.target = it->second;
  if (auto it = query.find("since"); it != query.end()) {
    KILN_ASSIGN_OR_RETURN(q.since_seq, ParseUint(it->second, "since"));
  }
  if (auto it = query.find("limit"); it != query.end()) {
    KILN_ASSIGN_OR_RETURN(uint64_t limit, ParseUint(it->second, "limit"));
    q.limit = static_cast<size_t>(limit);
  }
  std::string body = "[";
  if (options_.events != nullptr) {
    bool first = true;
    for (const EventRow& row : options_.events->Query(q)) {
      if (!first) body += ",";
      body += ToJsonLine(row);
      first = false;
    }
  }
  body += "]";
  return body;
}

// A target may be named by its target name or by any model name routed to it.
const FrontendTarget* WorkerService::AdminTarget(const json& j, std::string* name) const {
  auto it = j.find("target");
  if (it == j.end() || !it->is_string()) return nullptr;
  *name = it->get<std::string>();
  if (auto t = targets_.find(*name); t != targets_.end()) return &t->second;
  if (auto m = model_to_target_.find(*name); m != model_to_target_.end()) {
    *name = m->second;
    return &targets_.at(m->second);
  }
  return nullptr;
}

Result<json> WorkerService::SetEagerOnly(std::string_view body) {
  KILN_ASSIGN_OR_RETURN(json j, AdminBody(body, "eager-only"));
  std::string name;
  const FrontendTarget* t = AdminTarget(j, &name);
  if (t == nullptr) {
    const std::string message = "eager-only: \"target\" must name a served target or model" +
                                (name.empty() ? std::string() : " ('" + name + "' is not)");
    return j.contains("target") ? Status::NotFound(message) : Status::InvalidArgument(message);
  }
  auto on = j.find("on");
  if (on == j.end() || !on->is_boolean()) {
    return Status::InvalidArgument("eager-only: \"on\" must be true or false");
  }
  std::string reason;
  if (auto r = j.find("reason"); r != j.end()) {
    if (!r->is_string()) return Status::InvalidArgument("eager-only: \"reason\" must be a string");
    reason = r->get<std::string>();
  }
  t->target->SetEagerOnly(on->get<bool>(), reason);
  return json{
      {"target", name}, {"eager_only", t->target->eager_only()}, {"posture", t->target->Posture()}};
}

Result<json> WorkerService::SwapCheckpoint(std::string_view body) {
  KILN_ASSIGN_OR_RETURN(json j, AdminBody(body, "checkpoint"));
  std::string name;
  const FrontendTarget* t = AdminTarget(j, &name);
  if (t == nullptr) {
    const std::string message = "checkpoint: \"target\" must name a served target or model" +
                                (name.empty() ? std::string() : " ('" + name + "' is not)");
    return j.contains("target") ? Status::NotFound(message) : Status::InvalidArgument(message);
  }
  auto path_it = j.find("path");
  if (path_it == j.end() || !path_it->is_string()) {
    return Status::InvalidArgument(
        "checkpoint: \"path\" must name a .safetensors file in the checkpoint directory");
  }
  const std::string path = path_it->get<std::string>();
  KILN_RETURN_IF_ERROR(CheckCheckpointPath(path));
  if (options_.checkpoint_dir.empty()) {
    return Status::Refused(StatusCode::kInvalidArgument, kRefusalCheckpointSwapDisabled,
                           "checkpoint swaps are off: the worker was started without a "
                           "checkpoint directory (--checkpoint-dir)");
  }
  KILN_ASSIGN_OR_RETURN(int fd, OpenBeneath(options_.checkpoint_dir, path));
  auto mapped = MappedFile::FromDescriptor(fd, options_.checkpoint_dir + "/" + path);
  ::close(fd);
  const std::string what = "checkpoint \"" + path + "\" for target '" + name + "'";
  if (!mapped.ok()) {
    KILN_LOG(WARNING) << "worker admin: " << what << ": " << mapped.status().message();
    return Status::Refused(StatusCode::kInvalidArgument, "checkpoint_invalid",
                           what + " is not a regular file the worker can read");
  }
  const uint8_t* data = (*mapped)->data();
  const size_t size = (*mapped)->size();
  auto file = ParseSafetensors(std::move(mapped).value(), data, size, what);
  if (!file.ok()) {
    // The parser's message describes the file's bytes; it goes to the log, not to the caller.
    KILN_LOG(WARNING) << "worker admin: " << what << ": " << file.status().message();
    return Status::Refused(StatusCode::kInvalidArgument, "checkpoint_invalid",
                           what + " is not a valid safetensors file (the worker's log has why)");
  }
  auto weights = BindCheckpoint(*t->graph, file->tensors, what);
  if (!weights.ok()) return weights.status();
  KILN_RETURN_IF_ERROR(t->target->SwapCheckpoint(std::move(weights).value()));
  return json{{"target", name}, {"path", path}, {"posture", t->target->Posture()}};
}

}  // namespace kiln
