// Adopter: the boot outcome policy and the background retries (see adoption.h).
#include "src/kiln/worker/adoption.h"

#include <algorithm>
#include <chrono>

#include "src/kiln/base/backoff.h"
#include "src/kiln/base/log.h"

namespace kiln {

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
  Apply(out, target, spec, graph, 0);
  return out;
}

void Adopter::Apply(const BootOutcome& out, ServedTarget& target, const TargetSpec& spec,
                    const std::shared_ptr<const Graph>& graph, int attempt) {
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
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    pending_.push_back({&target, spec, graph, attempt + 1,
                        std::chrono::steady_clock::now() + std::chrono::milliseconds(delay)});
    if (!thread_.joinable()) thread_ = std::thread([this] { RetryLoop(); });
    cv_.notify_all();
    return;
  }
  // A miss, or a refusal of the hub's cell: the ordinary miss policy, mint where the lane
  // allows. The refusal stays the target's posture token (it says why there is no cell).
  if (!miss) target.SetStoredPosture(out.phase);
  if (minter_ != nullptr) minter_->MintExported(out.key, MintBinding{&target, spec});
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
    Apply(out, *job.target, job.spec, job.graph, job.attempt);
    lock.lock();
  }
}

}  // namespace kiln
