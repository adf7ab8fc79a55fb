// Shapes over a range: what every value of a graph looks like across a ranged entry (compile
// layer, above static shape inference). The first step of compiling one entry for a range
// instead of a point: before loops can take their extents at run time, the compiler must know
// each extent as a function of the entry's symbols, and where no such function exists.
//
// A dim is written as a multilinear polynomial with integer coefficients in the entry's symbols
// (`2*batch*seq + 1`; a stepped symbol stands for its coordinate, value / step): sums, products by
// constants and products of distinct symbols, which is what Reshape, Concat, Flatten, MatMul and
// broadcasting make of `batch` and `seq`. It is found by running the op registry's static inference
// (ops/shape_inference.h) at the corners of a unit box inside the range, solving for the
// coefficients by finite differences, and then holding the polynomial to concrete inference at
// every probe point (RangeProbePoints): each range's corners and interior points. A dim that
// differs anywhere (a strided convolution's floor division, a broadcast that only happens at 1, a
// rank that changes) is irregular, named with the first point where the polynomial and the graph
// disagree; the compiler cannot give it a runtime extent, so that value (and what reads it) is not
// compiled for the range.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "src/kiln/base/status.h"
#include "src/kiln/graph/ir.h"
#include "src/kiln/graph/shape_class.h"

namespace kiln {

struct RangedShapes {
  // The symbols whose range holds more than one value, in name order; a symbol with lo == hi is
  // folded into the constants.
  std::vector<std::string> symbols;
  // Every value with one dtype and rank over the range and a polynomial for each dim.
  std::map<std::string, std::vector<SymDim>> shapes;
  std::map<std::string, DType> dtypes;
  // Values known only at run time at some point (data-dependent shapes: the dynamic region).
  std::set<std::string> dynamic;
  // Values whose shape is no polynomial over the range, each with the first disagreement.
  std::map<std::string, std::string> irregular;
  // How many concrete inferences it took (the fit's box plus the probe points).
  size_t inferences = 0;

  // Values with at least one dim that is not constant: their names, and how many.
  std::set<std::string> SymbolicNames() const;
  size_t SymbolicValues() const;
  // "N values: S symbolic, I irregular (first: 'v' ...), D dynamic", for rows and reasons.
  std::string Summary() const;
};

// Where a fit over a range starts for one symbol, as a coordinate (shape_class.h: value / step):
// the first value >= 2 where the range allows (so that no fitted point is 1, the one size
// broadcasting treats apart), else lo, kept below hi so the next value is still in the range.
int64_t FitBase(const RangedEntry& entry, const std::string& symbol);

// `point` (values) in coordinates, symbol by symbol: what SymDim and the generated constants'
// polynomials are evaluated at.
SymbolPoint CoordinatesOf(const RangedEntry& entry, const SymbolPoint& point);

// Infers `graph`'s shapes over `entry`'s ranges. An error when the entry does not fit the graph's
// inputs, or when static inference refuses some point (named); an irregular value is not an
// error but a finding (RangedShapes::irregular).
Result<RangedShapes> InferRangedShapes(const Graph& graph, const RangedEntry& entry);

// What the values computed from the inputs take at most over the range: the bound a workspace
// planned for the range's maximum starts from. A multilinear polynomial is linear in each symbol
// with the others fixed, so its largest value over the box is at a corner, and every corner is
// evaluated. Bound data (initializers) is not counted; irregular and dynamic values have no
// polynomial and are counted apart, as not bounded here.
struct RangeFootprint {
  int64_t total_bytes = 0;    // every fitted value at its own largest corner (never live at once)
  int64_t largest_bytes = 0;  // the largest single value ...
  std::string largest;        // ... its name ...
  SymbolPoint largest_at;     // ... and the corner where it is largest
  size_t unbounded = 0;       // irregular + dynamic values
};
// An error (naming the value and the corner) when a size overflows 64 bits.
Result<RangeFootprint> FootprintAtMaximum(const Graph& graph, const RangedEntry& entry,
                                          const RangedShapes& shapes);

}  // namespace kiln
