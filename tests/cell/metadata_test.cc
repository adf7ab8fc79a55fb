// Tests for metadata.json (cell layer, docs/design.md §6 and §2 law 3): byte-identical round trip,
// strict parsing, and key restatement that names the edited axis.
#include "src/kiln/cell/metadata.h"

#include <gtest/gtest.h>

#include <functional>

#include "src/kiln/base/canonical_json.h"
#include "tests/cell/cell_fixtures.h"

namespace kiln {
namespace {

using cell_testing::SampleMetadata;
using cell_testing::SampleToolchain;

void ExpectError(const Status& s, StatusCode code, const std::string& fragment) {
  ASSERT_FALSE(s.ok()) << "expected an error containing: " << fragment;
  EXPECT_EQ(s.code(), code) << s.ToString();
  EXPECT_NE(s.message().find(fragment), std::string::npos)
      << "message: " << s.message() << "\nexpected fragment: " << fragment;
}

// The serialized sample as JSON, edited by `edit`, back to text.
std::string EditedText(const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j = ParseJson(SerializeMetadata(SampleMetadata()).value(), "sample").value();
  edit(j);
  return j.dump();
}

TEST(MetadataTest, RoundTripIsByteIdentical) {
  const CellMetadata m = SampleMetadata();
  Result<std::string> text = SerializeMetadata(m);
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  Result<CellMetadata> parsed = ParseMetadata(*text, "metadata.json");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  Result<std::string> again = SerializeMetadata(*parsed);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(*again, *text);

  EXPECT_EQ(parsed->key, m.key);
  EXPECT_EQ(parsed->family, m.family);
  EXPECT_EQ(parsed->codegen_version, m.codegen_version);
  EXPECT_EQ(parsed->axes.graph, m.axes.graph);
  EXPECT_EQ(parsed->axes.envelope, m.axes.envelope);
  EXPECT_EQ(parsed->axes.sm, m.axes.sm);
  EXPECT_EQ(parsed->axes.toolchain, m.axes.toolchain);
  EXPECT_EQ(parsed->envelope, m.envelope);
  EXPECT_EQ(parsed->toolchain, m.toolchain);
  EXPECT_EQ(parsed->sm, m.sm);
  EXPECT_EQ(parsed->entries, m.entries);
  EXPECT_EQ(parsed->fence, m.fence);
}

TEST(MetadataTest, SerializedTextIsCanonical) {
  const std::string text = SerializeMetadata(SampleMetadata()).value();
  EXPECT_EQ(text.rfind("{\"axes\":{\"envelope\":", 0), 0u) << text.substr(0, 60);
  EXPECT_EQ(text.find("\": "), std::string::npos);
  EXPECT_NE(text.find("\"dtype\":\"float32\""), std::string::npos);
  EXPECT_EQ(CanonicalJson(ParseJson(text, "t").value()).value(), text);
}

TEST(MetadataTest, SerializeRefusesWhatParseWouldRefuse) {
  CellMetadata m = SampleMetadata();
  m.key = "not-a-key";
  ExpectError(SerializeMetadata(m).status(), StatusCode::kInvalidArgument, "$.key");
  m = SampleMetadata();
  m.toolchain = nlohmann::json{{"opt_level", 2.5}};
  ExpectError(SerializeMetadata(m).status(), StatusCode::kInvalidArgument, "float");
}

TEST(MetadataTest, ParseRefusesUnknownTopLevelFieldByName) {
  const std::string text = EditedText([](nlohmann::json& j) { j["built_at"] = "2024-01-01"; });
  ExpectError(ParseMetadata(text, "metadata.json").status(), StatusCode::kInvalidArgument,
              "unknown field 'built_at'");
}

TEST(MetadataTest, ParseRefusesOtherFormatVersions) {
  const std::string text = EditedText([](nlohmann::json& j) { j["format_version"] = 2; });
  ExpectError(ParseMetadata(text, "metadata.json").status(), StatusCode::kInvalidArgument,
              "$.format_version is 2");
}

TEST(MetadataTest, ParseRefusesMissingField) {
  const std::string text = EditedText([](nlohmann::json& j) { j.erase("family"); });
  ExpectError(ParseMetadata(text, "metadata.json").status(), StatusCode::kInvalidArgument,
              "has no field 'family'");
}

TEST(MetadataTest, ParseRefusesMistypedFields) {
  ExpectError(ParseMetadata(
                  EditedText([](nlohmann::json& j) { j["entries"][1]["workspace_bytes"] = "64"; }),
                  "metadata.json")
                  .status(),
              StatusCode::kInvalidArgument, "$.entries[1].workspace_bytes is a string");
  ExpectError(ParseMetadata(EditedText([](nlohmann::json& j) {
                              j["entries"][0]["inputs"][0]["shape"][0] = -1;
                            }),
                            "metadata.json")
                  .status(),
              StatusCode::kInvalidArgument, "$.entries[0].inputs[0].shape[0]");
  ExpectError(ParseMetadata(EditedText([](nlohmann::json& j) {
                              j["entries"][0]["constants"][0]["dtype"] = "complex64";
                            }),
                            "metadata.json")
                  .status(),
              StatusCode::kInvalidArgument, "unknown dtype 'complex64'");
  ExpectError(
      ParseMetadata(EditedText([](nlohmann::json& j) { j["fence"]["checkpoint_free"] = 1; }),
                    "metadata.json")
          .status(),
      StatusCode::kInvalidArgument, "$.fence.checkpoint_free");
  ExpectError(
      ParseMetadata(EditedText([](nlohmann::json& j) { j["toolchain"] = "g++"; }), "metadata.json")
          .status(),
      StatusCode::kInvalidArgument, "$.toolchain is a string, expected an object");
}

TEST(MetadataTest, ParseRefusesUnknownAxisAndEntryField) {
  ExpectError(ParseMetadata(EditedText([](nlohmann::json& j) { j["axes"]["checkpoint"] = "x"; }),
                            "metadata.json")
                  .status(),
              StatusCode::kInvalidArgument, "$.axes has unknown field 'checkpoint'");
  ExpectError(ParseMetadata(EditedText([](nlohmann::json& j) { j["axes"].erase("toolchain"); }),
                            "metadata.json")
                  .status(),
              StatusCode::kInvalidArgument, "$.axes has no field 'toolchain'");
  ExpectError(ParseMetadata(EditedText([](nlohmann::json& j) { j["entries"][0]["ms"] = 3; }),
                            "metadata.json")
                  .status(),
              StatusCode::kInvalidArgument, "$.entries[0] has unknown field 'ms'");
}

TEST(MetadataTest, ParseRefusesDuplicateKeysAndBadJson) {
  std::string text = SerializeMetadata(SampleMetadata()).value();
  text.insert(1, "\"family\":\"other\",");
  ExpectError(ParseMetadata(text, "metadata.json").status(), StatusCode::kInvalidArgument,
              "duplicate key 'family'");
  ExpectError(ParseMetadata("{\"format_version\":1", "metadata.json").status(),
              StatusCode::kInvalidArgument, "metadata.json: invalid JSON");
  ExpectError(ParseMetadata("[]", "metadata.json").status(), StatusCode::kInvalidArgument,
              "expected an object");
}

TEST(MetadataTest, ParseRefusesEntriesOutOfIndexOrder) {
  ExpectError(ParseMetadata(EditedText([](nlohmann::json& j) { j["entries"][1]["index"] = 5; }),
                            "metadata.json")
                  .status(),
              StatusCode::kInvalidArgument, "$.entries[1].index is 5, expected 1");
}

TEST(MetadataTest, RestateKeyAcceptsTheSample) {
  const CellMetadata m = SampleMetadata();
  Result<std::string> key = RestateKey(m);
  ASSERT_TRUE(key.ok()) << key.status().ToString();
  EXPECT_EQ(*key, m.key);
}

TEST(MetadataTest, RestateKeyRefusesEditedEnvelope) {
  CellMetadata m = SampleMetadata();
  m.envelope["classes"][0]["x"][0] = 2;  // claim a class the key never covered
  ExpectError(RestateKey(m).status(), StatusCode::kInvalidArgument,
              "metadata axis 'envelope' restates to");
}

TEST(MetadataTest, RestateKeyRefusesEditedToolchain) {
  CellMetadata m = SampleMetadata();
  m.toolchain["compiler"] = "g++ 13.1";
  ExpectError(RestateKey(m).status(), StatusCode::kInvalidArgument,
              "metadata axis 'toolchain' restates to '" + FactsDigest(m.toolchain).value() +
                  "' but records '" + m.axes.toolchain + "'");
}

TEST(MetadataTest, RestateKeyRefusesEditedGraphAxis) {
  CellMetadata m = SampleMetadata();
  m.axes.graph = "fedcba9876543210";
  ExpectError(RestateKey(m).status(), StatusCode::kInvalidArgument, "graph=fedcba9876543210");
  ExpectError(RestateKey(m).status(), StatusCode::kInvalidArgument,
              "metadata key '" + m.key + "' does not restate");
}

TEST(MetadataTest, RestateKeyRefusesEditedSm) {
  CellMetadata m = SampleMetadata();
  m.sm = "x86-64-v2";  // the block says one level, the axis another
  ExpectError(RestateKey(m).status(), StatusCode::kInvalidArgument, "metadata axis 'sm'");
  m.axes.sm = "x86-64-v2";  // consistent, but not what the key was minted from
  ExpectError(RestateKey(m).status(), StatusCode::kInvalidArgument, "sm=x86-64-v2");
  m.sm = m.axes.sm = "sm_90";
  ExpectError(RestateKey(m).status(), StatusCode::kInvalidArgument, "key axis 'sm'");
}

TEST(MetadataTest, RestateKeyRefusesEntryOutsideTheEnvelope) {
  CellMetadata m = SampleMetadata();
  m.entries[1].shape_class["x"] = {2, 8};
  ExpectError(RestateKey(m).status(), StatusCode::kInvalidArgument,
              "metadata entry 1 shape class {\"x\":[2,8]} is not a class of the envelope");
}

TEST(MetadataTest, RestateKeyRefusesUncoveredOrDoublyServedClass) {
  CellMetadata m = SampleMetadata();
  m.entries.pop_back();
  ExpectError(RestateKey(m).status(), StatusCode::kInvalidArgument, "has no entry");
  m = SampleMetadata();
  m.entries[1].shape_class = m.entries[0].shape_class;
  ExpectError(RestateKey(m).status(), StatusCode::kInvalidArgument,
              "metadata entry 0 and entry 1 both answer for shape class");
}

// Partial coverage: a class with no entry is named by a gap with its reason; the gaps round-trip,
// a full cell writes no `gaps` field, and every class still has exactly one entry or gap.
TEST(MetadataTest, AGapStandsForAClassWithNoEntryAndNothingElse) {
  CellMetadata m = SampleMetadata();
  const std::string full = SerializeMetadata(m).value();
  EXPECT_EQ(full.find("\"gaps\""), std::string::npos) << "a full cell's bytes changed";
  const ShapeClass dropped = m.entries.back().shape_class;
  m.entries.pop_back();
  m.gaps.push_back(EntryGap{dropped, std::nullopt, "unimplemented: pass lower: no kernel"});
  ASSERT_TRUE(RestateKey(m).ok()) << RestateKey(m).status().ToString();
  Result<std::string> text = SerializeMetadata(m);
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  Result<CellMetadata> parsed = ParseMetadata(*text, "metadata.json");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->gaps, m.gaps);
  EXPECT_EQ(SerializeMetadata(*parsed).value(), *text);

  CellMetadata both = m;
  both.gaps.push_back(EntryGap{m.entries[0].shape_class, std::nullopt, "unimplemented: x"});
  ExpectError(RestateKey(both).status(), StatusCode::kInvalidArgument,
              "metadata entry 0 and gap 1 both answer for shape class");
  CellMetadata outside = m;
  outside.gaps[0].shape_class["x"] = {7, 7};
  ExpectError(RestateKey(outside).status(), StatusCode::kInvalidArgument,
              "metadata gap 0 shape class {\"x\":[7,7]} is not a class of the envelope");
  CellMetadata none = m;
  none.entries.clear();
  none.gaps.clear();
  for (const EntryMetadata& e : m.entries)
    none.gaps.push_back(EntryGap{e.shape_class, std::nullopt, "r"});
  none.gaps.push_back(m.gaps[0]);
  ExpectError(RestateKey(none).status(), StatusCode::kInvalidArgument, "has no entries");

  ExpectError(
      ParseMetadata(EditedText([](nlohmann::json& j) { j["gaps"] = nlohmann::json::array(); }), "m")
          .status(),
      StatusCode::kInvalidArgument, "$.gaps is an empty array");
  ExpectError(ParseMetadata(EditedText([&](nlohmann::json& j) {
                              j["gaps"] = {{{"shape_class", {{"x", {1, 8}}}}, {"reason", ""}}};
                            }),
                            "m")
                  .status(),
              StatusCode::kInvalidArgument, "$.gaps[0].reason is empty");
  ExpectError(ParseMetadata(
                  EditedText([&](nlohmann::json& j) {
                    j["gaps"] = {{{"shape_class", {{"x", {1, 8}}}}, {"reason", "r"}, {"why", "r"}}};
                  }),
                  "m")
                  .status(),
              StatusCode::kInvalidArgument, "$.gaps[0] has unknown field 'why'");
}

// A ranged entry is carried as its pieces (RangedPieces: batch 1 apart from [2, 16]), each an
// entry whose specs name the symbol; they round-trip, the pieces together answer for the declared
// entry, and a cell missing a piece, carrying one the envelope does not declare, or naming the
// entry by a gap beside its pieces, is refused by name.
TEST(MetadataTest, ARangedEntryIsCarriedAsEveryOneOfItsPieces) {
  RangedEntry declared;
  declared.inputs["x"] = {DimSpec{0, "batch"}, DimSpec{8, ""}};
  declared.ranges["batch"] = {1, 16};
  Envelope env = cell_testing::SampleEnvelope();
  env.ranged = {declared};
  CellMetadata m = SampleMetadata();
  m.envelope = EnvelopeFacts(env).value();
  m.axes.envelope = FactsDigest(m.envelope).value();
  m.key = KeyFromAxes(m.axes).value();
  const std::vector<RangedEntry> pieces = RangedPieces(declared);
  ASSERT_EQ(pieces.size(), 2u);
  for (const RangedEntry& piece : pieces) {
    EntryMetadata e;
    e.index = static_cast<uint32_t>(m.entries.size());
    e.ranged = piece;
    e.inputs = {{"x", DType::kFloat32, {0, 8}, false, {"batch", ""}}};
    e.outputs = {{"y", DType::kFloat32, {0, 3}, false, {"batch", ""}}};
    e.workspace_bytes = 16 * 64;
    e.constants = {{"W", DType::kFloat32, {8, 3}}, {"b", DType::kFloat32, {3}}};
    m.entries.push_back(e);
  }
  ASSERT_TRUE(RestateKey(m).ok()) << RestateKey(m).status().ToString();
  Result<std::string> text = SerializeMetadata(m);
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  EXPECT_NE(text->find("\"shape\":[\"batch\",8]"), std::string::npos) << *text;
  Result<CellMetadata> parsed = ParseMetadata(*text, "metadata.json");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->entries, m.entries);
  EXPECT_EQ(SerializeMetadata(*parsed).value(), *text);
  // The entry at a point: its specs' shapes there, and the point as its class.
  const EntryMetadata at = EntryAt(m.entries[3], {{"batch", 5}}).value();
  EXPECT_EQ(at.inputs[0].shape, (Shape{5, 8}));
  EXPECT_EQ(at.outputs[0].shape, (Shape{5, 3}));
  EXPECT_TRUE(at.inputs[0].dim_symbols.empty());
  EXPECT_EQ(at.shape_class.at("x"), (Shape{5, 8}));

  CellMetadata missing = m;
  missing.entries.pop_back();
  ExpectError(RestateKey(missing).status(), StatusCode::kInvalidArgument,
              "has 1 of its 2 pieces as entries and no gap");
  CellMetadata foreign = m;
  foreign.entries[3].ranged->ranges["batch"] = {2, 32};
  ExpectError(RestateKey(foreign).status(), StatusCode::kInvalidArgument,
              "is no piece of a ranged entry of the envelope");
  CellMetadata twice = m;
  twice.entries[2].ranged = twice.entries[3].ranged;
  ExpectError(RestateKey(twice).status(), StatusCode::kInvalidArgument, "both serve ranged piece");
  CellMetadata gap_too = m;
  gap_too.gaps.push_back(EntryGap{{}, declared, "unimplemented: x"});
  ExpectError(RestateKey(gap_too).status(), StatusCode::kInvalidArgument, "has a gap and entries");

  // Parsing: a shape may name only the entry's symbols, and the inputs must be the entry's.
  auto edited = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = ParseJson(*text, "m").value();
    edit(j);
    return ParseMetadata(j.dump(), "m").status();
  };
  ExpectError(edited([](nlohmann::json& j) { j["entries"][3]["outputs"][0]["shape"][0] = "seq"; }),
              StatusCode::kInvalidArgument,
              "$.entries[3].outputs[0].shape[0] is 'seq', expected a dim, a symbol of the entry");
  ExpectError(edited([](nlohmann::json& j) { j["entries"][3]["inputs"][0]["shape"][1] = 9; }),
              StatusCode::kInvalidArgument, "input 'x' is not the ranged entry's input");
  ExpectError(edited([](nlohmann::json& j) { j["entries"][0]["inputs"][0]["shape"][0] = "batch"; }),
              StatusCode::kInvalidArgument, "expected a non-negative integer dim");

  // An output dim may be a polynomial in the symbols ({"poly": "2*batch+1"}): it round-trips and
  // sizes the output at a point; one that is malformed, names another symbol, goes negative at a
  // corner of the range, or stands in an input is refused by name.
  CellMetadata poly = m;
  poly.entries[3].outputs[0].dim_polys = {"", "2*batch+1"};
  poly.entries[3].outputs[0].shape = {0, 0};
  Result<std::string> poly_text = SerializeMetadata(poly);
  ASSERT_TRUE(poly_text.ok()) << poly_text.status().ToString();
  EXPECT_NE(poly_text->find("\"shape\":[\"batch\",{\"poly\":\"2*batch+1\"}]"), std::string::npos)
      << *poly_text;
  Result<CellMetadata> poly_back = ParseMetadata(*poly_text, "metadata.json");
  ASSERT_TRUE(poly_back.ok()) << poly_back.status().ToString();
  EXPECT_EQ(poly_back->entries, poly.entries);
  EXPECT_EQ(EntryAt(poly.entries[3], {{"batch", 5}}).value().outputs[0].shape, (Shape{5, 11}));
  auto with_poly = [&](const std::string& where, int dim, const std::string& p) {
    nlohmann::json j = ParseJson(*text, "m").value();
    j["entries"][3][where][0]["shape"][dim] = nlohmann::json{{"poly", p}};
    return ParseMetadata(j.dump(), "m").status();
  };
  ExpectError(with_poly("outputs", 1, "2**batch"), StatusCode::kInvalidArgument,
              "dim polynomial '2**batch' has a factor that is no number or symbol");
  ExpectError(with_poly("outputs", 1, "2*seq"), StatusCode::kInvalidArgument,
              "is 2*seq, whose 'seq' is no symbol of the entry");
  ExpectError(with_poly("outputs", 1, "8-batch"), StatusCode::kInvalidArgument,
              "is 8-batch, which is no size >= 0 at a corner of the entry's ranges");
  ExpectError(with_poly("outputs", 1, "99999999999*batch*batch"), StatusCode::kInvalidArgument,
              "repeats symbol 'batch' in one term");
  ExpectError(with_poly("inputs", 1, "2*batch"), StatusCode::kInvalidArgument,
              "input 'x' has a dim polynomial");
}

TEST(MetadataTest, DimPolynomialsReadBackWhatTheyPrint) {
  for (const std::string text : {"2*batch*seq+1", "-3", "n", "seq-1", "4*side+2", "0"}) {
    Result<SymDim> d = ParseSymDim(text);
    ASSERT_TRUE(d.ok()) << text << ": " << d.status().ToString();
    EXPECT_EQ(d->ToString(), text);
  }
  for (const std::string text : {"", "2*", "+", "a b", "3 4", "2*3", "1-1x", "*n"}) {
    EXPECT_FALSE(ParseSymDim(text).ok()) << "'" << text << "'";
  }
  EXPECT_EQ(ParseSymDim("n+n").value().ToString(), "2*n");
  EXPECT_EQ(ParseSymDim("n-n").value().ToString(), "0");
}

TEST(MetadataTest, RestateKeyRefusesNonCanonicalEnvelope) {
  CellMetadata m = SampleMetadata();
  m.envelope["note"] = "extra";
  m.axes.envelope = FactsDigest(m.envelope).value();  // digest-consistent, still refused
  m.key = KeyFromAxes(m.axes).value();
  ExpectError(RestateKey(m).status(), StatusCode::kInvalidArgument, "not in canonical form");
}

}  // namespace
}  // namespace kiln
