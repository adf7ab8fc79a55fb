// The fusable elementwise ops and their C expressions (see elementwise_table.h).
#include "src/kiln/compile/elementwise_table.h"

#include <cstdio>
#include <cstring>

namespace kiln {

namespace {

using T = ElementwiseOp::Types;
const ElementwiseOp kOps[] = {
    {"Add", 2, 2, T::kFloat},         {"Sub", 2, 2, T::kFloat},
    {"Mul", 2, 2, T::kFloat},         {"Div", 2, 2, T::kFloat},
    {"Pow", 2, 2, T::kFloat},         {"Sqrt", 1, 1, T::kFloat},
    {"Exp", 1, 1, T::kFloat},         {"Log", 1, 1, T::kFloat},
    {"Neg", 1, 1, T::kFloat},         {"Abs", 1, 1, T::kFloat},
    {"Reciprocal", 1, 1, T::kFloat},  {"Relu", 1, 1, T::kFloat},
    {"LeakyRelu", 1, 1, T::kFloat},   {"Sigmoid", 1, 1, T::kFloat},
    {"Tanh", 1, 1, T::kFloat},        {"Erf", 1, 1, T::kFloat},
    {"HardSigmoid", 1, 1, T::kFloat}, {"HardSwish", 1, 1, T::kFloat},
    {"Clip", 1, 3, T::kFloat},        {"Sin", 1, 1, T::kFloat},
    {"Cos", 1, 1, T::kFloat},         {"Floor", 1, 1, T::kFloat},
    {"Ceil", 1, 1, T::kFloat},        {"Softplus", 1, 1, T::kFloat},
    {"Elu", 1, 1, T::kFloat},         {"Sign", 1, 1, T::kFloat},
    {"Min", 2, 2, T::kFloat},         {"Max", 2, 2, T::kFloat},
    {"Identity", 1, 1, T::kFloat},    {"Equal", 2, 2, T::kCompare},
    {"Less", 2, 2, T::kCompare},      {"Greater", 2, 2, T::kCompare},
    {"LessOrEqual", 2, 2, T::kCompare}, {"GreaterOrEqual", 2, 2, T::kCompare},
    {"Where", 3, 3, T::kWhere},       {"Cast", 1, 1, T::kCast},
    {"Not", 1, 1, T::kBool},          {"And", 2, 2, T::kBool},
    {"Or", 2, 2, T::kBool},
};

bool CastableDType(DType t) {
  return t == DType::kFloat32 || t == DType::kInt64 || t == DType::kInt32 || t == DType::kBool;
}

std::string FloatLiteral(float f) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%af", static_cast<double>(f));  // exact
  if (std::strstr(buf, "inf")) return f > 0 ? "INFINITY" : "(-INFINITY)";
  if (std::strstr(buf, "nan")) return "NAN";
  return std::string("(") + buf + ")";
}

}  // namespace

const char* CType(DType t) {
  switch (t) {
    case DType::kFloat32: return "float";
    case DType::kFloat16: return "uint16_t";
    case DType::kInt64: return "int64_t";
    case DType::kInt32: return "int32_t";
    case DType::kInt8: return "int8_t";
    case DType::kUInt8: return "uint8_t";
    case DType::kBool: return "uint8_t";
    case DType::kFloat64: return "double";
    case DType::kInt16: return "int16_t";
    case DType::kUInt16: return "uint16_t";
    case DType::kUInt32: return "uint32_t";
    case DType::kUInt64: return "uint64_t";
  }
  return "void";
}

const ElementwiseOp* LookupElementwise(const Node& node, int64_t opset,
                                       const std::vector<TensorType>& inputs,
                                       const std::vector<TensorType>& outputs) {
  if (!node.domain.empty() || outputs.size() != 1) return nullptr;
  for (const ElementwiseOp& op : kOps) {
    if (node.op_type != op.op) continue;
    if (static_cast<int>(inputs.size()) < op.min_inputs ||
        static_cast<int>(inputs.size()) > op.max_inputs) {
      return nullptr;
    }
    const DType out = outputs[0].dtype;
    switch (op.types) {
      case T::kFloat:
        for (const auto& t : inputs) {
          if (t.dtype != DType::kFloat32) return nullptr;
        }
        if (out != DType::kFloat32) return nullptr;
        if (node.op_type == "Clip" && opset < 11 && inputs.size() != 1) return nullptr;
        return &op;
      case T::kCompare:
        if (inputs[0].dtype != DType::kFloat32 || inputs[1].dtype != DType::kFloat32) {
          return nullptr;
        }
        return &op;
      case T::kWhere:
        if (inputs[0].dtype != DType::kBool || inputs[1].dtype != inputs[2].dtype ||
            !CastableDType(inputs[1].dtype)) {
          return nullptr;
        }
        return &op;
      case T::kCast:
        return CastableDType(inputs[0].dtype) && CastableDType(out) ? &op : nullptr;
      case T::kBool:
        for (const auto& t : inputs) {
          if (t.dtype != DType::kBool) return nullptr;
        }
        return &op;
    }
  }
  return nullptr;
}

Result<Expr> MakeExpr(const Node& node, int64_t opset, std::vector<int> operands, DType out) {
  Expr e;
  e.op = node.op_type;
  e.operands = std::move(operands);
  e.dtype = out;
  const std::string& op = node.op_type;
  if (op == "LeakyRelu") {
    e.params = {node.GetFloat("alpha", 0.01f)};
  } else if (op == "HardSigmoid") {
    e.params = {node.GetFloat("alpha", 0.2f), node.GetFloat("beta", 0.5f)};
  } else if (op == "Elu") {
    e.params = {node.GetFloat("alpha", 1.0f)};
  } else if (op == "Clip") {
    if (opset < 11) {
      e.params = {node.GetFloat("min", -3.402823466e38f), node.GetFloat("max", 3.402823466e38f)};
    }
  }
  return e;
}

std::string FormatExpr(const Expr& e, const std::vector<std::string>& a) {
  const std::string& op = e.op;
  auto p = [&](size_t i) { return FloatLiteral(e.params[i]); };
  if (op == "Add") return "(" + a[0] + " + " + a[1] + ")";
  if (op == "Sub") return "(" + a[0] + " - " + a[1] + ")";
  if (op == "Mul") return "(" + a[0] + " * " + a[1] + ")";
  if (op == "Div") return "(" + a[0] + " / " + a[1] + ")";
  if (op == "Pow") return "kiln_pow(" + a[0] + ", " + a[1] + ")";
  if (op == "Sqrt") return "sqrtf(" + a[0] + ")";
  if (op == "Exp") return "kiln_exp(" + a[0] + ")";
  if (op == "Log") return "logf(" + a[0] + ")";
  if (op == "Neg") return "(-" + a[0] + ")";
  if (op == "Abs") return "fabsf(" + a[0] + ")";
  if (op == "Reciprocal") return "(1.0f / " + a[0] + ")";
  if (op == "Relu") return "kiln_relu(" + a[0] + ")";
  if (op == "LeakyRelu") return "kiln_leaky(" + a[0] + ", " + p(0) + ")";
  if (op == "Sigmoid") return "kiln_sigmoid(" + a[0] + ")";
  if (op == "Tanh") return "kiln_tanh(" + a[0] + ")";
  if (op == "Erf") return "kiln_erf(" + a[0] + ")";
  if (op == "HardSigmoid") return "kiln_hardsigmoid(" + a[0] + ", " + p(0) + ", " + p(1) + ")";
  if (op == "HardSwish") return "(" + a[0] + " * kiln_hardsigmoid(" + a[0] + ", (1.0f/6.0f), 0.5f))";
  if (op == "Clip") {
    if (!e.params.empty()) return "kiln_clip(" + a[0] + ", " + p(0) + ", " + p(1) + ")";
    const std::string lo = a.size() > 1 && !a[1].empty() ? a[1] : "(-INFINITY)";
    const std::string hi = a.size() > 2 && !a[2].empty() ? a[2] : "INFINITY";
    return "kiln_clip(" + a[0] + ", " + lo + ", " + hi + ")";
  }
  if (op == "Sin") return "sinf(" + a[0] + ")";
  if (op == "Cos") return "cosf(" + a[0] + ")";
  if (op == "Floor") return "floorf(" + a[0] + ")";
  if (op == "Ceil") return "ceilf(" + a[0] + ")";
  if (op == "Softplus") return "kiln_softplus(" + a[0] + ")";
  if (op == "Elu") return "kiln_elu(" + a[0] + ", " + p(0) + ")";
  if (op == "Sign") return "kiln_sign(" + a[0] + ")";
  if (op == "Min") return "kiln_min(" + a[0] + ", " + a[1] + ")";
  if (op == "Max") return "kiln_max(" + a[0] + ", " + a[1] + ")";
  if (op == "Identity") return a[0];
  if (op == "Equal") return "(uint8_t)(" + a[0] + " == " + a[1] + ")";
  if (op == "Less") return "(uint8_t)(" + a[0] + " < " + a[1] + ")";
  if (op == "Greater") return "(uint8_t)(" + a[0] + " > " + a[1] + ")";
  if (op == "LessOrEqual") return "(uint8_t)(" + a[0] + " <= " + a[1] + ")";
  if (op == "GreaterOrEqual") return "(uint8_t)(" + a[0] + " >= " + a[1] + ")";
  if (op == "Where") return "(" + a[0] + " ? " + a[1] + " : " + a[2] + ")";
  if (op == "Cast") {
    if (e.dtype == DType::kBool) return "(uint8_t)(" + a[0] + " != 0)";
    if (e.dtype == DType::kFloat32) return "(float)(" + a[0] + ")";
    return std::string("kiln_cast_") + CType(e.dtype) + "((double)(" + a[0] + "))";
  }
  if (op == "Not") return "(uint8_t)(!" + a[0] + ")";
  if (op == "And") return "(uint8_t)(" + a[0] + " && " + a[1] + ")";
  if (op == "Or") return "(uint8_t)(" + a[0] + " || " + a[1] + ")";
  return "/*unknown op " + op + "*/0";
}

}  // namespace kiln
