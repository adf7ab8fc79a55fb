// ONNX import through libonnx's protobuf classes (graph layer). See onnx_import.h for the
// guarantees; this file is the only one in kiln that includes ONNX protobuf headers.
#include "src/kiln/graph/onnx_import.h"

#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <set>
#include <unordered_map>

#include "src/kiln/base/file.h"
#include "src/kiln/base/utf8.h"

namespace kiln {
namespace {

constexpr int64_t kMaxTensorBytes = int64_t{1} << 36;  // 64 GiB: anything larger is corrupt here

// Every name in `gp` and its subgraphs (graph, values, initializers, nodes, op types, domains,
// attribute names) is valid UTF-8, as ONNX's string fields require; protobuf's proto2 parser
// does not check. A name that is not would later reach JSON (events, cell metadata, KServe
// answers), which cannot carry it. `where` locates the graph ("graph", "graph, attribute 'body'
// of node 3"). Attribute string values are bytes in ONNX and are not checked here.
Status CheckNamesAreUtf8(const onnx::GraphProto& gp, const std::string& where) {
  auto check = [&](const std::string& name, const std::string& what) -> Status {
    if (IsValidUtf8(name)) return Status::OK();
    return Status::InvalidArgument(where + ": " + what + " \"" + EscapeBytes(name) +
                                   "\" is not valid UTF-8 (ONNX names are UTF-8 strings)");
  };
  KILN_RETURN_IF_ERROR(check(gp.name(), "the graph name"));
  for (const auto& v : gp.input()) KILN_RETURN_IF_ERROR(check(v.name(), "input name"));
  for (const auto& v : gp.output()) KILN_RETURN_IF_ERROR(check(v.name(), "output name"));
  for (const auto& v : gp.value_info()) KILN_RETURN_IF_ERROR(check(v.name(), "value_info name"));
  for (const auto& t : gp.initializer()) KILN_RETURN_IF_ERROR(check(t.name(), "initializer name"));
  for (int i = 0; i < gp.node_size(); ++i) {
    const onnx::NodeProto& n = gp.node(i);
    const std::string node = "node " + std::to_string(i);
    KILN_RETURN_IF_ERROR(check(n.name(), node + " name"));
    KILN_RETURN_IF_ERROR(check(n.op_type(), node + " op_type"));
    KILN_RETURN_IF_ERROR(check(n.domain(), node + " domain"));
    for (const auto& v : n.input()) KILN_RETURN_IF_ERROR(check(v, node + " input"));
    for (const auto& v : n.output()) KILN_RETURN_IF_ERROR(check(v, node + " output"));
    for (const auto& a : n.attribute()) {
      KILN_RETURN_IF_ERROR(check(a.name(), node + " attribute name"));
      const std::string sub = where + ", attribute '" + a.name() + "' of " + node;
      if (a.has_g()) KILN_RETURN_IF_ERROR(CheckNamesAreUtf8(a.g(), sub));
      for (const auto& g : a.graphs()) KILN_RETURN_IF_ERROR(CheckNamesAreUtf8(g, sub));
    }
  }
  return Status::OK();
}

// Records the role an initializer of `g` plays where `n` reads it when its dtype alone says
// otherwise: a float feeding a shape input is structural (IsShapeInput), an int32 feeding a
// quantized bias is a weight (IsInt32WeightInput).
void MarkInitializerRoles(const Node& n, Graph& g) {
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    auto it = g.initializers.find(n.inputs[i]);
    if (it == g.initializers.end()) continue;
    const DType dtype = it->second.dtype();
    if (IsWeightDType(dtype) && IsShapeInput(n.domain, n.op_type, i)) {
      g.structural_floats.insert(n.inputs[i]);
    }
    if (dtype == DType::kInt32 && IsInt32WeightInput(n.domain, n.op_type, i)) {
      g.int32_weights.insert(n.inputs[i]);
    }
  }
}

struct Importer {
  std::string what;  // the source, for errors
  ImportOptions options;

  Status Error(StatusCode code, const std::string& msg) const {
    return Status(code, what + ": " + msg);
  }

  Result<DType> MapDType(int32_t t, const std::string& obj) const {
    if (std::optional<DType> d = DTypeFromOnnxElemType(t)) return *d;
    return Error(StatusCode::kUnimplemented, obj + " has element type " + std::to_string(t) + " (" +
                                                 OnnxElemTypeName(t) + "); kiln supports " +
                                                 SupportedOnnxElemTypes());
  }

  Result<Tensor> ReadExternal(const onnx::TensorProto& tp, DType dtype, const Shape& shape,
                              const std::string& obj) const {
    std::string location;
    int64_t offset = 0, length = -1;
    for (const auto& kv : tp.external_data()) {
      if (kv.key() == "location") {
        location = kv.value();
      } else if (kv.key() == "offset" || kv.key() == "length") {
        char* end = nullptr;
        const long long v = std::strtoll(kv.value().c_str(), &end, 10);
        if (end == kv.value().c_str() || *end != '\0' || v < 0) {
          return Error(StatusCode::kCorruption, obj + ": external data " + kv.key() + " '" +
                                                    kv.value() + "' is not a non-negative integer");
        }
        (kv.key() == "offset" ? offset : length) = v;
      }
    }
    if (location.empty()) {
      return Error(StatusCode::kCorruption, obj + ": external data has no 'location'");
    }
    if (location[0] == '/' || location.find("..") != std::string::npos) {
      return Error(StatusCode::kInvalidArgument,
                   obj + ": external data location '" + location +
                       "' must be a relative path inside the model's directory");
    }
    const std::string path = (options.base_dir.empty() ? "." : options.base_dir) + "/" + location;
    auto file = MappedFile::Open(path);
    if (!file.ok()) {
      return Status(file.status().code(),
                    what + ": " + obj + ": external data file: " + file.status().message());
    }
    const int64_t need = NumElements(shape) * static_cast<int64_t>(DTypeSize(dtype));
    if (length < 0) length = need;
    if (length != need) {
      return Error(StatusCode::kCorruption,
                   obj + ": external data length " + std::to_string(length) +
                       " != " + std::to_string(need) + " bytes for its shape");
    }
    const auto size = static_cast<int64_t>((*file)->size());
    if (offset > size || length > size - offset) {
      return Error(StatusCode::kCorruption, obj + ": external data [" + std::to_string(offset) +
                                                ", " + std::to_string(offset + length) +
                                                ") is outside '" + path + "' (" +
                                                std::to_string(size) + " bytes)");
    }
    return Tensor::FromBytes(dtype, shape, (*file)->data() + offset, static_cast<size_t>(length));
  }

  Result<Tensor> ConvertTensor(const onnx::TensorProto& tp, const std::string& obj) const {
    KILN_ASSIGN_OR_RETURN(DType dtype, MapDType(tp.data_type(), obj));
    Shape shape;
    int64_t count = 1;
    for (int64_t d : tp.dims()) {
      if (d < 0) {
        return Error(StatusCode::kCorruption, obj + " has negative dim " + std::to_string(d));
      }
      if (d > 0 && count > kMaxTensorBytes / d) {
        return Error(StatusCode::kCorruption, obj + " has an implausibly large shape");
      }
      count *= d;
      shape.push_back(d);
    }
    if (count * static_cast<int64_t>(DTypeSize(dtype)) > kMaxTensorBytes) {
      return Error(StatusCode::kCorruption, obj + " has an implausibly large shape");
    }
    if (dtype == DType::kString) {
      // Strings travel in string_data only (never raw or external bytes).
      if (tp.string_data_size() != count) {
        return Error(StatusCode::kCorruption, obj + " (string" + ShapeToString(shape) + ") holds " +
                                                  std::to_string(tp.string_data_size()) +
                                                  " strings, expected " + std::to_string(count));
      }
      return Tensor::Strings(shape, {tp.string_data().begin(), tp.string_data().end()});
    }
    if (tp.data_location() == onnx::TensorProto::EXTERNAL) {
      return ReadExternal(tp, dtype, shape, obj);
    }
    const size_t nbytes = static_cast<size_t>(count) * DTypeSize(dtype);
    if (tp.has_raw_data()) {
      if (tp.raw_data().size() != nbytes) {
        return Error(StatusCode::kCorruption, obj + " (" + DTypeName(dtype) + ShapeToString(shape) +
                                                  ") has " + std::to_string(tp.raw_data().size()) +
                                                  " raw bytes, expected " + std::to_string(nbytes));
      }
      return Tensor::FromBytes(dtype, shape, tp.raw_data().data(), nbytes);
    }
    // Count the typed values before allocating: a few bytes of header can declare a shape of up
    // to kMaxTensorBytes with no data at all (a 65-byte model asked for 4 GiB under the importer's
    // fuzz harness; fuzz/regressions/onnx_import/).
    // uint32 and uint64 travel in uint64_data, the other narrow types in int32_data.
    const bool in_uint64 = dtype == DType::kUInt32 || dtype == DType::kUInt64;
    const int64_t held = dtype == DType::kFloat32   ? tp.float_data_size()
                         : dtype == DType::kInt64   ? tp.int64_data_size()
                         : dtype == DType::kFloat64 ? tp.double_data_size()
                         : in_uint64                ? tp.uint64_data_size()
                                                    : tp.int32_data_size();
    if (held != count) {
      return Error(StatusCode::kCorruption, obj + " (" + DTypeName(dtype) + ShapeToString(shape) +
                                                ") holds " + std::to_string(held) +
                                                " values, expected " + std::to_string(count));
    }
    KILN_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(dtype, shape));
    auto mismatch = [&](int64_t got) {
      return Error(StatusCode::kCorruption, obj + " (" + t.TypeString() + ") holds " +
                                                std::to_string(got) + " values, expected " +
                                                std::to_string(count));
    };
    switch (dtype) {
      case DType::kFloat32:
        if (tp.float_data_size() != count) return mismatch(tp.float_data_size());
        std::copy(tp.float_data().begin(), tp.float_data().end(), t.data<float>());
        break;
      case DType::kInt64:
        if (tp.int64_data_size() != count) return mismatch(tp.int64_data_size());
        std::copy(tp.int64_data().begin(), tp.int64_data().end(), t.data<int64_t>());
        break;
      case DType::kInt32:
        if (tp.int32_data_size() != count) return mismatch(tp.int32_data_size());
        std::copy(tp.int32_data().begin(), tp.int32_data().end(), t.data<int32_t>());
        break;
      case DType::kFloat64:
        if (tp.double_data_size() != count) return mismatch(tp.double_data_size());
        std::copy(tp.double_data().begin(), tp.double_data().end(), t.data<double>());
        break;
      case DType::kFloat16:
      case DType::kBFloat16:
        if (tp.int32_data_size() != count) return mismatch(tp.int32_data_size());
        for (int64_t i = 0; i < count; ++i) {
          t.data<uint16_t>()[i] = static_cast<uint16_t>(tp.int32_data(static_cast<int>(i)));
        }
        break;
      case DType::kInt8:
      case DType::kUInt8:
      case DType::kBool:
        if (tp.int32_data_size() != count) return mismatch(tp.int32_data_size());
        for (int64_t i = 0; i < count; ++i) {
          const int32_t v = tp.int32_data(static_cast<int>(i));
          t.data<uint8_t>()[i] =
              dtype == DType::kBool ? (v != 0) : static_cast<uint8_t>(static_cast<int8_t>(v));
        }
        break;
      case DType::kInt16:
      case DType::kUInt16:
        if (tp.int32_data_size() != count) return mismatch(tp.int32_data_size());
        for (int64_t i = 0; i < count; ++i) {  // the low 16 bits, either signedness
          t.data<uint16_t>()[i] = static_cast<uint16_t>(tp.int32_data(static_cast<int>(i)));
        }
        break;
      case DType::kUInt32:
        for (int64_t i = 0; i < count; ++i) {
          t.data<uint32_t>()[i] = static_cast<uint32_t>(tp.uint64_data(static_cast<int>(i)));
        }
        break;
      case DType::kUInt64:
        std::copy(tp.uint64_data().begin(), tp.uint64_data().end(), t.data<uint64_t>());
        break;
      case DType::kString:  // read above
        break;
    }
    return t;
  }

  // `subgraph`: the value is an input or output of a subgraph (a branch or loop body), which ONNX
  // lets leave out its type, or its element type, to be taken from what binds it.
  Result<ValueInfo> ConvertValueInfo(const onnx::ValueInfoProto& vi, const std::string& role,
                                     bool subgraph = false) const {
    ValueInfo out;
    out.name = vi.name();
    const std::string obj = role + " '" + vi.name() + "'";
    const bool untyped = !vi.has_type() || vi.type().value_case() == onnx::TypeProto::VALUE_NOT_SET;
    if (untyped || (vi.type().has_tensor_type() &&
                    vi.type().tensor_type().elem_type() == onnx::TensorProto::UNDEFINED)) {
      if (!subgraph) {
        return Error(StatusCode::kInvalidArgument,
                     obj + " declares no " + (untyped ? "type" : "element type") +
                         "; a model's graph inputs and outputs must declare a tensor type");
      }
      out.has_type = false;
      if (untyped) return out;
    }
    if (!vi.type().has_tensor_type()) {
      // Sequences of tensors and optionals of a tensor or of such a sequence (ValueKind); maps,
      // sparse tensors and deeper nestings are not.
      const onnx::TypeProto* t = &vi.type();
      bool optional = false;
      if (t->has_optional_type()) {
        optional = true;
        t = &t->optional_type().elem_type();
      }
      bool sequence = false;
      if (t->has_sequence_type()) {
        sequence = true;
        t = &t->sequence_type().elem_type();
      }
      if (!t->has_tensor_type() || (!optional && !sequence)) {
        return Error(StatusCode::kUnimplemented,
                     obj +
                         " is not a tensor, a sequence of tensors or an optional of either "
                         "(map, sparse and nested values are not supported)");
      }
      out.kind = optional ? (sequence ? ValueKind::kOptionalSequence : ValueKind::kOptionalTensor)
                          : ValueKind::kSequence;
      const int32_t elem = t->tensor_type().elem_type();
      if (elem == onnx::TensorProto::UNDEFINED) {
        if (!subgraph) {
          return Error(StatusCode::kInvalidArgument,
                       obj + " declares no element type for its " + ValueKindName(out.kind));
        }
        out.has_type = false;
        return out;
      }
      KILN_ASSIGN_OR_RETURN(out.dtype, MapDType(elem, obj));
      return out;
    }
    const auto& tt = vi.type().tensor_type();
    if (out.has_type) {
      KILN_ASSIGN_OR_RETURN(out.dtype, MapDType(tt.elem_type(), obj));
    }
    if (tt.has_shape()) {
      out.has_shape = true;
      for (const auto& d : tt.shape().dim()) {
        Dim dim;
        if (d.has_dim_value() && d.dim_value() >= 0) {
          dim.value = d.dim_value();
        } else if (d.has_dim_param()) {
          dim.param = d.dim_param();
        }
        out.dims.push_back(dim);
      }
    }
    return out;
  }

  Result<Attribute> ConvertAttribute(const onnx::AttributeProto& ap, const Node& node,
                                     const std::map<std::string, int64_t>& opsets,
                                     const std::set<std::string>& scope) const {
    Attribute a;
    const std::string obj = node.Describe() + " attribute '" + ap.name() + "'";
    if (!ap.ref_attr_name().empty()) {
      return Error(StatusCode::kUnimplemented,
                   obj +
                       " refers to a function attribute; model-local functions are not "
                       "supported");
    }
    switch (ap.type()) {
      case onnx::AttributeProto::FLOAT:
        a.kind = Attribute::Kind::kFloat;
        a.f = ap.f();
        break;
      case onnx::AttributeProto::INT:
        a.kind = Attribute::Kind::kInt;
        a.i = ap.i();
        break;
      case onnx::AttributeProto::STRING:
        a.kind = Attribute::Kind::kString;
        a.s = ap.s();
        break;
      case onnx::AttributeProto::FLOATS:
        a.kind = Attribute::Kind::kFloats;
        a.floats.assign(ap.floats().begin(), ap.floats().end());
        break;
      case onnx::AttributeProto::INTS:
        a.kind = Attribute::Kind::kInts;
        a.ints.assign(ap.ints().begin(), ap.ints().end());
        break;
      case onnx::AttributeProto::STRINGS:
        a.kind = Attribute::Kind::kStrings;
        a.strings.assign(ap.strings().begin(), ap.strings().end());
        break;
      case onnx::AttributeProto::TENSOR: {
        a.kind = Attribute::Kind::kTensor;
        KILN_ASSIGN_OR_RETURN(a.t, ConvertTensor(ap.t(), obj));
        break;
      }
      case onnx::AttributeProto::GRAPH: {
        a.kind = Attribute::Kind::kGraph;
        KILN_ASSIGN_OR_RETURN(Graph g, ConvertGraph(ap.g(), opsets, /*top_level=*/false, scope));
        a.g = std::make_shared<Graph>(std::move(g));
        break;
      }
      case onnx::AttributeProto::GRAPHS: {
        a.kind = Attribute::Kind::kGraphs;
        for (const auto& gp : ap.graphs()) {
          KILN_ASSIGN_OR_RETURN(Graph g, ConvertGraph(gp, opsets, /*top_level=*/false, scope));
          a.graphs.push_back(std::make_shared<Graph>(std::move(g)));
        }
        break;
      }
      case onnx::AttributeProto::TYPE_PROTO: {
        // A value type, as a ValueInfo carries it.
        onnx::ValueInfoProto vi;
        vi.set_name(ap.name());
        *vi.mutable_type() = ap.tp();
        KILN_ASSIGN_OR_RETURN(ValueInfo v, ConvertValueInfo(vi, obj));
        a.kind = Attribute::Kind::kType;
        a.type_kind = v.kind;
        a.type_dtype = v.dtype;
        break;
      }
      default:
        return Error(StatusCode::kUnimplemented, obj + " has attribute type " +
                                                     std::to_string(ap.type()) +
                                                     " (sparse tensors are not supported)");
    }
    return a;
  }

  // Turns a top-level Constant node into the tensor it yields.
  Result<Tensor> ConstantValue(const Node& n) const {
    if (n.attrs.size() != 1) {
      return Error(StatusCode::kInvalidArgument,
                   n.Describe() + " must have exactly one value attribute, has " +
                       std::to_string(n.attrs.size()));
    }
    const auto& [name, a] = *n.attrs.begin();
    if (name == "value" && a.kind == Attribute::Kind::kTensor) return a.t;
    if (name == "value_float" && a.kind == Attribute::Kind::kFloat) return Tensor::Scalar(a.f);
    if (name == "value_int" && a.kind == Attribute::Kind::kInt) return Tensor::Scalar(a.i);
    if (name == "value_floats" && a.kind == Attribute::Kind::kFloats) {
      return Tensor::FromVector<float>({static_cast<int64_t>(a.floats.size())}, a.floats);
    }
    if (name == "value_ints" && a.kind == Attribute::Kind::kInts) {
      return Tensor::FromVector<int64_t>({static_cast<int64_t>(a.ints.size())}, a.ints);
    }
    return Error(StatusCode::kUnimplemented, n.Describe() + " attribute '" + name + "' (" +
                                                 AttributeKindName(a.kind) +
                                                 ") is not a supported Constant value");
  }

  Status TopoSort(Graph& g, const std::set<std::string>& outer_names) const {
    std::set<std::string> available = outer_names;
    for (const auto& v : g.inputs) available.insert(v.name);
    for (const auto& [name, t] : g.initializers) available.insert(name);
    std::unordered_map<std::string, size_t> producer;
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      for (const auto& o : g.nodes[i].outputs) {
        if (o.empty()) continue;
        if (available.count(o) || !producer.emplace(o, i).second) {
          return Error(StatusCode::kInvalidArgument,
                       g.nodes[i].Describe() + " output '" + o +
                           "' is already defined (by a graph input, initializer or node); "
                           "values must be defined once");
        }
      }
    }
    // Kahn's algorithm, stable: among ready nodes the file order wins, so sorted files stay as is.
    std::vector<int> pending(g.nodes.size(), 0);
    std::unordered_map<std::string, std::vector<size_t>> consumers;
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      std::set<std::string> seen;
      // A value a subgraph reads from this scope must exist before the node that owns it runs.
      std::vector<std::string> uses = g.nodes[i].inputs;
      for (std::string& in : ImplicitInputs(g.nodes[i])) uses.push_back(std::move(in));
      for (const auto& in : uses) {
        if (in.empty() || !producer.count(in) || !seen.insert(in).second) continue;
        ++pending[i];
        consumers[in].push_back(i);
      }
    }
    std::set<size_t> ready;
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      if (pending[i] == 0) ready.insert(i);
    }
    std::vector<Node> sorted;
    sorted.reserve(g.nodes.size());
    std::vector<bool> done(g.nodes.size(), false);
    while (!ready.empty()) {
      const size_t i = *ready.begin();
      ready.erase(ready.begin());
      done[i] = true;
      for (const auto& o : g.nodes[i].outputs) {
        auto it = consumers.find(o);
        if (it == consumers.end()) continue;
        for (size_t c : it->second) {
          if (--pending[c] == 0) ready.insert(c);
        }
      }
      sorted.push_back(g.nodes[i]);
    }
    if (sorted.size() != g.nodes.size()) {
      for (size_t i = 0; i < g.nodes.size(); ++i) {
        if (!done[i]) {
          return Error(StatusCode::kInvalidArgument,
                       "graph has a cycle through " + g.nodes[i].Describe());
        }
      }
    }
    g.nodes = std::move(sorted);
    return Status::OK();
  }

  Result<Graph> ConvertGraph(const onnx::GraphProto& gp,
                             const std::map<std::string, int64_t>& opsets, bool top_level,
                             const std::set<std::string>& outer = {}) const {
    Graph g;
    g.name = gp.name();
    g.opsets = opsets;
    if (gp.sparse_initializer_size() > 0) {
      return Error(StatusCode::kUnimplemented,
                   "graph '" + gp.name() + "' has sparse initializers, which are not supported");
    }
    for (const auto& tp : gp.initializer()) {
      if (tp.name().empty()) {
        return Error(StatusCode::kCorruption,
                     "graph '" + gp.name() + "' has an unnamed initializer");
      }
      KILN_ASSIGN_OR_RETURN(Tensor t, ConvertTensor(tp, "initializer '" + tp.name() + "'"));
      if (!g.initializers.emplace(tp.name(), std::move(t)).second) {
        return Error(StatusCode::kInvalidArgument,
                     "initializer '" + tp.name() + "' is defined twice");
      }
    }
    for (const auto& vi : gp.input()) {
      if (g.initializers.count(vi.name())) continue;  // a weight listed as an input
      KILN_ASSIGN_OR_RETURN(ValueInfo v, ConvertValueInfo(vi, "graph input", !top_level));
      g.inputs.push_back(std::move(v));
    }
    for (const auto& vi : gp.output()) {
      KILN_ASSIGN_OR_RETURN(ValueInfo v, ConvertValueInfo(vi, "graph output", !top_level));
      g.outputs.push_back(std::move(v));
    }
    for (const auto& vi : gp.value_info()) {
      auto v = ConvertValueInfo(vi, "value_info");
      if (v.ok()) g.value_info[vi.name()] = std::move(v).value();  // informational only
    }
    std::set<std::string> scope = outer;
    for (const auto& v : g.inputs) scope.insert(v.name);
    for (const auto& [name, t] : g.initializers) scope.insert(name);
    for (const auto& np : gp.node()) {
      Node n;
      n.name = np.name();
      n.op_type = np.op_type();
      n.domain = np.domain() == "ai.onnx" ? "" : np.domain();
      n.inputs.assign(np.input().begin(), np.input().end());
      n.outputs.assign(np.output().begin(), np.output().end());
      if (n.op_type.empty()) {
        return Error(StatusCode::kInvalidArgument, "a node (output '" +
                                                       (n.outputs.empty() ? "" : n.outputs[0]) +
                                                       "') has an empty op_type");
      }
      if (!opsets.count(n.domain)) {
        return Error(StatusCode::kInvalidArgument,
                     n.Describe() + " uses domain '" + n.domain +
                         "' which the model does not import (no opset_import entry)");
      }
      for (const auto& o : n.outputs) scope.insert(o);
      for (const auto& ap : np.attribute()) {
        KILN_ASSIGN_OR_RETURN(Attribute a, ConvertAttribute(ap, n, opsets, scope));
        if (!n.attrs.emplace(ap.name(), std::move(a)).second) {
          return Error(StatusCode::kInvalidArgument,
                       n.Describe() + " has attribute '" + ap.name() + "' twice");
        }
      }
      // Lifted at every depth: a Constant inside a branch or loop body is a weight or a
      // structural constant exactly like one at the top (HoistSubgraphInitializers moves it up).
      if (n.domain.empty() && n.op_type == "Constant") {
        if (n.outputs.size() != 1 || n.outputs[0].empty()) {
          return Error(StatusCode::kInvalidArgument, n.Describe() + " must have one output");
        }
        KILN_ASSIGN_OR_RETURN(Tensor t, ConstantValue(n));
        if (!g.initializers.emplace(n.outputs[0], std::move(t)).second) {
          return Error(StatusCode::kInvalidArgument,
                       n.Describe() + " output '" + n.outputs[0] + "' is already defined");
        }
        continue;
      }
      g.nodes.push_back(std::move(n));
    }
    KILN_RETURN_IF_ERROR(TopoSort(g, outer));
    for (const Node& n : g.nodes) MarkInitializerRoles(n, g);
    return g;
  }

  // Moves every initializer (and lifted Constant) of every subgraph into the top-level graph,
  // where the subgraph still reads it by name as an outer-scope value. Afterwards only the
  // top-level graph binds tensors, so checkpoints, the digest's weight list, folding and a
  // cell's constant table see a weight inside a branch like any other (a weight inside a
  // subgraph is still a weight). A name defined more than once in the model (sibling branches
  // may reuse one) is renamed to a fresh deterministic name inside the subgraph that owns it.
  static void HoistSubgraphInitializers(Graph& top) {
    std::map<std::string, int> defs;
    std::function<void(const Graph&)> count = [&](const Graph& g) {
      for (const ValueInfo& v : g.inputs) ++defs[v.name];
      for (const auto& [name, t] : g.initializers) ++defs[name];
      for (const Node& n : g.nodes) {
        for (const std::string& o : n.outputs) {
          if (!o.empty()) ++defs[o];
        }
        for (const Graph* sub : Subgraphs(n)) count(*sub);
      }
    };
    count(top);
    std::function<void(Graph&, const std::string&, const std::string&)> rename =
        [&](Graph& g, const std::string& from, const std::string& to) {
          for (Node& n : g.nodes) {
            for (std::string& in : n.inputs) {
              if (in == from) in = to;
            }
            for (auto& [name, a] : n.attrs) {
              if (a.kind == Attribute::Kind::kGraph && a.g) rename(*a.g, from, to);
              for (auto& sub : a.graphs) rename(*sub, from, to);
            }
          }
          for (ValueInfo& v : g.outputs) {
            if (v.name == from) v.name = to;
          }
        };
    std::function<void(Graph&)> hoist = [&](Graph& g) {
      for (Node& n : g.nodes) {
        for (auto& [attr, a] : n.attrs) {
          std::vector<Graph*> subs;
          if (a.kind == Attribute::Kind::kGraph && a.g) subs.push_back(a.g.get());
          for (auto& sub : a.graphs) subs.push_back(sub.get());
          for (Graph* sub : subs) {
            for (auto& [name, t] : sub->initializers) {
              std::string target = name;
              if (defs[name] > 1) {
                for (int k = 1; defs.count(target); ++k) target = name + "__" + std::to_string(k);
                --defs[name];
                ++defs[target];
                rename(*sub, name, target);
              }
              if (sub->structural_floats.count(name)) top.structural_floats.insert(target);
              if (sub->int32_weights.count(name)) top.int32_weights.insert(target);
              top.initializers[target] = t;
            }
            sub->initializers.clear();
            sub->structural_floats.clear();
            sub->int32_weights.clear();
            hoist(*sub);
          }
        }
      }
    };
    hoist(top);
    // A float that feeds a shape input inside a subgraph is structural too.
    std::function<void(const Graph&)> mark = [&](const Graph& g) {
      for (const Node& n : g.nodes) {
        MarkInitializerRoles(n, top);
        for (const Graph* sub : Subgraphs(n)) mark(*sub);
      }
    };
    mark(top);
    MarkShapeDecidingFloats(top);
  }

  // A float initializer whose value reaches a shape input through computation (Resize scales
  // written as Concat(Constant [1, 1], Constant [2, 2]), a Range bound through a Cast) decides a
  // shape as surely as one that feeds it directly: it is structural. The walk goes backwards from
  // every shape input, through every node (at any depth) that produces what it reaches, and stops
  // at Shape and Size, which read only types.
  static void MarkShapeDecidingFloats(Graph& top) {
    std::map<std::string, const Node*> producer;
    std::vector<std::string> work;
    std::function<void(const Graph&)> scan = [&](const Graph& g) {
      for (const Node& n : g.nodes) {
        for (const std::string& o : n.outputs) {
          if (!o.empty()) producer.emplace(o, &n);
        }
        for (size_t i = 0; i < n.inputs.size(); ++i) {
          if (!n.inputs[i].empty() && IsShapeInput(n.domain, n.op_type, i)) {
            work.push_back(n.inputs[i]);
          }
        }
        for (const Graph* sub : Subgraphs(n)) scan(*sub);
      }
    };
    scan(top);
    std::set<std::string> seen;
    while (!work.empty()) {
      const std::string name = work.back();
      work.pop_back();
      if (!seen.insert(name).second) continue;
      auto init = top.initializers.find(name);
      if (init != top.initializers.end()) {
        if (IsWeightDType(init->second.dtype()) && !top.int32_weights.count(name)) {
          top.structural_floats.insert(name);
        }
        continue;
      }
      auto p = producer.find(name);
      if (p == producer.end()) continue;  // a graph input
      const Node& n = *p->second;
      if (n.domain.empty() && (n.op_type == "Shape" || n.op_type == "Size")) continue;
      for (const std::string& in : n.inputs) {
        if (!in.empty()) work.push_back(in);
      }
    }
  }

  Result<Graph> Import(std::string_view bytes) const {
    if (bytes.size() > static_cast<size_t>(std::numeric_limits<int>::max())) {
      return Error(StatusCode::kUnimplemented,
                   "model is larger than 2 GiB; keep weights in external data files");
    }
    onnx::ModelProto model;
    if (!model.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
      return Error(StatusCode::kCorruption,
                   "is not a valid ONNX ModelProto (" + std::to_string(bytes.size()) +
                       " bytes could not be parsed; truncated or not an ONNX file?)");
    }
    if (!model.has_graph()) return Error(StatusCode::kCorruption, "model has no graph");
    if (Status names = CheckNamesAreUtf8(model.graph(), "graph"); !names.ok()) {
      return Error(StatusCode::kInvalidArgument, names.message());
    }
    std::map<std::string, int64_t> opsets;
    for (const auto& os : model.opset_import()) {
      const std::string domain = os.domain() == "ai.onnx" ? "" : os.domain();
      opsets[domain] = os.version();
    }
    // A model may import only another domain (the training optimizers of
    // ai.onnx.preview.training); a node of a domain the model does not import is refused by
    // name below. A model that imports nothing at all predates opset_import (IR < 3): opset 1.
    if (opsets.empty()) {
      if (model.ir_version() >= 3) {
        return Error(StatusCode::kInvalidArgument,
                     "model imports no opset (opset_import is empty)");
      }
      opsets[""] = 1;
    }
    if (model.functions_size() > 0) {
      // Accepted as long as no node calls one: a call fails later as an unknown op by name.
    }
    KILN_ASSIGN_OR_RETURN(Graph g, ConvertGraph(model.graph(), opsets, /*top_level=*/true));
    HoistSubgraphInitializers(g);
    return g;
  }
};

}  // namespace

Result<Graph> ImportOnnxBytes(std::string_view bytes, const std::string& what,
                              const ImportOptions& options) {
  Importer imp{what, options};
  return imp.Import(bytes);
}

Result<Graph> ImportOnnxFile(const std::string& path) {
  auto bytes = ReadFile(path);
  if (!bytes.ok()) return bytes.status();
  ImportOptions options;
  const size_t slash = path.find_last_of('/');
  options.base_dir = slash == std::string::npos ? "." : path.substr(0, slash);
  if (options.base_dir.empty()) options.base_dir = "/";
  return ImportOnnxBytes(*bytes, "model '" + path + "'", options);
}

}  // namespace kiln
