// The quantized op family (ops layer): QuantizeLinear, DequantizeLinear, MatMulInteger,
// QLinearMatMul, ConvInteger and QLinearConv.
//
// Listed by QuantOpDefs (registered by registry.cc). Compiled cells
// run these same kernels through the host table, so there is one implementation of the integer
// semantics. Scales and zero points are read as inputs on every run: in a real model they are
// initializers of weight dtypes (float32, int8, uint8), i.e. checkpoint data bound by name, and
// a kernel must never assume their values are fixed.
//
// Semantics (ONNX, opsets 10 and 13):
//   quantize:    y = saturate(round_half_even(x / scale) + zero_point), in float32 like ONNX's
//                reference, into the zero point's dtype (uint8 when the zero point is absent).
//   dequantize:  y = (x - zero_point) * scale.
//   integer ops: products of (a - a_zero_point) and (b - b_zero_point) accumulated in int32;
//                QLinear* requantize acc * (a_scale * b_scale / y_scale) like quantize.
// A scale or zero point is per tensor (one element) or per axis / row / column / output channel
// where ONNX allows it; the Param helper below holds both forms.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "src/kiln/ops/registry.h"

namespace kiln {
namespace {

// ---------------------------------------------------------------------------------------------
// Scalar helpers.

bool Is8Bit(DType t) { return t == DType::kInt8 || t == DType::kUInt8; }

// Round half to even without depending on the thread's floating-point rounding mode.
float RoundHalfEven(float v) {
  const float f = std::floor(v);
  const float diff = v - f;
  if (diff > 0.5f) return f + 1.0f;
  if (diff < 0.5f) return f;
  return std::fmod(f, 2.0f) == 0.0f ? f : f + 1.0f;
}

// round_half_even(v) + zero_point, saturated to [lo, hi]. NaN maps to the zero point.
int32_t Requantize(float v, int32_t zero_point, int32_t lo, int32_t hi) {
  if (std::isnan(v)) return std::clamp(zero_point, lo, hi);
  const float r = RoundHalfEven(v) + static_cast<float>(zero_point);
  if (r <= static_cast<float>(lo)) return lo;
  if (r >= static_cast<float>(hi)) return hi;
  return static_cast<int32_t>(r);
}

void RangeOf(DType t, int32_t* lo, int32_t* hi) {
  if (t == DType::kInt8) {
    *lo = -128;
    *hi = 127;
  } else {
    *lo = 0;
    *hi = 255;
  }
}

// Element i of an int8/uint8/int32 tensor as int32. REQUIRES: one of those dtypes.
int32_t IntAt(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::kInt8:
      return t.data<int8_t>()[i];
    case DType::kUInt8:
      return t.data<uint8_t>()[i];
    default:
      return t.data<int32_t>()[i];
  }
}

// Writes v (already in range) as the 8-bit dtype of `t`.
void Store8(Tensor& t, int64_t i, int32_t v) {
  if (t.dtype() == DType::kInt8) {
    t.data<int8_t>()[i] = static_cast<int8_t>(v);
  } else {
    t.data<uint8_t>()[i] = static_cast<uint8_t>(v);
  }
}

// The whole tensor widened to int32 (zero points are subtracted by the caller).
std::vector<int32_t> ToInt32(const Tensor& t) {
  std::vector<int32_t> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[static_cast<size_t>(i)] = IntAt(t, i);
  return v;
}

std::string InputName(size_t i, const char* role) {
  return "input " + std::to_string(i) + " ('" + role + "')";
}

Status RequireDType(const OpContext& ctx, size_t i, const char* role, bool ok,
                    const char* expected) {
  if (ok) return Status::OK();
  return Status::InvalidArgument(ctx.where() + ": " + InputName(i, role) + " has dtype " +
                                 DTypeName(ctx.type(i).dtype) + ", expected " + expected);
}

Status Require8Bit(const OpContext& ctx, size_t i, const char* role) {
  return RequireDType(ctx, i, role, Is8Bit(ctx.type(i).dtype), "int8 or uint8");
}

Status RequireScaleF32(const OpContext& ctx, size_t i, const char* role) {
  if (ctx.type(i).dtype == DType::kFloat32) return Status::OK();
  return UnsupportedDType(ctx, ctx.type(i).dtype, "float32 scales");
}

// A zero point, when present, has the dtype of the tensor it belongs to.
Status RequireZeroPointDType(const OpContext& ctx, size_t zp, const char* role, DType dtype) {
  if (!ctx.present(zp) || ctx.type(zp).dtype == dtype) return Status::OK();
  return Status::InvalidArgument(ctx.where() + ": " + InputName(zp, role) + " has dtype " +
                                 DTypeName(ctx.type(zp).dtype) + ", expected " + DTypeName(dtype) +
                                 " like the tensor it belongs to");
}

// ---------------------------------------------------------------------------------------------
// Param: a scale or zero point that is one value, or one value per index along one dimension.
//
// `at(outer, k)` is the value for index k along the dimension, in the outer block `outer` (only
// the "full" form of MatMulInteger's N-D zero points has more than one outer block).

struct Param {
  enum class Form { kAbsent, kScalar, kVector, kFull };
  Form form = Form::kAbsent;
  const Tensor* t = nullptr;
  int64_t n = 1;  // values per outer block for kVector/kFull

  float f(int64_t outer, int64_t k) const {
    if (form == Form::kAbsent) return 0.0f;
    return t->data<float>()[index(outer, k)];
  }
  int32_t i(int64_t outer, int64_t k) const {
    if (form == Form::kAbsent) return 0;
    return IntAt(*t, index(outer, k));
  }
  int64_t index(int64_t outer, int64_t k) const {
    switch (form) {
      case Form::kVector:
        return k;
      case Form::kFull:
        return outer * n + k;
      default:
        return 0;
    }
  }
};

bool IsScalarLike(const Shape& s) { return s.size() <= 1 && NumElements(s) == 1; }

// Input i absent (an empty Param), one value, or a 1-D vector of `n` values; any other shape:
// nullopt, for the caller to accept another form or name the error.
std::optional<Param> ScalarOrVectorForm(const OpContext& ctx, size_t i, int64_t n) {
  Param p;
  if (!ctx.present(i)) return p;
  const Shape& s = ctx.type(i).shape;
  p.t = ctx.value(i);
  if (IsScalarLike(s)) {
    p.form = Param::Form::kScalar;
    return p;
  }
  if (s.size() == 1 && s[0] == n) {
    p.form = Param::Form::kVector;
    p.n = n;
    return p;
  }
  return std::nullopt;
}

// Accepts input i as one value or a 1-D vector of `n` values (per-`what`); other shapes are an
// error naming the input, its shape and both accepted forms.
Result<Param> ScalarOrVector(const OpContext& ctx, size_t i, const char* role, int64_t n,
                             const std::string& what) {
  if (std::optional<Param> p = ScalarOrVectorForm(ctx, i, n)) return *p;
  const Shape& s = ctx.type(i).shape;
  return Status::InvalidArgument(ctx.where() + ": " + InputName(i, role) + " has shape " +
                                 ShapeToString(s) + ", expected a scalar or [" + std::to_string(n) +
                                 "] (" + what + ")");
}

Status SameShape(const OpContext& ctx, size_t a, const char* role_a, size_t b, const char* role_b) {
  if (!ctx.present(a) || !ctx.present(b) || ctx.type(a).shape == ctx.type(b).shape) {
    return Status::OK();
  }
  return Status::InvalidArgument(
      ctx.where() + ": " + InputName(b, role_b) + " has shape " + ShapeToString(ctx.type(b).shape) +
      ", expected " + ShapeToString(ctx.type(a).shape) + " like " + InputName(a, role_a));
}

// ---------------------------------------------------------------------------------------------
// QuantizeLinear / DequantizeLinear.

// Attributes later opsets added that change the semantics; kiln supports their defaults only.
Status CheckQdqCommon(const Node& node, int64_t opset, size_t max_inputs) {
  KILN_RETURN_IF_ERROR(CheckArity(node, 2, max_inputs));
  if (node.HasAttr("axis")) {
    if (opset < 13) {
      return Status::InvalidArgument(node.Describe() + ": attribute 'axis' exists from opset 13, " +
                                     "the model is at opset " + std::to_string(opset));
    }
    KILN_RETURN_IF_ERROR(node.GetInt("axis").status());
  }
  if (node.HasAttr("block_size")) {
    KILN_ASSIGN_OR_RETURN(int64_t block, node.GetInt("block_size"));
    if (block != 0) {
      return Status::Unimplemented(node.Describe() + ": block_size=" + std::to_string(block) +
                                   " (blocked quantization) is not supported; expected 0");
    }
  }
  return Status::OK();
}

Status CheckQuantize(const Node& node, int64_t opset) {
  KILN_RETURN_IF_ERROR(CheckQdqCommon(node, opset, 3));
  if (node.HasAttr("output_dtype")) {
    KILN_ASSIGN_OR_RETURN(int64_t dt, node.GetInt("output_dtype"));
    // ONNX TensorProto codes: 0 undefined (from the zero point), 2 uint8, 3 int8.
    if (dt != 0 && dt != 2 && dt != 3) {
      return Status::Unimplemented(node.Describe() + ": output_dtype=" + std::to_string(dt) +
                                   " is not supported (supported: 2 uint8, 3 int8)");
    }
  }
  if (node.HasAttr("saturate")) {
    KILN_ASSIGN_OR_RETURN(int64_t sat, node.GetInt("saturate"));
    if (sat != 0 && sat != 1) {
      return Status::InvalidArgument(node.Describe() + ": saturate=" + std::to_string(sat) +
                                     " is not 0 or 1");
    }
  }
  return Status::OK();
}

Status CheckDequantize(const Node& node, int64_t opset) { return CheckQdqCommon(node, opset, 3); }

// The per-axis geometry of a QDQ node: the scale is per tensor, or 1-D along `axis` of x.
struct QdqAxis {
  Param scale, zero_point;
  int64_t channels = 1, inner = 1;  // x viewed as [outer, channels, inner]
};

Result<QdqAxis> ReadQdqAxis(const OpContext& ctx) {
  QdqAxis q;
  const Shape& x = ctx.type(0).shape;
  const Shape& s = ctx.type(1).shape;
  const int64_t rank = static_cast<int64_t>(x.size());
  if (IsScalarLike(s)) {
    q.scale = Param{Param::Form::kScalar, ctx.value(1), 1};
  } else {
    if (ctx.opset() < 13) {
      return Status::InvalidArgument(ctx.where() + ": " + InputName(1, "scale") + " has shape " +
                                     ShapeToString(s) + "; opset " + std::to_string(ctx.opset()) +
                                     " takes a scalar scale (per-axis needs opset 13)");
    }
    int64_t axis = ctx.node().GetInt("axis", 1);
    if (axis < -rank || axis >= rank) {
      return Status::InvalidArgument(ctx.where() + ": axis=" + std::to_string(axis) +
                                     " is out of range for input of rank " + std::to_string(rank));
    }
    if (axis < 0) axis += rank;
    q.channels = x[static_cast<size_t>(axis)];
    for (int64_t d = axis + 1; d < rank; ++d) q.inner *= x[static_cast<size_t>(d)];
    if (s.size() != 1 || s[0] != q.channels) {
      return Status::InvalidArgument(ctx.where() + ": " + InputName(1, "scale") + " has shape " +
                                     ShapeToString(s) + ", expected a scalar or [" +
                                     std::to_string(q.channels) + "] (per-axis along axis " +
                                     std::to_string(axis) + " of " + ShapeToString(x) + ")");
    }
    q.scale = Param{Param::Form::kVector, ctx.value(1), q.channels};
  }
  if (ctx.present(2)) {
    KILN_RETURN_IF_ERROR(SameShape(ctx, 1, "scale", 2, "zero_point"));
    q.zero_point = Param{q.scale.form, ctx.value(2), q.scale.n};
  }
  return q;
}

Result<std::vector<TensorType>> InferQuantize(const OpContext& ctx) {
  KILN_RETURN_IF_ERROR(RequireDType(ctx, 0, "x", ctx.type(0).dtype == DType::kFloat32, "float32"));
  KILN_RETURN_IF_ERROR(RequireScaleF32(ctx, 1, "y_scale"));
  DType out = DType::kUInt8;
  if (ctx.present(2)) {
    KILN_RETURN_IF_ERROR(Require8Bit(ctx, 2, "y_zero_point"));
    out = ctx.type(2).dtype;
  }
  const int64_t attr_dt = ctx.node().GetInt("output_dtype", 0);
  if (attr_dt != 0) {
    const DType want = attr_dt == 3 ? DType::kInt8 : DType::kUInt8;
    if (ctx.present(2) && want != out) {
      return Status::InvalidArgument(ctx.where() + ": output_dtype=" + std::to_string(attr_dt) +
                                     " disagrees with y_zero_point's dtype " + DTypeName(out));
    }
    out = want;
  }
  KILN_RETURN_IF_ERROR(ReadQdqAxis(ctx).status());
  return std::vector<TensorType>{{out, ctx.type(0).shape}};
}

Status RunQuantize(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_ASSIGN_OR_RETURN(QdqAxis q, ReadQdqAxis(ctx));
  const Tensor& xt = ctx.in(0);
  Tensor& y = outputs[0];
  int32_t lo = 0, hi = 0;
  RangeOf(y.dtype(), &lo, &hi);
  const float* x = xt.data<float>();
  for (int64_t i = 0; i < xt.numel(); ++i) {
    const int64_t c = (i / q.inner) % q.channels;
    const float v = x[i] / q.scale.f(0, c);
    Store8(y, i, Requantize(v, q.zero_point.i(0, c), lo, hi));
  }
  return Status::OK();
}

Result<std::vector<TensorType>> InferDequantize(const OpContext& ctx) {
  const DType xd = ctx.type(0).dtype;
  KILN_RETURN_IF_ERROR(
      RequireDType(ctx, 0, "x", Is8Bit(xd) || xd == DType::kInt32, "int8, uint8 or int32"));
  KILN_RETURN_IF_ERROR(RequireScaleF32(ctx, 1, "x_scale"));
  KILN_RETURN_IF_ERROR(RequireZeroPointDType(ctx, 2, "x_zero_point", xd));
  KILN_RETURN_IF_ERROR(ReadQdqAxis(ctx).status());
  return std::vector<TensorType>{{DType::kFloat32, ctx.type(0).shape}};
}

Status RunDequantize(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_ASSIGN_OR_RETURN(QdqAxis q, ReadQdqAxis(ctx));
  const Tensor& xt = ctx.in(0);
  float* y = outputs[0].data<float>();
  for (int64_t i = 0; i < xt.numel(); ++i) {
    const int64_t c = (i / q.inner) % q.channels;
    y[i] = static_cast<float>(IntAt(xt, i) - q.zero_point.i(0, c)) * q.scale.f(0, c);
  }
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------
// MatMulInteger / QLinearMatMul: numpy matmul broadcasting over batch dims, 1-D operands
// promoted as numpy does, int32 accumulation.

struct MatMulGeom {
  Shape a, b;       // operands after 1-D promotion: [..., M, K] and [..., K, N]
  Shape out_batch;  // broadcast batch dims
  Shape out;        // the ONNX output shape (promoted dims dropped again)
  int64_t M = 0, K = 0, N = 0;
};

Result<MatMulGeom> ReadMatMulGeom(const OpContext& ctx, size_t ia, size_t ib) {
  MatMulGeom g;
  g.a = ctx.type(ia).shape;
  g.b = ctx.type(ib).shape;
  if (g.a.empty() || g.b.empty()) {
    return Status::InvalidArgument(ctx.where() + ": matmul operands must have rank >= 1, got " +
                                   ShapeToString(g.a) + " and " + ShapeToString(g.b));
  }
  const bool a_vec = g.a.size() == 1, b_vec = g.b.size() == 1;
  if (a_vec) g.a.insert(g.a.begin(), 1);
  if (b_vec) g.b.push_back(1);
  g.M = g.a[g.a.size() - 2];
  g.K = g.a.back();
  g.N = g.b.back();
  if (g.b[g.b.size() - 2] != g.K) {
    return Status::InvalidArgument(ctx.where() +
                                   ": inner dims differ: " + ShapeToString(ctx.type(ia).shape) +
                                   " x " + ShapeToString(ctx.type(ib).shape));
  }
  Shape ab(g.a.begin(), g.a.end() - 2), bb(g.b.begin(), g.b.end() - 2);
  auto batch = BroadcastShapes(ab, bb);
  if (!batch.ok()) return batch.status().WithContext(ctx.where() + ": batch dims");
  g.out_batch = *batch;
  g.out = g.out_batch;
  if (!a_vec) g.out.push_back(g.M);
  if (!b_vec) g.out.push_back(g.N);
  return g;
}

// Flat batch index into `operand_batch` (right-aligned, broadcast) for output batch index ob.
int64_t BatchIndex(const Shape& out_batch, const Shape& operand_batch, int64_t ob) {
  int64_t idx = 0, stride = 1;
  const size_t off = out_batch.size() - operand_batch.size();
  for (size_t d = out_batch.size(); d-- > 0;) {
    const int64_t coord = ob % out_batch[d];
    ob /= out_batch[d];
    if (d < off) continue;
    const int64_t dim = operand_batch[d - off];
    if (dim != 1) idx += coord * stride;
    stride *= dim;
  }
  return idx;
}

// A matmul per-row (side 'a': one value per row m) or per-column (side 'b': per column n)
// parameter: a scalar, a 1-D vector, or (zero points of MatMulInteger) the operand's own shape
// with the reduced dim set to 1.
Result<Param> MatMulParam(const OpContext& ctx, size_t i, const char* role, const Shape& operand,
                          bool row_side, int64_t n) {
  if (std::optional<Param> p = ScalarOrVectorForm(ctx, i, n)) return *p;
  const Shape& s = ctx.type(i).shape;
  Param p;
  p.t = ctx.value(i);
  Shape full = operand;
  if (full.size() >= 2) full[full.size() - (row_side ? 1 : 2)] = 1;
  if (operand.size() > 2 && s == full) {
    p.form = Param::Form::kFull;
    p.n = n;
    return p;
  }
  return Status::InvalidArgument(
      ctx.where() + ": " + InputName(i, role) + " has shape " + ShapeToString(s) +
      ", expected a scalar or [" + std::to_string(n) + "] (one per " +
      (row_side ? "row" : "column") + ")" +
      (operand.size() > 2 ? " or " + ShapeToString(full) : std::string()));
}

// acc[ob, m, n] = sum_k (a - za[m]) * (b - zb[n]) in int32 (wrapping as int32 hardware does).
// `emit(ob, m, n, acc)` receives each result.
template <typename Emit>
void IntegerMatMul(const MatMulGeom& g, const Tensor& a, const Param& za, const Tensor& b,
                   const Param& zb, Emit emit) {
  const Shape ab(g.a.begin(), g.a.end() - 2), bb(g.b.begin(), g.b.end() - 2);
  const int64_t batches = NumElements(g.out_batch);
  std::vector<int32_t> ra(static_cast<size_t>(g.M * g.K)), rb(static_cast<size_t>(g.K * g.N));
  for (int64_t ob = 0; ob < batches; ++ob) {
    const int64_t ia = BatchIndex(g.out_batch, ab, ob), ib = BatchIndex(g.out_batch, bb, ob);
    for (int64_t m = 0; m < g.M; ++m) {
      const int32_t z = za.i(ia, m);
      for (int64_t k = 0; k < g.K; ++k) {
        ra[static_cast<size_t>(m * g.K + k)] = IntAt(a, (ia * g.M + m) * g.K + k) - z;
      }
    }
    for (int64_t k = 0; k < g.K; ++k) {
      for (int64_t n = 0; n < g.N; ++n) {
        rb[static_cast<size_t>(k * g.N + n)] = IntAt(b, (ib * g.K + k) * g.N + n) - zb.i(ib, n);
      }
    }
    for (int64_t m = 0; m < g.M; ++m) {
      for (int64_t n = 0; n < g.N; ++n) {
        int64_t acc = 0;
        for (int64_t k = 0; k < g.K; ++k) {
          acc += static_cast<int64_t>(ra[static_cast<size_t>(m * g.K + k)]) *
                 rb[static_cast<size_t>(k * g.N + n)];
        }
        emit(ob, m, n, static_cast<int32_t>(acc));
      }
    }
  }
}

Status CheckMatMulInteger(const Node& node, int64_t /*opset*/) { return CheckArity(node, 2, 4); }

Result<std::vector<TensorType>> InferMatMulInteger(const OpContext& ctx) {
  KILN_RETURN_IF_ERROR(Require8Bit(ctx, 0, "A"));
  KILN_RETURN_IF_ERROR(Require8Bit(ctx, 1, "B"));
  KILN_RETURN_IF_ERROR(RequireZeroPointDType(ctx, 2, "a_zero_point", ctx.type(0).dtype));
  KILN_RETURN_IF_ERROR(RequireZeroPointDType(ctx, 3, "b_zero_point", ctx.type(1).dtype));
  KILN_ASSIGN_OR_RETURN(MatMulGeom g, ReadMatMulGeom(ctx, 0, 1));
  KILN_RETURN_IF_ERROR(MatMulParam(ctx, 2, "a_zero_point", g.a, true, g.M).status());
  KILN_RETURN_IF_ERROR(MatMulParam(ctx, 3, "b_zero_point", g.b, false, g.N).status());
  return std::vector<TensorType>{{DType::kInt32, g.out}};
}

Status RunMatMulInteger(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_ASSIGN_OR_RETURN(MatMulGeom g, ReadMatMulGeom(ctx, 0, 1));
  KILN_ASSIGN_OR_RETURN(Param za, MatMulParam(ctx, 2, "a_zero_point", g.a, true, g.M));
  KILN_ASSIGN_OR_RETURN(Param zb, MatMulParam(ctx, 3, "b_zero_point", g.b, false, g.N));
  int32_t* y = outputs[0].data<int32_t>();
  IntegerMatMul(g, ctx.in(0), za, ctx.in(1), zb, [&](int64_t ob, int64_t m, int64_t n, int32_t v) {
    y[(ob * g.M + m) * g.N + n] = v;
  });
  return Status::OK();
}

// QLinearMatMul inputs: a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale,
// y_zero_point; all eight are required by the spec.
Status CheckQLinearMatMul(const Node& node, int64_t /*opset*/) {
  KILN_RETURN_IF_ERROR(CheckArity(node, 8, 8));
  return Status::OK();
}

struct QLinearMatMulParams {
  MatMulGeom g;
  Param as, az, bs, bz, ys, yz;
};

Result<QLinearMatMulParams> ReadQLinearMatMul(const OpContext& ctx) {
  QLinearMatMulParams p;
  KILN_ASSIGN_OR_RETURN(p.g, ReadMatMulGeom(ctx, 0, 3));
  Shape y_like = p.g.out_batch;
  y_like.push_back(p.g.M);
  y_like.push_back(p.g.N);
  KILN_ASSIGN_OR_RETURN(p.as, MatMulParam(ctx, 1, "a_scale", p.g.a, true, p.g.M));
  KILN_ASSIGN_OR_RETURN(p.az, MatMulParam(ctx, 2, "a_zero_point", p.g.a, true, p.g.M));
  KILN_ASSIGN_OR_RETURN(p.bs, MatMulParam(ctx, 4, "b_scale", p.g.b, false, p.g.N));
  KILN_ASSIGN_OR_RETURN(p.bz, MatMulParam(ctx, 5, "b_zero_point", p.g.b, false, p.g.N));
  KILN_ASSIGN_OR_RETURN(p.ys, MatMulParam(ctx, 6, "y_scale", y_like, true, p.g.M));
  KILN_ASSIGN_OR_RETURN(p.yz, MatMulParam(ctx, 7, "y_zero_point", y_like, true, p.g.M));
  KILN_RETURN_IF_ERROR(SameShape(ctx, 1, "a_scale", 2, "a_zero_point"));
  KILN_RETURN_IF_ERROR(SameShape(ctx, 4, "b_scale", 5, "b_zero_point"));
  KILN_RETURN_IF_ERROR(SameShape(ctx, 6, "y_scale", 7, "y_zero_point"));
  return p;
}

Result<std::vector<TensorType>> InferQLinearMatMul(const OpContext& ctx) {
  KILN_RETURN_IF_ERROR(Require8Bit(ctx, 0, "a"));
  KILN_RETURN_IF_ERROR(Require8Bit(ctx, 3, "b"));
  KILN_RETURN_IF_ERROR(Require8Bit(ctx, 7, "y_zero_point"));
  KILN_RETURN_IF_ERROR(RequireScaleF32(ctx, 1, "a_scale"));
  KILN_RETURN_IF_ERROR(RequireScaleF32(ctx, 4, "b_scale"));
  KILN_RETURN_IF_ERROR(RequireScaleF32(ctx, 6, "y_scale"));
  KILN_RETURN_IF_ERROR(RequireZeroPointDType(ctx, 2, "a_zero_point", ctx.type(0).dtype));
  KILN_RETURN_IF_ERROR(RequireZeroPointDType(ctx, 5, "b_zero_point", ctx.type(3).dtype));
  KILN_ASSIGN_OR_RETURN(QLinearMatMulParams p, ReadQLinearMatMul(ctx));
  return std::vector<TensorType>{{ctx.type(7).dtype, p.g.out}};
}

Status RunQLinearMatMul(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_ASSIGN_OR_RETURN(QLinearMatMulParams p, ReadQLinearMatMul(ctx));
  const Shape ab(p.g.a.begin(), p.g.a.end() - 2), bb(p.g.b.begin(), p.g.b.end() - 2);
  Tensor& y = outputs[0];
  int32_t lo = 0, hi = 0;
  RangeOf(y.dtype(), &lo, &hi);
  IntegerMatMul(p.g, ctx.in(0), p.az, ctx.in(3), p.bz,
                [&](int64_t ob, int64_t m, int64_t n, int32_t acc) {
                  const int64_t ia = BatchIndex(p.g.out_batch, ab, ob);
                  const int64_t ib = BatchIndex(p.g.out_batch, bb, ob);
                  const float multiplier = p.as.f(ia, m) * p.bs.f(ib, n) / p.ys.f(ob, m);
                  Store8(y, (ob * p.g.M + m) * p.g.N + n,
                         Requantize(static_cast<float>(acc) * multiplier, p.yz.i(ob, m), lo, hi));
                });
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------
// ConvInteger / QLinearConv: N-D direct convolution over zero-point-shifted int32 values.
// Padding contributes zero after the shift (the padded input equals its zero point).

struct ConvGeom {
  int64_t N = 0, C = 0, M = 0, group = 1;
  Shape in, kernel, out;  // spatial dims
  std::vector<int64_t> strides, dilations, pad_begin;
};

Status CheckConvAttrs(const Node& node) {
  const std::string where = node.Describe();
  const std::string auto_pad = node.GetString("auto_pad", "NOTSET");
  if (node.HasAttr("auto_pad")) KILN_RETURN_IF_ERROR(node.GetString("auto_pad").status());
  if (auto_pad != "NOTSET" && auto_pad != "SAME_UPPER" && auto_pad != "SAME_LOWER" &&
      auto_pad != "VALID") {
    return Status::InvalidArgument(where + ": auto_pad='" + auto_pad +
                                   "' is not one of NOTSET, SAME_UPPER, SAME_LOWER, VALID");
  }
  for (const char* attr : {"strides", "dilations", "kernel_shape"}) {
    if (!node.HasAttr(attr)) continue;
    KILN_ASSIGN_OR_RETURN(std::vector<int64_t> v, node.GetInts(attr));
    for (int64_t x : v) {
      if (x < 1) {
        return Status::InvalidArgument(where + ": " + attr + "=" + ShapeToString(v) +
                                       " has a value below 1");
      }
    }
  }
  if (node.HasAttr("pads")) {
    KILN_ASSIGN_OR_RETURN(std::vector<int64_t> v, node.GetInts("pads"));
    for (int64_t x : v) {
      if (x < 0) {
        return Status::InvalidArgument(where + ": pads=" + ShapeToString(v) +
                                       " has a negative value");
      }
    }
  }
  if (node.HasAttr("group")) {
    KILN_ASSIGN_OR_RETURN(int64_t group, node.GetInt("group"));
    if (group < 1) {
      return Status::InvalidArgument(where + ": group=" + std::to_string(group) + " is below 1");
    }
  }
  return Status::OK();
}

Result<ConvGeom> ReadConvGeom(const OpContext& ctx, size_t ix, size_t iw) {
  const Node& node = ctx.node();
  const std::string where = ctx.where();
  const Shape& x = ctx.type(ix).shape;
  const Shape& w = ctx.type(iw).shape;
  if (x.size() < 3 || w.size() != x.size()) {
    return Status::InvalidArgument(where + ": x " + ShapeToString(x) + " and w " +
                                   ShapeToString(w) +
                                   " must both be [N, C, spatial...] / [M, C/group, kernel...] "
                                   "of one rank >= 3");
  }
  ConvGeom g;
  const size_t sr = x.size() - 2;
  g.N = x[0];
  g.C = x[1];
  g.M = w[0];
  g.group = node.GetInt("group", 1);
  g.in.assign(x.begin() + 2, x.end());
  g.kernel.assign(w.begin() + 2, w.end());
  if (g.C % g.group != 0 || g.M % g.group != 0 || w[1] * g.group != g.C) {
    return Status::InvalidArgument(where + ": group=" + std::to_string(g.group) + " with " +
                                   std::to_string(g.C) + " input channels and w " +
                                   ShapeToString(w) +
                                   " (expected C = w[1] * group and group dividing M)");
  }
  const std::vector<int64_t> ks = node.GetInts("kernel_shape", g.kernel);
  if (ks != g.kernel) {
    return Status::InvalidArgument(where + ": kernel_shape=" + ShapeToString(ks) +
                                   " does not match the weights' spatial dims " +
                                   ShapeToString(g.kernel));
  }
  g.strides = node.GetInts("strides", std::vector<int64_t>(sr, 1));
  g.dilations = node.GetInts("dilations", std::vector<int64_t>(sr, 1));
  std::vector<int64_t> pads = node.GetInts("pads", std::vector<int64_t>(2 * sr, 0));
  if (g.strides.size() != sr || g.dilations.size() != sr || pads.size() != 2 * sr) {
    return Status::InvalidArgument(where + ": strides=" + ShapeToString(g.strides) +
                                   ", dilations=" + ShapeToString(g.dilations) +
                                   ", pads=" + ShapeToString(pads) + " do not fit " +
                                   std::to_string(sr) + " spatial dims");
  }
  const std::string auto_pad = node.GetString("auto_pad", "NOTSET");
  g.pad_begin.resize(sr);
  g.out.resize(sr);
  for (size_t d = 0; d < sr; ++d) {
    const int64_t dk = (g.kernel[d] - 1) * g.dilations[d] + 1;
    int64_t pb = pads[d], pe = pads[d + sr];
    if (auto_pad == "VALID") {
      pb = pe = 0;
    } else if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      const int64_t out = (g.in[d] + g.strides[d] - 1) / g.strides[d];
      const int64_t total = std::max<int64_t>(0, (out - 1) * g.strides[d] + dk - g.in[d]);
      pb = auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
      pe = total - pb;
    }
    g.pad_begin[d] = pb;
    const int64_t span = g.in[d] + pb + pe - dk;
    if (span < 0) {
      return Status::InvalidArgument(where + ": kernel extent " + std::to_string(dk) +
                                     " exceeds padded input " + std::to_string(g.in[d] + pb + pe) +
                                     " along spatial dim " + std::to_string(d));
    }
    g.out[d] = span / g.strides[d] + 1;
  }
  return g;
}

Shape ConvOutShape(const ConvGeom& g) {
  Shape s = {g.N, g.M};
  s.insert(s.end(), g.out.begin(), g.out.end());
  return s;
}

// acc[n, m, o...] = sum over c in m's group and kernel taps of x_shifted * w_shifted.
// `emit(flat_output_index, m, acc)`.
template <typename Emit>
void IntegerConv(const ConvGeom& g, const std::vector<int32_t>& x, const std::vector<int32_t>& w,
                 Emit emit) {
  const size_t sr = g.in.size();
  const int64_t in_plane = NumElements(g.in), k_plane = NumElements(g.kernel);
  const int64_t out_plane = NumElements(g.out);
  const int64_t cg = g.C / g.group, mg = g.M / g.group;
  std::vector<int64_t> o(sr), k(sr);
  for (int64_t n = 0; n < g.N; ++n) {
    for (int64_t m = 0; m < g.M; ++m) {
      const int64_t c0 = (m / mg) * cg;
      for (int64_t op = 0; op < out_plane; ++op) {
        for (int64_t r = op, d = static_cast<int64_t>(sr) - 1; d >= 0; --d) {
          o[static_cast<size_t>(d)] = r % g.out[static_cast<size_t>(d)];
          r /= g.out[static_cast<size_t>(d)];
        }
        int64_t acc = 0;
        for (int64_t kp = 0; kp < k_plane; ++kp) {
          int64_t in_off = 0;
          bool inside = true;
          for (int64_t r = kp, d = static_cast<int64_t>(sr) - 1; d >= 0; --d) {
            const size_t u = static_cast<size_t>(d);
            k[u] = r % g.kernel[u];
            r /= g.kernel[u];
          }
          for (size_t d = 0; d < sr; ++d) {
            const int64_t at = o[d] * g.strides[d] - g.pad_begin[d] + k[d] * g.dilations[d];
            if (at < 0 || at >= g.in[d]) {
              inside = false;
              break;
            }
            in_off = in_off * g.in[d] + at;
          }
          if (!inside) continue;
          for (int64_t c = 0; c < cg; ++c) {
            const int64_t xi = (n * g.C + c0 + c) * in_plane + in_off;
            const int64_t wi = (m * cg + c) * k_plane + kp;
            acc += static_cast<int64_t>(x[static_cast<size_t>(xi)]) * w[static_cast<size_t>(wi)];
          }
        }
        emit((n * g.M + m) * out_plane + op, m, static_cast<int32_t>(acc));
      }
    }
  }
}

// x minus its per-tensor zero point, w minus its per-output-channel zero point, as int32.
void ShiftConvOperands(const ConvGeom& g, const Tensor& xt, const Param& xz, const Tensor& wt,
                       const Param& wz, std::vector<int32_t>* x, std::vector<int32_t>* w) {
  *x = ToInt32(xt);
  const int32_t zx = xz.i(0, 0);
  for (int32_t& v : *x) v -= zx;
  *w = ToInt32(wt);
  const int64_t per_m = g.M == 0 ? 0 : wt.numel() / g.M;
  for (int64_t m = 0; m < g.M; ++m) {
    const int32_t z = wz.i(0, m);
    for (int64_t j = 0; j < per_m; ++j) (*w)[static_cast<size_t>(m * per_m + j)] -= z;
  }
}

Status CheckConvInteger(const Node& node, int64_t /*opset*/) {
  KILN_RETURN_IF_ERROR(CheckArity(node, 2, 4));
  return CheckConvAttrs(node);
}

Result<std::vector<TensorType>> InferConvInteger(const OpContext& ctx) {
  KILN_RETURN_IF_ERROR(Require8Bit(ctx, 0, "x"));
  KILN_RETURN_IF_ERROR(Require8Bit(ctx, 1, "w"));
  KILN_RETURN_IF_ERROR(RequireZeroPointDType(ctx, 2, "x_zero_point", ctx.type(0).dtype));
  KILN_RETURN_IF_ERROR(RequireZeroPointDType(ctx, 3, "w_zero_point", ctx.type(1).dtype));
  KILN_ASSIGN_OR_RETURN(ConvGeom g, ReadConvGeom(ctx, 0, 1));
  KILN_RETURN_IF_ERROR(ScalarOrVector(ctx, 2, "x_zero_point", 1, "per tensor").status());
  KILN_RETURN_IF_ERROR(ScalarOrVector(ctx, 3, "w_zero_point", g.M, "per output channel").status());
  return std::vector<TensorType>{{DType::kInt32, ConvOutShape(g)}};
}

Status RunConvInteger(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_ASSIGN_OR_RETURN(ConvGeom g, ReadConvGeom(ctx, 0, 1));
  KILN_ASSIGN_OR_RETURN(Param xz, ScalarOrVector(ctx, 2, "x_zero_point", 1, "per tensor"));
  KILN_ASSIGN_OR_RETURN(Param wz, ScalarOrVector(ctx, 3, "w_zero_point", g.M, "per channel"));
  std::vector<int32_t> x, w;
  ShiftConvOperands(g, ctx.in(0), xz, ctx.in(1), wz, &x, &w);
  int32_t* y = outputs[0].data<int32_t>();
  IntegerConv(g, x, w, [&](int64_t at, int64_t, int32_t acc) { y[at] = acc; });
  return Status::OK();
}

// QLinearConv inputs: x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale,
// y_zero_point, B (optional int32 bias, already in the accumulator's scale x_scale * w_scale).
Status CheckQLinearConv(const Node& node, int64_t /*opset*/) {
  KILN_RETURN_IF_ERROR(CheckArity(node, 8, 9));
  return CheckConvAttrs(node);
}

struct QLinearConvParams {
  ConvGeom g;
  Param xs, xz, ws, wz, ys, yz, bias;
};

Result<QLinearConvParams> ReadQLinearConv(const OpContext& ctx) {
  QLinearConvParams p;
  KILN_ASSIGN_OR_RETURN(p.g, ReadConvGeom(ctx, 0, 3));
  const int64_t M = p.g.M;
  KILN_ASSIGN_OR_RETURN(p.xs, ScalarOrVector(ctx, 1, "x_scale", 1, "per tensor"));
  KILN_ASSIGN_OR_RETURN(p.xz, ScalarOrVector(ctx, 2, "x_zero_point", 1, "per tensor"));
  KILN_ASSIGN_OR_RETURN(p.ws, ScalarOrVector(ctx, 4, "w_scale", M, "per output channel"));
  KILN_ASSIGN_OR_RETURN(p.wz, ScalarOrVector(ctx, 5, "w_zero_point", M, "per output channel"));
  KILN_ASSIGN_OR_RETURN(p.ys, ScalarOrVector(ctx, 6, "y_scale", 1, "per tensor"));
  KILN_ASSIGN_OR_RETURN(p.yz, ScalarOrVector(ctx, 7, "y_zero_point", 1, "per tensor"));
  if (ctx.present(8)) {
    const Shape& s = ctx.type(8).shape;
    if (s.size() != 1 || s[0] != M) {
      return Status::InvalidArgument(ctx.where() + ": " + InputName(8, "B") + " has shape " +
                                     ShapeToString(s) + ", expected [" + std::to_string(M) +
                                     "] (one per output channel)");
    }
    p.bias = Param{Param::Form::kVector, ctx.value(8), M};
  }
  return p;
}

Result<std::vector<TensorType>> InferQLinearConv(const OpContext& ctx) {
  KILN_RETURN_IF_ERROR(Require8Bit(ctx, 0, "x"));
  KILN_RETURN_IF_ERROR(Require8Bit(ctx, 3, "w"));
  KILN_RETURN_IF_ERROR(Require8Bit(ctx, 7, "y_zero_point"));
  KILN_RETURN_IF_ERROR(RequireScaleF32(ctx, 1, "x_scale"));
  KILN_RETURN_IF_ERROR(RequireScaleF32(ctx, 4, "w_scale"));
  KILN_RETURN_IF_ERROR(RequireScaleF32(ctx, 6, "y_scale"));
  KILN_RETURN_IF_ERROR(RequireZeroPointDType(ctx, 2, "x_zero_point", ctx.type(0).dtype));
  KILN_RETURN_IF_ERROR(RequireZeroPointDType(ctx, 5, "w_zero_point", ctx.type(3).dtype));
  if (ctx.present(8)) {
    KILN_RETURN_IF_ERROR(RequireDType(ctx, 8, "B", ctx.type(8).dtype == DType::kInt32, "int32"));
  }
  KILN_ASSIGN_OR_RETURN(QLinearConvParams p, ReadQLinearConv(ctx));
  return std::vector<TensorType>{{ctx.type(7).dtype, ConvOutShape(p.g)}};
}

Status RunQLinearConv(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_ASSIGN_OR_RETURN(QLinearConvParams p, ReadQLinearConv(ctx));
  std::vector<int32_t> x, w;
  ShiftConvOperands(p.g, ctx.in(0), p.xz, ctx.in(3), p.wz, &x, &w);
  Tensor& y = outputs[0];
  int32_t lo = 0, hi = 0;
  RangeOf(y.dtype(), &lo, &hi);
  const float xs = p.xs.f(0, 0), ys = p.ys.f(0, 0);
  const int32_t yz = p.yz.i(0, 0);
  IntegerConv(p.g, x, w, [&](int64_t at, int64_t m, int32_t acc) {
    const float multiplier = xs * p.ws.f(0, m) / ys;
    const int32_t biased = acc + p.bias.i(0, m);
    Store8(y, at, Requantize(static_cast<float>(biased) * multiplier, yz, lo, hi));
  });
  return Status::OK();
}

inline constexpr size_t kQuantOpCount = 6;

}  // namespace

std::vector<OpDef> QuantOpDefs() {
  // One row per op; the opset 13 per-axis forms of the QDQ pair are read by opset in the kernels.
  const std::array<OpDef, kQuantOpCount> table = {{
      {"QuantizeLinear", "", 10, INT64_MAX, CheckQuantize, InferQuantize, RunQuantize},
      {"DequantizeLinear", "", 10, INT64_MAX, CheckDequantize, InferDequantize, RunDequantize},
      {"MatMulInteger", "", 10, INT64_MAX, CheckMatMulInteger, InferMatMulInteger,
       RunMatMulInteger},
      {"QLinearMatMul", "", 10, INT64_MAX, CheckQLinearMatMul, InferQLinearMatMul,
       RunQLinearMatMul},
      {"ConvInteger", "", 10, INT64_MAX, CheckConvInteger, InferConvInteger, RunConvInteger},
      {"QLinearConv", "", 10, INT64_MAX, CheckQLinearConv, InferQLinearConv, RunQLinearConv},
  }};
  return {table.begin(), table.end()};
}

}  // namespace kiln
