// Program passes that shape kernel-library calls (compile layer): what a GEMM's library call
// computes besides the product itself. See passes.h for the contracts.
#include <algorithm>
#include <climits>
#include <set>
#include <vector>

#include "src/kiln/compile/passes.h"

namespace kiln {

namespace {

// Whether `t` is a vector of n values laid along the last axis ([n], [1, n], [1, 1, n], ...).
bool IsColumnVector(const TensorType& t, int64_t n) {
  if (t.dtype != DType::kFloat32 || t.shape.empty() || t.shape.back() != n) return false;
  return NumElements(t.shape) == n;
}

// The N of a MatMul/Gemm kernel's output (its last dim).
int64_t OutputColumns(const Program& p, const Kernel& k) {
  const Shape& s = p.buffers[static_cast<size_t>(k.outputs[0])].type.shape;
  return s.empty() ? 1 : s.back();
}

// What fold-gemm-bias may move into the library call, and why (the rules passes.h states):
// - the operand is bound data, a weight or a structural constant: the same N values for every
//   row of every run by construction. A tensor computed at run time stays in the epilogue even
//   when its shape is a vector ([1, N] at batch 1 looks exactly like a bias);
// - the call has no bias of its own: a Gemm's C is the library's bias (the emitter passes it
//   there), and one call takes one bias, so a Gemm with C keeps its add in the epilogue;
// - the operand is a vector of N values along the output's last axis.
bool FoldableBias(const Program& p, const Kernel& k, size_t j) {
  if (k.kind == Kernel::Kind::kGemm && k.node.HasInput(2) && k.node.GetFloat("beta", 1.0f) != 0) {
    return false;
  }
  const Buffer& b = p.buffers[static_cast<size_t>(k.inputs[j])];
  const Buffer::Kind bound = p.buffers[static_cast<size_t>(p.Root(b.id))].kind;
  if (bound != Buffer::Kind::kWeight && bound != Buffer::Kind::kConst) return false;
  return IsColumnVector(b.type, OutputColumns(p, k));
}

// Folds epilogue expr 0 = Add(result, inputs[j]) into the call when FoldableBias allows it and
// nothing else reads the raw result.
bool FoldBias(const Program& p, Kernel& k) {
  if (k.epilogue.empty() || k.bias >= 0) return false;
  const Expr& e = k.epilogue[0];
  if (e.op != "Add" || e.operands.size() != 2 || e.dtype != DType::kFloat32) return false;
  int other;
  if (e.operands[0] == -1) {
    other = e.operands[1];
  } else if (e.operands[1] == -1) {
    other = e.operands[0];
  } else {
    return false;
  }
  if (other >= -1 || other == INT32_MIN) return false;  // another expr, or the result itself
  const size_t j = static_cast<size_t>(-other - 2);
  if (!FoldableBias(p, k, j)) return false;
  for (size_t x = 1; x < k.epilogue.size(); ++x) {
    for (int o : k.epilogue[x].operands) {
      if (o == -1) return false;
    }
  }
  k.bias = static_cast<int>(j);
  k.label += "+bias";
  if (k.epilogue_out == 0) {
    // The add was the whole epilogue (anything else in it is dead).
    k.epilogue.clear();
    k.epilogue_out = -1;
    return true;
  }
  // The library's result now holds result + bias: expr 0's readers read it instead.
  k.epilogue.erase(k.epilogue.begin());
  for (Expr& x : k.epilogue) {
    for (int& o : x.operands) {
      if (o == INT32_MIN) continue;
      if (o == 0) {
        o = -1;
      } else if (o > 0) {
        --o;
      }
    }
  }
  --k.epilogue_out;
  return true;
}

bool IsScalarInput(const Program& p, const Kernel& k, int operand) {
  if (operand == INT32_MIN || operand > -2) return false;
  const Buffer& b = p.buffers[static_cast<size_t>(k.inputs[static_cast<size_t>(-operand - 2)])];
  return b.type.dtype == DType::kFloat32 && NumElements(b.type.shape) == 1;
}

// x * c3 * (c2 + erf(x / c1)) (or x * c1 inside the erf), in any order of the two products and
// of the operands of the commutative ops; the whole epilogue and nothing else.
void MarkGelu(const Program& p, Kernel& k) {
  const std::vector<Expr>& e = k.epilogue;
  if (e.size() != 5 || k.epilogue_out < 0 || e[static_cast<size_t>(k.epilogue_out)].op != "Mul") {
    return;
  }
  int erf = -1;
  for (size_t i = 0; i < e.size(); ++i) {
    if (e[i].op == "Erf") erf = static_cast<int>(i);
  }
  if (erf < 0 || e[static_cast<size_t>(erf)].operands.size() != 1) return;
  const int di = e[static_cast<size_t>(erf)].operands[0];
  if (di < 0) return;
  const Expr& d = e[static_cast<size_t>(di)];
  if ((d.op != "Div" && d.op != "Mul") || d.operands.size() != 2) return;
  int c1;
  if (d.operands[0] == -1 && IsScalarInput(p, k, d.operands[1])) {
    c1 = d.operands[1];
  } else if (d.op == "Mul" && d.operands[1] == -1 && IsScalarInput(p, k, d.operands[0])) {
    c1 = d.operands[0];
  } else {
    return;
  }
  int add = -1, c2 = 0;
  for (size_t i = 0; i < e.size(); ++i) {
    if (e[i].op != "Add" || e[i].operands.size() != 2) continue;
    const auto& o = e[i].operands;
    if (o[0] == erf && IsScalarInput(p, k, o[1])) {
      add = static_cast<int>(i), c2 = o[1];
    } else if (o[1] == erf && IsScalarInput(p, k, o[0])) {
      add = static_cast<int>(i), c2 = o[0];
    }
  }
  if (add < 0) return;
  // The two products: the output and the one it reads; their leaves must be {x, add, c3}.
  const Expr& m2 = e[static_cast<size_t>(k.epilogue_out)];
  std::vector<int> leaves;
  int m1 = -1;
  for (int o : m2.operands) {
    if (o >= 0 && o != add && e[static_cast<size_t>(o)].op == "Mul") {
      m1 = o;
    } else {
      leaves.push_back(o);
    }
  }
  if (m1 < 0) return;
  for (int o : e[static_cast<size_t>(m1)].operands) leaves.push_back(o);
  if (leaves.size() != 3) return;
  int c3 = 0, seen_x = 0, seen_add = 0;
  for (int o : leaves) {
    if (o == -1) {
      ++seen_x;
    } else if (o == add) {
      ++seen_add;
    } else if (IsScalarInput(p, k, o)) {
      c3 = o;
    }
  }
  if (seen_x != 1 || seen_add != 1 || c3 == 0) return;
  // Every expr is one of the five: Div/Mul, Erf, Add, and the two products.
  const std::set<int> used = {di, erf, add, m1, k.epilogue_out};
  if (used.size() != 5) return;
  k.gelu = {-c1 - 2, -c2 - 2, -c3 - 2};
  k.gelu_div = d.op == "Div";
  k.label += "+gelu?";
}

}  // namespace

Status FoldGemmGelu(Program& program) {
  for (Kernel& k : program.kernels) {
    if ((k.kind == Kernel::Kind::kMatMul || k.kind == Kernel::Kind::kGemm) && k.gelu.empty()) {
      MarkGelu(program, k);
    }
  }
  return Status::OK();
}

Status FoldGemmBias(Program& program) {
  for (Kernel& k : program.kernels) {
    if (k.kind == Kernel::Kind::kMatMul || k.kind == Kernel::Kind::kGemm) FoldBias(program, k);
  }
  return Status::OK();
}

}  // namespace kiln
