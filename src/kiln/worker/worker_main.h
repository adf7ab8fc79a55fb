// The worker's composition root (worker layer): everything `kiln worker` wires together, from a
// manifest and the operator's options to a serving endpoint, until a stop signal.
//
// Boot, per target in manifest order: import the graph, bind its checkpoint, make the serving
// wrapper, and adopt a cell if this machine or the fleet has one (worker/boot.h: local store ->
// hub resolve -> receipt gate -> fetch -> admission -> load -> arm, one boot_adopt row each).
// A mandatory target with no export declaration fails the boot (mandatory_lane_needs_a_cell).
// Then the KServe v2 front end serves at once — eager wherever no cell armed — until SIGTERM or
// SIGINT, when it drains in-flight requests and exits 0.
// The minting half (worker/minter.h): an exported target whose key missed (`miss`, or
// `local_miss_no_hub`) is minted by a `kiln mint --child` process while it serves eager, adopted
// after the strict gate and published in the background (worker/publisher.h); an intake target
// (no export declaration) is compiled here at boot warmup and serves `jit_cell`. A refused
// adoption follows worker/adoption.h: retried in the background when the hub could not be asked,
// otherwise the same miss policy with the refusal as the posture token. With a hub, the signed
// revocation list is polled (worker/revocations.h) and a revoked cell de-armed within the poll
// interval; a mandatory target whose cell faulted asks for a re-mint.
#pragma once

#include <string>

#include "src/kiln/base/status.h"

namespace kiln {

// What the operator says beyond the manifest (the command line's flags).
struct WorkerConfig {
  std::string manifest;
  int port = -1;
  std::string bind = "127.0.0.1";
  std::string events;
  int threads = 0;
  int mint_nice = 10;
  int mint_threads = 1;
  std::string tls_cert, tls_key;
  bool insecure_http = false;
  int max_conns_per_client = 1024;
  int max_body_mb = 1024;
  int drain_timeout_ms = 30000;    // on SIGTERM, how long running requests may take to finish
  int infer_deadline_ms = 120000;  // an infer handler's deadline beyond its wait for a slot
  int admin_port = -1;
  std::string admin_bind = "127.0.0.1";
  std::string admin_token_file;
  std::string checkpoint_dir;
  // The memory one request's tensors may hold (MiB); 0 = the manifest's endpoint.request_memory_mb,
  // or when that is 0 too, DefaultRequestMemoryBytes (tensor/memory_budget.h).
  int request_memory_mb = 0;
  // The local store's size bound (MiB): past it, the least recently adopted cells are evicted,
  // never one this process armed (store_keeper.h). 0 = no bound.
  double store_max_mb = 10240;
  // Set by a worker's broker for the serving process it starts (worker/broker.h), never by an
  // operator: this process serves and never brokers; its manifest's relative paths resolve
  // against `manifest_base_dir`, and its mint children read `mint_manifest`.
  bool serving_child = false;
  std::string manifest_base_dir;
  std::string mint_manifest;
};

// With a hub token in the manifest (and not `serving_child`), runs as the broker instead: the
// serving process is a child that never holds the token (worker/broker.h), and this process ends
// as that child ends.
// Boots the manifest's targets and serves them until SIGTERM or SIGINT (SIGHUP re-reads the TLS
// certificate), then drains and returns OK. Errors: the manifest, a graph or checkpoint that does
// not load, a listener that cannot bind, a mandatory target without an export declaration
// (mandatory_lane_needs_a_cell), an admin port without an operator token.
Status RunWorker(const WorkerConfig& config);

}  // namespace kiln
