// Authorization at the hub: bearer parsing, roles, family rules, tokens file (hub layer).
#include "src/kiln/hub/authz.h"

#include <openssl/rand.h>

#include <algorithm>

#include "src/kiln/base/canonical_json.h"
#include "src/kiln/receipt/receipt.h"

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
  if (p.role == "admin" || p.tier == "platform") return true;
  if (p.org.empty()) return p.role == "worker";
  const std::string ns = family.substr(0, family.find('/'));
  return ns == p.org || ns == "root";
}

bool HoldsRelease(const Principal& p, const std::string& release) {
  if (p.role == "admin") return true;
  return std::any_of(p.releases.begin(), p.releases.end(),
                     [&](const std::string& r) { return r == "*" || r == release; });
}

const char* ActionName(Action action) {
  switch (action) {
    case Action::kPublish:
      return "publish cells";
    case Action::kReportEvents:
      return "post events";
    case Action::kSettle:
      return "settle obligations";
    case Action::kReportDamage:
      return "report blob damage";
    case Action::kRevokeCells:
      return "revoke cells";
    case Action::kRevokeTokens:
      return "revoke tokens";
    case Action::kManageKeys:
      return "manage signing keys";
    case Action::kDeclareRelease:
      return "declare releases";
    case Action::kOrderCells:
      return "order which cell a fleet serves";
  }
  return "?";
}

Status Authorize(const Principal& p, Action action) {
  if (p.role == "admin") return Status::OK();
  bool allowed = false;
  switch (action) {
    case Action::kPublish:
      // A worker publishes only with a write tier: org-scoped, or granted platform.
      allowed =
          p.role == "publisher" || (p.role == "worker" && (!p.tier.empty() || !p.families.empty()));
      break;
    case Action::kReportEvents:
    case Action::kSettle:
      allowed = p.role == "worker";
      break;
    case Action::kReportDamage:
      allowed = p.role == "worker" || p.role == "publisher";
      break;
    case Action::kRevokeCells:
    case Action::kRevokeTokens:
    case Action::kManageKeys:
    case Action::kDeclareRelease:
    case Action::kOrderCells:
      allowed = false;
      break;
  }
  if (allowed) return Status::OK();
  std::string why;
  if (action == Action::kPublish && p.role == "worker") {
    why =
        " (an unscoped worker token has no org to publish into; give its row an org, tier "
        "platform, or the platform families it may write)";
  }
  return Status::Refused(
      StatusCode::kInvalidArgument, kRefusalForbidden,
      "principal '" + p.name + "' with role '" + p.role + "' may not " + ActionName(action) + why);
}

namespace {

bool Lists(const std::vector<std::string>& families, const std::string& family) {
  return std::find(families.begin(), families.end(), family) != families.end();
}

}  // namespace

Status CheckFamilyWrite(const Principal& p, const std::string& family) {
  if (!IsWellFormedFamily(family)) {
    return Status::Refused(StatusCode::kInvalidArgument, kRefusalBadFamily,
                           CheckTierWrites(p.name, "platform", "", family).message());
  }
  if (p.role == "admin") return Status::OK();
  if (Status s = Authorize(p, Action::kPublish); !s.ok()) return s;
  if (!p.families.empty() && !Lists(p.families, family)) {
    return Status::Refused(StatusCode::kInvalidArgument, kRefusalFamilyForbidden,
                           "principal '" + p.name + "' may write only the families its token " +
                               "lists, and '" + family + "' is not one of them");
  }
  // A platform family listed by name in the token's row is an explicit platform grant.
  const std::string tier =
      family.compare(0, 5, "root/") == 0 && Lists(p.families, family) ? "platform" : p.tier;
  Status s = CheckTierWrites(p.name, tier, p.org, family);
  if (s.ok()) return s;
  return Status::Refused(StatusCode::kInvalidArgument, kRefusalFamilyForbidden, s.message());
}

std::string WriteTier(const Principal& p, const std::string& family) {
  if (p.role == "admin" || p.tier == "platform") return "platform";
  if (family.compare(0, 5, "root/") == 0 && Lists(p.families, family)) return "platform";
  return p.tier;
}

std::string RowOrg(const Principal& p) {
  if (p.role == "admin" || p.tier == "platform") return "";
  return p.org;
}

std::optional<std::string> RowScope(const Principal& p) {
  if (p.role == "admin" || p.tier == "platform") return std::nullopt;
  return p.org;
}

bool MayReadRow(const Principal& p, const std::string& row_org) {
  const std::optional<std::string> scope = RowScope(p);
  return !scope.has_value() || *scope == row_org;
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
      static const char* kKnown[] = {"sha256", "name",     "role",        "tier",
                                     "org",    "releases", "quota_bytes", "families"};
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
    if (auto it = t.find("families"); it != t.end()) {
      if (!it->is_array()) {
        return Status::InvalidArgument(where + ": families must be an array of family names");
      }
      for (const auto& f : *it) {
        if (!f.is_string() || !IsWellFormedFamily(f.get<std::string>())) {
          return Status::InvalidArgument(where + ": families holds '" +
                                         (f.is_string() ? f.get<std::string>() : f.dump()) +
                                         "', not a '<namespace>/<name>' family");
        }
        row.families.push_back(f.get<std::string>());
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
    if (row.role != "publisher" && row.role != "worker" && row.role != "admin" &&
        row.role != kRoleMetrics) {
      return Status::InvalidArgument(where + ": role '" + row.role +
                                     "' is not publisher, worker, admin or metrics");
    }
    if (row.role == kRoleMetrics &&
        (!row.tier.empty() || !row.org.empty() || !row.families.empty() || !row.releases.empty())) {
      return Status::InvalidArgument(where +
                                     ": a metrics token reads /metrics only; it takes no "
                                     "tier, org, families or releases");
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
    if (row.role == "worker" && !row.tier.empty() && row.tier != "platform" && row.tier != "org") {
      return Status::InvalidArgument(where + ": worker tier '" + row.tier +
                                     "' is not platform or org (or absent)");
    }
    if (row.role == "worker" && row.tier == "platform" && !row.org.empty()) {
      return Status::InvalidArgument(where + ": a platform-tier worker has no org, got '" +
                                     row.org + "'");
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
    if (!r.families.empty()) t["families"] = r.families;
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
