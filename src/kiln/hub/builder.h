// The hub's builder role: before it signs a cell, the hub rebuilds the cell's shared object from
// its source with the pinned toolchain, in a sandbox, and signs only if the bytes are equal (hub
// layer; docs/trust.md, docs/hub-api.md "Builder").
//
// The rebuild itself is mint/regenerate.h (CheckRebuildSource, then RebuildSharedObject), run by
// a child process (`kiln rebuild --child DIR`) so that a hostile source is compiled away from the
// hub's memory, files, sockets and network:
//   - its own process group, killed whole at the end or after the wall-clock limit, which scales
//     with the cell (a base plus a share per entry, never above `timeout_s`);
//   - its own mount namespace whose root is a fresh tmpfs holding only the toolchain (/usr and
//     the few /etc files the compiler and the dynamic loader read), /dev/null and /dev/urandom, a
//     /proc of its own pid namespace, the kiln binary and the work directory: no hub data, no
//     /etc/passwd, no other process's /proc. What is not mounted cannot be #included, .incbin'd
//     or read by a compiler tricked into it;
//   - its own pid namespace and a network namespace with no interface but loopback (unshare; as
//     root directly, otherwise inside a user namespace);
//   - every file descriptor above stderr closed before exec, stdin /dev/null, a minimal
//     environment (PATH, HOME and TMPDIR inside the work directory, KILN_CXX if set);
//   - as root: every group dropped and the builder user's uid and gid taken (default `nobody`);
//   - rlimits: address space, CPU seconds, file size, open files, no core dumps.
// Before it compiles anything the child refuses a source that asks for any file but the
// toolchain's headers (`include_refused`), and what it reports of a failed compile is a token and
// a line number of the publisher's own source: never the compiler's words, which can quote any
// file it read. See docs/trust.md "What remains trusted" for what the sandbox does not give.
//
// Building is a shared resource: slots are shared fairly between publishers (a tenant org counts
// as one), a tenant holds at most `per_share` slots and never the last `platform_reserved` ones, a
// platform publish goes ahead of every waiting tenant one, and a share with `max_waiting` rebuilds
// already queued is answered `builder_busy` (503, retry later).
//
// The child receives the source and the metadata, never the published shared object: the hub
// compares the bytes itself, so a child that lies cannot make a mismatch pass by echoing them.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "src/kiln/base/status.h"
#include "src/kiln/cell/metadata.h"
#include "src/kiln/cell/pack.h"

namespace kiln {

// A refusal for the publisher's cell (422): rebuild_unavailable, rebuild_failed, rebuild_mismatch,
// include_refused (provenance.h). An infrastructure failure that a retry may cure (503):
inline constexpr const char* kRefusalBuilderUnavailable = "builder_unavailable";
// This publisher's share of the builder has `max_waiting` rebuilds queued already (503):
inline constexpr const char* kRefusalBuilderBusy = "builder_busy";

// What a verified rebuild attests, as the receipt states it.
struct RebuildAttestation {
  std::string builder;        // the builder's name
  std::string source_digest;  // "sha256:<hex>" of source/cell.cc
  std::string so_digest;      // "sha256:<hex>" of cell.so (equal to the rebuilt bytes)
  std::string sandbox;        // what confinement applied, e.g. "netns uid=65534 rlimits"
  double ms = 0;
};

// A published cell's two large members as the builder reads them: in pieces, straight from where
// they are stored, so that no rebuild holds a whole cell in the hub's memory. `read` calls `sink`
// with consecutive pieces until the member ends or `sink` fails; it passes that failure on.
struct PublishedMember {
  uint64_t size = 0;
  std::string digest;  // "sha256:<hex>", as receipts state it
  std::function<Status(const std::function<Status(std::string_view)>& sink)> read;
};
struct PublishedMembers {
  PublishedMember source;
  PublishedMember shared_object;
};
// The members of a cell held in memory (tests; `kiln rebuild` of a local file).
PublishedMembers MembersOf(const CellFiles& files);

// Who asks for a rebuild: the builder's slots are shared by `share`.
struct RebuildRequester {
  std::string publisher;  // the token's name
  std::string share;      // what fairness counts as one: "org:<org>" for a tenant, the name else
  bool platform = false;  // a platform-tier publish (admins publish as the platform)
};

// What a builder holds now, for the hub's /metrics.
struct BuilderLoad {
  int waiting = 0;  // rebuilds queued for a slot
  int running = 0;  // rebuilds holding a slot
  int slots = 0;    // rebuilds that may run at once
};

class CellBuilder {
 public:
  virtual ~CellBuilder() = default;
  // Its queue now; a builder with no queue reports zeros. Any thread.
  virtual BuilderLoad Load() const { return {}; }
  // The name receipts state as `builder`.
  virtual const std::string& name() const = 0;
  // Rebuilds `members.source` as `metadata` describes and compares the result with
  // `members.shared_object`. Any thread; implementations bound how many run at once and may
  // refuse `builder_busy` when `who`'s share of them is full.
  virtual Result<RebuildAttestation> Rebuild(const CellMetadata& metadata,
                                             const PublishedMembers& members,
                                             const RebuildRequester& who) = 0;
};

struct SandboxOptions {
  std::string name;              // receipts' `builder`; "" = "hub@<hostname>"
  std::string kiln_binary;       // the binary that runs `rebuild --child`; "" = /proc/self/exe
  std::string user = "nobody";   // taken when the hub runs as root
  std::string work_root;         // work directories are made here; "" = $TMPDIR or /tmp
  int timeout_s = 600;           // the most wall clock a rebuild may have; the group is killed
  int base_timeout_s = 60;       // a rebuild's own limit: this plus per_entry_timeout_s an entry,
  int per_entry_timeout_s = 15;  // at most timeout_s
  int64_t memory_mb = 4096;      // RLIMIT_AS of each process
  int64_t cpu_s = 900;           // RLIMIT_CPU of each process
  int64_t max_file_mb = 1024;    // RLIMIT_FSIZE
  int parallel_compiles = 2;     // compiler processes per rebuild
  int concurrent = 2;            // rebuilds at once; more wait
  int platform_reserved = 1;     // slots tenants may never take (while concurrent > this)
  int per_share = 1;             // rebuilds one tenant share may run at once
  int max_waiting = 4;           // rebuilds one share may have queued; more: builder_busy
  // Refuse to rebuild (builder_unavailable) when the namespaces cannot be made, instead of
  // building with the network reachable or the hub's files visible.
  bool require_network_isolation = true;
  // The compiler the rebuild child uses (its KILN_CXX: a path, or a name on PATH); "" = this
  // process's $KILN_CXX, else c++.
  std::string cxx;
};

std::unique_ptr<CellBuilder> NewSandboxedBuilder(SandboxOptions options);
// "hub@<hostname>": a builder's name when SandboxOptions::name is "".
std::string DefaultBuilderName();

// One builder per toolchain: a cell is rebuilt by the builder whose toolchain block is the one
// its metadata records, so one hub attests the cells of every compiler its fleet runs (a mixed
// fleet: two OS images, a rolling compiler upgrade). A cell of a toolchain no builder has is
// refused `rebuild_unavailable`, naming its compiler and the ones this hub builds.
struct ToolchainBuilder {
  nlohmann::json toolchain;  // Toolchain::Block() of the builder's compiler
  std::unique_ptr<CellBuilder> builder;
};
// REQUIRES: `builders` is not empty. The router's name() is the first builder's; a receipt
// states the builder that rebuilt the cell (its attestation's `builder`).
std::unique_ptr<CellBuilder> NewToolchainRouter(std::vector<ToolchainBuilder> builders);

}  // namespace kiln
