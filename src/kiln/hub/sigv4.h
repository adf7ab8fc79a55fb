// AWS Signature Version 4 for S3 requests (hub layer, used by the S3 blob store). Pure functions:
// given the request's method, path, query, headers and payload hash, they produce the canonical
// request, the string to sign and the Authorization header that an S3 server (radosgw, AWS)
// recomputes and compares. Nothing here does I/O; the clock reading comes in as `amz_date`.
//
// Hand-written over OpenSSL's HMAC because Debian 12 packages no C or C++ library that signs
// SigV4 (libs3 2.0 signs only the retired V2 scheme); docs/dependencies.md says more.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kiln {

struct SigV4Credentials {
  std::string access_key;
  std::string secret_key;
  std::string region;          // e.g. "us-east-1"
  std::string service = "s3";  // the scope's service name
  std::string session_token;   // sent as x-amz-security-token when not empty
};

struct SigV4Request {
  std::string method;  // "GET", "PUT", ...
  // The URI path exactly as sent on the wire, already percent-encoded (UriEncodePath).
  std::string path;
  // Query parameters, not encoded; a flag parameter ("uploads") has an empty value.
  std::vector<std::pair<std::string, std::string>> query;
  // Headers to sign, names in any case; must include "host". Values are trimmed when signed.
  std::vector<std::pair<std::string, std::string>> headers;
  // Lowercase hex SHA-256 of the body (also sent as x-amz-content-sha256).
  std::string payload_sha256;
};

// RFC 3986 unreserved characters stay; everything else is %XX (uppercase hex), as SigV4 requires.
// `keep_slash` leaves '/' alone (object key paths).
std::string SigV4UriEncode(std::string_view s, bool keep_slash);
// The query string as sent and as signed: encoded, sorted by name then value, joined by '&'.
std::string SigV4CanonicalQuery(const std::vector<std::pair<std::string, std::string>>& query);
std::string SigV4CanonicalRequest(const SigV4Request& request);
// `amz_date` is "YYYYMMDDTHHMMSSZ" (UTC).
std::string SigV4StringToSign(const SigV4Request& request, const SigV4Credentials& credentials,
                              const std::string& amz_date);
// "AWS4-HMAC-SHA256 Credential=…, SignedHeaders=…, Signature=…".
std::string SigV4Authorization(const SigV4Request& request, const SigV4Credentials& credentials,
                               const std::string& amz_date);
// A presigned URL (query-string authentication): anyone holding it may send `method` to
// `endpoint` + `path` without credentials until `amz_date` + `expires_s`. Only the host header is
// signed and the payload is UNSIGNED-PAYLOAD, so the URL says nothing about the bytes: a reader
// checks them against their digest. `endpoint` is "http(s)://host[:port]" (its host is the signed
// host); `path` is already encoded (UriEncodePath); `query` holds any extra parameters to sign.
// A session token travels as X-Amz-Security-Token. S3 accepts 1 <= expires_s <= 604800.
std::string SigV4PresignUrl(const std::string& method, const std::string& endpoint,
                            const std::string& path,
                            const std::vector<std::pair<std::string, std::string>>& query,
                            const SigV4Credentials& credentials, const std::string& amz_date,
                            int64_t expires_s);
// The current UTC time as "YYYYMMDDTHHMMSSZ".
std::string SigV4Now();

}  // namespace kiln
