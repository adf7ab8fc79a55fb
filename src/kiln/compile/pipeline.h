// The compiler's pipeline: graph + shape class -> Program -> cell source -> shared object
// (compile layer). pipeline.cc is the compiler's table of contents.
#pragma once

#include <iosfwd>
#include <set>
#include <string>
#include <vector>

#include "src/kiln/base/status.h"
#include "src/kiln/compile/driver.h"
#include "src/kiln/compile/emit_cpp.h"
#include "src/kiln/compile/program.h"
#include "src/kiln/graph/ir.h"
#include "src/kiln/graph/shape_class.h"

namespace kiln {

struct CompileOptions {
  // Passes to skip, by name, for bisecting a miscompile (KILN_DISABLE_PASSES=a,b also works).
  std::vector<std::string> disabled_passes;
  // When set, the IR each entry starts from and the IR after every pass are written here
  // ("(unchanged)" when a pass did nothing).
  std::ostream* dump = nullptr;
  EmitOptions emit;
  int parallel_compiles = 2;
  // A ranged entry compiled at one of its points: the values whose shape depends on the entry's
  // symbols (ranged_shapes.h). They are never folded into constant tables, which would make the
  // source's length depend on the point (ranged_emit.h); they are computed when the entry runs.
  std::set<std::string> symbolic_values;
};

// The test-only switch KILN_TEST_CELL_SEGV=<float>: every cell this process generates writes
// through a null pointer when its first input's first element equals that value
// (EmitOptions::test_segv), so end-to-end tests can show a worker killed by a cell's own code
// (docs/fleet.md "A cell that crashes the worker"). Read by GenerateCell, the one path to a cell's
// source, so a mint and a worker's source regeneration agree whenever both processes have it set;
// nothing in kiln sets it, and a process that honours it says so in its log.
inline constexpr const char* kTestCellSegvEnv = "KILN_TEST_CELL_SEGV";

// The test-only switch KILN_TEST_UNCOMPILABLE_CLASS="{x=[5,64]}" (a class as DescribeClasses
// writes it, or a ranged entry as DescribeRanged does, graph/shape_class.h): CompileEntry (or
// CompileRangedEntry and GenerateCell) refuses that class as the compiler would refuse a
// class it cannot compile, so tests can show a partially covered cell (docs/design.md "Partial
// coverage") without a real compiler gap. Read by CompileEntry, so a mint and a worker's check of
// the cell's gaps agree whenever both processes have it set; nothing in kiln sets it, and a process
// that honours it says so in its log.
inline constexpr const char* kTestUncompilableClassEnv = "KILN_TEST_UNCOMPILABLE_CLASS";

struct PassTiming {
  std::string entry;
  std::string pass;
  double ms = 0;
};

// The ordered pass list, for docs and `--disable-pass` validation.
const std::vector<std::string>& PassNames();

// The passes a compile skips: options.disabled_passes, then KILN_DISABLE_PASSES=a,b. A cell
// compiled with any of them skipped is not the cell its key names (its source is not what the
// code generator makes of the graph, so no worker's provenance check would accept it): it is for
// bisecting, and the local store never keeps one (mint/mint.h).
std::vector<std::string> DisabledPasses(const CompileOptions& options);

// InvalidArgument naming the first of `names` that is no pass of PassNames().
Status CheckPassNames(const std::vector<std::string>& names);

// Runs the graph and program passes for one shape class.
Result<Program> CompileEntry(const Graph& graph, const ShapeClass& shape_class, int index,
                             const CompileOptions& options, std::vector<PassTiming>* timings);

// The compiler's answer for a ranged entry: OK when each of its pieces compiles to one template
// over its range (ranged_emit.h CompileRangedPieces, which GenerateCell uses), else the refusal a
// gap records, naming the piece and what broke.
Status CompileRangedEntry(const Graph& graph, const RangedEntry& entry,
                          const CompileOptions& options);

// Why a class has no entry: CompileEntry's `failure` for it, as compiled with entry number
// `index`, in words that do not name that number (so a worker re-deriving a cell's gap, with
// whatever number, gets the same words).
std::string GapReason(const Status& failure, int index);

// Every class of the envelope, then emission: the whole cell source. A class whose CompileEntry
// fails is a gap (EmittedCell::gaps, with the failure's words) and the others are still compiled,
// entry i from the i-th compiled class (EmittedCell::entry_classes); only when no class compiles
// is the first failure returned. Ranged entries follow the classes: each is compiled as its
// pieces (EmittedCell::ranged_pieces), entries after the classes' own, or is one gap (gap index
// classes.size() + r for ranged entry r).
Result<EmittedCell> GenerateCell(const Graph& graph, const Envelope& envelope,
                                 const std::string& graph_digest, const CompileOptions& options,
                                 std::vector<PassTiming>* timings,
                                 std::vector<Program>* programs = nullptr);

// Compiles a generated source into shared-object bytes: each entry and the dispatch part as
// separate compiler processes (up to options.parallel_compiles at once), then one link.
// `work_dir` must exist and is left holding the intermediate files.
Result<std::string> BuildSharedObject(const std::string& source, size_t num_entries,
                                      const std::string& sm, const std::string& seed,
                                      CompilerDriver& driver, const std::string& work_dir,
                                      int parallel_compiles, std::vector<PassTiming>* timings);

}  // namespace kiln
