// Static shape inference and structural folding (see shape_inference.h).
#include "src/kiln/eager/shape_inference.h"

#include <set>

namespace kiln {

namespace {

bool OutputsStructural(const std::vector<TensorType>& types) {
  for (const TensorType& t : types) {
    if (IsWeightDType(t.dtype) || NumElements(t.shape) > kMaxFoldElements) return false;
  }
  return true;
}

}  // namespace

Result<InferredGraph> InferShapes(const Graph& g,
                                  const std::map<std::string, Shape>& input_shapes) {
  InferredGraph out;
  for (const auto& [name, shape] : input_shapes) {
    if (!g.FindInput(name)) {
      return Status::InvalidArgument("shape given for '" + name + "', which is not a graph input");
    }
  }
  for (const ValueInfo& v : g.inputs) {
    auto it = input_shapes.find(v.name);
    Shape shape;
    if (it != input_shapes.end()) {
      shape = it->second;
      if (v.has_shape) {
        if (v.dims.size() != shape.size()) {
          return Status::InvalidArgument("graph input '" + v.name + "': shape " +
                                         ShapeToString(shape) + " has rank " +
                                         std::to_string(shape.size()) + ", the graph declares " +
                                         v.ShapeString());
        }
        for (size_t i = 0; i < shape.size(); ++i) {
          if (v.dims[i].known() && v.dims[i].value != shape[i]) {
            return Status::InvalidArgument("graph input '" + v.name + "': shape " +
                                           ShapeToString(shape) + " differs from the declared " +
                                           v.ShapeString() + " at dim " + std::to_string(i));
          }
        }
      }
    } else {
      if (!v.has_shape) {
        return Status::InvalidArgument("graph input '" + v.name +
                                       "' has no declared shape; give one");
      }
      for (const Dim& d : v.dims) {
        if (!d.known()) {
          return Status::InvalidArgument("graph input '" + v.name + "' has symbolic shape " +
                                         v.ShapeString() + "; give a concrete shape");
        }
        shape.push_back(d.value);
      }
    }
    out.types[v.name] = TensorType{v.dtype, shape};
  }
  for (const auto& [name, t] : g.initializers) {
    out.types[name] = TensorType{t.dtype(), t.shape()};
    if (!g.IsWeight(name)) out.known[name] = t;
  }

  const OpRegistry& registry = OpRegistry::Global();
  static const uint8_t kNoData = 0;
  for (const Node& n : g.nodes) {
    const int64_t opset = g.opset(n.domain);
    KILN_ASSIGN_OR_RETURN(const OpDef* def, registry.Find(n.domain, n.op_type, opset));
    std::vector<TensorType> types;
    std::vector<const Tensor*> values;
    std::vector<bool> present;
    std::vector<Tensor> shape_only;  // placeholders for Shape/Size, which read no data
    shape_only.reserve(n.inputs.size());
    bool all_known = true;
    const bool reads_type_only = n.domain.empty() && (n.op_type == "Shape" || n.op_type == "Size");
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      const std::string& in = n.inputs[i];
      if (in.empty()) {
        types.emplace_back();
        values.push_back(nullptr);
        present.push_back(false);
        continue;
      }
      auto t = out.types.find(in);
      if (t == out.types.end()) {
        return Status::InvalidArgument(n.Describe() + ": input '" + in +
                                       "' is not defined before use");
      }
      types.push_back(t->second);
      present.push_back(true);
      auto k = out.known.find(in);
      if (k != out.known.end()) {
        values.push_back(&k->second);
      } else if (reads_type_only) {
        shape_only.push_back(Tensor::View(t->second.dtype, t->second.shape, nullptr, &kNoData));
        values.push_back(&shape_only.back());
      } else {
        values.push_back(nullptr);
        all_known = false;
      }
    }
    OpContext ctx(n, opset, types, values, present);
    auto inferred = def->infer(ctx);
    if (!inferred.ok()) return inferred.status();
    if (inferred->size() < n.outputs.size()) {
      return Status::Internal(n.Describe() + ": shape function returned " +
                              std::to_string(inferred->size()) + " outputs for " +
                              std::to_string(n.outputs.size()));
    }
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      if (!n.outputs[k].empty()) out.types[n.outputs[k]] = (*inferred)[k];
    }
    if (all_known && OutputsStructural(*inferred)) {
      std::vector<Tensor> results;
      for (const TensorType& t : *inferred) {
        KILN_ASSIGN_OR_RETURN(Tensor r, Tensor::Empty(t.dtype, t.shape));
        results.push_back(std::move(r));
      }
      KILN_RETURN_IF_ERROR(def->run(ctx, results).WithContext("folding"));
      for (size_t k = 0; k < n.outputs.size(); ++k) {
        if (!n.outputs[k].empty()) out.known[n.outputs[k]] = results[k];
      }
    }
  }
  for (const ValueInfo& v : g.outputs) {
    if (!out.types.count(v.name)) {
      return Status::InvalidArgument("graph output '" + v.name + "' is never produced");
    }
  }
  return out;
}

Result<Graph> FoldStructural(const Graph& g, const InferredGraph& inf) {
  Graph out = g;
  out.nodes.clear();
  std::set<std::string> graph_inputs;
  for (const ValueInfo& v : g.inputs) graph_inputs.insert(v.name);
  for (const Node& n : g.nodes) {
    bool folded = !n.outputs.empty();
    for (const std::string& o : n.outputs) {
      if (!o.empty() && !inf.known.count(o)) folded = false;
    }
    if (!folded) {
      out.nodes.push_back(n);
      continue;
    }
    for (const std::string& o : n.outputs) {
      if (!o.empty()) out.initializers[o] = inf.known.at(o);
    }
  }
  // Drop structural constants nothing reads any more.
  std::set<std::string> used;
  for (const Node& n : out.nodes) used.insert(n.inputs.begin(), n.inputs.end());
  for (const ValueInfo& v : out.outputs) used.insert(v.name);
  for (auto it = out.initializers.begin(); it != out.initializers.end();) {
    if (!out.IsWeight(it->first) && !used.count(it->first)) {
      it = out.initializers.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

}  // namespace kiln
