// Tests for the local cell store (cell layer): put/get, re-verification on every lookup (a corrupt
// entry is deleted and reported as a miss), key validation, listing and concurrent puts.
#include "src/kiln/cell/store.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <iterator>
#include <thread>

#include "src/kiln/base/file.h"
#include "src/kiln/cell/pack.h"
#include "tests/cell/cell_fixtures.h"

namespace kiln {
namespace {

using cell_testing::SampleCellBytes;
using cell_testing::SampleMetadata;

const CellOrigin kMinted{CellOrigin::Kind::kMinted, ""};

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "kiln_store_test_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  static bool Exists(const std::string& path) {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0;
  }

  std::string dir_;
  const std::string key_ = SampleMetadata().key;
  const std::string bytes_ = SampleCellBytes();
};

TEST_F(StoreTest, PutThenGetReturnsVerifiedBytes) {
  LocalStore store(dir_ + "/cells");  // the root need not exist yet
  ASSERT_TRUE(store.Put(key_, bytes_, kMinted).ok());
  EXPECT_EQ(ReadFile(dir_ + "/cells/" + key_ + "/ref").value(), CellDigest(bytes_));
  Result<std::optional<StoredCell>> got = store.Get(key_);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_TRUE(got->has_value());
  const StoredCell& cell = **got;
  EXPECT_EQ(cell.key, key_);
  EXPECT_EQ(cell.digest, CellDigest(bytes_));
  EXPECT_EQ(cell.path, dir_ + "/cells/" + key_ + "/cell.tar");
  EXPECT_EQ(cell.bytes, bytes_);
}

// Notes live beside the entry, are replaced whole, go with the entry, and their names cannot
// reach outside it.
TEST_F(StoreTest, NotesAreKeptBesideTheEntryAndRemovedWithIt) {
  LocalStore store(dir_);
  ASSERT_TRUE(store.Put(key_, bytes_, kMinted).ok());
  auto none = store.GetNote(key_, "publish");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  ASSERT_TRUE(store.PutNote(key_, "publish", "{\"state\":\"pending\"}").ok());
  ASSERT_TRUE(store.PutNote(key_, "publish", "{\"state\":\"published\"}").ok());
  auto got = store.GetNote(key_, "publish");
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ(**got, "{\"state\":\"published\"}");
  // The note does not disturb the cell.
  auto cell = store.Get(key_);
  ASSERT_TRUE(cell.ok() && cell->has_value());
  EXPECT_EQ((*cell)->bytes, bytes_);
  for (const char* bad : {"", "../ref", "Publish", "a/b", "x.y"}) {
    Status s = store.PutNote(key_, bad, "x");
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(store.GetNote(key_, bad).status().code(), StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(store.PutNote("not-a-key", "publish", "x").code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(store.Remove(key_).ok());
  auto gone = store.GetNote(key_, "publish");
  ASSERT_TRUE(gone.ok());
  EXPECT_FALSE(gone->has_value());
}

TEST_F(StoreTest, AbsentKeyIsAMiss) {
  LocalStore store(dir_);
  Result<std::optional<StoredCell>> got = store.Get(key_);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_FALSE(got->has_value());
}

TEST_F(StoreTest, CorruptCellOnDiskIsDeletedAndMissed) {
  LocalStore store(dir_);
  ASSERT_TRUE(store.Put(key_, bytes_, kMinted).ok());
  std::string flipped = bytes_;
  flipped[600] ^= 1;  // one bit inside metadata.json
  ASSERT_TRUE(WriteFileAtomic(dir_ + "/" + key_ + "/cell.tar", flipped).ok());
  Result<std::optional<StoredCell>> got = store.Get(key_);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_FALSE(got->has_value());
  EXPECT_FALSE(Exists(dir_ + "/" + key_));
  EXPECT_TRUE(store.Keys().empty());
  // A fresh Put heals it.
  ASSERT_TRUE(store.Put(key_, bytes_, kMinted).ok());
  EXPECT_TRUE(store.Get(key_).value().has_value());
}

TEST_F(StoreTest, MalformedRefOrRefWithoutBytesIsDeletedAndMissed) {
  LocalStore store(dir_);
  ASSERT_TRUE(store.Put(key_, bytes_, kMinted).ok());
  ASSERT_TRUE(WriteFileAtomic(dir_ + "/" + key_ + "/ref", "sha256:nothex").ok());
  EXPECT_FALSE(store.Get(key_).value().has_value());
  EXPECT_FALSE(Exists(dir_ + "/" + key_));

  ASSERT_TRUE(store.Put(key_, bytes_, kMinted).ok());
  ASSERT_EQ(::unlink((dir_ + "/" + key_ + "/cell.tar").c_str()), 0);
  EXPECT_FALSE(store.Get(key_).value().has_value());
  EXPECT_FALSE(Exists(dir_ + "/" + key_));
}

// Bytes whose ref is not written yet are what a Put looks like until its last rename: a miss
// that Get leaves in place, and the next Put completes the entry.
TEST_F(StoreTest, BytesWithoutRefAreAMissLeftInPlace) {
  LocalStore store(dir_);
  ASSERT_TRUE(store.Put(key_, bytes_, kMinted).ok());
  ASSERT_EQ(::unlink((dir_ + "/" + key_ + "/ref").c_str()), 0);
  EXPECT_FALSE(store.Get(key_).value().has_value());
  EXPECT_TRUE(Exists(dir_ + "/" + key_ + "/cell.tar"));
  ASSERT_TRUE(store.Put(key_, bytes_, kMinted).ok());
  EXPECT_TRUE(store.Get(key_).value().has_value());
}

// Two `kiln run --compile` of one graph at once (the conformance runner's twin cases, run two at
// a time) share a key: one process's lookup must never break the other's Put.
TEST_F(StoreTest, GetRacingPutNeverBreaksIt) {
  for (int i = 0; i < 40; ++i) {
    LocalStore writer(dir_);
    ASSERT_TRUE(writer.Remove(key_).ok());
    std::atomic<bool> done{false};
    std::thread reader([&] {
      LocalStore other(dir_);
      while (!done.load()) {
        Result<std::optional<StoredCell>> got = other.Get(key_);
        EXPECT_TRUE(got.ok()) << got.status().ToString();
        if (got.ok() && got->has_value()) {
          EXPECT_EQ((*got)->bytes, bytes_);
        }
      }
    });
    Status put = writer.Put(key_, bytes_, kMinted);
    done = true;
    reader.join();
    ASSERT_TRUE(put.ok()) << "iteration " << i << ": " << put.ToString();
    EXPECT_TRUE(writer.Get(key_).value().has_value());
  }
}

TEST_F(StoreTest, UnreadableEntryIsDeletedAndMissed) {
  LocalStore store(dir_);
  ASSERT_TRUE(MakeDirs(dir_ + "/" + key_ + "/cell.tar").ok());  // a directory where bytes belong
  ASSERT_TRUE(WriteFileAtomic(dir_ + "/" + key_ + "/ref", CellDigest(bytes_)).ok());
  EXPECT_FALSE(store.Get(key_).value().has_value());
  EXPECT_FALSE(Exists(dir_ + "/" + key_));
}

TEST_F(StoreTest, MalformedKeysAreRefused) {
  LocalStore store(dir_);
  const std::string bad[] = {"",
                             "../../etc",
                             "ck1-" + std::string(56, 'A'),
                             "ck1-" + std::string(55, 'a') + "/",
                             key_ + "/..",
                             "ck1-../../../../../tmp" + std::string(38, '0')};
  for (const std::string& key : bad) {
    Status put = store.Put(key, bytes_, kMinted);
    EXPECT_EQ(put.code(), StatusCode::kInvalidArgument) << key;
    EXPECT_NE(put.message().find("is not a cell key"), std::string::npos) << put.message();
    EXPECT_EQ(store.Get(key).status().code(), StatusCode::kInvalidArgument) << key;
    EXPECT_EQ(store.Remove(key).code(), StatusCode::kInvalidArgument) << key;
  }
  EXPECT_TRUE(store.Keys().empty());
}

TEST_F(StoreTest, KeysListsEntriesSortedAndIgnoresOtherNames) {
  LocalStore store(dir_);
  const std::string other = SampleMetadata("x86-64-v4").key;
  ASSERT_TRUE(store.Put(other, "b", kMinted).ok());
  ASSERT_TRUE(store.Put(key_, bytes_, kMinted).ok());
  ASSERT_TRUE(MakeDirs(dir_ + "/not-a-key").ok());
  std::vector<std::string> expected = {key_, other};
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(store.Keys(), expected);
  EXPECT_TRUE(LocalStore(dir_ + "/absent").Keys().empty());
}

TEST_F(StoreTest, RemoveDeletesAndIsIdempotent) {
  LocalStore store(dir_);
  ASSERT_TRUE(store.Put(key_, bytes_, kMinted).ok());
  ASSERT_TRUE(store.Remove(key_).ok());
  EXPECT_FALSE(store.Get(key_).value().has_value());
  EXPECT_TRUE(store.Remove(key_).ok());
}

TEST_F(StoreTest, PutReplacesAnEntry) {
  LocalStore store(dir_);
  ASSERT_TRUE(store.Put(key_, "old bytes", kMinted).ok());
  ASSERT_TRUE(store.Put(key_, bytes_, kMinted).ok());
  EXPECT_EQ(store.Get(key_).value()->bytes, bytes_);
}

TEST_F(StoreTest, ConcurrentPutsOfOneKeyLeaveAVerifiedEntry) {
  LocalStore store(dir_);
  std::vector<std::thread> threads;
  std::vector<Status> results(8);
  for (size_t i = 0; i < results.size(); ++i) {
    threads.emplace_back([&, i] {
      LocalStore own(dir_);  // one object per thread and one shared: both are allowed
      results[i] = (i % 2 ? own : store).Put(key_, bytes_, kMinted);
    });
  }
  for (std::thread& t : threads) t.join();
  for (const Status& s : results) EXPECT_TRUE(s.ok()) << s.ToString();
  Result<std::optional<StoredCell>> got = store.Get(key_);
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ((*got)->bytes, bytes_);
  // No temp files are left behind.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir_ + "/" + key_),
                          std::filesystem::directory_iterator()),
            3);
}

TEST(DefaultStoreRootTest, HonorsKilnCacheDirThenHome) {
  const char* saved_cache = std::getenv("KILN_CACHE_DIR");
  const char* saved_home = std::getenv("HOME");
  const std::string cache = saved_cache ? saved_cache : "";
  const std::string home = saved_home ? saved_home : "";

  ::setenv("KILN_CACHE_DIR", "/var/cache/kiln-test", 1);
  ::setenv("HOME", "/home/someone", 1);
  EXPECT_EQ(DefaultStoreRoot().value(), "/var/cache/kiln-test/cells");
  ::unsetenv("KILN_CACHE_DIR");
  EXPECT_EQ(DefaultStoreRoot().value(), "/home/someone/.cache/kiln/cells");
  ::unsetenv("HOME");
  EXPECT_EQ(DefaultStoreRoot().status().code(), StatusCode::kInvalidArgument);

  if (saved_cache) ::setenv("KILN_CACHE_DIR", cache.c_str(), 1);
  if (saved_home) ::setenv("HOME", home.c_str(), 1);
}

// The origin beside the bytes is what a later adoption checks: this machine's own mint, or a hub
// with its receipt; an origin left for other bytes, or none, reads as unknown.
TEST_F(StoreTest, OriginIsKeptPerDigestAndUnknownOtherwise) {
  LocalStore store(dir_);
  ASSERT_TRUE(store.Put(key_, bytes_, CellOrigin{CellOrigin::Kind::kHub, "a.b.c"}).ok());
  auto hit = store.Get(key_).value();
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->origin.kind, CellOrigin::Kind::kHub);
  EXPECT_EQ(hit->origin.receipt, "a.b.c");
  ASSERT_TRUE(store.Put(key_, bytes_, kMinted).ok());
  EXPECT_EQ(store.Get(key_).value()->origin.kind, CellOrigin::Kind::kMinted);
  // An origin file that names other bytes, or none at all: unknown.
  ASSERT_TRUE(
      WriteFileAtomic(dir_ + "/" + key_ + "/origin",
                      "{\"digest\":\"sha256:" + std::string(64, '0') + "\",\"origin\":\"minted\"}")
          .ok());
  EXPECT_EQ(store.Get(key_).value()->origin.kind, CellOrigin::Kind::kUnknown);
  ASSERT_EQ(::unlink((dir_ + "/" + key_ + "/origin").c_str()), 0);
  auto bare = store.Get(key_).value();
  ASSERT_TRUE(bare.has_value()) << "a missing origin is not a corrupt entry";
  EXPECT_EQ(bare->origin.kind, CellOrigin::Kind::kUnknown);
}

}  // namespace
}  // namespace kiln
