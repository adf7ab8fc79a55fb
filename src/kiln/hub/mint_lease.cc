// Mint leases at the hub (hub layer; docs/fleet.md "One mint per cold key", docs/hub-api.md):
// when a fleet boots on a key no cell answers yet, one worker per (key, family) holds the lease
// and mints; the others wait for its publish, and take the lease over if its holder stops
// heartbeating. The lease only spares work: a worker that cannot reach the hub mints anyway, and
// two cells published for one key still resolve to the first writer's (store.h).
//
// Who may ask: a token that may publish into the family (the publish intent's rule), since the
// holder's next step is that publish. Clock: this hub's (HubServiceOptions::mint_lease_clock_ms),
// written into the rows; the store compares only the times its callers pass.
#include <chrono>
#include <optional>

#include "src/kiln/base/canonical_json.h"
#include "src/kiln/base/sha256.h"
#include "src/kiln/cell/key.h"
#include "src/kiln/hub/server.h"

namespace kiln {

namespace {

constexpr size_t kMaxHolderBytes = 128;

// The fields every lease route names, checked; or the refusal that answers the request.
struct LeaseRequest {
  std::string key;
  std::string family;
  std::string holder;
  std::string lease;
};

std::variant<LeaseRequest, Reply> ParseLeaseRequest(const Principal& p, std::string_view body,
                                                    const char* route, bool needs_holder,
                                                    bool needs_lease) {
  if (Status s = Authorize(p, Action::kPublish); !s.ok()) {
    return Reply::Error(403, s.token(), s.message());
  }
  auto j = ParseJson(body, std::string(route) + " body");
  if (!j.ok()) return Reply::Error(400, "bad_request", j.status().message());
  if (!j->is_object()) {
    return Reply::Error(400, "bad_request", std::string(route) + " body: expected a JSON object");
  }
  LeaseRequest r;
  for (auto [name, out] : {std::pair<const char*, std::string*>{"key", &r.key},
                           {"family", &r.family},
                           {"holder", &r.holder},
                           {"lease", &r.lease}}) {
    auto it = j->find(name);
    if (it == j->end() || it->is_null()) continue;
    if (!it->is_string()) {
      return Reply::Error(400, "bad_request",
                          std::string(route) + ": field '" + name + "' must be a string");
    }
    *out = it->get<std::string>();
  }
  if (!IsWellFormedKey(r.key)) {
    return Reply::Error(400, "bad_key", "key '" + r.key + "' is not ck1- + 56 lowercase hex");
  }
  if (needs_holder && (r.holder.empty() || r.holder.size() > kMaxHolderBytes)) {
    return Reply::Error(400, "bad_request",
                        std::string(route) + ": 'holder' must name the asking worker in 1.." +
                            std::to_string(kMaxHolderBytes) + " bytes, got " +
                            std::to_string(r.holder.size()));
  }
  if (needs_lease && r.lease.empty()) {
    return Reply::Error(400, "bad_request",
                        std::string(route) + ": 'lease' must be the id the grant answered");
  }
  if (Status s = CheckFamilyWrite(p, r.family); !s.ok()) {
    return Reply::Error(s.Is(kRefusalBadFamily) ? 400 : 403, s.token(), s.message());
  }
  return r;
}

}  // namespace

int64_t HubService::LeaseNowMs() const {
  if (options_.mint_lease_clock_ms) return options_.mint_lease_clock_ms();
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Reply HubService::AcquireMintLease(const Principal& p, std::string_view body) {
  auto parsed = ParseLeaseRequest(p, body, "mint lease", true, false);
  if (auto* r = std::get_if<Reply>(&parsed)) return *r;
  const auto& req = std::get<LeaseRequest>(parsed);
  // A live cell already answers the key: there is nothing to mint, resolve it instead.
  auto published = [&]() -> std::optional<Reply> {
    auto cell = store_->GetCellForResolve(req.key, req.family);
    if (!cell.ok()) return Reply::FromStatus(cell.status());
    if (!cell->has_value() || (*cell)->revocation.has_value()) return std::nullopt;
    return Reply::Json(200, {{"granted", false},
                             {"published", true},
                             {"key", req.key},
                             {"family", req.family},
                             {"digest", (*cell)->cell.digest}});
  };
  if (auto answer = published()) {
    lease_answers_.published.fetch_add(1, std::memory_order_relaxed);
    return *answer;
  }
  auto random = GenerateToken();
  if (!random.ok()) return Reply::FromStatus(random.status());
  const int64_t now = LeaseNowMs();
  const int64_t ttl = options_.mint_lease_ttl_ms;
  MintLeaseRow want{req.key, req.family, req.holder, Sha256Hex(*random).substr(0, 32),
                    now,     now + ttl};
  auto got = store_->AcquireMintLease(want, now);
  if (!got.ok()) return Reply::FromStatus(got.status());
  const MintLeaseRow& owner = got->owner;
  if (!got->granted) {
    lease_answers_.held.fetch_add(1, std::memory_order_relaxed);
    return Reply::Json(200, {{"granted", false},
                             {"published", false},
                             {"key", req.key},
                             {"family", req.family},
                             {"holder", owner.holder},
                             {"expires_in_ms", std::max<int64_t>(0, owner.expires_at_ms - now)},
                             {"ttl_ms", ttl}});
  }
  // A holder stores its cell before it releases its lease, so a grant that follows a release may
  // also follow a cell the check above ran too early to see (a waiter's ask racing the holder's
  // complete and release). Checked again: no lease is handed out for a key a live cell answers,
  // and the one just taken goes at once.
  if (auto answer = published()) {
    auto released = store_->ReleaseMintLease(req.key, req.family, owner.lease);
    if (!released.ok()) return Reply::FromStatus(released.status());
    lease_answers_.published.fetch_add(1, std::memory_order_relaxed);
    return *answer;
  }
  lease_answers_.granted.fetch_add(1, std::memory_order_relaxed);
  return Reply::Json(200, {{"granted", true},
                           {"key", req.key},
                           {"family", req.family},
                           {"holder", owner.holder},
                           {"lease", owner.lease},
                           {"expires_in_ms", ttl},
                           {"ttl_ms", ttl},
                           {"heartbeat_ms", std::max<int64_t>(1, ttl / 3)}});
}

Reply HubService::HeartbeatMintLease(const Principal& p, std::string_view body) {
  auto parsed = ParseLeaseRequest(p, body, "mint lease heartbeat", false, true);
  if (auto* r = std::get_if<Reply>(&parsed)) return *r;
  const auto& req = std::get<LeaseRequest>(parsed);
  const int64_t now = LeaseNowMs();
  const int64_t ttl = options_.mint_lease_ttl_ms;
  auto extended = store_->ExtendMintLease(req.key, req.family, req.lease, now + ttl);
  if (!extended.ok()) return Reply::FromStatus(extended.status());
  if (!*extended) {
    nlohmann::json extra = {{"key", req.key}, {"family", req.family}};
    auto now_held = store_->GetMintLease(req.key, req.family);
    if (now_held.ok() && now_held->has_value()) extra["holder"] = (*now_held)->holder;
    lease_answers_.lost.fetch_add(1, std::memory_order_relaxed);
    return Reply::Error(409, kRefusalLeaseLost,
                        "mint lease " + req.lease + " of " + req.key + " in family " + req.family +
                            " no longer holds it (released, or taken over after it expired)",
                        std::move(extra));
  }
  return Reply::Json(200, {{"lease", req.lease}, {"expires_in_ms", ttl}, {"ttl_ms", ttl}});
}

Reply HubService::ReleaseMintLease(const Principal& p, std::string_view body) {
  auto parsed = ParseLeaseRequest(p, body, "mint lease release", false, true);
  if (auto* r = std::get_if<Reply>(&parsed)) return *r;
  const auto& req = std::get<LeaseRequest>(parsed);
  auto released = store_->ReleaseMintLease(req.key, req.family, req.lease);
  if (!released.ok()) return Reply::FromStatus(released.status());
  // Releasing a lease that no longer holds is not an error: its holder is done either way.
  if (*released) lease_answers_.released.fetch_add(1, std::memory_order_relaxed);
  return Reply::Json(200, {{"released", *released}});
}

}  // namespace kiln
