// The elementwise ops the code generator turns into loop-nest expressions, with the C expression
// each becomes (compile layer). Which ops fuse, for which arity and dtypes, and their attribute
// defaults come from the op library's own definitions (ops/elementwise.h); this file adds only
// how each is printed. Lowering asks LookupElementwise() whether a node can join a fused loop;
// the emitter prints FormatExpr().
#pragma once

#include <string>
#include <vector>

#include "src/kiln/base/status.h"
#include "src/kiln/compile/program.h"
#include "src/kiln/ops/elementwise.h"

namespace kiln {

// The op's fusion row if it is fusable for this node (op type, opset form, arity, dtypes), else
// nullptr.
const FusableElementwise* LookupElementwise(const Node& node, int64_t opset,
                                            const std::vector<TensorType>& inputs,
                                            const std::vector<TensorType>& outputs);

// Builds the Expr for a node whose operands are already resolved (the fusion row's attributes
// become params, absent ones their defaults).
Result<Expr> MakeExpr(const Node& node, int64_t opset, std::vector<int> operands, DType out_dtype);

// The C expression of `e` given its operands' C expressions.
std::string FormatExpr(const Expr& e, const std::vector<std::string>& operands);

// The C type for a dtype ("float", "int64_t", "uint8_t" for bool, ...).
const char* CType(DType t);

}  // namespace kiln
