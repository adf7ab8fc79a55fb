// The system compiler driver (compile layer): turns emitted C++ into a cell's shared object with
// the fixed flags of the toolchain block (identity/toolchain.h), -march of the sm axis, and
// reproducible settings (law 15).
#include "src/kiln/compile/driver.h"

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
