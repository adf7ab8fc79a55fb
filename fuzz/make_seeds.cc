// Writes the seed corpora of fuzz/corpus/<target>/ (fuzz/; a maintenance tool, not a test): small
// valid inputs made by kiln's own serializers and the test builders, so each seed is exactly what
// kiln writes or accepts today, plus a few refused ones. Seeds are named "ok-*" (must be accepted)
// or "bad-*" (must be refused); the replay tests hold the parsers to those names.
//
// Usage: ninja -C build fuzz_make_seeds && build/fuzz/fuzz_make_seeds fuzz/corpus
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "src/kiln/base/canonical_json.h"
#include "src/kiln/cell/key.h"
#include "src/kiln/cell/metadata.h"
#include "src/kiln/cell/pack.h"
#include "src/kiln/tensor/npy.h"
#include "src/kiln/tensor/safetensors.h"
#include "src/kiln/worker/kserve.h"
#include "tests/cell/cell_fixtures.h"
#include "tests/graph/onnx_builder.h"
#include "tests/worker/kserve_client.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

fs::path g_root;

void Write(const std::string& target, const std::string& name, const std::string& bytes) {
  const fs::path dir = g_root / target;
  fs::create_directories(dir);
  std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  KILN_CHECK(static_cast<bool>(out));
}

Tensor Bytes(DType dtype, Shape shape, const std::vector<uint8_t>& bytes) {
  return Tensor::FromBytes(dtype, std::move(shape), bytes.data(), bytes.size()).value();
}

void NpySeeds() {
  Write("npy", "ok-f32-2x3.npy",
        SerializeNpy(Tensor::FromVector<float>({2, 3}, {1, -2, 3.5f, 0, 1e-3f, 7})));
  Write("npy", "ok-i64-4.npy",
        SerializeNpy(Tensor::FromVector<int64_t>({4}, {1, -1, 1LL << 40, 0})));
  Write("npy", "ok-i32-scalar.npy", SerializeNpy(Tensor::Scalar<int32_t>(-7)));
  Write("npy", "ok-bool-2x2.npy", SerializeNpy(Bytes(DType::kBool, {2, 2}, {0, 1, 1, 0})));
  Write("npy", "ok-f16-3.npy",
        SerializeNpy(Bytes(DType::kFloat16, {3}, {0, 0x3c, 0, 0xc0, 0xff, 0x7b})));
  Write("npy", "ok-u8-empty.npy", SerializeNpy(Bytes(DType::kUInt8, {0, 3}, {})));
  Write("npy", "ok-i8-1x1x2.npy", SerializeNpy(Bytes(DType::kInt8, {1, 1, 2}, {0x80, 0x7f})));
  std::string v3 = SerializeNpy(Tensor::FromVector<float>({2}, {1, 2}));
  // Version 2.0: a 4-byte header length (numpy writes it when the header would not fit in 1.0).
  {
    const std::string header =
        v3.substr(10, static_cast<uint8_t>(v3[8]) | (static_cast<uint8_t>(v3[9]) << 8));
    std::string padded = header;
    padded.insert(padded.size() - 1, 62, ' ');  // 12 + length stays a multiple of 64
    std::string v2 = std::string("\x93NUMPY\x02\x00", 8);
    const uint32_t n = static_cast<uint32_t>(padded.size());
    for (int i = 0; i < 4; ++i) v2.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
    v2 += padded + v3.substr(10 + header.size());
    Write("npy", "ok-v2-f32-2.npy", v2);
  }
  Write("npy", "bad-truncated.npy", v3.substr(0, v3.size() - 3));
  // Fortran order matters only from rank 2 on (a 1-D array reads the same either way).
  std::string fortran = SerializeNpy(Tensor::FromVector<float>({2, 3}, {1, 2, 3, 4, 5, 6}));
  fortran.replace(fortran.find("False"), 5, "True ");
  Write("npy", "bad-fortran.npy", fortran);
}

void SafetensorsSeeds() {
  std::map<std::string, Tensor> ts;
  ts["w"] = Tensor::FromVector<float>({2, 2}, {1, 2, 3, 4});
  ts["b"] = Tensor::FromVector<int64_t>({2}, {5, -6});
  ts["mask"] = Bytes(DType::kBool, {3}, {1, 0, 1});
  ts["h"] = Bytes(DType::kFloat16, {1}, {0, 0x3c});
  ts["q"] = Bytes(DType::kInt8, {2}, {1, 0xff});
  ts["e"] = Bytes(DType::kUInt8, {0}, {});
  ts["i"] = Tensor::FromVector<int32_t>({1, 1}, {42});
  const std::string all = SerializeSafetensors(ts, {{"format", "pt"}, {"step", "7"}}).value();
  Write("safetensors", "ok-seven-dtypes.safetensors", all);
  Write("safetensors", "ok-one.safetensors",
        SerializeSafetensors({{"x", Tensor::FromVector<float>({3}, {1, 2, 3})}}).value());
  Write("safetensors", "ok-empty.safetensors", SerializeSafetensors({}).value());
  Write("safetensors", "bad-truncated.safetensors", all.substr(0, all.size() - 1));
}

void OnnxSeeds() {
  using testing::OnnxBuilder;
  {
    // MatMul + Add + Relu with weights as initializers, a Constant and a Reshape by shape input.
    OnnxBuilder b;
    b.Input("x", testing::kFloat, {-1, 4}).Output("y", testing::kFloat, {-1, 3});
    b.FloatInit("W", {4, 3}, std::vector<float>(12, 0.5f)).FloatInit("bias", {3}, {1, 2, 3});
    b.FloatConstant("k", {1}, {2.0f}).Int64Init("shape", {2}, {-1, 3});
    b.Node("MatMul", {"x", "W"}, {"m"}, "mm");
    b.Node("Add", {"m", "bias"}, {"a"}, "add");
    b.Node("Mul", {"a", "k"}, {"s"}, "scale");
    b.Node("Reshape", {"s", "shape"}, {"r"}, "reshape");
    b.Node("Relu", {"r"}, {"y"}, "relu");
    Write("onnx_import", "ok-mlp.onnx", b.Bytes());
  }
  {
    // Opset 9 forms: attributes where later opsets take inputs; nodes listed out of order.
    OnnxBuilder b(9);
    b.Input("x", testing::kFloat, {1, 2, 4, 4}).Output("y", testing::kFloat, {1, 2, 2, 2});
    b.FloatInit("scales", {4}, {1, 1, 2, 2});
    b.Node("Upsample", {"p", "scales"}, {"y"}, "up");
    auto& pool = b.Node("MaxPool", {"x"}, {"p"}, "pool");
    OnnxBuilder::IntsAttr(pool, "kernel_shape", {4, 4});
    OnnxBuilder::IntsAttr(pool, "strides", {4, 4});
    auto& sm = b.Node("Softmax", {"y"}, {"unused"}, "softmax");
    OnnxBuilder::IntAttr(sm, "axis", 1);
    Write("onnx_import", "ok-opset9.onnx", b.Bytes());
  }
  {
    // An If whose branches read an outer-scope value.
    OnnxBuilder b(13);
    b.Input("c", onnx::TensorProto::BOOL, {}).Input("x", testing::kFloat, {2});
    b.Output("y", testing::kFloat, {2});
    auto& n = b.Node("If", {"c"}, {"y"}, "if");
    for (const char* branch : {"then_branch", "else_branch"}) {
      auto* a = n.add_attribute();
      a->set_name(branch);
      a->set_type(onnx::AttributeProto::GRAPH);
      onnx::GraphProto* g = a->mutable_g();
      g->set_name(branch);
      auto* node = g->add_node();
      node->set_op_type(std::string(branch) == "then_branch" ? "Neg" : "Abs");
      node->add_input("x");
      node->add_output("o");
      auto* out = g->add_output();
      out->set_name("o");
      out->mutable_type()->mutable_tensor_type()->set_elem_type(testing::kFloat);
    }
    Write("onnx_import", "ok-if-outer-scope.onnx", b.Bytes());
  }
  {
    OnnxBuilder b;
    b.Input("x", testing::kFloat, {2}).Output("y", testing::kFloat, {2});
    auto* t = b.graph().add_initializer();
    t->set_name("w");
    t->set_data_type(onnx::TensorProto::FLOAT);
    t->add_dims(2);
    t->set_data_location(onnx::TensorProto::EXTERNAL);
    auto* kv = t->add_external_data();
    kv->set_key("location");
    kv->set_value("weights.bin");
    b.Node("Add", {"x", "w"}, {"y"});
    Write("onnx_import", "bad-external-missing.onnx", b.Bytes());
    const std::string ok = b.Bytes();
    Write("onnx_import", "bad-truncated.onnx", ok.substr(0, ok.size() / 2));
  }
}

void CellSeeds() {
  const CellMetadata m = cell_testing::SampleMetadata();
  const std::string json = SerializeMetadata(m).value();
  Write("cell_metadata", "ok-sample.json", json);
  Write("cell_metadata", "ok-sample-v4.json",
        SerializeMetadata(cell_testing::SampleMetadata("x86-64-v4")).value());
  Write("cell_metadata", "bad-unknown-field.json", json.substr(0, json.size() - 1) + ",\"zzz\":1}");
  // Partial coverage: a class that did not compile, then a ranged entry (always a gap).
  CellMetadata gapped = m;
  gapped.gaps.push_back(EntryGap{gapped.entries.back().shape_class, std::nullopt,
                                 "unimplemented: pass lower: no kernel"});
  gapped.entries.pop_back();
  Write("cell_metadata", "ok-gaps.json", SerializeMetadata(gapped).value());
  CellMetadata ranged = gapped;
  Envelope env = EnvelopeFromFacts(ranged.envelope).value();
  RangedEntry r;
  r.inputs["x"] = {DimSpec{0, "batch"}, DimSpec{8, ""}};
  r.ranges["batch"] = {16, 64};
  env.ranged.push_back(r);
  ranged.envelope = EnvelopeFacts(env).value();
  ranged.axes.envelope = FactsDigest(ranged.envelope).value();
  ranged.key = KeyFromAxes(ranged.axes).value();
  ranged.gaps.push_back(EntryGap{{}, r, "unimplemented: ranged entry is not compiled"});
  Write("cell_metadata", "ok-ranged-gap.json", SerializeMetadata(ranged).value());
  const std::string tar = cell_testing::SampleCellBytes(m);
  Write("cell_tar", "ok-sample.tar", tar);
  Write("cell_tar", "bad-truncated.tar", tar.substr(0, tar.size() - 512));
  CellMetadata unfenced = m;
  unfenced.fence.perturbed_checkpoint_matched = false;
  Write("cell_tar", "bad-fence-unproven.tar", cell_testing::SampleCellBytes(unfenced));
}

void ManifestSeeds() {
  Write("manifest", "ok-minimal.toml",
        "[endpoint]\nname = \"e\"\n\n[targets.mlp]\ngraph = \"mlp.onnx\"\n"
        "envelope = [{ x = [1, 64] }, { x = [4, 64] }]\n\n[functions.mlp]\ntarget = \"mlp\"\n");
  Write("manifest", "ok-full.toml", R"([endpoint]
name = "studio"
release = "2024-06-r1"
port = 9000
max_concurrency = 8
threads = 0

[hub]
url = "https://hub.internal:8443"
token = "t0ken"
trust = ["keys/hub.jwks"]
timeout_ms = 5000

[targets.denoiser]
graph = "unet/model.onnx"
checkpoint = "unet/finetune-7.safetensors"
lane = "mandatory"
export = { family = "acme/unet" }
numerics = { floor = 0.999, warn = 0.99999, retention = 0.999 }

[[targets.denoiser.envelope]]
latent = [1, 4, 64, 64]
timestep = [1]

[[targets.denoiser.envelope]]
latent = [2, 4, 64, 64]
timestep = [2]

[targets.decoder]
graph = "vae/model.onnx"
envelope = [{ z = [1, 4, 32, 32] }]
sm = "x86-64-v3"

[functions.unet]
target = "denoiser"
aliases = ["denoise", "unet-v7"]

[functions.vae]
target = "decoder"

[mint]
stall_window_s = 60
memory_budget_mb = 2048
parallel_compiles = 2
)");
  Write("manifest", "ok-ranged.toml",
        "[endpoint]\nname = \"e\"\n\n[targets.bert]\ngraph = \"bert.onnx\"\ncoverage = "
        "\"partial\"\nenvelope = [\n  { ids = [1, 8], mask = [1, 8] },\n  { ids = [\"batch\", "
        "\"seq\"], mask = [\"batch\", \"seq\"], ranges = { batch = [1, 8], seq = [9, 256] } "
        "},\n]\n\n[functions.bert]\ntarget = \"bert\"\n");
  Write(
      "manifest", "bad-typo.toml",
      "[endpoint]\nname = \"e\"\n\n[targets.mlp]\ngraph = \"mlp.onnx\"\nenvelop = [{ x = [1] }]\n");
}

void KServeSeeds() {
  TensorMap inputs;
  inputs["x"] = Tensor::FromVector<float>({2, 2}, {1, -2, 0.5f, 3});
  inputs["ids"] = Tensor::FromVector<int64_t>({3}, {1, 2, 3});
  inputs["m"] = Bytes(DType::kBool, {2}, {1, 0});
  inputs["h"] = Bytes(DType::kFloat16, {1}, {0, 0x3c});
  inputs["q"] = Bytes(DType::kInt8, {1}, {0xfe});
  inputs["u"] = Bytes(DType::kUInt8, {2}, {0, 255});
  inputs["i"] = Tensor::FromVector<int32_t>({1}, {-9});
  Write("kserve_request", "ok-json.json", EncodeInferRequest(inputs, false, "req-1").body);
  const EncodedInferRequest bin = EncodeInferRequest(inputs, true, "req-2");
  Write("kserve_request", "ok-binary.bin",
        "H:" + std::to_string(*bin.json_length) + "\n" + bin.body);
  Write("kserve_request", "ok-nested.json",
        R"({"id":"n","parameters":{"binary_data_output":false,"priority":2},)"
        R"("inputs":[{"name":"x","shape":[2,2],"datatype":"FP32","data":[[1,2],[3,4.5]]}],)"
        R"("outputs":[{"name":"y","parameters":{"binary_data":true}}]})");
  Write("kserve_request", "bad-wrong-count.json",
        R"({"inputs":[{"name":"x","shape":[3],"datatype":"INT32","data":[1,2]}]})");
  Write("kserve_request", "bad-binary-short.bin",
        "H:" + std::to_string(*bin.json_length) + "\n" + bin.body.substr(0, bin.body.size() - 1));
  // The streaming reader's own paths: keys in any order, data before its shape (kept, then
  // replayed), unknown keys passed over, a nested array cut short, a scalar where an array is due.
  Write("kserve_request", "ok-data-before-shape.json",
        R"({"outputs":[{"name":"y"}],"inputs":[{"data":[[1,2],[3,4]],"extra":{"k":[1,{"m":2}]},)"
        R"("datatype":"INT64","shape":[2,2],"name":"a"},{"name":"b","shape":[],"datatype":"BOOL",)"
        R"("data":[true]}],"id":"o"})");
  Write("kserve_request", "bad-nested-short.json",
        R"({"inputs":[{"name":"x","shape":[2,3],"datatype":"FP32","data":[[1,2,3],[4,5]]}]})");
  Write("kserve_request", "bad-scalar-for-array.json",
        R"({"inputs":[{"name":"x","shape":[2,2],"datatype":"FP32","data":[[1,2],3]}]})");
  Write("kserve_request", "bad-duplicate-key.json",
        R"({"inputs":[{"name":"x","name":"y","shape":[1],"datatype":"FP32","data":[1]}]})");
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_ROOT (fuzz/corpus)\n", argv[0]);
    return 2;
  }
  kiln::g_root = argv[1];
  kiln::NpySeeds();
  kiln::SafetensorsSeeds();
  kiln::OnnxSeeds();
  kiln::CellSeeds();
  kiln::ManifestSeeds();
  kiln::KServeSeeds();
  return 0;
}
