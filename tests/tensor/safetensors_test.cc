// Tests for safetensors reading and writing (tensor layer): round trips, deterministic bytes, and
// hand-crafted bad files, each refused with a code and a message naming the file and tensor.
#include "src/kiln/tensor/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <string>

#include "src/kiln/base/file.h"

namespace kiln {
namespace {

std::string TempPath(const std::string& name) {
  return testing::TempDir() + "kiln_st_test_" + std::to_string(::getpid()) + "_" + name;
}

// The 8-byte little-endian length, the header text as given, then `data`.
std::string MakeFile(const std::string& header, const std::string& data,
                     uint64_t len_override = 0) {
  const uint64_t n = len_override ? len_override : header.size();
  std::string out;
  for (int i = 0; i < 8; ++i) out += static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

Result<SafetensorsFile> Parse(const std::string& bytes, const std::string& what = "t.safetensors") {
  auto owner = std::make_shared<std::string>(bytes);
  return ParseSafetensors(owner, reinterpret_cast<const uint8_t*>(owner->data()), owner->size(),
                          what);
}

std::string FloatBytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

std::map<std::string, Tensor> SampleTensors() {
  std::map<std::string, Tensor> m;
  m["w.f32"] = Tensor::FromVector<float>({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor h = *Tensor::Empty(DType::kFloat16, {2});
  h.data<uint16_t>()[0] = 0x3c00;
  h.data<uint16_t>()[1] = 0x7e00;  // NaN
  m["h.f16"] = h;
  m["i64"] = Tensor::FromVector<int64_t>({3}, {-1, 0, INT64_MAX});
  m["i32"] = Tensor::FromVector<int32_t>({}, {42});
  m["i8"] = Tensor::FromVector<int8_t>({1, 1}, {-7});
  m["u8"] = Tensor::FromVector<uint8_t>({5}, {0, 1, 2, 254, 255});
  const uint8_t b[] = {1, 0};
  m["mask"] = *Tensor::FromBytes(DType::kBool, {2}, b, 2);
  m["empty"] = *Tensor::Empty(DType::kFloat32, {0, 3});
  m["f64"] = Tensor::FromVector<double>({2}, {1.0 / 3.0, -1e300});
  m["i16"] = Tensor::FromVector<int16_t>({2}, {-32768, 5});
  m["u16"] = Tensor::FromVector<uint16_t>({1}, {65535});
  m["u32"] = Tensor::FromVector<uint32_t>({1}, {4294967295u});
  m["u64"] = Tensor::FromVector<uint64_t>({2}, {18446744073709551615ull, 0});
  return m;
}

void ExpectSame(const std::map<std::string, Tensor>& want,
                const std::map<std::string, Tensor>& got) {
  ASSERT_EQ(want.size(), got.size());
  for (const auto& [name, t] : want) {
    SCOPED_TRACE(name);
    auto it = got.find(name);
    ASSERT_NE(it, got.end());
    EXPECT_EQ(it->second.dtype(), t.dtype());
    EXPECT_EQ(it->second.shape(), t.shape());
    ASSERT_EQ(it->second.nbytes(), t.nbytes());
    EXPECT_EQ(std::memcmp(it->second.raw_data(), t.raw_data(), t.nbytes()), 0);
  }
}

TEST(SafetensorsTest, RoundTripsEveryDTypeAndMetadataThroughAFile) {
  const std::string path = TempPath("rt.safetensors");
  const std::map<std::string, Tensor> tensors = SampleTensors();
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"note", "caf\xc3\xa9"}};
  ASSERT_TRUE(WriteSafetensors(path, tensors, metadata).ok());

  Result<SafetensorsFile> f = ReadSafetensors(path);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  ExpectSame(tensors, f->tensors);
  EXPECT_EQ(f->metadata, metadata);
  for (const auto& [name, t] : f->tensors) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw_data()) % DTypeSize(t.dtype()), 0u) << name;
  }

  // A tensor keeps the mapping alive after the file struct is gone and the name unlinked.
  Tensor w = f->tensors.at("w.f32");
  f = Status::NotFound("dropped");
  ::unlink(path.c_str());
  EXPECT_EQ(w.data<float>()[5], 6.0f);
}

TEST(SafetensorsTest, SerializationIsDeterministicAndAligned) {
  std::map<std::string, Tensor> m;
  m["b"] = Tensor::FromVector<float>({1}, {2.0f});
  m["a"] = Tensor::FromVector<float>({1}, {1.0f});
  Result<std::string> bytes = SerializeSafetensors(m);
  ASSERT_TRUE(bytes.ok());
  const std::string header = R"({"a":{"data_offsets":[0,4],"dtype":"F32","shape":[1]},)"
                             R"("b":{"data_offsets":[4,8],"dtype":"F32","shape":[1]}})";
  std::string padded = header;
  padded.append((8 - header.size() % 8) % 8, ' ');
  EXPECT_EQ(*bytes, MakeFile(padded, FloatBytes({1.0f, 2.0f})));  // sorted names: a's data first
  EXPECT_EQ((bytes->size() - 8) % 8, 0u);
  EXPECT_EQ(*SerializeSafetensors(m), *bytes);

  Result<std::string> with_meta = SerializeSafetensors(m, {{"k", "v"}});
  ASSERT_TRUE(with_meta.ok());
  EXPECT_NE(with_meta->find(R"("__metadata__":{"k":"v"})"), std::string::npos);
}

TEST(SafetensorsTest, ParsesFilesWithGapsAndUnalignedData) {
  // A 3-byte header pad leaves the data region at an odd address; a gap of 4 uncovered bytes.
  const std::string header =
      R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[5,13]},"__metadata__":{}})";
  std::string data = std::string(5, '\x7f') + FloatBytes({3.5f, -1.0f});
  ASSERT_EQ((8 + header.size() + 3 + 5) % 4, 1u);  // x's bytes start at an odd file offset
  Result<SafetensorsFile> f = Parse(MakeFile(header + "   ", data));
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  const Tensor& x = f->tensors.at("x");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(x.raw_data()) % 4, 0u);  // copied into aligned storage
  EXPECT_EQ(x.data<float>()[0], 3.5f);
  EXPECT_EQ(x.data<float>()[1], -1.0f);
  EXPECT_TRUE(f->metadata.empty());
}

TEST(SafetensorsTest, EmptyHeaderAndZeroSizedTensors) {
  Result<SafetensorsFile> f = Parse(MakeFile("{}", ""));
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_TRUE(f->tensors.empty());
  // Empty ranges sit anywhere, even inside another tensor's range.
  Result<SafetensorsFile> g =
      Parse(MakeFile(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                     R"("z":{"dtype":"I64","shape":[0,2],"data_offsets":[2,2]}})",
                     FloatBytes({1.0f})));
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->tensors.at("z").numel(), 0);
}

struct BadCase {
  const char* label;
  std::string bytes;
  StatusCode code;
  std::vector<std::string> fragments;
};

TEST(SafetensorsTest, RefusesBadFilesNamingFileAndTensor) {
  const std::string d16(16, '\0');
  const std::vector<BadCase> cases = {
      {"overlapping offsets",
       MakeFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                d16),
       StatusCode::kCorruption,
       {"'b'", "overlap", "'a'"}},
      {"offsets out of range",
       MakeFile(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})", d16),
       StatusCode::kCorruption,
       {"'a'", "[8,24]", "16 bytes"}},
      {"wrong byte size",
       MakeFile(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", d16),
       StatusCode::kCorruption,
       {"'w'", "16 bytes", "needs 12"}},
      {"end before begin",
       MakeFile(R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[8,4]}})", d16),
       StatusCode::kCorruption,
       {"'w'", "end before begin"}},
      {"duplicate names",
       MakeFile(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                R"("w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                d16),
       StatusCode::kCorruption,
       {"duplicate key 'w'"}},
      {"duplicate field",
       MakeFile(R"({"w":{"dtype":"U8","dtype":"F32","shape":[1],"data_offsets":[0,1]}})", d16),
       StatusCode::kCorruption,
       {"duplicate key 'dtype'"}},
      {"header length too large",
       MakeFile("{}", d16, 1000),
       StatusCode::kCorruption,
       {"header length 1000", "exceeds"}},
      {"header length absurd",
       MakeFile("{}", d16, ~uint64_t{0}),
       StatusCode::kCorruption,
       {"header length 18446744073709551615"}},
      {"unknown dtype",
       MakeFile(R"({"q":{"dtype":"Q7","shape":[1],"data_offsets":[0,1]}})", d16),
       StatusCode::kCorruption,
       {"'q'", "unknown dtype 'Q7'"}},
      {"unsupported dtype",
       MakeFile(R"({"b":{"dtype":"F8_E4M3","shape":[1],"data_offsets":[0,1]}})", d16),
       StatusCode::kUnimplemented,
       {"'b'", "F8_E4M3"}},
      {"negative dim",
       MakeFile(R"({"n":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}})", d16),
       StatusCode::kCorruption,
       {"'n'", "-1"}},
      {"float dim",
       MakeFile(R"({"n":{"dtype":"U8","shape":[1.0],"data_offsets":[0,1]}})", d16),
       StatusCode::kCorruption,
       {"'n'", "1.0"}},
      {"overflowing dims",
       MakeFile(R"({"n":{"dtype":"F32","shape":[4294967296,4294967296,4],"data_offsets":[0,16]}})",
                d16),
       StatusCode::kCorruption,
       {"'n'", "2^64"}},
      {"bad offsets shape",
       MakeFile(R"({"n":{"dtype":"U8","shape":[1],"data_offsets":[0]}})", d16),
       StatusCode::kCorruption,
       {"'n'", "data_offsets"}},
      {"missing field",
       MakeFile(R"({"n":{"dtype":"U8","shape":[1]}})", d16),
       StatusCode::kCorruption,
       {"'n'", "missing 'data_offsets'"}},
      {"unexpected field",
       MakeFile(R"({"n":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"order":"C"}})", d16),
       StatusCode::kCorruption,
       {"'n'", "unexpected field 'order'"}},
      {"entry not an object",
       MakeFile(R"({"n":[1,2]})", d16),
       StatusCode::kCorruption,
       {"'n'", "expected an object"}},
      {"bad json",
       MakeFile(R"({"n":{"dtype":"U8",)", d16),
       StatusCode::kCorruption,
       {"header", "invalid JSON at byte"}},
      {"header not an object",
       MakeFile("[1,2]   ", d16),
       StatusCode::kCorruption,
       {"expected a JSON object"}},
      {"metadata not strings",
       MakeFile(R"({"__metadata__":{"epoch":3}})", d16),
       StatusCode::kCorruption,
       {"__metadata__ 'epoch'", "expected a string"}},
      {"bool out of range",
       MakeFile(R"({"m":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}})",
                std::string("\x01\x05", 2)),
       StatusCode::kCorruption,
       {"'m'", "bool element 1"}},
      {"too short", std::string("\x02\x00\x00", 3), StatusCode::kCorruption, {"3 bytes"}},
  };
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.label);
    Result<SafetensorsFile> f = Parse(c.bytes, "bad.safetensors");
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(f.status().code(), c.code) << f.status().ToString();
    const std::string m = f.status().message();
    EXPECT_NE(m.find("bad.safetensors"), std::string::npos) << m;
    for (const std::string& frag : c.fragments) {
      EXPECT_NE(m.find(frag), std::string::npos) << "missing '" << frag << "' in: " << m;
    }
  }
}

TEST(SafetensorsTest, ReadNamesThePathAndMissingIsNotFound) {
  const std::string path = TempPath("bad.safetensors");
  ASSERT_TRUE(WriteFileAtomic(path, MakeFile(R"({"a":{"dtype":"X"}})", "")).ok());
  Result<SafetensorsFile> f = ReadSafetensors(path);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kCorruption);
  EXPECT_NE(f.status().message().find(path), std::string::npos);
  ::unlink(path.c_str());

  Result<SafetensorsFile> missing = ReadSafetensors(path);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

TEST(SafetensorsTest, WriterRefusesBadInput) {
  std::map<std::string, Tensor> reserved;
  reserved["__metadata__"] = Tensor::FromVector<float>({1}, {1.0f});
  Result<std::string> r = SerializeSafetensors(reserved);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);

  std::map<std::string, Tensor> invalid;
  invalid["w"] = Tensor();
  const Status s = WriteSafetensors(TempPath("never.safetensors"), invalid);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'w'"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("never.safetensors"), std::string::npos) << s.message();

  std::map<std::string, Tensor> bad_name;
  bad_name["w\xff"] = Tensor::FromVector<float>({1}, {1.0f});
  EXPECT_EQ(SerializeSafetensors(bad_name).status().code(), StatusCode::kInvalidArgument);
}

TEST(SafetensorsTest, EveryTruncationIsRefused) {
  const std::string full = *SerializeSafetensors(SampleTensors(), {{"a", "b"}});
  for (size_t n = 0; n < full.size(); ++n) {
    Result<SafetensorsFile> f = Parse(full.substr(0, n));
    ASSERT_FALSE(f.ok()) << n;
    EXPECT_EQ(f.status().code(), StatusCode::kCorruption) << n << ": " << f.status().ToString();
  }
}

TEST(SafetensorsTest, RandomCorruptionNeverCrashes) {
  const std::string full = *SerializeSafetensors(SampleTensors());
  std::mt19937 rng(99);
  for (int iter = 0; iter < 3000; ++iter) {
    std::string bytes = full;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) bytes[rng() % bytes.size()] = static_cast<char>(rng());
    if (rng() % 4 == 0) bytes.resize(rng() % bytes.size());
    Result<SafetensorsFile> f = Parse(bytes, "fuzz.safetensors");
    if (f.ok()) {
      for (const auto& [name, t] : f->tensors) EXPECT_TRUE(t.valid()) << name;
    } else {
      EXPECT_NE(f.status().message().find("fuzz.safetensors"), std::string::npos);
    }
  }
}

}  // namespace
}  // namespace kiln
