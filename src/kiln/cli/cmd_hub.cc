// `kiln hub`, `kiln publish`, `kiln resolve`: the hub server and its two everyday clients (cli
// layer). The routes they use are documented in docs/hub-api.md.
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <thread>

#include "src/kiln/base/file.h"
#include "src/kiln/base/sha256.h"
#include "src/kiln/base/signals.h"
#include "src/kiln/cell/metadata.h"
#include "src/kiln/cell/pack.h"
#include "src/kiln/cli/commands.h"
#include "src/kiln/client/hub_client.h"
#include "src/kiln/hub/builder.h"
#include "src/kiln/hub/server.h"
#include "src/kiln/mint/rebuild_child.h"
#include "src/kiln/mint/regenerate.h"

namespace kiln::cli {

namespace {

struct HubArgs {
  HubOptions options;
};

int RunHub(HubArgs& args) {
  // SIGINT/SIGTERM are taken by one thread that stops the server, SIGHUP by the same thread to
  // re-read the TLS certificate; every other thread (the server's start after this) has them
  // blocked.
  const sigset_t set = BlockStopSignals();
  signal(SIGPIPE, SIG_IGN);

  HubFirstStart first;
  auto hub = HubServer::Open(args.options, &first);
  if (!hub.ok()) return ReportError("hub", hub.status());
  if (first.created_tokens_file) {
    std::printf(
        "kiln hub: created %s/tokens.json with an admin token. It is shown once and stored only "
        "as its SHA-256:\n  admin token: %s\n",
        args.options.data_dir.c_str(), first.admin_token.c_str());
  }
  std::printf("kiln hub: listening on %s://%s:%d (%s)\n", (*hub)->scheme().c_str(),
              args.options.bind.c_str(), (*hub)->port(),
              (*hub)->service().store().Describe().c_str());
  std::fflush(stdout);
  HubServer* server = hub->get();
  std::thread([set, server] {
    const int sig = WaitForStopSignal(set, [server] {
      Status s = server->ReloadTls();
      std::fprintf(stderr, "kiln hub: SIGHUP: TLS reload: %s\n", s.ToString().c_str());
    });
    std::fprintf(stderr, "kiln hub: signal %d, stopping\n", sig);
    server->Stop();
  }).detach();
  Status served = (*hub)->Serve();
  if (!served.ok()) return ReportError("hub", served);
  if (const uint64_t abandoned = (*hub)->abandoned_handlers(); abandoned > 0) {
    // Their threads still use the stores: exit without destroying anything under them.
    std::fprintf(stderr,
                 "kiln hub: %llu request handler(s) never returned; exiting without cleanup\n",
                 static_cast<unsigned long long>(abandoned));
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(1);
  }
  return 0;
}

struct ClientArgs {
  std::string hub;
  std::string token;
  std::string ca;
  bool insecure_http = false;
  double timeout_s = 30;
};

Result<std::unique_ptr<HubClient>> MakeClient(const ClientArgs& a) {
  HubClientOptions o;
  o.url = a.hub;
  o.token = a.token;
  if (o.token.empty()) {
    if (const char* env = std::getenv("KILN_HUB_TOKEN")) o.token = env;
  }
  o.io_timeout_s = a.timeout_s;
  o.ca_file = a.ca;
  o.insecure_http = a.insecure_http;
  return HubClient::Create(o);
}

void AddClientOptions(CLI::App* cmd, ClientArgs* a) {
  cmd->add_option("--hub", a->hub, "hub URL, e.g. https://hub.internal:8470")->required();
  cmd->add_option("--token", a->token, "bearer token (default: $KILN_HUB_TOKEN)");
  cmd->add_option("--ca", a->ca, "PEM file of the CA that signs the hub's certificate");
  cmd->add_flag("--insecure-http", a->insecure_http,
                "allow plain http:// to a hub that is not on loopback");
  cmd->add_option("--timeout", a->timeout_s, "seconds per socket operation");
}

struct PublishArgs {
  ClientArgs client;
  std::string cell;
  PublishOptions options;
};

int RunPublish(const PublishArgs& a) {
  auto bytes = ReadFile(a.cell);
  if (!bytes.ok()) return ReportError("publish", bytes.status());
  auto client = MakeClient(a.client);
  if (!client.ok()) return ReportError("publish", client.status());
  PublishAnswer p = (*client)->Publish(*bytes, a.options);
  nlohmann::json out{{"key", p.key}, {"digest", p.digest}};
  if (!p.ok()) {
    out["refused"] = p.token;
    out["message"] = p.message;
    if (!p.receipt.empty()) out["owner_receipt"] = p.receipt;
    std::printf("%s\n", out.dump(2).c_str());
    std::fprintf(stderr, "kiln publish: refused: %s: %s\n", p.token.c_str(), p.message.c_str());
    return 1;
  }
  out["already"] = p.already;
  out["receipt"] = p.receipt;
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

struct ResolveArgs {
  ClientArgs client;
  std::string key;
  std::string family;
  std::string trust;
};

struct RebuildArgs {
  std::string child_dir;
  std::string cell;
  std::string out;
  int parallel = 2;
};

// `kiln rebuild CELL.tar`: rebuilds the cell's shared object from its source with this machine's
// toolchain and compares (exit 0 equal, 1 not, 2 cannot rebuild here). `--child DIR` is the
// hub's sandboxed builder (hub/builder.h).
int RunRebuild(const RebuildArgs& a) {
  if (!a.child_dir.empty()) return RunRebuildChild(a.child_dir);
  auto bytes = ReadFile(a.cell);
  if (!bytes.ok()) return ReportError("rebuild", bytes.status());
  auto files = UnpackCell(*bytes, a.cell);
  if (!files.ok()) return ReportError("rebuild", files.status());
  auto metadata = ParseMetadata(files->metadata_json, a.cell + ": metadata.json");
  if (!metadata.ok()) return ReportError("rebuild", metadata.status());
  char tmpl[] = "/tmp/kiln-rebuild-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return ReportError("rebuild", Status::IOError("mkdtemp"));
  auto so = RebuildSharedObject(files->source, *metadata, tmpl, a.parallel);
  std::error_code ec;
  std::filesystem::remove_all(tmpl, ec);
  if (!so.ok()) {
    ReportError("rebuild", so.status());
    return 2;
  }
  if (!a.out.empty()) {
    if (Status s = WriteFileAtomic(a.out, *so); !s.ok()) return ReportError("rebuild", s);
  }
  Status same = CompareRebuild(files->shared_object, *so);
  nlohmann::json out{{"key", metadata->key},
                     {"source_digest", MemberDigest(files->source)},
                     {"so_digest", MemberDigest(files->shared_object)},
                     {"rebuilt_digest", MemberDigest(*so)},
                     {"equal", same.ok()}};
  std::printf("%s\n", out.dump(2).c_str());
  if (!same.ok()) {
    std::fprintf(stderr, "kiln rebuild: %s\n", same.message().c_str());
    return 1;
  }
  return 0;
}

// Exit: 0 found (and verified when --trust is given), 3 miss, 1 refused or receipt refused.
int RunResolve(const ResolveArgs& a) {
  auto client = MakeClient(a.client);
  if (!client.ok()) return ReportError("resolve", client.status());
  ResolveAnswer r = (*client)->Resolve(a.key, a.family);
  nlohmann::json out{{"answer", ResolveKindName(r.kind)}, {"key", a.key}};
  if (r.kind == ResolveAnswer::Kind::kMiss) {
    std::printf("%s\n", out.dump(2).c_str());
    return 3;
  }
  if (r.kind == ResolveAnswer::Kind::kRefused) {
    out["refused"] = r.token;
    out["message"] = r.message;
    out["http_status"] = r.http_status;
    std::printf("%s\n", out.dump(2).c_str());
    return 1;
  }
  out["digest"] = r.digest;
  out["size"] = r.size;
  out["family"] = r.family;
  out["publisher"] = r.publisher;
  out["tier"] = r.tier;
  out["receipt"] = r.receipt;
  if (a.trust.empty()) {
    out["receipt_verified"] = false;
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  auto trusted = LoadTrustedKeys(a.trust);
  if (!trusted.ok()) return ReportError("resolve", trusted.status());
  ReceiptVerdict v = VerifyResolvedReceipt(r, *trusted);
  if (!v.ok()) {
    out["receipt_verified"] = false;
    out["refused"] = v.token;
    out["message"] = v.message;
    std::printf("%s\n", out.dump(2).c_str());
    return 1;
  }
  out["receipt_verified"] = true;
  out["kid"] = v.kid;
  out["claims"] = ClaimsToJson(v.claims);
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

}  // namespace

void AddHubCommand(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand("hub", "Run a kiln hub: cells, receipts, obligations, events");
  auto args = std::make_shared<HubArgs>();
  cmd->add_option("--data", args->options.data_dir, "data dir (created on first start)")
      ->required();
  cmd->add_option("--port", args->options.port, "TCP port (0: any free port)");
  cmd->add_option("--bind", args->options.bind, "address to listen on");
  cmd->add_option("--db", args->options.db_url,
                  "postgresql://… to share one database between hubs (default: SQLite in --data)");
  cmd->add_option("--blobs", args->options.blobs,
                  "s3://bucket/prefix to keep cell bytes in an S3 object store shared by hubs "
                  "(KILN_S3_ENDPOINT, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION); "
                  "default: DATA/blobs");
  cmd->add_option("--tokens", args->options.tokens_file,
                  "tokens file (default: DATA/tokens.json, created with an admin token)");
  cmd->add_option("--threads", args->options.threads,
                  "handler threads (requests handled at once; idle connections hold none)");
  cmd->add_option(
      "--tls-cert", args->options.listener.tls_cert,
      "PEM certificate chain: serve HTTPS (re-read when the file changes, or on SIGHUP)");
  cmd->add_option("--tls-key", args->options.listener.tls_key, "PEM private key of --tls-cert");
  cmd->add_flag("--insecure-http", args->options.listener.insecure_http,
                "allow plain HTTP on an address that is not loopback");
  cmd->add_option("--max-conns-per-client", args->options.listener.max_connections_per_client,
                  "connections one client address may hold (more are answered 503)");
  cmd->add_option("--header-timeout-ms", args->options.listener.header_timeout_ms,
                  "deadline for a request's headers (and the TLS handshake)");
  cmd->add_option("--keepalive-idle-ms", args->options.listener.keepalive_idle_ms,
                  "an idle keep-alive connection is closed after this");
  cmd->add_option("--drain-timeout-ms", args->options.drain_timeout_ms,
                  "on SIGTERM, how long requests being handled may take to finish");
  cmd->add_option("--db-pool", args->options.db_pool,
                  "PostgreSQL connections (default: one per core, at least 2)");
  cmd->add_option("--rebuild", args->options.rebuild,
                  "verify: rebuild every published cell in a sandbox before signing (default); "
                  "off: sign without (workers then adopt none of those cells)");
  cmd->add_option("--builder-toolchain", args->options.builder_toolchains,
                  "also rebuild the cells of this compiler's toolchain (a path or a name on PATH), "
                  "in a sandboxed builder of its own; repeat for more. The hub's own compiler "
                  "($KILN_CXX, else c++) is always built");
  cmd->add_option("--builder-name", args->options.sandbox.name,
                  "the builder receipts name (default: hub@<hostname>)");
  cmd->add_option("--builder-user", args->options.sandbox.user,
                  "user the sandboxed rebuild runs as when the hub is root (default: nobody)");
  cmd->add_option("--builder-timeout", args->options.sandbox.timeout_s,
                  "seconds a rebuild may take (default 600)");
  cmd->add_option("--builder-memory-mb", args->options.sandbox.memory_mb,
                  "address-space limit of each rebuild process, MiB (default 4096)");
  cmd->add_option("--builder-parallel", args->options.sandbox.parallel_compiles,
                  "compiler processes per rebuild (default 2)");
  cmd->add_option("--builder-concurrent", args->options.sandbox.concurrent,
                  "rebuilds at once; one slot is kept for the platform's publishes (default 2)");
  cmd->add_option("--builder-per-publisher", args->options.sandbox.per_share,
                  "rebuilds one tenant org may run at once (default 1)");
  cmd->add_option("--builder-queue", args->options.sandbox.max_waiting,
                  "rebuilds one publisher may have waiting; more are answered 503 builder_busy "
                  "(default 4)");
  cmd->add_option("--mint-lease-ttl", args->options.mint_lease_ttl_s,
                  "seconds a worker's mint lease holds without a heartbeat; others wait that "
                  "long at most before taking over a dead minter's key (default 60)");
  cmd->add_option("--max-cell-entries", args->options.max_cell_entries,
                  "entries a published cell may hold (default 256)");
  cmd->add_option("--org-quota-bytes", args->options.org_quota_bytes,
                  "bytes of cells an org publisher may keep on the hub unless its token says "
                  "otherwise (default 16 GiB; 0: no limit)");
  cmd->add_option("--platform-quota-bytes", args->options.platform_quota_bytes,
                  "the same for platform publishers (default 0: no limit)");
  cmd->add_option("--publish-claim-ttl", args->options.publish_claim_ttl_s,
                  "seconds a publisher's claim on a key lives after each step of its publish; "
                  "others' intents for the key wait meanwhile (default 300)");
  cmd->add_option("--blob-url-ttl", args->options.blob_url_ttl_s,
                  "seconds a direct (presigned) blob URL minted for a reader stays valid, with "
                  "--blobs s3://… (default 300; 0: none, every download streams through the hub)");
  cmd->add_option("--blob-url-endpoint", args->options.blob_url_endpoint,
                  "http(s)://host[:port] that direct blob URLs name when readers reach the S3 "
                  "store by another name than KILN_S3_ENDPOINT (default: KILN_S3_ENDPOINT)");
  cmd->add_option("--crash-revoke-threshold", args->options.crash_revoke_threshold,
                  "revoke a cell once this many distinct worker machines reported it crashing a "
                  "worker process (cell_crashed); a machine is a worker name without its pid "
                  "(default 0: never)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--revocation-max-age", args->options.revocation_max_age_s,
                  "seconds an adopter may rely on a signed revocation list (default 300)");
  cmd->add_option("--blob-grace", args->options.blob_grace_s,
                  "seconds before an unreferenced blob or abandoned intent is collected "
                  "(default 86400)");
  cmd->add_option("--gc-interval", args->options.gc_interval_s,
                  "seconds between garbage collections (default 3600; 0 = never)");
  cmd->add_option("--blob-verify-interval", args->options.blob_verify_interval_s,
                  "seconds between re-hashes of every stored blob, the first at start; a damaged "
                  "blob is quarantined (0: never; default 3600)");
  cmd->add_option("--min-free-bytes", args->options.ready.min_free_bytes,
                  "GET /v1/ready answers 503 when less disk than this is free under the blobs "
                  "(default 512 MiB)");
  cmd->callback([=] { *exit_code = RunHub(*args); });
}

void AddRebuildCommand(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand(
      "rebuild", "Rebuild a cell's shared object from its source and compare the bytes");
  auto args = std::make_shared<RebuildArgs>();
  cmd->add_option("cell", args->cell, "cell tar");
  cmd->add_option("--out", args->out, "also write the rebuilt shared object here");
  cmd->add_option("--parallel", args->parallel, "compiler processes at once");
  cmd->add_option("--child", args->child_dir, "(the hub's sandboxed builder) work directory");
  cmd->callback([=] {
    if (args->child_dir.empty() && args->cell.empty()) {
      *exit_code = ReportError("rebuild", Status::InvalidArgument("name a cell tar"));
      return;
    }
    *exit_code = RunRebuild(*args);
  });
}

void AddPublishCommand(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand("publish", "Publish a cell to a hub (intent, upload, complete)");
  auto args = std::make_shared<PublishArgs>();
  cmd->add_option("cell", args->cell, "cell tar")->required();
  AddClientOptions(cmd, &args->client);
  cmd->add_option("--release", args->options.release, "release this cell discharges");
  cmd->add_option("--target", args->options.target, "release target this cell is for");
  cmd->add_option("--family", args->options.family, "family (default: the cell's metadata)");
  cmd->callback([=] { *exit_code = RunPublish(*args); });
}

void AddResolveCommand(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand("resolve", "Ask a hub for the cell of a key; verify its receipt");
  auto args = std::make_shared<ResolveArgs>();
  cmd->add_option("key", args->key, "cell key (ck1-…)")->required();
  cmd->add_option("--family", args->family,
                  "the scope asked about, e.g. root/mlp (cells are owned per key and family)")
      ->required();
  AddClientOptions(cmd, &args->client);
  cmd->add_option("--trust", args->trust,
                  "trusted signing keys: a JWKS/JWK file, or a raw Ed25519 key (base64url or hex)");
  cmd->callback([=] { *exit_code = RunResolve(*args); });
}

}  // namespace kiln::cli
