// Checked tensor sizes and the per-request memory budget (tensor layer): how every allocation whose
// size comes from a value (a shape given as an input, a depth, a trip count, a manifest dim) is
// bounded before it is made.
//
// Two bounds, one refusal. A size that does not fit int64 (an element count or byte size computed
// from dims that overflow) and a size over what one request may hold (a MemoryBudget) are both
// refused with the token `request_too_large` (kRefusalRequestTooLarge): the request asked for
// more than can exist, which is the request's fault, never the machine's (ResourceExhausted: an
// allocation that should have fit and failed) and never a cell's. The code is InvalidArgument.
//
// A MemoryBudget is charged when a tensor's storage is allocated (Tensor::Empty) and refunded when
// the storage is freed, so what it holds is the memory the request's tensors take right now, on
// every engine that allocates through it: the interpreter's outputs, a loop's stacked scans, a
// cell's dynamic region and dynamic outputs. Tensors keep their budget alive (shared_ptr), so an
// output that outlives the run refunds when the answer is sent.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "src/kiln/base/status.h"
#include "src/kiln/tensor/dtype.h"

namespace kiln {

using Shape = std::vector<int64_t>;

// The refusal token of a request whose tensors would not fit (see the header comment).
inline constexpr const char* kRefusalRequestTooLarge = "request_too_large";

// The most elements one input of a request may carry, whatever it arrives in: the worker's KServe
// reader refuses more, and a manifest refuses a shape class that declares more (no request could
// ever fill it).
inline constexpr int64_t kMaxRequestInputElements = int64_t{1} << 32;

// `request_too_large` with `detail`; InvalidArgument.
Status RequestTooLarge(std::string_view detail);

// Size arithmetic on values: a * b and a + b, or request_too_large naming `what`, the operands
// and the int64 bound. REQUIRES: a, b >= 0 (sizes and dims; a negative operand is refused by
// the caller first).
Result<int64_t> CheckedMul(int64_t a, int64_t b, std::string_view what);
Result<int64_t> CheckedAdd(int64_t a, int64_t b, std::string_view what);

// The element count / byte size of a tensor of `shape`: InvalidArgument on a negative dim,
// request_too_large when the count or the size does not fit int64. Every allocation from a shape
// goes through these (NumElements is for shapes already known to fit: a tensor that exists).
Result<int64_t> CheckedNumElements(const Shape& shape);
Result<int64_t> CheckedNumBytes(DType dtype, const Shape& shape);

// The bytes one request's tensors may hold at once. Thread-safe: a request's kernels may allocate
// from several threads.
class MemoryBudget {
 public:
  // REQUIRES: limit_bytes > 0.
  explicit MemoryBudget(int64_t limit_bytes);
  MemoryBudget(const MemoryBudget&) = delete;
  MemoryBudget& operator=(const MemoryBudget&) = delete;

  // Takes `bytes` (>= 0) for `what` (a tensor's type string, "float32[1,4]"), or refuses
  // request_too_large naming what, the bytes, the bytes in use and the limit; a refusal charges
  // nothing.
  Status Charge(int64_t bytes, std::string_view what);
  // Gives back bytes an earlier Charge took.
  void Refund(int64_t bytes);

  int64_t limit() const { return limit_; }
  int64_t in_use() const { return in_use_.load(); }
  // The most ever held at once.
  int64_t peak() const { return peak_.load(); }

 private:
  const int64_t limit_;
  std::atomic<int64_t> in_use_{0};
  std::atomic<int64_t> peak_{0};
};

// The default per-request budget of a serving process: half of the memory this process may use
// (UsableMemoryBytes) divided among the requests that run at once, so that all of them together
// leave the other half to weights, cells and the system; never under 64 MiB (nor over the usable
// memory); 1 GiB where the machine's memory cannot be read. `concurrency` >= 1.
int64_t DefaultRequestMemoryBytes(int concurrency);
// The memory this process may use: min(MemTotal, the cgroup v2 memory.max), in bytes; 0 when
// neither can be read.
int64_t UsableMemoryBytes();

}  // namespace kiln
