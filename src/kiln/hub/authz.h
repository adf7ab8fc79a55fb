// Authorization at the hub (hub layer): bearer tokens, roles, and who may write which family.
//
// A token is a random string the hub never stores: rows hold SHA-256(token) (store.h TokenRow).
// Roles: `publisher` (publish cells), `worker` (resolve, fetch, post events, settle obligations),
// `admin` (everything, plus revoke, releases, key rotation). Reads of cells and blobs accept any
// role. A publisher has a tier: `platform` may write any family; `org` (a tenant) may write only
// families "<org>/…", and never the platform families "root/…".
//
// Tokens file (JSON), read at hub start and upserted into the store:
//   {"tokens":[{"name":"admin","role":"admin","sha256":"<64 hex>"},
//              {"name":"acme-ci","role":"publisher","tier":"org","org":"acme","sha256":"…"}]}
#pragma once

#include <string>
#include <vector>

#include "src/kiln/base/status.h"
#include "src/kiln/hub/store.h"

namespace kiln {

struct Principal {
  std::string name;
  std::string role;  // publisher | worker | admin
  std::string tier;  // platform | org (publishers; admins act as platform)
  std::string org;
};

// "Bearer <token>" -> "<token>"; "" when the header is absent or of another scheme.
std::string BearerToken(const std::string& authorization_header);

// Whether `p` holds one of the roles (admin holds every role).
bool HasRole(const Principal& p, std::initializer_list<const char*> roles);

// OK if `p` may publish into `family`; else InvalidArgument naming principal, tier and family.
// Families are "<namespace>/<name>" with lowercase [a-z0-9._-] segments.
Status CheckFamilyWrite(const Principal& p, const std::string& family);
bool IsWellFormedFamily(const std::string& family);

// Parses and validates a tokens file's text (roles, tiers, 64-hex hashes, org for tier org).
Result<std::vector<TokenRow>> ParseTokensFile(const std::string& text, const std::string& what);
std::string TokensFileText(const std::vector<TokenRow>& rows);

// A new random token: "kiln_" + 43 base64url characters (256 bits).
Result<std::string> GenerateToken();

}  // namespace kiln
