// The cell key (see key.h).
#include "src/kiln/cell/key.h"

#include <algorithm>
#include <set>

#include "src/kiln/base/canonical_json.h"
#include "src/kiln/base/sha256.h"
#include "src/kiln/graph/digest.h"
#include "src/kiln/identity/toolchain.h"

namespace kiln {

namespace {

bool IsHex(const std::string& s, size_t n) {
  return s.size() == n && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

}  // namespace

Result<nlohmann::json> EnvelopeFacts(const Envelope& envelope) {
  if (envelope.classes.empty()) {
    return Status::InvalidArgument("envelope has no shape classes; declare at least one");
  }
  std::vector<std::string> canon;
  std::set<std::string> seen;
  nlohmann::json classes = nlohmann::json::array();
  std::vector<std::pair<std::string, nlohmann::json>> sorted;
  for (size_t i = 0; i < envelope.classes.size(); ++i) {
    // An empty class is the one class of a graph with no runtime inputs (a second one would be
    // declared twice, refused below).
    const ShapeClass& c = envelope.classes[i];
    nlohmann::json j = nlohmann::json::object();
    for (const auto& [input, shape] : c) {
      for (int64_t d : shape) {
        if (d < 0) {
          return Status::InvalidArgument("envelope class " + std::to_string(i) + " input '" +
                                         input + "' has negative dim in " + ShapeToString(shape));
        }
      }
      j[input] = shape;
    }
    KILN_ASSIGN_OR_RETURN(std::string text, CanonicalJson(j));
    if (!seen.insert(text).second) {
      return Status::InvalidArgument("envelope class " + std::to_string(i) + " " + text +
                                     " is declared twice");
    }
    sorted.emplace_back(text, j);
  }
  std::sort(sorted.begin(), sorted.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [text, j] : sorted) classes.push_back(std::move(j));
  return nlohmann::json{{"classes", classes}};
}

Result<Envelope> EnvelopeFromFacts(const nlohmann::json& facts) {
  if (!facts.is_object() || !facts.contains("classes") || !facts["classes"].is_array()) {
    return Status::InvalidArgument("envelope facts must be an object with a 'classes' array");
  }
  Envelope env;
  for (const auto& c : facts["classes"]) {
    if (!c.is_object()) return Status::InvalidArgument("envelope class is not an object");
    ShapeClass sc;
    for (auto it = c.begin(); it != c.end(); ++it) {
      if (!it.value().is_array()) {
        return Status::InvalidArgument("envelope class input '" + it.key() +
                                       "' is not an array of dims");
      }
      Shape s;
      for (const auto& d : it.value()) {
        if (!d.is_number_integer() || d.get<int64_t>() < 0) {
          return Status::InvalidArgument("envelope class input '" + it.key() +
                                         "' has a dim that is not a non-negative integer");
        }
        s.push_back(d.get<int64_t>());
      }
      sc[it.key()] = s;
    }
    env.classes.push_back(std::move(sc));
  }
  KILN_RETURN_IF_ERROR(EnvelopeFacts(env).status());  // same refusals as at mint
  return env;
}

Result<std::string> KeyFromAxes(const KeyAxes& axes) {
  if (!IsHex(axes.graph, 16)) {
    return Status::InvalidArgument("key axis 'graph' is '" + axes.graph +
                                   "', expected 16 lowercase hex");
  }
  if (!IsHex(axes.envelope, 16)) {
    return Status::InvalidArgument("key axis 'envelope' is '" + axes.envelope +
                                   "', expected 16 lowercase hex");
  }
  if (!IsHex(axes.toolchain, 16)) {
    return Status::InvalidArgument("key axis 'toolchain' is '" + axes.toolchain +
                                   "', expected 16 lowercase hex");
  }
  const auto& levels = KnownSmLevels();
  if (std::find(levels.begin(), levels.end(), axes.sm) == levels.end()) {
    return Status::InvalidArgument("key axis 'sm' is '" + axes.sm +
                                   "', expected one of x86-64, x86-64-v2, x86-64-v3, x86-64-v4");
  }
  const nlohmann::json j = {{"graph", axes.graph},
                            {"envelope", axes.envelope},
                            {"sm", axes.sm},
                            {"toolchain", axes.toolchain}};
  KILN_ASSIGN_OR_RETURN(std::string canon, CanonicalJson(j));
  return "ck1-" + Sha256Hex(canon).substr(0, 56);
}

Result<KeyAxes> DeriveKeyAxes(const Graph& graph, const Envelope& envelope, const std::string& sm) {
  KeyAxes axes;
  KILN_ASSIGN_OR_RETURN(axes.graph, GraphDigest(graph));
  KILN_ASSIGN_OR_RETURN(nlohmann::json env, EnvelopeFacts(envelope));
  KILN_ASSIGN_OR_RETURN(axes.envelope, FactsDigest(env));
  axes.sm = SmOrDefault(sm);
  KILN_ASSIGN_OR_RETURN(Toolchain tc, LocalToolchain());
  KILN_ASSIGN_OR_RETURN(axes.toolchain, tc.Digest());
  return axes;
}

bool IsWellFormedKey(const std::string& key) {
  return key.size() == 60 && key.rfind("ck1-", 0) == 0 && IsHex(key.substr(4), 56);
}

}  // namespace kiln
