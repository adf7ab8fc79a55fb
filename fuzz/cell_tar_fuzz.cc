// Fuzz harness for the cell tar reader and admission (fuzz/; cell/pack.h, cell/admission.h):
// UnpackCell and AdmitCell on arbitrary bytes, admitted against the cell-test fixture's key, sm and
// toolchain so mutations of the seed cell reach every check. Promises checked: an unpack refusal
// names the source; an admission refusal starts with one of admission.h's refusal tokens; unpacked
// files pack and unpack back unchanged; an admitted cell carries the digest of its bytes.
#include "fuzz/harness.h"
#include "src/kiln/cell/admission.h"
#include "src/kiln/cell/pack.h"
#include "tests/cell/cell_fixtures.h"

namespace kiln::fuzz {
namespace {

const AdmissionPolicy& Policy() {
  static const AdmissionPolicy policy = [] {
    AdmissionPolicy p;
    p.expected_key = cell_testing::SampleMetadata().key;
    p.local_sm = "x86-64-v4";
    p.local_toolchain = cell_testing::SampleToolchain();
    return p;
  }();
  return policy;
}

}  // namespace

bool FuzzOne(std::string_view bytes) {
  Result<CellFiles> files = UnpackCell(bytes, kWhat);
  if (files.ok()) {
    Result<std::string> packed = PackCell(*files);
    KILN_FUZZ_CHECK(packed.ok(), "unpacked files do not pack: " + packed.status().ToString());
    Result<CellFiles> again = UnpackCell(*packed, "<round trip>");
    KILN_FUZZ_CHECK(again.ok(), "PackCell output does not unpack: " + again.status().ToString());
    KILN_FUZZ_CHECK(again->metadata_json == files->metadata_json &&
                        again->shared_object == files->shared_object &&
                        again->source == files->source,
                    "the pack round trip changed a member");
  } else {
    CheckRefusal(files.status(), "UnpackCell", kWhat);
  }

  Result<AdmittedCell> admitted = AdmitCell(bytes, "", 0, Policy());
  if (!admitted.ok()) {
    CheckRefusal(admitted.status(), "AdmitCell");
    KILN_FUZZ_CHECK(!admitted.status().token().empty(),
                    "refusal starts with no token: " + admitted.status().ToString());
    KILN_FUZZ_CHECK(files.ok() || admitted.status().token() == kRefusalCellCorrupt,
                    "a tar UnpackCell refuses was refused as " + admitted.status().ToString());
    return false;
  }
  KILN_FUZZ_CHECK(files.ok(), "AdmitCell admitted a tar UnpackCell refuses");
  KILN_FUZZ_CHECK(admitted->digest == CellDigest(bytes), "the admitted digest is not the bytes'");
  return true;
}

}  // namespace kiln::fuzz
