// `kiln worker --manifest kiln.toml`: boot an endpoint and serve it (cli layer).
//
// Boot, per target in manifest order: import the graph, bind its checkpoint, make the serving
// wrapper, and adopt a cell if this machine or the fleet has one (worker/boot.h: local store ->
// hub resolve -> receipt gate -> fetch -> admission -> load -> arm, one boot_adopt row each).
// A mandatory target with no export declaration fails the boot (mandatory_lane_needs_a_cell).
// Then the KServe v2 front end serves at once — eager wherever no cell armed — until SIGTERM or
// SIGINT, when it drains in-flight requests and exits 0.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>

#include "src/kiln/base/file.h"
#include "src/kiln/cli/commands.h"
#include "src/kiln/cli/target_util.h"
#include "src/kiln/graph/onnx_import.h"
#include "src/kiln/worker/boot.h"
#include "src/kiln/worker/event_forwarder.h"
#include "src/kiln/worker/front.h"
#include "src/kiln/worker/test_switches.h"

namespace kiln::cli {

namespace {

struct WorkerArgs {
  std::string manifest;
  int port = -1;
  std::string bind = "127.0.0.1";
  std::string events;
  int threads = 0;
};

struct Booted {
  std::shared_ptr<const Graph> graph;
  std::unique_ptr<ServedTarget> target;
};

Status DoWorker(const WorkerArgs& a) {
  KILN_ASSIGN_OR_RETURN(Manifest m, LoadManifest(a.manifest));
  EventLog events;
  if (!a.events.empty()) KILN_RETURN_IF_ERROR(events.SetPath(a.events));
  // Event rows go to the hub too, posted in the background by a client of their own.
  std::unique_ptr<EventForwarder> forwarder;
  if (m.hub) {
    HubClientOptions o;
    o.url = m.hub->url;
    o.token = m.hub->token;
    o.io_timeout_s = m.hub->timeout_ms / 1000.0;
    o.connect_timeout_s = std::min(o.io_timeout_s, 3.0);
    KILN_ASSIGN_OR_RETURN(auto client, HubClient::Create(o));
    EventForwarderOptions fwd;
    // One name per worker process: the hub counts adoptions by distinct worker.
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    fwd.worker = m.endpoint.name + "@" + host + "/" + std::to_string(::getpid());
    forwarder = std::make_unique<EventForwarder>(std::move(client), fwd);
    forwarder->Attach(events);  // before boot: boot_adopt rows reach the hub too
  }

  KILN_ASSIGN_OR_RETURN(std::string root, DefaultStoreRoot());
  LocalStore store(root);
  std::unique_ptr<HubClient> hub;
  std::unique_ptr<PublicKeySet> trust;
  PublicKeySet hub_keys;
  if (m.hub) {
    HubClientOptions o;
    o.url = m.hub->url;
    o.token = m.hub->token;
    o.io_timeout_s = m.hub->timeout_ms / 1000.0;
    o.connect_timeout_s = std::min(o.io_timeout_s, 3.0);
    KILN_ASSIGN_OR_RETURN(hub, HubClient::Create(o));
    if (!m.hub->trust.empty()) {
      trust = std::make_unique<PublicKeySet>();
      for (const std::string& path : m.hub->trust) {
        KILN_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
        KILN_ASSIGN_OR_RETURN(PublicKeySet keys, PublicKeySet::FromText(text, path));
        for (const auto& [kid, raw] : keys.keys()) KILN_RETURN_IF_ERROR(trust->AddRaw(raw));
      }
    }
  }
  const int threads = a.threads > 0 ? a.threads : (m.endpoint.threads > 0 ? m.endpoint.threads : 1);
  BootContext ctx;
  ctx.store = &store;
  ctx.hub = hub.get();
  ctx.trust = trust.get();
  ctx.hub_keys = &hub_keys;
  ctx.events = &events;
  ctx.private_dir = PrivateCellDir();
  ctx.threads = threads;
  ctx.worker = m.endpoint.name;

  std::vector<Booted> booted;
  std::map<std::string, FrontendTarget> front_targets;
  for (const TargetSpec& spec : m.targets) {
    if (spec.lane == LanePolicy::kMandatory && !spec.exported()) {
      return Status::InvalidArgument("mandatory_lane_needs_a_cell: target '" + spec.name +
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
    o.intake = !spec.exported();
    o.compile_declared = spec.exported();
    o.events = &events;
    KILN_ASSIGN_OR_RETURN(b.target, ServedTarget::Create(o, b.graph, weights));
    const BootOutcome out = AdoptAtBoot(*b.target, spec, b.graph, weights, ctx);
    std::printf("target %-16s boot_adopt %-22s %7.1f ms  %s\n", spec.name.c_str(),
                out.phase.c_str(), out.duration_ms,
                out.adopted() ? out.ref.c_str() : ("serving " + b.target->Posture()).c_str());
    front_targets[spec.name] = FrontendTarget{b.target.get(), b.graph};
    booted.push_back(std::move(b));
  }

  std::map<std::string, ServedTarget*> by_name;
  for (const Booted& b : booted) by_name[b.target->name()] = b.target.get();
  KILN_RETURN_IF_ERROR(ApplyTestSwitchesFromEnv(by_name));

  FrontendOptions fo;
  fo.bind = a.bind;
  fo.port = a.port >= 0 ? a.port : m.endpoint.port;
  fo.max_concurrency = m.endpoint.max_concurrency;
  fo.events = &events;
  if (forwarder) {
    fo.extra_metrics = [f = forwarder.get()] {
      const EventForwarderStats st = f->stats();
      std::string o =
          "# HELP kiln_events_forwarded_total Event rows by what became of them on the way to the "
          "hub.\n# TYPE kiln_events_forwarded_total counter\n";
      o += "kiln_events_forwarded_total{outcome=\"posted\"} " + std::to_string(st.posted) + "\n";
      o += "kiln_events_forwarded_total{outcome=\"dropped\"} " + std::to_string(st.dropped) + "\n";
      o +=
          "kiln_events_forwarded_total{outcome=\"rejected\"} " + std::to_string(st.rejected) + "\n";
      o += "# HELP kiln_events_queued Event rows waiting for the hub.\n# TYPE kiln_events_queued "
           "gauge\nkiln_events_queued " +
           std::to_string(st.queued) + "\n";
      o += "# HELP kiln_events_post_failures_total Failed posts to the hub (retried).\n# TYPE "
           "kiln_events_post_failures_total counter\nkiln_events_post_failures_total " +
           std::to_string(st.failures) + "\n";
      return o;
    };
  }
  KILN_ASSIGN_OR_RETURN(auto front,
                        Frontend::Create(fo, std::move(front_targets), m.function_to_target));
  // Block the stop signals before any thread starts, so only sigwait below receives them.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  KILN_RETURN_IF_ERROR(front->Start());
  std::printf("kiln worker: endpoint '%s' serving on http://%s:%d (KServe v2)\n",
              m.endpoint.name.c_str(), a.bind.c_str(), front->port());
  std::fflush(stdout);
  int sig = 0;
  sigwait(&stop, &sig);
  std::printf("kiln worker: signal %d, draining %d in-flight request(s)\n", sig,
              front->in_flight());
  std::fflush(stdout);
  front->Stop();
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

}  // namespace

void AddWorkerCommand(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand("worker", "Boot an endpoint from a manifest and serve KServe v2");
  auto a = std::make_shared<WorkerArgs>();
  cmd->add_option("--manifest", a->manifest, "kiln.toml")->required();
  cmd->add_option("--port", a->port, "TCP port (default: the manifest's; 0 = any free port)");
  cmd->add_option("--bind", a->bind, "address to listen on");
  cmd->add_option("--events", a->events, "append event rows to this JSON-lines file");
  cmd->add_option("--threads", a->threads, "compute threads per request");
  cmd->callback([=] {
    Status s = DoWorker(*a);
    *exit_code = s.ok() ? 0 : ReportError("worker", s);
  });
}

}  // namespace kiln::cli
