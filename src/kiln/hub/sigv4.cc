// AWS Signature Version 4 (hub layer). See sigv4.h.
#include "src/kiln/hub/sigv4.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>
#include <cctype>
#include <ctime>

#include "src/kiln/base/sha256.h"

namespace kiln {
namespace {

std::string Hmac(std::string_view key, std::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), out, &len);
  return std::string(reinterpret_cast<const char*>(out), len);
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Leading and trailing blanks go, inner runs of blanks become one space.
std::string Trim(std::string_view s) {
  std::string out;
  bool blank = false;
  for (char c : s) {
    if (c == ' ' || c == '\t') {
      blank = !out.empty();
      continue;
    }
    if (blank) out += ' ';
    blank = false;
    out += c;
  }
  return out;
}

struct Canonical {
  std::string request;
  std::string signed_headers;
};

Canonical Canonicalize(const SigV4Request& r) {
  std::vector<std::pair<std::string, std::string>> headers;
  for (const auto& [name, value] : r.headers) headers.emplace_back(Lower(name), Trim(value));
  std::sort(headers.begin(), headers.end());
  std::string canonical_headers, signed_headers;
  for (const auto& [name, value] : headers) {
    canonical_headers += name + ":" + value + "\n";
    if (!signed_headers.empty()) signed_headers += ';';
    signed_headers += name;
  }
  Canonical c;
  c.request = r.method + "\n" + (r.path.empty() ? "/" : r.path) + "\n" +
              SigV4CanonicalQuery(r.query) + "\n" + canonical_headers + "\n" + signed_headers +
              "\n" + r.payload_sha256;
  c.signed_headers = signed_headers;
  return c;
}

std::string Scope(const SigV4Credentials& k, const std::string& amz_date) {
  return amz_date.substr(0, 8) + "/" + k.region + "/" + k.service + "/aws4_request";
}

// The lowercase hex signature of a canonical request: HMAC of the string to sign under the key
// derived from the secret, the date, the region and the service.
std::string Signature(const Canonical& c, const SigV4Credentials& credentials,
                      const std::string& amz_date) {
  const std::string to_sign = "AWS4-HMAC-SHA256\n" + amz_date + "\n" +
                              Scope(credentials, amz_date) + "\n" + Sha256Hex(c.request);
  std::string key = Hmac("AWS4" + credentials.secret_key, amz_date.substr(0, 8));
  key = Hmac(key, credentials.region);
  key = Hmac(key, credentials.service);
  key = Hmac(key, "aws4_request");
  const std::string sig = Hmac(key, to_sign);
  return HexEncode(reinterpret_cast<const uint8_t*>(sig.data()), sig.size());
}

}  // namespace

std::string SigV4UriEncode(std::string_view s, bool keep_slash) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' ||
        (keep_slash && c == '/')) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

std::string SigV4CanonicalQuery(const std::vector<std::pair<std::string, std::string>>& query) {
  std::vector<std::pair<std::string, std::string>> encoded;
  for (const auto& [k, v] : query) {
    encoded.emplace_back(SigV4UriEncode(k, false), SigV4UriEncode(v, false));
  }
  std::sort(encoded.begin(), encoded.end());
  std::string out;
  for (const auto& [k, v] : encoded) {
    if (!out.empty()) out += '&';
    out += k + "=" + v;
  }
  return out;
}

std::string SigV4CanonicalRequest(const SigV4Request& request) {
  return Canonicalize(request).request;
}

std::string SigV4StringToSign(const SigV4Request& request, const SigV4Credentials& credentials,
                              const std::string& amz_date) {
  return "AWS4-HMAC-SHA256\n" + amz_date + "\n" + Scope(credentials, amz_date) + "\n" +
         Sha256Hex(Canonicalize(request).request);
}

std::string SigV4Authorization(const SigV4Request& request, const SigV4Credentials& credentials,
                               const std::string& amz_date) {
  const Canonical c = Canonicalize(request);
  return "AWS4-HMAC-SHA256 Credential=" + credentials.access_key + "/" +
         Scope(credentials, amz_date) + ", SignedHeaders=" + c.signed_headers +
         ", Signature=" + Signature(c, credentials, amz_date);
}

std::string SigV4PresignUrl(const std::string& method, const std::string& endpoint,
                            const std::string& path,
                            const std::vector<std::pair<std::string, std::string>>& query,
                            const SigV4Credentials& credentials, const std::string& amz_date,
                            int64_t expires_s) {
  std::string base = endpoint;
  while (!base.empty() && base.back() == '/') base.pop_back();
  const size_t scheme = base.find("://");
  const std::string host = scheme == std::string::npos ? base : base.substr(scheme + 3);
  SigV4Request r;
  r.method = method;
  r.path = path.empty() ? "/" : path;
  r.query = query;
  r.query.emplace_back("X-Amz-Algorithm", "AWS4-HMAC-SHA256");
  r.query.emplace_back("X-Amz-Credential",
                       credentials.access_key + "/" + Scope(credentials, amz_date));
  r.query.emplace_back("X-Amz-Date", amz_date);
  r.query.emplace_back("X-Amz-Expires", std::to_string(expires_s));
  r.query.emplace_back("X-Amz-SignedHeaders", "host");
  if (!credentials.session_token.empty()) {
    r.query.emplace_back("X-Amz-Security-Token", credentials.session_token);
  }
  r.headers = {{"host", host}};
  r.payload_sha256 = "UNSIGNED-PAYLOAD";
  const std::string signature = Signature(Canonicalize(r), credentials, amz_date);
  return base + r.path + "?" + SigV4CanonicalQuery(r.query) + "&X-Amz-Signature=" + signature;
}

std::string SigV4Now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[17];
  std::strftime(buf, sizeof buf, "%Y%m%dT%H%M%SZ", &tm);
  return buf;
}

}  // namespace kiln
