// Hub orders on a worker: which workers a canary selects, and the machine's stable worker id it
// selects them by (worker layer; docs/fleet.md "Hub orders").
//
// A canary `<ref> <share>` for (release, target) moves the workers whose canary point lies below
// the share to `ref`; the rest serve what `auto` would. The point is a pure function of the worker
// id, the release and the target (the first 8 bytes of SHA-256 over them, read as a fraction of
// 2^64): the same worker is chosen on every poll and after every restart, a larger share keeps
// every worker a smaller one chose, and anyone who knows the ids can compute the set.
#pragma once

#include <string>

#include "src/kiln/base/status.h"

namespace kiln {

// The canary point of one worker for one (release, target), in [0, 1).
double CanaryPoint(const std::string& worker_id, const std::string& release,
                   const std::string& target);
// Whether a canary of `share` selects this worker: CanaryPoint(...) < share.
bool InCanary(const std::string& worker_id, const std::string& release, const std::string& target,
              double share);

// This machine's worker id: 32 hex characters kept in <store_root>/.worker_id, made at the first
// boot (from /dev/urandom) and read at every later one. Two workers sharing a store root share an
// id (one machine); IOError when the file cannot be made or read, InvalidArgument when it holds
// something else than an id.
Result<std::string> MachineWorkerId(const std::string& store_root);

}  // namespace kiln
