// Shape classes, ranged entries and envelopes: the input shapes a target is declared to serve
// (docs/design.md §1). Graph layer, so the compiler (which specializes per class) and the cell
// layer (which keys by envelope) share one definition.
//
// An envelope declares entries of two kinds: concrete shape classes (a shape per input) and
// ranged entries, whose dims may be symbols each bound to an inclusive range (`batch` in [1, 32])
// and consistent across the entry's inputs. A request fits a ranged entry when its inputs are the
// entry's, every fixed dim matches, and each symbol takes one value, inside its range.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "src/kiln/base/status.h"
#include "src/kiln/tensor/tensor.h"

namespace kiln {

// One shape class: a concrete shape per graph input.
using ShapeClass = std::map<std::string, Shape>;

// One dim of a ranged entry's input: a fixed size, or (symbol non-empty) a symbol's value.
struct DimSpec {
  int64_t size = 0;
  std::string symbol;
  bool operator==(const DimSpec&) const = default;
};

// A ranged entry: its inputs' dims, and each symbol's inclusive range [lo, hi].
struct RangedEntry {
  std::map<std::string, std::vector<DimSpec>> inputs;
  std::map<std::string, std::pair<int64_t, int64_t>> ranges;
  bool operator==(const RangedEntry&) const = default;
};

// The declared serving region of a target: concrete classes, then ranged entries. An entry is
// named by its place in that order ("declared entry i": classes first).
struct Envelope {
  Envelope() = default;
  // An envelope of classes alone, the common case: Envelope{{{{"x", {1, 64}}}}}.
  Envelope(std::vector<ShapeClass> c) : classes(std::move(c)) {}  // NOLINT: implicit on purpose

  std::vector<ShapeClass> classes;
  std::vector<RangedEntry> ranged;
  size_t size() const { return classes.size() + ranged.size(); }
};

// [A-Za-z_][A-Za-z0-9_]*
bool IsSymbolName(const std::string& s);
// OK when the entry is well formed: some input, every symbolic dim's symbol has a range and every
// range a symbolic dim, 0 <= lo <= hi, fixed sizes >= 0, at least one symbol. `what` names it.
Status CheckRangedEntry(const RangedEntry& entry, const std::string& what);

// "{ids=[batch,seq];mask=[batch,seq] batch=[1,8];seq=[1,256]}" for rows and messages.
std::string DescribeRanged(const RangedEntry& entry);
// Every entry of the envelope in words, in declaration order, comma-separated.
std::string DescribeEnvelope(const Envelope& envelope);

// How a request's inputs sit against a ranged entry, best first: they fit; or a symbol takes two
// values; or a symbol's value is outside its range; or a fixed dim differs; or the names or
// ranks differ.
enum class RangedFit { kFits, kSymbolInconsistent, kOutOfRange, kDim, kNamesOrRank };
struct RangedMatch {
  RangedFit fit = RangedFit::kNamesOrRank;
  std::string detail;                     // the first difference in words ("" when it fits)
  std::map<std::string, int64_t> values;  // each symbol's value (when it fits)
};
RangedMatch MatchRanged(const RangedEntry& entry, const ShapeClass& shapes);
// The shapes of a request's inputs, to match against classes and ranged entries.
ShapeClass ShapesOf(const std::map<std::string, Tensor>& inputs);
// True when some request could fit both entries (checked dim by dim, symbols' consistency aside,
// so it may say true for two entries that no request fits at once): an envelope must not declare
// two such entries, or dispatch could not pick one.
bool MayOverlap(const RangedEntry& a, const RangedEntry& b);

// "{x=[3,64]},{x=[5,64];y=[2]}": classes for rows, messages and the test switch that names one.
std::string DescribeClasses(const std::vector<ShapeClass>& classes);

// True when `inputs` are exactly the class's inputs, each of the class's shape (dtypes aside).
bool InputsFitClass(const ShapeClass& shape_class, const std::map<std::string, Tensor>& inputs);

}  // namespace kiln
