// Program passes that shape kernel-library calls (compile layer): what a GEMM's library call
// computes besides the product itself. See passes.h for the contracts.
#include <algorithm>
#include <climits>

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

// Folds epilogue expr 0 = Add(result, inputs[j]) into the call when inputs[j] is a column vector
// and nothing else reads the raw result.
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
  if (!IsColumnVector(p.buffers[static_cast<size_t>(k.inputs[j])].type, OutputColumns(p, k))) {
    return false;
  }
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

}  // namespace

Status FoldGemmBias(Program& program) {
  for (Kernel& k : program.kernels) {
    if (k.kind == Kernel::Kind::kMatMul || k.kind == Kernel::Kind::kGemm) FoldBias(program, k);
  }
  return Status::OK();
}

}  // namespace kiln
