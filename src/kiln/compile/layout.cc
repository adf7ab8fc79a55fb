// Layout planning (compile layer): which tensors live channels-last, which transposes are only
// a different view of the same bytes, and where a copy into another layout is unavoidable. See
// passes.h for the contract.
//
// The kernel library's convolutions run fastest on NHWC (channels-last) tensors, and a chain of
// convolutions, elementwise loops, GroupNorms, pools, concats and upsamplings can all run on
// them as they are; converting around every convolution (what a row-major program does) costs
// two full passes over each activation. So the plan:
//   1. Every Transpose becomes a view with a perm (no kernel); its readers decide whether they
//      can read it as it lies.
//   2. The rank-4 float tensors linked to a convolution through kernels that accept either
//      layout are planned NHWC, when the kernel writing them can write NHWC.
//   3. Every view's perm is derived from its root's; a reshape that cannot be expressed over a
//      permuted root gets a row-major copy of the root to view instead.
//   4. Every operand a kernel cannot read in its planned layout gets a converted copy, made
//      right before its first such reader (once per tensor and layout).
// Graph inputs, weights and the caller's output buffers stay row-major.
#include <algorithm>
#include <climits>
#include <map>
#include <optional>
#include <set>

#include "src/kiln/compile/passes.h"
#include "src/kiln/runtime/cell_abi.h"

namespace kiln {

namespace {

const std::vector<int> kNhwc = {0, 2, 3, 1};

std::vector<int> Identity(size_t rank) {
  std::vector<int> p(rank);
  for (size_t i = 0; i < rank; ++i) p[i] = static_cast<int>(i);
  return p;
}

std::vector<int> PermOf(const Buffer& b) {
  return b.perm.empty() ? Identity(b.type.shape.size()) : b.perm;
}

// Same bytes per element: equal logical strides over the dims that are not 1.
bool SameStrides(const Buffer& b, const std::vector<int>& perm) {
  Buffer other = b;
  other.perm = perm;
  const auto x = LogicalStrides(b), y = LogicalStrides(other);
  for (size_t d = 0; d < x.size(); ++d) {
    if (b.type.shape[d] != 1 && x[d] != y[d]) return false;
  }
  return true;
}

bool IsPlain(const Buffer& b) { return IsRowMajor(b.type.shape, b.perm); }
bool IsNhwc(const Buffer& b) { return b.type.shape.size() == 4 && SameStrides(b, kNhwc); }

// The view of a Transpose with `t` (out dim i = in dim t[i]) over a root laid out as `in_perm`.
std::vector<int> TransposedPerm(const std::vector<int>& in_perm, const std::vector<int64_t>& t) {
  std::vector<int> inv(t.size());
  for (size_t i = 0; i < t.size(); ++i) inv[static_cast<size_t>(t[i])] = static_cast<int>(i);
  std::vector<int> out;
  for (int d : in_perm) out.push_back(inv[static_cast<size_t>(d)]);
  return out;
}

// The perm under which `out_shape` views the bytes of `in_shape` laid out as `in_perm`, when a
// reshape (row-major element order) can be one: every output dim must gather atoms of the input
// that lie consecutively, in order, in memory. nullopt otherwise.
std::optional<std::vector<int>> ReshapedPerm(const Shape& in_shape, const std::vector<int>& in_perm,
                                             const Shape& out_shape) {
  // Atom boundaries: the suffix products of both shapes (dims of 1 add none).
  auto suffixes = [](const Shape& s) {
    std::vector<int64_t> out;
    int64_t p = 1;
    for (size_t d = s.size(); d-- > 0;) {
      p *= s[d];
      out.push_back(p);
    }
    return out;
  };
  std::set<int64_t> bounds = {1};
  for (int64_t v : suffixes(in_shape)) bounds.insert(v);
  for (int64_t v : suffixes(out_shape)) bounds.insert(v);
  const std::vector<int64_t> b(bounds.begin(), bounds.end());
  for (size_t i = 1; i < b.size(); ++i) {
    if (b[i - 1] == 0 || b[i] % b[i - 1] != 0) return std::nullopt;
  }
  // Atom index range [lo, hi) of each dim (atoms numbered from the innermost, 0).
  auto ranges = [&](const Shape& s) {
    std::vector<std::pair<size_t, size_t>> r(s.size());
    int64_t p = 1;
    for (size_t d = s.size(); d-- > 0;) {
      const size_t lo = static_cast<size_t>(std::find(b.begin(), b.end(), p) - b.begin());
      p *= s[d];
      const size_t hi = static_cast<size_t>(std::find(b.begin(), b.end(), p) - b.begin());
      r[d] = {lo, hi};
    }
    return r;
  };
  const auto in_r = ranges(in_shape), out_r = ranges(out_shape);
  // Memory order of the atoms, outermost first.
  std::vector<size_t> seq;
  for (int d : in_perm) {
    for (size_t a = in_r[static_cast<size_t>(d)].second;
         a-- > in_r[static_cast<size_t>(d)].first;) {
      seq.push_back(a);
    }
  }
  std::vector<size_t> pos(b.size(), 0);
  for (size_t i = 0; i < seq.size(); ++i) pos[seq[i]] = i;
  std::vector<std::pair<size_t, int>> order;  // (memory position of the outermost atom, dim)
  std::vector<int> ones;
  for (size_t e = 0; e < out_shape.size(); ++e) {
    const auto [lo, hi] = out_r[e];
    if (lo == hi) {
      ones.push_back(static_cast<int>(e));
      continue;
    }
    for (size_t a = hi - 1; a > lo; --a) {
      if (pos[a - 1] != pos[a] + 1) return std::nullopt;  // not consecutive, in order
    }
    order.emplace_back(pos[hi - 1], static_cast<int>(e));
  }
  std::sort(order.begin(), order.end());
  std::vector<int> perm = ones;
  for (const auto& [p, e] : order) perm.push_back(e);
  return perm;
}

bool Rank4Float(const Buffer& b) {
  return b.type.dtype == DType::kFloat32 && b.type.shape.size() == 4;
}

// Kernels that write either layout.
bool WritesAnyLayout(const Kernel& k) {
  switch (k.kind) {
    case Kernel::Kind::kFused:
    case Kernel::Kind::kConv:
    case Kernel::Kind::kConcat:
    case Kernel::Kind::kResize:
    case Kernel::Kind::kPool:
      return true;
    case Kernel::Kind::kNorm:
      return k.groups > 0;
    default:
      return false;
  }
}

// Indices of k.inputs an epilogue reads (a generated loop reads them in any layout).
std::set<size_t> EpilogueInputs(const Kernel& k) {
  std::set<size_t> out;
  for (const Expr& e : k.epilogue) {
    for (int o : e.operands) {
      if (o != INT32_MIN && o <= -2) out.insert(static_cast<size_t>(-o - 2));
    }
  }
  return out;
}

class Planner {
 public:
  explicit Planner(Program& p) : p_(p) {}

  Status Run() {
    TransposesToViews();
    ConvOutputsToTemps();
    PlanNhwc();
    KILN_RETURN_IF_ERROR(DeriveViews());
    ConvertOperands();
    for (Kernel& k : p_.kernels) {
      if (k.kind != Kernel::Kind::kConv || !IsNhwc(Buf(k.outputs[0]))) continue;
      k.conv_layout = KILN_CONV_LAYOUT_NHWC;
      const size_t close = k.label.find(']');
      if (k.label.rfind("Conv[", 0) == 0 && close != std::string::npos) {
        k.label = "Conv[nhwc" + k.label.substr(close);
      }
    }
    return p_.Verify();
  }

 private:
  Buffer& Buf(int id) { return p_.buffers[static_cast<size_t>(id)]; }

  // 1. A Transpose is a view; what reads it decides later whether it needs the bytes moved.
  void TransposesToViews() {
    std::vector<Kernel> kept;
    for (Kernel& k : p_.kernels) {
      if (k.kind == Kernel::Kind::kTranspose && Buf(k.outputs[0]).output_slot < 0) {
        std::vector<int64_t> t = k.node.GetInts("perm", {});
        if (t.empty()) {
          for (int64_t d = static_cast<int64_t>(Buf(k.inputs[0]).type.shape.size()) - 1; d >= 0;
               --d) {
            t.push_back(d);
          }
        }
        Buf(k.outputs[0]).alias_of = k.inputs[0];
        transposed_[k.outputs[0]] = t;
        continue;
      }
      kept.push_back(std::move(k));
    }
    p_.kernels = std::move(kept);
  }

  // A convolution that writes a graph output (always row-major) from a tensor that may be
  // planned NHWC writes a temp instead, copied out after it: converting the output is cheaper
  // than converting the input (the last convolution of a network narrows to few channels).
  void ConvOutputsToTemps() {
    for (size_t k = 0; k < p_.kernels.size(); ++k) {
      if (p_.kernels[k].kind != Kernel::Kind::kConv) continue;
      const int out = p_.kernels[k].outputs[0];
      if (Buf(out).output_slot < 0 || !Rank4Float(Buf(out))) continue;
      Buffer t;
      t.name = Buf(out).name + ":conv";
      t.type = Buf(out).type;
      const int tid = p_.AddBuffer(std::move(t));
      p_.kernels[k].outputs[0] = tid;
      Kernel copy = CopyKernel(tid, out, "ToRowMajor");
      p_.kernels.insert(p_.kernels.begin() + static_cast<std::ptrdiff_t>(k + 1), std::move(copy));
      ++k;
    }
  }

  static Kernel CopyKernel(int from, int to, const char* label) {
    Kernel k;
    k.kind = Kernel::Kind::kFused;
    k.label = label;
    k.inputs = {from};
    Expr e;
    e.op = "Identity";
    e.operands = {-1};
    k.exprs = {e};
    k.output_exprs = {0};
    k.outputs = {to};
    return k;
  }

  // 2. Channels-last for everything linked to a convolution by kernels that take either layout.
  void PlanNhwc() {
    std::map<int, const Kernel*> producer;
    for (const Kernel& k : p_.kernels) {
      for (int o : k.outputs) producer[o] = &k;
    }
    auto assignable = [&](int id) {
      const Buffer& b = Buf(id);
      auto it = producer.find(id);
      return b.kind == Buffer::Kind::kTemp && b.alias_of < 0 && b.output_slot < 0 &&
             Rank4Float(b) && it != producer.end() && WritesAnyLayout(*it->second);
    };
    std::set<int> want;
    std::vector<std::vector<int>> links;
    for (const Kernel& k : p_.kernels) {
      std::vector<int> link;
      auto add = [&](int id) {
        if (id >= 0 && assignable(id)) link.push_back(id);
      };
      if (!WritesAnyLayout(k) || !Rank4Float(Buf(k.outputs[0]))) continue;
      const Shape& out = Buf(k.outputs[0]).type.shape;
      add(k.outputs[0]);
      switch (k.kind) {
        case Kernel::Kind::kConv:
          add(k.inputs[0]);
          if (k.conv_sum) add(k.inputs.back());
          if (assignable(k.outputs[0])) want.insert(k.outputs[0]);
          if (assignable(k.inputs[0])) want.insert(k.inputs[0]);
          break;
        case Kernel::Kind::kNorm:
        case Kernel::Kind::kResize:
        case Kernel::Kind::kPool:
          add(k.inputs[0]);
          break;
        case Kernel::Kind::kConcat:
          for (int in : k.inputs) add(in);
          break;
        default:
          break;
      }
      // Same-shape operands of a generated loop (a fused kernel, an epilogue) are read fastest
      // in the output's layout.
      const std::set<size_t> epi = EpilogueInputs(k);
      for (size_t j = 0; j < k.inputs.size(); ++j) {
        const bool loop_operand = k.kind == Kernel::Kind::kFused || epi.count(j);
        if (loop_operand && k.inputs[j] >= 0 && Buf(k.inputs[j]).type.shape == out) {
          add(k.inputs[j]);
        }
      }
      links.push_back(std::move(link));
    }
    for (bool changed = true; changed;) {
      changed = false;
      for (const auto& link : links) {
        const bool any =
            std::any_of(link.begin(), link.end(), [&](int id) { return want.count(id); });
        if (!any) continue;
        for (int id : link) changed = want.insert(id).second || changed;
      }
    }
    for (int id : want) Buf(id).perm = kNhwc;
  }

  // 3. Every view's perm, from its parent's (buffers are numbered parents first, and a copy a
  // view is redirected to is numbered after it, which the loop reaches before the view's own
  // views).
  Status DeriveViews() {
    // Views nothing reads (left behind by rewrites) need no layout.
    std::set<int> read;
    for (const Kernel& k : p_.kernels) {
      for (int in : k.inputs) {
        for (int b = in; b >= 0; b = Buf(b).alias_of) read.insert(b);
      }
    }
    for (int o : p_.outputs) read.insert(o);
    const size_t n = p_.buffers.size();
    for (size_t i = 0; i < n; ++i) {
      Buffer& v = p_.buffers[i];
      if (v.alias_of < 0) continue;
      if (!read.count(v.id)) {
        v.perm.clear();
        continue;
      }
      const Buffer& parent = Buf(v.alias_of);
      auto t = transposed_.find(v.id);
      if (t != transposed_.end()) {
        v.perm = TransposedPerm(PermOf(parent), t->second);
      } else if (IsPlain(parent)) {
        v.perm.clear();
      } else if (auto perm = ReshapedPerm(parent.type.shape, PermOf(parent), v.type.shape)) {
        v.perm = *perm;
      } else {
        // Not expressible over the parent's layout: view a row-major copy of it.
        const int copy = Converted(v.alias_of, {});
        p_.buffers[i].alias_of = copy;
        p_.buffers[i].perm.clear();
      }
      if (IsRowMajor(p_.buffers[i].type.shape, p_.buffers[i].perm)) p_.buffers[i].perm.clear();
    }
    return Status::OK();
  }

  // 4. Operands a kernel cannot read as they lie get a converted copy.
  void ConvertOperands() {
    for (size_t k = 0; k < p_.kernels.size(); ++k) {
      const std::set<size_t> epi = EpilogueInputs(p_.kernels[k]);
      for (size_t j = 0; j < p_.kernels[k].inputs.size(); ++j) {
        const Kernel& kern = p_.kernels[k];
        const int in = kern.inputs[j];
        if (in < 0 || epi.count(j)) continue;
        const std::optional<std::vector<int>> need = Required(kern, j);
        if (!need) continue;
        const Buffer& b = Buf(in);
        const bool ok = need->empty() ? IsPlain(b) : SameStrides(b, *need);
        if (ok) continue;
        const int copy = Converted(in, *need);
        k += inserted_;  // the copy (if new) went in before this kernel
        inserted_ = 0;
        p_.kernels[k].inputs[j] = copy;
      }
    }
  }

  // The layout input j of k must have ({} = row-major), or nullopt when any layout does.
  std::optional<std::vector<int>> Required(const Kernel& k, size_t j) {
    const Buffer& out = Buf(k.outputs[0]);
    switch (k.kind) {
      case Kernel::Kind::kFused:
      case Kernel::Kind::kPool:
        return std::nullopt;
      case Kernel::Kind::kConv:
        if (j == 0 || (k.conv_sum && j + 1 == k.inputs.size())) {
          return IsNhwc(out) ? kNhwc : std::vector<int>{};
        }
        return std::vector<int>{};
      case Kernel::Kind::kNorm:
        if (j == 0 && k.groups > 0 && IsNhwc(Buf(k.inputs[0]))) return std::nullopt;
        return std::vector<int>{};
      case Kernel::Kind::kConcat:
      case Kernel::Kind::kResize:
        return IsNhwc(out) ? kNhwc : std::vector<int>{};
      default:
        return std::vector<int>{};
    }
  }

  // A copy of buffer `id` in layout `perm` ({} = row-major), made by a kernel inserted right
  // after the one that writes `id`'s bytes (first, for an input), so every later reader may
  // share it. Sets inserted_ when it inserts a kernel.
  int Converted(int id, const std::vector<int>& perm) {
    const auto key = std::make_pair(id, perm);
    auto it = copies_.find(key);
    if (it != copies_.end()) return it->second;
    const int root = p_.Root(id);
    size_t before = 0;
    for (size_t k = 0; k < p_.kernels.size(); ++k) {
      const auto& outs = p_.kernels[k].outputs;
      if (std::find(outs.begin(), outs.end(), root) != outs.end()) before = k + 1;
    }
    Buffer c;
    c.name = Buf(id).name + (perm.empty() ? ":rowmajor" : ":nhwc");
    c.type = Buf(id).type;
    c.kind = Buffer::Kind::kTemp;
    c.perm = perm;
    const int cid = p_.AddBuffer(std::move(c));
    Kernel k = CopyKernel(id, cid, perm.empty() ? "ToRowMajor" : "ToNhwc");
    k.exprs[0].dtype = Buf(id).type.dtype;
    p_.kernels.insert(p_.kernels.begin() + static_cast<std::ptrdiff_t>(before), std::move(k));
    inserted_ = 1;
    copies_[key] = cid;
    return cid;
  }

  Program& p_;
  std::map<int, std::vector<int64_t>> transposed_;  // view id -> Transpose perm
  std::map<std::pair<int, std::vector<int>>, int> copies_;
  size_t inserted_ = 0;
};

}  // namespace

Status PlanLayout(Program& program) { return Planner(program).Run(); }

}  // namespace kiln
