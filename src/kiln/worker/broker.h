// The worker's broker process: the hub token stays outside the process that loads cells
// (worker layer; docs/trust.md "What a cell can reach", docs/fleet.md "The hub token stays in the
// broker").
//
// A cell is code in the serving process: it can read that process's memory and environment. So a
// `kiln worker` whose manifest gives the hub a token runs as two processes:
//
//   the broker (the process the operator started): reads the token (hub.token, or the variable
//     hub.token_env names), makes itself non-dumpable (a process of the same user cannot read its
//     memory through /proc), runs the hub relay on loopback (client/hub_broker.h: the worker's
//     routes only, with the token added), and starts the serving process;
//   the serving process (`kiln worker … --serving-child`, a fresh exec of the same binary, so none
//     of the broker's memory comes along): its manifest is a copy whose hub is the relay and whose
//     token is the relay's capability; its environment is the broker's without any variable that
//     holds the token. Its mint children get a copy with no token at all.
//
// The broker supervises: SIGTERM, SIGINT and SIGHUP are passed on to the serving process; when it
// ends, the broker ends the same way (its exit code, or the same signal raised again), so an
// operator, a supervisor or a test sees the exit it would have seen from one process. A serving
// process dies with its broker (PR_SET_PDEATHSIG). The copies live in a 0700 directory under the
// local store (`.broker-*`), removed when the broker ends.
//
// A worker without a hub token (no [hub], or a hub without a token) stays one process.
#pragma once

#include "src/kiln/base/status.h"
#include "src/kiln/manifest/manifest.h"
#include "src/kiln/worker/worker_main.h"

namespace kiln {

// Whether `manifest` makes `kiln worker` a broker and a serving process: a hub with a token.
bool WantsBroker(const Manifest& manifest);

// Runs the broker for `config` (whose manifest is `manifest`, loaded from config.manifest) until
// the serving process ends, then ends this process the way it ended: returns only an error from
// before the serving process started (the relay cannot listen, a copy cannot be written, the
// process cannot start).
Status RunBroker(const WorkerConfig& config, const Manifest& manifest);

}  // namespace kiln
