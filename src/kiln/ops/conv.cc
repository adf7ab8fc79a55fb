// The convolution op family: Conv and ConvTranspose (ops layer).
//
// Listed by ConvOpDefs (registered by registry.cc). Conv runs through oneDNN
// (ops/dnnl_kernels.h), ConvTranspose as GEMM + col2im; the window geometry is nn_common.h's,
// shared with the pools.
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
// Conv: 1-D to 3-D, NC[D]HW, weights [K, C/group, kernel...], optional bias [K], via oneDNN.

Status CheckConv(const Node& node, int64_t /*opset*/) {
  KILN_RETURN_IF_ERROR(CheckArity(node, 2, 3));
  KILN_RETURN_IF_ERROR(ReadWindow(node, -1, /*kernel_required=*/false).status());
  KILN_ASSIGN_OR_RETURN(int64_t group, IntOr(node, "group", 1));
  if (group < 1) {
    return Status::InvalidArgument(node.Describe() + ": group=" + std::to_string(group) +
                                   " must be >= 1");
  }
  return Status::OK();
}

// Conv's attributes: the window as written (ParseWindow; fitted to the weights per call) and
// group, read leniently as the kernel always has (check types it).
struct ConvAttrs : PreparedNode {
  Window window;
  int64_t group = 1;
};

Result<ConvAttrs> ParseConvAttrs(const Node& node, int64_t /*opset*/) {
  ConvAttrs a;
  KILN_ASSIGN_OR_RETURN(a.window, ParseWindow(node, /*kernel_required=*/false));
  a.group = node.GetInt("group", 1);
  return a;
}

struct ConvGeometry {
  Conv2dParams p;
  Shape out;
};

Result<ConvGeometry> ConvShapes(const OpContext& ctx) {
  const Node& node = ctx.node();
  const std::string where = ctx.where();
  const Shape& x = ctx.type(0).shape;
  const Shape& w = ctx.type(1).shape;
  if (x.size() < 3) {
    return Status::InvalidArgument(where + ": X " + ShapeToString(x) +
                                   " must have rank >= 3 ([N, C, spatial...])");
  }
  if (x.size() > 5) {
    return Status::Unimplemented(where + ": " + std::to_string(x.size() - 2) +
                                 "-D convolution (X rank " + std::to_string(x.size()) +
                                 ") is not supported (supported: 1-D to 3-D, X rank 3 to 5)");
  }
  if (w.size() != x.size()) {
    return Status::InvalidArgument(where + ": W " + ShapeToString(w) + " has rank " +
                                   std::to_string(w.size()) + " but X " + ShapeToString(x) +
                                   " has rank " + std::to_string(x.size()));
  }
  ConvAttrs scratch;
  KILN_ASSIGN_OR_RETURN(const ConvAttrs* attrs, PreparedOr(ctx, &scratch, ParseConvAttrs));
  const int64_t group = attrs->group;
  const int64_t C = x[1], K = w[0];
  if (group < 1 || C % group != 0) {
    return Status::InvalidArgument(where + ": group=" + std::to_string(group) +
                                   " does not divide " + std::to_string(C) + " input channels");
  }
  if (K % group != 0) {
    return Status::InvalidArgument(where + ": group=" + std::to_string(group) +
                                   " does not divide " + std::to_string(K) +
                                   " output channels (W " + ShapeToString(w) + ")");
  }
  if (w[1] != C / group) {
    return Status::InvalidArgument(where + ": W " + ShapeToString(w) + " has " +
                                   std::to_string(w[1]) + " input channels per group, expected " +
                                   std::to_string(C / group) + " (X has " + std::to_string(C) +
                                   " channels, group=" + std::to_string(group) + ")");
  }
  if (ctx.present(2)) {
    KILN_RETURN_IF_ERROR(RequireVector(ctx, 2, "B", K, "one bias per output channel"));
  }
  const Shape in_spatial(x.begin() + 2, x.end());
  const std::vector<int64_t> kernel(w.begin() + 2, w.end());
  KILN_ASSIGN_OR_RETURN(
      Window win, FitWindow(node, attrs->window, static_cast<int64_t>(in_spatial.size()), &kernel));
  Shape out_spatial;
  std::vector<int64_t> pads;
  KILN_RETURN_IF_ERROR(ResolveWindow(where, win, in_spatial, &out_spatial, &pads));

  ConvGeometry g;
  Conv2dParams& p = g.p;
  p.N = x[0];
  p.C = C;
  p.K = K;
  p.group = group;
  if (in_spatial.size() == 1) {  // 1-D: a 2-D convolution over a height-1 image
    p.W = in_spatial[0];
    p.S = kernel[0];
    p.stride_w = win.strides[0];
    p.dil_w = win.dilations[0];
    p.pad_l = pads[0];
    p.pad_r = pads[1];
  } else if (in_spatial.size() == 3) {  // 3-D: depth, height, width
    p.three_d = true;
    p.D = in_spatial[0];
    p.H = in_spatial[1];
    p.W = in_spatial[2];
    p.T = kernel[0];
    p.R = kernel[1];
    p.S = kernel[2];
    p.stride_d = win.strides[0];
    p.stride_h = win.strides[1];
    p.stride_w = win.strides[2];
    p.dil_d = win.dilations[0];
    p.dil_h = win.dilations[1];
    p.dil_w = win.dilations[2];
    p.pad_f = pads[0];
    p.pad_t = pads[1];
    p.pad_l = pads[2];
    p.pad_k = pads[3];
    p.pad_b = pads[4];
    p.pad_r = pads[5];
  } else {
    p.H = in_spatial[0];
    p.W = in_spatial[1];
    p.R = kernel[0];
    p.S = kernel[1];
    p.stride_h = win.strides[0];
    p.stride_w = win.strides[1];
    p.dil_h = win.dilations[0];
    p.dil_w = win.dilations[1];
    p.pad_t = pads[0];
    p.pad_l = pads[1];
    p.pad_b = pads[2];
    p.pad_r = pads[3];
  }
  g.out = {x[0], K};
  g.out.insert(g.out.end(), out_spatial.begin(), out_spatial.end());
  return g;
}

// Conv and ConvTranspose: W (input 1) and the optional bias (input 2) have X's dtype.
Status RequireWAndBiasDTypeOfX(const OpContext& ctx) {
  for (size_t i = 1; i < 3; ++i) {
    if (ctx.present(i) && ctx.type(i).dtype != ctx.type(0).dtype) {
      return Status::InvalidArgument(ctx.where() + ": input " + std::to_string(i) + " is " +
                                     ctx.type(i).ToString() + " but X is " +
                                     ctx.type(0).ToString() + "; dtypes must match");
    }
  }
  return Status::OK();
}

Result<std::vector<TensorType>> InferConv(const OpContext& ctx) {
  KILN_RETURN_IF_ERROR(RequireWAndBiasDTypeOfX(ctx));
  KILN_ASSIGN_OR_RETURN(ConvGeometry g, ConvShapes(ctx));
  return std::vector<TensorType>{{ctx.type(0).dtype, g.out}};
}

Status RunConv(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_RETURN_IF_ERROR(RequireFloat32(ctx, 0));
  KILN_ASSIGN_OR_RETURN(ConvGeometry g, ConvShapes(ctx));
  if (NumElements(g.out) == 0) return Status::OK();
  const float* bias = ctx.present(2) ? ctx.in(2).data<float>() : nullptr;
  return Conv2d(g.p, ctx.in(0).data<float>(), ctx.in(1).data<float>(), bias,
                outputs[0].data<float>(), ctx.num_threads())
      .WithContext(ctx.where());
}

// ---------------------------------------------------------------------------------------------
// ConvTranspose: 1-D to 3-D, X [N, C, spatial...], W [C, M/group, kernel...], optional bias
// [M]. Per spatial axis, with dk = (kernel - 1) * dilation + 1, the full (unpadded) extent is
// stride * (in - 1) + output_padding + dk. The output is output_shape when given, in * stride
// for SAME_UPPER/LOWER, else full minus pads; with output_shape or SAME the total padding is
// full - out, split with the odd element (floor division, so a negative total too) at the end
// for SAME_UPPER and at the beginning otherwise, as the ONNX spec and its test cases have it.
// Computed as a GEMM into columns (one row per output channel and kernel tap, one column per
// input position) through oneDNN, then col2im: each column entry is added where its tap lands.

Status CheckConvTranspose(const Node& node, int64_t /*opset*/) {
  KILN_RETURN_IF_ERROR(CheckArity(node, 2, 3));
  KILN_RETURN_IF_ERROR(ReadWindow(node, -1, /*kernel_required=*/false).status());
  KILN_ASSIGN_OR_RETURN(int64_t group, IntOr(node, "group", 1));
  if (group < 1) {
    return Status::InvalidArgument(node.Describe() + ": group=" + std::to_string(group) +
                                   " must be >= 1");
  }
  for (const char* attr : {"output_padding", "output_shape"}) {
    KILN_ASSIGN_OR_RETURN(std::vector<int64_t> v, IntsOr(node, attr, {}));
    for (int64_t x : v) {
      if (x < 0) {
        return Status::InvalidArgument(node.Describe() + ": " + attr + "=" + IntsToString(v) +
                                       " has value " + std::to_string(x) + ", expected >= 0");
      }
    }
  }
  return Status::OK();
}

// ConvTranspose's attributes: the window as written, group (lenient, as for Conv), and
// output_padding/output_shape as written (their lengths are checked against the rank per call).
struct ConvTransposeAttrs : PreparedNode {
  Window window;
  int64_t group = 1;
  bool has_output_padding = false;
  std::vector<int64_t> output_padding, output_shape;
};

Result<ConvTransposeAttrs> ParseConvTransposeAttrs(const Node& node, int64_t /*opset*/) {
  ConvTransposeAttrs a;
  KILN_ASSIGN_OR_RETURN(a.window, ParseWindow(node, /*kernel_required=*/false));
  a.group = node.GetInt("group", 1);
  a.has_output_padding = node.HasAttr("output_padding");
  KILN_ASSIGN_OR_RETURN(a.output_padding, IntsOr(node, "output_padding", {}));
  KILN_ASSIGN_OR_RETURN(a.output_shape, IntsOr(node, "output_shape", {}));
  return a;
}

struct ConvTransposeGeometry {
  int64_t N = 0, C = 0, M = 0, group = 1;
  // Spatial parameters lifted to 3-D (leading unit axes for 1-D and 2-D).
  std::array<int64_t, 3> in{}, out{}, kernel{}, stride{}, dil{}, pad_begin{};
  Shape out_shape;
};

int64_t FloorHalf(int64_t v) { return v >= 0 ? v / 2 : -((-v + 1) / 2); }

Result<ConvTransposeGeometry> ConvTransposeShapes(const OpContext& ctx) {
  const Node& node = ctx.node();
  const std::string where = ctx.where();
  const Shape& x = ctx.type(0).shape;
  const Shape& w = ctx.type(1).shape;
  if (x.size() < 3 || x.size() > 5) {
    return Status::InvalidArgument(where + ": X " + ShapeToString(x) +
                                   " must have rank 3 to 5 ([N, C, 1 to 3 spatial dims])");
  }
  if (w.size() != x.size()) {
    return Status::InvalidArgument(where + ": W " + ShapeToString(w) + " has rank " +
                                   std::to_string(w.size()) + " but X " + ShapeToString(x) +
                                   " has rank " + std::to_string(x.size()));
  }
  ConvTransposeGeometry g;
  g.N = x[0];
  g.C = x[1];
  ConvTransposeAttrs scratch;
  KILN_ASSIGN_OR_RETURN(const ConvTransposeAttrs* attrs,
                        PreparedOr(ctx, &scratch, ParseConvTransposeAttrs));
  g.group = attrs->group;
  if (g.group < 1 || g.C % g.group != 0) {
    return Status::InvalidArgument(where + ": group=" + std::to_string(g.group) +
                                   " does not divide " + std::to_string(g.C) + " input channels");
  }
  if (w[0] != g.C) {
    return Status::InvalidArgument(where + ": W " + ShapeToString(w) + " has " +
                                   std::to_string(w[0]) + " input channels, X " + ShapeToString(x) +
                                   " has " + std::to_string(g.C));
  }
  g.M = w[1] * g.group;
  if (ctx.present(2)) {
    KILN_RETURN_IF_ERROR(RequireVector(ctx, 2, "B", g.M, "one bias per output channel"));
  }
  const size_t r = x.size() - 2;
  const std::vector<int64_t> kernel(w.begin() + 2, w.end());
  KILN_ASSIGN_OR_RETURN(Window win,
                        FitWindow(node, attrs->window, static_cast<int64_t>(r), &kernel));
  const std::vector<int64_t> out_pad =
      attrs->has_output_padding ? attrs->output_padding : std::vector<int64_t>(r, 0);
  std::vector<int64_t> out_shape = attrs->output_shape;
  if (out_pad.size() != r) {
    return Status::InvalidArgument(where + ": output_padding=" + IntsToString(out_pad) + " has " +
                                   std::to_string(out_pad.size()) + " values, expected " +
                                   std::to_string(r) + " for " + std::to_string(r) +
                                   " spatial dims");
  }
  if (out_shape.size() == r + 2) out_shape.erase(out_shape.begin(), out_shape.begin() + 2);
  if (!out_shape.empty() && out_shape.size() != r) {
    return Status::InvalidArgument(where + ": output_shape=" + IntsToString(out_shape) + " has " +
                                   std::to_string(out_shape.size()) + " values, expected " +
                                   std::to_string(r) + " spatial dims");
  }
  g.out_shape = {g.N, g.M};
  const size_t lift = 3 - r;
  g.in.fill(1);
  g.out.fill(1);
  g.kernel.fill(1);
  g.stride.fill(1);
  g.dil.fill(1);
  for (size_t i = 0; i < r; ++i) {
    const int64_t in = x[2 + i], s = win.strides[i], d = win.dilations[i];
    if (out_pad[i] >= std::max(s, d)) {
      return Status::InvalidArgument(where + ": output_padding=" + IntsToString(out_pad) +
                                     " has value " + std::to_string(out_pad[i]) +
                                     " on spatial axis " + std::to_string(i) +
                                     ", expected less than the stride " + std::to_string(s) +
                                     " or the dilation " + std::to_string(d));
    }
    const int64_t full = s * (in - 1) + out_pad[i] + (kernel[i] - 1) * d + 1;
    int64_t out = 0, pb = 0;
    const bool same = win.auto_pad == "SAME_UPPER" || win.auto_pad == "SAME_LOWER";
    if (!out_shape.empty() || same) {
      out = out_shape.empty() ? in * s : out_shape[i];
      const int64_t total = full - out;
      pb = win.auto_pad == "SAME_UPPER" ? FloorHalf(total) : total - FloorHalf(total);
    } else {
      const int64_t pe = win.auto_pad == "VALID" ? 0 : win.pads[i + r];
      pb = win.auto_pad == "VALID" ? 0 : win.pads[i];
      out = full - pb - pe;
      if (out < 0) {
        return Status::InvalidArgument(where + ": pads=" + IntsToString(win.pads) +
                                       " remove more than the full output extent " +
                                       std::to_string(full) + " on spatial axis " +
                                       std::to_string(i));
      }
    }
    g.in[lift + i] = in;
    g.out[lift + i] = out;
    g.kernel[lift + i] = kernel[i];
    g.stride[lift + i] = s;
    g.dil[lift + i] = d;
    g.pad_begin[lift + i] = pb;
    g.out_shape.push_back(out);
  }
  return g;
}

Result<std::vector<TensorType>> InferConvTranspose(const OpContext& ctx) {
  KILN_RETURN_IF_ERROR(RequireWAndBiasDTypeOfX(ctx));
  KILN_ASSIGN_OR_RETURN(ConvTransposeGeometry g, ConvTransposeShapes(ctx));
  return std::vector<TensorType>{{ctx.type(0).dtype, g.out_shape}};
}

Status RunConvTranspose(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_RETURN_IF_ERROR(RequireFloat32(ctx, 0));
  KILN_ASSIGN_OR_RETURN(ConvTransposeGeometry g, ConvTransposeShapes(ctx));
  const float* x = ctx.in(0).data<float>();
  const float* w = ctx.in(1).data<float>();
  const float* bias = ctx.present(2) ? ctx.in(2).data<float>() : nullptr;
  const int64_t Cg = g.C / g.group, Mg = g.M / g.group;
  const int64_t in_plane = g.in[0] * g.in[1] * g.in[2];
  const int64_t out_plane = g.out[0] * g.out[1] * g.out[2];
  const int64_t taps = g.kernel[0] * g.kernel[1] * g.kernel[2];
  const int64_t rows = Mg * taps;  // one column row per (output channel, kernel tap)
  float* y = outputs[0].data<float>();
  for (int64_t n = 0; n < g.N; ++n) {
    for (int64_t m = 0; m < g.M; ++m) {
      std::fill(y + (n * g.M + m) * out_plane, y + (n * g.M + m + 1) * out_plane,
                bias ? bias[m] : 0.0f);
    }
  }
  if (in_plane == 0 || rows == 0) return Status::OK();
  // Input positions per GEMM, so the column buffer stays near 16 MiB whatever the layer size.
  const int64_t chunk = std::clamp<int64_t>((int64_t{1} << 22) / rows, 1, in_plane);
  std::vector<float> cols(static_cast<size_t>(rows * chunk));
  for (int64_t n = 0; n < g.N; ++n) {
    for (int64_t grp = 0; grp < g.group; ++grp) {
      const float* xg = x + (n * g.C + grp * Cg) * in_plane;  // [Cg, in_plane]
      const float* wg = w + grp * Cg * rows;                  // [Cg, Mg * taps]
      float* yg = y + (n * g.M + grp * Mg) * out_plane;
      for (int64_t p0 = 0; p0 < in_plane; p0 += chunk) {
        const int64_t len = std::min(chunk, in_plane - p0);
        // S1: cols[Mg * taps, len] = Wg^T * Xg[:, p0 : p0 + len].
        KILN_RETURN_IF_ERROR(Sgemm(true, false, rows, len, Cg, 1.0f, wg, rows, xg + p0, in_plane,
                                   0.0f, cols.data(), len, ctx.num_threads())
                                 .WithContext(ctx.where()));
        // S2: col2im, every column entry added where its tap lands in the output. The chunk
        // starts at input position p0; its positions are walked with a carried (i0, i1, i2).
        const int64_t s0 = p0 / (g.in[1] * g.in[2]), s1 = p0 / g.in[2] % g.in[1], s2 = p0 % g.in[2];
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t m = r / taps, t = r % taps;
          const int64_t k0 = t / (g.kernel[1] * g.kernel[2]);
          const int64_t k1 = t / g.kernel[2] % g.kernel[1], k2 = t % g.kernel[2];
          const float* col = cols.data() + r * len;
          float* ym = yg + m * out_plane;
          int64_t i0 = s0, i1 = s1, i2 = s2;
          for (int64_t q = 0; q < len; ++q) {
            const int64_t o0 = i0 * g.stride[0] + k0 * g.dil[0] - g.pad_begin[0];
            const int64_t o1 = i1 * g.stride[1] + k1 * g.dil[1] - g.pad_begin[1];
            const int64_t o2 = i2 * g.stride[2] + k2 * g.dil[2] - g.pad_begin[2];
            if (o0 >= 0 && o0 < g.out[0] && o1 >= 0 && o1 < g.out[1] && o2 >= 0 && o2 < g.out[2]) {
              ym[(o0 * g.out[1] + o1) * g.out[2] + o2] += col[q];
            }
            if (++i2 == g.in[2]) {
              i2 = 0;
              if (++i1 == g.in[1]) {
                i1 = 0;
                ++i0;
              }
            }
          }
        }
      }
    }
  }
  return Status::OK();
}

}  // namespace

std::vector<OpDef> ConvOpDefs() {
  // std::array of exactly the family's count: adding an op without growing it fails to compile;
  // a missing row would leave infer/run null, which Register rejects.
  const std::array<OpDef, 2> table = {{
      {"Conv", "", 1, INT64_MAX, CheckConv, InferConv, RunConv,
       PrepareWith<ConvAttrs, ParseConvAttrs>},
      {"ConvTranspose", "", 1, INT64_MAX, CheckConvTranspose, InferConvTranspose, RunConvTranspose,
       PrepareWith<ConvTransposeAttrs, ParseConvTransposeAttrs>},
  }};
  return {table.begin(), table.end()};
}

}  // namespace kiln
