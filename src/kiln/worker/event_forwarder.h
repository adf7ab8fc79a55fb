// EventForwarder: ships a worker's event rows to its hub (POST /v1/events) in the background
// (worker layer; docs/design.md §10, docs/hub-api.md "POST /v1/events").
//
// Rows are queued by EventLog's sink (never blocking a request: the sink only takes this
// forwarder's lock and pushes) and posted in batches by one thread. A hub that is down or slow
// loses no row: a batch stays at the head of the queue until the hub accepts it, retried with
// exponential backoff (capped), and rows keep queueing behind it. Only two things drop rows, both
// counted and visible in /metrics: the queue reaching its bound (the oldest rows go first; the
// on-disk event file still has every row), and a batch the hub refuses as malformed (4xx other
// than 408/429: retrying the same bytes cannot succeed).
//
// A batch whose answer is lost after the hub stored it is posted again, so the hub can hold a row
// twice; (worker, seq) identifies it. Stop() drains what it can within a budget, then gives up.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "src/kiln/client/hub_client.h"
#include "src/kiln/worker/events.h"

namespace kiln {

// One row as POST /v1/events takes it, filed under `instance` when non-empty (the forwarder's
// `worker` option).
nlohmann::json HubEventRow(const EventRow& row, const std::string& instance);

struct EventForwarderOptions {
  std::string worker;               // posted as each row's `instance`: the hub files the row under
                                    // "<token name>/<instance>" (a worker token speaks only for
                                    // its own name); "" = the token's name alone
  size_t max_queued = 100000;       // rows kept while the hub is unreachable
  size_t max_batch = 500;           // rows per POST (the hub takes at most 10000)
  double flush_interval_s = 0.5;    // a partial batch waits at most this long
  double initial_backoff_s = 0.25;  // the step after the first failed POST; doubles per
                                    // failure, each wait drawn from [step/2, step]
  double max_backoff_s = 10;
};

struct EventForwarderStats {
  uint64_t posted = 0;     // rows the hub accepted
  uint64_t queued = 0;     // rows waiting now
  uint64_t dropped = 0;    // rows lost to the queue bound
  uint64_t rejected = 0;   // rows in batches the hub refused as malformed
  uint64_t failures = 0;   // POSTs that failed (transport or 5xx) and will be retried
  std::string last_error;  // the newest failure's token and message; "" once a POST succeeds
};

class EventForwarder {
 public:
  // Takes ownership of its own HubClient (a HubClient serializes its requests, so the forwarder
  // never delays boot's or the publisher's calls).
  EventForwarder(std::unique_ptr<HubClient> hub, EventForwarderOptions options);
  ~EventForwarder();  // Stop(1 s) if still running
  EventForwarder(const EventForwarder&) = delete;
  EventForwarder& operator=(const EventForwarder&) = delete;

  // Subscribes to `log` (EventLog::SetSink) and starts the posting thread. REQUIRES: `log`
  // outlives this forwarder or Stop() runs first.
  void Attach(EventLog& log);
  // Queues one row (what the sink calls). Thread-safe, never blocks on the network.
  void Enqueue(const EventRow& row);

  // Posts what is queued for at most `budget`, then stops the thread and detaches from the log.
  // Returns the number of rows left unposted.
  size_t Stop(std::chrono::milliseconds budget);

  EventForwarderStats stats() const;

 private:
  void Loop();

  std::unique_ptr<HubClient> hub_;
  const EventForwarderOptions options_;
  EventLog* log_ = nullptr;

  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::deque<EventRow> queue_;
  bool stopping_ = false;
  std::chrono::steady_clock::time_point stop_deadline_;
  EventForwarderStats stats_;
  std::thread thread_;
};

}  // namespace kiln
