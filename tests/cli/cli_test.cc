// End-to-end tests of the `kiln` binary as a user runs it: info, run, checkpoint derive, errors.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
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

  Output wrong_rank = Kiln("run " + kExamples + "/micro-diffusion/model.onnx --input latent=" +
                           kExamples + "/mlp/inputs/x.npy --input timestep=" + kExamples +
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
  Output run = Kiln("run " + kExamples + "/mlp/model.onnx --checkpoint " + a + " --input x=" +
                    kExamples + "/mlp/inputs/x.npy --out /tmp/kiln_cli_derive_out");
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
