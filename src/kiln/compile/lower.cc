// Lowering: specialized graph -> Program, one kernel per node (compile layer). See passes.h.
#include <algorithm>
#include <climits>
#include <map>
#include <memory>
#include <set>

#include "src/kiln/compile/elementwise_table.h"
#include "src/kiln/compile/passes.h"

namespace kiln {

namespace {

bool IsAliasOp(const Node& n) {
  static const std::set<std::string> kOps = {"Reshape", "Squeeze",  "Unsqueeze",
                                             "Flatten", "Identity", "Dropout"};
  // A Dropout given a training_mode input may drop (and then scales): its reference kernel
  // decides from the value.
  if (n.op_type == "Dropout" && n.HasInput(2)) return false;
  return n.domain.empty() && kOps.count(n.op_type) && !n.outputs.empty() &&
         (n.outputs.size() == 1 || n.outputs[1].empty());
}

// Kernel kind for a non-elementwise node, or kReference when the emitter has no specialization.
Kernel::Kind ChooseKind(const Node& n, int64_t opset, const std::vector<TensorType>& in,
                        const std::vector<TensorType>& out) {
  if (!n.domain.empty()) return Kernel::Kind::kReference;
  auto all_float = [&] {
    for (const auto& t : in) {
      if (t.dtype != DType::kFloat32) return false;
    }
    return true;
  };
  const std::string& op = n.op_type;
  if (op == "MatMul" && all_float() && in[0].shape.size() >= 1 && in[1].shape.size() >= 1) {
    return Kernel::Kind::kMatMul;
  }
  if (op == "Gemm" && all_float()) return Kernel::Kind::kGemm;
  if (op == "Conv" && all_float() && in[0].shape.size() == 4 && out.size() == 1) {
    return Kernel::Kind::kConv;
  }
  if ((op == "Softmax") && all_float()) {
    const int64_t rank = static_cast<int64_t>(in[0].shape.size());
    int64_t axis = n.GetInt("axis", opset >= 13 ? -1 : 1);
    if (axis < 0) axis += rank;
    // Before opset 13 Softmax flattens at `axis`; it equals the per-axis form on the last axis.
    if (rank > 0 && axis >= 0 && axis < rank && (opset >= 13 || axis == rank - 1)) {
      return Kernel::Kind::kSoftmax;
    }
  }
  // Reductions whose axes are known without an input (an attribute: ReduceSum before opset 13,
  // the others before 18; or every axis) over one contiguous block of axes: a LayerNorm as
  // exports before opset 17 write it is two ReduceMeans over the last axis.
  const bool reduce_op =
      op == "ReduceMean" || op == "ReduceMax" || op == "ReduceMin" || op == "ReduceSum";
  if (reduce_op && all_float() && in.size() == 1 && out.size() == 1 &&
      out[0].dtype == DType::kFloat32 && !in[0].shape.empty() && NumElements(in[0].shape) > 0) {
    if (auto reduced = ReducedDims(n, opset, in[0]); reduced.ok()) {
      // One contiguous block: the reduced dims are consecutive.
      const auto first = std::find(reduced->begin(), reduced->end(), true);
      const auto past = std::find(first, reduced->end(), false);
      if (first != reduced->end() && std::find(past, reduced->end(), true) == reduced->end()) {
        return Kernel::Kind::kReduce;
      }
    }
  }
  if (op == "InstanceNormalization" && all_float() && in[0].shape.size() >= 3) {
    return Kernel::Kind::kNorm;
  }
  if (op == "LayerNormalization" && all_float() && (out.size() == 1) && in.size() >= 2) {
    const int64_t rank = static_cast<int64_t>(in[0].shape.size());
    int64_t axis = n.GetInt("axis", -1);
    if (axis < 0) axis += rank;
    Shape tail(in[0].shape.begin() + axis, in[0].shape.end());
    const int64_t inner = NumElements(tail);
    bool ok = axis >= 0 && axis < rank && NumElements(in[1].shape) == inner;
    if (in.size() > 2) ok = ok && NumElements(in[2].shape) == inner;
    if (ok) return Kernel::Kind::kNorm;
  }
  if ((op == "GlobalAveragePool" || op == "GlobalMaxPool") && all_float() &&
      in[0].shape.size() == 4) {
    return Kernel::Kind::kPool;
  }
  // ceil_mode changes only the output's size for MaxPool (the generated loop clips every window
  // to the input, as padding with -inf would); AveragePool's divisor near the edge would change
  // too, so it stays a reference kernel there.
  if ((op == "MaxPool" || op == "AveragePool") && all_float() && in[0].shape.size() == 4 &&
      out.size() == 1 && n.outputs.size() == 1 && n.GetString("auto_pad", "NOTSET") == "NOTSET" &&
      (n.GetInt("ceil_mode", 0) == 0 || op == "MaxPool") &&
      n.GetInts("kernel_shape", {}).size() == 2 && n.GetInts("pads", {0, 0, 0, 0}).size() == 4 &&
      n.GetInts("strides", {1, 1}).size() == 2 &&
      n.GetInts("dilations", {1, 1}) == std::vector<int64_t>{1, 1}) {
    return Kernel::Kind::kPool;
  }
  if (op == "Transpose" && in[0].shape.size() <= 6) return Kernel::Kind::kTranspose;
  if (op == "Concat" && !in.empty() && out.size() == 1 && n.HasAttr("axis")) {
    bool same = true;
    for (const auto& t : in)
      same = same && t.dtype == out[0].dtype && t.shape.size() == out[0].shape.size();
    if (same && !out[0].shape.empty()) return Kernel::Kind::kConcat;
  }
  return Kernel::Kind::kReference;
}

// Gather whose indices are a structural constant (never a weight: law 1), all in range.
bool IsConstGather(const Program& p, const Node& n, const std::vector<int>& ins,
                   const std::vector<TensorType>& in) {
  if (!n.domain.empty() || n.op_type != "Gather" || ins.size() != 2 || ins[0] < 0 || ins[1] < 0 ||
      in.size() != 2) {
    return false;
  }
  const Buffer& idx = p.buffers[static_cast<size_t>(p.Root(ins[1]))];
  if (idx.kind != Buffer::Kind::kConst || !idx.value.valid()) return false;
  if (idx.value.dtype() != DType::kInt64 && idx.value.dtype() != DType::kInt32) return false;
  const int64_t rank = static_cast<int64_t>(in[0].shape.size());
  int64_t axis = n.GetInt("axis", 0);
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= rank || idx.value.numel() > 4096) return false;
  const int64_t dim = in[0].shape[static_cast<size_t>(axis)];
  for (int64_t i = 0; i < idx.value.numel(); ++i) {
    const int64_t v = idx.value.GetAsInt64(i);
    if (v < -dim || v >= dim) return false;
  }
  return true;
}

// Resize (opset >= 11) in nearest mode by structural integer scales, where every output index
// maps to floor(out / scale): asymmetric coordinates with floor rounding, or half_pixel
// coordinates (with an integer scale the source coordinate is never a tie, so every rounding
// mode gives the floor).
bool IsIntegerNearestResize(const Program& p, const Node& n, int64_t opset,
                            const std::vector<int>& ins, const std::vector<TensorType>& out) {
  if (!n.domain.empty() || n.op_type != "Resize" || opset < 11 || ins.size() < 3 || ins[0] < 0 ||
      ins[2] < 0 || (ins.size() > 3 && ins[3] >= 0) || out.size() != 1 || n.HasAttr("axes")) {
    return false;
  }
  if (n.GetString("mode", "nearest") != "nearest") return false;
  const std::string ctm = n.GetString("coordinate_transformation_mode", "half_pixel");
  const std::string nm = n.GetString("nearest_mode", "round_prefer_floor");
  // Output o = q f + r reads source q when: half-pixel centres ((o + 1/2) / f - 1/2 = q +
  // (r + 1/2) / f - 1/2, strictly within half a pixel of q) are rounded to the nearest, either
  // way at ties (there are none); asymmetric ones (o / f = q + r / f) are floored. Half-pixel
  // centres floored or ceiled move to q - 1 or q + 1 for some r.
  const bool rounded = nm == "round_prefer_floor" || nm == "round_prefer_ceil";
  if (!(((ctm == "half_pixel" || ctm == "pytorch_half_pixel") && rounded) ||
        (ctm == "asymmetric" && nm == "floor"))) {
    return false;
  }
  const Buffer& x = p.buffers[static_cast<size_t>(ins[0])];
  const Buffer& sc = p.buffers[static_cast<size_t>(p.Root(ins[2]))];
  if (sc.kind != Buffer::Kind::kConst || !sc.value.valid() || sc.value.dtype() != DType::kFloat32) {
    return false;
  }
  const Shape& in = x.type.shape;
  if (in.empty() || sc.value.numel() != static_cast<int64_t>(in.size()) ||
      out[0].shape.size() != in.size() || out[0].dtype != x.type.dtype) {
    return false;
  }
  for (size_t d = 0; d < in.size(); ++d) {
    const float s = sc.value.data<float>()[d];
    if (!(s >= 1.0f && s <= 1024.0f) || s != static_cast<float>(static_cast<int64_t>(s))) {
      return false;
    }
    if (out[0].shape[d] != in[d] * static_cast<int64_t>(s)) return false;
  }
  return true;
}

// Every output slot's type as the op's shape function gives it, omitted optional outputs
// included: InferShapes records only named values, but a reference kernel may still write an
// omitted output, so its placeholder buffer needs the real size.
Result<std::vector<TensorType>> AllOutputTypes(const Node& n, int64_t opset,
                                               const InferredGraph& inf) {
  KILN_ASSIGN_OR_RETURN(const OpDef* def, OpRegistry::Global().Find(n.domain, n.op_type, opset));
  std::vector<TensorType> types;
  std::vector<const Tensor*> values;
  std::vector<bool> present;
  for (const std::string& in : n.inputs) {
    present.push_back(!in.empty());
    types.push_back(in.empty() ? TensorType{} : inf.types.at(in));
    auto k = in.empty() ? inf.known.end() : inf.known.find(in);
    values.push_back(k == inf.known.end() ? nullptr : &k->second);
  }
  OpContext ctx(n, opset, types, values, present);
  return def->infer(ctx);
}

// The data-dependent nodes (those whose outputs `inf` lists as dynamic) as one graph: its inputs
// are every value the nodes read from outside (typed, so the host can bind them; weights among
// them arrive at run time, never in the spec), its outputs the graph outputs they compute.
Result<Graph> DynamicRegionBody(const Graph& graph, const InferredGraph& inf,
                                const std::vector<const Node*>& region) {
  Graph body;
  body.name = "dynamic_region";
  body.opsets = graph.opsets;
  std::set<std::string> defined, seen;
  for (const Node* n : region) {
    for (const std::string& o : n->outputs) {
      if (!o.empty()) defined.insert(o);
    }
  }
  auto read = [&](const std::string& name) -> Status {
    if (name.empty() || defined.count(name) || !seen.insert(name).second) return Status::OK();
    auto t = inf.types.find(name);
    if (t == inf.types.end()) {
      return Status::Internal("dynamic region reads '" + name + "', which has no static type");
    }
    ValueInfo v;
    v.name = name;
    v.dtype = t->second.dtype;
    v.has_shape = true;
    for (int64_t d : t->second.shape) v.dims.push_back(Dim{d, ""});
    body.inputs.push_back(std::move(v));
    return Status::OK();
  };
  for (const Node* n : region) {
    for (const std::string& in : n->inputs) KILN_RETURN_IF_ERROR(read(in));
    for (const std::string& in : ImplicitInputs(*n)) KILN_RETURN_IF_ERROR(read(in));
    body.nodes.push_back(*n);
  }
  for (const ValueInfo& out : graph.outputs) {
    if (!inf.dynamic.count(out.name)) continue;
    if (!out.has_type) {
      return Status::Unimplemented("graph output '" + out.name +
                                   "' has a data-dependent shape and no declared element type; "
                                   "a compiled cell must declare each output's dtype");
    }
    ValueInfo v;
    v.name = out.name;
    v.dtype = out.dtype;
    body.outputs.push_back(std::move(v));
  }
  return body;
}

}  // namespace

Result<Program> LowerToProgram(const Graph& graph) {
  KILN_ASSIGN_OR_RETURN(InferredGraph inf, InferShapes(graph, {}, /*tolerate_dynamic=*/true));
  Program p;
  std::map<std::string, int> value;  // graph value name -> buffer id
  for (size_t i = 0; i < graph.inputs.size(); ++i) {
    const ValueInfo& v = graph.inputs[i];
    Buffer b;
    b.name = v.name;
    b.type = inf.types.at(v.name);
    b.kind = Buffer::Kind::kInput;
    b.index = static_cast<int>(i);
    value[v.name] = p.AddBuffer(b);
    p.inputs.push_back(value[v.name]);
    p.input_names.push_back(v.name);
  }
  // Constant table: every weight the graph binds, sorted by name (law 2: complete table).
  for (const std::string& name : graph.WeightNames()) {
    Buffer b;
    b.name = name;
    b.type = {graph.initializers.at(name).dtype(), graph.initializers.at(name).shape()};
    b.kind = Buffer::Kind::kWeight;
    b.index = static_cast<int>(p.weights.size());
    value[name] = p.AddBuffer(b);
    p.weights.push_back(value[name]);
  }
  int const_slots = 0;
  for (const auto& [name, t] : graph.initializers) {
    if (graph.IsWeight(name)) continue;
    Buffer b;
    b.name = name;
    b.type = {t.dtype(), t.shape()};
    b.kind = Buffer::Kind::kConst;
    b.index = const_slots++;
    b.value = t;
    value[name] = p.AddBuffer(b);
  }

  // Nodes whose shapes depend on input values run last, as one region: nothing compiled reads
  // what they compute (tolerant inference made every reader dynamic too).
  std::vector<const Node*> region;
  for (const Node& n : graph.nodes) {
    bool dynamic = false;
    for (const std::string& o : n.outputs) dynamic = dynamic || inf.dynamic.count(o);
    if (dynamic) {
      region.push_back(&n);
      continue;
    }
    const int64_t opset = graph.opset(n.domain);
    std::vector<TensorType> in_types, out_types;
    std::vector<int> ins;
    for (const std::string& in : n.inputs) {
      if (in.empty()) {
        ins.push_back(-1);
        continue;
      }
      ins.push_back(value.at(in));
      in_types.push_back(inf.types.at(in));
    }
    std::vector<TensorType> used_out_types;  // named outputs only
    for (const std::string& out : n.outputs) {
      out_types.push_back(out.empty() ? TensorType{} : inf.types.at(out));
      if (!out.empty()) used_out_types.push_back(inf.types.at(out));
    }
    if (std::find(n.outputs.begin(), n.outputs.end(), std::string()) != n.outputs.end()) {
      KILN_ASSIGN_OR_RETURN(std::vector<TensorType> all, AllOutputTypes(n, opset, inf));
      for (size_t i = 0; i < n.outputs.size() && i < all.size(); ++i) {
        if (n.outputs[i].empty()) out_types[i] = all[i];
      }
    }
    if (IsAliasOp(n) && !in_types.empty() && out_types[0].dtype == in_types[0].dtype) {
      Buffer b;
      b.name = n.outputs[0];
      b.type = out_types[0];
      b.kind = Buffer::Kind::kTemp;
      b.alias_of = ins[0];
      value[n.outputs[0]] = p.AddBuffer(b);
      continue;
    }
    Kernel k;
    k.node = n;
    k.opset = opset;
    k.label = n.op_type;
    const bool all_present = std::find(ins.begin(), ins.end(), -1) == ins.end();
    const FusableElementwise* ew =
        all_present ? LookupElementwise(n, opset, in_types, out_types) : nullptr;
    if (ew == nullptr && n.op_type == "Clip" && n.domain.empty() && !ins.empty()) {
      // Clip-11 with omitted min or max is still elementwise: absent bounds are infinite.
      std::vector<TensorType> present;
      for (size_t i = 0; i < ins.size(); ++i) {
        if (ins[i] >= 0) present.push_back(inf.types.at(n.inputs[i]));
      }
      bool scalar_bounds = true;
      for (size_t i = 1; i < ins.size(); ++i) {
        if (ins[i] >= 0 && NumElements(inf.types.at(n.inputs[i]).shape) != 1) scalar_bounds = false;
      }
      if (opset >= 11 && scalar_bounds && in_types[0].dtype == DType::kFloat32) {
        ew = LookupElementwise(n, opset, {in_types[0]}, out_types);
      }
    }
    if (ew != nullptr) {
      k.kind = Kernel::Kind::kFused;
      std::vector<int> operands;
      for (size_t i = 0; i < ins.size(); ++i) {
        if (ins[i] < 0) {
          operands.push_back(0);  // placeholder for an absent Clip bound (never read)
          continue;
        }
        const int slot = static_cast<int>(k.inputs.size());
        k.inputs.push_back(ins[i]);
        operands.push_back(-(slot + 1));
      }
      // Absent Clip bounds: mark with a sentinel the emitter prints as +-inf.
      for (size_t i = 0; i < ins.size(); ++i) {
        if (ins[i] < 0) operands[i] = INT32_MIN;
      }
      KILN_ASSIGN_OR_RETURN(Expr e, MakeExpr(n, opset, operands, out_types[0].dtype));
      k.exprs.push_back(e);
      k.output_exprs.push_back(0);
    } else {
      k.kind = all_present || n.op_type == "Conv" || n.op_type == "Gemm" ||
                       n.op_type == "LayerNormalization"
                   ? ChooseKind(n, opset, in_types, used_out_types)
                   : Kernel::Kind::kReference;
      if (k.kind == Kernel::Kind::kConv || k.kind == Kernel::Kind::kGemm ||
          k.kind == Kernel::Kind::kNorm) {
        // Optional inputs (bias, C) may be absent: keep slots aligned with -1 removed but
        // record presence through the node's inputs.
        for (int id : ins) {
          if (id >= 0) k.inputs.push_back(id);
        }
      } else if (k.kind == Kernel::Kind::kReference &&
                 IsIntegerNearestResize(p, n, opset, ins, used_out_types)) {
        k.kind = Kernel::Kind::kResize;
        k.inputs = {ins[0]};
      } else if (k.kind == Kernel::Kind::kReference && IsConstGather(p, n, ins, in_types)) {
        k.kind = Kernel::Kind::kGather;
        k.inputs = ins;
      } else if (k.kind == Kernel::Kind::kReference) {
        for (int id : ins) k.inputs.push_back(id);  // -1 marks an absent input
        // A node that owns subgraphs (If, Loop) also reads, by name, every outer value its
        // subgraphs use: they follow its own inputs, in ImplicitInputs order (the node spec
        // names them), so liveness and memory planning see those reads too.
        for (const std::string& name : ImplicitInputs(n)) k.inputs.push_back(value.at(name));
      } else {
        for (int id : ins) {
          if (id >= 0) k.inputs.push_back(id);
        }
      }
    }
    for (size_t i = 0; i < n.outputs.size(); ++i) {
      Buffer b;
      b.name = n.outputs[i].empty() ? n.Describe() + ":unused" + std::to_string(i) : n.outputs[i];
      b.type = out_types[i];
      // An unused optional output still needs memory when the reference kernel writes it.
      if (n.outputs[i].empty() && k.kind != Kernel::Kind::kReference) continue;
      const int id = p.AddBuffer(b);
      if (!n.outputs[i].empty()) value[n.outputs[i]] = id;
      k.outputs.push_back(id);
    }
    p.kernels.push_back(std::move(k));
  }

  // The dynamic region: one reference kernel whose body the host runs eagerly, writing each
  // data-dependent graph output through its slot's kiln_dynamic_output.
  std::map<size_t, int> dynamic_out;  // graph output index -> buffer
  if (!region.empty()) {
    KILN_ASSIGN_OR_RETURN(Graph body, DynamicRegionBody(graph, inf, region));
    Kernel k;
    k.kind = Kernel::Kind::kReference;
    k.label = "DynamicRegion[";
    for (size_t i = 0; i < region.size(); ++i) k.label += (i ? "," : "") + region[i]->op_type;
    k.label += "]";
    k.node.op_type = kDynamicRegionOp;
    k.node.domain = kDynamicRegionDomain;
    k.node.name = "dynamic_region";
    Attribute a;
    a.kind = Attribute::Kind::kGraph;
    a.g = std::make_shared<Graph>(body);
    k.node.attrs["body"] = a;
    k.opset = 1;
    for (const ValueInfo& in : body.inputs) {
      k.node.inputs.push_back(in.name);
      k.inputs.push_back(value.at(in.name));
    }
    for (size_t i = 0; i < graph.outputs.size(); ++i) {
      if (!inf.dynamic.count(graph.outputs[i].name)) continue;
      Buffer b;
      b.name = graph.outputs[i].name;
      b.type = TensorType{graph.outputs[i].dtype, {}};
      b.dynamic = true;
      b.output_slot = static_cast<int>(i);
      const int id = p.AddBuffer(b);
      k.node.outputs.push_back(graph.outputs[i].name);
      k.outputs.push_back(id);
      dynamic_out[i] = id;
    }
    p.kernels.push_back(std::move(k));
  }

  // Graph outputs: a temp is written straight into the caller's buffer; anything else (an input,
  // a constant, a view, a value listed twice) is copied there by an Identity kernel.
  std::set<int> claimed;
  for (size_t i = 0; i < graph.outputs.size(); ++i) {
    if (dynamic_out.count(i)) {
      p.outputs.push_back(dynamic_out.at(i));
      p.output_names.push_back(graph.outputs[i].name);
      continue;
    }
    int id = value.at(graph.outputs[i].name);
    Buffer& b = p.buffers[static_cast<size_t>(id)];
    if (b.kind == Buffer::Kind::kTemp && b.alias_of < 0 && !claimed.count(id)) {
      b.output_slot = static_cast<int>(i);
    } else {
      Buffer copy;
      copy.name = graph.outputs[i].name + ":out";
      copy.type = b.type;
      copy.output_slot = static_cast<int>(i);
      const int cid = p.AddBuffer(copy);
      Kernel k;
      k.kind = Kernel::Kind::kFused;
      k.label = "Identity";
      k.inputs = {id};
      Expr e;
      e.op = "Identity";
      e.operands = {-1};
      e.dtype = copy.type.dtype;
      k.exprs = {e};
      k.output_exprs = {0};
      k.outputs = {cid};
      p.kernels.push_back(std::move(k));
      id = cid;
    }
    claimed.insert(id);
    p.outputs.push_back(id);
    p.output_names.push_back(graph.outputs[i].name);
  }
  KILN_RETURN_IF_ERROR(p.Verify());
  return p;
}

}  // namespace kiln
