// Shape classes in words, and the exact-fit test of a request against one (graph layer; see
// shape_class.h).
#include "src/kiln/graph/shape_class.h"

#include <algorithm>
#include <cctype>

namespace kiln {

std::string DescribeClasses(const std::vector<ShapeClass>& classes) {
  std::string out;
  for (const ShapeClass& c : classes) {
    if (!out.empty()) out += ",";
    out += "{";
    bool first = true;
    for (const auto& [name, shape] : c) {
      out += (first ? "" : ";") + name + "=" + ShapeToString(shape);
      first = false;
    }
    out += "}";
  }
  return out;
}

std::string DescribeRanged(const RangedEntry& entry) {
  std::string out = "{";
  bool first = true;
  for (const auto& [name, dims] : entry.inputs) {
    out += (first ? "" : ";") + name + "=[";
    for (size_t i = 0; i < dims.size(); ++i) {
      out +=
          (i ? "," : "") + (dims[i].symbol.empty() ? std::to_string(dims[i].size) : dims[i].symbol);
    }
    out += "]";
    first = false;
  }
  first = true;
  for (const auto& [symbol, range] : entry.ranges) {
    out += (first ? " " : ";") + symbol + "=[";
    const std::vector<int64_t> spec = RangeSpec(entry, symbol);
    for (size_t i = 0; i < spec.size(); ++i) out += (i ? "," : "") + std::to_string(spec[i]);
    out += "]";
    first = false;
  }
  return out + "}";
}

int64_t StepOf(const RangedEntry& entry, const std::string& symbol) {
  auto it = entry.steps.find(symbol);
  return it == entry.steps.end() ? 1 : it->second;
}

std::vector<int64_t> RangeSpec(const RangedEntry& entry, const std::string& symbol) {
  auto it = entry.ranges.find(symbol);
  if (it == entry.ranges.end()) return {};
  const int64_t step = StepOf(entry, symbol);
  if (step == 1) return {it->second.first, it->second.second};
  return {it->second.first, it->second.second, step};
}

bool SetRangeSpec(RangedEntry* entry, const std::string& symbol, const std::vector<int64_t>& spec) {
  if (spec.size() != 2 && spec.size() != 3) return false;
  entry->ranges[symbol] = {spec[0], spec[1]};
  if (spec.size() == 3) {
    entry->steps[symbol] = spec[2];
  } else {
    entry->steps.erase(symbol);
  }
  return true;
}

int64_t CoordinateOf(const RangedEntry& entry, const std::string& symbol, int64_t value) {
  return value / StepOf(entry, symbol);
}

int64_t ValueAt(const RangedEntry& entry, const std::string& symbol, int64_t coordinate) {
  const int64_t step = StepOf(entry, symbol);
  if (step == 1) return coordinate;
  auto it = entry.ranges.find(symbol);
  const int64_t lo = it == entry.ranges.end() ? 0 : it->second.first;
  return coordinate * step + lo % step;
}

Status CheckRangedEntry(const RangedEntry& entry, const std::string& what) {
  if (entry.inputs.empty()) return Status::InvalidArgument(what + " names no input");
  std::map<std::string, bool> used;
  for (const auto& [symbol, range] : entry.ranges) used[symbol] = false;
  for (const auto& [name, dims] : entry.inputs) {
    for (size_t i = 0; i < dims.size(); ++i) {
      const std::string at = what + " input '" + name + "' dim " + std::to_string(i);
      if (dims[i].symbol.empty()) {
        if (dims[i].size < 0) {
          return Status::InvalidArgument(at + " is " + std::to_string(dims[i].size) +
                                         ", expected a size >= 0 or a symbol");
        }
        continue;
      }
      if (!IsSymbolName(dims[i].symbol)) {
        return Status::InvalidArgument(at + " is '" + dims[i].symbol +
                                       "', expected a symbol [A-Za-z_][A-Za-z0-9_]*");
      }
      auto it = used.find(dims[i].symbol);
      if (it == used.end()) {
        return Status::InvalidArgument(at + " is symbol '" + dims[i].symbol +
                                       "', which has no range; expected ranges = { " +
                                       dims[i].symbol + " = [lo, hi] }");
      }
      it->second = true;
    }
  }
  for (const auto& [symbol, range] : entry.ranges) {
    if (!used[symbol]) {
      return Status::InvalidArgument(what + " gives a range for '" + symbol +
                                     "', which no input dim names");
    }
    if (range.first < 0 || range.first > range.second) {
      return Status::InvalidArgument(what + " range of '" + symbol + "' is [" +
                                     std::to_string(range.first) + ", " +
                                     std::to_string(range.second) + "], expected 0 <= lo <= hi");
    }
  }
  for (const auto& [symbol, step] : entry.steps) {
    auto range = entry.ranges.find(symbol);
    if (range == entry.ranges.end()) {
      return Status::InvalidArgument(what + " gives a step for '" + symbol +
                                     "', which has no range");
    }
    const auto [lo, hi] = range->second;
    if (step < 2 || step > (int64_t{1} << 30)) {
      return Status::InvalidArgument(what + " step of '" + symbol + "' is " + std::to_string(step) +
                                     ", expected an integer in [2, 2^30] (leave it out for 1)");
    }
    if ((hi - lo) % step != 0) {
      return Status::InvalidArgument(
          what + " range of '" + symbol + "' is [" + std::to_string(lo) + ", " +
          std::to_string(hi) + ", " + std::to_string(step) + "]: " + std::to_string(hi) +
          " is not on the step's grid from " + std::to_string(lo) +
          "; expected hi = " + std::to_string(lo + (hi - lo) / step * step) + " or " +
          std::to_string(lo + ((hi - lo) / step + 1) * step));
    }
  }
  if (used.empty()) {
    return Status::InvalidArgument(what + " has ranges but no symbolic dim; declare it as a class");
  }
  return Status::OK();
}

bool IsSymbolName(const std::string& s) {
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0]))) return false;
  for (char c : s) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  }
  return true;
}

std::string DescribeEnvelope(const Envelope& envelope) {
  std::string out = DescribeClasses(envelope.classes);
  for (const RangedEntry& r : envelope.ranged) out += (out.empty() ? "" : ",") + DescribeRanged(r);
  return out;
}

ShapeClass ShapesOf(const std::map<std::string, Tensor>& inputs) {
  ShapeClass out;
  for (const auto& [name, t] : inputs) out.emplace(name, t.shape());
  return out;
}

bool MayOverlap(const RangedEntry& a, const RangedEntry& b) {
  if (a.inputs.size() != b.inputs.size()) return false;
  auto range = [](const RangedEntry& e, const DimSpec& d) -> std::pair<int64_t, int64_t> {
    if (d.symbol.empty()) return {d.size, d.size};
    auto it = e.ranges.find(d.symbol);
    return it == e.ranges.end() ? std::make_pair(int64_t{1}, int64_t{0}) : it->second;
  };
  for (const auto& [name, dims] : a.inputs) {
    auto it = b.inputs.find(name);
    if (it == b.inputs.end() || it->second.size() != dims.size()) return false;
    for (size_t i = 0; i < dims.size(); ++i) {
      const auto [alo, ahi] = range(a, dims[i]);
      const auto [blo, bhi] = range(b, it->second[i]);
      if (ahi < blo || bhi < alo) return false;
    }
  }
  return true;
}

RangedMatch MatchRanged(const RangedEntry& entry, const ShapeClass& inputs) {
  RangedMatch m;
  if (inputs.size() != entry.inputs.size()) {
    m.detail = "the request has " + std::to_string(inputs.size()) + " inputs, the entry " +
               std::to_string(entry.inputs.size());
    return m;
  }
  for (const auto& [name, dims] : entry.inputs) {
    auto it = inputs.find(name);
    if (it == inputs.end()) {
      m.detail = "input '" + name + "' is missing";
      return m;
    }
    if (it->second.size() != dims.size()) {
      m.detail = "input '" + name + "' is " + ShapeToString(it->second) +
                 ", the entry takes rank " + std::to_string(dims.size());
      return m;
    }
  }
  // Fixed dims next, then symbol consistency, then ranges: the kinds from worst to best.
  for (const auto& [name, dims] : entry.inputs) {
    const Shape& shape = inputs.at(name);
    for (size_t i = 0; i < dims.size(); ++i) {
      if (dims[i].symbol.empty() && shape[i] != dims[i].size) {
        m.fit = RangedFit::kDim;
        m.detail = "input '" + name + "' is " + ShapeToString(shape) + ", dim " +
                   std::to_string(i) + " must be " + std::to_string(dims[i].size);
        return m;
      }
    }
  }
  std::map<std::string, std::pair<int64_t, std::string>> bound;  // symbol -> (value, where)
  for (const auto& [name, dims] : entry.inputs) {
    const Shape& shape = inputs.at(name);
    for (size_t i = 0; i < dims.size(); ++i) {
      if (dims[i].symbol.empty()) continue;
      const std::string where = "input '" + name + "' dim " + std::to_string(i);
      auto [it, fresh] = bound.emplace(dims[i].symbol, std::make_pair(shape[i], where));
      if (!fresh && it->second.first != shape[i]) {
        m.fit = RangedFit::kSymbolInconsistent;
        m.detail = "symbol '" + dims[i].symbol + "' is " + std::to_string(it->second.first) +
                   " at " + it->second.second + " but " + std::to_string(shape[i]) + " at " +
                   where + "; expected one value across the inputs";
        return m;
      }
    }
  }
  for (const auto& [symbol, vw] : bound) {
    auto range = entry.ranges.find(symbol);
    const int64_t lo = range == entry.ranges.end() ? 1 : range->second.first;
    const int64_t hi = range == entry.ranges.end() ? 0 : range->second.second;
    if (vw.first < lo || vw.first > hi) {
      m.fit = RangedFit::kOutOfRange;
      m.detail = "symbol '" + symbol + "' is " + std::to_string(vw.first) + " (" + vw.second +
                 "), outside its declared range [" + std::to_string(lo) + ", " +
                 std::to_string(hi) + "]";
      return m;
    }
    const int64_t step = StepOf(entry, symbol);
    if ((vw.first - lo) % step != 0) {
      m.fit = RangedFit::kOutOfRange;
      m.detail = "symbol '" + symbol + "' is " + std::to_string(vw.first) + " (" + vw.second +
                 "), not one of its declared values " + std::to_string(lo) + ", " +
                 std::to_string(lo + step) + ", ..., " + std::to_string(hi) + " (step " +
                 std::to_string(step) + ")";
      return m;
    }
    m.values[symbol] = vw.first;
  }
  m.fit = RangedFit::kFits;
  return m;
}

bool InputsFitClass(const ShapeClass& shape_class, const std::map<std::string, Tensor>& inputs) {
  if (inputs.size() != shape_class.size()) return false;
  for (const auto& [name, shape] : shape_class) {
    auto it = inputs.find(name);
    if (it == inputs.end() || it->second.shape() != shape) return false;
  }
  return true;
}

std::vector<RangedEntry> RangedPieces(const RangedEntry& entry) {
  std::vector<RangedEntry> pieces{entry};
  for (const auto& [name, range] : entry.ranges) {
    if (range.first >= 2 || range.second < 2) continue;
    std::vector<RangedEntry> next;
    const int64_t step = StepOf(entry, name);
    int64_t first_high = range.first;  // the first value >= 2 on the grid
    while (first_high < 2) first_high += step;
    for (const RangedEntry& p : pieces) {
      for (int64_t v = range.first; v < 2; v += step) {
        RangedEntry low = p;
        low.ranges[name] = {v, v};
        low.steps.erase(name);
        next.push_back(std::move(low));
      }
      if (first_high > range.second) continue;
      RangedEntry high = p;
      high.ranges[name] = {first_high, range.second};
      if (first_high == range.second) high.steps.erase(name);
      next.push_back(std::move(high));
    }
    pieces = std::move(next);
  }
  return pieces;
}

namespace {

constexpr size_t kMaxProbeSymbols = 6;

// The middle of a symbol's values (on its grid).
int64_t Middle(const RangedEntry& e, const std::string& s) {
  const auto& r = e.ranges.at(s);
  const int64_t step = StepOf(e, s);
  return r.first + (r.second - r.first) / step / 2 * step;
}

// Interior values of a symbol: a small one near lo (lo + 6 as a short sequence; lo + step on a
// grid) and the middle.
std::vector<int64_t> InteriorValues(const RangedEntry& e, const std::string& s) {
  const auto& r = e.ranges.at(s);
  const int64_t step = StepOf(e, s);
  const int64_t small = step == 1 ? std::min(r.first + 6, r.second - 1) : r.first + step;
  std::vector<int64_t> out;
  for (int64_t v : {small, Middle(e, s)}) {
    if (v > r.first && v < r.second && std::find(out.begin(), out.end(), v) == out.end()) {
      out.push_back(v);
    }
  }
  return out;
}

}  // namespace

std::vector<std::string> FreeSymbols(const RangedEntry& entry) {
  std::vector<std::string> out;
  for (const auto& [name, range] : entry.ranges) {
    if (range.first < range.second) out.push_back(name);
  }
  return out;
}

Status CheckRangedProbes(const RangedEntry& entry) {
  const size_t free = FreeSymbols(entry).size();
  if (free > kMaxProbeSymbols) {
    return Status::InvalidArgument("ranged entry " + DescribeRanged(entry) + " has " +
                                   std::to_string(free) + " symbols with a range; at most " +
                                   std::to_string(kMaxProbeSymbols) +
                                   " can be checked at every corner");
  }
  return Status::OK();
}

std::vector<SymbolPoint> RangeProbePoints(const RangedEntry& entry) {
  const std::vector<std::string> free = FreeSymbols(entry);
  SymbolPoint fixed;
  for (const auto& [name, range] : entry.ranges) fixed[name] = range.first;
  std::vector<SymbolPoint> points;
  auto add = [&](SymbolPoint p) {
    if (std::find(points.begin(), points.end(), p) == points.end()) points.push_back(std::move(p));
  };
  const size_t m = std::min(free.size(), kMaxProbeSymbols);
  for (size_t corner = 0; corner < (size_t{1} << m); ++corner) {
    SymbolPoint p = fixed;
    for (size_t b = 0; b < m; ++b) {
      const auto& range = entry.ranges.at(free[b]);
      p[free[b]] = (corner & (size_t{1} << b)) ? range.second : range.first;
    }
    add(std::move(p));
  }
  for (const std::string& s : free) {
    for (int64_t v : InteriorValues(entry, s)) {
      SymbolPoint p = fixed;
      for (const std::string& other : free) p[other] = Middle(entry, other);
      p[s] = v;
      add(std::move(p));
    }
  }
  return points;
}

SymDim SymDim::Constant(int64_t c) {
  SymDim d;
  if (c != 0) d.terms[{}] = c;
  return d;
}

bool SymDim::IsConstant() const {
  return terms.empty() || (terms.size() == 1 && terms.begin()->first.empty());
}

int64_t SymDim::ConstantValue() const { return terms.empty() ? 0 : terms.begin()->second; }

bool SymDim::Eval(const SymbolPoint& point, int64_t* out) const {
  int64_t sum = 0;
  for (const auto& [names, coeff] : terms) {
    int64_t term = coeff;
    for (const std::string& n : names) {
      auto it = point.find(n);
      if (it == point.end() || __builtin_mul_overflow(term, it->second, &term)) return false;
    }
    if (__builtin_add_overflow(sum, term, &sum)) return false;
  }
  *out = sum;
  return true;
}

std::string SymDim::ToString() const {
  std::string s;
  auto append = [&](int64_t coeff, const std::vector<std::string>& names) {
    std::string body;
    for (const std::string& n : names) body += (body.empty() ? "" : "*") + n;
    const int64_t mag = coeff < 0 ? -coeff : coeff;
    std::string piece = body.empty() ? std::to_string(mag)
                        : mag == 1   ? body
                                     : std::to_string(mag) + "*" + body;
    if (s.empty()) {
      s = (coeff < 0 ? "-" : "") + piece;
    } else {
      s += (coeff < 0 ? "-" : "+") + piece;
    }
  };
  for (const auto& [names, coeff] : terms) {
    if (!names.empty()) append(coeff, names);
  }
  auto constant = terms.find({});
  if (constant != terms.end()) append(constant->second, {});
  return s.empty() ? "0" : s;
}

Result<SymDim> ParseSymDim(const std::string& text) {
  auto bad = [&](const std::string& why) {
    return Status::InvalidArgument("dim polynomial '" + text + "' " + why +
                                   "; expected terms like 2*batch*seq+1");
  };
  if (text.empty() || text.size() > 4096) return bad("is empty or longer than 4096 characters");
  SymDim out;
  size_t i = 0;
  bool first = true;
  while (i < text.size()) {
    int64_t sign = 1;
    if (text[i] == '+' || text[i] == '-') {
      sign = text[i] == '-' ? -1 : 1;
      ++i;
    } else if (!first) {
      return bad("has no sign between two terms");
    }
    first = false;
    int64_t coeff = 1;
    bool has_coeff = false;
    std::vector<std::string> names;
    for (bool factor = true; factor;) {
      if (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
        if (has_coeff) return bad("has two numbers in one term");
        int64_t n = 0;
        for (; i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])); ++i) {
          if (__builtin_mul_overflow(n, 10, &n) || __builtin_add_overflow(n, text[i] - '0', &n)) {
            return bad("has a coefficient past 64 bits");
          }
        }
        coeff = n;
        has_coeff = true;
      } else {
        size_t j = i;
        while (j < text.size() &&
               (std::isalnum(static_cast<unsigned char>(text[j])) || text[j] == '_')) {
          ++j;
        }
        const std::string name = text.substr(i, j - i);
        if (!IsSymbolName(name)) return bad("has a factor that is no number or symbol");
        if (std::find(names.begin(), names.end(), name) != names.end()) {
          return bad("repeats symbol '" + name + "' in one term");
        }
        names.push_back(name);
        i = j;
      }
      factor = i < text.size() && text[i] == '*';
      if (factor) ++i;
    }
    std::sort(names.begin(), names.end());
    int64_t& slot = out.terms[names];
    if (__builtin_mul_overflow(coeff, sign, &coeff) || __builtin_add_overflow(slot, coeff, &slot)) {
      return bad("overflows 64 bits");
    }
    if (slot == 0) out.terms.erase(names);
  }
  return out;
}

ShapeClass ShapesAt(const RangedEntry& entry, const SymbolPoint& point) {
  ShapeClass shapes;
  for (const auto& [input, dims] : entry.inputs) {
    Shape& shape = shapes[input];
    for (const DimSpec& d : dims) {
      auto it = d.symbol.empty() ? point.end() : point.find(d.symbol);
      shape.push_back(it == point.end() ? d.size : it->second);
    }
  }
  return shapes;
}

std::string DescribePoint(const SymbolPoint& point) {
  std::string s;
  for (const auto& [name, v] : point) {
    s += (s.empty() ? "" : ", ") + name + "=" + std::to_string(v);
  }
  return s.empty() ? "(no symbols)" : s;
}

}  // namespace kiln
