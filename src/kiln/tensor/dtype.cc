// DType tables and float16 conversion (tensor layer).
#include "src/kiln/tensor/dtype.h"

#include <cstring>
#include <iterator>

namespace kiln {

size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kFloat32:
      return 4;
    case DType::kFloat16:
      return 2;
    case DType::kInt64:
      return 8;
    case DType::kInt32:
      return 4;
    case DType::kInt8:
      return 1;
    case DType::kUInt8:
      return 1;
    case DType::kBool:
      return 1;
    case DType::kFloat64:
      return 8;
    case DType::kInt16:
      return 2;
    case DType::kUInt16:
      return 2;
    case DType::kUInt32:
      return 4;
    case DType::kUInt64:
      return 8;
    case DType::kBFloat16:
      return 2;
    case DType::kString:
      return sizeof(std::string);
  }
  return 0;
}

const char* DTypeName(DType t) {
  switch (t) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat16:
      return "float16";
    case DType::kInt64:
      return "int64";
    case DType::kInt32:
      return "int32";
    case DType::kInt8:
      return "int8";
    case DType::kUInt8:
      return "uint8";
    case DType::kBool:
      return "bool";
    case DType::kFloat64:
      return "float64";
    case DType::kInt16:
      return "int16";
    case DType::kUInt16:
      return "uint16";
    case DType::kUInt32:
      return "uint32";
    case DType::kUInt64:
      return "uint64";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kString:
      return "string";
  }
  return "?";
}

Result<DType> DTypeFromName(const std::string& name) {
  for (int i = 0; i < kDTypeCount; ++i) {
    DType t = static_cast<DType>(i);
    if (name == DTypeName(t)) return t;
  }
  return Status::InvalidArgument(
      "unknown dtype '" + name +
      "': expected one of float32 float16 int64 int32 int8 uint8 bool float64 int16 uint16 "
      "uint32 uint64 bfloat16 string");
}

namespace {

struct OnnxElemType {
  int64_t code;
  DType dtype;
};
// The ONNX TensorProto.DataType numbers kiln has a DType for.
constexpr OnnxElemType kOnnxElemTypes[] = {
    {1, DType::kFloat32},   {10, DType::kFloat16}, {7, DType::kInt64},   {6, DType::kInt32},
    {3, DType::kInt8},      {2, DType::kUInt8},    {9, DType::kBool},    {11, DType::kFloat64},
    {5, DType::kInt16},     {4, DType::kUInt16},   {12, DType::kUInt32}, {13, DType::kUInt64},
    {16, DType::kBFloat16}, {8, DType::kString},
};

}  // namespace

std::optional<DType> DTypeFromOnnxElemType(int64_t code) {
  for (const OnnxElemType& e : kOnnxElemTypes) {
    if (e.code == code) return e.dtype;
  }
  return std::nullopt;
}

const char* OnnxElemTypeName(int64_t code) {
  static constexpr const char* kNames[] = {
      "UNDEFINED",      "FLOAT",      "UINT8",          "INT8",       "UINT16",   "INT16",
      "INT32",          "INT64",      "STRING",         "BOOL",       "FLOAT16",  "DOUBLE",
      "UINT32",         "UINT64",     "COMPLEX64",      "COMPLEX128", "BFLOAT16", "FLOAT8E4M3FN",
      "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ", "UINT4",      "INT4"};
  if (code < 0 || code >= static_cast<int64_t>(std::size(kNames))) return "unknown";
  return kNames[code];
}

const std::string& SupportedOnnxElemTypes() {
  static const std::string list = [] {
    std::string s;
    for (const OnnxElemType& e : kOnnxElemTypes) {
      if (!s.empty()) s += ", ";
      s += std::to_string(e.code) + " " + OnnxElemTypeName(e.code);
    }
    return s;
  }();
  return list;
}

bool IsWeightDType(DType t) {
  return t == DType::kFloat32 || t == DType::kFloat16 || t == DType::kFloat64 ||
         t == DType::kBFloat16 || t == DType::kInt8 || t == DType::kUInt8;
}

bool IsFloatDType(DType t) {
  return t == DType::kFloat32 || t == DType::kFloat16 || t == DType::kFloat64 ||
         t == DType::kBFloat16;
}

uint16_t FloatToBFloat16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // NaN
  const uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

float BFloat16ToFloat(uint16_t b) {
  const uint32_t x = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t exp = (x >> 23) & 0xffu;
  uint32_t mant = x & 0x7fffffu;
  if (exp == 0xff) {  // inf or nan; keep nan quiet and non-zero
    return static_cast<uint16_t>(sign | 0x7c00u | (mant ? (0x200u | (mant >> 13)) : 0));
  }
  int32_t e = static_cast<int32_t>(exp) - 127 + 15;
  if (e >= 0x1f) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (e <= 0) {                                                 // subnormal or zero
    if (e < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000u;
    const uint32_t shift = static_cast<uint32_t>(14 - e);
    uint32_t half_mant = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half_mant & 1u))) ++half_mant;
    return static_cast<uint16_t>(sign | half_mant);
  }
  uint32_t half = sign | (static_cast<uint32_t>(e) << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;  // may carry into exponent: ok
  return static_cast<uint16_t>(half);
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t x;
  if (exp == 0) {
    if (mant == 0) {
      x = sign;
    } else {  // subnormal: normalize
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ffu;
      x = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    x = sign | 0x7f800000u | (mant << 13);
  } else {
    x = sign | ((exp - 15 + 127) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

}  // namespace kiln
