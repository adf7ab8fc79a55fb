// Test-only fault injection for real-process tests of the serving wrapper (worker layer).
//
// `KILN_TEST_CELL_FAULT` makes a running `kiln worker` treat chosen admitted requests as if the
// cell had failed, without touching the cell: "<target>:<fault>@<n>[,...]" where fault is
// `fault` (a cell fault: law 7, the cell is revoked) or `oom` (an allocation failure: the cell
// stays armed) and n counts the target's admitted requests from 1. Example:
// KILN_TEST_CELL_FAULT="mlp:oom@1,mlp:fault@3". The name says what it is; production manifests
// and flags have no way to set it, and a worker that honours it says so in its log at boot.
//
// `KILN_TEST_SECRET_SCAN=<file>` (base/secret_scan.h) makes the first call into any target's cell
// scan the serving process's memory and environment for the secret the file holds (complemented)
// and write `<file>.serving.<pid>.json`, right where the cell's code is about to run: what the
// scan can read, the cell can. The two switches are not combined.
#pragma once

#include <map>
#include <string>

#include "src/kiln/base/status.h"
#include "src/kiln/worker/serving.h"

namespace kiln {

inline constexpr const char* kTestCellFaultEnv = "KILN_TEST_CELL_FAULT";

// Parses a KILN_TEST_CELL_FAULT value into target -> (request number -> the run refusal token it
// fakes: kCellFault or kCellOom, arm/loader.h). InvalidArgument names the item and what was
// expected.
Result<std::map<std::string, std::map<int, std::string>>> ParseCellFaultSpec(
    const std::string& spec);

// Installs the faults the environment asks for on the targets they name. OK and nothing happens
// when the variable is unset; InvalidArgument for a malformed value or an unknown target (a test
// that misspells a target must fail, not pass vacuously).
Status ApplyTestSwitchesFromEnv(const std::map<std::string, ServedTarget*>& targets);

}  // namespace kiln
