// The elementwise ops the code generator turns into loop-nest expressions, with the C expression
// each becomes (compile layer). Lowering asks Lookup() whether a node can join a fused loop;
// the emitter prints Format(). One table so the two never disagree.
#pragma once

#include <string>
#include <vector>

#include "src/kiln/base/status.h"
#include "src/kiln/compile/program.h"

namespace kiln {

struct ElementwiseOp {
  const char* op;
  int min_inputs, max_inputs;
  enum class Types { kFloat, kCompare, kWhere, kCast, kBool } types;
};

// The op if it is fusable for this node (op type, input dtypes, opset form), else nullptr.
const ElementwiseOp* LookupElementwise(const Node& node, int64_t opset,
                                       const std::vector<TensorType>& inputs,
                                       const std::vector<TensorType>& outputs);

// Builds the Expr for a node whose operands are already resolved (attributes become params).
Result<Expr> MakeExpr(const Node& node, int64_t opset, std::vector<int> operands,
                      DType out_dtype);

// The C expression of `e` given its operands' C expressions.
std::string FormatExpr(const Expr& e, const std::vector<std::string>& operands);

// The C type for a dtype ("float", "int64_t", "uint8_t" for bool, ...).
const char* CType(DType t);

}  // namespace kiln
