// KServe v2 codec (worker layer): JSON and binary tensors <-> TensorMap. See kserve.h. nlohmann
// parse errors are caught here and become InvalidArgument; nothing else in this file throws.
#include "src/kiln/worker/kserve.h"

#include <cfloat>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <utility>

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

// Refuses JSON nested deeper than kKServeMaxJsonDepth before the parser sees it.
Status CheckDepth(std::string_view text) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kKServeMaxJsonDepth) {
        return Status::InvalidArgument("infer request: JSON nested deeper than " +
                                       std::to_string(kKServeMaxJsonDepth) + " levels");
      }
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return Status::OK();
}

Result<json> ParseJson(std::string_view text, const std::string& what) {
  KILN_RETURN_IF_ERROR(CheckDepth(text));
  try {
    return json::parse(text.begin(), text.end());
  } catch (const std::exception& e) {
    return Status::InvalidArgument(what + " is not valid JSON: " + e.what());
  } catch (...) {
    return Status::InvalidArgument(what + " is not valid JSON");
  }
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

// Writes JSON scalar `v` as element `i` of `t`; `where` names it for messages.
Status StoreElement(const json& v, Tensor& t, int64_t i, const std::string& where) {
  const DType dt = t.dtype();
  auto bad = [&](const std::string& expect) {
    return Status::InvalidArgument(where + " is " + Show(v) + "; " + KServeDatatype(dt) +
                                   " expects " + expect);
  };
  switch (dt) {
    case DType::kFloat64:
      if (!v.is_number()) return bad("a number");
      t.data<double>()[i] = v.get<double>();
      return Status::OK();
    case DType::kFloat32:
    case DType::kFloat16: {
      if (!v.is_number()) return bad("a number");
      const double d = v.get<double>();
      const double limit = dt == DType::kFloat32 ? FLT_MAX : 65504.0;
      if (!(d >= -limit && d <= limit)) return bad("a number within its range");
      if (dt == DType::kFloat32) {
        t.data<float>()[i] = static_cast<float>(d);
      } else {
        t.data<uint16_t>()[i] = FloatToHalf(static_cast<float>(d));
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
  }
  return Status::InvalidArgument(where + ": unsupported dtype");
}

// Fills `t` from nested `data` whose structure must match shape[level...].
Status FillNested(const json& data, Tensor& t, size_t level, int64_t* next,
                  const std::string& where) {
  const Shape& shape = t.shape();
  if (level == shape.size()) {
    if (data.is_array() || data.is_object()) {
      return Status::InvalidArgument(where + " is " + Show(data) +
                                     ", nested deeper than the shape " + ShapeToString(shape));
    }
    KILN_RETURN_IF_ERROR(StoreElement(data, t, *next, where));
    ++*next;
    return Status::OK();
  }
  if (!data.is_array()) {
    return Status::InvalidArgument(where + " is " + Show(data) + "; the shape " +
                                   ShapeToString(shape) + " expects an array of " +
                                   std::to_string(shape[level]) + " here");
  }
  if (static_cast<int64_t>(data.size()) != shape[level]) {
    return Status::InvalidArgument(where + " has " + std::to_string(data.size()) +
                                   " elements; the shape " + ShapeToString(shape) + " expects " +
                                   std::to_string(shape[level]) + " at dim " +
                                   std::to_string(level));
  }
  for (size_t k = 0; k < data.size(); ++k) {
    KILN_RETURN_IF_ERROR(
        FillNested(data[k], t, level + 1, next, where + "[" + std::to_string(k) + "]"));
  }
  return Status::OK();
}

// One tensor object ({"name","shape","datatype","data"|"parameters.binary_data_size"}) of
// `kind` ("input" / "output"). `binary` is the bytes after the JSON (null: no binary part);
// `offset` advances past the bytes this tensor took.
Result<std::pair<std::string, Tensor>> ParseTensor(const json& obj, size_t index, const char* kind,
                                                   const std::string_view* binary, size_t* offset,
                                                   size_t json_bytes) {
  const std::string at = std::string(kind) + "s[" + std::to_string(index) + "]";
  if (!obj.is_object()) {
    return Status::InvalidArgument(at + " is " + Show(obj) + "; expected an object");
  }
  auto name_it = obj.find("name");
  if (name_it == obj.end() || !name_it->is_string() || name_it->get<std::string>().empty()) {
    return Status::InvalidArgument(at + " has no \"name\" (a non-empty string)");
  }
  const std::string name = name_it->get<std::string>();
  const std::string what = std::string(kind) + " " + Quote(name);

  auto dt_it = obj.find("datatype");
  if (dt_it == obj.end() || !dt_it->is_string()) {
    return Status::InvalidArgument(what + " has no \"datatype\" (a string such as \"FP32\")");
  }
  auto dtype_or = DTypeFromKServe(dt_it->get<std::string>());
  if (!dtype_or.ok()) return dtype_or.status().WithContext(what);
  const DType dtype = *dtype_or;

  auto shape_it = obj.find("shape");
  if (shape_it == obj.end() || !shape_it->is_array()) {
    return Status::InvalidArgument(what + " has no \"shape\" (an array of dims)");
  }
  if (shape_it->size() > static_cast<size_t>(kKServeMaxRank)) {
    return Status::InvalidArgument(what + " has rank " + std::to_string(shape_it->size()) +
                                   "; at most " + std::to_string(kKServeMaxRank) +
                                   " dims are accepted");
  }
  Shape shape;
  int64_t numel = 1;
  for (size_t d = 0; d < shape_it->size(); ++d) {
    uint64_t dim = 0;
    if (!AsCount((*shape_it)[d], &dim) || dim > static_cast<uint64_t>(kKServeMaxElements)) {
      return Status::InvalidArgument(what + ": shape[" + std::to_string(d) + "] is " +
                                     Show((*shape_it)[d]) + "; expected an integer dim >= 0");
    }
    shape.push_back(static_cast<int64_t>(dim));
    if (dim != 0 && numel > kKServeMaxElements / static_cast<int64_t>(dim)) {
      return Status::InvalidArgument(what + ": shape " + Show(*shape_it) + " has more than " +
                                     std::to_string(kKServeMaxElements) + " elements");
    }
    numel *= static_cast<int64_t>(dim);
  }

  const json* size_param = nullptr;
  auto params_it = obj.find("parameters");
  if (params_it != obj.end()) {
    if (!params_it->is_object()) {
      return Status::InvalidArgument(what + ": \"parameters\" is " + Show(*params_it) +
                                     "; expected an object");
    }
    auto b = params_it->find("binary_data_size");
    if (b != params_it->end()) size_param = &*b;
  }
  auto data_it = obj.find("data");

  if (size_param != nullptr) {
    if (data_it != obj.end()) {
      return Status::InvalidArgument(what + " has both \"data\" and binary_data_size");
    }
    if (binary == nullptr) {
      return Status::InvalidArgument(what +
                                     " has parameters.binary_data_size but the request "
                                     "has no " +
                                     std::string(kInferenceHeaderContentLength) + " header");
    }
    uint64_t size = 0;
    if (!AsCount(*size_param, &size)) {
      return Status::InvalidArgument(what + ": binary_data_size is " + Show(*size_param) +
                                     "; expected a byte count >= 0");
    }
    const uint64_t want = static_cast<uint64_t>(numel) * DTypeSize(dtype);
    if (size != want) {
      return Status::InvalidArgument(what + ": binary_data_size is " + std::to_string(size) + "; " +
                                     KServeDatatype(dtype) + ShapeToString(shape) + " takes " +
                                     std::to_string(want) + " bytes");
    }
    const size_t left = binary->size() - *offset;
    if (size > left) {
      return Status::InvalidArgument(what + ": binary_data_size is " + std::to_string(size) +
                                     " but only " + std::to_string(left) +
                                     " bytes of binary data remain (truncated body?)");
    }
    auto t_or =
        Tensor::FromBytes(dtype, shape, binary->data() + *offset, static_cast<size_t>(size));
    if (!t_or.ok()) return t_or.status().WithContext(what);
    Tensor t = std::move(t_or).value();
    *offset += static_cast<size_t>(size);
    if (dtype == DType::kBool) {
      const uint8_t* p = t.data<uint8_t>();
      for (int64_t i = 0; i < numel; ++i) {
        if (p[i] > 1) {
          return Status::InvalidArgument(what + ": binary BOOL element " + std::to_string(i) +
                                         " is byte " + std::to_string(p[i]) + "; expected 0 or 1");
        }
      }
    }
    return std::make_pair(name, std::move(t));
  }

  if (data_it == obj.end()) {
    return Status::InvalidArgument(what + " has neither \"data\" nor binary_data_size");
  }
  const json& data = *data_it;
  if (!data.is_array()) {
    return Status::InvalidArgument(what + ": \"data\" is " + Show(data) + "; expected an array");
  }
  // Every JSON element takes at least one byte, so a shape needing more elements than the JSON
  // has bytes cannot be satisfied: refuse before allocating for it.
  if (static_cast<uint64_t>(numel) > json_bytes) {
    return Status::InvalidArgument(what + ": shape " + ShapeToString(shape) + " needs " +
                                   std::to_string(numel) + " data elements; the request holds " +
                                   "fewer");
  }
  auto t_or = Tensor::Empty(dtype, shape);
  if (!t_or.ok()) return t_or.status().WithContext(what);
  Tensor t = std::move(t_or).value();
  const bool nested = !shape.empty() && !data.empty() && data[0].is_array();
  if (nested) {
    int64_t next = 0;
    KILN_RETURN_IF_ERROR(FillNested(data, t, 0, &next, what + " data"));
  } else {
    if (static_cast<int64_t>(data.size()) != numel) {
      return Status::InvalidArgument(what + " has " + std::to_string(data.size()) +
                                     " data elements; shape " + ShapeToString(shape) + " needs " +
                                     std::to_string(numel));
    }
    for (int64_t i = 0; i < numel; ++i) {
      KILN_RETURN_IF_ERROR(StoreElement(data[static_cast<size_t>(i)], t, i,
                                        what + " data[" + std::to_string(i) + "]"));
    }
  }
  return std::make_pair(name, std::move(t));
}

// Splits a body into its JSON part and (when json_length is set) its binary part.
Result<std::pair<std::string_view, std::optional<std::string_view>>> SplitBody(
    std::string_view body, std::optional<size_t> json_length) {
  if (!json_length) return std::make_pair(body, std::optional<std::string_view>());
  if (*json_length > body.size()) {
    return Status::InvalidArgument(std::string(kInferenceHeaderContentLength) + " is " +
                                   std::to_string(*json_length) + " but the body has only " +
                                   std::to_string(body.size()) + " bytes");
  }
  return std::make_pair(body.substr(0, *json_length),
                        std::optional<std::string_view>(body.substr(*json_length)));
}

json ElementsAsJson(const Tensor& t) {
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
  }
  return "?";
}

Result<DType> DTypeFromKServe(const std::string& datatype) {
  for (DType t : {DType::kFloat32, DType::kFloat16, DType::kInt64, DType::kInt32, DType::kInt8,
                  DType::kUInt8, DType::kBool, DType::kFloat64, DType::kInt16, DType::kUInt16,
                  DType::kUInt32, DType::kUInt64}) {
    if (datatype == KServeDatatype(t)) return t;
  }
  std::string shown = datatype.size() > 40 ? datatype.substr(0, 37) + "..." : datatype;
  return Status::InvalidArgument("datatype \"" + shown +
                                 "\" is not supported; expected one of FP32, FP16, INT64, INT32, "
                                 "INT8, UINT8, BOOL, FP64, INT16, UINT16, UINT32, UINT64");
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

Result<InferRequest> ParseInferRequest(std::string_view body, std::optional<size_t> json_length) {
  KILN_ASSIGN_OR_RETURN(auto parts, SplitBody(body, json_length));
  KILN_ASSIGN_OR_RETURN(json j, ParseJson(parts.first, "infer request"));
  if (!j.is_object()) {
    return Status::InvalidArgument("infer request is " + Show(j) + "; expected a JSON object");
  }
  InferRequest req;
  if (auto it = j.find("id"); it != j.end()) {
    if (!it->is_string()) {
      return Status::InvalidArgument("infer request \"id\" is " + Show(*it) +
                                     "; expected a string");
    }
    req.id = it->get<std::string>();
  }
  if (auto it = j.find("parameters"); it != j.end()) {
    if (!it->is_object()) {
      return Status::InvalidArgument("infer request \"parameters\" is " + Show(*it) +
                                     "; expected an object");
    }
    for (const auto& [k, v] : it->items()) req.parameters[k] = JsonText(v);
    if (auto b = it->find("binary_data_output"); b != it->end()) {
      if (!b->is_boolean()) {
        return Status::InvalidArgument("infer request parameters.binary_data_output is " +
                                       Show(*b) + "; expected true or false");
      }
      req.binary_data_output = b->get<bool>();
    }
  }
  auto inputs = j.find("inputs");
  if (inputs == j.end() || !inputs->is_array()) {
    return Status::InvalidArgument("infer request has no \"inputs\" array");
  }
  size_t offset = 0;
  const std::string_view* binary = parts.second ? &*parts.second : nullptr;
  for (size_t i = 0; i < inputs->size(); ++i) {
    KILN_ASSIGN_OR_RETURN(
        auto named, ParseTensor((*inputs)[i], i, "input", binary, &offset, parts.first.size()));
    if (req.inputs.count(named.first)) {
      return Status::InvalidArgument("input " + Quote(named.first) +
                                     " appears more than once in the request");
    }
    req.input_order.push_back(named.first);
    req.inputs.emplace(std::move(named.first), std::move(named.second));
  }
  if (binary != nullptr && offset != binary->size()) {
    return Status::InvalidArgument(std::to_string(binary->size() - offset) +
                                   " bytes of binary data follow the last binary input (the "
                                   "inputs' binary_data_size account for " +
                                   std::to_string(offset) + ")");
  }
  if (auto outs = j.find("outputs"); outs != j.end()) {
    if (!outs->is_array()) {
      return Status::InvalidArgument("infer request \"outputs\" is " + Show(*outs) +
                                     "; expected an array");
    }
    std::set<std::string> seen;
    for (size_t i = 0; i < outs->size(); ++i) {
      const json& o = (*outs)[i];
      auto n = o.is_object() ? o.find("name") : o.end();
      if (!o.is_object() || n == o.end() || !n->is_string()) {
        return Status::InvalidArgument("outputs[" + std::to_string(i) + "] is " + Show(o) +
                                       "; expected {\"name\": string}");
      }
      const std::string name = n->get<std::string>();
      if (!seen.insert(name).second) {
        return Status::InvalidArgument("output " + Quote(name) + " is requested more than once");
      }
      req.requested_outputs.push_back(name);
      if (auto p = o.find("parameters"); p != o.end()) {
        if (!p->is_object()) {
          return Status::InvalidArgument("output " + Quote(name) + ": \"parameters\" is " +
                                         Show(*p) + "; expected an object");
        }
        if (auto b = p->find("binary_data"); b != p->end()) {
          if (!b->is_boolean()) {
            return Status::InvalidArgument("output " + Quote(name) + ": binary_data is " +
                                           Show(*b) + "; expected true or false");
          }
          if (b->get<bool>()) req.binary_outputs.insert(name);
        }
      }
    }
  }
  return req;
}

Status CheckInputsAgainstGraph(const Graph& graph, const TensorMap& inputs) {
  std::string declared;
  for (const ValueInfo& vi : graph.inputs) {
    declared += (declared.empty() ? "" : ", ") + vi.name;
  }
  for (const ValueInfo& vi : graph.inputs) {
    auto it = inputs.find(vi.name);
    const std::string decl =
        std::string(KServeDatatype(vi.dtype)) + (vi.has_shape ? vi.ShapeString() : "[?]");
    if (it == inputs.end()) {
      return Status::InvalidArgument("input " + Quote(vi.name) +
                                     " is missing; the model declares " + vi.name + ": " + decl);
    }
    const Tensor& t = it->second;
    const std::string got = std::string(KServeDatatype(t.dtype())) + ShapeToString(t.shape());
    if (t.dtype() != vi.dtype) {
      return Status::InvalidArgument("input " + Quote(vi.name) + " is " + got +
                                     "; the model declares " + decl);
    }
    if (!vi.has_shape) continue;
    if (t.rank() != static_cast<int64_t>(vi.dims.size())) {
      return Status::InvalidArgument("input " + Quote(vi.name) + " is " + got + " (rank " +
                                     std::to_string(t.rank()) + "); the model declares " + decl +
                                     " (rank " + std::to_string(vi.dims.size()) + ")");
    }
    for (size_t d = 0; d < vi.dims.size(); ++d) {
      if (vi.dims[d].known() && vi.dims[d].value != t.shape()[d]) {
        return Status::InvalidArgument("input " + Quote(vi.name) + " is " + got + ": dim " +
                                       std::to_string(d) + " is " + std::to_string(t.shape()[d]) +
                                       "; the model declares " + decl);
      }
    }
  }
  for (const auto& [name, t] : inputs) {
    bool known = false;
    for (const ValueInfo& vi : graph.inputs) known = known || vi.name == name;
    if (!known) {
      return Status::InvalidArgument("input " + Quote(name) +
                                     " is not an input of the model (inputs: " + declared + ")");
    }
  }
  return Status::OK();
}

Result<EncodedInferResponse> EncodeInferResponse(const std::string& model_name,
                                                 const std::string& model_version,
                                                 const InferRequest& request,
                                                 const TensorMap& outputs,
                                                 const InferOutcome& outcome) {
  std::vector<std::string> names = request.requested_outputs;
  if (names.empty()) {
    for (const auto& [name, t] : outputs) names.push_back(name);
  }
  json j = json::object();
  j["model_name"] = model_name;
  j["model_version"] = model_version;
  if (!request.id.empty()) j["id"] = request.id;
  json outs = json::array();
  std::string binary;
  for (const std::string& name : names) {
    auto it = outputs.find(name);
    if (it == outputs.end()) {
      std::string have;
      for (const auto& [n, t] : outputs) have += (have.empty() ? "" : ", ") + n;
      return Status::InvalidArgument("output " + Quote(name) +
                                     " is not an output of the model (outputs: " + have + ")");
    }
    const Tensor& t = it->second;
    json o = json::object();
    o["name"] = name;
    o["shape"] = t.shape();
    o["datatype"] = KServeDatatype(t.dtype());
    if (request.binary_data_output || request.binary_outputs.count(name)) {
      o["parameters"] = json{{"binary_data_size", t.nbytes()}};
      binary.append(static_cast<const char*>(t.raw_data()), t.nbytes());
    } else {
      o["data"] = ElementsAsJson(t);
    }
    outs.push_back(std::move(o));
  }
  j["outputs"] = std::move(outs);
  j["parameters"] = json{{"serving_mode", outcome.serving_mode},
                         {"served_cell_ref", outcome.served_cell_ref},
                         {"fallback_reason", outcome.fallback_reason},
                         {"fallback_detail", outcome.fallback_detail},
                         {"duration_ms", outcome.duration_ms}};
  EncodedInferResponse r;
  r.body = JsonText(j);
  const bool any_binary = request.binary_data_output || !request.binary_outputs.empty();
  if (any_binary) {
    r.json_length = r.body.size();
    r.body += binary;
  }
  return r;
}

EncodedInferRequest EncodeInferRequest(const TensorMap& inputs, bool binary,
                                       const std::string& id) {
  json j = json::object();
  if (!id.empty()) j["id"] = id;
  json ins = json::array();
  std::string bytes;
  for (const auto& [name, t] : inputs) {
    json o{{"name", name}, {"shape", t.shape()}, {"datatype", KServeDatatype(t.dtype())}};
    if (binary) {
      o["parameters"] = json{{"binary_data_size", t.nbytes()}};
      bytes.append(static_cast<const char*>(t.raw_data()), t.nbytes());
    } else {
      o["data"] = ElementsAsJson(t);
    }
    ins.push_back(std::move(o));
  }
  j["inputs"] = std::move(ins);
  if (binary) j["parameters"] = json{{"binary_data_output", true}};
  EncodedInferRequest r;
  r.body = JsonText(j);
  if (binary) {
    r.json_length = r.body.size();
    r.body += bytes;
  }
  return r;
}

Result<DecodedInferResponse> DecodeInferResponse(std::string_view body,
                                                 std::optional<size_t> json_length) {
  KILN_ASSIGN_OR_RETURN(auto parts, SplitBody(body, json_length));
  KILN_ASSIGN_OR_RETURN(json j, ParseJson(parts.first, "infer response"));
  if (!j.is_object()) return Status::InvalidArgument("infer response is not a JSON object");
  DecodedInferResponse r;
  if (auto it = j.find("model_name"); it != j.end() && it->is_string()) r.model_name = *it;
  if (auto it = j.find("id"); it != j.end() && it->is_string()) r.id = *it;
  if (auto it = j.find("parameters"); it != j.end() && it->is_object()) {
    for (const auto& [k, v] : it->items()) {
      r.parameters[k] = v.is_string() ? v.get<std::string>() : JsonText(v);
    }
  }
  auto outs = j.find("outputs");
  if (outs == j.end() || !outs->is_array()) {
    return Status::InvalidArgument("infer response has no \"outputs\" array");
  }
  size_t offset = 0;
  const std::string_view* binary = parts.second ? &*parts.second : nullptr;
  for (size_t i = 0; i < outs->size(); ++i) {
    KILN_ASSIGN_OR_RETURN(
        auto named, ParseTensor((*outs)[i], i, "output", binary, &offset, parts.first.size()));
    r.outputs[named.first] = std::move(named.second);
  }
  return r;
}

}  // namespace kiln
