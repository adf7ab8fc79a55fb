// End-to-end test of the hub's dashboard (GET /) as a person sees it: a real `kiln hub` process
// with real rows (a published cell, a release's obligations discharged and settled, worker
// events), opened in headless Chromium (Debian `chromium`, installed by tools/deps.sh), whose
// rendered DOM must show every row. The page needs a bearer token, which a browser started from
// the command line cannot send, so the test fetches it with the admin's token and Chromium renders
// the fetched page from a file; the refusals without a token and the scoping by org are checked
// on the raw answers. Without Chromium the test fails, unless KILN_SKIP_BROWSER=1
// (then it skips). The browser is $KILN_CHROMIUM if set, else chromium on the PATH.
#include <gtest/gtest.h>
#include <httplib.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "src/kiln/base/file.h"
#include "src/kiln/base/sha256.h"
#include "src/kiln/client/hub_client.h"
#include "src/kiln/hub/authz.h"
#include "tests/hub/hub_fixtures.h"
#include "tests/hub/hub_process.h"

namespace kiln {
namespace {

using hub_testing::Graph;
using hub_testing::HubProcess;
using hub_testing::kAdmin;
using hub_testing::kPlatform;
using hub_testing::MakeCell;
using hub_testing::MakeMetadata;
using hub_testing::Nonce;

// The browser binary, or "" when none is installed.
std::string FindChromium() {
  if (const char* env = std::getenv("KILN_CHROMIUM"); env && *env) return env;
  for (const char* name : {"chromium", "chromium-browser", "google-chrome"}) {
    const char* path = std::getenv("PATH");
    std::string dirs = path ? path : "/usr/bin:/bin";
    size_t start = 0;
    while (start <= dirs.size()) {
      const size_t end = std::min(dirs.find(':', start), dirs.size());
      const std::string candidate = dirs.substr(start, end - start) + "/" + name;
      if (::access(candidate.c_str(), X_OK) == 0) return candidate;
      start = end + 1;
    }
  }
  return "";
}

// Runs `command` through the shell; returns (exit status, stdout).
std::pair<int, std::string> RunShell(const std::string& command) {
  std::string out;
  FILE* p = ::popen(command.c_str(), "r");
  if (p == nullptr) return {-1, ""};
  std::array<char, 65536> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int st = ::pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

// Every <tr class="`cls`">…</tr> of the rendered DOM.
std::vector<std::string> Rows(const std::string& dom, const std::string& cls) {
  std::vector<std::string> rows;
  const std::string open = "<tr class=\"" + cls + "\">";
  for (size_t at = dom.find(open); at != std::string::npos; at = dom.find(open, at + 1)) {
    const size_t end = dom.find("</tr>", at);
    rows.push_back(dom.substr(at, end == std::string::npos ? std::string::npos : end - at));
  }
  return rows;
}

// The rows of `rows` that contain every one of `needles`.
int RowsWith(const std::vector<std::string>& rows, const std::vector<std::string>& needles) {
  int n = 0;
  for (const auto& r : rows) {
    bool all = true;
    for (const auto& s : needles) all &= r.find(s) != std::string::npos;
    n += all;
  }
  return n;
}

// A worker token of this test's own: on PostgreSQL the tokens table is shared by every hub on the
// database, and another suite's hub naming the common worker token would rename this one's rows.
constexpr char kDashWorker[] = "tok-worker-dashboard-only";
constexpr char kDashTenant[] = "tok-acme-worker-dashboard-only";

class HubDashboardTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const char* skip = std::getenv("KILN_SKIP_BROWSER");
    if (skip && std::string(skip) == "1") GTEST_SKIP() << "KILN_SKIP_BROWSER=1";
    chromium_ = FindChromium();
    ASSERT_FALSE(chromium_.empty())
        << "headless Chromium is required for the dashboard test and was not found "
           "(apt-get install chromium, as tools/deps.sh does; or set KILN_CHROMIUM=/path; "
           "KILN_SKIP_BROWSER=1 skips this test)";
    if (GetParam() == "postgresql") {
      const char* url = std::getenv("KILN_TEST_PG_URL");
      if (url == nullptr || *url == '\0') {
        GTEST_SKIP() << "KILN_TEST_PG_URL is not set; start PostgreSQL with tools/pg.sh";
      }
      db_ = url;
    }
    root_ = ::testing::TempDir() + "/kiln_hub_dashboard_" + GetParam() + "_" + Nonce();
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_ + "/data");
    std::filesystem::create_directories(root_ + "/browser");
    ASSERT_TRUE(
        WriteSecretFileAtomic(
            root_ + "/tokens.json",
            TokensFileText({{Sha256Hex(kPlatform), "ci", "publisher", "platform", "", {"*"}},
                            {Sha256Hex(kDashWorker), "worker-dash", "worker", "", "", {"*"}},
                            {Sha256Hex(kDashTenant), "acme-dash", "worker", "", "acme", {}},
                            {Sha256Hex(kAdmin), "admin", "admin", "", "", {}}}))
            .ok());
    hub_ = std::make_unique<HubProcess>(root_ + "/data", db_,
                                        std::vector<std::string>{"--rebuild", "off"});
    ASSERT_TRUE(hub_->Start());
  }
  void TearDown() override {
    hub_.reset();
    if (!HasFailure()) std::filesystem::remove_all(root_);
  }

  // The DOM of `url` after Chromium loaded and rendered it.
  std::string DumpDom(const std::string& url) {
    const std::string cmd =
        "timeout -k 5 60 " + chromium_ +
        " --headless --no-sandbox --disable-gpu --disable-quic --no-first-run"
        " --disable-background-networking --disable-component-update --disable-sync"
        " --disable-dev-shm-usage --user-data-dir=" +
        root_ + "/browser --dump-dom " + url + " 2>" + root_ + "/chromium.log";
    auto [status, dom] = RunShell(cmd);
    EXPECT_EQ(status, 0) << cmd << "\n"
                         << hub_testing::ValueOr(ReadFile(root_ + "/chromium.log"), std::string());
    return dom;
  }

  // GET / with `token` ("" = none): (HTTP status, body).
  std::pair<int, std::string> Fetch(const std::string& token) {
    httplib::Client http(hub_->url());
    http.set_read_timeout(30, 0);
    if (!token.empty()) http.set_bearer_token_auth(token);
    auto r = http.Get("/");
    if (!r) return {0, "no answer: " + httplib::to_string(r.error())};
    return {r->status, r->body};
  }

  std::string chromium_, root_, db_;
  std::unique_ptr<HubProcess> hub_;
};

TEST_P(HubDashboardTest, ChromiumShowsCellsObligationsWorkersAndEvents) {
  // Real rows: a release with two obligations, a cell published for one (discharged), the
  // other settled by a worker's deterministic refusal, and the worker's events.
  const CellMetadata m = MakeMetadata(Graph("dashboard"), "root/dashboard-mlp");
  const std::string cell = MakeCell(m);
  const std::string rel = "rel-dash-" + Nonce();
  HubAnswer created =
      hub_->Client(kAdmin)->Call("POST", "/v1/releases",
                                 nlohmann::json{{"name", rel},
                                                {"targets",
                                                 {{{"target", "denoiser"}, {"sm", "x86-64-v3"}},
                                                  {{"target", "decoder"}, {"sm", "x86-64-v3"}}}}}
                                     .dump());
  ASSERT_TRUE(created.ok()) << created.token << ": " << created.message;
  PublishOptions opts;
  opts.release = rel;
  opts.target = "denoiser";
  PublishAnswer p = hub_->Client(kPlatform)->Publish(cell, opts);
  ASSERT_TRUE(p.ok()) << p.token << ": " << p.message;
  auto worker = hub_->Client(kDashWorker);
  ASSERT_TRUE(worker->SettleObligation(rel, "decoder", "x86-64-v3", "no_export_declaration").ok());
  const std::string detail = "dashboard-probe-" + Nonce();
  ASSERT_TRUE(worker
                  ->PostEvents(nlohmann::json::array({{{"seq", 1},
                                                       {"kind", "boot_adopt"},
                                                       {"phase", "hit"},
                                                       {"key", m.key},
                                                       {"duration_ms", 3}},
                                                      {{"seq", 2},
                                                       {"kind", "resolve"},
                                                       {"phase", "miss"},
                                                       {"key", m.key},
                                                       {"duration_ms", 1},
                                                       {"detail", detail}}}))
                  .ok());

  // Without a token the page is refused; a token sees its own org's rows (the untenanted ones for
  // this unscoped worker), the admin every row.
  EXPECT_EQ(Fetch("").first, 401);
  auto [status, page] = Fetch(kAdmin);
  ASSERT_EQ(status, 200) << page;
  ASSERT_TRUE(WriteFileAtomic(root_ + "/dashboard.html", page).ok());
  auto [tenant_status, tenant_page] = Fetch(kDashTenant);
  ASSERT_EQ(tenant_status, 200) << tenant_page;
  EXPECT_NE(tenant_page.find(m.key), std::string::npos) << "a platform cell any tenant may adopt";
  for (const char* cls : {"obligation", "worker", "event"}) {
    EXPECT_TRUE(Rows(tenant_page, cls).empty()) << "the platform's " << cls << " rows";
  }
  EXPECT_EQ(tenant_page.find(detail), std::string::npos);
  const std::string dom = DumpDom("file://" + root_ + "/dashboard.html");
  ASSERT_FALSE(dom.empty());
  // Chromium parsed and rendered the page: its DOM has the tbody the served HTML leaves out.
  EXPECT_NE(dom.find("<tbody>"), std::string::npos) << dom.substr(0, 2000);
  EXPECT_NE(dom.find("<h1>kiln hub</h1>"), std::string::npos);

  // The cell: key, family, size, publisher, tier, release, adopted by one worker, live.
  const auto cells = Rows(dom, "cell");
  EXPECT_EQ(RowsWith(cells, {"<code>" + m.key + "</code>", "<td>root/dashboard-mlp</td>",
                             "<td>" + std::to_string(cell.size()) + "</td>", "<td>ci</td>",
                             "<td>platform</td>", "<td>" + rel + "</td><td>1</td><td>live</td>"}),
            1)
      << dom;
  // The obligations and their states.
  const auto obligations = Rows(dom, "obligation");
  EXPECT_EQ(RowsWith(obligations, {"<td>" + rel + "</td><td>denoiser</td><td>x86-64-v3</td>",
                                   "<code>" + m.key + "</code>", "<td>discharged</td>"}),
            1)
      << dom;
  EXPECT_EQ(RowsWith(obligations, {"<td>" + rel + "</td><td>decoder</td><td>x86-64-v3</td>",
                                   "<td>settled:no_export_declaration</td>"}),
            1)
      << dom;
  // The worker (named by its token) and its events.
  EXPECT_GE(RowsWith(Rows(dom, "worker"), {"<td>worker-dash</td>"}), 1) << dom;
  const auto events = Rows(dom, "event");
  EXPECT_EQ(RowsWith(events, {"<td>worker-dash</td><td>1</td><td>boot_adopt</td><td>hit</td>",
                              "<code>" + m.key + "</code>"}),
            1)
      << dom;
  EXPECT_EQ(RowsWith(events, {"<td>worker-dash</td><td>2</td><td>resolve</td><td>miss</td>",
                              "<td>" + detail + "</td>"}),
            1)
      << dom;
}

INSTANTIATE_TEST_SUITE_P(Backends, HubDashboardTest, ::testing::Values("sqlite", "postgresql"));

}  // namespace
}  // namespace kiln
