// KServe v2 / Open Inference Protocol codec: infer request bodies in, infer response bodies out,
// JSON tensors and the binary tensor data extension (worker layer, under the front end in
// front.h; docs/design.md §10). The client's side (requests out, responses in) is the tests'
// (tests/worker/kserve_client.h), and decodes tensors with the reader below: one parser.
//
// Request: {"id", "parameters": {...}, "inputs": [{"name", "shape", "datatype", "data"}],
// "outputs": [{"name", "parameters": {"binary_data": bool}}]}. `data` is flat or nested (a nested
// array must have exactly the request's shape). Datatypes: FP32 FP16 INT64 INT32 INT8 UINT8 BOOL.
// Numbers must be representable in the datatype (integers for INT*, in range; true/false for
// BOOL). Binary extension: the HTTP header Inference-Header-Content-Length gives the JSON
// prefix's length; each binary input carries `parameters.binary_data_size` (bytes, exactly
// numel * element size) and its bytes follow the JSON in input order, little-endian, with nothing
// left over. Every refusal is InvalidArgument whose message names the input, the value and what
// was expected; the parser never throws and never reads outside the body.
//
// Requests are read as a stream (ReadInferRequest): the JSON goes through a SAX parser that
// writes each element straight into its input's tensor, and a tensor is allocated only after its
// name, datatype and shape are known and admitted (the front end checks them against the model's
// declared inputs). So a request costs the bytes of the tensors it declares, not a document tree
// of its body (a 95 MB JSON body once took 2 GB as a tree). Tokens that would cost more than their
// bytes are refused as they arrive: nesting deeper than kKServeMaxJsonDepth, a string over 64 KiB,
// a number over 512 characters, more than 4096 inputs or requested outputs, a parameters object
// over 1 MiB of text. JSON object keys may come in any order; "data" that comes before its
// input's "shape" and "datatype" is held as parsed values, at most 2^20 of them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "src/kiln/base/status.h"
#include "src/kiln/eager/interpreter.h"
#include "src/kiln/graph/ir.h"
#include "src/kiln/tensor/tensor.h"

namespace kiln {

// The binary tensor extension's header (request and response).
inline constexpr const char* kInferenceHeaderContentLength = "Inference-Header-Content-Length";

// Limits that keep a hostile body from costing more than its size.
inline constexpr int kKServeMaxJsonDepth = 64;  // nesting of [ and { in the JSON part
inline constexpr int kKServeMaxRank = 16;       // dims per input shape
inline constexpr int64_t kKServeMaxElements = kMaxRequestInputElements;  // elements per input

// "FP32", "FP16", "INT64", "INT32", "INT8", "UINT8", "BOOL", "FP64".
const char* KServeDatatype(DType dtype);
// The DType of a KServe datatype name (case-sensitive, as the protocol says); InvalidArgument
// naming the supported ones otherwise.
Result<DType> DTypeFromKServe(const std::string& datatype);

struct InferRequest {
  std::string id;  // echoed in the response ("" when absent)
  TensorMap inputs;
  std::vector<std::string> input_order;  // the inputs' names as the body listed them
  // The outputs asked for, in request order; empty = every output of the model.
  std::vector<std::string> requested_outputs;
  std::set<std::string> binary_outputs;  // outputs asked for as binary (`binary_data`: true)
  bool binary_data_output = false;       // request `parameters.binary_data_output`: all binary
  // The request's `parameters`, each value as compact JSON text (e.g. "true", "\"x\"").
  std::map<std::string, std::string> parameters;
};

// A pull source of body bytes: fills up to `cap` bytes of `buf` and returns how many, 0 at the
// end. Its failures (a client that stopped sending) are returned by ReadInferRequest as they are.
using ByteSource = std::function<Result<size_t>(char* buf, size_t cap)>;

struct InferReadOptions {
  // The Inference-Header-Content-Length value (binary extension): the first json_length bytes are
  // JSON, the rest binary tensor data. nullopt: the whole body is JSON and no input is binary.
  std::optional<size_t> json_length;
  // The body's length when the transport said (Content-Length); bounds what a shape may ask for
  // before anything is allocated. Without it, `max_body_bytes` does.
  std::optional<uint64_t> body_size;
  uint64_t max_body_bytes = uint64_t{1} << 30;
  // Called once per input when its name, datatype and shape are known, before its tensor is
  // allocated; a refusal ends the read with that Status.
  std::function<Status(const std::string& name, DType dtype, const Shape& shape)> admit_input;
};

// Reads an infer request from `body` (see the header comment).
Result<InferRequest> ReadInferRequest(const ByteSource& body, const InferReadOptions& options);

// Parses an infer request held in memory: ReadInferRequest over `body`.
Result<InferRequest> ParseInferRequest(std::string_view body, std::optional<size_t> json_length);

// Parses the Inference-Header-Content-Length header value (decimal, no sign, <= body_size).
Result<size_t> ParseInferenceHeaderLength(const std::string& value, size_t body_size);

// Checks request inputs against the graph's declared inputs: every declared input present, no
// other name, dtype exact, rank exact, every known dim equal. InvalidArgument names the input,
// what came and what the model declares.
Status CheckInputsAgainstGraph(const Graph& graph, const TensorMap& inputs);

// The same check for one input, before its tensor exists: a declared name, its dtype, rank and
// known dims.
Status CheckInputAgainstGraph(const Graph& graph, const std::string& name, DType dtype,
                              const Shape& shape);

// What the serving wrapper said about one request, for the response's `parameters`.
struct InferOutcome {
  std::string serving_mode;
  std::string served_cell_ref;
  std::string fallback_reason;
  std::string fallback_detail;
  double duration_ms = 0;
};

struct EncodedInferResponse {
  std::string body;
  // Set when some output is binary: the JSON prefix's length, for the response header
  // Inference-Header-Content-Length. nullopt: the body is all JSON.
  std::optional<size_t> json_length;
};

// An infer response written as the transport pulls it: {"id", "model_name", "model_version",
// "outputs": [{"data" | "parameters": {"binary_data_size"}, "datatype", "name", "shape"}],
// "parameters": {"duration_ms", "fallback_detail", "fallback_reason", "served_cell_ref",
// "serving_mode"}} (keys in that order, compact, numbers as nlohmann::json writes them, NaN and
// infinities as null), then the binary outputs' bytes. Outputs: the requested ones in request
// order, else all of `outputs` by name. The text of each output's "data" is produced element by
// element from its tensor as the bytes are read, so an answer never exists whole as text: it
// costs its output tensors and a few KiB. Creating it counts the text once (for the length the
// transport sends first).
class InferResponseStream {
 public:
  // InvalidArgument names a requested output the model did not produce.
  static Result<std::unique_ptr<InferResponseStream>> Create(const std::string& model_name,
                                                             const std::string& model_version,
                                                             const InferRequest& request,
                                                             TensorMap outputs,
                                                             const InferOutcome& outcome);
  ~InferResponseStream();
  uint64_t size() const { return size_; }
  // Set when some output is binary: the JSON part's length (Inference-Header-Content-Length).
  std::optional<size_t> json_length() const { return json_length_; }
  // Writes up to `cap` bytes from `offset` into `buf` and returns how many (0 at the end).
  // Reads are sequential: `offset` must be where the previous read ended.
  Result<size_t> Read(uint64_t offset, char* buf, size_t cap);

 private:
  struct Segment;
  InferResponseStream() = default;
  TensorMap outputs_;
  std::vector<Segment> segments_;
  uint64_t size_ = 0;
  std::optional<size_t> json_length_;
  // Read position: the segment, bytes of it written, the next element, a half-written element.
  uint64_t at_ = 0;
  size_t segment_ = 0;
  uint64_t in_segment_ = 0;
  int64_t element_ = 0;
  char pending_[48] = {};
  size_t pending_len_ = 0, pending_at_ = 0;
};

// The whole response as one string: InferResponseStream's bytes (for tests and small answers).
Result<EncodedInferResponse> EncodeInferResponse(const std::string& model_name,
                                                 const std::string& model_version,
                                                 const InferRequest& request,
                                                 const TensorMap& outputs,
                                                 const InferOutcome& outcome);

// A tensor's elements as the flat KServe `data` array (floats as numbers, BOOL as true/false,
// integers exact): what the response encoder writes, and what a client sends.
nlohmann::json KServeJsonData(const Tensor& t);

}  // namespace kiln
