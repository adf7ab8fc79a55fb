// The in-memory HubStore (hub layer): unit tests of the hub handlers run against it. Same
// contracts as the SQLite and PostgreSQL stores (store.h), one mutex around plain containers.
#include <algorithm>
#include <map>
#include <mutex>
#include <set>
#include <tuple>

#include "src/kiln/hub/store.h"

namespace kiln {

namespace {

class MemoryStore final : public HubStore {
 public:
  std::string Describe() const override { return "memory"; }

  Result<CellInsert> InsertCellIfAbsent(const CellRow& row) override {
    std::lock_guard<std::mutex> lock(mu_);
    const std::pair<std::string, std::string> id{row.key, row.family};
    auto it = cells_.find(id);
    bool inserted = false;
    if (it == cells_.end()) {
      it = cells_.emplace(id, row).first;
      order_.push_back(id);
      inserted = true;
    } else if (auto r = revocations_.find({it->second.key, it->second.digest});
               r != revocations_.end() && r->second.in_force() && it->second.digest != row.digest) {
      it->second = row;  // a revoked owner frees the key for its scope
      order_.erase(std::find(order_.begin(), order_.end(), id));
      order_.push_back(id);
      inserted = true;
    }
    return CellInsert{it->second, inserted};
  }
  Result<std::optional<CellRow>> GetCell(const std::string& key,
                                         const std::string& family) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = cells_.find({key, family});
    if (it == cells_.end()) return std::optional<CellRow>();
    return std::optional<CellRow>(it->second);
  }
  Result<std::vector<CellRow>> ListCellsForKey(const std::string& key) override {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<CellRow> out;
    for (const auto& id : order_) {
      if (id.first == key) out.push_back(cells_.at(id));
    }
    return out;
  }
  Result<std::vector<CellRow>> CellsWithDigest(const std::string& digest) override {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<CellRow> out;
    for (const auto& id : order_) {
      if (cells_.at(id).digest == digest) out.push_back(cells_.at(id));
    }
    return out;
  }
  Result<std::vector<CellRow>> ListCells(int limit) override {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<CellRow> out;
    for (auto it = order_.rbegin(); it != order_.rend() && (int)out.size() < limit; ++it) {
      out.push_back(cells_.at(*it));
    }
    return out;
  }

  Result<bool> UpdateReceipt(const std::string& key, const std::string& family,
                             const std::string& digest, const std::string& receipt) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = cells_.find({key, family});
    if (it == cells_.end() || it->second.digest != digest) return false;
    it->second.receipt = receipt;
    return true;
  }

  Status PutIntent(const IntentRow& row) override {
    std::lock_guard<std::mutex> lock(mu_);
    intents_[{row.key, row.digest, row.publisher}] = row;
    return Status::OK();
  }
  Result<std::optional<IntentRow>> GetIntent(const std::string& key, const std::string& digest,
                                             const std::string& publisher) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = intents_.find({key, digest, publisher});
    if (it == intents_.end()) return std::optional<IntentRow>();
    return std::optional<IntentRow>(it->second);
  }
  Result<std::optional<IntentRow>> FindIntentByDigest(const std::string& digest,
                                                      const std::string& publisher) override {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [k, row] : intents_) {
      if (row.digest == digest && (publisher.empty() || row.publisher == publisher)) {
        return std::optional<IntentRow>(row);
      }
    }
    return std::optional<IntentRow>();
  }
  Result<PublishClaimResult> ClaimPublish(const PublishClaim& claim, int64_t now) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto [it, fresh] = claims_.try_emplace({claim.key, claim.family}, claim);
    if (!fresh && (it->second.publisher == claim.publisher || it->second.expires_at <= now)) {
      it->second = claim;
      fresh = true;
    }
    return PublishClaimResult{it->second, fresh};
  }
  Result<bool> ReleasePublishClaim(const std::string& key, const std::string& family,
                                   const std::string& publisher) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = claims_.find({key, family});
    if (it == claims_.end() || it->second.publisher != publisher) return false;
    claims_.erase(it);
    return true;
  }
  Result<int> DeleteExpiredPublishClaims(int64_t now) override {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int>(
        std::erase_if(claims_, [now](const auto& kv) { return kv.second.expires_at <= now; }));
  }
  Result<int> DeleteIntentsBefore(int64_t before) override {
    std::lock_guard<std::mutex> lock(mu_);
    int n = 0;
    for (auto it = intents_.begin(); it != intents_.end();) {
      if (it->second.created_at < before) {
        it = intents_.erase(it);
        ++n;
      } else {
        ++it;
      }
    }
    return n;
  }

  Result<PublisherUsage> GetPublisherUsage(const std::string& publisher) override {
    std::lock_guard<std::mutex> lock(mu_);
    PublisherUsage usage;
    for (const auto& [id, c] : cells_) {
      if (c.publisher == publisher) usage.cell_bytes += c.size;
    }
    for (const auto& [k, row] : intents_) {
      if (row.publisher != publisher) continue;
      const bool completed = std::any_of(cells_.begin(), cells_.end(), [&](const auto& c) {
        return c.second.key == row.key && c.second.digest == row.digest;
      });
      if (!completed) usage.open_intents.push_back(row);
    }
    return usage;
  }

  Status Revoke(const RevocationRow& row) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto [it, inserted] = revocations_.emplace(std::make_pair(row.key, row.digest), row);
    if (inserted) {
      it->second.revision = 1;
      it->second.lifted_at = 0;
      it->second.lifted_by.clear();
      it->second.lift_reason.clear();
    } else if (!it->second.in_force()) {
      const int64_t revision = it->second.revision + 1;
      it->second = row;
      it->second.revision = revision;
      it->second.lifted_at = 0;
      it->second.lifted_by.clear();
      it->second.lift_reason.clear();
    }
    return Status::OK();
  }
  Result<std::optional<RevocationRow>> Reinstate(const std::string& key, const std::string& digest,
                                                 const std::string& by, const std::string& reason,
                                                 int64_t at) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = revocations_.find({key, digest});
    if (it == revocations_.end()) return std::optional<RevocationRow>();
    if (it->second.in_force()) {
      it->second.revision += 1;
      it->second.lifted_at = std::max<int64_t>(at, 1);
      it->second.lifted_by = by;
      it->second.lift_reason = reason;
    }
    return std::optional<RevocationRow>(it->second);
  }
  Result<std::optional<RevocationRow>> GetRevocation(const std::string& key,
                                                     const std::string& digest) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = revocations_.find({key, digest});
    if (it == revocations_.end() || !it->second.in_force()) return std::optional<RevocationRow>();
    return std::optional<RevocationRow>(it->second);
  }
  Result<std::vector<RevocationRow>> ListRevocations() override {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<RevocationRow> out;
    for (const auto& [k, row] : revocations_) out.push_back(row);
    return out;
  }

  Status RevokeToken(const RevokedTokenRow& row) override {
    std::lock_guard<std::mutex> lock(mu_);
    revoked_tokens_.emplace(row.token_sha256, row);
    return Status::OK();
  }
  Result<bool> IsTokenRevoked(const std::string& token_sha256) override {
    std::lock_guard<std::mutex> lock(mu_);
    return revoked_tokens_.count(token_sha256) != 0;
  }
  Result<std::vector<RevokedTokenRow>> ListRevokedTokens() override {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<RevokedTokenRow> out;
    for (const auto& [k, r] : revoked_tokens_) out.push_back(r);
    return out;
  }

  Result<int> AddObligations(const std::vector<ObligationRow>& rows) override {
    std::lock_guard<std::mutex> lock(mu_);
    int created = 0;
    for (const auto& row : rows) {
      created += obligations_.emplace(std::make_tuple(row.release, row.target, row.sm), row).second;
    }
    return created;
  }
  Result<std::vector<ObligationRow>> ListObligations(const std::string& release) override {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<ObligationRow> out;
    for (const auto& [k, row] : obligations_) {
      if (row.release == release) out.push_back(row);
    }
    return out;
  }
  Result<std::vector<ObligationRow>> ListAllObligations() override {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<ObligationRow> out;
    for (const auto& [k, row] : obligations_) out.push_back(row);
    return out;
  }
  Result<int> DischargeObligations(const std::string& key, const std::string& digest,
                                   const std::string& release, const std::string& target,
                                   const std::string& sm, int64_t now,
                                   const std::string& scope) override {
    std::lock_guard<std::mutex> lock(mu_);
    int n = 0;
    for (auto& [k, row] : obligations_) {
      if (row.state != "owed") continue;
      if (scope != "*" && row.release != scope) continue;
      const bool by_key = row.key == key;
      const bool by_slot = row.key.empty() && !release.empty() && row.release == release &&
                           row.target == target && row.sm == sm;
      if (!by_key && !by_slot) continue;
      row.key = key;
      row.state = "discharged";
      row.cell_digest = digest;
      row.updated_at = now;
      ++n;
    }
    return n;
  }
  Result<std::optional<ObligationRow>> SettleObligation(const std::string& release,
                                                        const std::string& target,
                                                        const std::string& sm,
                                                        const std::string& token,
                                                        int64_t now) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = obligations_.find({release, target, sm});
    if (it == obligations_.end()) return std::optional<ObligationRow>();
    if (it->second.state == "owed") {
      it->second.state = "settled:" + token;
      it->second.updated_at = now;
    }
    return std::optional<ObligationRow>(it->second);
  }

  Status InsertEvents(const std::vector<StoredEvent>& rows) override {
    std::lock_guard<std::mutex> lock(mu_);
    for (StoredEvent row : rows) {
      row.id = ++next_event_id_;
      events_.push_back(std::move(row));
    }
    return Status::OK();
  }
  Result<std::vector<StoredEvent>> QueryEvents(const EventFilter& f) override {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<StoredEvent> out;
    for (auto it = events_.rbegin(); it != events_.rend() && (int)out.size() < f.limit; ++it) {
      if (!f.worker.empty() && it->worker != f.worker) continue;
      if (!f.kind.empty() && it->kind != f.kind) continue;
      if (!f.phase.empty() && it->phase != f.phase) continue;
      if (it->ts < f.since_ts) continue;
      if (f.org.has_value() && it->org != *f.org) continue;
      out.push_back(*it);
    }
    return out;
  }
  Result<std::vector<WorkerSummary>> ListWorkers(const std::optional<std::string>& org) override {
    std::lock_guard<std::mutex> lock(mu_);
    std::map<std::string, WorkerSummary> by_worker;
    for (const auto& e : events_) {
      if (org.has_value() && e.org != *org) continue;
      auto& w = by_worker[e.worker];
      w.worker = e.worker;
      w.last_ts = std::max(w.last_ts, e.ts);
      ++w.events;
    }
    std::vector<WorkerSummary> out;
    for (auto& [k, w] : by_worker) out.push_back(w);
    return out;
  }
  Result<int64_t> AdoptedCount(const std::string& key,
                               const std::optional<std::string>& org) override {
    std::lock_guard<std::mutex> lock(mu_);
    std::set<std::string> workers;
    for (const auto& e : events_) {
      if (org.has_value() && e.org != *org) continue;
      if ((e.key == key || e.key.rfind(key + "@", 0) == 0) && e.kind == "boot_adopt" &&
          (e.phase == "hit" || e.phase == "local_hit")) {
        workers.insert(e.worker);
      }
    }
    return static_cast<int64_t>(workers.size());
  }

  Result<std::vector<std::string>> CrashReporters(const std::string& key,
                                                  const std::string& ref) override {
    std::lock_guard<std::mutex> lock(mu_);
    std::set<std::string> workers;
    for (const auto& e : events_) {
      if (e.key == key && e.kind == "cell_crashed" && e.ref == ref) workers.insert(e.worker);
    }
    return std::vector<std::string>(workers.begin(), workers.end());
  }

  Result<MintLeaseAcquire> AcquireMintLease(const MintLeaseRow& want, int64_t now_ms) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto [it, fresh] = leases_.try_emplace({want.key, want.family}, want);
    bool granted = fresh;
    if (!fresh && (it->second.expires_at_ms <= now_ms || it->second.holder == want.holder)) {
      it->second = want;
      granted = true;
    }
    return MintLeaseAcquire{it->second, granted};
  }
  Result<bool> ExtendMintLease(const std::string& key, const std::string& family,
                               const std::string& lease, int64_t expires_at_ms) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = leases_.find({key, family});
    if (it == leases_.end() || it->second.lease != lease) return false;
    it->second.expires_at_ms = expires_at_ms;
    return true;
  }
  Result<bool> ReleaseMintLease(const std::string& key, const std::string& family,
                                const std::string& lease) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = leases_.find({key, family});
    if (it == leases_.end() || it->second.lease != lease) return false;
    leases_.erase(it);
    return true;
  }
  Result<std::optional<MintLeaseRow>> GetMintLease(const std::string& key,
                                                   const std::string& family) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = leases_.find({key, family});
    if (it == leases_.end()) return std::optional<MintLeaseRow>();
    return std::optional<MintLeaseRow>(it->second);
  }
  Result<OrderRow> SetOrder(const OrderRow& row) override {
    std::lock_guard<std::mutex> lock(mu_);
    OrderRow& slot = orders_[{row.release, row.target}];
    const int64_t incarnation = slot.incarnation + 1;
    slot = row;
    slot.incarnation = incarnation;
    return slot;
  }
  Result<std::vector<OrderRow>> ListOrders() override {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<OrderRow> out;
    for (const auto& [id, row] : orders_) out.push_back(row);
    return out;
  }

 private:
  std::mutex mu_;
  std::map<std::pair<std::string, std::string>, CellRow> cells_;  // by (key, family)
  std::vector<std::pair<std::string, std::string>> order_;        // insertion order
  std::map<std::tuple<std::string, std::string, std::string>, IntentRow> intents_;
  std::map<std::pair<std::string, std::string>, OrderRow> orders_;
  std::map<std::pair<std::string, std::string>, RevocationRow> revocations_;
  std::map<std::pair<std::string, std::string>, PublishClaim> claims_;  // by (key, family)
  std::map<std::string, RevokedTokenRow> revoked_tokens_;
  std::map<std::tuple<std::string, std::string, std::string>, ObligationRow> obligations_;
  std::vector<StoredEvent> events_;
  int64_t next_event_id_ = 0;
  std::map<std::pair<std::string, std::string>, MintLeaseRow> leases_;  // by (key, family)
};

}  // namespace

std::unique_ptr<HubStore> NewMemoryStore() { return std::make_unique<MemoryStore>(); }

}  // namespace kiln
