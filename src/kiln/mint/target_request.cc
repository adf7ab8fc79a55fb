// A manifest target as a mint request (mint layer; see target_request.h).
#include "src/kiln/mint/target_request.h"

#include <memory>
#include <utility>

#include "src/kiln/graph/checkpoint.h"
#include "src/kiln/graph/onnx_import.h"

namespace kiln {

NumericsThresholds ThresholdsFor(const NumericsSpec& numerics) {
  return NumericsThresholds{numerics.floor, numerics.warn, numerics.retention};
}

Result<MintRequest> RequestForTarget(const Manifest& manifest, const std::string& name) {
  const TargetSpec* t = nullptr;
  if (name.empty()) {
    if (manifest.targets.size() != 1) {
      std::string names;
      for (const auto& x : manifest.targets) names += (names.empty() ? "" : ", ") + x.name;
      return Status::InvalidArgument("manifest '" + manifest.source + "' has " +
                                     std::to_string(manifest.targets.size()) +
                                     " targets; pick one with --target (" + names + ")");
    }
    t = &manifest.targets[0];
  } else {
    KILN_ASSIGN_OR_RETURN(t, manifest.FindTarget(name));
  }
  MintRequest r;
  KILN_ASSIGN_OR_RETURN(Graph g, ImportOnnxFile(t->graph));
  r.graph = std::make_shared<const Graph>(std::move(g));
  if (!t->checkpoint.empty()) {
    KILN_ASSIGN_OR_RETURN(r.weights, LoadCheckpoint(*r.graph, t->checkpoint));
  } else {
    r.weights = GraphWeights(*r.graph);
  }
  r.envelope = t->envelope;
  KILN_ASSIGN_OR_RETURN(r.samples, ReadSamples(t->samples));
  r.family = t->export_spec ? t->export_spec->family : "intake/" + t->name;
  r.thresholds = ThresholdsFor(t->numerics);
  r.sm = t->sm;
  r.compile.parallel_compiles = manifest.mint.parallel_compiles;
  return r;
}

}  // namespace kiln
