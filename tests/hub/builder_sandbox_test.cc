// The hub builder's sandbox seen from inside (hub/builder.h): a probe stands in for `kiln rebuild
// --child` and reports what it can reach. It must see the toolchain and its own work directory,
// and nothing of the hub: not its data directory, not /etc/passwd, not another process, not the
// network, and it must not be able to write the toolchain.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <pwd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "src/kiln/base/file.h"
#include "src/kiln/hub/builder.h"
#include "tests/hub/hub_fixtures.h"

namespace kiln {
namespace {

TEST(BuilderSandbox, SeesTheToolchainAndItsSourceAndNothingOfTheHub) {
  const std::string root =
      ::testing::TempDir() + "/kiln_builder_sandbox_" + std::to_string(::getpid());
  std::filesystem::remove_all(root);
  ASSERT_TRUE(MakeDirs(root + "/hubdata/signing").ok());
  const std::string db = root + "/hubdata/hub.sqlite";
  const std::string key = root + "/hubdata/signing/0123456789abcdef.key";
  ASSERT_TRUE(WriteSecretFileAtomic(db, "SQLite format 3").ok());
  ASSERT_TRUE(WriteSecretFileAtomic(key, std::string(32, 'k')).ok());
  // A listener the sandbox must not reach.
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(::listen(listener, 4), 0);
  socklen_t len = sizeof(a);
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len);

  SandboxOptions o;
  o.kiln_binary = SANDBOX_PROBE;
  o.work_root = root + "/work";
  o.name = "sandbox-test";
  auto builder = NewSandboxedBuilder(o);
  CellFiles files;
  files.source = "port:" + std::to_string(ntohs(a.sin_port)) + "\n" + db + "\n" + key + "\n" +
                 root + "/hubdata\n/etc/passwd\n/etc/shadow\n/etc/hostname\n/root\n/home\n/var\n" +
                 "/dev/zero\n/usr/include/stdio.h\n/usr/bin\n/dev/null\n" + SANDBOX_PROBE + "\n";
  files.shared_object =
      "\x7f"
      "ELF";
  auto r = builder->Rebuild(hub_testing::MakeMetadata(), MembersOf(files),
                            RebuildRequester{"ci", "ci", true});
  ::close(listener);
  ASSERT_FALSE(r.ok());
  ASSERT_TRUE(r.status().Is("rebuild_failed")) << r.status().ToString();
  const std::string message = r.status().message();
  auto facts = nlohmann::json::parse(message.substr(std::min(message.find('{'), message.size())),
                                     nullptr, false);
  ASSERT_TRUE(facts.is_object()) << r.status().message();
  const auto& seen = facts["visible"];
  for (const std::string& hidden :
       {db, key, root + "/hubdata", std::string("/etc/passwd"), std::string("/etc/shadow"),
        std::string("/etc/hostname"), std::string("/root"), std::string("/home"),
        std::string("/var"), std::string("/dev/zero")}) {
    EXPECT_FALSE(seen.value(hidden, true)) << hidden << " is visible in the sandbox";
  }
  for (const std::string& needed : {std::string("/usr/include/stdio.h"), std::string("/usr/bin"),
                                    std::string("/dev/null"), std::string(SANDBOX_PROBE)}) {
    EXPECT_TRUE(seen.value(needed, false)) << needed << " is missing from the sandbox";
  }
  EXPECT_LE(facts.value("pids", 99), 2) << "the sandbox sees other processes";
  EXPECT_FALSE(facts.value("connected", true)) << "the sandbox reached a loopback listener";
  EXPECT_FALSE(facts.value("usr_writable", true)) << "the sandbox may write the toolchain";
  if (::geteuid() == 0) {
    passwd* nobody = ::getpwnam("nobody");
    ASSERT_NE(nobody, nullptr);
    EXPECT_EQ(facts.value("uid", -1), static_cast<int>(nobody->pw_uid));
  }
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace kiln
