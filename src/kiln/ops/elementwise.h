// The elementwise family's fusion table (ops layer): which of its ops a compiler may fuse into a
// loop nest, for which arity and dtypes, and the float attributes (with their defaults) that
// parametrize each one's scalar function.
//
// ops/elementwise.cc states this in the same rows that register the ops' kernels, with the
// defaults its kernels use, so the eager and the compiled forms of an op read one definition;
// compile/elementwise_table.cc builds its lookup from FusableElementwiseOps() and prints each
// op's C expression by its op type. Making an op fusable is one edit to its row there (plus its C
// expression in the code generator).
#pragma once

#include <array>
#include <climits>
#include <cstdint>
#include <vector>

namespace kiln {

struct ElementwiseFusion {
  // What the fused form accepts: float32 in and out (kFloat), float32 compared to bool
  // (kCompare), a bool condition selecting between two values of one castable dtype (kWhere),
  // between castable dtypes (kCast), bool logic (kBool). kNone: the op never fuses.
  enum class Types { kNone, kFloat, kCompare, kWhere, kCast, kBool };
  struct Param {
    const char* attr = nullptr;
    float dflt = 0.0f;
  };
  Types types = Types::kNone;
  int min_inputs = 0, max_inputs = 0;
  // The scalar function's parameters in order: attribute name and the default when absent.
  std::array<Param, 2> params{};
  int num_params = 0;
};

struct FusableElementwise {
  const char* op_type;  // also how the code generator names the scalar function
  int64_t since_version = 1;
  int64_t until_version = INT64_MAX;  // inclusive: an opset form (Clip's bounds became inputs)
  ElementwiseFusion fusion;
};

// Every fusable (op type, opset form) of the default domain; built once, in registration order.
const std::vector<FusableElementwise>& FusableElementwiseOps();

}  // namespace kiln
