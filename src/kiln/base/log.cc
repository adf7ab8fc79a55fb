// Leveled stderr logging (base layer); see log.h for the contract.
#include "src/kiln/base/log.h"

#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <mutex>
#include <string>

namespace kiln {

namespace {

constexpr int kUnset = -1;
std::atomic<int> g_level{kUnset};

LogLevel LevelFromEnvironment() {
  const char* env = std::getenv("KILN_LOG_LEVEL");
  if (env == nullptr || *env == '\0') return LogLevel::kInfo;
  if (std::optional<LogLevel> level = ParseLogLevel(env)) return *level;
  // Say so once rather than silently ignoring a typo in the environment.
  std::fprintf(stderr,
               "kiln W KILN_LOG_LEVEL='%s' is not one of debug|info|warning|error|off; "
               "using info\n",
               env);
  return LogLevel::kInfo;
}

char LevelLetter(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return 'D';
    case LogLevel::kInfo:
      return 'I';
    case LogLevel::kWarning:
      return 'W';
    case LogLevel::kError:
      return 'E';
    case LogLevel::kOff:
      break;
  }
  return '?';
}

// Only the file name: full build paths add noise, not information.
const char* BaseName(const char* path) {
  const char* base = path;
  for (const char* p = path; *p; ++p) {
    if (*p == '/') base = p + 1;
  }
  return base;
}

std::mutex& OutputMutex() {
  static std::mutex* mu = new std::mutex();  // never destroyed: logging may run during exit
  return *mu;
}

}  // namespace

std::optional<LogLevel> ParseLogLevel(std::string_view text) {
  std::string lower;
  for (char c : text) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "debug") return LogLevel::kDebug;
  if (lower == "info") return LogLevel::kInfo;
  if (lower == "warn" || lower == "warning") return LogLevel::kWarning;
  if (lower == "error") return LogLevel::kError;
  if (lower == "off" || lower == "none") return LogLevel::kOff;
  return std::nullopt;
}

LogLevel GetLogLevel() {
  int level = g_level.load(std::memory_order_relaxed);
  if (level == kUnset) {
    static const int from_env = static_cast<int>(LevelFromEnvironment());
    int expected = kUnset;
    // A concurrent SetLogLevel() wins over the environment.
    g_level.compare_exchange_strong(expected, from_env, std::memory_order_relaxed);
    level = g_level.load(std::memory_order_relaxed);
  }
  return static_cast<LogLevel>(level);
}

void SetLogLevel(LogLevel level) {
  g_level.store(static_cast<int>(level), std::memory_order_relaxed);
}

void LogMessage(LogLevel level, const char* file, int line, std::string_view message) {
  if (!LogEnabled(level)) return;
  const auto now = std::chrono::system_clock::now();
  const std::time_t secs = std::chrono::system_clock::to_time_t(now);
  const auto micros =
      std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count() %
      1000000;
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char stamp[64];
  std::snprintf(stamp, sizeof(stamp), "%04d-%02d-%02dT%02d:%02d:%02d.%06lldZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<long long>(micros));

  std::string out = "kiln ";
  out += LevelLetter(level);
  out += ' ';
  out += stamp;
  if (file != nullptr) {
    out += ' ';
    out += BaseName(file);
    out += ':';
    out += std::to_string(line);
  }
  out += "] ";
  out.append(message.data(), message.size());
  if (out.back() != '\n') out += '\n';

  std::lock_guard<std::mutex> lock(OutputMutex());
  std::fwrite(out.data(), 1, out.size(), stderr);
  std::fflush(stderr);
}

}  // namespace kiln
