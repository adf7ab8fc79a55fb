// Helpers the cell-facing subcommands share: shape-class specs from the command line and the
// local cell of one class (cli layer). A manifest target becomes a MintRequest in the mint layer
// (mint/target_request.h).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "src/kiln/manifest/manifest.h"
#include "src/kiln/mint/mint.h"
#include "src/kiln/mint/target_request.h"

namespace kiln::cli {

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
// A command-line option's JSON object, or InvalidArgument naming `option`.
Result<nlohmann::json> ParseJsonOption(const std::string& text, const char* option);

// The same for a whole envelope (classes and ranged entries).
Result<LocalCell> LocalCellForEnvelope(std::shared_ptr<const Graph> graph, const WeightMap& weights,
                                       const Envelope& envelope, const std::string& family,
                                       int num_threads, const Samples& samples = {},
                                       const std::vector<std::string>& disabled_passes = {});

}  // namespace kiln::cli
