// ONNX importer tests: real example files, programmatic models, and bad input that must come
// back as a typed error naming the file/node/tensor — never a crash.
#include "src/kiln/graph/onnx_import.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>

#include "src/kiln/base/file.h"
#include "src/kiln/ops/verifier.h"
#include "tests/graph/onnx_builder.h"

namespace kiln {
namespace {

using testing::kFloat;
using testing::kInt64;
using testing::OnnxBuilder;

const std::string kExamples = std::string(KILN_SOURCE_DIR) + "/examples";

std::string TempDir() {
  char tmpl[] = "/tmp/kiln_import_XXXXXX";
  const char* d = mkdtemp(tmpl);
  return d ? d : "/tmp";
}

TEST(OnnxImport, ImportsExampleMlp) {
  auto g = ImportOnnxFile(kExamples + "/mlp/model.onnx");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  ASSERT_EQ(g->inputs.size(), 1u);
  EXPECT_EQ(g->inputs[0].name, "x");
  EXPECT_EQ(g->inputs[0].dtype, DType::kFloat32);
  ASSERT_EQ(g->inputs[0].dims.size(), 2u);
  EXPECT_FALSE(g->inputs[0].dims[0].known());  // "batch"
  EXPECT_EQ(g->inputs[0].dims[1].value, 64);
  EXPECT_EQ(g->outputs[0].name, "logits");
  EXPECT_EQ(g->opset(), 17);
  for (const Node& n : g->nodes) EXPECT_NE(n.op_type, "Constant") << "Constant nodes are lifted";
  EXPECT_EQ(g->WeightNames().size(), 9u);  // 6 Gemm tensors + 3 float Constants (GELU)
  EXPECT_TRUE(VerifyGraph(*g).ok());
}

TEST(OnnxImport, ImportsEveryExample) {
  for (const char* name : {"mlp", "micro-diffusion", "transformer"}) {
    auto g = ImportOnnxFile(kExamples + "/" + name + "/model.onnx");
    ASSERT_TRUE(g.ok()) << name << ": " << g.status().ToString();
    Status v = VerifyGraph(*g);
    EXPECT_TRUE(v.ok()) << name << ": " << v.ToString();
  }
}

TEST(OnnxImport, FloatConstantIsWeightIntConstantIsStructural) {
  OnnxBuilder b;
  b.Input("x", kFloat, {2, 3}).Output("y", kFloat, {3, 2});
  b.FloatConstant("scale", {}, {2.0f});
  b.Int64Constant("shape", {3, 2});
  b.Node("Mul", {"x", "scale"}, {"m"});
  b.Node("Reshape", {"m", "shape"}, {"y"});
  auto g = ImportOnnxBytes(b.Bytes(), "t");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  ASSERT_EQ(g->nodes.size(), 2u);
  EXPECT_EQ(g->initializers.at("scale").dtype(), DType::kFloat32);
  EXPECT_EQ(g->WeightNames(), std::vector<std::string>{"scale"});
  EXPECT_EQ(g->initializers.at("shape").ToInt64Vector(), (std::vector<int64_t>{3, 2}));
}

TEST(OnnxImport, ReadsDoubleTensorsFromDoubleDataAndRawData) {
  const int kDouble = onnx::TensorProto::DOUBLE;
  OnnxBuilder b;
  b.Input("x", kDouble, {2}).Output("y", kDouble, {2});
  auto* typed = b.graph().add_initializer();
  typed->set_name("w");
  typed->set_data_type(kDouble);
  typed->add_dims(2);
  typed->add_double_data(1.0 / 3.0);
  typed->add_double_data(-1e300);
  const double raw_values[2] = {0.1, 2.5};
  auto* raw = b.graph().add_initializer();
  raw->set_name("v");
  raw->set_data_type(kDouble);
  raw->add_dims(2);
  raw->set_raw_data(std::string(reinterpret_cast<const char*>(raw_values), sizeof(raw_values)));
  b.Node("Add", {"x", "w"}, {"t"});
  b.Node("Mul", {"t", "v"}, {"y"});
  auto g = ImportOnnxBytes(b.Bytes(), "d.onnx");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_TRUE(VerifyGraph(*g).ok());
  const Tensor& w = g->initializers.at("w");
  ASSERT_EQ(w.dtype(), DType::kFloat64);
  EXPECT_EQ(w.data<double>()[0], 1.0 / 3.0);
  EXPECT_EQ(w.data<double>()[1], -1e300);
  const Tensor& v = g->initializers.at("v");
  ASSERT_EQ(v.dtype(), DType::kFloat64);
  EXPECT_EQ(v.data<double>()[0], 0.1);
  // float64 initializers are checkpoint data, like float32 ones.
  EXPECT_EQ(g->WeightNames(), (std::vector<std::string>{"v", "w"}));

  OnnxBuilder short_data;
  short_data.Input("x", kDouble, {2}).Output("y", kDouble, {2});
  auto* s = short_data.graph().add_initializer();
  s->set_name("w");
  s->set_data_type(kDouble);
  s->add_dims(2);
  s->add_double_data(1.0);
  short_data.Node("Add", {"x", "w"}, {"y"});
  auto bad = ImportOnnxBytes(short_data.Bytes(), "d.onnx");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kCorruption);
  EXPECT_NE(bad.status().message().find("'w'"), std::string::npos) << bad.status().ToString();
  EXPECT_NE(bad.status().message().find("float64[2]"), std::string::npos);
}

// INT16/UINT16 travel in int32_data, UINT32/UINT64 in uint64_data (or all in raw_data); they
// are structural like int32.
TEST(OnnxImport, ReadsTheWiderIntegerTypes) {
  OnnxBuilder b;
  b.Input("x", onnx::TensorProto::UINT64, {2}).Output("y", onnx::TensorProto::UINT64, {2});
  auto* i16 = b.graph().add_initializer();
  i16->set_name("i16");
  i16->set_data_type(onnx::TensorProto::INT16);
  i16->add_dims(2);
  i16->add_int32_data(-32768);
  i16->add_int32_data(12);
  auto* u32 = b.graph().add_initializer();
  u32->set_name("u32");
  u32->set_data_type(onnx::TensorProto::UINT32);
  u32->add_dims(1);
  u32->add_uint64_data(4294967295u);
  auto* u64 = b.graph().add_initializer();
  u64->set_name("u64");
  u64->set_data_type(onnx::TensorProto::UINT64);
  u64->add_dims(2);
  u64->add_uint64_data(18446744073709551615ull);
  u64->add_uint64_data(3);
  const uint16_t raw_values[2] = {65535, 1};
  auto* u16 = b.graph().add_initializer();
  u16->set_name("u16");
  u16->set_data_type(onnx::TensorProto::UINT16);
  u16->add_dims(2);
  u16->set_raw_data(std::string(reinterpret_cast<const char*>(raw_values), sizeof(raw_values)));
  b.Node("Max", {"x", "u64"}, {"y"});
  auto g = ImportOnnxBytes(b.Bytes(), "w.onnx");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_TRUE(VerifyGraph(*g).ok());
  EXPECT_EQ(g->inputs[0].dtype, DType::kUInt64);
  const Tensor& a = g->initializers.at("i16");
  ASSERT_EQ(a.dtype(), DType::kInt16);
  EXPECT_EQ(a.data<int16_t>()[0], -32768);
  EXPECT_EQ(g->initializers.at("u32").data<uint32_t>()[0], 4294967295u);
  EXPECT_EQ(g->initializers.at("u64").data<uint64_t>()[0], 18446744073709551615ull);
  EXPECT_EQ(g->initializers.at("u16").data<uint16_t>()[0], 65535);
  EXPECT_TRUE(g->WeightNames().empty()) << "wider integers are structural";

  OnnxBuilder short_data;
  short_data.Input("x", onnx::TensorProto::UINT32, {2}).Output("y", onnx::TensorProto::UINT32, {2});
  auto* s = short_data.graph().add_initializer();
  s->set_name("w");
  s->set_data_type(onnx::TensorProto::UINT32);
  s->add_dims(2);
  s->add_uint64_data(1);
  short_data.Node("Max", {"x", "w"}, {"y"});
  auto bad = ImportOnnxBytes(short_data.Bytes(), "w.onnx");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kCorruption);
  EXPECT_NE(bad.status().message().find("'w' (uint32[2]) holds 1 values, expected 2"),
            std::string::npos)
      << bad.status().ToString();
}

TEST(OnnxImport, SortsUnsortedNodesAndRefusesCycles) {
  OnnxBuilder b;
  b.Input("x", kFloat, {2}).Output("z", kFloat, {2});
  b.Node("Relu", {"y"}, {"z"}, "second");
  b.Node("Neg", {"x"}, {"y"}, "first");
  auto g = ImportOnnxBytes(b.Bytes(), "t");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->nodes[0].name, "first");

  OnnxBuilder c;
  c.Input("x", kFloat, {2}).Output("z", kFloat, {2});
  c.Node("Add", {"x", "b"}, {"a"}, "n1");
  c.Node("Neg", {"a"}, {"b"}, "n2");
  c.Node("Relu", {"a"}, {"z"});
  auto cyc = ImportOnnxBytes(c.Bytes(), "cyclic.onnx");
  ASSERT_FALSE(cyc.ok());
  EXPECT_NE(cyc.status().message().find("cycle"), std::string::npos) << cyc.status().ToString();
  EXPECT_NE(cyc.status().message().find("cyclic.onnx"), std::string::npos);
}

TEST(OnnxImport, TruncatedFileIsCorruptionNamingTheFile) {
  auto bytes = ReadFile(kExamples + "/mlp/model.onnx");
  ASSERT_TRUE(bytes.ok());
  const std::string dir = TempDir();
  const std::string path = dir + "/truncated.onnx";
  ASSERT_TRUE(WriteFileAtomic(path, bytes->substr(0, bytes->size() / 2)).ok());
  auto g = ImportOnnxFile(path);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kCorruption) << g.status().ToString();
  EXPECT_NE(g.status().message().find("truncated.onnx"), std::string::npos);
}

TEST(OnnxImport, GarbageAndEmptyInputNeverCrash) {
  for (const std::string& junk :
       {std::string(), std::string("not an onnx file"), std::string(64, '\xff'),
        std::string("\x08\x07\x12\x04\x0a\x02\x08", 7)}) {
    auto g = ImportOnnxBytes(junk, "junk");
    EXPECT_FALSE(g.ok());
  }
}

TEST(OnnxImport, MissingFileIsNotFound) {
  auto g = ImportOnnxFile("/nonexistent/model.onnx");
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kNotFound);
  EXPECT_NE(g.status().message().find("/nonexistent/model.onnx"), std::string::npos);
}

TEST(OnnxImport, RawDataOfWrongSizeIsCorruptionNamingTheTensor) {
  OnnxBuilder b;
  b.Input("x", kFloat, {2}).Output("y", kFloat, {2});
  auto* t = b.graph().add_initializer();
  t->set_name("w");
  t->set_data_type(onnx::TensorProto::FLOAT);
  t->add_dims(2);
  t->set_raw_data(std::string(5, '\0'));
  b.Node("Add", {"x", "w"}, {"y"});
  auto g = ImportOnnxBytes(b.Bytes(), "m.onnx");
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kCorruption);
  EXPECT_NE(g.status().message().find("'w'"), std::string::npos) << g.status().ToString();
  EXPECT_NE(g.status().message().find("expected 8"), std::string::npos);
}

TEST(OnnxImport, UnsupportedElementTypeIsUnimplementedNamingIt) {
  OnnxBuilder b;
  // COMPLEX64: an element type kiln has no dtype for (BFLOAT16 and STRING it has).
  b.Input("x", onnx::TensorProto::COMPLEX64, {2}).Output("y", onnx::TensorProto::COMPLEX64, {2});
  b.Node("Relu", {"x"}, {"y"});
  auto g = ImportOnnxBytes(b.Bytes(), "m.onnx");
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(g.status().message().find("COMPLEX64"), std::string::npos) << g.status().ToString();
  EXPECT_NE(g.status().message().find("'x'"), std::string::npos);
}

// Names reach JSON (events, cell metadata, KServe answers): one that is not UTF-8 is refused at
// import, with the place and the bytes escaped; a subgraph's names are checked too.
TEST(OnnxImport, NamesThatAreNotUtf8AreRefusedWithThePlaceAndTheBytes) {
  {
    OnnxBuilder b;
    b.Input("x\xff", kFloat, {2}).Output("y", kFloat, {2});
    b.Node("Relu", {"x\xff"}, {"y"});
    auto g = ImportOnnxBytes(b.Bytes(), "m.onnx");
    ASSERT_FALSE(g.ok());
    EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(g.status().message().find("m.onnx: graph: input name \"x\\xff\" is not valid UTF-8"),
              std::string::npos)
        << g.status().ToString();
  }
  {
    OnnxBuilder b;
    b.Input("c", kInt64, {}).Input("x", kFloat, {2}).Output("y", kFloat, {2});
    auto& n = b.Node("If", {"c"}, {"y"}, "branch");
    for (const char* branch : {"then_branch", "else_branch"}) {
      auto* a = n.add_attribute();
      a->set_name(branch);
      a->set_type(onnx::AttributeProto::GRAPH);
      onnx::GraphProto* g = a->mutable_g();
      g->set_name(branch);
      auto* node = g->add_node();
      node->set_op_type("Relu");
      node->add_input("x");
      node->add_output(std::string(branch) == "else_branch" ? "z\xc0\xaf" : "z");
      g->add_output()->set_name("z");
    }
    auto g = ImportOnnxBytes(b.Bytes(), "m.onnx");
    ASSERT_FALSE(g.ok());
    EXPECT_NE(g.status().message().find("attribute 'else_branch' of node 0: node 0 output "
                                        "\"z\\xc0\\xaf\" is not valid UTF-8"),
              std::string::npos)
        << g.status().ToString();
  }
  {  // Well-formed non-ASCII names are names like any other.
    OnnxBuilder b;
    b.Input("\xc3\xa9l\xc3\xa8ve", kFloat, {2}).Output("y", kFloat, {2});
    b.Node("Relu", {"\xc3\xa9l\xc3\xa8ve"}, {"y"});
    EXPECT_TRUE(ImportOnnxBytes(b.Bytes(), "m.onnx").ok());
  }
}

TEST(OnnxImport, UnknownOpIsNamedByTheVerifier) {
  OnnxBuilder b;
  b.Input("x", kFloat, {2}).Output("y", kFloat, {2});
  b.Node("FancyNewOp", {"x"}, {"y"}, "fancy");
  auto g = ImportOnnxBytes(b.Bytes(), "m.onnx");
  ASSERT_TRUE(g.ok());
  Status s = VerifyGraph(*g);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_NE(s.message().find("FancyNewOp"), std::string::npos) << s.ToString();
}

TEST(OnnxImport, MissingWeightIsNamedByTheVerifier) {
  OnnxBuilder b;
  b.Input("x", kFloat, {2, 2}).Output("y", kFloat, {2, 2});
  b.Node("MatMul", {"x", "fc.weight"}, {"y"}, "fc");
  auto g = ImportOnnxBytes(b.Bytes(), "m.onnx");
  ASSERT_TRUE(g.ok());
  Status s = VerifyGraph(*g);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("fc.weight"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("MatMul 'fc'"), std::string::npos) << s.ToString();
}

TEST(OnnxImport, UndeclaredDomainIsRefusedUnusedDomainsAccepted) {
  OnnxBuilder b;
  auto* ml = b.model().add_opset_import();
  ml->set_domain("ai.onnx.ml");
  ml->set_version(3);
  auto* ms = b.model().add_opset_import();
  ms->set_domain("com.microsoft");
  ms->set_version(1);
  b.Input("x", kFloat, {2}).Output("y", kFloat, {2});
  b.Node("Relu", {"x"}, {"y"});
  auto g = ImportOnnxBytes(b.Bytes(), "m.onnx");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_TRUE(VerifyGraph(*g).ok());

  OnnxBuilder c;
  c.Input("x", kFloat, {2}).Output("y", kFloat, {2});
  c.Node("Relu", {"x"}, {"y"}).set_domain("com.example");
  auto bad = ImportOnnxBytes(c.Bytes(), "m.onnx");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("com.example"), std::string::npos);
}

TEST(OnnxImport, ExternalDataIsReadRelativeToTheModel) {
  const std::string dir = TempDir();
  const std::vector<float> values = {1.5f, -2.0f, 3.25f};
  std::string raw(reinterpret_cast<const char*>(values.data()), 12);
  ASSERT_TRUE(WriteFileAtomic(dir + "/weights.bin", std::string(16, '\0') + raw).ok());
  OnnxBuilder b;
  b.Input("x", kFloat, {3}).Output("y", kFloat, {3});
  auto* t = b.graph().add_initializer();
  t->set_name("w");
  t->set_data_type(onnx::TensorProto::FLOAT);
  t->add_dims(3);
  t->set_data_location(onnx::TensorProto::EXTERNAL);
  auto add_kv = [&](onnx::TensorProto* tp, const std::string& k, const std::string& v) {
    auto* kv = tp->add_external_data();
    kv->set_key(k);
    kv->set_value(v);
  };
  add_kv(t, "location", "weights.bin");
  add_kv(t, "offset", "16");
  add_kv(t, "length", "12");
  b.Node("Add", {"x", "w"}, {"y"});
  ASSERT_TRUE(WriteFileAtomic(dir + "/model.onnx", b.Bytes()).ok());
  auto g = ImportOnnxFile(dir + "/model.onnx");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_FLOAT_EQ(g->initializers.at("w").data<float>()[2], 3.25f);

  // Out of range offset -> Corruption naming the tensor.
  t->mutable_external_data(1)->set_value("8");
  t->mutable_external_data(2)->set_value("24");
  ASSERT_TRUE(WriteFileAtomic(dir + "/bad_len.onnx", b.Bytes()).ok());
  auto bad = ImportOnnxFile(dir + "/bad_len.onnx");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'w'"), std::string::npos) << bad.status().ToString();

  // Missing file -> NotFound naming it; escaping path -> InvalidArgument.
  t->mutable_external_data(1)->set_value("16");
  t->mutable_external_data(2)->set_value("12");
  t->mutable_external_data(0)->set_value("gone.bin");
  ASSERT_TRUE(WriteFileAtomic(dir + "/missing.onnx", b.Bytes()).ok());
  auto missing = ImportOnnxFile(dir + "/missing.onnx");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("gone.bin"), std::string::npos);
  t->mutable_external_data(0)->set_value("../etc/passwd");
  ASSERT_TRUE(WriteFileAtomic(dir + "/escape.onnx", b.Bytes()).ok());
  auto escape = ImportOnnxFile(dir + "/escape.onnx");
  ASSERT_FALSE(escape.ok());
  EXPECT_EQ(escape.status().code(), StatusCode::kInvalidArgument);
}

TEST(OnnxImport, WeightsListedAsInputsBecomeInitializers) {
  OnnxBuilder b;
  b.Input("x", kFloat, {2}).Input("w", kFloat, {2}).Output("y", kFloat, {2});
  b.FloatInit("w", {2}, {1, 2});
  b.Node("Add", {"x", "w"}, {"y"});
  auto g = ImportOnnxBytes(b.Bytes(), "m.onnx");
  ASSERT_TRUE(g.ok());
  ASSERT_EQ(g->inputs.size(), 1u);
  EXPECT_EQ(g->inputs[0].name, "x");
  EXPECT_EQ(g->WeightNames(), std::vector<std::string>{"w"});
}

}  // namespace
}  // namespace kiln
