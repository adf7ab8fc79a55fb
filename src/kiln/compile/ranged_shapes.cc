// Shapes over a range (see ranged_shapes.h): a unit box of concrete inferences gives each dim's
// polynomial by finite differences; the probe points hold it to the graph.
#include "src/kiln/compile/ranged_shapes.h"

#include <algorithm>
#include <cstdio>

#include "src/kiln/ops/shape_inference.h"
#include "src/kiln/tensor/dtype.h"

namespace kiln {

namespace {

Result<InferredGraph> InferAt(const Graph& graph, const RangedEntry& entry,
                              const SymbolPoint& point) {
  auto inferred = InferShapes(graph, ShapesAt(entry, point), /*tolerate_dynamic=*/true);
  if (!inferred.ok()) {
    return Status(inferred.status().code(),
                  "at " + DescribePoint(point) + ": " + inferred.status().message());
  }
  return inferred;
}

// The polynomial through f's values at the box corners (bit s of a corner's index: symbol s at
// base[s] + 1), by finite differences: f(x) = sum_S D_S * prod_{s in S} (x_s - base_s), then
// expanded into monomials. False when a coefficient does not fit in 64 bits.
bool FitPolynomial(const std::vector<int64_t>& f, const std::vector<std::string>& symbols,
                   const std::vector<int64_t>& base, SymDim* out) {
  const size_t m = symbols.size();
  const size_t corners = size_t{1} << m;
  std::vector<__int128> diff(corners, 0);
  for (size_t s = 0; s < corners; ++s) {
    for (size_t t = s;; t = (t - 1) & s) {  // every subset t of s
      const int sign = (__builtin_popcountll(s ^ t) % 2) ? -1 : 1;
      diff[s] += sign * static_cast<__int128>(f[t]);
      if (t == 0) break;
    }
  }
  out->terms.clear();
  for (size_t u = 0; u < corners; ++u) {
    __int128 c = 0;
    for (size_t s = 0; s < corners; ++s) {
      if ((s & u) != u || diff[s] == 0) continue;
      __int128 term = diff[s];
      for (size_t b = 0; b < m; ++b) {
        if ((s & ~u) & (size_t{1} << b)) term *= -static_cast<__int128>(base[b]);
        if (term > INT64_MAX || term < INT64_MIN) return false;
      }
      c += term;
    }
    if (c > INT64_MAX || c < INT64_MIN) return false;
    if (c == 0) continue;
    std::vector<std::string> names;
    for (size_t b = 0; b < m; ++b) {
      if (u & (size_t{1} << b)) names.push_back(symbols[b]);
    }
    out->terms[names] = static_cast<int64_t>(c);
  }
  return true;
}

// One value across every inference: its type if it is one polynomial shape, else why not.
struct Fit {
  std::vector<SymDim> dims;
  std::string irregular;  // empty: it fits
};

const TensorType* TypeAt(const InferredGraph& g, const std::string& name) {
  auto it = g.types.find(name);
  return it == g.types.end() ? nullptr : &it->second;
}

Fit FitValue(const std::string& name, const std::vector<InferredGraph>& box,
             const std::vector<InferredGraph>& probes, const std::vector<SymbolPoint>& points,
             const std::vector<SymbolPoint>& coordinates, const std::vector<std::string>& symbols,
             const std::vector<int64_t>& base) {
  Fit fit;
  const TensorType& first = *TypeAt(box[0], name);
  auto same_type = [&](const InferredGraph& g, const std::string& where) -> bool {
    const TensorType* t = TypeAt(g, name);
    if (t && t->dtype == first.dtype && t->shape.size() == first.shape.size()) return true;
    fit.irregular = t ? "is " + t->ToString() + " at " + where + " but " + first.ToString() +
                            " at the fit's first corner"
                      : "has no static type at " + where;
    return false;
  };
  for (size_t c = 0; c < box.size(); ++c) {
    if (!same_type(box[c], "the fit's corner " + std::to_string(c))) return fit;
  }
  for (size_t p = 0; p < probes.size(); ++p) {
    if (!same_type(probes[p], DescribePoint(points[p]))) return fit;
  }
  for (size_t d = 0; d < first.shape.size(); ++d) {
    std::vector<int64_t> f;
    for (const InferredGraph& g : box) f.push_back(TypeAt(g, name)->shape[d]);
    SymDim dim;
    if (!FitPolynomial(f, symbols, base, &dim)) {
      fit.irregular = "dim " + std::to_string(d) + ": the fitted polynomial overflows";
      return fit;
    }
    for (size_t p = 0; p < probes.size(); ++p) {
      const int64_t actual = TypeAt(probes[p], name)->shape[d];
      int64_t predicted = 0;
      if (!dim.Eval(coordinates[p], &predicted) || predicted != actual) {
        fit.irregular = "dim " + std::to_string(d) + " is " + std::to_string(actual) + " at " +
                        DescribePoint(points[p]) + ", not " + dim.ToString();
        return fit;
      }
    }
    fit.dims.push_back(std::move(dim));
  }
  return fit;
}

}  // namespace

int64_t FitBase(const RangedEntry& entry, const std::string& symbol) {
  const auto [lo, hi] = entry.ranges.at(symbol);
  const int64_t step = StepOf(entry, symbol);
  int64_t v = lo;
  while (v < 2 && v + step <= hi) v += step;
  return std::min(CoordinateOf(entry, symbol, v), CoordinateOf(entry, symbol, hi) - 1);
}

SymbolPoint CoordinatesOf(const RangedEntry& entry, const SymbolPoint& point) {
  SymbolPoint out;
  for (const auto& [name, value] : point) out[name] = CoordinateOf(entry, name, value);
  return out;
}

std::set<std::string> RangedShapes::SymbolicNames() const {
  std::set<std::string> out;
  for (const auto& [name, dims] : shapes) {
    if (std::any_of(dims.begin(), dims.end(), [](const SymDim& d) { return !d.IsConstant(); })) {
      out.insert(name);
    }
  }
  return out;
}

size_t RangedShapes::SymbolicValues() const { return SymbolicNames().size(); }

std::string RangedShapes::Summary() const {
  std::string s = std::to_string(shapes.size() + irregular.size() + dynamic.size()) +
                  " values: " + std::to_string(SymbolicValues()) + " symbolic, " +
                  std::to_string(irregular.size()) + " irregular";
  if (!irregular.empty()) {
    s += " (first: '" + irregular.begin()->first + "' " + irregular.begin()->second + ")";
  }
  return s + ", " + std::to_string(dynamic.size()) + " dynamic";
}

Result<RangedShapes> InferRangedShapes(const Graph& graph, const RangedEntry& entry) {
  KILN_RETURN_IF_ERROR(CheckRangedEntry(entry, "ranged entry"));
  KILN_RETURN_IF_ERROR(CheckRangedProbes(entry));
  RangedShapes out;
  out.symbols = FreeSymbols(entry);
  const size_t m = out.symbols.size();
  std::vector<int64_t> base;
  for (const std::string& s : out.symbols) base.push_back(FitBase(entry, s));

  std::vector<InferredGraph> box, probes;
  for (size_t corner = 0; corner < (size_t{1} << m); ++corner) {
    SymbolPoint p;
    for (const auto& [name, range] : entry.ranges) p[name] = range.first;
    for (size_t b = 0; b < m; ++b) {
      p[out.symbols[b]] = ValueAt(entry, out.symbols[b], base[b] + ((corner >> b) & 1));
    }
    KILN_ASSIGN_OR_RETURN(InferredGraph g, InferAt(graph, entry, p));
    box.push_back(std::move(g));
  }
  const std::vector<SymbolPoint> points = RangeProbePoints(entry);
  std::vector<SymbolPoint> coordinates;
  for (const SymbolPoint& p : points) coordinates.push_back(CoordinatesOf(entry, p));
  for (const SymbolPoint& p : points) {
    KILN_ASSIGN_OR_RETURN(InferredGraph g, InferAt(graph, entry, p));
    probes.push_back(std::move(g));
  }
  out.inferences = box.size() + probes.size();

  // A value dynamic at one point is dynamic over the range (its type is a run-time fact there);
  // one with a static type everywhere is fitted. Sequences and optionals carry no shape.
  std::set<std::string> names;
  for (const auto* set : {&box, &probes}) {
    for (const InferredGraph& g : *set) {
      out.dynamic.insert(g.dynamic.begin(), g.dynamic.end());
      for (const auto& [name, type] : g.types) names.insert(name);
    }
  }
  for (const std::string& name : names) {
    if (out.dynamic.count(name)) continue;
    const TensorType* t = TypeAt(box[0], name);
    if (t && t->kind != ValueKind::kTensor) continue;
    if (!t) {
      out.irregular[name] = "has no static type at the fit's first corner";
      continue;
    }
    Fit fit = FitValue(name, box, probes, points, coordinates, out.symbols, base);
    if (!fit.irregular.empty()) {
      out.irregular[name] = std::move(fit.irregular);
      continue;
    }
    out.shapes[name] = std::move(fit.dims);
    out.dtypes[name] = t->dtype;
  }
  return out;
}

Result<RangeFootprint> FootprintAtMaximum(const Graph& graph, const RangedEntry& entry,
                                          const RangedShapes& shapes) {
  std::vector<SymbolPoint> corners;
  const size_t m = shapes.symbols.size();
  for (size_t corner = 0; corner < (size_t{1} << m); ++corner) {
    SymbolPoint p;
    for (const auto& [name, range] : entry.ranges) p[name] = range.first;
    for (size_t b = 0; b < m; ++b) {
      const auto& range = entry.ranges.at(shapes.symbols[b]);
      p[shapes.symbols[b]] = ((corner >> b) & 1) ? range.second : range.first;
    }
    corners.push_back(std::move(p));
  }
  std::vector<SymbolPoint> at;  // the corners in coordinates, where the polynomials are
  for (const SymbolPoint& p : corners) at.push_back(CoordinatesOf(entry, p));
  RangeFootprint out;
  out.unbounded = shapes.irregular.size() + shapes.dynamic.size();
  for (const auto& [name, dims] : shapes.shapes) {
    if (graph.initializers.count(name)) continue;
    const int64_t element = static_cast<int64_t>(DTypeSize(shapes.dtypes.at(name)));
    int64_t most = -1;
    const SymbolPoint* most_at = nullptr;
    for (size_t c = 0; c < corners.size(); ++c) {
      const SymbolPoint& p = corners[c];
      int64_t bytes = element;
      for (const SymDim& d : dims) {
        int64_t v = 0;
        if (!d.Eval(at[c], &v) || v < 0 || __builtin_mul_overflow(bytes, v, &bytes)) {
          return Status::InvalidArgument("value '" + name + "' at " + DescribePoint(p) +
                                         ": its size in bytes does not fit 64 bits");
        }
      }
      if (bytes > most) most = bytes, most_at = &p;
    }
    if (__builtin_add_overflow(out.total_bytes, most, &out.total_bytes)) {
      return Status::InvalidArgument("the values' total size over the range does not fit 64 bits");
    }
    if (most > out.largest_bytes) {
      out.largest_bytes = most;
      out.largest = name;
      out.largest_at = *most_at;
    }
  }
  return out;
}

}  // namespace kiln
