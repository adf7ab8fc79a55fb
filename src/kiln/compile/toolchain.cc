// Toolchain identity, sm detection and the system compiler driver (see toolchain.h).
#include "src/kiln/compile/toolchain.h"

#include <cpuid.h>
#include <fcntl.h>
#include <limits.h>
#include <oneapi/dnnl/dnnl.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <mutex>

#include "src/kiln/base/canonical_json.h"
#include "src/kiln/base/file.h"
#include "src/kiln/base/log.h"
#include "src/kiln/base/sha256.h"
#include "src/kiln/base/sm_levels.h"
#include "src/kiln/runtime/cell_abi.h"

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

Result<std::string> FindCompiler() {
  const char* env = std::getenv("KILN_CXX");
  std::string name = env && *env ? env : "c++";
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

nlohmann::json Toolchain::Block() const {
  return nlohmann::json{{"compiler", compiler_version},
                        {"compiler_sha256", compiler_sha256},
                        {"flags", flags},
                        {"kernel_libraries", {{"onednn", onednn_version}}},
                        {"runtime_abi", runtime_abi},
                        {"codegen", codegen_version}};
}

Result<std::string> Toolchain::Digest() const { return FactsDigest(Block()); }

Result<int> RunProcess(const std::vector<std::string>& argv, std::string* output,
                       const std::string& cwd) {
  if (argv.empty()) return Status::InvalidArgument("RunProcess: empty argv");
  // Everything the child needs is built before fork: the caller may be one thread of many (a
  // worker learning its toolchain while it loads), so the child makes only async-signal-safe
  // calls (dup2, chdir, execv, _exit) and never allocates.
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) != 0) return Status::IOError("pipe failed");
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(pipefd[0]);
    ::close(pipefd[1]);
    return Status::ResourceExhausted("fork failed for '" + argv[0] + "'");
  }
  if (pid == 0) {
    // A compiler outlives nothing it works for: it dies with the thread that waits for it.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    ::dup2(pipefd[1], 1);
    ::dup2(pipefd[1], 2);
    if (!cwd.empty() && ::chdir(cwd.c_str()) != 0) _exit(126);
    ::execv(args[0], args.data());
    _exit(127);
  }
  ::close(pipefd[1]);
  char buf[4096];
  ssize_t n;
  while ((n = ::read(pipefd[0], buf, sizeof(buf))) != 0) {
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (output) output->append(buf, static_cast<size_t>(n));
  }
  ::close(pipefd[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
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
  Toolchain t;
  KILN_ASSIGN_OR_RETURN(t.compiler_path, FindCompiler());
  KILN_ASSIGN_OR_RETURN(t.compiler_sha256, Sha256File(t.compiler_path));
  auto cache_root = KilnCacheRoot();
  KILN_ASSIGN_OR_RETURN(t.compiler_version,
                        CompilerVersion(t.compiler_path, t.compiler_sha256,
                                        cache_root.ok() ? *cache_root : std::string()));
  t.flags = {"-std=c++17",
             "-O3",
             "-fPIC",
             "-fno-plt",
             "-fno-math-errno",
             "-fno-trapping-math",
             "-fvisibility=hidden",
             "-g0",
             "-fno-ident",
             "-Wl,--build-id=sha1",
             "-shared-libgcc"};
  const dnnl_version_t* v = dnnl_version();
  t.onednn_version = std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
                     std::to_string(v->patch) + "+" + v->hash;
  t.runtime_abi = KILN_CELL_ABI_VERSION;
  t.codegen_version = kCodegenVersion;
  cached = std::make_unique<Toolchain>(t);
  return t;
}

namespace {

class SystemCompilerDriver : public CompilerDriver {
 public:
  explicit SystemCompilerDriver(Toolchain t) : t_(std::move(t)) {}

  Status CompileObject(const std::string& source_path, const std::string& object_path,
                       const std::string& sm, const std::vector<std::string>& defines,
                       const std::string& seed, const std::string& work_dir) override {
    std::vector<std::string> argv = {t_.compiler_path,
                                     "-c",
                                     source_path,
                                     "-o",
                                     object_path,
                                     "-march=" + sm,
                                     "-frandom-seed=" + seed,
                                     "-ffile-prefix-map=" + work_dir + "=/kiln"};
    for (const auto& f : t_.flags) {
      if (f.rfind("-Wl,", 0) != 0 && f != "-shared-libgcc") argv.push_back(f);
    }
    for (const auto& d : defines) argv.push_back("-D" + d);
    return Run(argv, work_dir, "compile " + source_path);
  }

  Status LinkShared(const std::vector<std::string>& objects, const std::string& so_path,
                    const std::string& work_dir) override {
    std::vector<std::string> argv = {
        t_.compiler_path,       "-shared", "-o", so_path, "-Wl,--build-id=sha1", "-Wl,-z,defs",
        "-Wl,--hash-style=gnu", "-fPIC"};
    for (const auto& o : objects) argv.push_back(o);
    argv.push_back("-lm");
    return Run(argv, work_dir, "link " + so_path);
  }

 private:
  Status Run(const std::vector<std::string>& argv, const std::string& cwd,
             const std::string& what) {
    std::string out;
    auto rc = RunProcess(argv, &out, cwd);
    if (!rc.ok()) return rc.status();
    if (*rc != 0) {
      if (out.size() > 4000) out = out.substr(0, 4000) + "\n[...]";
      return Status::Internal("system compiler failed to " + what + " (exit " +
                              std::to_string(*rc) + "):\n" + out);
    }
    return Status::OK();
  }
  Toolchain t_;
};

}  // namespace

std::unique_ptr<CompilerDriver> MakeSystemCompilerDriver(const Toolchain& toolchain) {
  return std::make_unique<SystemCompilerDriver>(toolchain);
}

}  // namespace kiln
