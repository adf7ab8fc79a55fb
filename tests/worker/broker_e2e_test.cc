// The hub token stays in the worker's broker, with real processes on loopback (docs/fleet.md "The
// hub token stays in the broker"; src/kiln/worker/broker.h): a `kiln hub` that knows a token made
// up for this run, and a `kiln worker` whose manifest names it by `hub.token_env`. The worker runs
// as a broker and a serving process; with no cell on the hub it misses, mints in a child, arms the
// cell and publishes it, all through the broker; then a request runs the cell.
//
// The test switch KILN_TEST_SECRET_SCAN (base/secret_scan.h) makes three processes search their
// own memory and environment for the token: the broker (which holds it: its scan must find it, in
// memory and in the environment it was started with — the scan works), the mint child (after it
// read its manifest) and the serving process, right at the cell's first call (what that scan can
// read, the cell can). Neither of the last two may find it, and neither may read the broker's
// memory. The relay answers only its own serving process and only a worker's routes.
#include <gtest/gtest.h>
#include <httplib.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "src/kiln/base/file.h"
#include "src/kiln/base/secret_scan.h"
#include "src/kiln/manifest/manifest.h"
#include "src/kiln/tensor/npy.h"
#include "tests/worker/worker_process.h"

namespace kiln {
namespace {

using namespace kiln::worker_testing;  // NOLINT: the process fixtures
using hub_testing::ValueOr;

constexpr int kMintWaitMs = 600000;
constexpr const char* kTokenEnv = "KILN_TEST_BROKER_HUB_TOKEN";

// A token nobody else has: 48 random hex digits.
std::string RandomToken() {
  std::random_device rd;
  std::string t = "tok-broker-";
  for (int i = 0; i < 48; ++i) t.push_back("0123456789abcdef"[rd() % 16]);
  return t;
}

// The scan reports `<file>.<role>.<pid>.json` of `role`.
std::vector<nlohmann::json> Reports(const std::string& file, const std::string& role) {
  std::vector<nlohmann::json> out;
  const std::filesystem::path p(file);
  const std::string prefix = p.filename().string() + "." + role + ".";
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(p.parent_path(), ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    out.push_back(
        nlohmann::json::parse(ValueOr(ReadFile(e.path().string()), std::string()), nullptr, false));
  }
  return out;
}

// The serving process's --manifest (the copy the broker wrote for it).
std::string ServingManifestPath(pid_t serving) {
  std::string cmd =
      ValueOr(ReadFile("/proc/" + std::to_string(serving) + "/cmdline"), std::string());
  std::vector<std::string> args;
  for (size_t at = 0; at < cmd.size();) {
    const size_t end = cmd.find('\0', at);
    args.push_back(cmd.substr(at, end - at));
    at = end == std::string::npos ? cmd.size() : end + 1;
  }
  for (size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i] == "--manifest") return args[i + 1];
  }
  return "";
}

using BrokerEndToEnd = MachinesTest;

TEST_F(BrokerEndToEnd, TheHubTokenIsInTheBrokerAndNotInTheServingProcessItsCellOrItsMintChild) {
  const std::string token = RandomToken();
  Hub hub(root_ + "/hub");
  // The platform publisher's rights (the minting worker publishes into root/mlp).
  hub.AddToken(
      {{"name", "broker-ci"}, {"role", "publisher"}, {"tier", "platform"}, {"releases", {"*"}}},
      token);
  ASSERT_TRUE(hub.Start());
  const std::string secret_file = root_ + "/scan/secret";
  ASSERT_TRUE(MakeDirs(root_ + "/scan").ok());
  // Line 2: a control the serving process does hold (in its environment, so in its memory too):
  // the cell's own scan must find it, or its "not found" for the token would mean nothing.
  const std::string control = RandomToken() + "-control";
  ASSERT_TRUE(
      WriteSecretFileAtomic(secret_file, Complement(token) + "\n" + Complement(control)).ok());

  ManifestOptions o;
  o.hub_url = hub.url();
  o.hub_token_env = kTokenEnv;
  const std::string dir = root_ + "/machine";
  Worker w(
      dir, worker_testing::Manifest(o),
      {{kTokenEnv, token}, {kTestSecretScanEnv, secret_file}, {"KILN_TEST_SCAN_CONTROL", control}});
  ASSERT_TRUE(w.Start());
  ASSERT_NE(w.ServingPid(), w.pid()) << "a worker with a hub token runs as two processes\n"
                                     << w.Log();
  ASSERT_TRUE(w.WaitForRow("boot_adopt", "miss", 10000));
  ASSERT_TRUE(w.WaitForRow("local_cell_armed", "armed", kMintWaitMs));
  ASSERT_TRUE(w.WaitForRow("self_mint_publish", "published", kMintWaitMs));
  auto x = ReadNpy(ExampleDir("mlp") + "inputs/x.npy");
  ASSERT_TRUE(x.ok());
  const auto a = w.Infer("mlp", {{"x", *x}});
  ASSERT_EQ(a.status, 200) << a.body.dump();
  ASSERT_EQ(a.mode(), "aot_cell") << a.body.dump();

  // The broker holds the token: in memory and in its environment. The scan finds what is there.
  const auto broker = Reports(secret_file, "broker");
  ASSERT_EQ(broker.size(), 1u) << w.Log();
  EXPECT_EQ(broker[0].value("pid", 0), w.pid());
  EXPECT_TRUE(broker[0].value("in_memory", false)) << broker[0].dump();
  EXPECT_TRUE(broker[0].value("in_environ", false)) << broker[0].dump();
  // The serving process, scanned where its cell's first call runs: neither, and its parent's
  // memory is closed to it.
  const auto serving = Reports(secret_file, "serving");
  ASSERT_EQ(serving.size(), 1u) << w.Log();
  const nlohmann::json& s = serving[0];
  EXPECT_EQ(s.value("pid", 0), w.ServingPid());
  EXPECT_FALSE(s.value("in_memory", true)) << s.dump();
  EXPECT_FALSE(s.value("in_environ", true)) << s.dump();
  EXPECT_FALSE(s.value("parent_memory_readable", true)) << s.dump();
  EXPECT_GT(s.value("regions", 0), 20) << s.dump();
  EXPECT_GT(s.value("bytes", uint64_t{0}), uint64_t{10} << 20) << s.dump();
  EXPECT_EQ(s.value("unreadable", -1), 0) << s.dump();
  // The cell itself, with its own generated code, at its first call in each process that ran
  // it (the mint child's gate and the serving process): the token neither in memory nor in the
  // environment; the control in both.
  const auto cells = Reports(secret_file, "cell");
  bool serving_cell = false;
  for (const nlohmann::json& c : cells) {
    serving_cell = serving_cell || c.value("pid", 0) == w.ServingPid();
    ASSERT_EQ(c.value("secrets", 0), 2) << c.dump();
    EXPECT_EQ(c["in_memory"], nlohmann::json::array({false, true})) << c.dump();
    EXPECT_EQ(c["in_environ"], nlohmann::json::array({false, true})) << c.dump();
    EXPECT_GT(c.value("regions", 0), 20) << c.dump();
    EXPECT_GT(c.value("bytes", uint64_t{0}), uint64_t{10} << 20) << c.dump();
    EXPECT_EQ(c.value("unreadable", -1), 0) << c.dump();
  }
  EXPECT_TRUE(serving_cell) << "no scan by the cell inside the serving process\n" << w.Log();
  // The mint child, after reading its manifest: neither.
  const auto mint = Reports(secret_file, "mint");
  ASSERT_GE(mint.size(), 1u) << w.Log();
  for (const auto& m : mint) {
    EXPECT_FALSE(m.value("in_memory", true)) << m.dump();
    EXPECT_FALSE(m.value("in_environ", true)) << m.dump();
  }

  // The hub heard the worker through the broker: the published cell resolves, and its event rows
  // arrived under the token's name.
  auto resolved = hub.Client(hub_testing::kWorker)
                      ->Call("GET", "/v1/cells/" + KeyOf(a.ref()) + "?family=root/mlp");
  ASSERT_TRUE(resolved.ok()) << resolved.token << ": " << resolved.message;
  EXPECT_TRUE(resolved.body.value("found", false)) << resolved.body.dump();

  // The relay: the serving process's copy of the manifest names it and the capability, never the
  // token; the mint children's copy names no credential at all.
  const std::string serving_manifest = ServingManifestPath(w.ServingPid());
  ASSERT_FALSE(serving_manifest.empty());
  const std::string serving_text = ValueOr(ReadFile(serving_manifest), std::string());
  EXPECT_EQ(serving_text.find(token), std::string::npos);
  EXPECT_EQ(serving_text.find(kTokenEnv), std::string::npos);
  const std::string broker_dir = std::filesystem::path(serving_manifest).parent_path().string();
  const std::string mint_text = ValueOr(ReadFile(broker_dir + "/mint.toml"), std::string());
  ASSERT_FALSE(mint_text.empty());
  EXPECT_EQ(mint_text.find("token"), std::string::npos) << mint_text;
  EXPECT_EQ(std::filesystem::status(broker_dir).permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_all);
  auto relay = ParseManifest(serving_text, serving_manifest, dir);
  ASSERT_TRUE(relay.ok()) << relay.status().ToString();
  ASSERT_TRUE(relay->hub.has_value());
  httplib::Client http(relay->hub->url);
  http.set_read_timeout(30, 0);
  // Without the capability: refused, whatever the route.
  auto r = http.Get("/v1/revocations");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  EXPECT_NE(r->body.find("broker_unauthenticated"), std::string::npos) << r->body;
  http.set_bearer_token_auth(relay->hub->token.c_str());
  // With it, a worker's route reaches the hub with the token ...
  r = http.Get("/v1/revocations");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  // ... and the routes no worker uses do not leave the broker.
  for (const auto& [method, path] :
       std::vector<std::pair<std::string, std::string>>{{"POST", "/v1/admin/revoke"},
                                                        {"POST", "/v1/admin/rotate-key"},
                                                        {"POST", "/v1/admin/tokens/revoke"},
                                                        {"GET", "/"},
                                                        {"GET", "/v1/events"}}) {
    auto f = method == "GET" ? http.Get(path.c_str())
                             : http.Post(path.c_str(), "{}", "application/json");
    ASSERT_TRUE(f) << path;
    EXPECT_EQ(f->status, 403) << method << " " << path << ": " << f->body;
    EXPECT_NE(f->body.find("broker_route_forbidden"), std::string::npos) << f->body;
  }

  // SIGTERM to the broker drains the serving process; the broker exits as it did, and takes its
  // copies of the manifest with it.
  const pid_t serving_pid = w.ServingPid();
  EXPECT_EQ(w.Stop(), 0) << w.Log();
  EXPECT_NE(w.Log().find("draining"), std::string::npos) << w.Log();
  EXPECT_FALSE(std::filesystem::exists(broker_dir));
  EXPECT_FALSE(std::filesystem::exists("/proc/" + std::to_string(serving_pid) + "/cmdline"));
}

// A worker without a hub token is one process, as before.
TEST_F(BrokerEndToEnd, AWorkerWithoutAHubTokenIsOneProcess) {
  Worker w(root_ + "/machine", worker_testing::Manifest(ManifestOptions{}));
  ASSERT_TRUE(w.Start());
  EXPECT_EQ(w.ServingPid(), w.pid());
  EXPECT_EQ(w.Stop(), 0);
}

}  // namespace
}  // namespace kiln
