// The neural-network op family (ops layer): MatMul, Gemm, Conv, ConvTranspose, pools and
// normalizations.
//
// Registered into the op registry by RegisterNnOps (called from registry.cc). Each op has a check
// (attributes only), an infer (shapes, with named errors) and a float32 reference kernel
// (MaxPool, which only compares, also takes float16, float64, int8 and uint8). GEMM and
// convolution (ConvTranspose as GEMM + col2im) run through oneDNN (ops/dnnl_kernels.h); pools
// and normalizations are plain loops, and normalization statistics are accumulated in double.
//
// Layout of the file: attribute helpers, the sliding-window geometry shared by Conv and the
// pools, then one section per op, then the registration table.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "src/kiln/ops/dnnl_kernels.h"
#include "src/kiln/ops/registry.h"

namespace kiln {
namespace {

// ---------------------------------------------------------------------------------------------
// Attribute helpers: absent -> default, present but mistyped -> the typed getter's error.

Result<int64_t> IntOr(const Node& node, const std::string& attr, int64_t dflt) {
  if (!node.HasAttr(attr)) return dflt;
  return node.GetInt(attr);
}

Result<float> FloatOr(const Node& node, const std::string& attr, float dflt) {
  if (!node.HasAttr(attr)) return dflt;
  return node.GetFloat(attr);
}

Result<std::string> StringOr(const Node& node, const std::string& attr, const std::string& dflt) {
  if (!node.HasAttr(attr)) return dflt;
  return node.GetString(attr);
}

Result<std::vector<int64_t>> IntsOr(const Node& node, const std::string& attr,
                                    std::vector<int64_t> dflt) {
  if (!node.HasAttr(attr)) return dflt;
  return node.GetInts(attr);
}

std::string IntsToString(const std::vector<int64_t>& v) { return ShapeToString(v); }

// Whether optional output i is requested (present with a non-empty name).
bool WantsOutput(const Node& node, size_t i) {
  return i < node.outputs.size() && !node.outputs[i].empty();
}

Status RequireFloat32(const OpContext& ctx, size_t input) {
  if (ctx.type(input).dtype != DType::kFloat32) {
    return UnsupportedDType(ctx, ctx.type(input).dtype, "float32");
  }
  return Status::OK();
}

// Error unless input i is a rank-1 tensor of `n` elements.
Status RequireVector(const OpContext& ctx, size_t i, const char* role, int64_t n,
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
std::vector<float> ExpandTo(const Tensor& t, const Shape& to) {
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
bool BroadcastsTo(const Shape& from, const Shape& to) {
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

// Reads and validates the window attributes. `spatial_rank` is the rank when the caller knows it
// (from shapes), -1 in check. Pools require kernel_shape; Conv passes its weights' spatial dims.
Result<Window> ReadWindow(const Node& node, int64_t spatial_rank, bool kernel_required,
                          const std::vector<int64_t>* kernel_from_weights = nullptr) {
  Window w;
  const std::string where = node.Describe();
  KILN_ASSIGN_OR_RETURN(w.kernel, IntsOr(node, "kernel_shape", {}));
  KILN_ASSIGN_OR_RETURN(w.strides, IntsOr(node, "strides", {}));
  KILN_ASSIGN_OR_RETURN(w.dilations, IntsOr(node, "dilations", {}));
  KILN_ASSIGN_OR_RETURN(w.pads, IntsOr(node, "pads", {}));
  KILN_ASSIGN_OR_RETURN(w.auto_pad, StringOr(node, "auto_pad", "NOTSET"));
  KILN_ASSIGN_OR_RETURN(int64_t ceil_mode, IntOr(node, "ceil_mode", 0));
  w.ceil_mode = ceil_mode != 0;
  if (w.auto_pad != "NOTSET" && w.auto_pad != "SAME_UPPER" && w.auto_pad != "SAME_LOWER" &&
      w.auto_pad != "VALID") {
    return Status::InvalidArgument(where + ": auto_pad='" + w.auto_pad +
                                   "' is not one of NOTSET, SAME_UPPER, SAME_LOWER, VALID");
  }
  if (!node.HasAttr("kernel_shape") && kernel_required) {
    return Status::InvalidArgument(where + ": attribute 'kernel_shape' is required");
  }
  if (node.HasAttr("kernel_shape") && w.kernel.empty()) {
    return Status::InvalidArgument(where + ": kernel_shape=[] is empty");
  }
  if (kernel_from_weights != nullptr) {
    if (!w.kernel.empty() && w.kernel != *kernel_from_weights) {
      return Status::InvalidArgument(where + ": kernel_shape=" + IntsToString(w.kernel) +
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
      return Status::InvalidArgument(where + ": " + a.name + "=" + IntsToString(*a.v) + " has " +
                                     std::to_string(a.v->size()) + " values, expected " +
                                     std::to_string(a.size) + " for " + std::to_string(r) +
                                     " spatial dims");
    }
    for (int64_t x : *a.v) {
      if (x < a.min) {
        return Status::InvalidArgument(where + ": " + a.name + "=" + IntsToString(*a.v) +
                                       " has value " + std::to_string(x) +
                                       ", expected >= " + std::to_string(a.min));
      }
    }
  }
  return w;
}

// Output extents and resolved pads (ONNX order) of `w` over input spatial dims `in`.
// REQUIRES: w.rank == in.size() and all window vectors filled (ReadWindow with a known rank).
Status ResolveWindow(const std::string& where, const Window& w, const Shape& in, Shape* out,
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

// ---------------------------------------------------------------------------------------------
// MatMul: numpy matmul. A 1-D A is [1,K] and a 1-D B is [K,1], the added dim removed after.

struct MatMulShapes {
  int64_t M = 1, K = 1, N = 1;
  Shape a_batch, b_batch, batch;  // batch = broadcast(a_batch, b_batch)
  Shape out;
};

Result<MatMulShapes> MatMulGeometry(const OpContext& ctx, const Shape& a, const Shape& b) {
  if (a.empty() || b.empty()) {
    return Status::InvalidArgument(ctx.where() + ": MatMul operands must have rank >= 1, got A " +
                                   ShapeToString(a) + " and B " + ShapeToString(b));
  }
  MatMulShapes g;
  const size_t ra = a.size(), rb = b.size();
  g.M = ra >= 2 ? a[ra - 2] : 1;
  g.K = a[ra - 1];
  const int64_t kb = rb >= 2 ? b[rb - 2] : b[0];
  g.N = rb >= 2 ? b[rb - 1] : 1;
  if (g.K != kb) {
    return Status::InvalidArgument(ctx.where() + ": inner dims differ: A " + ShapeToString(a) +
                                   " has K=" + std::to_string(g.K) + " but B " + ShapeToString(b) +
                                   " has K=" + std::to_string(kb));
  }
  if (ra > 2) g.a_batch.assign(a.begin(), a.end() - 2);
  if (rb > 2) g.b_batch.assign(b.begin(), b.end() - 2);
  auto batch = BroadcastShapes(g.a_batch, g.b_batch);
  if (!batch.ok()) {
    return Status::InvalidArgument(ctx.where() + ": batch dims of A " + ShapeToString(a) +
                                   " and B " + ShapeToString(b) +
                                   " do not broadcast: " + batch.status().message());
  }
  g.batch = *batch;
  g.out = g.batch;
  if (ra >= 2) g.out.push_back(g.M);
  if (rb >= 2) g.out.push_back(g.N);
  return g;
}

Result<std::vector<TensorType>> InferMatMul(const OpContext& ctx) {
  if (ctx.type(0).dtype != ctx.type(1).dtype) {
    return Status::InvalidArgument(ctx.where() + ": A is " + ctx.type(0).ToString() + " but B is " +
                                   ctx.type(1).ToString() + "; dtypes must match");
  }
  KILN_ASSIGN_OR_RETURN(MatMulShapes g, MatMulGeometry(ctx, ctx.type(0).shape, ctx.type(1).shape));
  return std::vector<TensorType>{{ctx.type(0).dtype, g.out}};
}

Status RunMatMul(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_RETURN_IF_ERROR(RequireFloat32(ctx, 0));
  const Tensor& a = ctx.in(0);
  const Tensor& b = ctx.in(1);
  KILN_ASSIGN_OR_RETURN(MatMulShapes g, MatMulGeometry(ctx, a.shape(), b.shape()));
  float* y = outputs[0].data<float>();
  const int64_t batches = NumElements(g.batch);
  const int64_t b_batches = NumElements(g.b_batch);
  // B shared by every batch and A contiguous over them: one GEMM with M * batches rows.
  if (b_batches == 1 && g.a_batch == g.batch) {
    return Sgemm(false, false, g.M * batches, g.N, g.K, 1.0f, a.data<float>(), g.K, b.data<float>(),
                 g.N, 0.0f, y, g.N, ctx.num_threads())
        .WithContext(ctx.where());
  }
  const std::vector<int64_t> a_strides = BroadcastStrides(g.a_batch, g.batch);
  const std::vector<int64_t> b_strides = BroadcastStrides(g.b_batch, g.batch);
  const std::vector<int64_t> out_strides = ContiguousStrides(g.batch);
  for (int64_t i = 0; i < batches; ++i) {
    int64_t ai = 0, bi = 0, rest = i;
    for (size_t d = 0; d < g.batch.size(); ++d) {
      const int64_t idx = rest / out_strides[d];
      rest %= out_strides[d];
      ai += idx * a_strides[d];
      bi += idx * b_strides[d];
    }
    KILN_RETURN_IF_ERROR(Sgemm(false, false, g.M, g.N, g.K, 1.0f, a.data<float>() + ai * g.M * g.K,
                               g.K, b.data<float>() + bi * g.K * g.N, g.N, 0.0f, y + i * g.M * g.N,
                               g.N, ctx.num_threads())
                             .WithContext(ctx.where()));
  }
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------
// Gemm: Y = alpha * A' * B' + beta * C, C unidirectionally broadcast to [M, N]. Opset < 11
// requires C; opset < 7 also has a `broadcast` attribute, tolerated (we always broadcast).

Status CheckGemm(const Node& node, int64_t opset) {
  KILN_RETURN_IF_ERROR(CheckArity(node, opset < 11 ? 3 : 2, 3));
  for (const char* attr : {"transA", "transB", "broadcast"}) {
    KILN_RETURN_IF_ERROR(IntOr(node, attr, 0).status());
  }
  for (const char* attr : {"alpha", "beta"}) {
    KILN_RETURN_IF_ERROR(FloatOr(node, attr, 1.0f).status());
  }
  return Status::OK();
}

struct GemmShapes {
  bool trans_a = false, trans_b = false;
  int64_t M = 0, N = 0, K = 0;
};

Result<GemmShapes> GemmGeometry(const OpContext& ctx) {
  GemmShapes g;
  g.trans_a = ctx.node().GetInt("transA", 0) != 0;
  g.trans_b = ctx.node().GetInt("transB", 0) != 0;
  const Shape& a = ctx.type(0).shape;
  const Shape& b = ctx.type(1).shape;
  if (a.size() != 2 || b.size() != 2) {
    return Status::InvalidArgument(ctx.where() + ": A " + ShapeToString(a) + " and B " +
                                   ShapeToString(b) + " must both be rank 2");
  }
  g.M = g.trans_a ? a[1] : a[0];
  g.K = g.trans_a ? a[0] : a[1];
  const int64_t kb = g.trans_b ? b[1] : b[0];
  g.N = g.trans_b ? b[0] : b[1];
  if (g.K != kb) {
    return Status::InvalidArgument(ctx.where() + ": inner dims differ: A " + ShapeToString(a) +
                                   " (transA=" + std::to_string(g.trans_a) +
                                   ") has K=" + std::to_string(g.K) + " but B " + ShapeToString(b) +
                                   " (transB=" + std::to_string(g.trans_b) +
                                   ") has K=" + std::to_string(kb));
  }
  if (ctx.present(2) && !BroadcastsTo(ctx.type(2).shape, {g.M, g.N})) {
    return Status::InvalidArgument(ctx.where() + ": C " + ShapeToString(ctx.type(2).shape) +
                                   " does not broadcast to [M,N]=" + ShapeToString({g.M, g.N}));
  }
  return g;
}

Result<std::vector<TensorType>> InferGemm(const OpContext& ctx) {
  for (size_t i = 1; i < 3; ++i) {
    if (ctx.present(i) && ctx.type(i).dtype != ctx.type(0).dtype) {
      return Status::InvalidArgument(ctx.where() + ": input " + std::to_string(i) + " is " +
                                     ctx.type(i).ToString() + " but A is " +
                                     ctx.type(0).ToString() + "; dtypes must match");
    }
  }
  KILN_ASSIGN_OR_RETURN(GemmShapes g, GemmGeometry(ctx));
  return std::vector<TensorType>{{ctx.type(0).dtype, {g.M, g.N}}};
}

Status RunGemm(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_RETURN_IF_ERROR(RequireFloat32(ctx, 0));
  KILN_ASSIGN_OR_RETURN(GemmShapes g, GemmGeometry(ctx));
  const float alpha = ctx.node().GetFloat("alpha", 1.0f);
  const float beta = ctx.node().GetFloat("beta", 1.0f);
  float* y = outputs[0].data<float>();
  // Y starts as beta * C (broadcast) and the GEMM accumulates into it. beta == 0 skips C
  // entirely, as other runtimes do (so inf/nan in an unused C do not leak into Y).
  const bool use_c = ctx.present(2) && beta != 0.0f;
  if (use_c) {
    const std::vector<float> c = ExpandTo(ctx.in(2), {g.M, g.N});
    for (size_t i = 0; i < c.size(); ++i) y[i] = beta * c[i];
  }
  const Tensor& a = ctx.in(0);
  const Tensor& b = ctx.in(1);
  return Sgemm(g.trans_a, g.trans_b, g.M, g.N, g.K, alpha, a.data<float>(), a.dim(1),
               b.data<float>(), b.dim(1), use_c ? 1.0f : 0.0f, y, g.N, ctx.num_threads())
      .WithContext(ctx.where());
}

// ---------------------------------------------------------------------------------------------
// Conv: 1-D and 2-D, NCHW, weights [K, C/group, kernel...], optional bias [K], via oneDNN.

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
  if (x.size() > 4) {
    return Status::Unimplemented(where + ": " + std::to_string(x.size() - 2) +
                                 "-D convolution (X rank " + std::to_string(x.size()) +
                                 ") is not supported (supported: 1-D and 2-D, X rank 3 or 4)");
  }
  if (w.size() != x.size()) {
    return Status::InvalidArgument(where + ": W " + ShapeToString(w) + " has rank " +
                                   std::to_string(w.size()) + " but X " + ShapeToString(x) +
                                   " has rank " + std::to_string(x.size()));
  }
  const int64_t group = node.GetInt("group", 1);
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
  KILN_ASSIGN_OR_RETURN(Window win,
                        ReadWindow(node, static_cast<int64_t>(in_spatial.size()), false, &kernel));
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
  g.group = node.GetInt("group", 1);
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
  KILN_ASSIGN_OR_RETURN(Window win, ReadWindow(node, static_cast<int64_t>(r), false, &kernel));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> out_pad,
                        IntsOr(node, "output_padding", std::vector<int64_t>(r, 0)));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> out_shape, IntsOr(node, "output_shape", {}));
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

Result<PoolGeometry> PoolShapes(const OpContext& ctx) {
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
  KILN_ASSIGN_OR_RETURN(Window win, ReadWindow(ctx.node(), rank, true));
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
  KILN_ASSIGN_OR_RETURN(PoolGeometry g, PoolShapes(ctx));
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
  KILN_ASSIGN_OR_RETURN(PoolGeometry g, PoolShapes(ctx));
  const bool count_include_pad = ctx.node().GetInt("count_include_pad", 0) != 0;
  bool column_major = false;
  if constexpr (kKind == PoolKind::kMax) {
    KILN_ASSIGN_OR_RETURN(int64_t order, StorageOrder(ctx.node()));
    column_major = order == 1;
  }
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

// ---------------------------------------------------------------------------------------------
// Normalizations. Statistics are two-pass (mean, then mean squared deviation) in double.

struct Moments {
  double mean = 0;
  double inv_std = 0;  // 1 / sqrt(var + epsilon)
};

// Mean and inverse standard deviation of the n contiguous elements at x.
Moments ComputeMoments(const float* x, int64_t n, double epsilon) {
  Moments m;
  if (n == 0) return m;
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += x[i];
  m.mean = sum / static_cast<double>(n);
  double sq = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = x[i] - m.mean;
    sq += d * d;
  }
  m.inv_std = 1.0 / std::sqrt(sq / static_cast<double>(n) + epsilon);
  return m;
}

Status CheckEpsilon(const Node& node) {
  KILN_ASSIGN_OR_RETURN(float eps, FloatOr(node, "epsilon", 1e-5f));
  if (!(eps >= 0)) {
    return Status::InvalidArgument(node.Describe() + ": epsilon=" + std::to_string(eps) +
                                   " must be >= 0");
  }
  return Status::OK();
}

// All present inputs must be float32 like X (mixed T/T1/T2 forms are not supported).
Status RequireAllFloat32(const OpContext& ctx) {
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    if (ctx.present(i)) KILN_RETURN_IF_ERROR(RequireFloat32(ctx, i));
  }
  return Status::OK();
}

Status RequireChannelsFirst(const OpContext& ctx, size_t min_rank) {
  const Shape& x = ctx.type(0).shape;
  if (x.size() < min_rank) {
    return Status::InvalidArgument(ctx.where() + ": X " + ShapeToString(x) + " must have rank >= " +
                                   std::to_string(min_rank) + " ([N, C, ...])");
  }
  return Status::OK();
}

// BatchNormalization, inference form: y = (x - mean) / sqrt(var + eps) * scale + B per channel.
Status CheckBatchNorm(const Node& node, int64_t opset) {
  KILN_RETURN_IF_ERROR(CheckArity(node, 5, 5, 5));
  KILN_RETURN_IF_ERROR(CheckEpsilon(node));
  KILN_ASSIGN_OR_RETURN(int64_t training, IntOr(node, "training_mode", 0));
  if (training != 0) {
    return Status::Unimplemented(node.Describe() + ": training_mode=" + std::to_string(training) +
                                 " is not supported (inference only)");
  }
  KILN_ASSIGN_OR_RETURN(int64_t spatial, IntOr(node, "spatial", 1));
  if (opset < 9 && spatial != 1) {
    return Status::Unimplemented(node.Describe() + ": spatial=" + std::to_string(spatial) +
                                 " (per-activation statistics) is not supported");
  }
  for (size_t i = 1; i < node.outputs.size(); ++i) {
    if (WantsOutput(node, i)) {
      return Status::Unimplemented(node.Describe() + ": output " + std::to_string(i) + " ('" +
                                   node.outputs[i] +
                                   "') exists only in training mode, which is not supported");
    }
  }
  return Status::OK();
}

Result<std::vector<TensorType>> InferBatchNorm(const OpContext& ctx) {
  KILN_RETURN_IF_ERROR(RequireChannelsFirst(ctx, 2));
  const int64_t C = ctx.type(0).shape[1];
  const char* roles[] = {"X", "scale", "B", "input_mean", "input_var"};
  for (size_t i = 1; i < 5; ++i) {
    KILN_RETURN_IF_ERROR(RequireVector(ctx, i, roles[i], C, "one per channel of X"));
  }
  std::vector<TensorType> out{ctx.type(0)};
  return out;
}

Status RunBatchNorm(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_RETURN_IF_ERROR(RequireAllFloat32(ctx));
  const Tensor& xt = ctx.in(0);
  const double eps = ctx.node().GetFloat("epsilon", 1e-5f);
  const int64_t N = xt.dim(0), C = xt.dim(1);
  const int64_t plane = N * C == 0 ? 0 : xt.numel() / (N * C);
  const float* scale = ctx.in(1).data<float>();
  const float* bias = ctx.in(2).data<float>();
  const float* mean = ctx.in(3).data<float>();
  const float* var = ctx.in(4).data<float>();
  // Folded per channel into y = x * a + b.
  std::vector<double> a(static_cast<size_t>(C)), b(static_cast<size_t>(C));
  for (int64_t c = 0; c < C; ++c) {
    a[c] = scale[c] / std::sqrt(static_cast<double>(var[c]) + eps);
    b[c] = bias[c] - mean[c] * a[c];
  }
  const float* x = xt.data<float>();
  float* y = outputs[0].data<float>();
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t c = 0; c < C; ++c) {
      const int64_t off = (n * C + c) * plane;
      for (int64_t i = 0; i < plane; ++i) {
        y[off + i] = static_cast<float>(x[off + i] * a[c] + b[c]);
      }
    }
  }
  return Status::OK();
}

// InstanceNormalization: statistics per (n, c) over the spatial dims; scale and B per channel.
Status CheckInstanceNorm(const Node& node, int64_t /*opset*/) {
  KILN_RETURN_IF_ERROR(CheckArity(node, 3, 3));
  return CheckEpsilon(node);
}

Result<std::vector<TensorType>> InferInstanceNorm(const OpContext& ctx) {
  KILN_RETURN_IF_ERROR(RequireChannelsFirst(ctx, 3));
  const int64_t C = ctx.type(0).shape[1];
  KILN_RETURN_IF_ERROR(RequireVector(ctx, 1, "scale", C, "one per channel of X"));
  KILN_RETURN_IF_ERROR(RequireVector(ctx, 2, "B", C, "one per channel of X"));
  return std::vector<TensorType>{ctx.type(0)};
}

Status RunInstanceNorm(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_RETURN_IF_ERROR(RequireAllFloat32(ctx));
  const Tensor& xt = ctx.in(0);
  const double eps = ctx.node().GetFloat("epsilon", 1e-5f);
  const int64_t N = xt.dim(0), C = xt.dim(1);
  const int64_t plane = N * C == 0 ? 0 : xt.numel() / (N * C);
  const float* scale = ctx.in(1).data<float>();
  const float* bias = ctx.in(2).data<float>();
  const float* x = xt.data<float>();
  float* y = outputs[0].data<float>();
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t c = 0; c < C; ++c) {
      const int64_t off = (n * C + c) * plane;
      const Moments m = ComputeMoments(x + off, plane, eps);
      for (int64_t i = 0; i < plane; ++i) {
        y[off + i] = static_cast<float>((x[off + i] - m.mean) * m.inv_std * scale[c] + bias[c]);
      }
    }
  }
  return Status::OK();
}

// LayerNormalization (opset 17): statistics over dims [axis, rank); Scale and optional B
// broadcast to those dims. Optional outputs Mean and InvStdDev have X's shape with the
// normalized dims set to 1.
Status CheckLayerNorm(const Node& node, int64_t /*opset*/) {
  KILN_RETURN_IF_ERROR(CheckArity(node, 2, 3, 3));
  KILN_RETURN_IF_ERROR(CheckEpsilon(node));
  KILN_RETURN_IF_ERROR(IntOr(node, "axis", -1).status());
  KILN_ASSIGN_OR_RETURN(int64_t stash_type, IntOr(node, "stash_type", 1));
  if (stash_type != 1 && (WantsOutput(node, 1) || WantsOutput(node, 2))) {
    return Status::Unimplemented(node.Describe() + ": stash_type=" + std::to_string(stash_type) +
                                 " with Mean/InvStdDev outputs is not supported (supported: 1, "
                                 "float32)");
  }
  return Status::OK();
}

struct LayerNormShapes {
  int64_t axis = 0, outer = 1, inner = 1;
  Shape normalized;  // X.shape[axis:]
  Shape stat;        // X.shape with normalized dims set to 1
};

Result<LayerNormShapes> LayerNormGeometry(const OpContext& ctx) {
  const Shape& x = ctx.type(0).shape;
  LayerNormShapes g;
  auto axis = NormalizeAxis(ctx.node().GetInt("axis", -1), static_cast<int64_t>(x.size()), "axis");
  if (!axis.ok()) return axis.status().WithContext(ctx.where());
  g.axis = *axis;
  g.normalized.assign(x.begin() + g.axis, x.end());
  g.stat = x;
  for (size_t i = static_cast<size_t>(g.axis); i < x.size(); ++i) g.stat[i] = 1;
  g.inner = NumElements(g.normalized);
  g.outer = NumElements(Shape(x.begin(), x.begin() + g.axis));
  const char* roles[] = {"X", "Scale", "B"};
  for (size_t i = 1; i < 3; ++i) {
    if (ctx.present(i) && !BroadcastsTo(ctx.type(i).shape, g.normalized)) {
      return Status::InvalidArgument(ctx.where() + ": input " + std::to_string(i) + " ('" +
                                     roles[i] + "') has shape " + ShapeToString(ctx.type(i).shape) +
                                     ", expected to broadcast to the normalized dims " +
                                     ShapeToString(g.normalized) + " of X " + ShapeToString(x) +
                                     " (axis=" + std::to_string(g.axis) + ")");
    }
  }
  return g;
}

Result<std::vector<TensorType>> InferLayerNorm(const OpContext& ctx) {
  KILN_ASSIGN_OR_RETURN(LayerNormShapes g, LayerNormGeometry(ctx));
  std::vector<TensorType> out{ctx.type(0)};
  for (size_t i = 1; i < 3; ++i) {
    if (WantsOutput(ctx.node(), i)) {
      out.resize(i + 1, TensorType{DType::kFloat32, g.stat});
    }
  }
  return out;
}

Status RunLayerNorm(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_RETURN_IF_ERROR(RequireAllFloat32(ctx));
  KILN_ASSIGN_OR_RETURN(LayerNormShapes g, LayerNormGeometry(ctx));
  const double eps = ctx.node().GetFloat("epsilon", 1e-5f);
  const std::vector<float> scale = ExpandTo(ctx.in(1), g.normalized);
  const std::vector<float> bias =
      ctx.present(2) ? ExpandTo(ctx.in(2), g.normalized) : std::vector<float>(g.inner, 0.0f);
  const float* x = ctx.in(0).data<float>();
  float* y = outputs[0].data<float>();
  float* mean_out = outputs.size() > 1 ? outputs[1].data<float>() : nullptr;
  float* inv_std_out = outputs.size() > 2 ? outputs[2].data<float>() : nullptr;
  for (int64_t r = 0; r < g.outer; ++r) {
    const Moments m = ComputeMoments(x + r * g.inner, g.inner, eps);
    for (int64_t j = 0; j < g.inner; ++j) {
      const int64_t i = r * g.inner + j;
      y[i] = static_cast<float>((x[i] - m.mean) * m.inv_std * scale[j] + bias[j]);
    }
    if (mean_out != nullptr) mean_out[r] = static_cast<float>(m.mean);
    if (inv_std_out != nullptr) inv_std_out[r] = static_cast<float>(m.inv_std);
  }
  return Status::OK();
}

// GroupNormalization: statistics per (n, group) over C/num_groups channels and the spatial
// dims. Opset 18 takes scale and bias per group ([num_groups]); opset 21 changed them to per
// channel ([C]), and both forms are read here by opset.
Status CheckGroupNorm(const Node& node, int64_t /*opset*/) {
  KILN_RETURN_IF_ERROR(CheckArity(node, 3, 3));
  KILN_RETURN_IF_ERROR(CheckEpsilon(node));
  KILN_ASSIGN_OR_RETURN(int64_t groups, node.GetInt("num_groups"));
  if (groups < 1) {
    return Status::InvalidArgument(node.Describe() + ": num_groups=" + std::to_string(groups) +
                                   " must be >= 1");
  }
  return Status::OK();
}

Result<std::vector<TensorType>> InferGroupNorm(const OpContext& ctx) {
  KILN_RETURN_IF_ERROR(RequireChannelsFirst(ctx, 2));
  const int64_t C = ctx.type(0).shape[1];
  const int64_t groups = ctx.node().GetInt("num_groups", 1);
  if (groups < 1 || C % groups != 0) {
    return Status::InvalidArgument(ctx.where() + ": num_groups=" + std::to_string(groups) +
                                   " does not divide " + std::to_string(C) + " channels of X " +
                                   ShapeToString(ctx.type(0).shape));
  }
  const bool per_group = ctx.opset() < 21;
  const int64_t n = per_group ? groups : C;
  const std::string why = per_group ? "one per group at opset < 21" : "one per channel";
  KILN_RETURN_IF_ERROR(RequireVector(ctx, 1, "scale", n, why));
  KILN_RETURN_IF_ERROR(RequireVector(ctx, 2, "bias", n, why));
  return std::vector<TensorType>{ctx.type(0)};
}

Status RunGroupNorm(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_RETURN_IF_ERROR(RequireAllFloat32(ctx));
  const Tensor& xt = ctx.in(0);
  const double eps = ctx.node().GetFloat("epsilon", 1e-5f);
  const int64_t groups = ctx.node().GetInt("num_groups", 1);
  const bool per_group = ctx.opset() < 21;
  const int64_t N = xt.dim(0), C = xt.dim(1);
  const int64_t plane = N * C == 0 ? 0 : xt.numel() / (N * C);
  const int64_t channels_per_group = C / groups;
  const float* scale = ctx.in(1).data<float>();
  const float* bias = ctx.in(2).data<float>();
  const float* x = xt.data<float>();
  float* y = outputs[0].data<float>();
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t grp = 0; grp < groups; ++grp) {
      const int64_t off = (n * C + grp * channels_per_group) * plane;
      const Moments m = ComputeMoments(x + off, channels_per_group * plane, eps);
      for (int64_t cg = 0; cg < channels_per_group; ++cg) {
        const int64_t c = grp * channels_per_group + cg;
        const int64_t k = per_group ? grp : c;
        for (int64_t i = 0; i < plane; ++i) {
          const int64_t at = off + cg * plane + i;
          y[at] = static_cast<float>((x[at] - m.mean) * m.inv_std * scale[k] + bias[k]);
        }
      }
    }
  }
  return Status::OK();
}

Status CheckBinary(const Node& node, int64_t /*opset*/) { return CheckArity(node, 2, 2); }
Status CheckUnary(const Node& node, int64_t /*opset*/) { return CheckArity(node, 1, 1); }

// The family's catalogue, one row per op and opset range.
inline constexpr size_t kNnOpCount = 12;

}  // namespace

void RegisterNnOps(OpRegistry& r) {
  // std::array of exactly kNnOpCount rows: adding an op without bumping the count fails to
  // compile; a missing row would leave infer/run null, which Register rejects.
  const std::array<OpDef, kNnOpCount> defs = {{
      {"MatMul", "", 1, INT64_MAX, CheckBinary, InferMatMul, RunMatMul},
      {"Gemm", "", 1, INT64_MAX, CheckGemm, InferGemm, RunGemm},
      {"Conv", "", 1, INT64_MAX, CheckConv, InferConv, RunConv},
      {"ConvTranspose", "", 1, INT64_MAX, CheckConvTranspose, InferConvTranspose, RunConvTranspose},
      {"MaxPool", "", 1, INT64_MAX, CheckPool, InferPool<PoolKind::kMax>, RunPool<PoolKind::kMax>},
      {"AveragePool", "", 1, INT64_MAX, CheckPool, InferPool<PoolKind::kAverage>,
       RunPool<PoolKind::kAverage>},
      {"GlobalAveragePool", "", 1, INT64_MAX, CheckUnary, InferGlobalPool,
       RunGlobalPool<PoolKind::kAverage>},
      {"GlobalMaxPool", "", 1, INT64_MAX, CheckUnary, InferGlobalPool,
       RunGlobalPool<PoolKind::kMax>},
      {"BatchNormalization", "", 1, INT64_MAX, CheckBatchNorm, InferBatchNorm, RunBatchNorm},
      {"InstanceNormalization", "", 1, INT64_MAX, CheckInstanceNorm, InferInstanceNorm,
       RunInstanceNorm},
      {"LayerNormalization", "", 17, INT64_MAX, CheckLayerNorm, InferLayerNorm, RunLayerNorm},
      {"GroupNormalization", "", 18, INT64_MAX, CheckGroupNorm, InferGroupNorm, RunGroupNorm},
  }};
  for (const OpDef& def : defs) r.Register(def);
}

}  // namespace kiln
