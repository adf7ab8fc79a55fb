// End-to-end tests of the `kiln` binary as a user runs it: info, run, checkpoint derive, errors.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "src/kiln/cli/commands.h"
#include "src/kiln/tensor/npy.h"
#include "src/kiln/tensor/safetensors.h"

namespace kiln {
namespace {

const std::string kKiln = KILN_BINARY;
const std::string kExamples = std::string(KILN_SOURCE_DIR) + "/examples";

struct Output {
  int exit_code;
  std::string text;  // stdout + stderr
};

Output Kiln(const std::string& args) {
  const std::string cmd = kKiln + " " + args + " 2>&1";
  Output out{-1, ""};
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) out.text.append(buf.data(), n);
  const int status = ::pclose(p);
  out.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

TEST(Cli, InfoPrintsDigestIoAndWeights) {
  Output o = Kiln("info " + kExamples + "/mlp/model.onnx");
  ASSERT_EQ(o.exit_code, 0) << o.text;
  EXPECT_NE(o.text.find("digest:"), std::string::npos) << o.text;
  EXPECT_NE(o.text.find("x "), std::string::npos);
  EXPECT_NE(o.text.find("float32[batch,64]"), std::string::npos) << o.text;
  EXPECT_NE(o.text.find("weights: 9 tensors"), std::string::npos) << o.text;
  EXPECT_NE(o.text.find("Gemm"), std::string::npos);
}

TEST(Cli, RunWritesOutputsThatMatchTheReference) {
  const std::string out_dir = "/tmp/kiln_cli_run_test";
  std::system(("rm -rf " + out_dir).c_str());
  Output o = Kiln("run " + kExamples + "/mlp/model.onnx --checkpoint " + kExamples +
                  "/mlp/checkpoint.safetensors --input x=" + kExamples +
                  "/mlp/inputs/x.npy --out " + out_dir);
  ASSERT_EQ(o.exit_code, 0) << o.text;
  auto got = ReadNpy(out_dir + "/logits.npy");
  auto ref = ReadNpy(kExamples + "/mlp/outputs/logits.npy");
  ASSERT_TRUE(got.ok() && ref.ok());
  ASSERT_EQ(got->shape(), ref->shape());
  for (int64_t i = 0; i < ref->numel(); ++i) {
    EXPECT_NEAR(got->GetAsDouble(i), ref->GetAsDouble(i), 1e-4);
  }
}

TEST(Cli, RunRefusesBadInputsByName) {
  Output wrong_name = Kiln("run " + kExamples + "/mlp/model.onnx --input y=" + kExamples +
                           "/mlp/inputs/x.npy --out /tmp/kiln_cli_x");
  EXPECT_EQ(wrong_name.exit_code, 1);
  EXPECT_NE(wrong_name.text.find("'y' is not an input"), std::string::npos) << wrong_name.text;

  Output wrong_rank =
      Kiln("run " + kExamples + "/micro-diffusion/model.onnx --input latent=" + kExamples +
           "/mlp/inputs/x.npy --input timestep=" + kExamples +
           "/micro-diffusion/inputs/timestep.npy --input cond=" + kExamples +
           "/micro-diffusion/inputs/cond.npy --out /tmp/kiln_cli_x");
  EXPECT_EQ(wrong_rank.exit_code, 1);
  EXPECT_NE(wrong_rank.text.find("input 'latent' has rank 2"), std::string::npos)
      << wrong_rank.text;

  Output bad_spec = Kiln("run " + kExamples + "/mlp/model.onnx --input x --out /tmp/kiln_cli_x");
  EXPECT_EQ(bad_spec.exit_code, 1);
  EXPECT_NE(bad_spec.text.find("NAME=FILE.npy"), std::string::npos) << bad_spec.text;

  Output missing = Kiln("info /nonexistent.onnx");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.text.find("not_found"), std::string::npos) << missing.text;

  Output usage = Kiln("run");
  EXPECT_EQ(usage.exit_code, 2) << usage.text;
}

TEST(Cli, CheckpointDeriveIsDeterministicAndBindable) {
  const std::string a = "/tmp/kiln_cli_derive_a.safetensors";
  const std::string b = "/tmp/kiln_cli_derive_b.safetensors";
  for (const std::string& p : {a, b}) {
    Output o = Kiln("checkpoint derive " + kExamples + "/mlp/model.onnx --seed 7 --out " + p);
    ASSERT_EQ(o.exit_code, 0) << o.text;
  }
  Output cmp = {std::system(("cmp -s " + a + " " + b).c_str()), ""};
  EXPECT_EQ(cmp.exit_code, 0) << "two derivations with one seed differ";
  Output run = Kiln("run " + kExamples + "/mlp/model.onnx --checkpoint " + a +
                    " --input x=" + kExamples + "/mlp/inputs/x.npy --out /tmp/kiln_cli_derive_out");
  EXPECT_EQ(run.exit_code, 0) << run.text;
}

TEST(Cli, SafeFileNameReplacesUnsafeCharacters) {
  EXPECT_EQ(cli::SafeFileName("logits"), "logits");
  EXPECT_EQ(cli::SafeFileName("/out/x:0"), "_out_x_0");
  EXPECT_EQ(cli::SafeFileName(".."), "_..");
  EXPECT_EQ(cli::SafeFileName(""), "_");
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// kiln key / mint / inspect / run --compile, as a user runs them, against a private store.
class CliCellTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cache_ = "/tmp/kiln-cli-cells-" + std::to_string(::getpid());
    std::system(("rm -rf " + cache_).c_str());
    ::setenv("KILN_CACHE_DIR", cache_.c_str(), 1);
  }
  std::string cache_;
};

// kiln sets two runtime settings for itself, and so for what it starts, unless the environment
// already makes them: glibc's malloc backs large allocations with transparent huge pages, and the
// OpenMP team spins only briefly at barriers. Seen from the compiler a mint runs.
TEST_F(CliCellTest, RuntimeSettingsAreSetUnlessTheEnvironmentMakesThem) {
  const std::string dir = cache_ + "-cxx";
  std::filesystem::create_directories(dir);
  const std::string env_file = dir + "/env.txt";
  {
    std::FILE* f = std::fopen((dir + "/c++").c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fprintf(f, "#!/bin/sh\nenv >> %s\nexec /usr/bin/c++ \"$@\"\n", env_file.c_str());
    std::fclose(f);
    ::chmod((dir + "/c++").c_str(), 0755);
  }
  auto mint_env = [&](const std::string& env) {
    std::filesystem::remove_all(cache_);
    std::filesystem::remove(env_file);
    const std::string cmd = "env -u GLIBC_TUNABLES -u GOMP_SPINCOUNT -u OMP_WAIT_POLICY " + env +
                            " KILN_CXX=" + dir + "/c++ " + kKiln + " mint --manifest " + kExamples +
                            "/mlp/kiln.toml >/dev/null 2>&1";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    std::ifstream in(env_file);
    return "\n" + std::string(std::istreambuf_iterator<char>(in), {});  // every line after a \n
  };
  const std::string defaults = mint_env("");
  EXPECT_NE(defaults.find("\nGLIBC_TUNABLES=glibc.malloc.hugetlb=1\n"), std::string::npos)
      << defaults;
  EXPECT_NE(defaults.find("\nGOMP_SPINCOUNT=10000\n"), std::string::npos) << defaults;
  const std::string chosen =
      mint_env("GLIBC_TUNABLES=glibc.malloc.hugetlb=0 OMP_WAIT_POLICY=PASSIVE");
  EXPECT_NE(chosen.find("\nGLIBC_TUNABLES=glibc.malloc.hugetlb=0\n"), std::string::npos) << chosen;
  EXPECT_NE(chosen.find("\nOMP_WAIT_POLICY=PASSIVE\n"), std::string::npos) << chosen;
  EXPECT_EQ(chosen.find("GOMP_SPINCOUNT="), std::string::npos) << chosen;
  std::filesystem::remove_all(dir);
}

TEST_F(CliCellTest, KeyMintInspectAndRunCompiled) {
  const std::string manifest = kExamples + "/mlp/kiln.toml";
  Output key = Kiln("key --manifest " + manifest);
  ASSERT_EQ(key.exit_code, 0) << key.text;
  const std::string k = key.text.substr(0, key.text.find('\n'));
  EXPECT_EQ(k.rfind("ck1-", 0), 0u) << key.text;
  EXPECT_NE(key.text.find("nothing compiled"), std::string::npos);

  Output mint = Kiln("mint --manifest " + manifest);
  ASSERT_EQ(mint.exit_code, 0) << mint.text;
  EXPECT_EQ(mint.text.rfind(k + "@sha256:", 0), 0u) << "mint's ref must carry the derived key\n"
                                                    << mint.text;
  EXPECT_NE(mint.text.find("HEALTHY"), std::string::npos);
  for (const char* stage : {"key", "compile", "build", "gate", "fence", "seal", "total"}) {
    EXPECT_NE(mint.text.find(stage), std::string::npos) << stage;
  }

  Output inspect = Kiln("inspect " + k);
  ASSERT_EQ(inspect.exit_code, 0) << inspect.text;
  EXPECT_NE(inspect.text.find("entry 2"), std::string::npos) << inspect.text;
  EXPECT_NE(inspect.text.find("constants (9"), std::string::npos) << inspect.text;
  EXPECT_NE(inspect.text.find("checkpoint_free=1"), std::string::npos);

  // A private directory left by a process that died (here: one that exited without cleaning up)
  // is swept by the next kiln process; a live process's one is not touched.
  // Private directories are `cells-<pid>-<random>` under the user's 0700 root.
  const std::string root = "/tmp/kiln-" + std::to_string(::geteuid());
  ::mkdir(root.c_str(), 0700);
  const std::string prefix = root + "/cells-";
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ASSERT_GT(dead, 0);
  ::waitpid(dead, nullptr, 0);
  const std::string dead_dir = prefix + std::to_string(dead) + "-Ab12Cd";
  const std::string live_dir = prefix + std::to_string(::getpid()) + "-Ab12Cd";  // this process
  ASSERT_EQ(std::system(("mkdir -p " + dead_dir + "/x " + live_dir + "/x").c_str()), 0);

  const std::string out_dir = "/tmp/kiln_cli_compiled_" + std::to_string(::getpid());
  Output run = Kiln("run " + kExamples + "/mlp/model.onnx --checkpoint " + kExamples +
                    "/mlp/checkpoint.safetensors --input x=" + kExamples +
                    "/mlp/inputs/x.npy --out " + out_dir + " --compile");
  ASSERT_EQ(run.exit_code, 0) << run.text;
  EXPECT_FALSE(std::filesystem::exists(dead_dir)) << "a dead process's directory was not swept";
  EXPECT_TRUE(std::filesystem::exists(live_dir + "/x")) << "a live process's directory was swept";
  std::filesystem::remove_all(live_dir);
  // The run loaded its cell from its own private directory and removed it when it exited: no
  // directory is left whose process is gone (one that vanishes while we look is not a leak).
  for (const auto& e : std::filesystem::directory_iterator(root)) {
    const std::string path = e.path().string();
    if (path.rfind(prefix, 0) != 0) continue;
    const pid_t pid = static_cast<pid_t>(std::atol(path.c_str() + prefix.size()));
    if (::kill(pid, 0) != 0 && std::filesystem::exists(path)) ADD_FAILURE() << "left: " << path;
  }
  EXPECT_NE(run.text.find("serving_mode: aot_cell"), std::string::npos) << run.text;
  auto got = ReadNpy(out_dir + "/logits.npy");
  auto ref = ReadNpy(kExamples + "/mlp/outputs/logits.npy");
  ASSERT_TRUE(got.ok() && ref.ok());
  for (int64_t i = 0; i < ref->numel(); ++i) {
    EXPECT_NEAR(got->GetAsDouble(i), ref->GetAsDouble(i), 1e-4);
  }
  // The second compiled run finds the cell in the local store.
  Output again = Kiln("run " + kExamples + "/mlp/model.onnx --checkpoint " + kExamples +
                      "/mlp/checkpoint.safetensors --input x=" + kExamples +
                      "/mlp/inputs/x.npy --out " + out_dir + " --compile");
  EXPECT_NE(again.text.find("local store hit"), std::string::npos) << again.text;
}

// Bisecting: mint, run --compile and bench each compile without a pass named by --disable-pass;
// the cell is proven as always but not the cell its key names, so the local store neither
// serves nor keeps one.
TEST_F(CliCellTest, DisabledPassesCompileFromEveryEntryPointAndNothingIsStored) {
  const std::string cells = cache_ + "/cells";
  auto stored = [&] { return std::filesystem::exists(cells) && !std::filesystem::is_empty(cells); };
  Output mint =
      Kiln("mint --manifest " + kExamples + "/mlp/kiln.toml --disable-pass fuse-elementwise");
  ASSERT_EQ(mint.exit_code, 0) << mint.text;
  EXPECT_NE(mint.text.find("HEALTHY"), std::string::npos) << mint.text;
  EXPECT_NE(mint.text.find("not stored: compiled without fuse-elementwise"), std::string::npos)
      << mint.text;
  EXPECT_FALSE(stored());
  const std::string out_dir = "/tmp/kiln_cli_bisect_" + std::to_string(::getpid());
  const std::string run = "run " + kExamples + "/mlp/model.onnx --checkpoint " + kExamples +
                          "/mlp/checkpoint.safetensors --input x=" + kExamples +
                          "/mlp/inputs/x.npy --out " + out_dir + " --compile";
  Output bisect = Kiln(run + " --disable-pass fold-gemm-bias --disable-pass plan-layout");
  ASSERT_EQ(bisect.exit_code, 0) << bisect.text;
  EXPECT_NE(bisect.text.find("not stored"), std::string::npos) << bisect.text;
  EXPECT_FALSE(stored());
  auto got = ReadNpy(out_dir + "/logits.npy");
  auto ref = ReadNpy(kExamples + "/mlp/outputs/logits.npy");
  ASSERT_TRUE(got.ok() && ref.ok());
  for (int64_t i = 0; i < ref->numel(); ++i)
    EXPECT_NEAR(got->GetAsDouble(i), ref->GetAsDouble(i), 1e-4);
  Output bench = Kiln("bench " + kExamples +
                      "/mlp/model.onnx --class 'x=[4,64]' --engine compiled "
                      "--runs 2 --warmup 0 --disable-pass fuse-library-epilogue");
  ASSERT_EQ(bench.exit_code, 0) << bench.text;
  EXPECT_FALSE(stored());
  Output eager_only = Kiln("run " + kExamples + "/mlp/model.onnx --input x=" + kExamples +
                           "/mlp/inputs/x.npy --out " + out_dir + " --disable-pass plan-layout");
  EXPECT_NE(eager_only.exit_code, 0);
  EXPECT_NE(eager_only.text.find("--disable-pass needs --compile"), std::string::npos)
      << eager_only.text;
  // The whole pipeline's cell is minted and stored afresh: nothing was left to hit.
  Output whole = Kiln(run);
  ASSERT_EQ(whole.exit_code, 0) << whole.text;
  EXPECT_NE(whole.text.find("minted and stored"), std::string::npos) << whole.text;
  EXPECT_TRUE(stored());
  std::filesystem::remove_all(out_dir);
}

TEST_F(CliCellTest, RefusalsAreNamed) {
  Output bad_target = Kiln("mint --manifest " + kExamples + "/mlp/kiln.toml --target nope");
  EXPECT_EQ(bad_target.exit_code, 1);
  EXPECT_NE(bad_target.text.find("nope"), std::string::npos) << bad_target.text;
  Output bad_pass =
      Kiln("mint --manifest " + kExamples + "/mlp/kiln.toml --disable-pass no-such-pass");
  EXPECT_EQ(bad_pass.exit_code, 1);
  EXPECT_NE(bad_pass.text.find("no-such-pass"), std::string::npos) << bad_pass.text;
  Output not_a_cell = Kiln("inspect " + kExamples + "/mlp/model.onnx");
  EXPECT_EQ(not_a_cell.exit_code, 1);
  EXPECT_NE(not_a_cell.text.find("corruption"), std::string::npos) << not_a_cell.text;
}

}  // namespace
}  // namespace kiln
