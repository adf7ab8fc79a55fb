// Helpers shared by the neural-network op families (ops layer, internal to ops/): attribute
// getters with defaults, dtype and shape requirements, numpy broadcasting of a parameter, and the
// sliding-window geometry that Conv and the pools share. Included by matmul.cc, conv.cc, pool.cc,
// norm.cc and vision.cc only.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "src/kiln/ops/registry.h"

namespace kiln::nn {

// ---------------------------------------------------------------------------------------------
// Attribute helpers: absent -> default, present but mistyped -> the typed getter's error.

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

inline std::string IntsToString(const std::vector<int64_t>& v) { return ShapeToString(v); }

// Whether optional output i is requested (present with a non-empty name).
inline bool WantsOutput(const Node& node, size_t i) {
  return i < node.outputs.size() && !node.outputs[i].empty();
}

inline Status RequireFloat32(const OpContext& ctx, size_t input) {
  if (ctx.type(input).dtype != DType::kFloat32) {
    return UnsupportedDType(ctx, ctx.type(input).dtype, "float32");
  }
  return Status::OK();
}

// Error unless input i is a rank-1 tensor of `n` elements.
inline Status RequireVector(const OpContext& ctx, size_t i, const char* role, int64_t n,
                            const std::string& why) {
  const Shape& s = ctx.type(i).shape;
  if (s.size() != 1 || s[0] != n) {
    return Status::InvalidArgument(ctx.where() + ": input " + std::to_string(i) + " ('" + role +
                                   "') has shape " + ShapeToString(s) + ", expected [" +
                                   std::to_string(n) + "] (" + why + ")");
  }
  return Status::OK();
}

// Materializes `t` broadcast (numpy rules, unidirectional) to `to` as floats.
// REQUIRES: t's shape broadcasts to `to`; t is float32.
inline std::vector<float> ExpandTo(const Tensor& t, const Shape& to) {
  const std::vector<int64_t> strides = BroadcastStrides(t.shape(), to);
  const int64_t n = NumElements(to);
  std::vector<float> out(static_cast<size_t>(n));
  std::vector<int64_t> idx(to.size(), 0);
  const float* src = t.data<float>();
  int64_t offset = 0;
  for (int64_t i = 0; i < n; ++i) {
    out[static_cast<size_t>(i)] = src[offset];
    for (int64_t d = static_cast<int64_t>(to.size()) - 1; d >= 0; --d) {
      const size_t u = static_cast<size_t>(d);
      if (++idx[u] < to[u]) {
        offset += strides[u];
        break;
      }
      offset -= strides[u] * (idx[u] - 1);
      idx[u] = 0;
    }
  }
  return out;
}

// True when `from` broadcasts to exactly `to` (numpy rules, `to` unchanged).
inline bool BroadcastsTo(const Shape& from, const Shape& to) {
  auto b = BroadcastShapes(from, to);
  return b.ok() && *b == to;
}

// ---------------------------------------------------------------------------------------------
// Sliding-window geometry (Conv, MaxPool, AveragePool).
//
// ONNX pads are [x1_begin, x2_begin, ..., x1_end, x2_end]. Output extent per spatial axis, with
// dk = (kernel - 1) * dilation + 1:
//   NOTSET/VALID: floor_or_ceil((in + pad_begin + pad_end - dk) / stride) + 1, VALID with zero
//                 pads; with ceil_mode a last window that would start in the end padding is
//                 dropped (PyTorch's rule, which exporters rely on).
//   SAME_UPPER/LOWER: ceil(in / stride), total pad = max(0, (out - 1) * stride + dk - in), the
//                 odd element at the end (UPPER) or the beginning (LOWER).

struct Window {
  int64_t rank = -1;            // spatial rank; -1 when not yet known (Conv without kernel_shape)
  std::vector<int64_t> kernel;  // empty when taken from Conv's weights
  std::vector<int64_t> strides, dilations, pads;
  std::string auto_pad = "NOTSET";
  bool ceil_mode = false;
};

// Reads the window attributes and validates what needs no shape: their types, auto_pad, and
// kernel_shape's presence (pools require it) and non-emptiness. The vectors stay as written
// (empty when absent) and rank stays -1; FitWindow completes them once the spatial rank is known.
// This is the part an op's prepare keeps.
inline Result<Window> ParseWindow(const Node& node, bool kernel_required) {
  Window w;
  KILN_ASSIGN_OR_RETURN(w.kernel, IntsOr(node, "kernel_shape", {}));
  KILN_ASSIGN_OR_RETURN(w.strides, IntsOr(node, "strides", {}));
  KILN_ASSIGN_OR_RETURN(w.dilations, IntsOr(node, "dilations", {}));
  KILN_ASSIGN_OR_RETURN(w.pads, IntsOr(node, "pads", {}));
  KILN_ASSIGN_OR_RETURN(w.auto_pad, StringOr(node, "auto_pad", "NOTSET"));
  KILN_ASSIGN_OR_RETURN(int64_t ceil_mode, IntOr(node, "ceil_mode", 0));
  w.ceil_mode = ceil_mode != 0;
  if (w.auto_pad != "NOTSET" && w.auto_pad != "SAME_UPPER" && w.auto_pad != "SAME_LOWER" &&
      w.auto_pad != "VALID") {
    return Status::InvalidArgument(node.Describe() + ": auto_pad='" + w.auto_pad +
                                   "' is not one of NOTSET, SAME_UPPER, SAME_LOWER, VALID");
  }
  if (!node.HasAttr("kernel_shape") && kernel_required) {
    return Status::InvalidArgument(node.Describe() + ": attribute 'kernel_shape' is required");
  }
  if (node.HasAttr("kernel_shape") && w.kernel.empty()) {
    return Status::InvalidArgument(node.Describe() + ": kernel_shape=[] is empty");
  }
  return w;
}

// Completes `w` (from ParseWindow) for `spatial_rank` (-1 in check, where no shape is known):
// takes Conv's kernel from its weights' spatial dims, checks every vector's length against the
// rank and its values against their minimum, and fills the absent ones with their defaults.
inline Result<Window> FitWindow(const Node& node, Window w, int64_t spatial_rank,
                                const std::vector<int64_t>* kernel_from_weights = nullptr) {
  if (kernel_from_weights != nullptr) {
    if (!w.kernel.empty() && w.kernel != *kernel_from_weights) {
      return Status::InvalidArgument(node.Describe() + ": kernel_shape=" + IntsToString(w.kernel) +
                                     " does not match the weights' spatial dims " +
                                     IntsToString(*kernel_from_weights));
    }
    w.kernel = *kernel_from_weights;
  }
  // The spatial rank: from the caller, else from whichever attribute carries it.
  w.rank = spatial_rank;
  if (w.rank < 0 && !w.kernel.empty()) w.rank = static_cast<int64_t>(w.kernel.size());
  if (w.rank < 0 && !w.strides.empty()) w.rank = static_cast<int64_t>(w.strides.size());
  if (w.rank < 0 && !w.dilations.empty()) w.rank = static_cast<int64_t>(w.dilations.size());
  if (w.rank < 0 && !w.pads.empty()) w.rank = static_cast<int64_t>(w.pads.size()) / 2;
  if (w.rank < 0) return w;  // nothing to cross-check yet
  const size_t r = static_cast<size_t>(w.rank);
  struct Attr {
    const char* name;
    std::vector<int64_t>* v;
    size_t size;
    int64_t min;
    int64_t dflt;
  };
  const Attr attrs[] = {{"kernel_shape", &w.kernel, r, 1, -1},
                        {"strides", &w.strides, r, 1, 1},
                        {"dilations", &w.dilations, r, 1, 1},
                        {"pads", &w.pads, 2 * r, 0, 0}};
  for (const Attr& a : attrs) {
    if (a.v->empty()) {
      if (a.dflt >= 0) a.v->assign(a.size, a.dflt);
      continue;
    }
    if (a.v->size() != a.size) {
      return Status::InvalidArgument(node.Describe() + ": " + a.name + "=" + IntsToString(*a.v) +
                                     " has " + std::to_string(a.v->size()) + " values, expected " +
                                     std::to_string(a.size) + " for " + std::to_string(r) +
                                     " spatial dims");
    }
    for (int64_t x : *a.v) {
      if (x < a.min) {
        return Status::InvalidArgument(node.Describe() + ": " + a.name + "=" + IntsToString(*a.v) +
                                       " has value " + std::to_string(x) +
                                       ", expected >= " + std::to_string(a.min));
      }
    }
  }
  return w;
}

// Reads and validates the window attributes in one step (ParseWindow, then FitWindow).
// `spatial_rank` is the rank when the caller knows it (from shapes), -1 in check. Pools require
// kernel_shape; Conv passes its weights' spatial dims.
inline Result<Window> ReadWindow(const Node& node, int64_t spatial_rank, bool kernel_required,
                                 const std::vector<int64_t>* kernel_from_weights = nullptr) {
  KILN_ASSIGN_OR_RETURN(Window w, ParseWindow(node, kernel_required));
  return FitWindow(node, std::move(w), spatial_rank, kernel_from_weights);
}

// Output extents and resolved pads (ONNX order) of `w` over input spatial dims `in`.
// REQUIRES: w.rank == in.size() and all window vectors filled (ReadWindow with a known rank).
inline Status ResolveWindow(const std::string& where, const Window& w, const Shape& in, Shape* out,
                            std::vector<int64_t>* pads) {
  const size_t r = in.size();
  out->assign(r, 0);
  pads->assign(2 * r, 0);
  for (size_t i = 0; i < r; ++i) {
    const int64_t s = w.strides[i];
    const int64_t dk = (w.kernel[i] - 1) * w.dilations[i] + 1;
    int64_t pb = 0, pe = 0, o = 0;
    if (w.auto_pad == "SAME_UPPER" || w.auto_pad == "SAME_LOWER") {
      o = (in[i] + s - 1) / s;
      const int64_t total = std::max<int64_t>(0, (o - 1) * s + dk - in[i]);
      pb = w.auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
      pe = total - pb;
    } else {
      if (w.auto_pad == "NOTSET") {
        pb = w.pads[i];
        pe = w.pads[i + r];
      }
      const int64_t span = in[i] + pb + pe - dk;
      if (span < 0) {
        return Status::InvalidArgument(
            where + ": dilated kernel extent " + std::to_string(dk) + " exceeds padded input " +
            std::to_string(in[i] + pb + pe) + " along spatial axis " + std::to_string(i) +
            " (input " + IntsToString(in) + ", kernel_shape=" + IntsToString(w.kernel) +
            ", dilations=" + IntsToString(w.dilations) + ")");
      }
      o = (w.ceil_mode ? (span + s - 1) / s : span / s) + 1;
      if (w.ceil_mode && (o - 1) * s >= in[i] + pb) --o;
    }
    (*out)[i] = o;
    (*pads)[i] = pb;
    (*pads)[i + r] = pe;
  }
  return Status::OK();
}

inline Status CheckBinary(const Node& node, int64_t /*opset*/) { return CheckArity(node, 2, 2); }
inline Status CheckUnary(const Node& node, int64_t /*opset*/) { return CheckArity(node, 1, 1); }

}  // namespace kiln::nn
