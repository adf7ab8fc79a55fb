// What a Slice or a reduction node does to its input's shape, as the op's own kernels read it
// (ops layer). The eager kernels plan with these, and the compiler asks the same functions whether
// a Slice is a view and which dims a reduction folds, so the two can never read a node
// differently (opset forms, negative and clamped bounds, axes as attribute or input).
#pragma once

#include <cstdint>
#include <vector>

#include "src/kiln/base/status.h"
#include "src/kiln/ops/registry.h"

namespace kiln {

// Slice: per input axis, the first element taken and the step; the output shape.
struct SlicePlan {
  std::vector<int64_t> start, step;
  Shape out;
};
// Needs starts/ends/axes/steps known (attributes before opset 10, else ctx.value). Errors name
// the node and the inconsistent bound.
Result<SlicePlan> PlanSlice(const OpContext& ctx);

// ReduceSum/Mean/Max/Min/Prod/L1/L2/SumSquare/LogSum/LogSumExp: which input dims are reduced and
// the output shape.
struct ReducePlan {
  bool noop = false;          // empty axes with noop_with_empty_axes=1: output = input
  std::vector<bool> reduced;  // per input dim
  Shape kept_shape;           // output shape with reduced dims kept as 1 (its layout)
  Shape out_shape;            // the declared output shape (kept_shape without them unless keepdims)
};
// The opset from which a reduction's `axes` is input 1 rather than an attribute.
int64_t ReduceAxesInputSince(const std::string& op_type);
// Needs the axes input's value from that opset on. Errors name the node and the axes.
Result<ReducePlan> PlanReduction(const OpContext& ctx);

}  // namespace kiln
