// The client's side of the KServe v2 codec, for tests, the fuzz harness's round trip and seed
// writer: request bodies out (JSON tensors or the binary extension) and response bodies in. Not
// part of the worker: a serving process reads requests and writes responses (worker/kserve.h).
// Responses are decoded with the worker's own request reader (ParseInferRequest), so kiln has one
// parser of KServe tensors.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "src/kiln/base/status.h"
#include "src/kiln/worker/kserve.h"

namespace kiln {

// A request body built from named tensors (JSON tensors, or binary tensors when `binary`, which
// also asks for binary outputs).
struct EncodedInferRequest {
  std::string body;
  std::optional<size_t> json_length;  // set when binary
};
EncodedInferRequest EncodeInferRequest(const TensorMap& inputs, bool binary,
                                       const std::string& id = "");

// A response body produced by EncodeInferResponse (JSON or binary), decoded.
struct DecodedInferResponse {
  std::string model_name;
  std::string id;
  TensorMap outputs;
  std::map<std::string, std::string> parameters;  // string values unquoted
};
// InvalidArgument for a body that is not a response (no "outputs" array, a JSON error) or whose
// tensors do not read (the reader's own refusals, naming the output).
Result<DecodedInferResponse> DecodeInferResponse(std::string_view body,
                                                 std::optional<size_t> json_length);

}  // namespace kiln
