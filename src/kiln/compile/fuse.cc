// Fusion passes over the Program: elementwise chains into one loop nest, and activation/residual
// epilogues into convolutions (compile layer). See passes.h for the contracts.
#include <algorithm>
#include <map>
#include <set>

#include "src/kiln/abi/cell_abi.h"
#include "src/kiln/compile/passes.h"

namespace kiln {

namespace {

// Kernel indices reading each buffer (through aliases: a view's readers read its root).
std::map<int, std::vector<size_t>> Readers(const Program& p) {
  std::map<int, std::vector<size_t>> readers;
  for (size_t k = 0; k < p.kernels.size(); ++k) {
    for (int in : p.kernels[k].inputs) {
      if (in >= 0) readers[p.Root(in)].push_back(k);
    }
  }
  return readers;
}

bool IsGraphOutput(const Program& p, int id) {
  return p.buffers[static_cast<size_t>(id)].output_slot >= 0;
}

bool HasAlias(const Program& p, int id) {
  for (const Buffer& b : p.buffers) {
    if (b.alias_of == id) return true;
  }
  return false;
}

const Shape& OutShape(const Program& p, const Kernel& k) {
  return p.buffers[static_cast<size_t>(k.outputs[0])].type.shape;
}

// Merges producer P into consumer K (K keeps its position). P's outputs read only by K become
// expression temporaries; the others stay outputs of the merged kernel.
void Merge(Program& p, size_t pi, size_t ki, const std::map<int, std::vector<size_t>>& readers) {
  Kernel& P = p.kernels[pi];
  Kernel& K = p.kernels[ki];
  Kernel m;
  m.kind = Kernel::Kind::kFused;
  m.label = P.label + "+" + K.label;
  // S1: inputs of P, then P's expressions with operands unchanged.
  m.inputs = P.inputs;
  m.exprs = P.exprs;
  std::map<int, int> p_out_expr;  // P output buffer -> expr index in m
  for (size_t i = 0; i < P.outputs.size(); ++i) p_out_expr[P.outputs[i]] = P.output_exprs[i];
  // S2: K's inputs become either P's expressions or new inputs of m.
  std::vector<int> k_input_ref(K.inputs.size());
  for (size_t i = 0; i < K.inputs.size(); ++i) {
    auto it = p_out_expr.find(K.inputs[i]);
    if (it != p_out_expr.end()) {
      k_input_ref[i] = it->second;
      continue;
    }
    auto pos = std::find(m.inputs.begin(), m.inputs.end(), K.inputs[i]);
    int slot = static_cast<int>(pos - m.inputs.begin());
    if (pos == m.inputs.end()) m.inputs.push_back(K.inputs[i]);
    k_input_ref[i] = -(slot + 1);
  }
  const int base = static_cast<int>(m.exprs.size());
  for (Expr e : K.exprs) {
    for (int& o : e.operands) {
      if (o == INT32_MIN) continue;
      o = o >= 0 ? o + base : k_input_ref[static_cast<size_t>(-o - 1)];
    }
    m.exprs.push_back(e);
  }
  // S3: outputs: K's, then P's that someone besides K still reads.
  for (size_t i = 0; i < K.outputs.size(); ++i) {
    m.outputs.push_back(K.outputs[i]);
    m.output_exprs.push_back(K.output_exprs[i] + base);
  }
  for (size_t i = 0; i < P.outputs.size(); ++i) {
    const int b = P.outputs[i];
    bool other = IsGraphOutput(p, b) || HasAlias(p, b);
    auto it = readers.find(b);
    if (it != readers.end()) {
      for (size_t r : it->second) other = other || (r != ki && r != pi);
    }
    if (other) {
      m.outputs.push_back(b);
      m.output_exprs.push_back(P.output_exprs[i]);
    }
  }
  K = std::move(m);
  p.kernels.erase(p.kernels.begin() + static_cast<std::ptrdiff_t>(pi));
}

// One merge if any is possible; returns whether it merged.
bool FuseOnce(Program& p) {
  const auto readers = Readers(p);
  std::map<int, size_t> producer;
  for (size_t k = 0; k < p.kernels.size(); ++k) {
    for (int o : p.kernels[k].outputs) producer[o] = k;
  }
  for (size_t ki = 0; ki < p.kernels.size(); ++ki) {
    const Kernel& K = p.kernels[ki];
    if (K.kind != Kernel::Kind::kFused) continue;
    for (int in : K.inputs) {
      auto pit = producer.find(in);
      if (pit == producer.end()) continue;
      const size_t pi = pit->second;
      const Kernel& P = p.kernels[pi];
      if (P.kind != Kernel::Kind::kFused || OutShape(p, P) != OutShape(p, K)) continue;
      // Every reader of P's outputs must run at or after K, since the merged kernel runs at K.
      bool ok = true;
      for (int o : P.outputs) {
        auto rit = readers.find(o);
        if (rit == readers.end()) continue;
        for (size_t r : rit->second) ok = ok && r >= ki;
      }
      // Views of P's outputs are read through their root: covered by Readers. K itself must
      // read P's outputs directly: a view of one (an Identity, a Dropout, a Reshape in between)
      // would read bytes the merged loop writes only as it goes.
      for (int kin : K.inputs) {
        if (kin < 0 || p.buffers[static_cast<size_t>(kin)].alias_of < 0) continue;
        const int root = p.Root(kin);
        for (int o : P.outputs) ok = ok && root != o;
      }
      if (!ok) continue;
      Merge(p, pi, ki, readers);
      return true;
    }
  }
  return false;
}

int PostOpFor(const Kernel& k) {
  if (k.kind != Kernel::Kind::kFused || k.exprs.size() != 1) return KILN_POST_NONE;
  const std::string& op = k.exprs[0].op;
  if (op == "Relu") return KILN_POST_RELU;
  if (op == "Sigmoid") return KILN_POST_SIGMOID;
  if (op == "Tanh") return KILN_POST_TANH;
  if (op == "HardSwish") return KILN_POST_HARDSWISH;
  return KILN_POST_NONE;
}

// Tries to fold the single reader of conv `ci`'s output into it.
bool FuseConvOnce(Program& p) {
  const auto readers = Readers(p);
  for (size_t ci = 0; ci < p.kernels.size(); ++ci) {
    Kernel& C = p.kernels[ci];
    if (C.kind != Kernel::Kind::kConv || C.post_op != KILN_POST_NONE) continue;
    const int out = C.outputs[0];
    if (IsGraphOutput(p, out) || HasAlias(p, out)) continue;
    auto rit = readers.find(out);
    if (rit == readers.end() || rit->second.size() != 1) continue;
    const size_t ri = rit->second[0];
    Kernel& R = p.kernels[ri];
    const int r_out = R.outputs.empty() ? -1 : R.outputs[0];
    if (r_out < 0 || R.outputs.size() != 1 ||
        p.buffers[static_cast<size_t>(r_out)].type != p.buffers[static_cast<size_t>(out)].type) {
      continue;
    }
    // Residual add: conv + r with r of the same shape, r defined before the conv runs.
    if (!C.conv_sum && R.kind == Kernel::Kind::kFused && R.exprs.size() == 1 &&
        R.exprs[0].op == "Add" && R.inputs.size() == 2) {
      const int other = R.inputs[0] == out ? R.inputs[1] : R.inputs[0];
      if (R.inputs[0] == R.inputs[1]) continue;
      if (p.buffers[static_cast<size_t>(other)].type != p.buffers[static_cast<size_t>(out)].type) {
        continue;
      }
      // The residual must be available at the conv: produced before it (or not by a kernel).
      bool before = true;
      for (size_t k = ci; k < p.kernels.size(); ++k) {
        for (int o : p.kernels[k].outputs) before = before && p.Root(other) != o;
      }
      if (!before) continue;
      C.inputs.push_back(other);
      C.conv_sum = true;
      C.outputs[0] = r_out;
      C.label += "+Add";
      p.kernels.erase(p.kernels.begin() + static_cast<std::ptrdiff_t>(ri));
      return true;
    }
    const int post = PostOpFor(R);
    if (post != KILN_POST_NONE && R.inputs.size() == 1) {
      C.post_op = post;
      C.outputs[0] = r_out;
      C.label += "+" + R.exprs[0].op;
      p.kernels.erase(p.kernels.begin() + static_cast<std::ptrdiff_t>(ri));
      return true;
    }
  }
  return false;
}

// Tries to fold one fused elementwise reader into a library kernel; returns whether it did.
bool FuseEpilogueOnce(Program& p) {
  const auto readers = Readers(p);
  for (size_t ki = 0; ki < p.kernels.size(); ++ki) {
    Kernel& K = p.kernels[ki];
    const bool library = K.kind == Kernel::Kind::kMatMul || K.kind == Kernel::Kind::kGemm ||
                         (K.kind == Kernel::Kind::kConv && !K.conv_sum) ||
                         K.kind == Kernel::Kind::kNorm;
    if (!library || !K.epilogue.empty() || K.outputs.size() != 1) continue;
    const int out = K.outputs[0];
    if (IsGraphOutput(p, out) || HasAlias(p, out)) continue;
    auto rit = readers.find(out);
    if (rit == readers.end() || rit->second.size() != 1) continue;
    const size_t fi = rit->second[0];
    const Kernel& F = p.kernels[fi];
    if (F.kind != Kernel::Kind::kFused || F.outputs.size() != 1) continue;
    const Buffer& ob = p.buffers[static_cast<size_t>(out)];
    const Buffer& fb = p.buffers[static_cast<size_t>(F.outputs[0])];
    if (fb.type != ob.type) continue;
    // `out` must be read at the output's own index, never through a view. The merged kernel
    // runs at F's position: K's inputs are ready there too, since they were ready before K.
    bool ok = true;
    for (int in : F.inputs) {
      if (in != out && p.Root(in) == out) ok = false;
    }
    if (!ok) continue;
    // S1: map F's input slots to epilogue operands, appending new inputs to K.
    std::vector<int> slot(F.inputs.size());
    for (size_t s = 0; s < F.inputs.size(); ++s) {
      if (F.inputs[s] == out) {
        slot[s] = -1;
        continue;
      }
      K.inputs.push_back(F.inputs[s]);
      slot[s] = -static_cast<int>(K.inputs.size() - 1) - 2;
    }
    // S2: copy F's expressions with operands remapped; F's output becomes K's.
    K.epilogue.clear();
    for (Expr e : F.exprs) {
      for (int& o : e.operands) {
        if (o == INT32_MIN || o >= 0) continue;
        o = slot[static_cast<size_t>(-o - 1)];
      }
      K.epilogue.push_back(e);
    }
    K.epilogue_out = F.output_exprs[0];
    K.outputs[0] = F.outputs[0];
    K.label += "+[" + F.label + "]";
    p.kernels[fi] = std::move(K);
    p.kernels.erase(p.kernels.begin() + static_cast<std::ptrdiff_t>(ki));
    return true;
  }
  return false;
}

}  // namespace

Status ChooseConvLayout(Program& program) {
  for (Kernel& k : program.kernels) {
    if (k.kind != Kernel::Kind::kConv) continue;
    const Shape& w = program.buffers[static_cast<size_t>(k.inputs[1])].type.shape;
    const bool pointwise = w.size() == 4 && w[2] == 1 && w[3] == 1 &&
                           k.node.GetInt("group", 1) == 1 &&
                           k.node.GetInts("strides", {1, 1}) == std::vector<int64_t>{1, 1};
    k.conv_layout = pointwise ? KILN_CONV_LAYOUT_PLAIN : KILN_CONV_LAYOUT_BLOCKED;
    const std::string tag = pointwise ? "[plain]" : "[blocked]";
    if (k.label.rfind("Conv" + tag, 0) != 0) k.label.insert(4, tag);
  }
  return Status::OK();
}

Status FuseLibraryEpilogues(Program& program) {
  while (FuseEpilogueOnce(program)) {
  }
  return Status::OK();
}

Status FuseElementwise(Program& program) {
  while (FuseOnce(program)) {
  }
  return Status::OK();
}

Status FuseConvEpilogues(Program& program) {
  while (FuseConvOnce(program)) {
  }
  return Status::OK();
}

Status PlanMemory(Program& p) {
  // S1: lifetime [def, last use] of every workspace buffer, in kernel indices.
  const size_t n = p.buffers.size();
  std::vector<int64_t> def(n, -1), last(n, -1);
  for (size_t k = 0; k < p.kernels.size(); ++k) {
    for (int o : p.kernels[k].outputs) {
      if (def[static_cast<size_t>(o)] < 0) def[static_cast<size_t>(o)] = static_cast<int64_t>(k);
      last[static_cast<size_t>(o)] = std::max<int64_t>(last[static_cast<size_t>(o)], k);
    }
    for (int in : p.kernels[k].inputs) {
      if (in < 0) continue;
      const size_t r = static_cast<size_t>(p.Root(in));
      last[r] = std::max<int64_t>(last[r], static_cast<int64_t>(k));
    }
  }
  auto is_workspace = [&](int id) {
    const Buffer& b = p.buffers[static_cast<size_t>(id)];
    return b.kind == Buffer::Kind::kTemp && b.alias_of < 0 && b.output_slot < 0 &&
           def[static_cast<size_t>(id)] >= 0;
  };
  // S2: in place. A kernel that reads each element before writing the same element (fused
  // elementwise loops without broadcast on that input, row-wise softmax and norms, a conv whose
  // residual it sums into its output) may write its output over an input whose last use it is.
  std::vector<int> storage(n);  // the buffer whose allocation a buffer uses
  for (size_t i = 0; i < n; ++i) storage[i] = static_cast<int>(i);
  std::vector<bool> donated(n, false);
  for (size_t k = 0; k < p.kernels.size(); ++k) {
    const Kernel& kern = p.kernels[k];
    const bool elementwise = kern.kind == Kernel::Kind::kFused ||
                             kern.kind == Kernel::Kind::kSoftmax ||
                             kern.kind == Kernel::Kind::kNorm;
    const bool conv_sum = kern.kind == Kernel::Kind::kConv && kern.conv_sum;
    if (!elementwise && !conv_sum) continue;
    for (int o : kern.outputs) {
      if (!is_workspace(o)) continue;
      const Buffer& ob = p.buffers[static_cast<size_t>(o)];
      const std::vector<int> candidates =
          conv_sum ? std::vector<int>{kern.inputs.back()} : kern.inputs;
      for (int in : candidates) {
        if (in < 0) continue;
        const int r = p.Root(in);
        const Buffer& rb = p.buffers[static_cast<size_t>(r)];
        if (!is_workspace(r) || donated[static_cast<size_t>(r)] ||
            last[static_cast<size_t>(r)] != static_cast<int64_t>(k) || rb.bytes() != ob.bytes() ||
            rb.type.dtype != ob.type.dtype) {
          continue;
        }
        // Every read of r in this kernel must be at the element being written.
        bool same_index = true;
        for (size_t j = 0; j < kern.inputs.size(); ++j) {
          if (kern.inputs[j] < 0 || p.Root(kern.inputs[j]) != r) continue;
          if (conv_sum && j + 1 != kern.inputs.size()) same_index = false;  // r is also the x/w
          const Buffer& ib = p.buffers[static_cast<size_t>(kern.inputs[j])];
          if (ib.type.shape != ob.type.shape || LogicalStrides(ib) != LogicalStrides(ob) ||
              p.RootOffset(kern.inputs[j]) != 0) {
            same_index = false;
          }
        }
        if (!same_index) continue;
        donated[static_cast<size_t>(r)] = true;
        storage[static_cast<size_t>(o)] = storage[static_cast<size_t>(r)];
        break;
      }
    }
  }
  // Group lifetimes: an allocation lives from its first writer to its last reader.
  std::map<int, std::pair<int64_t, int64_t>> life;
  for (size_t i = 0; i < n; ++i) {
    if (!is_workspace(static_cast<int>(i))) continue;
    auto& l = life.try_emplace(storage[i], def[i], last[i]).first->second;
    l.first = std::min(l.first, def[i]);
    l.second = std::max(l.second, last[i]);
  }
  // S3: largest first, each at the lowest 64-aligned offset that overlaps no placed allocation
  // whose lifetime intersects its own. Ties broken by id for determinism.
  std::vector<int> allocs;
  for (const auto& [id, l] : life) allocs.push_back(id);
  std::sort(allocs.begin(), allocs.end(), [&](int a, int b) {
    const int64_t sa = p.buffers[static_cast<size_t>(a)].bytes();
    const int64_t sb = p.buffers[static_cast<size_t>(b)].bytes();
    return sa != sb ? sa > sb : a < b;
  });
  struct Placed {
    int64_t begin, end, def, last;
  };
  std::vector<Placed> placed;
  std::map<int, int64_t> offset_of;
  int64_t total = 0;
  for (int id : allocs) {
    const Buffer& b = p.buffers[static_cast<size_t>(id)];
    const int64_t size = std::max<int64_t>(64, (b.bytes() + 63) / 64 * 64);
    const auto [d, l] = life.at(id);
    std::vector<std::pair<int64_t, int64_t>> busy;
    for (const Placed& q : placed) {
      if (q.def <= l && d <= q.last) busy.emplace_back(q.begin, q.end);
    }
    std::sort(busy.begin(), busy.end());
    int64_t offset = 0;
    for (const auto& [bb, be] : busy) {
      if (offset + size <= bb) break;
      offset = std::max(offset, be);
    }
    offset_of[id] = offset;
    placed.push_back({offset, offset + size, d, l});
    total = std::max(total, offset + size);
  }
  for (size_t i = 0; i < n; ++i) {
    if (is_workspace(static_cast<int>(i))) p.buffers[i].offset = offset_of.at(storage[i]);
  }
  p.workspace_bytes = total;
  return p.Verify();
}

}  // namespace kiln
