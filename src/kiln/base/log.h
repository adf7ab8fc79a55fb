// Leveled logging to stderr (base layer): the one diagnostic channel every kiln layer may use.
//
// Logs are for people reading a terminal or a journal; typed telemetry (event rows) lives in the
// worker, not here. The threshold comes from the environment variable KILN_LOG_LEVEL (debug,
// info, warning, error, off; case-insensitive; default info), read once on first use and
// overridable with SetLogLevel(). Each line is formatted whole and written with one locked write,
// so lines from different threads never interleave. Any thread may log at any time.
//
//   KILN_LOG(INFO) << "adopted cell " << ref;
//   LogWarn("hub unreachable, serving eager");
//
// The streamed operands are not evaluated when the level is disabled.
#pragma once

#include <optional>
#include <sstream>
#include <string_view>

namespace kiln {

enum class LogLevel : int { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kOff = 4 };

// "debug" / "info" / "warn" or "warning" / "error" / "off" (any case); nullopt otherwise.
std::optional<LogLevel> ParseLogLevel(std::string_view text);

// The current threshold: messages below it are dropped.
LogLevel GetLogLevel();
// Overrides KILN_LOG_LEVEL for the rest of the process (tests, --verbose flags).
void SetLogLevel(LogLevel level);
inline bool LogEnabled(LogLevel level) {
  return level != LogLevel::kOff && static_cast<int>(level) >= static_cast<int>(GetLogLevel());
}

// Writes one line "kiln <L> <UTC time> <file>:<line>] <message>" if `level` is enabled.
// `file` may be null (then no location is printed).
void LogMessage(LogLevel level, const char* file, int line, std::string_view message);

inline void LogDebug(std::string_view message) {
  LogMessage(LogLevel::kDebug, nullptr, 0, message);
}
inline void LogInfo(std::string_view message) { LogMessage(LogLevel::kInfo, nullptr, 0, message); }
inline void LogWarn(std::string_view message) {
  LogMessage(LogLevel::kWarning, nullptr, 0, message);
}
inline void LogError(std::string_view message) {
  LogMessage(LogLevel::kError, nullptr, 0, message);
}

namespace log_internal {

// Collects one streamed line and emits it when destroyed (at the end of the full expression).
class LogLine {
 public:
  LogLine(LogLevel level, const char* file, int line) : level_(level), file_(file), line_(line) {}
  ~LogLine() { LogMessage(level_, file_, line_, stream_.view()); }
  LogLine(const LogLine&) = delete;
  LogLine& operator=(const LogLine&) = delete;
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  const char* file_;
  int line_;
  std::ostringstream stream_;
};

// Turns the streamed expression into void so it can sit in the branch of a conditional.
struct Voidify {
  void operator&(std::ostream&) {}
};

// Severity spellings accepted by KILN_LOG(...). Pasted with a prefix (never expanded on their
// own), so a build that defines DEBUG or ERROR as a macro still compiles.
inline constexpr LogLevel kSeverity_DEBUG = LogLevel::kDebug;
inline constexpr LogLevel kSeverity_INFO = LogLevel::kInfo;
inline constexpr LogLevel kSeverity_WARN = LogLevel::kWarning;
inline constexpr LogLevel kSeverity_WARNING = LogLevel::kWarning;
inline constexpr LogLevel kSeverity_ERROR = LogLevel::kError;

}  // namespace log_internal
}  // namespace kiln

// KILN_LOG(INFO) << ...; severity is one of DEBUG, INFO, WARN, WARNING, ERROR.
#define KILN_LOG(severity)                                                                      \
  !::kiln::LogEnabled(::kiln::log_internal::kSeverity_##severity)                               \
      ? (void)0                                                                                 \
      : ::kiln::log_internal::Voidify() &                                                       \
            ::kiln::log_internal::LogLine(::kiln::log_internal::kSeverity_##severity, __FILE__, \
                                          __LINE__)                                             \
                .stream()
