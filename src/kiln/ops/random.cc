// Random op family (ops layer): Bernoulli, RandomUniform, RandomUniformLike, RandomNormal,
// RandomNormalLike and Multinomial, each with its reference kernel.
//
// RandomOpDefs is registered by OpRegistry::Global() (registry.cc). Every draw comes from
// kernel::Rng seeded per node (kernel::NodeSeed: the node's `seed` attribute, else kiln's
// default seed mixed with its name), fresh on every application: a graph computes the
// same values on every run, in eager and in a compiled cell's host call alike, so a cell is
// proven against eager on equal draws. The values are not the ones another runtime's generator
// would draw: OpDef::nondeterministic marks these ops, and comparisons across runtimes (the
// conformance suite) check the distribution's support, dtype and shape instead of values.
#include <cmath>
#include <string>
#include <vector>

#include "src/kiln/ops/kernel_util.h"
#include "src/kiln/ops/registry.h"

namespace kiln {
namespace {

Result<DType> DTypeAttr(const Node& node, DType dflt) {
  if (!node.HasAttr("dtype")) return dflt;
  KILN_ASSIGN_OR_RETURN(int64_t code, node.GetInt("dtype"));
  const std::optional<DType> t = DTypeFromOnnxElemType(code);
  if (!t) {
    return Status::Unimplemented(node.Describe() + ": dtype=" + std::to_string(code) + " (" +
                                 OnnxElemTypeName(code) + ") is not supported");
  }
  return *t;
}

Status CheckSeed(const Node& node) {
  if (!node.HasAttr("seed")) return Status::OK();
  return node.GetFloat("seed").status();
}

// ---------------------------------------------------------------------------------------------
// Bernoulli (opset 15): y = 1 with probability x, else 0; dtype defaults to x's.

Status CheckBernoulli(const Node& node, int64_t) {
  KILN_RETURN_IF_ERROR(CheckArity(node, 1, 1));
  KILN_RETURN_IF_ERROR(CheckSeed(node));
  return DTypeAttr(node, DType::kFloat32).status();
}

Result<std::vector<TensorType>> InferBernoulli(const OpContext& ctx) {
  KILN_RETURN_IF_ERROR(kernel::RequireFloatInput(ctx, 0));
  KILN_ASSIGN_OR_RETURN(DType dt, DTypeAttr(ctx.node(), ctx.type(0).dtype));
  return std::vector<TensorType>{{dt, ctx.type(0).shape}};
}

Status RunBernoulli(const OpContext& ctx, std::vector<Tensor>& outputs) {
  kernel::Rng rng(kernel::NodeSeed(ctx.node()));
  std::vector<double> p = kernel::ToDoubles(ctx.in(0));
  for (double& v : p) v = rng.Uniform() < v ? 1.0 : 0.0;
  return kernel::StoreDoubles(p, outputs[0]);
}

// ---------------------------------------------------------------------------------------------
// RandomUniform / RandomNormal (opset 1): attribute shape; RandomUniformLike / RandomNormalLike:
// the input's shape (and dtype unless attribute dtype says otherwise). Uniform in [low, high),
// normal with mean and scale.

template <bool kLike>
Status CheckGenerator(const Node& node, int64_t) {
  KILN_RETURN_IF_ERROR(CheckArity(node, kLike ? 1 : 0, kLike ? 1 : 0));
  KILN_RETURN_IF_ERROR(CheckSeed(node));
  for (const char* f : {"low", "high", "mean", "scale"}) {
    KILN_RETURN_IF_ERROR(kernel::FloatOr(node, f, 0.0f).status());
  }
  if (!kLike) {
    KILN_ASSIGN_OR_RETURN(std::vector<int64_t> shape, node.GetInts("shape"));
    for (int64_t d : shape) {
      if (d < 0) return kernel::BadAttr(node, "shape", ShapeToString(shape), "dims >= 0");
    }
  }
  return DTypeAttr(node, DType::kFloat32).status();
}

template <bool kLike>
Result<std::vector<TensorType>> InferGenerator(const OpContext& ctx) {
  const DType dflt = kLike ? ctx.type(0).dtype : DType::kFloat32;
  KILN_ASSIGN_OR_RETURN(DType dt, DTypeAttr(ctx.node(), dflt));
  if (!kernel::IsFloatLike(dt))
    return UnsupportedDType(ctx, dt, "float32, float64, float16, bfloat16");
  Shape shape;
  if (kLike) {
    shape = ctx.type(0).shape;
  } else {
    KILN_ASSIGN_OR_RETURN(shape, ctx.node().GetInts("shape"));
  }
  return std::vector<TensorType>{{dt, shape}};
}

template <bool kNormal>
Status RunGenerator(const OpContext& ctx, std::vector<Tensor>& outputs) {
  kernel::Rng rng(kernel::NodeSeed(ctx.node()));
  std::vector<double> v(static_cast<size_t>(outputs[0].numel()));
  const Node& n = ctx.node();
  if (kNormal) {
    const double mean = n.GetFloat("mean", 0.0f), scale = n.GetFloat("scale", 1.0f);
    for (double& x : v) x = mean + scale * rng.Normal();
  } else {
    const double low = n.GetFloat("low", 0.0f), high = n.GetFloat("high", 1.0f);
    for (double& x : v) x = low + (high - low) * rng.Uniform();
  }
  return kernel::StoreDoubles(v, outputs[0]);
}

// ---------------------------------------------------------------------------------------------
// Multinomial (opset 7): input [batch, classes] of unnormalized log-probabilities; output
// [batch, sample_size] of class indices (int32 by default, or int64).

Status CheckMultinomial(const Node& node, int64_t) {
  KILN_RETURN_IF_ERROR(CheckArity(node, 1, 1));
  KILN_RETURN_IF_ERROR(CheckSeed(node));
  KILN_ASSIGN_OR_RETURN(int64_t n, kernel::IntOr(node, "sample_size", 1));
  if (n < 1) return kernel::BadAttr(node, "sample_size", std::to_string(n), ">= 1");
  KILN_ASSIGN_OR_RETURN(DType dt, DTypeAttr(node, DType::kInt32));
  if (dt != DType::kInt32 && dt != DType::kInt64) {
    return kernel::BadAttr(node, "dtype", DTypeName(dt), "int32 or int64");
  }
  return Status::OK();
}

Result<std::vector<TensorType>> InferMultinomial(const OpContext& ctx) {
  KILN_RETURN_IF_ERROR(kernel::RequireFloatInput(ctx, 0));
  if (ctx.type(0).shape.size() != 2)
    return kernel::BadInputShape(ctx, 0, "input", "[batch, classes]");
  KILN_ASSIGN_OR_RETURN(DType dt, DTypeAttr(ctx.node(), DType::kInt32));
  return std::vector<TensorType>{{dt, {ctx.type(0).shape[0], ctx.node().GetInt("sample_size", 1)}}};
}

Status RunMultinomial(const OpContext& ctx, std::vector<Tensor>& outputs) {
  kernel::Rng rng(kernel::NodeSeed(ctx.node()));
  const std::vector<double> logits = kernel::ToDoubles(ctx.in(0));
  const int64_t batch = ctx.in(0).dim(0), classes = ctx.in(0).dim(1);
  const int64_t samples = outputs[0].dim(1);
  std::vector<int64_t> out;
  for (int64_t b = 0; b < batch; ++b) {
    const double* row = logits.data() + b * classes;
    double mx = -INFINITY;
    for (int64_t c = 0; c < classes; ++c) mx = std::max(mx, row[c]);
    std::vector<double> cdf(static_cast<size_t>(classes));
    double total = 0.0;
    for (int64_t c = 0; c < classes; ++c) {
      total += std::exp(row[c] - mx);
      cdf[static_cast<size_t>(c)] = total;
    }
    for (int64_t s = 0; s < samples; ++s) {
      const double u = rng.Uniform() * total;
      int64_t c = 0;
      while (c + 1 < classes && cdf[static_cast<size_t>(c)] <= u) ++c;
      out.push_back(c);
    }
  }
  return kernel::StoreInt64s(out, outputs[0]);
}

}  // namespace

std::vector<OpDef> RandomOpDefs() {
  constexpr int64_t kMax = INT64_MAX;
  std::vector<OpDef> defs = {
      {"Bernoulli", "", 15, kMax, CheckBernoulli, InferBernoulli, RunBernoulli},
      {"RandomUniform", "", 1, kMax, CheckGenerator<false>, InferGenerator<false>,
       RunGenerator<false>},
      {"RandomUniformLike", "", 1, kMax, CheckGenerator<true>, InferGenerator<true>,
       RunGenerator<false>},
      {"RandomNormal", "", 1, kMax, CheckGenerator<false>, InferGenerator<false>,
       RunGenerator<true>},
      {"RandomNormalLike", "", 1, kMax, CheckGenerator<true>, InferGenerator<true>,
       RunGenerator<true>},
      {"Multinomial", "", 7, kMax, CheckMultinomial, InferMultinomial, RunMultinomial},
  };
  for (OpDef& d : defs) d.nondeterministic = true;
  return defs;
}

}  // namespace kiln
