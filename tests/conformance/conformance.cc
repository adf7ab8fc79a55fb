// The ONNX node conformance runner: case loading, eager and batched compiled runs, comparison,
// report and baseline (see conformance.h).
#include "tests/conformance/conformance.h"

#include <onnx/onnx-data_pb.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "src/kiln/arm/loader.h"
#include "src/kiln/base/file.h"
#include "src/kiln/base/subprocess.h"
#include "src/kiln/base/utf8.h"
#include "src/kiln/compile/driver.h"
#include "src/kiln/compile/packed_boundary.h"
#include "src/kiln/compile/pipeline.h"
#include "src/kiln/eager/interpreter.h"
#include "src/kiln/graph/checkpoint.h"
#include "src/kiln/graph/onnx_import.h"
#include "src/kiln/mint/mint.h"
#include "src/kiln/ops/registry.h"
#include "src/kiln/ops/shape_inference.h"
#include "src/kiln/ops/verifier.h"
#include "src/kiln/tensor/npy.h"

namespace kiln::conformance {
namespace {

namespace fs = std::filesystem;

// Longest reason or mismatch kept in results (messages of nested errors can be long).
constexpr size_t kMaxDetail = 240;

std::string Clip(std::string s) {
  for (char& c : s) {
    if (c == '\n' || c == '|') c = ' ';
  }
  if (s.size() > kMaxDetail) s = s.substr(0, kMaxDetail - 3) + "...";
  return s;
}

ModeResult Pass() { return {Outcome::kPass, ""}; }
ModeResult Fail(const std::string& detail) { return {Outcome::kFail, Clip(detail)}; }
ModeResult Exclude(const std::string& reason) { return {Outcome::kExcluded, Clip(reason)}; }

// An error kiln reports as "not supported" (op, opset, dtype, attribute form) excludes the case
// with that reason; any other error fails it.
ModeResult FromError(const std::string& stage, const Status& s) {
  if (s.code() == StatusCode::kUnimplemented) return Exclude(s.message());
  return Fail(stage + ": " + s.ToString());
}

// --- TensorProto reading ------------------------------------------------------------------

Result<DType> DTypeOfProto(int32_t t) {
  if (std::optional<DType> d = DTypeFromOnnxElemType(t)) return *d;
  const std::string name =
      onnx::TensorProto_DataType_IsValid(t)
          ? onnx::TensorProto_DataType_Name(static_cast<onnx::TensorProto_DataType>(t))
          : "<invalid " + std::to_string(t) + ">";
  return Status::Unimplemented("dtype " + name + " not supported");
}

// A TensorProto as numpy_helper.from_array writes it (raw_data), or with typed fields.
Result<Tensor> TensorFromProto(const onnx::TensorProto& tp, const std::string& what) {
  KILN_ASSIGN_OR_RETURN(DType dtype, DTypeOfProto(tp.data_type()));
  Shape shape(tp.dims().begin(), tp.dims().end());
  for (int64_t d : shape) {
    if (d < 0) return Status::Corruption(what + ": negative dim " + std::to_string(d));
  }
  const int64_t n = NumElements(shape);
  auto count_error = [&](int64_t have) {
    return Status::Corruption(what + ": " + std::to_string(have) + " typed values, expected " +
                              std::to_string(n));
  };
  if (dtype == DType::kString) {
    if (tp.string_data_size() != n) return count_error(tp.string_data_size());
    return Tensor::Strings(shape, {tp.string_data().begin(), tp.string_data().end()});
  }
  const size_t nbytes = static_cast<size_t>(n) * DTypeSize(dtype);
  if (tp.has_raw_data()) {
    if (tp.raw_data().size() != nbytes) {
      return Status::Corruption(what + ": raw_data has " + std::to_string(tp.raw_data().size()) +
                                " bytes, expected " + std::to_string(nbytes) + " for its shape");
    }
    return Tensor::FromBytes(dtype, shape, tp.raw_data().data(), nbytes);
  }
  KILN_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(dtype, shape));
  switch (dtype) {
    case DType::kFloat32:
      if (tp.float_data_size() != n) return count_error(tp.float_data_size());
      std::copy(tp.float_data().begin(), tp.float_data().end(), t.data<float>());
      break;
    case DType::kInt64:
      if (tp.int64_data_size() != n) return count_error(tp.int64_data_size());
      std::copy(tp.int64_data().begin(), tp.int64_data().end(), t.data<int64_t>());
      break;
    case DType::kFloat64:
      if (tp.double_data_size() != n) return count_error(tp.double_data_size());
      std::copy(tp.double_data().begin(), tp.double_data().end(), t.data<double>());
      break;
    case DType::kUInt32:
    case DType::kUInt64:
      if (tp.uint64_data_size() != n) return count_error(tp.uint64_data_size());
      for (int64_t i = 0; i < n; ++i) {
        const uint64_t v = tp.uint64_data(static_cast<int>(i));
        if (dtype == DType::kUInt32) {
          t.data<uint32_t>()[i] = static_cast<uint32_t>(v);
        } else {
          t.data<uint64_t>()[i] = v;
        }
      }
      break;
    default:  // int32, int16, uint16, int8, uint8, bool, float16 and bfloat16 bits: int32_data
      if (tp.int32_data_size() != n) return count_error(tp.int32_data_size());
      for (int64_t i = 0; i < n; ++i) {
        const int32_t v = tp.int32_data(static_cast<int>(i));
        switch (dtype) {
          case DType::kInt32:
            t.data<int32_t>()[i] = v;
            break;
          case DType::kInt8:
            t.data<int8_t>()[i] = static_cast<int8_t>(v);
            break;
          case DType::kFloat16:
          case DType::kBFloat16:
          case DType::kInt16:
          case DType::kUInt16:
            t.data<uint16_t>()[i] = static_cast<uint16_t>(v);
            break;
          default:
            t.data<uint8_t>()[i] = static_cast<uint8_t>(v);
            break;
        }
      }
  }
  return t;
}

// The element dtype a declared (tensor, sequence or optional) type names.
Result<std::pair<ValueKind, DType>> DeclaredKind(const onnx::TypeProto& type,
                                                 const std::string& what) {
  const onnx::TypeProto* t = &type;
  bool optional = false, sequence = false;
  if (t->has_optional_type()) {
    optional = true;
    t = &t->optional_type().elem_type();
  }
  if (t->has_sequence_type()) {
    sequence = true;
    t = &t->sequence_type().elem_type();
  }
  if (!t->has_tensor_type()) return Status::Unimplemented(what + ": map values not supported");
  KILN_ASSIGN_OR_RETURN(DType dt, DTypeOfProto(t->tensor_type().elem_type()));
  const ValueKind kind =
      optional ? (sequence ? ValueKind::kOptionalSequence : ValueKind::kOptionalTensor)
               : (sequence ? ValueKind::kSequence : ValueKind::kTensor);
  return std::make_pair(kind, dt);
}

Result<Tensor> SequenceFromProto(const onnx::SequenceProto& sp, DType elem,
                                 const std::string& what) {
  if (sp.elem_type() != onnx::SequenceProto::TENSOR && sp.tensor_values_size() > 0) {
    return Status::Unimplemented(what + ": sequences of non-tensors not supported");
  }
  std::vector<Tensor> items;
  for (const onnx::TensorProto& tp : sp.tensor_values()) {
    KILN_ASSIGN_OR_RETURN(Tensor t, TensorFromProto(tp, what));
    items.push_back(std::move(t));
  }
  return Tensor::Sequence(elem, std::move(items));
}

// Reads one input_K.pb / output_K.pb of the declared type.
Result<Tensor> ReadValueFile(const std::string& path, const onnx::TypeProto& type) {
  KILN_ASSIGN_OR_RETURN(std::string bytes, ReadFile(path));
  KILN_ASSIGN_OR_RETURN(auto kd, DeclaredKind(type, path));
  const auto [kind, dtype] = kd;
  switch (kind) {
    case ValueKind::kTensor: {
      onnx::TensorProto tp;
      if (!tp.ParseFromString(bytes)) return Status::Corruption(path + ": not a TensorProto");
      return TensorFromProto(tp, path);
    }
    case ValueKind::kSequence: {
      onnx::SequenceProto sp;
      if (!sp.ParseFromString(bytes)) return Status::Corruption(path + ": not a SequenceProto");
      return SequenceFromProto(sp, dtype, path);
    }
    case ValueKind::kOptionalTensor:
    case ValueKind::kOptionalSequence: {
      onnx::OptionalProto op;
      if (!op.ParseFromString(bytes)) return Status::Corruption(path + ": not an OptionalProto");
      const ValueKind inner =
          kind == ValueKind::kOptionalSequence ? ValueKind::kSequence : ValueKind::kTensor;
      Tensor value;
      if (op.has_tensor_value()) {
        KILN_ASSIGN_OR_RETURN(value, TensorFromProto(op.tensor_value(), path));
      } else if (op.has_sequence_value()) {
        KILN_ASSIGN_OR_RETURN(value, SequenceFromProto(op.sequence_value(), dtype, path));
      }
      return Tensor::Optional(inner, dtype, value);
    }
  }
  return Status::Internal(path + ": unknown value kind");
}

// --- one case, loaded -----------------------------------------------------------------------

// A case whose outputs come from random draws: kiln's generator is seeded and reproducible, but
// its draws are not numpy's, so such outputs are checked by what the op can produce (their
// support, dtype and shape), never by value. A case is random when its graph holds an op kiln
// marks nondeterministic (OpDef::nondeterministic: Bernoulli, RandomUniformLike, ...) or a
// Dropout whose training_mode is true with a ratio above 0.
struct RandomSpec {
  enum class Kind { kNone, kDraws, kDropout } kind = Kind::kNone;
  // kDraws: every output value must lie in [lo, hi] (Bernoulli: 0 or 1, integer-valued).
  bool integer = false;
  double lo = 0, hi = 0;
  // kDropout: the input, the ratio and the output and mask names.
  std::string x, y, mask;
  double ratio = 0.5;
};

struct Loaded {
  onnx::ModelProto model;
  std::vector<std::string> input_names;  // graph input order
  TensorMap inputs;
  std::vector<std::pair<std::string, Tensor>> expected;  // graph output order
  RandomSpec random;
};

// The scalar value of `name`: a graph input of the case or an initializer; nullopt otherwise.
std::optional<double> ScalarValue(const Loaded& l, const std::string& name) {
  auto it = l.inputs.find(name);
  if (it != l.inputs.end() && it->second.is_tensor() && it->second.numel() == 1) {
    return it->second.GetAsDouble(0);
  }
  for (const auto& init : l.model.graph().initializer()) {
    if (init.name() != name) continue;
    auto t = TensorFromProto(init, name);
    if (t.ok() && t->numel() == 1) return t->GetAsDouble(0);
  }
  return std::nullopt;
}

RandomSpec FindRandom(const Loaded& l) {
  RandomSpec r;
  std::map<std::string, int64_t> opsets;
  for (const auto& o : l.model.opset_import()) {
    opsets[o.domain() == "ai.onnx" ? "" : o.domain()] = o.version();
  }
  for (const auto& n : l.model.graph().node()) {
    const std::string domain = n.domain() == "ai.onnx" ? "" : n.domain();
    auto def = OpRegistry::Global().Find(domain, n.op_type(), opsets[domain]);
    if (def.ok() && (*def)->nondeterministic) {
      r.kind = RandomSpec::Kind::kDraws;
      if (n.op_type() == "Bernoulli") {
        r.integer = true;
        r.lo = 0;
        r.hi = 1;
        return r;  // a Bernoulli's expansion holds a RandomUniformLike: the Bernoulli decides
      }
      r.lo = -INFINITY;
      r.hi = INFINITY;
    }
    if (n.op_type() == "Dropout" && n.input_size() > 2 && !n.input(2).empty()) {
      const std::optional<double> mode = ScalarValue(l, n.input(2));
      double ratio = 0.5;
      if (n.input_size() > 1 && !n.input(1).empty()) {
        ratio = ScalarValue(l, n.input(1)).value_or(0.5);
      }
      if (mode && *mode != 0 && ratio > 0) {
        r.kind = RandomSpec::Kind::kDropout;
        r.x = n.input(0);
        r.ratio = ratio;
        r.y = n.output(0);
        if (n.output_size() > 1) r.mask = n.output(1);
        return r;
      }
    }
  }
  return r;
}

// Loads model and data set 0. Unimplemented: the case is excluded (a dtype or value kind kiln
// has no type for).
Result<Loaded> Load(const CaseInfo& info) {
  Loaded l;
  KILN_ASSIGN_OR_RETURN(std::string bytes, ReadFile(info.dir + "/model.onnx"));
  if (!l.model.ParseFromString(bytes)) {
    return Status::Corruption(info.dir + "/model.onnx: not a ModelProto");
  }
  const onnx::GraphProto& g = l.model.graph();
  const std::string data = info.dir + "/test_data_set_0";
  for (int j = 0; j < g.input_size(); ++j) {
    const std::string path = data + "/input_" + std::to_string(j) + ".pb";
    KILN_ASSIGN_OR_RETURN(Tensor t, ReadValueFile(path, g.input(j).type()));
    l.input_names.push_back(g.input(j).name());
    l.inputs[g.input(j).name()] = std::move(t);
  }
  for (int j = 0; j < g.output_size(); ++j) {
    const std::string path = data + "/output_" + std::to_string(j) + ".pb";
    KILN_ASSIGN_OR_RETURN(Tensor t, ReadValueFile(path, g.output(j).type()));
    l.expected.emplace_back(g.output(j).name(), std::move(t));
  }
  l.random = FindRandom(l);
  return l;
}

// --- comparison -----------------------------------------------------------------------------

std::string Num(double v) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}

// "" when `got` matches `want` under onnx's backend-test rule, else the first difference.
// Sequences and optionals match item by item.
std::string FirstMismatch(const std::string& name, const Tensor& got, const Tensor& want,
                          double rtol, double atol) {
  const std::string where = "output '" + name + "'";
  if (got.kind() != want.kind()) {
    return where + ": " + got.TypeString() + ", want " + want.TypeString();
  }
  if (!want.is_tensor()) {
    if (got.dtype() != want.dtype() || got.items().size() != want.items().size()) {
      return where + ": " + got.TypeString() + ", want " + want.TypeString();
    }
    for (size_t i = 0; i < want.items().size(); ++i) {
      const std::string m = FirstMismatch(name + "[" + std::to_string(i) + "]", got.items()[i],
                                          want.items()[i], rtol, atol);
      if (!m.empty()) return m;
    }
    return "";
  }
  if (got.dtype() != want.dtype()) {
    return where + ": dtype " + DTypeName(got.dtype()) + ", want " + DTypeName(want.dtype());
  }
  if (got.shape() != want.shape()) {
    return where + ": shape " + ShapeToString(got.shape()) + ", want " +
           ShapeToString(want.shape());
  }
  const bool is_float = IsFloatDType(want.dtype());
  for (int64_t i = 0; i < want.numel(); ++i) {
    bool ok;
    if (want.dtype() == DType::kString) {
      if (got.str(i) != want.str(i)) {
        return where + " [" + std::to_string(i) + "]: got '" + EscapeBytes(got.str(i)) +
               "', want '" + EscapeBytes(want.str(i)) + "'";
      }
    } else if (is_float) {
      const double g = got.GetAsDouble(i), w = want.GetAsDouble(i);
      if (std::isnan(w) || std::isnan(g)) {
        ok = std::isnan(w) && std::isnan(g);
      } else if (std::isinf(w) || std::isinf(g)) {
        ok = g == w;
      } else {
        ok = std::fabs(g - w) <= atol + rtol * std::fabs(w);
      }
      if (!ok) return where + " [" + std::to_string(i) + "]: got " + Num(g) + ", want " + Num(w);
    } else {
      const int64_t g = got.GetAsInt64(i), w = want.GetAsInt64(i);
      if (g != w) {
        return where + " [" + std::to_string(i) + "]: got " + std::to_string(g) + ", want " +
               std::to_string(w);
      }
    }
  }
  return "";
}

// For a case whose outputs come from random draws (RandomCheck below): "" when `got` has the
// dtype and shape of `want` and every value is one the op can draw, else the first that is not.
// Dropout's output keeps an element scaled by 1 / (1 - ratio) or zeroes it, its mask says
// which; Bernoulli draws 0 or 1.
std::string RandomMismatch(const std::string& name, const Tensor& got, const Tensor& want,
                           const std::function<std::string(int64_t, double)>& allowed) {
  const std::string where = "output '" + name + "'";
  if (!got.is_tensor() || got.dtype() != want.dtype() || got.shape() != want.shape()) {
    return where + ": " + got.TypeString() + ", want " + want.TypeString();
  }
  for (int64_t i = 0; i < got.numel(); ++i) {
    const std::string m = allowed(i, got.GetAsDouble(i));
    if (!m.empty()) return where + " [" + std::to_string(i) + "]: " + m;
  }
  return "";
}

// The first difference between `got` (outputs named `prefix` + name) and the case's expected
// outputs: by value, or for a random case (RandomSpec) by what the op can draw.
std::string OutputsMismatch(const TensorMap& got, const Loaded& l, const std::string& prefix,
                            const CaseInfo& info) {
  const RandomSpec& r = l.random;
  for (const auto& [name, want] : l.expected) {
    auto it = got.find(prefix + name);
    if (it == got.end()) return "output '" + name + "' was not produced";
    const Tensor& g = it->second;
    std::string m;
    if (r.kind == RandomSpec::Kind::kNone) {
      m = FirstMismatch(name, g, want, info.rtol, info.atol);
    } else if (r.kind == RandomSpec::Kind::kDraws) {
      m = RandomMismatch(name, g, want, [&](int64_t, double v) -> std::string {
        const bool ok = v >= r.lo && v <= r.hi && (!r.integer || v == std::floor(v));
        return ok ? "" : "drew " + Num(v) + ", outside what the op can draw";
      });
    } else {
      auto x = l.inputs.find(r.x);
      auto y = got.find(prefix + r.y);
      auto mask = r.mask.empty() ? got.end() : got.find(prefix + r.mask);
      if (x == l.inputs.end() || y == got.end()) return "dropout input or output missing";
      const double scale = 1.0 / (1.0 - r.ratio);
      m = RandomMismatch(name, g, want, [&](int64_t i, double v) -> std::string {
        const double xi = x->second.GetAsDouble(i) * scale;
        const double yi = y->second.GetAsDouble(i);
        const bool kept = std::fabs(yi - xi) <= info.atol + info.rtol * std::fabs(xi);
        if (name == r.mask) {
          return (v != 0) == kept || (yi == 0 && xi == 0) ? "" : "mask disagrees with the output";
        }
        return kept || v == 0 ? "" : "got " + Num(v) + ", want 0 or " + Num(xi);
      });
      if (m.empty() && mask != got.end() && name == r.y) {
        for (int64_t i = 0; i < mask->second.numel(); ++i) {
          if (mask->second.GetAsInt64(i) == 0 && y->second.GetAsDouble(i) != 0) {
            m = "output '" + name + "' [" + std::to_string(i) + "]: dropped but not zero";
            break;
          }
        }
      }
    }
    if (!m.empty()) return m;
  }
  return "";
}

ModeResult Compare(const TensorMap& got, const Loaded& l, const std::string& prefix,
                   const CaseInfo& info) {
  const std::string m = OutputsMismatch(got, l, prefix, info);
  return m.empty() ? Pass() : Fail(m);
}

// --- eager ----------------------------------------------------------------------------------

ModeResult RunEager(const CaseInfo& info, const Loaded& l) {
  auto graph = ImportOnnxBytes(l.model.SerializeAsString(), "model");
  if (!graph.ok()) return FromError("import", graph.status());
  auto interp = Interpreter::Create(std::make_shared<const Graph>(std::move(graph).value()));
  if (!interp.ok()) return FromError("verify", interp.status());
  auto out = interp->Run(l.inputs);
  if (!out.ok()) return FromError("run", out.status());
  return Compare(*out, l, "", info);
}

// --- compiled -------------------------------------------------------------------------------

// A case ready to join a compiled batch: its model and its runtime inputs, exactly as a user
// hands them to `kiln run --compile` (an input that decides an output shape stays an input; the
// cell runs the nodes it decides as a dynamic region).
struct Prepared {
  size_t index = 0;  // into the results
  Loaded l;          // model, inputs, expected outputs
  std::string opset_key;
};

std::string OpsetKey(const onnx::ModelProto& m) {
  std::map<std::string, int64_t> opsets;
  for (const auto& o : m.opset_import())
    opsets[o.domain() == "ai.onnx" ? "" : o.domain()] = o.version();
  std::string key;
  for (const auto& [d, v] : opsets)
    key += (d.empty() ? "ai.onnx" : d) + ":" + std::to_string(v) + " ";
  return key;
}

Result<Graph> ImportAndInfer(const onnx::ModelProto& model, const TensorMap& inputs,
                             const std::string& what) {
  KILN_ASSIGN_OR_RETURN(Graph graph, ImportOnnxBytes(model.SerializeAsString(), what));
  KILN_RETURN_IF_ERROR(VerifyGraph(graph));
  std::map<std::string, Shape> shapes;
  for (const auto& [n, t] : inputs) shapes[n] = t.shape();
  KILN_ASSIGN_OR_RETURN(InferredGraph inf, InferShapes(graph, shapes, /*tolerate_dynamic=*/true));
  (void)inf;
  return graph;
}

// Checks the case compiles to a cell source on its own (cheap: no system compiler). A result
// other than kPass settles the compiled outcome.
ModeResult Prepare(const CaseInfo& info, Loaded l, size_t index, Prepared* p) {
  p->index = index;
  p->l = std::move(l);
  p->opset_key = OpsetKey(p->l.model);
  Result<Graph> graph = ImportAndInfer(p->l.model, p->l.inputs, "model");
  if (!graph.ok()) return FromError("shape inference", graph.status());
  // Sequences, optionals and strings at the graph's edge cross the cell packed into bytes, as
  // `kiln run --compile` passes them.
  auto boundary = PackBoundary(*graph);
  if (!boundary.ok()) return FromError("pack boundary", boundary.status());
  auto cell_inputs = PackInputs(*boundary, p->l.inputs);
  if (!cell_inputs.ok()) return FromError("pack inputs", cell_inputs.status());
  ShapeClass cls;
  for (const auto& [n, t] : *cell_inputs) cls[n] = t.shape();
  auto cell =
      GenerateCell(boundary->graph, Envelope{{cls}}, "conformance", CompileOptions{}, nullptr);
  if (!cell.ok()) return FromError("compile", cell.status());
  return Pass();
}

// Renames every value and node of `g` and its subgraphs with `prefix`. Applied uniformly, it
// keeps outer-scope references of subgraphs intact.
void RenameGraph(onnx::GraphProto* g, const std::string& prefix) {
  auto rename = [&](std::string* s) {
    if (!s->empty()) *s = prefix + *s;
  };
  for (auto& n : *g->mutable_node()) {
    rename(n.mutable_name());
    for (auto& s : *n.mutable_input()) rename(&s);
    for (auto& s : *n.mutable_output()) rename(&s);
    for (auto& a : *n.mutable_attribute()) {
      if (a.has_g()) RenameGraph(a.mutable_g(), prefix);
      for (auto& sub : *a.mutable_graphs()) RenameGraph(&sub, prefix);
    }
  }
  for (auto& v : *g->mutable_input()) rename(v.mutable_name());
  for (auto& v : *g->mutable_output()) rename(v.mutable_name());
  for (auto& v : *g->mutable_value_info()) rename(v.mutable_name());
  for (auto& t : *g->mutable_initializer()) rename(t.mutable_name());
}

std::string Prefix(size_t index) { return "c" + std::to_string(index) + "_"; }

// Builds, loads and runs one cell holding every case of `batch`; on success records each case's
// comparison. A failure of the batch as a whole is returned for bisection.
Status RunBatch(const std::vector<const Prepared*>& batch, const RunOptions& options, int serial,
                std::vector<CaseResult>& results) {
  onnx::ModelProto merged;
  merged.set_ir_version(batch[0]->l.model.ir_version());
  *merged.mutable_opset_import() = batch[0]->l.model.opset_import();
  merged.mutable_graph()->set_name("conformance");
  TensorMap inputs;
  for (const Prepared* p : batch) {
    onnx::GraphProto g = p->l.model.graph();
    RenameGraph(&g, Prefix(p->index));
    merged.mutable_graph()->MergeFrom(g);
    for (const auto& [n, t] : p->l.inputs) inputs[Prefix(p->index) + n] = t;
  }
  merged.mutable_graph()->set_name("conformance");
  KILN_ASSIGN_OR_RETURN(Graph imported, ImportAndInfer(merged, inputs, "batch"));
  KILN_ASSIGN_OR_RETURN(PackedBoundary boundary, PackBoundary(imported));
  KILN_ASSIGN_OR_RETURN(inputs, PackInputs(boundary, inputs));
  auto shared = std::make_shared<const Graph>(std::move(boundary.graph));
  ShapeClass cls;
  for (const auto& [n, t] : inputs) cls[n] = t.shape();
  KILN_ASSIGN_OR_RETURN(EmittedCell cell, GenerateCell(*shared, Envelope{{cls}}, "conformance",
                                                       CompileOptions{}, nullptr));
  KILN_ASSIGN_OR_RETURN(Toolchain toolchain, LocalToolchain());
  auto driver = MakeSystemCompilerDriver(toolchain);
  const std::string dir = options.work_dir + "/batch" + std::to_string(serial);
  KILN_RETURN_IF_ERROR(MakeDirs(dir));
  struct Cleanup {
    std::string dir;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } cleanup{dir};
  KILN_ASSIGN_OR_RETURN(std::string so, BuildSharedObject(cell.source, 1, DefaultSmTarget(),
                                                          "conformance", *driver, dir, 1, nullptr));
  KILN_ASSIGN_OR_RETURN(auto lib, OpenCellBytes(so, dir + "/load"));
  KILN_ASSIGN_OR_RETURN(std::vector<EntryMetadata> entries,
                        EntriesFromDescribe(cell.describe, Envelope{{cls}}));
  KILN_ASSIGN_OR_RETURN(auto armed,
                        ArmedCell::Arm(lib, entries, GraphWeights(*shared), Lane::kIntake, "", 1));
  KILN_ASSIGN_OR_RETURN(TensorMap cell_outputs, armed->Run(0, inputs));
  KILN_ASSIGN_OR_RETURN(TensorMap got, UnpackOutputs(boundary, cell_outputs));
  for (const Prepared* p : batch) {
    results[p->index].compiled = Compare(got, p->l, Prefix(p->index), results[p->index].info);
  }
  return Status::OK();
}

void RunBisecting(const std::vector<const Prepared*>& batch, const RunOptions& options, int* serial,
                  std::vector<CaseResult>& results) {
  if (batch.empty()) return;
  if (options.verbose && options.log) {
    std::string names;
    for (const Prepared* p : batch) names += " " + results[p->index].info.name;
    options.log("conformance: compiled batch:" + names);
  }
  const Status s = RunBatch(batch, options, (*serial)++, results);
  if (s.ok()) return;
  if (batch.size() == 1) {
    results[batch[0]->index].compiled = FromError("compiled batch of one", s);
    return;
  }
  if (options.log) {
    options.log("conformance: a batch of " + std::to_string(batch.size()) + " cases failed (" +
                Clip(s.ToString()) + "); bisecting");
  }
  const size_t half = batch.size() / 2;
  RunBisecting({batch.begin(), batch.begin() + half}, options, serial, results);
  RunBisecting({batch.begin() + half, batch.end()}, options, serial, results);
}

// --- the command line -------------------------------------------------------------------

// The file stem `kiln run --out` gives an output (src/kiln/cli/util.cc SafeFileName).
std::string SafeStem(const std::string& name) {
  std::string out;
  for (char c : name) {
    const bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
    out += ok ? c : '_';
  }
  if (out.empty() || out == "." || out == "..") out = "_" + out;
  return out;
}

// Reads back output `want`'s value as `kiln run` wrote it into `dir` (tensor/npy.h WriteValue).
Result<Tensor> ReadOutput(const std::string& dir, const std::string& name, const Tensor& want) {
  const std::string stem = dir + "/" + SafeStem(name);
  std::error_code ec;
  if (!want.is_tensor() && want.kind() != ValueKind::kSequence && fs::exists(stem + ".none", ec)) {
    return ReadValue(stem + ".none", want.kind(), want.dtype());
  }
  const bool dir_form =
      want.kind() == ValueKind::kSequence || want.kind() == ValueKind::kOptionalSequence;
  return ReadValue(dir_form ? stem : stem + ".npy", want.kind(), want.dtype());
}

// The path `kiln run --input NAME=PATH` names for input `value`, written under `dir`.
Result<std::string> WriteInput(const std::string& dir, const std::string& name,
                               const Tensor& value) {
  if (!value.is_tensor() && value.kind() != ValueKind::kSequence && value.items().empty()) {
    return std::string(kNoneValuePath);
  }
  return WriteValue(dir, SafeStem(name), value);
}

// One `kiln run` of a case: its outputs compared with the expected ones. An error kiln reports
// as unimplemented excludes the case, any other fails it.
ModeResult RunCli(const CaseInfo& info, const Loaded& l, const std::string& kiln,
                  const std::map<std::string, std::string>& input_paths, const std::string& dir,
                  bool compile) {
  const std::string out_dir = dir + (compile ? "/compiled" : "/eager");
  std::vector<std::string> argv = {kiln, "run", info.dir + "/model.onnx", "--out", out_dir};
  for (const auto& [name, path] : input_paths) {
    argv.push_back("--input");
    argv.push_back(name + "=" + path);
  }
  if (compile) argv.push_back("--compile");
  std::string output;
  auto rc = RunProcess(argv, &output);
  if (!rc.ok()) return Fail("kiln run: " + rc.status().ToString());
  if (*rc != 0) {
    std::string last = output;
    while (!last.empty() && last.back() == '\n') last.pop_back();
    last = last.substr(last.rfind('\n') == std::string::npos ? 0 : last.rfind('\n') + 1);
    if (last.find("unimplemented:") != std::string::npos) return Exclude(last);
    return Fail(last.empty() ? "kiln run exited " + std::to_string(*rc) : last);
  }
  TensorMap got;
  for (const auto& [name, want] : l.expected) {
    auto value = ReadOutput(out_dir, name, want);
    if (!value.ok()) return Fail("output '" + name + "': " + value.status().ToString());
    got[name] = std::move(value).value();
  }
  return Compare(got, l, "", info);
}

void RunCommandLine(std::vector<CaseResult>& results, const RunOptions& options) {
  std::atomic<size_t> next{0};
  std::mutex log_mu;
  auto worker = [&] {
    for (size_t i = next++; i < results.size(); i = next++) {
      CaseResult& r = results[i];
      if (options.skip.count(r.info.name)) {
        r.cli_eager = r.cli_compiled = Exclude("skipped (--skip)");
        continue;
      }
      auto loaded = Load(r.info);
      if (!loaded.ok()) {
        r.cli_eager = r.cli_compiled = FromError("load", loaded.status());
        continue;
      }
      const std::string dir = options.work_dir + "/cli/" + r.info.name;
      Status made = MakeDirs(dir + "/in");
      std::map<std::string, std::string> input_paths;
      for (const auto& [name, t] : loaded->inputs) {
        if (!made.ok()) break;
        Result<std::string> path = WriteInput(dir + "/in", name, t);
        if (path.ok()) {
          input_paths[name] = *path;
        } else {
          made = path.status();
        }
      }
      if (!made.ok()) {
        r.cli_eager = r.cli_compiled = Fail(made.ToString());
        continue;
      }
      r.cli_eager = RunCli(r.info, *loaded, options.cli_kiln, input_paths, dir, false);
      r.cli_compiled = RunCli(r.info, *loaded, options.cli_kiln, input_paths, dir, true);
      std::error_code ec;
      fs::remove_all(dir, ec);
      if (options.log) {
        // Every failure with kiln's last line (or the first mismatch), so a failure that does not
        // reproduce still leaves its cause in the log; passes only with --verbose.
        std::lock_guard<std::mutex> lock(log_mu);
        for (const auto* m : {&r.cli_eager, &r.cli_compiled}) {
          if (m->outcome != Outcome::kFail) continue;
          options.log("conformance: cli " + r.info.name + " " +
                      (m == &r.cli_eager ? "eager" : "compiled") + " fail: " + m->detail);
        }
        if (options.verbose) {
          options.log("conformance: cli " + r.info.name + " eager " +
                      OutcomeName(r.cli_eager.outcome) + ", compiled " +
                      OutcomeName(r.cli_compiled.outcome));
        }
      }
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < std::max(1, options.cli_jobs); ++t) threads.emplace_back(worker);
  for (auto& t : threads) t.join();
}

}  // namespace

const char* OutcomeName(Outcome outcome) {
  switch (outcome) {
    case Outcome::kPass:
      return "pass";
    case Outcome::kFail:
      return "fail";
    case Outcome::kExcluded:
      return "excluded";
  }
  return "?";
}

Result<std::vector<CaseInfo>> ReadIndex(const std::string& cases_dir) {
  const std::string path = cases_dir + "/index.tsv";
  KILN_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  std::vector<CaseInfo> cases;
  std::istringstream in(text);
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> f;
    std::istringstream ls(line);
    std::string field;
    while (std::getline(ls, field, '\t')) f.push_back(field);
    if (f.size() != 5) {
      return Status::Corruption(path + ":" + std::to_string(lineno) + ": " +
                                std::to_string(f.size()) + " fields, expected 5");
    }
    CaseInfo c;
    c.name = f[0];
    c.op = f[1];
    char* end = nullptr;
    c.opset = std::strtoll(f[2].c_str(), &end, 10);
    c.rtol = std::strtod(f[3].c_str(), &end);
    c.atol = std::strtod(f[4].c_str(), &end);
    c.dir = cases_dir + "/" + c.name;
    cases.push_back(std::move(c));
  }
  if (cases.empty()) return Status::Corruption(path + ": no cases");
  return cases;
}

std::vector<CaseResult> RunCases(const std::vector<CaseInfo>& cases, const RunOptions& options) {
  const std::vector<std::string> op_types = OpRegistry::Global().OpTypes(/*all_domains=*/true);
  const std::set<std::string> listed(op_types.begin(), op_types.end());
  std::vector<CaseResult> results(cases.size());
  std::vector<Prepared> prepared;
  prepared.reserve(cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    CaseResult& r = results[i];
    r.info = cases[i];
    r.op_listed = listed.count(r.info.op) != 0;
    if (!r.op_listed) {
      r.eager = r.compiled = Exclude("op not listed as supported");
      continue;
    }
    if (options.skip.count(r.info.name)) {
      r.eager = r.compiled = Exclude("skipped (--skip)");
      continue;
    }
    if (options.verbose && options.log) options.log("conformance: eager " + r.info.name);
    auto loaded = Load(r.info);
    if (!loaded.ok()) {
      r.kiln_dtypes = loaded.status().message().rfind("dtype ", 0) != 0;
      r.eager = r.compiled = FromError("load", loaded.status());
      continue;
    }
    r.eager = RunEager(r.info, *loaded);
    if (r.eager.outcome == Outcome::kExcluded) {
      // Kiln refuses the case (op form, attribute, dtype); a cell runs the same contract.
      r.compiled = r.eager;
      continue;
    }
    if (!options.compiled) {
      r.compiled = Exclude(options.compiled_skip_reason);
      continue;
    }
    Prepared p;
    r.compiled = Prepare(r.info, std::move(loaded).value(), i, &p);
    if (r.compiled.outcome == Outcome::kPass) {
      r.compiled = Fail("compiled batch did not run");  // replaced by the batch's comparison
      prepared.push_back(std::move(p));
    }
  }
  if (options.log) {
    options.log("conformance: eager done; " + std::to_string(prepared.size()) +
                " cases to compile");
  }
  std::map<std::string, std::vector<const Prepared*>> groups;
  for (const Prepared& p : prepared) groups[p.opset_key].push_back(&p);
  int serial = 0;
  for (const auto& [key, group] : groups) {
    for (size_t start = 0; start < group.size(); start += options.batch_size) {
      const size_t end = std::min(group.size(), start + options.batch_size);
      if (options.log) {
        options.log("conformance: compiling " + key + "cases " + std::to_string(start) + "-" +
                    std::to_string(end) + " of " + std::to_string(group.size()));
      }
      RunBisecting({group.begin() + start, group.begin() + end}, options, &serial, results);
    }
  }
  if (!options.cli_kiln.empty()) {
    if (options.log) {
      options.log("conformance: every case through `" + options.cli_kiln +
                  " run` and `run "
                  "--compile`, " +
                  std::to_string(options.cli_jobs) + " at a time");
    }
    RunCommandLine(results, options);
  } else {
    for (CaseResult& r : results) r.cli_eager = r.cli_compiled = Exclude("command line not run");
  }
  return results;
}

std::set<std::string> PassingLines(const std::vector<CaseResult>& results) {
  std::set<std::string> lines;
  for (const CaseResult& r : results) {
    if (r.eager.outcome == Outcome::kPass) lines.insert("eager " + r.info.name);
    if (r.compiled.outcome == Outcome::kPass) lines.insert("compiled " + r.info.name);
  }
  return lines;
}

std::string RenderBaseline(const std::vector<CaseResult>& results) {
  std::string out =
      "# ONNX node conformance baseline: every (mode, case) that passes. Written by\n"
      "# `bash tools/conformance.sh --update`; the conformance test fails when one stops "
      "passing.\n";
  for (const std::string& l : PassingLines(results)) out += l + "\n";
  return out;
}

Result<std::set<std::string>> ReadSkipFile(const std::string& path) {
  std::set<std::string> names;
  if (!fs::exists(path)) return names;
  KILN_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    line = line.substr(0, line.find('#'));
    while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
    if (!line.empty()) names.insert(line);
  }
  return names;
}

Result<std::set<std::string>> ReadBaseline(const std::string& path) {
  KILN_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  std::set<std::string> lines;
  std::istringstream in(text);
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.empty() || line[0] == '#') continue;
    if (line.rfind("eager ", 0) != 0 && line.rfind("compiled ", 0) != 0) {
      return Status::Corruption(path + ":" + std::to_string(lineno) + ": '" + line +
                                "' is not 'eager <case>' or 'compiled <case>'");
    }
    lines.insert(line);
  }
  return lines;
}

BaselineDiff DiffBaseline(const std::vector<CaseResult>& results,
                          const std::set<std::string>& baseline, bool compiled_ran) {
  BaselineDiff diff;
  std::map<std::string, const ModeResult*> by_line;
  for (const CaseResult& r : results) {
    by_line["eager " + r.info.name] = &r.eager;
    by_line["compiled " + r.info.name] = &r.compiled;
  }
  for (const std::string& line : baseline) {
    if (!compiled_ran && line.rfind("compiled ", 0) == 0) continue;
    auto it = by_line.find(line);
    if (it == by_line.end()) {
      diff.regressions.push_back(line + ": no such case was generated");
    } else if (it->second->outcome != Outcome::kPass) {
      diff.regressions.push_back(line + ": " + OutcomeName(it->second->outcome) + ": " +
                                 it->second->detail);
    }
  }
  for (const std::string& line : PassingLines(results)) {
    if (!baseline.count(line)) diff.new_passes.push_back(line);
  }
  return diff;
}

Summary Summarize(const std::vector<CaseResult>& results) {
  Summary s;
  std::map<std::string, bool> op_passes;
  for (const CaseResult& r : results) {
    ++s.total;
    const bool e = r.eager.outcome == Outcome::kPass;
    const bool c = r.compiled.outcome == Outcome::kPass;
    s.eager_pass += e;
    s.compiled_pass += c;
    const bool ce = r.cli_eager.outcome == Outcome::kPass;
    const bool cc = r.cli_compiled.outcome == Outcome::kPass;
    s.cli_ran = s.cli_ran || r.cli_eager.detail != "command line not run";
    s.cli_eager_pass += ce;
    s.cli_compiled_pass += cc;
    s.cli_both_pass += ce && cc;
    if (ce && !cc) s.cli_eager_only.push_back(r.info.name);
    if (!r.op_listed) continue;
    ++s.listed;
    s.listed_eager_pass += e;
    s.listed_compiled_pass += c;
    s.listed_both_pass += e && c;
    if (r.kiln_dtypes) {
      ++s.listed_typed;
      s.listed_typed_eager_pass += e;
      s.listed_typed_compiled_pass += c;
    }
    op_passes[r.info.op] = op_passes[r.info.op] || e;
  }
  for (const auto& [op, pass] : op_passes) {
    if (!pass) s.listed_ops_without_pass.push_back(op);
  }
  return s;
}

namespace {
std::string Percent(int64_t n, int64_t d) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f%%", d == 0 ? 0.0 : 100.0 * static_cast<double>(n) / d);
  return buf;
}
}  // namespace

std::string SummaryLine(const Summary& s) {
  return std::to_string(s.total) + " cases: " + std::to_string(s.eager_pass) + " pass eager (" +
         Percent(s.eager_pass, s.total) + "), " + std::to_string(s.compiled_pass) +
         " pass compiled (" + Percent(s.compiled_pass, s.total) + ")" +
         (s.cli_ran ? "; command line: " + std::to_string(s.cli_eager_pass) + " pass `kiln run` (" +
                          Percent(s.cli_eager_pass, s.total) + "), " +
                          std::to_string(s.cli_compiled_pass) + " pass `kiln run --compile` (" +
                          Percent(s.cli_compiled_pass, s.total) + ")"
                    : "");
}

Result<std::map<std::string, std::string>> ReadExplanations(const std::string& path) {
  std::map<std::string, std::string> out;
  if (!fs::exists(path)) return out;
  KILN_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  std::istringstream in(text);
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.empty() || line[0] == '#') continue;
    const size_t tab = line.find('\t');
    if (tab == std::string::npos || tab == 0 || tab + 1 == line.size()) {
      return Status::Corruption(path + ":" + std::to_string(lineno) +
                                ": expected 'CASE<TAB>explanation'");
    }
    out[line.substr(0, tab)] = line.substr(tab + 1);
  }
  return out;
}

std::string RenderReport(const std::vector<CaseResult>& results, const std::string& generator,
                         const std::map<std::string, std::string>& explanations) {
  const Summary s = Summarize(results);
  std::ostringstream o;
  o << "# ONNX node conformance\n\n"
    << "Generated by `bash tools/conformance.sh --update` (do not edit by hand) from " << generator
    << ". Every case counts, whatever its op. Each runs through the command line as a user "
       "runs it (its inputs written as files, then `kiln run MODEL --input NAME=PATH ...`, and "
       "the same with `--compile`, which mints a cell with the numerics gate and the fence "
       "proof, the case's inputs declared as the sample, and runs it), and in process (the "
       "runner's own eager interpreter, and cells holding every case of one opset, every input "
       "staying an input: a value that decides an output shape makes the nodes it decides the "
       "cell's dynamic region). Outputs are compared with the case's expected outputs at its "
       "tolerance (rtol "
    << (results.empty() ? 1e-3 : results[0].info.rtol) << ", atol "
    << (results.empty() ? 1e-7 : results[0].info.atol)
    << "; NaN equals NaN; integers and strings exact; sequences and optionals element by "
       "element). A case whose outputs are random draws (Bernoulli, training-mode Dropout) is "
       "checked by what the op can draw: dtype, shape and every value in the op's support "
       "(kiln's generator is seeded and reproducible, but its draws are not numpy's). The "
       "runner is `tests/conformance/`; the CI test `conformance_test` fails when a (mode, case) "
       "listed in `tests/conformance/baseline.txt` stops passing. One case reproduces with "
       "`bash tools/conformance.sh --filter CASE --verbose`, or by hand with `kiln run` on "
       "`build/conformance_cases/CASE/model.onnx`.\n\n"
    << "## Summary\n\n";
  if (s.cli_ran) {
    o << "**Through the command line, all " << s.total << " node cases: " << s.cli_eager_pass
      << " pass `kiln run` (" << Percent(s.cli_eager_pass, s.total) << "), " << s.cli_compiled_pass
      << " pass `kiln run --compile` (" << Percent(s.cli_compiled_pass, s.total) << "), "
      << s.cli_both_pass << " pass both.**";
    if (!s.cli_eager_only.empty()) {
      o << " Passing eager but not compiled:";
      for (const std::string& n : s.cli_eager_only) o << " `" << n << "`";
      o << ".";
    }
    o << "\n\n";
  }
  o << "In process: " << s.eager_pass << " of " << s.total << " pass eager ("
    << Percent(s.eager_pass, s.total) << "), " << s.compiled_pass << " pass compiled ("
    << Percent(s.compiled_pass, s.total) << ").\n\n";
  std::map<std::string, std::vector<const CaseResult*>> by_op;
  for (const CaseResult& r : results) by_op[r.info.op].push_back(&r);
  std::vector<std::string> without_pass;
  for (const auto& [op, v] : by_op) {
    bool any = false;
    for (const CaseResult* r : v) {
      any = any || r->eager.outcome == Outcome::kPass || r->cli_eager.outcome == Outcome::kPass;
    }
    if (!any) without_pass.push_back(op);
  }
  const std::vector<std::string> registry_ops = OpRegistry::Global().OpTypes(/*all_domains=*/true);
  std::vector<std::string> no_case;
  for (const std::string& op : registry_ops) {
    if (!by_op.count(op) && op != "Constant") no_case.push_back(op);
  }
  auto join = [](const std::vector<std::string>& v) {
    std::string out;
    for (const auto& x : v) out += (out.empty() ? "" : ", ") + x;
    return out;
  };
  o << "Op types with cases: " << by_op.size() << "; with no passing case: "
    << (without_pass.empty() ? std::string("none") : join(without_pass)) << ". Op types kiln "
    << "registers: " << registry_ops.size() << " (every domain).";
  if (!no_case.empty())
    o << " Registered ops with no node case in this onnx: " << join(no_case) << ".";
  o << "\n\n## Per op\n\n"
    << "| op | cases | `kiln run` pass | `kiln run --compile` pass | in-process eager pass | "
       "in-process compiled pass |\n|---|---|---|---|---|---|\n";
  for (const auto& [op, v] : by_op) {
    int64_t n[4] = {0, 0, 0, 0};
    for (const CaseResult* r : v) {
      n[0] += r->cli_eager.outcome == Outcome::kPass;
      n[1] += r->cli_compiled.outcome == Outcome::kPass;
      n[2] += r->eager.outcome == Outcome::kPass;
      n[3] += r->compiled.outcome == Outcome::kPass;
    }
    o << "| " << op << " | " << v.size();
    for (int i = 0; i < 4; ++i) o << " | " << (s.cli_ran || i >= 2 ? std::to_string(n[i]) : "-");
    o << " |\n";
  }
  o << "\n## Every case that does not pass\n\n"
    << "Per case and mode: fail (a wrong output, with the first mismatch, or an error with "
       "kiln's last line) or excluded (kiln refuses it as unsupported, with the reason), and "
       "why where the reason needs more words (tests/conformance/explanations.txt).\n";
  std::map<std::string, std::vector<std::string>> grouped;  // reason -> "case (mode)"
  for (const CaseResult& r : results) {
    const std::pair<const char*, const ModeResult*> modes[] = {
        {"`kiln run`", &r.cli_eager},
        {"`kiln run --compile`", &r.cli_compiled},
        {"in-process eager", &r.eager},
        {"in-process compiled", &r.compiled}};
    for (const auto& [mode, m] : modes) {
      if (m->outcome == Outcome::kPass) continue;
      if (!s.cli_ran && m->detail == "command line not run") continue;
      if (m->detail.rfind("compiled mode not run", 0) == 0) continue;
      std::string reason = std::string(OutcomeName(m->outcome)) + ": " + m->detail;
      auto e = explanations.find(r.info.name);
      if (e != explanations.end()) reason += " — " + e->second;
      grouped[reason].push_back("`" + r.info.name + "` (" + mode + ")");
    }
  }
  if (grouped.empty()) o << "\nNone.\n";
  for (const auto& [reason, names] : grouped) {
    o << "\n- " << reason << ":";
    for (size_t i = 0; i < names.size(); ++i) o << (i ? ", " : " ") << names[i];
    o << "\n";
  }
  return o.str();
}

}  // namespace kiln::conformance
