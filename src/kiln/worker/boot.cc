// Boot-adopt (worker layer): local store -> hub resolve -> receipt gate -> fetch by digest ->
// admission -> load -> install, one boot_adopt row per target. See boot.h for the order.
//
// Nothing here compiles or reaches a compiler header: the key comes from cell/key.h
// (DeriveKeyAxes, KeyFromAxes), the same functions that minted it (law 3), and what this machine
// accepts from cell/admission.h (LocalAdmissionPolicy: its sm level and toolchain block).
#include "src/kiln/worker/boot.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <future>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "src/kiln/base/clock.h"
#include "src/kiln/base/file.h"
#include "src/kiln/base/sm_levels.h"
#include "src/kiln/cell/admission.h"
#include "src/kiln/cell/key.h"
#include "src/kiln/cell/pack.h"
#include "src/kiln/cell/provenance.h"
#include "src/kiln/identity/toolchain.h"
#include "src/kiln/mint/regenerate.h"

namespace kiln {
namespace {

// A fresh private directory per load: dlopen keys on the path, so two loads must never share
// one .so path within a process.
Result<std::string> PrivateRoot(const BootContext& ctx) {
  if (!ctx.private_dir.empty()) return ctx.private_dir;
  return ProcessPrivateDir();
}
Result<std::string> PrivateDirFor(const BootContext& ctx, const std::string& target) {
  static std::atomic<uint64_t> counter{0};
  KILN_ASSIGN_OR_RETURN(std::string root, PrivateRoot(ctx));
  return root + "/" + target + "-" + std::to_string(counter.fetch_add(1));
}

// An admission refusal's own token, else `fallback`.
std::string TokenOf(const Status& status, const char* fallback) {
  return status.token().empty() ? fallback : status.token();
}

// Reads the cached blob for `digest` if it still hashes to its name (and has `size` bytes when
// size > 0); a stale or corrupt file is deleted. nullopt = fetch it.
std::optional<std::string> ReadVerifiedCachedBlob(const std::string& path,
                                                  const std::string& digest, uint64_t size,
                                                  std::string* note) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return std::nullopt;
  auto bytes = ReadFile(path);
  if (bytes.ok() && CellDigest(*bytes) == digest && (size == 0 || bytes->size() == size)) {
    return std::move(bytes).value();
  }
  std::filesystem::remove(path, ec);
  *note += " cached_blob_refetched=stale";
  return std::nullopt;
}

// Splits a call's wall time into named stages: Mark(name) closes the stage that ran since the
// previous mark. Formatting is deferred to Render so the clock costs nothing on the hot path.
class StageClock {
 public:
  StageClock() : last_(Clock::Real()->Now()) {}
  void Mark(const char* name) {
    const Clock::TimePoint now = Clock::Real()->Now();
    stages_.emplace_back(name, std::chrono::duration<double, std::milli>(now - last_).count());
    last_ = now;
  }
  // Closes a stage that had two parts timed by the callee: `first` took first_ms, `second` the
  // rest since the previous mark.
  void Split(const char* first, double first_ms, const char* second) {
    const Clock::TimePoint now = Clock::Real()->Now();
    const double total = std::chrono::duration<double, std::milli>(now - last_).count();
    stages_.emplace_back(first, first_ms);
    stages_.emplace_back(second, total - first_ms);
    last_ = now;
  }
  const std::vector<std::pair<std::string, double>>& stages() const { return stages_; }
  std::string Render() const {
    std::string out;
    char buf[32];
    for (const auto& [name, ms] : stages_) {
      std::snprintf(buf, sizeof buf, "%.2f", ms);
      out += (out.empty() ? "" : ",") + name + ":" + buf;
    }
    return out;
  }

 private:
  Clock::TimePoint last_;
  std::vector<std::pair<std::string, double>> stages_;
};

// The hub could not be asked, or could not answer now: the same adoption may succeed later.
bool IsTransient(const std::string& token, int http_status) {
  return IsHubTransportToken(token) || http_status >= 500;
}

// Scope (law 17): the cell's family is the target's export family; with a receipt, its publisher's
// tier may write that family (the publisher rule, CheckTierWrites: the hub's own function).
Status CheckScope(const TargetSpec& spec, const std::string& family, const ReceiptClaims* claims) {
  const std::string& want = spec.export_spec->family;
  if (family != want) {
    return Status::Refused(
        StatusCode::kInvalidArgument, kBootScopeRefused,
        "the cell's family is '" + family + "', target '" + spec.name + "' exports '" + want + "'");
  }
  if (claims != nullptr) {
    Status tier = CheckTierWrites(claims->publisher, claims->tier, claims->org, want);
    if (!tier.ok()) {
      return Status::Refused(
          StatusCode::kInvalidArgument, kBootScopeRefused,
          "the receipt's publisher may not write '" + want + "': " + tier.message());
    }
  }
  return Status::OK();
}

// A receipt that attests a verified rebuild, whose member digests are the admitted bytes'.
Status CheckAttestation(const ReceiptClaims& claims) {
  if (claims.builder.empty() || claims.so_digest.empty() || claims.source_digest.empty()) {
    return Status::Refused(StatusCode::kInvalidArgument, kBootProvenanceUnattested,
                           "the receipt of " + claims.key + "@" + claims.digest +
                               " attests no rebuild of cell.so from its source (no builder); "
                               "only cells rebuilt by the hub's builder, or minted here, are "
                               "adopted");
  }
  return Status::OK();
}

Status CheckMembers(const ReceiptClaims& claims, const CellFiles& files) {
  if (MemberDigest(files.source) != claims.source_digest ||
      MemberDigest(files.shared_object) != claims.so_digest) {
    return Status::Refused(StatusCode::kInvalidArgument, kRefusalReceiptClaimMismatch,
                           "the receipt states source " + claims.source_digest + " and cell.so " +
                               claims.so_digest + "; the cell holds " + MemberDigest(files.source) +
                               " and " + MemberDigest(files.shared_object));
  }
  return Status::OK();
}

}  // namespace

void SayCoverage(EventLog* events, const TargetSpec& spec, const std::string& key,
                 const std::string& ref, const std::vector<EntryMetadata>& entries,
                 const std::vector<EntryGap>& gaps) {
  // Declared classes the cell does not carry are served eager (entry_not_compiled); said once
  // per arming, with the compiler's reason for each that the cell records.
  const Coverage coverage = CoverageOf(spec.envelope, entries);
  if (coverage.full() || events == nullptr) return;
  EventRow row;
  row.kind = event_kind::kCompiledShapeCoverage;
  row.phase = "partial";
  row.key = key;
  row.ref = ref;
  row.target = spec.name;
  row.detail =
      "target=" + spec.name + " compiled=" + coverage.Fraction() + " missing=" + coverage.missing;
  for (const EntryGap& g : gaps) {
    row.detail += " reason" +
                  (g.ranged ? DescribeRanged(*g.ranged) : DescribeClasses({g.shape_class})) +
                  "=\"" + g.reason + "\"";
  }
  events->Append(std::move(row));
}

bool IsBootRefusal(const std::string& phase) {
  return !(phase == kBootHit || phase == kBootLocalHit || phase == kBootMiss ||
           phase == kBootLocalMissNoHub || phase == kBootNoExportDeclaration);
}

namespace {

// One AdoptAtBoot call: the steps of boot.h, each named by the stage it closes on the call's
// StageClock, so the row's `stages` read as the list below. A step either lets the adoption go
// on (nullopt) or decides its outcome (a phase and its prose).
class Adoption {
 public:
  Adoption(ServedTarget& target, const TargetSpec& spec, std::shared_ptr<const Graph> graph,
           const WeightMap& weights, const BootContext& ctx)
      : target_(target), spec_(spec), graph_(std::move(graph)), weights_(weights), ctx_(ctx) {
    // A hub without the revocation watch would adopt unchecked cells: a wiring bug.
    KILN_CHECK(ctx_.hub == nullptr || ctx_.revocations != nullptr);
  }

  BootOutcome Run();

 private:
  struct Decision {
    Decision(std::string phase_in, std::string detail_in, std::string cause_in = "")
        : phase(std::move(phase_in)), detail(std::move(detail_in)), cause(std::move(cause_in)) {}
    std::string phase;
    std::string detail;
    std::string cause;  // BootOutcome::cause
  };
  using Next = std::optional<Decision>;
  struct Step {
    const char* stage;  // the StageClock name the step's time is recorded under
    Next (Adoption::*run)();
  };
  // Runs `steps` in order, marking each one's stage; the first decision ends the list.
  template <size_t N>
  Next RunSteps(const Step (&steps)[N]);

  // Steps (boot.h numbers them).
  Next DeriveKey();              // 3
  Next PinnedKey();              // 3
  Next ReadPolicy();             // 3: what this machine admits (sm level, toolchain block)
  Next LookUpLocalStore();       // 4
  Next AdmitStored();            // 4: admission, scope, origin, source
  Next CheckStoredRevocation();  // 4
  Next Resolve();                // 5
  Next VerifyReceipt();          // 6-7
  Next CheckRevocation();        // 8
  Next Fetch();                  // 9
  Next Admit();                  // 10
  Next CheckSource();            // 11

  // 12-13 and the end of every call.
  BootOutcome ArmAndInstall(const AdmittedCell& admitted, const char* phase);
  BootOutcome Finish(const Decision& decision);
  Decision Refuse(const Status& s, const char* fallback);
  PublicKeySet HubKeys() const;

  ServedTarget& target_;
  const TargetSpec& spec_;
  const std::shared_ptr<const Graph> graph_;
  const WeightMap& weights_;
  const BootContext& ctx_;

  const Clock::TimePoint start_ = Clock::Real()->Now();
  StageClock clock_;
  BootOutcome out_;
  std::string note_;  // prose carried into the row
  std::optional<AdmissionPolicy> policy_;
  std::optional<StoredCell> stored_;
  std::string pinned_digest_;  // the hub's pin or canary digest for this worker ("" = auto)
  std::optional<AdmittedCell> local_;
  std::string local_refusal_;  // the local entry's refusal token, when it was dropped
  ResolveAnswer answer_;
  ReceiptVerdict verdict_;
  std::string bytes_;
  std::optional<AdmittedCell> admitted_;
  // The local-store write of hub-fetched bytes, running beside their load. Finish joins it, so
  // it never outlives the bytes it reads.
  std::future<Status> pending_put_;
};

template <size_t N>
Adoption::Next Adoption::RunSteps(const Step (&steps)[N]) {
  for (const Step& step : steps) {
    Next decided = (this->*step.run)();
    clock_.Mark(step.stage);
    if (decided) return decided;
  }
  return std::nullopt;
}

BootOutcome Adoption::Run() {
  // 1. The operator's eager-only order does not stop the adoption: every check runs and the
  // bytes are kept, so the lift arms them from the local store; only the arming is held
  // (ArmAndInstall).
  // 2. Intake lane: nothing is adopted (the mint half compiles it here).
  if (!spec_.exported()) return Finish({kBootNoExportDeclaration, ""});
  if (graph_ == nullptr) return Finish({kBootKeyUnderivable, "no graph"});

  static constexpr Step kKey[] = {{"key", &Adoption::DeriveKey},
                                  {"toolchain", &Adoption::ReadPolicy}};
  if (Next d = RunSteps(kKey)) return Finish(*d);

  // 4. This machine's store: a stored cell, checked as at its first adoption. One that does not
  // admit is dropped and the hub asked; a revoked one ends the boot.
  static constexpr Step kLocalStore[] = {{"local_store", &Adoption::LookUpLocalStore}};
  static constexpr Step kStored[] = {{"admit", &Adoption::AdmitStored}};
  static constexpr Step kLocalHit[] = {{"revocations", &Adoption::CheckStoredRevocation}};
  if (ctx_.store != nullptr) RunSteps(kLocalStore);
  if (stored_) RunSteps(kStored);
  if (local_) {
    if (Next d = RunSteps(kLocalHit)) return Finish(*d);
    return ArmAndInstall(*local_, kBootLocalHit);
  }

  // 5-11. The hub.
  if (ctx_.hub == nullptr) {
    if (!local_refusal_.empty()) return Finish({local_refusal_, note_.substr(1)});
    return Finish({kBootLocalMissNoHub, note_.empty() ? "" : note_.substr(1)});
  }
  static constexpr Step kHub[] = {{"resolve", &Adoption::Resolve},
                                  {"receipt", &Adoption::VerifyReceipt},
                                  {"revocations", &Adoption::CheckRevocation},
                                  {"fetch", &Adoption::Fetch},
                                  {"admit", &Adoption::Admit},
                                  {"provenance", &Adoption::CheckSource}};
  if (Next d = RunSteps(kHub)) return Finish(*d);
  // 12. Keep the admitted bytes on this machine for the next boot, with the receipt they came
  // with. The store's fsyncs overlap the load instead of preceding it; Finish waits for both.
  if (ctx_.store != nullptr) {
    pending_put_ = std::async(std::launch::async, [this] {
      return ctx_.store->Put(out_.key, bytes_, CellOrigin{CellOrigin::Kind::kHub, answer_.receipt});
    });
  }
  // 13. Load, bind, arm, install.
  return ArmAndInstall(*admitted_, kBootHit);
}

Adoption::Next Adoption::DeriveKey() {
  // The key, derived without compiling, with the function that minted it.
  auto axes = DeriveKeyAxes(*graph_, spec_.envelope, spec_.sm);
  if (!axes.ok()) return Decision{kBootKeyUnderivable, axes.status().ToString()};
  auto key = KeyFromAxes(*axes);
  if (!key.ok()) return Decision{kBootKeyUnderivable, key.status().ToString()};
  out_.key = *key;
  return PinnedKey();
}

Adoption::Next Adoption::PinnedKey() {
  // The hub's pin or canary names the one cell this target may serve. It must be a cell of this
  // very graph, envelope and toolchain, for an sm level this machine runs (a rollback to the
  // conservative build of the same model): its key is among the keys derived here for those
  // levels, with no compile. Any other ref could not pass the source check, and is refused by name.
  const std::string wanted = target_.wanted_ref();
  if (wanted.empty()) return std::nullopt;
  const std::string key = wanted.substr(0, wanted.find('@'));
  pinned_digest_ = wanted.substr(wanted.find('@') + 1);
  if (key == out_.key) return std::nullopt;
  const auto& levels = KnownSmLevels();
  const auto local = std::find(levels.begin(), levels.end(), DetectSmLevel());
  for (auto level = levels.begin(); level != levels.end() && level <= local; ++level) {
    auto axes = DeriveKeyAxes(*graph_, spec_.envelope, *level);
    if (!axes.ok()) continue;
    auto derived = KeyFromAxes(*axes);
    if (derived.ok() && *derived == key) {
      out_.key = key;
      note_ += " order=" + wanted + " sm=" + *level;
      return std::nullopt;
    }
  }
  return Decision{kBootOrderRefUnservable, "the hub ordered " + wanted +
                                               ", which is no cell of this target's graph, "
                                               "envelope and toolchain at an sm level this "
                                               "machine runs (up to " +
                                               DetectSmLevel() + ")"};
}

Adoption::Next Adoption::ReadPolicy() {
  auto policy = LocalAdmissionPolicy(out_.key);
  if (!policy.ok()) return Decision{kBootKeyUnderivable, policy.status().ToString()};
  policy_ = *std::move(policy);
  return std::nullopt;
}

Adoption::Next Adoption::LookUpLocalStore() {
  // Its recorded digest is the provenance admission checks the bytes against; its origin says
  // whether this machine minted them or which receipt they came with.
  auto hit = ctx_.store->Get(out_.key);
  if (!hit.ok()) {
    note_ += " local_store_error=\"" + hit.status().ToString() + "\"";
  } else if (hit->has_value() && !pinned_digest_.empty() && (**hit).digest != pinned_digest_) {
    note_ += " local_store=other_digest";  // not the ordered cell: the hub is asked for it
  } else if (hit->has_value()) {
    stored_ = std::move(**hit);
  }
  return std::nullopt;
}

PublicKeySet Adoption::HubKeys() const {
  // The hub's keys fetched so far, and those the revocation watch verified lists with.
  PublicKeySet keys = ctx_.hub_keys != nullptr ? *ctx_.hub_keys : PublicKeySet();
  if (ctx_.revocations != nullptr) keys.AddAll(ctx_.revocations->Keys()).IgnoreError();
  return keys;
}

Adoption::Next Adoption::AdmitStored() {
  auto admitted = AdmitCell(stored_->bytes, stored_->digest, stored_->bytes.size(), *policy_);
  Status local = admitted.status();
  if (local.ok() && ctx_.crash_guard != nullptr &&
      ctx_.crash_guard->IsQuarantined(out_.key + "@" + stored_->digest)) {
    local = Status::Refused(
        StatusCode::kInvalidArgument, kCellCrashed,
        "ref " + out_.key + "@" + stored_->digest + " is crash-quarantined on this machine");
  }
  if (local.ok()) local = CheckScope(spec_, admitted->metadata.family, nullptr);
  if (local.ok() && stored_->origin.kind == CellOrigin::Kind::kHub) {
    // The receipt it came with, checked as at its first adoption.
    ResolveAnswer again;
    again.kind = ResolveAnswer::Kind::kFound;
    again.key = out_.key;
    again.digest = stored_->digest;
    again.size = stored_->bytes.size();
    again.family = admitted->metadata.family;
    again.receipt = stored_->origin.receipt;
    ReceiptVerdict v;
    if (ctx_.trust != nullptr) {
      v = VerifyResolvedReceipt(again, *ctx_.trust);
    } else {
      PublicKeySet keys = HubKeys();
      v = ctx_.hub != nullptr ? ctx_.hub->VerifyReceipt(again, &keys)
                              : VerifyResolvedReceipt(again, keys);
    }
    if (!v.ok()) {
      local = Status::Refused(StatusCode::kInvalidArgument, kBootReceiptRefused,
                              "stored receipt: " + v.token + ": " + v.message);
    } else {
      local = CheckScope(spec_, v.claims.family, &v.claims);
      if (local.ok()) local = CheckAttestation(v.claims);
      if (local.ok()) local = CheckMembers(v.claims, admitted->files);
    }
  } else if (local.ok() && stored_->origin.kind == CellOrigin::Kind::kUnknown) {
    local = Status::Refused(StatusCode::kInvalidArgument, kBootProvenanceUnattested,
                            "the local entry records no origin (neither minted here nor a "
                            "receipt)");
  }
  if (local.ok()) {
    local = CheckSourceProvenance(*graph_, admitted->metadata, admitted->files.source);
  }
  if (local.ok()) {
    local_ = *std::move(admitted);
    note_ = std::string(" origin=") + CellOriginName(stored_->origin.kind) + note_;
    return std::nullopt;
  }
  // A local entry that does not admit is not served; it is dropped and the hub asked.
  local_refusal_ = TokenOf(local, kBootArmRefused);
  note_ += " local_entry_refused=\"" + local.ToString() + "\"";
  ctx_.store->Remove(out_.key).IgnoreError();
  return std::nullopt;
}

Adoption::Next Adoption::CheckStoredRevocation() {
  // Revocation, local hits included: a listed cell ends the boot here (no hub: nothing can
  // revoke, docs/trust.md).
  if (ctx_.hub == nullptr) return std::nullopt;
  Status revocation = ctx_.revocations->CheckAdoption(out_.key, stored_->digest);
  if (revocation.ok()) return std::nullopt;
  if (revocation.Is(kRefusalRevoked)) ctx_.store->Remove(out_.key).IgnoreError();
  return Refuse(revocation, kBootReceiptRefused);
}

Adoption::Next Adoption::Resolve() {
  // A refusal is never a miss.
  answer_ = ctx_.hub->Resolve(out_.key, spec_.export_spec->family);
  switch (answer_.kind) {
    case ResolveAnswer::Kind::kMiss:
      return Decision{kBootMiss, "hub=miss" + note_};
    case ResolveAnswer::Kind::kRefused: {
      const std::string said =
          "token=" + answer_.token + " message=\"" + answer_.message + "\"" + note_;
      if (answer_.token == kRefusalResolveKeyMismatch ||
          answer_.token == kRefusalResolveScopeMismatch) {
        return Decision{kBootResolveKeyMismatch, said, answer_.token};
      }
      out_.retryable = IsTransient(answer_.token, answer_.http_status);
      return Decision{kBootResolveRefused, said, answer_.token};
    }
    case ResolveAnswer::Kind::kFound:
      break;
  }
  if (answer_.key != out_.key) {
    return Decision{kBootResolveKeyMismatch,
                    "asked=" + out_.key + " answered=" + answer_.key + note_};
  }
  if (!pinned_digest_.empty() && answer_.digest != pinned_digest_) {
    return Decision{kBootOrderRefUnavailable, "the hub ordered " + out_.key + "@" + pinned_digest_ +
                                                  " but resolves the key to " + answer_.digest +
                                                  note_};
  }
  // A ref a worker of this machine died in is not fetched, whoever serves it.
  if (ctx_.crash_guard != nullptr &&
      ctx_.crash_guard->IsQuarantined(out_.key + "@" + answer_.digest)) {
    out_.ref = out_.key + "@" + answer_.digest;
    return Decision{kCellCrashed,
                    "hub=found ref=" + out_.ref + " is crash-quarantined on this machine" + note_};
  }
  return std::nullopt;
}

Adoption::Next Adoption::VerifyReceipt() {
  // 6. Signature, kid (one refetch), claims. Operator trust anchors are checked offline: the hub
  // is not asked for keys it would vouch for itself. Without anchors the hub's own key set is
  // used, refetched once on an unknown kid.
  if (ctx_.trust != nullptr) {
    verdict_ = VerifyResolvedReceipt(answer_, *ctx_.trust);
  } else {
    PublicKeySet local_hub_keys;
    verdict_ = ctx_.hub->VerifyReceipt(answer_,
                                       ctx_.hub_keys != nullptr ? ctx_.hub_keys : &local_hub_keys);
  }
  if (!verdict_.ok()) {
    return Decision{kBootReceiptRefused,
                    "token=" + verdict_.token + " message=\"" + verdict_.message + "\"" + note_,
                    verdict_.token};
  }
  // 7. The publisher rule and the rebuild attestation, before a byte is fetched.
  if (Status scope = CheckScope(spec_, verdict_.claims.family, &verdict_.claims); !scope.ok()) {
    return Decision{kBootScopeRefused, scope.ToString() + note_};
  }
  if (Status attested = CheckAttestation(verdict_.claims); !attested.ok()) {
    return Decision{kBootProvenanceUnattested, attested.ToString() + note_};
  }
  return std::nullopt;
}

Adoption::Next Adoption::CheckRevocation() {
  // 8. The signed revocation list, fresh.
  Status revocation = ctx_.revocations->CheckAdoption(out_.key, answer_.digest);
  if (revocation.ok()) return std::nullopt;
  return Refuse(revocation, kBootReceiptRefused);
}

Adoption::Next Adoption::Fetch() {
  // 9. Fetch by digest into the cache; a cached file is re-verified on use.
  auto root = PrivateRoot(ctx_);
  const std::string cache_dir = !ctx_.blob_cache_dir.empty() ? ctx_.blob_cache_dir
                                : root.ok()                  ? *root + "/blobs"
                                                             : std::string();
  if (Status made = root.ok() ? MakeDirs(cache_dir) : root.status(); !made.ok()) {
    return Decision{kBootFetchRefused,
                    "token=cache_unwritable message=\"" + made.ToString() + "\"" + note_,
                    "cache_unwritable"};
  }
  const std::string blob_path = cache_dir + "/" + answer_.digest;
  std::optional<std::string> cached =
      ReadVerifiedCachedBlob(blob_path, answer_.digest, answer_.size, &note_);
  if (cached.has_value()) {
    note_ += " cached_blob=reused";
    bytes_ = std::move(*cached);
    return std::nullopt;
  }
  // The resolve's blob_url (when the hub offers one) lets the bytes come from the object store;
  // FetchBlob checks them against the digest and falls back to the hub on any failure.
  HubAnswer fetched =
      ctx_.hub->FetchBlob(answer_.digest, blob_path, answer_.size, answer_.blob_url);
  if (!fetched.ok()) {
    // A partial download of bytes that are not the digest must not be resumed next time.
    const bool wrong_bytes =
        fetched.token == kRefusalDigestMismatch || fetched.token == kRefusalSizeMismatch;
    std::error_code ec;
    if (wrong_bytes) std::filesystem::remove(blob_path + ".part", ec);
    out_.retryable = IsTransient(fetched.token, fetched.http_status);
    return Decision{wrong_bytes ? fetched.token : std::string(kBootFetchRefused),
                    "token=" + fetched.token + " message=\"" + fetched.message + "\"" + note_,
                    fetched.token};
  }
  if (fetched.body.is_object())
    note_ += " blob_via=" + fetched.body.value("via", std::string("hub"));
  auto read = ReadFile(blob_path);
  if (!read.ok()) {
    return Decision{kBootFetchRefused,
                    "token=cache_unreadable message=\"" + read.status().ToString() + "\"" + note_,
                    "cache_unreadable"};
  }
  bytes_ = std::move(read).value();
  return std::nullopt;
}

Adoption::Next Adoption::Admit() {
  // 10. Every check before anything is loaded (law 4); refusals keep their tokens.
  auto admitted = AdmitCell(bytes_, answer_.digest, answer_.size, *policy_);
  if (!admitted.ok()) {
    return Decision{TokenOf(admitted.status(), kBootArmRefused),
                    admitted.status().ToString() + note_};
  }
  const ReceiptClaims& claims = verdict_.claims;
  if (!claims.family.empty() && admitted->metadata.family != claims.family) {
    return Decision{kBootReceiptRefused,
                    std::string("token=") + kRefusalReceiptClaimMismatch +
                        " message=\"family is '" + claims.family + "' in the receipt, '" +
                        admitted->metadata.family + "' in the metadata\"" + note_,
                    kRefusalReceiptClaimMismatch};
  }
  if (Status members = CheckMembers(claims, admitted->files); !members.ok()) {
    return Decision{kBootReceiptRefused,
                    std::string("token=") + kRefusalReceiptClaimMismatch + " message=\"" +
                        members.message() + "\"" + note_,
                    kRefusalReceiptClaimMismatch};
  }
  admitted_ = *std::move(admitted);
  return std::nullopt;
}

Adoption::Next Adoption::CheckSource() {
  // 11. Provenance of the code: the source is what this worker's graph generates.
  Status source = CheckSourceProvenance(*graph_, admitted_->metadata, admitted_->files.source);
  if (source.ok()) return std::nullopt;
  return Decision{TokenOf(source, kRefusalSourceMismatch), source.ToString() + note_};
}

BootOutcome Adoption::ArmAndInstall(const AdmittedCell& admitted, const char* phase) {
  if (!ctx_.load) {
    // Every check passed; the caller asked for no load (BootContext::load).
    out_.ref = out_.key + "@" + admitted.digest;
    return Finish({phase, "ref=" + out_.ref + " load=skipped" + note_});
  }
  if (target_.arming_held()) {
    // The operator's eager-only order (or the hub's eager order) suppresses arming: every check
    // passed and the bytes are kept on this machine, but nothing is loaded (the operator may
    // distrust the cell itself). The lift adopts again from the local store.
    out_.ref = out_.key + "@" + admitted.digest;
    return Finish(
        {phase, "ref=" + out_.ref + " held=" +
                    (target_.eager_only() ? kPostureOperatorEagerOnly : kPostureHubOrderEager) +
                    note_});
  }
  if (!spec_.allows_partial_coverage()) {
    // Full coverage required: a cell lacking a declared class is not loaded (InstallCell would
    // refuse it too; this saves the load and names the phase).
    const Coverage coverage = CoverageOf(spec_.envelope, admitted.metadata.entries);
    if (!coverage.full()) {
      out_.ref = out_.key + "@" + admitted.digest;
      return Finish({kCoverageIncomplete, "ref=" + out_.ref + " compiled=" + coverage.Fraction() +
                                              " missing=" + coverage.missing +
                                              " and the target requires full coverage" + note_});
    }
  }
  LoadTimings load;
  auto dir = PrivateDirFor(ctx_, spec_.name);
  if (!dir.ok()) return Finish({kBootArmRefused, dir.status().ToString() + note_});
  auto armed = LoadAdmittedCell(admitted, weights_, Lane::kExported, *dir, ctx_.threads, &load);
  clock_.Split("open", load.open_ms, "bind");
  if (!armed.ok()) return Finish({kBootArmRefused, armed.status().ToString() + note_});
  std::shared_ptr<ArmedCell> cell(std::move(armed).value());
  Status installed = target_.InstallCell(cell);
  clock_.Mark("install");
  if (!installed.ok()) {
    // The object armed but owns no installed target: said on its own row, never silently.
    if (ctx_.events != nullptr) {
      EventRow row;
      row.kind = event_kind::kServeDegrade;
      row.phase = kArmedTargetUnresolved;
      row.key = out_.key;
      row.ref = cell->ref();
      row.target = spec_.name;
      row.detail = "target=" + spec_.name + " " + installed.ToString();
      ctx_.events->Append(std::move(row));
    }
    return Finish({kBootArmRefused, installed.ToString() + note_});
  }
  out_.cell = std::move(cell);
  out_.ref = out_.cell->ref();
  if (ctx_.keeper != nullptr) ctx_.keeper->Armed(out_.key);
  SayCoverage(ctx_.events, spec_, out_.key, out_.ref, out_.cell->entries(), admitted.metadata.gaps);
  return Finish({phase, "ref=" + out_.ref + note_});
}

Adoption::Decision Adoption::Refuse(const Status& s, const char* fallback) {
  // The adoption's own refusal: its token is the phase; a list the hub could not give is
  // retried.
  const std::string token = TokenOf(s, fallback);
  out_.retryable = token == kRefusalRevocationsUnreachable;
  return Decision{token, s.ToString() + note_};
}

BootOutcome Adoption::Finish(const Decision& decision) {
  // Every call ends here: one row, whatever the outcome.
  out_.phase = decision.phase;
  out_.detail = decision.detail;
  out_.cause = decision.cause;
  if (pending_put_.valid()) {
    const Status put = pending_put_.get();
    out_.detail +=
        put.ok() ? " local_store=stored" : " local_store_put_failed=\"" + put.ToString() + "\"";
    clock_.Mark("local_store_put_wait");
  }
  out_.duration_ms = MsSince(start_);
  out_.stages_ms = clock_.Render();
  out_.stages = clock_.stages();
  if (ctx_.events != nullptr) {
    EventRow row;
    row.kind = event_kind::kBootAdopt;
    row.phase = out_.phase;
    row.duration_ms = out_.duration_ms;
    row.key = out_.key;
    row.ref = out_.ref;
    row.target = spec_.name;
    row.detail = "key=" + out_.key + " target=" + spec_.name;
    if (!ctx_.worker.empty()) row.detail += " worker=" + ctx_.worker;
    if (!out_.detail.empty()) row.detail += " " + out_.detail;
    if (!out_.stages_ms.empty()) row.detail += " stages_ms=" + out_.stages_ms;
    row.stages = out_.stages;
    ctx_.events->Append(std::move(row));
  }
  return out_;
}

}  // namespace

BootOutcome AdoptAtBoot(ServedTarget& target, const TargetSpec& spec,
                        std::shared_ptr<const Graph> graph, const WeightMap& weights,
                        const BootContext& ctx) {
  return Adoption(target, spec, std::move(graph), weights, ctx).Run();
}

}  // namespace kiln
