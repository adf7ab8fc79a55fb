// The fleet story end to end, with real processes on loopback: a hub; `kiln mint` + `kiln
// publish` on machine A; `kiln worker` on machine B (an empty local store) adopts the cell at
// boot and serves its first request from it (serving_mode aot_cell), matching PyTorch; SIGTERM
// drains and exits 0. Machines A and B are two cache directories.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <thread>
#include <vector>

#include "src/kiln/base/file.h"
#include "src/kiln/base/sha256.h"
#include "src/kiln/tensor/npy.h"
#include "tests/hub/hub_process.h"

namespace kiln {
namespace {

using namespace kiln::hub_testing;  // NOLINT: the hub fixtures

const std::string kExamples = std::string(KILN_SOURCE_DIR) + "/examples/";

// Runs `kiln args...` with KILN_CACHE_DIR=cache and returns (exit code, output).
std::pair<int, std::string> Kiln(const std::string& cache, const std::string& args) {
  const std::string cmd = "KILN_CACHE_DIR=" + cache + " " + Binary() + " " + args + " 2>&1";
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  char buf[4096];
  size_t n;
  while (p && (n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = p ? ::pclose(p) : -1;
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

TEST(WorkerEndToEnd, BootAdoptsFromTheHubAndServesTheFirstRequestFromTheCell) {
  char tmpl[] = "/tmp/kiln-worker-e2e-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string root = tmpl;
  ASSERT_TRUE(MakeDirs(root + "/hub/data").ok());
  nlohmann::json tokens = {
      {"tokens",
       {{{"name", "ci"},
         {"role", "publisher"},
         {"tier", "platform"},
         {"sha256", Sha256Hex(kPlatform)}},
        {{"name", "worker-b"}, {"role", "worker"}, {"sha256", Sha256Hex(kWorker)}}}}};
  ASSERT_TRUE(WriteFileAtomic(root + "/hub/tokens.json", tokens.dump(2)).ok());
  HubProcess hub(root + "/hub/data", "");
  ASSERT_TRUE(hub.Start());
  const std::string hub_url = "http://127.0.0.1:" + std::to_string(hub.port());

  // Machine A mints and publishes.
  auto mint = Kiln(root + "/a", "mint --manifest " + kExamples + "mlp/kiln.toml");
  ASSERT_EQ(mint.first, 0) << mint.second;
  const std::string key = mint.second.substr(0, mint.second.find('@'));
  auto pub = Kiln(root + "/a", "publish " + root + "/a/cells/" + key + "/cell.tar --hub " +
                                   hub_url + " --token " + kPlatform);
  ASSERT_EQ(pub.first, 0) << pub.second;
  auto jwks = hub.Client(kWorker)->GetJwks();
  ASSERT_TRUE(jwks.ok());
  ASSERT_TRUE(WriteFileAtomic(root + "/jwks.json", jwks.body.dump()).ok());

  // Machine B: the example's manifest plus a hub section, in B's own directory.
  auto base = ReadFile(kExamples + "mlp/kiln.toml");
  ASSERT_TRUE(base.ok());
  std::string manifest = *base;
  for (const char* rel : {"model.onnx", "checkpoint.safetensors"}) {
    const std::string from = std::string("\"") + rel + "\"";
    const size_t at = manifest.find(from);
    ASSERT_NE(at, std::string::npos) << rel;
    manifest.replace(at, from.size(), "\"" + kExamples + "mlp/" + rel + "\"");
  }
  manifest += "\n[hub]\nurl = \"" + hub_url + "\"\ntoken = \"" + kWorker + "\"\ntrust = [\"" +
              root + "/jwks.json\"]\n";
  ASSERT_TRUE(MakeDirs(root + "/b").ok());
  ASSERT_TRUE(WriteFileAtomic(root + "/b/kiln.toml", manifest).ok());

  const int port = FreePort();
  const std::string log = root + "/b/worker.log";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setenv("KILN_CACHE_DIR", (root + "/b").c_str(), 1);
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    std::vector<std::string> args = {Binary(),     "worker",
                                     "--manifest", root + "/b/kiln.toml",
                                     "--port",     std::to_string(port),
                                     "--events",   root + "/b/events.jsonl"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  httplib::Client http("127.0.0.1", port);
  http.set_read_timeout(30, 0);
  bool live = false;
  for (int i = 0; i < 300 && !live; ++i) {
    auto r = http.Get("/v2/health/ready");
    live = r && r->status == 200;
    if (!live) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  auto boot_log = ReadFile(log);
  ASSERT_TRUE(live) << (boot_log.ok() ? *boot_log : "");
  EXPECT_NE(boot_log->find("boot_adopt hit"), std::string::npos) << *boot_log;

  // The first request is served by the cell and matches PyTorch's reference.
  auto x = ReadNpy(kExamples + "mlp/inputs/x.npy");
  auto ref = ReadNpy(kExamples + "mlp/outputs/logits.npy");
  ASSERT_TRUE(x.ok() && ref.ok());
  nlohmann::json data = nlohmann::json::array();
  for (int64_t i = 0; i < x->numel(); ++i) data.push_back(x->data<float>()[i]);
  nlohmann::json req = {
      {"inputs", {{{"name", "x"}, {"shape", x->shape()}, {"datatype", "FP32"}, {"data", data}}}}};
  auto res = http.Post("/v2/models/mlp/infer", req.dump(), "application/json");
  ASSERT_TRUE(res) << "no answer";
  ASSERT_EQ(res->status, 200) << res->body;
  auto body = nlohmann::json::parse(res->body);
  EXPECT_EQ(body["parameters"]["serving_mode"], "aot_cell") << res->body;
  EXPECT_EQ(body["parameters"]["served_cell_ref"].get<std::string>().rfind(key + "@sha256:", 0), 0u)
      << res->body;
  const auto& out = body["outputs"][0]["data"];
  ASSERT_EQ(static_cast<int64_t>(out.size()), ref->numel());
  for (int64_t i = 0; i < ref->numel(); ++i) {
    EXPECT_NEAR(out[static_cast<size_t>(i)].get<double>(), ref->GetAsDouble(i), 1e-4);
  }
  // Exactly one boot_adopt row, phase hit, on disk.
  auto events = ReadFile(root + "/b/events.jsonl");
  ASSERT_TRUE(events.ok());
  size_t rows = 0;
  for (size_t at = events->find("\"boot_adopt\""); at != std::string::npos;
       at = events->find("\"boot_adopt\"", at + 1)) {
    ++rows;
  }
  EXPECT_EQ(rows, 1u) << *events;
  EXPECT_NE(events->find("\"hit\""), std::string::npos) << *events;

  // Out of envelope: served eager, named; the cell stays armed.
  auto infer = [&](const Tensor& t) {
    nlohmann::json d = nlohmann::json::array();
    for (int64_t i = 0; i < t.numel(); ++i) d.push_back(t.data<float>()[i]);
    nlohmann::json r = {
        {"inputs", {{{"name", "x"}, {"shape", t.shape()}, {"datatype", "FP32"}, {"data", d}}}}};
    auto a = http.Post("/v2/models/mlp/infer", r.dump(), "application/json");
    return a && a->status == 200 ? nlohmann::json::parse(a->body) : nlohmann::json();
  };
  auto three = Tensor::FromVector<float>({3, 64}, std::vector<float>(192, 0.25f));
  auto odd = infer(three);
  EXPECT_EQ(odd["parameters"]["serving_mode"], "eager") << odd.dump();
  EXPECT_EQ(odd["parameters"]["fallback_reason"], "out_of_envelope") << odd.dump();
  EXPECT_EQ(infer(*x)["parameters"]["serving_mode"], "aot_cell");

  // The operator's eager-only order, then its release: the cell serves again.
  auto order = [&](bool on) {
    nlohmann::json b = {{"target", "mlp"}, {"on", on}, {"reason", "e2e"}};
    auto a = http.Post("/v1/admin/eager-only", b.dump(), "application/json");
    return a && a->status == 200;
  };
  ASSERT_TRUE(order(true));
  auto ordered = infer(*x);
  EXPECT_EQ(ordered["parameters"]["serving_mode"], "eager") << ordered.dump();
  EXPECT_EQ(ordered["parameters"]["fallback_reason"], "operator_eager_only") << ordered.dump();
  ASSERT_TRUE(order(false));
  EXPECT_EQ(infer(*x)["parameters"]["serving_mode"], "aot_cell");

  // A checkpoint swap keeps the cell serving; its outputs follow the new weights (which moved
  // them away from the reference).
  auto derive =
      Kiln(root + "/b", "checkpoint derive " + kExamples + "mlp/model.onnx --seed 7 --out " + root +
                            "/b/ft.safetensors");
  ASSERT_EQ(derive.first, 0) << derive.second;
  nlohmann::json swap = {{"target", "mlp"}, {"path", root + "/b/ft.safetensors"}};
  auto swapped = http.Post("/v1/admin/checkpoint", swap.dump(), "application/json");
  ASSERT_TRUE(swapped && swapped->status == 200) << (swapped ? swapped->body : "no answer");
  auto after = infer(*x);
  EXPECT_EQ(after["parameters"]["serving_mode"], "aot_cell") << after.dump();
  auto eager_new = Kiln(root + "/b", "run " + kExamples + "mlp/model.onnx --checkpoint " + root +
                                         "/b/ft.safetensors --input x=" + kExamples +
                                         "mlp/inputs/x.npy --out " + root + "/b/eager_new");
  ASSERT_EQ(eager_new.first, 0) << eager_new.second;
  auto expect = ReadNpy(root + "/b/eager_new/logits.npy");
  ASSERT_TRUE(expect.ok());
  double moved = 0;
  for (int64_t i = 0; i < expect->numel(); ++i) {
    const double got = after["outputs"][0]["data"][static_cast<size_t>(i)].get<double>();
    EXPECT_NEAR(got, expect->GetAsDouble(i), 1e-4);
    moved = std::max(moved, std::fabs(got - ref->GetAsDouble(i)));
  }
  EXPECT_GT(moved, 1e-4) << "the swap did not change the outputs";

  // The decisions are on disk as event rows, in seq order.
  auto rows_after = ReadFile(root + "/b/events.jsonl");
  ASSERT_TRUE(rows_after.ok());
  for (const char* kind : {"\"boot_adopt\"", "\"ingress_refused\"", "\"serve_posture\""}) {
    EXPECT_NE(rows_after->find(kind), std::string::npos) << kind << "\n" << *rows_after;
  }
  int64_t last_seq = 0;
  std::vector<std::string> kinds;
  for (size_t at = 0; at < rows_after->size();) {
    const size_t end = rows_after->find('\n', at);
    const std::string line = rows_after->substr(at, end - at);
    at = end == std::string::npos ? rows_after->size() : end + 1;
    if (line.empty()) continue;
    const auto row = nlohmann::json::parse(line);
    const int64_t seq = row["seq"].get<int64_t>();
    EXPECT_GT(seq, last_seq) << line;
    last_seq = seq;
    kinds.push_back(row["kind"].get<std::string>() + "/" + row["phase"].get<std::string>());
  }
  // Exactly these decisions, in this order: the install and the adoption, the odd batch refused
  // at ingress, the operator's order and its release, the checkpoint swap.
  EXPECT_EQ(kinds, (std::vector<std::string>{
                       "serve_posture/aot_cell", "boot_adopt/hit",
                       "ingress_refused/out_of_envelope", "serve_posture/operator_eager_only",
                       "serve_posture/operator_release", "serve_posture/checkpoint_swapped"}));

  ::kill(pid, SIGTERM);
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "worker did not drain and exit 0";
  if (!HasFailure()) std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace kiln
