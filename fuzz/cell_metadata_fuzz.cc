// Fuzz harness for the cell metadata.json parser (fuzz/; cell/metadata.h): ParseMetadata on
// arbitrary text, then RestateKey on what it accepts. Promises checked: a refusal names the source;
// accepted metadata serializes to canonical bytes that parse back to the same bytes.
#include "fuzz/harness.h"
#include "src/kiln/cell/metadata.h"

namespace kiln::fuzz {

bool FuzzOne(std::string_view bytes) {
  Result<CellMetadata> m = ParseMetadata(bytes, kWhat);
  if (!m.ok()) {
    CheckRefusal(m.status(), "ParseMetadata", kWhat);
    return false;
  }
  Result<std::string> key = RestateKey(*m);
  if (!key.ok()) CheckRefusal(key.status(), "RestateKey");
  Result<std::string> canonical = SerializeMetadata(*m);
  KILN_FUZZ_CHECK(canonical.ok(),
                  "accepted metadata does not serialize: " + canonical.status().ToString());
  Result<CellMetadata> back = ParseMetadata(*canonical, "<round trip>");
  KILN_FUZZ_CHECK(back.ok(),
                  "SerializeMetadata output does not parse: " + back.status().ToString());
  Result<std::string> again = SerializeMetadata(*back);
  KILN_FUZZ_CHECK(again.ok() && *again == *canonical, "the metadata round trip changed the bytes");
  return true;
}

}  // namespace kiln::fuzz
