// The op registry and the helpers family files share (ops layer).
#include "src/kiln/ops/registry.h"

#include <algorithm>
#include <set>

namespace kiln {

OpContext::OpContext(const Node& node, int64_t opset, std::vector<TensorType> types,
                     std::vector<const Tensor*> values, std::vector<bool> present, int num_threads)
    : node_(node),
      opset_(opset),
      types_(std::move(types)),
      values_(std::move(values)),
      present_(std::move(present)),
      num_threads_(num_threads) {
  values_.resize(types_.size(), nullptr);
  present_.resize(types_.size(), false);
}

Result<const Tensor*> OpContext::RequireValue(size_t i, const std::string& role) const {
  if (!present(i)) {
    return Status::InvalidArgument(where() + ": input " + std::to_string(i) + " ('" + role +
                                   "') is required but absent");
  }
  if (value(i) == nullptr) {
    return Status::Refused(StatusCode::kInvalidArgument, kRefusalValueDependent,
                           where() + ": input " + std::to_string(i) + " ('" + role + "', value '" +
                               node_.inputs[i] + "') must be a constant known before run");
  }
  return value(i);
}

bool IsValueDependent(const Status& s) { return s.Is(kRefusalValueDependent); }

Status CheckValueKinds(const OpDef& def, const Node& node, const std::vector<TensorType>& types) {
  for (size_t i = 0; i < types.size(); ++i) {
    if (types[i].kind != ValueKind::kTensor && !def.values) {
      return Status::Unimplemented(node.Describe() + ": input or output " + std::to_string(i) +
                                   " is a " + ValueKindName(types[i].kind) + "; " + node.op_type +
                                   " takes tensors only");
    }
    if (types[i].dtype == DType::kString && !def.strings) {
      return Status::Unimplemented(node.Describe() + ": input or output " + std::to_string(i) +
                                   " is a string tensor; " + node.op_type +
                                   " does not take strings");
    }
  }
  return Status::OK();
}

const OpRegistry& OpRegistry::Global() {
  static const OpRegistry* registry = [] {
    auto* r = new OpRegistry();
    // The catalogue, family by family in this order; each family file only lists its OpDefs.
    for (auto family :
         {ElementwiseOpDefs, ReduceOpDefs,      MatMulOpDefs,   ConvOpDefs,      PoolOpDefs,
          NormOpDefs,        ShapeOpDefs,       QuantOpDefs,    RecurrentOpDefs, ResizeOpDefs,
          IndexOpDefs,       ControlFlowOpDefs, MathOpDefs,     LossOpDefs,      SignalOpDefs,
          VisionOpDefs,      TensorOpDefs,      TrainingOpDefs, RandomOpDefs,    SequenceOpDefs}) {
      for (OpDef& def : family()) r->Register(std::move(def));
    }
    return r;
  }();
  return *registry;
}

void OpRegistry::Register(OpDef def) {
  KILN_CHECK(def.infer != nullptr && def.run != nullptr);
  auto& list = defs_[{def.domain, def.op_type}];
  for (const OpDef& d : list) {
    KILN_CHECK(def.until_version < d.since_version || def.since_version > d.until_version);
  }
  list.push_back(std::move(def));
}

Result<const OpDef*> OpRegistry::Find(const std::string& domain, const std::string& op_type,
                                      int64_t opset) const {
  const std::string dom = domain == "ai.onnx" ? "" : domain;
  auto it = defs_.find({dom, op_type});
  const std::string qualified = (dom.empty() ? "" : dom + ".") + op_type;
  if (it == defs_.end()) {
    return Status::Unimplemented("op " + qualified +
                                 " is not supported by kiln (no kernel for "
                                 "this op type in domain '" +
                                 (dom.empty() ? "ai.onnx" : dom) + "')");
  }
  std::string ranges;
  for (const OpDef& d : it->second) {
    if (opset >= d.since_version && opset <= d.until_version) return &d;
    ranges += (ranges.empty() ? "" : ", ") + std::to_string(d.since_version) + "-" +
              (d.until_version == INT64_MAX ? std::string("") : std::to_string(d.until_version));
  }
  return Status::Unimplemented("op " + qualified + " at opset " + std::to_string(opset) +
                               " is not supported (supported opsets: " + ranges + ")");
}

std::vector<std::string> OpRegistry::OpTypes(bool all_domains) const {
  std::set<std::string> names;
  for (const auto& [key, list] : defs_) {
    if (key.first.empty() || all_domains) names.insert(key.second);
  }
  return {names.begin(), names.end()};
}

Result<std::vector<TensorType>> InferSameAsInput0(const OpContext& ctx) {
  if (!ctx.present(0)) return Status::InvalidArgument(ctx.where() + ": input 0 is absent");
  return std::vector<TensorType>{ctx.type(0)};
}

Result<std::vector<TensorType>> InferBroadcast(const OpContext& ctx) {
  Shape shape;
  DType dtype = DType::kFloat32;
  bool first = true;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    if (!ctx.present(i)) continue;
    if (first) {
      shape = ctx.type(i).shape;
      dtype = ctx.type(i).dtype;
      first = false;
      continue;
    }
    if (ctx.type(i).dtype != dtype) {
      return Status::InvalidArgument(ctx.where() + ": input " + std::to_string(i) + " has dtype " +
                                     DTypeName(ctx.type(i).dtype) + ", expected " +
                                     DTypeName(dtype) + " like input 0");
    }
    auto b = BroadcastShapes(shape, ctx.type(i).shape);
    if (!b.ok()) return b.status().WithContext(ctx.where());
    shape = *b;
  }
  if (first) return Status::InvalidArgument(ctx.where() + ": no inputs");
  return std::vector<TensorType>{{dtype, shape}};
}

Status CheckArity(const Node& node, size_t min_inputs, size_t max_inputs, size_t max_outputs) {
  if (node.inputs.size() < min_inputs || node.inputs.size() > max_inputs) {
    return Status::InvalidArgument(
        node.Describe() + ": has " + std::to_string(node.inputs.size()) + " inputs, expected " +
        (min_inputs == max_inputs
             ? std::to_string(min_inputs)
             : std::to_string(min_inputs) + " to " + std::to_string(max_inputs)));
  }
  for (size_t i = 0; i < min_inputs; ++i) {
    if (node.inputs[i].empty()) {
      return Status::InvalidArgument(node.Describe() + ": required input " + std::to_string(i) +
                                     " is empty");
    }
  }
  if (node.outputs.empty() || node.outputs.size() > max_outputs) {
    return Status::InvalidArgument(node.Describe() + ": has " +
                                   std::to_string(node.outputs.size()) +
                                   " outputs, expected 1 to " + std::to_string(max_outputs));
  }
  return Status::OK();
}

Status UnsupportedDType(const OpContext& ctx, DType dtype, const char* supported) {
  return Status::Unimplemented(ctx.where() + ": dtype " + DTypeName(dtype) +
                               " is not supported (supported: " + supported + ")");
}

}  // namespace kiln
