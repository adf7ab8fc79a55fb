// Unit tests of the hub's authorization rules (hub/authz.h): which role may do what, which
// families a token may write and as which tier, and whose fleet rows it reads. Every refusal is
// checked by its token, never by its message.
#include "src/kiln/hub/authz.h"

#include <gtest/gtest.h>

namespace kiln {
namespace {

Principal Worker(const std::string& org, const std::vector<std::string>& families = {},
                 const std::string& tier = "") {
  Principal p;
  p.name = "w";
  p.role = "worker";
  p.org = org;
  p.families = families;
  // As HubService::Authenticate makes it: an org-scoped worker writes as its org.
  p.tier = !tier.empty() ? tier : (org.empty() ? "" : "org");
  return p;
}

Principal Publisher(const std::string& tier, const std::string& org = "") {
  Principal p;
  p.name = "ci";
  p.role = "publisher";
  p.tier = tier;
  p.org = org;
  return p;
}

Principal Admin() {
  Principal p;
  p.name = "ops";
  p.role = "admin";
  p.tier = "platform";
  return p;
}

TEST(Authz, AWorkerReportsSettlesAndPublishesButNeverAdministers) {
  const Principal w = Worker("acme");
  for (Action a :
       {Action::kPublish, Action::kReportEvents, Action::kSettle, Action::kReportDamage}) {
    EXPECT_TRUE(Authorize(w, a).ok()) << ActionName(a);
  }
  for (Action a : {Action::kRevokeCells, Action::kRevokeTokens, Action::kManageKeys,
                   Action::kDeclareRelease}) {
    const Status s = Authorize(w, a);
    EXPECT_TRUE(s.Is(kRefusalForbidden)) << ActionName(a) << ": " << s.ToString();
  }
}

TEST(Authz, APublisherPublishesButReportsNoEventsAndSettlesNothing) {
  const Principal p = Publisher("platform");
  EXPECT_TRUE(Authorize(p, Action::kPublish).ok());
  EXPECT_TRUE(Authorize(p, Action::kReportEvents).Is(kRefusalForbidden));
  EXPECT_TRUE(Authorize(p, Action::kSettle).Is(kRefusalForbidden));
  EXPECT_TRUE(Authorize(p, Action::kRevokeCells).Is(kRefusalForbidden));
  EXPECT_TRUE(Authorize(p, Action::kManageKeys).Is(kRefusalForbidden));
}

TEST(Authz, AnAdminMayDoEverything) {
  for (Action a : {Action::kPublish, Action::kReportEvents, Action::kSettle, Action::kRevokeCells,
                   Action::kRevokeTokens, Action::kManageKeys, Action::kDeclareRelease}) {
    EXPECT_TRUE(Authorize(Admin(), a).ok()) << ActionName(a);
  }
}

TEST(Authz, AnOrgWorkerWritesOnlyItsOrgsFamiliesAsTierOrg) {
  const Principal w = Worker("acme");
  EXPECT_TRUE(CheckFamilyWrite(w, "acme/mlp").ok());
  EXPECT_EQ(WriteTier(w, "acme/mlp"), "org");
  EXPECT_TRUE(CheckFamilyWrite(w, "beta/mlp").Is(kRefusalFamilyForbidden));
  EXPECT_TRUE(CheckFamilyWrite(w, "root/mlp").Is(kRefusalFamilyForbidden));
  EXPECT_TRUE(CheckFamilyWrite(w, "Not A Family").Is(kRefusalBadFamily));
}

TEST(Authz, AFamiliesListNarrowsWritesAndGrantsARootFamilyByNameOnly) {
  const Principal w = Worker("acme", {"acme/mlp", "root/shared"});
  EXPECT_TRUE(CheckFamilyWrite(w, "acme/mlp").ok());
  EXPECT_TRUE(CheckFamilyWrite(w, "acme/other").Is(kRefusalFamilyForbidden));
  // The explicit grant: that root family, as tier platform; no other root family.
  EXPECT_TRUE(CheckFamilyWrite(w, "root/shared").ok());
  EXPECT_EQ(WriteTier(w, "root/shared"), "platform");
  EXPECT_TRUE(CheckFamilyWrite(w, "root/mlp").Is(kRefusalFamilyForbidden));
  // Its rows stay its org's whatever it may write.
  EXPECT_EQ(RowOrg(w), "acme");
  ASSERT_TRUE(RowScope(w).has_value());
  EXPECT_EQ(*RowScope(w), "acme");
}

TEST(Authz, AnUnscopedWorkerPublishesNothingUnlessGranted) {
  const Principal w = Worker("");
  EXPECT_TRUE(Authorize(w, Action::kPublish).Is(kRefusalForbidden));
  EXPECT_TRUE(CheckFamilyWrite(w, "root/mlp").Is(kRefusalForbidden));
  EXPECT_TRUE(CheckFamilyWrite(w, "acme/mlp").Is(kRefusalForbidden));
  const Principal granted = Worker("", {"root/mlp"});
  EXPECT_TRUE(CheckFamilyWrite(granted, "root/mlp").ok());
  EXPECT_TRUE(CheckFamilyWrite(granted, "acme/mlp").Is(kRefusalFamilyForbidden));
  const Principal platform = Worker("", {}, "platform");
  EXPECT_TRUE(CheckFamilyWrite(platform, "root/mlp").ok());
  EXPECT_EQ(WriteTier(platform, "root/mlp"), "platform");
}

TEST(Authz, AnOrgPublisherNeverWritesRootWithoutANamedGrant) {
  EXPECT_TRUE(CheckFamilyWrite(Publisher("org", "acme"), "root/mlp").Is(kRefusalFamilyForbidden));
  EXPECT_TRUE(CheckFamilyWrite(Publisher("org", "acme"), "acme/mlp").ok());
  EXPECT_TRUE(CheckFamilyWrite(Publisher("platform"), "root/mlp").ok());
  EXPECT_TRUE(CheckFamilyWrite(Admin(), "beta/x").ok());
}

TEST(Authz, FleetRowsAreReadWithinTheTokensOrg) {
  EXPECT_TRUE(MayReadRow(Worker("acme"), "acme"));
  EXPECT_FALSE(MayReadRow(Worker("acme"), "beta"));
  EXPECT_FALSE(MayReadRow(Worker("acme"), ""));
  EXPECT_TRUE(MayReadRow(Publisher("org", "acme"), "acme"));
  EXPECT_FALSE(MayReadRow(Publisher("org", "acme"), "beta"));
  // An unscoped worker reads the untenanted rows only, never a tenant's.
  EXPECT_TRUE(MayReadRow(Worker(""), ""));
  EXPECT_FALSE(MayReadRow(Worker(""), "acme"));
  // Admins and platform-tier tokens read every org's rows.
  EXPECT_FALSE(RowScope(Admin()).has_value());
  EXPECT_FALSE(RowScope(Publisher("platform")).has_value());
  EXPECT_FALSE(RowScope(Worker("", {}, "platform")).has_value());
  EXPECT_TRUE(MayReadRow(Admin(), "beta"));
  // Rows written by platform-tier or admin tokens are untenanted.
  EXPECT_EQ(RowOrg(Admin()), "");
  EXPECT_EQ(RowOrg(Publisher("platform")), "");
}

TEST(Authz, TokensFileTakesWorkerFamiliesAndTiers) {
  const std::string hash(64, 'a');
  auto rows = ParseTokensFile(R"({"tokens":[{"name":"f","role":"worker","org":"acme",
      "families":["acme/mlp","root/shared"],"sha256":")" +
                                  hash + R"("}]})",
                              "t");
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  EXPECT_EQ((*rows)[0].families, (std::vector<std::string>{"acme/mlp", "root/shared"}));
  auto again = ParseTokensFile(TokensFileText(*rows), "t2");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)[0].families, (*rows)[0].families);
  for (const std::string bad : {R"("families":["Nope"])", R"("families":"acme/mlp")",
                                R"("tier":"gold")", R"("tier":"platform","org":"acme")"}) {
    auto r = ParseTokensFile(
        R"({"tokens":[{"name":"f","role":"worker",)" + bad + R"(,"sha256":")" + hash + R"("}]})",
        "t");
    EXPECT_FALSE(r.ok()) << bad;
  }
}

}  // namespace
}  // namespace kiln
