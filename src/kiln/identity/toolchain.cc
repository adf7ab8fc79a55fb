// Toolchain identity and sm detection (see toolchain.h).
#include "src/kiln/identity/toolchain.h"

#include <cpuid.h>
#include <limits.h>
#include <oneapi/dnnl/dnnl_version.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>

#include "src/kiln/abi/cell_abi.h"
#include "src/kiln/base/canonical_json.h"
#include "src/kiln/base/file.h"
#include "src/kiln/base/log.h"
#include "src/kiln/base/sha256.h"
#include "src/kiln/base/sm_levels.h"
#include "src/kiln/base/subprocess.h"

#ifndef KILN_CODEGEN_SOURCES_HASH
#define KILN_CODEGEN_SOURCES_HASH "unknown"
#endif

namespace kiln {

const char* const kCodegenVersion = "kiln-codegen-1+" KILN_CODEGEN_SOURCES_HASH;

namespace {

struct CpuFeatures {
  bool sse3 = false, ssse3 = false, sse41 = false, sse42 = false, popcnt = false, cx16 = false;
  bool avx = false, avx2 = false, bmi1 = false, bmi2 = false, f16c = false, fma = false;
  bool lzcnt = false, movbe = false, osxsave = false;
  bool avx512f = false, avx512bw = false, avx512cd = false, avx512dq = false, avx512vl = false;
};

CpuFeatures ReadCpu() {
  CpuFeatures f;
  unsigned a, b, c, d;
  if (__get_cpuid(1, &a, &b, &c, &d)) {
    f.sse3 = c & bit_SSE3;
    f.ssse3 = c & bit_SSSE3;
    f.sse41 = c & bit_SSE4_1;
    f.sse42 = c & bit_SSE4_2;
    f.popcnt = c & bit_POPCNT;
    f.cx16 = c & bit_CMPXCHG16B;
    f.avx = c & bit_AVX;
    f.f16c = c & bit_F16C;
    f.fma = c & bit_FMA;
    f.movbe = c & bit_MOVBE;
    f.osxsave = c & bit_OSXSAVE;
  }
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
    f.avx2 = b & bit_AVX2;
    f.bmi1 = b & bit_BMI;
    f.bmi2 = b & bit_BMI2;
    f.avx512f = b & bit_AVX512F;
    f.avx512bw = b & bit_AVX512BW;
    f.avx512cd = b & bit_AVX512CD;
    f.avx512dq = b & bit_AVX512DQ;
    f.avx512vl = b & bit_AVX512VL;
  }
  if (__get_cpuid(0x80000001, &a, &b, &c, &d)) f.lzcnt = c & bit_LZCNT;
  return f;
}

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

// `name` resolved on PATH (when it holds no '/') and through links; "" = $KILN_CXX, else c++.
Result<std::string> FindCompiler(const std::string& given = "") {
  const char* env = std::getenv("KILN_CXX");
  std::string name = !given.empty() ? given : (env && *env ? env : "c++");
  if (name.find('/') == std::string::npos) {
    const char* path = std::getenv("PATH");
    std::string p = path ? path : "/usr/bin:/bin";
    size_t start = 0;
    while (start <= p.size()) {
      size_t end = p.find(':', start);
      if (end == std::string::npos) end = p.size();
      const std::string cand = p.substr(start, end - start) + "/" + name;
      if (::access(cand.c_str(), X_OK) == 0) {
        name = cand;
        break;
      }
      start = end + 1;
    }
  }
  char resolved[PATH_MAX];
  if (::realpath(name.c_str(), resolved) == nullptr || ::access(resolved, X_OK) != 0) {
    return Status::NotFound("C++ compiler '" + name + "' not found (set KILN_CXX or install g++)");
  }
  return std::string(resolved);
}

}  // namespace

int SmRank(const std::string& level) {
  const auto& levels = KnownSmLevels();
  auto it = std::find(levels.begin(), levels.end(), level);
  return it == levels.end() ? -1 : static_cast<int>(it - levels.begin());
}

const std::string& DetectSmLevel() {
  static const std::string level = [] {
    // TEST ONLY: real-process tests play a machine that runs less than this one (a cell built
    // for a higher level must be refused). Only lowers: a test cannot claim features it lacks.
    const char* test_level = std::getenv("KILN_TEST_SM_LEVEL");
    const CpuFeatures f = ReadCpu();
    const bool v2 = f.cx16 && f.popcnt && f.sse3 && f.ssse3 && f.sse41 && f.sse42;
    const bool v3 = v2 && f.avx && f.avx2 && f.bmi1 && f.bmi2 && f.f16c && f.fma && f.lzcnt &&
                    f.movbe && f.osxsave;
    const bool v4 = v3 && f.avx512f && f.avx512bw && f.avx512cd && f.avx512dq && f.avx512vl;
    std::string detected = v4 ? "x86-64-v4" : v3 ? "x86-64-v3" : v2 ? "x86-64-v2" : "x86-64";
    if (test_level != nullptr && SmRank(test_level) >= 0 && SmRank(test_level) < SmRank(detected)) {
      LogWarn(std::string("TEST SWITCH KILN_TEST_SM_LEVEL: this process runs as ") + test_level +
              " (the CPU runs " + detected + ")");
      detected = test_level;
    }
    return detected;
  }();
  return level;
}

std::string DefaultSmTarget() {
  const char* env = std::getenv("KILN_SM_CEILING");
  const std::string ceiling = env && SmRank(env) >= 0 ? env : "x86-64-v3";
  const std::string& detected = DetectSmLevel();
  return SmRank(detected) < SmRank(ceiling) ? detected : ceiling;
}

std::string SmOrDefault(const std::string& requested) {
  return requested.empty() ? DefaultSmTarget() : requested;
}

nlohmann::json Toolchain::Block() const {
  return nlohmann::json{{"compiler", compiler_version},
                        {"compiler_sha256", compiler_sha256},
                        {"flags", flags},
                        {"kernel_libraries", {{"onednn", onednn_version}}},
                        {"runtime_abi", runtime_abi},
                        {"codegen", codegen_version}};
}

Result<std::string> Toolchain::Digest() const { return FactsDigest(Block()); }

std::string KernelLibraryVersion() {
  return std::to_string(DNNL_VERSION_MAJOR) + "." + std::to_string(DNNL_VERSION_MINOR) + "." +
         std::to_string(DNNL_VERSION_PATCH) + "+" + DNNL_VERSION_HASH;
}

Result<std::string> CompilerVersion(const std::string& compiler_path,
                                    const std::string& compiler_sha256,
                                    const std::string& cache_root) {
  const std::string cached =
      cache_root.empty() ? "" : cache_root + "/toolchain/" + compiler_sha256 + ".version";
  if (!cached.empty()) {
    auto text = ReadFile(cached);
    if (text.ok() && !text->empty() && text->size() <= 512 &&
        text->find('\n') == std::string::npos) {
      return *text;
    }
  }
  std::string out;
  KILN_ASSIGN_OR_RETURN(int rc, RunProcess({compiler_path, "--version"}, &out));
  if (rc != 0) {
    return Status::IOError("'" + compiler_path + " --version' exited " + std::to_string(rc));
  }
  const std::string version = Trim(out.substr(0, out.find('\n')));
  if (!cached.empty() && !version.empty() && version.size() <= 512 &&
      MakeDirs(cache_root + "/toolchain").ok()) {
    WriteFileAtomic(cached, version).IgnoreError();  // a cache: failing to keep it costs a spawn
  }
  return version;
}

Result<Toolchain> LocalToolchain() {
  static std::mutex mu;
  static std::unique_ptr<Toolchain> cached;
  std::lock_guard<std::mutex> lock(mu);
  if (cached) return *cached;
  KILN_ASSIGN_OR_RETURN(std::string compiler, FindCompiler());
  KILN_ASSIGN_OR_RETURN(Toolchain t, ToolchainOf(compiler));
  cached = std::make_unique<Toolchain>(t);
  return t;
}

Result<Toolchain> ToolchainOf(const std::string& compiler) {
  Toolchain t;
  KILN_ASSIGN_OR_RETURN(t.compiler_path, FindCompiler(compiler));
  KILN_ASSIGN_OR_RETURN(t.compiler_sha256, Sha256File(t.compiler_path));
  auto cache_root = KilnCacheRoot();
  KILN_ASSIGN_OR_RETURN(t.compiler_version,
                        CompilerVersion(t.compiler_path, t.compiler_sha256,
                                        cache_root.ok() ? *cache_root : std::string()));
  // -fno-thread-jumps: jump threading clones the code after a clamp (x > hi ? hi : x) into the
  // clamped path and folds it to constants; vectorized, both paths run on every lane, and a
  // folded denormal constant (sigmoid at the clamp, 4e-39) multiplied into each element costs a
  // microcode assist per vector: SiLU loops ran ~8x slower at x86-64-v3.
  // Clang has no such pass and refuses the flag, so a clang toolchain (a fleet's other OS image)
  // goes without it; the flags are part of the toolchain's identity either way.
  const bool clang = t.compiler_version.find("clang") != std::string::npos;
  t.flags = {"-std=c++17", "-O3"};
  if (!clang) t.flags.push_back("-fno-thread-jumps");
  t.flags.insert(t.flags.end(), {"-fPIC", "-fno-plt", "-fno-math-errno", "-fno-trapping-math",
                                 "-fvisibility=hidden", "-g0", "-fno-ident", "-Wl,--build-id=sha1",
                                 "-shared-libgcc"});
  t.onednn_version = KernelLibraryVersion();
  t.runtime_abi = KILN_CELL_ABI_VERSION;
  t.codegen_version = kCodegenVersion;
  return t;
}

}  // namespace kiln
