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
//    "entries":[{"index":0,"shape_class":{input:[dims]},
//                "inputs":[{"name","dtype","shape"}], "outputs":[…],
//                "workspace_bytes":N, "constants":[{"name","dtype","shape"}]}],
//    "fence":{"checkpoint_free":true,"perturbed_checkpoint_matched":true,
//             "constant_table_complete":true}}
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
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
  bool operator==(const TensorSpec&) const = default;
};

struct EntryMetadata {
  uint32_t index = 0;
  ShapeClass shape_class;
  std::vector<TensorSpec> inputs;
  std::vector<TensorSpec> outputs;
  uint64_t workspace_bytes = 0;
  std::vector<TensorSpec> constants;  // weights bound at init, in this order
  bool operator==(const EntryMetadata&) const = default;
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
  FenceFlags fence;
};

// Canonical bytes of metadata.json.
Result<std::string> SerializeMetadata(const CellMetadata& m);
// Parses and validates shape (types, required fields; unknown top-level fields refused by name).
Result<CellMetadata> ParseMetadata(std::string_view json_text, const std::string& what);

// Restates the key from recorded facts: envelope digest recomputed from `envelope`, toolchain
// digest from `toolchain`, graph axis as recorded, sm as recorded; each must equal the recorded
// axis (else InvalidArgument naming the axis), and the key from them must equal `key`.
Result<std::string> RestateKey(const CellMetadata& m);

}  // namespace kiln
