// The mint parent: starts one `kiln mint --child` process and watches it to its end (mint layer,
// below the worker: worker/minter.h decides when to mint and adopts what a child made; this file
// only runs the child; protocol.h is what passes between them; docs/design.md §12 "Mint child
// protocol").
//
// One Run:
//   1. the mint's private directory (0700) with request.json; the child is a fresh process (fork
//      + exec of the kiln binary, its own process group, `nice`d below serving), never a fork of
//      the threaded server that keeps running code of ours
//   2. its stdout is read for MINT_FRAME lines; its stderr goes to child.log in the directory
//   3. watchdog: every sample the parent adds up the CPU time of the child's process group and
//      the bytes the child wrote; no change for the stall window -> the group is SIGKILLed and
//      reaped (`child_stalled`). A slow child that keeps computing is never killed: there is no
//      total time limit.
//   4. the child dies with its parent (the lifeline in protocol.h), and nothing of its process
//      group outlives the Run
//   5. the ending is judged: exit 0 with an artifact -> minted; exit 2 -> the child's refusal
//      token; exit 3 -> `resource_exhausted`; exit 4 -> `bad_request`; a signal, or exit 0 without
//      an artifact -> `child_crashed`. A stall or a crash names the last frame and the stages the
//      live phases file says were done.
#pragma once

#include <sys/types.h>

#include <mutex>
#include <set>
#include <string>

#include "src/kiln/mint/protocol.h"

namespace kiln {

// Phase tokens of a Run that did not mint and are not the child's own refusal.
inline constexpr const char* kMintChildStalled = "child_stalled";
inline constexpr const char* kMintChildCrashed = "child_crashed";
inline constexpr const char* kMintBadRequest = "bad_request";
inline constexpr const char* kMintResourceExhausted = "resource_exhausted";
inline constexpr const char* kMintSpawnFailed = "spawn_failed";

struct MintParentOptions {
  std::string binary;  // the kiln binary the child runs; "" = SelfExe() (base/subprocess.h)
  int stall_window_ms = 120000;
  int sample_ms = 250;  // watchdog sampling period
  int child_nice = 10;  // the child runs below serving's priority
};

struct MintChildOutcome {
  std::string phase;  // "" = minted: report.artifact exists; else the token of the ending
  std::string detail;
  MintChildReport report;  // as the child wrote it, when it wrote one
  int exit_code = -1;      // the child's exit code; -1 when it did not exit by itself
  int frames = 0;          // MINT_FRAME lines read
  double ms = 0;
};

class MintParent {
 public:
  explicit MintParent(MintParentOptions options);
  ~MintParent();  // KillAll()
  MintParent(const MintParent&) = delete;
  MintParent& operator=(const MintParent&) = delete;

  // Runs one child in `dir` (made here, 0700; it must not hold another mint) for `request`,
  // whose out_dir, report and phases are set here to `dir` and files in it. Blocks until the child
  // has ended and its process group is killed and reaped. Thread-safe: one Run per thread.
  MintChildOutcome Run(const std::string& dir, MintChildRequest request);

  // Kills the process group of every running child; a Run that starts a child after this kills
  // it at once. Idempotent.
  void KillAll();

 private:
  const MintParentOptions options_;
  std::mutex mu_;
  std::set<pid_t> children_;  // process groups of live children
  bool stopping_ = false;
};

}  // namespace kiln
