// Status and Result<T>: how every kiln layer reports an expected failure.
//
// Errors are values. A Status is OK (no allocation) or carries a code and a message that names the
// object, the value and the expectation ("Conv 'conv_3': group=3 does not divide 64 input
// channels"). A refusal also carries its token, the stable wire word that callers branch on
// ("fence_refused", "key_mismatch"): it is a field, set by Status::Refused, kept by every copy and
// by WithContext, and never recovered by reading the message. Result<T> holds either a T or a
// non-OK Status. No exception crosses a library or ABI
// boundary; assertions (KILN_CHECK) are for kiln's own bugs, never for user input.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace kiln {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument = 1,
  kNotFound = 2,
  kUnimplemented = 3,
  kCorruption = 4,
  kIOError = 5,
  kResourceExhausted = 6,
  kInternal = 7,
};

// The stable lower_snake token of a code ("invalid_argument"); used on the wire and in logs.
const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message);
  Status(const Status& other);
  Status& operator=(const Status& other);
  Status(Status&&) noexcept = default;
  Status& operator=(Status&&) noexcept = default;

  static Status OK() { return Status(); }
  static Status InvalidArgument(std::string msg) {
    return Status(StatusCode::kInvalidArgument, std::move(msg));
  }
  static Status NotFound(std::string msg) { return Status(StatusCode::kNotFound, std::move(msg)); }
  static Status Unimplemented(std::string msg) {
    return Status(StatusCode::kUnimplemented, std::move(msg));
  }
  static Status Corruption(std::string msg) {
    return Status(StatusCode::kCorruption, std::move(msg));
  }
  static Status IOError(std::string msg) { return Status(StatusCode::kIOError, std::move(msg)); }
  static Status ResourceExhausted(std::string msg) {
    return Status(StatusCode::kResourceExhausted, std::move(msg));
  }
  static Status Internal(std::string msg) { return Status(StatusCode::kInternal, std::move(msg)); }
  // A refusal with its token: the message reads "<token>: <detail>" for people, and token()
  // returns `token` for code. REQUIRES: code != kOk, token non-empty.
  static Status Refused(StatusCode code, std::string_view token, std::string_view detail);

  bool ok() const { return state_ == nullptr; }
  StatusCode code() const { return state_ ? state_->code : StatusCode::kOk; }
  // Empty for OK.
  const std::string& message() const;
  // The refusal token; empty for OK and for failures that have none.
  const std::string& token() const;
  // True when this is a failure whose token is `token`.
  bool Is(std::string_view token) const { return !ok() && state_->token == token; }
  // "OK" or "<code>: <message>".
  std::string ToString() const;
  // Returns a copy whose message is "<prefix>: <message>"; OK stays OK; the code and the token
  // are kept. Used to add the name of an enclosing object (file, node) as an error travels up.
  Status WithContext(std::string_view prefix) const;

  // Marks the status as looked at, for call sites that deliberately drop an error.
  void IgnoreError() const {}

 private:
  struct State {
    StatusCode code;
    std::string message;
    std::string token;  // "" when the failure has no refusal token
  };
  std::unique_ptr<State> state_;  // null means OK
};

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT: implicit by design
    if (std::get<Status>(v_).ok()) {
      v_ = Status::Internal("Result constructed from an OK Status without a value");
    }
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  Status status() const { return ok() ? Status::OK() : std::get<Status>(v_); }

  // REQUIRES: ok()
  T& value() & {
    Check();
    return std::get<T>(v_);
  }
  const T& value() const& {
    Check();
    return std::get<T>(v_);
  }
  T&& value() && {
    Check();
    return std::get<T>(std::move(v_));
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  void Check() const {
    if (!ok()) {
      std::fprintf(stderr, "kiln: Result::value() on error: %s\n",
                   std::get<Status>(v_).ToString().c_str());
      std::abort();
    }
  }
  std::variant<T, Status> v_;
};

}  // namespace kiln

#define KILN_CONCAT_INNER(a, b) a##b
#define KILN_CONCAT(a, b) KILN_CONCAT_INNER(a, b)

#define KILN_RETURN_IF_ERROR(expr)               \
  do {                                           \
    ::kiln::Status kiln_status_ = (expr);        \
    if (!kiln_status_.ok()) return kiln_status_; \
  } while (0)

#define KILN_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return tmp.status();              \
  lhs = std::move(tmp).value()

// KILN_ASSIGN_OR_RETURN(auto x, F()); declares x from a Result or returns its error.
#define KILN_ASSIGN_OR_RETURN(lhs, expr) \
  KILN_ASSIGN_OR_RETURN_IMPL(KILN_CONCAT(kiln_result_, __LINE__), lhs, expr)

// For kiln's own invariants only (bugs), never for user input.
#define KILN_CHECK(cond)                                                                     \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      std::fprintf(stderr, "kiln: internal check failed at %s:%d: %s\n", __FILE__, __LINE__, \
                   #cond);                                                                   \
      std::abort();                                                                          \
    }                                                                                        \
  } while (0)
