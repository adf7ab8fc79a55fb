// The numerics gate and the fence proof (see gate.h).
#include "src/kiln/arm/gate.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <unordered_map>

#include "src/kiln/base/clock.h"
#include "src/kiln/ops/shape_inference.h"

namespace kiln {

const char* VerdictName(Verdict v) {
  switch (v) {
    case Verdict::kHealthy:
      return "HEALTHY";
    case Verdict::kDegraded:
      return "DEGRADED";
    case Verdict::kDestroyed:
      return "DESTROYED";
    case Verdict::kUnmeasurable:
      return "UNMEASURABLE";
  }
  return "?";
}

namespace {
int Severity(Verdict v) {
  switch (v) {
    case Verdict::kHealthy:
      return 0;
    case Verdict::kDegraded:
      return 1;
    case Verdict::kDestroyed:
      return 2;
    case Verdict::kUnmeasurable:
      return 3;
  }
  return 3;
}

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}

// True when `b` is worse than `a` (a more severe verdict, or the same one with a lower cos).
bool Worse(const EntryNumerics& b, const EntryNumerics& a) {
  return Severity(b.verdict) > Severity(a.verdict) ||
         (Severity(b.verdict) == Severity(a.verdict) && b.cos < a.cos);
}

// 0 finite, 1 NaN, 2 +Inf, 3 -Inf.
int FiniteClass(double v) {
  if (std::isnan(v)) return 1;
  if (std::isinf(v)) return v > 0 ? 2 : 3;
  return 0;
}

const char* ClassName(int c) {
  static const char* const kNames[] = {"finite", "nan", "+inf", "-inf"};
  return kNames[c];
}
}  // namespace

std::string GateReport::Summary() const {
  char buf[256];
  if (worst_entry < 0) return std::string(VerdictName(verdict)) + " (no entry measured)";
  const EntryNumerics& w = entries[static_cast<size_t>(worst_entry)];
  std::snprintf(buf, sizeof(buf), "%s (worst entry %d: cos=%.9f ret=%.9f rel_l2=%.3g; %d probe%s",
                VerdictName(verdict), w.entry, w.cos, w.ret, w.rel_l2, w.probes,
                w.probes == 1 ? "" : "s");
  std::string s = buf;
  if (w.skipped > 0) s += ", " + std::to_string(w.skipped) + " refused by eager and skipped";
  if (verdict != Verdict::kHealthy && !w.note.empty()) s += "; " + w.note;
  return s + ")";
}

EntryNumerics CompareOutputs(const TensorMap& reference, const TensorMap& candidate,
                             const NumericsThresholds& t) {
  EntryNumerics n;
  double rs = 0, rr = 0, ss = 0, dd = 0;
  for (const auto& [name, r] : reference) {
    auto it = candidate.find(name);
    if (it == candidate.end()) {
      n.verdict = Verdict::kUnmeasurable;
      n.note = "the cell gave no output '" + name + "'";
      return n;
    }
    const Tensor& c = it->second;
    if (c.shape() != r.shape()) {
      n.verdict = Verdict::kDestroyed;
      n.note = "output '" + name + "' is " + ShapeToString(c.shape()) + ", eager's " +
               ShapeToString(r.shape());
      return n;
    }
    for (int64_t i = 0; i < r.numel(); ++i) {
      const double a = r.GetAsDouble(i), b = c.GetAsDouble(i);
      const int ca = FiniteClass(a), cb = FiniteClass(b);
      if (ca != cb) {
        // A cell that loses a NaN (or makes one) computes something else: never a rounding.
        n.verdict = Verdict::kDestroyed;
        n.note = "output '" + name + "' [" + std::to_string(i) + "]: eager " +
                 (ca ? ClassName(ca) : Num(a)) + ", cell " + (cb ? ClassName(cb) : Num(b)) +
                 " (non-finite positions differ)";
        return n;
      }
      if (ca != 0) continue;  // the same non-finite value on both sides
      rs += a * b;
      rr += a * a;
      ss += b * b;
      dd += (a - b) * (a - b);
    }
  }
  const double nr = std::sqrt(rr), ns = std::sqrt(ss);
  // Below this norm both sides are zero for float32 purposes: exp(-inf) is 0 in libm and the
  // smallest normal float where a vectorized exp clamps, and a cosine of such specks (a probe
  // whose only finite outputs are underflows) measures nothing.
  constexpr double kZero = 1e-30;
  const bool both_zero = nr < kZero && ns < kZero;
  if (both_zero) {
    n.cos = 1;
    n.ret = 1;
  } else if (nr == 0 || ns == 0) {
    n.cos = 0;
    n.ret = nr == 0 ? INFINITY : 0;
  } else {
    n.cos = rs / (nr * ns);
    n.ret = ns / nr;
  }
  n.rel_l2 = both_zero ? 0 : (nr == 0 ? INFINITY : std::sqrt(dd) / nr);
  if (std::isnan(n.cos) || std::isnan(n.rel_l2) || (!both_zero && !std::isfinite(rr + ss))) {
    // Finite values whose squares overflow a double: no cosine can be formed.
    n.verdict = Verdict::kUnmeasurable;
    n.note = "finite outputs too large to compare";
    return n;
  }
  if (n.cos < t.floor) {
    n.verdict = Verdict::kDestroyed;
  } else if (n.cos < t.warn) {
    n.verdict = Verdict::kDegraded;
  } else {
    n.verdict = Verdict::kHealthy;
  }
  if (n.verdict == Verdict::kHealthy && (n.ret < t.retention || n.ret > 1.0 / t.retention)) {
    n.verdict = Verdict::kDegraded;
  }
  return n;
}

// --- probes ----------------------------------------------------------------------------------

ProbeBounds ProbeIntBounds(const Graph& graph, const ShapeClass& shape_class) {
  // Types of every value, when the class (or the declared shapes) allow inference; else only
  // initializers and declared graph inputs are known.
  std::map<std::string, Shape> shapes;
  {
    std::map<std::string, Shape> given(shape_class.begin(), shape_class.end());
    auto inferred = InferShapes(graph, given);
    if (inferred.ok()) {
      for (const auto& [name, type] : inferred->types) shapes[name] = type.shape;
    }
    for (const auto& [name, t] : graph.initializers) shapes.emplace(name, t.shape());
    for (const ValueInfo& v : graph.inputs) {
      auto c = shape_class.find(v.name);
      if (c != shape_class.end()) {
        shapes.emplace(v.name, c->second);
        continue;
      }
      if (!v.has_shape) continue;
      Shape s;
      bool known = true;
      for (const Dim& d : v.dims) {
        known = known && d.known();
        s.push_back(d.value);
      }
      if (known) shapes.emplace(v.name, s);
    }
  }
  auto dim = [&](const std::string& value, int64_t axis) -> int64_t {
    auto it = shapes.find(value);
    if (it == shapes.end()) return 0;
    const int64_t rank = static_cast<int64_t>(it->second.size());
    if (axis < 0) axis += rank;
    if (axis < 0 || axis >= rank) return 0;
    return it->second[static_cast<size_t>(axis)];
  };
  static const std::set<std::string> kSame = {"Cast",    "Identity",  "Reshape",
                                              "Squeeze", "Unsqueeze", "Flatten",
                                              "Expand",  "Tile",      "Transpose"};
  ProbeBounds bounds;
  for (const ValueInfo& in : graph.inputs) {
    if (IsFloatDType(in.dtype) || in.dtype == DType::kBool) continue;
    // Values carrying the input's integers unchanged; nodes are in topological order.
    std::set<std::string> same = {in.name};
    std::vector<int64_t> bound;  // empty = none found
    auto tighten = [&](std::vector<int64_t> b) {
      for (int64_t v : b) {
        if (v <= 0) return;  // an extent unknown (or empty): no bound from this consumer
      }
      if (b.empty()) return;
      if (bound.empty()) {
        bound = std::move(b);
      } else if (bound.size() == b.size()) {
        for (size_t i = 0; i < b.size(); ++i) bound[i] = std::min(bound[i], b[i]);
      } else {  // two consumers index differently: the tightest single bound
        const int64_t m = std::min(*std::min_element(bound.begin(), bound.end()),
                                   *std::min_element(b.begin(), b.end()));
        bound = {m};
      }
    };
    for (const Node& n : graph.nodes) {
      if (!n.domain.empty() || n.inputs.empty()) continue;
      const auto uses = [&](size_t i) { return i < n.inputs.size() && same.count(n.inputs[i]); };
      const std::string& op = n.op_type;
      if (uses(0) && kSame.count(op)) {
        for (const std::string& o : n.outputs) same.insert(o);
      } else if ((op == "Gather" || op == "GatherElements" || op == "ScatterElements" ||
                  op == "Scatter") &&
                 uses(1)) {
        tighten({dim(n.inputs[0], n.GetInt("axis", 0))});
      } else if ((op == "GatherND" || op == "ScatterND") && uses(1)) {
        const int64_t batch = op == "GatherND" ? n.GetInt("batch_dims", 0) : 0;
        const int64_t k = dim(n.inputs[1], -1);
        std::vector<int64_t> cols;
        for (int64_t j = 0; j < k; ++j) cols.push_back(dim(n.inputs[0], batch + j));
        tighten(cols);
      } else if (op == "OneHot" && uses(0) && n.inputs.size() > 1) {
        auto depth = graph.initializers.find(n.inputs[1]);
        if (depth != graph.initializers.end() && depth->second.numel() == 1) {
          tighten({static_cast<int64_t>(depth->second.GetAsDouble(0))});
        }
      }
    }
    if (!bound.empty()) bounds[in.name] = bound;
  }
  return bounds;
}

Result<TensorMap> ProbeInputs(const EntryMetadata& entry, Lane lane, uint64_t salt,
                              const ProbeBounds& int_bounds, bool non_finite) {
  TensorMap out;
  for (const TensorSpec& s : entry.inputs) {
    auto b = int_bounds.find(s.name);
    const bool bounded = b != int_bounds.end() && !b->second.empty();
    const std::vector<int64_t> ranges = bounded ? b->second : std::vector<int64_t>{8};
    // An unbounded integer scalar is most often a count, a step or a size (a Loop trip count, a
    // Range delta, a TopK k): 0 there divides by zero or loops without end, so it starts at 1.
    const double low = !bounded && NumElements(s.shape) == 1 ? 1.0 : 0.0;
    uint64_t state = Mix(entry.index * 1000003ull + (lane == Lane::kExported ? 1 : 2) + salt);
    for (char c : s.name) state = Mix(state ^ static_cast<unsigned char>(c));
    // Drawn as doubles, then converted by the tensor's own cast (which truncates toward zero,
    // as the probe's integers need, and rounds floats through float32 for float16).
    const bool is_float = IsFloatDType(s.dtype);
    KILN_ASSIGN_OR_RETURN(Tensor drawn, Tensor::Empty(DType::kFloat64, s.shape));
    double* x = drawn.data<double>();
    for (int64_t i = 0; i < drawn.numel(); ++i) {
      state = Mix(state);
      const double u = static_cast<double>(state >> 11) / 9007199254740992.0;  // [0,1)
      // Integers are drawn from [0, range): small non-negative values are valid token ids and
      // indices for any table of at least 8 rows, and a bounded input stays inside what it
      // indexes (per index column for tuples).
      const double range =
          static_cast<double>(std::min<int64_t>(8, ranges[static_cast<size_t>(i) % ranges.size()]));
      x[i] = is_float                  ? 2 * u - 1
             : s.dtype == DType::kBool ? (u < 0.5 ? 0 : 1)
                                       : low + u * (range - low);
    }
    if (is_float && non_finite) {
      const double planted[] = {NAN, INFINITY, -INFINITY};
      for (int64_t i = 0; i < std::min<int64_t>(3, drawn.numel()); ++i) x[i] = planted[i];
    }
    KILN_ASSIGN_OR_RETURN(Tensor t, drawn.CastTo(s.dtype));
    out[s.name] = std::move(t);
  }
  return out;
}

namespace {

struct Probe {
  std::string label;  // "sample 0", "synthetic", "non-finite"
  TensorMap inputs;
  bool synthetic = true;
};

// The probes of entry `i`: the samples that fit it, the synthetic probe and (with
// `with_non_finite`, when the entry takes a float input) the non-finite probe.
Result<std::vector<Probe>> EntryProbes(const ArmedCell& cell, size_t i, const Graph& graph,
                                       const Samples& samples, bool with_non_finite) {
  const EntryMetadata& e = cell.entries()[i];
  std::vector<Probe> probes;
  for (size_t s = 0; s < samples.size(); ++s) {
    std::string why;
    if (cell.Admit(samples[s], &why) == static_cast<int>(i)) {
      probes.push_back({"sample " + std::to_string(s), samples[s], false});
    }
  }
  // A concrete entry is probed at its class; a ranged entry at every probe point of its range
  // (each corner, and interior values of each symbol), the worst point deciding.
  std::vector<std::pair<std::string, EntryMetadata>> at;
  if (e.ranged) {
    for (const SymbolPoint& point : RangeProbePoints(*e.ranged)) {
      KILN_ASSIGN_OR_RETURN(EntryMetadata there, EntryAt(e, point));
      at.emplace_back(" at " + DescribePoint(point), std::move(there));
    }
  } else {
    at.emplace_back("", e);
  }
  for (const auto& [where, entry] : at) {
    const ProbeBounds bounds = ProbeIntBounds(graph, entry.shape_class);
    KILN_ASSIGN_OR_RETURN(TensorMap synthetic, ProbeInputs(entry, cell.lane(), 0, bounds));
    probes.push_back({"synthetic" + where, std::move(synthetic), true});
    bool has_float = false;
    for (const TensorSpec& s : entry.inputs) has_float = has_float || IsFloatDType(s.dtype);
    if (with_non_finite && has_float) {
      KILN_ASSIGN_OR_RETURN(TensorMap nf, ProbeInputs(entry, cell.lane(), 0, bounds, true));
      probes.push_back({"non-finite" + where, std::move(nf), true});
    }
  }
  return probes;
}

// One entry measured on its probes; `eager_out` (optional) receives eager's outputs per probe
// (empty maps for skipped probes).
Result<EntryNumerics> MeasureEntry(const ArmedCell& cell, size_t i, const Interpreter& eager,
                                   const WeightMap& weights, const NumericsThresholds& t,
                                   const std::vector<Probe>& probes) {
  EntryNumerics worst;
  worst.entry = static_cast<int>(i);
  bool any = false;
  for (const Probe& p : probes) {
    auto ref = eager.Run(p.inputs, &weights);
    if (!ref.ok()) {
      if (p.synthetic) {
        ++worst.skipped;
        continue;
      }
      return ref.status().WithContext("gate: eager refused " + p.label + " of entry " +
                                      std::to_string(i));
    }
    auto got = cell.Run(static_cast<int>(i), p.inputs);
    EntryNumerics n;
    if (got.ok()) {
      n = CompareOutputs(*ref, *got, t);
    } else {
      n.verdict = Verdict::kUnmeasurable;
      n.note = "the cell failed where eager ran: " + got.status().ToString();
    }
    if (!n.note.empty()) n.note = p.label + ": " + n.note;
    if (!any || Worse(n, worst)) {
      const int skipped = worst.skipped, probes_so_far = worst.probes;
      worst = n;
      worst.entry = static_cast<int>(i);
      worst.skipped = skipped;
      worst.probes = probes_so_far;
    }
    any = true;
    ++worst.probes;
  }
  if (!any) {
    worst.verdict = Verdict::kUnmeasurable;
    worst.note = "eager refused every synthetic probe (declare sample inputs for this target)";
  }
  return worst;
}

void AddEntry(GateReport& report, const EntryNumerics& n) {
  report.entries.push_back(n);
  const bool worse =
      report.worst_entry < 0 || Worse(n, report.entries[static_cast<size_t>(report.worst_entry)]);
  if (worse) {
    report.verdict = n.verdict;
    report.worst_entry = static_cast<int>(report.entries.size() - 1);
  }
}

}  // namespace

Result<GateReport> RunGate(const ArmedCell& cell, const Interpreter& eager,
                           const WeightMap& weights, const NumericsThresholds& t,
                           const Samples& samples) {
  GateReport report;
  for (size_t i = 0; i < cell.entries().size(); ++i) {
    KILN_ASSIGN_OR_RETURN(std::vector<Probe> probes,
                          EntryProbes(cell, i, eager.graph(), samples, true));
    KILN_ASSIGN_OR_RETURN(EntryNumerics n, MeasureEntry(cell, i, eager, weights, t, probes));
    AddEntry(report, n);
  }
  if (report.entries.empty()) report.verdict = Verdict::kUnmeasurable;
  return report;
}

// --- the fence -----------------------------------------------------------------------------

std::string FenceReport::Summary() const {
  std::string s = gate.Summary() + "; " + std::to_string(weights) +
                  " weights: " + std::to_string(measured) + " measured";
  if (!structural.empty()) {
    s += ", " + std::to_string(structural.size()) + " proven structurally (";
    for (size_t i = 0; i < structural.size() && i < 4; ++i) {
      s += (i ? ", " : "") + structural[i];
    }
    if (structural.size() > 4) s += ", ...";
    s += ")";
  }
  return s + "; " + std::to_string(perturbed_runs) + " perturbed checkpoints";
}

namespace {

// A run of kRun consecutive values of a weight, as the structural scan looks for it.
constexpr int64_t kRun = 4;

// True when a value is a simple constant that code (or a structural constant) may well hold for
// reasons of its own: small multiples of 1/64.
bool Simple(double v) {
  const double s = v * 64.0;
  return std::fabs(v) <= 64.0 && s == std::floor(s);
}

// Element offsets of up to four distinctive runs of `w` (spread across the tensor), or none.
std::vector<int64_t> DistinctiveRuns(const Tensor& w) {
  std::vector<int64_t> out;
  const int64_t n = w.numel();
  const int64_t esize = static_cast<int64_t>(DTypeSize(w.dtype()));
  // Runs of 16 bytes at least: 4 floats, 8 halves, 16 int8s.
  const int64_t len = std::max<int64_t>(kRun, 16 / std::max<int64_t>(esize, 1));
  if (n < len || w.dtype() == DType::kBool) return out;
  const bool wide_ints = !IsFloatDType(w.dtype()) && esize >= 4;
  auto distinctive = [&](int64_t at) {
    std::set<double> values;
    bool all_simple = true;
    for (int64_t k = 0; k < len; ++k) {
      const double v = w.GetAsDouble(at + k);
      values.insert(v);
      // Wide integers (int32 biases) are mostly small numbers code holds anyway.
      all_simple = all_simple && (wide_ints ? std::fabs(v) < 65536 : Simple(v));
    }
    return values.size() >= 3 && !all_simple;
  };
  int64_t next = 0;
  for (int q = 0; q < 4; ++q) {
    int64_t at = std::max(next, n * q / 4);
    for (; at + len <= n; ++at) {
      if (distinctive(at)) break;
    }
    if (at + len > n) break;
    out.push_back(at);
    next = at + len;
  }
  return out;
}

int64_t RunLength(const Tensor& w) {
  const int64_t esize = static_cast<int64_t>(DTypeSize(w.dtype()));
  return std::max<int64_t>(kRun, 16 / std::max<int64_t>(esize, 1));
}

// The float values of every hex float literal (%a form, as the emitter prints constants) in
// `source`, in order.
std::vector<float> HexFloatLiterals(std::string_view source) {
  std::vector<float> out;
  std::string token;
  for (size_t i = 0; i + 2 < source.size(); ++i) {
    if (source[i] != '0' || (source[i + 1] != 'x' && source[i + 1] != 'X')) continue;
    if (i > 0 && (std::isalnum(static_cast<unsigned char>(source[i - 1])) || source[i - 1] == '_' ||
                  source[i - 1] == '.')) {
      continue;
    }
    size_t j = i + 2;
    bool has_p = false;
    while (j < source.size()) {
      const char c = source[j];
      if (std::isxdigit(static_cast<unsigned char>(c)) || c == '.') {
        ++j;
      } else if ((c == 'p' || c == 'P') && !has_p) {
        has_p = true;
        ++j;
        if (j < source.size() && (source[j] == '+' || source[j] == '-')) ++j;
      } else {
        break;
      }
    }
    if (!has_p) continue;
    token.assign(source.substr(i, j - i));
    const bool negative = i > 0 && source[i - 1] == '-';
    const float v = std::strtof(token.c_str(), nullptr);
    out.push_back(negative ? -v : v);
    i = j - 1;
  }
  return out;
}

}  // namespace

std::vector<std::string> UnscannableWeights(const WeightMap& weights) {
  std::vector<std::string> out;
  for (const auto& [name, w] : weights) {
    if (DistinctiveRuns(w).empty()) out.push_back(name);
  }
  return out;
}

Status ScanForBakedWeights(const WeightMap& weights, const CellArtifacts& artifacts) {
  // Source literals indexed by bit pattern, for float32 weights.
  std::vector<float> literals;
  std::unordered_map<uint32_t, std::vector<size_t>> at;
  if (!artifacts.source.empty()) {
    literals = HexFloatLiterals(artifacts.source);
    for (size_t i = 0; i < literals.size(); ++i) {
      uint32_t bits;
      std::memcpy(&bits, &literals[i], 4);
      at[bits].push_back(i);
    }
  }
  for (const auto& [name, w] : weights) {
    const int64_t len = RunLength(w);
    const int64_t esize = static_cast<int64_t>(DTypeSize(w.dtype()));
    for (int64_t start : DistinctiveRuns(w)) {
      const char* bytes = static_cast<const char*>(w.raw_data()) + start * esize;
      const std::string_view needle(bytes, static_cast<size_t>(len * esize));
      if (!artifacts.shared_object.empty() &&
          artifacts.shared_object.find(needle) != std::string_view::npos) {
        return Status::Refused(StatusCode::kInvalidArgument, kRefusalFence,
                               "weight '" + name + "' (" + w.TypeString() +
                                   ") appears in the cell's shared object " + "(values " +
                                   std::to_string(start) + ".." + std::to_string(start + len - 1) +
                                   "); a weight value was baked into the code");
      }
      if (w.dtype() != DType::kFloat32 || literals.empty()) continue;
      const float* v = w.data<float>() + start;
      uint32_t first;
      std::memcpy(&first, v, 4);
      auto hit = at.find(first);
      if (hit == at.end()) continue;
      for (size_t pos : hit->second) {
        bool match = pos + static_cast<size_t>(len) <= literals.size();
        for (int64_t k = 1; match && k < len; ++k) {
          match = std::memcmp(&literals[pos + static_cast<size_t>(k)], &v[k], 4) == 0;
        }
        if (match) {
          return Status::Refused(
              StatusCode::kInvalidArgument, kRefusalFence,
              "weight '" + name + "' (" + w.TypeString() + ") appears in the generated source " +
                  "(values " + std::to_string(start) + ".." + std::to_string(start + len - 1) +
                  "); a weight value was baked into the code");
        }
      }
    }
  }
  return Status::OK();
}

namespace {

enum class Measured { kFollows, kDiverges, kUnmeasurable };

// Eager's outputs with the checkpoint the proof started from, per entry and probe.
struct Baseline {
  std::vector<std::vector<Probe>> probes;       // per entry
  std::vector<std::vector<TensorMap>> outputs;  // per entry, per probe
};

bool SameNonFinitePattern(const TensorMap& a, const TensorMap& b) {
  for (const auto& [name, x] : a) {
    auto it = b.find(name);
    if (it == b.end() || it->second.shape() != x.shape()) return false;
    for (int64_t i = 0; i < x.numel(); ++i) {
      if (FiniteClass(x.GetAsDouble(i)) != FiniteClass(it->second.GetAsDouble(i))) return false;
    }
  }
  return true;
}

class Fence {
 public:
  Fence(ArmedCell& cell, const Interpreter& eager, const WeightMap& weights,
        const NumericsThresholds& t, const FenceOptions& options)
      : cell_(cell), eager_(eager), weights_(weights), t_(t), options_(options) {}

  Status Prepare(const Samples& samples) {
    for (size_t i = 0; i < cell_.entries().size(); ++i) {
      KILN_ASSIGN_OR_RETURN(std::vector<Probe> all,
                            EntryProbes(cell_, i, eager_.graph(), samples, false));
      std::vector<Probe> kept;
      std::vector<TensorMap> outs;
      for (Probe& p : all) {
        auto out = eager_.Run(p.inputs, &weights_);
        if (!out.ok()) {
          if (p.synthetic) continue;  // the gate skipped it too
          return out.status().WithContext("fence: eager refused " + p.label);
        }
        kept.push_back(std::move(p));
        outs.push_back(std::move(out).value());
      }
      base_.probes.push_back(std::move(kept));
      base_.outputs.push_back(std::move(outs));
    }
    return Status::OK();
  }

  // Perturbs `names` with (scale, seed) and measures the cell against eager.
  Result<Measured> Measure(const std::vector<std::string>& names, double scale, uint64_t seed,
                           GateReport* report) {
    KILN_ASSIGN_OR_RETURN(WeightMap perturbed,
                          PerturbWeights(eager_.graph(), weights_, names, seed, scale));
    ++report_.perturbed_runs;
    GateReport gate;
    for (size_t i = 0; i < base_.probes.size(); ++i) {
      EntryNumerics worst;
      worst.entry = static_cast<int>(i);
      worst.verdict = Verdict::kHealthy;
      worst.cos = 1;
      worst.ret = 1;
      bool rebound = false;
      for (size_t k = 0; k < base_.probes[i].size(); ++k) {
        const Probe& p = base_.probes[i][k];
        auto ref = eager_.Run(p.inputs, &perturbed);
        // Eager failing, or gaining or losing a non-finite value, under the perturbation: it
        // left the weights' domain, and this checkpoint measures nothing.
        if (!ref.ok() || !SameNonFinitePattern(*ref, base_.outputs[i][k])) {
          KILN_RETURN_IF_ERROR(cell_.Rebind(weights_));
          return Measured::kUnmeasurable;
        }
        if (!rebound) {
          KILN_RETURN_IF_ERROR(cell_.Rebind(perturbed));
          rebound = true;
        }
        auto got = cell_.Run(static_cast<int>(i), p.inputs);
        EntryNumerics n;
        if (got.ok()) {
          n = CompareOutputs(*ref, *got, t_);
        } else {
          n.verdict = Verdict::kDestroyed;
          n.note = "the cell failed where eager ran: " + got.status().ToString();
        }
        if (!n.note.empty()) n.note = p.label + ": " + n.note;
        n.entry = static_cast<int>(i);
        n.probes = worst.probes + 1;
        if (Worse(n, worst)) worst = n;
        worst.probes = n.probes;
      }
      AddEntry(gate, worst);
    }
    KILN_RETURN_IF_ERROR(cell_.Rebind(weights_));
    if (gate.entries.empty()) gate.verdict = Verdict::kHealthy;
    *report = gate;
    // Eager survived: a finite output that diverges is the cell ignoring a weight.
    return gate.verdict == Verdict::kHealthy ? Measured::kFollows : Measured::kDiverges;
  }

  // Proves `names`: measured, or (one weight no perturbation can measure) structural.
  Status Prove(const std::vector<std::string>& names) {
    if (names.empty()) return Status::OK();
    for (size_t a = 0; a < kAttempts; ++a) {
      GateReport gate;
      KILN_ASSIGN_OR_RETURN(Measured m, Measure(names, kScales[a], options_.seed + a, &gate));
      if (m == Measured::kFollows) {
        report_.measured += static_cast<int>(names.size());
        Record(gate);
        return Status::OK();
      }
      if (m == Measured::kDiverges) return NameBaked(names, kScales[a], options_.seed + a, gate);
    }
    if (names.size() == 1) {
      const std::string& w = names[0];
      if (options_.structural_scan && !DistinctiveRuns(weights_.at(w)).empty()) {
        report_.structural.push_back(w);
        return Status::OK();
      }
      return Status::Refused(
          StatusCode::kInvalidArgument, kRefusalUnmeasurable,
          "fence: weight '" + w + "' (" + weights_.at(w).TypeString() +
              ") cannot be perturbed without eager's own outputs gaining or losing a non-finite "
              "value (scales 0.5, 0.1, 0.02), and holds no run of values distinctive enough for "
              "the "
              "structural scan; the fence cannot prove this cell follows it");
    }
    const size_t half = names.size() / 2;
    KILN_RETURN_IF_ERROR(Prove({names.begin(), names.begin() + half}));
    return Prove({names.begin() + half, names.end()});
  }

  FenceReport& report() { return report_; }

 private:
  static constexpr size_t kAttempts = 3;
  static constexpr double kScales[kAttempts] = {0.5, 0.1, 0.02};

  void Record(const GateReport& gate) {
    if (report_.gate.worst_entry < 0 ||
        Worse(gate.entries[static_cast<size_t>(gate.worst_entry)],
              report_.gate.entries[static_cast<size_t>(report_.gate.worst_entry)])) {
      report_.gate = gate;
    }
  }

  Status Baked(const std::string& name, const GateReport& gate) {
    return Status::Refused(StatusCode::kInvalidArgument, kRefusalFence,
                           "the cell does not follow weight '" + name +
                               "' (perturbed checkpoint: " + gate.Summary() +
                               "); a weight value was baked into the code");
  }

  // `names` diverged under (scale, seed): halve until one weight diverges on its own.
  Status NameBaked(const std::vector<std::string>& names, double scale, uint64_t seed,
                   const GateReport& gate) {
    if (names.size() == 1) return Baked(names[0], gate);
    const size_t half = names.size() / 2;
    const std::vector<std::string> parts[2] = {{names.begin(), names.begin() + half},
                                               {names.begin() + half, names.end()}};
    for (const auto& part : parts) {
      GateReport g;
      KILN_ASSIGN_OR_RETURN(Measured m, Measure(part, scale, seed, &g));
      if (m == Measured::kDiverges) return NameBaked(part, scale, seed, g);
    }
    // Neither half diverges alone: look at each weight of the set.
    for (const std::string& name : names) {
      GateReport g;
      KILN_ASSIGN_OR_RETURN(Measured m, Measure({name}, scale, seed, &g));
      if (m == Measured::kDiverges) return Baked(name, g);
    }
    std::string list;
    for (size_t i = 0; i < names.size() && i < 8; ++i) list += (i ? ", '" : "'") + names[i] + "'";
    if (names.size() > 8) list += ", ...";
    return Status::Refused(StatusCode::kInvalidArgument, kRefusalFence,
                           "with weights " + list + " perturbed together the cell is " +
                               gate.Summary() + ", though it follows each of them alone");
  }

  ArmedCell& cell_;
  const Interpreter& eager_;
  const WeightMap& weights_;
  NumericsThresholds t_;
  FenceOptions options_;
  Baseline base_;
  FenceReport report_;
};

}  // namespace

Result<FenceReport> RunFenceProof(ArmedCell& cell, const Interpreter& eager,
                                  const WeightMap& weights, const NumericsThresholds& t,
                                  const CellArtifacts& artifacts, const Samples& samples,
                                  const FenceOptions& options) {
  // S1: the constant table lists every weight the graph binds.
  const std::vector<std::string> bound = eager.graph().WeightNames();
  for (const EntryMetadata& e : cell.entries()) {
    std::set<std::string> listed;
    for (const TensorSpec& c : e.constants) listed.insert(c.name);
    for (const std::string& w : bound) {
      if (!listed.count(w)) {
        return Status::Refused(StatusCode::kInvalidArgument, kRefusalFence,
                               "entry " + std::to_string(e.index) +
                                   "'s constant table does not list weight '" + w + "'");
      }
    }
  }
  for (const std::string& w : bound) {
    if (!weights.count(w))
      return Status::InvalidArgument("fence: no value bound for weight '" + w + "'");
  }
  // S2: no distinctive run of any weight in the source or the shared object.
  if (options.structural_scan) KILN_RETURN_IF_ERROR(ScanForBakedWeights(weights, artifacts));
  // S3: perturbed checkpoints move the cell exactly as they move eager.
  Fence fence(cell, eager, weights, t, options);
  fence.report().weights = static_cast<int>(bound.size());
  Status prepared = fence.Prepare(samples);
  if (!prepared.ok()) {
    (void)cell.Rebind(weights);
    return prepared;
  }
  Status proven = fence.Prove(bound);
  KILN_RETURN_IF_ERROR(cell.Rebind(weights));
  KILN_RETURN_IF_ERROR(proven);
  if (bound.empty()) fence.report().gate.verdict = Verdict::kHealthy;
  return fence.report();
}

Result<StrictProof> ProveStrict(ArmedCell& cell, const Interpreter& eager, const WeightMap& weights,
                                const NumericsThresholds& t, const CellArtifacts& artifacts,
                                const Samples& samples, const StrictProofOptions& options) {
  const Clock::TimePoint start = Clock::Real()->Now();
  Result<GateReport> gate = RunGate(cell, eager, weights, t, samples);
  if (options.on_gate) options.on_gate(gate, MsSince(start));
  if (!gate.ok()) return gate.status();
  StrictProof proof;
  proof.gate = std::move(gate).value();
  if (proof.gate.verdict == Verdict::kUnmeasurable) {
    return Status::Refused(StatusCode::kInvalidArgument, kRefusalUnmeasurable,
                           proof.gate.Summary());
  }
  if (proof.gate.verdict != Verdict::kHealthy) {
    return Status::Refused(StatusCode::kInvalidArgument, kRefusalNumerics,
                           proof.gate.Summary() + "; only HEALTHY ships");
  }
  if (options.fence) {
    KILN_ASSIGN_OR_RETURN(proof.fence, RunFenceProof(cell, eager, weights, t, artifacts, samples));
  }
  return proof;
}

}  // namespace kiln
