// Checkpoint binding and derivation (graph layer).
#include "src/kiln/graph/checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "src/kiln/tensor/safetensors.h"

namespace kiln {

WeightMap GraphWeights(const Graph& graph) {
  WeightMap out;
  for (const auto& [name, t] : graph.initializers) {
    if (graph.IsWeight(name)) out.emplace(name, t);
  }
  return out;
}

Result<WeightMap> BindCheckpoint(const Graph& graph, const WeightMap& checkpoint,
                                 const std::string& what, bool require_complete) {
  WeightMap bound = GraphWeights(graph);
  for (const auto& [name, t] : checkpoint) {
    auto it = bound.find(name);
    if (it == bound.end()) {
      auto init = graph.initializers.find(name);
      if (init != graph.initializers.end() && init->second.dtype() == t.dtype() &&
          init->second.shape() == t.shape() &&
          std::memcmp(init->second.raw_data(), t.raw_data(), t.nbytes()) == 0) {
        continue;  // naive exporters save structural constants too: harmless when unchanged
      }
      if (init != graph.initializers.end()) {
        return Status::InvalidArgument(what + ": tensor '" + name + "' names a structural " +
                                       "constant (" + init->second.TypeString() +
                                       "), which is part of the graph and cannot be replaced");
      }
      return Status::NotFound(what + ": tensor '" + name +
                              "' is not a weight of the graph (no initializer or Constant of "
                              "that name)");
    }
    if (t.dtype() != it->second.dtype() || t.shape() != it->second.shape()) {
      return Status::InvalidArgument(what + ": tensor '" + name + "' is " + t.TypeString() +
                                     ", the graph expects " + it->second.TypeString());
    }
    it->second = t;
  }
  if (require_complete) {
    for (const auto& [name, t] : bound) {
      if (!checkpoint.count(name)) {
        return Status::NotFound(what + ": weight '" + name + "' (" + t.TypeString() +
                                ") is missing from the checkpoint");
      }
    }
  }
  return bound;
}

Result<WeightMap> LoadCheckpoint(const Graph& graph, const std::string& path,
                                 bool require_complete) {
  KILN_ASSIGN_OR_RETURN(SafetensorsFile file, ReadSafetensors(path));
  return BindCheckpoint(graph, file.tensors, "checkpoint '" + path + "'", require_complete);
}

namespace {

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t NameHash(const std::string& s) {  // FNV-1a: portable, stable
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

double Uniform(uint64_t& state) {  // (0, 1]
  return (static_cast<double>(SplitMix64(state) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
}

}  // namespace

namespace {

// Quantized weights, zero points and int32 biases: shifted by 1-3 steps either way, saturating,
// so a cell that baked any of them in would differ on the shifted values. The shifted values are
// computed in float64 and cast back: the cast saturates.
Result<Tensor> ShiftIntegers(const Tensor& t, uint64_t state) {
  KILN_ASSIGN_OR_RETURN(Tensor shifted, t.CastTo(DType::kFloat64));
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double u = Uniform(state);
    shifted.data<double>()[i] += (u < 0.5 ? -1 : 1) * (1 + static_cast<int64_t>(u * 6) % 3);
  }
  return shifted.CastTo(t.dtype());
}

void SetFloat(Tensor& t, int64_t i, double v) {
  if (t.dtype() == DType::kFloat32) {
    t.data<float>()[i] = static_cast<float>(v);
  } else if (t.dtype() == DType::kFloat64) {
    t.data<double>()[i] = v;
  } else {
    t.data<uint16_t>()[i] = FloatToHalf(static_cast<float>(v));
  }
}

double Normal(uint64_t& state) {  // Box-Muller with +,*,log,sqrt,cos only: portable
  const double u1 = Uniform(state), u2 = Uniform(state);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

void CollectPowExponents(const Graph& g, std::set<std::string>& out) {
  for (const Node& n : g.nodes) {
    if (n.domain.empty() && n.op_type == "Pow" && n.inputs.size() > 1) out.insert(n.inputs[1]);
    for (const Graph* sub : Subgraphs(n)) CollectPowExponents(*sub, out);
  }
}

}  // namespace

std::set<std::string> PowExponentWeights(const Graph& graph) {
  std::set<std::string> used, out;
  CollectPowExponents(graph, used);
  for (const std::string& name : used) {
    if (graph.IsWeight(name)) out.insert(name);
  }
  return out;
}

Result<WeightMap> PerturbWeights(const Graph& graph, const WeightMap& weights,
                                 const std::vector<std::string>& names, uint64_t seed,
                                 double scale) {
  WeightMap out = weights;
  const std::set<std::string> exponents = PowExponentWeights(graph);
  for (const std::string& name : names) {
    auto it = out.find(name);
    if (it == out.end()) {
      return Status::NotFound("perturbation: no weight named '" + name + "'");
    }
    const Tensor& w = it->second;
    uint64_t state = seed ^ NameHash(name);
    if (w.numel() == 0) continue;
    if (w.dtype() == DType::kInt8 || w.dtype() == DType::kUInt8 || w.dtype() == DType::kInt32) {
      KILN_ASSIGN_OR_RETURN(it->second, ShiftIntegers(w, state));
      continue;
    }
    if (!IsFloatDType(w.dtype())) continue;
    KILN_ASSIGN_OR_RETURN(Tensor t, w.Clone());
    bool integral = true, any_neg = false, any_pos = false;
    double sumsq = 0;
    for (int64_t i = 0; i < t.numel(); ++i) {
      const double v = t.GetAsDouble(i);
      integral = integral && std::isfinite(v) && v == std::floor(v);
      any_neg = any_neg || v < 0;
      any_pos = any_pos || v > 0;
      sumsq += v * v;
    }
    if (integral && exponents.count(name)) {
      const double step = (seed & 1) ? 4.0 : 2.0;
      for (int64_t i = 0; i < t.numel(); ++i) SetFloat(t, i, t.GetAsDouble(i) + step);
      it->second = std::move(t);
      continue;
    }
    const double rms = std::sqrt(sumsq / static_cast<double>(t.numel()));
    const double zero_step = 0.1 * scale * (rms > 0 ? rms : 1.0);
    for (int64_t i = 0; i < t.numel(); ++i) {
      const double n = std::clamp(Normal(state), -3.0, 3.0);
      const double v = t.GetAsDouble(i);
      if (v != 0) {
        SetFloat(t, i, v * std::exp(scale * n));
      } else {
        const double up =
            any_neg && !any_pos ? -1.0 : (any_pos && !any_neg ? 1.0 : (n < 0 ? -1.0 : 1.0));
        SetFloat(t, i, up * zero_step * std::max(std::fabs(n), 0.25));
      }
    }
    it->second = std::move(t);
  }
  return out;
}

Result<WeightMap> DeriveCheckpoint(const Graph& graph, uint64_t seed, double scale) {
  WeightMap out;
  for (const auto& [name, w] : GraphWeights(graph)) {
    KILN_ASSIGN_OR_RETURN(Tensor t, w.Clone());
    if (IsFloatDType(t.dtype()) && t.numel() > 0) {
      double sumsq = 0;
      for (int64_t i = 0; i < t.numel(); ++i) sumsq += t.GetAsDouble(i) * t.GetAsDouble(i);
      double rms = std::sqrt(sumsq / static_cast<double>(t.numel()));
      if (rms == 0) rms = 1e-2;
      uint64_t state = seed ^ NameHash(name);
      for (int64_t i = 0; i < t.numel(); ++i) {
        // Box-Muller; uses only +,*,log,sqrt,cos so results are the same wherever libm is IEEE.
        const double u1 = Uniform(state), u2 = Uniform(state);
        const double n = std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
        const double v = t.GetAsDouble(i) + scale * rms * n;
        if (t.dtype() == DType::kFloat32) {
          t.data<float>()[i] = static_cast<float>(v);
        } else if (t.dtype() == DType::kFloat64) {
          t.data<double>()[i] = v;
        } else {
          t.data<uint16_t>()[i] = FloatToHalf(static_cast<float>(v));
        }
      }
    } else if (t.numel() > 0 && (t.dtype() == DType::kInt8 || t.dtype() == DType::kUInt8 ||
                                 t.dtype() == DType::kInt32)) {
      KILN_ASSIGN_OR_RETURN(t, ShiftIntegers(t, seed ^ NameHash(name)));
    }
    out.emplace(name, std::move(t));
  }
  return out;
}

}  // namespace kiln
