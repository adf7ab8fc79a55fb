// Program helpers: buffers, aliases, the verifier and the text dump (compile layer).
#include "src/kiln/compile/program.h"

#include <algorithm>
#include <set>
#include <sstream>

#include "src/kiln/ops/plans.h"

namespace kiln {

bool IsRowMajor(const Shape& shape, const std::vector<int>& perm) {
  int last = -1;
  for (int d : perm) {
    if (shape[static_cast<size_t>(d)] == 1) continue;
    if (d < last) return false;
    last = d;
  }
  return true;
}

std::vector<int64_t> LogicalStrides(const Buffer& b) {
  const Shape& s = b.type.shape;
  if (!b.strides.empty()) return b.strides;
  if (b.perm.empty()) return ContiguousStrides(s);
  std::vector<int64_t> strides(s.size(), 0);
  int64_t st = 1;
  for (size_t j = b.perm.size(); j-- > 0;) {
    strides[static_cast<size_t>(b.perm[j])] = st;
    st *= s[static_cast<size_t>(b.perm[j])];
  }
  return strides;
}

bool HasRowMajorStrides(const Buffer& b) {
  const auto st = LogicalStrides(b), dense = ContiguousStrides(b.type.shape);
  for (size_t d = 0; d < st.size(); ++d) {
    if (b.type.shape[d] != 1 && st[d] != dense[d]) return false;
  }
  return true;
}

std::vector<int64_t> OperandStrides(const Buffer& b, const Shape& out) {
  const Shape& in = b.type.shape;
  const std::vector<int64_t> own = LogicalStrides(b);
  std::vector<int64_t> st(out.size(), 0);
  const size_t off = out.size() - in.size();
  for (size_t d = 0; d < in.size(); ++d) st[off + d] = in[d] == 1 ? 0 : own[d];
  return st;
}

int Program::AddBuffer(Buffer b) {
  b.id = static_cast<int>(buffers.size());
  buffers.push_back(std::move(b));
  return buffers.back().id;
}

Result<std::vector<bool>> ReducedDims(const Node& node, int64_t opset, const TensorType& x) {
  OpContext ctx(node, opset, {x}, {nullptr}, {true});
  KILN_ASSIGN_OR_RETURN(ReducePlan plan, PlanReduction(ctx));
  if (plan.noop) return Status::InvalidArgument(node.Describe() + ": reduces nothing");
  return plan.reduced;
}

int Program::Root(int id) const {
  while (buffers[static_cast<size_t>(id)].alias_of >= 0)
    id = buffers[static_cast<size_t>(id)].alias_of;
  return id;
}

int64_t Program::RootOffset(int id) const {
  int64_t off = 0;
  for (; buffers[static_cast<size_t>(id)].alias_of >= 0;
       id = buffers[static_cast<size_t>(id)].alias_of) {
    off += buffers[static_cast<size_t>(id)].view_offset;
  }
  return off;
}

Status Program::Verify() const {
  std::vector<bool> defined(buffers.size(), false);
  auto bad = [&](const std::string& msg) {
    return Status::Internal("program " + entry_name + " is invalid: " + msg);
  };
  for (const Buffer& b : buffers) {
    if (b.kind != Buffer::Kind::kTemp) defined[static_cast<size_t>(b.id)] = true;
    if (b.kind == Buffer::Kind::kWeight && b.value.valid()) {
      return bad("weight buffer '" + b.name + "' holds a value (law 1)");
    }
  }
  auto is_defined = [&](int id) { return defined[static_cast<size_t>(Root(id))]; };
  for (size_t k = 0; k < kernels.size(); ++k) {
    const Kernel& kern = kernels[k];
    for (int in : kern.inputs) {
      if (in == -1 && kern.kind == Kernel::Kind::kReference) continue;  // absent optional input
      if (in < 0 || in >= static_cast<int>(buffers.size())) return bad("bad buffer id");
      if (!is_defined(in)) {
        return bad("kernel " + std::to_string(k) + " (" + kern.label + ") reads '" +
                   buffers[static_cast<size_t>(in)].name + "' before it is written");
      }
    }
    for (int out : kern.outputs) {
      const Buffer& b = buffers[static_cast<size_t>(out)];
      if (b.kind != Buffer::Kind::kTemp || b.alias_of >= 0) {
        return bad("kernel " + std::to_string(k) + " writes non-temp '" + b.name + "'");
      }
      if (defined[static_cast<size_t>(out)]) {
        return bad("'" + b.name + "' is written twice");
      }
      defined[static_cast<size_t>(out)] = true;
    }
    if (kern.kind == Kernel::Kind::kFused && kern.output_exprs.size() != kern.outputs.size()) {
      return bad("fused kernel " + std::to_string(k) + " has mismatched outputs");
    }
  }
  for (const Buffer& b : buffers) {
    if (b.alias_of >= 0) {
      const Buffer& r = buffers[static_cast<size_t>(b.alias_of)];
      bool fits = r.type.dtype == b.type.dtype;
      if (b.strides.empty() && b.view_offset == 0) {
        fits = fits && NumElements(r.type.shape) == NumElements(b.type.shape);
      } else if (NumElements(b.type.shape) > 0) {  // a strided view stays inside its root
        const Buffer& root = buffers[static_cast<size_t>(Root(b.id))];
        const int64_t first = RootOffset(b.id);
        int64_t last = first;
        for (size_t d = 0; d < b.type.shape.size() && d < b.strides.size(); ++d) {
          last += (b.type.shape[d] - 1) * b.strides[d];
        }
        fits = fits && b.view_offset >= 0 && first >= 0 && last < NumElements(root.type.shape) &&
               b.strides.size() == b.type.shape.size();
      }
      if (!fits) return bad("alias '" + b.name + "' does not match '" + r.name + "'");
    }
    if (!b.perm.empty()) {
      std::vector<int> sorted = b.perm;
      std::sort(sorted.begin(), sorted.end());
      for (size_t d = 0; d < sorted.size(); ++d) {
        if (sorted[d] != static_cast<int>(d) || sorted.size() != b.type.shape.size()) {
          return bad("'" + b.name + "' has a perm that is no permutation of its dims");
        }
      }
      const bool fixed = b.kind != Buffer::Kind::kTemp || b.output_slot >= 0;
      if (fixed && !IsRowMajor(b.type.shape, b.perm)) {
        return bad("'" + b.name + "' is an input, weight, constant or output but not row-major");
      }
    }
  }
  for (int out : outputs) {
    if (!is_defined(out))
      return bad("output '" + buffers[static_cast<size_t>(out)].name + "' is never written");
  }
  return Status::OK();
}

std::string Program::Dump() const {
  std::ostringstream os;
  auto perm = [&](const Buffer& b) {
    std::string s;
    if (!b.perm.empty()) {
      s = "{";
      for (size_t i = 0; i < b.perm.size(); ++i) s += (i ? "," : "") + std::to_string(b.perm[i]);
      s += "}";
    }
    if (!b.strides.empty() && !HasRowMajorStrides(b)) {
      s += "<";
      for (size_t i = 0; i < b.strides.size(); ++i) {
        s += (i ? "," : "") + std::to_string(b.strides[i]);
      }
      s += ">";
    }
    if (b.view_offset != 0) s += "+" + std::to_string(b.view_offset);
    return s;
  };
  auto name = [&](int id) {
    const Buffer& b = buffers[static_cast<size_t>(id)];
    std::string s = "%" + std::to_string(id);
    if (b.kind == Buffer::Kind::kWeight) s = "w" + std::to_string(b.index);
    if (b.kind == Buffer::Kind::kConst) s = "c" + std::to_string(b.index);
    if (b.kind == Buffer::Kind::kInput) s = "in" + std::to_string(b.index);
    return s;
  };
  os << "program " << entry_name << " (workspace " << workspace_bytes << " bytes)\n";
  for (const Buffer& b : buffers) {
    if (b.alias_of >= 0) {
      os << "  " << name(b.id) << " = view " << name(b.alias_of) << " as " << b.type.ToString()
         << perm(b) << "\n";
    }
  }
  for (const Kernel& k : kernels) {
    os << "  ";
    for (size_t i = 0; i < k.outputs.size(); ++i) {
      const Buffer& b = buffers[static_cast<size_t>(k.outputs[i])];
      os << (i ? ", " : "") << name(b.id) << ":" << b.type.ToString() << perm(b);
      if (b.output_slot >= 0) os << "@out" << b.output_slot;
      if (b.dynamic) os << "(dynamic)";
      if (b.offset >= 0) os << "@" << b.offset;
    }
    os << " = " << k.label << "(";
    for (size_t i = 0; i < k.inputs.size(); ++i) {
      os << (i ? ", " : "") << name(k.inputs[i]) << (i == 1 && k.trans_w ? "^T" : "");
    }
    os << ")\n";
  }
  os << "  return";
  for (int o : outputs) os << " " << name(o);
  os << "\n";
  return os.str();
}

}  // namespace kiln
