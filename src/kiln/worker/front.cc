// Frontend (worker layer): binds ServedTargets to KServe v2 over cpp-httplib. See front.h. This
// file is the one place a serve result becomes an HTTP response; every handler catches.
#include "src/kiln/worker/front.h"

#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>
#include <utility>

#include "src/kiln/base/log.h"
#include "src/kiln/graph/checkpoint.h"
#include "src/kiln/worker/kserve.h"

namespace kiln {

using nlohmann::json;

struct Frontend::Http {
  httplib::Server server;
};

// Counters behind /metrics; one lock, taken once per request.
struct Frontend::Metrics {
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

namespace {

std::string JsonText(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

void SendJson(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(JsonText(body), "application/json");
}

void SendError(httplib::Response& res, int status, const std::string& message) {
  SendJson(res, status, json{{"error", message}});
}

void SendRetry(httplib::Response& res, int retry_after_s, const std::string& token,
               const std::string& detail) {
  res.set_header("Retry-After", std::to_string(retry_after_s));
  SendJson(res, 503, json{{"error", token}, {"detail", detail}});
}

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

// Wraps a handler so that no exception leaves it.
httplib::Server::Handler Guard(
    std::function<void(const httplib::Request&, httplib::Response&)> fn) {
  return [fn = std::move(fn)](const httplib::Request& req, httplib::Response& res) {
    try {
      fn(req, res);
    } catch (const std::exception& e) {
      KILN_LOG(ERROR) << "worker front: " << req.method << " " << req.path
                      << " threw: " << e.what();
      SendError(res, 500, "internal error while handling " + req.path);
    } catch (...) {
      SendError(res, 500, "internal error while handling " + req.path);
    }
  };
}

// Parses a JSON object body for the admin routes.
Result<json> AdminBody(const std::string& body, const std::string& route) {
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return Status::InvalidArgument(route + ": the body must be a JSON object");
  }
  return j;
}

Result<uint64_t> ParseUint(const std::string& v, const std::string& what) {
  if (v.empty() || v.size() > 19 || v.find_first_not_of("0123456789") != std::string::npos) {
    return Status::InvalidArgument(what + " is \"" + v.substr(0, 40) +
                                   "\"; expected a non-negative integer");
  }
  return static_cast<uint64_t>(std::stoull(v));
}

}  // namespace

Frontend::Frontend(FrontendOptions options, std::map<std::string, FrontendTarget> targets,
                   std::map<std::string, std::string> model_to_target)
    : options_(std::move(options)),
      targets_(std::move(targets)),
      model_to_target_(std::move(model_to_target)),
      http_(std::make_unique<Http>()),
      metrics_(std::make_unique<Metrics>()) {}

Frontend::~Frontend() { Stop(); }

Result<std::unique_ptr<Frontend>> Frontend::Create(
    FrontendOptions options, std::map<std::string, FrontendTarget> targets,
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
  std::unique_ptr<Frontend> f(
      new Frontend(std::move(options), std::move(targets), std::move(model_to_target)));
  f->InstallRoutes();
  return f;
}

Status Frontend::Start() {
  auto& svr = http_->server;
  if (options_.port == 0) {
    port_ = svr.bind_to_any_port(options_.bind);
    if (port_ <= 0)
      return Status::IOError("worker front: cannot bind any port on " + options_.bind);
  } else {
    if (!svr.bind_to_port(options_.bind, options_.port)) {
      return Status::IOError("worker front: cannot bind " + options_.bind + ":" +
                             std::to_string(options_.port) + " (in use?)");
    }
    port_ = options_.port;
  }
  listener_ = std::thread([this] {
    if (!http_->server.listen_after_bind()) {
      KILN_LOG(ERROR) << "worker front: the listener on port " << port_ << " failed";
    }
  });
  // Stop() must see a running server, or its stop() would be a no-op and the join would hang.
  for (int i = 0; i < 5000 && !svr.is_running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return Status::OK();
}

void Frontend::Stop() {
  std::call_once(stop_once_, [this] {
    draining_.store(true);
    slots_cv_.notify_all();
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.drain_timeout_ms);
    while (in_flight_.load() > 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    if (in_flight_.load() > 0) {
      KILN_LOG(WARNING) << "worker front: " << in_flight_.load()
                        << " request(s) still running after the drain timeout";
    }
    http_->server.stop();
    if (listener_.joinable()) listener_.join();
  });
}

bool Frontend::Acquire(std::string* refusal) {
  std::unique_lock<std::mutex> lock(slots_mu_);
  const bool got = slots_cv_.wait_for(
      lock, std::chrono::milliseconds(options_.queue_timeout_ms),
      [this] { return draining_.load() || running_ < options_.max_concurrency; });
  if (draining_.load()) {
    *refusal = "draining";
    return false;
  }
  if (!got) {
    *refusal = "overloaded";
    return false;
  }
  ++running_;
  return true;
}

void Frontend::Release() {
  {
    std::lock_guard<std::mutex> lock(slots_mu_);
    --running_;
  }
  slots_cv_.notify_one();
}

bool Frontend::DefaultReady(std::string* why) const {
  for (const auto& [name, t] : targets_) {
    if (t.target->lane_policy() == LanePolicy::kMandatory && t.target->cell() == nullptr) {
      if (why) *why = "mandatory target '" + name + "' has no armed cell";
      return false;
    }
  }
  return true;
}

std::string Frontend::MetricsText() const {
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
  if (options_.extra_metrics) o << options_.extra_metrics();
  if (options_.events != nullptr) {
    o << "# HELP kiln_events_dropped_total Event rows that fell out of the ring.\n"
      << "# TYPE kiln_events_dropped_total counter\n"
      << "kiln_events_dropped_total " << options_.events->dropped() << "\n";
  }
  return o.str();
}

void Frontend::InstallRoutes() {
  auto& svr = http_->server;
  const int threads =
      options_.http_threads > 0 ? options_.http_threads : std::max(8, 4 * options_.max_concurrency);
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  // Without TCP_NODELAY small JSON answers wait on delayed ACKs (~40 ms each).
  svr.set_tcp_nodelay(true);
  svr.set_keep_alive_max_count(100000);
  svr.set_keep_alive_timeout(5);  // bounds how long Stop() waits on an idle keep-alive client
  svr.set_read_timeout(60);
  svr.set_write_timeout(60);
  svr.set_payload_max_length(options_.max_body_bytes);
  svr.set_exception_handler(
      [](const httplib::Request& req, httplib::Response& res, std::exception_ptr) {
        SendError(res, 500, "internal error while handling " + req.path);
      });
  svr.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 404) {
      SendError(res, 404, "no route " + req.method + " " + req.path);
    } else if (res.status == 413) {
      SendError(res, 413, "request body too large");
    } else {
      SendError(res, res.status, "HTTP " + std::to_string(res.status));
    }
  });

  // Resolves a model name (and optional version) to its target, or answers 404.
  auto resolve = [this](const httplib::Request& req, httplib::Response& res,
                        std::string* target_name) -> const FrontendTarget* {
    const std::string model = req.matches[1];
    const std::string version = req.matches.size() > 2 ? std::string(req.matches[2]) : "";
    auto it = model_to_target_.find(model);
    if (it == model_to_target_.end()) {
      std::string known;
      for (const auto& [m, t] : model_to_target_) known += (known.empty() ? "" : ", ") + m;
      SendError(res, 404, "model '" + model + "' is not served here (models: " + known + ")");
      return nullptr;
    }
    if (!version.empty() && version != options_.model_version) {
      SendError(res, 404,
                "model '" + model + "' has no version '" + version +
                    "' (served: " + options_.model_version + ")");
      return nullptr;
    }
    *target_name = it->second;
    return &targets_.at(it->second);
  };

  svr.Get("/v2", Guard([](const httplib::Request&, httplib::Response& res) {
            SendJson(res, 200,
                     json{{"name", "kiln"},
                          {"version", "1"},
                          {"extensions", json::array({"binary_tensor_data"})}});
          }));
  svr.Get("/v2/health/live", Guard([](const httplib::Request&, httplib::Response& res) {
            SendJson(res, 200, json{{"live", true}});
          }));
  svr.Get("/v2/health/ready", Guard([this](const httplib::Request&, httplib::Response& res) {
            std::string why;
            const bool ready = options_.ready ? options_.ready(&why) : DefaultReady(&why);
            if (draining_.load()) {
              SendJson(res, 503, json{{"ready", false}, {"reason", "draining"}});
            } else if (ready) {
              SendJson(res, 200, json{{"ready", true}});
            } else {
              SendJson(res, 503, json{{"ready", false}, {"reason", why}});
            }
          }));

  const std::string model_re = R"(/v2/models/([^/]+)(?:/versions/([^/]+))?)";
  svr.Get(model_re, Guard([this, resolve](const httplib::Request& req, httplib::Response& res) {
            std::string target_name;
            const FrontendTarget* t = resolve(req, res, &target_name);
            if (t == nullptr) return;
            SendJson(res, 200,
                     json{{"name", std::string(req.matches[1])},
                          {"versions", json::array({options_.model_version})},
                          {"platform", "kiln"},
                          {"inputs", ValueInfosJson(t->graph->inputs)},
                          {"outputs", ValueInfosJson(t->graph->outputs)},
                          {"parameters",
                           {{"target", target_name},
                            {"lane", LanePolicyName(t->target->lane_policy())},
                            {"posture", t->target->Posture()}}}});
          }));
  svr.Get(model_re + "/ready",
          Guard([this, resolve](const httplib::Request& req, httplib::Response& res) {
            std::string target_name;
            const FrontendTarget* t = resolve(req, res, &target_name);
            if (t == nullptr) return;
            const bool ready =
                t->target->lane_policy() != LanePolicy::kMandatory || t->target->cell() != nullptr;
            SendJson(res, ready ? 200 : 503,
                     json{{"name", std::string(req.matches[1])},
                          {"ready", ready},
                          {"posture", t->target->Posture()}});
          }));

  svr.Post(
      model_re + "/infer",
      Guard([this, resolve](const httplib::Request& req, httplib::Response& res) {
        const std::string model = req.matches[1];
        std::string target_name;
        const FrontendTarget* t = resolve(req, res, &target_name);
        if (t == nullptr) {
          metrics_->Error(model_to_target_.count(model) ? model : "", res.status);
          return;
        }
        struct InFlight {
          std::atomic<int>& n;
          explicit InFlight(std::atomic<int>& c) : n(c) { ++n; }
          ~InFlight() { --n; }
        } in_flight(in_flight_);
        auto refuse = [&](int status, const std::string& message) {
          SendError(res, status, message);
          metrics_->Error(model, status);
        };
        if (draining_.load()) {
          SendRetry(res, options_.retry_after_s, "draining", "the worker is shutting down");
          metrics_->Error(model, 503);
          return;
        }
        std::optional<size_t> json_length;
        if (req.has_header(kInferenceHeaderContentLength)) {
          auto n = ParseInferenceHeaderLength(req.get_header_value(kInferenceHeaderContentLength),
                                              req.body.size());
          if (!n.ok()) return refuse(400, n.status().message());
          json_length = *n;
        }
        auto parsed = ParseInferRequest(req.body, json_length);
        if (!parsed.ok()) return refuse(400, parsed.status().message());
        Status fit = CheckInputsAgainstGraph(*t->graph, parsed->inputs);
        if (!fit.ok()) return refuse(400, fit.message());
        for (const std::string& out : parsed->requested_outputs) {
          bool known = false;
          for (const ValueInfo& vi : t->graph->outputs) known = known || vi.name == out;
          if (!known) {
            return refuse(400, "output '" + out + "' is not an output of model '" + model + "'");
          }
        }
        std::string refusal;
        if (!Acquire(&refusal)) {
          SendRetry(
              res, options_.retry_after_s, refusal,
              refusal == "draining" ? "the worker is shutting down" : "too many requests in line");
          metrics_->Error(model, 503);
          return;
        }
        const auto start = std::chrono::steady_clock::now();
        auto served = t->target->Serve(parsed->inputs, model);
        Release();
        const double ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                .count();
        if (!served.ok()) {
          const Status& s = served.status();
          if (IsRetryableServeRefusal(s)) {
            SendRetry(res, options_.retry_after_s, s.token(), s.message());
            metrics_->Error(model, 503);
          } else if (s.code() == StatusCode::kInvalidArgument) {
            refuse(400, s.message());
          } else {
            refuse(500, s.message());
          }
          return;
        }
        InferOutcome outcome{served->serving_mode, served->served_cell_ref, served->fallback_reason,
                             served->fallback_detail, served->duration_ms};
        auto encoded =
            EncodeInferResponse(model, options_.model_version, *parsed, served->outputs, outcome);
        if (!encoded.ok()) return refuse(400, encoded.status().message());
        metrics_->Served(model, *served, ms);
        res.status = 200;
        if (encoded->json_length) {
          res.set_header(kInferenceHeaderContentLength, std::to_string(*encoded->json_length));
          res.set_content(std::move(encoded->body), "application/octet-stream");
        } else {
          res.set_content(std::move(encoded->body), "application/json");
        }
      }));

  svr.Get("/metrics", Guard([this](const httplib::Request&, httplib::Response& res) {
            res.status = 200;
            res.set_content(MetricsText(), "text/plain; version=0.0.4");
          }));

  svr.Get("/v1/events", Guard([this](const httplib::Request& req, httplib::Response& res) {
            EventQuery q;
            if (req.has_param("kind")) {
              q.kind = req.get_param_value("kind");
              if (!IsKnownEventKind(q.kind)) {
                std::string kinds;
                for (const auto& k : EventKinds()) kinds += (kinds.empty() ? "" : ", ") + k;
                return SendError(res, 400,
                                 "kind '" + q.kind + "' is not an event kind (" + kinds + ")");
              }
            }
            if (req.has_param("phase")) q.phase = req.get_param_value("phase");
            if (req.has_param("target")) q.target = req.get_param_value("target");
            if (req.has_param("since")) {
              auto v = ParseUint(req.get_param_value("since"), "since");
              if (!v.ok()) return SendError(res, 400, v.status().message());
              q.since_seq = *v;
            }
            if (req.has_param("limit")) {
              auto v = ParseUint(req.get_param_value("limit"), "limit");
              if (!v.ok()) return SendError(res, 400, v.status().message());
              q.limit = static_cast<size_t>(*v);
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
            res.status = 200;
            res.set_content(body, "application/json");
          }));

  // Admin: a target may be named by its target name or by any model name routed to it.
  auto admin_target = [this](const json& j, std::string* name) -> const FrontendTarget* {
    auto it = j.find("target");
    if (it == j.end() || !it->is_string()) return nullptr;
    *name = it->get<std::string>();
    if (auto t = targets_.find(*name); t != targets_.end()) return &t->second;
    if (auto m = model_to_target_.find(*name); m != model_to_target_.end()) {
      *name = m->second;
      return &targets_.at(m->second);
    }
    return nullptr;
  };

  svr.Post("/v1/admin/eager-only",
           Guard([admin_target](const httplib::Request& req, httplib::Response& res) {
             auto j = AdminBody(req.body, "eager-only");
             if (!j.ok()) return SendError(res, 400, j.status().message());
             std::string name;
             const FrontendTarget* t = admin_target(*j, &name);
             if (t == nullptr) {
               return SendError(res, j->contains("target") ? 404 : 400,
                                "eager-only: \"target\" must name a served target or model" +
                                    (name.empty() ? std::string() : " ('" + name + "' is not)"));
             }
             auto on = j->find("on");
             if (on == j->end() || !on->is_boolean()) {
               return SendError(res, 400, "eager-only: \"on\" must be true or false");
             }
             std::string reason;
             if (auto r = j->find("reason"); r != j->end()) {
               if (!r->is_string())
                 return SendError(res, 400, "eager-only: \"reason\" must be a string");
               reason = r->get<std::string>();
             }
             t->target->SetEagerOnly(on->get<bool>(), reason);
             SendJson(res, 200,
                      json{{"target", name},
                           {"eager_only", t->target->eager_only()},
                           {"posture", t->target->Posture()}});
           }));

  svr.Post("/v1/admin/checkpoint",
           Guard([admin_target](const httplib::Request& req, httplib::Response& res) {
             auto j = AdminBody(req.body, "checkpoint");
             if (!j.ok()) return SendError(res, 400, j.status().message());
             std::string name;
             const FrontendTarget* t = admin_target(*j, &name);
             if (t == nullptr) {
               return SendError(res, j->contains("target") ? 404 : 400,
                                "checkpoint: \"target\" must name a served target or model" +
                                    (name.empty() ? std::string() : " ('" + name + "' is not)"));
             }
             auto path = j->find("path");
             if (path == j->end() || !path->is_string() || path->get<std::string>().empty()) {
               return SendError(res, 400, "checkpoint: \"path\" must name a .safetensors file");
             }
             auto weights = LoadCheckpoint(*t->graph, path->get<std::string>());
             if (!weights.ok()) {
               return SendError(res, weights.status().code() == StatusCode::kNotFound ? 404 : 400,
                                weights.status().message());
             }
             Status s = t->target->SwapCheckpoint(std::move(weights).value());
             if (!s.ok()) return SendError(res, 400, s.message());
             SendJson(res, 200,
                      json{{"target", name},
                           {"path", path->get<std::string>()},
                           {"posture", t->target->Posture()}});
           }));
}

}  // namespace kiln
