// The normalization op family: Batch, Instance, Layer and Group normalization (ops layer).
//
// Listed by NormOpDefs (registered by registry.cc). float32 reference kernels whose
// statistics are accumulated in double.
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

// The normalizations' attributes, read leniently as their kernels always have (check validates
// them); each op uses the ones it has.
struct NormAttrs : PreparedNode {
  double epsilon = 1e-5f;
  int64_t axis = -1;       // LayerNormalization
  int64_t num_groups = 1;  // GroupNormalization
};

Result<NormAttrs> ParseNormAttrs(const Node& node, int64_t /*opset*/) {
  NormAttrs a;
  a.epsilon = node.GetFloat("epsilon", 1e-5f);
  a.axis = node.GetInt("axis", -1);
  a.num_groups = node.GetInt("num_groups", 1);
  return a;
}

constexpr PrepareFn kPrepareNorm = PrepareWith<NormAttrs, ParseNormAttrs>;

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
// Training form (training_mode=1, opset 14+): the statistics are the batch's own (mean and
// population variance over every dim but the channel's), and the optional outputs 1 and 2 are
// the running statistics, input_mean * momentum + batch_mean * (1 - momentum) (likewise var).
Status CheckBatchNorm(const Node& node, int64_t opset) {
  KILN_RETURN_IF_ERROR(CheckArity(node, 5, 5, 5));
  KILN_RETURN_IF_ERROR(CheckEpsilon(node));
  KILN_ASSIGN_OR_RETURN(int64_t training, IntOr(node, "training_mode", 0));
  if (training != 0 && training != 1) {
    return Status::InvalidArgument(node.Describe() + ": training_mode=" + std::to_string(training) +
                                   " must be 0 or 1");
  }
  if (training == 1) {
    if (opset < 14) {
      return Status::InvalidArgument(node.Describe() + ": training_mode exists from opset 14");
    }
    if (node.outputs.size() > 3) {
      return Status::InvalidArgument(node.Describe() + ": has " +
                                     std::to_string(node.outputs.size()) +
                                     " outputs, expected 1 to 3 (Y, running_mean, running_var)");
    }
    return FloatOr(node, "momentum", 0.9f).status();
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
  if (ctx.node().GetInt("training_mode", 0) == 1) {
    for (size_t i = 1; i < ctx.node().outputs.size(); ++i) out.push_back(ctx.type(2 + i));
  }
  return out;
}

Status RunBatchNorm(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_RETURN_IF_ERROR(RequireAllFloat32(ctx));
  NormAttrs scratch;
  KILN_ASSIGN_OR_RETURN(const NormAttrs* attrs, PreparedOr(ctx, &scratch, ParseNormAttrs));
  const Tensor& xt = ctx.in(0);
  const double eps = attrs->epsilon;
  const int64_t N = xt.dim(0), C = xt.dim(1);
  const int64_t plane = N * C == 0 ? 0 : xt.numel() / (N * C);
  const float* scale = ctx.in(1).data<float>();
  const float* bias = ctx.in(2).data<float>();
  const float* mean = ctx.in(3).data<float>();
  const float* var = ctx.in(4).data<float>();
  const bool training = ctx.node().GetInt("training_mode", 0) == 1;
  std::vector<double> stat_mean(mean, mean + C), stat_var(var, var + C);
  if (training) {
    for (int64_t c = 0; c < C; ++c) {
      double sum = 0, sq = 0;
      for (int64_t n = 0; n < N; ++n) {
        const float* x = xt.data<float>() + (n * C + c) * plane;
        for (int64_t i = 0; i < plane; ++i) sum += x[i];
      }
      const double count = static_cast<double>(N * plane);
      const double m = count > 0 ? sum / count : 0.0;
      for (int64_t n = 0; n < N; ++n) {
        const float* x = xt.data<float>() + (n * C + c) * plane;
        for (int64_t i = 0; i < plane; ++i) sq += (x[i] - m) * (x[i] - m);
      }
      stat_mean[c] = m;
      stat_var[c] = count > 0 ? sq / count : 0.0;
    }
    const double momentum = ctx.node().GetFloat("momentum", 0.9f);
    for (size_t k = 1; k < outputs.size() && k < 3; ++k) {
      const float* running = k == 1 ? mean : var;
      const std::vector<double>& batch = k == 1 ? stat_mean : stat_var;
      float* o = outputs[k].data<float>();
      for (int64_t c = 0; c < C; ++c) {
        o[c] = static_cast<float>(running[c] * momentum + batch[c] * (1.0 - momentum));
      }
    }
  }
  // Folded per channel into y = x * a + b.
  std::vector<double> a(static_cast<size_t>(C)), b(static_cast<size_t>(C));
  for (int64_t c = 0; c < C; ++c) {
    a[c] = scale[c] / std::sqrt(stat_var[c] + eps);
    b[c] = bias[c] - stat_mean[c] * a[c];
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
  NormAttrs scratch;
  KILN_ASSIGN_OR_RETURN(const NormAttrs* attrs, PreparedOr(ctx, &scratch, ParseNormAttrs));
  const Tensor& xt = ctx.in(0);
  const double eps = attrs->epsilon;
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

Result<LayerNormShapes> LayerNormGeometry(const OpContext& ctx, const NormAttrs& attrs) {
  const Shape& x = ctx.type(0).shape;
  LayerNormShapes g;
  auto axis = NormalizeAxis(attrs.axis, static_cast<int64_t>(x.size()), "axis");
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
  NormAttrs scratch;
  KILN_ASSIGN_OR_RETURN(const NormAttrs* attrs, PreparedOr(ctx, &scratch, ParseNormAttrs));
  KILN_ASSIGN_OR_RETURN(LayerNormShapes g, LayerNormGeometry(ctx, *attrs));
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
  NormAttrs scratch;
  KILN_ASSIGN_OR_RETURN(const NormAttrs* attrs, PreparedOr(ctx, &scratch, ParseNormAttrs));
  KILN_ASSIGN_OR_RETURN(LayerNormShapes g, LayerNormGeometry(ctx, *attrs));
  const double eps = attrs->epsilon;
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
  NormAttrs scratch;
  KILN_ASSIGN_OR_RETURN(const NormAttrs* attrs, PreparedOr(ctx, &scratch, ParseNormAttrs));
  const int64_t groups = attrs->num_groups;
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
  NormAttrs scratch;
  KILN_ASSIGN_OR_RETURN(const NormAttrs* attrs, PreparedOr(ctx, &scratch, ParseNormAttrs));
  const Tensor& xt = ctx.in(0);
  const double eps = attrs->epsilon;
  const int64_t groups = attrs->num_groups;
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

}  // namespace

std::vector<OpDef> NormOpDefs() {
  // std::array of exactly the family's count: adding an op without growing it fails to compile;
  // a missing row would leave infer/run null, which Register rejects.
  const std::array<OpDef, 4> table = {{
      {"BatchNormalization", "", 1, INT64_MAX, CheckBatchNorm, InferBatchNorm, RunBatchNorm,
       kPrepareNorm},
      {"InstanceNormalization", "", 1, INT64_MAX, CheckInstanceNorm, InferInstanceNorm,
       RunInstanceNorm, kPrepareNorm},
      {"LayerNormalization", "", 17, INT64_MAX, CheckLayerNorm, InferLayerNorm, RunLayerNorm,
       kPrepareNorm},
      {"GroupNormalization", "", 18, INT64_MAX, CheckGroupNorm, InferGroupNorm, RunGroupNorm,
       kPrepareNorm},
  }};
  return {table.begin(), table.end()};
}

}  // namespace kiln
