// The client's side of the KServe v2 codec (tests; see kserve_client.h).
#include "tests/worker/kserve_client.h"

#include <nlohmann/json.hpp>

#include "src/kiln/base/canonical_json.h"

namespace kiln {

using nlohmann::json;

namespace {

std::string JsonText(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace

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
      o["data"] = KServeJsonData(t);
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
  if (json_length && *json_length > body.size()) {
    // Appended piece by piece: GCC 12 warns (falsely, -Warray-bounds) on the chained operator+.
    std::string message(kInferenceHeaderContentLength);
    message.append(" is ").append(std::to_string(*json_length));
    message.append(" but the body has only ").append(std::to_string(body.size())).append(" bytes");
    return Status::InvalidArgument(message);
  }
  const std::string_view json_part = json_length ? body.substr(0, *json_length) : body;
  KILN_ASSIGN_OR_RETURN(json j, ParseJson(json_part, "infer response"));
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
  // The outputs are tensors exactly as a request's inputs are (name, shape, datatype, then data
  // or parameters.binary_data_size, binary bytes in order after the JSON part): the worker's
  // reader decodes them.
  std::string as_request = JsonText(json{{"inputs", *outs}});
  const size_t request_json_length = as_request.size();
  if (json_length) as_request.append(body.substr(*json_length));
  auto read = ParseInferRequest(
      as_request, json_length ? std::optional<size_t>(request_json_length) : std::nullopt);
  if (!read.ok()) return read.status().WithContext("infer response outputs");
  r.outputs = std::move(read->inputs);
  return r;
}

}  // namespace kiln
