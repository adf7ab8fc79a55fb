// The hub: routes over a HubStore, a BlobStore and a KeyRing (hub layer; docs/design.md §9,
// docs/hub-api.md is the wire reference).
//
// Two parts. HubService holds every route as a plain method (principal + parsed inputs in, Reply
// out) so handlers are unit-tested against the in-memory stores without sockets. HubServer binds
// HubService to the net layer's HttpServer (net/http_server.h): it parses the transport (path
// captures, bearer header, streamed bodies, ranges), authenticates a request before it reads a
// byte of its body, bounds every body per route, and is the one place that turns a Reply into
// HTTP. No exception escapes a handler: the server answers 500 {error:"internal"}.
//
// Error bodies are always {"error":"<token>","message":"<prose>"} (plus route-specific fields);
// the token is the contract, the message is for people.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include "src/kiln/base/status.h"
#include "src/kiln/cell/admission.h"
#include "src/kiln/hub/authz.h"
#include "src/kiln/hub/blob_store.h"
#include "src/kiln/hub/builder.h"
#include "src/kiln/hub/metrics.h"
#include "src/kiln/hub/store.h"
#include "src/kiln/net/http_server.h"
#include "src/kiln/receipt/receipt.h"

namespace kiln {

class SharedTokens;  // pg_shared.h

// One route's answer. `html` non-empty means a text/html page instead of `body`.
struct Reply {
  int status = 200;
  nlohmann::json body = nlohmann::json::object();
  std::string html;
  int retry_after_s = 0;  // > 0: a Retry-After header (a refusal that a later try may pass)

  static Reply Json(int status, nlohmann::json body) { return Reply{status, std::move(body), ""}; }
  // {"error":token,"message":message} merged with `extra`.
  static Reply Error(int status, const std::string& token, const std::string& message,
                     nlohmann::json extra = nlohmann::json::object());
  // The translation of a store/blob Status that no route expected: 500 store_corrupt for damage,
  // 503 store_unavailable for IOError, 500 internal otherwise.
  static Reply FromStatus(const Status& status);
  bool ok() const { return status >= 200 && status < 300; }
};

// Pulls a request body chunk by chunk into `sink` (returns false to stop); false if the
// transport failed.
using BodyReader = std::function<bool(const std::function<bool(std::string_view)>& sink)>;

// What a hub decides beyond its stores.
struct HubServiceOptions {
  // Rebuilds every published cell before it is signed (builder.h). null: no rebuild, and the
  // receipts attest none, so no worker adopts those cells unless it minted them itself (for a hub
  // that only stores, and for tests of the rest of the publish path).
  std::shared_ptr<CellBuilder> builder;
  // How long after signing an adopter may rely on a revocation list (its `max_age_s`).
  int64_t revocation_max_age_s = 300;
  // Unreferenced blobs and abandoned intents older than this are collected.
  int64_t blob_grace_s = 24 * 3600;
  // The largest cell.so a publish may carry (AdmitBytes' bound).
  uint64_t max_shared_object_bytes = kDefaultMaxSharedObjectBytes;
  // The most entries (shape classes) a published cell may hold: every entry is a compile for
  // the builder, so a cell of thousands would hold it for minutes (refused too_many_entries).
  size_t max_cell_entries = 256;
  // What a publisher may keep on the hub (cells stored and being uploaded), unless its token
  // says otherwise (TokenRow::quota_bytes); 0 = no limit. Checked at intent and at upload:
  // quota_exceeded (413).
  uint64_t org_quota_bytes = 16ull << 30;
  uint64_t platform_quota_bytes = 0;
  // How long a publisher's claim on (key, family) lives after each step of its publish (intent,
  // upload, complete), so that one publisher uploads while the others wait, and a publisher that
  // died frees the scope this long after its last step (store.h PublishClaim).
  int64_t publish_claim_ttl_s = 300;
  // How long a mint lease holds without a heartbeat (docs/fleet.md "One mint per cold key");
  // holders heartbeat every third of it.
  int64_t mint_lease_ttl_ms = 60000;
  // The clock of mint leases, unix milliseconds (tests pass their own); null: the system clock.
  std::function<int64_t()> mint_lease_clock_ms = nullptr;
  // Lifetime of the direct blob URLs this hub mints when its blob store has them (S3 presigned
  // GETs: a resolve's blob_url, GET /v1/blobs/{digest}?direct=1); 0 mints none, so every
  // download streams through the hub.
  int64_t blob_url_ttl_s = 300;
  // Auto-revocation of a cell that crashes workers (docs/fleet.md "A cell that crashes the
  // worker"): once this many distinct worker machines reported a ref `cell_crashed`, the hub
  // revokes it as an admin would. A machine is the reporting worker's name without its process
  // id, so one worker crash-looping under new pids counts once. 0 = never (the default: the
  // names are the workers' own word).
  int crash_revoke_threshold = 0;
};

// The reason the hub records when it revokes a cell past the crash threshold, and its
// `revoked_by`.
inline constexpr const char* kCrashRevokedBy = "hub:crash-threshold";

// The machine a worker's name stands for: the name without a trailing "/<pid>" (a worker names
// itself "<endpoint>@<host>/<pid>", and the hub prefixes its token's name).
std::string CrashMachineOf(const std::string& worker);

// The refusal of a publish intent while another publisher's claim on (key, family) is live
// (409, with Retry-After): retry later and see "already" (or key_taken) once it completes.
inline constexpr const char* kRefusalPublishInProgress = "publish_in_progress";

// The refusal token of a heartbeat or release whose lease no longer holds its (key, family):
// released, or taken over by another holder after it expired.
inline constexpr const char* kRefusalLeaseLost = "lease_lost";

// What one garbage collection pass removed.
struct CollectedGarbage {
  int intents = 0;
  int blobs = 0;
  int claims = 0;  // expired publish claims
};

// What /v1/ready demands beyond reachability.
struct ReadyOptions {
  uint64_t min_free_bytes = 512ull << 20;  // free disk under the blob store
};

class HubService {
 public:
  // `now` returns unix seconds (tests pass a fixed clock); defaults to the system clock.
  HubService(std::unique_ptr<HubStore> store, std::unique_ptr<BlobStore> blobs,
             std::unique_ptr<KeyRing> keys, std::function<int64_t()> now = nullptr,
             HubServiceOptions options = {});
  ~HubService();
  HubService(const HubService&) = delete;
  HubService& operator=(const HubService&) = delete;

  // The principal of an "Authorization: Bearer …" header, or 401 unauthenticated: a token of the
  // installed set that no admin revoked. Lookups are cached for a few seconds (resolve is the
  // hot path); a revocation through this process clears the cache at once.
  std::variant<Principal, Reply> Authenticate(const std::string& authorization_header);

  // Makes `tokens` this hub's whole token set (the tokens file is the truth at every start, and
  // each hub process keeps its own, so hubs sharing a database never overwrite each other's),
  // leaving out any token an admin revoked; returns the names left out. Authenticate knows no
  // token before this is called.
  Result<std::vector<std::string>> InstallTokens(const std::vector<TokenRow>& tokens);
  // Hub replicas sharing a database: from now on a token is looked up in `tokens` (the set every
  // replica shares) instead of the set InstallTokens gave. Call before serving.
  void ShareTokens(std::unique_ptr<SharedTokens> tokens);

  Reply Health();
  Reply Ready();
  Reply VerifyBlobs();
  Reply ReportBlobMismatch(const Principal& p, const std::string& digest);
  // `family` is the scope asked about: cells are owned per (key, family).
  Reply ResolveCell(const Principal& p, const std::string& key, const std::string& family);
  Reply PublishIntent(const Principal& p, std::string_view body);
  Reply UploadBlob(const Principal& p, const std::string& digest, const BodyReader& read_body);
  Reply PublishComplete(const Principal& p, std::string_view body);
  Reply GetReceipt(const Principal& p, const std::string& key, const std::string& digest);
  Reply Revocations();
  Reply Revoke(const Principal& p, std::string_view body);
  Reply Reinstate(const Principal& p, std::string_view body);
  Reply SetOrder(const Principal& p, std::string_view body);
  Reply Orders();
  Reply RevokeToken(const Principal& p, std::string_view body);
  Reply Jwks();
  Reply RotateKey(const Principal& p);
  // POST /v1/admin/keys/retire {"kid", "not_after"}: pulls a retired key's not-after back (to
  // when it leaked, say); receipts and lists it signed later are refused by every verifier.
  Reply RetireKey(const Principal& p, std::string_view body);
  // POST /v1/admin/receipts/resign: every stored receipt not signed by the current key is signed
  // again by it (same claims), so a retired key can be pulled back to 0 without leaving a
  // genuine cell unverifiable.
  Reply ResignReceipts(const Principal& p);
  Reply CreateRelease(const Principal& p, std::string_view body);
  Reply ReleaseObligations(const Principal& p, const std::string& release);
  Reply SettleObligation(const Principal& p, std::string_view body);
  Reply PostEvents(const Principal& p, std::string_view body);
  Reply QueryEvents(const Principal& p, const std::map<std::string, std::string>& query);
  Reply Dashboard(const Principal& p);
  // Mint leases (mint_lease.cc; docs/hub-api.md): POST /v1/mint-leases,
  // /v1/mint-leases/heartbeat, /v1/mint-leases/release.
  Reply AcquireMintLease(const Principal& p, std::string_view body);
  Reply HeartbeatMintLease(const Principal& p, std::string_view body);
  Reply ReleaseMintLease(const Principal& p, std::string_view body);
  // Blob download: the reader, or a Reply (400 bad_digest, 404 not_found, 403).
  std::variant<std::unique_ptr<BlobReader>, Reply> OpenBlob(const Principal& p,
                                                            const std::string& digest);
  // GET /v1/blobs/{digest}?direct=1: a direct URL of the blob (BlobStore::DirectUrl, valid
  // options.blob_url_ttl_s) for a caller OpenBlob would serve, refused exactly as OpenBlob
  // refuses; "" when this hub mints none (no direct URLs in its store, or a ttl of 0), and the
  // caller streams the blob instead.
  std::variant<std::string, Reply> BlobDirectUrl(const Principal& p, const std::string& digest);
  int64_t blob_url_ttl_s() const { return options_.blob_url_ttl_s; }

  // Deletes intents and unreferenced blobs older than the grace period (HubServiceOptions).
  Result<CollectedGarbage> CollectGarbage();
  // Runs CollectGarbage every `interval_s` on a thread of its own until this object goes.
  void StartMaintenance(int interval_s);

  void set_ready_options(const ReadyOptions& o) { ready_options_ = o; }
  // The builder's queue now (zeros without a builder), for /metrics.
  BuilderLoad builder_load() const {
    return options_.builder ? options_.builder->Load() : BuilderLoad{};
  }
  HubStore& store() { return *store_; }
  BlobStore& blobs() { return *blobs_; }
  KeyRing& keys() { return *keys_; }

  // What this process answered mint-lease requests since it started, for /metrics (a fleet's
  // replicas are summed by the scraper): asks granted, held by another worker, answered
  // `published`, heartbeats refused `lease_lost`, and releases that freed a lease.
  struct LeaseAnswers {
    std::atomic<uint64_t> granted{0}, held{0}, published{0}, lost{0}, released{0};
  };
  const LeaseAnswers& lease_answers() const { return lease_answers_; }
  // Crash reports (event rows of kind cell_crashed) this process accepted, and the cells it
  // revoked past the crash threshold, for /metrics.
  struct CrashCounters {
    std::atomic<uint64_t> reports{0}, revocations{0};
  };
  const CrashCounters& crash_counters() const { return crash_counters_; }

 private:
  int64_t Now() const;
  int64_t LeaseNowMs() const;
  uint64_t QuotaOf(const Principal& p) const;
  std::optional<Reply> CheckQuota(const Principal& p, const std::string& digest, uint64_t adding);
  // Claims (or refreshes) p's claim on (key, family) for `digest`: nullopt when p holds it now,
  // else the 409 publish_in_progress (or a store failure) to answer.
  std::optional<Reply> ClaimPublish(const Principal& p, const std::string& key,
                                    const std::string& family, const std::string& digest);
  // Drops p's claim on (key, family) (logged, never fatal: an unreleased claim expires).
  void ReleasePublishClaim(const Principal& p, const std::string& key, const std::string& family);
  // Discharges what a publish by p of (key, digest) for (release, target, sm) settles: owed
  // obligations of the key or of the release's target slot, within p's releases and org. Returns
  // how many (store failures logged).
  int DischargeFor(const Principal& p, const std::string& key, const std::string& digest,
                   const std::string& release, const std::string& target, const std::string& sm);
  // DischargeFor a publish answered `already` by the stored cell `c` (its sm read from its own
  // metadata), when the release owes anything for the key or the target.
  void DischargeOnAlready(const Principal& p, const CellRow& c, const std::string& release,
                          const std::string& target);
  // The sm recorded in the metadata of the stored blob `digest`.
  Result<std::string> StoredCellSm(const std::string& digest);
  // Whether p may read the blob `digest`: nullopt, or the refusal OpenBlob answers.
  std::optional<Reply> CheckBlobReadable(const Principal& p, const std::string& digest);
  // A direct URL of `digest` when this hub mints them, else "" (a store failure is logged).
  std::string MintBlobUrl(const std::string& digest);
  // PublishComplete's work; *intent is set once p's intent is found.
  Reply CompletePublish(const Principal& p, std::string_view body,
                        std::optional<IntentRow>* intent);
  // The distinct machines (CrashMachineOf) that reported `ref` of `key` crashing a worker.
  Result<int64_t> CrashedMachines(const std::string& key, const std::string& ref);
  // After crash reports of (key, ref) were stored: revokes the cell once the threshold is met.
  void MaybeRevokeCrashed(const std::string& key, const std::string& ref);
  // `rebuild`'s verdict on `digest`, run once however many publishes of those bytes ask at once.
  Result<RebuildAttestation> RebuildOnce(
      const std::string& digest, const std::function<Result<RebuildAttestation>()>& rebuild);
  std::unique_ptr<HubStore> store_;
  std::unique_ptr<BlobStore> blobs_;
  std::unique_ptr<KeyRing> keys_;
  std::function<int64_t()> now_;
  HubServiceOptions options_;
  ReadyOptions ready_options_;
  struct TokenCache;
  std::unique_ptr<TokenCache> token_cache_;
  // The token of `hash` (nullopt: none), from the shared set when there is one.
  Result<std::optional<TokenRow>> FindToken(const std::string& hash);
  // The live (unrevoked) tokens named `name`, or the one of hash `sha256` (one of them empty).
  Result<std::vector<TokenRow>> LiveTokensMatching(const std::string& name,
                                                   const std::string& sha256);
  std::unique_ptr<SharedTokens> shared_tokens_;
  struct Maintenance;
  std::unique_ptr<Maintenance> maintenance_;
  // Blob digests a publish in this process is using (its rebuild, its upload): garbage
  // collection never removes them. Counted: two publishes may hold one digest.
  struct Pins;
  std::unique_ptr<Pins> pins_;
  LeaseAnswers lease_answers_;
  CrashCounters crash_counters_;
};

struct HubOptions {
  std::string data_dir;  // created if missing: hub.sqlite, blobs/, signing/, tokens.json
  std::string db_url;    // "postgresql://…" or empty for SQLite under data_dir
  // "s3://bucket/prefix" (endpoint and credentials from the environment: s3_blob_store.h) or
  // empty for the disk store under data_dir/blobs.
  std::string blobs;
  std::string tokens_file;  // default data_dir/tokens.json
  std::string bind = "127.0.0.1";
  int port = 8470;   // 0: any free port (see HubServer::port())
  int threads = 32;  // handler threads: requests being handled at once (idle connections hold none)
  net::ListenerSettings listener;  // TLS and connection limits
  // PostgreSQL connections shared by the request threads; 0: one per core (at least 2), at most
  // `threads`. On 2 cores with the database on the same host, 2 connections gave p99 6 ms where
  // one per thread (32) gave p99 60-90 ms: every extra backend is one more process competing for
  // the cores (docs/benchmarks.md). A database on another host may want more.
  int db_pool = 0;
  uint64_t max_blob_bytes = 2ull << 30;
  // The builder (builder.h): "verify" rebuilds every cell in a sandbox before signing; "off"
  // signs without a rebuild (receipts then attest none).
  std::string rebuild = "verify";
  SandboxOptions sandbox;
  // More compilers whose cells this hub rebuilds (paths or names on PATH), each with a sandboxed
  // builder of its own beside the one of sandbox.cxx / $KILN_CXX / c++ (builder.h
  // NewToolchainRouter). Empty = that one toolchain only.
  std::vector<std::string> builder_toolchains;
  int64_t revocation_max_age_s = 300;
  int64_t blob_grace_s = 24 * 3600;
  int gc_interval_s = 3600;
  uint64_t max_shared_object_bytes = kDefaultMaxSharedObjectBytes;
  size_t max_cell_entries = 256;           // HubServiceOptions::max_cell_entries
  uint64_t org_quota_bytes = 16ull << 30;  // HubServiceOptions::org_quota_bytes
  uint64_t platform_quota_bytes = 0;       // HubServiceOptions::platform_quota_bytes
  int64_t publish_claim_ttl_s = 300;       // HubServiceOptions::publish_claim_ttl_s
  double mint_lease_ttl_s = 60;            // HubServiceOptions::mint_lease_ttl_ms, in seconds
  int64_t blob_url_ttl_s = 300;            // HubServiceOptions::blob_url_ttl_s
  int crash_revoke_threshold = 0;          // HubServiceOptions::crash_revoke_threshold
  // The scheme and host of the direct blob URLs when readers reach the S3 store by another name
  // than KILN_S3_ENDPOINT (S3Location::public_endpoint); empty: KILN_S3_ENDPOINT.
  std::string blob_url_endpoint;
  // On SIGTERM (Stop()): how long requests being handled may take to finish and send their answer
  // before the listener cuts what is left.
  int drain_timeout_ms = 30000;
  // Every stored blob is re-hashed this often (0: never); a damaged one is quarantined.
  int blob_verify_interval_s = 3600;
  ReadyOptions ready;
};

// The PostgreSQL pool size `options` asks for (see HubOptions::db_pool).
int DbPoolSize(const HubOptions& options);

// What the first start of a data dir produced: the admin token, to print once.
struct HubFirstStart {
  bool created_tokens_file = false;
  std::string admin_token;
};

class HubServer {
 public:
  struct Http;  // the listener and its stop state (server.cc)
  // Opens stores and keys under options.data_dir (creating them on first start), loads the
  // tokens file into the store, binds the port. Does not serve yet.
  static Result<std::unique_ptr<HubServer>> Open(const HubOptions& options,
                                                 HubFirstStart* first_start = nullptr);
  ~HubServer();
  HubServer(const HubServer&) = delete;
  HubServer& operator=(const HubServer&) = delete;

  int port() const { return port_; }
  // "https" with TLS, else "http".
  std::string scheme() const;
  HubService& service() { return *service_; }
  // What GET /metrics shows; a part of the hub adds its gauges here (HubMetrics::RegisterGauge).
  HubMetrics& metrics() { return *metrics_; }
  // Serves until Stop(); returns when the listener closes.
  Status Serve();
  // Drains (HubOptions::drain_timeout_ms: handlers running finish and their answers go out
  // whole, queued requests are answered 503 draining), then closes the listener. Any thread;
  // idempotent; a second caller waits for the first.
  void Stop();
  // Handlers that were still running when Stop() gave up on them: the process should exit at
  // once rather than destroy what they use.
  uint64_t abandoned_handlers() const;
  // Re-reads the TLS certificate and key now (they are also re-read when the files change).
  Status ReloadTls();

 private:
  HubServer() = default;
  // The gauges of the listener, the builder, the store's pool and the blob store.
  void RegisterGauges();
  // Runs VerifyBlobs every options_.blob_verify_interval_s until Stop().
  void VerifyBlobsOnSchedule();
  HubOptions options_;
  int port_ = 0;
  std::unique_ptr<HubService> service_;
  std::unique_ptr<HubMetrics> metrics_ = std::make_unique<HubMetrics>();
  std::unique_ptr<Http> http_;
  std::mutex verify_mu_;
  std::condition_variable verify_cv_;
  bool stopping_ = false;
  std::thread verifier_;
};

}  // namespace kiln
