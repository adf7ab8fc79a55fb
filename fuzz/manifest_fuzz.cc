// Fuzz harness for the worker manifest parser (fuzz/; manifest/manifest.h): ParseManifest on
// arbitrary TOML text. Promises checked: anything wrong in the text is InvalidArgument naming the
// source (never an exception, never another code); in an accepted manifest every model name and
// alias routes to a declared target.
#include "fuzz/harness.h"
#include "src/kiln/manifest/manifest.h"

namespace kiln::fuzz {

bool FuzzOne(std::string_view bytes) {
  Result<Manifest> m = ParseManifest(bytes, kWhat, "/kiln-fuzz-base");
  if (!m.ok()) {
    CheckRefusal(m.status(), "ParseManifest", kWhat);
    KILN_FUZZ_CHECK(m.status().code() == StatusCode::kInvalidArgument,
                    "manifest text refused with " + m.status().ToString());
    return false;
  }
  KILN_FUZZ_CHECK(!m->targets.empty(), "a manifest with no target was accepted");
  for (const TargetSpec& t : m->targets) {
    Result<const TargetSpec*> found = m->FindTarget(t.name);
    KILN_FUZZ_CHECK(found.ok() && *found == &t, "target '" + t.name + "' is not found by name");
  }
  for (const auto& [model, target] : m->function_to_target) {
    Result<const TargetSpec*> routed = m->FindTargetForFunction(model);
    KILN_FUZZ_CHECK(routed.ok() && (*routed)->name == target,
                    "model name '" + model + "' does not route to its target '" + target + "'");
  }
  return true;
}

}  // namespace kiln::fuzz
