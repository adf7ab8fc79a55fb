// Tests for .npy reading and writing (tensor layer): round trips, files as numpy writes them, and
// damaged input that must be refused by name without crashing.
#include "src/kiln/tensor/npy.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <string>

#include "src/kiln/base/file.h"

namespace kiln {
namespace {

std::string TempPath(const std::string& name) {
  return testing::TempDir() + "kiln_npy_test_" + std::to_string(::getpid()) + "_" + name;
}

// A .npy file with the given version and header dict text, padded the way numpy pads.
std::string MakeNpy(int major, const std::string& dict, const std::string& data) {
  const size_t len_bytes = major == 1 ? 2 : 4;
  std::string header = dict;
  header.append(64 - ((6 + 2 + len_bytes + header.size() + 1) % 64), ' ');
  header += '\n';
  std::string out = "\x93NUMPY";
  out += static_cast<char>(major);
  out += '\0';
  for (size_t i = 0; i < len_bytes; ++i)
    out += static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return out + header + data;
}

std::string FloatBytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

void ExpectSameTensor(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.dtype(), b.dtype());
  EXPECT_EQ(a.shape(), b.shape());
  ASSERT_EQ(a.nbytes(), b.nbytes());
  EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()), 0);
}

TEST(NpyTest, ParsesBytesAsNumpyWritesThem) {
  // np.save(f, np.arange(6, dtype=np.float32).reshape(2, 3)), byte for byte (numpy < 1.23).
  std::string file("\x93NUMPY\x01\x00\x76\x00", 10);
  file += "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  file += std::string(58, ' ') + "\n";
  ASSERT_EQ(file.size(), 128u);
  file += FloatBytes({0, 1, 2, 3, 4, 5});

  Result<Tensor> t = ParseNpy(file, "arange.npy");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->dtype(), DType::kFloat32);
  EXPECT_EQ(t->shape(), (Shape{2, 3}));
  for (int i = 0; i < 6; ++i) EXPECT_EQ(t->data<float>()[i], static_cast<float>(i));
}

// The committed examples were written by np.save (tools/make_examples.py): real numpy output.
TEST(NpyTest, ReadsAndReproducesFilesWrittenByNumpy) {
  const std::string dir = std::string(KILN_SOURCE_DIR) + "/examples/transformer/";
  for (const char* name : {"inputs/input_ids.npy", "outputs/hidden.npy"}) {
    Result<std::string> bytes = ReadFile(dir + name);
    if (!bytes.ok()) GTEST_SKIP() << "no example fixture: " << bytes.status().ToString();
    Result<Tensor> t = ParseNpy(*bytes, name);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    EXPECT_EQ(t->rank(), 2 + (std::string(name).find("hidden") != std::string::npos));
    EXPECT_EQ(SerializeNpy(*t), *bytes) << name;
  }
}

TEST(NpyTest, SerializeMatchesModernNumpyBytes) {
  // numpy >= 1.23 adds growth room for the first dim before padding to 64.
  Tensor t = Tensor::FromVector<float>({2, 3}, {0, 1, 2, 3, 4, 5});
  const std::string bytes = SerializeNpy(t);
  std::string expected("\x93NUMPY\x01\x00\x76\x00", 10);
  expected += "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  expected += std::string(20 + 38, ' ') + "\n";
  expected += FloatBytes({0, 1, 2, 3, 4, 5});
  EXPECT_EQ(bytes, expected);
}

TEST(NpyTest, ShapesSerializeAsPythonTuples) {
  Tensor scalar = Tensor::Scalar<int64_t>(7);
  EXPECT_NE(SerializeNpy(scalar).find("'shape': (), }"), std::string::npos);
  Tensor vec = Tensor::FromVector<int32_t>({3}, {1, 2, 3});
  EXPECT_NE(SerializeNpy(vec).find("'shape': (3,), }"), std::string::npos);
  for (const Tensor& t : {scalar, vec}) {
    const std::string b = SerializeNpy(t);
    const size_t header_len = static_cast<uint8_t>(b[8]) | (static_cast<uint8_t>(b[9]) << 8);
    EXPECT_EQ((10 + header_len) % 64, 0u);
    EXPECT_EQ(b[10 + header_len - 1], '\n');
  }
}

TEST(NpyTest, RoundTripsEveryDTypeThroughAFile) {
  std::vector<Tensor> tensors;
  tensors.push_back(Tensor::FromVector<float>({2, 2}, {1.5f, -0.0f, 1e-30f, 3.0e38f}));
  {
    Tensor h = *Tensor::Empty(DType::kFloat16, {3});
    h.data<uint16_t>()[0] = 0x3c00;
    h.data<uint16_t>()[1] = 0x0001;  // subnormal
    h.data<uint16_t>()[2] = 0xfc00;  // -inf
    tensors.push_back(h);
  }
  tensors.push_back(Tensor::FromVector<int64_t>({1, 3}, {INT64_MIN, 0, INT64_MAX}));
  tensors.push_back(Tensor::FromVector<int32_t>({4}, {-1, 2, INT32_MIN, INT32_MAX}));
  tensors.push_back(Tensor::FromVector<int8_t>({2, 1, 2}, {-128, 127, 0, -1}));
  tensors.push_back(Tensor::FromVector<uint8_t>({}, {255}));
  {
    const uint8_t b[] = {1, 0, 1};
    tensors.push_back(*Tensor::FromBytes(DType::kBool, {3}, b, 3));
  }
  tensors.push_back(*Tensor::Empty(DType::kFloat32, {0, 5}));
  tensors.push_back(Tensor::FromVector<double>({3}, {1.0 / 3.0, -1e300, 5e-324}));
  tensors.push_back(Tensor::FromVector<int16_t>({2}, {-32768, 5}));
  tensors.push_back(Tensor::FromVector<uint16_t>({2}, {65535, 5}));
  tensors.push_back(Tensor::FromVector<uint32_t>({2}, {4294967295u, 5}));
  tensors.push_back(Tensor::FromVector<uint64_t>({2}, {18446744073709551615ull, 5}));

  for (const Tensor& t : tensors) {
    SCOPED_TRACE(t.TypeString());
    const std::string path = TempPath("rt.npy");
    ASSERT_TRUE(WriteNpy(path, t).ok());
    Result<Tensor> back = ReadNpy(path);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    ExpectSameTensor(*back, t);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(back->raw_data()) % 64, 0u);
    ::unlink(path.c_str());
  }
}

TEST(NpyTest, WritesDescrsNumpyUnderstands) {
  const struct {
    DType t;
    const char* descr;
  } cases[] = {{DType::kFloat32, "'<f4'"}, {DType::kFloat16, "'<f2'"}, {DType::kInt64, "'<i8'"},
               {DType::kInt32, "'<i4'"},   {DType::kInt8, "'|i1'"},    {DType::kUInt8, "'|u1'"},
               {DType::kBool, "'|b1'"},    {DType::kFloat64, "'<f8'"}, {DType::kInt16, "'<i2'"},
               {DType::kUInt16, "'<u2'"},  {DType::kUInt32, "'<u4'"},  {DType::kUInt64, "'<u8'"}};
  for (const auto& c : cases) {
    EXPECT_NE(SerializeNpy(*Tensor::Empty(c.t, {1})).find(c.descr), std::string::npos) << c.descr;
  }
}

TEST(NpyTest, ReadsVersion2And3AndOldHeaderSpellings) {
  const std::string data = FloatBytes({1, 2, 3});
  for (int major : {2, 3}) {
    Result<Tensor> t = ParseNpy(
        MakeNpy(major, "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", data), "v.npy");
    ASSERT_TRUE(t.ok()) << major << ": " << t.status().ToString();
    EXPECT_EQ(t->shape(), (Shape{3}));
    EXPECT_EQ(t->data<float>()[2], 3.0f);
  }
  // Key order free, double quotes, Python 2 longs, no trailing comma, '=' byte order.
  Result<Tensor> t = ParseNpy(
      MakeNpy(1, "{\"shape\": (1L, 3L), \"fortran_order\": False, \"descr\": \"=f4\"}", data),
      "py2.npy");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->shape(), (Shape{1, 3}));
  // Rank-1 Fortran order is the same bytes as C order.
  EXPECT_TRUE(
      ParseNpy(MakeNpy(1, "{'descr': '<f4', 'fortran_order': True, 'shape': (3,), }", data), "f1")
          .ok());
}

TEST(NpyTest, RefusesUnsupportedLayoutsAsUnimplemented) {
  const std::string data(24, '\0');
  const struct {
    const char* dict;
    const char* fragment;
  } cases[] = {
      {"{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", "fortran_order"},
      {"{'descr': '>f4', 'fortran_order': False, 'shape': (6,), }", "big-endian"},
      {"{'descr': '<c8', 'fortran_order': False, 'shape': (3,), }", "'<c8'"},
      {"{'descr': '<M8', 'fortran_order': False, 'shape': (3,), }", "'<M8'"},
      {"{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (6,), }", "structured"},
  };
  for (const auto& c : cases) {
    Result<Tensor> t = ParseNpy(MakeNpy(1, c.dict, data), "odd.npy");
    ASSERT_FALSE(t.ok()) << c.dict;
    EXPECT_EQ(t.status().code(), StatusCode::kUnimplemented) << t.status().ToString();
    EXPECT_NE(t.status().message().find(c.fragment), std::string::npos) << t.status().message();
    EXPECT_NE(t.status().message().find("odd.npy"), std::string::npos);
  }
  std::string v4 = MakeNpy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (6,), }", data);
  v4[6] = 4;
  EXPECT_EQ(ParseNpy(v4, "v4.npy").status().code(), StatusCode::kUnimplemented);
}

TEST(NpyTest, RefusesDamagedFilesAsCorruptionNamingTheProblem) {
  const std::string data = FloatBytes({1, 2, 3});
  const std::string ok_dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }";
  const struct {
    std::string bytes;
    const char* fragment;
  } cases[] = {
      {"", "magic"},
      {"PK\x03\x04 not numpy at all", "magic"},
      {MakeNpy(1, ok_dict, data + "xx"), "trailing"},
      {MakeNpy(1, ok_dict, data.substr(0, 8)), "truncated"},
      {MakeNpy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (-3,), }", ""), "negative"},
      {MakeNpy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 'a'), }", data), "shape"},
      {MakeNpy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': 3, }", data), "tuple"},
      {MakeNpy(1, "{'descr': '<f4', 'fortran_order': False, }", data), "'shape'"},
      {MakeNpy(1, "{'descr': '<f4', 'fortran_order': 0, 'shape': (3,), }", data), "fortran"},
      {MakeNpy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), 'x': 1}", data),
       "unexpected header key 'x'"},
      {MakeNpy(1, "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (3,)}", data),
       "duplicate"},
      {MakeNpy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3,) }} ", data), "after"},
      {MakeNpy(1, "{'descr': '<f4, 'fortran_order': False, 'shape': (3,)}", data), "header"},
      {MakeNpy(1, "['descr']", data), "expected a dict"},
      {MakeNpy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}",
               data),
       "64 bits"},
      {MakeNpy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, 16)}",
               data),
       "2^64"},
      {MakeNpy(1, "{'descr': " + std::string(40, '(') + "}", data), "nests"},
      {MakeNpy(1, "{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }",
               std::string("\x01\x02\x00", 3)),
       "bool element 1"},
  };
  for (const auto& c : cases) {
    Result<Tensor> t = ParseNpy(c.bytes, "bad.npy");
    ASSERT_FALSE(t.ok()) << c.fragment;
    EXPECT_EQ(t.status().code(), StatusCode::kCorruption) << t.status().ToString();
    EXPECT_NE(t.status().message().find("bad.npy"), std::string::npos) << t.status().message();
    EXPECT_NE(t.status().message().find(c.fragment), std::string::npos) << t.status().message();
  }
  // A header length that points past the end of the file.
  std::string long_header =
      MakeNpy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3,)}", data);
  long_header[8] = '\xff';
  long_header[9] = '\xff';
  Result<Tensor> t = ParseNpy(long_header, "long.npy");
  EXPECT_EQ(t.status().code(), StatusCode::kCorruption);
  EXPECT_NE(t.status().message().find("header length 65535"), std::string::npos)
      << t.status().message();
}

TEST(NpyTest, EveryTruncationIsCorruption) {
  const std::string full = SerializeNpy(Tensor::FromVector<int32_t>({2, 2}, {1, 2, 3, 4}));
  for (size_t n = 0; n < full.size(); ++n) {
    // Copy into an exact-size buffer so a read past the end would trip ASan.
    const std::string prefix = full.substr(0, n);
    Result<Tensor> t = ParseNpy(prefix, "cut.npy");
    ASSERT_FALSE(t.ok()) << n;
    EXPECT_EQ(t.status().code(), StatusCode::kCorruption) << n << ": " << t.status().ToString();
  }
}

TEST(NpyTest, RandomCorruptionNeverCrashes) {
  const std::string full = SerializeNpy(Tensor::FromVector<float>({3, 2}, {1, 2, 3, 4, 5, 6}));
  std::mt19937 rng(1234);
  for (int iter = 0; iter < 3000; ++iter) {
    std::string bytes = full;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) {
      const size_t pos = rng() % std::min<size_t>(bytes.size(), 140);  // mostly the header
      bytes[pos] = static_cast<char>(rng());
    }
    if (rng() % 3 == 0) bytes.resize(rng() % bytes.size());
    Result<Tensor> t = ParseNpy(bytes, "fuzz.npy");
    if (t.ok()) {
      EXPECT_EQ(t->nbytes(), t->numel() * DTypeSize(t->dtype()));
    } else {
      EXPECT_NE(t.status().message().find("fuzz.npy"), std::string::npos);
    }
  }
}

TEST(NpyTest, MissingFileIsNotFound) {
  Result<Tensor> t = ReadNpy(TempPath("does_not_exist.npy"));
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kNotFound);
  EXPECT_NE(t.status().message().find("does_not_exist.npy"), std::string::npos);
}

TEST(NpyTest, WritingAnInvalidTensorIsRefused) {
  const Status s = WriteNpy(TempPath("invalid.npy"), Tensor());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("invalid.npy"), std::string::npos);
}

}  // namespace
}  // namespace kiln
