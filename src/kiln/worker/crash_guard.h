// Crash containment: a cell whose code kills the worker process is quarantined on this machine
// and reported, so one bad cell cannot crash-loop a fleet (worker layer; docs/fleet.md "A cell
// that crashes the worker").
//
// Cells run inside the worker (dlopen). A cell fault the cell itself reports is law 7
// (serving.h); a SIGSEGV in its code ends the process, and nothing the process does afterwards
// can say why. So the worker leaves a note *before* it trusts a cell:
//   - before an exported cell's first call in a process (ServedTarget, serving.h), a marker
//     {ref, target, pid, the process's start time and boot id} is written durably under
//     <store root>/.crash/markers/; it is removed (durably) when that call returns, whatever it
//     returned, and the cell counts as proven in this process once a call returned outputs;
//   - a clean exit removes whatever markers this process still holds;
//   - at boot, before any adoption, Recover() reads every marker: one whose process is gone (its
//     pid no longer runs, or runs as another process: start time or boot id differ) died inside
//     that cell's first call. Its ref is quarantined, persisted as
//     <store root>/.crash/quarantine/<key>.<digest hex>.json, and the marker deleted. A marker
//     of a live process (another worker sharing the store root, in its own first call) is left
//     alone.
// A quarantined ref is never adopted on this machine again, from the local store or from the hub
// (boot.h, phase `cell_crashed`), nor installed by any route (ServedTarget::InstallCell); the
// target serves eager with posture `cell_crashed` (a mandatory target refuses, law 11). The
// quarantine has no expiry: an operator lifts it by deleting the file (docs/fleet.md).
//
// Intake-lane cells have no ref (they are compiled here at every boot) and are not guarded.
//
// Threads: every method may be called from any thread; several processes may share one root
// (each marker is named by its process).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "src/kiln/base/status.h"

namespace kiln {

// The posture token, boot_adopt phase and refusal of a cell quarantined because a process died
// inside it; also the kind of the event row that reports the crash (phase `quarantined`).
inline constexpr const char* kCellCrashed = "cell_crashed";
// The phase of that row.
inline constexpr const char* kCrashQuarantined = "quarantined";
// The serve_posture phase of a first call the marker could not be written for (it runs anyway:
// a full disk must not take a cell away).
inline constexpr const char* kCrashMarkerUnwritten = "crash_marker_unwritten";

// What a marker says: the cell being called for the first time, and by whom.
struct CrashMarker {
  std::string ref;     // key@digest
  std::string target;  // the manifest target it served
  int64_t pid = 0;
  std::string start;    // the process's start time (/proc/<pid>/stat field 22, clock ticks)
  std::string boot_id;  // /proc/sys/kernel/random/boot_id of the machine it ran on
  int64_t at_ms = 0;    // unix milliseconds when the call began
  std::string path;     // the marker file (set when read)
};

class CrashGuard {
 public:
  // `store_root` is the local store's root (LocalStore::root()); markers and quarantine live in
  // its .crash/ directory, which is made on first use.
  explicit CrashGuard(std::string store_root);
  CrashGuard(const CrashGuard&) = delete;
  CrashGuard& operator=(const CrashGuard&) = delete;

  // Boot, before any adoption: every marker left by a process that is gone quarantines its ref
  // and is deleted. Returns those markers (the caller reports each). A marker that does not parse
  // is deleted and skipped. When the quarantine file cannot be written the ref is quarantined for
  // this process only and the marker kept, so the next boot tries again; the write's error is
  // logged. Never fails: a boot must not stop for it.
  std::vector<CrashMarker> Recover();

  // Whether `ref` (key@digest) is quarantined on this machine. A malformed ref is not.
  bool IsQuarantined(const std::string& ref) const;
  // Quarantines `ref` durably (what Recover does for each dead marker). InvalidArgument for a
  // malformed ref, IOError naming the path.
  Status Quarantine(const CrashMarker& marker);

  // Writes this process's marker for the first call of `ref` on `target`, durably, before the
  // call. IOError naming the path when it cannot (the caller decides whether to call anyway).
  Status Arm(const std::string& ref, const std::string& target);
  // Removes the marker Arm wrote for (ref, target); nothing when there is none.
  void Disarm(const std::string& ref, const std::string& target);
  // A clean exit: removes every marker this process still holds.
  void DisarmAll();

  const std::string& dir() const { return dir_; }

 private:
  std::string MarkersDir() const { return dir_ + "/markers"; }
  std::string QuarantinePath(const std::string& ref) const;  // "" for a malformed ref

  const std::string dir_;  // <store root>/.crash
  mutable std::mutex mu_;
  std::map<std::pair<std::string, std::string>, std::string> armed_;  // (ref, target) -> path
  std::set<std::string> unpersisted_;  // quarantined refs whose file could not be written
  uint64_t next_ = 0;
};

}  // namespace kiln
