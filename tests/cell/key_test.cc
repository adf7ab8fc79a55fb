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

RangedEntry Ranged(int64_t lo, int64_t hi) {
  RangedEntry r;
  r.inputs["ids"] = {DimSpec{0, "batch"}, DimSpec{0, "seq"}};
  r.inputs["mask"] = {DimSpec{0, "batch"}, DimSpec{0, "seq"}};
  r.ranges["batch"] = {1, 8};
  r.ranges["seq"] = {lo, hi};
  return r;
}

// Ranged entries are keyed by their ranges: the same ranges share a key whatever the order they
// are declared in, another range is another key, and an envelope of classes alone keys exactly as
// before ranged entries existed (no `ranged` field in its facts).
TEST(KeyTest, RangedEntriesAreKeyedByTheirRanges) {
  Envelope classes;
  classes.classes = {{{"ids", {1, 7}}, {"mask", {1, 7}}}};
  EXPECT_FALSE(EnvelopeFacts(classes).value().contains("ranged"));
  EXPECT_EQ(EnvelopeFacts(classes).value().dump(), R"({"classes":[{"ids":[1,7],"mask":[1,7]}]})");

  Envelope a;
  a.ranged = {Ranged(1, 256)};
  Envelope same = a;
  Envelope wider;
  wider.ranged = {Ranged(1, 512)};
  const std::string da = FactsDigest(EnvelopeFacts(a).value()).value();
  EXPECT_EQ(da, FactsDigest(EnvelopeFacts(same).value()).value());
  EXPECT_NE(da, FactsDigest(EnvelopeFacts(wider).value()).value());
  Envelope mixed = a;
  mixed.classes = classes.classes;
  EXPECT_NE(da, FactsDigest(EnvelopeFacts(mixed).value()).value());
  Envelope two_orders_1, two_orders_2;
  two_orders_1.ranged = {Ranged(1, 16), Ranged(17, 256)};
  two_orders_2.ranged = {Ranged(17, 256), Ranged(1, 16)};
  EXPECT_EQ(FactsDigest(EnvelopeFacts(two_orders_1).value()).value(),
            FactsDigest(EnvelopeFacts(two_orders_2).value()).value());

  Result<Envelope> back = EnvelopeFromFacts(EnvelopeFacts(mixed).value());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->ranged, mixed.ranged);
  EXPECT_EQ(back->classes, mixed.classes);

  Envelope unranged;
  unranged.ranged = {Ranged(1, 256)};
  unranged.ranged[0].ranges.erase("seq");
  Result<nlohmann::json> r = EnvelopeFacts(unranged);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("symbol 'seq', which has no range"), std::string::npos)
      << r.status().ToString();
  Envelope upside_down;
  upside_down.ranged = {Ranged(9, 3)};
  EXPECT_FALSE(EnvelopeFacts(upside_down).ok());
  nlohmann::json bad = EnvelopeFacts(a).value();
  bad["ranged"][0]["ranges"]["seq"] = {1};
  EXPECT_FALSE(EnvelopeFromFacts(bad).ok());

  // A step is part of the range: it moves the key, and an entry without one hashes as [lo, hi].
  Envelope stepped, stepped_wider;
  stepped.ranged = {Ranged(1, 256)};
  stepped_wider.ranged = {Ranged(1, 256)};
  ASSERT_TRUE(SetRangeSpec(&stepped.ranged[0], "seq", {1, 256, 5}));
  ASSERT_TRUE(SetRangeSpec(&stepped_wider.ranged[0], "seq", {1, 256, 15}));
  const std::string plain_digest = FactsDigest(EnvelopeFacts(a).value()).value();
  EXPECT_NE(FactsDigest(EnvelopeFacts(stepped).value()).value(), plain_digest);
  EXPECT_NE(FactsDigest(EnvelopeFacts(stepped).value()).value(),
            FactsDigest(EnvelopeFacts(stepped_wider).value()).value());
  EXPECT_EQ(EnvelopeFacts(a).value()["ranged"][0]["ranges"]["seq"], nlohmann::json({1, 256}));
  Result<Envelope> stepped_back = EnvelopeFromFacts(EnvelopeFacts(stepped).value());
  ASSERT_TRUE(stepped_back.ok()) << stepped_back.status().ToString();
  EXPECT_EQ(stepped_back->ranged, stepped.ranged);
}

// A request against a ranged entry: it fits with each symbol's value; otherwise the first
// difference is named, worst kind first (names or rank, a fixed dim, a symbol's two values, a
// value outside its range).
TEST(ShapeClassTest, MatchRangedNamesTheFirstDifference) {
  const RangedEntry e = Ranged(1, 256);
  RangedMatch m = MatchRanged(e, {{"ids", {3, 128}}, {"mask", {3, 128}}});
  EXPECT_EQ(m.fit, RangedFit::kFits) << m.detail;
  EXPECT_EQ(m.values.at("batch"), 3);
  EXPECT_EQ(m.values.at("seq"), 128);
  m = MatchRanged(e, {{"ids", {3, 128}}, {"mask", {3, 127}}});
  EXPECT_EQ(m.fit, RangedFit::kSymbolInconsistent);
  EXPECT_NE(m.detail.find("symbol 'seq' is 128 at input 'ids' dim 1 but 127 at input 'mask' dim 1"),
            std::string::npos)
      << m.detail;
  m = MatchRanged(e, {{"ids", {3, 257}}, {"mask", {3, 257}}});
  EXPECT_EQ(m.fit, RangedFit::kOutOfRange);
  EXPECT_NE(m.detail.find("symbol 'seq' is 257"), std::string::npos) << m.detail;
  EXPECT_NE(m.detail.find("outside its declared range [1, 256]"), std::string::npos) << m.detail;
  m = MatchRanged(e, {{"ids", {3, 0}}, {"mask", {3, 0}}});
  EXPECT_EQ(m.fit, RangedFit::kOutOfRange);
  m = MatchRanged(e, {{"ids", {3, 8, 1}}, {"mask", {3, 8}}});
  EXPECT_EQ(m.fit, RangedFit::kNamesOrRank);
  m = MatchRanged(e, {{"ids", {3, 8}}});
  EXPECT_EQ(m.fit, RangedFit::kNamesOrRank);
  RangedEntry fixed;
  fixed.inputs["x"] = {DimSpec{0, "b"}, DimSpec{64, ""}};
  fixed.ranges["b"] = {1, 16};
  m = MatchRanged(fixed, {{"x", {2, 63}}});
  EXPECT_EQ(m.fit, RangedFit::kDim);
  EXPECT_NE(m.detail.find("dim 1 must be 64"), std::string::npos) << m.detail;
  EXPECT_EQ(DescribeRanged(fixed), "{x=[b,64] b=[1,16]}");
}

// A stepped symbol takes lo, lo + step, ..., hi: a value between is refused as outside what was
// declared (the same kind as one past hi), naming the grid; pieces and probes stay on it.
TEST(ShapeClassTest, AStepIsAGridMatchedProbedAndSplitOnIt) {
  RangedEntry e;
  e.inputs["img"] = {DimSpec{0, "b"}, DimSpec{3, ""}, DimSpec{0, "side"}, DimSpec{0, "side"}};
  e.ranges["b"] = {1, 4};
  ASSERT_TRUE(SetRangeSpec(&e, "side", {64, 256, 32}));
  ASSERT_TRUE(CheckRangedEntry(e, "e").ok());
  RangedMatch m = MatchRanged(e, {{"img", {2, 3, 160, 160}}});
  EXPECT_EQ(m.fit, RangedFit::kFits) << m.detail;
  EXPECT_EQ(m.values.at("side"), 160);
  m = MatchRanged(e, {{"img", {2, 3, 100, 100}}});
  EXPECT_EQ(m.fit, RangedFit::kOutOfRange);
  EXPECT_NE(m.detail.find("symbol 'side' is 100 (input 'img' dim 2), not one of its declared "
                          "values 64, 96, ..., 256 (step 32)"),
            std::string::npos)
      << m.detail;
  EXPECT_EQ(CoordinateOf(e, "side", 160), 5);
  EXPECT_EQ(ValueAt(e, "side", 5), 160);
  for (const SymbolPoint& p : RangeProbePoints(e)) {
    EXPECT_EQ((p.at("side") - 64) % 32, 0) << DescribePoint(p);
    EXPECT_GE(p.at("side"), 64);
    EXPECT_LE(p.at("side"), 256);
  }
  // An offset grid keeps its offset in coordinates; values below 2 are split off on the grid.
  RangedEntry low;
  low.inputs["x"] = {DimSpec{0, "n"}};
  ASSERT_TRUE(SetRangeSpec(&low, "n", {1, 97, 32}));
  EXPECT_EQ(ValueAt(low, "n", CoordinateOf(low, "n", 65)), 65);
  const std::vector<RangedEntry> pieces = RangedPieces(low);
  ASSERT_EQ(pieces.size(), 2u);
  EXPECT_EQ(DescribeRanged(pieces[0]), "{x=[n] n=[1,1]}");
  EXPECT_EQ(DescribeRanged(pieces[1]), "{x=[n] n=[33,97,32]}");
  ASSERT_TRUE(SetRangeSpec(&low, "n", {1, 98, 32}));
  EXPECT_NE(CheckRangedEntry(low, "e").message().find("98 is not on the step's grid"),
            std::string::npos);
}

TEST(ShapeClassTest, RangedEntriesWhoseRangesMeetMayOverlap) {
  EXPECT_TRUE(MayOverlap(Ranged(1, 16), Ranged(16, 256)));
  EXPECT_FALSE(MayOverlap(Ranged(1, 16), Ranged(17, 256)));
  RangedEntry fixed;
  fixed.inputs["ids"] = {DimSpec{0, "b"}, DimSpec{300, ""}};
  fixed.inputs["mask"] = {DimSpec{0, "b"}, DimSpec{300, ""}};
  fixed.ranges["b"] = {1, 4};
  EXPECT_FALSE(MayOverlap(Ranged(1, 256), fixed));
  fixed.inputs["ids"][1].size = 200;
  fixed.inputs["mask"][1].size = 200;
  EXPECT_TRUE(MayOverlap(Ranged(1, 256), fixed));
}

TEST(KeyTest, SmLevelsAreOrderedLowestFirst) {
  const auto& levels = KnownSmLevels();
  ASSERT_EQ(levels.size(), 4u);
  EXPECT_EQ(levels.front(), "x86-64");
  EXPECT_EQ(levels.back(), "x86-64-v4");
}

}  // namespace
}  // namespace kiln
