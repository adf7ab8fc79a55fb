// Tests for whole-file read, atomic write, mkdir -p and mmap (base layer).
#include "src/kiln/base/file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <iterator>
#include <string>

namespace kiln {
namespace {

class FileTest : public testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = testing::TempDir() + "kiln_file_test_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::string dir_;
};

TEST_F(FileTest, WriteThenReadRoundTrips) {
  const std::string path = dir_ + "/a.bin";
  std::string bytes("hello\0world", 11);
  ASSERT_TRUE(WriteFileAtomic(path, bytes).ok());
  Result<std::string> read = ReadFile(path);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(*read, bytes);
}

TEST_F(FileTest, AtomicWriteReplacesAndLeavesNoTempFiles) {
  const std::string path = dir_ + "/b.txt";
  ASSERT_TRUE(WriteFileAtomic(path, "old contents").ok());
  ASSERT_TRUE(WriteFileAtomic(path, "new").ok());
  EXPECT_EQ(*ReadFile(path), "new");
  // Only b.txt remains: the temp file was renamed, not left behind.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir_),
                          std::filesystem::directory_iterator()),
            1);
}

TEST_F(FileTest, LargeWriteRoundTrips) {
  const std::string path = dir_ + "/big.bin";
  std::string bytes(3 << 20, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 131 % 251);
  ASSERT_TRUE(WriteFileAtomic(path, bytes).ok());
  EXPECT_EQ(*ReadFile(path), bytes);
}

TEST_F(FileTest, WriteIntoMissingDirectoryIsIOErrorNamingThePath) {
  const Status s = WriteFileAtomic(dir_ + "/no/such/dir/x", "x");
  EXPECT_EQ(s.code(), StatusCode::kIOError);
  EXPECT_NE(s.message().find(dir_ + "/no/such/dir/x"), std::string::npos) << s.ToString();
}

TEST_F(FileTest, MissingFileIsNotFound) {
  const std::string path = dir_ + "/missing";
  Result<std::string> r = ReadFile(path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find(path), std::string::npos);

  Result<std::shared_ptr<MappedFile>> m = MappedFile::Open(path);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kNotFound);
  EXPECT_NE(m.status().message().find(path), std::string::npos);
}

TEST_F(FileTest, MakeDirsCreatesParentsAndIsIdempotent) {
  const std::string deep = dir_ + "/x/y/z";
  ASSERT_TRUE(MakeDirs(deep).ok());
  struct stat st;
  ASSERT_EQ(::stat(deep.c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_TRUE(MakeDirs(deep).ok());
  ASSERT_TRUE(WriteFileAtomic(dir_ + "/file", "x").ok());
  EXPECT_EQ(MakeDirs(dir_ + "/file").code(), StatusCode::kIOError);
}

TEST_F(FileTest, MappedFileSeesTheBytesAndOutlivesTheFile) {
  const std::string path = dir_ + "/m.bin";
  ASSERT_TRUE(WriteFileAtomic(path, "mapped bytes").ok());
  Result<std::shared_ptr<MappedFile>> m = MappedFile::Open(path);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  std::shared_ptr<MappedFile> f = *m;
  EXPECT_EQ(f->path(), path);
  ASSERT_EQ(f->size(), 12u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(f->data()), f->size()), "mapped bytes");
  // The mapping stays valid after the name is gone (atomic replace of a checkpoint in use).
  ASSERT_EQ(::unlink(path.c_str()), 0);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(f->data()), 6), "mapped");
}

TEST_F(FileTest, EmptyFileMapsToZeroBytes) {
  const std::string path = dir_ + "/empty";
  ASSERT_TRUE(WriteFileAtomic(path, "").ok());
  Result<std::shared_ptr<MappedFile>> m = MappedFile::Open(path);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ((*m)->size(), 0u);
  EXPECT_EQ(*ReadFile(path), "");
}

TEST_F(FileTest, MappingADirectoryIsRefused) {
  Result<std::shared_ptr<MappedFile>> m = MappedFile::Open(dir_);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find(dir_), std::string::npos);
}

TEST_F(FileTest, PrivateDirMustBeThisUsersAloneAndNoLink) {
  const std::string good = dir_ + "/good";
  ASSERT_EQ(::mkdir(good.c_str(), 0700), 0);
  EXPECT_TRUE(CheckPrivateDir(good).ok()) << CheckPrivateDir(good).ToString();

  const std::string link = dir_ + "/link";
  std::filesystem::create_directory_symlink(good, link);
  Status s = CheckPrivateDir(link);
  EXPECT_EQ(s.token(), "private_dir_unsafe") << s.ToString();
  EXPECT_NE(s.message().find("is a symbolic link"), std::string::npos) << s.ToString();

  const std::string open = dir_ + "/open";
  ASSERT_EQ(::mkdir(open.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(open.c_str(), 0755), 0);
  s = CheckPrivateDir(open);
  EXPECT_EQ(s.token(), "private_dir_unsafe");
  EXPECT_NE(s.message().find("has mode 0755"), std::string::npos) << s.ToString();

  const std::string file = dir_ + "/file";
  ASSERT_TRUE(WriteFileAtomic(file, "x").ok());
  EXPECT_NE(CheckPrivateDir(file).message().find("is not a directory"), std::string::npos);

  if (::geteuid() == 0) {
    const std::string theirs = dir_ + "/theirs";
    ASSERT_EQ(::mkdir(theirs.c_str(), 0700), 0);
    ASSERT_EQ(::chown(theirs.c_str(), 65534, 65534), 0);
    s = CheckPrivateDir(theirs);
    EXPECT_NE(s.message().find("belongs to uid 65534"), std::string::npos) << s.ToString();
  }
}

}  // namespace
}  // namespace kiln
