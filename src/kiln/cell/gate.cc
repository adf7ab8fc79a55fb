// The numerics gate and the fence proof (see gate.h).
#include "src/kiln/cell/gate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

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
}  // namespace

std::string GateReport::Summary() const {
  char buf[256];
  if (worst_entry < 0) return std::string(VerdictName(verdict)) + " (no entry measured)";
  const EntryNumerics& w = entries[static_cast<size_t>(worst_entry)];
  std::snprintf(buf, sizeof(buf), "%s (worst entry %d: cos=%.9f ret=%.9f rel_l2=%.3g)",
                VerdictName(verdict), w.entry, w.cos, w.ret, w.rel_l2);
  return buf;
}

EntryNumerics CompareOutputs(const TensorMap& reference, const TensorMap& candidate,
                             const NumericsThresholds& t) {
  EntryNumerics n;
  double rs = 0, rr = 0, ss = 0, dd = 0;
  for (const auto& [name, r] : reference) {
    auto it = candidate.find(name);
    if (it == candidate.end() || it->second.shape() != r.shape()) {
      n.verdict = Verdict::kUnmeasurable;
      return n;
    }
    for (int64_t i = 0; i < r.numel(); ++i) {
      const double a = r.GetAsDouble(i), b = it->second.GetAsDouble(i);
      if (!std::isfinite(a) || !std::isfinite(b)) {
        n.verdict = Verdict::kUnmeasurable;
        return n;
      }
      rs += a * b;
      rr += a * a;
      ss += b * b;
      dd += (a - b) * (a - b);
    }
  }
  const double nr = std::sqrt(rr), ns = std::sqrt(ss);
  if (nr == 0 && ns == 0) {
    n.cos = 1;
    n.ret = 1;
  } else if (nr == 0 || ns == 0) {
    n.cos = 0;
    n.ret = nr == 0 ? INFINITY : 0;
  } else {
    n.cos = rs / (nr * ns);
    n.ret = ns / nr;
  }
  n.rel_l2 = nr == 0 ? (ns == 0 ? 0 : INFINITY) : std::sqrt(dd) / nr;
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

std::map<std::string, int64_t> ProbeIntBounds(const Graph& graph) {
  std::map<std::string, int64_t> bounds;
  for (const ValueInfo& in : graph.inputs) {
    if (IsFloatDType(in.dtype) || in.dtype == DType::kBool) continue;
    // Values carrying the input's integers unchanged; nodes are in topological order.
    std::set<std::string> same = {in.name};
    int64_t bound = 0;  // 0 = none found
    auto tighten = [&](int64_t b) {
      if (b > 0) bound = bound == 0 ? b : std::min(bound, b);
    };
    for (const Node& n : graph.nodes) {
      if (!n.domain.empty() || n.inputs.empty()) continue;
      const auto uses = [&](size_t i) { return i < n.inputs.size() && same.count(n.inputs[i]); };
      if (uses(0) &&
          (n.op_type == "Cast" || n.op_type == "Identity" || n.op_type == "Reshape" ||
           n.op_type == "Squeeze" || n.op_type == "Unsqueeze" || n.op_type == "Flatten")) {
        for (const std::string& o : n.outputs) same.insert(o);
      } else if (n.op_type == "Gather" && uses(1)) {
        auto table = graph.initializers.find(n.inputs[0]);
        if (table == graph.initializers.end()) continue;
        const Shape& shape = table->second.shape();
        int64_t axis = n.GetInt("axis", 0);
        if (axis < 0) axis += static_cast<int64_t>(shape.size());
        if (axis >= 0 && axis < static_cast<int64_t>(shape.size())) tighten(shape[axis]);
      } else if (n.op_type == "OneHot" && uses(0) && n.inputs.size() > 1) {
        auto depth = graph.initializers.find(n.inputs[1]);
        if (depth != graph.initializers.end() && depth->second.numel() == 1) {
          tighten(static_cast<int64_t>(depth->second.GetAsDouble(0)));
        }
      }
    }
    if (bound > 0) bounds[in.name] = bound;
  }
  return bounds;
}

Result<TensorMap> ProbeInputs(const EntryMetadata& entry, Lane lane, uint64_t salt,
                              const std::map<std::string, int64_t>& int_bounds) {
  TensorMap out;
  for (const TensorSpec& s : entry.inputs) {
    auto b = int_bounds.find(s.name);
    // Integers are drawn from [0, range): small non-negative values are valid token ids and
    // indices for any table of at least 8 rows, and a bounded input stays inside its table.
    const double range =
        b == int_bounds.end() ? 8.0 : static_cast<double>(std::min<int64_t>(8, b->second));
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
      x[i] = is_float ? 2 * u - 1 : s.dtype == DType::kBool ? (u < 0.5 ? 0 : 1) : u * range;
    }
    KILN_ASSIGN_OR_RETURN(Tensor t, drawn.CastTo(s.dtype));
    out[s.name] = std::move(t);
  }
  return out;
}

Result<GateReport> RunGate(const ArmedCell& cell, const Interpreter& eager,
                           const WeightMap& weights, const NumericsThresholds& t) {
  GateReport report;
  report.verdict = Verdict::kHealthy;
  const std::map<std::string, int64_t> bounds = ProbeIntBounds(eager.graph());
  for (size_t i = 0; i < cell.entries().size(); ++i) {
    const EntryMetadata& e = cell.entries()[i];
    KILN_ASSIGN_OR_RETURN(TensorMap probe, ProbeInputs(e, cell.lane(), 0, bounds));
    KILN_ASSIGN_OR_RETURN(TensorMap ref, eager.Run(probe, &weights));
    CellRunError err;
    auto got = cell.Run(static_cast<int>(i), probe, &err);
    EntryNumerics n;
    if (got.ok()) {
      n = CompareOutputs(ref, *got, t);
    } else {
      n.verdict = Verdict::kUnmeasurable;
    }
    n.entry = static_cast<int>(i);
    report.entries.push_back(n);
    const bool worse = report.worst_entry < 0 || Severity(n.verdict) > Severity(report.verdict) ||
                       (Severity(n.verdict) == Severity(report.verdict) &&
                        n.cos < report.entries[static_cast<size_t>(report.worst_entry)].cos);
    if (worse) {
      report.verdict = n.verdict;
      report.worst_entry = static_cast<int>(i);
    }
  }
  if (report.entries.empty()) report.verdict = Verdict::kUnmeasurable;
  return report;
}

Result<GateReport> RunFenceProof(ArmedCell& cell, const Interpreter& eager,
                                 const WeightMap& weights, const NumericsThresholds& t,
                                 uint64_t seed) {
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
  // S2: a perturbed checkpoint must move the cell exactly as it moves eager.
  KILN_ASSIGN_OR_RETURN(WeightMap perturbed, DeriveCheckpoint(eager.graph(), seed, 0.5));
  KILN_RETURN_IF_ERROR(cell.Rebind(perturbed));
  auto report = RunGate(cell, eager, perturbed, t);
  Status restore = cell.Rebind(weights);
  if (!report.ok()) return report.status();
  KILN_RETURN_IF_ERROR(restore);
  if (report->verdict == Verdict::kHealthy) return report;
  // S3: name the weight: perturb one at a time until the cell stops following eager.
  for (const std::string& name : bound) {
    WeightMap one = weights;
    one[name] = perturbed.at(name);
    KILN_RETURN_IF_ERROR(cell.Rebind(one));
    auto r = RunGate(cell, eager, one, t);
    if (r.ok() && r->verdict != Verdict::kHealthy) {
      KILN_RETURN_IF_ERROR(cell.Rebind(weights));
      return Status::Refused(StatusCode::kInvalidArgument, kRefusalFence,
                             "the cell does not follow weight '" + name +
                                 "' (perturbed checkpoint: " + r->Summary() +
                                 "); a weight value was baked into the code");
    }
  }
  KILN_RETURN_IF_ERROR(cell.Rebind(weights));
  return Status::Refused(StatusCode::kInvalidArgument, kRefusalFence,
                         "with a perturbed checkpoint the cell is " + report->Summary());
}

}  // namespace kiln
