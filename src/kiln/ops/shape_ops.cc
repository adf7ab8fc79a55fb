// Shape and data-movement op family (ops layer): Reshape, Transpose, Concat, Split, Slice,
// Gather, Squeeze, Unsqueeze, Flatten, Expand, Pad, Shape, Size, Constant, ConstantOfShape,
// Identity, Dropout, Range, Tile. Resize and Upsample live in resize.cc.
//
// These kernels move bytes, so they work on every dtype through DTypeSize; only Range and the
// fill values of Pad/ConstantOfShape look at element types. Every op registers one OpDef whose
// check/infer/run read the legacy opset forms (attributes that later became inputs) by
// ctx.opset(). When an output shape depends on an input value (Reshape shape, Slice starts, ...)
// infer reads it with ctx.RequireValue, so static shape inference names the missing constant.
//
// Most kernels reduce to CopyByAxisTables: for each output axis a table gives, per output index,
// the element offset it reads from the input (or kFill for a padded position). Transpose, Slice,
// Expand, Tile, Pad and nearest Resize differ only in how they build those tables.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "src/kiln/ops/kernel_util.h"
#include "src/kiln/ops/plans.h"
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

// memcpy that tolerates zero-length copies from/to the null data of empty tensors.
void CopyBytes(void* dst, const void* src, size_t n) {
  if (n != 0) std::memcpy(dst, src, n);
}

// Copies all of `src` into the pre-allocated `dst`. REQUIRES: equal byte sizes (infer made them).
void CopyWhole(const Tensor& src, Tensor& dst) {
  KILN_CHECK(src.nbytes() == dst.nbytes());
  CopyBytes(dst.raw_data(), src.raw_data(), src.nbytes());
}

bool IsIntDType(DType t) { return t == DType::kInt64 || t == DType::kInt32; }

// Reads an integer input of rank <= 1 (shape, axes, pads, ...) whose value must be known.
Result<std::vector<int64_t>> IntsInput(const OpContext& ctx, size_t i, const std::string& role) {
  KILN_ASSIGN_OR_RETURN(const Tensor* t, ctx.RequireValue(i, role));
  if (!IsIntDType(t->dtype()) || t->rank() > 1) {
    return Invalid(ctx, "input " + std::to_string(i) + " ('" + role + "') is " + t->TypeString() +
                            ", expected a 1-D int64 tensor");
  }
  return t->ToInt64Vector();
}

// Like IntsInput for an optional input: nullopt when it is absent.
Result<std::optional<std::vector<int64_t>>> OptionalIntsInput(const OpContext& ctx, size_t i,
                                                              const std::string& role) {
  if (!ctx.present(i)) return std::optional<std::vector<int64_t>>();
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> v, IntsInput(ctx, i, role));
  return std::optional<std::vector<int64_t>>(std::move(v));
}

// The bytes of `value` converted to `dtype`, for fill values given as float attributes.
Result<std::vector<uint8_t>> ScalarBytes(double value, DType dtype) {
  const Tensor f = Tensor::Scalar<float>(static_cast<float>(value));
  KILN_ASSIGN_OR_RETURN(Tensor t, f.CastTo(dtype));
  const auto* p = static_cast<const uint8_t*>(t.raw_data());
  return std::vector<uint8_t>(p, p + t.nbytes());
}

// Normalizes a list of axes against `rank`, rejecting duplicates; `what` names the list.
Result<std::vector<int64_t>> NormalizeAxes(const OpContext& ctx, const std::vector<int64_t>& axes,
                                           int64_t rank, const std::string& what) {
  std::vector<int64_t> out;
  std::set<int64_t> seen;
  for (int64_t a : axes) {
    if (a < -rank || a >= rank) {
      return Invalid(ctx, what + " " + Str(axes) + ": axis " + std::to_string(a) +
                              " is out of range for rank " + std::to_string(rank));
    }
    const int64_t n = a < 0 ? a + rank : a;
    if (!seen.insert(n).second) {
      return Invalid(
          ctx, what + " " + Str(axes) + ": axis " + std::to_string(a) + " appears more than once");
    }
    out.push_back(n);
  }
  return out;
}

// Marks an output position that reads no input element (padding) in an axis table.
constexpr int64_t kFill = -1;

// Fills `out` so that out[o] = in[sum_d tables[d][o_d]] for every output index o in row-major
// order, or the element bytes `fill` when any tables[d][o_d] is kFill. tables[d] has one entry per
// index of output axis d (so out.shape()[d] == tables[d].size()); entries are element offsets into
// `in`. The innermost axis is copied as one block when its table is contiguous.
void CopyByAxisTables(const Tensor& in, const std::vector<std::vector<int64_t>>& tables,
                      const uint8_t* fill, Tensor& out) {
  const size_t elem = DTypeSize(in.dtype());
  const auto* src = static_cast<const uint8_t*>(in.raw_data());
  auto* dst = static_cast<uint8_t*>(out.raw_data());
  KILN_CHECK(out.rank() == static_cast<int64_t>(tables.size()));
  if (out.numel() == 0) return;
  if (tables.empty()) {  // scalar
    std::memcpy(dst, src, elem);
    return;
  }
  const size_t rank = tables.size();
  const std::vector<int64_t>& inner = tables.back();
  const int64_t inner_n = static_cast<int64_t>(inner.size());
  bool inner_contiguous = inner[0] != kFill;
  for (int64_t o = 1; o < inner_n && inner_contiguous; ++o) {
    inner_contiguous = inner[o] == inner[0] + o;
  }
  std::vector<size_t> idx(rank - 1, 0);
  const int64_t rows = out.numel() / inner_n;
  for (int64_t row = 0; row < rows; ++row) {
    int64_t base = 0;
    bool fill_row = false;
    for (size_t d = 0; d + 1 < rank; ++d) {
      const int64_t v = tables[d][idx[d]];
      if (v == kFill) fill_row = true;
      base += v;
    }
    uint8_t* row_dst = dst + static_cast<size_t>(row * inner_n) * elem;
    if (fill_row) {
      KILN_CHECK(fill != nullptr);
      for (int64_t o = 0; o < inner_n; ++o) std::memcpy(row_dst + o * elem, fill, elem);
    } else if (inner_contiguous) {
      std::memcpy(row_dst, src + static_cast<size_t>(base + inner[0]) * elem, inner_n * elem);
    } else {
      for (int64_t o = 0; o < inner_n; ++o) {
        const int64_t v = inner[o];
        if (v == kFill) KILN_CHECK(fill != nullptr);
        std::memcpy(row_dst + o * elem,
                    v == kFill ? fill : src + static_cast<size_t>(base + v) * elem, elem);
      }
    }
    for (size_t d = rank - 1; d-- > 0;) {  // odometer over the outer axes
      if (++idx[d] < tables[d].size()) break;
      idx[d] = 0;
    }
  }
}

// Product of shape[begin, end).
int64_t DimProduct(const Shape& shape, size_t begin, size_t end) {
  int64_t n = 1;
  for (size_t i = begin; i < end && i < shape.size(); ++i) n *= shape[i];
  return n;
}

Result<std::vector<TensorType>> Single(DType dtype, Shape shape) {
  return std::vector<TensorType>{{dtype, std::move(shape)}};
}

// Runs that copy input 0 unchanged into output 0 (Reshape, Flatten, Squeeze, Unsqueeze,
// Identity): only the shape differs, and infer decided it.
Status RunCopyInput0(const OpContext& ctx, std::vector<Tensor>& outputs) {
  CopyWhole(ctx.in(0), outputs[0]);
  return Status::OK();
}

// Identity: bytes are copied into the caller's buffer; a value that is not plain bytes (a
// sequence, an optional, a string tensor) is passed on as the same immutable handle.
Status RunIdentity(const OpContext& ctx, std::vector<Tensor>& outputs) {
  const Tensor& x = ctx.in(0);
  if (!x.is_tensor() || x.dtype() == DType::kString) {
    outputs[0] = x;
    return Status::OK();
  }
  CopyWhole(x, outputs[0]);
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------
// Reshape: opset 1-4 `shape` attribute, 5+ `shape` input, `allowzero` from 14.

Status CheckReshape(const Node& node, int64_t opset) {
  if (opset < 5) {
    KILN_RETURN_IF_ERROR(CheckArity(node, 1, 1));
    return node.GetInts("shape").status();
  }
  return CheckArity(node, 2, 2);
}

Result<std::vector<TensorType>> InferReshape(const OpContext& ctx) {
  std::vector<int64_t> requested;
  if (ctx.opset() < 5) {
    KILN_ASSIGN_OR_RETURN(requested, ctx.node().GetInts("shape"));
  } else {
    KILN_ASSIGN_OR_RETURN(requested, IntsInput(ctx, 1, "shape"));
  }
  const bool allowzero = ctx.opset() >= 14 && ctx.node().GetInt("allowzero", 0) != 0;
  const Shape& in = ctx.type(0).shape;
  const int64_t total = NumElements(in);
  const std::string what = "cannot reshape input shape " + Str(in) + " (" + std::to_string(total) +
                           " elements) to shape " + Str(requested);
  Shape out(requested.size());
  int64_t infer_at = -1;
  int64_t known = 1;
  for (size_t i = 0; i < requested.size(); ++i) {
    const int64_t v = requested[i];
    if (v == -1) {
      if (infer_at >= 0) return Invalid(ctx, what + ": more than one -1");
      infer_at = static_cast<int64_t>(i);
      continue;
    }
    if (v < -1) {
      return Invalid(ctx, what + ": dim " + std::to_string(i) + " is " + std::to_string(v) +
                              ", expected >= -1");
    }
    if (v == 0 && !allowzero) {
      if (i >= in.size()) {
        return Invalid(ctx, what + ": dim " + std::to_string(i) +
                                " is 0 (copy the input dim) but the input has rank " +
                                std::to_string(in.size()));
      }
      out[i] = in[i];
    } else {
      out[i] = v;
    }
    KILN_ASSIGN_OR_RETURN(known, CheckedMul(known, out[i], ctx.where() + ": " + what));
  }
  if (infer_at >= 0) {
    if (known == 0 || total % known != 0) {
      return Invalid(ctx, what + ": " + std::to_string(total) +
                              " elements do not divide into the known dims (product " +
                              std::to_string(known) + ")");
    }
    out[infer_at] = total / known;
  } else if (known != total) {
    return Invalid(ctx, what + " (" + std::to_string(known) + " elements)");
  }
  return Single(ctx.type(0).dtype, out);
}

// ---------------------------------------------------------------------------------------------
// Transpose: `perm` attribute, default reversed axes.

Result<std::vector<int64_t>> TransposePerm(const OpContext& ctx) {
  const int64_t rank = static_cast<int64_t>(ctx.type(0).shape.size());
  std::vector<int64_t> reversed(rank);
  for (int64_t i = 0; i < rank; ++i) reversed[i] = rank - 1 - i;
  std::vector<int64_t> perm = ctx.node().GetInts("perm", reversed);
  std::vector<bool> used(rank, false);
  bool valid = static_cast<int64_t>(perm.size()) == rank;
  for (size_t i = 0; valid && i < perm.size(); ++i) {
    valid = perm[i] >= 0 && perm[i] < rank && !used[perm[i]];
    if (valid) used[perm[i]] = true;
  }
  if (!valid) {
    return Invalid(ctx, "attribute 'perm' " + Str(perm) + " is not a permutation of the " +
                            std::to_string(rank) + " axes of input shape " +
                            Str(ctx.type(0).shape));
  }
  return perm;
}

Result<std::vector<TensorType>> InferTranspose(const OpContext& ctx) {
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> perm, TransposePerm(ctx));
  const Shape& in = ctx.type(0).shape;
  Shape out(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) out[i] = in[perm[i]];
  return Single(ctx.type(0).dtype, out);
}

Status RunTranspose(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> perm, TransposePerm(ctx));
  const Tensor& in = ctx.in(0);
  // Per-axis tables are as long as the output's dims, which an empty tensor may make huge.
  if (outputs[0].numel() == 0) return Status::OK();
  const std::vector<int64_t> strides = ContiguousStrides(in.shape());
  std::vector<std::vector<int64_t>> tables(perm.size());
  for (size_t d = 0; d < perm.size(); ++d) {
    for (int64_t o = 0; o < in.dim(perm[d]); ++o) tables[d].push_back(o * strides[perm[d]]);
  }
  CopyByAxisTables(in, tables, nullptr, outputs[0]);
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------
// Concat: `axis` attribute (required from opset 4, default 1 before), any dtype.

Result<int64_t> ConcatAxis(const OpContext& ctx) {
  int64_t axis = 1;
  if (ctx.opset() >= 4 || ctx.node().HasAttr("axis")) {
    KILN_ASSIGN_OR_RETURN(axis, ctx.node().GetInt("axis"));
  }
  auto a =
      NormalizeAxis(axis, static_cast<int64_t>(ctx.type(0).shape.size()),
                    ctx.where() + ": attribute 'axis' for input shape " + Str(ctx.type(0).shape));
  return a;
}

Result<std::vector<TensorType>> InferConcat(const OpContext& ctx) {
  KILN_ASSIGN_OR_RETURN(int64_t axis, ConcatAxis(ctx));
  const TensorType& first = ctx.type(0);
  Shape out = first.shape;
  out[axis] = 0;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    if (!ctx.present(i)) return Invalid(ctx, "input " + std::to_string(i) + " is empty");
    const TensorType& t = ctx.type(i);
    bool match = t.dtype == first.dtype && t.shape.size() == first.shape.size();
    for (size_t d = 0; match && d < t.shape.size(); ++d) {
      match = d == static_cast<size_t>(axis) || t.shape[d] == first.shape[d];
    }
    if (!match) {
      return Invalid(ctx, "input " + std::to_string(i) + " is " + t.ToString() +
                              ", which cannot be concatenated on axis " + std::to_string(axis) +
                              " with input 0 " + first.ToString() +
                              " (expected the same dtype and the same dims off the axis)");
    }
    KILN_ASSIGN_OR_RETURN(out[axis],
                          CheckedAdd(out[axis], t.shape[axis],
                                     ctx.where() + ": concatenated axis " + std::to_string(axis)));
  }
  return Single(first.dtype, out);
}

Status RunConcat(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_ASSIGN_OR_RETURN(int64_t axis, ConcatAxis(ctx));
  Tensor& out = outputs[0];
  const size_t elem = DTypeSize(out.dtype());
  const int64_t outer = DimProduct(out.shape(), 0, axis);
  const int64_t inner = DimProduct(out.shape(), axis + 1, out.shape().size());
  const size_t out_row = static_cast<size_t>(out.dim(axis) * inner) * elem;
  auto* dst = static_cast<uint8_t*>(out.raw_data());
  size_t offset = 0;  // bytes into each output row where the current input starts
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    const Tensor& in = ctx.in(i);
    const size_t in_row = static_cast<size_t>(in.dim(axis) * inner) * elem;
    const auto* src = static_cast<const uint8_t*>(in.raw_data());
    for (int64_t o = 0; o < outer; ++o) {
      CopyBytes(dst + o * out_row + offset, src + o * in_row, in_row);
    }
    offset += in_row;
  }
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------
// Split: `split` attribute until opset 12 (Split-1 also takes it as input 1), input from 13;
// `num_outputs` from 18. Without sizes the axis splits equally, the last chunk smaller when the
// dim does not divide (opset 18 semantics; earlier opsets only allowed even splits).

Status CheckSplit(const Node& node, int64_t opset) {
  const size_t max_inputs = (opset == 1 || opset >= 13) ? 2 : 1;
  return CheckArity(node, 1, max_inputs, SIZE_MAX);
}

struct SplitPlan {
  int64_t axis = 0;
  std::vector<int64_t> sizes;
};

Result<SplitPlan> PlanSplit(const OpContext& ctx) {
  const Shape& in = ctx.type(0).shape;
  SplitPlan plan;
  KILN_ASSIGN_OR_RETURN(plan.axis,
                        NormalizeAxis(ctx.node().GetInt("axis", 0), static_cast<int64_t>(in.size()),
                                      ctx.where() + ": attribute 'axis'"));
  const int64_t dim = in[plan.axis];
  const int64_t n = static_cast<int64_t>(ctx.node().outputs.size());
  std::optional<std::vector<int64_t>> split;
  if (ctx.opset() >= 13 || (ctx.opset() == 1 && ctx.present(1))) {
    KILN_ASSIGN_OR_RETURN(split, OptionalIntsInput(ctx, 1, "split"));
  } else if (ctx.node().HasAttr("split")) {
    KILN_ASSIGN_OR_RETURN(split, ctx.node().GetInts("split"));
  }
  if (ctx.opset() >= 18 && ctx.node().HasAttr("num_outputs")) {
    const int64_t num_outputs = ctx.node().GetInt("num_outputs", n);
    if (num_outputs != n) {
      return Invalid(ctx, "attribute num_outputs=" + std::to_string(num_outputs) +
                              " does not match the node's " + std::to_string(n) + " outputs");
    }
  }
  if (split) {
    int64_t sum = 0;
    bool overflow = false;  // sizes whose sum passes int64 split nothing
    for (int64_t s : *split) overflow = overflow || __builtin_add_overflow(sum, s, &sum);
    if (static_cast<int64_t>(split->size()) != n || overflow || sum != dim ||
        std::any_of(split->begin(), split->end(), [](int64_t s) { return s < 0; })) {
      return Invalid(ctx, "split " + Str(*split) + " does not split axis " +
                              std::to_string(plan.axis) + " of input shape " + Str(in) + " into " +
                              std::to_string(n) +
                              " outputs (expected that many non-negative sizes summing to " +
                              std::to_string(dim) + ")");
    }
    plan.sizes = *split;
    return plan;
  }
  const int64_t chunk = (dim + n - 1) / n;
  const int64_t last = dim - chunk * (n - 1);
  if (last < 0) {
    return Invalid(ctx, "cannot split axis " + std::to_string(plan.axis) + " of input shape " +
                            Str(in) + " into " + std::to_string(n) + " chunks of " +
                            std::to_string(chunk));
  }
  plan.sizes.assign(n, chunk);
  plan.sizes.back() = last;
  return plan;
}

Result<std::vector<TensorType>> InferSplit(const OpContext& ctx) {
  KILN_ASSIGN_OR_RETURN(SplitPlan plan, PlanSplit(ctx));
  std::vector<TensorType> types;
  for (int64_t s : plan.sizes) {
    Shape shape = ctx.type(0).shape;
    shape[plan.axis] = s;
    types.push_back({ctx.type(0).dtype, shape});
  }
  return types;
}

Status RunSplit(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_ASSIGN_OR_RETURN(SplitPlan plan, PlanSplit(ctx));
  const Tensor& in = ctx.in(0);
  const size_t elem = DTypeSize(in.dtype());
  const int64_t outer = DimProduct(in.shape(), 0, plan.axis);
  const int64_t inner = DimProduct(in.shape(), plan.axis + 1, in.shape().size());
  const size_t in_row = static_cast<size_t>(in.dim(plan.axis) * inner) * elem;
  const auto* src = static_cast<const uint8_t*>(in.raw_data());
  size_t offset = 0;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const size_t out_row = static_cast<size_t>(plan.sizes[i] * inner) * elem;
    auto* dst = static_cast<uint8_t*>(outputs[i].raw_data());
    for (int64_t o = 0; o < outer; ++o) {
      CopyBytes(dst + o * out_row, src + o * in_row + offset, out_row);
    }
    offset += out_row;
  }
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------
// Slice: opset 1-9 `starts`/`ends`/`axes` attributes; 10+ inputs starts, ends, axes, steps.

Status CheckSlice(const Node& node, int64_t opset) {
  if (opset < 10) {
    KILN_RETURN_IF_ERROR(CheckArity(node, 1, 1));
    KILN_RETURN_IF_ERROR(node.GetInts("starts").status());
    return node.GetInts("ends").status();
  }
  return CheckArity(node, 3, 5);
}

}  // namespace

Result<SlicePlan> PlanSlice(const OpContext& ctx) {
  const Shape& in = ctx.type(0).shape;
  const int64_t rank = static_cast<int64_t>(in.size());
  std::vector<int64_t> starts, ends;
  std::optional<std::vector<int64_t>> axes, steps;
  if (ctx.opset() < 10) {
    KILN_ASSIGN_OR_RETURN(starts, ctx.node().GetInts("starts"));
    KILN_ASSIGN_OR_RETURN(ends, ctx.node().GetInts("ends"));
    if (ctx.node().HasAttr("axes")) {
      KILN_ASSIGN_OR_RETURN(axes, ctx.node().GetInts("axes"));
    }
  } else {
    KILN_ASSIGN_OR_RETURN(starts, IntsInput(ctx, 1, "starts"));
    KILN_ASSIGN_OR_RETURN(ends, IntsInput(ctx, 2, "ends"));
    KILN_ASSIGN_OR_RETURN(axes, OptionalIntsInput(ctx, 3, "axes"));
    KILN_ASSIGN_OR_RETURN(steps, OptionalIntsInput(ctx, 4, "steps"));
  }
  if (!axes) {
    axes.emplace();
    for (size_t i = 0; i < starts.size(); ++i) axes->push_back(static_cast<int64_t>(i));
  }
  if (!steps) steps.emplace(starts.size(), 1);
  if (ends.size() != starts.size() || axes->size() != starts.size() ||
      steps->size() != starts.size()) {
    return Invalid(ctx, "starts " + Str(starts) + ", ends " + Str(ends) + ", axes " + Str(*axes) +
                            " and steps " + Str(*steps) + " must have the same length");
  }
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> norm_axes, NormalizeAxes(ctx, *axes, rank, "axes"));
  SlicePlan plan;
  plan.start.assign(rank, 0);
  plan.step.assign(rank, 1);
  plan.out = in;
  for (size_t i = 0; i < norm_axes.size(); ++i) {
    const int64_t a = norm_axes[i], dim = in[a], step = (*steps)[i];
    int64_t s = starts[i], e = ends[i];
    if (step == 0) {
      return Invalid(ctx, "steps " + Str(*steps) + " contains 0 for axis " + std::to_string(a));
    }
    if (s < 0) s += dim;  // no overflow: dim >= 0 and s < 0
    if (e < 0) e += dim;
    int64_t len = 0;
    if (step > 0) {
      s = std::clamp<int64_t>(s, 0, dim);
      e = std::clamp<int64_t>(e, 0, dim);
      len = e > s ? (e - s - 1) / step + 1 : 0;
    } else if (dim > 0) {
      s = std::clamp<int64_t>(s, 0, dim - 1);
      e = std::clamp<int64_t>(e, -1, dim - 1);
      const int64_t neg = step == INT64_MIN ? INT64_MAX : -step;
      len = s > e ? (s - e - 1) / neg + 1 : 0;
    }
    plan.start[a] = s;
    plan.step[a] = step;
    plan.out[a] = len;
  }
  return plan;
}

namespace {

Result<std::vector<TensorType>> InferSlice(const OpContext& ctx) {
  KILN_ASSIGN_OR_RETURN(SlicePlan plan, PlanSlice(ctx));
  return Single(ctx.type(0).dtype, plan.out);
}

Status RunSlice(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_ASSIGN_OR_RETURN(SlicePlan plan, PlanSlice(ctx));
  if (outputs[0].numel() == 0) return Status::OK();  // no tables as long as an empty dim
  const std::vector<int64_t> strides = ContiguousStrides(ctx.in(0).shape());
  std::vector<std::vector<int64_t>> tables(plan.out.size());
  for (size_t d = 0; d < plan.out.size(); ++d) {
    for (int64_t o = 0; o < plan.out[d]; ++o) {
      tables[d].push_back((plan.start[d] + o * plan.step[d]) * strides[d]);
    }
  }
  CopyByAxisTables(ctx.in(0), tables, nullptr, outputs[0]);
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------
// Gather: `axis` attribute; negative indices count from the end of the axis.

Result<int64_t> GatherAxis(const OpContext& ctx) {
  const Shape& data = ctx.type(0).shape;
  return NormalizeAxis(ctx.node().GetInt("axis", 0), static_cast<int64_t>(data.size()),
                       ctx.where() + ": attribute 'axis' for data shape " + Str(data));
}

Result<std::vector<TensorType>> InferGather(const OpContext& ctx) {
  const Shape& data = ctx.type(0).shape;
  if (!IsIntDType(ctx.type(1).dtype)) {
    return Invalid(ctx, "indices are " + ctx.type(1).ToString() + ", expected int64 or int32");
  }
  KILN_ASSIGN_OR_RETURN(int64_t axis, GatherAxis(ctx));
  Shape out(data.begin(), data.begin() + axis);
  out.insert(out.end(), ctx.type(1).shape.begin(), ctx.type(1).shape.end());
  out.insert(out.end(), data.begin() + axis + 1, data.end());
  return Single(ctx.type(0).dtype, out);
}

Status RunGather(const OpContext& ctx, std::vector<Tensor>& outputs) {
  const Tensor& data = ctx.in(0);
  KILN_ASSIGN_OR_RETURN(const int64_t axis, GatherAxis(ctx));
  const int64_t dim = data.dim(axis);
  std::vector<int64_t> indices = ctx.in(1).ToInt64Vector();
  for (size_t j = 0; j < indices.size(); ++j) {
    const int64_t idx = indices[j];
    if (idx < -dim || idx >= dim) {
      return Invalid(ctx, "index " + std::to_string(idx) + " (indices element " +
                              std::to_string(j) + ") is out of range for axis " +
                              std::to_string(axis) + " with dim " + std::to_string(dim) +
                              " of data shape " + Str(data.shape()) + " (expected " +
                              std::to_string(-dim) + " to " + std::to_string(dim - 1) + ")");
    }
    if (idx < 0) indices[j] = idx + dim;
  }
  const size_t elem = DTypeSize(data.dtype());
  const int64_t outer = DimProduct(data.shape(), 0, axis);
  const size_t block = static_cast<size_t>(DimProduct(data.shape(), axis + 1, data.rank())) * elem;
  const auto* src = static_cast<const uint8_t*>(data.raw_data());
  auto* dst = static_cast<uint8_t*>(outputs[0].raw_data());
  const int64_t n = static_cast<int64_t>(indices.size());
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t j = 0; j < n; ++j) {
      CopyBytes(dst + (o * n + j) * block, src + (o * dim + indices[j]) * block, block);
    }
  }
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------
// Squeeze / Unsqueeze: `axes` attribute until opset 12, input from 13.

Status CheckAxesAttrOrInput(const Node& node, int64_t opset) {
  return opset < 13 ? CheckArity(node, 1, 1) : CheckArity(node, 1, 2);
}

Result<std::optional<std::vector<int64_t>>> AxesAttrOrInput(const OpContext& ctx) {
  if (ctx.opset() >= 13) return OptionalIntsInput(ctx, 1, "axes");
  if (!ctx.node().HasAttr("axes")) return std::optional<std::vector<int64_t>>();
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> axes, ctx.node().GetInts("axes"));
  return std::optional<std::vector<int64_t>>(std::move(axes));
}

Result<std::vector<TensorType>> InferSqueeze(const OpContext& ctx) {
  const Shape& in = ctx.type(0).shape;
  KILN_ASSIGN_OR_RETURN(std::optional<std::vector<int64_t>> axes, AxesAttrOrInput(ctx));
  std::vector<bool> drop(in.size(), false);
  if (axes) {
    KILN_ASSIGN_OR_RETURN(std::vector<int64_t> norm,
                          NormalizeAxes(ctx, *axes, static_cast<int64_t>(in.size()), "axes"));
    for (int64_t a : norm) {
      if (in[a] != 1) {
        return Invalid(ctx, "axes " + Str(*axes) + ": axis " + std::to_string(a) +
                                " of input shape " + Str(in) + " has dim " + std::to_string(in[a]) +
                                ", expected 1");
      }
      drop[a] = true;
    }
  } else {
    for (size_t d = 0; d < in.size(); ++d) drop[d] = in[d] == 1;
  }
  Shape out;
  for (size_t d = 0; d < in.size(); ++d) {
    if (!drop[d]) out.push_back(in[d]);
  }
  return Single(ctx.type(0).dtype, out);
}

Result<std::vector<TensorType>> InferUnsqueeze(const OpContext& ctx) {
  const Shape& in = ctx.type(0).shape;
  KILN_ASSIGN_OR_RETURN(std::optional<std::vector<int64_t>> axes, AxesAttrOrInput(ctx));
  if (!axes) {
    return Invalid(ctx, ctx.opset() >= 13 ? "input 1 ('axes') is required but absent"
                                          : "required attribute 'axes' is missing");
  }
  const int64_t rank = static_cast<int64_t>(in.size() + axes->size());
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> norm, NormalizeAxes(ctx, *axes, rank, "axes"));
  std::vector<bool> inserted(rank, false);
  for (int64_t a : norm) inserted[a] = true;
  Shape out;
  size_t next = 0;
  for (int64_t d = 0; d < rank; ++d) out.push_back(inserted[d] ? 1 : in[next++]);
  return Single(ctx.type(0).dtype, out);
}

// ---------------------------------------------------------------------------------------------
// Flatten: 2-D [prod(dims before axis), prod(dims from axis)].

Result<std::vector<TensorType>> InferFlatten(const OpContext& ctx) {
  const Shape& in = ctx.type(0).shape;
  const int64_t rank = static_cast<int64_t>(in.size());
  int64_t axis = ctx.node().GetInt("axis", 1);
  if (axis < -rank || axis > rank) {
    return Invalid(ctx, "attribute axis=" + std::to_string(axis) + " is out of range for input " +
                            "shape " + Str(in) + " (expected " + std::to_string(-rank) + " to " +
                            std::to_string(rank) + ")");
  }
  if (axis < 0) axis += rank;
  // An empty input may have dims whose product on one side of the axis does not fit.
  Result<int64_t> outer = CheckedNumElements(Shape(in.begin(), in.begin() + axis));
  Result<int64_t> inner = CheckedNumElements(Shape(in.begin() + axis, in.end()));
  if (!outer.ok()) return outer.status().WithContext(ctx.where());
  if (!inner.ok()) return inner.status().WithContext(ctx.where());
  return Single(ctx.type(0).dtype, {*outer, *inner});
}

// ---------------------------------------------------------------------------------------------
// Expand (opset 8+): bidirectional broadcast of the input against the `shape` input.

Result<std::vector<TensorType>> InferExpand(const OpContext& ctx) {
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> shape, IntsInput(ctx, 1, "shape"));
  auto out = BroadcastShapes(ctx.type(0).shape, shape);
  if (!out.ok()) return out.status().WithContext(ctx.where() + ": cannot expand");
  return Single(ctx.type(0).dtype, *out);
}

// Tables reading `in` broadcast (numpy rules) to `out`.
std::vector<std::vector<int64_t>> BroadcastTables(const Shape& in, const Shape& out) {
  const std::vector<int64_t> strides = BroadcastStrides(in, out);
  std::vector<std::vector<int64_t>> tables(out.size());
  for (size_t d = 0; d < out.size(); ++d) {
    for (int64_t o = 0; o < out[d]; ++o) tables[d].push_back(o * strides[d]);
  }
  return tables;
}

Status RunExpand(const OpContext& ctx, std::vector<Tensor>& outputs) {
  if (outputs[0].numel() == 0) return Status::OK();  // no tables as long as an empty dim
  CopyByAxisTables(ctx.in(0), BroadcastTables(ctx.in(0).shape(), outputs[0].shape()), nullptr,
                   outputs[0]);
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------
// Tile (opset 6+): output dim d is input dim d times repeats[d].

Result<std::vector<TensorType>> InferTile(const OpContext& ctx) {
  const Shape& in = ctx.type(0).shape;
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> repeats, IntsInput(ctx, 1, "repeats"));
  if (repeats.size() != in.size() ||
      std::any_of(repeats.begin(), repeats.end(), [](int64_t r) { return r < 0; })) {
    return Invalid(ctx, "repeats " + Str(repeats) + " do not fit input shape " + Str(in) +
                            " (expected one non-negative count per axis)");
  }
  Shape out(in.size());
  for (size_t d = 0; d < in.size(); ++d) {
    KILN_ASSIGN_OR_RETURN(out[d], CheckedMul(in[d], repeats[d],
                                             ctx.where() + ": output dim " + std::to_string(d) +
                                                 " (input dim x repeats " + Str(repeats) + ")"));
  }
  return Single(ctx.type(0).dtype, out);
}

Status RunTile(const OpContext& ctx, std::vector<Tensor>& outputs) {
  const Shape& in = ctx.in(0).shape();
  if (outputs[0].numel() == 0) return Status::OK();  // no tables as long as an empty dim
  const std::vector<int64_t> strides = ContiguousStrides(in);
  std::vector<std::vector<int64_t>> tables(in.size());
  for (size_t d = 0; d < in.size(); ++d) {
    for (int64_t o = 0; o < outputs[0].dim(d); ++o) tables[d].push_back((o % in[d]) * strides[d]);
  }
  CopyByAxisTables(ctx.in(0), tables, nullptr, outputs[0]);
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------
// Pad: opset 1 `paddings` + `value` attributes, 2-10 `pads` + `value` attributes, 11+ inputs
// pads, constant_value (and axes from 18). Modes constant, reflect, edge, wrap. Negative pads
// crop.

Status CheckPad(const Node& node, int64_t opset) {
  if (opset < 11) {
    KILN_RETURN_IF_ERROR(CheckArity(node, 1, 1));
    KILN_RETURN_IF_ERROR(node.GetInts(opset == 1 ? "paddings" : "pads").status());
  } else {
    KILN_RETURN_IF_ERROR(CheckArity(node, 2, opset >= 18 ? 4 : 3));
  }
  const std::string mode = node.GetString("mode", "constant");
  if (mode != "constant" && mode != "reflect" && mode != "edge" && mode != "wrap") {
    return Invalid(node, "attribute mode='" + mode +
                             "' is not supported (expected constant, reflect, edge or wrap)");
  }
  return Status::OK();
}

struct PadPlan {
  std::string mode;
  std::vector<int64_t> begin, end;  // per input axis
  std::vector<uint8_t> fill;        // one element of the output dtype
  Shape out;
};

// `with_fill`: also read the fill value. Shape inference does not, because constant_value may be
// a runtime input or a weight, whose value is unknown until run.
Result<PadPlan> PlanPad(const OpContext& ctx, bool with_fill) {
  const Shape& in = ctx.type(0).shape;
  const DType dtype = ctx.type(0).dtype;
  const int64_t rank = static_cast<int64_t>(in.size());
  PadPlan plan;
  plan.mode = ctx.node().GetString("mode", "constant");
  std::vector<int64_t> pads;
  std::vector<int64_t> axes(rank);
  for (int64_t d = 0; d < rank; ++d) axes[d] = d;
  if (ctx.opset() < 11) {
    KILN_ASSIGN_OR_RETURN(pads, ctx.node().GetInts(ctx.opset() == 1 ? "paddings" : "pads"));
    KILN_ASSIGN_OR_RETURN(plan.fill, ScalarBytes(ctx.node().GetFloat("value", 0.0f), dtype));
  } else {
    KILN_ASSIGN_OR_RETURN(pads, IntsInput(ctx, 1, "pads"));
    if (ctx.present(2) && with_fill) {
      KILN_ASSIGN_OR_RETURN(const Tensor* value, ctx.RequireValue(2, "constant_value"));
      if (value->numel() != 1) {
        return Invalid(
            ctx, "input 2 ('constant_value') is " + value->TypeString() + ", expected one element");
      }
      KILN_ASSIGN_OR_RETURN(Tensor cast, value->CastTo(dtype));
      const auto* p = static_cast<const uint8_t*>(cast.raw_data());
      plan.fill.assign(p, p + cast.nbytes());
    } else {
      plan.fill.assign(DTypeSize(dtype), 0);
    }
    KILN_ASSIGN_OR_RETURN(std::optional<std::vector<int64_t>> given_axes,
                          OptionalIntsInput(ctx, 3, "axes"));
    if (given_axes) {
      KILN_ASSIGN_OR_RETURN(axes, NormalizeAxes(ctx, *given_axes, rank, "axes"));
    }
  }
  const size_t n = axes.size();
  if (pads.size() != 2 * n) {
    return Invalid(ctx, "pads " + Str(pads) + " has " + std::to_string(pads.size()) +
                            " values, expected " + std::to_string(2 * n) + " (begin and end for " +
                            std::to_string(n) + " axes of input shape " + Str(in) + ")");
  }
  plan.begin.assign(rank, 0);
  plan.end.assign(rank, 0);
  plan.out = in;
  for (size_t i = 0; i < n; ++i) {
    const int64_t a = axes[i];
    plan.begin[a] = pads[i];
    plan.end[a] = pads[i + n];
    int64_t grown = 0;
    if (__builtin_add_overflow(in[a], pads[i], &grown) ||
        __builtin_add_overflow(grown, pads[i + n], &plan.out[a])) {
      return RequestTooLarge(ctx.where() + ": pads " + Str(pads) + " grow axis " +
                             std::to_string(a) + " of input shape " + Str(in) +
                             " past the int64 bound");
    }
    if (plan.out[a] < 0) {
      return Invalid(ctx, "pads " + Str(pads) + " crop axis " + std::to_string(a) +
                              " of input shape " + Str(in) + " below zero");
    }
    if (plan.mode != "constant" && in[a] == 0 && plan.out[a] > 0) {
      return Invalid(ctx, "mode '" + plan.mode + "' cannot pad axis " + std::to_string(a) +
                              " of input shape " + Str(in) + ", which is empty");
    }
  }
  return plan;
}

Result<std::vector<TensorType>> InferPad(const OpContext& ctx) {
  KILN_ASSIGN_OR_RETURN(PadPlan plan, PlanPad(ctx, /*with_fill=*/false));
  return Single(ctx.type(0).dtype, plan.out);
}

// Index into [0, n) for position i reflected about the edges (numpy "reflect": edge not repeated).
int64_t ReflectIndex(int64_t i, int64_t n) {
  if (n == 1) return 0;
  const int64_t period = 2 * (n - 1);
  i = ((i % period) + period) % period;
  return i < n ? i : period - i;
}

Status RunPad(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_ASSIGN_OR_RETURN(PadPlan plan, PlanPad(ctx, /*with_fill=*/true));
  const Shape& in = ctx.in(0).shape();
  if (outputs[0].numel() == 0) return Status::OK();  // no tables as long as an empty dim
  const std::vector<int64_t> strides = ContiguousStrides(in);
  std::vector<std::vector<int64_t>> tables(in.size());
  for (size_t d = 0; d < in.size(); ++d) {
    const int64_t n = in[d];
    for (int64_t o = 0; o < plan.out[d]; ++o) {
      int64_t i = o - plan.begin[d];
      if (i < 0 || i >= n) {
        if (plan.mode == "constant") {
          tables[d].push_back(kFill);
          continue;
        }
        if (plan.mode == "edge") i = std::clamp<int64_t>(i, 0, n - 1);
        if (plan.mode == "reflect") i = ReflectIndex(i, n);
        if (plan.mode == "wrap") i = ((i % n) + n) % n;
      }
      tables[d].push_back(i * strides[d]);
    }
  }
  CopyByAxisTables(ctx.in(0), tables, plan.fill.data(), outputs[0]);
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------
// Shape (`start`/`end` from opset 15), Size.

Result<std::vector<TensorType>> InferShape(const OpContext& ctx) {
  const int64_t rank = static_cast<int64_t>(ctx.type(0).shape.size());
  int64_t start = 0, end = rank;
  if (ctx.opset() >= 15) {
    start = ctx.node().GetInt("start", 0);
    end = ctx.node().GetInt("end", rank);
  }
  if (start < 0) start += rank;
  if (end < 0) end += rank;
  start = std::clamp<int64_t>(start, 0, rank);
  end = std::clamp<int64_t>(end, 0, rank);
  return Single(DType::kInt64, {std::max<int64_t>(end - start, 0)});
}

Status RunShape(const OpContext& ctx, std::vector<Tensor>& outputs) {
  const Shape& in = ctx.in(0).shape();
  const int64_t rank = static_cast<int64_t>(in.size());
  int64_t start = ctx.opset() >= 15 ? ctx.node().GetInt("start", 0) : 0;
  if (start < 0) start += rank;
  start = std::clamp<int64_t>(start, 0, rank);
  auto* dst = outputs[0].data<int64_t>();
  for (int64_t i = 0; i < outputs[0].numel(); ++i) dst[i] = in[start + i];
  return Status::OK();
}

Result<std::vector<TensorType>> InferSize(const OpContext& ctx) {
  return Single(DType::kInt64, {});
}

Status RunSize(const OpContext& ctx, std::vector<Tensor>& outputs) {
  outputs[0].data<int64_t>()[0] = ctx.in(0).numel();
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------
// Constant: exactly one of value (tensor), value_float(s), value_int(s).

Result<Tensor> ConstantValue(const Node& node) {
  static const char* const kAttrs[] = {"value",         "value_float", "value_floats",
                                       "value_int",     "value_ints",  "value_string",
                                       "value_strings", "sparse_value"};
  std::string found;
  for (const char* a : kAttrs) {
    if (!node.HasAttr(a)) continue;
    if (!found.empty()) {
      return Invalid(node, "has both attributes '" + found + "' and '" + a +
                               "', expected exactly one value attribute");
    }
    found = a;
  }
  if (found.empty()) {
    return Invalid(node,
                   "has no value attribute (expected one of value, value_float, "
                   "value_floats, value_int, value_ints)");
  }
  if (found == "value") return node.GetTensor("value");
  if (found == "value_float") {
    KILN_ASSIGN_OR_RETURN(float f, node.GetFloat(found));
    return Tensor::Scalar<float>(f);
  }
  if (found == "value_floats") {
    KILN_ASSIGN_OR_RETURN(std::vector<float> v, node.GetFloats(found));
    return Tensor::FromVector<float>({static_cast<int64_t>(v.size())}, v);
  }
  if (found == "value_int") {
    KILN_ASSIGN_OR_RETURN(int64_t i, node.GetInt(found));
    return Tensor::Scalar<int64_t>(i);
  }
  if (found == "value_ints") {
    KILN_ASSIGN_OR_RETURN(std::vector<int64_t> v, node.GetInts(found));
    return Tensor::FromVector<int64_t>({static_cast<int64_t>(v.size())}, v);
  }
  return Status::Unimplemented(node.Describe() + ": attribute '" + found +
                               "' is not supported (kiln tensors hold no strings or sparse data)");
}

Status CheckConstant(const Node& node, int64_t opset) {
  KILN_RETURN_IF_ERROR(CheckArity(node, 0, 0));
  return ConstantValue(node).status();
}

Result<std::vector<TensorType>> InferConstant(const OpContext& ctx) {
  KILN_ASSIGN_OR_RETURN(Tensor t, ConstantValue(ctx.node()));
  return Single(t.dtype(), t.shape());
}

Status RunConstant(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_ASSIGN_OR_RETURN(Tensor t, ConstantValue(ctx.node()));
  CopyWhole(t, outputs[0]);
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------
// ConstantOfShape (opset 9+): `value` is a one-element tensor, default float32 0.

Result<Tensor> ConstantOfShapeValue(const OpContext& ctx) {
  if (!ctx.node().HasAttr("value")) return Tensor::Scalar<float>(0.0f);
  KILN_ASSIGN_OR_RETURN(Tensor v, ctx.node().GetTensor("value"));
  if (v.numel() != 1) {
    return Invalid(ctx, "attribute 'value' is " + v.TypeString() + ", expected one element");
  }
  return v;
}

Result<std::vector<TensorType>> InferConstantOfShape(const OpContext& ctx) {
  KILN_ASSIGN_OR_RETURN(Tensor value, ConstantOfShapeValue(ctx));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> shape, IntsInput(ctx, 0, "shape"));
  if (std::any_of(shape.begin(), shape.end(), [](int64_t d) { return d < 0; })) {
    return Invalid(ctx, "shape " + Str(shape) + " has a negative dim");
  }
  return Single(value.dtype(), shape);
}

Status RunConstantOfShape(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_ASSIGN_OR_RETURN(Tensor value, ConstantOfShapeValue(ctx));
  const size_t elem = value.nbytes();
  auto* dst = static_cast<uint8_t*>(outputs[0].raw_data());
  for (int64_t i = 0; i < outputs[0].numel(); ++i) {
    std::memcpy(dst + i * elem, value.raw_data(), elem);
  }
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------
// Dropout: output 0 copies the input and the optional mask is all true (bool from opset 10, the
// input dtype before), unless training_mode (an input from opset 12) is true with a ratio above
// 0: then each element is kept with probability 1 - ratio and scaled by 1 / (1 - ratio), the
// mask saying which were kept. Those draws come from kernel::Rng seeded by the node (attribute
// `seed`, else kiln's default), the same on every run and in a cell's host call.

Status CheckDropout(const Node& node, int64_t opset) {
  return CheckArity(node, 1, opset >= 12 ? 3 : 1, 2);
}

// The ratio when training_mode is true and drops something, else 0 (the inference form). A
// training_mode input must be known (a constant, or any value at run time): a compiled cell
// that could not see a runtime `true` would silently run the inference form. The ratio is
// structural (graph/ir.h IsShapeInput), so a compiled cell knows it.
Result<double> TrainingRatio(const OpContext& ctx) {
  if (ctx.opset() < 12 || !ctx.present(2)) return 0.0;
  KILN_ASSIGN_OR_RETURN(const Tensor* mode, ctx.RequireValue(2, "training_mode"));
  if (mode->numel() == 0 || mode->GetAsInt64(0) == 0) return 0.0;
  double ratio = 0.5;  // the default
  if (ctx.present(1)) {
    KILN_ASSIGN_OR_RETURN(const Tensor* r, ctx.RequireValue(1, "ratio"));
    if (r->numel() > 0) ratio = r->GetAsDouble(0);
  }
  if (!(ratio >= 0.0 && ratio < 1.0)) {
    return Status::InvalidArgument(ctx.where() + ": ratio " + std::to_string(ratio) +
                                   " is outside [0, 1)");
  }
  return ratio;
}

Result<std::vector<TensorType>> InferDropout(const OpContext& ctx) {
  KILN_ASSIGN_OR_RETURN(double ratio, TrainingRatio(ctx));
  if (ratio > 0.0 && !kernel::IsFloatLike(ctx.type(0).dtype)) {
    return UnsupportedDType(ctx, ctx.type(0).dtype, "float32, float64, float16, bfloat16");
  }
  std::vector<TensorType> types = {ctx.type(0)};
  if (ctx.node().outputs.size() > 1) {
    types.push_back({ctx.opset() >= 10 ? DType::kBool : ctx.type(0).dtype, ctx.type(0).shape});
  }
  return types;
}

Status RunDropout(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_ASSIGN_OR_RETURN(double ratio, TrainingRatio(ctx));
  if (ratio > 0.0) {
    kernel::Rng rng(kernel::NodeSeed(ctx.node()));
    std::vector<double> x = kernel::ToDoubles(ctx.in(0));
    std::vector<uint8_t> keep(x.size());
    const double scale = 1.0 / (1.0 - ratio);
    for (size_t i = 0; i < x.size(); ++i) {
      keep[i] = rng.Uniform() >= ratio ? 1 : 0;
      x[i] = keep[i] ? x[i] * scale : 0.0;
    }
    KILN_RETURN_IF_ERROR(kernel::StoreDoubles(x, outputs[0]));
    if (outputs.size() > 1) std::memcpy(outputs[1].raw_data(), keep.data(), keep.size());
    return Status::OK();
  }
  CopyWhole(ctx.in(0), outputs[0]);
  if (outputs.size() > 1) {
    Tensor& mask = outputs[1];
    KILN_ASSIGN_OR_RETURN(std::vector<uint8_t> one, ScalarBytes(1.0, mask.dtype()));
    auto* dst = static_cast<uint8_t*>(mask.raw_data());
    for (int64_t i = 0; i < mask.numel(); ++i) {
      std::memcpy(dst + i * one.size(), one.data(), one.size());
    }
  }
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------
// Range (opset 11+): start, limit, delta scalars of one dtype; length
// max(ceil((limit - start) / delta), 0).

Result<int64_t> RangeLength(const OpContext& ctx) {
  const char* kRoles[] = {"start", "limit", "delta"};
  const Tensor* v[3];
  for (size_t i = 0; i < 3; ++i) {
    KILN_ASSIGN_OR_RETURN(v[i], ctx.RequireValue(i, kRoles[i]));
    if (v[i]->numel() != 1 || v[i]->dtype() != v[0]->dtype()) {
      return Invalid(ctx, std::string("input ") + std::to_string(i) + " ('" + kRoles[i] + "') is " +
                              v[i]->TypeString() + ", expected a scalar " +
                              DTypeName(v[0]->dtype()) + " like 'start'");
    }
  }
  const DType dtype = v[0]->dtype();
  if (dtype != DType::kFloat32 && dtype != DType::kInt64 && dtype != DType::kInt32) {
    return UnsupportedDType(ctx, dtype, "float32, int64, int32");
  }
  if (v[2]->GetAsDouble(0) == 0) return Invalid(ctx, "delta is 0");
  const std::string what = ctx.where() + ": start " + std::to_string(v[0]->GetAsDouble(0)) +
                           ", limit " + std::to_string(v[1]->GetAsDouble(0)) + ", delta " +
                           std::to_string(v[2]->GetAsDouble(0)) + " give";
  if (dtype == DType::kFloat32) {
    const float start = v[0]->data<float>()[0], limit = v[1]->data<float>()[0];
    const float delta = v[2]->data<float>()[0];
    const double n = std::ceil(static_cast<double>(limit - start) / delta);
    if (std::isnan(n) || n <= 0) return int64_t{0};
    // 2^63 and past (infinity included) do not convert to int64.
    if (n >= 9223372036854775808.0) {
      return RequestTooLarge(what + " " + std::to_string(n) +
                             " elements, past the int64 bound 9223372036854775807");
    }
    return static_cast<int64_t>(n);
  }
  // The span is computed unsigned: limit - start of two int64 values always fits uint64.
  const int64_t start = v[0]->GetAsInt64(0), limit = v[1]->GetAsInt64(0);
  const int64_t delta = v[2]->GetAsInt64(0);
  const bool up = delta > 0;
  if (up ? limit <= start : start <= limit) return int64_t{0};
  const uint64_t span = up ? static_cast<uint64_t>(limit) - static_cast<uint64_t>(start)
                           : static_cast<uint64_t>(start) - static_cast<uint64_t>(limit);
  const uint64_t step = up ? static_cast<uint64_t>(delta) : 0 - static_cast<uint64_t>(delta);
  const uint64_t n = (span - 1) / step + 1;
  if (n > static_cast<uint64_t>(INT64_MAX)) {
    return RequestTooLarge(what + " " + std::to_string(n) +
                           " elements, past the int64 bound 9223372036854775807");
  }
  return static_cast<int64_t>(n);
}

Result<std::vector<TensorType>> InferRange(const OpContext& ctx) {
  KILN_ASSIGN_OR_RETURN(int64_t n, RangeLength(ctx));
  return Single(ctx.type(0).dtype, {n});
}

template <typename T>
void FillRange(const OpContext& ctx, Tensor& out) {
  const T start = ctx.in(0).data<T>()[0], delta = ctx.in(2).data<T>()[0];
  T* dst = out.data<T>();
  for (int64_t i = 0; i < out.numel(); ++i) {
    if constexpr (std::is_integral_v<T>) {
      // Every element lies between start and limit, but i * delta alone may not fit (start
      // INT64_MIN, delta 2^62): computed modulo 2^64, which gives the exact element.
      dst[i] = static_cast<T>(static_cast<uint64_t>(static_cast<int64_t>(start)) +
                              static_cast<uint64_t>(i) *
                                  static_cast<uint64_t>(static_cast<int64_t>(delta)));
    } else {
      dst[i] = static_cast<T>(start + i * delta);
    }
  }
}

Status RunRange(const OpContext& ctx, std::vector<Tensor>& outputs) {
  switch (outputs[0].dtype()) {
    case DType::kFloat32:
      FillRange<float>(ctx, outputs[0]);
      break;
    case DType::kInt64:
      FillRange<int64_t>(ctx, outputs[0]);
      break;
    case DType::kInt32:
      FillRange<int32_t>(ctx, outputs[0]);
      break;
    default:
      return UnsupportedDType(ctx, outputs[0].dtype(), "float32, int64, int32");
  }
  return Status::OK();
}

// Check functions for plain input/output counts.
template <size_t kMin, size_t kMax, size_t kMaxOutputs = 1>
Status CheckInputs(const Node& node, int64_t opset) {
  return CheckArity(node, kMin, kMax, kMaxOutputs);
}

}  // namespace

std::vector<OpDef> ShapeOpDefs() {
  std::vector<OpDef> defs;
  defs.push_back({"Reshape", "", 1, INT64_MAX, CheckReshape, InferReshape, RunCopyInput0});
  defs.push_back({"Transpose", "", 1, INT64_MAX, CheckInputs<1, 1>, InferTranspose, RunTranspose});
  defs.push_back({"Concat", "", 1, INT64_MAX, CheckInputs<1, SIZE_MAX>, InferConcat, RunConcat});
  defs.push_back({"Split", "", 1, INT64_MAX, CheckSplit, InferSplit, RunSplit});
  defs.push_back({"Slice", "", 1, INT64_MAX, CheckSlice, InferSlice, RunSlice});
  defs.push_back({"Gather", "", 1, INT64_MAX, CheckInputs<2, 2>, InferGather, RunGather});
  defs.push_back({"Squeeze", "", 1, INT64_MAX, CheckAxesAttrOrInput, InferSqueeze, RunCopyInput0});
  defs.push_back(
      {"Unsqueeze", "", 1, INT64_MAX, CheckAxesAttrOrInput, InferUnsqueeze, RunCopyInput0});
  defs.push_back({"Flatten", "", 1, INT64_MAX, CheckInputs<1, 1>, InferFlatten, RunCopyInput0});
  defs.push_back({"Expand", "", 8, INT64_MAX, CheckInputs<2, 2>, InferExpand, RunExpand});
  defs.push_back({"Tile", "", 6, INT64_MAX, CheckInputs<2, 2>, InferTile, RunTile});
  defs.push_back({"Pad", "", 1, INT64_MAX, CheckPad, InferPad, RunPad});
  defs.push_back({"Shape", "", 1, INT64_MAX, CheckInputs<1, 1>, InferShape, RunShape});
  defs.push_back({"Size", "", 1, INT64_MAX, CheckInputs<1, 1>, InferSize, RunSize});
  defs.push_back({"Constant", "", 1, INT64_MAX, CheckConstant, InferConstant, RunConstant});
  defs.push_back({"ConstantOfShape", "", 9, INT64_MAX, CheckInputs<1, 1>, InferConstantOfShape,
                  RunConstantOfShape});
  // Identity passes any value on: sequences, optionals and strings too.
  defs.push_back({"Identity", "", 1, INT64_MAX, CheckInputs<1, 1>, InferSameAsInput0, RunIdentity});
  defs.back().values = defs.back().strings = true;
  defs.push_back({"Dropout", "", 1, INT64_MAX, CheckDropout, InferDropout, RunDropout});
  defs.push_back({"Range", "", 11, INT64_MAX, CheckInputs<3, 3>, InferRange, RunRange});
  return defs;
}

}  // namespace kiln
