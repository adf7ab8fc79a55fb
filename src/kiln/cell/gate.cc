// The numerics gate and the fence proof (see gate.h).
#include "src/kiln/cell/gate.h"

#include <cmath>
#include <cstdio>
#include <set>

namespace kiln {

const char* VerdictName(Verdict v) {
  switch (v) {
    case Verdict::kHealthy: return "HEALTHY";
    case Verdict::kDegraded: return "DEGRADED";
    case Verdict::kDestroyed: return "DESTROYED";
    case Verdict::kUnmeasurable: return "UNMEASURABLE";
  }
  return "?";
}

namespace {
int Severity(Verdict v) {
  switch (v) {
    case Verdict::kHealthy: return 0;
    case Verdict::kDegraded: return 1;
    case Verdict::kDestroyed: return 2;
    case Verdict::kUnmeasurable: return 3;
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

Result<TensorMap> ProbeInputs(const EntryMetadata& entry, Lane lane, uint64_t salt) {
  TensorMap out;
  for (const TensorSpec& s : entry.inputs) {
    uint64_t state = Mix(entry.index * 1000003ull + (lane == Lane::kExported ? 1 : 2) + salt);
    for (char c : s.name) state = Mix(state ^ static_cast<unsigned char>(c));
    KILN_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(s.dtype, s.shape));
    for (int64_t i = 0; i < t.numel(); ++i) {
      state = Mix(state);
      const double u = static_cast<double>(state >> 11) / 9007199254740992.0;  // [0,1)
      switch (s.dtype) {
        case DType::kFloat32: t.data<float>()[i] = static_cast<float>(2 * u - 1); break;
        case DType::kFloat64: t.data<double>()[i] = 2 * u - 1; break;
        case DType::kFloat16: t.data<uint16_t>()[i] = FloatToHalf(static_cast<float>(2 * u - 1)); break;
        // Small non-negative integers: valid token ids / indices for any vocabulary >= 8.
        case DType::kInt64: t.data<int64_t>()[i] = static_cast<int64_t>(u * 8); break;
        case DType::kInt32: t.data<int32_t>()[i] = static_cast<int32_t>(u * 8); break;
        case DType::kInt8: t.data<int8_t>()[i] = static_cast<int8_t>(u * 8); break;
        case DType::kUInt8: t.data<uint8_t>()[i] = static_cast<uint8_t>(u * 8); break;
        case DType::kBool: t.data<uint8_t>()[i] = u < 0.5 ? 0 : 1; break;
        case DType::kInt16: t.data<int16_t>()[i] = static_cast<int16_t>(u * 8); break;
        case DType::kUInt16: t.data<uint16_t>()[i] = static_cast<uint16_t>(u * 8); break;
        case DType::kUInt32: t.data<uint32_t>()[i] = static_cast<uint32_t>(u * 8); break;
        case DType::kUInt64: t.data<uint64_t>()[i] = static_cast<uint64_t>(u * 8); break;
      }
    }
    out[s.name] = std::move(t);
  }
  return out;
}

Result<GateReport> RunGate(const ArmedCell& cell, const Interpreter& eager,
                           const WeightMap& weights, const NumericsThresholds& t) {
  GateReport report;
  report.verdict = Verdict::kHealthy;
  for (size_t i = 0; i < cell.entries().size(); ++i) {
    const EntryMetadata& e = cell.entries()[i];
    KILN_ASSIGN_OR_RETURN(TensorMap probe, ProbeInputs(e, cell.lane()));
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
    const bool worse =
        report.worst_entry < 0 || Severity(n.verdict) > Severity(report.verdict) ||
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
        return Status::InvalidArgument("fence_refused: entry " + std::to_string(e.index) +
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
      return Status::InvalidArgument("fence_refused: the cell does not follow weight '" + name +
                                     "' (perturbed checkpoint: " + r->Summary() +
                                     "); a weight value was baked into the code");
    }
  }
  KILN_RETURN_IF_ERROR(cell.Rebind(weights));
  return Status::InvalidArgument("fence_refused: with a perturbed checkpoint the cell is " +
                                 report->Summary());
}

}  // namespace kiln
