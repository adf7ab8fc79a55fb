// Graph-level compiler passes: specialize to a shape class, fold structural values, remove dead
// nodes (compile layer). See passes.h for each contract.
#include <set>

#include "src/kiln/compile/passes.h"

namespace kiln {

Status SpecializeToClass(Graph& graph, const ShapeClass& shape_class) {
  for (const auto& [name, shape] : shape_class) {
    if (!graph.FindInput(name)) {
      std::string inputs;
      for (const ValueInfo& v : graph.inputs) inputs += (inputs.empty() ? "" : ", ") + v.name;
      return Status::InvalidArgument("shape class names '" + name +
                                     "', which is not a graph input (inputs: " + inputs + ")");
    }
  }
  for (ValueInfo& v : graph.inputs) {
    auto it = shape_class.find(v.name);
    if (it == shape_class.end()) {
      return Status::InvalidArgument("shape class gives no shape for graph input '" + v.name +
                                     "' " + v.ShapeString());
    }
    const Shape& s = it->second;
    if (v.has_shape) {
      if (v.dims.size() != s.size()) {
        return Status::InvalidArgument("shape class gives '" + v.name + "' shape " +
                                       ShapeToString(s) + ", the graph declares rank " +
                                       std::to_string(v.dims.size()) + " " + v.ShapeString());
      }
      for (size_t i = 0; i < s.size(); ++i) {
        if (v.dims[i].known() && v.dims[i].value != s[i]) {
          return Status::InvalidArgument("shape class gives '" + v.name + "' shape " +
                                         ShapeToString(s) + ", the graph declares " +
                                         v.ShapeString() + " (dim " + std::to_string(i) + ")");
        }
      }
    }
    v.has_shape = true;
    v.dims.clear();
    for (int64_t d : s) v.dims.push_back(Dim{d, ""});
  }
  return Status::OK();
}

Status FoldStructuralConstants(Graph& graph) {
  KILN_ASSIGN_OR_RETURN(InferredGraph inferred, InferShapes(graph, {}));
  KILN_ASSIGN_OR_RETURN(Graph folded, FoldStructural(graph, inferred));
  graph = std::move(folded);
  return Status::OK();
}

Status EliminateDeadNodes(Graph& graph) {
  // S1: mark live values backwards from the graph outputs.
  std::set<std::string> live;
  for (const ValueInfo& v : graph.outputs) live.insert(v.name);
  std::vector<bool> keep(graph.nodes.size(), false);
  for (size_t i = graph.nodes.size(); i-- > 0;) {
    const Node& n = graph.nodes[i];
    bool used = false;
    for (const std::string& o : n.outputs) used = used || (!o.empty() && live.count(o));
    if (!used) continue;
    keep[i] = true;
    for (const std::string& in : n.inputs) {
      if (!in.empty()) live.insert(in);
    }
  }
  // S2: drop dead nodes, then structural constants nothing reads (weights always stay).
  std::vector<Node> nodes;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    if (keep[i]) nodes.push_back(std::move(graph.nodes[i]));
  }
  graph.nodes = std::move(nodes);
  for (auto it = graph.initializers.begin(); it != graph.initializers.end();) {
    if (!graph.IsWeight(it->first) && !live.count(it->first)) {
      graph.structural_floats.erase(it->first);
      it = graph.initializers.erase(it);
    } else {
      ++it;
    }
  }
  return Status::OK();
}

}  // namespace kiln
