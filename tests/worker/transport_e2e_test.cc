// The transport under attack and under TLS, with real `kiln hub` and `kiln worker` processes on
// loopback (docs/transport.md, docs/reliability.md "Fault and attack matrix"):
//   - unauthenticated gigabyte bodies cost the hub no memory and are never drained;
//   - a worker refuses a body larger than it takes from its Content-Length alone;
//   - slowloris and idle keep-alive connections leave a well-behaved client fast, on both servers;
//   - 500 clients at once are all answered, none reset;
//   - a JSON infer body is read whatever its Content-Type (the README's curl example);
//   - TLS end to end with a CA made at test time (publish, resolve, boot, infer), a certificate
//     reloaded without restart, and plain HTTP to a non-loopback address refused;
//   - the worker's admin listener: the operator token, and checkpoints confined to their directory.
// Every test is bounded in time and in connections.
#include <poll.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "src/kiln/tensor/npy.h"
#include "tests/net/raw_client.h"
#include "tests/net/test_certs.h"
#include "tests/worker/worker_process.h"

namespace kiln::worker_testing {
namespace {

using net_testing::RawConn;
using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// The mlp example's reference input as a JSON infer body.
std::string MlpBody() {
  auto x = ReadNpy(ExampleDir("mlp") + "inputs/x.npy");
  EXPECT_TRUE(x.ok());
  nlohmann::json data = nlohmann::json::array();
  for (int64_t i = 0; i < x->numel(); ++i) data.push_back(x->GetAsDouble(i));
  return nlohmann::json{
      {"inputs", {{{"name", "x"}, {"shape", x->shape()}, {"datatype", "FP32"}, {"data", data}}}}}
      .dump();
}

std::string Post(const std::string& path, const std::string& body, const std::string& extra = "") {
  return "POST " + path + " HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n" + extra +
         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

// One machine's cache, minted once for the suite (examples/mlp), so workers boot `local_hit`
// and no mint child competes with the load these tests measure.
class TransportTest : public MachinesTest {
 protected:
  static void SetUpTestSuite() {
    char tmpl[] = "/tmp/kiln-transport-cache-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    cache_ = tmpl;
    ASSERT_TRUE(Mint(cache_, "mlp", &ref_));
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    std::filesystem::remove_all(cache_, ec);
  }
  // A worker on the minted cache (no hub): its cell arms from the local store.
  std::unique_ptr<Worker> MlpWorker(std::vector<std::string> args = {}) {
    ManifestOptions o;
    auto w = std::make_unique<Worker>(root_ + "/w", Manifest(o),
                                      std::map<std::string, std::string>{}, std::move(args));
    return w;
  }
  // Starts `w` with KILN_CACHE_DIR on the shared cache.
  ::testing::AssertionResult StartOnCache(Worker& w) {
    // The worker's own directory holds its manifest, log and events; the cells come from cache_.
    std::error_code ec;
    std::filesystem::create_directories(root_ + "/w/cells", ec);
    for (const auto& e : std::filesystem::directory_iterator(cache_ + "/cells")) {
      std::filesystem::copy(
          e.path(), root_ + "/w/cells/" + e.path().filename().string(),
          std::filesystem::copy_options::recursive | std::filesystem::copy_options::skip_existing,
          ec);
    }
    for (const char* sub : {"toolchain"}) {
      std::filesystem::copy(
          cache_ + "/" + sub, root_ + "/w/" + sub,
          std::filesystem::copy_options::recursive | std::filesystem::copy_options::skip_existing,
          ec);
    }
    return w.Start();
  }
  static std::string cache_, ref_;
};
std::string TransportTest::cache_, TransportTest::ref_;

TEST_F(TransportTest, UnauthenticatedGigabyteBodiesCostTheHubNoMemoryAndAreNeverDrained) {
  Hub hub(root_ + "/hub");
  ASSERT_TRUE(hub.Start());
  const pid_t pid = hub.pid();
  // Warm the hub up, then take its peak resident size as the baseline.
  ASSERT_TRUE(hub.Client(hub_testing::kWorker)->Call("GET", "/v1/health").ok());
  const long hwm_before = StatusKb(pid, "VmHWM");
  ASSERT_GT(hwm_before, 0);

  const uint64_t kGiB = uint64_t{1} << 30;
  const std::string digest = "sha256:" + std::string(64, 'a');
  const std::vector<std::string> heads = {
      "PUT /v1/blobs/" + digest + " HTTP/1.1\r\nHost: t\r\n",  // no token
      "PUT /v1/blobs/" + digest + " HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer nope\r\n",
      "POST /v1/publish/intent HTTP/1.1\r\nHost: t\r\n",                        // over 1 MiB
      "POST /v1/events HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer nope\r\n",  // over 16 MiB
  };
  struct Outcome {
    int status = 0;
    uint64_t sent = 0;
    double ms = 0;
  };
  std::vector<Outcome> out(heads.size());
  const auto start = Clock::now();
  std::vector<std::thread> clients;
  for (size_t i = 0; i < heads.size(); ++i) {
    clients.emplace_back([&, i] {
      RawConn c(hub.port());
      if (!c.Send(heads[i] + "Content-Length: " + std::to_string(kGiB) + "\r\n\r\n")) return;
      // A writer pushes the gigabyte as fast as the hub takes it; the answer is read meanwhile.
      std::atomic<bool> stop{false};
      std::atomic<uint64_t> sent{0};
      std::thread writer([&] {
        const std::string chunk(1 << 20, '\0');
        while (!stop.load() && sent.load() < kGiB) {
          if (!c.Send(chunk)) return;
          sent += chunk.size();
        }
      });
      auto a = c.Read(30000);
      out[i].ms = MsSince(start);
      out[i].status = a.status;
      stop = true;
      ::shutdown(c.fd(), SHUT_RDWR);
      writer.join();
      out[i].sent = sent.load();
    });
  }
  for (auto& t : clients) t.join();
  const long hwm_after = StatusKb(pid, "VmHWM");
  uint64_t pushed = 0;
  for (const Outcome& o : out) pushed += o.sent;
  EXPECT_EQ(out[0].status, 401);
  EXPECT_EQ(out[1].status, 401);
  EXPECT_EQ(out[2].status, 413);
  EXPECT_EQ(out[3].status, 413);
  for (const Outcome& o : out) EXPECT_LT(o.ms, 20000) << "an answer took " << o.ms << " ms";
  EXPECT_LT(hwm_after - hwm_before, 100 * 1024)
      << "peak RSS grew from " << hwm_before << " kB to " << hwm_after << " kB";
  // The clients could push only what the socket buffers and the bounded linger of each refusal
  // took: the hub never drained the 4 GiB on offer (on loopback it would take seconds).
  EXPECT_LT(pushed, uint64_t{256} << 20) << "the clients pushed " << pushed << " bytes";
  std::printf(
      "4 x 1 GiB unauthenticated: statuses %d %d %d %d; peak RSS %+ld kB; the clients "
      "pushed %llu bytes in all\n",
      out[0].status, out[1].status, out[2].status, out[3].status, hwm_after - hwm_before,
      static_cast<unsigned long long>(pushed));
  EXPECT_TRUE(hub.Client(hub_testing::kWorker)->Call("GET", "/v1/health").ok());
}

// A JSON infer body for mlp with `rows` rows of `cols` values ("0.1234567," each), asking for
// the output `output`.
std::string BigMlpBody(int64_t rows, int64_t cols, const std::string& output) {
  std::string body = "{\"outputs\":[{\"name\":\"" + output +
                     "\"}],\"inputs\":[{\"name\":\"x\",\"shape\":[" + std::to_string(rows) + "," +
                     std::to_string(cols) + "],\"datatype\":\"FP32\",\"data\":[";
  const std::string v = "0.1234567,";
  body.reserve(body.size() + static_cast<size_t>(rows * cols) * v.size() + 8);
  for (int64_t i = 0; i < rows * cols; ++i) body += v;
  body.back() = ']';
  return body + "}]}";
}

// Sends `body` as an infer request while reading the answer; the answer and how long it took.
RawConn::Answer SendWhileReading(int port, const std::string& body, double* ms) {
  RawConn c(port);
  const auto start = Clock::now();
  const std::string head = "POST /v2/models/mlp/infer HTTP/1.1\r\nHost: t\r\nContent-Length: " +
                           std::to_string(body.size()) + "\r\n\r\n";
  std::thread writer([&] { c.Send(head) && c.Send(body); });
  auto a = c.Read(120000);
  *ms = MsSince(start);
  ::shutdown(c.fd(), SHUT_RDWR);
  writer.join();
  return a;
}

TEST_F(TransportTest, NinetyFiveMegabyteInferBodiesCostTheirTensorsNotATree) {
  auto w = MlpWorker();
  ASSERT_TRUE(StartOnCache(*w));
  const pid_t pid = w->ServingPid();
  // 150000 x 64 values: a 95 MB JSON body. With a shape the model does not take, it is refused
  // when its "data" begins, before the tensor exists and before the rest of the body is read.
  const std::string wrong = BigMlpBody(150000, 63, "logits");
  ASSERT_GT(wrong.size(), 90u << 20);
  const long hwm0 = StatusKb(pid, "VmHWM");
  double ms = 0;
  auto refused = SendWhileReading(w->port(), wrong, &ms);
  const long hwm1 = StatusKb(pid, "VmHWM");
  EXPECT_EQ(refused.status, 400) << refused.body.substr(0, 300);
  EXPECT_NE(refused.body.find("dim 1 is 63"), std::string::npos) << refused.body.substr(0, 300);
  EXPECT_LT(ms, 5000);
  EXPECT_LT(hwm1 - hwm0, 32 * 1024) << "peak RSS " << hwm0 << " -> " << hwm1 << " kB";
  // The model's shape, read to the end (then refused for its unknown output, so that what is
  // measured is the reading): the request costs its 38 MB tensor, not a tree of 95 MB of JSON
  // (which took 2 GB before).
  const std::string right = BigMlpBody(150000, 64, "no-such-output");
  double ms_read = 0;
  auto read = SendWhileReading(w->port(), right, &ms_read);
  const long hwm2 = StatusKb(pid, "VmHWM");
  EXPECT_EQ(read.status, 400) << read.body.substr(0, 300);
  EXPECT_NE(read.body.find("no-such-output"), std::string::npos) << read.body.substr(0, 300);
  const long tensor_kb = 150000 * 64 * 4 / 1024;
  std::printf(
      "95 MB infer body: wrong shape %d in %.0f ms, peak RSS %+ld kB; read whole in %.0f ms, "
      "peak RSS %+ld kB (its tensor: %ld kB)\n",
      refused.status, ms, hwm1 - hwm0, ms_read, hwm2 - hwm0, tensor_kb);
#if defined(__SANITIZE_ADDRESS__)
  // Under AddressSanitizer freed chunks wait in its quarantine and every byte has shadow: a wider
  // bound, which the tree this guards against (2 GB) still breaks.
  EXPECT_LT(hwm2 - hwm0, 2 * tensor_kb + 64 * 1024);
#else
  EXPECT_LT(hwm2 - hwm0, tensor_kb + 32 * 1024);
#endif
}

// Holds `slow` slowloris connections (a header byte each every 500 ms) and `idle` keep-alive
// connections that sent one request and went quiet, while `probe` measures a well-behaved client.
// Returns the probe's latencies in ms.
std::vector<double> UnderSlowAndIdleClients(int port, int slow, int idle,
                                            const std::string& idle_req,
                                            const std::function<double()>& probe, int probes) {
  std::vector<RawConn> idlers(idle);
  for (auto& c : idlers) {
    EXPECT_EQ(c.Connect(port), 0);
    EXPECT_TRUE(c.Send(idle_req));
    EXPECT_GT(c.Read(10000).status, 0);
  }
  std::vector<RawConn> lorises(slow);
  for (auto& c : lorises) EXPECT_EQ(c.Connect(port), 0);
  std::atomic<bool> done{false};
  std::thread drip([&] {
    const std::string head = "GET /v1/health HTTP/1.1\r\nHost: t\r\nX-Slow: ";
    size_t at = 0;
    while (!done.load()) {
      for (auto& c : lorises) c.Send(at < head.size() ? head.substr(at, 1) : "a");
      ++at;
      for (int i = 0; i < 10 && !done.load(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
  });
  std::vector<double> ms;
  for (int i = 0; i < probes; ++i) {
    ms.push_back(probe());
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  done = true;
  drip.join();
  return ms;
}

TEST_F(TransportTest, SlowlorisAndIdleClientsLeaveTheHubFast) {
  Hub hub(root_ + "/hub");
  ASSERT_TRUE(hub.Start());
  const std::string key = "ck1-" + std::string(56, 'b');
  const std::string resolve = "GET /v1/cells/" + key +
                              "?family=root/mlp HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer " +
                              std::string(hub_testing::kWorker) + "\r\n\r\n";
  RawConn good(hub.port());
  auto probe = [&] {
    const auto t = Clock::now();
    EXPECT_TRUE(good.Send(resolve));
    auto a = good.Read(5000);
    EXPECT_EQ(a.status, 200) << a.body;
    return MsSince(t);
  };
  auto ms = UnderSlowAndIdleClients(hub.port(), 64, 200, resolve, probe, 300);
  const double p99 = Percentile(ms, 0.99);
  std::printf("hub under 64 slowloris + 200 idle keep-alive: resolve p50 %.2f ms, p99 %.2f ms\n",
              Percentile(ms, 0.5), p99);
  EXPECT_LT(p99, 100.0);
}

TEST_F(TransportTest, SlowlorisAndIdleClientsLeaveTheWorkerFast) {
  auto w = MlpWorker();
  ASSERT_TRUE(StartOnCache(*w));
  const std::string infer = Post("/v2/models/mlp/infer", MlpBody());
  RawConn good(w->port());
  auto probe = [&] {
    const auto t = Clock::now();
    EXPECT_TRUE(good.Send(infer));
    auto a = good.Read(5000);
    EXPECT_EQ(a.status, 200) << a.body;
    return MsSince(t);
  };
  probe();  // the first call binds the cell's workspace
  auto ms = UnderSlowAndIdleClients(w->port(), 64, 200,
                                    "GET /v2/health/live HTTP/1.1\r\nHost: t\r\n\r\n", probe, 300);
  const double p99 = Percentile(ms, 0.99);
  std::printf("worker under 64 slowloris + 200 idle keep-alive: infer p50 %.2f ms, p99 %.2f ms\n",
              Percentile(ms, 0.5), p99);
  EXPECT_LT(p99, 100.0);
  auto last = nlohmann::json::parse(
      w->Post("/v2/models/mlp/infer", nlohmann::json::parse(MlpBody())).body.dump());
  EXPECT_EQ(last["parameters"]["serving_mode"], "aot_cell") << last.dump();
}

// Opens `n` connections at once, sends `request` on each and reads every answer in one poll loop.
struct Burst {
  int ok = 0, other = 0, resets = 0, no_answer = 0;
  std::map<int, int> statuses;
};
Burst FireAtOnce(int port, int n, const std::string& request, int timeout_ms) {
  Burst b;
  std::vector<RawConn> conns(n);
  std::vector<bool> sent(n, false);
  for (int i = 0; i < n; ++i) {
    if (conns[i].Connect(port) != 0) {
      ++b.resets;
      continue;
    }
    sent[i] = conns[i].Send(request);
    if (!sent[i]) ++b.resets;
  }
  for (int i = 0; i < n; ++i) {
    if (!sent[i]) continue;
    auto a = conns[i].Read(timeout_ms);
    if (a.error == ECONNRESET || a.error == EPIPE) {
      ++b.resets;
    } else if (a.status == 0) {
      ++b.no_answer;
    } else {
      ++b.statuses[a.status];
      (a.status == 200 ? b.ok : b.other)++;
    }
  }
  return b;
}

TEST_F(TransportTest, FiveHundredConcurrentClientsAreAllAnsweredAndNoneReset) {
  Hub hub(root_ + "/hub");
  ASSERT_TRUE(hub.Start());
  auto w = MlpWorker();
  ASSERT_TRUE(StartOnCache(*w));
  const std::string key = "ck1-" + std::string(56, 'c');
  Burst h = FireAtOnce(hub.port(), 500,
                       "GET /v1/cells/" + key +
                           "?family=root/mlp HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer " +
                           std::string(hub_testing::kWorker) + "\r\n\r\n",
                       60000);
  Burst k = FireAtOnce(w->port(), 500, Post("/v2/models/mlp/infer", MlpBody()), 60000);
  std::printf(
      "500 at once: hub %d ok, %d other, %d resets, %d unanswered; worker %d ok, %d other, "
      "%d resets, %d unanswered\n",
      h.ok, h.other, h.resets, h.no_answer, k.ok, k.other, k.resets, k.no_answer);
  EXPECT_EQ(h.resets, 0);
  EXPECT_EQ(h.ok, 500);
  EXPECT_EQ(k.resets, 0);
  EXPECT_EQ(k.ok, 500);
}

TEST_F(TransportTest, ReadmeCurlExampleWorksAtAnySizeWhateverTheContentType) {
  auto w = MlpWorker();
  ASSERT_TRUE(StartOnCache(*w));
  // A batch of 256 rows (about 150 KB of JSON), posted the way curl -d posts: form-urlencoded,
  // with Expect: 100-continue as curl sends for a large body.
  std::vector<float> v(256 * 64);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 97) / 97.f;
  nlohmann::json body = {
      {"inputs", {{{"name", "x"}, {"shape", {256, 64}}, {"datatype", "FP32"}, {"data", v}}}}};
  const std::string text = body.dump();
  ASSERT_GT(text.size(), 100000u);
  RawConn c(w->port());
  ASSERT_TRUE(
      c.Send("POST /v2/models/mlp/infer HTTP/1.1\r\nHost: t\r\n"
             "Content-Type: application/x-www-form-urlencoded\r\nExpect: 100-continue\r\n"
             "Content-Length: " +
             std::to_string(text.size()) + "\r\n\r\n"));
  int interim = 0;
  // curl waits for 100 Continue (or a second) before the body.
  EXPECT_EQ(c.Read(2000, &interim).status, 0);
  EXPECT_EQ(interim, 1);
  ASSERT_TRUE(c.Send(text));
  auto a = c.Read(30000, &interim);
  ASSERT_EQ(a.status, 200) << a.body;
  auto j = nlohmann::json::parse(a.body);
  EXPECT_EQ(j["outputs"][0]["shape"], nlohmann::json({256, 10})) << a.body.substr(0, 300);
}

TEST_F(TransportTest, TlsEndToEndWithATestCaAndACertificateReloadedWithoutRestart) {
  net_testing::TestCa ca(root_, "fleet"), next(root_, "next");
  const auto hub_cert = ca.Issue("hub", 2);
  const auto worker_cert = ca.Issue("worker", 3);
  Hub hub(root_ + "/hub");
  hub.process().UseTls(hub_cert.cert, hub_cert.key, ca.ca_path());
  ASSERT_TRUE(hub.Start());
  ASSERT_EQ(hub.url().rfind("https://", 0), 0u);
  // Publish and resolve over HTTPS with the private CA.
  std::string ref;
  ASSERT_TRUE(hub.MintAndPublish(cache_, "mlp", &ref));
  auto resolved = Kiln(cache_, "resolve " + KeyOf(ref) + " --family root/mlp --hub " + hub.url() +
                                   " --ca " + ca.ca_path() + " --token " + hub_testing::kWorker);
  EXPECT_EQ(resolved.first, 0) << resolved.second;
  EXPECT_NE(resolved.second.find("\"answer\": \"found\""), std::string::npos) << resolved.second;
  // Without the CA the certificate does not verify: a typed transport refusal, not a miss.
  auto unverified = Kiln(cache_, "resolve " + KeyOf(ref) + " --family root/mlp --hub " + hub.url() +
                                     " --token " + hub_testing::kWorker);
  EXPECT_EQ(unverified.first, 1) << unverified.second;
  EXPECT_NE(unverified.second.find("hub_tls_error"), std::string::npos) << unverified.second;

  // A worker adopts over HTTPS and serves HTTPS itself.
  ManifestOptions o;
  o.hub_url = hub.url();
  o.hub_ca = ca.ca_path();
  Worker w(root_ + "/w", Manifest(o));
  w.UseTls(worker_cert.cert, worker_cert.key, ca.ca_path());
  ASSERT_TRUE(w.Start());
  Row boot;
  ASSERT_TRUE(w.WaitForRow("boot_adopt", "", 60000, &boot));
  EXPECT_EQ(boot.phase, "hit") << boot.detail;
  auto x = ReadNpy(ExampleDir("mlp") + "inputs/x.npy");
  ASSERT_TRUE(x.ok());
  auto a = w.Infer("mlp", {{"x", *x}});
  ASSERT_EQ(a.status, 200) << a.body.dump();
  EXPECT_EQ(a.mode(), "aot_cell");
  EXPECT_EQ(a.ref(), ref);

  // The hub's certificate is renewed by another CA: SIGHUP re-reads it, no restart.
  next.Issue("hub", 4);
  ::kill(hub.pid(), SIGHUP);
  HubClientOptions co;
  co.url = hub.url();
  co.ca_file = next.ca_path();
  co.connect_timeout_s = 2;
  bool renewed = false;
  for (int i = 0; i < 50 && !renewed; ++i) {
    renewed = HubClient::Create(co).value()->Call("GET", "/v1/health").ok();
    if (!renewed) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(renewed) << "the renewed certificate was not served";
  co.ca_file = ca.ca_path();
  EXPECT_EQ(HubClient::Create(co).value()->Call("GET", "/v1/health").token, "hub_tls_error");
}

TEST_F(TransportTest, PlainHttpToOrOnANonLoopbackAddressIsRefused) {
  // A client dialling a remote host in the clear is refused before it connects.
  const auto start = Clock::now();
  auto resolve =
      Kiln(cache_, "resolve ck1-" + std::string(56, 'd') +
                       " --family root/mlp --hub http://192.0.2.10:8470 --token t --timeout 30");
  EXPECT_NE(resolve.first, 0);
  EXPECT_NE(resolve.second.find("insecure_http_refused"), std::string::npos) << resolve.second;
  EXPECT_LT(MsSince(start), 10000) << "no connection may be attempted";
  // A hub binding every address without TLS does not start.
  auto hub = Kiln(cache_, "hub --data " + root_ + "/open-hub --bind 0.0.0.0 --port 0");
  EXPECT_NE(hub.first, 0);
  EXPECT_NE(hub.second.find("insecure_http_refused"), std::string::npos) << hub.second;
  // A worker whose manifest names a remote hub over http:// does not boot.
  ManifestOptions o;
  o.hub_url = "http://192.0.2.10:8470";
  Worker w(root_ + "/w", Manifest(o));
  auto started = w.Start();
  EXPECT_FALSE(started);
  EXPECT_NE(w.Log().find("insecure_http_refused"), std::string::npos) << w.Log();
}

TEST_F(TransportTest, WorkerAdminNeedsTheOperatorTokenOnItsOwnListener) {
  auto w = MlpWorker();
  ASSERT_TRUE(StartOnCache(*w));
  const nlohmann::json order = {{"target", "mlp"}, {"on", true}, {"reason", "attack"}};
  // Not on the serving listener at all.
  EXPECT_EQ(w->Post("/v1/admin/eager-only", order).status, 404);
  // On the admin listener, only with the token.
  EXPECT_EQ(w->Admin("/v1/admin/eager-only", order, "").status, 401);
  EXPECT_EQ(w->Admin("/v1/admin/eager-only", order, "guess").status, 401);
  auto x = ReadNpy(ExampleDir("mlp") + "inputs/x.npy");
  ASSERT_TRUE(x.ok());
  EXPECT_EQ(w->Infer("mlp", {{"x", *x}}).mode(), "aot_cell") << "a refused order changed nothing";
  EXPECT_EQ(w->Admin("/v1/admin/eager-only", order).status, 200);
  EXPECT_EQ(w->Infer("mlp", {{"x", *x}}).mode(), "eager");
  // An admin listener without a token does not start.
  auto none =
      Kiln(root_, "worker --manifest " + ExampleDir("mlp") + "kiln.toml --port 0 --admin-port 0");
  EXPECT_NE(none.first, 0);
  EXPECT_NE(none.second.find("needs an operator token"), std::string::npos) << none.second;
}

TEST_F(TransportTest, CheckpointPathTraversalIsRefusedAndNothingLeaks) {
  auto w = MlpWorker();
  ASSERT_TRUE(StartOnCache(*w));
  // /etc/shadow exists on this machine; /etc/kiln-absent does not. Links planted inside the
  // checkpoint directory point at both, and at a readable secret beside the directory.
  const std::string secret = root_ + "/w/secret.txt";
  ASSERT_TRUE(WriteFileAtomic(secret, "TOP-SECRET-CONTENT").ok());
  const std::string dir = w->CheckpointDir();
  std::filesystem::create_symlink("/etc/shadow", dir + "/shadow.safetensors");
  std::filesystem::create_symlink("/etc/kiln-absent", dir + "/absent.safetensors");
  std::filesystem::create_symlink("../secret.txt", dir + "/secret.safetensors");
  std::map<std::string, std::string> answers;
  for (const std::string path :
       {"/etc/shadow", "/etc/kiln-absent", "../../../../etc/shadow", "../secret.txt",
        "ok/../../secret.txt", "shadow.safetensors", "absent.safetensors", "secret.safetensors"}) {
    auto a = w->Admin("/v1/admin/checkpoint", {{"target", "mlp"}, {"path", path}});
    EXPECT_EQ(a.status, 403) << path << ": " << a.body.dump();
    EXPECT_EQ(a.body.value("token", ""), "checkpoint_path_refused") << a.body.dump();
    const std::string text = a.body.dump();
    EXPECT_EQ(text.find("TOP-SECRET"), std::string::npos) << text;
    EXPECT_EQ(text.find("root:"), std::string::npos) << text;
    EXPECT_EQ(text.find("bytes"), std::string::npos) << "a size leaked: " << text;
    answers[path] = a.body.value("error", "");
  }
  // An existing and a missing target answer alike: no existence oracle.
  auto same = [&](std::string a, const std::string& an, std::string b, const std::string& bn) {
    a.replace(a.find(an), an.size(), "P");
    b.replace(b.find(bn), bn.size(), "P");
    return a == b;
  };
  EXPECT_TRUE(
      same(answers["/etc/shadow"], "/etc/shadow", answers["/etc/kiln-absent"], "/etc/kiln-absent"));
  EXPECT_TRUE(same(answers["shadow.safetensors"], "shadow.safetensors",
                   answers["absent.safetensors"], "absent.safetensors"));
  // The worker still serves its cell with its own weights.
  auto x = ReadNpy(ExampleDir("mlp") + "inputs/x.npy");
  ASSERT_TRUE(x.ok());
  EXPECT_EQ(w->Infer("mlp", {{"x", *x}}).mode(), "aot_cell");
}

}  // namespace
}  // namespace kiln::worker_testing
