// HttpServer over Boost.Asio and Boost.Beast (net layer). See http_server.h for the contract.
// This is the only translation unit that includes Beast: its headers take long to compile, and
// everything above sees the small interface in http_server.h.
//
// Threads: `io_threads` run the event loop; every connection has its own strand, so one
// connection's handlers never run concurrently. A request's handler runs on the handler pool; it
// pulls the body by posting a read onto the connection's strand and waiting for it, and hands its
// answer back the same way. Nothing on the event loop blocks.
#define BOOST_BEAST_USE_STD_STRING_VIEW 1

#include "src/kiln/net/http_server.h"

#include <openssl/ssl.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <future>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <unordered_map>

#include "src/kiln/base/log.h"
#include "src/kiln/net/address.h"

namespace kiln::net {

void ListenerSettings::ApplyTo(ServerOptions* so) const {
  so->insecure_http = insecure_http;
  if (!tls_cert.empty() || !tls_key.empty()) so->tls = TlsOptions{tls_cert, tls_key, tls_reload_ms};
  so->max_connections = max_connections;
  so->max_connections_per_client = max_connections_per_client;
  so->header_timeout_ms = header_timeout_ms;
  so->keepalive_idle_ms = keepalive_idle_ms;
  so->body_idle_timeout_ms = body_idle_timeout_ms;
}

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------------------------------------
// Request, Body, Response helpers

namespace {

bool IEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i]))) {
      return false;
    }
  }
  return true;
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Percent-decoding; `plus_is_space` for query strings. A malformed escape is kept as written.
std::string Decode(std::string_view s, bool plus_is_space) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size()) {
      const int hi = HexValue(s[i + 1]), lo = HexValue(s[i + 2]);
      if (hi >= 0 && lo >= 0) {
        out += static_cast<char>(hi * 16 + lo);
        i += 2;
        continue;
      }
    }
    out += (plus_is_space && s[i] == '+') ? ' ' : s[i];
  }
  return out;
}

std::vector<std::string_view> Segments(std::string_view path) {
  std::vector<std::string_view> out;
  size_t at = 0;
  while (at < path.size()) {
    if (path[at] == '/') {
      ++at;
      continue;
    }
    size_t end = path.find('/', at);
    if (end == std::string_view::npos) end = path.size();
    out.push_back(path.substr(at, end - at));
    at = end;
  }
  return out;
}

std::string DefaultErrorJson(const std::string& token, const std::string& message) {
  return nlohmann::json{{"error", token}, {"message", message}}.dump(
      -1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

std::string Request::Header(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (IEquals(k, name)) return v;
  }
  return "";
}

bool Request::HasHeader(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (IEquals(k, name)) return true;
  }
  return false;
}

Result<std::string> Body::ReadAll(size_t limit) {
  std::string out;
  char buf[64 * 1024];
  while (true) {
    KILN_ASSIGN_OR_RETURN(size_t n, Read(buf, sizeof(buf)));
    if (n == 0) return out;
    if (out.size() + n > limit) {
      return Status::Refused(
          StatusCode::kInvalidArgument, kBodyTooLarge,
          "the request body is over the limit of " + std::to_string(limit) + " bytes");
    }
    out.append(buf, n);
  }
}

Response Response::Text(int status, std::string body, std::string content_type) {
  Response r;
  r.status = status;
  r.body = std::move(body);
  r.content_type = std::move(content_type);
  return r;
}

// ---------------------------------------------------------------------------------------------
// The handler pool: a fixed set of threads and a bounded queue.

namespace {

class HandlerPool {
 public:
  HandlerPool(int threads, int max_queued) : state_(std::make_shared<State>()) {
    state_->max_queued = static_cast<size_t>(max_queued);
    state_->live = threads;
    for (int i = 0; i < threads; ++i) threads_.emplace_back([s = state_] { Loop(*s); });
  }
  ~HandlerPool() { Stop(0); }

  // Jobs waiting for a thread now.
  size_t Queued() const {
    std::lock_guard<std::mutex> lock(state_->mu);
    return state_->queue.size();
  }

  // False when the queue is full or the pool is stopping.
  bool TrySubmit(std::function<void()> job) {
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      if (state_->stopping || state_->queue.size() >= state_->max_queued) return false;
      state_->queue.push_back(std::move(job));
    }
    state_->cv.notify_one();
    return true;
  }

  // Runs what is queued (each job decides whether it still has work), then joins. Threads still
  // running a job `grace_ms` after the queue emptied are detached (they hold the pool's state,
  // not the pool) and counted; the number is returned.
  int Stop(int grace_ms) {
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      if (state_->stopping && threads_.empty()) return 0;
      state_->stopping = true;
    }
    state_->cv.notify_all();
    int left = 0;
    {
      std::unique_lock<std::mutex> lock(state_->mu);
      state_->done_cv.wait_for(lock, std::chrono::milliseconds(std::max(0, grace_ms)),
                               [this] { return state_->live == 0; });
      left = state_->live;
    }
    for (auto& t : threads_) {
      if (!t.joinable()) continue;
      if (left == 0) {
        t.join();
      } else {
        t.detach();
      }
    }
    threads_.clear();
    return left;
  }

 private:
  struct State {
    size_t max_queued = 0;
    std::mutex mu;
    std::condition_variable cv, done_cv;
    std::deque<std::function<void()>> queue;
    bool stopping = false;
    int live = 0;  // threads not yet out of Loop
  };

  static void Loop(State& s) {
    while (true) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lock(s.mu);
        s.cv.wait(lock, [&s] { return s.stopping || !s.queue.empty(); });
        if (s.queue.empty()) {
          --s.live;
          s.done_cv.notify_all();
          return;
        }
        job = std::move(s.queue.front());
        s.queue.pop_front();
      }
      job();
    }
  }

  std::shared_ptr<State> state_;
  std::vector<std::thread> threads_;
};

struct CompiledRoute {
  Route route;
  std::vector<std::string> segments;  // "{}" = capture
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Shared state: what connections need, kept alive by each connection so none outlives it.

class SessionBase;

struct Shared {
  ServerOptions options;
  std::vector<CompiledRoute> routes;
  asio::io_context ioc;
  std::unique_ptr<HandlerPool> pool;
  std::atomic<bool> stopping{false};
  std::atomic<bool> draining{false};

  std::mutex tls_mu;
  std::shared_ptr<asio::ssl::context> tls_context;  // guarded by tls_mu

  std::mutex conn_mu;
  std::unordered_map<std::string, int> per_client;          // guarded by conn_mu
  std::map<uint64_t, std::weak_ptr<SessionBase>> sessions;  // guarded by conn_mu
  uint64_t next_session = 0;                                // guarded by conn_mu
  std::condition_variable sessions_cv;

  std::atomic<uint64_t> connections_open{0}, connections_total{0}, requests_total{0},
      refused_over_capacity{0}, refused_saturated{0}, refused_too_large{0}, header_timeouts{0},
      body_timeouts{0}, tls_handshake_failures{0}, tls_reloads{0}, refused_headers_too_large{0},
      queue_deadlines{0}, handler_deadlines{0}, handlers_stuck{0}, evicted_idle{0},
      handlers_abandoned{0};

  explicit Shared(int io_threads) : ioc(io_threads) {}

  std::shared_ptr<asio::ssl::context> TlsContext() {
    std::lock_guard<std::mutex> lock(tls_mu);
    return tls_context;
  }

  Response ErrorResponse(int status, const std::string& token, const std::string& message) const {
    if (options.error_response) return options.error_response(status, token, message);
    return Response::Text(status, DefaultErrorJson(token, message), "application/json");
  }

  // The route for `method path`, its captures in *captures; nullptr with *method_known false for
  // no such path, true for a path known under other methods (*allow lists them).
  const CompiledRoute* Match(const std::string& method, std::string_view path,
                             std::vector<std::string>* captures, bool* path_known,
                             std::string* allow) const {
    const auto segs = Segments(path);
    *path_known = false;
    for (const CompiledRoute& r : routes) {
      if (r.segments.size() != segs.size()) continue;
      std::vector<std::string> caps;
      bool ok = true;
      for (size_t i = 0; i < segs.size() && ok; ++i) {
        if (r.segments[i] == "{}") {
          caps.push_back(Decode(segs[i], false));
          ok = !caps.back().empty();
        } else {
          ok = r.segments[i] == segs[i];
        }
      }
      if (!ok) continue;
      if (r.route.method == method) {
        *captures = std::move(caps);
        return &r;
      }
      *path_known = true;
      if (allow->find(r.route.method) == std::string::npos) {
        *allow += (allow->empty() ? "" : ", ") + r.route.method;
      }
    }
    return nullptr;
  }
};

// ---------------------------------------------------------------------------------------------
// One connection.

class SessionBase : public std::enable_shared_from_this<SessionBase> {
 public:
  explicit SessionBase(std::string peer) : peer_(std::move(peer)) {}
  virtual ~SessionBase() = default;
  // Ends the connection now (server stop). Any thread.
  virtual void Abort() = 0;
  // The server is draining (see http_server.h). Any thread.
  virtual void Drain() = 0;
  // Closes the connection if it is still waiting for a request (room at the connection cap).
  // Any thread.
  virtual void Evict() = 0;
  const std::string& peer() const { return peer_; }
  // Waiting for the first byte of a request: what Evict() may close. Read under conn_mu.
  bool idle() const { return idle_.load(); }

 protected:
  const std::string peer_;
  std::atomic<bool> idle_{false};
};

namespace {

// Set on event-loop threads: a body read from one would wait on itself.
thread_local bool t_event_loop_thread = false;

// What a connection buffers ahead of its parser beyond the header limit: one socket read.
constexpr size_t kReadAheadBytes = 64 * 1024;
// The largest piece one body read hands a handler (it is copied out of the session's buffer),
// and the piece a streamed answer or a linger moves at once. Below malloc's mmap threshold and
// never zero-filled: a connection refused after its first read costs no fresh pages.
constexpr size_t kBodyReadBytes = 64 * 1024;
constexpr size_t kChunkBytes = 64 * 1024;

std::string ReasonPhrase(int status) {
  std::string_view r = http::obsolete_reason(http::int_to_status(static_cast<unsigned>(status)));
  return r.empty() ? "Status" : std::string(r);
}

// Beast's request parser with its fields bounded. Beast keeps every field it parses, trailer
// fields included, in a container that throws on a value over 64 KiB, and does not hold a
// trailer to the header limit. Here a header field goes into the message as before but can never
// throw, and trailer fields (after a chunked body) are counted against `max_trailer_bytes` and
// dropped: no handler reads them.
class RequestParser final : public http::request_parser<http::buffer_body> {
 public:
  explicit RequestParser(uint64_t max_trailer_bytes) : max_trailer_bytes_(max_trailer_bytes) {}

 private:
  void on_field_impl(http::field name, std::string_view name_string, std::string_view value,
                     beast::error_code& ec) override {
    if (is_header_done()) {
      trailer_bytes_ += name_string.size() + value.size() + 4;
      if (trailer_bytes_ > max_trailer_bytes_) ec = http::error::header_limit;
      return;
    }
    try {
      get().insert(name, name_string, value);
    } catch (...) {
      ec = http::error::header_limit;
    }
  }

  const uint64_t max_trailer_bytes_;
  uint64_t trailer_bytes_ = 0;
};

// One body read on behalf of a handler thread. The strand reads into the session's scratch buffer
// and fulfils `done` exactly once (Fulfil); the handler thread copies the bytes out after.
struct BodyRead {
  size_t cap = 0;
  size_t got = 0;
  bool fulfilled = false;  // strand only
  std::promise<Result<size_t>> done;
};

// A queued request's handler job: whoever moves it out of kQueued first owns the request (the
// handler thread runs it; the strand answers it itself at its deadline or at a drain).
enum JobState : int { kJobQueued = 0, kJobRunning = 1, kJobCancelled = 2 };

template <class Stream>
class Session final : public SessionBase, public Body {
 public:
  static constexpr bool kTls = !std::is_same_v<Stream, beast::tcp_stream>;

  Session(std::shared_ptr<Shared> shared, tcp::socket socket, std::string peer, bool over_capacity,
          std::shared_ptr<asio::ssl::context> tls)
      : SessionBase(std::move(peer)),
        shared_(std::move(shared)),
        tls_(std::move(tls)),
        stream_(MakeStream(std::move(socket), tls_.get())),
        over_capacity_(over_capacity),
        buffer_(shared_->options.max_header_bytes + kReadAheadBytes) {}

  ~Session() override {
    std::lock_guard<std::mutex> lock(shared_->conn_mu);
    if (--shared_->per_client[peer_] <= 0) shared_->per_client.erase(peer_);
    shared_->sessions.erase(id_);
    shared_->connections_open.fetch_sub(1);
    shared_->sessions_cv.notify_all();
  }

  void set_id(uint64_t id) { id_ = id; }

  void Run() {
    auto self = SharedSelf();
    asio::dispatch(stream_.get_executor(), [self] {
      if constexpr (kTls) {
        self->Deadline(self->shared_->options.header_timeout_ms);
        self->stream_.async_handshake(asio::ssl::stream_base::server, [self](beast::error_code ec) {
          if (ec) {
            self->shared_->tls_handshake_failures.fetch_add(1);
            return self->CloseNow();
          }
          self->WaitForRequest(true);
        });
      } else {
        self->WaitForRequest(true);
      }
    });
  }

  void Abort() override {
    auto self = SharedSelf();
    asio::post(stream_.get_executor(), [self] {
      self->aborted_ = true;
      self->CloseNow();
    });
  }

  void Drain() override {
    auto self = SharedSelf();
    asio::post(stream_.get_executor(), [self] { self->OnDrain(); });
  }

  void Evict() override {
    auto self = SharedSelf();
    asio::post(stream_.get_executor(), [self] {
      if (self->phase_ != Phase::kIdle || self->aborted_) return;
      self->shared_->evicted_idle.fetch_add(1);
      self->CloseNow();
    });
  }

  // Body: called on a handler thread.
  Result<size_t> Read(char* buf, size_t cap) override {
    if (!body_failure_.ok()) return body_failure_;
    if (cap == 0 || body_ended_) return size_t{0};
    if (t_event_loop_thread) {
      return Status::Internal(shared_->options.name +
                              ": a handler on the event loop may not read a body");
    }
    auto read = std::make_shared<BodyRead>();
    read->cap = std::min(cap, kBodyReadBytes);
    auto future = read->done.get_future();
    auto self = SharedSelf();
    asio::post(stream_.get_executor(), [self, read] { self->StartBodyRead(read); });
    // Every path on the strand fulfils the read, each within the body deadlines; this wait's own
    // bound only keeps a bug there from holding the handler thread for good.
    const auto& o = shared_->options;
    const double rate = o.min_body_rate > 0 ? static_cast<double>(o.min_body_rate) : 1e18;
    const uint64_t length = request_.content_length.value_or(body_bytes_seen_ + read->cap);
    const auto bound = std::chrono::milliseconds(
        int64_t{o.write_timeout_ms} + o.body_idle_timeout_ms + 10000 +
        std::max<int64_t>(o.body_timeout_ms, static_cast<int64_t>(length / rate * 1000.0)));
    Result<size_t> r = Status::Refused(StatusCode::kIOError, kBodyIncomplete,
                                       "the connection ended before the body did");
    if (future.wait_for(bound) != std::future_status::ready) {
      KILN_LOG(ERROR) << shared_->options.name << ": a body read of " << request_.method << " "
                      << request_.path << " did not end within " << bound.count()
                      << " ms; the connection is ended";
      Abort();
    } else {
      try {
        r = future.get();
      } catch (const std::exception& e) {
        KILN_LOG(ERROR) << shared_->options.name << ": a body read of " << request_.path
                        << " failed: " << e.what();
      }
    }
    if (!r.ok()) {
      body_failure_ = r.status();
      return r;
    }
    if (*r == 0) {
      body_ended_ = true;
      return r;
    }
    std::memcpy(buf, scratch_.get(), *r);
    body_bytes_seen_ += *r;
    return r;
  }

 private:
  // Where the connection is, for Drain() and Evict(). Strand only.
  enum class Phase { kIdle, kHeaders, kQueued, kAnswering, kClosing };

  static Stream MakeStream(tcp::socket socket, asio::ssl::context* tls) {
    if constexpr (kTls) {
      return Stream(std::move(socket), *tls);
    } else {
      return Stream(std::move(socket));
    }
  }

  std::shared_ptr<Session> SharedSelf() {
    return std::static_pointer_cast<Session>(SessionBase::shared_from_this());
  }

  beast::tcp_stream& Tcp() { return beast::get_lowest_layer(stream_); }

  void Deadline(int ms) {
    if (ms > 0) {
      Tcp().expires_after(std::chrono::milliseconds(ms));
    } else {
      Tcp().expires_never();
    }
  }

  // Waits for the first byte of the next request: an idle connection costs a socket and a small
  // buffer, no thread, and is closed after the idle deadline.
  void WaitForRequest(bool first) {
    if (aborted_) return CloseNow();
    phase_ = Phase::kHeaders;
    if (buffer_.size() > 0) return ReadHeader();
    const auto& o = shared_->options;
    if (shared_->draining.load()) return CloseNow();
    phase_ = Phase::kIdle;
    idle_ = true;
    Deadline(over_capacity_ ? std::min(o.header_timeout_ms, 2000)
                            : (first ? o.header_timeout_ms : o.keepalive_idle_ms));
    auto self = SharedSelf();
    stream_.async_read_some(buffer_.prepare(4096), [self, first](beast::error_code ec, size_t n) {
      self->idle_ = false;
      self->phase_ = Phase::kHeaders;
      if (ec) {
        if (first && ec == beast::error::timeout) self->shared_->header_timeouts.fetch_add(1);
        return self->CloseNow();
      }
      self->buffer_.commit(n);
      self->ReadHeader();
    });
  }

  void ReadHeader() {
    const auto& o = shared_->options;
    phase_ = Phase::kHeaders;
    parser_.emplace(o.max_header_bytes);
    parser_->header_limit(o.max_header_bytes);
    // Bounded per route once the route is known. Not boost::none: Beast 1.74 compares a
    // Content-Length against an empty limit as if the limit were below every length.
    parser_->body_limit(std::numeric_limits<std::uint64_t>::max());
    Deadline(over_capacity_ ? std::min(o.header_timeout_ms, 2000) : o.header_timeout_ms);
    auto self = SharedSelf();
    http::async_read_header(stream_, buffer_, *parser_,
                            [self](beast::error_code ec, size_t) { self->OnHeader(ec); });
  }

  void OnHeader(beast::error_code ec) {
    if (ec) {
      if (ec == beast::error::timeout) {
        shared_->header_timeouts.fetch_add(1);
        return CloseNow();  // the deadline closed the socket: nobody is left to answer
      }
      if (ec == http::error::end_of_stream || ec == asio::error::eof ||
          ec == asio::error::connection_reset || ec == asio::error::operation_aborted ||
          ec == asio::ssl::error::stream_truncated) {
        return CloseNow();
      }
      if (ec == http::error::header_limit || ec == http::error::buffer_overflow) {
        shared_->refused_headers_too_large.fetch_add(1);
        return Refuse(431, kHeadersTooLarge,
                      "the request headers are over " +
                          std::to_string(shared_->options.max_header_bytes) + " bytes");
      }
      return Refuse(400, "bad_request", "the request is not valid HTTP/1.1: " + ec.message());
    }
    shared_->requests_total.fetch_add(1);
    request_ = Request();
    server_answered_ = false;
    auto& h = parser_->get();
    request_.method = std::string(h.method_string());
    request_.target = std::string(h.target());
    request_.peer = peer_;
    request_.tls = kTls;
    for (const auto& f : h) {
      request_.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
    }
    request_.chunked = parser_->chunked();
    if (!request_.chunked && parser_->content_length()) {
      request_.content_length = *parser_->content_length();
    }
    std::string_view target = h.target();
    const size_t q = target.find('?');
    std::string_view raw_path = target.substr(0, q);
    request_.path = Decode(raw_path, false);
    if (q != std::string_view::npos) {
      std::string_view qs = target.substr(q + 1);
      size_t at = 0;
      while (at <= qs.size()) {
        size_t end = qs.find('&', at);
        if (end == std::string_view::npos) end = qs.size();
        std::string_view kv = qs.substr(at, end - at);
        if (!kv.empty()) {
          const size_t eq = kv.find('=');
          request_.query[Decode(kv.substr(0, eq), true)] =
              eq == std::string_view::npos ? "" : Decode(kv.substr(eq + 1), true);
        }
        at = end + 1;
      }
    }
    expect_continue_ = h.version() >= 11 && IEquals(request_.Header("Expect"), "100-continue");
    continue_sent_ = false;
    body_ended_ = !request_.HasBody();
    body_failure_ = Status::OK();
    linger_on_refusal_ = false;
    body_started_ = Clock::now();
    body_bytes_ = 0;
    body_bytes_seen_ = 0;

    if (over_capacity_) {
      shared_->refused_over_capacity.fetch_add(1);
      return Refuse(503, "too_many_connections",
                    shared_->options.name + " holds its limit of connections" +
                        " from this client; retry later",
                    /*retry_after=*/true);
    }
    if (shared_->draining.load()) {
      return Refuse(503, "draining", shared_->options.name + " is shutting down; retry later",
                    /*retry_after=*/true);
    }
    bool path_known = false;
    std::string allow;
    const CompiledRoute* route =
        shared_->Match(request_.method, raw_path, &request_.captures, &path_known, &allow);
    if (route == nullptr) {
      if (path_known) {
        Response r = shared_->ErrorResponse(
            405, "method_not_allowed",
            request_.method + " is not allowed on " + request_.path + " (allowed: " + allow + ")");
        r.headers.emplace_back("Allow", allow);
        return Write(std::move(r));
      }
      return Write(shared_->ErrorResponse(404, "not_found",
                                          "no route " + request_.method + " " + request_.path));
    }
    const uint64_t limit = route->route.max_body_bytes;
    if (request_.content_length && *request_.content_length > limit) {
      shared_->refused_too_large.fetch_add(1);
      return Refuse(413, kTooLarge,
                    request_.method + " " + request_.path + " takes at most " +
                        std::to_string(limit) + " body bytes; Content-Length is " +
                        std::to_string(*request_.content_length));
    }
    if (request_.chunked && limit == 0) {
      shared_->refused_too_large.fetch_add(1);
      return Refuse(413, kTooLarge, request_.method + " " + request_.path + " takes no body");
    }
    parser_->body_limit(limit);
    if (route->route.on_event_loop) {
      return Write(RunHandler(route->route.handler));
    }
    auto self = SharedSelf();
    const Handler* handler = &route->route.handler;
    auto job = std::make_shared<std::atomic<int>>(kJobQueued);
    job_ = job;
    const uint64_t gen = ++request_gen_;
    phase_ = Phase::kQueued;
    const int deadline_ms = route->route.deadline_ms > 0 ? route->route.deadline_ms
                                                         : shared_->options.handler_deadline_ms;
    const bool queued = shared_->pool->TrySubmit([self, handler, job, gen] {
      int expected = kJobQueued;
      if (self->shared_->stopping.load() || !job->compare_exchange_strong(expected, kJobRunning)) {
        return;  // answered already (deadline, drain) or the server is stopping
      }
      auto answer = std::make_shared<Response>(self->RunHandler(*handler));
      asio::post(self->stream_.get_executor(),
                 [self, answer, gen] { self->OnHandlerDone(gen, std::move(*answer)); });
    });
    if (!queued) {
      job_.reset();
      shared_->refused_saturated.fetch_add(1);
      return Refuse(503, kOverloaded,
                    shared_->options.name + " has every handler busy and its queue full",
                    /*retry_after=*/true);
    }
    if (deadline_ms > 0) ArmDeadline(std::chrono::milliseconds(deadline_ms));
  }

  Response RunHandler(const Handler& handler) {
    try {
      return handler(request_, *this);
    } catch (const std::exception& e) {
      KILN_LOG(ERROR) << shared_->options.name << ": " << request_.method << " " << request_.path
                      << " threw: " << e.what();
    } catch (...) {
      KILN_LOG(ERROR) << shared_->options.name << ": " << request_.method << " " << request_.path
                      << " threw";
    }
    Response r = shared_->ErrorResponse(
        500, "internal", shared_->options.name + " failed while handling " + request_.path);
    r.close = true;
    return r;
  }

  // On the strand: a handler's answer.
  void OnHandlerDone(uint64_t gen, Response answer) {
    if (stuck_ && gen == stuck_gen_) {
      stuck_ = false;
      shared_->handlers_stuck.fetch_sub(1);
      KILN_LOG(WARNING) << shared_->options.name << ": " << request_.method << " " << request_.path
                        << " returned after its deadline; its answer is dropped";
    }
    if (gen != request_gen_ || server_answered_) return;
    DisarmDeadline();
    Write(std::move(answer));
  }

  // The handler deadline: started when the request is queued, paused while a body read waits on
  // the client (StartBodyRead .. Fulfil), resumed after.
  void ArmDeadline(std::chrono::milliseconds d) {
    deadline_left_ = d;
    deadline_armed_ = true;
    deadline_paused_ = false;
    StartDeadlineTimer();
  }
  void StartDeadlineTimer() {
    deadline_at_ = Clock::now() + deadline_left_;
    const uint64_t gen = ++deadline_gen_;
    deadline_timer_.expires_at(deadline_at_);
    auto self = SharedSelf();
    deadline_timer_.async_wait([self, gen](beast::error_code ec) {
      if (ec || gen != self->deadline_gen_) return;
      self->OnDeadline();
    });
  }
  void PauseDeadline() {
    if (!deadline_armed_ || deadline_paused_) return;
    deadline_paused_ = true;
    deadline_left_ = std::max(Clock::duration::zero(), deadline_at_ - Clock::now());
    ++deadline_gen_;
    deadline_timer_.cancel();
  }
  void ResumeDeadline() {
    if (!deadline_armed_ || !deadline_paused_) return;
    deadline_paused_ = false;
    StartDeadlineTimer();
  }
  void DisarmDeadline() {
    if (!deadline_armed_) return;
    deadline_armed_ = false;
    ++deadline_gen_;
    deadline_timer_.cancel();
  }

  void OnDeadline() {
    if (!deadline_armed_ || deadline_paused_ || aborted_ || server_answered_) return;
    deadline_armed_ = false;
    const std::string what = request_.method + " " + request_.path;
    int expected = kJobQueued;
    if (job_ && job_->compare_exchange_strong(expected, kJobCancelled)) {
      shared_->queue_deadlines.fetch_add(1);
      return ServerAnswer(
          503, "overloaded",
          shared_->options.name + " had no handler free for " + what + " before its deadline");
    }
    stuck_ = true;
    stuck_gen_ = request_gen_;
    shared_->handlers_stuck.fetch_add(1);
    shared_->handler_deadlines.fetch_add(1);
    KILN_LOG(ERROR) << shared_->options.name << ": " << what
                    << " passed its handler deadline; answered 503 handler_deadline, and the "
                       "handler counts as stuck until it returns";
    ServerAnswer(503, "handler_deadline",
                 shared_->options.name + " did not finish " + what + " within its deadline");
  }

  // On the strand: the server answers the current request itself (its deadline, a drain); the
  // handler, if one runs, gets no more body and its answer is dropped.
  void ServerAnswer(int status, const std::string& token, const std::string& message) {
    server_answered_ = true;
    Refuse(status, token, message, /*retry_after=*/true);
  }

  void OnDrain() {
    if (aborted_) return;
    if (phase_ == Phase::kIdle) return CloseNow();
    if (phase_ == Phase::kQueued && !server_answered_) {
      int expected = kJobQueued;
      if (job_ && job_->compare_exchange_strong(expected, kJobCancelled)) {
        DisarmDeadline();
        ServerAnswer(503, "draining", shared_->options.name + " is shutting down; retry later");
      }
    }
  }

  // An answer the server gives itself; the connection ends after it.
  void Refuse(int status, const std::string& token, const std::string& message,
              bool retry_after = false) {
    Response r = shared_->ErrorResponse(status, token, message);
    if (retry_after) {
      r.headers.emplace_back("Retry-After", std::to_string(shared_->options.retry_after_s));
    }
    r.close = true;
    Write(std::move(r));
  }

  // On the strand: ends a body read, exactly once.
  void Fulfil(const std::shared_ptr<BodyRead>& read, Result<size_t> result) {
    if (read->fulfilled) return;
    read->fulfilled = true;
    ResumeDeadline();
    try {
      read->done.set_value(std::move(result));
    } catch (...) {
    }
  }

  static Status Incomplete(const std::string& why) {
    return Status::Refused(StatusCode::kIOError, kBodyIncomplete, why);
  }

  // On the strand: one body read for a handler thread. Whatever happens, the read is fulfilled.
  void StartBodyRead(std::shared_ptr<BodyRead> read) {
    try {
      PauseDeadline();
      if (aborted_ || broken_ || server_answered_) {
        return Fulfil(read, Incomplete("the connection ended before the body did"));
      }
      if (parser_->is_done()) return Fulfil(read, size_t{0});
      if (!scratch_) scratch_.reset(new char[kBodyReadBytes]);
      if (expect_continue_ && !continue_sent_) {
        continue_sent_ = true;
        static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
        Deadline(shared_->options.write_timeout_ms);
        auto self = SharedSelf();
        return asio::async_write(
            stream_, asio::buffer(kContinue), [self, read](beast::error_code ec, size_t) {
              if (ec) {
                self->broken_ = true;
                return self->Fulfil(read, Incomplete("the client went away before its body"));
              }
              self->StartBodyRead(read);
            });
      }
      ContinueBodyRead(read);
    } catch (const std::exception& e) {
      broken_ = true;
      Fulfil(read, Status::Internal(shared_->options.name + ": a body read failed: " + e.what()));
    }
  }

  void ContinueBodyRead(std::shared_ptr<BodyRead> read) {
    const auto& o = shared_->options;
    // The whole body must keep up with min_body_rate once past body_timeout_ms.
    const uint64_t length = request_.content_length.value_or(body_bytes_ + read->cap);
    const double rate = o.min_body_rate > 0 ? static_cast<double>(o.min_body_rate) : 1e18;
    const auto allowed = std::chrono::milliseconds(
        std::max<int64_t>(o.body_timeout_ms, static_cast<int64_t>(length / rate * 1000.0)));
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(body_started_ +
                                                                            allowed - Clock::now());
    if (left.count() <= 0) {
      shared_->body_timeouts.fetch_add(1);
      broken_ = true;
      return Fulfil(read, Status::Refused(StatusCode::kIOError, kBodyTimeout,
                                          "the request body did not arrive within " +
                                              std::to_string(allowed.count()) + " ms"));
    }
    // The body's deadline cancels the read instead of closing the socket (as the stream's own
    // expiry would), so a plain-HTTP client still gets its 408.
    Tcp().expires_never();
    body_timed_out_ = false;
    body_read_pending_ = true;
    const uint64_t gen = ++body_read_gen_;
    body_timer_.expires_after(
        std::chrono::milliseconds(std::min<int64_t>(left.count(), o.body_idle_timeout_ms)));
    auto self = SharedSelf();
    body_timer_.async_wait([self, gen](beast::error_code ec) {
      // Only this read's deadline, and only while it is still waiting.
      if (ec || gen != self->body_read_gen_ || !self->body_read_pending_) return;
      self->body_timed_out_ = true;
      beast::error_code ignored;
      self->Tcp().socket().cancel(ignored);
    });
    auto& body = parser_->get().body();
    body.data = scratch_.get() + read->got;
    body.size = read->cap - read->got;
    body.more = true;
    http::async_read_some(stream_, buffer_, *parser_, [self, read](beast::error_code ec, size_t) {
      try {
        self->OnBodyBytes(read, ec);
      } catch (const std::exception& e) {
        self->broken_ = true;
        self->Fulfil(read, Status::Internal(self->shared_->options.name +
                                            ": a body read failed: " + e.what()));
      }
    });
  }

  void OnBodyBytes(const std::shared_ptr<BodyRead>& read, beast::error_code ec) {
    body_timer_.cancel();
    body_read_pending_ = false;
    if (body_timed_out_) ec = beast::error::timeout;
    const size_t got = (read->cap - read->got) - parser_->get().body().size;
    read->got += got;
    body_bytes_ += got;
    if (ec == http::error::need_buffer) ec = {};
    if (ec) {
      broken_ = true;
      if (ec == beast::error::timeout) {
        shared_->body_timeouts.fetch_add(1);
        return Fulfil(read, Status::Refused(
                                StatusCode::kIOError, kBodyTimeout,
                                "the client sent no body bytes for " +
                                    std::to_string(shared_->options.body_idle_timeout_ms) + " ms"));
      }
      if (ec == http::error::body_limit) {
        linger_on_refusal_ = true;
        return Fulfil(read, Status::Refused(StatusCode::kInvalidArgument, kBodyTooLarge,
                                            "the chunked request body passed the route's limit"));
      }
      if (ec == http::error::header_limit || ec == http::error::buffer_overflow) {
        linger_on_refusal_ = true;
        shared_->refused_headers_too_large.fetch_add(1);
        return Fulfil(read, Status::Refused(StatusCode::kInvalidArgument, kHeadersTooLarge,
                                            "the chunked body's trailer or a chunk line is over " +
                                                std::to_string(shared_->options.max_header_bytes) +
                                                " bytes"));
      }
      return Fulfil(read,
                    Incomplete("the connection ended before the body did (" + ec.message() + ")"));
    }
    if (read->got == 0 && !parser_->is_done()) return ContinueBodyRead(read);
    Fulfil(read, read->got);
  }

  // On the strand: writes an answer, then reads the next request or closes.
  void Write(Response r) {
    if (aborted_) return CloseNow();
    // A TLS stream whose read was cancelled mid-record cannot carry an answer.
    if (kTls && body_timed_out_) return CloseNow();
    phase_ = Phase::kAnswering;
    const bool body_done = parser_ && parser_->is_done();
    keep_alive_ = !r.close && body_done && parser_ && parser_->get().keep_alive() &&
                  !shared_->stopping.load() && !shared_->draining.load() && !over_capacity_;
    // A client still sending a body nobody will read is lingered on, so it reads this answer
    // rather than a reset; not one whose body stalled (a timeout) or whose connection failed.
    unread_body_ = parser_ && !body_done && (!broken_ || linger_on_refusal_);
    const unsigned version = parser_ ? parser_->get().version() : 11;
    std::string head = "HTTP/" + std::to_string(version / 10) + "." + std::to_string(version % 10) +
                       " " + std::to_string(r.status) + " " + ReasonPhrase(r.status) + "\r\n";
    const uint64_t length = r.stream ? r.stream_length : r.body.size();
    head += "Content-Type: " + r.content_type + "\r\n";
    head += "Content-Length: " + std::to_string(length) + "\r\n";
    if (!keep_alive_) {
      head += "Connection: close\r\n";
    } else if (version == 10) {
      head += "Connection: keep-alive\r\n";
    }
    for (const auto& [k, v] : r.headers) {
      // Header injection guard: a value never carries a line break.
      if (k.find_first_of("\r\n:") != std::string::npos ||
          v.find_first_of("\r\n") != std::string::npos) {
        continue;
      }
      head += k + ": " + v + "\r\n";
    }
    head += "\r\n";
    answer_head_ = std::move(head);
    answer_ = std::move(r);
    stream_offset_ = 0;
    Deadline(shared_->options.write_timeout_ms);
    auto self = SharedSelf();
    std::array<asio::const_buffer, 2> bufs{asio::buffer(answer_head_), asio::buffer(answer_.body)};
    if (answer_.stream) bufs[1] = asio::const_buffer();
    asio::async_write(stream_, bufs, [self](beast::error_code ec, size_t) {
      if (ec) return self->CloseNow();
      if (self->answer_.stream) return self->WriteStream();
      self->AfterAnswer();
    });
  }

  void WriteStream() {
    if (aborted_) return CloseNow();
    if (stream_offset_ >= answer_.stream_length) return AfterAnswer();
    if (!chunk_) chunk_.reset(new char[kChunkBytes]);
    const size_t want = static_cast<size_t>(
        std::min<uint64_t>(kChunkBytes, answer_.stream_length - stream_offset_));
    Result<size_t> n = Status::Internal("the answer's stream threw");
    try {
      n = answer_.stream(stream_offset_, chunk_.get(), want);
    } catch (const std::exception& e) {
      n = Status::Internal(std::string("the answer's stream threw: ") + e.what());
    }
    if (!n.ok() || *n == 0 || *n > want) {
      KILN_LOG(WARNING) << shared_->options.name << ": streaming " << request_.path
                        << " stopped at byte " << stream_offset_ << ": "
                        << (n.ok() ? std::string("no bytes") : n.status().message());
      return CloseNow();
    }
    stream_offset_ += *n;
    Deadline(shared_->options.write_timeout_ms);
    auto self = SharedSelf();
    asio::async_write(stream_, asio::buffer(chunk_.get(), *n),
                      [self](beast::error_code ec, size_t) {
                        if (ec) return self->CloseNow();
                        self->WriteStream();
                      });
  }

  void AfterAnswer() {
    answer_ = Response();
    if (keep_alive_ && !aborted_) return WaitForRequest(false);
    CloseGracefully();
  }

  // Ends the connection after an answer: TLS close_notify when the stream is clean, then a
  // half-close and, when the client is still sending a body nobody will read, a bounded linger
  // that discards it so the client reads our answer instead of a reset.
  void CloseGracefully() {
    phase_ = Phase::kClosing;
    auto self = SharedSelf();
    if constexpr (kTls) {
      if (!unread_body_ && !broken_) {
        Deadline(1000);
        return stream_.async_shutdown([self](beast::error_code) { self->HalfCloseAndLinger(); });
      }
    }
    HalfCloseAndLinger();
  }

  void HalfCloseAndLinger() {
    beast::error_code ec;
    Tcp().socket().shutdown(tcp::socket::shutdown_send, ec);
    if (!unread_body_ || ec) return CloseNow();
    linger_left_ = shared_->options.linger_bytes;
    Deadline(2000);
    Linger();
  }

  void Linger() {
    if (linger_left_ == 0) return CloseNow();
    if (!chunk_) chunk_.reset(new char[kChunkBytes]);
    auto self = SharedSelf();
    const size_t want = static_cast<size_t>(std::min<uint64_t>(kChunkBytes, linger_left_));
    // Through the stream, not its socket: the stream's expiry (Deadline above) bounds the linger.
    Tcp().async_read_some(asio::buffer(chunk_.get(), want), [self](beast::error_code ec, size_t n) {
      if (ec) return self->CloseNow();
      self->linger_left_ -= std::min<uint64_t>(n, self->linger_left_);
      self->Linger();
    });
  }

  void CloseNow() {
    phase_ = Phase::kClosing;
    idle_ = false;
    DisarmDeadline();
    beast::error_code ec;
    Tcp().socket().shutdown(tcp::socket::shutdown_both, ec);
    Tcp().close();
  }

  std::shared_ptr<Shared> shared_;
  std::shared_ptr<asio::ssl::context> tls_;  // outlives stream_ (declared before it)
  Stream stream_;
  bool over_capacity_ = false;
  uint64_t id_ = 0;
  Phase phase_ = Phase::kHeaders;

  beast::flat_buffer buffer_;  // bounded: max_header_bytes + kReadAheadBytes
  std::optional<RequestParser> parser_;
  Request request_;
  bool expect_continue_ = false;
  bool continue_sent_ = false;
  bool broken_ = false;  // a body read failed: the connection cannot carry another request
  bool linger_on_refusal_ = false;  // it failed on a bound while the client was still sending
  bool body_timed_out_ = false;
  bool body_read_pending_ = false;
  uint64_t body_read_gen_ = 0;
  asio::steady_timer body_timer_{stream_.get_executor()};
  bool aborted_ = false;  // the server is stopping
  Clock::time_point body_started_;
  uint64_t body_bytes_ = 0;
  // Body reads land here (strand), then the handler copies them out.
  std::unique_ptr<char[]> scratch_;

  // The current request's handler job and deadline (strand only).
  std::shared_ptr<std::atomic<int>> job_;
  uint64_t request_gen_ = 0;
  bool server_answered_ = false;  // the server answered it itself: the handler's answer is dropped
  bool stuck_ = false;            // its handler passed the deadline and has not returned
  uint64_t stuck_gen_ = 0;
  asio::steady_timer deadline_timer_{stream_.get_executor()};
  bool deadline_armed_ = false;
  bool deadline_paused_ = false;
  Clock::time_point deadline_at_;
  Clock::duration deadline_left_{};
  uint64_t deadline_gen_ = 0;

  // Touched only by the handler thread that owns the current request.
  bool body_ended_ = false;
  Status body_failure_;
  uint64_t body_bytes_seen_ = 0;

  bool keep_alive_ = false;
  bool unread_body_ = false;
  std::string answer_head_;
  Response answer_;
  uint64_t stream_offset_ = 0;
  std::unique_ptr<char[]> chunk_;  // kChunkBytes: a streamed answer's piece, or lingered bytes
  uint64_t linger_left_ = 0;
};

using PlainSession = Session<beast::tcp_stream>;
using TlsSession = Session<beast::ssl_stream<beast::tcp_stream>>;

// A TLS context from PEM files: TLS 1.2 or later, the key checked against the certificate.
Result<std::shared_ptr<asio::ssl::context>> LoadTlsContext(const TlsOptions& tls,
                                                           const std::string& name) {
  auto ctx = std::make_shared<asio::ssl::context>(asio::ssl::context::tls_server);
  beast::error_code ec;
  ctx->set_options(asio::ssl::context::default_workarounds | asio::ssl::context::no_sslv2 |
                       asio::ssl::context::no_sslv3 | asio::ssl::context::single_dh_use,
                   ec);
  SSL_CTX_set_min_proto_version(ctx->native_handle(), TLS1_2_VERSION);
  ctx->use_certificate_chain_file(tls.cert_file, ec);
  if (ec) {
    return Status::InvalidArgument(name + ": TLS certificate '" + tls.cert_file +
                                   "' does not load: " + ec.message());
  }
  ctx->use_private_key_file(tls.key_file, asio::ssl::context::pem, ec);
  if (ec) {
    return Status::InvalidArgument(name + ": TLS key '" + tls.key_file +
                                   "' does not load: " + ec.message());
  }
  if (SSL_CTX_check_private_key(ctx->native_handle()) != 1) {
    return Status::InvalidArgument(name + ": TLS key '" + tls.key_file +
                                   "' does not match the certificate '" + tls.cert_file + "'");
  }
  return ctx;
}

// mtime and size of a file, to notice a rotation; "" when it cannot be read.
std::string FileStamp(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return "";
  return std::to_string(st.st_mtim.tv_sec) + "." + std::to_string(st.st_mtim.tv_nsec) + "/" +
         std::to_string(st.st_size) + "/" + std::to_string(st.st_ino);
}

// Enough descriptors for the connection cap: raise the soft limit toward the hard one.
void RaiseDescriptorLimit(int want) {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
  const rlim_t target = std::min<rlim_t>(rl.rlim_max, static_cast<rlim_t>(want));
  if (rl.rlim_cur < target) {
    rl.rlim_cur = target;
    ::setrlimit(RLIMIT_NOFILE, &rl);
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The server.

struct HttpServer::Impl {
  std::shared_ptr<Shared> shared;
  // The acceptor and the reload timer share one strand, so Stop()'s close never races an accept.
  std::optional<asio::strand<asio::io_context::executor_type>> strand;
  std::unique_ptr<tcp::acceptor> acceptor;
  std::unique_ptr<asio::steady_timer> reload_timer;
  std::string cert_stamp;  // touched on the event loop and under reload_mu
  std::mutex reload_mu;
  std::vector<std::thread> io_threads;
  std::once_flag stop_once;
  bool started = false;
  int port = 0;

  // Stops accepting (on the strand) and returns every open session, for Stop to abort and Drain
  // to drain.
  std::vector<std::shared_ptr<SessionBase>> CloseAcceptorAndTakeSessions() {
    asio::post(*strand, [this] {
      beast::error_code ec;
      acceptor->close(ec);
      reload_timer->cancel();
    });
    std::vector<std::shared_ptr<SessionBase>> open;
    std::lock_guard<std::mutex> lock(shared->conn_mu);
    for (auto& [id, weak] : shared->sessions) {
      if (auto s = weak.lock()) open.push_back(std::move(s));
    }
    return open;
  }

  void Accept() {
    acceptor->async_accept(
        asio::make_strand(shared->ioc), [this](beast::error_code ec, tcp::socket socket) {
          if (ec) {
            if (ec == asio::error::operation_aborted || !acceptor->is_open()) return;
            // Out of descriptors (or another transient failure): back off instead of spinning.
            KILN_LOG(WARNING) << shared->options.name << ": accept failed: " << ec.message();
            auto timer = std::make_shared<asio::steady_timer>(*strand);
            timer->expires_after(std::chrono::milliseconds(50));
            timer->async_wait([this, timer](beast::error_code) {
              if (!shared->stopping.load()) Accept();
            });
            return;
          }
          OnAccepted(std::move(socket));
          Accept();
        });
  }

  void OnAccepted(tcp::socket socket) {
    beast::error_code ec;
    socket.set_option(tcp::no_delay(true), ec);
    const auto remote = socket.remote_endpoint(ec);
    std::string peer = ec ? "?" : remote.address().to_string();
    bool over = false;
    uint64_t id = 0;
    std::shared_ptr<SessionBase> victim;
    {
      std::lock_guard<std::mutex> lock(shared->conn_mu);
      over = !Admit(peer, &victim);
      ++shared->per_client[peer];
      shared->connections_open.fetch_add(1);
      id = ++shared->next_session;
    }
    if (victim) victim->Evict();
    shared->connections_total.fetch_add(1);
    std::shared_ptr<SessionBase> session;
    if (shared->options.tls) {
      auto s =
          std::make_shared<TlsSession>(shared, std::move(socket), peer, over, shared->TlsContext());
      s->set_id(id);
      session = s;
      Register(id, session);
      s->Run();
    } else {
      auto s = std::make_shared<PlainSession>(shared, std::move(socket), peer, over, nullptr);
      s->set_id(id);
      session = s;
      Register(id, session);
      s->Run();
    }
  }

  // Under conn_mu: whether a new connection from `peer` may be served (see http_server.h,
  // "Connections"). At the cap, *victim is set to an idle connection of the address holding the
  // most, to be closed for this one.
  bool Admit(const std::string& peer, std::shared_ptr<SessionBase>* victim) {
    const ServerOptions& o = shared->options;
    const auto it = shared->per_client.find(peer);
    const int held = it == shared->per_client.end() ? 0 : it->second;
    if (held + 1 > o.max_connections_per_client) return false;
    const uint64_t open = shared->connections_open.load() + 1;
    const uint64_t cap = static_cast<uint64_t>(o.max_connections);
    const uint64_t reserve = static_cast<uint64_t>(
        o.reserved_connections >= 0 ? o.reserved_connections : o.max_connections / 8);
    if (open + reserve <= cap) return true;
    if (held >= o.reserve_per_client) return false;  // the reserve is for addresses holding few
    if (open <= cap) return true;
    // At the cap: an idle connection of the heaviest address makes room.
    int heaviest = o.reserve_per_client - 1;
    for (const auto& [sid, weak] : shared->sessions) {
      auto s = weak.lock();
      if (!s || !s->idle() || s->peer() == peer) continue;
      const auto count = shared->per_client.find(s->peer());
      if (count != shared->per_client.end() && count->second > heaviest) {
        heaviest = count->second;
        *victim = std::move(s);
      }
    }
    return *victim != nullptr;
  }

  void Register(uint64_t id, const std::shared_ptr<SessionBase>& s) {
    std::lock_guard<std::mutex> lock(shared->conn_mu);
    shared->sessions[id] = s;
  }

  void ScheduleReloadCheck() {
    const int every = shared->options.tls ? shared->options.tls->reload_check_ms : 0;
    if (every <= 0) return;
    reload_timer->expires_after(std::chrono::milliseconds(every));
    reload_timer->async_wait([this](beast::error_code ec) {
      if (ec || shared->stopping.load()) return;
      const auto& tls = *shared->options.tls;
      const std::string stamp = FileStamp(tls.cert_file) + "|" + FileStamp(tls.key_file);
      bool changed = false;
      {
        std::lock_guard<std::mutex> lock(reload_mu);
        changed = stamp != cert_stamp;
      }
      if (changed) Reload().IgnoreError();
      ScheduleReloadCheck();
    });
  }

  Status Reload() {
    if (!shared->options.tls) {
      return Status::InvalidArgument(shared->options.name + ": no TLS to reload");
    }
    std::lock_guard<std::mutex> lock(reload_mu);
    const auto& tls = *shared->options.tls;
    const std::string stamp = FileStamp(tls.cert_file) + "|" + FileStamp(tls.key_file);
    auto ctx = LoadTlsContext(tls, shared->options.name);
    if (!ctx.ok()) {
      // A half-written pair (the key renamed in before the certificate) is retried at the next
      // check; the certificate in use stays.
      KILN_LOG(WARNING) << shared->options.name
                        << ": TLS reload kept the certificate in use: " << ctx.status().message();
      cert_stamp = stamp;
      return ctx.status();
    }
    {
      std::lock_guard<std::mutex> tls_lock(shared->tls_mu);
      shared->tls_context = std::move(ctx).value();
    }
    cert_stamp = stamp;
    shared->tls_reloads.fetch_add(1);
    KILN_LOG(INFO) << shared->options.name << ": TLS certificate reloaded from " << tls.cert_file;
    return Status::OK();
  }
};

HttpServer::~HttpServer() { Stop(); }

Result<std::unique_ptr<HttpServer>> HttpServer::Create(ServerOptions options,
                                                       std::vector<Route> routes) {
  const std::string& name = options.name;
  if (!options.tls && !options.insecure_http && !IsLoopbackHost(options.bind)) {
    return Status::Refused(StatusCode::kInvalidArgument, "insecure_http_refused",
                           name + ": plain HTTP on " + options.bind +
                               ", an address that is not loopback, would carry tokens in the "
                               "clear; give a TLS certificate and key, or allow it explicitly "
                               "with --insecure-http");
  }
  if (options.tls && (options.tls->cert_file.empty() || options.tls->key_file.empty())) {
    return Status::InvalidArgument(name + ": TLS needs both a certificate and a key file");
  }
  options.io_threads = std::max(1, options.io_threads);
  options.handler_threads = std::max(1, options.handler_threads);
  options.max_queued = std::max(0, options.max_queued);
  options.max_connections = std::max(1, options.max_connections);
  options.max_connections_per_client = std::max(1, options.max_connections_per_client);
  if (options.reserved_connections >= 0) {
    options.reserved_connections =
        std::min(options.reserved_connections, options.max_connections - 1);
  }
  options.reserve_per_client = std::max(1, options.reserve_per_client);
  options.max_header_bytes = std::max<uint32_t>(options.max_header_bytes, 1024);

  auto shared = std::make_shared<Shared>(options.io_threads);
  for (Route& r : routes) {
    if (!r.handler)
      return Status::InvalidArgument(name + ": route " + r.pattern + " has no handler");
    if (r.on_event_loop && r.max_body_bytes > 0) {
      return Status::InvalidArgument(name + ": route " + r.pattern +
                                     " runs on the event loop and so cannot take a body");
    }
    CompiledRoute c;
    for (std::string_view seg : Segments(r.pattern)) c.segments.emplace_back(seg);
    c.route = std::move(r);
    shared->routes.push_back(std::move(c));
  }
  shared->options = std::move(options);
  const ServerOptions& o = shared->options;

  std::unique_ptr<HttpServer> server(new HttpServer());
  server->impl_ = std::make_shared<Impl>();
  Impl& impl = *server->impl_;
  impl.shared = shared;
  if (o.tls) {
    KILN_ASSIGN_OR_RETURN(shared->tls_context, LoadTlsContext(*o.tls, name));
    impl.cert_stamp = FileStamp(o.tls->cert_file) + "|" + FileStamp(o.tls->key_file);
  }
  RaiseDescriptorLimit(o.max_connections + 1024);

  beast::error_code ec;
  const auto address = asio::ip::make_address(o.bind == "localhost" ? "127.0.0.1" : o.bind, ec);
  if (ec)
    return Status::InvalidArgument(name + ": bind address '" + o.bind + "' is not an IP address");
  const tcp::endpoint endpoint(address, static_cast<unsigned short>(o.port));
  impl.strand.emplace(asio::make_strand(shared->ioc));
  impl.acceptor = std::make_unique<tcp::acceptor>(*impl.strand);
  impl.acceptor->open(endpoint.protocol(), ec);
  if (!ec) impl.acceptor->set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) impl.acceptor->bind(endpoint, ec);
  if (!ec) impl.acceptor->listen(std::max(16, o.backlog), ec);
  if (ec) {
    return Status::IOError(name + ": cannot listen on " + o.bind + ":" + std::to_string(o.port) +
                           ": " + ec.message());
  }
  impl.port = impl.acceptor->local_endpoint(ec).port();
  impl.reload_timer = std::make_unique<asio::steady_timer>(*impl.strand);
  return server;
}

int HttpServer::port() const { return impl_->port; }
bool HttpServer::tls() const { return impl_->shared->options.tls.has_value(); }

Status HttpServer::Start() {
  Impl& impl = *impl_;
  if (impl.started) return Status::InvalidArgument(impl.shared->options.name + ": started twice");
  impl.started = true;
  const ServerOptions& o = impl.shared->options;
  impl.shared->pool = std::make_unique<HandlerPool>(o.handler_threads, o.max_queued);
  impl.Accept();
  impl.ScheduleReloadCheck();
  for (int i = 0; i < o.io_threads; ++i) {
    impl.io_threads.emplace_back([shared = impl.shared] {
      t_event_loop_thread = true;
      while (true) {
        try {
          shared->ioc.run();
          return;
        } catch (const std::exception& e) {
          // Nothing in the loop throws by design; a throw is logged and the loop goes on.
          KILN_LOG(ERROR) << shared->options.name << ": event loop: " << e.what();
        }
      }
    });
  }
  return Status::OK();
}

void HttpServer::Stop() {
  if (!impl_) return;
  Impl& impl = *impl_;
  std::call_once(impl.stop_once, [&impl] {
    auto& shared = impl.shared;
    shared->stopping.store(true);
    if (!impl.started) return;
    std::vector<std::shared_ptr<SessionBase>> open = impl.CloseAcceptorAndTakeSessions();
    for (auto& s : open) s->Abort();
    open.clear();
    // Handlers still running finish (their reads fail, their answers go nowhere); one that does
    // not within the grace is abandoned.
    if (shared->pool) {
      const int abandoned = shared->pool->Stop(shared->options.stop_grace_ms);
      if (abandoned > 0) {
        shared->handlers_abandoned.fetch_add(static_cast<uint64_t>(abandoned));
        KILN_LOG(ERROR) << shared->options.name << ": " << abandoned << " handler(s) still running "
                        << shared->options.stop_grace_ms << " ms after stop; abandoned";
      }
    }
    {
      std::unique_lock<std::mutex> lock(shared->conn_mu);
      shared->sessions_cv.wait_for(lock, std::chrono::seconds(5),
                                   [&] { return shared->sessions.empty(); });
    }
    shared->ioc.stop();
    for (auto& t : impl.io_threads) {
      if (t.joinable()) t.join();
    }
    impl.io_threads.clear();
  });
}

bool HttpServer::Drain(int timeout_ms) {
  if (!impl_) return true;
  Impl& impl = *impl_;
  auto& shared = impl.shared;
  if (!impl.started || shared->stopping.load()) return true;
  const auto until = Clock::now() + std::chrono::milliseconds(std::max(0, timeout_ms));
  if (!shared->draining.exchange(true)) {
    KILN_LOG(INFO) << shared->options.name << ": draining";
    for (auto& s : impl.CloseAcceptorAndTakeSessions()) s->Drain();
  }
  std::unique_lock<std::mutex> lock(shared->conn_mu);
  return shared->sessions_cv.wait_until(lock, until, [&] { return shared->sessions.empty(); });
}

uint64_t HttpServer::stuck() const { return impl_->shared->handlers_stuck.load(); }

Status HttpServer::ReloadTls() { return impl_->Reload(); }

ServerStats HttpServer::stats() const {
  const Shared& s = *impl_->shared;
  ServerStats st;
  st.connections_open = s.connections_open.load();
  st.connections_total = s.connections_total.load();
  st.requests_total = s.requests_total.load();
  st.refused_over_capacity = s.refused_over_capacity.load();
  st.refused_saturated = s.refused_saturated.load();
  st.refused_too_large = s.refused_too_large.load();
  st.header_timeouts = s.header_timeouts.load();
  st.body_timeouts = s.body_timeouts.load();
  st.tls_handshake_failures = s.tls_handshake_failures.load();
  st.tls_reloads = s.tls_reloads.load();
  st.refused_headers_too_large = s.refused_headers_too_large.load();
  st.queue_deadlines = s.queue_deadlines.load();
  st.handler_deadlines = s.handler_deadlines.load();
  st.handlers_stuck = s.handlers_stuck.load();
  st.evicted_idle = s.evicted_idle.load();
  st.handlers_abandoned = s.handlers_abandoned.load();
  st.queued = s.pool ? s.pool->Queued() : 0;
  return st;
}

std::string StatsMetricsText(const std::vector<std::pair<std::string, ServerStats>>& listeners) {
  struct Metric {
    const char* name;
    const char* type;
    const char* help;
    uint64_t ServerStats::*field;
  };
  static const Metric kMetrics[] = {
      {"kiln_http_connections_open", "gauge", "Connections open now.",
       &ServerStats::connections_open},
      {"kiln_http_connections_total", "counter", "Connections accepted.",
       &ServerStats::connections_total},
      {"kiln_http_requests_total", "counter", "Requests whose headers were read.",
       &ServerStats::requests_total},
      {"kiln_http_refused_over_capacity_total", "counter",
       "Connections answered 503 over the per-client or total connection cap.",
       &ServerStats::refused_over_capacity},
      {"kiln_http_refused_saturated_total", "counter",
       "Requests answered 503 because every handler was busy and the queue full.",
       &ServerStats::refused_saturated},
      {"kiln_http_refused_too_large_total", "counter",
       "Requests answered 413 from their Content-Length, body unread.",
       &ServerStats::refused_too_large},
      {"kiln_http_header_timeouts_total", "counter",
       "Connections closed because request headers did not arrive in time.",
       &ServerStats::header_timeouts},
      {"kiln_http_body_timeouts_total", "counter", "Requests whose body did not arrive in time.",
       &ServerStats::body_timeouts},
      {"kiln_http_tls_handshake_failures_total", "counter", "TLS handshakes that failed.",
       &ServerStats::tls_handshake_failures},
      {"kiln_http_tls_reloads_total", "counter", "TLS certificate reloads.",
       &ServerStats::tls_reloads},
      {"kiln_http_refused_headers_too_large_total", "counter",
       "Requests refused 431: headers, a chunked body's trailer or a chunk line too long.",
       &ServerStats::refused_headers_too_large},
      {"kiln_http_queue_deadlines_total", "counter",
       "Requests answered 503 because no handler took them before their deadline.",
       &ServerStats::queue_deadlines},
      {"kiln_http_handler_deadlines_total", "counter",
       "Handlers answered 503 handler_deadline because they ran past their deadline.",
       &ServerStats::handler_deadlines},
      {"kiln_http_handlers_stuck", "gauge",
       "Handlers past their deadline and still running (health reports these).",
       &ServerStats::handlers_stuck},
      {"kiln_http_queue_depth", "gauge", "Requests waiting for a handler thread now.",
       &ServerStats::queued},
      {"kiln_http_evicted_idle_total", "counter",
       "Idle connections closed at the connection cap to make room for another address.",
       &ServerStats::evicted_idle},
  };
  std::ostringstream o;
  for (const Metric& m : kMetrics) {
    o << "# HELP " << m.name << " " << m.help << "\n# TYPE " << m.name << " " << m.type << "\n";
    for (const auto& [listener, st] : listeners) {
      o << m.name << "{listener=\"" << listener << "\"} " << st.*m.field << "\n";
    }
  }
  return o.str();
}

}  // namespace kiln::net
