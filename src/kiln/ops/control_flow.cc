// Control-flow ops (ops layer): If, Loop and Scan, whose attributes hold subgraphs.
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
#include <tuple>

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
  if (!value.is_tensor() || value.dtype() == DType::kString) {
    outputs[k] = value;  // not plain bytes: the immutable handle itself
    return Status::OK();
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
  auto else_t = runner->InferBody(*else_g, {}, {});
  // A branch whose types depend on data makes the If's types depend on data.
  if (!then_t.ok() && IsValueDependent(then_t.status())) {
    return then_t.status().WithContext(ctx.where() + " then_branch");
  }
  if (!else_t.ok() && IsValueDependent(else_t.status())) {
    return else_t.status().WithContext(ctx.where() + " else_branch");
  }
  // A branch that cannot run at these shapes (an exported model's branch for another input
  // size: a voice detector's 8 kHz front end given a 16 kHz frame) is refused by eager whenever
  // it is taken, so the If has the types of the branch that can run. Only both failing is an
  // error.
  if (!then_t.ok() && !else_t.ok()) {
    return then_t.status().WithContext(ctx.where() + " then_branch");
  }
  if (!then_t.ok()) return else_t;
  if (!else_t.ok()) return then_t;
  for (size_t k = 0; k < then_t->size() && k < else_t->size(); ++k) {
    if (!((*then_t)[k] == (*else_t)[k])) {
      return Status::Refused(StatusCode::kUnimplemented, kRefusalValueDependent,
                             ctx.where() + ": the branches give output " + std::to_string(k) +
                                 " different types (" + (*then_t)[k].ToString() + " vs " +
                                 (*else_t)[k].ToString() + ") and condition '" +
                                 ctx.node().inputs[0] +
                                 "' is not known before run, so the output type is data-dependent");
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
  if (trips < 0 && always && out->size() > carried + 1) {
    // The body never stops the loop, so M and the initial cond alone decide the scan outputs'
    // leading dim: name the one not known, which a caller specializing shapes can make a
    // constant (an exporter's Range expansion computes both from Range's inputs).
    if (ctx.present(0) && ctx.value(0) == nullptr) return ctx.RequireValue(0, "M").status();
    if (ctx.present(1) && ctx.value(1) == nullptr) return ctx.RequireValue(1, "cond").status();
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
      if (!v.is_tensor() || v.dtype() == DType::kString) {
        return Status::Unimplemented(ctx.where() + ": scan output " + std::to_string(k) + " is " +
                                     v.TypeString() +
                                     "; kiln stacks tensors of fixed-size elements only");
      }
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
      if (!declared.has_type) {
        return Status::Unimplemented(ctx.where() + ": scan output " + std::to_string(k) + " ('" +
                                     declared.name +
                                     "') has no type: no iteration ran and the body declares none");
      }
      KILN_ASSIGN_OR_RETURN(stacked, Tensor::Empty(declared.dtype, {0}));
    } else {
      Shape shape = scanned[k][0].shape();
      shape.insert(shape.begin(), static_cast<int64_t>(scanned[k].size()));
      // As long as the trip count the request gave: charged to its budget before it exists.
      KILN_ASSIGN_OR_RETURN(stacked, Tensor::Empty(scanned[k][0].dtype(), shape, ctx.budget()));
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

// ---- Scan (opset 9+) -------------------------------------------------------------------------
// Inputs: N state initial values, then M scan inputs iterated along scan_input_axes (reversed
// where scan_input_directions is 1). Body: (states..., one slice per scan input) -> (states...,
// K scan slices). Outputs: N final states, then K scan outputs stacked along scan_output_axes.
// The iteration count is the scanned axis's extent, so every output type is static.

struct ScanAttrs {
  size_t states = 0, scans_in = 0, scans_out = 0;
  std::vector<int64_t> in_axes, in_dirs, out_axes, out_dirs;
};

Result<ScanAttrs> ReadScan(const Node& n, const Graph& body) {
  ScanAttrs a;
  KILN_ASSIGN_OR_RETURN(int64_t m, n.GetInt("num_scan_inputs"));
  if (m < 1 || static_cast<size_t>(m) > n.inputs.size()) {
    return Status::InvalidArgument(n.Describe() + ": num_scan_inputs=" + std::to_string(m) +
                                   " must be in [1, " + std::to_string(n.inputs.size()) + "]");
  }
  a.scans_in = static_cast<size_t>(m);
  a.states = n.inputs.size() - a.scans_in;
  if (body.inputs.size() != n.inputs.size() || body.outputs.size() != n.outputs.size() ||
      body.outputs.size() < a.states) {
    return Status::InvalidArgument(
        n.Describe() + ": body has " + std::to_string(body.inputs.size()) + " inputs and " +
        std::to_string(body.outputs.size()) + " outputs, the node " +
        std::to_string(n.inputs.size()) + " and " + std::to_string(n.outputs.size()));
  }
  a.scans_out = n.outputs.size() - a.states;
  a.in_axes = n.GetInts("scan_input_axes", std::vector<int64_t>(a.scans_in, 0));
  a.in_dirs = n.GetInts("scan_input_directions", std::vector<int64_t>(a.scans_in, 0));
  a.out_axes = n.GetInts("scan_output_axes", std::vector<int64_t>(a.scans_out, 0));
  a.out_dirs = n.GetInts("scan_output_directions", std::vector<int64_t>(a.scans_out, 0));
  for (const auto& [name, v, want] : {std::tuple<const char*, const std::vector<int64_t>&, size_t>{
                                          "scan_input_axes", a.in_axes, a.scans_in},
                                      {"scan_input_directions", a.in_dirs, a.scans_in},
                                      {"scan_output_axes", a.out_axes, a.scans_out},
                                      {"scan_output_directions", a.out_dirs, a.scans_out}}) {
    if (v.size() != want) {
      return Status::InvalidArgument(n.Describe() + ": attribute '" + name + "' has " +
                                     std::to_string(v.size()) + " values, expected " +
                                     std::to_string(want));
    }
  }
  for (const std::vector<int64_t>* dirs : {&a.in_dirs, &a.out_dirs}) {
    for (int64_t d : *dirs) {
      if (d != 0 && d != 1) {
        return Status::InvalidArgument(n.Describe() + ": scan direction " + std::to_string(d) +
                                       " must be 0 (forward) or 1 (reverse)");
      }
    }
  }
  return a;
}

Status CheckScan(const Node& n, int64_t opset) {
  KILN_ASSIGN_OR_RETURN(const Graph* body, GraphAttr(n, "body"));
  return ReadScan(n, *body).status();
}

Result<int64_t> NormAxis(const OpContext& ctx, int64_t axis, size_t rank, const char* what) {
  const int64_t r = static_cast<int64_t>(rank);
  if (axis < -r || axis >= r) {
    return Status::InvalidArgument(ctx.where() + ": " + what + " " + std::to_string(axis) +
                                   " is out of range for rank " + std::to_string(rank));
  }
  return axis < 0 ? axis + r : axis;
}

// The scanned length and, per scan input, its normalized axis. Every scan input must agree.
Result<int64_t> ScanLength(const OpContext& ctx, const ScanAttrs& a, std::vector<int64_t>* axes) {
  int64_t length = -1;
  for (size_t j = 0; j < a.scans_in; ++j) {
    const Shape& s = ctx.type(a.states + j).shape;
    KILN_ASSIGN_OR_RETURN(int64_t axis, NormAxis(ctx, a.in_axes[j], s.size(), "scan input axis"));
    axes->push_back(axis);
    const int64_t len = s[static_cast<size_t>(axis)];
    if (length >= 0 && len != length) {
      return Status::InvalidArgument(
          ctx.where() + ": scan input " + std::to_string(j) + " has length " + std::to_string(len) +
          " along axis " + std::to_string(axis) + ", scan input 0 has " + std::to_string(length));
    }
    length = len;
  }
  return length;
}

Shape Without(Shape s, int64_t axis) {
  s.erase(s.begin() + axis);
  return s;
}

Result<std::vector<TensorType>> InferScan(const OpContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const SubgraphRunner* runner, Runner(ctx));
  KILN_ASSIGN_OR_RETURN(const Graph* body, GraphAttr(ctx.node(), "body"));
  KILN_ASSIGN_OR_RETURN(ScanAttrs a, ReadScan(ctx.node(), *body));
  std::vector<int64_t> axes;
  KILN_ASSIGN_OR_RETURN(int64_t length, ScanLength(ctx, a, &axes));
  std::vector<TensorType> types;
  for (size_t i = 0; i < a.states; ++i) types.push_back(ctx.type(i));
  for (size_t j = 0; j < a.scans_in; ++j) {
    types.push_back({ctx.type(a.states + j).dtype, Without(ctx.type(a.states + j).shape, axes[j])});
  }
  auto out = runner->InferBody(*body, types, std::vector<const Tensor*>(types.size(), nullptr));
  if (!out.ok()) return out.status().WithContext(ctx.where() + " body");
  std::vector<TensorType> result(out->begin(), out->begin() + static_cast<ptrdiff_t>(a.states));
  for (size_t k = 0; k < a.scans_out; ++k) {
    TensorType t = (*out)[a.states + k];
    KILN_ASSIGN_OR_RETURN(int64_t axis,
                          NormAxis(ctx, a.out_axes[k], t.shape.size() + 1, "scan output axis"));
    t.shape.insert(t.shape.begin() + axis, length);
    result.push_back(t);
  }
  return result;
}

// Element t of `x` along `axis`, as a new tensor without that axis.
Result<Tensor> SliceAt(const Tensor& x, int64_t axis, int64_t t) {
  const Shape& s = x.shape();
  int64_t outer = 1, inner = static_cast<int64_t>(DTypeSize(x.dtype()));
  for (int64_t d = 0; d < axis; ++d) outer *= s[static_cast<size_t>(d)];
  for (size_t d = static_cast<size_t>(axis) + 1; d < s.size(); ++d) inner *= s[d];
  const int64_t len = s[static_cast<size_t>(axis)];
  KILN_ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(x.dtype(), Without(s, axis)));
  const char* src = static_cast<const char*>(x.raw_data());
  char* dst = static_cast<char*>(out.raw_data());
  for (int64_t o = 0; o < outer; ++o) {
    std::memcpy(dst + o * inner, src + (o * len + t) * inner, static_cast<size_t>(inner));
  }
  return out;
}

Status RunScan(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_ASSIGN_OR_RETURN(const SubgraphRunner* runner, Runner(ctx));
  KILN_ASSIGN_OR_RETURN(const Graph* body, GraphAttr(ctx.node(), "body"));
  KILN_ASSIGN_OR_RETURN(ScanAttrs a, ReadScan(ctx.node(), *body));
  std::vector<int64_t> axes;
  KILN_ASSIGN_OR_RETURN(int64_t length, ScanLength(ctx, a, &axes));
  std::vector<Tensor> state;
  for (size_t i = 0; i < a.states; ++i) state.push_back(ctx.in(i));
  std::vector<std::vector<Tensor>> slices(a.scans_out);
  for (int64_t t = 0; t < length; ++t) {
    std::vector<Tensor> in = state;
    for (size_t j = 0; j < a.scans_in; ++j) {
      const int64_t at = a.in_dirs[j] == 1 ? length - 1 - t : t;
      KILN_ASSIGN_OR_RETURN(Tensor slice, SliceAt(ctx.in(a.states + j), axes[j], at));
      in.push_back(std::move(slice));
    }
    auto out = runner->RunBody(*body, in);
    if (!out.ok()) {
      return out.status().WithContext(ctx.where() + " body (iteration " + std::to_string(t) + ")");
    }
    for (size_t i = 0; i < a.states; ++i) state[i] = (*out)[i];
    for (size_t k = 0; k < a.scans_out; ++k) {
      const Tensor& v = (*out)[a.states + k];
      if (!slices[k].empty() &&
          (v.dtype() != slices[k][0].dtype() || v.shape() != slices[k][0].shape())) {
        return Status::InvalidArgument(ctx.where() + ": scan output " + std::to_string(k) + " is " +
                                       v.TypeString() + " in iteration " + std::to_string(t) +
                                       " but " + slices[k][0].TypeString() + " in iteration 0");
      }
      slices[k].push_back(v);
    }
  }
  for (size_t i = 0; i < a.states; ++i) KILN_RETURN_IF_ERROR(Deliver(ctx, i, state[i], outputs));
  for (size_t k = 0; k < a.scans_out; ++k) {
    if (slices[k].empty()) {
      if (a.states + k < outputs.size() && outputs[a.states + k].valid()) continue;
      return Status::Unimplemented(ctx.where() + ": a scan of length 0 has no output type here");
    }
    const Shape& piece = slices[k][0].shape();
    KILN_ASSIGN_OR_RETURN(int64_t axis,
                          NormAxis(ctx, a.out_axes[k], piece.size() + 1, "scan output axis"));
    Shape shape = piece;
    shape.insert(shape.begin() + axis, length);
    KILN_ASSIGN_OR_RETURN(Tensor stacked, Tensor::Empty(slices[k][0].dtype(), shape, ctx.budget()));
    int64_t outer = 1, inner = static_cast<int64_t>(DTypeSize(stacked.dtype()));
    for (int64_t d = 0; d < axis; ++d) outer *= piece[static_cast<size_t>(d)];
    for (size_t d = static_cast<size_t>(axis); d < piece.size(); ++d) inner *= piece[d];
    char* dst = static_cast<char*>(stacked.raw_data());
    for (int64_t t = 0; t < length; ++t) {
      const int64_t at = a.out_dirs[k] == 1 ? length - 1 - t : t;
      const char* src = static_cast<const char*>(slices[k][static_cast<size_t>(t)].raw_data());
      for (int64_t o = 0; o < outer; ++o) {
        std::memcpy(dst + (o * length + at) * inner, src + o * inner, static_cast<size_t>(inner));
      }
    }
    KILN_RETURN_IF_ERROR(Deliver(ctx, a.states + k, stacked, outputs));
  }
  return Status::OK();
}

// ---- Scan (opset 8) --------------------------------------------------------------------------
// Scan-8 is batched: input 0 is the optional sequence_lens (int64 [batch]), then N state
// initial values [batch, ...] and M scan inputs [batch, max_len, ...], always scanned along
// axis 1 (reversed per `directions`). Each batch element runs its own scan of sequence_lens[b]
// iterations (max_len without sequence_lens) from its own slice of the states. Outputs: N final
// states [batch, ...], then K scan outputs [batch, max_len, ...]; past a short sequence's length
// a scan output holds zeros (ONNX leaves those values undefined). A reverse direction walks the
// first sequence_lens[b] elements backwards, as onnxruntime does; scan outputs are always
// stacked in iteration order.

struct Scan8Attrs {
  size_t states = 0, scans_in = 0, scans_out = 0;
  std::vector<int64_t> dirs;
};

Result<Scan8Attrs> ReadScan8(const Node& n, const Graph& body) {
  Scan8Attrs a;
  if (n.inputs.size() < 2) {
    return Status::InvalidArgument(n.Describe() + ": has " + std::to_string(n.inputs.size()) +
                                   " inputs, expected at least 2 (sequence_lens, then states and "
                                   "scan inputs)");
  }
  const size_t operands = n.inputs.size() - 1;
  KILN_ASSIGN_OR_RETURN(int64_t m, n.GetInt("num_scan_inputs"));
  if (m < 1 || static_cast<size_t>(m) > operands) {
    return Status::InvalidArgument(n.Describe() + ": num_scan_inputs=" + std::to_string(m) +
                                   " must be in [1, " + std::to_string(operands) + "]");
  }
  a.scans_in = static_cast<size_t>(m);
  a.states = operands - a.scans_in;
  if (body.inputs.size() != operands || body.outputs.size() != n.outputs.size() ||
      body.outputs.size() < a.states) {
    return Status::InvalidArgument(
        n.Describe() + ": body has " + std::to_string(body.inputs.size()) + " inputs and " +
        std::to_string(body.outputs.size()) + " outputs, expected " + std::to_string(operands) +
        " (states and scan inputs, without sequence_lens) and " + std::to_string(n.outputs.size()) +
        " (the node's outputs)");
  }
  a.scans_out = n.outputs.size() - a.states;
  a.dirs = n.GetInts("directions", std::vector<int64_t>(a.scans_in, 0));
  if (a.dirs.size() != a.scans_in) {
    return Status::InvalidArgument(n.Describe() + ": attribute 'directions' has " +
                                   std::to_string(a.dirs.size()) + " values, expected " +
                                   std::to_string(a.scans_in) + " (one per scan input)");
  }
  for (int64_t d : a.dirs) {
    if (d != 0 && d != 1) {
      return Status::InvalidArgument(n.Describe() + ": attribute 'directions' has value " +
                                     std::to_string(d) + ", expected 0 (forward) or 1 (reverse)");
    }
  }
  return a;
}

Status CheckScan8(const Node& n, int64_t opset) {
  KILN_ASSIGN_OR_RETURN(const Graph* body, GraphAttr(n, "body"));
  return ReadScan8(n, *body).status();
}

struct Scan8Shape {
  int64_t batch = 0, max_len = 0;
};

// The batch size and maximum sequence length every state, scan input and sequence_lens agrees on.
Result<Scan8Shape> Scan8Dims(const OpContext& ctx, const Scan8Attrs& a) {
  Scan8Shape s;
  for (size_t j = 0; j < a.scans_in; ++j) {
    const Shape& x = ctx.type(1 + a.states + j).shape;
    if (x.size() < 2) {
      return Status::InvalidArgument(ctx.where() + ": scan input " + std::to_string(j) + " " +
                                     ShapeToString(x) +
                                     " must have rank >= 2 ([batch, sequence, ...])");
    }
    if (j == 0) {
      s = {x[0], x[1]};
    } else if (x[0] != s.batch || x[1] != s.max_len) {
      return Status::InvalidArgument(ctx.where() + ": scan input " + std::to_string(j) + " " +
                                     ShapeToString(x) + " has [batch, sequence] [" +
                                     std::to_string(x[0]) + "," + std::to_string(x[1]) +
                                     "], scan input 0 has [" + std::to_string(s.batch) + "," +
                                     std::to_string(s.max_len) + "]");
    }
  }
  for (size_t i = 0; i < a.states; ++i) {
    const Shape& x = ctx.type(1 + i).shape;
    if (x.empty() || x[0] != s.batch) {
      return Status::InvalidArgument(ctx.where() + ": state " + std::to_string(i) + " " +
                                     ShapeToString(x) + " must have leading batch dim " +
                                     std::to_string(s.batch) + " like the scan inputs");
    }
  }
  if (ctx.present(0)) {
    const TensorType& t = ctx.type(0);
    if (t.dtype != DType::kInt64 || t.shape != Shape{s.batch}) {
      return Status::InvalidArgument(ctx.where() + ": input 0 ('sequence_lens') is " +
                                     t.ToString() + ", expected int64[" + std::to_string(s.batch) +
                                     "] (one length per batch element)");
    }
  }
  return s;
}

Shape DropLeading(const Shape& s, size_t count) { return Shape(s.begin() + count, s.end()); }

// The body's input types for one batch element: states without the batch dim, scan inputs
// without batch and sequence dims.
std::vector<TensorType> Scan8BodyTypes(const OpContext& ctx, const Scan8Attrs& a) {
  std::vector<TensorType> types;
  for (size_t i = 0; i < a.states + a.scans_in; ++i) {
    const TensorType& t = ctx.type(1 + i);
    types.push_back({t.dtype, DropLeading(t.shape, i < a.states ? 1 : 2)});
  }
  return types;
}

// Output types from the body's output types for one batch element.
Result<std::vector<TensorType>> Scan8Outputs(const OpContext& ctx, const Scan8Attrs& a,
                                             const Scan8Shape& s,
                                             const std::vector<TensorType>& body_out) {
  std::vector<TensorType> result;
  for (size_t k = 0; k < body_out.size(); ++k) {
    TensorType t = body_out[k];
    if (k < a.states && t.dtype != ctx.type(1 + k).dtype) {
      return Status::InvalidArgument(ctx.where() + ": state " + std::to_string(k) + " enters as " +
                                     ctx.type(1 + k).ToString() + " and leaves the body as " +
                                     t.ToString());
    }
    t.shape.insert(t.shape.begin(), s.batch);
    if (k >= a.states) t.shape.insert(t.shape.begin() + 1, s.max_len);
    result.push_back(std::move(t));
  }
  return result;
}

Result<std::vector<TensorType>> InferScan8(const OpContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const SubgraphRunner* runner, Runner(ctx));
  KILN_ASSIGN_OR_RETURN(const Graph* body, GraphAttr(ctx.node(), "body"));
  KILN_ASSIGN_OR_RETURN(Scan8Attrs a, ReadScan8(ctx.node(), *body));
  KILN_ASSIGN_OR_RETURN(Scan8Shape s, Scan8Dims(ctx, a));
  const std::vector<TensorType> types = Scan8BodyTypes(ctx, a);
  auto out = runner->InferBody(*body, types, std::vector<const Tensor*>(types.size(), nullptr));
  if (!out.ok()) return out.status().WithContext(ctx.where() + " body");
  return Scan8Outputs(ctx, a, s, *out);
}

Status RunScan8(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_ASSIGN_OR_RETURN(const SubgraphRunner* runner, Runner(ctx));
  KILN_ASSIGN_OR_RETURN(const Graph* body, GraphAttr(ctx.node(), "body"));
  KILN_ASSIGN_OR_RETURN(Scan8Attrs a, ReadScan8(ctx.node(), *body));
  KILN_ASSIGN_OR_RETURN(Scan8Shape s, Scan8Dims(ctx, a));
  std::vector<int64_t> lens(static_cast<size_t>(s.batch), s.max_len);
  if (ctx.present(0)) {
    const int64_t* p = ctx.in(0).data<int64_t>();
    for (int64_t b = 0; b < s.batch; ++b) {
      if (p[b] < 0 || p[b] > s.max_len) {
        return Status::InvalidArgument(
            ctx.where() + ": sequence_lens[" + std::to_string(b) + "]=" + std::to_string(p[b]) +
            " is outside [0, " + std::to_string(s.max_len) + "] (the scan inputs' sequence dim)");
      }
      lens[static_cast<size_t>(b)] = p[b];
    }
  }
  // Per batch element: the final states and the scan output slices in iteration order.
  std::vector<std::vector<Tensor>> finals(static_cast<size_t>(s.batch));
  std::vector<std::vector<std::vector<Tensor>>> slices(static_cast<size_t>(s.batch));
  std::vector<Tensor> first;  // one output of the first iteration run, per output: its type
  for (int64_t b = 0; b < s.batch; ++b) {
    std::vector<Tensor> state;
    for (size_t i = 0; i < a.states; ++i) {
      KILN_ASSIGN_OR_RETURN(Tensor v, SliceAt(ctx.in(1 + i), 0, b));
      state.push_back(std::move(v));
    }
    std::vector<Tensor> sequences;  // scan input j at batch b: [max_len, ...]
    for (size_t j = 0; j < a.scans_in; ++j) {
      KILN_ASSIGN_OR_RETURN(Tensor v, SliceAt(ctx.in(1 + a.states + j), 0, b));
      sequences.push_back(std::move(v));
    }
    const int64_t len = lens[static_cast<size_t>(b)];
    auto& mine = slices[static_cast<size_t>(b)];
    for (int64_t t = 0; t < len; ++t) {
      std::vector<Tensor> in = state;
      for (size_t j = 0; j < a.scans_in; ++j) {
        const int64_t at = a.dirs[j] == 1 ? len - 1 - t : t;
        KILN_ASSIGN_OR_RETURN(Tensor slice, SliceAt(sequences[j], 0, at));
        in.push_back(std::move(slice));
      }
      auto out = runner->RunBody(*body, in);
      if (!out.ok()) {
        return out.status().WithContext(ctx.where() + " body (batch " + std::to_string(b) +
                                        ", iteration " + std::to_string(t) + ")");
      }
      if (first.empty()) first = *out;
      for (size_t k = 0; k < out->size(); ++k) {
        const Tensor& v = (*out)[k];
        if (v.dtype() != first[k].dtype() || v.shape() != first[k].shape()) {
          return Status::InvalidArgument(
              ctx.where() + ": body output " + std::to_string(k) + " is " + v.TypeString() +
              " in batch " + std::to_string(b) + " iteration " + std::to_string(t) + " but " +
              first[k].TypeString() + " in the first iteration");
        }
      }
      for (size_t i = 0; i < a.states; ++i) state[i] = (*out)[i];
      mine.emplace_back(out->begin() + static_cast<ptrdiff_t>(a.states), out->end());
    }
    finals[static_cast<size_t>(b)] = std::move(state);
  }
  // The per-element output types: from an iteration that ran, else from the body's inference.
  std::vector<TensorType> piece;
  if (!first.empty()) {
    for (const Tensor& v : first) piece.push_back({v.dtype(), v.shape()});
  } else {
    auto inferred = runner->InferBody(*body, Scan8BodyTypes(ctx, a),
                                      std::vector<const Tensor*>(a.states + a.scans_in, nullptr));
    if (!inferred.ok()) return inferred.status().WithContext(ctx.where() + " body");
    piece = *inferred;
  }
  KILN_ASSIGN_OR_RETURN(std::vector<TensorType> types, Scan8Outputs(ctx, a, s, piece));
  for (size_t k = 0; k < types.size(); ++k) {
    for (int64_t d : types[k].shape) {
      if (d < 0) {
        return Status::Unimplemented(ctx.where() + ": output " + std::to_string(k) + " " +
                                     types[k].ToString() +
                                     " is not known: no iteration ran to give its shape");
      }
    }
    KILN_ASSIGN_OR_RETURN(Tensor result,
                          Tensor::Empty(types[k].dtype, types[k].shape, ctx.budget()));
    char* dst = static_cast<char*>(result.raw_data());
    const size_t element =
        static_cast<size_t>(NumElements(piece[k].shape)) * DTypeSize(piece[k].dtype);
    for (int64_t b = 0; b < s.batch; ++b) {
      if (k < a.states) {
        const Tensor& v = finals[static_cast<size_t>(b)][k];
        if (v.shape() != piece[k].shape) {  // a batch element that ran no iteration
          return Status::InvalidArgument(ctx.where() + ": state " + std::to_string(k) + " is " +
                                         v.TypeString() + " in batch " + std::to_string(b) +
                                         " but leaves the body as " + piece[k].ToString());
        }
        if (element > 0) std::memcpy(dst + b * element, v.raw_data(), element);
        continue;
      }
      const auto& mine = slices[static_cast<size_t>(b)];
      for (size_t t = 0; t < mine.size(); ++t) {
        const Tensor& v = mine[t][k - a.states];
        const size_t at = static_cast<size_t>(b * s.max_len) + t;
        if (element > 0) std::memcpy(dst + at * element, v.raw_data(), element);
      }
    }
    KILN_RETURN_IF_ERROR(Deliver(ctx, k, result, outputs));
  }
  return Status::OK();
}

}  // namespace

std::vector<OpDef> ControlFlowOpDefs() {
  std::vector<OpDef> defs;
  // One definition from opset 1: If-11 only relaxed branch output shapes, Loop-11/13/16 and
  // If-13/16 only widened the type constraints to sequences and optionals, which If and Loop
  // pass through (Deliver); If passes string tensors on too.
  defs.push_back({"If", "", 1, INT64_MAX, CheckIf, InferIf, RunIf});
  defs.back().values = defs.back().strings = true;
  defs.push_back({"Loop", "", 1, INT64_MAX, CheckLoop, InferLoop, RunLoop});
  defs.back().values = true;
  // Scan-8 (batch axis, sequence_lens) is a different op; Scan-9/11/16 share one form.
  defs.push_back({"Scan", "", 8, 8, CheckScan8, InferScan8, RunScan8});
  defs.push_back({"Scan", "", 9, INT64_MAX, CheckScan, InferScan, RunScan});
  return defs;
}

}  // namespace kiln
