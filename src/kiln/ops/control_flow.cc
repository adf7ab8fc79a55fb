// Control-flow ops (ops layer): If and Loop, whose attributes hold subgraphs.
//
// These ops never walk a graph themselves: they ask the OpContext's SubgraphRunner (the
// interpreter, static shape inference, or the runtime host serving a compiled cell) to infer or
// run a body in the scope of the node's application, so outer-scope values resolve by name.
// Their outputs may depend on what a body computes (which branch, how many iterations), so run
// assigns its outputs itself, or copies into fixed buffers after checking their types (see the
// contract in registry.h).
//
// Static types: If has one type per output only when both branches agree or the condition is
// known; Loop's scan outputs have a leading dim known only when the trip count is (M known and
// the body's condition provably true), otherwise < 0 (known only after run).
#include <algorithm>
#include <cstring>

#include "src/kiln/ops/registry.h"

namespace kiln {

namespace {

Result<const Graph*> GraphAttr(const Node& n, const std::string& name) {
  auto it = n.attrs.find(name);
  if (it == n.attrs.end()) {
    return Status::InvalidArgument(n.Describe() + ": required subgraph attribute '" + name +
                                   "' is missing");
  }
  if (it->second.kind != Attribute::Kind::kGraph || !it->second.g) {
    return Status::InvalidArgument(n.Describe() + ": attribute '" + name + "' is " +
                                   AttributeKindName(it->second.kind) + ", expected graph");
  }
  return it->second.g.get();
}

Result<const SubgraphRunner*> Runner(const OpContext& ctx) {
  if (ctx.subgraphs() == nullptr) {
    return Status::Unimplemented(ctx.where() +
                                 ": subgraphs cannot be run here (no subgraph runner)");
  }
  return ctx.subgraphs();
}

// Hands result `k` to the caller: assigned when outputs[k] is unallocated, else copied into the
// caller's buffer after checking it has exactly the type the caller planned for.
Status Deliver(const OpContext& ctx, size_t k, const Tensor& value, std::vector<Tensor>& outputs) {
  if (k >= outputs.size()) return Status::OK();
  if (!outputs[k].valid()) {
    outputs[k] = value;
    return Status::OK();
  }
  if (outputs[k].dtype() != value.dtype() || outputs[k].shape() != value.shape()) {
    return Status::InvalidArgument(ctx.where() + ": output " + std::to_string(k) + " is " +
                                   value.TypeString() + " at run time, the plan expected " +
                                   outputs[k].TypeString());
  }
  if (value.nbytes() > 0) std::memcpy(outputs[k].raw_data(), value.raw_data(), value.nbytes());
  return Status::OK();
}

Result<bool> ScalarBool(const OpContext& ctx, const Tensor& t, const char* role) {
  if (t.numel() != 1) {
    return Status::InvalidArgument(ctx.where() + ": " + role +
                                   " must hold one element, has shape " + ShapeToString(t.shape()));
  }
  return t.GetAsInt64(0) != 0;
}

Tensor BoolScalar(bool v) {
  const uint8_t b = v ? 1 : 0;
  return *Tensor::FromBytes(DType::kBool, {}, &b, 1);
}

// ---- If -------------------------------------------------------------------------------------

Status CheckIf(const Node& n, int64_t opset) {
  KILN_RETURN_IF_ERROR(CheckArity(n, 1, 1, SIZE_MAX));
  for (const char* name : {"then_branch", "else_branch"}) {
    KILN_ASSIGN_OR_RETURN(const Graph* g, GraphAttr(n, name));
    if (!g->inputs.empty()) {
      return Status::InvalidArgument(n.Describe() + ": " + name + " declares " +
                                     std::to_string(g->inputs.size()) +
                                     " inputs, expected none (branches read outer values)");
    }
    if (g->outputs.size() != n.outputs.size()) {
      return Status::InvalidArgument(n.Describe() + ": " + name + " has " +
                                     std::to_string(g->outputs.size()) + " outputs, the node " +
                                     std::to_string(n.outputs.size()));
    }
  }
  return Status::OK();
}

Result<std::vector<TensorType>> InferIf(const OpContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const SubgraphRunner* runner, Runner(ctx));
  KILN_ASSIGN_OR_RETURN(const Graph* then_g, GraphAttr(ctx.node(), "then_branch"));
  KILN_ASSIGN_OR_RETURN(const Graph* else_g, GraphAttr(ctx.node(), "else_branch"));
  if (ctx.value(0) != nullptr) {
    KILN_ASSIGN_OR_RETURN(bool cond, ScalarBool(ctx, *ctx.value(0), "cond"));
    return runner->InferBody(cond ? *then_g : *else_g, {}, {});
  }
  auto then_t = runner->InferBody(*then_g, {}, {});
  if (!then_t.ok()) return then_t.status().WithContext(ctx.where() + " then_branch");
  auto else_t = runner->InferBody(*else_g, {}, {});
  if (!else_t.ok()) return else_t.status().WithContext(ctx.where() + " else_branch");
  for (size_t k = 0; k < then_t->size() && k < else_t->size(); ++k) {
    if (!((*then_t)[k] == (*else_t)[k])) {
      return Status::Unimplemented(
          ctx.where() + ": the branches give output " + std::to_string(k) + " different types (" +
          (*then_t)[k].ToString() + " vs " + (*else_t)[k].ToString() + ") and condition '" +
          ctx.node().inputs[0] + "' is not known before run, so the output type is data-dependent");
    }
  }
  return then_t;
}

Status RunIf(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_ASSIGN_OR_RETURN(const SubgraphRunner* runner, Runner(ctx));
  KILN_ASSIGN_OR_RETURN(bool cond, ScalarBool(ctx, ctx.in(0), "cond"));
  KILN_ASSIGN_OR_RETURN(const Graph* branch,
                        GraphAttr(ctx.node(), cond ? "then_branch" : "else_branch"));
  auto results = runner->RunBody(*branch, {});
  if (!results.ok()) {
    return results.status().WithContext(ctx.where() + (cond ? " then_branch" : " else_branch"));
  }
  for (size_t k = 0; k < results->size(); ++k) {
    KILN_RETURN_IF_ERROR(Deliver(ctx, k, (*results)[k], outputs));
  }
  return Status::OK();
}

// ---- Loop -----------------------------------------------------------------------------------
// Inputs: M (optional int64 max trip count), cond (optional bool), N loop-carried initial values.
// Body: (iteration_num, cond_in, carried...) -> (cond_out, carried..., K scan values).
// Outputs: N final carried values, then K scan outputs stacked along a new axis 0.

Status CheckLoop(const Node& n, int64_t opset) {
  if (n.inputs.size() < 2) {  // M and cond are optional but their slots are not
    return Status::InvalidArgument(n.Describe() + ": has " + std::to_string(n.inputs.size()) +
                                   " inputs, expected at least 2 (M, cond, loop-carried...)");
  }
  KILN_ASSIGN_OR_RETURN(const Graph* body, GraphAttr(n, "body"));
  const size_t carried = n.inputs.size() - 2;
  if (body->inputs.size() != carried + 2) {
    return Status::InvalidArgument(n.Describe() + ": body declares " +
                                   std::to_string(body->inputs.size()) + " inputs, expected " +
                                   std::to_string(carried + 2) +
                                   " (iteration_num, cond, and one per loop-carried value)");
  }
  if (body->outputs.size() < carried + 1) {
    return Status::InvalidArgument(n.Describe() + ": body has " +
                                   std::to_string(body->outputs.size()) +
                                   " outputs, expected at least " + std::to_string(carried + 1) +
                                   " (cond and one per loop-carried value)");
  }
  if (n.outputs.size() != body->outputs.size() - 1) {
    return Status::InvalidArgument(
        n.Describe() + ": has " + std::to_string(n.outputs.size()) + " outputs, expected " +
        std::to_string(body->outputs.size() - 1) + " (loop-carried values then scan outputs)");
  }
  return Status::OK();
}

Result<std::vector<TensorType>> InferLoop(const OpContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const SubgraphRunner* runner, Runner(ctx));
  KILN_ASSIGN_OR_RETURN(const Graph* body, GraphAttr(ctx.node(), "body"));
  const size_t carried = ctx.num_inputs() - 2;
  // Infer the body as on its first iteration with the condition true: when its cond output is
  // then known and true whatever the iteration number, every iteration runs and the trip count
  // is M.
  std::vector<TensorType> types = {{DType::kInt64, {}}, {DType::kBool, {}}};
  const Tensor truth = BoolScalar(true);
  std::vector<const Tensor*> values = {nullptr, &truth};
  for (size_t i = 0; i < carried; ++i) {
    if (!ctx.present(i + 2)) {
      return Status::Unimplemented(ctx.where() + ": omitted loop-carried input " +
                                   std::to_string(i) + " (optional values) is not supported");
    }
    types.push_back(ctx.type(i + 2));
    values.push_back(nullptr);  // loop-carried values change between iterations
  }
  std::vector<Tensor> known;
  auto out = runner->InferBody(*body, types, values, &known);
  if (!out.ok()) return out.status().WithContext(ctx.where() + " body");
  int64_t trips = -1;
  bool cond_known_true = !ctx.present(1);
  if (ctx.present(1) && ctx.value(1) != nullptr) {
    KILN_ASSIGN_OR_RETURN(bool c, ScalarBool(ctx, *ctx.value(1), "cond"));
    if (!c) trips = 0;
    cond_known_true = c;
  }
  // The body's cond output was inferred with cond_in = true and an unknown iteration number:
  // known and true (passed through, or a constant) means every iteration runs, M of them.
  const bool always =
      !known.empty() && known[0].valid() && known[0].numel() == 1 && known[0].GetAsInt64(0) != 0;
  if (trips < 0 && cond_known_true && always && ctx.present(0) && ctx.value(0) != nullptr) {
    trips = std::max<int64_t>(0, ctx.value(0)->GetAsInt64(0));
  }
  std::vector<TensorType> result;
  for (size_t i = 0; i < carried; ++i) {
    TensorType t = (*out)[i + 1];
    const TensorType& initial = ctx.type(i + 2);
    if (t.dtype != initial.dtype) {
      return Status::InvalidArgument(ctx.where() + ": loop-carried value " + std::to_string(i) +
                                     " enters as " + initial.ToString() +
                                     " and leaves the body as " + t.ToString());
    }
    if (t.shape.size() != initial.shape.size()) {
      t.shape.assign(initial.shape.size(), -1);
    } else {
      // A dim that changes across iterations is known only after run.
      for (size_t d = 0; d < t.shape.size(); ++d) {
        if (t.shape[d] != initial.shape[d]) t.shape[d] = -1;
      }
    }
    result.push_back(t);
  }
  for (size_t k = carried + 1; k < out->size(); ++k) {
    TensorType t = (*out)[k];
    t.shape.insert(t.shape.begin(), trips);
    result.push_back(t);
  }
  return result;
}

Status RunLoop(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_ASSIGN_OR_RETURN(const SubgraphRunner* runner, Runner(ctx));
  KILN_ASSIGN_OR_RETURN(const Graph* body, GraphAttr(ctx.node(), "body"));
  const size_t carried = ctx.num_inputs() - 2;
  const size_t scans = body->outputs.size() - 1 - carried;
  int64_t max_trips = -1;  // < 0: no limit
  if (ctx.present(0)) {
    if (ctx.in(0).numel() != 1) {
      return Status::InvalidArgument(ctx.where() + ": M must hold one element, has shape " +
                                     ShapeToString(ctx.in(0).shape()));
    }
    max_trips = std::max<int64_t>(0, ctx.in(0).GetAsInt64(0));
  }
  bool cond = true;
  if (ctx.present(1)) {
    KILN_ASSIGN_OR_RETURN(cond, ScalarBool(ctx, ctx.in(1), "cond"));
  }
  if (max_trips < 0 && !ctx.present(1)) {
    return Status::InvalidArgument(ctx.where() +
                                   ": neither M nor cond is given, the loop would never end");
  }
  std::vector<Tensor> state;
  for (size_t i = 0; i < carried; ++i) {
    if (!ctx.present(i + 2)) {
      return Status::Unimplemented(ctx.where() + ": omitted loop-carried input " +
                                   std::to_string(i) + " (optional values) is not supported");
    }
    state.push_back(ctx.in(i + 2));
  }
  std::vector<std::vector<Tensor>> scanned(scans);
  int64_t i = 0;
  for (; (max_trips < 0 || i < max_trips) && cond; ++i) {
    std::vector<Tensor> in = {Tensor::Scalar<int64_t>(i), BoolScalar(cond)};
    in.insert(in.end(), state.begin(), state.end());
    auto out = runner->RunBody(*body, in);
    if (!out.ok()) {
      return out.status().WithContext(ctx.where() + " body (iteration " + std::to_string(i) + ")");
    }
    KILN_ASSIGN_OR_RETURN(cond, ScalarBool(ctx, (*out)[0], "the body's cond output"));
    for (size_t k = 0; k < carried; ++k) {
      const Tensor& v = (*out)[k + 1];
      if (v.dtype() != state[k].dtype()) {
        return Status::InvalidArgument(ctx.where() + ": loop-carried value " + std::to_string(k) +
                                       " changed dtype from " + state[k].TypeString() + " to " +
                                       v.TypeString() + " in iteration " + std::to_string(i));
      }
      state[k] = v;
    }
    for (size_t k = 0; k < scans; ++k) {
      const Tensor& v = (*out)[1 + carried + k];
      if (!scanned[k].empty() &&
          (v.dtype() != scanned[k][0].dtype() || v.shape() != scanned[k][0].shape())) {
        return Status::InvalidArgument(ctx.where() + ": scan output " + std::to_string(k) + " is " +
                                       v.TypeString() + " in iteration " + std::to_string(i) +
                                       " but " + scanned[k][0].TypeString() + " in iteration 0");
      }
      scanned[k].push_back(v);
    }
  }
  for (size_t k = 0; k < carried; ++k) KILN_RETURN_IF_ERROR(Deliver(ctx, k, state[k], outputs));
  for (size_t k = 0; k < scans; ++k) {
    Tensor stacked;
    if (scanned[k].empty()) {
      // No iteration ran: an empty stack. The caller's buffer says the per-iteration shape when
      // it has one; otherwise a 1-D empty tensor of the body's declared dtype.
      const size_t slot = carried + k;
      if (slot < outputs.size() && outputs[slot].valid()) continue;
      const ValueInfo& declared = body->outputs[1 + carried + k];
      KILN_ASSIGN_OR_RETURN(stacked, Tensor::Empty(declared.dtype, {0}));
    } else {
      Shape shape = scanned[k][0].shape();
      shape.insert(shape.begin(), static_cast<int64_t>(scanned[k].size()));
      KILN_ASSIGN_OR_RETURN(stacked, Tensor::Empty(scanned[k][0].dtype(), shape));
      char* dst = static_cast<char*>(stacked.raw_data());
      for (const Tensor& v : scanned[k]) {
        if (v.nbytes() > 0) std::memcpy(dst, v.raw_data(), v.nbytes());
        dst += v.nbytes();
      }
    }
    KILN_RETURN_IF_ERROR(Deliver(ctx, carried + k, stacked, outputs));
  }
  return Status::OK();
}

}  // namespace

void RegisterControlFlowOps(OpRegistry& r) {
  // One definition from opset 1: If-11 only relaxed branch output shapes, Loop-11/13/16 and
  // If-13/16 only widened the type constraints (sequences, optionals), which kiln does not take.
  r.Register({"If", "", 1, INT64_MAX, CheckIf, InferIf, RunIf});
  r.Register({"Loop", "", 1, INT64_MAX, CheckLoop, InferLoop, RunLoop});
}

}  // namespace kiln
