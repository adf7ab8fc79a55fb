// HubClient: how workers and the CLI talk to a kiln hub (client layer; docs/hub-api.md).
//
// Every call has a connect timeout and a read/write timeout. Every answer is typed: a resolve is
// Found, Miss ({found:false}, the only miss) or Refused with a token — the hub's error token
// (`revoked`, `unauthenticated`, …) or a transport token (kHubUnreachable, kHubTimeout,
// kHubBadResponse below). A refusal is never a miss: a worker that cannot ask the hub must not
// conclude that no cell exists.
//
// Receipts are verified offline (VerifyResolvedReceipt) against trusted public keys configured
// by the operator (a JWKS file, a JWK, or a raw Ed25519 key). A worker whose key set came from
// the hub's JWKS uses HubClient::VerifyReceipt instead: on a key id it does not know (the hub
// rotated its key since the set was fetched) it refetches the hub's key set once and checks again.
//
// Transport: https:// with the server's certificate verified (chain and host name) against
// `ca_file` or the system's CAs; plain http:// only to a loopback host unless `insecure_http`
// (Create refuses it otherwise, `insecure_http_refused`; net/address.h has the rule).
//
// A HubClient serializes its own requests; use one per thread for parallel calls.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "src/kiln/base/status.h"
#include "src/kiln/receipt/receipt.h"

namespace kiln {

// Transport tokens: the request did not reach the hub, or no answer came back from it.
inline constexpr const char* kHubUnreachable = "hub_unreachable";
inline constexpr const char* kHubTimeout = "hub_timeout";
inline constexpr const char* kHubTlsError = "hub_tls_error";
inline constexpr const char* kHubTransportError = "hub_transport_error";
// The hub answered something that is not what the route promises.
inline constexpr const char* kHubBadResponse = "hub_bad_response";
// The hub's own 503: its row store cannot be reached (docs/hub-api.md).
inline constexpr const char* kHubStoreUnavailable = "store_unavailable";
// A resolve answered for another key or another family than the one asked for.
inline constexpr const char* kRefusalResolveKeyMismatch = "resolve_key_mismatch";
inline constexpr const char* kRefusalResolveScopeMismatch = "resolve_scope_mismatch";

// True when `token` says the hub could not be asked (unreachable, timeout, a transport error):
// the same call may succeed later. A TLS failure is not one: it needs an operator.
bool IsHubTransportToken(const std::string& token);

struct HubClientOptions {
  std::string url;    // "https://hub.internal:8470", or "http://127.0.0.1:8470" on loopback
  std::string token;  // bearer token; may be empty for public routes
  // PEM file of the CA(s) that sign the hub's certificate (a private CA); empty: the system's.
  std::string ca_file;
  // Allow plain http:// to a host that is not loopback (tokens cross the network in the clear).
  bool insecure_http = false;
  double connect_timeout_s = 3;
  double io_timeout_s = 30;  // read and write, per socket operation
  // GET calls (resolve, receipts, JWKS, any GET through Call) whose connection was refused or
  // reset before an answer, or that got a gateway's 502/503/504, are tried again up to this many
  // times (a silent hub that let the I/O timeout pass is not), after jittered waits
  // (base/backoff.h) of at most retry_max_ms each, from retry_initial_ms doubling: at most 1.5 s in
  // all with the defaults.
  int get_retries = 4;
  int retry_initial_ms = 100;
  int retry_max_ms = 1000;
};

// The outcome of one call. `token` is empty on success; otherwise the hub's error token or a
// transport token. `body` is the JSON the hub answered (also on refusals).
struct HubAnswer {
  int http_status = 0;
  std::string token;
  std::string message;
  nlohmann::json body;
  bool ok() const { return token.empty(); }
};

struct ResolveAnswer {
  enum class Kind { kFound, kMiss, kRefused };
  Kind kind = Kind::kRefused;
  // kFound
  std::string key, digest, family, publisher, tier, release, receipt;
  uint64_t size = 0;
  // A presigned URL of the blob in the hub's object store, when the hub mints them (empty
  // otherwise), valid for blob_url_expires_in_s from the answer: FetchBlob's direct path.
  std::string blob_url;
  int64_t blob_url_expires_in_s = 0;
  // kRefused
  std::string token, message;
  int http_status = 0;
};
const char* ResolveKindName(ResolveAnswer::Kind kind);  // "found" | "miss" | "refused"

// The hub's refusal of an intent while another publisher publishes the same key and family
// (the hub's kRefusalPublishInProgress; one word on the wire).
inline constexpr const char* kHubPublishInProgress = "publish_in_progress";

struct PublishOptions {
  std::string release;
  std::string target;
  std::string family;  // default: the family in the cell's metadata
  // While another publisher holds the key (publish_in_progress), the intent is retried with
  // jittered backoff for at most this long (and at most 64 times); then that refusal is the
  // answer. 0: no retry.
  int claim_wait_ms = 120000;
};

struct PublishAnswer {
  bool ok() const { return token.empty(); }
  bool already = false;  // the hub already held exactly these bytes for this key
  std::string key, digest, receipt;
  std::string token, message;  // refusal, e.g. key_taken (receipt then holds the owner's)
  int http_status = 0;
};

// One request passed through as it is (HubClient::Relay): the hub's status, body and the headers
// a worker's calls read. `token` is set only when no answer came back (a transport token, as a
// Call's); `retryable` then says whether a GET would be tried again.
struct RelayAnswer {
  int http_status = 0;
  std::string body;
  std::string content_type, location, retry_after, content_range;
  std::string token, message;
  bool retryable = false;
};

class HubClient {
 public:
  static Result<std::unique_ptr<HubClient>> Create(const HubClientOptions& options);
  ~HubClient();
  HubClient(const HubClient&) = delete;
  HubClient& operator=(const HubClient&) = delete;

  // The cell that owns `key` in `family` (cells are owned per key and family, so one scope's
  // cell never answers for another's). An answer for another key is resolve_key_mismatch, for
  // another family resolve_scope_mismatch.
  ResolveAnswer Resolve(const std::string& key, const std::string& family);
  // intent -> upload (skipped when the hub has the bytes) -> complete.
  PublishAnswer Publish(std::string_view cell_tar, const PublishOptions& options);
  // Downloads a blob into `dest_path`, resuming from `dest_path + ".part"` with an HTTP Range,
  // verifying SHA-256 (and size when given) before an atomic rename. Token digest_mismatch if
  // the bytes are not the digest.
  //
  // Direct path: the bytes come from the hub's object store when the hub offers a URL for them,
  // `direct_url` (a resolve's blob_url) or else the 307 of GET /v1/blobs/{digest}?direct=1, sent
  // without this client's token and under the same transport rule as the hub (https, or http to
  // loopback or with insecure_http). The URL is trusted for nothing: the bytes are checked
  // against the digest as above, and on any failure of the direct path (refused, expired,
  // unreachable, bytes that are not the digest) the blob is fetched through the hub instead. A
  // successful answer's body says {"via": "direct"|"hub"} and, after a failed direct try,
  // "direct_error" (why).
  HubAnswer FetchBlob(const std::string& digest, const std::string& dest_path,
                      std::optional<uint64_t> expected_size = std::nullopt,
                      const std::string& direct_url = "");
  HubAnswer GetReceipt(const std::string& key, const std::string& digest);
  HubAnswer GetJwks();
  // {"list": the signed revocation list (receipt.h VerifyRevocationList), …}.
  HubAnswer GetRevocations();
  // Fetches the hub's key set and adds the keys `*trusted` lacks. The fetch's transport or hub
  // token on failure.
  Status AddHubKeys(PublicKeySet* trusted);
  HubAnswer Revoke(const std::string& key, const std::string& digest, const std::string& reason);
  // Lifts a revocation (admin): POST /v1/admin/reinstate.
  HubAnswer Reinstate(const std::string& key, const std::string& digest, const std::string& reason);
  HubAnswer PostEvents(const nlohmann::json& rows);
  HubAnswer SettleObligation(const std::string& release, const std::string& target,
                             const std::string& sm, const std::string& token);
  // Checks a Found answer's receipt like VerifyResolvedReceipt against `*trusted`; when the
  // receipt's key id is not in `*trusted`, fetches this hub's key set (GET /.well-known/jwks.json)
  // once, adds its keys to `*trusted` and checks again (docs/design.md "Receipt checks": refetch
  // the key set once on an unknown id). A kid still unknown after a refetch stays refused
  // receipt_unknown_kid and is remembered, so a foreign kid costs this client one fetch, not one
  // per check; a failed refetch leaves the refusal receipt_unknown_kid (fail closed) with the
  // transport token in the message. For key sets whose source is this hub; operator-configured
  // offline trust anchors (kiln resolve --trust) use VerifyResolvedReceipt.
  ReceiptVerdict VerifyReceipt(const ResolveAnswer& answer, PublicKeySet* trusted);
  // Sends `method` `target` (path and query) with this client's token, `body` and, when not
  // empty, the request's Content-Type and Range, once (the keep-alive resend aside: no GET
  // retries, the caller has its own), and answers what came back without reading it: any status,
  // any bytes, a 307's Location. For a broker that holds the token on behalf of a process that
  // must not (worker/broker.h).
  RelayAnswer Relay(const std::string& method, const std::string& target, const std::string& body,
                    const std::string& content_type, const std::string& range);
  // Any JSON route: method "GET" | "POST" | "PUT".
  HubAnswer Call(const std::string& method, const std::string& path, const std::string& body = "",
                 const std::string& content_type = "application/json");

 private:
  HubClient() = default;
  // POST /v1/publish/intent, retried while the hub answers publish_in_progress (at most
  // `wait_ms` and 64 tries, jittered backoff between).
  HubAnswer PublishIntentWaiting(const std::string& intent, int wait_ms);
  // FetchBlob's direct path: GET `url` into `part` (resuming it) and check the digest; "" on
  // success, else why not (bytes that are not the digest are removed). *status: the store's HTTP
  // status (206 for a resumed download).
  std::string FetchDirect(const std::string& url, const std::string& digest,
                          const std::string& part, std::optional<uint64_t> expected_size,
                          int* status);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Trusted receipt keys from a file or literal text (JWKS, JWK, base64url or hex raw key).
Result<PublicKeySet> LoadTrustedKeys(const std::string& path_or_text);

// Checks a Found answer's receipt offline: EdDSA only, known kid, valid signature, claims equal
// to the answer's key, digest, size and family (see VerifyReceipt for the tokens).
ReceiptVerdict VerifyResolvedReceipt(const ResolveAnswer& answer, const PublicKeySet& trusted);

}  // namespace kiln
