// Resize op family (ops layer): Resize (opset 10+) and Upsample (opset 7-9), with modes nearest,
// linear (n-linear over every resized axis) and cubic, and every coordinate_transformation_mode.
//
// ResizeOpDefs is registered by OpRegistry::Global() (registry.cc). Semantics follow the ONNX
// operator spec and its reference implementation, so coordinates are computed in double with the
// "output width" of an axis taken as scale * input length (not the rounded output length), and
// the neighbours of a source coordinate x are picked as ONNX picks them: for linear floor(x) and
// floor(x) + 1, for cubic floor(x) - 1 ... floor(x) + 2, with an integral x counted as the right
// neighbour of its left interval (ratio 1). Neighbours outside the input repeat the edge element
// unless exclude_outside=1 drops them and renormalizes the weights.
//
// Legacy forms: Upsample-7/8 take `scales` as an attribute, Upsample-9 and Resize-10 as input 1;
// they have no coordinate_transformation_mode (asymmetric) and their nearest rule truncates when
// upsampling and rounds up when downsampling (onnxruntime's legacy rule). Resize-11+ takes
// (X, roi, scales, sizes); Resize-18 adds axes, keep_aspect_ratio_policy and antialias (antialias=1
// is not implemented and rejected by name).
//
// Kernels: nearest copies element bytes through one index table per axis, so it takes every
// dtype; linear and cubic are float32, applied one resized axis at a time in double (the weights
// are separable, so this equals the ONNX n-D sum), with tf_crop_and_resize positions outside the
// region of interest set to extrapolation_value at the end.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "src/kiln/ops/registry.h"

namespace kiln {
namespace {

Status Invalid(const OpContext& ctx, const std::string& msg) {
  return Status::InvalidArgument(ctx.where() + ": " + msg);
}
Status Invalid(const Node& node, const std::string& msg) {
  return Status::InvalidArgument(node.Describe() + ": " + msg);
}

// ---------------------------------------------------------------------------------------------
// Attributes

// Parsed and validated by check and, once per node, by prepare; infer and run read the prepared
// copy when the engine made one.
struct ResizeAttrs : PreparedNode {
  std::string mode = "nearest";      // nearest, linear, cubic
  std::string coord = "asymmetric";  // coordinate_transformation_mode
  std::string nearest = "legacy";    // nearest_mode; legacy: opset < 11 rule
  double cubic_a = -0.75;
  bool exclude_outside = false;
  float extrapolation = 0.0f;
  std::string aspect = "stretch";
  std::vector<int64_t> axes;  // opset 18; empty: all axes
};

Result<ResizeAttrs> ParseResizeAttrs(const Node& node, int64_t opset) {
  ResizeAttrs a;
  const bool modern = node.op_type == "Resize" && opset >= 11;
  if (node.HasAttr("mode")) {
    KILN_ASSIGN_OR_RETURN(a.mode, node.GetString("mode"));
  }
  if (a.mode == "bilinear" && node.op_type == "Upsample") a.mode = "linear";  // Upsample-7 name
  if (a.mode != "nearest" && a.mode != "linear" && a.mode != "cubic") {
    return Invalid(node, "attribute mode='" + a.mode + "' is not one of nearest, linear, cubic");
  }
  if (a.mode == "cubic" && !modern) {
    return Invalid(node, "attribute mode='cubic' needs Resize at opset 11 or later (model has " +
                             node.op_type + " at opset " + std::to_string(opset) + ")");
  }
  if (!modern) return a;

  if (node.HasAttr("coordinate_transformation_mode")) {
    KILN_ASSIGN_OR_RETURN(a.coord, node.GetString("coordinate_transformation_mode"));
  } else {
    a.coord = "half_pixel";
  }
  static const std::set<std::string> kCoords = {"half_pixel",          "asymmetric",
                                                "align_corners",       "pytorch_half_pixel",
                                                "tf_crop_and_resize",  "tf_half_pixel_for_nearest",
                                                "half_pixel_symmetric"};
  if (!kCoords.count(a.coord)) {
    return Invalid(node, "attribute coordinate_transformation_mode='" + a.coord +
                             "' is not one of half_pixel, asymmetric, align_corners, "
                             "pytorch_half_pixel, tf_crop_and_resize, tf_half_pixel_for_nearest, "
                             "half_pixel_symmetric");
  }
  if (node.HasAttr("nearest_mode")) {
    KILN_ASSIGN_OR_RETURN(a.nearest, node.GetString("nearest_mode"));
  } else {
    a.nearest = "round_prefer_floor";
  }
  if (a.nearest != "round_prefer_floor" && a.nearest != "round_prefer_ceil" &&
      a.nearest != "floor" && a.nearest != "ceil") {
    return Invalid(node, "attribute nearest_mode='" + a.nearest +
                             "' is not one of round_prefer_floor, round_prefer_ceil, floor, ceil");
  }
  if (node.HasAttr("cubic_coeff_a")) {
    KILN_ASSIGN_OR_RETURN(float cubic_a, node.GetFloat("cubic_coeff_a"));
    a.cubic_a = cubic_a;
  }
  if (node.HasAttr("exclude_outside")) {
    KILN_ASSIGN_OR_RETURN(int64_t v, node.GetInt("exclude_outside"));
    if (v != 0 && v != 1) {
      return Invalid(node, "attribute 'exclude_outside'=" + std::to_string(v) +
                               " is invalid (expected 0 or 1)");
    }
    a.exclude_outside = v == 1;
  }
  if (node.HasAttr("extrapolation_value")) {
    KILN_ASSIGN_OR_RETURN(a.extrapolation, node.GetFloat("extrapolation_value"));
  }
  if (opset >= 18) {
    if (node.HasAttr("axes")) {
      KILN_ASSIGN_OR_RETURN(a.axes, node.GetInts("axes"));
    }
    if (node.HasAttr("keep_aspect_ratio_policy")) {
      KILN_ASSIGN_OR_RETURN(a.aspect, node.GetString("keep_aspect_ratio_policy"));
    }
    if (a.aspect != "stretch" && a.aspect != "not_larger" && a.aspect != "not_smaller") {
      return Invalid(node, "attribute keep_aspect_ratio_policy='" + a.aspect +
                               "' is not one of stretch, not_larger, not_smaller");
    }
    if (node.HasAttr("antialias")) {
      KILN_ASSIGN_OR_RETURN(int64_t antialias, node.GetInt("antialias"));
      if (antialias != 0) {
        return Status::Unimplemented(node.Describe() +
                                     ": attribute 'antialias'=" + std::to_string(antialias) +
                                     " is not supported (kiln implements antialias=0)");
      }
    }
  }
  return a;
}

Status CheckResize(const Node& node, int64_t opset) {
  KILN_RETURN_IF_ERROR(opset < 11 ? CheckArity(node, 2, 2) : CheckArity(node, 1, 4));
  return ParseResizeAttrs(node, opset).status();
}

Status CheckUpsample(const Node& node, int64_t opset) {
  if (opset < 9) {
    KILN_RETURN_IF_ERROR(CheckArity(node, 1, 1));
    KILN_RETURN_IF_ERROR(node.GetFloats("scales").status());
  } else {
    KILN_RETURN_IF_ERROR(CheckArity(node, 2, 2));
  }
  return ParseResizeAttrs(node, opset).status();
}

// ---------------------------------------------------------------------------------------------
// Plan: output shape, per-axis scale and region of interest

struct ResizePlan {
  ResizeAttrs attrs;
  std::vector<double> scales;              // per input axis
  std::vector<double> roi_start, roi_end;  // per input axis, normalized [0, 1]
  Shape out;
};

// A 1-D float input (roi, scales) when present and non-empty; its value must be known.
Result<std::optional<std::vector<double>>> OptionalFloats(const OpContext& ctx, size_t i,
                                                          const std::string& role) {
  if (!ctx.present(i)) return std::optional<std::vector<double>>();
  KILN_ASSIGN_OR_RETURN(const Tensor* t, ctx.RequireValue(i, role));
  if (t->numel() == 0) return std::optional<std::vector<double>>();
  if (!IsFloatDType(t->dtype()) || t->rank() != 1) {
    return Invalid(ctx, "input " + std::to_string(i) + " ('" + role + "') is " + t->TypeString() +
                            ", expected a 1-D float32 tensor");
  }
  std::vector<double> v(static_cast<size_t>(t->numel()));
  for (int64_t k = 0; k < t->numel(); ++k) v[k] = t->GetAsDouble(k);
  return std::optional<std::vector<double>>(std::move(v));
}

Result<std::optional<std::vector<int64_t>>> OptionalSizes(const OpContext& ctx, size_t i) {
  if (!ctx.present(i)) return std::optional<std::vector<int64_t>>();
  KILN_ASSIGN_OR_RETURN(const Tensor* t, ctx.RequireValue(i, "sizes"));
  if (t->numel() == 0) return std::optional<std::vector<int64_t>>();
  if ((t->dtype() != DType::kInt64 && t->dtype() != DType::kInt32) || t->rank() != 1) {
    return Invalid(ctx, "input " + std::to_string(i) + " ('sizes') is " + t->TypeString() +
                            ", expected a 1-D int64 tensor");
  }
  return std::optional<std::vector<int64_t>>(t->ToInt64Vector());
}

// An output dim computed in double from a scale the request may give (1e30, inf): one at or past
// 2^63 has no int64 value, so it is refused before the conversion.
Result<int64_t> OutputDim(const OpContext& ctx, double dim, int64_t axis) {
  if (!(dim < 9223372036854775808.0)) {
    return RequestTooLarge(ctx.where() + ": output dim " + std::to_string(dim) + " of axis " +
                           std::to_string(axis) + " is past the int64 bound 9223372036854775807");
  }
  return static_cast<int64_t>(dim);
}

Result<ResizePlan> PlanResize(const OpContext& ctx) {
  const Shape& in = ctx.type(0).shape;
  const int64_t rank = static_cast<int64_t>(in.size());
  ResizePlan plan;
  ResizeAttrs scratch;
  KILN_ASSIGN_OR_RETURN(const ResizeAttrs* attrs, PreparedOr(ctx, &scratch, ParseResizeAttrs));
  plan.attrs = *attrs;
  std::optional<std::vector<double>> scales, roi;
  std::optional<std::vector<int64_t>> sizes;
  if (ctx.node().op_type == "Upsample" && ctx.opset() < 9) {
    KILN_ASSIGN_OR_RETURN(std::vector<float> s, ctx.node().GetFloats("scales"));
    scales = std::vector<double>(s.begin(), s.end());
  } else if (ctx.opset() < 11) {  // Upsample-9, Resize-10: (X, scales)
    KILN_ASSIGN_OR_RETURN(scales, OptionalFloats(ctx, 1, "scales"));
  } else {  // (X, roi, scales, sizes)
    KILN_ASSIGN_OR_RETURN(scales, OptionalFloats(ctx, 2, "scales"));
    KILN_ASSIGN_OR_RETURN(sizes, OptionalSizes(ctx, 3));
    if (plan.attrs.coord == "tf_crop_and_resize") {
      KILN_ASSIGN_OR_RETURN(roi, OptionalFloats(ctx, 1, "roi"));
      if (!roi) {
        return Invalid(ctx,
                       "coordinate_transformation_mode 'tf_crop_and_resize' needs input 1 "
                       "('roi')");
      }
    }
  }
  if (scales.has_value() == sizes.has_value()) {
    return Invalid(ctx, "exactly one of scales and sizes must be given (got " +
                            std::string(scales ? "both" : "neither") + ")");
  }
  std::vector<int64_t> axes;
  std::vector<bool> seen(in.size(), false);
  for (int64_t a : plan.attrs.axes) {
    KILN_ASSIGN_OR_RETURN(int64_t axis, NormalizeAxis(a, rank, ctx.where() + ": attribute 'axes'"));
    if (seen[axis]) {
      return Invalid(ctx, "attribute 'axes' names axis " + std::to_string(a) + " more than once");
    }
    seen[axis] = true;
    axes.push_back(axis);
  }
  if (axes.empty()) {
    for (int64_t d = 0; d < rank; ++d) axes.push_back(d);
  }
  const size_t given = scales ? scales->size() : sizes->size();
  if (given != axes.size()) {
    return Invalid(ctx, std::string(scales ? "scales" : "sizes") + " has " + std::to_string(given) +
                            " values, expected " + std::to_string(axes.size()) +
                            " for input shape " + ShapeToString(in));
  }
  plan.roi_start.assign(rank, 0.0);
  plan.roi_end.assign(rank, 1.0);
  if (roi) {
    if (roi->size() != 2 * axes.size()) {
      return Invalid(ctx, "input 1 ('roi') has " + std::to_string(roi->size()) +
                              " values, expected " + std::to_string(2 * axes.size()) +
                              " (starts then ends) for input shape " + ShapeToString(in));
    }
    for (size_t i = 0; i < axes.size(); ++i) {
      plan.roi_start[axes[i]] = (*roi)[i];
      plan.roi_end[axes[i]] = (*roi)[axes.size() + i];
    }
  }
  plan.scales.assign(rank, 1.0);
  plan.out = in;
  if (scales) {
    for (size_t i = 0; i < axes.size(); ++i) {
      const double s = (*scales)[i];
      if (!(s > 0)) {
        return Invalid(ctx, "scales value " + std::to_string(s) + " for axis " +
                                std::to_string(axes[i]) + " must be positive");
      }
      plan.scales[axes[i]] = s;
      KILN_ASSIGN_OR_RETURN(
          plan.out[axes[i]],
          OutputDim(ctx, std::floor(static_cast<double>(in[axes[i]]) * s), axes[i]));
    }
    return plan;
  }
  for (size_t i = 0; i < axes.size(); ++i) {
    if ((*sizes)[i] < 0) {
      return Invalid(ctx, "sizes " + ShapeToString(*sizes) + " contains a negative size");
    }
    plan.out[axes[i]] = (*sizes)[i];
    plan.scales[axes[i]] =
        static_cast<double>((*sizes)[i]) / static_cast<double>(std::max<int64_t>(in[axes[i]], 1));
  }
  if (plan.attrs.aspect != "stretch") {
    double s = plan.scales[axes[0]];
    for (int64_t a : axes) {
      s = plan.attrs.aspect == "not_larger" ? std::min(s, plan.scales[a])
                                            : std::max(s, plan.scales[a]);
    }
    for (int64_t a : axes) {
      plan.scales[a] = s;
      KILN_ASSIGN_OR_RETURN(plan.out[a],
                            OutputDim(ctx, std::round(s * static_cast<double>(in[a])), a));
    }
  }
  return plan;
}

Result<std::vector<TensorType>> InferResize(const OpContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ResizePlan plan, PlanResize(ctx));
  const DType dtype = ctx.type(0).dtype;
  if (plan.attrs.mode != "nearest" && dtype != DType::kFloat32) {
    return UnsupportedDType(ctx, dtype, "float32 in modes linear and cubic");
  }
  return std::vector<TensorType>{{dtype, plan.out}};
}

// ---------------------------------------------------------------------------------------------
// Coordinates and per-axis taps

// The source coordinate of output index x on an axis of `in_len` elements resized by `scale` to
// `out_len`, or nullopt when tf_crop_and_resize maps it outside the input (extrapolation).
std::optional<double> SourceCoordinate(const ResizeAttrs& a, double x, double scale, int64_t in_len,
                                       int64_t out_len, double roi_start, double roi_end) {
  const double in_w = static_cast<double>(in_len);
  const double out_w = scale * in_w;  // ONNX: not the rounded output length
  const std::string& coord = a.coord;
  if (coord == "half_pixel") return (x + 0.5) / scale - 0.5;
  if (coord == "pytorch_half_pixel") return out_w == 1 ? -0.5 : (x + 0.5) / scale - 0.5;
  if (coord == "align_corners") return out_w == 1 ? 0.0 : x * (in_w - 1) / (out_w - 1);
  if (coord == "tf_half_pixel_for_nearest") return (x + 0.5) / scale;
  if (coord == "half_pixel_symmetric") {
    const double adjustment = static_cast<double>(out_len) / out_w;
    const double offset = in_w / 2 * (1 - adjustment);
    return offset + (x + 0.5) / scale - 0.5;
  }
  if (coord == "tf_crop_and_resize") {
    double s = out_w == 1 ? (roi_end - roi_start) * (in_w - 1) / 2
                          : x * (roi_end - roi_start) * (in_w - 1) / (out_w - 1);
    s += roi_start * (in_w - 1);
    if (s < 0 || s > in_w - 1) return std::nullopt;
    return s;
  }
  return x / scale;  // asymmetric (and every legacy form)
}

// The input index nearest mode picks for coordinate x (before clamping).
int64_t NearestIndex(const std::string& mode, double x, double scale) {
  if (mode == "legacy") {
    return scale < 1 ? static_cast<int64_t>(std::ceil(x)) : static_cast<int64_t>(x);
  }
  const double fl = std::floor(x);
  const int64_t lo = static_cast<int64_t>(fl);
  if (x == fl) return lo;
  const double ratio = x - fl;
  if (mode == "round_prefer_floor") return ratio <= 0.5 ? lo : lo + 1;
  if (mode == "round_prefer_ceil") return ratio < 0.5 ? lo : lo + 1;
  if (mode == "floor") return lo;
  return lo + 1;  // ceil
}

struct Tap {
  int64_t index;  // clamped into the input
  double weight;
};

// One output position of one axis: its weighted input taps, or outside=true for extrapolation.
struct AxisPoint {
  bool outside = false;
  std::vector<Tap> taps;
};

// The ONNX cubic convolution weights of neighbours floor-1 .. floor+2 at fractional offset t.
std::vector<double> CubicWeights(double t, double a) {
  auto near = [a](double d) { return ((a + 2) * d - (a + 3)) * d * d + 1; };       // |d| <= 1
  auto far = [a](double d) { return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a; };  // 1 < |d| < 2
  return {far(t + 1), near(t), near(1 - t), far(2 - t)};
}

// Taps of every output index on axis d. Linear and cubic take the ONNX neighbours: an integral
// coordinate counts as ratio 1 of the interval to its left, so its own index gets the weight 1.
std::vector<AxisPoint> AxisTaps(const ResizePlan& plan, size_t d, int64_t in_len) {
  const ResizeAttrs& a = plan.attrs;
  const int64_t out_len = plan.out[d];
  std::vector<AxisPoint> points(static_cast<size_t>(out_len));
  for (int64_t o = 0; o < out_len; ++o) {
    AxisPoint& p = points[o];
    const std::optional<double> x =
        SourceCoordinate(a, static_cast<double>(o), plan.scales[d], in_len, out_len,
                         plan.roi_start[d], plan.roi_end[d]);
    if (!x) {
      p.outside = true;
      continue;
    }
    if (a.mode == "nearest") {
      p.taps.push_back(
          {std::clamp<int64_t>(NearestIndex(a.nearest, *x, plan.scales[d]), 0, in_len - 1), 1.0});
      continue;
    }
    const double fl = std::floor(*x);
    const bool integral = *x == fl;
    const int64_t left = static_cast<int64_t>(fl) - (integral ? 1 : 0);
    const double ratio = integral ? 1.0 : *x - fl;
    std::vector<double> w;
    int64_t first;
    if (a.mode == "linear") {
      w = {1 - ratio, ratio};
      first = left;
    } else {
      w = CubicWeights(ratio, a.cubic_a);
      first = left - 1;
    }
    double total = 0;
    for (size_t k = 0; k < w.size(); ++k) {
      const int64_t idx = first + static_cast<int64_t>(k);
      if (a.exclude_outside && (idx < 0 || idx >= in_len)) w[k] = 0;
      total += w[k];
    }
    for (size_t k = 0; k < w.size(); ++k) {
      if (a.exclude_outside) w[k] /= total;
      if (w[k] == 0) continue;
      const int64_t idx = std::clamp<int64_t>(first + static_cast<int64_t>(k), 0, in_len - 1);
      p.taps.push_back({idx, w[k]});
    }
  }
  return points;
}

// ---------------------------------------------------------------------------------------------
// Kernels

// Nearest: out[o] = in[sum_d idx_d(o_d) * stride_d], or the extrapolation value's bytes.
Status RunNearest(const OpContext& ctx, const ResizePlan& plan, Tensor& out) {
  const Tensor& in = ctx.in(0);
  const size_t rank = plan.out.size();
  const size_t elem = DTypeSize(in.dtype());
  const std::vector<int64_t> strides = ContiguousStrides(in.shape());
  std::vector<std::vector<int64_t>> offsets(rank);  // -1: outside
  for (size_t d = 0; d < rank; ++d) {
    for (const AxisPoint& p : AxisTaps(plan, d, in.dim(d))) {
      offsets[d].push_back(p.outside ? -1 : p.taps[0].index * strides[d]);
    }
  }
  const Tensor fill_f = Tensor::Scalar<float>(plan.attrs.extrapolation);
  KILN_ASSIGN_OR_RETURN(Tensor fill, fill_f.CastTo(in.dtype()));
  const auto* src = static_cast<const uint8_t*>(in.raw_data());
  auto* dst = static_cast<uint8_t*>(out.raw_data());
  if (rank == 0) {
    std::memcpy(dst, src, elem);
    return Status::OK();
  }
  // One output row (the last axis) at a time: the outer axes fix a base offset, the row reads
  // through the last axis' table.
  const std::vector<int64_t>& inner = offsets[rank - 1];
  const int64_t row = plan.out[rank - 1];
  const int64_t rows = out.numel() / row;
  std::vector<int64_t> index(rank - 1, 0);
  for (int64_t r = 0; r < rows; ++r) {
    int64_t base = 0;
    bool outside = false;
    for (size_t d = 0; d + 1 < rank; ++d) {
      const int64_t o = offsets[d][index[d]];
      outside = outside || o < 0;
      base += o;
    }
    uint8_t* y = dst + r * row * static_cast<int64_t>(elem);
    for (int64_t j = 0; j < row; ++j) {
      const bool fill_j = outside || inner[j] < 0;
      std::memcpy(y + j * static_cast<int64_t>(elem),
                  fill_j ? fill.raw_data() : src + (base + inner[j]) * static_cast<int64_t>(elem),
                  elem);
    }
    for (size_t d = rank - 1; d-- > 0;) {
      if (++index[d] < plan.out[d]) break;
      index[d] = 0;
    }
  }
  return Status::OK();
}

// Linear and cubic: one pass per resized axis over a double buffer, then extrapolation.
Status RunInterpolate(const OpContext& ctx, const ResizePlan& plan, Tensor& out) {
  const Tensor& in = ctx.in(0);
  const size_t rank = plan.out.size();
  Shape shape = in.shape();
  std::vector<double> cur(static_cast<size_t>(in.numel()));
  for (int64_t i = 0; i < in.numel(); ++i) cur[i] = in.data<float>()[i];
  std::vector<std::vector<bool>> outside(rank);
  // The passes commute; the axes that shrink go first, so the buffer never grows past the larger
  // of the input and the output (in the other order [1, n] -> [n, 1] would hold n x n).
  std::vector<size_t> order;
  for (size_t d = 0; d < rank; ++d) {
    if (plan.out[d] <= in.dim(d)) order.push_back(d);
  }
  for (size_t d = 0; d < rank; ++d) {
    if (plan.out[d] > in.dim(d)) order.push_back(d);
  }
  for (size_t d : order) {
    const std::vector<AxisPoint> points = AxisTaps(plan, d, in.dim(d));
    for (const AxisPoint& p : points) outside[d].push_back(p.outside);
    bool identity = plan.out[d] == in.dim(d);
    for (int64_t o = 0; identity && o < plan.out[d]; ++o) {
      const AxisPoint& p = points[o];
      identity = p.outside || (p.taps.size() == 1 && p.taps[0].index == o && p.taps[0].weight == 1);
    }
    if (identity) continue;
    // View cur as [outer, in_len, inner] and write [outer, out_len, inner].
    int64_t outer = 1, inner = 1;
    for (size_t k = 0; k < d; ++k) outer *= shape[k];
    for (size_t k = d + 1; k < rank; ++k) inner *= shape[k];
    const int64_t in_len = shape[d], out_len = plan.out[d];
    std::vector<double> next(static_cast<size_t>(outer * out_len * inner), 0.0);
    for (int64_t b = 0; b < outer; ++b) {
      for (int64_t o = 0; o < out_len; ++o) {
        double* y = next.data() + (b * out_len + o) * inner;
        for (const Tap& t : points[o].taps) {
          const double* x = cur.data() + (b * in_len + t.index) * inner;
          for (int64_t j = 0; j < inner; ++j) y[j] += t.weight * x[j];
        }
      }
    }
    cur = std::move(next);
    shape[d] = out_len;
  }
  float* py = out.data<float>();
  const int64_t n = out.numel();
  std::vector<int64_t> index(rank, 0);
  for (int64_t i = 0; i < n; ++i) {
    bool out_of_roi = false;
    for (size_t d = 0; d < rank; ++d) out_of_roi = out_of_roi || outside[d][index[d]];
    py[i] = out_of_roi ? plan.attrs.extrapolation : static_cast<float>(cur[i]);
    for (size_t d = rank; d-- > 0;) {
      if (++index[d] < plan.out[d]) break;
      index[d] = 0;
    }
  }
  return Status::OK();
}

Status RunResize(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_ASSIGN_OR_RETURN(ResizePlan plan, PlanResize(ctx));
  const Tensor& in = ctx.in(0);
  for (size_t d = 0; d < plan.out.size(); ++d) {
    if (plan.out[d] > 0 && in.dim(d) == 0) {
      return Invalid(ctx, "cannot resize empty axis " + std::to_string(d) + " of input shape " +
                              ShapeToString(in.shape()) + " to " + std::to_string(plan.out[d]));
    }
  }
  if (outputs[0].numel() == 0) return Status::OK();
  if (plan.attrs.mode == "nearest") return RunNearest(ctx, plan, outputs[0]);
  if (in.dtype() != DType::kFloat32) {
    return UnsupportedDType(ctx, in.dtype(), "float32 in modes linear and cubic");
  }
  return RunInterpolate(ctx, plan, outputs[0]);
}

}  // namespace

std::vector<OpDef> ResizeOpDefs() {
  std::vector<OpDef> defs;
  constexpr PrepareFn kPrepare = PrepareWith<ResizeAttrs, ParseResizeAttrs>;
  defs.push_back({"Resize", "", 10, INT64_MAX, CheckResize, InferResize, RunResize, kPrepare});
  defs.push_back({"Upsample", "", 7, 9, CheckUpsample, InferResize, RunResize, kPrepare});
  return defs;
}

}  // namespace kiln
