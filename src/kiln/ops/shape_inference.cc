// Static shape inference and structural folding (see shape_inference.h).
#include "src/kiln/ops/shape_inference.h"

#include <set>

namespace kiln {

namespace {

bool OutputsStructural(const std::vector<TensorType>& types) {
  for (const TensorType& t : types) {
    if (IsWeightDType(t.dtype)) return false;
    Result<int64_t> n = CheckedNumElements(t.shape);
    if (!n.ok() || *n > kMaxFoldElements) return false;
  }
  return true;
}

}  // namespace

namespace {

// Outer names for the static inference of a subgraph: this graph's inferred values, then the
// enclosing scopes'.
class InferredScope : public OuterScope {
 public:
  InferredScope(const InferredGraph& inf, const OuterScope* parent) : inf_(inf), parent_(parent) {}
  bool Lookup(const std::string& name, TensorType* type, const Tensor** known) const override {
    auto t = inf_.types.find(name);
    if (t == inf_.types.end()) return parent_ != nullptr && parent_->Lookup(name, type, known);
    *type = t->second;
    auto k = inf_.known.find(name);
    *known = k == inf_.known.end() ? nullptr : &k->second;
    return true;
  }

 private:
  const InferredGraph& inf_;
  const OuterScope* parent_;
};

Result<InferredGraph> InferScoped(const Graph& g, InferredGraph seeded, const OuterScope* outer,
                                  bool tolerate_dynamic = false);

// Infers the bodies of If/Loop nodes during static inference. Bodies are never run here: a node
// that owns subgraphs is never folded (fold-structural inlines an If whose condition is known).
class StaticRunner : public SubgraphRunner {
 public:
  explicit StaticRunner(const OuterScope* scope) : scope_(scope) {}
  Result<std::vector<TensorType>> InferBody(const Graph& body, const std::vector<TensorType>& types,
                                            const std::vector<const Tensor*>& values,
                                            std::vector<Tensor>* known_outputs) const override {
    return InferBodyTypes(body, types, values, scope_, known_outputs);
  }
  Result<std::vector<Tensor>> RunBody(const Graph& body,
                                      const std::vector<Tensor>& inputs) const override {
    return Status::Unimplemented("subgraphs are not run during static shape inference");
  }

 private:
  const OuterScope* scope_;
};

Result<InferredGraph> InferScoped(const Graph& g, InferredGraph out, const OuterScope* outer,
                                  bool tolerate_dynamic) {
  for (const auto& [name, t] : g.initializers) {
    out.types[name] = TypeOf(t);
    if (!g.IsWeight(name)) out.known[name] = t;
  }

  const OpRegistry& registry = OpRegistry::Global();
  static const uint8_t kNoData = 0;
  auto mark_dynamic = [&](const Node& n) {
    for (const std::string& o : n.outputs) {
      if (!o.empty()) out.dynamic.insert(o);
    }
  };
  for (const Node& n : g.nodes) {
    const int64_t opset = g.opset(n.domain);
    KILN_ASSIGN_OR_RETURN(const OpDef* def, registry.Find(n.domain, n.op_type, opset));
    if (tolerate_dynamic) {
      bool reads_dynamic = false;
      for (const std::string& in : n.inputs) reads_dynamic = reads_dynamic || out.dynamic.count(in);
      for (const std::string& in : ImplicitInputs(n)) {
        reads_dynamic = reads_dynamic || out.dynamic.count(in);
      }
      if (reads_dynamic) {
        mark_dynamic(n);
        continue;
      }
    }
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
      TensorType type;
      const Tensor* known = nullptr;
      auto t = out.types.find(in);
      if (t != out.types.end()) {
        type = t->second;
        auto k = out.known.find(in);
        if (k != out.known.end()) known = &k->second;
      } else if (outer == nullptr || !outer->Lookup(in, &type, &known)) {
        return Status::InvalidArgument(n.Describe() + ": input '" + in +
                                       "' is not defined before use");
      }
      types.push_back(type);
      present.push_back(true);
      if (known != nullptr) {
        values.push_back(known);
      } else if (reads_type_only) {
        shape_only.push_back(Tensor::View(type.dtype, type.shape, nullptr, &kNoData));
        values.push_back(&shape_only.back());
      } else {
        values.push_back(nullptr);
        all_known = false;
      }
    }
    KILN_RETURN_IF_ERROR(CheckValueKinds(*def, n, types));
    OpContext ctx(n, opset, types, values, present);
    InferredScope scope(out, outer);
    StaticRunner runner(&scope);
    const bool owns_subgraphs = HasSubgraphs(n);
    if (owns_subgraphs) ctx.set_subgraphs(&runner);
    auto inferred = def->infer(ctx);
    if (!inferred.ok()) {
      if (tolerate_dynamic && IsValueDependent(inferred.status())) {
        mark_dynamic(n);
        continue;
      }
      return inferred.status();
    }
    KILN_RETURN_IF_ERROR(CheckValueKinds(*def, n, *inferred));
    if (tolerate_dynamic) {
      // Sequences, optionals and strings are not plain bytes: a compiled cell computes them on
      // the host, in its dynamic region (with every node that reads them).
      bool host_value = false;
      for (size_t k = 0; k < n.outputs.size() && k < inferred->size(); ++k) {
        const TensorType& t = (*inferred)[k];
        host_value = host_value || t.kind != ValueKind::kTensor || t.dtype == DType::kString;
      }
      if (host_value) {
        mark_dynamic(n);
        continue;
      }
    }
    if (inferred->size() < n.outputs.size()) {
      return Status::Internal(n.Describe() + ": shape function returned " +
                              std::to_string(inferred->size()) + " outputs for " +
                              std::to_string(n.outputs.size()));
    }
    bool unknown_dim = false;
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      for (int64_t d : (*inferred)[k].shape) unknown_dim = unknown_dim || d < 0;
    }
    if (tolerate_dynamic && unknown_dim) {
      mark_dynamic(n);
      continue;
    }
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      if (n.outputs[k].empty()) continue;
      for (int64_t d : (*inferred)[k].shape) {
        if (d < 0) {
          return Status::Unimplemented(
              n.Describe() + ": output '" + n.outputs[k] + "' has a data-dependent shape " +
              ShapeToString((*inferred)[k].shape) +
              " (known only after run), so it cannot be specialized for a shape class");
        }
      }
      // Every value of a specialized graph is allocated (or planned) at its size: one whose
      // size does not fit int64 (an envelope dim of 2^62, a constant shape past it) is refused
      // here by node, never wrapped into a small buffer.
      const TensorType& t = (*inferred)[k];
      if (Result<int64_t> bytes = CheckedNumBytes(t.dtype, t.shape); !bytes.ok()) {
        return bytes.status().WithContext(n.Describe() + ": output '" + n.outputs[k] + "'");
      }
      out.types[n.outputs[k]] = t;
    }
    if (all_known && !owns_subgraphs && OutputsStructural(*inferred)) {
      std::vector<Tensor> results;
      for (const TensorType& t : *inferred) {
        if (t.kind != ValueKind::kTensor) {  // assigned by run (OpDef::values)
          results.emplace_back();
          continue;
        }
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
    if (out.types.count(v.name) || out.dynamic.count(v.name)) continue;
    TensorType type;
    const Tensor* known = nullptr;
    if (outer != nullptr && outer->Lookup(v.name, &type, &known)) {
      // A subgraph output may be an outer value passed through.
      out.types[v.name] = type;
      if (known != nullptr) out.known[v.name] = *known;
      continue;
    }
    return Status::InvalidArgument("graph output '" + v.name + "' is never produced");
  }
  return out;
}

}  // namespace

Result<std::vector<TensorType>> InferBodyTypes(const Graph& body,
                                               const std::vector<TensorType>& types,
                                               const std::vector<const Tensor*>& values,
                                               const OuterScope* outer,
                                               std::vector<Tensor>* known_outputs) {
  if (types.size() != body.inputs.size()) {
    return Status::InvalidArgument("subgraph '" + body.name + "' declares " +
                                   std::to_string(body.inputs.size()) + " inputs, given " +
                                   std::to_string(types.size()));
  }
  InferredGraph seeded;
  for (size_t i = 0; i < types.size(); ++i) {
    seeded.types[body.inputs[i].name] = types[i];
    if (i < values.size() && values[i] != nullptr) seeded.known[body.inputs[i].name] = *values[i];
  }
  KILN_ASSIGN_OR_RETURN(InferredGraph inf, InferScoped(body, std::move(seeded), outer));
  std::vector<TensorType> result;
  if (known_outputs) known_outputs->clear();
  for (const ValueInfo& v : body.outputs) {
    result.push_back(inf.types.at(v.name));
    if (known_outputs) {
      auto k = inf.known.find(v.name);
      known_outputs->push_back(k == inf.known.end() ? Tensor() : k->second);
    }
  }
  return result;
}

Result<InferredGraph> InferShapes(const Graph& g, const std::map<std::string, Shape>& input_shapes,
                                  bool tolerate_dynamic) {
  InferredGraph out;
  for (const auto& [name, shape] : input_shapes) {
    if (!g.FindInput(name)) {
      return Status::InvalidArgument("shape given for '" + name + "', which is not a graph input");
    }
  }
  for (const ValueInfo& v : g.inputs) {
    if (v.kind != ValueKind::kTensor) {  // a sequence or optional: no shape to specialize
      out.types[v.name] = TensorType{v.dtype, {}, v.kind};
      continue;
    }
    auto it = input_shapes.find(v.name);
    Shape shape;
    if (it != input_shapes.end()) {
      shape = it->second;
      if (v.has_shape) {
        if (v.dims.size() != shape.size()) {
          return Status::InvalidArgument(
              "graph input '" + v.name + "': shape " + ShapeToString(shape) + " has rank " +
              std::to_string(shape.size()) + ", the graph declares " + v.ShapeString());
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
    if (Result<int64_t> bytes = CheckedNumBytes(v.dtype, shape); !bytes.ok()) {
      return bytes.status().WithContext("graph input '" + v.name + "'");
    }
    out.types[v.name] = TensorType{v.dtype, shape};
  }
  return InferScoped(g, std::move(out), nullptr, tolerate_dynamic);
}

Result<Graph> FoldStructural(const Graph& g, const InferredGraph& inf,
                             const std::set<std::string>* keep) {
  Graph out = g;
  out.nodes.clear();
  std::set<std::string> graph_inputs;
  for (const ValueInfo& v : g.inputs) graph_inputs.insert(v.name);
  for (const Node& n : g.nodes) {
    bool folded = !n.outputs.empty();
    for (const std::string& o : n.outputs) {
      if (!o.empty() && (!inf.known.count(o) || (keep && keep->count(o)))) folded = false;
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
  for (const Node& n : out.nodes) {
    used.insert(n.inputs.begin(), n.inputs.end());
    for (std::string& in : ImplicitInputs(n)) used.insert(std::move(in));  // read by a subgraph
  }
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
