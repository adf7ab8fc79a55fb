// Test helper: builds small ONNX models in C++ with libonnx's protobuf classes, so importer,
// digest and interpreter tests need no Python and can vary one thing at a time.
#pragma once

#include <onnx/onnx_pb.h>

#include <string>
#include <vector>

namespace kiln::testing {

class OnnxBuilder {
 public:
  explicit OnnxBuilder(int64_t opset = 17) {
    model_.set_ir_version(8);
    auto* os = model_.add_opset_import();
    os->set_domain("");
    os->set_version(opset);
    model_.mutable_graph()->set_name("g");
  }
  onnx::ModelProto& model() { return model_; }
  onnx::GraphProto& graph() { return *model_.mutable_graph(); }

  // dims: >= 0 concrete, -1 symbolic ("N").
  OnnxBuilder& Input(const std::string& name, int elem, std::vector<int64_t> dims) {
    SetType(graph().add_input(), name, elem, dims);
    return *this;
  }
  OnnxBuilder& Output(const std::string& name, int elem, std::vector<int64_t> dims) {
    SetType(graph().add_output(), name, elem, dims);
    return *this;
  }
  onnx::NodeProto& Node(const std::string& op, std::vector<std::string> inputs,
                        std::vector<std::string> outputs, const std::string& name = "") {
    auto* n = graph().add_node();
    n->set_op_type(op);
    n->set_name(name);
    for (auto& i : inputs) n->add_input(i);
    for (auto& o : outputs) n->add_output(o);
    return *n;
  }
  OnnxBuilder& FloatInit(const std::string& name, std::vector<int64_t> dims,
                         std::vector<float> values) {
    auto* t = graph().add_initializer();
    FillFloat(t, name, dims, values);
    return *this;
  }
  OnnxBuilder& Int64Init(const std::string& name, std::vector<int64_t> dims,
                         std::vector<int64_t> values) {
    auto* t = graph().add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::INT64);
    for (auto d : dims) t->add_dims(d);
    for (auto v : values) t->add_int64_data(v);
    return *this;
  }
  // A Constant node holding a float tensor.
  OnnxBuilder& FloatConstant(const std::string& out, std::vector<int64_t> dims,
                             std::vector<float> values, const std::string& name = "") {
    auto& n = Node("Constant", {}, {out}, name);
    auto* a = n.add_attribute();
    a->set_name("value");
    a->set_type(onnx::AttributeProto::TENSOR);
    FillFloat(a->mutable_t(), "", dims, values);
    return *this;
  }
  OnnxBuilder& Int64Constant(const std::string& out, std::vector<int64_t> values) {
    auto& n = Node("Constant", {}, {out});
    auto* a = n.add_attribute();
    a->set_name("value_ints");
    a->set_type(onnx::AttributeProto::INTS);
    for (auto v : values) a->add_ints(v);
    return *this;
  }
  std::string Bytes() const { return model_.SerializeAsString(); }

  static void IntAttr(onnx::NodeProto& n, const std::string& name, int64_t v) {
    auto* a = n.add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(v);
  }
  static void FloatAttr(onnx::NodeProto& n, const std::string& name, float v) {
    auto* a = n.add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::FLOAT);
    a->set_f(v);
  }
  static void IntsAttr(onnx::NodeProto& n, const std::string& name, std::vector<int64_t> v) {
    auto* a = n.add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INTS);
    for (auto x : v) a->add_ints(x);
  }

 private:
  static void SetType(onnx::ValueInfoProto* vi, const std::string& name, int elem,
                      const std::vector<int64_t>& dims) {
    vi->set_name(name);
    auto* tt = vi->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(elem);
    auto* shape = tt->mutable_shape();
    for (auto d : dims) {
      auto* dim = shape->add_dim();
      if (d >= 0) {
        dim->set_dim_value(d);
      } else {
        dim->set_dim_param("N");
      }
    }
  }
  static void FillFloat(onnx::TensorProto* t, const std::string& name,
                        const std::vector<int64_t>& dims, const std::vector<float>& values) {
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::FLOAT);
    for (auto d : dims) t->add_dims(d);
    for (auto v : values) t->add_float_data(v);
  }
  onnx::ModelProto model_;
};

constexpr int kFloat = onnx::TensorProto::FLOAT;
constexpr int kInt64 = onnx::TensorProto::INT64;

}  // namespace kiln::testing
