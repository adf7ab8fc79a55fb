// A search of this process's own memory and environment for a secret (base layer), for tests
// that show where a credential is not: the hub token never reaches a worker's serving process
// (docs/trust.md "What a cell can reach").
//
// The secret is given complemented (every byte XOR 0xff) and compared complemented, so the scan
// never writes the secret's bytes anywhere: a scan of a process that does not hold the secret
// cannot plant it, and one that finds it found what the process itself held. Every readable
// mapping of /proc/self/maps is read through /proc/self/mem (device files and mappings over
// `max_region_bytes` are skipped and counted, so a report says what it did not look at), and
// /proc/self/environ as a whole.
//
// The test switch KILN_TEST_SECRET_SCAN=<file> (a file whose first line is the complemented
// secret) makes a process write what it found to `<file>.<role>.<pid>.json`
// (WriteSecretScanReportFromEnv); set while a cell is generated, it also makes the cell search its
// own process with its own code at its first call, for the first line and for the controls on
// further lines (`<file>.cell.<pid>.json`, compile/emit_cpp.h test_scan). Nothing in kiln sets it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "src/kiln/base/status.h"

namespace kiln {

inline constexpr const char* kTestSecretScanEnv = "KILN_TEST_SECRET_SCAN";

struct SecretScan {
  bool in_memory = false;                     // found in a readable mapping
  bool in_environ = false;                    // found in /proc/self/environ
  uint64_t regions = 0;                       // mappings read
  uint64_t bytes = 0;                         // bytes read
  uint64_t unreadable = 0;                    // mappings whose read failed part way or at once
  std::vector<std::string> unreadable_names;  // their "perms path" (the first 16)
  uint64_t skipped = 0;                       // device files and mappings over the size bound
};

// Every byte of `complemented` XOR 0xff.
std::string Complement(std::string_view bytes);

// Searches this process for the secret whose complement is `complemented` (non-empty).
Result<SecretScan> ScanOwnProcess(std::string_view complemented,
                                  uint64_t max_region_bytes = uint64_t{4} << 30);

// When KILN_TEST_SECRET_SCAN names a file, scans this process for its secret and writes
// {"role","pid","in_memory","in_environ","regions","bytes","unreadable","unreadable_names",
// "skipped","parent_memory_readable"} to `<file>.<role>.<pid>.json`; `parent_memory_readable` says
// whether /proc/<parent>/mem could be opened. OK and nothing happens when the variable is unset.
Status WriteSecretScanReportFromEnv(const std::string& role);

}  // namespace kiln
