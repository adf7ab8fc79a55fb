// sandbox_probe rebuild --child DIR: stands in for `kiln` inside the hub builder's sandbox
// (builder_sandbox_test.cc) and reports what it can reach instead of rebuilding. The paths to
// look for arrive as the published source (DIR/cell.cc, one per line); the answer leaves as the
// refusal a real child would write (DIR/report.json, exit 2), which the builder passes on.
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

int main(int argc, char** argv) {
  if (argc != 4) return 4;
  const std::string dir = argv[3];
  nlohmann::json seen = nlohmann::json::object();
  std::ifstream source(dir + "/cell.cc");
  std::string line;
  int port = 0;
  while (std::getline(source, line)) {
    if (line.rfind("port:", 0) == 0) port = std::atoi(line.c_str() + 5);
    if (line.empty() || line[0] != '/') continue;
    struct stat st {};
    seen[line] = ::stat(line.c_str(), &st) == 0;
  }
  // Processes this sandbox can see.
  int pids = 0;
  if (DIR* d = ::opendir("/proc")) {
    while (dirent* e = ::readdir(d)) pids += (e->d_name[0] >= '1' && e->d_name[0] <= '9') ? 1 : 0;
    ::closedir(d);
  }
  // The network: a TCP connect to the loopback port the source names.
  bool connected = false;
  if (port > 0) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected = fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  }
  nlohmann::json facts{{"visible", seen},
                       {"pids", pids},
                       {"uid", ::getuid()},
                       {"connected", connected},
                       {"tmp_writable", ::access("/tmp", W_OK) == 0},
                       {"usr_writable", ::access("/usr", W_OK) == 0}};
  std::ofstream(dir + "/report.json") << nlohmann::json{
      {"status", "refused"},
      {"token", "rebuild_failed"},
      {"message", facts.dump()}}.dump();
  return 2;
}
