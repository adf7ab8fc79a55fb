// Hostile shape values against real `kiln worker` processes on loopback (docs/reliability.md,
// "Fault-and-attack matrix"): models whose output shapes come from a request's values
// (ConstantOfShape, Range, OneHot, Expand, Tile, Resize, Reshape), made at test time with the ONNX
// builder, fed values whose tensors could never exist (2^62 elements, [3037000500, 3037000500],
// scales of 1e30) or that would not fit the request's memory budget. Every such request must be
// answered 4xx (`413 request_too_large`) within 100 ms, the worker must serve the next request,
// and its peak RSS must not grow by 64 MB. A compiled (intake) cell's dynamic region must refuse
// the same way without being revoked, and `kiln mint` must refuse a manifest dimension of 2^62 by
// name instead of crashing.
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "tests/graph/onnx_builder.h"
#include "tests/worker/worker_process.h"

namespace kiln::worker_testing {
namespace {

using kiln::testing::kFloat;
using kiln::testing::kInt64;
using kiln::testing::OnnxBuilder;
using nlohmann::json;

constexpr int64_t k2p62 = int64_t{1} << 62;
constexpr int64_t k2p61 = int64_t{1} << 61;
constexpr int64_t k2p40 = int64_t{1} << 40;
// 3037000500^2 is just past INT64_MAX: the element count itself overflows.
constexpr int64_t kSqrtPastInt64 = 3037000500;

// One input of an infer body.
json Input(const std::string& name, const std::string& datatype, std::vector<int64_t> shape,
           json data) {
  return {{"name", name}, {"shape", shape}, {"datatype", datatype}, {"data", std::move(data)}};
}
json Body(std::vector<json> inputs) { return {{"inputs", inputs}}; }

// One served model: its graph, its envelope (one class), a request it serves, and hostile ones.
struct Case {
  std::string name;  // target and model name
  OnnxBuilder model;
  std::string envelope;  // the TOML of one shape class
  json good;
  std::vector<std::pair<std::string, json>> hostile;  // (what, body)
};

std::vector<Case> Cases() {
  std::vector<Case> cases;
  {
    Case c{"cos", OnnxBuilder(), "{ shape = [2] }", {}, {}};
    c.model.Input("shape", kInt64, {-1}).Output("y", kFloat, {-1, -1});
    auto& n = c.model.Node("ConstantOfShape", {"shape"}, {"y"}, "fill");
    auto* a = n.add_attribute();
    a->set_name("value");
    a->set_type(onnx::AttributeProto::TENSOR);
    a->mutable_t()->set_data_type(onnx::TensorProto::FLOAT);
    a->mutable_t()->add_dims(1);
    a->mutable_t()->add_float_data(1.5f);
    c.good = Body({Input("shape", "INT64", {2}, {2, 3})});
    c.hostile = {
        {"shape [2^62]", Body({Input("shape", "INT64", {1}, {k2p62})})},
        {"shape [3037000500, 3037000500]",
         Body({Input("shape", "INT64", {2}, {kSqrtPastInt64, kSqrtPastInt64})})},
        {"shape [2^40] (fits int64, not the budget)",
         Body({Input("shape", "INT64", {1}, {k2p40})})},
    };
    cases.push_back(std::move(c));
  }
  {
    Case c{"range", OnnxBuilder(), "{ start = [], limit = [], delta = [] }", {}, {}};
    c.model.Input("start", kInt64, {}).Input("limit", kInt64, {}).Input("delta", kInt64, {});
    c.model.Output("y", kInt64, {-1});
    c.model.Node("Range", {"start", "limit", "delta"}, {"y"}, "range");
    auto body = [](int64_t start, int64_t limit, int64_t delta) {
      return Body({Input("start", "INT64", {}, {start}), Input("limit", "INT64", {}, {limit}),
                   Input("delta", "INT64", {}, {delta})});
    };
    c.good = body(0, 10, 3);
    c.hostile = {{"limit 2^61", body(0, k2p61, 1)},
                 {"start -2^62, limit 2^62 (the span overflows)", body(-k2p62, k2p62, 1)}};
    cases.push_back(std::move(c));
  }
  {
    Case c{"onehot", OnnxBuilder(), "{ indices = [3], depth = [1] }", {}, {}};
    c.model.Input("indices", kInt64, {-1}).Input("depth", kInt64, {1});
    c.model.FloatInit("values", {2}, {0, 1}).Output("y", kFloat, {-1, -1});
    c.model.Node("OneHot", {"indices", "depth", "values"}, {"y"}, "onehot");
    auto body = [](int64_t depth) {
      return Body(
          {Input("indices", "INT64", {3}, {0, 2, 1}), Input("depth", "INT64", {1}, {depth})});
    };
    c.good = body(4);
    c.hostile = {{"depth 2^62", body(k2p62)}};
    cases.push_back(std::move(c));
  }
  {
    Case c{"expand", OnnxBuilder(), "{ x = [1], shape = [2] }", {}, {}};
    c.model.Input("x", kFloat, {1}).Input("shape", kInt64, {-1}).Output("y", kFloat, {-1, -1});
    c.model.Node("Expand", {"x", "shape"}, {"y"}, "expand");
    auto body = [](std::vector<int64_t> shape) {
      return Body({Input("x", "FP32", {1}, {2.5}),
                   Input("shape", "INT64", {static_cast<int64_t>(shape.size())}, shape)});
    };
    c.good = body({2, 3});
    c.hostile = {{"shape [3037000500, 3037000500]", body({kSqrtPastInt64, kSqrtPastInt64})}};
    cases.push_back(std::move(c));
  }
  {
    Case c{"tile", OnnxBuilder(), "{ x = [4], repeats = [1] }", {}, {}};
    c.model.Input("x", kFloat, {4}).Input("repeats", kInt64, {1}).Output("y", kFloat, {-1});
    c.model.Node("Tile", {"x", "repeats"}, {"y"}, "tile");
    auto body = [](int64_t r) {
      return Body({Input("x", "FP32", {4}, {1, 2, 3, 4}), Input("repeats", "INT64", {1}, {r})});
    };
    c.good = body(3);
    c.hostile = {{"repeats [2^62] (4 x 2^62 overflows)", body(k2p62)},
                 {"repeats [2^40]", body(k2p40)}};
    cases.push_back(std::move(c));
  }
  {
    Case c{"resize", OnnxBuilder(), "{ x = [1, 1, 2, 2], scales = [4] }", {}, {}};
    c.model.Input("x", kFloat, {1, 1, 2, 2}).Input("scales", kFloat, {4});
    c.model.Output("y", kFloat, {-1, -1, -1, -1});
    c.model.Node("Resize", {"x", "", "scales"}, {"y"}, "resize");
    auto body = [](double s) {
      return Body({Input("x", "FP32", {1, 1, 2, 2}, {1, 2, 3, 4}),
                   Input("scales", "FP32", {4}, {1, 1, s, s})});
    };
    c.good = body(2);
    c.hostile = {{"scales 1e30 (a dim past int64)", body(1e30)},
                 {"scales 2^20 (2^42 elements)", body(1048576)}};
    cases.push_back(std::move(c));
  }
  {
    Case c{"reshape", OnnxBuilder(), "{ x = [4], shape = [2] }", {}, {}};
    c.model.Input("x", kFloat, {4}).Input("shape", kInt64, {-1}).Output("y", kFloat, {-1, -1});
    c.model.Node("Reshape", {"x", "shape"}, {"y"}, "reshape");
    auto body = [](std::vector<int64_t> shape) {
      return Body({Input("x", "FP32", {4}, {1, 2, 3, 4}),
                   Input("shape", "INT64", {static_cast<int64_t>(shape.size())}, shape)});
    };
    c.good = body({2, 2});
    c.hostile = {{"shape [3037000500, 3037000500]", body({kSqrtPastInt64, kSqrtPastInt64})},
                 {"shape [-1, 2^62, 4]", body({-1, k2p62, 4})}};
    cases.push_back(std::move(c));
  }
  return cases;
}

// A manifest serving every case from `dir`. `exported`: each target declares an export (and the
// worker's mint budget is too small to mint, so they serve eager); otherwise intake targets,
// compiled here at boot.
std::string WriteModels(const std::string& dir, std::vector<Case>& cases, bool exported,
                        const std::string& endpoint_extra = "") {
  EXPECT_TRUE(MakeDirs(dir).ok());
  std::string toml = "[endpoint]\nname = \"hostile\"\nmax_concurrency = 2\n" + endpoint_extra;
  if (exported) toml += "\n[mint]\nmemory_budget_mb = 1\n";
  for (Case& c : cases) {
    const std::string path = dir + "/" + c.name + ".onnx";
    EXPECT_TRUE(WriteFileAtomic(path, c.model.Bytes()).ok());
    toml +=
        "\n[targets." + c.name + "]\ngraph = \"" + path + "\"\nenvelope = [" + c.envelope + "]\n";
    if (exported) toml += "export = { family = \"root/hostile-" + c.name + "\" }\n";
    toml += "[functions." + c.name + "]\ntarget = \"" + c.name + "\"\n";
  }
  return toml;
}

class HostileValuesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kiln-hostile-e2e-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    root_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(root_, ec);
  }
  std::string root_;
};

// The refusal of one hostile request: a 4xx within 100 ms whose token is request_too_large and
// whose message names the node.
void ExpectRefusedFast(const Worker::Answer& a, const std::string& what, const std::string& node,
                       std::vector<double>* latencies) {
  SCOPED_TRACE(what);
  EXPECT_GE(a.status, 400) << a.body.dump();
  EXPECT_LT(a.status, 500) << a.body.dump();
  EXPECT_EQ(a.status, 413) << a.body.dump();
  EXPECT_EQ(a.body.value("token", ""), "request_too_large") << a.body.dump();
  EXPECT_NE(a.body.value("error", "").find("'" + node + "'"), std::string::npos) << a.body.dump();
  EXPECT_LT(a.ms, 100.0) << a.body.dump();
  latencies->push_back(a.ms);
  std::printf("  %-8s %-50s %d in %6.2f ms: %s\n", node.c_str(), what.c_str(), a.status, a.ms,
              a.body.value("error", "").substr(0, 160).c_str());
}

const char* NodeOf(const std::string& model) {
  static const std::map<std::string, std::string> kNodes = {
      {"cos", "fill"},  {"range", "range"},   {"onehot", "onehot"},  {"expand", "expand"},
      {"tile", "tile"}, {"resize", "resize"}, {"reshape", "reshape"}};
  return kNodes.at(model).c_str();
}

TEST_F(HostileValuesTest, ValueDependentShapesAreRefusedInMillisecondsAndTheWorkerServesOn) {
  std::vector<Case> cases = Cases();
  const std::string manifest = WriteModels(root_ + "/models", cases, /*exported=*/true);
  // The default budget (half the machine's memory over max_concurrency): the values here are
  // past any machine's.
  Worker worker(root_ + "/w", manifest);
  ASSERT_TRUE(worker.Start());
  const pid_t pid = worker.ServingPid();

  // Every model serves a well-formed request first (the baseline includes serving them).
  for (const Case& c : cases) {
    const Worker::Answer a = worker.Post("/v2/models/" + c.name + "/infer", c.good);
    ASSERT_EQ(a.status, 200) << c.name << ": " << a.body.dump() << worker.Log();
  }
  const long hwm_before = StatusKb(pid, "VmHWM");
  const long rss_before = StatusKb(pid, "VmRSS");
  ASSERT_GT(hwm_before, 0);

  std::vector<double> latencies;
  for (const Case& c : cases) {
    for (const auto& [what, body] : c.hostile) {
      ExpectRefusedFast(worker.Post("/v2/models/" + c.name + "/infer", body), c.name + ": " + what,
                        NodeOf(c.name), &latencies);
      // Alive and serving: the same model answers the next well-formed request.
      const Worker::Answer next = worker.Post("/v2/models/" + c.name + "/infer", c.good);
      EXPECT_EQ(next.status, 200) << c.name << " after " << what << ": " << next.body.dump();
    }
  }
  EXPECT_EQ(::waitpid(pid, nullptr, WNOHANG), 0) << "the worker exited: " << worker.Log();
  EXPECT_EQ(worker.ReadyStatus(), 200);

  const long hwm_after = StatusKb(pid, "VmHWM");
  const long rss_after = StatusKb(pid, "VmRSS");
  std::printf(
      "  %zu hostile requests: max %.2f ms; VmHWM %ld -> %ld kB (+%ld kB), VmRSS %ld -> "
      "%ld kB\n",
      latencies.size(), *std::max_element(latencies.begin(), latencies.end()), hwm_before,
      hwm_after, hwm_after - hwm_before, rss_before, rss_after);
  EXPECT_LT(hwm_after - hwm_before, 64 * 1024)
      << "peak RSS grew by " << hwm_after - hwm_before << " kB";
}

TEST_F(HostileValuesTest, TheRequestMemoryBudgetIsTheWorkersOptionAndNamesItsBound) {
  std::vector<Case> cases = Cases();
  cases.resize(1);  // ConstantOfShape
  // The manifest says 64 MiB, the flag 16 MiB: the flag wins.
  const std::string manifest =
      WriteModels(root_ + "/models", cases, /*exported=*/true, "request_memory_mb = 64\n");
  Worker worker(root_ + "/w", manifest, {}, {"--request-memory-mb", "16"});
  ASSERT_TRUE(worker.Start());
  EXPECT_NE(worker.Log().find("request memory budget 16 MiB (--request-memory-mb)"),
            std::string::npos)
      << worker.Log();
  auto fill = [&](int64_t n) {
    return worker.Post("/v2/models/cos/infer", Body({Input("shape", "INT64", {1}, {n})}));
  };
  // 1 Mi floats (4 MiB) fit; 8 Mi floats (32 MiB) do not, and the refusal says by how much.
  const Worker::Answer small = fill(int64_t{1} << 20);
  EXPECT_EQ(small.status, 200) << small.body.dump();
  const Worker::Answer big = fill(int64_t{1} << 23);
  EXPECT_EQ(big.status, 413) << big.body.dump();
  EXPECT_EQ(big.body.value("token", ""), "request_too_large");
  const std::string message = big.body.value("error", "");
  for (const char* part : {"ConstantOfShape 'fill'", "float32[8388608]", "33554432 bytes",
                           "memory budget of 16777216 bytes"}) {
    EXPECT_NE(message.find(part), std::string::npos) << part << " not in: " << message;
  }
  EXPECT_EQ(fill(int64_t{1} << 20).status, 200);
}

// Intake targets: the worker compiles each into a cell whose dynamic region runs the value-
// dependent node through the runtime host. The region refuses the hostile values by the request's
// budget as eager does, the answer is the same 413, and the cell stays armed (no serve_degrade
// row, the next request served `jit_cell`).
TEST_F(HostileValuesTest, ACellsDynamicRegionRefusesTheSameWayAndIsNotRevoked) {
  std::vector<Case> all = Cases();
  std::vector<Case> cases;
  for (Case& c : all) {
    if (c.name == "cos" || c.name == "range") cases.push_back(std::move(c));
  }
  const std::string manifest = WriteModels(root_ + "/models", cases, /*exported=*/false);
  Worker worker(root_ + "/w", manifest);
  ASSERT_TRUE(worker.Start());
  for (const Case& c : cases) {
    bool armed = false;
    for (int i = 0; i < 1200 && !armed; ++i) {  // the compile runs in a child: up to 10 minutes
      auto r = worker.Http()->Get("/v2/models/" + c.name);
      armed = r && r->status == 200 &&
              json::parse(r->body, nullptr, false)["parameters"].value("posture", "") == "jit_cell";
      if (!armed) std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
    ASSERT_TRUE(armed) << c.name << " never armed a cell: " << worker.Log();
    const Worker::Answer good = worker.Post("/v2/models/" + c.name + "/infer", c.good);
    ASSERT_EQ(good.status, 200) << good.body.dump();
    ASSERT_EQ(good.mode(), "jit_cell") << good.body.dump();
  }
  const long hwm_before = StatusKb(worker.ServingPid(), "VmHWM");
  std::vector<double> latencies;
  for (const Case& c : cases) {
    for (const auto& [what, body] : c.hostile) {
      ExpectRefusedFast(worker.Post("/v2/models/" + c.name + "/infer", body),
                        c.name + " (cell): " + what, NodeOf(c.name), &latencies);
      const Worker::Answer next = worker.Post("/v2/models/" + c.name + "/infer", c.good);
      EXPECT_EQ(next.status, 200) << next.body.dump();
      EXPECT_EQ(next.mode(), "jit_cell") << c.name << " after " << what << ": " << next.body.dump();
    }
  }
  const long hwm_after = StatusKb(worker.ServingPid(), "VmHWM");
  std::printf("  cell path: VmHWM %ld -> %ld kB (+%ld kB)\n", hwm_before, hwm_after,
              hwm_after - hwm_before);
  EXPECT_LT(hwm_after - hwm_before, 64 * 1024);
  for (const Row& r : worker.Rows()) {
    EXPECT_NE(r.kind, "serve_degrade") << r.detail;  // no cell was blamed
    EXPECT_NE(r.kind, "cell_oom") << r.detail;
  }
}

// `kiln mint` (and its child, which the worker starts) with an envelope dimension of 2^62: a
// refusal naming the manifest's key path, exit 1 (4 for the child), never a signal.
TEST_F(HostileValuesTest, MintRefusesA2p62ManifestDimensionByName) {
  ASSERT_TRUE(MakeDirs(root_).ok());
  ManifestOptions o;
  std::string text = Manifest(o);
  const std::string from = "{ x = [1, 64] }";
  const size_t at = text.find(from);
  ASSERT_NE(at, std::string::npos) << text;
  text.replace(at, from.size(), "{ x = [4611686018427387904, 64] }");
  const std::string path = root_ + "/kiln.toml";
  ASSERT_TRUE(WriteFileAtomic(path, text).ok());

  const auto [code, out] = Kiln(root_ + "/cache", "mint --manifest " + path);
  std::printf("  kiln mint: exit %d: %s", code, out.c_str());
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find("targets.mlp.envelope[0].x"), std::string::npos) << out;
  EXPECT_NE(out.find("4611686018427387904"), std::string::npos) << out;

  // The worker's mint child, given the same manifest.
  const json request = {{"manifest", path},
                        {"target", "mlp"},
                        {"intake", false},
                        {"out_dir", root_ + "/out"},
                        {"report", root_ + "/report.json"},
                        {"phases", root_ + "/phases.json"},
                        {"threads", 1},
                        {"attempt", 1},
                        {"parallel_compiles", 1}};
  ASSERT_TRUE(WriteFileAtomic(root_ + "/request.json", request.dump()).ok());
  const auto [child_code, child_out] =
      Kiln(root_ + "/cache", "mint --child " + root_ + "/request.json");
  std::printf("  kiln mint --child: exit %d\n", child_code);
  EXPECT_EQ(child_code, 4) << child_out;
  const std::string report = hub_testing::ValueOr(ReadFile(root_ + "/report.json"), std::string());
  EXPECT_NE(report.find("targets.mlp.envelope[0].x"), std::string::npos) << report << child_out;
}

}  // namespace
}  // namespace kiln::worker_testing
