// NumPy .npy files (tensor layer): how example inputs, expected outputs and probe tensors move
// between kiln and Python tooling.
//
// Reads format versions 1.0, 2.0 and 3.0; writes 1.0 (2.0 only if the header would not fit), with
// the same header bytes numpy's np.save produces. Supported dtypes and their kiln DTypes:
//   <f4 float32, <f2 float16, <i8 int64, <i4 int32, |i1 int8, |u1 uint8, |b1 bool, <f8 float64,
//   <i2 int16, <u2 uint16, <u4 uint32, <u8 uint64, and <V2 (a two-byte void, how numpy saves
//   ml_dtypes' bfloat16, which it has no type for) bfloat16.
// Only C-order, little-endian, non-structured arrays: Fortran order, big-endian data, object or
// structured dtypes and other element types are refused with Unimplemented. A damaged file
// (truncated, bad magic, malformed header, wrong data length, trailing bytes, bool bytes other
// than 0/1) is refused with Corruption naming the file and what is wrong; the parser never reads
// outside the given bytes.
#pragma once

#include <string>
#include <string_view>

#include "src/kiln/base/status.h"
#include "src/kiln/tensor/tensor.h"

namespace kiln {

// Reads and parses a whole .npy file. NotFound if it does not exist.
Result<Tensor> ReadNpy(const std::string& path);

// Parses .npy bytes into a new tensor (a copy: the result does not refer to `bytes`). `what`
// names the source in errors (usually the path).
Result<Tensor> ParseNpy(std::string_view bytes, const std::string& what);

// The .npy bytes of `tensor`. REQUIRES: tensor.valid().
std::string SerializeNpy(const Tensor& tensor);

// Writes `tensor` atomically (see WriteFileAtomic). InvalidArgument if the tensor is invalid.
Status WriteNpy(const std::string& path, const Tensor& tensor);

// Values beyond tensors on disk, as `kiln run` takes its inputs and writes its outputs:
//   tensor            a .npy file
//   sequence          a directory of 0.npy, 1.npy, ... (its elements in order; an empty
//                     directory is an empty sequence)
//   optional          its value as above, or, holding none, the path "none" (an input) or an
//                     empty file NAME.none (an output)
// ReadValue reads `path` as a value of `kind` whose elements have dtype `elem` (an empty
// sequence takes its dtype from there); errors name the path and what was expected.
inline constexpr const char* kNoneValuePath = "none";
Result<Tensor> ReadValue(const std::string& path, ValueKind kind, DType elem);
// Writes `value` named `name` into directory `dir` (NAME.npy, NAME/, or NAME.none for an empty
// optional) and returns the path written. `name` must already be a safe file name.
Result<std::string> WriteValue(const std::string& dir, const std::string& name,
                               const Tensor& value);

}  // namespace kiln
