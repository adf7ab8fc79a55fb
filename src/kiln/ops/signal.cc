// Signal op family (ops layer): DFT, STFT, MelWeightMatrix and the window functions
// (HannWindow, HammingWindow, BlackmanWindow), each with its reference kernel.
//
// SignalOpDefs is registered by OpRegistry::Global() (registry.cc). Transforms are direct sums in
// double with twiddles reduced modulo the length (exact angles for every length, no power-of-two
// requirement); a reference kernel, not a fast one. Complex values travel as a trailing dim of 2
// (real, imaginary); a real signal has a trailing dim of 1. The window and mel outputs take their
// element type from attribute output_datatype (an ONNX element type, float32 by default), and
// their sizes from input values, so a compiled cell computes them when those inputs are
// structural and runs them in its dynamic region otherwise.
#include <cmath>
#include <numbers>
#include <string>
#include <vector>

#include "src/kiln/ops/kernel_util.h"
#include "src/kiln/ops/registry.h"

namespace kiln {
namespace {

using kernel::BadAttr;
using kernel::BadInputShape;

// A scalar (or one-element) integer input's value.
Result<int64_t> ScalarInt(const OpContext& ctx, size_t i, const char* role) {
  KILN_ASSIGN_OR_RETURN(const Tensor* t, ctx.RequireValue(i, role));
  if (t->numel() != 1 || IsFloatDType(t->dtype())) {
    return Status::InvalidArgument(ctx.where() + ": input " + std::to_string(i) + " ('" + role +
                                   "') is " + t->TypeString() + ", expected one integer");
  }
  return t->GetAsInt64(0);
}

Result<double> ScalarNumber(const OpContext& ctx, size_t i, const char* role) {
  KILN_ASSIGN_OR_RETURN(const Tensor* t, ctx.RequireValue(i, role));
  if (t->numel() != 1) {
    return Status::InvalidArgument(ctx.where() + ": input " + std::to_string(i) + " ('" + role +
                                   "') is " + t->TypeString() + ", expected one number");
  }
  return t->GetAsDouble(0);
}

// The output element type from attribute output_datatype (default FLOAT).
Result<DType> OutputDataType(const Node& node, const char* supported) {
  KILN_ASSIGN_OR_RETURN(int64_t code, kernel::IntOr(node, "output_datatype", 1));
  const std::optional<DType> t = DTypeFromOnnxElemType(code);
  if (!t) {
    return Status::Unimplemented(node.Describe() + ": output_datatype=" + std::to_string(code) +
                                 " (" + OnnxElemTypeName(code) + ") is not supported (" +
                                 supported + ")");
  }
  return *t;
}

// e^{-i 2 pi k n / len} (or e^{+i...} for the inverse), with k*n reduced modulo len first so the
// angle is exact for long signals.
void Twiddle(int64_t k, int64_t n, int64_t len, bool inverse, double* re, double* im) {
  const int64_t r = (k % len) * (n % len) % len;
  const double a = 2.0 * std::numbers::pi * static_cast<double>(r) / static_cast<double>(len);
  *re = std::cos(a);
  *im = inverse ? std::sin(a) : -std::sin(a);
}

// ---------------------------------------------------------------------------------------------
// Window functions (opset 17): input size (scalar integer); attributes periodic (default 1) and
// output_datatype. w[n] = a0 - a1 cos(2 pi n / N) + a2 cos(4 pi n / N), N = size when periodic,
// size - 1 when symmetric.

struct WindowCoefficients {
  double a0, a1, a2;
};

Status CheckWindow(const Node& node, int64_t) {
  KILN_RETURN_IF_ERROR(CheckArity(node, 1, 1));
  KILN_ASSIGN_OR_RETURN(int64_t periodic, kernel::IntOr(node, "periodic", 1));
  if (periodic != 0 && periodic != 1) {
    return BadAttr(node, "periodic", std::to_string(periodic), "0 or 1");
  }
  return OutputDataType(node, "a numeric ONNX element type").status();
}

Result<std::vector<TensorType>> InferWindow(const OpContext& ctx) {
  KILN_ASSIGN_OR_RETURN(int64_t size, ScalarInt(ctx, 0, "size"));
  if (size < 0) {
    return Status::InvalidArgument(ctx.where() + ": size " + std::to_string(size) + " is negative");
  }
  KILN_ASSIGN_OR_RETURN(DType dt, OutputDataType(ctx.node(), "a numeric ONNX element type"));
  return std::vector<TensorType>{{dt, {size}}};
}

template <WindowCoefficients kCoef>
Status RunWindow(const OpContext& ctx, std::vector<Tensor>& outputs) {
  const int64_t size = outputs[0].numel();
  const bool periodic = ctx.node().GetInt("periodic", 1) != 0;
  const double n_den = static_cast<double>(periodic ? size : size - 1);
  std::vector<double> w(static_cast<size_t>(size));
  for (int64_t n = 0; n < size; ++n) {
    const double x = n_den > 0 ? 2.0 * std::numbers::pi * static_cast<double>(n) / n_den : 0.0;
    w[static_cast<size_t>(n)] = kCoef.a0 - kCoef.a1 * std::cos(x) + kCoef.a2 * std::cos(2 * x);
  }
  return kernel::StoreDoubles(w, outputs[0]);
}

constexpr WindowCoefficients kHann{0.5, 0.5, 0.0};
constexpr WindowCoefficients kHamming{25.0 / 46.0, 21.0 / 46.0, 0.0};
constexpr WindowCoefficients kBlackman{0.42, 0.5, 0.08};

// ---------------------------------------------------------------------------------------------
// MelWeightMatrix (opset 17): inputs num_mel_bins, dft_length, sample_rate, lower_edge_hertz,
// upper_edge_hertz; output [dft_length / 2 + 1, num_mel_bins] of triangular filters whose edges
// are num_mel_bins + 2 points evenly spaced on the mel scale (mel = 2595 log10(1 + hz / 700)),
// snapped to spectrogram bins, with the ONNX reference's spacing (the mel range over
// num_mel_bins + 2 steps).

Status CheckMel(const Node& node, int64_t) {
  KILN_RETURN_IF_ERROR(CheckArity(node, 5, 5));
  return OutputDataType(node, "a numeric ONNX element type").status();
}

Result<std::vector<TensorType>> InferMel(const OpContext& ctx) {
  KILN_ASSIGN_OR_RETURN(int64_t bins, ScalarInt(ctx, 0, "num_mel_bins"));
  KILN_ASSIGN_OR_RETURN(int64_t dft_length, ScalarInt(ctx, 1, "dft_length"));
  if (bins <= 0 || dft_length <= 0) {
    return Status::InvalidArgument(ctx.where() + ": num_mel_bins " + std::to_string(bins) +
                                   " and dft_length " + std::to_string(dft_length) +
                                   " must be positive");
  }
  KILN_ASSIGN_OR_RETURN(DType dt, OutputDataType(ctx.node(), "a numeric ONNX element type"));
  return std::vector<TensorType>{{dt, {dft_length / 2 + 1, bins}}};
}

Status RunMel(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_ASSIGN_OR_RETURN(int64_t bins, ScalarInt(ctx, 0, "num_mel_bins"));
  KILN_ASSIGN_OR_RETURN(int64_t dft_length, ScalarInt(ctx, 1, "dft_length"));
  KILN_ASSIGN_OR_RETURN(int64_t sample_rate, ScalarInt(ctx, 2, "sample_rate"));
  KILN_ASSIGN_OR_RETURN(double lower, ScalarNumber(ctx, 3, "lower_edge_hertz"));
  KILN_ASSIGN_OR_RETURN(double upper, ScalarNumber(ctx, 4, "upper_edge_hertz"));
  if (sample_rate <= 0) {
    return Status::InvalidArgument(ctx.where() + ": sample_rate " + std::to_string(sample_rate) +
                                   " must be positive");
  }
  const int64_t spectrogram_bins = dft_length / 2 + 1;
  const double low_mel = 2595.0 * std::log10(1.0 + lower / 700.0);
  const double high_mel = 2595.0 * std::log10(1.0 + upper / 700.0);
  const double step = (high_mel - low_mel) / static_cast<double>(bins + 2);
  std::vector<int64_t> edge(static_cast<size_t>(bins + 2));
  for (int64_t i = 0; i < bins + 2; ++i) {
    const double hz =
        700.0 * (std::pow(10.0, (static_cast<double>(i) * step + low_mel) / 2595.0) - 1.0);
    edge[static_cast<size_t>(i)] = static_cast<int64_t>(
        std::floor(static_cast<double>(dft_length + 1) * hz / static_cast<double>(sample_rate)));
  }
  std::vector<double> out(static_cast<size_t>(spectrogram_bins * bins), 0.0);
  auto set = [&](int64_t row, int64_t col, double v) -> Status {
    if (row < 0 || row >= spectrogram_bins) {
      return Status::InvalidArgument(ctx.where() + ": mel filter " + std::to_string(col) +
                                     " reaches spectrogram bin " + std::to_string(row) +
                                     ", outside [0, " + std::to_string(spectrogram_bins) +
                                     ") (upper_edge_hertz above the Nyquist frequency?)");
    }
    out[static_cast<size_t>(row * bins + col)] = v;
    return Status::OK();
  };
  for (int64_t i = 0; i < bins; ++i) {
    const int64_t lo = edge[static_cast<size_t>(i)];
    const int64_t center = edge[static_cast<size_t>(i + 1)];
    const int64_t hi = edge[static_cast<size_t>(i + 2)];
    if (center == lo) {
      KILN_RETURN_IF_ERROR(set(center, i, 1.0));
    } else {
      for (int64_t j = lo; j <= center; ++j) {
        KILN_RETURN_IF_ERROR(
            set(j, i, static_cast<double>(j - lo) / static_cast<double>(center - lo)));
      }
    }
    if (hi > center) {
      for (int64_t j = center; j < hi; ++j) {
        KILN_RETURN_IF_ERROR(
            set(j, i, static_cast<double>(hi - j) / static_cast<double>(hi - center)));
      }
    }
  }
  return kernel::StoreDoubles(out, outputs[0]);
}

// ---------------------------------------------------------------------------------------------
// DFT (opset 17): input [batch, n1, ..., 1|2], optional dft_length (scalar), attributes axis
// (default 1; a signal axis, never the batch or the complex one), inverse, onesided. The signal
// is zero-padded or truncated to dft_length along the axis; onesided keeps the first
// dft_length / 2 + 1 bins; inverse uses e^{+i...} and divides by the length.

struct DftAttrs {
  int64_t axis = 1;
  bool inverse = false;
  bool onesided = false;
};

Result<DftAttrs> ReadDftAttrs(const Node& node) {
  DftAttrs a;
  KILN_ASSIGN_OR_RETURN(a.axis, kernel::IntOr(node, "axis", 1));
  KILN_ASSIGN_OR_RETURN(int64_t inverse, kernel::IntOr(node, "inverse", 0));
  KILN_ASSIGN_OR_RETURN(int64_t onesided, kernel::IntOr(node, "onesided", 0));
  if (inverse != 0 && inverse != 1)
    return BadAttr(node, "inverse", std::to_string(inverse), "0 or 1");
  if (onesided != 0 && onesided != 1) {
    return BadAttr(node, "onesided", std::to_string(onesided), "0 or 1");
  }
  if (inverse && onesided) {
    return Status::Unimplemented(node.Describe() +
                                 ": inverse=1 with onesided=1 is not supported (the inverse of a "
                                 "one-sided spectrum)");
  }
  a.inverse = inverse != 0;
  a.onesided = onesided != 0;
  return a;
}

Status CheckDft(const Node& node, int64_t) {
  KILN_RETURN_IF_ERROR(CheckArity(node, 1, 2));
  return ReadDftAttrs(node).status();
}

// The normalized signal axis and the transform length.
Result<std::pair<int64_t, int64_t>> DftGeometry(const OpContext& ctx, const DftAttrs& a) {
  const Shape& s = ctx.type(0).shape;
  const int64_t rank = static_cast<int64_t>(s.size());
  if (rank < 3 || (s.back() != 1 && s.back() != 2)) {
    return BadInputShape(ctx, 0, "input", "[batch, signal dims..., 1 or 2]");
  }
  int64_t axis = a.axis < 0 ? a.axis + rank : a.axis;
  if (axis < 1 || axis > rank - 2) {
    return BadAttr(ctx.node(), "axis", std::to_string(a.axis),
                   "a signal axis in [1, " + std::to_string(rank - 2) + "]");
  }
  int64_t len = s[static_cast<size_t>(axis)];
  if (ctx.present(1)) {
    KILN_ASSIGN_OR_RETURN(len, ScalarInt(ctx, 1, "dft_length"));
    if (len <= 0) {
      return Status::InvalidArgument(ctx.where() + ": dft_length " + std::to_string(len) +
                                     " must be positive");
    }
  }
  return std::make_pair(axis, len);
}

Result<std::vector<TensorType>> InferDft(const OpContext& ctx) {
  KILN_RETURN_IF_ERROR(kernel::RequireFloatInput(ctx, 0));
  KILN_ASSIGN_OR_RETURN(DftAttrs a, ReadDftAttrs(ctx.node()));
  KILN_ASSIGN_OR_RETURN(auto geo, DftGeometry(ctx, a));
  Shape out = ctx.type(0).shape;
  out[static_cast<size_t>(geo.first)] = a.onesided ? geo.second / 2 + 1 : geo.second;
  out.back() = 2;
  return std::vector<TensorType>{{ctx.type(0).dtype, out}};
}

Status RunDft(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_ASSIGN_OR_RETURN(DftAttrs a, ReadDftAttrs(ctx.node()));
  KILN_ASSIGN_OR_RETURN(auto geo, DftGeometry(ctx, a));
  const auto [axis, len] = geo;
  const Shape& s = ctx.in(0).shape();
  const int64_t comps = s.back();
  const int64_t in_len = s[static_cast<size_t>(axis)];
  const int64_t out_len = outputs[0].dim(axis);
  // Layout [outer, axis, inner, comps].
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= s[static_cast<size_t>(d)];
  for (int64_t d = axis + 1; d < static_cast<int64_t>(s.size()) - 1; ++d)
    inner *= s[static_cast<size_t>(d)];
  const std::vector<double> x = kernel::ToDoubles(ctx.in(0));
  std::vector<double> y(static_cast<size_t>(outer * out_len * inner * 2), 0.0);
  const int64_t used = std::min(in_len, len);
  const double scale = a.inverse ? 1.0 / static_cast<double>(len) : 1.0;
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      for (int64_t k = 0; k < out_len; ++k) {
        double re = 0, im = 0;
        for (int64_t n = 0; n < used; ++n) {
          const size_t at = static_cast<size_t>(((o * in_len + n) * inner + i) * comps);
          const double xr = x[at];
          const double xi = comps == 2 ? x[at + 1] : 0.0;
          double c, sn;
          Twiddle(k, n, len, a.inverse, &c, &sn);
          re += xr * c - xi * sn;
          im += xr * sn + xi * c;
        }
        const size_t to = static_cast<size_t>(((o * out_len + k) * inner + i) * 2);
        y[to] = re * scale;
        y[to + 1] = im * scale;
      }
    }
  }
  return kernel::StoreDoubles(y, outputs[0]);
}

// ---------------------------------------------------------------------------------------------
// STFT (opset 17): signal [batch, length, 1|2], frame_step (scalar), optional window
// [frame_length], optional frame_length (scalar); attribute onesided (default 1). Output
// [batch, frames, bins, 2] with frames = (length - frame_length) / frame_step + 1 and bins
// frame_length / 2 + 1 when onesided (frame_length otherwise).

Status CheckStft(const Node& node, int64_t) {
  KILN_RETURN_IF_ERROR(CheckArity(node, 2, 4));
  KILN_ASSIGN_OR_RETURN(int64_t onesided, kernel::IntOr(node, "onesided", 1));
  if (onesided != 0 && onesided != 1) {
    return BadAttr(node, "onesided", std::to_string(onesided), "0 or 1");
  }
  return Status::OK();
}

struct StftGeometry {
  int64_t step = 0, frame_length = 0, frames = 0, bins = 0;
};

Result<StftGeometry> ReadStft(const OpContext& ctx) {
  const Shape& s = ctx.type(0).shape;
  if (s.size() != 3 || (s[2] != 1 && s[2] != 2)) {
    return BadInputShape(ctx, 0, "signal", "[batch, signal_length, 1 or 2]");
  }
  StftGeometry g;
  KILN_ASSIGN_OR_RETURN(g.step, ScalarInt(ctx, 1, "frame_step"));
  if (g.step <= 0) {
    return Status::InvalidArgument(ctx.where() + ": frame_step " + std::to_string(g.step) +
                                   " must be positive");
  }
  int64_t from_window = -1;
  if (ctx.present(2)) {
    if (ctx.type(2).shape.size() != 1) return BadInputShape(ctx, 2, "window", "[frame_length]");
    from_window = ctx.type(2).shape[0];
  }
  if (ctx.present(3)) {
    KILN_ASSIGN_OR_RETURN(g.frame_length, ScalarInt(ctx, 3, "frame_length"));
    if (from_window >= 0 && from_window != g.frame_length) {
      return BadInputShape(ctx, 2, "window",
                           "[" + std::to_string(g.frame_length) + "] (input 3 'frame_length')");
    }
  } else if (from_window >= 0) {
    g.frame_length = from_window;
  } else {
    return Status::InvalidArgument(ctx.where() +
                                   ": needs input 2 ('window') or input 3 ('frame_length')");
  }
  if (g.frame_length <= 0 || g.frame_length > s[1]) {
    return Status::InvalidArgument(ctx.where() + ": frame_length " +
                                   std::to_string(g.frame_length) + " must be in [1, " +
                                   std::to_string(s[1]) + "] (the signal length)");
  }
  g.frames = (s[1] - g.frame_length) / g.step + 1;
  const bool onesided = ctx.node().GetInt("onesided", 1) != 0;
  g.bins = onesided ? g.frame_length / 2 + 1 : g.frame_length;
  return g;
}

Result<std::vector<TensorType>> InferStft(const OpContext& ctx) {
  KILN_RETURN_IF_ERROR(kernel::RequireFloatInput(ctx, 0));
  KILN_ASSIGN_OR_RETURN(StftGeometry g, ReadStft(ctx));
  return std::vector<TensorType>{{ctx.type(0).dtype, {ctx.type(0).shape[0], g.frames, g.bins, 2}}};
}

Status RunStft(const OpContext& ctx, std::vector<Tensor>& outputs) {
  KILN_ASSIGN_OR_RETURN(StftGeometry g, ReadStft(ctx));
  const Shape& s = ctx.in(0).shape();
  const int64_t batch = s[0], length = s[1], comps = s[2];
  const std::vector<double> x = kernel::ToDoubles(ctx.in(0));
  std::vector<double> window(static_cast<size_t>(g.frame_length), 1.0);
  if (ctx.present(2)) window = kernel::ToDoubles(ctx.in(2));
  std::vector<double> y(static_cast<size_t>(batch * g.frames * g.bins * 2));
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t f = 0; f < g.frames; ++f) {
      for (int64_t k = 0; k < g.bins; ++k) {
        double re = 0, im = 0;
        for (int64_t n = 0; n < g.frame_length; ++n) {
          const size_t at = static_cast<size_t>((b * length + f * g.step + n) * comps);
          const double w = window[static_cast<size_t>(n)];
          const double xr = x[at] * w;
          const double xi = comps == 2 ? x[at + 1] * w : 0.0;
          double c, sn;
          Twiddle(k, n, g.frame_length, false, &c, &sn);
          re += xr * c - xi * sn;
          im += xr * sn + xi * c;
        }
        const size_t to = static_cast<size_t>(((b * g.frames + f) * g.bins + k) * 2);
        y[to] = re;
        y[to + 1] = im;
      }
    }
  }
  return kernel::StoreDoubles(y, outputs[0]);
}

}  // namespace

std::vector<OpDef> SignalOpDefs() {
  constexpr int64_t kMax = INT64_MAX;
  return {
      {"HannWindow", "", 17, kMax, CheckWindow, InferWindow, RunWindow<kHann>},
      {"HammingWindow", "", 17, kMax, CheckWindow, InferWindow, RunWindow<kHamming>},
      {"BlackmanWindow", "", 17, kMax, CheckWindow, InferWindow, RunWindow<kBlackman>},
      {"MelWeightMatrix", "", 17, kMax, CheckMel, InferMel, RunMel},
      {"DFT", "", 17, kMax, CheckDft, InferDft, RunDft},
      {"STFT", "", 17, kMax, CheckStft, InferStft, RunStft},
  };
}

}  // namespace kiln
