// Graph-level compiler passes: specialize to a shape class, fold structural values, decompose
// BatchNormalization, remove dead nodes (compile layer). See passes.h for each contract.
#include <algorithm>
#include <map>
#include <memory>
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

namespace {

// Every name defined anywhere in `g` (inputs, initializers, node outputs, subgraphs).
void CollectNames(const Graph& g, std::set<std::string>& names) {
  for (const ValueInfo& v : g.inputs) names.insert(v.name);
  for (const auto& [name, t] : g.initializers) names.insert(name);
  for (const Node& n : g.nodes) {
    names.insert(n.outputs.begin(), n.outputs.end());
    for (const Graph* sub : Subgraphs(n)) CollectNames(*sub, names);
  }
}

// Renames value references in `g` and its subgraphs by `map` (node inputs and graph outputs).
void RenameUses(Graph& g, const std::map<std::string, std::string>& map) {
  auto apply = [&](std::string& name) {
    auto it = map.find(name);
    if (it != map.end()) name = it->second;
  };
  for (Node& n : g.nodes) {
    for (std::string& in : n.inputs) apply(in);
    for (auto& [attr, a] : n.attrs) {
      if (a.kind == Attribute::Kind::kGraph && a.g) {
        auto copy = std::make_shared<Graph>(*a.g);  // subgraphs may be shared with other graphs
        RenameUses(*copy, map);
        a.g = copy;
      }
      for (auto& sub : a.graphs) {
        auto copy = std::make_shared<Graph>(*sub);
        RenameUses(*copy, map);
        sub = copy;
      }
    }
  }
  for (ValueInfo& v : g.outputs) apply(v.name);
}

// Replaces the first If whose condition is a structural constant by the nodes of the branch it
// takes: branch values get fresh names, the branch's outputs become the If's outputs (through
// an Identity where a branch output is not a value the branch defines). Returns whether one was
// inlined.
Result<bool> InlineOneKnownIf(Graph& graph) {
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const Node& n = graph.nodes[i];
    if (!n.domain.empty() || n.op_type != "If" || n.inputs.empty()) continue;
    auto cond = graph.initializers.find(n.inputs[0]);
    if (cond == graph.initializers.end() || graph.IsWeight(n.inputs[0]) ||
        cond->second.numel() != 1) {
      continue;
    }
    const bool taken = cond->second.GetAsInt64(0) != 0;
    auto attr = n.attrs.find(taken ? "then_branch" : "else_branch");
    if (attr == n.attrs.end() || attr->second.kind != Attribute::Kind::kGraph || !attr->second.g) {
      continue;
    }
    Graph branch = *attr->second.g;
    if (branch.outputs.size() != n.outputs.size()) continue;  // the verifier names this
    std::set<std::string> names;
    CollectNames(graph, names);
    // S1: fresh names for every value the branch defines; a defined branch output takes the
    // If output's name directly.
    std::map<std::string, std::string> rename;
    std::set<std::string> defined_here;
    for (const auto& [name, t] : branch.initializers) defined_here.insert(name);
    for (const Node& bn : branch.nodes) {
      for (const std::string& o : bn.outputs) {
        if (!o.empty()) defined_here.insert(o);
      }
    }
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      const std::string& bo = branch.outputs[k].name;
      if (!n.outputs[k].empty() && defined_here.count(bo) && !branch.initializers.count(bo) &&
          !rename.count(bo)) {
        rename[bo] = n.outputs[k];
      }
    }
    const std::string prefix = (n.outputs.empty() ? std::string("if") : n.outputs[0]) + "/";
    for (const std::string& name : defined_here) {
      if (rename.count(name)) continue;
      std::string fresh = prefix + name;
      for (int k = 1; names.count(fresh); ++k) fresh = prefix + name + "_" + std::to_string(k);
      names.insert(fresh);
      rename[name] = fresh;
    }
    RenameUses(branch, rename);
    std::vector<Node> inlined;
    for (Node bn : branch.nodes) {
      for (std::string& o : bn.outputs) {
        if (!o.empty()) o = rename.at(o);
      }
      inlined.push_back(std::move(bn));
    }
    for (const auto& [name, t] : branch.initializers) {
      graph.initializers[rename.at(name)] = t;
      if (branch.structural_floats.count(name)) {
        graph.structural_floats.insert(rename.at(name));
      }
      if (branch.int32_weights.count(name)) graph.int32_weights.insert(rename.at(name));
    }
    // S2: an If output the branch does not define itself (an outer value, a constant, one value
    // given twice) is copied by an Identity.
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      if (n.outputs[k].empty() || branch.outputs[k].name == n.outputs[k]) continue;
      Node id;
      id.op_type = "Identity";
      id.name = n.name.empty() ? "" : n.name + "/out" + std::to_string(k);
      id.inputs = {branch.outputs[k].name};
      id.outputs = {n.outputs[k]};
      inlined.push_back(std::move(id));
    }
    // S3: the branch nodes take the If's place (they read only values defined before it).
    graph.nodes.erase(graph.nodes.begin() + static_cast<std::ptrdiff_t>(i));
    graph.nodes.insert(graph.nodes.begin() + static_cast<std::ptrdiff_t>(i), inlined.begin(),
                       inlined.end());
    return true;
  }
  return false;
}

}  // namespace

Status FoldStructuralConstants(Graph& graph, const std::set<std::string>& keep) {
  // Fold, then inline an If whose condition folding made known, and fold again: the inlined
  // branch may hold structural chains (and Ifs) of its own. Each round removes one If.
  for (;;) {
    // Tolerant: nodes whose shapes depend on input values are left for the dynamic region.
    KILN_ASSIGN_OR_RETURN(InferredGraph inferred, InferShapes(graph, {}, true));
    KILN_ASSIGN_OR_RETURN(Graph folded, FoldStructural(graph, inferred, &keep));
    graph = std::move(folded);
    KILN_ASSIGN_OR_RETURN(bool inlined, InlineOneKnownIf(graph));
    if (!inlined) return Status::OK();
  }
}

Status DecomposeBatchNorm(Graph& graph) {
  if (graph.opset("") < 7) return Status::OK();  // before 7, Sub/Mul/Add broadcast only by flag
  // Shape inference over the whole graph only when there is something to rewrite.
  if (std::none_of(graph.nodes.begin(), graph.nodes.end(), [](const Node& n) {
        return n.domain.empty() && n.op_type == "BatchNormalization";
      })) {
    return Status::OK();
  }
  KILN_ASSIGN_OR_RETURN(InferredGraph inferred, InferShapes(graph, {}, true));
  auto type_of = [&](const std::string& name) -> const TensorType* {
    auto it = inferred.types.find(name);
    return it == inferred.types.end() ? nullptr : &it->second;
  };
  std::set<std::string> names;
  CollectNames(graph, names);
  auto fresh = [&](const std::string& base) {
    std::string name = base;
    for (int k = 1; names.count(name); ++k) name = base + "_" + std::to_string(k);
    names.insert(name);
    return name;
  };
  std::vector<Node> nodes;
  nodes.reserve(graph.nodes.size());
  for (Node& n : graph.nodes) {
    // Only the inference form over channels: one output, per-channel statistics, float32 with
    // known types (anything else stays a reference kernel, which checks and refuses as usual).
    bool plain = n.domain.empty() && n.op_type == "BatchNormalization" && n.inputs.size() == 5 &&
                 !n.outputs.empty() && !n.outputs[0].empty() && n.GetInt("training_mode", 0) == 0 &&
                 n.GetInt("spatial", 1) == 1;
    for (size_t i = 1; plain && i < n.outputs.size(); ++i) plain = n.outputs[i].empty();
    const TensorType* x = plain ? type_of(n.inputs[0]) : nullptr;
    plain = x != nullptr && x->dtype == DType::kFloat32 && x->shape.size() >= 2;
    for (size_t i = 1; plain && i < 5; ++i) {
      const TensorType* t = type_of(n.inputs[i]);
      plain = !n.inputs[i].empty() && t != nullptr && t->dtype == DType::kFloat32 &&
              t->shape == Shape{x->shape[1]};
    }
    if (!plain) {
      nodes.push_back(std::move(n));
      continue;
    }
    const std::string base = n.outputs[0] + "/bn";
    auto add = [&](const std::string& op, std::vector<std::string> ins, const std::string& role) {
      Node m;
      m.op_type = op;
      m.name = n.name.empty() ? "" : n.name + "/" + role;
      m.inputs = std::move(ins);
      m.outputs = {fresh(base + "_" + role)};
      nodes.push_back(std::move(m));
      return nodes.back().outputs[0];
    };
    // epsilon is an attribute: structure, not a weight, so it becomes a structural constant.
    const std::string eps = fresh(base + "_epsilon");
    graph.initializers[eps] = Tensor::Scalar<float>(n.GetFloat("epsilon", 1e-5f));
    graph.structural_floats.insert(eps);
    // Per channel [C], computed from the bound statistics on every run (law 1: nothing here
    // reads a weight's value at compile time): s = scale / sqrt(var + eps).
    const std::string std_dev = add("Sqrt", {add("Add", {n.inputs[4], eps}, "var_eps")}, "std");
    std::string s = add("Div", {n.inputs[1], std_dev}, "factor");
    std::string mean = n.inputs[3], bias = n.inputs[2];
    if (x->shape.size() > 2) {  // [C] -> [C, 1, ...]: broadcast against X's channel axis
      std::vector<int64_t> dims(x->shape.size() - 1, 1);
      dims[0] = x->shape[1];
      const std::string shape = fresh(base + "_shape");
      graph.initializers[shape] =
          Tensor::FromVector<int64_t>({static_cast<int64_t>(dims.size())}, dims);
      s = add("Reshape", {s, shape}, "factor_c");
      mean = add("Reshape", {mean, shape}, "mean_c");
      bias = add("Reshape", {bias, shape}, "bias_c");
    }
    // y = (x - mean) * s + bias, per element: the subtraction comes first, so a large mean
    // cancels exactly instead of through x * s - mean * s.
    const std::string centered = add("Sub", {n.inputs[0], mean}, "centered");
    const std::string scaled = add("Mul", {centered, s}, "scaled");
    Node out;
    out.op_type = "Add";
    out.name = n.name;
    out.inputs = {scaled, bias};
    out.outputs = {n.outputs[0]};
    nodes.push_back(std::move(out));
  }
  graph.nodes = std::move(nodes);
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
    // An outer value read only inside a branch or loop body is used by the node owning it.
    for (std::string& in : ImplicitInputs(n)) live.insert(std::move(in));
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
