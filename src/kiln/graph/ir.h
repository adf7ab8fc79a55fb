// The graph IR: what the ONNX importer produces and every later stage (shape inference, folding,
// digest, eager interpreter, compiler) reads.
//
// A Graph is a list of Nodes in topological order over named values. Every constant tensor the
// graph binds by name lives in `initializers`, whatever its source (ONNX initializer or Constant
// node, which the importer lifts out): floating/8-bit ones are weights (checkpoint data, never
// hashed), int/bool ones are structural constants (hashed, foldable). One exception: a float
// initializer that determines a shape (Resize scales, Upsample scales, Range bounds) is structural
// too, because a cell specialized to one shape cannot take another value (see IsWeight).
// Legacy opset forms are kept as imported; each op's definition reads both forms by opset.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "src/kiln/base/status.h"
#include "src/kiln/tensor/tensor.h"

namespace kiln {

struct Graph;

struct Attribute {
  // kType: a type (Optional's `type`): a value kind and its element dtype.
  enum class Kind {
    kFloat,
    kInt,
    kString,
    kTensor,
    kGraph,
    kFloats,
    kInts,
    kStrings,
    kGraphs,
    kType
  };
  Kind kind = Kind::kInt;
  ValueKind type_kind = ValueKind::kTensor;  // kType only
  DType type_dtype = DType::kFloat32;        // kType only
  float f = 0;
  int64_t i = 0;
  std::string s;
  Tensor t;
  std::shared_ptr<Graph> g;
  std::vector<float> floats;
  std::vector<int64_t> ints;
  std::vector<std::string> strings;
  std::vector<std::shared_ptr<Graph>> graphs;
};
const char* AttributeKindName(Attribute::Kind kind);

struct Node {
  std::string name;                 // may be empty; never part of the digest
  std::string op_type;              // "Conv"
  std::string domain;               // "" is the default ONNX domain (ai.onnx)
  std::vector<std::string> inputs;  // "" marks an omitted optional input
  std::vector<std::string> outputs;
  std::map<std::string, Attribute> attrs;

  // "Conv 'conv_3'", or "Conv (output 'y')" when the node has no name. Used in every error.
  std::string Describe() const;

  bool HasAttr(const std::string& attr) const { return attrs.count(attr) != 0; }
  // Typed accessors: an error names the node, the attribute and the kind expected.
  Result<int64_t> GetInt(const std::string& attr) const;
  int64_t GetInt(const std::string& attr, int64_t dflt) const;  // dflt when absent or mistyped
  Result<float> GetFloat(const std::string& attr) const;
  float GetFloat(const std::string& attr, float dflt) const;
  Result<std::string> GetString(const std::string& attr) const;
  std::string GetString(const std::string& attr, const std::string& dflt) const;
  Result<std::vector<int64_t>> GetInts(const std::string& attr) const;
  std::vector<int64_t> GetInts(const std::string& attr, std::vector<int64_t> dflt) const;
  Result<std::vector<float>> GetFloats(const std::string& attr) const;
  Result<Tensor> GetTensor(const std::string& attr) const;

  // Number of inputs that are present (non-empty name) at index i.
  bool HasInput(size_t i) const { return i < inputs.size() && !inputs[i].empty(); }
};

// One dim of a declared graph input/output: a concrete value, or a symbol ("batch"), or unknown.
struct Dim {
  int64_t value = -1;  // >= 0 when known
  std::string param;   // symbolic name when value < 0 (may be empty: unknown)
  bool known() const { return value >= 0; }
};

struct ValueInfo {
  std::string name;
  DType dtype = DType::kFloat32;  // meaningful only when has_type
  bool has_shape = false;         // false: rank unknown
  std::vector<Dim> dims;
  // false only for a subgraph input or output declared without an element type (ONNX lets a
  // subgraph leave it out): its type is the one its binding gives it (a Loop's carried value, a
  // Scan slice, what the body computes). A top-level graph always declares its types.
  bool has_type = true;
  // A tensor, or a sequence or optional (then dtype is its elements' and there is no shape).
  ValueKind kind = ValueKind::kTensor;
  std::string ShapeString() const;  // "[batch,3,224,224]" or "[?]" when unknown
};

// True when input `index` of op (domain, op_type) determines the shape of its output by value
// even though its dtype is float: Resize roi/scales, Upsample scales, Range start/limit/delta.
bool IsShapeInput(const std::string& domain, const std::string& op_type, size_t index);
// True when input `index` of the op holds checkpoint data even though its element type is int32:
// a quantized convolution's bias (QLinearConv input 8) and the int32 tensor a QDQ model
// dequantizes into a bias (DequantizeLinear input 0). Such an initializer is a weight (law 1).
bool IsInt32WeightInput(const std::string& domain, const std::string& op_type, size_t index);

struct Graph {
  std::string name;
  // domain -> opset version; "" is ai.onnx. Subgraphs inherit their model's opsets.
  std::map<std::string, int64_t> opsets;
  std::vector<ValueInfo> inputs;  // runtime inputs only (initializers are not listed here)
  std::vector<ValueInfo> outputs;
  std::vector<Node> nodes;                     // topological order
  std::map<std::string, Tensor> initializers;  // weights and structural constants, by name
  // Declared types of intermediate values, when the file carried them (informational).
  std::map<std::string, ValueInfo> value_info;

  int64_t opset(const std::string& domain = "") const;
  // Float initializers that are structural because they feed a shape-determining input
  // (IsShapeInput). Filled by the importer; hashed by value, never replaced by a checkpoint.
  std::set<std::string> structural_floats;
  // int32 initializers that are weights because they feed an IsInt32WeightInput (quantized
  // biases). Filled by the importer; bound by name like any weight, never hashed by value.
  std::set<std::string> int32_weights;

  // True for an initializer that is a weight: a weight dtype and not structural.
  bool IsWeight(const std::string& name) const;
  // Names of initializers that are weights, sorted.
  std::vector<std::string> WeightNames() const;
  const ValueInfo* FindInput(const std::string& name) const;
};

// Subgraphs (If branches, Loop bodies) read values of enclosing graphs by name. These helpers
// let every walker that orders, frees or removes values (topological sort, dead code, the
// interpreter's last-use plan, lowering) count such a read as a use of the outer value.
// True when the node has a graph or graphs attribute.
bool HasSubgraphs(const Node& node);
// The graphs a node's attributes hold, in attribute-name order.
std::vector<const Graph*> Subgraphs(const Node& node);
// Names `graph` (with its nested subgraphs) reads but does not define itself: its outer-scope
// references, sorted.
std::vector<std::string> OuterReferences(const Graph& graph);
// The outer-scope references of all the node's subgraphs (its implicit inputs), sorted.
std::vector<std::string> ImplicitInputs(const Node& node);

}  // namespace kiln
