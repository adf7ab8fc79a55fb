// The cell loader: dlopen a verified cell, bind a checkpoint's weights by name, and hand back an
// armed object that knows its own lane and state (arm layer, above cell/ and runtime/).
//
// Law 4: nothing reaches dlopen unverified. LoadAdmittedCell takes only an AdmittedCell (the
// product of AdmitCell: digest, size, key restatement, sm, toolchain all checked) or, for a cell
// this process just built and proved, the bytes it built. Law 9: the lane is a property of the
// ArmedCell itself, recorded here — the one seam every adopt route passes — never looked up in a
// process-global registry.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <shared_mutex>
#include <string>
#include <vector>

#include "src/kiln/abi/cell_abi.h"
#include "src/kiln/base/status.h"
#include "src/kiln/cell/admission.h"
#include "src/kiln/cell/metadata.h"
#include "src/kiln/graph/checkpoint.h"

namespace kiln {

enum class Lane { kExported, kIntake };
const char* LaneName(Lane lane);

// A dlopen'ed cell shared object and its exported functions. Closed when the last user goes.
class CellLibrary {
 public:
  // REQUIRES: the bytes at `so_path` were verified (admission or this process's own build).
  static Result<std::shared_ptr<CellLibrary>> Open(const std::string& so_path);
  ~CellLibrary();
  CellLibrary(const CellLibrary&) = delete;
  CellLibrary& operator=(const CellLibrary&) = delete;

  const nlohmann::json& describe() const { return describe_; }
  int (*init)(uint32_t, const kiln_host_api*, const void* const*, uint32_t, int,
              kiln_cell_entry**) = nullptr;
  int (*init_at)(uint32_t, const int64_t*, uint32_t, const kiln_host_api*, const void* const*,
                 uint32_t, int, kiln_cell_entry**) = nullptr;
  int (*run)(kiln_cell_entry*, const void* const*, void* const*, void*, uint64_t) = nullptr;
  void (*release)(kiln_cell_entry*) = nullptr;

 private:
  CellLibrary() = default;
  void* handle_ = nullptr;
  nlohmann::json describe_;
};

// Why a call did not run in the cell: the token of ArmedCell::Run's Status (Status::token()),
// the one channel out of the cell. Only a cell fault is the cell's; the caller revokes it then
// (law 7), and never for the others.
//   out_of_envelope    the inputs are not the entry's, or the cell refused their values (a
//                      data-dependent shape or index eager refuses too): the cell stays armed
//                      (law 8)
//   request_too_large  the request's tensors (outputs, or what a dynamic region allocates) are
//                      past its memory budget: kRefusalRequestTooLarge (tensor/), answered as
//                      the refusal it is; the cell stays armed
//   cell_fault         the cell returned a failure code or broke its ABI contract
//   cell_oom           an allocation failed, ours or the cell's: the machine's state, not the
//                      cell's fault; the cell stays armed
//   revoked            the cell was revoked before the call (sticky; it never runs again):
//                      kRefusalRevoked (cell/admission.h)
inline constexpr const char* kOutOfEnvelope = "out_of_envelope";
inline constexpr const char* kCellFault = "cell_fault";
inline constexpr const char* kCellOom = "cell_oom";
// Admit's mismatch when two entries admit one request: an envelope bug, named first in the text.
inline constexpr const char* kEntryAmbiguous = "entry_ambiguous";

class ArmedCell {
 public:
  // Binds `weights` (every constant-table entry by name, dtype and shape checked) into every
  // entry. `ref` is "<key>@<digest>" ("" for an intake cell).
  static Result<std::unique_ptr<ArmedCell>> Arm(std::shared_ptr<CellLibrary> library,
                                                std::vector<EntryMetadata> entries,
                                                const WeightMap& weights, Lane lane,
                                                std::string ref, int num_threads);
  ~ArmedCell();

  Lane lane() const { return lane_; }
  const std::string& ref() const { return ref_; }
  bool revoked() const { return revoked_.load(); }
  const std::string& revoke_reason() const { return revoke_reason_; }
  // Sticky for the life of the object (law 7): a revoked cell never runs again.
  void Revoke(const std::string& reason);
  const std::vector<EntryMetadata>& entries() const { return entries_; }

  // The one entry whose class admits `inputs` exactly (a ranged entry: whose fixed dims match and
  // whose symbols each take one value inside the range), or -1 with `mismatch` naming the closest
  // entry's first difference (ranked dtype < missing/rank < dim). When two entries admit them,
  // -1 with `*ambiguous` set (when given) and `mismatch` naming both.
  int Admit(const std::map<std::string, Tensor>& inputs, std::string* mismatch,
            bool* ambiguous = nullptr) const;

  // Runs entry `index`. A failure is Refused with one of the tokens above (its code:
  // InvalidArgument for out_of_envelope and request_too_large, ResourceExhausted for cell_oom,
  // Internal for cell_fault and revoked), and its message names the entry and what went wrong.
  // `budget` (optional): the request's memory budget, charged the outputs and whatever the cell's
  // dynamic regions allocate (runtime/host.h HostRunContext); the workspace, sized at mint, is
  // not. Any thread.
  Result<std::map<std::string, Tensor>> Run(
      int index, const std::map<std::string, Tensor>& inputs,
      const std::shared_ptr<MemoryBudget>& budget = nullptr) const;

  // Re-binds a new checkpoint of the same architecture (same names, dtypes, shapes).
  Status Rebind(const WeightMap& weights);

  // A ranged entry runs as an instance made for its point (kiln_cell_entry_init_at: its library
  // calls prepared for the shapes there), kept for the next request at that point. At most this
  // many are kept per cell; past it the least recently used goes (a run holding it finishes
  // first).
  static constexpr size_t kMaxRangedInstances = 32;
  // Instances made so far, and how many are kept now (for tests and metrics).
  size_t ranged_instances_made() const;
  size_t ranged_instances_kept() const;

 private:
  ArmedCell() = default;
  Status BindAll(const WeightMap& weights);
  // A workspace for entry `index`: one a finished run gave back, or a new one (nullptr when
  // that allocation fails). Runs of one entry at once each hold their own.
  void* TakeWorkspace(size_t index) const;
  void GiveWorkspace(size_t index, void* ws) const;

  // The instance of ranged entry `index` at `values` (its symbols, in name order): kept, or made
  // now. Errors as Run's (out_of_envelope for a point the cell refuses, cell_oom, cell_fault).
  Result<std::shared_ptr<kiln_cell_entry>> Instance(size_t index,
                                                    const std::vector<int64_t>& values) const;

  std::shared_ptr<CellLibrary> library_;
  std::vector<EntryMetadata> entries_;
  std::vector<kiln_cell_entry*> handles_;  // nullptr for a ranged entry
  // Per entry, the bound weights' pointers in its constant-table order (what init takes).
  std::vector<std::vector<const void*>> bound_;
  struct Kept {
    std::shared_ptr<kiln_cell_entry> instance;
    uint64_t used = 0;
  };
  mutable std::mutex inst_mu_;
  mutable std::map<std::pair<size_t, std::vector<int64_t>>, Kept> instances_;
  mutable uint64_t inst_clock_ = 0;
  mutable size_t inst_made_ = 0;
  WeightMap weights_;  // keeps bound tensors alive while entries point at them
  Lane lane_ = Lane::kExported;
  std::string ref_;
  int threads_ = 1;
  std::atomic<bool> revoked_{false};
  std::string revoke_reason_;
  mutable std::shared_mutex mu_;  // Run shares it; Rebind and Revoke take it alone
  // Workspaces kept between runs, per entry: a run allocates none once one exists, and the
  // first is made (and its pages touched) at arm time, so the first request pays no faults.
  mutable std::mutex ws_mu_;
  mutable std::vector<std::vector<void*>> free_ws_;
};

// Writes the verified .so into `private_dir` (created 0700) and opens it.
Result<std::shared_ptr<CellLibrary>> OpenCellBytes(const std::string& so_bytes,
                                                   const std::string& private_dir);

// Where a load's time went: writing the private copy and dlopen, then each entry's init with
// the bound weights (the cell prepares its kernels there).
struct LoadTimings {
  double open_ms = 0;
  double bind_ms = 0;
};

// Admitted bytes -> armed cell (law 4: AdmitCell ran first; this only loads and binds).
// `timings`, when given, is filled in.
Result<std::unique_ptr<ArmedCell>> LoadAdmittedCell(const AdmittedCell& cell,
                                                    const WeightMap& weights, Lane lane,
                                                    const std::string& private_dir, int num_threads,
                                                    LoadTimings* timings = nullptr);

}  // namespace kiln
