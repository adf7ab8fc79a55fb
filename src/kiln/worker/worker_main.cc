// The worker's composition root (see worker_main.h).
#include "src/kiln/worker/worker_main.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "src/kiln/arm/loader.h"
#include "src/kiln/base/clock.h"
#include "src/kiln/base/file.h"
#include "src/kiln/base/log.h"
#include "src/kiln/base/signals.h"
#include "src/kiln/cell/store.h"
#include "src/kiln/graph/checkpoint.h"
#include "src/kiln/graph/onnx_import.h"
#include "src/kiln/identity/toolchain.h"
#include "src/kiln/manifest/manifest.h"
#include "src/kiln/tensor/memory_budget.h"
#include "src/kiln/worker/adoption.h"
#include "src/kiln/worker/boot.h"
#include "src/kiln/worker/broker.h"
#include "src/kiln/worker/crash_guard.h"
#include "src/kiln/worker/event_forwarder.h"
#include "src/kiln/worker/front.h"
#include "src/kiln/worker/hub_orders.h"
#include "src/kiln/worker/mint_lease.h"
#include "src/kiln/worker/minter.h"
#include "src/kiln/worker/order_book.h"
#include "src/kiln/worker/publisher.h"
#include "src/kiln/worker/revocations.h"
#include "src/kiln/worker/store_keeper.h"
#include "src/kiln/worker/test_switches.h"

namespace kiln {
namespace {

// The operator token of the admin listener: --admin-token-file, else $KILN_ADMIN_TOKEN.
Result<std::string> AdminToken(const WorkerConfig& a) {
  std::string token;
  if (!a.admin_token_file.empty()) {
    KILN_ASSIGN_OR_RETURN(token, ReadFile(a.admin_token_file));
    while (!token.empty() &&
           (token.back() == '\n' || token.back() == '\r' || token.back() == ' ')) {
      token.pop_back();
    }
    if (token.empty()) {
      return Status::InvalidArgument("admin token file '" + a.admin_token_file + "' is empty");
    }
  } else if (const char* env = std::getenv("KILN_ADMIN_TOKEN")) {
    token = env;
  }
  return token;
}

// One hub client configuration for the three clients a worker holds (events, resolve, publish).
// One name per worker process ("<endpoint>@<host>/<pid>"): the hub counts adoptions by distinct
// worker, and a mint lease's holder is one process.
std::string ProcessWorkerName(const Manifest& m) {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  return m.endpoint.name + "@" + host + "/" + std::to_string(::getpid());
}

HubClientOptions HubOptionsFrom(const HubSpec& h) {
  HubClientOptions o;
  o.url = h.url;
  o.token = h.token;
  o.ca_file = h.ca;
  o.insecure_http = h.insecure_http;
  o.io_timeout_s = h.timeout_ms / 1000.0;
  o.connect_timeout_s = std::min(o.io_timeout_s, 3.0);
  return o;
}

struct Booted {
  std::shared_ptr<const Graph> graph;
  std::unique_ptr<ServedTarget> target;
};

// The operator's trust anchors (manifest `hub.trust`): null when none are configured (the hub's
// own key set is trusted then).
Result<std::unique_ptr<PublicKeySet>> LoadTrustAnchors(const HubSpec& hub) {
  if (hub.trust.empty()) return std::unique_ptr<PublicKeySet>();
  auto trust = std::make_unique<PublicKeySet>();
  for (const std::string& path : hub.trust) {
    KILN_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
    KILN_ASSIGN_OR_RETURN(PublicKeySet keys, PublicKeySet::FromText(text, path));
    KILN_RETURN_IF_ERROR(trust->AddAll(keys));
  }
  return trust;
}

// Event rows go to the hub too, posted in the background by a client of their own.
Result<std::unique_ptr<EventForwarder>> StartForwarder(const Manifest& m, EventLog& events) {
  KILN_ASSIGN_OR_RETURN(auto client, HubClient::Create(HubOptionsFrom(*m.hub)));
  EventForwarderOptions fwd;
  // One name per worker process: the hub counts adoptions by distinct worker.
  fwd.worker = ProcessWorkerName(m);
  auto forwarder = std::make_unique<EventForwarder>(std::move(client), fwd);
  forwarder->Attach(events);  // before boot: boot_adopt rows reach the hub too
  return forwarder;
}

RevocationWatchOptions RevocationOptionsFrom(const Manifest& m, const PublicKeySet* trust,
                                             const std::string& store_root, EventLog* events) {
  RevocationWatchOptions ro;
  ro.hub = HubOptionsFrom(*m.hub);
  if (trust != nullptr) {
    ro.anchors = *trust;
    ro.use_anchors = true;
  }
  ro.cache_path = store_root + "/.revocations.jws";
  ro.poll_s = m.hub->revocation_poll_s;
  ro.max_age_cap_s = m.hub->revocation_max_age_s;
  ro.stale = m.hub->revocations_stale == "eager" ? StaleRevocationPolicy::kEager
                                                 : StaleRevocationPolicy::kKeep;
  ro.events = events;
  ro.worker = m.endpoint.name;
  ro.release = m.endpoint.release;
  return ro;
}

MinterOptions MinterOptionsFrom(const WorkerConfig& a, const Manifest& m, const BootContext& ctx,
                                Publisher* publisher) {
  MinterOptions mo;
  mo.manifest_path =
      std::filesystem::absolute(a.mint_manifest.empty() ? a.manifest : a.mint_manifest).string();
  mo.manifest_base_dir = a.manifest_base_dir;
  mo.work_root = ctx.private_dir + "/mints";
  mo.private_dir = ctx.private_dir;
  mo.stall_window_ms = m.mint.stall_window_s * 1000;
  mo.memory_budget_mb = m.mint.memory_budget_mb;
  mo.parallel_compiles = m.mint.parallel_compiles;
  mo.child_nice = a.mint_nice;
  mo.child_threads = a.mint_threads;
  mo.serve_threads = ctx.threads;
  mo.worker = m.endpoint.name;
  mo.store = ctx.store;
  mo.keeper = ctx.keeper;
  mo.publisher = publisher;
  mo.revocations = ctx.revocations;
  mo.events = ctx.events;
  return mo;
}

// The forwarder's counters in the Prometheus text format, for /metrics.
std::string ForwarderMetrics(const EventForwarderStats& st) {
  std::string o =
      "# HELP kiln_events_forwarded_total Event rows by what became of them on the way to the "
      "hub.\n# TYPE kiln_events_forwarded_total counter\n";
  o += "kiln_events_forwarded_total{outcome=\"posted\"} " + std::to_string(st.posted) + "\n";
  o += "kiln_events_forwarded_total{outcome=\"dropped\"} " + std::to_string(st.dropped) + "\n";
  o += "kiln_events_forwarded_total{outcome=\"rejected\"} " + std::to_string(st.rejected) + "\n";
  o += "# HELP kiln_events_queued Event rows waiting for the hub.\n# TYPE kiln_events_queued "
       "gauge\nkiln_events_queued " +
       std::to_string(st.queued) + "\n";
  o += "# HELP kiln_events_post_failures_total Failed posts to the hub (retried).\n# TYPE "
       "kiln_events_post_failures_total counter\nkiln_events_post_failures_total " +
       std::to_string(st.failures) + "\n";
  return o;
}

FrontendOptions FrontendOptionsFrom(const WorkerConfig& a, const Manifest& m, EventLog* events,
                                    const std::string& admin_token, EventForwarder* forwarder) {
  FrontendOptions fo;
  fo.bind = a.bind;
  fo.port = a.port >= 0 ? a.port : m.endpoint.port;
  fo.max_concurrency = m.endpoint.max_concurrency;
  fo.events = events;
  fo.listener.tls_cert = a.tls_cert;
  fo.listener.tls_key = a.tls_key;
  fo.listener.insecure_http = a.insecure_http;
  fo.listener.max_connections_per_client = a.max_conns_per_client;
  fo.max_body_bytes = static_cast<size_t>(std::max(1, a.max_body_mb)) << 20;
  fo.drain_timeout_ms = a.drain_timeout_ms;
  fo.infer_deadline_ms = a.infer_deadline_ms;
  fo.admin.port = a.admin_port;
  fo.admin.bind = a.admin_bind;
  fo.checkpoint_dir = a.checkpoint_dir;
  fo.admin.token = admin_token;
  if (forwarder != nullptr) {
    fo.extra_metrics = [forwarder] { return ForwarderMetrics(forwarder->stats()); };
  }
  return fo;
}

// Quarantines the refs that processes of this machine died in (crash_guard.h) and reports each
// with one `cell_crashed` row (phase `quarantined`), which the forwarder takes to the hub.
void ReportCrashes(CrashGuard& guard, EventLog& events) {
  for (const CrashMarker& m : guard.Recover()) {
    EventRow row;
    row.kind = event_kind::kCellCrashed;
    row.phase = kCrashQuarantined;
    row.ref = m.ref;
    row.key = m.ref.substr(0, m.ref.find('@'));
    row.target = m.target;
    row.detail = "target=" + m.target + " ref=" + m.ref + " pid=" + std::to_string(m.pid) +
                 " died inside the cell's first call; quarantined on this machine";
    events.Append(std::move(row));
    std::printf(
        "kiln worker: target '%s': process %lld died inside the first call of %s; "
        "quarantined (%s/quarantine)\n",
        m.target.c_str(), static_cast<long long>(m.pid), m.ref.c_str(), guard.dir().c_str());
  }
}

// What the watch's news does to the targets: a lifted revocation re-adopts those it held eager,
// and a hub order (docs/fleet.md "Hub orders") sets what each target of this worker may serve
// (eager, a pinned or canary ref by this machine's worker id, or auto) and adopts it. Declared
// after the adopter: on every way out its destructor stops the watch's poll thread first, so no
// news reaches a destroyed adopter.
class WatchHooks {
 public:
  WatchHooks(RevocationWatch* watch, Adopter& adopter, std::string worker_id)
      : watch_(watch), adopter_(adopter), worker_id_(std::move(worker_id)) {
    if (watch_ == nullptr) return;
    watch_->SetOnReinstated([this](const std::string& key) { adopter_.ReadoptKey(key); });
    watch_->SetOnOrder([this](const HubOrder& order) {
      ServedTarget* target = nullptr;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (auto it = targets_.find(order.target); it != targets_.end()) target = it->second;
      }
      if (target == nullptr) return;  // not booted yet: its boot reads the order (Register)
      Obey(*target, order);
      adopter_.ApplyOrder(target);
    });
  }
  ~WatchHooks() {
    if (watch_ != nullptr) watch_->Stop();
  }
  WatchHooks(const WatchHooks&) = delete;
  WatchHooks& operator=(const WatchHooks&) = delete;

  // Before the target's adoption: the order the watch holds for it applies to this boot.
  void Register(ServedTarget& target) {
    if (watch_ == nullptr) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      targets_[target.name()] = &target;
    }
    if (auto order = watch_->OrderFor(target.name())) Obey(target, *order);
  }

 private:
  void Obey(ServedTarget& target, const HubOrder& o) const {
    std::string wanted;
    if (o.kind == "pin") wanted = o.ref;
    if (o.kind == "canary" && InCanary(worker_id_, o.release, o.target, o.share)) wanted = o.ref;
    target.SetHubOrder(
        o.kind == "eager", wanted,
        o.kind + " incarnation=" + std::to_string(o.incarnation) +
            (o.kind == "canary" ? (wanted.empty() ? " canary=out" : " canary=in") : "") +
            " worker_id=" + worker_id_ + " (" + o.reason + ")");
  }

  RevocationWatch* watch_;
  Adopter& adopter_;
  const std::string worker_id_;
  std::mutex mu_;
  std::map<std::string, ServedTarget*> targets_;
};

// What one target's boot needs beyond its declaration.
struct BootWiring {
  const Manifest& manifest;
  const BootContext& ctx;
  EventLog& events;
  RevocationWatch* revocations;  // null without a hub
  Publisher* publisher;          // null without a hub
  Minter& minter;
  Adopter& adopter;
  int64_t request_memory_bytes;  // one request's tensors (ServedTargetOptions)
  CrashGuard* crash_guard;       // ServedTargetOptions::crash_guard
  OrderBook& orders;             // the eager-only orders this machine keeps
  WatchHooks& hooks;             // the hub's orders and lifts
};

// The target's eager-only order at boot (the admin's last word, else the manifest's), applied
// before its adoption so nothing serves compiled while it holds; then every later order through
// the admin port is kept in the book, and a lift adopts (or mints) what the order held back.
void ApplyEagerOnlyOrder(ServedTarget& target, const TargetSpec& spec, const BootWiring& w) {
  const EagerOnlyOrder order = w.orders.AtBoot(spec.name, spec.eager_only);
  if (order.on) {
    target.SetEagerOnly(true, order.reason);
    std::printf("kiln worker: target '%s' serves eager: the %s's eager-only order holds (%s)\n",
                spec.name.c_str(), order.source.c_str(), order.reason.c_str());
  }
  target.SetOnEagerOnlyChanged([&orders = w.orders, &adopter = w.adopter, t = &target,
                                name = spec.name](bool on, const std::string& reason) {
    if (Status s = orders.Set(name, on, reason, Clock::Real()->UnixSeconds()); !s.ok()) {
      KILN_LOG(WARNING) << "worker: the eager-only order of target '" << name
                        << "' was applied but not kept for the next boot: " << s.ToString();
    }
    if (!on) adopter.ReadoptTarget(t);
  });
}

// One target: its graph and checkpoint loaded, its serving wrapper made and watched, a cell
// adopted if there is one (else the miss policy starts), and its one boot line printed.
Result<Booted> BootTarget(const TargetSpec& spec, const BootWiring& w) {
  if (spec.lane == LanePolicy::kMandatory && !spec.exported()) {
    return Status::Refused(StatusCode::kInvalidArgument, kRefusalMandatoryLaneNeedsACell,
                           "target '" + spec.name +
                               "' is mandatory but declares no export, so no cell can "
                               "ever serve it");
  }
  Booted b;
  KILN_ASSIGN_OR_RETURN(Graph g, ImportOnnxFile(spec.graph));
  b.graph = std::make_shared<const Graph>(std::move(g));
  WeightMap weights = GraphWeights(*b.graph);
  if (!spec.checkpoint.empty()) {
    KILN_ASSIGN_OR_RETURN(weights, LoadCheckpoint(*b.graph, spec.checkpoint));
  }
  ServedTargetOptions o;
  o.name = spec.name;
  o.lane_policy = spec.lane;
  o.envelope = spec.envelope;
  o.allow_partial = spec.allows_partial_coverage();
  o.intake = !spec.exported();
  o.compile_declared = true;  // exported: minted on a miss; intake: compiled here
  o.events = &w.events;
  o.max_remints = w.manifest.mint.remints;
  o.request_memory_bytes = w.request_memory_bytes;
  o.crash_guard = w.crash_guard;
  KILN_ASSIGN_OR_RETURN(b.target, ServedTarget::Create(o, b.graph, weights));
  if (w.revocations != nullptr) w.revocations->Watch(b.target.get());
  ApplyEagerOnlyOrder(*b.target, spec, w);
  w.hooks.Register(*b.target);
  const BootOutcome out = spec.exported() ? w.adopter.Boot(*b.target, spec, b.graph)
                                          : AdoptAtBoot(*b.target, spec, b.graph, weights, w.ctx);
  std::printf("target %-16s boot_adopt %-22s %7.1f ms  %s\n", spec.name.c_str(), out.phase.c_str(),
              out.duration_ms,
              out.adopted() ? out.ref.c_str() : ("serving " + b.target->Posture()).c_str());
  if (!spec.exported()) {
    w.minter.CompileIntake(MintBinding{b.target.get(), spec});
    // Nothing is owed for an intake target: a release's obligation is settled terminally.
    if (w.publisher != nullptr) {
      w.publisher->EnqueueSettle(spec.name, SmOrDefault(spec.sm), kBootNoExportDeclaration);
    }
  } else if (spec.lane == LanePolicy::kMandatory && !out.key.empty()) {
    // A mandatory target whose cell faults mints its key again instead of refusing forever.
    b.target->SetOnCellLost(
        [&minter = w.minter, key = out.key, t = b.target.get(), spec](const std::string&) {
          minter.MintExported(key, MintBinding{t, spec});
        });
  }
  return b;
}

// Serves until SIGTERM or SIGINT (SIGHUP re-reads the TLS certificate), then stops the front end.
// The background publisher of cells minted here (null without a hub), with every cell a stopped
// or killed process left unpublished, or the hub refused, queued again: the hub learns of every
// cell this machine made.
Result<std::unique_ptr<Publisher>> MakePublisher(const Manifest& m, LocalStore* store,
                                                 EventLog* events) {
  if (!m.hub) return std::unique_ptr<Publisher>();
  PublisherOptions po;
  po.hub = HubOptionsFrom(*m.hub);
  // A publish's complete waits for the hub's rebuild of the cell, which takes as long as a mint's
  // compile (minutes for a wide cell, more behind a queue): a request timeout sized for resolve
  // would give up on every publish and retry it. The publisher runs in the background, so it
  // waits as long as the hub's builder may take.
  po.hub.io_timeout_s = std::max(po.hub.io_timeout_s, kPublishTimeoutS);
  po.store = store;
  po.events = events;
  po.release = m.endpoint.release;
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Publisher> publisher, Publisher::Create(po));
  if (int n = publisher->ResumeUnpublished(); n > 0) {
    std::printf("kiln worker: offering %d cell(s) minted here to the hub again\n", n);
  }
  return publisher;
}

Status ServeUntilStopped(const WorkerConfig& a, const Manifest& m, Frontend& front,
                         RevocationWatch* revocations, const sigset_t& stop) {
  KILN_RETURN_IF_ERROR(front.Start());
  if (revocations != nullptr) revocations->Start();
  std::printf("kiln worker: endpoint '%s' serving on %s://%s:%d (KServe v2)\n",
              m.endpoint.name.c_str(), front.tls() ? "https" : "http", a.bind.c_str(),
              front.port());
  if (front.admin_port() >= 0) {
    std::printf("kiln worker: admin on %s://%s:%d\n", front.tls() ? "https" : "http",
                a.admin_bind.c_str(), front.admin_port());
  }
  std::fflush(stdout);
  const int sig = WaitForStopSignal(stop, [&front] {
    Status reloaded = front.ReloadTls();
    std::printf("kiln worker: SIGHUP: TLS reload: %s\n", reloaded.ToString().c_str());
    std::fflush(stdout);
  });
  std::printf("kiln worker: signal %d, draining %d in-flight request(s)\n", sig, front.in_flight());
  std::fflush(stdout);
  front.Stop();
  if (const uint64_t abandoned = front.abandoned_handlers(); abandoned > 0) {
    // Their threads still use the targets: exit without destroying anything under them.
    std::printf("kiln worker: %llu request handler(s) never returned; exiting without cleanup\n",
                static_cast<unsigned long long>(abandoned));
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(1);
  }
  return Status::OK();
}

}  // namespace

Status RunWorker(const WorkerConfig& a) {
  // A hub token makes this process the broker: the token never enters the process that loads
  // cells (broker.h).
  if (!a.serving_child) {
    KILN_ASSIGN_OR_RETURN(Manifest m, LoadManifest(a.manifest));
    if (WantsBroker(m)) return RunBroker(a, m);
  }
  // The stop signals (and SIGHUP, the TLS reload) are blocked before any thread starts, so every
  // thread inherits the mask and only the sigwait of ServeUntilStopped receives them: a SIGTERM
  // meant to drain can never land on a background thread and kill the process outright.
  const sigset_t stop = BlockStopSignals();
  // The machine facts every cell key and admission compare against (the compiler's identity
  // costs a process spawn and a file hash, the sm level a cpuid) are learned once per process.
  // Learn them while the manifest, graphs and checkpoints load, not inside the first adopt;
  // LocalToolchain() is cached under a mutex, so a boot that gets there first simply waits.
  std::jthread machine_facts([] {
    LocalToolchain().status().IgnoreError();
    DetectSmLevel();
  });
  KILN_ASSIGN_OR_RETURN(Manifest m, LoadManifest(a.manifest, a.manifest_base_dir));
  // The admin listener's token is checked before the boot, which may take minutes.
  std::string admin_token;
  if (a.admin_port >= 0) {
    KILN_ASSIGN_OR_RETURN(admin_token, AdminToken(a));
    if (admin_token.empty()) {
      return Status::InvalidArgument(
          "worker admin: --admin-port needs an operator token (--admin-token-file or "
          "$KILN_ADMIN_TOKEN); without one the admin listener stays off");
    }
  }
  EventLog events;
  if (!a.events.empty()) KILN_RETURN_IF_ERROR(events.SetPath(a.events));
  std::unique_ptr<EventForwarder> forwarder;
  if (m.hub) {
    KILN_ASSIGN_OR_RETURN(forwarder, StartForwarder(m, events));
  }

  KILN_ASSIGN_OR_RETURN(std::string root, DefaultStoreRoot());
  LocalStore store(root);
  // Before any adoption: a process of this machine that died inside a cell's first call left its
  // marker; that ref is quarantined here and the crash reported (the forwarder is attached).
  CrashGuard crash_guard(root);
  ReportCrashes(crash_guard, events);
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<OrderBook> orders, OrderBook::Open(root + "/.orders.json"));
  std::unique_ptr<HubClient> hub;
  std::unique_ptr<PublicKeySet> trust;
  PublicKeySet hub_keys;
  if (m.hub) {
    KILN_ASSIGN_OR_RETURN(hub, HubClient::Create(HubOptionsFrom(*m.hub)));
    KILN_ASSIGN_OR_RETURN(trust, LoadTrustAnchors(*m.hub));
  }
  // One request's tensors: the operator's flag, else the manifest's, else a share of the machine.
  int64_t request_memory = DefaultRequestMemoryBytes(m.endpoint.max_concurrency);
  std::string request_memory_from = "auto: half the memory / max_concurrency";
  if (a.request_memory_mb > 0) {
    request_memory = int64_t{a.request_memory_mb} << 20;
    request_memory_from = "--request-memory-mb";
  } else if (m.endpoint.request_memory_mb > 0) {
    request_memory = int64_t{m.endpoint.request_memory_mb} << 20;
    request_memory_from = "endpoint.request_memory_mb";
  }
  std::printf("kiln worker: request memory budget %lld MiB (%s)\n",
              static_cast<long long>(request_memory >> 20), request_memory_from.c_str());
  StoreKeeper keeper(&store, static_cast<uint64_t>(a.store_max_mb * 1048576.0), &events);
  BootContext ctx;
  ctx.store = &store;
  ctx.keeper = &keeper;
  ctx.hub = hub.get();
  ctx.trust = trust.get();
  ctx.hub_keys = &hub_keys;
  ctx.events = &events;
  ctx.crash_guard = &crash_guard;
  KILN_ASSIGN_OR_RETURN(ctx.private_dir, ProcessPrivateDir());
  ctx.threads = a.threads > 0 ? a.threads : (m.endpoint.threads > 0 ? m.endpoint.threads : 1);
  ctx.worker = m.endpoint.name;

  std::vector<Booted> booted;
  // Declared after `booted` (it holds pointers to the targets) and before the minter (which
  // asks it), so it is destroyed in between.
  std::unique_ptr<RevocationWatch> revocations;
  if (m.hub) {
    KILN_ASSIGN_OR_RETURN(
        revocations, RevocationWatch::Create(RevocationOptionsFrom(m, trust.get(), root, &events)));
    ctx.revocations = revocations.get();
  }
  // The fleet's mint leases: one worker mints a cold key, the others adopt its cell.
  // Declared before the publisher and the minter: the holds they keep point at it.
  std::unique_ptr<MintLeases> leases;
  if (m.hub) {
    MintLeaseOptions lo;
    lo.hub = HubOptionsFrom(*m.hub);
    lo.holder = ProcessWorkerName(m);
    lo.worker = m.endpoint.name;
    KILN_ASSIGN_OR_RETURN(leases, MintLeases::Create(lo, &events));
  }
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Publisher> publisher, MakePublisher(m, &store, &events));
  // Declared after `booted`, so it is destroyed (its threads joined) before the targets they
  // point at, whichever way this function returns.
  Minter minter(MinterOptionsFrom(a, m, ctx, publisher.get()));
  AdopterOptions ao;
  ao.leases = leases.get();
  if (m.hub) ao.retry_max_ms = m.hub->adopt_retry_max_s * 1000;
  ao.retry_initial_ms = std::min(ao.retry_initial_ms, ao.retry_max_ms);
  // After the minter: its retries call into it, so it stops first.
  Adopter adopter(ctx, &minter, ao);
  KILN_ASSIGN_OR_RETURN(std::string worker_id, MachineWorkerId(root));
  WatchHooks hooks(revocations.get(), adopter, worker_id);
  const BootWiring wiring{m,      ctx,     events,         revocations.get(), publisher.get(),
                          minter, adopter, request_memory, &crash_guard,      *orders,
                          hooks};
  std::map<std::string, FrontendTarget> front_targets;
  std::map<std::string, ServedTarget*> by_name;
  for (const TargetSpec& spec : m.targets) {
    KILN_ASSIGN_OR_RETURN(Booted b, BootTarget(spec, wiring));
    front_targets[spec.name] = FrontendTarget{b.target.get(), b.graph};
    by_name[spec.name] = b.target.get();
    booted.push_back(std::move(b));
    if (StopSignalPending(stop)) {
      // Nothing is served yet, so nothing is in flight: stop before the next target's boot.
      std::printf("kiln worker: stop signal during boot; exiting before serving\n");
      std::fflush(stdout);
      adopter.Stop();
      if (revocations) revocations->Stop();
      minter.Stop();
      return Status::OK();
    }
  }
  KILN_RETURN_IF_ERROR(ApplyTestSwitchesFromEnv(by_name));

  KILN_ASSIGN_OR_RETURN(
      auto front, Frontend::Create(FrontendOptionsFrom(a, m, &events, admin_token, forwarder.get()),
                                   std::move(front_targets), m.function_to_target));
  KILN_RETURN_IF_ERROR(ServeUntilStopped(a, m, *front, revocations.get(), stop));
  // Drained: no call is inside a cell, so no marker of this process may outlive it.
  crash_guard.DisarmAll();
  adopter.Stop();
  if (revocations) revocations->Stop();
  minter.Stop();
  if (publisher) publisher->WaitIdle(2000);
  if (forwarder) {
    const size_t left = forwarder->Stop(std::chrono::milliseconds(3000));
    if (left > 0) {
      std::printf(
          "kiln worker: %zu event row(s) not delivered to the hub (they are in the event "
          "file, if one is set)\n",
          left);
    }
  }
  return Status::OK();
}

}  // namespace kiln
