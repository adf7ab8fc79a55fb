// libFuzzer's entry point for every kiln fuzz target (fuzz/, clang fuzz build only): hands the
// bytes to the harness's FuzzOne. libFuzzer supplies main() (-fsanitize=fuzzer).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz/harness.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kiln::fuzz::FuzzOne(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
