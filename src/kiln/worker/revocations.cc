// RevocationWatch: the signed revocation list at adoption and while running (see revocations.h).
#include "src/kiln/worker/revocations.h"

#include <chrono>
#include <nlohmann/json.hpp>

#include "src/kiln/base/clock.h"
#include "src/kiln/base/file.h"
#include "src/kiln/base/log.h"

namespace kiln {

namespace {

// The hub could not be asked, or could not answer now (its store down).
bool IsTransient(const std::string& token) {
  return IsHubTransportToken(token) || token == kHubStoreUnavailable;
}

// One fetch of the hub's list, verified with `*keys` at `now` (receipt/receipt.h
// VerifyRevocationList). With `refetch_keys` (the keys are the hub's own, not operator anchors) an
// unknown key id fetches the hub's key set once and adds it to `*keys`. Refusals:
// `revocations_unreachable` when the hub could not be asked (a transport failure or a 5xx;
// `*transient` true), `revocations_unreadable` when it answered an error, else the
// verification's token. `*jws` receives the list as fetched.
Result<RevocationList> FetchRevocationList(HubClient& hub, PublicKeySet* keys, bool refetch_keys,
                                           int64_t now, int64_t max_age_cap_s, bool* transient,
                                           std::string* jws) {
  *transient = false;
  HubAnswer a = hub.GetRevocations();
  if (!a.ok()) {
    *transient = IsTransient(a.token) || a.http_status >= 500;
    return Status::Refused(
        StatusCode::kIOError,
        *transient ? kRefusalRevocationsUnreachable : kRefusalRevocationsUnreadable,
        "the hub's revocation list: " + a.token + ": " + a.message);
  }
  jws->clear();
  if (a.body.is_object() && a.body.contains("list") && a.body["list"].is_string()) {
    *jws = a.body["list"].get<std::string>();
  }
  auto list = VerifyRevocationList(*jws, *keys, now, max_age_cap_s);
  if (!list.ok() && list.status().Is(kRevocationsUnknownKid) && refetch_keys) {
    // The hub's key set, fetched (again) once: a rotation since the last fetch is not a refusal.
    if (Status added = hub.AddHubKeys(keys); !added.ok()) {
      *transient = IsTransient(added.token());
      return Status::Refused(
          StatusCode::kIOError,
          *transient ? kRefusalRevocationsUnreachable : kRefusalRevocationsUnreadable,
          "the hub's key set, to verify its revocation list: " + added.message());
    }
    list = VerifyRevocationList(*jws, *keys, now, max_age_cap_s);
  }
  return list;
}

}  // namespace

RevocationWatch::RevocationWatch(RevocationWatchOptions options) : options_(std::move(options)) {
  if (options_.clock == nullptr) options_.clock = Clock::Real();
}

int64_t RevocationWatch::Now() const { return options_.clock->UnixSeconds(); }

Result<std::unique_ptr<RevocationWatch>> RevocationWatch::Create(RevocationWatchOptions options) {
  std::unique_ptr<RevocationWatch> w(new RevocationWatch(std::move(options)));
  KILN_ASSIGN_OR_RETURN(w->client_, HubClient::Create(w->options_.hub));
  w->LoadState();
  if (w->options_.use_anchors) {
    w->keys_ = w->options_.anchors;
  } else if (!w->options_.cache_path.empty()) {
    // The hub's keys as an earlier run fetched them (trusted as they were then: docs/trust.md).
    auto jwks = ReadFile(w->options_.cache_path + ".jwks");
    if (jwks.ok()) {
      auto keys = PublicKeySet::FromText(*jwks, w->options_.cache_path + ".jwks");
      if (keys.ok()) w->keys_ = *keys;
    }
  }
  // A list kept by an earlier run is used only if it still verifies and is still fresh.
  if (!w->options_.cache_path.empty()) {
    auto text = ReadFile(w->options_.cache_path);
    if (text.ok()) {
      auto list = VerifyRevocationList(*text, w->keys_, w->Now(), w->options_.max_age_cap_s);
      if (list.ok()) {
        w->current_ = *list;
        w->Apply(*list);
      }
    }
  }
  return w;
}

RevocationWatch::~RevocationWatch() { Stop(); }

void RevocationWatch::Emit(const char* kind, const std::string& phase, const std::string& ref,
                           const std::string& target, const std::string& detail) {
  if (options_.events == nullptr) return;
  EventRow row;
  row.kind = kind;
  row.phase = phase;
  row.ref = ref;
  row.key = ref.substr(0, ref.find('@'));
  row.target = target;
  row.detail = (target.empty() ? std::string() : "target=" + target + " ") +
               (options_.worker.empty() ? std::string() : "worker=" + options_.worker + " ") +
               detail;
  options_.events->Append(std::move(row));
}

Result<RevocationList> RevocationWatch::Fetch(bool* transient) {
  PublicKeySet keys;
  {
    std::lock_guard<std::mutex> lock(mu_);
    keys = keys_;
  }
  std::string jws;
  auto list = FetchRevocationList(*client_, &keys, !options_.use_anchors, Now(),
                                  options_.max_age_cap_s, transient, &jws);
  {
    std::lock_guard<std::mutex> lock(mu_);
    keys_.AddAll(keys).IgnoreError();
  }
  if (!list.ok()) return list.status();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!current_ || list->iat >= current_->iat) current_ = *list;
    fetched_at_ = Now();
  }
  if (!options_.cache_path.empty()) {
    WriteFileAtomic(options_.cache_path, jws, Durability::kScratch).IgnoreError();
    if (!options_.use_anchors) {
      WriteFileAtomic(options_.cache_path + ".jwks", keys.ToJwks().dump(), Durability::kScratch)
          .IgnoreError();
    }
  }
  return list;
}

PublicKeySet RevocationWatch::Keys() const {
  std::lock_guard<std::mutex> lock(mu_);
  return keys_;
}

std::optional<RevocationList> RevocationWatch::FreshCurrent(int64_t now) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!current_) return std::nullopt;
  const int64_t max_age = options_.max_age_cap_s > 0
                              ? std::min(current_->max_age_s, options_.max_age_cap_s)
                              : current_->max_age_s;
  if (now - current_->iat > max_age || current_->iat > now + kRevocationClockSkewS) {
    return std::nullopt;
  }
  return current_;
}

bool RevocationWatch::IsRevoked(const std::string& digest) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = digests_.find(digest);
  return it != digests_.end() && it->second.revoked;
}

void RevocationWatch::SetOnReinstated(std::function<void(const std::string&)> on_reinstated) {
  std::lock_guard<std::mutex> lock(mu_);
  on_reinstated_ = std::move(on_reinstated);
}

void RevocationWatch::SetOnOrder(std::function<void(const HubOrder&)> on_order) {
  std::lock_guard<std::mutex> lock(mu_);
  on_order_ = std::move(on_order);
}

std::optional<HubOrder> RevocationWatch::OrderFor(const std::string& target) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = orders_.find(target);
  if (it == orders_.end()) return std::nullopt;
  return it->second;
}

void RevocationWatch::LoadState() {
  if (options_.cache_path.empty()) return;
  auto text = ReadFile(options_.cache_path + ".state");
  if (!text.ok()) return;
  // Written by this worker after verifying the lists it came from; unreadable = none.
  auto state = nlohmann::json::parse(*text, nullptr, false);
  if (!state.is_object()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (auto o = state.find("orders"); o != state.end() && o->is_object()) {
    for (const auto& [target, v] : o->items()) {
      if (!v.is_object()) continue;
      HubOrder order{options_.release,
                     target,
                     v.value("kind", std::string()),
                     v.value("ref", std::string()),
                     v.value("share", 0.0),
                     v.value("incarnation", int64_t{0}),
                     v.value("reason", std::string())};
      if (CheckHubOrder(order).ok() && v.value("release", std::string()) == options_.release) {
        orders_[target] = std::move(order);
      }
    }
  }
  const auto d = state.find("digests");
  if (d == state.end() || !d->is_object()) return;
  for (const auto& [digest, v] : d->items()) {
    if (!v.is_object() || !v.contains("revision") || !v["revision"].is_number_integer() ||
        !v.contains("revoked") || !v["revoked"].is_boolean()) {
      continue;
    }
    digests_[digest] = DigestState{v["revision"].get<int64_t>(), v["revoked"].get<bool>(),
                                   v.value("key", std::string())};
  }
}

void RevocationWatch::SaveState() const {
  if (options_.cache_path.empty()) return;
  nlohmann::json digests = nlohmann::json::object();
  nlohmann::json orders = nlohmann::json::object();
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [digest, st] : digests_) {
      digests[digest] = {{"revision", st.revision}, {"revoked", st.revoked}, {"key", st.key}};
    }
    for (const auto& [target, o] : orders_) {
      orders[target] = {
          {"release", o.release},         {"kind", o.kind},    {"ref", o.ref}, {"share", o.share},
          {"incarnation", o.incarnation}, {"reason", o.reason}};
    }
  }
  const nlohmann::json state = {{"digests", digests}, {"orders", orders}};
  WriteFileAtomic(options_.cache_path + ".state", state.dump(), Durability::kScratch).IgnoreError();
}

Status RevocationWatch::CheckAdoption(const std::string& key, const std::string& digest) {
  std::optional<RevocationList> list;
  Status fetch_refusal;
  {
    std::lock_guard<std::mutex> one(fetch_mu_);
    const int64_t now = Now();
    bool recent = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      recent = current_.has_value() && fetched_at_ > 0 && now - fetched_at_ < options_.poll_s;
    }
    if (recent) {
      list = FreshCurrent(now);
    }
    if (!list) {
      bool transient = false;
      auto fetched = Fetch(&transient);
      if (fetched.ok()) {
        list = *fetched;
      } else {
        fetch_refusal = fetched.status();
        // The hub could not be asked: a verified list still within its age will do.
        if (transient) list = FreshCurrent(now);
      }
    }
  }
  if (!list) return fetch_refusal;
  Apply(*list);
  if (IsRevoked(digest)) {
    std::string reason = "listed by the hub";
    for (const auto& e : list->entries) {
      if (e.digest == digest) reason = e.reason;
    }
    return Status::Refused(StatusCode::kInvalidArgument, kRefusalRevoked,
                           key + "@" + digest + " is revoked: " + reason);
  }
  return Status::OK();
}

void RevocationWatch::Watch(ServedTarget* target) {
  std::lock_guard<std::mutex> lock(mu_);
  targets_.push_back(target);
}

void RevocationWatch::Apply(const RevocationList& list) {
  std::vector<std::pair<std::string, std::string>> fresh;  // digest, reason
  std::vector<const RevocationEntry*> lifted;
  std::vector<ServedTarget*> targets;
  std::function<void(const std::string&)> on_reinstated;
  std::function<void(const HubOrder&)> on_order;
  std::vector<HubOrder> ordered;
  bool changed = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const HubOrder& o : list.orders) {
      if (o.release != options_.release) continue;
      auto it = orders_.find(o.target);
      // The dispatch fence: an order no newer than the one held is stale news.
      if (it != orders_.end() && o.incarnation <= it->second.incarnation) continue;
      orders_[o.target] = o;
      ordered.push_back(o);
      changed = true;
    }
    on_order = on_order_;
    for (const auto& e : list.entries) {
      DigestState& st = digests_[e.digest];
      if (e.revision <= st.revision) continue;  // news this worker already has, or older news
      const bool was_revoked = st.revoked;
      st = DigestState{e.revision, !e.lifted(), e.key};
      changed = true;
      if (st.revoked && !was_revoked) fresh.emplace_back(e.digest, e.reason);
      if (!st.revoked && was_revoked) lifted.push_back(&e);
    }
    targets = targets_;
    on_reinstated = on_reinstated_;
  }
  if (changed) SaveState();
  for (const HubOrder& o : ordered) {
    Emit(event_kind::kHubOrder, o.kind, o.ref, o.target,
         "incarnation=" + std::to_string(o.incarnation) +
             (o.kind == "canary" ? " share=" + std::to_string(o.share) : "") +
             " reason=" + o.reason);
    if (on_order) on_order(o);
  }
  for (const RevocationEntry* e : lifted) {
    for (ServedTarget* t : targets) t->LiftHubRevocation(e->digest);
    KILN_LOG(INFO) << "worker: the hub reinstated cell " << e->key << "@" << e->digest << " ("
                   << e->lift_reason << "); adopting it again where it was held eager";
    Emit(event_kind::kCellReinstated, "hub_reinstated", e->key + "@" + e->digest, "",
         "revision=" + std::to_string(e->revision) + " reason=" + e->lift_reason);
    if (on_reinstated) on_reinstated(e->key);
  }
  if (fresh.empty()) return;
  for (ServedTarget* t : targets) {
    for (const auto& [digest, reason] : fresh) {
      const std::string ref = t->RevokeByDigest(digest, "revoked by the hub: " + reason);
      if (!ref.empty()) {
        KILN_LOG(WARNING) << "worker: cell " << ref << " of target '" << t->name()
                          << "' revoked by the hub (" << reason << "); serving eager";
      }
    }
  }
}

void RevocationWatch::SetStale(bool stale, const std::string& why) {
  std::vector<ServedTarget*> targets;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stale_ == stale) return;
    stale_ = stale;
    targets = targets_;
  }
  const bool eager = options_.stale == StaleRevocationPolicy::kEager;
  if (eager) {
    for (ServedTarget* t : targets) t->SetRevocationHold(stale);
  }
  Emit(event_kind::kRevocationList, stale ? (eager ? "stale_eager" : "stale_keep") : "fresh", "",
       "", why);
}

Status RevocationWatch::PollOnce() {
  bool transient = false;
  Result<RevocationList> list = Status::OK();
  {
    std::lock_guard<std::mutex> one(fetch_mu_);
    list = Fetch(&transient);
  }
  if (list.ok()) {
    Apply(*list);
    SetStale(false, "entries=" + std::to_string(list->entries.size()));
    return Status::OK();
  }
  // No fresh list this time: stale once the last verified one is past its age.
  if (!FreshCurrent(Now())) SetStale(true, list.status().ToString());
  return list.status();
}

void RevocationWatch::Start() {
  std::lock_guard<std::mutex> lock(thread_mu_);
  if (thread_.joinable() || stopping_) return;
  thread_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(thread_mu_);
    while (!stopping_) {
      cv_.wait_for(lock, std::chrono::seconds(std::max(1, options_.poll_s)),
                   [this] { return stopping_; });
      if (stopping_) break;
      lock.unlock();
      Status s = PollOnce();
      if (!s.ok()) KILN_LOG(WARNING) << "worker: revocation list poll: " << s.ToString();
      lock.lock();
    }
  });
}

void RevocationWatch::Stop() {
  {
    std::lock_guard<std::mutex> lock(thread_mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

}  // namespace kiln
