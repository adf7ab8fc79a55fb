// The matrix-product op family: MatMul and Gemm (ops layer).
//
// Listed by MatMulOpDefs (registered by registry.cc). float32 reference kernels through
// oneDNN's GEMM (ops/dnnl_kernels.h); each op has a check (attributes only) and an infer (shapes,
// with named errors).
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

// Gemm's attributes, read leniently as its kernels always have (check types them).
struct GemmAttrs : PreparedNode {
  bool trans_a = false, trans_b = false;
  float alpha = 1.0f, beta = 1.0f;
};

Result<GemmAttrs> ParseGemmAttrs(const Node& node, int64_t /*opset*/) {
  GemmAttrs a;
  a.trans_a = node.GetInt("transA", 0) != 0;
  a.trans_b = node.GetInt("transB", 0) != 0;
  a.alpha = node.GetFloat("alpha", 1.0f);
  a.beta = node.GetFloat("beta", 1.0f);
  return a;
}

struct GemmShapes {
  bool trans_a = false, trans_b = false;
  int64_t M = 0, N = 0, K = 0;
};

Result<GemmShapes> GemmGeometry(const OpContext& ctx, const GemmAttrs& attrs) {
  GemmShapes g;
  g.trans_a = attrs.trans_a;
  g.trans_b = attrs.trans_b;
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
  GemmAttrs scratch;
  KILN_ASSIGN_OR_RETURN(const GemmAttrs* attrs, PreparedOr(ctx, &scratch, ParseGemmAttrs));
  KILN_ASSIGN_OR_RETURN(GemmShapes g, GemmGeometry(ctx, *attrs));
  return std::vector<TensorType>{{ctx.type(0).dtype, {g.M, g.N}}};
}

Status RunGemm(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_RETURN_IF_ERROR(RequireFloat32(ctx, 0));
  GemmAttrs scratch;
  KILN_ASSIGN_OR_RETURN(const GemmAttrs* attrs, PreparedOr(ctx, &scratch, ParseGemmAttrs));
  KILN_ASSIGN_OR_RETURN(GemmShapes g, GemmGeometry(ctx, *attrs));
  const float alpha = attrs->alpha;
  const float beta = attrs->beta;
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

}  // namespace

std::vector<OpDef> MatMulOpDefs() {
  // std::array of exactly the family's count: adding an op without growing it fails to compile;
  // a missing row would leave infer/run null, which Register rejects.
  const std::array<OpDef, 2> table = {{
      {"MatMul", "", 1, INT64_MAX, CheckBinary, InferMatMul, RunMatMul},
      {"Gemm", "", 1, INT64_MAX, CheckGemm, InferGemm, RunGemm,
       PrepareWith<GemmAttrs, ParseGemmAttrs>},
  }};
  return {table.begin(), table.end()};
}

}  // namespace kiln
