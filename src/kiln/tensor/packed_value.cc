// A value as plain bytes and back (tensor layer; see packed_value.h).
#include "src/kiln/tensor/packed_value.h"

#include <cstring>
#include <string>

namespace kiln {
namespace {

constexpr char kMagic[4] = {'K', 'L', 'N', 'V'};
constexpr uint8_t kVersion = 1;

template <typename T>
void Put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

void PutTensor(std::string& out, const Tensor& t) {
  Put<uint32_t>(out, static_cast<uint32_t>(t.rank()));
  for (int64_t d : t.shape()) Put<int64_t>(out, d);
  if (t.dtype() == DType::kString) {
    for (int64_t i = 0; i < t.numel(); ++i) {
      Put<uint64_t>(out, t.str(i).size());
      out += t.str(i);
    }
    return;
  }
  if (t.nbytes() > 0) out.append(static_cast<const char*>(t.raw_data()), t.nbytes());
}

Status PutValue(std::string& out, const Tensor& v) {
  switch (v.kind()) {
    case ValueKind::kTensor:
      PutTensor(out, v);
      return Status::OK();
    case ValueKind::kSequence:
      Put<uint32_t>(out, static_cast<uint32_t>(v.items().size()));
      for (const Tensor& item : v.items()) PutTensor(out, item);
      return Status::OK();
    case ValueKind::kOptionalTensor:
    case ValueKind::kOptionalSequence:
      Put<uint8_t>(out, v.items().empty() ? 0 : 1);
      if (!v.items().empty()) return PutValue(out, v.items()[0]);
      return Status::OK();
  }
  return Status::Internal("PackValue: unknown value kind");
}

// Reads from a byte range, every read checked against what is left.
class Reader {
 public:
  Reader(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  template <typename T>
  Result<T> Get(const char* what) {
    if (n_ - at_ < sizeof(T)) return Short(what);
    T v;
    std::memcpy(&v, p_ + at_, sizeof(T));
    at_ += sizeof(T);
    return v;
  }
  Result<const uint8_t*> Bytes(uint64_t n, const char* what) {
    if (n > n_ - at_) return Short(what);
    const uint8_t* p = p_ + at_;
    at_ += static_cast<size_t>(n);
    return p;
  }
  bool done() const { return at_ == n_; }
  size_t left() const { return n_ - at_; }

 private:
  Status Short(const char* what) const {
    return Status::InvalidArgument("packed value: " + std::to_string(n_) +
                                   " bytes end before its " + what + " (at byte " +
                                   std::to_string(at_) + ")");
  }
  const uint8_t* p_;
  size_t n_;
  size_t at_ = 0;
};

Result<Tensor> GetTensor(Reader& r, DType dtype) {
  KILN_ASSIGN_OR_RETURN(uint32_t rank, r.Get<uint32_t>("rank"));
  if (rank > 64) {
    return Status::InvalidArgument("packed value: rank " + std::to_string(rank) +
                                   " is implausible");
  }
  Shape shape;
  uint64_t count = 1;
  for (uint32_t i = 0; i < rank; ++i) {
    KILN_ASSIGN_OR_RETURN(int64_t d, r.Get<int64_t>("dims"));
    if (d < 0 || __builtin_mul_overflow(count, static_cast<uint64_t>(d), &count)) {
      return Status::InvalidArgument("packed value: dim " + std::to_string(d) + " is invalid");
    }
    shape.push_back(d);
  }
  // Every element takes at least its size (a string its eight-byte length): a count the bytes
  // left cannot hold is refused before anything is allocated.
  const uint64_t least = dtype == DType::kString ? 8 : DTypeSize(dtype);
  uint64_t need = 0;
  if (__builtin_mul_overflow(count, least, &need) || need > r.left()) {
    return Status::InvalidArgument("packed value: " + std::to_string(count) + " elements of " +
                                   DTypeName(dtype) + " do not fit the " +
                                   std::to_string(r.left()) + " bytes left");
  }
  if (dtype == DType::kString) {
    std::vector<std::string> values;
    for (uint64_t i = 0; i < count; ++i) {
      KILN_ASSIGN_OR_RETURN(uint64_t len, r.Get<uint64_t>("string length"));
      KILN_ASSIGN_OR_RETURN(const uint8_t* p, r.Bytes(len, "string bytes"));
      values.emplace_back(reinterpret_cast<const char*>(p), static_cast<size_t>(len));
    }
    return Tensor::Strings(shape, values);
  }
  const uint64_t nbytes = count * DTypeSize(dtype);
  KILN_ASSIGN_OR_RETURN(const uint8_t* p, r.Bytes(nbytes, "tensor data"));
  return Tensor::FromBytes(dtype, shape, p, static_cast<size_t>(nbytes));
}

Result<Tensor> GetValue(Reader& r, ValueKind kind, DType dtype) {
  switch (kind) {
    case ValueKind::kTensor:
      return GetTensor(r, dtype);
    case ValueKind::kSequence: {
      KILN_ASSIGN_OR_RETURN(uint32_t n, r.Get<uint32_t>("element count"));
      std::vector<Tensor> items;
      for (uint32_t i = 0; i < n; ++i) {
        KILN_ASSIGN_OR_RETURN(Tensor t, GetTensor(r, dtype));
        items.push_back(std::move(t));
      }
      return Tensor::Sequence(dtype, std::move(items));
    }
    case ValueKind::kOptionalTensor:
    case ValueKind::kOptionalSequence: {
      const ValueKind inner =
          kind == ValueKind::kOptionalSequence ? ValueKind::kSequence : ValueKind::kTensor;
      KILN_ASSIGN_OR_RETURN(uint8_t has, r.Get<uint8_t>("optional flag"));
      Tensor value;
      if (has) {
        KILN_ASSIGN_OR_RETURN(value, GetValue(r, inner, dtype));
      }
      return Tensor::Optional(inner, dtype, std::move(value));
    }
  }
  return Status::InvalidArgument("packed value: unknown kind");
}

}  // namespace

Result<Tensor> PackValue(const Tensor& value) {
  if (!value.valid()) return Status::InvalidArgument("PackValue: the value is invalid");
  std::string out(kMagic, 4);
  Put<uint8_t>(out, kVersion);
  Put<uint8_t>(out, static_cast<uint8_t>(value.kind()));
  Put<uint8_t>(out, static_cast<uint8_t>(value.dtype()));
  KILN_RETURN_IF_ERROR(PutValue(out, value));
  return Tensor::FromBytes(DType::kUInt8, {static_cast<int64_t>(out.size())}, out.data(),
                           out.size());
}

Result<Tensor> UnpackValue(const Tensor& packed, ValueKind kind, DType dtype) {
  if (!packed.is_tensor() || packed.dtype() != DType::kUInt8 || packed.rank() != 1) {
    return Status::InvalidArgument("packed value: " + packed.TypeString() +
                                   " is not a uint8 vector");
  }
  Reader r(packed.data<uint8_t>(), static_cast<size_t>(packed.numel()));
  KILN_ASSIGN_OR_RETURN(const uint8_t* magic, r.Bytes(4, "magic"));
  if (std::memcmp(magic, kMagic, 4) != 0) {
    return Status::InvalidArgument("packed value: does not start with \"KLNV\"");
  }
  KILN_ASSIGN_OR_RETURN(uint8_t version, r.Get<uint8_t>("version"));
  KILN_ASSIGN_OR_RETURN(uint8_t k, r.Get<uint8_t>("kind"));
  KILN_ASSIGN_OR_RETURN(uint8_t d, r.Get<uint8_t>("dtype"));
  if (version != kVersion) {
    return Status::InvalidArgument("packed value: version " + std::to_string(version) +
                                   ", expected " + std::to_string(kVersion));
  }
  if (k != static_cast<uint8_t>(kind) || d != static_cast<uint8_t>(dtype)) {
    return Status::InvalidArgument("packed value: holds kind " + std::to_string(k) + " dtype " +
                                   std::to_string(d) + ", expected a " + ValueKindName(kind) +
                                   " of " + DTypeName(dtype));
  }
  KILN_ASSIGN_OR_RETURN(Tensor v, GetValue(r, kind, dtype));
  if (!r.done()) {
    return Status::InvalidArgument("packed value: " + std::to_string(r.left()) + " trailing bytes");
  }
  return v;
}

}  // namespace kiln
