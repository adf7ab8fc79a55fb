// Tests for SHA-256, canonical JSON, facts digests and non-throwing JSON parsing (base layer).
#include "src/kiln/base/sha256.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <string>

#include "src/kiln/base/canonical_json.h"
#include "src/kiln/base/file.h"

namespace kiln {
namespace {

using nlohmann::json;

constexpr char kEmptyHex[] = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
constexpr char kAbcHex[] = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";

TEST(Sha256Test, KnownVectors) {
  EXPECT_EQ(Sha256Hex(""), kEmptyHex);
  EXPECT_EQ(Sha256Hex("abc"), kAbcHex);
  EXPECT_EQ(Sha256Hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(Sha256Hex(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256Test, IncrementalMatchesOneShotAndResets) {
  Sha256 h;
  h.Update("a");
  h.Update("");
  h.Update(std::string_view("bc"));
  EXPECT_EQ(h.FinalHex(), kAbcHex);
  // Final() resets: the same object now hashes a fresh input.
  EXPECT_EQ(h.FinalHex(), kEmptyHex);
  h.Update("abc");
  const std::array<uint8_t, 32> raw = h.Final();
  EXPECT_EQ(HexEncode(raw.data(), raw.size()), kAbcHex);

  Sha256 moved = std::move(h);
  moved.Update("abc");
  EXPECT_EQ(moved.FinalHex(), kAbcHex);
}

TEST(Sha256Test, HexEncode) {
  const uint8_t bytes[] = {0x00, 0x0f, 0xa5, 0xff};
  EXPECT_EQ(HexEncode(bytes, 4), "000fa5ff");
  EXPECT_EQ(HexEncode(bytes, 0), "");
}

TEST(Sha256Test, FileMatchesBytesAndMissingIsNotFound) {
  const std::string path = testing::TempDir() + "kiln_sha256_test_" + std::to_string(::getpid());
  std::string bytes(2500000, 'x');  // spans several read chunks
  bytes[12345] = 'y';
  ASSERT_TRUE(WriteFileAtomic(path, bytes).ok());
  Result<std::string> h = Sha256File(path);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(*h, Sha256Hex(bytes));
  ::unlink(path.c_str());

  Result<std::string> missing = Sha256File(path);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find(path), std::string::npos);
}

TEST(CanonicalJsonTest, SortsKeysAndDropsWhitespace) {
  const json j = json::parse(R"({ "b": 1, "a": {"z": [true, null, "s"], "y": -2}, "A": "x" })");
  Result<std::string> c = CanonicalJson(j);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(*c, R"({"A":"x","a":{"y":-2,"z":[true,null,"s"]},"b":1})");
}

TEST(CanonicalJsonTest, InsertionOrderDoesNotMatter) {
  json a;
  a["graph"] = "0123456789abcdef";
  a["sm"] = "x86-64-v3";
  json b;
  b["sm"] = "x86-64-v3";
  b["graph"] = "0123456789abcdef";
  EXPECT_EQ(*CanonicalJson(a), *CanonicalJson(b));
}

TEST(CanonicalJsonTest, IntegersStayIntegersAndUtf8StaysRaw) {
  json j = {{"big", uint64_t{18446744073709551615u}},
            {"neg", int64_t{-9223372036854775807 - 1}},
            {"name", "caf\xc3\xa9 \"q\" \\"}};
  EXPECT_EQ(*CanonicalJson(j),
            "{\"big\":18446744073709551615,\"name\":\"caf\xc3\xa9 \\\"q\\\" \\\\\","
            "\"neg\":-9223372036854775808}");
  // Keys sort by UTF-8 bytes: "\xc3\xa9" (U+00E9) sorts after "z".
  json k = {{"\xc3\xa9", 1}, {"z", 2}};
  EXPECT_EQ(*CanonicalJson(k), "{\"z\":2,\"\xc3\xa9\":1}");
}

TEST(CanonicalJsonTest, RefusesFloatsNamingThePath) {
  json j = {{"entries", json::array({json::object(), {{"scale", 0.5}}})}};
  Result<std::string> c = CanonicalJson(j);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("$.entries[1].scale"), std::string::npos)
      << c.status().message();
  EXPECT_NE(c.status().message().find("float"), std::string::npos);
  // Even an integral float: 1.0 and 1 must not hash alike by accident.
  EXPECT_FALSE(CanonicalJson(json(1.0)).ok());
  EXPECT_FALSE(FactsDigest(json::array({1.5})).ok());
}

TEST(CanonicalJsonTest, RefusesInvalidUtf8) {
  Result<std::string> c = CanonicalJson(json("bad \xff byte"));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("UTF-8"), std::string::npos);
}

TEST(CanonicalJsonTest, RefusesExcessiveNesting) {
  json j = 1;
  for (int i = 0; i < 300; ++i) j = json::array({j});
  Result<std::string> c = CanonicalJson(j);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("deeper"), std::string::npos);
}

TEST(FactsDigestTest, IsFirst16HexOfCanonicalSha) {
  const json j = {{"b", 2}, {"a", "x"}};
  Result<std::string> d = FactsDigest(j);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->size(), 16u);
  EXPECT_EQ(*d, Sha256Hex(R"({"a":"x","b":2})").substr(0, 16));
  EXPECT_EQ(d->find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_NE(*d, *FactsDigest(json{{"b", 3}, {"a", "x"}}));
}

TEST(ParseJsonTest, ParsesValidText) {
  Result<json> j = ParseJson(R"({"a": [1, 2], "b": "c"})", "test doc");
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  EXPECT_EQ((*j)["a"][1], 2);
  EXPECT_EQ((*j)["b"], "c");
}

TEST(ParseJsonTest, SyntaxErrorNamesWhatAndByteOffset) {
  Result<json> j = ParseJson(R"({"a": tru})", "cell metadata.json");
  ASSERT_FALSE(j.ok());
  EXPECT_EQ(j.status().code(), StatusCode::kInvalidArgument);
  const std::string m = j.status().message();
  EXPECT_NE(m.find("cell metadata.json"), std::string::npos) << m;
  EXPECT_NE(m.find("at byte 10"), std::string::npos) << m;
  EXPECT_EQ(m.find("json.exception"), std::string::npos) << m;
}

TEST(ParseJsonTest, EmptyAndTruncatedInputsAreErrors) {
  for (const char* text : {"", "{", "[1,", "\"abc", "{\"a\":1}x", "nul"}) {
    Result<json> j = ParseJson(text, "doc");
    EXPECT_FALSE(j.ok()) << text;
    EXPECT_EQ(j.status().code(), StatusCode::kInvalidArgument) << text;
  }
}

TEST(ParseJsonTest, RefusesDuplicateKeysAtAnyDepth) {
  Result<json> top = ParseJson(R"({"w": 1, "v": 2, "w": 3})", "header");
  ASSERT_FALSE(top.ok());
  EXPECT_NE(top.status().message().find("duplicate key 'w'"), std::string::npos)
      << top.status().message();

  Result<json> nested = ParseJson(R"({"a": {"x": 1}, "b": [{"x": 1, "x": 2}]})", "header");
  ASSERT_FALSE(nested.ok());
  EXPECT_NE(nested.status().message().find("'x'"), std::string::npos);

  // The same key in sibling objects is fine.
  EXPECT_TRUE(ParseJson(R"({"a": {"x": 1}, "b": {"x": 2}})", "header").ok());
}

TEST(ParseJsonTest, RefusesInvalidUtf8InStrings) {
  EXPECT_FALSE(ParseJson("[\"\xff\"]", "doc").ok());
}

}  // namespace
}  // namespace kiln
