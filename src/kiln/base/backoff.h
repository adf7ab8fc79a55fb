// Retry delays with jitter (base layer): the wait before each retry of a call to a peer that did
// not answer (the hub, the object store), used by the worker's adoption retries, its publisher and
// its event forwarder.
//
// A fleet that loses its hub retries together: every worker's first failure falls in the same
// second, and with a fixed doubling schedule every later retry falls in the same instant too, so
// a hub that comes back meets the whole fleet at once, wave after wave. Each delay here is the
// schedule's step, min(initial * 2^attempt, max), times a factor drawn uniformly from [0.5, 1]:
// the step still bounds every wait (a peer that returns is seen within it), half of it is a floor
// (no retry storm from a draw near zero), and the other half spreads the fleet's retries over the
// step instead of one instant.
#pragma once

#include <chrono>
#include <cstdint>
#include <random>

namespace kiln {

// The step of retry `attempt` (0 for the first retry): initial * 2^attempt, capped at max.
// Never overflows: the doubling stops at the cap. initial and max are positive, max >= initial.
std::chrono::milliseconds BackoffStep(std::chrono::milliseconds initial,
                                      std::chrono::milliseconds max, int attempt);

// BackoffStep scaled by a uniform draw from [0.5, 1] of `rng`.
std::chrono::milliseconds JitteredBackoff(std::chrono::milliseconds initial,
                                          std::chrono::milliseconds max, int attempt,
                                          std::mt19937_64& rng);

// The same, drawn from this thread's generator, seeded once per thread from the operating
// system's entropy: two processes (two workers) draw different sequences.
std::chrono::milliseconds JitteredBackoff(std::chrono::milliseconds initial,
                                          std::chrono::milliseconds max, int attempt);

}  // namespace kiln
