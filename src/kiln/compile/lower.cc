// Lowering: specialized graph -> Program, one kernel per node (compile layer). See passes.h.
#include <algorithm>
#include <climits>
#include <map>
#include <set>

#include "src/kiln/compile/elementwise_table.h"
#include "src/kiln/compile/passes.h"

namespace kiln {

namespace {

bool IsAliasOp(const Node& n) {
  static const std::set<std::string> kOps = {"Reshape", "Squeeze", "Unsqueeze", "Flatten",
                                             "Identity", "Dropout"};
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
  if (op == "InstanceNormalization" && all_float() && in[0].shape.size() >= 3) {
    return Kernel::Kind::kNorm;
  }
  if (op == "LayerNormalization" && all_float() &&
      (out.size() == 1) && in.size() >= 2) {
    const int64_t rank = static_cast<int64_t>(in[0].shape.size());
    int64_t axis = n.GetInt("axis", -1);
    if (axis < 0) axis += rank;
    Shape tail(in[0].shape.begin() + axis, in[0].shape.end());
    const int64_t inner = NumElements(tail);
    bool ok = axis >= 0 && axis < rank && NumElements(in[1].shape) == inner;
    if (in.size() > 2) ok = ok && NumElements(in[2].shape) == inner;
    if (ok) return Kernel::Kind::kNorm;
  }
  if (op == "Transpose" && in[0].shape.size() <= 6) return Kernel::Kind::kTranspose;
  return Kernel::Kind::kReference;
}

}  // namespace

Result<Program> LowerToProgram(const Graph& graph) {
  KILN_ASSIGN_OR_RETURN(InferredGraph inf, InferShapes(graph, {}));
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

  for (const Node& n : graph.nodes) {
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
    const ElementwiseOp* ew =
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
      } else if (k.kind == Kernel::Kind::kReference) {
        for (int id : ins) k.inputs.push_back(id);  // -1 marks an absent input
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

  // Graph outputs: a temp is written straight into the caller's buffer; anything else (an input,
  // a constant, a view, a value listed twice) is copied there by an Identity kernel.
  std::set<int> claimed;
  for (size_t i = 0; i < graph.outputs.size(); ++i) {
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
