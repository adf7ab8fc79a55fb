// HubService: every hub route as a plain method over the stores (hub layer). The HTTP binding is
// in server.cc; docs/hub-api.md documents each route, its bodies, status codes and error tokens.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <future>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <thread>
#include <variant>

#include "src/kiln/base/canonical_json.h"
#include "src/kiln/base/log.h"
#include "src/kiln/base/sha256.h"
#include "src/kiln/cell/admission.h"
#include "src/kiln/cell/key.h"
#include "src/kiln/cell/metadata.h"
#include "src/kiln/cell/pack.h"
#include "src/kiln/cell/provenance.h"
#include "src/kiln/hub/pg_shared.h"
#include "src/kiln/hub/server.h"
#include "src/kiln/net/http_server.h"

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

// The field of the revoke routes' answers that says what was revoked (docs/hub-api.md).
constexpr const char* kRevokedField = "revoked";
// The event kind a worker reports a cell with when one of its processes died inside it (the
// worker's event_kind::kCellCrashed; the hub does not include worker headers).
constexpr const char* kEventCellCrashed = "cell_crashed";

constexpr int64_t kTokenCacheSeconds = 10;

// The answer to a refused authorization rule (authz.h): its token, 400 for a malformed family,
// 403 otherwise.
Reply Refusal(const Status& s) {
  return Reply::Error(s.Is(kRefusalBadFamily) ? 400 : 403, s.token(), s.message());
}

Reply RevokedReply(const RevocationRow& r) {
  return Reply::Error(410, kRefusalRevoked, r.key + "@" + r.digest + " was revoked: " + r.reason,
                      {{"key", r.key}, {"digest", r.digest}, {"reason", r.reason}});
}

// A row of another org (an event, an obligation) asked for by name.
Reply OrgForbidden(const Principal& p, const std::string& what) {
  return Reply::Error(403, "scope_forbidden",
                      "principal '" + p.name + "' (org '" + p.org + "') may not read " + what);
}

Reply ScopeForbidden(const Principal& p, const std::string& family) {
  return Reply::Error(
      403, "scope_forbidden",
      "principal '" + p.name + "' (org '" + p.org + "') may not read family '" + family + "'");
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

// An owed obligation past its deadline (unix seconds; 0 = none) at `now`.
bool Overdue(const ObligationRow& o, int64_t now) {
  return o.state == "owed" && o.deadline > 0 && now > o.deadline;
}

nlohmann::json ObligationJson(const ObligationRow& o, int64_t now) {
  nlohmann::json j{{"release", o.release},
                   {"target", o.target},
                   {"sm", o.sm},
                   {"key", o.key},
                   {"state", o.state},
                   {"cell_digest", o.cell_digest},
                   {"updated_at", o.updated_at},
                   {"org", o.org},
                   {"overdue", Overdue(o, now)}};
  if (o.deadline > 0) j["deadline"] = o.deadline;
  return j;
}

nlohmann::json EventJson(const StoredEvent& e) {
  nlohmann::json stages = nlohmann::json::array();
  if (!e.stages.empty()) {
    auto parsed = nlohmann::json::parse(e.stages, nullptr, false);
    if (parsed.is_array()) stages = std::move(parsed);  // the service stored it checked
  }
  return {{"id", e.id},
          {"worker", e.worker},
          {"seq", e.seq},
          {"kind", e.kind},
          {"phase", e.phase},
          {"key", e.key},
          {"duration_ms", e.duration_ms},
          {"detail", e.detail},
          {"ts", e.ts},
          {"target", e.target},
          {"ref", e.ref},
          {"fn", e.fn},
          {"stages", stages},
          {"org", e.org}};
}

// A posted row's `stages`: absent or null = none; else an array of at most 64
// {"stage": non-empty string of at most 64 bytes, "ms": number}. Stored as compact JSON.
Result<std::string> CheckStages(const nlohmann::json& row) {
  const auto it = row.find("stages");
  if (it == row.end() || it->is_null()) return std::string();
  if (!it->is_array()) return Status::InvalidArgument("'stages' must be an array");
  if (it->size() > 64) {
    return Status::InvalidArgument("'stages' has " + std::to_string(it->size()) +
                                   " entries, at most 64");
  }
  nlohmann::json out = nlohmann::json::array();
  for (size_t i = 0; i < it->size(); ++i) {
    const auto& s = (*it)[i];
    const std::string at = "stages[" + std::to_string(i) + "]";
    if (!s.is_object() || s.size() != 2 || !s.contains("stage") || !s.contains("ms")) {
      return Status::InvalidArgument(at + " must be {\"stage\": NAME, \"ms\": NUMBER}");
    }
    if (!s["stage"].is_string() || s["stage"].get<std::string>().empty() ||
        s["stage"].get<std::string>().size() > 64) {
      return Status::InvalidArgument(at + ".stage must be a string of 1 to 64 bytes");
    }
    if (!s["ms"].is_number()) return Status::InvalidArgument(at + ".ms must be a number");
    out.push_back({{"stage", s["stage"]}, {"ms", s["ms"].get<double>()}});
  }
  return out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

struct HubService::TokenCache {
  std::mutex mu;
  std::map<std::string, std::pair<Principal, int64_t>> entries;  // sha256 -> (principal, expiry)
  std::map<std::string, TokenRow> tokens;                        // the tokens file, by sha256
};

struct HubService::Maintenance {
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  std::thread thread;
};

struct HubService::Pins {
  std::mutex mu;
  // Rebuilds in progress by digest: a second complete of the same bytes (a publisher retrying
  // after its own timeout, two replicas of one worker) waits for the first one's verdict instead
  // of compiling the same source again.
  std::map<std::string, std::shared_future<Result<RebuildAttestation>>> rebuilding;
  std::map<std::string, int> digests;             // digest -> publishes holding it
  std::map<std::string, uint64_t> uploading;      // publisher -> bytes of uploads in flight
  std::map<std::string, std::mutex> quota_locks;  // publisher -> serializes its quota checks

  bool Held(const std::string& digest) {
    std::lock_guard<std::mutex> lock(mu);
    return digests.count(digest) != 0;
  }
  std::mutex& QuotaLock(const std::string& publisher) {
    std::lock_guard<std::mutex> lock(mu);
    return quota_locks[publisher];
  }
};

namespace {

// Holds a digest against garbage collection for the life of a publish step.
class DigestPin {
 public:
  DigestPin(std::mutex& mu, std::map<std::string, int>& held, std::string digest)
      : mu_(mu), held_(held), digest_(std::move(digest)) {
    std::lock_guard<std::mutex> lock(mu_);
    ++held_[digest_];
  }
  ~DigestPin() {
    std::lock_guard<std::mutex> lock(mu_);
    if (--held_[digest_] <= 0) held_.erase(digest_);
  }
  DigestPin(const DigestPin&) = delete;
  DigestPin& operator=(const DigestPin&) = delete;

 private:
  std::mutex& mu_;
  std::map<std::string, int>& held_;
  std::string digest_;
};

// Bytes an upload in flight counts against its publisher's quota until it ends, however it ends.
class UploadReservation {
 public:
  UploadReservation(std::mutex& mu, std::map<std::string, uint64_t>& uploading,
                    std::string publisher, uint64_t bytes)
      : mu_(mu), uploading_(uploading), publisher_(std::move(publisher)), bytes_(bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    uploading_[publisher_] += bytes_;
  }
  ~UploadReservation() {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = uploading_.find(publisher_);
    if (it == uploading_.end()) return;
    it->second -= std::min(it->second, bytes_);
    if (it->second == 0) uploading_.erase(it);
  }
  UploadReservation(const UploadReservation&) = delete;
  UploadReservation& operator=(const UploadReservation&) = delete;

 private:
  std::mutex& mu_;
  std::map<std::string, uint64_t>& uploading_;
  std::string publisher_;
  uint64_t bytes_;
};

// A published member read from the stored blob in pieces (builder.h).
PublishedMember StoredMember(std::shared_ptr<BlobReader> reader, MemberSpan span,
                             std::string digest) {
  PublishedMember m;
  m.size = span.size;
  m.digest = std::move(digest);
  m.read = [reader, span](const std::function<Status(std::string_view)>& sink) -> Status {
    std::vector<char> buf(1 << 20);
    for (uint64_t done = 0; done < span.size;) {
      const size_t want = static_cast<size_t>(std::min<uint64_t>(buf.size(), span.size - done));
      KILN_ASSIGN_OR_RETURN(size_t n, reader->ReadAt(span.offset + done, buf.data(), want));
      if (n == 0) return Status::IOError("the stored blob ended inside a member");
      KILN_RETURN_IF_ERROR(sink(std::string_view(buf.data(), n)));
      done += n;
    }
    return Status::OK();
  };
  return m;
}

}  // namespace

HubService::HubService(std::unique_ptr<HubStore> store, std::unique_ptr<BlobStore> blobs,
                       std::unique_ptr<KeyRing> keys, std::function<int64_t()> now,
                       HubServiceOptions options)
    : store_(std::move(store)),
      blobs_(std::move(blobs)),
      keys_(std::move(keys)),
      now_(std::move(now)),
      options_(std::move(options)),
      token_cache_(std::make_unique<TokenCache>()),
      pins_(std::make_unique<Pins>()) {}

HubService::~HubService() {
  if (maintenance_) {
    {
      std::lock_guard<std::mutex> lock(maintenance_->mu);
      maintenance_->stop = true;
    }
    maintenance_->cv.notify_all();
    if (maintenance_->thread.joinable()) maintenance_->thread.join();
  }
}

Result<std::vector<std::string>> HubService::InstallTokens(const std::vector<TokenRow>& tokens) {
  KILN_ASSIGN_OR_RETURN(auto revoked, store_->ListRevokedTokens());
  std::map<std::string, TokenRow> live;
  std::vector<std::string> skipped;
  for (const TokenRow& t : tokens) {
    const bool dead = std::any_of(revoked.begin(), revoked.end(), [&](const RevokedTokenRow& r) {
      return r.token_sha256 == t.token_sha256;
    });
    if (dead) {
      skipped.push_back(t.name);
    } else {
      live[t.token_sha256] = t;
    }
  }
  std::lock_guard<std::mutex> lock(token_cache_->mu);
  token_cache_->tokens = std::move(live);
  token_cache_->entries.clear();
  return skipped;
}

void HubService::ShareTokens(std::unique_ptr<SharedTokens> tokens) {
  shared_tokens_ = std::move(tokens);
  std::lock_guard<std::mutex> lock(token_cache_->mu);
  token_cache_->entries.clear();
}

Result<std::optional<TokenRow>> HubService::FindToken(const std::string& hash) {
  if (shared_tokens_) return shared_tokens_->Find(hash);
  std::lock_guard<std::mutex> lock(token_cache_->mu);
  auto it = token_cache_->tokens.find(hash);
  if (it == token_cache_->tokens.end()) return std::optional<TokenRow>();
  return std::optional<TokenRow>(it->second);
}

Result<std::vector<TokenRow>> HubService::LiveTokensMatching(const std::string& name,
                                                             const std::string& sha256) {
  std::vector<TokenRow> out;
  if (!shared_tokens_) {
    std::lock_guard<std::mutex> lock(token_cache_->mu);
    for (const auto& [hash, t] : token_cache_->tokens) {
      if (sha256.empty() ? t.name == name : hash == sha256) out.push_back(t);
    }
    return out;
  }
  std::vector<TokenRow> rows;
  if (sha256.empty()) {
    KILN_ASSIGN_OR_RETURN(rows, shared_tokens_->FindByName(name));
  } else {
    KILN_ASSIGN_OR_RETURN(auto row, shared_tokens_->Find(sha256));
    if (row) rows.push_back(std::move(*row));
  }
  for (TokenRow& t : rows) {
    KILN_ASSIGN_OR_RETURN(bool dead, store_->IsTokenRevoked(t.token_sha256));
    if (!dead) out.push_back(std::move(t));
  }
  return out;
}

int64_t HubService::Now() const {
  if (now_) return now_();
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::variant<Principal, Reply> HubService::Authenticate(const std::string& header) {
  const std::string token = BearerToken(header);
  if (token.empty()) {
    return Reply::Error(401, net::kUnauthenticated,
                        "missing 'Authorization: Bearer <token>' header");
  }
  const std::string hash = Sha256Hex(token);
  const int64_t now = Now();
  {
    std::lock_guard<std::mutex> lock(token_cache_->mu);
    auto it = token_cache_->entries.find(hash);
    if (it != token_cache_->entries.end() && it->second.second > now) return it->second.first;
  }
  auto found = FindToken(hash);
  if (!found.ok()) return Reply::FromStatus(found.status());
  if (!found->has_value()) {
    return Reply::Error(401, net::kUnauthenticated, "the bearer token is not known to this hub");
  }
  const TokenRow t = std::move(**found);
  // Revoked by an admin, here or through another hub sharing the database.
  auto revoked = store_->IsTokenRevoked(hash);
  if (!revoked.ok()) return Reply::FromStatus(revoked.status());
  if (*revoked) {
    return Reply::Error(401, net::kUnauthenticated, "the bearer token was revoked");
  }
  // An org-scoped worker writes as its org; platform only when its row says so.
  std::string tier = t.tier;
  if (t.role == "admin") tier = "platform";
  if (t.role == "worker" && tier.empty() && !t.org.empty()) tier = "org";
  Principal p{t.name, t.role, tier, t.org, t.families, t.releases, t.token_sha256, t.quota_bytes};
  std::lock_guard<std::mutex> lock(token_cache_->mu);
  if (token_cache_->entries.size() > 10000) token_cache_->entries.clear();
  token_cache_->entries[hash] = {p, now + kTokenCacheSeconds};
  return p;
}

Reply HubService::Health() {
  return Reply::Json(200, {{"ok", true},
                           {"store", store_->Describe()},
                           {"kid", keys_->Current()->kid()},
                           {"builder", options_.builder ? options_.builder->name() : ""}});
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
  if (Status s = Authorize(p, Action::kReportDamage); !s.ok()) return Refusal(s);
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

// GET /v1/cells/{key}?family=
Reply HubService::ResolveCell(const Principal& p, const std::string& key,
                              const std::string& family) {
  if (!IsWellFormedKey(key)) {
    return Reply::Error(400, "bad_key", "key '" + key + "' is not ck1- + 56 lowercase hex");
  }
  if (!IsWellFormedFamily(family)) {
    return Reply::Error(400, "bad_family",
                        "resolve needs ?family=<namespace>/<name>: cells are owned per (key, "
                        "family); got '" +
                            family + "'");
  }
  if (!MayRead(p, family)) return ScopeForbidden(p, family);
  auto resolved = store_->GetCellForResolve(key, family);
  if (!resolved.ok()) return Reply::FromStatus(resolved.status());
  if (!resolved->has_value()) {
    return Reply::Json(200, {{"found", false}, {"key", key}, {"family", family}});
  }
  const CellRow& c = (*resolved)->cell;
  if (const auto& revoked = (*resolved)->revocation; revoked.has_value()) {
    return Reply::Error(410, kRefusalRevoked,
                        "cell " + c.key + "@" + c.digest + " was revoked: " + revoked->reason,
                        {{"key", c.key}, {"digest", c.digest}, {"reason", revoked->reason}});
  }
  nlohmann::json found{{"found", true},  {"key", c.key},         {"digest", c.digest},
                       {"size", c.size}, {"family", c.family},   {"publisher", c.publisher},
                       {"tier", c.tier}, {"release", c.release}, {"receipt", c.receipt}};
  // How many worker machines reported this cell crashing a worker (docs/fleet.md).
  auto crashed = CrashedMachines(c.key, c.key + "@" + c.digest);
  if (!crashed.ok()) return Reply::FromStatus(crashed.status());
  found["crashed_workers"] = *crashed;
  // p may read this family, so OpenBlob would serve p this digest: the same right, minted as a
  // URL the worker downloads from without the hub.
  if (std::string url = MintBlobUrl(c.digest); !url.empty()) {
    found["blob_url"] = url;
    found["blob_url_expires_in_s"] = options_.blob_url_ttl_s;
  }
  return Reply::Json(200, found);
}

// The storage quota of `p` in bytes; 0 = no limit.
uint64_t HubService::QuotaOf(const Principal& p) const {
  if (p.quota_bytes >= 0) return static_cast<uint64_t>(p.quota_bytes);
  return p.tier == "org" ? options_.org_quota_bytes : options_.platform_quota_bytes;
}

// Whether `p` may keep `adding` more bytes (a publish of `digest`): what its cell rows hold, what
// its other open intents have uploaded, and what it is uploading now, plus `adding`, within its
// quota. nullopt when it may; else the 413 quota_exceeded answer.
std::optional<Reply> HubService::CheckQuota(const Principal& p, const std::string& digest,
                                            uint64_t adding) {
  const uint64_t quota = QuotaOf(p);
  if (quota == 0) return std::nullopt;
  auto usage = store_->GetPublisherUsage(p.name);
  if (!usage.ok()) return Reply::FromStatus(usage.status());
  uint64_t used = usage->cell_bytes;
  std::set<std::string> counted;
  for (const IntentRow& i : usage->open_intents) {
    // Another publish's upload that arrived: its bytes are on disk until it completes or is
    // collected. This publish's own intent is what `adding` counts.
    if (i.digest != digest && counted.insert(i.digest).second && blobs_->Has(i.digest)) {
      used += i.size;
    }
  }
  {
    std::lock_guard<std::mutex> lock(pins_->mu);
    if (auto it = pins_->uploading.find(p.name); it != pins_->uploading.end()) used += it->second;
  }
  if (used + adding <= quota) return std::nullopt;
  return Reply::Error(413, "quota_exceeded",
                      "publisher '" + p.name + "' keeps " + std::to_string(used) +
                          " bytes on this hub; " + std::to_string(adding) + " more would pass " +
                          "its quota of " + std::to_string(quota) + " bytes",
                      {{"quota_bytes", quota}, {"used_bytes", used}, {"adding_bytes", adding}});
}

// The obligations a publish by `p` of (key, digest) for (release, target, sm) discharges: owed
// ones of this key, or of this release's target slot, in the releases this publisher holds, and
// for an org-scoped token only its own org's releases (a release belongs to one org:
// CreateRelease). Returns how many; a store failure is logged (the cell is stored either way).
int HubService::DischargeFor(const Principal& p, const std::string& key, const std::string& digest,
                             const std::string& release, const std::string& target,
                             const std::string& sm) {
  int discharged = 0;
  std::vector<std::string> scopes;
  if (const std::optional<std::string> org = RowScope(p); org.has_value()) {
    auto all = store_->ListAllObligations();
    if (!all.ok()) {
      KILN_LOG(WARNING) << "hub: cell " << key
                        << " stored but listing obligations failed: " << all.status().ToString();
    } else {
      std::set<std::string> releases;
      for (const ObligationRow& o : *all) {
        if (o.org == *org && o.state == "owed" && HoldsRelease(p, o.release)) {
          releases.insert(o.release);
        }
      }
      scopes.assign(releases.begin(), releases.end());
    }
  } else if (HoldsRelease(p, "*")) {
    scopes = {"*"};
  } else {
    scopes = p.releases;
  }
  for (const std::string& scope : scopes) {
    auto n = store_->DischargeObligations(key, digest, release, target, sm, Now(), scope);
    if (n.ok()) {
      discharged += *n;
    } else {
      KILN_LOG(WARNING) << "hub: cell " << key
                        << " stored but discharging obligations failed: " << n.status().ToString();
    }
  }
  return discharged;
}

// A publish the hub answers `already` (it holds these very bytes, live) is still this
// publisher's word that its release's target is served by them: what it owes is discharged as
// the publish that stored them would have. The slot's sm is the stored cell's own, read from its
// metadata (the archive's headers and that member only), never the publisher's say.
void HubService::DischargeOnAlready(const Principal& p, const CellRow& c,
                                    const std::string& release, const std::string& target) {
  if (release.empty()) return;
  auto owed = store_->ListObligations(release);
  if (!owed.ok()) return;
  const bool any = std::any_of(owed->begin(), owed->end(), [&](const ObligationRow& o) {
    return o.state == "owed" && (o.key == c.key || (o.key.empty() && o.target == target));
  });
  if (!any) return;
  auto sm = StoredCellSm(c.digest);
  if (!sm.ok()) {
    KILN_LOG(WARNING) << "hub: cannot read the sm of stored cell " << c.key << "@" << c.digest
                      << " (" << sm.status().ToString() << "); release " << release
                      << " is discharged by key only";
  }
  const int n = DischargeFor(p, c.key, c.digest, release, target, sm.ok() ? *sm : std::string());
  if (n > 0) {
    KILN_LOG(INFO) << "hub: " << n << " obligation(s) of release " << release
                   << " discharged by the stored cell " << c.key << " (publish by " << p.name
                   << " answered already)";
  }
}

Result<std::string> HubService::StoredCellSm(const std::string& digest) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<BlobReader> reader, blobs_->Open(digest));
  BlobReader* r = reader.get();
  const ArchiveReader read_at = [r](uint64_t offset, char* out, size_t len) {
    return r->ReadAt(offset, out, len);
  };
  KILN_ASSIGN_OR_RETURN(CellLayout layout, IndexCell(read_at, r->size(), "cell " + digest));
  std::string text(layout.metadata.size, '\0');
  for (size_t done = 0; done < text.size();) {
    KILN_ASSIGN_OR_RETURN(
        size_t n, r->ReadAt(layout.metadata.offset + done, text.data() + done, text.size() - done));
    if (n == 0) return Status::IOError("cell " + digest + ": metadata.json ends early");
    done += n;
  }
  KILN_ASSIGN_OR_RETURN(CellMetadata meta, ParseMetadata(text, "cell " + digest));
  return meta.sm;
}

// POST /v1/publish/intent
Reply HubService::PublishIntent(const Principal& p, std::string_view body) {
  if (Status s = Authorize(p, Action::kPublish); !s.ok()) return Refusal(s);
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
  if (intent.size > (2ull << 30) ||
      intent.size > options_.max_shared_object_bytes + kMaxMetadataBytes + kMaxSourceBytes) {
    return Reply::Error(413, net::kTooLarge,
                        "size " + std::to_string(intent.size) +
                            " exceeds what a cell may hold here (its shared object at most " +
                            std::to_string(options_.max_shared_object_bytes) + " bytes)");
  }
  if (Status s = CheckFamilyWrite(p, intent.family); !s.ok()) return Refusal(s);
  // A revoked (key, digest) never comes back, whoever publishes it.
  auto revoked = store_->GetRevocation(intent.key, intent.digest);
  if (!revoked.ok()) return Reply::FromStatus(revoked.status());
  if (revoked->has_value()) return RevokedReply(**revoked);
  auto existing = store_->GetCellForResolve(intent.key, intent.family);
  if (!existing.ok()) return Reply::FromStatus(existing.status());
  bool repair = false;
  if (existing->has_value() && !(*existing)->revocation.has_value()) {
    const CellRow& c = (*existing)->cell;
    if (c.digest == intent.digest) {
      // The same cell again: already published, unless its stored bytes were damaged (or lost),
      // in which case this publisher's upload repairs them.
      Status intact = blobs_->Verify(c.digest);
      if (intact.ok()) {
        DischargeOnAlready(p, c, intent.release, intent.target);
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
                          "key " + c.key + " is already owned in family " + c.family + " by " +
                              c.digest + " (first writer " + c.publisher + "); " + intent.digest +
                              " is refused",
                          {{"key", c.key}, {"digest", c.digest}, {"receipt", c.receipt}});
    }
  }
  intent.publisher = p.name;
  intent.created_at = Now();
  // The scope is this publisher's before a byte is uploaded: racing publishers wait on the one
  // that claimed it instead of each uploading a blob that only one complete can keep.
  if (auto busy = ClaimPublish(p, intent.key, intent.family, intent.digest)) return *busy;
  if (!blobs_->Has(intent.digest)) {
    std::lock_guard<std::mutex> quota_lock(pins_->QuotaLock(p.name));
    if (auto over = CheckQuota(p, intent.digest, intent.size)) {
      ReleasePublishClaim(p, intent.key, intent.family);
      return *over;
    }
  }
  if (Status s = store_->PutIntent(intent); !s.ok()) {
    ReleasePublishClaim(p, intent.key, intent.family);
    return Reply::FromStatus(s);
  }
  nlohmann::json answer{{"upload", "/v1/blobs/" + intent.digest},
                        {"have_blob", blobs_->Has(intent.digest)}};
  if (repair) answer["repair"] = true;
  return Reply::Json(200, answer);
}

// PUT /v1/blobs/{digest}
Reply HubService::UploadBlob(const Principal& p, const std::string& digest,
                             const BodyReader& read_body) {
  if (Status s = Authorize(p, Action::kPublish); !s.ok()) return Refusal(s);
  if (!IsWellFormedDigest(digest)) {
    return Reply::Error(400, "bad_digest", "digest '" + digest + "' is not sha256:<64 hex>");
  }
  // This publisher's own intent: another publisher's (a wrong size, say) never applies here.
  auto intent = store_->FindIntentByDigest(digest, p.name);
  if (!intent.ok()) return Reply::FromStatus(intent.status());
  if (!intent->has_value()) {
    return Reply::Error(404, "no_intent",
                        "publisher '" + p.name + "' declared no intent for " + digest +
                            "; POST /v1/publish/intent first");
  }
  // The claim again, made young for the upload; one that expired and went to another publisher
  // stops this upload, so a scope's racing publishers store one blob.
  if (auto busy = ClaimPublish(p, (*intent)->key, (*intent)->family, digest)) {
    read_body([](std::string_view) { return false; });
    return *busy;
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
  // The quota again, now with the uploads in flight: the bytes this upload may write are held
  // against it until the upload ends, and given back at once if it is abandoned (the writer
  // deletes its partial bytes when it goes).
  std::optional<UploadReservation> reservation;
  {
    std::lock_guard<std::mutex> quota_lock(pins_->QuotaLock(p.name));
    if (auto over = CheckQuota(p, digest, (*intent)->size)) {
      read_body([](std::string_view) { return false; });
      return *over;
    }
    reservation.emplace(pins_->mu, pins_->uploading, p.name, (*intent)->size);
  }
  DigestPin pin(pins_->mu, pins_->digests, digest);
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
    return Reply::Error(400, net::kBodyIncomplete,
                        "the upload of " + digest + " ended before its body did");
  }
  if (Status s = (*writer)->Commit(); !s.ok()) {
    const std::string& token = (*writer)->refusal();
    if (!token.empty()) return Reply::Error(422, token, s.message());
    return Reply::FromStatus(s);
  }
  return Reply::Json(200, {{"stored", true}, {"digest", digest}, {"size", (*intent)->size}});
}

// POST /v1/publish/complete. The claim ends with the publish: once a cell row owns the scope
// (or the publish was refused for good) other publishers' intents see it. A 5xx or blob_missing
// leaves the claim for this publisher's retry.
Reply HubService::PublishComplete(const Principal& p, std::string_view body) {
  std::optional<IntentRow> intent;
  Reply r = CompletePublish(p, body, &intent);
  const std::string token = r.body.is_object() ? r.body.value("error", std::string()) : "";
  if (intent.has_value() && r.status < 500 && token != "blob_missing") {
    ReleasePublishClaim(p, intent->key, intent->family);
  }
  return r;
}

std::optional<Reply> HubService::ClaimPublish(const Principal& p, const std::string& key,
                                              const std::string& family,
                                              const std::string& digest) {
  const int64_t now = Now();
  auto claim =
      store_->ClaimPublish(PublishClaim{key, family, p.name, digest,
                                        now + std::max<int64_t>(1, options_.publish_claim_ttl_s)},
                           now);
  if (!claim.ok()) return Reply::FromStatus(claim.status());
  if (claim->ours) return std::nullopt;
  const PublishClaim& h = claim->holder;
  Reply busy =
      Reply::Error(409, kRefusalPublishInProgress,
                   "publisher '" + h.publisher + "' is publishing key " + key + " in family " +
                       family + " (its claim lives " + std::to_string(h.expires_at - now) +
                       " s more); retry, and see its cell once it completes",
                   {{"key", key}, {"family", family}, {"claim_expires_in_s", h.expires_at - now}});
  busy.retry_after_s = 1;
  return busy;
}

void HubService::ReleasePublishClaim(const Principal& p, const std::string& key,
                                     const std::string& family) {
  auto released = store_->ReleasePublishClaim(key, family, p.name);
  if (!released.ok()) {
    KILN_LOG(WARNING) << "hub: releasing " << p.name << "'s publish claim on " << key << " in "
                      << family
                      << " failed (it expires on its own): " << released.status().ToString();
  }
}

Reply HubService::CompletePublish(const Principal& p, std::string_view body,
                                  std::optional<IntentRow>* intent_out) {
  if (Status s = Authorize(p, Action::kPublish); !s.ok()) return Refusal(s);
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
  // 1. The intent this completes, made by this publisher (another's never applies).
  auto intent_r = store_->GetIntent(key, digest, p.name);
  if (!intent_r.ok()) return Reply::FromStatus(intent_r.status());
  if (!intent_r->has_value()) {
    return Reply::Error(
        404, "no_intent",
        "publisher '" + p.name + "' has no publish intent for " + key + "@" + digest);
  }
  const IntentRow intent = **intent_r;
  *intent_out = intent;
  // Young again for the rebuild. Lost to another publisher (this one's expired): go on; the
  // first-writer-wins insert below still decides.
  if (auto busy = ClaimPublish(p, key, intent.family, digest); busy && busy->status >= 500) {
    return *busy;
  }
  auto revoked = store_->GetRevocation(key, digest);
  if (!revoked.ok()) return Reply::FromStatus(revoked.status());
  if (revoked->has_value()) return RevokedReply(**revoked);
  // 2. First writer of this scope already there? Same bytes: the same receipt. Other live bytes:
  // a typed conflict. A revoked owner does not hold the key.
  auto existing = store_->GetCellForResolve(key, intent.family);
  if (!existing.ok()) return Reply::FromStatus(existing.status());
  if (existing->has_value() && !(*existing)->revocation.has_value()) {
    const CellRow& c = (*existing)->cell;
    if (c.digest == digest) {
      DischargeOnAlready(p, c, intent.release, intent.target);
      return Reply::Json(
          200, {{"already", true}, {"key", c.key}, {"digest", c.digest}, {"receipt", c.receipt}});
    }
    return Reply::Error(
        409, "key_taken",
        "key " + key + " is already owned in family " + c.family + " by " + c.digest,
        {{"key", c.key}, {"digest", c.digest}, {"receipt", c.receipt}});
  }
  // 3. The bytes, verified at upload, held against garbage collection until this publish ends:
  // in this process by a pin, across hubs sharing the store by the intent made young again.
  if (!blobs_->Has(digest)) {
    return Reply::Error(
        409, "blob_missing",
        "blob " + digest + " has not been uploaded (PUT " + "/v1/blobs/" + digest + ")");
  }
  DigestPin pin(pins_->mu, pins_->digests, digest);
  IntentRow touched = intent;
  touched.created_at = Now();
  if (Status s = store_->PutIntent(touched); !s.ok()) return Reply::FromStatus(s);
  auto opened = blobs_->Open(digest);
  if (!opened.ok()) return Reply::FromStatus(opened.status());
  std::shared_ptr<BlobReader> reader = std::move(opened).value();
  // 4. The admission a worker runs on the bytes, with the worker's tokens: size, digest, the
  // archive, the metadata, the key restated by kiln's one function (law 3), the fence proof the
  // mint recorded (law 2), a plausible shared object, a source (law 13: evidence to publish).
  // Read in pieces where the blob lies: a cell of any size costs the hub its metadata and a
  // buffer, never its bytes.
  auto admitted = AdmitArchive(
      [reader](uint64_t offset, char* out, size_t len) { return reader->ReadAt(offset, out, len); },
      reader->size(), digest, intent.size, BytesPolicy{key, options_.max_shared_object_bytes});
  if (!admitted.ok()) {
    const Status& s = admitted.status();
    if (s.token().empty() && s.code() == StatusCode::kIOError) return Reply::FromStatus(s);
    return Reply::Error(422, s.token().empty() ? "cell_corrupt" : s.token(), s.message());
  }
  const CellMetadata& meta = admitted->metadata;
  if (meta.entries.size() > options_.max_cell_entries) {
    return Reply::Error(422, "too_many_entries",
                        "cell " + key + " holds " + std::to_string(meta.entries.size()) +
                            " entries; this hub rebuilds cells of at most " +
                            std::to_string(options_.max_cell_entries));
  }
  // 5. Family: the metadata's, the intent's, and one this publisher may write.
  if (meta.family != intent.family) {
    return Reply::Error(422, "family_mismatch",
                        "metadata.json family '" + meta.family + "' differs from the intent's '" +
                            intent.family + "'");
  }
  if (Status s = CheckFamilyWrite(p, meta.family); !s.ok()) return Refusal(s);
  const std::string write_tier = WriteTier(p, meta.family);
  // 6. The rebuild: the shared object must be what its source builds to with the pinned
  // toolchain (provenance.h), rebuilt in the builder's sandbox.
  RebuildAttestation attestation;
  if (options_.builder) {
    const PublishedMembers members{
        StoredMember(reader, admitted->layout.source, admitted->source_digest),
        StoredMember(reader, admitted->layout.shared_object, admitted->so_digest)};
    const bool platform = write_tier != "org";
    const RebuildRequester who{p.name, platform ? p.name : "org:" + p.org, platform};
    auto rebuilt =
        RebuildOnce(digest, [&] { return options_.builder->Rebuild(meta, members, who); });
    if (!rebuilt.ok()) {
      const Status& s = rebuilt.status();
      KILN_LOG(WARNING) << "hub: rebuild of " << key << "@" << digest << " by " << p.name
                        << " refused: " << s.ToString();
      if (s.Is(kRefusalBuilderUnavailable)) {
        return Reply::Error(503, kRefusalBuilderUnavailable, s.message());
      }
      if (s.Is(kRefusalBuilderBusy)) {
        Reply busy = Reply::Error(503, kRefusalBuilderBusy, s.message());
        busy.retry_after_s = 5;
        return busy;
      }
      return Reply::Error(422, s.token().empty() ? kRefusalRebuildFailed : s.token(), s.message());
    }
    attestation = *rebuilt;
  }
  // 6b. What may have changed while the rebuild ran: the token revoked (no receipt for it), the
  // bytes removed.
  if (!p.token_sha256.empty()) {
    auto token_revoked = store_->IsTokenRevoked(p.token_sha256);
    if (!token_revoked.ok()) return Reply::FromStatus(token_revoked.status());
    if (*token_revoked) {
      {
        std::lock_guard<std::mutex> lock(token_cache_->mu);
        token_cache_->entries.erase(p.token_sha256);
      }
      KILN_LOG(WARNING) << "hub: publish of " << key << "@" << digest << " by " << p.name
                        << " refused: the token was revoked while it ran";
      return Reply::Error(401, net::kUnauthenticated,
                          "the bearer token was revoked while this publish ran; nothing was "
                          "signed");
    }
  }
  if (!blobs_->Has(digest)) {
    return Reply::Error(409, "blob_missing",
                        "blob " + digest + " was removed while this publish ran; upload it again");
  }
  // 7. Sign, then store first-writer-wins within the family.
  ReceiptClaims claims;
  claims.key = key;
  claims.digest = digest;
  claims.size = intent.size;
  claims.family = meta.family;
  claims.publisher = p.name;
  claims.tier = write_tier;
  claims.org = claims.tier == "org" ? p.org : "";
  claims.release = intent.release;
  claims.iat = Now();
  claims.source_digest = admitted->source_digest;
  claims.so_digest = admitted->so_digest;
  claims.builder = attestation.builder;
  auto signing_key = keys_->Current();
  auto receipt = SignReceipt(claims, *signing_key);
  if (!receipt.ok()) return Reply::FromStatus(receipt.status());
  CellRow row{key,         digest,         intent.size, meta.family, p.name,
              claims.tier, intent.release, *receipt,    claims.iat};
  auto insert = store_->InsertCellIfAbsent(row);
  if (!insert.ok()) return Reply::FromStatus(insert.status());
  const CellRow* owner = &insert->owner;
  if (owner->digest != digest) {
    return Reply::Error(
        409, "key_taken",
        "key " + key + " was taken in family " + meta.family + " by " + owner->digest,
        {{"key", owner->key}, {"digest", owner->digest}, {"receipt", owner->receipt}});
  }
  if (!insert->inserted) {
    // A concurrent publisher of the same bytes won: its receipt is the one.
    DischargeFor(p, key, digest, intent.release, intent.target, meta.sm);
    return Reply::Json(
        200, {{"already", true}, {"key", key}, {"digest", digest}, {"receipt", owner->receipt}});
  }
  // 8. Obligations owed this key (or this release's target slot) are discharged.
  const int discharged = DischargeFor(p, key, digest, intent.release, intent.target, meta.sm);
  KILN_LOG(INFO) << "hub: stored cell " << key << "@" << digest << " family " << meta.family
                 << " by " << p.name
                 << (attestation.builder.empty()
                         ? std::string(" (no rebuild)")
                         : " rebuilt by " + attestation.builder + " in " +
                               std::to_string(static_cast<int64_t>(attestation.ms)) + " ms");
  return Reply::Json(200, {{"key", key},
                           {"digest", digest},
                           {"receipt", *receipt},
                           {"builder", attestation.builder},
                           {"discharged", discharged}});
}

Result<RebuildAttestation> HubService::RebuildOnce(
    const std::string& digest, const std::function<Result<RebuildAttestation>()>& rebuild) {
  std::promise<Result<RebuildAttestation>> mine;
  std::shared_future<Result<RebuildAttestation>> theirs;
  {
    std::lock_guard<std::mutex> lock(pins_->mu);
    auto it = pins_->rebuilding.find(digest);
    if (it != pins_->rebuilding.end()) {
      theirs = it->second;
    } else {
      pins_->rebuilding.emplace(digest, mine.get_future().share());
    }
  }
  if (theirs.valid()) return theirs.get();
  Result<RebuildAttestation> result = rebuild();
  mine.set_value(result);
  std::lock_guard<std::mutex> lock(pins_->mu);
  pins_->rebuilding.erase(digest);
  return result;
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
  auto cells = store_->ListCellsForKey(key);
  if (!cells.ok()) return Reply::FromStatus(cells.status());
  const CellRow* found = nullptr;
  for (const CellRow& c : *cells) {
    if (c.digest == digest && MayRead(p, c.family)) {
      found = &c;
      break;
    }
  }
  if (found == nullptr) {
    return Reply::Error(404, "not_found", "no receipt for " + key + "@" + digest);
  }
  auto revoked = store_->GetRevocation(key, digest);
  if (!revoked.ok()) return Reply::FromStatus(revoked.status());
  if (revoked->has_value()) return RevokedReply(**revoked);
  return Reply::Json(
      200,
      {{"key", key}, {"digest", digest}, {"family", found->family}, {"receipt", found->receipt}});
}

namespace {

HubOrder HubOrderOf(const OrderRow& o) {
  return HubOrder{o.release, o.target, o.kind, o.ref, o.share_ppm / 1e6, o.incarnation, o.reason};
}

nlohmann::json OrderJson(const OrderRow& o) {
  return {{"release", o.release}, {"target", o.target},         {"kind", o.kind},
          {"ref", o.ref},         {"share", o.share_ppm / 1e6}, {"incarnation", o.incarnation},
          {"reason", o.reason},   {"set_by", o.set_by},         {"set_at", o.set_at}};
}

}  // namespace

// POST /v1/admin/orders
// Orders which cell the workers of (release, target) serve. A pin or canary ref must be a cell the
// hub stores and has not revoked: an order for bytes no worker could adopt would leave the fleet
// eager.
Reply HubService::SetOrder(const Principal& p, std::string_view body) {
  if (Status s = Authorize(p, Action::kOrderCells); !s.ok()) return Refusal(s);
  auto parsed = ParseBody(body, "order");
  if (auto* r = std::get_if<Reply>(&parsed)) return *r;
  const auto& j = std::get<nlohmann::json>(parsed);
  std::string bad;
  OrderRow row;
  row.target = Str(j, "target", &bad);
  row.kind = Str(j, "kind", &bad);
  row.reason = Str(j, "reason", &bad);
  if (j.contains("release")) row.release = Str(j, "release", &bad);
  if (j.contains("ref")) row.ref = Str(j, "ref", &bad);
  if (j.contains("share")) {
    if (!j["share"].is_number()) {
      bad += (bad.empty() ? "" : "; ") + std::string("'share' must be a number in (0, 1]");
    } else {
      row.share_ppm = static_cast<int64_t>(j["share"].get<double>() * 1e6 + 0.5);
    }
  }
  if (!bad.empty()) return Reply::Error(400, "bad_request", "order: " + bad);
  if (row.reason.empty()) return Reply::Error(400, "bad_request", "order: 'reason' is required");
  HubOrder check = HubOrderOf(row);
  check.incarnation = 1;
  if (Status s = CheckHubOrder(check); !s.ok()) {
    return Reply::Error(400, "bad_order", "order: " + s.message());
  }
  if (!row.ref.empty()) {
    const std::string key = row.ref.substr(0, row.ref.find('@'));
    const std::string digest = row.ref.substr(row.ref.find('@') + 1);
    if (!IsWellFormedKey(key) || !IsWellFormedDigest(digest)) {
      return Reply::Error(400, "bad_order", "order: ref '" + row.ref + "' is not key@digest");
    }
    auto owners = store_->CellsWithDigest(digest);
    if (!owners.ok()) return Reply::FromStatus(owners.status());
    if (std::none_of(owners->begin(), owners->end(),
                     [&](const CellRow& c) { return c.key == key; })) {
      return Reply::Error(404, "not_found", "order: no cell " + row.ref + " is stored here",
                          {{"ref", row.ref}});
    }
    auto revoked = store_->GetRevocation(key, digest);
    if (!revoked.ok()) return Reply::FromStatus(revoked.status());
    if (revoked->has_value()) return RevokedReply(**revoked);
  }
  row.set_by = p.name;
  row.set_at = Now();
  auto stored = store_->SetOrder(row);
  if (!stored.ok()) return Reply::FromStatus(stored.status());
  KILN_LOG(INFO) << "hub: order for release '" << stored->release << "' target '" << stored->target
                 << "': " << stored->kind << (stored->ref.empty() ? "" : " " + stored->ref)
                 << " (incarnation " << stored->incarnation << ") by " << p.name;
  return Reply::Json(200, OrderJson(*stored));
}

// GET /v1/orders
Reply HubService::Orders() {
  auto orders = store_->ListOrders();
  if (!orders.ok()) return Reply::FromStatus(orders.status());
  nlohmann::json rows = nlohmann::json::array();
  for (const OrderRow& o : *orders) rows.push_back(OrderJson(o));
  return Reply::Json(200, {{"orders", rows}});
}

// GET /v1/revocations
// Signed afresh on every call (an Ed25519 signature costs microseconds), so its iat is now and an
// adopter can bound how old a list it relies on may be.
Reply HubService::Revocations() {
  auto rows = store_->ListRevocations();
  if (!rows.ok()) return Reply::FromStatus(rows.status());
  nlohmann::json list = nlohmann::json::array();
  RevocationList signed_list;
  signed_list.iat = Now();
  signed_list.max_age_s = options_.revocation_max_age_s;
  for (const auto& r : *rows) {
    nlohmann::json row = {{"key", r.key},
                          {"digest", r.digest},
                          {"reason", r.reason},
                          {"revoked_by", r.revoked_by},
                          {"revoked_at", r.revoked_at},
                          {"revision", r.revision},
                          {"in_force", r.in_force()}};
    if (!r.in_force()) {
      row["lifted_at"] = r.lifted_at;
      row["lifted_by"] = r.lifted_by;
      row["lift_reason"] = r.lift_reason;
    }
    list.push_back(std::move(row));
    signed_list.entries.push_back(
        {r.key, r.digest, r.reason, r.revoked_at, r.revision, r.lifted_at, r.lift_reason});
  }
  // The hub's orders travel in the same signed, fresh list: a worker obeys them within the same
  // bound and under the same freshness policy as a revocation.
  auto orders = store_->ListOrders();
  if (!orders.ok()) return Reply::FromStatus(orders.status());
  nlohmann::json order_rows = nlohmann::json::array();
  for (const OrderRow& o : *orders) {
    signed_list.orders.push_back(HubOrderOf(o));
    order_rows.push_back(OrderJson(o));
  }
  auto jws = SignRevocationList(signed_list, *keys_->Current());
  if (!jws.ok()) return Reply::FromStatus(jws.status());
  return Reply::Json(200, {{"list", *jws},
                           {"iat", signed_list.iat},
                           {"max_age_s", signed_list.max_age_s},
                           {"revocations", list},
                           {"orders", order_rows}});
}

// POST /v1/admin/revoke
Reply HubService::Revoke(const Principal& p, std::string_view body) {
  if (Status s = Authorize(p, Action::kRevokeCells); !s.ok()) return Refusal(s);
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
  // The key is free again in every family these bytes owned: a new digest may be published.
  return Reply::Json(200, {{kRevokedField, true}, {"key", row.key}, {"digest", row.digest}});
}

// POST /v1/admin/reinstate
// Lifts a revocation. The lift is a row of the signed list (one revision higher), never a
// deletion: a replayed list from before the lift carries a lower revision and loses on every
// adopter. The bytes were kept, so the cell resolves again where it still owns its key.
Reply HubService::Reinstate(const Principal& p, std::string_view body) {
  if (Status s = Authorize(p, Action::kRevokeCells); !s.ok()) return Refusal(s);
  auto parsed = ParseBody(body, "reinstate");
  if (auto* r = std::get_if<Reply>(&parsed)) return *r;
  const auto& j = std::get<nlohmann::json>(parsed);
  std::string bad;
  const std::string key = Str(j, "key", &bad);
  const std::string digest = Str(j, "digest", &bad);
  const std::string reason = Str(j, "reason", &bad);
  if (!bad.empty()) return Reply::Error(400, "bad_request", "reinstate: " + bad);
  if (!IsWellFormedKey(key)) {
    return Reply::Error(400, "bad_key", "key '" + key + "' is not ck1- + 56 lowercase hex");
  }
  if (!IsWellFormedDigest(digest)) {
    return Reply::Error(400, "bad_digest", "digest '" + digest + "' is not sha256:<64 hex>");
  }
  if (reason.empty()) return Reply::Error(400, "bad_request", "reinstate: 'reason' is required");
  auto row = store_->Reinstate(key, digest, p.name, reason, Now());
  if (!row.ok()) return Reply::FromStatus(row.status());
  if (!row->has_value()) {
    return Reply::Error(404, "not_revoked",
                        "reinstate: " + key + "@" + digest + " was never revoked on this hub",
                        {{"key", key}, {"digest", digest}});
  }
  // Whether the lifted bytes still own their key in some family: a digest published over the
  // freed key since the revocation keeps it, and the lift changes no resolve.
  auto owners = store_->CellsWithDigest(digest);
  if (!owners.ok()) return Reply::FromStatus(owners.status());
  const bool owns_key =
      std::any_of(owners->begin(), owners->end(), [&](const CellRow& c) { return c.key == key; });
  KILN_LOG(INFO) << "hub: reinstated " << key << "@" << digest << " by " << p.name << ": " << reason
                 << " (revision " << (*row)->revision << ")";
  return Reply::Json(200, {{"reinstated", true},
                           {"key", key},
                           {"digest", digest},
                           {"revision", (*row)->revision},
                           {"lifted_at", (*row)->lifted_at},
                           {"lifted_by", (*row)->lifted_by},
                           {"owns_key", owns_key}});
}

// POST /v1/admin/tokens/revoke
Reply HubService::RevokeToken(const Principal& p, std::string_view body) {
  if (Status s = Authorize(p, Action::kRevokeTokens); !s.ok()) return Refusal(s);
  auto parsed = ParseBody(body, "token revoke");
  if (auto* r = std::get_if<Reply>(&parsed)) return *r;
  const auto& j = std::get<nlohmann::json>(parsed);
  std::string bad;
  const std::string name = Str(j, "name", &bad);
  const std::string sha256 = Str(j, "sha256", &bad);
  if (!bad.empty()) return Reply::Error(400, "bad_request", "token revoke: " + bad);
  if (name.empty() == sha256.empty()) {
    return Reply::Error(400, "bad_request",
                        "token revoke: give exactly one of 'name' or 'sha256' (the token's "
                        "SHA-256, as in the tokens file)");
  }
  auto matching = LiveTokensMatching(name, sha256);
  if (!matching.ok()) return Reply::FromStatus(matching.status());
  std::vector<RevokedTokenRow> revoked;
  for (const TokenRow& t : *matching) revoked.push_back({t.token_sha256, t.name, p.name, Now()});
  if (revoked.empty()) {
    return Reply::Error(
        404, "not_found",
        "no live token " + (name.empty() ? "with sha256 " + sha256 : "named '" + name + "'"));
  }
  for (const RevokedTokenRow& r : revoked) {
    if (Status s = store_->RevokeToken(r); !s.ok()) return Reply::FromStatus(s);
  }
  nlohmann::json names = nlohmann::json::array();
  {
    std::lock_guard<std::mutex> lock(token_cache_->mu);
    for (const RevokedTokenRow& r : revoked) {
      token_cache_->tokens.erase(r.token_sha256);
      names.push_back(r.name);
    }
    token_cache_->entries.clear();  // dead now, not after the cache's few seconds
  }
  KILN_LOG(INFO) << "hub: revoked " << revoked.size() << " token(s) " << names.dump() << " by "
                 << p.name;
  return Reply::Json(200, {{kRevokedField, revoked.size()}, {"names", names}});
}

Reply HubService::Jwks() { return Reply::Json(200, keys_->Jwks()); }

// POST /v1/admin/rotate-key
Reply HubService::RotateKey(const Principal& p) {
  if (Status s = Authorize(p, Action::kManageKeys); !s.ok()) return Refusal(s);
  const std::string retired = keys_->Current()->kid();
  auto kid = keys_->Rotate(Now());
  if (!kid.ok()) return Reply::FromStatus(kid.status());
  KILN_LOG(INFO) << "hub: signing key rotated to " << *kid << " by " << p.name << "; " << retired
                 << " retired";
  return Reply::Json(200, {{"kid", *kid}, {"retired", retired}, {"jwks", keys_->Jwks()}});
}

// POST /v1/admin/keys/retire
Reply HubService::RetireKey(const Principal& p, std::string_view body) {
  if (Status s = Authorize(p, Action::kManageKeys); !s.ok()) return Refusal(s);
  auto parsed = ParseBody(body, "retire key");
  if (auto* r = std::get_if<Reply>(&parsed)) return *r;
  const auto& j = std::get<nlohmann::json>(parsed);
  std::string bad;
  const std::string kid = Str(j, "kid", &bad);
  if (!bad.empty()) return Reply::Error(400, "bad_request", "retire key: " + bad);
  const auto na = j.find("not_after");
  if (na == j.end() || !na->is_number_integer() || na->get<int64_t>() < 0) {
    return Reply::Error(400, "bad_request",
                        "retire key: 'not_after' must be a non-negative integer (unix seconds)");
  }
  Status s = keys_->Retire(kid, na->get<int64_t>());
  if (s.code() == StatusCode::kNotFound) return Reply::Error(404, "not_found", s.message());
  if (s.code() == StatusCode::kInvalidArgument)
    return Reply::Error(409, "key_current", s.message());
  if (!s.ok()) return Reply::FromStatus(s);
  KILN_LOG(INFO) << "hub: signing key " << kid << " retired at " << na->get<int64_t>() << " by "
                 << p.name;
  return Reply::Json(200, {{"kid", kid},
                           {"not_after", keys_->PublicKeys().NotAfter(kid).value_or(0)},
                           {"jwks", keys_->Jwks()}});
}

// POST /v1/admin/receipts/resign
Reply HubService::ResignReceipts(const Principal& p) {
  if (Status s = Authorize(p, Action::kManageKeys); !s.ok()) return Refusal(s);
  auto rows = store_->ListCells(std::numeric_limits<int>::max());
  if (!rows.ok()) return Reply::FromStatus(rows.status());
  const auto current = keys_->Current();
  // The hub's own keys without their retirements: a receipt is re-signed only if one of them
  // really signed it (a row altered in the store is not laundered into a fresh signature).
  const PublicKeySet ring = keys_->PublicKeys();
  PublicKeySet own;
  for (const auto& [kid, raw] : ring.keys()) own.AddRaw(raw).IgnoreError();
  int resigned = 0, current_already = 0;
  nlohmann::json refused = nlohmann::json::array();
  for (const CellRow& c : *rows) {
    const ReceiptVerdict v = VerifyReceipt(c.receipt, own, {c.key, c.digest, c.size, c.family});
    if (!v.ok()) {
      refused.push_back({{"key", c.key}, {"family", c.family}, {"error", v.token}});
      continue;
    }
    if (v.kid == current->kid()) {
      ++current_already;
      continue;
    }
    auto receipt = SignReceipt(v.claims, *current);
    if (!receipt.ok()) return Reply::FromStatus(receipt.status());
    auto changed = store_->UpdateReceipt(c.key, c.family, c.digest, *receipt);
    if (!changed.ok()) return Reply::FromStatus(changed.status());
    if (*changed) ++resigned;
  }
  KILN_LOG(INFO) << "hub: " << resigned << " receipt(s) re-signed with " << current->kid() << " by "
                 << p.name;
  return Reply::Json(200, {{"kid", current->kid()},
                           {"resigned", resigned},
                           {"current_already", current_already},
                           {"refused", refused}});
}

// POST /v1/releases
Reply HubService::CreateRelease(const Principal& p, std::string_view body) {
  if (Status s = Authorize(p, Action::kDeclareRelease); !s.ok()) return Refusal(s);
  auto parsed = ParseBody(body, "release");
  if (auto* r = std::get_if<Reply>(&parsed)) return *r;
  const auto& j = std::get<nlohmann::json>(parsed);
  std::string bad;
  const std::string name = Str(j, "name", &bad);
  if (!bad.empty() || name.empty()) {
    return Reply::Error(400, "bad_request", "release: 'name' must be a non-empty string");
  }
  // The tenant whose fleet owes these cells: its tokens see and settle the obligations.
  const std::string org = Str(j, "org", &bad);
  if (!bad.empty() || (!org.empty() && (org == "root" || !IsWellFormedFamily(org + "/x")))) {
    return Reply::Error(400, "bad_request",
                        "release '" + name + "': 'org' must be an org name other than 'root', " +
                            "got '" + org + "'");
  }
  // A deadline (unix seconds, > 0) for the whole release, or per target (which wins).
  auto deadline_of = [](const nlohmann::json& obj, int64_t fallback,
                        const std::string& where) -> std::variant<int64_t, std::string> {
    auto d = obj.find("deadline");
    if (d == obj.end()) return fallback;
    if (!d->is_number_integer() || d->get<int64_t>() <= 0) {
      return where + ": 'deadline' must be unix seconds (a positive integer), got " + d->dump();
    }
    return d->get<int64_t>();
  };
  const auto release_deadline = deadline_of(j, 0, "release '" + name + "'");
  if (const auto* e = std::get_if<std::string>(&release_deadline)) {
    return Reply::Error(400, "bad_request", *e);
  }
  auto targets = j.find("targets");
  if (targets == j.end() || !targets->is_array() || targets->empty()) {
    return Reply::Error(400, "bad_request",
                        "release '" + name +
                            "': 'targets' must be a "
                            "non-empty array");
  }
  // A release belongs to one org: its obligations are that org's rows, and the releases an
  // org's publish discharges are picked by name.
  auto existing = store_->ListObligations(name);
  if (!existing.ok()) return Reply::FromStatus(existing.status());
  for (const ObligationRow& o : *existing) {
    if (o.org != org) {
      return Reply::Error(
          409, "release_org_mismatch",
          "release '" + name + "' was declared for org '" + o.org + "', not '" + org + "'");
    }
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
    const auto deadline = deadline_of(t, std::get<int64_t>(release_deadline), where);
    if (const auto* e = std::get_if<std::string>(&deadline)) {
      return Reply::Error(400, "bad_request", *e);
    }
    for (const auto& s : sms) {
      ObligationRow o;
      o.release = name;
      o.target = target;
      o.sm = s;
      o.key = key;
      o.updated_at = Now();
      o.org = org;
      o.deadline = std::get<int64_t>(deadline);
      rows.push_back(o);
    }
  }
  auto created = store_->AddObligations(rows);
  if (!created.ok()) return Reply::FromStatus(created.status());
  // A declared key already stored by a platform publisher, live, discharges at once: the
  // obligation is owed a cell that exists. A tenant's cell under the same key never does.
  for (const auto& o : rows) {
    if (o.key.empty()) continue;
    auto cells = store_->ListCellsForKey(o.key);
    if (!cells.ok()) continue;
    for (const CellRow& c : *cells) {
      auto revoked = store_->GetRevocation(c.key, c.digest);
      if (c.tier != "platform" || !revoked.ok() || revoked->has_value()) continue;
      store_->DischargeObligations(o.key, c.digest, "", "", "", Now(), name).status().IgnoreError();
      break;
    }
  }
  auto all = store_->ListObligations(name);
  if (!all.ok()) return Reply::FromStatus(all.status());
  nlohmann::json list = nlohmann::json::array();
  for (const auto& o : *all) list.push_back(ObligationJson(o, Now()));
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
  for (const auto& o : *all) {
    if (MayReadRow(p, o.org)) list.push_back(ObligationJson(o, Now()));
  }
  if (list.empty()) return OrgForbidden(p, "the obligations of release '" + release + "'");
  return Reply::Json(200, {{"release", release}, {"obligations", list}});
}

// POST /v1/obligations/settle
Reply HubService::SettleObligation(const Principal& p, std::string_view body) {
  if (Status s = Authorize(p, Action::kSettle); !s.ok()) return Refusal(s);
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
  if (!HoldsRelease(p, release)) {
    return Reply::Error(403, "release_forbidden",
                        "principal '" + p.name + "' holds no grant for release '" + release +
                            "' and may not settle its obligations");
  }
  // A grant settles its own org's obligations only, whatever release names it holds.
  auto owed = store_->ListObligations(release);
  if (!owed.ok()) return Reply::FromStatus(owed.status());
  for (const ObligationRow& o : *owed) {
    if (o.target == target && o.sm == sm && !MayReadRow(p, o.org)) {
      return OrgForbidden(
          p, "obligation (" + release + ", " + target + ", " + sm + ") of org '" + o.org + "'");
    }
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
        {{"obligation", ObligationJson(o, Now())}});
  }
  return Reply::Json(200, {{"obligation", ObligationJson(o, Now())}});
}

// POST /v1/events
Reply HubService::PostEvents(const Principal& p, std::string_view body) {
  if (Status s = Authorize(p, Action::kReportEvents); !s.ok()) return Refusal(s);
  auto j = ParseJson(body, "events body");
  if (!j.ok()) return Reply::Error(400, "bad_request", j.status().message());
  const nlohmann::json* rows = &*j;
  if (j->is_object() && j->contains("events")) rows = &(*j)["events"];
  if (!rows->is_array()) {
    return Reply::Error(400, "bad_request", "events body: expected an array of event rows");
  }
  if (rows->size() > 10000) {
    return Reply::Error(
        413, net::kTooLarge,
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
    e.target = Str(r, "target", &bad);
    e.ref = Str(r, "ref", &bad);
    e.fn = Str(r, "fn", &bad);
    const std::string instance = Str(r, "instance", &bad);
    if (!bad.empty()) return Reply::Error(400, "bad_request", where + ": " + bad);
    auto stages = CheckStages(r);
    if (!stages.ok()) {
      return Reply::Error(400, "bad_request", where + ": " + stages.status().message());
    }
    e.stages = *std::move(stages);
    if (e.kind.empty()) return Reply::Error(400, "bad_request", where + ": 'kind' is required");
    // A worker token speaks for its own name only (and its processes: "<name>/<instance>").
    if (p.role != "admin" && !e.worker.empty() && e.worker != p.name &&
        e.worker.rfind(p.name + "/", 0) != 0) {
      return Reply::Error(403, "worker_mismatch",
                          where + ": worker '" + e.worker + "' is not '" + p.name +
                              "', the worker this token is bound to");
    }
    if (e.worker.empty()) e.worker = instance.empty() ? p.name : p.name + "/" + instance;
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
    e.org = RowOrg(p);
    out.push_back(std::move(e));
  }
  if (Status s = store_->InsertEvents(out); !s.ok()) return Reply::FromStatus(s);
  // Crash reports: counted, and a cell past the threshold revoked (once per ref in the batch).
  std::set<std::pair<std::string, std::string>> crashed;
  for (const StoredEvent& e : out) {
    if (e.kind != kEventCellCrashed) continue;
    crash_counters_.reports.fetch_add(1, std::memory_order_relaxed);
    crashed.insert({e.key, e.ref});
  }
  for (const auto& [key, ref] : crashed) MaybeRevokeCrashed(key, ref);
  return Reply::Json(200, {{"accepted", out.size()}});
}

std::string CrashMachineOf(const std::string& worker) {
  const size_t slash = worker.rfind('/');
  if (slash == std::string::npos || slash + 1 == worker.size()) return worker;
  const std::string tail = worker.substr(slash + 1);
  const bool pid =
      std::all_of(tail.begin(), tail.end(), [](char c) { return c >= '0' && c <= '9'; });
  return pid ? worker.substr(0, slash) : worker;
}

Result<int64_t> HubService::CrashedMachines(const std::string& key, const std::string& ref) {
  KILN_ASSIGN_OR_RETURN(std::vector<std::string> workers, store_->CrashReporters(key, ref));
  std::set<std::string> machines;
  for (const std::string& w : workers) machines.insert(CrashMachineOf(w));
  return static_cast<int64_t>(machines.size());
}

void HubService::MaybeRevokeCrashed(const std::string& key, const std::string& ref) {
  const int threshold = options_.crash_revoke_threshold;
  const size_t at = ref.find('@');
  if (threshold <= 0 || at == std::string::npos || ref.substr(0, at) != key ||
      !IsWellFormedKey(key) || !IsWellFormedDigest(ref.substr(at + 1))) {
    return;
  }
  const std::string digest = ref.substr(at + 1);
  auto machines = CrashedMachines(key, ref);
  if (!machines.ok()) {
    KILN_LOG(WARNING) << "hub: cannot count the crash reports of " << ref << ": "
                      << machines.status().ToString();
    return;
  }
  if (*machines < threshold) return;
  auto revoked = store_->GetRevocation(key, digest);
  if (!revoked.ok() || revoked->has_value()) return;
  RevocationRow row{key, digest,
                    std::string(kEventCellCrashed) + ": " + std::to_string(*machines) +
                        " worker machines reported this cell crashing a worker process "
                        "(--crash-revoke-threshold " +
                        std::to_string(threshold) + ")",
                    kCrashRevokedBy, Now()};
  if (Status s = store_->Revoke(row); !s.ok()) {
    KILN_LOG(WARNING) << "hub: cannot revoke " << ref
                      << " past the crash threshold: " << s.ToString();
    return;
  }
  crash_counters_.revocations.fetch_add(1, std::memory_order_relaxed);
  KILN_LOG(INFO) << "hub: revoked " << ref << ": " << row.reason;
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
  // Only the rows of the caller's org; an admin or platform-tier token may name one org.
  f.org = RowScope(p);
  if (q.count("org") > 0) {
    if (!MayReadRow(p, get("org")))
      return OrgForbidden(p, "the events of org '" + get("org") + "'");
    f.org = get("org");
  }
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

std::optional<Reply> HubService::CheckBlobReadable(const Principal& p, const std::string& digest) {
  if (!IsWellFormedDigest(digest)) {
    return Reply::Error(400, "bad_digest", "digest '" + digest + "' is not sha256:<64 hex>");
  }
  // Readable by a token whose scope may adopt a cell of these bytes, or by the publisher that
  // declared them; to anyone else it does not exist.
  bool readable = p.role == "admin";
  if (!readable) {
    auto cells = store_->CellsWithDigest(digest);
    if (!cells.ok()) return Reply::FromStatus(cells.status());
    for (const CellRow& c : *cells) readable = readable || MayRead(p, c.family);
  }
  if (!readable && Authorize(p, Action::kPublish).ok()) {
    auto own = store_->FindIntentByDigest(digest, p.name);
    if (!own.ok()) return Reply::FromStatus(own.status());
    readable = own->has_value();
  }
  if (!readable) {
    return Reply::Error(404, "not_found", "blob " + digest + " is not stored for this token");
  }
  return std::nullopt;
}

// GET /v1/blobs/{digest}
std::variant<std::unique_ptr<BlobReader>, Reply> HubService::OpenBlob(const Principal& p,
                                                                      const std::string& digest) {
  if (auto refused = CheckBlobReadable(p, digest)) return *refused;
  auto reader = blobs_->Open(digest);
  if (!reader.ok()) return Reply::FromStatus(reader.status());
  return std::move(reader).value();
}

std::string HubService::MintBlobUrl(const std::string& digest) {
  if (options_.blob_url_ttl_s <= 0 || !IsWellFormedDigest(digest)) return "";
  auto url = blobs_->DirectUrl(digest, options_.blob_url_ttl_s);
  if (url.ok()) return *url;
  if (url.status().code() != StatusCode::kUnimplemented) {
    KILN_LOG(WARNING) << "hub: no direct URL for blob " << digest << ": "
                      << url.status().ToString();
  }
  return "";
}

// GET /v1/blobs/{digest}?direct=1
std::variant<std::string, Reply> HubService::BlobDirectUrl(const Principal& p,
                                                           const std::string& digest) {
  if (auto refused = CheckBlobReadable(p, digest)) return *refused;
  return MintBlobUrl(digest);
}

Result<CollectedGarbage> HubService::CollectGarbage() {
  CollectedGarbage out;
  const int64_t horizon = Now() - options_.blob_grace_s;
  KILN_ASSIGN_OR_RETURN(out.intents, store_->DeleteIntentsBefore(horizon));
  KILN_ASSIGN_OR_RETURN(out.claims, store_->DeleteExpiredPublishClaims(Now()));
  KILN_ASSIGN_OR_RETURN(auto blobs, blobs_->ListStored());
  for (const auto& b : blobs) {
    if (b.stored_at >= horizon) continue;  // young: its publish may still complete
    if (pins_->Held(b.digest)) continue;   // a publish in this process is using it
    KILN_ASSIGN_OR_RETURN(auto cells, store_->CellsWithDigest(b.digest));
    if (!cells.empty()) continue;
    KILN_ASSIGN_OR_RETURN(auto intent, store_->FindIntentByDigest(b.digest, ""));
    if (intent.has_value()) continue;
    KILN_RETURN_IF_ERROR(blobs_->Remove(b.digest));
    ++out.blobs;
  }
  if (out.intents > 0 || out.blobs > 0) {
    KILN_LOG(INFO) << "hub: collected " << out.blobs << " unreferenced blob(s) and " << out.intents
                   << " abandoned intent(s) older than " << options_.blob_grace_s << " s";
  }
  return out;
}

void HubService::StartMaintenance(int interval_s) {
  if (maintenance_ || interval_s <= 0) return;
  maintenance_ = std::make_unique<Maintenance>();
  Maintenance* m = maintenance_.get();
  m->thread = std::thread([this, m, interval_s] {
    std::unique_lock<std::mutex> lock(m->mu);
    while (!m->stop) {
      lock.unlock();
      auto collected = CollectGarbage();
      if (!collected.ok()) {
        KILN_LOG(WARNING) << "hub: garbage collection failed: " << collected.status().ToString();
      }
      lock.lock();
      m->cv.wait_for(lock, std::chrono::seconds(interval_s), [m] { return m->stop; });
    }
  });
}

// GET /
Reply HubService::Dashboard(const Principal& p) {
  const std::optional<std::string> scope = RowScope(p);
  std::ostringstream h;
  h << "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>kiln hub</title>"
       "<style>body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse;"
       "margin-bottom:2em}td,th{border:1px solid #ccc;padding:.25em .5em;font-size:90%;"
       "text-align:left}code{font-size:90%}</style></head><body>\n"
    << "<h1>kiln hub</h1>\n<p>as: " << HtmlEscape(p.name)
    << (scope.has_value() ? " (org '" + HtmlEscape(*scope) + "')" : std::string(" (every org)"))
    << " &middot; store: " << HtmlEscape(store_->Describe()) << " &middot; signing key: <code>"
    << HtmlEscape(keys_->Current()->kid()) << "</code></p>\n";
  auto fail = [&](const Status& s) {
    h << "<p class=\"error\">unavailable: " << HtmlEscape(s.ToString()) << "</p>\n";
  };

  h << "<h2>Cells</h2>\n<table id=\"cells\"><tr><th>key</th><th>family</th><th>size</th>"
       "<th>publisher</th><th>tier</th><th>release</th><th>adopted</th><th>state</th></tr>\n";
  auto cells = store_->ListCells(200);
  if (cells.ok()) {
    for (const auto& c : *cells) {
      if (!MayRead(p, c.family)) continue;
      auto adopted = store_->AdoptedCount(c.key, scope);
      auto revoked = store_->GetRevocation(c.key, c.digest);
      h << "<tr class=\"cell\"><td><code>" << HtmlEscape(c.key) << "</code></td><td>"
        << HtmlEscape(c.family) << "</td><td>" << c.size << "</td><td>" << HtmlEscape(c.publisher)
        << "</td><td>" << HtmlEscape(c.tier) << "</td><td>" << HtmlEscape(c.release) << "</td><td>"
        << (adopted.ok() ? *adopted : 0) << "</td><td>"
        << (revoked.ok() && revoked->has_value() ? kRefusalRevoked : "live") << "</td></tr>\n";
    }
  }
  h << "</table>\n";
  if (!cells.ok()) fail(cells.status());

  // Overdue rows (owed past their deadline) are counted above the table and marked in it.
  auto obligations = store_->ListAllObligations();
  const int64_t now = Now();
  int overdue = 0;
  if (obligations.ok()) {
    for (const auto& o : *obligations) overdue += MayReadRow(p, o.org) && Overdue(o, now);
  }
  h << "<h2>Obligations</h2>\n<p id=\"obligations-overdue\">overdue: " << overdue << "</p>\n"
    << "<table id=\"obligations\"><tr><th>release</th><th>target</th>"
       "<th>sm</th><th>key</th><th>state</th><th>deadline (unix s)</th></tr>\n";
  if (obligations.ok()) {
    for (const auto& o : *obligations) {
      if (!MayReadRow(p, o.org)) continue;
      const bool late = Overdue(o, now);
      h << "<tr class=\"obligation" << (late ? " overdue" : "") << "\"><td>"
        << HtmlEscape(o.release) << "</td><td>" << HtmlEscape(o.target) << "</td><td>"
        << HtmlEscape(o.sm) << "</td><td><code>" << HtmlEscape(o.key) << "</code></td><td>"
        << HtmlEscape(o.state) << (late ? " (overdue)" : "") << "</td><td>"
        << (o.deadline > 0 ? std::to_string(o.deadline) : std::string("-")) << "</td></tr>\n";
    }
  }
  h << "</table>\n";
  if (!obligations.ok()) fail(obligations.status());

  h << "<h2>Workers</h2>\n<table id=\"workers\"><tr><th>worker</th><th>events</th>"
       "<th>last event (unix ms)</th></tr>\n";
  auto workers = store_->ListWorkers(scope);
  if (workers.ok()) {
    for (const auto& w : *workers) {
      h << "<tr class=\"worker\"><td>" << HtmlEscape(w.worker) << "</td><td>" << w.events
        << "</td><td>" << w.last_ts << "</td></tr>\n";
    }
  }
  h << "</table>\n";
  if (!workers.ok()) fail(workers.status());

  // What each worker serves per target, from the newest serve_posture row it posted (an install
  // names the cell's ref, an eager posture its token), beside the newest hub order it applied:
  // where a canary, a pin or a rollback has reached.
  h << "<h2>Serving</h2>\n<table id=\"serving\"><tr><th>worker</th><th>target</th>"
       "<th>serving</th><th>ref</th><th>hub order</th></tr>\n";
  EventFilter served;
  served.kind = "serve_posture";
  served.limit = 5000;
  served.org = scope;
  EventFilter ordered = served;
  ordered.kind = "hub_order";
  auto postures = store_->QueryEvents(served);
  auto orders_applied = store_->QueryEvents(ordered);
  if (postures.ok() && orders_applied.ok()) {
    std::map<std::pair<std::string, std::string>, std::string> last_order;
    for (const auto& e : *orders_applied) {  // newest first
      last_order.emplace(std::make_pair(e.worker, e.target), e.phase + " " + e.detail);
    }
    std::set<std::pair<std::string, std::string>> seen;
    for (const auto& e : *postures) {
      if (e.target.empty() || !seen.insert({e.worker, e.target}).second) continue;
      auto o = last_order.find({e.worker, e.target});
      h << "<tr class=\"serving\"><td>" << HtmlEscape(e.worker) << "</td><td>"
        << HtmlEscape(e.target) << "</td><td>" << HtmlEscape(e.phase) << "</td><td><code>"
        << HtmlEscape(e.ref) << "</code></td><td>"
        << HtmlEscape(o == last_order.end() ? std::string("-") : o->second) << "</td></tr>\n";
    }
  }
  h << "</table>\n";
  if (!postures.ok()) fail(postures.status());
  if (!orders_applied.ok()) fail(orders_applied.status());

  h << "<h2>Recent events</h2>\n<table id=\"events\"><tr><th>ts</th><th>worker</th><th>seq</th>"
       "<th>kind</th><th>phase</th><th>key</th><th>ms</th><th>detail</th></tr>\n";
  EventFilter f;
  f.limit = 50;
  f.org = scope;
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
