// RevocationWatch: the hub's signed revocation list on a worker — checked at every adoption,
// local-store hits included, and polled while the worker runs so a revoked cell is de-armed
// within a known bound (worker layer; docs/design.md law 4 and law 17, docs/trust.md).
//
// The list is a JWS the hub signs afresh on every request (receipt/receipt.h
// VerifyRevocationList): typ "kiln-revocations", EdDSA under a key this worker trusts (its
// operator anchors, or the hub's key set, refetched once on an unknown key id), an issued-at
// and a maximum age. A list that is unsigned, signed by another key, malformed, or older than its
// maximum age (or the manifest's cap) is never believed: a fake hub that strips the list, or
// replays an old one, gets the adoption refused.
//
// Adoption (CheckAdoption): the newest verified list, fetched when the last one is older than the
// poll interval; when the hub cannot be reached, the last verified list is used while it is
// within its maximum age (it is kept on disk, so a restart with the hub down can use it too).
// Without any usable list the adoption is refused (fail closed): `revocations_unreachable` when
// the hub could not be asked (transient: the boot retries), `revocations_unreadable` when it
// answered with an error, or the verification's token.
//
// Running (Start): every poll interval the list is fetched and verified. Each entry carries the
// revision of its digest at the hub (receipt.h RevocationEntry): the watch keeps, per digest, the
// newest revision it applied and whether that revision revokes or lifts, and applies an entry only
// when its revision is newer. A list that omits a digest changes nothing (sticky), and a replayed
// older list (a lower revision) can neither re-kill a reinstated cell nor resurrect a revoked
// one. The per-digest state is kept on disk beside the cached list, so this holds across
// restarts too.
//   revoked: every watched target whose installed cell has the digest is de-armed: the cell is
//            revoked, the target serves eager (`compiled_degraded`), and a `cell_revoked` row with
//            phase `hub_revoked` names the ref and the reason.
//   lifted:  (an admin reinstated it) the targets drop their block on the digest, one
//            `cell_reinstated` row names the ref and the lift's reason, and the reinstated
//            callback runs (the worker adopts again for the targets of that key left eager).
// The bound is one poll interval plus one request's time (default 30 s: manifest
// `hub.revocation_poll_s`), plus the adoption's own time for a lift.
//
// The same list carries the hub's orders (receipt.h HubOrder): for this worker's release, each
// target's newest order is kept (on disk with the digests) and applied only when its incarnation
// is above the one held, so a replayed older order loses to a newer one (the dispatch fence). A
// newly applied order writes one `hub_order` row and runs the order callback (the worker switches
// what the target serves, docs/fleet.md "Hub orders").
//
// A list that goes stale while the worker runs (the hub unreachable for longer than the list's
// maximum age) is handled by the manifest's policy, said once by a `revocation_list` row:
//   keep  (default) armed cells keep serving: each was checked against a fresh list when it was
//         adopted, and availability does not hang on the hub; new adoptions are refused until a
//         fresh list arrives. Phase `stale_keep`.
//   eager every target serves eager (a mandatory one refuses retryably) until a fresh list
//         arrives; nothing is revoked. Phase `stale_eager`, then `fresh` when it ends.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "src/kiln/base/clock.h"
#include "src/kiln/base/status.h"
#include "src/kiln/client/hub_client.h"
#include "src/kiln/receipt/receipt.h"
#include "src/kiln/worker/events.h"
#include "src/kiln/worker/serving.h"

namespace kiln {

// Adoption refusals when no usable list could be had: the hub could not be asked (down, timeout,
// 5xx; transient, so a boot retries), or it answered something other than a list.
inline constexpr const char* kRefusalRevocationsUnreachable = "revocations_unreachable";
inline constexpr const char* kRefusalRevocationsUnreadable = "revocations_unreadable";
// Adoption refusal for a listed cell: kRefusalRevoked (cell/admission.h).

enum class StaleRevocationPolicy { kKeep, kEager };

struct RevocationWatchOptions {
  HubClientOptions hub;  // a client of its own (the poll thread's)
  // Operator trust anchors (manifest hub.trust), never refetched; empty = the hub's key set.
  PublicKeySet anchors;
  bool use_anchors = false;
  std::string cache_path;  // the last verified list is kept here ("" = nowhere)
  int poll_s = 30;
  int64_t max_age_cap_s = 0;  // 0 = the list's own max_age_s
  StaleRevocationPolicy stale = StaleRevocationPolicy::kKeep;
  EventLog* events = nullptr;
  std::string worker;      // names the worker in rows
  std::string release;     // the manifest's endpoint.release: whose orders apply here
  Clock* clock = nullptr;  // judges the lists' ages and the poll interval; null = Clock::Real()
};

class RevocationWatch {
 public:
  static Result<std::unique_ptr<RevocationWatch>> Create(RevocationWatchOptions options);
  ~RevocationWatch();  // Stop()
  RevocationWatch(const RevocationWatch&) = delete;
  RevocationWatch& operator=(const RevocationWatch&) = delete;

  // OK when (key, digest) may be adopted now (see above); else Refused with `revoked`,
  // `revocations_unreachable`, `revocations_unreadable`, or the verification's token
  // (revocations_unsigned, …_stale, …_bad_signature, …_unknown_kid, …_malformed). Any thread.
  Status CheckAdoption(const std::string& key, const std::string& digest);
  // True when the newest entry applied for `digest` revokes it (a lift since makes it false).
  bool IsRevoked(const std::string& digest) const;
  // Called (on the applying thread, outside the watch's locks) with the key of each revocation
  // lifted after this process applied it, or whose lift it learned while it held the digest
  // revoked. Set before Start().
  void SetOnReinstated(std::function<void(const std::string& key)> on_reinstated);
  // Called (as above) with each newly applied order of this worker's release. Set before
  // Start().
  void SetOnOrder(std::function<void(const HubOrder& order)> on_order);
  // The newest order applied for `target` (this worker's release), if any: what a boot obeys.
  std::optional<HubOrder> OrderFor(const std::string& target) const;
  // The keys lists were verified with (anchors, or the hub's keys fetched so far).
  PublicKeySet Keys() const;

  // Targets to de-arm when their cell is listed. The targets must outlive this object or Stop().
  void Watch(ServedTarget* target);
  // Fetches, verifies and applies the list once; the poll thread's step, callable from tests.
  Status PollOnce();
  // Starts the poll thread (every poll_s). Idempotent.
  void Start();
  void Stop();

 private:
  explicit RevocationWatch(RevocationWatchOptions options);
  // Fetch + verify; on success the list becomes current (and is persisted). Returns the list or
  // the refusal; `transient` says the hub could not be asked at all.
  Result<RevocationList> Fetch(bool* transient);
  // Applies every entry newer than the digest's known revision: de-arms watched targets holding a
  // newly revoked digest, lifts the targets' block on a reinstated one.
  void Apply(const RevocationList& list);
  // The per-digest state, kept at cache_path + ".state" (nothing when cache_path is "").
  void LoadState();
  void SaveState() const;
  // Unix seconds on the watch's clock.
  int64_t Now() const;
  // The current list if it is still within its maximum age at `now`.
  std::optional<RevocationList> FreshCurrent(int64_t now) const;
  void SetStale(bool stale, const std::string& why);
  void Emit(const char* kind, const std::string& phase, const std::string& ref,
            const std::string& target, const std::string& detail);

  RevocationWatchOptions options_;
  std::unique_ptr<HubClient> client_;
  mutable std::mutex mu_;
  PublicKeySet keys_;                      // anchors, or the hub's keys fetched so far
  std::optional<RevocationList> current_;  // the newest verified list
  int64_t fetched_at_ = 0;                 // unix seconds of the last successful fetch
  // Per digest: the newest revision applied, and whether it revokes (false: lifted).
  struct DigestState {
    int64_t revision = 0;
    bool revoked = false;
    std::string key;
  };
  std::map<std::string, DigestState> digests_;
  std::function<void(const std::string&)> on_reinstated_;
  std::function<void(const HubOrder&)> on_order_;
  std::map<std::string, HubOrder> orders_;  // by target: the newest applied
  std::vector<ServedTarget*> targets_;
  bool stale_ = false;
  std::mutex fetch_mu_;  // one fetch at a time
  std::mutex thread_mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace kiln
