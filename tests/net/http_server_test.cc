// Tests for the net layer (src/kiln/net/): the HttpServer in this process on a loopback port, hit
// with plain sockets that misbehave on purpose (tests/net/raw_client.h) and with cpp-httplib's
// HTTPS client against a CA made at test time (tests/net/test_certs.h); and the loopback/URL rules.
#include "src/kiln/net/http_server.h"

#include <gtest/gtest.h>
#include <httplib.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <thread>

#include "src/kiln/net/address.h"
#include "tests/net/raw_client.h"
#include "tests/net/test_certs.h"

namespace kiln::net {
namespace {

using net_testing::RawConn;
using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

Route MakeRoute(std::string method, std::string pattern, uint64_t max_body, Handler h,
                bool on_loop = false) {
  Route r;
  r.method = std::move(method);
  r.pattern = std::move(pattern);
  r.max_body_bytes = max_body;
  r.on_event_loop = on_loop;
  r.handler = std::move(h);
  return r;
}

struct Counters {
  std::atomic<int> handled{0};
  std::atomic<uint64_t> body_bytes{0};
};

// A server with: GET /echo/{}/x (captures and query), POST /small (1 KiB, reads its body),
// POST /refuse (64 MiB, answers 401 without reading), POST /big (1 GiB, reads its body),
// GET /block (waits until released), GET /live (on the event loop).
class ServerTest : public ::testing::Test {
 protected:
  std::unique_ptr<HttpServer> Start(ServerOptions o) {
    std::vector<Route> routes;
    routes.push_back(MakeRoute("GET", "/echo/{}/x", 0, [this](const Request& req, Body&) {
      ++c_.handled;
      std::string q;
      for (const auto& [k, v] : req.query) q += k + "=" + v + ";";
      return Response::Text(200, req.captures[0] + "|" + q, "text/plain");
    }));
    routes.push_back(MakeRoute("POST", "/small", 1024, [this](const Request&, Body& body) {
      ++c_.handled;
      auto all = body.ReadAll(1024);
      if (!all.ok()) return Response::Text(400, all.status().token(), "text/plain");
      c_.body_bytes += all->size();
      return Response::Text(200, std::to_string(all->size()), "text/plain");
    }));
    routes.push_back(MakeRoute("POST", "/refuse", 64 << 20, [this](const Request&, Body&) {
      ++c_.handled;
      return Response::Text(401, "no", "text/plain");
    }));
    routes.push_back(MakeRoute("POST", "/big", uint64_t{1} << 30, [this](const Request&, Body& b) {
      ++c_.handled;
      char buf[65536];
      uint64_t total = 0;
      while (true) {
        auto n = b.Read(buf, sizeof(buf));
        if (!n.ok()) return Response::Text(408, n.status().token(), "text/plain");
        if (*n == 0) break;
        total += *n;
      }
      c_.body_bytes += total;
      return Response::Text(200, std::to_string(total), "text/plain");
    }));
    routes.push_back(MakeRoute("GET", "/block", 0, [this](const Request&, Body&) {
      ++c_.handled;
      while (!release_.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      return Response::Text(200, "released", "text/plain");
    }));
    routes.push_back(MakeRoute(
        "GET", "/live", 0,
        [](const Request&, Body&) { return Response::Text(200, "ok", "text/plain"); }, true));
    auto s = HttpServer::Create(std::move(o), std::move(routes));
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    if (!s.ok()) return nullptr;
    EXPECT_TRUE((*s)->Start().ok());
    return std::move(s).value();
  }
  void TearDown() override { release_ = true; }

  Counters c_;
  std::atomic<bool> release_{false};
};

TEST_F(ServerTest, RoutesCapturesQueryKeepAliveAndTypedMisses) {
  auto s = Start(ServerOptions());
  RawConn c(s->port());
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(c.Send("GET /echo/a%2Fb/x?k=v+w&z=%41 HTTP/1.1\r\nHost: x\r\n\r\n"));
  auto a = c.Read(5000);
  EXPECT_EQ(a.status, 200);
  EXPECT_EQ(a.body, "a/b|k=v w;z=A;");
  // The same connection carries the next request (keep-alive).
  ASSERT_TRUE(c.Send("GET /nope HTTP/1.1\r\nHost: x\r\n\r\n"));
  auto miss = c.Read(5000);
  EXPECT_EQ(miss.status, 404);
  EXPECT_NE(miss.body.find("\"error\":\"not_found\""), std::string::npos) << miss.body;
  ASSERT_TRUE(c.Send("POST /echo/a/x HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"));
  auto method = c.Read(5000);
  EXPECT_EQ(method.status, 405);
  EXPECT_EQ(method.headers["allow"], "GET");
  ASSERT_TRUE(c.Send("GET /echo/a/x HTTP/1.1\r\nHost: x\r\n\r\n"));
  EXPECT_EQ(c.Read(5000).status, 200);
  // Not HTTP at all: 400, and the connection ends.
  RawConn junk(s->port());
  ASSERT_TRUE(junk.Send("\x01\x02 garbage\r\n\r\n"));
  auto bad = junk.Read(5000);
  EXPECT_EQ(bad.status, 400);
}

TEST_F(ServerTest, ContentLengthOverTheLimitIs413AtOnceAndTheBodyIsNeverRead) {
  auto s = Start(ServerOptions());
  RawConn c(s->port());
  const auto start = Clock::now();
  ASSERT_TRUE(c.Send("POST /small HTTP/1.1\r\nHost: x\r\nContent-Length: 1073741824\r\n\r\n" +
                     std::string(4096, 'a')));
  auto a = c.Read(5000);
  EXPECT_EQ(a.status, 413);
  EXPECT_LT(MsSince(start), 2000);
  EXPECT_EQ(a.headers["connection"], "close");
  EXPECT_NE(a.body.find("takes at most 1024 body bytes; Content-Length is 1073741824"),
            std::string::npos)
      << a.body;
  EXPECT_EQ(c_.handled.load(), 0) << "the handler must not run for a refused length";
  // A length that does not parse is a 400, not a hang.
  RawConn neg(s->port());
  ASSERT_TRUE(neg.Send("POST /small HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n"));
  EXPECT_EQ(neg.Read(5000).status, 400);
  EXPECT_EQ(s->stats().refused_too_large, 1u);
}

TEST_F(ServerTest, ARefusalReadsNoBodyAndNeverSays100Continue) {
  auto s = Start(ServerOptions());
  // A handler that refuses: no 100 Continue, the answer, then the connection ends.
  RawConn c(s->port());
  ASSERT_TRUE(
      c.Send("POST /refuse HTTP/1.1\r\nHost: x\r\nContent-Length: 60000000\r\nExpect: "
             "100-continue\r\n\r\n"));
  int interim = 0;
  auto a = c.Read(5000, &interim);
  EXPECT_EQ(a.status, 401);
  EXPECT_EQ(interim, 0);
  EXPECT_EQ(a.headers["connection"], "close");
  EXPECT_TRUE(c.ClosedWithin(5000));
  // A handler that reads: 100 Continue first, then the body is read.
  RawConn d(s->port());
  ASSERT_TRUE(d.Send(
      "POST /small HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n"));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_TRUE(d.Send("hello"));
  interim = 0;
  auto b = d.Read(5000, &interim);
  EXPECT_EQ(b.status, 200);
  EXPECT_EQ(b.body, "5");
  EXPECT_EQ(interim, 1);
}

TEST_F(ServerTest, ChunkedBodyIsCutOffAtTheRouteLimit) {
  auto s = Start(ServerOptions());
  RawConn c(s->port());
  std::string chunk(800, 'z');
  char size[32];
  std::snprintf(size, sizeof(size), "%zx\r\n", chunk.size());
  ASSERT_TRUE(c.Send("POST /small HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" +
                     std::string(size) + chunk + "\r\n" + size + chunk + "\r\n0\r\n\r\n"));
  auto a = c.Read(5000);
  EXPECT_EQ(a.status, 400);
  EXPECT_EQ(a.body, "body_too_large");
}

TEST_F(ServerTest, SlowHeadersAndSilentConnectionsAreCutWithoutHoldingAThread) {
  ServerOptions o;
  o.handler_threads = 1;
  o.header_timeout_ms = 400;
  auto s = Start(o);
  // Ten slowloris clients drip one header byte every 100 ms; two connections say nothing.
  std::vector<RawConn> slow(10);
  for (auto& c : slow) ASSERT_EQ(c.Connect(s->port()), 0);
  RawConn silent(s->port()), silent2(s->port());
  const std::string request =
      "GET /echo/a/x HTTP/1.1\r\nHost: x\r\nX-Pad: aaaaaaaaaaaaaaaa\r\n\r\n";
  const auto start = Clock::now();
  bool all_closed = false;
  for (size_t i = 0; i < request.size() && !all_closed; ++i) {
    all_closed = true;
    for (auto& c : slow) all_closed = !c.Send(request.substr(i, 1)) && all_closed;
    // The one handler thread still serves a well-behaved client at once.
    RawConn good(s->port());
    ASSERT_TRUE(good.Send("GET /echo/g/x HTTP/1.1\r\nHost: x\r\n\r\n"));
    auto a = good.Read(2000);
    ASSERT_EQ(a.status, 200) << "request " << i;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (MsSince(start) > 3000) break;
  }
  for (auto& c : slow) EXPECT_TRUE(c.ClosedWithin(2000));
  EXPECT_TRUE(silent.ClosedWithin(2000));
  EXPECT_TRUE(silent2.ClosedWithin(2000));
  EXPECT_LT(MsSince(start), 5000);
  EXPECT_GE(s->stats().header_timeouts, 12u);
}

TEST_F(ServerTest, IdleKeepAliveIsClosedAfterItsDeadline) {
  ServerOptions o;
  o.keepalive_idle_ms = 300;
  auto s = Start(o);
  RawConn c(s->port());
  ASSERT_TRUE(c.Send("GET /echo/a/x HTTP/1.1\r\nHost: x\r\n\r\n"));
  ASSERT_EQ(c.Read(2000).status, 200);
  const auto start = Clock::now();
  EXPECT_TRUE(c.ClosedWithin(3000));
  EXPECT_GE(MsSince(start), 250);
}

TEST_F(ServerTest, SlowBodyFailsAtTheBodyDeadline) {
  ServerOptions o;
  o.body_idle_timeout_ms = 300;
  auto s = Start(o);
  RawConn c(s->port());
  ASSERT_TRUE(c.Send("POST /big HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc"));
  auto a = c.Read(3000);
  EXPECT_EQ(a.status, 408);
  EXPECT_EQ(a.body, "body_timeout");
  EXPECT_EQ(s->stats().body_timeouts, 1u);
}

TEST_F(ServerTest, PerClientConnectionCapAnswers503WithRetryAfter) {
  ServerOptions o;
  o.max_connections_per_client = 4;
  o.retry_after_s = 7;
  auto s = Start(o);
  std::vector<RawConn> held(4);
  for (auto& c : held) ASSERT_EQ(c.Connect(s->port()), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  RawConn over(s->port());
  ASSERT_TRUE(over.Send("GET /echo/a/x HTTP/1.1\r\nHost: x\r\n\r\n"));
  auto a = over.Read(3000);
  EXPECT_EQ(a.status, 503);
  EXPECT_EQ(a.headers["retry-after"], "7");
  EXPECT_NE(a.body.find("too_many_connections"), std::string::npos) << a.body;
  held.clear();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  RawConn again(s->port());
  ASSERT_TRUE(again.Send("GET /echo/a/x HTTP/1.1\r\nHost: x\r\n\r\n"));
  EXPECT_EQ(again.Read(3000).status, 200);
}

TEST_F(ServerTest, SaturatedHandlersAnswer503WithRetryAfterAndTheEventLoopStillAnswers) {
  ServerOptions o;
  o.handler_threads = 1;
  o.max_queued = 1;
  auto s = Start(o);
  RawConn busy(s->port()), queued(s->port()), over(s->port()), live(s->port());
  ASSERT_TRUE(busy.Send("GET /block HTTP/1.1\r\nHost: x\r\n\r\n"));
  while (c_.handled.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_TRUE(queued.Send("GET /echo/q/x HTTP/1.1\r\nHost: x\r\n\r\n"));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_TRUE(over.Send("GET /echo/o/x HTTP/1.1\r\nHost: x\r\n\r\n"));
  auto a = over.Read(3000);
  EXPECT_EQ(a.status, 503);
  EXPECT_EQ(a.headers["retry-after"], "1");
  ASSERT_TRUE(live.Send("GET /live HTTP/1.1\r\nHost: x\r\n\r\n"));
  EXPECT_EQ(live.Read(3000).status, 200);
  release_ = true;
  EXPECT_EQ(busy.Read(3000).status, 200);
  EXPECT_EQ(queued.Read(3000).status, 200);
  EXPECT_EQ(s->stats().refused_saturated, 1u);
}

TEST_F(ServerTest, ThousandIdleConnectionsCostNoThreads) {
  ServerOptions o;
  o.handler_threads = 2;
  auto s = Start(o);
  auto threads = [] {
    int n = 0;
    for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) {
      (void)e;
      ++n;
    }
    return n;
  };
  const int before = threads();
  std::vector<RawConn> idle(1000);
  for (auto& c : idle) ASSERT_EQ(c.Connect(s->port()), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(threads(), before);
  EXPECT_EQ(s->stats().connections_open, 1000u);
  RawConn good(s->port());
  ASSERT_TRUE(good.Send("GET /echo/a/x HTTP/1.1\r\nHost: x\r\n\r\n"));
  EXPECT_EQ(good.Read(3000).status, 200);
}

TEST(HttpServerCreate, PlainHttpOnANonLoopbackAddressIsRefused) {
  ServerOptions o;
  o.bind = "0.0.0.0";
  auto refused = HttpServer::Create(o, {});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().token(), "insecure_http_refused");
  EXPECT_NE(refused.status().message().find("--insecure-http"), std::string::npos);
  o.insecure_http = true;
  auto allowed = HttpServer::Create(o, {});
  EXPECT_TRUE(allowed.ok()) << allowed.status().ToString();
  ServerOptions tls;
  tls.tls = TlsOptions{"/nonexistent.crt", "/nonexistent.key", 0};
  auto missing = HttpServer::Create(tls, {});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent.crt"), std::string::npos);
}

class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "net_tls_" + std::to_string(::getpid());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

// The status of GET /hello over HTTPS verifying against `ca` (0: the connection failed).
int GetOverTls(int port, const std::string& ca) {
  httplib::SSLClient c("localhost", port);
  c.set_ca_cert_path(ca.c_str());
  c.enable_server_certificate_verification(true);
  c.set_connection_timeout(3, 0);
  c.set_read_timeout(3, 0);
  auto r = c.Get("/hello");
  return r ? r->status : 0;
}

TEST_F(TlsTest, ServesHttpsAndReloadsARotatedCertificateWithoutRestart) {
  net_testing::TestCa first(dir_, "first"), second(dir_, "second");
  const auto files = first.Issue("server", 2);
  ServerOptions o;
  o.tls = TlsOptions{files.cert, files.key, 100};
  auto s = HttpServer::Create(o, {MakeRoute("GET", "/hello", 0, [](const Request& r, Body&) {
                                return Response::Text(200, r.tls ? "tls" : "plain", "text/plain");
                              })});
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_TRUE((*s)->Start().ok());
  const int port = (*s)->port();
  EXPECT_EQ(GetOverTls(port, first.ca_path()), 200);
  EXPECT_EQ(GetOverTls(port, second.ca_path()), 0) << "a client of another CA must refuse";
  // Plain HTTP to the TLS port gets no answer.
  RawConn plain(port);
  ASSERT_TRUE(plain.Send("GET /hello HTTP/1.1\r\nHost: x\r\n\r\n"));
  EXPECT_EQ(plain.Read(2000).status, 0);

  // Rotate to a certificate of the second CA: the files change, the server notices.
  second.Issue("server", 3);
  bool rotated = false;
  for (int i = 0; i < 100 && !rotated; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    rotated = GetOverTls(port, second.ca_path()) == 200;
  }
  EXPECT_TRUE(rotated) << "the rotated certificate was not picked up";
  EXPECT_EQ(GetOverTls(port, first.ca_path()), 0);
  EXPECT_GE((*s)->stats().tls_reloads, 1u);
  // A broken pair keeps the certificate in use.
  {
    FILE* f = std::fopen(files.key.c_str(), "w");
    std::fputs("not a key", f);
    std::fclose(f);
  }
  EXPECT_FALSE((*s)->ReloadTls().ok());
  EXPECT_EQ(GetOverTls(port, second.ca_path()), 200);
}

TEST(Address, LoopbackIsDecidedOnTheTextAlone) {
  for (const char* h : {"localhost", "LOCALHOST", "127.0.0.1", "127.1.2.3", "::1", "[::1]"}) {
    EXPECT_TRUE(IsLoopbackHost(h)) << h;
  }
  for (const char* h : {"0.0.0.0", "10.0.0.1", "128.0.0.1", "hub.internal", "localhost.evil.com",
                        "::", "::ffff:127.0.0.1x", ""}) {
    EXPECT_FALSE(IsLoopbackHost(h)) << h;
  }
}

TEST(Address, UrlsAndTheTransportRule) {
  auto u = ParseHttpUrl("https://hub.internal:8443/");
  ASSERT_TRUE(u.ok()) << u.status().ToString();
  EXPECT_TRUE(u->https());
  EXPECT_EQ(u->host, "hub.internal");
  EXPECT_EQ(u->port, 8443);
  EXPECT_EQ(u->base, "https://hub.internal:8443");
  auto v6 = ParseHttpUrl("http://[::1]:80");
  ASSERT_TRUE(v6.ok());
  EXPECT_EQ(v6->host, "::1");
  for (const char* bad : {"ftp://x", "http://", "http://x:0", "http://x:99999", "http://x/path",
                          "http://u@x", "hub.internal:80", "http://x:8a"}) {
    EXPECT_FALSE(ParseHttpUrl(bad).ok()) << bad;
  }
  EXPECT_TRUE(CheckClientTransport(*ParseHttpUrl("http://127.0.0.1:1"), false, "hub").ok());
  EXPECT_TRUE(CheckClientTransport(*ParseHttpUrl("https://10.0.0.1:1"), false, "hub").ok());
  Status plain = CheckClientTransport(*ParseHttpUrl("http://10.0.0.1:1"), false, "hub");
  EXPECT_TRUE(plain.Is("insecure_http_refused")) << plain.ToString();
  EXPECT_TRUE(CheckClientTransport(*ParseHttpUrl("http://10.0.0.1:1"), true, "hub").ok());
}

}  // namespace
}  // namespace kiln::net
