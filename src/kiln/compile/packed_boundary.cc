// Packing a graph's non-tensor edges for a compiled cell (compile layer; see packed_boundary.h).
#include "src/kiln/compile/packed_boundary.h"

#include "src/kiln/ops/registry.h"
#include "src/kiln/tensor/packed_value.h"

namespace kiln {
namespace {

bool Packed(const ValueInfo& v) {
  return v.kind != ValueKind::kTensor || v.dtype == DType::kString;
}

ValueInfo BytesInfo(const std::string& name) {
  ValueInfo v;
  v.name = name;
  v.dtype = DType::kUInt8;
  v.has_shape = true;
  v.dims = {Dim{-1, "packed_bytes"}};
  return v;
}

}  // namespace

bool NeedsPackedBoundary(const Graph& graph) {
  for (const auto* list : {&graph.inputs, &graph.outputs}) {
    for (const ValueInfo& v : *list) {
      if (Packed(v)) return true;
    }
  }
  return false;
}

Result<PackedBoundary> PackBoundary(const Graph& graph) {
  PackedBoundary b;
  b.graph = graph;
  if (!NeedsPackedBoundary(graph)) return b;
  Graph& g = b.graph;
  g.opsets[kInternalDomain] = 1;
  std::vector<Node> unpack;
  for (ValueInfo& v : g.inputs) {
    if (!Packed(v)) continue;
    if (!v.has_type) {
      return Status::InvalidArgument("graph input '" + v.name + "' declares no element type");
    }
    b.inputs.push_back(v);
    Node n;
    n.op_type = kUnpackValueOp;
    n.domain = kInternalDomain;
    n.inputs = {v.name + kPackedSuffix};
    n.outputs = {v.name};
    Attribute kind, dtype;
    kind.kind = Attribute::Kind::kInt;
    kind.i = static_cast<int64_t>(v.kind);
    dtype.kind = Attribute::Kind::kString;
    dtype.s = DTypeName(v.dtype);
    n.attrs = {{"kind", kind}, {"dtype", dtype}};
    unpack.push_back(std::move(n));
    v = BytesInfo(v.name + kPackedSuffix);
  }
  g.nodes.insert(g.nodes.begin(), unpack.begin(), unpack.end());
  for (ValueInfo& v : g.outputs) {
    if (!Packed(v)) continue;
    b.outputs.push_back(v);
    Node n;
    n.op_type = kPackValueOp;
    n.domain = kInternalDomain;
    n.inputs = {v.name};
    n.outputs = {v.name + kPackedSuffix};
    g.nodes.push_back(std::move(n));
    v = BytesInfo(v.name + kPackedSuffix);
  }
  return b;
}

Result<TensorMap> PackInputs(const PackedBoundary& b, const TensorMap& inputs) {
  TensorMap out = inputs;
  for (const ValueInfo& v : b.inputs) {
    auto it = out.find(v.name);
    if (it == out.end()) continue;  // missing: the cell's input check names it
    KILN_ASSIGN_OR_RETURN(Tensor bytes, PackValue(it->second));
    out.erase(it);
    out[v.name + kPackedSuffix] = std::move(bytes);
  }
  return out;
}

Result<TensorMap> UnpackOutputs(const PackedBoundary& b, const TensorMap& outputs) {
  TensorMap out = outputs;
  for (const ValueInfo& v : b.outputs) {
    auto it = out.find(v.name + kPackedSuffix);
    if (it == out.end()) {
      return Status::Internal("output '" + v.name + kPackedSuffix + "' was not produced");
    }
    auto value = UnpackValue(it->second, v.kind, v.dtype);
    if (!value.ok()) return value.status().WithContext("output '" + v.name + "'");
    out.erase(it);
    out[v.name] = std::move(value).value();
  }
  return out;
}

}  // namespace kiln
