// The C++ emitter (see emit_cpp.h). A visitor over each Program's kernels writing to a stream.
#include "src/kiln/compile/emit_cpp.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <sstream>

#include "src/kiln/compile/elementwise_table.h"
#include "src/kiln/compile/toolchain.h"
#include "src/kiln/runtime/host.h"

namespace kiln {

extern const char kCellPrologue[];

namespace {

std::string Lit(int64_t v) { return std::to_string(v) + "LL"; }

std::string FloatLit(float f) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%af", static_cast<double>(f));
  if (std::strstr(buf, "inf")) return f > 0 ? "INFINITY" : "(-INFINITY)";
  if (std::strstr(buf, "nan")) return "NAN";
  return buf;
}

std::string DoubleLit(double d) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%a", d);
  if (std::strstr(buf, "inf")) return d > 0 ? "((double)INFINITY)" : "((double)-INFINITY)";
  if (std::strstr(buf, "nan")) return "((double)NAN)";
  return buf;
}

// A C string literal for arbitrary text (used for node specs and the describe JSON).
std::string CString(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c >= 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\%03o", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

std::string ValueLiteral(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::kFloat32: return FloatLit(t.data<float>()[i]);
    case DType::kInt64: return Lit(t.data<int64_t>()[i]);
    case DType::kFloat64: return DoubleLit(t.data<double>()[i]);
    // Unsigned literals: a value past the signed range must not read as a negative number.
    case DType::kUInt32: return std::to_string(t.data<uint32_t>()[i]) + "u";
    case DType::kUInt64: return std::to_string(t.data<uint64_t>()[i]) + "ull";
    default: return std::to_string(t.GetAsInt64(i));
  }
}

nlohmann::json SpecJson(const Buffer& b) {
  nlohmann::json j{{"name", b.name}, {"dtype", DTypeName(b.type.dtype)}, {"shape", b.type.shape}};
  if (b.dynamic) j["dynamic"] = true;  // shape known only at run time (kiln_dynamic_output)
  return j;
}

class EntryEmitter {
 public:
  EntryEmitter(const Program& p, int index, const EmitOptions& options, std::ostream& os)
      : p_(p), idx_(index), opt_(options), os_(os) {}

  Status Emit() {
    const std::string e = "kiln_e" + std::to_string(idx_);
    // S1: structural constants (and a baked weight, test only).
    for (const Buffer& b : p_.buffers) {
      if (b.kind == Buffer::Kind::kConst) EmitArray(e + "_c" + std::to_string(b.index), b.value);
      if (b.kind == Buffer::Kind::kWeight && b.name == opt_.bake_weight_for_test &&
          opt_.baked_value.valid()) {
        EmitArray(e + "_baked" + std::to_string(b.index), opt_.baked_value);
      }
    }
    // S2: reference-op specs.
    std::vector<std::string> specs;
    for (const Kernel& k : p_.kernels) {
      if (k.kind != Kernel::Kind::kReference) continue;
      std::vector<TensorType> in_types, out_types;
      std::vector<bool> present;
      for (int id : k.inputs) {
        present.push_back(id >= 0);
        in_types.push_back(id >= 0 ? p_.buffers[static_cast<size_t>(id)].type : TensorType{});
      }
      for (int id : k.outputs) out_types.push_back(p_.buffers[static_cast<size_t>(id)].type);
      KILN_ASSIGN_OR_RETURN(nlohmann::json spec,
                            NodeSpecJson(k.node, k.opset, in_types, present, out_types));
      for (size_t j = 0; j < k.outputs.size(); ++j) {
        if (Buf(k.outputs[j]).dynamic) spec["outputs"][j]["dynamic"] = true;
      }
      specs.push_back(spec.dump());
    }
    os_ << "static const char* const " << e << "_specs[] = {";
    for (const auto& s : specs) os_ << "\n    " << CString(s) << ",";
    os_ << "\n    nullptr};\n";
    os_ << "extern \"C\" KILN_HIDDEN uint32_t " << e << "_num_ops() { return " << specs.size()
        << "; }\n";
    os_ << "extern \"C\" KILN_HIDDEN const char* const* " << e << "_op_specs() { return " << e
        << "_specs; }\n\n";
    KILN_RETURN_IF_ERROR(EmitInit(e));
    // S3: run.
    os_ << "extern \"C\" KILN_HIDDEN int " << e
        << "_run(kiln_cell_entry* E, const void* const* in, void* const* out, char* ws) {\n";
    os_ << "  const kiln_host_api* H = E->host;\n  (void)H; (void)in; (void)out; (void)ws;\n";
    for (const Buffer& b : p_.buffers) EmitPointer(b, e);
    int op_index = 0, conv_index = 0;
    for (size_t k = 0; k < p_.kernels.size(); ++k) {
      const Kernel& kern = p_.kernels[k];
      os_ << "  // kernel " << k << ": " << kern.label << "\n  {\n";
      switch (kern.kind) {
        case Kernel::Kind::kFused: KILN_RETURN_IF_ERROR(EmitFused(kern)); break;
        case Kernel::Kind::kMatMul:
          KILN_RETURN_IF_ERROR(EmitMatMul(kern));
          KILN_RETURN_IF_ERROR(EmitEpilogue(kern));
          break;
        case Kernel::Kind::kGemm:
          KILN_RETURN_IF_ERROR(EmitGemm(kern));
          KILN_RETURN_IF_ERROR(EmitEpilogue(kern));
          break;
        case Kernel::Kind::kConv:
          KILN_RETURN_IF_ERROR(EmitConv(kern, &conv_index));
          KILN_RETURN_IF_ERROR(EmitEpilogue(kern));
          break;
        case Kernel::Kind::kSoftmax: KILN_RETURN_IF_ERROR(EmitSoftmax(kern)); break;
        case Kernel::Kind::kNorm: KILN_RETURN_IF_ERROR(EmitNorm(kern)); break;
        case Kernel::Kind::kTranspose: KILN_RETURN_IF_ERROR(EmitTranspose(kern)); break;
        case Kernel::Kind::kConcat: EmitConcat(kern); break;
        case Kernel::Kind::kGather: EmitGather(kern); break;
        case Kernel::Kind::kResize: EmitResize(kern); break;
        case Kernel::Kind::kReference: EmitReference(kern, op_index++); break;
      }
      os_ << "  }\n";
    }
    if (opt_.test_output_scale != 1.0) {
      for (int id : p_.outputs) {
        if (Buf(id).type.dtype != DType::kFloat32 || Buf(id).dynamic) continue;
        os_ << "  for (int64_t i = 0; i < " << Lit(NumElements(Buf(id).type.shape)) << "; ++i) "
            << B(id) << "[i] *= " << FloatLit(static_cast<float>(opt_.test_output_scale))
            << ";  // TEST ONLY\n";
      }
    }
    os_ << "  return KILN_CELL_OK;\n}\n\n";
    return Status::OK();
  }

 private:
  std::string B(int id) const { return "b" + std::to_string(id); }
  const Buffer& Buf(int id) const { return p_.buffers[static_cast<size_t>(id)]; }

  void EmitArray(const std::string& name, const Tensor& t) {
    const int64_t n = std::max<int64_t>(t.numel(), 1);
    os_ << "alignas(64) static const " << CType(t.dtype()) << " " << name << "[" << n << "] = {";
    for (int64_t i = 0; i < t.numel(); ++i) {
      os_ << (i % 8 == 0 ? "\n    " : " ") << ValueLiteral(t, i) << ",";
    }
    if (t.numel() == 0) os_ << "0";
    os_ << "};\n";
  }

  void EmitPointer(const Buffer& b, const std::string& e) {
    const char* ct = CType(b.type.dtype);
    os_ << "  " << ct << "* " << B(b.id) << " = (" << ct << "*)";
    if (b.alias_of >= 0) {
      os_ << B(b.alias_of);
    } else if (b.kind == Buffer::Kind::kInput) {
      os_ << "in[" << b.index << "]";
    } else if (b.kind == Buffer::Kind::kWeight) {
      if (b.name == opt_.bake_weight_for_test && opt_.baked_value.valid()) {
        os_ << e << "_baked" << b.index;
      } else {
        os_ << "E->w[" << b.index << "]";
      }
    } else if (b.kind == Buffer::Kind::kConst) {
      os_ << e << "_c" << b.index;
    } else if (b.output_slot >= 0) {
      os_ << "out[" << b.output_slot << "]";
    } else if (b.offset >= 0) {
      os_ << "(ws + " << b.offset << ")";
    } else {
      os_ << "0 /* unused */";
    }
    os_ << ";\n";
    // Aliases must be declared after their roots: buffers are created in that order.
  }

  // Loop nest over `shape` with per-operand element strides; adjacent dims merged where every
  // operand allows, so the innermost loop is as long and contiguous as possible.
  struct LoopNest {
    Shape dims;
    std::vector<std::vector<int64_t>> strides;  // per operand, per dim
  };
  static LoopNest Merge(const Shape& shape, const std::vector<std::vector<int64_t>>& strides) {
    LoopNest ln;
    std::vector<size_t> keep;
    for (size_t d = 0; d < shape.size(); ++d) {
      if (shape[d] != 1) keep.push_back(d);
    }
    ln.strides.assign(strides.size(), {});
    for (size_t d : keep) {
      const bool can_merge = !ln.dims.empty() && [&] {
        for (size_t o = 0; o < strides.size(); ++o) {
          if (ln.strides[o].back() != strides[o][d] * shape[d]) return false;
        }
        return true;
      }();
      if (can_merge) {
        ln.dims.back() *= shape[d];
        for (size_t o = 0; o < strides.size(); ++o) ln.strides[o].back() = strides[o][d];
      } else {
        ln.dims.push_back(shape[d]);
        for (size_t o = 0; o < strides.size(); ++o) ln.strides[o].push_back(strides[o][d]);
      }
    }
    return ln;
  }

  // GEMMs with at most this many multiply-adds run single-threaded (team wakeup costs more).
  static constexpr int64_t kSmallGemm = int64_t{1} << 16;
  std::string GemmThreads(int64_t m, int64_t n, int64_t k) const {
    return m * n * k <= kSmallGemm ? "1" : "E->threads";
  }
  // Outermost loops with at least this many elements of work run on the host's thread team.
  static constexpr int64_t kParallelWork = int64_t{1} << 15;
  struct Range {
    std::string lo, hi;
    bool par = false;
    int64_t n = 0;
    bool open = false;  // ParOpen emitted the body's opening
  };
  // Opens an outermost loop range [0, n): plain bounds, or, when the work is big enough to
  // split, a lambda over a chunk [kiln_lo, kiln_hi) that ParClose hands to parallel_for.
  // Either way the loop body becomes a function of its own (see kiln_par_tramp).
  Range ParOpen(int64_t n, int64_t work) {
    Range r{"kiln_lo", "kiln_hi", n >= 2 && work >= kParallelWork, n, true};
    os_ << "    auto kiln_body = [&](int64_t kiln_lo, int64_t kiln_hi) {\n";
    return r;
  }
  void ParClose(const Range& r) {
    if (!r.open) return;
    os_ << "    };\n    KILN_TRY(kiln_par(H, " << (r.par ? "E->threads" : "1") << ", " << Lit(r.n)
        << ", kiln_body));\n";
  }

  Status EmitFused(const Kernel& k) {
    const Shape& shape = Buf(k.outputs[0]).type.shape;
    for (int o : k.outputs) {
      if (Buf(o).type.shape != shape) {
        return Status::Internal("fused kernel " + k.label + " has outputs of different shapes");
      }
    }
    std::vector<std::vector<int64_t>> strides;
    for (int in : k.inputs) strides.push_back(BroadcastStrides(Buf(in).type.shape, shape));
    for (size_t i = 0; i < k.outputs.size(); ++i) strides.push_back(ContiguousStrides(shape));
    const LoopNest ln = Merge(shape, strides);
    const size_t depth = ln.dims.size();
    std::string indent = "    ";
    Range r;
    for (size_t d = 0; d < depth; ++d) {
      if (d == 0) r = ParOpen(ln.dims[0], NumElements(shape));
      if (d + 1 == depth) os_ << indent << "#pragma GCC ivdep\n";
      os_ << indent << "for (int64_t i" << d << " = " << (d == 0 ? r.lo : "0") << "; i" << d
          << " < " << (d == 0 ? r.hi : Lit(ln.dims[d])) << "; ++i" << d << ") {\n";
      indent += "  ";
    }
    auto offset = [&](size_t operand) {
      std::string s;
      for (size_t d = 0; d < depth; ++d) {
        const int64_t st = ln.strides[operand][d];
        if (st == 0) continue;
        s += (s.empty() ? "" : " + ") + std::string("i") + std::to_string(d) +
             (st == 1 ? "" : " * " + Lit(st));
      }
      return s.empty() ? std::string("0") : s;
    };
    std::vector<std::string> in_names;
    for (size_t j = 0; j < k.inputs.size(); ++j) {
      const std::string v = "a" + std::to_string(j);
      os_ << indent << "const " << CType(Buf(k.inputs[j]).type.dtype) << " " << v << " = "
          << B(k.inputs[j]) << "[" << offset(j) << "];\n";
      in_names.push_back(v);
    }
    for (size_t x = 0; x < k.exprs.size(); ++x) {
      const Expr& e = k.exprs[x];
      std::vector<std::string> ops;
      for (int o : e.operands) {
        if (o == INT32_MIN) {
          ops.push_back("");
        } else {
          ops.push_back(o >= 0 ? "v" + std::to_string(o) : in_names[static_cast<size_t>(-o - 1)]);
        }
      }
      os_ << indent << "const " << CType(e.dtype) << " v" << x << " = " << FormatExpr(e, ops)
          << ";\n";
    }
    for (size_t i = 0; i < k.outputs.size(); ++i) {
      os_ << indent << B(k.outputs[i]) << "[" << offset(k.inputs.size() + i) << "] = v"
          << k.output_exprs[i] << ";\n";
    }
    for (size_t d = 0; d < depth; ++d) {
      indent.resize(indent.size() - 2);
      os_ << indent << "}\n";
    }
    ParClose(r);
    return Status::OK();
  }

  // The epilogue as a fused loop over the output, in place: operand -1 (the library's result)
  // becomes fused input 0, the output buffer itself.
  Status EmitEpilogue(const Kernel& k) {
    if (k.epilogue.empty()) return Status::OK();
    Kernel f;
    f.kind = Kernel::Kind::kFused;
    f.label = "epilogue";
    f.inputs = {k.outputs[0]};
    std::map<int, int> slot;  // K input index -> fused input slot
    f.exprs = k.epilogue;
    for (Expr& e : f.exprs) {
      for (int& o : e.operands) {
        if (o == INT32_MIN || o >= 0) continue;
        if (o == -1) {
          o = -1;  // fused input 0
          continue;
        }
        const int j = -o - 2;
        auto it = slot.find(j);
        if (it == slot.end()) {
          it = slot.emplace(j, static_cast<int>(f.inputs.size())).first;
          f.inputs.push_back(k.inputs[static_cast<size_t>(j)]);
        }
        o = -(it->second + 1);
      }
    }
    f.outputs = {k.outputs[0]};
    f.output_exprs = {k.epilogue_out};
    os_ << "    {\n";  // a scope of its own: the kernel call above may have declared a body
    KILN_RETURN_IF_ERROR(EmitFused(f));
    os_ << "    }\n";
    return Status::OK();
  }

  Status EmitMatMul(const Kernel& k) {
    Shape a = Buf(k.inputs[0]).type.shape, b = Buf(k.inputs[1]).type.shape;
    if (a.size() == 1) a.insert(a.begin(), 1);
    if (b.size() == 1) b.push_back(1);
    const int64_t M = a[a.size() - 2], K = a.back(), N = b.back();
    Shape ab(a.begin(), a.end() - 2), bb(b.begin(), b.end() - 2);
    KILN_ASSIGN_OR_RETURN(Shape batch, BroadcastShapes(ab, bb));
    const int64_t nb = NumElements(batch);
    const std::string A = B(k.inputs[0]), Bm = B(k.inputs[1]), C = B(k.outputs[0]);
    const bool b_shared = NumElements(bb) == 1;
    if (b_shared && ab == batch) {  // one GEMM over all batch rows
      os_ << "    KILN_TRY(H->sgemm(0, 0, " << Lit(nb * M) << ", " << Lit(N) << ", " << Lit(K)
          << ", 1.0f, " << A << ", " << Lit(K) << ", " << Bm << ", " << Lit(N) << ", 0.0f, " << C
          << ", " << Lit(N) << ", " << GemmThreads(nb * M, N, K) << "));\n";
      return Status::OK();
    }
    const auto sa = BroadcastStrides(ab, batch), sb = BroadcastStrides(bb, batch);
    const auto sc = ContiguousStrides(batch);
    os_ << "    static const int64_t offs[" << std::max<int64_t>(nb, 1) * 2 << "] = {";
    for (int64_t i = 0; i < nb; ++i) {
      int64_t rem = i, oa = 0, ob = 0;
      for (size_t d = 0; d < batch.size(); ++d) {
        const int64_t idx = rem / sc[d];
        rem %= sc[d];
        oa += idx * sa[d];
        ob += idx * sb[d];
      }
      os_ << Lit(oa * M * K) << ", " << Lit(ob * K * N) << ", ";
    }
    os_ << "};\n";
    // Small GEMMs of a batch (attention heads) run one per thread of the host's team, each
    // single-threaded; large ones are threaded inside the library.
    const bool per_thread = M * N * K <= kSmallGemm;
    os_ << "    int kiln_rc = 0;\n"
        << "    auto kiln_body = [&](int64_t kiln_lo, int64_t kiln_hi) {\n"
        << "      for (int64_t i = kiln_lo; i < kiln_hi; ++i) {\n"
        << "        const int rc = H->sgemm(0, 0, " << Lit(M) << ", " << Lit(N) << ", " << Lit(K)
        << ", 1.0f, " << A << " + offs[2 * i], " << Lit(K) << ", " << Bm << " + offs[2 * i + 1], "
        << Lit(N) << ", 0.0f, " << C << " + i * " << Lit(M * N) << ", " << Lit(N) << ", "
        << (per_thread ? "1" : "E->threads") << ");\n"
        << "        if (rc) __atomic_store_n(&kiln_rc, rc, __ATOMIC_RELAXED);\n"
        << "      }\n    };\n";
    if (per_thread) {
      os_ << "    KILN_TRY(kiln_par(H, E->threads, " << Lit(nb) << ", kiln_body));\n";
    } else {
      os_ << "    kiln_body(0, " << Lit(nb) << ");\n";
    }
    os_ << "    if (kiln_rc) return kiln_rc;\n";
    return Status::OK();
  }

  Status EmitGemm(const Kernel& k) {
    const Node& n = k.node;
    const int64_t ta = n.GetInt("transA", 0), tb = n.GetInt("transB", 0);
    const float alpha = n.GetFloat("alpha", 1.0f);
    float beta = n.GetFloat("beta", 1.0f);
    const Shape& a = Buf(k.inputs[0]).type.shape;
    const Shape& b = Buf(k.inputs[1]).type.shape;
    const int64_t M = ta ? a[1] : a[0], K = ta ? a[0] : a[1], N = tb ? b[0] : b[1];
    const std::string Y = B(k.outputs[0]);
    const bool has_c = n.HasInput(2) && beta != 0.0f;
    if (has_c) {
      const Shape out = {M, N};
      const auto st = BroadcastStrides(Buf(k.inputs[2]).type.shape, out);
      os_ << "    for (int64_t i = 0; i < " << Lit(M) << "; ++i)\n"
          << "      for (int64_t j = 0; j < " << Lit(N) << "; ++j) " << Y << "[i * " << Lit(N)
          << " + j] = " << B(k.inputs[2]) << "[i * " << Lit(st[0]) << " + j * " << Lit(st[1])
          << "];\n";
    } else {
      beta = 0.0f;
    }
    os_ << "    KILN_TRY(H->sgemm(" << ta << ", " << tb << ", " << Lit(M) << ", " << Lit(N) << ", "
        << Lit(K) << ", " << FloatLit(alpha) << ", " << B(k.inputs[0]) << ", " << Lit(a[1])
        << ", " << B(k.inputs[1]) << ", " << Lit(b[1]) << ", " << FloatLit(beta) << ", " << Y
        << ", " << Lit(N) << ", " << GemmThreads(M, N, K) << "));\n";
    return Status::OK();
  }

  Status ConvDesc(const Kernel& k, std::string* desc) const {
    const Node& n = k.node;
    const Shape& x = Buf(k.inputs[0]).type.shape;
    const Shape& w = Buf(k.inputs[1]).type.shape;
    const std::vector<int64_t> strides = n.GetInts("strides", {1, 1});
    const std::vector<int64_t> dil = n.GetInts("dilations", {1, 1});
    std::vector<int64_t> pads = n.GetInts("pads", {0, 0, 0, 0});
    const std::string auto_pad = n.GetString("auto_pad", "NOTSET");
    if (strides.size() != 2 || dil.size() != 2 || pads.size() != 4) {
      return Status::InvalidArgument(n.Describe() + ": 2-D conv attributes have wrong lengths");
    }
    if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      for (int d = 0; d < 2; ++d) {
        const int64_t in = x[2 + d], kk = w[2 + d];
        const int64_t out = (in + strides[d] - 1) / strides[d];
        const int64_t total =
            std::max<int64_t>(0, (out - 1) * strides[d] + (kk - 1) * dil[d] + 1 - in);
        const int64_t small = total / 2, big = total - small;
        pads[d] = auto_pad == "SAME_UPPER" ? small : big;
        pads[d + 2] = total - pads[d];
      }
    } else if (auto_pad == "VALID") {
      pads = {0, 0, 0, 0};
    }
    const int64_t group = n.GetInt("group", 1);
    std::ostringstream d;
    d << "{" << x[0] << ", " << x[1] << ", " << x[2] << ", " << x[3] << ", " << w[0] << ", " << w[2]
      << ", " << w[3] << ", " << strides[0] << ", " << strides[1] << ", " << pads[0] << ", "
      << pads[1] << ", " << pads[2] << ", " << pads[3] << ", " << dil[0] << ", " << dil[1] << ", "
      << group << ", " << k.post_op << ", " << (k.conv_sum ? 1 : 0) << ", " << k.conv_layout
      << ", 0}";
    *desc = d.str();
    return Status::OK();
  }

  // The convolution's weights as an expression valid in the entry's init (bound weight or
  // embedded constant), or "" when they are computed at run time (no prepared kernel then).
  std::string BoundWeight(const Kernel& k, const std::string& e) const {
    const Buffer& w = Buf(p_.Root(k.inputs[1]));
    if (w.kind == Buffer::Kind::kWeight) {
      if (w.name == opt_.bake_weight_for_test && opt_.baked_value.valid()) {
        return e + "_baked" + std::to_string(w.index);
      }
      return "E->w[" + std::to_string(w.index) + "]";
    }
    if (w.kind == Buffer::Kind::kConst) return e + "_c" + std::to_string(w.index);
    return "";
  }

  Status EmitConv(const Kernel& k, int* conv_index) {
    std::string desc;
    KILN_RETURN_IF_ERROR(ConvDesc(k, &desc));
    const bool has_bias = k.node.HasInput(2);
    const Shape& y = Buf(k.outputs[0]).type.shape;
    const std::string Y = B(k.outputs[0]);
    if (k.conv_sum) {
      // The residual may already live in the output's memory (planned in place).
      os_ << "    if ((const void*)" << Y << " != (const void*)" << B(k.inputs.back())
          << ") memcpy(" << Y << ", " << B(k.inputs.back()) << ", " << NumElements(y) * 4
          << ");\n";
    }
    const std::string bias = has_bias ? B(k.inputs[2]) : std::string("NULL");
    if (!BoundWeight(k, "").empty()) {
      os_ << "    KILN_TRY(H->conv2d_run(E->convs[" << (*conv_index)++ << "], " << B(k.inputs[0])
          << ", " << bias << ", " << Y << "));\n";
      return Status::OK();
    }
    os_ << "    static const kiln_conv2d_desc d = " << desc << ";\n";
    os_ << "    KILN_TRY(H->conv2d(&d, " << B(k.inputs[0]) << ", " << B(k.inputs[1]) << ", " << bias
        << ", " << Y << ", E->threads));\n";
    return Status::OK();
  }

  // The entry's bind-time preparation: one prepared convolution per conv with bound weights.
  Status EmitInit(const std::string& e) {
    std::vector<std::pair<std::string, std::string>> convs;  // desc, weight expression
    std::vector<int> has_bias;
    for (const Kernel& k : p_.kernels) {
      if (k.kind != Kernel::Kind::kConv) continue;
      const std::string w = BoundWeight(k, e);
      if (w.empty()) continue;
      std::string desc;
      KILN_RETURN_IF_ERROR(ConvDesc(k, &desc));
      convs.emplace_back(desc, w);
      has_bias.push_back(k.node.HasInput(2) ? 1 : 0);
    }
    os_ << "extern \"C\" KILN_HIDDEN int " << e << "_init(kiln_cell_entry* E) {\n";
    if (convs.empty()) {
      os_ << "  (void)E;\n  return KILN_CELL_OK;\n}\n\n";
      return Status::OK();
    }
    os_ << "  static const kiln_conv2d_desc d[" << convs.size() << "] = {";
    for (const auto& c : convs) os_ << "\n      " << c.first << ",";
    os_ << "};\n";
    os_ << "  E->convs = (void**)calloc(" << convs.size() << ", sizeof(void*));\n"
        << "  if (!E->convs) return KILN_CELL_RESOURCE_EXHAUSTED;\n";
    for (size_t i = 0; i < convs.size(); ++i) {
      os_ << "  E->num_convs = " << i + 1 << ";\n"
          << "  KILN_TRY(E->host->conv2d_prepare(&d[" << i << "], (const float*)" << convs[i].second
          << ", " << has_bias[i] << ", E->threads, &E->convs[" << i << "]));\n";
    }
    os_ << "  return KILN_CELL_OK;\n}\n\n";
    return Status::OK();
  }

  Status EmitSoftmax(const Kernel& k) {
    const Shape& s = Buf(k.inputs[0]).type.shape;
    const int64_t rank = static_cast<int64_t>(s.size());
    int64_t axis = k.node.GetInt("axis", k.opset >= 13 ? -1 : 1);
    if (axis < 0) axis += rank;
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < axis; ++d) outer *= s[d];
    for (int64_t d = axis + 1; d < rank; ++d) inner *= s[d];
    const int64_t n = s[axis];
    const std::string X = B(k.inputs[0]), Y = B(k.outputs[0]);
    if (inner == 1) {  // contiguous rows: vectorized lane reductions
      const Range r = ParOpen(outer, outer * n);
      os_ << "    for (int64_t o = " << r.lo << "; o < " << r.hi << "; ++o) {\n"
          << "      const float* x = " << X << " + o * " << Lit(n) << ";\n"
          << "      float* y = " << Y << " + o * " << Lit(n) << ";\n"
          << "      const float m = kiln_row_max(x, " << Lit(n) << ");\n"
          << "      const float inv = 1.0f / kiln_row_exp_sum(x, y, " << Lit(n) << ", m);\n"
          << "      #pragma GCC ivdep\n"
          << "      for (int64_t i = 0; i < " << Lit(n) << "; ++i) y[i] *= inv;\n    }\n";
      ParClose(r);
      return Status::OK();
    }
    const Range r = ParOpen(outer, outer * n * inner);
    os_ << "    for (int64_t o = " << r.lo << "; o < " << r.hi << "; ++o)\n"
        << "    for (int64_t j = 0; j < " << Lit(inner) << "; ++j) {\n"
        << "      const float* x = " << X << " + o * " << Lit(n * inner) << " + j;\n"
        << "      float* y = " << Y << " + o * " << Lit(n * inner) << " + j;\n"
        << "      float m = -INFINITY;\n"
        << "      for (int64_t i = 0; i < " << Lit(n) << "; ++i) m = x[i * " << Lit(inner)
        << "] > m ? x[i * " << Lit(inner) << "] : m;\n"
        << "      float sum = 0.0f;\n"
        << "      for (int64_t i = 0; i < " << Lit(n) << "; ++i) { const float e = kiln_exp(x[i * "
        << Lit(inner) << "] - m); y[i * " << Lit(inner) << "] = e; sum += e; }\n"
        << "      const float inv = 1.0f / sum;\n"
        << "      for (int64_t i = 0; i < " << Lit(n) << "; ++i) y[i * " << Lit(inner)
        << "] *= inv;\n    }\n";
    ParClose(r);
    return Status::OK();
  }

  Status EmitNorm(const Kernel& k) {
    const Shape& s = Buf(k.inputs[0]).type.shape;
    const std::string X = B(k.inputs[0]), Y = B(k.outputs[0]);
    const std::string scale = B(k.inputs[1]);
    const bool has_bias = k.inputs.size() > 2;
    const std::string bias = has_bias ? B(k.inputs[2]) : "";
    const float eps = k.node.GetFloat("epsilon", 1e-5f);
    int64_t outer, inner;
    bool per_channel;  // InstanceNorm: scale/bias by channel; LayerNorm: by position
    if (k.node.op_type == "InstanceNormalization") {
      outer = s[0] * s[1];
      inner = NumElements(s) / std::max<int64_t>(outer, 1);
      per_channel = true;
    } else {
      int64_t axis = k.node.GetInt("axis", -1);
      if (axis < 0) axis += static_cast<int64_t>(s.size());
      outer = 1;
      for (int64_t d = 0; d < axis; ++d) outer *= s[d];
      inner = NumElements(s) / std::max<int64_t>(outer, 1);
      per_channel = false;
    }
    const std::string C = per_channel ? Lit(s[1]) : "1";
    const Range r = ParOpen(outer, outer * inner);
    os_ << "    for (int64_t o = " << r.lo << "; o < " << r.hi << "; ++o) {\n"
        << "      const float* x = " << X << " + o * " << Lit(inner) << ";\n"
        << "      float* y = " << Y << " + o * " << Lit(inner) << ";\n"
        << "      double mean, var;\n"
        << "      kiln_row_moments(x, " << Lit(inner) << ", &mean, &var);\n"
        << "      const float inv = (float)(1.0 / sqrt(var + (double)" << FloatLit(eps)
        << "));\n"
        << "      const float fm = (float)mean;\n";
    if (per_channel) {
      os_ << "      const int64_t c = o % " << C << ";\n"
          << "      const float g = " << scale << "[c] * inv, bb = "
          << (has_bias ? bias + "[c]" : std::string("0.0f")) << ";\n"
          << "      #pragma GCC ivdep\n"
          << "      for (int64_t i = 0; i < " << Lit(inner)
          << "; ++i) y[i] = (x[i] - fm) * g + bb;\n";
    } else {
      os_ << "      #pragma GCC ivdep\n"
          << "      for (int64_t i = 0; i < " << Lit(inner) << "; ++i) y[i] = (x[i] - fm) * inv * "
          << scale << "[i]" << (has_bias ? " + " + bias + "[i]" : std::string()) << ";\n";
    }
    os_ << "    }\n";
    ParClose(r);
    return Status::OK();
  }

  Status EmitTranspose(const Kernel& k) {
    const Shape& in = Buf(k.inputs[0]).type.shape;
    const Shape& out = Buf(k.outputs[0]).type.shape;
    std::vector<int64_t> perm = k.node.GetInts("perm", {});
    if (perm.empty()) {
      for (int64_t d = static_cast<int64_t>(in.size()) - 1; d >= 0; --d) perm.push_back(d);
    }
    const auto in_strides = ContiguousStrides(in);
    std::vector<int64_t> src(out.size());
    for (size_t d = 0; d < out.size(); ++d) src[d] = in_strides[static_cast<size_t>(perm[d])];
    const LoopNest ln = Merge(out, {src, ContiguousStrides(out)});
    std::string indent = "    ";
    Range r;
    for (size_t d = 0; d < ln.dims.size(); ++d) {
      if (d == 0) r = ParOpen(ln.dims[0], NumElements(out));
      os_ << indent << "for (int64_t i" << d << " = " << (d == 0 ? r.lo : "0") << "; i" << d
          << " < " << (d == 0 ? r.hi : Lit(ln.dims[d])) << "; ++i" << d << ")\n";
      indent += "  ";
    }
    auto off = [&](size_t o) {
      std::string s;
      for (size_t d = 0; d < ln.dims.size(); ++d) {
        s += (s.empty() ? "" : " + ") + std::string("i") + std::to_string(d) + " * " +
             Lit(ln.strides[o][d]);
      }
      return s.empty() ? std::string("0") : s;
    };
    os_ << indent << B(k.outputs[0]) << "[" << off(1) << "] = " << B(k.inputs[0]) << "[" << off(0)
        << "];\n";
    ParClose(r);
    return Status::OK();
  }

  // Concat: per input, one contiguous block per outer index copied to its offset in the row.
  void EmitConcat(const Kernel& k) {
    const Shape& out = Buf(k.outputs[0]).type.shape;
    const int64_t rank = static_cast<int64_t>(out.size());
    int64_t axis = k.node.GetInt("axis", 0);
    if (axis < 0) axis += rank;
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < axis; ++d) outer *= out[static_cast<size_t>(d)];
    for (int64_t d = axis + 1; d < rank; ++d) inner *= out[static_cast<size_t>(d)];
    const int64_t row = out[static_cast<size_t>(axis)] * inner;
    const int64_t esize = static_cast<int64_t>(DTypeSize(Buf(k.outputs[0]).type.dtype));
    int64_t off = 0;
    for (int id : k.inputs) {
      const int64_t block = Buf(id).type.shape[static_cast<size_t>(axis)] * inner;
      if (block > 0 && outer > 0) {
        os_ << "    for (int64_t o = 0; o < " << Lit(outer) << "; ++o) memcpy(" << B(k.outputs[0])
            << " + o * " << Lit(row) << " + " << Lit(off) << ", " << B(id) << " + o * "
            << Lit(block) << ", " << Lit(block * esize) << ");\n";
      }
      off += block;
    }
  }

  // Gather with structural indices (lowering checked they are in range): block copies.
  void EmitGather(const Kernel& k) {
    const Shape& data = Buf(k.inputs[0]).type.shape;
    const Tensor& idx = Buf(p_.Root(k.inputs[1])).value;
    const int64_t rank = static_cast<int64_t>(data.size());
    int64_t axis = k.node.GetInt("axis", 0);
    if (axis < 0) axis += rank;
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < axis; ++d) outer *= data[static_cast<size_t>(d)];
    for (int64_t d = axis + 1; d < rank; ++d) inner *= data[static_cast<size_t>(d)];
    const int64_t dim = data[static_cast<size_t>(axis)], n = idx.numel();
    const int64_t esize = static_cast<int64_t>(DTypeSize(Buf(k.outputs[0]).type.dtype));
    if (n == 0 || outer == 0 || inner == 0) return;
    os_ << "    static const int64_t idx[" << n << "] = {";
    for (int64_t i = 0; i < n; ++i) {
      const int64_t v = idx.GetAsInt64(i);
      os_ << Lit(v < 0 ? v + dim : v) << ", ";
    }
    os_ << "};\n";
    os_ << "    for (int64_t o = 0; o < " << Lit(outer) << "; ++o)\n"
        << "      for (int64_t j = 0; j < " << Lit(n) << "; ++j) memcpy(" << B(k.outputs[0])
        << " + (o * " << Lit(n) << " + j) * " << Lit(inner) << ", " << B(k.inputs[0]) << " + (o * "
        << Lit(dim) << " + idx[j]) * " << Lit(inner) << ", " << Lit(inner * esize) << ");\n";
  }

  // Nearest Resize by integer factors (lowering checked): y[i] = x[i / factor] per axis, one
  // output row (last axis) at a time.
  void EmitResize(const Kernel& k) {
    const Shape& in = Buf(k.inputs[0]).type.shape;
    const Shape& out = Buf(k.outputs[0]).type.shape;
    const size_t r = in.size();
    const auto in_strides = ContiguousStrides(in);
    int64_t rows = 1;
    for (size_t d = 0; d + 1 < r; ++d) rows *= out[d];
    const int64_t ow = out[r - 1], fw = out[r - 1] / in[r - 1];
    const char* ct = CType(Buf(k.outputs[0]).type.dtype);
    const Range rg = ParOpen(rows, rows * ow);
    os_ << "    for (int64_t q = " << rg.lo << "; q < " << rg.hi << "; ++q) {\n"
        << "      int64_t rem = q, src = 0;\n      (void)rem;\n";
    for (size_t d = r - 1; d-- > 0;) {
      os_ << "      { const int64_t i = rem % " << Lit(out[d]) << "; rem /= " << Lit(out[d])
          << "; src += (i / " << Lit(out[d] / in[d]) << ") * " << Lit(in_strides[d]) << "; }\n";
    }
    os_ << "      const " << ct << "* xr = " << B(k.inputs[0]) << " + src;\n"
        << "      " << ct << "* yr = " << B(k.outputs[0]) << " + q * " << Lit(ow) << ";\n"
        << "      for (int64_t j = 0; j < " << Lit(ow) << "; ++j) yr[j] = xr[j / " << Lit(fw)
        << "];\n    }\n";
    ParClose(rg);
  }

  void EmitReference(const Kernel& k, int op_index) {
    os_ << "    const void* ins[" << std::max<size_t>(k.inputs.size(), 1) << "] = {";
    for (int id : k.inputs) os_ << (id >= 0 ? B(id) : std::string("NULL")) << ", ";
    os_ << "};\n    void* outs[" << std::max<size_t>(k.outputs.size(), 1) << "] = {";
    for (int id : k.outputs) os_ << B(id) << ", ";
    os_ << "};\n    KILN_TRY(H->op_run(E->ops[" << op_index
        << "], ins, outs, E->threads));  // reference " << k.node.op_type << "\n";
  }

  const Program& p_;
  int idx_;
  const EmitOptions& opt_;
  std::ostream& os_;
};

}  // namespace

Result<EmittedCell> EmitCell(const std::vector<Program>& entries, const EmitOptions& options) {
  EmittedCell cell;
  std::ostringstream os;
  os << "// Generated by kiln " << kCodegenVersion << " for graph " << options.graph_digest
     << ". Do not edit.\n// " << entries.size() << " entr" << (entries.size() == 1 ? "y" : "ies")
     << "; compile each with -DKILN_ENTRY=<i> and the dispatch with -DKILN_ENTRY=-1.\n";
  os << kCellPrologue << "\n";
  nlohmann::json describe;
  describe["abi_version"] = KILN_CELL_ABI_VERSION;
  describe["codegen_version"] = kCodegenVersion;
  nlohmann::json ents = nlohmann::json::array();
  for (size_t i = 0; i < entries.size(); ++i) {
    const Program& p = entries[i];
    nlohmann::json e;
    e["index"] = i;
    // Always arrays, also for a graph with no runtime inputs (readers iterate them).
    e["inputs"] = nlohmann::json::array();
    e["outputs"] = nlohmann::json::array();
    for (int id : p.inputs) e["inputs"].push_back(SpecJson(p.buffers[static_cast<size_t>(id)]));
    for (size_t o = 0; o < p.outputs.size(); ++o) {
      nlohmann::json s = SpecJson(p.buffers[static_cast<size_t>(p.outputs[o])]);
      s["name"] = p.output_names[o];
      e["outputs"].push_back(s);
    }
    e["constants"] = nlohmann::json::array();
    for (int id : p.weights) e["constants"].push_back(SpecJson(p.buffers[static_cast<size_t>(id)]));
    e["workspace_bytes"] = p.workspace_bytes;
    ents.push_back(e);
    os << "#if !defined(KILN_ENTRY) || KILN_ENTRY == " << i << "\n";
    EntryEmitter em(p, static_cast<int>(i), options, os);
    KILN_RETURN_IF_ERROR(em.Emit());
    os << "#endif  // entry " << i << "\n\n";
  }
  describe["entries"] = ents;
  cell.describe = describe;

  // The exported ABI: declarations of every entry's functions, then dispatch.
  os << "#if !defined(KILN_ENTRY) || KILN_ENTRY < 0\n";
  for (size_t i = 0; i < entries.size(); ++i) {
    os << "extern \"C\" int kiln_e" << i
       << "_run(kiln_cell_entry*, const void* const*, void* const*, char*);\n"
       << "extern \"C\" uint32_t kiln_e" << i << "_num_ops();\n"
       << "extern \"C\" int kiln_e" << i << "_init(kiln_cell_entry*);\n"
       << "extern \"C\" const char* const* kiln_e" << i << "_op_specs();\n";
  }
  os << "static const char kiln_describe_json[] = " << CString(describe.dump()) << ";\n";
  os << "static const uint32_t kiln_num_entries = " << entries.size() << ";\n";
  os << "static const uint32_t kiln_num_constants[] = {";
  for (const Program& p : entries) os << p.weights.size() << ", ";
  os << "0};\nstatic const uint64_t kiln_workspace[] = {";
  for (const Program& p : entries) os << p.workspace_bytes << "ULL, ";
  os << "0};\n";
  os << "typedef int (*kiln_run_fn)(kiln_cell_entry*, const void* const*, void* const*, char*);\n";
  os << "static const kiln_run_fn kiln_runs[] = {";
  for (size_t i = 0; i < entries.size(); ++i) os << "kiln_e" << i << "_run, ";
  os << "0};\nstatic uint32_t (*const kiln_num_ops_fns[])() = {";
  for (size_t i = 0; i < entries.size(); ++i) os << "kiln_e" << i << "_num_ops, ";
  os << "0};\nstatic int (*const kiln_init_fns[])(kiln_cell_entry*) = {";
  for (size_t i = 0; i < entries.size(); ++i) os << "kiln_e" << i << "_init, ";
  os << "0};\nstatic const char* const* (*const kiln_specs_fns[])() = {";
  for (size_t i = 0; i < entries.size(); ++i) os << "kiln_e" << i << "_op_specs, ";
  os << "0};\n";
  os << R"CODE(
KILN_EXPORT int kiln_cell_abi_version(void) { return KILN_CELL_ABI_VERSION; }
KILN_EXPORT const char* kiln_cell_describe(void) { return kiln_describe_json; }

KILN_EXPORT void kiln_cell_entry_release(kiln_cell_entry* e) {
  if (!e) return;
  for (uint32_t i = 0; i < e->num_ops; ++i) {
    if (e->ops[i]) e->host->op_release(e->ops[i]);
  }
  for (uint32_t i = 0; i < e->num_convs; ++i) {
    if (e->convs[i]) e->host->conv2d_release(e->convs[i]);
  }
  free(e->convs);
  free(e->ops);
  free((void*)e->w);
  free(e);
}

KILN_EXPORT int kiln_cell_entry_init(uint32_t entry, const kiln_host_api* host,
                                     const void* const* constants, uint32_t num_constants,
                                     int num_threads, kiln_cell_entry** out) {
  if (!out || !host || entry >= kiln_num_entries) return KILN_CELL_BAD_ARGUMENT;
  *out = NULL;
  if (host->abi_version != KILN_CELL_ABI_VERSION) return KILN_CELL_BAD_ARGUMENT;
  if (num_constants != kiln_num_constants[entry]) return KILN_CELL_BAD_ARGUMENT;
  for (uint32_t i = 0; i < num_constants; ++i) {
    if (!constants[i]) return KILN_CELL_BAD_ARGUMENT;
  }
  kiln_cell_entry* e = (kiln_cell_entry*)calloc(1, sizeof(kiln_cell_entry));
  if (!e) return KILN_CELL_RESOURCE_EXHAUSTED;
  e->index = entry;
  e->host = host;
  e->threads = num_threads;
  e->num_w = num_constants;
  e->w = (const void**)calloc(num_constants ? num_constants : 1, sizeof(void*));
  const uint32_t nops = kiln_num_ops_fns[entry]();
  e->ops = (void**)calloc(nops ? nops : 1, sizeof(void*));
  if (!e->w || !e->ops) {
    kiln_cell_entry_release(e);
    return KILN_CELL_RESOURCE_EXHAUSTED;
  }
  for (uint32_t i = 0; i < num_constants; ++i) e->w[i] = constants[i];
  const char* const* specs = kiln_specs_fns[entry]();
  for (uint32_t i = 0; i < nops; ++i) {
    int rc = host->op_prepare(specs[i], &e->ops[i]);
    e->num_ops = i + 1;
    if (rc) {
      kiln_cell_entry_release(e);
      return rc == KILN_CELL_RESOURCE_EXHAUSTED ? rc : KILN_CELL_FAULT;
    }
  }
  const int rc = kiln_init_fns[entry](e);
  if (rc) {
    kiln_cell_entry_release(e);
    return rc == KILN_CELL_RESOURCE_EXHAUSTED ? rc : KILN_CELL_FAULT;
  }
  *out = e;
  return KILN_CELL_OK;
}

KILN_EXPORT int kiln_cell_entry_run(kiln_cell_entry* e, const void* const* inputs,
                                    void* const* outputs, void* workspace,
                                    uint64_t workspace_bytes) {
  if (!e || !inputs || !outputs) return KILN_CELL_BAD_ARGUMENT;
  if (workspace_bytes < kiln_workspace[e->index]) return KILN_CELL_BAD_ARGUMENT;
  if (kiln_workspace[e->index] && !workspace) return KILN_CELL_BAD_ARGUMENT;
  return kiln_runs[e->index](e, inputs, outputs, (char*)workspace);
}
#endif  // dispatch
)CODE";
  cell.source = os.str();
  return cell;
}

}  // namespace kiln
