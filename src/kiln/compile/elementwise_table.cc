// The fusable elementwise ops' lookup and C expressions (compile layer; see elementwise_table.h).
#include "src/kiln/compile/elementwise_table.h"

#include <cstdio>
#include <cstring>

namespace kiln {

namespace {

using T = ElementwiseFusion::Types;

// The fusion row for (op type, opset), or nullptr.
const FusableElementwise* FindRow(const Node& node, int64_t opset) {
  if (!node.domain.empty()) return nullptr;
  for (const FusableElementwise& row : FusableElementwiseOps()) {
    if (node.op_type == row.op_type && opset >= row.since_version && opset <= row.until_version) {
      return &row;
    }
  }
  return nullptr;
}

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
    case DType::kFloat32:
      return "float";
    case DType::kFloat16:
    case DType::kBFloat16:
      return "uint16_t";
    case DType::kInt64:
      return "int64_t";
    case DType::kInt32:
      return "int32_t";
    case DType::kInt8:
      return "int8_t";
    case DType::kUInt8:
      return "uint8_t";
    case DType::kBool:
      return "uint8_t";
    case DType::kFloat64:
      return "double";
    case DType::kInt16:
      return "int16_t";
    case DType::kUInt16:
      return "uint16_t";
    case DType::kUInt32:
      return "uint32_t";
    case DType::kUInt64:
      return "uint64_t";
    case DType::kString:
      return "void";  // never fused nor held in a cell's own buffers
  }
  return "void";
}

const FusableElementwise* LookupElementwise(const Node& node, int64_t opset,
                                            const std::vector<TensorType>& inputs,
                                            const std::vector<TensorType>& outputs) {
  if (outputs.size() != 1) return nullptr;
  const FusableElementwise* row = FindRow(node, opset);
  if (row == nullptr) return nullptr;
  const ElementwiseFusion& f = row->fusion;
  if (static_cast<int>(inputs.size()) < f.min_inputs ||
      static_cast<int>(inputs.size()) > f.max_inputs) {
    return nullptr;
  }
  const DType out = outputs[0].dtype;
  switch (f.types) {
    case T::kNone:
      return nullptr;
    case T::kFloat:
      for (const auto& t : inputs) {
        if (t.dtype != DType::kFloat32) return nullptr;
      }
      return out == DType::kFloat32 ? row : nullptr;
    case T::kCompare:
      if (inputs[0].dtype != DType::kFloat32 || inputs[1].dtype != DType::kFloat32) {
        return nullptr;
      }
      return row;
    case T::kWhere:
      if (inputs[0].dtype != DType::kBool || inputs[1].dtype != inputs[2].dtype ||
          !CastableDType(inputs[1].dtype)) {
        return nullptr;
      }
      return row;
    case T::kCast:
      return CastableDType(inputs[0].dtype) && CastableDType(out) ? row : nullptr;
    case T::kBool:
      for (const auto& t : inputs) {
        if (t.dtype != DType::kBool) return nullptr;
      }
      return row;
  }
  return nullptr;
}

Result<Expr> MakeExpr(const Node& node, int64_t opset, std::vector<int> operands, DType out) {
  Expr e;
  e.op = node.op_type;
  e.operands = std::move(operands);
  e.dtype = out;
  if (const FusableElementwise* row = FindRow(node, opset)) {
    for (int i = 0; i < row->fusion.num_params; ++i) {
      const ElementwiseFusion::Param& p = row->fusion.params[static_cast<size_t>(i)];
      e.params.push_back(node.GetFloat(p.attr, p.dflt));
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
  if (op == "HardSwish")
    return "(" + a[0] + " * kiln_hardsigmoid(" + a[0] + ", (1.0f/6.0f), 0.5f))";
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
    if (e.dtype == DType::kFloat32) return "kiln_to_float(" + a[0] + ")";
    return std::string("kiln_cast_") + CType(e.dtype) + "((double)(" + a[0] + "))";
  }
  if (op == "Not") return "(uint8_t)(!" + a[0] + ")";
  if (op == "And") return "(uint8_t)(" + a[0] + " && " + a[1] + ")";
  if (op == "Or") return "(uint8_t)(" + a[0] + " || " + a[1] + ")";
  return "/*unknown op " + op + "*/0";
}

}  // namespace kiln
