// Reduce op family (ops layer): ops that work along axes. Softmax, LogSoftmax and Hardmax;
// ReduceSum / Mean / Max / Min / Prod / L1 / L2 / SumSquare / LogSum / LogSumExp; ArgMax, ArgMin,
// CumSum, LpNormalization, MeanVarianceNormalization and TopK; each with its reference kernel.
//
// ReduceOpDefs is registered by OpRegistry::Global() (registry.cc). Both families changed form
// across opsets, and the registry lists each form as its own opset range; the shared kernels read
// the form by ctx.opset():
// - Softmax/LogSoftmax before 13 flatten the input to 2-D at `axis` (default 1) and normalize
//   each row; from 13 they normalize along `axis` alone (default -1). Both subtract the maximum
//   first and sum in double, so large logits neither overflow nor lose precision.
// - ReduceSum takes `axes` as an attribute before 13 and as optional input 1 from 13; the other
//   reductions switch at 18. The input form adds noop_with_empty_axes (empty axes then means
//   identity instead of "all axes"). keepdims defaults to 1.
// Reductions accept float32 and float64 (accumulated in double) and, except ReduceL2 / LogSum /
// LogSumExp, int64 and int32 (accumulated in int64, wrapping); the Softmax family, Hardmax,
// LpNormalization and MeanVarianceNormalization are float32 only; ArgMax/ArgMin, CumSum and TopK
// take float32, float64, int64 and int32.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "src/kiln/ops/plans.h"
#include "src/kiln/ops/registry.h"

namespace kiln {
namespace {

// ---------------------------------------------------------------------------------------------
// Softmax and LogSoftmax

Status CheckSoftmax(const Node& node, int64_t) {
  KILN_RETURN_IF_ERROR(CheckArity(node, 1, 1));
  if (node.HasAttr("axis")) return node.GetInt("axis").status();
  return Status::OK();
}

// The input viewed as [outer, dim, inner], normalized along `dim`.
struct SoftmaxGeometry {
  int64_t outer = 1, dim = 1, inner = 1;
};

Result<SoftmaxGeometry> SoftmaxShape(const OpContext& ctx, const Shape& shape) {
  const bool legacy = ctx.opset() < 13;
  const int64_t rank = static_cast<int64_t>(shape.size());
  const int64_t raw_axis = ctx.node().GetInt("axis", legacy ? 1 : -1);
  KILN_ASSIGN_OR_RETURN(int64_t axis,
                        NormalizeAxis(raw_axis, rank, ctx.where() + ": attribute 'axis'"));
  SoftmaxGeometry g;
  for (int64_t d = 0; d < rank; ++d) {
    if (d < axis) {
      g.outer *= shape[d];
    } else if (d == axis || legacy) {
      g.dim *= shape[d];  // legacy: every dim from axis on is one flattened row
    } else {
      g.inner *= shape[d];
    }
  }
  return g;
}

Result<std::vector<TensorType>> InferSoftmax(const OpContext& ctx) {
  KILN_ASSIGN_OR_RETURN(std::vector<TensorType> out, InferSameAsInput0(ctx));
  if (out[0].dtype != DType::kFloat32) return UnsupportedDType(ctx, out[0].dtype, "float32");
  KILN_RETURN_IF_ERROR(SoftmaxShape(ctx, out[0].shape).status());
  return out;
}

template <bool kLog>
Status RunSoftmax(const OpContext& ctx, std::vector<Tensor>& outputs) {
  const Tensor& x = ctx.in(0);
  if (x.dtype() != DType::kFloat32) return UnsupportedDType(ctx, x.dtype(), "float32");
  KILN_ASSIGN_OR_RETURN(SoftmaxGeometry g, SoftmaxShape(ctx, x.shape()));
  const float* px = x.data<float>();
  float* py = outputs[0].data<float>();
  for (int64_t o = 0; o < g.outer; ++o) {
    for (int64_t i = 0; i < g.inner; ++i) {
      // Elements base, base + inner, ... form one slice along the axis.
      const int64_t base = o * g.dim * g.inner + i;
      float max = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < g.dim; ++j) max = std::max(max, px[base + j * g.inner]);
      double sum = 0;
      for (int64_t j = 0; j < g.dim; ++j) sum += std::exp(double{px[base + j * g.inner]} - max);
      if constexpr (kLog) {
        const double log_sum = std::log(sum);
        for (int64_t j = 0; j < g.dim; ++j) {
          const int64_t k = base + j * g.inner;
          py[k] = static_cast<float>(double{px[k]} - max - log_sum);
        }
      } else {
        for (int64_t j = 0; j < g.dim; ++j) {
          const int64_t k = base + j * g.inner;
          py[k] = static_cast<float>(std::exp(double{px[k]} - max) / sum);
        }
      }
    }
  }
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------
// Reductions

enum class ReduceKind { kSum, kMean, kMax, kMin, kProd, kL1, kL2, kSumSquare, kLogSum, kLogSumExp };

// The opset from which `axes` is input 1 rather than an attribute.
constexpr int64_t AxesInputSince(ReduceKind kind) { return kind == ReduceKind::kSum ? 13 : 18; }

template <ReduceKind kKind>
Status CheckReduce(const Node& node, int64_t opset) {
  const bool axes_input = opset >= AxesInputSince(kKind);
  KILN_RETURN_IF_ERROR(CheckArity(node, 1, axes_input ? 2 : 1));
  if (node.HasAttr("keepdims")) KILN_RETURN_IF_ERROR(node.GetInt("keepdims").status());
  if (axes_input) {
    if (node.HasAttr("axes")) {
      return Status::InvalidArgument(
          node.Describe() + ": attribute 'axes' is not allowed at opset " + std::to_string(opset) +
          " (from opset " + std::to_string(AxesInputSince(kKind)) + " axes is input 1)");
    }
    if (node.HasAttr("noop_with_empty_axes")) {
      KILN_RETURN_IF_ERROR(node.GetInt("noop_with_empty_axes").status());
    }
  } else if (node.HasAttr("axes")) {
    KILN_RETURN_IF_ERROR(node.GetInts("axes").status());
  }
  return Status::OK();
}

std::string AxesToString(const std::vector<int64_t>& axes) {
  std::string s = "[";
  for (size_t i = 0; i < axes.size(); ++i) s += (i ? "," : "") + std::to_string(axes[i]);
  return s + "]";
}

Result<ReducePlan> PlanReduce(const OpContext& ctx, int64_t axes_input_since) {
  const Node& node = ctx.node();
  const Shape& shape = ctx.type(0).shape;
  const int64_t rank = static_cast<int64_t>(shape.size());
  std::vector<int64_t> axes;
  bool noop_with_empty_axes = false;
  if (ctx.opset() >= axes_input_since) {
    if (ctx.present(1)) {
      KILN_ASSIGN_OR_RETURN(const Tensor* t, ctx.RequireValue(1, "axes"));
      if (t->dtype() != DType::kInt64 && t->dtype() != DType::kInt32) {
        return Status::InvalidArgument(ctx.where() + ": input 1 ('axes') is " + t->TypeString() +
                                       ", expected int64");
      }
      axes = t->ToInt64Vector();
    }
    noop_with_empty_axes = node.GetInt("noop_with_empty_axes", 0) != 0;
  } else {
    axes = node.GetInts("axes", {});
  }
  const bool keepdims = node.GetInt("keepdims", 1) != 0;

  ReducePlan plan;
  if (axes.empty() && noop_with_empty_axes) {
    plan.noop = true;
    plan.kept_shape = plan.out_shape = shape;
    return plan;
  }
  plan.reduced.assign(shape.size(), axes.empty());  // empty axes: all of them
  for (int64_t a : axes) {
    KILN_ASSIGN_OR_RETURN(int64_t axis,
                          NormalizeAxis(a, rank, ctx.where() + ": axes " + AxesToString(axes)));
    if (plan.reduced[axis]) {
      return Status::InvalidArgument(ctx.where() + ": axes " + AxesToString(axes) + " name dim " +
                                     std::to_string(axis) + " more than once");
    }
    plan.reduced[axis] = true;
  }
  for (int64_t d = 0; d < rank; ++d) {
    plan.kept_shape.push_back(plan.reduced[d] ? 1 : shape[d]);
    if (!plan.reduced[d] || keepdims) plan.out_shape.push_back(plan.kept_shape.back());
  }
  return plan;
}

// ReduceL2, ReduceLogSum and ReduceLogSumExp end in a square root or a log: float32 and float64
// only.
bool FloatOnly(ReduceKind kind) {
  return kind == ReduceKind::kL2 || kind == ReduceKind::kLogSum || kind == ReduceKind::kLogSumExp;
}

bool SupportsDType(ReduceKind kind, DType t) {
  if (t == DType::kFloat32 || t == DType::kFloat64) return true;
  return !FloatOnly(kind) && (t == DType::kInt64 || t == DType::kInt32);
}

Status RequireReduceDType(const OpContext& ctx, ReduceKind kind, DType t) {
  if (SupportsDType(kind, t)) return Status::OK();
  return UnsupportedDType(ctx, t,
                          FloatOnly(kind) ? "float32, float64" : "float32, float64, int64, int32");
}

// Calls f(i, o) for every input element i in row-major order, with o the offset of the output
// element it reduces into: o advances by the output stride of each input dim (0 on reduced dims).
template <typename F>
void ForEachReduced(const Shape& shape, const ReducePlan& plan, F&& f) {
  const size_t rank = shape.size();
  const int64_t n = NumElements(shape);
  if (n == 0) return;
  std::vector<int64_t> out_stride(rank, 0);
  const std::vector<int64_t> kept_strides = ContiguousStrides(plan.kept_shape);
  for (size_t d = 0; d < rank; ++d) out_stride[d] = plan.reduced[d] ? 0 : kept_strides[d];
  std::vector<int64_t> index(rank, 0);
  int64_t o = 0;
  for (int64_t i = 0; i < n; ++i) {
    f(i, o);
    for (size_t d = rank; d-- > 0;) {
      o += out_stride[d];
      if (++index[d] < shape[d]) break;
      o -= out_stride[d] * shape[d];
      index[d] = 0;
    }
  }
}

template <ReduceKind kKind>
Result<std::vector<TensorType>> InferReduce(const OpContext& ctx) {
  if (!ctx.present(0)) return Status::InvalidArgument(ctx.where() + ": input 0 is absent");
  KILN_RETURN_IF_ERROR(RequireReduceDType(ctx, kKind, ctx.type(0).dtype));
  KILN_ASSIGN_OR_RETURN(ReducePlan plan, PlanReduce(ctx, AxesInputSince(kKind)));
  return std::vector<TensorType>{{ctx.type(0).dtype, plan.out_shape}};
}

// Accumulates x into one accumulator per output element, then finalizes. Acc is double for
// float32 and int64_t for integers.
template <typename T, typename Acc>
void ReduceKernel(ReduceKind kind, const Tensor& x, const ReducePlan& plan, Tensor& out) {
  const Shape& shape = x.shape();
  const int64_t n = x.numel();
  const int64_t out_n = NumElements(plan.kept_shape);
  const int64_t count = out_n == 0 ? 0 : n / out_n;  // input elements per output element

  Acc init = 0;
  if (kind == ReduceKind::kProd) init = 1;
  if (kind == ReduceKind::kMax || kind == ReduceKind::kLogSumExp) {
    init = std::is_floating_point_v<Acc> ? -std::numeric_limits<Acc>::infinity()
                                         : std::numeric_limits<T>::lowest();
  }
  if (kind == ReduceKind::kMin) {
    init = std::is_floating_point_v<Acc> ? std::numeric_limits<Acc>::infinity()
                                         : std::numeric_limits<T>::max();
  }
  std::vector<Acc> acc(static_cast<size_t>(out_n), init);

  auto combine = [kind](Acc a, Acc v) -> Acc {
    switch (kind) {
      case ReduceKind::kSum:
      case ReduceKind::kMean:
        if constexpr (std::is_integral_v<Acc>) {
          return static_cast<Acc>(static_cast<uint64_t>(a) + static_cast<uint64_t>(v));
        }
        return a + v;
      case ReduceKind::kL1:
        if constexpr (std::is_integral_v<Acc>) {
          const uint64_t u = static_cast<uint64_t>(v);  // |INT64_MIN| wraps instead of overflowing
          return static_cast<Acc>(static_cast<uint64_t>(a) + (v < 0 ? uint64_t{0} - u : u));
        }
        return a + std::fabs(v);
      case ReduceKind::kL2:
      case ReduceKind::kSumSquare:
        if constexpr (std::is_integral_v<Acc>) {
          return static_cast<Acc>(static_cast<uint64_t>(a) +
                                  static_cast<uint64_t>(v) * static_cast<uint64_t>(v));
        }
        return a + v * v;
      case ReduceKind::kLogSum:
        return a + v;
      case ReduceKind::kProd:
        if constexpr (std::is_integral_v<Acc>) {
          return static_cast<Acc>(static_cast<uint64_t>(a) * static_cast<uint64_t>(v));
        }
        return a * v;
      case ReduceKind::kMax:        // NaN sticks once seen
      case ReduceKind::kLogSumExp:  // first pass: the maximum
        if constexpr (std::is_floating_point_v<Acc>) {
          if (std::isnan(v) || std::isnan(a)) return std::isnan(a) ? a : v;
        }
        return v > a ? v : a;
      case ReduceKind::kMin:
        if constexpr (std::is_floating_point_v<Acc>) {
          if (std::isnan(v) || std::isnan(a)) return std::isnan(a) ? a : v;
        }
        return v < a ? v : a;
    }
    return a;
  };

  const T* px = x.data<T>();
  ForEachReduced(shape, plan,
                 [&](int64_t i, int64_t o) { acc[o] = combine(acc[o], static_cast<Acc>(px[i])); });
  if constexpr (std::is_floating_point_v<Acc>) {
    // LogSumExp = max + log(sum(exp(x - max))), so no exp overflows. An infinite or NaN maximum
    // is the result itself (an empty slice gives -inf, the log of an empty sum).
    if (kind == ReduceKind::kLogSumExp) {
      std::vector<Acc> sum(static_cast<size_t>(out_n), 0);
      ForEachReduced(shape, plan, [&](int64_t i, int64_t o) {
        if (std::isfinite(acc[o])) sum[o] += std::exp(static_cast<Acc>(px[i]) - acc[o]);
      });
      for (int64_t k = 0; k < out_n; ++k) {
        if (std::isfinite(acc[k])) acc[k] += std::log(sum[k]);
      }
    }
  }

  T* po = out.data<T>();
  for (int64_t k = 0; k < out_n; ++k) {
    Acc v = acc[k];
    if (kind == ReduceKind::kMean) {
      if constexpr (std::is_integral_v<Acc>) {
        v = count == 0 ? 0 : v / count;  // integer mean truncates; an empty mean is 0
      } else {
        v = v / static_cast<Acc>(count);  // an empty mean is NaN
      }
    }
    if constexpr (std::is_floating_point_v<Acc>) {
      if (kind == ReduceKind::kL2) v = std::sqrt(v);
      if (kind == ReduceKind::kLogSum) v = std::log(v);
    }
    po[k] = static_cast<T>(v);
  }
}

template <ReduceKind kKind>
Status RunReduce(const OpContext& ctx, std::vector<Tensor>& outputs) {
  const Tensor& x = ctx.in(0);
  KILN_RETURN_IF_ERROR(RequireReduceDType(ctx, kKind, x.dtype()));
  KILN_ASSIGN_OR_RETURN(ReducePlan plan, PlanReduce(ctx, AxesInputSince(kKind)));
  if (plan.noop) {
    if (x.nbytes()) std::memcpy(outputs[0].raw_data(), x.raw_data(), x.nbytes());
    return Status::OK();
  }
  switch (x.dtype()) {
    case DType::kFloat32:
      ReduceKernel<float, double>(kKind, x, plan, outputs[0]);
      break;
    case DType::kInt64:
      ReduceKernel<int64_t, int64_t>(kKind, x, plan, outputs[0]);
      break;
    case DType::kInt32:
      ReduceKernel<int32_t, int64_t>(kKind, x, plan, outputs[0]);
      break;
    case DType::kFloat64:
      ReduceKernel<double, double>(kKind, x, plan, outputs[0]);
      break;
    default:
      return RequireReduceDType(ctx, kKind, x.dtype());
  }
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------
// Shared by the ops along one axis below.

Status RequireIntAttr(const Node& node, const char* attr) {
  if (!node.HasAttr(attr)) return Status::OK();
  return node.GetInt(attr).status();
}

// An int attribute that must be 0 or 1 (keepdims, exclusive, ...), named in the error.
Status RequireFlagAttr(const Node& node, const char* attr) {
  if (!node.HasAttr(attr)) return Status::OK();
  KILN_ASSIGN_OR_RETURN(int64_t v, node.GetInt(attr));
  if (v != 0 && v != 1) {
    return Status::InvalidArgument(node.Describe() + ": attribute '" + attr +
                                   "'=" + std::to_string(v) + " is invalid (expected 0 or 1)");
  }
  return Status::OK();
}

// A tensor of `shape` viewed as [outer, dim, inner] around `axis` (already normalized).
struct AxisView {
  int64_t outer = 1, dim = 1, inner = 1;
};

AxisView ViewAround(const Shape& shape, int64_t axis) {
  AxisView v;
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
    if (d < axis) v.outer *= shape[d];
    if (d == axis) v.dim = shape[d];
    if (d > axis) v.inner *= shape[d];
  }
  return v;
}

Result<int64_t> AttrAxis(const OpContext& ctx, int64_t dflt) {
  const int64_t rank = static_cast<int64_t>(ctx.type(0).shape.size());
  return NormalizeAxis(ctx.node().GetInt("axis", dflt), rank, ctx.where() + ": attribute 'axis'");
}

Status RequireFloatIntDType(const OpContext& ctx, DType t) {
  if (t == DType::kFloat32 || t == DType::kFloat64 || t == DType::kInt64 || t == DType::kInt32) {
    return Status::OK();
  }
  return UnsupportedDType(ctx, t, "float32, float64, int64, int32");
}

// Calls fn.template operator()<T>() for float32, float64, int64 and int32 tensors.
template <typename Fn>
Status DispatchFloatInt(const OpContext& ctx, DType t, Fn&& fn) {
  switch (t) {
    case DType::kFloat32:
      return fn.template operator()<float>();
    case DType::kInt64:
      return fn.template operator()<int64_t>();
    case DType::kInt32:
      return fn.template operator()<int32_t>();
    case DType::kFloat64:
      return fn.template operator()<double>();
    default:
      return RequireFloatIntDType(ctx, t);
  }
}

// ---------------------------------------------------------------------------------------------
// ArgMax / ArgMin: int64 index of the extreme along `axis` (default 0); ties give the first index
// unless select_last_index=1 (opset 12). NaN is the extreme, as max and min propagate it
// (numpy.argmax/argmin): a slice holding one gives the first NaN's index (the last with
// select_last_index).

Status CheckArg(const Node& node, int64_t opset) {
  KILN_RETURN_IF_ERROR(CheckArity(node, 1, 1));
  KILN_RETURN_IF_ERROR(RequireIntAttr(node, "axis"));
  KILN_RETURN_IF_ERROR(RequireFlagAttr(node, "keepdims"));
  if (opset < 12 && node.HasAttr("select_last_index")) {
    return Status::InvalidArgument(node.Describe() +
                                   ": attribute 'select_last_index' needs opset 12 (model has " +
                                   std::to_string(opset) + ")");
  }
  return RequireFlagAttr(node, "select_last_index");
}

Result<std::vector<TensorType>> InferArg(const OpContext& ctx) {
  KILN_RETURN_IF_ERROR(RequireFloatIntDType(ctx, ctx.type(0).dtype));
  KILN_ASSIGN_OR_RETURN(int64_t axis, AttrAxis(ctx, 0));
  Shape shape = ctx.type(0).shape;
  if (shape.empty()) return Status::InvalidArgument(ctx.where() + ": input 0 is a scalar");
  if (shape[axis] == 0) {
    return Status::InvalidArgument(ctx.where() + ": axis " + std::to_string(axis) +
                                   " of input shape " + ShapeToString(shape) + " is empty");
  }
  if (ctx.node().GetInt("keepdims", 1) != 0) {
    shape[axis] = 1;
  } else {
    shape.erase(shape.begin() + axis);
  }
  return std::vector<TensorType>{{DType::kInt64, shape}};
}

template <bool kMax>
Status RunArg(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_RETURN_IF_ERROR(InferArg(ctx).status());
  KILN_ASSIGN_OR_RETURN(int64_t axis, AttrAxis(ctx, 0));
  const bool last = ctx.node().GetInt("select_last_index", 0) != 0;
  const AxisView v = ViewAround(ctx.in(0).shape(), axis);
  int64_t* py = outputs[0].data<int64_t>();
  return DispatchFloatInt(ctx, ctx.in(0).dtype(), [&]<typename T>() {
    const T* px = ctx.in(0).data<T>();
    for (int64_t o = 0; o < v.outer; ++o) {
      for (int64_t i = 0; i < v.inner; ++i) {
        const T* row = px + o * v.dim * v.inner + i;
        int64_t best = -1;
        bool nan = false;
        for (int64_t j = 0; j < v.dim; ++j) {
          const T x = row[j * v.inner];
          if constexpr (std::is_floating_point_v<T>) {
            if (std::isnan(x)) {
              if (!nan || last) best = j;
              nan = true;
              continue;
            }
            if (nan) continue;
          }
          if (best < 0) {
            best = j;
            continue;
          }
          const T b = row[best * v.inner];
          const bool better = kMax ? (x > b || (last && x == b)) : (x < b || (last && x == b));
          if (better) best = j;
        }
        py[o * v.inner + i] = best;
      }
    }
    return Status::OK();
  });
}

// ---------------------------------------------------------------------------------------------
// CumSum(x, axis): running sum along the scalar input `axis`; exclusive=1 shifts by one (the
// first element is 0), reverse=1 sums from the end. float32 sums in double.

Status CheckCumSum(const Node& node, int64_t) {
  KILN_RETURN_IF_ERROR(CheckArity(node, 2, 2));
  KILN_RETURN_IF_ERROR(RequireFlagAttr(node, "exclusive"));
  return RequireFlagAttr(node, "reverse");
}

Result<int64_t> CumSumAxis(const OpContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const Tensor* t, ctx.RequireValue(1, "axis"));
  if ((t->dtype() != DType::kInt64 && t->dtype() != DType::kInt32) || t->numel() != 1) {
    return Status::InvalidArgument(ctx.where() + ": input 1 ('axis') is " + t->TypeString() +
                                   ", expected one int64 or int32 value");
  }
  const int64_t rank = static_cast<int64_t>(ctx.type(0).shape.size());
  return NormalizeAxis(t->GetAsInt64(0), rank, ctx.where() + ": input 1 ('axis')");
}

Result<std::vector<TensorType>> InferCumSum(const OpContext& ctx) {
  KILN_RETURN_IF_ERROR(RequireFloatIntDType(ctx, ctx.type(0).dtype));
  KILN_RETURN_IF_ERROR(CumSumAxis(ctx).status());
  return std::vector<TensorType>{ctx.type(0)};
}

Status RunCumSum(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_ASSIGN_OR_RETURN(int64_t axis, CumSumAxis(ctx));
  const bool exclusive = ctx.node().GetInt("exclusive", 0) != 0;
  const bool reverse = ctx.node().GetInt("reverse", 0) != 0;
  const AxisView v = ViewAround(ctx.in(0).shape(), axis);
  return DispatchFloatInt(ctx, ctx.in(0).dtype(), [&]<typename T>() {
    using Acc = std::conditional_t<std::is_floating_point_v<T>, double, uint64_t>;  // ints wrap
    const T* px = ctx.in(0).data<T>();
    T* py = outputs[0].data<T>();
    for (int64_t o = 0; o < v.outer; ++o) {
      for (int64_t i = 0; i < v.inner; ++i) {
        const int64_t base = o * v.dim * v.inner + i;
        Acc sum = 0;
        for (int64_t s = 0; s < v.dim; ++s) {
          const int64_t k = base + (reverse ? v.dim - 1 - s : s) * v.inner;
          const Acc x = static_cast<Acc>(px[k]);
          if (!exclusive) sum += x;
          py[k] = static_cast<T>(sum);
          if (exclusive) sum += x;
        }
      }
    }
    return Status::OK();
  });
}

// ---------------------------------------------------------------------------------------------
// Hardmax: 1 at the first maximum of each slice (its first NaN, as ArgMax), 0 elsewhere. The
// slices are those of Softmax
// (SoftmaxShape): before opset 13 the input is flattened to 2-D at `axis` (default 1), from 13
// the slice runs along `axis` (default -1).

Status RunHardmax(const OpContext& ctx, std::vector<Tensor>& outputs) {
  const Tensor& x = ctx.in(0);
  if (x.dtype() != DType::kFloat32) return UnsupportedDType(ctx, x.dtype(), "float32");
  KILN_ASSIGN_OR_RETURN(SoftmaxGeometry g, SoftmaxShape(ctx, x.shape()));
  const float* px = x.data<float>();
  float* py = outputs[0].data<float>();
  std::fill(py, py + outputs[0].numel(), 0.0f);
  for (int64_t o = 0; o < g.outer; ++o) {
    for (int64_t i = 0; i < g.inner; ++i) {
      const int64_t base = o * g.dim * g.inner + i;
      int64_t best = -1;
      for (int64_t j = 0; j < g.dim; ++j) {
        const float v = px[base + j * g.inner];
        if (std::isnan(v)) {
          best = j;
          break;
        }
        if (best < 0 || v > px[base + best * g.inner]) best = j;
      }
      if (best >= 0) py[base + best * g.inner] = 1.0f;
    }
  }
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------
// LpNormalization: x / ||x||_p along `axis` (default -1), p = 1 or 2 (default 2). A zero norm
// gives zeros rather than NaN (onnxruntime does the same).

Status CheckLpNorm(const Node& node, int64_t) {
  KILN_RETURN_IF_ERROR(CheckArity(node, 1, 1));
  KILN_RETURN_IF_ERROR(RequireIntAttr(node, "axis"));
  KILN_RETURN_IF_ERROR(RequireIntAttr(node, "p"));
  const int64_t p = node.GetInt("p", 2);
  if (p != 1 && p != 2) {
    return Status::InvalidArgument(node.Describe() + ": attribute 'p'=" + std::to_string(p) +
                                   " is invalid (expected 1 or 2)");
  }
  return Status::OK();
}

Result<std::vector<TensorType>> InferFloatAlongAxis(const OpContext& ctx) {
  KILN_ASSIGN_OR_RETURN(std::vector<TensorType> out, InferSameAsInput0(ctx));
  if (out[0].dtype != DType::kFloat32) return UnsupportedDType(ctx, out[0].dtype, "float32");
  KILN_RETURN_IF_ERROR(AttrAxis(ctx, -1).status());
  return out;
}

Status RunLpNorm(const OpContext& ctx, std::vector<Tensor>& outputs) {
  const Tensor& x = ctx.in(0);
  if (x.dtype() != DType::kFloat32) return UnsupportedDType(ctx, x.dtype(), "float32");
  KILN_ASSIGN_OR_RETURN(int64_t axis, AttrAxis(ctx, -1));
  const bool l1 = ctx.node().GetInt("p", 2) == 1;
  const AxisView v = ViewAround(x.shape(), axis);
  const float* px = x.data<float>();
  float* py = outputs[0].data<float>();
  for (int64_t o = 0; o < v.outer; ++o) {
    for (int64_t i = 0; i < v.inner; ++i) {
      const int64_t base = o * v.dim * v.inner + i;
      double norm = 0;
      for (int64_t j = 0; j < v.dim; ++j) {
        const double e = px[base + j * v.inner];
        norm += l1 ? std::fabs(e) : e * e;
      }
      if (!l1) norm = std::sqrt(norm);
      for (int64_t j = 0; j < v.dim; ++j) {
        const int64_t k = base + j * v.inner;
        py[k] = norm == 0 ? 0.0f : static_cast<float>(px[k] / norm);
      }
    }
  }
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------
// MeanVarianceNormalization (opset 9+): (x - mean) / (sqrt(var) + 1e-9) with mean and variance
// over `axes` (default [0,2,3]), variance as E[x^2] - E[x]^2 like the ONNX function body.

Status CheckMvn(const Node& node, int64_t) {
  KILN_RETURN_IF_ERROR(CheckArity(node, 1, 1));
  if (node.HasAttr("axes")) KILN_RETURN_IF_ERROR(node.GetInts("axes").status());
  return Status::OK();
}

Result<ReducePlan> PlanMvn(const OpContext& ctx) {
  const std::vector<int64_t> axes = ctx.node().GetInts("axes", {0, 2, 3});
  const Shape& shape = ctx.type(0).shape;
  const int64_t rank = static_cast<int64_t>(shape.size());
  ReducePlan plan;
  plan.reduced.assign(shape.size(), false);
  for (int64_t a : axes) {
    KILN_ASSIGN_OR_RETURN(
        int64_t axis,
        NormalizeAxis(a, rank, ctx.where() + ": attribute 'axes' " + AxesToString(axes)));
    if (plan.reduced[axis]) {
      return Status::InvalidArgument(ctx.where() + ": attribute 'axes' " + AxesToString(axes) +
                                     " names dim " + std::to_string(axis) + " more than once");
    }
    plan.reduced[axis] = true;
  }
  for (int64_t d = 0; d < rank; ++d) plan.kept_shape.push_back(plan.reduced[d] ? 1 : shape[d]);
  plan.out_shape = shape;
  return plan;
}

Result<std::vector<TensorType>> InferMvn(const OpContext& ctx) {
  KILN_ASSIGN_OR_RETURN(std::vector<TensorType> out, InferSameAsInput0(ctx));
  if (out[0].dtype != DType::kFloat32) return UnsupportedDType(ctx, out[0].dtype, "float32");
  KILN_RETURN_IF_ERROR(PlanMvn(ctx).status());
  return out;
}

Status RunMvn(const OpContext& ctx, std::vector<Tensor>& outputs) {
  const Tensor& x = ctx.in(0);
  if (x.dtype() != DType::kFloat32) return UnsupportedDType(ctx, x.dtype(), "float32");
  KILN_ASSIGN_OR_RETURN(ReducePlan plan, PlanMvn(ctx));
  const int64_t groups = NumElements(plan.kept_shape);
  const double count = groups == 0 ? 0.0 : static_cast<double>(x.numel() / groups);
  std::vector<double> sum(static_cast<size_t>(groups), 0), sum_sq(static_cast<size_t>(groups), 0);
  const float* px = x.data<float>();
  ForEachReduced(x.shape(), plan, [&](int64_t i, int64_t o) {
    sum[o] += px[i];
    sum_sq[o] += double{px[i]} * px[i];
  });
  std::vector<double> mean(sum.size()), denom(sum.size());
  for (size_t k = 0; k < sum.size(); ++k) {
    mean[k] = sum[k] / count;
    const double var = std::max(0.0, sum_sq[k] / count - mean[k] * mean[k]);
    denom[k] = std::sqrt(var) + 1e-9;
  }
  float* py = outputs[0].data<float>();
  ForEachReduced(x.shape(), plan, [&](int64_t i, int64_t o) {
    py[i] = static_cast<float>((px[i] - mean[o]) / denom[o]);
  });
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------
// TopK: the k largest (largest=1, default) or smallest elements along `axis` (default -1) and
// their int64 indices. k is an attribute before opset 10 and input 1 from 10; largest and sorted
// arrive at 11. Equal values keep the lower index first, NaN counts as larger than any number,
// and the result is always sorted (sorted=0 leaves the order to the implementation).

Status CheckTopK(const Node& node, int64_t opset) {
  KILN_RETURN_IF_ERROR(CheckArity(node, opset < 10 ? 1 : 2, opset < 10 ? 1 : 2, 2));
  if (node.outputs.size() != 2) {
    return Status::InvalidArgument(node.Describe() + ": has " +
                                   std::to_string(node.outputs.size()) +
                                   " outputs, expected 2 (values, indices)");
  }
  KILN_RETURN_IF_ERROR(RequireIntAttr(node, "axis"));
  if (opset < 10) {
    KILN_ASSIGN_OR_RETURN(int64_t k, node.GetInt("k"));
    if (k < 0) {
      return Status::InvalidArgument(node.Describe() + ": attribute 'k'=" + std::to_string(k) +
                                     " is negative");
    }
  } else if (node.HasAttr("k")) {
    return Status::InvalidArgument(node.Describe() + ": attribute 'k' is not allowed at opset " +
                                   std::to_string(opset) + " (from opset 10 k is input 1)");
  }
  for (const char* attr : {"largest", "sorted"}) {
    if (opset < 11 && node.HasAttr(attr)) {
      return Status::InvalidArgument(node.Describe() + ": attribute '" + attr +
                                     "' needs opset 11 (model has " + std::to_string(opset) + ")");
    }
    KILN_RETURN_IF_ERROR(RequireFlagAttr(node, attr));
  }
  return Status::OK();
}

struct TopKPlan {
  int64_t axis = 0;
  int64_t k = 0;
};

Result<TopKPlan> PlanTopK(const OpContext& ctx) {
  TopKPlan plan;
  KILN_ASSIGN_OR_RETURN(plan.axis, AttrAxis(ctx, -1));
  const Shape& shape = ctx.type(0).shape;
  if (shape.empty()) return Status::InvalidArgument(ctx.where() + ": input 0 is a scalar");
  if (ctx.opset() < 10) {
    KILN_ASSIGN_OR_RETURN(plan.k, ctx.node().GetInt("k"));
  } else {
    KILN_ASSIGN_OR_RETURN(const Tensor* t, ctx.RequireValue(1, "K"));
    if ((t->dtype() != DType::kInt64 && t->dtype() != DType::kInt32) || t->numel() != 1) {
      return Status::InvalidArgument(ctx.where() + ": input 1 ('K') is " + t->TypeString() +
                                     ", expected one int64 value");
    }
    plan.k = t->GetAsInt64(0);
  }
  if (plan.k < 0 || plan.k > shape[plan.axis]) {
    return Status::InvalidArgument(ctx.where() + ": k=" + std::to_string(plan.k) +
                                   " is out of range for axis " + std::to_string(plan.axis) +
                                   " of input shape " + ShapeToString(shape) + " (expected 0 to " +
                                   std::to_string(shape[plan.axis]) + ")");
  }
  return plan;
}

Result<std::vector<TensorType>> InferTopK(const OpContext& ctx) {
  KILN_RETURN_IF_ERROR(RequireFloatIntDType(ctx, ctx.type(0).dtype));
  KILN_ASSIGN_OR_RETURN(TopKPlan plan, PlanTopK(ctx));
  Shape shape = ctx.type(0).shape;
  shape[plan.axis] = plan.k;
  return std::vector<TensorType>{{ctx.type(0).dtype, shape}, {DType::kInt64, shape}};
}

Status RunTopK(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_RETURN_IF_ERROR(RequireFloatIntDType(ctx, ctx.in(0).dtype()));
  KILN_ASSIGN_OR_RETURN(TopKPlan plan, PlanTopK(ctx));
  const bool largest = ctx.node().GetInt("largest", 1) != 0;
  const AxisView v = ViewAround(ctx.in(0).shape(), plan.axis);
  return DispatchFloatInt(ctx, ctx.in(0).dtype(), [&]<typename T>() {
    const T* px = ctx.in(0).data<T>();
    T* values = outputs[0].data<T>();
    int64_t* indices = outputs[1].data<int64_t>();
    std::vector<int64_t> order(static_cast<size_t>(v.dim));
    for (int64_t o = 0; o < v.outer; ++o) {
      for (int64_t i = 0; i < v.inner; ++i) {
        const T* row = px + o * v.dim * v.inner + i;
        auto at = [&](int64_t j) { return row[j * v.inner]; };
        // Strict weak order: a before b when a's value ranks higher, else lower index first.
        auto before = [&](int64_t a, int64_t b) {
          const T x = at(a), y = at(b);
          if constexpr (std::is_floating_point_v<T>) {
            const bool nx = std::isnan(x), ny = std::isnan(y);
            if (nx || ny) {
              if (nx && ny) return a < b;
              return largest ? nx : ny;
            }
          }
          if (x != y) return largest ? x > y : x < y;
          return a < b;
        };
        for (int64_t j = 0; j < v.dim; ++j) order[j] = j;
        std::partial_sort(order.begin(), order.begin() + plan.k, order.end(), before);
        for (int64_t r = 0; r < plan.k; ++r) {
          const int64_t out = (o * plan.k + r) * v.inner + i;
          values[out] = at(order[r]);
          indices[out] = order[r];
        }
      }
    }
    return Status::OK();
  });
}

// ---------------------------------------------------------------------------------------------
// The table

struct ReduceOp {
  const char* op_type;
  int64_t since_version;
  int64_t until_version;
  CheckFn check;
  InferFn infer;
  RunFn run;
};

constexpr int64_t kMax = INT64_MAX;

template <ReduceKind kKind>
constexpr ReduceOp Reduction(const char* op_type, bool axes_as_input) {
  return axes_as_input ? ReduceOp{op_type,
                                  AxesInputSince(kKind),
                                  kMax,
                                  CheckReduce<kKind>,
                                  InferReduce<kKind>,
                                  RunReduce<kKind>}
                       : ReduceOp{op_type,
                                  1,
                                  AxesInputSince(kKind) - 1,
                                  CheckReduce<kKind>,
                                  InferReduce<kKind>,
                                  RunReduce<kKind>};
}

constexpr ReduceOp kOps[] = {
    {"Softmax", 1, 12, CheckSoftmax, InferSoftmax, RunSoftmax<false>},
    {"Softmax", 13, kMax, CheckSoftmax, InferSoftmax, RunSoftmax<false>},
    {"LogSoftmax", 1, 12, CheckSoftmax, InferSoftmax, RunSoftmax<true>},
    {"LogSoftmax", 13, kMax, CheckSoftmax, InferSoftmax, RunSoftmax<true>},
    Reduction<ReduceKind::kSum>("ReduceSum", false),
    Reduction<ReduceKind::kSum>("ReduceSum", true),
    Reduction<ReduceKind::kMean>("ReduceMean", false),
    Reduction<ReduceKind::kMean>("ReduceMean", true),
    Reduction<ReduceKind::kMax>("ReduceMax", false),
    Reduction<ReduceKind::kMax>("ReduceMax", true),
    Reduction<ReduceKind::kMin>("ReduceMin", false),
    Reduction<ReduceKind::kMin>("ReduceMin", true),
    Reduction<ReduceKind::kProd>("ReduceProd", false),
    Reduction<ReduceKind::kProd>("ReduceProd", true),
    Reduction<ReduceKind::kL2>("ReduceL2", false),
    Reduction<ReduceKind::kL2>("ReduceL2", true),
    Reduction<ReduceKind::kL1>("ReduceL1", false),
    Reduction<ReduceKind::kL1>("ReduceL1", true),
    Reduction<ReduceKind::kSumSquare>("ReduceSumSquare", false),
    Reduction<ReduceKind::kSumSquare>("ReduceSumSquare", true),
    Reduction<ReduceKind::kLogSum>("ReduceLogSum", false),
    Reduction<ReduceKind::kLogSum>("ReduceLogSum", true),
    Reduction<ReduceKind::kLogSumExp>("ReduceLogSumExp", false),
    Reduction<ReduceKind::kLogSumExp>("ReduceLogSumExp", true),
    {"ArgMax", 1, kMax, CheckArg, InferArg, RunArg<true>},
    {"ArgMin", 1, kMax, CheckArg, InferArg, RunArg<false>},
    {"CumSum", 11, kMax, CheckCumSum, InferCumSum, RunCumSum},
    {"Hardmax", 1, 12, CheckSoftmax, InferSoftmax, RunHardmax},
    {"Hardmax", 13, kMax, CheckSoftmax, InferSoftmax, RunHardmax},
    {"LpNormalization", 1, kMax, CheckLpNorm, InferFloatAlongAxis, RunLpNorm},
    {"MeanVarianceNormalization", 9, kMax, CheckMvn, InferMvn, RunMvn},
    {"TopK", 1, kMax, CheckTopK, InferTopK, RunTopK},
};
static_assert(std::size(kOps) == 32,
              "op count changed: update the registry tests (AllOpsRegistered / FormsSplitByOpset)");

}  // namespace

std::vector<OpDef> ReduceOpDefs() {
  std::vector<OpDef> defs;
  for (const ReduceOp& op : kOps) {
    defs.push_back(
        OpDef{op.op_type, "", op.since_version, op.until_version, op.check, op.infer, op.run});
  }
  return defs;
}

int64_t ReduceAxesInputSince(const std::string& op_type) {
  return AxesInputSince(op_type == "ReduceSum" ? ReduceKind::kSum : ReduceKind::kMean);
}

Result<ReducePlan> PlanReduction(const OpContext& ctx) {
  return PlanReduce(ctx, ReduceAxesInputSince(ctx.node().op_type));
}

}  // namespace kiln
