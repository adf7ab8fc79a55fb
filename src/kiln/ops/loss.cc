// Loss op family (ops layer): NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss, each with
// its reference kernel.
//
// LossOpDefs is registered by OpRegistry::Global() (registry.cc). Both ops gather, per element
// of the target [N, d1, ...], the negated score of the target class from [N, C, d1, ...],
// weighted by the class weight when a weight vector is given; an element whose target equals
// ignore_index contributes nothing and has weight 0. reduction 'none' keeps the target's shape,
// 'sum' adds, and 'mean' divides the sum by the total weight (by the element count when neither
// weights nor ignore_index are given). SoftmaxCrossEntropyLoss is the same over
// log(softmax(scores, axis=1)), which it can also return as its second output. Computed in
// double; float32, float64, float16 and bfloat16 scores.
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "src/kiln/ops/kernel_util.h"
#include "src/kiln/ops/registry.h"

namespace kiln {
namespace {

struct LossAttrs {
  std::string reduction = "mean";
  std::optional<int64_t> ignore_index;
};

Result<LossAttrs> ReadLossAttrs(const Node& node) {
  LossAttrs a;
  KILN_ASSIGN_OR_RETURN(a.reduction, kernel::StringOr(node, "reduction", "mean"));
  if (a.reduction != "mean" && a.reduction != "sum" && a.reduction != "none") {
    return kernel::BadAttr(node, "reduction", "'" + a.reduction + "'", "'none', 'sum' or 'mean'");
  }
  if (node.HasAttr("ignore_index")) {
    KILN_ASSIGN_OR_RETURN(int64_t v, node.GetInt("ignore_index"));
    a.ignore_index = v;
  }
  return a;
}

Status CheckNll(const Node& node, int64_t) {
  KILN_RETURN_IF_ERROR(CheckArity(node, 2, 3));
  return ReadLossAttrs(node).status();
}

Status CheckSce(const Node& node, int64_t) {
  KILN_RETURN_IF_ERROR(CheckArity(node, 2, 3, 2));
  return ReadLossAttrs(node).status();
}

// Shapes: scores [N, C, d...], target [N, d...], weight [C]. Returns the output types: the loss
// (target's shape for 'none', else a scalar) and, with `log_prob`, the scores' type.
Result<std::vector<TensorType>> InferLoss(const OpContext& ctx, bool log_prob) {
  KILN_RETURN_IF_ERROR(kernel::RequireFloatInput(ctx, 0));
  KILN_RETURN_IF_ERROR(kernel::RequireIntegerInput(ctx, 1));
  const Shape& x = ctx.type(0).shape;
  const Shape& t = ctx.type(1).shape;
  if (x.size() < 2) return kernel::BadInputShape(ctx, 0, "input", "rank >= 2 ([N, C, d...])");
  Shape want_t = {x[0]};
  want_t.insert(want_t.end(), x.begin() + 2, x.end());
  if (t != want_t) {
    return kernel::BadInputShape(ctx, 1, "target",
                                 ShapeToString(want_t) + " (the input's shape without dim 1)");
  }
  if (ctx.present(2)) {
    if (ctx.type(2).dtype != ctx.type(0).dtype) {
      return Status::InvalidArgument(ctx.where() + ": input 2 ('weight') has dtype " +
                                     DTypeName(ctx.type(2).dtype) + ", expected " +
                                     DTypeName(ctx.type(0).dtype) + " like input 0");
    }
    if (ctx.type(2).shape != Shape{x[1]}) {
      return kernel::BadInputShape(ctx, 2, "weight",
                                   "[" + std::to_string(x[1]) + "] (one per class)");
    }
  }
  KILN_ASSIGN_OR_RETURN(LossAttrs a, ReadLossAttrs(ctx.node()));
  std::vector<TensorType> out = {{ctx.type(0).dtype, a.reduction == "none" ? t : Shape{}}};
  if (log_prob && ctx.node().outputs.size() > 1) out.push_back(ctx.type(0));
  return out;
}

Result<std::vector<TensorType>> InferNll(const OpContext& ctx) { return InferLoss(ctx, false); }
Result<std::vector<TensorType>> InferSce(const OpContext& ctx) { return InferLoss(ctx, true); }

// The loss over per-class log-probabilities `lp` laid out [N, C, D] (D the product of the
// trailing dims), written to `out`.
Status ComputeLoss(const OpContext& ctx, const std::vector<double>& lp, Tensor& out) {
  KILN_ASSIGN_OR_RETURN(LossAttrs a, ReadLossAttrs(ctx.node()));
  const Shape& xs = ctx.in(0).shape();
  const int64_t n = xs[0], c = xs[1];
  const int64_t d = NumElements(Shape(xs.begin() + 2, xs.end()));
  const std::vector<int64_t> target = ctx.in(1).ToInt64Vector();
  std::vector<double> weight;
  if (ctx.present(2)) weight = kernel::ToDoubles(ctx.in(2));
  std::vector<double> loss(static_cast<size_t>(n * d), 0.0);
  double total_weight = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < d; ++j) {
      const int64_t k = i * d + j;
      const int64_t cls = target[static_cast<size_t>(k)];
      if (a.ignore_index && cls == *a.ignore_index) continue;
      if (cls < 0 || cls >= c) {
        return Status::InvalidArgument(
            ctx.where() + ": target " + std::to_string(cls) + " at element " + std::to_string(k) +
            " is outside the class range [0, " + std::to_string(c) + ")" +
            (a.ignore_index ? " and is not ignore_index=" + std::to_string(*a.ignore_index)
                            : std::string()));
      }
      const double w = weight.empty() ? 1.0 : weight[static_cast<size_t>(cls)];
      loss[static_cast<size_t>(k)] = -lp[static_cast<size_t>((i * c + cls) * d + j)] * w;
      total_weight += w;
    }
  }
  if (a.reduction == "none") return kernel::StoreDoubles(loss, out);
  double sum = 0.0;
  for (double v : loss) sum += v;
  if (a.reduction == "mean") {
    // Without weights or ignore_index numpy's mean divides by the element count; with either,
    // by the weight the counted elements carry.
    const bool weighted = !weight.empty() || a.ignore_index.has_value();
    sum /= weighted ? total_weight : static_cast<double>(n * d);
  }
  return kernel::StoreDoubles({sum}, out);
}

Status RunNll(const OpContext& ctx, std::vector<Tensor>& outputs) {
  return ComputeLoss(ctx, kernel::ToDoubles(ctx.in(0)), outputs[0]);
}

Status RunSce(const OpContext& ctx, std::vector<Tensor>& outputs) {
  const Shape& xs = ctx.in(0).shape();
  const int64_t n = xs[0], c = xs[1];
  const int64_t d = NumElements(Shape(xs.begin() + 2, xs.end()));
  std::vector<double> lp = kernel::ToDoubles(ctx.in(0));
  // log_softmax over axis 1, shifted by the max so exp never overflows.
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < d; ++j) {
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t k = 0; k < c; ++k)
        mx = std::max(mx, lp[static_cast<size_t>((i * c + k) * d + j)]);
      double sum = 0.0;
      for (int64_t k = 0; k < c; ++k)
        sum += std::exp(lp[static_cast<size_t>((i * c + k) * d + j)] - mx);
      const double log_sum = std::log(sum) + mx;
      for (int64_t k = 0; k < c; ++k) lp[static_cast<size_t>((i * c + k) * d + j)] -= log_sum;
    }
  }
  KILN_RETURN_IF_ERROR(ComputeLoss(ctx, lp, outputs[0]));
  if (outputs.size() > 1) KILN_RETURN_IF_ERROR(kernel::StoreDoubles(lp, outputs[1]));
  return Status::OK();
}

}  // namespace

std::vector<OpDef> LossOpDefs() {
  return {
      {"NegativeLogLikelihoodLoss", "", 12, INT64_MAX, CheckNll, InferNll, RunNll},
      {"SoftmaxCrossEntropyLoss", "", 12, INT64_MAX, CheckSce, InferSce, RunSce},
  };
}

}  // namespace kiln
