// safetensors reading and writing (tensor layer); see safetensors.h for what is refused and why.
#include "src/kiln/tensor/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <vector>

#include "src/kiln/base/canonical_json.h"
#include "src/kiln/base/file.h"

namespace kiln {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; a big-endian host needs byte swapping");

namespace {

constexpr char kMetadataKey[] = "__metadata__";
// The reference implementation's limit; a larger header is a corrupt length, not a checkpoint.
constexpr uint64_t kMaxHeaderBytes = 100u << 20;

struct DTypeToken {
  const char* token;
  DType dtype;
};
constexpr DTypeToken kDTypeTokens[] = {
    {"F32", DType::kFloat32},   {"F16", DType::kFloat16}, {"I64", DType::kInt64},
    {"I32", DType::kInt32},     {"I8", DType::kInt8},     {"U8", DType::kUInt8},
    {"BOOL", DType::kBool},     {"F64", DType::kFloat64}, {"I16", DType::kInt16},
    {"U16", DType::kUInt16},    {"U32", DType::kUInt32},  {"U64", DType::kUInt64},
    {"BF16", DType::kBFloat16},
};
// Every DType but string: the format holds fixed-size elements only.
static_assert(sizeof(kDTypeTokens) / sizeof(kDTypeTokens[0]) == kDTypeCount - 1,
              "one safetensors token per DType");
// Valid in the format, not (yet) in kiln.
constexpr const char* kUnsupportedTokens[] = {"F8_E4M3", "F8_E5M2"};

const char* TokenOf(DType t) {
  for (const DTypeToken& e : kDTypeTokens) {
    if (e.dtype == t) return e.token;
  }
  KILN_CHECK(false);
  return "";
}

// A JSON integer >= 0 (nlohmann stores non-negative literals as unsigned, negative as signed).
bool GetNonNegative(const nlohmann::json& j, uint64_t* out) {
  if (j.is_number_unsigned()) {
    *out = j.get<uint64_t>();
    return true;
  }
  if (j.is_number_integer() && j.get<int64_t>() >= 0) {
    *out = static_cast<uint64_t>(j.get<int64_t>());
    return true;
  }
  return false;
}

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin;
  uint64_t end;
};

// Checks one tensor's header entry against the data region of `data_size` bytes.
Result<Entry> ParseEntry(const std::string& name, const nlohmann::json& info, uint64_t data_size,
                         const std::string& prefix) {
  const std::string where = prefix + "tensor '" + name + "': ";
  if (!info.is_object()) {
    return Status::Corruption(where + "header entry is " + info.type_name() +
                              ", expected an object");
  }
  for (const auto& [key, unused] : info.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets") {
      return Status::Corruption(where + "unexpected field '" + key +
                                "' (expected dtype, shape, data_offsets)");
    }
  }
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    if (!info.contains(field)) return Status::Corruption(where + "missing '" + field + "'");
  }
  Entry e;
  e.name = name;

  const nlohmann::json& dtype = info["dtype"];
  if (!dtype.is_string()) {
    return Status::Corruption(where + "dtype is " + dtype.dump() + ", expected a string");
  }
  const std::string& token = dtype.get_ref<const std::string&>();
  bool known = false;
  for (const DTypeToken& t : kDTypeTokens) {
    if (token == t.token) {
      e.dtype = t.dtype;
      known = true;
    }
  }
  if (!known) {
    for (const char* t : kUnsupportedTokens) {
      if (token == t) {
        return Status::Unimplemented(where + "dtype " + token +
                                     " is not supported (kiln reads F32 F16 I64 I32 I8 U8 BOOL)");
      }
    }
    return Status::Corruption(where + "unknown dtype '" + token + "'");
  }

  const nlohmann::json& shape = info["shape"];
  if (!shape.is_array()) {
    return Status::Corruption(where + "shape is " + shape.dump() + ", expected an array");
  }
  const uint64_t elem_size = DTypeSize(e.dtype);
  uint64_t numel = 1;
  bool overflow = false;
  for (const nlohmann::json& d : shape) {
    uint64_t dim = 0;
    if (!GetNonNegative(d, &dim) ||
        dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return Status::Corruption(where + "shape " + shape.dump() + " has dim " + d.dump() +
                                ", expected non-negative integers");
    }
    e.shape.push_back(static_cast<int64_t>(dim));
    // Every partial product must fit int64, not only the total: NumElements multiplies the dims in
    // this order in int64, so [2^62, 3, 0] would overflow there although it holds no element.
    overflow = overflow || __builtin_mul_overflow(numel, dim, &numel) ||
               numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  }
  uint64_t nbytes = 0;
  overflow = overflow || __builtin_mul_overflow(numel, elem_size, &nbytes) ||
             numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max());

  const nlohmann::json& offsets = info["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2 || !GetNonNegative(offsets[0], &e.begin) ||
      !GetNonNegative(offsets[1], &e.end)) {
    return Status::Corruption(where + "data_offsets " + offsets.dump() +
                              ", expected [begin, end] with non-negative integers");
  }
  const std::string range =
      "data_offsets [" + std::to_string(e.begin) + "," + std::to_string(e.end) + "]";
  if (e.end < e.begin) return Status::Corruption(where + range + " end before begin");
  if (e.end > data_size) {
    return Status::Corruption(where + range + " extend past the data region of " +
                              std::to_string(data_size) + " bytes");
  }
  if (overflow || e.end - e.begin != nbytes) {
    return Status::Corruption(where + range + " hold " + std::to_string(e.end - e.begin) +
                              " bytes, but " + TokenOf(e.dtype) + ShapeToString(e.shape) +
                              " needs " + (overflow ? "more than 2^64" : std::to_string(nbytes)));
  }
  return e;
}

}  // namespace

Result<SafetensorsFile> ParseSafetensors(std::shared_ptr<const void> owner, const uint8_t* data,
                                         size_t size, const std::string& what) {
  const std::string prefix = "safetensors '" + what + "': ";

  // 1. Header length, bounded by the file.
  if (size < 8) {
    return Status::Corruption(prefix + "file is " + std::to_string(size) +
                              " bytes, too short for the 8-byte header length");
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | data[i];
  if (header_len > size - 8) {
    return Status::Corruption(prefix + "header length " + std::to_string(header_len) +
                              " exceeds the " + std::to_string(size - 8) +
                              " bytes after the length field");
  }
  if (header_len > kMaxHeaderBytes) {
    return Status::Corruption(prefix + "header length " + std::to_string(header_len) +
                              " exceeds the limit of " + std::to_string(kMaxHeaderBytes) +
                              " bytes");
  }
  const uint8_t* region = data + 8 + header_len;
  const uint64_t region_size = size - 8 - header_len;

  // 2. The JSON header; ParseJson refuses duplicate keys (tensor names or fields).
  Result<nlohmann::json> parsed = ParseJson(
      std::string_view(reinterpret_cast<const char*>(data + 8), header_len), prefix + "header");
  if (!parsed.ok()) {
    if (parsed.status().code() == StatusCode::kResourceExhausted) return parsed.status();
    return Status::Corruption(parsed.status().message());
  }
  const nlohmann::json& header = *parsed;
  if (!header.is_object()) {
    return Status::Corruption(prefix + "header is " + header.type_name() +
                              ", expected a JSON object");
  }

  // 3. Each entry on its own, then overlaps between entries.
  SafetensorsFile out;
  std::vector<Entry> entries;
  for (const auto& [name, info] : header.items()) {
    if (name == kMetadataKey) {
      if (!info.is_object()) {
        return Status::Corruption(prefix + "__metadata__ is " + info.type_name() +
                                  ", expected an object of strings");
      }
      for (const auto& [key, value] : info.items()) {
        if (!value.is_string()) {
          return Status::Corruption(prefix + "__metadata__ '" + key + "' is " + value.dump() +
                                    ", expected a string");
        }
        out.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    KILN_ASSIGN_OR_RETURN(Entry e, ParseEntry(name, info, region_size, prefix));
    entries.push_back(std::move(e));
  }
  std::vector<const Entry*> by_offset;
  for (const Entry& e : entries) {
    if (e.end > e.begin) by_offset.push_back(&e);  // an empty range overlaps nothing
  }
  std::sort(by_offset.begin(), by_offset.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const Entry& a = *by_offset[i - 1];
    const Entry& b = *by_offset[i];
    if (b.begin < a.end) {
      return Status::Corruption(prefix + "tensor '" + b.name + "' data_offsets [" +
                                std::to_string(b.begin) + "," + std::to_string(b.end) +
                                "] overlap tensor '" + a.name + "' [" + std::to_string(a.begin) +
                                "," + std::to_string(a.end) + "]");
    }
  }

  // 4. Tensors: views into the buffer, or aligned copies where the bytes are misaligned.
  for (Entry& e : entries) {
    const uint8_t* bytes = region + e.begin;
    const size_t nbytes = static_cast<size_t>(e.end - e.begin);
    if (e.dtype == DType::kBool) {
      for (size_t i = 0; i < nbytes; ++i) {
        if (bytes[i] > 1) {
          return Status::Corruption(prefix + "tensor '" + e.name + "': bool element " +
                                    std::to_string(i) + " is byte " + std::to_string(bytes[i]) +
                                    ", expected 0 or 1");
        }
      }
    }
    Tensor t;
    if (reinterpret_cast<uintptr_t>(bytes) % DTypeSize(e.dtype) == 0) {
      t = Tensor::View(e.dtype, std::move(e.shape), owner, bytes);
    } else {
      Result<Tensor> copy = Tensor::FromBytes(e.dtype, std::move(e.shape), bytes, nbytes);
      if (!copy.ok()) return copy.status().WithContext(prefix + "tensor '" + e.name + "'");
      t = std::move(copy).value();
    }
    out.tensors.emplace(e.name, std::move(t));
  }
  return out;
}

Result<SafetensorsFile> ReadSafetensors(const std::string& path) {
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<MappedFile> file, MappedFile::Open(path));
  const uint8_t* data = file->data();
  const size_t size = file->size();
  return ParseSafetensors(std::move(file), data, size, path);
}

Result<std::string> SerializeSafetensors(const std::map<std::string, Tensor>& tensors,
                                         const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {  // std::map: sorted-name order
    if (name == kMetadataKey) {
      return Status::InvalidArgument("safetensors: a tensor may not be named '__metadata__'");
    }
    if (!t.valid()) {
      return Status::InvalidArgument("safetensors: tensor '" + name + "' is empty/invalid");
    }
    if (!t.is_tensor() || t.dtype() == DType::kString) {
      return Status::InvalidArgument("safetensors: '" + name + "' is " + t.TypeString() +
                                     "; the format holds tensors of fixed-size elements only");
    }
    header[name] = {{"dtype", TokenOf(t.dtype())},
                    {"shape", t.shape()},
                    {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  Result<std::string> text = CanonicalJson(header);
  if (!text.ok()) return text.status().WithContext("safetensors header");
  std::string json = std::move(text).value();
  json.append((8 - json.size() % 8) % 8, ' ');  // so the data region starts 8-aligned

  std::string out;
  out.reserve(8 + json.size() + offset);
  const uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out += static_cast<char>((n >> (8 * i)) & 0xff);
  out += json;
  for (const auto& [name, t] : tensors) {
    if (t.nbytes() > 0) out.append(static_cast<const char*>(t.raw_data()), t.nbytes());
  }
  return out;
}

Status WriteSafetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  Result<std::string> bytes = SerializeSafetensors(tensors, metadata);
  if (!bytes.ok()) return bytes.status().WithContext("cannot write '" + path + "'");
  return WriteFileAtomic(path, *bytes);
}

}  // namespace kiln
