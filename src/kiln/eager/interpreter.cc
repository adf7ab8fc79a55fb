// The eager interpreter (see interpreter.h).
#include "src/kiln/eager/interpreter.h"

#include <set>

#include "src/kiln/graph/input_check.h"
#include "src/kiln/ops/shape_inference.h"
#include "src/kiln/ops/verifier.h"

namespace kiln {

// The values one graph application sees: its own (inputs, initializers, node outputs) and,
// through `parent`, those of the graphs around it.
struct Interpreter::Scope {
  const Scope* parent = nullptr;
  std::map<std::string, Tensor> values;

  const Tensor* Find(const std::string& name) const {
    for (const Scope* s = this; s != nullptr; s = s->parent) {
      auto it = s->values.find(name);
      if (it != s->values.end()) return &it->second;
    }
    return nullptr;
  }
};

// Runs (or infers) a node's subgraphs in a child scope of the scope the node runs in.
class Interpreter::BodyRunner : public SubgraphRunner, public OuterScope {
 public:
  BodyRunner(const Plans& plans, const Scope& scope, const WeightMap* weights,
             const std::shared_ptr<MemoryBudget>& budget)
      : plans_(plans), scope_(scope), weights_(weights), budget_(budget) {}

  Result<std::vector<TensorType>> InferBody(const Graph& body, const std::vector<TensorType>& types,
                                            const std::vector<const Tensor*>& values,
                                            std::vector<Tensor>* known_outputs) const override {
    return InferBodyTypes(body, types, values, this, known_outputs);
  }

  Result<std::vector<Tensor>> RunBody(const Graph& body,
                                      const std::vector<Tensor>& inputs) const override {
    auto plan = plans_.find(&body);
    if (plan == plans_.end()) {
      return Status::Internal("subgraph '" + body.name + "' has no run plan");
    }
    if (inputs.size() != body.inputs.size()) {
      return Status::InvalidArgument("subgraph '" + body.name + "' declares " +
                                     std::to_string(body.inputs.size()) + " inputs, given " +
                                     std::to_string(inputs.size()));
    }
    Scope child;
    child.parent = &scope_;
    for (size_t i = 0; i < inputs.size(); ++i) child.values[body.inputs[i].name] = inputs[i];
    KILN_RETURN_IF_ERROR(Execute(plans_, body, child, weights_, nullptr, budget_));
    std::vector<Tensor> outputs;
    for (const ValueInfo& v : body.outputs) {
      const Tensor* t = child.Find(v.name);  // may be an outer value passed through
      if (t == nullptr) {
        return Status::InvalidArgument("subgraph '" + body.name + "' output '" + v.name +
                                       "' is never produced");
      }
      outputs.push_back(*t);
    }
    return outputs;
  }

  // OuterScope: eager values by name; only structural (non-weight dtype) values count as known.
  bool Lookup(const std::string& name, TensorType* type, const Tensor** known) const override {
    const Tensor* t = scope_.Find(name);
    if (t == nullptr) return false;
    *type = TypeOf(*t);
    *known = IsWeightDType(t->dtype()) ? nullptr : t;
    return true;
  }

 private:
  const Plans& plans_;
  const Scope& scope_;
  const WeightMap* weights_;
  const std::shared_ptr<MemoryBudget>& budget_;
};

Status Interpreter::AddPlans(const Graph& g, Plans& plans) {
  Plan& plan = plans[&g];
  std::set<std::string> keep;  // never released: graph outputs
  for (const ValueInfo& v : g.outputs) keep.insert(v.name);
  std::set<std::string> local;  // values the nodes of this graph define
  std::map<std::string, size_t> last_use;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    for (const std::string& in : n.inputs) {
      if (!in.empty()) last_use[in] = i;
    }
    // A value a subgraph reads is used by the node that owns the subgraph.
    for (const std::string& in : ImplicitInputs(n)) last_use[in] = i;
    for (const std::string& out : n.outputs) {
      if (out.empty()) continue;
      local.insert(out);
      if (!last_use.count(out)) last_use[out] = i;  // unused outputs die at once
    }
  }
  plan.steps.resize(g.nodes.size());
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    KILN_ASSIGN_OR_RETURN(plan.steps[i].def,
                          OpRegistry::Global().Find(n.domain, n.op_type, g.opset(n.domain)));
    plan.steps[i].opset = g.opset(n.domain);
    plan.steps[i].owns_subgraphs = HasSubgraphs(n);
    if (plan.steps[i].def->prepare) {
      KILN_ASSIGN_OR_RETURN(plan.steps[i].prepared,
                            plan.steps[i].def->prepare(n, plan.steps[i].opset));
    }
    for (const Graph* sub : Subgraphs(n)) KILN_RETURN_IF_ERROR(AddPlans(*sub, plans));
  }
  for (const auto& [name, idx] : last_use) {
    if (keep.count(name) || !local.count(name)) continue;
    plan.steps[idx].release_after.push_back(name);
  }
  return Status::OK();
}

Result<Interpreter> Interpreter::Create(std::shared_ptr<const Graph> graph) {
  KILN_RETURN_IF_ERROR(VerifyGraph(*graph));
  Interpreter interp;
  interp.graph_ = graph;
  KILN_RETURN_IF_ERROR(AddPlans(*graph, interp.plans_));
  return interp;
}

Status Interpreter::CheckInputs(const TensorMap& inputs) const {
  const Graph& g = *graph_;
  for (const auto& [name, t] : inputs) {
    if (!g.FindInput(name)) {
      return Status::InvalidArgument("input '" + name + "' is not an input of the graph (inputs: " +
                                     DeclaredInputNames(g) + ")");
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
    if (t.kind() != v.kind) {
      return Status::InvalidArgument("input '" + v.name + "' is " + t.TypeString() +
                                     ", expected a " + ValueKindName(v.kind) + " of " +
                                     DTypeName(v.dtype));
    }
    if (!t.is_tensor()) {
      if (t.dtype() != v.dtype) {
        return Status::InvalidArgument("input '" + v.name + "' is " + t.TypeString() +
                                       ", expected elements of dtype " + DTypeName(v.dtype));
      }
      continue;
    }
    const InputMismatch m = MatchInput(g, v.name, t.dtype(), t.shape());
    switch (m.kind) {
      case InputMismatch::Kind::kNone:
      case InputMismatch::Kind::kUnknown:  // not reached: v is one of g's inputs
        break;
      case InputMismatch::Kind::kDType:
        return Status::InvalidArgument("input '" + v.name + "' has dtype " + DTypeName(t.dtype()) +
                                       ", expected " + DTypeName(v.dtype));
      case InputMismatch::Kind::kRank:
        return Status::InvalidArgument("input '" + v.name + "' has rank " +
                                       std::to_string(t.rank()) + " (shape " +
                                       ShapeToString(t.shape()) + "), expected rank " +
                                       std::to_string(v.dims.size()) + " " + v.ShapeString());
      case InputMismatch::Kind::kDim:
        return Status::InvalidArgument("input '" + v.name + "' has shape " +
                                       ShapeToString(t.shape()) + ", expected " + v.ShapeString() +
                                       " (dim " + std::to_string(m.dim) + ")");
    }
  }
  return Status::OK();
}

Status Interpreter::Execute(const Plans& plans, const Graph& g, Scope& scope,
                            const WeightMap* weights, RunStats* stats,
                            const std::shared_ptr<MemoryBudget>& budget) {
  const Plan& plan = plans.at(&g);
  // Weights and inputs are shared handles: no copy.
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
      scope.values[name] = it->second;
    } else {
      scope.values[name] = t;
    }
  }

  int64_t live = 0, peak = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    const Step& step = plan.steps[i];
    std::vector<TensorType> types;
    std::vector<const Tensor*> values;
    std::vector<bool> present;
    for (const std::string& in : n.inputs) {
      const Tensor* t = in.empty() ? nullptr : scope.Find(in);
      if (t == nullptr) {
        if (!in.empty()) {  // verified graphs define before use; a bad subgraph binding does not
          return Status::InvalidArgument(n.Describe() + ": input '" + in + "' is not defined");
        }
        types.emplace_back();
        values.push_back(nullptr);
        present.push_back(false);
        continue;
      }
      types.push_back(TypeOf(*t));
      values.push_back(t);
      present.push_back(true);
    }
    KILN_RETURN_IF_ERROR(CheckValueKinds(*step.def, n, types));
    OpContext ctx(n, step.opset, std::move(types), std::move(values), std::move(present));
    ctx.set_prepared(step.prepared.get());
    ctx.set_budget(budget);
    std::vector<Tensor> outs;
    if (step.owns_subgraphs) {
      // Output shapes may depend on what the body computes: the op assigns its outputs.
      outs.resize(n.outputs.size());
      BodyRunner runner(plans, scope, weights, budget);
      ctx.set_subgraphs(&runner);
      Status s = step.def->run(ctx, outs);
      if (!s.ok()) return s.message().rfind(n.op_type, 0) == 0 ? s : s.WithContext(n.Describe());
      for (size_t k = 0; k < outs.size(); ++k) {
        if (!n.outputs[k].empty() && !outs[k].valid()) {
          return Status::Internal(n.Describe() + ": output " + std::to_string(k) +
                                  " was not produced");
        }
        live += static_cast<int64_t>(outs[k].nbytes());
      }
    } else {
      auto out_types = step.def->infer(ctx);
      if (!out_types.ok()) return out_types.status();
      if (out_types->size() < n.outputs.size()) {
        return Status::Internal(n.Describe() + ": shape function returned " +
                                std::to_string(out_types->size()) + " outputs, node has " +
                                std::to_string(n.outputs.size()));
      }
      KILN_RETURN_IF_ERROR(CheckValueKinds(*step.def, n, *out_types));
      outs.reserve(out_types->size());
      // Each output's size is checked (and charged) before it is allocated: a shape computed
      // from a request's values is refused here, by node and output, never allocated wrapped.
      for (size_t k = 0; k < out_types->size(); ++k) {
        const TensorType& t = (*out_types)[k];
        if (t.kind != ValueKind::kTensor) {  // a sequence or optional: run assigns it
          outs.emplace_back();
          continue;
        }
        auto o = Tensor::Empty(t.dtype, t.shape, budget);
        if (!o.ok()) {
          const std::string out = k < n.outputs.size() ? n.outputs[k] : std::to_string(k);
          return o.status().WithContext(n.Describe() + ": output '" + out + "'");
        }
        live += static_cast<int64_t>(o->nbytes());
        outs.push_back(std::move(o).value());
      }
      Status s = step.def->run(ctx, outs);
      if (!s.ok()) {
        if (s.message().rfind(n.op_type, 0) == 0) return s;  // already names the node
        return s.WithContext(n.Describe());
      }
      for (size_t k = 0; k < n.outputs.size(); ++k) {
        if (step.def->values && !n.outputs[k].empty() && !(TypeOf(outs[k]) == (*out_types)[k])) {
          return Status::Internal(n.Describe() + ": output " + std::to_string(k) + " is " +
                                  outs[k].TypeString() + ", its shape function said " +
                                  (*out_types)[k].ToString());
        }
      }
    }
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      if (!n.outputs[k].empty()) scope.values[n.outputs[k]] = std::move(outs[k]);
    }
    peak = std::max(peak, live);
    for (const std::string& name : step.release_after) {
      auto it = scope.values.find(name);
      if (it != scope.values.end()) {
        live -= static_cast<int64_t>(it->second.nbytes());
        scope.values.erase(it);
      }
    }
    if (stats) ++stats->nodes_run;
  }
  if (stats) stats->peak_live_bytes = peak;
  return Status::OK();
}

Result<TensorMap> Interpreter::Run(const TensorMap& inputs, const WeightMap* weights,
                                   RunStats* stats,
                                   const std::shared_ptr<MemoryBudget>& budget) const {
  KILN_RETURN_IF_ERROR(CheckInputs(inputs));
  const Graph& g = *graph_;
  Scope scope;
  for (const auto& [name, t] : inputs) scope.values[name] = t;
  KILN_RETURN_IF_ERROR(Execute(plans_, g, scope, weights, stats, budget));
  TensorMap result;
  for (const ValueInfo& v : g.outputs) result[v.name] = scope.values.at(v.name);
  return result;
}

Result<std::unique_ptr<SubgraphNode>> SubgraphNode::Create(const Node& node, int64_t opset) {
  auto sn = std::make_unique<SubgraphNode>();
  sn->node_ = node;
  KILN_ASSIGN_OR_RETURN(sn->def_, OpRegistry::Global().Find(node.domain, node.op_type, opset));
  if (sn->def_->check) KILN_RETURN_IF_ERROR(sn->def_->check(sn->node_, opset));
  if (sn->def_->prepare) {
    KILN_ASSIGN_OR_RETURN(sn->prepared_, sn->def_->prepare(sn->node_, opset));
  }
  for (const Graph* sub : Subgraphs(sn->node_)) {
    // Everything the subgraphs read from outside is bound at run: verify against those names.
    std::set<std::string> outer;
    for (const std::string& name : OuterReferences(*sub)) outer.insert(name);
    KILN_RETURN_IF_ERROR(VerifyGraph(*sub, outer).WithContext(sn->node_.Describe()));
    KILN_RETURN_IF_ERROR(Interpreter::AddPlans(*sub, sn->plans_));
  }
  return sn;
}

Status SubgraphNode::Run(OpContext& ctx, const TensorMap& outer,
                         std::vector<Tensor>& outputs) const {
  Interpreter::Scope scope;
  scope.values = outer;
  Interpreter::BodyRunner runner(plans_, scope, nullptr, ctx.budget());
  ctx.set_subgraphs(&runner);
  ctx.set_prepared(prepared_.get());
  return def_->run(ctx, outputs);
}

}  // namespace kiln
