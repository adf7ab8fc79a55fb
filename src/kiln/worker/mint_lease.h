// MintLeases: the worker's side of the hub's mint leases (worker layer; docs/fleet.md "One mint
// per cold key", docs/hub-api.md POST /v1/mint-leases).
//
// A worker whose exported key missed at the hub asks for the lease of (key, family) before it
// mints (adoption.cc decides what to do with the answer):
//   granted    mint; a MintLeaseHold heartbeats the lease every heartbeat_ms on a thread of its
//              own while the mint and its publish run, and releases it when the last owner lets
//              go (after the publish, or at once when the mint fails, so another may try)
//   held       another worker mints: serve as a miss does (eager, or a mandatory lane's refusal)
//              and poll resolve until its cell appears; ask again once its lease expired
//   published  a cell answers the key already: resolve it
//   no lease   the hub could not be asked or refused the ask (a token that may not publish):
//              mint locally as without a hub; the lease only spares work, it never gates a cell
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "src/kiln/client/hub_client.h"
#include "src/kiln/worker/events.h"

namespace kiln {

// Phase tokens of the rows this lane emits (self_mint_skipped): another worker holds the lease
// of the key (this one waits for its cell), and this worker's heartbeat found its lease taken
// over (its mint goes on; the first cell published wins).
inline constexpr const char* kMintLeaseHeld = "lease_held";
inline constexpr const char* kMintLeaseLost = "lease_lost";
// The hub's refusal of a heartbeat whose lease no longer holds its key (docs/hub-api.md).
inline constexpr const char* kRefusalMintLeaseLost = "lease_lost";

struct LeaseAnswer {
  enum class Kind { kGranted, kHeld, kPublished, kNoLease };
  Kind kind = Kind::kNoLease;
  std::string lease;   // kGranted: the lease id
  std::string holder;  // kGranted, kHeld: who holds it
  int64_t expires_in_ms = 0;
  int64_t ttl_ms = 0;
  int64_t heartbeat_ms = 0;
  std::string token;       // kNoLease: why (a transport token or the hub's refusal)
  bool transient = false;  // kNoLease: the hub could not be asked (not a refusal)
};

class MintLeases;

// A granted lease, heartbeaten until destroyed; the destructor stops the heartbeats and releases
// the lease unless it was lost. Shared by whoever must finish before another worker may mint
// (the mint job, then the publish of its cell).
class MintLeaseHold {
 public:
  MintLeaseHold(MintLeases* leases, std::string key, std::string family, const LeaseAnswer& grant);
  ~MintLeaseHold();
  MintLeaseHold(const MintLeaseHold&) = delete;
  MintLeaseHold& operator=(const MintLeaseHold&) = delete;
  const std::string& lease() const { return lease_; }
  bool lost() const;
  // Stops the heartbeats and leaves the lease to expire a TTL after the last one, unreleased:
  // what a holder whose process died leaves behind (the fleet simulator's killed holder; a worker
  // never calls it). Idempotent; the destructor then releases nothing.
  void Abandon();

 private:
  void Beat();
  MintLeases* leases_;
  const std::string key_, family_, lease_;
  const int64_t heartbeat_ms_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool lost_ = false;
  bool abandoned_ = false;
  std::thread thread_;
};

struct MintLeaseOptions {
  HubClientOptions hub;  // a client of its own (HubClient serializes its calls)
  std::string holder;    // this worker's name at the hub (unique per process)
  std::string worker;    // names the worker in rows
};

class MintLeases {
 public:
  static Result<std::unique_ptr<MintLeases>> Create(MintLeaseOptions options, EventLog* events);
  MintLeases(const MintLeases&) = delete;
  MintLeases& operator=(const MintLeases&) = delete;

  LeaseAnswer Acquire(const std::string& key, const std::string& family);
  // The hold of a kGranted answer; it heartbeats from now on.
  std::shared_ptr<MintLeaseHold> Hold(const std::string& key, const std::string& family,
                                      const LeaseAnswer& granted);
  const std::string& holder() const { return options_.holder; }

 private:
  friend class MintLeaseHold;
  MintLeases(MintLeaseOptions options, std::unique_ptr<HubClient> hub, EventLog* events);
  // true: extended; false: lease_lost (another holds it now, or nobody); transient failures
  // answer true (the next beat tries again; the lease holds a TTL past the last good one).
  bool Heartbeat(const std::string& key, const std::string& family, const std::string& lease);
  void Release(const std::string& key, const std::string& family, const std::string& lease);

  const MintLeaseOptions options_;
  std::unique_ptr<HubClient> hub_;
  EventLog* events_;
};

}  // namespace kiln
