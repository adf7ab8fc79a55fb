// `kiln fleet-sim`: many simulated workers boot-adopting from one hub at once, and what it cost
// the hub (cli layer). The flags become FleetSimOptions; cli/fleet_sim.h runs the fleet.
// Exit code: 0 when every worker adopted, 1 when any did not (the report says which and why) or
// the run could not start, 2 for usage.
#include <cstdio>
#include <memory>
#include <string>

#include "src/kiln/base/file.h"
#include "src/kiln/cli/commands.h"
#include "src/kiln/cli/fleet_sim.h"

namespace kiln::cli {

namespace {

struct FleetSimArgs {
  FleetSimOptions options;
  std::string arrival = "all";
  std::string json;
};

int RunFleetSimCommand(FleetSimArgs& a) {
  if (a.arrival == "ramp") {
    a.options.arrival = Arrival::kRamp;
  } else if (a.arrival != "all") {
    return ReportError("fleet-sim",
                       Status::InvalidArgument("fleet-sim: --arrival is '" + a.arrival +
                                               "'; expected 'all' or 'ramp'"));
  }
  auto report = RunFleetSim(a.options);
  if (!report.ok()) return ReportError("fleet-sim", report.status());
  std::fputs(FleetSimSummary(*report).c_str(), stdout);
  if (!a.json.empty()) {
    Status written = WriteFileAtomic(a.json, report->dump(2) + "\n");
    if (!written.ok()) return ReportError("fleet-sim", written);
  }
  return (*report)["adopted"].get<int>() == a.options.workers ? 0 : 1;
}

}  // namespace

void AddFleetSimCommand(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand(
      "fleet-sim",
      "Simulate a fleet of workers boot-adopting a cell from a hub (everything but the dlopen) "
      "and report latency, refusals and the hub's cost");
  auto a = std::make_shared<FleetSimArgs>();
  FleetSimOptions& o = a->options;
  cmd->add_option("--manifest", o.manifest, "the workers' manifest (kiln.toml)")->required();
  cmd->add_option("--target", o.target,
                  "exported target to adopt (default: the manifest's only exported target)");
  cmd->add_option("--hub", o.hub_url, "hub URL (default: the manifest's [hub] url)");
  cmd->add_option("--token", o.token,
                  "worker token (default: $KILN_HUB_TOKEN, else the manifest's [hub] token)");
  cmd->add_option("--ca", o.ca, "PEM file of the CA that signs the hub's certificate");
  cmd->add_option("--trust", o.trust,
                  "receipt-verifying keys (JWKS file; repeatable; default: the manifest's "
                  "hub.trust, else the hub's own key set)");
  cmd->add_flag("--allow-non-loopback", o.allow_non_loopback,
                "allow a hub that is not on loopback (plain http to it included)");
  cmd->add_option("--workers", o.workers, "simulated workers (1..100000)");
  cmd->add_option("--concurrency", o.concurrency, "boots in flight at once (1..4096)");
  cmd->add_option("--arrival", a->arrival, "all (every worker at once) | ramp");
  cmd->add_option("--ramp", o.ramp_s, "with --arrival ramp: arrivals spread over this many s");
  cmd->add_option("--timeout", o.timeout_s,
                  "the whole run, in s: no boot starts after it (default 300)");
  cmd->add_option("--hub-timeout", o.hub_timeout_s, "per hub request, in s (default 30)");
  cmd->add_option("--max-attempts", o.max_attempts,
                  "attempts per worker when the hub could not be asked (1..100; default 5)");
  cmd->add_option("--prefix", o.prefix, "worker names: <prefix>-00001, ... (default sim)");
  cmd->add_option("--work-dir", o.work_dir,
                  "directory for the workers' blob caches (default: a fresh one, removed)");
  cmd->add_option("--hub-pid", o.hub_pids,
                  "a hub process whose CPU time the run is charged (repeatable)");
  cmd->add_option("--db", o.db_url,
                  "the hub's PostgreSQL URL: peak connections from pg_stat_activity");
  cmd->add_option("--db-poll-ms", o.db_poll_ms, "how often the database is sampled (>= 5)");
  cmd->add_flag("--cold-key", o.cold_key,
                "the hub has no cell for the key: a miss takes the worker's mint-lease path (one "
                "mint child under the lease, the others wait and adopt)");
  cmd->add_option("--max-mints", o.max_mints,
                  "with --cold-key: mint children the run may start (1..1000; default 4)");
  cmd->add_option("--kill-holder-after", o.kill_holder_after_s,
                  "with --cold-key: SIGKILL the first leased mint child this many s after it "
                  "started; its holder dies unreleased and reboots");
  cmd->add_option("--kiln-binary", o.kiln_binary,
                  "the mint child's kiln binary (default: this one)");
  cmd->add_option("--json", a->json, "write the report as JSON here");
  cmd->callback([=] { *exit_code = RunFleetSimCommand(*a); });
}

}  // namespace kiln::cli
