// Tests of the blob stores (src/kiln/hub/blob_store.h): verified commit, digest and size
// refusals, no partial blob after a failed or abandoned upload, temp cleanup at open.
#include "src/kiln/hub/blob_store.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "src/kiln/base/sha256.h"

namespace kiln {
namespace {

std::string DigestOf(const std::string& bytes) { return "sha256:" + Sha256Hex(bytes); }

class BlobStoreTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/kiln_blob_test_" + GetParam();
    std::filesystem::remove_all(dir_);
    if (GetParam() == "disk") {
      store_ = OpenDiskBlobStore(dir_).value();
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

INSTANTIATE_TEST_SUITE_P(Stores, BlobStoreTest, ::testing::Values("disk", "memory"));

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
