// Tests for the cell key (cell layer, docs/design.md §5): one fixed set of axes gives one pinned
// key, every axis moves the key, and malformed axes are refused by name.
#include "src/kiln/cell/key.h"

#include <gtest/gtest.h>

#include <set>

#include "src/kiln/base/canonical_json.h"

namespace kiln {
namespace {

KeyAxes FixedAxes() {
  KeyAxes a;
  a.graph = "0123456789abcdef";
  a.envelope = "fedcba9876543210";
  a.sm = "x86-64-v3";
  a.toolchain = "00112233445566ff";
  return a;
}

TEST(KeyTest, FixedAxesGivePinnedKey) {
  // Pinned once: a change here means every published cell changes key (a format break). Checked
  // independently: sha256 of {"envelope":"fedcba9876543210","graph":"0123456789abcdef",
  // "sm":"x86-64-v3","toolchain":"00112233445566ff"}, first 56 hex.
  Result<std::string> key = KeyFromAxes(FixedAxes());
  ASSERT_TRUE(key.ok()) << key.status().ToString();
  EXPECT_EQ(*key, "ck1-bb5b3edc2bece024bee748c705e1f1a4c124b31b1a4e45d7347f009e");
  EXPECT_TRUE(IsWellFormedKey(*key));
}

TEST(KeyTest, EveryAxisChangesTheKey) {
  std::set<std::string> keys = {KeyFromAxes(FixedAxes()).value()};
  KeyAxes a = FixedAxes();
  a.graph = "0123456789abcdee";
  keys.insert(KeyFromAxes(a).value());
  a = FixedAxes();
  a.envelope = "fedcba9876543211";
  keys.insert(KeyFromAxes(a).value());
  a = FixedAxes();
  a.sm = "x86-64-v4";
  keys.insert(KeyFromAxes(a).value());
  a = FixedAxes();
  a.toolchain = "00112233445566fe";
  keys.insert(KeyFromAxes(a).value());
  EXPECT_EQ(keys.size(), 5u);
}

TEST(KeyTest, MalformedAxesAreRefusedByName) {
  struct Case {
    const char* axis;
    void (*edit)(KeyAxes&);
  };
  const Case cases[] = {
      {"graph", [](KeyAxes& a) { a.graph = "0123456789ABCDEF"; }},
      {"graph", [](KeyAxes& a) { a.graph = ""; }},
      {"envelope", [](KeyAxes& a) { a.envelope = "fedcba987654321"; }},
      {"toolchain", [](KeyAxes& a) { a.toolchain = "00112233445566fg"; }},
      {"sm", [](KeyAxes& a) { a.sm = "sm_90"; }},
      {"sm", [](KeyAxes& a) { a.sm = ""; }},
  };
  for (const Case& c : cases) {
    KeyAxes a = FixedAxes();
    c.edit(a);
    Result<std::string> key = KeyFromAxes(a);
    ASSERT_FALSE(key.ok()) << c.axis;
    EXPECT_EQ(key.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(key.status().message().find(std::string("axis '") + c.axis + "'"), std::string::npos)
        << key.status().message();
  }
}

TEST(KeyTest, WellFormedKeyShape) {
  const std::string key = KeyFromAxes(FixedAxes()).value();
  EXPECT_TRUE(IsWellFormedKey(key));
  EXPECT_FALSE(IsWellFormedKey(""));
  EXPECT_FALSE(IsWellFormedKey(key.substr(0, 59)));
  EXPECT_FALSE(IsWellFormedKey(key + "0"));
  EXPECT_FALSE(IsWellFormedKey("ck2-" + key.substr(4)));
  std::string upper = key;
  upper[10] = 'A';
  EXPECT_FALSE(IsWellFormedKey(upper));
  EXPECT_FALSE(IsWellFormedKey("ck1-../../../../etc/passwd" + std::string(34, '0')));
}

TEST(KeyTest, EnvelopeFactsAreOrderIndependentAndRefuseBadEnvelopes) {
  Envelope a;
  a.classes = {{{"x", {1, 8}}}, {{"x", {4, 8}}}};
  Envelope b;
  b.classes = {{{"x", {4, 8}}}, {{"x", {1, 8}}}};
  EXPECT_EQ(FactsDigest(EnvelopeFacts(a).value()).value(),
            FactsDigest(EnvelopeFacts(b).value()).value());

  EXPECT_FALSE(EnvelopeFacts(Envelope{}).ok());
  Envelope dup;
  dup.classes = {{{"x", {1, 8}}}, {{"x", {1, 8}}}};
  Result<nlohmann::json> r = EnvelopeFacts(dup);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("declared twice"), std::string::npos);
  Envelope neg;
  neg.classes = {{{"x", {-1, 8}}}};
  EXPECT_FALSE(EnvelopeFacts(neg).ok());

  Result<Envelope> back = EnvelopeFromFacts(EnvelopeFacts(a).value());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(EnvelopeFacts(*back).value(), EnvelopeFacts(a).value());
}

TEST(KeyTest, SmLevelsAreOrderedLowestFirst) {
  const auto& levels = KnownSmLevels();
  ASSERT_EQ(levels.size(), 4u);
  EXPECT_EQ(levels.front(), "x86-64");
  EXPECT_EQ(levels.back(), "x86-64-v4");
}

}  // namespace
}  // namespace kiln
