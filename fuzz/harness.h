// The contract between kiln's fuzz harnesses and the two drivers that run them (fuzz/, outside
// the library layers): libFuzzer in the clang fuzz build (KILN_FUZZ=ON) and the corpus replay
// executable that every build runs as a CTest test. See docs/reliability.md.
//
// Each fuzz/<target>_fuzz.cc defines FuzzOne: it feeds the bytes to one public parsing entry
// point, checks what the parser promises (a refusal is a non-OK Status with a message; an accepted
// input survives a serialize/parse round trip unchanged) and returns whether the input was
// accepted. A broken promise calls FuzzFail, which aborts, so libFuzzer records the input as a
// crash and the replay test fails.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "src/kiln/base/status.h"
#include "src/kiln/tensor/tensor.h"

namespace kiln::fuzz {

// The source name the harnesses pass to parsers, so refusals can be checked to name it.
inline constexpr const char* kWhat = "<fuzz input>";

// Defined once per harness. True when the parser accepted `bytes`.
bool FuzzOne(std::string_view bytes);

[[noreturn]] inline void FuzzFail(const std::string& why) {
  std::fprintf(stderr, "kiln fuzz: broken promise: %s\n", why.c_str());
  std::abort();
}

// A refusal must be a typed error with a message that names the source when the parser promises
// to (`names` non-empty), never an OK status without a value.
inline void CheckRefusal(const Status& status, std::string_view entry_point,
                         std::string_view names = {}) {
  if (status.ok()) FuzzFail(std::string(entry_point) + " failed with an OK status");
  if (status.message().empty()) {
    FuzzFail(std::string(entry_point) + " refused with an empty message (" +
             StatusCodeName(status.code()) + ")");
  }
  if (!names.empty() && status.message().find(names) == std::string::npos) {
    FuzzFail(std::string(entry_point) + " refusal does not name " + std::string(names) + ": " +
             status.ToString());
  }
}

// Same dtype, shape and bytes.
inline bool SameTensor(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  if (a.nbytes() != b.nbytes()) return false;
  return a.nbytes() == 0 || std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

#define KILN_FUZZ_CHECK(cond, why)                                          \
  do {                                                                      \
    if (!(cond)) ::kiln::fuzz::FuzzFail(std::string(#cond " -- ") + (why)); \
  } while (0)

}  // namespace kiln::fuzz
