// The BlobStore contracts (blob_store.h) on an S3 object store (hub layer): what lets several hub
// replicas share one set of cell bytes without a shared filesystem. Selected by
// `kiln hub --blobs s3://bucket/prefix`; the endpoint and the credentials come from the
// environment (S3LocationFromUrl).
//
// Object layout under `prefix` in `bucket` (path-style requests, SigV4-signed, sigv4.h):
//   sha256/<64 hex>            a verified blob: visible, never overwritten with other bytes
//   staging/<64 hex>.<random>  an upload in progress (single PUT or multipart upload)
//   quarantine/<64 hex>.<t>    a blob whose bytes stopped hashing to its name (Verify)
//
// DirectUrl presigns a GET of sha256/<hex> (SigV4 query-string authentication, sigv4.h) so a
// worker downloads from the store rather than through a hub; the hub mints it only for a caller
// allowed to read that digest, and the reader still checks the bytes against the digest.
//
// Verify-then-visible: the writer streams bytes into a staging object (multipart above
// part_bytes), each request signed with its body's SHA-256 so the store refuses a body that
// changed in flight. Commit checks the declared size and SHA-256 of everything that went out,
// then HEADs the staging object and checks its size and the digest recorded in its metadata,
// then copies it server-side to sha256/<hex> and deletes the staging object. A hub that dies
// before the copy leaves only a staging object or an unfinished multipart upload, never a
// sha256/ key: readers see a blob whole or not at all. TempFileCount counts those leftovers.
//
// Failures are values: IOError with a refusal token (kRefusalS3*) naming the request, the object
// and what the store answered (its S3 error code and HTTP status).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "src/kiln/base/status.h"
#include "src/kiln/hub/blob_store.h"
#include "src/kiln/hub/sigv4.h"

namespace kiln {

// The store refused the credentials or the signature (HTTP 403: SignatureDoesNotMatch,
// InvalidAccessKeyId, AccessDenied).
inline constexpr const char* kRefusalS3Denied = "s3_denied";
// No HTTP answer: connection refused, timeout, TLS failure.
inline constexpr const char* kRefusalS3Unreachable = "s3_unreachable";
// An answer the protocol does not allow here: an unexpected status, a body without the expected
// element, a staged object whose size or digest differs from what was sent.
inline constexpr const char* kRefusalS3BadResponse = "s3_bad_response";
// `--blobs s3://…` or its environment is incomplete or malformed.
inline constexpr const char* kRefusalS3Config = "s3_config";

struct S3Location {
  std::string endpoint;  // "http://127.0.0.1:8000" or "https://s3.example.com"
  std::string bucket;
  std::string prefix;  // "" or ending in '/'
  SigV4Credentials credentials;
  // Uploads larger than this go multipart, in parts of this size (S3's minimum is 5 MiB).
  uint64_t part_bytes = 8ull << 20;
  // Where readers outside the hub reach the store, when that differs from `endpoint` (a public
  // name, a proxy that keeps the Host header): the scheme and host of every DirectUrl. Empty:
  // `endpoint`. The signature covers this host, so it must be the host the reader's request names.
  std::string public_endpoint;
};

// Parses "s3://bucket[/prefix]" and reads KILN_S3_ENDPOINT (required), AWS_ACCESS_KEY_ID and
// AWS_SECRET_ACCESS_KEY (required), AWS_SESSION_TOKEN (optional), AWS_REGION or
// AWS_DEFAULT_REGION (default "us-east-1"). InvalidArgument with token s3_config names what is
// missing or malformed.
Result<S3Location> S3LocationFromUrl(const std::string& url);

// The longest DirectUrl lifetime S3 accepts (seven days).
inline constexpr int64_t kS3MaxPresignSeconds = 7 * 24 * 3600;

// Checks that the bucket answers an authenticated request (HEAD bucket) before returning.
Result<std::unique_ptr<BlobStore>> OpenS3BlobStore(const S3Location& location);

}  // namespace kiln
