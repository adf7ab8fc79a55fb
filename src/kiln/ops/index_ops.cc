// Indexing, scatter/gather and layout op family (ops layer): GatherElements, GatherND,
// ScatterElements, ScatterND, NonZero, OneHot, Trilu, EyeLike, DepthToSpace, SpaceToDepth and
// Einsum. Listed by IndexOpDefs (registered by registry.cc).
//
// Gathers, scatters and layout ops move bytes, so they work on every dtype through DTypeSize;
// only the scatter reductions, OneHot/EyeLike fill values and Einsum's arithmetic look at element
// types. Index inputs are int64 or int32; a negative index counts from the end of its axis, and
// an index outside [-dim, dim) is an InvalidArgument naming the node, the index, where it sits in
// the indices tensor and the bound.
//
// NonZero is the one op here whose output shape depends on input values. Its infer reads the
// input's value, so it works whenever the value is known (every eager run; a structural input
// during compilation, where folding then replaces the node) and otherwise refuses with
// Unimplemented "data-dependent output shape", which is what a mint reports for it.
#include <algorithm>
#include <array>
#include <cstring>
#include <string>
#include <vector>

#include "src/kiln/ops/dnnl_kernels.h"
#include "src/kiln/ops/registry.h"

namespace kiln {
namespace {

// ---------------------------------------------------------------------------------------------
// Shared helpers.

std::string Str(const std::vector<int64_t>& v) { return ShapeToString(v); }

Status Invalid(const OpContext& ctx, const std::string& msg) {
  return Status::InvalidArgument(ctx.where() + ": " + msg);
}
Status Invalid(const Node& node, const std::string& msg) {
  return Status::InvalidArgument(node.Describe() + ": " + msg);
}

bool IsIndexDType(DType t) { return t == DType::kInt64 || t == DType::kInt32; }

Status RequireIndices(const OpContext& ctx, size_t i) {
  if (!IsIndexDType(ctx.type(i).dtype)) {
    return Invalid(ctx, "input " + std::to_string(i) + " ('indices') is " + ctx.type(i).ToString() +
                            ", expected int64 or int32");
  }
  return Status::OK();
}

// `index` (read from indices element `pos`) wrapped into [0, dim), or an error naming both.
Result<int64_t> WrapIndex(const OpContext& ctx, int64_t index, int64_t pos, int64_t axis,
                          int64_t dim) {
  if (index < -dim || index >= dim) {
    return Invalid(ctx, "index " + std::to_string(index) + " (indices element " +
                            std::to_string(pos) + ") is out of range for axis " +
                            std::to_string(axis) + " with dim " + std::to_string(dim) +
                            " (expected " + std::to_string(-dim) + " to " +
                            std::to_string(dim - 1) + ")");
  }
  return index < 0 ? index + dim : index;
}

void CopyBytes(void* dst, const void* src, size_t n) {
  if (n != 0 && dst != src) std::memcpy(dst, src, n);
}

Result<std::vector<TensorType>> Single(DType dtype, Shape shape) {
  return std::vector<TensorType>{{dtype, std::move(shape)}};
}

int64_t DimProduct(const Shape& shape, size_t begin, size_t end) {
  int64_t n = 1;
  for (size_t i = begin; i < end && i < shape.size(); ++i) n *= shape[i];
  return n;
}

// Advances the row-major multi-index `idx` over `shape`; false after the last index.
bool NextIndex(std::vector<int64_t>& idx, const Shape& shape) {
  for (size_t d = idx.size(); d-- > 0;) {
    if (++idx[d] < shape[d]) return true;
    idx[d] = 0;
  }
  return false;
}

// One element of `dtype` holding `value` (1 for EyeLike), as bytes.
Result<std::vector<uint8_t>> ElementBytes(float value, DType dtype) {
  KILN_ASSIGN_OR_RETURN(Tensor t, Tensor::Scalar<float>(value).CastTo(dtype));
  const auto* p = static_cast<const uint8_t*>(t.raw_data());
  return std::vector<uint8_t>(p, p + t.nbytes());
}

// Calls f(T{}) for the element types the arithmetic kernels support.
template <typename F>
Status DispatchArith(const OpContext& ctx, DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat32:
      return f(float{});
    case DType::kInt64:
      return f(int64_t{});
    case DType::kInt32:
      return f(int32_t{});
    case DType::kInt8:
      return f(int8_t{});
    case DType::kUInt8:
      return f(uint8_t{});
    case DType::kFloat64:
      return f(double{});
    default:
      return UnsupportedDType(ctx, dtype, "float32, int64, int32, int8, uint8, float64");
  }
}

// The kiln dtype for ONNX TensorProto element type `code`, given in attribute `attr`.
Result<DType> DTypeFromOnnxCode(const Node& node, const std::string& attr, int64_t code) {
  if (std::optional<DType> t = DTypeFromOnnxElemType(code)) return *t;
  return Status::Unimplemented(
      node.Describe() + ": attribute " + attr + "=" + std::to_string(code) + " (" +
      OnnxElemTypeName(code) +
      ") is not a supported element type (supported: " + SupportedOnnxElemTypes() + ")");
}

// ---------------------------------------------------------------------------------------------
// Scatter reductions: `reduction` none (opset < 16 only this), add and mul (16+), max and min
// (18+).

enum class Reduction { kNone, kAdd, kMul, kMax, kMin };

Result<Reduction> ReadReduction(const Node& node, int64_t opset) {
  if (!node.HasAttr("reduction")) return Reduction::kNone;
  KILN_ASSIGN_OR_RETURN(std::string r, node.GetString("reduction"));
  if (opset < 16) {
    return Invalid(node, "attribute reduction='" + r + "' is not part of opset " +
                             std::to_string(opset) + " (reduction arrived in opset 16)");
  }
  if (r == "none") return Reduction::kNone;
  if (r == "add") return Reduction::kAdd;
  if (r == "mul") return Reduction::kMul;
  if (opset >= 18 && r == "max") return Reduction::kMax;
  if (opset >= 18 && r == "min") return Reduction::kMin;
  return Invalid(node, "attribute reduction='" + r + "' is not one of " +
                           (opset >= 18 ? "none, add, mul, max, min"
                                        : "none, add, mul (max and min need opset 18)"));
}

template <typename T>
void Reduce(Reduction r, T* dst, const T* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    switch (r) {
      case Reduction::kNone:
        dst[i] = src[i];
        break;
      case Reduction::kAdd:
        dst[i] = static_cast<T>(dst[i] + src[i]);
        break;
      case Reduction::kMul:
        dst[i] = static_cast<T>(dst[i] * src[i]);
        break;
      case Reduction::kMax:
        dst[i] = std::max(dst[i], src[i]);
        break;
      case Reduction::kMin:
        dst[i] = std::min(dst[i], src[i]);
        break;
    }
  }
}

// Applies `n` elements of `src` onto `dst` (both of `dtype`): a byte copy without reduction.
Status ApplyUpdate(const OpContext& ctx, Reduction r, DType dtype, void* dst, const void* src,
                   int64_t n) {
  if (r == Reduction::kNone) {
    CopyBytes(dst, src, static_cast<size_t>(n) * DTypeSize(dtype));
    return Status::OK();
  }
  return DispatchArith(ctx, dtype, [&](auto tag) {
    using T = decltype(tag);
    Reduce<T>(r, static_cast<T*>(dst), static_cast<const T*>(src), n);
    return Status::OK();
  });
}

Status CheckScatter(const Node& node, int64_t opset) {
  KILN_RETURN_IF_ERROR(CheckArity(node, 3, 3));
  if (node.HasAttr("axis")) KILN_RETURN_IF_ERROR(node.GetInt("axis").status());
  return ReadReduction(node, opset).status();
}

// ---------------------------------------------------------------------------------------------
// GatherElements / ScatterElements: indices of data's rank; along `axis` each index picks the
// data element, elsewhere the index tensor's own position does. Indices dims may be smaller than
// data dims off the axis (onnxruntime accepts this; ONNX leaves it open).

Status CheckAxisElements(const Node& node, int64_t /*opset*/) {
  KILN_RETURN_IF_ERROR(CheckArity(node, 2, 2));
  if (node.HasAttr("axis")) KILN_RETURN_IF_ERROR(node.GetInt("axis").status());
  return Status::OK();
}

Result<int64_t> ElementsAxis(const OpContext& ctx) {
  const Shape& data = ctx.type(0).shape;
  const Shape& indices = ctx.type(1).shape;
  KILN_RETURN_IF_ERROR(RequireIndices(ctx, 1));
  const int64_t rank = static_cast<int64_t>(data.size());
  const int64_t axis = ctx.node().GetInt("axis", 0);
  if (rank == 0) return Invalid(ctx, "data is a scalar, expected rank >= 1");
  if (axis < -rank || axis >= rank) {
    return Invalid(ctx, "attribute axis=" + std::to_string(axis) + " is out of range for data " +
                            Str(data) + " (expected " + std::to_string(-rank) + " to " +
                            std::to_string(rank - 1) + ")");
  }
  const int64_t a = axis < 0 ? axis + rank : axis;
  bool fits = indices.size() == data.size();
  for (size_t d = 0; fits && d < data.size(); ++d) {
    fits = static_cast<int64_t>(d) == a || indices[d] <= data[d];
  }
  if (!fits) {
    return Invalid(ctx, "indices shape " + Str(indices) + " does not fit data shape " + Str(data) +
                            " (expected the same rank and dims no larger off axis " +
                            std::to_string(a) + ")");
  }
  return a;
}

Result<std::vector<TensorType>> InferGatherElements(const OpContext& ctx) {
  KILN_RETURN_IF_ERROR(ElementsAxis(ctx).status());
  return Single(ctx.type(0).dtype, ctx.type(1).shape);
}

// Calls f(pos, data_offset) for every element of `indices` in row-major order, where
// data_offset is the element of `data` it addresses.
template <typename F>
Status ForEachElementIndex(const OpContext& ctx, const Tensor& data, const Tensor& indices,
                           int64_t axis, F&& f) {
  const std::vector<int64_t> strides = ContiguousStrides(data.shape());
  std::vector<int64_t> idx(indices.shape().size(), 0);
  for (int64_t pos = 0; pos < indices.numel(); ++pos) {
    KILN_ASSIGN_OR_RETURN(const int64_t i,
                          WrapIndex(ctx, indices.GetAsInt64(pos), pos, axis, data.dim(axis)));
    int64_t off = 0;
    for (size_t d = 0; d < idx.size(); ++d) {
      off += (static_cast<int64_t>(d) == axis ? i : idx[d]) * strides[d];
    }
    KILN_RETURN_IF_ERROR(f(pos, off));
    NextIndex(idx, indices.shape());
  }
  return Status::OK();
}

Status RunGatherElements(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_ASSIGN_OR_RETURN(const int64_t axis, ElementsAxis(ctx));
  const Tensor& data = ctx.in(0);
  const size_t elem = DTypeSize(data.dtype());
  const auto* src = static_cast<const uint8_t*>(data.raw_data());
  auto* dst = static_cast<uint8_t*>(outputs[0].raw_data());
  return ForEachElementIndex(ctx, data, ctx.in(1), axis, [&](int64_t pos, int64_t off) {
    std::memcpy(dst + pos * elem, src + off * elem, elem);
    return Status::OK();
  });
}

Result<std::vector<TensorType>> InferScatterElements(const OpContext& ctx) {
  KILN_RETURN_IF_ERROR(ElementsAxis(ctx).status());
  if (ctx.type(2) != TensorType{ctx.type(0).dtype, ctx.type(1).shape}) {
    return Invalid(ctx, "updates are " + ctx.type(2).ToString() + ", expected " +
                            DTypeName(ctx.type(0).dtype) + Str(ctx.type(1).shape) +
                            " (data's dtype, indices' shape)");
  }
  return Single(ctx.type(0).dtype, ctx.type(0).shape);
}

Status RunScatterElements(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_ASSIGN_OR_RETURN(const int64_t axis, ElementsAxis(ctx));
  KILN_ASSIGN_OR_RETURN(const Reduction r, ReadReduction(ctx.node(), ctx.opset()));
  const Tensor& data = ctx.in(0);
  Tensor& out = outputs[0];
  CopyBytes(out.raw_data(), data.raw_data(), data.nbytes());
  const size_t elem = DTypeSize(data.dtype());
  const auto* upd = static_cast<const uint8_t*>(ctx.in(2).raw_data());
  auto* dst = static_cast<uint8_t*>(out.raw_data());
  return ForEachElementIndex(ctx, data, ctx.in(1), axis, [&](int64_t pos, int64_t off) {
    return ApplyUpdate(ctx, r, data.dtype(), dst + off * elem, upd + pos * elem, 1);
  });
}

// ---------------------------------------------------------------------------------------------
// GatherND (batch_dims from opset 12) / ScatterND: the last indices axis holds k coordinates
// into data's dims [b, b + k); each tuple addresses a slice of data's remaining dims.

Status CheckGatherND(const Node& node, int64_t opset) {
  KILN_RETURN_IF_ERROR(CheckArity(node, 2, 2));
  if (node.HasAttr("batch_dims")) {
    if (opset < 12) {
      return Invalid(node, "attribute 'batch_dims' is not part of opset " + std::to_string(opset) +
                               " (it arrived in opset 12)");
    }
    KILN_ASSIGN_OR_RETURN(int64_t b, node.GetInt("batch_dims"));
    if (b < 0) {
      return Invalid(node, "attribute batch_dims=" + std::to_string(b) + " must be >= 0");
    }
  }
  return Status::OK();
}

struct NDPlan {
  int64_t batch = 0;  // batch_dims
  int64_t k = 0;      // coordinates per tuple
  int64_t batches = 1, tuples_per_batch = 1, slice = 1;
  std::vector<int64_t> coord_dims;  // data dims [b, b + k)
  Shape out;                        // GatherND output / ScatterND updates shape
};

Result<NDPlan> PlanND(const OpContext& ctx, int64_t batch_dims) {
  KILN_RETURN_IF_ERROR(RequireIndices(ctx, 1));
  const Shape& data = ctx.type(0).shape;
  const Shape& indices = ctx.type(1).shape;
  const int64_t r = static_cast<int64_t>(data.size()), q = static_cast<int64_t>(indices.size());
  NDPlan p;
  p.batch = batch_dims;
  if (r < 1 || q < 1) {
    return Invalid(
        ctx, "data " + Str(data) + " and indices " + Str(indices) + " must both have rank >= 1");
  }
  if (batch_dims >= std::min(q, r)) {
    return Invalid(ctx, "attribute batch_dims=" + std::to_string(batch_dims) +
                            " must be less than the ranks of data " + Str(data) + " and indices " +
                            Str(indices));
  }
  p.k = indices.back();
  if (p.k < 1 || p.k > r - batch_dims) {
    return Invalid(ctx, "indices " + Str(indices) + " give " + std::to_string(p.k) +
                            " coordinates per tuple, expected 1 to " +
                            std::to_string(r - batch_dims) + " for data " + Str(data) +
                            " with batch_dims=" + std::to_string(batch_dims));
  }
  for (int64_t d = 0; d < batch_dims; ++d) {
    if (indices[d] != data[d]) {
      return Invalid(ctx, "batch dim " + std::to_string(d) + " differs between data " + Str(data) +
                              " and indices " + Str(indices));
    }
  }
  p.batches = DimProduct(data, 0, batch_dims);
  p.tuples_per_batch = DimProduct(indices, batch_dims, q - 1);
  p.slice = DimProduct(data, batch_dims + p.k, r);
  p.coord_dims.assign(data.begin() + batch_dims, data.begin() + batch_dims + p.k);
  p.out.assign(indices.begin(), indices.end() - 1);
  p.out.insert(p.out.end(), data.begin() + batch_dims + p.k, data.end());
  return p;
}

// Calls f(tuple, data_offset) for every index tuple, tuple counted over all batches, with the
// element offset of the slice it addresses in data.
template <typename F>
Status ForEachTuple(const OpContext& ctx, const NDPlan& p, F&& f) {
  const Tensor& indices = ctx.in(1);
  const int64_t batch_block = DimProduct(ctx.in(0).shape(), p.batch, ctx.in(0).shape().size());
  for (int64_t b = 0; b < p.batches; ++b) {
    for (int64_t t = 0; t < p.tuples_per_batch; ++t) {
      const int64_t tuple = b * p.tuples_per_batch + t;
      int64_t off = 0;
      for (int64_t j = 0; j < p.k; ++j) {
        const int64_t pos = tuple * p.k + j;
        KILN_ASSIGN_OR_RETURN(const int64_t i, WrapIndex(ctx, indices.GetAsInt64(pos), pos,
                                                         p.batch + j, p.coord_dims[j]));
        off = off * p.coord_dims[j] + i;
      }
      KILN_RETURN_IF_ERROR(f(tuple, b * batch_block + off * p.slice));
    }
  }
  return Status::OK();
}

Result<std::vector<TensorType>> InferGatherND(const OpContext& ctx) {
  KILN_ASSIGN_OR_RETURN(NDPlan p, PlanND(ctx, ctx.node().GetInt("batch_dims", 0)));
  return Single(ctx.type(0).dtype, p.out);
}

Status RunGatherND(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_ASSIGN_OR_RETURN(NDPlan p, PlanND(ctx, ctx.node().GetInt("batch_dims", 0)));
  const size_t elem = DTypeSize(ctx.in(0).dtype());
  const size_t block = static_cast<size_t>(p.slice) * elem;
  const auto* src = static_cast<const uint8_t*>(ctx.in(0).raw_data());
  auto* dst = static_cast<uint8_t*>(outputs[0].raw_data());
  return ForEachTuple(ctx, p, [&](int64_t tuple, int64_t off) {
    CopyBytes(dst + tuple * block, src + off * elem, block);
    return Status::OK();
  });
}

Result<std::vector<TensorType>> InferScatterND(const OpContext& ctx) {
  KILN_ASSIGN_OR_RETURN(NDPlan p, PlanND(ctx, 0));
  if (ctx.type(2) != TensorType{ctx.type(0).dtype, p.out}) {
    return Invalid(ctx, "updates are " + ctx.type(2).ToString() + ", expected " +
                            DTypeName(ctx.type(0).dtype) + Str(p.out) +
                            " (indices shape without its last dim, then data's dims past the "
                            "indexed ones)");
  }
  return Single(ctx.type(0).dtype, ctx.type(0).shape);
}

Status RunScatterND(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_ASSIGN_OR_RETURN(NDPlan p, PlanND(ctx, 0));
  KILN_ASSIGN_OR_RETURN(const Reduction r, ReadReduction(ctx.node(), ctx.opset()));
  const Tensor& data = ctx.in(0);
  CopyBytes(outputs[0].raw_data(), data.raw_data(), data.nbytes());
  const size_t elem = DTypeSize(data.dtype());
  const auto* upd = static_cast<const uint8_t*>(ctx.in(2).raw_data());
  auto* dst = static_cast<uint8_t*>(outputs[0].raw_data());
  return ForEachTuple(ctx, p, [&](int64_t tuple, int64_t off) {
    return ApplyUpdate(ctx, r, data.dtype(), dst + off * elem, upd + tuple * p.slice * elem,
                       p.slice);
  });
}

// ---------------------------------------------------------------------------------------------
// NonZero (opset 9+): int64 [rank, count] of the coordinates of nonzero elements in row-major
// order; a scalar reads as a one-element vector (onnxruntime's rule).

Status CheckNonZero(const Node& node, int64_t /*opset*/) { return CheckArity(node, 1, 1); }

int64_t CountNonZero(const Tensor& t) {
  int64_t n = 0;
  for (int64_t i = 0; i < t.numel(); ++i) n += t.GetAsDouble(i) != 0;
  return n;
}

Result<std::vector<TensorType>> InferNonZero(const OpContext& ctx) {
  const Tensor* x = ctx.value(0);
  if (x == nullptr) {
    return Status::Refused(
        StatusCode::kUnimplemented, kRefusalValueDependent,
        ctx.where() +
            ": data-dependent output shape: the output's shape depends on the values of "
            "input 0 ('" +
            ctx.node().inputs[0] +
            "'), which are known only at run time; a compiled cell needs that input structural (a "
            "constant, or folded from shapes)");
  }
  const int64_t rank = std::max<int64_t>(x->rank(), 1);
  return Single(DType::kInt64, {rank, CountNonZero(*x)});
}

Status RunNonZero(const OpContext& ctx, std::vector<Tensor>& outputs) {
  const Tensor& x = ctx.in(0);
  Tensor& out = outputs[0];
  const int64_t count = out.dim(1);
  if (CountNonZero(x) != count) {
    return Status::Internal(ctx.where() + ": input has " + std::to_string(CountNonZero(x)) +
                            " nonzero elements, the output was sized for " + std::to_string(count));
  }
  const Shape shape = x.rank() == 0 ? Shape{1} : x.shape();
  std::vector<int64_t> idx(shape.size(), 0);
  int64_t* dst = out.data<int64_t>();
  int64_t j = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    if (x.GetAsDouble(i) != 0) {
      for (size_t d = 0; d < shape.size(); ++d) dst[static_cast<int64_t>(d) * count + j] = idx[d];
      ++j;
    }
    NextIndex(idx, shape);
  }
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------
// OneHot (opset 9+): indices (any numeric, truncated), depth (a one-element constant), values
// [off, on]; the new axis of length depth goes at `axis`. Indices in [0, depth) are hot, and
// from opset 11 also [-depth, 0) (counting from the end); others give an all-off row, as each
// opset's spec says.

Status CheckOneHot(const Node& node, int64_t /*opset*/) {
  KILN_RETURN_IF_ERROR(CheckArity(node, 3, 3));
  if (node.HasAttr("axis")) KILN_RETURN_IF_ERROR(node.GetInt("axis").status());
  return Status::OK();
}

struct OneHotPlan {
  int64_t depth = 0, axis = 0;
  Shape out;
};

Result<OneHotPlan> PlanOneHot(const OpContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const Tensor* depth, ctx.RequireValue(1, "depth"));
  if (depth->numel() != 1 || depth->rank() > 1) {
    return Invalid(ctx, "input 1 ('depth') is " + depth->TypeString() +
                            ", expected a scalar or one-element vector");
  }
  if (ctx.type(2).shape != Shape{2}) {
    return Invalid(ctx, "input 2 ('values') is " + ctx.type(2).ToString() +
                            ", expected [off_value, on_value] of shape [2]");
  }
  OneHotPlan p;
  // A float depth truncates; one at or past 2^63 (or not finite) has no int64 value.
  const double d = depth->GetAsDouble(0);
  if (IsFloatDType(depth->dtype()) && !(d < 9223372036854775808.0)) {
    return RequestTooLarge(ctx.where() + ": depth " + std::to_string(d) +
                           " is past the int64 bound 9223372036854775807");
  }
  p.depth = IsFloatDType(depth->dtype()) ? static_cast<int64_t>(d) : depth->GetAsInt64(0);
  if (p.depth < 1) {
    return Invalid(ctx, "depth " + std::to_string(d) + " must be >= 1");
  }
  const Shape& in = ctx.type(0).shape;
  const int64_t rank = static_cast<int64_t>(in.size()) + 1;
  const int64_t axis = ctx.node().GetInt("axis", -1);
  if (axis < -rank || axis >= rank) {
    return Invalid(ctx, "attribute axis=" + std::to_string(axis) +
                            " is out of range for output rank " + std::to_string(rank) +
                            " (expected " + std::to_string(-rank) + " to " +
                            std::to_string(rank - 1) + ")");
  }
  p.axis = axis < 0 ? axis + rank : axis;
  p.out = in;
  p.out.insert(p.out.begin() + p.axis, p.depth);
  return p;
}

Result<std::vector<TensorType>> InferOneHot(const OpContext& ctx) {
  KILN_ASSIGN_OR_RETURN(OneHotPlan p, PlanOneHot(ctx));
  return Single(ctx.type(2).dtype, p.out);
}

Status RunOneHot(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_ASSIGN_OR_RETURN(OneHotPlan p, PlanOneHot(ctx));
  const Tensor& indices = ctx.in(0);
  Tensor& out = outputs[0];
  const size_t elem = DTypeSize(out.dtype());
  const auto* values = static_cast<const uint8_t*>(ctx.in(2).raw_data());
  auto* dst = static_cast<uint8_t*>(out.raw_data());
  for (int64_t i = 0; i < out.numel(); ++i) std::memcpy(dst + i * elem, values, elem);
  const int64_t outer = DimProduct(indices.shape(), 0, p.axis);
  const int64_t inner = DimProduct(indices.shape(), p.axis, indices.shape().size());
  const int64_t lowest = ctx.opset() >= 11 ? -p.depth : 0;
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      // Exactly the indices that truncate into [lowest, depth) (NaN and the out-of-range never
      // reach the conversion, which past int64 would be undefined).
      const double x = indices.GetAsDouble(o * inner + i);
      if (!(x > static_cast<double>(lowest) - 1 && x < static_cast<double>(p.depth))) continue;
      int64_t hot = static_cast<int64_t>(x);
      if (hot < lowest || hot >= p.depth) continue;
      if (hot < 0) hot += p.depth;
      std::memcpy(dst + ((o * p.depth + hot) * inner + i) * elem, values + elem, elem);
    }
  }
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------
// Trilu (opset 14+): keeps the upper (j - i >= k) or lower (j - i <= k) triangle of each matrix
// in the last two dims, zeroes the rest; k is an optional int64 scalar input read at run time.

Status CheckTrilu(const Node& node, int64_t /*opset*/) {
  KILN_RETURN_IF_ERROR(CheckArity(node, 1, 2));
  if (node.HasAttr("upper")) {
    KILN_ASSIGN_OR_RETURN(int64_t upper, node.GetInt("upper"));
    if (upper != 0 && upper != 1) {
      return Invalid(node, "attribute upper=" + std::to_string(upper) + " must be 0 or 1");
    }
  }
  return Status::OK();
}

Result<std::vector<TensorType>> InferTrilu(const OpContext& ctx) {
  if (ctx.type(0).shape.size() < 2) {
    return Invalid(ctx, "input is " + ctx.type(0).ToString() + ", expected rank >= 2");
  }
  if (ctx.present(1) &&
      (ctx.type(1).dtype != DType::kInt64 || NumElements(ctx.type(1).shape) != 1)) {
    return Invalid(ctx, "input 1 ('k') is " + ctx.type(1).ToString() + ", expected a scalar int64");
  }
  return Single(ctx.type(0).dtype, ctx.type(0).shape);
}

Status RunTrilu(const OpContext& ctx, std::vector<Tensor>& outputs) {
  const Tensor& x = ctx.in(0);
  const int64_t k = ctx.present(1) ? ctx.in(1).GetAsInt64(0) : 0;
  const bool upper = ctx.node().GetInt("upper", 1) != 0;
  const int64_t rows = x.dim(x.rank() - 2), cols = x.dim(x.rank() - 1);
  const int64_t mats = rows * cols == 0 ? 0 : x.numel() / (rows * cols);
  const size_t elem = DTypeSize(x.dtype());
  const auto* src = static_cast<const uint8_t*>(x.raw_data());
  auto* dst = static_cast<uint8_t*>(outputs[0].raw_data());
  for (int64_t m = 0; m < mats; ++m) {
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < cols; ++j) {
        const size_t off = static_cast<size_t>((m * rows + i) * cols + j) * elem;
        const bool keep = upper ? j - i >= k : j - i <= k;
        if (keep) {
          std::memcpy(dst + off, src + off, elem);
        } else {
          std::memset(dst + off, 0, elem);  // zero bytes are zero in every kiln dtype
        }
      }
    }
  }
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------
// EyeLike (opset 9+): a 2-D tensor shaped like the input with ones on diagonal k, of the `dtype`
// attribute's type (the input's when absent).

Status CheckEyeLike(const Node& node, int64_t /*opset*/) {
  KILN_RETURN_IF_ERROR(CheckArity(node, 1, 1));
  if (node.HasAttr("k")) KILN_RETURN_IF_ERROR(node.GetInt("k").status());
  if (node.HasAttr("dtype")) {
    KILN_ASSIGN_OR_RETURN(int64_t code, node.GetInt("dtype"));
    KILN_RETURN_IF_ERROR(DTypeFromOnnxCode(node, "dtype", code).status());
  }
  return Status::OK();
}

Result<std::vector<TensorType>> InferEyeLike(const OpContext& ctx) {
  if (ctx.type(0).shape.size() != 2) {
    return Invalid(ctx, "input is " + ctx.type(0).ToString() + ", expected rank 2");
  }
  DType dtype = ctx.type(0).dtype;
  if (ctx.node().HasAttr("dtype")) {
    KILN_ASSIGN_OR_RETURN(int64_t code, ctx.node().GetInt("dtype"));
    KILN_ASSIGN_OR_RETURN(dtype, DTypeFromOnnxCode(ctx.node(), "dtype", code));
  }
  return Single(dtype, ctx.type(0).shape);
}

Status RunEyeLike(const OpContext& ctx, std::vector<Tensor>& outputs) {
  Tensor& out = outputs[0];
  KILN_ASSIGN_OR_RETURN(std::vector<uint8_t> one, ElementBytes(1.0f, out.dtype()));
  const int64_t k = ctx.node().GetInt("k", 0);
  const int64_t rows = out.dim(0), cols = out.dim(1);
  if (out.numel() == 0) return Status::OK();  // rows may be 2^32 with no column
  auto* dst = static_cast<uint8_t*>(out.raw_data());
  std::memset(dst, 0, out.nbytes());
  for (int64_t i = 0; i < rows; ++i) {
    int64_t j = 0;
    if (__builtin_add_overflow(i, k, &j)) break;  // k near INT64_MAX: no diagonal here
    if (j >= 0 && j < cols) std::memcpy(dst + (i * cols + j) * one.size(), one.data(), one.size());
  }
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------
// DepthToSpace (mode DCR before opset 11, DCR or CRD from 11) and SpaceToDepth over NCHW:
//   DCR: out[n, c, h*b + i, w*b + j] = in[n, (i*b + j)*C' + c, h, w]
//   CRD: out[n, c, h*b + i, w*b + j] = in[n, c*b*b + i*b + j, h, w]
// and SpaceToDepth is the inverse of DCR.

Status CheckBlockOp(const Node& node, int64_t opset) {
  KILN_RETURN_IF_ERROR(CheckArity(node, 1, 1));
  KILN_ASSIGN_OR_RETURN(int64_t b, node.GetInt("blocksize"));
  if (b < 1) {
    return Invalid(node, "attribute blocksize=" + std::to_string(b) + " must be >= 1");
  }
  if (node.op_type == "DepthToSpace" && node.HasAttr("mode")) {
    KILN_ASSIGN_OR_RETURN(std::string mode, node.GetString("mode"));
    if (opset < 11) {
      return Invalid(node, "attribute mode='" + mode + "' is not part of opset " +
                               std::to_string(opset) + " (it arrived in opset 11)");
    }
    if (mode != "DCR" && mode != "CRD") {
      return Invalid(node, "attribute mode='" + mode + "' is not one of DCR, CRD");
    }
  }
  return Status::OK();
}

Result<std::vector<TensorType>> InferDepthToSpace(const OpContext& ctx) {
  const Shape& x = ctx.type(0).shape;
  const int64_t b = ctx.node().GetInt("blocksize", 1);
  if (x.size() != 4 || x[1] % (b * b) != 0) {
    return Invalid(ctx, "input " + Str(x) + " must be [N, C, H, W] with C divisible by " +
                            "blocksize^2=" + std::to_string(b * b));
  }
  return Single(ctx.type(0).dtype, {x[0], x[1] / (b * b), x[2] * b, x[3] * b});
}

Result<std::vector<TensorType>> InferSpaceToDepth(const OpContext& ctx) {
  const Shape& x = ctx.type(0).shape;
  const int64_t b = ctx.node().GetInt("blocksize", 1);
  if (x.size() != 4 || x[2] % b != 0 || x[3] % b != 0) {
    return Invalid(ctx, "input " + Str(x) + " must be [N, C, H, W] with H and W divisible by " +
                            "blocksize=" + std::to_string(b));
  }
  return Single(ctx.type(0).dtype, {x[0], x[1] * b * b, x[2] / b, x[3] / b});
}

// Copies between the depth layout [N, C*b*b, H, W] and the space layout [N, C, H*b, W*b].
Status RunBlockOp(const OpContext& ctx, std::vector<Tensor>& outputs) {
  const bool to_space = ctx.node().op_type == "DepthToSpace";
  const bool crd = to_space && ctx.opset() >= 11 && ctx.node().GetString("mode", "DCR") == "CRD";
  const int64_t b = ctx.node().GetInt("blocksize", 1);
  const Tensor& depth_t = to_space ? ctx.in(0) : outputs[0];
  const int64_t N = depth_t.dim(0), C = depth_t.dim(1) / (b * b), H = depth_t.dim(2),
                W = depth_t.dim(3);
  const size_t elem = DTypeSize(ctx.in(0).dtype());
  const auto* src = static_cast<const uint8_t*>(ctx.in(0).raw_data());
  auto* dst = static_cast<uint8_t*>(outputs[0].raw_data());
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t c = 0; c < C; ++c) {
      for (int64_t i = 0; i < b; ++i) {
        for (int64_t j = 0; j < b; ++j) {
          const int64_t dc = crd ? c * b * b + i * b + j : (i * b + j) * C + c;
          for (int64_t h = 0; h < H; ++h) {
            for (int64_t w = 0; w < W; ++w) {
              const int64_t depth_off = ((n * C * b * b + dc) * H + h) * W + w;
              const int64_t space_off = ((n * C + c) * H * b + h * b + i) * W * b + w * b + j;
              const int64_t from = to_space ? depth_off : space_off;
              const int64_t to = to_space ? space_off : depth_off;
              std::memcpy(dst + to * elem, src + from * elem, elem);
            }
          }
        }
      }
    }
  }
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------
// Einsum (opset 12+): a generic contraction. Each label gets one extent; an input whose dim is
// 1 where the label's extent is larger broadcasts (numpy's rule), a label repeated within one
// term walks the diagonal, "..." stands for the same leading broadcast dims in every term.
// Without "->" the output is the ellipsis dims then the labels used exactly once, in ASCII
// order. The loop runs over every output label, then every summed label, accumulating in double
// (float32) or int64 (integers); matmul-like float32 equations run as GEMMs instead.

constexpr int kEllipsis = -1;
constexpr int kLetters = 52;  // 'A'..'Z' then 'a'..'z': ids in ASCII order

struct EinsumEquation {
  std::vector<std::vector<int>> inputs;  // labels per term, kEllipsis where "..." stands
  std::vector<int> output;
  bool explicit_output = false;
};

Result<std::vector<int>> ParseEinsumTerm(const Node& node, const std::string& eq,
                                         const std::string& term) {
  std::vector<int> labels;
  bool ellipsis = false;
  for (size_t i = 0; i < term.size(); ++i) {
    const char ch = term[i];
    if (ch == ' ') continue;
    if (ch == '.') {
      if (ellipsis || term.compare(i, 3, "...") != 0) {
        return Invalid(node, "attribute equation='" + eq + "': term '" + term +
                                 "' has a '.' that is not a single '...'");
      }
      ellipsis = true;
      labels.push_back(kEllipsis);
      i += 2;
    } else if (ch >= 'A' && ch <= 'Z') {
      labels.push_back(ch - 'A');
    } else if (ch >= 'a' && ch <= 'z') {
      labels.push_back(26 + ch - 'a');
    } else {
      return Invalid(node, "attribute equation='" + eq + "': term '" + term + "' has character '" +
                               std::string(1, ch) + "', expected letters and '...'");
    }
  }
  return labels;
}

Result<EinsumEquation> ParseEinsum(const Node& node) {
  KILN_ASSIGN_OR_RETURN(std::string eq, node.GetString("equation"));
  EinsumEquation e;
  std::string lhs = eq, rhs;
  const size_t arrow = eq.find("->");
  if (arrow != std::string::npos) {
    lhs = eq.substr(0, arrow);
    rhs = eq.substr(arrow + 2);
    e.explicit_output = true;
    if (rhs.find("->") != std::string::npos) {
      return Invalid(node, "attribute equation='" + eq + "' has more than one '->'");
    }
  }
  size_t start = 0;
  while (true) {
    const size_t comma = lhs.find(',', start);
    KILN_ASSIGN_OR_RETURN(
        std::vector<int> t,
        ParseEinsumTerm(node, eq,
                        lhs.substr(start, comma == std::string::npos ? comma : comma - start)));
    e.inputs.push_back(std::move(t));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (e.inputs.size() != node.inputs.size()) {
    return Invalid(node, "attribute equation='" + eq + "' has " + std::to_string(e.inputs.size()) +
                             " input terms but the node has " + std::to_string(node.inputs.size()) +
                             " inputs");
  }
  std::array<int, kLetters> count{};
  bool any_ellipsis = false;
  for (const auto& t : e.inputs) {
    for (int l : t) {
      if (l == kEllipsis) {
        any_ellipsis = true;
      } else {
        ++count[l];
      }
    }
  }
  if (e.explicit_output) {
    KILN_ASSIGN_OR_RETURN(e.output, ParseEinsumTerm(node, eq, rhs));
    std::array<bool, kLetters> seen{};
    for (int l : e.output) {
      if (l == kEllipsis) {
        if (!any_ellipsis) {
          return Invalid(node,
                         "attribute equation='" + eq + "': the output has '...' but no input does");
        }
        continue;
      }
      const char name = static_cast<char>(l < 26 ? 'A' + l : 'a' + l - 26);
      if (count[l] == 0 || seen[l]) {
        return Invalid(node, "attribute equation='" + eq + "': output label '" +
                                 std::string(1, name) +
                                 (seen[l] ? "' appears twice" : "' appears in no input"));
      }
      seen[l] = true;
    }
  } else {
    if (any_ellipsis) e.output.push_back(kEllipsis);
    for (int l = 0; l < kLetters; ++l) {
      if (count[l] == 1) e.output.push_back(l);
    }
  }
  return e;
}

Status CheckEinsum(const Node& node, int64_t /*opset*/) {
  KILN_RETURN_IF_ERROR(CheckArity(node, 1, SIZE_MAX));
  return ParseEinsum(node).status();
}

// Labels resolved against input shapes: ids 0..51 letters, 52.. the ellipsis dims.
struct EinsumPlan {
  std::vector<int64_t> extent;                 // per label id; -1 when unused
  std::vector<int> out_labels, sum_labels;     // loop order: output labels, then summed ones
  std::vector<std::vector<int64_t>> strides;   // per input, per loop label (0: not indexed)
  std::vector<std::vector<int>> input_labels;  // per input, the label of each dim
  Shape out;
};

Result<EinsumPlan> PlanEinsum(const OpContext& ctx) {
  KILN_ASSIGN_OR_RETURN(EinsumEquation e, ParseEinsum(ctx.node()));
  const std::string eq = ctx.node().GetString("equation", "");
  const size_t n = e.inputs.size();
  // S1: each input's dims per label; the ellipsis covers the dims no letter names.
  int64_t ell_rank = 0;
  std::vector<std::vector<int>> dims_labels(n);  // label id per input dim
  for (size_t i = 0; i < n; ++i) {
    if (!ctx.present(i)) return Invalid(ctx, "input " + std::to_string(i) + " is absent");
    const int64_t rank = static_cast<int64_t>(ctx.type(i).shape.size());
    const auto& t = e.inputs[i];
    const bool has_ell = std::count(t.begin(), t.end(), kEllipsis) > 0;
    const int64_t letters = static_cast<int64_t>(t.size()) - (has_ell ? 1 : 0);
    if (has_ell ? rank < letters : rank != letters) {
      return Invalid(ctx, "attribute equation='" + eq + "': input " + std::to_string(i) + " " +
                              ctx.type(i).ToString() + " has rank " + std::to_string(rank) +
                              ", its term names " + std::to_string(letters) + " dims" +
                              (has_ell ? " plus '...'" : ""));
    }
    ell_rank = std::max(ell_rank, rank - letters);
  }
  EinsumPlan p;
  p.extent.assign(kLetters + ell_rank, -1);
  for (size_t i = 0; i < n; ++i) {
    const Shape& shape = ctx.type(i).shape;
    const int64_t this_ell = static_cast<int64_t>(shape.size()) -
                             (static_cast<int64_t>(e.inputs[i].size()) -
                              std::count(e.inputs[i].begin(), e.inputs[i].end(), kEllipsis));
    for (int l : e.inputs[i]) {
      if (l != kEllipsis) {
        dims_labels[i].push_back(l);
        continue;
      }
      for (int64_t j = 0; j < this_ell; ++j) {
        dims_labels[i].push_back(static_cast<int>(kLetters + ell_rank - this_ell + j));
      }
    }
    for (size_t d = 0; d < shape.size(); ++d) {
      int64_t& ext = p.extent[dims_labels[i][d]];
      if (ext == -1 || ext == 1) {
        ext = std::max<int64_t>(ext, shape[d]);
      } else if (shape[d] != ext && shape[d] != 1) {
        return Invalid(ctx, "attribute equation='" + eq + "': input " + std::to_string(i) + " " +
                                ctx.type(i).ToString() + " dim " + std::to_string(d) + " is " +
                                std::to_string(shape[d]) + " where the same label has extent " +
                                std::to_string(ext));
      }
    }
  }
  // S2: loop labels and the output shape.
  std::vector<bool> is_out(p.extent.size(), false);
  for (int l : e.output) {
    if (l == kEllipsis) {
      for (int64_t j = 0; j < ell_rank; ++j) p.out_labels.push_back(kLetters + j);
    } else {
      p.out_labels.push_back(l);
    }
  }
  for (int l : p.out_labels) {
    is_out[l] = true;
    p.out.push_back(p.extent[l]);
  }
  for (size_t l = 0; l < p.extent.size(); ++l) {
    if (p.extent[l] >= 0 && !is_out[l]) p.sum_labels.push_back(static_cast<int>(l));
  }
  // S3: per input, the element stride of each loop label (summed over repeats: the diagonal).
  std::vector<int> loop = p.out_labels;
  loop.insert(loop.end(), p.sum_labels.begin(), p.sum_labels.end());
  for (size_t i = 0; i < n; ++i) {
    const Shape& shape = ctx.type(i).shape;
    const std::vector<int64_t> cs = ContiguousStrides(shape);
    std::vector<int64_t> s(loop.size(), 0);
    for (size_t d = 0; d < shape.size(); ++d) {
      if (shape[d] == 1 && p.extent[dims_labels[i][d]] != 1) continue;  // broadcast
      const auto at = std::find(loop.begin(), loop.end(), dims_labels[i][d]) - loop.begin();
      s[at] += cs[d];
    }
    p.strides.push_back(std::move(s));
  }
  p.input_labels = std::move(dims_labels);
  return p;
}

Result<std::vector<TensorType>> InferEinsum(const OpContext& ctx) {
  const DType dtype = ctx.type(0).dtype;
  for (size_t i = 1; i < ctx.num_inputs(); ++i) {
    if (ctx.present(i) && ctx.type(i).dtype != dtype) {
      return Invalid(ctx, "input " + std::to_string(i) + " is " + ctx.type(i).ToString() +
                              ", expected " + DTypeName(dtype) + " like input 0");
    }
  }
  KILN_ASSIGN_OR_RETURN(EinsumPlan p, PlanEinsum(ctx));
  return Single(dtype, p.out);
}

template <typename T, typename Acc>
void EinsumLoop(const OpContext& ctx, const EinsumPlan& p, Tensor& out) {
  const size_t n = p.strides.size();
  std::vector<const T*> in(n);
  for (size_t i = 0; i < n; ++i) in[i] = ctx.in(i).data<T>();
  const size_t n_out = p.out_labels.size(), n_loop = n_out + p.sum_labels.size();
  std::vector<int64_t> ext(n_loop);
  for (size_t a = 0; a < n_loop; ++a) {
    ext[a] = p.extent[a < n_out ? p.out_labels[a] : p.sum_labels[a - n_out]];
  }
  int64_t sum_total = 1;
  for (size_t a = n_out; a < n_loop; ++a) sum_total *= ext[a];
  std::vector<int64_t> idx(n_loop, 0), off(n, 0);
  T* dst = out.data<T>();
  // Moves the odometer over axes [begin, end) one step, keeping `off` in step.
  auto advance = [&](size_t begin, size_t end) {
    for (size_t a = end; a-- > begin;) {
      for (size_t i = 0; i < n; ++i) off[i] += p.strides[i][a];
      if (++idx[a] < ext[a]) return;
      for (size_t i = 0; i < n; ++i) off[i] -= p.strides[i][a] * ext[a];
      idx[a] = 0;
    }
  };
  for (int64_t o = 0; o < out.numel(); ++o) {
    Acc acc = 0;
    for (int64_t s = 0; s < sum_total; ++s) {
      Acc prod = 1;
      for (size_t i = 0; i < n; ++i) prod *= static_cast<Acc>(in[i][off[i]]);
      acc += prod;
      advance(n_out, n_loop);
    }
    dst[o] = static_cast<T>(acc);
    advance(0, n_out);
  }
}

// The elements of `src` (dims labelled `labels`, extents from p) rearranged into label order
// `order`, which names the same labels.
std::vector<float> PermuteByLabels(const EinsumPlan& p, const float* src, const Shape& shape,
                                   const std::vector<int>& labels, const std::vector<int>& order) {
  const std::vector<int64_t> cs = ContiguousStrides(shape);
  Shape dims;
  std::vector<int64_t> strides;
  for (int l : order) {
    dims.push_back(p.extent[l]);
    strides.push_back(cs[std::find(labels.begin(), labels.end(), l) - labels.begin()]);
  }
  std::vector<float> out(static_cast<size_t>(NumElements(dims)));
  std::vector<int64_t> idx(dims.size(), 0);
  for (float& v : out) {
    int64_t off = 0;
    for (size_t d = 0; d < idx.size(); ++d) off += idx[d] * strides[d];
    v = src[off];
    NextIndex(idx, dims);
  }
  return out;
}

// Matmul-like equations (two float32 operands, no diagonal, no broadcast dim, no label summed
// within one operand) as GEMMs: every label is batch (both operands and the output), M or N (one
// operand and the output) or K (both operands, summed). The operands are permuted to
// [batch, M, K] and [batch, K, N], multiplied per batch, and the result permuted into the output
// order. Returns false, having written nothing, when the equation is not of that form.
Result<bool> EinsumAsGemm(const OpContext& ctx, const EinsumPlan& p, Tensor& out) {
  if (p.input_labels.size() != 2 || out.dtype() != DType::kFloat32 || out.numel() == 0) {
    return false;
  }
  std::array<std::vector<bool>, 2> has;
  for (size_t i = 0; i < 2; ++i) {
    const Shape& shape = ctx.in(i).shape();
    has[i].assign(p.extent.size(), false);
    for (size_t d = 0; d < shape.size(); ++d) {
      const int l = p.input_labels[i][d];
      if (has[i][l] || shape[d] != p.extent[l] || shape[d] == 0) return false;
      has[i][l] = true;
    }
  }
  std::vector<int> batch, m, n, k;
  for (int l : p.out_labels) {
    if (has[0][l] && has[1][l]) {
      batch.push_back(l);
    } else {
      (has[0][l] ? m : n).push_back(l);
    }
  }
  for (int l : p.sum_labels) {
    if (!has[0][l] || !has[1][l]) return false;
    k.push_back(l);
  }
  auto extent = [&](const std::vector<int>& labels) {
    int64_t e = 1;
    for (int l : labels) e *= p.extent[l];
    return e;
  };
  const int64_t B = extent(batch), M = extent(m), N = extent(n), K = extent(k);
  std::vector<int> a_order = batch, b_order = batch, c_order = batch;
  a_order.insert(a_order.end(), m.begin(), m.end());
  a_order.insert(a_order.end(), k.begin(), k.end());
  b_order.insert(b_order.end(), k.begin(), k.end());
  b_order.insert(b_order.end(), n.begin(), n.end());
  c_order.insert(c_order.end(), m.begin(), m.end());
  c_order.insert(c_order.end(), n.begin(), n.end());
  const std::vector<float> a =
      PermuteByLabels(p, ctx.in(0).data<float>(), ctx.in(0).shape(), p.input_labels[0], a_order);
  const std::vector<float> b =
      PermuteByLabels(p, ctx.in(1).data<float>(), ctx.in(1).shape(), p.input_labels[1], b_order);
  std::vector<float> c(static_cast<size_t>(B * M * N));
  for (int64_t i = 0; i < B; ++i) {
    KILN_RETURN_IF_ERROR(Sgemm(false, false, M, N, K, 1.0f, a.data() + i * M * K, K,
                               b.data() + i * K * N, N, 0.0f, c.data() + i * M * N, N,
                               ctx.num_threads())
                             .WithContext(ctx.where()));
  }
  Shape c_shape;
  for (int l : c_order) c_shape.push_back(p.extent[l]);
  const std::vector<float> y = PermuteByLabels(p, c.data(), c_shape, c_order, p.out_labels);
  std::copy(y.begin(), y.end(), out.data<float>());
  return true;
}

Status RunEinsum(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_ASSIGN_OR_RETURN(EinsumPlan p, PlanEinsum(ctx));
  KILN_ASSIGN_OR_RETURN(const bool done, EinsumAsGemm(ctx, p, outputs[0]));
  if (done) return Status::OK();
  switch (outputs[0].dtype()) {
    case DType::kFloat32:
      EinsumLoop<float, double>(ctx, p, outputs[0]);
      return Status::OK();
    case DType::kInt64:
      EinsumLoop<int64_t, int64_t>(ctx, p, outputs[0]);
      return Status::OK();
    case DType::kInt32:
      EinsumLoop<int32_t, int64_t>(ctx, p, outputs[0]);
      return Status::OK();
    case DType::kFloat64:
      EinsumLoop<double, double>(ctx, p, outputs[0]);
      return Status::OK();
    default:
      return UnsupportedDType(ctx, outputs[0].dtype(), "float32, int64, int32, float64");
  }
}

// The family's catalogue, one row per op and opset range.
inline constexpr size_t kIndexOpCount = 12;

}  // namespace

std::vector<OpDef> IndexOpDefs() {
  const std::array<OpDef, kIndexOpCount> table = {{
      {"GatherElements", "", 11, INT64_MAX, CheckAxisElements, InferGatherElements,
       RunGatherElements},
      {"ScatterElements", "", 11, INT64_MAX, CheckScatter, InferScatterElements,
       RunScatterElements},
      // Scatter (opset 9-10) is ScatterElements under its first name.
      {"Scatter", "", 9, 10, CheckScatter, InferScatterElements, RunScatterElements},
      {"GatherND", "", 11, INT64_MAX, CheckGatherND, InferGatherND, RunGatherND},
      {"ScatterND", "", 11, INT64_MAX, CheckScatter, InferScatterND, RunScatterND},
      {"NonZero", "", 9, INT64_MAX, CheckNonZero, InferNonZero, RunNonZero},
      {"OneHot", "", 9, INT64_MAX, CheckOneHot, InferOneHot, RunOneHot},
      {"Trilu", "", 14, INT64_MAX, CheckTrilu, InferTrilu, RunTrilu},
      {"EyeLike", "", 9, INT64_MAX, CheckEyeLike, InferEyeLike, RunEyeLike},
      {"DepthToSpace", "", 1, INT64_MAX, CheckBlockOp, InferDepthToSpace, RunBlockOp},
      {"SpaceToDepth", "", 1, INT64_MAX, CheckBlockOp, InferSpaceToDepth, RunBlockOp},
      {"Einsum", "", 12, INT64_MAX, CheckEinsum, InferEinsum, RunEinsum},
  }};
  return {table.begin(), table.end()};
}

}  // namespace kiln
