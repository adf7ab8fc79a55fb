// Authorization at the hub (hub layer): bearer tokens, roles, and who may write which family.
//
// A token is a random string the hub never stores: rows hold SHA-256(token) (store.h TokenRow).
// Roles (docs/hub-api.md has the table):
//   - `publisher`: publishes cells (a CI); no events, no settlements.
//   - `worker`: resolves and fetches, reports its own events, settles obligations of the releases
//     it is granted, and publishes the cells it minted itself: an org-scoped worker into
//     "<org>/…" (tier org); platform families "root/…" only when its row says tier "platform".
//   - `admin`: everything, plus revoke, releases, key rotation, token revocation.
//   - `metrics`: GET /metrics and nothing else (a scraper's token: it reads no cell, blob, event
//     or fleet row). The HTTP binding refuses it on every other route.
// Reads of cells and blobs accept any role within its scope. A writer has a tier: `platform` may
// write any family; `org` (a tenant) only families "<org>/…", never "root/…". A row's optional
// `families` narrows what it may write to exactly those families.
//
// Rows the hub keeps about a fleet (events, obligations, the dashboard's tables) carry an org:
// the org of the token that wrote them ("" for platform-tier, admin and unscoped tokens). An
// admin or platform-tier token reads every org's rows; an org-scoped token only its org's; an
// unscoped worker only the untenanted rows (org ""), never a tenant's.
//
// Tokens file (JSON), read at hub start; it is the hub process's whole token set (revocations by
// an admin are kept in the store and shared by hubs on one database):
//   {"tokens":[{"name":"admin","role":"admin","sha256":"<64 hex>"},
//              {"name":"acme-ci","role":"publisher","tier":"org","org":"acme","sha256":"…"},
//              {"name":"acme-fleet","role":"worker","org":"acme","families":["acme/vision"],
//               "releases":["r1"],"sha256":"…"}]}
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "src/kiln/base/status.h"
#include "src/kiln/hub/store.h"
#include "src/kiln/receipt/receipt.h"

namespace kiln {

struct Principal {
  std::string name;
  std::string role;  // publisher | worker | admin
  std::string tier;  // platform | org: the tier it writes as ("" = it writes nothing); admins
                     // platform, org-scoped workers org
  std::string org;   // tier org writers; workers scoped to one org ("" = unscoped)
  std::vector<std::string> families = {};  // TokenRow::families: exact families it may write
  std::vector<std::string> releases;       // release grants (TokenRow::releases)
  std::string token_sha256;                // which token: re-checked before anything is signed
  int64_t quota_bytes = -1;                // TokenRow::quota_bytes
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

// The role of a scraper's token (see the header comment).
inline constexpr const char* kRoleMetrics = "metrics";

// The refusal tokens of the rules below (the hub answers them as 403, bad_family as 400).
inline constexpr const char* kRefusalForbidden = "forbidden";
inline constexpr const char* kRefusalFamilyForbidden = "family_forbidden";
inline constexpr const char* kRefusalBadFamily = "bad_family";

// What a route asks of its caller's role.
enum class Action {
  kPublish,         // intent, blob upload, complete (the family is checked by CheckFamilyWrite)
  kReportEvents,    // POST /v1/events
  kSettle,          // POST /v1/obligations/settle (the release by HoldsRelease)
  kReportDamage,    // POST /v1/blobs/{digest}/damaged
  kRevokeCells,     // POST /v1/admin/revoke
  kRevokeTokens,    // POST /v1/admin/tokens/revoke
  kManageKeys,      // key rotation, retirement, receipt re-signing
  kDeclareRelease,  // POST /v1/releases
  kOrderCells,      // POST /v1/admin/orders
};
const char* ActionName(Action action);

// OK if `p`'s role may do `action` at all; else Refused(kInvalidArgument, "forbidden") naming the
// principal, its role and the action. publisher: kPublish, kReportDamage; worker: kPublish (when
// it has a write tier), kReportEvents, kSettle, kReportDamage; admin: everything.
Status Authorize(const Principal& p, Action action);

// OK if `p` may publish into `family`: its tier's rule (CheckTierWrites, the same rule a worker
// applies to a receipt; admins act as platform), then its `families` grant when it lists any.
// Refusals: "bad_family" (not a well-formed family), "family_forbidden" (outside its scope),
// "forbidden" (a role or a token with no write tier).
Status CheckFamilyWrite(const Principal& p, const std::string& family);

// The tier `p` writes `family` as (a receipt's tier): "platform" for admins, platform-tier
// tokens and a platform family listed by name in its row; else its tier. REQUIRES:
// CheckFamilyWrite(p, family) is OK.
std::string WriteTier(const Principal& p, const std::string& family);

// The org recorded on the rows `p` writes (events): its org when it is org-scoped, else "".
std::string RowOrg(const Principal& p);
// Which org's rows `p` may read: nullopt = every org (admins, platform tier); else exactly the
// rows of that org ("" = the untenanted rows, for an unscoped worker).
std::optional<std::string> RowScope(const Principal& p);
// Whether a row of `row_org` is visible to `p` (RowScope).
bool MayReadRow(const Principal& p, const std::string& row_org);

// Parses and validates a tokens file's text (roles, tiers, 64-hex hashes, org for tier org).
Result<std::vector<TokenRow>> ParseTokensFile(const std::string& text, const std::string& what);
std::string TokensFileText(const std::vector<TokenRow>& rows);

// A new random token: "kiln_" + 43 base64url characters (256 bits).
Result<std::string> GenerateToken();

}  // namespace kiln
