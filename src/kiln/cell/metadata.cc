// metadata.json: serialization, strict parsing and key restatement (cell layer; see metadata.h).
//
// Parse checks types and required fields only; RestateKey checks how the recorded facts relate
// (axes against the blocks they digest, entries against the envelope). Admission runs both, in
// that order, before anything is loaded (docs/design.md §2 laws 3-4).
#include "src/kiln/cell/metadata.h"

#include <algorithm>
#include <limits>
#include <set>

#include "src/kiln/base/canonical_json.h"

namespace kiln {

namespace {

using Json = nlohmann::json;

// ---- serialization --------------------------------------------------------------------------

Json SpecToJson(const TensorSpec& t) {
  Json shape = t.shape;
  for (size_t i = 0; i < t.dim_symbols.size() && i < t.shape.size(); ++i) {
    if (!t.dim_symbols[i].empty()) shape[i] = t.dim_symbols[i];
  }
  for (size_t i = 0; i < t.dim_polys.size() && i < t.shape.size(); ++i) {
    if (!t.dim_polys[i].empty()) shape[i] = Json{{"poly", t.dim_polys[i]}};
  }
  Json j{{"name", t.name}, {"dtype", DTypeName(t.dtype)}, {"shape", shape}};
  if (t.dynamic) j["dynamic"] = true;  // written only when set: static specs keep their bytes
  return j;
}

Json SpecsToJson(const std::vector<TensorSpec>& specs) {
  Json out = Json::array();
  for (const TensorSpec& t : specs) out.push_back(SpecToJson(t));
  return out;
}

Json ShapeClassToJson(const ShapeClass& c) {
  Json out = Json::object();
  for (const auto& [input, shape] : c) out[input] = shape;
  return out;
}

Json MetadataToJson(const CellMetadata& m) {
  Json entries = Json::array();
  for (const EntryMetadata& e : m.entries) {
    Json j{{"index", e.index},
           {"inputs", SpecsToJson(e.inputs)},
           {"outputs", SpecsToJson(e.outputs)},
           {"workspace_bytes", e.workspace_bytes},
           {"constants", SpecsToJson(e.constants)}};
    if (e.ranged) {
      j["ranged"] = RangedToJson(*e.ranged);
    } else {
      j["shape_class"] = ShapeClassToJson(e.shape_class);
    }
    entries.push_back(std::move(j));
  }
  Json out{{"format_version", m.format_version},
           {"key", m.key},
           {"family", m.family},
           {"codegen_version", m.codegen_version},
           {"axes",
            {{"graph", m.axes.graph},
             {"envelope", m.axes.envelope},
             {"sm", m.axes.sm},
             {"toolchain", m.axes.toolchain}}},
           {"envelope", m.envelope},
           {"toolchain", m.toolchain},
           {"sm", m.sm},
           {"entries", std::move(entries)},
           {"fence",
            {{"checkpoint_free", m.fence.checkpoint_free},
             {"perturbed_checkpoint_matched", m.fence.perturbed_checkpoint_matched},
             {"constant_table_complete", m.fence.constant_table_complete}}}};
  // Written only when some class has none: a full cell keeps the bytes it always had.
  if (!m.gaps.empty()) {
    Json gaps = Json::array();
    for (const EntryGap& g : m.gaps) {
      if (g.ranged) {
        gaps.push_back(Json{{"ranged", RangedToJson(*g.ranged)}, {"reason", g.reason}});
      } else {
        gaps.push_back(
            Json{{"shape_class", ShapeClassToJson(g.shape_class)}, {"reason", g.reason}});
      }
    }
    out["gaps"] = std::move(gaps);
  }
  return out;
}

// ---- parsing --------------------------------------------------------------------------------

// A reader for one JSON object at `path` ("$.entries[0]"): typed field access that names the
// path, the field and the expectation, and a final check that no field went unread.
class ObjectReader {
 public:
  ObjectReader(const Json& obj, std::string path) : obj_(obj), path_(std::move(path)) {}

  Status CheckIsObject() const {
    if (!obj_.is_object()) {
      return Status::InvalidArgument(path_ + " is " + TypeOf(obj_) + ", expected an object");
    }
    return Status::OK();
  }

  Result<const Json*> Field(const std::string& name) {
    auto it = obj_.find(name);
    if (it == obj_.end()) {
      return Status::InvalidArgument(path_ + " has no field '" + name + "'; it is required");
    }
    read_.insert(name);
    return &*it;
  }

  Result<std::string> String(const std::string& name) {
    KILN_ASSIGN_OR_RETURN(const Json* v, Field(name));
    if (!v->is_string()) return TypeError(name, *v, "a string");
    return v->get<std::string>();
  }

  Result<bool> Bool(const std::string& name) {
    KILN_ASSIGN_OR_RETURN(const Json* v, Field(name));
    if (!v->is_boolean()) return TypeError(name, *v, "a bool");
    return v->get<bool>();
  }

  // A non-negative integer no larger than `max`.
  Result<uint64_t> Unsigned(const std::string& name, uint64_t max) {
    KILN_ASSIGN_OR_RETURN(const Json* v, Field(name));
    if (v->is_number_unsigned()) {
      const uint64_t u = v->get<uint64_t>();
      if (u <= max) return u;
    } else if (v->is_number_integer() && v->get<int64_t>() >= 0 &&
               static_cast<uint64_t>(v->get<int64_t>()) <= max) {
      return static_cast<uint64_t>(v->get<int64_t>());
    }
    return TypeError(name, *v, "an integer in [0, " + std::to_string(max) + "]");
  }

  Result<const Json*> Object(const std::string& name) {
    KILN_ASSIGN_OR_RETURN(const Json* v, Field(name));
    if (!v->is_object()) return TypeError(name, *v, "an object");
    return v;
  }

  Result<const Json*> Array(const std::string& name) {
    KILN_ASSIGN_OR_RETURN(const Json* v, Field(name));
    if (!v->is_array()) return TypeError(name, *v, "an array");
    return v;
  }

  // Refuses the first field (in sorted order) that no accessor read.
  Status NoUnknownFields() const {
    for (auto it = obj_.begin(); it != obj_.end(); ++it) {
      if (read_.count(it.key()) == 0) {
        return Status::InvalidArgument(path_ + " has unknown field '" + it.key() +
                                       "'; format_version " + std::to_string(kCellFormatVersion) +
                                       " does not define it");
      }
    }
    return Status::OK();
  }

  const std::string& path() const { return path_; }

  static std::string TypeOf(const Json& v) {
    switch (v.type()) {
      case Json::value_t::null:
        return "null";
      case Json::value_t::boolean:
        return "a bool";
      case Json::value_t::number_integer:
      case Json::value_t::number_unsigned:
        return "the integer " + v.dump();
      case Json::value_t::number_float:
        return "the float " + v.dump();
      case Json::value_t::string:
        return "a string";
      case Json::value_t::array:
        return "an array";
      case Json::value_t::object:
        return "an object";
      default:
        return "an unsupported value";
    }
  }

 private:
  Status TypeError(const std::string& name, const Json& v, const std::string& expected) const {
    return Status::InvalidArgument(path_ + "." + name + " is " + TypeOf(v) + ", expected " +
                                   expected);
  }

  const Json& obj_;
  std::string path_;
  std::set<std::string> read_;
};

Result<Shape> ParseDims(const Json& v, const std::string& path) {
  if (!v.is_array()) {
    return Status::InvalidArgument(path + " is " + ObjectReader::TypeOf(v) +
                                   ", expected an array of dims");
  }
  Shape shape;
  for (size_t i = 0; i < v.size(); ++i) {
    const Json& d = v[i];
    const bool ok =
        (d.is_number_unsigned() &&
         d.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) ||
        (d.is_number_integer() && !d.is_number_unsigned() && d.get<int64_t>() >= 0);
    if (!ok) {
      return Status::InvalidArgument(path + "[" + std::to_string(i) + "] is " +
                                     ObjectReader::TypeOf(d) +
                                     ", expected a non-negative integer dim");
    }
    shape.push_back(d.get<int64_t>());
  }
  return shape;
}

// `symbols`: the symbols a ranged entry's spec may name in its shape (null: none, a concrete
// entry's).
// A ranged output's dim polynomial: well formed, in the entry's symbols, and a size >= 0 that fits
// 64 bits at every corner of the ranges. It is multilinear (no symbol twice in a term), so its
// value anywhere in the box lies between its corners' values: the corners bound it everywhere.
Status CheckDimPoly(const std::string& text, const RangedEntry& ranged, const std::string& at) {
  Result<SymDim> poly = ParseSymDim(text);
  if (!poly.ok()) return poly.status().WithContext(at);
  std::vector<std::string> symbols;
  for (const auto& [names, coeff] : poly->terms) {
    for (const std::string& n : names) {
      if (!ranged.ranges.count(n)) {
        return Status::InvalidArgument(at + " is " + text + ", whose '" + n +
                                       "' is no symbol of the entry");
      }
      if (std::find(symbols.begin(), symbols.end(), n) == symbols.end()) symbols.push_back(n);
    }
  }
  if (symbols.size() > 6) {
    return Status::InvalidArgument(at + " is " + text + ", a polynomial in more than 6 symbols");
  }
  for (size_t corner = 0; corner < (size_t{1} << symbols.size()); ++corner) {
    SymbolPoint p;
    for (size_t b = 0; b < symbols.size(); ++b) {
      const auto [lo, hi] = ranged.ranges.at(symbols[b]);
      p[symbols[b]] = CoordinateOf(ranged, symbols[b], (corner >> b) & 1 ? hi : lo);
    }
    int64_t v = -1;
    if (!poly->Eval(p, &v) || v < 0) {
      return Status::InvalidArgument(at + " is " + text + ", which is no size >= 0 at a corner " +
                                     "of the entry's ranges (coordinates " + DescribePoint(p) +
                                     ")");
    }
  }
  return Status::OK();
}

Result<TensorSpec> ParseSpec(const Json& v, const std::string& path, const RangedEntry* ranged) {
  ObjectReader r(v, path);
  KILN_RETURN_IF_ERROR(r.CheckIsObject());
  TensorSpec t;
  KILN_ASSIGN_OR_RETURN(t.name, r.String("name"));
  if (t.name.empty()) return Status::InvalidArgument(path + ".name is empty; expected a name");
  KILN_ASSIGN_OR_RETURN(std::string dtype, r.String("dtype"));
  Result<DType> dt = DTypeFromName(dtype);
  if (!dt.ok()) return dt.status().WithContext(path + ".dtype");
  t.dtype = *dt;
  KILN_ASSIGN_OR_RETURN(const Json* shape, r.Array("shape"));
  if (ranged != nullptr) {
    Json dims = *shape;
    std::vector<std::string> names(dims.size()), polys(dims.size());
    bool any = false, any_poly = false;
    for (size_t i = 0; i < dims.size(); ++i) {
      const std::string at = path + ".shape[" + std::to_string(i) + "]";
      if (dims[i].is_object() && dims[i].size() == 1 && dims[i].contains("poly") &&
          dims[i]["poly"].is_string()) {
        polys[i] = dims[i]["poly"].get<std::string>();
        KILN_RETURN_IF_ERROR(CheckDimPoly(polys[i], *ranged, at));
        dims[i] = 0;
        any_poly = true;
        continue;
      }
      if (!dims[i].is_string()) continue;
      names[i] = dims[i].get<std::string>();
      if (ranged->ranges.count(names[i]) == 0) {
        return Status::InvalidArgument(at + " is '" + names[i] +
                                       "', expected a dim, a symbol of the entry or {\"poly\": …}");
      }
      dims[i] = 0;
      any = true;
    }
    KILN_ASSIGN_OR_RETURN(t.shape, ParseDims(dims, path + ".shape"));
    if (any) t.dim_symbols = std::move(names);
    if (any_poly) t.dim_polys = std::move(polys);
  } else {
    KILN_ASSIGN_OR_RETURN(t.shape, ParseDims(*shape, path + ".shape"));
  }
  if (v.contains("dynamic")) {
    KILN_ASSIGN_OR_RETURN(t.dynamic, r.Bool("dynamic"));
    if (!t.dynamic) {
      return Status::InvalidArgument(path + ".dynamic is false; it is written only as true");
    }
    if (!t.shape.empty()) {
      return Status::InvalidArgument(path + " is dynamic with shape " + ShapeToString(t.shape) +
                                     "; a dynamic spec has shape []");
    }
  }
  KILN_RETURN_IF_ERROR(r.NoUnknownFields());
  return t;
}

// A list of specs whose names are unique within the list (weights and I/O are bound by name).
Result<std::vector<TensorSpec>> ParseSpecs(ObjectReader& r, const std::string& name,
                                           const RangedEntry* ranged = nullptr) {
  KILN_ASSIGN_OR_RETURN(const Json* arr, r.Array(name));
  std::vector<TensorSpec> out;
  std::set<std::string> names;
  for (size_t i = 0; i < arr->size(); ++i) {
    const std::string path = r.path() + "." + name + "[" + std::to_string(i) + "]";
    KILN_ASSIGN_OR_RETURN(TensorSpec t, ParseSpec((*arr)[i], path, ranged));
    if (!names.insert(t.name).second) {
      return Status::InvalidArgument(path + " names '" + t.name + "' again; each " + name +
                                     " name must appear once");
    }
    out.push_back(std::move(t));
  }
  return out;
}

Result<ShapeClass> ParseShapeClass(const Json& sc, const std::string& path) {
  ShapeClass c;
  for (auto it = sc.begin(); it != sc.end(); ++it) {
    KILN_ASSIGN_OR_RETURN(c[it.key()], ParseDims(it.value(), path + "." + it.key()));
  }
  return c;
}

Result<EntryMetadata> ParseEntry(const Json& v, const std::string& path) {
  ObjectReader r(v, path);
  KILN_RETURN_IF_ERROR(r.CheckIsObject());
  EntryMetadata e;
  KILN_ASSIGN_OR_RETURN(uint64_t index, r.Unsigned("index", std::numeric_limits<uint32_t>::max()));
  e.index = static_cast<uint32_t>(index);
  const RangedEntry* symbols = nullptr;
  if (v.contains("ranged")) {
    KILN_ASSIGN_OR_RETURN(const Json* ranged, r.Object("ranged"));
    Result<RangedEntry> entry = RangedFromJson(*ranged);
    if (!entry.ok()) return entry.status().WithContext(path + ".ranged");
    KILN_RETURN_IF_ERROR(CheckRangedEntry(*entry, path + ".ranged"));
    e.ranged = std::move(entry).value();
    symbols = &*e.ranged;
  } else {
    // An empty shape class is the entry of a graph with no runtime inputs.
    KILN_ASSIGN_OR_RETURN(const Json* sc, r.Object("shape_class"));
    KILN_ASSIGN_OR_RETURN(e.shape_class, ParseShapeClass(*sc, path + ".shape_class"));
  }
  KILN_ASSIGN_OR_RETURN(e.inputs, ParseSpecs(r, "inputs", symbols));
  KILN_ASSIGN_OR_RETURN(e.outputs, ParseSpecs(r, "outputs", symbols));
  if (e.ranged) {
    // The inputs are the entry's, dim by dim: what ingress matches a request against.
    for (const TensorSpec& t : e.inputs) {
      if (!t.dim_polys.empty()) {
        return Status::InvalidArgument(path + " input '" + t.name +
                                       "' has a dim polynomial; an input's dims are sizes or "
                                       "symbols");
      }
      auto it = e.ranged->inputs.find(t.name);
      bool same = it != e.ranged->inputs.end() && it->second.size() == t.shape.size();
      for (size_t i = 0; same && i < t.shape.size(); ++i) {
        const std::string sym = t.dim_symbols.empty() ? "" : t.dim_symbols[i];
        same = it->second[i].symbol == sym && (!sym.empty() || it->second[i].size == t.shape[i]);
      }
      if (!same) {
        return Status::InvalidArgument(path + " input '" + t.name +
                                       "' is not the ranged entry's input of that name");
      }
    }
    if (e.inputs.size() != e.ranged->inputs.size()) {
      return Status::InvalidArgument(path + " has " + std::to_string(e.inputs.size()) +
                                     " inputs, its ranged entry " +
                                     std::to_string(e.ranged->inputs.size()));
    }
  }
  KILN_ASSIGN_OR_RETURN(e.workspace_bytes,
                        r.Unsigned("workspace_bytes", std::numeric_limits<uint64_t>::max()));
  KILN_ASSIGN_OR_RETURN(e.constants, ParseSpecs(r, "constants"));
  KILN_RETURN_IF_ERROR(r.NoUnknownFields());
  return e;
}

Result<EntryGap> ParseGap(const Json& v, const std::string& path) {
  ObjectReader r(v, path);
  KILN_RETURN_IF_ERROR(r.CheckIsObject());
  EntryGap g;
  if (v.contains("ranged")) {
    KILN_ASSIGN_OR_RETURN(const Json* ranged, r.Object("ranged"));
    Result<RangedEntry> entry = RangedFromJson(*ranged);
    if (!entry.ok()) return entry.status().WithContext(path + ".ranged");
    KILN_RETURN_IF_ERROR(CheckRangedEntry(*entry, path + ".ranged"));
    g.ranged = std::move(entry).value();
  } else {
    KILN_ASSIGN_OR_RETURN(const Json* sc, r.Object("shape_class"));
    KILN_ASSIGN_OR_RETURN(g.shape_class, ParseShapeClass(*sc, path + ".shape_class"));
  }
  KILN_ASSIGN_OR_RETURN(g.reason, r.String("reason"));
  if (g.reason.empty()) {
    return Status::InvalidArgument(path + ".reason is empty; expected why the class has no entry");
  }
  KILN_RETURN_IF_ERROR(r.NoUnknownFields());
  return g;
}

Result<KeyAxes> ParseAxes(const Json& v, const std::string& path) {
  ObjectReader r(v, path);
  KILN_RETURN_IF_ERROR(r.CheckIsObject());
  KeyAxes a;
  KILN_ASSIGN_OR_RETURN(a.graph, r.String("graph"));
  KILN_ASSIGN_OR_RETURN(a.envelope, r.String("envelope"));
  KILN_ASSIGN_OR_RETURN(a.sm, r.String("sm"));
  KILN_ASSIGN_OR_RETURN(a.toolchain, r.String("toolchain"));
  KILN_RETURN_IF_ERROR(r.NoUnknownFields());  // an unknown axis is refused by name (§5)
  return a;
}

Result<FenceFlags> ParseFence(const Json& v, const std::string& path) {
  ObjectReader r(v, path);
  KILN_RETURN_IF_ERROR(r.CheckIsObject());
  FenceFlags f;
  KILN_ASSIGN_OR_RETURN(f.checkpoint_free, r.Bool("checkpoint_free"));
  KILN_ASSIGN_OR_RETURN(f.perturbed_checkpoint_matched, r.Bool("perturbed_checkpoint_matched"));
  KILN_ASSIGN_OR_RETURN(f.constant_table_complete, r.Bool("constant_table_complete"));
  KILN_RETURN_IF_ERROR(r.NoUnknownFields());
  return f;
}

Result<CellMetadata> MetadataFromJson(const Json& j) {
  ObjectReader r(j, "$");
  KILN_RETURN_IF_ERROR(r.CheckIsObject());
  CellMetadata m;
  // The version first: a newer layout is refused as such, not as a list of unknown fields.
  KILN_ASSIGN_OR_RETURN(const Json* version, r.Field("format_version"));
  if (!version->is_number_integer() || version->get<int64_t>() != kCellFormatVersion) {
    return Status::InvalidArgument("$.format_version is " + version->dump() +
                                   "; this build reads format_version " +
                                   std::to_string(kCellFormatVersion) + " only");
  }
  m.format_version = kCellFormatVersion;
  KILN_ASSIGN_OR_RETURN(m.key, r.String("key"));
  if (!IsWellFormedKey(m.key)) {
    return Status::InvalidArgument("$.key is '" + m.key + "', expected ck1- and 56 lowercase hex");
  }
  KILN_ASSIGN_OR_RETURN(m.family, r.String("family"));
  KILN_ASSIGN_OR_RETURN(m.codegen_version, r.String("codegen_version"));
  KILN_ASSIGN_OR_RETURN(const Json* axes, r.Object("axes"));
  KILN_ASSIGN_OR_RETURN(m.axes, ParseAxes(*axes, "$.axes"));
  // Both blocks are canonical JSON like the whole file: one holding what canonical JSON cannot (a
  // float) is refused here by type, so what parses always serializes back (found by
  // fuzz/cell_metadata_fuzz.cc; before, it surfaced only at RestateKey, as a key error).
  KILN_ASSIGN_OR_RETURN(const Json* envelope, r.Object("envelope"));
  KILN_RETURN_IF_ERROR(CanonicalJson(*envelope).status().WithContext("$.envelope"));
  m.envelope = *envelope;
  KILN_ASSIGN_OR_RETURN(const Json* toolchain, r.Object("toolchain"));
  KILN_RETURN_IF_ERROR(CanonicalJson(*toolchain).status().WithContext("$.toolchain"));
  m.toolchain = *toolchain;
  KILN_ASSIGN_OR_RETURN(m.sm, r.String("sm"));
  KILN_ASSIGN_OR_RETURN(const Json* entries, r.Array("entries"));
  for (size_t i = 0; i < entries->size(); ++i) {
    const std::string path = "$.entries[" + std::to_string(i) + "]";
    KILN_ASSIGN_OR_RETURN(EntryMetadata e, ParseEntry((*entries)[i], path));
    if (e.index != i) {
      return Status::InvalidArgument(path + ".index is " + std::to_string(e.index) + ", expected " +
                                     std::to_string(i) +
                                     " (entries are recorded in index order from 0)");
    }
    m.entries.push_back(std::move(e));
  }
  if (j.contains("gaps")) {
    KILN_ASSIGN_OR_RETURN(const Json* gaps, r.Array("gaps"));
    if (gaps->empty()) {
      return Status::InvalidArgument(
          "$.gaps is an empty array; expected at least one gap, or no `gaps` field");
    }
    for (size_t i = 0; i < gaps->size(); ++i) {
      KILN_ASSIGN_OR_RETURN(EntryGap g, ParseGap((*gaps)[i], "$.gaps[" + std::to_string(i) + "]"));
      m.gaps.push_back(std::move(g));
    }
  }
  KILN_ASSIGN_OR_RETURN(const Json* fence, r.Object("fence"));
  KILN_ASSIGN_OR_RETURN(m.fence, ParseFence(*fence, "$.fence"));
  KILN_RETURN_IF_ERROR(r.NoUnknownFields());
  return m;
}

// ---- restatement ----------------------------------------------------------------------------

Status CheckAxis(const char* axis, const std::string& restated, const std::string& recorded) {
  if (restated != recorded) {
    return Status::InvalidArgument(std::string("metadata axis '") + axis + "' restates to '" +
                                   restated + "' but records '" + recorded + "'");
  }
  return Status::OK();
}

// The envelope block must be exactly EnvelopeFacts of the envelope it describes, and every one of
// its classes is served by exactly one entry or named by exactly one gap: a cell answers for the
// whole envelope in its key, compiled or not.
Status CheckEntriesCoverEnvelope(const CellMetadata& m) {
  Result<Envelope> env = EnvelopeFromFacts(m.envelope);
  if (!env.ok()) return env.status().WithContext("metadata envelope");
  KILN_ASSIGN_OR_RETURN(Json canonical, EnvelopeFacts(*env));
  if (canonical != m.envelope) {
    return Status::InvalidArgument(
        "metadata envelope is not in canonical form (classes sorted, no other fields); "
        "expected " +
        canonical.dump());
  }
  std::vector<std::string> classes;
  for (const Json& c : canonical["classes"]) {
    KILN_ASSIGN_OR_RETURN(std::string text, CanonicalJson(c));
    classes.push_back(std::move(text));
  }
  if (m.entries.empty()) {
    return Status::InvalidArgument("metadata has no entries; expected at least one compiled class");
  }
  // served_by[c]: who answers for class c, as words for a message ("" = nobody yet).
  std::vector<std::string> served_by(classes.size());
  auto claim = [&](const ShapeClass& sc, const std::string& who) -> Status {
    KILN_ASSIGN_OR_RETURN(std::string text, CanonicalJson(ShapeClassToJson(sc)));
    auto it = std::find(classes.begin(), classes.end(), text);
    if (it == classes.end()) {
      return Status::InvalidArgument("metadata " + who + " shape class " + text +
                                     " is not a class of the envelope");
    }
    std::string& slot = served_by[static_cast<size_t>(it - classes.begin())];
    if (!slot.empty()) {
      return Status::InvalidArgument("metadata " + slot + " and " + who +
                                     " both answer for shape class " + text +
                                     "; expected one entry or one gap per class");
    }
    slot = who;
    return Status::OK();
  };
  // A declared ranged entry is compiled as its pieces (RangedPieces), every one an entry, or is
  // named by exactly one gap.
  std::vector<std::vector<RangedEntry>> pieces;
  for (const RangedEntry& r : env->ranged) pieces.push_back(RangedPieces(r));
  std::vector<std::vector<std::string>> piece_served(env->ranged.size());
  for (size_t r = 0; r < env->ranged.size(); ++r) piece_served[r].resize(pieces[r].size());
  for (size_t i = 0; i < m.entries.size(); ++i) {
    const std::string who = "entry " + std::to_string(i);
    if (!m.entries[i].ranged) {
      KILN_RETURN_IF_ERROR(claim(m.entries[i].shape_class, who));
      continue;
    }
    bool found = false;
    for (size_t r = 0; r < pieces.size() && !found; ++r) {
      for (size_t k = 0; k < pieces[r].size() && !found; ++k) {
        if (pieces[r][k] != *m.entries[i].ranged) continue;
        found = true;
        if (!piece_served[r][k].empty()) {
          return Status::InvalidArgument("metadata " + piece_served[r][k] + " and " + who +
                                         " both serve ranged piece " +
                                         DescribeRanged(pieces[r][k]));
        }
        piece_served[r][k] = who;
      }
    }
    if (!found) {
      return Status::InvalidArgument("metadata " + who + " ranged entry " +
                                     DescribeRanged(*m.entries[i].ranged) +
                                     " is no piece of a ranged entry of the envelope");
    }
  }
  std::vector<bool> ranged_named(env->ranged.size(), false);
  for (size_t i = 0; i < m.gaps.size(); ++i) {
    const std::string who = "gap " + std::to_string(i);
    if (!m.gaps[i].ranged) {
      KILN_RETURN_IF_ERROR(claim(m.gaps[i].shape_class, who));
      continue;
    }
    auto it = std::find(env->ranged.begin(), env->ranged.end(), *m.gaps[i].ranged);
    if (it == env->ranged.end()) {
      return Status::InvalidArgument("metadata " + who + " ranged entry " +
                                     DescribeRanged(*m.gaps[i].ranged) +
                                     " is not an entry of the envelope");
    }
    const size_t at = static_cast<size_t>(it - env->ranged.begin());
    if (ranged_named[at]) {
      return Status::InvalidArgument("metadata " + who + " names ranged entry " +
                                     DescribeRanged(*it) + " again; expected one gap per entry");
    }
    ranged_named[at] = true;
  }
  for (size_t i = 0; i < env->ranged.size(); ++i) {
    size_t served = 0;
    for (const std::string& who : piece_served[i]) served += who.empty() ? 0 : 1;
    if (ranged_named[i] && served > 0) {
      return Status::InvalidArgument("metadata envelope ranged entry " +
                                     DescribeRanged(env->ranged[i]) +
                                     " has a gap and entries; expected one or the other");
    }
    if (!ranged_named[i] && served != pieces[i].size()) {
      return Status::InvalidArgument(
          "metadata envelope ranged entry " + DescribeRanged(env->ranged[i]) + " has " +
          std::to_string(served) + " of its " + std::to_string(pieces[i].size()) +
          " pieces as entries and no gap; expected every piece, or one gap");
    }
  }
  for (size_t c = 0; c < classes.size(); ++c) {
    if (served_by[c].empty()) {
      return Status::InvalidArgument("metadata envelope class " + classes[c] +
                                     " has no entry and no gap; expected one of them per class");
    }
  }
  return Status::OK();
}

}  // namespace

Result<EntryMetadata> EntryAt(const EntryMetadata& entry,
                              const std::map<std::string, int64_t>& point) {
  EntryMetadata out = entry;
  out.ranged.reset();
  SymbolPoint coordinates;
  for (const auto& [name, v] : point) {
    coordinates[name] = entry.ranged ? CoordinateOf(*entry.ranged, name, v) : v;
  }
  auto at = [&](std::vector<TensorSpec>& specs) -> Status {
    for (TensorSpec& t : specs) {
      for (size_t i = 0; i < t.dim_symbols.size(); ++i) {
        if (t.dim_symbols[i].empty()) continue;
        auto it = point.find(t.dim_symbols[i]);
        if (it == point.end()) {
          return Status::InvalidArgument("'" + t.name + "' dim " + std::to_string(i) +
                                         " is symbol '" + t.dim_symbols[i] +
                                         "', which the point does not give");
        }
        t.shape[i] = it->second;
      }
      for (size_t i = 0; i < t.dim_polys.size(); ++i) {
        if (t.dim_polys[i].empty()) continue;
        Result<SymDim> poly = ParseSymDim(t.dim_polys[i]);
        int64_t v = -1;
        if (!poly.ok() || !poly->Eval(coordinates, &v) || v < 0) {
          return Status::InvalidArgument("'" + t.name + "' dim " + std::to_string(i) + " = " +
                                         t.dim_polys[i] + " has no size >= 0 at " +
                                         DescribePoint(point));
        }
        t.shape[i] = v;
      }
      t.dim_symbols.clear();
      t.dim_polys.clear();
    }
    return Status::OK();
  };
  KILN_RETURN_IF_ERROR(at(out.inputs));
  KILN_RETURN_IF_ERROR(at(out.outputs));
  for (const TensorSpec& t : out.inputs) out.shape_class[t.name] = t.shape;
  return out;
}

Result<std::string> SerializeMetadata(const CellMetadata& m) {
  KILN_ASSIGN_OR_RETURN(std::string text, CanonicalJson(MetadataToJson(m)));
  // Never write what ParseMetadata would refuse: a minted cell must be admissible by shape.
  KILN_RETURN_IF_ERROR(ParseMetadata(text, "metadata being serialized").status());
  return text;
}

Result<CellMetadata> ParseMetadata(std::string_view json_text, const std::string& what) {
  KILN_ASSIGN_OR_RETURN(Json j, ParseJson(json_text, what));
  Result<CellMetadata> m = MetadataFromJson(j);
  if (!m.ok()) return m.status().WithContext(what);
  return m;
}

Result<std::string> RestateKey(const CellMetadata& m) {
  if (m.format_version != kCellFormatVersion) {
    return Status::InvalidArgument("metadata format_version is " +
                                   std::to_string(m.format_version) + ", expected " +
                                   std::to_string(kCellFormatVersion));
  }
  Result<std::string> envelope = FactsDigest(m.envelope);
  if (!envelope.ok()) return envelope.status().WithContext("metadata envelope");
  KILN_RETURN_IF_ERROR(CheckAxis("envelope", *envelope, m.axes.envelope));
  Result<std::string> toolchain = FactsDigest(m.toolchain);
  if (!toolchain.ok()) return toolchain.status().WithContext("metadata toolchain");
  KILN_RETURN_IF_ERROR(CheckAxis("toolchain", *toolchain, m.axes.toolchain));
  if (m.sm != m.axes.sm) {
    return Status::InvalidArgument("metadata axis 'sm' records '" + m.axes.sm +
                                   "' but the cell's sm is '" + m.sm + "'");
  }
  KILN_RETURN_IF_ERROR(CheckEntriesCoverEnvelope(m));
  Result<std::string> key = KeyFromAxes(m.axes);
  if (!key.ok()) return key.status().WithContext("metadata");
  if (*key != m.key) {
    return Status::InvalidArgument("metadata key '" + m.key +
                                   "' does not restate: axes graph=" + m.axes.graph +
                                   " envelope=" + m.axes.envelope + " sm=" + m.axes.sm +
                                   " toolchain=" + m.axes.toolchain + " give key '" + *key + "'");
  }
  return *key;
}

}  // namespace kiln
