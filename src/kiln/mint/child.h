// The mint child: the body of `kiln mint --child REQUEST.json` (mint layer; the protocol it speaks
// is protocol.h, the parent that starts and watches it is parent.h). It runs in a fresh process
// started by a worker, so the compiler never runs inside the serving process (law 16): it reads
// the request, mints with one `MINT_FRAME` line per stage of MintStages() and one for the report,
// rewrites the phases file as each stage ends, writes the artifact and the report file last, and
// exits with the protocol's code.
//
// Test-only switches, honoured only here and only when set in the child's environment (the worker
// passes its own environment on; nothing in kiln sets them). Each name starts with KILN_TEST_ so
// none can be set by accident, and tests/worker/mint_e2e_test.cc documents them:
//   KILN_TEST_MINT_STALL_S=N        sleep N s when the compile stage starts: no CPU, no writes
//   KILN_TEST_MINT_BUSY_S=N         spin the CPU for N s there, writing nothing: slow but alive
//   KILN_TEST_MINT_PERTURB=gray     scale every output by 1.002 and prove with retention 0.99:
//                                   a child whose own gate is too lax, for the parent's to refuse
//   KILN_TEST_MINT_RESOURCE_ONCE=1  exit 3 (resource) on attempt 1
#pragma once

#include <string>

#include "src/kiln/base/status.h"
#include "src/kiln/mint/mint.h"
#include "src/kiln/mint/protocol.h"

namespace kiln {

// Runs the child and returns its exit code (protocol.h). `parent_alive_fd` is the parent's
// lifeline (kMintParentAliveFd; -1 = none): end of file on it kills this process group.
//
// The request names a target of the worker's manifest; the child reads that manifest itself
// (RequestForTarget, target_request.h) and checks that the target's lane is the request's
// (`intake` or exported). An error there is the request's fault: the child reports
// `bad_request` with the error's text and exits kMintExitBadRequest. The lane, threads, parallel
// compiles and work directory come from the request itself.
int RunMintChild(const std::string& request_path, int parent_alive_fd);

}  // namespace kiln
