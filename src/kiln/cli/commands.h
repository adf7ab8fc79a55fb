// The `kiln` subcommands (cli layer). Each Add*Command registers one subcommand on the app; its
// callback stores the process exit code in *exit_code (0 ok, 1 error, 2 usage). Errors are
// printed as "kiln <cmd>: <status>" on stderr; nothing throws past the callback.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "src/kiln/base/status.h"

namespace kiln::cli {

void AddInfoCommand(CLI::App& app, int* exit_code);
void AddRunCommand(CLI::App& app, int* exit_code);
void AddCheckpointCommand(CLI::App& app, int* exit_code);
void AddDemoCommand(CLI::App& app, int* exit_code);
void AddCellCommands(CLI::App& app, int* exit_code);  // key, mint, inspect
void AddBenchCommand(CLI::App& app, int* exit_code);
void AddHubCommand(CLI::App& app, int* exit_code);  // cmd_hub.cc
void AddPublishCommand(CLI::App& app, int* exit_code);
void AddResolveCommand(CLI::App& app, int* exit_code);
void AddRebuildCommand(CLI::App& app, int* exit_code);   // cmd_hub.cc
void AddHubTokenCommand(CLI::App& app, int* exit_code);  // cmd_hub_token.cc
void AddWorkerCommand(CLI::App& app, int* exit_code);    // cmd_worker.cc
void AddFleetSimCommand(CLI::App& app, int* exit_code);  // cmd_fleet_sim.cc

// Prints "kiln <cmd>: <code>: <message>" and returns 1.
int ReportError(const std::string& cmd, const Status& status);

// Replaces characters unsafe in file names (anything but [A-Za-z0-9._-]) with '_'; never returns
// "", "." or "..".
std::string SafeFileName(const std::string& name);

}  // namespace kiln::cli
