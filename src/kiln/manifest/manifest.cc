// Parsing and validation of the worker manifest, kiln.toml (see manifest.h). Manifest layer.
//
// toml++ turns the text into a tree; everything after that is a walk that checks each table's keys
// against the fields it may hold and converts each value, so every refusal can name the line, the
// key path, the value found and the value expected.
#include "src/kiln/manifest/manifest.h"

#include <toml++/toml.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <initializer_list>
#include <set>
#include <sstream>
#include <system_error>
#include <utility>

#include "src/kiln/base/file.h"
#include "src/kiln/tensor/memory_budget.h"

namespace kiln {

const char* LanePolicyName(LanePolicy lane) {
  switch (lane) {
    case LanePolicy::kOptional:
      return "optional";
    case LanePolicy::kMandatory:
      return "mandatory";
  }
  return "unknown";
}

namespace {

bool IsAlnum(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

// A TOML bare key: printed unquoted in key paths.
bool IsBareKey(std::string_view k) {
  return !k.empty() &&
         std::all_of(k.begin(), k.end(), [](char c) { return IsAlnum(c) || c == '_' || c == '-'; });
}

// Names of endpoints, targets, model names, family parts: [A-Za-z0-9][A-Za-z0-9._-]*. They appear
// in URLs (/v2/models/<name>), file names and event rows, so nothing else is allowed.
bool IsName(std::string_view s) {
  if (s.empty() || !IsAlnum(s[0])) return false;
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return IsAlnum(c) || c == '_' || c == '-' || c == '.'; });
}
constexpr std::string_view kNameRule = "a name of letters, digits, '.', '_' or '-'";

std::string Join(const std::string& path, std::string_view key) {
  std::string k = IsBareKey(key) ? std::string(key) : "\"" + std::string(key) + "\"";
  return path.empty() ? k : path + "." + k;
}

std::string Index(const std::string& path, size_t i) {
  return path + "[" + std::to_string(i) + "]";
}

std::string Quote(std::string_view s) {
  constexpr size_t kMax = 80;
  if (s.size() > kMax) return "\"" + std::string(s.substr(0, kMax)) + "...\"";
  return "\"" + std::string(s) + "\"";
}

std::string JoinList(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : ", ") + s;
  return out.empty() ? "(none)" : out;
}

// The shortest text that reads back as `v`, with ".0" on whole numbers so a float reads as one.
std::string NumberText(double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  std::string s = ec == std::errc() ? std::string(buf, end) : "?";
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

// What a node is, with its value when it is a scalar: `an integer (42)`, `a string ("x")`.
std::string Describe(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::table:
      return "a table";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::string:
      return "a string (" + Quote(n.as_string()->get()) + ")";
    case toml::node_type::integer:
      return "an integer (" + std::to_string(n.as_integer()->get()) + ")";
    case toml::node_type::floating_point:
      return "a float (" + NumberText(n.as_floating_point()->get()) + ")";
    case toml::node_type::boolean:
      return std::string("a boolean (") + (n.as_boolean()->get() ? "true" : "false") + ")";
    case toml::node_type::date:
      return "a date";
    case toml::node_type::time:
      return "a time";
    case toml::node_type::date_time:
      return "a date-time";
    case toml::node_type::none:
      break;
  }
  return "nothing";
}

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// The closest of `known` to `word` when it is close enough to be a typo; "" otherwise.
std::string Closest(std::string_view word, const std::vector<std::string>& known) {
  std::string best;
  size_t best_d = 3;  // at most two edits
  for (const auto& k : known) {
    const size_t d = EditDistance(word, k);
    if (d < best_d && d < std::max<size_t>(k.size(), 2)) {
      best = k;
      best_d = d;
    }
  }
  return best;
}

// Walks the parsed tree. Every method that refuses returns a Status from Error().
class Parser {
 public:
  Parser(std::string what, std::string base_dir)
      : what_(what.empty() ? "manifest" : std::move(what)), base_dir_(std::move(base_dir)) {}

  Result<Manifest> Run(const toml::table& root);

 private:
  // "<what>:<line>: <message>"; the line is the node's, when known.
  Status Error(const toml::node* at, const std::string& message) const {
    std::string where = what_;
    if (at != nullptr && at->source().begin.line > 0) {
      where += ":" + std::to_string(at->source().begin.line);
    }
    return Status::InvalidArgument(where + ": " + message);
  }

  Status WrongType(const toml::node& n, const std::string& path, std::string_view expect) const {
    return Error(&n, path + " is " + Describe(n) + ", expected " + std::string(expect));
  }

  Status Missing(const toml::table& t, const std::string& path, std::string_view expect) const {
    return Error(&t, path + " is missing, expected " + std::string(expect));
  }

  // Refuses every key of `t` that is not in `known`, naming the closest known key.
  Status CheckKeys(const toml::table& t, const std::string& path,
                   std::initializer_list<std::string_view> known) const {
    std::vector<std::string> names(known.begin(), known.end());
    for (auto&& [key, node] : t) {
      const std::string k(key.str());
      if (std::find(names.begin(), names.end(), k) != names.end()) continue;
      const std::string where = path.empty() ? "at the top level" : "in [" + path + "]";
      const std::string guess = Closest(k, names);
      return Error(&node, Join(path, k) + ": unknown key " + Quote(k) + " " + where +
                              (guess.empty() ? "" : "; did you mean " + Quote(guess) + "?") +
                              " (known keys: " + JoinList(names) + ")");
    }
    return Status::OK();
  }

  // The table at `t[key]`; nullptr when absent.
  Result<const toml::table*> OptTable(const toml::table& t, const std::string& path,
                                      std::string_view key, std::string_view expect) const {
    const toml::node* n = t.get(key);
    if (n == nullptr) return static_cast<const toml::table*>(nullptr);
    if (!n->is_table()) return WrongType(*n, Join(path, key), expect);
    return n->as_table();
  }

  Result<std::optional<std::string>> OptString(const toml::table& t, const std::string& path,
                                               std::string_view key,
                                               std::string_view expect) const {
    const toml::node* n = t.get(key);
    if (n == nullptr) return std::optional<std::string>();
    if (!n->is_string()) {
      return WrongType(*n, Join(path, key), "a string (" + std::string(expect) + ")");
    }
    std::string s = n->as_string()->get();
    if (s.empty()) return Error(n, Join(path, key) + " is empty, expected " + std::string(expect));
    return std::optional<std::string>(std::move(s));
  }

  // A boolean; `fallback` when absent.
  Result<bool> BoolField(const toml::table& t, const std::string& path, std::string_view key,
                         bool fallback) const {
    const toml::node* n = t.get(key);
    if (n == nullptr) return fallback;
    if (!n->is_boolean()) return WrongType(*n, Join(path, key), "true or false");
    return n->as_boolean()->get();
  }

  Result<std::string> ReqString(const toml::table& t, const std::string& path, std::string_view key,
                                std::string_view expect) const {
    KILN_ASSIGN_OR_RETURN(std::optional<std::string> s, OptString(t, path, key, expect));
    if (!s) return Missing(t, Join(path, key), expect);
    return *std::move(s);
  }

  // An integer in [lo, hi]; `fallback` when absent.
  Result<int> IntField(const toml::table& t, const std::string& path, std::string_view key,
                       int fallback, int64_t lo, int64_t hi, std::string_view expect) const {
    const toml::node* n = t.get(key);
    if (n == nullptr) return fallback;
    if (!n->is_integer()) return WrongType(*n, Join(path, key), expect);
    const int64_t v = n->as_integer()->get();
    if (v < lo || v > hi) {
      return Error(
          n, Join(path, key) + " is " + std::to_string(v) + ", expected " + std::string(expect));
    }
    return static_cast<int>(v);
  }

  // A float (an integer is accepted and converted); `fallback` when absent.
  Result<double> NumberField(const toml::table& t, const std::string& path, std::string_view key,
                             double fallback, std::string_view expect) const {
    const toml::node* n = t.get(key);
    if (n == nullptr) return fallback;
    if (n->is_floating_point()) return n->as_floating_point()->get();
    if (n->is_integer()) return static_cast<double>(n->as_integer()->get());
    return WrongType(*n, Join(path, key), expect);
  }

  // An array of non-empty strings; empty when absent.
  Result<std::vector<std::pair<std::string, const toml::node*>>> StringList(
      const toml::table& t, const std::string& path, std::string_view key,
      std::string_view expect) const {
    std::vector<std::pair<std::string, const toml::node*>> out;
    const toml::node* n = t.get(key);
    if (n == nullptr) return out;
    const std::string p = Join(path, key);
    if (!n->is_array()) return WrongType(*n, p, expect);
    const toml::array& arr = *n->as_array();
    for (size_t i = 0; i < arr.size(); ++i) {
      const toml::node& e = arr[i];
      if (!e.is_string()) return WrongType(e, Index(p, i), "a string");
      if (e.as_string()->get().empty())
        return Error(&e, Index(p, i) + " is empty, expected a string");
      out.emplace_back(e.as_string()->get(), &e);
    }
    return out;
  }

  std::string Resolve(const std::string& p) const {
    std::filesystem::path fp(p);
    if (fp.is_absolute() || base_dir_.empty()) return fp.lexically_normal().string();
    return (std::filesystem::path(base_dir_) / fp).lexically_normal().string();
  }

  Result<EndpointSpec> ParseEndpoint(const toml::table& root) const;
  Result<std::optional<HubSpec>> ParseHub(const toml::table& root) const;
  Status ParseTrustKnobs(const toml::table& t, const std::string& p, HubSpec* h) const;
  Result<TargetSpec> ParseTarget(const std::string& name, const toml::table& t,
                                 const std::string& path) const;
  Result<Envelope> ParseEnvelope(const toml::table& t, const std::string& path) const;
  Result<std::vector<std::map<std::string, std::string>>> ParseSamples(
      const toml::table& t, const std::string& path, const Envelope& envelope) const;
  Result<NumericsSpec> ParseNumerics(const toml::table& t, const std::string& path) const;
  Status ParseFunctions(const toml::table& root, Manifest* m) const;
  Result<MintSpec> ParseMint(const toml::table& root) const;

  std::string what_;
  std::string base_dir_;
};

Result<EndpointSpec> Parser::ParseEndpoint(const toml::table& root) const {
  KILN_ASSIGN_OR_RETURN(const toml::table* t,
                        OptTable(root, "", "endpoint", "a table ([endpoint])"));
  if (t == nullptr) return Missing(root, "endpoint", "an [endpoint] table with at least `name`");
  const std::string p = "endpoint";
  KILN_RETURN_IF_ERROR(CheckKeys(
      *t, p, {"name", "release", "port", "max_concurrency", "threads", "request_memory_mb"}));
  EndpointSpec e;
  KILN_ASSIGN_OR_RETURN(e.name, ReqString(*t, p, "name", kNameRule));
  if (!IsName(e.name)) {
    return Error(t->get("name"),
                 "endpoint.name is " + Quote(e.name) + ", expected " + std::string(kNameRule));
  }
  KILN_ASSIGN_OR_RETURN(std::optional<std::string> release,
                        OptString(*t, p, "release", "a non-empty release name"));
  e.release = release.value_or("");
  KILN_ASSIGN_OR_RETURN(e.port, IntField(*t, p, "port", e.port, 0, 65535,
                                         "an integer port in 0..65535 (0 = pick a free port)"));
  KILN_ASSIGN_OR_RETURN(e.max_concurrency, IntField(*t, p, "max_concurrency", e.max_concurrency, 1,
                                                    1 << 16, "an integer >= 1"));
  KILN_ASSIGN_OR_RETURN(
      e.threads, IntField(*t, p, "threads", e.threads, 0, 1 << 16, "an integer >= 0 (0 = auto)"));
  KILN_ASSIGN_OR_RETURN(e.request_memory_mb,
                        IntField(*t, p, "request_memory_mb", e.request_memory_mb, 0, 1 << 30,
                                 "an integer >= 0 (megabytes; 0 = auto)"));
  return e;
}

Result<std::optional<HubSpec>> Parser::ParseHub(const toml::table& root) const {
  KILN_ASSIGN_OR_RETURN(const toml::table* t, OptTable(root, "", "hub", "a table ([hub])"));
  if (t == nullptr) return std::optional<HubSpec>();
  const std::string p = "hub";
  KILN_RETURN_IF_ERROR(CheckKeys(
      *t, p,
      {"url", "token", "token_env", "trust", "timeout_ms", "ca", "insecure_http",
       "revocation_poll_s", "revocation_max_age_s", "revocations_stale", "adopt_retry_max_s"}));
  HubSpec h;
  constexpr std::string_view kUrl = "an http:// or https:// URL";
  KILN_ASSIGN_OR_RETURN(h.url, ReqString(*t, p, "url", kUrl));
  if (h.url.rfind("http://", 0) != 0 && h.url.rfind("https://", 0) != 0) {
    return Error(t->get("url"), "hub.url is " + Quote(h.url) + ", expected " + std::string(kUrl));
  }
  KILN_ASSIGN_OR_RETURN(std::optional<std::string> token,
                        OptString(*t, p, "token", "a non-empty bearer token"));
  KILN_ASSIGN_OR_RETURN(
      std::optional<std::string> token_env,
      OptString(*t, p, "token_env", "the name of an environment variable holding the token"));
  if (token && token_env) {
    return Error(t->get("token_env"),
                 "hub.token and hub.token_env are both set, expected at most one of them");
  }
  if (token) h.token = *token;
  if (token_env) {
    const char* v = std::getenv(token_env->c_str());
    if (v == nullptr || *v == '\0') {
      return Error(t->get("token_env"),
                   "hub.token_env names " + Quote(*token_env) + ", which is " +
                       (v == nullptr ? "not set" : "empty") +
                       " in the environment, expected it to hold the hub's bearer token");
    }
    h.token = v;
    h.token_env = *token_env;
  }
  KILN_ASSIGN_OR_RETURN(auto trust, StringList(*t, p, "trust", "an array of key-file paths"));
  for (auto& [path, node] : trust) h.trust.push_back(Resolve(path));
  KILN_ASSIGN_OR_RETURN(h.timeout_ms, IntField(*t, p, "timeout_ms", h.timeout_ms, 1, 3600000,
                                               "an integer in 1..3600000 (milliseconds)"));
  KILN_RETURN_IF_ERROR(ParseTrustKnobs(*t, p, &h));
  KILN_ASSIGN_OR_RETURN(std::optional<std::string> ca,
                        OptString(*t, p, "ca", "a path to a PEM file of CA certificates"));
  if (ca) {
    if (h.url.rfind("https://", 0) != 0) {
      return Error(t->get("ca"), "hub.ca is set but hub.url " + Quote(h.url) +
                                     " is not https://, expected an https:// URL with a CA file");
    }
    h.ca = Resolve(*ca);
  }
  KILN_ASSIGN_OR_RETURN(h.insecure_http, BoolField(*t, p, "insecure_http", false));
  return std::optional<HubSpec>(std::move(h));
}

// The revocation list and adoption retry knobs of [hub] (docs/manifest.md).
Status Parser::ParseTrustKnobs(const toml::table& t, const std::string& p, HubSpec* h) const {
  KILN_ASSIGN_OR_RETURN(h->revocation_poll_s,
                        IntField(t, p, "revocation_poll_s", h->revocation_poll_s, 1, 3600,
                                 "an integer in 1..3600 (seconds)"));
  KILN_ASSIGN_OR_RETURN(h->revocation_max_age_s,
                        IntField(t, p, "revocation_max_age_s", h->revocation_max_age_s, 0, 86400,
                                 "an integer in 0..86400 (seconds; 0 = the list's own)"));
  KILN_ASSIGN_OR_RETURN(std::optional<std::string> stale,
                        OptString(t, p, "revocations_stale", "\"keep\" or \"eager\""));
  if (stale) {
    if (*stale != "keep" && *stale != "eager") {
      return Error(t.get("revocations_stale"), "hub.revocations_stale is " + Quote(*stale) +
                                                   ", expected \"keep\" or \"eager\"");
    }
    h->revocations_stale = *stale;
  }
  KILN_ASSIGN_OR_RETURN(h->adopt_retry_max_s,
                        IntField(t, p, "adopt_retry_max_s", h->adopt_retry_max_s, 1, 3600,
                                 "an integer in 1..3600 (seconds)"));
  return Status::OK();
}

Result<NumericsSpec> Parser::ParseNumerics(const toml::table& target,
                                           const std::string& tpath) const {
  NumericsSpec n;
  KILN_ASSIGN_OR_RETURN(
      const toml::table* t,
      OptTable(target, tpath, "numerics", "a table { floor = ..., warn = ..., retention = ... }"));
  if (t == nullptr) return n;
  const std::string p = Join(tpath, "numerics");
  KILN_RETURN_IF_ERROR(CheckKeys(*t, p, {"floor", "warn", "retention"}));
  KILN_ASSIGN_OR_RETURN(n.floor, NumberField(*t, p, "floor", n.floor, "a number in (0, 1]"));
  KILN_ASSIGN_OR_RETURN(n.warn, NumberField(*t, p, "warn", n.warn, "a number in (0, 1]"));
  KILN_ASSIGN_OR_RETURN(n.retention,
                        NumberField(*t, p, "retention", n.retention, "a number in (0, 1]"));
  // Written so that NaN fails every check.
  for (auto [key, v] : {std::pair<const char*, double>{"floor", n.floor},
                        {"warn", n.warn},
                        {"retention", n.retention}}) {
    if (!(v > 0.0 && v <= 1.0)) {
      const toml::node* at = t->get(key);
      return Error(at != nullptr ? at : t,
                   Join(p, key) + " is " + NumberText(v) + ", expected a number in (0, 1]");
    }
  }
  if (!(n.floor <= n.warn)) {
    return Error(t, p + ": floor " + NumberText(n.floor) + " is above warn " + NumberText(n.warn) +
                        ", expected 0 < floor <= warn <= 1");
  }
  return n;
}

Result<Envelope> Parser::ParseEnvelope(const toml::table& target, const std::string& tpath) const {
  constexpr std::string_view kExpect =
      "a non-empty array of entries, each mapping graph input names to shapes "
      "(envelope = [{ x = [1, 64] }], or with symbols and their ranges "
      "{ x = [\"batch\", 64], ranges = { batch = [1, 32] } })";
  const std::string p = Join(tpath, "envelope");
  const toml::node* n = target.get("envelope");
  if (n == nullptr) return Missing(target, p, kExpect);
  if (!n->is_array()) return WrongType(*n, p, kExpect);
  const toml::array& arr = *n->as_array();
  if (arr.empty()) return Error(n, p + " is empty, expected " + std::string(kExpect));
  Envelope env;
  // Every entry names the same inputs: those of the first, by path.
  std::vector<std::string> first_names;
  std::vector<std::string> paths_of_classes, paths_of_ranged;
  for (size_t i = 0; i < arr.size(); ++i) {
    const std::string cp = Index(p, i);
    const toml::node& cn = arr[i];
    if (!cn.is_table()) {
      return WrongType(cn, cp, "a table mapping each graph input name to its shape");
    }
    const toml::table& ct = *cn.as_table();
    const toml::node* ranges_node = ct.get("ranges");
    const bool ranged = ranges_node != nullptr && ranges_node->is_table();
    if (ct.empty() || (ranged && ct.size() == 1)) {
      return Error(&cn, cp + " names no input, expected a table mapping each graph input name "
                             "to its shape");
    }
    ShapeClass cls;
    RangedEntry entry;
    std::vector<std::string> names;
    if (ranged) {
      for (auto&& [key, rn] : *ranges_node->as_table()) {
        const std::string rp = Join(Join(cp, "ranges"), std::string(key.str()));
        constexpr std::string_view kRange =
            "an inclusive range [lo, hi] of integers, 0 <= lo <= hi, or [lo, hi, step] "
            "(the values lo, lo + step, ..., hi)";
        const toml::array* ra = rn.as_array();
        std::vector<int64_t> spec;
        for (size_t k = 0; ra != nullptr && k < ra->size(); ++k) {
          if ((*ra)[k].is_integer()) spec.push_back((*ra)[k].as_integer()->get());
        }
        if (ra == nullptr || (ra->size() != 2 && ra->size() != 3) || spec.size() != ra->size()) {
          return WrongType(rn, rp, kRange);
        }
        const int64_t lo = spec[0], hi = spec[1];
        if (lo < 0 || lo > hi) {
          return Error(&rn, rp + " is [" + std::to_string(lo) + ", " + std::to_string(hi) +
                                "], expected " + std::string(kRange));
        }
        const std::string symbol(key.str());
        SetRangeSpec(&entry, symbol, spec);
        if (spec.size() == 3) {
          RangedEntry one;  // the step's own checks, named at this key
          one.inputs["_"] = {DimSpec{0, symbol}};
          SetRangeSpec(&one, symbol, spec);
          if (Status st = CheckRangedEntry(one, rp); !st.ok()) return Error(&rn, st.message());
        }
      }
    }
    for (auto&& [key, dn] : ct) {
      const std::string input(key.str());
      if (ranged && input == "ranges") continue;
      names.push_back(input);
      const std::string ip = Join(cp, input);
      const std::string_view kDims = ranged ? "an array of dims, each an integer >= 0 or a symbol "
                                              "such as \"batch\" given in ranges"
                                            : "an array of dims such as [1, 64]";
      if (!dn.is_array()) return WrongType(dn, ip, kDims);
      const toml::array& dims = *dn.as_array();
      Shape shape;  // the largest shape the entry admits (its symbols at their upper bounds)
      std::vector<DimSpec> specs;
      for (size_t j = 0; j < dims.size(); ++j) {
        const toml::node& d = dims[j];
        if (ranged && d.is_string()) {
          const std::string symbol = d.as_string()->get();
          auto r = entry.ranges.find(symbol);
          if (!IsSymbolName(symbol) || r == entry.ranges.end()) {
            return Error(&d, Index(ip, j) + " is " + Quote(symbol) + ", expected a symbol " +
                                 "[A-Za-z_][A-Za-z0-9_]* given a range in " + Join(cp, "ranges"));
          }
          specs.push_back(DimSpec{0, symbol});
          shape.push_back(r->second.second);
          continue;
        }
        if (!d.is_integer()) {
          return WrongType(d, Index(ip, j),
                           ranged ? "an integer dimension >= 0 or a symbol given in ranges"
                                  : "an integer dimension >= 0 (a symbol needs ranges = { ... })");
        }
        const int64_t v = d.as_integer()->get();
        if (v < 0) {
          return Error(&d, Index(ip, j) + " is " + std::to_string(v) +
                               ", expected an integer dimension >= 0");
        }
        specs.push_back(DimSpec{v, ""});
        shape.push_back(v);
      }
      // An input no request can carry (at most kMaxRequestInputElements elements per input, the
      // largest a ranged entry admits included) is refused here by name, before a mint sizes a
      // probe or a cell plans memory from it; a product past int64 never wraps into a small one.
      const Result<int64_t> count = CheckedNumElements(shape);
      if (!count.ok() || *count > kMaxRequestInputElements) {
        return Error(&dn, ip + (ranged ? " at its ranges' upper bounds" : "") + " is " +
                              ShapeToString(shape) + ", " +
                              (count.ok() ? std::to_string(*count) + " elements"
                                          : std::string("more elements than int64 counts")) +
                              "; expected at most " + std::to_string(kMaxRequestInputElements) +
                              " elements (the most one infer request may carry per input)");
      }
      if (ranged) {
        entry.inputs.emplace(input, std::move(specs));
      } else {
        cls.emplace(input, std::move(shape));
      }
    }
    if (ranged) {
      if (Status ok = CheckRangedEntry(entry, cp); !ok.ok()) return Error(&cn, ok.message());
    }
    if (i == 0) {
      first_names = names;
    } else if (names != first_names) {
      for (const std::string& name : names) {
        if (std::find(first_names.begin(), first_names.end(), name) == first_names.end()) {
          return Error(&cn, cp + " names input " + Quote(name) + ", which " + Index(p, 0) +
                                " does not; expected every entry to name the same graph inputs");
        }
      }
      for (const std::string& name : first_names) {
        if (std::find(names.begin(), names.end(), name) == names.end()) {
          return Error(&cn, cp + " lacks input " + Quote(name) + ", which " + Index(p, 0) +
                                " names; expected every entry to name the same graph inputs");
        }
      }
    }
    // No request may fit two entries: dispatch picks exactly one.
    if (!ranged) {
      for (size_t j = 0; j < env.classes.size(); ++j) {
        if (env.classes[j] == cls) {
          return Error(&cn, cp + " repeats " + paths_of_classes[j] +
                                ", expected each shape class to be declared once");
        }
      }
      for (size_t j = 0; j < env.ranged.size(); ++j) {
        if (MatchRanged(env.ranged[j], cls).fit == RangedFit::kFits) {
          return Error(&cn, cp + " lies inside " + paths_of_ranged[j] + " " +
                                DescribeRanged(env.ranged[j]) +
                                "; expected no request to fit two entries");
        }
      }
      env.classes.push_back(std::move(cls));
      paths_of_classes.push_back(cp);
    } else {
      for (size_t j = 0; j < env.classes.size(); ++j) {
        if (MatchRanged(entry, env.classes[j]).fit == RangedFit::kFits) {
          return Error(&cn, cp + " " + DescribeRanged(entry) + " contains " + paths_of_classes[j] +
                                "; expected no request to fit two entries");
        }
      }
      for (size_t j = 0; j < env.ranged.size(); ++j) {
        if (MayOverlap(env.ranged[j], entry)) {
          return Error(&cn, cp + " " + DescribeRanged(entry) + " may admit the requests " +
                                paths_of_ranged[j] + " " + DescribeRanged(env.ranged[j]) +
                                " admits (their dims' ranges meet); expected no request to fit "
                                "two entries");
        }
      }
      env.ranged.push_back(std::move(entry));
      paths_of_ranged.push_back(cp);
    }
  }
  return env;
}

Result<std::vector<std::map<std::string, std::string>>> Parser::ParseSamples(
    const toml::table& target, const std::string& tpath, const Envelope& envelope) const {
  constexpr std::string_view kExpect =
      "an array of samples, each mapping every graph input name to a .npy file "
      "(samples = [{ x = \"samples/x.npy\" }])";
  std::vector<std::map<std::string, std::string>> out;
  const toml::node* n = target.get("samples");
  if (n == nullptr) return out;
  const std::string p = Join(tpath, "samples");
  if (!n->is_array()) return WrongType(*n, p, kExpect);
  const toml::array& arr = *n->as_array();
  for (size_t i = 0; i < arr.size(); ++i) {
    const std::string sp = Index(p, i);
    const toml::node& sn = arr[i];
    if (!sn.is_table())
      return WrongType(sn, sp, "a table mapping each graph input name to a .npy file");
    std::map<std::string, std::string> sample;
    for (auto&& [key, fn] : *sn.as_table()) {
      const std::string input(key.str());
      const std::string ip = Join(sp, input);
      if (!fn.is_string() || fn.as_string()->get().empty()) {
        return WrongType(fn, ip, "a string (a path to a .npy file)");
      }
      sample.emplace(input, Resolve(fn.as_string()->get()));
    }
    // The names are checked against the graph at boot; here against the envelope's classes,
    // which name every graph input.
    std::set<std::string> first;
    if (!envelope.classes.empty()) {
      for (const auto& [input, shape] : envelope.classes[0]) first.insert(input);
    } else {
      for (const auto& [input, dims] : envelope.ranged.at(0).inputs) first.insert(input);
    }
    for (const auto& [input, path] : sample) {
      if (!first.count(input)) {
        return Error(&sn, sp + " names input " + Quote(input) +
                              ", which the envelope does not; expected every graph input of " +
                              Index(Join(tpath, "envelope"), 0));
      }
    }
    for (const std::string& input : first) {
      if (!sample.count(input)) {
        return Error(&sn, sp + " lacks input " + Quote(input) +
                              ", expected a .npy file for every graph input the envelope names");
      }
    }
    out.push_back(std::move(sample));
  }
  return out;
}

Result<TargetSpec> Parser::ParseTarget(const std::string& name, const toml::table& t,
                                       const std::string& p) const {
  KILN_RETURN_IF_ERROR(CheckKeys(t, p,
                                 {"graph", "checkpoint", "lane", "export", "envelope", "numerics",
                                  "sm", "samples", "eager_only", "coverage"}));
  TargetSpec spec;
  spec.name = name;
  KILN_ASSIGN_OR_RETURN(spec.graph, ReqString(t, p, "graph", "a path to the target's .onnx file"));
  spec.graph = Resolve(spec.graph);
  KILN_ASSIGN_OR_RETURN(std::optional<std::string> ckpt,
                        OptString(t, p, "checkpoint", "a path to a .safetensors file"));
  if (ckpt) spec.checkpoint = Resolve(*ckpt);

  constexpr std::string_view kLane = "\"optional\" or \"mandatory\"";
  KILN_ASSIGN_OR_RETURN(std::optional<std::string> lane, OptString(t, p, "lane", kLane));
  if (lane) {
    if (*lane == "optional") {
      spec.lane = LanePolicy::kOptional;
    } else if (*lane == "mandatory") {
      spec.lane = LanePolicy::kMandatory;
    } else {
      return Error(t.get("lane"),
                   Join(p, "lane") + " is " + Quote(*lane) + ", expected " + std::string(kLane));
    }
  }

  KILN_ASSIGN_OR_RETURN(const toml::table* ex,
                        OptTable(t, p, "export", "a table { family = \"<owner>/<name>\" }"));
  if (ex != nullptr) {
    const std::string ep = Join(p, "export");
    KILN_RETURN_IF_ERROR(CheckKeys(*ex, ep, {"family"}));
    constexpr std::string_view kFamily = "a family \"<owner>/<name>\" such as \"root/mlp\"";
    KILN_ASSIGN_OR_RETURN(std::string family, ReqString(*ex, ep, "family", kFamily));
    const size_t slash = family.find('/');
    if (slash == std::string::npos || !IsName(std::string_view(family).substr(0, slash)) ||
        !IsName(std::string_view(family).substr(slash + 1))) {
      return Error(ex->get("family"), Join(ep, "family") + " is " + Quote(family) + ", expected " +
                                          std::string(kFamily) + " (each part " +
                                          std::string(kNameRule) + ")");
    }
    spec.export_spec = ExportSpec{std::move(family)};
  }

  KILN_ASSIGN_OR_RETURN(spec.envelope, ParseEnvelope(t, p));
  KILN_ASSIGN_OR_RETURN(spec.samples, ParseSamples(t, p, spec.envelope));
  KILN_ASSIGN_OR_RETURN(spec.numerics, ParseNumerics(t, p));

  const auto& levels = KnownSmLevels();
  const std::string sm_expect = "one of " + JoinList(levels);
  KILN_ASSIGN_OR_RETURN(std::optional<std::string> sm, OptString(t, p, "sm", sm_expect));
  if (sm) {
    if (std::find(levels.begin(), levels.end(), *sm) == levels.end()) {
      return Error(t.get("sm"), Join(p, "sm") + " is " + Quote(*sm) + ", expected " + sm_expect);
    }
    spec.sm = *sm;
  }
  KILN_ASSIGN_OR_RETURN(spec.eager_only, BoolField(t, p, "eager_only", false));
  constexpr std::string_view kCoverage = "\"full\" or \"partial\"";
  KILN_ASSIGN_OR_RETURN(std::optional<std::string> coverage,
                        OptString(t, p, "coverage", kCoverage));
  if (coverage) {
    if (*coverage != "full" && *coverage != "partial") {
      return Error(t.get("coverage"), Join(p, "coverage") + " is " + Quote(*coverage) +
                                          ", expected " + std::string(kCoverage));
    }
    spec.coverage = *coverage;
  }
  return spec;
}

Status Parser::ParseFunctions(const toml::table& root, Manifest* m) const {
  KILN_ASSIGN_OR_RETURN(
      const toml::table* fns,
      OptTable(root, "", "functions", "a table of functions ([functions.<model name>])"));
  if (fns == nullptr) return Status::OK();
  std::vector<std::string> target_names;
  for (const auto& t : m->targets) target_names.push_back(t.name);

  // Who holds each name already, for collision messages: "the model name of functions.a".
  std::map<std::string, std::string> owner;
  for (auto&& [key, node] : *fns) {
    const std::string name(key.str());
    const std::string p = Join("functions", name);
    if (!IsName(name)) {
      return Error(&node, p + ": model name " + Quote(name) + " is not " + std::string(kNameRule));
    }
    if (!node.is_table()) {
      return WrongType(node, p, "a table { target = \"<target name>\", aliases = [...] }");
    }
    owner[name] = "the model name of " + p;
  }
  for (auto&& [key, node] : *fns) {
    const std::string name(key.str());
    const std::string p = Join("functions", name);
    const toml::table& t = *node.as_table();
    KILN_RETURN_IF_ERROR(CheckKeys(t, p, {"target", "aliases"}));
    FunctionSpec f;
    f.name = name;
    const std::string target_expect =
        "the name of a declared target (" + JoinList(target_names) + ")";
    KILN_ASSIGN_OR_RETURN(f.target, ReqString(t, p, "target", target_expect));
    if (std::find(target_names.begin(), target_names.end(), f.target) == target_names.end()) {
      const std::string guess = Closest(f.target, target_names);
      return Error(t.get("target"),
                   Join(p, "target") + " is " + Quote(f.target) + ", which names no target" +
                       (guess.empty() ? "" : " (did you mean " + Quote(guess) + "?)") +
                       "; expected " + target_expect);
    }
    KILN_ASSIGN_OR_RETURN(auto aliases,
                          StringList(t, p, "aliases", "an array of model-name strings"));
    for (size_t i = 0; i < aliases.size(); ++i) {
      const auto& [alias, at] = aliases[i];
      const std::string ap = Index(Join(p, "aliases"), i);
      if (!IsName(alias)) {
        return Error(at, ap + " is " + Quote(alias) + ", expected " + std::string(kNameRule));
      }
      auto [it, inserted] = owner.emplace(alias, "an alias in " + ap);
      if (!inserted) {
        return Error(at, ap + " is " + Quote(alias) + ", which is already " + it->second +
                             "; expected model names and aliases to be unique");
      }
      f.aliases.push_back(alias);
    }
    m->function_to_target[f.name] = f.target;
    for (const auto& a : f.aliases) m->function_to_target[a] = f.target;
    m->functions.push_back(std::move(f));
  }
  std::sort(m->functions.begin(), m->functions.end(),
            [](const FunctionSpec& a, const FunctionSpec& b) { return a.name < b.name; });
  return Status::OK();
}

Result<MintSpec> Parser::ParseMint(const toml::table& root) const {
  MintSpec s;
  KILN_ASSIGN_OR_RETURN(const toml::table* t, OptTable(root, "", "mint", "a table ([mint])"));
  if (t == nullptr) return s;
  const std::string p = "mint";
  KILN_RETURN_IF_ERROR(
      CheckKeys(*t, p, {"stall_window_s", "memory_budget_mb", "parallel_compiles", "remints"}));
  KILN_ASSIGN_OR_RETURN(s.stall_window_s, IntField(*t, p, "stall_window_s", s.stall_window_s, 1,
                                                   86400, "an integer in 1..86400 (seconds)"));
  KILN_ASSIGN_OR_RETURN(s.memory_budget_mb,
                        IntField(*t, p, "memory_budget_mb", s.memory_budget_mb, 0, 1 << 30,
                                 "an integer >= 0 (megabytes; 0 = auto)"));
  KILN_ASSIGN_OR_RETURN(
      s.parallel_compiles,
      IntField(*t, p, "parallel_compiles", s.parallel_compiles, 1, 1024, "an integer in 1..1024"));
  KILN_ASSIGN_OR_RETURN(s.remints,
                        IntField(*t, p, "remints", s.remints, 0, 100, "an integer in 0..100"));
  return s;
}

Result<Manifest> Parser::Run(const toml::table& root) {
  KILN_RETURN_IF_ERROR(CheckKeys(root, "", {"endpoint", "hub", "targets", "functions", "mint"}));
  Manifest m;
  m.source = what_;
  m.base_dir = base_dir_;
  KILN_ASSIGN_OR_RETURN(m.endpoint, ParseEndpoint(root));
  KILN_ASSIGN_OR_RETURN(m.hub, ParseHub(root));

  constexpr std::string_view kTargets =
      "a table of targets ([targets.<name>] with graph, envelope)";
  KILN_ASSIGN_OR_RETURN(const toml::table* targets, OptTable(root, "", "targets", kTargets));
  if (targets == nullptr || targets->empty()) {
    return Error(targets != nullptr ? static_cast<const toml::node*>(targets) : &root,
                 "targets " + std::string(targets == nullptr ? "is missing" : "is empty") +
                     ", expected at least one [targets.<name>] table");
  }
  // toml++ iterates a table in key order, so targets come out sorted by name.
  for (auto&& [key, node] : *targets) {
    const std::string name(key.str());
    const std::string p = Join("targets", name);
    if (!IsName(name)) {
      return Error(&node, p + ": target name " + Quote(name) + " is not " + std::string(kNameRule));
    }
    if (!node.is_table()) return WrongType(node, p, "a table ([" + p + "])");
    KILN_ASSIGN_OR_RETURN(TargetSpec spec, ParseTarget(name, *node.as_table(), p));
    m.targets.push_back(std::move(spec));
  }
  std::sort(m.targets.begin(), m.targets.end(),
            [](const TargetSpec& a, const TargetSpec& b) { return a.name < b.name; });

  KILN_RETURN_IF_ERROR(ParseFunctions(root, &m));
  KILN_ASSIGN_OR_RETURN(m.mint, ParseMint(root));
  return m;
}

}  // namespace

Result<const TargetSpec*> Manifest::FindTarget(const std::string& name) const {
  std::vector<std::string> known;
  for (const auto& t : targets) {
    if (t.name == name) return &t;
    known.push_back(t.name);
  }
  return Status::NotFound(source + ": no target named " + Quote(name) +
                          "; known targets: " + JoinList(known));
}

Result<const TargetSpec*> Manifest::FindTargetForFunction(const std::string& model) const {
  auto it = function_to_target.find(model);
  if (it == function_to_target.end()) {
    std::vector<std::string> known;
    for (const auto& [name, target] : function_to_target) known.push_back(name);
    return Status::NotFound(source + ": no model named " + Quote(model) +
                            "; known model names: " + JoinList(known));
  }
  return FindTarget(it->second);
}

Result<Manifest> ParseManifest(std::string_view toml_text, const std::string& what,
                               const std::string& base_dir) {
  // toml++ reports syntax errors by exception (Debian's library is built with them); nothing
  // thrown leaves this function.
  try {
    toml::table root = toml::parse(toml_text, what);
    Parser parser(what, base_dir);
    return parser.Run(root);
  } catch (const toml::parse_error& e) {
    const auto& pos = e.source().begin;
    return Status::InvalidArgument((what.empty() ? std::string("manifest") : what) + ":" +
                                   std::to_string(pos.line) + ":" + std::to_string(pos.column) +
                                   ": not valid TOML: " + std::string(e.description()));
  } catch (const std::exception& e) {
    return Status::Internal((what.empty() ? std::string("manifest") : what) +
                            ": parsing the manifest failed: " + e.what());
  }
}

Result<Manifest> LoadManifest(const std::string& path) { return LoadManifest(path, ""); }

Result<Manifest> LoadManifest(const std::string& path, const std::string& base_dir) {
  KILN_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  if (!base_dir.empty()) return ParseManifest(text, path, base_dir);
  std::error_code ec;
  std::filesystem::path abs = std::filesystem::absolute(path, ec);
  if (ec) abs = std::filesystem::path(path);
  std::string dir = abs.parent_path().lexically_normal().string();
  if (dir.empty()) dir = ".";
  return ParseManifest(text, path, dir);
}

Result<std::string> ManifestWithHub(std::string_view toml_text, const std::string& what,
                                    const std::string& url, const std::string& token) {
  try {
    toml::table root = toml::parse(toml_text, what);
    if (toml::table* hub = root["hub"].as_table()) {
      hub->erase("token");
      hub->erase("token_env");
      if (!url.empty()) {
        hub->insert_or_assign("url", url);
        hub->erase("ca");
        if (!token.empty()) hub->insert_or_assign("token", token);
      }
    }
    std::ostringstream out;
    out << root << "\n";
    return out.str();
  } catch (const toml::parse_error& e) {
    return Status::InvalidArgument((what.empty() ? std::string("manifest") : what) +
                                   ": not valid TOML: " + std::string(e.description()));
  } catch (const std::exception& e) {
    return Status::Internal((what.empty() ? std::string("manifest") : what) +
                            ": rewriting the manifest failed: " + e.what());
  }
}

}  // namespace kiln
