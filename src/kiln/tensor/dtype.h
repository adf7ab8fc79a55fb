// Element types kiln tensors can hold, their sizes and names, and float16 conversion.
// Sits at the bottom of the tensor layer: everything above speaks DType.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "src/kiln/base/status.h"

namespace kiln {

enum class DType : uint8_t {
  kFloat32,
  kFloat16,
  kInt64,
  kInt32,
  kInt8,
  kUInt8,
  kBool,  // one byte per element, 0 or 1
  kFloat64,
  // The wider integers ONNX models carry in a few places (index math, quantization tools);
  // structural like int32, and appended so the earlier values keep their numbers.
  kInt16,
  kUInt16,
  kUInt32,
  kUInt64,
  // bfloat16: storage (the upper half of a float32's bits, as uint16_t) and casts; arithmetic
  // runs in float32 and rounds back once, like float16.
  kBFloat16,
  // Text: each element a std::string (UTF-8 by convention, any bytes allowed). Not plain bytes:
  // only the ops that say they take strings (OpDef::strings) ever see one, and Tensor copies
  // them element by element.
  kString,
};
inline constexpr int kDTypeCount = 14;

size_t DTypeSize(DType t);
// ONNX-style lower-case names: "float32", "float16", "int64", "int32", "int8", "uint8", "bool",
// "float64", "int16", "uint16", "uint32", "uint64", "bfloat16", "string".
const char* DTypeName(DType t);
Result<DType> DTypeFromName(const std::string& name);

// Floating or 8-bit: tensors of these types bound by name are weights (checkpoint data); others
// (the wider integers and bool) are structural constants whose values are part of the graph.
bool IsWeightDType(DType t);

// ONNX TensorProto element-type numbers (the `to` of Cast, the `dtype` of EyeLike, a tensor's
// elem_type), mapped in one place. Codes kiln has no DType for give nullopt.
std::optional<DType> DTypeFromOnnxElemType(int64_t code);
// "FLOAT", "BFLOAT16", ...; "unknown" outside the table.
const char* OnnxElemTypeName(int64_t code);
// The codes kiln maps, for messages: "1 FLOAT, 10 FLOAT16, ...".
const std::string& SupportedOnnxElemTypes();
bool IsFloatDType(DType t);

// IEEE half <-> single, round-to-nearest-even, with inf/nan/subnormals preserved.
uint16_t FloatToHalf(float f);
float HalfToFloat(uint16_t h);
// bfloat16 <-> single: round-to-nearest-even on the dropped 16 bits; NaN stays a quiet NaN.
uint16_t FloatToBFloat16(float f);
float BFloat16ToFloat(uint16_t b);

// Maps a C++ element type to its DType.
template <typename T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::kFloat32;
};
template <>
struct DTypeOf<double> {
  static constexpr DType value = DType::kFloat64;
};
template <>
struct DTypeOf<int64_t> {
  static constexpr DType value = DType::kInt64;
};
template <>
struct DTypeOf<int32_t> {
  static constexpr DType value = DType::kInt32;
};
template <>
struct DTypeOf<int8_t> {
  static constexpr DType value = DType::kInt8;
};
template <>
struct DTypeOf<uint8_t> {
  static constexpr DType value = DType::kUInt8;
};
template <>
struct DTypeOf<bool> {
  static constexpr DType value = DType::kBool;
};
template <>
struct DTypeOf<int16_t> {
  static constexpr DType value = DType::kInt16;
};
// float16 and bfloat16 are stored as uint16_t bits too; code handling them converts through
// FloatToHalf / FloatToBFloat16 and never asks DTypeOf<uint16_t>.
template <>
struct DTypeOf<uint16_t> {
  static constexpr DType value = DType::kUInt16;
};
template <>
struct DTypeOf<uint32_t> {
  static constexpr DType value = DType::kUInt32;
};
template <>
struct DTypeOf<uint64_t> {
  static constexpr DType value = DType::kUInt64;
};

}  // namespace kiln
