// Checked sizes and the per-request memory budget (see memory_budget.h).
#include "src/kiln/tensor/memory_budget.h"

#include <algorithm>
#include <fstream>
#include <limits>
#include <string>

namespace kiln {
namespace {

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

std::string ShapeText(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ",";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

}  // namespace

Status RequestTooLarge(std::string_view detail) {
  return Status::Refused(StatusCode::kInvalidArgument, kRefusalRequestTooLarge, detail);
}

Result<int64_t> CheckedMul(int64_t a, int64_t b, std::string_view what) {
  int64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out)) {
    return RequestTooLarge(std::string(what) + ": " + std::to_string(a) + " x " +
                           std::to_string(b) + " is past the int64 bound " +
                           std::to_string(kInt64Max));
  }
  return out;
}

Result<int64_t> CheckedAdd(int64_t a, int64_t b, std::string_view what) {
  int64_t out = 0;
  if (__builtin_add_overflow(a, b, &out)) {
    return RequestTooLarge(std::string(what) + ": " + std::to_string(a) + " + " +
                           std::to_string(b) + " is past the int64 bound " +
                           std::to_string(kInt64Max));
  }
  return out;
}

Result<int64_t> CheckedNumElements(const Shape& shape) {
  for (int64_t d : shape) {
    if (d < 0) return Status::InvalidArgument("shape " + ShapeText(shape) + " has a negative dim");
  }
  // A zero dim makes the count 0 whatever the others are: no product can overflow then.
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return int64_t{0};
  int64_t n = 1;
  for (int64_t d : shape) {
    if (__builtin_mul_overflow(n, d, &n)) {
      return RequestTooLarge("shape " + ShapeText(shape) +
                             " has more elements than int64 counts (" + std::to_string(kInt64Max) +
                             ")");
    }
  }
  return n;
}

Result<int64_t> CheckedNumBytes(DType dtype, const Shape& shape) {
  KILN_ASSIGN_OR_RETURN(int64_t n, CheckedNumElements(shape));
  int64_t bytes = 0;
  if (__builtin_mul_overflow(n, static_cast<int64_t>(DTypeSize(dtype)), &bytes)) {
    return RequestTooLarge(std::string(DTypeName(dtype)) + ShapeText(shape) + " holds " +
                           std::to_string(n) + " elements, more bytes than int64 counts (" +
                           std::to_string(kInt64Max) + ")");
  }
  return bytes;
}

MemoryBudget::MemoryBudget(int64_t limit_bytes) : limit_(limit_bytes) {
  KILN_CHECK(limit_bytes > 0);
}

Status MemoryBudget::Charge(int64_t bytes, std::string_view what) {
  KILN_CHECK(bytes >= 0);
  int64_t used = in_use_.load();
  while (true) {
    if (bytes > limit_ - used) {
      return RequestTooLarge(std::string(what) + " needs " + std::to_string(bytes) +
                             " bytes, past the request's memory budget of " +
                             std::to_string(limit_) + " bytes (" + std::to_string(used) +
                             " in use)");
    }
    if (in_use_.compare_exchange_weak(used, used + bytes)) break;
  }
  const int64_t now = used + bytes;
  int64_t peak = peak_.load();
  while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
  }
  return Status::OK();
}

void MemoryBudget::Refund(int64_t bytes) { in_use_.fetch_sub(bytes); }

int64_t UsableMemoryBytes() {
  int64_t total = 0;
  {
    std::ifstream meminfo("/proc/meminfo");
    std::string field, unit;
    int64_t kb = 0;
    while (meminfo >> field >> kb >> unit) {
      if (field == "MemTotal:") {
        total = kb * 1024;
        break;
      }
    }
  }
  // cgroup v2: the limit of this process's own group ("max" when unlimited).
  std::ifstream cgroup_of("/proc/self/cgroup");
  std::string line;
  while (std::getline(cgroup_of, line)) {
    if (line.rfind("0::", 0) != 0) continue;
    std::ifstream max("/sys/fs/cgroup" + line.substr(3) + "/memory.max");
    std::string v;
    if (max >> v && v != "max") {
      try {
        const int64_t limit = std::stoll(v);
        if (limit > 0 && (total == 0 || limit < total)) total = limit;
      } catch (...) {
        // Not a number: no limit we can use.
      }
    }
  }
  return total;
}

int64_t DefaultRequestMemoryBytes(int concurrency) {
  constexpr int64_t kFloor = int64_t{64} << 20;
  constexpr int64_t kUnknown = int64_t{1} << 30;  // when the machine's memory cannot be read
  const int64_t usable = UsableMemoryBytes();
  if (usable <= 0) return kUnknown;
  const int64_t share = usable / 2 / std::max(1, concurrency);
  return std::min(usable, std::max(kFloor, share));
}

}  // namespace kiln
