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
// GET /block (waits until released), GET /live (on the event loop), POST /read (reads its body,
// 431 for a trailer past its bound), GET /stall (waits, 300 ms deadline), POST /drip (reads a
// dripped body, 300 ms deadline), GET /stream (an 8 MiB streamed answer).
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
    // Reads its whole body; a refused read answers 431 for headers_too_large, else 400, with
    // the refusal's token as the body.
    routes.push_back(MakeRoute("POST", "/read", 1 << 20, [this](const Request&, Body& body) {
      ++c_.handled;
      auto all = body.ReadAll(1 << 20);
      if (!all.ok()) {
        return Response::Text(all.status().Is("headers_too_large") ? 431 : 400,
                              all.status().token(), "text/plain");
      }
      return Response::Text(200, std::to_string(all->size()), "text/plain");
    }));
    // Blocks until released, with a 300 ms deadline.
    routes.push_back(MakeRoute("GET", "/stall", 0, [this](const Request&, Body&) {
      ++c_.handled;
      while (!release_.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      return Response::Text(200, "released", "text/plain");
    }));
    routes.back().deadline_ms = 300;
    // Reads its body (the client may drip it), with a 300 ms deadline.
    routes.push_back(MakeRoute("POST", "/drip", 1024, [this](const Request&, Body& body) {
      ++c_.handled;
      auto all = body.ReadAll(1024);
      if (!all.ok()) return Response::Text(400, all.status().token(), "text/plain");
      return Response::Text(200, *all, "text/plain");
    }));
    routes.back().deadline_ms = 300;
    // An 8 MiB answer streamed from the event loop: byte i is 'a' + i % 26.
    routes.push_back(MakeRoute("GET", "/stream", 0, [](const Request&, Body&) {
      Response r;
      r.content_type = "application/octet-stream";
      r.stream_length = kStreamBytes;
      r.stream = [](uint64_t offset, char* buf, size_t cap) -> Result<size_t> {
        for (size_t i = 0; i < cap; ++i) buf[i] = static_cast<char>('a' + (offset + i) % 26);
        return cap;
      };
      return r;
    }));
    auto s = HttpServer::Create(std::move(o), std::move(routes));
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    if (!s.ok()) return nullptr;
    EXPECT_TRUE((*s)->Start().ok());
    return std::move(s).value();
  }
  void TearDown() override { release_ = true; }

  static constexpr uint64_t kStreamBytes = 8 << 20;
  Counters c_;
  std::atomic<bool> release_{false};
};

// A chunked POST /read whose body is "hello" and then `tail` (the last chunk and the trailer).
std::string ChunkedRead(const std::string& tail) {
  return "POST /read HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n" +
         tail;
}

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

TEST_F(ServerTest, ARefusedClientThatStaysConnectedIsLetGoAfterTheLinger) {
  auto s = Start(ServerOptions());
  // The client sends a little of a large body, reads its refusal and then just stays connected:
  // the server discards for at most 2 s, then closes.
  RawConn c(s->port());
  ASSERT_TRUE(c.Send("POST /refuse HTTP/1.1\r\nHost: x\r\nContent-Length: 60000000\r\n\r\n" +
                     std::string(1024, 'a')));
  EXPECT_EQ(c.Read(5000).status, 401);
  const auto start = Clock::now();
  while (s->stats().connections_open > 0 && MsSince(start) < 5000) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(s->stats().connections_open, 0u);
  EXPECT_LT(MsSince(start), 3000);
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

TEST_F(ServerTest, TrailersAndChunkLinesPastTheirBoundsAre431AndFreeTheHandler) {
  ServerOptions o;
  o.handler_threads = 2;
  auto s = Start(o);
  std::string many;
  for (int i = 0; i < 40; ++i)
    many += "X-T" + std::to_string(i) + ": " + std::string(1000, 'b') + "\r\n";
  const std::vector<std::pair<std::string, std::string>> attacks = {
      // One trailer field of 100 KB: Beast's field container throws past 64 KiB.
      {"100 KB trailer field", ChunkedRead("0\r\nX-T: " + std::string(100000, 'a') + "\r\n\r\n")},
      // Small enough to be buffered whole, too large for the field container.
      {"64 KiB trailer field", ChunkedRead("0\r\nX-T: " + std::string(65534, 'a') + "\r\n\r\n")},
      {"40 KB of small trailer fields", ChunkedRead("0\r\n" + many + "\r\n")},
      {"100 KB chunk extension",
       "POST /read HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5;e=" +
           std::string(100000, 'c') + "\r\nhello\r\n0\r\n\r\n"},
      {"100 KB header", "POST /read HTTP/1.1\r\nHost: x\r\nX-H: " + std::string(100000, 'h') +
                            "\r\nContent-Length: 0\r\n\r\n"},
  };
  for (const auto& [what, request] : attacks) {
    RawConn c(s->port());
    const auto start = Clock::now();
    ASSERT_TRUE(c.Send(request)) << what;
    auto a = c.Read(5000);
    EXPECT_EQ(a.status, 431) << what << ": " << a.body;
    EXPECT_NE(a.body.find("headers_too_large"), std::string::npos) << what << ": " << a.body;
    EXPECT_LT(MsSince(start), 3000) << what;
  }
  // Twenty at once against two handler threads: every one refused, the handlers free after.
  std::vector<RawConn> flood(20);
  for (auto& c : flood) {
    ASSERT_EQ(c.Connect(s->port()), 0);
    ASSERT_TRUE(c.Send(attacks[0].second));
  }
  for (auto& c : flood) EXPECT_EQ(c.Read(5000).status, 431);
  RawConn good(s->port());
  ASSERT_TRUE(good.Send(ChunkedRead("0\r\nX-Checksum: ok\r\n\r\n")));
  auto a = good.Read(3000);
  EXPECT_EQ(a.status, 200) << a.body;
  EXPECT_EQ(a.body, "5");
  EXPECT_EQ(s->stats().refused_headers_too_large, attacks.size() + flood.size());
  EXPECT_EQ(s->stuck(), 0u);
}

TEST_F(ServerTest, AHandlerPastItsDeadlineIsAnswered503AndCountedStuckUntilItReturns) {
  ServerOptions o;
  o.handler_threads = 1;
  o.retry_after_s = 3;
  auto s = Start(o);
  RawConn running(s->port()), queued(s->port());
  const auto start = Clock::now();
  ASSERT_TRUE(running.Send("GET /stall HTTP/1.1\r\nHost: x\r\n\r\n"));
  while (c_.handled.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  // The one handler thread is taken: this one waits in the queue, under the same deadline.
  ASSERT_TRUE(queued.Send("GET /stall HTTP/1.1\r\nHost: x\r\n\r\n"));
  auto a = running.Read(3000);
  EXPECT_EQ(a.status, 503);
  EXPECT_NE(a.body.find("handler_deadline"), std::string::npos) << a.body;
  EXPECT_EQ(a.headers["retry-after"], "3");
  EXPECT_EQ(a.headers["connection"], "close");
  EXPECT_GE(MsSince(start), 250);
  EXPECT_LT(MsSince(start), 2500);
  auto q = queued.Read(3000);
  EXPECT_EQ(q.status, 503);
  EXPECT_NE(q.body.find("overloaded"), std::string::npos) << q.body;
  EXPECT_EQ(s->stuck(), 1u);
  EXPECT_EQ(s->stats().handler_deadlines, 1u);
  EXPECT_EQ(s->stats().queue_deadlines, 1u);
  // The queued request never reaches a handler; the stuck one returns when released.
  release_ = true;
  for (int i = 0; i < 200 && s->stuck() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(s->stuck(), 0u);
  EXPECT_EQ(c_.handled.load(), 1);
  RawConn after(s->port());
  ASSERT_TRUE(after.Send("GET /echo/a/x HTTP/1.1\r\nHost: x\r\n\r\n"));
  EXPECT_EQ(after.Read(3000).status, 200);
}

TEST_F(ServerTest, TheHandlerDeadlineDoesNotCountTheClientsBodyWaits) {
  auto s = Start(ServerOptions());
  // Four body bytes, one every 200 ms: 800 ms of waiting on the client, past the route's 300 ms
  // deadline, which counts only the handler's own time.
  RawConn c(s->port());
  ASSERT_TRUE(c.Send("POST /drip HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\n"));
  for (char b : std::string("drip")) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    ASSERT_TRUE(c.Send(std::string(1, b)));
  }
  auto a = c.Read(3000);
  EXPECT_EQ(a.status, 200) << a.body;
  EXPECT_EQ(a.body, "drip");
  EXPECT_EQ(s->stats().handler_deadlines, 0u);
}

TEST_F(ServerTest, DrainFinishesStartedAnswersRefusesQueuedOnesAndClosesIdleConnections) {
  ServerOptions o;
  o.handler_threads = 2;
  o.retry_after_s = 2;
  auto s = Start(o);
  // An 8 MiB answer whose client does not read yet: it is being written when the drain begins.
  RawConn streaming(s->port());
  ASSERT_TRUE(streaming.Send("GET /stream HTTP/1.1\r\nHost: x\r\n\r\n"));
  // Two handlers running (each waits for its body), one request queued behind them, one idle
  // connection, one keep-alive connection between requests.
  RawConn run1(s->port()), run2(s->port()), queued(s->port()), idle(s->port()), kept(s->port());
  ASSERT_TRUE(kept.Send("GET /echo/k/x HTTP/1.1\r\nHost: x\r\n\r\n"));
  ASSERT_EQ(kept.Read(3000).status, 200);
  const int before = c_.handled.load();
  ASSERT_TRUE(run1.Send("POST /drip HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\n"));
  ASSERT_TRUE(run2.Send("POST /drip HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\n"));
  while (c_.handled.load() < before + 2) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(queued.Send("GET /echo/q/x HTTP/1.1\r\nHost: x\r\n\r\n"));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));

  bool drained = false;
  std::thread drain([&] { drained = s->Drain(10000); });
  auto q = queued.Read(3000);
  EXPECT_EQ(q.status, 503);
  EXPECT_NE(q.body.find("draining"), std::string::npos) << q.body;
  EXPECT_EQ(q.headers["retry-after"], "2");
  EXPECT_TRUE(idle.ClosedWithin(2000));
  EXPECT_TRUE(kept.ClosedWithin(2000));
  // No new connection is served.
  RawConn late;
  if (late.Connect(s->port()) == 0) {
    late.Send("GET /echo/l/x HTTP/1.1\r\nHost: x\r\n\r\n");
    EXPECT_EQ(late.Read(2000).status, 0);
  }
  // The running handlers finish (their bodies arrive now) and are answered whole.
  ASSERT_TRUE(run1.Send("abcd"));
  ASSERT_TRUE(run2.Send("efgh"));
  auto r1 = run1.Read(3000), r2 = run2.Read(3000);
  EXPECT_EQ(r1.status, 200);
  EXPECT_EQ(r1.body, "abcd");
  EXPECT_EQ(r1.headers["connection"], "close");
  EXPECT_EQ(r2.body, "efgh");
  // The answer that was streaming arrives whole.
  auto big = streaming.Read(10000);
  drain.join();
  EXPECT_EQ(big.status, 200);
  EXPECT_EQ(big.body.size(), kStreamBytes);
  bool intact = big.body.size() == kStreamBytes;
  for (size_t i = 0; i < big.body.size() && intact; ++i) {
    intact = big.body[i] == static_cast<char>('a' + i % 26);
  }
  EXPECT_TRUE(intact);
  EXPECT_TRUE(drained);
  EXPECT_EQ(s->stats().connections_open, 0u);
}

TEST_F(ServerTest, AddressesHoldingFewKeepAReserveOfTheConnectionCap) {
  ServerOptions o;
  o.max_connections = 64;  // a reserve of 8 for addresses holding fewer than 16
  o.max_connections_per_client = 64;
  o.header_timeout_ms = 30000;
  auto s = Start(o);
  auto open = [&] { return s->stats().connections_open; };
  auto wait_open = [&](uint64_t n) {
    for (int i = 0; i < 300 && open() != n; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return open();
  };
  // One address takes everything but the reserve.
  std::vector<RawConn> heavy(56);
  for (auto& c : heavy) ASSERT_EQ(c.Connect(s->port(), "127.0.0.2"), 0);
  ASSERT_EQ(wait_open(56), 56u);
  // Its next connection is refused; a new address still gets in.
  RawConn more;
  ASSERT_EQ(more.Connect(s->port(), "127.0.0.2"), 0);
  ASSERT_TRUE(more.Send("GET /echo/a/x HTTP/1.1\r\nHost: x\r\n\r\n"));
  auto refused = more.Read(3000);
  EXPECT_EQ(refused.status, 503);
  EXPECT_NE(refused.body.find("too_many_connections"), std::string::npos) << refused.body;
  EXPECT_TRUE(more.ClosedWithin(3000));
  ASSERT_EQ(wait_open(56), 56u);
  std::vector<RawConn> light(8);
  for (auto& c : light) {
    ASSERT_EQ(c.Connect(s->port(), "127.0.0.3"), 0);
    ASSERT_TRUE(c.Send("GET /echo/b/x HTTP/1.1\r\nHost: x\r\n\r\n"));
    EXPECT_EQ(c.Read(3000).status, 200);
  }
  ASSERT_EQ(wait_open(64), 64u);
  // At the cap itself, an idle connection of the heaviest address makes room for a newcomer.
  RawConn newcomer;
  ASSERT_EQ(newcomer.Connect(s->port(), "127.0.0.4"), 0);
  ASSERT_TRUE(newcomer.Send("GET /echo/c/x HTTP/1.1\r\nHost: x\r\n\r\n"));
  EXPECT_EQ(newcomer.Read(3000).status, 200);
  EXPECT_EQ(s->stats().evicted_idle, 1u);
  int closed = 0;
  for (auto& c : heavy) closed += c.ClosedWithin(1) ? 1 : 0;
  EXPECT_EQ(closed, 1);
  for (auto& c : light) EXPECT_FALSE(c.ClosedWithin(1));
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
