// Fuzz harness for value-dependent allocations (fuzz/; eager/interpreter.h, ops/shape_inference.h):
// one graph around one data-dependent op, whose shape-giving inputs (a ConstantOfShape shape, a
// Range limit, a OneHot depth, Expand/Reshape shapes, Tile repeats, Resize scales and sizes, Pad
// pads, Slice bounds, TopK's k, gather/scatter indices...) are the fuzzer's values, run the way a
// worker runs a request: through the eager interpreter with a per-request MemoryBudget. Then the
// same values as constants through static shape inference, the way the mint specializes a graph.
//
// Input: text, tokens split by spaces or newlines (fuzz/dict/shape_values.dict):
//   <op> <x dims> [<list>...] [name=value...]
//   op        one of kCases below ("Range", "Expand", ...); another word is not a case (refused)
//   x dims    the data input's shape, comma-separated ("2,3"; "-" for a scalar); float32 values
//             0, 1, -2, 3, ... A shape of more than 2^16 elements is clamped like a request body
//             would be, but an empty tensor may keep dims up to 2^32 (as the KServe reader does)
//   list      comma-separated numbers for the op's value inputs, in order (the case says which)
//   options   then=<op> (a follow-up on output 0: Transpose, Flatten, Concat, Expand, Slice,
//             Identity), axis=, mode=, coord=, k=, dtype=float|int64|int32, allowzero=
//
// Promises checked: the run returns, with outputs or with a typed error carrying a message (no
// crash, no sanitizer report, no exception, no allocation past the budget); a `request_too_large`
// refusal is InvalidArgument and names the node ('n0' or 'then'); every byte charged to the
// budget is refunded once the outputs are dropped, and the peak stays within the limit; static
// inference over the same values returns a type or a Status. FuzzOne is true when the request
// ran (file names: "ok-*" must run, "bad-*" must be refused).
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/harness.h"
#include "src/kiln/eager/interpreter.h"
#include "src/kiln/ops/shape_inference.h"

namespace kiln::fuzz {
namespace {

// The budget each request runs with: small, so an allocation the budget should have refused is
// far below libFuzzer's 2 GiB malloc limit only if the budget really bounds it.
constexpr int64_t kBudget = int64_t{64} << 20;
constexpr int64_t kMaxDataElements = int64_t{1} << 16;
constexpr int64_t kMaxEmptyDim = int64_t{1} << 32;  // kserve.h kKServeMaxElements
constexpr size_t kMaxListLength = 64;
constexpr size_t kMaxRank = 8;

std::vector<std::string_view> Split(std::string_view s, std::string_view seps) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && seps.find(s[i]) != std::string_view::npos) ++i;
    size_t j = i;
    while (j < s.size() && seps.find(s[j]) == std::string_view::npos) ++j;
    if (j > i) out.push_back(s.substr(i, j - i));
    i = j;
  }
  return out;
}

// One number token as int64 (strtoll: exact, saturating) and as double (strtod: "1e30", "inf").
struct Number {
  int64_t i = 0;
  double f = 0;
};

Number ParseNumber(std::string_view token) {
  const std::string s(token.substr(0, 64));
  Number n;
  errno = 0;
  n.i = std::strtoll(s.c_str(), nullptr, 10);
  n.f = std::strtod(s.c_str(), nullptr);
  return n;
}

struct Request {
  std::string op;
  Shape x_dims;
  std::vector<std::vector<Number>> lists;
  std::map<std::string, std::string> options;

  std::string Option(const std::string& name, const std::string& dflt = "") const {
    auto it = options.find(name);
    return it == options.end() ? dflt : it->second;
  }
  int64_t IntOption(const std::string& name, int64_t dflt) const {
    auto it = options.find(name);
    return it == options.end() ? dflt : ParseNumber(it->second).i;
  }
  const std::vector<Number>& List(size_t i) const {
    static const std::vector<Number> kEmpty;
    return i < lists.size() ? lists[i] : kEmpty;
  }
};

bool ParseRequest(std::string_view bytes, Request* r) {
  const std::vector<std::string_view> tokens = Split(bytes, " \n\t\r");
  if (tokens.size() < 2) return false;
  r->op = std::string(tokens[0]);
  if (tokens[1] != "-") {
    for (std::string_view d : Split(tokens[1], ",")) {
      if (r->x_dims.size() == kMaxRank) break;
      r->x_dims.push_back(std::max<int64_t>(0, ParseNumber(d).i));
    }
  }
  // The data input is part of the request body: a worker admits no input of more elements, and
  // the harness keeps it small; an empty one may keep large dims.
  bool empty = false;
  for (int64_t d : r->x_dims) empty = empty || d == 0;
  int64_t n = 1;
  for (int64_t& d : r->x_dims) {
    if (empty) {
      d = std::min(d, kMaxEmptyDim);
    } else {
      d = std::min<int64_t>(d, std::max<int64_t>(1, kMaxDataElements / n));
      n *= d;
    }
  }
  for (size_t t = 2; t < tokens.size(); ++t) {
    const size_t eq = tokens[t].find('=');
    if (eq != std::string_view::npos) {
      r->options[std::string(tokens[t].substr(0, eq))] = std::string(tokens[t].substr(eq + 1));
      continue;
    }
    std::vector<Number> list;
    if (tokens[t] != "-") {
      for (std::string_view v : Split(tokens[t], ",")) {
        if (list.size() == kMaxListLength) break;
        list.push_back(ParseNumber(v));
      }
    }
    r->lists.push_back(std::move(list));
  }
  return true;
}

Attribute IntAttr(int64_t v) {
  Attribute a;
  a.kind = Attribute::Kind::kInt;
  a.i = v;
  return a;
}
Attribute StringAttr(const std::string& v) {
  Attribute a;
  a.kind = Attribute::Kind::kString;
  a.s = v;
  return a;
}
Attribute TensorAttr(Tensor t) {
  Attribute a;
  a.kind = Attribute::Kind::kTensor;
  a.t = std::move(t);
  return a;
}

// A graph under construction: inputs with their values (the request), one node per step.
class Builder {
 public:
  explicit Builder(int64_t opset) { g_.opsets[""] = opset; }

  std::string Input(Tensor value) {
    const std::string name = "in" + std::to_string(g_.inputs.size());
    ValueInfo v;
    v.name = name;
    v.dtype = value.dtype();
    v.has_shape = true;
    v.dims.assign(value.shape().size(), Dim{-1, ""});
    g_.inputs.push_back(v);
    values_[name] = std::move(value);
    return name;
  }
  Node& Add(const std::string& op, std::vector<std::string> inputs, size_t outputs,
            const std::string& name) {
    Node n;
    n.op_type = op;
    n.name = name;
    n.inputs = std::move(inputs);
    for (size_t i = 0; i < outputs; ++i) n.outputs.push_back(name + "_out" + std::to_string(i));
    g_.nodes.push_back(std::move(n));
    return g_.nodes.back();
  }
  // Declares every output of the last node a graph output.
  void OutputsOfLast() {
    for (const std::string& o : g_.nodes.back().outputs) {
      ValueInfo v;
      v.name = o;
      v.has_type = true;
      v.dtype = DType::kFloat32;  // informational: outputs are checked by name, not type
      g_.outputs.push_back(v);
    }
  }
  Graph& graph() { return g_; }
  const TensorMap& values() const { return values_; }

 private:
  Graph g_;
  TensorMap values_;
};

Tensor Ints(const std::vector<Number>& list) {
  std::vector<int64_t> v;
  for (const Number& n : list) v.push_back(n.i);
  return Tensor::FromVector<int64_t>({static_cast<int64_t>(v.size())}, v);
}
Tensor Floats(const std::vector<Number>& list) {
  std::vector<float> v;
  for (const Number& n : list) v.push_back(static_cast<float>(n.f));
  return Tensor::FromVector<float>({static_cast<int64_t>(v.size())}, v);
}
Number First(const std::vector<Number>& list) { return list.empty() ? Number{} : list[0]; }

// A scalar of `dtype` from a number.
Tensor ScalarOf(const std::string& dtype, Number n) {
  if (dtype == "float") return Tensor::Scalar<float>(static_cast<float>(n.f));
  if (dtype == "int32") return Tensor::Scalar<int32_t>(static_cast<int32_t>(n.i));
  return Tensor::Scalar<int64_t>(n.i);
}

// `shape` filled with list values cycled (0 when the list is empty), as int64.
Tensor IntsShaped(const Shape& shape, const std::vector<Number>& list) {
  Tensor t = Tensor::Empty(DType::kInt64, shape).value();
  for (int64_t i = 0; i < t.numel(); ++i) {
    t.data<int64_t>()[i] = list.empty() ? 0 : list[static_cast<size_t>(i) % list.size()].i;
  }
  return t;
}

// The op under test, node "n0", reading x (input 0) and the request's lists. False when `op` is
// not a case.
bool AddCase(const Request& r, Builder& b, const std::string& x) {
  const std::string& op = r.op;
  const std::vector<Number>& l0 = r.List(0);
  auto axis = [&r](Node& n) {
    if (r.options.count("axis")) n.attrs["axis"] = IntAttr(r.IntOption("axis", 0));
  };
  if (op == "ConstantOfShape") {
    Node& n = b.Add(op, {b.Input(Ints(l0))}, 1, "n0");
    if (r.Option("dtype") == "int64") {
      n.attrs["value"] = TensorAttr(Tensor::FromVector<int64_t>({1}, {7}));
    } else {
      n.attrs["value"] = TensorAttr(Tensor::FromVector<float>({1}, {1.5f}));
    }
  } else if (op == "Range") {
    const std::string dtype = r.Option("dtype", "int64");
    std::vector<std::string> in;
    for (size_t i = 0; i < 3; ++i) {
      in.push_back(b.Input(ScalarOf(dtype, i < l0.size() ? l0[i] : Number{1, 1})));
    }
    b.Add(op, in, 1, "n0");
  } else if (op == "OneHot") {
    Tensor depth = r.Option("dtype") == "float"
                       ? Tensor::FromVector<float>({1}, {static_cast<float>(First(l0).f)})
                       : Tensor::FromVector<int64_t>({1}, {First(l0).i});
    Node& n =
        b.Add(op, {x, b.Input(depth), b.Input(Tensor::FromVector<float>({2}, {0, 1}))}, 1, "n0");
    axis(n);
  } else if (op == "Expand" || op == "Tile" || op == "Reshape" || op == "Unsqueeze" ||
             op == "Squeeze") {
    Node& n = b.Add(op, {x, b.Input(Ints(l0))}, 1, "n0");
    if (op == "Reshape" && r.options.count("allowzero")) {
      n.attrs["allowzero"] = IntAttr(r.IntOption("allowzero", 0));
    }
  } else if (op == "Resize") {
    std::vector<std::string> in = {x, ""};
    if (!r.List(1).empty()) {
      in.push_back("");
      in.push_back(b.Input(Ints(r.List(1))));  // sizes
    } else {
      in.push_back(b.Input(Floats(l0)));  // scales
    }
    Node& n = b.Add(op, in, 1, "n0");
    n.attrs["mode"] = StringAttr(r.Option("mode", "nearest"));
    if (r.options.count("coord")) {
      n.attrs["coordinate_transformation_mode"] = StringAttr(r.Option("coord"));
    }
  } else if (op == "Upsample") {
    Node& n = b.Add(op, {x, b.Input(Floats(l0))}, 1, "n0");
    n.attrs["mode"] = StringAttr(r.Option("mode", "nearest"));
  } else if (op == "EyeLike") {
    Node& n = b.Add(op, {x}, 1, "n0");
    if (r.options.count("k")) n.attrs["k"] = IntAttr(r.IntOption("k", 0));
  } else if (op == "NonZero") {
    b.Add(op, {x}, 1, "n0");
  } else if (op == "TopK") {
    Node& n = b.Add(op, {x, b.Input(Ints({First(l0)}))}, 2, "n0");
    axis(n);
  } else if (op == "Pad") {
    Node& n = b.Add(op, {x, b.Input(Ints(l0))}, 1, "n0");
    n.attrs["mode"] = StringAttr(r.Option("mode", "constant"));
  } else if (op == "Slice") {
    std::vector<std::string> in = {x, b.Input(Ints(l0)), b.Input(Ints(r.List(1)))};
    if (r.lists.size() > 2) in.push_back(b.Input(Ints(r.List(2))));
    if (r.lists.size() > 3) in.push_back(b.Input(Ints(r.List(3))));
    b.Add(op, in, 1, "n0");
  } else if (op == "Gather") {
    Node& n = b.Add(op, {x, b.Input(Ints(l0))}, 1, "n0");
    axis(n);
  } else if (op == "GatherElements" || op == "ScatterElements") {
    std::vector<std::string> in = {x, b.Input(IntsShaped(r.x_dims, l0))};
    if (op == "ScatterElements") in.push_back(x);
    Node& n = b.Add(op, in, 1, "n0");
    axis(n);
  } else if (op == "GatherND" || op == "ScatterND") {
    const int64_t k = std::clamp<int64_t>(r.IntOption("k", 1), 1, kMaxRank);
    const int64_t rows = static_cast<int64_t>(std::max<size_t>(1, l0.size())) / k + 1;
    std::vector<std::string> in = {x, b.Input(IntsShaped({rows, k}, l0))};
    if (op == "ScatterND") {
      Shape updates = {rows};
      for (size_t d = static_cast<size_t>(k); d < r.x_dims.size(); ++d) {
        updates.push_back(r.x_dims[d]);
      }
      Result<int64_t> count = CheckedNumElements(updates);
      if (!count.ok() || *count > kMaxDataElements) return false;
      in.push_back(b.Input(Tensor::Empty(DType::kFloat32, updates).value()));
    }
    b.Add(op, in, 1, "n0");
  } else if (op == "Split") {
    const size_t outputs = std::clamp<size_t>(l0.size(), 1, 8);
    Node& n = b.Add(op, {x, b.Input(Ints(l0))}, outputs, "n0");
    axis(n);
  } else if (op == "Trilu") {
    b.Add(op, {x, b.Input(Tensor::Scalar<int64_t>(First(l0).i))}, 1, "n0");
  } else if (op == "CumSum") {
    b.Add(op, {x, b.Input(Tensor::Scalar<int64_t>(First(l0).i))}, 1, "n0");
  } else {
    return false;
  }
  return true;
}

// A follow-up on n0's first output: the data-movement kernels meeting the shapes n0 made (a
// zero-element tensor with dims of 2^32, a dim near the budget).
void AddThen(const Request& r, Builder& b) {
  const std::string then = r.Option("then");
  if (then.empty()) return;
  const std::string y = b.graph().nodes.back().outputs[0];
  if (then == "Transpose" || then == "Identity") {
    b.Add(then, {y}, 1, "then");
  } else if (then == "Flatten") {
    b.Add(then, {y}, 1, "then").attrs["axis"] = IntAttr(r.IntOption("then_axis", 1));
  } else if (then == "Concat") {
    b.Add(then, {y, y}, 1, "then").attrs["axis"] = IntAttr(r.IntOption("then_axis", 0));
  } else if (then == "Expand") {
    b.Add(then, {y, b.Input(Tensor::FromVector<int64_t>({1}, {1}))}, 1, "then");
  } else if (then == "Slice") {
    b.Add(then,
          {y, b.Input(Tensor::FromVector<int64_t>({1}, {0})),
           b.Input(Tensor::FromVector<int64_t>({1}, {1}))},
          1, "then");
  }
}

int64_t OpsetFor(const std::string& op) {
  if (op == "Upsample") return 9;
  return 17;
}

bool NamesANode(const Status& s) {
  return s.message().find("'n0'") != std::string::npos ||
         s.message().find("'then'") != std::string::npos;
}

}  // namespace

bool FuzzOne(std::string_view bytes) {
  Request r;
  if (!ParseRequest(bytes, &r)) return false;
  Builder b(OpsetFor(r.op));
  Tensor x = Tensor::Empty(DType::kFloat32, r.x_dims).value();
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = static_cast<float>(i % 5 - 2);
  const std::string x_name = b.Input(x);
  if (!AddCase(r, b, x_name)) return false;
  AddThen(r, b);
  b.OutputsOfLast();
  auto graph = std::make_shared<const Graph>(b.graph());

  // 1. The request, as a worker runs it.
  bool ran = false;
  auto budget = std::make_shared<MemoryBudget>(kBudget);
  {
    Result<Interpreter> interp = Interpreter::Create(graph);
    if (!interp.ok()) {
      CheckRefusal(interp.status(), "Interpreter::Create");
      return false;
    }
    Result<TensorMap> out = interp->Run(b.values(), nullptr, nullptr, budget);
    if (!out.ok()) {
      CheckRefusal(out.status(), "Interpreter::Run");
      if (out.status().Is(kRefusalRequestTooLarge)) {
        KILN_FUZZ_CHECK(out.status().code() == StatusCode::kInvalidArgument,
                        "request_too_large with code " + out.status().ToString());
        KILN_FUZZ_CHECK(NamesANode(out.status()),
                        "request_too_large names no node: " + out.status().ToString());
      }
    } else {
      ran = true;
      for (const auto& [name, t] : *out) {
        KILN_FUZZ_CHECK(t.valid(), "output '" + name + "' is not a tensor");
        KILN_FUZZ_CHECK(CheckedNumBytes(t.dtype(), t.shape()).ok(),
                        "output '" + name + "' has a size past int64: " + t.TypeString());
      }
    }
  }
  KILN_FUZZ_CHECK(budget->peak() <= budget->limit(), "the budget held more than its limit");
  KILN_FUZZ_CHECK(budget->in_use() == 0,
                  "the run left " + std::to_string(budget->in_use()) + " bytes charged");

  // 2. The same values as structural constants, specialized the way the mint does: a size past
  // int64 is a Status, never a wrapped buffer.
  Graph constants = b.graph();
  std::map<std::string, Shape> shapes;
  std::vector<ValueInfo> inputs;
  for (const ValueInfo& v : constants.inputs) {
    if (v.name == x_name) {
      inputs.push_back(v);
      shapes[v.name] = x.shape();
    } else {
      constants.initializers[v.name] = b.values().at(v.name);
    }
  }
  constants.inputs = inputs;
  for (const Node& n : constants.nodes) {  // as the importer marks Resize scales structural
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      if (IsShapeInput(n.domain, n.op_type, i)) constants.structural_floats.insert(n.inputs[i]);
    }
  }
  Result<InferredGraph> inferred = InferShapes(constants, shapes, /*tolerate_dynamic=*/true);
  if (!inferred.ok()) CheckRefusal(inferred.status(), "InferShapes");
  return ran;
}

}  // namespace kiln::fuzz
