// One NaN rule for both paths, per op (docs/design.md §7 "Non-finite values"): every op runs
// with NaN, +Inf and -Inf among finite inputs, eagerly and in a compiled cell, and
//   1. eager follows the rule as written (an independent check per op: NaN through max, min,
//      clip and pooling; comparisons with NaN false; a window or dot product that holds a
//      non-finite input, and only such, gives a non-finite output; ...);
//   2. the cell puts the same non-finite value (NaN, +Inf, -Inf) at every position eager does,
//      and a close finite value everywhere else.
// Each opset's cases are one graph compiled once. To add an op: add a Case with the rule its
// output must follow.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <random>

#include "src/kiln/arm/loader.h"
#include "src/kiln/base/file.h"
#include "src/kiln/compile/pipeline.h"
#include "src/kiln/graph/onnx_import.h"
#include "src/kiln/mint/mint.h"
#include "src/kiln/ops/shape_inference.h"
#include "tests/graph/onnx_builder.h"

namespace kiln {
namespace {

using testing::kFloat;
using testing::OnnxBuilder;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// 0 finite, 1 NaN, 2 +Inf, 3 -Inf.
int Class(double v) {
  if (std::isnan(v)) return 1;
  if (std::isinf(v)) return v > 0 ? 2 : 3;
  return 0;
}
const char* ClassName(int c) {
  static const char* kNames[] = {"finite", "NaN", "+Inf", "-Inf"};
  return kNames[c];
}

// Inputs: dense plants NaN, +Inf and -Inf every few elements (for elementwise ops); sparse
// plants one of each (for windows and products, so most outputs stay finite).
enum class Plant { kDense, kSparse, kNone };

struct Input {
  Shape shape;
  Plant plant = Plant::kDense;
  bool weight = false;             // a bound weight (finite values) instead of an input
  std::vector<float> values = {};  // fixed values (a weight or a structural float)
};

using RuleFn = std::function<void(const std::vector<Tensor>& in, const Tensor& out)>;

struct Case {
  std::string name;
  std::string op;
  std::vector<Input> inputs;
  std::function<void(onnx::NodeProto&)> attrs = nullptr;
  RuleFn rule;            // checks eager's output against the rule
  bool to_float = false;  // a bool or integer output, cast to float before the comparison
};

Tensor Fill(const Input& in, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<float> v(static_cast<size_t>(NumElements(in.shape)));
  for (auto& x : v) x = u(rng);
  if (!in.values.empty()) v = in.values;
  const size_t n = v.size();
  if (in.plant == Plant::kDense) {
    for (size_t i = 0; i < n; ++i) {
      if (i % 5 == 1) v[i] = kNaN;
      if (i % 7 == 2) v[i] = kInf;
      if (i % 11 == 3) v[i] = -kInf;
    }
  } else if (in.plant == Plant::kSparse && n >= 8) {
    v[n / 7] = kNaN;
    v[n / 2 + 1] = kInf;
    v[n - n / 5] = -kInf;
  }
  return Tensor::FromVector<float>(in.shape, v);
}

// ---- the rule, per kind of op --------------------------------------------------------------

// Elementwise: out[i] has the class f(x[i], y[i]...) has in double (inputs broadcast by index
// modulo their size, which the cases keep to equal shapes or scalars).
RuleFn Elementwise(std::function<double(const std::vector<double>&)> f) {
  return [f](const std::vector<Tensor>& in, const Tensor& out) {
    for (int64_t i = 0; i < out.numel(); ++i) {
      std::vector<double> a;
      for (const Tensor& t : in) a.push_back(t.GetAsDouble(i % t.numel()));
      const double want = f(a);
      ASSERT_EQ(Class(out.GetAsDouble(i)), Class(want))
          << "element " << i << ": eager " << out.GetAsDouble(i) << ", the rule " << want;
      if (Class(want) == 0 && !std::isnan(out.GetAsDouble(i))) {
        ASSERT_NEAR(out.GetAsDouble(i), want, 1e-3 * (1 + std::fabs(want))) << "element " << i;
      }
    }
  };
}

// numpy's maximum/minimum: NaN if either is NaN.
double NanMax(double a, double b) { return std::isnan(a) || std::isnan(b) ? NAN : std::max(a, b); }
double NanMin(double a, double b) { return std::isnan(a) || std::isnan(b) ? NAN : std::min(a, b); }
double NanClip(double x, double lo, double hi) { return NanMin(NanMax(x, lo), hi); }

// Reductions over the last axis of a [R, C] input: NaN when the row holds one (max and min
// propagate it like every other reduction does through arithmetic).
RuleFn RowReduce(bool max) {
  return [max](const std::vector<Tensor>& in, const Tensor& out) {
    const int64_t cols = in[0].shape().back(), rows = in[0].numel() / cols;
    for (int64_t r = 0; r < rows; ++r) {
      double m = max ? -INFINITY : INFINITY;
      for (int64_t c = 0; c < cols; ++c) {
        const double v = in[0].GetAsDouble(r * cols + c);
        m = max ? NanMax(m, v) : NanMin(m, v);
      }
      ASSERT_EQ(Class(out.GetAsDouble(r)), Class(m)) << "row " << r;
      if (Class(m) == 0) {
        ASSERT_EQ(out.GetAsDouble(r), m) << "row " << r;
      }
    }
  };
}

// ArgMax/ArgMin over the last axis: the first NaN's index when the row holds one (NaN is the
// extreme, as numpy.argmax/argmin say), else the first extreme.
RuleFn RowArg(bool max) {
  return [max](const std::vector<Tensor>& in, const Tensor& out) {
    const int64_t cols = in[0].shape().back(), rows = in[0].numel() / cols;
    for (int64_t r = 0; r < rows; ++r) {
      int64_t best = 0;
      for (int64_t c = 0; c < cols; ++c) {
        const double v = in[0].GetAsDouble(r * cols + c), b = in[0].GetAsDouble(r * cols + best);
        if (std::isnan(b)) break;
        if (std::isnan(v) || (max ? v > b : v < b)) best = c;
      }
      ASSERT_EQ(out.GetAsInt64(r), best) << "row " << r;
    }
  };
}

// A 2-D window op over x [N, C, H, W] (pools: per channel; convolutions: every input channel).
// A sum over a window (convolutions, average pools) is non-finite exactly when the window holds
// a non-finite input; a max is NaN when the window holds a NaN, else the window's largest value
// (+Inf, -Inf only when every value is -Inf).
RuleFn Windowed(int64_t k, int64_t stride, int64_t pad, bool all_channels, bool max_pool) {
  return [=](const std::vector<Tensor>& in, const Tensor& out) {
    const Shape& xs = in[0].shape();
    const Shape& ys = out.shape();
    for (int64_t n = 0; n < ys[0]; ++n) {
      for (int64_t c = 0; c < ys[1]; ++c) {
        for (int64_t y = 0; y < ys[2]; ++y) {
          for (int64_t x = 0; x < ys[3]; ++x) {
            bool non_finite = false;
            double m = -INFINITY;
            for (int64_t ci = all_channels ? 0 : c; ci < (all_channels ? xs[1] : c + 1); ++ci) {
              for (int64_t dy = 0; dy < k; ++dy) {
                for (int64_t dx = 0; dx < k; ++dx) {
                  const int64_t iy = y * stride - pad + dy, ix = x * stride - pad + dx;
                  if (iy < 0 || ix < 0 || iy >= xs[2] || ix >= xs[3]) continue;
                  const double v = in[0].GetAsDouble(((n * xs[1] + ci) * xs[2] + iy) * xs[3] + ix);
                  non_finite = non_finite || !std::isfinite(v);
                  m = NanMax(m, v);
                }
              }
            }
            const double got = out.GetAsDouble(((n * ys[1] + c) * ys[2] + y) * ys[3] + x);
            if (max_pool) {
              ASSERT_EQ(Class(got), Class(m))
                  << "output [" << n << "," << c << "," << y << "," << x << "] is " << got;
              if (Class(m) == 0) {
                ASSERT_EQ(got, m);
              }
            } else {
              ASSERT_EQ(!std::isfinite(got), non_finite)
                  << "output [" << n << "," << c << "," << y << "," << x << "] is " << got;
            }
          }
        }
      }
    }
  };
}

// A product x [M, K] (times a finite W): row m of the output is non-finite exactly when row m
// of x holds a non-finite value.
RuleFn Rows() {
  return [](const std::vector<Tensor>& in, const Tensor& out) {
    const int64_t k = in[0].shape().back(), m = in[0].numel() / k;
    const int64_t n = out.numel() / m;
    for (int64_t r = 0; r < m; ++r) {
      bool non_finite = false;
      for (int64_t j = 0; j < k; ++j)
        non_finite = non_finite || !std::isfinite(in[0].GetAsDouble(r * k + j));
      for (int64_t j = 0; j < n; ++j) {
        ASSERT_EQ(!std::isfinite(out.GetAsDouble(r * n + j)), non_finite) << "row " << r;
      }
    }
  };
}

// A normalization over the last axis: a row holding a non-finite value is NaN throughout
// (x - mean meets inf - inf or NaN), any other row finite.
RuleFn RowsNaNIfAny() {
  return [](const std::vector<Tensor>& in, const Tensor& out) {
    const int64_t cols = in[0].shape().back(), rows = in[0].numel() / cols;
    for (int64_t r = 0; r < rows; ++r) {
      bool any = false;
      for (int64_t c = 0; c < cols; ++c)
        any = any || !std::isfinite(in[0].GetAsDouble(r * cols + c));
      for (int64_t c = 0; c < cols; ++c) {
        ASSERT_EQ(Class(out.GetAsDouble(r * cols + c)), any ? 1 : 0) << "row " << r;
      }
    }
  };
}

// Softmax over the last axis, exp(x - max) / sum: a row holding NaN or +Inf is NaN throughout
// (inf - inf), a row of -Inf alone is NaN (0 / 0), and -Inf among finite values gives 0.
RuleFn SoftmaxRows() {
  return [](const std::vector<Tensor>& in, const Tensor& out) {
    const int64_t cols = in[0].shape().back(), rows = in[0].numel() / cols;
    for (int64_t r = 0; r < rows; ++r) {
      bool nan_row = true;
      for (int64_t c = 0; c < cols; ++c)
        nan_row = nan_row && in[0].GetAsDouble(r * cols + c) == -INFINITY;
      for (int64_t c = 0; c < cols; ++c) {
        const double v = in[0].GetAsDouble(r * cols + c);
        nan_row = nan_row || std::isnan(v) || v == INFINITY;
      }
      for (int64_t c = 0; c < cols; ++c) {
        ASSERT_EQ(Class(out.GetAsDouble(r * cols + c)), nan_row ? 1 : 0) << "row " << r;
      }
    }
  };
}

auto Attr(const char* name, int64_t v) {
  return [=](onnx::NodeProto& n) { OnnxBuilder::IntAttr(n, name, v); };
}
auto Attrs(std::vector<std::pair<const char*, std::vector<int64_t>>> a) {
  return [=](onnx::NodeProto& n) {
    for (const auto& [name, v] : a) OnnxBuilder::IntsAttr(n, name, v);
  };
}

std::vector<Case> Cases() {
  const Shape s = {4, 33};
  auto unary = [&](const char* op, std::function<double(double)> f) {
    return Case{
        op, op, {{s}}, nullptr, Elementwise([f](const std::vector<double>& a) { return f(a[0]); })};
  };
  std::vector<Case> c = {
      unary("Relu", [](double x) { return NanMax(x, 0); }),
      unary("Sigmoid", [](double x) { return 1 / (1 + std::exp(-x)); }),
      unary("Tanh", [](double x) { return std::tanh(x); }),
      unary("Exp", [](double x) { return std::exp(x); }),
      unary("Softplus", [](double x) { return std::log1p(std::exp(x)); }),
      unary("Abs", [](double x) { return std::fabs(x); }),
      unary("Neg", [](double x) { return -x; }),
      unary("Erf", [](double x) { return std::erf(x); }),
      unary("Floor", [](double x) { return std::floor(x); }),
      unary("Sign", [](double x) { return std::isnan(x) ? x : (x > 0) - (x < 0); }),
      unary("HardSigmoid", [](double x) { return NanClip(0.2 * x + 0.5, 0, 1); }),
      unary("HardSwish", [](double x) { return x * NanClip(x / 6 + 0.5, 0, 1); }),
      unary("LeakyRelu", [](double x) { return x >= 0 ? x : 0.01 * x; }),
      unary("Elu", [](double x) { return x >= 0 ? x : std::exp(x) - 1; }),
      {"Clip",
       "Clip",
       {{s}, {{}, Plant::kNone, true, {-0.5f}}, {{}, Plant::kNone, true, {0.5f}}},
       nullptr,
       Elementwise([](const std::vector<double>& a) { return NanClip(a[0], -0.5, 0.5); })},
      {"Max",
       "Max",
       {{s}, {s, Plant::kSparse}},
       nullptr,
       Elementwise([](const std::vector<double>& a) { return NanMax(a[0], a[1]); })},
      {"Min",
       "Min",
       {{s}, {s, Plant::kSparse}},
       nullptr,
       Elementwise([](const std::vector<double>& a) { return NanMin(a[0], a[1]); })},
      {"Add",
       "Add",
       {{s}, {s, Plant::kSparse}},
       nullptr,
       Elementwise([](const std::vector<double>& a) { return a[0] + a[1]; })},
      {"Mul",
       "Mul",
       {{s}, {s, Plant::kSparse}},
       nullptr,
       Elementwise([](const std::vector<double>& a) { return a[0] * a[1]; })},
      {"Div",
       "Div",
       {{s}, {s, Plant::kSparse}},
       nullptr,
       Elementwise([](const std::vector<double>& a) { return a[0] / a[1]; })},
      {"Greater",
       "Greater",
       {{s}, {s, Plant::kSparse}},
       nullptr,
       Elementwise([](const std::vector<double>& a) { return a[0] > a[1] ? 1.0 : 0.0; }),
       true},
      {"Equal",
       "Equal",
       {{s}, {s, Plant::kSparse}},
       nullptr,
       Elementwise([](const std::vector<double>& a) { return a[0] == a[1] ? 1.0 : 0.0; }),
       true},
      {"LessOrEqual",
       "LessOrEqual",
       {{s}, {s, Plant::kSparse}},
       nullptr,
       Elementwise([](const std::vector<double>& a) { return a[0] <= a[1] ? 1.0 : 0.0; }),
       true},
      {"ReduceMax",
       "ReduceMax",
       {{{6, 9}, Plant::kSparse}},
       Attrs({{"axes", {1}}}),
       RowReduce(true)},
      {"ReduceMin",
       "ReduceMin",
       {{{6, 9}, Plant::kSparse}},
       Attrs({{"axes", {1}}}),
       RowReduce(false)},
      {"ArgMax", "ArgMax", {{{6, 9}, Plant::kSparse}}, Attr("axis", 1), RowArg(true), true},
      {"ArgMin", "ArgMin", {{{6, 9}, Plant::kSparse}}, Attr("axis", 1), RowArg(false), true},
      {"Softmax", "Softmax", {{{6, 9}, Plant::kSparse}}, Attr("axis", -1), SoftmaxRows()},
      {"LayerNormalization",
       "LayerNormalization",
       {{{6, 9}, Plant::kSparse}, {{9}, Plant::kNone, true}, {{9}, Plant::kNone, true}},
       nullptr,
       RowsNaNIfAny()},
      {"MaxPool",
       "MaxPool",
       {{{1, 3, 9, 9}, Plant::kSparse}},
       Attrs({{"kernel_shape", {3, 3}}, {"pads", {1, 1, 1, 1}}}),
       Windowed(3, 1, 1, false, true)},
      {"MaxPool-stride",
       "MaxPool",
       {{{1, 3, 9, 9}, Plant::kSparse}},
       Attrs({{"kernel_shape", {2, 2}}, {"strides", {2, 2}}}),
       Windowed(2, 2, 0, false, true)},
      {"AveragePool",
       "AveragePool",
       {{{1, 3, 9, 9}, Plant::kSparse}},
       Attrs({{"kernel_shape", {3, 3}}, {"pads", {1, 1, 1, 1}}}),
       Windowed(3, 1, 1, false, false)},
      {"GlobalMaxPool",
       "GlobalMaxPool",
       {{{1, 3, 5, 5}, Plant::kSparse}},
       nullptr,
       Windowed(5, 1, 0, false, true)},
      // Dense 3x3 convolutions with 64 channels on 16x16 run the library's Winograd kernel in a
      // cell; a 1x1 and a depthwise one its others.
      {"Conv3x3",
       "Conv",
       {{{1, 64, 16, 16}, Plant::kSparse}, {{64, 64, 3, 3}, Plant::kNone, true}},
       Attrs({{"kernel_shape", {3, 3}}, {"pads", {1, 1, 1, 1}}}),
       Windowed(3, 1, 1, true, false)},
      {"Conv1x1",
       "Conv",
       {{{1, 8, 6, 6}, Plant::kSparse}, {{4, 8, 1, 1}, Plant::kNone, true}},
       Attrs({{"kernel_shape", {1, 1}}}),
       Windowed(1, 1, 0, true, false)},
      {"MatMul",
       "MatMul",
       {{{5, 12}, Plant::kSparse}, {{12, 7}, Plant::kNone, true}},
       nullptr,
       Rows()},
      {"Gemm",
       "Gemm",
       {{{5, 12}, Plant::kSparse}, {{12, 7}, Plant::kNone, true}, {{7}, Plant::kNone, true}},
       nullptr,
       Rows()},
  };
  return c;
}

TEST(NaNRule, EveryOpFollowsItEagerAndCompiled) {
  const std::vector<Case> cases = Cases();
  OnnxBuilder b(17);
  TensorMap inputs;
  std::vector<std::vector<Tensor>> case_inputs(cases.size());
  std::mt19937 rng(7);
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& k = cases[i];
    std::vector<std::string> names;
    for (size_t j = 0; j < k.inputs.size(); ++j) {
      const std::string name = "c" + std::to_string(i) + "_" + std::to_string(j);
      Tensor t = Fill(k.inputs[j], static_cast<uint32_t>(i * 10 + j));
      if (k.inputs[j].weight) {
        std::vector<float> v(t.data<float>(), t.data<float>() + t.numel());
        b.FloatInit(name, k.inputs[j].shape, v);
      } else {
        b.Input(name, kFloat, k.inputs[j].shape);
        inputs[name] = t;
      }
      case_inputs[i].push_back(t);
      names.push_back(name);
    }
    std::string out = k.name;
    auto& n = b.Node(k.op, names, {k.to_float ? out + "_raw" : out}, k.name);
    if (k.attrs) k.attrs(n);
    if (k.to_float) OnnxBuilder::IntAttr(b.Node("Cast", {out + "_raw"}, {out}), "to", kFloat);
    auto* o = b.graph().add_output();
    o->set_name(out);
    o->mutable_type()->mutable_tensor_type()->set_elem_type(kFloat);
  }
  auto imported = ImportOnnxBytes(b.Bytes(), "nan-rule");
  ASSERT_TRUE(imported.ok()) << imported.status().ToString();
  auto graph = std::make_shared<const Graph>(std::move(imported).value());
  auto eager = Interpreter::Create(graph);
  ASSERT_TRUE(eager.ok()) << eager.status().ToString();
  auto want = eager->Run(inputs);
  ASSERT_TRUE(want.ok()) << want.status().ToString();
  // 1. Eager follows the rule.
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE("eager " + cases[i].name);
    const Tensor& out = want->at(cases[i].name);
    if (cases[i].to_float && (cases[i].op == "ArgMax" || cases[i].op == "ArgMin")) {
      cases[i].rule(case_inputs[i], *out.CastTo(DType::kInt64));
    } else {
      cases[i].rule(case_inputs[i], out);
    }
  }
  // 2. The cell puts every non-finite value where eager does.
  ShapeClass cls;
  for (const auto& [n, t] : inputs) cls[n] = t.shape();
  Envelope env{{cls}};
  auto cell = GenerateCell(*graph, env, "nan-rule", CompileOptions{}, nullptr);
  ASSERT_TRUE(cell.ok()) << cell.status().ToString();
  auto toolchain = LocalToolchain();
  ASSERT_TRUE(toolchain.ok());
  auto driver = MakeSystemCompilerDriver(*toolchain);
  auto dir = ProcessPrivateDir();
  ASSERT_TRUE(dir.ok());
  const std::string work = *dir + "/nan-rule";
  ASSERT_TRUE(MakeDirs(work).ok());
  auto so = BuildSharedObject(cell->source, 1, DefaultSmTarget(), "nan", *driver, work, 2, nullptr);
  ASSERT_TRUE(so.ok()) << so.status().ToString();
  auto lib = OpenCellBytes(*so, work + "/load");
  ASSERT_TRUE(lib.ok()) << lib.status().ToString();
  auto entries = EntriesFromDescribe(cell->describe, env);
  ASSERT_TRUE(entries.ok());
  for (int threads : {1, 2}) {
    auto armed = ArmedCell::Arm(*lib, *entries, GraphWeights(*graph), Lane::kIntake, "", threads);
    ASSERT_TRUE(armed.ok()) << armed.status().ToString();
    auto got = (*armed)->Run(0, inputs);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    for (const Case& k : cases) {
      const Tensor& w = want->at(k.name);
      const Tensor& g = got->at(k.name);
      ASSERT_EQ(g.shape(), w.shape()) << k.name;
      int64_t non_finite = 0;
      for (int64_t i = 0; i < w.numel(); ++i) {
        const double a = g.GetAsDouble(i), e = w.GetAsDouble(i);
        ASSERT_EQ(Class(a), Class(e))
            << k.name << " on " << threads << " threads [" << i << "]: eager "
            << ClassName(Class(e)) << " " << e << ", cell " << a;
        non_finite += Class(e) != 0;
        if (Class(e) == 0) {
          ASSERT_NEAR(a, e, 1e-4 * (1 + std::fabs(e))) << k.name << " [" << i << "]";
        }
      }
      if (!k.to_float) {
        EXPECT_GT(non_finite, 0) << k.name << ": no non-finite output";
      }
    }
  }
}

}  // namespace
}  // namespace kiln
