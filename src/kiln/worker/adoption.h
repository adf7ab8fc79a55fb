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
//   operator_eager_only, no_export_declaration, key_underivable: nothing
// Every attempt emits its own boot_adopt row.
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

struct AdopterOptions {
  int retry_initial_ms = 1000;
  int retry_max_ms = 30000;
};

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
  // Ends the retries; a retry in progress finishes first. Idempotent.
  void Stop();

 private:
  struct Pending {
    ServedTarget* target;
    TargetSpec spec;
    std::shared_ptr<const Graph> graph;
    int attempt;
    std::chrono::steady_clock::time_point due;
  };
  BootOutcome AdoptNow(ServedTarget& target, const TargetSpec& spec,
                       const std::shared_ptr<const Graph>& graph);
  void Apply(const BootOutcome& out, ServedTarget& target, const TargetSpec& spec,
             const std::shared_ptr<const Graph>& graph, int attempt);
  void RetryLoop();

  BootContext ctx_;
  Minter* minter_;
  AdopterOptions options_;
  std::mutex adopt_mu_;  // one adoption at a time: the context's key sets are not shared-safe
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Pending> pending_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace kiln
