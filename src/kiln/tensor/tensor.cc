// Tensor storage, shape helpers and dtype conversion (tensor layer).
#include "src/kiln/tensor/tensor.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>

namespace kiln {

int64_t NumElements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeToString(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ",";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::vector<int64_t> ContiguousStrides(const Shape& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (int64_t i = static_cast<int64_t>(shape.size()) - 2; i >= 0; --i) {
    strides[i] = strides[i + 1] * shape[i + 1];
  }
  return strides;
}

Result<Shape> BroadcastShapes(const Shape& a, const Shape& b) {
  const size_t rank = std::max(a.size(), b.size());
  Shape out(rank);
  for (size_t i = 0; i < rank; ++i) {
    const int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    const int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    if (da == db || db == 1) {
      out[i] = da;
    } else if (da == 1) {
      out[i] = db;
    } else {
      return Status::InvalidArgument("shapes " + ShapeToString(a) + " and " + ShapeToString(b) +
                                     " do not broadcast: dim " + std::to_string(i) + " is " +
                                     std::to_string(da) + " vs " + std::to_string(db));
    }
  }
  return out;
}

std::vector<int64_t> BroadcastStrides(const Shape& in, const Shape& out) {
  std::vector<int64_t> strides(out.size(), 0);
  const std::vector<int64_t> in_strides = ContiguousStrides(in);
  const size_t offset = out.size() - in.size();
  for (size_t i = 0; i < in.size(); ++i) {
    strides[i + offset] = in[i] == 1 ? 0 : in_strides[i];
  }
  return strides;
}

Result<int64_t> NormalizeAxis(int64_t axis, int64_t rank, const std::string& what) {
  if (axis < -rank || axis >= std::max<int64_t>(rank, 1)) {
    return Status::InvalidArgument(what + ": axis " + std::to_string(axis) +
                                   " is out of range for rank " + std::to_string(rank));
  }
  return axis < 0 ? axis + rank : axis;
}

const char* ValueKindName(ValueKind kind) {
  switch (kind) {
    case ValueKind::kTensor:
      return "tensor";
    case ValueKind::kSequence:
      return "sequence";
    case ValueKind::kOptionalTensor:
      return "optional tensor";
    case ValueKind::kOptionalSequence:
      return "optional sequence";
  }
  return "?";
}

namespace {
struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
};
// Destroys a string tensor's `strings` elements, frees the storage, and refunds the budget it
// was charged to (if any).
struct StorageFree {
  int64_t strings = 0;
  std::shared_ptr<MemoryBudget> budget;
  int64_t charged = 0;
  void operator()(void* p) const {
    auto* s = static_cast<std::string*>(p);
    for (int64_t i = 0; i < strings; ++i) s[i].~basic_string();
    std::free(p);
    if (budget) budget->Refund(charged);
  }
};
}  // namespace

Result<Tensor> Tensor::Empty(DType dtype, Shape shape,
                             const std::shared_ptr<MemoryBudget>& budget) {
  for (int64_t d : shape) {
    if (d < 0) {
      return Status::InvalidArgument("tensor shape " + ShapeToString(shape) +
                                     " has a negative dim");
    }
  }
  KILN_ASSIGN_OR_RETURN(const int64_t bytes, CheckedNumBytes(dtype, shape));
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  // Rounded up to the alignment; `bytes` <= INT64_MAX, so the sum fits size_t.
  const size_t alloc = std::max<size_t>(64, (static_cast<size_t>(bytes) + 63) / 64 * 64);
  if (budget) KILN_RETURN_IF_ERROR(budget->Charge(static_cast<int64_t>(alloc), t.TypeString()));
  void* p = std::aligned_alloc(64, alloc);
  if (p == nullptr) {
    if (budget) budget->Refund(static_cast<int64_t>(alloc));
    return Status::ResourceExhausted("cannot allocate " + std::to_string(bytes) +
                                     " bytes for tensor " + t.TypeString());
  }
  std::memset(p, 0, alloc);
  if (dtype == DType::kString || budget) {
    int64_t n = 0;
    if (dtype == DType::kString) {
      n = t.numel();
      auto* s = static_cast<std::string*>(p);
      for (int64_t i = 0; i < n; ++i) new (&s[i]) std::string();
    }
    t.storage_ = std::shared_ptr<void>(p, StorageFree{n, budget, static_cast<int64_t>(alloc)});
  } else {
    t.storage_ = std::shared_ptr<void>(p, AlignedFree());
  }
  t.data_ = p;
  return t;
}

Result<Tensor> Tensor::Strings(Shape shape, const std::vector<std::string>& values) {
  KILN_ASSIGN_OR_RETURN(Tensor t, Empty(DType::kString, std::move(shape)));
  KILN_CHECK(static_cast<int64_t>(values.size()) == t.numel());
  for (size_t i = 0; i < values.size(); ++i) t.str(static_cast<int64_t>(i)) = values[i];
  return t;
}

Tensor Tensor::Sequence(DType elem, std::vector<Tensor> items) {
  Tensor t;
  t.dtype_ = elem;
  t.shape_ = {0};
  t.kind_ = ValueKind::kSequence;
  t.items_ = std::make_shared<const std::vector<Tensor>>(std::move(items));
  return t;
}

Tensor Tensor::Optional(ValueKind inner, DType elem, Tensor value) {
  Tensor t;
  t.dtype_ = elem;
  t.shape_ = {0};
  t.kind_ =
      inner == ValueKind::kSequence ? ValueKind::kOptionalSequence : ValueKind::kOptionalTensor;
  std::vector<Tensor> items;
  if (value.valid()) items.push_back(std::move(value));
  t.items_ = std::make_shared<const std::vector<Tensor>>(std::move(items));
  return t;
}

ValueKind Tensor::inner_kind() const {
  switch (kind_) {
    case ValueKind::kOptionalTensor:
      return ValueKind::kTensor;
    case ValueKind::kOptionalSequence:
      return ValueKind::kSequence;
    default:
      return kind_;
  }
}

Tensor Tensor::View(DType dtype, Shape shape, std::shared_ptr<const void> owner, const void* data) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.storage_ = std::move(owner);
  t.data_ = data;
  return t;
}

Result<Tensor> Tensor::FromBytes(DType dtype, Shape shape, const void* bytes, size_t nbytes) {
  if (dtype == DType::kString) {
    return Status::InvalidArgument("a string tensor " + ShapeToString(shape) +
                                   " cannot be made from raw bytes");
  }
  KILN_ASSIGN_OR_RETURN(Tensor t, Empty(dtype, std::move(shape)));
  if (t.nbytes() != nbytes) {
    return Status::InvalidArgument("tensor " + t.TypeString() + " needs " +
                                   std::to_string(t.nbytes()) + " bytes, got " +
                                   std::to_string(nbytes));
  }
  if (nbytes) std::memcpy(t.raw_data(), bytes, nbytes);
  return t;
}

Result<Tensor> Tensor::Clone() const {
  if (kind_ != ValueKind::kTensor) {
    std::vector<Tensor> items;
    for (const Tensor& item : *items_) {
      KILN_ASSIGN_OR_RETURN(Tensor c, item.Clone());
      items.push_back(std::move(c));
    }
    if (kind_ == ValueKind::kSequence) return Sequence(dtype_, std::move(items));
    return Optional(inner_kind(), dtype_, items.empty() ? Tensor() : std::move(items[0]));
  }
  if (dtype_ == DType::kString) {
    KILN_ASSIGN_OR_RETURN(Tensor t, Empty(dtype_, shape_));
    for (int64_t i = 0; i < numel(); ++i) t.str(i) = str(i);
    return t;
  }
  return FromBytes(dtype_, shape_, data_, nbytes());
}

Result<Tensor> Tensor::Reshaped(Shape shape) const {
  if (kind_ != ValueKind::kTensor) {
    return Status::InvalidArgument("cannot reshape " + TypeString() + ": not a tensor");
  }
  KILN_ASSIGN_OR_RETURN(const int64_t n, CheckedNumElements(shape));
  if (n != numel()) {
    return Status::InvalidArgument("cannot reshape " + TypeString() + " to " +
                                   ShapeToString(shape) + ": element counts differ");
  }
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

double Tensor::GetAsDouble(int64_t i) const {
  switch (dtype_) {
    case DType::kFloat32:
      return data<float>()[i];
    case DType::kFloat16:
      return HalfToFloat(data<uint16_t>()[i]);
    case DType::kInt64:
      return static_cast<double>(data<int64_t>()[i]);
    case DType::kInt32:
      return data<int32_t>()[i];
    case DType::kInt8:
      return data<int8_t>()[i];
    case DType::kUInt8:
      return data<uint8_t>()[i];
    case DType::kBool:
      return data<uint8_t>()[i] ? 1.0 : 0.0;
    case DType::kFloat64:
      return data<double>()[i];
    case DType::kInt16:
      return data<int16_t>()[i];
    case DType::kUInt16:
      return data<uint16_t>()[i];
    case DType::kUInt32:
      return data<uint32_t>()[i];
    case DType::kUInt64:
      return static_cast<double>(data<uint64_t>()[i]);
    case DType::kBFloat16:
      return BFloat16ToFloat(data<uint16_t>()[i]);
    case DType::kString:
      return std::strtod(str(i).c_str(), nullptr);
  }
  return 0;
}

int64_t Tensor::GetAsInt64(int64_t i) const {
  switch (dtype_) {
    case DType::kInt64:
      return data<int64_t>()[i];
    case DType::kInt32:
      return data<int32_t>()[i];
    case DType::kInt8:
      return data<int8_t>()[i];
    case DType::kUInt8:
      return data<uint8_t>()[i];
    case DType::kBool:
      return data<uint8_t>()[i] ? 1 : 0;
    case DType::kInt16:
      return data<int16_t>()[i];
    case DType::kUInt16:
      return data<uint16_t>()[i];
    case DType::kUInt32:
      return data<uint32_t>()[i];
    // Past INT64_MAX this wraps like a C++ conversion; integer-to-integer casts rely on that.
    case DType::kUInt64:
      return static_cast<int64_t>(data<uint64_t>()[i]);
    default: {
      const double v = GetAsDouble(i);
      if (!std::isfinite(v)) return 0;
      return static_cast<int64_t>(std::clamp(v, -9.2e18, 9.2e18));
    }
  }
}

std::vector<int64_t> Tensor::ToInt64Vector() const {
  std::vector<int64_t> out(static_cast<size_t>(numel()));
  for (int64_t i = 0; i < numel(); ++i) out[static_cast<size_t>(i)] = GetAsInt64(i);
  return out;
}

std::string Tensor::TypeString() const {
  switch (kind_) {
    case ValueKind::kTensor:
      return std::string(DTypeName(dtype_)) + ShapeToString(shape_);
    case ValueKind::kSequence:
      return std::string("sequence<") + DTypeName(dtype_) + ">(" + std::to_string(items_->size()) +
             " items)";
    case ValueKind::kOptionalTensor:
    case ValueKind::kOptionalSequence: {
      const std::string inner = kind_ == ValueKind::kOptionalSequence
                                    ? std::string("sequence<") + DTypeName(dtype_) + ">"
                                    : std::string(DTypeName(dtype_));
      return "optional<" + inner + ">(" + (items_->empty() ? "none" : items_->at(0).TypeString()) +
             ")";
    }
  }
  return "?";
}

namespace {

template <typename To>
To ConvertFromDouble(double v) {
  if constexpr (std::is_floating_point_v<To>) {
    return static_cast<To>(v);
  } else {
    if (std::isnan(v)) return 0;
    const double lo = static_cast<double>(std::numeric_limits<To>::lowest());
    const double hi = static_cast<double>(std::numeric_limits<To>::max());
    // For 64-bit targets `hi` rounds up to 2^63 or 2^64, which the target cannot hold.
    if (v >= hi) return std::numeric_limits<To>::max();
    return static_cast<To>(std::clamp(std::trunc(v), lo, hi));
  }
}

template <typename To>
void CastLoop(const Tensor& in, To* out) {
  const int64_t n = in.numel();
  const bool int_src = !IsFloatDType(in.dtype());
  for (int64_t i = 0; i < n; ++i) {
    if (int_src && !std::is_floating_point_v<To>) {
      out[i] = static_cast<To>(in.GetAsInt64(i));  // integer to integer wraps like C++
    } else {
      out[i] = ConvertFromDouble<To>(in.GetAsDouble(i));
    }
  }
}

// Element i as text: the shortest decimal that reads back to the same value of its own type
// (what numpy's str() gives a float32), integers in decimal, bools as 1 or 0.
std::string ElementText(const Tensor& t, int64_t i) {
  char buf[64];
  std::to_chars_result r{};
  switch (t.dtype()) {
    case DType::kString:
      return t.str(i);
    case DType::kFloat64:
      r = std::to_chars(buf, buf + sizeof(buf), t.data<double>()[i]);
      break;
    case DType::kFloat32:
    case DType::kFloat16:
    case DType::kBFloat16:
      r = std::to_chars(buf, buf + sizeof(buf), static_cast<float>(t.GetAsDouble(i)));
      break;
    case DType::kUInt64:
      return std::to_string(t.data<uint64_t>()[i]);
    default:
      return std::to_string(t.GetAsInt64(i));
  }
  return std::string(buf, r.ptr);
}

}  // namespace

Result<Tensor> Tensor::CastTo(DType to) const {
  if (kind_ != ValueKind::kTensor) {
    return Status::InvalidArgument("cannot cast " + TypeString() + ": not a tensor");
  }
  if (to == dtype_) return Clone();
  KILN_ASSIGN_OR_RETURN(Tensor out, Empty(to, shape_));
  const int64_t n = numel();
  switch (to) {
    case DType::kString:
      for (int64_t i = 0; i < n; ++i) out.str(i) = ElementText(*this, i);
      break;
    case DType::kFloat32:
      CastLoop(*this, out.data<float>());
      break;
    case DType::kFloat16: {
      uint16_t* o = out.data<uint16_t>();
      for (int64_t i = 0; i < n; ++i) o[i] = FloatToHalf(static_cast<float>(GetAsDouble(i)));
      break;
    }
    case DType::kInt64:
      CastLoop(*this, out.data<int64_t>());
      break;
    case DType::kInt32:
      CastLoop(*this, out.data<int32_t>());
      break;
    case DType::kInt8:
      CastLoop(*this, out.data<int8_t>());
      break;
    case DType::kUInt8:
      CastLoop(*this, out.data<uint8_t>());
      break;
    case DType::kFloat64:
      CastLoop(*this, out.data<double>());
      break;
    case DType::kInt16:
      CastLoop(*this, out.data<int16_t>());
      break;
    case DType::kUInt16:
      CastLoop(*this, out.data<uint16_t>());
      break;
    case DType::kUInt32:
      CastLoop(*this, out.data<uint32_t>());
      break;
    case DType::kUInt64:
      CastLoop(*this, out.data<uint64_t>());
      break;
    case DType::kBFloat16: {
      uint16_t* o = out.data<uint16_t>();
      for (int64_t i = 0; i < n; ++i) o[i] = FloatToBFloat16(static_cast<float>(GetAsDouble(i)));
      break;
    }
    case DType::kBool: {
      uint8_t* o = out.data<uint8_t>();
      for (int64_t i = 0; i < n; ++i) o[i] = GetAsDouble(i) != 0.0 ? 1 : 0;
      break;
    }
  }
  return out;
}

}  // namespace kiln
