// Random valid ONNX graphs for the compiler's differential fuzzer (see graph_gen.h).
//
// The generator keeps a pool of values per scope (the top-level graph, then each If branch or
// Loop body being written), each with its dtype, its shape and whether both engines compute it
// bit for bit. A move reads values of the pool (any enclosing scope's), appends the nodes of one
// pattern to the current scope, and adds what they define. Weights and graph inputs always live
// in the top-level graph: a body reads them as outer values, as exporters' bodies do.
#include "fuzz/graphs/graph_gen.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>

namespace kiln::graph_fuzz {

namespace {

using onnx::TensorProto;

struct Val {
  std::string name;
  DType dtype = DType::kFloat32;
  Shape shape;
  // Both engines compute it bit for bit: inputs, weights, and what only moves or selects their
  // elements (layout ops, Relu, Abs, Max, MaxPool, nearest Resize ...).
  bool exact = false;
  bool computed = false;  // defined by a node (not an input or a weight)
};

int ElemType(DType t) {
  switch (t) {
    case DType::kFloat32:
      return TensorProto::FLOAT;
    case DType::kInt64:
      return TensorProto::INT64;
    case DType::kInt32:
      return TensorProto::INT32;
    case DType::kBool:
      return TensorProto::BOOL;
    default:
      return TensorProto::UNDEFINED;
  }
}

class Generator {
 public:
  Generator(uint64_t seed, const GenOptions& o) : rng_(seed * 0x9e3779b97f4a7c15ULL + 1), o_(o) {
    out_.name = "s" + std::to_string(seed);
    out_.model.set_ir_version(8);
    auto* os = out_.model.add_opset_import();
    os->set_domain("");
    os->set_version(o.opset);
    top_ = out_.model.mutable_graph();
    top_->set_name("fuzz");
    cur_ = top_;
    scopes_.emplace_back();
  }

  FuzzGraph Build() {
    batch_ = Pick<int64_t>({1, 1, 2, 3});
    Start();
    const int moves = Int(o_.min_moves, o_.max_moves);
    for (int m = 0; m < moves; ++m) {
      for (int attempt = 0; attempt < 20; ++attempt) {
        const size_t i = WeightedMove();
        const size_t before = static_cast<size_t>(top_->node_size());
        if (Moves()[i].fn(*this)) {
          out_.moves.push_back(Moves()[i].name);
          break;
        }
        // A move that gave up leaves nothing behind.
        while (static_cast<size_t>(top_->node_size()) > before) top_->mutable_node()->RemoveLast();
      }
    }
    Finish();
    return std::move(out_);
  }

  // ---- the move table ------------------------------------------------------------------------
  struct Move {
    const char* name;
    int weight;
    std::function<bool(Generator&)> fn;
  };
  static const std::vector<Move>& Moves() {
    static const std::vector<Move> kMoves = {
        {"unary", 10, [](Generator& g) { return g.Unary(); }},
        {"binary", 12, [](Generator& g) { return g.Binary(); }},
        {"compare-where", 4, [](Generator& g) { return g.CompareWhere(); }},
        {"clip", 4, [](Generator& g) { return g.ClipMove(); }},
        {"cast", 2, [](Generator& g) { return g.CastMove(); }},
        {"gemm", 8, [](Generator& g) { return g.GemmMove(); }},
        {"matmul", 7, [](Generator& g) { return g.MatMulMove(); }},
        {"conv", 8, [](Generator& g) { return g.ConvMove(); }},
        {"winograd-conv", 1, [](Generator& g) { return g.BigConvMove(); }},
        {"norm", 6, [](Generator& g) { return g.NormMove(); }},
        {"attention", 3, [](Generator& g) { return g.AttentionMove(); }},
        {"softmax", 3, [](Generator& g) { return g.SoftmaxMove(); }},
        {"reduce", 4, [](Generator& g) { return g.ReduceMove(); }},
        {"layout", 10, [](Generator& g) { return g.LayoutMove(); }},
        {"pool", 4, [](Generator& g) { return g.PoolMove(); }},
        {"resize", 3, [](Generator& g) { return g.ResizeMove(); }},
        {"shape-chain", 3, [](Generator& g) { return g.ShapeChainMove(); }},
        {"if-structural", 2, [](Generator& g) { return g.IfMove(false); }},
        {"if-runtime", 2, [](Generator& g) { return g.IfMove(true); }},
        {"if-untypable-branch", 1, [](Generator& g) { return g.IfUntypableBranchMove(); }},
        {"loop", 2, [](Generator& g) { return g.LoopMove(); }},
        {"recurrent", 3, [](Generator& g) { return g.RecurrentMove(); }},
        {"other", 3, [](Generator& g) { return g.OtherMove(); }},
        {"more", 4, [](Generator& g) { return g.MoreMove(); }},
        {"dynamic", 2, [](Generator& g) { return g.DynamicMove(); }},
    };
    return kMoves;
  }

 private:
  // ---- randomness ----------------------------------------------------------------------------
  int Int(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  int64_t I64(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
  }
  float Uni(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(rng_); }
  bool Chance(double p) { return std::bernoulli_distribution(p)(rng_); }
  template <typename T>
  T Pick(std::initializer_list<T> v) {
    return *(v.begin() + Int(0, static_cast<int>(v.size()) - 1));
  }
  template <typename T>
  const T& PickOf(const std::vector<T>& v) {
    return v[static_cast<size_t>(Int(0, static_cast<int>(v.size()) - 1))];
  }

  size_t WeightedMove() {
    int total = 0;
    for (const Move& m : Moves()) total += m.weight;
    int r = Int(0, total - 1);
    for (size_t i = 0; i < Moves().size(); ++i) {
      r -= Moves()[i].weight;
      if (r < 0) return i;
    }
    return 0;
  }

  // ---- names, nodes, values ------------------------------------------------------------------
  std::string Fresh(const std::string& stem) { return stem + std::to_string(next_++); }

  onnx::NodeProto& Node(const std::string& op, std::vector<std::string> inputs,
                        std::vector<std::string> outputs) {
    auto* n = cur_->add_node();
    n->set_op_type(op);
    n->set_name(Fresh("n") + "_" + op);
    for (auto& i : inputs) n->add_input(i);
    for (auto& o : outputs) n->add_output(o);
    return *n;
  }
  static void AttrI(onnx::NodeProto& n, const char* name, int64_t v) {
    auto* a = n.add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(v);
  }
  static void AttrF(onnx::NodeProto& n, const char* name, float v) {
    auto* a = n.add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::FLOAT);
    a->set_f(v);
  }
  static void AttrS(onnx::NodeProto& n, const char* name, const std::string& v) {
    auto* a = n.add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::STRING);
    a->set_s(v);
  }
  static void AttrInts(onnx::NodeProto& n, const char* name, const std::vector<int64_t>& v) {
    auto* a = n.add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INTS);
    for (int64_t x : v) a->add_ints(x);
  }
  static onnx::GraphProto* AttrG(onnx::NodeProto& n, const char* name) {
    auto* a = n.add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::GRAPH);
    return a->mutable_g();
  }

  static void SetType(onnx::ValueInfoProto* vi, const std::string& name, DType dt,
                      const Shape* shape) {
    vi->set_name(name);
    auto* tt = vi->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(ElemType(dt));
    if (shape) {
      auto* s = tt->mutable_shape();
      for (int64_t d : *shape) s->add_dim()->set_dim_value(d);
    }
  }

  Val& Push(Val v) {
    scopes_.back().push_back(std::move(v));
    return scopes_.back().back();
  }
  Val Def(const std::string& name, DType dt, Shape shape, bool exact) {
    Val v{name, dt, std::move(shape), exact, true};
    Push(v);
    return v;
  }

  // A new graph input (always top level), drawn now: floats in [-2, 2).
  Val Input(Shape shape, DType dt = DType::kFloat32) {
    Val v{Fresh("in"), dt, shape, true, false};
    SetType(top_->add_input(), v.name, dt, &shape);
    const int64_t n = NumElements(shape);
    if (dt == DType::kFloat32) {
      std::vector<float> x(static_cast<size_t>(n));
      for (auto& e : x) e = Uni(-2.0f, 2.0f);
      out_.inputs[v.name] = Tensor::FromVector<float>(shape, x);
    } else if (dt == DType::kBool) {
      Tensor t = *Tensor::Empty(DType::kBool, shape);
      for (int64_t i = 0; i < n; ++i) t.data<uint8_t>()[i] = Chance(0.5) ? 1 : 0;
      out_.inputs[v.name] = t;
    } else {
      std::vector<int64_t> x(static_cast<size_t>(n));
      for (auto& e : x) e = I64(0, 3);
      out_.inputs[v.name] = Tensor::FromVector<int64_t>(shape, x);
    }
    scopes_.front().push_back(v);
    return v;
  }
  // A float weight (always top level) with values in [lo, hi).
  Val Weight(Shape shape, float lo = -1.0f, float hi = 1.0f) {
    std::vector<float> x(static_cast<size_t>(NumElements(shape)));
    for (auto& e : x) e = Uni(lo, hi);
    return WeightOf(shape, x);
  }
  Val WeightOf(Shape shape, const std::vector<float>& x) {
    Val v{Fresh("w"), DType::kFloat32, shape, true, false};
    auto* t = top_->add_initializer();
    t->set_name(v.name);
    t->set_data_type(TensorProto::FLOAT);
    for (int64_t d : shape) t->add_dims(d);
    for (float e : x) t->add_float_data(e);
    scopes_.front().push_back(v);
    return v;
  }
  // Fan-in scaled weights for a product over k terms.
  Val ProductWeight(Shape shape, int64_t k) {
    const float s = 1.5f / std::sqrt(static_cast<float>(std::max<int64_t>(k, 1)));
    return Weight(std::move(shape), -s, s);
  }
  // A structural int64 constant (top level, never added to the pool).
  std::string Ints(const std::vector<int64_t>& values, bool scalar = false) {
    const std::string name = Fresh("k");
    auto* t = top_->add_initializer();
    t->set_name(name);
    t->set_data_type(TensorProto::INT64);
    if (!scalar) t->add_dims(static_cast<int64_t>(values.size()));
    for (int64_t x : values) t->add_int64_data(x);
    return name;
  }
  // A float structural constant (Resize scales: it decides a shape).
  std::string Floats(const std::vector<float>& values) {
    const std::string name = Fresh("f");
    auto* t = top_->add_initializer();
    t->set_name(name);
    t->set_data_type(TensorProto::FLOAT);
    t->add_dims(static_cast<int64_t>(values.size()));
    for (float x : values) t->add_float_data(x);
    return name;
  }

  // One-output node helper: defines and pools the result.
  Val Op(const std::string& op, std::vector<std::string> ins, DType dt, Shape shape, bool exact,
         const std::function<void(onnx::NodeProto&)>& attrs = nullptr) {
    const std::string out = Fresh("v");
    auto& n = Node(op, std::move(ins), {out});
    if (attrs) attrs(n);
    return Def(out, dt, std::move(shape), exact);
  }

  // ---- choosing values -----------------------------------------------------------------------
  std::vector<const Val*> Visible(const std::function<bool(const Val&)>& pred) const {
    std::vector<const Val*> out;
    for (const auto& scope : scopes_) {
      for (const Val& v : scope) {
        if (pred(v)) out.push_back(&v);
      }
    }
    return out;
  }
  // A float value; recent computed values are preferred, so moves chain.
  const Val* PickFloat(const std::function<bool(const Val&)>& pred = nullptr) {
    auto c = Visible([&](const Val& v) {
      return v.dtype == DType::kFloat32 && !v.shape.empty() && NumElements(v.shape) > 0 &&
             NumElements(v.shape) <= 40000 && (!pred || pred(v));
    });
    if (c.empty()) return nullptr;
    if (Chance(0.6)) {  // the most recent computed candidate
      for (auto it = c.rbegin(); it != c.rend(); ++it) {
        if ((*it)->computed) return *it;
      }
    }
    return c[static_cast<size_t>(Int(0, static_cast<int>(c.size()) - 1))];
  }
  const Val* PickExact(const std::function<bool(const Val&)>& pred = nullptr) {
    return PickFloat([&](const Val& v) { return v.exact && (!pred || pred(v)); });
  }

  // An operand that broadcasts into `s` without changing it: the shapes exporters give bias
  // vectors, per-channel factors, masks and scalars, bound as a weight, given as an input, or
  // computed at run time (a [1, N] through a Gemm is a diffusion model's time embedding).
  Val Operand(const Shape& s, bool prefer_runtime = false) {
    const size_t r = s.size();
    std::vector<Shape> forms = {s};
    if (r >= 1) {
      forms.push_back({s.back()});
      Shape ones(r, 1);
      ones.back() = s.back();
      forms.push_back(ones);  // [1, N], [1, 1, N] ...
      Shape lead(r, 1);
      lead[0] = s[0];
      forms.push_back(lead);  // [B, 1, ...]
      forms.push_back({});    // scalar
      forms.push_back({1});
      Shape rnd = s;
      for (auto& d : rnd) d = Chance(0.5) ? d : 1;
      forms.push_back(rnd);
    }
    if (r >= 3) {
      Shape ch(r, 1);
      ch[1] = s[1];
      forms.push_back(ch);  // [1, C, 1, 1]
      Shape tail(r - 1, 1);
      tail[0] = s[1];
      forms.push_back(tail);  // [C, 1, 1]
    }
    Shape form = PickOf(forms);
    // An existing value of exactly that shape (diamonds in the graph).
    if (Chance(0.25)) {
      if (const Val* v = PickFloat([&](const Val& x) { return x.shape == form; })) return *v;
    }
    const int src = prefer_runtime ? Pick({1, 2, 2}) : Pick({0, 0, 1, 2});
    if (src == 0 || form.empty()) return Weight(form);
    if (src == 1) return Input(form);
    // Computed at run time.
    if (form.size() == 2) {
      const int64_t k = Pick<int64_t>({4, 8, 16});
      Val a = Input({form[0], k});
      Val w = ProductWeight({k, form[1]}, k);
      return Op("Gemm", {a.name, w.name}, DType::kFloat32, form, false);
    }
    Val a = Input(form);
    return Op(Pick<const char*>({"Sigmoid", "Tanh", "Relu"}), {a.name}, DType::kFloat32, form,
              false);
  }

  // ---- the start and the end -----------------------------------------------------------------
  void Start() {
    switch (Int(0, 2)) {
      case 0:
        Input({batch_, Pick<int64_t>({4, 8, 12, 16, 32})});
        break;
      case 1:
        Input({batch_, Pick<int64_t>({2, 3, 5, 8}), Pick<int64_t>({4, 8, 16})});
        break;
      default:
        Input({batch_, Pick<int64_t>({1, 3, 4, 8}), Pick<int64_t>({4, 5, 8, 12}),
               Pick<int64_t>({4, 6, 8, 12})});
        break;
    }
  }

  void Finish() {
    // Outputs: the last value defined, and perhaps one or two others (an intermediate that is
    // also an output changes what fusion may do with it).
    std::vector<const Val*> computed = Visible([](const Val& v) { return v.computed; });
    if (computed.empty()) {
      const Val* x = PickFloat();
      Op("Identity", {x->name}, x->dtype, x->shape, x->exact);
      computed = Visible([](const Val& v) { return v.computed; });
    }
    std::vector<const Val*> outs = {computed.back()};
    for (int extra = Int(0, 2); extra > 0 && computed.size() > 1; --extra) {
      const Val* v = computed[static_cast<size_t>(Int(0, static_cast<int>(computed.size()) - 2))];
      if (std::find(outs.begin(), outs.end(), v) == outs.end()) outs.push_back(v);
    }
    for (const Val* v : outs) SetType(top_->add_output(), v->name, v->dtype, nullptr);
    // Non-finite inputs: NaN, +Inf and -Inf at a few positions, or everywhere.
    if (Chance(0.35)) {
      for (auto& [name, t] : out_.inputs) {
        if (t.dtype() != DType::kFloat32 || Chance(0.4)) continue;
        float* d = t.data<float>();
        const float kinds[] = {std::numeric_limits<float>::quiet_NaN(),
                               std::numeric_limits<float>::infinity(),
                               -std::numeric_limits<float>::infinity()};
        if (Chance(0.1)) {
          const float k = kinds[Int(0, 2)];
          for (int64_t i = 0; i < t.numel(); ++i) d[i] = k;
        } else {
          for (int c = Int(1, 3); c > 0; --c) d[I64(0, t.numel() - 1)] = kinds[Int(0, 2)];
        }
      }
    }
  }

  // ---- moves ---------------------------------------------------------------------------------
  bool Unary() {
    static const std::vector<const char*> kSmooth = {
        "Sqrt", "Exp",      "Log",       "Reciprocal", "Sigmoid", "Tanh",      "Erf",         "Sin",
        "Cos",  "Softplus", "HardSwish", "Softsign",   "Mish",    "LeakyRelu", "HardSigmoid", "Elu",
        "Selu", "Celu",     "Neg",       "Abs",        "Relu",    "Identity"};
    static const std::vector<const char*> kJumps = {"Floor",           "Ceil",  "Round", "Sign",
                                                    "ThresholdedRelu", "Shrink"};
    const bool jump = Chance(0.2);
    const Val* xp = jump ? PickExact() : PickFloat();
    if (!xp) return false;
    Val x = *xp;
    const std::string op = jump ? PickOf(kJumps) : PickOf(kSmooth);
    if ((op == "Sqrt" || op == "Log" || op == "Reciprocal") && Chance(0.7)) {
      x = Op("Abs", {x.name}, DType::kFloat32, x.shape, x.exact);
    }
    const bool moves_only = op == "Neg" || op == "Abs" || op == "Relu" || op == "Identity";
    Op(op, {x.name}, DType::kFloat32, x.shape, (moves_only || jump) && x.exact,
       [&](onnx::NodeProto& n) {
         if (op == "LeakyRelu" || op == "Elu" || op == "Celu") {
           AttrF(n, "alpha", Pick({0.01f, 0.2f, 1.0f, 1.5f}));
         }
         if (op == "HardSigmoid" && Chance(0.5)) {
           AttrF(n, "alpha", Pick({0.2f, 1.0f / 6}));
           AttrF(n, "beta", 0.5f);
         }
         if (op == "ThresholdedRelu") AttrF(n, "alpha", Pick({0.5f, 1.0f}));
         if (op == "Shrink") AttrF(n, "lambd", Pick({0.5f, 1.0f}));
       });
    return true;
  }

  bool Binary() {
    const Val* xp = PickFloat();
    if (!xp) return false;
    const Val x = *xp;
    const std::string op = Pick<const char*>(
        {"Add", "Add", "Sub", "Mul", "Mul", "Div", "Pow", "Min", "Max", "PRelu", "Sum", "Mean"});
    if (op == "PRelu") {
      // PRelu's slope broadcasts to X one way: per channel ([C, 1, ...]) or per last dim.
      Shape slope = {x.shape.back()};
      if (x.shape.size() >= 3 && Chance(0.5)) {
        slope.assign(x.shape.size() - 1, 1);
        slope[0] = x.shape[1];
      }
      Val sl = Weight(slope, 0.0f, 0.5f);
      Op("PRelu", {x.name, sl.name}, DType::kFloat32, x.shape, false);
      return true;
    }
    Val y = Operand(x.shape);
    if (op == "Div" && !y.computed && Chance(0.7)) {
      // Away from zero: a divisor's sign kept, its magnitude in [0.5, 2].
      y = Op("Add",
             {Op("Abs", {y.name}, DType::kFloat32, y.shape, false).name, WeightOf({}, {0.5f}).name},
             DType::kFloat32, y.shape, false);
    }
    if (op == "Pow") {
      const Val e = Chance(0.5) ? WeightOf({}, {Pick({2.0f, 0.5f, 3.0f, -1.0f, 1.5f})}) : y;
      const Val base = Chance(0.6) ? Op("Abs", {x.name}, DType::kFloat32, x.shape, x.exact) : x;
      Op("Pow", {base.name, e.name}, DType::kFloat32, x.shape, false);
      return true;
    }
    const bool selects = op == "Min" || op == "Max";
    std::vector<std::string> ins = {x.name, y.name};
    if (Chance(0.3)) std::swap(ins[0], ins[1]);
    if ((op == "Sum" || op == "Mean" || selects) && Chance(0.3)) {
      ins.push_back(Operand(x.shape).name);
    }
    Op(op, ins, DType::kFloat32, x.shape, selects && x.exact && y.exact);
    return true;
  }

  bool CompareWhere() {
    const Val* ap = PickExact();
    if (!ap) return false;
    const Val a = *ap;
    Val b = Operand(a.shape);
    if (!b.exact) b = Weight(b.shape);
    const std::string op =
        Pick<const char*>({"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"});
    Val c = Op(op, {a.name, b.name}, DType::kBool, a.shape, true);
    if (Chance(0.3)) {
      Val d = Op("Greater", {a.name, Weight({}).name}, DType::kBool, a.shape, true);
      c = Op(Pick<const char*>({"And", "Or", "Xor"}), {c.name, d.name}, DType::kBool, a.shape,
             true);
    }
    if (Chance(0.2)) c = Op("Not", {c.name}, DType::kBool, a.shape, true);
    if (Chance(0.3)) {
      Op("Cast", {c.name}, DType::kFloat32, a.shape, true,
         [](onnx::NodeProto& n) { AttrI(n, "to", TensorProto::FLOAT); });
      return true;
    }
    const Val* xp = PickFloat([&](const Val& v) { return v.shape == a.shape; });
    const Val x = xp ? *xp : a;
    const Val y = Operand(a.shape);
    Op("Where", {c.name, x.name, y.name}, DType::kFloat32, a.shape, x.exact && y.exact);
    return true;
  }

  bool ClipMove() {
    const Val* xp = PickFloat();
    if (!xp) return false;
    const Val x = *xp;
    float lo = Pick({0.0f, -1.0f, -0.5f, -6.0f}), hi = Pick({6.0f, 1.0f, 0.5f, 2.0f});
    if (Chance(0.05)) std::swap(lo, hi);  // min > max: every value becomes max
    std::vector<std::string> ins = {x.name};
    const int form = Int(0, 3);
    ins.push_back(form == 1 ? "" : WeightOf({}, {lo}).name);
    if (form != 2) ins.push_back(WeightOf({}, {hi}).name);
    if (form == 3 && Chance(0.5)) ins.pop_back();
    Op("Clip", ins, DType::kFloat32, x.shape, x.exact);
    return true;
  }

  bool CastMove() {
    const Val* xp = PickExact();
    if (!xp) return false;
    const Val x = *xp;
    const auto to = Pick<int>({TensorProto::INT64, TensorProto::INT32, TensorProto::BOOL});
    const DType dt = to == TensorProto::INT64   ? DType::kInt64
                     : to == TensorProto::INT32 ? DType::kInt32
                                                : DType::kBool;
    Val i =
        Op("Cast", {x.name}, dt, x.shape, true, [&](onnx::NodeProto& n) { AttrI(n, "to", to); });
    Op("Cast", {i.name}, DType::kFloat32, x.shape, true,
       [](onnx::NodeProto& n) { AttrI(n, "to", TensorProto::FLOAT); });
    return true;
  }

  // As rank 2: [B, F] as it is; a higher rank through Flatten or a Reshape to [rows, last].
  Val AsMatrix(const Val& x) {
    if (x.shape.size() == 2) return x;
    if (Chance(0.5)) {
      const int64_t rows = x.shape[0];
      return Op("Flatten", {x.name}, DType::kFloat32, {rows, NumElements(x.shape) / rows}, x.exact);
    }
    const int64_t last = x.shape.back();
    return Op("Reshape", {x.name, Ints({-1, last})}, DType::kFloat32,
              {NumElements(x.shape) / last, last}, x.exact);
  }

  // Appends 0-3 epilogue ops after a library call's output y (bias adds with weight or runtime
  // operands, activations, SiLU, erf GELU, scaling, clamps). Returns the last value.
  Val Epilogue(Val y, bool conv) {
    // Half the time the first step is the add a bias fold looks for: a vector along the last
    // axis (or per channel), bound or computed at run time.
    if (Chance(0.5)) {
      const Shape& s = y.shape;
      Shape row(s.size(), 1);
      row.back() = s.back();
      std::vector<Shape> forms = {{s.back()}, row, s};
      if (conv) {
        Shape ch(s.size(), 1);
        ch[1] = s[1];
        forms = {ch, {s[1], 1, 1}, s};
      }
      const Shape form = PickOf(forms);
      Val b;
      switch (Int(0, 2)) {
        case 0:
          b = Weight(form);
          break;
        case 1:
          b = Input(form);
          break;
        default:
          b = Operand(form, true);
          if (b.shape != form) b = Input(form);
          break;
      }
      y = Op("Add",
             Chance(0.7) ? std::vector<std::string>{y.name, b.name}
                         : std::vector<std::string>{b.name, y.name},
             DType::kFloat32, y.shape, false);
    }
    const int steps = Int(0, 3);
    for (int s = 0; s < steps; ++s) {
      switch (Int(0, conv ? 9 : 8)) {
        case 0:
        case 1: {  // bias / embedding add
          Val b = Operand(y.shape, Chance(0.5));
          y = Op("Add",
                 Chance(0.7) ? std::vector<std::string>{y.name, b.name}
                             : std::vector<std::string>{b.name, y.name},
                 DType::kFloat32, y.shape, false);
          break;
        }
        case 2: {  // SiLU as exporters write it
          Val sg = Op("Sigmoid", {y.name}, DType::kFloat32, y.shape, false);
          y = Op("Mul", {y.name, sg.name}, DType::kFloat32, y.shape, false);
          break;
        }
        case 3: {  // erf GELU with its constants as weights
          const bool div = Chance(0.5);
          Val c1 = WeightOf({}, {div ? std::sqrt(2.0f) : 1.0f / std::sqrt(2.0f)});
          Val d = Op(div ? "Div" : "Mul", {y.name, c1.name}, DType::kFloat32, y.shape, false);
          Val e = Op("Erf", {d.name}, DType::kFloat32, y.shape, false);
          Val a = Op("Add", {e.name, WeightOf({}, {1.0f}).name}, DType::kFloat32, y.shape, false);
          Val m = Op("Mul", {y.name, a.name}, DType::kFloat32, y.shape, false);
          y = Op("Mul", {m.name, WeightOf({}, {0.5f}).name}, DType::kFloat32, y.shape, false);
          break;
        }
        case 4:
          y = Op(Pick<const char*>({"Relu", "Sigmoid", "Tanh", "HardSwish", "LeakyRelu"}), {y.name},
                 DType::kFloat32, y.shape, false);
          break;
        case 5:
          y = Op("Mul", {y.name, Weight({}).name}, DType::kFloat32, y.shape, false);
          break;
        case 6:
          y = Op("Clip", {y.name, WeightOf({}, {0.0f}).name, WeightOf({}, {6.0f}).name},
                 DType::kFloat32, y.shape, false);
          break;
        case 7: {  // Sub / Div by a per-column or per-channel operand
          Val b = Operand(y.shape);
          y = Op("Sub", {y.name, b.name}, DType::kFloat32, y.shape, false);
          break;
        }
        case 8: {  // residual: same shape, computed or input
          Val r = Operand(y.shape, true);
          if (r.shape != y.shape) r = Input(y.shape);
          y = Op("Add", {y.name, r.name}, DType::kFloat32, y.shape, false);
          break;
        }
        default: {  // BatchNormalization after a convolution
          const int64_t c = y.shape[1];
          Val sc = Weight({c}, 0.5f, 1.5f), bi = Weight({c}), mu = Weight({c}),
              var = Weight({c}, 0.2f, 2.0f);
          y = Op("BatchNormalization", {y.name, sc.name, bi.name, mu.name, var.name},
                 DType::kFloat32, y.shape, false);
          break;
        }
      }
    }
    return y;
  }

  bool GemmMove() {
    const Val* xp = PickFloat([](const Val& v) { return v.shape.size() >= 2; });
    if (!xp) return false;
    const Val x = AsMatrix(*xp);
    const int64_t M = x.shape[0], K = x.shape[1];
    const int64_t N = Pick<int64_t>({1, 4, 8, 16, 24, 64});
    const bool trans_b = Chance(0.5), trans_a = Chance(0.15);
    std::string a = x.name;
    if (trans_a) {
      a = Op("Transpose", {x.name}, DType::kFloat32, {K, M}, x.exact).name;
    }
    Val w = Chance(0.85) ? ProductWeight(trans_b ? Shape{N, K} : Shape{K, N}, K)
                         : Input(trans_b ? Shape{N, K} : Shape{K, N});
    std::vector<std::string> ins = {a, w.name};
    const int c_form = Int(0, 5);
    if (c_form == 1) ins.push_back(Weight({N}).name);
    if (c_form == 2) ins.push_back(Weight({1, N}).name);
    if (c_form == 3) ins.push_back(Operand({M, N}, true).name);
    if (c_form == 4) ins.push_back(Weight({}).name);
    const float alpha = Chance(0.8) ? 1.0f : Pick({0.5f, 2.0f});
    const float beta = Chance(0.8) ? 1.0f : Pick({0.5f, 2.0f, 0.0f});
    Val y = Op("Gemm", ins, DType::kFloat32, {M, N}, false, [&](onnx::NodeProto& n) {
      if (trans_a) AttrI(n, "transA", 1);
      if (trans_b) AttrI(n, "transB", 1);
      if (alpha != 1.0f) AttrF(n, "alpha", alpha);
      if (beta != 1.0f && ins.size() > 2) AttrF(n, "beta", beta);
    });
    Epilogue(y, false);
    return true;
  }

  bool MatMulMove() {
    const Val* xp = PickFloat([](const Val& v) { return v.shape.size() >= 2; });
    if (!xp) return false;
    const Val x = *xp;
    const int64_t K = x.shape.back();
    const int64_t N = Pick<int64_t>({1, 3, 8, 16, 32});
    Shape out = x.shape;
    out.back() = N;
    Val w;
    const int form = Int(0, 4);
    if (form <= 2) {
      w = Chance(0.2) ? Input({K, N}) : ProductWeight({K, N}, K);
    } else {
      // A batched right-hand side: runtime or weight, same batch dims or broadcast ones.
      Shape ws = x.shape;
      ws[ws.size() - 2] = K;
      ws.back() = N;
      if (form == 4 && ws.size() >= 3) ws[0] = 1;
      w = Chance(0.5) ? Input(ws) : ProductWeight(ws, K);
      for (size_t d = 0; d + 2 < out.size(); ++d) out[d] = std::max(out[d], ws[d]);
    }
    Val y = Op("MatMul", {x.name, w.name}, DType::kFloat32, out, false);
    Epilogue(y, false);
    return true;
  }

  // A window's output extent; 0 when the dilated kernel does not fit the padded input.
  static int64_t ConvOut(int64_t in, int64_t k, int64_t s, int64_t p0, int64_t p1, int64_t d) {
    const int64_t span = in + p0 + p1 - d * (k - 1) - 1;
    return span < 0 ? 0 : span / s + 1;
  }

  Val Conv(const Val& x, int64_t co, int64_t k, int64_t s, int64_t pad, int64_t dil, int64_t group,
           bool bias) {
    const int64_t c = x.shape[1];
    Val w = ProductWeight({co, c / group, k, k}, c / group * k * k);
    std::vector<std::string> ins = {x.name, w.name};
    if (bias) ins.push_back(Weight({co}).name);
    const Shape out = {x.shape[0], co, ConvOut(x.shape[2], k, s, pad, pad, dil),
                       ConvOut(x.shape[3], k, s, pad, pad, dil)};
    return Op("Conv", ins, DType::kFloat32, out, false, [&](onnx::NodeProto& n) {
      AttrInts(n, "kernel_shape", {k, k});
      if (s != 1 || Chance(0.3)) AttrInts(n, "strides", {s, s});
      if (pad != 0 || Chance(0.3)) AttrInts(n, "pads", {pad, pad, pad, pad});
      if (dil != 1) AttrInts(n, "dilations", {dil, dil});
      if (group != 1) AttrI(n, "group", group);
    });
  }

  bool ConvMove() {
    const Val* xp = PickFloat(
        [](const Val& v) { return v.shape.size() == 4 && v.shape[2] >= 3 && v.shape[3] >= 3; });
    if (!xp) return false;
    const Val x = *xp;
    const int64_t c = x.shape[1];
    const int64_t k = Pick<int64_t>({1, 3, 3, 3, 5});
    const int64_t s = Pick<int64_t>({1, 1, 2});
    const int64_t dil = Chance(0.1) ? 2 : 1;
    const int64_t pad = Chance(0.8) ? dil * (k / 2) : 0;
    if (ConvOut(x.shape[2], k, s, pad, pad, dil) < 1 ||
        ConvOut(x.shape[3], k, s, pad, pad, dil) < 1) {
      return false;
    }
    const bool depthwise = c > 1 && Chance(0.25);
    const int64_t co = depthwise ? c * Pick<int64_t>({1, 1, 2}) : Pick<int64_t>({c, 4, 8, 16});
    Val y = Conv(x, co, k, s, pad, dil, depthwise ? c : 1, Chance(0.7));
    Epilogue(y, true);
    return true;
  }

  // Convolutions big enough for the layout planner's channels-last and Winograd choices.
  bool BigConvMove() {
    const int64_t h = Pick<int64_t>({14, 16}), w = Pick<int64_t>({14, 16});
    Val x = Input({1, 16, h, w});
    Val y = Conv(x, 64, 3, 1, 1, 1, 1, true);
    y = Epilogue(y, true);
    y = Conv(y, 64, 3, 1, 1, 1, 1, Chance(0.5));
    Epilogue(y, true);
    return true;
  }

  std::function<void(onnx::NodeProto&)> Axes(const std::vector<int64_t>& axes,
                                             std::vector<std::string>* ins, bool input_form) {
    if (input_form) {
      ins->push_back(Ints(axes));
      return nullptr;
    }
    return [axes](onnx::NodeProto& n) { AttrInts(n, "axes", axes); };
  }

  // ReduceMean etc. over `axes` with keepdims.
  Val Reduce(const std::string& op, const Val& x, std::vector<int64_t> axes, bool keep,
             bool exact) {
    const int64_t r = static_cast<int64_t>(x.shape.size());
    Shape out;
    std::vector<bool> red(static_cast<size_t>(r), false);
    for (int64_t a : axes) red[static_cast<size_t>(a < 0 ? a + r : a)] = true;
    for (int64_t d = 0; d < r; ++d) {
      if (!red[static_cast<size_t>(d)]) {
        out.push_back(x.shape[static_cast<size_t>(d)]);
      } else if (keep) {
        out.push_back(1);
      }
    }
    std::vector<std::string> ins = {x.name};
    const bool input_form = o_.opset >= 18 || (op == "ReduceSum" && o_.opset >= 13);
    auto axes_attr = Axes(axes, &ins, input_form);
    return Op(op, ins, DType::kFloat32, out, exact, [&](onnx::NodeProto& n) {
      if (axes_attr) axes_attr(n);
      if (!keep) AttrI(n, "keepdims", 0);
    });
  }

  bool NormMove() {
    const Val* xp = PickFloat([](const Val& v) { return v.shape.size() >= 2; });
    if (!xp) return false;
    const Val x = *xp;
    const int64_t last = x.shape.back();
    const int kind = Int(0, 4);
    if (kind == 0 && o_.opset >= 17) {
      Val sc = Weight({last}, 0.5f, 1.5f), bi = Weight({last});
      std::vector<std::string> ins = {x.name, sc.name};
      if (Chance(0.7)) ins.push_back(bi.name);
      Val y =
          Op("LayerNormalization", ins, DType::kFloat32, x.shape, false, [&](onnx::NodeProto& n) {
            if (Chance(0.5)) AttrF(n, "epsilon", 1e-5f);
          });
      Epilogue(y, false);
      return true;
    }
    if (kind <= 1) {  // LayerNorm as exports before opset 17 write it
      Val m = Reduce("ReduceMean", x, {-1}, true, false);
      Val d = Op("Sub", {x.name, m.name}, DType::kFloat32, x.shape, false);
      Val sq = Op("Pow", {d.name, WeightOf({}, {2.0f}).name}, DType::kFloat32, x.shape, false);
      Val v = Reduce("ReduceMean", sq, {-1}, true, false);
      Val e = Op("Add", {v.name, WeightOf({}, {1e-5f}).name}, DType::kFloat32, v.shape, false);
      Val s = Op("Sqrt", {e.name}, DType::kFloat32, v.shape, false);
      Val y = Op("Div", {d.name, s.name}, DType::kFloat32, x.shape, false);
      y = Op("Mul", {y.name, Weight({last}, 0.5f, 1.5f).name}, DType::kFloat32, x.shape, false);
      y = Op("Add", {y.name, Weight({last}).name}, DType::kFloat32, x.shape, false);
      Epilogue(y, false);
      return true;
    }
    if (kind == 2 && x.shape.size() >= 3) {
      const int64_t c = x.shape[1];
      Val y = Op("InstanceNormalization", {x.name, Weight({c}, 0.5f, 1.5f).name, Weight({c}).name},
                 DType::kFloat32, x.shape, false);
      Epilogue(y, x.shape.size() == 4);
      return true;
    }
    if (kind == 3 && x.shape.size() == 4) {  // GroupNorm as exporters write it
      const int64_t c = x.shape[1];
      std::vector<int64_t> gs;
      for (int64_t g = 1; g <= c; ++g) {
        if (c % g == 0) gs.push_back(g);
      }
      const int64_t g = PickOf(gs);
      Val r = Op("Reshape", {x.name, Ints({x.shape[0], g, -1})}, DType::kFloat32,
                 {x.shape[0], g, NumElements(x.shape) / x.shape[0] / g}, x.exact);
      Val in = Op("InstanceNormalization",
                  {r.name, WeightOf({g}, std::vector<float>(static_cast<size_t>(g), 1.0f)).name,
                   WeightOf({g}, std::vector<float>(static_cast<size_t>(g), 0.0f)).name},
                  DType::kFloat32, r.shape, false,
                  [](onnx::NodeProto& n) { AttrF(n, "epsilon", 1e-5f); });
      Val y = Op("Reshape", {in.name, Ints(x.shape)}, DType::kFloat32, x.shape, false);
      y = Op("Mul", {y.name, Weight({c, 1, 1}, 0.5f, 1.5f).name}, DType::kFloat32, x.shape, false);
      y = Op("Add", {y.name, Weight({c, 1, 1}).name}, DType::kFloat32, x.shape, false);
      Epilogue(y, true);
      return true;
    }
    // BatchNormalization over [B, C, ...].
    const int64_t c = x.shape[1];
    Val y = Op("BatchNormalization",
               {x.name, Weight({c}, 0.5f, 1.5f).name, Weight({c}).name, Weight({c}).name,
                Weight({c}, 0.2f, 2.0f).name},
               DType::kFloat32, x.shape, false);
    Epilogue(y, x.shape.size() == 4);
    return true;
  }

  bool AttentionMove() {
    const Val* xp = PickFloat([](const Val& v) { return v.shape.size() == 3; });
    Val x;
    if (xp) {
      x = *xp;
    } else {
      x = Input({batch_, Pick<int64_t>({3, 5, 8}), Pick<int64_t>({8, 16})});
    }
    const int64_t B = x.shape[0], T = x.shape[1], D = x.shape[2];
    const int64_t H = D % 2 == 0 && Chance(0.5) ? 2 : 1, dh = D / H;
    auto proj = [&](bool bias) {
      Val p =
          Op("MatMul", {x.name, ProductWeight({D, D}, D).name}, DType::kFloat32, {B, T, D}, false);
      if (bias) p = Op("Add", {p.name, Weight({D}).name}, DType::kFloat32, {B, T, D}, false);
      return p;
    };
    const bool bias = Chance(0.5);
    Val q = proj(bias), k = proj(bias), v = proj(bias);
    auto heads = [&](const Val& t, std::vector<int64_t> perm, Shape out) {
      Val r = Op("Reshape", {t.name, Ints({B, T, H, dh})}, DType::kFloat32, {B, T, H, dh}, false);
      return Op("Transpose", {r.name}, DType::kFloat32, out, false,
                [perm](onnx::NodeProto& n) { AttrInts(n, "perm", perm); });
    };
    Val qh = heads(q, {0, 2, 1, 3}, {B, H, T, dh});
    Val kt = heads(k, {0, 2, 3, 1}, {B, H, dh, T});
    Val vh = heads(v, {0, 2, 1, 3}, {B, H, T, dh});
    Val s = Op("MatMul", {qh.name, kt.name}, DType::kFloat32, {B, H, T, T}, false);
    const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
    s = Chance(0.5)
            ? Op("Mul", {s.name, WeightOf({}, {scale}).name}, DType::kFloat32, s.shape, false)
            : Op("Div", {s.name, WeightOf({}, {1.0f / scale}).name}, DType::kFloat32, s.shape,
                 false);
    const int mask = Int(0, 3);
    if (mask == 1) {  // causal, as a weight with -inf above the diagonal
      std::vector<float> m(static_cast<size_t>(T * T), 0.0f);
      for (int64_t i = 0; i < T; ++i) {
        for (int64_t j = i + 1; j < T; ++j) {
          m[static_cast<size_t>(i * T + j)] =
              Chance(0.5) ? -1e9f : -std::numeric_limits<float>::infinity();
        }
      }
      s = Op("Add", {s.name, WeightOf({T, T}, m).name}, DType::kFloat32, s.shape, false);
    } else if (mask == 2) {  // padding, a runtime [B, 1, 1, T]
      Val pad = Input({B, 1, 1, T});
      Val neg = Op("Mul",
                   {Op("Relu", {pad.name}, DType::kFloat32, pad.shape, true).name,
                    WeightOf({}, {-10000.0f}).name},
                   DType::kFloat32, pad.shape, false);
      s = Op("Add", {s.name, neg.name}, DType::kFloat32, s.shape, false);
    }
    Val p = Op("Softmax", {s.name}, DType::kFloat32, s.shape, false, [&](onnx::NodeProto& n) {
      if (o_.opset < 13 || Chance(0.5)) AttrI(n, "axis", -1);
    });
    Val o = Op("MatMul", {p.name, vh.name}, DType::kFloat32, {B, H, T, dh}, false);
    Val m =
        Op("Transpose", {o.name}, DType::kFloat32, {B, T, H, dh}, false, [](onnx::NodeProto& n) {
          AttrInts(n, "perm", {0, 2, 1, 3});
        });
    Val y = Op("Reshape", {m.name, Ints({B, T, D})}, DType::kFloat32, {B, T, D}, false);
    y = Op("MatMul", {y.name, ProductWeight({D, D}, D).name}, DType::kFloat32, {B, T, D}, false);
    Epilogue(y, false);
    return true;
  }

  bool SoftmaxMove() {
    const Val* xp = PickFloat();
    if (!xp) return false;
    const Val x = *xp;
    const int64_t r = static_cast<int64_t>(x.shape.size());
    const int64_t axis = Chance(0.6) ? -1 : I64(-r, r - 1);
    const std::string op = Pick<const char*>({"Softmax", "Softmax", "LogSoftmax"});
    Op(op, {x.name}, DType::kFloat32, x.shape, false,
       [&](onnx::NodeProto& n) { AttrI(n, "axis", axis); });
    return true;
  }

  bool ReduceMove() {
    const Val* xp = PickFloat();
    if (!xp) return false;
    const Val x = *xp;
    const int64_t r = static_cast<int64_t>(x.shape.size());
    if (Chance(0.2) && x.exact) {  // ArgMax / ArgMin on exact values (ties pick the first)
      const int64_t axis = I64(0, r - 1);
      const bool keep = Chance(0.5);
      Shape out = x.shape;
      if (keep) {
        out[static_cast<size_t>(axis)] = 1;
      } else {
        out.erase(out.begin() + axis);
      }
      Val i = Op(Chance(0.5) ? "ArgMax" : "ArgMin", {x.name}, DType::kInt64, out, true,
                 [&](onnx::NodeProto& n) {
                   AttrI(n, "axis", axis);
                   if (!keep) AttrI(n, "keepdims", 0);
                 });
      Op("Cast", {i.name}, DType::kFloat32, out, true,
         [](onnx::NodeProto& n) { AttrI(n, "to", TensorProto::FLOAT); });
      return true;
    }
    std::vector<int64_t> axes;
    const int form = Int(0, 2);
    if (form == 0) {
      axes = {-1};
    } else if (form == 1) {
      const int64_t a = I64(0, r - 1);
      axes = {a};
      if (a + 1 < r && Chance(0.5)) axes.push_back(a + 1);
    } else {
      for (int64_t d = 0; d < r; ++d) {
        if (Chance(0.5)) axes.push_back(d);
      }
      if (axes.empty()) axes.push_back(0);
    }
    const std::string op =
        Pick<const char*>({"ReduceMean", "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin",
                           "ReduceL2", "ReduceLogSumExp", "ReduceSumSquare", "ReduceProd"});
    const bool selects = op == "ReduceMax" || op == "ReduceMin";
    Reduce(op, x, axes, Chance(0.6), selects && x.exact);
    return true;
  }

  bool LayoutMove() {
    const Val* xp = PickFloat();
    if (!xp) return false;
    const Val x = *xp;
    const Shape& s = x.shape;
    const int64_t r = static_cast<int64_t>(s.size());
    switch (Int(0, 11)) {
      case 0: {  // Transpose (without perm it reverses the dims)
        std::vector<int64_t> perm(static_cast<size_t>(r));
        std::iota(perm.begin(), perm.end(), 0);
        const bool given = Chance(0.9);
        if (given) {
          std::shuffle(perm.begin(), perm.end(), rng_);
        } else {
          std::reverse(perm.begin(), perm.end());
        }
        Shape out;
        for (int64_t p : perm) out.push_back(s[static_cast<size_t>(p)]);
        Op("Transpose", {x.name}, DType::kFloat32, out, x.exact, [&](onnx::NodeProto& n) {
          if (given) AttrInts(n, "perm", perm);
        });
        return true;
      }
      case 1: {  // Reshape: merge two adjacent dims, or split one, with 0 and -1 entries
        Shape out = s;
        if (r >= 2 && Chance(0.5)) {
          const int64_t a = I64(0, r - 2);
          out[static_cast<size_t>(a)] *= out[static_cast<size_t>(a + 1)];
          out.erase(out.begin() + a + 1);
        } else {
          const int64_t a = I64(0, r - 1);
          const int64_t d = out[static_cast<size_t>(a)];
          int64_t f = 1;
          for (int64_t c : {2, 3, 4}) {
            if (d % c == 0 && d > c) f = c;
          }
          if (f == 1) return false;
          out[static_cast<size_t>(a)] = d / f;
          out.insert(out.begin() + a + 1, f);
        }
        std::vector<int64_t> spec(out.begin(), out.end());
        if (Chance(0.4))
          spec[static_cast<size_t>(I64(0, static_cast<int64_t>(spec.size()) - 1))] = -1;
        if (Chance(0.3) && spec.size() <= s.size() && spec[0] == s[0]) spec[0] = 0;
        Op("Reshape", {x.name, Ints(spec)}, DType::kFloat32, out, x.exact);
        return true;
      }
      case 2: {  // Flatten
        const int64_t axis = I64(0, r);
        int64_t outer = 1;
        for (int64_t d = 0; d < axis; ++d) outer *= s[static_cast<size_t>(d)];
        Op("Flatten", {x.name}, DType::kFloat32, {outer, NumElements(s) / outer}, x.exact,
           [&](onnx::NodeProto& n) { AttrI(n, "axis", axis); });
        return true;
      }
      case 3: {  // Unsqueeze, then perhaps Squeeze it back
        const int64_t a = I64(0, r);
        Shape out = s;
        out.insert(out.begin() + a, 1);
        std::vector<std::string> ins = {x.name};
        auto at = Axes({a}, &ins, o_.opset >= 13);
        Val u = Op("Unsqueeze", ins, DType::kFloat32, out, x.exact, at);
        if (Chance(0.6)) {
          std::vector<std::string> sq = {u.name};
          auto at2 = Axes({a - static_cast<int64_t>(out.size())}, &sq, o_.opset >= 13);
          Op("Squeeze", sq, DType::kFloat32, s, x.exact, at2);
        }
        return true;
      }
      case 4: {  // Slice with structural bounds (negative, steps of 2 and -1)
        std::vector<int64_t> starts, ends, axes, steps;
        Shape out = s;
        for (int64_t d = 0; d < r; ++d) {
          const int64_t dim = s[static_cast<size_t>(d)];
          if (dim < 2 || Chance(0.5)) continue;
          const int64_t step = Chance(0.7) ? 1 : Pick<int64_t>({2, -1});
          int64_t b, e;
          if (step > 0) {
            b = I64(0, dim - 1);
            e = I64(b + 1, dim);
            out[static_cast<size_t>(d)] = (e - b + step - 1) / step;
            if (Chance(0.3)) b -= dim;  // the same start, negative
            if (e == dim && Chance(0.3)) e = std::numeric_limits<int64_t>::max();
          } else {
            b = I64(1, dim - 1);
            e = I64(-1, b - 1);
            out[static_cast<size_t>(d)] = b - e;
            if (e == -1) e = -dim - 1;  // past the front: through index 0
          }
          starts.push_back(b);
          ends.push_back(e);
          axes.push_back(Chance(0.3) ? d - r : d);
          steps.push_back(step);
        }
        if (axes.empty()) return false;
        std::vector<std::string> ins = {x.name, Ints(starts), Ints(ends), Ints(axes)};
        bool unit = true;
        for (int64_t st : steps) unit = unit && st == 1;
        if (!unit || Chance(0.5)) ins.push_back(Ints(steps));
        Op("Slice", ins, DType::kFloat32, out, x.exact);
        return true;
      }
      case 5: {  // Concat with a partner of the same shape but the axis
        const int64_t axis = I64(0, r - 1);
        Shape ps = s;
        ps[static_cast<size_t>(axis)] = Pick<int64_t>({1, 2, s[static_cast<size_t>(axis)]});
        const Val* pp = PickFloat([&](const Val& v) { return v.shape == ps && v.name != x.name; });
        Val p = pp ? *pp : (Chance(0.5) ? Weight(ps) : Input(ps));
        Shape out = s;
        out[static_cast<size_t>(axis)] += ps[static_cast<size_t>(axis)];
        std::vector<std::string> ins = {x.name, p.name};
        if (Chance(0.5)) std::swap(ins[0], ins[1]);
        Op("Concat", ins, DType::kFloat32, out, x.exact && p.exact,
           [&](onnx::NodeProto& n) { AttrI(n, "axis", Chance(0.3) ? axis - r : axis); });
        return true;
      }
      case 6: {  // Split into pieces, every piece pooled
        std::vector<int64_t> axes_ok;
        for (int64_t d = 0; d < r; ++d) {
          if (s[static_cast<size_t>(d)] >= 2) axes_ok.push_back(d);
        }
        if (axes_ok.empty()) return false;
        const int64_t axis = PickOf(axes_ok);
        const int64_t dim = s[static_cast<size_t>(axis)];
        const int64_t first = I64(1, dim - 1);
        std::vector<int64_t> sizes = {first, dim - first};
        std::vector<std::string> outs = {Fresh("v"), Fresh("v")};
        std::vector<std::string> ins = {x.name};
        const bool equal = dim % 2 == 0 && Chance(0.3);
        if (equal) sizes = {dim / 2, dim / 2};
        if (!equal && o_.opset >= 13) ins.push_back(Ints(sizes));
        auto& n = Node("Split", ins, outs);
        AttrI(n, "axis", axis);
        if (equal && o_.opset >= 18) AttrI(n, "num_outputs", 2);
        if (!equal && o_.opset < 13) AttrInts(n, "split", sizes);
        for (size_t i = 0; i < 2; ++i) {
          Shape ps = s;
          ps[static_cast<size_t>(axis)] = sizes[i];
          Def(outs[i], DType::kFloat32, ps, x.exact);
        }
        return true;
      }
      case 7: {  // Gather of structural indices (a scalar drops the axis)
        const int64_t axis = I64(0, r - 1);
        const int64_t dim = s[static_cast<size_t>(axis)];
        Shape out;
        std::string idx;
        if (Chance(0.5)) {
          idx = Ints({I64(-dim, dim - 1)}, true);
          out = s;
          out.erase(out.begin() + axis);
          if (out.empty()) return false;
        } else {
          std::vector<int64_t> v(static_cast<size_t>(Int(1, 4)));
          for (auto& e : v) e = I64(-dim, dim - 1);
          idx = Ints(v);
          out = s;
          out[static_cast<size_t>(axis)] = static_cast<int64_t>(v.size());
        }
        Op("Gather", {x.name, idx}, DType::kFloat32, out, x.exact,
           [&](onnx::NodeProto& n) { AttrI(n, "axis", axis); });
        return true;
      }
      case 8: {  // Expand a dim of 1 (or a new leading dim)
        Shape out = s;
        bool grew = false;
        for (auto& d : out) {
          if (d == 1 && Chance(0.7)) {
            d = Pick<int64_t>({2, 3});
            grew = true;
          }
        }
        if (!grew) out.insert(out.begin(), 2);
        Op("Expand", {x.name, Ints(out)}, DType::kFloat32, out, x.exact);
        return true;
      }
      case 9: {  // Tile
        std::vector<int64_t> rep(static_cast<size_t>(r), 1);
        rep[static_cast<size_t>(I64(0, r - 1))] = 2;
        Shape out = s;
        for (size_t d = 0; d < out.size(); ++d) out[d] *= rep[d];
        if (NumElements(out) > 40000) return false;
        Op("Tile", {x.name, Ints(rep)}, DType::kFloat32, out, x.exact);
        return true;
      }
      case 10: {  // Pad: constant, reflect, edge
        const std::string mode = Pick<const char*>({"constant", "constant", "reflect", "edge"});
        std::vector<int64_t> pads(static_cast<size_t>(2 * r), 0);
        Shape out = s;
        for (int64_t d = 0; d < r; ++d) {
          if (Chance(0.5)) continue;
          const int64_t dim = s[static_cast<size_t>(d)];
          const int64_t lim = mode == "reflect" ? std::min<int64_t>(2, dim - 1) : 2;
          if (lim < 1) continue;
          pads[static_cast<size_t>(d)] = I64(0, lim);
          pads[static_cast<size_t>(d + r)] = I64(0, lim);
          out[static_cast<size_t>(d)] +=
              pads[static_cast<size_t>(d)] + pads[static_cast<size_t>(d + r)];
        }
        std::vector<std::string> ins = {x.name, Ints(pads)};
        if (mode == "constant" && Chance(0.5)) ins.push_back(Weight({}).name);
        Op("Pad", ins, DType::kFloat32, out, x.exact && ins.size() == 2, [&](onnx::NodeProto& n) {
          if (mode != "constant" || Chance(0.5)) AttrS(n, "mode", mode);
        });
        return true;
      }
      default: {  // DepthToSpace / SpaceToDepth
        if (r != 4) return false;
        if (Chance(0.5) && s[1] % 4 == 0) {
          Op("DepthToSpace", {x.name}, DType::kFloat32, {s[0], s[1] / 4, s[2] * 2, s[3] * 2},
             x.exact, [&](onnx::NodeProto& n) {
               AttrI(n, "blocksize", 2);
               if (Chance(0.5)) AttrS(n, "mode", Pick<const char*>({"DCR", "CRD"}));
             });
          return true;
        }
        if (s[2] % 2 != 0 || s[3] % 2 != 0) return false;
        Op("SpaceToDepth", {x.name}, DType::kFloat32, {s[0], s[1] * 4, s[2] / 2, s[3] / 2}, x.exact,
           [](onnx::NodeProto& n) { AttrI(n, "blocksize", 2); });
        return true;
      }
    }
  }

  bool PoolMove() {
    const Val* xp = PickFloat(
        [](const Val& v) { return v.shape.size() == 4 && v.shape[2] >= 2 && v.shape[3] >= 2; });
    if (!xp) return false;
    const Val x = *xp;
    const int kind = Int(0, 4);
    if (kind >= 3) {
      const bool max = kind == 4;
      Op(max ? "GlobalMaxPool" : "GlobalAveragePool", {x.name}, DType::kFloat32,
         {x.shape[0], x.shape[1], 1, 1}, max && x.exact);
      return true;
    }
    const bool max = kind <= 1;
    const int64_t k = std::min<int64_t>(Pick<int64_t>({2, 3, 3}), std::min(x.shape[2], x.shape[3]));
    const int64_t s = Pick<int64_t>({1, 2, 2});
    const int64_t p = k >= 2 && Chance(0.5) ? k / 2 : 0;
    const bool ceil = Chance(0.2);
    auto out_dim = [&](int64_t in) {
      const int64_t num = in + 2 * p - k;
      int64_t o = (ceil ? (num + s - 1) / s : num / s) + 1;
      // ceil_mode drops a last window that would start inside the end padding.
      if (ceil && (o - 1) * s >= in + p) --o;
      return o;
    };
    const Shape out = {x.shape[0], x.shape[1], out_dim(x.shape[2]), out_dim(x.shape[3])};
    if (out[2] < 1 || out[3] < 1) return false;
    Val y = Op(max ? "MaxPool" : "AveragePool", {x.name}, DType::kFloat32, out, max && x.exact,
               [&](onnx::NodeProto& n) {
                 AttrInts(n, "kernel_shape", {k, k});
                 if (s != 1 || Chance(0.3)) AttrInts(n, "strides", {s, s});
                 if (p != 0 || Chance(0.3)) AttrInts(n, "pads", {p, p, p, p});
                 if (ceil) AttrI(n, "ceil_mode", 1);
                 if (!max && Chance(0.5)) AttrI(n, "count_include_pad", 1);
               });
    // A detector's peak test: where the window maximum equals the value.
    if (max && k == 3 && s == 1 && p == 1 && x.exact && Chance(0.5)) {
      Val eq = Op("Equal", {y.name, x.name}, DType::kBool, x.shape, true);
      Val f = Op("Cast", {eq.name}, DType::kFloat32, x.shape, true,
                 [](onnx::NodeProto& n) { AttrI(n, "to", TensorProto::FLOAT); });
      Op("Mul", {f.name, x.name}, DType::kFloat32, x.shape, true);
    }
    return true;
  }

  bool ResizeMove() {
    const Val* xp = PickFloat([](const Val& v) { return v.shape.size() == 4; });
    if (!xp) return false;
    const Val x = *xp;
    const bool nearest = Chance(0.6);
    const int64_t f = Pick<int64_t>({2, 2, 3});
    const Shape out = {x.shape[0], x.shape[1], x.shape[2] * f, x.shape[3] * f};
    if (NumElements(out) > 40000) return false;
    std::vector<std::string> ins = {x.name, ""};
    if (Chance(0.7)) {
      ins.push_back(Floats({1.0f, 1.0f, static_cast<float>(f), static_cast<float>(f)}));
    } else {
      ins.push_back("");
      ins.push_back(Ints(out));
    }
    if (o_.opset < 13) {
      // Opset 11 requires roi and scales in place: an empty float tensor stands for "none".
      ins[1] = Floats({});
      if (ins[2].empty()) ins[2] = Floats({});
    }
    Op("Resize", ins, DType::kFloat32, out, nearest && x.exact, [&](onnx::NodeProto& n) {
      AttrS(n, "mode", nearest ? "nearest" : "linear");
      if (nearest) {
        if (Chance(0.5)) {
          AttrS(n, "nearest_mode",
                Pick<const char*>({"floor", "round_prefer_floor", "round_prefer_ceil", "ceil"}));
        }
        if (Chance(0.5)) AttrS(n, "coordinate_transformation_mode", "asymmetric");
      } else {
        AttrS(
            n, "coordinate_transformation_mode",
            Pick<const char*>({"half_pixel", "align_corners", "asymmetric", "pytorch_half_pixel"}));
      }
    });
    return true;
  }

  bool ShapeChainMove() {
    const Val* xp = PickFloat([](const Val& v) { return v.shape.size() >= 2; });
    if (!xp) return false;
    const Val x = *xp;
    // Reshape(x, Concat(Unsqueeze(Gather(Shape(x), 0)), [-1])): [B, ...] -> [B, rest].
    const std::string s = Fresh("v");
    Node("Shape", {x.name}, {s});
    const std::string g = Fresh("v");
    AttrI(Node("Gather", {s, Ints({0}, true)}, {g}), "axis", 0);
    const std::string u = Fresh("v");
    if (o_.opset >= 13) {
      Node("Unsqueeze", {g, Ints({0})}, {u});
    } else {
      AttrInts(Node("Unsqueeze", {g}, {u}), "axes", {0});
    }
    const std::string cat = Fresh("v");
    const bool keep_last = Chance(0.5) && x.shape.size() >= 3;
    std::vector<std::string> parts = {u, Ints({-1})};
    Shape out = {x.shape[0], NumElements(x.shape) / x.shape[0]};
    if (keep_last) {
      // ... or [B, -1, last] with last read from the shape too.
      const std::string l = Fresh("v");
      AttrI(Node("Gather", {s, Ints({-1})}, {l}), "axis", 0);
      parts.push_back(l);
      out = {x.shape[0], NumElements(x.shape) / x.shape[0] / x.shape.back(), x.shape.back()};
    }
    AttrI(Node("Concat", parts, {cat}), "axis", 0);
    Op("Reshape", {x.name, cat}, DType::kFloat32, out, x.exact);
    return true;
  }

  // ---- subgraphs -----------------------------------------------------------------------------

  // Writes a body in a new scope: `fill` appends nodes and returns the value the body yields.
  template <typename F>
  Val InScope(onnx::GraphProto* body, F fill) {
    onnx::GraphProto* saved = cur_;
    cur_ = body;
    scopes_.emplace_back();
    Val y = fill();
    scopes_.pop_back();
    cur_ = saved;
    return y;
  }

  // Shape-preserving steps on x inside a body: activations, broadcast arithmetic, a recurrent
  // op over a sequence (through Unsqueeze/Transpose/Squeeze chains), a normalization.
  Val BodySteps(Val x, int steps) {
    for (int s = 0; s < steps; ++s) {
      switch (Int(0, 5)) {
        case 0:
          x = Op(Pick<const char*>({"Tanh", "Sigmoid", "Relu", "Neg", "Abs"}), {x.name},
                 DType::kFloat32, x.shape, false);
          break;
        case 1:
        case 2: {
          Val y = Operand(x.shape);
          x = Op(Pick<const char*>({"Add", "Mul", "Sub", "Max"}), {x.name, y.name}, DType::kFloat32,
                 x.shape, false);
          break;
        }
        case 3:
          if (x.shape.size() >= 2) {
            x = Recurrent(x, /*keep_shape=*/true);
          }
          break;
        case 4: {  // an Unsqueeze/Reshape round trip
          std::vector<std::string> ins = {x.name};
          auto at = Axes({0}, &ins, o_.opset >= 13);
          Shape us = x.shape;
          us.insert(us.begin(), 1);
          Val u = Op("Unsqueeze", ins, DType::kFloat32, us, false, at);
          x = Op("Reshape", {u.name, Ints(x.shape)}, DType::kFloat32, x.shape, false);
          break;
        }
        default:
          x = Op("Softmax", {x.name}, DType::kFloat32, x.shape, false,
                 [](onnx::NodeProto& n) { AttrI(n, "axis", -1); });
          break;
      }
    }
    return x;
  }

  // An If whose condition is structural for the class (folded, then inlined) or computed at
  // run time (a host kernel runs the taken branch eagerly).
  bool IfMove(bool runtime) {
    const Val* xp = PickFloat();
    if (!xp) return false;
    const Val x = *xp;
    std::string cond;
    if (!runtime) {
      // Shape(x)[0] == B: true for this class, known after specialization.
      const std::string s = Fresh("v"), g = Fresh("v");
      Node("Shape", {x.name}, {s});
      AttrI(Node("Gather", {s, Ints({0}, true)}, {g}), "axis", 0);
      cond = Fresh("v");
      Node("Equal", {g, Ints({Chance(0.7) ? x.shape[0] : x.shape[0] + 1}, true)}, {cond});
    } else if (Chance(0.5)) {
      cond = Input({}, DType::kBool).name;
    } else {
      const Val* ep = PickExact();
      if (!ep) return false;
      const Val e = *ep;
      std::vector<int64_t> all(e.shape.size());
      std::iota(all.begin(), all.end(), 0);
      Val m = Reduce("ReduceMax", e, all, false, true);
      cond = Fresh("v");
      Node("Greater", {m.name, WeightOf({}, {0.0f}).name}, {cond});
    }
    const std::string out = Fresh("v");
    auto& n = Node("If", {cond}, {out});
    onnx::GraphProto* then_g = AttrG(n, "then_branch");
    onnx::GraphProto* else_g = AttrG(n, "else_branch");
    then_g->set_name(Fresh("then"));
    else_g->set_name(Fresh("else"));
    for (onnx::GraphProto* body : {then_g, else_g}) {
      Val y = InScope(body, [&] {
        Val r = BodySteps(x, Int(1, 3));
        if (!r.computed || r.name == x.name) {
          r = Op("Identity", {r.name}, DType::kFloat32, r.shape, false);
        }
        return r;
      });
      SetType(body->add_output(), y.name, DType::kFloat32, &x.shape);
    }
    Def(out, DType::kFloat32, x.shape, false);
    return true;
  }

  // The pattern of a voice detector's If on its sample rate: the taken branch runs at these
  // shapes, the other holds a recurrent op that cannot be typed for them (its input gains a
  // dim), as an exported 8 kHz front end given a 16 kHz frame. The condition is an input that
  // is true, so eager runs the good branch.
  bool IfUntypableBranchMove() {
    const Val* xp = PickFloat([](const Val& v) { return v.shape.size() == 3; });
    if (!xp) return false;
    const Val x = *xp;
    Val c = Input({}, DType::kBool);
    out_.inputs[c.name].data<uint8_t>()[0] = 1;
    const std::string out = Fresh("v");
    auto& n = Node("If", {c.name}, {out});
    onnx::GraphProto* then_g = AttrG(n, "then_branch");
    onnx::GraphProto* else_g = AttrG(n, "else_branch");
    then_g->set_name(Fresh("then"));
    else_g->set_name(Fresh("else"));
    Val good = InScope(then_g, [&] { return Recurrent(x, true); });
    SetType(then_g->add_output(), good.name, DType::kFloat32, &x.shape);
    Val bad = InScope(else_g, [&] {
      std::vector<std::string> ins = {x.name};
      auto at = Axes({0}, &ins, o_.opset >= 13);
      Shape us = x.shape;
      us.insert(us.begin(), 1);
      Val u = Op("Unsqueeze", ins, DType::kFloat32, us, false, at);
      // An LSTM over the rank-4 value: no type for these shapes (eager refuses it if taken).
      const int64_t f = x.shape.back(), h = f;
      const std::string y = Fresh("v");
      auto& l = Node("LSTM", {u.name, Weight({1, 4 * h, f}).name, Weight({1, 4 * h, h}).name}, {y});
      AttrI(l, "hidden_size", h);
      return Def(y, DType::kFloat32, x.shape, false);
    });
    SetType(else_g->add_output(), bad.name, DType::kFloat32, nullptr);
    Def(out, DType::kFloat32, x.shape, false);
    return true;
  }

  bool LoopMove() {
    const Val* xp = PickFloat([](const Val& v) { return NumElements(v.shape) <= 4096; });
    if (!xp) return false;
    const Val x = *xp;
    const int64_t trips = Int(1, 3);
    const bool scan = Chance(0.5);
    const std::string m = Ints({trips}, true);
    std::string cond_in;
    if (Chance(0.5)) {
      cond_in = "";
    } else {
      cond_in = Fresh("t");
      auto* t = top_->add_initializer();
      t->set_name(cond_in);
      t->set_data_type(TensorProto::BOOL);
      t->add_int32_data(1);
    }
    std::vector<std::string> outs = {Fresh("v")};
    if (scan) outs.push_back(Fresh("v"));
    auto& n = Node("Loop", {m, cond_in, x.name}, outs);
    onnx::GraphProto* body = AttrG(n, "body");
    body->set_name(Fresh("body"));
    const std::string iter = Fresh("i"), c_in = Fresh("c"), s_in = Fresh("s");
    const Shape scalar;
    SetType(body->add_input(), iter, DType::kInt64, &scalar);
    SetType(body->add_input(), c_in, DType::kBool, &scalar);
    SetType(body->add_input(), s_in, DType::kFloat32, &x.shape);
    std::string c_out, y_name;
    InScope(body, [&] {
      Val s{s_in, DType::kFloat32, x.shape, false, true};
      Push(s);
      Val y = BodySteps(s, Int(1, 3));
      if (y.name == s_in) y = Op("Identity", {y.name}, DType::kFloat32, y.shape, false);
      // The iteration number flows in too: s + i (as float).
      if (Chance(0.3)) {
        Val fi = Op("Cast", {iter}, DType::kFloat32, {}, false,
                    [](onnx::NodeProto& nn) { AttrI(nn, "to", TensorProto::FLOAT); });
        y = Op("Add", {y.name, fi.name}, DType::kFloat32, y.shape, false);
      }
      c_out = Fresh("c");
      Node("Identity", {c_in}, {c_out});
      y_name = y.name;
      return y;
    });
    SetType(body->add_output(), c_out, DType::kBool, &scalar);
    SetType(body->add_output(), y_name, DType::kFloat32, &x.shape);
    if (scan) {
      const std::string sc = Fresh("v");
      InScope(body, [&] {
        Node("Identity", {y_name}, {sc});
        return Val{};
      });
      SetType(body->add_output(), sc, DType::kFloat32, &x.shape);
    }
    Def(outs[0], DType::kFloat32, x.shape, false);
    if (scan) {
      Shape st = x.shape;
      st.insert(st.begin(), trips);
      Def(outs[1], DType::kFloat32, st, false);
    }
    return true;
  }

  // LSTM / GRU / RNN over x as a sequence. With keep_shape the result has x's shape (hidden size
  // = last dim, one direction); else [B, T, dirs * H] is pooled too. x: [B, T, F] (or rank 2,
  // [T, F] read as one batch).
  Val Recurrent(const Val& x0, bool keep_shape) {
    Val x = x0;
    bool unbatched = false;
    if (x.shape.size() == 2) {  // [T, F] -> [1, T, F]
      std::vector<std::string> ins = {x.name};
      auto at = Axes({0}, &ins, o_.opset >= 13);
      x = Op("Unsqueeze", ins, DType::kFloat32, {1, x.shape[0], x.shape[1]}, false, at);
      unbatched = true;
    } else if (x.shape.size() > 3) {
      const int64_t last = x.shape.back();
      x = Op("Reshape", {x.name, Ints({x.shape[0], -1, last})}, DType::kFloat32,
             {x.shape[0], NumElements(x.shape) / x.shape[0] / last, last}, false);
    }
    const int64_t B = x.shape[0], T = x.shape[1], F = x.shape[2];
    const std::string op = Pick<const char*>({"LSTM", "LSTM", "GRU", "RNN"});
    const int gates = op == "LSTM" ? 4 : op == "GRU" ? 3 : 1;
    const int64_t H = keep_shape ? F : Pick<int64_t>({4, 8, 12});
    const std::string dir =
        keep_shape ? "forward"
                   : Pick<const char*>({"forward", "forward", "reverse", "bidirectional"});
    const int64_t dirs = dir == "bidirectional" ? 2 : 1;
    Val xt = Op("Transpose", {x.name}, DType::kFloat32, {T, B, F}, false, [](onnx::NodeProto& n) {
      AttrInts(n, "perm", {1, 0, 2});
    });
    const float s = 1.0f / std::sqrt(static_cast<float>(H));
    std::vector<std::string> ins = {xt.name, Weight({dirs, gates * H, F}, -s, s).name,
                                    Weight({dirs, gates * H, H}, -s, s).name};
    if (Chance(0.7)) ins.push_back(Weight({dirs, 2 * gates * H}, -s, s).name);
    if (Chance(0.4)) {
      while (ins.size() < 4) ins.push_back("");
      ins.push_back("");  // sequence_lens
      ins.push_back((Chance(0.5) ? Input({dirs, B, H}) : Weight({dirs, B, H})).name);
      if (op == "LSTM" && Chance(0.5)) ins.push_back(Input({dirs, B, H}).name);
    }
    const std::string y = Fresh("v"), yh = Fresh("v");
    auto& n = Node(op, ins, {y, yh});
    AttrI(n, "hidden_size", H);
    if (dir != "forward" || Chance(0.3)) AttrS(n, "direction", dir);
    if (op == "GRU" && Chance(0.5)) AttrI(n, "linear_before_reset", 1);
    Def(y, DType::kFloat32, {T, dirs, B, H}, false);
    Def(yh, DType::kFloat32, {dirs, B, H}, false);
    // [T, dirs, B, H] -> [B, T, dirs, H] -> [B, T, dirs * H]
    Val yb = Op("Transpose", {y}, DType::kFloat32, {B, T, dirs, H}, false, [](onnx::NodeProto& nn) {
      AttrInts(nn, "perm", {2, 0, 1, 3});
    });
    Val r =
        Op("Reshape", {yb.name, Ints({B, T, dirs * H})}, DType::kFloat32, {B, T, dirs * H}, false);
    if (keep_shape) {
      if (unbatched) {
        r = Op("Reshape", {r.name, Ints(x0.shape)}, DType::kFloat32, x0.shape, false);
      } else if (x0.shape.size() > 3) {
        r = Op("Reshape", {r.name, Ints(x0.shape)}, DType::kFloat32, x0.shape, false);
      }
    }
    return r;
  }

  bool RecurrentMove() {
    const Val* xp = PickFloat([](const Val& v) {
      return (v.shape.size() == 3 || v.shape.size() == 2) && v.shape.back() <= 32 &&
             NumElements(v.shape) <= 2048;
    });
    if (!xp) return false;
    const Val x = *xp;
    Recurrent(x, Chance(0.3));
    return true;
  }

  // Ops that run as reference kernels in a cell: the same code on both sides, but their
  // operands and outputs still cross the compiled buffers and layouts.
  bool OtherMove() {
    const Val* xp = PickFloat();
    if (!xp) return false;
    const Val x = *xp;
    const int64_t r = static_cast<int64_t>(x.shape.size());
    switch (Int(0, 5)) {
      case 0: {
        const int64_t axis = I64(0, r - 1);
        Op("CumSum", {x.name, Ints({axis}, true)}, DType::kFloat32, x.shape, false,
           [&](onnx::NodeProto& n) {
             if (Chance(0.3)) AttrI(n, "reverse", 1);
             if (Chance(0.3)) AttrI(n, "exclusive", 1);
           });
        return true;
      }
      case 1: {
        if (!x.exact) return false;
        const int64_t dim = x.shape.back();
        const int64_t k = I64(1, dim);
        Shape out = x.shape;
        out.back() = k;
        const std::string v = Fresh("v"), i = Fresh("v");
        auto& n = Node("TopK", {x.name, Ints({k})}, {v, i});
        if (Chance(0.3)) AttrI(n, "largest", 0);
        Def(v, DType::kFloat32, out, true);
        return true;
      }
      case 2: {
        if (r < 2 || o_.opset < 14) return false;
        Op("Trilu", {x.name}, DType::kFloat32, x.shape, x.exact, [&](onnx::NodeProto& n) {
          if (Chance(0.5)) AttrI(n, "upper", 0);
        });
        return true;
      }
      case 3:
        Op("Hardmax", {x.name}, DType::kFloat32, x.shape, x.exact,
           [&](onnx::NodeProto& n) { AttrI(n, "axis", -1); });
        return true;
      case 4:
        Op("LpNormalization", {x.name}, DType::kFloat32, x.shape, false,
           [&](onnx::NodeProto& n) { AttrI(n, "axis", -1); });
        return true;
      default: {
        if (r != 3 || o_.opset < 12) return false;
        const int64_t k = x.shape[2], n2 = Pick<int64_t>({3, 5});
        Val w = ProductWeight({x.shape[0], k, n2}, k);
        Op("Einsum", {x.name, w.name}, DType::kFloat32, {x.shape[0], x.shape[1], n2}, false,
           [](onnx::NodeProto& n) { AttrS(n, "equation", "bij,bjk->bik"); });
        return true;
      }
    }
  }

  // Ops the other moves do not reach: most run as reference kernels in a cell, so what they
  // test is the buffers, views and layouts around them.
  bool MoreMove() {
    const Val* xp = PickFloat();
    if (!xp) return false;
    const Val x = *xp;
    const int64_t r = static_cast<int64_t>(x.shape.size());
    switch (Int(0, 11)) {
      case 0: {  // ConvTranspose on [B, C, H, W]
        if (r != 4) return false;
        const int64_t c = x.shape[1], co = Pick<int64_t>({2, 4}), k = Pick<int64_t>({2, 3});
        const int64_t s = Pick<int64_t>({1, 2});
        Val w = ProductWeight({c, co, k, k}, c * k * k);
        std::vector<std::string> ins = {x.name, w.name};
        if (Chance(0.5)) ins.push_back(Weight({co}).name);
        const Shape out = {x.shape[0], co, (x.shape[2] - 1) * s + k, (x.shape[3] - 1) * s + k};
        if (NumElements(out) > 40000) return false;
        Val y = Op("ConvTranspose", ins, DType::kFloat32, out, false, [&](onnx::NodeProto& n) {
          AttrInts(n, "kernel_shape", {k, k});
          if (s != 1) AttrInts(n, "strides", {s, s});
        });
        Epilogue(y, true);
        return true;
      }
      case 1:  // Dropout at inference: a view
        Op("Dropout", {x.name}, DType::kFloat32, x.shape, x.exact);
        return true;
      case 2: {  // a float Constant node (a weight, as some exporters write every weight)
        const std::string c = Fresh("v");
        auto& n = Node("Constant", {}, {c});
        auto* a = n.add_attribute();
        a->set_name("value");
        a->set_type(onnx::AttributeProto::TENSOR);
        auto* t = a->mutable_t();
        t->set_data_type(TensorProto::FLOAT);
        t->add_dims(x.shape.back());
        for (int64_t i = 0; i < x.shape.back(); ++i) t->add_float_data(Uni(-1, 1));
        Op("Add", {x.name, c}, DType::kFloat32, x.shape, false);
        return true;
      }
      case 3: {  // ConstantOfShape over Shape(x), then a multiply (a mask of ones)
        const std::string sh = Fresh("v"), ones = Fresh("v");
        Node("Shape", {x.name}, {sh});
        auto& n = Node("ConstantOfShape", {sh}, {ones});
        auto* a = n.add_attribute();
        a->set_name("value");
        a->set_type(onnx::AttributeProto::TENSOR);
        a->mutable_t()->set_data_type(TensorProto::FLOAT);
        a->mutable_t()->add_dims(1);
        a->mutable_t()->add_float_data(1.5f);
        Op("Mul", {x.name, ones}, DType::kFloat32, x.shape, false);
        return true;
      }
      case 4: {  // Mod with fmod on floats (a divisor away from 0)
        Val d = WeightOf({}, {Pick({0.75f, 1.5f, -1.25f})});
        Op("Mod", {x.name, d.name}, DType::kFloat32, x.shape, false,
           [](onnx::NodeProto& n) { AttrI(n, "fmod", 1); });
        return true;
      }
      case 5: {  // MeanVarianceNormalization over [B, C, ...] (axes 0, 2, 3 by default)
        if (r != 4) return false;
        Op("MeanVarianceNormalization", {x.name}, DType::kFloat32, x.shape, false);
        return true;
      }
      case 6:
        Reduce(Pick<const char*>({"ReduceL1", "ReduceLogSum"}),
               Op("Abs", {x.name}, DType::kFloat32, x.shape, x.exact), {-1}, Chance(0.5), false);
        return true;
      case 7: {  // GatherElements with structural indices along an axis
        const int64_t axis = I64(0, r - 1), dim = x.shape[static_cast<size_t>(axis)];
        std::vector<int64_t> idx(static_cast<size_t>(NumElements(x.shape)));
        for (auto& i : idx) i = I64(-dim, dim - 1);
        const std::string k = Fresh("k");
        auto* t = top_->add_initializer();
        t->set_name(k);
        t->set_data_type(TensorProto::INT64);
        for (int64_t d : x.shape) t->add_dims(d);
        for (int64_t i : idx) t->add_int64_data(i);
        Op("GatherElements", {x.name, k}, DType::kFloat32, x.shape, x.exact,
           [&](onnx::NodeProto& n) { AttrI(n, "axis", axis); });
        return true;
      }
      case 8: {  // ScatterND of a runtime update into x's first rows
        if (x.shape[0] < 1) return false;
        Shape upd = x.shape;
        upd.erase(upd.begin());
        upd.insert(upd.begin(), 1);
        const std::string k = Fresh("k");
        auto* t = top_->add_initializer();
        t->set_name(k);
        t->set_data_type(TensorProto::INT64);
        t->add_dims(1);
        t->add_dims(1);
        t->add_int64_data(I64(0, x.shape[0] - 1));
        Val u = Operand(upd, true);
        if (u.shape != upd) u = Input(upd);
        Op("ScatterND", {x.name, k, u.name}, DType::kFloat32, x.shape, x.exact && u.exact);
        return true;
      }
      case 9: {  // Q/DQ: quantize to uint8 and back (a weight scale, a zero point)
        const std::string q = Fresh("v"), zp = Fresh("k");
        auto* t = top_->add_initializer();
        t->set_name(zp);
        t->set_data_type(TensorProto::UINT8);
        t->set_raw_data(std::string(1, static_cast<char>(128)));
        Val sc = WeightOf({}, {Pick({0.02f, 0.05f})});
        Node("QuantizeLinear", {x.name, sc.name, zp}, {q});
        Op("DequantizeLinear", {q, sc.name, zp}, DType::kFloat32, x.shape, false);
        return true;
      }
      case 10: {  // GroupNormalization (opset 18)
        if (o_.opset < 18 || r < 3) return false;
        const int64_t c = x.shape[1];
        const int64_t g = c % 2 == 0 ? 2 : 1;
        Val y = Op("GroupNormalization", {x.name, Weight({g}, 0.5f, 1.5f).name, Weight({g}).name},
                   DType::kFloat32, x.shape, false,
                   [&](onnx::NodeProto& n) { AttrI(n, "num_groups", g); });
        Epilogue(y, r == 4);
        return true;
      }
      default: {  // Size and Range from the shape: structural chains that fold
        const std::string sz = Fresh("v"), rg = Fresh("v"), f = Fresh("v");
        Node("Size", {x.name}, {sz});
        Node("Range", {Ints({0}, true), Ints({x.shape.back()}, true), Ints({1}, true)}, {rg});
        AttrI(Node("Cast", {rg}, {f}), "to", TensorProto::FLOAT);
        (void)sz;
        Op("Add", {x.name, f}, DType::kFloat32, x.shape, false);
        return true;
      }
    }
  }

  // Shapes that depend on input values: the entry's dynamic region (run eagerly by the host)
  // beside the compiled rest.
  bool DynamicMove() {
    const Val* xp = PickExact();
    if (!xp) return false;
    const Val x = *xp;
    if (Chance(0.5)) {
      // NonZero over a comparison, its count as a float: [rank, nnz] -> a scalar-ish row.
      const std::string c = Fresh("v"), nz = Fresh("v"), f = Fresh("v"), s = Fresh("v");
      Node("Greater", {x.name, WeightOf({}, {0.0f}).name}, {c});
      Node("NonZero", {c}, {nz});
      AttrI(Node("Cast", {nz}, {f}), "to", TensorProto::FLOAT);
      std::vector<std::string> ins = {f};
      const bool input_form = o_.opset >= 13;  // ReduceSum's axes became an input at 13
      if (input_form) ins.push_back(Ints({1}));
      auto& n = Node("ReduceSum", ins, {s});
      if (!input_form) AttrInts(n, "axes", {1});
      AttrI(n, "keepdims", 0);
      Def(s, DType::kFloat32, {static_cast<int64_t>(x.shape.size())}, false);
      return true;
    }
    // A Reshape by a shape given as an input: [-1] flattens, whatever the values say.
    Val shape = Input({1}, DType::kInt64);
    out_.inputs[shape.name].data<int64_t>()[0] = -1;
    Op("Reshape", {x.name, shape.name}, DType::kFloat32, {NumElements(x.shape)}, x.exact);
    return true;
  }

  std::mt19937_64 rng_;
  GenOptions o_;
  FuzzGraph out_;
  onnx::GraphProto* top_;
  onnx::GraphProto* cur_;
  std::vector<std::vector<Val>> scopes_;
  int64_t batch_ = 1;
  int next_ = 0;
};

}  // namespace

const std::vector<int64_t>& FuzzOpsets() {
  static const std::vector<int64_t> kOpsets = {11, 13, 17, 18};
  return kOpsets;
}

const std::vector<std::string>& MoveNames() {
  static const std::vector<std::string> kNames = [] {
    std::vector<std::string> names;
    for (const auto& m : Generator::Moves()) names.push_back(m.name);
    return names;
  }();
  return kNames;
}

FuzzGraph GenerateGraph(uint64_t seed, const GenOptions& options) {
  return Generator(seed, options).Build();
}

}  // namespace kiln::graph_fuzz
