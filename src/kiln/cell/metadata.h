// metadata.json: what a cell says about itself (docs/design.md §6). Cell layer.
//
// Canonical JSON (sorted keys, no spaces), no timings or wall clocks (those ride events), so two
// mints of one key produce identical bytes. Admission restates the key from these recorded facts
// with KeyFromAxes — the same function that minted it.
//
// Layout (format_version 1):
//   {"format_version":1, "key":"ck1-…", "family":"root/micro-diffusion", "codegen_version":"…",
//    "axes":{"graph":"<16hex>","envelope":"<16hex>","sm":"x86-64-v3","toolchain":"<16hex>"},
//    "envelope": <EnvelopeFacts>, "toolchain": <toolchain block>, "sm":"x86-64-v3",
//    "entries":[{"index":0,"shape_class":{input:[dims]},   (a ranged entry: "ranged":{...}, and
//                                                           its specs' shapes name symbols)
//                "inputs":[{"name","dtype","shape"}], "outputs":[…],
//                "workspace_bytes":N, "constants":[{"name","dtype","shape"}]}],
//    "gaps":[{"shape_class":{input:[dims]},"reason":"…"}],   (only when some entry has no code;
//            a ranged entry's gap has "ranged":{"inputs":…,"ranges":…} for "shape_class")
//    "fence":{"checkpoint_free":true,"perturbed_checkpoint_matched":true,
//             "constant_table_complete":true}}
//
// Partial coverage: every class of the envelope is served by exactly one entry or named by exactly
// one gap (a class the compiler could not compile, with its reason). A cell with gaps is admitted
// for the classes it carries; the worker serves the gaps eager and says so (docs/design.md
// "Partial coverage"). A cell without gaps writes no `gaps` field, so its bytes are what they were
// before gaps existed.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "src/kiln/base/status.h"
#include "src/kiln/cell/key.h"
#include "src/kiln/tensor/dtype.h"

namespace kiln {

inline constexpr int kCellFormatVersion = 1;

struct TensorSpec {
  std::string name;
  DType dtype = DType::kFloat32;
  Shape shape;
  // An entry output whose shape is known only at run time (shape [] then; "dynamic": true in the
  // JSON, absent when false): it is passed to the cell as a kiln_dynamic_output.
  bool dynamic = false;
  // A ranged entry's spec: per dim, the symbol whose value it is ("" for a fixed dim; shape[i] is
  // 0 then). Empty for a concrete entry's. In the JSON the symbol's name stands in "shape".
  std::vector<std::string> dim_symbols = {};
  // A ranged entry's output: per dim, a polynomial in the symbols' coordinates (SymDim's text,
  // "2*seq"; "" where the dim is fixed or a symbol). Empty when no dim has one. In the JSON
  // {"poly": "2*seq"} stands in "shape". Never an input's: ingress matches inputs dim by dim.
  std::vector<std::string> dim_polys = {};
  bool operator==(const TensorSpec&) const = default;
};

struct EntryMetadata {
  uint32_t index = 0;
  ShapeClass shape_class;  // a concrete entry's class (empty for a ranged entry)
  // A ranged entry: the piece of a declared ranged entry it serves (graph/shape_class.h
  // RangedPieces), written as "ranged" in place of "shape_class". Its specs name symbols.
  std::optional<RangedEntry> ranged;
  std::vector<TensorSpec> inputs;
  std::vector<TensorSpec> outputs;
  uint64_t workspace_bytes = 0;
  std::vector<TensorSpec> constants;  // weights bound at init, in this order
  bool operator==(const EntryMetadata&) const = default;
};

// A declared shape class the cell carries no entry for, and why (the compiler's refusal for that
// class, which a worker re-derives before it believes it: mint/regenerate.h).
struct EntryGap {
  ShapeClass shape_class;             // a class's gap (empty for a ranged entry's)
  std::optional<RangedEntry> ranged;  // a ranged entry's gap
  std::string reason;
  bool operator==(const EntryGap&) const = default;
};

struct FenceFlags {
  bool checkpoint_free = false;               // codegen read no weight value
  bool perturbed_checkpoint_matched = false;  // fence proof ran and matched eager
  bool constant_table_complete = false;       // every weight the graph binds is listed
  bool operator==(const FenceFlags&) const = default;
};

struct CellMetadata {
  int format_version = kCellFormatVersion;
  std::string key;
  std::string family;
  std::string codegen_version;
  KeyAxes axes;
  nlohmann::json envelope;   // EnvelopeFacts
  nlohmann::json toolchain;  // the toolchain block (identity/toolchain.h)
  std::string sm;
  std::vector<EntryMetadata> entries;
  std::vector<EntryGap> gaps;  // declared classes with no entry; empty for a full cell
  FenceFlags fence;
};

// A ranged entry at one point (a value of each of its symbols): its specs' shapes there, and the
// point as the entry's class. REQUIRES: `entry.ranged` and every symbol in `point`.
Result<EntryMetadata> EntryAt(const EntryMetadata& entry,
                              const std::map<std::string, int64_t>& point);

// Canonical bytes of metadata.json.
Result<std::string> SerializeMetadata(const CellMetadata& m);
// Parses and validates shape (types, required fields; unknown top-level fields refused by name).
Result<CellMetadata> ParseMetadata(std::string_view json_text, const std::string& what);

// Restates the key from recorded facts: envelope digest recomputed from `envelope`, toolchain
// digest from `toolchain`, graph axis as recorded, sm as recorded; each must equal the recorded
// axis (else InvalidArgument naming the axis), and the key from them must equal `key`.
Result<std::string> RestateKey(const CellMetadata& m);

}  // namespace kiln
