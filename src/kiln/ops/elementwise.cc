// Elementwise op family (ops layer): unary math and activations, broadcasting binary arithmetic,
// comparisons and logic, Where, Clip and Cast, each with its reference kernel.
//
// ElementwiseOpDefs is registered by OpRegistry::Global() (registry.cc); the same rows say which
// ops a compiled cell may fuse (FusableElementwiseOps, elementwise.h). The kernels are the
// oracle that compiled cells are checked against, so they are plain loops over dense row-major
// tensors. The only tricks are fast paths for the common cases (same shape, one scalar operand)
// and numpy broadcasting through strides (ForEachBroadcast) for the rest.
//
// Dtypes: float32 everywhere. The ops shape computations use (Add Sub Mul Div Pow Mod Min Max Sum
// Neg Abs Sign Relu PRelu Clip) also take int64, int32 and float64 (Min Max Mod every integer
// width, int8 to uint64; Mod float16 too; Pow's exponent any numeric type);
// Equal, Less, Greater, ... and Where
// take any dtype; And, Or, Xor and Not take bool; Cast converts between all kiln dtypes. Anything
// else is UnsupportedDType naming the op and dtype, reported by infer (so the verifier sees it) and
// again by run. Integer arithmetic wraps like two's complement instead of being undefined, and
// integer division by zero is an InvalidArgument error, never a trap.
#include "src/kiln/ops/elementwise.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "src/kiln/ops/kernel_util.h"
#include "src/kiln/ops/registry.h"

namespace kiln {
namespace {

// ---------------------------------------------------------------------------------------------
// Dtype dispatch

// A list of element types an op accepts. `bool` stands for kiln's one-byte bool (stored as
// uint8_t 0/1); float16 has no arithmetic type here, so ops that accept it convert it first.
template <typename... Ts>
struct Types {};
using ArithTypes = Types<float, int64_t, int32_t, double>;
// Add/Sub/Mul/Div/Min/Max and Clip also take the 8-bit integers (wrapping, like numpy).
using ArithTypes8 = Types<float, int64_t, int32_t, int8_t, uint8_t, double>;
// Min, Max and Mod also take the byte-wide integers quantized models carry, and every other
// integer width ONNX lists for them.
using MinMaxTypes =
    Types<float, int64_t, int32_t, int8_t, uint8_t, double, int16_t, uint16_t, uint32_t, uint64_t>;
using SignedTypes = Types<float, int64_t, int32_t, int8_t, double>;
using AllButHalf = Types<float, int64_t, int32_t, int8_t, uint8_t, bool, double, int16_t, uint16_t,
                         uint32_t, uint64_t>;
// Pow's exponent (T1) may be any numeric type; it is converted to the base's type.
using PowExponentTypes =
    Types<float, int64_t, int32_t, double, int16_t, int8_t, uint8_t, uint16_t, uint32_t, uint64_t>;
using BoolTypes = Types<bool>;
using FloatTypes = Types<float>;

template <typename T>
struct Elem {
  using type = T;
  static constexpr DType dtype = DTypeOf<T>::value;
};
template <>
struct Elem<bool> {
  using type = uint8_t;
  static constexpr DType dtype = DType::kBool;
};

// "float32, int64, int32" for error messages.
template <typename... Ts>
std::string TypeNames(Types<Ts...>) {
  std::string s;
  ((s += (s.empty() ? "" : ", ") + std::string(DTypeName(Elem<Ts>::dtype))), ...);
  return s;
}

template <typename... Ts>
bool Accepts(Types<Ts...>, DType dtype) {
  return ((Elem<Ts>::dtype == dtype) || ...);
}

template <typename List>
Status RequireDType(const OpContext& ctx, DType dtype, List list) {
  if (Accepts(list, dtype)) return Status::OK();
  return UnsupportedDType(ctx, dtype, TypeNames(list).c_str());
}

// Calls fn.template operator()<E>() with E the storage type of `dtype`, when `dtype` is in the
// list; otherwise returns UnsupportedDType naming the op, the dtype and the list.
template <typename Fn, typename... Ts>
Status Dispatch(const OpContext& ctx, DType dtype, Types<Ts...> list, Fn&& fn) {
  Status result;
  bool matched = false;
  auto try_one = [&]<typename T>() {
    if (matched || Elem<T>::dtype != dtype) return;
    matched = true;
    result = fn.template operator()<typename Elem<T>::type>();
  };
  (try_one.template operator()<Ts>(), ...);
  if (!matched) return UnsupportedDType(ctx, dtype, TypeNames(list).c_str());
  return result;
}

// Two's-complement arithmetic for integers (signed overflow is undefined in C++); plain for
// floats.
template <typename T>
T WrapAdd(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return a + b;
  }
}
template <typename T>
T WrapSub(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) - static_cast<U>(b));
  } else {
    return a - b;
  }
}
template <typename T>
T WrapMul(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
  } else {
    return a * b;
  }
}
template <typename T>
T WrapNeg(T a) {
  return WrapSub(T(0), a);
}

// ---------------------------------------------------------------------------------------------
// Broadcast iteration

// Calls f(out_index, offsets) for every element of `out_shape` in row-major order, where
// offsets[k] is the element offset of the matching element of input k, whose shape
// in_shapes[k] broadcasts to out_shape. Offsets advance by broadcast strides (0 on broadcast
// dims), so the cost per element is K adds; the odometer over outer dims runs once per row.
template <size_t K, typename F>
void ForEachBroadcast(const Shape& out_shape, const std::array<Shape, K>& in_shapes, F&& f) {
  const int64_t n = NumElements(out_shape);
  if (n == 0) return;
  const size_t rank = out_shape.size();
  if (rank == 0) {
    f(int64_t{0}, std::array<int64_t, K>{});
    return;
  }
  std::array<std::vector<int64_t>, K> strides;
  std::array<int64_t, K> inner_stride;
  for (size_t k = 0; k < K; ++k) {
    strides[k] = BroadcastStrides(in_shapes[k], out_shape);
    inner_stride[k] = strides[k][rank - 1];
  }
  const int64_t inner = out_shape[rank - 1];
  std::vector<int64_t> index(rank, 0);
  std::array<int64_t, K> row{};  // offsets of the first element of the current row
  for (int64_t o = 0; o < n; o += inner) {
    std::array<int64_t, K> off = row;
    for (int64_t j = 0; j < inner; ++j) {
      f(o + j, off);
      for (size_t k = 0; k < K; ++k) off[k] += inner_stride[k];
    }
    for (size_t d = rank - 1; d-- > 0;) {
      for (size_t k = 0; k < K; ++k) row[k] += strides[k][d];
      if (++index[d] < out_shape[d]) break;
      for (size_t k = 0; k < K; ++k) row[k] -= strides[k][d] * out_shape[d];
      index[d] = 0;
    }
  }
}

// out[i] = fn(a[i'], b[i'']) with numpy broadcasting. `out` may alias `a` when a has the output
// shape (each element is read before it is written).
template <typename T, typename R, typename Fn>
void BinaryKernel(const Tensor& a, const Tensor& b, Tensor& out, Fn fn) {
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  R* po = out.data<R>();
  const int64_t n = out.numel();
  // A same-numel operand has the output's row-major layout (its dims are 1 or the output's).
  if (a.numel() == n && b.numel() == n) {
    for (int64_t i = 0; i < n; ++i) po[i] = fn(pa[i], pb[i]);
  } else if (a.numel() == n && b.numel() == 1) {
    const T s = pb[0];
    for (int64_t i = 0; i < n; ++i) po[i] = fn(pa[i], s);
  } else if (a.numel() == 1 && b.numel() == n) {
    const T s = pa[0];
    for (int64_t i = 0; i < n; ++i) po[i] = fn(s, pb[i]);
  } else {
    ForEachBroadcast<2>(
        out.shape(), {a.shape(), b.shape()},
        [&](int64_t i, const std::array<int64_t, 2>& off) { po[i] = fn(pa[off[0]], pb[off[1]]); });
  }
}

template <typename T, typename R, typename Fn>
void UnaryKernel(const Tensor& x, Tensor& out, Fn fn) {
  const T* px = x.data<T>();
  R* po = out.data<R>();
  const int64_t n = out.numel();
  for (int64_t i = 0; i < n; ++i) po[i] = fn(px[i]);
}

// ---------------------------------------------------------------------------------------------
// Checks

Status RequireFloatAttr(const Node& node, const char* attr) {
  if (!node.HasAttr(attr)) return Status::OK();
  return node.GetFloat(attr).status();
}

Status CheckUnary(const Node& node, int64_t) { return CheckArity(node, 1, 1); }
Status CheckBinary(const Node& node, int64_t) { return CheckArity(node, 2, 2); }
Status CheckVariadic(const Node& node, int64_t) {
  return CheckArity(node, 1, std::numeric_limits<size_t>::max());
}
Status CheckWhere(const Node& node, int64_t) { return CheckArity(node, 3, 3); }

// Unary ops with float attributes (LeakyRelu, HardSigmoid, Elu, Selu, Celu, Shrink, ...): each
// present one must be a float. Op names them (see the unary ops below).
template <typename Op>
Status CheckFloatAttrs(const Node& node, int64_t) {
  KILN_RETURN_IF_ERROR(CheckArity(node, 1, 1));
  KILN_RETURN_IF_ERROR(RequireFloatAttr(node, Op::kAlphaName));
  return RequireFloatAttr(node, Op::kBetaName);
}

// Celu divides by alpha.
template <typename Op>
Status CheckNonZeroAlpha(const Node& node, int64_t opset) {
  KILN_RETURN_IF_ERROR(CheckFloatAttrs<Op>(node, opset));
  const float alpha = node.GetFloat(Op::kAlphaName, Op::kAlpha);
  if (alpha == 0.0f) {
    return Status::InvalidArgument(node.Describe() + ": attribute '" + Op::kAlphaName +
                                   "'=0 is invalid (it divides the input; expected non-zero)");
  }
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------
// Shapes of binary operands, with the pre-opset-7 broadcast form

// The shape input i is read as. Before opset 7 binary ops broadcast only under attribute
// broadcast=1, and then B lines up with A starting at dim `axis` (when given) rather than at the
// right: A [2,3,4,5] with B [3,4] and axis=1 reads B as [3,4,1]. Later opsets use numpy rules.
Result<Shape> OperandShape(const OpContext& ctx, size_t i) {
  const Shape& shape = ctx.type(i).shape;
  const Node& node = ctx.node();
  if (i != 1 || ctx.opset() >= 7 || node.GetInt("broadcast", 0) == 0 || !node.HasAttr("axis")) {
    return shape;
  }
  const Shape& a = ctx.type(0).shape;
  const int64_t rank_a = static_cast<int64_t>(a.size());
  const int64_t rank_b = static_cast<int64_t>(shape.size());
  KILN_ASSIGN_OR_RETURN(int64_t axis, node.GetInt("axis"));
  KILN_ASSIGN_OR_RETURN(int64_t norm,
                        NormalizeAxis(axis, rank_a, ctx.where() + ": attribute 'axis'"));
  if (norm + rank_b > rank_a) {
    return Status::InvalidArgument(
        ctx.where() + ": legacy broadcast attribute axis=" + std::to_string(axis) +
        " does not fit B " + ShapeToString(shape) + " inside A " + ShapeToString(a));
  }
  Shape padded = shape;
  padded.resize(static_cast<size_t>(rank_a - norm), 1);
  return padded;
}

// Input i as a tensor of OperandShape(ctx, i) (a reshaped view for the legacy form).
Result<Tensor> Operand(const OpContext& ctx, size_t i) {
  KILN_ASSIGN_OR_RETURN(Shape shape, OperandShape(ctx, i));
  if (shape == ctx.in(i).shape()) return ctx.in(i);
  return ctx.in(i).Reshaped(shape);
}

// Broadcast shape of all present operands; with `same_dtype`, every operand must have input 0's
// dtype.
Result<TensorType> BroadcastOperands(const OpContext& ctx, bool same_dtype) {
  if (!ctx.present(0)) return Status::InvalidArgument(ctx.where() + ": input 0 is absent");
  TensorType t = ctx.type(0);
  for (size_t i = 1; i < ctx.num_inputs(); ++i) {
    if (!ctx.present(i)) continue;
    if (same_dtype && ctx.type(i).dtype != t.dtype) {
      return Status::InvalidArgument(ctx.where() + ": input " + std::to_string(i) + " has dtype " +
                                     DTypeName(ctx.type(i).dtype) + ", expected " +
                                     DTypeName(t.dtype) + " like input 0");
    }
    KILN_ASSIGN_OR_RETURN(Shape shape, OperandShape(ctx, i));
    auto b = BroadcastShapes(t.shape, shape);
    if (!b.ok()) return b.status().WithContext(ctx.where());
    t.shape = *b;
  }
  return t;
}

// ---------------------------------------------------------------------------------------------
// Unary ops

// Unary float32 ops: Op::Apply(x, alpha, beta), where alpha and beta are the float attributes
// named Op::kAlphaName / kBetaName (Selu calls its second one gamma, Shrink has lambd and bias),
// defaulting to Op::kAlpha / kBeta.
struct AttrNames {
  static constexpr const char* kAlphaName = "alpha";
  static constexpr const char* kBetaName = "beta";
};
struct NoAttrs : AttrNames {
  static constexpr float kAlpha = 0.0f, kBeta = 0.0f;
};
struct SqrtOp : NoAttrs {
  static float Apply(float x, float, float) { return std::sqrt(x); }
};
struct ExpOp : NoAttrs {
  static float Apply(float x, float, float) { return std::exp(x); }
};
struct LogOp : NoAttrs {
  static float Apply(float x, float, float) { return std::log(x); }
};
struct ReciprocalOp : NoAttrs {
  static float Apply(float x, float, float) { return 1.0f / x; }
};
struct SigmoidOp : NoAttrs {
  // Split by sign so exp never overflows.
  static float Apply(float x, float, float) {
    if (x >= 0) return 1.0f / (1.0f + std::exp(-x));
    const float e = std::exp(x);
    return e / (1.0f + e);
  }
};
struct TanhOp : NoAttrs {
  static float Apply(float x, float, float) { return std::tanh(x); }
};
struct ErfOp : NoAttrs {
  static float Apply(float x, float, float) { return std::erf(x); }
};
struct SinOp : NoAttrs {
  static float Apply(float x, float, float) { return std::sin(x); }
};
struct CosOp : NoAttrs {
  static float Apply(float x, float, float) { return std::cos(x); }
};
struct FloorOp : NoAttrs {
  static float Apply(float x, float, float) { return std::floor(x); }
};
struct CeilOp : NoAttrs {
  static float Apply(float x, float, float) { return std::ceil(x); }
};
struct SoftplusOp : NoAttrs {
  // log(1 + exp(x)), written so that large |x| neither overflows nor loses the result.
  static float Apply(float x, float, float) {
    return x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x));
  }
};
struct HardSwishOp : NoAttrs {
  static float Apply(float x, float, float) {
    const float v = x / 6.0f + 0.5f;
    return x * (v < 0.0f ? 0.0f : (v > 1.0f ? 1.0f : v));
  }
};
struct LeakyReluOp : AttrNames {
  static constexpr float kAlpha = 0.01f, kBeta = 0.0f;
  static float Apply(float x, float alpha, float) { return x >= 0 ? x : alpha * x; }
};
struct HardSigmoidOp : AttrNames {
  static constexpr float kAlpha = 0.2f, kBeta = 0.5f;
  // Clamped by comparisons that are false for NaN, so NaN stays NaN (std::min/max would not).
  static float Apply(float x, float alpha, float beta) {
    const float v = alpha * x + beta;
    return v < 0.0f ? 0.0f : (v > 1.0f ? 1.0f : v);
  }
};
struct EluOp : AttrNames {
  static constexpr float kAlpha = 1.0f, kBeta = 0.0f;
  static float Apply(float x, float alpha, float) { return x >= 0 ? x : alpha * std::expm1(x); }
};
struct RoundOp : NoAttrs {
  // Halves go to the even neighbour (ONNX Round); nearbyint does that in the default rounding
  // mode, which kiln never changes.
  static float Apply(float x, float, float) { return std::nearbyint(x); }
};
struct SoftsignOp : NoAttrs {
  static float Apply(float x, float, float) { return x / (1.0f + std::fabs(x)); }
};
struct MishOp : NoAttrs {
  static float Apply(float x, float, float) {
    return x * std::tanh(SoftplusOp::Apply(x, 0.0f, 0.0f));
  }
};
struct SeluOp : AttrNames {
  static constexpr const char* kBetaName = "gamma";
  // The constants of the self-normalizing paper, as ONNX states them in float32.
  static constexpr float kAlpha = 1.67326319217681884765625f;
  static constexpr float kBeta = 1.05070102214813232421875f;
  static float Apply(float x, float alpha, float gamma) {
    return x > 0 ? gamma * x : gamma * alpha * std::expm1(x);
  }
};
struct CeluOp : AttrNames {
  static constexpr float kAlpha = 1.0f, kBeta = 0.0f;
  // max(0, x) + min(0, alpha * expm1(x / alpha)), written per sign so NaN stays NaN.
  static float Apply(float x, float alpha, float) {
    return x >= 0 ? x : alpha * std::expm1(x / alpha);
  }
};
struct ThresholdedReluOp : AttrNames {
  static constexpr float kAlpha = 1.0f, kBeta = 0.0f;
  static float Apply(float x, float alpha, float) { return x > alpha ? x : 0.0f; }
};
struct ShrinkOp {
  static constexpr const char* kAlphaName = "lambd";
  static constexpr const char* kBetaName = "bias";
  static constexpr float kAlpha = 0.5f, kBeta = 0.0f;
  static float Apply(float x, float lambd, float bias) {
    if (x < -lambd) return x + bias;
    if (x > lambd) return x - bias;
    return 0.0f;
  }
};

Result<std::vector<TensorType>> InferUnaryFloat(const OpContext& ctx) {
  KILN_ASSIGN_OR_RETURN(std::vector<TensorType> out, InferSameAsInput0(ctx));
  KILN_RETURN_IF_ERROR(RequireDType(ctx, out[0].dtype, FloatTypes{}));
  return out;
}

template <typename Op>
Status RunUnaryFloat(const OpContext& ctx, std::vector<Tensor>& outputs) {
  const Tensor& x = ctx.in(0);
  KILN_RETURN_IF_ERROR(RequireDType(ctx, x.dtype(), FloatTypes{}));
  const float alpha = ctx.node().GetFloat(Op::kAlphaName, Op::kAlpha);
  const float beta = ctx.node().GetFloat(Op::kBetaName, Op::kBeta);
  UnaryKernel<float, float>(x, outputs[0], [=](float v) { return Op::Apply(v, alpha, beta); });
  return Status::OK();
}

// Unary ops over signed numbers: Op::Apply<T>(x).
struct NegOp {
  template <typename T>
  static T Apply(T x) {
    return WrapNeg(x);
  }
};
struct AbsOp {
  template <typename T>
  static T Apply(T x) {
    if constexpr (std::is_integral_v<T>) {
      return x < 0 ? WrapNeg(x) : x;
    } else {
      return std::fabs(x);
    }
  }
};
struct SignOp {
  template <typename T>
  static T Apply(T x) {
    if constexpr (std::is_floating_point_v<T>) {
      if (std::isnan(x)) return x;
    }
    return static_cast<T>(x > 0 ? 1 : (x < 0 ? -1 : 0));
  }
};
struct ReluOp {
  template <typename T>
  static T Apply(T x) {
    return x > 0 ? x : (x < 0 ? T(0) : x);  // keeps NaN (neither branch) and -0
  }
};

Result<std::vector<TensorType>> InferUnarySigned(const OpContext& ctx) {
  KILN_ASSIGN_OR_RETURN(std::vector<TensorType> out, InferSameAsInput0(ctx));
  KILN_RETURN_IF_ERROR(RequireDType(ctx, out[0].dtype, SignedTypes{}));
  return out;
}

template <typename Op>
Status RunUnarySigned(const OpContext& ctx, std::vector<Tensor>& outputs) {
  const Tensor& x = ctx.in(0);
  return Dispatch(ctx, x.dtype(), SignedTypes{}, [&]<typename T>() {
    UnaryKernel<T, T>(x, outputs[0], [](T v) { return Op::template Apply<T>(v); });
    return Status::OK();
  });
}

Result<std::vector<TensorType>> InferNot(const OpContext& ctx) {
  KILN_ASSIGN_OR_RETURN(std::vector<TensorType> out, InferSameAsInput0(ctx));
  KILN_RETURN_IF_ERROR(RequireDType(ctx, out[0].dtype, BoolTypes{}));
  return out;
}

Status RunNot(const OpContext& ctx, std::vector<Tensor>& outputs) {
  const Tensor& x = ctx.in(0);
  KILN_RETURN_IF_ERROR(RequireDType(ctx, x.dtype(), BoolTypes{}));
  UnaryKernel<uint8_t, uint8_t>(x, outputs[0], [](uint8_t v) -> uint8_t { return v ? 0 : 1; });
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------
// Binary and variadic arithmetic

struct AddOp {
  template <typename T>
  static T Apply(T a, T b) {
    return WrapAdd(a, b);
  }
};
struct SubOp {
  template <typename T>
  static T Apply(T a, T b) {
    return WrapSub(a, b);
  }
};
struct MulOp {
  template <typename T>
  static T Apply(T a, T b) {
    return WrapMul(a, b);
  }
};
struct DivOp {
  // Integers truncate toward zero like C. b == 0 was refused before the loop; MIN / -1, which
  // traps on x86, wraps to MIN.
  template <typename T>
  static T Apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      if (b == -1) return WrapNeg(a);
    }
    return a / b;
  }
};
struct MinOp {
  // NaN propagates, as in numpy.minimum.
  template <typename T>
  static T Apply(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
      if (std::isnan(a)) return a;
    }
    return a < b ? a : b;
  }
};
struct MaxOp {
  template <typename T>
  static T Apply(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
      if (std::isnan(a)) return a;
    }
    return a > b ? a : b;
  }
};

template <typename List = ArithTypes8>
Result<std::vector<TensorType>> InferArith(const OpContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType t, BroadcastOperands(ctx, /*same_dtype=*/true));
  // float16 and bfloat16 run through float32 (RunArithHalf)
  if (t.dtype != DType::kFloat16 && t.dtype != DType::kBFloat16) {
    KILN_RETURN_IF_ERROR(RequireDType(ctx, t.dtype, List{}));
  }
  return std::vector<TensorType>{t};
}

// InvalidArgument when an integer divisor holds a zero.
template <typename T>
Status CheckNoZeroDivisor(const OpContext& ctx, const Tensor& b) {
  const T* p = b.data<T>();
  for (int64_t i = 0; i < b.numel(); ++i) {
    if (p[i] == 0) {
      return Status::InvalidArgument(ctx.where() + ": integer division by zero (input 1 'B' " +
                                     b.TypeString() + " holds 0 at element " + std::to_string(i) +
                                     ")");
    }
  }
  return Status::OK();
}

// float16 and bfloat16 operands: each result is computed in float32 and rounded once to the
// output's type, which for + - * / min max is the correctly rounded result.
template <typename Op>
Status RunArithHalf(const OpContext& ctx, Tensor& out) {
  auto fn = [](float a, float b) { return Op::template Apply<float>(a, b); };
  KILN_ASSIGN_OR_RETURN(Tensor acc, Tensor::Empty(DType::kFloat32, out.shape()));
  KILN_ASSIGN_OR_RETURN(Tensor a, ctx.in(0).CastTo(DType::kFloat32));
  BinaryKernel<float, float>(a, a, acc, [](float x, float) { return x; });
  for (size_t i = 1; i < ctx.num_inputs(); ++i) {
    KILN_ASSIGN_OR_RETURN(Tensor operand, Operand(ctx, i));
    KILN_ASSIGN_OR_RETURN(Tensor b, operand.CastTo(DType::kFloat32));
    BinaryKernel<float, float>(acc, b, acc, fn);
  }
  KILN_ASSIGN_OR_RETURN(Tensor half, acc.CastTo(out.dtype()));
  std::memcpy(out.raw_data(), half.raw_data(), out.nbytes());
  return Status::OK();
}

// out = in0 op in1 op in2 ... with broadcasting; one input is a copy (variadic Min/Max).
template <typename Op, typename List = ArithTypes8>
Status RunArith(const OpContext& ctx, std::vector<Tensor>& outputs) {
  Tensor& out = outputs[0];
  if (ctx.in(0).dtype() == DType::kFloat16 || ctx.in(0).dtype() == DType::kBFloat16) {
    return RunArithHalf<Op>(ctx, out);
  }
  return Dispatch(ctx, ctx.in(0).dtype(), List{}, [&]<typename T>() -> Status {
    auto fn = [](T a, T b) { return Op::template Apply<T>(a, b); };
    const Tensor& a = ctx.in(0);
    if (ctx.num_inputs() == 1) {
      std::memcpy(out.raw_data(), a.raw_data(), out.nbytes());
      return Status::OK();
    }
    KILN_ASSIGN_OR_RETURN(Tensor b, Operand(ctx, 1));
    if constexpr (std::is_same_v<Op, DivOp> && std::is_integral_v<T>) {
      KILN_RETURN_IF_ERROR(CheckNoZeroDivisor<T>(ctx, b));
    }
    if (ctx.num_inputs() == 2) {
      BinaryKernel<T, T>(a, b, out, fn);
      return Status::OK();
    }
    // Three or more inputs: expand input 0 to the output shape, then fold the rest in place.
    BinaryKernel<T, T>(a, a, out, [](T x, T) { return x; });
    for (size_t i = 1; i < ctx.num_inputs(); ++i) BinaryKernel<T, T>(out, ctx.in(i), out, fn);
    return Status::OK();
  });
}

// Pow: the exponent may have another dtype than the base (opset 12+); the output has the base's.
// Integer bases need an integer exponent.
Result<std::vector<TensorType>> InferPow(const OpContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType t, BroadcastOperands(ctx, /*same_dtype=*/false));
  KILN_RETURN_IF_ERROR(RequireDType(ctx, ctx.type(0).dtype, ArithTypes{}));
  KILN_RETURN_IF_ERROR(RequireDType(ctx, ctx.type(1).dtype, PowExponentTypes{}));
  return std::vector<TensorType>{t};
}

// Integer power by squaring, wrapping on overflow. A negative exponent truncates 1/b^-e toward
// zero (so 0 unless |b| == 1; 0^-e is defined as 0 rather than trapping).
template <typename T>
T IntPow(T base, T exp) {
  if (exp < 0) {
    if (base == 1) return 1;
    if (base == -1) return (exp % 2 == 0) ? 1 : -1;
    return 0;
  }
  T result = 1;
  while (exp > 0) {
    if (exp & 1) result = WrapMul(result, base);
    base = WrapMul(base, base);
    exp >>= 1;
  }
  return result;
}

// double -> integer without undefined behaviour: NaN is 0, out-of-range values saturate.
template <typename T>
T SaturatingCast(double v) {
  if (std::isnan(v)) return 0;
  if (v <= static_cast<double>(std::numeric_limits<T>::lowest())) {
    return std::numeric_limits<T>::lowest();
  }
  if (v >= static_cast<double>(std::numeric_limits<T>::max())) {
    return std::numeric_limits<T>::max();
  }
  return static_cast<T>(v);
}

Status RunPow(const OpContext& ctx, std::vector<Tensor>& outputs) {
  Tensor& out = outputs[0];
  const Tensor& base = ctx.in(0);
  KILN_ASSIGN_OR_RETURN(Tensor exponent, Operand(ctx, 1));
  KILN_RETURN_IF_ERROR(RequireDType(ctx, exponent.dtype(), PowExponentTypes{}));
  return Dispatch(ctx, base.dtype(), ArithTypes{}, [&]<typename T>() -> Status {
    if constexpr (std::is_integral_v<T>) {
      if (IsFloatDType(exponent.dtype())) {
        // Integer base, float exponent: computed in double and truncated, like numpy's
        // power(int, float).astype(int); out-of-range results saturate and NaN becomes 0.
        KILN_ASSIGN_OR_RETURN(Tensor wide, exponent.CastTo(DType::kFloat64));
        const T* pb = base.data<T>();
        const double* pe = wide.data<double>();
        T* po = out.data<T>();
        ForEachBroadcast<2>(out.shape(), {base.shape(), exponent.shape()},
                            [&](int64_t i, const std::array<int64_t, 2>& off) {
                              const double v =
                                  std::pow(static_cast<double>(pb[off[0]]), pe[off[1]]);
                              po[i] = SaturatingCast<T>(v);
                            });
        return Status::OK();
      }
    }
    if (exponent.dtype() != base.dtype()) {
      KILN_ASSIGN_OR_RETURN(exponent, exponent.CastTo(base.dtype()));
    }
    if constexpr (std::is_floating_point_v<T>) {
      // Fast paths for x^2 and x^0.5, decided here from the value at run time (the exponent
      // may be a graph input). A single-element exponent leaves the base's layout unchanged.
      if (exponent.numel() == 1 && base.numel() == out.numel()) {
        const T e = exponent.data<T>()[0];
        if (e == T(2)) {
          UnaryKernel<T, T>(base, out, [](T x) { return x * x; });
          return Status::OK();
        }
        if (e == T(0.5)) {  // as pow (and numpy): (-inf)^0.5 is +inf, where sqrt gives NaN
          UnaryKernel<T, T>(base, out, [](T x) {
            return x == -std::numeric_limits<T>::infinity() ? std::numeric_limits<T>::infinity()
                                                            : std::sqrt(x);
          });
          return Status::OK();
        }
      }
      BinaryKernel<T, T>(base, exponent, out, [](T x, T e) { return std::pow(x, e); });
    } else {
      BinaryKernel<T, T>(base, exponent, out, [](T x, T e) { return IntPow(x, e); });
    }
    return Status::OK();
  });
}

// ---------------------------------------------------------------------------------------------
// Mean: variadic Sum divided by the input count (float32 only, as ONNX).

Result<std::vector<TensorType>> InferMean(const OpContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType t, BroadcastOperands(ctx, /*same_dtype=*/true));
  KILN_RETURN_IF_ERROR(RequireDType(ctx, t.dtype, FloatTypes{}));
  return std::vector<TensorType>{t};
}

Status RunMean(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_RETURN_IF_ERROR(RequireDType(ctx, ctx.in(0).dtype(), FloatTypes{}));
  KILN_RETURN_IF_ERROR(RunArith<AddOp>(ctx, outputs));
  const float n = static_cast<float>(ctx.num_inputs());
  float* p = outputs[0].data<float>();
  for (int64_t i = 0; i < outputs[0].numel(); ++i) p[i] /= n;
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------
// Mod: attribute fmod=0 (default) is integer modulo with the sign of the divisor (Python's %);
// fmod=1 is C fmod, with the sign of the dividend. Floats (float16 too) need fmod=1, as ONNX
// requires.

Result<int64_t> ModFlag(const Node& node) {
  const int64_t fmod = node.GetInt("fmod", 0);
  if (fmod != 0 && fmod != 1) {
    return Status::InvalidArgument(node.Describe() + ": attribute 'fmod'=" + std::to_string(fmod) +
                                   " is invalid (expected 0 or 1)");
  }
  return fmod;
}

Status CheckMod(const Node& node, int64_t) {
  KILN_RETURN_IF_ERROR(CheckArity(node, 2, 2));
  if (node.HasAttr("fmod")) KILN_RETURN_IF_ERROR(node.GetInt("fmod").status());
  return ModFlag(node).status();
}

Result<std::vector<TensorType>> InferMod(const OpContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType t, BroadcastOperands(ctx, /*same_dtype=*/true));
  if (t.dtype != DType::kFloat16 && !Accepts(MinMaxTypes{}, t.dtype)) {
    return UnsupportedDType(ctx, t.dtype, (TypeNames(MinMaxTypes{}) + ", float16").c_str());
  }
  KILN_ASSIGN_OR_RETURN(int64_t fmod, ModFlag(ctx.node()));
  if (IsFloatDType(t.dtype) && fmod == 0) {
    return Status::InvalidArgument(ctx.where() + ": attribute 'fmod'=0 needs integer inputs (" +
                                   DTypeName(t.dtype) + " inputs need fmod=1)");
  }
  return std::vector<TensorType>{t};
}

Status RunMod(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_ASSIGN_OR_RETURN(int64_t fmod, ModFlag(ctx.node()));
  const Tensor& a = ctx.in(0);
  const Tensor& b = ctx.in(1);
  if (a.dtype() == DType::kFloat16) {
    if (fmod == 0) return InferMod(ctx).status();
    // fmod of two float16 values is exact in float32 (the remainder is representable in the
    // dividend's precision), so the one rounding back to float16 loses nothing.
    KILN_ASSIGN_OR_RETURN(Tensor wa, a.CastTo(DType::kFloat32));
    KILN_ASSIGN_OR_RETURN(Tensor wb, b.CastTo(DType::kFloat32));
    KILN_ASSIGN_OR_RETURN(Tensor acc, Tensor::Empty(DType::kFloat32, outputs[0].shape()));
    BinaryKernel<float, float>(wa, wb, acc, [](float x, float y) { return std::fmod(x, y); });
    KILN_ASSIGN_OR_RETURN(Tensor half, acc.CastTo(DType::kFloat16));
    std::memcpy(outputs[0].raw_data(), half.raw_data(), outputs[0].nbytes());
    return Status::OK();
  }
  return Dispatch(ctx, a.dtype(), MinMaxTypes{}, [&]<typename T>() -> Status {
    if constexpr (std::is_floating_point_v<T>) {
      if (fmod == 0) return InferMod(ctx).status();
      BinaryKernel<T, T>(a, b, outputs[0], [](T x, T y) { return std::fmod(x, y); });
    } else {
      KILN_RETURN_IF_ERROR(CheckNoZeroDivisor<T>(ctx, b));
      if constexpr (std::is_unsigned_v<T>) {
        // No signs: fmod=0 and fmod=1 agree.
        BinaryKernel<T, T>(a, b, outputs[0], [](T x, T y) { return T(x % y); });
      } else if (fmod == 1) {
        // y == -1 is special-cased: MIN % -1 traps on x86 although the result is 0.
        BinaryKernel<T, T>(a, b, outputs[0], [](T x, T y) { return y == -1 ? T(0) : T(x % y); });
      } else {
        BinaryKernel<T, T>(a, b, outputs[0], [](T x, T y) {
          if (y == -1) return T(0);
          const T r = x % y;
          return (r != 0 && ((r < 0) != (y < 0))) ? T(r + y) : r;
        });
      }
    }
    return Status::OK();
  });
}

// ---------------------------------------------------------------------------------------------
// PRelu(X, slope): slope broadcasts to X (unidirectionally: the output has X's shape). Before
// opset 7 a 1-D slope of X's channel count applies per channel (dim 1), as those opsets said.

Result<Tensor> PReluSlope(const OpContext& ctx) {
  const Tensor& slope = ctx.in(1);
  const Shape& x = ctx.type(0).shape;
  if (ctx.opset() < 7 && slope.rank() == 1 && x.size() >= 2 && slope.dim(0) == x[1] &&
      slope.dim(0) != 1) {
    Shape per_channel(x.size() - 1, 1);
    per_channel[0] = slope.dim(0);
    return slope.Reshaped(per_channel);
  }
  return slope;
}

Result<std::vector<TensorType>> InferPRelu(const OpContext& ctx) {
  KILN_RETURN_IF_ERROR(RequireDType(ctx, ctx.type(0).dtype, ArithTypes{}));
  if (ctx.type(1).dtype != ctx.type(0).dtype) {
    return Status::InvalidArgument(ctx.where() + ": input 1 ('slope') has dtype " +
                                   DTypeName(ctx.type(1).dtype) + ", expected " +
                                   DTypeName(ctx.type(0).dtype) + " like input 0");
  }
  Shape slope = ctx.type(1).shape;
  const Shape& x = ctx.type(0).shape;
  if (ctx.opset() < 7 && slope.size() == 1 && x.size() >= 2 && slope[0] == x[1] && slope[0] != 1) {
    slope.assign(x.size() - 1, 1);
    slope[0] = x[1];
  }
  auto b = BroadcastShapes(x, slope);
  if (!b.ok() || *b != x) {
    return Status::InvalidArgument(ctx.where() + ": input 1 ('slope') " +
                                   ShapeToString(ctx.type(1).shape) +
                                   " does not broadcast to input 0 ('X') " + ShapeToString(x));
  }
  return std::vector<TensorType>{ctx.type(0)};
}

Status RunPRelu(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_ASSIGN_OR_RETURN(Tensor slope, PReluSlope(ctx));
  return Dispatch(ctx, ctx.in(0).dtype(), ArithTypes{}, [&]<typename T>() {
    BinaryKernel<T, T>(ctx.in(0), slope, outputs[0],
                       [](T x, T s) { return x < 0 ? WrapMul(x, s) : x; });
    return Status::OK();
  });
}

// ---------------------------------------------------------------------------------------------
// Comparisons and logic (output bool)

struct EqualOp {
  template <typename T>
  static bool Apply(T a, T b) {
    return a == b;
  }
};
struct LessOp {
  template <typename T>
  static bool Apply(T a, T b) {
    return a < b;
  }
};
struct GreaterOp {
  template <typename T>
  static bool Apply(T a, T b) {
    return a > b;
  }
};
struct LessOrEqualOp {
  template <typename T>
  static bool Apply(T a, T b) {
    return a <= b;
  }
};
struct GreaterOrEqualOp {
  template <typename T>
  static bool Apply(T a, T b) {
    return a >= b;
  }
};
struct AndOp {
  template <typename T>
  static bool Apply(T a, T b) {
    return a && b;
  }
};
struct OrOp {
  template <typename T>
  static bool Apply(T a, T b) {
    return a || b;
  }
};
struct XorOp {
  template <typename T>
  static bool Apply(T a, T b) {
    return (a != 0) != (b != 0);
  }
};

Result<std::vector<TensorType>> InferCompare(const OpContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType t, BroadcastOperands(ctx, /*same_dtype=*/true));
  t.dtype = DType::kBool;  // any input dtype is accepted
  return std::vector<TensorType>{t};
}

Result<std::vector<TensorType>> InferLogic(const OpContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType t, BroadcastOperands(ctx, /*same_dtype=*/true));
  KILN_RETURN_IF_ERROR(RequireDType(ctx, t.dtype, BoolTypes{}));
  return std::vector<TensorType>{t};
}

// float16 operands are widened to float32 first, which is exact.
template <typename Op, typename List>
Status RunCompare(const OpContext& ctx, std::vector<Tensor>& outputs) {
  Tensor a = ctx.in(0);
  KILN_ASSIGN_OR_RETURN(Tensor b, Operand(ctx, 1));
  if (a.dtype() == DType::kFloat16 && b.dtype() == DType::kFloat16 &&
      Accepts(List{}, DType::kFloat32)) {
    KILN_ASSIGN_OR_RETURN(a, a.CastTo(DType::kFloat32));
    KILN_ASSIGN_OR_RETURN(b, b.CastTo(DType::kFloat32));
  }
  return Dispatch(ctx, a.dtype(), List{}, [&]<typename T>() {
    BinaryKernel<T, uint8_t>(
        a, b, outputs[0], [](T x, T y) -> uint8_t { return Op::template Apply<T>(x, y) ? 1 : 0; });
    return Status::OK();
  });
}

// ---------------------------------------------------------------------------------------------
// Where(condition, X, Y): three-way broadcast; X and Y may have any dtype, copied bytewise.

Result<std::vector<TensorType>> InferWhere(const OpContext& ctx) {
  if (ctx.type(0).dtype != DType::kBool) {
    return Status::InvalidArgument(ctx.where() + ": input 0 ('condition') has dtype " +
                                   DTypeName(ctx.type(0).dtype) + ", expected bool");
  }
  if (ctx.type(1).dtype != ctx.type(2).dtype) {
    return Status::InvalidArgument(ctx.where() + ": inputs 1 ('X') and 2 ('Y') have dtypes " +
                                   DTypeName(ctx.type(1).dtype) + " and " +
                                   DTypeName(ctx.type(2).dtype) + ", expected the same");
  }
  KILN_ASSIGN_OR_RETURN(TensorType t, BroadcastOperands(ctx, /*same_dtype=*/false));
  t.dtype = ctx.type(1).dtype;
  return std::vector<TensorType>{t};
}

template <typename E>  // an unsigned integer as wide as the element
void WhereKernel(const Tensor& c, const Tensor& x, const Tensor& y, Tensor& out) {
  const uint8_t* pc = c.data<uint8_t>();
  const E* px = x.data<E>();
  const E* py = y.data<E>();
  E* po = out.data<E>();
  const int64_t n = out.numel();
  if (c.numel() == n && x.numel() == n && y.numel() == n) {
    for (int64_t i = 0; i < n; ++i) po[i] = pc[i] ? px[i] : py[i];
    return;
  }
  ForEachBroadcast<3>(out.shape(), {c.shape(), x.shape(), y.shape()},
                      [&](int64_t i, const std::array<int64_t, 3>& off) {
                        po[i] = pc[off[0]] ? px[off[1]] : py[off[2]];
                      });
}

Status RunWhere(const OpContext& ctx, std::vector<Tensor>& outputs) {
  const Tensor& c = ctx.in(0);
  const Tensor& x = ctx.in(1);
  const Tensor& y = ctx.in(2);
  switch (DTypeSize(x.dtype())) {
    case 1:
      WhereKernel<uint8_t>(c, x, y, outputs[0]);
      break;
    case 2:
      WhereKernel<uint16_t>(c, x, y, outputs[0]);
      break;
    case 4:
      WhereKernel<uint32_t>(c, x, y, outputs[0]);
      break;
    case 8:
      WhereKernel<uint64_t>(c, x, y, outputs[0]);
      break;
    default:
      return UnsupportedDType(ctx, x.dtype(), "elements of 1, 2, 4 or 8 bytes");
  }
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------
// Clip: bounds are attributes min/max before opset 11 (float32 only, as in ONNX), optional scalar
// inputs 1 and 2 from opset 11. min > max gives max everywhere; NaN passes through.

Status CheckClipAttrs(const Node& node, int64_t) {
  KILN_RETURN_IF_ERROR(CheckArity(node, 1, 1));
  KILN_RETURN_IF_ERROR(RequireFloatAttr(node, "min"));
  return RequireFloatAttr(node, "max");
}

Status CheckClipInputs(const Node& node, int64_t) {
  KILN_RETURN_IF_ERROR(CheckArity(node, 1, 3));
  for (const char* attr : {"min", "max"}) {
    if (node.HasAttr(attr)) {
      return Status::InvalidArgument(node.Describe() + ": attribute '" + attr +
                                     "' is not allowed from opset 11 (bounds are inputs 1 and 2)");
    }
  }
  return Status::OK();
}

Status CheckClipBound(const OpContext& ctx, size_t i, const char* role) {
  if (!ctx.present(i)) return Status::OK();
  const TensorType& t = ctx.type(i);
  if (t.dtype != ctx.type(0).dtype || NumElements(t.shape) != 1) {
    return Status::InvalidArgument(ctx.where() + ": input " + std::to_string(i) + " ('" + role +
                                   "') is " + t.ToString() + ", expected a single " +
                                   DTypeName(ctx.type(0).dtype) + " value like input 0");
  }
  return Status::OK();
}

Result<std::vector<TensorType>> InferClip(const OpContext& ctx) {
  KILN_ASSIGN_OR_RETURN(std::vector<TensorType> out, InferSameAsInput0(ctx));
  if (ctx.opset() < 11) {
    KILN_RETURN_IF_ERROR(RequireDType(ctx, out[0].dtype, FloatTypes{}));
  } else {
    KILN_RETURN_IF_ERROR(RequireDType(ctx, out[0].dtype, ArithTypes8{}));
    KILN_RETURN_IF_ERROR(CheckClipBound(ctx, 1, "min"));
    KILN_RETURN_IF_ERROR(CheckClipBound(ctx, 2, "max"));
  }
  return out;
}

Status RunClip(const OpContext& ctx, std::vector<Tensor>& outputs) {
  const Tensor& x = ctx.in(0);
  if (ctx.opset() < 11) {
    KILN_RETURN_IF_ERROR(RequireDType(ctx, x.dtype(), FloatTypes{}));
    const float lo = ctx.node().GetFloat("min", std::numeric_limits<float>::lowest());
    const float hi = ctx.node().GetFloat("max", std::numeric_limits<float>::max());
    UnaryKernel<float, float>(x, outputs[0], [=](float v) {
      v = v < lo ? lo : v;
      return v > hi ? hi : v;
    });
    return Status::OK();
  }
  KILN_RETURN_IF_ERROR(CheckClipBound(ctx, 1, "min"));
  KILN_RETURN_IF_ERROR(CheckClipBound(ctx, 2, "max"));
  return Dispatch(ctx, x.dtype(), ArithTypes8{}, [&]<typename T>() {
    // An absent bound is no bound: infinite for floats, so +-inf pass through (as numpy.clip
    // with None); the type's range for integers.
    constexpr bool kFloat = std::numeric_limits<T>::has_infinity;
    const T lo = ctx.present(1) ? ctx.in(1).data<T>()[0]
                                : (kFloat ? -std::numeric_limits<T>::infinity()
                                          : std::numeric_limits<T>::lowest());
    const T hi = ctx.present(2) ? ctx.in(2).data<T>()[0]
                                : (kFloat ? std::numeric_limits<T>::infinity()
                                          : std::numeric_limits<T>::max());
    UnaryKernel<T, T>(x, outputs[0], [=](T v) {
      v = v < lo ? lo : v;
      return v > hi ? hi : v;
    });
    return Status::OK();
  });
}

// ---------------------------------------------------------------------------------------------
// Cast: attribute `to` is an ONNX TensorProto.DataType number.

Result<DType> CastTarget(const Node& node) {
  KILN_ASSIGN_OR_RETURN(int64_t to, node.GetInt("to"));
  if (std::optional<DType> t = DTypeFromOnnxElemType(to)) return *t;
  return Status::Unimplemented(node.Describe() + ": attribute 'to'=" + std::to_string(to) + " (" +
                               OnnxElemTypeName(to) +
                               ") is not supported (supported: " + SupportedOnnxElemTypes() + ")");
}

Status CheckCast(const Node& node, int64_t) {
  KILN_RETURN_IF_ERROR(CheckArity(node, 1, 1));
  return CastTarget(node).status();
}

Result<std::vector<TensorType>> InferCast(const OpContext& ctx) {
  KILN_ASSIGN_OR_RETURN(std::vector<TensorType> out, InferSameAsInput0(ctx));
  KILN_ASSIGN_OR_RETURN(out[0].dtype, CastTarget(ctx.node()));
  return out;
}

Status RunCast(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_ASSIGN_OR_RETURN(DType to, CastTarget(ctx.node()));
  KILN_ASSIGN_OR_RETURN(Tensor converted, kernel::CastForOp(ctx.in(0), to, ctx.opset()));
  return kernel::Deliver(converted, outputs[0]);
}

// ---------------------------------------------------------------------------------------------
// The table

struct ElementwiseOp {
  const char* op_type;
  int64_t since_version;
  int64_t until_version;
  CheckFn check;
  InferFn infer;
  RunFn run;
  ElementwiseFusion fusion = {};  // how a compiled cell fuses this form; kNone: it does not
};

constexpr int64_t kMax = INT64_MAX;

using FT = ElementwiseFusion::Types;
constexpr ElementwiseFusion kFuseUnary{FT::kFloat, 1, 1};
constexpr ElementwiseFusion kFuseBinary{FT::kFloat, 2, 2};
constexpr ElementwiseFusion kFuseCompare{FT::kCompare, 2, 2};
// Unary float32 ops whose scalar function takes Op's alpha (and beta) attributes.
template <typename Op>
constexpr ElementwiseFusion FuseAlpha() {
  return {FT::kFloat, 1, 1, {{{Op::kAlphaName, Op::kAlpha}}}, 1};
}
template <typename Op>
constexpr ElementwiseFusion FuseAlphaBeta() {
  return {FT::kFloat, 1, 1, {{{Op::kAlphaName, Op::kAlpha}, {Op::kBetaName, Op::kBeta}}}, 2};
}

constexpr ElementwiseOp kOps[] = {
    // Unary float32 math and activations.
    {"Sqrt", 1, kMax, CheckUnary, InferUnaryFloat, RunUnaryFloat<SqrtOp>, kFuseUnary},
    {"Exp", 1, kMax, CheckUnary, InferUnaryFloat, RunUnaryFloat<ExpOp>, kFuseUnary},
    {"Log", 1, kMax, CheckUnary, InferUnaryFloat, RunUnaryFloat<LogOp>, kFuseUnary},
    {"Reciprocal", 1, kMax, CheckUnary, InferUnaryFloat, RunUnaryFloat<ReciprocalOp>, kFuseUnary},
    {"Sigmoid", 1, kMax, CheckUnary, InferUnaryFloat, RunUnaryFloat<SigmoidOp>, kFuseUnary},
    {"Tanh", 1, kMax, CheckUnary, InferUnaryFloat, RunUnaryFloat<TanhOp>, kFuseUnary},
    {"Erf", 1, kMax, CheckUnary, InferUnaryFloat, RunUnaryFloat<ErfOp>, kFuseUnary},
    {"Sin", 1, kMax, CheckUnary, InferUnaryFloat, RunUnaryFloat<SinOp>, kFuseUnary},
    {"Cos", 1, kMax, CheckUnary, InferUnaryFloat, RunUnaryFloat<CosOp>, kFuseUnary},
    {"Floor", 1, kMax, CheckUnary, InferUnaryFloat, RunUnaryFloat<FloorOp>, kFuseUnary},
    {"Ceil", 1, kMax, CheckUnary, InferUnaryFloat, RunUnaryFloat<CeilOp>, kFuseUnary},
    {"Softplus", 1, kMax, CheckUnary, InferUnaryFloat, RunUnaryFloat<SoftplusOp>, kFuseUnary},
    {"HardSwish", 1, kMax, CheckUnary, InferUnaryFloat, RunUnaryFloat<HardSwishOp>, kFuseUnary},
    {"Round", 1, kMax, CheckUnary, InferUnaryFloat, RunUnaryFloat<RoundOp>},
    {"Softsign", 1, kMax, CheckUnary, InferUnaryFloat, RunUnaryFloat<SoftsignOp>},
    {"Mish", 1, kMax, CheckUnary, InferUnaryFloat, RunUnaryFloat<MishOp>},
    {"LeakyRelu", 1, kMax, CheckFloatAttrs<LeakyReluOp>, InferUnaryFloat,
     RunUnaryFloat<LeakyReluOp>, FuseAlpha<LeakyReluOp>()},
    {"HardSigmoid", 1, kMax, CheckFloatAttrs<HardSigmoidOp>, InferUnaryFloat,
     RunUnaryFloat<HardSigmoidOp>, FuseAlphaBeta<HardSigmoidOp>()},
    {"Elu", 1, kMax, CheckFloatAttrs<EluOp>, InferUnaryFloat, RunUnaryFloat<EluOp>,
     FuseAlpha<EluOp>()},
    {"Selu", 1, kMax, CheckFloatAttrs<SeluOp>, InferUnaryFloat, RunUnaryFloat<SeluOp>},
    {"Celu", 1, kMax, CheckNonZeroAlpha<CeluOp>, InferUnaryFloat, RunUnaryFloat<CeluOp>},
    {"ThresholdedRelu", 1, kMax, CheckFloatAttrs<ThresholdedReluOp>, InferUnaryFloat,
     RunUnaryFloat<ThresholdedReluOp>},
    {"Shrink", 1, kMax, CheckFloatAttrs<ShrinkOp>, InferUnaryFloat, RunUnaryFloat<ShrinkOp>},
    // Unary over signed numbers (fused for float32 only).
    {"Neg", 1, kMax, CheckUnary, InferUnarySigned, RunUnarySigned<NegOp>, kFuseUnary},
    {"Abs", 1, kMax, CheckUnary, InferUnarySigned, RunUnarySigned<AbsOp>, kFuseUnary},
    {"Sign", 1, kMax, CheckUnary, InferUnarySigned, RunUnarySigned<SignOp>, kFuseUnary},
    {"Relu", 1, kMax, CheckUnary, InferUnarySigned, RunUnarySigned<ReluOp>, kFuseUnary},
    {"Not", 1, kMax, CheckUnary, InferNot, RunNot, {FT::kBool, 1, 1}},
    // Broadcasting arithmetic (the opset < 7 broadcast/axis form is read by OperandShape).
    {"Add", 1, kMax, CheckBinary, InferArith<>, RunArith<AddOp>, kFuseBinary},
    {"Sub", 1, kMax, CheckBinary, InferArith<>, RunArith<SubOp>, kFuseBinary},
    {"Mul", 1, kMax, CheckBinary, InferArith<>, RunArith<MulOp>, kFuseBinary},
    {"Div", 1, kMax, CheckBinary, InferArith<>, RunArith<DivOp>, kFuseBinary},
    {"Pow", 1, kMax, CheckBinary, InferPow, RunPow, kFuseBinary},
    {"Min", 1, kMax, CheckVariadic, InferArith<MinMaxTypes>, RunArith<MinOp, MinMaxTypes>,
     kFuseBinary},
    {"Max", 1, kMax, CheckVariadic, InferArith<MinMaxTypes>, RunArith<MaxOp, MinMaxTypes>,
     kFuseBinary},
    {"Sum", 1, kMax, CheckVariadic, InferArith<>, RunArith<AddOp>},
    {"Mean", 1, kMax, CheckVariadic, InferMean, RunMean},
    {"Mod", 10, kMax, CheckMod, InferMod, RunMod},
    {"PRelu", 1, kMax, CheckBinary, InferPRelu, RunPRelu},
    // Comparisons and logic, output bool.
    {"Equal", 1, kMax, CheckBinary, InferCompare, RunCompare<EqualOp, AllButHalf>, kFuseCompare},
    {"Less", 1, kMax, CheckBinary, InferCompare, RunCompare<LessOp, AllButHalf>, kFuseCompare},
    {"Greater", 1, kMax, CheckBinary, InferCompare, RunCompare<GreaterOp, AllButHalf>,
     kFuseCompare},
    {"LessOrEqual", 1, kMax, CheckBinary, InferCompare, RunCompare<LessOrEqualOp, AllButHalf>,
     kFuseCompare},
    {"GreaterOrEqual", 1, kMax, CheckBinary, InferCompare, RunCompare<GreaterOrEqualOp, AllButHalf>,
     kFuseCompare},
    {"And", 1, kMax, CheckBinary, InferLogic, RunCompare<AndOp, BoolTypes>, {FT::kBool, 2, 2}},
    {"Or", 1, kMax, CheckBinary, InferLogic, RunCompare<OrOp, BoolTypes>, {FT::kBool, 2, 2}},
    {"Xor", 1, kMax, CheckBinary, InferLogic, RunCompare<XorOp, BoolTypes>},
    // Selection, clamping, conversion. Clip's fused form before opset 11 takes its bounds as
    // attributes with RunClip's defaults; from 11 they are inputs (an absent one is infinite).
    {"Where", 1, kMax, CheckWhere, InferWhere, RunWhere, {FT::kWhere, 3, 3}},
    {"Clip",
     1,
     10,
     CheckClipAttrs,
     InferClip,
     RunClip,
     {FT::kFloat,
      1,
      1,
      {{{"min", std::numeric_limits<float>::lowest()}, {"max", std::numeric_limits<float>::max()}}},
      2}},
    {"Clip", 11, kMax, CheckClipInputs, InferClip, RunClip, {FT::kFloat, 1, 3}},
    {"Cast", 1, kMax, CheckCast, InferCast, RunCast, {FT::kCast, 1, 1}},
};
static_assert(std::size(kOps) == 51,
              "op count changed: update the registry tests (AllOpsRegistered / FormsSplitByOpset)");

}  // namespace

std::vector<OpDef> ElementwiseOpDefs() {
  std::vector<OpDef> defs;
  for (const ElementwiseOp& op : kOps) {
    defs.push_back(
        OpDef{op.op_type, "", op.since_version, op.until_version, op.check, op.infer, op.run});
    // Cast converts to and from text (numbers print as the shortest decimal that reads back).
    if (std::string(op.op_type) == "Cast") defs.back().strings = true;
  }
  return defs;
}

const std::vector<FusableElementwise>& FusableElementwiseOps() {
  static const std::vector<FusableElementwise>* table = [] {
    auto* t = new std::vector<FusableElementwise>();
    for (const ElementwiseOp& op : kOps) {
      if (op.fusion.types != FT::kNone) {
        t->push_back({op.op_type, op.since_version, op.until_version, op.fusion});
      }
    }
    // Identity is registered with the shape ops (shape_ops.cc); fused it is a float32 copy.
    t->push_back({"Identity", 1, kMax, kFuseUnary});
    return t;
  }();
  return *table;
}

}  // namespace kiln
