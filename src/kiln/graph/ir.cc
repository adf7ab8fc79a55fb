// Graph IR helpers: attribute accessors with named errors (graph layer).
#include "src/kiln/graph/ir.h"

#include <algorithm>

namespace kiln {

const char* AttributeKindName(Attribute::Kind kind) {
  switch (kind) {
    case Attribute::Kind::kFloat:
      return "float";
    case Attribute::Kind::kInt:
      return "int";
    case Attribute::Kind::kString:
      return "string";
    case Attribute::Kind::kTensor:
      return "tensor";
    case Attribute::Kind::kGraph:
      return "graph";
    case Attribute::Kind::kFloats:
      return "floats";
    case Attribute::Kind::kInts:
      return "ints";
    case Attribute::Kind::kStrings:
      return "strings";
    case Attribute::Kind::kGraphs:
      return "graphs";
    case Attribute::Kind::kType:
      return "type";
  }
  return "?";
}

std::string Node::Describe() const {
  if (!name.empty()) return op_type + " '" + name + "'";
  if (!outputs.empty()) return op_type + " (output '" + outputs[0] + "')";
  return op_type + " (unnamed)";
}

namespace {

Result<const Attribute*> Lookup(const Node& n, const std::string& attr, Attribute::Kind kind) {
  auto it = n.attrs.find(attr);
  if (it == n.attrs.end()) {
    return Status::InvalidArgument(n.Describe() + ": required attribute '" + attr + "' is missing");
  }
  if (it->second.kind != kind) {
    return Status::InvalidArgument(n.Describe() + ": attribute '" + attr + "' is " +
                                   AttributeKindName(it->second.kind) + ", expected " +
                                   AttributeKindName(kind));
  }
  return &it->second;
}

const Attribute* LookupOpt(const Node& n, const std::string& attr, Attribute::Kind kind) {
  auto it = n.attrs.find(attr);
  if (it == n.attrs.end() || it->second.kind != kind) return nullptr;
  return &it->second;
}

}  // namespace

Result<int64_t> Node::GetInt(const std::string& attr) const {
  KILN_ASSIGN_OR_RETURN(const Attribute* a, Lookup(*this, attr, Attribute::Kind::kInt));
  return a->i;
}
int64_t Node::GetInt(const std::string& attr, int64_t dflt) const {
  const Attribute* a = LookupOpt(*this, attr, Attribute::Kind::kInt);
  return a ? a->i : dflt;
}
Result<float> Node::GetFloat(const std::string& attr) const {
  KILN_ASSIGN_OR_RETURN(const Attribute* a, Lookup(*this, attr, Attribute::Kind::kFloat));
  return a->f;
}
float Node::GetFloat(const std::string& attr, float dflt) const {
  const Attribute* a = LookupOpt(*this, attr, Attribute::Kind::kFloat);
  return a ? a->f : dflt;
}
Result<std::string> Node::GetString(const std::string& attr) const {
  KILN_ASSIGN_OR_RETURN(const Attribute* a, Lookup(*this, attr, Attribute::Kind::kString));
  return a->s;
}
std::string Node::GetString(const std::string& attr, const std::string& dflt) const {
  const Attribute* a = LookupOpt(*this, attr, Attribute::Kind::kString);
  return a ? a->s : dflt;
}
Result<std::vector<int64_t>> Node::GetInts(const std::string& attr) const {
  KILN_ASSIGN_OR_RETURN(const Attribute* a, Lookup(*this, attr, Attribute::Kind::kInts));
  return a->ints;
}
std::vector<int64_t> Node::GetInts(const std::string& attr, std::vector<int64_t> dflt) const {
  const Attribute* a = LookupOpt(*this, attr, Attribute::Kind::kInts);
  return a ? a->ints : dflt;
}
Result<std::vector<float>> Node::GetFloats(const std::string& attr) const {
  KILN_ASSIGN_OR_RETURN(const Attribute* a, Lookup(*this, attr, Attribute::Kind::kFloats));
  return a->floats;
}
Result<Tensor> Node::GetTensor(const std::string& attr) const {
  KILN_ASSIGN_OR_RETURN(const Attribute* a, Lookup(*this, attr, Attribute::Kind::kTensor));
  return a->t;
}

std::string ValueInfo::ShapeString() const {
  if (!has_shape) return "[?]";
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) s += ",";
    if (dims[i].known()) {
      s += std::to_string(dims[i].value);
    } else {
      s += dims[i].param.empty() ? "?" : dims[i].param;
    }
  }
  return s + "]";
}

int64_t Graph::opset(const std::string& domain) const {
  auto it = opsets.find(domain == "ai.onnx" ? "" : domain);
  return it == opsets.end() ? 1 : it->second;
}

bool IsShapeInput(const std::string& domain, const std::string& op_type, size_t index) {
  if (!domain.empty()) return false;
  if (op_type == "Resize") return index == 1 || index == 2;
  if (op_type == "Upsample") return index == 1;
  if (op_type == "Range") return index <= 2;
  if (op_type == "OneHot") return index == 1;  // depth
  // Dropout's ratio decides what the op computes (with training_mode true, only a ratio of 0 is
  // deterministic): a hyperparameter of the graph, never checkpoint data.
  if (op_type == "Dropout") return index == 1;
  return false;
}

bool IsInt32WeightInput(const std::string& domain, const std::string& op_type, size_t index) {
  if (!domain.empty()) return false;
  if (op_type == "QLinearConv") return index == 8;
  if (op_type == "DequantizeLinear") return index == 0;
  return false;
}

bool Graph::IsWeight(const std::string& name) const {
  auto it = initializers.find(name);
  if (it == initializers.end()) return false;
  if (it->second.dtype() == DType::kInt32 && int32_weights.count(name)) return true;
  return IsWeightDType(it->second.dtype()) && !structural_floats.count(name);
}

std::vector<std::string> Graph::WeightNames() const {
  std::vector<std::string> names;
  for (const auto& [name, t] : initializers) {
    if (IsWeight(name)) names.push_back(name);
  }
  return names;
}

bool HasSubgraphs(const Node& node) {
  for (const auto& [name, a] : node.attrs) {
    if (a.kind == Attribute::Kind::kGraph || a.kind == Attribute::Kind::kGraphs) return true;
  }
  return false;
}

std::vector<const Graph*> Subgraphs(const Node& node) {
  std::vector<const Graph*> out;
  for (const auto& [name, a] : node.attrs) {
    if (a.kind == Attribute::Kind::kGraph && a.g) out.push_back(a.g.get());
    if (a.kind == Attribute::Kind::kGraphs) {
      for (const auto& g : a.graphs) {
        if (g) out.push_back(g.get());
      }
    }
  }
  return out;
}

std::vector<std::string> OuterReferences(const Graph& graph) {
  std::set<std::string> defined, refs;
  for (const ValueInfo& v : graph.inputs) defined.insert(v.name);
  for (const auto& [name, t] : graph.initializers) defined.insert(name);
  auto use = [&](const std::string& name) {
    if (!name.empty() && !defined.count(name)) refs.insert(name);
  };
  for (const Node& n : graph.nodes) {
    for (const std::string& in : n.inputs) use(in);
    for (const std::string& in : ImplicitInputs(n)) use(in);
    for (const std::string& out : n.outputs) {
      if (!out.empty()) defined.insert(out);
    }
  }
  for (const ValueInfo& v : graph.outputs) use(v.name);
  return {refs.begin(), refs.end()};
}

std::vector<std::string> ImplicitInputs(const Node& node) {
  std::set<std::string> refs;
  for (const Graph* g : Subgraphs(node)) {
    for (std::string& r : OuterReferences(*g)) refs.insert(std::move(r));
  }
  return {refs.begin(), refs.end()};
}

const ValueInfo* Graph::FindInput(const std::string& name) const {
  for (const ValueInfo& v : inputs) {
    if (v.name == name) return &v;
  }
  return nullptr;
}

}  // namespace kiln
