// The worker manifest (kiln.toml): what one endpoint serves and how (docs/design.md §10). Manifest
// layer, below the mint (a mint child reads its own target) and the worker.
//
// A manifest names the endpoint, the hub it adopts from, its targets (graph, checkpoint, envelope,
// lane policy, export declaration, numerics thresholds), the KServe model names (functions) that
// route to each target, and the mint driver's limits. This file only parses and validates; it
// opens no graph, checkpoint or key file (the boot routes do, and name the path when they fail).
//
// Parsing is strict: an unknown key at any level (a typo such as `envelop`), a value of the wrong
// type, a missing required field, or a value out of range is refused with a message that names the
// file, the line, the key path (`targets.denoiser.envelope[1].latent[2]`), the value found and the
// value expected. docs/manifest.md describes the format with an annotated example.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "src/kiln/base/status.h"
#include "src/kiln/cell/key.h"

namespace kiln {

// `targets.<name>.lane`: whether a target may be served eager (docs/design.md §1, law 11).
enum class LanePolicy {
  kOptional,   // "optional": eager is allowed (the default)
  kMandatory,  // "mandatory": serve only from a cell; without one, refuse retryably
};

// "optional" or "mandatory".
const char* LanePolicyName(LanePolicy lane);

// `[endpoint]`: the serving process itself.
struct EndpointSpec {
  std::string name;           // required; [A-Za-z0-9._-]+, names the endpoint in events/hub
  std::string release;        // optional ("" when absent); the hub release whose obligations
                              // this endpoint discharges
  int port = 8080;            // HTTP port of the KServe v2 front end; 0 = pick a free port
  int max_concurrency = 4;    // requests run at once (>= 1); more wait in line
  int threads = 0;            // compute threads per request; 0 = auto (the machine's cores)
  int request_memory_mb = 0;  // the tensors one request may hold at once (MiB); past it the
                              // request is refused `request_too_large`. 0 = auto: half the
                              // machine's memory shared by max_concurrency requests
                              // (DefaultRequestMemoryBytes)
};

// `[hub]` (optional): where cells are resolved, fetched and published.
struct HubSpec {
  std::string url;                 // required; "http://..." or "https://..."
  std::string token;               // bearer token: `token` verbatim, or the value of the
                                   // environment variable named by `token_env` (read at parse
                                   // time; unset or empty is refused). "" = no token
  std::string token_env;           // the variable's name when the token came from the
                                   // environment ("" otherwise); never the secret itself
  std::vector<std::string> trust;  // receipt-verifying keys (JWKS or public-key files), resolved
                                   // against the manifest's directory; empty = fetch the hub's
                                   // own /.well-known/jwks.json
  int timeout_ms = 5000;           // per hub request (> 0)
  int revocation_poll_s = 30;      // how often the signed revocation list is polled: the bound
                                   // on de-arming a revoked cell (worker/revocations.h)
  int revocation_max_age_s = 0;    // cap on a list's age; 0 = the list's own max_age_s
  std::string revocations_stale = "keep";  // "keep" | "eager" when the list goes stale
  int adopt_retry_max_s = 30;  // the longest wait between boot-adoption retries after the
                               // hub could not be reached
  std::string ca;              // PEM CA file for an https:// hub with a private CA, resolved
                               // against the manifest's directory; "" = the system's CAs
  bool insecure_http = false;  // allow http:// to a host that is not loopback
};

// `targets.<name>.numerics`: the mint-time numerics gate (docs/design.md §8). 0 < floor <= warn
// <= 1, 0 < retention <= 1. Integers are accepted where a float is expected (`warn = 1`).
struct NumericsSpec {
  double floor = 0.999;      // cos below this: DESTROYED
  double warn = 0.99999;     // floor <= cos < warn: DEGRADED; only cos >= warn is HEALTHY
  double retention = 0.999;  // |s|/|r| outside [retention, 1/retention]: at least DEGRADED
};

// `targets.<name>.export`: present = this target's cells are exported (minted, published and
// adopted through the hub); absent = intake lane (compiled here, never published; law 12).
struct ExportSpec {
  std::string family;  // required; "<owner>/<name>", e.g. "root/micro-diffusion" or "acme/foo"
};

// `[targets.<name>]`: one graph the endpoint serves.
struct TargetSpec {
  std::string name;        // the table's key; [A-Za-z0-9._-]+
  std::string graph;       // required: path to the .onnx file, resolved against base_dir
  std::string checkpoint;  // optional: path to a .safetensors file, resolved; "" = the graph's
                           // own embedded weights
  LanePolicy lane = LanePolicy::kOptional;
  std::optional<ExportSpec> export_spec;  // nullopt = intake lane. A mandatory target without
                                          // one still parses; the worker refuses it at boot
                                          // (`mandatory_lane_needs_a_cell`)
  Envelope envelope;  // required, non-empty; classes in declaration order, no duplicates,
                      // every class names the same inputs, every dim >= 0, and no input of
                      // more elements than one request may carry (kMaxRequestInputElements)
  NumericsSpec numerics;
  // Sample inputs (optional): each maps every graph input to a .npy file (resolved like every
  // path). The mint's numerics gate and fence probe each sample on the entry whose class it
  // fits, beside their synthetic probes: the inputs a model is really given (valid shapes,
  // indices, masks) measure it where random ones cannot.
  std::vector<std::map<std::string, std::string>> samples;
  std::string sm;  // optional machine-target override, one of KnownSmLevels();
                   // "" = detect on this machine
  // The operator's eager-only order from the manifest (default false): the target serves eager
  // from boot, its cell adopted but held. An order given later through the admin port outranks it
  // at every later boot (worker/order_book.h). Not part of the key.
  bool eager_only = false;
  // `coverage`: whether a cell that lacks some declared classes (they did not compile) may arm,
  // serving them eager: "partial" or "full"; "" = the lane's default, partial for an optional
  // lane and full for a mandatory one (fail closed). Not part of the key: it is what this endpoint
  // accepts, not what is compiled.
  std::string coverage;

  bool exported() const { return export_spec.has_value(); }
  bool allows_partial_coverage() const {
    return coverage.empty() ? lane == LanePolicy::kOptional : coverage == "partial";
  }
};

// `[functions.<model name>]`: a KServe model name that routes to a target.
struct FunctionSpec {
  std::string name;                  // the table's key: the canonical model name
  std::string target;                // required; must name a declared target
  std::vector<std::string> aliases;  // other model names for the same function
};

// `[mint]` (optional): limits of the mint driver (docs/design.md §4, law 16).
struct MintSpec {
  int stall_window_s = 120;   // kill a child with no CPU or disk progress for this long (> 0)
  int memory_budget_mb = 0;   // skip a mint that would exceed this; 0 = auto (from free memory)
  int parallel_compiles = 2;  // entry compiles run at once, each a process (>= 1)
  int remints = 2;            // re-mints a mandatory target may ask for after its cell faulted
};

struct Manifest {
  std::string source;    // what was parsed (the file path, or a label), for messages
  std::string base_dir;  // relative paths inside were resolved against this directory

  EndpointSpec endpoint;
  std::optional<HubSpec> hub;  // nullopt = no hub: local store and self-mint only

  // Sorted by name, not by declaration order: toml++ tables do not keep the order of their keys,
  // and sorting makes every consumer (boot order, events, metadata) deterministic.
  std::vector<TargetSpec> targets;
  // Sorted by model name, for the same reason.
  std::vector<FunctionSpec> functions;
  // Every model name and every alias -> its target's name. Names are unique across all functions.
  std::map<std::string, std::string> function_to_target;

  MintSpec mint;

  // The target called `name`; NotFound names the known targets.
  Result<const TargetSpec*> FindTarget(const std::string& name) const;
  // The target that model name or alias `model` routes to; NotFound names the known model names.
  Result<const TargetSpec*> FindTargetForFunction(const std::string& model) const;
};

// Reads and parses the manifest at `path`; relative paths inside resolve against its directory
// (made absolute). ReadFile's error (NotFound, IOError) when the file cannot be read;
// InvalidArgument for anything in it.
Result<Manifest> LoadManifest(const std::string& path);
// The same, with relative paths resolved against `base_dir` instead ("" = the file's directory):
// for a copy of a manifest written elsewhere (ManifestWithHub).
Result<Manifest> LoadManifest(const std::string& path, const std::string& base_dir);

// Manifest text equal to `toml_text` but for its [hub] credential: `hub.token` and
// `hub.token_env` removed, then, when `url` is not empty, `hub.url` set to it, `hub.token` to
// `token` (when not empty) and `hub.ca` removed (the new URL is a plain-http relay on loopback).
// For a worker's broker, which holds the token and hands its serving process and mint children
// manifests without it (worker/broker.h). InvalidArgument when the text is not TOML.
Result<std::string> ManifestWithHub(std::string_view toml_text, const std::string& what,
                                    const std::string& url, const std::string& token);

// Parses manifest text. `what` names it in messages (usually the path); relative paths inside
// resolve against `base_dir` ("" leaves them relative to the working directory). Reads the
// environment only for `hub.token_env`.
Result<Manifest> ParseManifest(std::string_view toml_text, const std::string& what,
                               const std::string& base_dir);

}  // namespace kiln
