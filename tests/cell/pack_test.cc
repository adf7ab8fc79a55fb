// Tests for cell packing (cell layer, docs/design.md §6): the tar is deterministic and readable by
// ordinary tar, and unpack refuses every malformed archive by name. Malformed archives are built
// with RawHeader below, an independent ustar writer, so these tests do not trust pack.cc's own.
#include "src/kiln/cell/pack.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>

#include "src/kiln/base/file.h"
#include "tests/cell/cell_fixtures.h"

namespace kiln {
namespace {

using cell_testing::SampleFiles;

// One ustar header as any tar writer would make it, with a correct checksum.
std::string RawHeader(const std::string& name, unsigned long long size, char typeflag = '0',
                      const std::string& prefix = "", const std::string& linkname = "") {
  std::string h(512, '\0');
  std::memcpy(h.data(), name.data(), std::min<size_t>(name.size(), 100));
  std::snprintf(&h[100], 8, "%07o", 0644);
  std::snprintf(&h[108], 8, "%07o", 0);
  std::snprintf(&h[116], 8, "%07o", 0);
  std::snprintf(&h[124], 12, "%011llo", size);
  std::snprintf(&h[136], 12, "%011o", 0);
  h[156] = typeflag;
  std::memcpy(&h[157], linkname.data(), std::min<size_t>(linkname.size(), 100));
  std::memcpy(&h[257],
              "ustar\0"
              "00",
              8);
  std::snprintf(&h[329], 8, "%07o", 0);
  std::snprintf(&h[337], 8, "%07o", 0);
  std::memcpy(&h[345], prefix.data(), std::min<size_t>(prefix.size(), 155));
  std::memset(&h[148], ' ', 8);
  unsigned sum = 0;
  for (unsigned char c : h) sum += c;
  std::snprintf(&h[148], 8, "%06o", sum);
  h[155] = ' ';
  return h;
}

std::string Member(const std::string& name, const std::string& bytes, char typeflag = '0') {
  std::string out = RawHeader(name, bytes.size(), typeflag) + bytes;
  out.append((512 - bytes.size() % 512) % 512, '\0');
  return out;
}

std::string End() { return std::string(1024, '\0'); }

// The three valid members, by raw construction.
std::string ValidMembers() {
  const CellFiles f = SampleFiles();
  return Member("metadata.json", f.metadata_json) + Member("cell.so", f.shared_object) +
         Member("source/cell.cc", f.source);
}

void ExpectRefused(const std::string& tar, const std::string& fragment) {
  Result<CellFiles> r = UnpackCell(tar, "cell under test");
  ASSERT_FALSE(r.ok()) << "expected refusal containing: " << fragment;
  EXPECT_EQ(r.status().code(), StatusCode::kCorruption) << r.status().ToString();
  EXPECT_EQ(r.status().message().rfind("cell under test: ", 0), 0u) << r.status().message();
  EXPECT_NE(r.status().message().find(fragment), std::string::npos)
      << "message: " << r.status().message() << "\nexpected fragment: " << fragment;
}

TEST(PackTest, PackingTwiceGivesSameBytesAndDigest) {
  const CellFiles f = SampleFiles();
  Result<std::string> a = PackCell(f);
  Result<std::string> b = PackCell(f);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
  EXPECT_EQ(CellDigest(*a), CellDigest(*b));
  const std::string digest = CellDigest(*a);
  ASSERT_EQ(digest.size(), 7u + 64u);
  EXPECT_EQ(digest.rfind("sha256:", 0), 0u);
  EXPECT_EQ(CellRef("ck1-abc", digest), "ck1-abc@" + digest);
}

TEST(PackTest, LayoutMatchesAnIndependentUstarWriter) {
  const std::string packed = PackCell(SampleFiles()).value();
  EXPECT_EQ(packed, ValidMembers() + End());
  EXPECT_EQ(packed.size() % 512, 0u);
  EXPECT_EQ(packed.substr(136, 12), std::string("00000000000\0", 12));  // mtime 0
  EXPECT_EQ(packed.substr(108, 8), std::string("0000000\0", 8));        // uid 0
}

TEST(PackTest, UnpackRoundTrips) {
  const CellFiles f = SampleFiles();
  Result<CellFiles> back = UnpackCell(PackCell(f).value(), "cell");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->metadata_json, f.metadata_json);
  EXPECT_EQ(back->shared_object, f.shared_object);
  EXPECT_EQ(back->source, f.source);

  CellFiles edge;  // empty members and a member of exactly one block
  edge.metadata_json = "{}";
  edge.shared_object = std::string(512, '\1');
  Result<CellFiles> back2 = UnpackCell(PackCell(edge).value(), "cell");
  ASSERT_TRUE(back2.ok()) << back2.status().ToString();
  EXPECT_EQ(back2->shared_object, edge.shared_object);
  EXPECT_EQ(back2->source, "");
}

TEST(PackTest, SystemTarReadsTheCell) {
  if (std::system("tar --version >/dev/null 2>&1") != 0) GTEST_SKIP() << "no tar on PATH";
  std::string dir = ::testing::TempDir() + "kiln_pack_test_XXXXXX";
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  const CellFiles f = SampleFiles();
  ASSERT_TRUE(WriteFileAtomic(dir + "/cell.tar", PackCell(f).value()).ok());
  ASSERT_EQ(std::system(("cd '" + dir + "' && mkdir out && tar -xf cell.tar -C out").c_str()), 0);
  EXPECT_EQ(ReadFile(dir + "/out/metadata.json").value(), f.metadata_json);
  EXPECT_EQ(ReadFile(dir + "/out/cell.so").value(), f.shared_object);
  EXPECT_EQ(ReadFile(dir + "/out/source/cell.cc").value(), f.source);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

TEST(PackTest, TrailingZeroPaddingIsAccepted) {
  // GNU tar pads archives to a 10240-byte record; zeros after the end marker are harmless.
  std::string tar = ValidMembers() + End();
  tar.append(10240 - tar.size() % 10240, '\0');
  EXPECT_TRUE(UnpackCell(tar, "cell").ok());
}

TEST(PackTest, PackRefusesOversizeMember) {
  CellFiles f = SampleFiles();
  f.metadata_json.assign(kMaxMetadataBytes + 1, ' ');
  Result<std::string> r = PackCell(f);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("'metadata.json'"), std::string::npos);
}

TEST(PackTest, RefusesTruncatedArchive) {
  const std::string tar = ValidMembers() + End();
  ExpectRefused("", "truncated archive");
  ExpectRefused(tar.substr(0, 100), "truncated archive");                // inside the first header
  ExpectRefused(tar.substr(0, 512 + 10), "truncated archive");           // inside a member's bytes
  ExpectRefused(tar.substr(0, tar.size() - 1024), "truncated archive");  // no end marker
  ExpectRefused(tar.substr(0, tar.size() - 512), "one zero block, expected two");
}

TEST(PackTest, RefusesBadChecksum) {
  std::string tar = ValidMembers() + End();
  const size_t second = 512 + 512 * ((SampleFiles().metadata_json.size() + 511) / 512);
  ASSERT_EQ(tar.compare(second, 7, "cell.so"), 0);
  tar[second + 1] = 'E';  // "cEll.so": the header no longer sums to its checksum
  ExpectRefused(tar, "bad header checksum at offset " + std::to_string(second));
}

TEST(PackTest, RefusesExtraMember) {
  ExpectRefused(ValidMembers() + Member("notes.txt", "hi") + End(), "extra member 'notes.txt'");
}

TEST(PackTest, RefusesMissingMember) {
  const CellFiles f = SampleFiles();
  ExpectRefused(
      Member("metadata.json", f.metadata_json) + Member("cell.so", f.shared_object) + End(),
      "missing member 'source/cell.cc'");
}

TEST(PackTest, RefusesDuplicateMember) {
  ExpectRefused(ValidMembers() + Member("cell.so", "second copy") + End(),
                "duplicate member 'cell.so'");
}

TEST(PackTest, RefusesSymlinkMember) {
  ExpectRefused(RawHeader("cell.so", 0, '2', "", "/etc/passwd") + End(),
                "member 'cell.so' is a symbolic link");
}

TEST(PackTest, RefusesHardlinkMember) {
  ExpectRefused(RawHeader("cell.so", 0, '1', "", "metadata.json") + End(),
                "member 'cell.so' is a hard link");
}

TEST(PackTest, RefusesDirectoryAndDeviceMembers) {
  ExpectRefused(RawHeader("source", 0, '5') + End(), "member 'source' is a directory");
  ExpectRefused(RawHeader("cell.so", 0, '3') + End(), "is a character device");
  ExpectRefused(RawHeader("cell.so", 0, '4') + End(), "is a block device");
  ExpectRefused(RawHeader("cell.so", 0, '6') + End(), "is a FIFO");
  ExpectRefused(RawHeader("pax", 0, 'x') + End(), "is a pax extended header");
}

TEST(PackTest, RefusesDotDotPath) {
  ExpectRefused(Member("../metadata.json", "{}") + End(), "'..' path component");
  ExpectRefused(Member("source/../../cell.cc", "x") + End(), "'..' path component");
  ExpectRefused(RawHeader("cell.cc", 1, '0', "..") + End(), "member '../cell.cc'");
}

TEST(PackTest, RefusesAbsolutePath) {
  ExpectRefused(Member("/tmp/cell.so", "x") + End(), "member '/tmp/cell.so' has an absolute path");
}

TEST(PackTest, RefusesOversizeMember) {
  // A header claiming 8 GiB - 1 bytes, followed by nothing: refused on the claim, not by reading.
  ExpectRefused(RawHeader("metadata.json", 077777777777ull), "oversize member 'metadata.json'");
  ExpectRefused(RawHeader("metadata.json", kMaxMetadataBytes + 1) + End(), "limit 16777216");
}

TEST(PackTest, RefusesNonOctalSize) {
  std::string h = RawHeader("cell.so", 0);
  h[124] = static_cast<char>(0x80);  // GNU base-256 marker
  std::memset(&h[148], ' ', 8);
  unsigned sum = 0;
  for (unsigned char c : h) sum += c;
  std::snprintf(&h[148], 8, "%06o", sum);
  h[155] = ' ';
  ExpectRefused(h + End(), "size field that is not octal");
}

TEST(PackTest, RefusesNonZeroTrailingData) {
  ExpectRefused(ValidMembers() + End() + "x", "non-zero trailing data");
  std::string tar = ValidMembers() + End();
  tar[tar.size() - 1] = '\1';  // inside the second end block
  ExpectRefused(tar, "non-zero trailing data");
}

TEST(PackTest, RefusesNonUstarHeader) {
  std::string h = RawHeader("cell.so", 0);
  std::memcpy(&h[257], "ustar  \0", 8);  // old GNU magic, checksum recomputed below
  std::memset(&h[148], ' ', 8);
  unsigned sum = 0;
  for (unsigned char c : h) sum += c;
  std::snprintf(&h[148], 8, "%06o", sum);
  h[155] = ' ';
  ExpectRefused(h + End(), "not POSIX ustar");
}

TEST(PackTest, EveryPrefixIsRefusedWithoutReadingPastTheEnd) {
  const std::string tar = PackCell(SampleFiles()).value();
  for (size_t n = 0; n < tar.size(); ++n) {
    // A copy of exactly n bytes, so a sanitizer build flags any read past the input.
    const std::string prefix = tar.substr(0, n);
    EXPECT_FALSE(UnpackCell(prefix, "prefix").ok()) << "prefix of " << n << " bytes";
  }
}

TEST(PackTest, RandomByteEditsNeverCrash) {
  const std::string tar = PackCell(SampleFiles()).value();
  std::mt19937 rng(1234);
  int refused = 0;
  for (int i = 0; i < 4000; ++i) {
    std::string edited = tar;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      edited[rng() % edited.size()] = static_cast<char>(rng() & 0xff);
    }
    Result<CellFiles> r = UnpackCell(edited, "edited");
    if (!r.ok()) {
      ++refused;
      EXPECT_EQ(r.status().code(), StatusCode::kCorruption);
    }
  }
  EXPECT_GT(refused, 0);
}

}  // namespace
}  // namespace kiln
