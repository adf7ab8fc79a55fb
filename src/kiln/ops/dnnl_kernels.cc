// oneDNN-backed SGEMM and 2-D convolution (ops layer); see dnnl_kernels.h for the contract.
//
// Exceptions stop here: every entry point wraps its oneDNN calls in one try block and translates
// what escapes in ErrorFromException.
#include "src/kiln/ops/dnnl_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "oneapi/dnnl/dnnl.h"
#include "oneapi/dnnl/dnnl.hpp"

#if DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_OMP
// oneDNN is built on OpenMP, whose team size is a per-calling-thread setting. These weak
// references bind to the libgomp that libdnnl loads (kiln_ops links the same runtime for the
// post-op pass, MapInPlace), and stay null (num_threads is then ignored) if some other runtime
// is in use.
extern "C" {
int omp_get_max_threads(void) __attribute__((weak));
void omp_set_num_threads(int n) __attribute__((weak));
}
#endif

namespace kiln {
namespace {

// Sets the calling thread's OpenMP team size for the lifetime of the object, then restores it.
class ScopedThreads {
 public:
  explicit ScopedThreads(int n) {
#if DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_OMP
    if (omp_get_max_threads != nullptr && omp_set_num_threads != nullptr) {
      prev_ = omp_get_max_threads();
      effective_ = n > 0 ? n : prev_;
      if (effective_ != prev_) omp_set_num_threads(effective_);
    }
#else
    (void)n;
#endif
  }
  ~ScopedThreads() {
#if DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_OMP
    if (effective_ != prev_) omp_set_num_threads(prev_);
#endif
  }
  ScopedThreads(const ScopedThreads&) = delete;
  ScopedThreads& operator=(const ScopedThreads&) = delete;
  // The team size calls made now will use (0 when unknown).
  int effective() const { return effective_; }

 private:
  int prev_ = 0;
  int effective_ = 0;
};

Status FromDnnlStatus(dnnl_status_t s, const std::string& what) {
  switch (s) {
    case dnnl_success:
      return Status::OK();
    case dnnl_out_of_memory:
      return Status::ResourceExhausted(what + ": oneDNN ran out of memory");
    case dnnl_invalid_arguments:
      return Status::Internal(what + ": oneDNN rejected the arguments (invalid_arguments)");
    case dnnl_unimplemented:
      return Status::Internal(what + ": oneDNN has no implementation for this case");
    default:
      return Status::Internal(what + ": oneDNN failed with status " +
                              std::to_string(static_cast<int>(s)));
  }
}

// Call only from inside a catch block.
Status ErrorFromException(const std::string& what) {
  try {
    throw;
  } catch (const dnnl::error& e) {
    Status s = FromDnnlStatus(e.status, what);
    return Status(s.code(), s.message() + " (" + e.what() + ")");
  } catch (const std::bad_alloc&) {
    return Status::ResourceExhausted(what + ": out of memory");
  } catch (const std::exception& e) {
    return Status::Internal(what + ": " + e.what());
  } catch (...) {
    return Status::Internal(what + ": unknown exception");
  }
}

const dnnl::engine& CpuEngine() {
  // A throwing constructor leaves the static uninitialised, so a later call retries.
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// Runs `prim` on `stream` with `args`, supplying the scratchpad the primitive asked for. Kernels
// use user-managed scratchpads so one cached primitive may run on several threads at once.
void Execute(const dnnl::primitive& prim, const dnnl::memory::desc& scratchpad_md,
             dnnl::stream& stream, std::unordered_map<int, dnnl::memory> args) {
  if (scratchpad_md.get_size() > 0) {
    args.emplace(DNNL_ARG_SCRATCHPAD, dnnl::memory(scratchpad_md, CpuEngine()));
  }
  prim.execute(stream, args);
}

std::string ShapeOf(const Conv2dParams& p) {
  auto s = [](int64_t v) { return std::to_string(v); };
  if (p.three_d) {
    return "Conv3d(x=[" + s(p.N) + "," + s(p.C) + "," + s(p.D) + "," + s(p.H) + "," + s(p.W) +
           "], w=[" + s(p.K) + "," + s(p.group > 0 ? p.C / p.group : p.C) + "," + s(p.T) + "," +
           s(p.R) + "," + s(p.S) + "], group=" + s(p.group) + ")";
  }
  return "Conv2d(x=[" + s(p.N) + "," + s(p.C) + "," + s(p.H) + "," + s(p.W) + "], w=[" + s(p.K) +
         "," + s(p.group > 0 ? p.C / p.group : p.C) + "," + s(p.R) + "," + s(p.S) +
         "], group=" + s(p.group) + ")";
}

Status ValidateConv(const Conv2dParams& p) {
  const std::string what = ShapeOf(p);
  struct Field {
    const char* name;
    int64_t value;
    int64_t min;
  };
  const Field fields[] = {
      {"N", p.N, 1},
      {"C", p.C, 1},
      {"H", p.H, 1},
      {"W", p.W, 1},
      {"K", p.K, 1},
      {"R", p.R, 1},
      {"S", p.S, 1},
      {"stride_h", p.stride_h, 1},
      {"stride_w", p.stride_w, 1},
      {"pad_t", p.pad_t, 0},
      {"pad_l", p.pad_l, 0},
      {"pad_b", p.pad_b, 0},
      {"pad_r", p.pad_r, 0},
      {"dil_h", p.dil_h, 1},
      {"dil_w", p.dil_w, 1},
      {"group", p.group, 1},
      {"D", p.D, 1},
      {"T", p.T, 1},
      {"stride_d", p.stride_d, 1},
      {"pad_f", p.pad_f, 0},
      {"pad_k", p.pad_k, 0},
      {"dil_d", p.dil_d, 1},
  };
  for (const Field& f : fields) {
    if (f.value < f.min) {
      return Status::InvalidArgument(what + ": " + f.name + "=" + std::to_string(f.value) +
                                     " must be >= " + std::to_string(f.min));
    }
  }
  if (p.C % p.group != 0) {
    return Status::InvalidArgument(what + ": group=" + std::to_string(p.group) +
                                   " does not divide " + std::to_string(p.C) + " input channels");
  }
  if (p.K % p.group != 0) {
    return Status::InvalidArgument(what + ": group=" + std::to_string(p.group) +
                                   " does not divide " + std::to_string(p.K) + " output channels");
  }
  if (p.three_d && p.layout >= 3) {
    return Status::InvalidArgument(what + ": channels-last layouts are 2-D only");
  }
  if (p.OutH() < 1 || p.OutW() < 1 || p.OutD() < 1) {
    return Status::InvalidArgument(what + ": output would be empty (" + std::to_string(p.OutH()) +
                                   "x" + std::to_string(p.OutW()) +
                                   "); the dilated kernel is larger than the padded input");
  }
  return Status::OK();
}

// A ready-to-run convolution: the primitive plus the reorders between kiln's plain layouts and
// the layouts the primitive chose (absent when they coincide).
struct ConvPrimitive {
  dnnl::convolution_forward::primitive_desc pd;
  dnnl::convolution_forward conv;
  dnnl::memory::desc user_src, user_wei, user_dst, bias;
  struct Reorder {
    dnnl::reorder prim;
    dnnl::memory::desc scratchpad;
  };
  std::optional<Reorder> src_reorder, wei_reorder, dst_reorder;
  std::optional<Reorder> dst_in_reorder;  // epilogue sum: the residual into the blocked dst
  bool activation_in_primitive = false;   // else RunConv2d applies it (ApplyPostOp) afterwards
  bool winograd = false;  // the library's Winograd kernel (layout 4, when it has one)
};

// Winograd's transforms add and subtract neighbouring inputs before anything is multiplied, so
// an infinity becomes inf - inf = NaN across its whole tile, and a NaN reaches outputs whose
// windows never held it. docs/design.md's rule (a non-finite input reaches exactly the outputs
// whose sums hold it) is the direct kernel's, so Winograd runs only on operands this moderate,
// where no transform can overflow either; anything else (NaN, infinities, |v| >= 2^40) runs the
// direct kernel. One comparison per element: a NaN fails it too.
bool WinogradSafe(const float* v, int64_t n) {
  constexpr float kBound = 1099511627776.0f;  // 2^40
  for (int64_t i = 0; i < n; i += 4096) {
    const int64_t end = std::min(n, i + 4096);
    bool ok = true;
    for (int64_t j = i; j < end; ++j) ok &= std::fabs(v[j]) < kBound;
    if (!ok) return false;
  }
  return true;
}

using ConvKey = std::tuple<Conv2dParams, bool /*has_bias*/, int /*threads*/>;

// Whether to let oneDNN pick blocked internal layouts (and reorder in/out each call) rather
// than run directly on NCHW. Measured with oneDNN 2.6 on one AVX-512 core, batch 1, reorders
// (weights included) counted: depthwise 3x3 is ~6x faster blocked and dense 3x3/7x7 ~1.1-1.3x,
// while a 1x1 convolution is ~1.6x faster as oneDNN's plain GEMM on NCHW. At batch 8 the dense
// 3x3 case is a wash.
// The compiler's choose-conv-layout pass makes this choice explicitly (layout 1 or 2); 0 applies
// the same rule here for callers without a compiler (the eager interpreter).
bool PreferBlockedLayout(const Conv2dParams& p) {
  if (p.layout == 1) return true;
  if (p.layout >= 2) return false;
  return p.group > 1 || p.R * p.S * p.T > 1;
}

// Whether a kiln_post_op code runs as one of oneDNN's eltwise post-ops, applied to the output
// tile while it is still in registers, instead of as a separate pass. Only the activations of
// the form y = x * g(x) qualify: SiLU, GELU (erf) and HardSwish. Their final multiply by x
// carries a NaN through whatever g does with it, and g(±inf) is the limit the interpreter also
// reaches, so their IEEE results are the interpreter's on every implementation oneDNN may pick
// (measured with oneDNN 2.6 on brgemm matmul, GEMM-, brgemm- and depthwise convolutions, with
// AVX2 and AVX-512). ReLU, sigmoid and tanh do not: depending on the implementation, the
// library maps NaN to 0 (relu, and logistic in the GEMM convolution), where the interpreter
// keeps it.
bool LibraryActivation(int post_op, dnnl::post_ops* ops) {
  switch (post_op) {
    case 3:
      ops->append_eltwise(1.0f, dnnl::algorithm::eltwise_swish, 1.0f, 0.0f);
      return true;
    case 5:
      ops->append_eltwise(1.0f, dnnl::algorithm::eltwise_gelu_erf, 0.0f, 0.0f);
      return true;
    case 6:  // the interpreter's HardSwish: x * clip(x / 6 + 0.5, 0, 1)
      ops->append_eltwise(1.0f, dnnl::algorithm::eltwise_hardswish, 1.0f / 6.0f, 0.5f);
      return true;
    default:
      return false;
  }
}

// `sum`: the reorder adds into the destination's prior contents (dst = reorder(src) + dst).
std::optional<ConvPrimitive::Reorder> MakeReorder(const dnnl::memory::desc& from,
                                                  const dnnl::memory::desc& to, bool sum = false) {
  if (from == to) return std::nullopt;
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (sum) {
    dnnl::post_ops ops;
    ops.append_sum(1.0f);
    attr.set_post_ops(ops);
  }
  dnnl::reorder::primitive_desc pd(CpuEngine(), from, CpuEngine(), to, attr);
  return ConvPrimitive::Reorder{dnnl::reorder(pd), pd.scratchpad_desc()};
}

// The activation of a fused epilogue is a library post-op only when LibraryActivation allows it
// (see there); the others run through ApplyPostOp over the finished output (one more pass over
// memory the convolution just wrote).
// REQUIRES: ValidateConv(p).ok(). Throws dnnl::error.
std::shared_ptr<const ConvPrimitive> CreateConv(const Conv2dParams& p, bool has_bias,
                                                const ConvEpilogue& epi = {}) {
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  using dims = dnnl::memory::dims;
  // 3-D: NCDHW activations, [K, C/g, T, R, S] weights, depth first in every window vector.
  const bool d3 = p.three_d;
  const dims src = d3 ? dims{p.N, p.C, p.D, p.H, p.W} : dims{p.N, p.C, p.H, p.W};
  const dims dst =
      d3 ? dims{p.N, p.K, p.OutD(), p.OutH(), p.OutW()} : dims{p.N, p.K, p.OutH(), p.OutW()};
  // ONNX weights [K, C/g, R, S] have the same bytes as oneDNN's goihw [g, K/g, C/g, R, S].
  dims wei = p.group == 1 ? dims{p.K, p.C, p.R, p.S}
                          : dims{p.group, p.K / p.group, p.C / p.group, p.R, p.S};
  if (d3) wei.insert(wei.end() - 2, p.T);
  const dims strides = d3 ? dims{p.stride_d, p.stride_h, p.stride_w} : dims{p.stride_h, p.stride_w};
  const dims dilations =
      d3 ? dims{p.dil_d - 1, p.dil_h - 1, p.dil_w - 1} : dims{p.dil_h - 1, p.dil_w - 1};
  const dims pad_begin = d3 ? dims{p.pad_f, p.pad_t, p.pad_l} : dims{p.pad_t, p.pad_l};
  const dims pad_end = d3 ? dims{p.pad_k, p.pad_b, p.pad_r} : dims{p.pad_b, p.pad_r};
  auto cp = std::make_shared<ConvPrimitive>();
  // NHWC: the caller's activations are channels-last already (the compiler planned them so
  // through the graph), and the primitive runs on them as they are; with Winograd (layout 4)
  // the library's Winograd kernel runs on its blocked layout between two reorders, when it has
  // one for this convolution (else the direct one runs on NHWC).
  const bool wino = p.layout == 4;
  const bool nhwc = p.layout == 3 || wino;
  const tag act = d3 ? tag::ncdhw : (nhwc ? tag::nhwc : tag::nchw);
  cp->user_src = dnnl::memory::desc(src, dt::f32, act);
  cp->user_dst = dnnl::memory::desc(dst, dt::f32, act);
  cp->user_wei = dnnl::memory::desc(
      wei, dt::f32,
      d3 ? (p.group == 1 ? tag::oidhw : tag::goidhw) : (p.group == 1 ? tag::oihw : tag::goihw));
  if (has_bias) cp->bias = dnnl::memory::desc({p.K}, dt::f32, tag::x);

  const bool blocked = !nhwc && PreferBlockedLayout(p);
  auto pick = [&](const dims& d, const dnnl::memory::desc& user) {
    return blocked ? dnnl::memory::desc(d, dt::f32, tag::any) : user;
  };
  const auto any = [&](const dims& d) { return dnnl::memory::desc(d, dt::f32, tag::any); };
  // oneDNN counts dilation as the gap between taps: ONNX dilation 1 is oneDNN 0.
  dnnl::convolution_forward::desc desc(
      dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
      pick(src, cp->user_src), blocked || nhwc ? any(wei) : cp->user_wei, cp->bias,
      pick(dst, cp->user_dst), strides, dilations, pad_begin, pad_end);
  if (wino) {
    dnnl::convolution_forward::desc wd(
        dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_winograd, any(src),
        any(wei), cp->bias, any(dst), {p.stride_h, p.stride_w}, {p.dil_h - 1, p.dil_w - 1},
        {p.pad_t, p.pad_l}, {p.pad_b, p.pad_r});
    try {  // is there a Winograd kernel for this geometry and epilogue on this machine?
      dnnl::primitive_attr attr;
      dnnl::post_ops ops;
      if (epi.sum) ops.append_sum(1.0f);
      LibraryActivation(epi.post_op, &ops);
      attr.set_post_ops(ops);
      dnnl::convolution_forward::primitive_desc probe(wd, attr, CpuEngine());
      desc = wd;
      cp->winograd = true;
    } catch (const dnnl::error&) {
    }
  }
  auto make_pd = [&](bool with_sum, bool with_activation) {
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    dnnl::post_ops ops;
    if (with_sum) ops.append_sum(1.0f);
    cp->activation_in_primitive = with_activation && LibraryActivation(epi.post_op, &ops);
    attr.set_post_ops(ops);
    return dnnl::convolution_forward::primitive_desc(desc, attr, CpuEngine());
  };
  // A residual sum rides the output reorder (dst = reorder(conv) + residual), which saves
  // reordering the residual into the primitive's layout first; the activation comes after both,
  // so it cannot be a post-op of the convolution then.
  bool sum_in_reorder = false;
  if (epi.sum) {
    auto pd = make_pd(false, false);
    if (pd.dst_desc() != cp->user_dst) {
      cp->pd = pd;
      sum_in_reorder = true;
    }
  }
  if (!sum_in_reorder) cp->pd = make_pd(epi.sum, true);
  cp->conv = dnnl::convolution_forward(cp->pd);
  cp->src_reorder = MakeReorder(cp->user_src, cp->pd.src_desc());
  cp->wei_reorder = MakeReorder(cp->user_wei, cp->pd.weights_desc());
  cp->dst_reorder = MakeReorder(cp->pd.dst_desc(), cp->user_dst, sum_in_reorder);
  if (epi.sum && !sum_in_reorder) {
    cp->dst_in_reorder = MakeReorder(cp->user_dst, cp->pd.dst_desc());
  }
  return cp;
}

// Thread-safe cache of convolution primitives. Bounded: a model with dynamic shapes could
// otherwise grow it without limit, so it is simply emptied when full (entries in use stay
// alive through their shared_ptr).
class ConvCache {
 public:
  static ConvCache& Get() {
    static ConvCache* cache = new ConvCache();  // never destroyed: safe at exit
    return *cache;
  }

  // Throws dnnl::error from primitive creation.
  std::shared_ptr<const ConvPrimitive> Lookup(const ConvKey& key) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = map_.find(key);
      if (it != map_.end()) return it->second;
    }
    // Created outside the lock: creation can take milliseconds and other geometries should not
    // wait for it. Two threads racing on one key both build; the first insert wins.
    auto created = CreateConv(std::get<0>(key), std::get<1>(key));
    std::lock_guard<std::mutex> lock(mu_);
    if (map_.size() >= kMaxEntries) map_.clear();
    return map_.emplace(key, std::move(created)).first->second;
  }

 private:
  static constexpr size_t kMaxEntries = 512;
  std::mutex mu_;
  std::map<ConvKey, std::shared_ptr<const ConvPrimitive>> map_;
};

// Scratch for prepared kernels (reordered activations, primitive scratchpads): a process-wide
// pool of 64-byte aligned blocks, one taken per run and given back after it, so concurrent runs
// never share one and a run never allocates once the pool holds a block large enough (prepare
// reserves one and touches its pages, so a cell's first request pays no page faults either).
class ScratchPool {
 public:
  static ScratchPool& Get() {
    static ScratchPool* pool = new ScratchPool();  // never destroyed: safe at exit
    return *pool;
  }
  struct Block {
    char* p = nullptr;
    size_t size = 0;
  };
  // A block of at least `bytes`; throws std::bad_alloc.
  Block Acquire(size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (size_t i = 0; i < free_.size(); ++i) {
        if (free_[i].size >= bytes) {
          Block b = free_[i];
          free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(i));
          return b;
        }
      }
    }
    return Allocate(bytes);
  }
  void Release(Block b) {
    if (b.p == nullptr) return;
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(b);
    // Smallest first, so Acquire takes the tightest fit.
    std::sort(free_.begin(), free_.end(),
              [](const Block& x, const Block& y) { return x.size < y.size; });
  }
  // Makes sure at least one free block holds `bytes` (grows the largest one), pages touched.
  void Reserve(size_t bytes) {
    if (bytes == 0) return;
    Block b = Acquire(bytes);
    Release(b);
  }

 private:
  static Block Allocate(size_t bytes) {
    const size_t size = std::max<size_t>(4096, (bytes + 4095) / 4096 * 4096);
    char* p = static_cast<char*>(std::aligned_alloc(64, size));
    if (p == nullptr) throw std::bad_alloc();
    std::memset(p, 0, size);
    return {p, size};
  }
  std::mutex mu_;
  std::vector<Block> free_;
};

// One run's scratch block, given back on scope exit.
class ScopedScratch {
 public:
  explicit ScopedScratch(size_t bytes) {
    if (bytes > 0) b_ = ScratchPool::Get().Acquire(bytes);
  }
  ~ScopedScratch() { ScratchPool::Get().Release(b_); }
  ScopedScratch(const ScopedScratch&) = delete;
  ScopedScratch& operator=(const ScopedScratch&) = delete;
  char* data() const { return b_.p; }

 private:
  ScratchPool::Block b_;
};

size_t Align64(size_t n) { return (n + 63) / 64 * 64; }

// The calling thread's stream. A run's primitives execute in order on the thread that calls
// them, so one stream per thread serves them all; making one per call allocated each time.
dnnl::stream& ThreadStream() {
  thread_local dnnl::stream stream(CpuEngine());
  return stream;
}

// Memory objects for the plain-layout arguments of one run of a prepared kernel (activations,
// bias, scratchpad), made once and pointed at each run's buffers: creating them per call cost
// a few allocations each, at every one of a small network's ~60 kernels. A kernel keeps a free
// list so concurrent runs each hold their own set. Plain and byte layouts have no padding, so
// re-pointing them never zero-fills anything.
class ArgSets {
 public:
  // The descriptors of the set's memories, in a fixed order the kernel indexes by.
  explicit ArgSets(std::vector<dnnl::memory::desc> mds) : mds_(std::move(mds)) {}
  class Lease {
   public:
    Lease(ArgSets* owner, std::unique_ptr<std::vector<dnnl::memory>> set)
        : owner_(owner), set_(std::move(set)) {}
    ~Lease() { owner_->Give(std::move(set_)); }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    // Memory `i` pointed at `p` (p may be null when the argument is absent).
    dnnl_memory_t At(size_t i, const void* p) const {
      dnnl::memory& m = (*set_)[i];
      m.set_data_handle(const_cast<void*>(p));
      return m.get();
    }

   private:
    ArgSets* owner_;
    std::unique_ptr<std::vector<dnnl::memory>> set_;
  };
  // Throws dnnl::error or std::bad_alloc when a new set must be made and cannot be.
  Lease Take() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!free_.empty()) {
        auto set = std::move(free_.back());
        free_.pop_back();
        return Lease(this, std::move(set));
      }
    }
    auto set = std::make_unique<std::vector<dnnl::memory>>();
    for (const auto& md : mds_) {
      // An absent argument (no bias, no scratchpad) keeps an empty slot.
      if (md.get_size() == 0) {
        set->emplace_back();
      } else {
        set->emplace_back(md, CpuEngine(), nullptr);
      }
    }
    return Lease(this, std::move(set));
  }

 private:
  void Give(std::unique_ptr<std::vector<dnnl::memory>> set) {
    if (!set) return;
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(std::move(set));
  }
  std::vector<dnnl::memory::desc> mds_;
  std::mutex mu_;
  std::vector<std::unique_ptr<std::vector<dnnl::memory>>> free_;
};

// Executes `prim` with `n` arguments on the calling thread's stream and waits for it.
void ExecuteArgs(const dnnl::primitive& prim, const dnnl_exec_arg_t* args, int n) {
  dnnl::error::wrap_c_api(dnnl_primitive_execute(prim.get(), ThreadStream().get(), n, args),
                          "could not execute a primitive");
}

}  // namespace

class PreparedConv2d {
 public:
  Conv2dParams p;
  ConvEpilogue epi;
  bool has_bias = false;
  int threads = 0;
  std::shared_ptr<const ConvPrimitive> cp;
  dnnl::memory weights;  // in the primitive's layout (owned), or a view of the user's weights
  size_t src_bytes = 0, dst_bytes = 0, scratch_bytes = 0;
  bool conv_scratchpad = false;  // the convolution itself takes a scratchpad argument
  // kConv* order: the caller's x and y, the bias, the convolution's scratchpad.
  std::unique_ptr<ArgSets> args;
  // A Winograd convolution's direct twin on the same NHWC buffers, for inputs WinogradSafe
  // refuses (null otherwise).
  PreparedConv2dPtr direct;
};

enum { kConvX = 0, kConvY, kConvBias, kConvScratch };

void PreparedConv2dDeleter::operator()(PreparedConv2d* c) const { delete c; }

Result<PreparedConv2dPtr> PrepareConv2d(const Conv2dParams& p, const float* w, bool has_bias,
                                        const ConvEpilogue& epi, int num_threads) {
  KILN_RETURN_IF_ERROR(ValidateConv(p));
  if (epi.post_op < 0 || epi.post_op > 6) {
    return Status::InvalidArgument("unknown fused post-op code " + std::to_string(epi.post_op));
  }
  const std::string what = ShapeOf(p);
  try {
    ScopedThreads threads(num_threads);
    PreparedConv2dPtr c(new PreparedConv2d());
    c->p = p;
    c->epi = epi;
    c->has_bias = has_bias;
    c->threads = num_threads;
    c->cp = CreateConv(p, has_bias, epi);
    if (c->cp->winograd) {
      Conv2dParams direct = p;
      direct.layout = 3;  // NHWC, the direct kernel
      const int64_t wn = p.K * (p.C / p.group) * p.R * p.S;
      if (!WinogradSafe(w, wn)) {  // weights past the bound: the direct kernel only
        c->p = direct;
        c->cp = CreateConv(direct, has_bias, epi);
      } else {
        KILN_ASSIGN_OR_RETURN(c->direct, PrepareConv2d(direct, w, has_bias, epi, num_threads));
      }
    }
    const ConvPrimitive& cp = *c->cp;
    const dnnl::engine& eng = CpuEngine();
    dnnl::memory user_w(cp.user_wei, eng, const_cast<float*>(w));
    if (cp.wei_reorder) {
      c->weights = dnnl::memory(cp.pd.weights_desc(), eng);
      dnnl::stream stream(eng);
      Execute(cp.wei_reorder->prim, cp.wei_reorder->scratchpad, stream,
              {{DNNL_ARG_FROM, user_w}, {DNNL_ARG_TO, c->weights}});
      stream.wait();
    } else {
      c->weights = user_w;
    }
    if (cp.src_reorder) c->src_bytes = Align64(cp.pd.src_desc().get_size());
    if (cp.dst_reorder) c->dst_bytes = Align64(cp.pd.dst_desc().get_size());
    size_t sp = cp.pd.scratchpad_desc().get_size();
    c->conv_scratchpad = sp > 0;
    for (const auto* r : {&cp.src_reorder, &cp.dst_reorder, &cp.dst_in_reorder}) {
      if (*r) sp = std::max(sp, (*r)->scratchpad.get_size());
    }
    c->scratch_bytes = Align64(sp);
    ScratchPool::Get().Reserve(c->src_bytes + c->dst_bytes + c->scratch_bytes);
    c->args = std::make_unique<ArgSets>(std::vector<dnnl::memory::desc>{
        cp.user_src, cp.user_dst, has_bias ? cp.bias : dnnl::memory::desc(),
        cp.pd.scratchpad_desc()});
    c->args->Take();  // one set made now: a first run allocates no more than the next
    return c;
  } catch (...) {
    return ErrorFromException(what);
  }
}

Status RunConv2d(const PreparedConv2d& c, const float* x, const float* bias, float* y) {
  if (c.has_bias && bias == nullptr) {
    return Status::InvalidArgument(ShapeOf(c.p) + ": bias expected");
  }
  if (c.direct && !WinogradSafe(x, c.p.N * c.p.C * c.p.H * c.p.W)) {
    return RunConv2d(*c.direct, x, bias, y);
  }
  try {
    ScopedThreads threads(c.threads);
    const ConvPrimitive& cp = *c.cp;
    ScopedScratch scratch(c.src_bytes + c.dst_bytes + c.scratch_bytes);
    char* base = scratch.data();
    char* sp_ptr = base + c.src_bytes + c.dst_bytes;
    const ArgSets::Lease set = c.args->Take();
    dnnl::stream& stream = ThreadStream();
    if (!cp.src_reorder && !cp.dst_reorder && !cp.dst_in_reorder) {
      // The compiler's NHWC convolutions: the primitive runs on the caller's buffers as they are.
      dnnl_exec_arg_t args[5] = {{DNNL_ARG_SRC, set.At(kConvX, x)},
                                 {DNNL_ARG_WEIGHTS, c.weights.get()},
                                 {DNNL_ARG_DST, set.At(kConvY, y)}};
      int n = 3;
      if (c.has_bias) args[n++] = {DNNL_ARG_BIAS, set.At(kConvBias, bias)};
      if (c.conv_scratchpad) args[n++] = {DNNL_ARG_SCRATCHPAD, set.At(kConvScratch, sp_ptr)};
      ExecuteArgs(cp.conv, args, n);
    } else {
      const dnnl::engine& eng = CpuEngine();
      auto run = [&](const dnnl::primitive& prim, const dnnl::memory::desc& sp_md,
                     std::unordered_map<int, dnnl::memory> args) {
        if (sp_md.get_size() > 0) {
          args.emplace(DNNL_ARG_SCRATCHPAD, dnnl::memory(sp_md, eng, sp_ptr));
        }
        prim.execute(stream, args);
      };
      dnnl::memory src(cp.user_src, eng, const_cast<float*>(x));
      dnnl::memory dst(cp.user_dst, eng, y);
      if (cp.src_reorder) {
        dnnl::memory blocked(cp.pd.src_desc(), eng, base);
        run(cp.src_reorder->prim, cp.src_reorder->scratchpad,
            {{DNNL_ARG_FROM, src}, {DNNL_ARG_TO, blocked}});
        src = blocked;
      }
      dnnl::memory conv_dst =
          cp.dst_reorder ? dnnl::memory(cp.pd.dst_desc(), eng, base + c.src_bytes) : dst;
      if (cp.dst_in_reorder) {
        run(cp.dst_in_reorder->prim, cp.dst_in_reorder->scratchpad,
            {{DNNL_ARG_FROM, dst}, {DNNL_ARG_TO, conv_dst}});
      }
      std::unordered_map<int, dnnl::memory> args{
          {DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, c.weights}, {DNNL_ARG_DST, conv_dst}};
      if (c.has_bias) {
        args.emplace(DNNL_ARG_BIAS, dnnl::memory(cp.bias, eng, const_cast<float*>(bias)));
      }
      run(cp.conv, cp.pd.scratchpad_desc(), std::move(args));
      if (cp.dst_reorder) {
        run(cp.dst_reorder->prim, cp.dst_reorder->scratchpad,
            {{DNNL_ARG_FROM, conv_dst}, {DNNL_ARG_TO, dst}});
      }
    }
    stream.wait();
  } catch (...) {
    return ErrorFromException(ShapeOf(c.p));
  }
  if (c.cp->activation_in_primitive) return Status::OK();
  return ApplyPostOp(c.epi.post_op, y, c.p.N * c.p.K * c.p.OutD() * c.p.OutH() * c.p.OutW(),
                     c.threads);
}

// ---- prepared matmul ------------------------------------------------------------------------

class PreparedMatmul {
 public:
  MatmulParams p;
  int threads = 0;
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul prim;
  dnnl::memory::desc a_md, w_md, c_md, bias_md;
  dnnl::memory weights;  // bound W in the primitive's layout (empty for a run-time W)
  bool bound = false;
  bool activation_in_primitive = false;  // else RunMatmul applies it (ApplyPostOp) afterwards
  size_t scratch_bytes = 0;
  // kMatmul* order: A, a run-time W, C, the bias, the scratchpad.
  std::unique_ptr<ArgSets> args;
};

enum { kMatmulA = 0, kMatmulW, kMatmulC, kMatmulBias, kMatmulScratch };

void PreparedMatmulDeleter::operator()(PreparedMatmul* m) const { delete m; }

namespace {

std::string ShapeOf(const MatmulParams& p) {
  auto s = [](int64_t v) { return std::to_string(v); };
  return "Matmul(batch=" + s(p.batch) + ", M=" + s(p.M) + ", N=" + s(p.N) + ", K=" + s(p.K) +
         (p.trans_a ? ", trans_a" : "") + (p.trans_w ? ", trans_w" : "") + ")";
}

// A [rows, cols] matrix per batch, row-major, or its transpose stored ([cols, rows] in memory).
// Without a batch (batched = false) the descriptor is 2-D: oneDNN 2.6's brgemm matmul runs a
// [1, M, K] x [1, K, N] product at half the speed of the same [M, K] x [K, N] one (measured:
// 88 vs 185 GFLOP/s at 128x768x3072 on one AVX-512 core).
dnnl::memory::desc MatrixDesc(bool batched, int64_t batch, int64_t rows, int64_t cols,
                              bool transposed) {
  using dt = dnnl::memory::data_type;
  if (!batched) {
    return dnnl::memory::desc(
        {rows, cols}, dt::f32,
        transposed ? dnnl::memory::dims{1, rows} : dnnl::memory::dims{cols, 1});
  }
  const dnnl::memory::dims strides = transposed ? dnnl::memory::dims{rows * cols, 1, rows}
                                                : dnnl::memory::dims{rows * cols, cols, 1};
  return dnnl::memory::desc({batch, rows, cols}, dt::f32, strides);
}

}  // namespace

Result<PreparedMatmulPtr> PrepareMatmul(const MatmulParams& p, const float* w, int num_threads) {
  const std::string what = ShapeOf(p);
  struct Field {
    const char* name;
    int64_t value;
  };
  for (const Field& f : {Field{"M", p.M}, Field{"N", p.N}, Field{"K", p.K}, Field{"batch", p.batch},
                         Field{"w_batch", p.w_batch}}) {
    if (f.value < 1) {
      return Status::InvalidArgument(what + ": " + f.name + "=" + std::to_string(f.value) +
                                     " must be >= 1");
    }
  }
  if (p.w_batch != 1 && p.w_batch != p.batch) {
    return Status::InvalidArgument(what + ": w_batch=" + std::to_string(p.w_batch) +
                                   " must be 1 or batch");
  }
  if (p.post_op < 0 || p.post_op > 6) {
    return Status::InvalidArgument(what + ": unknown fused post-op code " +
                                   std::to_string(p.post_op));
  }
  try {
    using dt = dnnl::memory::data_type;
    ScopedThreads threads(num_threads);
    const dnnl::engine& eng = CpuEngine();
    PreparedMatmulPtr m(new PreparedMatmul());
    m->p = p;
    m->threads = num_threads;
    const bool batched = p.batch > 1 || p.w_batch > 1;
    m->a_md = MatrixDesc(batched, p.batch, p.M, p.K, p.trans_a);
    m->c_md = MatrixDesc(batched, p.batch, p.M, p.N, false);
    const dnnl::memory::desc user_w = MatrixDesc(batched, p.w_batch, p.K, p.N, p.trans_w);
    m->bound = w != nullptr;
    // A bound W lets the library pick its layout (blocked panels); a run-time W stays plain.
    const dnnl::memory::desc w_any =
        batched ? dnnl::memory::desc({p.w_batch, p.K, p.N}, dt::f32, dnnl::memory::format_tag::any)
                : dnnl::memory::desc({p.K, p.N}, dt::f32, dnnl::memory::format_tag::any);
    if (p.has_bias) {
      m->bias_md = batched ? dnnl::memory::desc({1, 1, p.N}, dt::f32, {p.N, p.N, 1})
                           : dnnl::memory::desc({1, p.N}, dt::f32, {p.N, 1});
    }
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    // alpha scales the product, never the bias: a bound W is scaled as it is reordered (below);
    // a run-time W takes the library's output scale, which would scale a bias too.
    if (p.alpha != 1.0f && !m->bound) {
      if (p.has_bias) {
        return Status::InvalidArgument(what + ": alpha=" + std::to_string(p.alpha) +
                                       " with a bias needs W bound at prepare");
      }
      attr.set_output_scales(0, {p.alpha});
    }
    // The activation is a library post-op where LibraryActivation allows; else RunMatmul applies
    // it after the product (ApplyPostOp).
    {
      dnnl::post_ops ops;
      m->activation_in_primitive = LibraryActivation(p.post_op, &ops);
      if (m->activation_in_primitive) attr.set_post_ops(ops);
    }
    dnnl::matmul::desc desc =
        p.has_bias ? dnnl::matmul::desc(m->a_md, m->bound ? w_any : user_w, m->bias_md, m->c_md)
                   : dnnl::matmul::desc(m->a_md, m->bound ? w_any : user_w, m->c_md);
    m->pd = dnnl::matmul::primitive_desc(desc, attr, eng);
    m->prim = dnnl::matmul(m->pd);
    m->w_md = m->pd.weights_desc();
    if (m->bound) {
      // Always a copy, even when the layouts agree: the caller's W need not outlive the call.
      m->weights = dnnl::memory(m->w_md, eng);
      dnnl::memory user(user_w, eng, const_cast<float*>(w));
      dnnl::primitive_attr scale;
      if (p.alpha != 1.0f) scale.set_output_scales(0, {p.alpha});
      dnnl::stream stream(eng);
      dnnl::reorder(dnnl::reorder::primitive_desc(eng, user_w, eng, m->w_md, scale))
          .execute(stream, user, m->weights);
      stream.wait();
    }
    m->scratch_bytes = Align64(m->pd.scratchpad_desc().get_size());
    ScratchPool::Get().Reserve(m->scratch_bytes);
    m->args = std::make_unique<ArgSets>(std::vector<dnnl::memory::desc>{
        m->a_md, m->bound ? dnnl::memory::desc() : m->w_md, m->c_md,
        p.has_bias ? m->bias_md : dnnl::memory::desc(), m->pd.scratchpad_desc()});
    m->args->Take();  // one set made now: a first run allocates no more than the next
    return m;
  } catch (...) {
    return ErrorFromException(what);
  }
}

Status RunMatmul(const PreparedMatmul& m, const float* a, const float* w, const float* bias,
                 float* c) {
  try {
    if (!m.bound && w == nullptr) return Status::InvalidArgument(ShapeOf(m.p) + ": W expected");
    if (m.p.has_bias && bias == nullptr) {
      return Status::InvalidArgument(ShapeOf(m.p) + ": bias expected");
    }
    ScopedThreads threads(m.threads);
    ScopedScratch scratch(m.scratch_bytes);
    const ArgSets::Lease set = m.args->Take();
    dnnl_exec_arg_t args[5] = {{DNNL_ARG_SRC, set.At(kMatmulA, a)},
                               {DNNL_ARG_WEIGHTS, m.bound ? m.weights.get() : set.At(kMatmulW, w)},
                               {DNNL_ARG_DST, set.At(kMatmulC, c)}};
    int n = 3;
    if (m.p.has_bias) args[n++] = {DNNL_ARG_BIAS, set.At(kMatmulBias, bias)};
    if (m.scratch_bytes > 0) {
      args[n++] = {DNNL_ARG_SCRATCHPAD, set.At(kMatmulScratch, scratch.data())};
    }
    ExecuteArgs(m.prim, args, n);
    ThreadStream().wait();
  } catch (...) {
    return ErrorFromException(ShapeOf(m.p));
  }
  if (m.activation_in_primitive) return Status::OK();
  return ApplyPostOp(m.p.post_op, c, m.p.batch * m.p.M * m.p.N, m.threads);
}

std::string MatmulImplementation(const PreparedMatmul& m) { return m.pd.impl_info_str(); }

int64_t Conv2dParams::OutH() const {
  if (stride_h <= 0) return 0;
  return (H + pad_t + pad_b - ((R - 1) * dil_h + 1)) / stride_h + 1;
}

int64_t Conv2dParams::OutW() const {
  if (stride_w <= 0) return 0;
  return (W + pad_l + pad_r - ((S - 1) * dil_w + 1)) / stride_w + 1;
}

int64_t Conv2dParams::OutD() const {
  if (!three_d) return 1;
  if (stride_d <= 0) return 0;
  return (D + pad_f + pad_k - ((T - 1) * dil_d + 1)) / stride_d + 1;
}

Status Sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
             const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
             int64_t ldc, int num_threads) {
  auto s = [](int64_t v) { return std::to_string(v); };
  const std::string what = "Sgemm(M=" + s(M) + ", N=" + s(N) + ", K=" + s(K) + ")";
  if (M < 0 || N < 0 || K < 0) {
    return Status::InvalidArgument(what + ": sizes must be non-negative");
  }
  if (M == 0 || N == 0) return Status::OK();
  // Row-major leading dims are at least the stored row length, and at least 1 (BLAS rule).
  // A and B are not read when K == 0, so their leading dims are checked only after that case.
  const int64_t min_ldc = std::max<int64_t>(1, N);
  if (ldc < min_ldc) {
    return Status::InvalidArgument(what + ": ldc=" + s(ldc) + " must be >= " + s(min_ldc));
  }
  if (K == 0) {  // Empty product: C = beta * C, without reading C when beta == 0.
    for (int64_t i = 0; i < M; ++i) {
      for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == 0 ? 0.0f : beta * C[i * ldc + j];
    }
    return Status::OK();
  }
  const int64_t min_lda = trans_a ? M : K;
  const int64_t min_ldb = trans_b ? K : N;
  if (lda < min_lda || ldb < min_ldb) {
    return Status::InvalidArgument(what + ": leading dims lda=" + s(lda) + ", ldb=" + s(ldb) +
                                   " must be >= " + s(min_lda) + ", " + s(min_ldb));
  }
  try {
    ScopedThreads threads(num_threads);
    return FromDnnlStatus(dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha, A,
                                     lda, B, ldb, beta, C, ldc),
                          what);
  } catch (...) {
    return ErrorFromException(what);
  }
}

Status Conv2d(const Conv2dParams& p, const float* x, const float* w, const float* bias, float* y,
              int num_threads) {
  KILN_RETURN_IF_ERROR(ValidateConv(p));
  if (p.layout == 4 && !(WinogradSafe(x, p.N * p.C * p.H * p.W) &&
                         WinogradSafe(w, p.K * (p.C / p.group) * p.R * p.S))) {
    Conv2dParams direct = p;
    direct.layout = 3;  // NHWC, the direct kernel
    return Conv2d(direct, x, w, bias, y, num_threads);
  }
  const std::string what = ShapeOf(p);
  try {
    ScopedThreads threads(num_threads);
    std::shared_ptr<const ConvPrimitive> cp =
        ConvCache::Get().Lookup({p, bias != nullptr, threads.effective()});
    const dnnl::engine& eng = CpuEngine();
    dnnl::stream& stream = ThreadStream();
    dnnl::memory src(cp->user_src, eng, const_cast<float*>(x));
    dnnl::memory wei(cp->user_wei, eng, const_cast<float*>(w));
    dnnl::memory dst(cp->user_dst, eng, y);
    if (cp->src_reorder) {
      dnnl::memory blocked(cp->pd.src_desc(), eng);
      Execute(cp->src_reorder->prim, cp->src_reorder->scratchpad, stream,
              {{DNNL_ARG_FROM, src}, {DNNL_ARG_TO, blocked}});
      src = blocked;
    }
    if (cp->wei_reorder) {
      dnnl::memory blocked(cp->pd.weights_desc(), eng);
      Execute(cp->wei_reorder->prim, cp->wei_reorder->scratchpad, stream,
              {{DNNL_ARG_FROM, wei}, {DNNL_ARG_TO, blocked}});
      wei = blocked;
    }
    dnnl::memory conv_dst = cp->dst_reorder ? dnnl::memory(cp->pd.dst_desc(), eng) : dst;
    std::unordered_map<int, dnnl::memory> args{
        {DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, conv_dst}};
    if (bias != nullptr) {
      args.emplace(DNNL_ARG_BIAS, dnnl::memory(cp->bias, eng, const_cast<float*>(bias)));
    }
    Execute(cp->conv, cp->pd.scratchpad_desc(), stream, std::move(args));
    if (cp->dst_reorder) {
      Execute(cp->dst_reorder->prim, cp->dst_reorder->scratchpad, stream,
              {{DNNL_ARG_FROM, conv_dst}, {DNNL_ARG_TO, dst}});
    }
    stream.wait();
    return Status::OK();
  } catch (...) {
    return ErrorFromException(what);
  }
}

std::string LoadedKernelLibraryVersion() {
  const dnnl_version_t* v = dnnl_version();
  return std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
         std::to_string(v->patch) + "+" + v->hash;
}

namespace {

// y[i] = f(y[i]) over n floats on the calling thread's OpenMP team of `threads` (the kernel
// library's own team, so nothing else spins against it), each thread one contiguous block so
// the loop vectorizes. Small outputs stay on the calling thread: a team costs more than it saves.
// block(y + begin, end - begin) over [0, n) split in contiguous blocks on `threads` threads of the
// calling thread's OpenMP team; small outputs stay on the calling thread.
template <typename Block>
void ForBlocks(float* y, int64_t n, int threads, Block block) {
  constexpr int64_t kMinParallel = 1 << 15;
  if (threads <= 1 || n < kMinParallel) {
    block(y, n);
    return;
  }
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int t = 0; t < threads; ++t) {
    const int64_t begin = n * t / threads, end = n * (t + 1) / threads;
    block(y + begin, end - begin);
  }
}

template <typename F>
void MapInPlace(float* y, int64_t n, int threads, F f) {
  ForBlocks(y, n, threads, [f](float* b, int64_t m) {
  // `omp simd`: without it a ReLU's `v < 0 ? 0 : v` compiles to a branch per element, and the
  // signs of a layer's outputs are coin flips: a third of a ResNet-50's time went to mispredicts.
#pragma omp simd
    for (int64_t i = 0; i < m; ++i) b[i] = f(b[i]);
  });
}

// ReLU over one block, compiled for AVX-512, AVX2 and the baseline and picked by the CPU when the
// library loads (it is built for the baseline ISA, 4 floats per vector): the pass follows every
// convolution of a ResNet and streams its output back from cache. NaN stays NaN, -inf becomes 0,
// as the interpreter's Relu.
__attribute__((target_clones("avx512f", "avx2", "default"))) void ReluBlock(float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = y[i] < 0.0f ? 0.0f : y[i];
}

}  // namespace

Status ApplyPostOp(int post_op, float* y, int64_t n, int num_threads) {
#if DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_OMP
  const int threads =
      num_threads > 0 ? num_threads : (omp_get_max_threads != nullptr ? omp_get_max_threads() : 1);
#else
  const int threads = 1;
  (void)num_threads;
#endif
  switch (post_op) {
    case 0:
      return Status::OK();
    case 1:
      ForBlocks(y, n, threads, ReluBlock);
      return Status::OK();
    case 2:
      MapInPlace(y, n, threads, [](float v) { return 1.0f / (1.0f + std::exp(-v)); });
      return Status::OK();
    case 3:
      MapInPlace(y, n, threads, [](float v) { return v / (1.0f + std::exp(-v)); });
      return Status::OK();
    case 4:
      MapInPlace(y, n, threads, [](float v) { return std::tanh(v); });
      return Status::OK();
    case 5:
      MapInPlace(y, n, threads,
                 [](float v) { return 0.5f * v * (1.0f + std::erf(v * 0.70710678f)); });
      return Status::OK();
    case 6:
      MapInPlace(y, n, threads,
                 [](float v) { return v * std::min(std::max(v + 3.0f, 0.0f), 6.0f) / 6.0f; });
      return Status::OK();
    default:
      return Status::InvalidArgument("unknown fused post-op code " + std::to_string(post_op));
  }
}

Status Conv2dFused(const Conv2dParams& p, const float* x, const float* w, const float* bias,
                   float* y, const ConvEpilogue& epi, int num_threads) {
  const int64_t n = p.N * p.K * p.OutD() * p.OutH() * p.OutW();
  if (!epi.sum) {
    KILN_RETURN_IF_ERROR(Conv2d(p, x, w, bias, y, num_threads));
    return ApplyPostOp(epi.post_op, y, n, num_threads);
  }
  std::unique_ptr<float[]> tmp(
      new (std::nothrow) float[static_cast<size_t>(std::max<int64_t>(n, 1))]);
  if (!tmp) return Status::ResourceExhausted("Conv2d epilogue: cannot allocate a temporary");
  KILN_RETURN_IF_ERROR(Conv2d(p, x, w, bias, tmp.get(), num_threads));
  for (int64_t i = 0; i < n; ++i) y[i] += tmp[i];
  return ApplyPostOp(epi.post_op, y, n, num_threads);
}

}  // namespace kiln
