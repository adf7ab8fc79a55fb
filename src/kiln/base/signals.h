// Stop and reload signals of a serving process (base layer): the hub and the worker both block
// SIGINT, SIGTERM and SIGHUP before their threads start, then one thread waits for them, reloads
// on SIGHUP and stops on the others.
#pragma once

#include <signal.h>

#include <functional>

namespace kiln {

// Blocks SIGINT, SIGTERM and SIGHUP in the calling thread, so every thread it starts afterwards
// has them blocked too and only WaitForStopSignal receives them. Returns that set.
sigset_t BlockStopSignals();

// True when a SIGINT or SIGTERM of `set` (from BlockStopSignals) is pending: a process still
// starting asks this between its steps, so a stop during a long start is not held until serving.
bool StopSignalPending(const sigset_t& set);

// Waits on `set` (from BlockStopSignals): each SIGHUP calls `on_hup` and waits again; returns the
// first SIGINT or SIGTERM.
int WaitForStopSignal(const sigset_t& set, const std::function<void()>& on_hup);

}  // namespace kiln
