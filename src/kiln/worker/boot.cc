// Boot-adopt (worker layer): local store -> hub resolve -> receipt gate -> fetch by digest ->
// admission -> load -> install, one boot_adopt row per target. See boot.h for the order.
//
// Nothing here compiles or reaches a compiler header: the key comes from cell/key.h
// (DeriveKeyAxes, KeyFromAxes), the same functions that minted it (law 3), and what this machine
// accepts from cell/admission.h (LocalAdmissionPolicy: its sm level and toolchain block).
#include "src/kiln/worker/boot.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <future>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "src/kiln/base/file.h"
#include "src/kiln/cell/admission.h"
#include "src/kiln/cell/key.h"
#include "src/kiln/cell/pack.h"
#include "src/kiln/cell/provenance.h"
#include "src/kiln/mint/mint.h"
#include "src/kiln/mint/regenerate.h"

namespace kiln {
namespace {

double MsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

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
  StageClock() : last_(std::chrono::steady_clock::now()) {}
  void Mark(const char* name) {
    const auto now = std::chrono::steady_clock::now();
    stages_.emplace_back(name, std::chrono::duration<double, std::milli>(now - last_).count());
    last_ = now;
  }
  // Closes a stage that had two parts timed by the callee: `first` took first_ms, `second` the
  // rest since the previous mark.
  void Split(const char* first, double first_ms, const char* second) {
    const auto now = std::chrono::steady_clock::now();
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
  std::chrono::steady_clock::time_point last_;
  std::vector<std::pair<std::string, double>> stages_;
};

// Transport tokens of the hub client: the hub could not be asked.
bool IsTransport(const std::string& token) {
  return token == "hub_unreachable" || token == "hub_timeout" || token == "hub_transport_error" ||
         token == "store_unavailable" || token == "builder_unavailable";
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
    return Status::Refused(StatusCode::kInvalidArgument, "receipt_claim_mismatch",
                           "the receipt states source " + claims.source_digest + " and cell.so " +
                               claims.so_digest + "; the cell holds " + MemberDigest(files.source) +
                               " and " + MemberDigest(files.shared_object));
  }
  return Status::OK();
}

}  // namespace

bool IsBootRefusal(const std::string& phase) {
  return !(phase == kBootHit || phase == kBootLocalHit || phase == kBootMiss ||
           phase == kBootLocalMissNoHub || phase == kBootOperatorEagerOnly ||
           phase == kBootNoExportDeclaration);
}

std::vector<ShapeClass> UncoveredClasses(const Envelope& declared,
                                         const std::vector<EntryMetadata>& entries) {
  std::vector<ShapeClass> missing;
  for (const ShapeClass& c : declared.classes) {
    bool carried = false;
    for (const EntryMetadata& e : entries) carried = carried || e.shape_class == c;
    if (!carried) missing.push_back(c);
  }
  return missing;
}

std::string DescribeClasses(const std::vector<ShapeClass>& classes) {
  std::string out;
  for (const ShapeClass& c : classes) {
    if (!out.empty()) out += ",";
    out += "{";
    bool first = true;
    for (const auto& [name, shape] : c) {
      out += (first ? "" : ";") + name + "=" + ShapeToString(shape);
      first = false;
    }
    out += "}";
  }
  return out;
}

BootOutcome AdoptAtBoot(ServedTarget& target, const TargetSpec& spec,
                        std::shared_ptr<const Graph> graph, const WeightMap& weights,
                        const BootContext& ctx) {
  const auto start = std::chrono::steady_clock::now();
  StageClock clock;
  BootOutcome out;
  // The local-store write of hub-fetched bytes, running beside their load (step 9). Every return
  // below goes through `finish`, which joins it, so it never outlives the bytes it reads.
  std::future<Status> pending_put;
  // Everything below returns through `finish`: one row per call, whatever the outcome.
  auto finish = [&](std::string phase, std::string detail) -> BootOutcome {
    out.phase = std::move(phase);
    out.detail = std::move(detail);
    if (pending_put.valid()) {
      const Status put = pending_put.get();
      out.detail +=
          put.ok() ? " local_store=stored" : " local_store_put_failed=\"" + put.ToString() + "\"";
      clock.Mark("local_store_put_wait");
    }
    out.duration_ms = MsSince(start);
    out.stages_ms = clock.Render();
    out.stages = clock.stages();
    if (ctx.events != nullptr) {
      EventRow row;
      row.kind = event_kind::kBootAdopt;
      row.phase = out.phase;
      row.duration_ms = out.duration_ms;
      row.key = out.key;
      row.ref = out.ref;
      row.target = spec.name;
      row.detail = "key=" + out.key + " target=" + spec.name;
      if (!ctx.worker.empty()) row.detail += " worker=" + ctx.worker;
      if (!out.detail.empty()) row.detail += " " + out.detail;
      if (!out.stages_ms.empty()) row.detail += " stages_ms=" + out.stages_ms;
      row.stages = out.stages;
      ctx.events->Append(std::move(row));
    }
    return out;
  };

  // 1. The operator's order: nothing is armed.
  if (target.eager_only()) return finish(kBootOperatorEagerOnly, "");
  // 2. Intake lane: nothing is adopted (the mint half compiles it here).
  if (!spec.exported()) return finish(kBootNoExportDeclaration, "");
  if (graph == nullptr) return finish(kBootKeyUnderivable, "no graph");

  // 3. The key, derived without compiling, with the function that minted it.
  auto axes = DeriveKeyAxes(*graph, spec.envelope, spec.sm);
  if (!axes.ok()) return finish(kBootKeyUnderivable, axes.status().ToString());
  auto key = KeyFromAxes(*axes);
  if (!key.ok()) return finish(kBootKeyUnderivable, key.status().ToString());
  out.key = *key;
  clock.Mark("key");

  auto local_policy = LocalAdmissionPolicy(out.key);
  if (!local_policy.ok()) return finish(kBootKeyUnderivable, local_policy.status().ToString());
  const AdmissionPolicy policy = *std::move(local_policy);
  clock.Mark("toolchain");

  // Load + bind + arm on the exported lane, then install. Only ever called on an AdmittedCell.
  auto arm_and_install = [&](const AdmittedCell& admitted, const char* phase,
                             std::string note) -> BootOutcome {
    LoadTimings load;
    auto dir = PrivateDirFor(ctx, spec.name);
    if (!dir.ok()) return finish(kBootArmRefused, dir.status().ToString() + note);
    auto armed = LoadAdmittedCell(admitted, weights, Lane::kExported, *dir, ctx.threads, &load);
    clock.Split("open", load.open_ms, "bind");
    if (!armed.ok()) return finish(kBootArmRefused, armed.status().ToString() + note);
    std::shared_ptr<ArmedCell> cell(std::move(armed).value());
    Status installed = target.InstallCell(cell);
    clock.Mark("install");
    if (!installed.ok()) {
      // The object armed but owns no installed target: said on its own row, never silently.
      if (ctx.events != nullptr) {
        EventRow row;
        row.kind = event_kind::kServeDegrade;
        row.phase = kArmedTargetUnresolved;
        row.key = out.key;
        row.ref = cell->ref();
        row.target = spec.name;
        row.detail = "target=" + spec.name + " " + installed.ToString();
        ctx.events->Append(std::move(row));
      }
      return finish(kBootArmRefused, installed.ToString() + note);
    }
    out.cell = std::move(cell);
    out.ref = out.cell->ref();
    // Declared classes the cell does not carry are served eager (out_of_envelope); said once here.
    const std::vector<ShapeClass> missing = UncoveredClasses(spec.envelope, out.cell->entries());
    if (!missing.empty() && ctx.events != nullptr) {
      EventRow row;
      row.kind = event_kind::kCompiledShapeCoverage;
      row.phase = "partial";
      row.key = out.key;
      row.ref = out.ref;
      row.target = spec.name;
      row.detail = "target=" + spec.name +
                   " carried=" + std::to_string(spec.envelope.classes.size() - missing.size()) +
                   "/" + std::to_string(spec.envelope.classes.size()) +
                   " missing=" + DescribeClasses(missing);
      ctx.events->Append(std::move(row));
    }
    return finish(phase, "ref=" + out.ref + note);
  };

  // The signed revocation list: the watch's when there is one, else fetched for this call.
  auto check_revocation = [&](const std::string& digest) -> Status {
    if (ctx.hub == nullptr) return Status::OK();  // no hub: nothing can revoke (docs/trust.md)
    if (ctx.revocations != nullptr) return ctx.revocations->CheckAdoption(out.key, digest);
    PublicKeySet keys = ctx.trust != nullptr      ? *ctx.trust
                        : ctx.hub_keys != nullptr ? *ctx.hub_keys
                                                  : PublicKeySet();
    bool transient = false;
    std::string jws;
    auto list = FetchRevocationList(*ctx.hub, &keys, ctx.trust == nullptr, 0, &transient, &jws);
    if (!list.ok()) return list.status();
    for (const auto& e : list->entries) {
      if (e.digest == digest) {
        return Status::Refused(StatusCode::kInvalidArgument, kRefusalRevoked,
                               out.key + "@" + digest + " is revoked: " + e.reason);
      }
    }
    return Status::OK();
  };
  // The adoption's own refusal: its token is the phase, transport failures are retryable.
  auto refuse_with = [&](const Status& s, const char* fallback, const std::string& note) {
    const std::string token = TokenOf(s, fallback);
    out.retryable = token == kRefusalRevocationsUnreachable;
    return finish(token, s.ToString() + note);
  };

  // 4. The local store: its recorded digest is the provenance admission checks the bytes against;
  // its origin says whether this machine minted them or which receipt they came with.
  std::string note;  // prose carried into the row
  std::string local_refusal;
  if (ctx.store != nullptr) {
    auto hit = ctx.store->Get(out.key);
    clock.Mark("local_store");
    if (!hit.ok()) {
      note += " local_store_error=\"" + hit.status().ToString() + "\"";
    } else if (hit->has_value()) {
      const StoredCell& stored = **hit;
      auto admitted = AdmitCell(stored.bytes, stored.digest, stored.bytes.size(), policy);
      Status local = admitted.status();
      if (local.ok()) local = CheckScope(spec, admitted->metadata.family, nullptr);
      if (local.ok()) {
        switch (stored.origin.kind) {
          case CellOrigin::Kind::kMinted:
            break;
          case CellOrigin::Kind::kHub: {
            // The receipt it came with, checked as at its first adoption.
            ResolveAnswer again;
            again.kind = ResolveAnswer::Kind::kFound;
            again.key = out.key;
            again.digest = stored.digest;
            again.size = stored.bytes.size();
            again.family = admitted->metadata.family;
            again.receipt = stored.origin.receipt;
            ReceiptVerdict v;
            if (ctx.trust != nullptr) {
              v = VerifyResolvedReceipt(again, *ctx.trust);
            } else {
              PublicKeySet keys = ctx.hub_keys != nullptr ? *ctx.hub_keys : PublicKeySet();
              if (ctx.revocations != nullptr) {
                keys.AddAll(ctx.revocations->Keys()).IgnoreError();
              }
              v = ctx.hub != nullptr ? ctx.hub->VerifyReceipt(again, &keys)
                                     : VerifyResolvedReceipt(again, keys);
            }
            if (!v.ok()) {
              local = Status::Refused(StatusCode::kInvalidArgument, kBootReceiptRefused,
                                      "stored receipt: " + v.token + ": " + v.message);
            } else {
              local = CheckScope(spec, v.claims.family, &v.claims);
              if (local.ok()) local = CheckAttestation(v.claims);
              if (local.ok()) local = CheckMembers(v.claims, admitted->files);
            }
            break;
          }
          case CellOrigin::Kind::kUnknown:
            local = Status::Refused(StatusCode::kInvalidArgument, kBootProvenanceUnattested,
                                    "the local entry records no origin (neither minted here nor "
                                    "a receipt)");
            break;
        }
      }
      if (local.ok()) {
        local = CheckSourceProvenance(*graph, admitted->metadata, admitted->files.source);
      }
      clock.Mark("admit");
      if (local.ok()) {
        // Revocation, local hits included: a listed cell ends the boot here.
        Status revocation = check_revocation(stored.digest);
        clock.Mark("revocations");
        if (!revocation.ok()) {
          if (revocation.Is(kRefusalRevoked)) ctx.store->Remove(out.key).IgnoreError();
          return refuse_with(revocation, kBootReceiptRefused,
                             std::string(" origin=") + CellOriginName(stored.origin.kind) + note);
        }
        return arm_and_install(*admitted, kBootLocalHit,
                               std::string(" origin=") + CellOriginName(stored.origin.kind) + note);
      }
      // A local entry that does not admit is not served; it is dropped and the hub asked.
      local_refusal = TokenOf(local, kBootArmRefused);
      note += " local_entry_refused=\"" + local.ToString() + "\"";
      ctx.store->Remove(out.key).IgnoreError();
    }
  }

  // 5. Hub resolve of this scope. A refusal is never a miss.
  if (ctx.hub == nullptr) {
    if (!local_refusal.empty()) return finish(local_refusal, note.substr(1));
    return finish(kBootLocalMissNoHub, note.empty() ? "" : note.substr(1));
  }
  HubClient& hub = *ctx.hub;
  ResolveAnswer answer = hub.Resolve(out.key, spec.export_spec->family);
  clock.Mark("resolve");
  switch (answer.kind) {
    case ResolveAnswer::Kind::kMiss:
      return finish(kBootMiss, "hub=miss" + note);
    case ResolveAnswer::Kind::kRefused:
      if (answer.token == "resolve_key_mismatch" || answer.token == "resolve_scope_mismatch") {
        return finish(kBootResolveKeyMismatch,
                      "token=" + answer.token + " message=\"" + answer.message + "\"" + note);
      }
      out.retryable = IsTransport(answer.token) || answer.http_status >= 500;
      return finish(kBootResolveRefused,
                    "token=" + answer.token + " message=\"" + answer.message + "\"" + note);
    case ResolveAnswer::Kind::kFound:
      break;
  }
  if (answer.key != out.key) {
    return finish(kBootResolveKeyMismatch, "asked=" + out.key + " answered=" + answer.key + note);
  }

  // 6. Receipt gate: signature, kid (one refetch), claims.
  // Operator trust anchors are checked offline: the hub is not asked for keys it would vouch
  // for itself. Without anchors the hub's own key set is used, refetched once on an unknown kid.
  ReceiptVerdict verdict;
  if (ctx.trust != nullptr) {
    verdict = VerifyResolvedReceipt(answer, *ctx.trust);
  } else {
    PublicKeySet local_hub_keys;
    verdict = hub.VerifyReceipt(answer, ctx.hub_keys != nullptr ? ctx.hub_keys : &local_hub_keys);
  }
  clock.Mark("receipt");
  if (!verdict.ok()) {
    return finish(kBootReceiptRefused,
                  "token=" + verdict.token + " message=\"" + verdict.message + "\"" + note);
  }
  // 7. The publisher rule and the rebuild attestation, before a byte is fetched.
  if (Status scope = CheckScope(spec, verdict.claims.family, &verdict.claims); !scope.ok()) {
    return finish(kBootScopeRefused, scope.ToString() + note);
  }
  if (Status attested = CheckAttestation(verdict.claims); !attested.ok()) {
    return finish(kBootProvenanceUnattested, attested.ToString() + note);
  }
  // 8. The signed revocation list, fresh.
  Status revocation = check_revocation(answer.digest);
  clock.Mark("revocations");
  if (!revocation.ok()) return refuse_with(revocation, kBootReceiptRefused, note);

  // 9. Fetch by digest into the cache; a cached file is re-verified on use.
  auto root = PrivateRoot(ctx);
  const std::string cache_dir = !ctx.blob_cache_dir.empty() ? ctx.blob_cache_dir
                                : root.ok()                 ? *root + "/blobs"
                                                            : std::string();
  if (Status made = root.ok() ? MakeDirs(cache_dir) : root.status(); !made.ok()) {
    return finish(kBootFetchRefused,
                  "token=cache_unwritable message=\"" + made.ToString() + "\"" + note);
  }
  const std::string blob_path = cache_dir + "/" + answer.digest;
  std::optional<std::string> bytes =
      ReadVerifiedCachedBlob(blob_path, answer.digest, answer.size, &note);
  if (bytes.has_value()) {
    note += " cached_blob=reused";
  } else {
    HubAnswer fetched = hub.FetchBlob(answer.digest, blob_path, answer.size);
    if (!fetched.ok()) {
      // A partial download of bytes that are not the digest must not be resumed next time.
      std::error_code ec;
      if (fetched.token == kRefusalDigestMismatch || fetched.token == kRefusalSizeMismatch) {
        std::filesystem::remove(blob_path + ".part", ec);
      }
      const std::string token =
          fetched.token == kRefusalDigestMismatch || fetched.token == kRefusalSizeMismatch
              ? fetched.token
              : std::string(kBootFetchRefused);
      out.retryable = IsTransport(fetched.token) || fetched.http_status >= 500;
      return finish(token,
                    "token=" + fetched.token + " message=\"" + fetched.message + "\"" + note);
    }
    auto read = ReadFile(blob_path);
    if (!read.ok()) {
      return finish(kBootFetchRefused,
                    "token=cache_unreadable message=\"" + read.status().ToString() + "\"" + note);
    }
    bytes = std::move(read).value();
  }
  clock.Mark("fetch");

  // 10. Admission: every check before anything is loaded (law 4); refusals keep their tokens.
  auto admitted = AdmitCell(*bytes, answer.digest, answer.size, policy);
  clock.Mark("admit");
  if (!admitted.ok()) {
    return finish(TokenOf(admitted.status(), kBootArmRefused), admitted.status().ToString() + note);
  }
  if (!verdict.claims.family.empty() && admitted->metadata.family != verdict.claims.family) {
    return finish(kBootReceiptRefused, "token=receipt_claim_mismatch message=\"family is '" +
                                           verdict.claims.family + "' in the receipt, '" +
                                           admitted->metadata.family + "' in the metadata\"" +
                                           note);
  }
  if (Status members = CheckMembers(verdict.claims, admitted->files); !members.ok()) {
    return finish(kBootReceiptRefused,
                  "token=receipt_claim_mismatch message=\"" + members.message() + "\"" + note);
  }
  // 11. Provenance of the code: the source is what this worker's graph generates.
  if (Status source = CheckSourceProvenance(*graph, admitted->metadata, admitted->files.source);
      !source.ok()) {
    clock.Mark("provenance");
    return finish(TokenOf(source, kRefusalSourceMismatch), source.ToString() + note);
  }
  clock.Mark("provenance");

  // 12. Keep the admitted bytes on this machine for the next boot, with the receipt they came
  // with. The store's fsyncs overlap the load below instead of preceding it; `finish` waits for
  // both before the row is written.
  if (ctx.store != nullptr) {
    pending_put =
        std::async(std::launch::async, [store = ctx.store, &key = out.key, &bytes, &answer] {
          return store->Put(key, *bytes, CellOrigin{CellOrigin::Kind::kHub, answer.receipt});
        });
  }

  // 13. Load, bind, arm, install.
  return arm_and_install(*admitted, kBootHit, note);
}

}  // namespace kiln
