// Tests for the codegen version (identity layer, src/kiln/identity/CMakeLists.txt): it is the hash
// of the files that decide what a cell computes, the cell ABI header among them, as they are in
// this tree, so an edit to any of them changes the toolchain axis and with it every cell key (a
// stale cell can only be a miss). The hash is recomputed here from the list of files the build
// hashed, the way CMake hashes them.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "src/kiln/base/file.h"
#include "src/kiln/base/sha256.h"
#include "src/kiln/cell/key.h"
#include "src/kiln/identity/toolchain.h"

namespace kiln {
namespace {

const char kAbiHeader[] = "src/kiln/abi/cell_abi.h";

// The files the build hashed, in order (relative to the source tree).
std::vector<std::string> HashedFiles() {
  std::vector<std::string> files;
  auto list = ReadFile(KILN_CODEGEN_SOURCES_LIST);
  EXPECT_TRUE(list.ok()) << list.status().ToString();
  if (!list.ok()) return files;
  std::istringstream in(*list);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) files.push_back(line);
  }
  return files;
}

// identity/CMakeLists.txt's hash: SHA-256 of the concatenated hex SHA-256s of the files, first
// 12 hex; `edit` is appended to the ABI header's bytes.
std::string CodegenHash(const std::vector<std::string>& files, const std::string& edit = "") {
  // Paths and contents are appended piece by piece: GCC 12 warns (falsely, -Warray-bounds) on a
  // chained operator+ over a short literal, depending on the source directory's length.
  std::string text;
  for (const std::string& f : files) {
    std::string path = KILN_SOURCE_DIR;
    path.append("/").append(f);
    auto bytes = ReadFile(path);
    EXPECT_TRUE(bytes.ok()) << bytes.status().ToString();
    std::string content = bytes.ok() ? *bytes : std::string();
    if (bytes.ok() && f == kAbiHeader) content.append(edit);
    text += Sha256Hex(content);
  }
  return Sha256Hex(text).substr(0, 12);
}

// The key of one fixed graph and envelope built by a toolchain whose codegen version carries
// `hash`.
std::string KeyWithCodegen(const std::string& hash) {
  Toolchain t;
  t.compiler_path = "/usr/bin/c++";
  t.compiler_version = "c++ (Debian 12.2.0-14) 12.2.0";
  t.compiler_sha256 = std::string(64, 'a');
  t.flags = {"-O2"};
  t.onednn_version = "3.0.0";
  t.runtime_abi = 2;
  t.codegen_version = "kiln-codegen-1+" + hash;
  KeyAxes axes;
  axes.graph = "0123456789abcdef";
  axes.envelope = "fedcba9876543210";
  axes.sm = "x86-64-v3";
  axes.toolchain = t.Digest().value();
  return KeyFromAxes(axes).value();
}

TEST(CodegenVersion, IsTheHashOfTheHashedFilesAsTheyAreNow) {
  const std::vector<std::string> files = HashedFiles();
  ASSERT_FALSE(files.empty());
  EXPECT_EQ(std::string(kCodegenVersion), "kiln-codegen-1+" + CodegenHash(files))
      << "the build's codegen version is not the hash of " << KILN_CODEGEN_SOURCES_LIST
      << " (reconfigure after an edit)";
}

TEST(CodegenVersion, AnAbiHeaderEditChangesTheCellKey) {
  const std::vector<std::string> files = HashedFiles();
  bool hashed = false;
  for (const std::string& f : files) hashed = hashed || f == kAbiHeader;
  ASSERT_TRUE(hashed) << kAbiHeader << " is not among the files the codegen version hashes";
  const std::string now = CodegenHash(files);
  const std::string edited = CodegenHash(files, "\n/* one more line */\n");
  EXPECT_NE(now, edited);
  EXPECT_NE(KeyWithCodegen(now), KeyWithCodegen(edited));
}

}  // namespace
}  // namespace kiln
