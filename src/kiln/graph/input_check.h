// How a value offered for a graph input fits what the graph declares (graph layer). The one
// check behind both of kiln's input refusals: the interpreter's (`Interpreter::CheckInputs`) and
// the KServe front end's (`worker/kserve.h` CheckInputAgainstGraph), which word the same
// mismatch for their own readers (dtype names vs KServe datatypes).
#pragma once

#include <cstddef>
#include <string>

#include "src/kiln/graph/ir.h"
#include "src/kiln/tensor/tensor.h"

namespace kiln {

struct InputMismatch {
  enum class Kind {
    kNone,     // fits
    kUnknown,  // the graph has no input of that name
    kDType,    // declared dtype differs
    kRank,     // declared rank differs (only when the input declares a shape)
    kDim,      // a declared (known) dim differs; `dim` is its index
  };
  Kind kind = Kind::kNone;
  const ValueInfo* declared = nullptr;  // the graph's input; null for kUnknown
  size_t dim = 0;
  bool ok() const { return kind == Kind::kNone; }
};

// Checks one offered (name, dtype, shape) against the graph's inputs: name, then dtype, then
// rank and known dims when the input declares a shape. A missing input is the caller's to find
// (it knows which inputs it was given).
InputMismatch MatchInput(const Graph& graph, const std::string& name, DType dtype,
                         const Shape& shape);

// The graph's declared input names, comma-separated in order (for "inputs: a, b" in messages).
std::string DeclaredInputNames(const Graph& graph);

}  // namespace kiln
