// Fuzz harness for the ONNX importer (fuzz/; graph/onnx_import.h): ImportOnnxBytes on arbitrary
// bytes, with external data confined to an empty directory. Promises checked: a refusal names the
// source; an accepted graph has its nodes in topological order (a value is produced before any
// node reads it), holds only valid initializers, and has a digest or a typed refusal.
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>

#include "fuzz/harness.h"
#include "src/kiln/graph/digest.h"
#include "src/kiln/graph/onnx_import.h"

namespace kiln::fuzz {
namespace {

// External-data locations resolve against this directory, which holds no file: a fuzz input must
// never read whatever happens to sit in the working directory.
const std::string& EmptyBaseDir() {
  static const std::string dir = [] {
    std::string tmpl = (std::filesystem::temp_directory_path() / "kiln-fuzz-onnx-XXXXXX").string();
    const char* made = mkdtemp(tmpl.data());
    return std::string(made != nullptr ? made : "/nonexistent-kiln-fuzz-dir");
  }();
  return dir;
}

}  // namespace

bool FuzzOne(std::string_view bytes) {
  ImportOptions options;
  options.base_dir = EmptyBaseDir();
  Result<Graph> g = ImportOnnxBytes(bytes, kWhat, options);
  if (!g.ok()) {
    CheckRefusal(g.status(), "ImportOnnxBytes", kWhat);
    return false;
  }
  std::map<std::string, size_t> producer;
  for (size_t i = 0; i < g->nodes.size(); ++i) {
    for (const std::string& out : g->nodes[i].outputs) {
      if (!out.empty()) producer.emplace(out, i);
    }
  }
  for (size_t i = 0; i < g->nodes.size(); ++i) {
    for (const std::string& in : g->nodes[i].inputs) {
      auto it = producer.find(in);
      KILN_FUZZ_CHECK(in.empty() || it == producer.end() || it->second < i,
                      g->nodes[i].Describe() + " reads '" + in + "' before it is produced");
    }
  }
  for (const auto& [name, t] : g->initializers) {
    KILN_FUZZ_CHECK(t.valid(), "initializer '" + name + "' is invalid");
  }
  Result<std::string> digest = GraphDigest(*g);
  if (!digest.ok()) CheckRefusal(digest.status(), "GraphDigest");
  return true;
}

}  // namespace kiln::fuzz
