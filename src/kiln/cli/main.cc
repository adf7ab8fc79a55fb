// `kiln`: the one binary. Subcommands live in cmd_*.cc; this file only wires them.

#include <stdlib.h>
#include <unistd.h>

#include "src/kiln/cli/commands.h"

namespace {

// The OpenMP team that runs oneDNN's kernels and every cell's generated loops spins at each
// barrier before it sleeps: libgomp's default is 300,000 pause loops (~15 ms), so on a machine
// with other work a thread that waits for a descheduled one burns the core the other needs
// (a 2-thread UNet denoiser ran 4-5x slower under load than with a short spin). libgomp reads its
// policy once, when it is loaded, so kiln sets a short spin (~0.5 ms, which still covers the gap
// between one kernel and the next) and starts itself again, unless the environment already
// says what it wants (OMP_WAIT_POLICY or GOMP_SPINCOUNT), which is always respected.
constexpr const char* kSpinCount = "10000";

void ChooseOpenMpWaitPolicy(char** argv) {
  if (getenv("OMP_WAIT_POLICY") != nullptr || getenv("GOMP_SPINCOUNT") != nullptr) return;
  if (setenv("GOMP_SPINCOUNT", kSpinCount, 1) != 0) return;
  execv("/proc/self/exe", argv);
  // No exec (no /proc): carry on with the library's default.
}

}  // namespace

int main(int argc, char** argv) {
  ChooseOpenMpWaitPolicy(argv);
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
  kiln::cli::AddWorkerCommand(app, &exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  return exit_code;
}
