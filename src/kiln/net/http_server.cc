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
  HandlerPool(int threads, int max_queued) : max_queued_(static_cast<size_t>(max_queued)) {
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
  }
  ~HandlerPool() { Stop(); }

  // False when the queue is full or the pool is stopping.
  bool TrySubmit(std::function<void()> job) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_ || queue_.size() >= max_queued_) return false;
      queue_.push_back(std::move(job));
    }
    cv_.notify_one();
    return true;
  }

  // Runs what is queued, then joins.
  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_ && threads_.empty()) return;
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
    threads_.clear();
  }

 private:
  void Loop() {
    while (true) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;
        job = std::move(queue_.front());
        queue_.pop_front();
      }
      job();
    }
  }

  const size_t max_queued_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
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

  std::mutex tls_mu;
  std::shared_ptr<asio::ssl::context> tls_context;  // guarded by tls_mu

  std::mutex conn_mu;
  std::unordered_map<std::string, int> per_client;          // guarded by conn_mu
  std::map<uint64_t, std::weak_ptr<SessionBase>> sessions;  // guarded by conn_mu
  uint64_t next_session = 0;                                // guarded by conn_mu
  std::condition_variable sessions_cv;

  std::atomic<uint64_t> connections_open{0}, connections_total{0}, requests_total{0},
      refused_over_capacity{0}, refused_saturated{0}, refused_too_large{0}, header_timeouts{0},
      body_timeouts{0}, tls_handshake_failures{0}, tls_reloads{0};

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
  virtual ~SessionBase() = default;
  // Ends the connection now (server stop). Any thread.
  virtual void Abort() = 0;
};

namespace {

// Set on event-loop threads: a body read from one would wait on itself.
thread_local bool t_event_loop_thread = false;

std::string ReasonPhrase(int status) {
  std::string_view r = http::obsolete_reason(http::int_to_status(static_cast<unsigned>(status)));
  return r.empty() ? "Status" : std::string(r);
}

// Reads of a body on behalf of a handler thread: the session's strand fulfils the promise.
struct BodyRead {
  char* buf = nullptr;
  size_t cap = 0;
  size_t got = 0;
  std::promise<Result<size_t>> done;
};

template <class Stream>
class Session final : public SessionBase, public Body {
 public:
  static constexpr bool kTls = !std::is_same_v<Stream, beast::tcp_stream>;

  Session(std::shared_ptr<Shared> shared, tcp::socket socket, std::string peer, bool over_capacity,
          std::shared_ptr<asio::ssl::context> tls)
      : shared_(std::move(shared)),
        tls_(std::move(tls)),
        stream_(MakeStream(std::move(socket), tls_.get())),
        peer_(std::move(peer)),
        over_capacity_(over_capacity) {}

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

  // Body: called on a handler thread.
  Result<size_t> Read(char* buf, size_t cap) override {
    if (cap == 0) return size_t{0};
    if (body_ended_) return size_t{0};
    if (t_event_loop_thread) {
      return Status::Internal(shared_->options.name +
                              ": a handler on the event loop may not read a body");
    }
    auto read = std::make_shared<BodyRead>();
    read->buf = buf;
    read->cap = cap;
    auto future = read->done.get_future();
    auto self = SharedSelf();
    asio::post(stream_.get_executor(), [self, read] { self->StartBodyRead(read); });
    Result<size_t> r = future.get();
    if (!r.ok() || *r == 0) body_ended_ = true;
    return r;
  }

 private:
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
    if (buffer_.size() > 0) return ReadHeader();
    const auto& o = shared_->options;
    Deadline(over_capacity_ ? std::min(o.header_timeout_ms, 2000)
                            : (first ? o.header_timeout_ms : o.keepalive_idle_ms));
    auto self = SharedSelf();
    stream_.async_read_some(buffer_.prepare(4096), [self, first](beast::error_code ec, size_t n) {
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
    parser_.emplace();
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
      if (ec == http::error::header_limit) {
        return Refuse(431, "headers_too_large",
                      "the request headers are over " +
                          std::to_string(shared_->options.max_header_bytes) + " bytes");
      }
      return Refuse(400, "bad_request", "the request is not valid HTTP/1.1: " + ec.message());
    }
    shared_->requests_total.fetch_add(1);
    request_ = Request();
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
    body_started_ = Clock::now();
    body_bytes_ = 0;

    if (over_capacity_) {
      shared_->refused_over_capacity.fetch_add(1);
      return Refuse(503, "too_many_connections",
                    shared_->options.name + " holds its limit of connections" +
                        " from this client; retry later",
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
    const bool queued = shared_->pool->TrySubmit([self, handler] {
      Response r = self->RunHandler(*handler);
      auto answer = std::make_shared<Response>(std::move(r));
      asio::post(self->stream_.get_executor(), [self, answer] { self->Write(std::move(*answer)); });
    });
    if (!queued) {
      shared_->refused_saturated.fetch_add(1);
      return Refuse(503, kOverloaded,
                    shared_->options.name + " has every handler busy and its queue full",
                    /*retry_after=*/true);
    }
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

  // On the strand: one body read for a handler thread.
  void StartBodyRead(std::shared_ptr<BodyRead> read) {
    if (aborted_ || broken_) {
      return read->done.set_value(Status::Refused(StatusCode::kIOError, kBodyIncomplete,
                                                  "the connection ended before the body did"));
    }
    if (parser_->is_done()) return read->done.set_value(size_t{0});
    if (expect_continue_ && !continue_sent_) {
      continue_sent_ = true;
      static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      Deadline(shared_->options.write_timeout_ms);
      auto self = SharedSelf();
      return asio::async_write(
          stream_, asio::buffer(kContinue), [self, read](beast::error_code ec, size_t) {
            if (ec) {
              self->broken_ = true;
              return read->done.set_value(Status::Refused(StatusCode::kIOError, kBodyIncomplete,
                                                          "the client went away before its body"));
            }
            self->StartBodyRead(read);
          });
    }
    ContinueBodyRead(std::move(read));
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
      return read->done.set_value(Status::Refused(
          StatusCode::kIOError, kBodyTimeout,
          "the request body did not arrive within " + std::to_string(allowed.count()) + " ms"));
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
    body.data = read->buf + read->got;
    body.size = read->cap - read->got;
    body.more = true;
    http::async_read_some(stream_, buffer_, *parser_, [self, read](beast::error_code ec, size_t) {
      self->body_timer_.cancel();
      self->body_read_pending_ = false;
      if (self->body_timed_out_) ec = beast::error::timeout;
      const size_t got = (read->cap - read->got) - self->parser_->get().body().size;
      read->got += got;
      self->body_bytes_ += got;
      if (ec == http::error::need_buffer) ec = {};
      if (ec) {
        self->broken_ = true;
        if (ec == beast::error::timeout) {
          self->shared_->body_timeouts.fetch_add(1);
          return read->done.set_value(Status::Refused(
              StatusCode::kIOError, kBodyTimeout,
              "the client sent no body bytes for " +
                  std::to_string(self->shared_->options.body_idle_timeout_ms) + " ms"));
        }
        if (ec == http::error::body_limit) {
          return read->done.set_value(
              Status::Refused(StatusCode::kInvalidArgument, kBodyTooLarge,
                              "the chunked request body passed the route's limit"));
        }
        return read->done.set_value(
            Status::Refused(StatusCode::kIOError, kBodyIncomplete,
                            "the connection ended before the body did (" + ec.message() + ")"));
      }
      if (read->got == 0 && !self->parser_->is_done()) return self->ContinueBodyRead(read);
      read->done.set_value(read->got);
    });
  }

  // On the strand: writes an answer, then reads the next request or closes.
  void Write(Response r) {
    if (aborted_) return CloseNow();
    // A TLS stream whose read was cancelled mid-record cannot carry an answer.
    if (kTls && body_timed_out_) return CloseNow();
    const bool body_done = parser_ && parser_->is_done();
    keep_alive_ = !r.close && body_done && parser_ && parser_->get().keep_alive() &&
                  !shared_->stopping.load() && !over_capacity_;
    unread_body_ = parser_ && !body_done && !broken_;
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
    if (chunk_.empty()) chunk_.resize(64 * 1024);
    const size_t want = static_cast<size_t>(
        std::min<uint64_t>(chunk_.size(), answer_.stream_length - stream_offset_));
    Result<size_t> n = answer_.stream(stream_offset_, chunk_.data(), want);
    if (!n.ok() || *n == 0 || *n > want) {
      KILN_LOG(WARNING) << shared_->options.name << ": streaming " << request_.path
                        << " stopped at byte " << stream_offset_ << ": "
                        << (n.ok() ? std::string("no bytes") : n.status().message());
      return CloseNow();
    }
    stream_offset_ += *n;
    Deadline(shared_->options.write_timeout_ms);
    auto self = SharedSelf();
    asio::async_write(stream_, asio::buffer(chunk_.data(), *n),
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
    if (chunk_.empty()) chunk_.resize(64 * 1024);
    auto self = SharedSelf();
    const size_t want = static_cast<size_t>(std::min<uint64_t>(chunk_.size(), linger_left_));
    Tcp().socket().async_read_some(
        asio::buffer(chunk_.data(), want), [self](beast::error_code ec, size_t n) {
          if (ec) return self->CloseNow();
          self->linger_left_ -= std::min<uint64_t>(n, self->linger_left_);
          self->Linger();
        });
  }

  void CloseNow() {
    beast::error_code ec;
    Tcp().socket().shutdown(tcp::socket::shutdown_both, ec);
    Tcp().close();
  }

  std::shared_ptr<Shared> shared_;
  std::shared_ptr<asio::ssl::context> tls_;  // outlives stream_ (declared before it)
  Stream stream_;
  std::string peer_;
  bool over_capacity_ = false;
  uint64_t id_ = 0;

  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::buffer_body>> parser_;
  Request request_;
  bool expect_continue_ = false;
  bool continue_sent_ = false;
  bool broken_ = false;  // a body read failed: the connection cannot carry another request
  bool body_timed_out_ = false;
  bool body_read_pending_ = false;
  uint64_t body_read_gen_ = 0;
  asio::steady_timer body_timer_{stream_.get_executor()};
  bool aborted_ = false;  // the server is stopping
  Clock::time_point body_started_;
  uint64_t body_bytes_ = 0;
  // Touched only by the handler thread that owns the current request.
  bool body_ended_ = false;

  bool keep_alive_ = false;
  bool unread_body_ = false;
  std::string answer_head_;
  Response answer_;
  uint64_t stream_offset_ = 0;
  std::vector<char> chunk_;
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
    {
      std::lock_guard<std::mutex> lock(shared->conn_mu);
      const int mine = ++shared->per_client[peer];
      const uint64_t open = shared->connections_open.fetch_add(1) + 1;
      over = mine > shared->options.max_connections_per_client ||
             open > static_cast<uint64_t>(shared->options.max_connections);
      id = ++shared->next_session;
    }
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
    asio::post(*impl.strand, [&impl] {
      beast::error_code ec;
      impl.acceptor->close(ec);
      impl.reload_timer->cancel();
    });
    std::vector<std::shared_ptr<SessionBase>> open;
    {
      std::lock_guard<std::mutex> lock(shared->conn_mu);
      for (auto& [id, weak] : shared->sessions) {
        if (auto s = weak.lock()) open.push_back(std::move(s));
      }
    }
    for (auto& s : open) s->Abort();
    open.clear();
    // Handlers still running finish (their reads fail, their answers go nowhere).
    if (shared->pool) shared->pool->Stop();
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
