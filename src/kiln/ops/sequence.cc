// Sequence and optional op family (ops layer): SequenceEmpty, SequenceConstruct,
// SequenceInsert, SequenceAt, SequenceErase, SequenceLength, SplitToSequence,
// ConcatFromSequence, SequenceMap, Optional, OptionalHasElement and OptionalGetElement, each
// with its reference kernel.
//
// SequenceOpDefs is registered by OpRegistry::Global() (registry.cc). Sequences and optionals
// are Tensor handles of a non-tensor ValueKind (tensor/tensor.h): immutable, so an op that
// "changes" one builds a new handle sharing the untouched elements. These ops are the only
// ones that take such values (OpDef::values); they produce them by assigning their outputs
// (the interpreter hands an unallocated slot for every non-tensor output type). A tensor taken
// out of a sequence has a shape known only from the value, so static inference names the
// sequence as value-dependent and a compiled cell runs these nodes on the host.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "src/kiln/ops/kernel_util.h"
#include "src/kiln/ops/registry.h"
#include "src/kiln/tensor/packed_value.h"

namespace kiln {
namespace {

using kernel::BadAttr;

TensorType SequenceType(DType elem) { return {elem, {}, ValueKind::kSequence}; }

Status NotA(const OpContext& ctx, size_t i, const char* what) {
  return Status::InvalidArgument(ctx.where() + ": input " + std::to_string(i) + " is " +
                                 ctx.type(i).ToString() + ", expected " + what);
}

Status RequireSequence(const OpContext& ctx, size_t i) {
  if (ctx.type(i).kind != ValueKind::kSequence) return NotA(ctx, i, "a sequence");
  return Status::OK();
}

Status RequireTensor(const OpContext& ctx, size_t i) {
  if (ctx.type(i).kind != ValueKind::kTensor) return NotA(ctx, i, "a tensor");
  return Status::OK();
}

// A sequence input's value, or the value-dependent refusal static inference reports.
Result<const Tensor*> SequenceValue(const OpContext& ctx, size_t i) {
  KILN_RETURN_IF_ERROR(RequireSequence(ctx, i));
  if (ctx.value(i) == nullptr) {
    return Status::Refused(StatusCode::kUnimplemented, kRefusalValueDependent,
                           ctx.where() + ": input " + std::to_string(i) + " ('" +
                               ctx.node().inputs[i] +
                               "') is a sequence whose elements are known only at run time");
  }
  return ctx.value(i);
}

// A position input (scalar int32/int64) normalized into [0, bound] (`inclusive`, for insertion)
// or [0, bound).
Result<int64_t> Position(const OpContext& ctx, size_t i, int64_t count, bool inclusive) {
  KILN_ASSIGN_OR_RETURN(const Tensor* p, ctx.RequireValue(i, "position"));
  if (p->numel() != 1 || (p->dtype() != DType::kInt64 && p->dtype() != DType::kInt32)) {
    return Status::InvalidArgument(ctx.where() + ": position is " + p->TypeString() +
                                   ", expected one int32 or int64");
  }
  int64_t pos = p->GetAsInt64(0);
  const int64_t hi = inclusive ? count : count - 1;
  if (pos < -count || pos > hi) {
    return Status::InvalidArgument(ctx.where() + ": position " + std::to_string(pos) +
                                   " is outside [" + std::to_string(-count) + ", " +
                                   std::to_string(hi) + "] for a sequence of " +
                                   std::to_string(count));
  }
  return pos < 0 ? pos + count : pos;
}

// Puts `value` in output k: shares the handle (sequence items are immutable).
Status Put(const Tensor& value, std::vector<Tensor>& outputs, size_t k) {
  if (k < outputs.size()) outputs[k] = value;
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------
// SequenceEmpty (attribute dtype, float32 by default), SequenceConstruct, SequenceLength.

Result<DType> DTypeAttr(const Node& node) {
  if (!node.HasAttr("dtype")) return DType::kFloat32;
  KILN_ASSIGN_OR_RETURN(int64_t code, node.GetInt("dtype"));
  const std::optional<DType> t = DTypeFromOnnxElemType(code);
  if (!t) {
    return Status::Unimplemented(node.Describe() + ": dtype=" + std::to_string(code) + " (" +
                                 OnnxElemTypeName(code) + ") is not supported");
  }
  return *t;
}

Status CheckSequenceEmpty(const Node& node, int64_t) {
  KILN_RETURN_IF_ERROR(CheckArity(node, 0, 0));
  return DTypeAttr(node).status();
}

Result<std::vector<TensorType>> InferSequenceEmpty(const OpContext& ctx) {
  KILN_ASSIGN_OR_RETURN(DType dt, DTypeAttr(ctx.node()));
  return std::vector<TensorType>{SequenceType(dt)};
}

Status RunSequenceEmpty(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_ASSIGN_OR_RETURN(DType dt, DTypeAttr(ctx.node()));
  return Put(Tensor::Sequence(dt, {}), outputs, 0);
}

Status CheckSequenceConstruct(const Node& node, int64_t) { return CheckArity(node, 1, SIZE_MAX); }

Result<std::vector<TensorType>> InferSequenceConstruct(const OpContext& ctx) {
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    KILN_RETURN_IF_ERROR(RequireTensor(ctx, i));
    if (ctx.type(i).dtype != ctx.type(0).dtype) {
      return NotA(ctx, i, (std::string("a tensor of ") + DTypeName(ctx.type(0).dtype)).c_str());
    }
  }
  return std::vector<TensorType>{SequenceType(ctx.type(0).dtype)};
}

Status RunSequenceConstruct(const OpContext& ctx, std::vector<Tensor>& outputs) {
  std::vector<Tensor> items;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) items.push_back(ctx.in(i));
  return Put(Tensor::Sequence(ctx.type(0).dtype, std::move(items)), outputs, 0);
}

Result<std::vector<TensorType>> InferSequenceLength(const OpContext& ctx) {
  KILN_RETURN_IF_ERROR(RequireSequence(ctx, 0));
  return std::vector<TensorType>{{DType::kInt64, {}}};
}

Status RunSequenceLength(const OpContext& ctx, std::vector<Tensor>& outputs) {
  outputs[0].data<int64_t>()[0] = static_cast<int64_t>(ctx.in(0).items().size());
  return Status::OK();
}

Status CheckOne(const Node& node, int64_t) { return CheckArity(node, 1, 1); }

// ---------------------------------------------------------------------------------------------
// SequenceInsert (sequence, tensor, position = end), SequenceErase (sequence, position = last),
// SequenceAt (sequence, position).

Status CheckSequenceInsert(const Node& node, int64_t) { return CheckArity(node, 2, 3); }

Result<std::vector<TensorType>> InferSequenceInsert(const OpContext& ctx) {
  KILN_RETURN_IF_ERROR(RequireSequence(ctx, 0));
  KILN_RETURN_IF_ERROR(RequireTensor(ctx, 1));
  if (ctx.type(1).dtype != ctx.type(0).dtype) {
    return NotA(ctx, 1, (std::string("a tensor of ") + DTypeName(ctx.type(0).dtype)).c_str());
  }
  return std::vector<TensorType>{SequenceType(ctx.type(0).dtype)};
}

Status RunSequenceInsert(const OpContext& ctx, std::vector<Tensor>& outputs) {
  std::vector<Tensor> items = ctx.in(0).items();
  const int64_t n = static_cast<int64_t>(items.size());
  int64_t pos = n;
  if (ctx.present(2)) {
    KILN_ASSIGN_OR_RETURN(pos, Position(ctx, 2, n, /*inclusive=*/true));
  }
  items.insert(items.begin() + pos, ctx.in(1));
  return Put(Tensor::Sequence(ctx.type(0).dtype, std::move(items)), outputs, 0);
}

Status CheckSequenceErase(const Node& node, int64_t) { return CheckArity(node, 1, 2); }

Result<std::vector<TensorType>> InferSequenceErase(const OpContext& ctx) {
  KILN_RETURN_IF_ERROR(RequireSequence(ctx, 0));
  return std::vector<TensorType>{SequenceType(ctx.type(0).dtype)};
}

Status RunSequenceErase(const OpContext& ctx, std::vector<Tensor>& outputs) {
  std::vector<Tensor> items = ctx.in(0).items();
  const int64_t n = static_cast<int64_t>(items.size());
  if (n == 0) return Status::InvalidArgument(ctx.where() + ": the sequence is empty");
  int64_t pos = n - 1;
  if (ctx.present(1)) {
    KILN_ASSIGN_OR_RETURN(pos, Position(ctx, 1, n, /*inclusive=*/false));
  }
  items.erase(items.begin() + pos);
  return Put(Tensor::Sequence(ctx.type(0).dtype, std::move(items)), outputs, 0);
}

Status CheckSequenceAt(const Node& node, int64_t) { return CheckArity(node, 2, 2); }

Result<const Tensor*> ItemAt(const OpContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const Tensor* seq, SequenceValue(ctx, 0));
  const int64_t n = static_cast<int64_t>(seq->items().size());
  KILN_ASSIGN_OR_RETURN(int64_t pos, Position(ctx, 1, n, /*inclusive=*/false));
  return &seq->items()[static_cast<size_t>(pos)];
}

Result<std::vector<TensorType>> InferSequenceAt(const OpContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const Tensor* item, ItemAt(ctx));
  return std::vector<TensorType>{TypeOf(*item)};
}

Status RunSequenceAt(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_ASSIGN_OR_RETURN(const Tensor* item, ItemAt(ctx));
  return Put(*item, outputs, 0);
}

// ---------------------------------------------------------------------------------------------
// SplitToSequence (input, split?; attributes axis = 0, keepdims = 1): pieces along axis, of the
// sizes `split` gives (a scalar: equal pieces, the last smaller; a vector: those sizes), or of
// size 1 each without it (then keepdims=0 drops the axis).
// ConcatFromSequence (attributes axis, new_axis = 0): the elements joined along axis, or
// stacked along a new one.

Status CheckSplitToSequence(const Node& node, int64_t) {
  KILN_RETURN_IF_ERROR(CheckArity(node, 1, 2));
  KILN_RETURN_IF_ERROR(kernel::IntOr(node, "axis", 0).status());
  KILN_ASSIGN_OR_RETURN(int64_t keep, kernel::IntOr(node, "keepdims", 1));
  if (keep != 0 && keep != 1) return BadAttr(node, "keepdims", std::to_string(keep), "0 or 1");
  return Status::OK();
}

Result<std::vector<TensorType>> InferSplitToSequence(const OpContext& ctx) {
  KILN_RETURN_IF_ERROR(RequireTensor(ctx, 0));
  return std::vector<TensorType>{SequenceType(ctx.type(0).dtype)};
}

// Copies the slices [begin, end) along `axis` of `x` into a new tensor.
Result<Tensor> SliceAxis(const Tensor& x, int64_t axis, int64_t begin, int64_t end, bool keep) {
  const Shape& s = x.shape();
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= s[static_cast<size_t>(d)];
  for (size_t d = static_cast<size_t>(axis) + 1; d < s.size(); ++d) inner *= s[d];
  Shape out = s;
  out[static_cast<size_t>(axis)] = end - begin;
  if (!keep) out.erase(out.begin() + axis);
  KILN_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(x.dtype(), out));
  const int64_t extent = s[static_cast<size_t>(axis)];
  const int64_t len = end - begin;
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t k = 0; k < len * inner; ++k) {
      const int64_t from = (o * extent + begin) * inner + k;
      const int64_t to = o * len * inner + k;
      if (x.dtype() == DType::kString) {
        t.str(to) = x.str(from);
      } else {
        const size_t es = DTypeSize(x.dtype());
        std::memcpy(static_cast<char*>(t.raw_data()) + static_cast<size_t>(to) * es,
                    static_cast<const char*>(x.raw_data()) + static_cast<size_t>(from) * es, es);
      }
    }
  }
  return t;
}

Status RunSplitToSequence(const OpContext& ctx, std::vector<Tensor>& outputs) {
  const Tensor& x = ctx.in(0);
  KILN_ASSIGN_OR_RETURN(int64_t axis, NormalizeAxis(ctx.node().GetInt("axis", 0), x.rank(),
                                                    ctx.where() + ": attribute 'axis'"));
  const int64_t extent = x.dim(axis);
  std::vector<int64_t> sizes;
  bool keep = true;
  if (!ctx.present(1)) {
    sizes.assign(static_cast<size_t>(extent), 1);
    keep = ctx.node().GetInt("keepdims", 1) != 0;
  } else {
    const Tensor& split = ctx.in(1);
    const std::vector<int64_t> v = split.ToInt64Vector();
    if (split.rank() == 0) {
      if (v[0] <= 0) {
        return Status::InvalidArgument(ctx.where() + ": split " + std::to_string(v[0]) +
                                       " must be positive");
      }
      for (int64_t at = 0; at < extent; at += v[0]) sizes.push_back(std::min(v[0], extent - at));
    } else {
      int64_t total = 0;
      for (int64_t s : v) {
        if (s < 0) return Status::InvalidArgument(ctx.where() + ": split has a negative size");
        total += s;
      }
      if (total != extent) {
        return Status::InvalidArgument(ctx.where() + ": split " + ShapeToString(v) + " adds to " +
                                       std::to_string(total) + ", the axis has " +
                                       std::to_string(extent));
      }
      sizes = v;
    }
  }
  std::vector<Tensor> items;
  int64_t at = 0;
  for (int64_t s : sizes) {
    KILN_ASSIGN_OR_RETURN(Tensor piece, SliceAxis(x, axis, at, at + s, keep));
    items.push_back(std::move(piece));
    at += s;
  }
  return Put(Tensor::Sequence(x.dtype(), std::move(items)), outputs, 0);
}

Status CheckConcatFromSequence(const Node& node, int64_t) {
  KILN_RETURN_IF_ERROR(CheckArity(node, 1, 1));
  KILN_RETURN_IF_ERROR(node.GetInt("axis").status());
  KILN_ASSIGN_OR_RETURN(int64_t n, kernel::IntOr(node, "new_axis", 0));
  if (n != 0 && n != 1) return BadAttr(node, "new_axis", std::to_string(n), "0 or 1");
  return Status::OK();
}

// The joined shape and the normalized axis.
Result<std::pair<Shape, int64_t>> ConcatGeometry(const OpContext& ctx, const Tensor& seq) {
  if (seq.items().empty()) {
    return Status::InvalidArgument(ctx.where() + ": the sequence is empty (nothing to join)");
  }
  const bool new_axis = ctx.node().GetInt("new_axis", 0) != 0;
  const Shape& first = seq.items()[0].shape();
  const int64_t rank = static_cast<int64_t>(first.size()) + (new_axis ? 1 : 0);
  KILN_ASSIGN_OR_RETURN(int64_t axis, NormalizeAxis(ctx.node().GetInt("axis", 0), rank,
                                                    ctx.where() + ": attribute 'axis'"));
  Shape out = first;
  if (new_axis)
    out.insert(out.begin() + axis, 0);
  else
    out[static_cast<size_t>(axis)] = 0;
  for (const Tensor& t : seq.items()) {
    Shape s = t.shape();
    if (new_axis) s.insert(s.begin() + axis, 1);
    Shape a = s, b = out;
    a[static_cast<size_t>(axis)] = b[static_cast<size_t>(axis)] = 0;
    if (a != b) {
      return Status::InvalidArgument(ctx.where() + ": element " + t.TypeString() +
                                     " does not match " + seq.items()[0].TypeString() +
                                     " outside the joined axis");
    }
    out[static_cast<size_t>(axis)] += s[static_cast<size_t>(axis)];
  }
  return std::make_pair(out, axis);
}

Result<std::vector<TensorType>> InferConcatFromSequence(const OpContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const Tensor* seq, SequenceValue(ctx, 0));
  KILN_ASSIGN_OR_RETURN(auto geo, ConcatGeometry(ctx, *seq));
  return std::vector<TensorType>{{seq->dtype(), geo.first}};
}

Status RunConcatFromSequence(const OpContext& ctx, std::vector<Tensor>& outputs) {
  const Tensor& seq = ctx.in(0);
  KILN_ASSIGN_OR_RETURN(auto geo, ConcatGeometry(ctx, seq));
  const auto& [shape, axis] = geo;
  Tensor& out = outputs[0];
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= shape[static_cast<size_t>(d)];
  for (size_t d = static_cast<size_t>(axis) + 1; d < shape.size(); ++d) inner *= shape[d];
  const int64_t extent = shape[static_cast<size_t>(axis)];
  int64_t at = 0;
  for (const Tensor& t : seq.items()) {
    const int64_t len = t.numel() / std::max<int64_t>(1, outer * inner);
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t k = 0; k < len * inner; ++k) {
        const int64_t from = o * len * inner + k;
        const int64_t to = (o * extent + at) * inner + k;
        if (t.dtype() == DType::kString) {
          out.str(to) = t.str(from);
        } else {
          const size_t es = DTypeSize(t.dtype());
          std::memcpy(static_cast<char*>(out.raw_data()) + static_cast<size_t>(to) * es,
                      static_cast<const char*>(t.raw_data()) + static_cast<size_t>(from) * es, es);
        }
      }
    }
    at += len;
  }
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------
// SequenceMap (opset 17): runs `body` once per position of the sequence inputs (all of one
// length); the body takes that position's element of each sequence input and each tensor input
// whole, and each of its outputs becomes one output sequence.

Status CheckSequenceMap(const Node& node, int64_t) {
  KILN_RETURN_IF_ERROR(CheckArity(node, 1, SIZE_MAX, SIZE_MAX));
  auto it = node.attrs.find("body");
  if (it == node.attrs.end() || it->second.kind != Attribute::Kind::kGraph || !it->second.g) {
    return Status::InvalidArgument(node.Describe() + ": needs graph attribute 'body'");
  }
  const Graph& body = *it->second.g;
  if (body.inputs.size() != node.inputs.size() || body.outputs.size() != node.outputs.size()) {
    return Status::InvalidArgument(
        node.Describe() + ": body takes " + std::to_string(body.inputs.size()) +
        " inputs and gives " + std::to_string(body.outputs.size()) + " outputs; the node has " +
        std::to_string(node.inputs.size()) + " and " + std::to_string(node.outputs.size()));
  }
  return Status::OK();
}

Result<std::vector<TensorType>> InferSequenceMap(const OpContext& ctx) {
  KILN_RETURN_IF_ERROR(RequireSequence(ctx, 0));
  const Graph& body = *ctx.node().attrs.at("body").g;
  std::vector<TensorType> out;
  for (const ValueInfo& v : body.outputs) {
    if (!v.has_type) {
      return Status::Refused(
          StatusCode::kUnimplemented, kRefusalValueDependent,
          ctx.where() + ": body output '" + v.name + "' declares no type; known only at run time");
    }
    out.push_back(SequenceType(v.dtype));
  }
  return out;
}

Status RunSequenceMap(const OpContext& ctx, std::vector<Tensor>& outputs) {
  if (ctx.subgraphs() == nullptr) {
    return Status::Unimplemented(ctx.where() + ": subgraphs cannot be run here");
  }
  const Graph& body = *ctx.node().attrs.at("body").g;
  KILN_RETURN_IF_ERROR(RequireSequence(ctx, 0));
  const size_t count = ctx.in(0).items().size();
  for (size_t i = 1; i < ctx.num_inputs(); ++i) {
    if (ctx.type(i).kind == ValueKind::kSequence && ctx.in(i).items().size() != count) {
      return Status::InvalidArgument(ctx.where() + ": sequence input " + std::to_string(i) +
                                     " has " + std::to_string(ctx.in(i).items().size()) +
                                     " elements, input 0 has " + std::to_string(count));
    }
  }
  std::vector<std::vector<Tensor>> results(body.outputs.size());
  for (size_t pos = 0; pos < count; ++pos) {
    std::vector<Tensor> in;
    for (size_t i = 0; i < ctx.num_inputs(); ++i) {
      in.push_back(ctx.type(i).kind == ValueKind::kSequence ? ctx.in(i).items()[pos] : ctx.in(i));
    }
    auto out = ctx.subgraphs()->RunBody(body, in);
    if (!out.ok()) {
      return out.status().WithContext(ctx.where() + " body (position " + std::to_string(pos) + ")");
    }
    for (size_t k = 0; k < out->size(); ++k) results[k].push_back((*out)[k]);
  }
  for (size_t k = 0; k < results.size(); ++k) {
    DType dt = body.outputs[k].dtype;
    if (!results[k].empty()) dt = results[k][0].dtype();
    KILN_RETURN_IF_ERROR(Put(Tensor::Sequence(dt, std::move(results[k])), outputs, k));
  }
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------
// Optional (input?; attribute type when the input is absent), OptionalHasElement and
// OptionalGetElement. From opset 18 the latter two also take a plain tensor or sequence (which
// has its element) and, for OptionalHasElement, no input at all (which has none); kiln reads
// those forms at every opset.

Status CheckOptional(const Node& node, int64_t) {
  KILN_RETURN_IF_ERROR(CheckArity(node, 0, 1));
  if (!node.HasInput(0)) {
    auto it = node.attrs.find("type");
    if (it == node.attrs.end() || it->second.kind != Attribute::Kind::kType) {
      return Status::InvalidArgument(node.Describe() +
                                     ": without an input it needs attribute 'type'");
    }
    if (it->second.type_kind != ValueKind::kTensor &&
        it->second.type_kind != ValueKind::kSequence) {
      return Status::Unimplemented(node.Describe() + ": an optional of a " +
                                   ValueKindName(it->second.type_kind) + " is not supported");
    }
  }
  return Status::OK();
}

Result<TensorType> OptionalType(const OpContext& ctx) {
  if (ctx.present(0)) {
    const TensorType& t = ctx.type(0);
    if (t.kind != ValueKind::kTensor && t.kind != ValueKind::kSequence) {
      return NotA(ctx, 0, "a tensor or a sequence");
    }
    return TensorType{
        t.dtype,
        {},
        t.kind == ValueKind::kSequence ? ValueKind::kOptionalSequence : ValueKind::kOptionalTensor};
  }
  const Attribute& a = ctx.node().attrs.at("type");
  return TensorType{a.type_dtype,
                    {},
                    a.type_kind == ValueKind::kSequence ? ValueKind::kOptionalSequence
                                                        : ValueKind::kOptionalTensor};
}

Result<std::vector<TensorType>> InferOptional(const OpContext& ctx) {
  KILN_ASSIGN_OR_RETURN(TensorType t, OptionalType(ctx));
  return std::vector<TensorType>{t};
}

Status RunOptional(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_ASSIGN_OR_RETURN(TensorType t, OptionalType(ctx));
  const ValueKind inner =
      t.kind == ValueKind::kOptionalSequence ? ValueKind::kSequence : ValueKind::kTensor;
  return Put(Tensor::Optional(inner, t.dtype, ctx.present(0) ? ctx.in(0) : Tensor()), outputs, 0);
}

bool IsOptional(ValueKind k) {
  return k == ValueKind::kOptionalTensor || k == ValueKind::kOptionalSequence;
}

Status CheckHasElement(const Node& node, int64_t) { return CheckArity(node, 0, 1); }

Result<std::vector<TensorType>> InferHasElement(const OpContext&) {
  return std::vector<TensorType>{{DType::kBool, {}}};
}

Status RunHasElement(const OpContext& ctx, std::vector<Tensor>& outputs) {
  bool has = false;
  if (ctx.present(0)) has = !IsOptional(ctx.type(0).kind) || !ctx.in(0).items().empty();
  outputs[0].data<uint8_t>()[0] = has ? 1 : 0;
  return Status::OK();
}

Result<const Tensor*> Element(const OpContext& ctx) {
  if (!IsOptional(ctx.type(0).kind)) {
    if (ctx.value(0) == nullptr) return SequenceValue(ctx, 0);
    return ctx.value(0);
  }
  const Tensor* opt = ctx.value(0);
  if (opt == nullptr) {
    return Status::Refused(StatusCode::kUnimplemented, kRefusalValueDependent,
                           ctx.where() +
                               ": whether the optional holds a value is known only at "
                               "run time");
  }
  if (opt->items().empty()) {
    return Status::InvalidArgument(ctx.where() + ": the optional input holds no value");
  }
  return &opt->items()[0];
}

Result<std::vector<TensorType>> InferGetElement(const OpContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const Tensor* v, Element(ctx));
  return std::vector<TensorType>{TypeOf(*v)};
}

Status RunGetElement(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_ASSIGN_OR_RETURN(const Tensor* v, Element(ctx));
  return Put(*v, outputs, 0);
}

// ---------------------------------------------------------------------------------------------
// PackValue / UnpackValue (domain ai.kiln.internal): a value as bytes at a cell's boundary.

Result<Tensor> Unpacked(const OpContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const Tensor* bytes, ctx.RequireValue(0, "packed"));
  KILN_ASSIGN_OR_RETURN(int64_t kind, ctx.node().GetInt("kind"));
  KILN_ASSIGN_OR_RETURN(std::string dtype_name, ctx.node().GetString("dtype"));
  KILN_ASSIGN_OR_RETURN(DType dtype, DTypeFromName(dtype_name));
  if (kind < 0 || kind > static_cast<int64_t>(ValueKind::kOptionalSequence)) {
    return BadAttr(ctx.node(), "kind", std::to_string(kind), "a value kind");
  }
  auto v = UnpackValue(*bytes, static_cast<ValueKind>(kind), dtype);
  if (!v.ok()) return v.status().WithContext(ctx.where());
  return v;
}

Result<std::vector<TensorType>> InferUnpack(const OpContext& ctx) {
  KILN_ASSIGN_OR_RETURN(Tensor v, Unpacked(ctx));
  return std::vector<TensorType>{TypeOf(v)};
}

Status RunUnpack(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_ASSIGN_OR_RETURN(Tensor v, Unpacked(ctx));
  return Put(v, outputs, 0);
}

Result<std::vector<TensorType>> InferPack(const OpContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const Tensor* v, ctx.RequireValue(0, "value"));
  KILN_ASSIGN_OR_RETURN(Tensor packed, PackValue(*v));
  return std::vector<TensorType>{TypeOf(packed)};
}

Status RunPack(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_ASSIGN_OR_RETURN(Tensor packed, PackValue(ctx.in(0)));
  return kernel::Deliver(packed, outputs[0]);
}

}  // namespace

std::vector<OpDef> SequenceOpDefs() {
  constexpr int64_t kMax = INT64_MAX;
  std::vector<OpDef> defs = {
      {"SequenceEmpty", "", 11, kMax, CheckSequenceEmpty, InferSequenceEmpty, RunSequenceEmpty},
      {"SequenceConstruct", "", 11, kMax, CheckSequenceConstruct, InferSequenceConstruct,
       RunSequenceConstruct},
      {"SequenceInsert", "", 11, kMax, CheckSequenceInsert, InferSequenceInsert, RunSequenceInsert},
      {"SequenceAt", "", 11, kMax, CheckSequenceAt, InferSequenceAt, RunSequenceAt},
      {"SequenceErase", "", 11, kMax, CheckSequenceErase, InferSequenceErase, RunSequenceErase},
      {"SequenceLength", "", 11, kMax, CheckOne, InferSequenceLength, RunSequenceLength},
      {"SplitToSequence", "", 11, kMax, CheckSplitToSequence, InferSplitToSequence,
       RunSplitToSequence},
      {"ConcatFromSequence", "", 11, kMax, CheckConcatFromSequence, InferConcatFromSequence,
       RunConcatFromSequence},
      {"SequenceMap", "", 17, kMax, CheckSequenceMap, InferSequenceMap, RunSequenceMap},
      {"Optional", "", 15, kMax, CheckOptional, InferOptional, RunOptional},
      {"OptionalHasElement", "", 15, kMax, CheckHasElement, InferHasElement, RunHasElement},
      {"OptionalGetElement", "", 15, kMax, CheckOne, InferGetElement, RunGetElement},
      {kPackValueOp, kInternalDomain, 1, kMax, CheckOne, InferPack, RunPack},
      {kUnpackValueOp, kInternalDomain, 1, kMax, CheckOne, InferUnpack, RunUnpack},
  };
  for (OpDef& d : defs) {
    d.values = true;
    d.strings = true;
  }
  return defs;
}

}  // namespace kiln
