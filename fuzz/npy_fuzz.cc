// Fuzz harness for the .npy reader (fuzz/; tensor/npy.h): ParseNpy on arbitrary bytes. Promises
// checked: a refusal names the source; an accepted array is a valid tensor whose SerializeNpy bytes
// parse back to the same dtype, shape and bytes.
#include "fuzz/harness.h"
#include "src/kiln/tensor/npy.h"

namespace kiln::fuzz {

bool FuzzOne(std::string_view bytes) {
  Result<Tensor> t = ParseNpy(bytes, kWhat);
  if (!t.ok()) {
    CheckRefusal(t.status(), "ParseNpy", kWhat);
    return false;
  }
  KILN_FUZZ_CHECK(t->valid(), "ParseNpy accepted an array into an invalid tensor");
  const std::string again = SerializeNpy(*t);
  Result<Tensor> back = ParseNpy(again, "<round trip>");
  KILN_FUZZ_CHECK(back.ok(), "SerializeNpy output does not parse: " + back.status().ToString());
  KILN_FUZZ_CHECK(SameTensor(*t, *back), "the .npy round trip changed " + t->TypeString());
  return true;
}

}  // namespace kiln::fuzz
