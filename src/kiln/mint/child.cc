// The mint child's body: request in, frames and report out (mint layer; see child.h).
#include "src/kiln/mint/child.h"

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "src/kiln/base/file.h"
#include "src/kiln/base/secret_scan.h"
#include "src/kiln/cell/pack.h"
#include "src/kiln/manifest/manifest.h"
#include "src/kiln/mint/target_request.h"

namespace kiln {

namespace {

int TestSeconds(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::atoi(v) : 0;
}

void TestStallOrSpin() {
  if (int s = TestSeconds("KILN_TEST_MINT_STALL_S"); s > 0) ::sleep(static_cast<unsigned>(s));
  if (int s = TestSeconds("KILN_TEST_MINT_BUSY_S"); s > 0) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(s);
    volatile uint64_t x = 0;
    while (std::chrono::steady_clock::now() < until) {
      for (int i = 0; i < 100000; ++i) x = x * 6364136223846793005ull + 1;
    }
  }
}

int64_t PeakRssKb() {
  rusage self{}, kids{};
  ::getrusage(RUSAGE_SELF, &self);
  ::getrusage(RUSAGE_CHILDREN, &kids);
  return std::max<int64_t>(self.ru_maxrss, kids.ru_maxrss);
}

// What the child says on stderr (the parent keeps it as child.log) when it cannot even write a
// report.
void ReportToLog(const Status& s) {
  std::fprintf(stderr, "kiln mint --child: %s\n", s.ToString().c_str());
}

// The exit code for a refused mint: deterministic refusals 2, exhaustion 3.
int ExitFor(const Status& s, std::string* token) {
  if (s.code() == StatusCode::kResourceExhausted || s.code() == StatusCode::kIOError) {
    *token = "resource_exhausted";
    return kMintExitResource;
  }
  // request_too_large: a shape class whose tensors do not fit int64 (an envelope dim of 2^62
  // given outside a manifest, an intermediate the graph makes past it), refused by node.
  for (const char* t :
       {kRefusalNumerics, kRefusalFence, kRefusalUnmeasurable, kRefusalRequestTooLarge}) {
    if (s.Is(t)) {
      *token = t;
      return kMintExitRefused;
    }
  }
  *token = "compile_refused";
  return kMintExitRefused;
}

// The request's target from the worker's manifest, on the lane the request says.
Result<MintRequest> RequestForChild(const MintChildRequest& req) {
  KILN_ASSIGN_OR_RETURN(Manifest manifest, LoadManifest(req.manifest, req.manifest_base_dir));
  KILN_ASSIGN_OR_RETURN(const TargetSpec* spec, manifest.FindTarget(req.target));
  if (spec->exported() == req.intake) {
    return Status::InvalidArgument("target '" + req.target + "' is " +
                                   (spec->exported() ? "exported" : "intake") +
                                   " but the request says " + (req.intake ? "intake" : "exported"));
  }
  return RequestForTarget(manifest, req.target);
}

// Blocks on the parent's lifeline; end of file (or an error) means the parent is gone, and the
// whole process group goes with it: this child and the compilers it started.
void WatchParent(int fd) {
  std::thread([fd] {
    char c;
    while (true) {
      const ssize_t n = ::read(fd, &c, 1);
      if (n > 0 || (n < 0 && errno == EINTR)) continue;
      ::kill(0, SIGKILL);
      ::_exit(kMintExitBadRequest);
    }
  }).detach();
}

}  // namespace

int RunMintChild(const std::string& request_path, int parent_alive_fd) {
  // Frames count the mint's stages, then one last frame for the report.
  const int kStageCount = static_cast<int>(MintStages().size());
  const int kReportStep = kStageCount + 1;
  if (parent_alive_fd >= 0) WatchParent(parent_alive_fd);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  auto text = ReadFile(request_path);
  if (!text.ok()) {
    ReportToLog(text.status());
    return kMintExitBadRequest;
  }
  auto req = ParseMintChildRequest(*text, request_path);
  if (!req.ok()) {
    ReportToLog(req.status());
    return kMintExitBadRequest;
  }
  MintChildReport report;
  report.lane = req->intake ? "intake" : "exported";
  const auto started = std::chrono::steady_clock::now();
  auto finish = [&](int code, const std::string& status, const std::string& token,
                    const std::string& message) {
    report.status = status;
    report.token = token;
    report.message = message;
    report.peak_rss_kb = PeakRssKb();
    Status w = WriteFileAtomic(req->report, ToJson(report).dump(2));
    if (!w.ok()) {
      ReportToLog(w);
      return kMintExitBadRequest;
    }
    std::printf("%s\n", MintFrameLine("report", kReportStep, kReportStep,
                                      status + (token.empty() ? "" : " " + token))
                            .c_str());
    return code;
  };
  if (req->attempt == 1 && TestSeconds("KILN_TEST_MINT_RESOURCE_ONCE") == 1) {
    return finish(kMintExitResource, "resource", "resource_exhausted",
                  "KILN_TEST_MINT_RESOURCE_ONCE: resource exit on attempt 1");
  }
  auto r = RequestForChild(*req);
  if (!r.ok()) {
    return finish(kMintExitBadRequest, "bad_request", "bad_request", r.status().ToString());
  }
  // Test switch (base/secret_scan.h): with the manifest read, what this child holds is what it was
  // given; the e2e tests show no hub token is among it.
  if (Status scan = WriteSecretScanReportFromEnv("mint"); !scan.ok()) ReportToLog(scan);
  r->intake = req->intake;
  r->num_threads = req->threads;
  r->compile.parallel_compiles = req->parallel_compiles;
  r->work_dir = req->out_dir + "/work";
  const char* perturb = std::getenv("KILN_TEST_MINT_PERTURB");
  if (perturb != nullptr && std::string(perturb) == "gray") {
    r->compile.emit.test_output_scale = 1.002;
    r->thresholds.retention = 0.99;
  }
  report.family = r->family;
  // Progress: one frame per stage, and the live phases file rewritten as each stage ends.
  int step = 0;
  std::string current;
  auto stage_start = std::chrono::steady_clock::now();
  r->on_stage = [&](const std::string& stage) {
    const auto now = std::chrono::steady_clock::now();
    if (!current.empty()) {
      report.phases.push_back(
          {current, std::chrono::duration<double, std::milli>(now - stage_start).count()});
      nlohmann::json live = ToJson(report);
      live["status"] = "running";
      (void)WriteFileAtomic(req->phases, live.dump(2));
    }
    current = stage;
    stage_start = now;
    ++step;
    std::printf("%s\n", MintFrameLine(stage, step, kStageCount, req->target).c_str());
    if (stage == "compile") TestStallOrSpin();
  };
  auto minted = MintCell(*r);
  if (!current.empty()) {
    report.phases.push_back({current, std::chrono::duration<double, std::milli>(
                                          std::chrono::steady_clock::now() - stage_start)
                                          .count()});
  }
  if (!minted.ok()) {
    std::string token;
    const int code = ExitFor(minted.status(), &token);
    return finish(code, code == kMintExitResource ? "resource" : "refused", token,
                  minted.status().ToString());
  }
  report.key = minted->key;
  report.axes = minted->axes;
  report.gate = minted->gate.Summary();
  for (size_t c : minted->entry_classes) report.entry_classes.push_back(static_cast<int64_t>(c));
  const std::string& bytes = req->intake ? minted->shared_object : minted->tar;
  report.artifact = req->out_dir + (req->intake ? "/cell.so" : "/cell.tar");
  report.digest = CellDigest(bytes);
  if (Status w = WriteFileAtomic(report.artifact, bytes); !w.ok()) {
    report.artifact.clear();
    return finish(kMintExitResource, "resource", "resource_exhausted", w.ToString());
  }
  report.phases.push_back({"total", std::chrono::duration<double, std::milli>(
                                        std::chrono::steady_clock::now() - started)
                                        .count()});
  return finish(kMintExitMinted, "minted", "", "");
}

}  // namespace kiln
