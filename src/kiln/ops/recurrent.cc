// The recurrent op family (ops layer): RNN, GRU and LSTM (ONNX opsets 7 and 14), float32.
//
// Listed by RecurrentOpDefs (registered by registry.cc). One kernel
// serves the three cells: the input projection of every time step is one SGEMM up front
// (X[S*B, I] x W^T), then each step does the recurrent SGEMM (H[B, hidden] x R^T) and the
// cell's gate equations. W, R, B and P are read as inputs on every run: in a real model they are
// initializers, i.e. bound weights that a checkpoint may replace.
//
// Conventions (ONNX):
//   inputs   X, W, R, B, sequence_lens, initial_h (LSTM adds initial_c, P); all but X, W, R
//            optional. Gate order in W/R/B: RNN i; GRU z, r, h; LSTM i, o, f, c; P is i, o, f.
//   outputs  Y [S, D, B, H], Y_h [D, B, H] (LSTM adds Y_c); layout=1 swaps to batch-major
//            X [B, S, I], Y [B, S, D, H], states [B, D, H]. Every output is optional.
//   sequence_lens: steps at or past a batch entry's length leave its state alone and write
//            zeros to Y; the reverse direction starts at the entry's last valid step.
//   activations: per direction, RNN f; GRU f, g; LSTM f, g, h (defaults Tanh; Sigmoid, Tanh;
//            Sigmoid, Tanh, Tanh). activation_alpha / activation_beta are consumed in that
//            order by the activations that take an alpha / a beta.
//   clip:    gate pre-activations are clamped to [-clip, clip] before their activation.
#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <string>
#include <vector>

#include "src/kiln/ops/dnnl_kernels.h"
#include "src/kiln/ops/registry.h"

namespace kiln {
namespace {

enum class CellKind { kRnn, kGru, kLstm };

int GateCount(CellKind k) { return k == CellKind::kRnn ? 1 : k == CellKind::kGru ? 3 : 4; }
size_t ActivationCount(CellKind k) { return k == CellKind::kRnn ? 1 : k == CellKind::kGru ? 2 : 3; }
size_t MaxInputs(CellKind k) { return k == CellKind::kLstm ? 8 : 6; }
size_t MaxOutputs(CellKind k) { return k == CellKind::kLstm ? 3 : 2; }

// ---------------------------------------------------------------------------------------------
// Activations (the ONNX list for recurrent ops), with their alpha/beta defaults.

struct Activation {
  enum class Kind {
    kRelu,
    kTanh,
    kSigmoid,
    kAffine,
    kLeakyRelu,
    kThresholdedRelu,
    kScaledTanh,
    kHardSigmoid,
    kElu,
    kSoftsign,
    kSoftplus
  };
  Kind kind = Kind::kTanh;
  float alpha = 0, beta = 0;

  float operator()(float x) const {
    switch (kind) {
      case Kind::kRelu:
        return x > 0 ? x : 0.0f;
      case Kind::kTanh:
        return std::tanh(x);
      case Kind::kSigmoid:
        return 1.0f / (1.0f + std::exp(-x));
      case Kind::kAffine:
        return alpha * x + beta;
      case Kind::kLeakyRelu:
        return x >= 0 ? x : alpha * x;
      case Kind::kThresholdedRelu:
        return x > alpha ? x : 0.0f;
      case Kind::kScaledTanh:
        return alpha * std::tanh(beta * x);
      case Kind::kHardSigmoid:
        return std::clamp(alpha * x + beta, 0.0f, 1.0f);
      case Kind::kElu:
        return x >= 0 ? x : alpha * (std::exp(x) - 1.0f);
      case Kind::kSoftsign:
        return x / (1.0f + std::fabs(x));
      case Kind::kSoftplus:
        return std::log1p(std::exp(x));
    }
    return x;
  }
};

struct ActivationSpec {
  const char* name;
  Activation::Kind kind;
  bool uses_alpha, uses_beta;
  float alpha, beta;  // defaults
};

constexpr std::array<ActivationSpec, 11> kActivations = {{
    {"Relu", Activation::Kind::kRelu, false, false, 0, 0},
    {"Tanh", Activation::Kind::kTanh, false, false, 0, 0},
    {"Sigmoid", Activation::Kind::kSigmoid, false, false, 0, 0},
    {"Affine", Activation::Kind::kAffine, true, true, 1.0f, 0.0f},
    {"LeakyRelu", Activation::Kind::kLeakyRelu, true, false, 0.01f, 0},
    {"ThresholdedRelu", Activation::Kind::kThresholdedRelu, true, false, 1.0f, 0},
    {"ScaledTanh", Activation::Kind::kScaledTanh, true, true, 1.0f, 1.0f},
    {"HardSigmoid", Activation::Kind::kHardSigmoid, true, true, 0.2f, 0.5f},
    {"Elu", Activation::Kind::kElu, true, false, 1.0f, 0},
    {"Softsign", Activation::Kind::kSoftsign, false, false, 0, 0},
    {"Softplus", Activation::Kind::kSoftplus, false, false, 0, 0},
}};

bool EqualsIgnoreCase(const std::string& a, const char* b) {
  const std::string bs(b);
  if (a.size() != bs.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(bs[i]))) {
      return false;
    }
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// Attributes, parsed once per check and per run; errors name node, attribute, value, expectation.

struct RnnAttrs {
  CellKind kind = CellKind::kRnn;
  int64_t directions = 1;
  bool reverse = false;                 // with directions == 1
  int64_t hidden_size = -1;             // -1: take it from R
  std::vector<Activation> activations;  // ActivationCount(kind) per direction
  float clip = 0;                       // 0: no clip
  int64_t layout = 0;
  bool linear_before_reset = false;  // GRU
  bool input_forget = false;         // LSTM
};

Result<int64_t> ReadFlag(const Node& node, const char* attr) {
  if (!node.HasAttr(attr)) return 0;
  KILN_ASSIGN_OR_RETURN(int64_t v, node.GetInt(attr));
  if (v != 0 && v != 1) {
    return Status::InvalidArgument(node.Describe() + ": " + attr + "=" + std::to_string(v) +
                                   " is not 0 or 1");
  }
  return v;
}

Result<RnnAttrs> ReadAttrs(const Node& node, int64_t opset, CellKind kind) {
  RnnAttrs a;
  a.kind = kind;
  const std::string where = node.Describe();
  std::string direction = "forward";
  if (node.HasAttr("direction")) {
    KILN_ASSIGN_OR_RETURN(direction, node.GetString("direction"));
  }
  if (direction == "bidirectional") {
    a.directions = 2;
  } else if (direction == "reverse") {
    a.reverse = true;
  } else if (direction != "forward") {
    return Status::InvalidArgument(where + ": direction='" + direction +
                                   "' is not one of forward, reverse, bidirectional");
  }
  if (node.HasAttr("hidden_size")) {
    KILN_ASSIGN_OR_RETURN(a.hidden_size, node.GetInt("hidden_size"));
    if (a.hidden_size < 1) {
      return Status::InvalidArgument(where + ": hidden_size=" + std::to_string(a.hidden_size) +
                                     " is below 1");
    }
  }
  if (node.HasAttr("clip")) {
    KILN_ASSIGN_OR_RETURN(a.clip, node.GetFloat("clip"));
    if (!(a.clip > 0)) {
      return Status::InvalidArgument(where + ": clip=" + std::to_string(a.clip) +
                                     " is not positive");
    }
  }
  if (node.HasAttr("layout")) {
    if (opset < 14) {
      return Status::InvalidArgument(where + ": attribute 'layout' exists from opset 14, the " +
                                     "model is at opset " + std::to_string(opset));
    }
    KILN_ASSIGN_OR_RETURN(a.layout, ReadFlag(node, "layout"));
  }
  if (node.HasAttr("linear_before_reset")) {
    if (kind != CellKind::kGru) {
      return Status::InvalidArgument(where + ": attribute 'linear_before_reset' is GRU's only");
    }
    KILN_ASSIGN_OR_RETURN(int64_t v, ReadFlag(node, "linear_before_reset"));
    a.linear_before_reset = v != 0;
  }
  if (node.HasAttr("input_forget")) {
    if (kind != CellKind::kLstm) {
      return Status::InvalidArgument(where + ": attribute 'input_forget' is LSTM's only");
    }
    KILN_ASSIGN_OR_RETURN(int64_t v, ReadFlag(node, "input_forget"));
    a.input_forget = v != 0;
  }

  const size_t per_dir = ActivationCount(kind);
  const size_t want = per_dir * static_cast<size_t>(a.directions);
  std::vector<std::string> names;
  if (node.HasAttr("activations")) {
    const auto it = node.attrs.find("activations");
    if (it->second.kind != Attribute::Kind::kStrings) {
      return Status::InvalidArgument(where + ": attribute 'activations' is " +
                                     AttributeKindName(it->second.kind) + ", expected strings");
    }
    names = it->second.strings;
    if (names.size() != want) {
      return Status::InvalidArgument(where + ": activations has " + std::to_string(names.size()) +
                                     " entries, expected " + std::to_string(want) + " (" +
                                     std::to_string(per_dir) + " per direction, " + direction +
                                     ")");
    }
  } else {
    const std::vector<std::string> defaults =
        kind == CellKind::kRnn   ? std::vector<std::string>{"Tanh"}
        : kind == CellKind::kGru ? std::vector<std::string>{"Sigmoid", "Tanh"}
                                 : std::vector<std::string>{"Sigmoid", "Tanh", "Tanh"};
    for (int64_t d = 0; d < a.directions; ++d) {
      names.insert(names.end(), defaults.begin(), defaults.end());
    }
  }
  std::vector<float> alphas, betas;
  if (node.HasAttr("activation_alpha")) {
    KILN_ASSIGN_OR_RETURN(alphas, node.GetFloats("activation_alpha"));
  }
  if (node.HasAttr("activation_beta")) {
    KILN_ASSIGN_OR_RETURN(betas, node.GetFloats("activation_beta"));
  }
  size_t next_alpha = 0, next_beta = 0;
  for (const std::string& name : names) {
    const ActivationSpec* spec = nullptr;
    for (const ActivationSpec& s : kActivations) {
      if (EqualsIgnoreCase(name, s.name)) spec = &s;
    }
    if (spec == nullptr) {
      return Status::InvalidArgument(
          where + ": activations contains '" + name +
          "', which is not one of Relu, Tanh, Sigmoid, Affine, LeakyRelu, ThresholdedRelu, "
          "ScaledTanh, HardSigmoid, Elu, Softsign, Softplus");
    }
    Activation act{spec->kind, spec->alpha, spec->beta};
    if (spec->uses_alpha && next_alpha < alphas.size()) act.alpha = alphas[next_alpha++];
    if (spec->uses_beta && next_beta < betas.size()) act.beta = betas[next_beta++];
    a.activations.push_back(act);
  }
  return a;
}

template <CellKind kKind>
Status CheckRecurrent(const Node& node, int64_t opset) {
  KILN_RETURN_IF_ERROR(CheckArity(node, 3, MaxInputs(kKind), MaxOutputs(kKind)));
  return ReadAttrs(node, opset, kKind).status();
}

// ---------------------------------------------------------------------------------------------
// Shapes.

struct RnnDims {
  int64_t S = 0, B = 0, I = 0, H = 0, D = 1, G = 1;
};

Status ExpectShape(const OpContext& ctx, size_t i, const char* role, const Shape& want,
                   const char* what) {
  if (!ctx.present(i) || ctx.type(i).shape == want) return Status::OK();
  return Status::InvalidArgument(ctx.where() + ": input " + std::to_string(i) + " ('" + role +
                                 "') has shape " + ShapeToString(ctx.type(i).shape) +
                                 ", expected " + ShapeToString(want) + " (" + what + ")");
}

Result<RnnDims> ReadDims(const OpContext& ctx, const RnnAttrs& a) {
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    if (!ctx.present(i) || i == 4) continue;
    if (ctx.type(i).dtype != DType::kFloat32) {
      return UnsupportedDType(ctx, ctx.type(i).dtype, "float32");
    }
  }
  const Shape& x = ctx.type(0).shape;
  const Shape& r = ctx.type(2).shape;
  if (x.size() != 3) {
    return Status::InvalidArgument(
        ctx.where() + ": input 0 ('X') has shape " + ShapeToString(x) + ", expected rank 3 (" +
        (a.layout == 0 ? "[seq, batch, input]" : "[batch, seq, input]") + ")");
  }
  RnnDims d;
  d.D = a.directions;
  d.G = GateCount(a.kind);
  d.S = a.layout == 0 ? x[0] : x[1];
  d.B = a.layout == 0 ? x[1] : x[0];
  d.I = x[2];
  if (r.size() != 3) {
    return Status::InvalidArgument(ctx.where() + ": input 2 ('R') has shape " + ShapeToString(r) +
                                   ", expected [num_directions, gates*hidden, hidden]");
  }
  d.H = r[2];
  if (a.hidden_size >= 0 && a.hidden_size != d.H) {
    return Status::InvalidArgument(ctx.where() + ": hidden_size=" + std::to_string(a.hidden_size) +
                                   " but R " + ShapeToString(r) + " has hidden size " +
                                   std::to_string(d.H));
  }
  const int64_t GH = d.G * d.H;
  KILN_RETURN_IF_ERROR(
      ExpectShape(ctx, 1, "W", {d.D, GH, d.I}, "num_directions, gates*hidden, input"));
  KILN_RETURN_IF_ERROR(
      ExpectShape(ctx, 2, "R", {d.D, GH, d.H}, "num_directions, gates*hidden, hidden"));
  KILN_RETURN_IF_ERROR(ExpectShape(ctx, 3, "B", {d.D, 2 * GH}, "num_directions, 2*gates*hidden"));
  if (ctx.present(4)) {
    const TensorType& t = ctx.type(4);
    if (t.dtype != DType::kInt32 && t.dtype != DType::kInt64) {
      return Status::InvalidArgument(ctx.where() + ": input 4 ('sequence_lens') has dtype " +
                                     DTypeName(t.dtype) + ", expected int32");
    }
    KILN_RETURN_IF_ERROR(ExpectShape(ctx, 4, "sequence_lens", {d.B}, "batch"));
  }
  const Shape state = a.layout == 0 ? Shape{d.D, d.B, d.H} : Shape{d.B, d.D, d.H};
  const char* state_what =
      a.layout == 0 ? "num_directions, batch, hidden" : "batch, num_directions, hidden";
  KILN_RETURN_IF_ERROR(ExpectShape(ctx, 5, "initial_h", state, state_what));
  if (a.kind == CellKind::kLstm) {
    KILN_RETURN_IF_ERROR(ExpectShape(ctx, 6, "initial_c", state, state_what));
    KILN_RETURN_IF_ERROR(ExpectShape(ctx, 7, "P", {d.D, 3 * d.H}, "num_directions, 3*hidden"));
  }
  return d;
}

template <CellKind kKind>
Result<std::vector<TensorType>> InferRecurrent(const OpContext& ctx) {
  KILN_ASSIGN_OR_RETURN(RnnAttrs a, ReadAttrs(ctx.node(), ctx.opset(), kKind));
  KILN_ASSIGN_OR_RETURN(RnnDims d, ReadDims(ctx, a));
  const Shape y = a.layout == 0 ? Shape{d.S, d.D, d.B, d.H} : Shape{d.B, d.S, d.D, d.H};
  const Shape state = a.layout == 0 ? Shape{d.D, d.B, d.H} : Shape{d.B, d.D, d.H};
  std::vector<TensorType> out = {{DType::kFloat32, y}, {DType::kFloat32, state}};
  if (kKind == CellKind::kLstm) out.push_back({DType::kFloat32, state});
  out.resize(std::max<size_t>(1, ctx.node().outputs.size()));
  return out;
}

// ---------------------------------------------------------------------------------------------
// The kernel.

float Clip(float v, float clip) { return clip > 0 ? std::clamp(v, -clip, clip) : v; }

Status Gemm(int64_t M, int64_t N, int64_t K, const float* A, const float* B_rows, float* C,
            int threads) {
  // C[M,N] = A[M,K] x B_rows[N,K]^T; oneDNN rejects empty problems, which need no work.
  if (M == 0 || N == 0) return Status::OK();
  if (K == 0) {
    std::fill(C, C + M * N, 0.0f);
    return Status::OK();
  }
  return Sgemm(false, true, M, N, K, 1.0f, A, K, B_rows, K, 0.0f, C, N, threads);
}

template <CellKind kKind>
Status RunRecurrent(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_ASSIGN_OR_RETURN(RnnAttrs a, ReadAttrs(ctx.node(), ctx.opset(), kKind));
  KILN_ASSIGN_OR_RETURN(RnnDims d, ReadDims(ctx, a));
  const int64_t S = d.S, B = d.B, I = d.I, H = d.H, D = d.D, G = d.G, GH = G * H;
  const int threads = ctx.num_threads();
  const bool layout1 = a.layout == 1;

  // X time-major [S, B, I].
  std::vector<float> x(static_cast<size_t>(S * B * I));
  const float* xin = ctx.in(0).data<float>();
  for (int64_t s = 0; s < S; ++s) {
    for (int64_t b = 0; b < B; ++b) {
      const int64_t src = layout1 ? (b * S + s) * I : (s * B + b) * I;
      std::copy(xin + src, xin + src + I, x.begin() + (s * B + b) * I);
    }
  }
  std::vector<int64_t> lens(static_cast<size_t>(B), S);
  if (ctx.present(4)) {
    const Tensor& sl = ctx.in(4);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t v = sl.GetAsInt64(b);
      if (v < 0 || v > S) {
        return Status::InvalidArgument(ctx.where() + ": sequence_lens[" + std::to_string(b) +
                                       "]=" + std::to_string(v) + " is outside [0, " +
                                       std::to_string(S) + "] (the sequence length)");
      }
      lens[static_cast<size_t>(b)] = v;
    }
  }

  // Results in layout 0; copied to the requested layout at the end.
  std::vector<float> y(static_cast<size_t>(S * D * B * H), 0.0f);
  std::vector<float> yh(static_cast<size_t>(D * B * H), 0.0f), yc(yh.size(), 0.0f);
  std::vector<float> xw(static_cast<size_t>(S * B * GH)), hr(static_cast<size_t>(B * GH));
  std::vector<float> h(static_cast<size_t>(B * H)), c(h.size()), rh(h.size()), rh_r(h.size());
  const std::vector<float> zeros(static_cast<size_t>(2 * GH), 0.0f);

  for (int64_t dir = 0; dir < D; ++dir) {
    const bool reverse = dir == 1 || a.reverse;
    const float* W = ctx.in(1).data<float>() + dir * GH * I;
    const float* R = ctx.in(2).data<float>() + dir * GH * H;
    const float* wb = ctx.present(3) ? ctx.in(3).data<float>() + dir * 2 * GH : zeros.data();
    const float* rb = wb + GH;
    const float* P = (kKind == CellKind::kLstm && ctx.present(7))
                         ? ctx.in(7).data<float>() + dir * 3 * H
                         : nullptr;
    const Activation* act = &a.activations[static_cast<size_t>(dir) * ActivationCount(kKind)];

    // Initial states.
    for (int64_t b = 0; b < B; ++b) {
      const int64_t at = layout1 ? (b * D + dir) * H : (dir * B + b) * H;
      for (int64_t j = 0; j < H; ++j) {
        h[b * H + j] = ctx.present(5) ? ctx.in(5).data<float>()[at + j] : 0.0f;
        c[b * H + j] =
            (kKind == CellKind::kLstm && ctx.present(6)) ? ctx.in(6).data<float>()[at + j] : 0.0f;
      }
    }
    // Input projections of every step, with W's bias folded in.
    KILN_RETURN_IF_ERROR(Gemm(S * B, GH, I, x.data(), W, xw.data(), threads));
    for (int64_t row = 0; row < S * B; ++row) {
      for (int64_t j = 0; j < GH; ++j) xw[row * GH + j] += wb[j];
    }

    for (int64_t s = 0; s < S; ++s) {
      // GRU without linear_before_reset multiplies R_h by (r . h), so its h rows wait for r.
      const bool gru_late_h = kKind == CellKind::kGru && !a.linear_before_reset;
      const int64_t rows_now = gru_late_h ? 2 * H : GH;
      std::vector<float> hr_now(static_cast<size_t>(B * rows_now));
      KILN_RETURN_IF_ERROR(Gemm(B, rows_now, H, h.data(), R, hr_now.data(), threads));
      for (int64_t b = 0; b < B; ++b) {
        for (int64_t j = 0; j < GH; ++j) {
          hr[b * GH + j] = j < rows_now ? hr_now[b * rows_now + j] : 0.0f;
        }
      }
      if (gru_late_h) {
        // r for every active batch entry, then (r . h) x R_h^T.
        for (int64_t b = 0; b < B; ++b) {
          const int64_t len = lens[static_cast<size_t>(b)];
          const int64_t t = reverse ? len - 1 - s : s;
          for (int64_t j = 0; j < H; ++j) {
            float r = 0;
            if (s < len) {
              r = act[0](
                  Clip(xw[(t * B + b) * GH + H + j] + hr[b * GH + H + j] + rb[H + j], a.clip));
            }
            rh_r[b * H + j] = r * h[b * H + j];
          }
        }
        KILN_RETURN_IF_ERROR(Gemm(B, H, H, rh_r.data(), R + 2 * H * H, rh.data(), threads));
      }
      for (int64_t b = 0; b < B; ++b) {
        const int64_t len = lens[static_cast<size_t>(b)];
        if (s >= len) continue;
        const int64_t t = reverse ? len - 1 - s : s;
        const float* gx = &xw[(t * B + b) * GH];
        const float* gh = &hr[b * GH];
        float* hb = &h[b * H];
        float* cb = &c[b * H];
        for (int64_t j = 0; j < H; ++j) {
          if (kKind == CellKind::kRnn) {
            hb[j] = act[0](Clip(gx[j] + gh[j] + rb[j], a.clip));
          } else if (kKind == CellKind::kGru) {
            const float z = act[0](Clip(gx[j] + gh[j] + rb[j], a.clip));
            const float r = act[0](Clip(gx[H + j] + gh[H + j] + rb[H + j], a.clip));
            const float pre = a.linear_before_reset
                                  ? gx[2 * H + j] + r * (gh[2 * H + j] + rb[2 * H + j])
                                  : gx[2 * H + j] + rh[b * H + j] + rb[2 * H + j];
            const float cand = act[1](Clip(pre, a.clip));
            hb[j] = (1.0f - z) * cand + z * hb[j];
          } else {
            const float pi = P ? P[j] : 0.0f, po = P ? P[H + j] : 0.0f,
                        pf = P ? P[2 * H + j] : 0.0f;
            const float i_gate = act[0](Clip(gx[j] + gh[j] + rb[j] + pi * cb[j], a.clip));
            const float f_gate =
                a.input_forget
                    ? 1.0f - i_gate
                    : act[0](
                          Clip(gx[2 * H + j] + gh[2 * H + j] + rb[2 * H + j] + pf * cb[j], a.clip));
            const float cand = act[1](Clip(gx[3 * H + j] + gh[3 * H + j] + rb[3 * H + j], a.clip));
            cb[j] = f_gate * cb[j] + i_gate * cand;
            const float o_gate =
                act[0](Clip(gx[H + j] + gh[H + j] + rb[H + j] + po * cb[j], a.clip));
            hb[j] = o_gate * act[2](cb[j]);
          }
        }
        std::copy(hb, hb + H, y.begin() + ((t * D + dir) * B + b) * H);
      }
    }
    std::copy(h.begin(), h.end(), yh.begin() + dir * B * H);
    std::copy(c.begin(), c.end(), yc.begin() + dir * B * H);
  }

  // Outputs in the requested layout. Omitted ones ("" in the node) are never written: a
  // compiled cell may hand them a placeholder buffer that does not have the output's size.
  auto wanted = [&](size_t k) {
    return k < outputs.size() && k < ctx.node().outputs.size() && !ctx.node().outputs[k].empty();
  };
  if (wanted(0)) {
    float* out = outputs[0].data<float>();
    for (int64_t s = 0; s < S; ++s) {
      for (int64_t dir = 0; dir < D; ++dir) {
        for (int64_t b = 0; b < B; ++b) {
          const float* src = &y[((s * D + dir) * B + b) * H];
          const int64_t dst = layout1 ? ((b * S + s) * D + dir) * H : ((s * D + dir) * B + b) * H;
          std::copy(src, src + H, out + dst);
        }
      }
    }
  }
  const std::vector<float>* states[2] = {&yh, &yc};
  for (size_t k = 1; k < 3; ++k) {
    if (!wanted(k)) continue;
    float* out = outputs[k].data<float>();
    for (int64_t dir = 0; dir < D; ++dir) {
      for (int64_t b = 0; b < B; ++b) {
        const float* src = &(*states[k - 1])[(dir * B + b) * H];
        const int64_t dst = layout1 ? (b * D + dir) * H : (dir * B + b) * H;
        std::copy(src, src + H, out + dst);
      }
    }
  }
  return Status::OK();
}

inline constexpr size_t kRecurrentOpCount = 3;

}  // namespace

std::vector<OpDef> RecurrentOpDefs() {
  // Opset 7 dropped the opset-1 output_sequence attribute; opset 14 added layout (read by opset).
  const std::array<OpDef, kRecurrentOpCount> table = {{
      {"RNN", "", 7, INT64_MAX, CheckRecurrent<CellKind::kRnn>, InferRecurrent<CellKind::kRnn>,
       RunRecurrent<CellKind::kRnn>},
      {"GRU", "", 7, INT64_MAX, CheckRecurrent<CellKind::kGru>, InferRecurrent<CellKind::kGru>,
       RunRecurrent<CellKind::kGru>},
      {"LSTM", "", 7, INT64_MAX, CheckRecurrent<CellKind::kLstm>, InferRecurrent<CellKind::kLstm>,
       RunRecurrent<CellKind::kLstm>},
  }};
  return {table.begin(), table.end()};
}

}  // namespace kiln
