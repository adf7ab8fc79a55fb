// Attention fusion (compile layer): MatMul -> (scale, mask) -> Softmax -> MatMul becomes one
// kernel that runs in tiles with an online softmax, so the score matrix is never materialized.
// See passes.h for the contract.
#include <algorithm>
#include <climits>
#include <map>

#include "src/kiln/compile/passes.h"

namespace kiln {

namespace {

struct Readers {
  std::map<int, std::vector<size_t>> of;  // buffer -> kernels reading it directly
  std::map<int, int> views;               // buffer -> how many aliases view it
};

Readers Collect(const Program& p) {
  Readers r;
  for (size_t k = 0; k < p.kernels.size(); ++k) {
    for (int in : p.kernels[k].inputs) {
      if (in >= 0) r.of[in].push_back(k);
    }
  }
  for (const Buffer& b : p.buffers) {
    if (b.alias_of >= 0) ++r.views[b.alias_of];
  }
  return r;
}

// `id` is a temp read by exactly one kernel, directly, and is nothing else's.
bool PrivateTo(const Program& p, const Readers& r, int id, size_t reader) {
  const Buffer& b = p.buffers[static_cast<size_t>(id)];
  if (b.output_slot >= 0 || r.views.count(id)) return false;
  auto it = r.of.find(id);
  return it != r.of.end() && it->second.size() == 1 && it->second[0] == reader;
}

bool FuseOne(Program& p) {
  const Readers r = Collect(p);
  std::map<int, size_t> producer;
  for (size_t k = 0; k < p.kernels.size(); ++k) {
    for (int o : p.kernels[k].outputs) producer[o] = k;
  }
  for (size_t si = 0; si < p.kernels.size(); ++si) {
    const Kernel& sm = p.kernels[si];
    if (sm.kind != Kernel::Kind::kSoftmax || sm.outputs.size() != 1) continue;
    const Shape& ss = p.buffers[static_cast<size_t>(sm.inputs[0])].type.shape;
    const int64_t rank = static_cast<int64_t>(ss.size());
    int64_t axis = sm.node.GetInt("axis", sm.opset >= 13 ? -1 : 1);
    if (axis < 0) axis += rank;
    if (rank < 3 || axis != rank - 1) continue;
    // Scores: a MatMul of two activations (no library bias), read only by this softmax.
    auto pit = producer.find(sm.inputs[0]);
    if (pit == producer.end()) continue;
    const size_t qi = pit->second;
    const Kernel& qk = p.kernels[qi];
    if (qk.kind != Kernel::Kind::kMatMul || qk.bias >= 0 || qk.inputs.size() < 2 ||
        !PrivateTo(p, r, sm.inputs[0], si)) {
      continue;
    }
    // Probabilities: read only by a MatMul as its left operand, which has no epilogue.
    const int probs = sm.outputs[0];
    auto rit = r.of.find(probs);
    if (rit == r.of.end() || rit->second.size() != 1 || !PrivateTo(p, r, probs, rit->second[0])) {
      continue;
    }
    const size_t vi = rit->second[0];
    const Kernel& pv = p.kernels[vi];
    if (pv.kind != Kernel::Kind::kMatMul || pv.inputs.size() != 2 || pv.inputs[0] != probs ||
        pv.inputs[1] == probs || !pv.epilogue.empty() || pv.bias >= 0) {
      continue;
    }
    // Shapes: Q [B.., Sq, D], K' [B.., D, Sk], V [B.., Sk, Dv], the same batch dims everywhere.
    const auto shape = [&](int id) { return p.buffers[static_cast<size_t>(id)].type.shape; };
    const Shape q = shape(qk.inputs[0]), k = shape(qk.inputs[1]), v = shape(pv.inputs[1]);
    const Shape o = shape(pv.outputs[0]);
    if (q.size() != ss.size() || k.size() != ss.size() || v.size() != ss.size() ||
        o.size() != ss.size()) {
      continue;
    }
    const Shape batch(q.begin(), q.end() - 2);
    if (Shape(k.begin(), k.end() - 2) != batch || Shape(v.begin(), v.end() - 2) != batch ||
        k[k.size() - 2] != q.back() || v[v.size() - 2] != k.back()) {
      continue;
    }
    bool ok = true;
    for (int id : {qk.inputs[0], qk.inputs[1], pv.inputs[1]}) {
      ok = ok && p.buffers[static_cast<size_t>(id)].type.dtype == DType::kFloat32;
    }
    // The score epilogue's other operands (a scale, a mask) broadcast to the scores; it never
    // reads Q or K' themselves.
    for (const Expr& e : qk.epilogue) {
      for (int op : e.operands) ok = ok && (op == INT32_MIN || op >= -1 || op <= -4);
    }
    for (size_t j = 2; j < qk.inputs.size(); ++j) {
      const Buffer& e = p.buffers[static_cast<size_t>(qk.inputs[j])];
      auto b = BroadcastShapes(e.type.shape, ss);
      ok = ok && b.ok() && *b == ss && e.type.dtype == DType::kFloat32;
    }
    if (!ok) continue;
    Kernel a;
    a.kind = Kernel::Kind::kAttention;
    a.label = "Attention[" + qk.label + "+" + sm.label + "+" + pv.label + "]";
    a.node = sm.node;  // the softmax (axis, opset): what the kernel normalizes
    a.opset = sm.opset;
    a.inputs = {qk.inputs[0], qk.inputs[1], pv.inputs[1]};
    // Epilogue operands -(j+2) name qk.inputs[j]; the kernel's inputs[j'] for j >= 2 follow V.
    a.epilogue = qk.epilogue;
    a.epilogue_out = qk.epilogue_out;
    for (Expr& e : a.epilogue) {
      for (int& op : e.operands) {
        if (op == INT32_MIN || op >= -1) continue;
        const size_t j = static_cast<size_t>(-op - 2);
        auto pos = std::find(a.inputs.begin() + 3, a.inputs.end(), qk.inputs[j]);
        if (pos == a.inputs.end()) {
          a.inputs.push_back(qk.inputs[j]);
          pos = a.inputs.end() - 1;
        }
        op = -static_cast<int>(pos - a.inputs.begin()) - 2;
      }
    }
    a.outputs = {pv.outputs[0]};
    // The fused kernel runs where the second MatMul ran: its inputs are all ready by then.
    p.kernels[vi] = std::move(a);
    const size_t first = std::max(qi, si), second = std::min(qi, si);
    p.kernels.erase(p.kernels.begin() + static_cast<std::ptrdiff_t>(first));
    p.kernels.erase(p.kernels.begin() + static_cast<std::ptrdiff_t>(second));
    return true;
  }
  return false;
}

}  // namespace

Status FuseAttention(Program& program) {
  while (FuseOne(program)) {
  }
  return Status::OK();
}

}  // namespace kiln
