// `kiln worker --manifest kiln.toml`: boot an endpoint and serve it (cli layer).
// The flags become a WorkerConfig; worker/worker_main.h is the composition root that boots and
// serves (what a boot does, target by target, is described there).
#include <memory>
#include <string>

#include "src/kiln/cli/commands.h"
#include "src/kiln/worker/worker_main.h"

namespace kiln::cli {

void AddWorkerCommand(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand("worker", "Boot an endpoint from a manifest and serve KServe v2");
  auto a = std::make_shared<WorkerConfig>();
  cmd->add_option("--manifest", a->manifest, "kiln.toml")->required();
  cmd->add_option("--port", a->port, "TCP port (default: the manifest's; 0 = any free port)");
  cmd->add_option("--bind", a->bind, "address to listen on");
  cmd->add_option("--events", a->events, "append event rows to this JSON-lines file");
  cmd->add_option("--threads", a->threads, "compute threads per request");
  cmd->add_option("--mint-nice", a->mint_nice,
                  "niceness of mint children (0-19; default 10, below serving)");
  cmd->add_option("--mint-threads", a->mint_threads,
                  "compute threads of a mint child's proof runs (default 1)");
  cmd->add_option(
      "--tls-cert", a->tls_cert,
      "PEM certificate chain: serve HTTPS (re-read when the file changes, or on SIGHUP)");
  cmd->add_option("--tls-key", a->tls_key, "PEM private key of --tls-cert");
  cmd->add_flag("--insecure-http", a->insecure_http,
                "allow plain HTTP on an address that is not loopback");
  cmd->add_option("--max-conns-per-client", a->max_conns_per_client,
                  "connections one client address may hold (more are answered 503)");
  cmd->add_option("--max-body-mb", a->max_body_mb,
                  "largest infer body in MiB (a model whose inputs all have fixed shapes takes "
                  "at most its own size)");
  cmd->add_option("--drain-timeout-ms", a->drain_timeout_ms,
                  "on SIGTERM, how long requests already running may take to finish");
  cmd->add_option("--infer-deadline-ms", a->infer_deadline_ms,
                  "an infer request's deadline after it gets a slot (past it: 503, and the "
                  "health routes say handlers_stuck)");
  cmd->add_option("--admin-port", a->admin_port,
                  "port of the operator's admin listener (default: off; 0 = any free port)");
  cmd->add_option("--admin-bind", a->admin_bind, "address of the admin listener");
  cmd->add_option("--admin-token-file", a->admin_token_file,
                  "file holding the admin token (default: $KILN_ADMIN_TOKEN)");
  cmd->add_option("--request-memory-mb", a->request_memory_mb,
                  "memory one request's tensors may hold, in MiB; past it the request is refused "
                  "413 request_too_large (default: the manifest's endpoint.request_memory_mb, or "
                  "half the machine's memory shared by the concurrent requests)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--store-max-mb", a->store_max_mb,
                  "size bound of the local store in MiB: past it the least recently adopted "
                  "cells are evicted, never one this worker armed (default 10240; 0 = no bound; "
                  "fractions allowed)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--checkpoint-dir", a->checkpoint_dir,
                  "directory the admin checkpoint swap may read from (default: swaps refused)");
  // The serving process a worker's broker starts (worker/broker.h); no group: not in --help.
  cmd->add_flag("--serving-child", a->serving_child)->group("");
  cmd->add_option("--manifest-base-dir", a->manifest_base_dir)->group("");
  cmd->add_option("--mint-manifest", a->mint_manifest)->group("");
  cmd->callback([=] {
    Status s = RunWorker(*a);
    *exit_code = s.ok() ? 0 : ReportError("worker", s);
  });
}

}  // namespace kiln::cli
