// The system compiler driver (compile layer): turns emitted C++ into a cell's shared object with
// the fixed flags of the toolchain block (identity/toolchain.h), -march of the sm axis, and
// reproducible settings (law 15).
#include "src/kiln/compile/driver.h"

#include "src/kiln/base/file.h"
#include "src/kiln/base/subprocess.h"

namespace kiln {

namespace {

class SystemCompilerDriver : public CompilerDriver {
 public:
  explicit SystemCompilerDriver(Toolchain t) : t_(std::move(t)) {}

  Status CompileObject(const std::string& source_path, const std::string& object_path,
                       const std::string& sm, const std::vector<std::string>& defines,
                       const std::string& seed, const std::string& work_dir) override {
    std::vector<std::string> argv = {t_.compiler_path,
                                     "-c",
                                     source_path,
                                     "-o",
                                     object_path,
                                     "-march=" + sm,
                                     "-frandom-seed=" + seed,
                                     "-ffile-prefix-map=" + work_dir + "=/kiln"};
    for (const auto& f : t_.flags) {
      if (f.rfind("-Wl,", 0) != 0 && f != "-shared-libgcc") argv.push_back(f);
    }
    for (const auto& d : defines) argv.push_back("-D" + d);
    return Run(argv, work_dir, "compile " + source_path);
  }

  Status LinkShared(const std::vector<std::string>& objects, const std::string& so_path,
                    const std::string& work_dir) override {
    std::vector<std::string> argv = {
        t_.compiler_path,       "-shared", "-o", so_path, "-Wl,--build-id=sha1", "-Wl,-z,defs",
        "-Wl,--hash-style=gnu", "-fPIC"};
    for (const auto& o : objects) argv.push_back(o);
    argv.push_back("-lm");
    return Run(argv, work_dir, "link " + so_path);
  }

  Result<std::string> Preprocess(const std::string& source_path, const std::string& sm,
                                 const std::vector<std::string>& defines,
                                 const std::string& work_dir) override {
    std::vector<std::string> argv = {t_.compiler_path, "-E", source_path, "-march=" + sm};
    for (const auto& f : t_.flags) {
      if (f.rfind("-Wl,", 0) != 0 && f != "-shared-libgcc") argv.push_back(f);
    }
    for (const auto& d : defines) argv.push_back("-D" + d);
    const std::string out_path = work_dir + "/preprocessed.ii";
    argv.insert(argv.end(), {"-o", out_path});
    KILN_RETURN_IF_ERROR(Run(argv, work_dir, "preprocess " + source_path));
    return ReadFile(out_path);
  }

  Result<std::vector<std::string>> SystemIncludeDirs(const std::string& work_dir) override {
    // `-v` prints the search list between these two lines, one directory per line.
    std::string out;
    KILN_ASSIGN_OR_RETURN(int rc, RunProcess({t_.compiler_path, "-xc++", "-std=c++17", "-E", "-v",
                                              "-o", "/dev/null", "/dev/null"},
                                             &out, work_dir));
    if (rc != 0)
      return Status::Internal("the compiler's include search list: exit " + std::to_string(rc));
    std::vector<std::string> dirs;
    const size_t begin = out.find("#include <...> search starts here:");
    const size_t end = out.find("End of search list.");
    if (begin == std::string::npos || end == std::string::npos || end < begin) {
      return Status::Internal("the compiler did not print its include search list");
    }
    size_t at = out.find('\n', begin);
    while (at != std::string::npos && at < end) {
      const size_t next = out.find('\n', at + 1);
      std::string line =
          out.substr(at + 1, (next == std::string::npos ? out.size() : next) - at - 1);
      while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) line.erase(0, 1);
      while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
      if (!line.empty() && line.front() == '/') dirs.push_back(line);
      at = next;
    }
    return dirs;
  }

 private:
  Status Run(const std::vector<std::string>& argv, const std::string& cwd,
             const std::string& what) {
    std::string out;
    auto rc = RunProcess(argv, &out, cwd);
    if (!rc.ok()) return rc.status();
    if (*rc != 0) {
      if (out.size() > 4000) out = out.substr(0, 4000) + "\n[...]";
      return Status::Internal("system compiler failed to " + what + " (exit " +
                              std::to_string(*rc) + "):\n" + out);
    }
    return Status::OK();
  }
  Toolchain t_;
};

}  // namespace

std::unique_ptr<CompilerDriver> MakeSystemCompilerDriver(const Toolchain& toolchain) {
  return std::make_unique<SystemCompilerDriver>(toolchain);
}

}  // namespace kiln
