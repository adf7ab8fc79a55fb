// The eager interpreter (see interpreter.h).
#include "src/kiln/eager/interpreter.h"

#include <set>

#include "src/kiln/eager/verifier.h"

namespace kiln {

Result<Interpreter> Interpreter::Create(std::shared_ptr<const Graph> graph) {
  KILN_RETURN_IF_ERROR(VerifyGraph(*graph));
  Interpreter interp;
  interp.graph_ = graph;
  const Graph& g = *graph;
  std::set<std::string> keep;  // never released: graph outputs
  for (const ValueInfo& v : g.outputs) keep.insert(v.name);
  std::map<std::string, size_t> last_use;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    for (const std::string& in : g.nodes[i].inputs) {
      if (!in.empty()) last_use[in] = i;
    }
    for (const std::string& out : g.nodes[i].outputs) {
      if (!out.empty() && !last_use.count(out)) last_use[out] = i;  // unused outputs die at once
    }
  }
  interp.steps_.resize(g.nodes.size());
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    KILN_ASSIGN_OR_RETURN(interp.steps_[i].def,
                          OpRegistry::Global().Find(n.domain, n.op_type, g.opset(n.domain)));
    interp.steps_[i].opset = g.opset(n.domain);
  }
  for (const auto& [name, idx] : last_use) {
    if (keep.count(name) || g.initializers.count(name) || g.FindInput(name)) continue;
    interp.steps_[idx].release_after.push_back(name);
  }
  return interp;
}

Status Interpreter::CheckInputs(const TensorMap& inputs) const {
  const Graph& g = *graph_;
  for (const auto& [name, t] : inputs) {
    if (!g.FindInput(name)) {
      std::string expected;
      for (const ValueInfo& v : g.inputs) expected += (expected.empty() ? "" : ", ") + v.name;
      return Status::InvalidArgument("input '" + name + "' is not an input of the graph (inputs: " +
                                     expected + ")");
    }
  }
  for (const ValueInfo& v : g.inputs) {
    auto it = inputs.find(v.name);
    if (it == inputs.end()) {
      return Status::InvalidArgument("input '" + v.name + "' (" + DTypeName(v.dtype) +
                                     v.ShapeString() + ") is missing");
    }
    const Tensor& t = it->second;
    if (!t.valid()) return Status::InvalidArgument("input '" + v.name + "' holds no tensor");
    if (t.dtype() != v.dtype) {
      return Status::InvalidArgument("input '" + v.name + "' has dtype " + DTypeName(t.dtype()) +
                                     ", expected " + DTypeName(v.dtype));
    }
    if (!v.has_shape) continue;
    if (t.rank() != static_cast<int64_t>(v.dims.size())) {
      return Status::InvalidArgument("input '" + v.name + "' has rank " +
                                     std::to_string(t.rank()) + " (shape " +
                                     ShapeToString(t.shape()) + "), expected rank " +
                                     std::to_string(v.dims.size()) + " " + v.ShapeString());
    }
    for (size_t i = 0; i < v.dims.size(); ++i) {
      if (v.dims[i].known() && v.dims[i].value != t.dim(static_cast<int64_t>(i))) {
        return Status::InvalidArgument("input '" + v.name + "' has shape " +
                                       ShapeToString(t.shape()) + ", expected " +
                                       v.ShapeString() + " (dim " + std::to_string(i) + ")");
      }
    }
  }
  return Status::OK();
}

Result<TensorMap> Interpreter::Run(const TensorMap& inputs, const WeightMap* weights,
                                   RunStats* stats) const {
  KILN_RETURN_IF_ERROR(CheckInputs(inputs));
  const Graph& g = *graph_;
  // Values visible to nodes. Weights and inputs are shared handles: no copy.
  std::map<std::string, Tensor> env;
  for (const auto& [name, t] : g.initializers) {
    if (weights != nullptr && g.IsWeight(name)) {
      auto it = weights->find(name);
      if (it == weights->end()) {
        return Status::NotFound("weight '" + name + "' is not bound (the checkpoint lacks it)");
      }
      if (it->second.dtype() != t.dtype() || it->second.shape() != t.shape()) {
        return Status::InvalidArgument("weight '" + name + "' is bound as " +
                                       it->second.TypeString() + ", the graph expects " +
                                       t.TypeString());
      }
      env[name] = it->second;
    } else {
      env[name] = t;
    }
  }
  for (const auto& [name, t] : inputs) env[name] = t;

  int64_t live = 0, peak = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    const Step& step = steps_[i];
    std::vector<TensorType> types;
    std::vector<const Tensor*> values;
    std::vector<bool> present;
    for (const std::string& in : n.inputs) {
      if (in.empty()) {
        types.emplace_back();
        values.push_back(nullptr);
        present.push_back(false);
        continue;
      }
      const Tensor& t = env.at(in);  // verified: defined before use
      types.push_back({t.dtype(), t.shape()});
      values.push_back(&t);
      present.push_back(true);
    }
    OpContext ctx(n, step.opset, std::move(types), std::move(values), std::move(present));
    auto out_types = step.def->infer(ctx);
    if (!out_types.ok()) return out_types.status();
    if (out_types->size() < n.outputs.size()) {
      return Status::Internal(n.Describe() + ": shape function returned " +
                              std::to_string(out_types->size()) + " outputs, node has " +
                              std::to_string(n.outputs.size()));
    }
    std::vector<Tensor> outs;
    outs.reserve(out_types->size());
    for (const TensorType& t : *out_types) {
      auto o = Tensor::Empty(t.dtype, t.shape);
      if (!o.ok()) return o.status().WithContext(n.Describe());
      live += static_cast<int64_t>(o->nbytes());
      outs.push_back(std::move(o).value());
    }
    Status s = step.def->run(ctx, outs);
    if (!s.ok()) {
      if (s.message().rfind(n.op_type, 0) == 0) return s;  // already names the node
      return s.WithContext(n.Describe());
    }
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      if (!n.outputs[k].empty()) env[n.outputs[k]] = std::move(outs[k]);
    }
    peak = std::max(peak, live);
    for (const std::string& name : step.release_after) {
      auto it = env.find(name);
      if (it != env.end()) {
        live -= static_cast<int64_t>(it->second.nbytes());
        env.erase(it);
      }
    }
    if (stats) ++stats->nodes_run;
  }
  if (stats) stats->peak_live_bytes = peak;
  TensorMap result;
  for (const ValueInfo& v : g.outputs) result[v.name] = env.at(v.name);
  return result;
}

}  // namespace kiln
