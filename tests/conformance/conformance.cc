// The ONNX node conformance runner: case loading, eager and batched compiled runs, comparison,
// report and baseline (see conformance.h).
#include "tests/conformance/conformance.h"

#include <onnx/onnx_pb.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "src/kiln/arm/loader.h"
#include "src/kiln/base/file.h"
#include "src/kiln/base/subprocess.h"
#include "src/kiln/compile/driver.h"
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
  switch (t) {
    case onnx::TensorProto::FLOAT:
      return DType::kFloat32;
    case onnx::TensorProto::FLOAT16:
      return DType::kFloat16;
    case onnx::TensorProto::INT64:
      return DType::kInt64;
    case onnx::TensorProto::INT32:
      return DType::kInt32;
    case onnx::TensorProto::INT8:
      return DType::kInt8;
    case onnx::TensorProto::UINT8:
      return DType::kUInt8;
    case onnx::TensorProto::BOOL:
      return DType::kBool;
    case onnx::TensorProto::DOUBLE:
      return DType::kFloat64;
    case onnx::TensorProto::INT16:
      return DType::kInt16;
    case onnx::TensorProto::UINT16:
      return DType::kUInt16;
    case onnx::TensorProto::UINT32:
      return DType::kUInt32;
    case onnx::TensorProto::UINT64:
      return DType::kUInt64;
    default: {
      const std::string name =
          onnx::TensorProto_DataType_IsValid(t)
              ? onnx::TensorProto_DataType_Name(static_cast<onnx::TensorProto_DataType>(t))
              : "<invalid " + std::to_string(t) + ">";
      return Status::Unimplemented("dtype " + name + " not supported");
    }
  }
}

// A TensorProto as numpy_helper.from_array writes it (raw_data), or with typed fields.
Result<Tensor> TensorFromProto(const onnx::TensorProto& tp, const std::string& what) {
  KILN_ASSIGN_OR_RETURN(DType dtype, DTypeOfProto(tp.data_type()));
  Shape shape(tp.dims().begin(), tp.dims().end());
  for (int64_t d : shape) {
    if (d < 0) return Status::Corruption(what + ": negative dim " + std::to_string(d));
  }
  const int64_t n = NumElements(shape);
  const size_t nbytes = static_cast<size_t>(n) * DTypeSize(dtype);
  if (tp.has_raw_data()) {
    if (tp.raw_data().size() != nbytes) {
      return Status::Corruption(what + ": raw_data has " + std::to_string(tp.raw_data().size()) +
                                " bytes, expected " + std::to_string(nbytes) + " for its shape");
    }
    return Tensor::FromBytes(dtype, shape, tp.raw_data().data(), nbytes);
  }
  KILN_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(dtype, shape));
  auto count_error = [&](int64_t have) {
    return Status::Corruption(what + ": " + std::to_string(have) + " typed values, expected " +
                              std::to_string(n));
  };
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
    default:  // int32, int16, uint16, int8, uint8, bool and float16 bits travel in int32_data
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

Result<onnx::TensorProto> ReadProtoFile(const std::string& path) {
  KILN_ASSIGN_OR_RETURN(std::string bytes, ReadFile(path));
  onnx::TensorProto tp;
  if (!tp.ParseFromString(bytes)) return Status::Corruption(path + ": not a TensorProto");
  return tp;
}

// --- one case, loaded -----------------------------------------------------------------------

struct Loaded {
  onnx::ModelProto model;
  std::vector<std::string> input_names;  // graph input order
  TensorMap inputs;
  std::vector<std::pair<std::string, Tensor>> expected;  // graph output order
};

const char* ValueKind(const onnx::TypeProto& t) {
  if (t.has_sequence_type()) return "sequence";
  if (t.has_map_type()) return "map";
  if (t.has_optional_type()) return "optional";
  if (t.has_sparse_tensor_type()) return "sparse tensor";
  return "non-tensor";
}

// Loads model and data set 0. Unimplemented: the case is excluded (non-tensor value, dtype).
Result<Loaded> Load(const CaseInfo& info) {
  Loaded l;
  KILN_ASSIGN_OR_RETURN(std::string bytes, ReadFile(info.dir + "/model.onnx"));
  if (!l.model.ParseFromString(bytes)) {
    return Status::Corruption(info.dir + "/model.onnx: not a ModelProto");
  }
  const onnx::GraphProto& g = l.model.graph();
  for (const auto* list : {&g.input(), &g.output()}) {
    for (const auto& vi : *list) {
      if (!vi.type().has_tensor_type()) {
        return Status::Unimplemented(std::string(ValueKind(vi.type())) + " values not supported");
      }
    }
  }
  const std::string data = info.dir + "/test_data_set_0";
  for (int j = 0; j < g.input_size(); ++j) {
    const std::string path = data + "/input_" + std::to_string(j) + ".pb";
    KILN_ASSIGN_OR_RETURN(onnx::TensorProto tp, ReadProtoFile(path));
    KILN_ASSIGN_OR_RETURN(Tensor t, TensorFromProto(tp, path));
    tp.set_name(g.input(j).name());
    l.input_names.push_back(g.input(j).name());
    l.inputs[g.input(j).name()] = std::move(t);
  }
  for (int j = 0; j < g.output_size(); ++j) {
    const std::string path = data + "/output_" + std::to_string(j) + ".pb";
    KILN_ASSIGN_OR_RETURN(onnx::TensorProto tp, ReadProtoFile(path));
    KILN_ASSIGN_OR_RETURN(Tensor t, TensorFromProto(tp, path));
    l.expected.emplace_back(g.output(j).name(), std::move(t));
  }
  return l;
}

// --- comparison -----------------------------------------------------------------------------

std::string Num(double v) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}

// "" when `got` matches `want` under onnx's backend-test rule, else the first difference.
std::string FirstMismatch(const std::string& name, const Tensor& got, const Tensor& want,
                          double rtol, double atol) {
  const std::string where = "output '" + name + "'";
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
    if (is_float) {
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

ModeResult Compare(const TensorMap& got, const std::vector<std::pair<std::string, Tensor>>& want,
                   const std::string& prefix, const CaseInfo& info) {
  for (const auto& [name, w] : want) {
    auto it = got.find(prefix + name);
    if (it == got.end()) return Fail("output '" + name + "' was not produced");
    const std::string m = FirstMismatch(name, it->second, w, info.rtol, info.atol);
    if (!m.empty()) return Fail(m);
  }
  return Pass();
}

// --- eager ----------------------------------------------------------------------------------

ModeResult RunEager(const CaseInfo& info, const Loaded& l) {
  auto graph = ImportOnnxBytes(l.model.SerializeAsString(), "model");
  if (!graph.ok()) return FromError("import", graph.status());
  auto interp = Interpreter::Create(std::make_shared<const Graph>(std::move(graph).value()));
  if (!interp.ok()) return FromError("verify", interp.status());
  auto out = interp->Run(l.inputs);
  if (!out.ok()) return FromError("run", out.status());
  return Compare(*out, l.expected, "", info);
}

// --- compiled -------------------------------------------------------------------------------

// A case ready to join a compiled batch: its model and its runtime inputs, exactly as a user
// hands them to `kiln run --compile` (an input that decides an output shape stays an input; the
// cell runs the nodes it decides as a dynamic region).
struct Prepared {
  size_t index = 0;  // into the results
  onnx::ModelProto model;
  TensorMap inputs;
  std::vector<std::pair<std::string, Tensor>> expected;
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
  p->model = std::move(l.model);
  p->inputs = std::move(l.inputs);
  p->expected = std::move(l.expected);
  p->opset_key = OpsetKey(p->model);
  Result<Graph> graph = ImportAndInfer(p->model, p->inputs, "model");
  if (!graph.ok()) return FromError("shape inference", graph.status());
  ShapeClass cls;
  for (const auto& [n, t] : p->inputs) cls[n] = t.shape();
  auto cell = GenerateCell(*graph, Envelope{{cls}}, "conformance", CompileOptions{}, nullptr);
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
  merged.set_ir_version(batch[0]->model.ir_version());
  *merged.mutable_opset_import() = batch[0]->model.opset_import();
  merged.mutable_graph()->set_name("conformance");
  TensorMap inputs;
  for (const Prepared* p : batch) {
    onnx::GraphProto g = p->model.graph();
    RenameGraph(&g, Prefix(p->index));
    merged.mutable_graph()->MergeFrom(g);
    for (const auto& [n, t] : p->inputs) inputs[Prefix(p->index) + n] = t;
  }
  merged.mutable_graph()->set_name("conformance");
  KILN_ASSIGN_OR_RETURN(Graph graph, ImportAndInfer(merged, inputs, "batch"));
  auto shared = std::make_shared<const Graph>(std::move(graph));
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
  KILN_ASSIGN_OR_RETURN(TensorMap got, armed->Run(0, inputs));
  for (const Prepared* p : batch) {
    results[p->index].compiled =
        Compare(got, p->expected, Prefix(p->index), results[p->index].info);
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

// The file name `kiln run --out` gives an output (src/kiln/cli/util.cc SafeFileName).
std::string OutputFileName(const std::string& name) {
  std::string out;
  for (char c : name) {
    const bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
    out += ok ? c : '_';
  }
  if (out.empty() || out == "." || out == "..") out = "_" + out;
  return out + ".npy";
}

// One `kiln run` of a case: its outputs compared with the expected ones. An error kiln reports
// as unimplemented excludes the case, any other fails it.
ModeResult RunCli(const CaseInfo& info, const Loaded& l, const std::string& kiln,
                  const std::string& dir, bool compile) {
  const std::string out_dir = dir + (compile ? "/compiled" : "/eager");
  std::vector<std::string> argv = {kiln, "run", info.dir + "/model.onnx", "--out", out_dir};
  for (const auto& [name, t] : l.inputs) {
    const std::string path = dir + "/in/" + OutputFileName(name);
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
  for (const auto& [name, want] : l.expected) {
    auto got = ReadNpy(out_dir + "/" + OutputFileName(name));
    if (!got.ok()) return Fail("output '" + name + "': " + got.status().ToString());
    const std::string m = FirstMismatch(name, *got, want, info.rtol, info.atol);
    if (!m.empty()) return Fail(m);
  }
  return Pass();
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
      for (const auto& [name, t] : loaded->inputs) {
        if (made.ok()) made = WriteNpy(dir + "/in/" + OutputFileName(name), t);
      }
      if (!made.ok()) {
        r.cli_eager = r.cli_compiled = Fail(made.ToString());
        continue;
      }
      r.cli_eager = RunCli(r.info, *loaded, options.cli_kiln, dir, false);
      r.cli_compiled = RunCli(r.info, *loaded, options.cli_kiln, dir, true);
      std::error_code ec;
      fs::remove_all(dir, ec);
      if (options.log && options.verbose) {
        std::lock_guard<std::mutex> lock(log_mu);
        options.log("conformance: cli " + r.info.name + " eager " +
                    OutcomeName(r.cli_eager.outcome) + ", compiled " +
                    OutcomeName(r.cli_compiled.outcome));
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
  const std::vector<std::string> op_types = OpRegistry::Global().OpTypes();
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
  return std::to_string(s.total) + " cases; " + std::to_string(s.listed) +
         " whose op kiln lists: " + std::to_string(s.listed_eager_pass) + " pass eager (" +
         Percent(s.listed_eager_pass, s.listed) + "), " + std::to_string(s.listed_compiled_pass) +
         " pass compiled (" + Percent(s.listed_compiled_pass, s.listed) + "), " +
         std::to_string(s.listed_both_pass) + " pass both (" +
         Percent(s.listed_both_pass, s.listed) + ")" +
         (s.cli_ran ? "; command line, all cases: " + std::to_string(s.cli_eager_pass) +
                          " pass `kiln run`, " + std::to_string(s.cli_compiled_pass) +
                          " pass `kiln run --compile`"
                    : "");
}

std::string RenderReport(const std::vector<CaseResult>& results, const std::string& generator) {
  const Summary s = Summarize(results);
  std::ostringstream o;
  o << "# ONNX node conformance\n\n"
    << "Generated by `bash tools/conformance.sh --update` (do not edit by hand) from " << generator
    << ". Each case runs through the eager interpreter and through a compiled cell, compared with "
       "the case's expected outputs at its tolerance (rtol "
    << (results.empty() ? 1e-3 : results[0].info.rtol) << ", atol "
    << (results.empty() ? 1e-7 : results[0].info.atol)
    << "; NaN equals NaN; integers exact). Every input stays an input, as a user hands it to "
       "`kiln run --compile`: a value that decides an output shape (a Reshape shape, Resize "
       "scales, a TopK k, ...) makes the nodes it decides the cell's dynamic region, run with "
       "shapes computed at run time while the rest stays compiled. A case kiln refuses in eager "
       "mode (op form, attribute, dtype) is excluded in compiled mode with the same reason. The "
       "runner is `tests/conformance/`; the CI test `conformance_test` fails when a (mode, case) "
       "listed in `tests/conformance/baseline.txt` stops passing.\n\n"
    << "## Summary\n\n";
  if (s.cli_ran) {
    o << "**Through the command line** (every generated case, whatever its op: its inputs "
         "written as `.npy` files, then `kiln run MODEL --input NAME=FILE.npy ...` and the same "
         "with `--compile`, which mints a cell with the numerics gate and the fence proof, the "
         "case's inputs declared as the sample, and runs it): **"
      << s.cli_eager_pass << " of " << s.total << " pass eager, " << s.cli_compiled_pass << " of "
      << s.total << " pass compiled**, " << s.cli_both_pass << " both.";
    if (!s.cli_eager_only.empty()) {
      o << " Passing eager but not compiled:";
      for (const std::string& n : s.cli_eager_only) o << " `" << n << "`";
      o << ".";
    }
    // A case that fails in one mode and passes in the other, with kiln's last line, so a
    // failure that does not reproduce alone still leaves its cause in the record. (Cases that
    // fail in both modes are the in-process failures listed per op below.)
    bool any_split = false;
    for (const CaseResult& r : results) {
      for (const auto* m : {&r.cli_eager, &r.cli_compiled}) {
        const ModeResult& other = m == &r.cli_eager ? r.cli_compiled : r.cli_eager;
        if (m->outcome != Outcome::kFail || other.outcome != Outcome::kPass) continue;
        if (!any_split) o << "\n\nFailing in one mode only:\n";
        any_split = true;
        o << "\n- " << (m == &r.cli_eager ? "eager" : "compiled") << " `" << r.info.name
          << "`: " << m->detail;
      }
    }
    o << "\n\nIn process (the runner's own eager interpreter and cells, cases batched into one "
         "cell per opset):\n\n";
  }
  o << "| | cases | eager pass | compiled pass | both pass |\n|---|---|---|---|---|\n"
    << "| all generated node cases | " << s.total << " | " << s.eager_pass << " | "
    << s.compiled_pass << " | - |\n"
    << "| cases whose op kiln lists | " << s.listed << " | " << s.listed_eager_pass << " ("
    << Percent(s.listed_eager_pass, s.listed) << ") | " << s.listed_compiled_pass << " ("
    << Percent(s.listed_compiled_pass, s.listed) << ") | " << s.listed_both_pass << " ("
    << Percent(s.listed_both_pass, s.listed) << ") |\n"
    << "| of those, cases whose tensors all have a kiln dtype | " << s.listed_typed << " | "
    << s.listed_typed_eager_pass << " (" << Percent(s.listed_typed_eager_pass, s.listed_typed)
    << ") | " << s.listed_typed_compiled_pass << " ("
    << Percent(s.listed_typed_compiled_pass, s.listed_typed) << ") | - |\n\n"
    << "The acceptance figure is the second row: every case whose op kiln lists counts, including "
       "cases kiln excludes (a dtype kiln has no type for, such as STRING or BFLOAT16; training "
       "modes; sequence values). The third row leaves out the cases whose tensors have no kiln "
       "dtype.\n\n";
  std::map<std::string, std::vector<const CaseResult*>> by_op;
  std::set<std::string> listed_ops;
  for (const CaseResult& r : results) {
    by_op[r.info.op].push_back(&r);
    if (r.op_listed) listed_ops.insert(r.info.op);
  }
  const std::vector<std::string> registry_ops = OpRegistry::Global().OpTypes();
  std::vector<std::string> no_case;
  for (const std::string& op : registry_ops) {
    if (!by_op.count(op) && op != "Constant") no_case.push_back(op);
  }
  o << "Ops kiln lists: " << registry_ops.size() << "; with at least one case passing eager: "
    << (listed_ops.size() - s.listed_ops_without_pass.size()) << " of the " << listed_ops.size()
    << " that have cases.";
  auto join = [](const std::vector<std::string>& v) {
    std::string out;
    for (const auto& x : v) out += (out.empty() ? "" : ", ") + x;
    return out;
  };
  if (!s.listed_ops_without_pass.empty()) {
    o << " Listed ops without a passing case: " << join(s.listed_ops_without_pass) << ".";
  }
  if (!no_case.empty()) o << " Listed ops with no node case in this onnx: " << join(no_case) << ".";
  o << "\n\n## Ops kiln lists\n\n"
    << "| op | cases | eager pass | eager fail | eager excluded | compiled pass | compiled fail "
       "| compiled excluded |\n|---|---|---|---|---|---|---|---|\n";
  auto count = [](const std::vector<const CaseResult*>& v, bool eager, Outcome out) {
    int64_t n = 0;
    for (const CaseResult* r : v) n += (eager ? r->eager : r->compiled).outcome == out;
    return n;
  };
  for (const std::string& op : listed_ops) {
    const auto& v = by_op[op];
    o << "| " << op << " | " << v.size();
    for (bool eager : {true, false}) {
      for (Outcome out : {Outcome::kPass, Outcome::kFail, Outcome::kExcluded}) {
        o << " | " << count(v, eager, out);
      }
    }
    o << " |\n";
  }
  o << "\n## Failures and exclusions, per listed op\n\n"
    << "Each failure names its case and first mismatch; each exclusion gives its reason.\n";
  for (const std::string& op : listed_ops) {
    std::ostringstream body;
    for (bool eager : {true, false}) {
      const char* mode = eager ? "eager" : "compiled";
      std::map<std::string, std::vector<std::string>> reasons;
      for (const CaseResult* r : by_op[op]) {
        const ModeResult& m = eager ? r->eager : r->compiled;
        if (m.outcome == Outcome::kFail) {
          body << "- " << mode << " **fail** `" << r->info.name << "`: " << m.detail << "\n";
        } else if (m.outcome == Outcome::kExcluded) {
          reasons[m.detail].push_back(r->info.name);
        }
      }
      for (const auto& [reason, names] : reasons) {
        body << "- " << mode << " excluded (" << names.size() << "): " << reason << " — ";
        for (size_t i = 0; i < names.size(); ++i) body << (i ? ", " : "") << "`" << names[i] << "`";
        body << "\n";
      }
    }
    if (!body.str().empty()) o << "\n### " << op << "\n\n" << body.str();
  }
  o << "\n## Ops kiln does not list\n\n"
    << "Excluded in both modes, reason: op not listed as supported.\n\n| op | cases |\n|---|---|\n";
  for (const auto& [op, v] : by_op) {
    if (!listed_ops.count(op)) o << "| " << op << " | " << v.size() << " |\n";
  }
  return o.str();
}

}  // namespace kiln::conformance
