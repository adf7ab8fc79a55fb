// Publisher: the worker's background lane to the hub for cells it minted itself (worker layer;
// docs/design.md §2 laws 13 and 14, §4 Mint).
//
// Readiness never waits for it: the mint driver arms and stores a cell first, then enqueues the
// publish here. One thread works the queue in order:
//   publish: read the cell back from the local store (the bytes that passed the gate, re-hashed
//     on read) -> HubClient::Publish (intent -> blob -> complete), with the release and target so
//     the hub discharges the release's obligation.
//     - success, or the hub already holding these bytes   -> `self_mint_publish` (`published` |
//       `already_published`), duration = enqueue to done, detail attempts=N
//     - a transport failure (hub down, timeout, 5xx)     -> kept local, retried with jittered
//       exponential backoff (base/backoff.h) until the hub answers; one `self_mint_publish_failed`
//       row (phase = the token, detail `retrying`) when the failures start and whenever the token
//       changes
//     - a typed refusal (4xx: unauthorized, tier, key_taken, ...) -> terminal: the cell stays
//       local and keeps serving; `self_mint_publish_failed` phase = the token, detail `terminal`
//   durable: the publish's state is a note on the cell's local-store entry (LocalStore::PutNote,
//     name "publish"): `pending` from the enqueue, `published` when the hub holds the cell,
//     `refused` (with the token) on a terminal refusal. A process that stops or dies before the
//     hub answered leaves `pending`; ResumeUnpublished, called once at boot, queues every entry
//     whose note is `pending` or `refused` again, so an interrupted publish completes after a
//     restart and a refusal the operator has since lifted (a token granted the family, a builder
//     registered for the toolchain) is offered once more: at most one offer per boot per cell.
//   settle: a deterministic refusal to mint for a release's target is reported
//     (POST /v1/obligations/settle) so the hub settles that obligation terminally; retried like
//     a publish, with no row of its own except `self_mint_publish_failed` on a terminal refusal.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "src/kiln/cell/store.h"
#include "src/kiln/client/hub_client.h"
#include "src/kiln/worker/events.h"

namespace kiln {

// How long a publish may wait for the hub's answer: the hub rebuilds the cell before it answers
// (at most its --builder-timeout, 600 s by default, plus a queue).
inline constexpr double kPublishTimeoutS = 900;

struct PublisherOptions {
  HubClientOptions hub;         // a client of its own: HubClient serializes its calls
  LocalStore* store = nullptr;  // not owned; required
  EventLog* events = nullptr;   // not owned; null = no rows
  std::string release;          // the endpoint's release ("" = none)
  int backoff_initial_ms = 250;
  int backoff_max_ms = 5000;
};

class Publisher {
 public:
  static Result<std::unique_ptr<Publisher>> Create(PublisherOptions options);
  ~Publisher();  // stops the thread; work still queued is dropped (the cells stay local)
  Publisher(const Publisher&) = delete;
  Publisher& operator=(const Publisher&) = delete;

  // Queues the stored cell `key` of `target` for publishing. Returns at once. `keep` (may be
  // null) is held until the publish ends, published or refused, or is dropped unsent: the mint
  // lease of the key (mint_lease.h), so no other worker mints it while its cell is on the way.
  void EnqueuePublish(const std::string& key, const std::string& target, const std::string& family,
                      std::shared_ptr<void> keep = nullptr);
  // Queues again every cell of the local store whose publish note says `pending` or `refused`
  // (above), with the target and family the note recorded. Returns how many were queued.
  int ResumeUnpublished();
  // Queues a terminal settlement of (release, target, sm) with `token` (needs a release).
  void EnqueueSettle(const std::string& target, const std::string& sm, const std::string& token);

  // True once nothing is queued or in flight (tests and drain); false on timeout.
  bool WaitIdle(int timeout_ms);

 private:
  struct Job {
    bool settle = false;
    bool resumed = false;  // queued by ResumeUnpublished
    std::string key, target, family, sm, token;
    int64_t enqueued_ms = 0;
    std::shared_ptr<void> keep;
  };
  explicit Publisher(PublisherOptions options, std::unique_ptr<HubClient> hub);
  void Loop();
  // Runs one job to its end (success or terminal refusal), retrying transport failures.
  void Work(const Job& job);
  // Sleeps up to `ms`; false when stopping.
  bool Backoff(int ms);
  void Emit(const char* kind, const std::string& phase, double ms, const Job& job,
            const std::string& detail);
  // Writes the job's publish note (state "pending" | "published" | "refused"); a failure is
  // logged, never fatal: the publish itself goes on.
  void Note(const Job& job, const std::string& state, const std::string& token = "");
  void Enqueue(Job job);

  const PublisherOptions options_;
  std::unique_ptr<HubClient> hub_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  bool busy_ = false;
  bool stop_ = false;
  std::thread thread_;
};

// True when a hub answer is a transport failure worth retrying (unreachable, timeout, a bad or
// 5xx response) or publish_in_progress (another publisher holds the key; its complete or its
// claim's expiry frees it), false for a typed refusal or a local failure (bad_cell, io_error).
bool IsTransientHubFailure(const std::string& token, int http_status);

}  // namespace kiln
