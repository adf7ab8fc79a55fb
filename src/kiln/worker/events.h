// Worker event rows: typed telemetry for every decision the worker makes (worker layer;
// docs/design.md §10, §12 "Event rows").
//
// A row is {seq, kind, phase, duration_ms, key, ref, fn, target, detail, ts_ms}. `seq` is
// process-monotonic and shared by every row of the process (every EventLog draws from one
// counter), so rows from several logs still order totally. `kind` is one of the constants below;
// `phase` is the countable token (`hit`, `cell_fault`, a refusal token); `detail` is prose with
// `key=`, `fn=`, `target=`; `duration_ms` is a measured span, never a guess (0 when the row
// records an instant).
//
// An EventLog keeps the newest rows in a bounded in-memory ring (what /v1/events answers from)
// and, when a path is configured, appends each row to that file as one JSON line, flushed per
// row. Append is thread-safe; rows enter the ring in seq order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "src/kiln/base/status.h"

namespace kiln {

// Event kinds (docs/design.md §10): the complete vocabulary of `kind`.
namespace event_kind {
inline constexpr const char* kBootAdopt = "boot_adopt";
inline constexpr const char* kCellNumerics = "cell_numerics";
inline constexpr const char* kSelfMintStarted = "self_mint_started";
inline constexpr const char* kSelfMintSkipped = "self_mint_skipped";
inline constexpr const char* kSelfMintAbort = "self_mint_abort";
inline constexpr const char* kSelfMintPublish = "self_mint_publish";
inline constexpr const char* kSelfMintPublishFailed = "self_mint_publish_failed";
inline constexpr const char* kLocalCellArmed = "local_cell_armed";
inline constexpr const char* kLocalCellStored = "local_cell_stored";
inline constexpr const char* kLocalCellEvicted = "local_cell_evicted";
inline constexpr const char* kServeEagerPosture = "serve_eager_posture";
inline constexpr const char* kServeDegrade = "serve_degrade";
inline constexpr const char* kServePosture = "serve_posture";
inline constexpr const char* kIngressRefused = "ingress_refused";
inline constexpr const char* kCellOom = "cell_oom";
inline constexpr const char* kCompiledShapeCoverage = "compiled_shape_coverage";
inline constexpr const char* kJitCompile = "jit_compile";
inline constexpr const char* kGuardMiss = "guard_miss";
inline constexpr const char* kMintPhases = "mint_phases";
inline constexpr const char* kCellRevoked = "cell_revoked";
inline constexpr const char* kRevocationList = "revocation_list";
// A process of this machine died inside a cell's first call; its ref is quarantined
// (crash_guard.h). Equal to the posture token kCellCrashed.
inline constexpr const char* kCellCrashed = "cell_crashed";
// The hub lifted a revocation this process had applied (revocations.h); the targets it held
// eager adopt again.
inline constexpr const char* kCellReinstated = "cell_reinstated";
// The hub's order for a target of this worker was applied (revocations.h; phase = its kind).
inline constexpr const char* kHubOrder = "hub_order";
}  // namespace event_kind

// Every kind above, in docs/design.md §10 order.
const std::vector<std::string>& EventKinds();
// True when `kind` is one of EventKinds().
bool IsKnownEventKind(const std::string& kind);

struct EventRow {
  uint64_t seq = 0;  // assigned by EventLog::Append
  std::string kind;
  std::string phase;
  double duration_ms = 0;
  std::string key;  // the cell key ("" when none)
  std::string ref;  // key@digest ("" when none)
  std::string fn;   // the KServe model name that asked ("" when none)
  std::string target;
  std::string detail;
  int64_t ts_ms = 0;  // wall clock (Unix ms), assigned by Append when 0
  // Where duration_ms went, stage by stage in call order (boot_adopt: key, toolchain, resolve,
  // ...); empty for rows that time one thing. A field, so nobody parses it out of `detail`.
  std::vector<std::pair<std::string, double>> stages;
};

// One JSON object on one line (no trailing newline), fields in the order of EventRow.
std::string ToJsonLine(const EventRow& row);
// `stages` as JSON: [{"stage": name, "ms": ms}, ...] in order ([] when none). The worker's
// /v1/events, its event file and the rows it forwards to the hub all use this form.
nlohmann::json StagesJson(const std::vector<std::pair<std::string, double>>& stages);

// A /v1/events query. Empty strings match anything.
struct EventQuery {
  std::string kind;
  std::string phase;
  std::string target;
  uint64_t since_seq = 0;  // only rows with seq > since_seq
  size_t limit = 0;        // at most this many rows, oldest first; 0 = all that match
};

class EventLog {
 public:
  static constexpr size_t kDefaultCapacity = 4096;

  // A log with no file; `capacity` (>= 1) rows stay in the ring.
  explicit EventLog(size_t capacity = kDefaultCapacity);
  ~EventLog();
  EventLog(const EventLog&) = delete;
  EventLog& operator=(const EventLog&) = delete;

  // Appends every later row to `path` as JSON lines (created if absent, appended to if present;
  // its directory must exist). IOError names the path. Replaces a previously set file.
  Status SetPath(const std::string& path);

  // Stamps `row` with the next process seq (and ts_ms when 0), keeps it in the ring, writes it to
  // the file if one is set, and returns the seq. A file write that fails is counted
  // (file_errors()) and logged once; the row still enters the ring. Never blocks on anything but
  // this log's own lock.
  uint64_t Append(EventRow row);

  // Calls `sink` with every later row, after it is stamped, in seq order, under this log's lock:
  // a sink must be quick and must not append to this log (the hub forwarder only queues). One
  // sink; a second call replaces it, an empty function removes it.
  void SetSink(std::function<void(const EventRow&)> sink);

  // Rows in the ring that match, in seq order.
  std::vector<EventRow> Query(const EventQuery& query) const;

  // The seq of the newest row appended here (0 when none).
  uint64_t last_seq() const;
  // Rows that fell out of the ring since the log was made.
  uint64_t dropped() const;
  uint64_t file_errors() const;
  size_t capacity() const { return capacity_; }

 private:
  const size_t capacity_;
  mutable std::mutex mu_;
  std::deque<EventRow> ring_;
  uint64_t last_seq_ = 0;
  uint64_t dropped_ = 0;
  uint64_t file_errors_ = 0;
  std::string path_;
  std::FILE* file_ = nullptr;
  std::function<void(const EventRow&)> sink_;
};

}  // namespace kiln
