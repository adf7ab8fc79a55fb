// The pooling op family: MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool (ops layer).
//
// Listed by PoolOpDefs (registered by registry.cc). Plain loops over the window geometry
// of nn_common.h; MaxPool, which only compares, also takes float16, float64, int8 and uint8.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "src/kiln/ops/dnnl_kernels.h"
#include "src/kiln/ops/nn_common.h"
#include "src/kiln/ops/registry.h"

namespace kiln {
namespace {

using namespace nn;

// ---------------------------------------------------------------------------------------------
// MaxPool / AveragePool: plain loops over 1-3 spatial dims, lifted to 3-D with unit leading
// dims so one loop nest serves all ranks.
//
// MaxPool's optional output 1 (Indices, int64) holds, per output element, where its maximum sits
// in X flattened: plane * in_plane + the position inside the plane, row major (storage_order=0)
// or column major (storage_order=1, the first spatial axis fastest). Padding is never pointed
// at; on ties the first tap in window order wins, as onnxruntime does.

enum class PoolKind { kMax, kAverage };

struct PoolGeometry {
  int64_t planes = 0;  // N * C
  // Per axis (depth, height, width); unused leading axes have size 1 and no padding.
  std::array<int64_t, 3> in{1, 1, 1}, out{1, 1, 1}, kernel{1, 1, 1}, stride{1, 1, 1},
      dilation{1, 1, 1}, pad_begin{0, 0, 0}, pad_end{0, 0, 0};
  Shape out_shape;
};

Result<int64_t> StorageOrder(const Node& node) {
  KILN_ASSIGN_OR_RETURN(int64_t storage_order, IntOr(node, "storage_order", 0));
  if (storage_order != 0 && storage_order != 1) {
    return Status::InvalidArgument(node.Describe() +
                                   ": storage_order=" + std::to_string(storage_order) +
                                   " is invalid (expected 0, row major, or 1, column major)");
  }
  return storage_order;
}

Status CheckPool(const Node& node, int64_t /*opset*/) {
  const bool max = node.op_type == "MaxPool";
  KILN_RETURN_IF_ERROR(CheckArity(node, 1, 1, max ? 2 : 1));
  KILN_RETURN_IF_ERROR(ReadWindow(node, -1, /*kernel_required=*/true).status());
  if (max) KILN_RETURN_IF_ERROR(StorageOrder(node).status());
  KILN_RETURN_IF_ERROR(IntOr(node, "count_include_pad", 0).status());
  return Status::OK();
}

// A pool's attributes: the window as written (fitted to X's rank per call), count_include_pad
// (lenient, as the kernel always read it) and, for MaxPool, storage_order.
struct PoolAttrs : PreparedNode {
  Window window;
  bool count_include_pad = false;
  int64_t storage_order = 0;
};

Result<PoolAttrs> ParsePoolAttrs(const Node& node, int64_t /*opset*/) {
  PoolAttrs a;
  KILN_ASSIGN_OR_RETURN(a.window, ParseWindow(node, /*kernel_required=*/true));
  a.count_include_pad = node.GetInt("count_include_pad", 0) != 0;
  if (node.op_type == "MaxPool") {
    KILN_ASSIGN_OR_RETURN(a.storage_order, StorageOrder(node));
  }
  return a;
}

// MaxPool compares values, so it takes every dtype ONNX lists for it; AveragePool divides and is
// float32 only.
Status RequirePoolDType(const OpContext& ctx, PoolKind kind) {
  const DType t = ctx.type(0).dtype;
  if (kind == PoolKind::kAverage) return RequireFloat32(ctx, 0);
  if (t == DType::kFloat32 || t == DType::kFloat16 || t == DType::kFloat64 || t == DType::kInt8 ||
      t == DType::kUInt8) {
    return Status::OK();
  }
  return UnsupportedDType(ctx, t, "float32, float16, float64, int8, uint8");
}

Result<PoolGeometry> PoolShapes(const OpContext& ctx, const PoolAttrs** attrs, PoolAttrs* scratch) {
  const Shape& x = ctx.type(0).shape;
  if (x.size() < 3) {
    return Status::InvalidArgument(ctx.where() + ": X " + ShapeToString(x) +
                                   " must have rank >= 3 ([N, C, spatial...])");
  }
  if (x.size() > 5) {
    return Status::Unimplemented(ctx.where() + ": pooling over " + std::to_string(x.size() - 2) +
                                 " spatial dims is not supported (supported: 1 to 3)");
  }
  const Shape in_spatial(x.begin() + 2, x.end());
  const int64_t rank = static_cast<int64_t>(in_spatial.size());
  KILN_ASSIGN_OR_RETURN(*attrs, PreparedOr(ctx, scratch, ParsePoolAttrs));
  KILN_ASSIGN_OR_RETURN(Window win, FitWindow(ctx.node(), (*attrs)->window, rank));
  Shape out_spatial;
  std::vector<int64_t> pads;
  KILN_RETURN_IF_ERROR(ResolveWindow(ctx.where(), win, in_spatial, &out_spatial, &pads));
  PoolGeometry g;
  g.planes = x[0] * x[1];
  const size_t lead = 3 - in_spatial.size();
  for (size_t i = 0; i < in_spatial.size(); ++i) {
    g.in[lead + i] = in_spatial[i];
    g.out[lead + i] = out_spatial[i];
    g.kernel[lead + i] = win.kernel[i];
    g.stride[lead + i] = win.strides[i];
    g.dilation[lead + i] = win.dilations[i];
    g.pad_begin[lead + i] = pads[i];
    g.pad_end[lead + i] = pads[i + in_spatial.size()];
  }
  g.out_shape = {x[0], x[1]};
  g.out_shape.insert(g.out_shape.end(), out_spatial.begin(), out_spatial.end());
  return g;
}

template <PoolKind kKind>
Result<std::vector<TensorType>> InferPool(const OpContext& ctx) {
  KILN_RETURN_IF_ERROR(RequirePoolDType(ctx, kKind));
  const PoolAttrs* attrs = nullptr;
  PoolAttrs scratch;
  KILN_ASSIGN_OR_RETURN(PoolGeometry g, PoolShapes(ctx, &attrs, &scratch));
  std::vector<TensorType> out{{ctx.type(0).dtype, g.out_shape}};
  if (kKind == PoolKind::kMax && ctx.node().outputs.size() > 1) {  // a slot, named or not
    out.push_back({DType::kInt64, g.out_shape});
  }
  return out;
}

// Max ignores padding. Average divides by the taps inside the input, or with
// count_include_pad by the taps inside the padded input (taps past the end padding, which
// ceil_mode can create, never count). T is float, double, int8_t or uint8_t; every value widens
// exactly to double, so max compares exactly. `indices` (max only, may be null) receives the
// position of each maximum in X, `index_base` + the position inside the plane, row or column
// major.
template <PoolKind kKind, typename T>
void PoolPlane(const PoolGeometry& g, bool count_include_pad, bool column_major, int64_t index_base,
               const T* x, T* y, int64_t* indices) {
  // Per-axis strides of a position inside the plane, for Indices.
  const std::array<int64_t, 3> index_stride =
      column_major ? std::array<int64_t, 3>{1, g.in[0], g.in[0] * g.in[1]}
                   : std::array<int64_t, 3>{g.in[1] * g.in[2], g.in[2], 1};
  for (int64_t od = 0; od < g.out[0]; ++od) {
    for (int64_t oh = 0; oh < g.out[1]; ++oh) {
      for (int64_t ow = 0; ow < g.out[2]; ++ow) {
        const int64_t start[3] = {od * g.stride[0] - g.pad_begin[0],
                                  oh * g.stride[1] - g.pad_begin[1],
                                  ow * g.stride[2] - g.pad_begin[2]};
        double acc = kKind == PoolKind::kMax ? -std::numeric_limits<double>::infinity() : 0.0;
        int64_t inside = 0, padded = 0, arg = -1;
        for (int64_t kd = 0; kd < g.kernel[0]; ++kd) {
          const int64_t id = start[0] + kd * g.dilation[0];
          for (int64_t kh = 0; kh < g.kernel[1]; ++kh) {
            const int64_t ih = start[1] + kh * g.dilation[1];
            for (int64_t kw = 0; kw < g.kernel[2]; ++kw) {
              const int64_t iw = start[2] + kw * g.dilation[2];
              const int64_t pos[3] = {id, ih, iw};
              bool in_input = true, in_padded = true;
              for (int a = 0; a < 3; ++a) {
                in_input &= pos[a] >= 0 && pos[a] < g.in[a];
                in_padded &= pos[a] >= -g.pad_begin[a] && pos[a] < g.in[a] + g.pad_end[a];
              }
              padded += in_padded;
              if (!in_input) continue;
              ++inside;
              const double v = static_cast<double>(x[(id * g.in[1] + ih) * g.in[2] + iw]);
              if constexpr (kKind == PoolKind::kMax) {
                // NaN propagates (as in PyTorch) rather than being skipped; the first NaN is
                // the one Indices points at.
                if (arg < 0 || (!std::isnan(acc) && (std::isnan(v) || v > acc))) {
                  acc = v;
                  arg = id * index_stride[0] + ih * index_stride[1] + iw * index_stride[2];
                }
              } else {
                acc += v;
              }
            }
          }
        }
        const int64_t o = (od * g.out[1] + oh) * g.out[2] + ow;
        if constexpr (kKind == PoolKind::kMax) {
          if (inside == 0) {  // a window wholly in padding: no tap to take
            y[o] = std::numeric_limits<T>::has_infinity ? -std::numeric_limits<T>::infinity()
                                                        : std::numeric_limits<T>::lowest();
            if (indices != nullptr) indices[o] = -1;
          } else {
            y[o] = static_cast<T>(acc);
            if (indices != nullptr) indices[o] = index_base + arg;
          }
        } else {
          const int64_t count = count_include_pad ? padded : inside;
          y[o] = count > 0 ? static_cast<T>(acc / static_cast<double>(count)) : T(0);
        }
      }
    }
  }
}

template <PoolKind kKind, typename T>
void PoolPlanes(const PoolGeometry& g, bool count_include_pad, bool column_major, const T* x, T* y,
                int64_t* indices) {
  const int64_t in_plane = g.in[0] * g.in[1] * g.in[2];
  const int64_t out_plane = g.out[0] * g.out[1] * g.out[2];
  for (int64_t p = 0; p < g.planes; ++p) {
    PoolPlane<kKind, T>(g, count_include_pad, column_major, p * in_plane, x + p * in_plane,
                        y + p * out_plane, indices == nullptr ? nullptr : indices + p * out_plane);
  }
}

template <PoolKind kKind>
Status RunPool(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_RETURN_IF_ERROR(RequirePoolDType(ctx, kKind));
  const PoolAttrs* attrs = nullptr;
  PoolAttrs scratch;
  KILN_ASSIGN_OR_RETURN(PoolGeometry g, PoolShapes(ctx, &attrs, &scratch));
  const bool count_include_pad = attrs->count_include_pad;
  const bool column_major = kKind == PoolKind::kMax && attrs->storage_order == 1;
  int64_t* indices =
      WantsOutput(ctx.node(), 1) && outputs.size() > 1 ? outputs[1].data<int64_t>() : nullptr;
  const Tensor& x = ctx.in(0);
  auto pool = [&](auto element) {
    using T = decltype(element);
    PoolPlanes<kKind>(g, count_include_pad, column_major, x.data<T>(), outputs[0].data<T>(),
                      indices);
    return Status::OK();
  };
  switch (x.dtype()) {
    case DType::kFloat32:
      return pool(float{});
    case DType::kFloat64:
      return pool(double{});
    case DType::kInt8:
      return pool(int8_t{});
    case DType::kUInt8:
      return pool(uint8_t{});
    case DType::kFloat16: {
      // Widened to float32 and narrowed back: exact, since max only picks an input value.
      KILN_ASSIGN_OR_RETURN(Tensor wide, x.CastTo(DType::kFloat32));
      KILN_ASSIGN_OR_RETURN(Tensor y, Tensor::Empty(DType::kFloat32, outputs[0].shape()));
      PoolPlanes<kKind>(g, count_include_pad, column_major, wide.data<float>(), y.data<float>(),
                        indices);
      KILN_ASSIGN_OR_RETURN(Tensor half, y.CastTo(DType::kFloat16));
      std::memcpy(outputs[0].raw_data(), half.raw_data(), half.nbytes());
      return Status::OK();
    }
    default:
      return UnsupportedDType(ctx, x.dtype(), "float32, float16, float64, int8, uint8");
  }
}

// GlobalAveragePool / GlobalMaxPool: one value per (n, c) plane, spatial dims become 1.

Result<std::vector<TensorType>> InferGlobalPool(const OpContext& ctx) {
  const Shape& x = ctx.type(0).shape;
  if (x.size() < 2) {
    return Status::InvalidArgument(ctx.where() + ": X " + ShapeToString(x) +
                                   " must have rank >= 2 ([N, C, spatial...])");
  }
  Shape out = x;
  std::fill(out.begin() + 2, out.end(), 1);
  return std::vector<TensorType>{{ctx.type(0).dtype, out}};
}

template <PoolKind kKind>
Status RunGlobalPool(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_RETURN_IF_ERROR(RequireFloat32(ctx, 0));
  const Tensor& xt = ctx.in(0);
  const int64_t planes = xt.dim(0) * xt.dim(1);
  const int64_t plane = planes == 0 ? 0 : xt.numel() / planes;
  const float* x = xt.data<float>();
  float* y = outputs[0].data<float>();
  for (int64_t p = 0; p < planes; ++p) {
    const float* src = x + p * plane;
    if constexpr (kKind == PoolKind::kMax) {
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t i = 0; i < plane; ++i) {
        if (std::isnan(src[i]) || src[i] > m) m = src[i];
      }
      y[p] = m;
    } else {
      double sum = 0;
      for (int64_t i = 0; i < plane; ++i) sum += src[i];
      y[p] = plane > 0 ? static_cast<float>(sum / static_cast<double>(plane)) : 0.0f;
    }
  }
  return Status::OK();
}

}  // namespace

std::vector<OpDef> PoolOpDefs() {
  // std::array of exactly the family's count: adding an op without growing it fails to compile;
  // a missing row would leave infer/run null, which Register rejects.
  const std::array<OpDef, 4> table = {{
      {"MaxPool", "", 1, INT64_MAX, CheckPool, InferPool<PoolKind::kMax>, RunPool<PoolKind::kMax>,
       PrepareWith<PoolAttrs, ParsePoolAttrs>},
      {"AveragePool", "", 1, INT64_MAX, CheckPool, InferPool<PoolKind::kAverage>,
       RunPool<PoolKind::kAverage>, PrepareWith<PoolAttrs, ParsePoolAttrs>},
      {"GlobalAveragePool", "", 1, INT64_MAX, CheckUnary, InferGlobalPool,
       RunGlobalPool<PoolKind::kAverage>},
      {"GlobalMaxPool", "", 1, INT64_MAX, CheckUnary, InferGlobalPool,
       RunGlobalPool<PoolKind::kMax>},
  }};
  return {table.begin(), table.end()};
}

}  // namespace kiln
