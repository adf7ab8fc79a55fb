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

// A ranged entry: its inputs' dims, and each symbol's inclusive range [lo, hi], optionally with
// a step: the symbol's values are then lo, lo + step, ..., hi (an image side in multiples of 32,
// so that every stride-2 stage of a network divides it exactly).
struct RangedEntry {
  std::map<std::string, std::vector<DimSpec>> inputs;
  std::map<std::string, std::pair<int64_t, int64_t>> ranges;
  std::map<std::string, int64_t> steps;  // only symbols with a step > 1
  bool operator==(const RangedEntry&) const = default;
};

// A symbol's step (1 when it has none).
int64_t StepOf(const RangedEntry& entry, const std::string& symbol);
// The range as declared: [lo, hi], or [lo, hi, step] when the step is > 1. The form manifests,
// keys and cell metadata write.
std::vector<int64_t> RangeSpec(const RangedEntry& entry, const std::string& symbol);
// Sets `symbol`'s range from [lo, hi] or [lo, hi, step]; false when `spec` has another length.
// CheckRangedEntry says whether the values are well formed.
bool SetRangeSpec(RangedEntry* entry, const std::string& symbol, const std::vector<int64_t>& spec);

// Polynomials over a range (shapes, generated constants) are in each symbol's coordinate, the
// index of its value on the step's grid: value / step, which is the value itself for step 1. A
// stepped side's stride-2 stages are then exact (side / 2 is 16 * coordinate for step 32) where
// they would be floor divisions of the value. ValueAt is the inverse for one symbol.
int64_t CoordinateOf(const RangedEntry& entry, const std::string& symbol, int64_t value);
int64_t ValueAt(const RangedEntry& entry, const std::string& symbol, int64_t coordinate);

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
// range a symbolic dim, 0 <= lo <= hi, fixed sizes >= 0, at least one symbol, and a step (where
// given) >= 2 on a range whose hi is on its grid. `what` names it.
Status CheckRangedEntry(const RangedEntry& entry, const std::string& what);

// "{ids=[batch,seq];mask=[batch,seq] batch=[1,8];seq=[1,256]}" for rows and messages; a stepped
// range reads "side=[64,256,32]".
std::string DescribeRanged(const RangedEntry& entry);
// Every entry of the envelope in words, in declaration order, comma-separated.
std::string DescribeEnvelope(const Envelope& envelope);

// How a request's inputs sit against a ranged entry, best first: they fit; or a symbol takes two
// values; or a symbol's value is outside its range or off its step's grid; or a fixed dim
// differs; or the names or ranks differ.
enum class RangedFit { kFits, kSymbolInconsistent, kOutOfRange, kDim, kNamesOrRank };
struct RangedMatch {
  RangedFit fit = RangedFit::kNamesOrRank;
  std::string detail;                     // the first difference in words ("" when it fits)
  std::map<std::string, int64_t> values;  // each symbol's value (when it fits)
};
RangedMatch MatchRanged(const RangedEntry& entry, const ShapeClass& shapes);

// The symbols whose range holds more than one value, in name order: the only ones a shape or a
// constant over the range can depend on.
std::vector<std::string> FreeSymbols(const RangedEntry& entry);

// One value of each symbol.
using SymbolPoint = std::map<std::string, int64_t>;

// The points a range is checked at, for shapes (compile/ranged_shapes.h) and for the numerics of a
// ranged entry: every corner of the ranges (each symbol at lo or hi), and for each symbol each of
// its interior values (a small odd one, the middle; on the step's grid) with every other symbol
// at the middle of its range. Distinct, deterministic, in a fixed order; at most 2^6 corners (an
// entry with more than six symbols is refused by CheckRangedProbes).
std::vector<SymbolPoint> RangeProbePoints(const RangedEntry& entry);
Status CheckRangedProbes(const RangedEntry& entry);

// A dim over a range: c0 + sum of c_U * prod(U) over sets U of distinct symbols, each symbol
// standing for its coordinate (value / step; the value itself without a step). No zero
// coefficients are kept, so two equal polynomials compare equal. A constant has at most the empty
// monomial. The compiler fits every value's dims as these (compile/ranged_shapes.h); a ranged
// entry's output dim that is no single symbol is written as one in the cell's metadata.
struct SymDim {
  std::map<std::vector<std::string>, int64_t> terms;  // sorted symbol names -> coefficient

  static SymDim Constant(int64_t c);
  bool IsConstant() const;
  int64_t ConstantValue() const;  // REQUIRES: IsConstant()
  // The value at `point`, which gives every symbol the polynomial uses; false on overflow.
  bool Eval(const SymbolPoint& point, int64_t* out) const;
  std::string ToString() const;  // "2*batch*seq+1", "64"
  bool operator==(const SymDim&) const = default;
};

// Reads ToString's form back ("2*batch*seq+1", "-3", "n"); an error naming the text otherwise.
Result<SymDim> ParseSymDim(const std::string& text);

// The concrete input shapes of `entry` at `point`.
ShapeClass ShapesAt(const RangedEntry& entry, const SymbolPoint& point);

// "batch=2, seq=3" for messages ("(no symbols)" for an empty point).
std::string DescribePoint(const SymbolPoint& point);

// The pieces a ranged entry is compiled as. A program over a range is one template where every
// symbol is at least 2; at 0 and 1 (sizes broadcasting and empty tensors treat apart) the program
// may differ (a one-row operand passed as it is). So a symbol whose range holds 2 and a value
// below it is split: each value below 2 is a piece of its own, and [2, hi] one more (for a
// stepped symbol, from its first value >= 2). Pieces in a
// fixed order (the first symbol's low values first); the entry itself when nothing splits.
std::vector<RangedEntry> RangedPieces(const RangedEntry& entry);
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
