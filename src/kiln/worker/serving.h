// The serving wrapper: one ServedTarget per target decides, per request, whether a cell or the
// eager interpreter answers, and says which on the wire (worker layer; docs/design.md §2 laws
// 7-11, §4 Request, §12 "Serving details").
//
// Serve runs in exactly this order:
//   1. operator eager-only order (atomic, read on every call) -> eager, `operator_eager_only`
//   2. mandatory target with no armed cell -> retryable refusal `required_compile_missing`
//      (ResourceExhausted; never eager)
//   3. revoked cell (or none) -> eager with the eager posture token (`compiled_degraded`, ...)
//   4. ingress: exactly one entry admits, else eager with `out_of_envelope` naming the closest
//      entry's first mismatch, or `entry_not_compiled` when the inputs are a declared class the
//      cell carries no entry for (partial coverage); the cell stays armed (law 8); an
//      `ingress_refused` row
//   5. run the entry: a cell fault -> this request eager, the cell revoked for the process life,
//      a `serve_degrade` row (law 7); allocation failure -> eager, still armed, a `cell_oom` row;
//      the request's values refused by the cell (`request_too_large`) -> that refusal, still
//      armed (the request's fault, not the cell's)
//   6. success -> `aot_cell` (exported-lane cell, served_cell_ref = its ref) or `jit_cell`
//      (intake-lane cell, no ref). The lane is read off the ArmedCell (law 9).
// A mandatory target never answers eager except under the operator's order (step 1, which
// overrides every lane policy): where an optional target would fall back (steps 4-5), a
// mandatory one refuses instead (out of envelope: InvalidArgument `out_of_envelope`; a fault or
// allocation failure: retryable, `required_compile_missing` / `cell_oom`).
//
// Memory: each request gets its own MemoryBudget of `request_memory_bytes`
// (tensor/memory_budget.h), charged by eager and by the cell's dynamic regions alike; a request
// whose values ask for more (ConstantOfShape of [2^40], a Range to 2^61) is refused
// `request_too_large` (InvalidArgument) naming the node, the shape and the bound, before the tensor
// exists, and no cell is revoked.
//
// Crash containment (crash_guard.h): with a CrashGuard, an exported cell's first call in this
// process runs alone, between a durable crash marker written before it and removed after it; a
// call that returned outputs proves the cell for the rest of the process, and requests that
// arrive meanwhile wait for it. A cell whose ref is crash-quarantined on this machine never
// installs (posture `cell_crashed`).
//
// Concurrency: Serve may be called from many threads at once; the target's lock is held only to
// take a snapshot (cell, interpreter, weights), never around a run (the first call's own lock,
// above, is held around that one run). Swapping a checkpoint waits
// for runs already inside the cell and then rebinds it; the cell keeps serving.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "src/kiln/arm/loader.h"
#include "src/kiln/base/status.h"
#include "src/kiln/eager/interpreter.h"
#include "src/kiln/graph/checkpoint.h"
#include "src/kiln/graph/ir.h"
#include "src/kiln/manifest/manifest.h"
#include "src/kiln/worker/crash_guard.h"
#include "src/kiln/worker/events.h"

namespace kiln {

// `serving_mode` on the wire.
inline constexpr const char* kServingAotCell = "aot_cell";
inline constexpr const char* kServingJitCell = "jit_cell";
inline constexpr const char* kServingEager = "eager";

// Eager posture tokens, highest precedence first (docs/design.md "Serving details"):
// mint_in_progress > stored token > cell_crashed > compiled_degraded > no_compile_declared >
// arm_pending > uncompiled (cell_crashed: crash_guard.h). The operator's order overrides them all
// with operator_eager_only (not a fallback).
inline constexpr const char* kPostureOperatorEagerOnly = "operator_eager_only";
// The hub's orders (docs/fleet.md "Hub orders"): `eager` for (release, target), which overrides
// every lane policy as the operator's order does; and a pin or canary whose ref is not armed yet.
inline constexpr const char* kPostureHubOrderEager = "hub_order_eager";
inline constexpr const char* kPostureHubOrderPending = "hub_order_pending";
inline constexpr const char* kPostureMintInProgress = "mint_in_progress";
inline constexpr const char* kPostureCompiledDegraded = "compiled_degraded";
inline constexpr const char* kPostureNoCompileDeclared = "no_compile_declared";
inline constexpr const char* kPostureArmPending = "arm_pending";
inline constexpr const char* kPostureUncompiled = "uncompiled";

// Per-request fallback reasons: a cell was installed and armed but did not answer this request.
// The first three are the cell's own run refusals (arm/loader.h), named on the wire as they are.
inline constexpr const char* kFallbackOutOfEnvelope = kOutOfEnvelope;
inline constexpr const char* kFallbackCellFault = kCellFault;
inline constexpr const char* kFallbackCellOom = kCellOom;
inline constexpr const char* kFallbackGuardMiss = "guard_miss";
// The inputs are a class the target declares but its cell does not carry (the class did not
// compile): served eager, even on a mandatory lane, since only a target whose coverage allows
// partial cells arms one (ServedTargetOptions::allow_partial).
inline constexpr const char* kFallbackEntryNotCompiled = "entry_not_compiled";
// InstallCell's refusal of a cell lacking declared entries when the target requires full
// coverage (a mandatory lane by default; manifest `coverage`).
inline constexpr const char* kCoverageIncomplete = "coverage_incomplete";
// Ingress against the declared envelope when it has ranged entries (docs/design.md "Ranged
// entries"), whatever serves the request:
//   declared_range_exceeded  the inputs are a ranged entry's but a symbol's value is outside its
//                            range: eager on an optional lane, refused (400) on a mandatory one;
//                            a cell stays armed
//   symbol_inconsistent      one symbol takes two values across the inputs: refused (400) on
//                            every lane, the request breaks the entry's own contract
//   entry_ambiguous          two declared entries (or two cell entries) admit the request: eager
//                            on an optional lane, refused on a mandatory one
inline constexpr const char* kFallbackDeclaredRangeExceeded = "declared_range_exceeded";
inline constexpr const char* kRefusalSymbolInconsistent = "symbol_inconsistent";
inline constexpr const char* kFallbackEntryAmbiguous = kEntryAmbiguous;

// The declared classes no entry of `entries` carries (each entry's shape_class compared
// exactly), in declaration order.
std::vector<ShapeClass> UncoveredClasses(const Envelope& declared,
                                         const std::vector<EntryMetadata>& entries);

// How much of a declared envelope a cell's entries carry: the classes some entry carries, out of
// every declared entry (a ranged entry is carried when each of its pieces is an entry), and the
// missing ones in words ("{x=[4,64]},{ids=[batch,seq] batch=[1,8];seq=[1,256]}").
struct Coverage {
  size_t compiled = 0;
  size_t declared = 0;
  std::string missing;
  bool full() const { return compiled == declared; }
  std::string Fraction() const { return std::to_string(compiled) + "/" + std::to_string(declared); }
};
Coverage CoverageOf(const Envelope& declared, const std::vector<EntryMetadata>& entries);

// The retryable refusal of a mandatory target without an armed cell (law 11).
inline constexpr const char* kRefusalRequiredCompileMissing = "required_compile_missing";
// A mandatory target that declares no export can never have a cell: the worker refuses to boot.
inline constexpr const char* kRefusalMandatoryLaneNeedsACell = "mandatory_lane_needs_a_cell";
// A mandatory target whose cell faulted again after every re-mint it was allowed: no cell will arm
// in this process, so the refusal is not retryable.
inline constexpr const char* kRefusalCellLost = "cell_lost";
// The eager posture while the revocation list is stale under the `eager` policy
// (worker/revocations.h).
inline constexpr const char* kPostureRevocationsStale = "revocations_stale";

// True when `status` is a refusal the client should retry (HTTP 503 + Retry-After): it is
// ResourceExhausted and its token is `required_compile_missing` or `cell_oom`.
bool IsRetryableServeRefusal(const Status& status);

struct ServeResult {
  TensorMap outputs;
  std::string serving_mode;     // kServingAotCell | kServingJitCell | kServingEager
  std::string served_cell_ref;  // key@digest when aot_cell; "" otherwise
  // "" when a cell answered. When eager: a fallback reason (out_of_envelope, cell_fault,
  // cell_oom), or the eager posture token (operator_eager_only, compiled_degraded, ...).
  std::string fallback_reason;
  std::string fallback_detail;  // prose: the closest entry's first mismatch, the fault
  double duration_ms = 0;       // the whole Serve call
};

struct ServedTargetOptions {
  std::string name;  // the target's name (events, messages)
  LanePolicy lane_policy = LanePolicy::kOptional;
  bool intake = false;           // no export declaration: cells for it are compiled here
  bool compile_declared = true;  // false: a target that never gets a cell (posture
                                 // no_compile_declared)
  EventLog* events = nullptr;    // not owned; must outlive the target; null = no rows
  // A mandatory target whose cell faults asks for a re-mint (SetOnCellLost) at most this many
  // times in the process; after that it refuses with `cell_lost`.
  int max_remints = 2;
  // The bytes one request's tensors may hold at once (inputs and weights aside); 0 = unbounded
  // (sizes are still checked against int64). The worker sets it from --request-memory-mb /
  // endpoint.request_memory_mb, or DefaultRequestMemoryBytes.
  int64_t request_memory_bytes = 0;
  // Not owned; must outlive the target. null = no crash markers and no crash quarantine.
  CrashGuard* crash_guard = nullptr;
  // The declared envelope (empty = not known here: no coverage check, no entry_not_compiled),
  // and whether a cell lacking some of its classes may install (TargetSpec::coverage).
  Envelope envelope;
  bool allow_partial = true;
};

class ServedTarget {
 public:
  // Prepares the eager interpreter for `graph` and binds `weights` (the full weight map, e.g.
  // from LoadCheckpoint) as the target's checkpoint. No cell is installed yet.
  static Result<std::unique_ptr<ServedTarget>> Create(ServedTargetOptions options,
                                                      std::shared_ptr<const Graph> graph,
                                                      WeightMap weights);
  ServedTarget(const ServedTarget&) = delete;
  ServedTarget& operator=(const ServedTarget&) = delete;

  // Answers one request for function `fn` (a model name, for events). Errors: the refusals above,
  // or the eager interpreter's own (a request whose inputs fit neither a cell nor the graph).
  Result<ServeResult> Serve(const TensorMap& inputs, const std::string& fn);

  // Installs an armed cell (the last step of every adopt route). REQUIRES: it was armed with this
  // target's graph and its current checkpoint. Refused, with message `compiled_degraded: ...`
  // and posture compiled_degraded: a revoked cell, one whose ref this process quarantined after
  // revoking it (law 10: a revoked cell installs no target), or one whose digest the hub revoked.
  // Replaces an installed cell. `reproven`: the bytes were just minted here and passed the strict
  // gate and the fence proof again on this target (a mandatory target's re-mint after a fault);
  // such a cell lifts its ref's fault quarantine, never a hub revocation. Refused `cell_crashed`
  // (posture cell_crashed, `reproven` or not: a proof is no evidence against a crash on a real
  // request) when its ref is crash-quarantined on this machine.
  Status InstallCell(std::shared_ptr<ArmedCell> cell, bool reproven = false);

  // The declared-envelope ingress of an envelope with ranged entries: one of the tokens above
  // (kRefusalSymbolInconsistent, kFallbackDeclaredRangeExceeded, kFallbackEntryAmbiguous) with
  // `why` naming the entry, the symbol, the value and the range; nullptr when exactly one declared
  // entry admits the request, or none comes close (left to the cell's own ingress).
  const char* DeclaredIngress(const TensorMap& inputs, std::string* why) const;

  // The hub revoked `digest`: an installed cell with it is revoked for the process life and
  // removed (posture compiled_degraded, a `cell_revoked` row with phase `hub_revoked`), and no
  // cell with it installs again. Returns the ref de-armed, or "" when none was installed.
  std::string RevokeByDigest(const std::string& digest, const std::string& reason);
  // The hub lifted its revocation of `digest` (an admin reinstated it): a cell with it may
  // install again (a fresh adoption: the revoked ArmedCell object itself never runs again). A
  // quarantine this process added for a fault of its own stays. Returns whether the target held
  // the digest blocked.
  bool LiftHubRevocation(const std::string& digest);
  // The revocation list is stale under the `eager` policy: while on, every request is served
  // eager with posture `revocations_stale` (a mandatory target refuses retryably); the cell stays
  // armed and serves again when it is lifted.
  void SetRevocationHold(bool on);
  // Called (on the serving thread, outside every lock) when a mandatory target's cell faulted and
  // a re-mint is allowed (ServedTargetOptions::max_remints).
  void SetOnCellLost(std::function<void(const std::string& ref)> on_lost);

  // The operator's eager-only order: on serves eager with `operator_eager_only` on every later
  // call; off returns to the cell, if one is still armed. Never resurrects a revoked cell.
  // The boot and the minter arm nothing while the order holds (boot.h step 1); a cell installed
  // under it anyway (one already armed when the order came stays armed) is reported as
  // `operator_eager_only`, never `aot_cell`: telemetry says what serves.
  void SetEagerOnly(bool on, const std::string& reason);
  // Called after every SetEagerOnly (outside the target's lock): the worker persists the order
  // and, on a lift, adopts again. Set once, before serving.
  void SetOnEagerOnlyChanged(std::function<void(bool on, const std::string& reason)> changed);

  // The hub's order for this target as it applies to this worker: `eager` serves every request
  // eager (posture hub_order_eager, over every lane policy) and arms nothing; otherwise
  // `wanted_ref` ("" = auto) is the one cell that may serve: until it is installed the target
  // serves eager (posture hub_order_pending, or the refusal its adoption stored). The worker
  // adopts the wanted cell (adoption.h ApplyOrder).
  void SetHubOrder(bool eager, const std::string& wanted_ref, const std::string& reason);
  std::string wanted_ref() const;
  bool hub_eager() const { return hub_eager_.load(); }
  // Arming is held: the operator's eager-only order or the hub's eager order (boot.h step 1).
  bool arming_held() const { return eager_only_.load() || hub_eager_.load(); }
  bool eager_only() const { return eager_only_.load(); }

  // Swaps the target's checkpoint: `checkpoint` must name exactly the weights of the current one,
  // each with the same dtype and shape (InvalidArgument names the first difference). Rebinds the
  // installed cell (it keeps serving) and swaps the eager weights.
  Status SwapCheckpoint(WeightMap checkpoint);

  // What the next plain request would be served as: `aot_cell` / `jit_cell` when a cell is armed,
  // else the eager posture token (operator_eager_only overriding all).
  std::string Posture() const;

  // Posture inputs set by the boot routes and the mint driver (see the precedence above).
  void SetMintInProgress(bool on);
  void SetStoredPosture(const std::string& token);  // "" clears
  void SetArmPending(bool on);

  // The installed cell (null when none, or after it was revoked).
  std::shared_ptr<ArmedCell> cell() const;
  // The cell this target held when it was revoked (law 9: the target still says that it held an
  // exported cell, now revoked); null when none was revoked.
  std::shared_ptr<ArmedCell> revoked_cell() const;
  // The live checkpoint (what a swap replaced last) and the eager oracle: what the mint driver
  // proves a minted cell against before it installs it.
  std::shared_ptr<const WeightMap> weights() const;
  const Interpreter& interpreter() const { return interpreter_; }
  const std::shared_ptr<const Graph>& graph() const { return graph_; }
  const std::string& name() const { return options_.name; }
  LanePolicy lane_policy() const { return options_.lane_policy; }
  bool intake() const { return options_.intake; }

  // TEST ONLY: consulted right before an admitted request enters the cell; a result of
  // kCellFault or kCellOom (arm/loader.h) is treated as if the cell's run had failed with that
  // token, without running it; "" runs the cell. Production code never sets it. nullptr clears.
  void SetRunFaultForTest(std::function<std::string()> fault);

 private:
  struct Snapshot {
    std::shared_ptr<ArmedCell> cell;
    std::shared_ptr<const WeightMap> weights;
    std::string wanted_ref;  // the hub's pin or canary ref ("" = auto)
    std::string pending;     // the posture while wanted_ref is not the installed cell
  };
  ServedTarget(ServedTargetOptions options, std::shared_ptr<const Graph> graph,
               Interpreter interpreter, WeightMap weights);

  Snapshot Take() const;
  // The eager posture token by precedence (no operator order). REQUIRES: mu_ held.
  std::string EagerPostureLocked() const;
  // Revokes `cell` for cause: sticky, quarantined, removed from the target.
  void RevokeForCause(const std::shared_ptr<ArmedCell>& cell, const std::string& reason);
  Result<TensorMap> RunEager(const TensorMap& inputs, const Snapshot& snap,
                             const std::shared_ptr<MemoryBudget>& budget) const;
  // Runs `entry` of `cell`, or fails it as the test hook says.
  Result<TensorMap> RunCell(const ArmedCell& cell, int entry, const TensorMap& inputs,
                            const std::shared_ptr<MemoryBudget>& budget) const;
  // RunCell, and for a cell not yet proven in this process, its first call alone between the
  // crash guard's marker and its removal (see the header comment).
  Result<TensorMap> RunGuarded(const ArmedCell& cell, int entry, const TensorMap& inputs,
                               const std::shared_ptr<MemoryBudget>& budget);
  bool Proven(const std::string& ref) const;
  // Every request a cell does not answer ends here, with its reason (a per-request fallback
  // reason or an eager posture token): served eager, or, for a mandatory target, refused with
  // that reason's refusal (law 11). The operator's order is served eager on every lane. After a
  // cell fault a mandatory target asks for a re-mint while it may.
  Result<ServeResult> FallBack(const TensorMap& inputs, const Snapshot& snap, const std::string& fn,
                               const std::string& reason, const std::string& detail,
                               const std::shared_ptr<MemoryBudget>& budget);
  // The retryable refusal of a mandatory target without an armed cell, saying why.
  Status RefuseMissing(const std::string& why) const;
  // The eager posture token by precedence (no operator order); takes mu_.
  std::string PostureToken() const;
  // Fills an eager result; emits serve_eager_posture when the posture token changed.
  Result<ServeResult> ServeEager(const TensorMap& inputs, const Snapshot& snap,
                                 const std::string& reason, const std::string& detail,
                                 const std::string& fn, bool posture,
                                 const std::shared_ptr<MemoryBudget>& budget);
  void Emit(const char* kind, const std::string& phase, double ms, const std::string& ref,
            const std::string& fn, const std::string& detail);

  const ServedTargetOptions options_;
  const std::shared_ptr<const Graph> graph_;
  const Interpreter interpreter_;

  std::atomic<bool> eager_only_{false};
  std::atomic<bool> revocation_hold_{false};
  std::atomic<bool> has_fault_hook_{false};

  mutable std::mutex mu_;
  std::shared_ptr<ArmedCell> cell_;
  std::shared_ptr<ArmedCell> revoked_cell_;
  std::set<std::string> quarantined_refs_;     // revoked after a fault
  std::set<std::string> hub_revoked_digests_;  // not installed again until the hub lifts them
  std::set<std::string> hub_revoked_refs_;     // quarantined because the hub revoked them
  std::function<void(bool, const std::string&)> on_eager_only_changed_;
  std::atomic<bool> hub_eager_{false};
  std::string wanted_ref_;  // under mu_: the hub's pin or canary ref for this worker
  std::string hub_order_reason_;
  int remints_left_ = 0;
  bool cell_lost_ = false;
  std::function<void(const std::string&)> on_cell_lost_;
  std::shared_ptr<const WeightMap> weights_;
  std::string eager_only_reason_;
  bool mint_in_progress_ = false;
  std::string stored_posture_;
  bool compiled_degraded_ = false;
  bool crashed_ = false;  // a crash-quarantined cell was refused at install
  bool arm_pending_ = false;
  std::string last_posture_emitted_;
  std::function<std::string()> fault_hook_;
  std::set<std::string> proven_refs_;  // a call returned outputs in this process

  std::mutex first_call_mu_;  // held around an unproven cell's first call only

  std::mutex swap_mu_;  // one checkpoint swap at a time
};

}  // namespace kiln
