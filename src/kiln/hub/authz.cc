// Authorization at the hub: bearer parsing, roles, family rules, tokens file (hub layer).
#include "src/kiln/hub/authz.h"

#include <openssl/rand.h>

#include <algorithm>

#include "src/kiln/base/canonical_json.h"
#include "src/kiln/hub/receipt.h"

namespace kiln {

std::string BearerToken(const std::string& header) {
  constexpr std::string_view kPrefix = "Bearer ";
  if (header.size() <= kPrefix.size() || header.compare(0, kPrefix.size(), kPrefix) != 0) {
    return "";
  }
  std::string token = header.substr(kPrefix.size());
  while (!token.empty() && token.back() == ' ') token.pop_back();
  return token;
}

bool HasRole(const Principal& p, std::initializer_list<const char*> roles) {
  if (p.role == "admin") return true;
  return std::any_of(roles.begin(), roles.end(), [&](const char* r) { return p.role == r; });
}

bool MayRead(const Principal& p, const std::string& family) {
  if (p.role == "admin") return true;
  if (p.role == "publisher" && p.tier == "platform") return true;
  if (p.org.empty()) return p.role == "worker";
  const std::string ns = family.substr(0, family.find('/'));
  return ns == p.org || ns == "root";
}

bool HoldsRelease(const Principal& p, const std::string& release) {
  if (p.role == "admin") return true;
  return std::any_of(p.releases.begin(), p.releases.end(),
                     [&](const std::string& r) { return r == "*" || r == release; });
}

Status CheckFamilyWrite(const Principal& p, const std::string& family) {
  if (p.role == "admin") {
    if (!IsWellFormedFamily(family)) return CheckTierWrites(p.name, "platform", "", family);
    return Status::OK();
  }
  if (p.role != "publisher") {
    return Status::InvalidArgument("principal '" + p.name + "' with role '" + p.role +
                                   "' has no publisher tier and may not write '" + family + "'");
  }
  return CheckTierWrites(p.name, p.tier, p.org, family);
}

Result<std::vector<TokenRow>> ParseTokensFile(const std::string& text, const std::string& what) {
  KILN_ASSIGN_OR_RETURN(nlohmann::json j, ParseJson(text, what));
  if (!j.is_object() || !j.contains("tokens") || !j["tokens"].is_array()) {
    return Status::InvalidArgument(what + ": expected {\"tokens\":[…]}");
  }
  std::vector<TokenRow> rows;
  for (size_t i = 0; i < j["tokens"].size(); ++i) {
    const auto& t = j["tokens"][i];
    const std::string where = what + ": tokens[" + std::to_string(i) + "]";
    if (!t.is_object()) return Status::InvalidArgument(where + ": not an object");
    auto get = [&](const char* name) {
      auto it = t.find(name);
      return it != t.end() && it->is_string() ? it->get<std::string>() : std::string();
    };
    TokenRow row{get("sha256"), get("name"), get("role"), get("tier"), get("org"), {}};
    for (const auto& [field, _] : t.items()) {
      static const char* kKnown[] = {"sha256", "name",     "role",       "tier",
                                     "org",    "releases", "quota_bytes"};
      if (std::none_of(std::begin(kKnown), std::end(kKnown),
                       [&f = field](const char* k) { return f == k; })) {
        return Status::InvalidArgument(where + ": unknown field '" + field + "'");
      }
    }
    if (auto it = t.find("releases"); it != t.end()) {
      if (!it->is_array()) {
        return Status::InvalidArgument(where + ": releases must be an array of release names");
      }
      for (const auto& r : *it) {
        if (!r.is_string() || r.get<std::string>().empty() ||
            r.get<std::string>().find('\n') != std::string::npos) {
          return Status::InvalidArgument(where +
                                         ": releases holds a value that is not a non-empty "
                                         "one-line string");
        }
        row.releases.push_back(r.get<std::string>());
      }
    }
    if (auto it = t.find("quota_bytes"); it != t.end()) {
      if (!it->is_number_integer() || it->get<int64_t>() < 0) {
        return Status::InvalidArgument(where +
                                       ": quota_bytes must be a non-negative integer (0: no "
                                       "limit)");
      }
      row.quota_bytes = it->get<int64_t>();
    }
    if (row.token_sha256.size() != 64 ||
        !std::all_of(row.token_sha256.begin(), row.token_sha256.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); })) {
      return Status::InvalidArgument(where +
                                     ": sha256 must be 64 lowercase hex (the token's "
                                     "SHA-256; the token itself is never stored)");
    }
    if (row.name.empty()) return Status::InvalidArgument(where + ": name is empty");
    if (row.role != "publisher" && row.role != "worker" && row.role != "admin") {
      return Status::InvalidArgument(where + ": role '" + row.role +
                                     "' is not publisher, worker or admin");
    }
    if (row.role == "publisher" && row.tier != "platform" && row.tier != "org") {
      return Status::InvalidArgument(where + ": publisher tier '" + row.tier +
                                     "' is not platform or org");
    }
    if (row.tier == "org" &&
        (row.org.empty() || row.org == "root" || !IsWellFormedFamily(row.org + "/x"))) {
      return Status::InvalidArgument(
          where + ": tier org needs an org name other than 'root', got '" + row.org + "'");
    }
    if (row.role == "publisher" && row.tier == "platform" && !row.org.empty()) {
      return Status::InvalidArgument(where + ": a platform publisher has no org, got '" + row.org +
                                     "'");
    }
    if (row.role == "worker" && !row.org.empty() &&
        (row.org == "root" || !IsWellFormedFamily(row.org + "/x"))) {
      return Status::InvalidArgument(where + ": a worker's org scopes its reads to '<org>/…'; '" +
                                     row.org + "' is not an org name");
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

std::string TokensFileText(const std::vector<TokenRow>& rows) {
  nlohmann::json tokens = nlohmann::json::array();
  for (const auto& r : rows) {
    nlohmann::json t{{"name", r.name}, {"role", r.role}, {"sha256", r.token_sha256}};
    if (!r.tier.empty()) t["tier"] = r.tier;
    if (!r.org.empty()) t["org"] = r.org;
    if (!r.releases.empty()) t["releases"] = r.releases;
    if (r.quota_bytes >= 0) t["quota_bytes"] = r.quota_bytes;
    tokens.push_back(t);
  }
  return nlohmann::json{{"tokens", tokens}}.dump(2) + "\n";
}

Result<std::string> GenerateToken() {
  std::string bytes(32, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(bytes.data()), 32) != 1) {
    return Status::Internal("token generation: RAND_bytes failed");
  }
  return "kiln_" + Base64UrlEncode(bytes);
}

}  // namespace kiln
