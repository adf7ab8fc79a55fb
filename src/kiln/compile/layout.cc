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
#include <cstdlib>
#include <map>
#include <optional>
#include <set>

#include "src/kiln/abi/cell_abi.h"
#include "src/kiln/compile/passes.h"
#include "src/kiln/ops/plans.h"

namespace kiln {

namespace {

const std::vector<int> kNhwc = {0, 2, 3, 1};

// Same bytes per element: equal logical strides over the dims that are not 1.
bool SameStrides(const Buffer& b, const std::vector<int>& perm) {
  Buffer other;
  other.type = b.type;
  other.perm = perm;
  const auto x = LogicalStrides(b), y = LogicalStrides(other);
  for (size_t d = 0; d < x.size(); ++d) {
    if (b.type.shape[d] != 1 && x[d] != y[d]) return false;
  }
  return true;
}

bool IsPlain(const Buffer& b) { return HasRowMajorStrides(b); }
bool IsNhwc(const Buffer& b) { return b.type.shape.size() == 4 && SameStrides(b, kNhwc); }

// The strides under which `out_shape` views the elements of `in_shape` laid out with
// `in_strides` in row-major element order (what a reshape means), when a view can express it:
// every output dim must gather input atoms whose strides chain (stride(a+1) = stride(a) *
// size(a)). nullopt otherwise.
std::optional<std::vector<int64_t>> ReshapedStrides(const Shape& in_shape,
                                                    const std::vector<int64_t>& in_strides,
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
  // Atom a (numbered from the innermost, 0) has size b[a+1] / b[a]; its stride comes from the
  // input dim that holds it.
  std::vector<int64_t> atom_stride(b.size(), 0);
  int64_t p = 1;
  for (size_t d = in_shape.size(); d-- > 0;) {
    const size_t lo = static_cast<size_t>(std::find(b.begin(), b.end(), p) - b.begin());
    p *= in_shape[d];
    const size_t hi = static_cast<size_t>(std::find(b.begin(), b.end(), p) - b.begin());
    int64_t st = in_strides[d];
    for (size_t a = lo; a < hi; ++a) {
      atom_stride[a] = st;
      st *= b[a + 1] / b[a];
    }
  }
  std::vector<int64_t> out(out_shape.size(), 0);
  p = 1;
  for (size_t e = out_shape.size(); e-- > 0;) {
    const size_t lo = static_cast<size_t>(std::find(b.begin(), b.end(), p) - b.begin());
    p *= out_shape[e];
    const size_t hi = static_cast<size_t>(std::find(b.begin(), b.end(), p) - b.begin());
    if (lo == hi) continue;  // a dim of 1
    for (size_t a = lo + 1; a < hi; ++a) {
      if (atom_stride[a] != atom_stride[a - 1] * (b[a] / b[a - 1])) return std::nullopt;
    }
    out[e] = atom_stride[lo];
  }
  return out;
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
    case Kernel::Kind::kAttention:
      return true;
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
    SplitsToViews();
    ConvOutputsToTemps();
    PlanNhwc();
    PlanAttentionOutputs();
    KILN_RETURN_IF_ERROR(DeriveViews());
    ConvertOperands();
    for (Kernel& k : p_.kernels) {
      if (k.kind != Kernel::Kind::kConv || !IsNhwc(Buf(k.outputs[0]))) continue;
      const bool wino = Winograd(k);
      k.conv_layout = wino ? KILN_CONV_LAYOUT_NHWC_WINOGRAD : KILN_CONV_LAYOUT_NHWC;
      const size_t close = k.label.find(']');
      if (k.label.rfind("Conv[", 0) == 0 && close != std::string::npos) {
        k.label = std::string(wino ? "Conv[nhwc,winograd" : "Conv[nhwc") + k.label.substr(close);
      }
    }
    return p_.Verify();
  }

 private:
  Buffer& Buf(int id) { return p_.buffers[static_cast<size_t>(id)]; }

  // Dense 3x3 stride-1 convolutions with enough channels run Winograd F(2x2, 3x3) in the
  // library when they also have enough pixels. Measured on one AVX-512 core with the two
  // reorders it needs around it (NHWC <-> the library's blocked layout): 1.2-2x the direct
  // kernel from 64 channels and 14x14 pixels per image up (N=8: ~1.8-2x), a loss at 7x7 for one
  // image. The pixel count is tested by the cell (kWinogradMinPixels, program.h), not here.
  bool Winograd(const Kernel& k) {
    const Shape& x = Buf(k.inputs[0]).type.shape;
    const Shape& w = Buf(k.inputs[1]).type.shape;
    return w.size() == 4 && w[2] == 3 && w[3] == 3 && k.node.GetInt("group", 1) == 1 &&
           k.node.GetInts("strides", {1, 1}) == std::vector<int64_t>{1, 1} &&
           k.node.GetInts("dilations", {1, 1}) == std::vector<int64_t>{1, 1} && x[1] % 16 == 0 &&
           w[0] % 16 == 0 && x[1] >= 64 && w[0] >= 64;
  }

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

  // A Split along an axis is views of its input (offsets along that axis), and so are a Gather
  // of one structural index (a slice, the axis dropped for a scalar index) and a Slice with
  // structural bounds and unit steps (a box); readers that need dense rows get them copied, the
  // attention kernel reads the pieces as they lie.
  void SplitsToViews() {
    std::vector<Kernel> kept;
    for (Kernel& k : p_.kernels) {
      std::vector<int64_t> sizes;
      int64_t axis = 0, index = 0;
      bool drop = false;
      if (SplitSizes(k, &sizes, &axis)) {
        int64_t at = 0;
        for (size_t i = 0; i < k.outputs.size(); ++i) {
          Buf(k.outputs[i]).alias_of = k.inputs[0];
          sliced_[k.outputs[i]] = {axis, at, false};
          at += sizes[i];
        }
      } else if (GatherSlice(k, &axis, &index, &drop)) {
        Buf(k.outputs[0]).alias_of = k.inputs[0];
        sliced_[k.outputs[0]] = {axis, index, drop};
      } else if (std::vector<int64_t> starts; SliceStarts(k, &starts)) {
        Buf(k.outputs[0]).alias_of = k.inputs[0];
        boxed_[k.outputs[0]] = std::move(starts);
      } else {
        kept.push_back(std::move(k));
      }
    }
    p_.kernels = std::move(kept);
  }

  // A Gather of one in-range structural index whose output is an intermediate.
  bool GatherSlice(const Kernel& k, int64_t* axis, int64_t* index, bool* drop) {
    if (k.kind != Kernel::Kind::kGather || k.outputs.size() != 1 || k.inputs.size() != 2) {
      return false;
    }
    const Buffer& x = Buf(k.inputs[0]);
    const Buffer& idx = Buf(p_.Root(k.inputs[1]));
    const Buffer& y = Buf(k.outputs[0]);
    if (y.output_slot >= 0 || idx.kind != Buffer::Kind::kConst || !idx.value.valid() ||
        idx.value.numel() != 1 || y.type.dtype != x.type.dtype) {
      return false;
    }
    const int64_t rank = static_cast<int64_t>(x.type.shape.size());
    *axis = k.node.GetInt("axis", 0);
    if (*axis < 0) *axis += rank;
    if (*axis < 0 || *axis >= rank) return false;
    const int64_t dim = x.type.shape[static_cast<size_t>(*axis)];
    *index = idx.value.GetAsInt64(0);
    if (*index < 0) *index += dim;
    if (*index < 0 || *index >= dim) return false;
    *drop = idx.type.shape.empty();
    return static_cast<int64_t>(y.type.shape.size()) == (*drop ? rank - 1 : rank);
  }

  // A Slice with structural bounds and unit steps whose output is an intermediate: the box it
  // cuts starts at `starts` (one per dim) and has the output's shape, so it is a view of its input
  // (the input's strides, an offset). The op's own plan (ops/plans.h) reads the bounds. False when
  // it is not such a Slice.
  bool SliceStarts(const Kernel& k, std::vector<int64_t>* starts) {
    if (k.kind != Kernel::Kind::kReference || k.node.op_type != "Slice" || !k.node.domain.empty() ||
        k.inputs.empty() || k.inputs[0] < 0 || k.outputs.size() != 1) {
      return false;
    }
    const Buffer& x = Buf(k.inputs[0]);
    const Buffer& y = Buf(k.outputs[0]);
    if (y.output_slot >= 0 || y.type.dtype != x.type.dtype) return false;
    std::vector<TensorType> types;
    std::vector<const Tensor*> values;
    std::vector<bool> present;
    for (int in : k.inputs) {
      present.push_back(in >= 0);
      types.push_back(in >= 0 ? Buf(in).type : TensorType{});
      const Buffer* root = in >= 0 ? &Buf(p_.Root(in)) : nullptr;
      const bool known = root && root->kind == Buffer::Kind::kConst && root->value.valid();
      values.push_back(known ? &root->value : nullptr);
    }
    OpContext ctx(k.node, k.opset, types, values, present);
    auto plan = PlanSlice(ctx);
    if (!plan.ok() || plan->out != y.type.shape) return false;
    for (int64_t st : plan->step) {
      if (st != 1) return false;
    }
    *starts = plan->start;
    return true;
  }

  // The piece sizes and axis of a Split kernel whose pieces may become views; false otherwise.
  bool SplitSizes(const Kernel& k, std::vector<int64_t>* sizes, int64_t* axis) {
    if (k.kind != Kernel::Kind::kReference || k.node.op_type != "Split" || !k.node.domain.empty() ||
        k.inputs.empty() || k.inputs[0] < 0 || k.outputs.empty()) {
      return false;
    }
    const Buffer& x = Buf(k.inputs[0]);
    const int64_t rank = static_cast<int64_t>(x.type.shape.size());
    *axis = k.node.GetInt("axis", 0);
    if (*axis < 0) *axis += rank;
    if (*axis < 0 || *axis >= rank) return false;
    int64_t total = 0;
    for (int o : k.outputs) {
      const Buffer& b = Buf(o);
      // Every piece must be a plain intermediate: not the caller's output, same dtype and rank.
      if (b.output_slot >= 0 || b.type.dtype != x.type.dtype ||
          b.type.shape.size() != x.type.shape.size()) {
        return false;
      }
      for (int64_t d = 0; d < rank; ++d) {
        if (d != *axis &&
            b.type.shape[static_cast<size_t>(d)] != x.type.shape[static_cast<size_t>(d)]) {
          return false;
        }
      }
      sizes->push_back(b.type.shape[static_cast<size_t>(*axis)]);
      total += sizes->back();
    }
    // The output types come from the op's own shape function, so pieces that tile the axis in
    // order are exactly what the reference kernel would copy out.
    return total == x.type.shape[static_cast<size_t>(*axis)];
  }

  // A convolution that writes a graph output (always row-major) writes a temp instead, copied
  // out right after it, and later kernels read the temp: converting the output is cheaper than
  // converting the input (the last convolution of a network narrows to few channels), and the
  // network goes on in the temp's layout.
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
      // Later readers and views read the temp in whatever layout it gets.
      for (size_t r = k + 1; r < p_.kernels.size(); ++r) {
        for (int& in : p_.kernels[r].inputs) {
          if (in == out) in = tid;
        }
      }
      for (Buffer& b : p_.buffers) {
        if (b.alias_of == out) b.alias_of = tid;
      }
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

  // An attention output read only through one transposed view (heads back beside each other,
  // [B, H, S, D] -> [B, S, H, D], then reshaped to [B, S, H*D]) is written in the view's order,
  // so the view is row-major and nothing is copied.
  void PlanAttentionOutputs() {
    std::map<int, int> views, direct;
    for (const Buffer& b : p_.buffers) {
      if (b.alias_of >= 0) ++views[b.alias_of];
    }
    for (const Kernel& k : p_.kernels) {
      for (int in : k.inputs) {
        if (in >= 0) ++direct[in];
      }
    }
    for (const Kernel& k : p_.kernels) {
      if (k.kind != Kernel::Kind::kAttention) continue;
      const int o = k.outputs[0];
      if (Buf(o).output_slot >= 0 || direct.count(o) || views[o] != 1) continue;
      for (const auto& [view, t] : transposed_) {
        if (Buf(view).alias_of != o) continue;
        Buf(o).perm.assign(t.begin(), t.end());
      }
    }
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
      const Buffer& parent = Buf(v.alias_of);
      const std::vector<int64_t> ps = LogicalStrides(parent);
      auto t = transposed_.find(v.id);
      auto sl = sliced_.find(v.id);
      auto box = boxed_.find(v.id);
      v.perm.clear();
      v.view_offset = 0;
      if (t != transposed_.end()) {
        v.strides.clear();
        for (int64_t d : t->second) v.strides.push_back(ps[static_cast<size_t>(d)]);
      } else if (box != boxed_.end()) {
        v.strides = ps;
        for (size_t d = 0; d < ps.size(); ++d) v.view_offset += box->second[d] * ps[d];
      } else if (sl != sliced_.end()) {
        const size_t axis = static_cast<size_t>(sl->second.axis);
        v.strides = ps;
        v.view_offset = sl->second.start * ps[axis];
        if (sl->second.drop) v.strides.erase(v.strides.begin() + static_cast<std::ptrdiff_t>(axis));
      } else if (auto st = ReshapedStrides(parent.type.shape, ps, v.type.shape)) {
        v.strides = *st;
      } else if (!read.count(v.id)) {
        v.strides = ContiguousStrides(v.type.shape);  // left behind by a rewrite: never read
      } else {
        // Not expressible over the parent's layout: view a row-major copy of it.
        const int copy = Converted(v.alias_of, {});
        p_.buffers[i].alias_of = copy;
        p_.buffers[i].strides = ContiguousStrides(p_.buffers[i].type.shape);
      }
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
        if (ReadTransposedWeight(p_.kernels[k], j)) continue;
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

  // A GEMM's right-hand operand that lies transposed (a [R, C] view whose bytes are a dense
  // row-major [C, R] matrix: a Transpose of a weight, as exports that keep every node write
  // nn.Linear) is read as it lies: the kernel gets a row-major view of those bytes and flips its
  // transposition flag, where a copy would transpose the whole matrix on every run. Returns
  // whether it rewrote input j of k.
  bool ReadTransposedWeight(Kernel& k, size_t j) {
    if (j != 1 || (k.kind != Kernel::Kind::kMatMul && k.kind != Kernel::Kind::kGemm)) return false;
    const Buffer& w = Buf(k.inputs[1]);
    const Shape& s = w.type.shape;
    if (s.size() != 2 || s[0] < 2 || s[1] < 2 || w.type.dtype != DType::kFloat32) return false;
    const std::vector<int64_t> st = LogicalStrides(w);
    if (st[0] != 1 || st[1] != s[0] || p_.RootOffset(w.id) != 0) return false;
    Buffer v;
    v.name = w.name + ":transposed";
    v.type = {w.type.dtype, Shape{s[1], s[0]}};
    v.kind = Buffer::Kind::kTemp;
    v.alias_of = p_.Root(w.id);
    v.strides = {s[0], 1};
    k.inputs[1] = p_.AddBuffer(std::move(v));
    k.trans_w = !k.trans_w;
    return true;
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
      case Kernel::Kind::kAttention: {
        // Q, K' and V are read as matrices by the host's sgemm: one of their two matrix dims
        // must be contiguous.
        const Buffer& b = Buf(k.inputs[j]);
        const auto st = LogicalStrides(b);
        const size_t r = st.size();
        const Shape& sh = b.type.shape;
        if (r >= 2 && (st[r - 1] == 1 || st[r - 2] == 1 || sh[r - 1] == 1 || sh[r - 2] == 1)) {
          return std::nullopt;
        }
        return std::vector<int>{};
      }
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
  struct Slice {
    int64_t axis = 0, start = 0;
    bool drop = false;  // the axis is gone (a Gather of a scalar index)
  };
  std::map<int, Slice> sliced_;                // view id -> where it lies in its parent
  std::map<int, std::vector<int64_t>> boxed_;  // Slice view id -> its start in every dim
  std::map<std::pair<int, std::vector<int>>, int> copies_;
  size_t inserted_ = 0;
};

}  // namespace

Status PlanLayout(Program& program) { return Planner(program).Run(); }

}  // namespace kiln
