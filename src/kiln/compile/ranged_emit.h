// The generated program over a range (compile layer, above the pipeline and the emitter): is the
// source the compiler writes for one point of a ranged entry the same source at every point, up
// to integer constants that are polynomials in the entry's symbols? When it is, one template
// with those constants computed from the symbols at run time is the ranged entry's program, made
// by the same passes and emitter as a concrete entry and checkable against them point by point.
//
// The method is the one ranged_shapes.h uses for shapes, applied to the emitted text: the entry is
// compiled as a ranged entry (values whose shape depends on the symbols are not folded into
// constants: CompileOptions::symbolic_values) and emitted at a grid of points (per symbol its box
// base and the next two values, so a constant may be of degree two in a symbol: an attention's
// scores are seq*seq), the text is split into a skeleton and its decimal integer literals, and
// every literal that changes is fitted by finite differences. Then every probe point
// (RangeProbePoints) is compiled and emitted again and must give the same skeleton and the
// polynomial's value at each literal. A float constant that changes (a mean's 1/n over a ranged
// dim), a kernel chosen by size, or a broadcast that happens only at 1 changes the skeleton and is
// named with the line and the point.
//
// The workspace is planned at the range's maximum and that plan used at every point (where each
// buffer is no larger): its offsets are one set of constants, as a ranged entry's must be, where
// the plan of each point would pack buffers by their sizes there.
//
// Where each varying literal sits says what a runtime extent needs there: in the entry's run
// function it is an expression; in its constant tables (shape arrays, reference-op specs) and in
// its init (library calls prepared for one shape) it must move to run time or to a per-shape
// cache; in the dispatch part it is the entry's description.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "src/kiln/base/status.h"
#include "src/kiln/compile/pipeline.h"
#include "src/kiln/compile/ranged_shapes.h"
#include "src/kiln/graph/ir.h"
#include "src/kiln/graph/shape_class.h"

namespace kiln {

// A source text split at its decimal integer literals: pieces.size() == literals.size() + 1 and
// the text is pieces[0] literals[0] pieces[1] ... A literal is a maximal run of digits that starts
// a preprocessing number (not inside an identifier, not part of a float or hex literal), with an
// optional integer suffix left in the next piece; "0" is a literal, other runs that start with 0
// (octal) stay in the skeleton. offsets[i] is literal i's byte offset in the text.
struct LiteralSplit {
  std::vector<std::string> pieces;
  std::vector<int64_t> literals;
  std::vector<size_t> offsets;
};
LiteralSplit SplitIntegerLiterals(const std::string& text);

// An integer polynomial in Newton form around `base`: sum over exponent vectors a (a_i <= 2) of
// coefficient * prod_i C(x_i - base_i, a_i). Integer-valued on integers by construction.
struct NewtonPoly {
  std::vector<int64_t> base;                   // one per symbol of the template, in its order
  std::map<std::vector<int>, int64_t> coeffs;  // exponent vector -> coefficient, no zeros
  // False on overflow.
  bool Eval(const std::vector<int64_t>& x, int64_t* out) const;
  int Degree() const;  // the largest exponent of one symbol, 0 for a constant
};

struct EmittedTemplate {
  std::vector<std::string> symbols;  // the free symbols, in name order
  SymbolPoint base;                  // the grid's first point
  size_t emits = 0;                  // concrete compiles + emissions it took
  size_t literals = 0;               // integer literals in one point's source
  // The literals that vary, by where they sit: "tables", "init", "run", "dispatch", "prologue".
  std::map<std::string, size_t> varying;
  int max_degree = 0;  // over the varying literals
  // Whether the template gives the source of every probe point; if not, the first disagreement
  // (the point and the line), and whether every disagreement is at a point where some symbol is
  // below its base (the range's low end, where broadcasting treats 1 apart).
  bool holds = false;
  bool holds_above_base = false;
  std::string disagreement;
  size_t probes = 0;  // points checked: the probe points, then the caller's
  // The workspace is planned once, at the range's maximum, and every point uses that plan (its
  // offsets and size are then the same literals everywhere): its size.
  int64_t workspace_at_maximum = 0;
  // The fit, when the grid formed one skeleton: the source at the grid's first point, its split,
  // and each literal's polynomial (a constant one for a literal that does not vary); the program
  // at the range's maximum (its buffers and weights are every point's).
  std::string text;
  LiteralSplit split;
  std::vector<NewtonPoly> polys;
  Program at_maximum;

  size_t Varying() const;
  // "the source at 9 points is one template: 1234 of 5678 integer literals vary (run 1000,
  // init 12, ...; degree <= 2), and it gives the source at all 7 probe points" or what broke.
  std::string Summary() const;
};

// Fits the entry's generated source over the range and holds it to every probe point, then to
// each of `extra` (points of the range chosen by the caller, e.g. at random). An error only when
// the range is not well-formed (CheckRangedEntry, CheckRangedProbes) or an extra point is not a
// point of the range (named); a point that does not compile, or a skeleton that differs, is a
// finding (holds false, named).
Result<EmittedTemplate> FitEmittedTemplate(const Graph& graph, const RangedEntry& entry,
                                           const CompileOptions& options,
                                           const std::vector<SymbolPoint>& extra = {});

// A ranged entry's code, ready for EmitCell: the template's entry part with every varying literal
// replaced by a run-time constant of the instance (`kiln_v<j>`, read from kiln_cell_entry::v),
// renumbered as entry `index`, and a function that computes those constants from the symbols.
//   - in init and run: the literal is the constant's name; a `static const` local that holds one
//     is no longer static (each instance has its own values);
//   - in a constant table (a shape array a kernel reads): the table moves into the functions that
//     use it, as a local array;
//   - inside a reference op's spec (a JSON string): the string holds a marker \001<j>\002 the
//     dispatch replaces with the value when it prepares the op for an instance.
// A varying literal anywhere else (a preprocessor line, an array's length, the prologue) has no
// run-time form: Unimplemented, naming the line.
struct RangedEntryCode {
  RangedEntry entry;
  std::vector<std::string> symbols;  // every symbol of the entry, in name order: init_at's order
  // What EmitCell writes: the entry's code (`#if ... KILN_ENTRY == index` ... `#endif`), its
  // describe() (inputs and outputs with a symbol's name for each symbolic dim, constants,
  // workspace_bytes, "ranged": {"symbols": [...], "ranges": {s: [lo, hi]}}) and its counts.
  EmittedRangedEntry cell;
};

// `t` must hold over the whole of `entry` (t.holds): else Unimplemented with its summary. An
// output dim must be a constant or one symbol (the caller allocates outputs from the request's
// symbols): else Unimplemented naming the output.
Result<RangedEntryCode> EmitRangedEntry(const EmittedTemplate& t, const RangedEntry& entry,
                                        const RangedShapes& shapes, int index);

// Compiles a ranged entry as its pieces, numbered from `first_index`: for each, the template over
// it (FitEmittedTemplate) must hold at every probe point, and EmitRangedEntry writes its code. An
// error (Unimplemented naming the piece and what broke, or the shape analysis's own error) when
// some piece does not compile: the declared entry is then one gap, served eager.
Result<std::vector<RangedEntryCode>> CompileRangedPieces(const Graph& graph,
                                                         const RangedEntry& entry,
                                                         const CompileOptions& options,
                                                         int first_index);

}  // namespace kiln
