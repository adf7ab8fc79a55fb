// The mint child protocol: what a parent (the worker's minter, through mint/parent.h) hands a
// `kiln mint --child REQUEST.json` process (mint/child.h) and what it gets back (mint layer,
// between the mint itself and the worker; docs/design.md §4 "Mint (child process)", §12 "Mint child
// protocol"). The child is a fresh process, never a fork of the threaded server, so nothing the
// compiler does can hurt serving (law 16).
//
//   request file (JSON, written by the parent)  -> MintChildRequest
//   stdout lines `MINT_FRAME {"phase":…,"step":…,"total":…,"note":…}` (progress; any other output
//     is diagnostic and never parsed)
//   <phases> file, rewritten atomically after every stage, so a killed child leaves evidence
//   <report> file (JSON, written last)            -> MintChildReport
//   exit code: 0 minted · 2 refused (deterministic, never retried) · 3 resource (retry once)
//              · 4 bad request (a wiring bug, never retried). Exit 0 without an artifact, or any
//              other ending (a signal), counts as a crash.
//
// Exported lane: the artifact is the sealed cell.tar; the parent restates its environment axes,
// admits it and proves it again on the live target before anything serves from it.
// Intake lane (law 12): the artifact is the proven cell.so; nothing is keyed or sealed.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "src/kiln/base/status.h"
#include "src/kiln/cell/key.h"

namespace kiln {

inline constexpr int kMintExitMinted = 0;
inline constexpr int kMintExitRefused = 2;
inline constexpr int kMintExitResource = 3;
inline constexpr int kMintExitBadRequest = 4;

inline constexpr const char* kMintFramePrefix = "MINT_FRAME ";

// The child dies with its parent, whatever killed the parent (even SIGKILL, which runs no
// cleanup): PR_SET_PDEATHSIG is set before exec, and the child also holds the read end of a pipe
// at this descriptor whose write end only the parent holds (`--parent-alive-fd 3`). End of file
// on it means the parent is gone; the child then kills its own process group (itself and its
// compilers). The pipe covers what the signal alone misses: a parent that died before the signal
// was armed, and the signal's tie to the forking thread rather than the process.
inline constexpr int kMintParentAliveFd = 3;
inline constexpr const char* kMintParentAliveFlag = "--parent-alive-fd";

struct MintChildRequest {
  std::string manifest;  // absolute path of the worker's manifest
  // Where the manifest's relative paths resolve ("" = its directory): a worker with a broker
  // hands its children a copy without the hub token, written elsewhere (worker/broker.h).
  std::string manifest_base_dir;
  std::string target;   // the target to mint
  bool intake = false;  // intake lane: compile here, never key or seal
  std::string out_dir;  // the child writes its artifact here (created by the parent, 0700)
  std::string report;   // the report file the child writes last
  std::string phases;   // the live phases file
  int threads = 1;      // compute threads of the proof runs
  int parallel_compiles = 1;
  int attempt = 1;  // 2 on the one retry after a resource exit
};

struct MintChildPhase {
  std::string phase;
  double ms = 0;
};

struct MintChildReport {
  std::string status;    // "minted" | "refused" | "resource" | "bad_request"
  std::string token;     // refusal token ("numerics_refused", "fence_refused", ...); "" if minted
  std::string message;   // prose
  std::string artifact;  // path of cell.tar (exported) or cell.so (intake); "" unless minted
  std::string key;       // "" for intake
  std::string digest;    // sha256 of the artifact's bytes
  KeyAxes axes;          // the child's environment axes (graph, envelope, sm, toolchain)
  std::string family;
  std::string lane;  // "exported" | "intake"
  std::string gate;  // the child's own gate summary
  std::vector<MintChildPhase> phases;
  int64_t peak_rss_kb = 0;
  // The envelope class (index in the target's declaration order) each entry was compiled from,
  // in entry order; classes not listed did not compile (partial coverage). Empty when not minted.
  std::vector<int64_t> entry_classes;
};

nlohmann::json ToJson(const MintChildRequest& r);
nlohmann::json ToJson(const MintChildReport& r);
// Strict: a missing or mistyped field is InvalidArgument naming `what` and the field.
Result<MintChildRequest> ParseMintChildRequest(const std::string& text, const std::string& what);
Result<MintChildReport> ParseMintChildReport(const std::string& text, const std::string& what);

// One progress line, `MINT_FRAME {...}` (no newline).
std::string MintFrameLine(const std::string& phase, int step, int total, const std::string& note);

// The report's stage times as "key=0.4 compile=812.0 ...", for event rows and refusal messages.
std::string MintPhasesDetail(const MintChildReport& report);

}  // namespace kiln
