// Boot-adopt: how one target of a worker adopts an exported cell at boot, from this machine's
// local store or from the hub (worker layer; docs/design.md §4 "Boot (per target)", §2 laws 3,
// 4, 9, 10, 11, §12 "Boot-adopt details").
//
// AdoptAtBoot runs, in exactly this order, and stops at the first step that decides:
//   1. (the operator's eager-only order stops nothing here: every step below runs and the bytes
//      are kept, but step 13 arms nothing while it holds: the outcome is the usual phase with no
//      cell and `held=operator_eager_only` in its detail; the lift adopts again)
//   2. no export declaration (intake lane)          -> nothing adopted `no_export_declaration`
//   3. derive the key (graph digest x envelope x sm x toolchain; nothing is compiled)
//   4. local store hit: admission (bytes, sm, toolchain); its origin: minted here, or adopted
//      from a hub with a receipt that still verifies (steps 6-7 on the stored receipt), else
//      `provenance_unattested`; scope (the cell's family is the target's export family); the
//      source regenerated from this worker's graph (`source_mismatch`); the revocation list
//      (`revoked` ends the boot, and the entry is deleted); a ref crash-quarantined on this
//      machine (crash_guard.h) is refused `cell_crashed`. A local entry refused for any other
//      reason is deleted and the hub is asked. Then load -> install     `local_hit`
//   5. hub resolve of (key, export family): no hub `local_miss_no_hub`; {found:false} `miss`; a
//      typed refusal (hub says no, hub down, timeout) `resolve_refused` (never a miss); an
//      answer for another key `resolve_key_mismatch`; an answer whose ref is crash-quarantined
//      on this machine `cell_crashed` (nothing fetched)
//   6. receipt gate: EdDSA, known kid (the hub's key set refetched once on an unknown kid; never
//      for operator trust anchors), signature, claims equal to the answer; `receipt_refused`
//   7. publisher rule: the receipt's tier may write the export family (a platform publisher any
//      family, an org only "<org>/…") `scope_refused`; the receipt attests a rebuild by a
//      builder `provenance_unattested`
//   8. the signed revocation list, fresh (worker/revocations.h): `revoked`, or the list's own
//      refusal (`revocations_unsigned`, `revocations_stale`, …; `revocations_unreadable` when
//      the hub could not be asked)
//   9. fetch by digest into <blob_cache_dir>/<digest>; a cached file is re-hashed on use and,
//      when it no longer matches its name, deleted and fetched again   `digest_mismatch`,
//                                                                       `fetch_refused`
//  10. admission (size, digest, key restatement, fence, members, sm, toolchain): the refusal
//      keeps its own token (`digest_mismatch`, `key_mismatch`, `sm_mismatch`, ...); the
//      receipt's family, source_digest and so_digest must equal the cell's (`receipt_refused`)
//  11. the source regenerated from this worker's graph and compared (`source_mismatch`)
//  12. the admitted bytes are also kept in the local store with the receipt (a failed Put is
//      only noted)
//  13. load (dlopen into a private dir) + bind + arm on the exported lane, install the target
//                                                                       `arm_refused` / `hit`
// Law 4: nothing is written where it could be dlopen'ed, and nothing is dlopen'ed, before steps
// 6-11 (or step 4's checks) passed.
//
// The steps are one list in boot.cc, each named by the stage its time is recorded under, so a
// row's `stages` read as the route it took: key, toolchain, local_store, then admit, revocations
// (a local hit) or resolve, receipt, revocations, fetch, admit, provenance (the hub), then open,
// bind, install and, when fetched bytes were kept, local_store_put_wait. A step that decides the
// outcome still closes its stage.
//
// Exactly one `boot_adopt` event row per call: its phase is the outcome's phase, its duration the
// measured span of the whole call, its detail prose starting `key=<key> target=<name>`. A refused
// adoption installs nothing; the caller then applies the ordinary miss policy (serve eager now, or
// refuse retryably for a mandatory target: ServedTarget's job).
#pragma once

#include <memory>
#include <string>

#include "src/kiln/arm/loader.h"
#include "src/kiln/cell/store.h"
#include "src/kiln/client/hub_client.h"
#include "src/kiln/graph/checkpoint.h"
#include "src/kiln/graph/ir.h"
#include "src/kiln/manifest/manifest.h"
#include "src/kiln/receipt/receipt.h"
#include "src/kiln/worker/crash_guard.h"
#include "src/kiln/worker/events.h"
#include "src/kiln/worker/revocations.h"
#include "src/kiln/worker/serving.h"
#include "src/kiln/worker/store_keeper.h"

namespace kiln {

// Boot-adopt phases that are not admission tokens (admission.h keeps its own).
inline constexpr const char* kBootHit = "hit";
inline constexpr const char* kBootLocalHit = "local_hit";
inline constexpr const char* kBootMiss = "miss";
// The hub ordered (pin or canary) a ref this target cannot serve: not a cell of its graph,
// envelope and toolchain at an sm level this machine runs; or one the hub no longer resolves to.
inline constexpr const char* kBootOrderRefUnservable = "order_ref_unservable";
inline constexpr const char* kBootOrderRefUnavailable = "order_ref_unavailable";
inline constexpr const char* kBootNoExportDeclaration = "no_export_declaration";
inline constexpr const char* kBootKeyUnderivable = "key_underivable";
inline constexpr const char* kBootLocalMissNoHub = "local_miss_no_hub";
inline constexpr const char* kBootResolveRefused = "resolve_refused";
inline constexpr const char* kBootResolveKeyMismatch = "resolve_key_mismatch";
inline constexpr const char* kBootReceiptRefused = "receipt_refused";
inline constexpr const char* kBootFetchRefused = "fetch_refused";
inline constexpr const char* kBootArmRefused = "arm_refused";
inline constexpr const char* kBootScopeRefused = "scope_refused";
inline constexpr const char* kBootProvenanceUnattested = "provenance_unattested";
// (kCellCrashed, crash_guard.h, is a boot phase too: the cell's ref is crash-quarantined here.)
// serve_degrade phase for a cell that armed but could not be installed on its target.
inline constexpr const char* kArmedTargetUnresolved = "armed_target_unresolved";

// What the boot routes of one worker share. Pointers are not owned and must outlive the call.
struct BootContext {
  LocalStore* store = nullptr;    // this machine's cells; null = no local store
  StoreKeeper* keeper = nullptr;  // told of every cell armed here; null = none (no bound)
  HubClient* hub = nullptr;       // null = no hub configured
  // Operator trust anchors (the manifest's `hub.trust`), checked offline (VerifyResolvedReceipt):
  // a receipt signed by any other key is refused, and the hub is never asked for keys.
  // null = trust the hub's own key set (HubSpec: empty trust), see hub_keys.
  PublicKeySet* trust = nullptr;
  // Used only when `trust` is null: the hub's key set as fetched so far, shared by the targets of
  // one boot so /.well-known/jwks.json is fetched once (HubClient::VerifyReceipt: one refetch on
  // an unknown kid). null = a fresh set per call.
  PublicKeySet* hub_keys = nullptr;
  // The signed revocation list (worker/revocations.h), checked before every adoption when a hub
  // is configured. REQUIRES: non-null when `hub` is (a worker with a hub always watches it).
  RevocationWatch* revocations = nullptr;
  EventLog* events = nullptr;  // null = no row
  // This machine's crash quarantine (crash_guard.h); null = none consulted.
  const CrashGuard* crash_guard = nullptr;
  std::string private_dir;     // verified .so files are written under here (0700) and opened
  std::string blob_cache_dir;  // fetched blobs by digest; "" = <private_dir>/blobs
  int threads = 1;             // compute threads of the armed cell
  std::string worker;          // this worker's name (prose only)
  // false: every check of steps 1-11 runs as above, but step 13 does not: nothing is written
  // where it could be dlopen'ed, nothing is loaded or installed, and a cell that passed every
  // check ends `hit` (or `local_hit`) with no cell, its ref key@digest and `load=skipped` in the
  // detail. For the fleet simulator (cli/fleet_sim.h), which runs the boot protocol of many
  // workers in one process; a serving worker always loads.
  bool load = true;
};

struct BootOutcome {
  // `hit` | `local_hit` | `miss` | a refusal token (see the order above).
  std::string phase;
  // The installed cell on hit / local_hit; else null (also on a hit with BootContext::load off).
  std::shared_ptr<ArmedCell> cell;
  std::string key;     // the derived key ("" when none was derived)
  std::string ref;     // key@digest of the installed (or, load off, admitted) cell
  std::string detail;  // prose: the refusal's message, the resolve token
  // The token a phase that wraps another refusal carries, as data: resolve_refused and
  // resolve_key_mismatch the hub's or the transport's token (`revoked`, `hub_timeout`, ...),
  // receipt_refused the receipt verdict's (`receipt_bad_signature`, ...) or
  // receipt_claim_mismatch, fetch_refused the fetch's. "" for every other phase (whose token is
  // the phase itself).
  std::string cause;
  double duration_ms = 0;  // the whole call, measured
  // Where that time went, stage by stage in call order, so an operator can see which step of a
  // slow boot was slow: `stages` as data (the event row's `stages` field), `stages_ms` as the
  // same list in words ("toolchain:3.10,key:0.41,...") for the row's prose detail.
  std::vector<std::pair<std::string, double>> stages;
  std::string stages_ms;
  // The refusal came from not reaching the hub (down, timeout, 5xx): the same call may succeed
  // later, so the caller retries it instead of applying the miss policy.
  bool retryable = false;

  bool adopted() const { return cell != nullptr; }
};

// True for a phase that names a refusal (not hit, local_hit, miss, local_miss_no_hub, nor the
// "not asked" outcome no_export_declaration). A refusal is never a
// miss: the caller may record it as the target's stored eager posture token.
bool IsBootRefusal(const std::string& phase);

// The boot census of an armed cell that lacks declared classes (UncoveredClasses, serving.h):
// one compiled_shape_coverage row, phase `partial`, detail "compiled=2/3 missing={x=[5,64]}"
// plus each gap's reason from the cell's metadata. Nothing when the cell carries every class.
void SayCoverage(EventLog* events, const TargetSpec& spec, const std::string& key,
                 const std::string& ref, const std::vector<EntryMetadata>& entries,
                 const std::vector<EntryGap>& gaps);

// Adopts a cell for `target` (declared by `spec`, serving `graph` with checkpoint `weights`) in
// the order above and installs it on a hit. Never fails: every outcome is a phase. Emits exactly
// one boot_adopt row to ctx.events; besides it, a compiled_shape_coverage row (phase partial)
// when the installed cell lacks declared classes, and a serve_degrade row (phase
// armed_target_unresolved) when a cell armed but its target refused it.
BootOutcome AdoptAtBoot(ServedTarget& target, const TargetSpec& spec,
                        std::shared_ptr<const Graph> graph, const WeightMap& weights,
                        const BootContext& ctx);

}  // namespace kiln
