// Checkpoints: weight values bound to a graph by name (graph layer).
//
// A checkpoint never changes the graph's identity (digest): it only supplies values for names the
// graph already binds as weights, each with the dtype and shape the graph declares. One cell
// serves every checkpoint of an architecture because of exactly this contract.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

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

// The fence's perturbation (arm/gate.h): `weights` with every tensor named in `names` moved
// inside the values it may legally take, deterministically from (seed, name), and every other
// tensor unchanged. The rules, per weight:
// - A float weight every value of which is an integer and that is a Pow exponent moves by +2
//   (`seed` odd: +4): parity is kept, so x^2 stays non-negative and x^3 keeps x's sign.
// - Any other float weight is multiplied elementwise by exp(scale * n), n standard normal clipped
//   to [-3, 3]: the sign of every value is kept, so a variance stays positive and a negative
//   slope stays negative. A zero moves by 0.1 * scale * |n| * rms (or 0.1 * scale * |n| when the
//   tensor is all zeros), upwards when no value of the tensor is negative, downwards when none
//   is positive, either way otherwise.
// - 8-bit and int32 weights move by 1-3 steps either way, saturating (as DeriveCheckpoint).
// NotFound names a name `weights` lacks.
Result<WeightMap> PerturbWeights(const Graph& graph, const WeightMap& weights,
                                 const std::vector<std::string>& names, uint64_t seed,
                                 double scale);

// The weights that are the exponent (input 1) of a Pow node anywhere in the graph.
std::set<std::string> PowExponentWeights(const Graph& graph);

}  // namespace kiln
