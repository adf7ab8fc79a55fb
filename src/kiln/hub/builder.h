// The hub's builder role: before it signs a cell, the hub rebuilds the cell's shared object from
// its source with the pinned toolchain, in a sandbox, and signs only if the bytes are equal (hub
// layer; docs/trust.md, docs/hub-api.md "Builder").
//
// The rebuild itself is cell/provenance.h (RebuildSharedObject), run by a child process
// (`kiln rebuild --child DIR`) so that a hostile source is compiled away from the hub's memory,
// files, sockets and network:
//   - its own process group, killed whole at the end or after the wall-clock limit;
//   - every file descriptor above stderr closed before exec (the hub's listening socket, its
//     database, its signing key files never reach the child), stdin /dev/null, a minimal
//     environment (PATH, HOME and TMPDIR inside the work directory, KILN_CXX if set);
//   - a network namespace of its own with no interface but loopback (unshare CLONE_NEWNET; as
//     root directly, otherwise inside a user namespace), so a compiler tricked by the source can
//     reach nothing;
//   - as root: every group dropped and the builder user's uid and gid taken (default `nobody`),
//     so it can read only what that user can, and write only its work directory;
//   - rlimits: address space, CPU seconds, file size, open files, no core dumps.
// What the sandbox does not give: the filesystem stays visible (world-readable files can be
// #included into a rebuilt cell), no seccomp filter, no CPU quota beyond the rlimit. See
// docs/trust.md "What remains trusted".
//
// The child receives the source and the metadata, never the published shared object: the hub
// compares the bytes itself, so a child that lies cannot make a mismatch pass by echoing them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "src/kiln/base/status.h"
#include "src/kiln/cell/metadata.h"
#include "src/kiln/cell/pack.h"

namespace kiln {

// A refusal for the publisher's cell (422): rebuild_unavailable, rebuild_failed, rebuild_mismatch
// (provenance.h). An infrastructure failure that a retry may cure (503):
inline constexpr const char* kRefusalBuilderUnavailable = "builder_unavailable";

// What a verified rebuild attests, as the receipt states it.
struct RebuildAttestation {
  std::string builder;        // the builder's name
  std::string source_digest;  // "sha256:<hex>" of source/cell.cc
  std::string so_digest;      // "sha256:<hex>" of cell.so (equal to the rebuilt bytes)
  std::string sandbox;        // what confinement applied, e.g. "netns uid=65534 rlimits"
  double ms = 0;
};

class CellBuilder {
 public:
  virtual ~CellBuilder() = default;
  // The name receipts state as `builder`.
  virtual const std::string& name() const = 0;
  // Rebuilds `files.source` as `metadata` describes and compares the result with
  // `files.shared_object`. Any thread; implementations bound how many run at once.
  virtual Result<RebuildAttestation> Rebuild(const CellMetadata& metadata,
                                             const CellFiles& files) = 0;
};

struct SandboxOptions {
  std::string name;             // receipts' `builder`; "" = "hub@<hostname>"
  std::string kiln_binary;      // the binary that runs `rebuild --child`; "" = /proc/self/exe
  std::string user = "nobody";  // taken when the hub runs as root
  std::string work_root;        // work directories are made here; "" = $TMPDIR or /tmp
  int timeout_s = 600;          // wall clock per rebuild; the group is killed after it
  int64_t memory_mb = 4096;     // RLIMIT_AS of each process
  int64_t cpu_s = 900;          // RLIMIT_CPU of each process
  int64_t max_file_mb = 1024;   // RLIMIT_FSIZE
  int parallel_compiles = 2;    // compiler processes per rebuild
  int concurrent = 2;           // rebuilds at once; more wait
  // Refuse to rebuild (builder_unavailable) when the network namespace cannot be made, instead
  // of building with the network reachable.
  bool require_network_isolation = true;
};

std::unique_ptr<CellBuilder> NewSandboxedBuilder(SandboxOptions options);

}  // namespace kiln
