// The fleet simulator behind `kiln fleet-sim` (cli layer; docs/fleet.md "Fleet simulator"): many
// simulated workers in one process, each running a worker's real boot-adopt protocol against a
// hub, and a report of what the fleet saw and what the hub spent.
//
// A simulated worker is what a fresh machine running `kiln worker` does for one exported target
// at boot (worker/boot.h AdoptAtBoot, called here with BootContext::load off): derive the key
// from the manifest's graph, envelope and sm; resolve (key, export family) at the hub; verify the
// receipt (the hub's key set, refetched once on an unknown kid, or the operator's trust anchors);
// fetch and verify the hub's signed revocation list (a RevocationWatch of its own); fetch the blob
// by digest and check its SHA-256; admit it and regenerate its source; then post its one
// `boot_adopt` row (POST /v1/events, as `instance` = the worker's name). Only the dlopen, bind and
// install are skipped. Each worker has its own hub clients (its own connections), its own key
// set, its own revocation list and its own blob directory (deleted after its boot): no state is
// shared between workers except the parsed graph, the manifest and this machine's facts (sm
// level, toolchain), which a real worker also learns before its first adoption.
//
// Retries, as a worker's Adopter does them (worker/adoption.h): an attempt refused because the
// hub could not be asked (down, timeout, 5xx, its revocation list unreachable) is attempted again
// after a jittered backoff (steps of 1 s, 2 s, 4 s ... each drawn from [step/2, step], up to the
// manifest's hub.adopt_retry_max_s), with the same clients, key set and revocation list, at most
// `max_attempts` times; every attempt posts its own row. Any other outcome is final.
//
// Concurrency is bounded: `concurrency` pool threads run attempts from one queue ordered by when
// each is due; worker i arrives at start + i * ramp / workers (all at start without a ramp), a
// retry is due at the end of its backoff, and a waiting worker holds no thread. `boot_ms` is the
// last attempt's AdoptAtBoot span; `outcome_ms` runs from the first attempt's start to the last
// boot's end (backoff waits and earlier posts included); `queue_ms` is how long an arrived worker
// waited for a pool thread (the simulator's bound, not the hub's), so a run whose queue_ms is not
// near zero measured the pool and should be rerun with more concurrency or a longer ramp. The row's
// post is timed apart (`events.post_ms`): a real worker posts it in the background.
//
// Bounds: at most `workers` boots; nothing starts after the deadline (start + timeout_s; such
// workers count as `not_started`); every hub request has the client's timeouts, capped by the
// time left, so the run ends within the deadline plus one request's timeout.
//
// Cold-key mode (`cold_key`): the hub has no cell for the key yet, and a boot that misses takes
// the worker's lease path (worker/adoption.h, through the worker's own MintLeases client and
// LeasePollDelayMs): ask POST /v1/mint-leases; granted, run one real mint child (`kiln mint
// --child`, through mint/parent.h as a worker's minter does) heartbeating the lease, publish its
// cell through the hub's publish protocol (HubClient::Publish), release the lease, and boot again
// to adopt it from the hub; held by another, wait the worker's bounded jittered poll (a queue
// entry, no thread held) and boot again, until the cell is adopted or the lease is granted here;
// no lease could be had (refused, or the hub could not be asked), mint as a worker does without
// the lease. At most `max_mints` mint children run in a run: a worker that would start one more
// ends `mint_cap_reached`. With `kill_holder_after_s`, the first leased mint child is SIGKILLed
// that long after it started and its holder dies with it: its lease is neither heartbeaten nor
// released; the holder's machine reboots at once as a new holder and boots like the others.
//
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "src/kiln/base/status.h"

namespace kiln::cli {

// Refusal: the hub URL is not on loopback and the operator did not allow it (the simulator
// floods its hub; pointing it at a shared one is a decision said out loud).
inline constexpr const char* kRefusalFleetSimNotLoopback = "hub_not_loopback";
// A worker the deadline reached before it started (counted under this token).
inline constexpr const char* kFleetSimNotStarted = "not_started";
// Cold-key mode: a worker that would have started a mint past --max-mints; a mint child that did
// not mint (the cause is the mint parent's token); a minted cell whose publish was refused (the
// cause is the hub's token).
inline constexpr const char* kFleetSimMintCapReached = "mint_cap_reached";
inline constexpr const char* kFleetSimMintFailed = "mint_failed";
inline constexpr const char* kFleetSimPublishFailed = "publish_failed";

enum class Arrival { kAll, kRamp };

struct FleetSimOptions {
  std::string manifest;  // the workers' manifest (kiln.toml)
  std::string target;    // the exported target to adopt; "" = the manifest's only exported one
  std::string hub_url;   // "" = the manifest's [hub] url
  std::string token;     // "" = $KILN_HUB_TOKEN, else the manifest's [hub] token
  std::string ca;        // PEM CA file for an https hub ("" = the manifest's, else the system's)
  std::vector<std::string> trust;  // receipt keys (JWKS files); empty = the manifest's hub.trust
  bool allow_non_loopback = false;
  int workers = 100;     // 1..100000
  int concurrency = 64;  // boots in flight at once, 1..4096
  Arrival arrival = Arrival::kAll;
  double ramp_s = 0;          // kRamp: arrivals spread evenly over this many seconds (> 0)
  double timeout_s = 300;     // the whole run (> 0)
  double hub_timeout_s = 30;  // per hub request (read/write); connect: min(this, 3 s)
  // Attempts per worker: a refusal a worker retries (the hub could not be asked: adoption.h) is
  // attempted again after the worker's jittered backoff, at most this many times in all (1..100).
  int max_attempts = 5;
  std::string prefix = "sim";  // worker names: <prefix>-00001 ...
  std::string work_dir;        // per-worker blob directories; "" = a fresh one under /tmp
  std::vector<int> hub_pids;   // hub processes whose CPU time the run is charged
  std::string db_url;          // PostgreSQL of the hub: peak connections sampled
  int db_poll_ms = 50;         // how often (>= 5)
  // Cold-key mode (above). The token must be allowed to publish into the export family for the
  // hub to grant leases (a worker whose token is refused mints without a lease).
  bool cold_key = false;
  int max_mints = 4;               // mint children started in the run, 1..1000
  double kill_holder_after_s = 0;  // > 0: SIGKILL the first leased mint child this long after start
  std::string kiln_binary;         // the mint child's binary; "" = this process's own
};

// Runs the simulation and returns its report (the JSON of docs/fleet.md). Refused: bad options
// (InvalidArgument naming the option and value), a manifest without the target, a non-loopback
// hub (hub_not_loopback), an unreadable hub pid or database. A boot's refusal is never an error
// here: it is counted in the report.
Result<nlohmann::json> RunFleetSim(const FleetSimOptions& options);

// The human summary of a report.
std::string FleetSimSummary(const nlohmann::json& report);

}  // namespace kiln::cli
