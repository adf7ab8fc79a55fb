// The generated program over a range (see ranged_emit.h): emit at a grid, split the text at its
// integer literals, fit the ones that change, hold the fit to every probe point.
#include "src/kiln/compile/ranged_emit.h"

#include <algorithm>
#include <cctype>

namespace kiln {

namespace {

constexpr int kMaxDegree = 2;

bool IsIdentChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_' || c == '.';
}

std::string PointText(const SymbolPoint& point) { return "{" + DescribePoint(point) + "}"; }

// The line of `text` that holds byte `offset`, trimmed to 100 characters, for a finding.
std::string LineAt(const std::string& text, size_t offset) {
  offset = std::min(offset, text.size());
  const size_t nl = offset == 0 ? std::string::npos : text.rfind('\n', offset - 1);
  const size_t start = nl == std::string::npos ? 0 : nl + 1;
  size_t end = text.find('\n', start);
  if (end == std::string::npos) end = text.size();
  std::string line = text.substr(start, end - start);
  const size_t first = line.find_first_not_of(" \t");
  line = first == std::string::npos ? "" : line.substr(first);
  if (line.size() > 100) line = line.substr(0, 100) + "...";
  return line;
}

// Where two splits' skeletons first differ: the byte offset in each text.
std::pair<size_t, size_t> FirstDifference(const LiteralSplit& a, const LiteralSplit& b) {
  size_t k = 0;
  while (k < a.pieces.size() && k < b.pieces.size() && a.pieces[k] == b.pieces[k]) ++k;
  auto piece_start = [k](const LiteralSplit& s) -> size_t {
    if (k == 0 || k > s.offsets.size()) return 0;
    return s.offsets[k - 1] + std::to_string(s.literals[k - 1]).size();
  };
  size_t common = 0;
  if (k < a.pieces.size() && k < b.pieces.size()) {
    const std::string& x = a.pieces[k];
    const std::string& y = b.pieces[k];
    while (common < x.size() && common < y.size() && x[common] == y[common]) ++common;
  }
  return {piece_start(a) + common, piece_start(b) + common};
}

// Where byte `offset` of entry 0's source sits (ranged_emit.h: what a varying literal there needs).
std::string RegionAt(const std::string& text, size_t offset) {
  const size_t entry = text.find("#if !defined(KILN_ENTRY) || KILN_ENTRY == 0");
  const size_t init = text.find("kiln_e0_init(kiln_cell_entry* E)");
  const size_t run = text.find("kiln_e0_run(kiln_cell_entry* E,");
  const size_t dispatch = text.find("#if !defined(KILN_ENTRY) || KILN_ENTRY < 0");
  if (dispatch != std::string::npos && offset >= dispatch) return "dispatch";
  if (run != std::string::npos && offset >= run) return "run";
  if (init != std::string::npos && offset >= init) return "init";
  if (entry != std::string::npos && offset >= entry) return "tables";
  return "prologue";
}

// The workspace of a ranged entry is planned once, at the range's maximum, and every point
// uses that plan: the same buffers live over the same kernels (the skeleton says the program is
// the same), and each is no larger than at the maximum, so allocations that did not meet there
// do not meet at any point. An error names a buffer that is larger here, or a program whose
// buffers are not the maximum's.
Status ApplyPlanAtMaximum(Program& at_point, const Program& at_max) {
  if (at_point.buffers.size() != at_max.buffers.size()) {
    return Status::InvalidArgument("the program has " + std::to_string(at_point.buffers.size()) +
                                   " buffers, at the range's maximum " +
                                   std::to_string(at_max.buffers.size()));
  }
  for (size_t i = 0; i < at_point.buffers.size(); ++i) {
    Buffer& b = at_point.buffers[i];
    const Buffer& m = at_max.buffers[i];
    if ((b.offset >= 0) != (m.offset >= 0)) {
      return Status::InvalidArgument("buffer '" + b.name +
                                     "' is planned in the workspace at one of the point and "
                                     "the range's maximum only");
    }
    if (b.offset < 0) continue;
    if (b.bytes() > m.bytes()) {
      return Status::InvalidArgument("buffer '" + b.name + "' has " + std::to_string(b.bytes()) +
                                     " bytes, at the range's maximum " + std::to_string(m.bytes()));
    }
    b.offset = m.offset;
  }
  at_point.workspace_bytes = at_max.workspace_bytes;
  return at_point.Verify();
}

// The source the compiler writes for entry 0 at `point` as a ranged entry (its workspace planned
// at the maximum, when `at_max` is given), or why it cannot.
Result<std::string> SourceAt(const Graph& graph, const RangedEntry& entry, const SymbolPoint& point,
                             const CompileOptions& options, const Program* at_max) {
  Result<Program> program = CompileEntry(graph, ShapesAt(entry, point), 0, options, nullptr);
  if (!program.ok()) {
    return Status(program.status().code(),
                  "the entry does not compile: " + program.status().message());
  }
  if (at_max) KILN_RETURN_IF_ERROR(ApplyPlanAtMaximum(*program, *at_max));
  std::vector<Program> entries;
  entries.push_back(std::move(program).value());
  KILN_ASSIGN_OR_RETURN(EmittedCell cell, EmitCell(entries, options.emit));
  return std::move(cell.source);
}

// C(n, k) for k <= 2, as the polynomial n(n-1)/2 for k = 2 (any integer n); false on overflow.
bool Binomial(int64_t n, int k, int64_t* out) {
  if (k == 0) {
    *out = 1;
    return true;
  }
  if (k == 1) {
    *out = n;
    return true;
  }
  int64_t p;
  if (__builtin_mul_overflow(n, n - 1, &p)) return false;
  *out = p / 2;
  return true;
}

// A grid point's index is mixed radix over (degree_i + 1), symbol 0 fastest: its coordinates,
// and back.
std::vector<int> GridCoordinates(size_t index, const std::vector<int>& degree) {
  std::vector<int> at(degree.size());
  for (size_t i = 0; i < degree.size(); ++i) {
    at[i] = static_cast<int>(index % static_cast<size_t>(degree[i] + 1));
    index /= static_cast<size_t>(degree[i] + 1);
  }
  return at;
}
size_t GridIndex(const std::vector<int>& at, const std::vector<int>& degree) {
  size_t index = 0, stride = 1;
  for (size_t i = 0; i < at.size(); ++i) {
    index += static_cast<size_t>(at[i]) * stride;
    stride *= static_cast<size_t>(degree[i] + 1);
  }
  return index;
}

// Newton coefficients of one literal from its grid values: forward differences along each axis
// in turn; the difference table's entry at exponent vector a is the coefficient of prod C(.,a_i).
bool FitNewton(std::vector<__int128> values, const std::vector<int>& degree,
               const std::vector<int64_t>& base, NewtonPoly* out) {
  const size_t m = degree.size();
  for (size_t axis = 0; axis < m; ++axis) {
    // For every line along `axis`, difference in place from the far end.
    for (size_t idx = 0; idx < values.size(); ++idx) {
      const std::vector<int> at = GridCoordinates(idx, degree);
      if (at[axis] != 0) continue;
      for (int order = 1; order <= degree[axis]; ++order) {
        for (int k = degree[axis]; k >= order; --k) {
          std::vector<int> hi = at, lo = at;
          hi[axis] = k;
          lo[axis] = k - 1;
          values[GridIndex(hi, degree)] -= values[GridIndex(lo, degree)];
        }
      }
    }
  }
  out->base = base;
  out->coeffs.clear();
  for (size_t idx = 0; idx < values.size(); ++idx) {
    if (values[idx] == 0) continue;
    if (values[idx] > INT64_MAX || values[idx] < INT64_MIN) return false;
    out->coeffs[GridCoordinates(idx, degree)] = static_cast<int64_t>(values[idx]);
  }
  return true;
}

}  // namespace

LiteralSplit SplitIntegerLiterals(const std::string& text) {
  LiteralSplit out;
  std::string piece;
  size_t i = 0;
  while (i < text.size()) {
    const char c = text[i];
    const bool starts =
        std::isdigit(static_cast<unsigned char>(c)) != 0 && (i == 0 || !IsIdentChar(text[i - 1]));
    if (!starts) {
      piece += c;
      ++i;
      continue;
    }
    // The whole preprocessing number: digits, letters, '_', '.', and a sign after an exponent.
    size_t end = i + 1;
    while (end < text.size()) {
      const char d = text[end];
      const char prev = text[end - 1];
      if (IsIdentChar(d) ||
          ((d == '+' || d == '-') && (prev == 'e' || prev == 'E' || prev == 'p' || prev == 'P'))) {
        ++end;
      } else {
        break;
      }
    }
    const std::string number = text.substr(i, end - i);
    size_t digits = 0;
    while (digits < number.size() && std::isdigit(static_cast<unsigned char>(number[digits]))) {
      ++digits;
    }
    const std::string suffix = number.substr(digits);
    const bool integer_suffix =
        suffix.find_first_not_of("uUlL") == std::string::npos && suffix.size() <= 3;
    const bool octal = digits > 1 && number[0] == '0';
    int64_t value = 0;
    bool fits = digits <= 18;
    for (size_t k = 0; fits && k < digits; ++k) value = value * 10 + (number[k] - '0');
    if (!integer_suffix || octal || !fits) {
      piece += number;
    } else {
      out.pieces.push_back(std::move(piece));
      piece = suffix;
      out.literals.push_back(value);
      out.offsets.push_back(i);
    }
    i = end;
  }
  out.pieces.push_back(std::move(piece));
  return out;
}

bool NewtonPoly::Eval(const std::vector<int64_t>& x, int64_t* out) const {
  int64_t total = 0;
  for (const auto& [a, c] : coeffs) {
    int64_t term = c;
    for (size_t i = 0; i < a.size(); ++i) {
      int64_t b;  // exact below the base too: n(n-1) is even for every integer n
      if (!Binomial(x[i] - base[i], a[i], &b)) return false;
      if (__builtin_mul_overflow(term, b, &term)) return false;
    }
    if (__builtin_add_overflow(total, term, &total)) return false;
  }
  *out = total;
  return true;
}

int NewtonPoly::Degree() const {
  int d = 0;
  for (const auto& [a, c] : coeffs) {
    for (int e : a) d = std::max(d, e);
  }
  return d;
}

size_t EmittedTemplate::Varying() const {
  size_t n = 0;
  for (const auto& [region, count] : varying) n += count;
  return n;
}

std::string EmittedTemplate::Summary() const {
  std::string where;
  for (const char* region : {"run", "init", "tables", "dispatch", "prologue"}) {
    auto it = varying.find(region);
    if (it == varying.end()) continue;
    where += (where.empty() ? "" : ", ") + std::string(region) + " " + std::to_string(it->second);
  }
  std::string s = "its source at " + std::to_string(emits) + " points ";
  if (literals == 0 && !holds) return s + "does not form a template: " + disagreement;
  s += "splits into one skeleton and " + std::to_string(literals) + " integer literals, " +
       std::to_string(Varying()) + " varying" + (where.empty() ? "" : " (" + where + ")") +
       ", of degree <= " + std::to_string(max_degree) + "; ";
  if (holds) {
    return s + "the template gives the source at all " + std::to_string(probes) +
           " points checked, the workspace planned at the range's maximum (" +
           std::to_string(workspace_at_maximum) + " bytes)";
  }
  if (holds_above_base) {
    return s + "it gives the source at every point checked with each symbol at or above " +
           PointText(base) + " but not at the range's low end: " + disagreement;
  }
  return s + "it does not give the source at every point checked: " + disagreement;
}

Result<EmittedTemplate> FitEmittedTemplate(const Graph& graph, const RangedEntry& entry,
                                           const CompileOptions& options,
                                           const std::vector<SymbolPoint>& extra) {
  KILN_RETURN_IF_ERROR(CheckRangedEntry(entry, "ranged entry"));
  KILN_RETURN_IF_ERROR(CheckRangedProbes(entry));
  std::vector<SymbolPoint> checked = RangeProbePoints(entry);
  for (const SymbolPoint& p : extra) {
    for (const auto& [name, range] : entry.ranges) {
      auto it = p.find(name);
      if (it == p.end() || it->second < range.first || it->second > range.second) {
        return Status::InvalidArgument(
            "point " + PointText(p) + " is not a point of the range: " + name + " must be in [" +
            std::to_string(range.first) + ", " + std::to_string(range.second) + "]");
      }
    }
    if (p.size() != entry.ranges.size()) {
      return Status::InvalidArgument("point " + PointText(p) + " names a symbol the entry has not");
    }
    if (std::find(checked.begin(), checked.end(), p) == checked.end()) checked.push_back(p);
  }
  EmittedTemplate out;
  // Compiled as a ranged entry is: a value whose shape depends on the symbols is computed when
  // the entry runs, never folded into a table as long as the point makes it.
  KILN_ASSIGN_OR_RETURN(RangedShapes shapes, InferRangedShapes(graph, entry));
  CompileOptions ranged = options;
  ranged.symbolic_values = shapes.SymbolicNames();
  for (const auto& [name, why] : shapes.irregular) ranged.symbolic_values.insert(name);
  SymbolPoint fixed;
  std::vector<int> degree;
  std::vector<int64_t> base;
  for (const auto& [name, range] : entry.ranges) {
    fixed[name] = range.first;
    if (range.first == range.second) continue;
    const int64_t b = FitBase(range);  // as for shapes: 1 is the size broadcasting treats apart
    out.symbols.push_back(name);
    base.push_back(b);
    degree.push_back(static_cast<int>(std::min<int64_t>(kMaxDegree, range.second - b)));
    out.base[name] = b;
  }
  const size_t m = out.symbols.size();
  // The program at the range's maximum, whose workspace plan every point uses.
  SymbolPoint maximum;
  for (const auto& [name, range] : entry.ranges) maximum[name] = range.second;
  Result<Program> max_program = CompileEntry(graph, ShapesAt(entry, maximum), 0, ranged, nullptr);
  ++out.emits;
  if (!max_program.ok()) {
    out.disagreement = "at the range's maximum " + PointText(maximum) +
                       " the entry does not compile: " + max_program.status().message();
    return out;
  }
  const Program& at_max = *max_program;
  out.workspace_at_maximum = at_max.workspace_bytes;
  size_t grid_size = 1;
  for (int d : degree) grid_size *= static_cast<size_t>(d + 1);

  // The grid's sources, split.
  std::vector<LiteralSplit> grid(grid_size);
  std::string first_text;
  for (size_t idx = 0; idx < grid_size; ++idx) {
    SymbolPoint point = fixed;
    const std::vector<int> at = GridCoordinates(idx, degree);
    for (size_t i = 0; i < m; ++i) point[out.symbols[i]] = base[i] + at[i];
    Result<std::string> text = SourceAt(graph, entry, point, ranged, &at_max);
    ++out.emits;
    if (!text.ok()) {
      out.disagreement = "at " + PointText(point) + " " + text.status().message();
      return out;
    }
    grid[idx] = SplitIntegerLiterals(*text);
    if (idx == 0) {
      first_text = std::move(text).value();
      continue;
    }
    if (grid[idx].pieces != grid[0].pieces) {
      const auto [at0, at] = FirstDifference(grid[0], grid[idx]);
      out.disagreement = "the skeleton at " + PointText(point) + " (\"" + LineAt(*text, at) +
                         "\") differs from the one at " + PointText(out.base) + " (\"" +
                         LineAt(first_text, at0) + "\")";
      return out;
    }
  }
  out.literals = grid[0].literals.size();

  // Fit every literal that changes.
  std::vector<NewtonPoly> polys(out.literals);
  for (size_t j = 0; j < out.literals; ++j) {
    std::vector<__int128> values(grid_size);
    bool varies = false;
    for (size_t idx = 0; idx < grid_size; ++idx) {
      values[idx] = grid[idx].literals[j];
      varies = varies || grid[idx].literals[j] != grid[0].literals[j];
    }
    if (!varies) {
      polys[j].base = base;
      if (grid[0].literals[j] != 0) polys[j].coeffs[std::vector<int>(m, 0)] = grid[0].literals[j];
      continue;
    }
    if (!FitNewton(std::move(values), degree, base, &polys[j])) {
      out.disagreement = "a literal's differences overflow 64 bits near \"" +
                         LineAt(first_text, grid[0].offsets[j]) + "\"";
      return out;
    }
    ++out.varying[RegionAt(first_text, grid[0].offsets[j])];
    out.max_degree = std::max(out.max_degree, polys[j].Degree());
  }

  // Hold the template to every probe point.
  bool above_ok = true, all_ok = true;
  for (const SymbolPoint& point : checked) {
    bool below = false;
    std::vector<int64_t> x(m);
    for (size_t i = 0; i < m; ++i) {
      x[i] = point.at(out.symbols[i]);
      below = below || x[i] < base[i];
    }
    Result<std::string> text = SourceAt(graph, entry, point, ranged, &at_max);
    ++out.emits;
    ++out.probes;
    std::string finding;
    if (!text.ok()) {
      finding = "at " + PointText(point) + " " + text.status().message();
    } else {
      const LiteralSplit split = SplitIntegerLiterals(*text);
      if (split.pieces != grid[0].pieces) {
        const auto [at0, at] = FirstDifference(grid[0], split);
        finding = "at " + PointText(point) + " the skeleton (\"" + LineAt(*text, at) +
                  "\") differs from the template's (\"" + LineAt(first_text, at0) + "\")";
      } else {
        for (size_t j = 0; j < out.literals && finding.empty(); ++j) {
          int64_t want;
          if (!polys[j].Eval(x, &want) || want != split.literals[j]) {
            finding = "at " + PointText(point) + " a literal is " +
                      std::to_string(split.literals[j]) + ", the template's " +
                      std::to_string(want) + ", in \"" + LineAt(*text, split.offsets[j]) + "\"";
          }
        }
      }
    }
    if (finding.empty()) continue;
    all_ok = false;
    if (!below) {  // a disagreement inside the fitted part is the one that matters
      above_ok = false;
      out.disagreement = finding;
      break;
    }
    if (out.disagreement.empty()) out.disagreement = finding;
  }
  out.holds = all_ok;
  out.holds_above_base = above_ok;
  return out;
}

}  // namespace kiln
