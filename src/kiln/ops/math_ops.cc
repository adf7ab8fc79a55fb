// Math op family (ops layer): the inverse and hyperbolic trigonometric functions and Tan,
// IsInf and IsNaN, BitShift, and Det, each with its reference kernel.
//
// MathOpDefs is registered by OpRegistry::Global() (registry.cc). The float functions take
// float32, float64, float16 and bfloat16 and compute in double, rounding once to the input's
// type (kernel_util.h). None of them fuses into a compiled loop nest: a cell runs them through
// the host's reference kernel, so eager and compiled agree bit for bit.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "src/kiln/ops/kernel_util.h"
#include "src/kiln/ops/registry.h"

namespace kiln {
namespace {

using kernel::StoreDoubles;
using kernel::ToDoubles;

Status CheckUnary(const Node& node, int64_t) { return CheckArity(node, 1, 1); }

// ---------------------------------------------------------------------------------------------
// Unary float functions

Result<std::vector<TensorType>> InferFloatUnary(const OpContext& ctx) {
  KILN_ASSIGN_OR_RETURN(std::vector<TensorType> out, InferSameAsInput0(ctx));
  KILN_RETURN_IF_ERROR(kernel::RequireFloatInput(ctx, 0));
  return out;
}

template <double (*Fn)(double)>
Status RunFloatUnary(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_RETURN_IF_ERROR(kernel::RequireFloatInput(ctx, 0));
  std::vector<double> v = ToDoubles(ctx.in(0));
  for (double& x : v) x = Fn(x);
  return StoreDoubles(v, outputs[0]);
}

double Acos(double x) { return std::acos(x); }
double Acosh(double x) { return std::acosh(x); }
double Asin(double x) { return std::asin(x); }
double Asinh(double x) { return std::asinh(x); }
double Atan(double x) { return std::atan(x); }
double Atanh(double x) { return std::atanh(x); }
double Cosh(double x) { return std::cosh(x); }
double Sinh(double x) { return std::sinh(x); }
double Tan(double x) { return std::tan(x); }

// ---------------------------------------------------------------------------------------------
// IsInf (opset 10+): attributes detect_negative and detect_positive (default 1 each); IsNaN.

Status CheckIsInf(const Node& node, int64_t) {
  KILN_RETURN_IF_ERROR(CheckArity(node, 1, 1));
  for (const char* attr : {"detect_negative", "detect_positive"}) {
    KILN_ASSIGN_OR_RETURN(int64_t v, kernel::IntOr(node, attr, 1));
    if (v != 0 && v != 1) return kernel::BadAttr(node, attr, std::to_string(v), "0 or 1");
  }
  return Status::OK();
}

Result<std::vector<TensorType>> InferFloatPredicate(const OpContext& ctx) {
  KILN_RETURN_IF_ERROR(kernel::RequireFloatInput(ctx, 0));
  return std::vector<TensorType>{{DType::kBool, ctx.type(0).shape}};
}

Status RunIsInf(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_RETURN_IF_ERROR(kernel::RequireFloatInput(ctx, 0));
  const bool neg = ctx.node().GetInt("detect_negative", 1) != 0;
  const bool pos = ctx.node().GetInt("detect_positive", 1) != 0;
  const std::vector<double> v = ToDoubles(ctx.in(0));
  uint8_t* o = outputs[0].data<uint8_t>();
  for (size_t i = 0; i < v.size(); ++i) {
    o[i] = std::isinf(v[i]) && ((v[i] > 0 && pos) || (v[i] < 0 && neg)) ? 1 : 0;
  }
  return Status::OK();
}

Status RunIsNaN(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_RETURN_IF_ERROR(kernel::RequireFloatInput(ctx, 0));
  const std::vector<double> v = ToDoubles(ctx.in(0));
  uint8_t* o = outputs[0].data<uint8_t>();
  for (size_t i = 0; i < v.size(); ++i) o[i] = std::isnan(v[i]) ? 1 : 0;
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------
// BitShift (opset 11+): unsigned integers, numpy broadcasting, attribute direction LEFT or
// RIGHT. A shift by the type's width or more gives 0 (numpy's result; C++ leaves it undefined).

Status CheckBitShift(const Node& node, int64_t) {
  KILN_RETURN_IF_ERROR(CheckArity(node, 2, 2));
  KILN_ASSIGN_OR_RETURN(std::string dir, node.GetString("direction"));
  if (dir != "LEFT" && dir != "RIGHT") {
    return kernel::BadAttr(node, "direction", "'" + dir + "'", "'LEFT' or 'RIGHT'");
  }
  return Status::OK();
}

bool IsUnsigned(DType t) {
  return t == DType::kUInt8 || t == DType::kUInt16 || t == DType::kUInt32 || t == DType::kUInt64;
}

Result<std::vector<TensorType>> InferBitShift(const OpContext& ctx) {
  KILN_ASSIGN_OR_RETURN(std::vector<TensorType> out, InferBroadcast(ctx));
  if (!IsUnsigned(out[0].dtype)) {
    return UnsupportedDType(ctx, out[0].dtype, "uint8, uint16, uint32, uint64");
  }
  return out;
}

template <typename T>
void ShiftLoop(const OpContext& ctx, bool left, Tensor& out) {
  const Tensor& x = ctx.in(0);
  const Tensor& s = ctx.in(1);
  const std::vector<int64_t> ox = kernel::BroadcastOffsets(x.shape(), out.shape());
  const std::vector<int64_t> os = kernel::BroadcastOffsets(s.shape(), out.shape());
  const T* px = x.data<T>();
  const T* ps = s.data<T>();
  T* po = out.data<T>();
  constexpr uint64_t kBits = sizeof(T) * 8;
  for (size_t i = 0; i < ox.size(); ++i) {
    const T v = px[ox[i]];
    const uint64_t n = static_cast<uint64_t>(ps[os[i]]);
    po[i] = n >= kBits ? T(0) : static_cast<T>(left ? v << n : v >> n);
  }
}

Status RunBitShift(const OpContext& ctx, std::vector<Tensor>& outputs) {
  const bool left = ctx.node().GetString("direction", "") == "LEFT";
  switch (ctx.in(0).dtype()) {
    case DType::kUInt8:
      ShiftLoop<uint8_t>(ctx, left, outputs[0]);
      break;
    case DType::kUInt16:
      ShiftLoop<uint16_t>(ctx, left, outputs[0]);
      break;
    case DType::kUInt32:
      ShiftLoop<uint32_t>(ctx, left, outputs[0]);
      break;
    case DType::kUInt64:
      ShiftLoop<uint64_t>(ctx, left, outputs[0]);
      break;
    default:
      return InferBitShift(ctx).status();
  }
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------
// Det (opset 11+): X [*, M, M] -> [*], by LU decomposition with partial pivoting in double.

Result<std::vector<TensorType>> InferDet(const OpContext& ctx) {
  KILN_RETURN_IF_ERROR(kernel::RequireFloatInput(ctx, 0));
  const Shape& s = ctx.type(0).shape;
  if (s.size() < 2 || s[s.size() - 1] != s[s.size() - 2]) {
    return kernel::BadInputShape(ctx, 0, "X", "[*, M, M] (square matrices in the last two dims)");
  }
  return std::vector<TensorType>{{ctx.type(0).dtype, Shape(s.begin(), s.end() - 2)}};
}

double Determinant(std::vector<double> a, int64_t m) {
  double det = 1.0;
  for (int64_t c = 0; c < m; ++c) {
    int64_t pivot = c;
    for (int64_t r = c + 1; r < m; ++r) {
      if (std::fabs(a[r * m + c]) > std::fabs(a[pivot * m + c])) pivot = r;
    }
    if (a[pivot * m + c] == 0.0) return 0.0;
    if (pivot != c) {
      for (int64_t k = 0; k < m; ++k) std::swap(a[c * m + k], a[pivot * m + k]);
      det = -det;
    }
    const double d = a[c * m + c];
    det *= d;
    for (int64_t r = c + 1; r < m; ++r) {
      const double f = a[r * m + c] / d;
      for (int64_t k = c; k < m; ++k) a[r * m + k] -= f * a[c * m + k];
    }
  }
  return det;
}

Status RunDet(const OpContext& ctx, std::vector<Tensor>& outputs) {
  const Tensor& x = ctx.in(0);
  const int64_t m = x.dim(x.rank() - 1);
  const std::vector<double> v = ToDoubles(x);
  const int64_t batch = outputs[0].numel();
  std::vector<double> out(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    out[static_cast<size_t>(b)] =
        Determinant(std::vector<double>(v.begin() + b * m * m, v.begin() + (b + 1) * m * m), m);
  }
  return StoreDoubles(out, outputs[0]);
}

}  // namespace

std::vector<OpDef> MathOpDefs() {
  constexpr int64_t kMax = INT64_MAX;
  return {
      {"Acos", "", 7, kMax, CheckUnary, InferFloatUnary, RunFloatUnary<Acos>},
      {"Acosh", "", 9, kMax, CheckUnary, InferFloatUnary, RunFloatUnary<Acosh>},
      {"Asin", "", 7, kMax, CheckUnary, InferFloatUnary, RunFloatUnary<Asin>},
      {"Asinh", "", 9, kMax, CheckUnary, InferFloatUnary, RunFloatUnary<Asinh>},
      {"Atan", "", 7, kMax, CheckUnary, InferFloatUnary, RunFloatUnary<Atan>},
      {"Atanh", "", 9, kMax, CheckUnary, InferFloatUnary, RunFloatUnary<Atanh>},
      {"Cosh", "", 9, kMax, CheckUnary, InferFloatUnary, RunFloatUnary<Cosh>},
      {"Sinh", "", 9, kMax, CheckUnary, InferFloatUnary, RunFloatUnary<Sinh>},
      {"Tan", "", 7, kMax, CheckUnary, InferFloatUnary, RunFloatUnary<Tan>},
      {"IsInf", "", 10, kMax, CheckIsInf, InferFloatPredicate, RunIsInf},
      {"IsNaN", "", 9, kMax, CheckUnary, InferFloatPredicate, RunIsNaN},
      {"BitShift", "", 11, kMax, CheckBitShift, InferBitShift, RunBitShift},
      {"Det", "", 11, kMax, CheckUnary, InferDet, RunDet},
  };
}

}  // namespace kiln
