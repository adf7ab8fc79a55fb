// Authorization at the hub (hub layer): bearer tokens, roles, and who may write which family.
//
// A token is a random string the hub never stores: rows hold SHA-256(token) (store.h TokenRow).
// Roles: `publisher` (publish cells), `worker` (resolve, fetch, post events, settle obligations),
// `admin` (everything, plus revoke, releases, key rotation). Reads of cells and blobs accept any
// role. A publisher has a tier: `platform` may write any family; `org` (a tenant) may write only
// families "<org>/…", and never the platform families "root/…".
//
// Tokens file (JSON), read at hub start; it is the hub process's whole token set (revocations by
// an admin are kept in the store and shared by hubs on one database):
//   {"tokens":[{"name":"admin","role":"admin","sha256":"<64 hex>"},
//              {"name":"acme-ci","role":"publisher","tier":"org","org":"acme","sha256":"…"}]}
#pragma once

#include <string>
#include <vector>

#include "src/kiln/base/status.h"
#include "src/kiln/hub/receipt.h"
#include "src/kiln/hub/store.h"

namespace kiln {

struct Principal {
  std::string name;
  std::string role;  // publisher | worker | admin
  std::string tier;  // platform | org (publishers; admins act as platform)
  std::string org;   // tier org publishers; workers scoped to one org ("" = every family)
  std::vector<std::string> releases;  // release grants (TokenRow::releases)
  std::string token_sha256;           // which token: re-checked before anything is signed
  int64_t quota_bytes = -1;           // TokenRow::quota_bytes
};

// Whether `p` may read cells, receipts and blobs of `family`: admins, platform publishers and
// unscoped workers every family; an org's tokens their own org's families and the platform's
// ("root/…", which anyone may adopt).
bool MayRead(const Principal& p, const std::string& family);

// Whether `p` may settle or discharge obligations of `release` (admins always; otherwise a
// grant of that release or of "*").
bool HoldsRelease(const Principal& p, const std::string& release);

// "Bearer <token>" -> "<token>"; "" when the header is absent or of another scheme.
std::string BearerToken(const std::string& authorization_header);

// Whether `p` holds one of the roles (admin holds every role).
bool HasRole(const Principal& p, std::initializer_list<const char*> roles);

// OK if `p` may publish into `family` (admins act as platform; otherwise CheckTierWrites, the
// same rule a worker applies to a receipt); else InvalidArgument naming principal, tier, family.
Status CheckFamilyWrite(const Principal& p, const std::string& family);

// Parses and validates a tokens file's text (roles, tiers, 64-hex hashes, org for tier org).
Result<std::vector<TokenRow>> ParseTokensFile(const std::string& text, const std::string& what);
std::string TokensFileText(const std::vector<TokenRow>& rows);

// A new random token: "kiln_" + 43 base64url characters (256 bits).
Result<std::string> GenerateToken();

}  // namespace kiln
