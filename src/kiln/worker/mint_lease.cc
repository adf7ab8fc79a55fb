// MintLeases: asking the hub for a key's mint lease, heartbeating and releasing it (worker layer;
// see mint_lease.h).
#include "src/kiln/worker/mint_lease.h"

#include <algorithm>
#include <chrono>

#include "src/kiln/base/log.h"

namespace kiln {

namespace {

nlohmann::json LeaseBody(const std::string& key, const std::string& family) {
  return nlohmann::json{{"key", key}, {"family", family}};
}

int64_t Int(const nlohmann::json& j, const char* name) {
  auto it = j.find(name);
  return it != j.end() && it->is_number_integer() ? it->get<int64_t>() : 0;
}

}  // namespace

Result<std::unique_ptr<MintLeases>> MintLeases::Create(MintLeaseOptions options, EventLog* events) {
  if (options.holder.empty()) {
    return Status::InvalidArgument("mint leases: the holder name is empty");
  }
  KILN_ASSIGN_OR_RETURN(auto hub, HubClient::Create(options.hub));
  return std::unique_ptr<MintLeases>(new MintLeases(std::move(options), std::move(hub), events));
}

MintLeases::MintLeases(MintLeaseOptions options, std::unique_ptr<HubClient> hub, EventLog* events)
    : options_(std::move(options)), hub_(std::move(hub)), events_(events) {}

LeaseAnswer MintLeases::Acquire(const std::string& key, const std::string& family) {
  nlohmann::json body = LeaseBody(key, family);
  body["holder"] = options_.holder;
  HubAnswer a = hub_->Call("POST", "/v1/mint-leases", body.dump());
  LeaseAnswer out;
  if (!a.ok()) {
    out.token = a.token;
    out.transient = IsHubTransportToken(a.token) || a.http_status >= 500;
    return out;
  }
  const nlohmann::json& j = a.body;
  if (!j.is_object() || !j.contains("granted") || !j["granted"].is_boolean()) {
    out.token = kHubBadResponse;
    out.transient = true;
    return out;
  }
  out.holder = j.value("holder", std::string());
  out.expires_in_ms = Int(j, "expires_in_ms");
  out.ttl_ms = Int(j, "ttl_ms");
  if (j["granted"].get<bool>()) {
    out.kind = LeaseAnswer::Kind::kGranted;
    out.lease = j.value("lease", std::string());
    out.heartbeat_ms = std::max<int64_t>(50, Int(j, "heartbeat_ms"));
    if (out.lease.empty()) {
      out.kind = LeaseAnswer::Kind::kNoLease;
      out.token = kHubBadResponse;
      out.transient = true;
    }
    return out;
  }
  out.kind = j.value("published", false) ? LeaseAnswer::Kind::kPublished : LeaseAnswer::Kind::kHeld;
  return out;
}

std::shared_ptr<MintLeaseHold> MintLeases::Hold(const std::string& key, const std::string& family,
                                                const LeaseAnswer& granted) {
  return std::make_shared<MintLeaseHold>(this, key, family, granted);
}

bool MintLeases::Heartbeat(const std::string& key, const std::string& family,
                           const std::string& lease) {
  nlohmann::json body = LeaseBody(key, family);
  body["lease"] = lease;
  HubAnswer a = hub_->Call("POST", "/v1/mint-leases/heartbeat", body.dump());
  if (a.ok() || a.token != kRefusalMintLeaseLost) return true;
  if (events_ != nullptr) {
    EventRow row;
    row.kind = event_kind::kSelfMintSkipped;
    row.phase = kMintLeaseLost;
    row.key = key;
    row.detail = "key=" + key + " worker=" + options_.worker + " lease=" + lease +
                 " holder=" + a.body.value("holder", std::string("none")) +
                 " the mint here goes on; the first cell published wins";
    events_->Append(std::move(row));
  }
  return false;
}

void MintLeases::Release(const std::string& key, const std::string& family,
                         const std::string& lease) {
  nlohmann::json body = LeaseBody(key, family);
  body["lease"] = lease;
  HubAnswer a = hub_->Call("POST", "/v1/mint-leases/release", body.dump());
  if (!a.ok()) {
    // Not an error for the fleet: the lease expires a TTL after its last heartbeat.
    KILN_LOG(WARNING) << "worker: mint lease " << lease << " of " << key << " not released ("
                      << a.token << "); it expires by itself";
  }
}

MintLeaseHold::MintLeaseHold(MintLeases* leases, std::string key, std::string family,
                             const LeaseAnswer& grant)
    : leases_(leases),
      key_(std::move(key)),
      family_(std::move(family)),
      lease_(grant.lease),
      heartbeat_ms_(std::max<int64_t>(50, grant.heartbeat_ms)) {
  thread_ = std::thread([this] { Beat(); });
}

MintLeaseHold::~MintLeaseHold() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  bool release = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    release = !lost_ && !abandoned_;
  }
  if (release) leases_->Release(key_, family_, lease_);
}

void MintLeaseHold::Abandon() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    abandoned_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

bool MintLeaseHold::lost() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lost_;
}

void MintLeaseHold::Beat() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_ && !lost_) {
    if (cv_.wait_for(lock, std::chrono::milliseconds(heartbeat_ms_), [&] { return stop_; })) {
      return;
    }
    lock.unlock();
    const bool held = leases_->Heartbeat(key_, family_, lease_);
    lock.lock();
    if (!held) lost_ = true;
  }
}

}  // namespace kiln
