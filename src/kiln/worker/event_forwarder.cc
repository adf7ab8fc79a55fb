// EventForwarder: the worker's event rows, posted to the hub in batches (see event_forwarder.h).
#include "src/kiln/worker/event_forwarder.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <utility>

#include "src/kiln/base/backoff.h"
#include "src/kiln/base/log.h"

namespace kiln {

// The hub stores target, ref, fn and stages as fields; the detail stays prose for a human and
// also names fn= and target=, so a row read alone still says whom it was about.
nlohmann::json HubEventRow(const EventRow& row, const std::string& worker) {
  std::string detail = row.detail;
  auto add_word = [&](const char* name, const std::string& value) {
    const std::string word = std::string(name) + "=" + value;
    if (value.empty() || detail.find(word) != std::string::npos) return;
    detail = detail.empty() ? word : word + " " + detail;
  };
  add_word("fn", row.fn);
  add_word("target", row.target);
  nlohmann::json j = {{"seq", row.seq},
                      {"kind", row.kind},
                      {"phase", row.phase},
                      {"key", row.key.empty() ? row.ref : row.key},
                      {"duration_ms", row.duration_ms},
                      {"detail", detail},
                      {"ts", row.ts_ms},
                      {"target", row.target},
                      {"ref", row.ref},
                      {"fn", row.fn},
                      {"stages", StagesJson(row.stages)}};
  if (!worker.empty()) j["instance"] = worker;
  return j;
}

namespace {

// 4xx answers other than timeouts and throttling say the batch itself is wrong; retrying the
// same rows cannot succeed.
bool IsTerminalRefusal(const HubAnswer& a) {
  return a.http_status >= 400 && a.http_status < 500 && a.http_status != 408 &&
         a.http_status != 429 && a.http_status != 401 && a.http_status != 403;
}

}  // namespace

EventForwarder::EventForwarder(std::unique_ptr<HubClient> hub, EventForwarderOptions options)
    : hub_(std::move(hub)), options_(std::move(options)) {}

EventForwarder::~EventForwarder() {
  if (thread_.joinable()) Stop(std::chrono::milliseconds(1000));
}

void EventForwarder::Attach(EventLog& log) {
  log_ = &log;
  log.SetSink([this](const EventRow& row) { Enqueue(row); });
  thread_ = std::thread([this] { Loop(); });
}

void EventForwarder::Enqueue(const EventRow& row) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (queue_.size() >= std::max<size_t>(options_.max_queued, 1)) {
      queue_.pop_front();
      ++stats_.dropped;
    }
    queue_.push_back(row);
    if (queue_.size() < options_.max_batch) return;
  }
  wake_.notify_one();
}

size_t EventForwarder::Stop(std::chrono::milliseconds budget) {
  if (log_ != nullptr) {
    log_->SetSink(nullptr);
    log_ = nullptr;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    stop_deadline_ = std::chrono::steady_clock::now() + budget;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size();
}

EventForwarderStats EventForwarder::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  EventForwarderStats s = stats_;
  s.queued = queue_.size();
  return s;
}

void EventForwarder::Loop() {
  using Clock = std::chrono::steady_clock;
  const auto interval = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(options_.flush_interval_s));
  double backoff_s = 0;
  int failures_in_a_row = 0;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    // Wait for a full batch, the flush interval, or the stop; after a failure, for the backoff.
    const auto wait =
        backoff_s > 0
            ? std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(backoff_s))
            : interval;
    const auto until = Clock::now() + wait;
    wake_.wait_until(lock, stopping_ ? std::min(until, stop_deadline_) : until, [&] {
      return backoff_s == 0 && (stopping_ || queue_.size() >= options_.max_batch);
    });
    if (stopping_ && (queue_.empty() || Clock::now() >= stop_deadline_)) return;
    if (queue_.empty()) continue;
    if (backoff_s > 0 && !stopping_ && Clock::now() < until) continue;

    const size_t n = std::min(queue_.size(), std::max<size_t>(options_.max_batch, 1));
    nlohmann::json rows = nlohmann::json::array();
    uint64_t last_seq = 0;
    for (size_t i = 0; i < n; ++i) {
      rows.push_back(HubEventRow(queue_[i], options_.worker));
      last_seq = queue_[i].seq;
    }
    lock.unlock();
    const HubAnswer answer = hub_->PostEvents(rows);
    lock.lock();

    const bool terminal = !answer.ok() && IsTerminalRefusal(answer);
    if (answer.ok() || terminal) {
      // The posted rows are still at the head unless the queue bound dropped some meanwhile.
      size_t popped = 0;
      while (!queue_.empty() && queue_.front().seq <= last_seq) {
        queue_.pop_front();
        ++popped;
      }
      if (answer.ok()) {
        stats_.posted += popped;
        stats_.last_error.clear();
      } else {
        stats_.rejected += popped;
        LogWarn("event forwarder: the hub refused " + std::to_string(popped) +
                " row(s) as malformed (" + answer.token + ": " + answer.message + "); dropped");
      }
      backoff_s = 0;
      failures_in_a_row = 0;
      continue;
    }
    if (stats_.failures++ == 0 || stats_.last_error.empty()) {
      LogWarn("event forwarder: hub unreachable (" + answer.token + ": " + answer.message +
              "); rows stay queued and are retried");
    }
    stats_.last_error = answer.token + ": " + answer.message;
    // Jittered, so a fleet's forwarders do not retry a returning hub in one wave.
    backoff_s =
        static_cast<double>(
            JitteredBackoff(
                std::chrono::milliseconds(static_cast<int64_t>(options_.initial_backoff_s * 1000)),
                std::chrono::milliseconds(static_cast<int64_t>(options_.max_backoff_s * 1000)),
                failures_in_a_row++)
                .count()) /
        1000.0;
  }
}

}  // namespace kiln
