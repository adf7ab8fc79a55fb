// The worker's minting half end to end, with real processes on loopback: `kiln hub`, `kiln
// worker` processes, each with its own cache directory (one "machine" each), and the `kiln mint
// --child` processes the workers start. Every test asserts the worker's exact event
// rows (kind/phase, in seq order) from the JSON-lines file it writes.
//
// Test-only switches the mint child honours (mint/child.cc; all start with KILN_TEST_, so none
// is set by accident, and nothing in kiln sets them). They reach the child through the worker's
// environment:
//   KILN_TEST_MINT_STALL_S=N        sleep N s as the compile stage starts (no CPU, no writes)
//   KILN_TEST_MINT_BUSY_S=N         spin the CPU N s there, writing nothing (slow but alive)
//   KILN_TEST_MINT_PERTURB=gray     outputs scaled by 1.002, the child's own gate loosened to
//                                   retention 0.99, so only the parent's strict gate refuses it
//   KILN_TEST_MINT_RESOURCE_ONCE=1  exit 3 (resource) on the first attempt
//
// The examples/mlp model keeps each mint near a second on 2 cores. Under ASan the mint child is
// an instrumented `kiln` too and runs several times slower; every wait below is generous
// (60-120 s) rather than tuned, so the file still passes there, only slower.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "src/kiln/cell/store.h"
#include "src/kiln/receipt/receipt.h"
#include "src/kiln/tensor/npy.h"
#include "tests/worker/worker_process.h"

namespace kiln {
namespace {

using namespace kiln::worker_testing;  // NOLINT: the process fixtures

constexpr int kMintWaitMs = 120000;

const std::vector<std::string> kServeRows = {"serve_eager_posture"};

std::map<std::string, Tensor> MlpInput() {
  auto x = ReadNpy(ExampleDir("mlp") + "inputs/x.npy");
  return {{"x", x.ok() ? *x : Tensor()}};
}

ManifestOptions Extra(const std::string& toml) {
  ManifestOptions o;
  o.extra = toml;
  return o;
}

// A [hub] section for `hub` holding the platform publisher's token (the minting workers publish
// with it), and `extra` TOML.
ManifestOptions Publishing(const Hub& hub, const std::string& extra = "") {
  ManifestOptions o = Extra(extra);
  o.hub_url = hub.url();
  o.hub_token = hub_testing::kPlatform;
  return o;
}

// The mlp example's manifest with its envelope cut to the one class the tests send ([4, 64]):
// a third of the compile, which keeps four children on two cores (and ASan) quick.
std::string OneClassMlp(const ManifestOptions& o = {}) {
  std::string text = Manifest(o);
  const std::string more = "  { x = [1, 64] },\n  { x = [4, 64] },\n  { x = [16, 64] },\n";
  const size_t at = text.find(more);
  if (at != std::string::npos) text.replace(at, more.size(), "  { x = [4, 64] },\n");
  return text;
}

using MintEndToEnd = MachinesTest;

// Miss -> the first response eager (at once, not after the mint) -> child mint -> strict gate ->
// aot_cell on later requests of the same worker, with no request failing during the switch; a
// twin target of the same key shares the one mint; the cell is published, and a second worker
// boots with boot_adopt hit and serves its first request from the cell.
TEST_F(MintEndToEnd, MissServesEagerMintsInAChildAdoptsPublishesAndASecondWorkerAdopts) {
  Hub hub(root_ + "/hub");
  ASSERT_TRUE(hub.Start());
  // Two targets with the same graph and envelope: one key, one mint.
  const std::string twin = "[targets.mlp_twin]\ngraph = \"" + std::string(KILN_SOURCE_DIR) +
                           "/examples/mlp/model.onnx\"\nexport = { family = \"root/mlp\" }\n"
                           "envelope = [ { x = [1, 64] }, { x = [4, 64] }, { x = [16, 64] } ]\n"
                           "[functions.mlp_twin]\ntarget = \"mlp_twin\"\n";
  Worker a(root_ + "/a", Manifest(Publishing(hub, twin)));
  ASSERT_TRUE(a.Start());
  const auto x = MlpInput();

  // Requests run back to back from the moment the worker is up until the cell answers.
  std::vector<Worker::Answer> answers;
  for (int i = 0; i < 100000; ++i) {
    answers.push_back(a.Infer("mlp", x));
    if (answers.back().mode() == "aot_cell" || answers.back().status != 200) break;
  }
  ASSERT_FALSE(answers.empty());
  for (const auto& r : answers) ASSERT_EQ(r.status, 200) << r.body.dump() << a.Log();
  EXPECT_EQ(answers.front().mode(), "eager");
  EXPECT_EQ(answers.front().reason(), "mint_in_progress") << answers.front().body.dump();
  ASSERT_EQ(answers.back().mode(), "aot_cell") << answers.back().body.dump() << a.Log();
  const std::string ref = answers.back().ref();
  const std::string key = KeyOf(ref);
  for (size_t i = 0; i + 1 < answers.size(); ++i) {
    EXPECT_EQ(answers[i].mode(), "eager");  // the wire never says aot_cell for an eager run
  }
  // The twin was armed from the same bytes.
  const auto t = a.Infer("mlp_twin", x);
  EXPECT_EQ(t.mode(), "aot_cell") << t.body.dump();
  EXPECT_EQ(t.ref(), ref);

  Row phases;
  ASSERT_TRUE(a.WaitForRow("self_mint_publish", "", kMintWaitMs));
  ASSERT_TRUE(a.WaitForRow("mint_phases", "minted", 0, &phases));
  // Readiness did not wait for the mint: the first eager answer came back well inside it.
  EXPECT_LT(answers.front().ms, phases.duration_ms) << phases.detail;
  EXPECT_TRUE(DetailNames(phases, "compile="));

  EXPECT_EQ(a.RowsWithout(kServeRows), Expect({{"boot_adopt", "miss"},
                                               {"self_mint_started", "child"},
                                               {"boot_adopt", "miss"},
                                               {"self_mint_started", "joined"},
                                               {"cell_numerics", "HEALTHY"},
                                               {"cell_numerics", "HEALTHY"},
                                               {"local_cell_stored", "stored"},
                                               {"serve_posture", "aot_cell"},
                                               {"local_cell_armed", "armed"},
                                               {"serve_posture", "aot_cell"},
                                               {"local_cell_armed", "armed"},
                                               {"mint_phases", "minted"},
                                               {"self_mint_publish", "published"}}));
  // Exactly one eager posture row per target that was asked while the mint ran.
  int posture_rows = 0;
  for (const Row& r : a.Rows()) {
    if (r.kind == "serve_eager_posture") {
      EXPECT_EQ(r.phase, "mint_in_progress");
      ++posture_rows;
    }
  }
  EXPECT_EQ(posture_rows, 1);
  EXPECT_EQ(hub.CellRows(key), 1);

  // Machine B: an empty cache, the same manifest; it adopts at boot (the first target from the
  // hub, keeping the bytes in its local store, where the twin then finds them).
  Worker b(root_ + "/b", Manifest(Publishing(hub, twin)));
  ASSERT_TRUE(b.Start());
  const auto first = b.Infer("mlp", x);
  EXPECT_EQ(first.mode(), "aot_cell") << first.body.dump();
  EXPECT_EQ(first.ref(), ref);
  EXPECT_EQ(b.Rows(), Expect({{"serve_posture", "aot_cell"},
                              {"boot_adopt", "hit"},
                              {"serve_posture", "aot_cell"},
                              {"boot_adopt", "local_hit"}}));
  EXPECT_EQ(a.Stop(), 0);
  EXPECT_EQ(b.Stop(), 0);
}

// A child SIGKILLed mid-mint: the worker keeps serving eager, self_mint_abort child_crashed, and
// the key is not minted again in this process.
TEST_F(MintEndToEnd, ChildKilledMidMintLeavesTheWorkerServing) {
  Worker w(root_ + "/w", OneClassMlp(), {{"KILN_TEST_MINT_STALL_S", "60"}});
  ASSERT_TRUE(w.Start());
  std::vector<pid_t> children;
  for (int i = 0; i < 600 && children.empty(); ++i) {
    children = w.MintChildren();
    if (children.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(children.size(), 1u) << w.Log();
  const auto before = w.Infer("mlp", MlpInput());
  EXPECT_EQ(before.status, 200);
  EXPECT_EQ(before.reason(), "mint_in_progress") << before.body.dump();
  ASSERT_EQ(::kill(children[0], SIGKILL), 0);
  Row abort;
  ASSERT_TRUE(w.WaitForRow("self_mint_abort", "", kMintWaitMs, &abort));
  EXPECT_TRUE(DetailNames(abort, "signal=9"));
  const auto after = w.Infer("mlp", MlpInput());
  EXPECT_EQ(after.status, 200) << after.body.dump();
  EXPECT_EQ(after.mode(), "eager");
  EXPECT_EQ(after.reason(), "child_crashed") << after.body.dump();
  EXPECT_EQ(w.Rows(), Expect({{"boot_adopt", "local_miss_no_hub"},
                              {"self_mint_started", "child"},
                              {"serve_eager_posture", "mint_in_progress"},
                              {"self_mint_abort", "child_crashed"},
                              {"serve_eager_posture", "child_crashed"}}));
  EXPECT_EQ(w.Stop(), 0);
}

// The watchdog: a child with no CPU or disk progress for the stall window is killed and reaped;
// a child that computes for longer than the window, writing nothing, is left to finish.
TEST_F(MintEndToEnd, StalledChildIsReapedSlowBusyChildIsNot) {
  const std::string mint = "[mint]\nstall_window_s = 2\n";
  Worker stalled(root_ + "/stalled", OneClassMlp(Extra(mint)), {{"KILN_TEST_MINT_STALL_S", "60"}});
  Worker busy(root_ + "/busy", OneClassMlp(Extra(mint)), {{"KILN_TEST_MINT_BUSY_S", "5"}});
  ASSERT_TRUE(stalled.Start());
  ASSERT_TRUE(busy.Start());
  Row abort;
  ASSERT_TRUE(stalled.WaitForRow("self_mint_abort", "", kMintWaitMs, &abort));
  EXPECT_TRUE(DetailNames(abort, "no CPU or disk progress"));
  EXPECT_TRUE(stalled.MintChildren().empty()) << "the stalled child was not reaped";
  ASSERT_TRUE(busy.WaitForRow("mint_phases", "", kMintWaitMs));
  EXPECT_EQ(busy.Infer("mlp", MlpInput()).mode(), "aot_cell");
  EXPECT_EQ(stalled.Infer("mlp", MlpInput()).mode(), "eager");
  EXPECT_EQ(stalled.Rows(), Expect({{"boot_adopt", "local_miss_no_hub"},
                                    {"self_mint_started", "child"},
                                    {"self_mint_abort", "child_stalled"},
                                    {"serve_eager_posture", "child_stalled"}}));
  EXPECT_EQ(busy.Rows(), MissThenMinted("local_miss_no_hub"));
  EXPECT_EQ(stalled.Stop(), 0);
  EXPECT_EQ(busy.Stop(), 0);
}

// A cell perturbed into the gray band (DEGRADED: retention 1.002 against 0.999) by a child whose
// own gate was too lax is refused by the parent's strict gate: bytes deleted, nothing stored or
// published, the worker serves eager. A resource exit is retried once.
TEST_F(MintEndToEnd, GrayBandCellIsRefusedAndNothingIsPublished) {
  Hub hub(root_ + "/hub");
  ASSERT_TRUE(hub.Start());
  Worker w(root_ + "/w", OneClassMlp(Publishing(hub)),
           {{"KILN_TEST_MINT_PERTURB", "gray"}, {"KILN_TEST_MINT_RESOURCE_ONCE", "1"}});
  ASSERT_TRUE(w.Start());
  Row abort;
  ASSERT_TRUE(w.WaitForRow("self_mint_abort", "", kMintWaitMs, &abort));
  EXPECT_TRUE(DetailNames(abort, "attempts=2"));
  EXPECT_TRUE(DetailNames(abort, "by=parent"));
  const auto r = w.Infer("mlp", MlpInput());
  EXPECT_EQ(r.mode(), "eager");
  EXPECT_EQ(r.reason(), "numerics_refused") << r.body.dump();
  EXPECT_EQ(w.Rows(), Expect({{"boot_adopt", "miss"},
                              {"self_mint_started", "child"},
                              {"cell_numerics", "DEGRADED"},
                              {"self_mint_abort", "numerics_refused"},
                              {"serve_eager_posture", "numerics_refused"}}));
  // Nothing kept, nothing published.
  EXPECT_TRUE(LocalStore(root_ + "/w/cells").Keys().empty());
  const std::string key = abort.detail.substr(4, abort.detail.find(' ') - 4);
  EXPECT_EQ(hub.Client(hub_testing::kWorker)->Resolve(key, "root/mlp").kind,
            ResolveAnswer::Kind::kMiss);
  EXPECT_EQ(w.Stop(), 0);
}

// The hub goes down after boot, before the publish: the cell serves and stays in the local
// store, the publish retries with backoff, and lands once the hub is back on its port.
TEST_F(MintEndToEnd, HubDownDuringPublishPublishesAfterTheHubReturns) {
  Hub hub(root_ + "/hub");
  ASSERT_TRUE(hub.Start());
  // The busy switch holds the mint a second past boot, so the hub is surely down at publish.
  Worker w(root_ + "/w", OneClassMlp(Publishing(hub)), {{"KILN_TEST_MINT_BUSY_S", "1"}});
  ASSERT_TRUE(w.Start());
  ASSERT_TRUE(w.WaitForRow("boot_adopt", "miss", 0));
  hub.Stop(SIGKILL);  // down hard, as a crashed or partitioned hub is
  ASSERT_TRUE(w.WaitForRow("self_mint_publish_failed", "hub_unreachable", kMintWaitMs));
  EXPECT_EQ(w.Infer("mlp", MlpInput()).mode(), "aot_cell");
  ASSERT_TRUE(hub.Start());
  Row published;
  ASSERT_TRUE(w.WaitForRow("self_mint_publish", "published", kMintWaitMs, &published));
  EXPECT_EQ(w.RowsWithout(kServeRows),
            MissThenMinted("miss", {{"self_mint_publish_failed", "hub_unreachable"},
                                    {"self_mint_publish", "published"}}));
  const auto r = w.Infer("mlp", MlpInput());
  EXPECT_EQ(hub.Client(hub_testing::kWorker)->Resolve(KeyOf(r.ref()), "root/mlp").kind,
            ResolveAnswer::Kind::kFound);
  EXPECT_EQ(w.Stop(), 0);
}

// The publish note a worker keeps beside the cell `key` in the local store under `dir`
// (null when there is none).
nlohmann::json PublishNote(const std::string& dir, const std::string& key) {
  LocalStore store(dir + "/cells");
  auto note = store.GetNote(key, "publish");
  if (!note.ok() || !note->has_value()) return nullptr;
  return nlohmann::json::parse(**note, nullptr, /*allow_exceptions=*/false);
}

// `w`, booted on a store holding the unpublished cell `key`, offers it again: one resumed
// publish row, and the hub answers the key.
void ExpectResumedPublish(Worker& w, const Hub& hub, const std::string& key) {
  Row published;
  ASSERT_TRUE(w.WaitForRow("self_mint_publish", "published", kMintWaitMs, &published)) << w.Log();
  EXPECT_TRUE(DetailNames(published, "resumed=1"));
  EXPECT_EQ(hub.Client(hub_testing::kWorker)->Resolve(key, "root/mlp").kind,
            ResolveAnswer::Kind::kFound);
}

// A publish the process did not live to finish is completed by the next boot: the hub is down
// while the publish retries, the worker is SIGKILLed (its note says `pending`), the hub comes back
// and the restarted worker, adopting its own cell from the local store, offers it again.
TEST_F(MintEndToEnd, PublishInterruptedByKillIsCompletedAfterRestart) {
  Hub hub(root_ + "/hub");
  ASSERT_TRUE(hub.Start());
  std::string key;
  {
    Worker w(root_ + "/w", OneClassMlp(Publishing(hub)), {{"KILN_TEST_MINT_BUSY_S", "1"}});
    ASSERT_TRUE(w.Start());
    ASSERT_TRUE(w.WaitForRow("boot_adopt", "miss", 0));
    hub.Stop(SIGKILL);
    ASSERT_TRUE(w.WaitForRow("self_mint_publish_failed", "hub_unreachable", kMintWaitMs));
    const auto r = w.Infer("mlp", MlpInput());
    ASSERT_EQ(r.mode(), "aot_cell") << r.body.dump();
    key = KeyOf(r.ref());
    EXPECT_EQ(PublishNote(root_ + "/w", key)["state"], "pending");
  }  // SIGKILL: the publish dies with the process
  ASSERT_TRUE(hub.Start());
  ASSERT_EQ(hub.Client(hub_testing::kWorker)->Resolve(key, "root/mlp").kind,
            ResolveAnswer::Kind::kMiss);
  Worker again(root_ + "/w", OneClassMlp(Publishing(hub)));
  ASSERT_TRUE(again.Start());
  ExpectResumedPublish(again, hub, key);
  EXPECT_EQ(PublishNote(root_ + "/w", key)["state"], "published");
  EXPECT_EQ(again.Stop(), 0);
  // Published is the end: a third boot offers nothing (the log is appended to across boots, and
  // only the second said it offered).
  Worker third(root_ + "/w", OneClassMlp(Publishing(hub)));
  ASSERT_TRUE(third.Start());
  const std::string log = third.Log();
  const size_t first = log.find("offering 1 cell(s)");
  ASSERT_NE(first, std::string::npos) << log;
  EXPECT_EQ(log.find("offering", first + 1), std::string::npos) << log;
  EXPECT_EQ(third.Stop(), 0);
}

// A terminal refusal is not the cell's end either: refused with a token that may not publish
// the family, the cell is offered again by the next boot, which holds one that may.
TEST_F(MintEndToEnd, RefusedPublishIsOfferedAgainAtTheNextBoot) {
  Hub hub(root_ + "/hub");
  ASSERT_TRUE(hub.Start());
  std::string key;
  {
    ManifestOptions tenant = Publishing(hub);
    tenant.hub_token = hub_testing::kAcmeFleet;  // acme's worker: root/mlp is not its family
    Worker w(root_ + "/w", OneClassMlp(tenant));
    ASSERT_TRUE(w.Start());
    Row refused;
    ASSERT_TRUE(w.WaitForRow("self_mint_publish_failed", "", kMintWaitMs, &refused)) << w.Log();
    EXPECT_TRUE(DetailNames(refused, "terminal"));
    const auto r = w.Infer("mlp", MlpInput());
    ASSERT_EQ(r.mode(), "aot_cell") << r.body.dump();
    key = KeyOf(r.ref());
    const nlohmann::json note = PublishNote(root_ + "/w", key);
    EXPECT_EQ(note["state"], "refused") << note.dump();
    EXPECT_EQ(note["token"], refused.phase) << note.dump();
    EXPECT_EQ(w.Stop(), 0);
  }
  EXPECT_EQ(hub.Client(hub_testing::kWorker)->Resolve(key, "root/mlp").kind,
            ResolveAnswer::Kind::kMiss);
  Worker again(root_ + "/w", OneClassMlp(Publishing(hub)));
  ASSERT_TRUE(again.Start());
  ExpectResumedPublish(again, hub, key);
  EXPECT_EQ(again.Stop(), 0);
}

// The local store keeps its bound: three cells of the mlp (three envelopes, three keys) are in
// the store; a worker armed with one of them, bounded to that cell and one more, evicts the least
// recently adopted of the other two, says so in a row, and keeps the one it serves.
TEST_F(MintEndToEnd, LocalStoreEvictsTheLeastRecentlyAdoptedNeverTheArmedCell) {
  const std::string dir = root_ + "/w";
  ASSERT_TRUE(MakeDirs(dir).ok());
  auto variant = [&](const std::string& classes) {
    std::string text = Manifest(ManifestOptions{});
    const std::string more = "  { x = [1, 64] },\n  { x = [4, 64] },\n  { x = [16, 64] },\n";
    const size_t at = text.find(more);
    if (at != std::string::npos) text.replace(at, more.size(), classes);
    return text;
  };
  const std::string served = variant("  { x = [4, 64] },\n");
  const std::vector<std::string> others = {variant("  { x = [1, 64] },\n"),
                                           variant("  { x = [16, 64] },\n")};
  auto mint = [&](const std::string& text, const std::string& name) {
    EXPECT_TRUE(WriteFileAtomic(root_ + "/" + name + ".toml", text).ok());
    auto r = Kiln(dir, "mint --manifest " + root_ + "/" + name + ".toml");
    EXPECT_EQ(r.first, 0) << r.second;
    return KeyOf(r.second.substr(0, r.second.find_first_of(" \n\t")));
  };
  const std::string older = mint(others[0], "older");
  const std::string newer = mint(others[1], "newer");
  const std::string armed = mint(served, "served");
  ASSERT_TRUE(older != newer && newer != armed && older != armed);
  LocalStore store(dir + "/cells");
  ASSERT_TRUE(store.Touch(older).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_TRUE(store.Touch(newer).ok());
  auto entry_bytes = [&](const std::string& key) {
    uint64_t n = 0;
    for (const auto& f : std::filesystem::directory_iterator(dir + "/cells/" + key)) {
      n += f.file_size();
    }
    return n;
  };
  // Room for the served cell and one other (the adoption note adds a few bytes: 1 KiB slack).
  const double bound_mb =
      static_cast<double>(entry_bytes(armed) + std::max(entry_bytes(older), entry_bytes(newer)) +
                          1024) /
      1048576.0;
  Worker w(dir, served, {}, {"--store-max-mb", std::to_string(bound_mb)});
  ASSERT_TRUE(w.Start());
  EXPECT_EQ(w.Infer("mlp", MlpInput()).mode(), "aot_cell");
  Row evicted;
  ASSERT_TRUE(w.WaitForRow("local_cell_evicted", "evicted", 10000, &evicted)) << w.Log();
  EXPECT_TRUE(DetailNames(evicted, "key=" + older));
  const std::vector<std::string> left = store.Keys();
  EXPECT_EQ(left, (std::vector<std::string>{std::min(armed, newer), std::max(armed, newer)}));
  int evictions = 0;
  for (const Row& r : w.Rows()) evictions += r.kind == "local_cell_evicted";
  EXPECT_EQ(evictions, 1);
  EXPECT_EQ(w.Stop(), 0);

  // Bounded below the served cell alone: everything else goes, the served cell never does.
  Worker tight(dir, served, {}, {"--store-max-mb", "0.000001"});
  ASSERT_TRUE(tight.Start());
  EXPECT_EQ(tight.Infer("mlp", MlpInput()).mode(), "aot_cell");
  EXPECT_EQ(store.Keys(), std::vector<std::string>{armed});
  EXPECT_EQ(tight.Stop(), 0);
}

// One hub attests the cells of two toolchains (g++ and clang, as two OS images of one fleet
// would mint them): each publish is rebuilt by the builder of its own compiler and named so in
// the receipt; a third toolchain (a compiler binary the hub has no builder for) is refused by
// name, and so is clang's cell on a hub that builds only its own compiler.
TEST_F(MintEndToEnd, TwoToolchainsPublishOnOneHubAndAThirdIsRefusedByName) {
  if (::access("/usr/bin/clang++-14", X_OK) != 0) GTEST_SKIP() << "no clang++-14 here";
  // The third compiler: g++ behind a script, so a toolchain of its own (another binary digest).
  const std::string third = root_ + "/bin/cxx-wrapped";
  ASSERT_TRUE(MakeDirs(root_ + "/bin").ok());
  ASSERT_TRUE(WriteFileAtomic(third, "#!/bin/sh\nexec g++ \"$@\"\n").ok());
  ASSERT_EQ(::chmod(third.c_str(), 0755), 0);
  Hub hub(root_ + "/hub", {"--builder-toolchain", "clang++-14"});
  ASSERT_TRUE(hub.Start());
  // `kiln <args>` on the machine `cache` with KILN_CXX=`cxx` ("" = the default compiler).
  auto run = [&](const std::string& cache, const std::string& cxx, const std::string& args) {
    const std::string cmd = "KILN_CACHE_DIR=" + cache + (cxx.empty() ? "" : " KILN_CXX=" + cxx) +
                            " " + Binary() + " " + args + " 2>&1";
    std::string out;
    FILE* p = ::popen(cmd.c_str(), "r");
    char buf[4096];
    size_t n;
    while (p != nullptr && (n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
    const int st = p != nullptr ? ::pclose(p) : -1;
    return std::make_pair(WIFEXITED(st) ? WEXITSTATUS(st) : -1, out);
  };
  // Mints the mlp with `cxx` on its own machine and publishes it: (key, publish exit, output).
  auto mint_publish = [&](const std::string& machine, const std::string& cxx, const Hub& to) {
    const std::string cache = root_ + "/" + machine;
    auto mint = run(cache, cxx, "mint --manifest " + ExampleDir("mlp") + "kiln.toml");
    EXPECT_EQ(mint.first, 0) << mint.second;
    const std::string key = KeyOf(mint.second.substr(0, mint.second.find_first_of(" \n\t")));
    auto pub = run(cache, cxx,
                   "publish " + cache + "/cells/" + key + "/cell.tar --hub " + to.url() +
                       " --token " + hub_testing::kPlatform);
    return std::make_tuple(key, pub.first, pub.second);
  };
  auto builder_of = [&](const std::string& key) {
    auto r = hub.Client(hub_testing::kWorker)->Resolve(key, "root/mlp");
    if (r.kind != ResolveAnswer::Kind::kFound) return std::string("(not found)");
    // The receipt is a JWS: its claims are the base64url JSON between the two dots.
    const size_t a = r.receipt.find('.'), b = r.receipt.rfind('.');
    auto payload = Base64UrlDecode(r.receipt.substr(a + 1, b - a - 1), "receipt");
    if (a == std::string::npos || a == b || !payload.ok()) return std::string("(bad receipt)");
    return nlohmann::json::parse(*payload, nullptr, false).value("builder", std::string("(none)"));
  };
  const auto [gcc_key, gcc_rc, gcc_out] = mint_publish("gcc", "", hub);
  EXPECT_EQ(gcc_rc, 0) << gcc_out;
  const auto [clang_key, clang_rc, clang_out] = mint_publish("clang", "clang++-14", hub);
  EXPECT_EQ(clang_rc, 0) << clang_out;
  EXPECT_NE(gcc_key, clang_key);  // the toolchain is a key axis
  const std::string gcc_builder = builder_of(gcc_key), clang_builder = builder_of(clang_key);
  EXPECT_EQ(gcc_builder.rfind("hub@", 0), 0u) << gcc_builder;
  EXPECT_EQ(clang_builder, gcc_builder + "/clang++-14");
  // The third toolchain: refused by name, nothing stored.
  const auto [third_key, third_rc, third_out] = mint_publish("third", third, hub);
  EXPECT_EQ(third_rc, 1) << third_out;
  EXPECT_NE(third_out.find("rebuild_unavailable"), std::string::npos) << third_out;
  EXPECT_NE(third_out.find("no builder on this hub for the toolchain"), std::string::npos)
      << third_out;
  EXPECT_NE(third_out.find("clang version 14"), std::string::npos) << third_out;
  EXPECT_EQ(builder_of(third_key), "(not found)");
  // A hub with only its own builder refuses clang's cell, by name too.
  Hub lone(root_ + "/lone");
  ASSERT_TRUE(lone.Start());
  auto again = run(root_ + "/clang", "clang++-14",
                   "publish " + root_ + "/clang/cells/" + clang_key + "/cell.tar --hub " +
                       lone.url() + " --token " + hub_testing::kPlatform);
  EXPECT_EQ(again.first, 1) << again.second;
  EXPECT_NE(again.second.find("rebuild_unavailable"), std::string::npos) << again.second;
}

// Intake lane: no export declaration -> compiled here at boot, served jit_cell with an empty
// served_cell_ref, one jit_compile row; nothing keyed, stored or published. A mandatory target
// with no export declaration fails the boot; a mint over the memory budget is skipped.
TEST_F(MintEndToEnd, IntakeServesJitCellAndTheHubReceivesNothing) {
  Hub hub(root_ + "/hub");
  ASSERT_TRUE(hub.Start());
  std::string manifest = OneClassMlp(Publishing(hub));
  const std::string declared = "export = { family = \"root/mlp\" }\n";
  manifest.erase(manifest.find(declared), declared.size());
  Worker w(root_ + "/w", manifest);
  ASSERT_TRUE(w.Start());
  Row jit;
  ASSERT_TRUE(w.WaitForRow("jit_compile", "", kMintWaitMs, &jit));
  EXPECT_EQ(jit.phase, "compiled") << jit.detail;
  EXPECT_GT(jit.duration_ms, 0);
  const auto r = w.Infer("mlp", MlpInput());
  EXPECT_EQ(r.mode(), "jit_cell") << r.body.dump();
  EXPECT_EQ(r.ref(), "");
  EXPECT_EQ(w.RowsWithout(kServeRows), Expect({{"boot_adopt", "no_export_declaration"},
                                               {"serve_posture", "jit_cell"},
                                               {"jit_compile", "compiled"}}));
  EXPECT_TRUE(LocalStore(root_ + "/w/cells").Keys().empty());
  EXPECT_EQ(hub.CellRows(""), 0) << "the hub holds a cell";
  EXPECT_EQ(w.Stop(), 0);

  // Mandatory without an export declaration: the boot fails, by name.
  std::string mandatory = manifest;
  mandatory.replace(mandatory.find("lane = \"optional\""), 17, "lane = \"mandatory\"");
  Worker m(root_ + "/m", mandatory);
  EXPECT_FALSE(m.Start());
  EXPECT_NE(m.Log().find("mandatory_lane_needs_a_cell"), std::string::npos) << m.Log();

  // A mint that does not fit the memory budget is skipped before any child starts.
  Worker small(root_ + "/small", OneClassMlp(Extra("[mint]\nmemory_budget_mb = 1\n")));
  ASSERT_TRUE(small.Start());
  ASSERT_TRUE(small.WaitForRow("self_mint_skipped", "", 10000));
  EXPECT_TRUE(small.MintChildren().empty());
  EXPECT_EQ(small.Rows(), Expect({{"boot_adopt", "local_miss_no_hub"},
                                  {"self_mint_skipped", "insufficient_memory"}}));
  EXPECT_EQ(small.Stop(), 0);
}

}  // namespace
}  // namespace kiln
