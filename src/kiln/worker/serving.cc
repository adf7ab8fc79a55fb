// The serving wrapper: per-request cell-or-eager decisions, revocation, the operator's order and
// checkpoint swaps for one target (worker layer; see serving.h for the order and the laws).
#include "src/kiln/worker/serving.h"

#include <chrono>
#include <utility>

#include "src/kiln/base/clock.h"

namespace kiln {
namespace {

std::string KeyOfRef(const std::string& ref) { return ref.substr(0, ref.find('@')); }

const char* ModeOf(const ArmedCell& cell) {
  return cell.lane() == Lane::kExported ? kServingAotCell : kServingJitCell;
}

}  // namespace

bool IsRetryableServeRefusal(const Status& status) {
  return status.code() == StatusCode::kResourceExhausted &&
         (status.Is(kRefusalRequiredCompileMissing) || status.Is(kFallbackCellOom));
}

ServedTarget::ServedTarget(ServedTargetOptions options, std::shared_ptr<const Graph> graph,
                           Interpreter interpreter, WeightMap weights)
    : options_(std::move(options)),
      graph_(std::move(graph)),
      interpreter_(std::move(interpreter)),
      remints_left_(options_.max_remints),
      weights_(std::make_shared<const WeightMap>(std::move(weights))) {}

Result<std::unique_ptr<ServedTarget>> ServedTarget::Create(ServedTargetOptions options,
                                                           std::shared_ptr<const Graph> graph,
                                                           WeightMap weights) {
  if (!graph) return Status::InvalidArgument("target '" + options.name + "': no graph");
  KILN_ASSIGN_OR_RETURN(Interpreter interpreter, Interpreter::Create(graph));
  return std::unique_ptr<ServedTarget>(new ServedTarget(
      std::move(options), std::move(graph), std::move(interpreter), std::move(weights)));
}

ServedTarget::Snapshot ServedTarget::Take() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (wanted_ref_.empty()) return Snapshot{cell_, weights_, "", ""};
  return Snapshot{cell_, weights_, wanted_ref_,
                  stored_posture_.empty() ? kPostureHubOrderPending : stored_posture_};
}

std::string ServedTarget::EagerPostureLocked() const {
  if (mint_in_progress_) return kPostureMintInProgress;
  if (!stored_posture_.empty()) return stored_posture_;
  if (crashed_) return kCellCrashed;
  if (compiled_degraded_ || (cell_ && cell_->revoked())) return kPostureCompiledDegraded;
  if (!options_.compile_declared) return kPostureNoCompileDeclared;
  if (arm_pending_) return kPostureArmPending;
  return kPostureUncompiled;
}

std::string ServedTarget::Posture() const {
  if (eager_only_.load()) return kPostureOperatorEagerOnly;
  if (hub_eager_.load()) return kPostureHubOrderEager;
  if (revocation_hold_.load()) return kPostureRevocationsStale;
  std::lock_guard<std::mutex> lock(mu_);
  if (!wanted_ref_.empty() && (!cell_ || cell_->ref() != wanted_ref_)) {
    return stored_posture_.empty() ? kPostureHubOrderPending : stored_posture_;
  }
  if (cell_ && !cell_->revoked()) return ModeOf(*cell_);
  return EagerPostureLocked();
}

void ServedTarget::Emit(const char* kind, const std::string& phase, double ms,
                        const std::string& ref, const std::string& fn, const std::string& detail) {
  if (!options_.events) return;
  EventRow row;
  row.kind = kind;
  row.phase = phase;
  row.duration_ms = ms;
  row.ref = ref;
  row.key = KeyOfRef(ref);
  row.fn = fn;
  row.target = options_.name;
  row.detail = "target=" + options_.name;
  if (!fn.empty()) row.detail += " fn=" + fn;
  if (!row.key.empty()) row.detail += " key=" + row.key;
  if (!detail.empty()) row.detail += " " + detail;
  options_.events->Append(std::move(row));
}

void ServedTarget::RevokeForCause(const std::shared_ptr<ArmedCell>& cell,
                                  const std::string& reason) {
  cell->Revoke(reason);  // sticky inside the object: it never runs again
  std::lock_guard<std::mutex> lock(mu_);
  if (cell_ == cell) cell_.reset();
  revoked_cell_ = cell;
  if (!cell->ref().empty()) quarantined_refs_.insert(cell->ref());
  compiled_degraded_ = true;
}

Result<TensorMap> ServedTarget::RunEager(const TensorMap& inputs, const Snapshot& snap,
                                         const std::shared_ptr<MemoryBudget>& budget) const {
  return interpreter_.Run(inputs, snap.weights.get(), nullptr, budget);
}

Result<ServeResult> ServedTarget::ServeEager(const TensorMap& inputs, const Snapshot& snap,
                                             const std::string& reason, const std::string& detail,
                                             const std::string& fn, bool posture,
                                             const std::shared_ptr<MemoryBudget>& budget) {
  if (posture) {
    bool changed = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (last_posture_emitted_ != reason) {
        last_posture_emitted_ = reason;
        changed = true;
      }
    }
    if (changed) Emit(event_kind::kServeEagerPosture, reason, 0, "", fn, detail);
  }
  KILN_ASSIGN_OR_RETURN(TensorMap outputs, RunEager(inputs, snap, budget));
  ServeResult r;
  r.outputs = std::move(outputs);
  r.serving_mode = kServingEager;
  r.fallback_reason = reason;
  r.fallback_detail = detail;
  return r;
}

Result<ServeResult> ServedTarget::FallBack(const TensorMap& inputs, const Snapshot& snap,
                                           const std::string& fn, const std::string& reason,
                                           const std::string& detail,
                                           const std::shared_ptr<MemoryBudget>& budget) {
  // The operator's order overrides every lane policy; every other reason leaves a mandatory
  // target nothing to answer with (law 11).
  // A declared class the armed cell lacks reaches here only when the target accepted a partial
  // cell (InstallCell), so the manifest allowed eager for it.
  if (reason == kPostureOperatorEagerOnly || reason == kPostureHubOrderEager ||
      reason == kFallbackEntryNotCompiled || options_.lane_policy != LanePolicy::kMandatory) {
    // A per-request reason is said by its own row; a posture token by serve_eager_posture when
    // it changes.
    const bool posture = reason != kPostureOperatorEagerOnly && reason != kFallbackOutOfEnvelope &&
                         reason != kFallbackCellFault && reason != kFallbackCellOom &&
                         reason != kFallbackEntryNotCompiled &&
                         reason != kFallbackDeclaredRangeExceeded &&
                         reason != kFallbackEntryAmbiguous;
    return ServeEager(inputs, snap, reason, detail, fn, posture, budget);
  }
  const std::string target = "target '" + options_.name + "'";
  if (reason == kFallbackOutOfEnvelope || reason == kFallbackDeclaredRangeExceeded ||
      reason == kFallbackEntryAmbiguous) {
    return Status::Refused(StatusCode::kInvalidArgument, reason,
                           target + " has a mandatory lane: " + detail);
  }
  if (reason == kFallbackCellOom) {
    return Status::Refused(StatusCode::kResourceExhausted, kFallbackCellOom,
                           target + ": " + detail + "; retry later");
  }
  if (reason == kPostureRevocationsStale) {
    return Status::Refused(StatusCode::kResourceExhausted, kRefusalRequiredCompileMissing,
                           target +
                               " has a mandatory lane and the hub's revocation list is stale; "
                               "retry later");
  }
  // No armed cell: after a fault, a re-mint if one is left; else a retryable refusal, unless
  // this target already lost its cell for good.
  std::function<void(const std::string&)> remint;
  bool lost = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (reason == kFallbackCellFault && on_cell_lost_) {
      if (remints_left_ > 0) {
        --remints_left_;
        remint = on_cell_lost_;
      } else {
        cell_lost_ = true;
      }
    }
    lost = cell_lost_;
  }
  if (remint) {
    // Without a cell a mandatory target can only refuse: mint the key again (the bytes are
    // proven afresh before they arm) rather than refuse forever.
    remint(snap.cell ? snap.cell->ref() : "");
    return RefuseMissing(std::string(kFallbackCellFault) + ": " + detail + "; re-minting");
  }
  if (lost) {
    return Status::Refused(
        StatusCode::kInternal, kRefusalCellLost,
        reason == kFallbackCellFault
            ? target + ": its cell faulted (" + detail +
                  ") and no re-mint is left; no cell will arm in this process"
            : target + " has a mandatory lane and its cell faulted after every re-mint allowed (" +
                  std::to_string(options_.max_remints) + "); no cell will arm in this process");
  }
  // Without a re-mint hook (nothing here can mint) another route may still install a cell, so
  // the refusal stays retryable.
  return RefuseMissing(
      reason == kFallbackCellFault ? std::string(kFallbackCellFault) + ": " + detail : reason);
}

Status ServedTarget::RefuseMissing(const std::string& why) const {
  return Status::Refused(StatusCode::kResourceExhausted, kRefusalRequiredCompileMissing,
                         "target '" + options_.name + "' has a mandatory lane and no armed cell (" +
                             why + "); retry later");
}

std::string ServedTarget::PostureToken() const {
  std::lock_guard<std::mutex> lock(mu_);
  return EagerPostureLocked();
}

Result<TensorMap> ServedTarget::RunCell(const ArmedCell& cell, int entry, const TensorMap& inputs,
                                        const std::shared_ptr<MemoryBudget>& budget) const {
  if (has_fault_hook_.load()) {
    std::function<std::string()> hook;
    {
      std::lock_guard<std::mutex> lock(mu_);
      hook = fault_hook_;
    }
    const std::string token = hook ? hook() : "";
    if (token == kCellFault) {
      return Status::Refused(StatusCode::kInternal, kCellFault, "injected by the test switch");
    }
    if (token == kCellOom) {
      return Status::Refused(StatusCode::kResourceExhausted, kCellOom,
                             "injected allocation failure (test switch)");
    }
  }
  return cell.Run(entry, inputs, budget);
}

bool ServedTarget::Proven(const std::string& ref) const {
  std::lock_guard<std::mutex> lock(mu_);
  return proven_refs_.count(ref) != 0;
}

Result<TensorMap> ServedTarget::RunGuarded(const ArmedCell& cell, int entry,
                                           const TensorMap& inputs,
                                           const std::shared_ptr<MemoryBudget>& budget) {
  const std::string& ref = cell.ref();
  CrashGuard* guard = options_.crash_guard;
  if (guard == nullptr || ref.empty() || Proven(ref)) return RunCell(cell, entry, inputs, budget);
  // The first call runs alone: a request arriving meanwhile waits, then finds the cell proven
  // (or runs the next first call itself when this one returned no outputs).
  std::lock_guard<std::mutex> first(first_call_mu_);
  if (Proven(ref)) return RunCell(cell, entry, inputs, budget);
  if (Status armed = guard->Arm(ref, options_.name); !armed.ok()) {
    // Serving goes on: a full disk must not take the cell away, but this call is unguarded.
    Emit(event_kind::kServePosture, kCrashMarkerUnwritten, 0, ref, "", armed.ToString());
  }
  Result<TensorMap> out = RunCell(cell, entry, inputs, budget);
  // The call returned: whatever it answered, the process did not die inside it.
  guard->Disarm(ref, options_.name);
  if (out.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    proven_refs_.insert(ref);
  }
  return out;
}

Result<ServeResult> ServedTarget::Serve(const TensorMap& inputs, const std::string& fn) {
  const Clock::TimePoint start = Clock::Real()->Now();
  auto done = [&](Result<ServeResult> r) {
    if (r.ok()) r->duration_ms = MsSince(start);
    return r;
  };
  Snapshot snap = Take();
  // This request's memory: one budget for whichever of the cell and eager runs it.
  const std::shared_ptr<MemoryBudget> budget =
      options_.request_memory_bytes > 0
          ? std::make_shared<MemoryBudget>(options_.request_memory_bytes)
          : nullptr;

  // 1. The operator's order, read on every call; it overrides every lane policy.
  if (eager_only_.load()) {
    std::string why;
    {
      std::lock_guard<std::mutex> lock(mu_);
      why = eager_only_reason_;
    }
    return done(FallBack(inputs, snap, fn, kPostureOperatorEagerOnly, why, budget));
  }
  // The hub's orders (docs/fleet.md "Hub orders"): `eager` overrides every lane policy as the
  // operator's does; a pin or canary serves exactly its ref, eager until that cell is armed.
  if (hub_eager_.load()) {
    std::string why;
    {
      std::lock_guard<std::mutex> lock(mu_);
      why = hub_order_reason_;
    }
    return done(FallBack(inputs, snap, fn, kPostureHubOrderEager, why, budget));
  }
  if (!snap.wanted_ref.empty() && (!snap.cell || snap.cell->ref() != snap.wanted_ref)) {
    return done(FallBack(inputs, snap, fn, snap.pending, "ordered " + snap.wanted_ref, budget));
  }
  // The revocation list is stale and the policy says eager: the cell stays armed, unused.
  if (revocation_hold_.load()) {
    return done(FallBack(inputs, snap, fn, kPostureRevocationsStale, "", budget));
  }
  // A cell revoked behind the target's back (by its own Run racing us, or by a caller) is
  // removed here so the posture says compiled_degraded from now on.
  if (snap.cell && snap.cell->revoked()) {
    RevokeForCause(snap.cell, kRefusalRevoked);  // a no-op Revoke: the first reason stays
    snap.cell.reset();
  }
  // Ranged entries: the request is checked against the declared envelope whatever serves it, so
  // a symbol's range or consistency is named even while no cell is armed.
  if (!options_.envelope.ranged.empty()) {
    std::string why;
    const char* token = DeclaredIngress(inputs, &why);
    if (token == kRefusalSymbolInconsistent) {
      Emit(event_kind::kIngressRefused, token, 0, snap.cell ? snap.cell->ref() : "", fn, why);
      return Status::Refused(StatusCode::kInvalidArgument, kRefusalSymbolInconsistent,
                             "target '" + options_.name + "': " + why);
    }
    if (token != nullptr) {
      Emit(event_kind::kIngressRefused, token, 0, snap.cell ? snap.cell->ref() : "", fn, why);
      return done(FallBack(inputs, snap, fn, token, why, budget));
    }
  }
  // 2-3. No cell (never installed, or revoked): eager with the posture token, or a mandatory
  // target's refusal (law 11).
  if (!snap.cell) return done(FallBack(inputs, snap, fn, PostureToken(), "", budget));

  ArmedCell& cell = *snap.cell;
  const std::string ref = cell.ref();
  // 4. Ingress: exactly one entry admits, or eager and named (law 8: the cell stays armed).
  std::string mismatch;
  bool ambiguous = false;
  const int entry = cell.Admit(inputs, &mismatch, &ambiguous);
  if (entry < 0 && ambiguous) {
    Emit(event_kind::kIngressRefused, kFallbackEntryAmbiguous, 0, ref, fn, mismatch);
    return done(FallBack(inputs, snap, fn, kFallbackEntryAmbiguous, mismatch, budget));
  }
  if (entry < 0) {
    // Declared but not compiled (partial coverage: a class or a ranged entry the compiler
    // refused) is named apart from undeclared.
    const ShapeClass shapes = ShapesOf(inputs);
    std::string declared;
    for (const ShapeClass& c : options_.envelope.classes) {
      if (c == shapes) declared = "class " + DescribeClasses({c});
    }
    for (const RangedEntry& r : options_.envelope.ranged) {
      if (MatchRanged(r, shapes).fit == RangedFit::kFits) {
        declared = "ranged entry " + DescribeRanged(r);
      }
    }
    if (!declared.empty()) {
      const std::string why =
          declared + " is declared but the cell carries no entry for it (it is not compiled)";
      Emit(event_kind::kIngressRefused, kFallbackEntryNotCompiled, 0, ref, fn, why);
      return done(FallBack(inputs, snap, fn, kFallbackEntryNotCompiled, why, budget));
    }
    Emit(event_kind::kIngressRefused, kFallbackOutOfEnvelope, 0, ref, fn, mismatch);
    return done(FallBack(inputs, snap, fn, kFallbackOutOfEnvelope, mismatch, budget));
  }

  // 5. Run the entry.
  const Clock::TimePoint run_start = Clock::Real()->Now();
  Result<TensorMap> out = RunGuarded(cell, entry, inputs, budget);
  const double run_ms = MsSince(run_start);
  if (out.ok()) {
    // 6. The lane is read off the object (law 9).
    ServeResult r;
    r.outputs = std::move(out).value();
    r.serving_mode = ModeOf(cell);
    r.served_cell_ref = cell.lane() == Lane::kExported ? ref : "";
    return done(std::move(r));
  }
  const Status& failed = out.status();
  const std::string why = failed.message();
  if (failed.Is(kRefusalRequestTooLarge)) {
    // The request asked for more than it may: eager would refuse it the same way, so it is
    // answered now; the cell served nothing wrong and stays armed.
    return failed;
  }
  if (failed.Is(kCellOom)) {
    // Not the cell's fault: stay armed.
    Emit(event_kind::kCellOom, "stay_armed", run_ms, ref, fn,
         "entry=" + std::to_string(entry) + " " + why);
    return done(FallBack(inputs, snap, fn, kFallbackCellOom, why, budget));
  }
  if (failed.Is(kRefusalRevoked)) {
    // Revoked by a concurrent request's fault between our snapshot and the run.
    RevokeForCause(snap.cell, kRefusalRevoked);  // a no-op Revoke: the first reason stays
    return done(FallBack(inputs, snap, fn, PostureToken(), "", budget));
  }
  if (failed.Is(kOutOfEnvelope)) {
    // Admit chose the entry; the cell disagreeing is still not an error (law 8).
    Emit(event_kind::kIngressRefused, kFallbackOutOfEnvelope, 0, ref, fn, why);
    return done(FallBack(inputs, snap, fn, kFallbackOutOfEnvelope, why, budget));
  }
  // The cell's fault (law 7), and any failure without a token: this request eager, the cell
  // revoked for the process life.
  RevokeForCause(snap.cell, why);
  Emit(event_kind::kServeDegrade, kFallbackCellFault, run_ms, ref, fn,
       "entry=" + std::to_string(entry) + " revoked: " + why);
  return done(FallBack(inputs, snap, fn, kFallbackCellFault, why, budget));
}

const char* ServedTarget::DeclaredIngress(const TensorMap& inputs, std::string* why) const {
  const ShapeClass shapes = ShapesOf(inputs);
  std::vector<std::string> fits;
  for (const ShapeClass& c : options_.envelope.classes) {
    if (c == shapes) fits.push_back("class " + DescribeClasses({c}));
  }
  RangedMatch closest;
  std::string closest_entry;
  for (const RangedEntry& r : options_.envelope.ranged) {
    RangedMatch m = MatchRanged(r, shapes);
    if (m.fit == RangedFit::kFits) {
      fits.push_back("ranged entry " + DescribeRanged(r));
    } else if (m.fit < closest.fit) {
      closest = std::move(m);
      closest_entry = DescribeRanged(r);
    }
  }
  if (fits.size() > 1) {
    *why = "declared entries " + fits[0] + " and " + fits[1] + " both admit the request";
    return kFallbackEntryAmbiguous;
  }
  if (!fits.empty()) return nullptr;
  if (closest.fit == RangedFit::kSymbolInconsistent) {
    *why = "ranged entry " + closest_entry + ": " + closest.detail;
    return kRefusalSymbolInconsistent;
  }
  if (closest.fit == RangedFit::kOutOfRange) {
    *why = "ranged entry " + closest_entry + ": " + closest.detail;
    return kFallbackDeclaredRangeExceeded;
  }
  return nullptr;  // undeclared: the cell's ingress names it (out_of_envelope)
}

Coverage CoverageOf(const Envelope& declared, const std::vector<EntryMetadata>& entries) {
  Coverage c;
  const std::vector<ShapeClass> missing = UncoveredClasses(declared, entries);
  c.declared = declared.size();
  c.compiled = declared.classes.size() - missing.size();
  c.missing = DescribeClasses(missing);
  for (const RangedEntry& r : declared.ranged) {
    // Carried when every piece it is compiled as is an entry (graph/shape_class.h RangedPieces).
    bool carried = true;
    for (const RangedEntry& piece : RangedPieces(r)) {
      bool found = false;
      for (const EntryMetadata& e : entries) found = found || (e.ranged && *e.ranged == piece);
      carried = carried && found;
    }
    if (carried) {
      ++c.compiled;
    } else {
      c.missing += (c.missing.empty() ? "" : ",") + DescribeRanged(r);
    }
  }
  return c;
}

std::vector<ShapeClass> UncoveredClasses(const Envelope& declared,
                                         const std::vector<EntryMetadata>& entries) {
  std::vector<ShapeClass> missing;
  for (const ShapeClass& c : declared.classes) {
    bool carried = false;
    for (const EntryMetadata& e : entries) carried = carried || (!e.ranged && e.shape_class == c);
    if (!carried) missing.push_back(c);
  }
  return missing;
}

Status ServedTarget::InstallCell(std::shared_ptr<ArmedCell> cell, bool reproven) {
  if (!cell) return Status::InvalidArgument("target '" + options_.name + "': no cell to install");
  const std::string ref = cell->ref();
  const std::string digest =
      ref.find('@') == std::string::npos ? "" : ref.substr(ref.find('@') + 1);
  std::string refusal;
  const char* token = kPostureCompiledDegraded;
  // Revoke writes its reason under the cell's lock after flipping the flag; a no-op Revoke on a
  // revoked cell waits for that write, so the reason below is safe to read.
  if (cell->revoked()) cell->Revoke(kRefusalRevoked);
  const bool crashed =
      options_.crash_guard != nullptr && !ref.empty() && options_.crash_guard->IsQuarantined(ref);
  if (!options_.allow_partial) {
    // Full coverage required (a mandatory lane by default): a cell lacking a declared entry
    // never arms, so no declared request is ever answered eager (fail closed).
    const Coverage coverage = CoverageOf(options_.envelope, cell->entries());
    if (!coverage.full()) {
      const std::string why =
          "cell " + (ref.empty() ? std::string("(intake)") : ref) + " carries " +
          coverage.Fraction() + " declared entries (missing " + coverage.missing +
          ") and the target requires full coverage (manifest coverage = \"full\")";
      Emit(event_kind::kServePosture, kCoverageIncomplete, 0, ref, "", "not installed: " + why);
      return Status::Refused(StatusCode::kInvalidArgument, kCoverageIncomplete,
                             "target '" + options_.name + "': " + why);
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (cell->revoked()) {
      refusal = "cell " + (ref.empty() ? std::string("(intake)") : ref) + " is revoked (" +
                cell->revoke_reason() + ")";
    } else if (!digest.empty() && hub_revoked_digests_.count(digest) != 0) {
      refusal = "cell " + ref + " was revoked by the hub";
    } else if (crashed) {
      token = kCellCrashed;
      refusal = "cell " + ref +
                " is quarantined on this machine: a worker process died inside its first call";
    } else if (!ref.empty() && quarantined_refs_.count(ref) != 0) {
      if (reproven) {
        quarantined_refs_.erase(ref);  // minted and proven again here: new evidence
      } else {
        refusal = "cell " + ref + " was revoked in this process and stays quarantined";
      }
    }
    if (token == kCellCrashed) {
      crashed_ = true;
    } else if (!refusal.empty()) {
      // Law 10: a revoked cell installs no target; the target reports compiled_degraded.
      compiled_degraded_ = true;
      if (cell->revoked()) revoked_cell_ = cell;
    } else {
      cell_ = cell;
      arm_pending_ = false;
    }
  }
  if (!refusal.empty()) {
    Emit(event_kind::kServePosture, token, 0, ref, "", "not installed: " + refusal);
    return Status::Refused(StatusCode::kInvalidArgument, token,
                           "target '" + options_.name + "': " + refusal);
  }
  // Telemetry says what is served: under the operator's order the installed cell serves nothing
  // until the order is lifted.
  if (eager_only_.load()) {
    Emit(event_kind::kServePosture, kPostureOperatorEagerOnly, 0, ref, "",
         std::string("installed lane=") + LaneName(cell->lane()) +
             "; held by the operator's eager-only order");
  } else {
    Emit(event_kind::kServePosture, ModeOf(*cell), 0, ref, "",
         std::string("installed lane=") + LaneName(cell->lane()));
  }
  return Status::OK();
}

std::string ServedTarget::RevokeByDigest(const std::string& digest, const std::string& reason) {
  std::shared_ptr<ArmedCell> cell;
  {
    std::lock_guard<std::mutex> lock(mu_);
    hub_revoked_digests_.insert(digest);
    const std::string ref = cell_ ? cell_->ref() : "";
    if (cell_ && ref.size() > digest.size() + 1 &&
        ref.compare(ref.size() - digest.size(), digest.size(), digest) == 0 &&
        ref[ref.size() - digest.size() - 1] == '@') {
      cell = cell_;
    }
  }
  if (!cell) return "";
  RevokeForCause(cell, reason);
  {
    std::lock_guard<std::mutex> lock(mu_);
    hub_revoked_refs_.insert(cell->ref());
  }
  Emit(event_kind::kCellRevoked, "hub_revoked", 0, cell->ref(), "", reason);
  return cell->ref();
}

bool ServedTarget::LiftHubRevocation(const std::string& digest) {
  std::lock_guard<std::mutex> lock(mu_);
  const bool held = hub_revoked_digests_.erase(digest) != 0;
  const std::string suffix = "@" + digest;
  for (auto it = hub_revoked_refs_.begin(); it != hub_revoked_refs_.end();) {
    if (it->size() > suffix.size() &&
        it->compare(it->size() - suffix.size(), suffix.size(), suffix) == 0) {
      quarantined_refs_.erase(*it);
      it = hub_revoked_refs_.erase(it);
    } else {
      ++it;
    }
  }
  return held;
}

void ServedTarget::SetRevocationHold(bool on) {
  if (revocation_hold_.exchange(on) == on) return;
  Emit(event_kind::kServePosture, on ? kPostureRevocationsStale : "revocations_fresh", 0, "", "",
       on ? "the hub's revocation list is stale; serving eager until a fresh one arrives" : "");
}

void ServedTarget::SetOnCellLost(std::function<void(const std::string&)> on_lost) {
  std::lock_guard<std::mutex> lock(mu_);
  on_cell_lost_ = std::move(on_lost);
}

void ServedTarget::SetEagerOnly(bool on, const std::string& reason) {
  std::function<void(bool, const std::string&)> changed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    eager_only_reason_ = on ? reason : "";
    eager_only_.store(on);
    changed = on_eager_only_changed_;
  }
  // The release names what is served from now on: the armed cell, or why there is none.
  std::string detail = on ? "" : "serving=" + Posture();
  if (!reason.empty()) detail += (detail.empty() ? "" : " ") + ("reason=" + reason);
  Emit(event_kind::kServePosture, on ? kPostureOperatorEagerOnly : "operator_release", 0, "", "",
       detail);
  if (changed) changed(on, reason);
}

void ServedTarget::SetHubOrder(bool eager, const std::string& wanted_ref,
                               const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    hub_order_reason_ = reason;
    wanted_ref_ = eager ? "" : wanted_ref;
    hub_eager_.store(eager);
  }
  Emit(event_kind::kServePosture, eager ? kPostureHubOrderEager : "hub_order_applied", 0,
       wanted_ref, "", "serving=" + Posture() + (reason.empty() ? "" : " reason=" + reason));
}

std::string ServedTarget::wanted_ref() const {
  std::lock_guard<std::mutex> lock(mu_);
  return wanted_ref_;
}

void ServedTarget::SetOnEagerOnlyChanged(std::function<void(bool, const std::string&)> changed) {
  std::lock_guard<std::mutex> lock(mu_);
  on_eager_only_changed_ = std::move(changed);
}

Status ServedTarget::SwapCheckpoint(WeightMap checkpoint) {
  const Clock::TimePoint start = Clock::Real()->Now();
  std::lock_guard<std::mutex> swap_lock(swap_mu_);
  Snapshot snap = Take();
  const std::string what = "checkpoint swap for target '" + options_.name + "'";
  for (const auto& [name, w] : *snap.weights) {
    auto it = checkpoint.find(name);
    if (it == checkpoint.end()) {
      return Status::InvalidArgument(what + ": weight '" + name + "' is missing");
    }
    if (it->second.dtype() != w.dtype() || it->second.shape() != w.shape()) {
      return Status::InvalidArgument(what + ": weight '" + name + "' is " +
                                     it->second.TypeString() + ", the target binds " +
                                     w.TypeString());
    }
  }
  for (const auto& [name, w] : checkpoint) {
    if (snap.weights->count(name) == 0) {
      return Status::InvalidArgument(what + ": weight '" + name +
                                     "' is not a weight of the target's graph");
    }
  }
  auto fresh = std::make_shared<const WeightMap>(std::move(checkpoint));
  // The cell re-binds first (waiting for runs inside it); a failure leaves both bindings as they
  // were. The revoked cell, if any, never runs again and is not re-bound.
  if (snap.cell && !snap.cell->revoked()) {
    Status s = snap.cell->Rebind(*fresh);
    if (!s.ok()) return s.WithContext(what);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    weights_ = fresh;
  }
  Emit(event_kind::kServePosture, "checkpoint_swapped", MsSince(start),
       snap.cell ? snap.cell->ref() : "", "",
       "weights=" + std::to_string(fresh->size()) + (snap.cell ? " cell rebound" : ""));
  return Status::OK();
}

void ServedTarget::SetMintInProgress(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  mint_in_progress_ = on;
}

void ServedTarget::SetStoredPosture(const std::string& token) {
  std::lock_guard<std::mutex> lock(mu_);
  stored_posture_ = token;
}

void ServedTarget::SetArmPending(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  arm_pending_ = on;
}

std::shared_ptr<ArmedCell> ServedTarget::cell() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cell_;
}

std::shared_ptr<const WeightMap> ServedTarget::weights() const {
  std::lock_guard<std::mutex> lock(mu_);
  return weights_;
}

std::shared_ptr<ArmedCell> ServedTarget::revoked_cell() const {
  std::lock_guard<std::mutex> lock(mu_);
  return revoked_cell_;
}

void ServedTarget::SetRunFaultForTest(std::function<std::string()> fault) {
  std::lock_guard<std::mutex> lock(mu_);
  fault_hook_ = std::move(fault);
  has_fault_hook_.store(static_cast<bool>(fault_hook_));
}

}  // namespace kiln
