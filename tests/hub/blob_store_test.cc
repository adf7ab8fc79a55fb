// Tests of the blob stores (src/kiln/hub/blob_store.h): verified commit, digest and size
// refusals, no partial blob after a failed or abandoned upload, temp cleanup at open. The same
// suite runs on disk, memory and S3 (s3_blob_store.h, against the radosgw CTest starts: the
// S3/* cases run as hub_test_e2e); S3BlobStore.* adds what only S3 has: multipart uploads,
// refused signatures, the objects left in the bucket.
#include "src/kiln/hub/blob_store.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "src/kiln/base/sha256.h"
#include "src/kiln/hub/s3_blob_store.h"
#include "tests/hub/s3_test_env.h"

namespace kiln {
namespace {

std::string DigestOf(const std::string& bytes) { return "sha256:" + Sha256Hex(bytes); }

// A location in the test bucket that no other test shares: every test starts with an empty
// prefix, so counts of objects are its own.
S3Location TestLocation(const std::map<std::string, std::string>& env) {
  S3Location loc;
  loc.endpoint = env.at("KILN_S3_ENDPOINT");
  loc.bucket = env.at("KILN_S3_BUCKET");
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = std::string(info->test_suite_name()) + "." + info->name();
  for (char& c : name) {
    if (c == '/') c = '-';
  }
  loc.prefix = name + "-" + std::to_string(::getpid()) + "/";
  loc.credentials.access_key = env.at("AWS_ACCESS_KEY_ID");
  loc.credentials.secret_key = env.at("AWS_SECRET_ACCESS_KEY");
  loc.credentials.region = env.at("AWS_REGION");
  loc.part_bytes = 5u << 20;
  return loc;
}

class BlobStoreTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/kiln_blob_test_" + GetParam();
    std::filesystem::remove_all(dir_);
    if (GetParam() == "disk") {
      store_ = OpenDiskBlobStore(dir_).value();
    } else if (GetParam() == "s3") {
      KILN_REQUIRE_S3(env);
      auto opened = OpenS3BlobStore(TestLocation(*env));
      ASSERT_TRUE(opened.ok()) << opened.status().ToString();
      store_ = std::move(*opened);
    } else {
      store_ = NewMemoryBlobStore();
    }
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
  std::unique_ptr<BlobStore> store_;
};

TEST_P(BlobStoreTest, StreamedUploadBecomesVisibleOnlyAfterCommit) {
  const std::string bytes(100000, 'q');
  auto w = store_->BeginWrite(DigestOf(bytes), bytes.size());
  ASSERT_TRUE(w.ok());
  for (size_t off = 0; off < bytes.size(); off += 7000) {
    ASSERT_TRUE((*w)->Append(std::string_view(bytes).substr(off, 7000)).ok());
  }
  EXPECT_FALSE(store_->Has(DigestOf(bytes)));
  EXPECT_EQ(store_->TempFileCount(), 1);
  ASSERT_TRUE((*w)->Commit().ok());
  w->reset();
  EXPECT_TRUE(store_->Has(DigestOf(bytes)));
  EXPECT_EQ(store_->TempFileCount(), 0);
  EXPECT_EQ(store_->ReadAll(DigestOf(bytes)).value(), bytes);
  auto r = store_->Open(DigestOf(bytes)).value();
  char buf[10];
  EXPECT_EQ(r->ReadAt(99995, buf, 10).value(), 5u);
}

TEST_P(BlobStoreTest, TamperedBytesAreRefusedAsDigestMismatch) {
  const std::string bytes = "the bytes the publisher hashed";
  auto w = store_->BeginWrite(DigestOf(bytes), bytes.size()).value();
  std::string tampered = bytes;
  tampered[3] ^= 1;
  ASSERT_TRUE(w->Append(tampered).ok());
  Status s = w->Commit();
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(w->refusal(), "digest_mismatch");
  w.reset();
  EXPECT_FALSE(store_->Has(DigestOf(bytes)));
  EXPECT_EQ(store_->TempFileCount(), 0);
}

TEST_P(BlobStoreTest, SizeLiesAreRefusedBothWays) {
  const std::string bytes = "0123456789";
  {
    auto w = store_->BeginWrite(DigestOf(bytes), 5).value();  // declared too small
    EXPECT_FALSE(w->Append(bytes).ok());
    EXPECT_EQ(w->refusal(), "size_mismatch");
  }
  {
    auto w = store_->BeginWrite(DigestOf(bytes), 20).value();  // declared too large
    ASSERT_TRUE(w->Append(bytes).ok());
    EXPECT_FALSE(w->Commit().ok());
    EXPECT_EQ(w->refusal(), "size_mismatch");
  }
  EXPECT_FALSE(store_->Has(DigestOf(bytes)));
  EXPECT_EQ(store_->TempFileCount(), 0);
}

TEST_P(BlobStoreTest, MalformedDigestRefused) {
  EXPECT_FALSE(store_->BeginWrite("sha256:xyz", 1).ok());
  EXPECT_FALSE(store_->BeginWrite("md5:" + std::string(64, 'a'), 1).ok());
  EXPECT_EQ(store_->Open("sha256:" + std::string(64, 'a')).status().code(), StatusCode::kNotFound);
}

TEST_P(BlobStoreTest, RemovedBlobIsGoneAndListingsAgree) {
  const std::string a = "first blob", b = "second blob";
  for (const std::string* bytes : {&a, &b}) {
    auto w = store_->BeginWrite(DigestOf(*bytes), bytes->size()).value();
    ASSERT_TRUE(w->Append(*bytes).ok());
    ASSERT_TRUE(w->Commit().ok());
  }
  auto listed = store_->List().value();
  std::sort(listed.begin(), listed.end());
  std::vector<std::string> want = {DigestOf(a), DigestOf(b)};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(listed, want);
  EXPECT_EQ(store_->ListStored().value().size(), 2u);
  EXPECT_TRUE(store_->Verify(DigestOf(a)).ok());
  auto reader = store_->Open(DigestOf(a)).value();
  ASSERT_TRUE(store_->Remove(DigestOf(a)).ok());
  EXPECT_FALSE(store_->Has(DigestOf(a)));
  EXPECT_EQ(store_->Open(DigestOf(a)).status().code(), StatusCode::kNotFound);
  // A reader opened before the Remove keeps its bytes.
  std::string buf(a.size(), '\0');
  EXPECT_EQ(reader->ReadAt(0, buf.data(), buf.size()).value(), a.size());
  EXPECT_EQ(buf, a);
  EXPECT_EQ(store_->List().value(), std::vector<std::string>{DigestOf(b)});
  EXPECT_TRUE(store_->CheckWritable().ok());
  EXPECT_EQ(store_->TempFileCount(), 0);
}

INSTANTIATE_TEST_SUITE_P(Stores, BlobStoreTest, ::testing::Values("disk", "memory"));
INSTANTIATE_TEST_SUITE_P(S3, BlobStoreTest, ::testing::Values("s3"));

TEST(S3BlobStore, LargeBlobGoesMultipartAndIsVisibleOnlyWhole) {
  KILN_REQUIRE_S3(env);
  auto store = OpenS3BlobStore(TestLocation(*env)).value();
  std::string bytes(12u << 20, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>((i * 131) >> 7);
  const std::string digest = DigestOf(bytes);
  auto w = store->BeginWrite(digest, bytes.size()).value();
  ASSERT_TRUE(w->Append(std::string_view(bytes).substr(0, 6u << 20)).ok());
  // One part is in the bucket, under staging/, as an unfinished multipart upload.
  EXPECT_EQ(store->TempFileCount(), 1);
  EXPECT_FALSE(store->Has(digest));
  ASSERT_TRUE(w->Append(std::string_view(bytes).substr(6u << 20)).ok());
  Status s = w->Commit();
  ASSERT_TRUE(s.ok()) << s.ToString();
  w.reset();
  EXPECT_TRUE(store->Has(digest));
  EXPECT_EQ(store->TempFileCount(), 0);
  EXPECT_EQ(store->ReadAll(digest).value(), bytes);
  EXPECT_TRUE(store->Verify(digest).ok());
}

TEST(S3BlobStore, AbandonedMultipartUploadLeavesNothing) {
  KILN_REQUIRE_S3(env);
  auto store = OpenS3BlobStore(TestLocation(*env)).value();
  const std::string bytes(11u << 20, 'z');
  {
    auto w = store->BeginWrite(DigestOf(bytes), bytes.size()).value();
    ASSERT_TRUE(w->Append(std::string_view(bytes).substr(0, 10u << 20)).ok());
    EXPECT_EQ(store->TempFileCount(), 1);
  }
  EXPECT_EQ(store->TempFileCount(), 0);
  EXPECT_FALSE(store->Has(DigestOf(bytes)));
  EXPECT_TRUE(store->List().value().empty());
}

TEST(S3BlobStore, WrongSecretIsRefusedByTheStore) {
  KILN_REQUIRE_S3(env);
  S3Location loc = TestLocation(*env);
  loc.credentials.secret_key += "-wrong";
  auto opened = OpenS3BlobStore(loc);
  ASSERT_FALSE(opened.ok());
  EXPECT_TRUE(opened.status().Is(kRefusalS3Denied)) << opened.status().ToString();
  EXPECT_NE(opened.status().ToString().find("s3://" + loc.bucket), std::string::npos)
      << opened.status().ToString();
}

TEST(S3BlobStore, UnreachableEndpointIsATypedRefusal) {
  KILN_REQUIRE_S3(env);
  S3Location loc = TestLocation(*env);
  loc.endpoint = "http://127.0.0.1:1";
  auto opened = OpenS3BlobStore(loc);
  ASSERT_FALSE(opened.ok());
  EXPECT_TRUE(opened.status().Is(kRefusalS3Unreachable)) << opened.status().ToString();
}

TEST(DiskBlobStore, LeftoverTempFilesAreRemovedAtOpen) {
  const std::string dir = ::testing::TempDir() + "/kiln_blob_leftover";
  std::filesystem::remove_all(dir);
  {
    auto store = OpenDiskBlobStore(dir).value();
    auto w = store->BeginWrite("sha256:" + std::string(64, 'a'), 100).value();
    ASSERT_TRUE(w->Append("partial").ok());
    // Simulate a crash: the temp file stays as a killed process would leave it.
    std::ofstream(dir + "/tmp/" + std::string(64, 'b') + ".99-0.part") << "half an upload";
    EXPECT_EQ(store->TempFileCount(), 2);
  }
  auto store = OpenDiskBlobStore(dir).value();
  EXPECT_EQ(store->TempFileCount(), 0);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kiln
