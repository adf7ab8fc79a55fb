// Plain sockets for tests that must misbehave on purpose (net layer tests and the transport
// end-to-end tests): connect to a loopback port, drip bytes, stay idle, send a declared length and
// never the body, and read one HTTP/1.1 answer with a deadline. No HTTP library would let a test
// be this rude.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <string>

namespace kiln::net_testing {

class RawConn {
 public:
  RawConn() = default;
  explicit RawConn(int port) { Connect(port); }
  ~RawConn() { Close(); }
  RawConn(RawConn&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  RawConn& operator=(RawConn&& o) noexcept {
    Close();
    fd_ = o.fd_;
    o.fd_ = -1;
    return *this;
  }

  // errno of a failed connect, 0 on success. `source`: the loopback address to connect from
  // (127.0.0.2, ...: another client address as the server sees it); null for the default.
  int Connect(int port, const char* source = nullptr) {
    Close();
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (source != nullptr) {
      sockaddr_in from{};
      from.sin_family = AF_INET;
      ::inet_pton(AF_INET, source, &from.sin_addr);
      if (::bind(fd_, reinterpret_cast<sockaddr*>(&from), sizeof(from)) != 0) {
        const int e = errno;
        Close();
        return e;
      }
    }
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      const int e = errno;
      Close();
      return e;
    }
    int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return 0;
  }
  bool ok() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  // Sends all of `bytes`; false on an error (the peer closed or reset).
  bool Send(const std::string& bytes) {
    size_t at = 0;
    while (at < bytes.size()) {
      const ssize_t n = ::send(fd_, bytes.data() + at, bytes.size() - at, MSG_NOSIGNAL);
      if (n <= 0) {
        if (n < 0 && errno == EINTR) continue;
        return false;
      }
      at += static_cast<size_t>(n);
    }
    return true;
  }

  // True when the peer has closed (a read returns 0 or an error) within `ms`.
  bool ClosedWithin(int ms) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    char buf[4096];
    while (std::chrono::steady_clock::now() < until) {
      pollfd p{fd_, POLLIN, 0};
      const int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                            until - std::chrono::steady_clock::now())
                                            .count());
      if (::poll(&p, 1, std::max(1, left)) <= 0) continue;
      const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) return true;
    }
    return false;
  }

  struct Answer {
    int status = 0;                              // 0: no complete answer
    std::map<std::string, std::string> headers;  // names lowercased
    std::string body;
    int error = 0;  // errno when the connection failed (ECONNRESET, ...)
    bool closed = false;
  };
  // Reads one answer (Content-Length framed) within `ms`. Interim 1xx answers are skipped but
  // counted in *interim when given.
  Answer Read(int ms, int* interim = nullptr) {
    Answer a;
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    while (true) {
      const size_t end = buf_.find("\r\n\r\n");
      if (end != std::string::npos) {
        const std::string head = buf_.substr(0, end);
        int status = 0;
        std::sscanf(head.c_str(), "HTTP/%*d.%*d %d", &status);
        if (status >= 100 && status < 200) {
          if (interim) ++*interim;
          buf_.erase(0, end + 4);
          continue;
        }
        std::map<std::string, std::string> headers;
        size_t at = head.find("\r\n");
        while (at != std::string::npos && at < head.size()) {
          const size_t next = head.find("\r\n", at + 2);
          const std::string line =
              head.substr(at + 2, next == std::string::npos ? std::string::npos : next - at - 2);
          const size_t colon = line.find(':');
          if (colon != std::string::npos) {
            std::string k = line.substr(0, colon);
            for (char& c : k) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
            std::string v = line.substr(colon + 1);
            while (!v.empty() && v.front() == ' ') v.erase(0, 1);
            headers[k] = v;
          }
          at = next;
        }
        const size_t length =
            headers.count("content-length") ? std::stoull(headers["content-length"]) : 0;
        if (buf_.size() >= end + 4 + length) {
          a.status = status;
          a.headers = std::move(headers);
          a.body = buf_.substr(end + 4, length);
          buf_.erase(0, end + 4 + length);
          return a;
        }
      }
      const auto now = std::chrono::steady_clock::now();
      if (now >= until) return a;
      pollfd p{fd_, POLLIN, 0};
      const int left = static_cast<int>(
          std::chrono::duration_cast<std::chrono::milliseconds>(until - now).count());
      if (::poll(&p, 1, std::max(1, left)) <= 0) continue;
      char chunk[65536];
      const ssize_t n = ::recv(fd_, chunk, sizeof(chunk), 0);
      if (n < 0) {
        a.error = errno;
        return a;
      }
      if (n == 0) {
        a.closed = true;
        return a;
      }
      buf_.append(chunk, static_cast<size_t>(n));
    }
  }

 private:
  int fd_ = -1;
  std::string buf_;
};

}  // namespace kiln::net_testing
