// Fuzz harness for the safetensors reader (fuzz/; tensor/safetensors.h): ParseSafetensors on
// arbitrary bytes held in a buffer of exactly their size. Promises checked: a refusal names the
// source; every accepted tensor is valid and readable; the accepted file serializes and parses back
// to the same tensors and metadata.
#include <cstdint>
#include <cstring>
#include <memory>

#include "fuzz/harness.h"
#include "src/kiln/tensor/safetensors.h"

namespace kiln::fuzz {

bool FuzzOne(std::string_view bytes) {
  // Tensors are zero-copy views that keep `owner` alive; an exact-size copy lets ASan catch a read
  // one byte past the end.
  std::shared_ptr<uint8_t[]> owner(new uint8_t[bytes.size() + (bytes.empty() ? 1 : 0)]);
  if (!bytes.empty()) std::memcpy(owner.get(), bytes.data(), bytes.size());
  Result<SafetensorsFile> file = ParseSafetensors(owner, owner.get(), bytes.size(), kWhat);
  if (!file.ok()) {
    CheckRefusal(file.status(), "ParseSafetensors", kWhat);
    return false;
  }
  // Dropping our reference must not free the bytes the tensors view.
  owner.reset();
  uint64_t sum = 0;
  for (const auto& [name, t] : file->tensors) {
    KILN_FUZZ_CHECK(t.valid(), "tensor '" + name + "' is invalid");
    const auto* p = static_cast<const uint8_t*>(t.raw_data());
    for (size_t i = 0; i < t.nbytes(); ++i) sum += p[i];  // every byte must be readable
  }
  (void)sum;
  Result<std::string> again = SerializeSafetensors(file->tensors, file->metadata);
  KILN_FUZZ_CHECK(again.ok(), "an accepted file does not serialize: " + again.status().ToString());
  auto keep = std::make_shared<std::string>(std::move(*again));
  Result<SafetensorsFile> back = ParseSafetensors(
      keep, reinterpret_cast<const uint8_t*>(keep->data()), keep->size(), "<round trip>");
  KILN_FUZZ_CHECK(back.ok(),
                  "SerializeSafetensors output does not parse: " + back.status().ToString());
  KILN_FUZZ_CHECK(back->metadata == file->metadata, "the round trip changed __metadata__");
  KILN_FUZZ_CHECK(back->tensors.size() == file->tensors.size(), "the round trip lost tensors");
  for (const auto& [name, t] : file->tensors) {
    auto it = back->tensors.find(name);
    KILN_FUZZ_CHECK(it != back->tensors.end() && SameTensor(t, it->second),
                    "the round trip changed tensor '" + name + "'");
  }
  return true;
}

}  // namespace kiln::fuzz
