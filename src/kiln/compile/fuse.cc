// Fusion passes over the Program: elementwise chains into one loop nest, and activation/residual
// epilogues into convolutions (compile layer). See passes.h for the contracts.
#include <algorithm>
#include <map>
#include <set>

#include "src/kiln/compile/passes.h"
#include "src/kiln/runtime/cell_abi.h"

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
      // Views of P's outputs are read through their root: covered by Readers.
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

}  // namespace

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
  std::vector<int> temps;
  for (const Buffer& b : p.buffers) {
    const size_t i = static_cast<size_t>(b.id);
    if (b.kind == Buffer::Kind::kTemp && b.alias_of < 0 && b.output_slot < 0 && def[i] >= 0) {
      temps.push_back(b.id);
    }
  }
  // S2: largest first, each at the lowest 64-aligned offset that overlaps no placed buffer
  // whose lifetime intersects its own. Ties broken by id for determinism.
  std::sort(temps.begin(), temps.end(), [&](int a, int b) {
    const int64_t sa = p.buffers[static_cast<size_t>(a)].bytes();
    const int64_t sb = p.buffers[static_cast<size_t>(b)].bytes();
    return sa != sb ? sa > sb : a < b;
  });
  struct Placed {
    int64_t begin, end, def, last;
  };
  std::vector<Placed> placed;
  int64_t total = 0;
  for (int id : temps) {
    Buffer& b = p.buffers[static_cast<size_t>(id)];
    const int64_t size = std::max<int64_t>(64, (b.bytes() + 63) / 64 * 64);
    const int64_t d = def[static_cast<size_t>(id)], l = last[static_cast<size_t>(id)];
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
    b.offset = offset;
    placed.push_back({offset, offset + size, d, l});
    total = std::max(total, offset + size);
  }
  p.workspace_bytes = total;
  return p.Verify();
}

}  // namespace kiln
