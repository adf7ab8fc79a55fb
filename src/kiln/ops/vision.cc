// Vision op family (ops layer): GridSample, RoiAlign, NonMaxSuppression, MaxUnpool, LRN, LpPool
// and GlobalLpPool, each with its reference kernel.
//
// VisionOpDefs is registered by OpRegistry::Global() (registry.cc). Sampling follows the
// conventions detection and flow models are exported with: GridSample is PyTorch's
// grid_sample (bilinear, nearest with halves to even, bicubic with A = -0.75; zeros, border or
// reflection padding), RoiAlign is the Detectron/ONNX Runtime average (or max) of bilinear
// samples, NonMaxSuppression is the greedy per (batch, class) selection ONNX specifies, its
// output [selected, 3] sized by the data (computed by infer, which a compiled cell runs in its
// dynamic region). Computed in double, rounded once to the input's float type.
#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "src/kiln/ops/kernel_util.h"
#include "src/kiln/ops/nn_common.h"
#include "src/kiln/ops/registry.h"

namespace kiln {
namespace {

using kernel::BadAttr;
using kernel::BadInputShape;

// ---------------------------------------------------------------------------------------------
// GridSample (opset 16+): X [N, C, H, W], grid [N, Ho, Wo, 2] of (x, y) in [-1, 1] -> Y
// [N, C, Ho, Wo].

struct GridSampleAttrs {
  std::string mode = "bilinear";
  std::string padding = "zeros";
  bool align_corners = false;
};

Result<GridSampleAttrs> ReadGridSample(const Node& node) {
  GridSampleAttrs a;
  KILN_ASSIGN_OR_RETURN(a.mode, kernel::StringOr(node, "mode", "bilinear"));
  KILN_ASSIGN_OR_RETURN(a.padding, kernel::StringOr(node, "padding_mode", "zeros"));
  KILN_ASSIGN_OR_RETURN(int64_t ac, kernel::IntOr(node, "align_corners", 0));
  // Opset 20 renamed the modes; both spellings mean the same sampling.
  if (a.mode == "linear") a.mode = "bilinear";
  if (a.mode == "cubic") a.mode = "bicubic";
  if (a.mode != "bilinear" && a.mode != "nearest" && a.mode != "bicubic") {
    return BadAttr(node, "mode", "'" + a.mode + "'", "'bilinear', 'nearest' or 'bicubic'");
  }
  if (a.padding != "zeros" && a.padding != "border" && a.padding != "reflection") {
    return BadAttr(node, "padding_mode", "'" + a.padding + "'",
                   "'zeros', 'border' or 'reflection'");
  }
  if (ac != 0 && ac != 1) return BadAttr(node, "align_corners", std::to_string(ac), "0 or 1");
  a.align_corners = ac != 0;
  return a;
}

Status CheckGridSample(const Node& node, int64_t) {
  KILN_RETURN_IF_ERROR(CheckArity(node, 2, 2));
  return ReadGridSample(node).status();
}

Result<std::vector<TensorType>> InferGridSample(const OpContext& ctx) {
  KILN_RETURN_IF_ERROR(kernel::RequireFloatInput(ctx, 0));
  KILN_RETURN_IF_ERROR(kernel::RequireFloatInput(ctx, 1));
  const Shape& x = ctx.type(0).shape;
  const Shape& g = ctx.type(1).shape;
  if (x.size() != 4) {
    return Status::Unimplemented(ctx.where() + ": input X " + ShapeToString(x) + " has rank " +
                                 std::to_string(x.size()) +
                                 "; kiln samples 2-D grids only (X [N, C, H, W])");
  }
  if (g.size() != 4 || g[0] != x[0] || g[3] != 2) {
    return BadInputShape(ctx, 1, "grid", "[" + std::to_string(x[0]) + ", H_out, W_out, 2]");
  }
  return std::vector<TensorType>{{ctx.type(0).dtype, {x[0], x[1], g[1], g[2]}}};
}

// PyTorch's grid_sampler_unnormalize.
double Unnormalize(double coord, int64_t size, bool align_corners) {
  return align_corners ? (coord + 1.0) / 2.0 * static_cast<double>(size - 1)
                       : ((coord + 1.0) * static_cast<double>(size) - 1.0) / 2.0;
}

// Reflects `v` into [twice_low / 2, twice_high / 2].
double Reflect(double v, int64_t twice_low, int64_t twice_high) {
  if (twice_low == twice_high) return 0.0;
  const double lo = static_cast<double>(twice_low) / 2.0;
  const double span = static_cast<double>(twice_high - twice_low) / 2.0;
  v = std::fabs(v - lo);
  const double extra = std::fmod(v, span);
  const int64_t flips = static_cast<int64_t>(std::floor(v / span));
  return flips % 2 == 0 ? extra + lo : span - extra + lo;
}

double ClipCoordinate(double v, int64_t size) {
  return std::min(static_cast<double>(size - 1), std::max(v, 0.0));
}

// Border and reflection padding move a coordinate inside the image; zeros leaves it.
double PadCoordinate(double v, int64_t size, const GridSampleAttrs& a) {
  if (a.padding == "border") return ClipCoordinate(v, size);
  if (a.padding == "reflection") {
    v = a.align_corners ? Reflect(v, 0, 2 * (size - 1)) : Reflect(v, -1, 2 * size - 1);
    return ClipCoordinate(v, size);
  }
  return v;
}

double CubicNear(double x, double A) { return ((A + 2) * x - (A + 3)) * x * x + 1; }
double CubicFar(double x, double A) { return ((A * x - 5 * A) * x + 8 * A) * x - 4 * A; }

double Cubic(const double v[4], double t) {
  constexpr double A = -0.75;
  const double w0 = CubicFar(t + 1.0, A), w1 = CubicNear(t, A);
  const double w2 = CubicNear(1.0 - t, A), w3 = CubicFar(2.0 - t, A);
  return v[0] * w0 + v[1] * w1 + v[2] * w2 + v[3] * w3;
}

Status RunGridSample(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_ASSIGN_OR_RETURN(GridSampleAttrs a, ReadGridSample(ctx.node()));
  const Shape& xs = ctx.in(0).shape();
  const Shape& ys = outputs[0].shape();
  const int64_t n = xs[0], c = xs[1], h = xs[2], w = xs[3], ho = ys[2], wo = ys[3];
  const std::vector<double> x = kernel::ToDoubles(ctx.in(0));
  const std::vector<double> grid = kernel::ToDoubles(ctx.in(1));
  std::vector<double> y(static_cast<size_t>(outputs[0].numel()));
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t i = 0; i < ho; ++i) {
      for (int64_t j = 0; j < wo; ++j) {
        const size_t gi = static_cast<size_t>(((b * ho + i) * wo + j) * 2);
        const double ix = Unnormalize(grid[gi], w, a.align_corners);
        const double iy = Unnormalize(grid[gi + 1], h, a.align_corners);
        for (int64_t ch = 0; ch < c; ++ch) {
          const double* plane = x.data() + (b * c + ch) * h * w;
          auto at = [&](int64_t yy, int64_t xx) {
            return (yy >= 0 && yy < h && xx >= 0 && xx < w) ? plane[yy * w + xx] : 0.0;
          };
          double v = 0.0;
          if (a.mode == "bicubic") {
            const double fx = std::floor(ix), fy = std::floor(iy);
            const double tx = ix - fx, ty = iy - fy;
            // Each tap is padded on its own (PyTorch's get_value_bounded).
            auto tap = [&](double yy, double xx) {
              const double px = PadCoordinate(xx, w, a), py = PadCoordinate(yy, h, a);
              return at(static_cast<int64_t>(std::floor(py)), static_cast<int64_t>(std::floor(px)));
            };
            double rows[4];
            for (int r = 0; r < 4; ++r) {
              double taps[4];
              for (int k = 0; k < 4; ++k) taps[k] = tap(fy - 1 + r, fx - 1 + k);
              rows[r] = Cubic(taps, tx);
            }
            v = Cubic(rows, ty);
          } else {
            const double px = PadCoordinate(ix, w, a), py = PadCoordinate(iy, h, a);
            if (a.mode == "nearest") {
              v = at(static_cast<int64_t>(std::nearbyint(py)),
                     static_cast<int64_t>(std::nearbyint(px)));
            } else {
              const int64_t x0 = static_cast<int64_t>(std::floor(px));
              const int64_t y0 = static_cast<int64_t>(std::floor(py));
              const double dx = px - static_cast<double>(x0), dy = py - static_cast<double>(y0);
              v = at(y0, x0) * (1 - dx) * (1 - dy) + at(y0, x0 + 1) * dx * (1 - dy) +
                  at(y0 + 1, x0) * (1 - dx) * dy + at(y0 + 1, x0 + 1) * dx * dy;
            }
          }
          y[static_cast<size_t>(((b * c + ch) * ho + i) * wo + j)] = v;
        }
      }
    }
  }
  return kernel::StoreDoubles(y, outputs[0]);
}

// ---------------------------------------------------------------------------------------------
// RoiAlign (opset 10, 16): X [N, C, H, W], rois [R, 4] (x1, y1, x2, y2), batch_indices [R] ->
// Y [R, C, output_height, output_width]. Opset 16's coordinate_transformation_mode
// 'half_pixel' (its default) shifts the scaled box by -0.5 and lets it be smaller than a pixel;
// 'output_half_pixel' (opset 10's only behaviour) does not shift and makes it at least 1x1.

struct RoiAlignAttrs {
  std::string mode = "avg";
  int64_t out_h = 1, out_w = 1, sampling_ratio = 0;
  double spatial_scale = 1.0;
  bool half_pixel = false;
};

Result<RoiAlignAttrs> ReadRoiAlign(const Node& node, int64_t opset) {
  RoiAlignAttrs a;
  KILN_ASSIGN_OR_RETURN(a.mode, kernel::StringOr(node, "mode", "avg"));
  if (a.mode != "avg" && a.mode != "max")
    return BadAttr(node, "mode", "'" + a.mode + "'", "'avg' or 'max'");
  KILN_ASSIGN_OR_RETURN(a.out_h, kernel::IntOr(node, "output_height", 1));
  KILN_ASSIGN_OR_RETURN(a.out_w, kernel::IntOr(node, "output_width", 1));
  KILN_ASSIGN_OR_RETURN(a.sampling_ratio, kernel::IntOr(node, "sampling_ratio", 0));
  KILN_ASSIGN_OR_RETURN(float scale, kernel::FloatOr(node, "spatial_scale", 1.0f));
  a.spatial_scale = scale;
  if (a.out_h < 1) return BadAttr(node, "output_height", std::to_string(a.out_h), ">= 1");
  if (a.out_w < 1) return BadAttr(node, "output_width", std::to_string(a.out_w), ">= 1");
  if (a.sampling_ratio < 0) {
    return BadAttr(node, "sampling_ratio", std::to_string(a.sampling_ratio), ">= 0");
  }
  const std::string dflt = opset >= 16 ? "half_pixel" : "output_half_pixel";
  KILN_ASSIGN_OR_RETURN(std::string ctm,
                        kernel::StringOr(node, "coordinate_transformation_mode", dflt));
  if (ctm != "half_pixel" && ctm != "output_half_pixel") {
    return BadAttr(node, "coordinate_transformation_mode", "'" + ctm + "'",
                   "'half_pixel' or 'output_half_pixel'");
  }
  a.half_pixel = ctm == "half_pixel";
  return a;
}

Status CheckRoiAlign(const Node& node, int64_t opset) {
  KILN_RETURN_IF_ERROR(CheckArity(node, 3, 3));
  return ReadRoiAlign(node, opset).status();
}

Result<std::vector<TensorType>> InferRoiAlign(const OpContext& ctx) {
  KILN_RETURN_IF_ERROR(kernel::RequireFloatInput(ctx, 0));
  KILN_RETURN_IF_ERROR(kernel::RequireFloatInput(ctx, 1));
  KILN_RETURN_IF_ERROR(kernel::RequireIntegerInput(ctx, 2));
  KILN_ASSIGN_OR_RETURN(RoiAlignAttrs a, ReadRoiAlign(ctx.node(), ctx.opset()));
  const Shape& x = ctx.type(0).shape;
  const Shape& r = ctx.type(1).shape;
  if (x.size() != 4) return BadInputShape(ctx, 0, "X", "[N, C, H, W]");
  if (r.size() != 2 || r[1] != 4) return BadInputShape(ctx, 1, "rois", "[num_rois, 4]");
  if (ctx.type(2).shape != Shape{r[0]}) {
    return BadInputShape(ctx, 2, "batch_indices", "[" + std::to_string(r[0]) + "]");
  }
  return std::vector<TensorType>{{ctx.type(0).dtype, {r[0], x[1], a.out_h, a.out_w}}};
}

// Bilinear sample of one plane at (y, x), zero outside [-1, size]; Detectron's rule.
double RoiSample(const double* plane, int64_t h, int64_t w, double y, double x, bool max_mode) {
  if (y < -1.0 || y > static_cast<double>(h) || x < -1.0 || x > static_cast<double>(w)) return 0.0;
  y = std::max(y, 0.0);
  x = std::max(x, 0.0);
  int64_t y0 = static_cast<int64_t>(y), x0 = static_cast<int64_t>(x), y1, x1;
  if (y0 >= h - 1) {
    y1 = y0 = h - 1;
    y = static_cast<double>(y0);
  } else {
    y1 = y0 + 1;
  }
  if (x0 >= w - 1) {
    x1 = x0 = w - 1;
    x = static_cast<double>(x0);
  } else {
    x1 = x0 + 1;
  }
  const double ly = y - static_cast<double>(y0), lx = x - static_cast<double>(x0);
  const double hy = 1.0 - ly, hx = 1.0 - lx;
  const double t[4] = {hy * hx * plane[y0 * w + x0], hy * lx * plane[y0 * w + x1],
                       ly * hx * plane[y1 * w + x0], ly * lx * plane[y1 * w + x1]};
  // Max mode keeps the largest weighted corner (ONNX Runtime's reading of the spec).
  if (max_mode) return std::max(std::max(t[0], t[1]), std::max(t[2], t[3]));
  return t[0] + t[1] + t[2] + t[3];
}

Status RunRoiAlign(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_ASSIGN_OR_RETURN(RoiAlignAttrs a, ReadRoiAlign(ctx.node(), ctx.opset()));
  const Shape& xs = ctx.in(0).shape();
  const int64_t n = xs[0], c = xs[1], h = xs[2], w = xs[3];
  const int64_t rois = ctx.in(1).dim(0);
  const std::vector<double> x = kernel::ToDoubles(ctx.in(0));
  const std::vector<double> boxes = kernel::ToDoubles(ctx.in(1));
  const std::vector<int64_t> batch = ctx.in(2).ToInt64Vector();
  std::vector<double> y(static_cast<size_t>(outputs[0].numel()));
  const double offset = a.half_pixel ? 0.5 : 0.0;
  const bool max_mode = a.mode == "max";
  for (int64_t r = 0; r < rois; ++r) {
    const int64_t b = batch[static_cast<size_t>(r)];
    if (b < 0 || b >= n) {
      return Status::InvalidArgument(ctx.where() + ": batch_indices[" + std::to_string(r) +
                                     "] = " + std::to_string(b) + " is outside [0, " +
                                     std::to_string(n) + ")");
    }
    const double* box = boxes.data() + r * 4;
    const double x1 = box[0] * a.spatial_scale - offset, y1 = box[1] * a.spatial_scale - offset;
    const double x2 = box[2] * a.spatial_scale - offset, y2 = box[3] * a.spatial_scale - offset;
    double rw = x2 - x1, rh = y2 - y1;
    if (!a.half_pixel) {
      rw = std::max(rw, 1.0);
      rh = std::max(rh, 1.0);
    }
    const double bin_h = rh / static_cast<double>(a.out_h),
                 bin_w = rw / static_cast<double>(a.out_w);
    const int64_t grid_h = a.sampling_ratio > 0
                               ? a.sampling_ratio
                               : static_cast<int64_t>(std::ceil(rh / static_cast<double>(a.out_h)));
    const int64_t grid_w = a.sampling_ratio > 0
                               ? a.sampling_ratio
                               : static_cast<int64_t>(std::ceil(rw / static_cast<double>(a.out_w)));
    const double count = static_cast<double>(std::max<int64_t>(grid_h * grid_w, 1));
    for (int64_t ch = 0; ch < c; ++ch) {
      const double* plane = x.data() + (b * c + ch) * h * w;
      for (int64_t ph = 0; ph < a.out_h; ++ph) {
        for (int64_t pw = 0; pw < a.out_w; ++pw) {
          double acc = 0.0;
          bool first = true;
          for (int64_t iy = 0; iy < grid_h; ++iy) {
            const double sy = y1 + static_cast<double>(ph) * bin_h +
                              (static_cast<double>(iy) + 0.5) * bin_h / static_cast<double>(grid_h);
            for (int64_t ix = 0; ix < grid_w; ++ix) {
              const double sx =
                  x1 + static_cast<double>(pw) * bin_w +
                  (static_cast<double>(ix) + 0.5) * bin_w / static_cast<double>(grid_w);
              const double v = RoiSample(plane, h, w, sy, sx, max_mode);
              if (max_mode) {
                acc = first ? v : std::max(acc, v);
                first = false;
              } else {
                acc += v;
              }
            }
          }
          y[static_cast<size_t>(((r * c + ch) * a.out_h + ph) * a.out_w + pw)] =
              max_mode ? acc : acc / count;
        }
      }
    }
  }
  return kernel::StoreDoubles(y, outputs[0]);
}

// ---------------------------------------------------------------------------------------------
// NonMaxSuppression (opset 10, 11): boxes [B, S, 4], scores [B, K, S], optional
// max_output_boxes_per_class (int64, default 0), iou_threshold (default 0), score_threshold.
// Per (batch, class): boxes scoring above score_threshold, best score first (ties: lower index
// first), each kept unless its IoU with an already kept box exceeds iou_threshold, at most
// max_output_boxes_per_class. Output int64 [selected, 3] of (batch, class, box).

Status CheckNms(const Node& node, int64_t) {
  KILN_RETURN_IF_ERROR(CheckArity(node, 2, 5));
  KILN_ASSIGN_OR_RETURN(int64_t cpb, kernel::IntOr(node, "center_point_box", 0));
  if (cpb != 0 && cpb != 1) return BadAttr(node, "center_point_box", std::to_string(cpb), "0 or 1");
  return Status::OK();
}

// Corners (y1, x1, y2, x2) in either order, or (x_center, y_center, width, height).
struct Box {
  double y1, x1, y2, x2;
};

Box ReadBox(const double* p, bool center) {
  if (center) {
    return {p[1] - p[3] / 2, p[0] - p[2] / 2, p[1] + p[3] / 2, p[0] + p[2] / 2};
  }
  return {std::min(p[0], p[2]), std::min(p[1], p[3]), std::max(p[0], p[2]), std::max(p[1], p[3])};
}

double Iou(const Box& a, const Box& b) {
  const double area_a = (a.y2 - a.y1) * (a.x2 - a.x1);
  const double area_b = (b.y2 - b.y1) * (b.x2 - b.x1);
  if (area_a <= 0 || area_b <= 0) return 0.0;
  const double ih = std::min(a.y2, b.y2) - std::max(a.y1, b.y1);
  const double iw = std::min(a.x2, b.x2) - std::max(a.x1, b.x1);
  if (ih <= 0 || iw <= 0) return 0.0;
  const double inter = ih * iw;
  return inter / (area_a + area_b - inter);
}

Result<std::vector<int64_t>> SelectBoxes(const OpContext& ctx) {
  const Shape& bs = ctx.type(0).shape;
  const Shape& ss = ctx.type(1).shape;
  if (bs.size() != 3 || bs[2] != 4) return BadInputShape(ctx, 0, "boxes", "[batches, boxes, 4]");
  if (ss.size() != 3 || ss[0] != bs[0] || ss[2] != bs[1]) {
    return BadInputShape(ctx, 1, "scores",
                         "[" + std::to_string(bs[0]) + ", classes, " + std::to_string(bs[1]) + "]");
  }
  const Tensor* boxes_t = ctx.value(0);
  const Tensor* scores_t = ctx.value(1);
  int64_t max_out = 0;
  double iou_threshold = 0.0;
  bool has_score_threshold = false;
  double score_threshold = 0.0;
  std::vector<const Tensor*> known = {boxes_t, scores_t};
  for (size_t i = 2; i < 5; ++i) {
    if (ctx.present(i)) known.push_back(ctx.value(i));
  }
  for (size_t k = 0; k < known.size(); ++k) {
    if (known[k] == nullptr) {
      return Status::Refused(StatusCode::kUnimplemented, kRefusalValueDependent,
                             ctx.where() +
                                 ": data-dependent output shape: the number of selected boxes "
                                 "depends on the values of the boxes, scores and thresholds, "
                                 "known only at run time");
    }
  }
  if (ctx.present(2) && ctx.in(2).numel() > 0) max_out = ctx.in(2).GetAsInt64(0);
  if (ctx.present(3) && ctx.in(3).numel() > 0) iou_threshold = ctx.in(3).GetAsDouble(0);
  if (ctx.present(4) && ctx.in(4).numel() > 0) {
    has_score_threshold = true;
    score_threshold = ctx.in(4).GetAsDouble(0);
  }
  const bool center = ctx.node().GetInt("center_point_box", 0) != 0;
  const std::vector<double> boxes = kernel::ToDoubles(*boxes_t);
  const std::vector<double> scores = kernel::ToDoubles(*scores_t);
  const int64_t nb = bs[0], ns = bs[1], nc = ss[1];
  std::vector<int64_t> out;
  for (int64_t b = 0; b < nb; ++b) {
    for (int64_t c = 0; c < nc; ++c) {
      const double* sc = scores.data() + (b * nc + c) * ns;
      std::vector<int64_t> order;
      for (int64_t s = 0; s < ns; ++s) {
        if (!has_score_threshold || sc[s] > score_threshold) order.push_back(s);
      }
      std::stable_sort(order.begin(), order.end(),
                       [&](int64_t l, int64_t r) { return sc[l] > sc[r]; });
      std::vector<Box> kept;
      for (int64_t s : order) {
        if (static_cast<int64_t>(kept.size()) >= max_out) break;
        const Box box = ReadBox(boxes.data() + (b * ns + s) * 4, center);
        bool suppressed = false;
        for (const Box& k : kept) {
          if (Iou(box, k) > iou_threshold) {
            suppressed = true;
            break;
          }
        }
        if (suppressed) continue;
        kept.push_back(box);
        out.insert(out.end(), {b, c, s});
      }
    }
  }
  return out;
}

Result<std::vector<TensorType>> InferNms(const OpContext& ctx) {
  KILN_RETURN_IF_ERROR(kernel::RequireFloatInput(ctx, 0));
  KILN_RETURN_IF_ERROR(kernel::RequireFloatInput(ctx, 1));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> sel, SelectBoxes(ctx));
  return std::vector<TensorType>{{DType::kInt64, {static_cast<int64_t>(sel.size()) / 3, 3}}};
}

Status RunNms(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> sel, SelectBoxes(ctx));
  return kernel::StoreInt64s(sel, outputs[0]);
}

// ---------------------------------------------------------------------------------------------
// MaxUnpool (opset 9, 11): X [N, C, d...], I (MaxPool's flat indices into the unpooled tensor),
// optional output_shape; attributes kernel_shape, strides, pads. Y is zero except Y.flat[I[k]] =
// X.flat[k]; its shape is output_shape when given, else (in - 1) * stride + kernel - pads.

struct UnpoolAttrs {
  std::vector<int64_t> kernel, strides, pads;
};

Result<UnpoolAttrs> ReadUnpool(const Node& node) {
  UnpoolAttrs a;
  KILN_ASSIGN_OR_RETURN(a.kernel, node.GetInts("kernel_shape"));
  const size_t r = a.kernel.size();
  KILN_ASSIGN_OR_RETURN(a.strides, kernel::IntsOr(node, "strides", std::vector<int64_t>(r, 1)));
  KILN_ASSIGN_OR_RETURN(a.pads, kernel::IntsOr(node, "pads", std::vector<int64_t>(2 * r, 0)));
  if (a.strides.size() != r || a.pads.size() != 2 * r) {
    return Status::InvalidArgument(node.Describe() + ": kernel_shape " + ShapeToString(a.kernel) +
                                   ", strides " + ShapeToString(a.strides) + " and pads " +
                                   ShapeToString(a.pads) + " disagree on the spatial rank");
  }
  return a;
}

Status CheckUnpool(const Node& node, int64_t) {
  KILN_RETURN_IF_ERROR(CheckArity(node, 2, 3));
  return ReadUnpool(node).status();
}

Result<std::vector<TensorType>> InferUnpool(const OpContext& ctx) {
  KILN_RETURN_IF_ERROR(kernel::RequireFloatInput(ctx, 0));
  KILN_ASSIGN_OR_RETURN(UnpoolAttrs a, ReadUnpool(ctx.node()));
  const Shape& x = ctx.type(0).shape;
  if (x.size() != a.kernel.size() + 2) {
    return BadInputShape(ctx, 0, "X",
                         "rank " + std::to_string(a.kernel.size() + 2) + " (kernel_shape)");
  }
  if (ctx.type(1).shape != x) return BadInputShape(ctx, 1, "I", ShapeToString(x) + " (X's shape)");
  Shape out;
  if (ctx.present(2)) {
    KILN_ASSIGN_OR_RETURN(const Tensor* s, ctx.RequireValue(2, "output_shape"));
    out = s->ToInt64Vector();
    if (out.size() != x.size() || out[0] != x[0] || out[1] != x[1]) {
      return Status::InvalidArgument(ctx.where() + ": output_shape " + ShapeToString(out) +
                                     " must be [" + std::to_string(x[0]) + ", " +
                                     std::to_string(x[1]) + ", spatial...] for X " +
                                     ShapeToString(x));
    }
  } else {
    const size_t r = a.kernel.size();
    out = {x[0], x[1]};
    for (size_t i = 0; i < r; ++i) {
      out.push_back((x[i + 2] - 1) * a.strides[i] + a.kernel[i] - a.pads[i] - a.pads[i + r]);
    }
  }
  for (int64_t d : out) {
    if (d < 0)
      return Status::InvalidArgument(ctx.where() + ": output shape " + ShapeToString(out) +
                                     " is negative");
  }
  return std::vector<TensorType>{{ctx.type(0).dtype, out}};
}

Status RunUnpool(const OpContext& ctx, std::vector<Tensor>& outputs) {
  const std::vector<double> x = kernel::ToDoubles(ctx.in(0));
  const std::vector<int64_t> idx = ctx.in(1).ToInt64Vector();
  std::vector<double> y(static_cast<size_t>(outputs[0].numel()), 0.0);
  for (size_t k = 0; k < x.size(); ++k) {
    if (idx[k] < 0 || idx[k] >= outputs[0].numel()) {
      return Status::InvalidArgument(ctx.where() + ": index " + std::to_string(idx[k]) +
                                     " at element " + std::to_string(k) +
                                     " of I is outside the output " + outputs[0].TypeString());
    }
    y[static_cast<size_t>(idx[k])] = x[k];
  }
  return kernel::StoreDoubles(y, outputs[0]);
}

// ---------------------------------------------------------------------------------------------
// LRN (opset 1, 13): y = x / (bias + alpha / size * sum of x^2 over the channels
// [c - floor((size-1)/2), c + ceil((size-1)/2)]) ^ beta.

Status CheckLrn(const Node& node, int64_t) {
  KILN_RETURN_IF_ERROR(CheckArity(node, 1, 1));
  KILN_ASSIGN_OR_RETURN(int64_t size, node.GetInt("size"));
  if (size < 1) return BadAttr(node, "size", std::to_string(size), ">= 1");
  for (const char* f : {"alpha", "beta", "bias"}) {
    KILN_RETURN_IF_ERROR(kernel::FloatOr(node, f, 0.0f).status());
  }
  return Status::OK();
}

Result<std::vector<TensorType>> InferLrn(const OpContext& ctx) {
  KILN_RETURN_IF_ERROR(kernel::RequireFloatInput(ctx, 0));
  if (ctx.type(0).shape.size() < 2) return BadInputShape(ctx, 0, "X", "[N, C, d...]");
  return std::vector<TensorType>{ctx.type(0)};
}

Status RunLrn(const OpContext& ctx, std::vector<Tensor>& outputs) {
  const Node& node = ctx.node();
  const int64_t size = node.GetInt("size", 1);
  const double alpha = node.GetFloat("alpha", 1e-4f), beta = node.GetFloat("beta", 0.75f);
  const double bias = node.GetFloat("bias", 1.0f);
  const Shape& s = ctx.in(0).shape();
  const int64_t n = s[0], c = s[1];
  const int64_t inner = NumElements(Shape(s.begin() + 2, s.end()));
  const std::vector<double> x = kernel::ToDoubles(ctx.in(0));
  std::vector<double> y(x.size());
  const int64_t before = (size - 1) / 2, after = size / 2;  // floor and ceil of (size-1)/2
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t ch = 0; ch < c; ++ch) {
      for (int64_t i = 0; i < inner; ++i) {
        double sum = 0.0;
        for (int64_t k = std::max<int64_t>(0, ch - before); k <= std::min(c - 1, ch + after); ++k) {
          const double v = x[static_cast<size_t>((b * c + k) * inner + i)];
          sum += v * v;
        }
        const size_t at = static_cast<size_t>((b * c + ch) * inner + i);
        y[at] = x[at] / std::pow(bias + alpha / static_cast<double>(size) * sum, beta);
      }
    }
  }
  return kernel::StoreDoubles(y, outputs[0]);
}

// ---------------------------------------------------------------------------------------------
// LpPool (1-3 spatial dims; the window as MaxPool reads it, nn_common.h): y = (sum over the
// window of |x|^p)^(1/p), padding contributing nothing; attribute p (an int from opset 2, a
// float before). GlobalLpPool: the same over every spatial position.

Result<double> LpOrder(const Node& node, int64_t opset) {
  if (!node.HasAttr("p")) return 2.0;
  if (opset < 2) {
    KILN_ASSIGN_OR_RETURN(float p, node.GetFloat("p"));
    return static_cast<double>(p);
  }
  KILN_ASSIGN_OR_RETURN(int64_t p, node.GetInt("p"));
  return static_cast<double>(p);
}

Status CheckLpPool(const Node& node, int64_t opset) {
  KILN_RETURN_IF_ERROR(CheckArity(node, 1, 1));
  KILN_RETURN_IF_ERROR(nn::ReadWindow(node, -1, /*kernel_required=*/true).status());
  KILN_ASSIGN_OR_RETURN(double p, LpOrder(node, opset));
  if (!(p > 0)) return BadAttr(node, "p", std::to_string(p), "> 0");
  return Status::OK();
}

struct LpGeometry {
  nn::Window win;
  Shape in, out;  // spatial extents
  std::vector<int64_t> pads;
};

Result<LpGeometry> LpShapes(const OpContext& ctx) {
  const Shape& x = ctx.type(0).shape;
  if (x.size() < 3 || x.size() > 5) {
    return BadInputShape(ctx, 0, "X", "[N, C, 1 to 3 spatial dims]");
  }
  LpGeometry g;
  g.in.assign(x.begin() + 2, x.end());
  KILN_ASSIGN_OR_RETURN(g.win, nn::ReadWindow(ctx.node(), static_cast<int64_t>(g.in.size()),
                                              /*kernel_required=*/true));
  KILN_RETURN_IF_ERROR(nn::ResolveWindow(ctx.where(), g.win, g.in, &g.out, &g.pads));
  return g;
}

Result<std::vector<TensorType>> InferLpPool(const OpContext& ctx) {
  KILN_RETURN_IF_ERROR(kernel::RequireFloatInput(ctx, 0));
  KILN_ASSIGN_OR_RETURN(LpGeometry g, LpShapes(ctx));
  Shape out = {ctx.type(0).shape[0], ctx.type(0).shape[1]};
  out.insert(out.end(), g.out.begin(), g.out.end());
  return std::vector<TensorType>{{ctx.type(0).dtype, out}};
}

Status RunLpPool(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_ASSIGN_OR_RETURN(LpGeometry g, LpShapes(ctx));
  KILN_ASSIGN_OR_RETURN(double p, LpOrder(ctx.node(), ctx.opset()));
  const Shape& xs = ctx.in(0).shape();
  // Lifted to 3 spatial dims with unit leading ones, so one loop nest serves every rank.
  const size_t lift = 3 - g.in.size();
  std::array<int64_t, 3> in{1, 1, 1}, out{1, 1, 1}, k{1, 1, 1}, st{1, 1, 1}, dil{1, 1, 1},
      pb{0, 0, 0};
  for (size_t i = 0; i < g.in.size(); ++i) {
    in[lift + i] = g.in[i];
    out[lift + i] = g.out[i];
    k[lift + i] = g.win.kernel[i];
    st[lift + i] = g.win.strides[i];
    dil[lift + i] = g.win.dilations[i];
    pb[lift + i] = g.pads[i];
  }
  const std::vector<double> x = kernel::ToDoubles(ctx.in(0));
  std::vector<double> y(static_cast<size_t>(outputs[0].numel()));
  const int64_t planes = xs[0] * xs[1];
  const int64_t in_plane = in[0] * in[1] * in[2], out_plane = out[0] * out[1] * out[2];
  for (int64_t pl = 0; pl < planes; ++pl) {
    for (int64_t o0 = 0; o0 < out[0]; ++o0) {
      for (int64_t o1 = 0; o1 < out[1]; ++o1) {
        for (int64_t o2 = 0; o2 < out[2]; ++o2) {
          double sum = 0.0;
          for (int64_t a = 0; a < k[0]; ++a) {
            const int64_t i0 = o0 * st[0] - pb[0] + a * dil[0];
            if (i0 < 0 || i0 >= in[0]) continue;
            for (int64_t b = 0; b < k[1]; ++b) {
              const int64_t i1 = o1 * st[1] - pb[1] + b * dil[1];
              if (i1 < 0 || i1 >= in[1]) continue;
              for (int64_t c = 0; c < k[2]; ++c) {
                const int64_t i2 = o2 * st[2] - pb[2] + c * dil[2];
                if (i2 < 0 || i2 >= in[2]) continue;
                sum += std::pow(
                    std::fabs(
                        x[static_cast<size_t>(pl * in_plane + (i0 * in[1] + i1) * in[2] + i2)]),
                    p);
              }
            }
          }
          y[static_cast<size_t>(pl * out_plane + (o0 * out[1] + o1) * out[2] + o2)] =
              std::pow(sum, 1.0 / p);
        }
      }
    }
  }
  return kernel::StoreDoubles(y, outputs[0]);
}

Status CheckGlobalLpPool(const Node& node, int64_t opset) {
  KILN_RETURN_IF_ERROR(CheckArity(node, 1, 1));
  KILN_ASSIGN_OR_RETURN(double p, LpOrder(node, opset));
  if (!(p > 0)) return BadAttr(node, "p", std::to_string(p), "> 0");
  return Status::OK();
}

Result<std::vector<TensorType>> InferGlobalLpPool(const OpContext& ctx) {
  KILN_RETURN_IF_ERROR(kernel::RequireFloatInput(ctx, 0));
  const Shape& x = ctx.type(0).shape;
  if (x.size() < 3) return BadInputShape(ctx, 0, "X", "[N, C, spatial...]");
  Shape out(x.size(), 1);
  out[0] = x[0];
  out[1] = x[1];
  return std::vector<TensorType>{{ctx.type(0).dtype, out}};
}

Status RunGlobalLpPool(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_ASSIGN_OR_RETURN(double p, LpOrder(ctx.node(), ctx.opset()));
  const std::vector<double> x = kernel::ToDoubles(ctx.in(0));
  const int64_t planes = outputs[0].numel();
  const int64_t plane = planes == 0 ? 0 : static_cast<int64_t>(x.size()) / planes;
  std::vector<double> y(static_cast<size_t>(planes));
  for (int64_t pl = 0; pl < planes; ++pl) {
    double sum = 0.0;
    for (int64_t i = 0; i < plane; ++i)
      sum += std::pow(std::fabs(x[static_cast<size_t>(pl * plane + i)]), p);
    y[static_cast<size_t>(pl)] = std::pow(sum, 1.0 / p);
  }
  return kernel::StoreDoubles(y, outputs[0]);
}

}  // namespace

std::vector<OpDef> VisionOpDefs() {
  constexpr int64_t kMax = INT64_MAX;
  return {
      {"GridSample", "", 16, kMax, CheckGridSample, InferGridSample, RunGridSample},
      {"RoiAlign", "", 10, kMax, CheckRoiAlign, InferRoiAlign, RunRoiAlign},
      {"NonMaxSuppression", "", 10, kMax, CheckNms, InferNms, RunNms},
      {"MaxUnpool", "", 9, kMax, CheckUnpool, InferUnpool, RunUnpool},
      {"LRN", "", 1, kMax, CheckLrn, InferLrn, RunLrn},
      {"LpPool", "", 1, kMax, CheckLpPool, InferLpPool, RunLpPool},
      {"GlobalLpPool", "", 1, kMax, CheckGlobalLpPool, InferGlobalLpPool, RunGlobalLpPool},
  };
}

}  // namespace kiln
