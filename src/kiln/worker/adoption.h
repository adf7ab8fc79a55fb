// Adopter: what a worker does with each exported target's boot outcome, and the retries when the
// hub could not be asked (worker layer; docs/design.md §4 Boot, §12 "Boot-adopt details").
//
// After AdoptAtBoot (boot.h):
//   hit, local_hit                      the cell serves; nothing more
//   miss, local_miss_no_hub             the miss policy: mint in a child (minter.h), eager
//   meanwhile a retryable refusal (the hub was down, timed out, answered 5xx; the revocation list
//   could not be fetched)                         eager with the refusal as posture token, and the
//   adoption
//                                       is retried in the background with jittered backoff: steps
//                                       of 1 s, 2 s, 4 s …, each wait drawn from [step/2, step] up
//                                       to the manifest's hub.adopt_retry_max_s, until it ends
//                                       otherwise
//   any other refusal (the hub's cell refused for its receipt, scope, provenance, bytes, source,
//   or revoked)                         the lane's ordinary miss policy: the refusal becomes the
//                                       target's stored posture token and the key is minted here
//                                       (a mint never arms a revoked digest)
//   cell_crashed (the ref is crash-quarantined here, crash_guard.h)
//                                       eager with posture `cell_crashed`; nothing is minted (a
//                                       mint of the key would make the same bytes, law 15)
//   no_export_declaration, key_underivable: nothing
// While the operator's eager-only order holds on the target (serving.h), a miss mints nothing:
// a `self_mint_skipped operator_eager_only` row says so, and the mint starts when the order is
// lifted (ReadoptTarget). Retries of an adoption the hub could not answer go on regardless: the
// order never cancels one, so the cell is verified and kept on this machine when the order
// lifts (boot.h step 1: nothing is armed while it holds).
// Every attempt emits its own boot_adopt row.
//
// With a hub's mint leases (AdopterOptions::leases; mint_lease.h) a `miss` asks for the key's
// lease before it mints: granted, it mints holding the lease; held by another worker, the target
// keeps its miss posture (eager, or a mandatory lane's refusal) and adoption is tried again after
// a jittered wait of 0.5 s, 1 s, 2 s … up to lease_poll_max_ms, never past the holder's lease
// expiry (so a dead holder's key is taken over within a TTL and a poll), until the cell appears
// (adopted as any hit) or the lease is granted here. One `self_mint_skipped lease_held` row per
// holder waited on. A hub that cannot be asked for the lease mints here as without one.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "src/kiln/worker/boot.h"
#include "src/kiln/worker/minter.h"

namespace kiln {

class MintLeases;
struct LeaseAnswer;

struct AdopterOptions {
  int retry_initial_ms = 1000;
  int retry_max_ms = 30000;
  MintLeases* leases = nullptr;  // not owned; null = no leases (no hub, or tests)
  int lease_poll_initial_ms = 500;
  int lease_poll_max_ms = 10000;
};

// The wait before a worker that found the lease of its key held (`held`, another worker mints)
// tries adoption again, at its `polls`-th poll: the jittered backoff step (lease_poll_initial_ms,
// doubling, at most lease_poll_max_ms), but never later than the lease's expiry as `held` reported
// it plus a jittered tenth of its TTL, so a holder that died is taken over by one of the waiters
// within a TTL and a poll. Shared with the fleet simulator (cli/fleet_sim.cc), whose waiting
// workers poll exactly as a worker does.
int64_t LeasePollDelayMs(const AdopterOptions& options, const LeaseAnswer& held, int polls);

class Adopter {
 public:
  // `ctx` is shared by every attempt (its pointers must outlive this object); `minter` may be
  // null (no miss policy: tests of the retries alone).
  Adopter(BootContext ctx, Minter* minter, AdopterOptions options);
  ~Adopter();  // Stop()
  Adopter(const Adopter&) = delete;
  Adopter& operator=(const Adopter&) = delete;

  // Adopts for an exported target now and applies the policy above. `target` must outlive this
  // object (or Stop()).
  BootOutcome Boot(ServedTarget& target, const TargetSpec& spec,
                   std::shared_ptr<const Graph> graph);
  // The hub lifted a revocation of a cell of `key` (revocations.h): every target booted here
  // whose key it is and that holds no armed cell adopts again now (an ordinary attempt, with this
  // policy for its outcome). Any thread.
  void ReadoptKey(const std::string& key);
  // The operator lifted the eager-only order of `target`: when it holds no armed cell, it adopts
  // again now (from the local store, where the held adoption kept the bytes; on a miss, mints). A
  // target Boot never saw is ignored. Any thread.
  void ReadoptTarget(const ServedTarget* target);
  // The hub's order for `target` changed (ServedTarget::SetHubOrder): unless it serves eager or
  // already serves what the order asks (the wanted ref; for auto, a cell of its own key), it
  // adopts now. A target Boot never saw is ignored. Any thread.
  void ApplyOrder(const ServedTarget* target);
  // Ends the retries; a retry in progress finishes first. Idempotent.
  void Stop();

 private:
  // A wait on another worker's mint of the key (mint leases).
  struct LeaseWait {
    int polls = 0;       // polls so far: the backoff's attempt
    std::string holder;  // the holder last seen ("" = none yet)
  };
  struct Pending {
    ServedTarget* target;
    TargetSpec spec;
    std::shared_ptr<const Graph> graph;
    int attempt;
    std::chrono::steady_clock::time_point due;
    LeaseWait wait = {};
  };
  BootOutcome AdoptNow(ServedTarget& target, const TargetSpec& spec,
                       const std::shared_ptr<const Graph>& graph);
  void Apply(const BootOutcome& out, ServedTarget& target, const TargetSpec& spec,
             const std::shared_ptr<const Graph>& graph, int attempt, LeaseWait wait);
  // The miss policy with mint leases (see above); without them, MintExported.
  void MintOrWait(const BootOutcome& out, ServedTarget& target, const TargetSpec& spec,
                  const std::shared_ptr<const Graph>& graph, int attempt, LeaseWait wait);
  void Schedule(Pending p, int64_t delay_ms);
  void RetryLoop();

  // Every exported target Boot saw, with the key it derived ("" when none): what ReadoptKey
  // looks through.
  struct Booted {
    ServedTarget* target;
    TargetSpec spec;
    std::shared_ptr<const Graph> graph;
    std::string key;
  };

  BootContext ctx_;
  Minter* minter_;
  AdopterOptions options_;
  std::mutex adopt_mu_;  // one adoption at a time: the context's key sets are not shared-safe
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Pending> pending_;
  std::vector<Booted> booted_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace kiln
