// Fuzz harness for the KServe v2 infer request parser (fuzz/; worker/kserve.h): the JSON body and
// the binary tensor extension. Input layout: "H:<header value>\n<body>" fuzzes a request that
// carried Inference-Header-Content-Length (the value goes through ParseInferenceHeaderLength
// first, as the front end does); anything else is a whole-JSON body. Promises checked: a refusal is
// InvalidArgument with a message; an accepted request lists each input once in input_order, every
// input tensor is valid, and the inputs re-encoded with the binary extension parse back to the same
// tensors.
#include <optional>
#include <string>

#include "fuzz/harness.h"
#include "src/kiln/worker/kserve.h"
#include "tests/worker/kserve_client.h"

namespace kiln::fuzz {
namespace {

void CheckKServeRefusal(const Status& status, std::string_view entry_point) {
  CheckRefusal(status, entry_point);
  KILN_FUZZ_CHECK(status.code() == StatusCode::kInvalidArgument,
                  std::string(entry_point) + " refused with " + status.ToString());
}

}  // namespace

bool FuzzOne(std::string_view bytes) {
  std::string_view body = bytes;
  std::optional<size_t> json_length;
  if (bytes.starts_with("H:")) {
    const size_t nl = bytes.find('\n');
    if (nl == std::string_view::npos) return false;
    body = bytes.substr(nl + 1);
    Result<size_t> n =
        ParseInferenceHeaderLength(std::string(bytes.substr(2, nl - 2)), body.size());
    if (!n.ok()) {
      CheckKServeRefusal(n.status(), "ParseInferenceHeaderLength");
      return false;
    }
    KILN_FUZZ_CHECK(*n <= body.size(), "a header length beyond the body was accepted");
    json_length = *n;
  }
  Result<InferRequest> req = ParseInferRequest(body, json_length);
  if (!req.ok()) {
    CheckKServeRefusal(req.status(), "ParseInferRequest");
    return false;
  }
  KILN_FUZZ_CHECK(req->input_order.size() == req->inputs.size(),
                  "input_order and inputs disagree on the number of inputs");
  for (const std::string& name : req->input_order) {
    auto it = req->inputs.find(name);
    KILN_FUZZ_CHECK(it != req->inputs.end(), "input_order names '" + name + "', not an input");
    KILN_FUZZ_CHECK(it->second.valid(), "input '" + name + "' is an invalid tensor");
  }
  const EncodedInferRequest again = EncodeInferRequest(req->inputs, /*binary=*/true, req->id);
  Result<InferRequest> back = ParseInferRequest(again.body, again.json_length);
  KILN_FUZZ_CHECK(back.ok(),
                  "EncodeInferRequest output does not parse: " + back.status().ToString());
  KILN_FUZZ_CHECK(back->id == req->id, "the round trip changed the id");
  KILN_FUZZ_CHECK(back->inputs.size() == req->inputs.size(), "the round trip lost inputs");
  for (const auto& [name, t] : req->inputs) {
    auto it = back->inputs.find(name);
    KILN_FUZZ_CHECK(it != back->inputs.end() && SameTensor(t, it->second),
                    "the round trip changed input '" + name + "'");
  }
  return true;
}

}  // namespace kiln::fuzz
