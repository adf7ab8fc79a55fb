// The one-publish-per-key race (docs/fleet.md "One publish per key") shared by the end-to-end hub
// tests that run it on PostgreSQL and a radosgw bucket: hub_api_test against two hub processes
// directly, hub_replicas_test through HAProxy across three replicas. The caller starts the hubs
// with RacerTokens() among their tokens and says how publisher i reaches them; the race, the
// answers and the checks from outside (the test's own PostgreSQL connection, awscli) live here.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "src/kiln/base/file.h"
#include "src/kiln/base/sha256.h"
#include "src/kiln/cell/pack.h"
#include "src/kiln/client/hub_client.h"
#include "src/kiln/hub/store.h"
#include "tests/hub/hub_fixtures.h"
#include "tests/hub/hub_process.h"

namespace kiln::hub_testing {

// Publishers in the race, and the byte variants among them: the winner's twins end "already", the
// others key_taken.
inline constexpr int kRacers = 32;
inline constexpr int kRacerVariants = 4;

// Each racer its own token, so its own publisher name: the claim is held per publisher.
inline std::string RacerToken(int i) { return "tok-racer-" + std::to_string(i); }
inline std::vector<TokenRow> RacerTokens() {
  std::vector<TokenRow> rows;
  for (int i = 0; i < kRacers; ++i) {
    rows.push_back({Sha256Hex(RacerToken(i)),
                    "racer-" + std::to_string(i),
                    "publisher",
                    "platform",
                    "",
                    {"*"}});
  }
  return rows;
}

// Races kRacers publishers of one fresh (key, family) at once, racer i through client_for(i) (a
// client holding RacerToken(i)), then checks: the cell resolves through `resolver` (a worker's
// client); exactly one racer "published", its twins "already", every other racer key_taken with
// the winner's receipt; exactly one cell row for the key in the PostgreSQL database at `pg_url`;
// and exactly one object under `blobs` (s3://bucket/prefix), the winner's blob under sha256/, as
// awscli lists it (a hub's readiness probe object, written and deleted by GET /v1/ready, is not a
// cell's byte and is skipped). `scratch` is a directory for awscli's HOME and output.
inline void ExpectOnePublishPerKey(const std::function<std::unique_ptr<HubClient>(int)>& client_for,
                                   HubClient& resolver, const std::string& pg_url,
                                   const std::string& blobs, const std::string& scratch) {
  const CellMetadata m = MakeMetadata(Graph("one-publish"));
  std::vector<std::string> cells(kRacers);
  for (int i = 0; i < kRacers; ++i) {
    cells[i] = MakeCell(m, "variant " + std::to_string(i % kRacerVariants));
  }
  std::vector<PublishAnswer> answers(kRacers);
  std::vector<std::thread> threads;
  std::atomic<int> ready{0};
  for (int i = 0; i < kRacers; ++i) {
    threads.emplace_back([&, i] {
      auto client = client_for(i);
      ready++;
      while (ready.load() < kRacers) std::this_thread::yield();
      answers[i] = client->Publish(cells[i], {});
    });
  }
  for (auto& t : threads) t.join();

  ResolveAnswer owner = resolver.Resolve(m.key, m.family);
  ASSERT_EQ(owner.kind, ResolveAnswer::Kind::kFound) << owner.message;
  int published = 0, already = 0, taken = 0;
  for (int i = 0; i < kRacers; ++i) {
    const PublishAnswer& a = answers[i];
    if (a.ok()) {
      EXPECT_EQ(a.digest, owner.digest) << i;
      EXPECT_EQ(a.receipt, owner.receipt) << i;
      (a.already ? already : published)++;
    } else {
      EXPECT_EQ(a.token, "key_taken") << i << ": " << a.message;
      EXPECT_EQ(a.receipt, owner.receipt) << i;
      EXPECT_NE(CellDigest(cells[i]), owner.digest) << i;
      ++taken;
    }
  }
  EXPECT_EQ(published, 1);
  EXPECT_EQ(already, kRacers / kRacerVariants - 1);
  EXPECT_EQ(taken, kRacers - kRacers / kRacerVariants);
  // One row in the database, read by the test's own connection.
  auto store = OpenPostgresStore(pg_url, 1);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  auto rows = (*store)->ListCellsForKey(m.key);
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  ASSERT_EQ(rows->size(), 1u);
  EXPECT_EQ((*rows)[0].digest, owner.digest);
  // One object in the bucket, listed by awscli.
  const std::string listing = scratch + "/aws-ls.txt";
  const std::string cmd =
      "HOME='" + scratch +
      "' /usr/bin/aws --endpoint-url \"$KILN_S3_ENDPOINT\" s3 ls --recursive '" + blobs + "/' > '" +
      listing + "' 2>&1";
  const int rc = std::system(cmd.c_str());
  const std::string text = ValueOr(ReadFile(listing), std::string());
  ASSERT_EQ(rc, 0) << text;
  std::vector<std::string> objects;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty()) continue;
    const std::string object = line.substr(line.rfind(' ') + 1);
    if (object.find("/staging/ready-probe.") == std::string::npos) objects.push_back(object);
  }
  ASSERT_EQ(objects.size(), 1u) << text;
  EXPECT_NE(objects[0].find("/sha256/"), std::string::npos) << text;
  EXPECT_EQ(objects[0].substr(objects[0].rfind('/') + 1), owner.digest.substr(7)) << text;
}

}  // namespace kiln::hub_testing
