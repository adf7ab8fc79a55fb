// The graph verifier (see verifier.h).
#include "src/kiln/ops/verifier.h"

#include "src/kiln/ops/registry.h"

namespace kiln {

Status VerifyGraph(const Graph& g, const std::set<std::string>& outer_scope) {
  std::set<std::string> defined = outer_scope;
  for (const auto& [name, t] : g.initializers) defined.insert(name);
  for (const ValueInfo& v : g.inputs) {
    if (g.initializers.count(v.name)) {
      return Status::InvalidArgument("graph input '" + v.name +
                                     "' has the same name as an initializer");
    }
    if (!defined.insert(v.name).second) {
      return Status::InvalidArgument("graph input '" + v.name + "' is declared twice");
    }
  }
  const OpRegistry& registry = OpRegistry::Global();
  for (const Node& n : g.nodes) {
    KILN_ASSIGN_OR_RETURN(const OpDef* def, registry.Find(n.domain, n.op_type, g.opset(n.domain)));
    if (def->check) KILN_RETURN_IF_ERROR(def->check(n, g.opset(n.domain)));
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      const std::string& in = n.inputs[i];
      if (!in.empty() && !defined.count(in)) {
        return Status::InvalidArgument(n.Describe() + ": input " + std::to_string(i) + " '" + in +
                                       "' is not produced by any earlier node, graph input or "
                                       "initializer (missing weight?)");
      }
    }
    for (const auto& [name, a] : n.attrs) {
      // Subgraphs see everything defined so far in the enclosing scopes.
      if (a.kind == Attribute::Kind::kGraph) {
        KILN_RETURN_IF_ERROR(
            VerifyGraph(*a.g, defined).WithContext(n.Describe() + " attribute '" + name + "'"));
      } else if (a.kind == Attribute::Kind::kGraphs) {
        for (const auto& sub : a.graphs) {
          KILN_RETURN_IF_ERROR(
              VerifyGraph(*sub, defined).WithContext(n.Describe() + " attribute '" + name + "'"));
        }
      }
    }
    for (const std::string& out : n.outputs) {
      if (out.empty()) continue;
      if (!defined.insert(out).second) {
        return Status::InvalidArgument(n.Describe() + ": output '" + out + "' is already defined");
      }
    }
  }
  for (const ValueInfo& v : g.outputs) {
    if (!defined.count(v.name)) {
      return Status::InvalidArgument("graph output '" + v.name + "' is never produced");
    }
  }
  return Status::OK();
}

}  // namespace kiln
