// Hostile tenants against the hub's builder and signing key, with real `kiln hub`, `kiln mint` and
// `kiln worker` processes on loopback (docs/trust.md, docs/reliability.md): a published source that
// asks for the hub's files, /etc/passwd, /dev/zero or /proc/self/environ is refused before it
// compiles and no byte of them comes back; a token revoked while its publish rebuilds gets no
// receipt; garbage collection never takes a blob a rebuild holds; two tenants holding the builder
// never make the platform wait; a key retired by rotation signs nothing a worker trusts, and
// re-signed receipts outlive it; a worker with a hub drains on SIGTERM, never killed by it.
#include <dirent.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "src/kiln/base/file.h"
#include "src/kiln/cell/metadata.h"
#include "src/kiln/cell/pack.h"
#include "src/kiln/receipt/receipt.h"
#include "tests/worker/worker_process.h"

namespace kiln {
namespace {

using namespace kiln::worker_testing;  // NOLINT: the process fixtures
using hub_testing::kAcme;
using hub_testing::kAdmin;
using hub_testing::kBeta;
using hub_testing::kPlatform;
using hub_testing::ValueOr;
using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

constexpr const char* kNoMint = "[mint]\nmemory_budget_mb = 1\n";

// The parent pid of process `pid` (0 if unknown).
pid_t ParentOf(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = stat.rfind(')');  // the command may hold spaces and parentheses
  if (close == std::string::npos) return 0;
  std::istringstream rest(stat.substr(close + 2));
  std::string state;
  pid_t ppid = 0;
  rest >> state >> ppid;
  return ppid;
}

// Whether `hub` is rebuilding now: a `kiln rebuild --child` process whose parent is the
// sandbox's first process, a child of the hub (other tests on this machine rebuild too).
bool RebuildRunning(pid_t hub) {
  DIR* d = ::opendir("/proc");
  if (d == nullptr) return false;
  bool found = false;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
    std::ifstream in(std::string("/proc/") + e->d_name + "/cmdline", std::ios::binary);
    std::string cmd((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (cmd.find(std::string("rebuild\0--child", 15)) == std::string::npos) continue;
    if (ParentOf(ParentOf(std::atoi(e->d_name))) == hub) found = true;
  }
  ::closedir(d);
  return found;
}

bool WaitForRebuild(pid_t hub, int timeout_ms) {
  for (int waited = 0; waited < timeout_ms; waited += 20) {
    if (RebuildRunning(hub)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// A client that waits as long as a queued rebuild may take.
std::unique_ptr<HubClient> PatientClient(const Hub& hub, const std::string& token) {
  HubClientOptions o;
  o.url = hub.url();
  o.token = token;
  o.connect_timeout_s = 2;
  o.io_timeout_s = 600;
  return HubClient::Create(o).value();
}

class Hostile : public MachinesTest {
 protected:
  // The cell `kiln mint` made of `example` on the machine `cache`, with its family set to
  // `family`; the (unchanged) key in *key.
  CellFiles Minted(const std::string& cache, const std::string& manifest, const std::string& family,
                   std::string* key) {
    auto mint = Kiln(cache, "mint --manifest " + manifest);
    EXPECT_EQ(mint.first, 0) << mint.second;
    *key = KeyOf(mint.second.substr(0, mint.second.find_first_of(" \n\t")));
    CellFiles f =
        UnpackCell(ValueOr(ReadFile(cache + "/cells/" + *key + "/cell.tar"), std::string()),
                   "minted cell")
            .value();
    CellMetadata meta = ParseMetadata(f.metadata_json, "metadata").value();
    meta.family = family;
    f.metadata_json = SerializeMetadata(meta).value();
    return f;
  }
  std::string MlpManifest() { return ExampleDir("mlp") + "kiln.toml"; }
};

// A published source that asks for a file: the hub's database and tokens file, /etc/passwd,
// /dev/zero, /proc/self/environ, by a quoted path, by `..` in angle brackets, by a macro, by the
// assembler (.incbin, spelled out or pasted together by the preprocessor). Each is refused
// `include_refused` before anything compiles, naming at most a line; no byte of any of those files
// appears in an answer or in the hub's log. A genuine cell still publishes.
TEST_F(Hostile, TheBuilderNeverEchoesAFileAndNeverReadsTheHubs) {
  const std::string env_secret = "hub-environment-secret-" + hub_testing::Nonce();
  ::setenv("KILN_TEST_HUB_SECRET", env_secret.c_str(), 1);
  Hub hub(root_ + "/hub");
  ASSERT_TRUE(hub.Start());
  ::unsetenv("KILN_TEST_HUB_SECRET");
  std::string key;
  const CellFiles genuine = Minted(root_ + "/tenant", MlpManifest(), "acme/exfil", &key);

  const std::string passwd = ValueOr(ReadFile("/etc/passwd"), std::string());
  const std::string passwd_line = passwd.substr(0, passwd.find('\n'));
  ASSERT_FALSE(passwd_line.empty());
  const std::vector<std::string> secrets = {passwd_line, "SQLite format 3", Sha256Hex(kPlatform),
                                            Sha256Hex(kAdmin), env_secret};
  const std::vector<std::pair<std::string, std::string>> attacks = {
      {"passwd", "#include \"/etc/passwd\"\n"},
      {"database", "#include \"" + root_ + "/hub/data/hub.sqlite\"\n"},
      {"tokens", "#include \"" + root_ + "/hub/tokens.json\"\n"},
      {"dev_zero", "#include \"/dev/zero\"\n"},
      {"environ", "#include \"/proc/self/environ\"\n"},
      {"dotdot", "#include <../../../../../etc/passwd>\n"},
      {"macro", "#define KILN_EXFIL \"/etc/passwd\"\n#include KILN_EXFIL\n"},
      {"incbin", "__asm__(\".incbin \\\"/etc/passwd\\\"\");\n"},
      {"pasted",
       "#define KILN_CAT(a, b) a##b\nKILN_CAT(as, m)(\".incbin \\\"/etc/passwd\\\"\");\n"},
  };
  auto acme = hub.Client(kAcme);
  for (const auto& [name, text] : attacks) {
    CellFiles f = genuine;
    f.source += "\n" + text;
    const auto start = Clock::now();
    PublishAnswer a = acme->Publish(PackCell(f).value(), {});
    const double took = SecondsSince(start);
    EXPECT_EQ(a.token, "include_refused") << name << ": " << a.message;
    EXPECT_EQ(a.http_status, 422) << name;
    EXPECT_LT(took, 60) << name;
    for (const std::string& s : secrets) {
      EXPECT_EQ(a.message.find(s), std::string::npos)
          << name << " answered a secret: " << a.message;
    }
    std::fprintf(stderr, "%-9s refused in %.2f s: %s\n", name.c_str(), took, a.message.c_str());
  }
  const std::string log = hub.process().Log();
  for (const std::string& s : secrets) {
    EXPECT_EQ(log.find(s), std::string::npos) << "the hub's log holds a secret";
  }
  // The same tenant's genuine cell is rebuilt and signed.
  PublishAnswer ok = acme->Publish(PackCell(genuine).value(), {});
  EXPECT_TRUE(ok.ok()) << ok.token << ": " << ok.message;
}

// A token revoked while its publish rebuilds gets no receipt: the hub checks the token again
// after the rebuild, before it signs, and the cell is not stored.
TEST_F(Hostile, ATokenRevokedDuringItsPublishGetsNoReceipt) {
  Hub hub(root_ + "/hub");
  ASSERT_TRUE(hub.Start());
  std::string key;
  const CellFiles f = Minted(root_ + "/tenant", MlpManifest(), "acme/late", &key);
  PublishAnswer answer;
  std::thread publish([&] { answer = hub.Client(kAcme)->Publish(PackCell(f).value(), {}); });
  ASSERT_TRUE(WaitForRebuild(hub.pid(), 60000)) << "the rebuild never started";
  HubAnswer revoked = hub.Client(kAdmin)->Call("POST", "/v1/admin/tokens/revoke",
                                               nlohmann::json{{"name", "acme-ci"}}.dump());
  publish.join();
  ASSERT_TRUE(revoked.ok()) << revoked.token << ": " << revoked.message;
  EXPECT_EQ(answer.http_status, 401) << answer.token << ": " << answer.message;
  EXPECT_EQ(answer.token, "unauthenticated") << answer.message;
  EXPECT_TRUE(answer.receipt.empty());
  ResolveAnswer r = hub.Client(kAdmin)->Resolve(key, "acme/late");
  EXPECT_EQ(r.kind, ResolveAnswer::Kind::kMiss) << r.token << ": " << r.message;
}

// Garbage collection every second with a one-second grace, while a publish rebuilds for several:
// the intent and the blob are older than the grace before the rebuild ends, yet the blob the
// rebuild holds is never collected; the stored cell resolves and its blob downloads whole.
TEST_F(Hostile, GarbageCollectionNeverTakesABlobARebuildHolds) {
  Hub hub(root_ + "/hub");
  hub.process().AddArgs({"--blob-grace", "1", "--gc-interval", "1"});
  ASSERT_TRUE(hub.Start());
  std::string key;
  const CellFiles f = Minted(root_ + "/platform", MlpManifest(), "root/mlp", &key);
  const std::string tar = PackCell(f).value();
  const auto start = Clock::now();
  PublishAnswer a = hub.Client(kPlatform)->Publish(tar, {});
  ASSERT_TRUE(a.ok()) << a.token << ": " << a.message;
  const double took = SecondsSince(start);
  std::fprintf(stderr, "publish with a rebuild took %.1f s under a 1 s collection cycle\n", took);
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // more collections
  EXPECT_NE(hub.process().Log().find("hub: collected"), std::string::npos)
      << "no collection ran: the test shows nothing";
  ResolveAnswer r = hub.Client(kPlatform)->Resolve(key, "root/mlp");
  ASSERT_EQ(r.kind, ResolveAnswer::Kind::kFound) << r.token << ": " << r.message;
  const std::string dest = root_ + "/fetched.tar";
  HubAnswer fetched = hub.Client(kPlatform)->FetchBlob(r.digest, dest, r.size);
  ASSERT_TRUE(fetched.ok()) << fetched.token << ": " << fetched.message;
  EXPECT_EQ(CellDigest(ValueOr(ReadFile(dest), std::string())), r.digest);
}

// Two tenants publish cells of seven compiles each and queue more; the platform publishes
// meanwhile. Tenants never hold the last builder slot, so the platform's rebuild starts at once: it
// finishes while a tenant's is still running, in about its time alone (the cores are shared). A
// tenant with its queue full is told `builder_busy` with Retry-After.
TEST_F(Hostile, TenantsHoldingTheBuilderNeverMakeThePlatformWait) {
  Hub hub(root_ + "/hub");
  hub.process().AddArgs({"--builder-queue", "1"});
  ASSERT_TRUE(hub.Start());
  // The example's model with six shape classes: a wide cell.
  std::string manifest = ValueOr(ReadFile(MlpManifest()), std::string());
  const size_t env_at = manifest.find("envelope = [");
  const size_t env_end = manifest.find("]\n", manifest.find("{ x = [16, 64] }"));
  ASSERT_NE(env_at, std::string::npos);
  std::string envelope = "envelope = [\n";
  for (int b = 1; b <= 6; ++b) envelope += "  { x = [" + std::to_string(b) + ", 64] },\n";
  manifest.replace(env_at, env_end + 2 - env_at, envelope + "]\n");
  for (const char* rel : {"model.onnx", "checkpoint.safetensors"}) {
    const std::string from = std::string("\"") + rel + "\"";
    manifest.replace(manifest.find(from), from.size(), "\"" + ExampleDir("mlp") + rel + "\"");
  }
  ASSERT_TRUE(MakeDirs(root_ + "/tenant").ok());
  ASSERT_TRUE(WriteFileAtomic(root_ + "/tenant/wide.toml", manifest).ok());
  std::string wide_key, key;
  const CellFiles wide =
      Minted(root_ + "/tenant", root_ + "/tenant/wide.toml", "acme/wide", &wide_key);
  ASSERT_EQ(ParseMetadata(wide.metadata_json, "m")->entries.size(), 6u);
  const CellFiles platform = Minted(root_ + "/platform", MlpManifest(), "root/solo", &key);

  auto repack = [](CellFiles f, const std::string& family) {
    CellMetadata m = ParseMetadata(f.metadata_json, "m").value();
    m.family = family;
    f.metadata_json = SerializeMetadata(m).value();
    return PackCell(f).value();
  };
  // The platform's publish alone.
  auto t0 = Clock::now();
  PublishAnswer solo = hub.Client(kPlatform)->Publish(repack(platform, "root/solo"), {});
  ASSERT_TRUE(solo.ok()) << solo.token << ": " << solo.message;
  const double alone = SecondsSince(t0);

  // Two tenants' wide cells, intents and uploads first so that each complete reaches the builder
  // when it is sent: acme's runs (the one tenant slot), beta's and acme's second wait, and beta's
  // second finds beta's queue full.
  const std::vector<std::pair<const char*, std::string>> who = {
      {kAcme, "acme/wide"}, {kBeta, "beta/wide"}, {kAcme, "acme/wide2"}, {kBeta, "beta/wide2"}};
  for (const auto& [token, family] : who) {
    const std::string tar = repack(wide, family);
    HubAnswer intent = hub.Client(token)->Call("POST", "/v1/publish/intent",
                                               nlohmann::json{{"key", wide_key},
                                                              {"digest", CellDigest(tar)},
                                                              {"size", tar.size()},
                                                              {"family", family}}
                                                   .dump());
    ASSERT_TRUE(intent.ok()) << family << ": " << intent.message;
    HubAnswer up = hub.Client(token)->Call("PUT", "/v1/blobs/" + CellDigest(tar), tar,
                                           "application/octet-stream");
    ASSERT_TRUE(up.ok()) << family << ": " << up.message;
  }
  auto complete = [&](size_t i) {
    const std::string tar = repack(wide, who[i].second);
    return PatientClient(hub, who[i].first)
        ->Call("POST", "/v1/publish/complete",
               nlohmann::json{{"key", wide_key}, {"digest", CellDigest(tar)}}.dump());
  };
  std::atomic<int> tenants_done{0};
  std::vector<HubAnswer> answers(3);
  std::vector<std::thread> tenants;
  for (size_t i = 0; i < 3; ++i) {
    tenants.emplace_back([&, i] {
      answers[i] = complete(i);
      ++tenants_done;
    });
    if (i == 0) {
      ASSERT_TRUE(WaitForRebuild(hub.pid(), 60000));
    }
    // Long enough for the complete to reach the builder's queue; short enough that acme's rebuild
    // (seven compiles) still runs when beta's second arrives, on a quiet fast machine too (there
    // 1.5 s let the queue drain, and no builder_busy came).
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  HubAnswer busy = complete(3);
  EXPECT_EQ(busy.token, "builder_busy") << busy.message;
  EXPECT_EQ(busy.http_status, 503);

  t0 = Clock::now();
  PublishAnswer contended = hub.Client(kPlatform)->Publish(repack(platform, "root/busy"), {});
  const double with_tenants = SecondsSince(t0);
  const int done_then = tenants_done.load();
  for (auto& t : tenants) t.join();
  ASSERT_TRUE(contended.ok()) << contended.token << ": " << contended.message;
  std::fprintf(stderr,
               "platform publish alone %.1f s, with two tenants holding the builder %.1f s "
               "(%d of 3 tenant publishes done by then)\n",
               alone, with_tenants, done_then);
  EXPECT_LT(done_then, 3) << "the platform's publish waited for every tenant's";
  EXPECT_LT(with_tenants, 3 * alone + 5) << "the platform waited behind tenants";
  for (size_t i = 0; i < answers.size(); ++i) {
    EXPECT_TRUE(answers[i].ok()) << who[i].second << ": " << answers[i].token << " "
                                 << answers[i].message;
  }
}

// A thief holds the signing key the hub rotated away from. Everything it signs after the rotation
// is refused by a worker whose anchors are the hub's key set: a fresh revocation list
// (revocations_key_retired) and a fresh receipt for the genuine bytes (receipt_key_retired),
// served by a hub in between. The genuine receipt, signed before the rotation, still adopts; after
// the hub re-signs every receipt, the old key can be retired back to 0 and workers still adopt.
TEST_F(Hostile, ARetiredKeySignsNothingAWorkerTrusts) {
  Hub hub(root_ + "/hub");
  ASSERT_TRUE(hub.Start());
  std::string ref;
  ASSERT_TRUE(hub.MintAndPublish(root_ + "/platform", "mlp", &ref));
  HubAnswer health = hub.Client("")->Call("GET", "/v1/health");
  ASSERT_TRUE(health.ok());
  const std::string old_kid = health.body.value("kid", "");
  const SigningKey stolen =
      SigningKey::FromRawPrivate(
          ValueOr(ReadFile(root_ + "/hub/data/signing/" + old_kid + ".key"), std::string()))
          .value();
  HubAnswer rotated = hub.Client(kAdmin)->Call("POST", "/v1/admin/rotate-key", "{}");
  ASSERT_TRUE(rotated.ok()) << rotated.token << ": " << rotated.message;
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // iat strictly after it
  const std::string jwks = root_ + "/jwks.json";
  ASSERT_TRUE(hub.WriteJwks(jwks));
  ASSERT_NE(ValueOr(ReadFile(jwks), std::string()).find("not_after"), std::string::npos);
  const int64_t now = std::chrono::duration_cast<std::chrono::seconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();

  ManifestOptions o;
  o.trust_path = jwks;
  o.extra = kNoMint;
  {
    RevocationList list;
    list.iat = now;
    list.max_age_s = 300;
    const std::string forged = SignRevocationList(list, stolen).value();
    FakeHub fake(hub.port(), FakeHub::Revocations(nlohmann::json{
                                 {"revocations", nlohmann::json::array()},
                                 {"list", forged}}.dump()));
    o.hub_url = fake.url();
    Worker w(root_ + "/list", Manifest(o));
    ASSERT_TRUE(w.Start());
    ASSERT_TRUE(w.WaitForRow("boot_adopt", "revocations_key_retired", 10000)) << w.Log();
    EXPECT_EQ(fake.blob_requests(), 0);
    EXPECT_EQ(w.LoadedCellFiles(), 0u);
    EXPECT_EQ(w.Stop(), 0);
  }
  {
    FakeHub* self = nullptr;
    FakeHub fake(hub.port(), [&](const httplib::Request& req) -> std::optional<std::string> {
      if (req.path.rfind("/v1/cells/", 0) != 0) return std::nullopt;
      auto real =
          self->real().Get(req.target, {{"Authorization", req.get_header_value("Authorization")}});
      if (!real) return std::nullopt;
      auto body = nlohmann::json::parse(real->body, nullptr, false);
      if (!body.is_object() || !body.value("found", false)) return std::nullopt;
      ReceiptVerdict genuine = VerifyReceipt(
          body["receipt"].get<std::string>(),
          PublicKeySet::FromText(ValueOr(ReadFile(jwks), std::string()), "jwks").value(), {});
      ReceiptClaims claims = genuine.claims;
      claims.iat = now;
      body["receipt"] = SignReceipt(claims, stolen).value();
      return body.dump();
    });
    self = &fake;
    o.hub_url = fake.url();
    Worker w(root_ + "/receipt", Manifest(o));
    ASSERT_TRUE(w.Start());
    Row boot;
    ASSERT_TRUE(w.WaitForRow("boot_adopt", "receipt_refused", 10000, &boot)) << w.Log();
    EXPECT_TRUE(DetailNames(boot, "receipt_key_retired"));
    EXPECT_EQ(fake.blob_requests(), 0);
    EXPECT_EQ(w.Stop(), 0);
  }
  // The genuine receipt predates the rotation: the real hub's cell adopts.
  o.hub_url = hub.url();
  {
    Worker w(root_ + "/real", Manifest(o));
    ASSERT_TRUE(w.Start());
    ASSERT_TRUE(w.WaitForRow("boot_adopt", "hit", 10000)) << w.Log();
    EXPECT_EQ(w.Stop(), 0);
  }
  // Re-signed with the new key, the old one can go back to 0: a worker still adopts.
  HubAnswer resigned = hub.Client(kAdmin)->Call("POST", "/v1/admin/receipts/resign", "{}");
  ASSERT_TRUE(resigned.ok()) << resigned.message;
  EXPECT_GE(resigned.body.value("resigned", 0), 1);
  HubAnswer retired = hub.Client(kAdmin)->Call(
      "POST", "/v1/admin/keys/retire", nlohmann::json{{"kid", old_kid}, {"not_after", 0}}.dump());
  ASSERT_TRUE(retired.ok()) << retired.message;
  ASSERT_TRUE(hub.WriteJwks(jwks));
  Worker w(root_ + "/resigned", Manifest(o));
  ASSERT_TRUE(w.Start());
  ASSERT_TRUE(w.WaitForRow("boot_adopt", "hit", 10000)) << w.Log();
  EXPECT_EQ(w.Stop(), 0);
}

// The threads of `pid` that do not block `sig`, each as "tid name".
std::vector<std::string> ThreadsNotBlocking(pid_t pid, int sig) {
  std::vector<std::string> open;
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  DIR* d = ::opendir(tasks.c_str());
  if (d == nullptr) return {"cannot read " + tasks};
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream in(tasks + "/" + e->d_name + "/status");
    std::string line, name;
    uint64_t blocked = 0;
    while (std::getline(in, line)) {
      if (line.rfind("Name:", 0) == 0) name = line.substr(6);
      if (line.rfind("SigBlk:", 0) == 0) blocked = std::stoull(line.substr(8), nullptr, 16);
    }
    if ((blocked & (uint64_t{1} << (sig - 1))) == 0) open.push_back(e->d_name + (" " + name));
  }
  ::closedir(d);
  return open;
}

// A worker with a hub runs background threads (event forwarding, publishing, minting, adopt
// retries, revocation polls). A SIGTERM must reach the one thread that drains, whichever thread
// the kernel picks: a thread started before the stop signals were blocked would take it with the
// default action and kill the worker mid-answer.
TEST_F(Hostile, AWorkerWithAHubDrainsOnSigtermWhicheverThreadTheSignalMeets) {
  Hub hub(root_ + "/hub");
  ASSERT_TRUE(hub.Start());
  std::string ref;
  ASSERT_TRUE(hub.MintAndPublish(root_ + "/platform", "mlp", &ref));
  ManifestOptions o;
  o.hub_url = hub.url();
  o.hub_extra = "revocation_poll_s = 1\n";
  for (int i = 0; i < 3; ++i) {
    Worker w(root_ + "/w" + std::to_string(i), Manifest(o));
    ASSERT_TRUE(w.Start());
    ASSERT_TRUE(w.WaitForRow("boot_adopt", "hit", 10000)) << w.Log();
    // Every thread but the main one blocks SIGTERM, so the kernel can only hand it to the main
    // thread's sigwait (which, while it waits, shows the signals it waits for as unblocked; a
    // main thread not yet in sigwait shows them blocked, so it may or may not be listed).
    // Both processes: the broker passes SIGTERM on, the serving process drains on it.
    std::string names;
    for (const pid_t pid : {w.pid(), w.ServingPid()}) {
      const std::string main_thread = std::to_string(pid) + " ";
      for (const std::string& t : ThreadsNotBlocking(pid, SIGTERM)) {
        if (t.rfind(main_thread, 0) != 0) names += " [" + t + "]";
      }
    }
    EXPECT_NE(w.pid(), w.ServingPid()) << "a worker with a hub token runs a broker";
    EXPECT_TRUE(names.empty()) << "threads that would take SIGTERM's default action:" << names;
    EXPECT_EQ(w.Stop(), 0) << w.Log();
    EXPECT_NE(w.Log().find("draining"), std::string::npos) << w.Log();
  }
}

}  // namespace
}  // namespace kiln
