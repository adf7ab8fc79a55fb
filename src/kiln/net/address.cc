// Loopback and URL rules (net layer). See address.h.
#include "src/kiln/net/address.h"

#include <arpa/inet.h>

#include <cctype>
#include <string>

namespace kiln::net {

bool IsLoopbackHost(std::string_view host) {
  std::string h(host);
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  for (char& c : h) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (h == "localhost") return true;
  in_addr v4{};
  if (::inet_pton(AF_INET, h.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  in6_addr v6{};
  if (::inet_pton(AF_INET6, h.c_str(), &v6) == 1) {
    return IN6_IS_ADDR_LOOPBACK(&v6);
  }
  return false;
}

Result<HttpUrl> ParseHttpUrl(std::string_view url) {
  auto bad = [&](const std::string& why) {
    return Status::InvalidArgument("URL '" + std::string(url) + "' " + why);
  };
  HttpUrl u;
  std::string_view rest;
  if (url.rfind("http://", 0) == 0) {
    u.scheme = "http";
    rest = url.substr(7);
  } else if (url.rfind("https://", 0) == 0) {
    u.scheme = "https";
    rest = url.substr(8);
  } else {
    return bad("must start with http:// or https://");
  }
  while (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
  if (rest.find_first_of("/?#@") != std::string_view::npos) {
    return bad("must be scheme://host[:port] with no path, query or user");
  }
  std::string_view host = rest, port;
  if (!rest.empty() && rest.front() == '[') {
    const size_t close = rest.find(']');
    if (close == std::string_view::npos) return bad("has an unclosed '[' in its host");
    host = rest.substr(1, close - 1);
    std::string_view after = rest.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') return bad("has text after its IPv6 host");
      port = after.substr(1);
    }
  } else if (const size_t colon = rest.rfind(':'); colon != std::string_view::npos) {
    host = rest.substr(0, colon);
    port = rest.substr(colon + 1);
  }
  if (host.empty()) return bad("has no host");
  u.host = std::string(host);
  u.port = u.https() ? 443 : 80;
  if (!port.empty()) {
    if (port.size() > 5 || port.find_first_not_of("0123456789") != std::string_view::npos) {
      return bad("has port '" + std::string(port) + "'; expected 1-65535");
    }
    u.port = std::stoi(std::string(port));
    if (u.port < 1 || u.port > 65535) {
      return bad("has port '" + std::string(port) + "'; expected 1-65535");
    }
  }
  const bool v6 = u.host.find(':') != std::string::npos;
  u.base = u.scheme + "://" + (v6 ? "[" + u.host + "]" : u.host);
  if (!port.empty()) u.base += ":" + std::to_string(u.port);
  return u;
}

Status CheckClientTransport(const HttpUrl& url, bool insecure_http, std::string_view what) {
  if (url.https() || insecure_http || IsLoopbackHost(url.host)) return Status::OK();
  return Status::Refused(StatusCode::kInvalidArgument, "insecure_http_refused",
                         std::string(what) + " " + url.base +
                             " is plain HTTP to a host that is not loopback: tokens and receipts "
                             "would cross the network in the clear; use https:// (with --ca for a "
                             "private CA) or allow it explicitly with insecure_http");
}

}  // namespace kiln::net
