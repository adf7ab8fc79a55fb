// Publisher: background publishing of self-minted cells with retry and backoff (see publisher.h).
#include "src/kiln/worker/publisher.h"

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <utility>

#include "src/kiln/base/backoff.h"
#include "src/kiln/base/log.h"

namespace kiln {
namespace {

constexpr const char* kPublishNote = "publish";

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

bool IsTransientHubFailure(const std::string& token, int http_status) {
  if (IsHubTransportToken(token) || token == kHubBadResponse) return true;
  // Another publisher holds the key still: its complete (or its claim's expiry) frees it.
  if (token == kHubPublishInProgress) return true;
  // A 5xx is the hub's trouble, not a verdict on the cell. Anything else with no HTTP status
  // (bad_cell, io_error) is this side's and would fail again the same way: terminal.
  return http_status >= 500;
}

Result<std::unique_ptr<Publisher>> Publisher::Create(PublisherOptions options) {
  if (options.store == nullptr) return Status::InvalidArgument("publisher: no local store");
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<HubClient> hub, HubClient::Create(options.hub));
  return std::unique_ptr<Publisher>(new Publisher(std::move(options), std::move(hub)));
}

Publisher::Publisher(PublisherOptions options, std::unique_ptr<HubClient> hub)
    : options_(std::move(options)), hub_(std::move(hub)) {
  thread_ = std::thread([this] { Loop(); });
}

Publisher::~Publisher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Publisher::EnqueuePublish(const std::string& key, const std::string& target,
                               const std::string& family, std::shared_ptr<void> keep) {
  Job job;
  job.keep = std::move(keep);
  job.key = key;
  job.target = target;
  job.family = family;
  job.enqueued_ms = NowMs();
  Note(job, "pending");
  Enqueue(std::move(job));
}

void Publisher::Enqueue(Job job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(job));
  }
  cv_.notify_all();
}

int Publisher::ResumeUnpublished() {
  int queued = 0;
  for (const std::string& key : options_.store->Keys()) {
    auto text = options_.store->GetNote(key, kPublishNote);
    if (!text.ok() || !text->has_value()) continue;
    const auto j = nlohmann::json::parse(**text, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) {
      KILN_LOG(WARNING) << "publisher: the publish note of " << key
                        << " is not a JSON object; the cell is not offered again";
      continue;
    }
    const std::string state = j.value("state", std::string());
    Job job;
    job.key = key;
    job.target = j.value("target", std::string());
    job.family = j.value("family", std::string());
    if ((state != "pending" && state != "refused") || job.target.empty() || job.family.empty()) {
      continue;
    }
    job.resumed = true;
    job.enqueued_ms = NowMs();
    Enqueue(std::move(job));
    ++queued;
  }
  return queued;
}

void Publisher::Note(const Job& job, const std::string& state, const std::string& token) {
  nlohmann::json j{{"state", state},
                   {"target", job.target},
                   {"family", job.family},
                   {"release", options_.release}};
  if (!token.empty()) j["token"] = token;
  Status s = options_.store->PutNote(job.key, kPublishNote, j.dump());
  if (!s.ok()) {
    KILN_LOG(WARNING) << "publisher: cannot record the publish of " << job.key << " as " << state
                      << " (" << s.ToString() << "); a restart may not offer it again";
  }
}

void Publisher::EnqueueSettle(const std::string& target, const std::string& sm,
                              const std::string& token) {
  if (options_.release.empty()) return;  // no release, nothing owed
  Job job;
  job.settle = true;
  job.target = target;
  job.sm = sm;
  job.token = token;
  job.enqueued_ms = NowMs();
  Enqueue(std::move(job));
}

bool Publisher::WaitIdle(int timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                      [&] { return queue_.empty() && !busy_; });
}

void Publisher::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    Job job = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lock.unlock();
    Work(job);
    job.keep.reset();  // before the queue looks idle: a waiter sees the lease released
    lock.lock();
    busy_ = false;
    cv_.notify_all();
  }
}

bool Publisher::Backoff(int ms) {
  std::unique_lock<std::mutex> lock(mu_);
  return !cv_.wait_for(lock, std::chrono::milliseconds(ms), [&] { return stop_; });
}

void Publisher::Emit(const char* kind, const std::string& phase, double ms, const Job& job,
                     const std::string& detail) {
  if (options_.events == nullptr) return;
  EventRow row;
  row.kind = kind;
  row.phase = phase;
  row.duration_ms = ms;
  row.key = job.key;
  row.target = job.target;
  row.detail = "key=" + job.key + " target=" + job.target + " " + detail;
  options_.events->Append(std::move(row));
}

void Publisher::Work(const Job& job) {
  std::string last_token;
  for (int attempt = 1;; ++attempt) {
    std::string token, message;
    int http_status = 0;
    bool already = false;
    std::string ref;
    if (job.settle) {
      HubAnswer a = hub_->SettleObligation(options_.release, job.target, job.sm, job.token);
      token = a.token;
      message = a.message;
      http_status = a.http_status;
      if (token == "already_terminal" || token == "not_found") return;  // nothing left owed
    } else {
      // The bytes that passed the gate, re-hashed by the store on read.
      auto stored = options_.store->Get(job.key);
      if (!stored.ok() || !stored->has_value()) {
        Emit(event_kind::kSelfMintPublishFailed, "local_cell_missing", NowMs() - job.enqueued_ms,
             job,
             "terminal: the local store no longer holds the cell" +
                 (stored.ok() ? std::string() : " (" + stored.status().ToString() + ")"));
        return;
      }
      PublishOptions po;
      po.release = options_.release;
      po.target = job.target;
      po.family = job.family;
      PublishAnswer a = hub_->Publish((*stored)->bytes, po);
      token = a.token;
      message = a.message;
      http_status = a.http_status;
      already = a.already;
      ref = a.key + "@" + a.digest;
    }
    if (token.empty()) {
      if (!job.settle) {
        Note(job, "published");
        Emit(event_kind::kSelfMintPublish, already ? "already_published" : "published",
             static_cast<double>(NowMs() - job.enqueued_ms), job,
             "ref=" + ref + " attempts=" + std::to_string(attempt) +
                 (job.resumed ? " resumed=1" : "") +
                 (options_.release.empty() ? "" : " release=" + options_.release));
      }
      return;
    }
    if (!IsTransientHubFailure(token, http_status)) {
      if (!job.settle) Note(job, "refused", token);
      Emit(event_kind::kSelfMintPublishFailed, token,
           static_cast<double>(NowMs() - job.enqueued_ms), job,
           std::string("terminal") + (job.settle ? " settle=" + job.token : "") +
               " http=" + std::to_string(http_status) + " message=\"" + message +
               "\"; the cell stays in the local store and keeps serving");
      return;
    }
    if (token != last_token) {
      Emit(event_kind::kSelfMintPublishFailed, token, 0, job,
           std::string("retrying") + (job.settle ? " settle=" + job.token : "") + " message=\"" +
               message + "\"; the cell is kept in the local store");
      last_token = token;
    }
    // Jittered, so a fleet's publishers do not retry a returning hub in one wave.
    const auto delay =
        JitteredBackoff(std::chrono::milliseconds(options_.backoff_initial_ms),
                        std::chrono::milliseconds(options_.backoff_max_ms), attempt - 1);
    if (!Backoff(static_cast<int>(delay.count()))) return;
  }
}

}  // namespace kiln
