// Tests for admission (cell layer, docs/design.md §2 laws 3-4): a good cell is admitted, and each
// refusal token has its own case whose message starts with the token and names the values.
#include "src/kiln/cell/admission.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "src/kiln/base/canonical_json.h"
#include "src/kiln/base/sha256.h"
#include "tests/cell/cell_fixtures.h"

namespace kiln {
namespace {

using cell_testing::SampleCellBytes;
using cell_testing::SampleFiles;
using cell_testing::SampleMetadata;
using cell_testing::SampleToolchain;

AdmissionPolicy Policy(const std::string& local_sm = "x86-64-v3") {
  AdmissionPolicy p;
  p.expected_key = SampleMetadata().key;
  p.local_sm = local_sm;
  p.local_toolchain = SampleToolchain();
  return p;
}

void ExpectRefusal(const Result<AdmittedCell>& r, const std::string& token, StatusCode code,
                   const std::string& fragment) {
  ASSERT_FALSE(r.ok()) << "expected " << token;
  const Status s = r.status();
  EXPECT_EQ(s.token(), token) << s.ToString();
  EXPECT_EQ(s.code(), code) << s.ToString();
  EXPECT_EQ(s.message().rfind(token + ": ", 0), 0u) << s.message();
  EXPECT_NE(s.message().find(fragment), std::string::npos)
      << "message: " << s.message() << "\nexpected fragment: " << fragment;
}

// The sample cell with its metadata.json replaced by `text`, repacked.
std::string WithMetadataText(const std::string& text) {
  CellFiles f = SampleFiles();
  f.metadata_json = text;
  return PackCell(f).value();
}

// Law 2 at adoption: a cell whose metadata does not record a passed fence proof is refused.
TEST(AdmissionTest, UnprovenFenceIsRefused) {
  CellMetadata m = SampleMetadata();
  m.fence.perturbed_checkpoint_matched = false;
  CellFiles f = SampleFiles();
  f.metadata_json = SerializeMetadata(m).value();
  const std::string bytes = PackCell(f).value();
  ExpectRefusal(AdmitCell(bytes, "", 0, Policy()), "fence_unproven", StatusCode::kInvalidArgument,
                "perturbed_checkpoint_matched=false");
}

TEST(AdmissionTest, AdmitsAGoodCell) {
  const std::string bytes = SampleCellBytes();
  Result<AdmittedCell> r = AdmitCell(bytes, CellDigest(bytes), bytes.size(), Policy());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->digest, CellDigest(bytes));
  EXPECT_EQ(r->metadata.key, SampleMetadata().key);
  EXPECT_EQ(r->files.shared_object, SampleFiles().shared_object);
  // Digest and size are optional checks.
  EXPECT_TRUE(AdmitCell(bytes, "", 0, Policy()).ok());
}

TEST(AdmissionTest, SizeLieIsSizeMismatch) {
  const std::string bytes = SampleCellBytes();
  ExpectRefusal(AdmitCell(bytes, CellDigest(bytes), bytes.size() + 1, Policy()), "size_mismatch",
                StatusCode::kCorruption,
                "cell is " + std::to_string(bytes.size()) + " bytes, expected " +
                    std::to_string(bytes.size() + 1));
}

TEST(AdmissionTest, WrongDigestIsDigestMismatch) {
  const std::string bytes = SampleCellBytes();
  const std::string wrong = "sha256:" + std::string(64, '0');
  ExpectRefusal(AdmitCell(bytes, wrong, bytes.size(), Policy()), "digest_mismatch",
                StatusCode::kCorruption,
                "cell bytes hash to " + CellDigest(bytes) + ", expected " + wrong);
}

TEST(AdmissionTest, BrokenArchiveIsCellCorrupt) {
  const std::string bytes = SampleCellBytes();
  const std::string cut = bytes.substr(0, bytes.size() - 700);
  ExpectRefusal(AdmitCell(cut, "", 0, Policy()), "cell_corrupt", StatusCode::kCorruption,
                "truncated archive");
}

TEST(AdmissionTest, UnparsableMetadataIsMetadataInvalid) {
  ExpectRefusal(AdmitCell(WithMetadataText("{\"format_version\":1}"), "", 0, Policy()),
                "metadata_invalid", StatusCode::kInvalidArgument, "has no field 'key'");
  ExpectRefusal(AdmitCell(WithMetadataText("not json"), "", 0, Policy()), "metadata_invalid",
                StatusCode::kInvalidArgument, "invalid JSON");
}

TEST(AdmissionTest, EditedMetadataIsKeyMismatch) {
  // Someone relabels the cell's toolchain without changing its key: the restatement catches it.
  CellMetadata m = SampleMetadata();
  m.toolchain["compiler"] = "g++ 13.1";
  ExpectRefusal(AdmitCell(WithMetadataText(SerializeMetadata(m).value()), "", 0, Policy()),
                "key_mismatch", StatusCode::kInvalidArgument, "metadata axis 'toolchain'");
}

TEST(AdmissionTest, CellOfAnotherKeyIsKeyMismatch) {
  // Self-consistent metadata of another key (another graph) is still not the cell asked for.
  CellMetadata m = SampleMetadata();
  m.axes.graph = "fedcba9876543210";
  m.key = KeyFromAxes(m.axes).value();
  ExpectRefusal(AdmitCell(SampleCellBytes(m), "", 0, Policy()), "key_mismatch",
                StatusCode::kInvalidArgument,
                "cell restates to key '" + m.key + "', expected '" + SampleMetadata().key + "'");
}

TEST(AdmissionTest, V4CellOnV3MachineIsSmMismatch) {
  const CellMetadata v4 = SampleMetadata("x86-64-v4");
  AdmissionPolicy policy = Policy("x86-64-v3");
  policy.expected_key = v4.key;
  ExpectRefusal(AdmitCell(SampleCellBytes(v4), "", 0, policy), "sm_mismatch",
                StatusCode::kInvalidArgument,
                "cell is built for 'x86-64-v4', this machine runs up to 'x86-64-v3'");
}

TEST(AdmissionTest, LowerLevelCellRunsOnHigherMachine) {
  EXPECT_TRUE(AdmitCell(SampleCellBytes(), "", 0, Policy("x86-64-v4")).ok());
}

TEST(AdmissionTest, UnknownLocalLevelIsSmMismatch) {
  ExpectRefusal(AdmitCell(SampleCellBytes(), "", 0, Policy("sm_90")), "sm_mismatch",
                StatusCode::kInvalidArgument, "this machine's level 'sm_90' is not a known level");
}

TEST(AdmissionTest, DifferentToolchainIsToolchainMismatchNamingTheField) {
  AdmissionPolicy policy = Policy();
  policy.local_toolchain["compiler"] = "g++ 13.1";
  ExpectRefusal(AdmitCell(SampleCellBytes(), "", 0, policy), "toolchain_mismatch",
                StatusCode::kInvalidArgument,
                "toolchain_mismatch: field 'compiler' is 'g++ 12.2' in the cell, 'g++ 13.1' here");
}

TEST(AdmissionTest, ToolchainDifferencesNameNestedAndAbsentFields) {
  AdmissionPolicy policy = Policy();
  policy.local_toolchain["kernel_libs"]["onednn"] = "3.5.0";
  ExpectRefusal(AdmitCell(SampleCellBytes(), "", 0, policy), "toolchain_mismatch",
                StatusCode::kInvalidArgument,
                "field 'kernel_libs.onednn' is '3.4.1' in the cell, '3.5.0' here");
  policy = Policy();
  policy.local_toolchain["sanitizer"] = "asan";
  ExpectRefusal(AdmitCell(SampleCellBytes(), "", 0, policy), "toolchain_mismatch",
                StatusCode::kInvalidArgument,
                "field 'sanitizer' is absent in the cell, 'asan' here");
  policy = Policy();
  policy.local_toolchain["flags"][0] = "-O3";
  ExpectRefusal(AdmitCell(SampleCellBytes(), "", 0, policy), "toolchain_mismatch",
                StatusCode::kInvalidArgument, "field 'flags' is '[\"-O2\"");
}

TEST(AdmissionTest, ChecksRunInOrder) {
  // Bytes that are wrong in every way report the first check only.
  const std::string bytes = "garbage";
  ExpectRefusal(AdmitCell(bytes, "sha256:" + std::string(64, '1'), 8, Policy("sm_90")),
                "size_mismatch", StatusCode::kCorruption, "expected 8");
  ExpectRefusal(AdmitCell(bytes, "sha256:" + std::string(64, '1'), 7, Policy("sm_90")),
                "digest_mismatch", StatusCode::kCorruption, "expected sha256:");
  ExpectRefusal(AdmitCell(bytes, "", 7, Policy("sm_90")), "cell_corrupt", StatusCode::kCorruption,
                "truncated archive");
}

// The bytes' own checks hold on any machine: a cell built for another machine passes
// AdmitBytes (what the hub runs at publish) and is refused only by CheckMachine.
TEST(AdmissionTest, AdmitBytesIsMachineIndependentAndCheckMachineIsNot) {
  const CellMetadata v4 = SampleMetadata("x86-64-v4");
  Result<AdmittedCell> bytes = AdmitBytes(SampleCellBytes(v4), "", 0, BytesPolicy{v4.key});
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  Status machine = CheckMachine(bytes->metadata, "x86-64-v3", SampleToolchain());
  EXPECT_TRUE(machine.Is("sm_mismatch")) << machine.ToString();
  nlohmann::json other = SampleToolchain();
  other["compiler"] = "clang 17";
  EXPECT_TRUE(CheckMachine(bytes->metadata, "x86-64-v4", other).Is("toolchain_mismatch"));
  EXPECT_TRUE(CheckMachine(bytes->metadata, "x86-64-v4", SampleToolchain()).ok());
}

// A cell whose members are files in name only: an empty or oversized or non-ELF shared object,
// or no source to check it against.
TEST(AdmissionTest, ImplausibleSharedObjectOrMissingSourceIsRefused) {
  auto with = [](auto edit) {
    CellFiles f = SampleFiles();
    edit(f);
    return PackCell(f).value();
  };
  ExpectRefusal(AdmitCell(with([](CellFiles& f) { f.shared_object.clear(); }), "", 0, Policy()),
                "shared_object_invalid", StatusCode::kInvalidArgument, "is 0 bytes");
  ExpectRefusal(AdmitCell(with([](CellFiles& f) { f.shared_object = "#!/bin/sh\nrm -rf /\n"; }), "",
                          0, Policy()),
                "shared_object_invalid", StatusCode::kInvalidArgument, "ELF magic");
  AdmissionPolicy small = Policy();
  small.max_shared_object_bytes = 1000;
  ExpectRefusal(AdmitCell(SampleCellBytes(), "", 0, small), "shared_object_invalid",
                StatusCode::kInvalidArgument, "1507 bytes, over the bound of 1000");
  ExpectRefusal(AdmitCell(with([](CellFiles& f) { f.source.clear(); }), "", 0, Policy()),
                "source_missing", StatusCode::kInvalidArgument, "source/cell.cc");
}

// The hub admits a stored cell in pieces (AdmitArchive), never holding its bytes: on every cell,
// good or broken in any of the ways above, it says exactly what AdmitBytes says, and for a good
// one where each member lies and the digests a receipt states.
TEST(AdmissionTest, AdmittingInPiecesAgreesWithAdmittingBytes) {
  auto with = [](auto edit) {
    CellFiles f = SampleFiles();
    edit(f);
    return PackCell(f).value();
  };
  CellMetadata unproven = SampleMetadata();
  unproven.fence.constant_table_complete = false;
  const std::vector<std::string> cells = {
      SampleCellBytes(),
      "not a tar",
      SampleCellBytes() + "trailing",
      WithMetadataText("{"),
      WithMetadataText(SerializeMetadata(unproven).value()),
      with([](CellFiles& f) { f.shared_object.clear(); }),
      with([](CellFiles& f) { f.shared_object = "#!/bin/sh\n"; }),
      with([](CellFiles& f) { f.source.clear(); }),
      SampleCellBytes().substr(0, 1000),
  };
  const BytesPolicy policy{SampleMetadata().key};
  for (size_t i = 0; i < cells.size(); ++i) {
    const std::string& bytes = cells[i];
    for (const std::string& digest : {std::string(), CellDigest(bytes), CellDigest("other")}) {
      for (uint64_t size : {uint64_t{0}, uint64_t{bytes.size()}, uint64_t{bytes.size() + 1}}) {
        Result<AdmittedCell> whole = AdmitBytes(bytes, digest, size, policy);
        // Pieces of 7 bytes: no read lines up with a header or a member.
        ArchiveReader in_sevens = [&bytes](uint64_t offset, char* out, size_t len) {
          return ReadFromBytes(bytes)(offset, out, std::min<size_t>(len, 7));
        };
        Result<AdmittedLayout> pieces = AdmitArchive(in_sevens, bytes.size(), digest, size, policy);
        ASSERT_EQ(whole.ok(), pieces.ok()) << "cell " << i << ": " << whole.status().ToString()
                                           << " vs " << pieces.status().ToString();
        if (!whole.ok()) {
          EXPECT_EQ(whole.status().token(), pieces.status().token()) << "cell " << i;
          EXPECT_EQ(whole.status().message(), pieces.status().message()) << "cell " << i;
          continue;
        }
        EXPECT_EQ(pieces->digest, whole->digest);
        EXPECT_EQ(pieces->metadata.key, whole->metadata.key);
        EXPECT_EQ(pieces->so_digest, "sha256:" + Sha256Hex(whole->files.shared_object));
        EXPECT_EQ(pieces->source_digest, "sha256:" + Sha256Hex(whole->files.source));
        EXPECT_EQ(bytes.substr(pieces->layout.source.offset, pieces->layout.source.size),
                  whole->files.source);
        EXPECT_EQ(bytes.substr(pieces->layout.shared_object.offset,
                               pieces->layout.shared_object.size),
                  whole->files.shared_object);
      }
    }
  }
}

TEST(AdmissionTest, RefusalTokenIsAFieldThatSurvivesContext) {
  auto bytes = std::string("not a tar");
  Result<AdmittedCell> r = AdmitCell(bytes, "sha256:" + std::string(64, '1'), 0, Policy("sm_90"));
  ASSERT_FALSE(r.ok());
  const Status wrapped = r.status().WithContext("boot target 'mlp'").WithContext("worker");
  EXPECT_EQ(wrapped.token(), "digest_mismatch") << wrapped.ToString();
  // A message that only reads like a refusal carries no token.
  EXPECT_EQ(Status::InvalidArgument("sm_mismatch: x").token(), "");
}

}  // namespace
}  // namespace kiln
