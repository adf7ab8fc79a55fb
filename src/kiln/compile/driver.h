// The system compiler driver (compile layer): emitted C++ in, object files and a cell's shared
// object out. What the compiler is, and the flags that are part of a cell's identity, are
// identity/toolchain.h's; this file only runs it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "src/kiln/base/status.h"
#include "src/kiln/identity/toolchain.h"

namespace kiln {

// Runs the system compiler. Real implementation plus one that records commands (tests).
class CompilerDriver {
 public:
  virtual ~CompilerDriver() = default;
  // Compiles `source_path` into an object file with the fixed flags, -march=<sm>, and extra
  // defines. Reproducible: -frandom-seed=<seed>, -ffile-prefix-map=<work_dir>=/kiln, no debug
  // info, no timestamps. Errors carry the compiler's stderr.
  virtual Status CompileObject(const std::string& source_path, const std::string& object_path,
                               const std::string& sm, const std::vector<std::string>& defines,
                               const std::string& seed, const std::string& work_dir) = 0;
  // Links objects into a shared object (no undefined symbols besides libc/libm).
  virtual Status LinkShared(const std::vector<std::string>& objects, const std::string& so_path,
                            const std::string& work_dir) = 0;
  // Runs only the preprocessor over `source_path` as CompileObject would compile it (same flags,
  // -march, defines), and returns its output: what the hub's builder checks before it compiles a
  // published source (cell/provenance.h CheckPreprocessed). Errors carry the compiler's stderr.
  virtual Result<std::string> Preprocess(const std::string& source_path, const std::string& sm,
                                         const std::vector<std::string>& defines,
                                         const std::string& work_dir) = 0;
  // The directories the compiler searches for `#include <...>`, in its order.
  virtual Result<std::vector<std::string>> SystemIncludeDirs(const std::string& work_dir) = 0;
};

std::unique_ptr<CompilerDriver> MakeSystemCompilerDriver(const Toolchain& toolchain);

}  // namespace kiln
