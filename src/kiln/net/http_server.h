// HttpServer: the HTTP/1.1 listener the hub and the worker both bind their routes to (net layer,
// below hub/ and worker/, above base/ only; docs/transport.md is the operator's reference).
//
// Why it exists: a front end must survive slow, idle and hostile clients. Connections live on a
// small event loop (Boost.Asio, parsing by Boost.Beast) and cost no thread while they wait, so a
// thousand idle keep-alive connections or a room of slowloris clients hold only sockets. A
// request takes a handler thread from its headers to its answer; the body is read only when the
// handler pulls it, so a route authenticates and bounds a request before a byte of its body
// arrives. Every wait has a deadline:
//   - TLS handshake and request headers: `header_timeout_ms` from the first byte;
//   - an idle keep-alive connection: closed after `keepalive_idle_ms`;
//   - a body: each read waits at most `body_idle_timeout_ms`, and the whole body must arrive
//     within max(body_timeout_ms, length / min_body_rate);
//   - an answer: `write_timeout_ms`;
//   - a handler: its route's `deadline_ms` (else `handler_deadline_ms`), counted from the moment
//     its request is queued, not counting the time its body reads wait on the client (those have
//     the body deadlines above). A request still queued at its deadline is answered 503
//     `overloaded`; a handler still running is answered 503 `handler_deadline` (both with
//     Retry-After, the connection closed) and counted as stuck until it returns: `stuck()` is what
//     health routes report. The thread cannot be taken back; its late answer is dropped.
// Bounds answered at once, from the event loop, without a handler thread and without reading the
// body: a Content-Length above the route's limit (413), more connections from one client address
// than `max_connections_per_client` or in all than `max_connections` (503 + Retry-After), a full
// handler queue (503 + Retry-After), headers over `max_header_bytes` (431). A refused body is
// never drained: the answer carries `Connection: close`, the socket stops reading after at most
// `linger_bytes`, and an `Expect: 100-continue` client is never told to send it.
//
// Trailers and chunk lines are bounded too: the bytes a connection buffers ahead of its parser are
// at most max_header_bytes + 64 KiB, and the fields of a chunked body's trailer at most
// `max_header_bytes` in all; a trailer or chunk line past either fails the body read
// `headers_too_large` (the binding answers 431). Trailer fields are dropped, never handed to a
// handler. A body read always ends: whatever happens on the event loop, the waiting handler gets
// its bytes or a refusal.
//
// Connections: `max_connections` in all and `max_connections_per_client` per client address, with
// a reserve for newcomers: the last `reserved_connections` of the cap (max_connections / 8 by
// default) go only to addresses holding fewer than `reserve_per_client` connections, so a few
// addresses that fill the cap leave room for others. At the cap itself, an idle connection of the
// address holding the most is closed to make room for an address holding few.
//
// Drain (Drain(), on SIGTERM): stop accepting; close idle connections; answer requests that have
// not reached a handler 503 `draining` with Retry-After; let running handlers finish and every
// answer already started stream out whole, each on a connection that then closes; until all are
// done or the drain deadline passes. Stop() then ends whatever is left.
//
// TLS (OpenSSL through asio::ssl) when `tls` is set: TLS 1.2 or later, the certificate chain and
// key re-read when their files change (checked every `reload_check_ms`) or on ReloadTls(), so a
// renewed certificate needs no restart; connections already open keep the one they shook hands
// with. Plain HTTP is refused on any address that is not loopback unless `insecure_http` says so.
//
// No exception leaves this library: a handler that throws answers 500 and is logged.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "src/kiln/base/status.h"

namespace kiln::net {

// The request line and headers: everything a handler sees before it chooses to read the body.
struct Request {
  std::string method;                        // "GET", "POST", ...
  std::string target;                        // as sent: path and query
  std::string path;                          // the path, percent-decoded per segment
  std::map<std::string, std::string> query;  // decoded; a repeated name keeps the last
  std::vector<std::string> captures;         // the route's {} segments, decoded
  std::vector<std::pair<std::string, std::string>> headers;  // as sent
  std::optional<uint64_t> content_length;                    // nullopt: none sent, or chunked
  bool chunked = false;
  std::string peer;  // the client's address
  bool tls = false;

  // The first header of that name (case-insensitive), "" when absent.
  std::string Header(std::string_view name) const;
  bool HasHeader(std::string_view name) const;
  bool HasBody() const { return chunked || content_length.value_or(0) > 0; }
};

// The refusals a body read reports (Status::token()). The hub and the worker answer a client with
// the same token: one event, one word, whichever server saw it (docs/transport.md).
inline constexpr const char* kBodyTimeout = "body_timeout";        // the client stopped sending
inline constexpr const char* kBodyTooLarge = "body_too_large";     // past the route's limit
inline constexpr const char* kBodyIncomplete = "body_incomplete";  // the connection ended first
// A header block, a trailer or a chunk line past max_header_bytes: the binding answers 431.
inline constexpr const char* kHeadersTooLarge = "headers_too_large";
// What the server answers by itself, and the hub and the worker answer the same way: a body over
// a limit (413), every handler busy (503), a request without the credential a route needs (401).
inline constexpr const char* kTooLarge = "too_large";
inline constexpr const char* kOverloaded = "overloaded";
inline constexpr const char* kUnauthenticated = "unauthenticated";

// A request body, pulled by its handler. Not thread-safe: one handler reads it.
class Body {
 public:
  virtual ~Body() = default;
  // Reads up to `cap` bytes into `buf`; 0 at the end of the body. A failure is a refusal whose
  // token says why: `body_timeout` (the client stopped sending), `body_too_large` (a chunked body
  // passed the route's limit), `body_incomplete` (the connection ended first).
  virtual Result<size_t> Read(char* buf, size_t cap) = 0;
  // Reads the whole body; a body over `limit` bytes is refused `body_too_large` as soon as the
  // limit is passed, without reading the rest.
  Result<std::string> ReadAll(size_t limit);
};

// An answer. A streamed body (`stream` set) of `stream_length` bytes is pulled in pieces on the
// event loop: `stream(offset, buf, cap)` fills buf and returns how many bytes it wrote (>0), or a
// Status that ends the connection. It must not block for long (a read from a local file is fine).
struct Response {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  std::function<Result<size_t>(uint64_t offset, char* buf, size_t cap)> stream;
  uint64_t stream_length = 0;
  bool close = false;  // end the connection after this answer

  static Response Text(int status, std::string body, std::string content_type);
};

using Handler = std::function<Response(const Request&, Body&)>;

struct Route {
  std::string method;
  // Literal segments and `{}` captures, one path segment each: "/v1/blobs/{}".
  std::string pattern;
  // A Content-Length above this is answered 413 before the handler runs; a chunked body is cut
  // off at it (`body_too_large`). 0: the route takes no body.
  uint64_t max_body_bytes = 0;
  // A cheap handler that never blocks (a health check, a metrics page): it runs on the event
  // loop, so it answers even while every handler thread is busy.
  bool on_event_loop = false;
  // The handler's deadline in ms (see the header comment); 0: ServerOptions::handler_deadline_ms.
  int deadline_ms = 0;
  Handler handler;
};

struct TlsOptions {
  std::string cert_file;       // PEM: the certificate, then its chain
  std::string key_file;        // PEM private key
  int reload_check_ms = 2000;  // how often the two files are checked for a change; 0: never
};

struct ServerOptions {
  std::string name = "http";  // names this listener in logs and messages ("hub", "worker admin")
  std::string bind = "127.0.0.1";
  int port = 0;  // 0: any free port (see HttpServer::port())
  std::optional<TlsOptions> tls;
  bool insecure_http = false;  // allow plain HTTP on an address that is not loopback
  int io_threads = 2;          // event-loop threads
  int handler_threads = 16;    // requests being handled at once
  int max_queued = 1024;       // requests waiting for a handler thread (headers only); more: 503
  int backlog = 4096;          // listen backlog (the kernel caps it at net.core.somaxconn)
  int max_connections = 8192;
  int max_connections_per_client = 1024;  // by client address
  // The top of max_connections kept for addresses holding few connections; -1: max / 8.
  int reserved_connections = -1;
  int reserve_per_client = 16;  // an address holding fewer than this may use the reserve
  int header_timeout_ms = 10000;
  int keepalive_idle_ms = 30000;
  int body_idle_timeout_ms = 10000;
  int body_timeout_ms = 30000;
  uint64_t min_body_rate = 256 * 1024;  // bytes per second a long body must keep up on average
  int write_timeout_ms = 60000;
  int handler_deadline_ms = 60000;  // a route's default deadline (Route::deadline_ms)
  // How long Stop() waits for running handlers after it ended their connections; handlers still
  // running then are abandoned (stats().handlers_abandoned) and the caller should exit.
  int stop_grace_ms = 5000;
  uint32_t max_header_bytes = 16 * 1024;
  uint64_t linger_bytes = 1 << 20;  // unread body bytes discarded after a refusal before closing
  int retry_after_s = 1;
  // The body of an answer the server gives itself (404, 405, 413, 431, 400, 503): the binding's
  // error shape. Default: {"error": token, "message": message}.
  std::function<Response(int status, const std::string& token, const std::string& message)>
      error_response;
};

// What an operator sets for one listener (the hub's flags, the worker's): TLS files and the
// limits that bound slow or greedy clients. The hub and the worker each hold one and ApplyTo copies
// it into the server's options, so a new limit is added here once.
struct ListenerSettings {
  // PEM certificate chain and key, both or neither; re-read when the files change. Without them
  // the listener speaks plain HTTP, which needs a loopback bind unless `insecure_http`.
  std::string tls_cert;
  std::string tls_key;
  int tls_reload_ms = 2000;
  bool insecure_http = false;
  int max_connections = 8192;
  int max_connections_per_client = 1024;
  int header_timeout_ms = 10000;  // TLS handshake and request headers, from the first byte
  int keepalive_idle_ms = 30000;  // an idle keep-alive connection is closed after this
  int body_idle_timeout_ms = 10000;

  void ApplyTo(ServerOptions* so) const;
};

// Counters for /metrics and tests.
struct ServerStats {
  uint64_t connections_open = 0;
  uint64_t connections_total = 0;
  uint64_t requests_total = 0;
  uint64_t refused_over_capacity = 0;  // per-client or global connection cap
  uint64_t refused_saturated = 0;      // handler queue full
  uint64_t refused_too_large = 0;      // 413 from Content-Length
  uint64_t header_timeouts = 0;        // slow or silent request headers
  uint64_t body_timeouts = 0;
  uint64_t tls_handshake_failures = 0;
  uint64_t tls_reloads = 0;
  uint64_t refused_headers_too_large = 0;  // 431: headers, a trailer or a chunk line too long
  uint64_t queue_deadlines = 0;            // requests answered 503 before reaching a handler
  uint64_t handler_deadlines = 0;          // handlers answered 503 past their deadline
  uint64_t handlers_stuck = 0;             // gauge: handlers past their deadline, still running
  uint64_t evicted_idle = 0;               // idle connections closed to make room at the cap
  uint64_t handlers_abandoned = 0;         // handlers still running when Stop() gave up on them
  uint64_t queued = 0;                     // gauge: requests waiting for a handler thread
};

class HttpServer {
 public:
  // Validates the options and routes, loads the TLS certificate and key, binds and listens; does
  // not serve yet. Refused `insecure_http_refused` for plain HTTP on a non-loopback address
  // without `insecure_http`; IOError naming the address when the bind fails; InvalidArgument
  // naming the file for a certificate or key that does not load or match.
  static Result<std::unique_ptr<HttpServer>> Create(ServerOptions options,
                                                    std::vector<Route> routes);
  ~HttpServer();  // Stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const;
  bool tls() const;
  // Starts the event loop and the handler threads in the background. Call once.
  Status Start();
  // Graceful drain (see the header comment): returns true when every connection ended before
  // `timeout_ms`. New connections are refused from the first moment. Any thread except a
  // handler's; call Stop() after it.
  bool Drain(int timeout_ms);
  // Stops accepting, ends every connection, waits up to `stop_grace_ms` for running handlers and
  // joins every thread (abandoning the handlers still running then). Idempotent; any thread
  // except a handler's.
  void Stop();
  // Handlers running past their deadline now (health routes report this).
  uint64_t stuck() const;
  // Re-reads the certificate and key now. A failure keeps the certificate in use.
  Status ReloadTls();
  ServerStats stats() const;

 private:
  HttpServer() = default;
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

// Prometheus text for the listeners' counters, each series labelled listener="<name>".
std::string StatsMetricsText(const std::vector<std::pair<std::string, ServerStats>>& listeners);

}  // namespace kiln::net
