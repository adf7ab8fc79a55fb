// Adopter: the boot outcome policy and the background retries (see adoption.h).
#include "src/kiln/worker/adoption.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <random>

#include "src/kiln/base/backoff.h"
#include "src/kiln/base/log.h"
#include "src/kiln/worker/mint_lease.h"

namespace kiln {

int64_t LeasePollDelayMs(const AdopterOptions& options, const LeaseAnswer& held, int polls) {
  const int64_t step = JitteredBackoff(std::chrono::milliseconds(options.lease_poll_initial_ms),
                                       std::chrono::milliseconds(options.lease_poll_max_ms), polls)
                           .count();
  thread_local std::mt19937_64 rng{std::random_device{}()};
  const int64_t spread = std::max<int64_t>(1, held.ttl_ms / 10);
  const int64_t at_expiry = std::max<int64_t>(0, held.expires_in_ms) +
                            std::uniform_int_distribution<int64_t>(1, spread)(rng);
  return std::min(step, at_expiry);
}

Adopter::Adopter(BootContext ctx, Minter* minter, AdopterOptions options)
    : ctx_(std::move(ctx)), minter_(minter), options_(options) {}

Adopter::~Adopter() { Stop(); }

void Adopter::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    pending_.clear();
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

BootOutcome Adopter::AdoptNow(ServedTarget& target, const TargetSpec& spec,
                              const std::shared_ptr<const Graph>& graph) {
  std::lock_guard<std::mutex> lock(adopt_mu_);
  // The live checkpoint: a swap since boot binds the adopted cell to the weights being served.
  std::shared_ptr<const WeightMap> weights = target.weights();
  return AdoptAtBoot(target, spec, graph, *weights, ctx_);
}

BootOutcome Adopter::Boot(ServedTarget& target, const TargetSpec& spec,
                          std::shared_ptr<const Graph> graph) {
  BootOutcome out = AdoptNow(target, spec, graph);
  {
    std::lock_guard<std::mutex> lock(mu_);
    booted_.push_back(Booted{&target, spec, graph, out.key});
  }
  Apply(out, target, spec, graph, 0, LeaseWait());
  return out;
}

void Adopter::ReadoptKey(const std::string& key) {
  std::vector<Booted> targets;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Booted& b : booted_) {
      if (!key.empty() && b.key == key) targets.push_back(b);
    }
  }
  for (const Booted& b : targets) {
    if (b.target->cell() != nullptr) continue;  // armed: nothing was held back
    KILN_LOG(INFO) << "worker: target '" << b.spec.name << "' adopts " << key
                   << " again: the hub lifted its revocation";
    Schedule(Pending{b.target, b.spec, b.graph, 0, {}, {}}, 0);
  }
}

void Adopter::ApplyOrder(const ServedTarget* target) {
  std::optional<Booted> found;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Booted& b : booted_) {
      if (b.target == target) found = b;
    }
  }
  if (!found || found->target->arming_held()) return;  // eager: nothing to adopt
  const std::string wanted = found->target->wanted_ref();
  const std::shared_ptr<ArmedCell> cell = found->target->cell();
  const std::string installed = cell != nullptr ? cell->ref() : "";
  // Already serving what the order asks: the wanted ref, or (auto) the cell of its own key.
  if (!wanted.empty() ? installed == wanted
                      : (!installed.empty() && installed.rfind(found->key + "@", 0) == 0)) {
    return;
  }
  found->target->SetStoredPosture("");
  KILN_LOG(INFO) << "worker: target '" << found->spec.name << "' adopts "
                 << (wanted.empty() ? "its own key's cell" : wanted) << " on the hub's order";
  Schedule(Pending{found->target, found->spec, found->graph, 0, {}, {}}, 0);
}

void Adopter::ReadoptTarget(const ServedTarget* target) {
  std::optional<Booted> found;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Booted& b : booted_) {
      if (b.target == target) found = b;
    }
  }
  if (!found || found->target->cell() != nullptr) return;
  KILN_LOG(INFO) << "worker: target '" << found->spec.name
                 << "' adopts again: the operator lifted its eager-only order";
  Schedule(Pending{found->target, found->spec, found->graph, 0, {}, {}}, 0);
}

void Adopter::Apply(const BootOutcome& out, ServedTarget& target, const TargetSpec& spec,
                    const std::shared_ptr<const Graph>& graph, int attempt, LeaseWait wait) {
  if (out.adopted()) {
    target.SetStoredPosture("");
    return;
  }
  const bool miss = out.phase == kBootMiss || out.phase == kBootLocalMissNoHub;
  if (!miss && !IsBootRefusal(out.phase)) return;  // operator order, intake: nothing to do
  if (out.phase == kBootKeyUnderivable || out.key.empty()) return;
  if (out.retryable) {
    target.SetStoredPosture(out.phase);
    // Jittered: a fleet that lost its hub together does not come back to it together.
    const int64_t delay = JitteredBackoff(std::chrono::milliseconds(options_.retry_initial_ms),
                                          std::chrono::milliseconds(options_.retry_max_ms), attempt)
                              .count();
    KILN_LOG(INFO) << "worker: target '" << spec.name << "' adoption refused (" << out.phase
                   << ", the hub could not be asked); retrying in " << delay << " ms";
    Schedule(Pending{&target, spec, graph, attempt + 1, {}, wait}, delay);
    return;
  }
  if (out.phase == kBootOrderRefUnservable || out.phase == kBootOrderRefUnavailable ||
      (miss && !target.wanted_ref().empty())) {
    // The hub ordered one cell and this target cannot have it: it serves eager and says why
    // (a mint here would make another cell than the one ordered). A newer order adopts again.
    target.SetStoredPosture(miss ? kBootOrderRefUnavailable : out.phase);
    return;
  }
  if (out.phase == kCellCrashed) {
    // A worker of this machine died inside this very cell: a mint of the key would make the
    // same bytes (law 15), so the target stays eager and says why (crash_guard.h).
    target.SetStoredPosture(kCellCrashed);
    return;
  }
  // A miss, or a refusal of the hub's cell: the ordinary miss policy, mint where the lane
  // allows. The refusal stays the target's posture token (it says why there is no cell).
  if (!miss) target.SetStoredPosture(out.phase);
  if (target.arming_held()) {
    // The operator (or the hub's order) wants this target eager: a mint's CPU and memory would
    // serve nothing. It starts when the order is lifted (ReadoptTarget).
    if (ctx_.events != nullptr) {
      EventRow row;
      row.kind = event_kind::kSelfMintSkipped;
      row.phase = target.eager_only() ? kPostureOperatorEagerOnly : kPostureHubOrderEager;
      row.key = out.key;
      row.target = spec.name;
      row.detail = "key=" + out.key + " target=" + spec.name +
                   " an eager order holds; minting when it is lifted";
      ctx_.events->Append(std::move(row));
    }
    return;
  }
  if (minter_ != nullptr) MintOrWait(out, target, spec, graph, attempt, std::move(wait));
}

void Adopter::Schedule(Pending p, int64_t delay_ms) {
  p.due = std::chrono::steady_clock::now() + std::chrono::milliseconds(delay_ms);
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return;
  pending_.push_back(std::move(p));
  if (!thread_.joinable()) thread_ = std::thread([this] { RetryLoop(); });
  cv_.notify_all();
}

void Adopter::MintOrWait(const BootOutcome& out, ServedTarget& target, const TargetSpec& spec,
                         const std::shared_ptr<const Graph>& graph, int attempt, LeaseWait wait) {
  MintLeases* leases = options_.leases;
  // Only a miss the hub answered asks for the lease: without a hub there is nobody to ask, a
  // refusal of the hub's cell means a cell exists, and a mint of the key already running here is
  // joined as ever.
  if (leases == nullptr || out.phase != kBootMiss || minter_->IsMinting(out.key)) {
    minter_->MintExported(out.key, MintBinding{&target, spec});
    return;
  }
  const std::string& family = spec.export_spec->family;
  const LeaseAnswer lease = leases->Acquire(out.key, family);
  switch (lease.kind) {
    case LeaseAnswer::Kind::kGranted:
      if (!wait.holder.empty()) {
        KILN_LOG(INFO) << "worker: target '" << spec.name << "' took over the mint lease of "
                       << out.key << " from " << wait.holder << " (released or expired)";
      }
      minter_->MintExported(out.key, MintBinding{&target, spec},
                            leases->Hold(out.key, family, lease));
      return;
    case LeaseAnswer::Kind::kNoLease:
      KILN_LOG(INFO) << "worker: target '" << spec.name << "' mint lease of " << out.key
                     << (lease.transient ? " not asked: the hub could not be reached ("
                                         : " refused by the hub (")
                     << lease.token << "); minting here";
      minter_->MintExported(out.key, MintBinding{&target, spec});
      return;
    case LeaseAnswer::Kind::kPublished: {
      // Published since the resolve: adopt it at once (a short jittered wait).
      const int64_t delay =
          JitteredBackoff(std::chrono::milliseconds(100),
                          std::chrono::milliseconds(options_.lease_poll_max_ms), wait.polls)
              .count();
      ++wait.polls;
      Schedule(Pending{&target, spec, graph, attempt, {}, std::move(wait)}, delay);
      return;
    }
    case LeaseAnswer::Kind::kHeld:
      break;
  }
  if (lease.holder != wait.holder && ctx_.events != nullptr) {
    EventRow row;
    row.kind = event_kind::kSelfMintSkipped;
    row.phase = kMintLeaseHeld;
    row.key = out.key;
    row.target = spec.name;
    row.detail = "key=" + out.key + " target=" + spec.name + " worker=" + ctx_.worker +
                 " holder=" + lease.holder +
                 " expires_in_ms=" + std::to_string(lease.expires_in_ms) + " waiting for its cell";
    ctx_.events->Append(std::move(row));
  }
  target.SetStoredPosture(kPostureMintInProgress);
  const int64_t delay = LeasePollDelayMs(options_, lease, wait.polls);
  wait.holder = lease.holder;
  ++wait.polls;
  Schedule(Pending{&target, spec, graph, attempt, {}, std::move(wait)}, delay);
}

void Adopter::RetryLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    if (pending_.empty()) {
      cv_.wait(lock, [this] { return stopping_ || !pending_.empty(); });
      continue;
    }
    auto next = std::min_element(pending_.begin(), pending_.end(),
                                 [](const Pending& a, const Pending& b) { return a.due < b.due; });
    if (std::chrono::steady_clock::now() < next->due) {
      cv_.wait_until(lock, next->due);
      continue;
    }
    Pending job = *next;
    pending_.erase(next);
    lock.unlock();
    BootOutcome out = AdoptNow(*job.target, job.spec, job.graph);
    Apply(out, *job.target, job.spec, job.graph, job.attempt, std::move(job.wait));
    lock.lock();
  }
}

}  // namespace kiln
