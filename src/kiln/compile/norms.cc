// Normalization passes over the Program (compile layer): GroupNorm recognized from the form
// exporters write it in. See passes.h for the contract.
#include <map>
#include <vector>

#include "src/kiln/compile/passes.h"

namespace kiln {

namespace {

// How many kernels read each buffer directly, and how many aliases view it.
struct Uses {
  std::map<int, int> readers, views;
};

Uses CountUses(const Program& p) {
  Uses u;
  for (const Kernel& k : p.kernels) {
    for (int in : k.inputs) {
      if (in >= 0) ++u.readers[in];
    }
  }
  for (const Buffer& b : p.buffers) {
    if (b.alias_of >= 0) ++u.views[b.alias_of];
  }
  return u;
}

// The exporters' GroupNorm: x[N,C,H,W] -> Reshape [N,G,C/G*H*W] -> InstanceNormalization (scale
// and bias of G values) -> Reshape [N,C,H,W] (then the per-channel affine, which fusion has
// folded into the loop reading it). Rewritten as one norm kernel reading x and writing the
// [N,C,H,W] view directly, so no reshape pins x to row-major memory.
bool RewriteOne(Program& p, Kernel& k, const Uses& uses) {
  if (k.kind != Kernel::Kind::kNorm || k.groups > 0 || k.node.op_type != "InstanceNormalization" ||
      k.inputs.size() != 3 || k.outputs.size() != 1) {
    return false;
  }
  const Buffer& in = p.buffers[static_cast<size_t>(k.inputs[0])];
  if (in.alias_of < 0) return false;
  const Buffer& x = p.buffers[static_cast<size_t>(in.alias_of)];
  const Shape& xs = x.type.shape;
  const Shape& is = in.type.shape;
  if (xs.size() != 4 || is.size() != 3 || x.type.dtype != DType::kFloat32) return false;
  const int64_t G = is[1];
  if (is[0] != xs[0] || G < 1 || xs[1] % G != 0 || is[2] != xs[1] / G * xs[2] * xs[3]) {
    return false;
  }
  for (int j : {1, 2}) {
    if (NumElements(p.buffers[static_cast<size_t>(k.inputs[static_cast<size_t>(j)])].type.shape) !=
        G) {
      return false;
    }
  }
  // The output must be read only through one [N,C,H,W] view.
  const int y = k.outputs[0];
  const Buffer& yb = p.buffers[static_cast<size_t>(y)];
  if (yb.output_slot >= 0 || uses.readers.count(y) || uses.views.count(y) == 0 ||
      uses.views.at(y) != 1) {
    return false;
  }
  int view = -1;
  for (const Buffer& b : p.buffers) {
    if (b.alias_of == y) view = b.id;
  }
  Buffer& vb = p.buffers[static_cast<size_t>(view)];
  if (vb.type.shape != xs) return false;
  k.inputs[0] = x.id;
  k.groups = G;
  vb.alias_of = -1;  // now written by the norm; the [N,G,R] output is left unused
  k.outputs[0] = view;
  k.label = "GroupNorm";
  return true;
}

}  // namespace

Status FuseGroupNorm(Program& program) {
  for (size_t i = 0; i < program.kernels.size(); ++i) {
    const Uses uses = CountUses(program);
    RewriteOne(program, program.kernels[i], uses);
  }
  return Status::OK();
}

}  // namespace kiln
