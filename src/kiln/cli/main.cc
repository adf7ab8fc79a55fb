// `kiln`: the one binary. Subcommands live in cmd_*.cc; this file only wires them.

#include <stdlib.h>
#include <unistd.h>

#include "src/kiln/cli/commands.h"

namespace {

// Two runtime settings that libraries read once, when they are loaded, so kiln sets them in its
// environment and starts itself again; a setting the environment already makes is always
// respected.
//
// The OpenMP team that runs oneDNN's kernels and every cell's generated loops spins at each
// barrier before it sleeps: libgomp's default is 300,000 pause loops (~15 ms), so on a machine
// with other work a thread that waits for a descheduled one burns the core the other needs
// (a 2-thread UNet denoiser ran 4-5x slower under load than with a short spin). kiln sets a
// short spin (~0.5 ms, which still covers the gap between one kernel and the next), unless
// OMP_WAIT_POLICY or GOMP_SPINCOUNT is set.
//
// Weights and activations are streamed through on every request, tens to hundreds of MB of them
// at 4 KiB per TLB entry: backed by transparent huge pages, BERT-base ran 12-15% faster, ResNet-50
// 15-20% and a wide MLP 8-15%, for 1-3 MB more resident memory (measured on 2 cores, AVX-512).
// glibc's malloc asks for them (madvise) on its large mappings when told to, which also covers
// what oneDNN allocates; where the kernel's THP setting is "never", the hint does nothing. kiln
// sets the tunable unless GLIBC_TUNABLES is set.
constexpr const char* kSpinCount = "10000";
constexpr const char* kMallocTunables = "glibc.malloc.hugetlb=1";

void ChooseRuntimeSettings(char** argv) {
  bool changed = false;
  if (getenv("OMP_WAIT_POLICY") == nullptr && getenv("GOMP_SPINCOUNT") == nullptr) {
    changed |= setenv("GOMP_SPINCOUNT", kSpinCount, 1) == 0;
  }
  if (getenv("GLIBC_TUNABLES") == nullptr) {
    changed |= setenv("GLIBC_TUNABLES", kMallocTunables, 1) == 0;
  }
  if (!changed) return;
  execv("/proc/self/exe", argv);
  // No exec (no /proc): carry on with the libraries' defaults.
}

}  // namespace

int main(int argc, char** argv) {
  ChooseRuntimeSettings(argv);
  CLI::App app{"kiln: ahead-of-time compiled ONNX cells, proven against an eager interpreter"};
  app.require_subcommand(1);
  int exit_code = 0;
  kiln::cli::AddInfoCommand(app, &exit_code);
  kiln::cli::AddRunCommand(app, &exit_code);
  kiln::cli::AddCheckpointCommand(app, &exit_code);
  kiln::cli::AddDemoCommand(app, &exit_code);
  kiln::cli::AddCellCommands(app, &exit_code);
  kiln::cli::AddBenchCommand(app, &exit_code);
  kiln::cli::AddHubCommand(app, &exit_code);
  kiln::cli::AddPublishCommand(app, &exit_code);
  kiln::cli::AddResolveCommand(app, &exit_code);
  kiln::cli::AddRebuildCommand(app, &exit_code);
  kiln::cli::AddHubTokenCommand(app, &exit_code);
  kiln::cli::AddWorkerCommand(app, &exit_code);
  kiln::cli::AddFleetSimCommand(app, &exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  return exit_code;
}
