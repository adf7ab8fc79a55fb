// Status implementation (base layer).
#include "src/kiln/base/status.h"

namespace kiln {

const char* StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "ok";
    case StatusCode::kInvalidArgument:
      return "invalid_argument";
    case StatusCode::kNotFound:
      return "not_found";
    case StatusCode::kUnimplemented:
      return "unimplemented";
    case StatusCode::kCorruption:
      return "corruption";
    case StatusCode::kIOError:
      return "io_error";
    case StatusCode::kResourceExhausted:
      return "resource_exhausted";
    case StatusCode::kInternal:
      return "internal";
  }
  return "unknown";
}

Status::Status(StatusCode code, std::string message) {
  if (code != StatusCode::kOk) {
    state_ = std::make_unique<State>(State{code, std::move(message), std::string()});
  }
}

Status Status::Refused(StatusCode code, std::string_view token, std::string_view detail) {
  KILN_CHECK(code != StatusCode::kOk && !token.empty());
  std::string message(token);
  if (!detail.empty()) message.append(": ").append(detail);
  Status s(code, std::move(message));
  s.state_->token = std::string(token);
  return s;
}

Status::Status(const Status& other)
    : state_(other.state_ ? std::make_unique<State>(*other.state_) : nullptr) {}

Status& Status::operator=(const Status& other) {
  if (this != &other) state_ = other.state_ ? std::make_unique<State>(*other.state_) : nullptr;
  return *this;
}

const std::string& Status::message() const {
  static const std::string kEmpty;
  return state_ ? state_->message : kEmpty;
}

const std::string& Status::token() const {
  static const std::string kEmpty;
  return state_ ? state_->token : kEmpty;
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(StatusCodeName(state_->code)) + ": " + state_->message;
}

Status Status::WithContext(std::string_view prefix) const {
  if (ok()) return Status();
  Status s(state_->code, std::string(prefix) + ": " + state_->message);
  s.state_->token = state_->token;
  return s;
}

}  // namespace kiln
