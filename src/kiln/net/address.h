// Addresses and URLs: what counts as loopback, and the parts of an http(s) URL (net layer).
//
// The one rule both sides of every kiln connection follow: plain HTTP is for loopback only. A
// listener that binds another address, and a client that dials another host, must use TLS unless
// the operator says `insecure_http` out loud. "Loopback" is decided on the text the operator
// wrote, never on a name lookup: `localhost`, 127.0.0.0/8 and ::1.
#pragma once

#include <string>
#include <string_view>

#include "src/kiln/base/status.h"

namespace kiln::net {

// True for "localhost", an IPv4 address in 127.0.0.0/8 and the IPv6 "::1" (bracketed or not).
bool IsLoopbackHost(std::string_view host);

struct HttpUrl {
  std::string scheme;  // "http" or "https"
  std::string host;    // without brackets for IPv6
  int port = 0;        // the explicit port, else 80 / 443
  std::string base;    // scheme://host[:port], no trailing slash
  bool https() const { return scheme == "https"; }
};

// Parses "http://host[:port][/]" or "https://…"; a path other than "/" , a query, user info or
// another scheme is InvalidArgument naming the URL.
Result<HttpUrl> ParseHttpUrl(std::string_view url);

// The transport rule for a client: an https URL, or an http URL to a loopback host, or an http
// URL with `insecure_http`. Otherwise refused `insecure_http_refused`, naming the URL and the way
// out (https, or the explicit flag).
Status CheckClientTransport(const HttpUrl& url, bool insecure_http, std::string_view what);

}  // namespace kiln::net
