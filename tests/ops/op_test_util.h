// Test helper for op kernels: build a node, run it through the registry exactly as the eager
// interpreter does (check -> prepare -> infer -> allocate -> run), and compare tensors. An op
// with a prepare step is also run unprepared, as static shape inference and lowering call it, and
// both runs must agree bit for bit (or fail with the same error).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "src/kiln/ops/registry.h"

namespace kiln::testing {

inline Node MakeNode(std::string op_type, size_t num_inputs, size_t num_outputs = 1,
                     std::map<std::string, Attribute> attrs = {}) {
  Node n;
  n.name = "n0";
  n.op_type = std::move(op_type);
  for (size_t i = 0; i < num_inputs; ++i) n.inputs.push_back("in" + std::to_string(i));
  for (size_t i = 0; i < num_outputs; ++i) n.outputs.push_back("out" + std::to_string(i));
  n.attrs = std::move(attrs);
  return n;
}

inline Attribute IntAttr(int64_t v) {
  Attribute a;
  a.kind = Attribute::Kind::kInt;
  a.i = v;
  return a;
}
inline Attribute FloatAttr(float v) {
  Attribute a;
  a.kind = Attribute::Kind::kFloat;
  a.f = v;
  return a;
}
inline Attribute StringAttr(std::string v) {
  Attribute a;
  a.kind = Attribute::Kind::kString;
  a.s = std::move(v);
  return a;
}
inline Attribute IntsAttr(std::vector<int64_t> v) {
  Attribute a;
  a.kind = Attribute::Kind::kInts;
  a.ints = std::move(v);
  return a;
}
inline Attribute FloatsAttr(std::vector<float> v) {
  Attribute a;
  a.kind = Attribute::Kind::kFloats;
  a.floats = std::move(v);
  return a;
}
inline Attribute TensorAttr(Tensor t) {
  Attribute a;
  a.kind = Attribute::Kind::kTensor;
  a.t = std::move(t);
  return a;
}

// Runs one node. An input slot holding an invalid Tensor() is treated as omitted (and the node's
// input name for it should be ""; RunOp clears it).
inline Result<std::vector<Tensor>> RunOp(Node node, const std::vector<Tensor>& inputs,
                                         int64_t opset = 17) {
  for (size_t i = 0; i < inputs.size() && i < node.inputs.size(); ++i) {
    if (!inputs[i].valid()) node.inputs[i].clear();
  }
  KILN_ASSIGN_OR_RETURN(const OpDef* def,
                        OpRegistry::Global().Find(node.domain, node.op_type, opset));
  if (def->check) KILN_RETURN_IF_ERROR(def->check(node, opset));
  std::shared_ptr<const PreparedNode> prepared;
  if (def->prepare) {
    KILN_ASSIGN_OR_RETURN(prepared, def->prepare(node, opset));
  }
  std::vector<TensorType> types;
  std::vector<const Tensor*> values;
  std::vector<bool> present;
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    const bool p = i < inputs.size() && inputs[i].valid();
    present.push_back(p);
    types.push_back(p ? TypeOf(inputs[i]) : TensorType{});
    values.push_back(p ? &inputs[i] : nullptr);
  }
  auto apply = [&](const PreparedNode* state) -> Result<std::vector<Tensor>> {
    KILN_RETURN_IF_ERROR(CheckValueKinds(*def, node, types));  // as the interpreter does
    OpContext ctx(node, opset, types, values, present);
    ctx.set_prepared(state);
    KILN_ASSIGN_OR_RETURN(std::vector<TensorType> out_types, def->infer(ctx));
    KILN_RETURN_IF_ERROR(CheckValueKinds(*def, node, out_types));
    std::vector<Tensor> outs;
    for (const TensorType& t : out_types) {
      if (t.kind != ValueKind::kTensor) {  // a sequence or optional: run assigns it
        outs.emplace_back();
        continue;
      }
      KILN_ASSIGN_OR_RETURN(Tensor o, Tensor::Empty(t.dtype, t.shape));
      outs.push_back(std::move(o));
    }
    KILN_RETURN_IF_ERROR(def->run(ctx, outs));
    return outs;
  };
  Result<std::vector<Tensor>> result = apply(prepared.get());
  if (prepared != nullptr) {
    const Result<std::vector<Tensor>> unprepared = apply(nullptr);
    EXPECT_EQ(result.status().ToString(), unprepared.status().ToString())
        << node.Describe() << ": prepared and unprepared runs differ";
    if (result.ok() && unprepared.ok()) {
      EXPECT_EQ(result->size(), unprepared->size()) << node.Describe();
      for (size_t i = 0; i < result->size() && i < unprepared->size(); ++i) {
        const Tensor& a = (*result)[i];
        const Tensor& b = (*unprepared)[i];
        EXPECT_TRUE(a.dtype() == b.dtype() && a.shape() == b.shape() &&
                    (a.nbytes() == 0 || std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0))
            << node.Describe() << ": output " << i << " differs between prepared and unprepared";
      }
    }
  }
  return result;
}

inline Tensor F32(Shape shape, std::vector<float> v) {
  return Tensor::FromVector<float>(std::move(shape), v);
}
inline Tensor I64(Shape shape, std::vector<int64_t> v) {
  return Tensor::FromVector<int64_t>(std::move(shape), v);
}

// Expects same dtype and shape and every element within atol + rtol*|expected|.
inline void ExpectTensorNear(const Tensor& actual, const Tensor& expected, double atol = 1e-5,
                             double rtol = 1e-5) {
  ASSERT_EQ(actual.dtype(), expected.dtype())
      << actual.TypeString() << " vs " << expected.TypeString();
  ASSERT_EQ(actual.shape(), expected.shape())
      << actual.TypeString() << " vs " << expected.TypeString();
  for (int64_t i = 0; i < expected.numel(); ++i) {
    const double a = actual.GetAsDouble(i), e = expected.GetAsDouble(i);
    if (std::isnan(e)) {
      EXPECT_TRUE(std::isnan(a)) << "element " << i;
      continue;
    }
    ASSERT_NEAR(a, e, atol + rtol * std::fabs(e)) << "element " << i;
  }
}

}  // namespace kiln::testing
