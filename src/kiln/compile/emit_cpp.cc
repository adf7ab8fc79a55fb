// The C++ emitter (see emit_cpp.h). A visitor over each Program's kernels writing to a stream.
#include "src/kiln/compile/emit_cpp.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <set>
#include <sstream>

#include "src/kiln/compile/elementwise_table.h"
#include "src/kiln/identity/toolchain.h"
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
    case DType::kFloat32:
      return FloatLit(t.data<float>()[i]);
    case DType::kInt64:
      return Lit(t.data<int64_t>()[i]);
    case DType::kFloat64:
      return DoubleLit(t.data<double>()[i]);
    // Unsigned literals: a value past the signed range must not read as a negative number.
    case DType::kUInt32:
      return std::to_string(t.data<uint32_t>()[i]) + "u";
    case DType::kUInt64:
      return std::to_string(t.data<uint64_t>()[i]) + "ull";
    default:
      return std::to_string(t.GetAsInt64(i));
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
    mm_plans_.assign(p_.kernels.size(), MatmulPlan{});
    int mm_count = 0;
    for (size_t k = 0; k < p_.kernels.size(); ++k) {
      KILN_ASSIGN_OR_RETURN(mm_plans_[k], PlanMatmul(p_.kernels[k], e));
      if (mm_plans_[k].prepared) mm_plans_[k].index = mm_count++;
    }
    KILN_RETURN_IF_ERROR(EmitInit(e));
    // S3: run.
    os_ << "extern \"C\" KILN_HIDDEN int " << e
        << "_run(kiln_cell_entry* E, const void* const* in, void* const* out, char* ws) {\n";
    os_ << "  const kiln_host_api* H = E->host;\n  (void)H; (void)in; (void)out; (void)ws;\n";
    // Roots first, then each view after the buffer it views (layout planning may point a view
    // at a copy numbered after it).
    std::vector<bool> declared(p_.buffers.size(), false);
    for (const Buffer& b : p_.buffers) {
      if (b.alias_of >= 0) continue;
      EmitPointer(b, e);
      declared[static_cast<size_t>(b.id)] = true;
    }
    for (bool progress = true; progress;) {
      progress = false;
      for (const Buffer& b : p_.buffers) {
        if (declared[static_cast<size_t>(b.id)] || !declared[static_cast<size_t>(b.alias_of)]) {
          continue;
        }
        EmitPointer(b, e);
        declared[static_cast<size_t>(b.id)] = progress = true;
      }
    }
    if (opt_.test_scan) os_ << "  kiln_test_scan_self();  // TEST ONLY (KILN_TEST_SECRET_SCAN)\n";
    if (opt_.test_segv && !p_.inputs.empty()) {
      const Buffer& in0 = Buf(p_.inputs[0]);
      if (in0.type.dtype == DType::kFloat32 && !in0.dynamic && NumElements(in0.type.shape) > 0) {
        // The address is read from a volatile, so the compiler cannot see the null and turn the
        // store into a trap: the process gets the SIGSEGV a real bug would raise.
        os_ << "  if (" << B(in0.id) << "[0] == " << FloatLit(opt_.test_segv_value)
            << ") {  // TEST ONLY (KILN_TEST_CELL_SEGV)\n"
            << "    volatile int64_t kiln_test_null = 0;\n"
            << "    *(volatile int*)kiln_test_null = 1;\n  }\n";
      }
    }
    int op_index = 0, conv_index = 0;
    for (size_t k = 0; k < p_.kernels.size(); ++k) {
      const Kernel& kern = p_.kernels[k];
      os_ << "  // kernel " << k << ": " << kern.label << "\n  {\n";
      switch (kern.kind) {
        case Kernel::Kind::kFused:
          KILN_RETURN_IF_ERROR(EmitFused(kern));
          break;
        case Kernel::Kind::kMatMul:
        case Kernel::Kind::kGemm:
          if (mm_plans_[k].prepared && !mm_plans_[k].gelu.empty()) {
            // The library applies GELU when the bound scalars allowed it at init.
            os_ << "    if (E->mm_fused[" << mm_plans_[k].index << "]) {\n";
            EmitPreparedMatmul(mm_plans_[k]);
            os_ << "    } else {\n";
            EmitPreparedMatmul(mm_plans_[k]);
            KILN_RETURN_IF_ERROR(EmitEpilogue(kern));
            os_ << "    }\n";
            break;
          }
          if (mm_plans_[k].prepared) {
            EmitPreparedMatmul(mm_plans_[k]);
          } else if (kern.kind == Kernel::Kind::kMatMul) {
            KILN_RETURN_IF_ERROR(EmitMatMul(kern));
            EmitBiasAdd(kern);
          } else {
            KILN_RETURN_IF_ERROR(EmitGemm(kern));
            EmitBiasAdd(kern);
          }
          KILN_RETURN_IF_ERROR(EmitEpilogue(kern));
          break;
        case Kernel::Kind::kConv:
          KILN_RETURN_IF_ERROR(EmitConv(kern, &conv_index));
          KILN_RETURN_IF_ERROR(EmitEpilogue(kern));
          break;
        case Kernel::Kind::kSoftmax:
          KILN_RETURN_IF_ERROR(EmitSoftmax(kern));
          break;
        case Kernel::Kind::kReduce:
          KILN_RETURN_IF_ERROR(EmitReduce(kern));
          break;
        case Kernel::Kind::kNorm:
          KILN_RETURN_IF_ERROR(EmitNorm(kern));
          break;
        case Kernel::Kind::kTranspose:
          KILN_RETURN_IF_ERROR(EmitTranspose(kern));
          break;
        case Kernel::Kind::kConcat:
          EmitConcat(kern);
          break;
        case Kernel::Kind::kGather:
          EmitGather(kern);
          break;
        case Kernel::Kind::kResize:
          EmitResize(kern);
          break;
        case Kernel::Kind::kAttention:
          KILN_RETURN_IF_ERROR(EmitAttention(kern));
          break;
        case Kernel::Kind::kPool:
          EmitPool(kern);
          break;
        case Kernel::Kind::kReference:
          EmitReference(kern, op_index++);
          break;
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
  std::string B(int id) const {
    const size_t n = p_.buffers.size();
    if (static_cast<size_t>(id) >= n) return synthetic_expr_[static_cast<size_t>(id) - n];
    return "b" + std::to_string(id);
  }
  const Buffer& Buf(int id) const {
    const size_t n = p_.buffers.size();
    if (static_cast<size_t>(id) >= n) return synthetic_[static_cast<size_t>(id) - n];
    return p_.buffers[static_cast<size_t>(id)];
  }
  // A row-major operand the emitter itself names (a kernel's local statistics, another view
  // of a buffer), usable wherever a buffer id is; `expr` is its pointer expression.
  int AddSynthetic(const TensorType& type, const std::string& expr) {
    Buffer b;
    b.id = static_cast<int>(p_.buffers.size() + synthetic_.size());
    b.type = type;
    synthetic_.push_back(b);
    synthetic_expr_.push_back(expr);
    return b.id;
  }

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
      if (b.view_offset != 0) os_ << " + " << Lit(b.view_offset);
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

  static Shape Permuted(const Shape& shape, const std::vector<int>& perm) {
    if (perm.empty()) return shape;
    Shape out;
    for (int d : perm) out.push_back(shape[static_cast<size_t>(d)]);
    return out;
  }
  static std::vector<std::vector<int64_t>> PermutedStrides(
      const std::vector<std::vector<int64_t>>& strides, const std::vector<int>& perm) {
    if (perm.empty()) return strides;
    std::vector<std::vector<int64_t>> out;
    for (const auto& st : strides) {
      std::vector<int64_t> p;
      for (int d : perm) p.push_back(st[static_cast<size_t>(d)]);
      out.push_back(std::move(p));
    }
    return out;
  }

  // GEMMs with at most this many multiply-adds run single-threaded (team wakeup costs more).
  static constexpr int64_t kSmallGemm = int64_t{1} << 16;
  std::string GemmThreads(int64_t m, int64_t n, int64_t k) const {
    return "kiln_team(E->threads, " + Lit(m * n * k) + ", " + Lit(kSmallGemm) + ")";
  }
  // Outermost loops with at least this many elements of work run on the host's thread team.
  static constexpr int64_t kParallelWork = int64_t{1} << 15;
  struct Range {
    std::string lo, hi;
    int64_t work = 0;  // split over the team from kParallelWork on (kiln_team)
    int64_t n = 0;
    std::string n_expr;  // when set, the range's length as a C++ expression (n is unused)
    bool open = false;   // ParOpen emitted the body's opening
  };
  // Opens an outermost loop range [0, n): plain bounds, or, when the work is big enough to
  // split, a lambda over a chunk [kiln_lo, kiln_hi) that ParClose hands to parallel_for.
  // Either way the loop body becomes a function of its own (see kiln_par_tramp).
  Range ParOpen(int64_t n, int64_t work) {
    Range r{"kiln_lo", "kiln_hi", work, n, "", true};
    os_ << "    auto kiln_body = [&](int64_t kiln_lo, int64_t kiln_hi) {\n";
    return r;
  }
  void ParClose(const Range& r) {
    if (!r.open) return;
    // kiln_par runs a range of fewer than 2 on the calling thread whatever it is given.
    os_ << "    };\n    KILN_TRY(kiln_par(H, kiln_team(E->threads, " << Lit(r.work) << ", "
        << Lit(kParallelWork - 1) << "), " << (r.n_expr.empty() ? Lit(r.n) : r.n_expr)
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
    for (int in : k.inputs) strides.push_back(OperandStrides(Buf(in), shape));
    for (int o : k.outputs) strides.push_back(LogicalStrides(Buf(o)));
    // Loop in the first output's memory order, so it is written contiguously whatever the
    // layouts of the operands (each read through its own strides).
    const LoopNest ln = Merge(Permuted(shape, Buf(k.outputs[0]).perm),
                              PermutedStrides(strides, Buf(k.outputs[0]).perm));
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

  // A MatMul or Gemm run through a matmul primitive prepared at init: with its right-hand
  // operand bound there (a weight or structural constant, reordered once into the library's
  // layout) or passed per run (an activation), bias and scale inside the call.
  struct MatmulPlan {
    bool prepared = false;
    int index = -1;       // E->mms slot
    std::string desc;     // kiln_matmul_desc initializer
    std::string w_init;   // the bound W as an init expression; "" = passed per run
    std::string threads;  // thread count at prepare
    int a = -1, w = -1, c = -1, bias = -1;  // buffer ids (bias -1: none)
    // The erf GELU epilogue's scalars as init expressions (Kernel::gelu), when all are bound:
    // at init the cell checks their values and, if they are sqrt(2) (or its inverse), 1 and 0.5,
    // lets the library apply GELU (E->mm_fused) instead of running the epilogue.
    std::vector<std::string> gelu;
    bool gelu_div = true;
  };

  Result<MatmulPlan> PlanMatmul(const Kernel& k, const std::string& e) const {
    MatmulPlan plan;
    if (k.kind != Kernel::Kind::kMatMul && k.kind != Kernel::Kind::kGemm) return plan;
    int64_t M, N, K, batch = 1, w_batch = 1;
    int64_t trans_a = 0, trans_w = 0;
    float alpha = 1.0f;
    int bias = k.bias >= 0 ? k.inputs[static_cast<size_t>(k.bias)] : -1;
    Shape a = Buf(k.inputs[0]).type.shape, b = Buf(k.inputs[1]).type.shape;
    const std::string w_init = BoundOperand(k.inputs[1], e);
    if (k.kind == Kernel::Kind::kMatMul) {
      if (a.empty() || b.size() < 2) return plan;
      if (k.trans_w) {  // inputs[1] holds W [K, N] as [N, K] (plan-layout)
        std::swap(b[0], b[1]);
        trans_w = 1;
      }
      if (a.size() == 1) a.insert(a.begin(), 1);
      K = a.back();
      N = b.back();
      if (b.size() == 2) {  // one product over every row of A
        M = NumElements(a) / K;
      } else {  // batched: same batch dims on both sides, or a shared W
        Shape ab(a.begin(), a.end() - 2), bb(b.begin(), b.end() - 2);
        M = a[a.size() - 2];
        batch = NumElements(ab);
        w_batch = NumElements(bb);
        if (!(ab == bb || w_batch == 1) || (ab != bb && ab.size() < bb.size())) return plan;
        if (w_batch == 1) {  // fold the batch into M
          M *= batch;
          batch = 1;
        }
      }
      if (b[b.size() - 2] != K) return plan;
    } else {
      const Node& n = k.node;
      trans_a = n.GetInt("transA", 0);
      trans_w = n.GetInt("transB", 0) ^ (k.trans_w ? 1 : 0);
      alpha = n.GetFloat("alpha", 1.0f);
      const float beta = n.GetFloat("beta", 1.0f);
      if (a.size() != 2 || b.size() != 2) return plan;
      M = trans_a ? a[1] : a[0];
      K = trans_a ? a[0] : a[1];
      N = trans_w ? b[0] : b[1];
      const bool has_c = n.HasInput(2) && beta != 0.0f;
      if (has_c) {
        // C as a per-column bias is the library's bias; anything else keeps the generic path,
        // and so does a C beside a folded bias (one call takes one bias; fold-gemm-bias never
        // folds one into a Gemm with C).
        const TensorType& ct = Buf(k.inputs[2]).type;
        if (beta != 1.0f || ct.shape.empty() || ct.shape.back() != N ||
            NumElements(ct.shape) != N || bias >= 0) {
          return plan;
        }
        bias = k.inputs[2];
      }
    }
    if (M * N * K == 0) return plan;
    // A run-time W cannot carry alpha without the library scaling the bias too.
    if (alpha != 1.0f && bias >= 0 && w_init.empty()) return plan;
    plan.prepared = true;
    plan.a = k.inputs[0];
    plan.w = k.inputs[1];
    plan.c = k.outputs[0];
    plan.bias = bias;
    plan.w_init = w_init;
    if (k.gelu.size() == 3) {
      for (int j : k.gelu) plan.gelu.push_back(BoundOperand(k.inputs[static_cast<size_t>(j)], e));
      if (std::find(plan.gelu.begin(), plan.gelu.end(), "") != plan.gelu.end()) plan.gelu.clear();
      plan.gelu_div = k.gelu_div;
    }
    plan.threads = GemmThreads(M * batch, N, K);
    std::ostringstream d;
    d << "{" << M << ", " << N << ", " << K << ", " << batch << ", " << w_batch << ", "
      << FloatLit(alpha) << ", " << trans_a << ", " << trans_w << ", " << (bias >= 0 ? 1 : 0)
      << ", 0, 0}";
    plan.desc = d.str();
    return plan;
  }

  // A bias fold-gemm-bias moved out of the epilogue, added after a product the library ran
  // without it (the unprepared paths): the epilogue reads result + bias either way.
  void EmitBiasAdd(const Kernel& k) {
    if (k.bias < 0) return;
    const int64_t n = Buf(k.outputs[0]).type.shape.back();
    const int64_t rows = NumElements(Buf(k.outputs[0]).type.shape) / n;
    const std::string y = B(k.outputs[0]), b = B(k.inputs[static_cast<size_t>(k.bias)]);
    os_ << "    for (int64_t i = 0; i < " << Lit(rows) << "; ++i)\n"
        << "      for (int64_t j = 0; j < " << Lit(n) << "; ++j) " << y << "[i * " << Lit(n)
        << " + j] += " << b << "[j];\n";
  }

  void EmitPreparedMatmul(const MatmulPlan& m) {
    os_ << "    KILN_TRY(H->matmul_run(E->mms[" << m.index << "], " << B(m.a) << ", "
        << (m.w_init.empty() ? B(m.w) : std::string("NULL")) << ", "
        << (m.bias >= 0 ? B(m.bias) : std::string("NULL")) << ", " << B(m.c) << "));\n";
  }

  // A buffer's bytes as an expression valid in the entry's init (a bound weight or an embedded
  // constant, from its first element), or "" when it is computed at run time.
  std::string BoundOperand(int id, const std::string& e) const {
    // A view into the middle of a weight (a slice) is read at run time through its own pointer.
    if (static_cast<size_t>(id) < p_.buffers.size() && p_.RootOffset(id) != 0) return "";
    const Buffer& w = Buf(p_.Root(id));
    if (w.kind == Buffer::Kind::kWeight) {
      if (w.name == opt_.bake_weight_for_test && opt_.baked_value.valid()) {
        return e + "_baked" + std::to_string(w.index);
      }
      return "E->w[" + std::to_string(w.index) + "]";
    }
    if (w.kind == Buffer::Kind::kConst) return e + "_c" + std::to_string(w.index);
    return "";
  }

  // Inside a loop over a flattened batch index `index`, declares `int64_t off[n]`: operand j's
  // element offset at that index, sum over batch dims d of (the index's coordinate d) *
  // strides[j][d]. Computed, not looked up in a table of every index, so the source does not
  // grow with the batch and is the same text at every size up to its integer constants (every
  // term is written, a zero stride included).
  void EmitBatchOffsets(const std::string& indent, const std::string& index, const Shape& batch,
                        const std::vector<std::vector<int64_t>>& strides) {
    const auto bstr = ContiguousStrides(batch);
    os_ << indent << "int64_t off[" << std::max<size_t>(strides.size(), 1) << "] = {};\n"
        << indent << "{\n";
    os_ << indent << "  int64_t kiln_rem = " << index << ";\n";
    for (size_t d = 0; d < batch.size(); ++d) {
      os_ << indent << "  {\n"
          << indent << "    const int64_t kiln_i = kiln_rem / "
          << Lit(std::max<int64_t>(bstr[d], 1)) << ";\n"
          << indent << "    kiln_rem %= " << Lit(std::max<int64_t>(bstr[d], 1)) << ";\n";
      for (size_t j = 0; j < strides.size(); ++j) {
        os_ << indent << "    off[" << j << "] += kiln_i * " << Lit(strides[j][d]) << ";\n";
      }
      os_ << indent << "  }\n";
    }
    os_ << indent << "  (void)kiln_rem;\n" << indent << "}\n";
  }

  Status EmitMatMul(const Kernel& k) {
    Shape a = Buf(k.inputs[0]).type.shape, b = Buf(k.inputs[1]).type.shape;
    if (a.size() == 1) a.insert(a.begin(), 1);
    if (b.size() == 1) b.push_back(1);
    if (k.trans_w) std::swap(b[0], b[1]);  // inputs[1] holds W [K, N] as [N, K] (plan-layout)
    const int64_t M = a[a.size() - 2], K = a.back(), N = b.back();
    Shape ab(a.begin(), a.end() - 2), bb(b.begin(), b.end() - 2);
    KILN_ASSIGN_OR_RETURN(Shape batch, BroadcastShapes(ab, bb));
    const int64_t nb = NumElements(batch);
    const std::string A = B(k.inputs[0]), Bm = B(k.inputs[1]), C = B(k.outputs[0]);
    const bool b_shared = NumElements(bb) == 1;
    if (b_shared && ab == batch) {  // one GEMM over all batch rows
      os_ << "    KILN_TRY(H->sgemm(0, " << (k.trans_w ? 1 : 0) << ", " << Lit(nb * M) << ", "
          << Lit(N) << ", " << Lit(K) << ", 1.0f, " << A << ", " << Lit(K) << ", " << Bm << ", "
          << Lit(k.trans_w ? K : N) << ", 0.0f, " << C << ", " << Lit(N) << ", "
          << GemmThreads(nb * M, N, K) << "));\n";
      return Status::OK();
    }
    const auto sa = BroadcastStrides(ab, batch), sb = BroadcastStrides(bb, batch);
    std::vector<std::vector<int64_t>> strides(2);
    for (size_t d = 0; d < batch.size(); ++d) {
      strides[0].push_back(sa[d] * M * K);
      strides[1].push_back(sb[d] * K * N);
    }
    // Small GEMMs of a batch (attention heads) run one per thread of the host's team, each
    // single-threaded; large ones are threaded inside the library.
    os_ << "    const bool kiln_per_thread = " << Lit(M * N * K) << " <= " << Lit(kSmallGemm)
        << ";\n"
        << "    int kiln_rc = 0;\n"
        << "    auto kiln_body = [&](int64_t kiln_lo, int64_t kiln_hi) {\n"
        << "      for (int64_t i = kiln_lo; i < kiln_hi; ++i) {\n";
    EmitBatchOffsets("        ", "i", batch, strides);
    os_ << "        const int rc = H->sgemm(0, 0, " << Lit(M) << ", " << Lit(N) << ", " << Lit(K)
        << ", 1.0f, " << A << " + off[0], " << Lit(K) << ", " << Bm << " + off[1], " << Lit(N)
        << ", 0.0f, " << C << " + i * " << Lit(M * N) << ", " << Lit(N) << ", "
        << "kiln_per_thread ? 1 : E->threads);\n"
        << "        if (rc) __atomic_store_n(&kiln_rc, rc, __ATOMIC_RELAXED);\n"
        << "      }\n    };\n"
        << "    if (kiln_per_thread) {\n"
        << "      KILN_TRY(kiln_par(H, E->threads, " << Lit(nb) << ", kiln_body));\n"
        << "    } else {\n"
        << "      kiln_body(0, " << Lit(nb) << ");\n"
        << "    }\n";
    os_ << "    if (kiln_rc) return kiln_rc;\n";
    return Status::OK();
  }

  Status EmitGemm(const Kernel& k) {
    const Node& n = k.node;
    const int64_t ta = n.GetInt("transA", 0), tb = n.GetInt("transB", 0) ^ (k.trans_w ? 1 : 0);
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
        << Lit(K) << ", " << FloatLit(alpha) << ", " << B(k.inputs[0]) << ", " << Lit(a[1]) << ", "
        << B(k.inputs[1]) << ", " << Lit(b[1]) << ", " << FloatLit(beta) << ", " << Y << ", "
        << Lit(N) << ", " << GemmThreads(M, N, K) << "));\n";
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
      << group << ", " << k.post_op << ", " << (k.conv_sum ? 1 : 0) << ", ";
    if (k.conv_layout == KILN_CONV_LAYOUT_NHWC_WINOGRAD) {
      d << "(" << Lit(x[0] * x[2] * x[3]) << " >= " << Lit(kWinogradMinPixels)
        << " ? KILN_CONV_LAYOUT_NHWC_WINOGRAD : KILN_CONV_LAYOUT_NHWC)";
    } else {
      d << k.conv_layout;
    }
    d << ", 0}";
    *desc = d.str();
    return Status::OK();
  }

  // The convolution's weights as an expression valid in the entry's init (bound weight or
  // embedded constant), or "" when they are computed at run time (no prepared kernel then).
  std::string BoundWeight(const Kernel& k, const std::string& e) const {
    return BoundOperand(k.inputs[1], e);
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
          << ") memcpy(" << Y << ", " << B(k.inputs.back()) << ", " << NumElements(y) * 4 << ");\n";
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

  // Convolutions whose single-thread run is estimated under ~20 us run on one thread: a
  // parallel region's fork and join cost about what splitting less work saves, and a small
  // network (MobileNetV3: ~60 convolutions, most tiny) would otherwise pay it at every one. The
  // estimate counts memory as well as arithmetic, in multiply-add equivalents: dense math runs
  // at ~100 multiply-adds per ns on a core, memory streams at ~20 bytes per ns, so a byte costs
  // what 5 multiply-adds do. Depthwise and squeeze-excite convolutions do few multiply-adds per
  // byte: counted by arithmetic alone, MobileNetV3's ran on one core while the other waited
  // (a 64-channel depthwise 3x3 at 112x112: 142 us on one thread, 70 us on two).
  static constexpr int64_t kSmallConvWork = int64_t{1} << 21;
  static constexpr int64_t kMultiplyAddsPerByte = 5;
  std::string ConvThreads(const Kernel& k) const {
    const Shape& x = Buf(k.inputs[0]).type.shape;
    const Shape& y = Buf(k.outputs[0]).type.shape;
    const Shape& w = Buf(k.inputs[1]).type.shape;
    const int64_t macs = NumElements(y) * NumElements(Shape(w.begin() + 1, w.end()));
    const int64_t bytes = 4 * (NumElements(x) + NumElements(y) + NumElements(w));
    return "kiln_team(E->threads, " + Lit(macs + kMultiplyAddsPerByte * bytes) + ", " +
           Lit(kSmallConvWork) + ")";
  }

  // The entry's bind-time preparation: one prepared convolution per conv with bound weights.
  Status EmitInit(const std::string& e) {
    std::vector<std::pair<std::string, std::string>> convs;  // desc, weight expression
    std::vector<int> has_bias;
    std::vector<std::string> threads;
    for (const Kernel& k : p_.kernels) {
      if (k.kind != Kernel::Kind::kConv) continue;
      const std::string w = BoundWeight(k, e);
      if (w.empty()) continue;
      std::string desc;
      KILN_RETURN_IF_ERROR(ConvDesc(k, &desc));
      threads.push_back(ConvThreads(k));
      convs.emplace_back(desc, w);
      has_bias.push_back(k.node.HasInput(2) ? 1 : 0);
    }
    os_ << "extern \"C\" KILN_HIDDEN int " << e << "_init(kiln_cell_entry* E) {\n";
    EmitMatmulInit();
    KILN_RETURN_IF_ERROR(EmitAttentionInit());
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
          << ", " << has_bias[i] << ", " << threads[i] << ", &E->convs[" << i << "]));\n";
    }
    os_ << "  return KILN_CELL_OK;\n}\n\n";
    return Status::OK();
  }

  void EmitMatmulInit() {
    std::vector<const MatmulPlan*> mms;
    for (const MatmulPlan& m : mm_plans_) {
      if (m.prepared) mms.push_back(&m);
    }
    if (mms.empty()) return;
    os_ << "  static const kiln_matmul_desc md[" << mms.size() << "] = {";
    for (const MatmulPlan* m : mms) os_ << "\n      " << m->desc << ",";
    os_ << "};\n";
    os_ << "  E->mms = (void**)calloc(" << mms.size() << ", sizeof(void*));\n"
        << "  E->mm_fused = (uint8_t*)calloc(" << mms.size() << ", 1);\n"
        << "  if (!E->mms || !E->mm_fused) return KILN_CELL_RESOURCE_EXHAUSTED;\n";
    for (const MatmulPlan* m : mms) {
      os_ << "  E->num_mms = " << m->index + 1 << ";\n";
      std::string desc = "&md[" + std::to_string(m->index) + "]";
      if (!m->gelu.empty()) {
        // The bound scalars decide (law 1): exactly sqrt(2) (or 1/sqrt(2) as a factor), 1, 0.5.
        os_ << "  kiln_matmul_desc md" << m->index << " = md[" << m->index << "];\n"
            << "  E->mm_fused[" << m->index << "] = *(const float*)" << m->gelu[0]
            << " == " << (m->gelu_div ? "0x1.6a09e6p+0f" : "0x1.6a09e6p-1f")
            << " && *(const float*)" << m->gelu[1] << " == 1.0f && *(const float*)" << m->gelu[2]
            << " == 0.5f;\n"
            << "  if (E->mm_fused[" << m->index << "]) md" << m->index
            << ".post_op = KILN_POST_GELU_ERF;\n";
        desc = "&md" + std::to_string(m->index);
      }
      os_ << "  KILN_TRY(E->host->matmul_prepare(" << desc << ", "
          << (m->w_init.empty() ? std::string("NULL") : "(const float*)" + m->w_init) << ", "
          << m->threads << ", &E->mms[" << m->index << "]));\n";
    }
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

  // A reduction over one contiguous block of axes (lower.cc checked the form): X as
  // [outer, n, inner], Y as [outer, inner] (keepdims changes only Y's shape). Sums accumulate in
  // double, as the interpreter's do; max and min keep NaN.
  Status EmitReduce(const Kernel& k) {
    const Shape& s = Buf(k.inputs[0]).type.shape;
    KILN_ASSIGN_OR_RETURN(const std::vector<bool> reduced,
                          ReducedDims(k.node, k.opset, Buf(k.inputs[0]).type));
    int64_t outer = 1, n = 1, inner = 1;
    bool seen = false;
    for (size_t d = 0; d < s.size(); ++d) {
      seen = seen || reduced[d];
      (reduced[d] ? n : seen ? inner : outer) *= s[d];
    }
    const std::string& op = k.node.op_type;
    const bool extreme = op == "ReduceMax" || op == "ReduceMin";
    const std::string X = B(k.inputs[0]), Y = B(k.outputs[0]);
    const std::string scale = op == "ReduceMean" ? " / (double)" + Lit(n) : "";
    const Range r = ParOpen(outer, outer * n * inner);
    if (inner == 1) {  // contiguous rows: vectorized lane reductions
      os_ << "    for (int64_t o = " << r.lo << "; o < " << r.hi << "; ++o) {\n"
          << "      const float* x = " << X << " + o * " << Lit(n) << ";\n";
      if (extreme) {
        os_ << "      " << Y << "[o] = kiln_row_" << (op == "ReduceMax" ? "max" : "min") << "(x, "
            << Lit(n) << ");\n";
      } else {
        os_ << "      " << Y << "[o] = (float)(kiln_row_sum(x, " << Lit(n) << ")" << scale
            << ");\n";
      }
      os_ << "    }\n";
      ParClose(r);
      return Status::OK();
    }
    os_ << "    for (int64_t o = " << r.lo << "; o < " << r.hi << "; ++o)\n"
        << "    for (int64_t j = 0; j < " << Lit(inner) << "; ++j) {\n"
        << "      const float* x = " << X << " + o * " << Lit(n * inner) << " + j;\n";
    if (extreme) {
      const char* cmp = op == "ReduceMax" ? ">" : "<";
      os_ << "      float m = " << (op == "ReduceMax" ? "-INFINITY" : "INFINITY") << ";\n"
          << "      for (int64_t i = 0; i < " << Lit(n) << "; ++i) {\n"
          << "        const float v = x[i * " << Lit(inner) << "];\n"
          << "        m = v " << cmp << " m || v != v ? v : m;\n"
          << "      }\n"
          << "      " << Y << "[o * " << Lit(inner) << " + j] = m;\n    }\n";
    } else {
      os_ << "      double acc = 0.0;\n"
          << "      for (int64_t i = 0; i < " << Lit(n) << "; ++i) acc += x[i * " << Lit(inner)
          << "];\n"
          << "      " << Y << "[o * " << Lit(inner) << " + j] = (float)(acc" << scale
          << ");\n    }\n";
    }
    ParClose(r);
    return Status::OK();
  }

  // Normalizations in two phases: statistics per normalized group (mean M, then A = scale/std
  // and, per channel, the bias Bb), then one generated elementwise loop over the output,
  //   LayerNorm:            y = (x - M) * A * gamma [+ beta]
  //   Instance/GroupNorm:   y = (x - M) * A + Bb
  // with the activation or affine chain that read the norm (its epilogue) applied in the same
  // loop, in whatever layout the input has. GroupNorm (groups > 0) normalizes channel groups of
  // a rank-4 input with per-group scale and bias (the InstanceNormalization it came from).
  Status EmitNorm(const Kernel& k) {
    const Buffer& xb = Buf(k.inputs[0]);
    const Shape& s = xb.type.shape;
    const int64_t rank = static_cast<int64_t>(s.size());
    const std::string X = B(k.inputs[0]);
    const std::string scale = B(k.inputs[1]);
    // The node's own bias input: a LayerNormalization may have none, and the kernel's inputs
    // after the node's are its epilogue's operands.
    const bool has_bias = k.node.HasInput(2);
    const std::string bias = has_bias ? B(k.inputs[2]) : "";
    const float eps = k.node.GetFloat("epsilon", 1e-5f);
    const bool layer = k.node.op_type == "LayerNormalization";
    const std::string eps_lit = "(double)" + FloatLit(eps);
    int64_t stat = 0, axis = 2;
    Shape stat_shape;
    if (layer) {
      axis = k.node.GetInt("axis", -1);
      if (axis < 0) axis += rank;
      stat_shape = s;
      for (int64_t d = axis; d < rank; ++d) stat_shape[static_cast<size_t>(d)] = 1;
    } else {
      stat_shape = s;
      for (int64_t d = 2; d < rank; ++d) stat_shape[static_cast<size_t>(d)] = 1;
    }
    stat = NumElements(stat_shape);
    const int64_t inner = NumElements(s) / std::max<int64_t>(stat, 1);
    const int64_t arrays = layer ? 2 : 3;  // M, A (, Bb)
    // GroupNorm over a channels-last input: per-channel partial sums over chunks of pixels.
    const bool gn_nhwc = k.groups > 0 && !HasRowMajorStrides(xb);
    const int64_t chunks = gn_nhwc ? std::min<int64_t>(8, s[2] * s[3]) : 0;
    const int64_t floats = arrays * stat + (gn_nhwc ? 4 * s[0] * chunks * s[1] : 0);
    // Statistics live on the stack (a few KiB in practice); an outsized set is allocated.
    const bool heap = floats * 4 > (int64_t{1} << 20);
    if (heap) {
      os_ << "    float* kiln_st = (float*)malloc(" << floats * 4 << ");\n"
          << "    if (!kiln_st) return KILN_CELL_RESOURCE_EXHAUSTED;\n";
    } else {
      os_ << "    alignas(64) float kiln_st[" << floats << "];\n";
    }
    os_ << "    float* const kiln_M = kiln_st;\n    float* const kiln_A = kiln_st + " << stat
        << ";\n";
    if (!layer) os_ << "    float* const kiln_Bb = kiln_st + " << 2 * stat << ";\n";
    // Phase 1.
    if (k.groups > 0 && gn_nhwc) {
      const int64_t N = s[0], C = s[1], HW = s[2] * s[3], G = k.groups, cg = C / G;
      const auto xs = LogicalStrides(xb);  // channel stride 1, pixel stride C
      os_ << "    double* const kiln_part = (double*)(kiln_st + " << arrays * stat << ");\n";
      const Range r = ParOpen(N * chunks, NumElements(s));
      os_ << "    for (int64_t q = " << r.lo << "; q < " << r.hi << "; ++q) {\n"
          << "      const int64_t n = q / " << Lit(chunks) << ", ch = q % " << Lit(chunks) << ";\n"
          << "      const int64_t p0 = ch * " << Lit(HW) << " / " << Lit(chunks)
          << ", p1 = (ch + 1) * " << Lit(HW) << " / " << Lit(chunks) << ";\n"
          << "      double* sum = kiln_part + q * " << Lit(2 * C) << ";\n"
          << "      double* sq = sum + " << Lit(C) << ";\n"
          << "      for (int64_t c = 0; c < " << Lit(C) << "; ++c) { sum[c] = 0; sq[c] = 0; }\n"
          << "      for (int64_t p = p0; p < p1; ++p) {\n"
          << "        const float* x = " << X << " + n * " << Lit(xs[0]) << " + p * " << Lit(xs[3])
          << ";\n"
          << "        #pragma GCC ivdep\n"
          << "        for (int64_t c = 0; c < " << Lit(C) << "; ++c) {\n"
          << "          const double v = x[c];\n"
          << "          sum[c] += v;\n          sq[c] += v * v;\n        }\n      }\n    }\n";
      ParClose(r);
      os_ << "    for (int64_t n = 0; n < " << Lit(N) << "; ++n)\n"
          << "      for (int64_t g = 0; g < " << Lit(G) << "; ++g) {\n"
          << "        double s1 = 0, s2 = 0;\n"
          << "        for (int64_t ch = 0; ch < " << Lit(chunks) << "; ++ch) {\n"
          << "          const double* sum = kiln_part + (n * " << Lit(chunks) << " + ch) * "
          << Lit(2 * C) << " + g * " << Lit(cg) << ";\n"
          << "          for (int64_t c = 0; c < " << Lit(cg) << "; ++c) { s1 += sum[c]; s2 += sum["
          << Lit(C)
          << " + c]; }\n        }\n"
          // The count as an integer literal the C++ compiler converts (the same double, exactly):
          // over a ranged side it is a constant computed from the symbols, where a float
          // literal would change the text from point to point.
          << "        const double mean = s1 / (double)" << Lit(cg * HW) << ";\n"
          << "        double var = s2 / (double)" << Lit(cg * HW) << " - mean * mean;\n"
          << "        var = var > 0 ? var : 0;\n"
          << "        const float inv = (float)(1.0 / sqrt(var + " << eps_lit << "));\n"
          << "        for (int64_t c = g * " << Lit(cg) << "; c < (g + 1) * " << Lit(cg)
          << "; ++c) {\n"
          << "          kiln_M[n * " << Lit(C) << " + c] = (float)mean;\n"
          << "          kiln_A[n * " << Lit(C) << " + c] = " << scale << "[g] * inv;\n"
          << "          kiln_Bb[n * " << Lit(C)
          << " + c] = " << (has_bias ? bias + "[g]" : std::string("0.0f"))
          << ";\n        }\n      }\n";
    } else if (k.groups > 0) {  // row-major GroupNorm: each (n, g) is one contiguous region
      const int64_t C = s[1], G = k.groups, cg = C / G, region = inner * cg;
      const Range r = ParOpen(s[0] * G, NumElements(s));
      os_ << "    for (int64_t q = " << r.lo << "; q < " << r.hi << "; ++q) {\n"
          << "      double mean, var;\n"
          << "      kiln_row_moments(" << X << " + q * " << Lit(region) << ", " << Lit(region)
          << ", &mean, &var);\n"
          << "      const float inv = (float)(1.0 / sqrt(var + " << eps_lit << "));\n"
          << "      const int64_t n = q / " << Lit(G) << ", g = q % " << Lit(G) << ";\n"
          << "      for (int64_t c = g * " << Lit(cg) << "; c < (g + 1) * " << Lit(cg)
          << "; ++c) {\n"
          << "        kiln_M[n * " << Lit(C) << " + c] = (float)mean;\n"
          << "        kiln_A[n * " << Lit(C) << " + c] = " << scale << "[g] * inv;\n"
          << "        kiln_Bb[n * " << Lit(C)
          << " + c] = " << (has_bias ? bias + "[g]" : std::string("0.0f")) << ";\n      }\n    }\n";
      ParClose(r);
    } else {  // one contiguous row per statistic
      const Range r = ParOpen(stat, NumElements(s));
      os_ << "    for (int64_t o = " << r.lo << "; o < " << r.hi << "; ++o) {\n"
          << "      double mean, var;\n"
          << "      kiln_row_moments(" << X << " + o * " << Lit(inner) << ", " << Lit(inner)
          << ", &mean, &var);\n"
          << "      const float inv = (float)(1.0 / sqrt(var + " << eps_lit << "));\n"
          << "      kiln_M[o] = (float)mean;\n";
      if (layer) {
        os_ << "      kiln_A[o] = inv;\n";
      } else {
        os_ << "      const int64_t c = o % " << Lit(s[1]) << ";\n"
            << "      kiln_A[o] = " << scale << "[c] * inv;\n"
            << "      kiln_Bb[o] = " << (has_bias ? bias + "[c]" : std::string("0.0f")) << ";\n";
      }
      os_ << "    }\n";
      ParClose(r);
    }
    // Phase 2: one fused loop.
    Kernel f;
    f.kind = Kernel::Kind::kFused;
    f.label = "norm";
    const TensorType st{DType::kFloat32, stat_shape};
    f.inputs = {k.inputs[0], AddSynthetic(st, "kiln_M"), AddSynthetic(st, "kiln_A")};
    auto ex = [](const char* op, int a, int b) {
      Expr e;
      e.op = op;
      e.operands = {a, b};
      return e;
    };
    f.exprs.push_back(ex("Sub", -1, -2));
    f.exprs.push_back(ex("Mul", 0, -3));
    if (layer) {
      // gamma and beta span the normalized dims, whatever shape they were declared with.
      const TensorType gt{DType::kFloat32, Shape(s.begin() + axis, s.end())};
      f.inputs.push_back(AddSynthetic(gt, scale));
      f.exprs.push_back(ex("Mul", 1, -4));
      if (has_bias) {
        f.inputs.push_back(AddSynthetic(gt, bias));
        f.exprs.push_back(ex("Add", 2, -5));
      }
    } else {
      f.inputs.push_back(AddSynthetic(st, "kiln_Bb"));
      f.exprs.push_back(ex("Add", 1, -4));
    }
    const int norm_out = static_cast<int>(f.exprs.size()) - 1;
    int out_expr = norm_out;
    if (!k.epilogue.empty()) {
      std::map<int, int> slot;  // kernel input index -> fused input slot
      const int base = static_cast<int>(f.exprs.size());
      for (Expr e : k.epilogue) {
        for (int& o : e.operands) {
          if (o == INT32_MIN) continue;
          if (o >= 0) {
            o += base;
          } else if (o == -1) {
            o = norm_out;
          } else {
            const int j = -o - 2;
            auto it = slot.find(j);
            if (it == slot.end()) {
              it = slot.emplace(j, static_cast<int>(f.inputs.size())).first;
              f.inputs.push_back(k.inputs[static_cast<size_t>(j)]);
            }
            o = -(it->second + 1);
          }
        }
        f.exprs.push_back(e);
      }
      out_expr = base + k.epilogue_out;
    }
    f.outputs = {k.outputs[0]};
    f.output_exprs = {out_expr};
    os_ << "    {\n";
    KILN_RETURN_IF_ERROR(EmitFused(f));
    os_ << "    }\n";
    if (heap) os_ << "    free(kiln_st);\n";
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
  // Inputs and output share one layout (layout planning sees to it): the blocks are those of
  // the memory order, where the concatenated axis sits at its position in the perm.
  void EmitConcat(const Kernel& k) {
    const Buffer& ob = Buf(k.outputs[0]);
    const int64_t rank = static_cast<int64_t>(ob.type.shape.size());
    int64_t axis = k.node.GetInt("axis", 0);
    if (axis < 0) axis += rank;
    std::vector<int> perm = ob.perm;
    if (perm.empty()) {
      for (int64_t d = 0; d < rank; ++d) perm.push_back(static_cast<int>(d));
    }
    const Shape out = Permuted(ob.type.shape, perm);
    const int64_t logical_axis = axis;
    axis = std::find(perm.begin(), perm.end(), static_cast<int>(axis)) - perm.begin();
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < axis; ++d) outer *= out[static_cast<size_t>(d)];
    for (int64_t d = axis + 1; d < rank; ++d) inner *= out[static_cast<size_t>(d)];
    const int64_t row = out[static_cast<size_t>(axis)] * inner;
    const int64_t esize = static_cast<int64_t>(DTypeSize(ob.type.dtype));
    int64_t off = 0;
    for (int id : k.inputs) {
      const int64_t block = Buf(id).type.shape[static_cast<size_t>(logical_axis)] * inner;
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
  // output row (the innermost axis in memory) at a time. Input and output share one layout.
  void EmitResize(const Kernel& k) {
    const Buffer& ob = Buf(k.outputs[0]);
    const size_t r = ob.type.shape.size();
    std::vector<int> perm = ob.perm;
    if (perm.empty()) {
      for (size_t d = 0; d < r; ++d) perm.push_back(static_cast<int>(d));
    }
    const Shape in = Permuted(Buf(k.inputs[0]).type.shape, perm);
    const Shape out = Permuted(ob.type.shape, perm);
    const auto in_strides = ContiguousStrides(in);
    int64_t rows = 1;
    for (size_t d = 0; d + 1 < r; ++d) rows *= out[d];
    const int64_t ow = out[r - 1], fw = out[r - 1] / in[r - 1];
    const char* ct = CType(ob.type.dtype);
    const Range rg = ParOpen(rows, rows * ow);
    os_ << "    for (int64_t q = " << rg.lo << "; q < " << rg.hi << "; ++q) {\n"
        << "      int64_t rem = q, src = 0;\n      (void)rem;\n";
    for (size_t d = r - 1; d-- > 0;) {
      os_ << "      { const int64_t i = rem % " << Lit(out[d]) << "; rem /= " << Lit(out[d])
          << "; src += (i / " << Lit(out[d] / in[d]) << ") * " << Lit(in_strides[d]) << "; }\n";
    }
    os_ << "      const " << ct << "* xr = " << B(k.inputs[0]) << " + src;\n"
        << "      " << ct << "* yr = " << B(k.outputs[0]) << " + q * " << Lit(ow) << ";\n";
    if (fw == 1) {
      os_ << "      memcpy(yr, xr, " << Lit(ow * static_cast<int64_t>(DTypeSize(ob.type.dtype)))
          << ");\n    }\n";
    } else {
      os_ << "      for (int64_t j = 0; j < " << Lit(ow) << "; ++j) yr[j] = xr[j / " << Lit(fw)
          << "];\n    }\n";
    }
    ParClose(rg);
  }

  // One matrix operand of a tile product as the host's row-major sgemm takes it: row-major
  // (trans 0, ld = row stride) when its columns are contiguous, else its transpose stored
  // row-major (trans 1, ld = column stride). Layout planning gives every attention operand one
  // unit stride.
  struct MatrixArg {
    int trans = 0;
    int64_t ld = 0;
  };
  static Result<MatrixArg> AsMatrix(int64_t rows, int64_t cols, int64_t row_stride,
                                    int64_t col_stride, const std::string& what) {
    if (col_stride == 1 || cols == 1) return MatrixArg{0, std::max<int64_t>(row_stride, cols)};
    if (row_stride == 1 || rows == 1) return MatrixArg{1, std::max<int64_t>(col_stride, rows)};
    return Status::Internal("attention operand " + what + " has no unit stride");
  }

  // An attention kernel's tiles: BQ queries by BK keys, and how the host's sgemm takes Q, K'
  // and V. Tiles live on each thread's stack: at most ~256 KiB. They are the largest the kernel
  // takes (BQ <= 64 queries, BK <= 256 keys) whatever Sq and Sk are, the last block of each cut
  // short at run time, so the text does not depend on the sequence lengths (only its integer
  // constants do).
  struct AttentionTiles {
    int64_t bq = 0, bk = 0, d = 0, dv = 0;
    int64_t sq = 0, sk = 0;
    MatrixArg q, k, v;
    // The first tile's extents: min(Sq, BQ) and min(Sk, BK), as C++ expressions.
    std::string FirstQ() const {
      return "(" + Lit(sq) + " < " + Lit(bq) + " ? " + Lit(sq) + " : " + Lit(bq) + ")";
    }
    std::string FirstK() const {
      return "(" + Lit(sk) + " < " + Lit(bk) + " ? " + Lit(sk) + " : " + Lit(bk) + ")";
    }
  };
  Result<AttentionTiles> PlanAttention(const Kernel& k) const {
    const Buffer& qb = Buf(k.inputs[0]);
    const Buffer& kb = Buf(k.inputs[1]);
    const Buffer& vb = Buf(k.inputs[2]);
    const size_t r = qb.type.shape.size();
    const int64_t Sq = qb.type.shape[r - 2], D = qb.type.shape[r - 1];
    const int64_t Sk = kb.type.shape[r - 1], Dv = vb.type.shape[r - 1];
    const auto qs = LogicalStrides(qb), ks = LogicalStrides(kb), vs = LogicalStrides(vb);
    AttentionTiles t;
    KILN_ASSIGN_OR_RETURN(t.q, AsMatrix(Sq, D, qs[r - 2], qs[r - 1], "Q"));
    KILN_ASSIGN_OR_RETURN(t.k, AsMatrix(D, Sk, ks[r - 2], ks[r - 1], "K'"));
    KILN_ASSIGN_OR_RETURN(t.v, AsMatrix(Sk, Dv, vs[r - 2], vs[r - 1], "V"));
    t.bk = 256;
    t.bq = 64;
    while (t.bq > 8 && t.bq * (t.bk + Dv) * 4 > (int64_t{1} << 18)) t.bq /= 2;
    t.d = D;
    t.dv = Dv;
    t.sq = Sq;
    t.sk = Sk;
    return t;
  }

  // At bind, one product of each tile shape on zeroed scratch: the host's sgemm generates its
  // kernels on first use, which would otherwise fall on the first request.
  Status EmitAttentionInit() {
    for (const Kernel& k : p_.kernels) {
      if (k.kind != Kernel::Kind::kAttention) continue;
      KILN_ASSIGN_OR_RETURN(const AttentionTiles t, PlanAttention(k));
      const int64_t a = t.bq * t.d, b = t.d * t.bk, c = t.bq * t.bk, v = t.bk * t.dv;
      const int64_t o = t.bq * t.dv;
      // Scratch for the largest tiles; the products are the first tile's, the shape most
      // calls take.
      const std::string bq = t.FirstQ(), bk = t.FirstK();
      os_ << "  {  // warm the host's sgemm for this attention's tiles\n"
          << "    float* s = (float*)calloc(" << a + b + c + v + o << ", sizeof(float));\n"
          << "    if (!s) return KILN_CELL_RESOURCE_EXHAUSTED;\n"
          << "    int rc = E->host->sgemm(" << t.q.trans << ", " << t.k.trans << ", " << bq << ", "
          << bk << ", " << Lit(t.d) << ", 1.0f, s, " << (t.q.trans ? bq : Lit(t.d)) << ", s + " << a
          << ", " << (t.k.trans ? Lit(t.d) : bk) << ", 0.0f, s + " << a + b << ", " << bk
          << ", 1);\n"
          << "    if (!rc) rc = E->host->sgemm(0, " << t.v.trans << ", " << bq << ", " << Lit(t.dv)
          << ", " << bk << ", 1.0f, s + " << a + b << ", " << bk << ", s + " << a + b + c << ", "
          << (t.v.trans ? bk : Lit(t.dv)) << ", 1.0f, s + " << a + b + c + v << ", " << Lit(t.dv)
          << ", 1);\n"
          << "    free(s);\n    KILN_TRY(rc);\n  }\n";
    }
    return Status::OK();
  }

  // softmax(epilogue(Q K')) V: per (batch, block of BQ queries), key blocks of BK: the tile of
  // scores (Q block x K' block, the host's sgemm), the epilogue on it, the online softmax update
  // (running max and sum per row, earlier output rescaled), and the tile's probabilities times
  // the V block accumulated into the output block; divided by the sums at the end. Operands are
  // read with their own strides (views of the projections, never copied into heads).
  Status EmitAttention(const Kernel& k) {
    const Buffer& qb = Buf(k.inputs[0]);
    const Buffer& kb = Buf(k.inputs[1]);
    const Buffer& vb = Buf(k.inputs[2]);
    const Buffer& ob = Buf(k.outputs[0]);
    const Shape& q = qb.type.shape;
    const size_t r = q.size();
    const int64_t Sq = q[r - 2], D = q[r - 1], Sk = kb.type.shape[r - 1];
    const int64_t Dv = vb.type.shape[r - 1];
    const Shape batch(q.begin(), q.end() - 2);
    const int64_t BH = NumElements(batch);
    Shape scores = batch;
    scores.push_back(Sq);
    scores.push_back(Sk);
    const auto qs = LogicalStrides(qb), ks = LogicalStrides(kb), vs = LogicalStrides(vb);
    const auto os = LogicalStrides(ob);
    KILN_ASSIGN_OR_RETURN(const AttentionTiles tiles, PlanAttention(k));
    const MatrixArg qa = tiles.q, ka = tiles.k, va = tiles.v;
    const int64_t BQ = tiles.bq, BK = tiles.bk;
    // Query blocks per (batch, head), ceil(Sq / BQ), computed by the cell from Sq.
    const std::string NQB = "kiln_nqb";
    // Per batch index: offsets of Q, K', V, O, then of every epilogue operand.
    std::vector<std::vector<int64_t>> ops_strides;
    for (size_t j = 3; j < k.inputs.size(); ++j) {
      ops_strides.push_back(OperandStrides(Buf(k.inputs[j]), scores));
    }
    const size_t per = 4 + ops_strides.size();
    std::vector<std::vector<int64_t>> strides(per);
    for (size_t d = 0; d < batch.size(); ++d) {
      strides[0].push_back(qs[d]);
      strides[1].push_back(ks[d]);
      strides[2].push_back(vs[d]);
      strides[3].push_back(os[d]);
      for (size_t e = 0; e < ops_strides.size(); ++e) strides[4 + e].push_back(ops_strides[e][d]);
    }
    os_ << "    const int64_t kiln_nqb = (" << Lit(Sq) << " + " << Lit(BQ - 1) << ") / " << Lit(BQ)
        << ";\n";
    os_ << "    int kiln_rc = 0;\n"
        << "    auto kiln_body = [&](int64_t kiln_lo, int64_t kiln_hi) {\n"
        << "      alignas(64) float S[" << BQ * BK << "];\n"
        << "      alignas(64) float Oa[" << BQ * Dv << "];\n"
        << "      float mx[" << BQ << "], ls[" << BQ << "];\n"
        << "      for (int64_t t = kiln_lo; t < kiln_hi; ++t) {\n"
        << "        const int64_t bh = t / " << NQB << ", i0 = (t % " << NQB << ") * " << Lit(BQ)
        << ";\n"
        << "        const int64_t nq = " << Lit(Sq) << " - i0 < " << Lit(BQ) << " ? " << Lit(Sq)
        << " - i0 : " << Lit(BQ) << ";\n";
    EmitBatchOffsets("        ", "bh", batch, strides);
    os_ << "        const float* qp = " << B(k.inputs[0]) << " + off[0] + i0 * " << Lit(qs[r - 2])
        << ";\n"
        << "        const float* kp = " << B(k.inputs[1]) << " + off[1];\n"
        << "        const float* vp = " << B(k.inputs[2]) << " + off[2];\n"
        << "        float* op = " << B(k.outputs[0]) << " + off[3] + i0 * " << Lit(os[r - 2])
        << ";\n"
        << "        for (int64_t i = 0; i < nq; ++i) { mx[i] = -INFINITY; ls[i] = 0.0f; }\n"
        << "        memset(Oa, 0, sizeof(float) * nq * " << Lit(Dv) << ");\n"
        << "        for (int64_t j0 = 0; j0 < " << Lit(Sk) << "; j0 += " << Lit(BK) << ") {\n"
        << "          const int64_t nk = " << Lit(Sk) << " - j0 < " << Lit(BK) << " ? " << Lit(Sk)
        << " - j0 : " << Lit(BK) << ";\n"
        << "          int rc = H->sgemm(" << qa.trans << ", " << ka.trans << ", nq, nk, " << Lit(D)
        << ", 1.0f, qp, " << Lit(qa.ld) << ", kp + j0 * " << Lit(ks[r - 1]) << ", " << Lit(ka.ld)
        << ", 0.0f, S, nk, 1);\n"
        << "          if (rc) { __atomic_store_n(&kiln_rc, rc, __ATOMIC_RELAXED); return; }\n"
        << "          for (int64_t i = 0; i < nq; ++i) {\n"
        << "            float* s = S + i * nk;\n";
    if (!k.epilogue.empty()) {
      // The score epilogue, per element of the row: operand -1 is the score, -(j+2) inputs[j].
      os_ << "            #pragma GCC ivdep\n"
          << "            for (int64_t j = 0; j < nk; ++j) {\n"
          << "              const float a0 = s[j];\n";
      std::vector<std::string> names(k.epilogue.size());
      for (size_t x = 0; x < k.epilogue.size(); ++x) {
        const Expr& e = k.epilogue[x];
        std::vector<std::string> ops;
        for (int o : e.operands) {
          if (o == INT32_MIN) {
            ops.push_back("");
          } else if (o >= 0) {
            ops.push_back("v" + std::to_string(o));
          } else if (o == -1) {
            ops.push_back("a0");
          } else {
            const size_t j = static_cast<size_t>(-o - 2);
            const auto& st = ops_strides[j - 3];
            ops.push_back(B(k.inputs[j]) + "[off[" + std::to_string(4 + j - 3) + "] + (i0 + i) * " +
                          Lit(st[r - 2]) + " + (j0 + j) * " + Lit(st[r - 1]) + "]");
          }
        }
        os_ << "              const " << CType(e.dtype) << " v" << x << " = " << FormatExpr(e, ops)
            << ";\n";
      }
      os_ << "              s[j] = v" << k.epilogue_out << ";\n            }\n";
    }
    os_ << "            const float m_old = mx[i];\n"
        << "            const float m_row = kiln_row_max(s, nk);\n"
        << "            const float m_new = m_row > m_old ? m_row : m_old;\n"
        << "            if (m_new == -INFINITY) {  // nothing but -inf so far: weights 0\n"
        << "              memset(s, 0, sizeof(float) * nk);\n"
        << "              continue;\n            }\n"
        << "            const float sum = kiln_row_exp_sum(s, s, nk, m_new);\n"
        << "            const float corr = kiln_exp(m_old - m_new);\n"
        << "            ls[i] = ls[i] * corr + sum;\n"
        << "            mx[i] = m_new;\n"
        << "            if (corr != 1.0f) {\n"
        << "              float* oa = Oa + i * " << Lit(Dv) << ";\n"
        << "              #pragma GCC ivdep\n"
        << "              for (int64_t d = 0; d < " << Lit(Dv) << "; ++d) oa[d] *= corr;\n"
        << "            }\n          }\n"
        << "          rc = H->sgemm(0, " << va.trans << ", nq, " << Lit(Dv) << ", nk, 1.0f, S, nk, "
        << "vp + j0 * " << Lit(vs[r - 2]) << ", " << Lit(va.ld) << ", 1.0f, Oa, " << Lit(Dv)
        << ", 1);\n"
        << "          if (rc) { __atomic_store_n(&kiln_rc, rc, __ATOMIC_RELAXED); return; }\n"
        << "        }\n"
        << "        for (int64_t i = 0; i < nq; ++i) {\n"
        << "          const float inv = 1.0f / ls[i];\n"
        << "          const float* oa = Oa + i * " << Lit(Dv) << ";\n"
        << "          float* o = op + i * " << Lit(os[r - 2]) << ";\n"
        << "          #pragma GCC ivdep\n"
        << "          for (int64_t d = 0; d < " << Lit(Dv) << "; ++d) o[d * " << Lit(os[r - 1])
        << "] = oa[d] * inv;\n"
        << "        }\n      }\n    };\n"
        << "    KILN_TRY(kiln_par(H, E->threads, " << Lit(BH) << " * " << NQB << ", kiln_body));\n"
        << "    if (kiln_rc) return kiln_rc;\n";
    return Status::OK();
  }

  // Pooling over H and W of a rank-4 tensor in either layout: one output pixel per iteration,
  // the channel loop innermost, so a channels-last tensor is read and written in vectors.
  void EmitPool(const Kernel& k) {
    const Buffer& xb = Buf(k.inputs[0]);
    const Buffer& yb = Buf(k.outputs[0]);
    const Shape& x = xb.type.shape;
    const Shape& y = yb.type.shape;
    const auto xs = LogicalStrides(xb), ys = LogicalStrides(yb);
    const std::string& op = k.node.op_type;
    const bool global = op == "GlobalAveragePool" || op == "GlobalMaxPool";
    const bool max = op == "MaxPool" || op == "GlobalMaxPool";
    const int64_t C = x[1], H = x[2], W = x[3], OH = y[2], OW = y[3];
    std::vector<int64_t> kernel = {H, W}, strides = {1, 1}, pads = {0, 0, 0, 0};
    if (!global) {
      kernel = k.node.GetInts("kernel_shape", {});
      strides = k.node.GetInts("strides", {1, 1});
      pads = k.node.GetInts("pads", {0, 0, 0, 0});
    }
    const bool include_pad = k.node.GetInt("count_include_pad", 0) != 0;
    const std::string X = B(k.inputs[0]), Y = B(k.outputs[0]);
    // A pool with few output pixels (a global pool has one per image) would leave the team
    // nothing to split, so its channels are split too, in blocks of one AVX-512 vector. The
    // cell decides (constants the C++ compiler folds), so the text is the same at every size.
    const int64_t pixels = y[0] * OH * OW;
    const std::string c0 = "c0", c1 = "c1";
    os_ << "    const int64_t kiln_cb = " << Lit(pixels) << " < 8LL && " << Lit(C)
        << " > 16LL ? 16LL : " << Lit(C) << ";\n"
        << "    const int64_t kiln_nc = (" << Lit(C) << " + kiln_cb - 1) / kiln_cb;\n";
    Range r = ParOpen(0, NumElements(x));
    r.n_expr = Lit(pixels) + " * kiln_nc";
    os_ << "    for (int64_t q = " << r.lo << "; q < " << r.hi << "; ++q) {\n";
    os_ << "      const int64_t pix = q / kiln_nc, c0 = (q % kiln_nc) * kiln_cb, c1 = c0 + kiln_cb "
           "< "
        << Lit(C) << " ? c0 + kiln_cb : " << Lit(C) << ";\n";
    os_ << "      const int64_t n = pix / " << Lit(OH * OW) << ", oh = (pix / " << Lit(OW) << ") % "
        << Lit(OH) << ", ow = pix % " << Lit(OW) << ";\n"
        << "      float* y = " << Y << " + n * " << Lit(ys[0]) << " + oh * " << Lit(ys[2])
        << " + ow * " << Lit(ys[3]) << ";\n"
        << "      const float* x = " << X << " + n * " << Lit(xs[0]) << ";\n"
        << "      const int64_t h0 = oh * " << Lit(strides[0]) << " - " << Lit(pads[0])
        << ", w0 = ow * " << Lit(strides[1]) << " - " << Lit(pads[1]) << ";\n"
        << "      const int64_t kh0 = h0 < 0 ? -h0 : 0, kw0 = w0 < 0 ? -w0 : 0;\n"
        << "      const int64_t kh1 = h0 + " << Lit(kernel[0]) << " > " << Lit(H) << " ? " << Lit(H)
        << " - h0 : " << Lit(kernel[0]) << ";\n"
        << "      const int64_t kw1 = w0 + " << Lit(kernel[1]) << " > " << Lit(W) << " ? " << Lit(W)
        << " - w0 : " << Lit(kernel[1]) << ";\n"
        << "      #pragma GCC ivdep\n"
        << "      for (int64_t c = " << c0 << "; c < " << c1 << "; ++c) y[c * " << Lit(ys[1])
        << "] = " << (max ? "-INFINITY" : "0.0f") << ";\n"
        << "      for (int64_t kh = kh0; kh < kh1; ++kh)\n"
        << "        for (int64_t kw = kw0; kw < kw1; ++kw) {\n"
        << "          const float* xp = x + (h0 + kh) * " << Lit(xs[2]) << " + (w0 + kw) * "
        << Lit(xs[3]) << ";\n"
        << "          #pragma GCC ivdep\n"
        << "          for (int64_t c = " << c0 << "; c < " << c1 << "; ++c) {\n"
        << "            const float v = xp[c * " << Lit(xs[1]) << "];\n";
    if (max) {  // NaN wins, as in the reference kernel
      os_ << "            float* a = &y[c * " << Lit(ys[1]) << "];\n"
          << "            *a = (v > *a || v != v) ? v : *a;\n";
    } else {
      os_ << "            y[c * " << Lit(ys[1]) << "] += v;\n";
    }
    os_ << "          }\n        }\n";
    if (!max) {
      const std::string count =
          include_pad ? Lit(kernel[0] * kernel[1]) : "((kh1 - kh0) * (kw1 - kw0))";
      os_ << "      const float inv = 1.0f / (float)" << count << ";\n"
          << "      #pragma GCC ivdep\n"
          << "      for (int64_t c = " << c0 << "; c < " << c1 << "; ++c) y[c * " << Lit(ys[1])
          << "] *= inv;\n";
    }
    os_ << "    }\n";
    ParClose(r);
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
  std::vector<MatmulPlan> mm_plans_;  // per kernel
  std::deque<Buffer> synthetic_;      // AddSynthetic; a deque keeps references stable
  std::deque<std::string> synthetic_expr_;
};

}  // namespace

// TEST ONLY (EmitOptions::test_scan): the cell's own search of its process. The file holds one
// complemented secret per line (every byte XOR 0xff, so neither the file nor this code ever holds
// a secret's bytes); memory is read through /proc/self/mem, mapping by mapping, and compared
// complemented. The first secret is the one that must not be there; any further ones are
// controls the test put there, whose finding shows the search sees what is present.
constexpr const char* kTestScanSource = R"scan(
// TEST ONLY (KILN_TEST_SECRET_SCAN): this cell searches its own process. Not in production cells.
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
static int kiln_test_scan_done = 0;
static unsigned char kiln_test_scan_buf[1 << 20];
static int kiln_test_scan_has(const unsigned char* b, size_t len, const unsigned char* c, size_t n) {
  for (size_t i = 0; n > 0 && i + n <= len; ++i) {
    size_t k = 0;
    while (k < n && (unsigned char)(b[i + k] ^ 0xff) == c[k]) ++k;
    if (k == n) return 1;
  }
  return 0;
}
static void kiln_test_scan_self(void) {
  if (__atomic_exchange_n(&kiln_test_scan_done, 1, __ATOMIC_SEQ_CST)) return;
  const char* path = getenv("KILN_TEST_SECRET_SCAN");
  if (path == NULL) return;
  unsigned char sec[4][256];
  size_t len[4] = {0, 0, 0, 0};
  int count = 0;
  FILE* f = fopen(path, "rb");
  if (f == NULL) return;
  for (int c; count < 4 && (c = fgetc(f)) != EOF;) {
    if (c == '\n') {
      if (len[count] > 0) ++count;
      continue;
    }
    if (len[count] < sizeof sec[0]) sec[count][len[count]++] = (unsigned char)c;
  }
  if (count < 4 && len[count] > 0) ++count;
  fclose(f);
  int in_memory[4] = {0, 0, 0, 0}, in_environ[4] = {0, 0, 0, 0};
  unsigned long regions = 0, bytes = 0, unreadable = 0, skipped = 0;
  int mem = open("/proc/self/mem", O_RDONLY);
  FILE* maps = fopen("/proc/self/maps", "r");
  char line[4096];
  while (mem >= 0 && maps != NULL && fgets(line, sizeof line, maps) != NULL) {
    unsigned long lo = 0, hi = 0;
    char perms[8] = {0};
    if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) != 3 || perms[0] != 'r') continue;
    if (strstr(line, "[vvar") || strstr(line, "[vsyscall]") || strstr(line, " /dev/") ||
        hi - lo > (4UL << 30)) {
      ++skipped;
      continue;
    }
    ++regions;
    size_t keep = 0;
    for (unsigned long pos = lo; pos < hi;) {
      size_t want = sizeof kiln_test_scan_buf - keep;
      if (want > hi - pos) want = hi - pos;
      ssize_t got = pread(mem, kiln_test_scan_buf + keep, want, (off_t)pos);
      if (got <= 0) {
        ++unreadable;
        break;
      }
      bytes += (unsigned long)got;
      size_t have = keep + (size_t)got;
      for (int s = 0; s < count; ++s) {
        in_memory[s] |= kiln_test_scan_has(kiln_test_scan_buf, have, sec[s], len[s]);
      }
      keep = have < 255 ? have : 255;
      memmove(kiln_test_scan_buf, kiln_test_scan_buf + have - keep, keep);
      pos += (unsigned long)got;
    }
  }
  if (maps != NULL) fclose(maps);
  if (mem >= 0) close(mem);
  int env = open("/proc/self/environ", O_RDONLY);
  if (env >= 0) {
    ssize_t got = read(env, kiln_test_scan_buf, sizeof kiln_test_scan_buf);
    for (int s = 0; got > 0 && s < count; ++s) {
      in_environ[s] = kiln_test_scan_has(kiln_test_scan_buf, (size_t)got, sec[s], len[s]);
    }
    close(env);
  }
  memset(kiln_test_scan_buf, 0, sizeof kiln_test_scan_buf);
  char out[4200];
  snprintf(out, sizeof out, "%s.cell.%d.json", path, (int)getpid());
  FILE* o = fopen(out, "w");
  if (o == NULL) return;
  fprintf(o, "{\"role\":\"cell\",\"pid\":%d,\"secrets\":%d,\"in_memory\":[", (int)getpid(), count);
  for (int s = 0; s < count; ++s) fprintf(o, "%s%s", s ? "," : "", in_memory[s] ? "true" : "false");
  fprintf(o, "],\"in_environ\":[");
  for (int s = 0; s < count; ++s) fprintf(o, "%s%s", s ? "," : "", in_environ[s] ? "true" : "false");
  fprintf(o, "],\"regions\":%lu,\"bytes\":%lu,\"unreadable\":%lu,\"skipped\":%lu}\n", regions,
          bytes, unreadable, skipped);
  fclose(o);
}
)scan";

Result<EmittedCell> EmitCell(const std::vector<Program>& entries, const EmitOptions& options,
                             const std::vector<EmittedRangedEntry>& ranged) {
  EmittedCell cell;
  std::ostringstream os;
  os << "// Generated by kiln " << kCodegenVersion << " for graph " << options.graph_digest
     << ". Do not edit.\n// " << entries.size() << " entr" << (entries.size() == 1 ? "y" : "ies")
     << "; compile each with -DKILN_ENTRY=<i> and the dispatch with -DKILN_ENTRY=-1.\n";
  os << kCellPrologue << "\n";
  if (options.test_scan) os << kTestScanSource;
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
  for (size_t r = 0; r < ranged.size(); ++r) {
    nlohmann::json e = ranged[r].describe;
    e["index"] = entries.size() + r;
    ents.push_back(e);
    os << ranged[r].source;
  }
  describe["entries"] = ents;
  cell.describe = describe;

  // The exported ABI: declarations of every entry's functions, then dispatch.
  const size_t total = entries.size() + ranged.size();
  const auto is_ranged = [&](size_t i) { return i >= entries.size(); };
  os << "#if !defined(KILN_ENTRY) || KILN_ENTRY < 0\n";
  for (size_t i = 0; i < total; ++i) {
    os << "extern \"C\" int kiln_e" << i
       << "_run(kiln_cell_entry*, const void* const*, void* const*, char*);\n"
       << "extern \"C\" uint32_t kiln_e" << i << "_num_ops();\n"
       << "extern \"C\" int kiln_e" << i << "_init(kiln_cell_entry*);\n"
       << "extern \"C\" const char* const* kiln_e" << i << "_op_specs();\n";
    if (is_ranged(i)) {
      os << "extern \"C\" uint32_t kiln_e" << i << "_num_values();\n"
         << "extern \"C\" int kiln_e" << i << "_values(const int64_t*, int64_t*);\n";
    }
  }
  os << "static const char kiln_describe_json[] = " << CString(describe.dump()) << ";\n";
  os << "static const uint32_t kiln_num_entries = " << total << ";\n";
  os << "static const uint32_t kiln_num_constants[] = {";
  for (const Program& p : entries) os << p.weights.size() << ", ";
  for (const EmittedRangedEntry& r : ranged) os << r.num_constants << ", ";
  os << "0};\nstatic const uint64_t kiln_workspace[] = {";
  for (const Program& p : entries) os << p.workspace_bytes << "ULL, ";
  for (const EmittedRangedEntry& r : ranged) os << r.workspace_bytes << "ULL, ";
  os << "0};\n";
  // A ranged entry's symbols and its run-time constants (0 and NULL for a concrete entry).
  os << "static const uint32_t kiln_num_symbols[] = {";
  for (size_t i = 0; i < total; ++i) {
    os << (is_ranged(i) ? ranged[i - entries.size()].num_symbols : 0) << ", ";
  }
  os << "0};\nstatic uint32_t (*const kiln_num_values_fns[])() = {";
  for (size_t i = 0; i < total; ++i) {
    os << (is_ranged(i) ? "kiln_e" + std::to_string(i) + "_num_values" : std::string("0")) << ", ";
  }
  os << "0};\nstatic int (*const kiln_values_fns[])(const int64_t*, int64_t*) = {";
  for (size_t i = 0; i < total; ++i) {
    os << (is_ranged(i) ? "kiln_e" + std::to_string(i) + "_values" : std::string("0")) << ", ";
  }
  os << "0};\n";
  os << "typedef int (*kiln_run_fn)(kiln_cell_entry*, const void* const*, void* const*, char*);\n";
  os << "static const kiln_run_fn kiln_runs[] = {";
  for (size_t i = 0; i < total; ++i) os << "kiln_e" << i << "_run, ";
  os << "0};\nstatic uint32_t (*const kiln_num_ops_fns[])() = {";
  for (size_t i = 0; i < total; ++i) os << "kiln_e" << i << "_num_ops, ";
  os << "0};\nstatic int (*const kiln_init_fns[])(kiln_cell_entry*) = {";
  for (size_t i = 0; i < total; ++i) os << "kiln_e" << i << "_init, ";
  os << "0};\nstatic const char* const* (*const kiln_specs_fns[])() = {";
  for (size_t i = 0; i < total; ++i) os << "kiln_e" << i << "_op_specs, ";
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
  for (uint32_t i = 0; i < e->num_mms; ++i) {
    if (e->mms[i]) e->host->matmul_release(e->mms[i]);
  }
  free(e->mms);
  free(e->mm_fused);
  free(e->convs);
  free(e->ops);
  free(e->v);
  free((void*)e->w);
  free(e);
}

// A ranged entry's op spec at an instance: each marker \001<j>\002 becomes the decimal of v[j].
// NULL when it cannot allocate.
static char* kiln_spec_at(const char* t, const int64_t* v) {
  size_t n = 1;
  for (const char* p = t; *p; ++p) n += *p == '\001' ? 21 : 1;
  char* out = (char*)malloc(n);
  if (!out) return NULL;
  char* o = out;
  for (const char* p = t; *p;) {
    if (*p != '\001') {
      *o++ = *p++;
      continue;
    }
    uint64_t j = 0;
    for (++p; *p >= '0' && *p <= '9'; ++p) j = j * 10 + (uint64_t)(*p - '0');
    if (*p == '\002') ++p;
    int64_t x = v[j];
    char digits[24];
    int k = 0;
    uint64_t u = x < 0 ? (uint64_t)0 - (uint64_t)x : (uint64_t)x;
    do {
      digits[k++] = (char)('0' + u % 10);
      u /= 10;
    } while (u);
    if (x < 0) *o++ = '-';
    while (k) *o++ = digits[--k];
  }
  *o = 0;
  return out;
}

KILN_EXPORT int kiln_cell_entry_init_at(uint32_t entry, const int64_t* symbols,
                                        uint32_t num_symbols, const kiln_host_api* host,
                                        const void* const* constants, uint32_t num_constants,
                                        int num_threads, kiln_cell_entry** out) {
  if (!out || !host || entry >= kiln_num_entries) return KILN_CELL_BAD_ARGUMENT;
  *out = NULL;
  if (host->abi_version != KILN_CELL_ABI_VERSION) return KILN_CELL_BAD_ARGUMENT;
  if (num_constants != kiln_num_constants[entry]) return KILN_CELL_BAD_ARGUMENT;
  if (num_symbols != kiln_num_symbols[entry] || (num_symbols && !symbols)) {
    return KILN_CELL_BAD_ARGUMENT;
  }
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
  if (kiln_values_fns[entry]) {
    const uint32_t nv = kiln_num_values_fns[entry]();
    e->v = (int64_t*)calloc(nv ? nv : 1, sizeof(int64_t));
    if (!e->v) {
      kiln_cell_entry_release(e);
      return KILN_CELL_RESOURCE_EXHAUSTED;
    }
    const int vrc = kiln_values_fns[entry](symbols, e->v);
    if (vrc) {
      kiln_cell_entry_release(e);
      return vrc;
    }
  }
  for (uint32_t i = 0; i < num_constants; ++i) e->w[i] = constants[i];
  const char* const* specs = kiln_specs_fns[entry]();
  for (uint32_t i = 0; i < nops; ++i) {
    char* spec = e->v ? kiln_spec_at(specs[i], e->v) : NULL;
    if (e->v && !spec) {
      kiln_cell_entry_release(e);
      return KILN_CELL_RESOURCE_EXHAUSTED;
    }
    int rc = host->op_prepare(spec ? spec : specs[i], &e->ops[i]);
    free(spec);
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

KILN_EXPORT int kiln_cell_entry_init(uint32_t entry, const kiln_host_api* host,
                                     const void* const* constants, uint32_t num_constants,
                                     int num_threads, kiln_cell_entry** out) {
  return kiln_cell_entry_init_at(entry, NULL, 0, host, constants, num_constants, num_threads, out);
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
