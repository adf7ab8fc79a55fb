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

nlohmann::json RangedToJson(const RangedEntry& r) {
  nlohmann::json inputs = nlohmann::json::object();
  for (const auto& [name, dims] : r.inputs) {
    nlohmann::json d = nlohmann::json::array();
    for (const DimSpec& s : dims) {
      if (s.symbol.empty()) {
        d.push_back(s.size);
      } else {
        d.push_back(s.symbol);
      }
    }
    inputs[name] = std::move(d);
  }
  nlohmann::json ranges = nlohmann::json::object();
  // [lo, hi], or [lo, hi, step]: an entry without steps hashes as it did before steps existed.
  for (const auto& [symbol, range] : r.ranges) ranges[symbol] = RangeSpec(r, symbol);
  return nlohmann::json{{"inputs", std::move(inputs)}, {"ranges", std::move(ranges)}};
}

Result<RangedEntry> RangedFromJson(const nlohmann::json& j) {
  if (!j.is_object() || j.size() != 2 || !j.contains("inputs") || !j.contains("ranges") ||
      !j["inputs"].is_object() || !j["ranges"].is_object()) {
    return Status::InvalidArgument(
        "envelope ranged entry must be an object with exactly 'inputs' and 'ranges' objects");
  }
  RangedEntry r;
  for (auto it = j["inputs"].begin(); it != j["inputs"].end(); ++it) {
    if (!it.value().is_array()) {
      return Status::InvalidArgument("envelope ranged input '" + it.key() + "' is not an array");
    }
    std::vector<DimSpec> dims;
    for (const auto& d : it.value()) {
      if (d.is_string()) {
        dims.push_back(DimSpec{0, d.get<std::string>()});
      } else if (d.is_number_integer()) {
        dims.push_back(DimSpec{d.get<int64_t>(), ""});
      } else {
        return Status::InvalidArgument("envelope ranged input '" + it.key() +
                                       "' has a dim that is neither an integer nor a symbol");
      }
    }
    r.inputs[it.key()] = std::move(dims);
  }
  for (auto it = j["ranges"].begin(); it != j["ranges"].end(); ++it) {
    const auto& v = it.value();
    std::vector<int64_t> spec;
    for (const auto& x : v.is_array() ? v : nlohmann::json::array()) {
      if (x.is_number_integer()) spec.push_back(x.get<int64_t>());
    }
    if (!v.is_array() || spec.size() != v.size() || !SetRangeSpec(&r, it.key(), spec)) {
      return Status::InvalidArgument("envelope range of '" + it.key() +
                                     "' is not [lo, hi] or [lo, hi, step] integers");
    }
  }
  return r;
}

Result<nlohmann::json> EnvelopeFacts(const Envelope& envelope) {
  if (envelope.classes.empty() && envelope.ranged.empty()) {
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
  nlohmann::json facts{{"classes", classes}};
  // Ranged entries are keyed by their ranges, never by a value a request gives. Written only when
  // there is one, so an envelope of classes keys as it always did.
  if (!envelope.ranged.empty()) {
    std::vector<std::pair<std::string, nlohmann::json>> ranged;
    for (size_t i = 0; i < envelope.ranged.size(); ++i) {
      KILN_RETURN_IF_ERROR(
          CheckRangedEntry(envelope.ranged[i], "envelope ranged entry " + std::to_string(i)));
      nlohmann::json j = RangedToJson(envelope.ranged[i]);
      KILN_ASSIGN_OR_RETURN(std::string text, CanonicalJson(j));
      if (!seen.insert(text).second) {
        return Status::InvalidArgument("envelope ranged entry " + std::to_string(i) + " " + text +
                                       " is declared twice");
      }
      ranged.emplace_back(text, std::move(j));
    }
    std::sort(ranged.begin(), ranged.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    nlohmann::json list = nlohmann::json::array();
    for (auto& [text, j] : ranged) list.push_back(std::move(j));
    facts["ranged"] = std::move(list);
  }
  return facts;
}

Result<Envelope> EnvelopeFromFacts(const nlohmann::json& facts) {
  if (!facts.is_object() || !facts.contains("classes") || !facts["classes"].is_array()) {
    return Status::InvalidArgument("envelope facts must be an object with a 'classes' array");
  }
  Envelope env;
  if (facts.contains("ranged")) {
    if (!facts["ranged"].is_array() || facts["ranged"].empty()) {
      return Status::InvalidArgument("envelope facts' 'ranged' must be a non-empty array");
    }
    for (const auto& r : facts["ranged"]) {
      KILN_ASSIGN_OR_RETURN(RangedEntry entry, RangedFromJson(r));
      env.ranged.push_back(std::move(entry));
    }
  }
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
