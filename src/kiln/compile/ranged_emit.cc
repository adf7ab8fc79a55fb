// The generated program over a range (see ranged_emit.h): emit at a grid, split the text at its
// integer literals, fit the ones that change, hold the fit to every probe point.
#include "src/kiln/compile/ranged_emit.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <set>
#include <sstream>

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
      if (it == p.end() || it->second < range.first || it->second > range.second ||
          (it->second - range.first) % StepOf(entry, name) != 0) {
        return Status::InvalidArgument("point " + PointText(p) + " is not a point of the range: " +
                                       name + " must be in " + DescribeRanged(entry));
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
    // As for shapes: a coordinate, 1 (the size broadcasting treats apart) kept out of the grid.
    const int64_t b = FitBase(entry, name);
    out.symbols.push_back(name);
    base.push_back(b);
    degree.push_back(static_cast<int>(
        std::min<int64_t>(kMaxDegree, CoordinateOf(entry, name, range.second) - b)));
    out.base[name] = ValueAt(entry, name, b);
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
    for (size_t i = 0; i < m; ++i)
      point[out.symbols[i]] = ValueAt(entry, out.symbols[i], base[i] + at[i]);
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
      x[i] = CoordinateOf(entry, out.symbols[i], point.at(out.symbols[i]));
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
  out.text = std::move(first_text);
  out.split = std::move(grid[0]);
  out.polys = std::move(polys);
  out.at_maximum = at_max;
  return out;
}

}  // namespace kiln

namespace kiln {

namespace {

// One change to the template's text: [begin, end) becomes `text`.
struct Edit {
  size_t begin = 0, end = 0;
  std::string text;
};

// `text` with `edits` (sorted, not overlapping, all inside [from, to)) applied to [from, to).
std::string ApplyEdits(const std::string& text, size_t from, size_t to,
                       const std::vector<Edit>& edits) {
  std::string out;
  size_t at = from;
  for (const Edit& e : edits) {
    if (e.begin < from || e.end > to) continue;
    out.append(text, at, e.begin - at);
    out += e.text;
    at = e.end;
  }
  out.append(text, at, to - at);
  return out;
}

// The spans of string and character literals in text[from, to), skipping // comments.
std::vector<std::pair<size_t, size_t>> QuotedSpans(const std::string& text, size_t from,
                                                   size_t to) {
  std::vector<std::pair<size_t, size_t>> spans;
  for (size_t i = from; i < to; ++i) {
    const char c = text[i];
    if (c == '/' && i + 1 < to && text[i + 1] == '/') {
      while (i < to && text[i] != '\n') ++i;
      continue;
    }
    if (c != '"' && c != '\'') continue;
    const size_t start = i++;
    while (i < to && text[i] != c) i += text[i] == '\\' ? 2 : 1;
    spans.emplace_back(start, i + 1);
  }
  return spans;
}

bool Inside(const std::vector<std::pair<size_t, size_t>>& spans, size_t at) {
  return std::any_of(spans.begin(), spans.end(),
                     [at](const auto& s) { return at > s.first && at < s.second; });
}

// The end (one past its ';') of the declaration that starts at `begin`: the first ';' outside
// braces.
size_t DeclarationEnd(const std::string& text, size_t begin, size_t limit) {
  int depth = 0;
  for (size_t i = begin; i < limit; ++i) {
    if (text[i] == '{') ++depth;
    if (text[i] == '}') --depth;
    if (text[i] == ';' && depth == 0) return i + 1;
  }
  return std::string::npos;
}

// C(d, a) for a <= 2, as C++ over an int64_t variable `d`.
std::string BinomialExpr(const std::string& d, int a) {
  if (a == 0) return "";
  if (a == 1) return d;
  return "((" + d + " * (" + d + " - 1)) / 2)";
}

std::string PolyKey(const NewtonPoly& p) {
  std::string k;
  for (const auto& [a, c] : p.coeffs) {
    for (int e : a) k += std::to_string(e) + ",";
    k += ":" + std::to_string(c) + ";";
  }
  return k;
}

// The symbol whose value `dim` is (a dim written as one symbol in describe()), or "": a symbol's
// value is its coordinate times its step plus its grid's offset.
std::string SymbolValueOf(const RangedEntry& entry, const SymDim& dim) {
  for (const auto& [names, coeff] : dim.terms) {
    if (names.size() != 1) continue;
    const std::string& sym = names[0];
    auto range = entry.ranges.find(sym);
    if (range == entry.ranges.end()) return "";
    const int64_t step = StepOf(entry, sym);
    SymDim want;
    want.terms[{sym}] = step;
    if (range->second.first % step != 0) want.terms[{}] = range->second.first % step;
    return dim == want ? sym : "";
  }
  return "";
}

}  // namespace

Result<RangedEntryCode> EmitRangedEntry(const EmittedTemplate& t, const RangedEntry& entry,
                                        const RangedShapes& shapes, int index) {
  if (!t.holds) {
    return Status::Unimplemented("the generated source is not one template over the range: " +
                                 t.Summary());
  }
  const std::string& text = t.text;
  const std::string open = "#if !defined(KILN_ENTRY) || KILN_ENTRY == 0\n";
  const std::string close = "#endif  // entry 0\n";
  const std::string init_sig = "extern \"C\" KILN_HIDDEN int kiln_e0_init(kiln_cell_entry* E) {\n";
  const std::string run_sig =
      "extern \"C\" KILN_HIDDEN int kiln_e0_run(kiln_cell_entry* E, const void* const* in, void* "
      "const* out, char* ws) {\n";
  const size_t begin = text.find(open);
  const size_t end = begin == std::string::npos ? begin : text.find(close, begin);
  const size_t init_at = text.find(init_sig, begin);
  const size_t run_at = text.find(run_sig, begin);
  if (end == std::string::npos || init_at == std::string::npos || run_at == std::string::npos ||
      init_at > end || run_at > end) {
    return Status::Internal("the emitted entry does not have the layout EmitRangedEntry reads");
  }
  const size_t init_body = init_at + init_sig.size();
  const size_t run_body = run_at + run_sig.size();
  const size_t init_end = text.find("\n}\n", init_body);
  const size_t run_end = text.find("\n}\n", run_body);
  const auto strings = QuotedSpans(text, begin, end);
  auto refuse = [&](size_t at, const std::string& why) -> Result<RangedEntryCode> {
    return Status::Unimplemented("a constant that varies over the range " + why + ": \"" +
                                 LineAt(text, at) + "\"");
  };

  // Number the run-time constants: one per distinct polynomial.
  RangedEntryCode code;
  std::map<std::string, size_t> value_of;
  std::vector<const NewtonPoly*> values;
  std::vector<Edit> edits;
  std::set<size_t> init_uses, run_uses;
  std::map<size_t, std::set<size_t>> table_uses;  // table declaration start -> values
  std::set<size_t> unstatic;                      // `static const` locals that hold a value
  for (size_t j = 0; j < t.split.literals.size(); ++j) {
    const size_t at = t.split.offsets[j];
    if (t.polys[j].Degree() == 0) continue;
    if (at < begin) return refuse(at, "sits in the cell's prologue");
    if (at >= end) continue;  // the dispatch part: EmitCell writes a ranged entry's own
    const std::string key = PolyKey(t.polys[j]);
    auto [it, fresh] = value_of.emplace(key, values.size());
    if (fresh) values.push_back(&t.polys[j]);
    const size_t v = it->second;
    const size_t digits = std::to_string(t.split.literals[j]).size();
    size_t suffix = at + digits;
    bool is_unsigned = false;
    while (suffix < text.size() && std::strchr("uUlL", text[suffix]) != nullptr) {
      is_unsigned = is_unsigned || text[suffix] == 'u' || text[suffix] == 'U';
      ++suffix;
    }
    const size_t line = text.rfind('\n', at) + 1;
    if (text[text.find_first_not_of(" \t", line)] == '#') {
      return refuse(at, "is on a preprocessor line");
    }
    if (Inside(strings, at)) {
      // A reference op's spec: the dispatch writes the value in when it prepares the op.
      edits.push_back({at, suffix, "\\001" + std::to_string(v) + "\\002"});
      continue;
    }
    const std::string name = "kiln_v" + std::to_string(v);
    edits.push_back({at, suffix, is_unsigned ? "((uint64_t)" + name + ")" : name});
    const bool in_init = at > init_body && at < init_end;
    const bool in_run = at > run_body && at < run_end;
    if (in_init || in_run) {
      (in_init ? init_uses : run_uses).insert(v);
      const size_t body = in_init ? init_body : run_body;
      const size_t decl = text.rfind("static const ", at);
      if (decl != std::string::npos && decl >= body) {
        const size_t decl_end = DeclarationEnd(text, decl, in_init ? init_end : run_end);
        if (decl_end != std::string::npos && at < decl_end) {
          if (at < text.find('=', decl)) return refuse(at, "is the length of an array");
          unstatic.insert(decl);
        }
      }
      continue;
    }
    if (at < init_at) {
      const size_t decl = text.rfind("static const ", at);
      const size_t decl_end =
          decl == std::string::npos ? decl : DeclarationEnd(text, decl, init_at);
      if (decl == std::string::npos || decl < begin || decl_end == std::string::npos ||
          at > decl_end) {
        return refuse(at, "is outside any table");
      }
      if (at < text.find('=', decl)) return refuse(at, "is the length of a table");
      table_uses[decl].insert(v);
      continue;
    }
    return refuse(at, "is outside the entry's tables and functions");
  }
  std::sort(edits.begin(), edits.end(),
            [](const Edit& a, const Edit& b) { return a.begin < b.begin; });
  for (size_t decl : unstatic) edits.push_back({decl, decl + 7, ""});  // "static "

  // Tables that hold a value move into the functions that read them, as local arrays.
  std::string init_tables, run_tables;
  std::vector<Edit> moved;  // the tables' own spans, removed from file scope
  for (const auto& [decl, uses] : table_uses) {
    const size_t line = text.rfind('\n', decl) + 1;  // "alignas(64) " may lead the line
    const size_t decl_end = DeclarationEnd(text, decl, init_at);
    std::string local = ApplyEdits(text, line, decl_end, edits);
    const size_t st = local.find("static ");
    local.erase(st, 7);
    const size_t bracket = local.find('[');
    size_t name_begin = bracket;
    while (name_begin > 0 && IsIdentChar(local[name_begin - 1])) --name_begin;
    const std::string table = local.substr(name_begin, bracket - name_begin);
    auto used_in = [&](size_t from, size_t to) {
      for (size_t p = text.find(table, from); p != std::string::npos && p < to;
           p = text.find(table, p + 1)) {
        if (!IsIdentChar(text[p + table.size()])) return true;
      }
      return false;
    };
    if (used_in(init_body, init_end)) {
      init_tables += "  " + local + "\n";
      init_uses.insert(uses.begin(), uses.end());
    }
    if (used_in(run_body, run_end)) {
      run_tables += "  " + local + "\n";
      run_uses.insert(uses.begin(), uses.end());
    }
    moved.push_back({line, decl_end + (text[decl_end] == '\n' ? 1 : 0), ""});
  }
  // A literal's edit inside a moved table is in the table's local copy already.
  edits.erase(std::remove_if(edits.begin(), edits.end(),
                             [&](const Edit& e) {
                               return std::any_of(moved.begin(), moved.end(), [&](const Edit& m) {
                                 return e.begin >= m.begin && e.begin < m.end;
                               });
                             }),
              edits.end());
  edits.insert(edits.end(), moved.begin(), moved.end());
  auto declare = [](const std::set<size_t>& uses) {
    std::string s;
    for (size_t v : uses) {
      s += "  const int64_t kiln_v" + std::to_string(v) + " = E->v[" + std::to_string(v) + "];\n";
    }
    return s;
  };
  edits.push_back({init_body, init_body, declare(init_uses) + init_tables});
  edits.push_back({run_body, run_body, declare(run_uses) + run_tables});
  std::stable_sort(edits.begin(), edits.end(),
                   [](const Edit& a, const Edit& b) { return a.begin < b.begin; });
  std::string body = ApplyEdits(text, begin + open.size(), end, edits);

  // Renumber as entry `index`.
  const std::string e = "kiln_e" + std::to_string(index) + "_";
  for (size_t p = body.find("kiln_e0_"); p != std::string::npos; p = body.find("kiln_e0_", p)) {
    body.replace(p, 8, e);
    p += e.size();
  }

  // The run-time constants from the symbols: each literal's Newton polynomial around the base.
  for (const auto& [name, range] : entry.ranges) code.symbols.push_back(name);
  std::ostringstream vf;
  vf << "extern \"C\" KILN_HIDDEN uint32_t " << e << "num_values() { return " << values.size()
     << "; }\n";
  vf << "extern \"C\" KILN_HIDDEN int " << e << "values(const int64_t* s, int64_t* v) {\n";
  for (size_t i = 0; i < code.symbols.size(); ++i) {
    const auto& range = entry.ranges.at(code.symbols[i]);
    const int64_t step = StepOf(entry, code.symbols[i]);
    vf << "  if (s[" << i << "] < " << range.first << "LL || s[" << i << "] > " << range.second
       << "LL";
    if (step > 1) vf << " || (s[" << i << "] - " << range.first << "LL) % " << step << "LL != 0";
    vf << ") return KILN_CELL_BAD_ARGUMENT;  // " << code.symbols[i] << "\n";
  }
  // The polynomials are in coordinates (value / step), around the grid's base.
  for (size_t k = 0; k < t.symbols.size(); ++k) {
    const std::string& sym = t.symbols[k];
    const size_t i = static_cast<size_t>(std::find(code.symbols.begin(), code.symbols.end(), sym) -
                                         code.symbols.begin());
    const int64_t step = StepOf(entry, sym);
    vf << "  const int64_t d" << k << " = s[" << i << "]"
       << (step > 1 ? " / " + std::to_string(step) + "LL" : std::string()) << " - "
       << CoordinateOf(entry, sym, t.base.at(sym)) << "LL;\n";
  }
  vf << "  (void)s;\n";
  for (size_t v = 0; v < values.size(); ++v) {
    vf << "  v[" << v << "] = 0";
    for (const auto& [a, c] : values[v]->coeffs) {
      vf << " + (" << c << "LL)";
      for (size_t k = 0; k < a.size(); ++k) {
        if (a[k] > 0) vf << " * " << BinomialExpr("d" + std::to_string(k), a[k]);
      }
    }
    vf << ";\n";
  }
  vf << "  (void)v;\n  return KILN_CELL_OK;\n}\n";
  code.cell.source = "#if !defined(KILN_ENTRY) || KILN_ENTRY == " + std::to_string(index) + "\n" +
                     body + vf.str() + "#endif  // entry " + std::to_string(index) + "\n\n";
  code.entry = entry;
  code.cell.num_symbols = code.symbols.size();
  code.cell.num_values = values.size();

  // describe(): the program at the maximum, with each symbolic dim named.
  const Program& p = t.at_maximum;
  code.cell.num_constants = p.weights.size();
  code.cell.workspace_bytes = static_cast<uint64_t>(p.workspace_bytes);
  auto spec = [&](const Buffer& b, const std::string& value) -> Result<nlohmann::json> {
    nlohmann::json dims = nlohmann::json::array();
    auto it = shapes.shapes.find(value);
    if (b.dynamic) return Status::Unimplemented("'" + value + "' has a shape known at run time");
    for (size_t d = 0; d < b.type.shape.size(); ++d) {
      if (it == shapes.shapes.end() || it->second.size() != b.type.shape.size()) {
        return Status::Unimplemented("'" + value + "' has no shape over the range");
      }
      const SymDim& dim = it->second[d];
      if (dim.IsConstant()) {
        dims.push_back(dim.ConstantValue());
      } else if (const std::string sym = SymbolValueOf(entry, dim); !sym.empty()) {
        dims.push_back(sym);
      } else {
        // The caller sizes the output from the polynomial at the request's coordinates.
        dims.push_back(nlohmann::json{{"poly", dim.ToString()}});
      }
    }
    return nlohmann::json{{"name", value}, {"dtype", DTypeName(b.type.dtype)}, {"shape", dims}};
  };
  nlohmann::json d;
  d["index"] = index;
  d["inputs"] = nlohmann::json::array();
  d["outputs"] = nlohmann::json::array();
  d["constants"] = nlohmann::json::array();
  for (int id : p.inputs) {
    // An input's dims are the entry's own (a symbol with one value is still named: ingress
    // matches the request against the entry).
    const Buffer& b = p.buffers[static_cast<size_t>(id)];
    auto it = entry.inputs.find(b.name);
    if (it == entry.inputs.end() || it->second.size() != b.type.shape.size()) {
      return Status::Internal("input '" + b.name + "' is not the ranged entry's");
    }
    nlohmann::json dims = nlohmann::json::array();
    for (const DimSpec& dim : it->second) {
      if (dim.symbol.empty()) {
        dims.push_back(dim.size);
      } else {
        dims.push_back(dim.symbol);
      }
    }
    d["inputs"].push_back({{"name", b.name}, {"dtype", DTypeName(b.type.dtype)}, {"shape", dims}});
  }
  for (size_t o = 0; o < p.outputs.size(); ++o) {
    const Buffer& b = p.buffers[static_cast<size_t>(p.outputs[o])];
    Result<nlohmann::json> s = spec(b, p.output_names[o]);
    if (!s.ok()) return Status::Unimplemented("graph output " + s.status().message());
    d["outputs"].push_back(*s);
  }
  for (int id : p.weights) {
    const Buffer& b = p.buffers[static_cast<size_t>(id)];
    d["constants"].push_back(
        {{"name", b.name}, {"dtype", DTypeName(b.type.dtype)}, {"shape", b.type.shape}});
  }
  d["workspace_bytes"] = code.cell.workspace_bytes;
  nlohmann::json ranges = nlohmann::json::object();
  for (const auto& [name, range] : entry.ranges) ranges[name] = RangeSpec(entry, name);
  d["ranged"] = {{"symbols", code.symbols}, {"ranges", ranges}};
  code.cell.describe = std::move(d);
  return code;
}

Result<std::vector<RangedEntryCode>> CompileRangedPieces(const Graph& graph,
                                                         const RangedEntry& entry,
                                                         const CompileOptions& options,
                                                         int first_index) {
  std::vector<RangedEntryCode> out;
  const std::vector<RangedEntry> pieces = RangedPieces(entry);
  for (size_t k = 0; k < pieces.size(); ++k) {
    const RangedEntry& piece = pieces[k];
    const std::string what = pieces.size() == 1 ? "ranged entry " + DescribeRanged(entry)
                                                : "ranged entry " + DescribeRanged(entry) +
                                                      ", piece " + DescribeRanged(piece);
    Result<RangedShapes> shapes = InferRangedShapes(graph, piece);
    if (!shapes.ok()) {
      return Status(shapes.status().code(), what + ": " + shapes.status().message());
    }
    Result<EmittedTemplate> t = FitEmittedTemplate(graph, piece, options);
    if (!t.ok()) return Status(t.status().code(), what + ": " + t.status().message());
    Result<RangedEntryCode> code =
        EmitRangedEntry(*t, piece, *shapes, first_index + static_cast<int>(k));
    if (!code.ok()) return Status(code.status().code(), what + ": " + code.status().message());
    out.push_back(std::move(code).value());
  }
  return out;
}

}  // namespace kiln
