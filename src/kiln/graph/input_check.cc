// The input check shared by the interpreter and the KServe front end (see input_check.h).
#include "src/kiln/graph/input_check.h"

namespace kiln {

InputMismatch MatchInput(const Graph& graph, const std::string& name, DType dtype,
                         const Shape& shape) {
  InputMismatch m;
  m.declared = graph.FindInput(name);
  if (m.declared == nullptr) {
    m.kind = InputMismatch::Kind::kUnknown;
    return m;
  }
  const ValueInfo& v = *m.declared;
  if (dtype != v.dtype) {
    m.kind = InputMismatch::Kind::kDType;
    return m;
  }
  if (!v.has_shape) return m;
  if (shape.size() != v.dims.size()) {
    m.kind = InputMismatch::Kind::kRank;
    return m;
  }
  for (size_t d = 0; d < v.dims.size(); ++d) {
    if (v.dims[d].known() && v.dims[d].value != shape[d]) {
      m.kind = InputMismatch::Kind::kDim;
      m.dim = d;
      return m;
    }
  }
  return m;
}

std::string DeclaredInputNames(const Graph& graph) {
  std::string out;
  for (const ValueInfo& v : graph.inputs) out += (out.empty() ? "" : ", ") + v.name;
  return out;
}

}  // namespace kiln
