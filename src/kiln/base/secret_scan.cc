// The test-only secret scan of this process's memory and environment (see secret_scan.h).
#include "src/kiln/base/secret_scan.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "src/kiln/base/file.h"

namespace kiln {
namespace {

// Whether `hay` holds the secret whose complement is `c` (never materializing the secret).
bool HoldsComplemented(const unsigned char* hay, size_t n, std::string_view c) {
  const size_t m = c.size();
  if (m == 0 || n < m) return false;
  const unsigned char first = static_cast<unsigned char>(~static_cast<unsigned char>(c[0]));
  for (size_t i = 0; i + m <= n;) {
    const void* hit = std::memchr(hay + i, first, n - m + 1 - i);
    if (hit == nullptr) return false;
    const size_t at = static_cast<size_t>(static_cast<const unsigned char*>(hit) - hay);
    size_t k = 1;
    while (k < m &&
           static_cast<unsigned char>(hay[at + k] ^ 0xffu) == static_cast<unsigned char>(c[k])) {
      ++k;
    }
    if (k == m) return true;
    i = at + 1;
  }
  return false;
}

// Reads [begin, end) of this process through `mem` in pieces that overlap by the secret's length
// minus one, so a secret across a piece boundary is still seen.
bool ScanRegion(int mem, uint64_t begin, uint64_t end, std::string_view c,
                std::vector<unsigned char>& buf, SecretScan* out) {
  const size_t overlap = c.size() - 1;
  size_t have = 0;  // bytes of the previous piece kept at the front of buf
  for (uint64_t at = begin; at < end;) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(end - at, buf.size() - have));
    const ssize_t n = ::pread(mem, buf.data() + have, want, static_cast<off_t>(at));
    if (n <= 0) {
      ++out->unreadable;
      return false;
    }
    out->bytes += static_cast<uint64_t>(n);
    const size_t total = have + static_cast<size_t>(n);
    if (HoldsComplemented(buf.data(), total, c)) return true;
    at += static_cast<uint64_t>(n);
    have = std::min(overlap, total);
    std::memmove(buf.data(), buf.data() + total - have, have);
  }
  return false;
}

}  // namespace

std::string Complement(std::string_view bytes) {
  std::string out(bytes);
  for (char& ch : out) ch = static_cast<char>(static_cast<unsigned char>(ch) ^ 0xffu);
  return out;
}

Result<SecretScan> ScanOwnProcess(std::string_view complemented, uint64_t max_region_bytes) {
  if (complemented.empty()) return Status::InvalidArgument("secret scan: the secret is empty");
  SecretScan out;
  KILN_ASSIGN_OR_RETURN(std::string environ, ReadFile("/proc/self/environ"));
  out.in_environ = HoldsComplemented(reinterpret_cast<const unsigned char*>(environ.data()),
                                     environ.size(), complemented);
  KILN_ASSIGN_OR_RETURN(std::string maps, ReadFile("/proc/self/maps"));
  const int mem = ::open("/proc/self/mem", O_RDONLY | O_CLOEXEC);
  if (mem < 0) return Status::IOError("secret scan: cannot open /proc/self/mem");
  std::vector<unsigned char> buf(size_t{1} << 20);
  std::istringstream lines(maps);
  std::string line;
  while (!out.in_memory && std::getline(lines, line)) {
    // "begin-end perms offset dev inode [path]"
    std::istringstream f(line);
    std::string range, perms, offset, dev, inode, path;
    f >> range >> perms >> offset >> dev >> inode;
    std::getline(f >> std::ws, path);
    const size_t dash = range.find('-');
    if (dash == std::string::npos || perms.empty() || perms[0] != 'r') continue;
    const uint64_t begin = std::strtoull(range.substr(0, dash).c_str(), nullptr, 16);
    const uint64_t end = std::strtoull(range.substr(dash + 1).c_str(), nullptr, 16);
    // Device memory may have side effects when read; [vvar], [vvar_vclock] and [vsyscall] are not
    // readable through /proc/self/mem.
    if (path.rfind("/dev/", 0) == 0 || path.rfind("[vvar", 0) == 0 || path == "[vsyscall]" ||
        end - begin > max_region_bytes) {
      ++out.skipped;
      continue;
    }
    ++out.regions;
    const uint64_t unreadable_before = out.unreadable;
    out.in_memory = ScanRegion(mem, begin, end, complemented, buf, &out);
    if (out.unreadable != unreadable_before && out.unreadable_names.size() < 16) {
      out.unreadable_names.push_back(perms + " " + path);
    }
  }
  ::close(mem);
  return out;
}

Status WriteSecretScanReportFromEnv(const std::string& role) {
  const char* file = std::getenv(kTestSecretScanEnv);
  if (file == nullptr || *file == '\0') return Status::OK();
  KILN_ASSIGN_OR_RETURN(std::string complemented, ReadFile(file));
  // The first line is the secret; further lines are controls only a cell's own scan reads
  // (compile/emit_cpp.h test_scan). A complemented ASCII secret holds no '\n' (0x0a ^ 0xff).
  complemented = complemented.substr(0, complemented.find('\n'));
  KILN_ASSIGN_OR_RETURN(SecretScan scan, ScanOwnProcess(complemented));
  const int parent =
      ::open(("/proc/" + std::to_string(::getppid()) + "/mem").c_str(), O_RDONLY | O_CLOEXEC);
  if (parent >= 0) ::close(parent);
  const nlohmann::json report = {{"role", role},
                                 {"pid", ::getpid()},
                                 {"in_memory", scan.in_memory},
                                 {"in_environ", scan.in_environ},
                                 {"regions", scan.regions},
                                 {"bytes", scan.bytes},
                                 {"unreadable", scan.unreadable},
                                 {"unreadable_names", scan.unreadable_names},
                                 {"skipped", scan.skipped},
                                 {"parent_memory_readable", parent >= 0}};
  return WriteFileAtomic(
      std::string(file) + "." + role + "." + std::to_string(::getpid()) + ".json", report.dump());
}

}  // namespace kiln
