// Code provenance without a compiler: the byte comparison of a rebuild (see provenance.h).
#include "src/kiln/cell/provenance.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "src/kiln/base/sha256.h"

namespace kiln {

Status CompareRebuild(const std::string& published, const std::string& rebuilt) {
  if (published == rebuilt) return Status::OK();
  const size_t at = static_cast<size_t>(
      std::mismatch(published.begin(), published.end(), rebuilt.begin(), rebuilt.end()).first -
      published.begin());
  return Status::Refused(
      StatusCode::kInvalidArgument, kRefusalRebuildMismatch,
      "the published cell.so (" + std::to_string(published.size()) + " bytes, " +
          "sha256:" + Sha256Hex(published) + ") is not what its source builds to (" +
          std::to_string(rebuilt.size()) + " bytes, " + "sha256:" + Sha256Hex(rebuilt) +
          "); first difference at byte " + std::to_string(at));
}

namespace {

Status IncludeRefused(size_t line, const std::string& why) {
  return Status::Refused(StatusCode::kInvalidArgument, kRefusalIncludeRefused,
                         "source/cell.cc line " + std::to_string(line) + ": " + why);
}

bool IsIdentStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsIdentChar(char c) { return IsIdentStart(c) || (c >= '0' && c <= '9'); }

// Identifiers that reach a file or the assembler however they are spelled around them.
const char* ForbiddenIdentifier(std::string_view id) {
  if (id == "asm" || id == "__asm" || id == "__asm__") {
    return "inline assembly is not allowed (it can read files at assembly time)";
  }
  if (id == "__has_include" || id == "__has_include_next") {
    return "__has_include is not allowed (it probes files)";
  }
  if (id == "_Pragma") return "_Pragma is not allowed (a pragma built by a macro)";
  return nullptr;
}

// The source after phase 2 (backslash-newline splices removed), with the physical line each
// character came from.
struct Spliced {
  std::string text;
  std::vector<size_t> line;  // per character of text
};

Spliced Splice(std::string_view source) {
  Spliced out;
  out.text.reserve(source.size());
  out.line.reserve(source.size());
  size_t line = 1;
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\\') {
      size_t j = i + 1;
      if (j < source.size() && source[j] == '\r') ++j;
      if (j < source.size() && source[j] == '\n') {
        ++line;
        i = j;
        continue;
      }
    }
    out.text += source[i];
    out.line.push_back(line);
    if (source[i] == '\n') ++line;
  }
  return out;
}

// A tokenizer for the policy: it knows comments, literals and identifiers, nothing more.
class Scanner {
 public:
  explicit Scanner(const Spliced& s) : s_(s) {}

  Status Run() {
    bool line_start = true;  // only whitespace and comments so far on this line
    for (i_ = 0; i_ < s_.text.size();) {
      const char c = s_.text[i_];
      if (c == '\n') {
        line_start = true;
        ++i_;
        continue;
      }
      if (c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v') {
        ++i_;
        continue;
      }
      if (SkipComment()) continue;
      if (line_start && (c == '#' || (c == '%' && Peek(1) == ':'))) {
        i_ += c == '#' ? 1 : 2;
        KILN_RETURN_IF_ERROR(Directive());
        line_start = true;
        continue;
      }
      line_start = false;
      KILN_RETURN_IF_ERROR(Token());
    }
    return Status::OK();
  }

 private:
  char Peek(size_t ahead) const { return i_ + ahead < s_.text.size() ? s_.text[i_ + ahead] : '\0'; }
  size_t Line() const { return s_.line[std::min(i_, s_.line.size() - 1)]; }

  // Skips a comment at i_; false if there is none.
  bool SkipComment() {
    if (s_.text[i_] != '/') return false;
    if (Peek(1) == '/') {
      while (i_ < s_.text.size() && s_.text[i_] != '\n') ++i_;
      return true;
    }
    if (Peek(1) == '*') {
      const size_t end = s_.text.find("*/", i_ + 2);
      i_ = end == std::string::npos ? s_.text.size() : end + 2;
      return true;
    }
    return false;
  }

  void SkipBlanks() {
    while (i_ < s_.text.size() && s_.text[i_] != '\n') {
      const char c = s_.text[i_];
      if (c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v') {
        ++i_;
      } else if (!SkipComment()) {
        return;
      }
    }
  }

  std::string_view Identifier() {
    const size_t start = i_;
    while (i_ < s_.text.size() && IsIdentChar(s_.text[i_])) ++i_;
    return std::string_view(s_.text).substr(start, i_ - start);
  }

  // A string or character literal starting at i_ (after any prefix), raw if `raw`.
  void SkipLiteral(bool raw) {
    const char quote = s_.text[i_];
    if (raw) {
      const size_t open = s_.text.find('(', i_ + 1);
      if (open == std::string::npos || open - i_ - 1 > 16) {
        ++i_;
        return;
      }
      const std::string close = ")" + s_.text.substr(i_ + 1, open - i_ - 1) + "\"";
      const size_t end = s_.text.find(close, open + 1);
      i_ = end == std::string::npos ? s_.text.size() : end + close.size();
      return;
    }
    ++i_;
    while (i_ < s_.text.size() && s_.text[i_] != quote && s_.text[i_] != '\n') {
      i_ += s_.text[i_] == '\\' ? 2 : 1;
    }
    if (i_ < s_.text.size() && s_.text[i_] == quote) ++i_;
  }

  // One token of ordinary text (or of a directive's arguments).
  Status Token() {
    const char c = s_.text[i_];
    if (IsIdentStart(c)) {
      const size_t line = Line();
      const std::string_view id = Identifier();
      if (i_ < s_.text.size() && (s_.text[i_] == '"' || s_.text[i_] == '\'')) {
        // An encoding prefix (u8, L, ...) and perhaps R: a literal follows.
        SkipLiteral(s_.text[i_] == '"' && !id.empty() && id.back() == 'R');
        return Status::OK();
      }
      if (const char* why = ForbiddenIdentifier(id)) return IncludeRefused(line, why);
      return Status::OK();
    }
    if (c == '"' || c == '\'') {
      SkipLiteral(false);
      return Status::OK();
    }
    if (c == '#' && Peek(1) == '#') {
      // Pasting builds identifiers no scan of the text can see (`as ## m`).
      return IncludeRefused(Line(), "token pasting (##) is not allowed");
    }
    if (c == '%' && Peek(1) == ':' && Peek(2) == '%' && Peek(3) == ':') {
      return IncludeRefused(Line(), "token pasting (%:%:) is not allowed");
    }
    if (c >= '0' && c <= '9') {  // a number, with its digit separators and exponents
      while (i_ < s_.text.size() &&
             (IsIdentChar(s_.text[i_]) || s_.text[i_] == '.' || s_.text[i_] == '\'')) {
        ++i_;
      }
      return Status::OK();
    }
    ++i_;
    return Status::OK();
  }

  // The directive whose '#' was just consumed; leaves i_ at its line's end.
  Status Directive() {
    const size_t line = Line();
    SkipBlanks();
    const std::string name(Identifier());
    if (name == "include_next" || name == "import" || name == "embed") {
      return IncludeRefused(line, "#" + name + " is not allowed");
    }
    if (name == "include") {
      SkipBlanks();
      if (i_ >= s_.text.size() || s_.text[i_] != '<') {
        return IncludeRefused(
            line, "#include must name a toolchain header in angle brackets (#include <name>)");
      }
      const size_t close = s_.text.find_first_of(">\n", i_ + 1);
      if (close == std::string::npos || s_.text[close] != '>') {
        return IncludeRefused(line, "#include <...> is not closed on its line");
      }
      const std::string header = s_.text.substr(i_ + 1, close - i_ - 1);
      const bool plain = !header.empty() && header[0] != '/' &&
                         header.find("..") == std::string::npos &&
                         std::all_of(header.begin(), header.end(), [](char h) {
                           return IsIdentChar(h) || h == '.' || h == '/' || h == '-' || h == '+';
                         });
      if (!plain) {
        return IncludeRefused(line, "#include <...> must be a relative header name without '..'");
      }
      i_ = close + 1;
      SkipBlanks();
      if (i_ < s_.text.size() && s_.text[i_] != '\n') {
        return IncludeRefused(line, "text after #include <...>");
      }
      return Status::OK();
    }
    if (name == "pragma") {
      SkipBlanks();
      const std::string_view ns = Identifier();
      SkipBlanks();
      const std::string_view what = Identifier();
      if ((ns == "GCC" || ns == "clang") && what == "dependency") {
        return IncludeRefused(line, "#pragma " + std::string(ns) + " dependency is not allowed");
      }
    }
    // The rest of the line: its tokens obey the same rules as ordinary text.
    while (i_ < s_.text.size() && s_.text[i_] != '\n') {
      const char c = s_.text[i_];
      if (c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v') {
        ++i_;
      } else if (!SkipComment()) {
        KILN_RETURN_IF_ERROR(Token());
      }
    }
    return Status::OK();
  }

  const Spliced& s_;
  size_t i_ = 0;
};

}  // namespace

Status CheckSourceDirectives(std::string_view source) {
  const Spliced spliced = Splice(source);
  if (spliced.text.empty()) return Status::OK();
  return Scanner(spliced).Run();
}

Status CheckPreprocessed(std::string_view preprocessed, const std::string& source_path,
                         const std::vector<std::string>& system_dirs) {
  auto allowed = [&](const std::string& file) {
    // The compiler's pseudo-files: predefined and -D macros (GCC spells the latter
    // "<command-line>", clang "<command line>"). The source can name neither: its directives
    // were refused before preprocessing if they asked for any file.
    if (file == source_path || file == "<built-in>" || file == "<command-line>" ||
        file == "<command line>") {
      return true;
    }
    const std::string normal = std::filesystem::path(file).lexically_normal().string();
    for (const std::string& dir : system_dirs) {
      const std::string d = std::filesystem::path(dir).lexically_normal().string();
      const std::string prefix = d.empty() || d.back() == '/' ? d : d + "/";
      if (!prefix.empty() && normal.rfind(prefix, 0) == 0) return true;
    }
    return false;
  };
  bool in_source = false;
  size_t source_line = 0;  // the source's line the next output line comes from
  std::string text;        // the source's own lines, to scan as one text
  std::vector<size_t> lines;
  size_t at = 0;
  while (at < preprocessed.size()) {
    size_t end = preprocessed.find('\n', at);
    if (end == std::string_view::npos) end = preprocessed.size();
    const std::string_view l = preprocessed.substr(at, end - at);
    at = end + 1;
    // A line marker: `# <line> "<file>" <flags>`.
    if (l.size() > 3 && l[0] == '#' && l[1] == ' ' && l[2] >= '0' && l[2] <= '9') {
      const size_t q1 = l.find('"');
      const size_t q2 = q1 == std::string_view::npos ? q1 : l.find('"', q1 + 1);
      if (q1 == std::string_view::npos || q2 == std::string_view::npos) continue;
      // The preprocessor escapes '"' and '\\' in the name it prints.
      std::string file;
      for (size_t k = q1 + 1; k < q2; ++k) {
        if (l[k] == '\\' && k + 1 < q2) ++k;
        file += l[k];
      }
      if (!allowed(file)) {
        return Status::Refused(StatusCode::kInvalidArgument, kRefusalIncludeRefused,
                               "the source reaches a file outside the toolchain's headers (line "
                               "marker for '" +
                                   file + "')");
      }
      in_source = file == source_path;
      source_line =
          static_cast<size_t>(std::strtoull(std::string(l.substr(2)).c_str(), nullptr, 10));
      continue;
    }
    if (in_source) {
      text.append(l);
      text += '\n';
      lines.insert(lines.end(), l.size() + 1, source_line);
    }
    ++source_line;
  }
  if (text.empty()) return Status::OK();
  Spliced s;
  s.text = std::move(text);
  s.line = std::move(lines);
  return Scanner(s).Run();
}

std::string ReduceDiagnostics(std::string_view compiler_output, const std::string& source_path) {
  const std::string needle = source_path + ":";
  size_t at = 0;
  while ((at = compiler_output.find(needle, at)) != std::string_view::npos) {
    size_t i = at + needle.size();
    size_t line = 0;
    bool digits = false;
    while (i < compiler_output.size() && compiler_output[i] >= '0' && compiler_output[i] <= '9') {
      line = line * 10 + static_cast<size_t>(compiler_output[i] - '0');
      digits = true;
      ++i;
    }
    const size_t eol = compiler_output.find('\n', i);
    const std::string_view rest =
        compiler_output.substr(i, eol == std::string_view::npos ? std::string_view::npos : eol - i);
    if (digits && rest.find("error") != std::string_view::npos) {
      return "source/cell.cc does not compile: the first error is at line " + std::to_string(line);
    }
    at = i;
  }
  return "the build failed outside source/cell.cc's own lines (in a toolchain header, or at the "
         "link)";
}

}  // namespace kiln
