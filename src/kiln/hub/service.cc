// HubService: every hub route as a plain method over the stores (hub layer). The HTTP binding is
// in server.cc; docs/hub-api.md documents each route, its bodies, status codes and error tokens.
#include <chrono>
#include <sstream>

#include "src/kiln/base/canonical_json.h"
#include "src/kiln/base/log.h"
#include "src/kiln/base/sha256.h"
#include "src/kiln/cell/key.h"
#include "src/kiln/cell/metadata.h"
#include "src/kiln/cell/pack.h"
#include "src/kiln/hub/server.h"

namespace kiln {

Reply Reply::Error(int status, const std::string& token, const std::string& message,
                   nlohmann::json extra) {
  nlohmann::json body = extra.is_object() ? std::move(extra) : nlohmann::json::object();
  body["error"] = token;
  body["message"] = message;
  return Reply{status, std::move(body), ""};
}

Reply Reply::FromStatus(const Status& status) {
  // Damage is a typed refusal, never a miss and never "try again later".
  if (status.Is(kRefusalStoreCorrupt)) return Error(500, kRefusalStoreCorrupt, status.message());
  if (status.code() == StatusCode::kIOError) {
    return Error(503, "store_unavailable", status.message());
  }
  if (status.code() == StatusCode::kNotFound) return Error(404, "not_found", status.message());
  if (status.code() == StatusCode::kInvalidArgument) {
    return Error(400, "bad_request", status.message());
  }
  return Error(500, "internal", status.ToString());
}

namespace {

constexpr int64_t kTokenCacheSeconds = 10;

Reply Forbidden(const Principal& p, const std::string& what) {
  return Reply::Error(403, "forbidden",
                      "principal '" + p.name + "' with role '" + p.role + "' may not " + what);
}

// Parses a JSON object body or answers 400 bad_request.
std::variant<nlohmann::json, Reply> ParseBody(std::string_view body, const char* route) {
  auto j = ParseJson(body, std::string(route) + " body");
  if (!j.ok()) return Reply::Error(400, "bad_request", j.status().message());
  if (!j->is_object()) {
    return Reply::Error(400, "bad_request", std::string(route) + " body: expected a JSON object");
  }
  return std::move(j).value();
}

// A string field, or "" if absent; sets *bad when present with another type.
std::string Str(const nlohmann::json& j, const char* name, std::string* bad) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return "";
  if (!it->is_string()) {
    *bad = std::string("field '") + name + "' must be a string";
    return "";
  }
  return it->get<std::string>();
}

bool IsToken(const std::string& s) {
  if (s.empty() || s.size() > 64) return false;
  for (char c : s) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  }
  return true;
}

std::string HtmlEscape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

nlohmann::json ObligationJson(const ObligationRow& o) {
  return {{"release", o.release},
          {"target", o.target},
          {"sm", o.sm},
          {"key", o.key},
          {"state", o.state},
          {"cell_digest", o.cell_digest},
          {"updated_at", o.updated_at}};
}

nlohmann::json EventJson(const StoredEvent& e) {
  return {{"id", e.id},
          {"worker", e.worker},
          {"seq", e.seq},
          {"kind", e.kind},
          {"phase", e.phase},
          {"key", e.key},
          {"duration_ms", e.duration_ms},
          {"detail", e.detail},
          {"ts", e.ts}};
}

}  // namespace

struct HubService::TokenCache {
  std::mutex mu;
  std::map<std::string, std::pair<Principal, int64_t>> entries;  // sha256 -> (principal, expiry)
};

HubService::HubService(std::unique_ptr<HubStore> store, std::unique_ptr<BlobStore> blobs,
                       std::unique_ptr<SigningKeyRing> keys, std::function<int64_t()> now)
    : store_(std::move(store)),
      blobs_(std::move(blobs)),
      keys_(std::move(keys)),
      now_(std::move(now)),
      token_cache_(std::make_unique<TokenCache>()) {}

HubService::~HubService() = default;

int64_t HubService::Now() const {
  if (now_) return now_();
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::variant<Principal, Reply> HubService::Authenticate(const std::string& header) {
  const std::string token = BearerToken(header);
  if (token.empty()) {
    return Reply::Error(401, "unauthenticated", "missing 'Authorization: Bearer <token>' header");
  }
  const std::string hash = Sha256Hex(token);
  const int64_t now = Now();
  {
    std::lock_guard<std::mutex> lock(token_cache_->mu);
    auto it = token_cache_->entries.find(hash);
    if (it != token_cache_->entries.end() && it->second.second > now) return it->second.first;
  }
  auto row = store_->GetToken(hash);
  if (!row.ok()) return Reply::FromStatus(row.status());
  if (!row->has_value()) {
    return Reply::Error(401, "unauthenticated", "the bearer token is not known to this hub");
  }
  const TokenRow& t = **row;
  Principal p{t.name, t.role, t.role == "admin" ? "platform" : t.tier, t.org};
  std::lock_guard<std::mutex> lock(token_cache_->mu);
  if (token_cache_->entries.size() > 10000) token_cache_->entries.clear();
  token_cache_->entries[hash] = {p, now + kTokenCacheSeconds};
  return p;
}

Reply HubService::Health() {
  return Reply::Json(
      200, {{"ok", true}, {"store", store_->Describe()}, {"kid", keys_->Current()->kid()}});
}

// GET /v1/ready: what a load balancer asks before sending traffic. Unlike /v1/health (the process
// answers), every dependency is exercised: the store reachable and undamaged, the blob store
// writable, the disk above its floor. A failing check names itself; the answer is 503.
Reply HubService::Ready() {
  nlohmann::json checks = nlohmann::json::object();
  bool ready = true;
  auto record = [&](const char* name, const Status& s) {
    if (s.ok()) {
      checks[name] = {{"ok", true}};
      return;
    }
    ready = false;
    checks[name] = {{"ok", false},
                    {"error", s.token().empty() ? StatusCodeName(s.code()) : s.token()},
                    {"message", s.message()}};
  };
  record("store", store_->CheckIntegrity());
  record("blobs_writable", blobs_->CheckWritable());
  auto free_bytes = blobs_->FreeBytes();
  if (!free_bytes.ok()) {
    record("disk", free_bytes.status());
  } else if (*free_bytes < ready_options_.min_free_bytes) {
    record("disk", Status::Refused(StatusCode::kResourceExhausted, "disk_low",
                                   std::to_string(*free_bytes) +
                                       " bytes free under the blob "
                                       "store, below the floor of " +
                                       std::to_string(ready_options_.min_free_bytes)));
  } else {
    record("disk", Status::OK());
    checks["disk"]["free_bytes"] = *free_bytes;
  }
  if (!ready) {
    return Reply::Error(503, "not_ready", "a dependency of the hub is failing",
                        {{"ready", false}, {"checks", checks}});
  }
  return Reply::Json(200, {{"ready", true}, {"checks", checks}});
}

// Re-verifies every stored blob; damaged ones are quarantined by the blob store. Run on a schedule
// by the server and callable by an operator. Returns how many were checked and quarantined.
Reply HubService::VerifyBlobs() {
  auto all = blobs_->List();
  if (!all.ok()) return Reply::FromStatus(all.status());
  int checked = 0;
  nlohmann::json quarantined = nlohmann::json::array();
  for (const std::string& digest : *all) {
    Status s = blobs_->Verify(digest);
    if (s.ok() || s.code() == StatusCode::kNotFound) {
      ++checked;
      continue;
    }
    if (!s.Is(kRefusalBlobCorrupt)) return Reply::FromStatus(s);
    ++checked;
    quarantined.push_back(digest);
  }
  return Reply::Json(200, {{"checked", checked}, {"quarantined", quarantined}});
}

// POST /v1/blobs/{digest}/verify: a worker whose download did not hash to the digest it asked for
// says so; the hub re-reads its copy at once instead of waiting for the schedule.
Reply HubService::ReportBlobMismatch(const Principal& p, const std::string& digest) {
  if (!HasRole(p, {"worker", "publisher"})) return Forbidden(p, "report blob damage");
  if (!IsWellFormedDigest(digest)) {
    return Reply::Error(400, "bad_digest", "digest '" + digest + "' is not sha256:<64 hex>");
  }
  Status s = blobs_->Verify(digest);
  if (s.ok()) return Reply::Json(200, {{"digest", digest}, {"intact", true}});
  if (s.code() == StatusCode::kNotFound) {
    return Reply::Error(404, "not_found", "blob " + digest + " is not stored");
  }
  if (s.Is(kRefusalBlobCorrupt)) {
    return Reply::Json(200, {{"digest", digest}, {"intact", false}, {"quarantined", true}});
  }
  return Reply::FromStatus(s);
}

// GET /v1/cells/{key}
Reply HubService::ResolveCell(const Principal& p, const std::string& key) {
  if (!IsWellFormedKey(key)) {
    return Reply::Error(400, "bad_key", "key '" + key + "' is not ck1- + 56 lowercase hex");
  }
  auto resolved = store_->GetCellForResolve(key);
  if (!resolved.ok()) return Reply::FromStatus(resolved.status());
  if (!resolved->has_value()) return Reply::Json(200, {{"found", false}, {"key", key}});
  const CellRow& c = (*resolved)->cell;
  if (const auto& revoked = (*resolved)->revocation; revoked.has_value()) {
    return Reply::Error(410, "revoked",
                        "cell " + c.key + "@" + c.digest + " was revoked: " + revoked->reason,
                        {{"key", c.key}, {"digest", c.digest}, {"reason", revoked->reason}});
  }
  return Reply::Json(200, {{"found", true},
                           {"key", c.key},
                           {"digest", c.digest},
                           {"size", c.size},
                           {"family", c.family},
                           {"publisher", c.publisher},
                           {"tier", c.tier},
                           {"release", c.release},
                           {"receipt", c.receipt}});
}

// POST /v1/publish/intent
Reply HubService::PublishIntent(const Principal& p, std::string_view body) {
  if (!HasRole(p, {"publisher"})) return Forbidden(p, "publish");
  auto parsed = ParseBody(body, "publish intent");
  if (auto* r = std::get_if<Reply>(&parsed)) return *r;
  const auto& j = std::get<nlohmann::json>(parsed);
  std::string bad;
  IntentRow intent;
  intent.key = Str(j, "key", &bad);
  intent.digest = Str(j, "digest", &bad);
  intent.family = Str(j, "family", &bad);
  intent.release = Str(j, "release", &bad);
  intent.target = Str(j, "target", &bad);
  if (!bad.empty()) return Reply::Error(400, "bad_request", "publish intent: " + bad);
  auto size = j.find("size");
  if (size == j.end() || !size->is_number_unsigned() || size->get<uint64_t>() == 0) {
    return Reply::Error(400, "bad_request", "publish intent: 'size' must be a positive integer");
  }
  intent.size = size->get<uint64_t>();
  if (!IsWellFormedKey(intent.key)) {
    return Reply::Error(400, "bad_key", "key '" + intent.key + "' is not ck1- + 56 lowercase hex");
  }
  if (!IsWellFormedDigest(intent.digest)) {
    return Reply::Error(400, "bad_digest", "digest '" + intent.digest + "' is not sha256:<64 hex>");
  }
  if (intent.size > (2ull << 30)) {
    return Reply::Error(
        413, "too_large",
        "size " + std::to_string(intent.size) + " exceeds the hub's limit of 2 GiB");
  }
  if (Status s = CheckFamilyWrite(p, intent.family); !s.ok()) {
    return Reply::Error(IsWellFormedFamily(intent.family) ? 403 : 400,
                        IsWellFormedFamily(intent.family) ? "family_forbidden" : "bad_family",
                        s.message());
  }
  auto existing = store_->GetCell(intent.key);
  if (!existing.ok()) return Reply::FromStatus(existing.status());
  bool repair = false;
  if (existing->has_value()) {
    const CellRow& c = **existing;
    if (c.digest == intent.digest) {
      // The same cell again: already published, unless its stored bytes were damaged (or lost),
      // in which case this publisher's upload repairs them.
      Status intact = blobs_->Verify(c.digest);
      if (intact.ok()) {
        return Reply::Json(
            200, {{"already", true}, {"key", c.key}, {"digest", c.digest}, {"receipt", c.receipt}});
      }
      if (!intact.Is(kRefusalBlobCorrupt) && intact.code() != StatusCode::kNotFound) {
        return Reply::FromStatus(intact);
      }
      repair = true;
    }
    if (!repair) {
      return Reply::Error(409, "key_taken",
                          "key " + c.key + " is already owned by " + c.digest + " (first writer " +
                              c.publisher + "); " + intent.digest + " is refused",
                          {{"key", c.key}, {"digest", c.digest}, {"receipt", c.receipt}});
    }
  }
  intent.publisher = p.name;
  intent.created_at = Now();
  if (Status s = store_->PutIntent(intent); !s.ok()) return Reply::FromStatus(s);
  nlohmann::json answer{{"upload", "/v1/blobs/" + intent.digest},
                        {"have_blob", blobs_->Has(intent.digest)}};
  if (repair) answer["repair"] = true;
  return Reply::Json(200, answer);
}

// PUT /v1/blobs/{digest}
Reply HubService::UploadBlob(const Principal& p, const std::string& digest,
                             const BodyReader& read_body) {
  if (!HasRole(p, {"publisher"})) return Forbidden(p, "upload blobs");
  if (!IsWellFormedDigest(digest)) {
    return Reply::Error(400, "bad_digest", "digest '" + digest + "' is not sha256:<64 hex>");
  }
  auto intent = store_->FindIntentByDigest(digest);
  if (!intent.ok()) return Reply::FromStatus(intent.status());
  if (!intent->has_value()) {
    return Reply::Error(404, "no_intent",
                        "no publish intent declares " + digest + "; POST /v1/publish/intent first");
  }
  if (blobs_->Has(digest)) {
    // Already here and intact: nothing to store. Damaged: Verify quarantined it; store these.
    Status intact = blobs_->Verify(digest);
    if (intact.ok()) {
      read_body([](std::string_view) { return true; });  // drain: the bytes are already here
      return Reply::Json(200, {{"stored", true}, {"already", true}, {"digest", digest}});
    }
    if (!intact.Is(kRefusalBlobCorrupt) && intact.code() != StatusCode::kNotFound) {
      return Reply::FromStatus(intact);
    }
  }
  auto writer = blobs_->BeginWrite(digest, (*intent)->size);
  if (!writer.ok()) return Reply::FromStatus(writer.status());
  Status append_status;
  const bool complete = read_body([&](std::string_view chunk) {
    append_status = (*writer)->Append(chunk);
    return append_status.ok();
  });
  if (!append_status.ok()) {
    const std::string& token = (*writer)->refusal();
    if (!token.empty()) return Reply::Error(422, token, append_status.message());
    return Reply::FromStatus(append_status);
  }
  if (!complete) {
    return Reply::Error(400, "upload_incomplete",
                        "the upload of " + digest + " ended before its body did");
  }
  if (Status s = (*writer)->Commit(); !s.ok()) {
    const std::string& token = (*writer)->refusal();
    if (!token.empty()) return Reply::Error(422, token, s.message());
    return Reply::FromStatus(s);
  }
  return Reply::Json(200, {{"stored", true}, {"digest", digest}, {"size", (*intent)->size}});
}

// POST /v1/publish/complete
Reply HubService::PublishComplete(const Principal& p, std::string_view body) {
  if (!HasRole(p, {"publisher"})) return Forbidden(p, "publish");
  auto parsed = ParseBody(body, "publish complete");
  if (auto* r = std::get_if<Reply>(&parsed)) return *r;
  const auto& j = std::get<nlohmann::json>(parsed);
  std::string bad;
  const std::string key = Str(j, "key", &bad);
  const std::string digest = Str(j, "digest", &bad);
  if (!bad.empty()) return Reply::Error(400, "bad_request", "publish complete: " + bad);
  if (!IsWellFormedKey(key)) {
    return Reply::Error(400, "bad_key", "key '" + key + "' is not ck1- + 56 lowercase hex");
  }
  if (!IsWellFormedDigest(digest)) {
    return Reply::Error(400, "bad_digest", "digest '" + digest + "' is not sha256:<64 hex>");
  }
  // 1. The intent this completes, made by this publisher.
  auto intent_r = store_->GetIntent(key, digest);
  if (!intent_r.ok()) return Reply::FromStatus(intent_r.status());
  if (!intent_r->has_value()) {
    return Reply::Error(404, "no_intent", "no publish intent for " + key + "@" + digest);
  }
  const IntentRow intent = **intent_r;
  // 2. First writer already there? Same bytes: the same receipt. Other bytes: a typed conflict.
  auto existing = store_->GetCell(key);
  if (!existing.ok()) return Reply::FromStatus(existing.status());
  if (existing->has_value()) {
    const CellRow& c = **existing;
    if (c.digest == digest) {
      return Reply::Json(
          200, {{"already", true}, {"key", c.key}, {"digest", c.digest}, {"receipt", c.receipt}});
    }
    return Reply::Error(409, "key_taken", "key " + key + " is already owned by " + c.digest,
                        {{"key", c.key}, {"digest", c.digest}, {"receipt", c.receipt}});
  }
  // 3. The bytes, verified at upload.
  if (!blobs_->Has(digest)) {
    return Reply::Error(
        409, "blob_missing",
        "blob " + digest + " has not been uploaded (PUT " + "/v1/blobs/" + digest + ")");
  }
  auto bytes = blobs_->ReadAll(digest);
  if (!bytes.ok()) return Reply::FromStatus(bytes.status());
  if (bytes->size() != intent.size) {
    return Reply::Error(422, "size_mismatch",
                        "blob " + digest + " holds " + std::to_string(bytes->size()) +
                            " bytes, the intent declared " + std::to_string(intent.size));
  }
  // 4. The cell restates its own key with kiln's one function (law 3).
  auto files = UnpackCell(*bytes, "cell " + digest);
  if (!files.ok()) return Reply::Error(422, "bad_cell", files.status().message());
  auto meta = ParseMetadata(files->metadata_json, "metadata.json of " + digest);
  if (!meta.ok()) return Reply::Error(422, "bad_metadata", meta.status().message());
  auto restated = RestateKey(*meta);
  if (!restated.ok()) {
    return Reply::Error(
        422, "key_restatement_failed",
        "metadata.json of " + digest + " does not restate: " + restated.status().message());
  }
  if (*restated != key || meta->key != key) {
    return Reply::Error(422, "key_restatement_failed",
                        "metadata.json of " + digest + " restates to " + *restated + " (recorded " +
                            meta->key + "), expected " + key);
  }
  // 5. Family: the metadata's, the intent's, and one this publisher may write.
  if (meta->family != intent.family) {
    return Reply::Error(422, "family_mismatch",
                        "metadata.json family '" + meta->family + "' differs from the intent's '" +
                            intent.family + "'");
  }
  if (Status s = CheckFamilyWrite(p, meta->family); !s.ok()) {
    return Reply::Error(403, "family_forbidden", s.message());
  }
  // 6. Sign, then store first-writer-wins.
  ReceiptClaims claims;
  claims.key = key;
  claims.digest = digest;
  claims.size = intent.size;
  claims.family = meta->family;
  claims.publisher = p.name;
  claims.tier = p.tier.empty() ? "platform" : p.tier;
  claims.release = intent.release;
  claims.iat = Now();
  auto signing_key = keys_->Current();
  auto receipt = SignReceipt(claims, *signing_key);
  if (!receipt.ok()) return Reply::FromStatus(receipt.status());
  CellRow row{key,         digest,         intent.size, meta->family, p.name,
              claims.tier, intent.release, *receipt,    claims.iat};
  auto insert = store_->InsertCellIfAbsent(row);
  if (!insert.ok()) return Reply::FromStatus(insert.status());
  const CellRow* owner = &insert->owner;
  if (owner->digest != digest) {
    return Reply::Error(
        409, "key_taken", "key " + key + " was taken by " + owner->digest,
        {{"key", owner->key}, {"digest", owner->digest}, {"receipt", owner->receipt}});
  }
  if (!insert->inserted) {
    // A concurrent publisher of the same bytes won: its receipt is the one.
    return Reply::Json(
        200, {{"already", true}, {"key", key}, {"digest", digest}, {"receipt", owner->receipt}});
  }
  // 7. Obligations owed this key (or this release's target slot) are discharged.
  auto discharged =
      store_->DischargeObligations(key, digest, intent.release, intent.target, meta->sm, Now());
  if (!discharged.ok()) {
    KILN_LOG(WARNING) << "hub: cell " << key << " stored but discharging obligations failed: "
                      << discharged.status().ToString();
  }
  KILN_LOG(INFO) << "hub: stored cell " << key << "@" << digest << " family " << meta->family
                 << " by " << p.name;
  return Reply::Json(200, {{"key", key},
                           {"digest", digest},
                           {"receipt", *receipt},
                           {"discharged", discharged.ok() ? *discharged : 0}});
}

// GET /v1/receipts/{key}/{digest}
Reply HubService::GetReceipt(const Principal& p, const std::string& key,
                             const std::string& digest) {
  if (!IsWellFormedKey(key)) {
    return Reply::Error(400, "bad_key", "key '" + key + "' is not ck1- + 56 lowercase hex");
  }
  if (!IsWellFormedDigest(digest)) {
    return Reply::Error(400, "bad_digest", "digest '" + digest + "' is not sha256:<64 hex>");
  }
  auto cell = store_->GetCell(key);
  if (!cell.ok()) return Reply::FromStatus(cell.status());
  if (!cell->has_value() || (*cell)->digest != digest) {
    return Reply::Error(404, "not_found", "no receipt for " + key + "@" + digest);
  }
  auto revoked = store_->GetRevocation(key, digest);
  if (!revoked.ok()) return Reply::FromStatus(revoked.status());
  if (revoked->has_value()) {
    return Reply::Error(410, "revoked", key + "@" + digest + " was revoked: " + (*revoked)->reason,
                        {{"key", key}, {"digest", digest}, {"reason", (*revoked)->reason}});
  }
  return Reply::Json(200, {{"key", key}, {"digest", digest}, {"receipt", (*cell)->receipt}});
}

// GET /v1/revocations
Reply HubService::Revocations() {
  auto rows = store_->ListRevocations();
  if (!rows.ok()) return Reply::FromStatus(rows.status());
  nlohmann::json list = nlohmann::json::array();
  for (const auto& r : *rows) {
    list.push_back({{"key", r.key},
                    {"digest", r.digest},
                    {"reason", r.reason},
                    {"revoked_by", r.revoked_by},
                    {"revoked_at", r.revoked_at}});
  }
  return Reply::Json(200, {{"revocations", list}});
}

// POST /v1/admin/revoke
Reply HubService::Revoke(const Principal& p, std::string_view body) {
  if (p.role != "admin") return Forbidden(p, "revoke cells");
  auto parsed = ParseBody(body, "revoke");
  if (auto* r = std::get_if<Reply>(&parsed)) return *r;
  const auto& j = std::get<nlohmann::json>(parsed);
  std::string bad;
  RevocationRow row{Str(j, "key", &bad), Str(j, "digest", &bad), Str(j, "reason", &bad), p.name,
                    Now()};
  if (!bad.empty()) return Reply::Error(400, "bad_request", "revoke: " + bad);
  if (!IsWellFormedKey(row.key)) {
    return Reply::Error(400, "bad_key", "key '" + row.key + "' is not ck1- + 56 lowercase hex");
  }
  if (!IsWellFormedDigest(row.digest)) {
    return Reply::Error(400, "bad_digest", "digest '" + row.digest + "' is not sha256:<64 hex>");
  }
  if (row.reason.empty()) return Reply::Error(400, "bad_request", "revoke: 'reason' is required");
  if (Status s = store_->Revoke(row); !s.ok()) return Reply::FromStatus(s);
  KILN_LOG(INFO) << "hub: revoked " << row.key << "@" << row.digest << " by " << p.name << ": "
                 << row.reason;
  return Reply::Json(200, {{"revoked", true}, {"key", row.key}, {"digest", row.digest}});
}

Reply HubService::Jwks() { return Reply::Json(200, keys_->Jwks()); }

// POST /v1/admin/rotate-key
Reply HubService::RotateKey(const Principal& p) {
  if (p.role != "admin") return Forbidden(p, "rotate the signing key");
  auto kid = keys_->Rotate();
  if (!kid.ok()) return Reply::FromStatus(kid.status());
  KILN_LOG(INFO) << "hub: signing key rotated to " << *kid << " by " << p.name;
  return Reply::Json(200, {{"kid", *kid}, {"jwks", keys_->Jwks()}});
}

// POST /v1/releases
Reply HubService::CreateRelease(const Principal& p, std::string_view body) {
  if (p.role != "admin") return Forbidden(p, "declare releases");
  auto parsed = ParseBody(body, "release");
  if (auto* r = std::get_if<Reply>(&parsed)) return *r;
  const auto& j = std::get<nlohmann::json>(parsed);
  std::string bad;
  const std::string name = Str(j, "name", &bad);
  if (!bad.empty() || name.empty()) {
    return Reply::Error(400, "bad_request", "release: 'name' must be a non-empty string");
  }
  auto targets = j.find("targets");
  if (targets == j.end() || !targets->is_array() || targets->empty()) {
    return Reply::Error(400, "bad_request",
                        "release '" + name +
                            "': 'targets' must be a "
                            "non-empty array");
  }
  std::vector<ObligationRow> rows;
  for (size_t i = 0; i < targets->size(); ++i) {
    const auto& t = (*targets)[i];
    const std::string where = "release '" + name + "' targets[" + std::to_string(i) + "]";
    if (!t.is_object()) return Reply::Error(400, "bad_request", where + ": not an object");
    const std::string target = Str(t, "target", &bad);
    const std::string key = Str(t, "key", &bad);
    std::vector<std::string> sms;
    auto sm = t.find("sm");
    if (sm != t.end() && sm->is_string()) {
      sms.push_back(sm->get<std::string>());
    } else if (sm != t.end() && sm->is_array()) {
      for (const auto& s : *sm) {
        if (!s.is_string()) return Reply::Error(400, "bad_request", where + ": sm[] not strings");
        sms.push_back(s.get<std::string>());
      }
    }
    if (!bad.empty() || target.empty() || sms.empty()) {
      return Reply::Error(400, "bad_request",
                          where + ": needs 'target' (string) and 'sm' (string or array)" +
                              (bad.empty() ? "" : "; " + bad));
    }
    if (!key.empty() && !IsWellFormedKey(key)) {
      return Reply::Error(400, "bad_key", where + ": key '" + key + "' is not well-formed");
    }
    for (const auto& s : sms) {
      ObligationRow o;
      o.release = name;
      o.target = target;
      o.sm = s;
      o.key = key;
      o.updated_at = Now();
      rows.push_back(o);
    }
  }
  auto created = store_->AddObligations(rows);
  if (!created.ok()) return Reply::FromStatus(created.status());
  // A declared key already stored discharges at once: the obligation is owed a cell that exists.
  for (const auto& o : rows) {
    if (o.key.empty()) continue;
    auto cell = store_->GetCell(o.key);
    if (cell.ok() && cell->has_value()) {
      store_->DischargeObligations(o.key, (*cell)->digest, "", "", "", Now())
          .status()
          .IgnoreError();
    }
  }
  auto all = store_->ListObligations(name);
  if (!all.ok()) return Reply::FromStatus(all.status());
  nlohmann::json list = nlohmann::json::array();
  for (const auto& o : *all) list.push_back(ObligationJson(o));
  return Reply::Json(200, {{"release", name}, {"created", *created}, {"obligations", list}});
}

// GET /v1/releases/{name}/obligations
Reply HubService::ReleaseObligations(const Principal& p, const std::string& release) {
  auto all = store_->ListObligations(release);
  if (!all.ok()) return Reply::FromStatus(all.status());
  if (all->empty()) {
    return Reply::Error(404, "not_found", "release '" + release + "' has no obligations");
  }
  nlohmann::json list = nlohmann::json::array();
  for (const auto& o : *all) list.push_back(ObligationJson(o));
  return Reply::Json(200, {{"release", release}, {"obligations", list}});
}

// POST /v1/obligations/settle
Reply HubService::SettleObligation(const Principal& p, std::string_view body) {
  if (!HasRole(p, {"worker"})) return Forbidden(p, "settle obligations");
  auto parsed = ParseBody(body, "settle");
  if (auto* r = std::get_if<Reply>(&parsed)) return *r;
  const auto& j = std::get<nlohmann::json>(parsed);
  std::string bad;
  const std::string release = Str(j, "release", &bad);
  const std::string target = Str(j, "target", &bad);
  const std::string sm = Str(j, "sm", &bad);
  const std::string token = Str(j, "token", &bad);
  if (!bad.empty()) return Reply::Error(400, "bad_request", "settle: " + bad);
  if (!IsToken(token)) {
    return Reply::Error(400, "bad_request",
                        "settle: token '" + token + "' is not a lower_snake refusal token");
  }
  auto row = store_->SettleObligation(release, target, sm, token, Now());
  if (!row.ok()) return Reply::FromStatus(row.status());
  if (!row->has_value()) {
    return Reply::Error(404, "not_found",
                        "no obligation (" + release + ", " + target + ", " + sm + ")");
  }
  const ObligationRow& o = **row;
  if (o.state != "settled:" + token) {
    return Reply::Error(
        409, "already_terminal",
        "obligation (" + release + ", " + target + ", " + sm + ") is already '" + o.state + "'",
        {{"obligation", ObligationJson(o)}});
  }
  return Reply::Json(200, {{"obligation", ObligationJson(o)}});
}

// POST /v1/events
Reply HubService::PostEvents(const Principal& p, std::string_view body) {
  if (!HasRole(p, {"worker"})) return Forbidden(p, "post events");
  auto j = ParseJson(body, "events body");
  if (!j.ok()) return Reply::Error(400, "bad_request", j.status().message());
  const nlohmann::json* rows = &*j;
  if (j->is_object() && j->contains("events")) rows = &(*j)["events"];
  if (!rows->is_array()) {
    return Reply::Error(400, "bad_request", "events body: expected an array of event rows");
  }
  if (rows->size() > 10000) {
    return Reply::Error(
        413, "too_large",
        "events body: " + std::to_string(rows->size()) + " rows, at most 10000 per post");
  }
  std::vector<StoredEvent> out;
  const int64_t now_ms = Now() * 1000;
  for (size_t i = 0; i < rows->size(); ++i) {
    const auto& r = (*rows)[i];
    const std::string where = "events[" + std::to_string(i) + "]";
    if (!r.is_object()) return Reply::Error(400, "bad_request", where + ": not an object");
    std::string bad;
    StoredEvent e;
    e.worker = Str(r, "worker", &bad);
    e.kind = Str(r, "kind", &bad);
    e.phase = Str(r, "phase", &bad);
    e.key = Str(r, "key", &bad);
    if (e.key.empty()) e.key = Str(r, "ref", &bad);
    e.detail = Str(r, "detail", &bad);
    if (!bad.empty()) return Reply::Error(400, "bad_request", where + ": " + bad);
    if (e.kind.empty()) return Reply::Error(400, "bad_request", where + ": 'kind' is required");
    if (e.worker.empty()) e.worker = p.name;
    auto num = [&](const char* name, auto* out) -> bool {
      auto it = r.find(name);
      if (it == r.end() || it->is_null()) return true;
      if (!it->is_number()) return false;
      *out = it->get<std::remove_pointer_t<decltype(out)>>();
      return true;
    };
    if (!num("seq", &e.seq) || !num("duration_ms", &e.duration_ms) || !num("ts", &e.ts)) {
      return Reply::Error(400, "bad_request", where + ": seq, duration_ms and ts must be numbers");
    }
    if (e.ts == 0) e.ts = now_ms;
    out.push_back(std::move(e));
  }
  if (Status s = store_->InsertEvents(out); !s.ok()) return Reply::FromStatus(s);
  return Reply::Json(200, {{"accepted", out.size()}});
}

// GET /v1/events
Reply HubService::QueryEvents(const Principal& p, const std::map<std::string, std::string>& q) {
  EventFilter f;
  auto get = [&](const char* name) {
    auto it = q.find(name);
    return it == q.end() ? std::string() : it->second;
  };
  f.worker = get("worker");
  f.kind = get("kind");
  f.phase = get("phase");
  try {
    if (!get("since").empty()) f.since_ts = std::stoll(get("since"));
    if (!get("limit").empty()) f.limit = std::stoi(get("limit"));
  } catch (const std::exception&) {
    return Reply::Error(400, "bad_request", "events query: since and limit must be integers");
  }
  if (f.limit < 1 || f.limit > 10000) {
    return Reply::Error(400, "bad_request",
                        "events query: limit " + std::to_string(f.limit) + " outside [1, 10000]");
  }
  auto rows = store_->QueryEvents(f);
  if (!rows.ok()) return Reply::FromStatus(rows.status());
  nlohmann::json list = nlohmann::json::array();
  for (const auto& e : *rows) list.push_back(EventJson(e));
  return Reply::Json(200, {{"events", list}});
}

// GET /v1/blobs/{digest}
std::variant<std::unique_ptr<BlobReader>, Reply> HubService::OpenBlob(const Principal& p,
                                                                      const std::string& digest) {
  if (!IsWellFormedDigest(digest)) {
    return Reply::Error(400, "bad_digest", "digest '" + digest + "' is not sha256:<64 hex>");
  }
  auto reader = blobs_->Open(digest);
  if (!reader.ok()) return Reply::FromStatus(reader.status());
  return std::move(reader).value();
}

// GET /
Reply HubService::Dashboard() {
  std::ostringstream h;
  h << "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>kiln hub</title>"
       "<style>body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse;"
       "margin-bottom:2em}td,th{border:1px solid #ccc;padding:.25em .5em;font-size:90%;"
       "text-align:left}code{font-size:90%}</style></head><body>\n"
    << "<h1>kiln hub</h1>\n<p>store: " << HtmlEscape(store_->Describe())
    << " &middot; signing key: <code>" << HtmlEscape(keys_->Current()->kid()) << "</code></p>\n";
  auto fail = [&](const Status& s) {
    h << "<p class=\"error\">unavailable: " << HtmlEscape(s.ToString()) << "</p>\n";
  };

  h << "<h2>Cells</h2>\n<table id=\"cells\"><tr><th>key</th><th>family</th><th>size</th>"
       "<th>publisher</th><th>tier</th><th>release</th><th>adopted</th><th>state</th></tr>\n";
  auto cells = store_->ListCells(200);
  if (cells.ok()) {
    for (const auto& c : *cells) {
      auto adopted = store_->AdoptedCount(c.key);
      auto revoked = store_->GetRevocation(c.key, c.digest);
      h << "<tr class=\"cell\"><td><code>" << HtmlEscape(c.key) << "</code></td><td>"
        << HtmlEscape(c.family) << "</td><td>" << c.size << "</td><td>" << HtmlEscape(c.publisher)
        << "</td><td>" << HtmlEscape(c.tier) << "</td><td>" << HtmlEscape(c.release) << "</td><td>"
        << (adopted.ok() ? *adopted : 0) << "</td><td>"
        << (revoked.ok() && revoked->has_value() ? "revoked" : "live") << "</td></tr>\n";
    }
  }
  h << "</table>\n";
  if (!cells.ok()) fail(cells.status());

  h << "<h2>Obligations</h2>\n<table id=\"obligations\"><tr><th>release</th><th>target</th>"
       "<th>sm</th><th>key</th><th>state</th></tr>\n";
  auto obligations = store_->ListAllObligations();
  if (obligations.ok()) {
    for (const auto& o : *obligations) {
      h << "<tr class=\"obligation\"><td>" << HtmlEscape(o.release) << "</td><td>"
        << HtmlEscape(o.target) << "</td><td>" << HtmlEscape(o.sm) << "</td><td><code>"
        << HtmlEscape(o.key) << "</code></td><td>" << HtmlEscape(o.state) << "</td></tr>\n";
    }
  }
  h << "</table>\n";
  if (!obligations.ok()) fail(obligations.status());

  h << "<h2>Workers</h2>\n<table id=\"workers\"><tr><th>worker</th><th>events</th>"
       "<th>last event (unix ms)</th></tr>\n";
  auto workers = store_->ListWorkers();
  if (workers.ok()) {
    for (const auto& w : *workers) {
      h << "<tr class=\"worker\"><td>" << HtmlEscape(w.worker) << "</td><td>" << w.events
        << "</td><td>" << w.last_ts << "</td></tr>\n";
    }
  }
  h << "</table>\n";
  if (!workers.ok()) fail(workers.status());

  h << "<h2>Recent events</h2>\n<table id=\"events\"><tr><th>ts</th><th>worker</th><th>seq</th>"
       "<th>kind</th><th>phase</th><th>key</th><th>ms</th><th>detail</th></tr>\n";
  EventFilter f;
  f.limit = 50;
  auto events = store_->QueryEvents(f);
  if (events.ok()) {
    for (const auto& e : *events) {
      h << "<tr class=\"event\"><td>" << e.ts << "</td><td>" << HtmlEscape(e.worker) << "</td><td>"
        << e.seq << "</td><td>" << HtmlEscape(e.kind) << "</td><td>" << HtmlEscape(e.phase)
        << "</td><td><code>" << HtmlEscape(e.key) << "</code></td><td>" << e.duration_ms
        << "</td><td>" << HtmlEscape(e.detail) << "</td></tr>\n";
    }
  }
  h << "</table>\n";
  if (!events.ok()) fail(events.status());
  h << "</body></html>\n";
  Reply r;
  r.html = h.str();
  return r;
}

}  // namespace kiln
