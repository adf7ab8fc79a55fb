// Minter: when to mint, and adopting what a mint child made (worker layer; see minter.h). The
// child itself is started and watched by the mint layer's parent (mint/parent.h).
//
// Nothing here compiles or reaches a compiler header: the compiler runs in the child process, and
// the child's cell is judged by admission against this machine's policy (LocalAdmissionPolicy).
#include "src/kiln/worker/minter.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <utility>

#include "src/kiln/arm/gate.h"
#include "src/kiln/base/clock.h"
#include "src/kiln/base/file.h"
#include "src/kiln/cell/admission.h"
#include "src/kiln/cell/pack.h"
#include "src/kiln/mint/mint.h"
#include "src/kiln/mint/target_request.h"
#include "src/kiln/worker/boot.h"

namespace kiln {

// Phase tokens of self_mint_abort / self_mint_skipped / jit_compile that are neither the child's
// own nor the parent's (mint/parent.h).
inline constexpr const char* kMintKeyAxisDivergence = "key_axis_divergence";
inline constexpr const char* kMintInsufficientMemory = "insufficient_memory";
inline constexpr const char* kMintQuarantined = "quarantined";
inline constexpr const char* kMintArmRefused = "arm_refused";

namespace {

int64_t MemAvailableMb() {
  std::ifstream meminfo("/proc/meminfo");
  std::string field, unit;
  int64_t kb = 0;
  while (meminfo >> field >> kb >> unit) {
    if (field == "MemAvailable:") return kb / 1024;
  }
  return 0;
}

std::vector<std::pair<std::string, double>> PhaseStages(const MintChildReport& report) {
  std::vector<std::pair<std::string, double>> out;
  for (const auto& p : report.phases) out.emplace_back(p.phase, p.ms);
  return out;
}

// "" when a child's report states this worker's environment for `spec` (sm, toolchain, envelope,
// graph axes, family, lane and key); else the first divergence, named ("axis=sm child=...
// parent=..."), or why this side's axes could not be derived.
std::string AxisDivergence(const MintChildReport& report, const std::shared_ptr<const Graph>& graph,
                           const TargetSpec& spec, const std::string& key) {
  auto axes = DeriveKeyAxes(*graph, spec.envelope, spec.sm);
  if (!axes.ok()) return axes.status().ToString();
  const std::pair<const char*, std::pair<std::string, std::string>> checks[] = {
      {"sm", {report.axes.sm, axes->sm}},
      {"toolchain", {report.axes.toolchain, axes->toolchain}},
      {"envelope", {report.axes.envelope, axes->envelope}},
      {"graph", {report.axes.graph, axes->graph}},
      {"family", {report.family, spec.export_spec->family}},
      {"lane", {report.lane, "exported"}},
      {"key", {report.key, key}}};
  for (const auto& [axis, values] : checks) {
    if (values.first != values.second) {
      return std::string("axis=") + axis + " child=" + values.first + " parent=" + values.second;
    }
  }
  return "";
}

}  // namespace

struct Minter::Job {
  std::string key;                    // "" for intake
  std::vector<MintBinding> bindings;  // guarded by Minter::mu_ until the job adopts
  std::string dir;                    // the mint's private directory
  std::shared_ptr<void> lease;        // the fleet's mint lease of the key, if one was granted
  Clock::TimePoint started = Clock::Real()->Now();
};

Minter::Minter(MinterOptions options)
    : options_(std::move(options)),
      parent_(MintParentOptions{options_.binary, options_.stall_window_ms, options_.sample_ms,
                                options_.child_nice}) {}

Minter::~Minter() { Stop(); }

void Minter::Stop() {
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    threads.swap(threads_);
  }
  parent_.KillAll();
  for (auto& t : threads) t.join();
}

bool Minter::WaitIdle(int timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  return idle_cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                           [&] { return active_ == 0; });
}

void Minter::Emit(const char* kind, const std::string& phase, double ms, const std::string& key,
                  const std::string& ref, const std::string& target, const std::string& detail,
                  std::vector<std::pair<std::string, double>> stages) {
  if (options_.events == nullptr) return;
  EventRow row;
  row.kind = kind;
  row.phase = phase;
  row.duration_ms = ms;
  row.key = key;
  row.ref = ref;
  row.target = target;
  row.detail = (key.empty() ? "" : "key=" + key + " ") + "target=" + target;
  if (!options_.worker.empty()) row.detail += " worker=" + options_.worker;
  if (!detail.empty()) row.detail += " " + detail;
  row.stages = std::move(stages);
  options_.events->Append(std::move(row));
}

int64_t Minter::EstimateMintMb(const ServedTarget& target, int parallel_compiles) {
  // A compiler process peaks near 300 MiB on our generated sources; the proof holds the weights
  // about three times (the checkpoint, the perturbed one, the eager run) plus the child itself.
  uint64_t weight_bytes = 0;
  for (const auto& [name, t] : *target.weights()) weight_bytes += t.nbytes();
  return 300 * std::max(1, parallel_compiles) + 3 * static_cast<int64_t>(weight_bytes >> 20) + 128;
}

std::string Minter::MemoryShortfall(const ServedTarget& target) const {
  const int64_t need = EstimateMintMb(target, options_.parallel_compiles);
  const int64_t budget =
      options_.memory_budget_mb > 0 ? options_.memory_budget_mb : MemAvailableMb();
  if (need <= budget) return "";
  return "need_mb=" + std::to_string(need) + " budget_mb=" + std::to_string(budget) +
         (options_.memory_budget_mb > 0 ? " (manifest mint.memory_budget_mb)" : " (MemAvailable)");
}

bool Minter::IsMinting(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  return running_.count(key) != 0;
}

void Minter::MintExported(const std::string& key, MintBinding binding,
                          std::shared_ptr<void> lease) {
  const std::string target = binding.spec.name;
  std::shared_ptr<Job> job;
  bool quarantined = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    quarantined = quarantined_.count(key) != 0;
    if (quarantined) {
      // Emitted below, outside the lock.
    } else if (auto it = running_.find(key); it != running_.end()) {
      // Same key, one mint: this target is armed from the same bytes.
      it->second->bindings.push_back(binding);
      // The newest grant is the one the hub holds (a holder's own ask replaces its lease).
      if (lease) it->second->lease = std::move(lease);
      binding.target->SetMintInProgress(true);
      Emit(event_kind::kSelfMintStarted, "joined", 0, key, "", target,
           "sharing the mint already running for this key");
      return;
    }
  }
  if (quarantined) {
    Emit(event_kind::kSelfMintSkipped, kMintQuarantined, 0, key, "", target,
         "a mint of this key failed in this process; serving eager for its life");
    return;
  }
  if (std::string shortfall = MemoryShortfall(*binding.target); !shortfall.empty()) {
    binding.target->SetStoredPosture(kMintInsufficientMemory);
    Emit(event_kind::kSelfMintSkipped, kMintInsufficientMemory, 0, key, "", target, shortfall);
    return;
  }
  job = std::make_shared<Job>();
  job->key = key;
  job->bindings.push_back(binding);
  job->lease = std::move(lease);
  binding.target->SetMintInProgress(true);
  {
    std::lock_guard<std::mutex> lock(mu_);
    running_[key] = job;
  }
  Emit(event_kind::kSelfMintStarted, "child", 0, key, "", target,
       "nice=" + std::to_string(options_.child_nice) +
           " threads=" + std::to_string(options_.child_threads) + " stall_window_ms=" +
           std::to_string(options_.stall_window_ms) + (job->lease ? " lease=held" : " lease=none"));
  Launch(job, false);
}

void Minter::CompileIntake(MintBinding binding) {
  auto job = std::make_shared<Job>();
  binding.target->SetArmPending(true);
  job->bindings.push_back(std::move(binding));
  Launch(job, true);
}

void Minter::Launch(std::shared_ptr<Job> job, bool intake) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return;
  ++active_;
  threads_.emplace_back([this, job, intake] {
    if (intake) {
      RunIntake(job);
    } else {
      RunExported(job);
    }
    std::lock_guard<std::mutex> l(mu_);
    --active_;
    idle_cv_.notify_all();
  });
}

MintChildOutcome Minter::RunChild(Job& job, int attempt) {
  const MintBinding& first = job.bindings.front();
  static std::atomic<uint64_t> counter{0};
  job.dir = options_.work_root + "/" + first.spec.name + "-" + std::to_string(::getpid()) + "-" +
            std::to_string(counter.fetch_add(1));
  MintChildRequest req;
  req.manifest = options_.manifest_path;
  req.manifest_base_dir = options_.manifest_base_dir;
  req.target = first.spec.name;
  req.intake = !first.spec.exported();
  req.threads = options_.child_threads;
  req.parallel_compiles = options_.parallel_compiles;
  req.attempt = attempt;
  return parent_.Run(job.dir, std::move(req));
}

bool Minter::InstallMinted(const MintBinding& b, const std::shared_ptr<ArmedCell>& cell,
                           const std::string& key, const std::string& ref,
                           Clock::TimePoint adopt_start) {
  if (b.target->arming_held()) {
    b.target->SetMintInProgress(false);
    // An eager order suppresses arming: the proven bytes are stored; the lift adopts them from
    // the local store.
    Emit(event_kind::kLocalCellArmed,
         b.target->eager_only() ? kPostureOperatorEagerOnly : kPostureHubOrderEager,
         MsSince(adopt_start), key, ref, b.spec.name, "stored, not armed: an eager order holds");
    return false;
  }
  // Reproven: the strict gate and the fence proof just ran on this target's live checkpoint.
  Status installed = b.target->InstallCell(cell, /*reproven=*/true);
  if (installed.ok()) b.target->SetStoredPosture("");
  // Cleared once the cell is in: a request between the two is served by the cell or, eager, still
  // as mint_in_progress, never as `uncompiled`.
  b.target->SetMintInProgress(false);
  Emit(event_kind::kLocalCellArmed, installed.ok() ? "armed" : kMintArmRefused,
       MsSince(adopt_start), key, ref, b.spec.name,
       installed.ok() ? "lane=exported" : installed.ToString());
  return installed.ok();
}

void Minter::RunExported(std::shared_ptr<Job> job) {
  int attempts = 1;
  MintChildOutcome child = RunChild(*job, 1);
  if (child.phase == kMintResourceExhausted) {
    // One retry, after a fresh look at the budget.
    const MintBinding& b = job->bindings.front();
    if (std::string shortfall = MemoryShortfall(*b.target); !shortfall.empty()) {
      child.detail += "; retry skipped: " + shortfall;
    } else {
      std::error_code ec;
      std::filesystem::remove_all(job->dir, ec);
      attempts = 2;
      child = RunChild(*job, 2);
    }
  }
  const Clock::TimePoint adopt_start = Clock::Real()->Now();
  std::vector<MintBinding> bindings;
  // From here on no target joins this job: a later miss of the key finds the local store.
  auto take_bindings = [&] {
    std::lock_guard<std::mutex> lock(mu_);
    running_.erase(job->key);
    bindings = job->bindings;
  };
  auto abort = [&](const std::string& phase, const std::string& detail, bool deterministic) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      quarantined_.insert(job->key);
    }
    take_bindings();
    job->lease.reset();  // released now: another worker may try
    std::error_code ec;
    std::filesystem::remove_all(job->dir, ec);  // the bytes are deleted: nothing to publish
    for (const MintBinding& b : bindings) {
      // The refusal is the target's eager posture token from now on (it names why no cell).
      b.target->SetStoredPosture(phase);
      b.target->SetMintInProgress(false);
      Emit(event_kind::kSelfMintAbort, phase, MsSince(job->started), job->key, "", b.spec.name,
           detail + "; attempts=" + std::to_string(attempts) +
               "; serving eager, key quarantined for the process life");
      if (deterministic && options_.publisher != nullptr) {
        options_.publisher->EnqueueSettle(b.spec.name, SmOrDefault(b.spec.sm), phase);
      }
    }
  };
  if (!child.phase.empty()) {
    const bool deterministic = child.exit_code == kMintExitRefused;
    abort(child.phase, child.detail, deterministic);
    return;
  }
  const MintChildReport& report = child.report;
  const MintBinding& first = job->bindings.front();

  // 1. The child's recorded environment equals ours; the first divergence is named.
  if (std::string diverged = AxisDivergence(report, first.target->graph(), first.spec, job->key);
      !diverged.empty()) {
    return abort(kMintKeyAxisDivergence, diverged, false);
  }
  // 2. Admission, as for any cell (law 4), against the digest the child reported.
  auto bytes = ReadFile(report.artifact);
  if (!bytes.ok()) return abort(kMintChildCrashed, bytes.status().ToString(), false);
  auto policy = LocalAdmissionPolicy(job->key);
  if (!policy.ok()) return abort(kMintArmRefused, policy.status().ToString(), false);
  auto admitted = AdmitCell(*bytes, report.digest, bytes->size(), *policy);
  if (!admitted.ok()) {
    const std::string token = admitted.status().token();
    return abort(token.empty() ? kMintArmRefused : token, admitted.status().ToString(), false);
  }
  const std::string ref = CellRef(job->key, admitted->digest);
  if (options_.revocations != nullptr && options_.revocations->IsRevoked(admitted->digest)) {
    // Minting is deterministic: the same key gives the revoked bytes again. They never arm.
    return abort(kRefusalRevoked, "the hub revoked " + ref + "; minted bytes are the same", false);
  }
  take_bindings();
  // 3. Per waiting target: load with its live checkpoint, the strict gate and the fence proof
  // against its own eager interpreter, then arm. One refusal refuses the cell for all.
  std::vector<std::pair<const MintBinding*, std::shared_ptr<ArmedCell>>> armed;
  static std::atomic<uint64_t> counter{0};
  for (const MintBinding& b : bindings) {
    auto weights = b.target->weights();
    auto cell = LoadAdmittedCell(
        *admitted, *weights, Lane::kExported,
        options_.private_dir + "/" + b.spec.name + "-mint-" + std::to_string(counter.fetch_add(1)),
        options_.serve_threads);
    if (!cell.ok()) return abort(kMintArmRefused, cell.status().ToString(), false);
    auto samples = ReadSamples(b.spec.samples);
    if (!samples.ok()) return abort(kMintArmRefused, samples.status().ToString(), false);
    StrictProofOptions proof_options;
    bool gate_passed = false;
    proof_options.on_gate = [&](const Result<GateReport>& gate, double ms) {
      gate_passed = gate.ok() && gate->verdict == Verdict::kHealthy;
      const std::string summary = gate.ok() ? gate->Summary() : gate.status().ToString();
      const std::string verdict = gate.ok() ? VerdictName(gate->verdict) : "UNMEASURABLE";
      Emit(event_kind::kCellNumerics, verdict, ms, job->key, ref, b.spec.name,
           "gate=strict by=parent " + summary + " child_gate=\"" + report.gate + "\"");
    };
    auto proof =
        ProveStrict(**cell, b.target->interpreter(), *weights, ThresholdsFor(b.spec.numerics),
                    CellArtifacts{admitted->files.source, admitted->files.shared_object}, *samples,
                    proof_options);
    if (!proof.ok()) {
      // The proof's own token (a weight the fence cannot measure is its own refusal, never
      // reported as a baked one); a run that failed outright refuses the stage it failed in.
      const std::string token = proof.status().token();
      return abort(!token.empty() ? token
                   : gate_passed  ? kRefusalFence
                                  : kRefusalNumerics,
                   "by=parent " + proof.status().ToString(), true);
    }
    armed.emplace_back(&b, std::shared_ptr<ArmedCell>(std::move(cell).value()));
  }
  // 4. Store first (a restart finds it), then install: serving switches with no barrier.
  const Clock::TimePoint store_start = Clock::Real()->Now();
  Status put = options_.store->Put(job->key, *bytes, CellOrigin{CellOrigin::Kind::kMinted, ""});
  Emit(event_kind::kLocalCellStored, put.ok() ? "stored" : "store_failed", MsSince(store_start),
       job->key, ref, first.spec.name,
       put.ok() ? "root=" + options_.store->root() : put.ToString());
  bool any_installed = false;
  for (auto& [b, cell] : armed) {
    const bool installed = InstallMinted(*b, cell, job->key, ref, adopt_start);
    // The census of a partial cell, as at boot: which declared classes serve eager, and why.
    if (installed) {
      SayCoverage(options_.events, b->spec, job->key, ref, cell->entries(),
                  admitted->metadata.gaps);
    }
    any_installed = installed || any_installed;
  }
  Emit(event_kind::kMintPhases, "minted", child.ms, job->key, ref, first.spec.name,
       MintPhasesDetail(report) + " child_wall=" + std::to_string(static_cast<int64_t>(child.ms)) +
           " adopt=" + std::to_string(static_cast<int64_t>(MsSince(adopt_start))) +
           " frames=" + std::to_string(child.frames) + " attempts=" + std::to_string(attempts) +
           " peak_rss_kb=" + std::to_string(report.peak_rss_kb),
       PhaseStages(report));
  // The bound is kept once the new cell serves (it is never its own victim).
  if (put.ok() && any_installed && options_.keeper != nullptr) options_.keeper->Armed(job->key);
  std::error_code ec;
  std::filesystem::remove_all(job->dir, ec);
  // 5. Publish in the background (readiness never waits for it).
  if (put.ok() && options_.publisher != nullptr) {
    options_.publisher->EnqueuePublish(job->key, first.spec.name, first.spec.export_spec->family,
                                       job->lease);
  }
}

void Minter::RunIntake(std::shared_ptr<Job> job) {
  const MintBinding& b = job->bindings.front();
  MintChildOutcome child = RunChild(*job, 1);
  if (child.phase == kMintResourceExhausted && MemoryShortfall(*b.target).empty()) {
    std::error_code ec;
    std::filesystem::remove_all(job->dir, ec);
    child = RunChild(*job, 2);
  }
  const Clock::TimePoint load_start = Clock::Real()->Now();
  auto refuse = [&](const std::string& phase, const std::string& detail) {
    std::error_code ec;
    std::filesystem::remove_all(job->dir, ec);
    b.target->SetArmPending(false);
    Emit(event_kind::kJitCompile, phase, MsSince(job->started), "", "", b.spec.name,
         detail + "; serving eager");
  };
  if (!child.phase.empty()) return refuse(child.phase, child.detail);
  const MintChildReport& report = child.report;
  if (report.lane != "intake" || !report.key.empty()) {
    return refuse(kMintKeyAxisDivergence, "axis=lane child=" + report.lane + " parent=intake");
  }
  auto so = ReadFile(report.artifact);
  if (!so.ok()) return refuse(kMintChildCrashed, so.status().ToString());
  if (CellDigest(*so) != report.digest) {
    return refuse("digest_mismatch", "the child's cell.so does not hash to its report");
  }
  static std::atomic<uint64_t> counter{0};
  auto library = OpenCellBytes(*so, options_.private_dir + "/" + b.spec.name + "-jit-" +
                                        std::to_string(counter.fetch_add(1)));
  if (!library.ok()) return refuse(kMintArmRefused, library.status().ToString());
  // The classes the child compiled, in entry order; a class it could not compile serves eager.
  Envelope compiled;
  for (int64_t c : report.entry_classes) {
    if (c < 0 || static_cast<size_t>(c) >= b.spec.envelope.classes.size()) {
      return refuse(kMintArmRefused, "the child names envelope class " + std::to_string(c) +
                                         " of " + std::to_string(b.spec.envelope.classes.size()));
    }
    compiled.classes.push_back(b.spec.envelope.classes[static_cast<size_t>(c)]);
  }
  auto entries = EntriesFromDescribe((*library)->describe(), compiled);
  if (!entries.ok()) return refuse(kMintArmRefused, entries.status().ToString());
  // A ranged entry must serve a piece of a ranged entry the target declares.
  for (const EntryMetadata& e : *entries) {
    if (!e.ranged) continue;
    bool declared = false;
    for (const RangedEntry& r : b.spec.envelope.ranged) {
      for (const RangedEntry& piece : RangedPieces(r)) declared = declared || piece == *e.ranged;
    }
    if (!declared) {
      return refuse(kMintArmRefused, "the child's entry " + std::to_string(e.index) + " serves " +
                                         DescribeRanged(*e.ranged) +
                                         ", no piece of a declared ranged entry");
    }
  }
  auto weights = b.target->weights();
  auto cell =
      ArmedCell::Arm(*library, *entries, *weights, Lane::kIntake, "", options_.serve_threads);
  if (!cell.ok()) return refuse(kMintArmRefused, cell.status().ToString());
  auto samples = ReadSamples(b.spec.samples);
  if (!samples.ok()) return refuse(kMintArmRefused, samples.status().ToString());
  // The child proved the fence; the gate runs again here, on the live checkpoint.
  StrictProofOptions gate_only;
  gate_only.fence = false;
  auto proof = ProveStrict(**cell, b.target->interpreter(), *weights,
                           ThresholdsFor(b.spec.numerics), CellArtifacts{}, *samples, gate_only);
  if (!proof.ok()) return refuse(kRefusalNumerics, proof.status().ToString());
  std::shared_ptr<ArmedCell> shared(std::move(cell).value());
  Status installed = b.target->InstallCell(shared);
  b.target->SetArmPending(false);
  if (!installed.ok()) return refuse(kMintArmRefused, installed.ToString());
  std::error_code ec;
  std::filesystem::remove_all(job->dir, ec);
  Emit(event_kind::kJitCompile, "compiled", MsSince(job->started), "", "", b.spec.name,
       "classes=" + std::to_string(compiled.classes.size()) + "/" +
           std::to_string(b.spec.envelope.classes.size()) + " " + MintPhasesDetail(report) +
           " load_and_gate=" + std::to_string(static_cast<int64_t>(MsSince(load_start))) +
           " gate=\"" + proof->gate.Summary() + "\" nothing keyed, stored or published");
}

}  // namespace kiln
