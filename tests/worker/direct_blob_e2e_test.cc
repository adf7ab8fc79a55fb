// A worker adopting a cell from a hub whose blobs live on S3 (worker layer, e2e): real `kiln hub`
// with `--blobs s3://…` on the radosgw CTest starts (fixture s3_store), `kiln mint` + `kiln
// publish`, then `kiln worker`. The worker downloads the cell's blob with the resolve answer's
// presigned URL straight from the store (docs/fleet.md "Direct blob downloads"), checks it against
// the digest, and serves from the cell; the hub streams no blob byte.
#include <gtest/gtest.h>
#include <httplib.h>

#include <cstdlib>
#include <sstream>
#include <string>

#include "src/kiln/base/file.h"
#include "src/kiln/tensor/npy.h"
#include "tests/hub/s3_test_env.h"
#include "tests/worker/worker_process.h"

namespace kiln::worker_testing {
namespace {

// One sample of the hub's /metrics read with the admin token, or -1.
double HubMetric(const Hub& hub, const std::string& series) {
  httplib::Client http(hub.url());
  auto res =
      http.Get("/metrics", {{"Authorization", std::string("Bearer ") + hub_testing::kAdmin}});
  if (!res || res->status != 200) return -1;
  std::istringstream lines(res->body);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
  }
  return 0;
}

using DirectBlobWorker = MachinesTest;

TEST_F(DirectBlobWorker, BootFetchesTheCellFromTheStoreNotThroughTheHub) {
  KILN_REQUIRE_S3(env);
  for (const char* name :
       {"KILN_S3_ENDPOINT", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"}) {
    ::setenv(name, env->at(name).c_str(), 1);
  }
  Hub hub(root_ + "/hub");
  hub.process().AddArgs(
      {"--blobs", "s3://" + env->at("KILN_S3_BUCKET") + "/worker-direct-" + hub_testing::Nonce()});
  ASSERT_TRUE(hub.Start());
  std::string cell_ref;
  ASSERT_TRUE(hub.MintAndPublish(root_ + "/a", "mlp", &cell_ref));
  ASSERT_TRUE(hub.WriteJwks(root_ + "/jwks.json"));
  const double streamed = HubMetric(hub, "kiln_hub_blob_bytes_downloaded_total");
  ASSERT_GE(streamed, 0);

  ManifestOptions o;
  o.hub_url = hub.url();
  o.trust_path = root_ + "/jwks.json";
  Worker w(root_ + "/b", Manifest(o));
  ASSERT_TRUE(w.Start());
  ASSERT_TRUE(w.WaitReady(15000)) << w.Log();
  const std::string log = w.Log();
  EXPECT_NE(log.find("boot_adopt hit"), std::string::npos) << log;
  // The boot_adopt row says which way the bytes came.
  auto events = ReadFile(w.EventsPath());
  ASSERT_TRUE(events.ok());
  EXPECT_NE(events->find("blob_via=direct"), std::string::npos) << *events;
  EXPECT_EQ(HubMetric(hub, "kiln_hub_blob_bytes_downloaded_total"), streamed);

  auto x = ReadNpy(std::string(KILN_SOURCE_DIR) + "/examples/mlp/inputs/x.npy");
  ASSERT_TRUE(x.ok());
  const auto res = w.Infer("mlp", {{"x", *x}});
  ASSERT_EQ(res.status, 200) << (res.status == 0 ? "no answer" : res.body.dump());
  EXPECT_EQ(res.body["parameters"]["serving_mode"], "aot_cell") << res.body.dump();
}

}  // namespace
}  // namespace kiln::worker_testing
