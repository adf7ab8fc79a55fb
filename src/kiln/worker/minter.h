// Minter: the worker's miss policy and intake lane, driving `kiln mint --child` processes
// (worker layer, the thin adapter over the mint layer's parent, mint/parent.h, which starts and
// watches each child; docs/design.md §2 laws 5, 6, 12-14, 16, §4 Mint, §12 "Mint child
// protocol").
//
// Exported target, boot miss (MintExported). The target already serves eager (posture
// `mint_in_progress` while the mint runs); this returns at once and, on a thread of its own:
//   1. quarantined key (a mint of it failed in this process)  -> `self_mint_skipped quarantined`
//   2. memory budget: the estimate (compiler processes + weights) above the budget (the
//      manifest's, or MemAvailable)                      -> `self_mint_skipped insufficient_memory`
//   3. `self_mint_started`; a fresh child process (fork + exec of this binary, its own process
//      group, lower priority) runs `kiln mint --child REQUEST.json` (mint/parent.h)
//   4. watchdog (mint/parent.h): no CPU or disk progress of the child's process group for the
//      stall window -> the group is SIGKILLed and reaped (`child_stalled`). A slow child that
//      keeps computing is never killed: there is no total time limit.
//   5. exit 3 (resource) -> retried once with a fresh memory check; exit 2 -> the child's refusal
//      token; exit 4 -> `bad_request`; a signal, or exit 0 without an artifact -> `child_crashed`
//   6. adopting the child's bytes: its recorded axes (sm, toolchain, envelope, graph), family and
//      lane equal ours, else `key_axis_divergence` naming the first; admission as for any cell;
//      a digest the hub revoked is refused (`revoked`);
//      then, per target waiting on the key, load + bind the target's live checkpoint, the strict
//      gate (`cell_numerics`) and the fence proof against the target's own eager interpreter,
//      install (`local_cell_armed`); store locally (`local_cell_stored`); `mint_phases` with the
//      child's stage times; enqueue the publish (publisher.h)
//   Any refusal: `self_mint_abort` phase = the token, the child's bytes deleted, nothing stored or
//   published, every waiting target keeps serving eager, and the key is quarantined for the
//   process life (no re-mint churn). A deterministic refusal is reported to the hub so a
//   release's obligation is settled terminally.
// Same-key targets share one mint: a second target missing the same key while its mint runs
// joins it and is armed from the same bytes.
//
// Intake target (CompileIntake, law 12): the same child with `intake`, at boot warmup; the
// target serves eager (`arm_pending`) meanwhile; the proven .so is re-hashed against the child's
// report, loaded on the intake lane, gated, installed (`jit_cell`, no ref) and recorded by one
// `jit_compile` row with the compile's duration. Nothing is keyed, stored, published or owed.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "src/kiln/cell/store.h"
#include "src/kiln/graph/ir.h"
#include "src/kiln/manifest/manifest.h"
#include "src/kiln/mint/parent.h"
#include "src/kiln/worker/events.h"
#include "src/kiln/worker/publisher.h"
#include "src/kiln/worker/revocations.h"
#include "src/kiln/worker/serving.h"
#include "src/kiln/worker/store_keeper.h"

namespace kiln {

struct MinterOptions {
  std::string binary;             // the kiln binary the child runs; "" = /proc/self/exe
  std::string manifest_path;      // absolute; the child reads its target from it
  std::string manifest_base_dir;  // where its relative paths resolve ("" = its directory)
  std::string work_root;          // one private directory per mint is made under here
  std::string private_dir;        // loaded .so files go under here
  int stall_window_ms = 120000;
  int sample_ms = 250;             // watchdog sampling period
  int64_t memory_budget_mb = 0;    // 0 = MemAvailable at spawn time
  int child_nice = 10;             // the child runs below serving's priority (2 cores: see
                                   // docs/benchmarks.md "Serving during a mint")
  int child_threads = 1;           // compute threads of the child's proof runs
  int parallel_compiles = 1;       // compiler processes the child runs at once
  int serve_threads = 1;           // compute threads of the armed cell
  std::string worker;              // names the worker in rows
  LocalStore* store = nullptr;     // required for exported mints
  StoreKeeper* keeper = nullptr;   // told of every cell installed here; null = none
  Publisher* publisher = nullptr;  // null = no hub: cells stay local
  // A digest the hub revoked is never armed, minted here or not (revocations.h).
  RevocationWatch* revocations = nullptr;
  EventLog* events = nullptr;
};

// One target waiting on a mint.
struct MintBinding {
  ServedTarget* target = nullptr;  // not owned; outlives the Minter
  TargetSpec spec;
};

class Minter {
 public:
  explicit Minter(MinterOptions options);
  ~Minter();  // Stop()
  Minter(const Minter&) = delete;
  Minter& operator=(const Minter&) = delete;

  // The miss policy for an exported target whose key missed (see above). Returns at once.
  // `lease` (may be null): the fleet's mint lease of the key (mint_lease.h), held while the mint
  // runs and then by the publish of its cell; dropped at once when the mint fails or is skipped.
  void MintExported(const std::string& key, MintBinding binding,
                    std::shared_ptr<void> lease = nullptr);
  // Whether a mint of `key` runs in this process (a miss of it joins that mint).
  bool IsMinting(const std::string& key);
  // The intake lane's compile for `binding` (see above). Returns at once.
  void CompileIntake(MintBinding binding);

  // Blocks until no mint runs; false on timeout.
  bool WaitIdle(int timeout_ms);
  // Kills running children (their process groups), joins the threads. Idempotent.
  void Stop();

  // The estimate MintExported checks against the budget, in MiB.
  static int64_t EstimateMintMb(const ServedTarget& target, int parallel_compiles);

 private:
  struct Job;
  void RunExported(std::shared_ptr<Job> job);
  // Installs a minted, proven cell on one waiting target (or, under an eager order, only says it
  // was stored). Returns whether it was installed.
  bool InstallMinted(const MintBinding& b, const std::shared_ptr<ArmedCell>& cell,
                     const std::string& key, const std::string& ref, Clock::TimePoint adopt_start);
  void RunIntake(std::shared_ptr<Job> job);
  // Runs the child for `job` in a fresh private directory, through parent_.
  MintChildOutcome RunChild(Job& job, int attempt);
  // The memory check; "" when the mint fits, else the row's detail.
  std::string MemoryShortfall(const ServedTarget& target) const;
  void Emit(const char* kind, const std::string& phase, double ms, const std::string& key,
            const std::string& ref, const std::string& target, const std::string& detail,
            std::vector<std::pair<std::string, double>> stages = {});
  void Launch(std::shared_ptr<Job> job, bool intake);

  const MinterOptions options_;
  MintParent parent_;  // starts, watches and kills the children
  std::mutex mu_;
  std::condition_variable idle_cv_;
  std::map<std::string, std::shared_ptr<Job>> running_;  // by key (exported mints)
  std::set<std::string> quarantined_;
  std::vector<std::thread> threads_;
  int active_ = 0;
  bool stopping_ = false;
};

}  // namespace kiln
