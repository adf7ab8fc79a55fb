// Canonical JSON, facts digests and non-throwing JSON parsing (base layer); see canonical_json.h.
#include "src/kiln/base/canonical_json.h"

#include <new>
#include <set>
#include <vector>

#include "src/kiln/base/sha256.h"

namespace kiln {

namespace {

constexpr int kMaxDepth = 256;

// Refuses anything whose text form is not canonical; nlohmann's compact dump() of what is left is
// canonical because nlohmann::json keeps objects in a std::map (byte-wise sorted keys).
Status CheckCanonicalizable(const nlohmann::json& v, std::string& path, int depth) {
  if (depth > kMaxDepth) {
    return Status::InvalidArgument("canonical JSON: value at " + path + " nests deeper than " +
                                   std::to_string(kMaxDepth) + " levels");
  }
  switch (v.type()) {
    case nlohmann::json::value_t::number_float:
      return Status::InvalidArgument("canonical JSON: value at " + path + " is the float " +
                                     v.dump() +
                                     "; canonical JSON holds only integers, strings, bools, "
                                     "null, arrays and objects (record floats as exact bits)");
    case nlohmann::json::value_t::binary:
      return Status::InvalidArgument("canonical JSON: value at " + path +
                                     " is a binary value, which JSON text cannot hold");
    case nlohmann::json::value_t::discarded:
      return Status::InvalidArgument("canonical JSON: value at " + path + " is discarded");
    case nlohmann::json::value_t::array: {
      const size_t base = path.size();
      for (size_t i = 0; i < v.size(); ++i) {
        path += "[" + std::to_string(i) + "]";
        KILN_RETURN_IF_ERROR(CheckCanonicalizable(v[i], path, depth + 1));
        path.resize(base);
      }
      return Status::OK();
    }
    case nlohmann::json::value_t::object: {
      const size_t base = path.size();
      for (const auto& [key, child] : v.items()) {
        path += "." + key;
        KILN_RETURN_IF_ERROR(CheckCanonicalizable(child, path, depth + 1));
        path.resize(base);
      }
      return Status::OK();
    }
    default:
      return Status::OK();
  }
}

// The human part of an nlohmann parse error: drops the "[json.exception.parse_error.101] "
// prefix and the line/column (we report the byte offset instead).
std::string ParseErrorReason(const char* what) {
  std::string s = what;
  const size_t bracket = s.find("] ");
  if (bracket != std::string::npos) s = s.substr(bracket + 2);
  const size_t colon = s.find(": ");
  if (s.rfind("parse error", 0) == 0 && colon != std::string::npos) s = s.substr(colon + 2);
  return s;
}

}  // namespace

Result<std::string> CanonicalJson(const nlohmann::json& value) {
  std::string path = "$";
  KILN_RETURN_IF_ERROR(CheckCanonicalizable(value, path, 0));
  try {
    // indent -1: no whitespace; ensure_ascii false: UTF-8 as-is; strict: invalid UTF-8 throws.
    return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::strict);
  } catch (const nlohmann::json::type_error& e) {
    return Status::InvalidArgument(std::string("canonical JSON: a string is not valid UTF-8: ") +
                                   e.what());
  } catch (const std::bad_alloc&) {
    return Status::ResourceExhausted("canonical JSON: out of memory serializing a value");
  }
}

Result<std::string> FactsDigest(const nlohmann::json& value) {
  KILN_ASSIGN_OR_RETURN(std::string text, CanonicalJson(value));
  return Sha256Hex(text).substr(0, 16);
}

Result<nlohmann::json> ParseJson(std::string_view text, const std::string& what) {
  // One set of keys per open object; the first duplicate seen is reported after the parse.
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  bool has_duplicate = false;
  auto callback = [&](int /*depth*/, nlohmann::json::parse_event_t event,
                      nlohmann::json& parsed) -> bool {
    switch (event) {
      case nlohmann::json::parse_event_t::object_start:
        open_objects.emplace_back();
        break;
      case nlohmann::json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case nlohmann::json::parse_event_t::key:
        if (!open_objects.empty() && parsed.is_string() &&
            !open_objects.back().insert(parsed.get_ref<const std::string&>()).second &&
            !has_duplicate) {
          has_duplicate = true;
          duplicate = parsed.get_ref<const std::string&>();
        }
        break;
      default:
        break;
    }
    return true;
  };
  try {
    nlohmann::json value = nlohmann::json::parse(text.begin(), text.end(), callback,
                                                 /*allow_exceptions=*/true,
                                                 /*ignore_comments=*/false);
    if (has_duplicate) {
      return Status::InvalidArgument(what + ": duplicate key '" + duplicate +
                                     "' in a JSON object; each key must appear once");
    }
    return value;
  } catch (const nlohmann::json::parse_error& e) {
    return Status::InvalidArgument(what + ": invalid JSON at byte " + std::to_string(e.byte) +
                                   " of " + std::to_string(text.size()) + ": " +
                                   ParseErrorReason(e.what()));
  } catch (const nlohmann::json::exception& e) {
    return Status::InvalidArgument(what + ": invalid JSON: " + e.what());
  } catch (const std::bad_alloc&) {
    return Status::ResourceExhausted(what + ": out of memory parsing " +
                                     std::to_string(text.size()) + " bytes of JSON");
  }
}

}  // namespace kiln
