// `kiln hub-token`: creates a bearer token for hub replicas that share a PostgreSQL database (cli
// layer; docs/fleet.md "Replicas behind a load balancer"). The token is printed once on stdout;
// the database keeps only its SHA-256 (pg_shared.h SharedTokens), and every replica takes it at
// its next lookup. A hub on SQLite takes its tokens from its tokens file instead.
#include <cstdio>
#include <memory>

#include "src/kiln/base/clock.h"
#include "src/kiln/base/sha256.h"
#include "src/kiln/cli/commands.h"
#include "src/kiln/hub/authz.h"
#include "src/kiln/hub/pg_shared.h"

namespace kiln::cli {

namespace {

struct HubTokenArgs {
  std::string db_url;
  TokenRow row;
};

int RunHubToken(HubTokenArgs a) {
  if (a.db_url.rfind("postgresql://", 0) != 0 && a.db_url.rfind("postgres://", 0) != 0) {
    return ReportError("hub-token",
                       Status::InvalidArgument("--db '" + a.db_url +
                                               "' is not a postgresql:// URL (a hub on SQLite "
                                               "takes its tokens from its tokens file)"));
  }
  auto token = GenerateToken();
  if (!token.ok()) return ReportError("hub-token", token.status());
  a.row.token_sha256 = Sha256Hex(*token);
  // The tokens file's own checks (role, tier, org, families) judge the row before it is stored.
  auto checked = ParseTokensFile(TokensFileText({a.row}), "the token to create");
  if (!checked.ok()) return ReportError("hub-token", checked.status());
  auto tokens = OpenPostgresTokens(a.db_url);
  if (!tokens.ok()) return ReportError("hub-token", tokens.status());
  Status s = (*tokens)->Upsert(*checked, Clock::Real()->UnixSeconds());
  if (!s.ok()) return ReportError("hub-token", s);
  std::fprintf(stderr, "kiln hub-token: created token '%s' (%s), sha256 %s; shown once:\n",
               a.row.name.c_str(), a.row.role.c_str(), a.row.token_sha256.c_str());
  std::printf("%s\n", token->c_str());
  return 0;
}

}  // namespace

void AddHubTokenCommand(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand(
      "hub-token", "Create a bearer token in the database hub replicas share (printed once)");
  auto args = std::make_shared<HubTokenArgs>();
  cmd->add_option("--db", args->db_url, "postgresql://… the replicas' database")->required();
  cmd->add_option("--name", args->row.name, "the token's name")->required();
  cmd->add_option("--role", args->row.role, "publisher | worker | admin")->required();
  cmd->add_option("--tier", args->row.tier, "publishers: platform | org; workers: org | platform");
  cmd->add_option("--org", args->row.org, "the org the token is scoped to");
  cmd->add_option("--releases", args->row.releases, "releases it may settle (\"*\": all)");
  cmd->add_option("--families", args->row.families, "the exact families it may write");
  cmd->add_option("--quota-bytes", args->row.quota_bytes, "publishers: bytes it may keep");
  cmd->callback([=] { *exit_code = RunHubToken(*args); });
}

}  // namespace kiln::cli
