// Shared helpers of the kiln subcommands (cli layer).
#include <cstdio>

#include "src/kiln/cli/commands.h"

namespace kiln::cli {

int ReportError(const std::string& cmd, const Status& status) {
  std::fprintf(stderr, "kiln %s: %s\n", cmd.c_str(), status.ToString().c_str());
  return 1;
}

std::string SafeFileName(const std::string& name) {
  std::string out;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    out += ok ? c : '_';
  }
  if (out.empty() || out == "." || out == "..") out = "_" + out;
  return out;
}

}  // namespace kiln::cli
