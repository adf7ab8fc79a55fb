// SHA-256 over OpenSSL EVP (base layer); see sha256.h.
#include "src/kiln/base/sha256.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

namespace kiln {

struct Sha256::Impl {
  EVP_MD_CTX* ctx = nullptr;
  Impl() {
    ctx = EVP_MD_CTX_new();
    // Failing here means OpenSSL is out of memory or misbuilt; there is no sensible recovery.
    KILN_CHECK(ctx != nullptr);
    Reset();
  }
  ~Impl() { EVP_MD_CTX_free(ctx); }
  void Reset() { KILN_CHECK(EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr) == 1); }
};

Sha256::Sha256() : impl_(std::make_unique<Impl>()) {}
Sha256::~Sha256() = default;
Sha256::Sha256(Sha256&&) noexcept = default;
Sha256& Sha256::operator=(Sha256&&) noexcept = default;

void Sha256::Update(const void* data, size_t size) {
  if (size == 0) return;
  KILN_CHECK(EVP_DigestUpdate(impl_->ctx, data, size) == 1);
}

std::array<uint8_t, 32> Sha256::Final() {
  std::array<uint8_t, 32> out{};
  unsigned int len = 0;
  KILN_CHECK(EVP_DigestFinal_ex(impl_->ctx, out.data(), &len) == 1);
  KILN_CHECK(len == out.size());
  impl_->Reset();
  return out;
}

std::string Sha256::FinalHex() {
  const std::array<uint8_t, 32> digest = Final();
  return HexEncode(digest.data(), digest.size());
}

std::string HexEncode(const uint8_t* data, size_t size) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(size * 2, '0');
  for (size_t i = 0; i < size; ++i) {
    out[2 * i] = kDigits[data[i] >> 4];
    out[2 * i + 1] = kDigits[data[i] & 0xf];
  }
  return out;
}

std::string Sha256Hex(std::string_view bytes) {
  Sha256 h;
  h.Update(bytes);
  return h.FinalHex();
}

Result<std::string> Sha256File(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return Status::NotFound("file '" + path + "' does not exist");
    return Status::IOError("cannot open '" + path + "' to hash it: " + std::strerror(errno));
  }
  Sha256 h;
  std::vector<char> buf(1 << 20);
  while (true) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      Status s = Status::IOError("cannot read '" + path + "' to hash it: " + std::strerror(errno));
      ::close(fd);
      return s;
    }
    if (n == 0) break;
    h.Update(buf.data(), static_cast<size_t>(n));
  }
  ::close(fd);
  return h.FinalHex();
}

}  // namespace kiln
