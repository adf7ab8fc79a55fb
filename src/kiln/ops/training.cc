// Training op family (ops layer): the optimizers of domain ai.onnx.preview.training (Adagrad,
// Momentum, Adam), each with its reference kernel.
//
// TrainingOpDefs is registered by OpRegistry::Global() (registry.cc). Each optimizer takes the
// learning rate R and the update count T (scalars), then n tensors to optimize, their n
// gradients and its n (or 2n) state tensors, and returns the n updated tensors followed by the
// updated states, one update step of the rule its ONNX definition states. Computed in double,
// rounded once to each tensor's float type.
#include <cmath>
#include <string>
#include <vector>

#include "src/kiln/ops/kernel_util.h"
#include "src/kiln/ops/registry.h"

namespace kiln {
namespace {

inline constexpr const char* kTrainingDomain = "ai.onnx.preview.training";

// The optimizer's tensor groups: n = (inputs - 2) / groups, where groups counts X, G and the
// states; outputs are X and the states, n each.
Status CheckOptimizer(const Node& node, size_t groups) {
  const size_t in = node.inputs.size();
  if (in < 2 + groups || (in - 2) % groups != 0) {
    return Status::InvalidArgument(node.Describe() + ": has " + std::to_string(in) +
                                   " inputs, expected 2 + " + std::to_string(groups) +
                                   " * n (R, T, then " + std::to_string(groups) +
                                   " groups of n tensors)");
  }
  const size_t n = (in - 2) / groups;
  if (node.outputs.size() != (groups - 1) * n) {
    return Status::InvalidArgument(node.Describe() + ": has " +
                                   std::to_string(node.outputs.size()) + " outputs, expected " +
                                   std::to_string((groups - 1) * n));
  }
  for (size_t i = 0; i < in; ++i) {
    if (node.inputs[i].empty()) {
      return Status::InvalidArgument(node.Describe() + ": input " + std::to_string(i) +
                                     " is empty (every optimizer input is required)");
    }
  }
  return Status::OK();
}

template <size_t kGroups>
Status CheckGroups(const Node& node, int64_t) {
  KILN_RETURN_IF_ERROR(CheckOptimizer(node, kGroups));
  for (const char* f :
       {"alpha", "beta", "epsilon", "decay_factor", "norm_coefficient", "norm_coefficient_post"}) {
    KILN_RETURN_IF_ERROR(kernel::FloatOr(node, f, 0.0f).status());
  }
  if (node.op_type == "Momentum") {
    KILN_ASSIGN_OR_RETURN(std::string mode, node.GetString("mode"));
    if (mode != "standard" && mode != "nesterov") {
      return kernel::BadAttr(node, "mode", "'" + mode + "'", "'standard' or 'nesterov'");
    }
    for (const char* f : {"alpha", "beta", "norm_coefficient"}) {
      KILN_RETURN_IF_ERROR(node.GetFloat(f).status());
    }
  }
  return Status::OK();
}

// Outputs: X_i, then each state group, typed like the matching inputs.
template <size_t kGroups>
Result<std::vector<TensorType>> InferGroups(const OpContext& ctx) {
  const size_t n = (ctx.num_inputs() - 2) / kGroups;
  for (size_t i : {size_t{0}, size_t{1}}) {
    if (ctx.type(i).shape.size() > 1 || NumElements(ctx.type(i).shape) != 1) {
      return kernel::BadInputShape(ctx, i, i == 0 ? "R" : "T", "a scalar");
    }
  }
  KILN_RETURN_IF_ERROR(kernel::RequireFloatInput(ctx, 0));
  KILN_RETURN_IF_ERROR(kernel::RequireIntegerInput(ctx, 1));
  std::vector<TensorType> out;
  for (size_t g = 0; g < kGroups; ++g) {
    if (g == 1) continue;  // gradients are not returned
    for (size_t i = 0; i < n; ++i) out.push_back(ctx.type(2 + g * n + i));
  }
  for (size_t i = 0; i < n; ++i) {
    KILN_RETURN_IF_ERROR(kernel::RequireFloatInput(ctx, 2 + i));
    for (size_t g = 1; g < kGroups; ++g) {
      if (ctx.type(2 + g * n + i).shape != ctx.type(2 + i).shape) {
        return kernel::BadInputShape(
            ctx, 2 + g * n + i, "state or gradient",
            ShapeToString(ctx.type(2 + i).shape) + " (its tensor's shape)");
      }
    }
  }
  return out;
}

float Attr(const OpContext& ctx, const char* name, float dflt) {
  return ctx.node().GetFloat(name, dflt);
}

Status RunAdagrad(const OpContext& ctx, std::vector<Tensor>& outputs) {
  const size_t n = (ctx.num_inputs() - 2) / 3;
  const double decay = Attr(ctx, "decay_factor", 0.0f), eps = Attr(ctx, "epsilon", 1e-6f);
  const double norm = Attr(ctx, "norm_coefficient", 0.0f);
  const double r =
      ctx.in(0).GetAsDouble(0) / (1.0 + static_cast<double>(ctx.in(1).GetAsInt64(0)) * decay);
  for (size_t i = 0; i < n; ++i) {
    std::vector<double> x = kernel::ToDoubles(ctx.in(2 + i));
    const std::vector<double> g = kernel::ToDoubles(ctx.in(2 + n + i));
    std::vector<double> h = kernel::ToDoubles(ctx.in(2 + 2 * n + i));
    for (size_t k = 0; k < x.size(); ++k) {
      const double gr = norm * x[k] + g[k];
      h[k] += gr * gr;
      x[k] -= r * gr / (std::sqrt(h[k]) + eps);
    }
    KILN_RETURN_IF_ERROR(kernel::StoreDoubles(x, outputs[i]));
    KILN_RETURN_IF_ERROR(kernel::StoreDoubles(h, outputs[n + i]));
  }
  return Status::OK();
}

Status RunMomentum(const OpContext& ctx, std::vector<Tensor>& outputs) {
  const size_t n = (ctx.num_inputs() - 2) / 3;
  const double alpha = Attr(ctx, "alpha", 0.0f), beta = Attr(ctx, "beta", 0.0f);
  const double norm = Attr(ctx, "norm_coefficient", 0.0f);
  const bool nesterov = ctx.node().GetString("mode", "standard") == "nesterov";
  const double r = ctx.in(0).GetAsDouble(0);
  const double beta_adjusted = ctx.in(1).GetAsInt64(0) > 0 ? beta : 1.0;
  for (size_t i = 0; i < n; ++i) {
    std::vector<double> x = kernel::ToDoubles(ctx.in(2 + i));
    const std::vector<double> g = kernel::ToDoubles(ctx.in(2 + n + i));
    std::vector<double> v = kernel::ToDoubles(ctx.in(2 + 2 * n + i));
    for (size_t k = 0; k < x.size(); ++k) {
      const double gr = norm * x[k] + g[k];
      v[k] = alpha * v[k] + beta_adjusted * gr;
      x[k] -= nesterov ? r * (gr + alpha * v[k]) : r * v[k];
    }
    KILN_RETURN_IF_ERROR(kernel::StoreDoubles(x, outputs[i]));
    KILN_RETURN_IF_ERROR(kernel::StoreDoubles(v, outputs[n + i]));
  }
  return Status::OK();
}

Status RunAdam(const OpContext& ctx, std::vector<Tensor>& outputs) {
  const size_t n = (ctx.num_inputs() - 2) / 4;
  const double alpha = Attr(ctx, "alpha", 0.9f), beta = Attr(ctx, "beta", 0.999f);
  const double eps = Attr(ctx, "epsilon", 1e-6f), norm = Attr(ctx, "norm_coefficient", 0.0f);
  const double post = Attr(ctx, "norm_coefficient_post", 0.0f);
  const double r = ctx.in(0).GetAsDouble(0);
  const int64_t t = ctx.in(1).GetAsInt64(0);
  const double td = static_cast<double>(t);
  const double r_adj =
      t > 0 ? r * std::sqrt(1.0 - std::pow(beta, td)) / (1.0 - std::pow(alpha, td)) : r;
  for (size_t i = 0; i < n; ++i) {
    std::vector<double> x = kernel::ToDoubles(ctx.in(2 + i));
    const std::vector<double> g = kernel::ToDoubles(ctx.in(2 + n + i));
    std::vector<double> v = kernel::ToDoubles(ctx.in(2 + 2 * n + i));
    std::vector<double> h = kernel::ToDoubles(ctx.in(2 + 3 * n + i));
    for (size_t k = 0; k < x.size(); ++k) {
      const double gr = norm * x[k] + g[k];
      v[k] = alpha * v[k] + (1.0 - alpha) * gr;
      h[k] = beta * h[k] + (1.0 - beta) * gr * gr;
      x[k] = (1.0 - post) * (x[k] - r_adj * (v[k] / (std::sqrt(h[k]) + eps)));
    }
    KILN_RETURN_IF_ERROR(kernel::StoreDoubles(x, outputs[i]));
    KILN_RETURN_IF_ERROR(kernel::StoreDoubles(v, outputs[n + i]));
    KILN_RETURN_IF_ERROR(kernel::StoreDoubles(h, outputs[2 * n + i]));
  }
  return Status::OK();
}

}  // namespace

std::vector<OpDef> TrainingOpDefs() {
  constexpr int64_t kMax = INT64_MAX;
  return {
      {"Adagrad", kTrainingDomain, 1, kMax, CheckGroups<3>, InferGroups<3>, RunAdagrad},
      {"Momentum", kTrainingDomain, 1, kMax, CheckGroups<3>, InferGroups<3>, RunMomentum},
      {"Adam", kTrainingDomain, 1, kMax, CheckGroups<4>, InferGroups<4>, RunAdam},
  };
}

}  // namespace kiln
