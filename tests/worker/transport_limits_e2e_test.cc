// The transport's limits under attack and at shutdown, with real `kiln hub` and `kiln worker`
// processes on loopback (docs/transport.md, docs/reliability.md "Fault and attack matrix"):
//   - 100 requests with a chunked trailer or headers past their bounds, against the worker and
//     the hub: every one refused 431, a well-behaved client answered fast throughout, nothing
//     counted stuck, and the hub still stops on SIGTERM;
//   - SIGTERM with large infers in flight and more queued: every answer already started arrives
//     whole, every queued request is answered 503 draining;
//   - a 95 MB infer request costs the worker its tensors, not a multiple of its body;
//   - eight addresses holding the connection cap leave room for a ninth.
// Every test is bounded in time and in connections.
#include <onnx/onnx_pb.h>
#include <poll.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "tests/graph/onnx_builder.h"
#include "tests/net/raw_client.h"
#include "tests/worker/worker_process.h"

namespace kiln::worker_testing {
namespace {

using net_testing::RawConn;
using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// Waits up to `ms` for `pid` to exit; its exit code, or -1 (still running: killed).
int WaitExit(pid_t pid, int ms) {
  for (int waited = 0; waited < ms; waited += 10) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid)
      return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  return -1;
}

// The two one-op models these tests serve: `relu` (y = Relu(x), an output as large as its
// input) and `sum` (y = ReduceSum(x, axis 1), an output 1/64 of it); x is float32 [N, 64].
void WriteModel(const std::string& path, bool reduce) {
  testing::OnnxBuilder b;
  b.Input("x", onnx::TensorProto::FLOAT, {-1, 64});
  if (reduce) {
    b.Int64Init("axes", {1}, {1});
    auto& n = b.Node("ReduceSum", {"x", "axes"}, {"y"});
    auto* keep = n.add_attribute();
    keep->set_name("keepdims");
    keep->set_type(onnx::AttributeProto::INT);
    keep->set_i(0);
    b.Output("y", onnx::TensorProto::FLOAT, {-1});
  } else {
    b.Node("Relu", {"x"}, {"y"});
    b.Output("y", onnx::TensorProto::FLOAT, {-1, 64});
  }
  std::string bytes;
  ASSERT_TRUE(b.model().SerializeToString(&bytes));
  ASSERT_TRUE(WriteFileAtomic(path, bytes).ok());
}

// The manifest of model `name` (its graph at `graph`), serving at most `max_concurrency`
// requests at once.
std::string ModelManifest(const std::string& name, const std::string& graph, int max_concurrency) {
  return "[endpoint]\nname = \"" + name +
         "\"\nmax_concurrency = " + std::to_string(max_concurrency) + "\n\n[targets." + name +
         "]\ngraph = \"" + graph + "\"\nlane = \"optional\"\nexport = { family = \"root/" + name +
         "\" }\nenvelope = [ { x = [1, 64] } ]\n\n[functions." + name + "]\ntarget = \"" + name +
         "\"\n";
}

// x[i] for the request bodies below: exact in binary, negative one time in four.
float Element(int64_t i) { return static_cast<float>(i % 200 - 50) / 4.0f; }

// A JSON infer body of `rows` rows of 64 Element(i) values for input x, about 10 bytes each
// (-12.250000).
std::string InferBody(int64_t rows) {
  std::string body = "{\"inputs\":[{\"name\":\"x\",\"shape\":[" + std::to_string(rows) +
                     ",64],\"datatype\":\"FP32\",\"data\":[";
  body.reserve(body.size() + static_cast<size_t>(rows) * 64 * 8);
  char num[32];
  for (int64_t i = 0; i < rows * 64; ++i) {
    const int n = std::snprintf(num, sizeof(num), "%s%.6f", i ? "," : "", Element(i));
    body.append(num, static_cast<size_t>(n));
  }
  return body + "]}]}";
}

std::string InferHead(const std::string& model, uint64_t length) {
  return "POST /v2/models/" + model +
         "/infer HTTP/1.1\r\nHost: t\r\nContent-Length: " + std::to_string(length) + "\r\n\r\n";
}

// Whether `a` is a whole relu answer for InferBody(rows): every element max(x, 0).
::testing::AssertionResult WholeReluAnswer(const RawConn::Answer& a, int64_t rows) {
  if (a.status != 200) {
    return ::testing::AssertionFailure() << "status " << a.status << ": " << a.body.substr(0, 200);
  }
  auto j = nlohmann::json::parse(a.body, nullptr, false);
  if (j.is_discarded()) {
    return ::testing::AssertionFailure() << "a body of " << a.body.size() << " bytes that is not "
                                         << "JSON (cut off?)";
  }
  const auto& data = j["outputs"][0]["data"];
  if (!data.is_array() || static_cast<int64_t>(data.size()) != rows * 64) {
    return ::testing::AssertionFailure() << "an answer with " << data.size() << " values";
  }
  for (int64_t i = 0; i < rows * 64; ++i) {
    if (data[static_cast<size_t>(i)].get<float>() != std::max(Element(i), 0.0f)) {
      return ::testing::AssertionFailure() << "value " << i << " is " << data[i];
    }
  }
  return ::testing::AssertionSuccess();
}

// One machine's cache with cells minted once for the suite (mlp, relu, sum), so workers boot
// `local_hit` and no mint child competes with what these tests measure.
class TransportLimitsTest : public MachinesTest {
 protected:
  static void SetUpTestSuite() {
    char tmpl[] = "/tmp/kiln-transport-limits-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    cache_ = tmpl;
    std::string ref;
    ASSERT_TRUE(Mint(cache_, "mlp", &ref));
    for (const bool reduce : {false, true}) {
      const std::string name = reduce ? "sum" : "relu";
      const std::string dir = cache_ + "/models/" + name;
      ASSERT_TRUE(MakeDirs(dir).ok());
      WriteModel(dir + "/model.onnx", reduce);
      ASSERT_TRUE(
          WriteFileAtomic(dir + "/kiln.toml", ModelManifest(name, dir + "/model.onnx", 8)).ok());
      auto mint = Kiln(cache_, "mint --manifest " + dir + "/kiln.toml");
      ASSERT_EQ(mint.first, 0) << mint.second;
    }
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    std::filesystem::remove_all(cache_, ec);
  }
  // A worker for `model` ("mlp", "relu" or "sum") on the minted cache, serving at most
  // `max_concurrency` requests at once.
  ::testing::AssertionResult StartWorker(std::unique_ptr<Worker>* w, const std::string& model,
                                         int max_concurrency = 4,
                                         std::vector<std::string> args = {}) {
    const std::string dir = root_ + "/w-" + model;
    std::string manifest;
    if (model == "mlp") {
      manifest = Manifest(ManifestOptions());
    } else {
      manifest = ModelManifest(model, cache_ + "/models/" + model + "/model.onnx", max_concurrency);
    }
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    for (const char* sub : {"cells", "toolchain"}) {
      std::filesystem::copy(
          cache_ + "/" + sub, dir + "/" + sub,
          std::filesystem::copy_options::recursive | std::filesystem::copy_options::skip_existing,
          ec);
    }
    *w = std::make_unique<Worker>(dir, manifest, std::map<std::string, std::string>{},
                                  std::move(args));
    return (*w)->Start();
  }
  static std::string cache_;
};
std::string TransportLimitsTest::cache_;

// 100 hostile requests on `port` (`requests` cycled) in ten waves of ten at once, a wave every
// 50 ms, while `probe` measures a well-behaved client every 5 ms until every hostile one is
// answered. Returns the probe's latencies; every hostile answer's status is counted in
// *statuses.
// `probe` alone, every 5 ms for `ms` ms: what this machine gives a client with no attack.
std::vector<double> ProbeAlone(const std::function<double()>& probe, int ms) {
  std::vector<double> out;
  const auto until = Clock::now() + std::chrono::milliseconds(ms);
  while (Clock::now() < until) {
    out.push_back(probe());
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return out;
}

std::vector<double> HostileWhileProbing(int port, const std::vector<std::string>& requests,
                                        const std::function<double()>& probe,
                                        std::map<int, int>* statuses) {
  std::atomic<bool> done{false};
  std::vector<double> ms;
  std::thread prober([&] {
    while (!done.load()) {
      ms.push_back(probe());
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  // Each request fits in the socket's buffer, so one thread puts a wave in flight at once.
  std::vector<RawConn> conns(100);
  for (size_t i = 0; i < conns.size(); ++i) {
    if (i > 0 && i % 10 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_EQ(conns[i].Connect(port), 0);
    EXPECT_TRUE(conns[i].Send(requests[i % requests.size()]));
  }
  for (auto& c : conns) ++(*statuses)[c.Read(10000).status];
  // A little more probing after the last refusal.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  done = true;
  prober.join();
  return ms;
}

// Chunked `head` requests whose body is `body` and then a trailer of one 100 KB field, or of
// 40 fields of 1 KB; and a request with a 100 KB header.
std::vector<std::string> HostileRequests(const std::string& head, const std::string& body) {
  char size[32];
  std::snprintf(size, sizeof(size), "%zx\r\n", body.size());
  const std::string chunked =
      head + "Transfer-Encoding: chunked\r\n\r\n" + size + body + "\r\n0\r\n";
  std::string fields;
  for (int i = 0; i < 40; ++i)
    fields += "X-T" + std::to_string(i) + ": " + std::string(1000, 'f') + "\r\n";
  return {chunked + "X-Trailer: " + std::string(100000, 't') + "\r\n\r\n",
          chunked + fields + "\r\n",
          head + "X-Big: " + std::string(100000, 'h') + "\r\nContent-Length: 0\r\n\r\n"};
}

TEST_F(TransportLimitsTest, TrailersAndHeadersPastTheirBoundsAreRefusedAndTheWorkerStaysFast) {
  std::unique_ptr<Worker> w;
  ASSERT_TRUE(StartWorker(&w, "mlp"));
  const std::string small = nlohmann::json::parse(InferBody(1)).dump();
  const std::string infer = InferHead("mlp", small.size()) + small;
  RawConn good(w->port());
  auto probe = [&] {
    const auto t = Clock::now();
    EXPECT_TRUE(good.Send(infer));
    auto a = good.Read(5000);
    EXPECT_EQ(a.status, 200) << a.body;
    return MsSince(t);
  };
  probe();  // the first call binds the cell's workspace
  const auto alone = ProbeAlone(probe, 1000);
  auto cpu = [&] {
    const std::string stat = hub_testing::ValueOr(
        ReadFile("/proc/" + std::to_string(w->ServingPid()) + "/stat"), std::string());
    std::istringstream in(stat.substr(stat.rfind(')') + 2));
    std::string f;
    long ticks = 0;
    for (int i = 3; i <= 15; ++i) {
      in >> f;
      if (i == 14 || i == 15) ticks += std::stol(f);
    }
    return ticks * 1000.0 / ::sysconf(_SC_CLK_TCK);
  };
  const double cpu0 = cpu();
  std::map<int, int> statuses;
  auto ms = HostileWhileProbing(
      w->port(), HostileRequests("POST /v2/models/mlp/infer HTTP/1.1\r\nHost: t\r\n", small), probe,
      &statuses);
  std::printf(
      "worker, 100 hostile trailers and headers: %d answered 431; %zu probes, infer p50 %.2f ms, "
      "p99 %.2f ms, max %.2f ms (no attack: p50 %.2f ms, max %.2f ms)\n",
      statuses[431], ms.size(), Percentile(ms, 0.5), Percentile(ms, 0.99), Percentile(ms, 1.0),
      Percentile(alone, 0.5), Percentile(alone, 1.0));
  std::printf("worker CPU during the attack and the probes: %.0f ms\n", cpu() - cpu0);
  EXPECT_EQ(statuses[431], 100) << "statuses: " << nlohmann::json(statuses).dump();
  EXPECT_LT(Percentile(ms, 1.0), 50.0);
  // Nothing is stuck: the worker is live and ready, and serves on.
  EXPECT_EQ(w->ReadyStatus(), 200);
  EXPECT_EQ(w->Http()->Get("/v2/health/live")->status, 200);
  auto metrics = w->Http()->Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("kiln_http_handlers_stuck{listener=\"serving\"} 0"),
            std::string::npos);
  EXPECT_NE(
      metrics->body.find("kiln_http_refused_headers_too_large_total{listener=\"serving\"} 100"),
      std::string::npos);
  EXPECT_LT(probe(), 50.0);
}

TEST_F(TransportLimitsTest, TrailersAndHeadersPastTheirBoundsAreRefusedAndTheHubStaysFastAndStops) {
  Hub hub(root_ + "/hub");
  ASSERT_TRUE(hub.Start());
  // Routes that read their body after the token: any valid token will do.
  auto bearer = [](const char* token) {
    return std::string("Host: t\r\nAuthorization: Bearer ") + token + "\r\n";
  };
  std::vector<std::string> requests;
  for (const std::string& head :
       {"POST /v1/publish/intent HTTP/1.1\r\n" + bearer(hub_testing::kPlatform),
        "POST /v1/publish/complete HTTP/1.1\r\n" + bearer(hub_testing::kAcme),
        "POST /v1/events HTTP/1.1\r\n" + bearer(hub_testing::kWorker)}) {
    for (const std::string& r : HostileRequests(head, "{}")) requests.push_back(r);
  }
  const std::string resolve = "GET /v1/cells/ck1-" + std::string(56, 'b') +
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
  probe();
  const auto alone = ProbeAlone(probe, 1000);
  std::map<int, int> statuses;
  auto ms = HostileWhileProbing(hub.port(), requests, probe, &statuses);
  std::printf(
      "hub, 100 hostile trailers and headers: %d answered 431; %zu probes, resolve p50 %.2f ms, "
      "p99 %.2f ms, max %.2f ms (no attack: p50 %.2f ms, max %.2f ms)\n",
      statuses[431], ms.size(), Percentile(ms, 0.5), Percentile(ms, 0.99), Percentile(ms, 1.0),
      Percentile(alone, 0.5), Percentile(alone, 1.0));
  EXPECT_EQ(statuses[431], 100) << "statuses: " << nlohmann::json(statuses).dump();
  EXPECT_LT(Percentile(ms, 1.0), 50.0);
  EXPECT_TRUE(hub.Client(hub_testing::kWorker)->Call("GET", "/v1/health").ok());
  EXPECT_TRUE(hub.Client(hub_testing::kWorker)->Call("GET", "/v1/ready").ok());
  // SIGTERM with a keep-alive connection open: the hub drains and exits at once.
  const auto t = Clock::now();
  ::kill(hub.pid(), SIGTERM);
  EXPECT_EQ(WaitExit(hub.pid(), 10000), 0);
  std::printf("hub stopped %.0f ms after SIGTERM\n", MsSince(t));
  EXPECT_LT(MsSince(t), 5000);
  hub.process().Forget();
}

// Reads one answer from `c` after waiting `delay_ms` (an answer held up in the socket meanwhile).
RawConn::Answer ReadLater(RawConn& c, int delay_ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
  return c.Read(60000);
}

TEST_F(TransportLimitsTest, SigtermFinishesEveryStartedAnswerAndAnswersEveryQueuedRequest) {
  std::unique_ptr<Worker> w;
  ASSERT_TRUE(StartWorker(&w, "relu", 8));
  constexpr int64_t kRows = 30000;  // about 10 MB of JSON each way
  const std::string body = InferBody(kRows);
  const std::string head = InferHead("relu", body.size());
  // Four answers computed and streaming: their clients do not read yet, so each answer is stuck
  // in the socket partway.
  std::vector<RawConn> streaming(4);
  {
    std::vector<std::thread> send;
    for (auto& c : streaming) {
      ASSERT_EQ(c.Connect(w->port()), 0);
      send.emplace_back([&c, &head, &body] { c.Send(head) && c.Send(body); });
    }
    for (auto& t : send) t.join();
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  // Eight handlers running: they hold the eight slots, half their body read. The halves go out
  // at once: sent one after another on a slow (sanitizer) build, the first connection's body could
  // sit idle past the worker's 10 s body deadline before its second half.
  std::vector<RawConn> running(8);
  {
    const std::string first_half = head + body.substr(0, body.size() / 2);
    std::atomic<int> sent{0};
    std::vector<std::thread> send;
    for (auto& c : running) {
      ASSERT_EQ(c.Connect(w->port()), 0);
      send.emplace_back([&c, &first_half, &sent] { sent += c.Send(first_half) ? 1 : 0; });
    }
    for (auto& t : send) t.join();
    ASSERT_EQ(sent.load(), 8);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(800));
  // Eight more wait for a slot.
  const std::string small = InferBody(2);
  std::vector<RawConn> queued(8);
  for (auto& c : queued) {
    ASSERT_EQ(c.Connect(w->port()), 0);
    ASSERT_TRUE(c.Send(InferHead("relu", small.size()) + small));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));

  const auto t = Clock::now();
  ASSERT_EQ(::kill(w->pid(), SIGTERM), 0);
  std::vector<RawConn::Answer> a_stream(4), a_run(8), a_queued(8);
  std::vector<std::thread> clients;
  for (size_t i = 0; i < streaming.size(); ++i) {
    clients.emplace_back([&, i] { a_stream[i] = ReadLater(streaming[i], 1000); });
  }
  for (size_t i = 0; i < running.size(); ++i) {
    clients.emplace_back([&, i] {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      running[i].Send(body.substr(body.size() / 2));
      a_run[i] = running[i].Read(60000);
    });
  }
  for (size_t i = 0; i < queued.size(); ++i) {
    clients.emplace_back([&, i] { a_queued[i] = queued[i].Read(60000); });
  }
  for (auto& c : clients) c.join();
  const int code = WaitExit(w->pid(), 60000);
  const double stop_ms = MsSince(t);
  w->Forget();
  int whole = 0, draining = 0;
  for (const auto& a : a_stream) {
    EXPECT_TRUE(WholeReluAnswer(a, kRows));
    whole += WholeReluAnswer(a, kRows) ? 1 : 0;
  }
  for (const auto& a : a_run) {
    EXPECT_TRUE(WholeReluAnswer(a, kRows));
    whole += WholeReluAnswer(a, kRows) ? 1 : 0;
  }
  for (const auto& a : a_queued) {
    EXPECT_EQ(a.status, 503) << a.body;
    EXPECT_NE(a.body.find("draining"), std::string::npos) << a.body;
    EXPECT_FALSE(a.headers.count("retry-after") == 0) << "no Retry-After";
    draining += a.status == 503 ? 1 : 0;
  }
  std::printf(
      "SIGTERM with 4 answers streaming, 8 handlers running and 8 queued: %d of 12 answers whole, "
      "%d of 8 queued answered 503 draining; the worker exited %d after %.0f ms\n",
      whole, draining, code, stop_ms);
  EXPECT_EQ(code, 0);
  // Everything was answered well within the drain's 30 s: the worker does not wait them out.
  EXPECT_LT(stop_ms, 20000) << w->Log().substr(w->Log().size() > 3000 ? w->Log().size() - 3000 : 0);
}

TEST_F(TransportLimitsTest, NinetyFiveMegabyteRequestCostsAtMostItsTensorBytes) {
  constexpr int64_t kRows = 150000;
  const std::string body = InferBody(kRows);
  ASSERT_GT(body.size(), 90u << 20);
  const long tensor_kb = kRows * 64 * 4 / 1024;
  long growth[2] = {0, 0};
  for (const bool reduce : {true, false}) {
    const std::string model = reduce ? "sum" : "relu";
    std::unique_ptr<Worker> w;
    ASSERT_TRUE(StartWorker(&w, model));
    // Warm up: the first request maps the eager path's code and buffers.
    {
      RawConn c(w->port());
      const std::string warm = InferBody(1000);
      ASSERT_TRUE(c.Send(InferHead(model, warm.size()) + warm));
      ASSERT_EQ(c.Read(30000).status, 200);
    }
    const pid_t pid = w->ServingPid();
    const long hwm0 = StatusKb(pid, "VmHWM");
    RawConn c(w->port());
    const auto start = Clock::now();
    std::thread writer([&] { c.Send(InferHead(model, body.size())) && c.Send(body); });
    auto a = c.Read(180000);
    writer.join();
    const double ms = MsSince(start);
    const long hwm1 = StatusKb(pid, "VmHWM");
    ASSERT_EQ(a.status, 200) << a.body.substr(0, 300);
    auto j = nlohmann::json::parse(a.body, nullptr, false);
    ASSERT_FALSE(j.is_discarded());
    if (reduce) {
      EXPECT_EQ(j["outputs"][0]["shape"], nlohmann::json({kRows}));
      EXPECT_FLOAT_EQ(j["outputs"][0]["data"][0].get<float>(), [] {
        float s = 0;
        for (int64_t i = 0; i < 64; ++i) s += Element(i);
        return s;
      }());
    } else {
      EXPECT_TRUE(WholeReluAnswer(a, kRows));
    }
    growth[reduce ? 0 : 1] = hwm1 - hwm0;
    std::printf(
        "95 MB infer body (%zu bytes), model %s: answered %d in %.0f ms (%zu bytes); peak RSS "
        "%+ld kB = %.2fx its input tensor (%ld kB)\n",
        body.size(), model.c_str(), a.status, ms, a.body.size(), hwm1 - hwm0,
        static_cast<double>(hwm1 - hwm0) / tensor_kb, tensor_kb);
  }
#if defined(__SANITIZE_ADDRESS__)
  // Under AddressSanitizer freed chunks wait in its quarantine and every byte has shadow.
  EXPECT_LT(growth[0], 2 * tensor_kb + 64 * 1024);
#else
  // A reduction's answer is small: the request costs its input tensor, at most 1.2x.
  EXPECT_LT(growth[0], tensor_kb * 12 / 10);
  // An output as large as the input: both tensors, and no text of either.
  EXPECT_LT(growth[1], tensor_kb * 22 / 10);
#endif
}

TEST_F(TransportLimitsTest, EightAddressesHoldingTheConnectionCapLeaveRoomForANinth) {
  // 8 x 1024 connections: this process needs the descriptors, the hub raises its own limit.
  rlimit rl{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &rl), 0);
  if (rl.rlim_max < 9400) GTEST_SKIP() << "RLIMIT_NOFILE hard limit " << rl.rlim_max << " < 9400";
  rl.rlim_cur = rl.rlim_max;
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &rl), 0);
  Hub hub(root_ + "/hub");
  hub.process().AddArgs({"--header-timeout-ms", "60000"});
  ASSERT_TRUE(hub.Start());
  // Eight addresses, each at its per-address cap of 1024: 8192 connections, the global cap.
  std::vector<RawConn> held(8 * 1024);
  const auto t = Clock::now();
  for (size_t i = 0; i < held.size(); ++i) {
    const std::string from = "127.0.0." + std::to_string(2 + i / 1024);
    ASSERT_EQ(held[i].Connect(hub.port(), from.c_str()), 0) << i;
  }
  std::printf("8 addresses opened %zu connections in %.0f ms\n", held.size(), MsSince(t));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  // A ninth address gets in and is answered.
  RawConn ninth;
  ASSERT_EQ(ninth.Connect(hub.port(), "127.0.0.10"), 0);
  const auto asked = Clock::now();
  ASSERT_TRUE(ninth.Send("GET /v1/health HTTP/1.1\r\nHost: t\r\n\r\n"));
  auto a = ninth.Read(5000);
  EXPECT_EQ(a.status, 200) << a.body;
  std::printf("a ninth address, with 8 x 1024 connections held: %d in %.1f ms\n", a.status,
              MsSince(asked));
  // A heavy address is turned away with its 503.
  RawConn heavy;
  ASSERT_EQ(heavy.Connect(hub.port(), "127.0.0.3"), 0);
  ASSERT_TRUE(heavy.Send("GET /v1/health HTTP/1.1\r\nHost: t\r\n\r\n"));
  auto h = heavy.Read(5000);
  EXPECT_EQ(h.status, 503) << h.body;
  EXPECT_NE(h.body.find("too_many_connections"), std::string::npos) << h.body;
}

}  // namespace
}  // namespace kiln::worker_testing
