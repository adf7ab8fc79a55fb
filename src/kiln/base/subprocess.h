// Running another program and collecting what it prints (base layer). Used by the compiler
// driver, by toolchain identity (`<compiler> --version`) and by the CLI; the mint parent and the
// hub's rebuild sandbox need resource limits and descriptor plumbing posix_spawn cannot express,
// and keep their own fork paths for that (each builds everything before fork). SelfExe is how
// each of them names the binary that starts a copy of kiln.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "src/kiln/base/status.h"

namespace kiln {

// Runs argv[0] (a path; no PATH search, no shell) with argv, stdout and stderr both captured into
// *output (may be null), in `cwd` when it is not "". The child is started with posix_spawn, so
// nothing runs in a forked copy of this process: safe from any thread of a multi-threaded
// caller. It inherits the caller's environment and process group, so whoever kills the group
// (the mint parent does) takes it too. Returns the exit code, or 128 + the signal that killed it.
// Errors: InvalidArgument for an empty argv; ResourceExhausted when the spawn itself fails
// (naming the program and errno); IOError when no pipe can be made.
Result<int> RunProcess(const std::vector<std::string>& argv, std::string* output,
                       const std::string& cwd = "");

// Starts argv[0] (a path) with argv and returns its pid without waiting: stdout and stderr go to
// `log_path` (created or truncated, mode 0644), the environment is this process's with each
// "NAME=value" of `env_overrides` set over it. posix_spawn, so nothing is allocated in a forked
// copy of this process. The caller reaps the child (waitpid). Errors name the program.
Result<pid_t> SpawnWithLog(const std::vector<std::string>& argv,
                           const std::vector<std::string>& env_overrides,
                           const std::string& log_path);

// The absolute path of this process's own binary (/proc/self/exe resolved), for starting another
// copy of kiln (a mint child, the hub builder's child, the demo's hub and worker); "" when it
// cannot be read.
std::string SelfExe();

}  // namespace kiln
