// Reduce op family (ops layer): Softmax and LogSoftmax, and ReduceSum / Mean / Max / Min / Prod /
// L2, each with its reference kernel.
//
// RegisterReduceOps is called by OpRegistry::Global() (registry.cc). Both families changed form
// across opsets, and the registry lists each form as its own opset range; the shared kernels read
// the form by ctx.opset():
// - Softmax/LogSoftmax before 13 flatten the input to 2-D at `axis` (default 1) and normalize
//   each row; from 13 they normalize along `axis` alone (default -1). Both subtract the maximum
//   first and sum in double, so large logits neither overflow nor lose precision.
// - ReduceSum takes `axes` as an attribute before 13 and as optional input 1 from 13; the other
//   reductions switch at 18. The input form adds noop_with_empty_axes (empty axes then means
//   identity instead of "all axes"). keepdims defaults to 1.
// Reductions accept float32 (accumulated in double) and, except ReduceL2, int64 and int32
// (accumulated in int64, wrapping); Softmax family is float32 only.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

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

enum class ReduceKind { kSum, kMean, kMax, kMin, kProd, kL2 };

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

// Which input dims are reduced, and the output shape.
struct ReducePlan {
  bool noop = false;          // empty axes with noop_with_empty_axes=1: output = input
  std::vector<bool> reduced;  // per input dim
  Shape kept_shape;           // output shape with reduced dims kept as 1 (its layout)
  Shape out_shape;            // the declared output shape (kept_shape without them unless keepdims)
};

std::string AxesToString(const std::vector<int64_t>& axes) {
  std::string s = "[";
  for (size_t i = 0; i < axes.size(); ++i) s += (i ? "," : "") + std::to_string(axes[i]);
  return s + "]";
}

template <ReduceKind kKind>
Result<ReducePlan> PlanReduce(const OpContext& ctx) {
  const Node& node = ctx.node();
  const Shape& shape = ctx.type(0).shape;
  const int64_t rank = static_cast<int64_t>(shape.size());
  std::vector<int64_t> axes;
  bool noop_with_empty_axes = false;
  if (ctx.opset() >= AxesInputSince(kKind)) {
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

bool SupportsDType(ReduceKind kind, DType t) {
  if (t == DType::kFloat32) return true;
  return kind != ReduceKind::kL2 && (t == DType::kInt64 || t == DType::kInt32);
}

Status RequireReduceDType(const OpContext& ctx, ReduceKind kind, DType t) {
  if (SupportsDType(kind, t)) return Status::OK();
  return UnsupportedDType(ctx, t, kind == ReduceKind::kL2 ? "float32" : "float32, int64, int32");
}

template <ReduceKind kKind>
Result<std::vector<TensorType>> InferReduce(const OpContext& ctx) {
  if (!ctx.present(0)) return Status::InvalidArgument(ctx.where() + ": input 0 is absent");
  KILN_RETURN_IF_ERROR(RequireReduceDType(ctx, kKind, ctx.type(0).dtype));
  KILN_ASSIGN_OR_RETURN(ReducePlan plan, PlanReduce<kKind>(ctx));
  return std::vector<TensorType>{{ctx.type(0).dtype, plan.out_shape}};
}

// Accumulates x into one accumulator per output element, then finalizes. Acc is double for
// float32 and int64_t for integers.
template <typename T, typename Acc>
void ReduceKernel(ReduceKind kind, const Tensor& x, const ReducePlan& plan, Tensor& out) {
  const Shape& shape = x.shape();
  const size_t rank = shape.size();
  const int64_t n = x.numel();
  const int64_t out_n = NumElements(plan.kept_shape);
  const int64_t count = out_n == 0 ? 0 : n / out_n;  // input elements per output element

  Acc init = 0;
  if (kind == ReduceKind::kProd) init = 1;
  if (kind == ReduceKind::kMax) {
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
      case ReduceKind::kL2:
        return a + v * v;
      case ReduceKind::kProd:
        if constexpr (std::is_integral_v<Acc>) {
          return static_cast<Acc>(static_cast<uint64_t>(a) * static_cast<uint64_t>(v));
        }
        return a * v;
      case ReduceKind::kMax:  // NaN sticks once seen
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

  // Walk the input in row-major order; `o` is the matching output offset, which advances by the
  // output stride of each input dim (0 on reduced dims).
  const T* px = x.data<T>();
  if (n > 0) {
    std::vector<int64_t> out_stride(rank, 0);
    const std::vector<int64_t> kept_strides = ContiguousStrides(plan.kept_shape);
    for (size_t d = 0; d < rank; ++d) out_stride[d] = plan.reduced[d] ? 0 : kept_strides[d];
    std::vector<int64_t> index(rank, 0);
    int64_t o = 0;
    for (int64_t i = 0; i < n; ++i) {
      acc[o] = combine(acc[o], static_cast<Acc>(px[i]));
      for (size_t d = rank; d-- > 0;) {
        o += out_stride[d];
        if (++index[d] < shape[d]) break;
        o -= out_stride[d] * shape[d];
        index[d] = 0;
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
    }
    po[k] = static_cast<T>(v);
  }
}

template <ReduceKind kKind>
Status RunReduce(const OpContext& ctx, std::vector<Tensor>& outputs) {
  const Tensor& x = ctx.in(0);
  KILN_RETURN_IF_ERROR(RequireReduceDType(ctx, kKind, x.dtype()));
  KILN_ASSIGN_OR_RETURN(ReducePlan plan, PlanReduce<kKind>(ctx));
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
    default:
      return RequireReduceDType(ctx, kKind, x.dtype());
  }
  return Status::OK();
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
};
static_assert(std::size(kOps) == 16,
              "op count changed: update the registry tests (AllOpsRegistered / FormsSplitByOpset)");

}  // namespace

void RegisterReduceOps(OpRegistry& r) {
  for (const ReduceOp& op : kOps) {
    r.Register(
        OpDef{op.op_type, "", op.since_version, op.until_version, op.check, op.infer, op.run});
  }
}

}  // namespace kiln
