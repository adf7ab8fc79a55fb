// Any value as plain bytes (tensor layer): how a sequence, an optional or a string tensor crosses
// a compiled cell's boundary, whose buffers hold fixed-size elements only.
//
// PackValue writes a value into a uint8 [n] tensor; UnpackValue reads it back, checking every
// length against the bytes it has (a damaged or foreign buffer is a typed error, never a read
// past its end). The layout, little-endian:
//   "KLNV" version(u8 = 1) kind(u8: ValueKind) dtype(u8: DType) then the body:
//   tensor:    rank(u32) dims(i64 each) data (strings: per element a u64 length and its bytes)
//   sequence:  count(u32), then each element as a tensor body
//   optional:  has(u8), then the value's body (a tensor's or a sequence's)
#pragma once

#include "src/kiln/base/status.h"
#include "src/kiln/tensor/tensor.h"

namespace kiln {

// The bytes of `value` (any kind, any dtype) as a uint8 [n] tensor.
Result<Tensor> PackValue(const Tensor& value);

// The value `packed` holds. InvalidArgument when it is not PackValue's layout, or holds another
// kind or element dtype than `kind` and `dtype` (the type its reader declared).
Result<Tensor> UnpackValue(const Tensor& packed, ValueKind kind, DType dtype);

}  // namespace kiln
