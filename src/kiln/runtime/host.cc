// The host services a cell calls back into (see host.h).
#include "src/kiln/runtime/host.h"

#include <omp.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <new>

#include "src/kiln/base/canonical_json.h"
#include "src/kiln/base/log.h"
#include "src/kiln/eager/interpreter.h"
#include "src/kiln/ops/dnnl_kernels.h"

namespace kiln {

int StatusToCellCode(const Status& s) {
  if (s.ok()) return KILN_CELL_OK;
  if (s.code() == StatusCode::kResourceExhausted) return KILN_CELL_RESOURCE_EXHAUSTED;
  return KILN_CELL_FAULT;
}

namespace {
thread_local HostRunContext* t_run_context = nullptr;
}  // namespace

ScopedHostRunContext::ScopedHostRunContext(HostRunContext* context) : previous_(t_run_context) {
  t_run_context = context;
}

ScopedHostRunContext::~ScopedHostRunContext() { t_run_context = previous_; }

namespace {

nlohmann::json TypeJson(const TensorType& t) {
  return nlohmann::json{{"dtype", DTypeName(t.dtype)}, {"shape", t.shape}};
}

Result<TensorType> TypeFromJson(const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("dtype") || !j.contains("shape")) {
    return Status::InvalidArgument("node spec: type needs dtype and shape");
  }
  TensorType t;
  KILN_ASSIGN_OR_RETURN(t.dtype, DTypeFromName(j["dtype"].get<std::string>()));
  t.shape = j["shape"].get<Shape>();
  return t;
}

Result<nlohmann::json> GraphJson(const Graph& g);
Result<Graph> GraphFromJson(const nlohmann::json& j);

nlohmann::json TensorJson(const Tensor& t) {
  if (t.dtype() == DType::kString) {
    std::vector<std::string> values;
    for (int64_t i = 0; i < t.numel(); ++i) values.push_back(t.str(i));
    return {{"dtype", DTypeName(t.dtype())}, {"shape", t.shape()}, {"data", values}};
  }
  std::vector<double> values;
  for (int64_t i = 0; i < t.numel(); ++i) values.push_back(t.GetAsDouble(i));
  return {{"dtype", DTypeName(t.dtype())}, {"shape", t.shape()}, {"data", values}};
}

Result<Tensor> TensorFromJson(const nlohmann::json& v) {
  KILN_ASSIGN_OR_RETURN(DType dt, DTypeFromName(v.at("dtype").get<std::string>()));
  if (dt == DType::kString) {
    return Tensor::Strings(v.at("shape").get<Shape>(),
                           v.at("data").get<std::vector<std::string>>());
  }
  KILN_ASSIGN_OR_RETURN(Tensor f, Tensor::FromVector<float>(v.at("shape").get<Shape>(),
                                                            v.at("data").get<std::vector<float>>())
                                      .CastTo(dt));
  if (dt == DType::kInt64) {  // integers above 2^24 do not survive float: rebuild exactly
    std::vector<int64_t> ints;
    for (const auto& x : v.at("data")) ints.push_back(static_cast<int64_t>(x.get<double>()));
    return Tensor::FromVector<int64_t>(v.at("shape").get<Shape>(), ints);
  }
  return f;
}

Result<nlohmann::json> AttrJson(const Attribute& a) {
  nlohmann::json j;
  j["kind"] = AttributeKindName(a.kind);
  switch (a.kind) {
    case Attribute::Kind::kFloat:
      j["v"] = a.f;
      break;
    case Attribute::Kind::kInt:
      j["v"] = a.i;
      break;
    case Attribute::Kind::kString:
      j["v"] = a.s;
      break;
    case Attribute::Kind::kFloats:
      j["v"] = a.floats;
      break;
    case Attribute::Kind::kInts:
      j["v"] = a.ints;
      break;
    case Attribute::Kind::kStrings:
      j["v"] = a.strings;
      break;
    case Attribute::Kind::kTensor:
      j["v"] = TensorJson(a.t);
      break;
    case Attribute::Kind::kGraph: {
      KILN_ASSIGN_OR_RETURN(j["v"], GraphJson(*a.g));
      break;
    }
    case Attribute::Kind::kType:
      j["v"] = {{"kind", static_cast<int>(a.type_kind)}, {"dtype", DTypeName(a.type_dtype)}};
      break;
    case Attribute::Kind::kGraphs: {
      j["v"] = nlohmann::json::array();
      for (const auto& g : a.graphs) {
        KILN_ASSIGN_OR_RETURN(nlohmann::json gj, GraphJson(*g));
        j["v"].push_back(gj);
      }
      break;
    }
  }
  return j;
}

nlohmann::json ValueInfoJson(const ValueInfo& v) {
  nlohmann::json dims = nlohmann::json::array();
  for (const Dim& d : v.dims) dims.push_back(d.value);
  nlohmann::json j = {
      {"name", v.name}, {"dtype", DTypeName(v.dtype)}, {"has_shape", v.has_shape}, {"dims", dims}};
  // Written only when false, so the specs of graphs whose subgraphs declare every type (all
  // before untyped subgraph values were accepted) keep their bytes.
  if (!v.has_type) j["has_type"] = false;
  if (v.kind != ValueKind::kTensor) j["kind"] = static_cast<int>(v.kind);  // likewise
  return j;
}

Result<ValueInfo> ValueInfoFromJson(const nlohmann::json& j) {
  ValueInfo v;
  v.name = j.at("name").get<std::string>();
  KILN_ASSIGN_OR_RETURN(v.dtype, DTypeFromName(j.at("dtype").get<std::string>()));
  v.has_type = j.value("has_type", true);
  const int kind = j.value("kind", 0);
  if (kind < 0 || kind > static_cast<int>(ValueKind::kOptionalSequence)) {
    return Status::InvalidArgument("node spec: value '" + v.name + "' has kind " +
                                   std::to_string(kind));
  }
  v.kind = static_cast<ValueKind>(kind);
  v.has_shape = j.at("has_shape").get<bool>();
  for (const auto& d : j.at("dims")) v.dims.push_back(Dim{d.get<int64_t>(), ""});
  return v;
}

// A subgraph in a node spec: nodes, signature, opsets and structural constants by value. A
// weight never rides a spec (law 1): the importer hoists subgraph weights to the top level,
// where the cell binds them and passes them in as outer values.
Result<nlohmann::json> GraphJson(const Graph& g) {
  nlohmann::json j;
  j["name"] = g.name;
  nlohmann::json opsets = nlohmann::json::object();
  for (const auto& [domain, version] : g.opsets) opsets[domain] = version;
  j["opsets"] = opsets;
  for (const char* key : {"inputs", "outputs", "nodes"}) j[key] = nlohmann::json::array();
  for (const ValueInfo& v : g.inputs) j["inputs"].push_back(ValueInfoJson(v));
  for (const ValueInfo& v : g.outputs) j["outputs"].push_back(ValueInfoJson(v));
  nlohmann::json inits = nlohmann::json::object();
  for (const auto& [name, t] : g.initializers) {
    if (g.IsWeight(name)) {
      return Status::Unimplemented("subgraph '" + g.name + "' binds weight '" + name +
                                   "' itself; a node spec never carries a weight value");
    }
    inits[name] = TensorJson(t);
  }
  j["initializers"] = inits;
  j["structural_floats"] = g.structural_floats;
  for (const Node& n : g.nodes) {
    nlohmann::json nj = {{"op", n.op_type},
                         {"domain", n.domain},
                         {"name", n.name},
                         {"inputs", n.inputs},
                         {"outputs", n.outputs}};
    nlohmann::json attrs = nlohmann::json::object();
    for (const auto& [name, a] : n.attrs) {
      auto aj = AttrJson(a);
      if (!aj.ok()) return aj.status().WithContext(n.Describe());
      attrs[name] = *aj;
    }
    nj["attrs"] = attrs;
    j["nodes"].push_back(nj);
  }
  return j;
}

Result<Attribute> AttrFromJson(const std::string& name, const nlohmann::json& j) {
  Attribute a;
  const std::string kind = j.at("kind").get<std::string>();
  const nlohmann::json& v = j.at("v");
  if (kind == "float") {
    a.kind = Attribute::Kind::kFloat;
    a.f = v.get<float>();
  } else if (kind == "int") {
    a.kind = Attribute::Kind::kInt;
    a.i = v.get<int64_t>();
  } else if (kind == "string") {
    a.kind = Attribute::Kind::kString;
    a.s = v.get<std::string>();
  } else if (kind == "floats") {
    a.kind = Attribute::Kind::kFloats;
    a.floats = v.get<std::vector<float>>();
  } else if (kind == "ints") {
    a.kind = Attribute::Kind::kInts;
    a.ints = v.get<std::vector<int64_t>>();
  } else if (kind == "strings") {
    a.kind = Attribute::Kind::kStrings;
    a.strings = v.get<std::vector<std::string>>();
  } else if (kind == "tensor") {
    a.kind = Attribute::Kind::kTensor;
    KILN_ASSIGN_OR_RETURN(a.t, TensorFromJson(v));
  } else if (kind == "graph") {
    a.kind = Attribute::Kind::kGraph;
    KILN_ASSIGN_OR_RETURN(Graph g, GraphFromJson(v));
    a.g = std::make_shared<Graph>(std::move(g));
  } else if (kind == "type") {
    a.kind = Attribute::Kind::kType;
    const int k = v.at("kind").get<int>();
    if (k < 0 || k > static_cast<int>(ValueKind::kOptionalSequence)) {
      return Status::InvalidArgument("node spec: attribute '" + name + "' has value kind " +
                                     std::to_string(k));
    }
    a.type_kind = static_cast<ValueKind>(k);
    KILN_ASSIGN_OR_RETURN(a.type_dtype, DTypeFromName(v.at("dtype").get<std::string>()));
  } else if (kind == "graphs") {
    a.kind = Attribute::Kind::kGraphs;
    for (const auto& gj : v) {
      KILN_ASSIGN_OR_RETURN(Graph g, GraphFromJson(gj));
      a.graphs.push_back(std::make_shared<Graph>(std::move(g)));
    }
  } else {
    return Status::InvalidArgument("node spec: attribute '" + name + "' has unknown kind '" + kind +
                                   "'");
  }
  return a;
}

Result<Graph> GraphFromJson(const nlohmann::json& j) {
  Graph g;
  g.name = j.at("name").get<std::string>();
  for (auto it = j.at("opsets").begin(); it != j.at("opsets").end(); ++it) {
    g.opsets[it.key()] = it.value().get<int64_t>();
  }
  for (const auto& v : j.at("inputs")) {
    KILN_ASSIGN_OR_RETURN(ValueInfo vi, ValueInfoFromJson(v));
    g.inputs.push_back(std::move(vi));
  }
  for (const auto& v : j.at("outputs")) {
    KILN_ASSIGN_OR_RETURN(ValueInfo vi, ValueInfoFromJson(v));
    g.outputs.push_back(std::move(vi));
  }
  for (auto it = j.at("initializers").begin(); it != j.at("initializers").end(); ++it) {
    KILN_ASSIGN_OR_RETURN(g.initializers[it.key()], TensorFromJson(it.value()));
  }
  for (const auto& name : j.at("structural_floats")) {
    g.structural_floats.insert(name.get<std::string>());
  }
  for (const auto& nj : j.at("nodes")) {
    Node n;
    n.op_type = nj.at("op").get<std::string>();
    n.domain = nj.at("domain").get<std::string>();
    n.name = nj.at("name").get<std::string>();
    n.inputs = nj.at("inputs").get<std::vector<std::string>>();
    n.outputs = nj.at("outputs").get<std::vector<std::string>>();
    for (auto it = nj.at("attrs").begin(); it != nj.at("attrs").end(); ++it) {
      KILN_ASSIGN_OR_RETURN(n.attrs[it.key()], AttrFromJson(it.key(), it.value()));
    }
    g.nodes.push_back(std::move(n));
  }
  return g;
}

// One prepared reference op.
struct PreparedOp {
  Node node;
  int64_t opset = 0;
  const OpDef* def = nullptr;
  std::vector<TensorType> input_types;
  std::vector<bool> present;
  std::vector<TensorType> output_types;
  // What def->prepare parsed from the node's attributes, built here so every call shares it.
  std::shared_ptr<const PreparedNode> prepared;
  // Ops that own subgraphs (If, Loop): the trailing `outer.size()` inputs are the outer values
  // the subgraphs read, bound under these names; the node runs through the eager interpreter.
  std::vector<std::string> outer;
  std::unique_ptr<SubgraphNode> subgraph_node;
  // A dynamic region (kDynamicRegionOp): its body, run by the interpreter, and which outputs
  // arrive as kiln_dynamic_output.
  std::unique_ptr<Interpreter> region;
  std::vector<bool> dynamic_out;
};

Result<std::unique_ptr<PreparedOp>> Prepare(const char* text) {
  KILN_ASSIGN_OR_RETURN(nlohmann::json j, ParseJson(text, "node spec"));
  auto op = std::make_unique<PreparedOp>();
  try {
    op->node.op_type = j.at("op").get<std::string>();
    op->node.domain = j.at("domain").get<std::string>();
    op->node.name = j.value("name", "");
    op->opset = j.at("opset").get<int64_t>();
    for (auto it = j.at("attrs").begin(); it != j.at("attrs").end(); ++it) {
      KILN_ASSIGN_OR_RETURN(op->node.attrs[it.key()], AttrFromJson(it.key(), it.value()));
    }
    size_t i = 0;
    for (const auto& in : j.at("inputs")) {
      const bool present = !in.is_null();
      op->present.push_back(present);
      op->node.inputs.push_back(present ? "in" + std::to_string(i) : "");
      if (present) {
        KILN_ASSIGN_OR_RETURN(TensorType t, TypeFromJson(in));
        op->input_types.push_back(t);
      } else {
        op->input_types.emplace_back();
      }
      ++i;
    }
    i = 0;
    for (const auto& out : j.at("outputs")) {
      KILN_ASSIGN_OR_RETURN(TensorType t, TypeFromJson(out));
      op->output_types.push_back(t);
      op->dynamic_out.push_back(out.value("dynamic", false));
      op->node.outputs.push_back("out" + std::to_string(i++));
    }
    if (j.contains("outer")) op->outer = j.at("outer").get<std::vector<std::string>>();
  } catch (const std::exception& e) {
    return Status::InvalidArgument(std::string("node spec is malformed: ") + e.what());
  }
  if (op->outer.size() > op->node.inputs.size()) {
    return Status::InvalidArgument("node spec: " + std::to_string(op->outer.size()) +
                                   " outer values but only " +
                                   std::to_string(op->node.inputs.size()) + " inputs");
  }
  op->node.inputs.resize(op->node.inputs.size() - op->outer.size());
  if (op->node.op_type == kDynamicRegionOp && op->node.domain == kDynamicRegionDomain) {
    auto body = op->node.attrs.find("body");
    if (body == op->node.attrs.end() || body->second.kind != Attribute::Kind::kGraph ||
        !body->second.g) {
      return Status::InvalidArgument("node spec: a dynamic region needs a `body` graph");
    }
    const Graph& g = *body->second.g;
    if (g.inputs.size() != op->input_types.size() || g.outputs.size() != op->output_types.size()) {
      return Status::InvalidArgument("node spec: the dynamic region's body takes " +
                                     std::to_string(g.inputs.size()) + " inputs and gives " +
                                     std::to_string(g.outputs.size()) + " outputs, the spec " +
                                     std::to_string(op->input_types.size()) + " and " +
                                     std::to_string(op->output_types.size()));
    }
    KILN_ASSIGN_OR_RETURN(Interpreter interp, Interpreter::Create(body->second.g));
    op->region = std::make_unique<Interpreter>(std::move(interp));
    return op;
  }
  for (bool d : op->dynamic_out) {
    if (d) return Status::InvalidArgument("node spec: only a dynamic region has dynamic outputs");
  }
  if (HasSubgraphs(op->node)) {
    KILN_ASSIGN_OR_RETURN(op->subgraph_node, SubgraphNode::Create(op->node, op->opset));
  }
  KILN_ASSIGN_OR_RETURN(op->def,
                        OpRegistry::Global().Find(op->node.domain, op->node.op_type, op->opset));
  if (op->def->check) KILN_RETURN_IF_ERROR(op->def->check(op->node, op->opset));
  if (op->def->prepare) {
    KILN_ASSIGN_OR_RETURN(op->prepared, op->def->prepare(op->node, op->opset));
  }
  return op;
}

Conv2dParams ParamsOf(const kiln_conv2d_desc* d);

int HostSgemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
              const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
              int64_t ldc, int num_threads) {
  return StatusToCellCode(
      Sgemm(trans_a != 0, trans_b != 0, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, num_threads));
}

int HostConv2d(const kiln_conv2d_desc* d, const float* x, const float* w, const float* bias,
               float* y, int num_threads) {
  const Conv2dParams p = ParamsOf(d);
  ConvEpilogue epi;
  epi.post_op = d->post_op;
  epi.sum = d->sum != 0;
  return StatusToCellCode(Conv2dFused(p, x, w, bias, y, epi, num_threads));
}

Conv2dParams ParamsOf(const kiln_conv2d_desc* d) {
  Conv2dParams p;
  p.N = d->n;
  p.C = d->c;
  p.H = d->h;
  p.W = d->w;
  p.K = d->k;
  p.R = d->r;
  p.S = d->s;
  p.stride_h = d->stride_h;
  p.stride_w = d->stride_w;
  p.pad_t = d->pad_t;
  p.pad_l = d->pad_l;
  p.pad_b = d->pad_b;
  p.pad_r = d->pad_r;
  p.dil_h = d->dil_h;
  p.dil_w = d->dil_w;
  p.group = d->group;
  p.layout = d->layout;
  return p;
}

int HostConv2dPrepare(const kiln_conv2d_desc* d, const float* w, int has_bias, int num_threads,
                      void** out) {
  try {
    if (d == nullptr || w == nullptr || out == nullptr) return KILN_CELL_BAD_ARGUMENT;
    *out = nullptr;
    ConvEpilogue epi;
    epi.post_op = d->post_op;
    epi.sum = d->sum != 0;
    auto c = PrepareConv2d(ParamsOf(d), w, has_bias != 0, epi, num_threads);
    if (!c.ok()) {
      KILN_LOG(ERROR) << "cell conv2d_prepare: " << c.status().ToString();
      return StatusToCellCode(c.status());
    }
    *out = c->release();
    return KILN_CELL_OK;
  } catch (const std::bad_alloc&) {
    return KILN_CELL_RESOURCE_EXHAUSTED;
  } catch (...) {
    return KILN_CELL_FAULT;
  }
}

int HostConv2dRun(void* handle, const float* x, const float* bias, float* y) {
  if (handle == nullptr) return KILN_CELL_BAD_ARGUMENT;
  Status s = RunConv2d(*static_cast<const PreparedConv2d*>(handle), x, bias, y);
  if (!s.ok()) KILN_LOG(ERROR) << "cell conv2d_run: " << s.ToString();
  return StatusToCellCode(s);
}

void HostConv2dRelease(void* handle) {
  PreparedConv2dDeleter()(static_cast<PreparedConv2d*>(handle));
}

int HostMatmulPrepare(const kiln_matmul_desc* d, const float* w, int num_threads, void** out) {
  try {
    if (d == nullptr || out == nullptr) return KILN_CELL_BAD_ARGUMENT;
    *out = nullptr;
    MatmulParams p;
    p.M = d->m;
    p.N = d->n;
    p.K = d->k;
    p.batch = d->batch;
    p.w_batch = d->w_batch;
    p.alpha = d->alpha;
    p.trans_a = d->trans_a != 0;
    p.trans_w = d->trans_w != 0;
    p.has_bias = d->has_bias != 0;
    p.post_op = d->post_op;
    auto m = PrepareMatmul(p, w, num_threads);
    if (!m.ok()) {
      KILN_LOG(ERROR) << "cell matmul_prepare: " << m.status().ToString();
      return StatusToCellCode(m.status());
    }
    *out = m->release();
    return KILN_CELL_OK;
  } catch (const std::bad_alloc&) {
    return KILN_CELL_RESOURCE_EXHAUSTED;
  } catch (...) {
    return KILN_CELL_FAULT;
  }
}

int HostMatmulRun(void* handle, const float* a, const float* w, const float* bias, float* c) {
  if (handle == nullptr) return KILN_CELL_BAD_ARGUMENT;
  Status s = RunMatmul(*static_cast<const PreparedMatmul*>(handle), a, w, bias, c);
  if (!s.ok()) KILN_LOG(ERROR) << "cell matmul_run: " << s.ToString();
  return StatusToCellCode(s);
}

void HostMatmulRelease(void* handle) {
  PreparedMatmulDeleter()(static_cast<PreparedMatmul*>(handle));
}

int HostParallelFor(int64_t n, void (*fn)(void*, int64_t, int64_t), void* ctx, int num_threads) {
  if (fn == nullptr || n < 0) return KILN_CELL_BAD_ARGUMENT;
  if (n == 0) return KILN_CELL_OK;
  int t = num_threads > 0 ? num_threads : omp_get_max_threads();
  if (t > n) t = static_cast<int>(n);
  if (t <= 1) {
    fn(ctx, 0, n);
    return KILN_CELL_OK;
  }
#pragma omp parallel num_threads(t)
  {
    const int64_t nt = omp_get_num_threads(), i = omp_get_thread_num();
    const int64_t begin = n * i / nt, end = n * (i + 1) / nt;
    if (begin < end) fn(ctx, begin, end);
  }
  return KILN_CELL_OK;
}

int HostOpPrepare(const char* node_json, void** out) {
  try {
    auto op = Prepare(node_json);
    if (!op.ok()) {
      KILN_LOG(ERROR) << "cell op_prepare: " << op.status().ToString();
      return KILN_CELL_BAD_ARGUMENT;
    }
    *out = op->release();
    return KILN_CELL_OK;
  } catch (const std::bad_alloc&) {
    return KILN_CELL_RESOURCE_EXHAUSTED;
  } catch (...) {
    return KILN_CELL_FAULT;
  }
}

// Runs a dynamic region: binds its inputs by the body's names, runs the body eagerly, and hands
// each output over: a static one copied into its buffer after its type is checked, a dynamic one
// into the buffer its kiln_dynamic_output allocates for the shape the run produced.
Status RunRegion(const PreparedOp& op, const std::vector<Tensor>& in_views, void* const* outputs,
                 const std::shared_ptr<MemoryBudget>& budget) {
  const Graph& body = op.region->graph();
  TensorMap inputs;
  for (size_t i = 0; i < body.inputs.size(); ++i) inputs[body.inputs[i].name] = in_views[i];
  KILN_ASSIGN_OR_RETURN(TensorMap got, op.region->Run(inputs, nullptr, nullptr, budget));
  for (size_t k = 0; k < body.outputs.size(); ++k) {
    const Tensor& t = got.at(body.outputs[k].name);
    if (t.dtype() != op.output_types[k].dtype) {
      return Status::Internal("dynamic region output " + std::to_string(k) + " is " +
                              t.TypeString() + ", the cell declares " +
                              DTypeName(op.output_types[k].dtype));
    }
    void* dst = outputs[k];
    if (op.dynamic_out[k]) {
      auto* slot = static_cast<kiln_dynamic_output*>(outputs[k]);
      if (slot == nullptr || slot->alloc == nullptr) {
        return Status::InvalidArgument("dynamic output " + std::to_string(k) +
                                       " has no kiln_dynamic_output");
      }
      const Shape& shape = t.shape();
      dst = slot->alloc(slot, shape.data(), static_cast<int32_t>(shape.size()));
      if (dst == nullptr && t.nbytes() > 0) {
        return Status::ResourceExhausted("cannot allocate dynamic output " + std::to_string(k) +
                                         " " + t.TypeString());
      }
    } else if (t.shape() != op.output_types[k].shape) {
      return Status::Internal("dynamic region output " + std::to_string(k) + " is " +
                              t.TypeString() + ", the cell declares " +
                              op.output_types[k].ToString());
    }
    if (t.nbytes() > 0) std::memcpy(dst, t.raw_data(), t.nbytes());
  }
  return Status::OK();
}

int HostOpRun(void* handle, const void* const* inputs, void* const* outputs, int num_threads) {
  try {
    const PreparedOp& op = *static_cast<const PreparedOp*>(handle);
    HostRunContext* run = t_run_context;
    static const std::shared_ptr<MemoryBudget> kNoBudget;
    const std::shared_ptr<MemoryBudget>& budget = run != nullptr ? run->budget : kNoBudget;
    std::vector<Tensor> in_views(op.input_types.size());
    std::vector<const Tensor*> values(op.input_types.size(), nullptr);
    for (size_t i = 0; i < op.input_types.size(); ++i) {
      if (!op.present[i]) continue;
      in_views[i] =
          Tensor::View(op.input_types[i].dtype, op.input_types[i].shape, nullptr, inputs[i]);
      values[i] = &in_views[i];
    }
    std::vector<Tensor> outs;
    for (size_t i = 0; i < op.output_types.size() && !op.region; ++i) {
      outs.push_back(
          Tensor::View(op.output_types[i].dtype, op.output_types[i].shape, nullptr, outputs[i]));
    }
    Status s;
    if (op.region) {
      s = RunRegion(op, in_views, outputs, budget);
    } else if (op.subgraph_node) {
      const size_t explicit_inputs = op.input_types.size() - op.outer.size();
      TensorMap outer;
      for (size_t i = 0; i < op.outer.size(); ++i)
        outer[op.outer[i]] = in_views[explicit_inputs + i];
      std::vector<TensorType> types(op.input_types.begin(),
                                    op.input_types.begin() + explicit_inputs);
      std::vector<const Tensor*> explicit_values(values.begin(), values.begin() + explicit_inputs);
      std::vector<bool> present(op.present.begin(), op.present.begin() + explicit_inputs);
      OpContext ctx(op.node, op.opset, types, explicit_values, present, num_threads);
      ctx.set_budget(budget);
      s = op.subgraph_node->Run(ctx, outer, outs);
    } else {
      OpContext ctx(op.node, op.opset, op.input_types, values, op.present, num_threads);
      ctx.set_prepared(op.prepared.get());
      ctx.set_budget(budget);
      s = op.def->run(ctx, outs);
    }
    if (!s.ok()) {
      KILN_LOG(ERROR) << "cell reference op " << op.node.Describe() << ": " << s.ToString();
    }
    // A dynamic region runs eager's own kernels on the request's values: when they refuse them
    // (a shape that does not fit, an index out of range, more memory than the request's budget),
    // eager would refuse the request too. That is the input's fault, never the cell's; the
    // refusal itself goes back to the caller through its run context.
    if (op.region && s.code() == StatusCode::kInvalidArgument) {
      if (run != nullptr) run->refusal = s;
      return KILN_CELL_BAD_ARGUMENT;
    }
    return StatusToCellCode(s);
  } catch (const std::bad_alloc&) {
    return KILN_CELL_RESOURCE_EXHAUSTED;
  } catch (...) {
    return KILN_CELL_FAULT;
  }
}

void HostOpRelease(void* handle) { delete static_cast<PreparedOp*>(handle); }

}  // namespace

Result<nlohmann::json> NodeSpecJson(const Node& node, int64_t opset,
                                    const std::vector<TensorType>& input_types,
                                    const std::vector<bool>& input_present,
                                    const std::vector<TensorType>& output_types) {
  nlohmann::json j;
  j["op"] = node.op_type;
  j["domain"] = node.domain;
  j["name"] = node.name;
  j["opset"] = opset;
  nlohmann::json attrs = nlohmann::json::object();
  for (const auto& [name, a] : node.attrs) {
    auto aj = AttrJson(a);
    if (!aj.ok()) return aj.status().WithContext(node.Describe());
    attrs[name] = *aj;
  }
  j["attrs"] = attrs;
  nlohmann::json ins = nlohmann::json::array();
  for (size_t i = 0; i < input_types.size(); ++i) {
    ins.push_back(input_present[i] ? TypeJson(input_types[i]) : nlohmann::json());
  }
  j["inputs"] = ins;
  nlohmann::json outs = nlohmann::json::array();
  for (const TensorType& t : output_types) outs.push_back(TypeJson(t));
  j["outputs"] = outs;
  if (HasSubgraphs(node)) j["outer"] = ImplicitInputs(node);  // trailing inputs, by name
  return j;
}

const kiln_host_api* HostApi() {
  static const kiln_host_api api = {KILN_CELL_ABI_VERSION, HostSgemm,         HostConv2d,
                                    HostOpPrepare,         HostOpRun,         HostOpRelease,
                                    HostConv2dPrepare,     HostConv2dRun,     HostConv2dRelease,
                                    HostParallelFor,       HostMatmulPrepare, HostMatmulRun,
                                    HostMatmulRelease};
  return &api;
}

}  // namespace kiln
