// Tests of what a published source may bring into its build (cell/provenance.h): the directive
// policy as written, the same policy after preprocessing, and the reduction of diagnostics to a
// line number. A table of named cases, each allowed or refused with the line it names.
#include "src/kiln/cell/provenance.h"

#include <gtest/gtest.h>

#include <string>

namespace kiln {
namespace {

struct Case {
  const char* name;
  std::string source;
  int refused_line;  // 0: allowed
};

TEST(ProvenanceTest, SourceDirectivesAllowOnlyToolchainHeadersInAngleBrackets) {
  const std::vector<Case> cases = {
      {"what kiln emits", "#include <math.h>\n#include <stdint.h>\nint f() { return 1; }\n", 0},
      {"a nested system header", "#include <sys/types.h>\n#include <c++/12/cstdio>\n", 0},
      {"spaces and a comment", "  #  include   <string.h>  // why\n", 0},
      {"a string that mentions asm", "const char* s = \"asm and #include \\\"x\\\"\";\n", 0},
      {"a raw string", "const char* s = R\"x(\n#include \"/etc/passwd\"\nasm)x\";\n", 0},
      {"a comment", "/* #include \"/etc/passwd\" asm */\n// asm(\".incbin\")\nint x;\n", 0},
      {"a pragma once", "#pragma once\n#pragma GCC optimize(\"O3\")\n", 0},
      {"a line directive", "#line 10\n", 0},
      {"quoted", "int a;\n#include \"/etc/passwd\"\n", 2},
      {"quoted relative", "#include \"metadata.json\"\n", 1},
      {"absolute in brackets", "#include </etc/passwd>\n", 1},
      {"dotdot", "\n\n#include <../../etc/passwd>\n", 3},
      {"a macro", "#define F \"/etc/passwd\"\n#include F\n", 2},
      {"a digraph", "%:include \"/etc/passwd\"\n", 1},
      {"continued over lines", "#inc\\\nlude \"/etc/passwd\"\n", 1},
      {"after a comment", "/* a\n b */ #include \"/etc/passwd\"\n", 2},
      {"include_next", "#include_next <stdio.h>\n", 1},
      {"import", "#import <stdio.h>\n", 1},
      {"embed", "#embed \"/etc/passwd\"\n", 1},
      {"dependency", "#pragma GCC dependency \"/etc/passwd\"\n", 1},
      {"has_include", "#if __has_include(\"/etc/passwd\")\n#endif\n", 1},
      {"_Pragma", "_Pragma(\"GCC dependency \\\"/etc/passwd\\\"\")\n", 1},
      {"asm", "int x;\nasm(\".incbin \\\"/etc/passwd\\\"\");\n", 2},
      {"__asm__", "__asm__ volatile(\"nop\");\n", 1},
      {"asm in a macro body", "#define M asm(\"nop\")\n", 1},
      {"text after the header", "#include <stdio.h> \"/etc/passwd\"\n", 1},
  };
  for (const Case& c : cases) {
    const Status s = CheckSourceDirectives(c.source);
    if (c.refused_line == 0) {
      EXPECT_TRUE(s.ok()) << c.name << ": " << s.ToString();
      continue;
    }
    ASSERT_FALSE(s.ok()) << c.name << " was allowed";
    EXPECT_TRUE(s.Is(kRefusalIncludeRefused)) << c.name << ": " << s.ToString();
    EXPECT_NE(s.message().find("line " + std::to_string(c.refused_line) + ":"), std::string::npos)
        << c.name << ": " << s.message();
    EXPECT_EQ(s.message().find("root:"), std::string::npos) << c.name;
  }
}

TEST(ProvenanceTest, PreprocessedOutputMayEnterOnlyTheSourceAndTheToolchainHeaders) {
  const std::string src = "/w/build/cell.cc";
  const std::vector<std::string> dirs = {"/usr/include", "/usr/lib/gcc/x86_64-linux-gnu/12/include"};
  const std::string ok =
      "# 1 \"/w/build/cell.cc\"\n# 1 \"<built-in>\"\n# 1 \"<command-line>\"\n"
      "# 1 \"/usr/include/math.h\" 1 3 4\nextern double sin(double) __asm__(\"x\");\n"
      "# 2 \"/w/build/cell.cc\" 2\nint f() { return 1; }\n";
  EXPECT_TRUE(CheckPreprocessed(ok, src, dirs).ok());
  // A header reached through `..` stays under the toolchain's directories or is refused.
  EXPECT_TRUE(
      CheckPreprocessed("# 1 \"/usr/include/c++/12/../../x86_64-linux-gnu/bits/a.h\" 1\n", src,
                        dirs)
          .ok());
  const Status outside = CheckPreprocessed(
      "# 1 \"/w/build/cell.cc\"\n# 1 \"/etc/passwd\" 1\nroot:x:0:0\n", src, dirs);
  EXPECT_TRUE(outside.Is(kRefusalIncludeRefused)) << outside.ToString();
  EXPECT_EQ(outside.message().find("root:x"), std::string::npos) << outside.message();
  const Status escaped = CheckPreprocessed("# 1 \"/usr/include/../../etc/passwd\" 1\n", src, dirs);
  EXPECT_TRUE(escaped.Is(kRefusalIncludeRefused)) << escaped.ToString();
  // Assembly pasted together by a macro shows in the source's own lines after expansion, and
  // names the source line it came from.
  const Status pasted = CheckPreprocessed(
      "# 1 \"/w/build/cell.cc\"\nint a;\n\n# 7 \"/w/build/cell.cc\"\nasm(\".incbin\");\n", src,
      dirs);
  EXPECT_TRUE(pasted.Is(kRefusalIncludeRefused)) << pasted.ToString();
  EXPECT_NE(pasted.message().find("line 7:"), std::string::npos) << pasted.message();
}

TEST(ProvenanceTest, DiagnosticsAreReducedToALineOfTheSource) {
  const std::string out =
      "In file included from /w/build/cell.cc:801:\n"
      "/etc/passwd:1:5: error: 'root' does not name a type\n"
      "/w/build/cell.cc:802:3: error: expected ';' before 'secret'\n";
  const std::string reduced = ReduceDiagnostics(out, "/w/build/cell.cc");
  EXPECT_NE(reduced.find("line 802"), std::string::npos) << reduced;
  EXPECT_EQ(reduced.find("root"), std::string::npos) << reduced;
  EXPECT_EQ(reduced.find("secret"), std::string::npos) << reduced;
  EXPECT_EQ(ReduceDiagnostics("ld: undefined reference to `x'", "/w/build/cell.cc")
                .find("undefined"),
            std::string::npos);
}

}  // namespace
}  // namespace kiln
