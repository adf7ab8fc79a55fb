// NumPy .npy reading and writing (tensor layer); see npy.h for what is accepted.
//
// File layout: "\x93NUMPY", major, minor, header length (u16 LE for 1.0, u32 LE for 2.0/3.0),
// then a Python dict literal such as {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
// padded with spaces and a newline, then the raw element bytes.
#include "src/kiln/tensor/npy.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <vector>

#include "src/kiln/base/file.h"
#include "src/kiln/base/utf8.h"

namespace kiln {

static_assert(std::endian::native == std::endian::little,
              ".npy and kiln tensors are little-endian; a big-endian host needs byte swapping");

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;
// Deep enough for any header numpy writes; stops a hostile "((((((..." from recursing far.
constexpr int kMaxNesting = 8;
// numpy leaves room for the first dim to grow in place (GROWTH_AXIS_MAX_DIGITS).
constexpr size_t kGrowthAxisMaxDigits = 21;
constexpr size_t kHeaderAlign = 64;

struct PyEntry;

// A value of the Python literal subset .npy headers use.
struct PyValue {
  enum class Kind { kString, kBool, kNone, kInt, kTuple, kList, kDict };
  Kind kind = Kind::kNone;
  std::string str;
  bool boolean = false;
  int64_t integer = 0;
  std::vector<PyValue> items;  // tuple / list
  // Dict entries, in file order. A named struct, not std::pair<std::string, PyValue>: clang
  // rejects a pair of the still-incomplete PyValue as the element of a member vector.
  std::vector<PyEntry> entries;
};

struct PyEntry {
  std::string key;
  PyValue value;
};

const char* KindName(PyValue::Kind k) {
  switch (k) {
    case PyValue::Kind::kString:
      return "a string";
    case PyValue::Kind::kBool:
      return "a bool";
    case PyValue::Kind::kNone:
      return "None";
    case PyValue::Kind::kInt:
      return "an integer";
    case PyValue::Kind::kTuple:
      return "a tuple";
    case PyValue::Kind::kList:
      return "a list";
    case PyValue::Kind::kDict:
      return "a dict";
  }
  return "?";
}

// A careful recursive-descent parser for the header dict: bounds-checked at every step, errors
// as strings naming the header offset.
class HeaderParser {
 public:
  explicit HeaderParser(std::string_view text) : s_(text) {}

  // Parses the whole header: one dict, then only whitespace.
  std::optional<PyValue> ParseHeader(std::string* error) {
    SkipSpace();
    std::optional<PyValue> v = ParseValue(0, error);
    if (!v) return std::nullopt;
    if (v->kind != PyValue::Kind::kDict) {
      *error = std::string("header is ") + KindName(v->kind) + ", expected a dict";
      return std::nullopt;
    }
    SkipSpace();
    if (pos_ != s_.size()) {
      *error = Here("unexpected text after the header dict");
      return std::nullopt;
    }
    return v;
  }

 private:
  std::string Here(const std::string& msg) const {
    return msg + " at header offset " + std::to_string(pos_);
  }
  bool AtEnd() const { return pos_ >= s_.size(); }
  char Peek() const { return AtEnd() ? '\0' : s_[pos_]; }
  void SkipSpace() {
    while (!AtEnd() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) {
      ++pos_;
    }
  }
  bool Consume(std::string_view word) {
    if (s_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  std::optional<PyValue> ParseValue(int depth, std::string* error) {
    if (depth > kMaxNesting) {
      *error = Here("header nests deeper than " + std::to_string(kMaxNesting) + " levels");
      return std::nullopt;
    }
    SkipSpace();
    if (AtEnd()) {
      *error = Here("header ends where a value was expected");
      return std::nullopt;
    }
    const char c = Peek();
    PyValue v;
    if (c == '\'' || c == '"') {
      v.kind = PyValue::Kind::kString;
      ++pos_;
      while (!AtEnd() && s_[pos_] != c) {
        if (s_[pos_] == '\\') {
          *error = Here("escape sequences in header strings are not supported");
          return std::nullopt;
        }
        v.str += s_[pos_++];
      }
      if (AtEnd()) {
        *error = Here("unterminated string in header");
        return std::nullopt;
      }
      ++pos_;  // closing quote
      return v;
    }
    if (c == '-' || (c >= '0' && c <= '9')) return ParseInt(error);
    if (Consume("True")) {
      v.kind = PyValue::Kind::kBool;
      v.boolean = true;
      return v;
    }
    if (Consume("False")) {
      v.kind = PyValue::Kind::kBool;
      return v;
    }
    if (Consume("None")) return v;
    if (c == '(' || c == '[') {
      v.kind = c == '(' ? PyValue::Kind::kTuple : PyValue::Kind::kList;
      const char close = c == '(' ? ')' : ']';
      ++pos_;
      bool last_had_comma = false;
      while (true) {
        SkipSpace();
        if (Peek() == close) {
          ++pos_;
          // "(5)" is a parenthesized 5 in Python, not a tuple; "(5,)" is the tuple.
          if (v.kind == PyValue::Kind::kTuple && v.items.size() == 1 && !last_had_comma) {
            PyValue inner = std::move(v.items[0]);
            return inner;
          }
          return v;
        }
        std::optional<PyValue> item = ParseValue(depth + 1, error);
        if (!item) return std::nullopt;
        v.items.push_back(std::move(*item));
        SkipSpace();
        last_had_comma = Peek() == ',';
        if (last_had_comma) {
          ++pos_;
        } else if (Peek() != close) {
          *error = Here(std::string("expected ',' or '") + close + "' in a sequence");
          return std::nullopt;
        }
      }
    }
    if (c == '{') {
      v.kind = PyValue::Kind::kDict;
      ++pos_;
      while (true) {
        SkipSpace();
        if (Peek() == '}') {
          ++pos_;
          return v;
        }
        std::optional<PyValue> key = ParseValue(depth + 1, error);
        if (!key) return std::nullopt;
        if (key->kind != PyValue::Kind::kString) {
          *error = Here(std::string("header dict key is ") + KindName(key->kind) +
                        ", expected a string");
          return std::nullopt;
        }
        SkipSpace();
        if (Peek() != ':') {
          *error = Here("expected ':' after key '" + key->str + "'");
          return std::nullopt;
        }
        ++pos_;
        std::optional<PyValue> value = ParseValue(depth + 1, error);
        if (!value) return std::nullopt;
        for (const auto& [k, unused] : v.entries) {
          if (k == key->str) {
            *error = Here("duplicate header key '" + k + "'");
            return std::nullopt;
          }
        }
        v.entries.push_back(PyEntry{key->str, std::move(*value)});
        SkipSpace();
        if (Peek() == ',') {
          ++pos_;
        } else if (Peek() != '}') {
          *error = Here("expected ',' or '}' in the header dict");
          return std::nullopt;
        }
      }
    }
    *error = Here(std::string("unexpected character '") + c + "'");
    return std::nullopt;
  }

  std::optional<PyValue> ParseInt(std::string* error) {
    PyValue v;
    v.kind = PyValue::Kind::kInt;
    bool negative = false;
    if (Peek() == '-') {
      negative = true;
      ++pos_;
    }
    if (AtEnd() || s_[pos_] < '0' || s_[pos_] > '9') {
      *error = Here("expected digits");
      return std::nullopt;
    }
    uint64_t magnitude = 0;
    while (!AtEnd() && s_[pos_] >= '0' && s_[pos_] <= '9') {
      const uint64_t digit = static_cast<uint64_t>(s_[pos_] - '0');
      if (magnitude > (static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) - digit) / 10) {
        *error = Here("integer does not fit in 64 bits");
        return std::nullopt;
      }
      magnitude = magnitude * 10 + digit;
      ++pos_;
    }
    if (Peek() == 'L') ++pos_;  // Python 2 long literal, as old numpy wrote shapes ("(3L, 4L)")
    v.integer = negative ? -static_cast<int64_t>(magnitude) : static_cast<int64_t>(magnitude);
    return v;
  }

  std::string_view s_;
  size_t pos_ = 0;
};

struct DescrEntry {
  char kind;
  char size;
  DType dtype;
  const char* write_descr;
};
constexpr DescrEntry kDescrs[] = {
    {'f', '4', DType::kFloat32, "<f4"},
    {'f', '2', DType::kFloat16, "<f2"},
    {'i', '8', DType::kInt64, "<i8"},
    {'i', '4', DType::kInt32, "<i4"},
    {'i', '1', DType::kInt8, "|i1"},
    {'u', '1', DType::kUInt8, "|u1"},
    {'b', '1', DType::kBool, "|b1"},
    {'f', '8', DType::kFloat64, "<f8"},
    {'i', '2', DType::kInt16, "<i2"},
    {'u', '2', DType::kUInt16, "<u2"},
    {'u', '4', DType::kUInt32, "<u4"},
    {'u', '8', DType::kUInt64, "<u8"},
    // numpy has no bfloat16: arrays of ml_dtypes' bfloat16 save as two-byte voids.
    {'V', '2', DType::kBFloat16, "<V2"},
};
// Every DType but string, whose descr carries its width ('<U5': UTF-32, five code points).
static_assert(sizeof(kDescrs) / sizeof(kDescrs[0]) == kDTypeCount - 1, "one descr per DType");

// The width in code points of a numpy unicode descr ('<U5', '|U0'), or -1 when `descr` is not one.
int64_t UnicodeWidth(const std::string& descr) {
  if (descr.size() < 3 || descr[1] != 'U' ||
      (descr[0] != '<' && descr[0] != '|' && descr[0] != '=')) {
    return -1;
  }
  int64_t n = 0;
  for (size_t i = 2; i < descr.size(); ++i) {
    if (descr[i] < '0' || descr[i] > '9' || n > (int64_t{1} << 40)) return -1;
    n = n * 10 + (descr[i] - '0');
  }
  return n;
}

void AppendUtf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

// The code points of `s` read as UTF-8; a byte that does not start a well-formed sequence stands
// for itself (so any bytes survive a write, as Latin-1).
std::vector<uint32_t> CodePoints(const std::string& s) {
  std::vector<uint32_t> cps;
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    const size_t len = b < 0x80         ? 1
                       : (b >> 5) == 6  ? 2
                       : (b >> 4) == 14 ? 3
                       : (b >> 3) == 30 ? 4
                                        : 0;
    if (len > 1 && i + len <= s.size() && IsValidUtf8(std::string_view(s).substr(i, len))) {
      uint32_t cp = b & (0xff >> (len + 1));
      for (size_t k = 1; k < len; ++k)
        cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
      cps.push_back(cp);
      i += len;
    } else {
      cps.push_back(b);
      ++i;
    }
  }
  return cps;
}

Result<DType> DTypeFromDescr(const std::string& descr, const std::string& prefix) {
  if (descr.size() == 3) {
    const char order = descr[0];
    for (const DescrEntry& e : kDescrs) {
      if (descr[1] != e.kind || descr[2] != e.size) continue;
      if (order == '>' && e.size != '1') {
        return Status::Unimplemented(prefix + "dtype '" + descr +
                                     "' is big-endian; kiln reads little-endian data only");
      }
      if (order == '<' || order == '|' || order == '=' || order == '>') return e.dtype;
    }
  }
  return Status::Unimplemented(
      prefix + "dtype '" + descr +
      "' is not supported (expected one of <f4 <f2 <i8 <i4 |i1 |u1 |b1 <f8 <i2 <u2 <u4 <u8 <V2)");
}

const char* DescrOf(DType t) {
  for (const DescrEntry& e : kDescrs) {
    if (e.dtype == t) return e.write_descr;
  }
  KILN_CHECK(false);
  return "";
}

uint32_t ReadLE(const uint8_t* p, int nbytes) {
  uint32_t v = 0;
  for (int i = nbytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

Result<Tensor> ParseNpy(std::string_view bytes, const std::string& what) {
  const std::string prefix = "npy '" + what + "': ";
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  const size_t size = bytes.size();

  // 1. Magic, version, header length.
  if (size < kMagicLen + 2 || std::memcmp(p, kMagic, kMagicLen) != 0) {
    return Status::Corruption(prefix + "does not start with the .npy magic \"\\x93NUMPY\" (" +
                              std::to_string(size) + " bytes)");
  }
  const int major = p[6];
  const int minor = p[7];
  int len_bytes = 0;
  if (major == 1 && minor == 0) {
    len_bytes = 2;
  } else if ((major == 2 || major == 3) && minor == 0) {
    len_bytes = 4;
  } else {
    return Status::Unimplemented(prefix + "format version " + std::to_string(major) + "." +
                                 std::to_string(minor) +
                                 " is not supported (expected 1.0, 2.0 or 3.0)");
  }
  const size_t prelude = kMagicLen + 2 + static_cast<size_t>(len_bytes);
  if (size < prelude) {
    return Status::Corruption(prefix + "truncated: " + std::to_string(size) +
                              " bytes, too short for the header length field");
  }
  const size_t header_len = ReadLE(p + kMagicLen + 2, len_bytes);
  if (header_len > size - prelude) {
    return Status::Corruption(prefix + "header length " + std::to_string(header_len) +
                              " runs past the end of the file (" + std::to_string(size - prelude) +
                              " bytes after the prelude)");
  }

  // 2. The header dict: exactly descr, fortran_order and shape, as numpy requires.
  std::string error;
  HeaderParser parser(bytes.substr(prelude, header_len));
  std::optional<PyValue> header = parser.ParseHeader(&error);
  if (!header) return Status::Corruption(prefix + "malformed header: " + error);
  const PyValue* descr = nullptr;
  const PyValue* fortran = nullptr;
  const PyValue* shape_value = nullptr;
  for (const auto& [key, value] : header->entries) {
    if (key == "descr") {
      descr = &value;
    } else if (key == "fortran_order") {
      fortran = &value;
    } else if (key == "shape") {
      shape_value = &value;
    } else {
      return Status::Corruption(prefix + "unexpected header key '" + key +
                                "' (expected descr, fortran_order, shape)");
    }
  }
  if (!descr || !fortran || !shape_value) {
    return Status::Corruption(prefix + "header lacks " +
                              (!descr     ? "'descr'"
                               : !fortran ? "'fortran_order'"
                                          : "'shape'"));
  }
  if (descr->kind != PyValue::Kind::kString) {
    if (descr->kind == PyValue::Kind::kList) {
      return Status::Unimplemented(prefix + "structured dtypes are not supported");
    }
    return Status::Corruption(prefix + "'descr' is " + KindName(descr->kind) +
                              ", expected a string");
  }
  const int64_t unicode_width = UnicodeWidth(descr->str);
  DType dtype = DType::kString;
  if (unicode_width < 0) {
    KILN_ASSIGN_OR_RETURN(dtype, DTypeFromDescr(descr->str, prefix));
  }
  if (fortran->kind != PyValue::Kind::kBool) {
    return Status::Corruption(prefix + "'fortran_order' is " + KindName(fortran->kind) +
                              ", expected True or False");
  }
  if (shape_value->kind != PyValue::Kind::kTuple) {
    return Status::Corruption(prefix + "'shape' is " + KindName(shape_value->kind) +
                              ", expected a tuple of integers");
  }
  Shape shape;
  const size_t elem_size =
      unicode_width >= 0 ? static_cast<size_t>(unicode_width) * 4 : DTypeSize(dtype);
  uint64_t numel = 1;
  bool overflow = false;
  for (const PyValue& d : shape_value->items) {
    if (d.kind != PyValue::Kind::kInt || d.integer < 0) {
      return Status::Corruption(prefix + "'shape' has " +
                                (d.kind == PyValue::Kind::kInt
                                     ? "the negative dim " + std::to_string(d.integer)
                                     : std::string(KindName(d.kind))) +
                                ", expected non-negative integers");
    }
    shape.push_back(d.integer);
    // Every partial product must fit int64, not only the total: NumElements multiplies the dims in
    // this order in int64, so (2^62, 3, 0) would overflow there although it holds no element.
    overflow = overflow ||
               __builtin_mul_overflow(numel, static_cast<uint64_t>(d.integer), &numel) ||
               numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  }
  uint64_t data_bytes = 0;
  overflow = overflow || __builtin_mul_overflow(numel, elem_size, &data_bytes) ||
             numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  if (fortran->boolean && shape.size() > 1) {
    // For rank <= 1 Fortran and C order are the same bytes.
    return Status::Unimplemented(prefix +
                                 "fortran_order=True arrays are not supported; save a "
                                 "C-contiguous array (np.ascontiguousarray)");
  }

  // 3. The data: exactly numel * element size bytes.
  const size_t available = size - prelude - header_len;
  if (overflow || data_bytes != available) {
    return Status::Corruption(
        prefix + std::string(DTypeName(dtype)) + ShapeToString(shape) + " needs " +
        (overflow ? std::string("more than 2^64") : std::to_string(data_bytes)) +
        " data bytes, file has " + std::to_string(available) +
        (overflow || data_bytes > available ? " (truncated)" : " (trailing bytes)"));
  }
  const uint8_t* data = p + prelude + header_len;
  if (dtype == DType::kBool) {
    for (size_t i = 0; i < available; ++i) {
      if (data[i] > 1) {
        return Status::Corruption(prefix + "bool element " + std::to_string(i) + " is byte " +
                                  std::to_string(data[i]) + ", expected 0 or 1");
      }
    }
  }
  if (dtype == DType::kString) {
    // UTF-32LE code points, NUL-padded to the width (numpy strips trailing NULs on read).
    KILN_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(DType::kString, std::move(shape)));
    for (int64_t i = 0; i < t.numel(); ++i) {
      std::string s;
      const uint8_t* e = data + static_cast<size_t>(i) * elem_size;
      size_t used = static_cast<size_t>(unicode_width);
      while (used > 0 && ReadLE(e + (used - 1) * 4, 4) == 0) --used;
      for (size_t k = 0; k < used; ++k) {
        const uint32_t cp = ReadLE(e + k * 4, 4);
        if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
          return Status::Corruption(prefix + "string element " + std::to_string(i) +
                                    " holds code point " + std::to_string(cp) +
                                    ", which is not a Unicode scalar value");
        }
        AppendUtf8(cp, s);
      }
      t.str(i) = std::move(s);
    }
    return t;
  }
  return Tensor::FromBytes(dtype, std::move(shape), data, available);
}

Result<Tensor> ReadNpy(const std::string& path) {
  KILN_ASSIGN_OR_RETURN(std::string bytes, ReadFile(path));
  return ParseNpy(bytes, path);
}

std::string SerializeNpy(const Tensor& tensor) {
  KILN_CHECK(tensor.valid() && tensor.is_tensor());
  std::string shape = "(";
  for (size_t i = 0; i < tensor.shape().size(); ++i) {
    if (i) shape += ", ";
    shape += std::to_string(tensor.shape()[i]);
  }
  if (tensor.shape().size() == 1) shape += ",";
  shape += ")";
  // Strings: UTF-32LE code points, each element NUL-padded to the longest (at least one).
  std::vector<std::vector<uint32_t>> text;
  size_t width = 1;
  if (tensor.dtype() == DType::kString) {
    for (int64_t i = 0; i < tensor.numel(); ++i) {
      text.push_back(CodePoints(tensor.str(i)));
      width = std::max(width, text.back().size());
    }
  }
  const std::string descr =
      tensor.dtype() == DType::kString ? "<U" + std::to_string(width) : DescrOf(tensor.dtype());
  std::string header =
      std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  // Same bytes as np.save: growth room for the first dim, then pad so the data starts 64-aligned
  // (a full 64 spaces when already aligned, as numpy does), ending in a newline.
  if (!tensor.shape().empty()) {
    const size_t digits = std::to_string(tensor.shape()[0]).size();
    if (digits < kGrowthAxisMaxDigits) header.append(kGrowthAxisMaxDigits - digits, ' ');
  }
  int len_bytes = 2;
  size_t pad = kHeaderAlign - ((kMagicLen + 2 + 2 + header.size() + 1) % kHeaderAlign);
  if (header.size() + pad + 1 > 0xffff) {
    len_bytes = 4;
    pad = kHeaderAlign - ((kMagicLen + 2 + 4 + header.size() + 1) % kHeaderAlign);
  }
  header.append(pad, ' ');
  header += '\n';

  std::string out(kMagic, kMagicLen);
  out += static_cast<char>(len_bytes == 2 ? 1 : 2);
  out += '\0';
  const uint32_t hlen = static_cast<uint32_t>(header.size());
  for (int i = 0; i < len_bytes; ++i) out += static_cast<char>((hlen >> (8 * i)) & 0xff);
  out += header;
  if (tensor.dtype() == DType::kString) {
    for (const std::vector<uint32_t>& cps : text) {
      for (size_t k = 0; k < width; ++k) {
        const uint32_t cp = k < cps.size() ? cps[k] : 0;
        for (int b = 0; b < 4; ++b) out += static_cast<char>((cp >> (8 * b)) & 0xff);
      }
    }
    return out;
  }
  if (tensor.nbytes() > 0) {
    out.append(static_cast<const char*>(tensor.raw_data()), tensor.nbytes());
  }
  return out;
}

Status WriteNpy(const std::string& path, const Tensor& tensor) {
  if (!tensor.valid()) {
    return Status::InvalidArgument("cannot write npy '" + path + "': the tensor is empty/invalid");
  }
  if (!tensor.is_tensor()) {
    return Status::InvalidArgument("cannot write npy '" + path + "': " + tensor.TypeString() +
                                   " is not a tensor");
  }
  return WriteFileAtomic(path, SerializeNpy(tensor));
}

namespace {

Result<Tensor> ReadSequenceDir(const std::string& path, DType elem) {
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) {
    return Status::InvalidArgument("'" + path +
                                   "' is not a directory (a sequence is a directory of 0.npy, "
                                   "1.npy, ...)");
  }
  std::map<int64_t, std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(path, ec)) {
    const std::string name = entry.path().filename().string();
    const size_t dot = name.find('.');
    const std::string stem = name.substr(0, dot);
    if (dot == std::string::npos || name.substr(dot) != ".npy" || stem.empty() ||
        stem.find_first_not_of("0123456789") != std::string::npos || stem.size() > 9) {
      return Status::InvalidArgument("sequence directory '" + path + "' holds '" + name +
                                     "'; expected only 0.npy, 1.npy, ...");
    }
    files[std::stoll(stem)] = entry.path().string();
  }
  if (ec) return Status::IOError("cannot list '" + path + "': " + ec.message());
  std::vector<Tensor> items;
  for (const auto& [index, file] : files) {
    if (index != static_cast<int64_t>(items.size())) {
      return Status::InvalidArgument("sequence directory '" + path + "' lacks " +
                                     std::to_string(items.size()) + ".npy");
    }
    KILN_ASSIGN_OR_RETURN(Tensor t, ReadNpy(file));
    if (t.dtype() != elem) {
      return Status::InvalidArgument("'" + file + "' is " + t.TypeString() +
                                     ", the sequence holds " + DTypeName(elem));
    }
    items.push_back(std::move(t));
  }
  return Tensor::Sequence(elem, std::move(items));
}

}  // namespace

Result<Tensor> ReadValue(const std::string& path, ValueKind kind, DType elem) {
  switch (kind) {
    case ValueKind::kTensor:
      return ReadNpy(path);
    case ValueKind::kSequence:
      return ReadSequenceDir(path, elem);
    case ValueKind::kOptionalTensor:
    case ValueKind::kOptionalSequence: {
      const ValueKind inner =
          kind == ValueKind::kOptionalSequence ? ValueKind::kSequence : ValueKind::kTensor;
      std::error_code ec;
      const bool is_none_file = path.size() > 5 && path.substr(path.size() - 5) == ".none" &&
                                std::filesystem::is_regular_file(path, ec);
      if (path == kNoneValuePath || is_none_file) return Tensor::Optional(inner, elem, Tensor());
      KILN_ASSIGN_OR_RETURN(Tensor v, ReadValue(path, inner, elem));
      return Tensor::Optional(inner, elem, std::move(v));
    }
  }
  return Status::Internal("ReadValue: unknown value kind");
}

Result<std::string> WriteValue(const std::string& dir, const std::string& name,
                               const Tensor& value) {
  switch (value.kind()) {
    case ValueKind::kTensor: {
      const std::string path = dir + "/" + name + ".npy";
      KILN_RETURN_IF_ERROR(WriteNpy(path, value));
      return path;
    }
    case ValueKind::kSequence: {
      const std::string path = dir + "/" + name;
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
      KILN_RETURN_IF_ERROR(MakeDirs(path));
      for (size_t i = 0; i < value.items().size(); ++i) {
        KILN_RETURN_IF_ERROR(WriteNpy(path + "/" + std::to_string(i) + ".npy", value.items()[i]));
      }
      return path;
    }
    case ValueKind::kOptionalTensor:
    case ValueKind::kOptionalSequence: {
      if (!value.items().empty()) return WriteValue(dir, name, value.items()[0]);
      const std::string path = dir + "/" + name + ".none";
      KILN_RETURN_IF_ERROR(WriteFileAtomic(path, ""));
      return path;
    }
  }
  return Status::Internal("WriteValue: unknown value kind");
}

}  // namespace kiln
