// The checkpoint-free graph digest (graph layer). See digest.h for what is and is not hashed.
#include "src/kiln/graph/digest.h"

#include <algorithm>
#include <cstring>
#include <unordered_map>

#include "src/kiln/base/canonical_json.h"
#include "src/kiln/base/sha256.h"

namespace kiln {
namespace {

std::string FloatBits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  char buf[16];
  std::snprintf(buf, sizeof(buf), "f%08x", bits);
  return buf;
}

nlohmann::json ShapeJson(const Shape& s) {
  nlohmann::json j = nlohmann::json::array();
  for (int64_t d : s) j.push_back(d);
  return j;
}

nlohmann::json ValueInfoJson(const ValueInfo& v) {
  nlohmann::json dims = nlohmann::json::array();
  for (const Dim& d : v.dims) {
    if (d.known()) {
      dims.push_back(d.value);
    } else {
      dims.push_back("?");  // symbolic names are cosmetic
    }
  }
  nlohmann::json j = {{"name", v.name}, {"dtype", v.has_type ? DTypeName(v.dtype) : "unknown"}};
  j["shape"] = v.has_shape ? dims : nlohmann::json("unknown");
  // Written only for sequences and optionals, so tensor-only graphs keep their digests.
  if (v.kind != ValueKind::kTensor) j["kind"] = ValueKindName(v.kind);
  return j;
}

std::string TensorBytesHash(const Tensor& t) {
  if (t.dtype() == DType::kString) {  // each element's length, then its bytes
    std::string bytes;
    for (int64_t i = 0; i < t.numel(); ++i) {
      bytes += std::to_string(t.str(i).size()) + ":" + t.str(i);
    }
    return Sha256Hex(bytes);
  }
  return Sha256Hex(std::string_view(static_cast<const char*>(t.raw_data()), t.nbytes()));
}

class Digester {
 public:
  // `outer` maps names visible from an enclosing graph to their identities. A subgraph's
  // inputs and outputs bind by position (If branch outputs, Loop body inputs), so their names
  // are scrubbed like any intermediate name; the top-level graph's names are its signature.
  Result<nlohmann::json> Facts(const Graph& g,
                               const std::unordered_map<std::string, std::string>& outer,
                               bool subgraph = false) {
    std::unordered_map<std::string, std::string> id = outer;
    nlohmann::json inputs = nlohmann::json::array();
    for (size_t i = 0; i < g.inputs.size(); ++i) {
      const ValueInfo& v = g.inputs[i];
      nlohmann::json j = ValueInfoJson(v);
      if (subgraph) j["name"] = i;
      id[v.name] = "in:" + Sha256Hex(j.dump());
      inputs.push_back(j);
    }
    nlohmann::json weights = nlohmann::json::array();
    nlohmann::json constants = nlohmann::json::array();
    for (const auto& [name, t] : g.initializers) {  // std::map: sorted by name
      if (g.IsWeight(name)) {
        nlohmann::json j = {
            {"name", name}, {"dtype", DTypeName(t.dtype())}, {"shape", ShapeJson(t.shape())}};
        id[name] = "w:" + Sha256Hex(j.dump());
        weights.push_back(j);
      } else {
        nlohmann::json j = {{"dtype", DTypeName(t.dtype())},
                            {"shape", ShapeJson(t.shape())},
                            {"bytes", TensorBytesHash(t)}};
        const std::string cid = "c:" + Sha256Hex(j.dump());
        id[name] = cid;
        constants.push_back(cid);
      }
    }
    std::sort(constants.begin(), constants.end());

    std::vector<std::string> node_ids;
    for (const Node& n : g.nodes) {
      nlohmann::json nj;
      nj["op"] = n.op_type;
      nj["domain"] = n.domain;
      nj["opset"] = g.opset(n.domain);
      nlohmann::json ins = nlohmann::json::array();
      for (const std::string& in : n.inputs) {
        if (in.empty()) {
          ins.push_back("");
          continue;
        }
        auto it = id.find(in);
        if (it == id.end()) {
          return Status::InvalidArgument(n.Describe() + ": input '" + in +
                                         "' is not defined before use");
        }
        ins.push_back(it->second);
      }
      nj["inputs"] = ins;
      nlohmann::json attrs = nlohmann::json::object();
      for (const auto& [name, a] : n.attrs) {
        KILN_ASSIGN_OR_RETURN(attrs[name], AttrJson(a, id));
      }
      nj["attrs"] = attrs;
      nj["num_outputs"] = n.outputs.size();
      const std::string node_id = Sha256Hex(nj.dump());
      node_ids.push_back(node_id);
      for (size_t k = 0; k < n.outputs.size(); ++k) {
        if (!n.outputs[k].empty()) id[n.outputs[k]] = "n:" + node_id + ":" + std::to_string(k);
      }
    }
    std::sort(node_ids.begin(), node_ids.end());

    nlohmann::json outputs = nlohmann::json::array();
    for (const ValueInfo& v : g.outputs) {
      nlohmann::json j = ValueInfoJson(v);
      if (subgraph) j.erase("name");
      auto it = id.find(v.name);
      if (it == id.end()) {
        return Status::InvalidArgument("graph output '" + v.name + "' is never produced");
      }
      j["value"] = it->second;
      outputs.push_back(j);
    }
    nlohmann::json opsets = nlohmann::json::object();
    for (const auto& [domain, version] : g.opsets)
      opsets[domain.empty() ? "ai.onnx" : domain] = version;
    return nlohmann::json{{"inputs", inputs},       {"outputs", outputs}, {"weights", weights},
                          {"constants", constants}, {"nodes", node_ids},  {"opsets", opsets}};
  }

 private:
  Result<nlohmann::json> AttrJson(const Attribute& a,
                                  const std::unordered_map<std::string, std::string>& scope) {
    nlohmann::json j;
    j["kind"] = AttributeKindName(a.kind);
    switch (a.kind) {
      case Attribute::Kind::kFloat:
        j["v"] = FloatBits(a.f);
        break;
      case Attribute::Kind::kInt:
        j["v"] = a.i;
        break;
      case Attribute::Kind::kString:
        j["v"] = a.s;
        break;
      case Attribute::Kind::kFloats: {
        nlohmann::json v = nlohmann::json::array();
        for (float f : a.floats) v.push_back(FloatBits(f));
        j["v"] = v;
        break;
      }
      case Attribute::Kind::kInts:
        j["v"] = a.ints;
        break;
      case Attribute::Kind::kStrings:
        j["v"] = a.strings;
        break;
      case Attribute::Kind::kTensor:
        // An attribute tensor is part of the node (ConstantOfShape's fill value): hashed by bits.
        j["v"] = {{"dtype", DTypeName(a.t.dtype())},
                  {"shape", ShapeJson(a.t.shape())},
                  {"bytes", TensorBytesHash(a.t)}};
        break;
      case Attribute::Kind::kGraph: {
        KILN_ASSIGN_OR_RETURN(nlohmann::json sub, Facts(*a.g, scope, /*subgraph=*/true));
        j["v"] = Sha256Hex(sub.dump());
        break;
      }
      case Attribute::Kind::kGraphs: {
        nlohmann::json v = nlohmann::json::array();
        for (const auto& g : a.graphs) {
          KILN_ASSIGN_OR_RETURN(nlohmann::json sub, Facts(*g, scope, /*subgraph=*/true));
          v.push_back(Sha256Hex(sub.dump()));
        }
        j["v"] = v;
        break;
      }
      case Attribute::Kind::kType:
        j["v"] = {{"kind", ValueKindName(a.type_kind)}, {"dtype", DTypeName(a.type_dtype)}};
        break;
    }
    return j;
  }
};

}  // namespace

Result<nlohmann::json> GraphFacts(const Graph& graph) {
  // Names and string attributes come from the model file and may hold bytes that are not UTF-8
  // (ONNX attribute strings are bytes); nlohmann::json refuses to dump those by throwing, and no
  // exception may leave the library. Found by fuzz/onnx_import_fuzz.cc.
  try {
    Digester d;
    return d.Facts(graph, {});
  } catch (const nlohmann::json::exception& e) {
    return Status::InvalidArgument("graph '" + graph.name +
                                   "': a name or string attribute is not valid UTF-8, so the graph "
                                   "cannot be digested (" +
                                   e.what() + ")");
  }
}

Result<std::string> GraphDigest(const Graph& graph) {
  KILN_ASSIGN_OR_RETURN(nlohmann::json facts, GraphFacts(graph));
  return FactsDigest(facts);
}

}  // namespace kiln
