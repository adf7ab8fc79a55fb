// Tensor: a dense, row-major (C-contiguous) array of one DType, and Shape helpers.
//
// Storage is shared and reference-counted: copying a Tensor shares its bytes (like a handle), and
// Clone() makes a deep copy. A tensor may own aligned heap memory or view memory owned by someone
// else (an mmap'ed safetensors file, a protobuf buffer) kept alive through `owner`.
// Invariant: nbytes() == numel() * DTypeSize(dtype()), and data is at least 64-byte aligned when
// kiln allocated it.
//
// A Tensor is also the handle of ONNX's non-tensor values, so that every map of values (the
// interpreter's scope, a run's inputs and outputs) carries them unchanged: a sequence of tensors
// (ValueKind::kSequence) and an optional tensor or sequence (kOptionalTensor,
// kOptionalSequence). Such a value holds no bytes (numel() == 0, raw_data() == nullptr); its
// dtype() is its elements' dtype and items() its elements (an optional's zero or one value).
// Code that reads bytes works on kind() == kTensor only: ops say whether they take other kinds
// (OpDef::values), and the interpreter refuses the rest by name.
//
// String tensors (DType::kString) hold std::string elements: Empty() constructs them, the last
// handle destroys them, Clone() copies them, and FromBytes/View refuse them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "src/kiln/base/status.h"
#include "src/kiln/tensor/dtype.h"
#include "src/kiln/tensor/memory_budget.h"

namespace kiln {

using Shape = std::vector<int64_t>;

// What a value is: a dense tensor, or one of ONNX's non-tensor values (see Tensor).
enum class ValueKind : uint8_t { kTensor, kSequence, kOptionalTensor, kOptionalSequence };
// "tensor", "sequence", "optional tensor", "optional sequence".
const char* ValueKindName(ValueKind kind);

// Product of dims (1 for a scalar). REQUIRES: all dims >= 0 and the product fits int64 (the shape
// of a tensor that exists); a shape computed from values is counted with CheckedNumElements
// (memory_budget.h).
int64_t NumElements(const Shape& shape);
// "[1,3,224,224]"
std::string ShapeToString(const Shape& shape);
// Row-major element strides.
std::vector<int64_t> ContiguousStrides(const Shape& shape);
// Numpy-style broadcast of two shapes; error names both shapes.
Result<Shape> BroadcastShapes(const Shape& a, const Shape& b);
// Strides (in elements) for reading a tensor of shape `in` as if broadcast to `out`: 0 on
// broadcast dims. REQUIRES: `in` broadcasts to `out`.
std::vector<int64_t> BroadcastStrides(const Shape& in, const Shape& out);
// Normalizes a possibly negative axis into [0, rank); error names `what` and the value.
Result<int64_t> NormalizeAxis(int64_t axis, int64_t rank, const std::string& what);

class Tensor {
 public:
  Tensor() = default;  // an empty, invalid tensor (valid() == false)

  // Zero-filled, 64-byte-aligned storage. Fails with InvalidArgument on a negative dim,
  // `request_too_large` (memory_budget.h) when its size does not fit int64 or `budget` (when
  // given) refuses it, and ResourceExhausted when the allocation fails. The size is checked before
  // anything is allocated; `budget` is charged the allocation and refunded when the storage goes.
  static Result<Tensor> Empty(DType dtype, Shape shape,
                              const std::shared_ptr<MemoryBudget>& budget = nullptr);
  // A view over memory kept alive by `owner`. REQUIRES: data holds numel*size bytes.
  static Tensor View(DType dtype, Shape shape, std::shared_ptr<const void> owner, const void* data);
  // Copies `bytes` (must equal numel*size) into new storage.
  static Result<Tensor> FromBytes(DType dtype, Shape shape, const void* bytes, size_t nbytes);
  template <typename T>
  static Tensor FromVector(Shape shape, const std::vector<T>& values);
  template <typename T>
  static Tensor Scalar(T value) {
    return FromVector<T>({}, std::vector<T>{value});
  }
  // A string tensor holding `values` (row-major). REQUIRES: values.size() == NumElements(shape).
  static Result<Tensor> Strings(Shape shape, const std::vector<std::string>& values);
  // A sequence of `items`, each a tensor of dtype `elem` (an empty sequence still has one).
  // REQUIRES: every item is a kTensor of dtype `elem`.
  static Tensor Sequence(DType elem, std::vector<Tensor> items);
  // An optional of `inner` (kTensor or kSequence) elements of dtype `elem`, holding `value`
  // or, when `value` is invalid, none. REQUIRES: a valid value has that kind and dtype.
  static Tensor Optional(ValueKind inner, DType elem, Tensor value);

  bool valid() const {
    return data_ != nullptr || (storage_ && numel() == 0) || kind_ != ValueKind::kTensor;
  }
  ValueKind kind() const { return kind_; }
  bool is_tensor() const { return kind_ == ValueKind::kTensor; }
  // A sequence's elements, or an optional's value (empty when it holds none).
  // REQUIRES: !is_tensor().
  const std::vector<Tensor>& items() const { return *items_; }
  // The kind an optional holds (kTensor or kSequence); kind() itself otherwise.
  ValueKind inner_kind() const;
  // A string element. REQUIRES: dtype() == kString.
  const std::string& str(int64_t i) const { return data<std::string>()[i]; }
  std::string& str(int64_t i) { return data<std::string>()[i]; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t rank() const { return static_cast<int64_t>(shape_.size()); }
  int64_t dim(int64_t i) const { return shape_[static_cast<size_t>(i)]; }
  int64_t numel() const { return NumElements(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * DTypeSize(dtype_); }

  void* raw_data() { return const_cast<void*>(data_); }
  const void* raw_data() const { return data_; }
  template <typename T>
  T* data() {
    return static_cast<T*>(raw_data());
  }
  template <typename T>
  const T* data() const {
    return static_cast<const T*>(raw_data());
  }

  // Deep copy into fresh aligned storage.
  Result<Tensor> Clone() const;
  // Same bytes, new shape. Error if element counts differ.
  Result<Tensor> Reshaped(Shape shape) const;
  // Converts to another dtype (float<->int truncates toward zero like ONNX Cast, bool is x != 0).
  Result<Tensor> CastTo(DType to) const;
  // Reads element i as double / int64 (any dtype), for small structural values and tests.
  double GetAsDouble(int64_t i) const;
  int64_t GetAsInt64(int64_t i) const;
  // All elements as int64 (any integer or bool dtype); for structural constants (shapes, axes).
  std::vector<int64_t> ToInt64Vector() const;
  // "float32[1,3,8,8]"; "sequence<float32>(2 items)", "optional<float32>(none)".
  std::string TypeString() const;

 private:
  DType dtype_ = DType::kFloat32;
  Shape shape_;
  std::shared_ptr<const void> storage_;  // keeps data_ alive
  const void* data_ = nullptr;
  ValueKind kind_ = ValueKind::kTensor;
  std::shared_ptr<const std::vector<Tensor>> items_;  // non-tensor kinds only
};

template <typename T>
Tensor Tensor::FromVector(Shape shape, const std::vector<T>& values) {
  static_assert(!std::is_same_v<T, bool>, "use uint8_t values with FromBytes for bool tensors");
  auto t = Tensor::Empty(DTypeOf<T>::value, std::move(shape));
  KILN_CHECK(t.ok());
  KILN_CHECK(static_cast<int64_t>(values.size()) == t->numel());
  std::copy(values.begin(), values.end(), t->template data<T>());
  return std::move(t).value();
}

}  // namespace kiln
