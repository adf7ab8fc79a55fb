// What a cell's identity says about the machine and the tools that built it (identity layer: on
// base and abi, whose version it records, and below compile, cell, worker and hub, which all read
// it; it links no compiler, no interpreter and no kernel library).
//
// The toolchain block is everything that forces a recompile: the system compiler's identity
// (version string and a SHA-256 of its driver binary), the fixed flags, the kernel library's and
// runtime ABI's versions, and the codegen version. Its facts digest is the key's `toolchain` axis.
// `sm` is the CPU ISA level a cell is built for: detected from CPUID and clamped to a published
// level so a cell runs on every machine of that level (kiln's default ceiling is x86-64-v3).
// Running the compiler is compile/driver.h's job; this file only names it.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "src/kiln/base/status.h"

namespace kiln {

// "kiln-codegen-1+<hash>": the hash covers the cell ABI header and the compiler, runtime and
// op-kernel sources this binary was built from (see identity/CMakeLists.txt), so any change to
// what a cell computes changes the toolchain axis.
extern const char* const kCodegenVersion;

// The highest published level this CPU executes ("x86-64" .. "x86-64-v4"). The test-only
// KILN_TEST_SM_LEVEL may lower it (never raise it), so tests can play a lesser machine.
const std::string& DetectSmLevel();
// min(detected, ceiling); ceiling defaults to x86-64-v3 (KILN_SM_CEILING overrides).
std::string DefaultSmTarget();
// The sm a cell is built and keyed for: `requested` (a manifest's or request's override) when
// given, else DefaultSmTarget(). The one rule the key, the mint and the worker apply.
std::string SmOrDefault(const std::string& requested);
// Position of a level in KnownSmLevels(), or -1.
int SmRank(const std::string& level);

// The kernel library's version as this binary was built against it: oneDNN's
// "major.minor.patch+hash" from its version header. Taken from the header, not from a call into
// the library, so that reading identity links no kernel library. A binary whose loaded library
// differs from its headers is a packaging fault; tests/compile/toolchain_test.cc compares this
// with what the loaded library reports (ops/dnnl_kernels.h LoadedKernelLibraryVersion).
std::string KernelLibraryVersion();

struct Toolchain {
  std::string compiler_path;       // resolved path of the C++ compiler driver
  std::string compiler_version;    // first line of `<compiler> --version`
  std::string compiler_sha256;     // of the driver binary
  std::vector<std::string> flags;  // fixed flags, without -march (that is the sm axis)
  std::string onednn_version;
  int runtime_abi = 0;
  std::string codegen_version;

  nlohmann::json Block() const;        // the toolchain block recorded in metadata.json
  Result<std::string> Digest() const;  // FactsDigest(Block())
};

// The toolchain of this process (cached after the first call). The compiler is $KILN_CXX or
// `c++` from PATH. Fails (NotFound) when no compiler is found.
Result<Toolchain> LocalToolchain();
// The toolchain of the compiler `compiler` (a path, or a name looked up on PATH), as a process
// with KILN_CXX=`compiler` would find it; not cached. NotFound when there is no such compiler.
Result<Toolchain> ToolchainOf(const std::string& compiler);

// The first line of `<compiler_path> --version`, for the compiler binary whose SHA-256 is
// `compiler_sha256`. That line is a function of the binary's bytes, so it is kept under
// `cache_root`/toolchain/<sha256>.version once learned, and a later process (a worker's boot)
// reads it instead of spawning the compiler. A missing or malformed entry (empty, more than one
// line, over 512 bytes) is learned again; `cache_root` "" = no cache.
Result<std::string> CompilerVersion(const std::string& compiler_path,
                                    const std::string& compiler_sha256,
                                    const std::string& cache_root);

}  // namespace kiln
