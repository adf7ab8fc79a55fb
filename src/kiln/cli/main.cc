// `kiln`: the one binary. Subcommands live in cmd_*.cc; this file only wires them.

#include "src/kiln/cli/commands.h"

int main(int argc, char** argv) {
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
