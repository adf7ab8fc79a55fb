// Helpers for the reference kernels of the less common op families (ops layer, internal to
// ops/): element access through double, attribute defaults, and numpy broadcasting of an index.
//
// The families that use these (math_ops.cc, loss.cc, signal.cc, vision.cc, tensor_ops.cc,
// training.cc, random.cc) are reference kernels first: clarity over speed. They compute in
// double and round once to the output's element type, so float16 and float32 outputs are the
// correctly rounded results of a wider computation, and one kernel serves every float width.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "src/kiln/ops/registry.h"

namespace kiln::kernel {

// Every element of `t` as double (any numeric dtype; bool is 0/1).
inline std::vector<double> ToDoubles(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  if (t.dtype() == DType::kFloat32) {
    const float* p = t.data<float>();
    for (size_t i = 0; i < v.size(); ++i) v[i] = p[i];
  } else if (t.dtype() == DType::kFloat64) {
    std::memcpy(v.data(), t.raw_data(), v.size() * sizeof(double));
  } else {
    for (size_t i = 0; i < v.size(); ++i) v[i] = t.GetAsDouble(static_cast<int64_t>(i));
  }
  return v;
}

// Every element of an integer or bool tensor as int64.
inline std::vector<int64_t> ToInt64s(const Tensor& t) { return t.ToInt64Vector(); }

// Writes `v` into `out` (allocated, v.size() == numel), rounding once to out's dtype: floats
// round to nearest, integers truncate toward zero (ONNX Cast), bool is v != 0.
inline Status StoreDoubles(const std::vector<double>& v, Tensor& out) {
  if (static_cast<int64_t>(v.size()) != out.numel()) {
    return Status::Internal("StoreDoubles: " + std::to_string(v.size()) + " values for " +
                            out.TypeString());
  }
  if (out.dtype() == DType::kFloat32) {
    float* p = out.data<float>();
    for (size_t i = 0; i < v.size(); ++i) p[i] = static_cast<float>(v[i]);
    return Status::OK();
  }
  if (out.dtype() == DType::kFloat64) {
    std::memcpy(out.raw_data(), v.data(), v.size() * sizeof(double));
    return Status::OK();
  }
  KILN_ASSIGN_OR_RETURN(Tensor wide,
                        Tensor::FromVector<double>(out.shape(), v).CastTo(out.dtype()));
  std::memcpy(out.raw_data(), wide.raw_data(), out.nbytes());
  return Status::OK();
}

// Same for int64 values.
inline Status StoreInt64s(const std::vector<int64_t>& v, Tensor& out) {
  if (static_cast<int64_t>(v.size()) != out.numel()) {
    return Status::Internal("StoreInt64s: " + std::to_string(v.size()) + " values for " +
                            out.TypeString());
  }
  if (out.dtype() == DType::kInt64) {
    std::memcpy(out.raw_data(), v.data(), v.size() * sizeof(int64_t));
    return Status::OK();
  }
  KILN_ASSIGN_OR_RETURN(Tensor wide,
                        Tensor::FromVector<int64_t>(out.shape(), v).CastTo(out.dtype()));
  std::memcpy(out.raw_data(), wide.raw_data(), out.nbytes());
  return Status::OK();
}

// For each element of `out` in row-major order, the offset of the element of a tensor of shape
// `in` that numpy broadcasting reads. REQUIRES: `in` broadcasts to `out`.
inline std::vector<int64_t> BroadcastOffsets(const Shape& in, const Shape& out) {
  const std::vector<int64_t> strides = BroadcastStrides(in, out);
  const int64_t n = NumElements(out);
  std::vector<int64_t> offsets(static_cast<size_t>(n));
  std::vector<int64_t> idx(out.size(), 0);
  int64_t off = 0;
  for (int64_t i = 0; i < n; ++i) {
    offsets[static_cast<size_t>(i)] = off;
    for (size_t d = out.size(); d-- > 0;) {
      if (++idx[d] < out[d]) {
        off += strides[d];
        break;
      }
      off -= strides[d] * (idx[d] - 1);
      idx[d] = 0;
    }
  }
  return offsets;
}

inline bool IsFloatLike(DType t) {
  return t == DType::kFloat32 || t == DType::kFloat64 || t == DType::kFloat16 ||
         t == DType::kBFloat16;
}

// Unimplemented naming the op and the float types it takes unless input i is one of them.
inline Status RequireFloatInput(const OpContext& ctx, size_t i) {
  if (IsFloatLike(ctx.type(i).dtype)) return Status::OK();
  return UnsupportedDType(ctx, ctx.type(i).dtype, "float32, float64, float16, bfloat16");
}

inline Status RequireIntegerInput(const OpContext& ctx, size_t i) {
  const DType t = ctx.type(i).dtype;
  if (t == DType::kInt64 || t == DType::kInt32) return Status::OK();
  return UnsupportedDType(ctx, t, "int64, int32");
}

// Attribute getters: absent -> default, present but mistyped -> the typed getter's error.
inline Result<int64_t> IntOr(const Node& node, const std::string& attr, int64_t dflt) {
  if (!node.HasAttr(attr)) return dflt;
  return node.GetInt(attr);
}
inline Result<float> FloatOr(const Node& node, const std::string& attr, float dflt) {
  if (!node.HasAttr(attr)) return dflt;
  return node.GetFloat(attr);
}
inline Result<std::string> StringOr(const Node& node, const std::string& attr,
                                    const std::string& dflt) {
  if (!node.HasAttr(attr)) return dflt;
  return node.GetString(attr);
}
inline Result<std::vector<int64_t>> IntsOr(const Node& node, const std::string& attr,
                                           std::vector<int64_t> dflt) {
  if (!node.HasAttr(attr)) return dflt;
  return node.GetInts(attr);
}

// InvalidArgument "<Op> 'n': attribute 'attr'=value is invalid (expected ...)".
inline Status BadAttr(const Node& node, const std::string& attr, const std::string& value,
                      const std::string& expected) {
  return Status::InvalidArgument(node.Describe() + ": attribute '" + attr + "'=" + value +
                                 " is invalid (expected " + expected + ")");
}

// InvalidArgument "<Op> 'n': input i ('role') has shape [..], expected ...".
inline Status BadInputShape(const OpContext& ctx, size_t i, const char* role,
                            const std::string& expected) {
  return Status::InvalidArgument(ctx.where() + ": input " + std::to_string(i) + " ('" + role +
                                 "') has shape " + ShapeToString(ctx.type(i).shape) +
                                 ", expected " + expected);
}

inline bool WantsOutput(const Node& node, size_t i) {
  return i < node.outputs.size() && !node.outputs[i].empty();
}

}  // namespace kiln::kernel

namespace kiln::kernel {

// The generator behind kiln's random ops (Bernoulli, RandomUniform*, RandomNormal*, Multinomial,
// training-mode Dropout): xoshiro256** seeded through splitmix64. Written out rather than taken
// from <random>, whose distributions are free to differ between standard libraries: the same
// seed gives the same draws on every machine, in eager and in a cell's host call alike.
class Rng {
 public:
  explicit Rng(uint64_t seed) {
    for (uint64_t& s : s_) {
      seed += 0x9e3779b97f4a7c15ull;
      uint64_t z = seed;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      s = z ^ (z >> 31);
    }
  }
  uint64_t Next() {
    const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }
  // Uniform in [0, 1), 53 random bits.
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  // Standard normal (Box-Muller; one draw of each pair is used, so draws do not depend on
  // how many came before in pairs).
  double Normal() {
    double u1 = Uniform();
    while (u1 <= 0.0) u1 = Uniform();
    const double u2 = Uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * 3.14159265358979323846 * u2);
  }

 private:
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

// kiln's seed for a random node without a `seed` attribute. Every run of a graph draws the same
// values (reproducible serving, and a cell proven against eager on equal draws); two such nodes
// differ when their node names do (exporters name every node).
inline constexpr uint64_t kDefaultSeed = 0x6b696c6e5eedull;

// The seed of a random node: its `seed` attribute (a float in the generator ops, an int in
// Dropout; its value, not its bits, so 1.0 and 1 agree), else kDefaultSeed mixed with the
// node's name (FNV-1a). Only what a compiled cell's node spec carries too (never a value name,
// which lowering may change), so eager and the cell's host call draw alike.
inline uint64_t NodeSeed(const Node& node) {
  auto it = node.attrs.find("seed");
  if (it != node.attrs.end()) {
    if (it->second.kind == Attribute::Kind::kFloat) {
      return static_cast<uint64_t>(static_cast<int64_t>(it->second.f));
    }
    if (it->second.kind == Attribute::Kind::kInt) return static_cast<uint64_t>(it->second.i);
  }
  uint64_t h = 1469598103934665603ull;
  for (char c : node.name) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return kDefaultSeed ^ h;
}

}  // namespace kiln::kernel

namespace kiln::kernel {

// Cast and CastLike at `opset`: Tensor::CastTo, except that a conversion to bfloat16 before
// opset 19 truncates the dropped 16 bits (the rule of ONNX's reference until opset 19 made
// round-to-nearest-even the rule, which CastTo follows).
inline Result<Tensor> CastForOp(const Tensor& in, DType to, int64_t opset) {
  if (to != DType::kBFloat16 || opset >= 19 || in.dtype() == DType::kBFloat16) {
    return in.CastTo(to);
  }
  KILN_ASSIGN_OR_RETURN(Tensor wide, in.CastTo(DType::kFloat32));
  KILN_ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(DType::kBFloat16, in.shape()));
  const float* src = wide.data<float>();
  uint16_t* dst = out.data<uint16_t>();
  for (int64_t i = 0; i < out.numel(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &src[i], 4);
    // NaN keeps a quiet NaN (truncation could leave only the exponent: infinity).
    dst[i] = std::isnan(src[i]) ? static_cast<uint16_t>((bits >> 16) | 0x40u)
                                : static_cast<uint16_t>(bits >> 16);
  }
  return out;
}

}  // namespace kiln::kernel

namespace kiln::kernel {

// Puts a computed `value` into an op's output slot: copied into the caller's buffer when that
// is plain bytes of the same type, the handle itself when the value is not plain bytes (a
// string tensor, a sequence, an optional) or the slot is unallocated.
inline Status Deliver(const Tensor& value, Tensor& out) {
  if (!out.valid() || !value.is_tensor() || value.dtype() == DType::kString) {
    out = value;
    return Status::OK();
  }
  if (out.dtype() != value.dtype() || out.shape() != value.shape()) {
    return Status::Internal("an op computed " + value.TypeString() + " for an output planned as " +
                            out.TypeString());
  }
  if (value.nbytes() > 0) std::memcpy(out.raw_data(), value.raw_data(), value.nbytes());
  return Status::OK();
}

}  // namespace kiln::kernel
