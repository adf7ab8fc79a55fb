// Helpers the cell-facing subcommands share: a manifest target loaded into a MintRequest, and
// shape-class specs from the command line (cli layer).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "src/kiln/mint/mint.h"
#include "src/kiln/worker/manifest.h"

namespace kiln::cli {

// The manifest's target `name` ("" = the only target) with its graph imported, its checkpoint
// bound, its envelope, family, thresholds and sm.
Result<MintRequest> RequestForTarget(const Manifest& manifest, const std::string& name);

// "x=[4,64]" or "latent=[1,4,64,64];timestep=[1];cond=[1,64]".
Result<ShapeClass> ParseClassSpec(const std::string& spec);
std::string ClassSpec(const ShapeClass& c);

// The cell for one shape class of `graph` bound to `weights`, from the local store (minted and
// stored on a miss), admitted and armed: what `run --compile`, `bench` and `demo` serve from.
// A mint probes `samples` beside its synthetic probes. `disabled_passes` (bisecting) compiles
// without them, past the store (mint/mint.h CompileThroughStore).
Result<LocalCell> LocalCellForClass(std::shared_ptr<const Graph> graph, const WeightMap& weights,
                                    const ShapeClass& shape_class, const std::string& family,
                                    int num_threads, const Samples& samples = {},
                                    const std::vector<std::string>& disabled_passes = {});

}  // namespace kiln::cli
