// The op registry: one OpDef per (ONNX op type, domain, opset range), one field per concern.
//
// Every op kiln knows is registered once here and read by the verifier (check), shape inference
// and folding (infer), and the eager interpreter (run). Each family file (elementwise.cc, ...)
// lists its OpDefs in one *OpDefs() function and registers nothing; OpRegistry::Global() registers
// the families in order, with no static-initializer magic: the catalogue is registry.cc.
//
// Contract for an op author:
// - check(node, opset): validates attributes and input/output counts without looking at any
//   tensor. Errors name the node (node.Describe()), the attribute, its value and the expectation.
// - infer(ctx): output dtypes and shapes from input types. It may read an input's value through
//   ctx.value(i) when that input is known (always during eager runs; during static shape inference
//   only for constants); when a needed value is unknown it returns the error from ctx.RequireValue.
// - run(ctx, outputs): outputs[i] arrive allocated with the types infer returned; the kernel
//   fills them. Ops that own subgraphs (If, Loop) are the exception: their output shapes may
//   depend on what the body computes, so the interpreter hands them invalid outputs and run
//   assigns them; a caller with fixed buffers (a compiled cell) hands views, and run copies into
//   them after checking the types match. Static inference refuses a dim < 0 from infer by name.
//   Legacy opset forms (attributes that later became inputs) are read by opset here. An unsupported
//   dtype returns Unimplemented naming op and dtype. Kernels never throw.
// - prepare(node, opset), optional: parses the node's attributes once into an immutable
//   PreparedNode of the op's own type. An engine that applies one node many times (the eager
//   interpreter, the runtime host's reference ops) calls it when it builds its plan, after check,
//   and hands the result to every infer/run of that node through OpContext::prepared<T>(). Its
//   errors are check's and infer's, word for word. Engines that visit a node once (static shape
//   inference, lowering) do not prepare, so infer/run parse for themselves when prepared<T>() is
//   null (PreparedOr below).
#pragma once

#include <climits>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "src/kiln/base/status.h"
#include "src/kiln/graph/ir.h"
#include "src/kiln/tensor/tensor.h"

namespace kiln {

// The type of a value an op reads or writes: a tensor's dtype and shape, or (kind other than
// kTensor) a sequence's or optional's element dtype, its shape unused.
struct TensorType {
  DType dtype = DType::kFloat32;
  Shape shape;
  ValueKind kind = ValueKind::kTensor;
  bool operator==(const TensorType& o) const {
    return dtype == o.dtype && shape == o.shape && kind == o.kind;
  }
  std::string ToString() const {
    if (kind != ValueKind::kTensor) {
      return std::string(ValueKindName(kind)) + "<" + DTypeName(dtype) + ">";
    }
    return std::string(DTypeName(dtype)) + ShapeToString(shape);
  }
};
// The type of a value (its kind, dtype and, for a tensor, shape).
inline TensorType TypeOf(const Tensor& t) {
  return t.is_tensor() ? TensorType{t.dtype(), t.shape(), ValueKind::kTensor}
                       : TensorType{t.dtype(), {}, t.kind()};
}

// How an op that owns subgraphs (If, Loop) reaches the engine walking the graph around it: the
// interpreter runs a body eagerly, static shape inference infers it, the runtime host runs it for
// a compiled cell. A body reads outer-scope values by name from the scope of the node's
// application; its explicit inputs bind to body.inputs by position.
class SubgraphRunner {
 public:
  virtual ~SubgraphRunner() = default;
  // Types of the body's outputs for explicit inputs of `types` (`values[i]` non-null when known).
  // A dim < 0 means "known only after run". Errors name the op and what is not known. When
  // `known_outputs` is given it receives, per output, the value when statically known (a
  // structural value) or an invalid tensor.
  virtual Result<std::vector<TensorType>> InferBody(
      const Graph& body, const std::vector<TensorType>& types,
      const std::vector<const Tensor*>& values,
      std::vector<Tensor>* known_outputs = nullptr) const = 0;
  // Runs the body; returns its outputs in body.outputs order.
  virtual Result<std::vector<Tensor>> RunBody(const Graph& body,
                                              const std::vector<Tensor>& inputs) const = 0;
};

// The state an op's prepare parses from one node's attributes; each op derives its own type.
// Immutable once built and shared by every run of the node, on any number of threads at once.
class PreparedNode {
 public:
  virtual ~PreparedNode() = default;
};

// What an op sees of one node application: the node, its opset, per input slot a type and (when
// known) a value, and the node's prepared state when the engine prepared it. Omitted optional
// inputs have present(i) == false.
class OpContext {
 public:
  OpContext(const Node& node, int64_t opset, std::vector<TensorType> types,
            std::vector<const Tensor*> values, std::vector<bool> present, int num_threads = 1);

  const Node& node() const { return node_; }
  int64_t opset() const { return opset_; }
  int num_threads() const { return num_threads_; }
  size_t num_inputs() const { return types_.size(); }
  bool present(size_t i) const { return i < present_.size() && present_[i]; }
  // REQUIRES: present(i)
  const TensorType& type(size_t i) const { return types_[i]; }
  // The value of input i when known, else nullptr (also for absent inputs).
  const Tensor* value(size_t i) const { return i < values_.size() ? values_[i] : nullptr; }
  // The value of input i, or an error naming the node and the input ("Reshape 'r': input 1
  // ('shape') must be a constant known before run") when it is absent or unknown.
  Result<const Tensor*> RequireValue(size_t i, const std::string& role) const;
  // REQUIRES: value(i) != nullptr. Convenience for kernels, where every present input is known.
  const Tensor& in(size_t i) const { return *values_[i]; }
  // Error prefix "<Op> '<name>'" for messages.
  std::string where() const { return node_.Describe(); }
  // The engine that runs or infers this node's subgraphs; nullptr where none can (ops without
  // subgraph attributes never need it).
  const SubgraphRunner* subgraphs() const { return subgraphs_; }
  void set_subgraphs(const SubgraphRunner* runner) { subgraphs_ = runner; }
  // What this node's OpDef::prepare returned, or nullptr where the engine did not prepare.
  // REQUIRES: T is the type that prepare builds (only the op's own infer/run ask for it).
  template <typename T>
  const T* prepared() const {
    return static_cast<const T*>(prepared_);
  }
  void set_prepared(const PreparedNode* prepared) { prepared_ = prepared; }
  // The memory budget of the request this node runs for (tensor/memory_budget.h), for an op that
  // allocates tensors itself (a loop's stacked scan outputs) and for the subgraphs it runs; null
  // where the engine runs without one. Outputs the engine allocates are charged by the engine.
  const std::shared_ptr<MemoryBudget>& budget() const { return budget_; }
  void set_budget(std::shared_ptr<MemoryBudget> budget) { budget_ = std::move(budget); }

 private:
  const Node& node_;
  int64_t opset_;
  std::vector<TensorType> types_;
  std::vector<const Tensor*> values_;
  std::vector<bool> present_;
  int num_threads_;
  const SubgraphRunner* subgraphs_ = nullptr;
  const PreparedNode* prepared_ = nullptr;
  std::shared_ptr<MemoryBudget> budget_;
};

using CheckFn = Status (*)(const Node& node, int64_t opset);
using InferFn = Result<std::vector<TensorType>> (*)(const OpContext& ctx);
using RunFn = Status (*)(const OpContext& ctx, std::vector<Tensor>& outputs);
using PrepareFn = Result<std::shared_ptr<const PreparedNode>> (*)(const Node& node, int64_t opset);

struct OpDef {
  OpDef() = default;
  // Positional, as the family tables list them; prepare last since most ops have none.
  OpDef(std::string op_type, std::string domain, int64_t since_version, int64_t until_version,
        CheckFn check, InferFn infer, RunFn run, PrepareFn prepare = nullptr)
      : op_type(std::move(op_type)),
        domain(std::move(domain)),
        since_version(since_version),
        until_version(until_version),
        check(check),
        infer(infer),
        run(run),
        prepare(prepare) {}

  std::string op_type;
  std::string domain;  // "" = ai.onnx
  int64_t since_version = 1;
  int64_t until_version = INT64_MAX;  // inclusive
  CheckFn check = nullptr;            // optional: absent means no attribute constraints
  InferFn infer = nullptr;            // required
  RunFn run = nullptr;                // required
  PrepareFn prepare = nullptr;        // optional: absent means infer/run read attributes
  // The op draws random values (Bernoulli, RandomUniform, ...). kiln seeds every draw, so eager
  // and a cell agree on them; another runtime's draws differ, so comparisons across runtimes
  // check such an op's outputs by their support, dtype and shape, never by value.
  bool nondeterministic = false;
  // The op reads or writes sequences and optionals (ValueKind), or string tensors. Engines
  // refuse such a value at any other op by name, before its infer runs: every other kernel
  // reads dense bytes.
  bool values = false;
  bool strings = false;
};

// Builds `T` (a PreparedNode) with `parse`, for OpDef::prepare: `PrepareWith<ConvAttrs,
// ParseConvAttrs>`.
template <typename T, Result<T> (*Parse)(const Node&, int64_t)>
Result<std::shared_ptr<const PreparedNode>> PrepareWith(const Node& node, int64_t opset) {
  KILN_ASSIGN_OR_RETURN(T parsed, Parse(node, opset));
  return std::shared_ptr<const PreparedNode>(std::make_shared<const T>(std::move(parsed)));
}

// The node's prepared `T` when the engine prepared it, else `parse`d now into `*scratch`: an op's
// infer/run read their attributes through this, so they behave the same prepared or not.
template <typename T>
Result<const T*> PreparedOr(const OpContext& ctx, T* scratch,
                            Result<T> (*parse)(const Node&, int64_t)) {
  if (const T* p = ctx.prepared<T>()) return p;
  KILN_ASSIGN_OR_RETURN(*scratch, parse(ctx.node(), ctx.opset()));
  return static_cast<const T*>(scratch);
}

class OpRegistry {
 public:
  // The registry with every op kiln ships; built once, immutable afterwards, thread-safe to read.
  static const OpRegistry& Global();

  // Adds a definition. REQUIRES: no overlapping opset range for the same (domain, op_type).
  void Register(OpDef def);
  // The definition covering (domain, op_type, opset), or NotFound/Unimplemented naming the op,
  // its domain and opset and what is supported.
  Result<const OpDef*> Find(const std::string& domain, const std::string& op_type,
                            int64_t opset) const;
  // Sorted "op_type" names for the default domain, for `kiln info` and docs; with
  // `all_domains`, the op types of every domain (ai.onnx.preview.training's optimizers too).
  std::vector<std::string> OpTypes(bool all_domains = false) const;

 private:
  std::map<std::pair<std::string, std::string>, std::vector<OpDef>> defs_;
};

// The families' catalogues, one per family file: each lists its OpDefs and registers nothing
// itself; OpRegistry::Global() registers them in this order (the one registration idiom).
std::vector<OpDef> ElementwiseOpDefs();  // ops/elementwise.cc: unary, binary, activations
std::vector<OpDef> ReduceOpDefs();       // ops/reduce.cc: Softmax, ReduceMean, ReduceSum
std::vector<OpDef> MatMulOpDefs();       // ops/matmul.cc: MatMul, Gemm
std::vector<OpDef> ConvOpDefs();         // ops/conv.cc: Conv, ConvTranspose
std::vector<OpDef> PoolOpDefs();         // ops/pool.cc: Max/Average pools, global pools
std::vector<OpDef> NormOpDefs();         // ops/norm.cc: Batch/Instance/Layer/Group norm
std::vector<OpDef> ShapeOpDefs();        // ops/shape_ops.cc: Reshape ... Range, Constant...
std::vector<OpDef> QuantOpDefs();        // ops/quant_ops.cc: QDQ, QLinear*, *Integer
std::vector<OpDef> RecurrentOpDefs();    // ops/recurrent.cc: LSTM, GRU, RNN
std::vector<OpDef> ResizeOpDefs();       // ops/resize.cc: Resize, Upsample
std::vector<OpDef> IndexOpDefs();        // ops/index_ops.cc: gather/scatter, Einsum...
std::vector<OpDef> ControlFlowOpDefs();  // ops/control_flow.cc: If, Loop, Scan
std::vector<OpDef> MathOpDefs();         // ops/math_ops.cc: trigonometry, IsInf, BitShift, Det
std::vector<OpDef> LossOpDefs();         // ops/loss.cc: NegativeLogLikelihood, SoftmaxCrossEntropy
std::vector<OpDef> SignalOpDefs();       // ops/signal.cc: DFT, STFT, windows, MelWeightMatrix
std::vector<OpDef> VisionOpDefs();       // ops/vision.cc: GridSample, RoiAlign, NMS, LRN...
std::vector<OpDef> TensorOpDefs();       // ops/tensor_ops.cc: Compress, Unique, CastLike...
std::vector<OpDef> TrainingOpDefs();     // ops/training.cc: Adagrad, Momentum, Adam
std::vector<OpDef> RandomOpDefs();       // ops/random.cc: Bernoulli, RandomUniform...
std::vector<OpDef> SequenceOpDefs();     // ops/sequence.cc: Sequence*, Optional*

// kiln's own ops, never in a user's model: a sequence, optional or string value packed into a
// uint8 vector where it crosses a compiled cell's boundary, and back (tensor/packed_value.h).
// UnpackValue's attributes `kind` (a ValueKind) and `dtype` (a DType name) say what it holds.
inline constexpr const char* kInternalDomain = "ai.kiln.internal";
inline constexpr const char* kPackValueOp = "PackValue";
inline constexpr const char* kUnpackValueOp = "UnpackValue";

// The refusal token by which infer says an output's type depends on an input's value that is not
// known (RequireValue's "must be a constant known before run", and the data-dependent refusals of
// NonZero and If). A field of the Status (never read out of its message); tolerant shape
// inference runs such a node at run time.
inline constexpr const char* kRefusalValueDependent = "value_dependent";
// True when `s` carries kRefusalValueDependent.
bool IsValueDependent(const Status& s);

// Unimplemented naming the node when one of `types` (its inputs' or outputs') is a sequence or
// optional and the op does not take them (OpDef::values), or a string tensor and the op does not
// take strings (OpDef::strings). Every engine checks this before the op's infer and after it.
Status CheckValueKinds(const OpDef& def, const Node& node, const std::vector<TensorType>& types);

// Helpers shared by family files.
// Unary/binary ops that keep the (broadcast) shape and dtype of input 0 / inputs.
Result<std::vector<TensorType>> InferSameAsInput0(const OpContext& ctx);
Result<std::vector<TensorType>> InferBroadcast(const OpContext& ctx);
// Checks the input count is within [min, max] and the output count within [1, max_outputs].
Status CheckArity(const Node& node, size_t min_inputs, size_t max_inputs, size_t max_outputs = 1);
// Unimplemented "<Op> '<name>': dtype int8 is not supported (supported: float32, int64)".
Status UnsupportedDType(const OpContext& ctx, DType dtype, const char* supported);

}  // namespace kiln
