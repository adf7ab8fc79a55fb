// safetensors files (tensor layer): the checkpoint format weights are bound from
// (docs/design.md §1).
//
// Layout: an 8-byte little-endian header length N, N bytes of JSON
//   {"<name>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"<key>": "<string>", ...}}          (metadata optional)
// then the data region; offsets are relative to its start. Supported dtypes: F32, F16, I64, I32,
// I8, U8, BOOL. Other dtypes of the format (BF16, F64, ...) are refused with Unimplemented.
//
// Reading validates everything before handing out a tensor and refuses, with Corruption naming
// the file and the tensor: a header length beyond the file, bad JSON, duplicate names or fields,
// an unknown dtype, dims that are not non-negative integers, offsets outside the data region,
// end < begin, a byte range whose size is not dtype size x elements, ranges of two tensors that
// overlap, and bool bytes other than 0/1. Parts of the data region no tensor covers are allowed.
//
// Read tensors are zero-copy views into the mapped file and keep the mapping alive. The format
// does not promise alignment: a tensor whose bytes are not aligned to its element size is copied
// into fresh aligned storage instead, so callers may always read it through a typed pointer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "src/kiln/base/status.h"
#include "src/kiln/tensor/tensor.h"

namespace kiln {

struct SafetensorsFile {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;  // the "__metadata__" object, if any
};

// Maps `path` and parses it. NotFound if it does not exist.
Result<SafetensorsFile> ReadSafetensors(const std::string& path);

// Parses `size` bytes at `data`, which `owner` keeps alive (tensors hold a reference to it).
// `what` names the source in errors. Used for in-memory buffers, tests and fuzzing.
Result<SafetensorsFile> ParseSafetensors(std::shared_ptr<const void> owner, const uint8_t* data,
                                         size_t size, const std::string& what);

// The bytes of a safetensors file holding `tensors` and `metadata`. Deterministic: header JSON
// canonical (sorted keys, no spaces) and padded with spaces to a multiple of 8 bytes, tensor data
// packed in sorted-name order. InvalidArgument for an invalid tensor, a tensor named
// "__metadata__", or a name or metadata string that is not UTF-8.
Result<std::string> SerializeSafetensors(const std::map<std::string, Tensor>& tensors,
                                         const std::map<std::string, std::string>& metadata = {});

// SerializeSafetensors, written atomically (see WriteFileAtomic).
Status WriteSafetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                        const std::map<std::string, std::string>& metadata = {});

}  // namespace kiln
