// Checkpoints: weight values bound to a graph by name (graph layer).
//
// A checkpoint never changes the graph's identity (digest): it only supplies values for names the
// graph already binds as weights, each with the dtype and shape the graph declares. One cell
// serves every checkpoint of an architecture because of exactly this contract.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "src/kiln/base/status.h"
#include "src/kiln/graph/ir.h"

namespace kiln {

using WeightMap = std::map<std::string, Tensor>;

// The graph's weights (float/8-bit initializers, including lifted Constant nodes), by name.
WeightMap GraphWeights(const Graph& graph);

// Returns the graph's weights with every tensor of `checkpoint` replacing the weight of the same
// name. Refused, naming `what` and the tensor: a name the graph does not bind as a weight
// (NotFound), a dtype or shape different from the graph's (InvalidArgument). Names the checkpoint
// lacks keep the graph's own values; when `require_complete`, a missing weight is NotFound.
Result<WeightMap> BindCheckpoint(const Graph& graph, const WeightMap& checkpoint,
                                 const std::string& what, bool require_complete = false);

// Reads a safetensors checkpoint and binds it (see BindCheckpoint).
Result<WeightMap> LoadCheckpoint(const Graph& graph, const std::string& safetensors_path,
                                 bool require_complete = false);

// A deterministic fine-tune stand-in: every float weight w becomes w + scale * rms(w) * n, with n
// drawn from a fixed portable PRNG (splitmix64 + Box-Muller) seeded by (seed, weight name); 8-bit
// and int32 weights (quantized weights, zero points, biases) move 1-3 steps either way,
// saturating. The same graph and seed give byte-identical results on every machine.
Result<WeightMap> DeriveCheckpoint(const Graph& graph, uint64_t seed, double scale = 0.05);

}  // namespace kiln
