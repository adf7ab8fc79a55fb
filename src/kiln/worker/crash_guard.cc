// Crash containment: markers around a cell's first call, and the quarantine they leave when the
// process died inside it (worker layer; see crash_guard.h).
#include "src/kiln/worker/crash_guard.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "src/kiln/base/file.h"
#include "src/kiln/base/log.h"
#include "src/kiln/cell/key.h"

namespace kiln {
namespace {

// Field 22 of /proc/<pid>/stat (the start time in clock ticks since boot), or "" when there is no
// such process.
std::string StartTimeOf(int64_t pid) {
  auto stat = ReadFile("/proc/" + std::to_string(pid) + "/stat");
  if (!stat.ok()) return "";
  const size_t paren = stat->rfind(')');
  if (paren == std::string::npos) return "";
  std::istringstream in(stat->substr(paren + 1));
  std::string field;
  for (int i = 3; i <= 22 && (in >> field); ++i) {
    if (i == 22) return field;
  }
  return "";
}

std::string BootId() {
  auto id = ReadFile("/proc/sys/kernel/random/boot_id");
  if (!id.ok()) return "";
  std::string s = *id;
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// Whether the process that wrote `m` still runs: same machine boot, its pid alive, and started
// at the same tick (a reused pid is another process).
bool WriterAlive(const CrashMarker& m) {
  if (m.boot_id.empty() || m.boot_id != BootId()) return false;
  const std::string start = StartTimeOf(m.pid);
  return !start.empty() && start == m.start;
}

// Flushes a directory's entries (an unlink or a rename in it) to the device.
void SyncDir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

void RemoveDurably(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::remove(path, ec)) {
    SyncDir(std::filesystem::path(path).parent_path().string());
  }
}

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

bool IsLowerHex(const std::string& s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

nlohmann::json MarkerJson(const CrashMarker& m) {
  return {{"ref", m.ref},     {"target", m.target},   {"pid", m.pid},
          {"start", m.start}, {"boot_id", m.boot_id}, {"at_ms", m.at_ms}};
}

}  // namespace

CrashGuard::CrashGuard(std::string store_root) : dir_(std::move(store_root) + "/.crash") {}

std::string CrashGuard::QuarantinePath(const std::string& ref) const {
  const size_t at = ref.find('@');
  if (at == std::string::npos) return "";
  const std::string key = ref.substr(0, at);
  const std::string digest = ref.substr(at + 1);
  if (!IsWellFormedKey(key) || digest.size() != 7 + 64 || digest.rfind("sha256:", 0) != 0 ||
      !IsLowerHex(digest.substr(7))) {
    return "";
  }
  return dir_ + "/quarantine/" + key + "." + digest.substr(7) + ".json";
}

bool CrashGuard::IsQuarantined(const std::string& ref) const {
  const std::string path = QuarantinePath(ref);
  std::error_code ec;
  if (!path.empty() && std::filesystem::exists(path, ec)) return true;
  std::lock_guard<std::mutex> lock(mu_);
  return unpersisted_.count(ref) != 0;
}

Status CrashGuard::Quarantine(const CrashMarker& marker) {
  const std::string path = QuarantinePath(marker.ref);
  if (path.empty()) {
    return Status::InvalidArgument("crash quarantine: ref '" + marker.ref +
                                   "' is not key@sha256:<64 hex>");
  }
  KILN_RETURN_IF_ERROR(MakeDirs(dir_ + "/quarantine"));
  nlohmann::json j = MarkerJson(marker);
  j["quarantined_at_ms"] = NowMs();
  return WriteFileAtomic(path, j.dump(2) + "\n");
}

std::vector<CrashMarker> CrashGuard::Recover() {
  std::vector<CrashMarker> dead;
  std::error_code ec;
  std::vector<std::string> paths;
  for (const auto& e : std::filesystem::directory_iterator(MarkersDir(), ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() > 5 && name.compare(name.size() - 5, 5, ".json") == 0) {
      paths.push_back(e.path().string());
    }
  }
  std::sort(paths.begin(), paths.end());
  for (const std::string& path : paths) {
    auto text = ReadFile(path);
    if (!text.ok()) continue;  // removed by its own process meanwhile
    auto j = nlohmann::json::parse(*text, nullptr, false);
    CrashMarker m;
    if (j.is_object()) {
      m.ref = j.value("ref", "");
      m.target = j.value("target", "");
      m.pid = j.value("pid", int64_t{0});
      m.start = j.value("start", "");
      m.boot_id = j.value("boot_id", "");
      m.at_ms = j.value("at_ms", int64_t{0});
    }
    m.path = path;
    if (QuarantinePath(m.ref).empty() || m.pid <= 0) {
      // Half written by a process that died mid-write (a whole marker is renamed into place, so
      // this is damage, not a crash in a cell): nothing to quarantine.
      LogWarn("crash guard: marker '" + path + "' does not parse; removed");
      RemoveDurably(path);
      continue;
    }
    if (WriterAlive(m)) continue;
    if (Status q = Quarantine(m); q.ok()) {
      RemoveDurably(path);
    } else {
      LogWarn("crash guard: cannot persist the quarantine of " + m.ref + " (" + q.ToString() +
              "); it holds for this process and the marker stays for the next boot");
      std::lock_guard<std::mutex> lock(mu_);
      unpersisted_.insert(m.ref);
    }
    dead.push_back(std::move(m));
  }
  return dead;
}

Status CrashGuard::Arm(const std::string& ref, const std::string& target) {
  CrashMarker m;
  m.ref = ref;
  m.target = target;
  m.pid = ::getpid();
  m.start = StartTimeOf(m.pid);
  m.boot_id = BootId();
  m.at_ms = NowMs();
  std::string path;
  {
    std::lock_guard<std::mutex> lock(mu_);
    path = MarkersDir() + "/" + std::to_string(m.pid) + "-" + std::to_string(next_++) + ".json";
  }
  KILN_RETURN_IF_ERROR(MakeDirs(MarkersDir()));
  KILN_RETURN_IF_ERROR(WriteFileAtomic(path, MarkerJson(m).dump() + "\n"));
  std::lock_guard<std::mutex> lock(mu_);
  armed_[{ref, target}] = path;
  return Status::OK();
}

void CrashGuard::Disarm(const std::string& ref, const std::string& target) {
  std::string path;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = armed_.find({ref, target});
    if (it == armed_.end()) return;
    path = it->second;
    armed_.erase(it);
  }
  RemoveDurably(path);
}

void CrashGuard::DisarmAll() {
  std::map<std::pair<std::string, std::string>, std::string> armed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    armed.swap(armed_);
  }
  for (const auto& [id, path] : armed) RemoveDurably(path);
}

}  // namespace kiln
