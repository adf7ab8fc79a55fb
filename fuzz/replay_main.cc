// The corpus replay driver (fuzz/, every build): runs each file of the given directories through
// a fuzz harness, so the seed corpus and every stored crash input are regression tests in builds
// without clang or libFuzzer (as CTest tests, label unit; under KILN_SANITIZE with ASan/UBSan).
//
// Usage: fuzz_replay_<target> CORPUS_DIR [DIR_OR_FILE...]
// CORPUS_DIR must exist and hold at least one file; later arguments may be missing (a target with
// no stored crash has no fuzz/regressions/<target>/). File names state expectations: "ok-*" must be
// accepted by the parser and "bad-*" refused; any other name (libFuzzer's hash names, crash-*)
// only has to come back without a crash or a broken promise.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "fuzz/harness.h"

namespace {

namespace fs = std::filesystem;

// Reads `path` into a buffer of exactly its size, so ASan sees a read one byte past the input
// (a std::string would hide it behind its terminating NUL).
bool ReadExact(const fs::path& path, std::unique_ptr<char[]>* buf, size_t* size) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  in.seekg(0, std::ios::end);
  const std::streamoff n = in.tellg();
  if (n < 0) return false;
  in.seekg(0, std::ios::beg);
  *size = static_cast<size_t>(n);
  buf->reset(new char[std::max<size_t>(*size, 1)]);
  return static_cast<bool>(in.read(buf->get(), n));
}

std::vector<fs::path> FilesOf(const fs::path& p) {
  std::vector<fs::path> files;
  std::error_code ec;
  if (fs::is_regular_file(p, ec)) {
    files.push_back(p);
  } else if (fs::is_directory(p, ec)) {
    for (const fs::directory_entry& e : fs::directory_iterator(p, ec)) {
      if (e.is_regular_file()) files.push_back(e.path());
    }
  }
  std::sort(files.begin(), files.end());  // a stable order, so a failure reproduces
  return files;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR [DIR_OR_FILE...]\n", argv[0]);
    return 2;
  }
  int failures = 0;
  for (int a = 1; a < argc; ++a) {
    const std::vector<fs::path> files = FilesOf(argv[a]);
    if (a == 1 && files.empty()) {
      std::fprintf(stderr, "FAIL: corpus %s is missing or empty\n", argv[a]);
      return 1;
    }
    int accepted = 0;
    for (const fs::path& f : files) {
      std::unique_ptr<char[]> buf;
      size_t size = 0;
      if (!ReadExact(f, &buf, &size)) {
        std::fprintf(stderr, "FAIL: cannot read %s\n", f.c_str());
        ++failures;
        continue;
      }
      const bool ok = kiln::fuzz::FuzzOne(std::string_view(buf.get(), size));
      accepted += ok ? 1 : 0;
      const std::string name = f.filename().string();
      const bool want_ok = name.starts_with("ok-");
      const bool want_bad = name.starts_with("bad-");
      if ((want_ok && !ok) || (want_bad && ok)) {
        std::fprintf(stderr, "FAIL: %s was %s, its name says it must be %s\n", f.c_str(),
                     ok ? "accepted" : "refused", want_ok ? "accepted" : "refused");
        ++failures;
      }
    }
    std::printf("%s: %zu files, %d accepted, %zu refused\n", argv[a], files.size(), accepted,
                files.size() - static_cast<size_t>(accepted));
  }
  if (failures != 0) {
    std::fprintf(stderr, "%d failure(s)\n", failures);
    return 1;
  }
  return 0;
}
