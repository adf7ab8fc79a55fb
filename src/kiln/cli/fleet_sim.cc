// The fleet simulator: a bounded pool running simulated workers' boot-adopt (see fleet_sim.h).
#include "src/kiln/cli/fleet_sim.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <pqxx/pqxx>
#include <queue>
#include <sstream>
#include <thread>
#include <utility>

#include "src/kiln/base/backoff.h"
#include "src/kiln/base/file.h"
#include "src/kiln/base/subprocess.h"
#include "src/kiln/client/hub_client.h"
#include "src/kiln/graph/checkpoint.h"
#include "src/kiln/graph/onnx_import.h"
#include "src/kiln/identity/toolchain.h"
#include "src/kiln/manifest/manifest.h"
#include "src/kiln/mint/parent.h"
#include "src/kiln/net/address.h"
#include "src/kiln/worker/adoption.h"
#include "src/kiln/worker/boot.h"
#include "src/kiln/worker/event_forwarder.h"
#include "src/kiln/worker/events.h"
#include "src/kiln/worker/mint_lease.h"
#include "src/kiln/worker/revocations.h"
#include "src/kiln/worker/serving.h"

namespace kiln::cli {
namespace {

using SteadyClock = std::chrono::steady_clock;

// The hub's refusal of a publish whose key another publisher's bytes own (docs/hub-api.md): the
// owner's cell is adopted like any other.
constexpr const char* kHubKeyTaken = "key_taken";

double MsBetween(SteadyClock::time_point a, SteadyClock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// What every simulated worker reads and none writes.
struct Fleet {
  TargetSpec spec;
  std::shared_ptr<const Graph> graph;
  WeightMap weights;
  std::unique_ptr<ServedTarget> target;  // never installed into: BootContext::load is off
  HubClientOptions hub;
  std::optional<PublicKeySet> trust;  // operator anchors; nullopt = the hub's own key set
  std::string work_dir;
  int retry_max_ms = 30000;  // the manifest's hub.adopt_retry_max_s
  std::string manifest_abs;  // the mint child reads the manifest itself
};

// Cold-key mode: one mint child of the run, as the fleet saw it. Times are since the run's start.
struct MintRecord {
  std::string worker, holder;
  bool leased = false;    // under a granted lease (else none could be had)
  bool takeover = false;  // granted after this worker had waited on another holder's lease
  bool killed = false;    // the --kill-holder-after child
  double start_ms = 0, end_ms = 0;
  std::string phase;    // the mint parent's ending ("" = minted)
  std::string publish;  // "published", "already", the hub's refusal, or "" (not published)
  double publish_end_ms = 0;
};

// What the fleet's mints did, shared by the pool threads.
struct ColdKey {
  std::mutex mu;
  std::vector<MintRecord> mints;
  bool kill_claimed = false;
  double killed_at_ms = -1;
};

struct WorkerResult {
  std::string name;
  bool started = false;
  std::string phase;  // the last attempt's phase, or kFleetSimNotStarted
  std::string ref;
  std::string cause;  // BootOutcome::cause
  std::string detail;
  int attempts = 0;
  bool retryable = false;   // the last attempt's refusal was transient (the deadline ended it)
  double queue_ms = 0;      // arrival -> the first attempt's start
  double boot_ms = 0;       // the last attempt's AdoptAtBoot
  double outcome_ms = 0;    // the first attempt's start -> the last boot's end, waits included
  double event_ms = 0;      // the last attempt's row post
  int events_posted = 0;    // rows the hub accepted
  int events_unposted = 0;  // rows still unposted after the last attempt's post
  std::string event_token;  // the newest failed post's token
  std::vector<std::pair<std::string, double>> stages;  // the last attempt's
  std::vector<std::string> retried;  // phase (phase:cause) of each attempt that was retried
  SteadyClock::time_point first_start;
  std::string key;         // the last attempt's key
  int polls = 0;           // cold key: boots made to adopt (a lease wait's poll, after a mint)
  bool poll_next = false;  // the next attempt is such a boot, not a retry
  bool waited = false;     // cold key: saw another holder's lease and waited on it
  int mints = 0;           // cold key: mint children this worker started
  int deaths = 0;          // cold key: times this worker's mint was killed with it
};

// Posts the worker's rows as its forwarder would (instance = its name), retrying a transport
// failure or a 5xx at most three times with jittered backoff, never past `deadline`. The refusal
// token of the last attempt, or "".
std::string PostRows(HubClient& client, const nlohmann::json& rows,
                     SteadyClock::time_point deadline) {
  std::string token;
  for (int attempt = 0; attempt < 3; ++attempt) {
    HubAnswer a = client.PostEvents(rows);
    if (a.ok()) return "";
    token = a.token;
    if (!IsHubTransportToken(a.token) && a.http_status < 500) break;
    const auto wait =
        JitteredBackoff(std::chrono::milliseconds(100), std::chrono::milliseconds(2000), attempt);
    if (SteadyClock::now() + wait >= deadline) break;
    std::this_thread::sleep_for(wait);
  }
  return token;
}

// What one simulated worker keeps between its attempts, as a worker process keeps its Adopter's
// context: its clients (and their connections), the hub's key set as fetched, its revocation
// list, its event log. Made at its first attempt, dropped at its outcome.
struct SimWorker {
  std::unique_ptr<HubClient> client;
  std::unique_ptr<RevocationWatch> watch;
  PublicKeySet hub_keys;
  EventLog log{16};
  uint64_t posted_seq = 0;  // rows up to this seq were posted
  HubClientOptions hub;     // as its clients were made
  // Cold key: its lease client (one per life: a rebooted machine is a new holder), the holder it
  // last waited on, and its polls since.
  std::unique_ptr<MintLeases> leases;
  int life = 1;
  std::string seen_holder;
  int lease_polls = 0;
};

Status SetUpWorker(const Fleet& fleet, const std::string& name, SteadyClock::time_point deadline,
                   SimWorker* w) {
  HubClientOptions ho = fleet.hub;
  // No request outlives the run by more than its own connect timeout.
  const double left_s = std::chrono::duration<double>(deadline - SteadyClock::now()).count();
  ho.io_timeout_s = std::max(0.5, std::min(ho.io_timeout_s, left_s));
  w->hub = ho;
  KILN_ASSIGN_OR_RETURN(w->client, HubClient::Create(ho));
  RevocationWatchOptions ro;
  ro.hub = ho;
  if (fleet.trust) {
    ro.anchors = *fleet.trust;
    ro.use_anchors = true;
  }
  ro.worker = name;
  KILN_ASSIGN_OR_RETURN(w->watch, RevocationWatch::Create(ro));
  return Status::OK();
}

// One boot-adopt attempt of a simulated worker and the post of its row. Returns whether the
// attempt's refusal is one a worker retries (the hub could not be asked: adoption.h).
bool AttemptBoot(Fleet& fleet, SimWorker& w, SteadyClock::time_point deadline, WorkerResult* r) {
  ++r->attempts;
  BootContext ctx;
  ctx.hub = w.client.get();
  ctx.trust = fleet.trust ? &*fleet.trust : nullptr;
  ctx.hub_keys = &w.hub_keys;
  ctx.revocations = w.watch.get();
  ctx.events = &w.log;
  ctx.private_dir = fleet.work_dir + "/" + r->name;
  ctx.blob_cache_dir = ctx.private_dir + "/blobs";
  ctx.worker = r->name;
  ctx.load = false;
  const BootOutcome out = AdoptAtBoot(*fleet.target, fleet.spec, fleet.graph, fleet.weights, ctx);
  r->outcome_ms = MsBetween(r->first_start, SteadyClock::now());
  r->phase = out.phase;
  r->ref = out.ref;
  r->cause = out.cause;
  r->detail = out.detail;
  r->boot_ms = out.duration_ms;
  r->stages = out.stages;
  r->retryable = out.retryable;
  r->key = out.key;

  // Rows a failed post left are posted with the next attempt's, as the forwarder's queue keeps
  // them.
  EventQuery since;
  since.since_seq = w.posted_seq;
  nlohmann::json rows = nlohmann::json::array();
  uint64_t newest = w.posted_seq;
  for (const EventRow& row : w.log.Query(since)) {
    rows.push_back(HubEventRow(row, r->name));
    newest = std::max(newest, row.seq);
  }
  const auto posting = SteadyClock::now();
  const std::string token = PostRows(*w.client, rows, deadline);
  r->event_ms = MsBetween(posting, SteadyClock::now());
  if (token.empty()) {
    r->events_posted += static_cast<int>(rows.size());
    r->events_unposted = 0;
    w.posted_seq = newest;
  } else {
    r->events_unposted = static_cast<int>(rows.size());
    r->event_token = token;
  }
  std::error_code ec;
  std::filesystem::remove_all(ctx.private_dir, ec);
  return out.retryable;
}

// This process's user + system CPU seconds so far: the simulator's own cost, which shares the
// machine with a hub on loopback.
double OwnCpuSeconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  auto s = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec / 1e6; };
  return s(u.ru_utime) + s(u.ru_stime);
}

// utime + stime of a process in seconds (/proc/<pid>/stat fields 14 and 15).
Result<double> ProcessCpuSeconds(int pid) {
  const std::string path = "/proc/" + std::to_string(pid) + "/stat";
  auto text = ReadFile(path);
  if (!text.ok()) {
    return Status::InvalidArgument("--hub-pid " + std::to_string(pid) +
                                   ": no such process (cannot read " + path + ")");
  }
  // The command name (field 2) may hold spaces and parentheses: fields 3.. follow the last ')'.
  const size_t close = text->rfind(')');
  if (close == std::string::npos) {
    return Status::InvalidArgument(path + " does not look like /proc/<pid>/stat: no ')'");
  }
  std::istringstream rest(text->substr(close + 1));
  std::vector<std::string> fields;
  std::string f;
  while (rest >> f && fields.size() < 13) fields.push_back(f);
  if (fields.size() < 13) return Status::InvalidArgument(path + " has fewer than 15 fields");
  const double ticks = static_cast<double>(::sysconf(_SC_CLK_TCK));
  return (std::strtod(fields[11].c_str(), nullptr) + std::strtod(fields[12].c_str(), nullptr)) /
         ticks;
}

// Samples the hub's database connections (pg_stat_activity of its database, this connection
// excluded) until stopped. libpqxx throws; nothing leaves this class.
class DbSampler {
 public:
  static Result<std::unique_ptr<DbSampler>> Create(const std::string& url, int poll_ms) {
    std::unique_ptr<DbSampler> s(new DbSampler(poll_ms));
    try {
      s->conn_ = std::make_unique<pqxx::connection>(url);
      KILN_RETURN_IF_ERROR(s->SampleOnce());
    } catch (const std::exception& e) {
      return Status::InvalidArgument(std::string("--db: cannot connect: ") + e.what());
    }
    return s;
  }
  ~DbSampler() { Stop(); }
  void Start(SteadyClock::time_point until) {
    thread_ = std::thread([this, until] {
      while (!stop_.load() && SteadyClock::now() < until) {
        SampleOnce().IgnoreError();
        std::this_thread::sleep_for(std::chrono::milliseconds(poll_ms_));
      }
      SampleOnce().IgnoreError();
    });
  }
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  nlohmann::json Report() const {
    return {{"peak_connections", peak_total_},
            {"peak_active", peak_active_},
            {"samples", samples_},
            {"sample_errors", errors_},
            {"poll_ms", poll_ms_}};
  }

 private:
  explicit DbSampler(int poll_ms) : poll_ms_(poll_ms) {}
  Status SampleOnce() {
    try {
      pqxx::nontransaction tx(*conn_);
      pqxx::row row = tx.exec1(
          "SELECT count(*), count(*) FILTER (WHERE state = 'active') FROM pg_stat_activity "
          "WHERE datname = current_database() AND pid <> pg_backend_pid()");
      peak_total_ = std::max(peak_total_, row[0].as<int64_t>());
      peak_active_ = std::max(peak_active_, row[1].as<int64_t>());
      ++samples_;
      return Status::OK();
    } catch (const std::exception& e) {
      ++errors_;
      return Status::IOError(std::string("pg_stat_activity: ") + e.what());
    }
  }
  const int poll_ms_;
  std::unique_ptr<pqxx::connection> conn_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  int64_t peak_total_ = 0, peak_active_ = 0, samples_ = 0, errors_ = 0;
};

// Nearest-rank percentiles of `v` (sorted here), in ms.
nlohmann::json Percentiles(std::vector<double> v) {
  if (v.empty()) return {{"n", 0}};
  std::sort(v.begin(), v.end());
  auto at = [&](double p) {
    const size_t rank = static_cast<size_t>(std::ceil(p * static_cast<double>(v.size())));
    return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
  };
  double sum = 0;
  for (double x : v) sum += x;
  auto r2 = [](double x) { return std::round(x * 100) / 100; };
  return {{"n", v.size()},       {"p50", r2(at(0.50))}, {"p90", r2(at(0.90))},
          {"p99", r2(at(0.99))}, {"max", r2(v.back())}, {"mean", r2(sum / v.size())}};
}

Status CheckOptions(const FleetSimOptions& o) {
  auto bad = [](const std::string& what, const std::string& value, const std::string& want) {
    return Status::InvalidArgument("fleet-sim: " + what + " is " + value + "; expected " + want);
  };
  if (o.workers < 1 || o.workers > 100000) {
    return bad("--workers", std::to_string(o.workers), "1..100000");
  }
  if (o.concurrency < 1 || o.concurrency > 4096) {
    return bad("--concurrency", std::to_string(o.concurrency), "1..4096");
  }
  if (o.arrival == Arrival::kRamp && !(o.ramp_s > 0)) {
    return bad("--ramp", std::to_string(o.ramp_s), "> 0 seconds with --arrival ramp");
  }
  if (!(o.timeout_s > 0)) return bad("--timeout", std::to_string(o.timeout_s), "> 0 seconds");
  if (!(o.hub_timeout_s > 0)) {
    return bad("--hub-timeout", std::to_string(o.hub_timeout_s), "> 0 seconds");
  }
  if (o.max_attempts < 1 || o.max_attempts > 100) {
    return bad("--max-attempts", std::to_string(o.max_attempts), "1..100");
  }
  if (o.db_poll_ms < 5) return bad("--db-poll-ms", std::to_string(o.db_poll_ms), ">= 5");
  if (o.max_mints < 1 || o.max_mints > 1000) {
    return bad("--max-mints", std::to_string(o.max_mints), "1..1000");
  }
  if (!(o.kill_holder_after_s >= 0)) {
    return bad("--kill-holder-after", std::to_string(o.kill_holder_after_s), ">= 0 seconds");
  }
  if (o.kill_holder_after_s > 0 && !o.cold_key) {
    return bad("--kill-holder-after", std::to_string(o.kill_holder_after_s),
               "only with --cold-key (there is no lease holder otherwise)");
  }
  return Status::OK();
}

// The manifest's target (the named one, or its only exported one), its graph and weights, the
// shared serving wrapper, and the hub's client options.
Result<Fleet> LoadFleet(const FleetSimOptions& o) {
  KILN_ASSIGN_OR_RETURN(Manifest m, LoadManifest(o.manifest));
  Fleet fleet;
  fleet.manifest_abs = std::filesystem::absolute(o.manifest).string();
  const TargetSpec* chosen = nullptr;
  int exported = 0;
  for (const TargetSpec& t : m.targets) {
    if (t.exported()) ++exported;
    if (o.target.empty() ? (t.exported() && chosen == nullptr) : t.name == o.target) chosen = &t;
  }
  if (chosen == nullptr || (o.target.empty() && exported != 1)) {
    return Status::InvalidArgument(
        "fleet-sim: manifest '" + o.manifest + "' has " +
        (o.target.empty() ? std::to_string(exported) + " exported targets; name one with --target"
                          : "no target '" + o.target + "'"));
  }
  if (!chosen->exported()) {
    return Status::InvalidArgument("fleet-sim: target '" + chosen->name +
                                   "' declares no export: workers adopt nothing for it");
  }
  fleet.spec = *chosen;
  KILN_ASSIGN_OR_RETURN(Graph g, ImportOnnxFile(fleet.spec.graph));
  fleet.graph = std::make_shared<const Graph>(std::move(g));
  fleet.weights = GraphWeights(*fleet.graph);
  if (!fleet.spec.checkpoint.empty()) {
    KILN_ASSIGN_OR_RETURN(fleet.weights, LoadCheckpoint(*fleet.graph, fleet.spec.checkpoint));
  }
  ServedTargetOptions so;
  so.name = fleet.spec.name;
  so.lane_policy = fleet.spec.lane;
  so.envelope = fleet.spec.envelope;
  so.allow_partial = fleet.spec.allows_partial_coverage();
  KILN_ASSIGN_OR_RETURN(fleet.target, ServedTarget::Create(so, fleet.graph, fleet.weights));

  fleet.hub.url = !o.hub_url.empty() ? o.hub_url : (m.hub ? m.hub->url : "");
  if (fleet.hub.url.empty()) {
    return Status::InvalidArgument("fleet-sim: no hub: give --hub or a [hub] url in '" +
                                   o.manifest + "'");
  }
  KILN_ASSIGN_OR_RETURN(net::HttpUrl url, net::ParseHttpUrl(fleet.hub.url));
  if (!net::IsLoopbackHost(url.host) && !o.allow_non_loopback) {
    return Status::Refused(StatusCode::kInvalidArgument, kRefusalFleetSimNotLoopback,
                           "fleet-sim: hub '" + fleet.hub.url +
                               "' is not on loopback; the simulator floods its hub, so say "
                               "--allow-non-loopback to point it at another host");
  }
  fleet.hub.token = o.token;
  if (fleet.hub.token.empty()) {
    if (const char* env = std::getenv("KILN_HUB_TOKEN")) fleet.hub.token = env;
  }
  if (fleet.hub.token.empty() && m.hub) fleet.hub.token = m.hub->token;
  fleet.retry_max_ms = (m.hub ? m.hub->adopt_retry_max_s : HubSpec().adopt_retry_max_s) * 1000;
  fleet.hub.ca_file = !o.ca.empty() ? o.ca : (m.hub ? m.hub->ca : "");
  fleet.hub.insecure_http = o.allow_non_loopback;
  fleet.hub.io_timeout_s = o.hub_timeout_s;
  fleet.hub.connect_timeout_s = std::min(o.hub_timeout_s, 3.0);
  const std::vector<std::string>& trust =
      !o.trust.empty() ? o.trust : (m.hub ? m.hub->trust : std::vector<std::string>());
  if (!trust.empty()) {
    PublicKeySet anchors;
    for (const std::string& path : trust) {
      KILN_ASSIGN_OR_RETURN(PublicKeySet keys, LoadTrustedKeys(path));
      KILN_RETURN_IF_ERROR(anchors.AddAll(keys));
    }
    fleet.trust = std::move(anchors);
  }
  return fleet;
}

std::string WorkerName(const std::string& prefix, int i) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%05d", i + 1);
  return prefix + "-" + buf;
}

// The pool: a queue of (due, worker) that every pool thread takes from in due order. Worker i
// is first due at its arrival; an attempt refused retryably is due again after the worker's
// jittered backoff (adoption.h: 1 s, 2 s, 4 s ... up to the manifest's hub.adopt_retry_max_s),
// without holding a pool thread while it waits. A worker ends at an outcome that is not
// retried, at its last allowed attempt, or at the deadline.
class Pool {
 public:
  Pool(Fleet& fleet, const FleetSimOptions& o, SteadyClock::time_point start,
       SteadyClock::time_point deadline, int retry_max_ms, std::vector<WorkerResult>* results,
       ColdKey* cold)
      : fleet_(fleet),
        o_(o),
        start_(start),
        cold_(*cold),
        deadline_(deadline),
        retry_max_ms_(retry_max_ms),
        results_(*results),
        workers_(o.workers) {
    for (int i = 0; i < o.workers; ++i) {
      results_[i].name = WorkerName(o.prefix, i);
      SteadyClock::time_point due = start;
      if (o.arrival == Arrival::kRamp) {
        due += std::chrono::duration_cast<SteadyClock::duration>(std::chrono::duration<double>(
            o.ramp_s * static_cast<double>(i) / static_cast<double>(o.workers)));
      }
      arrival_.push_back(due);
      queue_.push({due, i});
    }
    pending_ = o.workers;
  }

  // Runs the pool; the concurrency reached (thread creation may fail).
  int Run() {
    std::vector<std::thread> threads;
    const int want = std::min(o_.concurrency, o_.workers);
    for (int t = 0; t < want; ++t) {
      try {
        threads.emplace_back([this] { Loop(); });
      } catch (const std::system_error&) {
        break;  // fewer threads: the report says how many ran
      }
    }
    if (threads.empty()) Loop();  // not even one thread: this one runs them all
    for (std::thread& t : threads) t.join();
    return std::max<int>(1, static_cast<int>(threads.size()));
  }

 private:
  struct Due {
    SteadyClock::time_point due;
    int index;
    bool operator>(const Due& o) const { return due > o.due || (due == o.due && index > o.index); }
  };

  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (pending_ > 0) {
      const auto now = SteadyClock::now();
      if (now >= deadline_) {
        // Nothing starts after the deadline: every queued worker ends as it stands.
        while (!queue_.empty()) {
          Finish(queue_.top().index);
          queue_.pop();
        }
        cv_.notify_all();
        if (pending_ > 0) cv_.wait_until(lock, deadline_ + std::chrono::hours(1));
        continue;
      }
      if (queue_.empty() || queue_.top().due > now) {
        const auto until = queue_.empty() ? deadline_ : std::min(queue_.top().due, deadline_);
        cv_.wait_until(lock, until);
        continue;
      }
      const int i = queue_.top().index;
      queue_.pop();
      lock.unlock();
      const std::optional<int64_t> again_ms = RunAttempt(i);
      lock.lock();
      if (again_ms) {
        queue_.push({SteadyClock::now() + std::chrono::milliseconds(*again_ms), i});
      } else {
        Finish(i);
      }
      cv_.notify_all();
    }
  }

  // One attempt of worker i (outside the lock), and in cold-key mode what its miss leads to; the
  // wait before its next attempt, or nullopt when its outcome is final.
  std::optional<int64_t> RunAttempt(int i) {
    WorkerResult& r = results_[i];
    std::unique_ptr<SimWorker>& w = workers_[i];
    const auto now = SteadyClock::now();
    if (!r.started) {
      r.started = true;
      r.first_start = now;
      r.queue_ms = std::max(0.0, MsBetween(arrival_[i], now));
      w = std::make_unique<SimWorker>();
      if (Status set = SetUpWorker(fleet_, r.name, deadline_, w.get()); !set.ok()) {
        r.phase = set.token().empty() ? "setup_failed" : set.token();
        r.detail = set.ToString();
        w.reset();
        return std::nullopt;
      }
    } else if (!r.poll_next) {
      r.retried.push_back(r.cause.empty() ? r.phase : r.phase + ":" + r.cause);
    }
    r.poll_next = false;
    const bool retryable = AttemptBoot(fleet_, *w, deadline_, &r);
    if (retryable) {
      // Polls are not retries: --max-attempts bounds the attempts the hub could not answer.
      const int retries = r.attempts - r.polls;
      if (retries >= o_.max_attempts) return std::nullopt;
      return JitteredBackoff(std::chrono::milliseconds(std::min(1000, retry_max_ms_)),
                             std::chrono::milliseconds(retry_max_ms_), retries - 1)
          .count();
    }
    if (o_.cold_key && r.phase == kBootMiss && !r.key.empty()) {
      std::optional<int64_t> next = ColdStep(r, *w);
      if (next) {
        ++r.polls;
        r.poll_next = true;
      }
      return next;
    }
    return std::nullopt;
  }

  double SinceStartMs() const { return MsBetween(start_, SteadyClock::now()); }

  // A cold key's miss: the worker's lease path (adoption.cc MintOrWait).
  std::optional<int64_t> ColdStep(WorkerResult& r, SimWorker& w) {
    const std::string& family = fleet_.spec.export_spec->family;
    if (w.leases == nullptr) {
      MintLeaseOptions lo;
      lo.hub = w.hub;
      lo.holder =
          r.name + "@fleet-sim/" + std::to_string(::getpid()) + "/" + std::to_string(w.life);
      lo.worker = r.name;
      auto leases = MintLeases::Create(lo, &w.log);
      if (!leases.ok()) {
        r.phase = kFleetSimMintFailed;
        r.cause = leases.status().token();
        r.detail = leases.status().ToString();
        return std::nullopt;
      }
      w.leases = std::move(*leases);
    }
    const LeaseAnswer lease = w.leases->Acquire(r.key, family);
    const AdopterOptions poll;  // the worker's own poll bounds
    switch (lease.kind) {
      case LeaseAnswer::Kind::kGranted: {
        const bool takeover = !w.seen_holder.empty() && w.seen_holder != w.leases->holder();
        return Mint(r, w, &lease, takeover);
      }
      case LeaseAnswer::Kind::kNoLease:
        return Mint(r, w, nullptr, false);
      case LeaseAnswer::Kind::kPublished:
        return JitteredBackoff(std::chrono::milliseconds(100),
                               std::chrono::milliseconds(poll.lease_poll_max_ms), w.lease_polls++)
            .count();
      case LeaseAnswer::Kind::kHeld:
        break;
    }
    if (lease.holder != w.seen_holder) {
      EventRow row;
      row.kind = event_kind::kSelfMintSkipped;
      row.phase = kMintLeaseHeld;
      row.key = r.key;
      row.target = fleet_.spec.name;
      row.detail = "key=" + r.key + " target=" + fleet_.spec.name + " worker=" + r.name +
                   " holder=" + lease.holder +
                   " expires_in_ms=" + std::to_string(lease.expires_in_ms) +
                   " waiting for its cell";
      w.log.Append(std::move(row));
    }
    r.waited = true;
    w.seen_holder = lease.holder;
    return LeasePollDelayMs(poll, lease, w.lease_polls++);
  }

  // One mint child for worker r (under `grant`'s lease, heartbeaten meanwhile, or with none),
  // then the publish of its cell; the worker then boots again to adopt from the hub.
  std::optional<int64_t> Mint(WorkerResult& r, SimWorker& w, const LeaseAnswer* grant,
                              bool takeover) {
    const std::string& family = fleet_.spec.export_spec->family;
    size_t index = 0;
    bool kill = false;
    {
      std::lock_guard<std::mutex> lock(cold_.mu);
      if (static_cast<int>(cold_.mints.size()) >= o_.max_mints) {
        r.phase = kFleetSimMintCapReached;
        r.detail = "--max-mints " + std::to_string(o_.max_mints) + " mint children already ran";
        return std::nullopt;
      }
      MintRecord rec;
      rec.worker = r.name;
      rec.holder = w.leases ? w.leases->holder() : "";
      rec.leased = grant != nullptr;
      rec.takeover = takeover && grant != nullptr;
      rec.start_ms = SinceStartMs();
      index = cold_.mints.size();
      cold_.mints.push_back(rec);
      if (grant != nullptr && o_.kill_holder_after_s > 0 && !cold_.kill_claimed) {
        cold_.kill_claimed = kill = true;
      }
    }
    ++r.mints;
    {
      EventRow row;
      row.kind = event_kind::kSelfMintStarted;
      row.phase = "child";
      row.key = r.key;
      row.target = fleet_.spec.name;
      row.detail =
          "key=" + r.key + " worker=" + r.name + (grant != nullptr ? " lease=held" : " lease=none");
      w.log.Append(std::move(row));
    }
    std::shared_ptr<MintLeaseHold> hold =
        grant != nullptr ? w.leases->Hold(r.key, family, *grant) : nullptr;
    MintParentOptions mo;
    mo.binary = o_.kiln_binary;
    MintParent parent(mo);
    // The killer: SIGKILLs the child's process group after the delay unless the mint ended first.
    std::mutex kill_mu;
    std::condition_variable kill_cv;
    bool mint_done = false, killed = false;
    std::thread killer;
    if (kill) {
      killer = std::thread([&] {
        std::unique_lock<std::mutex> lock(kill_mu);
        const auto at =
            SteadyClock::now() + std::chrono::duration_cast<SteadyClock::duration>(
                                     std::chrono::duration<double>(o_.kill_holder_after_s));
        if (kill_cv.wait_until(lock, at, [&] { return mint_done; })) return;
        killed = true;
        lock.unlock();
        parent.KillAll();
      });
    }
    MintChildRequest req;
    req.manifest = fleet_.manifest_abs;
    req.target = fleet_.spec.name;
    const std::string dir = fleet_.work_dir + "/mints/" + r.name + "-" + std::to_string(r.mints);
    MintChildOutcome out = parent.Run(dir, req);
    if (killer.joinable()) {
      {
        std::lock_guard<std::mutex> lock(kill_mu);
        mint_done = true;
      }
      kill_cv.notify_all();
      killer.join();
    }
    const double end_ms = SinceStartMs();
    if (killed) {
      // The holder died with its child: no release, no heartbeat. Its machine reboots as a new
      // holder and boots like any other.
      hold->Abandon();
      hold.reset();
      {
        std::lock_guard<std::mutex> lock(cold_.mu);
        cold_.mints[index].killed = true;
        cold_.mints[index].phase = out.phase;
        cold_.mints[index].end_ms = end_ms;
        cold_.killed_at_ms = end_ms;
      }
      ++r.deaths;
      ++w.life;
      w.leases.reset();
      w.seen_holder.clear();
      w.lease_polls = 0;
      RemoveDir(dir);
      return 0;
    }
    std::string publish;
    double publish_end = 0;
    if (out.phase.empty()) {
      auto tar = ReadFile(out.report.artifact);
      if (!tar.ok()) {
        publish = "artifact_unreadable";
      } else {
        PublishOptions po;
        po.target = fleet_.spec.name;
        po.family = family;
        const PublishAnswer a = w.client->Publish(*tar, po);
        publish = a.ok() ? (a.already ? "already" : "published") : a.token;
        publish_end = SinceStartMs();
      }
    }
    hold.reset();  // released after the publish (or at once, the mint having failed)
    RemoveDir(dir);
    {
      std::lock_guard<std::mutex> lock(cold_.mu);
      MintRecord& rec = cold_.mints[index];
      rec.phase = out.phase;
      rec.end_ms = end_ms;
      rec.publish = publish;
      rec.publish_end_ms = publish_end;
    }
    if (!out.phase.empty()) {
      r.phase = kFleetSimMintFailed;
      r.cause = out.phase;
      r.detail = out.detail;
      return std::nullopt;
    }
    if (publish != "published" && publish != "already" && publish != kHubKeyTaken) {
      r.phase = kFleetSimPublishFailed;
      r.cause = publish;
      return std::nullopt;
    }
    return 0;  // adopt the published cell from the hub, as every other worker does
  }

  static void RemoveDir(const std::string& dir) {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }

  // Worker i's outcome is final: its state (clients, connections) goes. Under the lock.
  void Finish(int i) {
    if (!results_[i].started) results_[i].phase = kFleetSimNotStarted;
    workers_[i].reset();
    --pending_;
  }

  Fleet& fleet_;
  const FleetSimOptions& o_;
  const SteadyClock::time_point start_;
  ColdKey& cold_;
  const SteadyClock::time_point deadline_;
  const int retry_max_ms_;
  std::vector<WorkerResult>& results_;
  std::vector<std::unique_ptr<SimWorker>> workers_;
  std::vector<SteadyClock::time_point> arrival_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::priority_queue<Due, std::vector<Due>, std::greater<Due>> queue_;
  int pending_ = 0;
};

// The cold-key section of the report: what the fleet's mints did and how the waiters fared.
nlohmann::json ColdReport(const FleetSimOptions& o, const std::vector<WorkerResult>& results,
                          const ColdKey& cold) {
  nlohmann::json mints = nlohmann::json::array();
  int leased = 0, takeovers = 0, killed = 0, published = 0;
  double first_publish = -1, takeover_start = -1;
  for (const MintRecord& m : cold.mints) {
    leased += m.leased;
    takeovers += m.takeover;
    killed += m.killed;
    if (m.publish == "published" || m.publish == "already") {
      ++published;
      if (first_publish < 0 || m.publish_end_ms < first_publish) first_publish = m.publish_end_ms;
    }
    if (cold.killed_at_ms >= 0 && m.leased && !m.killed && m.start_ms >= cold.killed_at_ms &&
        (takeover_start < 0 || m.start_ms < takeover_start)) {
      takeover_start = m.start_ms;
    }
    auto r2 = [](double v) { return std::round(v * 10) / 10; };
    mints.push_back({{"worker", m.worker},
                     {"holder", m.holder},
                     {"leased", m.leased},
                     {"takeover", m.takeover},
                     {"killed", m.killed},
                     {"start_ms", r2(m.start_ms)},
                     {"end_ms", r2(m.end_ms)},
                     {"phase", m.phase.empty() ? "minted" : m.phase},
                     {"publish", m.publish},
                     {"publish_end_ms", r2(m.publish_end_ms)}});
  }
  std::vector<double> waiter_adopt;
  int waiters = 0;
  for (const WorkerResult& r : results) {
    if (!r.waited || r.mints > 0) continue;
    ++waiters;
    if (r.phase == kBootHit) waiter_adopt.push_back(r.outcome_ms);
  }
  nlohmann::json c = {
      {"mints_started", static_cast<int>(cold.mints.size())},
      {"leased_mints", leased},
      {"unleased_mints", static_cast<int>(cold.mints.size()) - leased},
      {"takeovers", takeovers},
      {"killed", killed},
      {"publishes", published},
      {"first_publish_ms",
       first_publish < 0 ? nlohmann::json(nullptr) : nlohmann::json(std::round(first_publish))},
      {"waiters", waiters},
      {"waiter_adopt_ms", Percentiles(waiter_adopt)},
      {"max_mints", o.max_mints},
      {"mints", mints}};
  if (o.kill_holder_after_s > 0) {
    c["kill"] = {
        {"after_s", o.kill_holder_after_s},
        {"killed_at_ms", cold.killed_at_ms < 0 ? nlohmann::json(nullptr)
                                               : nlohmann::json(std::round(cold.killed_at_ms))},
        {"takeover_started_at_ms",
         takeover_start < 0 ? nlohmann::json(nullptr) : nlohmann::json(std::round(takeover_start))},
        {"takeover_after_kill_ms",
         takeover_start < 0 || cold.killed_at_ms < 0
             ? nlohmann::json(nullptr)
             : nlohmann::json(std::round(takeover_start - cold.killed_at_ms))}};
  }
  return c;
}

nlohmann::json BuildReport(const FleetSimOptions& o, const Fleet& fleet,
                           const std::vector<WorkerResult>& results, int concurrency,
                           double wall_s) {
  nlohmann::json report;
  std::map<std::string, int> phases, refusals, causes, event_failures;
  std::vector<double> boot, adopted_boot, queue, event, outcome, arrival;
  std::map<std::string, int> retried_phases, attempts_hist;
  int events_failed = 0;
  std::map<std::string, std::vector<double>> stages;
  int adopted = 0, not_started = 0, posted = 0;
  std::string ref;
  nlohmann::json workers = nlohmann::json::array();
  for (const WorkerResult& r : results) {
    ++phases[r.phase];
    const bool ok = r.phase == kBootHit || r.phase == kBootLocalHit;
    if (ok) {
      ++adopted;
      adopted_boot.push_back(r.boot_ms);
      if (ref.empty()) ref = r.ref;
    } else {
      ++refusals[r.phase];
      if (!r.cause.empty()) ++causes[r.phase + ":" + r.cause];
    }
    if (!r.started) {
      ++not_started;
    } else {
      boot.push_back(r.boot_ms);
      queue.push_back(r.queue_ms);
      event.push_back(r.event_ms);
      outcome.push_back(r.outcome_ms);
      arrival.push_back(r.queue_ms + r.outcome_ms);
      posted += r.events_posted;
      events_failed += r.events_unposted;
      if (r.events_unposted > 0) event_failures[r.event_token] += r.events_unposted;
      ++attempts_hist[std::to_string(r.attempts)];
      for (const std::string& p : r.retried) ++retried_phases[p];
      for (const auto& [stage, ms] : r.stages) stages[stage].push_back(ms);
    }
    workers.push_back({{"name", r.name},
                       {"phase", r.phase},
                       {"cause", r.cause},
                       {"boot_ms", std::round(r.boot_ms * 100) / 100},
                       {"queue_ms", std::round(r.queue_ms * 100) / 100},
                       {"outcome_ms", std::round(r.outcome_ms * 100) / 100},
                       {"attempts", r.attempts},
                       {"polls", r.polls},
                       {"waited", r.waited},
                       {"mints", r.mints},
                       {"deaths", r.deaths},
                       {"events_posted", r.events_posted}});
  }
  report["target"] = fleet.spec.name;
  report["family"] = fleet.spec.export_spec->family;
  report["ref"] = ref;
  report["hub"] = fleet.hub.url;
  report["workers"] = o.workers;
  report["concurrency"] = {
      {"pool_threads", concurrency},
      {"bound", "at most " + std::to_string(concurrency) +
                    " boots in flight; an arrived worker waits for a pool thread (queue_ms)"}};
  report["arrival"] = o.arrival == Arrival::kAll ? "all" : "ramp";
  report["ramp_s"] = o.arrival == Arrival::kAll ? 0.0 : o.ramp_s;
  report["timeout_s"] = o.timeout_s;
  report["adopted"] = adopted;
  report["failed"] = o.workers - adopted;
  report["not_started"] = not_started;
  report["phases"] = phases;
  report["refusals"] = refusals;
  report["refusal_causes"] = causes;
  report["boot_ms"] = Percentiles(boot);
  report["outcome_ms"] = Percentiles(outcome);
  report["attempts"] = attempts_hist;
  report["retried"] = retried_phases;
  report["max_attempts"] = o.max_attempts;
  report["adopted_boot_ms"] = Percentiles(adopted_boot);
  report["queue_ms"] = Percentiles(queue);
  // What a machine that arrived with the others sees: its wait for a turn plus its outcome. On a
  // machine that hosts the whole fleet this, not boot_ms, is the boot latency of a burst.
  report["arrival_ms"] = Percentiles(arrival);
  nlohmann::json st = nlohmann::json::object();
  for (auto& [stage, v] : stages) st[stage] = Percentiles(v);
  report["stages_ms"] = st;
  report["events"] = {{"posted", posted},
                      {"failed", events_failed},
                      {"failures", event_failures},
                      {"post_ms", Percentiles(event)}};
  report["wall_s"] = std::round(wall_s * 1000) / 1000;
  report["boots_per_s"] =
      wall_s > 0 ? std::round(static_cast<double>(boot.size()) / wall_s * 10) / 10 : 0.0;
  report["per_worker"] = std::move(workers);
  return report;
}

}  // namespace

Result<nlohmann::json> RunFleetSim(const FleetSimOptions& o) {
  KILN_RETURN_IF_ERROR(CheckOptions(o));
  KILN_ASSIGN_OR_RETURN(Fleet fleet, LoadFleet(o));
  // This machine's facts, learned once before the first boot as a worker does (worker_main.cc).
  LocalToolchain().status().IgnoreError();
  DetectSmLevel();

  bool own_work_dir = false;
  fleet.work_dir = o.work_dir;
  if (fleet.work_dir.empty()) {
    std::string tmpl = "/tmp/kiln-fleet-sim-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) {
      return Status::IOError("fleet-sim: cannot make a work directory under /tmp");
    }
    fleet.work_dir = tmpl;
    own_work_dir = true;
  } else {
    KILN_RETURN_IF_ERROR(MakeDirs(fleet.work_dir));
  }

  std::map<int, double> cpu_before;
  for (int pid : o.hub_pids) {
    KILN_ASSIGN_OR_RETURN(cpu_before[pid], ProcessCpuSeconds(pid));
  }
  std::unique_ptr<DbSampler> db;
  if (!o.db_url.empty()) {
    KILN_ASSIGN_OR_RETURN(db, DbSampler::Create(o.db_url, o.db_poll_ms));
  }

  const double own_cpu_before = OwnCpuSeconds();
  const auto start = SteadyClock::now();
  const auto deadline = start + std::chrono::duration_cast<SteadyClock::duration>(
                                    std::chrono::duration<double>(o.timeout_s));
  if (db) db->Start(deadline);
  std::vector<WorkerResult> results(o.workers);
  ColdKey cold;
  const int concurrency =
      Pool(fleet, o, start, deadline, fleet.retry_max_ms, &results, &cold).Run();
  const double wall_s = MsBetween(start, SteadyClock::now()) / 1000;
  if (db) db->Stop();

  nlohmann::json report = BuildReport(o, fleet, results, concurrency, wall_s);
  report["sim_cpu_s"] = std::round((OwnCpuSeconds() - own_cpu_before) * 100) / 100;
  if (o.cold_key) report["cold_key"] = ColdReport(o, results, cold);
  if (!o.hub_pids.empty()) {
    nlohmann::json per = nlohmann::json::object();
    double total = 0;
    for (const auto& [pid, before] : cpu_before) {
      auto after = ProcessCpuSeconds(pid);
      if (!after.ok()) {
        per[std::to_string(pid)] = "exited during the run";
        continue;
      }
      per[std::to_string(pid)] = std::round((*after - before) * 100) / 100;
      total += *after - before;
    }
    report["hub_cpu_s"] = {{"total", std::round(total * 100) / 100}, {"per_pid", per}};
  }
  if (db) report["db"] = db->Report();
  if (own_work_dir) {
    std::error_code ec;
    std::filesystem::remove_all(fleet.work_dir, ec);
  }
  return report;
}

std::string FleetSimSummary(const nlohmann::json& r) {
  auto pct = [](const nlohmann::json& p) {
    if (p.value("n", 0) == 0) return std::string("-");
    char buf[160];
    std::snprintf(buf, sizeof buf, "p50 %.1f  p90 %.1f  p99 %.1f  max %.1f ms (n=%d)",
                  p["p50"].get<double>(), p["p90"].get<double>(), p["p99"].get<double>(),
                  p["max"].get<double>(), p["n"].get<int>());
    return std::string(buf);
  };
  std::ostringstream s;
  s << "kiln fleet-sim: " << r["workers"].get<int>() << " workers, arrival "
    << r["arrival"].get<std::string>();
  if (r["arrival"] == "ramp") s << " over " << r["ramp_s"].get<double>() << " s";
  s << ", " << r["concurrency"]["pool_threads"].get<int>() << " boots in flight at most, hub "
    << r["hub"].get<std::string>() << "\n";
  s << "  target " << r["target"].get<std::string>() << " (family "
    << r["family"].get<std::string>() << ")"
    << (r["ref"].get<std::string>().empty() ? "" : ", cell " + r["ref"].get<std::string>()) << "\n";
  s << "  adopted " << r["adopted"].get<int>() << ", failed " << r["failed"].get<int>()
    << " (not started " << r["not_started"].get<int>() << ") in " << r["wall_s"].get<double>()
    << " s, " << r["boots_per_s"].get<double>() << " boots/s\n";
  for (const auto& [token, n] : r["refusals"].items()) {
    s << "    refused " << token << ": " << n.get<int>() << "\n";
  }
  for (const auto& [cause, n] : r["refusal_causes"].items()) {
    s << "      of which " << cause << ": " << n.get<int>() << "\n";
  }
  s << "  boot      " << pct(r["boot_ms"]) << "\n";
  s << "  queue     " << pct(r["queue_ms"]) << "\n";
  s << "  outcome   " << pct(r["outcome_ms"])
    << " (first attempt's start to the last boot's end)\n";
  s << "  arrival   " << pct(r["arrival_ms"]) << " (arrival to the outcome: queue + outcome)\n";
  for (const auto& [phase, n] : r["retried"].items()) {
    s << "    retried after " << phase << ": " << n.get<int>() << "\n";
  }
  for (const auto& [stage, p] : r["stages_ms"].items()) {
    char name[32];
    std::snprintf(name, sizeof name, "    %-12s", stage.c_str());
    s << name << pct(p) << "\n";
  }
  s << "  events    posted " << r["events"]["posted"].get<int>() << ", failed "
    << r["events"]["failed"].get<int>() << "; post " << pct(r["events"]["post_ms"]) << "\n";
  if (r.contains("cold_key")) {
    const auto& c = r["cold_key"];
    s << "  cold key  " << c["mints_started"].get<int>() << " mint children ("
      << c["leased_mints"].get<int>() << " under a lease, " << c["takeovers"].get<int>()
      << " takeovers, " << c["killed"].get<int>() << " killed), " << c["publishes"].get<int>()
      << " published; first publish at "
      << (c["first_publish_ms"].is_null()
              ? std::string("-")
              : std::to_string(c["first_publish_ms"].get<int64_t>()) + " ms")
      << "\n";
    s << "  waiters   " << c["waiters"].get<int>() << ", boot to adopt "
      << pct(c["waiter_adopt_ms"]) << "\n";
    if (c.contains("kill") && !c["kill"]["takeover_after_kill_ms"].is_null()) {
      s << "  takeover  mint started " << c["kill"]["takeover_after_kill_ms"].get<int64_t>()
        << " ms after the holder was killed\n";
    }
  }
  s << "  simulator CPU " << r["sim_cpu_s"].get<double>() << " s\n";
  if (r.contains("hub_cpu_s")) {
    s << "  hub CPU   " << r["hub_cpu_s"]["total"].get<double>() << " s ("
      << r["hub_cpu_s"]["per_pid"].dump() << ")\n";
  }
  if (r.contains("db")) {
    s << "  database  peak " << r["db"]["peak_connections"].get<int64_t>() << " connections ("
      << r["db"]["peak_active"].get<int64_t>() << " active), " << r["db"]["samples"].get<int64_t>()
      << " samples\n";
  }
  return s.str();
}

}  // namespace kiln::cli
