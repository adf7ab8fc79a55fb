// Program helpers: buffers, aliases, the verifier and the text dump (compile layer).
#include "src/kiln/compile/program.h"

#include <set>
#include <sstream>

namespace kiln {

int Program::AddBuffer(Buffer b) {
  b.id = static_cast<int>(buffers.size());
  buffers.push_back(std::move(b));
  return buffers.back().id;
}

int Program::Root(int id) const {
  while (buffers[static_cast<size_t>(id)].alias_of >= 0) id = buffers[static_cast<size_t>(id)].alias_of;
  return id;
}

Status Program::Verify() const {
  std::vector<bool> defined(buffers.size(), false);
  auto bad = [&](const std::string& msg) {
    return Status::Internal("program " + entry_name + " is invalid: " + msg);
  };
  for (const Buffer& b : buffers) {
    if (b.kind != Buffer::Kind::kTemp) defined[static_cast<size_t>(b.id)] = true;
    if (b.kind == Buffer::Kind::kWeight && b.value.valid()) {
      return bad("weight buffer '" + b.name + "' holds a value (law 1)");
    }
  }
  auto is_defined = [&](int id) {
    return defined[static_cast<size_t>(Root(id))];
  };
  for (size_t k = 0; k < kernels.size(); ++k) {
    const Kernel& kern = kernels[k];
    for (int in : kern.inputs) {
      if (in == -1 && kern.kind == Kernel::Kind::kReference) continue;  // absent optional input
      if (in < 0 || in >= static_cast<int>(buffers.size())) return bad("bad buffer id");
      if (!is_defined(in)) {
        return bad("kernel " + std::to_string(k) + " (" + kern.label + ") reads '" +
                   buffers[static_cast<size_t>(in)].name + "' before it is written");
      }
    }
    for (int out : kern.outputs) {
      const Buffer& b = buffers[static_cast<size_t>(out)];
      if (b.kind != Buffer::Kind::kTemp || b.alias_of >= 0) {
        return bad("kernel " + std::to_string(k) + " writes non-temp '" + b.name + "'");
      }
      if (defined[static_cast<size_t>(out)]) {
        return bad("'" + b.name + "' is written twice");
      }
      defined[static_cast<size_t>(out)] = true;
    }
    if (kern.kind == Kernel::Kind::kFused && kern.output_exprs.size() != kern.outputs.size()) {
      return bad("fused kernel " + std::to_string(k) + " has mismatched outputs");
    }
  }
  for (const Buffer& b : buffers) {
    if (b.alias_of >= 0) {
      const Buffer& r = buffers[static_cast<size_t>(b.alias_of)];
      if (r.type.dtype != b.type.dtype || NumElements(r.type.shape) != NumElements(b.type.shape)) {
        return bad("alias '" + b.name + "' does not match '" + r.name + "'");
      }
    }
  }
  for (int out : outputs) {
    if (!is_defined(out)) return bad("output '" + buffers[static_cast<size_t>(out)].name + "' is never written");
  }
  return Status::OK();
}

std::string Program::Dump() const {
  std::ostringstream os;
  auto name = [&](int id) {
    const Buffer& b = buffers[static_cast<size_t>(id)];
    std::string s = "%" + std::to_string(id);
    if (b.kind == Buffer::Kind::kWeight) s = "w" + std::to_string(b.index);
    if (b.kind == Buffer::Kind::kConst) s = "c" + std::to_string(b.index);
    if (b.kind == Buffer::Kind::kInput) s = "in" + std::to_string(b.index);
    return s;
  };
  os << "program " << entry_name << " (workspace " << workspace_bytes << " bytes)\n";
  for (const Buffer& b : buffers) {
    if (b.alias_of >= 0) {
      os << "  " << name(b.id) << " = view " << name(b.alias_of) << " as " << b.type.ToString()
         << "\n";
    }
  }
  for (const Kernel& k : kernels) {
    os << "  ";
    for (size_t i = 0; i < k.outputs.size(); ++i) {
      const Buffer& b = buffers[static_cast<size_t>(k.outputs[i])];
      os << (i ? ", " : "") << name(b.id) << ":" << b.type.ToString();
      if (b.output_slot >= 0) os << "@out" << b.output_slot;
      if (b.dynamic) os << "(dynamic)";
      if (b.offset >= 0) os << "@" << b.offset;
    }
    os << " = " << k.label << "(";
    for (size_t i = 0; i < k.inputs.size(); ++i) os << (i ? ", " : "") << name(k.inputs[i]);
    os << ")\n";
  }
  os << "  return";
  for (int o : outputs) os << " " << name(o);
  os << "\n";
  return os.str();
}

}  // namespace kiln
