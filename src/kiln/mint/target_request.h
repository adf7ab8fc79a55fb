// A target of the worker's manifest as a mint request (mint layer, over manifest/): the one place
// a declared target (graph, checkpoint, envelope, samples, family, numerics thresholds, sm)
// becomes what MintCell takes. `kiln key`, `kiln mint` and the mint child build their requests
// here, and the worker's mint driver reads its thresholds from ThresholdsFor, so a target proves
// against the same numbers wherever it is proven.
#pragma once

#include <string>

#include "src/kiln/arm/gate.h"
#include "src/kiln/base/status.h"
#include "src/kiln/manifest/manifest.h"
#include "src/kiln/mint/mint.h"

namespace kiln {

// The strict gate's thresholds a target declares (`targets.<name>.numerics`).
NumericsThresholds ThresholdsFor(const NumericsSpec& numerics);

// The manifest's target `name` ("" = the only target; InvalidArgument naming the targets when
// there are several) with its graph imported, its checkpoint bound (the graph's own weights when
// it names none), its samples read, and its envelope, family (`intake/<name>` without an export
// declaration), thresholds, sm and the manifest's parallel compiles. The graph's, checkpoint's
// and samples' own errors name their files.
Result<MintRequest> RequestForTarget(const Manifest& manifest, const std::string& name);

}  // namespace kiln
