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

bool IsWellFormedFamily(const std::string& family) {
  const size_t slash = family.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 >= family.size()) return false;
  if (family.size() > 200) return false;
  for (char c : family) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
                    c == '-' || c == '/';
    if (!ok) return false;
  }
  return family.find("//") == std::string::npos && family.find("..") == std::string::npos &&
         family.back() != '/';
}

Status CheckFamilyWrite(const Principal& p, const std::string& family) {
  if (!IsWellFormedFamily(family)) {
    return Status::InvalidArgument("family '" + family +
                                   "' is not '<namespace>/<name>' in lowercase [a-z0-9._-]");
  }
  const std::string ns = family.substr(0, family.find('/'));
  if (p.role == "admin" || p.tier == "platform") return Status::OK();
  if (p.tier == "org") {
    if (ns == "root") {
      return Status::InvalidArgument("publisher '" + p.name + "' (tier org '" + p.org +
                                     "') may not write platform family '" + family + "'");
    }
    if (ns != p.org) {
      return Status::InvalidArgument("publisher '" + p.name + "' (tier org '" + p.org +
                                     "') may write only families '" + p.org + "/…', not '" +
                                     family + "'");
    }
    return Status::OK();
  }
  return Status::InvalidArgument("principal '" + p.name + "' with role '" + p.role +
                                 "' has no publisher tier and may not write '" + family + "'");
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
    TokenRow row{get("sha256"), get("name"), get("role"), get("tier"), get("org")};
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
