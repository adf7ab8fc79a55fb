// Tensor op family (ops layer): selection and reordering (Compress, ReverseSequence, Unique),
// conversion (CastLike, DynamicQuantizeLinear) and text (TfIdfVectorizer, StringNormalizer),
// each with its reference kernel.
//
// TensorOpDefs is registered by OpRegistry::Global() (registry.cc). Compress and Unique have
// output shapes that depend on input values: their infer computes the selection from the values
// (always known in eager; a compiled cell runs them in its dynamic region when they are not
// structural). Element movement is by bytes, so those ops take every fixed-size dtype.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "src/kiln/ops/kernel_util.h"
#include "src/kiln/ops/registry.h"

namespace kiln {
namespace {

using kernel::BadAttr;
using kernel::BadInputShape;

Status ValueDependent(const OpContext& ctx, size_t input, const char* what) {
  return Status::Refused(StatusCode::kUnimplemented, kRefusalValueDependent,
                         ctx.where() + ": data-dependent output shape: " + what +
                             " depends on the values of input " + std::to_string(input) + " ('" +
                             ctx.node().inputs[input] + "'), known only at run time");
}

// [outer, axis, inner] view of a shape around `axis`.
struct AxisSplit {
  int64_t outer = 1, extent = 1, inner = 1;
};
AxisSplit SplitAt(const Shape& s, int64_t axis) {
  AxisSplit a;
  for (int64_t d = 0; d < axis; ++d) a.outer *= s[static_cast<size_t>(d)];
  a.extent = s[static_cast<size_t>(axis)];
  for (size_t d = static_cast<size_t>(axis) + 1; d < s.size(); ++d) a.inner *= s[d];
  return a;
}

// ---------------------------------------------------------------------------------------------
// Compress (opset 9, 11): keeps the slices along `axis` (or the elements of the flattened input
// when there is no axis) whose condition is true; condition may be shorter than the extent
// (the rest are dropped).

Status CheckCompress(const Node& node, int64_t) {
  KILN_RETURN_IF_ERROR(CheckArity(node, 2, 2));
  if (node.HasAttr("axis")) KILN_RETURN_IF_ERROR(node.GetInt("axis").status());
  return Status::OK();
}

// The normalized axis, or -1 for the flattened form.
Result<int64_t> CompressAxis(const OpContext& ctx) {
  if (!ctx.node().HasAttr("axis")) return -1;
  const int64_t rank = static_cast<int64_t>(ctx.type(0).shape.size());
  return NormalizeAxis(ctx.node().GetInt("axis", 0), rank, ctx.where() + ": attribute 'axis'");
}

Result<std::vector<int64_t>> CompressKept(const OpContext& ctx, int64_t extent) {
  if (ctx.type(1).dtype != DType::kBool) return UnsupportedDType(ctx, ctx.type(1).dtype, "bool");
  if (ctx.type(1).shape.size() != 1) return BadInputShape(ctx, 1, "condition", "1-D");
  const Tensor* cond = ctx.value(1);
  if (cond == nullptr) return ValueDependent(ctx, 1, "the number of kept slices");
  if (cond->numel() > extent) {
    return BadInputShape(ctx, 1, "condition", "at most " + std::to_string(extent) + " elements");
  }
  std::vector<int64_t> kept;
  const uint8_t* c = cond->data<uint8_t>();
  for (int64_t i = 0; i < cond->numel(); ++i) {
    if (c[i]) kept.push_back(i);
  }
  return kept;
}

Result<std::vector<TensorType>> InferCompress(const OpContext& ctx) {
  KILN_ASSIGN_OR_RETURN(int64_t axis, CompressAxis(ctx));
  const Shape& s = ctx.type(0).shape;
  const int64_t extent = axis < 0 ? NumElements(s) : s[static_cast<size_t>(axis)];
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> kept, CompressKept(ctx, extent));
  Shape out = axis < 0 ? Shape{0} : s;
  out[static_cast<size_t>(std::max<int64_t>(axis, 0))] = static_cast<int64_t>(kept.size());
  return std::vector<TensorType>{{ctx.type(0).dtype, out}};
}

Status RunCompress(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_ASSIGN_OR_RETURN(int64_t axis, CompressAxis(ctx));
  const Tensor& x = ctx.in(0);
  const AxisSplit a = axis < 0 ? AxisSplit{1, x.numel(), 1} : SplitAt(x.shape(), axis);
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> kept, CompressKept(ctx, a.extent));
  const size_t es = DTypeSize(x.dtype());
  const size_t row = static_cast<size_t>(a.inner) * es;
  const char* src = static_cast<const char*>(x.raw_data());
  char* dst = static_cast<char*>(outputs[0].raw_data());
  for (int64_t o = 0; o < a.outer; ++o) {
    for (int64_t k : kept) {
      std::memcpy(dst, src + static_cast<size_t>(o * a.extent + k) * row, row);
      dst += row;
    }
  }
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------
// ReverseSequence (opset 10): reverses the first sequence_lens[b] elements along time_axis for
// each b along batch_axis (the axes are 0 and 1, either way round).

Status CheckReverseSequence(const Node& node, int64_t) {
  KILN_RETURN_IF_ERROR(CheckArity(node, 2, 2));
  KILN_ASSIGN_OR_RETURN(int64_t t, kernel::IntOr(node, "time_axis", 0));
  KILN_ASSIGN_OR_RETURN(int64_t b, kernel::IntOr(node, "batch_axis", 1));
  if (!((t == 0 && b == 1) || (t == 1 && b == 0))) {
    return Status::InvalidArgument(node.Describe() + ": time_axis=" + std::to_string(t) +
                                   " and batch_axis=" + std::to_string(b) +
                                   " are invalid (expected 0 and 1, either way round)");
  }
  return Status::OK();
}

Result<std::vector<TensorType>> InferReverseSequence(const OpContext& ctx) {
  const Shape& s = ctx.type(0).shape;
  if (s.size() < 2) return BadInputShape(ctx, 0, "input", "rank >= 2");
  const int64_t b = ctx.node().GetInt("batch_axis", 1);
  KILN_RETURN_IF_ERROR(kernel::RequireIntegerInput(ctx, 1));
  if (ctx.type(1).shape != Shape{s[static_cast<size_t>(b)]}) {
    return BadInputShape(ctx, 1, "sequence_lens",
                         "[" + std::to_string(s[static_cast<size_t>(b)]) + "]");
  }
  return std::vector<TensorType>{ctx.type(0)};
}

Status RunReverseSequence(const OpContext& ctx, std::vector<Tensor>& outputs) {
  const Tensor& x = ctx.in(0);
  const int64_t time_axis = ctx.node().GetInt("time_axis", 0);
  const Shape& s = x.shape();
  const int64_t steps = s[static_cast<size_t>(time_axis)];
  const int64_t batch = s[static_cast<size_t>(1 - time_axis)];
  const int64_t inner = NumElements(Shape(s.begin() + 2, s.end()));
  const std::vector<int64_t> lens = ctx.in(1).ToInt64Vector();
  const size_t es = DTypeSize(x.dtype());
  const char* src = static_cast<const char*>(x.raw_data());
  char* dst = static_cast<char*>(outputs[0].raw_data());
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t len = lens[static_cast<size_t>(b)];
    if (len < 0 || len > steps) {
      return Status::InvalidArgument(ctx.where() + ": sequence_lens[" + std::to_string(b) +
                                     "] = " + std::to_string(len) + " is outside [0, " +
                                     std::to_string(steps) + "]");
    }
    for (int64_t t = 0; t < steps; ++t) {
      const int64_t from = t < len ? len - 1 - t : t;
      auto offset = [&](int64_t step) {
        const int64_t i = time_axis == 0 ? step * batch + b : b * steps + step;
        return static_cast<size_t>(i * inner) * es;
      };
      std::memcpy(dst + offset(t), src + offset(from), static_cast<size_t>(inner) * es);
    }
  }
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------
// Unique (opset 11): the distinct elements (or slices along `axis`) of X, in ascending order when
// sorted=1 (lexicographic for slices), else in order of first occurrence; with each one's first
// index, each input's index into Y, and the counts (all int64).

struct UniqueResult {
  std::vector<int64_t> first;    // per unique: index of its first occurrence
  std::vector<int64_t> inverse;  // per input slice: index of its unique
  std::vector<int64_t> counts;
  AxisSplit split;
};

Status CheckUnique(const Node& node, int64_t) {
  KILN_RETURN_IF_ERROR(CheckArity(node, 1, 1, 4));
  KILN_ASSIGN_OR_RETURN(int64_t sorted, kernel::IntOr(node, "sorted", 1));
  if (sorted != 0 && sorted != 1) return BadAttr(node, "sorted", std::to_string(sorted), "0 or 1");
  if (node.HasAttr("axis")) KILN_RETURN_IF_ERROR(node.GetInt("axis").status());
  return Status::OK();
}

Result<UniqueResult> ComputeUnique(const OpContext& ctx) {
  const Tensor* x = ctx.value(0);
  if (x == nullptr) return ValueDependent(ctx, 0, "the number of unique values");
  UniqueResult r;
  const Shape& s = x->shape();
  int64_t axis = -1;
  if (ctx.node().HasAttr("axis")) {
    KILN_ASSIGN_OR_RETURN(
        axis, NormalizeAxis(ctx.node().GetInt("axis", 0), static_cast<int64_t>(s.size()),
                            ctx.where() + ": attribute 'axis'"));
  }
  r.split = axis < 0 ? AxisSplit{1, x->numel(), 1} : SplitAt(s, axis);
  const AxisSplit& a = r.split;
  const std::vector<double> v = kernel::ToDoubles(*x);
  const bool is_float = kernel::IsFloatLike(x->dtype());
  const std::vector<int64_t> iv = is_float ? std::vector<int64_t>() : x->ToInt64Vector();
  // Slice k is the elements (o, k, i) for every outer o and inner i, compared in that order.
  auto less = [&](int64_t p, int64_t q) {
    for (int64_t o = 0; o < a.outer; ++o) {
      for (int64_t i = 0; i < a.inner; ++i) {
        const size_t ip = static_cast<size_t>((o * a.extent + p) * a.inner + i);
        const size_t iq = static_cast<size_t>((o * a.extent + q) * a.inner + i);
        if (is_float) {
          if (v[ip] != v[iq]) return v[ip] < v[iq];
        } else if (iv[ip] != iv[iq]) {
          // Unsigned 64-bit values above INT64_MAX compare by their wrapped bits here; their
          // order among themselves is still consistent.
          return iv[ip] < iv[iq];
        }
      }
    }
    return false;
  };
  std::vector<int64_t> order(static_cast<size_t>(a.extent));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), less);
  // Groups of equal slices in sorted order; each group's first occurrence is its least index.
  std::vector<int64_t> group_of(static_cast<size_t>(a.extent));
  std::vector<int64_t> group_first, group_count;
  for (size_t k = 0; k < order.size(); ++k) {
    if (k == 0 || less(order[k - 1], order[k])) {
      group_first.push_back(order[k]);
      group_count.push_back(0);
    }
    group_of[static_cast<size_t>(order[k])] = static_cast<int64_t>(group_first.size()) - 1;
    ++group_count.back();
  }
  std::vector<int64_t> rank(group_first.size());
  std::iota(rank.begin(), rank.end(), 0);
  if (ctx.node().GetInt("sorted", 1) == 0) {
    std::vector<int64_t> by_first(group_first.size());
    std::iota(by_first.begin(), by_first.end(), 0);
    std::sort(by_first.begin(), by_first.end(), [&](int64_t p, int64_t q) {
      return group_first[static_cast<size_t>(p)] < group_first[static_cast<size_t>(q)];
    });
    for (size_t k = 0; k < by_first.size(); ++k)
      rank[static_cast<size_t>(by_first[k])] = static_cast<int64_t>(k);
  }
  r.first.assign(group_first.size(), 0);
  r.counts.assign(group_first.size(), 0);
  for (size_t g = 0; g < group_first.size(); ++g) {
    r.first[static_cast<size_t>(rank[g])] = group_first[g];
    r.counts[static_cast<size_t>(rank[g])] = group_count[g];
  }
  r.inverse.resize(static_cast<size_t>(a.extent));
  for (int64_t k = 0; k < a.extent; ++k) {
    r.inverse[static_cast<size_t>(k)] = rank[static_cast<size_t>(group_of[static_cast<size_t>(k)])];
  }
  return r;
}

Result<std::vector<TensorType>> InferUnique(const OpContext& ctx) {
  KILN_ASSIGN_OR_RETURN(UniqueResult r, ComputeUnique(ctx));
  const int64_t u = static_cast<int64_t>(r.first.size());
  Shape y = {u};
  if (ctx.node().HasAttr("axis")) {
    y = ctx.type(0).shape;
    const int64_t axis = ctx.node().GetInt("axis", 0);
    y[static_cast<size_t>(axis < 0 ? axis + static_cast<int64_t>(y.size()) : axis)] = u;
  }
  std::vector<TensorType> out = {{ctx.type(0).dtype, y},
                                 {DType::kInt64, {u}},
                                 {DType::kInt64, {r.split.extent}},
                                 {DType::kInt64, {u}}};
  out.resize(std::max<size_t>(1, ctx.node().outputs.size()));
  return out;
}

Status RunUnique(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_ASSIGN_OR_RETURN(UniqueResult r, ComputeUnique(ctx));
  const Tensor& x = ctx.in(0);
  const AxisSplit& a = r.split;
  const size_t es = DTypeSize(x.dtype());
  const size_t row = static_cast<size_t>(a.inner) * es;
  const int64_t u = static_cast<int64_t>(r.first.size());
  const char* src = static_cast<const char*>(x.raw_data());
  char* dst = static_cast<char*>(outputs[0].raw_data());
  for (int64_t o = 0; o < a.outer; ++o) {
    for (int64_t k = 0; k < u; ++k) {
      std::memcpy(dst + static_cast<size_t>(o * u + k) * row,
                  src + static_cast<size_t>(o * a.extent + r.first[static_cast<size_t>(k)]) * row,
                  row);
    }
  }
  const std::vector<int64_t>* lists[] = {&r.first, &r.inverse, &r.counts};
  for (size_t i = 1; i < outputs.size() && i < 4; ++i) {
    KILN_RETURN_IF_ERROR(kernel::StoreInt64s(*lists[i - 1], outputs[i]));
  }
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------
// CastLike (opset 15): Cast to the element type of input 1 (whose values are not read).

Result<std::vector<TensorType>> InferCastLike(const OpContext& ctx) {
  return std::vector<TensorType>{{ctx.type(1).dtype, ctx.type(0).shape}};
}

Status RunCastLike(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_ASSIGN_OR_RETURN(Tensor converted,
                        kernel::CastForOp(ctx.in(0), ctx.type(1).dtype, ctx.opset()));
  return kernel::Deliver(converted, outputs[0]);
}

Status CheckCastLike(const Node& node, int64_t) { return CheckArity(node, 2, 2); }

// ---------------------------------------------------------------------------------------------
// DynamicQuantizeLinear (opset 11): float32 x -> uint8 y, float32 scale, uint8 zero point, with
// the range [min(0, min x), max(0, max x)] mapped onto [0, 255]. float32 arithmetic and
// round-half-to-even throughout, as the ONNX definition states it.

Result<std::vector<TensorType>> InferDynamicQuantize(const OpContext& ctx) {
  if (ctx.type(0).dtype != DType::kFloat32)
    return UnsupportedDType(ctx, ctx.type(0).dtype, "float32");
  return std::vector<TensorType>{
      {DType::kUInt8, ctx.type(0).shape}, {DType::kFloat32, {}}, {DType::kUInt8, {}}};
}

Status RunDynamicQuantize(const OpContext& ctx, std::vector<Tensor>& outputs) {
  const Tensor& x = ctx.in(0);
  const float* p = x.data<float>();
  float lo = 0.0f, hi = 0.0f;
  for (int64_t i = 0; i < x.numel(); ++i) {
    if (std::isnan(p[i])) {
      return Status::InvalidArgument(ctx.where() + ": input holds NaN at element " +
                                     std::to_string(i) + " (no quantization range exists)");
    }
    lo = std::min(lo, p[i]);
    hi = std::max(hi, p[i]);
  }
  const float scale = (hi - lo) / 255.0f;
  auto sat = [](float v) { return static_cast<uint8_t>(std::min(255.0f, std::max(0.0f, v))); };
  const uint8_t zp = scale == 0.0f ? 0 : sat(std::nearbyint(-lo / scale));
  uint8_t* y = outputs[0].data<uint8_t>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    y[i] = scale == 0.0f ? zp : sat(std::nearbyint(p[i] / scale) + static_cast<float>(zp));
  }
  outputs[1].data<float>()[0] = scale;
  if (outputs.size() > 2) outputs[2].data<uint8_t>()[0] = zp;
  return Status::OK();
}

Status CheckDynamicQuantize(const Node& node, int64_t) { return CheckArity(node, 1, 1, 3); }

// ---------------------------------------------------------------------------------------------
// TfIdfVectorizer (opset 9): counts the n-grams of pool_int64s in each row of an integer input
// ([C] or [N, C]); n-grams of length min_gram_length..max_gram_length with items
// skip_distance = 1..max_skip_count + 1 apart (unigrams counted once). ngram_counts[k] is where
// the (k+1)-grams start in the pool; the i-th n-gram of the pool counts into output column
// ngram_indexes[i]. mode TF gives counts, IDF weights[i] where the count is non-zero, TFIDF
// count * weight (weights default 1).

struct TfIdf {
  std::string mode;
  int64_t min_n = 1, max_n = 1, max_skip = 0;
  std::map<std::vector<int64_t>, int64_t> column;  // n-gram -> pool position i
  std::vector<int64_t> indexes;
  std::vector<float> weights;
  int64_t width = 0;  // output columns
};

Result<TfIdf> ReadTfIdf(const Node& node) {
  TfIdf t;
  KILN_ASSIGN_OR_RETURN(t.mode, node.GetString("mode"));
  if (t.mode != "TF" && t.mode != "IDF" && t.mode != "TFIDF") {
    return BadAttr(node, "mode", "'" + t.mode + "'", "'TF', 'IDF' or 'TFIDF'");
  }
  KILN_ASSIGN_OR_RETURN(t.min_n, node.GetInt("min_gram_length"));
  KILN_ASSIGN_OR_RETURN(t.max_n, node.GetInt("max_gram_length"));
  KILN_ASSIGN_OR_RETURN(t.max_skip, node.GetInt("max_skip_count"));
  if (t.min_n < 1 || t.max_n < t.min_n) {
    return Status::InvalidArgument(node.Describe() +
                                   ": min_gram_length=" + std::to_string(t.min_n) +
                                   " and max_gram_length=" + std::to_string(t.max_n) +
                                   " are invalid (expected 1 <= min <= max)");
  }
  if (t.max_skip < 0) return BadAttr(node, "max_skip_count", std::to_string(t.max_skip), ">= 0");
  if (node.HasAttr("pool_strings")) {
    return Status::Unimplemented(node.Describe() +
                                 ": pool_strings is not supported (string n-grams); kiln counts "
                                 "pool_int64s over integer inputs");
  }
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> pool, node.GetInts("pool_int64s"));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> counts, node.GetInts("ngram_counts"));
  KILN_ASSIGN_OR_RETURN(t.indexes, node.GetInts("ngram_indexes"));
  if (node.HasAttr("weights")) {
    KILN_ASSIGN_OR_RETURN(t.weights, node.GetFloats("weights"));
  }
  int64_t i = 0;
  for (size_t k = 0; k < counts.size(); ++k) {
    const int64_t n = static_cast<int64_t>(k) + 1;
    const int64_t start = counts[k];
    const int64_t end = k + 1 < counts.size() ? counts[k + 1] : static_cast<int64_t>(pool.size());
    if (start < 0 || end < start || end > static_cast<int64_t>(pool.size()) || (end - start) % n) {
      return Status::InvalidArgument(node.Describe() + ": ngram_counts " + ShapeToString(counts) +
                                     " does not split pool_int64s (" + std::to_string(pool.size()) +
                                     " values) into whole " + std::to_string(n) + "-grams");
    }
    for (int64_t p = start; p < end; p += n, ++i) {
      t.column[std::vector<int64_t>(pool.begin() + p, pool.begin() + p + n)] = i;
    }
  }
  if (static_cast<int64_t>(t.indexes.size()) != i) {
    return Status::InvalidArgument(node.Describe() + ": ngram_indexes has " +
                                   std::to_string(t.indexes.size()) + " values, the pool holds " +
                                   std::to_string(i) + " n-grams");
  }
  if (!t.weights.empty() && t.weights.size() != t.indexes.size()) {
    return Status::InvalidArgument(node.Describe() + ": weights has " +
                                   std::to_string(t.weights.size()) + " values, expected " +
                                   std::to_string(t.indexes.size()));
  }
  for (int64_t idx : t.indexes) {
    if (idx < 0) return BadAttr(node, "ngram_indexes", ShapeToString(t.indexes), "values >= 0");
    t.width = std::max(t.width, idx + 1);
  }
  return t;
}

Status CheckTfIdf(const Node& node, int64_t) {
  KILN_RETURN_IF_ERROR(CheckArity(node, 1, 1));
  return ReadTfIdf(node).status();
}

Result<std::vector<TensorType>> InferTfIdf(const OpContext& ctx) {
  KILN_RETURN_IF_ERROR(kernel::RequireIntegerInput(ctx, 0));
  KILN_ASSIGN_OR_RETURN(TfIdf t, ReadTfIdf(ctx.node()));
  const Shape& s = ctx.type(0).shape;
  if (s.size() == 1) return std::vector<TensorType>{{DType::kFloat32, {t.width}}};
  if (s.size() == 2) return std::vector<TensorType>{{DType::kFloat32, {s[0], t.width}}};
  return BadInputShape(ctx, 0, "X", "[C] or [N, C]");
}

Status RunTfIdf(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_ASSIGN_OR_RETURN(TfIdf t, ReadTfIdf(ctx.node()));
  const Tensor& x = ctx.in(0);
  const std::vector<int64_t> v = x.ToInt64Vector();
  const int64_t rows = x.rank() == 2 ? x.dim(0) : 1;
  const int64_t len = x.rank() == 2 ? x.dim(1) : x.dim(0);
  float* out = outputs[0].data<float>();
  std::fill(out, out + outputs[0].numel(), 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<int64_t> counts(t.indexes.size(), 0);
    const int64_t* row = v.data() + r * len;
    for (int64_t d = 1; d <= t.max_skip + 1; ++d) {
      for (int64_t n = std::max<int64_t>(t.min_n, d == 1 ? 1 : 2); n <= t.max_n; ++n) {
        for (int64_t start = 0; start + (n - 1) * d < len; ++start) {
          std::vector<int64_t> gram(static_cast<size_t>(n));
          for (int64_t k = 0; k < n; ++k) gram[static_cast<size_t>(k)] = row[start + k * d];
          auto it = t.column.find(gram);
          if (it != t.column.end()) ++counts[static_cast<size_t>(it->second)];
        }
      }
    }
    for (size_t i = 0; i < counts.size(); ++i) {
      if (counts[i] == 0) continue;
      const float w = t.weights.empty() ? 1.0f : t.weights[i];
      const float value = t.mode == "TF"    ? static_cast<float>(counts[i])
                          : t.mode == "IDF" ? w
                                            : static_cast<float>(counts[i]) * w;
      out[r * t.width + t.indexes[i]] = value;
    }
  }
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------
// StringNormalizer (opset 10): drops the stopwords from a string tensor [C] or [1, C] (matched
// exactly, or ignoring case when is_case_sensitive=0), then changes the case of what is left
// (case_change_action LOWER, UPPER or NONE). Case is that of ASCII and of the Latin-1 letters
// (U+00C0 to U+00FE); other characters are kept as they are. When every string is dropped the
// output is one empty string ([1] or [1, 1]), as ONNX defines it.

struct Normalizer {
  std::string action = "NONE";
  bool case_sensitive = false;
  std::vector<std::string> stopwords;
};

Result<Normalizer> ReadNormalizer(const Node& node) {
  Normalizer n;
  KILN_ASSIGN_OR_RETURN(n.action, kernel::StringOr(node, "case_change_action", "NONE"));
  if (n.action != "NONE" && n.action != "LOWER" && n.action != "UPPER") {
    return BadAttr(node, "case_change_action", "'" + n.action + "'", "'NONE', 'LOWER' or 'UPPER'");
  }
  KILN_ASSIGN_OR_RETURN(int64_t cs, kernel::IntOr(node, "is_case_sensitive", 0));
  n.case_sensitive = cs != 0;
  if (node.HasAttr("stopwords")) {
    auto it = node.attrs.find("stopwords");
    if (it->second.kind != Attribute::Kind::kStrings) {
      return BadAttr(node, "stopwords", AttributeKindName(it->second.kind), "strings");
    }
    n.stopwords = it->second.strings;
  }
  return n;
}

// `s` with its ASCII and Latin-1 letters in upper (or lower) case.
std::string ChangeCase(const std::string& s, bool upper) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      out += static_cast<char>(upper ? std::toupper(c) : std::tolower(c));
    } else if (c == 0xc3 && i + 1 < s.size()) {  // U+00C0..U+00FF: second byte 0x80..0xbf
      auto d = static_cast<unsigned char>(s[i + 1]);
      const bool is_upper = d >= 0x80 && d <= 0x9e && d != 0x97;  // U+00C0..U+00DE but x
      const bool is_lower = d >= 0xa0 && d <= 0xbe && d != 0xb7;  // U+00E0..U+00FE but /
      if (upper && is_lower) d = static_cast<unsigned char>(d - 0x20);
      if (!upper && is_upper) d = static_cast<unsigned char>(d + 0x20);
      out += static_cast<char>(c);
      out += static_cast<char>(d);
      ++i;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

Status CheckNormalizer(const Node& node, int64_t) {
  KILN_RETURN_IF_ERROR(CheckArity(node, 1, 1));
  return ReadNormalizer(node).status();
}

Result<std::vector<std::string>> Normalize(const OpContext& ctx) {
  if (ctx.type(0).dtype != DType::kString)
    return UnsupportedDType(ctx, ctx.type(0).dtype, "string");
  const Shape& s = ctx.type(0).shape;
  if (!(s.size() == 1 || (s.size() == 2 && s[0] == 1))) {
    return BadInputShape(ctx, 0, "X", "[C] or [1, C]");
  }
  const Tensor* x = ctx.value(0);
  if (x == nullptr) return ValueDependent(ctx, 0, "the number of strings left");
  KILN_ASSIGN_OR_RETURN(Normalizer n, ReadNormalizer(ctx.node()));
  std::vector<std::string> stop = n.stopwords;
  if (!n.case_sensitive) {
    for (std::string& w : stop) w = ChangeCase(w, false);
  }
  std::vector<std::string> out;
  for (int64_t i = 0; i < x->numel(); ++i) {
    const std::string& v = x->str(i);
    const std::string key = n.case_sensitive ? v : ChangeCase(v, false);
    if (std::find(stop.begin(), stop.end(), key) != stop.end()) continue;
    out.push_back(n.action == "NONE" ? v : ChangeCase(v, n.action == "UPPER"));
  }
  if (out.empty()) out.push_back("");
  return out;
}

Result<std::vector<TensorType>> InferNormalizer(const OpContext& ctx) {
  KILN_ASSIGN_OR_RETURN(std::vector<std::string> out, Normalize(ctx));
  const int64_t c = static_cast<int64_t>(out.size());
  return std::vector<TensorType>{
      {DType::kString, ctx.type(0).shape.size() == 1 ? Shape{c} : Shape{1, c}}};
}

Status RunNormalizer(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_ASSIGN_OR_RETURN(std::vector<std::string> out, Normalize(ctx));
  for (size_t i = 0; i < out.size(); ++i) outputs[0].str(static_cast<int64_t>(i)) = out[i];
  return Status::OK();
}

}  // namespace

std::vector<OpDef> TensorOpDefs() {
  constexpr int64_t kMax = INT64_MAX;
  std::vector<OpDef> defs = {
      {"Compress", "", 9, kMax, CheckCompress, InferCompress, RunCompress},
      {"ReverseSequence", "", 10, kMax, CheckReverseSequence, InferReverseSequence,
       RunReverseSequence},
      {"Unique", "", 11, kMax, CheckUnique, InferUnique, RunUnique},
      {"CastLike", "", 15, kMax, CheckCastLike, InferCastLike, RunCastLike, nullptr},
      {"DynamicQuantizeLinear", "", 11, kMax, CheckDynamicQuantize, InferDynamicQuantize,
       RunDynamicQuantize},
      {"TfIdfVectorizer", "", 9, kMax, CheckTfIdf, InferTfIdf, RunTfIdf},
      {"StringNormalizer", "", 10, kMax, CheckNormalizer, InferNormalizer, RunNormalizer},
  };
  for (OpDef& d : defs) {
    // CastLike converts to and from text like Cast; StringNormalizer takes nothing else.
    if (d.op_type == "CastLike" || d.op_type == "StringNormalizer") d.strings = true;
  }
  return defs;
}

}  // namespace kiln
