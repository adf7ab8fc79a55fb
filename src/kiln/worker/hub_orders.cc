// Hub orders on a worker: canary selection and the machine's worker id (see hub_orders.h).
#include "src/kiln/worker/hub_orders.h"

#include <cstdint>
#include <fstream>

#include "src/kiln/base/file.h"
#include "src/kiln/base/sha256.h"

namespace kiln {

double CanaryPoint(const std::string& worker_id, const std::string& release,
                   const std::string& target) {
  const std::string hex = Sha256Hex(worker_id + "\n" + release + "\n" + target);
  const uint64_t bits = std::stoull(hex.substr(0, 16), nullptr, 16);
  return static_cast<double>(bits >> 11) / static_cast<double>(uint64_t{1} << 53);
}

bool InCanary(const std::string& worker_id, const std::string& release, const std::string& target,
              double share) {
  return CanaryPoint(worker_id, release, target) < share;
}

namespace {

bool IsWorkerId(const std::string& s) {
  if (s.size() != 32) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace

Result<std::string> MachineWorkerId(const std::string& store_root) {
  const std::string path = store_root + "/.worker_id";
  if (auto text = ReadFile(path); text.ok()) {
    std::string id = *text;
    while (!id.empty() && (id.back() == '\n' || id.back() == ' ')) id.pop_back();
    if (!IsWorkerId(id)) {
      return Status::InvalidArgument("worker id file " + path + " holds '" + id.substr(0, 64) +
                                     "', expected 32 lowercase hex characters");
    }
    return id;
  }
  std::ifstream urandom("/dev/urandom", std::ios::binary);
  std::string raw(16, '\0');
  if (!urandom.read(raw.data(), static_cast<std::streamsize>(raw.size()))) {
    return Status::IOError("cannot read /dev/urandom for a worker id");
  }
  static const char* kHex = "0123456789abcdef";
  std::string id;
  for (unsigned char c : raw) {
    id += kHex[c >> 4];
    id += kHex[c & 15];
  }
  KILN_RETURN_IF_ERROR(MakeDirs(store_root));
  KILN_RETURN_IF_ERROR(WriteFileAtomic(path, id + "\n", Durability::kDurable));
  return id;
}

}  // namespace kiln
