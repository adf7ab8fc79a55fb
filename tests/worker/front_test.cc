// Tests for the KServe v2 codec (src/kiln/worker/kserve.h) and the worker front end
// (src/kiln/worker/front.h): a Frontend on a loopback port serving the mlp example eager, hit
// with cpp-httplib's client — health, metadata, JSON and binary infer against the reference
// outputs, typed 400/404/503 answers, metrics, events, admin routes, and a fuzzed request body.
#include "src/kiln/worker/front.h"

#include <gtest/gtest.h>
#include <httplib.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "src/kiln/base/file.h"
#include "src/kiln/graph/checkpoint.h"
#include "src/kiln/graph/onnx_import.h"
#include "src/kiln/tensor/npy.h"
#include "src/kiln/tensor/safetensors.h"
#include "src/kiln/worker/kserve.h"
#include "tests/net/raw_client.h"
#include "tests/worker/kserve_client.h"

namespace kiln {
namespace {

using nlohmann::json;

const std::string kMlp = std::string(KILN_SOURCE_DIR) + "/examples/mlp/";

float MaxAbsDiff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  if (a.shape() != b.shape()) return INFINITY;
  float m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    m = std::max(m, static_cast<float>(std::fabs(a.GetAsDouble(i) - b.GetAsDouble(i))));
  }
  return m;
}

// ---------------------------------------------------------------------------------------------
// Codec

TEST(KServeCodec, ParsesFlatAndNestedData) {
  auto flat = ParseInferRequest(
      R"({"id":"r1","inputs":[{"name":"x","shape":[2,2],"datatype":"FP32","data":[1,2.5,3,4]}]})",
      std::nullopt);
  ASSERT_TRUE(flat.ok()) << flat.status().ToString();
  EXPECT_EQ(flat->id, "r1");
  const Tensor& x = flat->inputs.at("x");
  EXPECT_EQ(x.shape(), (Shape{2, 2}));
  EXPECT_FLOAT_EQ(x.data<float>()[1], 2.5f);

  auto nested = ParseInferRequest(
      R"({"inputs":[{"name":"i","shape":[2,2],"datatype":"INT64","data":[[1,2],[3,-4]]},
                    {"name":"b","shape":[3],"datatype":"BOOL","data":[true,false,true]},
                    {"name":"h","shape":[1],"datatype":"FP16","data":[0.5]}]})",
      std::nullopt);
  ASSERT_TRUE(nested.ok()) << nested.status().ToString();
  EXPECT_EQ(nested->inputs.at("i").data<int64_t>()[3], -4);
  EXPECT_EQ(nested->inputs.at("b").data<uint8_t>()[1], 0);
  EXPECT_FLOAT_EQ(HalfToFloat(nested->inputs.at("h").data<uint16_t>()[0]), 0.5f);
  EXPECT_EQ(nested->input_order, (std::vector<std::string>{"i", "b", "h"}));
}

void ExpectRefused(const std::string& body, const std::string& needle) {
  auto r = ParseInferRequest(body, std::nullopt);
  ASSERT_FALSE(r.ok()) << body;
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find(needle), std::string::npos)
      << "message: " << r.status().message() << "\nwanted: " << needle;
}

TEST(KServeCodec, TypedRefusals) {
  ExpectRefused("{nope", "not valid JSON");
  ExpectRefused("[]", "expected a JSON object");
  ExpectRefused(R"({"inputs":{}})", "no \"inputs\" array");
  ExpectRefused(R"({"inputs":[{"name":"x","shape":[3],"datatype":"FP32","data":[1,2]}]})",
                "input 'x' has 2 data elements; shape [3] needs 3");
  ExpectRefused(R"({"inputs":[{"name":"x","shape":[1],"datatype":"FP8","data":[1]}]})",
                "input 'x': datatype \"FP8\" is not supported");
  ExpectRefused(R"({"inputs":[{"name":"x","shape":[2],"datatype":"FP32","data":[1,"a"]}]})",
                "input 'x' data[1] is \"a\"; FP32 expects a number");
  ExpectRefused(R"({"inputs":[{"name":"x","shape":[1],"datatype":"INT8","data":[300]}]})",
                "INT8 expects an integer in [-128, 127]");
  ExpectRefused(R"({"inputs":[{"name":"x","shape":[1],"datatype":"INT32","data":[1.5]}]})",
                "INT32 expects an integer");
  ExpectRefused(R"({"inputs":[{"name":"x","shape":[1],"datatype":"BOOL","data":[1]}]})",
                "BOOL expects true or false");
  ExpectRefused(R"({"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[1]},
                              {"name":"x","shape":[1],"datatype":"FP32","data":[1]}]})",
                "input 'x' appears more than once");
  ExpectRefused(R"({"inputs":[{"name":"x","shape":[2,2],"datatype":"FP32","data":[[1,2],[3]]}]})",
                "expects 2 at dim 1");
  ExpectRefused(R"({"inputs":[{"name":"x","shape":[-1],"datatype":"FP32","data":[1]}]})",
                "shape[0] is -1");
  ExpectRefused(R"({"inputs":[{"name":"x","shape":[4294967296],"datatype":"FP32","data":[]}]})",
                "needs 4294967296 data elements");
  ExpectRefused(R"({"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[1e300]}]})",
                "within its range");
  ExpectRefused(R"({"inputs":[{"name":"x","shape":[1],"datatype":"FP32",
                               "parameters":{"binary_data_size":4}}]})",
                "no Inference-Header-Content-Length header");
  ExpectRefused(std::string(100, '[') + std::string(100, ']'), "nested deeper than");
}

// ReadInferRequest over a body handed out in small pieces; *consumed counts the bytes taken.
Result<InferRequest> ReadInPieces(const std::string& body, const InferReadOptions& o,
                                  size_t* consumed = nullptr, size_t piece = 7) {
  size_t at = 0;
  ByteSource source = [&](char* buf, size_t cap) -> Result<size_t> {
    const size_t n = std::min({cap, piece, body.size() - at});
    std::memcpy(buf, body.data() + at, n);
    at += n;
    return n;
  };
  auto r = ReadInferRequest(source, o);
  if (consumed) *consumed = at;
  return r;
}

TEST(KServeStream, KeysInAnyOrderAndDataBeforeItsShape) {
  InferReadOptions o;
  auto r = ReadInPieces(
      R"({"outputs":[{"name":"y"}],"inputs":[{"data":[[1,2],[3,4]],"extra":{"x":[1]},"datatype":"INT32",)"
      R"("shape":[2,2],"name":"a"},{"name":"b","shape":[3],"datatype":"FP32","data":[0.5,1,2]}],)"
      R"("id":"z","parameters":{"k":[1,{"m":2}]}})",
      o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->id, "z");
  EXPECT_EQ(r->inputs.at("a").data<int32_t>()[3], 4);
  EXPECT_FLOAT_EQ(r->inputs.at("b").data<float>()[0], 0.5f);
  EXPECT_EQ(r->input_order, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(r->requested_outputs, (std::vector<std::string>{"y"}));
  EXPECT_EQ(r->parameters.at("k"), R"([1,{"m":2}])");
}

TEST(KServeStream, AdmissionRefusesBeforeTheTensorExistsAndTheRestIsNotRead) {
  std::string body = R"({"inputs":[{"name":"x","shape":[1000000,64],"datatype":"FP32","data":[)";
  for (int i = 0; i < 200000; ++i) body += "0.25,";
  body += "0]}]}";
  InferReadOptions o;
  int admitted = 0;
  o.admit_input = [&](const std::string& name, DType, const Shape& shape) {
    ++admitted;
    return Status::InvalidArgument("input '" + name + "' is too big: " + ShapeToString(shape));
  };
  size_t consumed = 0;
  auto r = ReadInPieces(body, o, &consumed, 4096);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("too big"), std::string::npos) << r.status().message();
  EXPECT_EQ(admitted, 1);
  EXPECT_LT(consumed, size_t{128} << 10) << "read " << consumed << " of " << body.size();
}

TEST(KServeStream, TokensThatCostMoreThanTheirBytesAreRefusedAsTheyArrive) {
  InferReadOptions o;
  auto longstr = ReadInPieces(R"({"id":")" + std::string(70000, 'a') + R"(","inputs":[]})", o);
  ASSERT_FALSE(longstr.ok());
  EXPECT_NE(longstr.status().message().find("string is longer than"), std::string::npos);
  auto longnum = ReadInPieces(R"({"inputs":[],"x":)" + std::string(600, '1') + "}", o);
  ASSERT_FALSE(longnum.ok());
  EXPECT_NE(longnum.status().message().find("number or literal is longer than"), std::string::npos);
  std::string many = R"({"outputs":[)";
  for (int i = 0; i < 5000; ++i) many += R"({"name":"o)" + std::to_string(i) + R"("},)";
  many.back() = ']';
  auto outs = ReadInPieces(many + R"(,"inputs":[]})", o);
  ASSERT_FALSE(outs.ok());
  EXPECT_NE(outs.status().message().find("more than 4096 outputs"), std::string::npos);
  // Keys the protocol does not define are passed over without being kept.
  std::string keys = R"({"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[1])";
  for (int i = 0; i < 20000; ++i) keys += ",\"k" + std::to_string(i) + "\":0";
  auto ok = ReadInPieces(keys + "}]}", o);
  EXPECT_TRUE(ok.ok()) << ok.status().ToString();
}

TEST(KServeStream, ATransportFailureIsReturnedWithItsToken) {
  const std::string body =
      EncodeInferRequest({{"x", Tensor::FromVector<float>({4}, {1, 2, 3, 4})}}, false).body;
  size_t at = 0;
  ByteSource source = [&](char* buf, size_t cap) -> Result<size_t> {
    if (at >= 10) return Status::Refused(StatusCode::kIOError, "body_timeout", "no bytes");
    const size_t n = std::min<size_t>(cap, 10);
    std::memcpy(buf, body.data(), n);
    at += n;
    return n;
  };
  auto r = ReadInferRequest(source, InferReadOptions());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().token(), "body_timeout");
}

TEST(KServeCodec, BinaryRoundTripAndRefusals) {
  TensorMap in;
  in["a"] = Tensor::FromVector<float>({2, 3}, {1, 2, 3, 4, 5, 6});
  in["b"] = Tensor::FromVector<int32_t>({2}, {7, -8});
  EncodedInferRequest enc = EncodeInferRequest(in, /*binary=*/true, "id7");
  ASSERT_TRUE(enc.json_length.has_value());
  auto parsed = ParseInferRequest(enc.body, enc.json_length);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->id, "id7");
  EXPECT_TRUE(parsed->binary_data_output);
  EXPECT_EQ(MaxAbsDiff(parsed->inputs.at("a"), in["a"]), 0.f);
  EXPECT_EQ(parsed->inputs.at("b").data<int32_t>()[1], -8);

  // Truncated and trailing binary data.
  auto truncated = ParseInferRequest(enc.body.substr(0, enc.body.size() - 1), enc.json_length);
  ASSERT_FALSE(truncated.ok());
  EXPECT_NE(truncated.status().message().find("truncated"), std::string::npos)
      << truncated.status().message();
  auto trailing = ParseInferRequest(enc.body + "xx", enc.json_length);
  ASSERT_FALSE(trailing.ok());
  EXPECT_NE(trailing.status().message().find("2 bytes of binary data follow"), std::string::npos)
      << trailing.status().message();
  EXPECT_FALSE(ParseInferRequest(enc.body, enc.body.size() + 1).ok());
  EXPECT_FALSE(ParseInferenceHeaderLength("12x", 100).ok());
  EXPECT_FALSE(ParseInferenceHeaderLength("101", 100).ok());

  // Response encode/decode, JSON and binary.
  InferOutcome outcome{"eager", "", "uncompiled", "", 1.5};
  InferRequest req;
  req.id = "q";
  auto json_resp = EncodeInferResponse("m", "1", req, in, outcome);
  ASSERT_TRUE(json_resp.ok());
  EXPECT_FALSE(json_resp->json_length.has_value());
  auto dec = DecodeInferResponse(json_resp->body, std::nullopt);
  ASSERT_TRUE(dec.ok()) << dec.status().ToString();
  EXPECT_EQ(dec->parameters.at("serving_mode"), "eager");
  EXPECT_EQ(dec->parameters.at("fallback_reason"), "uncompiled");
  EXPECT_EQ(MaxAbsDiff(dec->outputs.at("a"), in["a"]), 0.f);
  req.binary_data_output = true;
  auto bin_resp = EncodeInferResponse("m", "1", req, in, outcome);
  ASSERT_TRUE(bin_resp.ok());
  ASSERT_TRUE(bin_resp->json_length.has_value());
  auto bdec = DecodeInferResponse(bin_resp->body, bin_resp->json_length);
  ASSERT_TRUE(bdec.ok()) << bdec.status().ToString();
  EXPECT_EQ(bdec->outputs.at("b").data<int32_t>()[0], 7);
  req.requested_outputs = {"zzz"};
  EXPECT_FALSE(EncodeInferResponse("m", "1", req, in, outcome).ok());
}

// The response as a document tree would write it (what the worker answered before responses
// were streamed): the streamed bytes must be these, byte for byte.
std::string TreeEncodedResponse(const std::string& model, const InferRequest& req,
                                const TensorMap& outputs, const InferOutcome& o) {
  std::vector<std::string> names = req.requested_outputs;
  if (names.empty()) {
    for (const auto& [n, t] : outputs) names.push_back(n);
  }
  json j = json::object();
  j["model_name"] = model;
  j["model_version"] = "1";
  if (!req.id.empty()) j["id"] = req.id;
  json outs = json::array();
  std::string binary;
  for (const std::string& name : names) {
    const Tensor& t = outputs.at(name);
    json out = {{"name", name}, {"shape", t.shape()}, {"datatype", KServeDatatype(t.dtype())}};
    if (req.binary_data_output || req.binary_outputs.count(name)) {
      out["parameters"] = json{{"binary_data_size", t.nbytes()}};
      binary.append(static_cast<const char*>(t.raw_data()), t.nbytes());
    } else {
      json data = json::array();
      for (int64_t i = 0; i < t.numel(); ++i) {
        if (t.dtype() == DType::kFloat32) {
          data.push_back(static_cast<double>(t.data<float>()[i]));
        } else if (t.dtype() == DType::kFloat16) {
          data.push_back(static_cast<double>(HalfToFloat(t.data<uint16_t>()[i])));
        } else if (t.dtype() == DType::kFloat64) {
          data.push_back(t.data<double>()[i]);
        } else if (t.dtype() == DType::kBool) {
          data.push_back(t.data<uint8_t>()[i] != 0);
        } else if (t.dtype() == DType::kUInt64) {
          data.push_back(t.data<uint64_t>()[i]);
        } else {
          data.push_back(t.GetAsInt64(i));
        }
      }
      out["data"] = std::move(data);
    }
    outs.push_back(std::move(out));
  }
  j["outputs"] = std::move(outs);
  j["parameters"] = {{"serving_mode", o.serving_mode},
                     {"served_cell_ref", o.served_cell_ref},
                     {"fallback_reason", o.fallback_reason},
                     {"fallback_detail", o.fallback_detail},
                     {"duration_ms", o.duration_ms}};
  return j.dump(-1, ' ', false, json::error_handler_t::replace) + binary;
}

TEST(KServeCodec, StreamedResponsesAreTheDocumentTreesBytesReadInAnyPieces) {
  TensorMap out;
  out["f"] = Tensor::FromVector<float>(
      {2, 4}, {0.1f, -0.0f, 1e-45f, 3.4028235e38f, NAN, INFINITY, -INFINITY, 123456.789f});
  out["d"] = Tensor::FromVector<double>({3}, {1.0 / 3.0, -1e300, 0.0});
  const uint16_t halves[2] = {FloatToHalf(0.5f), FloatToHalf(-65504.f)};
  out["h"] = Tensor::FromBytes(DType::kFloat16, {2}, halves, sizeof(halves)).value();
  out["i"] = Tensor::FromVector<int64_t>({3}, {INT64_MIN, -1, INT64_MAX});
  out["u"] = Tensor::FromVector<uint64_t>({1}, {UINT64_MAX});
  const uint8_t bools[2] = {1, 0};
  out["b"] = Tensor::FromBytes(DType::kBool, {2}, bools, sizeof(bools)).value();
  out["e"] = Tensor::FromVector<float>({0, 3}, {});
  out["s"] = Tensor::FromVector<int8_t>({}, {-7});
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> dist(-1e6f, 1e6f);
  std::vector<float> many(20000);
  for (float& v : many) v = dist(rng);
  out["many"] = Tensor::FromVector<float>({100, 200}, many);
  const InferOutcome outcome{"aot_cell", "ck1-x@sha256:y", "", "detail \"quoted\"\n", 2.25};
  std::vector<InferRequest> requests(4);
  requests[1].id = "id-\u00e9";
  requests[2].requested_outputs = {"many", "f", "b"};
  requests[2].binary_outputs = {"f"};
  requests[3].binary_data_output = true;
  for (size_t r = 0; r < requests.size(); ++r) {
    const std::string want = TreeEncodedResponse("m", requests[r], out, outcome);
    auto whole = EncodeInferResponse("m", "1", requests[r], out, outcome);
    ASSERT_TRUE(whole.ok()) << whole.status().ToString();
    EXPECT_EQ(whole->body, want) << "request " << r;
    for (size_t piece : {size_t{1}, size_t{7}, size_t{47}, size_t{4096}}) {
      auto stream = InferResponseStream::Create("m", "1", requests[r], out, outcome);
      ASSERT_TRUE(stream.ok());
      ASSERT_EQ((*stream)->size(), want.size());
      std::string got;
      std::vector<char> buf(piece);
      while (true) {
        auto n = (*stream)->Read(got.size(), buf.data(), buf.size());
        ASSERT_TRUE(n.ok()) << n.status().ToString();
        if (*n == 0) break;
        got.append(buf.data(), *n);
      }
      EXPECT_EQ(got, want) << "request " << r << " read in pieces of " << piece;
    }
  }
  // Reads are sequential.
  auto stream = InferResponseStream::Create("m", "1", requests[0], out, outcome);
  char c[8];
  EXPECT_FALSE((*stream)->Read(3, c, sizeof(c)).ok());
}

TEST(KServeCodec, Float64RoundTripsExactly) {
  auto parsed = ParseInferRequest(
      R"({"inputs":[{"name":"d","shape":[3],"datatype":"FP64","data":[0.1,-1e300,2]}]})",
      std::nullopt);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  const Tensor& d = parsed->inputs.at("d");
  ASSERT_EQ(d.dtype(), DType::kFloat64);
  EXPECT_EQ(d.data<double>()[0], 0.1);  // not 0.1f
  EXPECT_EQ(d.data<double>()[1], -1e300);
  EXPECT_STREQ(KServeDatatype(DType::kFloat64), "FP64");
  ExpectRefused(R"({"inputs":[{"name":"d","shape":[1],"datatype":"FP64","data":["x"]}]})",
                "input 'd' data[0] is \"x\"; FP64 expects a number");

  TensorMap in;
  in["d"] = Tensor::FromVector<double>({2}, {1.0 / 3.0, -1e300});
  for (bool binary : {false, true}) {
    SCOPED_TRACE(binary ? "binary" : "json");
    EncodedInferRequest enc = EncodeInferRequest(in, binary, "f64");
    auto back = ParseInferRequest(enc.body, enc.json_length);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    const Tensor& t = back->inputs.at("d");
    ASSERT_EQ(t.dtype(), DType::kFloat64);
    EXPECT_EQ(t.data<double>()[0], 1.0 / 3.0);
    EXPECT_EQ(t.data<double>()[1], -1e300);

    InferRequest req;
    req.binary_data_output = binary;
    auto resp = EncodeInferResponse("m", "1", req, in, {"eager", "", "uncompiled", "", 1.0});
    ASSERT_TRUE(resp.ok()) << resp.status().ToString();
    auto dec = DecodeInferResponse(resp->body, resp->json_length);
    ASSERT_TRUE(dec.ok()) << dec.status().ToString();
    ASSERT_EQ(dec->outputs.at("d").dtype(), DType::kFloat64);
    EXPECT_EQ(dec->outputs.at("d").data<double>()[0], 1.0 / 3.0);
  }
}

TEST(KServeCodec, WideIntegersRoundTripOverTheirFullRange) {
  auto parsed = ParseInferRequest(
      R"({"inputs":[{"name":"u","shape":[2],"datatype":"UINT64","data":[18446744073709551615,3]},)"
      R"({"name":"s","shape":[2],"datatype":"INT16","data":[-32768,32767]},)"
      R"({"name":"w","shape":[1],"datatype":"UINT32","data":[4294967295]},)"
      R"({"name":"h","shape":[1],"datatype":"UINT16","data":[65535]}]})",
      std::nullopt);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->inputs.at("u").data<uint64_t>()[0], 18446744073709551615ull);
  EXPECT_EQ(parsed->inputs.at("s").data<int16_t>()[0], -32768);
  EXPECT_EQ(parsed->inputs.at("w").data<uint32_t>()[0], 4294967295u);
  EXPECT_EQ(parsed->inputs.at("h").data<uint16_t>()[0], 65535);
  ExpectRefused(R"({"inputs":[{"name":"h","shape":[1],"datatype":"UINT16","data":[65536]}]})",
                "input 'h' data[0] is 65536; UINT16 expects an integer in [0, 65535]");
  ExpectRefused(R"({"inputs":[{"name":"u","shape":[1],"datatype":"UINT64","data":[-1]}]})",
                "input 'u' data[0] is -1; UINT64 expects an integer in [0, 18446744073709551615]");

  TensorMap in;
  in["u"] = Tensor::FromVector<uint64_t>({2}, {18446744073709551615ull, 3});
  in["s"] = Tensor::FromVector<int16_t>({1}, {-32768});
  for (bool binary : {false, true}) {
    SCOPED_TRACE(binary ? "binary" : "json");
    EncodedInferRequest enc = EncodeInferRequest(in, binary, "wide");
    auto back = ParseInferRequest(enc.body, enc.json_length);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    ASSERT_EQ(back->inputs.at("u").dtype(), DType::kUInt64);
    EXPECT_EQ(back->inputs.at("u").data<uint64_t>()[0], 18446744073709551615ull);
    ASSERT_EQ(back->inputs.at("s").dtype(), DType::kInt16);
    EXPECT_EQ(back->inputs.at("s").data<int16_t>()[0], -32768);
  }
}

// ---------------------------------------------------------------------------------------------
// Front end

class FrontTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto g = ImportOnnxFile(kMlp + "model.onnx");
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    graph_ = std::make_shared<const Graph>(std::move(g).value());
    auto w = LoadCheckpoint(*graph_, kMlp + "checkpoint.safetensors", true);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    weights_ = *w;

    ServedTargetOptions opt;
    opt.name = "mlp";
    opt.events = &events_;
    auto t = ServedTarget::Create(opt, graph_, weights_);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    optional_ = std::move(t).value();

    ServedTargetOptions strict;
    strict.name = "strict";
    strict.lane_policy = LanePolicy::kMandatory;
    strict.events = &events_;
    auto s = ServedTarget::Create(strict, graph_, weights_);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    mandatory_ = std::move(s).value();

    checkpoint_dir_ = ::testing::TempDir() + "front_test_" + std::to_string(getpid());
    std::filesystem::create_directories(checkpoint_dir_);
    FrontendOptions fo;
    fo.port = 0;
    fo.max_concurrency = 2;
    fo.events = &events_;
    fo.max_body_bytes = size_t{8} << 20;
    fo.admin.port = 0;
    fo.admin.token = kAdminToken;
    fo.checkpoint_dir = checkpoint_dir_;
    auto f = Frontend::Create(
        fo, {{"mlp", {optional_.get(), graph_}}, {"strict", {mandatory_.get(), graph_}}},
        {{"mlp", "mlp"}, {"mlp-classifier", "mlp"}, {"mlp-strict", "strict"}});
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    front_ = std::move(f).value();
    ASSERT_TRUE(front_->Start().ok());
    ASSERT_GT(front_->port(), 0);
    client_ = std::make_unique<httplib::Client>("127.0.0.1", front_->port());
    client_->set_read_timeout(30, 0);
    admin_ = std::make_unique<httplib::Client>("127.0.0.1", front_->admin_port());
    admin_->set_read_timeout(30, 0);

    auto x = ReadNpy(kMlp + "inputs/x.npy");
    ASSERT_TRUE(x.ok()) << x.status().ToString();
    x_ = *x;
    auto logits = ReadNpy(kMlp + "outputs/logits.npy");
    ASSERT_TRUE(logits.ok()) << logits.status().ToString();
    logits_ = *logits;
  }
  void TearDown() override {
    client_.reset();
    admin_.reset();
    if (front_) front_->Stop();
    std::filesystem::remove_all(checkpoint_dir_);
  }
  static constexpr const char* kAdminToken = "front-test-operator";

  // POST an order to the admin listener with the operator token.
  httplib::Result Admin(const std::string& path, const std::string& body,
                        const std::string& token = kAdminToken) {
    httplib::Headers h;
    if (!token.empty()) h.emplace("Authorization", "Bearer " + token);
    return admin_->Post(path.c_str(), h, body, "application/json");
  }

  std::string InputName() const { return graph_->inputs.at(0).name; }
  std::string OutputName() const { return graph_->outputs.at(0).name; }

  httplib::Result PostJson(const std::string& path, const std::string& body) {
    return client_->Post(path.c_str(), body, "application/json");
  }
  httplib::Result Infer(const std::string& model, const TensorMap& inputs, bool binary) {
    EncodedInferRequest enc = EncodeInferRequest(inputs, binary, "req-1");
    httplib::Headers h;
    if (enc.json_length) {
      h.emplace(kInferenceHeaderContentLength, std::to_string(*enc.json_length));
    }
    return client_->Post(("/v2/models/" + model + "/infer").c_str(), h, enc.body,
                         binary ? "application/octet-stream" : "application/json");
  }
  Result<DecodedInferResponse> Decode(const httplib::Result& res) {
    std::optional<size_t> len;
    if (res->has_header(kInferenceHeaderContentLength)) {
      len = std::stoull(res->get_header_value(kInferenceHeaderContentLength));
    }
    return DecodeInferResponse(res->body, len);
  }
  std::string ErrorOf(const httplib::Result& res) {
    json j = json::parse(res->body, nullptr, false);
    if (j.is_discarded() || !j.contains("error")) return "<no error field: " + res->body + ">";
    return j["error"].get<std::string>();
  }

  EventLog events_;
  std::shared_ptr<const Graph> graph_;
  WeightMap weights_;
  std::unique_ptr<ServedTarget> optional_;
  std::unique_ptr<ServedTarget> mandatory_;
  std::unique_ptr<Frontend> front_;
  std::unique_ptr<httplib::Client> client_;
  std::unique_ptr<httplib::Client> admin_;
  std::string checkpoint_dir_;
  Tensor x_;
  Tensor logits_;
};

TEST_F(FrontTest, HealthAndMetadata) {
  auto live = client_->Get("/v2/health/live");
  ASSERT_TRUE(live);
  EXPECT_EQ(live->status, 200);
  // The mandatory target has no cell: the endpoint is not ready, and says why.
  auto ready = client_->Get("/v2/health/ready");
  ASSERT_TRUE(ready);
  EXPECT_EQ(ready->status, 503);
  EXPECT_NE(ready->body.find("strict"), std::string::npos) << ready->body;
  auto mready = client_->Get("/v2/models/mlp/ready");
  ASSERT_TRUE(mready);
  EXPECT_EQ(mready->status, 200);
  auto sready = client_->Get("/v2/models/mlp-strict/ready");
  ASSERT_TRUE(sready);
  EXPECT_EQ(sready->status, 503);

  auto meta = client_->Get("/v2/models/mlp-classifier");
  ASSERT_TRUE(meta);
  ASSERT_EQ(meta->status, 200) << meta->body;
  json m = json::parse(meta->body);
  EXPECT_EQ(m["name"], "mlp-classifier");
  EXPECT_EQ(m["platform"], "kiln");
  ASSERT_EQ(m["inputs"].size(), 1u);
  EXPECT_EQ(m["inputs"][0]["name"], InputName());
  EXPECT_EQ(m["inputs"][0]["datatype"], "FP32");
  EXPECT_EQ(m["inputs"][0]["shape"].back(), 64);
  EXPECT_EQ(m["outputs"][0]["name"], OutputName());
  EXPECT_EQ(m["parameters"]["target"], "mlp");
  EXPECT_EQ(m["parameters"]["lane"], "optional");

  auto server = client_->Get("/v2");
  ASSERT_TRUE(server);
  EXPECT_NE(server->body.find("binary_tensor_data"), std::string::npos);
  auto unknown = client_->Get("/v2/models/nope");
  ASSERT_TRUE(unknown);
  EXPECT_EQ(unknown->status, 404);
  EXPECT_NE(ErrorOf(unknown).find("model 'nope' is not served"), std::string::npos);
}

TEST_F(FrontTest, InferJsonAndBinaryMatchReference) {
  for (bool binary : {false, true}) {
    SCOPED_TRACE(binary ? "binary" : "json");
    auto res = Infer("mlp", {{InputName(), x_}}, binary);
    ASSERT_TRUE(res);
    ASSERT_EQ(res->status, 200) << res->body;
    EXPECT_EQ(res->has_header(kInferenceHeaderContentLength), binary);
    auto dec = Decode(res);
    ASSERT_TRUE(dec.ok()) << dec.status().ToString();
    EXPECT_EQ(dec->model_name, "mlp");
    EXPECT_EQ(dec->id, "req-1");
    EXPECT_EQ(dec->parameters.at("serving_mode"), "eager");
    EXPECT_EQ(dec->parameters.at("served_cell_ref"), "");
    EXPECT_FALSE(dec->parameters.at("fallback_reason").empty());
    EXPECT_EQ(dec->parameters.at("fallback_reason"), optional_->Posture());
    ASSERT_TRUE(dec->outputs.count(OutputName()));
    EXPECT_LE(MaxAbsDiff(dec->outputs.at(OutputName()), logits_), 1e-4f);
  }
  // An alias answers too, with a versioned path.
  auto alias = Infer("mlp-classifier/versions/1", {{InputName(), x_}}, false);
  ASSERT_TRUE(alias);
  EXPECT_EQ(alias->status, 200) << alias->body;
  auto badver = Infer("mlp-classifier/versions/9", {{InputName(), x_}}, false);
  ASSERT_TRUE(badver);
  EXPECT_EQ(badver->status, 404);
}

TEST_F(FrontTest, BadRequestsAreTyped) {
  const std::string path = "/v2/models/mlp/infer";
  // Wrong shape (dim 1 is 63, the model declares 64).
  std::vector<float> v(63, 0.f);
  auto shape = Infer("mlp", {{InputName(), Tensor::FromVector<float>({1, 63}, v)}}, false);
  ASSERT_TRUE(shape);
  EXPECT_EQ(shape->status, 400);
  EXPECT_NE(ErrorOf(shape).find("dim 1 is 63"), std::string::npos) << ErrorOf(shape);
  // Wrong dtype.
  std::vector<int64_t> iv(64, 1);
  auto dtype = Infer("mlp", {{InputName(), Tensor::FromVector<int64_t>({1, 64}, iv)}}, false);
  ASSERT_TRUE(dtype);
  EXPECT_EQ(dtype->status, 400);
  EXPECT_NE(ErrorOf(dtype).find("is INT64[1,64]; the model declares FP32"), std::string::npos)
      << ErrorOf(dtype);
  // Garbage JSON.
  auto garbage = PostJson(path, "{\"inputs\": [");
  ASSERT_TRUE(garbage);
  EXPECT_EQ(garbage->status, 400);
  EXPECT_NE(ErrorOf(garbage).find("not valid JSON"), std::string::npos) << ErrorOf(garbage);
  // Missing and extra inputs.
  auto missing = PostJson(path, R"({"inputs":[]})");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 400);
  EXPECT_NE(ErrorOf(missing).find("is missing"), std::string::npos) << ErrorOf(missing);
  // Unknown requested output.
  auto outs = PostJson(
      path,
      json{{"inputs", json::parse(EncodeInferRequest({{InputName(), x_}}, false).body)["inputs"]},
           {"outputs", {{{"name", "nope"}}}}}
          .dump());
  ASSERT_TRUE(outs);
  EXPECT_EQ(outs->status, 400);
  EXPECT_NE(ErrorOf(outs).find("output 'nope'"), std::string::npos) << ErrorOf(outs);
  // Truncated binary body.
  EncodedInferRequest enc = EncodeInferRequest({{InputName(), x_}}, true);
  httplib::Headers h{{kInferenceHeaderContentLength, std::to_string(*enc.json_length)}};
  auto trunc = client_->Post(path.c_str(), h, enc.body.substr(0, enc.body.size() - 10),
                             "application/octet-stream");
  ASSERT_TRUE(trunc);
  EXPECT_EQ(trunc->status, 400);
  EXPECT_NE(ErrorOf(trunc).find("truncated"), std::string::npos) << ErrorOf(trunc);
  // Unknown model.
  auto unknown = Infer("nope", {{InputName(), x_}}, false);
  ASSERT_TRUE(unknown);
  EXPECT_EQ(unknown->status, 404);
  // The worker keeps serving.
  auto ok = Infer("mlp", {{InputName(), x_}}, false);
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
}

TEST_F(FrontTest, MandatoryWithoutCellRefusesRetryably) {
  auto res = Infer("mlp-strict", {{InputName(), x_}}, false);
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 503) << res->body;
  EXPECT_TRUE(res->has_header("Retry-After"));
  EXPECT_EQ(ErrorOf(res), "required_compile_missing");
  // The operator's order overrides the lane: eager with operator_eager_only.
  auto on =
      Admin("/v1/admin/eager-only", R"({"target":"mlp-strict","on":true,"reason":"incident"})");
  ASSERT_TRUE(on);
  ASSERT_EQ(on->status, 200) << on->body;
  auto eager = Infer("mlp-strict", {{InputName(), x_}}, false);
  ASSERT_TRUE(eager);
  ASSERT_EQ(eager->status, 200) << eager->body;
  auto dec = Decode(eager);
  ASSERT_TRUE(dec.ok());
  EXPECT_EQ(dec->parameters.at("fallback_reason"), kPostureOperatorEagerOnly);
}

TEST_F(FrontTest, MetricsAndEvents) {
  ASSERT_TRUE(Infer("mlp", {{InputName(), x_}}, false));
  ASSERT_TRUE(Infer("mlp-strict", {{InputName(), x_}}, false));
  ASSERT_TRUE(PostJson("/v2/models/mlp/infer", "garbage"));
  auto metrics = client_->Get("/metrics");
  ASSERT_TRUE(metrics);
  ASSERT_EQ(metrics->status, 200);
  const std::string& m = metrics->body;
  EXPECT_NE(m.find("kiln_infer_requests_total{model=\"mlp\",serving_mode=\"eager\"} 1"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("kiln_infer_fallbacks_total{model=\"mlp\",reason=\""), std::string::npos);
  EXPECT_NE(m.find("kiln_infer_errors_total{model=\"mlp-strict\",code=\"503\"} 1"),
            std::string::npos);
  EXPECT_NE(m.find("kiln_infer_errors_total{model=\"mlp\",code=\"400\"} 1"), std::string::npos);
  EXPECT_NE(m.find("kiln_infer_duration_ms_count{model=\"mlp\"} 1"), std::string::npos);
  EXPECT_NE(m.find("kiln_cell_revoked{target=\"mlp\"} 0"), std::string::npos);

  auto all = client_->Get("/v1/events");
  ASSERT_TRUE(all);
  ASSERT_EQ(all->status, 200);
  json rows = json::parse(all->body);
  ASSERT_TRUE(rows.is_array());
  ASSERT_FALSE(rows.empty()) << "the eager serves should have emitted posture rows";
  const uint64_t first = rows[0]["seq"].get<uint64_t>();
  auto since = client_->Get(("/v1/events?since=" + std::to_string(first) + "&limit=1").c_str());
  ASSERT_TRUE(since);
  json later = json::parse(since->body);
  ASSERT_LE(later.size(), 1u);
  if (!later.empty()) {
    EXPECT_GT(later[0]["seq"].get<uint64_t>(), first);
  }
  auto kind = client_->Get("/v1/events?kind=serve_eager_posture");
  ASSERT_TRUE(kind);
  for (const auto& r : json::parse(kind->body)) {
    EXPECT_EQ(r["kind"], "serve_eager_posture");
  }
  auto bad = client_->Get("/v1/events?kind=nope");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  auto badlimit = client_->Get("/v1/events?limit=-1");
  ASSERT_TRUE(badlimit);
  EXPECT_EQ(badlimit->status, 400);
}

TEST_F(FrontTest, AdminEagerOnlyTogglesPosture) {
  const std::string before = optional_->Posture();
  // The serving listener has no admin route; the admin listener needs the operator's token.
  auto serving = PostJson("/v1/admin/eager-only", R"({"target":"mlp","on":true})");
  ASSERT_TRUE(serving);
  EXPECT_EQ(serving->status, 404);
  for (const std::string token : {"", "wrong-token"}) {
    auto anon = Admin("/v1/admin/eager-only", R"({"target":"mlp","on":true})", token);
    ASSERT_TRUE(anon);
    EXPECT_EQ(anon->status, 401) << anon->body;
    EXPECT_EQ(json::parse(anon->body)["token"], "unauthenticated");
  }
  EXPECT_FALSE(optional_->eager_only());
  auto on = Admin("/v1/admin/eager-only", R"({"target":"mlp","on":true,"reason":"drill"})");
  ASSERT_TRUE(on);
  ASSERT_EQ(on->status, 200) << on->body;
  EXPECT_EQ(json::parse(on->body)["posture"], kPostureOperatorEagerOnly);
  auto res = Infer("mlp", {{InputName(), x_}}, false);
  ASSERT_TRUE(res);
  auto dec = Decode(res);
  ASSERT_TRUE(dec.ok());
  EXPECT_EQ(dec->parameters.at("serving_mode"), "eager");
  EXPECT_EQ(dec->parameters.at("fallback_reason"), kPostureOperatorEagerOnly);
  auto off = Admin("/v1/admin/eager-only", R"({"target":"mlp-classifier","on":false})");
  ASSERT_TRUE(off);
  ASSERT_EQ(off->status, 200) << off->body;
  EXPECT_EQ(json::parse(off->body)["posture"], before);
  EXPECT_FALSE(optional_->eager_only());
  // Typed refusals.
  auto bad = Admin("/v1/admin/eager-only", R"({"target":"mlp","on":"yes"})");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  auto unknown = Admin("/v1/admin/eager-only", R"({"target":"zzz","on":true})");
  ASSERT_TRUE(unknown);
  EXPECT_EQ(unknown->status, 404);
}

TEST_F(FrontTest, AdminCheckpointSwapChangesOutputs) {
  auto derived = DeriveCheckpoint(*graph_, 7, 0.2);
  ASSERT_TRUE(derived.ok()) << derived.status().ToString();
  std::filesystem::create_directories(checkpoint_dir_ + "/ft");
  ASSERT_TRUE(WriteSafetensors(checkpoint_dir_ + "/ft/derived.safetensors", *derived).ok());

  auto swap = Admin("/v1/admin/checkpoint",
                    json{{"target", "mlp"}, {"path", "ft/derived.safetensors"}}.dump());
  ASSERT_TRUE(swap);
  ASSERT_EQ(swap->status, 200) << swap->body;
  auto res = Infer("mlp", {{InputName(), x_}}, true);
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  auto dec = Decode(res);
  ASSERT_TRUE(dec.ok());
  const Tensor& y = dec->outputs.at(OutputName());
  EXPECT_GT(MaxAbsDiff(y, logits_), 1e-3f) << "the swapped weights should change the outputs";
  // Same as the eager interpreter with the derived weights.
  auto interp = Interpreter::Create(graph_);
  ASSERT_TRUE(interp.ok());
  auto want = interp->Run({{InputName(), x_}}, &*derived);
  ASSERT_TRUE(want.ok()) << want.status().ToString();
  EXPECT_LE(MaxAbsDiff(y, want->at(OutputName())), 1e-4f);

  auto missing =
      Admin("/v1/admin/checkpoint", json{{"target", "mlp"}, {"path", "nope.safetensors"}}.dump());
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404) << missing->body;
}

TEST_F(FrontTest, AdminCheckpointPathsStayInsideTheCheckpointDirectory) {
  // A file outside the directory whose bytes must never come back, and links to it and to a
  // name that does not exist.
  const std::string secret = checkpoint_dir_ + "-secret";
  ASSERT_TRUE(WriteFileAtomic(secret, "SECRET-BYTES-1234").ok());
  std::filesystem::create_symlink(secret, checkpoint_dir_ + "/secret-link.safetensors");
  std::filesystem::create_symlink(checkpoint_dir_ + "-absent",
                                  checkpoint_dir_ + "/absent-link.safetensors");
  std::filesystem::create_symlink("../" + std::filesystem::path(secret).filename().string(),
                                  checkpoint_dir_ + "/relative-link.safetensors");
  std::map<std::string, std::string> bodies;
  for (const std::string& path : std::vector<std::string>{
           "../" + std::filesystem::path(secret).filename().string(), secret, "/etc/shadow",
           "a/../../x.safetensors", "secret-link.safetensors", "absent-link.safetensors",
           "relative-link.safetensors", std::string("x\0y", 3)}) {
    auto r = Admin("/v1/admin/checkpoint", json{{"target", "mlp"}, {"path", path}}.dump());
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 403) << path << ": " << r->body;
    EXPECT_EQ(json::parse(r->body)["token"], "checkpoint_path_refused") << r->body;
    EXPECT_EQ(r->body.find("SECRET"), std::string::npos) << r->body;
    EXPECT_EQ(r->body.find("17 bytes"), std::string::npos) << "the size leaked: " << r->body;
    bodies[path] = r->body;
  }
  // A link to an existing file and a link to nothing answer alike, but for their own names.
  std::string existing = bodies["secret-link.safetensors"],
              absent = bodies["absent-link.safetensors"];
  existing.replace(existing.find("secret-link"), 11, "X");
  absent.replace(absent.find("absent-link"), 11, "X");
  EXPECT_EQ(existing, absent);
  // A file inside that is not a checkpoint: refused by name, its bytes stay in the log.
  ASSERT_TRUE(WriteFileAtomic(checkpoint_dir_ + "/junk.safetensors", "JUNKJUNKJUNKJUNK").ok());
  auto junk =
      Admin("/v1/admin/checkpoint", json{{"target", "mlp"}, {"path", "junk.safetensors"}}.dump());
  ASSERT_TRUE(junk);
  EXPECT_EQ(junk->status, 400) << junk->body;
  EXPECT_EQ(json::parse(junk->body)["token"], "checkpoint_invalid");
  EXPECT_EQ(junk->body.find("JUNK"), std::string::npos) << junk->body;
  std::filesystem::remove(secret);
}

TEST_F(FrontTest, JsonBodyIsReadWhateverTheContentTypeAtAnySize) {
  // curl -d sends form-urlencoded; the body is still JSON, and bigger than 8 KB.
  const std::string body = EncodeInferRequest({{InputName(), x_}}, false).body;
  const std::string padded =
      body.substr(0, body.size() - 1) + ",\"pad\":\"" + std::string(20000, 'p') + "\"}";
  ASSERT_GT(padded.size(), 8192u);
  auto r = client_->Post("/v2/models/mlp/infer", padded, "application/x-www-form-urlencoded");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
}

TEST_F(FrontTest, BodyOverTheLimitIs413BeforeItIsReadAndTheWorkerServesOn) {
  // The fixture's worker takes bodies of at most 8 MiB: a declared 95 MB is refused from its
  // Content-Length, before a byte of it is read, and so is a length that does not parse.
  for (const std::string length : {"99614720", "2147483648"}) {
    net_testing::RawConn c(front_->port());
    const auto start = std::chrono::steady_clock::now();
    ASSERT_TRUE(c.Send("POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Length: " +
                       length + "\r\n\r\n{\"inputs\":["));
    auto a = c.Read(5000);
    EXPECT_EQ(a.status, 413) << length << ": " << a.body;
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 2);
  }
  net_testing::RawConn neg(front_->port());
  ASSERT_TRUE(
      neg.Send("POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n"));
  EXPECT_EQ(neg.Read(5000).status, 400);
  auto ok = Infer("mlp", {{InputName(), x_}}, false);
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
}

TEST_F(FrontTest, ModelOfStaticShapesBoundsItsBodyByItsInputs) {
  // mlp's input is FP32[batch, 64]: a dynamic batch, so the worker's limit applies.
  EXPECT_EQ(front_->service().BodyLimit("mlp"), uint64_t{8} << 20);
  // The same graph with its batch fixed to 1 takes at most its JSON size plus 1 MiB.
  auto fixed = std::make_shared<Graph>(*graph_);
  fixed->inputs.at(0).dims.at(0) = Dim{1, ""};
  WorkerServiceOptions so;
  so.max_body_bytes = uint64_t{1} << 30;
  auto svc = WorkerService::Create(so, {{"m", {optional_.get(), fixed}}}, {{"m", "m"}});
  ASSERT_TRUE(svc.ok()) << svc.status().ToString();
  EXPECT_EQ((*svc)->BodyLimit("m"), 64 * 64 + (uint64_t{1} << 20));
}

TEST_F(FrontTest, FuzzedBodiesNeverCrash) {
  const std::string valid = EncodeInferRequest({{InputName(), x_}}, false).body;
  const EncodedInferRequest bin = EncodeInferRequest({{InputName(), x_}}, true);
  const std::string alphabet = "{}[]\",:0123456789-.eE truefalsnul\\\x00\xff";
  std::mt19937_64 rng(12345);
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % std::max<size_t>(n, 1)); };
  int ok = 0, refused = 0;
  for (int i = 0; i < 2000; ++i) {
    const bool binary = i % 4 == 3;
    std::string body = binary ? bin.body : valid;
    const int edits = 1 + static_cast<int>(pick(4));
    for (int e = 0; e < edits && !body.empty(); ++e) {
      const size_t at = pick(body.size());
      switch (pick(6)) {
        case 0:  // flip a byte
          body[at] = static_cast<char>(rng());
          break;
        case 1:  // delete a run
          body.erase(at, 1 + pick(16));
          break;
        case 2:  // insert a JSON-significant character
          body.insert(at, 1, alphabet[pick(alphabet.size())]);
          break;
        case 3:  // truncate
          body.resize(at);
          break;
        case 4:  // duplicate a slice
          body.insert(at, body.substr(pick(body.size()), 1 + pick(32)));
          break;
        default:  // replace a digit with a huge number
          body.insert(at, "99999999999999999999");
          break;
      }
    }
    httplib::Headers h;
    if (binary) {
      const size_t len = pick(3) == 0 ? pick(body.size() + 10) : *bin.json_length;
      h.emplace(kInferenceHeaderContentLength, std::to_string(len));
    }
    auto res = client_->Post("/v2/models/mlp/infer", h, body, "application/json");
    ASSERT_TRUE(res) << "request " << i << " got no answer";
    const int s = res->status;
    ASSERT_TRUE(s == 200 || (s >= 400 && s < 500))
        << "request " << i << ": " << s << " " << res->body;
    (s == 200 ? ok : refused)++;
  }
  EXPECT_GT(refused, 1000);
  auto still = Infer("mlp", {{InputName(), x_}}, false);
  ASSERT_TRUE(still);
  EXPECT_EQ(still->status, 200);
}

TEST_F(FrontTest, StopDrainsAndRefusesLater) {
  auto res = Infer("mlp", {{InputName(), x_}}, false);
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  front_->Stop();
  EXPECT_EQ(front_->in_flight(), 0);
  auto after = client_->Get("/v2/health/live");
  EXPECT_FALSE(after) << "the listener should be closed after Stop()";
}

// A request whose values ask for more than its memory budget is its own fault: 413 with the token,
// never a retryable 503 or a 500 that would read as the worker's.
TEST(WorkerHttpStatusTest, RequestTooLargeIs413WithoutRetry) {
  const HttpRefusal h = WorkerHttpStatus(RequestTooLarge("ConstantOfShape 'fill': float32[...]"));
  EXPECT_EQ(h.status, 413);
  EXPECT_FALSE(h.retry);
  EXPECT_EQ(WorkerHttpStatus(Status::InvalidArgument("plain")).status, 400);
}

}  // namespace
}  // namespace kiln
