// KServe v2 codec (worker layer): request bodies in through one streaming reader, response bodies
// out. See kserve.h. nlohmann parse errors are caught here and become InvalidArgument; nothing
// else in this file throws.
#include "src/kiln/worker/kserve.h"

#include <algorithm>
#include <cfloat>
#include <charconv>
#include <cmath>
#include <cstring>
#include <functional>
#include <istream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <streambuf>
#include <utility>

#include "src/kiln/graph/input_check.h"

namespace kiln {
namespace {

using nlohmann::json;

std::string Quote(const std::string& s) { return "'" + s + "'"; }

// A JSON value as short text for messages.
std::string Show(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return s;
}

// Reads a non-negative integer (a JSON unsigned or a non-negative signed integer).
bool AsCount(const json& v, uint64_t* out) {
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
    return true;
  }
  if (v.is_number_integer() && v.get<int64_t>() >= 0) {
    *out = static_cast<uint64_t>(v.get<int64_t>());
    return true;
  }
  return false;
}

// Reads an integer within [lo, hi].
bool AsInt(const json& v, int64_t lo, int64_t hi, int64_t* out) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(hi)) return false;
    *out = static_cast<int64_t>(u);
    return true;
  }
  if (v.is_number_integer()) {
    const int64_t i = v.get<int64_t>();
    if (i < lo || i > hi) return false;
    *out = i;
    return true;
  }
  return false;
}

// Writes JSON scalar `v` as element `i` of `t`; `where()` names it for messages and is called
// only on a refusal (a streamed request stores millions of elements).
template <typename WhereFn>
Status StoreElementAt(const json& v, Tensor& t, int64_t i, const WhereFn& where) {
  const DType dt = t.dtype();
  auto bad = [&](const std::string& expect) {
    return Status::InvalidArgument(where() + " is " + Show(v) + "; " + KServeDatatype(dt) +
                                   " expects " + expect);
  };
  switch (dt) {
    case DType::kFloat64:
      if (!v.is_number()) return bad("a number");
      t.data<double>()[i] = v.get<double>();
      return Status::OK();
    case DType::kFloat32:
    case DType::kFloat16:
    case DType::kBFloat16: {
      if (!v.is_number()) return bad("a number");
      const double d = v.get<double>();
      const double limit = dt == DType::kFloat16 ? 65504.0 : FLT_MAX;
      if (!(d >= -limit && d <= limit)) return bad("a number within its range");
      if (dt == DType::kFloat32) {
        t.data<float>()[i] = static_cast<float>(d);
      } else if (dt == DType::kFloat16) {
        t.data<uint16_t>()[i] = FloatToHalf(static_cast<float>(d));
      } else {
        t.data<uint16_t>()[i] = FloatToBFloat16(static_cast<float>(d));
      }
      return Status::OK();
    }
    case DType::kUInt64: {
      if (!v.is_number_integer()) return bad("an integer");
      if (v.is_number_unsigned()) {
        t.data<uint64_t>()[i] = v.get<uint64_t>();
      } else if (v.get<int64_t>() >= 0) {
        t.data<uint64_t>()[i] = static_cast<uint64_t>(v.get<int64_t>());
      } else {
        return bad("an integer in [0, 18446744073709551615]");
      }
      return Status::OK();
    }
    case DType::kInt64:
    case DType::kInt32:
    case DType::kInt16:
    case DType::kInt8:
    case DType::kUInt32:
    case DType::kUInt16:
    case DType::kUInt8: {
      int64_t lo = std::numeric_limits<int64_t>::min(), hi = std::numeric_limits<int64_t>::max();
      if (dt == DType::kInt32) lo = INT32_MIN, hi = INT32_MAX;
      if (dt == DType::kInt16) lo = INT16_MIN, hi = INT16_MAX;
      if (dt == DType::kInt8) lo = INT8_MIN, hi = INT8_MAX;
      if (dt == DType::kUInt32) lo = 0, hi = UINT32_MAX;
      if (dt == DType::kUInt16) lo = 0, hi = UINT16_MAX;
      if (dt == DType::kUInt8) lo = 0, hi = UINT8_MAX;
      int64_t x = 0;
      if (!v.is_number_integer()) return bad("an integer");
      if (!AsInt(v, lo, hi, &x)) {
        return bad("an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
      }
      if (dt == DType::kInt64) t.data<int64_t>()[i] = x;
      if (dt == DType::kInt32) t.data<int32_t>()[i] = static_cast<int32_t>(x);
      if (dt == DType::kInt16) t.data<int16_t>()[i] = static_cast<int16_t>(x);
      if (dt == DType::kInt8) t.data<int8_t>()[i] = static_cast<int8_t>(x);
      if (dt == DType::kUInt32) t.data<uint32_t>()[i] = static_cast<uint32_t>(x);
      if (dt == DType::kUInt16) t.data<uint16_t>()[i] = static_cast<uint16_t>(x);
      if (dt == DType::kUInt8) t.data<uint8_t>()[i] = static_cast<uint8_t>(x);
      return Status::OK();
    }
    case DType::kBool:
      if (!v.is_boolean()) return bad("true or false");
      t.data<uint8_t>()[i] = v.get<bool>() ? 1 : 0;
      return Status::OK();
    case DType::kString:
      if (!v.is_string()) return bad("a string");
      t.str(i) = v.get<std::string>();
      return Status::OK();
  }
  return Status::InvalidArgument(where() + ": unsupported dtype");
}

}  // namespace

nlohmann::json KServeJsonData(const Tensor& t) {
  json data = json::array();
  const int64_t n = t.numel();
  auto& arr = data.get_ref<json::array_t&>();
  arr.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    switch (t.dtype()) {
      case DType::kFloat32:
        arr.emplace_back(static_cast<double>(t.data<float>()[i]));
        break;
      case DType::kFloat16:
        arr.emplace_back(static_cast<double>(HalfToFloat(t.data<uint16_t>()[i])));
        break;
      case DType::kBFloat16:
        arr.emplace_back(static_cast<double>(BFloat16ToFloat(t.data<uint16_t>()[i])));
        break;
      case DType::kString:
        arr.emplace_back(t.str(i));
        break;
      case DType::kFloat64:
        arr.emplace_back(t.data<double>()[i]);
        break;
      case DType::kBool:
        arr.emplace_back(t.data<uint8_t>()[i] != 0);
        break;
      case DType::kUInt64:
        arr.emplace_back(t.data<uint64_t>()[i]);
        break;
      default:
        arr.emplace_back(t.GetAsInt64(i));
        break;
    }
  }
  return data;
}

namespace {

std::string JsonText(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace

const char* KServeDatatype(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "FP32";
    case DType::kFloat16:
      return "FP16";
    case DType::kInt64:
      return "INT64";
    case DType::kInt32:
      return "INT32";
    case DType::kInt8:
      return "INT8";
    case DType::kUInt8:
      return "UINT8";
    case DType::kBool:
      return "BOOL";
    case DType::kFloat64:
      return "FP64";
    case DType::kInt16:
      return "INT16";
    case DType::kUInt16:
      return "UINT16";
    case DType::kUInt32:
      return "UINT32";
    case DType::kUInt64:
      return "UINT64";
    case DType::kBFloat16:
      return "BF16";
    case DType::kString:
      return "BYTES";
  }
  return "?";
}

Result<DType> DTypeFromKServe(const std::string& datatype) {
  for (DType t : {DType::kFloat32, DType::kFloat16, DType::kInt64, DType::kInt32, DType::kInt8,
                  DType::kUInt8, DType::kBool, DType::kFloat64, DType::kInt16, DType::kUInt16,
                  DType::kUInt32, DType::kUInt64, DType::kBFloat16}) {
    if (datatype == KServeDatatype(t)) return t;
  }
  std::string shown = datatype.size() > 40 ? datatype.substr(0, 37) + "..." : datatype;
  return Status::InvalidArgument("datatype \"" + shown +
                                 "\" is not supported; expected one of FP32, FP16, INT64, INT32, "
                                 "INT8, UINT8, BOOL, FP64, INT16, UINT16, UINT32, UINT64, BF16");
}

Result<size_t> ParseInferenceHeaderLength(const std::string& value, size_t body_size) {
  const std::string what = std::string(kInferenceHeaderContentLength);
  if (value.empty() || value.size() > 19 ||
      value.find_first_not_of("0123456789") != std::string::npos) {
    return Status::InvalidArgument(what + " is \"" + value.substr(0, 40) +
                                   "\"; expected a decimal byte count");
  }
  const uint64_t n = std::stoull(value);
  if (n > body_size) {
    return Status::InvalidArgument(what + " is " + value + " but the body has only " +
                                   std::to_string(body_size) + " bytes");
  }
  return static_cast<size_t>(n);
}

// ---------------------------------------------------------------------------------------------
// The streaming request reader.

namespace {

// Sizes past which a JSON token costs more than any real request needs: the lexer holds a token
// whole, so these keep a hostile body from buying memory beyond its length.
constexpr size_t kMaxJsonString = 64 * 1024;
constexpr size_t kMaxJsonScalar = 512;
// Values buffered for a tensor whose "data" comes before its "shape" and "datatype".
constexpr size_t kMaxBufferedData = size_t{1} << 20;
// A small sub-value kept whole (request and tensor parameters, a shape, an output): at most this
// many JSON values and this many bytes of strings and keys.
constexpr size_t kMaxCapturedEvents = 64 * 1024;
constexpr size_t kMaxCapturedBytes = 1 << 20;
// Inputs and requested outputs per request.
constexpr size_t kMaxTensors = 4096;

// Pulls the JSON part of a body for the parser and refuses, as the bytes go by, nesting deeper than
// kKServeMaxJsonDepth and strings or scalars longer than the limits above.
class JsonPartBuf : public std::streambuf {
 public:
  JsonPartBuf(const ByteSource& source, std::optional<uint64_t> limit)
      : source_(source), limit_(limit), buf_(64 * 1024) {}

  // A transport failure or a refusal of the scanner; OK otherwise.
  const Status& failure() const { return failure_; }
  uint64_t consumed() const { return consumed_; }

 protected:
  int_type underflow() override {
    if (gptr() < egptr()) return traits_type::to_int_type(*gptr());
    if (!failure_.ok() || ended_) return traits_type::eof();
    size_t want = buf_.size();
    if (limit_) {
      if (consumed_ >= *limit_) {
        ended_ = true;
        return traits_type::eof();
      }
      want = static_cast<size_t>(std::min<uint64_t>(want, *limit_ - consumed_));
    }
    Result<size_t> n = source_(buf_.data(), want);
    if (!n.ok()) {
      failure_ = n.status();
      return traits_type::eof();
    }
    if (*n == 0) {
      ended_ = true;
      return traits_type::eof();
    }
    if (Status s = Scan(buf_.data(), *n); !s.ok()) {
      failure_ = s;
      return traits_type::eof();
    }
    consumed_ += *n;
    setg(buf_.data(), buf_.data(), buf_.data() + *n);
    return traits_type::to_int_type(*gptr());
  }

 private:
  Status Scan(const char* p, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      const char c = p[i];
      if (in_string_) {
        if (escape_) {
          escape_ = false;
        } else if (c == '\\') {
          escape_ = true;
        } else if (c == '"') {
          in_string_ = false;
          continue;
        }
        if (++run_ > kMaxJsonString) {
          return Status::InvalidArgument("infer request: a JSON string is longer than " +
                                         std::to_string(kMaxJsonString) + " bytes");
        }
        continue;
      }
      if (c == '"') {
        in_string_ = true;
        run_ = 0;
      } else if (c == '[' || c == '{') {
        run_ = 0;
        if (++depth_ > kKServeMaxJsonDepth) {
          return Status::InvalidArgument("infer request: JSON nested deeper than " +
                                         std::to_string(kKServeMaxJsonDepth) + " levels");
        }
      } else if (c == ']' || c == '}') {
        run_ = 0;
        --depth_;
      } else if (c == ',' || c == ':' || c == ' ' || c == '\t' || c == '\r' || c == '\n') {
        run_ = 0;
      } else if (++run_ > kMaxJsonScalar) {
        return Status::InvalidArgument("infer request: a JSON number or literal is longer than " +
                                       std::to_string(kMaxJsonScalar) + " bytes");
      }
    }
    return Status::OK();
  }

  const ByteSource& source_;
  const std::optional<uint64_t> limit_;
  std::vector<char> buf_;
  uint64_t consumed_ = 0;
  bool ended_ = false;
  Status failure_;
  bool in_string_ = false, escape_ = false;
  int depth_ = 0;
  size_t run_ = 0;
};

enum class Ev { kNull, kScalar, kStartObject, kEndObject, kStartArray, kEndArray, kKey };

// What a value is, for messages: the value itself for a scalar.
std::string Describe(Ev ev, const json& scalar) {
  if (ev == Ev::kStartObject) return "an object";
  if (ev == Ev::kStartArray) return "an array";
  return Show(scalar);
}

// A tensor object of "inputs" as it is being read.
struct PendingInput {
  size_t index = 0;
  std::string name;
  std::optional<DType> dtype;
  std::optional<Shape> shape;
  int64_t numel = 0;
  std::set<std::string> keys;
  const json* binary_size = nullptr;  // points into `params`
  json params;
  bool has_params = false;
  bool has_data = false;
  bool data_done = false;
  Tensor tensor;  // allocated once name, dtype and shape are admitted
  bool allocated = false;
  // "data" that came before its shape or datatype, replayed once they are known.
  std::vector<std::pair<Ev, json>> buffered;
};

// A binary input, read after the JSON part.
struct BinaryInput {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t size = 0;
};

// The SAX handler: builds an InferRequest as the JSON goes by, writing each input's elements
// straight into its tensor, which is allocated only after the name, datatype and shape have been
// admitted (see InferReadOptions::admit_input).
class RequestReader {
 public:
  using number_integer_t = json::number_integer_t;
  using number_unsigned_t = json::number_unsigned_t;
  using number_float_t = json::number_float_t;
  using string_t = json::string_t;
  using binary_t = json::binary_t;

  RequestReader(const InferReadOptions& options, uint64_t json_bytes_bound)
      : options_(options), json_bytes_bound_(json_bytes_bound) {
    modes_.push_back(Mode::kTop);
  }

  bool null() { return On(Ev::kNull, json()); }
  bool boolean(bool v) { return On(Ev::kScalar, json(v)); }
  bool number_integer(number_integer_t v) { return On(Ev::kScalar, json(v)); }
  bool number_unsigned(number_unsigned_t v) { return On(Ev::kScalar, json(v)); }
  bool number_float(number_float_t v, const string_t&) { return On(Ev::kScalar, json(v)); }
  bool string(string_t& v) { return On(Ev::kScalar, json(v)); }
  bool binary(binary_t&) { return Fail(Status::InvalidArgument("infer request: binary JSON")); }
  bool start_object(std::size_t) { return On(Ev::kStartObject, json()); }
  bool end_object() { return On(Ev::kEndObject, json()); }
  bool start_array(std::size_t) { return On(Ev::kStartArray, json()); }
  bool end_array() { return On(Ev::kEndArray, json()); }
  bool key(string_t& k) {
    key_ = k;
    return On(Ev::kKey, json());
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
    parse_error_ = std::string("infer request is not valid JSON: ") + e.what();
    return false;
  }

  const Status& error() const { return error_; }
  const std::string& parse_error_text() const { return parse_error_; }
  bool saw_inputs() const { return saw_inputs_; }
  InferRequest& request() { return req_; }
  std::vector<BinaryInput>& binary_inputs() { return binary_; }

 private:
  enum class Mode { kTop, kRoot, kInputs, kTensor, kData, kOutputs, kCapture, kSkip, kDone };

  bool Fail(Status s) {
    if (error_.ok()) error_ = std::move(s);
    return false;
  }
  bool Bad(const std::string& message) { return Fail(Status::InvalidArgument(message)); }

  bool On(Ev ev, json v) {
    switch (modes_.back()) {
      case Mode::kTop:
        if (ev != Ev::kStartObject) {
          return Bad("infer request is " + Describe(ev, v) + "; expected a JSON object");
        }
        modes_.back() = Mode::kDone;
        modes_.push_back(Mode::kRoot);
        return true;
      case Mode::kRoot:
        return OnRoot(ev, std::move(v));
      case Mode::kInputs:
        if (ev == Ev::kEndArray) {
          modes_.pop_back();
          return true;
        }
        if (ev != Ev::kStartObject) {
          return Bad("inputs[" + std::to_string(input_count_) + "] is " + Describe(ev, v) +
                     "; expected an object");
        }
        if (input_count_ >= kMaxTensors) {
          return Bad("infer request has more than " + std::to_string(kMaxTensors) + " inputs");
        }
        cur_ = PendingInput();
        cur_.index = input_count_++;
        modes_.push_back(Mode::kTensor);
        return true;
      case Mode::kTensor:
        return OnTensor(ev, std::move(v));
      case Mode::kData:
        return OnData(ev, std::move(v), /*replay=*/false);
      case Mode::kOutputs:
        if (ev == Ev::kEndArray) {
          modes_.pop_back();
          return true;
        }
        return Capture(ev, std::move(v), [this](json o) { return OnOutput(std::move(o)); });
      case Mode::kCapture:
        return OnCapture(ev, std::move(v));
      case Mode::kSkip:
        if (ev == Ev::kStartObject || ev == Ev::kStartArray) ++skip_depth_;
        if (ev == Ev::kEndObject || ev == Ev::kEndArray) --skip_depth_;
        if (skip_depth_ == 0) modes_.pop_back();
        return true;
      case Mode::kDone:
        return Bad("infer request: text after the JSON object");
    }
    return false;
  }

  // Skips a value the protocol does not define (ignored, as the spec allows extensions).
  bool Skip(Ev ev) {
    if (ev == Ev::kStartObject || ev == Ev::kStartArray) {
      skip_depth_ = 1;
      modes_.push_back(Mode::kSkip);
    }
    return true;
  }

  // Keeps a small value whole, then hands it to `done`.
  bool Capture(Ev ev, json v, std::function<bool(json)> done) {
    captured_ = json();
    dom_ = std::make_unique<nlohmann::detail::json_sax_dom_parser<json>>(captured_, false);
    capture_done_ = std::move(done);
    capture_depth_ = 0;
    capture_events_ = 0;
    capture_bytes_ = 0;
    modes_.push_back(Mode::kCapture);
    return OnCapture(ev, std::move(v));
  }

  bool OnCapture(Ev ev, json v) {
    if (++capture_events_ > kMaxCapturedEvents) {
      return Bad("infer request: a parameters, shape or outputs value holds more than " +
                 std::to_string(kMaxCapturedEvents) + " JSON values");
    }
    if (ev == Ev::kKey) capture_bytes_ += key_.size();
    if (ev == Ev::kScalar && v.is_string())
      capture_bytes_ += v.get_ref<const std::string&>().size();
    if (capture_bytes_ > kMaxCapturedBytes) {
      return Bad("infer request: a parameters, shape or outputs value holds more than " +
                 std::to_string(kMaxCapturedBytes) + " bytes of text");
    }
    bool ok = true;
    switch (ev) {
      case Ev::kNull:
        ok = dom_->null();
        break;
      case Ev::kScalar:
        if (v.is_boolean())
          ok = dom_->boolean(v.get<bool>());
        else if (v.is_number_unsigned())
          ok = dom_->number_unsigned(v.get<uint64_t>());
        else if (v.is_number_integer())
          ok = dom_->number_integer(v.get<int64_t>());
        else if (v.is_number_float())
          ok = dom_->number_float(v.get<double>(), "");
        else {
          std::string s = v.get<std::string>();
          ok = dom_->string(s);
        }
        break;
      case Ev::kStartObject:
        ++capture_depth_;
        ok = dom_->start_object(static_cast<size_t>(-1));
        break;
      case Ev::kEndObject:
        --capture_depth_;
        ok = dom_->end_object();
        break;
      case Ev::kStartArray:
        ++capture_depth_;
        ok = dom_->start_array(static_cast<size_t>(-1));
        break;
      case Ev::kEndArray:
        --capture_depth_;
        ok = dom_->end_array();
        break;
      case Ev::kKey: {
        std::string k = key_;
        ok = dom_->key(k);
        break;
      }
    }
    if (!ok) return Bad("infer request: a value could not be kept");
    if (capture_depth_ > 0) return true;
    modes_.pop_back();
    dom_.reset();
    auto done = std::move(capture_done_);
    return done(std::move(captured_));
  }

  bool OnRoot(Ev ev, json v) {
    if (ev == Ev::kKey) {
      root_key_ = key_;
      if ((root_key_ == "id" || root_key_ == "parameters" || root_key_ == "inputs" ||
           root_key_ == "outputs") &&
          !root_keys_.insert(root_key_).second) {
        return Bad("infer request has \"" + root_key_ + "\" more than once");
      }
      return true;
    }
    if (ev == Ev::kEndObject) {
      modes_.pop_back();
      return true;
    }
    if (root_key_ == "id") {
      if (ev != Ev::kScalar || !v.is_string()) {
        return Bad("infer request \"id\" is " + Describe(ev, v) + "; expected a string");
      }
      req_.id = v.get<std::string>();
      return true;
    }
    if (root_key_ == "parameters") {
      if (ev != Ev::kStartObject) {
        return Bad("infer request \"parameters\" is " + Describe(ev, v) + "; expected an object");
      }
      return Capture(ev, std::move(v), [this](json p) {
        for (const auto& [k, val] : p.items()) req_.parameters[k] = JsonText(val);
        if (auto b = p.find("binary_data_output"); b != p.end()) {
          if (!b->is_boolean()) {
            return Bad("infer request parameters.binary_data_output is " + Show(*b) +
                       "; expected true or false");
          }
          req_.binary_data_output = b->get<bool>();
        }
        return true;
      });
    }
    if (root_key_ == "inputs") {
      if (ev != Ev::kStartArray) return Bad("infer request has no \"inputs\" array");
      saw_inputs_ = true;
      modes_.push_back(Mode::kInputs);
      return true;
    }
    if (root_key_ == "outputs") {
      if (ev != Ev::kStartArray) {
        return Bad("infer request \"outputs\" is " + Describe(ev, v) + "; expected an array");
      }
      modes_.push_back(Mode::kOutputs);
      return true;
    }
    return Skip(ev);
  }

  std::string At() const { return "inputs[" + std::to_string(cur_.index) + "]"; }
  std::string What() const { return cur_.name.empty() ? At() : "input " + Quote(cur_.name); }

  bool OnTensor(Ev ev, json v) {
    if (ev == Ev::kKey) {
      tensor_key_ = key_;
      // Only the protocol's keys are remembered: an object of a million other keys costs nothing.
      const bool known = tensor_key_ == "name" || tensor_key_ == "datatype" ||
                         tensor_key_ == "shape" || tensor_key_ == "parameters" ||
                         tensor_key_ == "data";
      if (known && !cur_.keys.insert(tensor_key_).second) {
        return Bad(What() + " has \"" + tensor_key_ + "\" more than once");
      }
      return true;
    }
    if (ev == Ev::kEndObject) {
      modes_.pop_back();
      return FinishInput();
    }
    const std::string& k = tensor_key_;
    if (k == "name") {
      if (ev != Ev::kScalar || !v.is_string() || v.get<std::string>().empty()) {
        return Bad(At() + " has no \"name\" (a non-empty string)");
      }
      cur_.name = v.get<std::string>();
      return true;
    }
    if (k == "datatype") {
      if (ev != Ev::kScalar || !v.is_string()) {
        return Bad(What() + " has no \"datatype\" (a string such as \"FP32\")");
      }
      auto dt = DTypeFromKServe(v.get<std::string>());
      if (!dt.ok()) return Fail(dt.status().WithContext(What()));
      cur_.dtype = *dt;
      return true;
    }
    if (k == "shape") {
      if (ev != Ev::kStartArray) return Bad(What() + " has no \"shape\" (an array of dims)");
      return Capture(ev, std::move(v), [this](json s) { return OnShape(s); });
    }
    if (k == "parameters") {
      if (ev != Ev::kStartObject) {
        return Bad(What() + ": \"parameters\" is " + Describe(ev, v) + "; expected an object");
      }
      return Capture(ev, std::move(v), [this](json p) {
        cur_.params = std::move(p);
        cur_.has_params = true;
        auto b = cur_.params.find("binary_data_size");
        cur_.binary_size = b == cur_.params.end() ? nullptr : &*b;
        return true;
      });
    }
    if (k == "data") {
      if (ev != Ev::kStartArray) {
        return Bad(What() + ": \"data\" is " + Describe(ev, v) + "; expected an array");
      }
      cur_.has_data = true;
      if (cur_.binary_size != nullptr) {
        return Bad(What() + " has both \"data\" and binary_data_size");
      }
      if (!cur_.name.empty() && cur_.dtype && cur_.shape) {
        if (!Allocate()) return false;
      }
      data_depth_ = 0;
      modes_.push_back(Mode::kData);
      return OnData(ev, std::move(v), false);
    }
    return Skip(ev);
  }

  bool OnShape(const json& s) {
    if (s.size() > static_cast<size_t>(kKServeMaxRank)) {
      return Bad(What() + " has rank " + std::to_string(s.size()) + "; at most " +
                 std::to_string(kKServeMaxRank) + " dims are accepted");
    }
    Shape shape;
    int64_t numel = 1;
    for (size_t d = 0; d < s.size(); ++d) {
      uint64_t dim = 0;
      if (!AsCount(s[d], &dim) || dim > static_cast<uint64_t>(kKServeMaxElements)) {
        return Bad(What() + ": shape[" + std::to_string(d) + "] is " + Show(s[d]) +
                   "; expected an integer dim >= 0");
      }
      shape.push_back(static_cast<int64_t>(dim));
      if (dim != 0 && numel > kKServeMaxElements / static_cast<int64_t>(dim)) {
        return Bad(What() + ": shape " + Show(s) + " has more than " +
                   std::to_string(kKServeMaxElements) + " elements");
      }
      numel *= static_cast<int64_t>(dim);
    }
    cur_.shape = std::move(shape);
    cur_.numel = numel;
    return true;
  }

  // Admits and allocates the current input's tensor (name, dtype and shape known).
  bool Allocate() {
    if (req_.inputs.count(cur_.name)) {
      return Bad("input " + Quote(cur_.name) + " appears more than once in the request");
    }
    if (!cur_.binary_size) {
      // Every JSON element takes at least one byte, so a shape needing more elements than the
      // JSON has bytes cannot be satisfied: refuse before allocating for it.
      if (static_cast<uint64_t>(cur_.numel) > json_bytes_bound_) {
        return Bad(What() + ": shape " + ShapeToString(*cur_.shape) + " needs " +
                   std::to_string(cur_.numel) + " data elements; the request holds fewer");
      }
    }
    if (options_.admit_input) {
      if (Status s = options_.admit_input(cur_.name, *cur_.dtype, *cur_.shape); !s.ok()) {
        return Fail(std::move(s));
      }
    }
    auto t = Tensor::Empty(*cur_.dtype, *cur_.shape);
    if (!t.ok()) return Fail(t.status().WithContext(What()));
    cur_.tensor = std::move(t).value();
    cur_.allocated = true;
    next_ = 0;
    flat_count_ = 0;
    decided_ = false;
    nested_ = false;
    counts_.clear();
    path_.clear();
    return true;
  }

  std::string Where() const {
    std::string w = What() + " data";
    for (size_t i : path_) w += "[" + std::to_string(i) + "]";
    return w;
  }

  // The events of "data": straight into the tensor when it is allocated, else kept for replay.
  bool OnData(Ev ev, json v, bool replay) {
    if (!cur_.allocated) {
      if (cur_.buffered.size() >= kMaxBufferedData) {
        return Bad(What() +
                   ": \"data\" comes before its \"shape\" and \"datatype\" and holds "
                   "more than " +
                   std::to_string(kMaxBufferedData) + " values; send shape and datatype first");
      }
      cur_.buffered.emplace_back(ev, std::move(v));
      if (ev == Ev::kStartArray || ev == Ev::kStartObject) ++data_depth_;
      if (ev == Ev::kEndArray || ev == Ev::kEndObject) --data_depth_;
      if (data_depth_ == 0) {
        cur_.data_done = true;
        if (!replay) modes_.pop_back();
      }
      return true;
    }
    const Shape& shape = *cur_.shape;
    const size_t rank = shape.size();
    if (ev == Ev::kStartObject || ev == Ev::kKey || ev == Ev::kEndObject) {
      return Bad(Where() + (path_.empty() && counts_.empty() ? "" : "") + " holds an object; " +
                 KServeDatatype(*cur_.dtype) + " data are numbers or arrays");
    }
    if (ev == Ev::kStartArray) {
      if (counts_.empty()) {  // the data array itself
        counts_.push_back(0);
        return true;
      }
      const size_t depth = counts_.size();  // the array this child belongs to
      if (!decided_) {
        decided_ = true;
        nested_ = rank > 0;
      }
      if (!nested_) {
        return Bad(What() + " data[" + std::to_string(flat_count_) + "] is an array; " +
                   KServeDatatype(*cur_.dtype) + " expects a value here (flat data)");
      }
      if (depth > rank - 1) {
        path_.push_back(counts_.back());
        return Bad(Where() + " is an array, nested deeper than the shape " + ShapeToString(shape));
      }
      if (counts_.back() >= shape[depth - 1]) {
        return Bad(Where() + " has more than " + std::to_string(shape[depth - 1]) +
                   " elements; the shape " + ShapeToString(shape) + " expects " +
                   std::to_string(shape[depth - 1]) + " at dim " + std::to_string(depth - 1));
      }
      path_.push_back(counts_.back());
      ++counts_.back();
      counts_.push_back(0);
      return true;
    }
    if (ev == Ev::kEndArray) {
      const size_t depth = counts_.size();
      if (depth == 1) {  // the end of "data"
        if (nested_) {
          if (rank > 0 && counts_[0] != shape[0]) {
            return Bad(Where() + " has " + std::to_string(counts_[0]) + " elements; the shape " +
                       ShapeToString(shape) + " expects " + std::to_string(shape[0]) + " at dim 0");
          }
        } else if (flat_count_ != cur_.numel) {
          return Bad(What() + " has " + std::to_string(flat_count_) + " data elements; shape " +
                     ShapeToString(shape) + " needs " + std::to_string(cur_.numel));
        }
        counts_.clear();
        cur_.data_done = true;
        if (!replay) modes_.pop_back();
        return true;
      }
      if (counts_.back() != shape[depth - 1]) {
        return Bad(Where() + " has " + std::to_string(counts_.back()) + " elements; the shape " +
                   ShapeToString(shape) + " expects " + std::to_string(shape[depth - 1]) +
                   " at dim " + std::to_string(depth - 1));
      }
      counts_.pop_back();
      path_.pop_back();
      return true;
    }
    // A scalar (or null).
    const size_t depth = counts_.size();
    if (!decided_) {
      decided_ = true;
      nested_ = false;
    }
    if (!nested_) {
      const int64_t i = flat_count_++;
      if (i < cur_.numel) {
        Status s = StoreElementAt(v, cur_.tensor, i,
                                  [&] { return What() + " data[" + std::to_string(i) + "]"; });
        if (!s.ok()) return Fail(std::move(s));
      }
      return true;
    }
    if (depth < rank) {
      path_.push_back(counts_.back());
      return Bad(Where() + " is " + Show(v) + "; the shape " + ShapeToString(shape) +
                 " expects an array of " + std::to_string(shape[depth]) + " here");
    }
    if (counts_.back() >= shape[depth - 1]) {
      return Bad(Where() + " has more than " + std::to_string(shape[depth - 1]) +
                 " elements; the shape " + ShapeToString(shape) + " expects " +
                 std::to_string(shape[depth - 1]) + " at dim " + std::to_string(depth - 1));
    }
    const int64_t index = counts_.back()++;
    Status s = StoreElementAt(v, cur_.tensor, next_, [&] {
      std::string w = Where();
      return w + "[" + std::to_string(index) + "]";
    });
    if (!s.ok()) return Fail(std::move(s));
    ++next_;
    return true;
  }

  bool FinishInput() {
    if (cur_.name.empty()) return Bad(At() + " has no \"name\" (a non-empty string)");
    if (!cur_.dtype) return Bad(What() + " has no \"datatype\" (a string such as \"FP32\")");
    if (!cur_.shape) return Bad(What() + " has no \"shape\" (an array of dims)");
    if (cur_.binary_size != nullptr) {
      if (cur_.has_data) return Bad(What() + " has both \"data\" and binary_data_size");
      if (!options_.json_length) {
        return Bad(What() + " has parameters.binary_data_size but the request has no " +
                   std::string(kInferenceHeaderContentLength) + " header");
      }
      uint64_t size = 0;
      if (!AsCount(*cur_.binary_size, &size)) {
        return Bad(What() + ": binary_data_size is " + Show(*cur_.binary_size) +
                   "; expected a byte count >= 0");
      }
      const uint64_t want = static_cast<uint64_t>(cur_.numel) * DTypeSize(*cur_.dtype);
      if (size != want) {
        return Bad(What() + ": binary_data_size is " + std::to_string(size) + "; " +
                   KServeDatatype(*cur_.dtype) + ShapeToString(*cur_.shape) + " takes " +
                   std::to_string(want) + " bytes");
      }
      for (const BinaryInput& b : binary_) {
        if (b.name == cur_.name || req_.inputs.count(cur_.name)) {
          return Bad("input " + Quote(cur_.name) + " appears more than once in the request");
        }
      }
      if (req_.inputs.count(cur_.name)) {
        return Bad("input " + Quote(cur_.name) + " appears more than once in the request");
      }
      binary_.push_back(BinaryInput{cur_.name, *cur_.dtype, *cur_.shape, size});
      req_.input_order.push_back(cur_.name);
      return true;
    }
    if (!cur_.has_data) return Bad(What() + " has neither \"data\" nor binary_data_size");
    for (const BinaryInput& b : binary_) {
      if (b.name == cur_.name) {
        return Bad("input " + Quote(cur_.name) + " appears more than once in the request");
      }
    }
    if (!cur_.allocated) {
      if (!Allocate()) return false;
      auto events = std::move(cur_.buffered);
      for (auto& [ev, v] : events) {
        if (!OnData(ev, std::move(v), /*replay=*/true)) return false;
      }
    }
    req_.input_order.push_back(cur_.name);
    req_.inputs.emplace(cur_.name, std::move(cur_.tensor));
    return true;
  }

  bool OnOutput(json o) {
    const size_t i = output_count_++;
    if (i >= kMaxTensors) {
      return Bad("infer request asks for more than " + std::to_string(kMaxTensors) + " outputs");
    }
    auto n = o.is_object() ? o.find("name") : o.end();
    if (!o.is_object() || n == o.end() || !n->is_string()) {
      return Bad("outputs[" + std::to_string(i) + "] is " + Show(o) +
                 "; expected {\"name\": string}");
    }
    const std::string name = n->get<std::string>();
    if (std::find(req_.requested_outputs.begin(), req_.requested_outputs.end(), name) !=
        req_.requested_outputs.end()) {
      return Bad("output " + Quote(name) + " is requested more than once");
    }
    req_.requested_outputs.push_back(name);
    if (auto p = o.find("parameters"); p != o.end()) {
      if (!p->is_object()) {
        return Bad("output " + Quote(name) + ": \"parameters\" is " + Show(*p) +
                   "; expected an object");
      }
      if (auto b = p->find("binary_data"); b != p->end()) {
        if (!b->is_boolean()) {
          return Bad("output " + Quote(name) + ": binary_data is " + Show(*b) +
                     "; expected true or false");
        }
        if (b->get<bool>()) req_.binary_outputs.insert(name);
      }
    }
    return true;
  }

  const InferReadOptions& options_;
  const uint64_t json_bytes_bound_;
  std::vector<Mode> modes_;
  std::string key_, root_key_, tensor_key_;
  std::set<std::string> root_keys_;
  Status error_;
  std::string parse_error_;
  bool saw_inputs_ = false;
  InferRequest req_;
  std::vector<BinaryInput> binary_;
  size_t input_count_ = 0, output_count_ = 0;
  PendingInput cur_;
  // "data" of the current input.
  int data_depth_ = 0;           // while buffering
  std::vector<int64_t> counts_;  // children seen per open array, the data array first
  std::vector<int64_t> path_;    // index of each open nested array, for messages
  int64_t next_ = 0, flat_count_ = 0;
  bool decided_ = false, nested_ = false;
  // Capture of a small value.
  json captured_;
  std::unique_ptr<nlohmann::detail::json_sax_dom_parser<json>> dom_;
  std::function<bool(json)> capture_done_;
  int capture_depth_ = 0;
  size_t capture_events_ = 0;
  size_t capture_bytes_ = 0;
  int skip_depth_ = 0;
};

// Reads exactly `n` bytes into `out`; false at an early end.
Result<bool> ReadExactly(const ByteSource& source, char* out, uint64_t n) {
  uint64_t got = 0;
  while (got < n) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(n - got, 1 << 20));
    KILN_ASSIGN_OR_RETURN(size_t k, source(out + got, want));
    if (k == 0) return false;
    got += k;
  }
  return true;
}

}  // namespace

Result<InferRequest> ReadInferRequest(const ByteSource& body, const InferReadOptions& options) {
  if (options.json_length && options.body_size && *options.json_length > *options.body_size) {
    return Status::InvalidArgument(
        std::string(kInferenceHeaderContentLength) + " is " + std::to_string(*options.json_length) +
        " but the body has only " + std::to_string(*options.body_size) + " bytes");
  }
  const uint64_t json_bound = options.json_length
                                  ? *options.json_length
                                  : options.body_size.value_or(options.max_body_bytes);
  JsonPartBuf buf(
      body, options.json_length ? std::optional<uint64_t>(*options.json_length) : std::nullopt);
  std::istream in(&buf);
  RequestReader reader(options, json_bound);
  bool parsed = false;
  try {
    parsed = json::sax_parse(in, &reader);
  } catch (const std::exception& e) {
    return Status::InvalidArgument(std::string("infer request is not valid JSON: ") + e.what());
  }
  if (!buf.failure().ok()) return buf.failure();
  if (!reader.error().ok()) return reader.error();
  if (!parsed) {
    return Status::InvalidArgument(reader.parse_error_text().empty()
                                       ? std::string("infer request is not valid JSON")
                                       : reader.parse_error_text());
  }
  if (!reader.saw_inputs()) return Status::InvalidArgument("infer request has no \"inputs\" array");
  InferRequest& req = reader.request();
  if (!options.json_length) return std::move(req);
  if (buf.consumed() != *options.json_length) {
    return Status::InvalidArgument(
        std::string(kInferenceHeaderContentLength) + " is " + std::to_string(*options.json_length) +
        " but the body ended after " + std::to_string(buf.consumed()) + " bytes");
  }

  // The binary part: each binary input's bytes in input order, nothing left over.
  uint64_t declared = 0;
  for (const BinaryInput& b : reader.binary_inputs()) declared += b.size;
  std::optional<uint64_t> binary_total;
  if (options.body_size) binary_total = *options.body_size - *options.json_length;
  uint64_t offset = 0;
  for (const BinaryInput& b : reader.binary_inputs()) {
    const std::string what = "input " + Quote(b.name);
    const uint64_t left =
        binary_total ? *binary_total - offset
                     : options.max_body_bytes - std::min<uint64_t>(options.max_body_bytes,
                                                                   *options.json_length + offset);
    if (b.size > left) {
      return Status::InvalidArgument(what + ": binary_data_size is " + std::to_string(b.size) +
                                     " but only " + std::to_string(left) +
                                     " bytes of binary data remain (truncated body?)");
    }
    if (options.admit_input) KILN_RETURN_IF_ERROR(options.admit_input(b.name, b.dtype, b.shape));
    KILN_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(b.dtype, b.shape));
    KILN_ASSIGN_OR_RETURN(bool whole, ReadExactly(body, static_cast<char*>(t.raw_data()), b.size));
    if (!whole) {
      return Status::InvalidArgument(what + ": binary_data_size is " + std::to_string(b.size) +
                                     " but the body ended first (truncated body?)");
    }
    offset += b.size;
    if (b.dtype == DType::kBool) {
      const uint8_t* p = t.data<uint8_t>();
      for (int64_t i = 0; i < t.numel(); ++i) {
        if (p[i] > 1) {
          return Status::InvalidArgument(what + ": binary BOOL element " + std::to_string(i) +
                                         " is byte " + std::to_string(p[i]) + "; expected 0 or 1");
        }
      }
    }
    req.inputs.emplace(b.name, std::move(t));
  }
  uint64_t extra = 0;
  if (binary_total) {
    extra = *binary_total - offset;
  } else {
    char sink[4096];
    while (true) {
      KILN_ASSIGN_OR_RETURN(size_t k, body(sink, sizeof(sink)));
      if (k == 0) break;
      extra += k;
    }
  }
  if (extra != 0) {
    return Status::InvalidArgument(std::to_string(extra) +
                                   " bytes of binary data follow the last binary input (the "
                                   "inputs' binary_data_size account for " +
                                   std::to_string(declared) + ")");
  }
  return std::move(req);
}

Result<InferRequest> ParseInferRequest(std::string_view body, std::optional<size_t> json_length) {
  size_t at = 0;
  ByteSource source = [&](char* buf, size_t cap) -> Result<size_t> {
    const size_t n = std::min(cap, body.size() - at);
    std::memcpy(buf, body.data() + at, n);
    at += n;
    return n;
  };
  InferReadOptions options;
  options.json_length = json_length;
  options.body_size = body.size();
  return ReadInferRequest(source, options);
}

Status CheckInputAgainstGraph(const Graph& graph, const std::string& name, DType dtype,
                              const Shape& shape) {
  const InputMismatch m = MatchInput(graph, name, dtype, shape);
  if (m.ok()) return Status::OK();
  if (m.kind == InputMismatch::Kind::kUnknown) {
    return Status::InvalidArgument(
        "input " + Quote(name) +
        " is not an input of the model (inputs: " + DeclaredInputNames(graph) + ")");
  }
  const ValueInfo& vi = *m.declared;
  const std::string decl =
      std::string(KServeDatatype(vi.dtype)) + (vi.has_shape ? vi.ShapeString() : "[?]");
  const std::string got = std::string(KServeDatatype(dtype)) + ShapeToString(shape);
  switch (m.kind) {
    case InputMismatch::Kind::kDType:
      return Status::InvalidArgument("input " + Quote(name) + " is " + got +
                                     "; the model declares " + decl);
    case InputMismatch::Kind::kRank:
      return Status::InvalidArgument("input " + Quote(name) + " is " + got + " (rank " +
                                     std::to_string(shape.size()) + "); the model declares " +
                                     decl + " (rank " + std::to_string(vi.dims.size()) + ")");
    default:
      return Status::InvalidArgument("input " + Quote(name) + " is " + got + ": dim " +
                                     std::to_string(m.dim) + " is " + std::to_string(shape[m.dim]) +
                                     "; the model declares " + decl);
  }
}

Status CheckInputsAgainstGraph(const Graph& graph, const TensorMap& inputs) {
  for (const ValueInfo& vi : graph.inputs) {
    auto it = inputs.find(vi.name);
    if (it == inputs.end()) {
      const std::string decl =
          std::string(KServeDatatype(vi.dtype)) + (vi.has_shape ? vi.ShapeString() : "[?]");
      return Status::InvalidArgument("input " + Quote(vi.name) +
                                     " is missing; the model declares " + vi.name + ": " + decl);
    }
    KILN_RETURN_IF_ERROR(
        CheckInputAgainstGraph(graph, vi.name, it->second.dtype(), it->second.shape()));
  }
  for (const auto& [name, t] : inputs) {
    KILN_RETURN_IF_ERROR(CheckInputAgainstGraph(graph, name, t.dtype(), t.shape()));
  }
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------
// The streamed response.

namespace {

// Element `i` of `t` as JSON text, exactly as nlohmann::json writes the value ElementsAsJson
// makes of it (its shortest round-trip form for floats, null for NaN and infinities); at most 32
// bytes.
size_t FormatElement(const Tensor& t, int64_t i, char* out) {
  char* const end = out + 32;
  auto real = [&](double d) -> size_t {
    if (!std::isfinite(d)) {
      std::memcpy(out, "null", 4);
      return 4;
    }
    return static_cast<size_t>(nlohmann::detail::to_chars(out, end, d) - out);
  };
  auto integer = [&](auto v) { return static_cast<size_t>(std::to_chars(out, end, v).ptr - out); };
  switch (t.dtype()) {
    case DType::kFloat32:
      return real(static_cast<double>(t.data<float>()[i]));
    case DType::kFloat16:
      return real(static_cast<double>(HalfToFloat(t.data<uint16_t>()[i])));
    case DType::kFloat64:
      return real(t.data<double>()[i]);
    case DType::kBool:
      if (t.data<uint8_t>()[i] != 0) {
        std::memcpy(out, "true", 4);
        return 4;
      }
      std::memcpy(out, "false", 5);
      return 5;
    case DType::kUInt64:
      return integer(t.data<uint64_t>()[i]);
    default:
      return integer(t.GetAsInt64(i));
  }
}

}  // namespace

// Text, an output's elements as JSON (comma-separated, no brackets), or an output's raw bytes.
struct InferResponseStream::Segment {
  enum class Kind { kText, kElements, kBytes } kind = Kind::kText;
  std::string text;
  const Tensor* tensor = nullptr;  // points into outputs_
  uint64_t size = 0;
};

InferResponseStream::~InferResponseStream() = default;

Result<std::unique_ptr<InferResponseStream>> InferResponseStream::Create(
    const std::string& model_name, const std::string& model_version, const InferRequest& request,
    TensorMap outputs, const InferOutcome& outcome) {
  std::vector<std::string> names = request.requested_outputs;
  if (names.empty()) {
    for (const auto& [name, t] : outputs) names.push_back(name);
  }
  for (const std::string& name : names) {
    if (!outputs.count(name)) {
      std::string have;
      for (const auto& [n, t] : outputs) have += (have.empty() ? "" : ", ") + n;
      return Status::InvalidArgument("output " + Quote(name) +
                                     " is not an output of the model (outputs: " + have + ")");
    }
  }
  std::unique_ptr<InferResponseStream> r(new InferResponseStream());
  r->outputs_ = std::move(outputs);
  std::string text = "{";
  if (!request.id.empty()) text += "\"id\":" + JsonText(request.id) + ",";
  text += "\"model_name\":" + JsonText(model_name) +
          ",\"model_version\":" + JsonText(model_version) + ",\"outputs\":[";
  std::vector<const Tensor*> binary;
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string& name = names[i];
    const Tensor& t = r->outputs_.at(name);
    if (i > 0) text += ",";
    text += "{";
    const bool as_binary = request.binary_data_output || request.binary_outputs.count(name);
    if (!as_binary) {
      text += "\"data\":[";
      r->segments_.push_back(Segment{Segment::Kind::kText, std::move(text), nullptr, 0});
      text.clear();
      // The elements' text is counted here once and written again as it is read.
      uint64_t size = t.numel() > 0 ? static_cast<uint64_t>(t.numel() - 1) : 0;
      char scratch[48];
      for (int64_t e = 0; e < t.numel(); ++e) size += FormatElement(t, e, scratch);
      r->segments_.push_back(Segment{Segment::Kind::kElements, "", &t, size});
      text += "],";
    }
    text += "\"datatype\":" + JsonText(KServeDatatype(t.dtype())) + ",\"name\":" + JsonText(name);
    if (as_binary) {
      text += ",\"parameters\":" + JsonText(json{{"binary_data_size", t.nbytes()}});
      binary.push_back(&t);
    }
    text += ",\"shape\":" + JsonText(json(t.shape())) + "}";
  }
  text += "],\"parameters\":" +
          JsonText(json{{"serving_mode", outcome.serving_mode},
                        {"served_cell_ref", outcome.served_cell_ref},
                        {"fallback_reason", outcome.fallback_reason},
                        {"fallback_detail", outcome.fallback_detail},
                        {"duration_ms", outcome.duration_ms}}) +
          "}";
  r->segments_.push_back(Segment{Segment::Kind::kText, std::move(text), nullptr, 0});
  for (Segment& seg : r->segments_) {
    if (seg.kind == Segment::Kind::kText) seg.size = seg.text.size();
    r->size_ += seg.size;
  }
  if (request.binary_data_output || !request.binary_outputs.empty()) {
    r->json_length_ = static_cast<size_t>(r->size_);
    for (const Tensor* t : binary) {
      r->segments_.push_back(Segment{Segment::Kind::kBytes, "", t, t->nbytes()});
      r->size_ += t->nbytes();
    }
  }
  return r;
}

Result<size_t> InferResponseStream::Read(uint64_t offset, char* buf, size_t cap) {
  if (offset != at_) {
    return Status::Internal("infer response: read at byte " + std::to_string(offset) +
                            " after byte " + std::to_string(at_) + "; reads are sequential");
  }
  size_t n = 0;
  while (n < cap && segment_ < segments_.size()) {
    const Segment& seg = segments_[segment_];
    if (seg.kind != Segment::Kind::kElements) {
      const char* src = seg.kind == Segment::Kind::kText
                            ? seg.text.data()
                            : static_cast<const char*>(seg.tensor->raw_data());
      const size_t take = static_cast<size_t>(std::min<uint64_t>(cap - n, seg.size - in_segment_));
      std::memcpy(buf + n, src + in_segment_, take);
      n += take;
      in_segment_ += take;
    } else if (pending_at_ < pending_len_) {
      const size_t take = std::min(cap - n, pending_len_ - pending_at_);
      std::memcpy(buf + n, pending_ + pending_at_, take);
      n += take;
      pending_at_ += take;
      in_segment_ += take;
    } else if (element_ < seg.tensor->numel()) {
      // An element (and the comma before it) straight into `buf` when it fits, else through
      // `pending_`.
      char* out = cap - n >= sizeof(pending_) ? buf + n : pending_;
      size_t len = 0;
      if (element_ > 0) out[len++] = ',';
      len += FormatElement(*seg.tensor, element_, out + len);
      ++element_;
      if (out == pending_) {
        pending_len_ = len;
        pending_at_ = 0;
      } else {
        n += len;
        in_segment_ += len;
      }
    }
    if (in_segment_ == seg.size &&
        (seg.kind != Segment::Kind::kElements ||
         (element_ == seg.tensor->numel() && pending_at_ == pending_len_))) {
      ++segment_;
      in_segment_ = 0;
      element_ = 0;
      pending_len_ = pending_at_ = 0;
    } else if (in_segment_ > seg.size) {
      return Status::Internal("infer response: an output's text outgrew its count");
    }
  }
  at_ += n;
  return n;
}

Result<EncodedInferResponse> EncodeInferResponse(const std::string& model_name,
                                                 const std::string& model_version,
                                                 const InferRequest& request,
                                                 const TensorMap& outputs,
                                                 const InferOutcome& outcome) {
  KILN_ASSIGN_OR_RETURN(auto stream, InferResponseStream::Create(model_name, model_version, request,
                                                                 outputs, outcome));
  EncodedInferResponse r;
  r.body.resize(static_cast<size_t>(stream->size()));
  size_t at = 0;
  while (at < r.body.size()) {
    KILN_ASSIGN_OR_RETURN(size_t n, stream->Read(at, r.body.data() + at, r.body.size() - at));
    if (n == 0) return Status::Internal("infer response: ended before its length");
    at += n;
  }
  r.json_length = stream->json_length();
  return r;
}

}  // namespace kiln
