// SHA-256 (base layer): the one hash behind cell keys, facts digests and cell digests.
//
// Backed by OpenSSL's EVP interface, kept out of this header so that layers above never see
// OpenSSL. Hex output is always 64 lowercase characters.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "src/kiln/base/status.h"

namespace kiln {

// Lowercase hex of SHA-256(bytes).
std::string Sha256Hex(std::string_view bytes);

// Lowercase hex of arbitrary bytes ("00ff...").
std::string HexEncode(const uint8_t* data, size_t size);

// Incremental SHA-256 for inputs that arrive in pieces (streamed files, multi-part keys).
// Not thread-safe: one instance per thread. After Final*() the object is reset and may be reused;
// a moved-from object may only be assigned to or destroyed.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  Sha256(Sha256&&) noexcept;
  Sha256& operator=(Sha256&&) noexcept;

  void Update(const void* data, size_t size);
  void Update(std::string_view bytes) { Update(bytes.data(), bytes.size()); }
  std::array<uint8_t, 32> Final();
  std::string FinalHex();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Lowercase hex of the SHA-256 of a file's bytes, read in chunks (files may exceed memory).
// NotFound if the file does not exist; IOError naming the path otherwise.
Result<std::string> Sha256File(const std::string& path);

}  // namespace kiln
