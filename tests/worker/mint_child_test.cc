// The mint child protocol's files (mint/protocol.h) and the publisher's retry rule
// (worker/publisher.h): round trips, and strict refusals that name the file and the field.
#include <gtest/gtest.h>

#include "src/kiln/mint/protocol.h"
#include "src/kiln/worker/publisher.h"

namespace kiln {
namespace {

MintChildRequest SampleRequest() {
  MintChildRequest r;
  r.manifest = "/m/kiln.toml";
  r.target = "denoiser";
  r.out_dir = "/tmp/x";
  r.report = "/tmp/x/report.json";
  r.phases = "/tmp/x/phases.json";
  r.threads = 2;
  r.parallel_compiles = 3;
  r.attempt = 2;
  return r;
}

TEST(MintChildProtocol, RequestRoundTrips) {
  auto back = ParseMintChildRequest(ToJson(SampleRequest()).dump(), "request.json");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->manifest, "/m/kiln.toml");
  EXPECT_EQ(back->target, "denoiser");
  EXPECT_FALSE(back->intake);
  EXPECT_EQ(back->threads, 2);
  EXPECT_EQ(back->parallel_compiles, 3);
  EXPECT_EQ(back->attempt, 2);
  EXPECT_EQ(back->manifest_base_dir, "");
  MintChildRequest elsewhere = SampleRequest();
  elsewhere.manifest_base_dir = "/srv/models";
  back = ParseMintChildRequest(ToJson(elsewhere).dump(), "request.json");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->manifest_base_dir, "/srv/models");
}

TEST(MintChildProtocol, RequestRefusalsNameTheField) {
  nlohmann::json j = ToJson(SampleRequest());
  j.erase("target");
  auto missing = ParseMintChildRequest(j.dump(), "request.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("request.json: field 'target' is missing"),
            std::string::npos)
      << missing.status().ToString();
  j = ToJson(SampleRequest());
  j["threads"] = "two";
  auto typed = ParseMintChildRequest(j.dump(), "request.json");
  ASSERT_FALSE(typed.ok());
  EXPECT_NE(typed.status().message().find("'threads' has the wrong type"), std::string::npos);
  j = ToJson(SampleRequest());
  j["attempt"] = 0;
  EXPECT_FALSE(ParseMintChildRequest(j.dump(), "request.json").ok());
  EXPECT_FALSE(ParseMintChildRequest("[1,2]", "request.json").ok());
  EXPECT_FALSE(ParseMintChildRequest("{not json", "request.json").ok());
}

TEST(MintChildProtocol, ReportRoundTripsAndRefusesUnknownStatus) {
  MintChildReport r;
  r.status = "minted";
  r.artifact = "/tmp/x/cell.tar";
  r.key = "ck1-abc";
  r.digest = "sha256:00";
  r.axes = {"g", "e", "x86-64-v3", "t"};
  r.family = "root/mlp";
  r.lane = "exported";
  r.phases = {{"compile", 12.5}, {"build", 800}};
  r.peak_rss_kb = 4096;
  auto back = ParseMintChildReport(ToJson(r).dump(), "report.json");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->axes.sm, "x86-64-v3");
  EXPECT_EQ(back->axes.toolchain, "t");
  ASSERT_EQ(back->phases.size(), 2u);
  EXPECT_EQ(back->phases[1].phase, "build");
  EXPECT_DOUBLE_EQ(back->phases[1].ms, 800);
  EXPECT_EQ(back->peak_rss_kb, 4096);
  nlohmann::json j = ToJson(r);
  j["status"] = "maybe";
  auto bad = ParseMintChildReport(j.dump(), "report.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("unknown status 'maybe'"), std::string::npos);
  j = ToJson(r);
  j["axes"].erase("sm");
  EXPECT_FALSE(ParseMintChildReport(j.dump(), "report.json").ok());
}

TEST(MintChildProtocol, FrameLineIsPrefixedJson) {
  const std::string line = MintFrameLine("build", 3, 7, "mlp");
  ASSERT_EQ(line.rfind(kMintFramePrefix, 0), 0u);
  auto j = nlohmann::json::parse(line.substr(std::string(kMintFramePrefix).size()));
  EXPECT_EQ(j["phase"], "build");
  EXPECT_EQ(j["step"], 3);
  EXPECT_EQ(j["total"], 7);
  EXPECT_EQ(j["note"], "mlp");
}

TEST(Publisher, RetriesTransportFailuresOnlyAndTypedRefusalsAreTerminal) {
  EXPECT_TRUE(IsTransientHubFailure("hub_unreachable", 0));
  EXPECT_TRUE(IsTransientHubFailure("hub_timeout", 0));
  EXPECT_TRUE(IsTransientHubFailure("internal", 503));
  // Another publisher's claim on the key outlived the client's wait: later, the key is settled.
  EXPECT_TRUE(IsTransientHubFailure(kHubPublishInProgress, 409));
  EXPECT_FALSE(IsTransientHubFailure("forbidden", 403));
  EXPECT_FALSE(IsTransientHubFailure("key_taken", 409));
  EXPECT_FALSE(IsTransientHubFailure("unauthenticated", 401));
  EXPECT_FALSE(IsTransientHubFailure("bad_cell", 0));
}

}  // namespace
}  // namespace kiln
