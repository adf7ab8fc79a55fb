// The cell loader (see loader.h).
#include "src/kiln/arm/loader.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <new>
#include <optional>

#include "src/kiln/base/canonical_json.h"
#include "src/kiln/base/file.h"
#include "src/kiln/cell/pack.h"
#include "src/kiln/runtime/host.h"

namespace kiln {

const char* LaneName(Lane lane) { return lane == Lane::kExported ? "exported" : "intake"; }

namespace {

// The caller's side of a kiln_dynamic_output: the tensor the cell asked for, allocated once,
// checked and charged to the request's budget before it exists.
struct DynamicOutput {
  kiln_dynamic_output abi{};  // first member: the cell hands back a pointer to it
  DType dtype = DType::kFloat32;
  std::shared_ptr<MemoryBudget> budget;
  Tensor tensor;
  bool called = false;
  Status refusal;  // why a size was refused (request_too_large), for the caller's answer

  static void* Alloc(kiln_dynamic_output* self, const int64_t* dims, int32_t rank) {
    auto* d = reinterpret_cast<DynamicOutput*>(self);
    if (d == nullptr || d->called || rank < 0 || rank > 64 || (rank > 0 && dims == nullptr)) {
      return nullptr;
    }
    Shape shape(dims, dims + rank);
    for (int64_t v : shape) {
      if (v < 0) return nullptr;
    }
    auto t = Tensor::Empty(d->dtype, shape, d->budget);
    if (!t.ok()) {
      if (t.status().Is(kRefusalRequestTooLarge)) d->refusal = t.status();
      return nullptr;
    }
    d->tensor = std::move(t).value();
    d->called = true;
    return d->tensor.raw_data();
  }
};

}  // namespace

Result<std::shared_ptr<CellLibrary>> CellLibrary::Open(const std::string& so_path) {
  void* h = ::dlopen(so_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    const char* err = ::dlerror();
    return Status::Corruption("cannot load cell '" + so_path + "': " + (err ? err : "?"));
  }
  std::shared_ptr<CellLibrary> lib(new CellLibrary());
  lib->handle_ = h;
  auto abi = reinterpret_cast<int (*)()>(::dlsym(h, "kiln_cell_abi_version"));
  auto describe = reinterpret_cast<const char* (*)()>(::dlsym(h, "kiln_cell_describe"));
  lib->init = reinterpret_cast<decltype(lib->init)>(::dlsym(h, "kiln_cell_entry_init"));
  lib->init_at = reinterpret_cast<decltype(lib->init_at)>(::dlsym(h, "kiln_cell_entry_init_at"));
  lib->run = reinterpret_cast<decltype(lib->run)>(::dlsym(h, "kiln_cell_entry_run"));
  lib->release = reinterpret_cast<decltype(lib->release)>(::dlsym(h, "kiln_cell_entry_release"));
  if (!abi || !describe || !lib->init || !lib->init_at || !lib->run || !lib->release) {
    return Status::Corruption("cell '" + so_path + "' does not export the kiln cell ABI");
  }
  if (abi() != KILN_CELL_ABI_VERSION) {
    return Status::InvalidArgument("cell '" + so_path + "' speaks ABI " + std::to_string(abi()) +
                                   ", this process " + std::to_string(KILN_CELL_ABI_VERSION));
  }
  KILN_ASSIGN_OR_RETURN(lib->describe_, ParseJson(describe(), "cell describe()"));
  return lib;
}

CellLibrary::~CellLibrary() {
  if (handle_) ::dlclose(handle_);
}

ArmedCell::~ArmedCell() {
  for (kiln_cell_entry* h : handles_) {
    if (h) library_->release(h);
  }
  for (auto& list : free_ws_) {
    for (void* ws : list) std::free(ws);
  }
}

void* ArmedCell::TakeWorkspace(size_t index) const {
  {
    std::lock_guard<std::mutex> lock(ws_mu_);
    if (!free_ws_[index].empty()) {
      void* ws = free_ws_[index].back();
      free_ws_[index].pop_back();
      return ws;
    }
  }
  const uint64_t bytes = entries_[index].workspace_bytes;
  return std::aligned_alloc(64, (bytes + 63) / 64 * 64);
}

void ArmedCell::GiveWorkspace(size_t index, void* ws) const {
  if (ws == nullptr) return;
  std::lock_guard<std::mutex> lock(ws_mu_);
  free_ws_[index].push_back(ws);
}

void ArmedCell::Revoke(const std::string& reason) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  if (revoked_.load()) return;
  revoke_reason_ = reason;  // written before the flag: whoever sees revoked() sees the reason
  revoked_.store(true);
}

Status ArmedCell::BindAll(const WeightMap& weights) {
  std::vector<kiln_cell_entry*> handles;
  std::vector<std::vector<const void*>> bound;
  auto release_all = [&] {
    for (kiln_cell_entry* h : handles) library_->release(h);
  };
  for (const EntryMetadata& e : entries_) {
    std::vector<const void*> ptrs;
    for (const TensorSpec& c : e.constants) {
      auto it = weights.find(c.name);
      if (it == weights.end()) {
        release_all();
        return Status::NotFound("cell constant '" + c.name + "' has no bound weight");
      }
      if (it->second.dtype() != c.dtype || it->second.shape() != c.shape) {
        release_all();
        return Status::InvalidArgument("cell constant '" + c.name + "' is " +
                                       std::string(DTypeName(c.dtype)) + ShapeToString(c.shape) +
                                       ", the weight is " + it->second.TypeString());
      }
      ptrs.push_back(it->second.raw_data());
    }
    bound.push_back(ptrs);
    if (e.ranged) {  // instantiated per point, at its first request (Instance)
      handles.push_back(nullptr);
      continue;
    }
    kiln_cell_entry* h = nullptr;
    const int rc = library_->init(e.index, HostApi(), ptrs.data(),
                                  static_cast<uint32_t>(ptrs.size()), threads_, &h);
    if (rc != KILN_CELL_OK) {
      release_all();
      return Status(
          rc == KILN_CELL_RESOURCE_EXHAUSTED ? StatusCode::kResourceExhausted
                                             : StatusCode::kInternal,
          "cell entry " + std::to_string(e.index) + " init failed with code " + std::to_string(rc));
    }
    handles.push_back(h);
  }
  std::unique_lock<std::shared_mutex> lock(mu_);
  for (kiln_cell_entry* h : handles_) {
    if (h) library_->release(h);
  }
  handles_ = std::move(handles);
  bound_ = std::move(bound);
  weights_ = weights;  // shares the tensors' storage: the pointers bound above stay valid
  // Instances hold the old weights' pointers: none is kept past a rebind (a run that holds one
  // has finished, since it holds the lock this waited for).
  std::lock_guard<std::mutex> inst_lock(inst_mu_);
  instances_.clear();
  return Status::OK();
}

size_t ArmedCell::ranged_instances_made() const {
  std::lock_guard<std::mutex> lock(inst_mu_);
  return inst_made_;
}

size_t ArmedCell::ranged_instances_kept() const {
  std::lock_guard<std::mutex> lock(inst_mu_);
  return instances_.size();
}

Result<std::shared_ptr<kiln_cell_entry>> ArmedCell::Instance(
    size_t index, const std::vector<int64_t>& values) const {
  // Shared with runs, excluded by Rebind: the bound pointers read here are the current weights'.
  std::shared_lock<std::shared_mutex> bind_lock(mu_);
  const auto key = std::make_pair(index, values);
  {
    std::lock_guard<std::mutex> lock(inst_mu_);
    auto it = instances_.find(key);
    if (it != instances_.end()) {
      it->second.used = ++inst_clock_;
      return it->second.instance;
    }
  }
  // Prepared without the instance lock (a new point's library calls take tens to hundreds of
  // milliseconds): requests at points already kept go on meanwhile. Two requests for one new
  // point may both prepare it; the first kept wins and the other is released.
  const std::vector<const void*>& ptrs = bound_[index];
  kiln_cell_entry* h = nullptr;
  const int rc = library_->init_at(static_cast<uint32_t>(index), values.data(),
                                   static_cast<uint32_t>(values.size()), HostApi(), ptrs.data(),
                                   static_cast<uint32_t>(ptrs.size()), threads_, &h);
  if (rc != KILN_CELL_OK || h == nullptr) {
    const std::string what = "cell entry " + std::to_string(index) + " instance init";
    if (rc == KILN_CELL_RESOURCE_EXHAUSTED) {
      return Status::Refused(StatusCode::kResourceExhausted, kCellOom, what + " ran out of memory");
    }
    if (rc == KILN_CELL_BAD_ARGUMENT) {
      return Status::Refused(StatusCode::kInvalidArgument, kOutOfEnvelope,
                             what + " refused the point");
    }
    return Status::Refused(StatusCode::kInternal, kCellFault,
                           what + " failed with code " + std::to_string(rc));
  }
  // The instance keeps the library and the weights it points at alive: a run that took it just
  // before a rebind still reads the weights it was made with.
  std::shared_ptr<CellLibrary> library = library_;
  WeightMap weights = weights_;
  std::shared_ptr<kiln_cell_entry> instance(
      h, [library, weights](kiln_cell_entry* e) { library->release(e); });
  std::lock_guard<std::mutex> lock(inst_mu_);
  ++inst_made_;
  if (auto it = instances_.find(key); it != instances_.end()) {
    it->second.used = ++inst_clock_;
    return it->second.instance;
  }
  if (instances_.size() >= kMaxRangedInstances) {
    auto oldest = instances_.begin();
    for (auto i = instances_.begin(); i != instances_.end(); ++i) {
      if (i->second.used < oldest->second.used) oldest = i;
    }
    instances_.erase(oldest);
  }
  instances_[key] = Kept{instance, ++inst_clock_};
  return instance;
}

Result<std::unique_ptr<ArmedCell>> ArmedCell::Arm(std::shared_ptr<CellLibrary> library,
                                                  std::vector<EntryMetadata> entries,
                                                  const WeightMap& weights, Lane lane,
                                                  std::string ref, int num_threads) {
  // The library must describe exactly the entries the metadata declares.
  const nlohmann::json& d = library->describe();
  if (!d.contains("entries") || d["entries"].size() != entries.size()) {
    return Status::Corruption("cell describes " +
                              std::to_string(d.contains("entries") ? d["entries"].size() : 0) +
                              " entries, its metadata " + std::to_string(entries.size()));
  }
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto& de = d["entries"][i];
    if (de.value("workspace_bytes", uint64_t{0}) != entries[i].workspace_bytes ||
        de["constants"].size() != entries[i].constants.size() ||
        de["inputs"].size() != entries[i].inputs.size() ||
        de["outputs"].size() != entries[i].outputs.size()) {
      return Status::Corruption("cell entry " + std::to_string(i) +
                                " differs between describe() and metadata.json");
    }
  }
  std::unique_ptr<ArmedCell> cell(new ArmedCell());
  cell->library_ = std::move(library);
  cell->entries_ = std::move(entries);
  cell->lane_ = lane;
  cell->ref_ = std::move(ref);
  cell->threads_ = num_threads;
  KILN_RETURN_IF_ERROR(cell->BindAll(weights));
  cell->free_ws_.resize(cell->entries_.size());
  for (size_t i = 0; i < cell->entries_.size(); ++i) {
    const uint64_t bytes = cell->entries_[i].workspace_bytes;
    if (bytes == 0) continue;
    void* ws = cell->TakeWorkspace(i);
    if (ws == nullptr) {
      return Status::ResourceExhausted("cannot allocate " + std::to_string(bytes) +
                                       " bytes of workspace for cell entry " + std::to_string(i));
    }
    std::memset(ws, 0, bytes);  // touch the pages now, not in the first request
    cell->GiveWorkspace(i, ws);
  }
  return cell;
}

Status ArmedCell::Rebind(const WeightMap& weights) { return BindAll(weights); }

int ArmedCell::Admit(const std::map<std::string, Tensor>& inputs, std::string* mismatch,
                     bool* ambiguous) const {
  int found = -1;
  int best_rank = -1;  // higher = closer: 0 dtype, 1 missing/rank, 2 dim
  std::string best;
  for (size_t i = 0; i < entries_.size(); ++i) {
    const EntryMetadata& e = entries_[i];
    int rank = 3;
    std::string why;
    if (e.ranged) {
      // Fixed dims and each symbol's one value inside its range (graph/shape_class.h), then
      // dtypes as for a class.
      const RangedMatch m = MatchRanged(*e.ranged, ShapesOf(inputs));
      if (m.fit != RangedFit::kFits) {
        rank = m.fit == RangedFit::kNamesOrRank ? 1 : 2;
        why = "entry " + std::to_string(i) + " (ranged " + DescribeRanged(*e.ranged) +
              "): " + m.detail;
      }
    }
    for (const TensorSpec& s : e.inputs) {
      auto it = inputs.find(s.name);
      if (it == inputs.end()) {
        rank = std::min(rank, 1);
        if (why.empty()) why = "input '" + s.name + "' is missing";
        continue;
      }
      const Tensor& t = it->second;
      if (t.dtype() != s.dtype) {
        rank = std::min(rank, 0);
        if (why.empty()) {
          why = "input '" + s.name + "' is " + DTypeName(t.dtype()) + ", entry " +
                std::to_string(i) + " takes " + DTypeName(s.dtype);
        }
      } else if (e.ranged) {
        continue;  // matched above, dim by dim
      } else if (t.rank() != static_cast<int64_t>(s.shape.size())) {
        rank = std::min(rank, 1);
        if (why.empty()) {
          why = "input '" + s.name + "' has rank " + std::to_string(t.rank()) + ", entry " +
                std::to_string(i) + " takes " + ShapeToString(s.shape);
        }
      } else if (t.shape() != s.shape) {
        rank = std::min(rank, 2);
        if (why.empty()) {
          why = "input '" + s.name + "' is " + ShapeToString(t.shape()) + ", entry " +
                std::to_string(i) + " takes " + ShapeToString(s.shape);
        }
      }
    }
    if (inputs.size() != e.inputs.size() && why.empty()) {
      rank = 1;
      why = "request has " + std::to_string(inputs.size()) + " inputs, entry takes " +
            std::to_string(e.inputs.size());
    }
    if (rank == 3) {
      if (found >= 0) {
        if (mismatch)
          *mismatch = std::string(kEntryAmbiguous) + ": entries " + std::to_string(found) +
                      " and " + std::to_string(i) + " both admit the request";
        if (ambiguous) *ambiguous = true;
        return -1;
      }
      found = static_cast<int>(i);
    } else if (rank > best_rank) {
      best_rank = rank;
      best = why;
    }
  }
  if (found < 0 && mismatch) *mismatch = best;
  return found;
}

Result<std::map<std::string, Tensor>> ArmedCell::Run(
    int index, const std::map<std::string, Tensor>& inputs,
    const std::shared_ptr<MemoryBudget>& budget) const {
  using Outputs = std::map<std::string, Tensor>;
  auto out_of_envelope = [](const std::string& why) -> Result<Outputs> {
    return Status::Refused(StatusCode::kInvalidArgument, kOutOfEnvelope, why);
  };
  auto oom = [](const std::string& why) -> Result<Outputs> {
    return Status::Refused(StatusCode::kResourceExhausted, kCellOom, why);
  };
  auto fault = [](const std::string& why) -> Result<Outputs> {
    return Status::Refused(StatusCode::kInternal, kCellFault, why);
  };
  if (revoked_) {
    return Status::Refused(
        StatusCode::kInternal, kRefusalRevoked,
        "cell " + (ref_.empty() ? std::string("(intake)") : ref_) + " is revoked");
  }
  if (index < 0 || index >= static_cast<int>(entries_.size())) {
    return out_of_envelope("no entry " + std::to_string(index));
  }
  // A ranged entry runs at the request's point: its specs there, and the instance made for it.
  std::optional<EntryMetadata> at_point;
  std::shared_ptr<kiln_cell_entry> instance;
  if (entries_[static_cast<size_t>(index)].ranged) {
    const EntryMetadata& ranged = entries_[static_cast<size_t>(index)];
    const RangedMatch m = MatchRanged(*ranged.ranged, ShapesOf(inputs));
    if (m.fit != RangedFit::kFits) {
      return out_of_envelope("entry " + std::to_string(index) + ": " + m.detail);
    }
    std::vector<int64_t> values;
    for (const auto& [name, range] : ranged.ranged->ranges) values.push_back(m.values.at(name));
    Result<EntryMetadata> there = EntryAt(ranged, m.values);
    if (!there.ok())
      return out_of_envelope("entry " + std::to_string(index) + ": " + there.status().message());
    at_point = std::move(there).value();
    Result<std::shared_ptr<kiln_cell_entry>> got = Instance(static_cast<size_t>(index), values);
    if (!got.ok()) {
      if (got.status().Is(kCellFault)) return fault(got.status().message());
      return got.status();
    }
    instance = std::move(got).value();
  }
  const EntryMetadata& e = at_point ? *at_point : entries_[static_cast<size_t>(index)];
  std::vector<const void*> in_ptrs;
  std::vector<Tensor> realigned;  // inputs copied once into aligned buffers when needed
  realigned.reserve(e.inputs.size());
  for (const TensorSpec& s : e.inputs) {
    auto it = inputs.find(s.name);
    if (it == inputs.end() || it->second.dtype() != s.dtype || it->second.shape() != s.shape) {
      return out_of_envelope("input '" + s.name + "' does not match entry " +
                             std::to_string(index));
    }
    const void* p = it->second.raw_data();
    if (reinterpret_cast<uintptr_t>(p) % 64 != 0) {
      auto copy = it->second.Clone();
      if (!copy.ok()) return oom(copy.status().message());
      realigned.push_back(std::move(copy).value());
      p = realigned.back().raw_data();
    }
    in_ptrs.push_back(p);
  }
  std::map<std::string, Tensor> outputs;
  std::vector<void*> out_ptrs;
  std::vector<DynamicOutput> dynamic(e.outputs.size());
  for (size_t i = 0; i < e.outputs.size(); ++i) {
    const TensorSpec& s = e.outputs[i];
    if (s.dynamic) {  // allocated by the cell once its shape is known (kiln_dynamic_output)
      dynamic[i].abi.alloc = &DynamicOutput::Alloc;
      dynamic[i].dtype = s.dtype;
      dynamic[i].budget = budget;
      out_ptrs.push_back(&dynamic[i].abi);
      continue;
    }
    auto t = Tensor::Empty(s.dtype, s.shape, budget);
    if (!t.ok()) {
      if (t.status().Is(kRefusalRequestTooLarge)) return t.status();
      return oom(t.status().message());
    }
    out_ptrs.push_back(t->raw_data());
    outputs[s.name] = std::move(t).value();
  }
  void* ws = nullptr;
  if (e.workspace_bytes > 0) {
    ws = TakeWorkspace(static_cast<size_t>(index));
    if (!ws) {
      return oom("cannot allocate " + std::to_string(e.workspace_bytes) +
                 " bytes of cell workspace");
    }
  }
  int rc;
  HostRunContext request;
  request.budget = budget;
  {
    ScopedHostRunContext scope(&request);
    std::shared_lock<std::shared_mutex> lock(mu_);
    // The ABI refuses a null array; an entry with no runtime inputs gets an empty one.
    static const void* const kNoInputs[1] = {nullptr};
    rc = library_->run(instance ? instance.get() : handles_[static_cast<size_t>(index)],
                       in_ptrs.empty() ? kNoInputs : in_ptrs.data(), out_ptrs.data(), ws,
                       e.workspace_bytes);
  }
  GiveWorkspace(static_cast<size_t>(index), ws);
  // A refusal of the request's values (its tensors past its budget) is answered as itself,
  // whatever code the cell returned for it: the request's fault, never the cell's.
  if (rc != KILN_CELL_OK) {
    if (request.refusal.Is(kRefusalRequestTooLarge)) {
      return request.refusal;
    }
    for (const DynamicOutput& d : dynamic) {
      if (!d.refusal.ok()) return d.refusal;
    }
  }
  if (rc == KILN_CELL_RESOURCE_EXHAUSTED) {
    return oom("cell entry " + std::to_string(index) + " ran out of memory");
  }
  if (rc == KILN_CELL_BAD_ARGUMENT) {
    // The inputs are of the entry's types, so the cell refused their values (a dynamic region's
    // eager kernels did): the request is outside what the cell serves; the cell stays armed.
    return out_of_envelope("cell entry " + std::to_string(index) +
                           " refused the inputs' values (a data-dependent shape or index eager "
                           "refuses too)");
  }
  if (rc != KILN_CELL_OK) {
    return fault("entry " + std::to_string(index) + " returned code " + std::to_string(rc));
  }
  for (size_t i = 0; i < e.outputs.size(); ++i) {
    if (!e.outputs[i].dynamic) continue;
    if (!dynamic[i].called) {
      return fault("entry " + std::to_string(index) + " never produced dynamic output '" +
                   e.outputs[i].name + "'");
    }
    outputs[e.outputs[i].name] = std::move(dynamic[i].tensor);
  }
  return outputs;
}

Result<std::shared_ptr<CellLibrary>> OpenCellBytes(const std::string& so_bytes,
                                                   const std::string& private_dir) {
  // What is written here is about to run: the directory is made 0700 (never chmod-ed, which would
  // follow a link), must be this user's alone, and no link may lead the write or the dlopen
  // elsewhere.
  const size_t slash = private_dir.find_last_of('/');
  if (slash != std::string::npos && slash > 0) {
    KILN_RETURN_IF_ERROR(MakeDirs(private_dir.substr(0, slash)));
  }
  if (::mkdir(private_dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return Status::IOError("cannot mkdir '" + private_dir + "': " + std::strerror(errno));
  }
  KILN_RETURN_IF_ERROR(CheckPrivateDir(private_dir));
  const std::string path = private_dir + "/cell.so";
  // A private copy made to be dlopened now: after a crash it is garbage, so it is not flushed
  // (measured on micro-diffusion: the fsync was ~7 ms of a 29 ms adopt).
  KILN_RETURN_IF_ERROR(WriteFileAtomic(path, so_bytes, Durability::kScratch));
  return CellLibrary::Open(path);
}

Result<std::unique_ptr<ArmedCell>> LoadAdmittedCell(const AdmittedCell& cell,
                                                    const WeightMap& weights, Lane lane,
                                                    const std::string& private_dir, int num_threads,
                                                    LoadTimings* timings) {
  using Clock = std::chrono::steady_clock;
  const auto ms = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
  };
  const auto t0 = Clock::now();
  KILN_ASSIGN_OR_RETURN(auto lib, OpenCellBytes(cell.files.shared_object, private_dir));
  const auto t1 = Clock::now();
  auto armed = ArmedCell::Arm(std::move(lib), cell.metadata.entries, weights, lane,
                              CellRef(cell.metadata.key, cell.digest), num_threads);
  if (timings != nullptr) *timings = LoadTimings{ms(t0, t1), ms(t1, Clock::now())};
  return armed;
}

}  // namespace kiln
