// The compiler's `--version` line is learned once per machine and kept by the compiler binary's
// SHA-256 (identity/toolchain.h CompilerVersion), so a worker's boot spawns no compiler.
#include "src/kiln/identity/toolchain.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <string>

#include "src/kiln/base/file.h"
#include "src/kiln/ops/dnnl_kernels.h"

namespace kiln {
namespace {

class CompilerVersionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kiln-toolchain-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    auto tc = LocalToolchain();
    ASSERT_TRUE(tc.ok()) << tc.status().ToString();
    tc_ = *tc;
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(root_, ec);
  }
  std::string Entry() const { return root_ + "/toolchain/" + tc_.compiler_sha256 + ".version"; }

  std::string root_;
  Toolchain tc_;
};

TEST_F(CompilerVersionTest, LearnedOnceThenReadFromTheCache) {
  auto first = CompilerVersion(tc_.compiler_path, tc_.compiler_sha256, root_);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(*first, tc_.compiler_version);  // what the compiler says
  EXPECT_EQ(ReadFile(Entry()).value(), *first);
  // A later call reads the entry and runs nothing: a path that cannot run proves it.
  auto again = CompilerVersion("/nonexistent/c++", tc_.compiler_sha256, root_);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(*again, *first);
}

TEST_F(CompilerVersionTest, MalformedEntryIsLearnedAgain) {
  ASSERT_TRUE(MakeDirs(root_ + "/toolchain").ok());
  for (const std::string& bad : {std::string(), std::string("two\nlines"), std::string(600, 'x')}) {
    ASSERT_TRUE(WriteFileAtomic(Entry(), bad).ok());
    auto v = CompilerVersion(tc_.compiler_path, tc_.compiler_sha256, root_);
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    EXPECT_EQ(*v, tc_.compiler_version);
    EXPECT_EQ(ReadFile(Entry()).value(), tc_.compiler_version);
  }
}

TEST_F(CompilerVersionTest, WithoutACacheTheCompilerIsAsked) {
  auto v = CompilerVersion(tc_.compiler_path, tc_.compiler_sha256, "");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, tc_.compiler_version);
  EXPECT_FALSE(std::filesystem::exists(root_ + "/toolchain"));
  auto missing = CompilerVersion("/nonexistent/c++", "00", "");
  EXPECT_FALSE(missing.ok());
}

// The toolchain block names oneDNN by its header (so identity links no kernel library); the
// library this process loaded must say the same, or cells would be keyed for one version and run
// on another.
TEST(KernelLibrary, HeaderVersionIsTheLoadedLibrarysVersion) {
  EXPECT_EQ(KernelLibraryVersion(), LoadedKernelLibraryVersion());
  EXPECT_EQ(LocalToolchain().value().onednn_version, LoadedKernelLibraryVersion());
}

}  // namespace
}  // namespace kiln
