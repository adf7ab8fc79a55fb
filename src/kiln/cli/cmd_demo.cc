// `kiln demo`: the README's main command — the whole cell lifecycle on one machine, as a fleet
// would live it (cli layer).
//
// It starts, as real processes on loopback, an embedded `kiln hub` and two `kiln worker`s on
// the micro-diffusion example, each worker with a cache directory of its own (two "machines"):
//   A boots, misses (the fleet has no cell), serves eager at once, mints in a child process,
//     proves the cell with the strict gate, arms it and publishes it in the background;
//   B boots after that, adopts the cell from the hub at boot and serves its first request from
//     it; then swaps to a second checkpoint (same architecture) and keeps serving from the same
//     cell, with outputs that match eager under the new weights.
// It drives requests over KServe v2 and prints what happened from the workers' own event rows
// and the answers' `serving_mode`. Everything lives in a temporary directory, removed at the end
// (`--keep` keeps it, with the event logs).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <thread>

#include "src/kiln/base/clock.h"
#include "src/kiln/base/file.h"
#include "src/kiln/base/sha256.h"
#include "src/kiln/base/subprocess.h"
#include "src/kiln/cli/commands.h"
#include "src/kiln/client/hub_client.h"
#include "src/kiln/eager/interpreter.h"
#include "src/kiln/graph/checkpoint.h"
#include "src/kiln/graph/onnx_import.h"
#include "src/kiln/hub/authz.h"
#include "src/kiln/tensor/npy.h"
#include "src/kiln/tensor/safetensors.h"

#ifndef KILN_SOURCE_DIR
#define KILN_SOURCE_DIR "."
#endif

namespace kiln::cli {

namespace {

int FreePort() {
  // Port 0 asks the kernel; the process we start binds it a moment later (loopback, one user).
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// A child process of the demo, killed when the demo leaves.
class Child {
 public:
  Child() = default;
  ~Child() { Stop(); }
  Status Start(const std::vector<std::string>& args, const std::string& cache,
               const std::string& log) {
    std::vector<std::string> env;
    if (!cache.empty()) env.push_back("KILN_CACHE_DIR=" + cache);
    KILN_ASSIGN_OR_RETURN(pid_, SpawnWithLog(args, env, log));
    return Status::OK();
  }
  int Stop() {
    if (pid_ <= 0) return -1;
    ::kill(pid_, SIGTERM);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  bool Alive() { return pid_ > 0 && ::waitpid(pid_, nullptr, WNOHANG) == 0; }

 private:
  pid_t pid_ = -1;
};

std::unique_ptr<HubClient> HttpTo(int port, const std::string& token) {
  HubClientOptions o;
  o.url = "http://127.0.0.1:" + std::to_string(port);
  o.token = token;
  o.connect_timeout_s = 2;
  o.io_timeout_s = 60;
  return HubClient::Create(o).value();
}

Status WaitUp(HubClient& http, const std::string& path, Child& child, const std::string& what,
              const std::string& log) {
  for (int i = 0; i < 1200; ++i) {
    if (http.Call("GET", path).ok()) return Status::OK();
    if (!child.Alive()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  auto text = ReadFile(log);
  return Status::Internal(what + " did not come up; its log:\n" + (text.ok() ? *text : ""));
}

// The first event row of `kind` at the worker (waits up to `timeout_ms`).
Result<nlohmann::json> WaitForRow(HubClient& worker, const std::string& kind, int timeout_ms) {
  const auto until = Clock::Real()->Now() + std::chrono::milliseconds(timeout_ms);
  while (Clock::Real()->Now() < until) {
    HubAnswer a = worker.Call("GET", "/v1/events?kind=" + kind);
    if (a.ok() && a.body.is_array() && !a.body.empty()) return a.body[0];
    if (a.ok() && a.body.is_object() && a.body.contains("events") && !a.body["events"].empty()) {
      return a.body["events"][0];
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return Status::NotFound("no `" + kind + "` row within " + std::to_string(timeout_ms) + " ms");
}

struct Answer {
  std::string mode, ref, reason;
  double ms = 0;         // client side: JSON encode, HTTP, decode included
  double server_ms = 0;  // the worker's own serve time (parameters.duration_ms)
  TensorMap outputs;
};

Result<Answer> Infer(HubClient& worker, const std::string& model, const TensorMap& inputs) {
  nlohmann::json req = {{"inputs", nlohmann::json::array()}};
  for (const auto& [name, t] : inputs) {
    nlohmann::json data = nlohmann::json::array();
    for (int64_t i = 0; i < t.numel(); ++i) data.push_back(t.GetAsDouble(i));
    req["inputs"].push_back(
        {{"name", name}, {"shape", t.shape()}, {"datatype", "FP32"}, {"data", data}});
  }
  const auto start = Clock::Real()->Now();
  HubAnswer a = worker.Call("POST", "/v2/models/" + model + "/infer", req.dump());
  Answer out;
  out.ms = MsSince(start);
  if (!a.ok()) return Status::Internal("infer " + model + ": " + a.token + ": " + a.message);
  const auto& p = a.body["parameters"];
  out.mode = p.value("serving_mode", "");
  out.ref = p.value("served_cell_ref", "");
  out.reason = p.value("fallback_reason", "");
  out.server_ms = p.value("duration_ms", 0.0);
  for (const auto& o : a.body["outputs"]) {
    std::vector<float> v;
    for (const auto& d : o["data"]) v.push_back(d.get<float>());
    out.outputs[o["name"].get<std::string>()] =
        Tensor::FromVector<float>(o["shape"].get<Shape>(), v);
  }
  return out;
}

// What follows `marker` in `text` (all of it when absent): the rows' prose after their prefix.
std::string After(const std::string& text, const std::string& marker) {
  const size_t at = text.find(marker);
  return at == std::string::npos ? text : text.substr(at + marker.size());
}

// An event row's `stages` field as "name:ms,name:ms" ("" when it has none).
std::string StagesText(const nlohmann::json& row) {
  std::string out;
  const auto it = row.find("stages");
  if (it == row.end() || !it->is_array()) return out;
  for (const auto& s : *it) {
    if (!s.is_object()) continue;
    char buf[96];
    std::snprintf(buf, sizeof buf, "%s:%.1f", s.value("stage", std::string("?")).c_str(),
                  s.value("ms", 0.0));
    out += (out.empty() ? "" : ",") + std::string(buf);
  }
  return out;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double MaxAbsDiff(const TensorMap& a, const TensorMap& b) {
  double m = 0;
  for (const auto& [name, t] : b) {
    auto it = a.find(name);
    if (it == a.end() || it->second.numel() != t.numel()) return INFINITY;
    for (int64_t i = 0; i < t.numel(); ++i) {
      m = std::max(m, std::fabs(it->second.GetAsDouble(i) - t.GetAsDouble(i)));
    }
  }
  return m;
}

Status RunFleetDemo(std::string examples, bool keep) {
  const auto demo_start = Clock::Real()->Now();
  if (examples.empty()) {
    const char* env = std::getenv("KILN_EXAMPLES");
    examples = env ? env
                   : (std::filesystem::is_directory("examples") ? "examples"
                                                                : KILN_SOURCE_DIR "/examples");
  }
  const std::string ex = std::filesystem::absolute(examples + "/micro-diffusion").string();
  char tmpl[] = "/tmp/kiln-demo-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return Status::IOError("cannot create a demo directory");
  const std::string root = tmpl;
  struct Cleanup {
    std::string root;
    bool keep;
    ~Cleanup() {
      std::error_code ec;
      if (!keep) std::filesystem::remove_all(root, ec);
    }
  } cleanup{root, keep};
  std::string kiln = SelfExe();
  if (kiln.empty()) kiln = "kiln";
  std::printf(
      "kiln demo: an embedded hub and two workers (A, B) on micro-diffusion, on loopback\n");
  std::printf("workdir:   %s%s\n\n", root.c_str(), keep ? " (kept)" : " (removed at the end)");

  // 1. The hub, with one least-privilege token for both workers: role worker, org "demo", and the
  // one family they export. It publishes what they mint, reports their events and reads their
  // org's rows; it cannot revoke, rotate the signing key, or write or read anything else.
  KILN_ASSIGN_OR_RETURN(std::string token, GenerateToken());
  const std::string family = "demo/micro-diffusion";
  const nlohmann::json tokens = {{"tokens",
                                  {{{"name", "demo-workers"},
                                    {"role", "worker"},
                                    {"org", "demo"},
                                    {"families", {family}},
                                    {"sha256", Sha256Hex(token)}}}}};
  KILN_RETURN_IF_ERROR(MakeDirs(root + "/hub"));
  KILN_RETURN_IF_ERROR(WriteSecretFileAtomic(root + "/tokens.json", tokens.dump(2)));
  const int hub_port = FreePort();
  Child hub;
  KILN_RETURN_IF_ERROR(
      hub.Start({kiln, "hub", "--data", root + "/hub", "--port", std::to_string(hub_port), "--bind",
                 "127.0.0.1", "--tokens", root + "/tokens.json"},
                "", root + "/hub.log"));
  auto hub_http = HttpTo(hub_port, "");
  KILN_RETURN_IF_ERROR(WaitUp(*hub_http, "/v1/health", hub, "the hub", root + "/hub.log"));
  std::printf("hub       http://127.0.0.1:%d  (SQLite + blob directory, Ed25519 receipts)\n",
              hub_port);

  // 2. One manifest per machine: the example's, with absolute paths, the demo org's family and
  // the hub.
  KILN_ASSIGN_OR_RETURN(std::string manifest, ReadFile(ex + "/kiln.toml"));
  const std::string platform_family = "\"root/micro-diffusion\"";
  if (const size_t at = manifest.find(platform_family); at != std::string::npos) {
    manifest.replace(at, platform_family.size(), "\"" + family + "\"");
  } else {
    return Status::InvalidArgument(ex + "/kiln.toml: no export family " + platform_family +
                                   " to give the demo's org");
  }
  for (const char* rel : {"model.onnx", "checkpoint.safetensors"}) {
    const std::string from = std::string("\"") + rel + "\"";
    const size_t at = manifest.find(from);
    if (at != std::string::npos) manifest.replace(at, from.size(), "\"" + ex + "/" + rel + "\"");
  }
  manifest += "\n[hub]\nurl = \"http://127.0.0.1:" + std::to_string(hub_port) + "\"\ntoken = \"" +
              token + "\"\n";
  // Each worker has an admin listener (the operator's orders) behind one operator token, and a
  // checkpoint directory its swaps read from.
  KILN_ASSIGN_OR_RETURN(std::string admin_token, GenerateToken());
  KILN_RETURN_IF_ERROR(WriteFileAtomic(root + "/admin.token", admin_token));
  auto start_worker = [&](const std::string& name, Child& child, int* port,
                          int* admin_port) -> Status {
    const std::string dir = root + "/" + name;
    KILN_RETURN_IF_ERROR(MakeDirs(dir + "/checkpoints"));
    KILN_RETURN_IF_ERROR(WriteFileAtomic(dir + "/kiln.toml", manifest));
    *port = FreePort();
    *admin_port = FreePort();
    return child.Start(
        {kiln, "worker", "--manifest", dir + "/kiln.toml", "--port", std::to_string(*port),
         "--events", dir + "/events.jsonl", "--admin-port", std::to_string(*admin_port),
         "--admin-token-file", root + "/admin.token", "--checkpoint-dir", dir + "/checkpoints"},
        dir, dir + "/worker.log");
  };

  // The example's request and PyTorch's answer to it.
  TensorMap inputs;
  for (const char* n : {"latent", "timestep", "cond"}) {
    KILN_ASSIGN_OR_RETURN(inputs[n], ReadNpy(ex + "/inputs/" + n + ".npy"));
  }
  const std::string model = "micro-diffusion";

  // 3. Worker A: a miss; eager at once; mint in a child; prove; arm; publish.
  Child a;
  int a_port = 0, a_admin = 0;
  const auto a_boot = Clock::Real()->Now();
  KILN_RETURN_IF_ERROR(start_worker("a", a, &a_port, &a_admin));
  auto a_http = HttpTo(a_port, "");
  KILN_RETURN_IF_ERROR(WaitUp(*a_http, "/v2/health/ready", a, "worker A", root + "/a/worker.log"));
  const double a_ready_ms = MsSince(a_boot);
  KILN_ASSIGN_OR_RETURN(nlohmann::json a_boot_row, WaitForRow(*a_http, "boot_adopt", 5000));
  std::vector<double> eager_ms;
  Answer first_a;
  Answer switched;
  int a_requests = 0;
  while (true) {
    KILN_ASSIGN_OR_RETURN(Answer r, Infer(*a_http, model, inputs));
    ++a_requests;
    if (a_requests == 1) first_a = r;
    if (r.mode != "eager") {
      switched = r;
      break;
    }
    eager_ms.push_back(r.server_ms);
    if (MsSince(a_boot) > 100000) return Status::Internal("worker A never switched to its cell");
  }
  KILN_ASSIGN_OR_RETURN(nlohmann::json numerics, WaitForRow(*a_http, "cell_numerics", 5000));
  KILN_ASSIGN_OR_RETURN(nlohmann::json phases, WaitForRow(*a_http, "mint_phases", 5000));
  KILN_ASSIGN_OR_RETURN(nlohmann::json published, WaitForRow(*a_http, "self_mint_publish", 60000));
  std::vector<double> cell_ms;
  for (int i = 0; i < 10; ++i) {
    KILN_ASSIGN_OR_RETURN(Answer r, Infer(*a_http, model, inputs));
    cell_ms.push_back(r.server_ms);
  }
  std::printf(
      "\nworker A  boot_adopt %s (the fleet has no cell); ready in %.0f ms, serving eager\n",
      a_boot_row.value("phase", "?").c_str(), a_ready_ms);
  std::printf(
      "          first request: %s (%s) in %.0f ms (client side) — served at once, not after a "
      "compile\n",
      first_a.mode.c_str(), first_a.reason.c_str(), first_a.ms);
  std::printf("          minted in a child process in %.0f ms; stages (ms): %s\n",
              phases.value("duration_ms", 0.0), StagesText(phases).c_str());
  std::printf("          strict gate on the live target: %s\n",
              After(numerics.value("detail", ""), "by=parent ").c_str());
  std::printf("          request %d switched to %s, none failed (%d eager before it)\n", a_requests,
              switched.mode.c_str(), a_requests - 1);
  std::printf("          published to the hub: %s\n", published.value("phase", "").c_str());

  // 4. Worker B, a second machine: adopts at boot, serves its first request from the cell.
  Child b;
  int b_port = 0, b_admin = 0;
  const auto b_boot = Clock::Real()->Now();
  KILN_RETURN_IF_ERROR(start_worker("b", b, &b_port, &b_admin));
  auto b_http = HttpTo(b_port, "");
  KILN_RETURN_IF_ERROR(WaitUp(*b_http, "/v2/health/ready", b, "worker B", root + "/b/worker.log"));
  const double b_ready_ms = MsSince(b_boot);
  KILN_ASSIGN_OR_RETURN(nlohmann::json b_boot_row, WaitForRow(*b_http, "boot_adopt", 5000));
  KILN_ASSIGN_OR_RETURN(Answer first_b, Infer(*b_http, model, inputs));
  const double adopt_ms = b_boot_row.value("duration_ms", 0.0);
  std::printf("\nworker B  boot_adopt %s in %.1f ms; ready in %.0f ms\n",
              b_boot_row.value("phase", "?").c_str(), adopt_ms, b_ready_ms);
  // The row's own breakdown: key, resolve, receipt, revocations, fetch, admit, open, bind, ...
  if (const std::string stages = StagesText(b_boot_row); !stages.empty()) {
    std::printf("          stages (ms): %s\n", stages.c_str());
  }
  std::printf("          first request: %s in %.0f ms\n          cell %s\n", first_b.mode.c_str(),
              first_b.ms, first_b.ref.c_str());

  // 5. B swaps to a second checkpoint of the same architecture: the same cell keeps serving.
  KILN_ASSIGN_OR_RETURN(Graph g, ImportOnnxFile(ex + "/model.onnx"));
  auto graph = std::make_shared<const Graph>(std::move(g));
  KILN_ASSIGN_OR_RETURN(WeightMap second, DeriveCheckpoint(*graph, /*seed=*/7));
  KILN_RETURN_IF_ERROR(WriteSafetensors(root + "/b/checkpoints/second.safetensors", second, {}));
  HubAnswer swap =
      HttpTo(b_admin, admin_token)
          ->Call("POST", "/v1/admin/checkpoint",
                 nlohmann::json{{"target", "denoiser"}, {"path", "second.safetensors"}}.dump());
  if (!swap.ok()) return Status::Internal("checkpoint swap: " + swap.token + ": " + swap.message);
  KILN_ASSIGN_OR_RETURN(Answer after, Infer(*b_http, model, inputs));
  KILN_ASSIGN_OR_RETURN(Interpreter eager, Interpreter::Create(graph));
  KILN_ASSIGN_OR_RETURN(TensorMap expect, eager.Run(inputs, &second));
  const double swap_err = MaxAbsDiff(after.outputs, expect);
  const double moved = MaxAbsDiff(after.outputs, first_b.outputs);
  std::printf(
      "          swapped to a second checkpoint (derived, seed 7): %s, same cell: %s;\n"
      "          outputs moved by up to %.3g and match eager with the new weights "
      "(max|diff| %.2g)\n",
      after.mode.c_str(), after.ref == first_b.ref ? "yes" : "NO", moved, swap_err);

  const double eager_med = Median(eager_ms), cell_med = Median(cell_ms);
  const double mint_ms = phases.value("duration_ms", 0.0);
  std::printf(
      "\nsummary   serve time per request (median of the worker's own duration_ms): eager "
      "%.1f ms, cell %.1f ms (%.1fx)\n",
      eager_med, cell_med, cell_med > 0 ? eager_med / cell_med : 0.0);
  std::printf("          mint %.0f ms on A vs adopt %.1f ms on B (%.0fx shorter)\n", mint_ms,
              adopt_ms, adopt_ms > 0 ? mint_ms / adopt_ms : 0.0);
  const bool lifecycle = first_a.mode == "eager" && switched.mode == "aot_cell" &&
                         published.value("phase", "") == "published" &&
                         b_boot_row.value("phase", "") == "hit" && first_b.mode == "aot_cell" &&
                         after.mode == "aot_cell" && after.ref == first_b.ref && swap_err < 1e-3 &&
                         moved > 1e-4;
  const int a_exit = a.Stop();
  const int b_exit = b.Stop();
  // The workers' event rows reached the hub (their forwarders post in batches and flush as they
  // drain), counted there with the workers' own token, which reads the demo org's rows only;
  // A's publish among them.
  auto hub_reader = HttpTo(hub_port, token);
  int64_t hub_rows = 0;
  bool publish_at_hub = false;
  for (int i = 0; i < 100 && !publish_at_hub; ++i) {
    HubAnswer rows = hub_reader->Call("GET", "/v1/events?limit=10000");
    hub_rows = 0;
    if (rows.ok() && rows.body.contains("events")) {
      for (const auto& e : rows.body["events"]) {
        if (e.value("org", "") != "demo") continue;
        ++hub_rows;
        publish_at_hub |=
            e.value("kind", "") == "self_mint_publish" && e.value("phase", "") == "published";
      }
    }
    if (!publish_at_hub) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::printf(
      "          %lld event rows reached the hub (org demo, read with the workers' own "
      "token)%s\n",
      static_cast<long long>(hub_rows), publish_at_hub ? ", A's publish among them" : "");
  const bool ok = lifecycle && publish_at_hub;
  hub.Stop();
  std::printf("          workers drained and exited %d, %d; whole demo %.1f s\n", a_exit, b_exit,
              MsSince(demo_start) / 1000.0);
  std::printf("\n%s\n", ok ? "OK: miss -> eager -> mint -> prove -> publish -> adopt -> swap"
                           : "FAILED: see above");
  if (!ok) return Status::Internal("the demo's lifecycle did not complete as expected");
  return Status::OK();
}

}  // namespace

void AddDemoCommand(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand(
      "demo", "An embedded hub and two workers: miss, eager, mint, prove, publish, adopt, swap");
  auto examples = std::make_shared<std::string>();
  auto keep = std::make_shared<bool>(false);
  cmd->add_option("--examples", *examples, "examples directory (default: ./examples)");
  cmd->add_flag("--keep", *keep, "keep the demo's directory (event logs, cells)");
  cmd->callback([=] {
    Status s = RunFleetDemo(*examples, *keep);
    *exit_code = s.ok() ? 0 : ReportError("demo", s);
  });
}

}  // namespace kiln::cli
