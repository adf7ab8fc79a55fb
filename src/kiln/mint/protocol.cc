// The mint child protocol's files and frames (mint layer; see protocol.h).
#include "src/kiln/mint/protocol.h"

#include <cstdio>

namespace kiln {
namespace {

// Reads typed fields out of one JSON object, remembering the first error.
class Fields {
 public:
  Fields(const nlohmann::json& j, std::string what) : j_(j), what_(std::move(what)) {}
  template <typename T>
  void Get(const char* name, T* out, bool required = true) {
    if (!status_.ok()) return;
    const auto it = j_.find(name);
    if (it == j_.end()) {
      if (required) status_ = Status::InvalidArgument(what_ + ": field '" + name + "' is missing");
      return;
    }
    try {
      *out = it->template get<T>();
    } catch (const nlohmann::json::exception&) {
      status_ = Status::InvalidArgument(what_ + ": field '" + name + "' has the wrong type (" +
                                        it->dump() + ")");
    }
  }
  const Status& status() const { return status_; }

 private:
  const nlohmann::json& j_;
  const std::string what_;
  Status status_;
};

Result<nlohmann::json> ParseObject(const std::string& text, const std::string& what) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return Status::InvalidArgument(what + " is not a JSON object");
  return j;
}

}  // namespace

nlohmann::json ToJson(const MintChildRequest& r) {
  nlohmann::json j = {
      {"manifest", r.manifest}, {"target", r.target},   {"intake", r.intake},
      {"out_dir", r.out_dir},   {"report", r.report},   {"phases", r.phases},
      {"threads", r.threads},   {"attempt", r.attempt}, {"parallel_compiles", r.parallel_compiles}};
  if (!r.manifest_base_dir.empty()) j["manifest_base_dir"] = r.manifest_base_dir;
  return j;
}

nlohmann::json ToJson(const MintChildReport& r) {
  nlohmann::json phases = nlohmann::json::array();
  for (const auto& p : r.phases) phases.push_back({{"phase", p.phase}, {"ms", p.ms}});
  return {{"status", r.status},
          {"token", r.token},
          {"message", r.message},
          {"artifact", r.artifact},
          {"key", r.key},
          {"digest", r.digest},
          {"axes",
           {{"graph", r.axes.graph},
            {"envelope", r.axes.envelope},
            {"sm", r.axes.sm},
            {"toolchain", r.axes.toolchain}}},
          {"family", r.family},
          {"lane", r.lane},
          {"gate", r.gate},
          {"phases", phases},
          {"peak_rss_kb", r.peak_rss_kb},
          {"entry_classes", r.entry_classes}};
}

Result<MintChildRequest> ParseMintChildRequest(const std::string& text, const std::string& what) {
  KILN_ASSIGN_OR_RETURN(nlohmann::json j, ParseObject(text, what));
  MintChildRequest r;
  Fields f(j, what);
  f.Get("manifest", &r.manifest);
  f.Get("manifest_base_dir", &r.manifest_base_dir, /*required=*/false);
  f.Get("target", &r.target);
  f.Get("intake", &r.intake);
  f.Get("out_dir", &r.out_dir);
  f.Get("report", &r.report);
  f.Get("phases", &r.phases);
  f.Get("threads", &r.threads);
  f.Get("parallel_compiles", &r.parallel_compiles);
  f.Get("attempt", &r.attempt);
  KILN_RETURN_IF_ERROR(f.status());
  if (r.manifest.empty() || r.target.empty() || r.out_dir.empty() || r.report.empty()) {
    return Status::InvalidArgument(what + ": manifest, target, out_dir and report must be set");
  }
  if (r.threads < 1 || r.parallel_compiles < 1 || r.attempt < 1) {
    return Status::InvalidArgument(what + ": threads, parallel_compiles and attempt must be >= 1");
  }
  return r;
}

Result<MintChildReport> ParseMintChildReport(const std::string& text, const std::string& what) {
  KILN_ASSIGN_OR_RETURN(nlohmann::json j, ParseObject(text, what));
  MintChildReport r;
  Fields f(j, what);
  f.Get("status", &r.status);
  f.Get("token", &r.token);
  f.Get("message", &r.message);
  f.Get("artifact", &r.artifact);
  f.Get("key", &r.key);
  f.Get("digest", &r.digest);
  f.Get("family", &r.family);
  f.Get("lane", &r.lane);
  f.Get("gate", &r.gate);
  f.Get("peak_rss_kb", &r.peak_rss_kb);
  f.Get("entry_classes", &r.entry_classes, /*required=*/false);
  nlohmann::json axes, phases;
  f.Get("axes", &axes);
  f.Get("phases", &phases);
  KILN_RETURN_IF_ERROR(f.status());
  Fields a(axes, what + " axes");
  a.Get("graph", &r.axes.graph);
  a.Get("envelope", &r.axes.envelope);
  a.Get("sm", &r.axes.sm);
  a.Get("toolchain", &r.axes.toolchain);
  KILN_RETURN_IF_ERROR(a.status());
  if (!phases.is_array()) return Status::InvalidArgument(what + ": phases is not an array");
  for (const auto& p : phases) {
    MintChildPhase ph;
    Fields pf(p, what + " phase");
    pf.Get("phase", &ph.phase);
    pf.Get("ms", &ph.ms);
    KILN_RETURN_IF_ERROR(pf.status());
    r.phases.push_back(ph);
  }
  // "running" only in the live phases file, which a killed child leaves behind.
  static const char* const kStatuses[] = {"minted", "refused", "resource", "bad_request",
                                          "running"};
  bool known = false;
  for (const char* s : kStatuses) known = known || r.status == s;
  if (!known) return Status::InvalidArgument(what + ": unknown status '" + r.status + "'");
  return r;
}

std::string MintFrameLine(const std::string& phase, int step, int total, const std::string& note) {
  return std::string(kMintFramePrefix) +
         nlohmann::json{{"phase", phase}, {"step", step}, {"total", total}, {"note", note}}.dump();
}

std::string MintPhasesDetail(const MintChildReport& report) {
  std::string s;
  for (const auto& p : report.phases) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%s=%.1f", p.phase.c_str(), p.ms);
    s += (s.empty() ? "" : " ") + std::string(buf);
  }
  return s;
}

}  // namespace kiln
