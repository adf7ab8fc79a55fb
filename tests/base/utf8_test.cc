// IsValidUtf8 against the RFC 3629 edge cases, and EscapeBytes.
#include "src/kiln/base/utf8.h"

#include <gtest/gtest.h>

#include <string>

namespace kiln {
namespace {

TEST(Utf8, AcceptsWellFormedText) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("input_0/x:0"));
  EXPECT_TRUE(IsValidUtf8("\xc3\xa9t\xc3\xa9"));     // é
  EXPECT_TRUE(IsValidUtf8("\xe2\x82\xac"));          // U+20AC
  EXPECT_TRUE(IsValidUtf8("\xf0\x9f\x98\x80"));      // U+1F600
  EXPECT_TRUE(IsValidUtf8("\xf4\x8f\xbf\xbf"));      // U+10FFFF, the last code point
  EXPECT_TRUE(IsValidUtf8(std::string("a\0b", 3)));  // NUL is a code point
}

TEST(Utf8, RefusesMalformedSequences) {
  EXPECT_FALSE(IsValidUtf8("\xff"));
  EXPECT_FALSE(IsValidUtf8("\x80"));              // continuation first
  EXPECT_FALSE(IsValidUtf8("\xc3"));              // truncated
  EXPECT_FALSE(IsValidUtf8("\xe2\x82"));          // truncated
  EXPECT_FALSE(IsValidUtf8("\xc0\xaf"));          // overlong '/'
  EXPECT_FALSE(IsValidUtf8("\xe0\x80\xaf"));      // overlong '/'
  EXPECT_FALSE(IsValidUtf8("\xf0\x80\x80\xaf"));  // overlong '/'
  EXPECT_FALSE(IsValidUtf8("\xed\xa0\x80"));      // U+D800, a surrogate
  EXPECT_FALSE(IsValidUtf8("\xf4\x90\x80\x80"));  // above U+10FFFF
  EXPECT_FALSE(IsValidUtf8("\xc3\x28"));          // bad continuation
  EXPECT_FALSE(IsValidUtf8("ok\xfe"));
}

TEST(Utf8, EscapeBytesKeepsPrintableAsciiAndWritesTheRestAsHex) {
  EXPECT_EQ(EscapeBytes("x:0"), "x:0");
  EXPECT_EQ(EscapeBytes("a\xff\n"), "a\\xff\\x0a");
  EXPECT_EQ(EscapeBytes("back\\slash"), "back\\x5cslash");
  EXPECT_TRUE(IsValidUtf8(EscapeBytes("\xc0\xaf\xed\xa0\x80")));
}

}  // namespace
}  // namespace kiln
