// Worker event rows: the process seq, the bounded ring and the JSON-lines file (worker layer).
#include "src/kiln/worker/events.h"

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>

#include "src/kiln/base/log.h"

namespace kiln {
namespace {

// One counter for the whole process: every row of every EventLog draws its seq here.
std::atomic<uint64_t> g_next_seq{1};

int64_t NowUnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

bool Matches(const EventRow& row, const EventQuery& q) {
  if (row.seq <= q.since_seq) return false;
  if (!q.kind.empty() && row.kind != q.kind) return false;
  if (!q.phase.empty() && row.phase != q.phase) return false;
  if (!q.target.empty() && row.target != q.target) return false;
  return true;
}

}  // namespace

const std::vector<std::string>& EventKinds() {
  static const std::vector<std::string> kinds = {
      event_kind::kBootAdopt,
      event_kind::kCellNumerics,
      event_kind::kSelfMintStarted,
      event_kind::kSelfMintSkipped,
      event_kind::kSelfMintAbort,
      event_kind::kSelfMintPublish,
      event_kind::kSelfMintPublishFailed,
      event_kind::kLocalCellArmed,
      event_kind::kLocalCellStored,
      event_kind::kLocalCellEvicted,
      event_kind::kServeEagerPosture,
      event_kind::kServeDegrade,
      event_kind::kServePosture,
      event_kind::kIngressRefused,
      event_kind::kCellOom,
      event_kind::kCompiledShapeCoverage,
      event_kind::kJitCompile,
      event_kind::kGuardMiss,
      event_kind::kMintPhases,
      event_kind::kCellRevoked,
      event_kind::kRevocationList,
      event_kind::kCellCrashed,
      event_kind::kCellReinstated,
      event_kind::kHubOrder,
  };
  return kinds;
}

bool IsKnownEventKind(const std::string& kind) {
  for (const std::string& k : EventKinds()) {
    if (k == kind) return true;
  }
  return false;
}

nlohmann::json StagesJson(const std::vector<std::pair<std::string, double>>& stages) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& [name, ms] : stages) out.push_back({{"stage", name}, {"ms", ms}});
  return out;
}

std::string ToJsonLine(const EventRow& row) {
  nlohmann::ordered_json j;
  j["seq"] = row.seq;
  j["kind"] = row.kind;
  j["phase"] = row.phase;
  j["duration_ms"] = row.duration_ms;
  j["key"] = row.key;
  j["ref"] = row.ref;
  j["fn"] = row.fn;
  j["target"] = row.target;
  j["detail"] = row.detail;
  j["ts_ms"] = row.ts_ms;
  j["stages"] = StagesJson(row.stages);
  // Invalid UTF-8 (a name from a request) is replaced, never thrown.
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

EventLog::EventLog(size_t capacity) : capacity_(capacity == 0 ? 1 : capacity) {}

EventLog::~EventLog() {
  if (file_) std::fclose(file_);
}

Status EventLog::SetPath(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (!f) {
    return Status::IOError("cannot open event file '" + path +
                           "' for append: " + std::strerror(errno));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (file_) std::fclose(file_);
  file_ = f;
  path_ = path;
  return Status::OK();
}

uint64_t EventLog::Append(EventRow row) {
  if (row.ts_ms == 0) row.ts_ms = NowUnixMs();
  std::lock_guard<std::mutex> lock(mu_);
  // Drawn under this log's lock, so the ring (and the file) stay in seq order.
  row.seq = g_next_seq.fetch_add(1);
  last_seq_ = row.seq;
  if (file_) {
    const std::string line = ToJsonLine(row) + "\n";
    const bool ok =
        std::fwrite(line.data(), 1, line.size(), file_) == line.size() && std::fflush(file_) == 0;
    if (!ok && file_errors_++ == 0) {
      LogWarn("event file '" + path_ + "': write failed (" + std::strerror(errno) +
              "); rows stay in memory");
    }
  }
  if (sink_) sink_(row);
  ring_.push_back(std::move(row));
  if (ring_.size() > capacity_) {
    ring_.pop_front();
    ++dropped_;
  }
  return last_seq_;
}

void EventLog::SetSink(std::function<void(const EventRow&)> sink) {
  std::lock_guard<std::mutex> lock(mu_);
  sink_ = std::move(sink);
}

std::vector<EventRow> EventLog::Query(const EventQuery& query) const {
  std::vector<EventRow> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (const EventRow& row : ring_) {
    if (!Matches(row, query)) continue;
    out.push_back(row);
    if (query.limit != 0 && out.size() >= query.limit) break;
  }
  return out;
}

uint64_t EventLog::last_seq() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_seq_;
}

uint64_t EventLog::dropped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_;
}

uint64_t EventLog::file_errors() const {
  std::lock_guard<std::mutex> lock(mu_);
  return file_errors_;
}

}  // namespace kiln
