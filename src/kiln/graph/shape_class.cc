// Shape classes in words, and the exact-fit test of a request against one (graph layer; see
// shape_class.h).
#include "src/kiln/graph/shape_class.h"

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
    out += (first ? " " : ";") + symbol + "=[" + std::to_string(range.first) + "," +
           std::to_string(range.second) + "]";
    first = false;
  }
  return out + "}";
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

}  // namespace kiln
